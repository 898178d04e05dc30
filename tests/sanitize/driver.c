/* Drives every call of an emitted aotconv library, and every error path, under ASan and UBSan.
 *
 * Built by tests/sanitize/run.sh together with the library's own sources (<net>.c and the
 * runtime's .c files, compiled with the sanitizers) for the network NET (-DNET=san -DNETU=SAN
 * -DNET_HEADER='"san.h"'). Arguments: the build directory, the input and the expected output
 * (raw float32, from the numpy reference); NET_NAME is the name as a string. Every return code is checked against the documented
 * one and every message must be one non-empty line that says what went wrong; the outputs
 * must match the reference. Prints one line per check; exits 1 if any check failed.
 *
 * A network of several inputs (tests/sanitize/inputs.yaml) gets several_inputs() instead of
 * the flow of one: the input file then holds its inputs one after another (INPUT_OFFSETS).
 */
#define _POSIX_C_SOURCE 200809L
#include NET_HEADER

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CAT2(a, b) a##b
#define XCAT2(a, b) CAT2(a, b)
#define CAT4(a, b, c, d) a##b##c##d
#define XCAT4(a, b, c, d) CAT4(a, b, c, d)
#define FN(x) XCAT4(aotconv_, NET, _, x)
#define MACRO(x) XCAT4(AOTCONV_, NETU, _, x)

typedef XCAT2(aotconv_, NET) net_t;
typedef FN(options) options_t;

enum {
    OK = MACRO(OK), E_ARG = MACRO(ERR_ARGUMENT), E_DEV = MACRO(ERR_NO_DEVICE),
    E_IO = MACRO(ERR_IO), E_STATE = MACRO(ERR_STATE)
};
static const size_t NIN = MACRO(INPUT_COUNT), NOUT = MACRO(OUTPUT_COUNT),
                    NPAR = MACRO(PARAM_COUNT), NKER = MACRO(KERNEL_COUNT);
typedef FN(memory_info) memory_t;

static int checks, failed;

static void result(int ok, const char *what, const char *why)
{
    ++checks;
    if (!ok)
        ++failed;
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, ok ? "" : ": ", ok ? "" : why);
    fflush(stdout);
}

/* A message must exist, be one line, fit the documented buffer and contain `needle`. */
static int message_ok(const char *msg, const char *needle, char *why, size_t n)
{
    if (!msg)
        return snprintf(why, n, "last_error returned NULL"), 0;
    if (!*msg)
        return snprintf(why, n, "empty message"), 0;
    if (strchr(msg, '\n') || strchr(msg, '\r'))
        return snprintf(why, n, "multi-line message: %.300s", msg), 0;
    if (strlen(msg) >= 2048)
        return snprintf(why, n, "message of %zu characters", strlen(msg)), 0;
    if (needle && !strstr(msg, needle))
        return snprintf(why, n, "message does not mention '%s': %.300s", needle, msg), 0;
    return 1;
}

/* rc must be `want`; on an error the message of `net` (or of the thread, net NULL) must be
 * one line mentioning `needle`; the thread's message must be the same one. */
static void expect(const char *what, int rc, int want, net_t *net, const char *needle)
{
    char why[512] = "";
    int ok = rc == want;
    if (!ok)
        snprintf(why, sizeof why, "returned %d, expected %d (%.300s)", rc, want,
                 FN(last_error)(net) ? FN(last_error)(net) : "NULL");
    if (ok && want != OK) {
        ok = message_ok(FN(last_error)(net), needle, why, sizeof why);
        if (ok && net && strcmp(FN(last_error)(net), FN(last_error)(NULL)) != 0) {
            ok = 0;
            snprintf(why, sizeof why, "last_error(NULL) is not the latest message: %.200s",
                     FN(last_error)(NULL));
        }
    }
    result(ok, what, why);
}

static float *read_floats(const char *path, size_t count)
{
    float *buf = malloc(count * sizeof *buf + 1);
    FILE *f = fopen(path, "rb");
    if (!buf || !f || fread(buf, sizeof *buf, count, f) != count) {
        fprintf(stderr, "cannot read %zu floats from %s\n", count, path);
        exit(2);
    }
    fclose(f);
    return buf;
}

static void write_file(const char *path, const void *data, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (!f || (bytes && fwrite(data, 1, bytes, f) != bytes)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

/* max |got - want| / max(1, |want|): the tolerance the Python checks use */
static void expect_close(const char *what, const float *got, const float *want, size_t n)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs((double)want[i]));
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    char why[200];
    snprintf(why, sizeof why, "error %.3g at %zu (got %g, want %g)", worst, at, got[at], want[at]);
    result(worst <= 1e-3, what, why);
}

/* create with `o`, load the parameters, run, compare with the reference, destroy */
static void run_with(const char *what, options_t o, const char *params, const float *x,
                     const float *want)
{
    net_t *net = NULL;
    float *y = calloc(NOUT, sizeof *y);
    char label[256];
    snprintf(label, sizeof label, "%s: create", what);
    expect(label, FN(create)(&net, &o), OK, net, NULL);
    if (net) {
        snprintf(label, sizeof label, "%s: load_params", what);
        expect(label, FN(load_params)(net, params), OK, net, NULL);
        snprintf(label, sizeof label, "%s: run", what);
        expect(label, FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
        snprintf(label, sizeof label, "%s: matches the reference", what);
        expect_close(label, y, want, NOUT);
        FN(destroy)(net);
    }
    free(y);
}

static cl_device_id first_device(void)
{
    cl_platform_id plat;
    cl_device_id dev = NULL;
    cl_uint np = 0, nd = 0;
    if (clGetPlatformIDs(1, &plat, &np) != CL_SUCCESS || !np ||
        clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, &nd) != CL_SUCCESS || !nd)
        return NULL;
    return dev;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static cl_command_queue make_queue(cl_context ctx, cl_device_id dev, cl_command_queue_properties p)
{
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, p, &err);
    return err == CL_SUCCESS ? q : NULL;
}
#pragma GCC diagnostic pop

/* create_with_queue, run_buffers and wait on the application's own context and queues */
static void application_queue(const char *params, const float *x, const float *want)
{
    cl_device_id dev = first_device();
    cl_int err;
    cl_context ctx = dev ? clCreateContext(NULL, 1, &dev, NULL, NULL, &err) : NULL;
    cl_context ctx2 = dev ? clCreateContext(NULL, 1, &dev, NULL, NULL, &err) : NULL;
    if (!ctx || !ctx2) {
        result(0, "an OpenCL context of the application", "none");
        return;
    }
    cl_command_queue q = make_queue(ctx, dev, CL_QUEUE_PROFILING_ENABLE);
    cl_command_queue q_plain = make_queue(ctx, dev, 0);
    cl_command_queue q_other = make_queue(ctx2, dev, 0);
    cl_command_queue q_ooo = make_queue(ctx, dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    net_t *net = NULL;
    expect("create_with_queue(NULL out)", FN(create_with_queue)(NULL, ctx, dev, q, NULL), E_ARG,
           NULL, "NULL");
    expect("create_with_queue(NULL context)", FN(create_with_queue)(&net, NULL, dev, q, NULL),
           E_ARG, NULL, "NULL");
    expect("create_with_queue(NULL device)", FN(create_with_queue)(&net, ctx, NULL, q, NULL),
           E_ARG, NULL, "NULL");
    expect("create_with_queue(NULL queue)", FN(create_with_queue)(&net, ctx, dev, NULL, NULL),
           E_ARG, NULL, "NULL");
    expect("create_with_queue with a queue of another context",
           FN(create_with_queue)(&net, ctx, dev, q_other, NULL), E_ARG, NULL, NULL);
    if (q_ooo)
        expect("create_with_queue with an out-of-order queue",
               FN(create_with_queue)(&net, ctx, dev, q_ooo, NULL), E_ARG, NULL, NULL);
    options_t nodev = {-1, -1, "no-such-device-xyz", 1, 0, 0};
    expect("create_with_queue with options.device_name of no device",
           FN(create_with_queue)(&net, ctx, dev, q, &nodev), E_DEV, NULL, "no-such-device-xyz");
    result(net == NULL, "a failed create_with_queue leaves *out NULL", "not NULL");

    /* a profiling queue with options.profile = 1: profile() gives the times */
    options_t prof = {-1, -1, NULL, 1, 0, 0};
    expect("create_with_queue", FN(create_with_queue)(&net, ctx, dev, q, &prof), OK, net, NULL);
    if (!net)
        goto done;
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_WRITE, NIN * sizeof(float), NULL, &err);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, NOUT * sizeof(float), NULL, &err);
    cl_mem small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(float), NULL, &err);
    cl_mem foreign = clCreateBuffer(ctx2, CL_MEM_READ_WRITE, (NIN + NOUT) * sizeof(float), NULL,
                                    &err);
    expect("run_buffers before parameters", FN(run_buffers)(net, in, out), E_STATE, net, NULL);
    expect("load_params on the application's queue", FN(load_params)(net, params), OK, net, NULL);
    expect("run_buffers(NULL handle)", FN(run_buffers)(NULL, in, out), E_ARG, NULL, "NULL");
    expect("run_buffers(NULL input)", FN(run_buffers)(net, NULL, out), E_ARG, net, "NULL");
    expect("run_buffers(NULL output)", FN(run_buffers)(net, in, NULL), E_ARG, net, "NULL");
    expect("run_buffers with an input buffer too small", FN(run_buffers)(net, small, out), E_ARG,
           net, NULL);
    expect("run_buffers with an output buffer too small", FN(run_buffers)(net, in, small), E_ARG,
           net, NULL);
    expect("run_buffers with a buffer of another context", FN(run_buffers)(net, foreign, out),
           E_ARG, net, NULL);
    expect("wait with no run in flight", FN(wait)(net), E_STATE, net, NULL);
    float *y = calloc(NOUT, sizeof *y);
    double ms0[64];
    clEnqueueWriteBuffer(q, in, CL_TRUE, 0, NIN * sizeof(float), x, 0, NULL, NULL);
    expect("run_buffers", FN(run_buffers)(net, in, out), OK, net, NULL);
    expect("profile while run_buffers is in flight", FN(profile)(net, ms0, NKER), E_STATE, net,
           NULL);
    expect("wait", FN(wait)(net), OK, net, NULL);
    clEnqueueReadBuffer(q, out, CL_TRUE, 0, NOUT * sizeof(float), y, 0, NULL, NULL);
    expect_close("run_buffers matches the reference", y, want, NOUT);
    expect("run_buffers twice, then wait", FN(run_buffers)(net, in, out) |
           FN(run_buffers)(net, in, out) | FN(wait)(net), OK, net, NULL);
    expect("run_buffers_n(n = 0)", FN(run_buffers_n)(net, 0, in, out), E_ARG, net, "n is 0");
    expect("run_buffers_n(1 sample) from a one-float buffer",
           FN(run_buffers_n)(net, 1, small, out), E_ARG, net, NULL);
    expect("run_buffers_n(1 sample), then wait", FN(run_buffers_n)(net, 1, in, out) |
           FN(wait)(net), OK, net, NULL);
    cl_mem ins[1] = {in}, smalls[1] = {small};
    expect("run_buffers_inputs(n_inputs 2)", FN(run_buffers_inputs)(net, ins, 2, out), E_ARG,
           net, "n_inputs is 2");
    expect("run_buffers_inputs_n(1 sample) from a one-float buffer",
           FN(run_buffers_inputs_n)(net, 1, smalls, 1, out), E_ARG, net, NULL);
    expect("run_buffers_inputs, then wait", FN(run_buffers_inputs)(net, ins, 1, out) |
           FN(wait)(net), OK, net, NULL);
    double *ms = calloc(NKER + 1, sizeof *ms);
    expect("profile of a run_buffers run on a profiling queue", FN(profile)(net, ms, NKER), OK,
           net, NULL);
    /* the application lets go of its objects first: the handle keeps its own references */
    clReleaseMemObject(small);
    clReleaseMemObject(foreign);
    memset(y, 0, NOUT * sizeof *y);
    expect("run on the application's queue", FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
    expect_close("run on the application's queue matches the reference", y, want, NOUT);
    FN(destroy)(net);
    net = NULL;
    clReleaseMemObject(in);
    clReleaseMemObject(out);

    /* a queue without profiling: profile() says so */
    expect("create_with_queue, a queue without profiling",
           FN(create_with_queue)(&net, ctx, dev, q_plain, &prof), OK, net, NULL);
    if (net) {
        expect("  set_params", FN(set_params)(net, NULL, 0), E_ARG, net, NULL);
        expect("  load_params", FN(load_params)(net, params), OK, net, NULL);
        expect("  run", FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
        expect("  profile without profiling", FN(profile)(net, ms, NKER), E_STATE, net,
               "CL_QUEUE_PROFILING_ENABLE");
        /* released by the application while the handle lives */
        clReleaseCommandQueue(q_plain);
        q_plain = NULL;
        expect("  run after the application released its queue",
               FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
        expect_close("  that run matches the reference", y, want, NOUT);
        FN(destroy)(net);
    }
    free(ms);
    free(y);
done:
    if (q) clReleaseCommandQueue(q);
    if (q_plain) clReleaseCommandQueue(q_plain);
    if (q_other) clReleaseCommandQueue(q_other);
    if (q_ooo) clReleaseCommandQueue(q_ooo);
    clReleaseContext(ctx);
    clReleaseContext(ctx2);
}

/* run_inputs and its twins on a network of one input: n_inputs 1, and its error paths */
static void one_input_calls(net_t *net, const float *x, const float *want, float *hin,
                            float *hout)
{
    const size_t SIN = MACRO(INPUT_SAMPLE_COUNT), SOUT = MACRO(OUTPUT_SAMPLE_COUNT);
    const float *in[1] = {x};
    size_t counts[1] = {NIN}, one[1] = {SIN}, bad[1] = {NIN - 1};
    const float *null_in[1] = {NULL};
    float *y = calloc(NOUT, sizeof *y);
    static const size_t table[] = MACRO(INPUT_COUNTS);
    static const char *const names[] = MACRO(INPUT_NAMES);
    result(MACRO(INPUTS) == 1 && table[0] == NIN && strcmp(names[0], "input") == 0 &&
           FN(input_name)(0) && strcmp(FN(input_name)(0), "input") == 0 &&
           FN(input_name)(1) == NULL && FN(input_name)(SIZE_MAX) == NULL,
           "the header's input tables and input_name(i)", "differ");
    expect("run_inputs(NULL handle)", FN(run_inputs)(NULL, in, counts, 1, y, NOUT), E_ARG,
           NULL, "NULL");
    expect("run_inputs(NULL inputs)", FN(run_inputs)(net, NULL, counts, 1, y, NOUT), E_ARG, net,
           "inputs is NULL");
    expect("run_inputs(NULL counts)", FN(run_inputs)(net, in, NULL, 1, y, NOUT), E_ARG, net,
           "counts is NULL");
    expect("run_inputs(n_inputs 0)", FN(run_inputs)(net, in, counts, 0, y, NOUT), E_ARG, net,
           "n_inputs is 0");
    expect("run_inputs(n_inputs 2)", FN(run_inputs)(net, in, counts, 2, y, NOUT), E_ARG, net,
           "n_inputs is 2");
    expect("run_inputs(n_inputs SIZE_MAX)", FN(run_inputs)(net, in, counts, SIZE_MAX, y, NOUT),
           E_ARG, net, NULL);
    expect("run_inputs(a NULL input)", FN(run_inputs)(net, null_in, counts, 1, y, NOUT), E_ARG,
           net, "input is NULL");
    expect("run_inputs(input count - 1)", FN(run_inputs)(net, in, bad, 1, y, NOUT), E_ARG, net,
           NULL);
    expect("run_inputs(NULL output)", FN(run_inputs)(net, in, counts, 1, NULL, NOUT), E_ARG, net,
           "output is NULL");
    expect("run_inputs", FN(run_inputs)(net, in, counts, 1, y, NOUT), OK, net, NULL);
    expect_close("  matches the reference", y, want, NOUT);
    memset(y, 0, NOUT * sizeof *y);
    expect("run_async_inputs, then wait", FN(run_async_inputs)(net, in, counts, 1, y, NOUT) |
           FN(wait)(net), OK, net, NULL);
    expect_close("  matches the reference", y, want, NOUT);
    expect("run_inputs_n(n = 0)", FN(run_inputs_n)(net, 0, in, one, 1, y, SOUT), E_ARG, net,
           "n is 0");
    memset(y, 0, NOUT * sizeof *y);
    expect("run_inputs_n(1 sample)", FN(run_inputs_n)(net, 1, in, one, 1, y, SOUT), OK, net,
           NULL);
    expect_close("  its first output's first value matches the reference", y, want, 1);
    expect("run_async_inputs_n(1 sample), then wait",
           FN(run_async_inputs_n)(net, 1, in, one, 1, y, SOUT) | FN(wait)(net), OK, net, NULL);
    if (hin && hout) {
        const float *pinned[1] = {hin};
        expect("run_inputs from the host buffers",
               FN(run_inputs)(net, pinned, counts, 1, hout, NOUT), OK, net, NULL);
        expect_close("  matches the reference", hout, want, NOUT);
    }
    free(y);
}

#if MACRO(INPUTS) > 1
/* A network of several inputs: the calls of one input refuse it, naming the call to use; the
 * _inputs calls run it from pageable, staged, pinned and application memory. */
static void several_inputs(const char *params, const float *x, const float *want)
{
    enum { NI = MACRO(INPUTS) };
    static const size_t counts[] = MACRO(INPUT_COUNTS), per[] = MACRO(INPUT_SAMPLE_COUNTS),
                        offsets[] = MACRO(INPUT_OFFSETS);
    static const char *const names[] = MACRO(INPUT_NAMES);
    const float *in[NI], *holes[NI];
    size_t one[NI], bad[NI];
    for (int i = 0; i < NI; ++i) {
        in[i] = holes[i] = x + offsets[i];
        one[i] = per[i];
        bad[i] = counts[i];
    }
    holes[NI - 1] = NULL;
    bad[NI - 1] = counts[NI - 1] + 1;
    int names_ok = FN(input_name)(NI) == NULL;
    for (int i = 0; i < NI; ++i)
        names_ok &= FN(input_name)(i) && strcmp(FN(input_name)(i), names[i]) == 0;
    result(names_ok, "input_name(i) agrees with INPUT_NAMES", "differs");
    net_t *net = NULL;
    float *y = calloc(NOUT, sizeof *y);
    expect("create", FN(create)(&net, NULL), OK, net, NULL);
    if (!net) {
        free(y);
        return;
    }
    expect("run_inputs before parameters", FN(run_inputs)(net, in, counts, NI, y, NOUT), E_STATE,
           net, NULL);
    expect("load_params", FN(load_params)(net, params), OK, net, NULL);
    expect("run (one input)", FN(run)(net, x, NIN, y, NOUT), E_ARG, net, "_run_inputs");
    expect("run_async (one input)", FN(run_async)(net, x, NIN, y, NOUT), E_ARG, net,
           "_run_async_inputs");
    expect("run_n (one input)", FN(run_n)(net, 1, x, NIN, y, NOUT), E_ARG, net, "_run_inputs_n");
    expect("run_async_n (one input)", FN(run_async_n)(net, 1, x, NIN, y, NOUT), E_ARG, net,
           "_run_async_inputs_n");
    expect("run_buffers (one input)", FN(run_buffers)(net, NULL, NULL), E_ARG, net,
           "_run_buffers_inputs");
    expect("run_buffers_n (one input)", FN(run_buffers_n)(net, 1, NULL, NULL), E_ARG, net,
           "_run_buffers_inputs_n");
    expect("run_inputs(n_inputs - 1)", FN(run_inputs)(net, in, counts, NI - 1, y, NOUT), E_ARG,
           net, "n_inputs is");
    expect("run_inputs(n_inputs + 1)", FN(run_inputs)(net, in, counts, NI + 1, y, NOUT), E_ARG,
           net, "n_inputs is");
    expect("run_inputs(the last input NULL)", FN(run_inputs)(net, holes, counts, NI, y, NOUT),
           E_ARG, net, names[NI - 1]);
    expect("run_inputs(the last count + 1)", FN(run_inputs)(net, in, bad, NI, y, NOUT), E_ARG,
           net, names[NI - 1]);
    expect("run_inputs(NULL counts)", FN(run_inputs)(net, in, NULL, NI, y, NOUT), E_ARG, net,
           "counts is NULL");
    expect("run_inputs", FN(run_inputs)(net, in, counts, NI, y, NOUT), OK, net, NULL);
    expect_close("  matches the reference", y, want, NOUT);
    memset(y, 0, NOUT * sizeof *y);
    expect("run_async_inputs, then wait", FN(run_async_inputs)(net, in, counts, NI, y, NOUT) |
           FN(wait)(net), OK, net, NULL);
    expect_close("  matches the reference", y, want, NOUT);
    expect("run_inputs_n(n = 0)", FN(run_inputs_n)(net, 0, in, one, NI, y, 0), E_ARG, net,
           "n is 0");
    memset(y, 0, NOUT * sizeof *y);
    expect("run_inputs_n(1 sample)", FN(run_inputs_n)(net, 1, in, one, NI, y,
           MACRO(OUTPUT_SAMPLE_COUNT)), OK, net, NULL);
    expect_close("  its first output's first value matches the reference", y, want, 1);
    float *hin = NULL, *hout = NULL;
    expect("host_buffers", FN(host_buffers)(net, &hin, &hout), OK, net, NULL);
    if (hin && hout) {
        const float *pinned[NI];
        memcpy(hin, x, NIN * sizeof *x);
        for (int i = 0; i < NI; ++i)
            pinned[i] = hin + offsets[i];
        memset(hout, 0, NOUT * sizeof *hout);
        expect("run_inputs from the host buffers",
               FN(run_inputs)(net, pinned, counts, NI, hout, NOUT), OK, net, NULL);
        expect_close("  matches the reference", hout, want, NOUT);
    }
    FN(destroy)(net);

    options_t tiny = {-1, -1, NULL, 1, 0, 4}, off = {-1, -1, NULL, 1, 0, -1};
    const options_t *ways[] = {&tiny, &off};
    const char *what[] = {"run_inputs staged by 4 bytes", "run_inputs with staging off"};
    for (int w = 0; w < 2; ++w) {
        net = NULL;
        expect(what[w], FN(create)(&net, ways[w]), OK, net, NULL);
        if (!net)
            continue;
        memset(y, 0, NOUT * sizeof *y);
        expect("  load_params, run_inputs", FN(load_params)(net, params) |
               FN(run_inputs)(net, in, counts, NI, y, NOUT), OK, net, NULL);
        expect_close("  matches the reference", y, want, NOUT);
        FN(destroy)(net);
    }

    /* run_buffers_inputs on the application's context and queue */
    cl_device_id dev = first_device();
    cl_int err;
    cl_context ctx = dev ? clCreateContext(NULL, 1, &dev, NULL, NULL, &err) : NULL;
    cl_command_queue q = ctx ? make_queue(ctx, dev, 0) : NULL;
    net = NULL;
    if (q)
        expect("create_with_queue", FN(create_with_queue)(&net, ctx, dev, q, NULL), OK, net, NULL);
    if (net) {
        cl_mem mem[NI], small[NI];
        for (int i = 0; i < NI; ++i) {
            mem[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                    counts[i] * sizeof(float), (void *)in[i], &err);
            small[i] = mem[i];
        }
        small[NI - 1] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(float), NULL, &err);
        cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, NOUT * sizeof(float), NULL, &err);
        expect("  load_params", FN(load_params)(net, params), OK, net, NULL);
        expect("  run_buffers_inputs(NULL inputs)", FN(run_buffers_inputs)(net, NULL, NI, out),
               E_ARG, net, "inputs is NULL");
        expect("  run_buffers_inputs(n_inputs - 1)",
               FN(run_buffers_inputs)(net, mem, NI - 1, out), E_ARG, net, "n_inputs is");
        expect("  run_buffers_inputs with the last input too small",
               FN(run_buffers_inputs)(net, small, NI, out), E_ARG, net, names[NI - 1]);
        expect("  run_buffers_inputs, then wait", FN(run_buffers_inputs)(net, mem, NI, out) |
               FN(wait)(net), OK, net, NULL);
        memset(y, 0, NOUT * sizeof *y);
        clEnqueueReadBuffer(q, out, CL_TRUE, 0, NOUT * sizeof(float), y, 0, NULL, NULL);
        expect_close("  matches the reference", y, want, NOUT);
        expect("  run_buffers_inputs_n(1 sample), then wait",
               FN(run_buffers_inputs_n)(net, 1, mem, NI, out) | FN(wait)(net), OK, net, NULL);
        FN(destroy)(net);
        for (int i = 0; i < NI; ++i)
            clReleaseMemObject(mem[i]);
        clReleaseMemObject(small[NI - 1]);
        clReleaseMemObject(out);
    } else {
        result(0, "an OpenCL queue of the application", "none");
    }
    if (q)
        clReleaseCommandQueue(q);
    if (ctx)
        clReleaseContext(ctx);
    free(y);
}
#endif

static void *create_fails_in_a_thread(void *arg)
{
    net_t *net = NULL;
    int *rc = arg;
    *rc = FN(create)(NULL, NULL);
    (void)net;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s BUILD_DIR INPUT.bin EXPECTED.bin\n", argv[0]);
        return 2;
    }
    alarm(240);   /* a hang fails the job instead of stopping it */
    const char *dir = argv[1];
    float *x = read_floats(argv[2], NIN), *want = read_floats(argv[3], NOUT);
#if MACRO(INPUTS) > 1
    {
        char par[4096];
        snprintf(par, sizeof par, "%s/%s.params.bin", dir, NET_NAME);
        several_inputs(par, x, want);
        free(x), free(want);
        printf("%d checks, %d failed\n", checks, failed);
        return failed ? 1 : 0;
    }
#endif
    float *y = calloc(NOUT, sizeof *y), *y2 = calloc(NOUT, sizeof *y2);
    double *ms = calloc(NKER + 1, sizeof *ms);
    char params[4096], path[8192];
    snprintf(params, sizeof params, "%s/%s.params.bin", dir, NET_NAME);
    float *p = read_floats(params, NPAR);
    net_t *net = NULL, *net2 = NULL;
    char why[512];

    /* names of the kernels, in and out of range */
    int names_ok = 1;
    for (size_t i = 0; i < NKER; ++i)
        names_ok &= FN(kernel_name)(i) != NULL && strchr(FN(kernel_name)(i), '/') != NULL;
    result(names_ok, "kernel_name(i) for every kernel is 'layer/kernel'", "a NULL or odd name");
    result(FN(kernel_name)(NKER) == NULL && FN(kernel_name)(SIZE_MAX) == NULL,
           "kernel_name out of range is NULL", "not NULL");

    /* NULL-safe calls before any handle exists */
    result(FN(last_error)(NULL) != NULL, "last_error(NULL) before any call", "NULL");
    FN(destroy)(NULL);
    result(1, "destroy(NULL)", "");

    /* create: NULL out, devices that do not exist (options and AOTCONV_DEVICE) */
    expect("create(NULL, NULL)", FN(create)(NULL, NULL), E_ARG, NULL, "NULL");
    options_t o = {-1, -1, "no-such-device-xyz", 1};
    net = (net_t *)&o;   /* create must clear it on failure */
    expect("create with options.device_name of no device", FN(create)(&net, &o), E_DEV, NULL,
           "no-such-device-xyz");
    result(net == NULL, "a failed create sets *out to NULL", "left the old pointer");
    setenv("AOTCONV_DEVICE", "bogus-env-device", 1);
    expect("create with AOTCONV_DEVICE of no device", FN(create)(&net, NULL), E_DEV, NULL,
           "AOTCONV_DEVICE");
    setenv("AOTCONV_DEVICE", "", 1);
    expect("create with AOTCONV_DEVICE empty (means unset)", FN(create)(&net, NULL), OK, net,
           NULL);
    FN(destroy)(net);
    net = NULL;
    unsetenv("AOTCONV_DEVICE");
    options_t bad_platform = {99, -1, NULL, 1}, bad_device = {-1, 99, NULL, 1};
    expect("create with options.platform_index 99", FN(create)(&net, &bad_platform), E_DEV, NULL,
           NULL);
    expect("create with options.device_index 99", FN(create)(&net, &bad_device), E_DEV, NULL,
           NULL);
    static char long_name[6000];
    memset(long_name, 'd', sizeof long_name - 1);
    options_t long_opt = {-1, -1, long_name, 1};
    expect("create with a 6000-character device name", FN(create)(&net, &long_opt), E_DEV, NULL,
           NULL);
    options_t fmt_opt = {-1, -1, "%s%n%x%p%%", 1};
    expect("create with printf directives in the device name", FN(create)(&net, &fmt_opt), E_DEV,
           NULL, "%s%n%x%p%%");
    options_t star_opt = {-1, -1, ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*"
                                  ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*"
                                  ".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*!",
                          1};
    expect("create with a device name of many '.*' (no backtracking blow-up)",
           FN(create)(&net, &star_opt), E_DEV, NULL, NULL);
    options_t nl_opt = {-1, -1, "line one\nline two", 1};
    expect("create with a newline in the device name: one-line message",
           FN(create)(&net, &nl_opt), E_DEV, NULL, NULL);
    int thread_rc = 0;
    pthread_t th;
    char before[2048];
    snprintf(before, sizeof before, "%s", FN(last_error)(NULL));
    pthread_create(&th, NULL, create_fails_in_a_thread, &thread_rc);
    pthread_join(th, NULL);
    result(thread_rc == E_ARG && strcmp(before, FN(last_error)(NULL)) == 0,
           "a create failing in another thread leaves this thread's last_error",
           "the message changed");

    /* a working handle: everything that needs parameters first */
    options_t good = {-1, -1, NULL, 1};
    expect("create", FN(create)(&net, &good), OK, net, NULL);
    if (!net) {
        printf("%d checks, %d failed (no handle: the rest skipped)\n", checks, failed + 1);
        return 1;
    }
    expect("run before parameters", FN(run)(net, x, NIN, y, NOUT), E_STATE, net, NULL);
    expect("profile before a run", FN(profile)(net, ms, NKER), E_STATE, net, NULL);

    /* set_params */
    expect("set_params(NULL handle)", FN(set_params)(NULL, p, NPAR), E_ARG, NULL, "NULL");
    expect("set_params(NULL params)", FN(set_params)(net, NULL, NPAR), E_ARG, net, "NULL");
    expect("set_params(count - 1)", FN(set_params)(net, p, NPAR - 1), E_ARG, net, NULL);
    expect("set_params(count + 1)", FN(set_params)(net, p, NPAR + 1), E_ARG, net, NULL);
    expect("set_params(0)", FN(set_params)(net, p, 0), E_ARG, net, NULL);
    expect("set_params(SIZE_MAX)", FN(set_params)(net, p, SIZE_MAX), E_ARG, net, NULL);

    /* load_params: missing, short, long, empty, a directory, a huge path, a newline */
    expect("load_params(NULL handle)", FN(load_params)(NULL, params), E_ARG, NULL, "NULL");
    expect("load_params(NULL path)", FN(load_params)(net, NULL), E_ARG, net, "NULL");
    snprintf(path, sizeof path, "%s/no-such-file.bin", dir);
    expect("load_params of a missing file", FN(load_params)(net, path), E_IO, net,
           "no-such-file.bin");
    snprintf(path, sizeof path, "%s/short.bin", dir);
    write_file(path, p, (NPAR - 1) * sizeof(float));
    expect("load_params of a file one float short", FN(load_params)(net, path), E_IO, net,
           "short.bin");
    snprintf(path, sizeof path, "%s/odd.bin", dir);
    write_file(path, p, NPAR * sizeof(float) - 2);
    expect("load_params of a file 2 bytes short", FN(load_params)(net, path), E_IO, net, NULL);
    float *longer = calloc(NPAR + 1, sizeof *longer);
    memcpy(longer, p, NPAR * sizeof *p);
    snprintf(path, sizeof path, "%s/long.bin", dir);
    write_file(path, longer, (NPAR + 1) * sizeof(float));
    expect("load_params of a file one float long", FN(load_params)(net, path), E_IO, net, NULL);
    snprintf(path, sizeof path, "%s/byte.bin", dir);
    write_file(path, longer, NPAR * sizeof(float) + 1);
    expect("load_params of a file one byte long", FN(load_params)(net, path), E_IO, net, NULL);
    snprintf(path, sizeof path, "%s/empty.bin", dir);
    write_file(path, p, 0);
    expect("load_params of an empty file", FN(load_params)(net, path), E_IO, net, NULL);
    snprintf(path, sizeof path, "%s/a-directory.bin", dir);
    mkdir(path, 0755);
    expect("load_params of a directory", FN(load_params)(net, path), E_IO, net, NULL);
    memset(path, 'p', 5000);
    path[0] = '/';
    path[5000] = '\0';
    expect("load_params of a 5000-character path", FN(load_params)(net, path), E_IO, net, NULL);
    snprintf(path, sizeof path, "%s/new\nline.bin", dir);
    expect("load_params of a path with a newline: one-line message",
           FN(load_params)(net, path), E_IO, net, NULL);
    expect("run after failed loads is still refused", FN(run)(net, x, NIN, y, NOUT), E_STATE,
           net, NULL);
    expect("load_params", FN(load_params)(net, params), OK, net, NULL);

    /* run */
    expect("run(NULL handle)", FN(run)(NULL, x, NIN, y, NOUT), E_ARG, NULL, "NULL");
    expect("run(NULL input)", FN(run)(net, NULL, NIN, y, NOUT), E_ARG, net, "input");
    expect("run(NULL output)", FN(run)(net, x, NIN, NULL, NOUT), E_ARG, net, "output");
    expect("run(input count - 1)", FN(run)(net, x, NIN - 1, y, NOUT), E_ARG, net, NULL);
    expect("run(input count + 1)", FN(run)(net, x, NIN + 1, y, NOUT), E_ARG, net, NULL);
    expect("run(input count SIZE_MAX)", FN(run)(net, x, SIZE_MAX, y, NOUT), E_ARG, net, NULL);
    expect("run(output count - 1)", FN(run)(net, x, NIN, y, NOUT - 1), E_ARG, net, NULL);
    expect("run(output count 0)", FN(run)(net, x, NIN, y, 0), E_ARG, net, NULL);
    expect("profile before a completed run", FN(profile)(net, ms, NKER), E_STATE, net, NULL);
    expect("run", FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
    expect_close("run matches the numpy reference", y, want, NOUT);
    expect("run again", FN(run)(net, x, NIN, y2, NOUT), OK, net, NULL);
    result(memcmp(y, y2, NOUT * sizeof *y) == 0, "two runs give the same output", "differ");

    /* profile */
    expect("profile(NULL handle)", FN(profile)(NULL, ms, NKER), E_ARG, NULL, "NULL");
    expect("profile(NULL times)", FN(profile)(net, NULL, NKER), E_ARG, net, NULL);
    expect("profile(count + 1)", FN(profile)(net, ms, NKER + 1), E_ARG, net, NULL);
    expect("profile(0)", FN(profile)(net, ms, 0), E_ARG, net, NULL);
    expect("profile", FN(profile)(net, ms, NKER), OK, net, NULL);
    int times_ok = 1;
    for (size_t i = 0; i < NKER; ++i)
        times_ok &= isfinite(ms[i]) && ms[i] >= 0;
    result(times_ok, "profile times are finite and >= 0", "a negative or non-finite time");

    /* host_buffers */
    float *hin = NULL, *hout = NULL, *hin2 = NULL, *hout2 = NULL;
    expect("host_buffers(NULL handle)", FN(host_buffers)(NULL, &hin, &hout), E_ARG, NULL, "NULL");
    expect("host_buffers(NULL, NULL)", FN(host_buffers)(net, NULL, NULL), E_ARG, net, NULL);
    expect("host_buffers(input only)", FN(host_buffers)(net, &hin, NULL), OK, net, NULL);
    expect("host_buffers(output only)", FN(host_buffers)(net, NULL, &hout), OK, net, NULL);
    expect("host_buffers(both)", FN(host_buffers)(net, &hin2, &hout2), OK, net, NULL);
    result(hin && hout && hin == hin2 && hout == hout2, "host_buffers gives the same pointers",
           "different pointers");
    if (hin && hout) {
        memcpy(hin, x, NIN * sizeof *x);
        memset(hout, 0, NOUT * sizeof *hout);
        expect("run from the host buffers", FN(run)(net, hin, NIN, hout, NOUT), OK, net, NULL);
        expect_close("run from the host buffers matches the reference", hout, want, NOUT);
    }

    /* program_source and memory */
    const char *why_src = NULL;
    int src = FN(program_source)(net, &why_src);
    result((src == MACRO(FROM_SOURCE) || src == MACRO(FROM_BINARY)) && why_src &&
           message_ok(why_src, NULL, why, sizeof why),
           "program_source says how and why in one line", why);
    result(FN(program_source)(net, NULL) == src, "program_source(net, NULL)", "differs");
    result(FN(program_source)(NULL, &why_src) < 0 &&
           message_ok(FN(last_error)(NULL), "NULL", why, sizeof why),
           "program_source(NULL) is an error", why);
    memory_t mem;
    memset(&mem, 0xff, sizeof mem);
    expect("memory(NULL handle)", FN(memory)(NULL, &mem), E_ARG, NULL, "NULL");
    expect("memory(NULL info)", FN(memory)(net, NULL), E_ARG, net, "NULL");
    expect("memory", FN(memory)(net, &mem), OK, net, NULL);
    snprintf(why, sizeof why, "activation %zu parameter %zu variant %zu scratch %zu device %zu "
             "pinned %zu", mem.activation_bytes, mem.parameter_bytes, mem.variant_bytes,
             mem.scratch_bytes, mem.device_bytes, mem.pinned_bytes);
    result(mem.activation_bytes == MACRO(ACTIVATION_BYTES) &&
           mem.parameter_bytes == MACRO(PARAMETER_BYTES) &&
           mem.variant_bytes == MACRO(VARIANT_BYTES) && mem.scratch_bytes == MACRO(SCRATCH_BYTES)
           && mem.device_bytes == MACRO(DEVICE_BYTES) &&
           mem.pinned_bytes >= (NIN + NOUT) * sizeof(float),
           "memory() agrees with the header and counts the host buffers", why);

    /* run_async and wait */
    expect("wait(NULL handle)", FN(wait)(NULL), E_ARG, NULL, "NULL");
    expect("wait with no run in flight", FN(wait)(net), E_STATE, net, NULL);
    expect("run_async(NULL handle)", FN(run_async)(NULL, x, NIN, y2, NOUT), E_ARG, NULL, "NULL");
    expect("run_async(NULL input)", FN(run_async)(net, NULL, NIN, y2, NOUT), E_ARG, net, NULL);
    expect("run_async(NULL output)", FN(run_async)(net, x, NIN, NULL, NOUT), E_ARG, net, NULL);
    expect("run_async(input count + 1)", FN(run_async)(net, x, NIN + 1, y2, NOUT), E_ARG, net,
           NULL);
    expect("run_async(output count SIZE_MAX)", FN(run_async)(net, x, NIN, y2, SIZE_MAX), E_ARG,
           net, NULL);
    memset(y2, 0, NOUT * sizeof *y2);
    expect("run_async", FN(run_async)(net, x, NIN, y2, NOUT), OK, net, NULL);
    expect("profile while a run is in flight", FN(profile)(net, ms, NKER), E_STATE, net, NULL);
    expect("wait", FN(wait)(net), OK, net, NULL);
    expect_close("run_async matches the reference", y2, want, NOUT);
    expect("wait again", FN(wait)(net), E_STATE, net, NULL);
    expect("run_async twice, then wait", FN(run_async)(net, x, NIN, y2, NOUT) |
           FN(run_async)(net, x, NIN, y, NOUT) | FN(wait)(net), OK, net, NULL);
    expect_close("both runs in order match the reference", y, want, NOUT);
    expect("run_async then run (run ends the run in flight)",
           FN(run_async)(net, x, NIN, y2, NOUT) | FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
    expect_close("  and both match the reference", y2, want, NOUT);
    expect("run_async from the host buffers", FN(run_async)(net, hin, NIN, hout, NOUT) |
           FN(wait)(net), OK, net, NULL);
    expect_close("  matches the reference", hout, want, NOUT);

    /* run_n, run_async_n and batch_sizes: n samples, the rest of the size padded */
    const size_t SIN = MACRO(INPUT_SAMPLE_COUNT), SOUT = MACRO(OUTPUT_SAMPLE_COUNT);
    const size_t BMAX = MACRO(BATCH_MAX);
    const size_t *sizes = NULL;
    result(FN(batch_sizes)(&sizes) == MACRO(BATCH_COUNT) && sizes &&
           sizes[MACRO(BATCH_COUNT) - 1] == BMAX && FN(batch_sizes)(NULL) == MACRO(BATCH_COUNT)
           && BMAX * SIN == NIN && BMAX * SOUT == NOUT, "batch_sizes agrees with the header",
           "differs");
    expect("run_n(NULL handle)", FN(run_n)(NULL, 1, x, SIN, y2, SOUT), E_ARG, NULL, "NULL");
    expect("run_n(n = 0)", FN(run_n)(net, 0, x, 0, y2, 0), E_ARG, net, "n is 0");
    expect("run_n(n above the largest size)", FN(run_n)(net, BMAX + 1, x, NIN + SIN, y2,
           NOUT + SOUT), E_ARG, net, "give 1 to");
    expect("run_n(n = SIZE_MAX)", FN(run_n)(net, SIZE_MAX, x, SIN, y2, SOUT), E_ARG, net, NULL);
    expect("run_n(the input count of 2 samples for 1)", FN(run_n)(net, 1, x, 2 * SIN, y2, SOUT),
           E_ARG, net, "samples of");
    expect("run_n(NULL output)", FN(run_n)(net, 1, x, SIN, NULL, SOUT), E_ARG, net, "NULL");
    memset(y2, 0, NOUT * sizeof *y2);
    expect("run_n(every sample)", FN(run_n)(net, BMAX, x, NIN, y2, NOUT), OK, net, NULL);
    expect_close("  matches the reference", y2, want, NOUT);
    memset(y2, 0, NOUT * sizeof *y2);
    expect("run_n(1 sample)", FN(run_n)(net, 1, x, SIN, y2, SOUT), OK, net, NULL);
    expect_close("  its first output's first value matches the reference", y2, want, 1);
    expect("run_async_n(n = 0)", FN(run_async_n)(net, 0, x, 0, y2, 0), E_ARG, net, "n is 0");
    expect("run_async_n(1 sample), then wait", FN(run_async_n)(net, 1, x, SIN, y2, SOUT) |
           FN(wait)(net), OK, net, NULL);
    expect_close("  its first output's first value matches the reference", y2, want, 1);
    if (hin && hout)
        expect("run_n(1 sample) from the host buffers", FN(run_n)(net, 1, hin, SIN, hout, SOUT),
               OK, net, NULL);

    one_input_calls(net, x, want, hin, hout);

    /* set_params with the same floats gives the same output */
    expect("run", FN(run)(net, x, NIN, y, NOUT), OK, net, NULL);
    expect("set_params", FN(set_params)(net, p, NPAR), OK, net, NULL);
    expect("run after set_params", FN(run)(net, x, NIN, y2, NOUT), OK, net, NULL);
    result(memcmp(y, y2, NOUT * sizeof *y) == 0, "set_params and load_params give the same output",
           "differ");

    /* a second handle, profiling off, used and destroyed while the first lives, with a
     * run in flight */
    options_t quiet = {-1, -1, NULL, 0, 0, 0};
    expect("create a second handle, profiling off", FN(create)(&net2, &quiet), OK, net2, NULL);
    if (net2) {
        expect("second handle: set_params", FN(set_params)(net2, p, NPAR), OK, net2, NULL);
        expect("second handle: run", FN(run)(net2, x, NIN, y2, NOUT), OK, net2, NULL);
        result(memcmp(y, y2, NOUT * sizeof *y) == 0, "second handle: same output", "differ");
        expect("second handle: profile with profiling off", FN(profile)(net2, ms, NKER), E_STATE,
               net2, "options.profile = 1");
        expect("second handle: run_async, then destroy without wait",
               FN(run_async)(net2, x, NIN, y2, NOUT), OK, net2, NULL);
        FN(destroy)(net2);
    }
    expect("first handle still runs", FN(run)(net, x, NIN, y2, NOUT), OK, net, NULL);
    result(memcmp(y, y2, NOUT * sizeof *y) == 0, "first handle: same output", "differ");
    FN(destroy)(net);
    result(1, "destroy", "");

    /* the other ways to make programs and to stage: each the same answer */
    options_t source = {-1, -1, NULL, 1, 1, 0};
    net = NULL;
    expect("create from source (options.source_only)", FN(create)(&net, &source), OK, net, NULL);
    if (net) {
        result(FN(program_source)(net, &why_src) == MACRO(FROM_SOURCE),
               "program_source says source", why_src ? why_src : "NULL");
        FN(destroy)(net);
    }
    run_with("source only", source, params, x, want);
    options_t no_stage = {-1, -1, NULL, 1, 0, -1};
    run_with("staging off", no_stage, params, x, want);
    options_t byte_stage = {-1, -1, NULL, 1, 0, 1};
    run_with("staging by 1 byte", byte_stage, params, x, want);
    options_t odd_stage = {-1, -1, NULL, 1, 0, 7};
    run_with("staging by 7 bytes", odd_stage, params, x, want);
    options_t huge_stage = {-1, -1, NULL, 1, 0, 0x7fffffffffffffffL};
    run_with("staging by LONG_MAX bytes", huge_stage, params, x, want);
    application_queue(params, x, want);

    free(x), free(want), free(y), free(y2), free(ms), free(p), free(longer);
    printf("%d checks, %d failed\n", checks, failed);
    return failed ? 1 : 0;
}

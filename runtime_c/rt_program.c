/* Programs: from the embedded device binaries where they fit this device, else from the
 * embedded OpenCL C; joined into one program, or a few each of a run of layers, where the build
 * verified that (aotconv/binaries.py).
 *
 * A binary is tried only on a device of the name and driver version it was built on; one the
 * driver rejects (clCreateProgramWithBinary or clBuildProgram fails) is released and that
 * program is compiled from its source. Where a joined program fails to compile from source,
 * every program is compiled again one per layer, so the error names the layer. n->program_why says
 * which path was taken, for program_source().
 */
#include "aotconv_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOGMAX 1536

/* Where create()'s program step spent its time, for the AOTCONV_TRACE line (rt_trace.c). */
typedef struct {
    int binaries, rejected, sources;
    double create_ms, build_ms, rejected_ms, source_ms;
} prog_times;

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t'))
        s[--n] = '\0';
}

/* Why the embedded binaries do not apply to this device, or "" when they do. */
static void binaries_apply(aotrt_net *n, const aotrt_options *o, char *why, size_t size)
{
    const aotrt_desc *d = n->desc;
    why[0] = '\0';
    if (!d->nbinaries) {
        snprintf(why, size, "the library embeds no device binaries: %s", d->binary_note);
        return;
    }
    if (o && o->source_only) {
        snprintf(why, size, "options.source_only is set");
        return;
    }
    char name[256] = "", driver[256] = "";
    clGetDeviceInfo(n->device, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    clGetDeviceInfo(n->device, CL_DRIVER_VERSION, sizeof driver - 1, driver, NULL);
    trim(name);
    trim(driver);
    if (strcmp(name, d->binary_device) != 0 || strcmp(driver, d->binary_driver) != 0)
        snprintf(why, size, "the embedded binaries were built for '%.100s' (driver %.60s), this "
                 "device is '%.100s' (driver %.60s)", d->binary_device, d->binary_driver, name,
                 driver);
}

/* Program slot i from binary b; 0 on success, else the reason in `why`. */
static int from_binary(aotrt_net *n, int i, const aotrt_binary *b, char *why, size_t size,
                       prog_times *pt)
{
    const aotrt_desc *d = n->desc;
    char what[300];
    if (n->joined == 1)
        snprintf(what, sizeof what, "the network's program");
    else if (n->joined)
        snprintf(what, sizeof what, "joined program %d of %d", i + 1, n->joined);
    else
        snprintf(what, sizeof what, "layer '%s'", d->programs[i].layer);
    cl_int status = CL_SUCCESS, err;
    const unsigned char *data = b->data;
    size_t len = b->size;
    double t0 = aotrt_now_ms();
    cl_program p = clCreateProgramWithBinary(n->ctx, 1, &n->device, &len, &data, &status, &err);
    double t1 = aotrt_now_ms();
    if (err != CL_SUCCESS || status != CL_SUCCESS) {
        if (p)
            clReleaseProgram(p);
        pt->rejected++;
        pt->rejected_ms += t1 - t0;
        snprintf(why, size, "the driver rejected the embedded binary of %s: "
                 "clCreateProgramWithBinary: %s", what,
                 aotrt_cl_error_name(err != CL_SUCCESS ? err : status));
        return -1;
    }
    err = clBuildProgram(p, 1, &n->device, d->build_options, NULL, NULL);
    double t2 = aotrt_now_ms();
    if (err != CL_SUCCESS) {
        clReleaseProgram(p);
        pt->rejected++;
        pt->rejected_ms += t2 - t0;
        snprintf(why, size, "the driver rejected the embedded binary of %s: clBuildProgram: %s",
                 what, aotrt_cl_error_name(err));
        return -1;
    }
    pt->binaries++;
    pt->create_ms += t1 - t0;
    pt->build_ms += t2 - t1;
    n->programs[i] = p;
    return 0;
}

/* A program built from a source holding sm_90a instructions (SM90A_DEFINE in its text) made
 * again from its PTX rewritten for sm_90a (rt_sm90a.c; aotconv/ptx.py at build time): the
 * rebuilt program in *p (the first released), CL_SUCCESS; the first kept where its PTX holds
 * no marked line (the kernels' portable bodies); else the failing call's error. */
static cl_int sm90a_rebuild(aotrt_net *n, cl_program *p, const char *options)
{
    size_t size = 0;
    cl_int err = clGetProgramInfo(*p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
    if (err != CL_SUCCESS || size == 0)
        return err != CL_SUCCESS ? err : CL_INVALID_BINARY;
    unsigned char *ptx = malloc(size + 1);
    if (ptx == NULL)
        return CL_OUT_OF_HOST_MEMORY;
    err = clGetProgramInfo(*p, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL);
    ptx[size] = 0;
    char *fixed = err == CL_SUCCESS ? aotrt_sm90a_rewrite((const char *)ptx, size) : NULL;
    free(ptx);
    if (err != CL_SUCCESS)
        return err;
    if (fixed == NULL)
        return CL_SUCCESS;
    size_t len = strlen(fixed);
    const unsigned char *data = (const unsigned char *)fixed;
    cl_program q = clCreateProgramWithBinary(n->ctx, 1, &n->device, &len, &data, NULL, &err);
    if (err == CL_SUCCESS) {
        err = clBuildProgram(q, 1, &n->device, options, NULL, NULL);
        if (err != CL_SUCCESS)
            clReleaseProgram(q);
    }
    free(fixed);
    if (err == CL_SUCCESS) {
        clReleaseProgram(*p);
        *p = q;
    }
    return err;
}

#define SM90A_DEFINE "AOTCONV_SM90A"

/* Program slot i from `count` source strings; an AOTRT error code (the build log in the
 * message) naming `layer`. A source holding sm_90a instructions is built with SM90A_DEFINE
 * and then made again from its rewritten PTX (sm90a_rebuild). */
static int from_source(aotrt_net *n, int i, cl_uint count, const char **strings,
                       const char *layer, prog_times *pt)
{
    const aotrt_desc *d = n->desc;
    cl_int err;
    double t0 = aotrt_now_ms();
    int sm90a = 0;
    for (cl_uint k = 0; k < count && !sm90a; k++)
        sm90a = strstr(strings[k], SM90A_DEFINE) != NULL;
    char options[1024];
    snprintf(options, sizeof options, "%s%s", d->build_options,
             sm90a ? " -D" SM90A_DEFINE : "");
    cl_program p = clCreateProgramWithSource(n->ctx, count, strings, NULL, &err);
    if (err != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: layer '%s': clCreateProgramWithSource "
                               "failed: %s (%d)", d->net, layer, aotrt_cl_error_name(err),
                               (int)err);
    err = clBuildProgram(p, 1, &n->device, options, NULL, NULL);
    if (err == CL_SUCCESS && sm90a) {
        err = sm90a_rebuild(n, &p, options);
        if (err != CL_SUCCESS) {
            clReleaseProgram(p);
            return aotrt_set_error(n, AOTRT_ERR_BUILD, "%s: layer '%s': its sm_90a PTX (wgmma) "
                                   "did not build: %s (%d); the driver must take sm_90a PTX "
                                   "(an NVIDIA GPU of compute capability 9.0): rebuild the "
                                   "library with another --target", d->net, layer,
                                   aotrt_cl_error_name(err), (int)err);
        }
    }
    pt->sources++;
    pt->source_ms += aotrt_now_ms() - t0;
    if (err != CL_SUCCESS) {
        char log[LOGMAX] = "";
        clGetProgramBuildInfo(p, n->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        clReleaseProgram(p);
        return aotrt_set_error(n, AOTRT_ERR_BUILD,
                               "%s: layer '%s': clBuildProgram failed: %s (%d); build log:\n%s",
                               d->net, layer, aotrt_cl_error_name(err), (int)err, log);
    }
    n->programs[i] = p;
    return AOTRT_OK;
}

static int per_layer_sources(aotrt_net *n, prog_times *pt)
{
    const aotrt_desc *d = n->desc;
    for (int i = 0; i < d->nprograms; ++i) {
        if (n->programs[i])
            continue;
        const char *src = d->programs[i].source;
        int rc = from_source(n, i, 1, &src, d->programs[i].layer, pt);
        if (rc)
            return rc;
        ++n->from_source;
    }
    return AOTRT_OK;
}

/* Joined program g from source: prologue, source, epilogue of each of its layers. */
static int joined_source(aotrt_net *n, int g, prog_times *pt)
{
    const aotrt_desc *d = n->desc;
    const char **parts = malloc(3 * (size_t)d->nprograms * sizeof *parts);
    if (!parts)
        return aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    cl_uint count = 0;
    for (int i = 0; i < d->nprograms; ++i) {
        if (d->programs[i].group != g)
            continue;
        parts[count++] = d->programs[i].prologue ? d->programs[i].prologue : "";
        parts[count++] = d->programs[i].source;
        parts[count++] = d->programs[i].epilogue ? d->programs[i].epilogue : "";
    }
    int rc = from_source(n, g, count, parts, n->joined == 1 ? "(all layers, joined)" :
                         "(layers joined)", pt);
    free(parts);
    return rc;
}

/* The program step's details on create()'s trace line. */
static void trace_programs(aotrt_net *n, const prog_times *pt)
{
    if (pt->binaries)
        aotrt_trace_note(n->trace, "%d binar%s: create %.1f ms, build %.1f ms", pt->binaries,
                         pt->binaries == 1 ? "y" : "ies", pt->create_ms, pt->build_ms);
    if (pt->rejected)
        aotrt_trace_note(n->trace, "%d binar%s rejected: %.1f ms", pt->rejected,
                         pt->rejected == 1 ? "y" : "ies", pt->rejected_ms);
    if (pt->sources)
        aotrt_trace_note(n->trace, "%d from source: %.1f ms", pt->sources, pt->source_ms);
}

static int build_programs(aotrt_net *n, const aotrt_options *o, prog_times *pt);

int aotrt_build_programs(aotrt_net *n, const aotrt_options *o)
{
    prog_times pt = {0};
    int rc = build_programs(n, o, &pt);
    trace_programs(n, &pt);
    return rc;
}

static int build_programs(aotrt_net *n, const aotrt_options *o, prog_times *pt)
{
    const aotrt_desc *d = n->desc;
    char why[512], rejected[512] = "";
    binaries_apply(n, o, why, sizeof why);
    int use = why[0] == '\0';
    int nrejected = 0;
    n->joined = d->nprograms > 0 ? d->joined : 0;
    if (n->joined) {
        for (int g = 0; g < n->joined; ++g) {
            const aotrt_binary *b = g < d->nbinaries ? &d->binaries[g] : NULL;
            if (use && b && b->size) {
                char r[512];
                if (from_binary(n, g, b, r, sizeof r, pt) == 0) {
                    ++n->from_binary;
                    continue;
                }
                if (!nrejected++)
                    snprintf(rejected, sizeof rejected, "%s", r);
            }
            if (joined_source(n, g, pt) == AOTRT_OK) {
                ++n->from_source;
                continue;
            }
            /* compile layer by layer: the error then names the layer that fails */
            for (int k = 0; k < n->joined; ++k)
                if (n->programs[k]) {
                    clReleaseProgram(n->programs[k]);
                    n->programs[k] = 0;
                }
            n->joined = 0;
            n->from_binary = n->from_source = 0;
            int rc = per_layer_sources(n, pt);
            if (rc)
                return rc;
            break;
        }
    } else {
        for (int i = 0; i < d->nprograms; ++i) {
            const aotrt_binary *b = i < d->nbinaries ? &d->binaries[i] : NULL;
            if (use && b && b->size) {
                char r[512];
                if (from_binary(n, i, b, r, sizeof r, pt) == 0) {
                    ++n->from_binary;
                    continue;
                }
                if (!nrejected++)
                    snprintf(rejected, sizeof rejected, "%s", r);
            }
        }
        int rc = per_layer_sources(n, pt);
        if (rc)
            return rc;
    }
    n->error[0] = '\0';   /* a joined build that failed before the per-layer one leaves none */
    if (!n->from_source)
        snprintf(n->program_why, sizeof n->program_why,
                 "from the embedded device binar%s for '%s' (driver %s)",
                 n->from_binary == 1 ? "y" : "ies", d->binary_device, d->binary_driver);
    else if (nrejected && !n->from_binary)
        snprintf(n->program_why, sizeof n->program_why, "from source: %s%s", rejected,
                 nrejected > 1 ? " (and the other layers')" : "");
    else if (nrejected)
        snprintf(n->program_why, sizeof n->program_why, "%d of %d programs from source: %s%s",
                 n->from_source, n->from_source + n->from_binary, rejected,
                 nrejected > 1 ? " (and others)" : "");
    else if (use)
        snprintf(n->program_why, sizeof n->program_why,
                 "from source: the build embedded no binary for %s",
                 n->from_binary ? "some layers" : "these programs");
    else
        snprintf(n->program_why, sizeof n->program_why, "from source: %s", why);
    return AOTRT_OK;
}

int aotrt_program_source(const aotrt_net *n, const char **why)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "program_source: net is NULL");
    if (why)
        *why = n->program_why;
    return n->from_source == 0 && n->from_binary > 0 ? 1 : 0;
}

/* The network handle: OpenCL objects made once in create(), the launch table replayed in run(). */
#include "aotconv_rt.h"

#include <errno.h>
#include <math.h>     /* NAN and isinf, macros: no libm */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(n, call, what, layer)                                                          \
    do {                                                                                     \
        cl_int e_ = (call);                                                                  \
        if (e_ != CL_SUCCESS)                                                                \
            return aotrt_set_error((n), AOTRT_ERR_OPENCL, "%s: layer '%s': %s failed: %s (%d)", \
                                   (n)->desc->net, (layer), (what), aotrt_cl_error_name(e_), \
                                   (int)e_);                                                 \
    } while (0)

static int make_kernel(aotrt_net *n, int i)
{
    const aotrt_launch *l = &n->desc->launches[i];
    cl_int err;
    n->kernels[i] = clCreateKernel(n->programs[n->joined ? 0 : l->program], l->kernel, &err);
    if (err != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: layer '%s': clCreateKernel(%s) failed: %s",
                               n->desc->net, l->layer, l->kernel, aotrt_cl_error_name(err));
    for (int a = 0; a < l->nargs; ++a) {
        const aotrt_arg *arg = &l->args[a];
        if (arg->kind == AOTRT_ARG_BUF)
            err = clSetKernelArg(n->kernels[i], a, sizeof(cl_mem), &n->buffers[arg->buffer]);
        else if (arg->kind == AOTRT_ARG_INT)
            err = clSetKernelArg(n->kernels[i], a, sizeof(cl_int), &arg->i);
        else
            err = clSetKernelArg(n->kernels[i], a, sizeof(cl_float), &arg->f);
        if (err != CL_SUCCESS)
            return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                   "%s: layer '%s': clSetKernelArg(%s, %d) failed: %s",
                                   n->desc->net, l->layer, l->kernel, a, aotrt_cl_error_name(err));
    }
    return AOTRT_OK;
}

/* Everything of a handle once its context, queue and device are set: run()'s staging ring
 * and its threads, buffers, programs, kernels with their arguments. */
static int setup(aotrt_net *n, const aotrt_options *o)
{
    const aotrt_desc *d = n->desc;
    cl_int err;
    n->programs = calloc(d->nprograms ? d->nprograms : 1, sizeof(cl_program));
    n->kernels = calloc(d->nlaunches ? d->nlaunches : 1, sizeof(cl_kernel));
    n->buffers = calloc(d->nbuffers ? d->nbuffers : 1, sizeof(cl_mem));
    n->events = calloc(d->nrun ? d->nrun : 1, sizeof(cl_event));
    n->ran = calloc((size_t)d->nsizes, 1);
    if (!n->programs || !n->kernels || !n->buffers || !n->events || !n->ran)
        return aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    /* first: its options are checked before the programs are built */
    int rc = aotrt_stage_setup(n, o);
    if (rc)
        return rc;

    for (int i = 0; i < d->nbuffers; ++i) {
        n->buffers[i] = clCreateBuffer(n->ctx, CL_MEM_READ_WRITE, d->buffers[i].bytes, NULL, &err);
        if (err != CL_SUCCESS)
            return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                   "%s: clCreateBuffer(%s, %zu bytes) failed: %s", d->net,
                                   d->buffers[i].name, d->buffers[i].bytes, aotrt_cl_error_name(err));
    }
    if ((rc = aotrt_build_programs(n, o)))
        return rc;
    for (int i = 0; i < d->nlaunches; ++i)
        if ((rc = make_kernel(n, i)))
            return rc;
    return AOTRT_OK;
}

static aotrt_net *new_handle(const aotrt_desc *d, const aotrt_options *o)
{
    aotrt_net *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->desc = d;
    n->profile_requested = o ? o->profile : 1;
    n->profile = n->profile_requested;
    return n;
}

/* A failed create: the message moves to the thread's, the partial handle is released. */
static int failed(aotrt_net *n, int rc)
{
    aotrt_set_error(NULL, rc, "%s", n->error);
    aotrt_destroy(n);
    return rc;
}

int aotrt_create(const aotrt_desc *d, aotrt_net **out, const aotrt_options *o)
{
    if (!out)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create: out is NULL", d->net);
    *out = NULL;
    aotrt_net *n = new_handle(d, o);
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    int rc = aotrt_pick_device(n, d, o);
    if (rc)
        return failed(n, rc);
    cl_int err;
    n->ctx = clCreateContext(NULL, 1, &n->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        n->ctx = NULL;
        return failed(n, aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: clCreateContext failed: %s",
                                         d->net, aotrt_cl_error_name(err)));
    }
    cl_command_queue_properties props = n->profile ? CL_QUEUE_PROFILING_ENABLE : 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    n->queue = clCreateCommandQueue(n->ctx, n->device, props, &err);
#pragma GCC diagnostic pop
    if (err != CL_SUCCESS) {
        n->queue = NULL;
        return failed(n, aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: clCreateCommandQueue failed: "
                                         "%s", d->net, aotrt_cl_error_name(err)));
    }
    if ((rc = setup(n, o)))
        return failed(n, rc);
    *out = n;
    return AOTRT_OK;
}

/* The application's context, device and in-order queue; each retained here and released by
 * destroy, so the application may release its own references whenever it likes. */
int aotrt_create_with_queue(const aotrt_desc *d, aotrt_net **out, cl_context context,
                            cl_device_id device, cl_command_queue queue, const aotrt_options *o)
{
    if (!out)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: out is NULL",
                               d->net);
    *out = NULL;
    if (!context || !device || !queue)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: %s is NULL",
                               d->net, !context ? "context" : !device ? "device" : "queue");
    cl_context qctx = NULL;
    cl_device_id qdev = NULL;
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (err != CL_SUCCESS)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: queue is not a "
                               "command queue (clGetCommandQueueInfo: %s)", d->net,
                               aotrt_cl_error_name(err));
    if (qctx != context)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: queue belongs "
                               "to another context than context", d->net);
    if (qdev != device) {
        char qname[256], dname[256];
        aotrt_device_label(qdev, qname, sizeof qname);
        aotrt_device_label(device, dname, sizeof dname);
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: queue is on "
                               "device '%s', not on device '%s'", d->net, qname, dname);
    }
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create_with_queue: queue is "
                               "out-of-order; the network's kernels need an in-order queue",
                               d->net);
    aotrt_net *n = new_handle(d, o);
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    int rc = aotrt_device_accepted(n, d, o, device);
    if (rc)
        return failed(n, rc);
    clRetainContext(context);
    n->ctx = context;
    clRetainCommandQueue(queue);
    n->queue = queue;
    clRetainDevice(device);
    n->device = device;
    n->app_queue = 1;
    n->profile = n->profile_requested && (props & CL_QUEUE_PROFILING_ENABLE);
    if ((rc = setup(n, o)))
        return failed(n, rc);
    *out = n;
    return AOTRT_OK;
}

/* sqrt in double without libm (the library links only OpenCL): Newton's iteration from the
 * exponent halved, to within an ulp of the double result; the folded values are rounded to
 * float afterwards. 0, infinity and NaN give themselves and a negative NaN, as sqrt does. */
static double fold_sqrt(double x)
{
    if (!(x > 0) || isinf(x))
        return x < 0 ? NAN : x;
    unsigned long long b;
    double y;
    memcpy(&b, &x, sizeof b);
    b = (b >> 1) + (1023ULL << 51);
    memcpy(&y, &b, sizeof y);
    for (int i = 0; i < 64; ++i) {
        double z = 0.5 * (y + x / y);
        if (z == y)
            break;
        y = z;
    }
    return y;
}

/* `count` floats from `src` into parameter buffer `b` as the kernels read it: float (a
 * non-blocking write unless `blocking`: `src` outlives it) or, where the parameters are stored
 * in half (desc.half_params, an fp16 build), rounded to half in a host array of its own and
 * written blocking. */
static cl_int write_param(aotrt_net *n, int b, const float *src, size_t count, cl_bool blocking)
{
    if (!n->desc->half_params)
        return clEnqueueWriteBuffer(n->queue, n->buffers[b], blocking, 0, count * sizeof(float),
                                    src, 0, NULL, NULL);
    uint16_t *h = malloc(count ? count * sizeof *h : 1);
    if (!h)
        return CL_OUT_OF_HOST_MEMORY;
    aotrt_halves_from_floats(h, src, count);
    cl_int e = clEnqueueWriteBuffer(n->queue, n->buffers[b], CL_TRUE, 0, count * sizeof *h, h,
                                    0, NULL, NULL);
    free(h);
    return e;
}

/* The folded weights and biases (aotrt_fold), written to their buffers. */
static int set_folds(aotrt_net *n, const float *params)
{
    const aotrt_desc *d = n->desc;
    size_t most = 0;
    for (int i = 0; i < d->nfolds; ++i) {
        size_t w = d->folds[i].channels * d->folds[i].per_channel;
        most = w > most ? w : most;
        most = d->folds[i].channels > most ? d->folds[i].channels : most;
    }
    if (!d->nfolds)
        return AOTRT_OK;
    float *tmp = malloc(most * sizeof(float));
    if (!tmp)
        return aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    int rc = AOTRT_OK;
    for (int i = 0; i < d->nfolds && !rc; ++i) {
        const aotrt_fold *f = &d->folds[i];
        const float *w = params + f->weight;
        /* the weights, then the biases, through the one host array (blocking writes) */
        for (int pass = 0; pass < 2 && !rc; ++pass) {
            for (size_t c = 0; c < f->channels; ++c) {
                double s = 1.0, b = f->has_bias ? (double)params[f->bias + c] : 0.0;
                for (int k = 0; k < f->nbn; ++k) {
                    const aotrt_bn *bn = &f->bn[k];
                    double sk = (double)params[bn->gamma + c] /
                                fold_sqrt((double)params[bn->var + c] + bn->eps);
                    s *= sk;
                    b = (b - (double)params[bn->mean + c]) * sk + (double)params[bn->beta + c];
                }
                if (pass == 1) {
                    tmp[c] = (float)b;
                    continue;
                }
                for (size_t j = 0; j < f->per_channel; ++j)
                    tmp[c * f->per_channel + j] = (float)((double)w[c * f->per_channel + j] * s);
            }
            size_t floats = pass ? f->channels : f->channels * f->per_channel;
            cl_int e = write_param(n, pass ? f->bias_buffer : f->weight_buffer, tmp, floats,
                                   CL_TRUE);
            if (e != CL_SUCCESS)
                rc = aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                     "%s: layer '%s': clEnqueueWriteBuffer of the folded %s "
                                     "failed: %s (%d)", d->net, f->layer,
                                     pass ? "bias" : "weight", aotrt_cl_error_name(e), (int)e);
        }
    }
    free(tmp);
    return rc;
}

int aotrt_set_params(aotrt_net *n, const float *params, size_t count)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "set_params: net is NULL");
    const aotrt_desc *d = n->desc;
    if (!params)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_set_params: params is NULL", d->net);
    if (count != d->param_count)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_set_params: got %zu floats, the network has %zu parameters",
                               d->net, count, d->param_count);
    for (int i = 0; i < d->nparams; ++i) {
        const aotrt_param *p = &d->params[i];
        CHECK(n, write_param(n, p->buffer, params + p->offset, p->count, CL_FALSE),
              "clEnqueueWriteBuffer", p->name);
    }
    /* batchnorms folded into the conv or dense before them, then weight re-layouts (packing,
     * Winograd transforms), once, here */
    int frc = set_folds(n, params);
    if (frc)
        return frc;
    for (int i = 0; i < d->nlaunches; ++i) {
        if (d->launches[i].phase != AOTRT_PHASE_SETUP)
            continue;
        int rc = aotrt_enqueue(n, i, NULL);
        if (rc)
            return rc;
    }
    CHECK(n, clFinish(n->queue), "clFinish", "set_params");
    n->params_set = 1;
    return AOTRT_OK;
}

int aotrt_load_params(aotrt_net *n, const char *path)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "load_params: net is NULL");
    const aotrt_desc *d = n->desc;
    if (!path)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_load_params: path is NULL", d->net);
    char shown[640];   /* the path in messages: one line, whatever it holds */
    aotrt_shown(path, shown, sizeof shown);
    /* the size first: a truncated, padded or wrong network's file is refused before any read */
    size_t want = d->param_count * sizeof(float);
    struct stat st;
    if (stat(path, &st) != 0)
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: cannot open '%s': %s", d->net,
                               shown, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: '%s' is not a regular file",
                               d->net, shown);
    unsigned long long size = (unsigned long long)st.st_size;
    if (size != (unsigned long long)want)
        return aotrt_set_error(n, AOTRT_ERR_IO,
                               "%s_load_params: '%s' holds %llu floats%s (%llu bytes, %s); the "
                               "network has %zu parameters = %zu bytes (float32, little-endian, "
                               "in the header's order): rebuild it with aotconv build", d->net,
                               shown, size / 4, size % 4 ? " and stray bytes" : "", size,
                               size < want ? "truncated" : "too long", d->param_count, want);
    FILE *f = fopen(path, "rb");
    if (!f)
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: cannot open '%s': %s", d->net,
                               shown, strerror(errno));
    float *buf = malloc(d->param_count ? d->param_count * sizeof(float) : 1);
    if (!buf) {
        fclose(f);
        return aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    }
    size_t got = fread(buf, sizeof(float), d->param_count, f);
    int failed = ferror(f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    int rc;
    if (failed)
        rc = aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: reading '%s' failed after %zu "
                             "floats", d->net, shown, got);
    else if (got != d->param_count || extra)    /* it changed size while being read */
        rc = aotrt_set_error(n, AOTRT_ERR_IO,
                             "%s_load_params: '%s' holds %s%zu floats, the network has %zu "
                             "parameters (float32, little-endian, in the header's order)",
                             d->net, shown, extra ? "more than " : "", got, d->param_count);
    else
        rc = aotrt_set_params(n, buf, d->param_count);
    free(buf);
    return rc;
}

int aotrt_profile(aotrt_net *n, double *ms, size_t count)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "profile: net is NULL");
    const aotrt_desc *d = n->desc;
    if (!ms)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_profile: layer_ms is NULL", d->net);
    if (count != (size_t)d->nrun)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_profile: room for %zu entries, the network runs %d kernels",
                               d->net, count, d->nrun);
    if (!n->profile)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_profile: %s", d->net,
                               n->profile_requested ? "the application's queue was created "
                               "without CL_QUEUE_PROFILING_ENABLE" : "created with profiling off");
    if (n->pending)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_profile: the last run is still in "
                               "flight; call wait first", d->net);
    int any = 0;
    for (int s = 0; s < d->nsizes; ++s)
        any |= n->ran[s] == AOTRT_RAN_DONE;
    if (!any)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_profile: no completed run yet", d->net);
    /* every size's entries from its own last run; NaN for a size not run yet */
    for (int s = 0; s < d->nsizes; ++s) {
        const aotrt_size *z = &d->sizes[s];
        int r = z->first_run;
        for (int i = z->first_launch; i < z->first_launch + z->nlaunches; ++i) {
            if (d->launches[i].phase != AOTRT_PHASE_RUN)
                continue;
            cl_ulong t0 = 0, t1 = 0;
            if (n->ran[s] != AOTRT_RAN_DONE) {
                ms[r++] = NAN;
                continue;
            }
            CHECK(n, clGetEventProfilingInfo(n->events[r], CL_PROFILING_COMMAND_START, sizeof t0,
                                             &t0, NULL),
                  "clGetEventProfilingInfo", d->launches[i].layer);
            CHECK(n, clGetEventProfilingInfo(n->events[r], CL_PROFILING_COMMAND_END, sizeof t1,
                                             &t1, NULL),
                  "clGetEventProfilingInfo", d->launches[i].layer);
            ms[r++] = (double)(t1 - t0) * 1e-6;
        }
    }
    return AOTRT_OK;
}

/* The device memory the handle allocated, by kind, and the pinned host memory it holds now. */
int aotrt_memory(const aotrt_net *n, aotrt_memory_info *info)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "memory: net is NULL");
    const aotrt_desc *d = n->desc;
    if (!info)
        return aotrt_set_error((aotrt_net *)n, AOTRT_ERR_ARGUMENT, "%s_memory: info is NULL",
                               d->net);
    memset(info, 0, sizeof *info);
    for (int i = 0; i < d->nbuffers; ++i) {
        size_t b = d->buffers[i].bytes;
        switch (d->buffers[i].kind) {
        case AOTRT_BUF_ACT: info->activation_bytes += b; break;
        case AOTRT_BUF_PARAM: info->parameter_bytes += b; break;
        case AOTRT_BUF_EXTRA: info->variant_bytes += b; break;
        default: info->scratch_bytes += b; break;
        }
        info->device_bytes += b;
    }
    if (n->host_ptr[0])
        info->pinned_bytes += aotrt_largest(d)->input_count * sizeof(float);
    if (n->host_ptr[1])
        info->pinned_bytes += aotrt_largest(d)->output_count * sizeof(float);
    info->pinned_bytes += (size_t)n->stage_slots * n->stage_bytes;
    return AOTRT_OK;
}

const char *aotrt_last_error(const aotrt_net *n)
{
    return n ? n->error : aotrt_global_error();
}

/* Pinned (page-locked) host memory the size of the inputs (all of them, one after another)
 * and of the outputs: a buffer allocated by the driver in host memory (CL_MEM_ALLOC_HOST_PTR)
 * and mapped once. run() given these pointers (run_inputs: pointers into the inputs' block)
 * copies by DMA on drivers that recognise pinned memory (NVIDIA's), without the staging copy
 * that pageable memory needs; elsewhere it costs nothing. Allocated on the first call, then
 * the same pointers; released by destroy. */
int aotrt_host_buffers(aotrt_net *n, float **input, float **output)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "host_buffers: net is NULL");
    const aotrt_desc *d = n->desc;
    if (!input && !output)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_host_buffers: input and output are both NULL", d->net);
    const size_t counts[2] = {aotrt_largest(d)->input_count, aotrt_largest(d)->output_count};
    const char *what[2] = {"input", "output"};
    for (int i = 0; i < 2; ++i) {
        if (n->host_ptr[i])
            continue;
        cl_int err;
        size_t bytes = counts[i] * sizeof(float);
        n->host_mem[i] = clCreateBuffer(n->ctx, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, bytes,
                                        NULL, &err);
        if (err != CL_SUCCESS) {
            n->host_mem[i] = NULL;
            return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                   "%s_host_buffers: clCreateBuffer(CL_MEM_ALLOC_HOST_PTR, %zu "
                                   "bytes) for the %s failed: %s (%d)", d->net, bytes, what[i],
                                   aotrt_cl_error_name(err), (int)err);
        }
        n->host_ptr[i] = clEnqueueMapBuffer(n->queue, n->host_mem[i], CL_TRUE,
                                            CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL, NULL,
                                            &err);
        if (err != CL_SUCCESS || !n->host_ptr[i]) {
            n->host_ptr[i] = NULL;
            clReleaseMemObject(n->host_mem[i]);
            n->host_mem[i] = NULL;
            return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                   "%s_host_buffers: clEnqueueMapBuffer of the %s failed: %s (%d)",
                                   d->net, what[i], aotrt_cl_error_name(err), (int)err);
        }
    }
    if (input)
        *input = n->host_ptr[0];
    if (output)
        *output = n->host_ptr[1];
    return AOTRT_OK;
}

/* Release every object of an array of `count` (NULL slots and a NULL array skipped). */
#define RELEASE_EACH(array, count, release)                                                  \
    do {                                                                                     \
        if (array)                                                                           \
            for (int i_ = 0; i_ < (count); ++i_)                                             \
                if ((array)[i_])                                                             \
                    release((array)[i_]);                                                    \
    } while (0)

void aotrt_destroy(aotrt_net *n)
{
    if (!n)
        return;
    const aotrt_desc *d = n->desc;
    aotrt_pool_free(n->stage_pool);    /* joins the staging threads */
    for (int i = 0; i < 2; ++i)
        if (n->host_ptr[i])
            clEnqueueUnmapMemObject(n->queue, n->host_mem[i], n->host_ptr[i], 0, NULL, NULL);
    if (n->stage_ptr)
        clEnqueueUnmapMemObject(n->queue, n->stage_mem, n->stage_ptr, 0, NULL, NULL);
    if (n->queue)
        clFinish(n->queue);    /* a run in flight ends before its buffers go */
    if (n->done)
        clReleaseEvent(n->done);
    for (int i = 0; i < 2; ++i)
        if (n->host_mem[i])
            clReleaseMemObject(n->host_mem[i]);
    if (n->stage_mem)
        clReleaseMemObject(n->stage_mem);
    RELEASE_EACH(n->events, d->nrun, clReleaseEvent);
    RELEASE_EACH(n->kernels, d->nlaunches, clReleaseKernel);
    RELEASE_EACH(n->programs, d->nprograms, clReleaseProgram);
    RELEASE_EACH(n->buffers, d->nbuffers, clReleaseMemObject);
    if (n->queue)
        clReleaseCommandQueue(n->queue);
    if (n->app_queue && n->device)
        clReleaseDevice(n->device);
    if (n->ctx)
        clReleaseContext(n->ctx);
    free(n->events);
    free(n->ran);
    free(n->kernels);
    free(n->programs);
    free(n->buffers);
    free(n);
}

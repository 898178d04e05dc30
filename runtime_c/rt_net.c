/* The network handle: OpenCL objects made once in create(), the launch table replayed in run(). */
#define _POSIX_C_SOURCE 200809L   /* open, read, fstat, posix_fadvise under -std=c11 */
#include "aotconv_rt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>     /* NAN and isinf, macros: no libm */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    int slot = n->joined ? n->desc->programs[l->program].group : l->program;
    n->kernels[i] = clCreateKernel(n->programs[slot], l->kernel, &err);
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
 * and its threads, buffers, programs, kernels with their arguments. Each a step of the trace. */
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
    int flush = o ? o->flush_every : 0;
    if (flush < -1)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s: options.flush_every is %d; give 0 "
                               "(the default: no flushes), N > 0 (a clFlush every N kernels) "
                               "or -1 (none)", d->net, flush);
    n->flush_every = flush > 0 ? flush : 0;
    int rc = aotrt_stage_setup(n, o);
    if (rc)
        return rc;
    aotrt_memory_info mi;
    if (n->trace && n->trace->on && aotrt_memory(n, &mi) == AOTRT_OK)
        aotrt_trace_note(n->trace, "%.1f MiB pinned", (double)mi.pinned_bytes / (1 << 20));
    aotrt_trace_step(n->trace, "staging", -1);

    size_t bytes = 0;
    for (int i = 0; i < d->nbuffers; ++i) {
        n->buffers[i] = clCreateBuffer(n->ctx, CL_MEM_READ_WRITE, d->buffers[i].bytes, NULL, &err);
        if (err != CL_SUCCESS)
            return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                                   "%s: clCreateBuffer(%s, %zu bytes) failed: %s", d->net,
                                   d->buffers[i].name, d->buffers[i].bytes, aotrt_cl_error_name(err));
        bytes += d->buffers[i].bytes;
    }
    aotrt_trace_note(n->trace, "%d, %.1f MiB", d->nbuffers, (double)bytes / (1 << 20));
    aotrt_trace_step(n->trace, "buffers", -1);
    if ((rc = aotrt_build_programs(n, o)))
        return rc;
    aotrt_trace_step(n->trace, "programs", -1);
    for (int i = 0; i < d->nlaunches; ++i)
        if ((rc = make_kernel(n, i)))
            return rc;
    aotrt_trace_note(n->trace, "%d", d->nlaunches);
    aotrt_trace_step(n->trace, "kernels", -1);
    return AOTRT_OK;
}

static aotrt_net *new_handle(const aotrt_desc *d, const aotrt_options *o)
{
    aotrt_net *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->desc = d;
    n->profile_requested = o ? o->profile : 0;
    n->profile = n->profile_requested;
    return n;
}

/* A failed create: the trace line is written, the message moves to the thread's, the partial
 * handle is released. */
static int failed(aotrt_net *n, int rc)
{
    aotrt_trace_end(n->trace, rc);
    aotrt_set_error(NULL, rc, "%s", n->error);
    aotrt_destroy(n);
    return rc;
}

/* A handle made: the trace line is written and the trace detached from it. */
static int made(aotrt_net *n, aotrt_net **out)
{
    aotrt_trace_end(n->trace, AOTRT_OK);
    n->trace = NULL;
    *out = n;
    return AOTRT_OK;
}

int aotrt_create(const aotrt_desc *d, aotrt_net **out, const aotrt_options *o)
{
    if (!out)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s_create: out is NULL", d->net);
    *out = NULL;
    aotrt_trace t;
    aotrt_trace_begin(&t, d->net, "create");
    aotrt_net *n = new_handle(d, o);
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    n->trace = &t;
    int rc = aotrt_pick_device(n, d, o);
    if (rc)
        return failed(n, rc);
    aotrt_trace_step(&t, "device", -1);
    cl_int err;
    n->ctx = clCreateContext(NULL, 1, &n->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        n->ctx = NULL;
        return failed(n, aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: clCreateContext failed: %s",
                                         d->net, aotrt_cl_error_name(err)));
    }
    aotrt_trace_step(&t, "context", -1);
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
    aotrt_trace_step(&t, "queue", -1);
    if ((rc = setup(n, o)))
        return failed(n, rc);
    return made(n, out);
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
    aotrt_trace t;
    aotrt_trace_begin(&t, d->net, "create_with_queue");
    aotrt_net *n = new_handle(d, o);
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    n->trace = &t;
    int rc = aotrt_device_accepted(n, d, o, device);
    if (rc)
        return failed(n, rc);
    aotrt_trace_step(&t, "device", -1);
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
    return made(n, out);
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

/* `count` floats from `src` into parameter buffer `b`, from its element `first` on, as the
 * kernels read it: float (a non-blocking write unless `blocking`: `src` outlives it) or, where
 * the parameters are stored in half (desc.half_params, an fp16 build), rounded to half in a
 * host array of its own and written blocking. */
static cl_int write_param(aotrt_net *n, int b, size_t first, const float *src, size_t count,
                          cl_bool blocking)
{
    if (!n->desc->half_params)
        return clEnqueueWriteBuffer(n->queue, n->buffers[b], blocking, first * sizeof(float),
                                    count * sizeof(float), src, 0, NULL, NULL);
    uint16_t *h = malloc(count ? count * sizeof *h : 1);
    if (!h)
        return CL_OUT_OF_HOST_MEMORY;
    aotrt_halves_from_floats(h, src, count);
    cl_int e = clEnqueueWriteBuffer(n->queue, n->buffers[b], CL_TRUE, first * sizeof *h,
                                    count * sizeof *h, h, 0, NULL, NULL);
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
            cl_int e = write_param(n, pass ? f->bias_buffer : f->weight_buffer, 0, tmp, floats,
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

/* What set_params and load_params do once every tensor is enqueued: the folds, the setup
 * launches (weight re-layouts: packing, Winograd transforms), once, here, and the wait for all
 * of it. `params` holds at least the folds' inputs. */
static int finish_params(aotrt_net *n, const float *params, aotrt_trace *t)
{
    const aotrt_desc *d = n->desc;
    int rc = set_folds(n, params);
    if (rc)
        return rc;
    aotrt_trace_note(t, "%d", d->nfolds);
    aotrt_trace_step(t, "folds", -1);
    int setups = 0;
    for (int i = 0; i < d->nlaunches; ++i) {
        if (d->launches[i].phase != AOTRT_PHASE_SETUP)
            continue;
        if ((rc = aotrt_enqueue(n, i, NULL)))
            return rc;
        ++setups;
    }
    aotrt_trace_note(t, "%d", setups);
    aotrt_trace_step(t, "setup launches", -1);
    CHECK(n, clFinish(n->queue), "clFinish", "set_params");
    aotrt_trace_step(t, "finish", -1);
    n->params_set = 1;
    return AOTRT_OK;
}

static int set_params(aotrt_net *n, const float *params, aotrt_trace *t)
{
    const aotrt_desc *d = n->desc;
    /* unset until every tensor is written: a call that fails on the way leaves run() refusing,
     * never running on a mix of old and new parameters */
    n->params_set = 0;
    for (int i = 0; i < d->nparams; ++i) {
        const aotrt_param *p = &d->params[i];
        CHECK(n, write_param(n, p->buffer, 0, params + p->offset, p->count, CL_FALSE),
              "clEnqueueWriteBuffer", p->name);
    }
    aotrt_trace_note(t, "%d tensors, %.1f MB enqueued", d->nparams,
                     (double)d->param_count * sizeof(float) * 1e-6);
    aotrt_trace_step(t, "upload", -1);
    return finish_params(n, params, t);
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
    aotrt_trace t;
    aotrt_trace_begin(&t, d->net, "set_params");
    int rc = set_params(n, params, &t);
    aotrt_trace_end(&t, rc);
    return rc;
}

/* load_params reads the file in chunks of LOAD_CHUNK bytes straight into a ring of pinned host
 * memory and enqueues each chunk's part of every tensor from there while it reads the next:
 * no copy of the whole file in host memory, and on a GPU the writes are DMA from pinned
 * memory, overlapping the reads. read(), not mmap: a mapped file that shrinks while it is read
 * raises SIGBUS in whichever thread touches it (the driver's too), which a library cannot
 * catch; read() returns short, and the file is refused. */
#define LOAD_CHUNK ((size_t)4 << 20)
#define LOAD_SLOTS 4

typedef struct {
    cl_mem mem;                 /* pinned, mapped at ptr; NULL: ptr is ordinary memory */
    unsigned char *ptr;
    size_t slot;                /* bytes per slot, a multiple of sizeof(float) */
    int slots;
    cl_event busy[LOAD_SLOTS];  /* a marker after the writes from a slot, until they are done */
} load_ring;

static int ring_open(aotrt_net *n, load_ring *r, size_t bytes)
{
    memset(r, 0, sizeof *r);
    r->slot = bytes < LOAD_CHUNK ? bytes : LOAD_CHUNK;
    size_t slots = (bytes + r->slot - 1) / r->slot;
    r->slots = slots < LOAD_SLOTS ? (int)slots : LOAD_SLOTS;
    size_t total = r->slot * (size_t)r->slots;
    cl_int err;
    r->mem = clCreateBuffer(n->ctx, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, total, NULL, &err);
    if (err != CL_SUCCESS) {
        r->mem = NULL;
    } else {
        r->ptr = clEnqueueMapBuffer(n->queue, r->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                    total, 0, NULL, NULL, &err);
        if (err != CL_SUCCESS || !r->ptr) {
            r->ptr = NULL;
            clReleaseMemObject(r->mem);
            r->mem = NULL;
        }
    }
    /* no pinned memory to be had: ordinary memory does the same, the driver copying from it */
    if (!r->ptr)
        r->ptr = malloc(total);
    if (!r->ptr)
        return aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", n->desc->net);
    return AOTRT_OK;
}

/* Slot s free again: the writes that read it are done. */
static int ring_wait(aotrt_net *n, load_ring *r, int s)
{
    if (!r->busy[s])
        return AOTRT_OK;
    cl_int e = clWaitForEvents(1, &r->busy[s]);
    clReleaseEvent(r->busy[s]);
    r->busy[s] = NULL;
    if (e != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s_load_params: writing the parameters "
                               "failed: %s (%d)", n->desc->net, aotrt_cl_error_name(e), (int)e);
    return AOTRT_OK;
}

/* After the last write from the ring, a failed one too. */
static void ring_close(aotrt_net *n, load_ring *r)
{
    clFinish(n->queue);
    for (int s = 0; s < r->slots; ++s)
        if (r->busy[s])
            clReleaseEvent(r->busy[s]);
    if (r->mem) {
        if (clEnqueueUnmapMemObject(n->queue, r->mem, r->ptr, 0, NULL, NULL) == CL_SUCCESS)
            clFinish(n->queue);
        clReleaseMemObject(r->mem);
    } else {
        free(r->ptr);
    }
}

/* floats [off, off + count) of the file, where they lie in the chunk of floats [c0, c1) */
static void keep_range(float *keep, const float *chunk, size_t c0, size_t c1, size_t off,
                       size_t count)
{
    size_t lo = off > c0 ? off : c0, hi = off + count < c1 ? off + count : c1;
    if (lo < hi)
        memcpy(keep + lo, chunk + (lo - c0), (hi - lo) * sizeof(float));
}

/* The chunk of the file's floats [c0, c1): every tensor's part of it enqueued from the chunk,
 * the folds' inputs copied to `keep` (at their offsets in the file) for set_folds. */
static int put_chunk(aotrt_net *n, const float *chunk, size_t c0, size_t c1, float *keep)
{
    const aotrt_desc *d = n->desc;
    for (int i = 0; i < d->nparams; ++i) {
        const aotrt_param *p = &d->params[i];
        size_t lo = p->offset > c0 ? p->offset : c0;
        size_t hi = p->offset + p->count < c1 ? p->offset + p->count : c1;
        if (lo < hi)
            CHECK(n, write_param(n, p->buffer, lo - p->offset, chunk + (lo - c0), hi - lo,
                                 CL_FALSE),
                  "clEnqueueWriteBuffer", p->name);
    }
    for (int i = 0; keep && i < d->nfolds; ++i) {
        const aotrt_fold *f = &d->folds[i];
        keep_range(keep, chunk, c0, c1, f->weight, f->channels * f->per_channel);
        if (f->has_bias)
            keep_range(keep, chunk, c0, c1, f->bias, f->channels);
        for (int k = 0; k < f->nbn; ++k) {
            keep_range(keep, chunk, c0, c1, f->bn[k].gamma, f->channels);
            keep_range(keep, chunk, c0, c1, f->bn[k].beta, f->channels);
            keep_range(keep, chunk, c0, c1, f->bn[k].mean, f->channels);
            keep_range(keep, chunk, c0, c1, f->bn[k].var, f->channels);
        }
    }
    return AOTRT_OK;
}

/* A file of another kind or size than the network's parameters, refused before any read. */
static int check_file(aotrt_net *n, const struct stat *st, const char *shown)
{
    const aotrt_desc *d = n->desc;
    size_t want = d->param_count * sizeof(float);
    if (!S_ISREG(st->st_mode))
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: '%s' is not a regular file",
                               d->net, shown);
    unsigned long long size = (unsigned long long)st->st_size;
    if (size != (unsigned long long)want)
        return aotrt_set_error(n, AOTRT_ERR_IO,
                               "%s_load_params: '%s' holds %llu floats%s (%llu bytes, %s); the "
                               "network has %zu parameters = %zu bytes (float32, little-endian, "
                               "in the header's order): rebuild it with aotconv build", d->net,
                               shown, size / 4, size % 4 ? " and stray bytes" : "", size,
                               size < want ? "truncated" : "too long", d->param_count, want);
    return AOTRT_OK;
}

static int open_params(aotrt_net *n, const char *path, const char *shown, int *fd)
{
    const aotrt_desc *d = n->desc;
    /* the size first: a truncated, padded or wrong network's file is refused before any read */
    struct stat st;
    if (stat(path, &st) != 0)
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: cannot open '%s': %s", d->net,
                               shown, strerror(errno));
    int rc = check_file(n, &st, shown);
    if (rc)
        return rc;
    /* O_NONBLOCK: a fifo put in the file's place since the stat is not waited on, but refused
     * below (reading a regular file ignores it) */
    int flags = O_RDONLY | O_NONBLOCK;
#ifdef O_CLOEXEC
    flags |= O_CLOEXEC;
#endif
    *fd = open(path, flags);
    if (*fd < 0)
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: cannot open '%s': %s", d->net,
                               shown, strerror(errno));
    /* the file opened is checked again: it may have been replaced since the stat */
    if (fstat(*fd, &st) != 0)
        return aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: cannot open '%s': %s", d->net,
                               shown, strerror(errno));
    if ((rc = check_file(n, &st, shown)))
        return rc;
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(*fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    return AOTRT_OK;
}

/* up to `len` bytes of fd into buf: fewer only at the end of the file or on an error (*err) */
static size_t read_full(int fd, unsigned char *buf, size_t len, int *err)
{
    size_t got = 0;
    *err = 0;
    while (got < len) {
        ssize_t k = read(fd, buf + got, len - got);
        if (k > 0)
            got += (size_t)k;
        else if (k == 0)
            break;
        else if (errno != EINTR) {
            *err = errno;
            break;
        }
    }
    return got;
}

/* The file's floats through the ring into the parameter buffers, then the folds and the setup
 * launches. The file must end where the parameters do: one that changed size since the stat
 * is refused (and leaves no parameters: some were written). */
static int read_params(aotrt_net *n, int fd, const char *shown, aotrt_trace *t)
{
    const aotrt_desc *d = n->desc;
    size_t want = d->param_count * sizeof(float);
    load_ring r;
    memset(&r, 0, sizeof r);
    int rc = want ? ring_open(n, &r, want) : AOTRT_OK;
    if (rc)
        return rc;
    float *keep = NULL;   /* the folds' inputs; the pages of the rest are never touched */
    if (d->nfolds && !(keep = malloc(want)))
        rc = aotrt_set_error(n, AOTRT_ERR_MEMORY, "%s: out of host memory", d->net);
    if (want)
        aotrt_trace_note(t, "%d x %.1f MiB, %s", r.slots, (double)r.slot / (1 << 20),
                         r.mem ? "pinned" : "ordinary memory");
    aotrt_trace_step(t, "ring", -1);
    if (!rc)
        n->params_set = 0;    /* as in set_params: until every tensor is written */
    double read_ms = 0, put_ms = 0, wait_ms = 0;
    size_t done = 0;
    int err = 0;
    for (int s = 0; done < want && !rc; s = (s + 1) % r.slots) {
        size_t len = want - done < r.slot ? want - done : r.slot;
        double t0 = aotrt_now_ms();
        if ((rc = ring_wait(n, &r, s)))
            break;
        double t1 = aotrt_now_ms();
        unsigned char *chunk = r.ptr + (size_t)s * r.slot;
        size_t got = read_full(fd, chunk, len, &err);
        double t2 = aotrt_now_ms();
        wait_ms += t1 - t0;
        read_ms += t2 - t1;
        done += got;
        if (err || got < len)
            break;
        rc = put_chunk(n, (const float *)chunk, (done - len) / sizeof(float),
                       done / sizeof(float), keep);
        cl_int e = rc ? CL_SUCCESS : clEnqueueMarkerWithWaitList(n->queue, 0, NULL, &r.busy[s]);
        if (e != CL_SUCCESS) {
            r.busy[s] = NULL;
            rc = aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s_load_params: clEnqueueMarkerWithWait"
                                 "List failed: %s (%d)", d->net, aotrt_cl_error_name(e), (int)e);
        }
        put_ms += aotrt_now_ms() - t2;
    }
    unsigned char byte;
    int extra = !rc && !err && done == want && read_full(fd, &byte, 1, &err) == 1;
    if (rc) {
        /* the message is set */
    } else if (err) {
        rc = aotrt_set_error(n, AOTRT_ERR_IO, "%s_load_params: reading '%s' failed after %zu "
                             "floats: %s", d->net, shown, done / sizeof(float), strerror(err));
    } else if (done != want || extra) {    /* it changed size while being read */
        rc = aotrt_set_error(n, AOTRT_ERR_IO,
                             "%s_load_params: '%s' holds %s%zu floats, the network has %zu "
                             "parameters (float32, little-endian, in the header's order)",
                             d->net, shown, extra ? "more than " : "", done / sizeof(float),
                             d->param_count);
    } else {
        aotrt_trace_note(t, "%.1f MB", (double)want * 1e-6);
        aotrt_trace_step(t, "read", read_ms);
        aotrt_trace_note(t, "%d tensors", d->nparams);
        aotrt_trace_step(t, "enqueue", put_ms);
        aotrt_trace_step(t, "slot waits", wait_ms);
        rc = finish_params(n, keep, t);
    }
    if (want)
        ring_close(n, &r);
    free(keep);
    return rc;
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
    aotrt_trace t;
    aotrt_trace_begin(&t, d->net, "load_params");
    int fd = -1;
    int rc = open_params(n, path, shown, &fd);
    if (!rc) {
        aotrt_trace_step(&t, "open", -1);
        rc = read_params(n, fd, shown, &t);
    }
    if (fd >= 0)
        close(fd);
    aotrt_trace_end(&t, rc);
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
                               "without CL_QUEUE_PROFILING_ENABLE" : "created with profiling off: "
                               "create with options.profile = 1 for per-kernel times");
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

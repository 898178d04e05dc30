/* Running the network: run() (blocking, staged through pinned memory), run_async() and
 * run_buffers() (enqueue and return), wait(); run_n(), run_async_n() and run_buffers_n() for
 * any number of samples up to the largest batch size; the _inputs twins of all six for a
 * network of several inputs (the calls without take a network of one input only).
 *
 * Every run is: each input into its input buffer of one batch size (the samples given, zeros
 * after them), that size's run-phase launches in order, the given samples' outputs out of its
 * buffers, on the handle's in-order queue, with no host synchronisation in between. run()
 * and its twins run the largest size with all its samples.
 *
 * run() copies pageable input and output memory through a ring of pinned chunks (the staging
 * ring, made by create): the host copies chunk k into a free slot while the device copies
 * chunk k-1 out of its slot by DMA, and likewise for the output the other way round. The
 * host's copy of a chunk is split among the caller and the staging threads (rt_pool.c), so
 * that it keeps up with the DMA. A driver that stages pageable memory itself (NVIDIA's) does
 * the two copies one after the other. The handle's own pinned buffers (host_buffers) are
 * copied directly, as they are pinned already.
 */
#include "aotconv_rt.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int aotrt_enqueue(aotrt_net *n, int i, cl_event *ev)
{
    const aotrt_launch *l = &n->desc->launches[i];
    int has_local = l->local[0] != 0;
    cl_int err = clEnqueueNDRangeKernel(n->queue, n->kernels[i], l->dims, NULL, l->global,
                                        has_local ? l->local : NULL, 0, NULL, ev);
    if (err != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL,
                               "%s: layer '%s': clEnqueueNDRangeKernel(%s) failed: %s (%d)",
                               n->desc->net, l->layer, l->kernel, aotrt_cl_error_name(err), (int)err);
    return AOTRT_OK;
}

/* The threads that copy for the staging ring: options.stage_threads (0: the CPUs this process
 * may run on, at most AOTRT_STAGE_THREADS_DEFAULT; above AOTRT_STAGE_THREADS_MAX, that), no more
 * than a slot has pieces of AOTRT_STAGE_PART bytes. */
static int stage_threads(const aotrt_options *o, size_t slot)
{
    int want = o ? o->stage_threads : 0;
    if (!want) {
        want = aotrt_cpu_count();
        want = want < AOTRT_STAGE_THREADS_DEFAULT ? want : AOTRT_STAGE_THREADS_DEFAULT;
    }
    want = want < AOTRT_STAGE_THREADS_MAX ? want : AOTRT_STAGE_THREADS_MAX;
    size_t pieces = (slot + AOTRT_STAGE_PART - 1) / AOTRT_STAGE_PART;
    return pieces < (size_t)want ? (int)pieces : want;
}

/* The staging ring: slots of min(chunk, largest transfer) bytes, as many as the largest
 * transfer fills, at most AOTRT_STAGE_SLOTS, and the pool of threads that copy into and out of
 * them (none where one thread copies a slot). */
int aotrt_stage_setup(aotrt_net *n, const aotrt_options *o)
{
    const aotrt_desc *d = n->desc;
    if (o && o->stage_threads < 0)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s: options.stage_threads is %d; give 0 "
                               "(the default: one per CPU, at most %d), 1 (run()'s caller "
                               "copies alone) or more (at most %d are used)", d->net,
                               o->stage_threads, AOTRT_STAGE_THREADS_DEFAULT,
                               AOTRT_STAGE_THREADS_MAX);
    long chunk = o && o->stage_bytes ? o->stage_bytes : AOTRT_STAGE_BYTES;
    if (chunk < 0)
        return AOTRT_OK;
    const aotrt_size *z = aotrt_largest(d);
    size_t most = z->output_count;
    for (int i = 0; i < d->ninputs; ++i)
        most = z->inputs[i].count > most ? z->inputs[i].count : most;
    most *= sizeof(float);
    if (!most)
        return AOTRT_OK;
    size_t slot = (size_t)chunk < most ? (size_t)chunk : most;
    size_t slots = (most + slot - 1) / slot;
    slots = slots < AOTRT_STAGE_SLOTS ? slots : AOTRT_STAGE_SLOTS;
    cl_int err;
    n->stage_mem = clCreateBuffer(n->ctx, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE,
                                  slot * slots, NULL, &err);
    if (err != CL_SUCCESS) {
        n->stage_mem = NULL;
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: clCreateBuffer(CL_MEM_ALLOC_HOST_PTR, "
                               "%zu bytes) for run()'s staging failed: %s (%d); "
                               "options.stage_bytes = -1 turns staging off", d->net,
                               slot * slots, aotrt_cl_error_name(err), (int)err);
    }
    n->stage_ptr = clEnqueueMapBuffer(n->queue, n->stage_mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE,
                                      0, slot * slots, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS || !n->stage_ptr) {
        n->stage_ptr = NULL;
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s: clEnqueueMapBuffer of run()'s staging "
                               "ring failed: %s (%d)", d->net, aotrt_cl_error_name(err), (int)err);
    }
    n->stage_bytes = slot;
    n->stage_slots = (int)slots;
    /* NULL where no thread could be made: the caller copies alone, to the same bytes */
    n->stage_pool = aotrt_pool_new(stage_threads(o, slot), AOTRT_STAGE_PART);
    return AOTRT_OK;
}

/* What one run moves: `samples` samples through batch size `z` (sizes[size]). */
typedef struct {
    const aotrt_size *z;
    int size;
    size_t samples;
    int by_n;                 /* a call that took n: its messages say so */
} run_of;

static size_t in_floats(const run_of *r, int i)
{
    return r->samples * (r->z->inputs[i].count / r->z->batch);
}

static size_t out_floats(const run_of *r, int o)
{
    return r->samples * (r->z->outputs[o].count / r->z->batch);
}

static size_t out_total(const run_of *r)
{
    return r->samples * (r->z->output_count / r->z->batch);
}

/* run(), run_async(), run_buffers(): the largest size, every sample. */
static run_of whole(const aotrt_net *n)
{
    const aotrt_desc *d = n->desc;
    run_of r = {aotrt_largest(d), d->nsizes - 1, aotrt_largest(d)->batch, 0};
    return r;
}

/* The run of `samples` samples: the smallest size that holds them, or an error naming the
 * sizes there are. */
static int pick(aotrt_net *n, const char *call, size_t samples, run_of *r)
{
    const aotrt_desc *d = n->desc;
    for (int s = 0; s < d->nsizes && samples; ++s)
        if (d->sizes[s].batch >= samples) {
            run_of got = {&d->sizes[s], s, samples, 1};
            *r = got;
            return AOTRT_OK;
        }
    char sizes[128] = "";
    size_t at = 0;
    for (int s = 0; s < d->nsizes; ++s) {
        if (at > sizeof sizes - 32) {      /* an entry takes at most 22 characters */
            snprintf(sizes + at, sizeof sizes - at, ", ...");
            break;
        }
        at += (size_t)snprintf(sizes + at, sizeof sizes - at, "%s%zu", s ? ", " : "",
                               d->sizes[s].batch);
    }
    return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: n is %zu; give 1 to %zu samples (the "
                           "library's batch sizes: %s)", d->net, call, samples,
                           aotrt_largest(d)->batch, sizes);
}

/* The network's input names, "a, b, c", cut with "..." to fit `size`. */
static const char *input_names(const aotrt_desc *d, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->ninputs; ++i) {
        size_t len = strlen(d->input_names[i]);
        if (at + len + 8 > size) {
            snprintf(buf + at, size - at, "%s...", i ? ", " : "");
            break;
        }
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? ", " : "", d->input_names[i]);
    }
    return buf;
}

/* A call that takes one input (`call`), on a network of several: an error naming the call
 * that takes them all (`twin`). */
static int one_input(aotrt_net *n, const char *call, const char *twin)
{
    const aotrt_desc *d = n->desc;
    if (d->ninputs == 1)
        return AOTRT_OK;
    char names[512];
    return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: the network has %d inputs (%s); "
                           "call %s_%s with all of them", d->net, call, d->ninputs,
                           input_names(d, names, sizeof names), d->net, twin);
}

/* The inputs array of an _inputs call: as many as the network has. */
static int check_ninputs(aotrt_net *n, const char *call, const void *inputs, size_t n_inputs)
{
    const aotrt_desc *d = n->desc;
    char names[512];
    if (!inputs)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: inputs is NULL", d->net, call);
    if (n_inputs != (size_t)d->ninputs)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: n_inputs is %zu; the network "
                               "has %d input%s (%s)", d->net, call, n_inputs, d->ninputs,
                               d->ninputs == 1 ? "" : "s", input_names(d, names, sizeof names));
    return AOTRT_OK;
}

/* Where an input is named in a message: "input" for a network of one, else "input 1 ('b')". */
static const char *input_label(const aotrt_desc *d, int i, char *buf, size_t size)
{
    if (d->ninputs == 1)
        snprintf(buf, size, "input");
    else
        snprintf(buf, size, "input %d ('%s')", i, d->input_names[i]);
    return buf;
}

static int check_run(aotrt_net *n, const char *call, const run_of *r,
                     const float *const *inputs, const size_t *counts, float *output,
                     size_t output_count)
{
    const aotrt_desc *d = n->desc;
    char per[96] = "", what[200];
    if (!counts)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: counts is NULL", d->net, call);
    for (int i = 0; i < d->ninputs; ++i)
        if (!inputs[i])
            return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s is NULL", d->net, call,
                                   input_label(d, i, what, sizeof what));
    if (!output)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: output is NULL", d->net, call);
    for (int i = 0; i < d->ninputs; ++i) {
        if (counts[i] != in_floats(r, i)) {
            if (r->by_n)
                snprintf(per, sizeof per, " (%zu samples of %zu)", r->samples,
                         in_floats(r, i) / r->samples);
            return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                                   "%s_%s: %s has %zu floats, expected %zu%s", d->net, call,
                                   input_label(d, i, what, sizeof what), counts[i],
                                   in_floats(r, i), per);
        }
    }
    if (output_count != out_total(r)) {
        if (r->by_n)
            snprintf(per, sizeof per, " (%zu samples of %zu)", r->samples,
                     out_total(r) / r->samples);
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_%s: output has room for %zu floats, expected %zu%s", d->net,
                               call, output_count, out_total(r), per);
    }
    if (!n->params_set)
        return aotrt_set_error(n, AOTRT_ERR_STATE,
                               "%s_%s: parameters are not set; call set_params or load_params "
                               "first", d->net, call);
    return AOTRT_OK;
}

/* The run-phase launches of size s, each with its profiling event when profiling is on. */
static int enqueue_kernels(aotrt_net *n, int s)
{
    const aotrt_desc *d = n->desc;
    const aotrt_size *z = &d->sizes[s];
    if (n->profile)
        for (int i = z->first_run; i < z->first_run + z->nrun; ++i)
            if (n->events[i]) {
                clReleaseEvent(n->events[i]);
                n->events[i] = NULL;
            }
    n->ran[s] = AOTRT_RAN_NONE;
    int r = z->first_run, since = 0;
    /* options.flush_every: hand the device what is enqueued (the input's copy first) every N
     * kernels, so that it starts while the host enqueues the rest; a driver that submits only
     * at a flush or a blocking call otherwise idles until the run's last read */
    if (n->flush_every)
        clFlush(n->queue);
    for (int i = z->first_launch; i < z->first_launch + z->nlaunches; ++i) {
        if (d->launches[i].phase != AOTRT_PHASE_RUN)
            continue;
        int rc = aotrt_enqueue(n, i, n->profile ? &n->events[r] : NULL);
        if (rc)
            return rc;
        ++r;
        if (n->flush_every && ++since == n->flush_every) {
            clFlush(n->queue);
            since = 0;
        }
    }
    n->ran[s] = AOTRT_RAN_ENQUEUED;
    return AOTRT_OK;
}

/* Every run enqueued has ended (or, ok = 0, failed): profile() may read the ended ones. */
static void runs_ended(aotrt_net *n, int ok)
{
    for (int s = 0; s < n->desc->nsizes; ++s)
        if (n->ran[s] == AOTRT_RAN_ENQUEUED)
            n->ran[s] = ok ? AOTRT_RAN_DONE : AOTRT_RAN_NONE;
}

static void forget_pending(aotrt_net *n)
{
    if (n->done)
        clReleaseEvent(n->done);
    n->done = NULL;
    n->pending = 0;
}

/* A failure after some commands were enqueued: let them end, so no buffer is left in use. */
static int abandon(aotrt_net *n, int rc)
{
    clFinish(n->queue);
    forget_pending(n);
    runs_ended(n, 0);
    return rc;
}

/* The run just enqueued: ended (`last` NULL: its last read returned, and with it, the queue
 * being in order, every command before) or in flight until wait(), `last` its last command. */
static int enqueued(aotrt_net *n, cl_event last)
{
    forget_pending(n);
    if (!last) {
        runs_ended(n, 1);
        return AOTRT_OK;
    }
    n->done = last;
    n->pending = 1;
    clFlush(n->queue);
    return AOTRT_OK;
}

#define FAIL(n, e, what)                                                                      \
    abandon((n), aotrt_set_error((n), AOTRT_ERR_OPENCL, "%s: %s failed: %s (%d)",            \
                                 (n)->desc->net, (what), aotrt_cl_error_name(e), (int)(e)))

static unsigned char *slot_ptr(aotrt_net *n, int s)
{
    return n->stage_ptr + (size_t)s * n->stage_bytes;
}

/* The staging ring's use by the writes of one run: the write in flight from each slot, and
 * the next slot to take. The inputs of a run go through one ring in turn, so a slot is
 * refilled only once the device has copied what it held. */
typedef struct {
    cl_event ev[AOTRT_STAGE_SLOTS];
    size_t k;
} ring;

/* The writes enqueued: the queue is in order, so the kernels wait for them. */
static void ring_release(ring *g)
{
    for (int s = 0; s < AOTRT_STAGE_SLOTS; ++s)
        if (g->ev[s]) {
            clReleaseEvent(g->ev[s]);
            g->ev[s] = NULL;
        }
}

/* An input through the staging ring: memcpy into a free slot, then a non-blocking write
 * from it, flushed so the copy starts while the next chunk is prepared. */
static int staged_write(aotrt_net *n, ring *g, cl_mem buf, const unsigned char *src,
                        size_t bytes)
{
    cl_int e = CL_SUCCESS;
    for (size_t off = 0; off < bytes && e == CL_SUCCESS; off += n->stage_bytes, ++g->k) {
        int s = (int)(g->k % (size_t)n->stage_slots);
        size_t len = bytes - off < n->stage_bytes ? bytes - off : n->stage_bytes;
        if (g->ev[s]) {
            e = clWaitForEvents(1, &g->ev[s]);
            clReleaseEvent(g->ev[s]);
            g->ev[s] = NULL;
            if (e != CL_SUCCESS)
                break;
        }
        aotrt_pool_copy(n->stage_pool, slot_ptr(n, s), src + off, len);
        e = clEnqueueWriteBuffer(n->queue, buf, CL_FALSE, off, len, slot_ptr(n, s), 0, NULL,
                                 &g->ev[s]);
        if (e == CL_SUCCESS)
            e = clFlush(n->queue);
    }
    if (e == CL_SUCCESS)
        return AOTRT_OK;
    ring_release(g);
    return FAIL(n, e, "the staged input write");
}

/* One piece of the output: `len` bytes at `off` of output buffer `io`, to `host`. */
typedef struct {
    cl_mem buf;
    size_t off, len;
    unsigned char *host;
} piece;

/* The k-th staging-sized piece of the run's outputs (concatenated in order), or 0 past the
 * end. */
static int output_piece(aotrt_net *n, const run_of *r, unsigned char *dst, size_t k, piece *p)
{
    const aotrt_desc *d = n->desc;
    size_t host = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        size_t bytes = out_floats(r, o) * sizeof(float);
        size_t pieces = (bytes + n->stage_bytes - 1) / n->stage_bytes;
        if (k < pieces) {
            p->buf = n->buffers[r->z->outputs[o].buffer];
            p->off = k * n->stage_bytes;
            p->len = bytes - p->off < n->stage_bytes ? bytes - p->off : n->stage_bytes;
            p->host = dst + host + p->off;
            return 1;
        }
        k -= pieces;
        host += bytes;
    }
    return 0;
}

/* The outputs through the staging ring: up to stage_slots reads in flight; as each ends its
 * slot is copied out and takes the next piece. */
static int staged_read(aotrt_net *n, const run_of *r, unsigned char *dst)
{
    cl_event ev[AOTRT_STAGE_SLOTS] = {0};
    piece at[AOTRT_STAGE_SLOTS];
    cl_int e = CL_SUCCESS;
    size_t next = 0;
    for (int s = 0; s < n->stage_slots && e == CL_SUCCESS; ++s) {
        if (!output_piece(n, r, dst, next, &at[s]))
            break;
        ++next;
        e = clEnqueueReadBuffer(n->queue, at[s].buf, CL_FALSE, at[s].off, at[s].len,
                                slot_ptr(n, s), 0, NULL, &ev[s]);
    }
    if (e == CL_SUCCESS)
        e = clFlush(n->queue);
    for (size_t k = 0; e == CL_SUCCESS; ++k) {
        int s = (int)(k % (size_t)n->stage_slots);
        if (!ev[s])
            break;               /* pieces are taken in order: none left */
        e = clWaitForEvents(1, &ev[s]);
        clReleaseEvent(ev[s]);
        ev[s] = NULL;
        if (e != CL_SUCCESS)
            break;
        aotrt_pool_copy(n->stage_pool, at[s].host, slot_ptr(n, s), at[s].len);
        if (output_piece(n, r, dst, next, &at[s])) {
            ++next;
            e = clEnqueueReadBuffer(n->queue, at[s].buf, CL_FALSE, at[s].off, at[s].len,
                                    slot_ptr(n, s), 0, NULL, &ev[s]);
            if (e == CL_SUCCESS)
                e = clFlush(n->queue);
        }
    }
    for (int s = 0; s < n->stage_slots; ++s)
        if (ev[s])
            clReleaseEvent(ev[s]);
    return e == CL_SUCCESS ? AOTRT_OK : FAIL(n, e, "the staged output read");
}

/* Non-staged transfers: an input written from host memory, the outputs read into `output`;
 * `last` receives the event of the last read when not NULL (else the last read blocks). */
static int direct_write(aotrt_net *n, cl_mem buf, const float *src, size_t bytes)
{
    cl_int e = clEnqueueWriteBuffer(n->queue, buf, CL_FALSE, 0, bytes, src, 0, NULL, NULL);
    return e == CL_SUCCESS ? AOTRT_OK : FAIL(n, e, "clEnqueueWriteBuffer of the input");
}

static int direct_read(aotrt_net *n, const run_of *r, float *output, cl_event *last)
{
    const aotrt_desc *d = n->desc;
    size_t off = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        int is_last = o + 1 == d->noutputs;
        cl_int e = clEnqueueReadBuffer(n->queue, n->buffers[r->z->outputs[o].buffer],
                                       is_last && !last ? CL_TRUE : CL_FALSE, 0,
                                       out_floats(r, o) * sizeof(float), output + off, 0, NULL,
                                       is_last && last ? last : NULL);
        if (e != CL_SUCCESS)
            return FAIL(n, e, "clEnqueueReadBuffer of the output");
        off += out_floats(r, o);
    }
    return AOTRT_OK;
}

/* The samples of the size after the run's, in input i's buffer: zeros, so that the size
 * computes on defined input (their outputs are not returned). */
static int pad_input(aotrt_net *n, const run_of *r, int i)
{
    size_t used = in_floats(r, i) * sizeof(float), all = r->z->inputs[i].count * sizeof(float);
    if (used == all)
        return AOTRT_OK;
    const cl_float zero = 0.0f;
    cl_int e = clEnqueueFillBuffer(n->queue, n->buffers[r->z->inputs[i].buffer], &zero,
                                   sizeof zero, used, all - used, 0, NULL, NULL);
    return e == CL_SUCCESS ? AOTRT_OK : FAIL(n, e, "clEnqueueFillBuffer of the input's padding");
}

/* Does [p, p + count) lie in the handle's pinned memory for the inputs (host_buffers)? */
static int pinned_input(const aotrt_net *n, const float *p, size_t count)
{
    if (!n->host_ptr[0])
        return 0;
    /* as addresses: the pointers may belong to different objects */
    uintptr_t base = (uintptr_t)n->host_ptr[0], at = (uintptr_t)p;
    size_t all = aotrt_largest(n->desc)->input_count * sizeof(float);
    return at >= base && at - base <= all && count * sizeof(float) <= all - (at - base);
}

/* One run from and into host memory: blocking (run, run_n: staged through the pinned ring
 * unless given the handle's pinned buffers; returns with the output) or not (run_async,
 * run_async_n: enqueued; wait() ends it). */
static int run_host(aotrt_net *n, const char *call, const run_of *r,
                    const float *const *inputs, const size_t *counts, float *output,
                    size_t output_count, int blocking)
{
    const aotrt_desc *d = n->desc;
    int rc = check_run(n, call, r, inputs, counts, output, output_count);
    if (rc)
        return rc;
    ring g = {{0}, 0};
    for (int i = 0; i < d->ninputs && !rc; ++i) {
        cl_mem buf = n->buffers[r->z->inputs[i].buffer];
        size_t bytes = in_floats(r, i) * sizeof(float);
        int stage = blocking && n->stage_ptr && !pinned_input(n, inputs[i], in_floats(r, i));
        rc = stage ? staged_write(n, &g, buf, (const unsigned char *)inputs[i], bytes)
                   : direct_write(n, buf, inputs[i], bytes);
        if (!rc)
            rc = pad_input(n, r, i);
    }
    ring_release(&g);
    if (rc)
        return rc;
    if ((rc = enqueue_kernels(n, r->size)))
        return abandon(n, rc);
    int stage_out = blocking && n->stage_ptr && output != n->host_ptr[1];
    cl_event last = NULL;
    rc = stage_out ? staged_read(n, r, (unsigned char *)output)
                   : direct_read(n, r, output, blocking ? NULL : &last);
    return rc ? rc : enqueued(n, last);
}

/* What every run call checks first, and the run it makes: the net, the inputs (`twin` NULL
 * for an _inputs call, which takes `n_inputs` of them, else the _inputs call a network of
 * several inputs needs instead), then the largest size with every sample (by_n 0) or the
 * size that serves `samples`. */
static int start_call(aotrt_net *n, const char *call, const char *twin, int by_n,
                      size_t samples, const void *inputs, size_t n_inputs, run_of *r)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s: net is NULL", call);
    int rc = twin ? one_input(n, call, twin) : check_ninputs(n, call, inputs, n_inputs);
    if (rc)
        return rc;
    *r = whole(n);
    return by_n ? pick(n, call, samples, r) : AOTRT_OK;
}

/* The calls from host memory: run and run_async (by_n 0: the largest size, every sample),
 * run_n and run_async_n (`samples` of them), and their _inputs twins; `twin` as for
 * start_call. */
static int host_call(aotrt_net *n, const char *call, const char *twin, int by_n,
                     size_t samples, const float *const *inputs, const size_t *counts,
                     size_t n_inputs, float *output, size_t output_count, int blocking)
{
    run_of r;
    int rc = start_call(n, call, twin, by_n, samples, inputs, n_inputs, &r);
    return rc ? rc : run_host(n, call, &r, inputs, counts, output, output_count, blocking);
}

int aotrt_run(aotrt_net *n, const float *input, size_t input_count, float *output,
              size_t output_count)
{
    return host_call(n, "run", "run_inputs", 0, 0, &input, &input_count, 1, output,
                     output_count, 1);
}

int aotrt_run_async(aotrt_net *n, const float *input, size_t input_count, float *output,
                    size_t output_count)
{
    return host_call(n, "run_async", "run_async_inputs", 0, 0, &input, &input_count, 1, output,
                     output_count, 0);
}

int aotrt_run_n(aotrt_net *n, size_t samples, const float *input, size_t input_count,
                float *output, size_t output_count)
{
    return host_call(n, "run_n", "run_inputs_n", 1, samples, &input, &input_count, 1, output,
                     output_count, 1);
}

int aotrt_run_async_n(aotrt_net *n, size_t samples, const float *input, size_t input_count,
                      float *output, size_t output_count)
{
    return host_call(n, "run_async_n", "run_async_inputs_n", 1, samples, &input, &input_count,
                     1, output, output_count, 0);
}

int aotrt_run_inputs(aotrt_net *n, const float *const inputs[], const size_t counts[],
                     size_t n_inputs, float *output, size_t output_count)
{
    return host_call(n, "run_inputs", NULL, 0, 0, inputs, counts, n_inputs, output,
                     output_count, 1);
}

int aotrt_run_async_inputs(aotrt_net *n, const float *const inputs[], const size_t counts[],
                           size_t n_inputs, float *output, size_t output_count)
{
    return host_call(n, "run_async_inputs", NULL, 0, 0, inputs, counts, n_inputs, output,
                     output_count, 0);
}

int aotrt_run_inputs_n(aotrt_net *n, size_t samples, const float *const inputs[],
                       const size_t counts[], size_t n_inputs, float *output,
                       size_t output_count)
{
    return host_call(n, "run_inputs_n", NULL, 1, samples, inputs, counts, n_inputs, output,
                     output_count, 1);
}

int aotrt_run_async_inputs_n(aotrt_net *n, size_t samples, const float *const inputs[],
                             const size_t counts[], size_t n_inputs, float *output,
                             size_t output_count)
{
    return host_call(n, "run_async_inputs_n", NULL, 1, samples, inputs, counts, n_inputs,
                     output, output_count, 0);
}

/* A buffer of the application's: of the handle's context and at least `bytes` long. */
static int check_mem(aotrt_net *n, const char *call, cl_mem m, const char *what, size_t bytes)
{
    const aotrt_desc *d = n->desc;
    if (!m)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s is NULL", d->net, call, what);
    cl_context ctx = NULL;
    size_t size = 0;
    cl_int e = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
    if (e == CL_SUCCESS)
        e = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (e != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s is not a buffer "
                               "(clGetMemObjectInfo: %s)", d->net, call, what,
                               aotrt_cl_error_name(e));
    if (ctx != n->ctx)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s belongs to another "
                               "OpenCL context than the network's", d->net, call, what);
    if (size < bytes)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s holds %zu bytes, "
                               "the network's %s needs %zu (%zu floats)", d->net, call, what,
                               size, what, bytes, bytes / sizeof(float));
    return AOTRT_OK;
}

/* One run from and into the application's buffers: device copies of the run's samples. */
static int run_mem(aotrt_net *n, const char *call, const run_of *r, const cl_mem *inputs,
                   cl_mem output)
{
    const aotrt_desc *d = n->desc;
    char what[200];
    int rc = AOTRT_OK;
    for (int i = 0; i < d->ninputs && !rc; ++i)
        rc = check_mem(n, call, inputs[i], input_label(d, i, what, sizeof what),
                       in_floats(r, i) * sizeof(float));
    if (!rc)
        rc = check_mem(n, call, output, "output", out_total(r) * sizeof(float));
    if (rc)
        return rc;
    if (!n->params_set)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_%s: parameters are not set; "
                               "call set_params or load_params first", d->net, call);
    cl_int e;
    for (int i = 0; i < d->ninputs; ++i) {
        e = clEnqueueCopyBuffer(n->queue, inputs[i], n->buffers[r->z->inputs[i].buffer], 0, 0,
                                in_floats(r, i) * sizeof(float), 0, NULL, NULL);
        if (e != CL_SUCCESS)
            return FAIL(n, e, "clEnqueueCopyBuffer of the input");
        if ((rc = pad_input(n, r, i)))
            return rc;
    }
    if ((rc = enqueue_kernels(n, r->size)))
        return abandon(n, rc);
    cl_event last = NULL;
    size_t off = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        size_t bytes = out_floats(r, o) * sizeof(float);
        e = clEnqueueCopyBuffer(n->queue, n->buffers[r->z->outputs[o].buffer], output, 0, off,
                                bytes, 0, NULL, o + 1 == d->noutputs ? &last : NULL);
        if (e != CL_SUCCESS)
            return FAIL(n, e, "clEnqueueCopyBuffer of the output");
        off += bytes;
    }
    return enqueued(n, last);
}

/* The calls from the application's buffers: run_buffers (by_n 0: the largest size) and
 * run_buffers_n; `twin` as for host_call. */
static int mem_call(aotrt_net *n, const char *call, const char *twin, int by_n, size_t samples,
                    const cl_mem *inputs, size_t n_inputs, cl_mem output)
{
    run_of r;
    int rc = start_call(n, call, twin, by_n, samples, inputs, n_inputs, &r);
    return rc ? rc : run_mem(n, call, &r, inputs, output);
}

int aotrt_run_buffers(aotrt_net *n, cl_mem input, cl_mem output)
{
    return mem_call(n, "run_buffers", "run_buffers_inputs", 0, 0, &input, 1, output);
}

int aotrt_run_buffers_n(aotrt_net *n, size_t samples, cl_mem input, cl_mem output)
{
    return mem_call(n, "run_buffers_n", "run_buffers_inputs_n", 1, samples, &input, 1, output);
}

int aotrt_run_buffers_inputs(aotrt_net *n, const cl_mem inputs[], size_t n_inputs,
                             cl_mem output)
{
    return mem_call(n, "run_buffers_inputs", NULL, 0, 0, inputs, n_inputs, output);
}

int aotrt_run_buffers_inputs_n(aotrt_net *n, size_t samples, const cl_mem inputs[],
                               size_t n_inputs, cl_mem output)
{
    return mem_call(n, "run_buffers_inputs_n", NULL, 1, samples, inputs, n_inputs, output);
}

int aotrt_wait(aotrt_net *n)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "wait: net is NULL");
    if (!n->pending)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_wait: no run in flight; call run_async "
                               "or run_buffers first", n->desc->net);
    cl_int e = clWaitForEvents(1, &n->done);
    if (e == CL_SUCCESS) {
        cl_int status = CL_COMPLETE;
        clGetEventInfo(n->done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
        if (status < 0)
            e = status;
    }
    forget_pending(n);
    runs_ended(n, e == CL_SUCCESS);
    if (e != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s_wait: the run failed on the device: %s "
                               "(%d)", n->desc->net, aotrt_cl_error_name(e), (int)e);
    return AOTRT_OK;
}

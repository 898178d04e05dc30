/* Running the network: run() (blocking, staged through pinned memory), run_async() and
 * run_buffers() (enqueue and return), wait().
 *
 * Every run is: the input into the network's input buffer, the run-phase launches in order,
 * the outputs out of their buffers, on the handle's in-order queue, with no host
 * synchronisation in between.
 *
 * run() copies pageable input and output memory through a ring of pinned chunks (the staging
 * ring, made by create): the host copies chunk k into a free slot while the device copies
 * chunk k-1 out of its slot by DMA, and likewise for the output the other way round. A driver
 * that stages pageable memory itself (NVIDIA's) does the two copies one after the other. The
 * handle's own pinned buffers (host_buffers) are copied directly, as they are pinned already.
 */
#include "aotconv_rt.h"

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

/* The staging ring: slots of min(chunk, largest transfer) bytes, as many as the largest
 * transfer fills, at most AOTRT_STAGE_SLOTS. */
int aotrt_stage_setup(aotrt_net *n, const aotrt_options *o)
{
    const aotrt_desc *d = n->desc;
    long chunk = o && o->stage_bytes ? o->stage_bytes : AOTRT_STAGE_BYTES;
    if (chunk < 0)
        return AOTRT_OK;
    size_t most = d->input.count > d->output_count ? d->input.count : d->output_count;
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
    return AOTRT_OK;
}

static int check_run(aotrt_net *n, const char *call, const float *input, size_t input_count,
                     float *output, size_t output_count)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "%s: net is NULL", call);
    const aotrt_desc *d = n->desc;
    if (!input || !output)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_%s: %s is NULL", d->net, call,
                               input ? "output" : "input");
    if (input_count != d->input.count)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_%s: input has %zu floats, expected %zu", d->net, call,
                               input_count, d->input.count);
    if (output_count != d->output_count)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_%s: output has room for %zu floats, expected %zu", d->net,
                               call, output_count, d->output_count);
    if (!n->params_set)
        return aotrt_set_error(n, AOTRT_ERR_STATE,
                               "%s_%s: parameters are not set; call set_params or load_params "
                               "first", d->net, call);
    return AOTRT_OK;
}

/* The run-phase launches, each with its profiling event when profiling is on. */
static int enqueue_kernels(aotrt_net *n)
{
    const aotrt_desc *d = n->desc;
    if (n->profile)
        for (int i = 0; i < d->nrun; ++i)
            if (n->events[i]) {
                clReleaseEvent(n->events[i]);
                n->events[i] = NULL;
            }
    n->ran = 0;
    int r = 0;
    for (int i = 0; i < d->nlaunches; ++i) {
        if (d->launches[i].phase != AOTRT_PHASE_RUN)
            continue;
        int rc = aotrt_enqueue(n, i, n->profile ? &n->events[r] : NULL);
        if (rc)
            return rc;
        ++r;
    }
    return AOTRT_OK;
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
    return rc;
}

#define FAIL(n, e, what)                                                                      \
    abandon((n), aotrt_set_error((n), AOTRT_ERR_OPENCL, "%s: %s failed: %s (%d)",            \
                                 (n)->desc->net, (what), aotrt_cl_error_name(e), (int)(e)))

static unsigned char *slot_ptr(aotrt_net *n, int s)
{
    return n->stage_ptr + (size_t)s * n->stage_bytes;
}

/* The input through the staging ring: memcpy into a free slot, then a non-blocking write
 * from it, flushed so the copy starts while the next chunk is prepared. */
static int staged_write(aotrt_net *n, cl_mem buf, const unsigned char *src, size_t bytes)
{
    cl_event ev[AOTRT_STAGE_SLOTS] = {0};
    cl_int e = CL_SUCCESS;
    size_t k = 0;
    for (size_t off = 0; off < bytes && e == CL_SUCCESS; off += n->stage_bytes, ++k) {
        int s = (int)(k % (size_t)n->stage_slots);
        size_t len = bytes - off < n->stage_bytes ? bytes - off : n->stage_bytes;
        if (ev[s]) {
            e = clWaitForEvents(1, &ev[s]);
            clReleaseEvent(ev[s]);
            ev[s] = NULL;
            if (e != CL_SUCCESS)
                break;
        }
        memcpy(slot_ptr(n, s), src + off, len);
        e = clEnqueueWriteBuffer(n->queue, buf, CL_FALSE, off, len, slot_ptr(n, s), 0, NULL,
                                 &ev[s]);
        if (e == CL_SUCCESS)
            e = clFlush(n->queue);
    }
    for (int s = 0; s < n->stage_slots; ++s)
        if (ev[s])
            clReleaseEvent(ev[s]);   /* the queue is in order: the kernels wait for them */
    return e == CL_SUCCESS ? AOTRT_OK : FAIL(n, e, "the staged input write");
}

/* One piece of the output: `len` bytes at `off` of output buffer `io`, to `host`. */
typedef struct {
    cl_mem buf;
    size_t off, len;
    unsigned char *host;
} piece;

/* The k-th staging-sized piece of the outputs (concatenated in order), or 0 past the end. */
static int output_piece(aotrt_net *n, unsigned char *dst, size_t k, piece *p)
{
    const aotrt_desc *d = n->desc;
    size_t host = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        size_t bytes = d->outputs[o].count * sizeof(float);
        size_t pieces = (bytes + n->stage_bytes - 1) / n->stage_bytes;
        if (k < pieces) {
            p->buf = n->buffers[d->outputs[o].buffer];
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
static int staged_read(aotrt_net *n, unsigned char *dst)
{
    cl_event ev[AOTRT_STAGE_SLOTS] = {0};
    piece at[AOTRT_STAGE_SLOTS];
    cl_int e = CL_SUCCESS;
    size_t next = 0;
    for (int s = 0; s < n->stage_slots && e == CL_SUCCESS; ++s) {
        if (!output_piece(n, dst, next, &at[s]))
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
        memcpy(at[s].host, slot_ptr(n, s), at[s].len);
        if (output_piece(n, dst, next, &at[s])) {
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

/* Non-staged transfers: the input written from `input`, the outputs read into `output`;
 * `last` receives the event of the last read when not NULL (else the last read blocks). */
static int direct_write(aotrt_net *n, const float *input)
{
    const aotrt_desc *d = n->desc;
    cl_int e = clEnqueueWriteBuffer(n->queue, n->buffers[d->input.buffer], CL_FALSE, 0,
                                    d->input.count * sizeof(float), input, 0, NULL, NULL);
    return e == CL_SUCCESS ? AOTRT_OK : FAIL(n, e, "clEnqueueWriteBuffer of the input");
}

static int direct_read(aotrt_net *n, float *output, cl_event *last)
{
    const aotrt_desc *d = n->desc;
    size_t off = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        const aotrt_io *io = &d->outputs[o];
        int is_last = o + 1 == d->noutputs;
        cl_int e = clEnqueueReadBuffer(n->queue, n->buffers[io->buffer],
                                       is_last && !last ? CL_TRUE : CL_FALSE, 0,
                                       io->count * sizeof(float), output + off, 0, NULL,
                                       is_last && last ? last : NULL);
        if (e != CL_SUCCESS)
            return FAIL(n, e, "clEnqueueReadBuffer of the output");
        off += io->count;
    }
    return AOTRT_OK;
}

int aotrt_run(aotrt_net *n, const float *input, size_t input_count, float *output,
              size_t output_count)
{
    int rc = check_run(n, "run", input, input_count, output, output_count);
    if (rc)
        return rc;
    const aotrt_desc *d = n->desc;
    /* the handle's pinned buffers need no staging; nor does a run with staging off */
    int stage_in = n->stage_ptr && input != n->host_ptr[0];
    int stage_out = n->stage_ptr && output != n->host_ptr[1];
    rc = stage_in ? staged_write(n, n->buffers[d->input.buffer], (const unsigned char *)input,
                                 d->input.count * sizeof(float))
                  : direct_write(n, input);
    if (rc)
        return rc;
    if ((rc = enqueue_kernels(n)))
        return abandon(n, rc);
    rc = stage_out ? staged_read(n, (unsigned char *)output) : direct_read(n, output, NULL);
    if (rc)
        return rc;
    forget_pending(n);   /* the last read has ended, and with it (in order) all before it */
    n->ran = 1;
    return AOTRT_OK;
}

int aotrt_run_async(aotrt_net *n, const float *input, size_t input_count, float *output,
                    size_t output_count)
{
    int rc = check_run(n, "run_async", input, input_count, output, output_count);
    if (rc)
        return rc;
    if ((rc = direct_write(n, input)))
        return rc;
    if ((rc = enqueue_kernels(n)))
        return abandon(n, rc);
    cl_event last = NULL;
    if ((rc = direct_read(n, output, &last)))
        return rc;
    forget_pending(n);
    n->done = last;
    n->pending = 1;
    clFlush(n->queue);
    return AOTRT_OK;
}

/* A buffer of the application's: of the handle's context and at least `bytes` long. */
static int check_mem(aotrt_net *n, cl_mem m, const char *what, size_t bytes)
{
    const aotrt_desc *d = n->desc;
    if (!m)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_run_buffers: %s is NULL", d->net, what);
    cl_context ctx = NULL;
    size_t size = 0;
    cl_int e = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
    if (e == CL_SUCCESS)
        e = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (e != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_run_buffers: %s is not a buffer "
                               "(clGetMemObjectInfo: %s)", d->net, what, aotrt_cl_error_name(e));
    if (ctx != n->ctx)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_run_buffers: %s belongs to another "
                               "OpenCL context than the network's", d->net, what);
    if (size < bytes)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT, "%s_run_buffers: %s holds %zu bytes, "
                               "the network's %s needs %zu (%zu floats)", d->net, what, size,
                               what, bytes, bytes / sizeof(float));
    return AOTRT_OK;
}

int aotrt_run_buffers(aotrt_net *n, cl_mem input, cl_mem output)
{
    if (!n)
        return aotrt_set_error(NULL, AOTRT_ERR_ARGUMENT, "run_buffers: net is NULL");
    const aotrt_desc *d = n->desc;
    int rc = check_mem(n, input, "input", d->input.count * sizeof(float));
    if (!rc)
        rc = check_mem(n, output, "output", d->output_count * sizeof(float));
    if (rc)
        return rc;
    if (!n->params_set)
        return aotrt_set_error(n, AOTRT_ERR_STATE, "%s_run_buffers: parameters are not set; "
                               "call set_params or load_params first", d->net);
    cl_int e = clEnqueueCopyBuffer(n->queue, input, n->buffers[d->input.buffer], 0, 0,
                                   d->input.count * sizeof(float), 0, NULL, NULL);
    if (e != CL_SUCCESS)
        return FAIL(n, e, "clEnqueueCopyBuffer of the input");
    if ((rc = enqueue_kernels(n)))
        return abandon(n, rc);
    cl_event last = NULL;
    size_t off = 0;
    for (int o = 0; o < d->noutputs; ++o) {
        const aotrt_io *io = &d->outputs[o];
        e = clEnqueueCopyBuffer(n->queue, n->buffers[io->buffer], output, 0, off,
                                io->count * sizeof(float), 0, NULL,
                                o + 1 == d->noutputs ? &last : NULL);
        if (e != CL_SUCCESS)
            return FAIL(n, e, "clEnqueueCopyBuffer of the output");
        off += io->count * sizeof(float);
    }
    forget_pending(n);
    n->done = last;
    n->pending = 1;
    clFlush(n->queue);
    return AOTRT_OK;
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
    if (e != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_OPENCL, "%s_wait: the run failed on the device: %s "
                               "(%d)", n->desc->net, aotrt_cl_error_name(e), (int)e);
    n->ran = 1;
    return AOTRT_OK;
}

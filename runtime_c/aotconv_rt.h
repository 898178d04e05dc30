/* aotconv runtime: the hand-written C that every emitted library is built with.
 *
 * A generated <net>.c describes the network as constant tables (programs, buffers, parameter
 * tensors, kernel launches with their arguments and NDRanges); this runtime turns them into
 * OpenCL objects once in create() and replays the launch table in run().
 *
 * Every symbol here is renamed per network (AOTRT_NS, set by the generated build.ninja), so
 * two emitted libraries can be linked into one application without clashes.
 */
#ifndef AOTCONV_RT_H
#define AOTCONV_RT_H

#define CL_TARGET_OPENCL_VERSION 120
#ifdef __APPLE__
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif
#include <stddef.h>
#include <stdint.h>

#ifndef AOTRT_NS
#error "AOTRT_NS must name the network (the generated build.ninja sets it)"
#endif
#define AOTRT_CAT2(a, b) aotrt_##a##_##b
#define AOTRT_CAT(a, b) AOTRT_CAT2(a, b)
#define AOTRT_SYM(name) AOTRT_CAT(AOTRT_NS, name)

#define aotrt_create AOTRT_SYM(create)
#define aotrt_create_with_queue AOTRT_SYM(create_with_queue)
#define aotrt_set_params AOTRT_SYM(set_params)
#define aotrt_load_params AOTRT_SYM(load_params)
#define aotrt_run AOTRT_SYM(run)
#define aotrt_run_async AOTRT_SYM(run_async)
#define aotrt_run_buffers AOTRT_SYM(run_buffers)
#define aotrt_run_n AOTRT_SYM(run_n)
#define aotrt_run_async_n AOTRT_SYM(run_async_n)
#define aotrt_run_buffers_n AOTRT_SYM(run_buffers_n)
#define aotrt_run_inputs AOTRT_SYM(run_inputs)
#define aotrt_run_async_inputs AOTRT_SYM(run_async_inputs)
#define aotrt_run_buffers_inputs AOTRT_SYM(run_buffers_inputs)
#define aotrt_run_inputs_n AOTRT_SYM(run_inputs_n)
#define aotrt_run_async_inputs_n AOTRT_SYM(run_async_inputs_n)
#define aotrt_run_buffers_inputs_n AOTRT_SYM(run_buffers_inputs_n)
#define aotrt_wait AOTRT_SYM(wait)
#define aotrt_profile AOTRT_SYM(profile)
#define aotrt_host_buffers AOTRT_SYM(host_buffers)
#define aotrt_program_source AOTRT_SYM(program_source)
#define aotrt_memory AOTRT_SYM(memory)
#define aotrt_last_error AOTRT_SYM(last_error)
#define aotrt_destroy AOTRT_SYM(destroy)
#define aotrt_cl_error_name AOTRT_SYM(cl_error_name)
#define aotrt_set_error AOTRT_SYM(set_error)
#define aotrt_pick_device AOTRT_SYM(pick_device)
#define aotrt_device_accepted AOTRT_SYM(device_accepted)
#define aotrt_device_label AOTRT_SYM(device_label)
#define aotrt_match AOTRT_SYM(match)
#define aotrt_global_error AOTRT_SYM(global_error)
#define aotrt_shown AOTRT_SYM(shown)
#define aotrt_build_programs AOTRT_SYM(build_programs)
#define aotrt_sm90a_rewrite AOTRT_SYM(sm90a_rewrite)
#define aotrt_enqueue AOTRT_SYM(enqueue)
#define aotrt_stage_setup AOTRT_SYM(stage_setup)
#define aotrt_pool_new AOTRT_SYM(pool_new)
#define aotrt_pool_threads AOTRT_SYM(pool_threads)
#define aotrt_pool_copy AOTRT_SYM(pool_copy)
#define aotrt_pool_free AOTRT_SYM(pool_free)
#define aotrt_cpu_count AOTRT_SYM(cpu_count)
#define aotrt_halves_from_floats AOTRT_SYM(halves_from_floats)
#define aotrt_now_ms AOTRT_SYM(now_ms)
#define aotrt_trace_begin AOTRT_SYM(trace_begin)
#define aotrt_trace_note AOTRT_SYM(trace_note)
#define aotrt_trace_step AOTRT_SYM(trace_step)
#define aotrt_trace_end AOTRT_SYM(trace_end)

/* Error codes, the same for every emitted library (documented in the generated header). */
enum {
    AOTRT_OK = 0,
    AOTRT_ERR_ARGUMENT = -1,   /* NULL handle or buffer, wrong element count */
    AOTRT_ERR_NO_DEVICE = -2,  /* no OpenCL device matches the target (or AOTCONV_DEVICE) */
    AOTRT_ERR_BUILD = -3,      /* an OpenCL program failed to build; the log is in the message */
    AOTRT_ERR_OPENCL = -4,     /* an OpenCL call failed; the message names the call and error */
    AOTRT_ERR_MEMORY = -5,     /* host allocation failed */
    AOTRT_ERR_IO = -6,         /* a parameter file could not be read or has the wrong size */
    AOTRT_ERR_STATE = -7       /* run before set_params, or the handle is unusable */
};

enum { AOTRT_BUF_ACT, AOTRT_BUF_PARAM, AOTRT_BUF_EXTRA, AOTRT_BUF_SCRATCH };
enum { AOTRT_ARG_BUF, AOTRT_ARG_INT, AOTRT_ARG_FLOAT };
enum { AOTRT_PHASE_SETUP, AOTRT_PHASE_RUN };
/* A size's last run, for profile(): none, enqueued (its events are being filled), completed. */
enum { AOTRT_RAN_NONE, AOTRT_RAN_ENQUEUED, AOTRT_RAN_DONE };

typedef struct {
    const char *layer;        /* the layer whose kernels it holds, for messages */
    const char *source;       /* embedded OpenCL C (the same text as kernels/<layer>.cl) */
    const char *prologue;     /* in a joined program: before the source (helper renames) */
    const char *epilogue;     /* after it (#undef of its macros and renames) */
    int group;                /* the joined program it is part of (0 when not joined) */
} aotrt_program;

/* A device binary (CL_PROGRAM_BINARIES) built at build time, embedded beside the source. */
typedef struct {
    const unsigned char *data;
    size_t size;              /* 0: none; that program is compiled from its source */
} aotrt_binary;

typedef struct {
    const char *name;
    size_t bytes;
    int kind;
} aotrt_buffer;

typedef struct {
    int kind;                 /* AOTRT_ARG_* */
    int buffer;               /* index into the buffer table when kind == AOTRT_ARG_BUF */
    int i;
    float f;
} aotrt_arg;

typedef struct {
    const char *layer;
    const char *kernel;
    int program;
    int phase;
    int nargs;
    const aotrt_arg *args;
    unsigned dims;
    size_t global[3];
    size_t local[3];          /* all zero: let the driver choose */
} aotrt_launch;

typedef struct {
    const char *name;         /* "<layer>.<tensor>" */
    int buffer;
    size_t offset;            /* in floats, into the flat parameter array */
    size_t count;
} aotrt_param;

/* A batchnorm folded into the layer before it: its tensors' offsets in the flat parameters. */
typedef struct {
    const char *name;
    size_t gamma, beta, mean, var;
    double eps;
} aotrt_bn;

/* A conv or dense layer whose weight and bias set_params computes from the user's parameters
 * and the batchnorms folded into it (in order): per output channel c, in double,
 * s = prod gamma[c] / sqrt(var[c] + eps), weight' = weight * s, and the bias (0 without one)
 * taken through each batchnorm, b = (b - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c]. */
typedef struct {
    const char *layer;
    int weight_buffer;        /* the folded weight and bias, as the kernels read them */
    int bias_buffer;
    size_t channels;
    size_t per_channel;       /* weights of one output channel, contiguous */
    size_t weight;            /* offset of the user's weight */
    int has_bias;
    size_t bias;              /* offset of the user's bias, when has_bias */
    int nbn;
    const aotrt_bn *bn;
} aotrt_fold;

typedef struct {
    int buffer;
    size_t count;             /* floats */
} aotrt_io;

/* One batch size of the library: its input and output buffers and its rows of the launch
 * table. The sizes share the buffers (aotconv/batches.py) and run one at a time. */
typedef struct {
    size_t batch;
    const aotrt_io *inputs;   /* desc.ninputs of them, in input order, batch samples each */
    size_t input_count;       /* their sum */
    const aotrt_io *outputs;  /* desc.noutputs of them, batch samples each */
    size_t output_count;      /* their sum */
    int first_launch;         /* its launches: [first_launch, first_launch + nlaunches) */
    int nlaunches;
    int first_run;            /* its profile() entries: [first_run, first_run + nrun) */
    int nrun;
} aotrt_size;

typedef struct {
    const char *net;
    const char *target;
    const char *vendor_pattern;   /* '|' alternatives, '.*' wildcards, case-insensitive */
    const char *device_pattern;
    const char *build_options;
    int nprograms;
    const aotrt_program *programs;
    int joined;                   /* 0: one program per layer; k >= 1: the layers' programs are
                                     made as k joined programs, each of a run of layers
                                     (aotrt_program.group; verified at build time) */
    int nbinaries;                /* 0, `joined` (one per joined program) or nprograms */
    const aotrt_binary *binaries;
    const char *binary_device;    /* CL_DEVICE_NAME the binaries were built on */
    const char *binary_driver;    /* and its CL_DRIVER_VERSION */
    const char *binary_note;      /* what the build embedded, or why no binaries */
    int nbuffers;
    const aotrt_buffer *buffers;
    int nparams;
    const aotrt_param *params;
    size_t param_count;
    int nfolds;
    const aotrt_fold *folds;
    int nlaunches;
    const aotrt_launch *launches;
    int nrun;                     /* run-phase launches of all sizes (profile entries) */
    int ninputs;                  /* 1, or the several inputs of the network, in order */
    const char *const *input_names;
    int noutputs;
    int nsizes;                   /* 1, or the batch sizes of a ranged library */
    const aotrt_size *sizes;      /* in increasing batch order; run() runs the last */
    int half_params;              /* 1: the parameter buffers hold half (an fp16 build), which
                                     set_params rounds the floats to; 0 (FP32 builds): float */
} aotrt_desc;

/* The size run(), run_async() and run_buffers() run, and that host_buffers() and the staging
 * ring are made for. */
static inline const aotrt_size *aotrt_largest(const aotrt_desc *d)
{
    return &d->sizes[d->nsizes - 1];
}

typedef struct {
    int platform_index;       /* -1: choose by the target's patterns (or AOTCONV_DEVICE) */
    int device_index;
    const char *device_name;  /* substring of "vendor platform device" to match, or NULL */
    int profile;              /* 1: keep per-kernel events for profile(); default 0 (off: a
                                 profiling queue widens the gap between kernels) */
    int source_only;          /* 1: compile the embedded source even where a binary is there */
    long stage_bytes;         /* run()'s staging chunk: 0 default, < 0 no staging */
    int stage_threads;        /* threads copying into and out of the staging ring: 0 default
                                 (the CPUs, at most AOTRT_STAGE_THREADS_DEFAULT), 1 the caller
                                 alone, above AOTRT_STAGE_THREADS_MAX that maximum, < 0 an
                                 error */
    int flush_every;          /* run launches between clFlush calls: 0 default (none: the
                                 driver submits when it sees fit), N > 0 a flush after the
                                 input and every N kernels, -1 none, other values an error */
} aotrt_options;

/* run()'s staging: pageable input and output go through a ring of pinned chunks, so that the
 * memcpy of one chunk overlaps the DMA of the one before (docs/design-choices.md). */
#define AOTRT_STAGE_BYTES (4L << 20)   /* best of 1-16 MiB for a 75 MiB input on an H100 */
#define AOTRT_STAGE_SLOTS 4
/* The threads that copy a chunk into its slot (and out of it): the caller and a pool made by
 * create (rt_pool.c), taking pieces of at least AOTRT_STAGE_PART bytes (a smaller piece costs
 * more to hand over than to copy), no more threads than a slot has pieces. */
#define AOTRT_STAGE_THREADS_DEFAULT 8  /* one thread copies ~7-8 GB/s; 8 reach the DMA's rate */
#define AOTRT_STAGE_THREADS_MAX 64
#define AOTRT_STAGE_PART (256L << 10)

/* A pool of threads for large memcpy: aotrt_pool_copy cuts a copy into pieces, which the
 * caller and the pool's threads claim until none is left, and returns when all are there. */
typedef struct aotrt_pool aotrt_pool;

typedef struct {
    size_t activation_bytes, parameter_bytes, variant_bytes, scratch_bytes, device_bytes;
    size_t pinned_bytes;
} aotrt_memory_info;

/* One call's step trace (rt_trace.c): with AOTCONV_TRACE set, create(), set_params() and
 * load_params() each write one line to stderr with the time of every step. */
typedef struct {
    int on;
    const char *net, *call;
    double start, mark;       /* ms, CLOCK_MONOTONIC: the call's start, the last step's end */
    size_t len;
    char line[1024];          /* the steps so far */
    char note[256];           /* details of the step under way, shown after it */
} aotrt_trace;

typedef struct aotrt_net {
    const aotrt_desc *desc;
    cl_context ctx;           /* the handle's own, or the application's (retained) */
    cl_command_queue queue;
    cl_device_id device;
    int app_queue;            /* created on the application's context and queue */
    cl_program *programs;     /* nprograms slots; only the first `joined` when joined */
    int joined;               /* how many joined programs were made (0: one per layer) */
    int from_binary, from_source;
    char program_why[640];    /* how the programs were made (program_source) */
    int profile_requested;
    cl_kernel *kernels;       /* one per launch */
    cl_mem *buffers;
    cl_event *events;         /* one per run launch, from the last run */
    int profile;
    int params_set;
    unsigned char *ran;       /* per size: AOTRT_RAN_* (profile() reads completed sizes) */
    int pending;              /* run_async / run_buffers enqueued, not yet waited for */
    cl_event done;            /* the last command of the run in flight */
    cl_mem host_mem[2];       /* pinned host memory for the inputs (one after another) and the
                                 outputs, on request */
    float *host_ptr[2];       /* their mappings, valid until destroy */
    size_t stage_bytes;       /* bytes per staging slot; 0: run() does not stage */
    int stage_slots;
    cl_mem stage_mem;         /* the staging ring: stage_slots x stage_bytes, pinned, mapped */
    unsigned char *stage_ptr;
    aotrt_pool *stage_pool;   /* the threads that copy beside the caller; NULL: the caller alone */
    int flush_every;          /* options.flush_every resolved: 0 no flushes, N a flush every N */
    aotrt_trace *trace;       /* create()'s trace while it runs (rt_program.c notes in it) */
    char error[2048];
} aotrt_net;

int aotrt_create(const aotrt_desc *d, aotrt_net **out, const aotrt_options *opts);
int aotrt_create_with_queue(const aotrt_desc *d, aotrt_net **out, cl_context context,
                            cl_device_id device, cl_command_queue queue,
                            const aotrt_options *opts);
int aotrt_set_params(aotrt_net *n, const float *params, size_t count);
int aotrt_load_params(aotrt_net *n, const char *path);
int aotrt_run(aotrt_net *n, const float *input, size_t input_count, float *output,
              size_t output_count);
int aotrt_run_async(aotrt_net *n, const float *input, size_t input_count, float *output,
                    size_t output_count);
int aotrt_run_buffers(aotrt_net *n, cl_mem input, cl_mem output);
/* `samples` (1 to the largest batch size) through the smallest size that holds them: the
 * input's other samples are zeros, only `samples` outputs are returned. */
int aotrt_run_n(aotrt_net *n, size_t samples, const float *input, size_t input_count,
                float *output, size_t output_count);
int aotrt_run_async_n(aotrt_net *n, size_t samples, const float *input, size_t input_count,
                      float *output, size_t output_count);
int aotrt_run_buffers_n(aotrt_net *n, size_t samples, cl_mem input, cl_mem output);
/* The same calls with every input of the network: inputs[i] of counts[i] floats (cl_mem
 * inputs[i]), n_inputs the network's number of inputs; the calls above take a network of one
 * input only. */
int aotrt_run_inputs(aotrt_net *n, const float *const inputs[], const size_t counts[],
                     size_t n_inputs, float *output, size_t output_count);
int aotrt_run_async_inputs(aotrt_net *n, const float *const inputs[], const size_t counts[],
                           size_t n_inputs, float *output, size_t output_count);
int aotrt_run_buffers_inputs(aotrt_net *n, const cl_mem inputs[], size_t n_inputs,
                             cl_mem output);
int aotrt_run_inputs_n(aotrt_net *n, size_t samples, const float *const inputs[],
                       const size_t counts[], size_t n_inputs, float *output,
                       size_t output_count);
int aotrt_run_async_inputs_n(aotrt_net *n, size_t samples, const float *const inputs[],
                             const size_t counts[], size_t n_inputs, float *output,
                             size_t output_count);
int aotrt_run_buffers_inputs_n(aotrt_net *n, size_t samples, const cl_mem inputs[],
                               size_t n_inputs, cl_mem output);
int aotrt_wait(aotrt_net *n);
int aotrt_profile(aotrt_net *n, double *ms, size_t count);
int aotrt_host_buffers(aotrt_net *n, float **input, float **output);
int aotrt_program_source(const aotrt_net *n, const char **why);
int aotrt_memory(const aotrt_net *n, aotrt_memory_info *info);
const char *aotrt_last_error(const aotrt_net *n);
void aotrt_destroy(aotrt_net *n);

/* internal */
const char *aotrt_cl_error_name(cl_int err);
int aotrt_set_error(aotrt_net *n, int code, const char *fmt, ...);
int aotrt_match(const char *pattern, const char *text);
int aotrt_pick_device(aotrt_net *n, const aotrt_desc *d, const aotrt_options *o);
int aotrt_device_accepted(aotrt_net *n, const aotrt_desc *d, const aotrt_options *o,
                          cl_device_id device);
void aotrt_device_label(cl_device_id device, char *buf, size_t size);
char *aotrt_global_error(void);
const char *aotrt_shown(const char *text, char *buf, size_t size);
int aotrt_build_programs(aotrt_net *n, const aotrt_options *o);
char *aotrt_sm90a_rewrite(const char *ptx, size_t len);
int aotrt_enqueue(aotrt_net *n, int launch, cl_event *ev);
int aotrt_stage_setup(aotrt_net *n, const aotrt_options *o);
/* A pool of up to `threads` - 1 threads (fewer where they cannot be made; NULL for none),
 * aotrt_pool_threads of them; copies cut into pieces of at least `part` bytes. */
aotrt_pool *aotrt_pool_new(int threads, size_t part);
int aotrt_pool_threads(const aotrt_pool *p);
/* memcpy(dst, src, len) by the caller and the pool's threads (NULL pool: by the caller). */
void aotrt_pool_copy(aotrt_pool *p, void *dst, const void *src, size_t len);
void aotrt_pool_free(aotrt_pool *p);            /* joins the threads; NULL-safe */
int aotrt_cpu_count(void);                      /* the CPUs this process may run on, >= 1 */
/* `count` floats as IEEE binary16 bits, rounded to nearest even (rt_half.c) */
void aotrt_halves_from_floats(uint16_t *dst, const float *src, size_t count);
double aotrt_now_ms(void);                      /* CLOCK_MONOTONIC, in ms */
void aotrt_trace_begin(aotrt_trace *t, const char *net, const char *call);
/* a detail of the step under way (no-op with the trace off or t NULL) */
void aotrt_trace_note(aotrt_trace *t, const char *fmt, ...);
/* the step that ends now: `ms` long, or (ms < 0) since the last step */
void aotrt_trace_step(aotrt_trace *t, const char *step, double ms);
void aotrt_trace_end(aotrt_trace *t, int rc);   /* writes the line */

#endif

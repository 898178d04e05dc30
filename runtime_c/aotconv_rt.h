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

#ifndef AOTRT_NS
#error "AOTRT_NS must name the network (the generated build.ninja sets it)"
#endif
#define AOTRT_CAT2(a, b) aotrt_##a##_##b
#define AOTRT_CAT(a, b) AOTRT_CAT2(a, b)
#define AOTRT_SYM(name) AOTRT_CAT(AOTRT_NS, name)

#define aotrt_create AOTRT_SYM(create)
#define aotrt_set_params AOTRT_SYM(set_params)
#define aotrt_load_params AOTRT_SYM(load_params)
#define aotrt_run AOTRT_SYM(run)
#define aotrt_profile AOTRT_SYM(profile)
#define aotrt_host_buffers AOTRT_SYM(host_buffers)
#define aotrt_last_error AOTRT_SYM(last_error)
#define aotrt_destroy AOTRT_SYM(destroy)
#define aotrt_cl_error_name AOTRT_SYM(cl_error_name)
#define aotrt_set_error AOTRT_SYM(set_error)
#define aotrt_pick_device AOTRT_SYM(pick_device)
#define aotrt_match AOTRT_SYM(match)
#define aotrt_global_error AOTRT_SYM(global_error)

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

typedef struct {
    const char *layer;        /* the layer whose kernels it holds, for messages */
    const char *source;       /* embedded OpenCL C (the same text as kernels/<layer>.cl) */
} aotrt_program;

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

typedef struct {
    const char *net;
    const char *target;
    const char *vendor_pattern;   /* '|' alternatives, '.*' wildcards, case-insensitive */
    const char *device_pattern;
    const char *build_options;
    int nprograms;
    const aotrt_program *programs;
    int nbuffers;
    const aotrt_buffer *buffers;
    int nparams;
    const aotrt_param *params;
    size_t param_count;
    int nfolds;
    const aotrt_fold *folds;
    int nlaunches;
    const aotrt_launch *launches;
    int nrun;                     /* run-phase launches (profile entries) */
    aotrt_io input;
    int noutputs;
    const aotrt_io *outputs;
    size_t output_count;
} aotrt_desc;

typedef struct {
    int platform_index;       /* -1: choose by the target's patterns (or AOTCONV_DEVICE) */
    int device_index;
    const char *device_name;  /* substring of "vendor platform device" to match, or NULL */
    int profile;              /* keep per-kernel events for profile(); default on */
} aotrt_options;

typedef struct aotrt_net {
    const aotrt_desc *desc;
    cl_context ctx;
    cl_command_queue queue;
    cl_device_id device;
    cl_program *programs;
    cl_kernel *kernels;       /* one per launch */
    cl_mem *buffers;
    cl_event *events;         /* one per run launch, from the last run */
    int profile;
    int params_set;
    int ran;
    cl_mem host_mem[2];       /* pinned host memory for one input and one output, on request */
    float *host_ptr[2];       /* their mappings, valid until destroy */
    char error[2048];
} aotrt_net;

int aotrt_create(const aotrt_desc *d, aotrt_net **out, const aotrt_options *opts);
int aotrt_set_params(aotrt_net *n, const float *params, size_t count);
int aotrt_load_params(aotrt_net *n, const char *path);
int aotrt_run(aotrt_net *n, const float *input, size_t input_count, float *output,
              size_t output_count);
int aotrt_profile(aotrt_net *n, double *ms, size_t count);
int aotrt_host_buffers(aotrt_net *n, float **input, float **output);
const char *aotrt_last_error(const aotrt_net *n);
void aotrt_destroy(aotrt_net *n);

/* internal */
const char *aotrt_cl_error_name(cl_int err);
int aotrt_set_error(aotrt_net *n, int code, const char *fmt, ...);
int aotrt_match(const char *pattern, const char *text);
int aotrt_pick_device(aotrt_net *n, const aotrt_desc *d, const aotrt_options *o);
char *aotrt_global_error(void);

#endif

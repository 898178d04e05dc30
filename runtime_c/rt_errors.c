/* Error messages: OpenCL error codes by name, and the per-handle / per-thread last error. */
#include "aotconv_rt.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* create() can fail before a handle exists: its message is kept per thread. */
static _Thread_local char global_error[2048];

char *aotrt_global_error(void) { return global_error; }

int aotrt_set_error(aotrt_net *n, int code, const char *fmt, ...)
{
    char *buf = n ? n->error : global_error;
    size_t size = n ? sizeof n->error : sizeof global_error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n)  /* keep the thread's message too, so last_error(NULL) tells the latest failure */
        snprintf(global_error, sizeof global_error, "%s", n->error);
    return code;
}

/* `text` as it may appear in a one-line message: control characters escaped (\n, \t, \xNN),
 * cut with "..." to fit `size`. For what a user gave (a path, a device name). */
const char *aotrt_shown(const char *text, char *buf, size_t size)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; ++p) {
        char esc[8];
        if (*p == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (*p == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (*p == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (*p < 0x20 || *p == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", *p);
        else
            esc[0] = (char)*p, esc[1] = '\0';
        size_t len = strlen(esc);
        if (o + len + 4 > size) {
            snprintf(buf + o, size - o, "...");
            return buf;
        }
        memcpy(buf + o, esc, len);
        o += len;
    }
    buf[o] = '\0';
    return buf;
}

const char *aotrt_cl_error_name(cl_int err)
{
    switch (err) {
#define E(x) case x: return #x;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_MEM_COPY_OVERLAP) E(CL_IMAGE_FORMAT_MISMATCH)
    E(CL_IMAGE_FORMAT_NOT_SUPPORTED) E(CL_BUILD_PROGRAM_FAILURE) E(CL_MAP_FAILURE)
    E(CL_MISALIGNED_SUB_BUFFER_OFFSET) E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    E(CL_COMPILE_PROGRAM_FAILURE) E(CL_LINKER_NOT_AVAILABLE) E(CL_LINK_PROGRAM_FAILURE)
    E(CL_DEVICE_PARTITION_FAILED) E(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
    E(CL_INVALID_VALUE) E(CL_INVALID_DEVICE_TYPE) E(CL_INVALID_PLATFORM) E(CL_INVALID_DEVICE)
    E(CL_INVALID_CONTEXT) E(CL_INVALID_QUEUE_PROPERTIES) E(CL_INVALID_COMMAND_QUEUE)
    E(CL_INVALID_HOST_PTR) E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
    E(CL_INVALID_IMAGE_SIZE) E(CL_INVALID_SAMPLER) E(CL_INVALID_BINARY) E(CL_INVALID_BUILD_OPTIONS)
    E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE) E(CL_INVALID_KERNEL_NAME)
    E(CL_INVALID_KERNEL_DEFINITION) E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX)
    E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE) E(CL_INVALID_KERNEL_ARGS)
    E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE) E(CL_INVALID_WORK_ITEM_SIZE)
    E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST) E(CL_INVALID_EVENT)
    E(CL_INVALID_OPERATION) E(CL_INVALID_GL_OBJECT) E(CL_INVALID_BUFFER_SIZE)
    E(CL_INVALID_MIP_LEVEL) E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_INVALID_PROPERTY)
    E(CL_INVALID_IMAGE_DESCRIPTOR) E(CL_INVALID_COMPILER_OPTIONS) E(CL_INVALID_LINKER_OPTIONS)
    E(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef E
    case -9999: return "CL_NVIDIA_KERNEL_FAULT(-9999)";
    default: return "CL_UNKNOWN_ERROR";
    }
}

/* The step trace of create(), set_params() and load_params(): with the environment variable
 * AOTCONV_TRACE set (and not "0"), each call writes one line to stderr with the time each of its
 * steps took, e.g.
 *
 *     aotconv vgg16: create: device 0.4 ms, context 212.0 ms, ..., staging 20.1 ms; 238.0 ms
 *
 * (docs/c-api.md, Timing create() and load_params). Without the variable nothing is printed and
 * a step costs one clock read.
 */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime under -std=c11 */
#include "aotconv_rt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double aotrt_now_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int trace_wanted(void)
{
    const char *v = getenv("AOTCONV_TRACE");
    return v && v[0] && strcmp(v, "0") != 0;
}

/* snprintf at the end of `buf` (holding `*len` of `size`), never past it */
static void append(char *buf, size_t size, size_t *len, const char *fmt, va_list ap)
{
    if (*len + 1 >= size)
        return;
    int k = vsnprintf(buf + *len, size - *len, fmt, ap);
    if (k > 0)
        *len = *len + (size_t)k < size - 1 ? *len + (size_t)k : size - 1;
}

static void line_add(aotrt_trace *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    append(t->line, sizeof t->line, &t->len, fmt, ap);
    va_end(ap);
}

void aotrt_trace_begin(aotrt_trace *t, const char *net, const char *call)
{
    memset(t, 0, sizeof *t);
    t->on = trace_wanted();
    t->net = net;
    t->call = call;
    t->start = t->mark = aotrt_now_ms();
}

void aotrt_trace_note(aotrt_trace *t, const char *fmt, ...)
{
    if (!t || !t->on)
        return;
    size_t len = strlen(t->note);
    if (len && len + 3 < sizeof t->note) {
        memcpy(t->note + len, ", ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    append(t->note, sizeof t->note, &len, fmt, ap);
    va_end(ap);
}

void aotrt_trace_step(aotrt_trace *t, const char *step, double ms)
{
    if (!t || !t->on)
        return;
    double now = aotrt_now_ms();
    if (ms < 0)
        ms = now - t->mark;
    t->mark = now;
    line_add(t, "%s%s %.1f ms", t->len ? ", " : "", step, ms);
    if (t->note[0])
        line_add(t, " (%s)", t->note);
    t->note[0] = '\0';
}

void aotrt_trace_end(aotrt_trace *t, int rc)
{
    if (!t || !t->on)
        return;
    double ms = aotrt_now_ms() - t->start;
    if (rc)
        line_add(t, "%sfailed (%d) after %.1f ms", t->len ? "; " : "", rc, ms);
    else
        line_add(t, "%s%.1f ms", t->len ? "; " : "", ms);
    /* one call, so that the lines of handles in several threads do not mix */
    fprintf(stderr, "aotconv %s: %s: %s\n", t->net, t->call, t->line);
}

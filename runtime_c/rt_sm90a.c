/* sm_90a PTX from the PTX NVIDIA's OpenCL made of a program whose source holds Hopper's
 * warpgroup instructions behind the marker "//@sm_90a " (aotconv/ptx.py does the same at build
 * time): the marked lines uncommented, `.target sm_90` made `sm_90a`, `.version` raised to 8.0
 * where lower. Plain C, no OpenCL: create() runs it where it compiles such a program from its
 * source (rt_program.c), and the tests run it alone.
 */
#include "aotconv_rt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MARK[] = "//@sm_90a ";

/* The rewritten PTX (malloc'd, NUL-terminated; the caller frees it), or NULL where `ptx`
 * holds no marked line, does not target sm_90, or memory ran out. */
char *aotrt_sm90a_rewrite(const char *ptx, size_t len)
{
    const size_t mark = sizeof MARK - 1;
    int marked = 0, target = 0;
    char *out = malloc(len + 2);
    size_t o = 0, i = 0;
    if (out == NULL)
        return NULL;
    while (i < len && ptx[i] != '\0') {
        size_t end = i, s = i;
        while (end < len && ptx[end] != '\0' && ptx[end] != '\n')
            end++;
        while (s < end && (ptx[s] == ' ' || ptx[s] == '\t'))
            s++;
        size_t start = o;
        if (end - s >= mark && memcmp(ptx + s, MARK, mark) == 0) {
            marked = 1;                                 /* the instruction, uncommented */
            memcpy(out + o, ptx + i, s - i);
            o += s - i;
            s += mark;
        } else {
            s = i;                                      /* the line as it is */
        }
        memcpy(out + o, ptx + s, end - s);
        o += end - s;
        out[o] = '\0';
        const char *line = out + start;
        while (*line == ' ' || *line == '\t')
            line++;
        if (!target && strncmp(line, ".target", 7) == 0) {
            const char *a = strstr(line, "sm_90");
            if (a != NULL && !isalnum((unsigned char)a[5]) && a[5] != '_') {
                /* sm_90 -> sm_90a: one byte more; the buffer has room for it */
                size_t at = (size_t)(a - out) + 5;
                memmove(out + at + 1, out + at, o - at);
                out[at] = 'a';
                o++;
                target = 1;
            }
        } else if (strncmp(line, ".version", 8) == 0) {
            int major = 0, minor = 0;
            if (sscanf(line + 8, "%d.%d", &major, &minor) == 2 && major < 8) {
                o = (size_t)(line - out);
                memcpy(out + o, ".version 8.0", 12);
                o += 12;
            }
        }
        if (end < len && ptx[end] == '\n')
            out[o++] = '\n';
        i = end + 1;
    }
    out[o] = '\0';
    if (!marked || !target) {
        free(out);
        return NULL;
    }
    return out;
}

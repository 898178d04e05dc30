/* Device selection: the target's vendor/device patterns, or AOTCONV_DEVICE / options.
 *
 * Two kinds of matching, both case-insensitive and both linear in the text (no backtracking,
 * so no pattern can make create() slow):
 *  - the user's AOTCONV_DEVICE or options.device_name is a plain SUBSTRING of
 *    "platform-vendor platform-name device-vendor device-name": no pattern syntax at all
 *    ('.', '*', '|' are ordinary characters);
 *  - the target's own patterns (generated from aotconv/targets.py) are '|' alternatives of
 *    literal pieces joined by '.*'. An alternative matches when its pieces occur in the text in
 *    order without overlapping; finding each piece at its earliest place after the previous
 *    one is exact for such patterns, and costs at most |text| x |pattern| comparisons.
 */
#include "aotconv_rt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define aotrt_contains AOTRT_SYM(contains)
int aotrt_contains(const char *text, const char *needle);

/* The first place at or after `t` where the `n` characters of `lit` occur (case-insensitive),
 * or NULL. */
static const char *find_ci(const char *t, const char *lit, size_t n)
{
    if (n == 0)
        return t;
    for (; *t; ++t) {
        size_t i = 0;
        while (i < n && t[i] && tolower((unsigned char)t[i]) == tolower((unsigned char)lit[i]))
            ++i;
        if (i == n)
            return t;
        if (!t[i])
            return NULL;    /* the rest of the text is shorter than the piece */
    }
    return NULL;
}

/* Is `needle` a case-insensitive substring of `text`? (AOTCONV_DEVICE, options.device_name) */
int aotrt_contains(const char *text, const char *needle)
{
    return find_ci(text, needle, strlen(needle)) != NULL;
}

/* Do the '.*'-separated literal pieces of the alternative [p, end) occur in `t` in order? */
static int match_alternative(const char *p, const char *end, const char *t)
{
    while (p < end) {
        const char *star = p;
        while (star + 1 < end && !(star[0] == '.' && star[1] == '*'))
            ++star;
        if (star + 1 >= end)
            star = end;                    /* no further '.*': the last piece */
        size_t n = (size_t)(star - p);
        const char *at = find_ci(t, p, n);
        if (!at)
            return 0;
        t = at + n;
        p = star == end ? end : star + 2;
    }
    return 1;
}

/* Does any '|' alternative of `pattern` (literal pieces joined by '.*') occur in `text`? */
int aotrt_match(const char *pattern, const char *text)
{
    const char *alt = pattern;
    for (;;) {
        const char *bar = strchr(alt, '|');
        const char *end = bar ? bar : alt + strlen(alt);
        if (match_alternative(alt, end, text))
            return 1;
        if (!bar)
            return 0;
        alt = bar + 1;
    }
}

#define MAXP 16
#define MAXD 16

/* The user's override: options.device_name, else AOTCONV_DEVICE (empty means unset). */
static const char *wanted(const aotrt_options *o)
{
    const char *want = o && o->device_name ? o->device_name : getenv("AOTCONV_DEVICE");
    return want && *want ? want : NULL;
}

/* "platform-vendor platform-name device-vendor" of `dev`, and its name. */
static void describe(cl_platform_id plat, cl_device_id dev, char *vend, size_t vsize,
                     char *dname, size_t dsize)
{
    char pvendor[256] = "", pname[256] = "", dvendor[256] = "";
    clGetPlatformInfo(plat, CL_PLATFORM_VENDOR, sizeof pvendor, pvendor, NULL);
    clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_VENDOR, sizeof dvendor, dvendor, NULL);
    dname[0] = '\0';
    clGetDeviceInfo(dev, CL_DEVICE_NAME, dsize, dname, NULL);
    dname[dsize - 1] = '\0';
    snprintf(vend, vsize, "%s %s %s", pvendor, pname, dvendor);
}

/* Does the device described by (vend, dname) serve the target, or the user's override? */
static int accepted(const aotrt_desc *d, const char *want, const char *vend, const char *dname)
{
    if (want) {
        char all[1100];
        snprintf(all, sizeof all, "%s %s", vend, dname);
        return aotrt_contains(all, want);
    }
    return aotrt_match(d->vendor_pattern, vend) && aotrt_match(d->device_pattern, dname);
}

void aotrt_device_label(cl_device_id device, char *buf, size_t size)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(device, CL_DEVICE_NAME, size, buf, NULL) != CL_SUCCESS)
        snprintf(buf, size, "?");
    buf[size - 1] = '\0';
}

/* An application's device (create_with_queue): the target's, or the override's. */
int aotrt_device_accepted(aotrt_net *n, const aotrt_desc *d, const aotrt_options *o,
                          cl_device_id device)
{
    cl_platform_id plat = NULL;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL);
    if (err != CL_SUCCESS)
        return aotrt_set_error(n, AOTRT_ERR_ARGUMENT,
                               "%s_create_with_queue: device is not an OpenCL device "
                               "(clGetDeviceInfo: %s)", d->net, aotrt_cl_error_name(err));
    char vend[800], dname[256];
    describe(plat, device, vend, sizeof vend, dname, sizeof dname);
    const char *want = wanted(o);
    if (accepted(d, want, vend, dname))
        return AOTRT_OK;
    char shown[640];
    if (want)
        return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                               "%s_create_with_queue: the device '%s' does not match '%s' (from "
                               "%s)", d->net, dname, aotrt_shown(want, shown, sizeof shown),
                               o && o->device_name ? "options.device_name" : "AOTCONV_DEVICE");
    return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                           "%s_create_with_queue: the device '%s' is not target '%s' (vendor "
                           "'%s', device '%s') that the kernels were built for; set "
                           "options.device_name or AOTCONV_DEVICE to a part of its name to run "
                           "there anyway", d->net, dname, d->target, d->vendor_pattern,
                           d->device_pattern);
}

int aotrt_pick_device(aotrt_net *n, const aotrt_desc *d, const aotrt_options *o)
{
    cl_platform_id plats[MAXP];
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(MAXP, plats, &np);
    if (err != CL_SUCCESS || np == 0)
        return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                               "%s: no OpenCL platform found (clGetPlatformIDs: %s); install an "
                               "OpenCL driver for target '%s'", d->net, aotrt_cl_error_name(err),
                               d->target);
    const char *want = wanted(o);
    char seen[1024] = "";
    for (cl_uint pi = 0; pi < np && pi < MAXP; ++pi) {
        if (o && o->platform_index >= 0 && (cl_uint)o->platform_index != pi)
            continue;
        cl_device_id devs[MAXD];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, MAXD, devs, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint di = 0; di < nd && di < MAXD; ++di) {
            if (o && o->device_index >= 0 && (cl_uint)o->device_index != di)
                continue;
            char vend[800], dname[256];
            describe(plats[pi], devs[di], vend, sizeof vend, dname, sizeof dname);
            size_t len = strlen(seen);
            if (len + 4 < sizeof seen)
                snprintf(seen + len, sizeof seen - len, "%s[%u.%u] %s", len ? "; " : "", pi, di, dname);
            int ok;
            if (!want && o && (o->platform_index >= 0 || o->device_index >= 0))
                ok = 1;  /* chosen by index */
            else
                ok = accepted(d, want, vend, dname);
            if (ok) {
                n->device = devs[di];
                return AOTRT_OK;
            }
        }
    }
    char shown[640];
    if (want)
        return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                               "%s: no OpenCL device matches '%s' (from %s); devices present: %s",
                               d->net, aotrt_shown(want, shown, sizeof shown), o && o->device_name ? "options.device_name" : "AOTCONV_DEVICE",
                               seen[0] ? seen : "none");
    return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                           "%s: no OpenCL device matches target '%s' (vendor '%s', device '%s'); "
                           "devices present: %s; set AOTCONV_DEVICE to a name to run elsewhere",
                           d->net, d->target, d->vendor_pattern, d->device_pattern,
                           seen[0] ? seen : "none");
}

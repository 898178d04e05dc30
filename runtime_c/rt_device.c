/* Device selection: the target's vendor/device patterns, or AOTCONV_DEVICE / options. */
#include "aotconv_rt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Case-insensitive: does `text` contain a match of `pat` (literal chars and '.*')? */
static int match_here(const char *p, const char *t)
{
    for (;;) {
        if (*p == '\0' || *p == '|')
            return 1;
        if (p[0] == '.' && p[1] == '*') {
            for (const char *s = t;; ++s) {
                if (match_here(p + 2, s))
                    return 1;
                if (*s == '\0')
                    return 0;
            }
        }
        if (*t == '\0' || tolower((unsigned char)*p) != tolower((unsigned char)*t))
            return 0;
        ++p, ++t;
    }
}

/* Any '|' alternative of `pattern` occurs somewhere in `text`. */
int aotrt_match(const char *pattern, const char *text)
{
    const char *alt = pattern;
    while (alt) {
        for (const char *t = text;; ++t) {
            if (match_here(alt, t))
                return 1;
            if (*t == '\0')
                break;
        }
        alt = strchr(alt, '|');
        if (alt)
            ++alt;
    }
    return 0;
}

#define MAXP 16
#define MAXD 16

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
    const char *want = o && o->device_name ? o->device_name : getenv("AOTCONV_DEVICE");
    if (want && !*want)
        want = NULL;
    char seen[1024] = "";
    for (cl_uint pi = 0; pi < np && pi < MAXP; ++pi) {
        if (o && o->platform_index >= 0 && (cl_uint)o->platform_index != pi)
            continue;
        char pvendor[256] = "", pname[256] = "";
        clGetPlatformInfo(plats[pi], CL_PLATFORM_VENDOR, sizeof pvendor, pvendor, NULL);
        clGetPlatformInfo(plats[pi], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
        cl_device_id devs[MAXD];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, MAXD, devs, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint di = 0; di < nd && di < MAXD; ++di) {
            if (o && o->device_index >= 0 && (cl_uint)o->device_index != di)
                continue;
            char dvendor[256] = "", dname[256] = "", vend[800];
            clGetDeviceInfo(devs[di], CL_DEVICE_VENDOR, sizeof dvendor, dvendor, NULL);
            clGetDeviceInfo(devs[di], CL_DEVICE_NAME, sizeof dname, dname, NULL);
            snprintf(vend, sizeof vend, "%s %s %s", pvendor, pname, dvendor);
            size_t len = strlen(seen);
            if (len + 4 < sizeof seen)
                snprintf(seen + len, sizeof seen - len, "%s[%u.%u] %s", len ? "; " : "", pi, di, dname);
            int ok;
            if (want) {
                char all[1100];
                snprintf(all, sizeof all, "%s %s", vend, dname);
                ok = aotrt_match(want, all);
            } else if (o && (o->platform_index >= 0 || o->device_index >= 0)) {
                ok = 1;  /* chosen by index */
            } else {
                ok = aotrt_match(d->vendor_pattern, vend) && aotrt_match(d->device_pattern, dname);
            }
            if (ok) {
                n->device = devs[di];
                return AOTRT_OK;
            }
        }
    }
    if (want)
        return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                               "%s: no OpenCL device matches '%s' (from %s); devices present: %s",
                               d->net, want, o && o->device_name ? "options.device_name" : "AOTCONV_DEVICE",
                               seen[0] ? seen : "none");
    return aotrt_set_error(n, AOTRT_ERR_NO_DEVICE,
                           "%s: no OpenCL device matches target '%s' (vendor '%s', device '%s'); "
                           "devices present: %s; set AOTCONV_DEVICE to a name to run elsewhere",
                           d->net, d->target, d->vendor_pattern, d->device_pattern,
                           seen[0] ? seen : "none");
}

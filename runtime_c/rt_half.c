/* Half storage (an fp16 build, docs/precision.md of aotconv): set_params rounds the float
 * parameters to IEEE binary16 once, on the host, as the kernels' vstore_half_rte rounds: to
 * nearest, ties to even, subnormals kept, overflow to infinity, NaN kept a (quiet) NaN. */
#include "aotconv_rt.h"

#include <string.h>

static uint16_t half_of(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7FFFFFFFu;
    if (a >= 0x7F800000u)                        /* infinity, NaN (quiet, its top payload) */
        return sign | (a > 0x7F800000u ? (uint16_t)(0x7E00u | ((a >> 13) & 0x3FFu)) : 0x7C00u);
    if (a >= 0x477FF000u)                        /* 65520 and up round past 65504: infinity */
        return sign | 0x7C00u;
    if (a <= 0x33000000u)                        /* 2^-25 and below: zero (2^-25 ties to it) */
        return sign;
    if (a < 0x38800000u) {                       /* below 2^-14: a subnormal half, m 2^-24 */
        const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - (int)(a >> 23);  /* 14 .. 24 */
        uint32_t h = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1u), tie = 1u << (shift - 1);
        if (rest > tie || (rest == tie && (h & 1u)))
            ++h;                                 /* may reach 0x400, the smallest normal */
        return sign | (uint16_t)h;
    }
    uint32_t h = (a - 0x38000000u) >> 13;        /* exponent rebiased 127 -> 15, 10 bits kept */
    const uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        ++h;                                     /* a carry moves into the exponent */
    return sign | (uint16_t)h;
}

void aotrt_halves_from_floats(uint16_t *dst, const float *src, size_t count)
{
    for (size_t i = 0; i < count; ++i)
        dst[i] = half_of(src[i]);
}

## The f16 tensor-core multiply shared by the templates that run mma.sync m16n8k16 .f16 with FP32
## accumulators: the inline PTX (where MMA_PTX is defined) and its exact portable emulation
## (elsewhere), which exchanges a warp's fragments through its 192 local words `mx` and reads the
## lane's `g` and `t`.
<%def name="ptx()">\
// d[0..3] += A (16 x 16, .f16x2 words a[0..3]) * B (16 x 8, words b[0..1]), one warp
#define MMA_F16(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]) \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), \
                   "r"((b)[0]), "r"((b)[1]))
</%def>
<%def name="emulated()">\
// the half whose bits are h as a float, exactly (normal, subnormal, zero, infinity, NaN)
inline float half_bits(uint h)
{
    const uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0u)                                   // zero or subnormal: m * 2^-24
        return as_float(sign | as_uint((float)m * 0x1.0p-24f));
    if (e == 31u)
        return as_float(sign | 0x7f800000u | (m << 13));
    return as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// The warp's fragment words meet in its 192 words of local memory `mx` in the layout of the
// PTX ISA: A as [16 rows][8 k-pairs] (words 0..127), B as [8 columns][8 k-pairs] (128..191);
// lane (g, t) then computes c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1), each an
// FP32 sum of 16 exact products of halves in k order. The barriers span the work-group:
// every work-item reaches every mma, in the same order.
#define MMA_F16(d, a, b) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    mx[g * 8 + t] = (a)[0];                 /* a0 a1: row g,     k 2t, 2t+1 */ \
    mx[(g + 8) * 8 + t] = (a)[1];           /* a2 a3: row g + 8, k 2t, 2t+1 */ \
    mx[g * 8 + t + 4] = (a)[2];             /* a4 a5: row g,     k 2t+8, 2t+9 */ \
    mx[(g + 8) * 8 + t + 4] = (a)[3];       /* a6 a7: row g + 8, k 2t+8, 2t+9 */ \
    mx[128 + g * 8 + t] = (b)[0];           /* b0 b1: column g, k 2t, 2t+1 */ \
    mx[128 + g * 8 + t + 4] = (b)[1];       /* b2 b3: column g, k 2t+8, 2t+9 */ \
    barrier(CLK_LOCAL_MEM_FENCE); \
    for (int q_ = 0; q_ < 4; ++q_) { \
        const int r_ = g + (q_ >> 1) * 8, c_ = 2 * t + (q_ & 1); \
        float s_ = (d)[q_]; \
        for (int p_ = 0; p_ < 8; ++p_) { \
            const uint wa_ = mx[r_ * 8 + p_], wb_ = mx[128 + c_ * 8 + p_]; \
            s_ = fma(half_bits(wa_ & 0xffffu), half_bits(wb_ & 0xffffu), s_); \
            s_ = fma(half_bits(wa_ >> 16), half_bits(wb_ >> 16), s_); \
        } \
        (d)[q_] = s_; \
    } \
} while (0)
</%def>

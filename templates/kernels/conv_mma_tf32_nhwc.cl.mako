<%namespace name="c" file="_common.mako"/>\
<%namespace name="nh" file="_mma_nhwc.mako"/>\
<%
    define = nh.attr.define
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    act = lambda v: capture(c.act, attrs["act"], attrs["alpha"], v).strip()
    # the element in the text of the GEMM this shares with conv_mma_f16_nhwc (_mma_nhwc.mako):
    # 4 floats per float4 and 1 per word, mma.m16n8k8 .tf32 on A words rounded by cvt.rna
    el = dict(vec=4, vector="float4", zero="(float4)(0.0f)", kstep=8, mma="MMA_TF32",
              ka=("k t", "k t + 4"), a=("a0", "a1", "a2", "a3"), b=("b0", "b1"),
              round="TF32_WORD", kind="float",
              load1=lambda p, i: "%s[%s]" % (p, i),
              load2=lambda p, i: "((__global const float2*)%s)[%s]" % (p, i),
              store1=lambda p, i, v: "%s[%s] = %s" % (p, i, v),
              store2=lambda p, i, v: "((__global float2*)%s)[%s] = %s" % (p, i, v))
%>\
// ${prefix}: channels-last convolution as an implicit GEMM on the tensor cores, TF32 products, FP32 sums (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}${", plus a fused residual" if residual else ""}; NHWC in and out, FP32 storage
// Y[m][n] = sum_k X[m][k] * W[k][n] with M = N*P*Q = ${NPQ} output pixels, N = K = ${K} output
//   channels, k = (r, s, c) over R*S*C = ${RSC}, c innermost: 4 consecutive k are 4 consecutive
//   floats of one input pixel, one float4 load. X (im2col of the input) is read in place.
// A work-group of WM x WN warps computes a BM x BN tile (pixels x channels); each warp its
// WTM x WTN part as MI x NI tiles of mma.sync m16n8k8 .tf32 (16 x 8 outputs, 8 deep, FP32
// accumulators). The weights are packed rounded to TF32; an activation is rounded to TF32
// (cvt.rna: to nearest, ties away from zero) when its fragment is read for the mma.

// -- tunables
${define("BM", BM, "tile in M (output pixels) per work-group")}
${define("BN", BN, "tile in N (output channels) per work-group")}
${define("BK", BK, "reduction step (floats) held in local memory")}
${define("WM", WM, "warps along M")}
${define("WN", WN, "warps along N")}
${define("PAD", PAD, "words of padding per local row")}
${define("DBUF", DBUF, "load step k+1 into registers during step k")}
${define("CPASYNC", CPASYNC, "local stages filled by cp.async (0: none)")}
${define("LDSM", LDSM, "fragments read with ldmatrix")}
${define("EPI", EPI, "epilogue staged in local memory, 16-byte stores")}
${nh.sizes(el)}\
// local memory: NBUF stages, each the activation tile [BM][LD] then the weight tile [BN][LD],
// in 32-bit words (floats), k-contiguous per row. LD = BK + PAD: with PAD = 4 a row is
// LD = 4 (mod 8) words, so rows g = 0..7 start at banks 4 * (g * LD/4 mod 8), eight distinct
// multiples of 4 (LD/4 is odd), and a fragment read (rows g, word columns t = 0..3: a0 of
// A, b0 of B; likewise g + 8 and t + 4) takes 32 different banks; an ldmatrix phase (8 rows
// of 16 bytes) the same 32. Without PAD (LD = 16, 32) rows collide 4 or 8 ways.
${define("LD", LD, "words per local row")}
${define("A_SIZE", "(BM * LD)")}
${define("B_SIZE", "(BN * LD)")}
${define("STAGE", "(A_SIZE + B_SIZE)")}
${define("NBUF", NBUF)}
${define("SMEM", SMEM, "words of local memory: the stages, or a staged pass where larger")}
// the loads of a step: A_ITERS float4 of the activation tile per work-item (its chunk column
// achunk of rows arow + it * A_RSTEP), B_ITERS float4 of the weight tile
${define("A_ITERS", A_ITERS)}
${define("B_ITERS", B_ITERS)}
${define("A_RSTEP", "(WG / CH)")}
% if EPI:
// the staged epilogue (EPI = 1): MI passes; in pass mi every warp puts its accumulators of rows
// mi * 16 .. mi * 16 + 15 of its tile in rows wm * 16 .. of a [WM * 16][ELD] float tile
// (columns: the BN channels), which then goes out whole pixels at a time, 4 channels a
// 16-byte vector. ELD = BN + 8 = 8 (mod 32) words: a half-warp's float2 writes (rows g = 0..3,
// words 2t, 2t + 1) take 32 banks; a quarter-warp's float4 reads (8 work-items, consecutive
// 4-float chunks of one row: BN / 4 is a multiple of 8) take 32 banks in any row.
${define("ELD", ELD, "floats per row of the staged tile")}
${define("E_ROWS", "(WM * 16)", "pixels staged per pass")}
${define("BN4", "(BN / 4)", "16-byte output vectors per pixel of the tile")}
${define("E_VECS", "(E_ROWS * BN4)", "16-byte vectors per pass")}
${define("E_ITERS", E_ITERS, "... per work-item, rounded up")}
% endif
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable bodies even on NVIDIA
% endif
// -- the tensor-core multiply, the TF32 rounding and the loads the tuner may try: inline PTX
// where the compiler is NVIDIA's, exact portable bodies elsewhere (or with AOTCONV_MMA_EMULATE
// defined)
#if (defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)) && !defined(AOTCONV_MMA_EMULATE)
#define MMA_PTX 1
#endif

#ifdef MMA_PTX
// round to the nearest TF32, ties away from zero
inline float tf32(float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return as_float(r);
}

// d[0..3] += A (16 x 8, TF32 words a[0..3]) * B (8 x 8, words b[0..1]), one warp
#define MMA_TF32(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]) \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), \
                   "r"((b)[0]), "r"((b)[1]))
% if LDSM:
// four (two) 8 x 8 matrices of 16-bit elements from local memory, one warp: lane 8i + j gives
// the address of row j of matrix i (16 bytes: 4 words); register i of lane (g, t) gets row g,
// word t of matrix i, the 32 bits as they lie. A __local pointer as uint is its address in the
// shared window.
${nh.ldsm_ptx()}\
% endif
${nh.cp_async_ptx()}\
#else
// round to the nearest TF32 (10 mantissa bits), ties away from zero, as cvt.rna.tf32.f32:
// adding half an ulp of TF32 to the magnitude carries into the kept bits exactly when the
// dropped ones are at least half; infinities and NaNs pass unchanged
inline float tf32(float x)
{
    const uint u = as_uint(x);
    return (u & 0x7f800000u) == 0x7f800000u ? x : as_float((u + 0x1000u) & 0xffffe000u);
}

// The warp's fragment words meet in its 192 words of local memory `mx` in the layout of the
// PTX ISA: A as [16 rows][8 k] (words 0..127), B as [8 columns][8 k] (128..191); lane (g, t)
// then computes c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1), each an FP32 sum of
// 8 products in k order (exact: two TF32 values have at most 22 significant bits). The
// barriers span the work-group: every work-item reaches every mma, in the same order.
#define MMA_TF32(d, a, b) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    mx[g * 8 + t] = (a)[0];                 /* a0: row g,     k t */ \
    mx[(g + 8) * 8 + t] = (a)[1];           /* a1: row g + 8, k t */ \
    mx[g * 8 + t + 4] = (a)[2];             /* a2: row g,     k t + 4 */ \
    mx[(g + 8) * 8 + t + 4] = (a)[3];       /* a3: row g + 8, k t + 4 */ \
    mx[128 + g * 8 + t] = (b)[0];           /* b0: k t,     column g */ \
    mx[128 + g * 8 + t + 4] = (b)[1];       /* b1: k t + 4, column g */ \
    barrier(CLK_LOCAL_MEM_FENCE); \
    for (int q_ = 0; q_ < 4; ++q_) { \
        const int r_ = g + (q_ >> 1) * 8, c_ = 2 * t + (q_ & 1); \
        float s_ = (d)[q_]; \
        for (int p_ = 0; p_ < 8; ++p_) \
            s_ = fma(as_float(mx[r_ * 8 + p_]), as_float(mx[128 + c_ * 8 + p_]), s_); \
        (d)[q_] = s_; \
    } \
} while (0)
${nh.ldsm_emulated()}\
% if CPASYNC:
// cp.async: the copy (or the zeros) at once; the groups and the wait have nothing to order
#define CP_ASYNC16(dst, src, ok) (*(__local float4*)(dst) = (ok) ? *(src) : (float4)(0.0f))
#define CP_COMMIT()
#define CP_WAIT()
% endif
#endif
// a fragment word (a float's bits) rounded to TF32
#define TF32_WORD(w) as_uint(tf32(as_float(w)))

// Weights [K][C][R][S] -> floats [K/BN tiles][KTILES][BN][BK], rounded to TF32: float (nt, kt,
// j, kk) is w[n][k], n = nt * BN + j, k = kt * BK + kk in (r, s, c) order; zero outside the
// layer (run once). A step's weight tile is one contiguous run of BN * BK floats.
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const float* restrict w, __global float* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= (K + BN - 1) / BN * BN * RSCP)
        return;
    const int kk = i % BK, j = i / BK % BN;
    const int kt = i / (BK * BN) % KTILES, nt = i / (BK * BN * KTILES);
    const int n = nt * BN + j, k = kt * BK + kk;
    float v = 0.0f;
    if (n < K && k < RSC) {
        const int tap = k / C, ch = k % C;
        v = tf32(w[((n * C + ch) * R + tap / S) * S + tap % S]);
    }
    wp[i] = v;
}

${nh.head(el)}\
    __local float4 smem4[SMEM / 4];            // float4: the vector stores stay aligned
${nh.setup(el)}\
% if EPI:
    // epilogue, staged: c[2h + j] of tile (mi, ni) is pixel g + 8h, channel 2t + j of the tile.
    // Pass mi stages rows mi * 16 .. of every warp's part (as accumulated), then the work-group
    // stores those pixels 4 channels at a time: in NHWC pixel m's channels start at m * K, so 4
    // of them are one float4 of the output (and of the residual, and of the bias).
    // Bias, ${"residual, " if residual else ""}activation as the direct epilogue does them, per element.
    // BN4 divides the work-group, so a work-item's chunk of 4 channels is the same in every
    // vector it stores.
    __local float* const ep = (__local float*)smem4;
    const int ec = tid % BN4, n = n0 + ec * 4;
% if has_bias:
% if NCHK:
    const float4 b4 = n < K ? ((__global const float4*)bias)[n / 4] : (float4)(0.0f);
% else:
    const float4 b4 = ((__global const float4*)bias)[n / 4];
% endif
% endif
<%call expr="nh.staged_passes(el)">\
            const int i4 = (m * K + n) / 4;
            float4 s = *(__local const float4*)(ep + sr * ELD + ec * 4);
% if has_bias:
            s += b4;
% endif
% if residual:
            s += ((__global const float4*)res)[i4];
% endif
% if attrs["act"] == "none":
            ((__global float4*)y)[i4] = s;
% else:
            ((__global float4*)y)[i4] = (float4)(${", ".join(act("s.s%d" % j) for j in range(4))});
% endif
</%call>\
% else:
${nh.direct_epilogue(el)}\
% endif

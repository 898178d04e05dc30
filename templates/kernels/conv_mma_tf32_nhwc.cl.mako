<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import indent


def define(name, value, comment=""):
    line = "#define %-10s %s" % (name, value)
    return ("%-30s // %s" % (line, comment)) if comment else line
%>\
<%
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    # the emulated mma, ldmatrix and cp.async hold work-group barriers: unrolled, every one
    # would split PoCL's work-group function once more (minutes to compile); the tensor cores
    # want the fragments in registers, so the PTX loops unroll
    unroll = "#pragma unroll 1" if EMULATE else "#pragma unroll"
    # the activation load of one step: a tap in the padding (HCHK, WCHK) or a chunk past R*S*C
    # in a partial last step (KCHK) reads zeros
    aterms = (["k < RSC"] if KCHK else []) \
        + (["(uint)(ih0[it] + r * DH) < (uint)H"] if HCHK else []) \
        + (["(uint)(iw0[it] + s * DW) < (uint)W"] if WCHK else [])
    acond = " && ".join(aterms)
    act = lambda v: capture(c.act, attrs["act"], attrs["alpha"], v).strip()
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
${define("WG", WG, "work-items: 32 per warp")}
${define("WARPS", WARPS)}
${define("WTM", WTM, "rows (pixels) of a warp's tile (BM / WM)")}
${define("WTN", WTN, "columns (channels) of a warp's tile (BN / WN)")}
${define("MI", MI, "16-row mma tiles per warp")}
${define("NI", NI, "8-column mma tiles per warp")}

// -- the layer
${define("BATCH", BATCH)}
${define("C", C)}
${define("H", H)}
${define("W", W)}
${define("K", K)}
${define("P", P)}
${define("Q", Q)}
${define("R", R)}
${define("S", S)}
${define("SH", SH)}
${define("SW", SW)}
${define("PT", PT)}
${define("PL", PL)}
${define("DH", DH)}
${define("DW", DW)}
${define("PQ", "(P * Q)")}
${define("NPQ", NPQ, "output pixels (M)")}
${define("RSC", RSC, "reduction length")}
${define("RSCP", RSCP, "... padded to whole BK steps")}
${define("KTILES", KTILES, "K steps")}
${define("C4", "(C / 4)", "float4 vectors per input pixel")}
${define("CH", CH, "float4 vectors per row of a step (BK / 4)")}
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
#define LDSM_X4(r0, r1, r2, r3, p) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" \
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((uint)(p)) : "memory")
#define LDSM_X2(r0, r1, p) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" \
                 : "=r"(r0), "=r"(r1) : "r"((uint)(p)) : "memory")
% endif
% if CPASYNC:
// 16 bytes from global to local memory, asynchronously; a source size of 0 writes zeros
#define CP_ASYNC16(dst, src, ok) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" \
                 :: "r"((uint)(dst)), "l"((ulong)(src)), "r"((ok) ? 16u : 0u) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
// every copy this work-item issued before its last CPASYNC - 2 groups has landed
#define CP_WAIT() asm volatile("cp.async.wait_group ${CPASYNC - 2};" ::: "memory")
% endif
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
% if LDSM:
// ldmatrix: each lane posts its row address (a word offset into smem) in the warp's 32 words
// `lx`; register i of lane (g, t) is then word t of the row lane 8i + g posted
#define LDSM_X4(r0, r1, r2, r3, p) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    lx[lane] = (int)((p) - smem); \
    barrier(CLK_LOCAL_MEM_FENCE); \
    (r0) = smem[lx[g] + t]; \
    (r1) = smem[lx[8 + g] + t]; \
    (r2) = smem[lx[16 + g] + t]; \
    (r3) = smem[lx[24 + g] + t]; \
} while (0)
#define LDSM_X2(r0, r1, p) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    lx[lane] = (int)((p) - smem); \
    barrier(CLK_LOCAL_MEM_FENCE); \
    (r0) = smem[lx[g] + t]; \
    (r1) = smem[lx[8 + g] + t]; \
} while (0)
% endif
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
<%def name="load_regs(kt)">\
{
    // activations: this work-item's chunk of 4 channels at k, tap (r, s), of each of its rows
    const int k = ${kt} * BK + achunk * 4;
    const int tap = k / C;
    const int r = tap / S, s = tap % S;
    const int off = (r * DH * W + s * DW) * C4 + k % C / 4;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
% if acond:
        pa[it] = (${acond}) ? x[xo[it] + off] : (float4)(0.0f);
% else:
        pa[it] = x[xo[it] + off];
% endif
    // weights: the step's tile, contiguous (packed and padded: no checks)
    __global const float4* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it)
        pb[it] = wt[tid + it * WG];
}
</%def>\
<%def name="store_regs(buf)">\
{
    __local uint* const as = smem + (${buf}) * STAGE;
    __local uint* const bs = as + A_SIZE;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
        *(__local float4*)(as + (arow + it * A_RSTEP) * LD + achunk * 4) = pa[it];
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
        *(__local float4*)(bs + e / CH * LD + e % CH * 4) = pb[it];
    }
}
</%def>\
<%def name="load_async(kt, buf)">\
{
    // step ${kt} straight into stage ${buf}: taps in the padding and chunks past R*S*C zeroed
    __local uint* const as = smem + (${buf}) * STAGE;
    __local uint* const bs = as + A_SIZE;
    const int k = ${kt} * BK + achunk * 4;
    const int tap = k / C;
    const int r = tap / S, s = tap % S;
    const int off = (r * DH * W + s * DW) * C4 + k % C / 4;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
% if acond:
        const bool ok = ${acond};
        CP_ASYNC16(as + (arow + it * A_RSTEP) * LD + achunk * 4, ok ? x + xo[it] + off : x, ok);
% else:
        CP_ASYNC16(as + (arow + it * A_RSTEP) * LD + achunk * 4, x + xo[it] + off, true);
% endif
    }
    __global const float4* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
        CP_ASYNC16(bs + e / CH * LD + e % CH * 4, wt + e, true);
    }
}
</%def>\
<%def name="multiply(buf)">\
{
    __local const uint* const as = smem + (${buf}) * STAGE + wm * WTM * LD;
    __local const uint* const bs = smem + (${buf}) * STAGE + A_SIZE + wn * WTN * LD;
    ${unroll}
    for (int ks = 0; ks < BK / 8; ++ks) {
        uint af[MI][4], bf[NI][2];
% if LDSM:
        // A: lanes 0-15 give rows 0-15 at words 0..3 of the k-step, lanes 16-31 rows 0-15 at
        // words 4..7: the four matrices are a0, a1, a2, a3
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            LDSM_X4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                    as + (mi * 16 + (lane & 15)) * LD + ks * 8 + (lane >> 4) * 4);
% if NI % 2 == 0:
        // B, two 8-channel tiles at a time: lanes 0-7 rows 0-7 at words 0..3 (b0 of ni), 8-15
        // the same rows at words 4..7 (b1), 16-31 likewise rows 8-15 (tile ni + 1)
        ${unroll}
        for (int ni = 0; ni < NI; ni += 2)
            LDSM_X4(bf[ni][0], bf[ni][1], bf[ni + 1][0], bf[ni + 1][1],
                    bs + (ni * 8 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 8
                    + ((lane >> 3) & 1) * 4);
% else:
        // B, one 8-channel tile at a time: lanes 0-7 rows 0-7 at words 0..3 (b0), 8-15 at
        // words 4..7 (b1); lanes 16-31 repeat them (.x2 ignores their addresses)
        ${unroll}
        for (int ni = 0; ni < NI; ++ni)
            LDSM_X2(bf[ni][0], bf[ni][1],
                    bs + (ni * 8 + (lane & 7)) * LD + ks * 8 + ((lane >> 3) & 1) * 4);
% endif
% else:
        ${unroll}
        for (int mi = 0; mi < MI; ++mi) {
            __local const uint* const p = as + (mi * 16 + g) * LD + ks * 8 + t;
            af[mi][0] = p[0];                 // (g,     k t)
            af[mi][1] = p[8 * LD];            // (g + 8, k t)
            af[mi][2] = p[4];                 // (g,     k t + 4)
            af[mi][3] = p[8 * LD + 4];        // (g + 8, k t + 4)
        }
        ${unroll}
        for (int ni = 0; ni < NI; ++ni) {
            __local const uint* const q = bs + (ni * 8 + g) * LD + ks * 8 + t;
            bf[ni][0] = q[0];                 // (k t,     channel g)
            bf[ni][1] = q[4];                 // (k t + 4, channel g)
        }
% endif
        // the activations as the tensor cores take them (the weights were packed rounded)
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                af[mi][q] = TF32_WORD(af[mi][q]);
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            ${unroll}
            for (int ni = 0; ni < NI; ++ni)
                MMA_TF32(acc[mi][ni], af[mi], bf[ni]);
    }
}
</%def>\

// One work-group: a BM x BN tile of Y (pixels m0.., channels n0..); a 1-D work-group of WG
// work-items, warp w = tid / 32 at (w % WM, w / WM) in the WM x WN grid of warps.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const float4* restrict x, __global const float4* restrict wp,
% if has_bias:
               __global const float* restrict bias,
% endif
% if residual:
               __global const float* restrict res,     // the fused add's other input, NHWC
% endif
               __global float* restrict y)
{
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;     // groupID, threadID_in_group
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = get_group_id(0) * BM, n0 = get_group_id(1) * BN;

    __local float4 smem4[SMEM / 4];            // float4: the vector stores stay aligned
    __local uint* const smem = (__local uint*)smem4;
#ifndef MMA_PTX
    __local uint mma_x[WARPS * 192];           // the emulated mma's fragment exchange
    __local uint* const mx = mma_x + warp * 192;
% if LDSM:
    __local int ldsm_x[WARPS * 32];            // the emulated ldmatrix's address exchange
    __local int* const lx = ldsm_x + warp * 32;
% endif
#endif

    // This work-item's rows of the activation tile: pixels arow + it * A_RSTEP, at its chunk
    // of 4 channels achunk; per pixel the float4 offset of its window's top-left tap (ih0, iw0
    // kept where the padding needs a check). A row past N*P*Q reads a real pixel instead; it
    // is never stored.
    const int achunk = tid % CH, arow = tid / CH;
    int xo[A_ITERS];
% if HCHK:
    int ih0[A_ITERS];
% endif
% if WCHK:
    int iw0[A_ITERS];
% endif
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
% if MCHK:
        const int m = min(m0 + arow + it * A_RSTEP, NPQ - 1);
% else:
        const int m = m0 + arow + it * A_RSTEP;
% endif
        const int img = m / PQ, pq = m % PQ;
        const int h0 = pq / Q * SH - PT, w0 = pq % Q * SW - PL;
        xo[it] = ((img * H + h0) * W + w0) * C4;
% if HCHK:
        ih0[it] = h0;
% endif
% if WCHK:
        iw0[it] = w0;
% endif
    }

    float acc[MI][NI][4];                      // mma tile (mi, ni) of this warp: c0..c3
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                acc[mi][ni][q] = 0.0f;

% if CPASYNC:
    // CPASYNC stages: steps 0 .. CPASYNC-2 in flight first, one commit group a step; at step kt
    // wait for its group, meet (everyone's copies landed, everyone done with stage kt - 1),
    // put step kt + CPASYNC - 1 in flight into that stage, multiply stage kt % CPASYNC
    #pragma unroll 1
    for (int st = 0; st < CPASYNC - 1; ++st) {
        if (st < KTILES)
${indent(capture(load_async, "st", "st"), 8)}\
        CP_COMMIT();
    }
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int nk = kt + CPASYNC - 1;
            if (nk < KTILES)
${indent(capture(load_async, "nk", "nk % CPASYNC"), 12)}\
            CP_COMMIT();
        }
${indent(capture(multiply, "kt % CPASYNC"), 8)}\
    }
% elif DBUF:
    float4 pa[A_ITERS], pb[B_ITERS];           // the next step, on its way to local memory
    // step 0 into buffer 0; then each step loads step kt+1 into registers, multiplies step
    // kt and stores step kt+1 into the other buffer: one barrier per step
${indent(capture(load_regs, "0"), 4)}\
${indent(capture(store_regs, "0"), 4)}\
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = 0; kt < KTILES; ++kt) {
        const int cur = kt & 1;
        if (kt + 1 < KTILES) {
${indent(capture(load_regs, "(kt + 1)"), 12)}\
        }
${indent(capture(multiply, "cur"), 8)}\
        if (kt + 1 < KTILES) {
${indent(capture(store_regs, "1 - cur"), 12)}\
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% else:
    float4 pa[A_ITERS], pb[B_ITERS];
    for (int kt = 0; kt < KTILES; ++kt) {
${indent(capture(load_regs, "kt"), 8)}\
${indent(capture(store_regs, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
${indent(capture(multiply, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif

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
    ${unroll}
    for (int mi = 0; mi < MI; ++mi) {
        barrier(CLK_LOCAL_MEM_FENCE);          // the last stage, or the last pass, read out
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            __local float* const e0 = ep + (wm * 16 + g) * ELD + wn * WTN + ni * 8 + 2 * t;
            *(__local float2*)e0 = (float2)(acc[mi][ni][0], acc[mi][ni][1]);
            *(__local float2*)(e0 + 8 * ELD) = (float2)(acc[mi][ni][2], acc[mi][ni][3]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int it = 0; it < E_ITERS; ++it) {
            const int sr = (tid + it * WG) / BN4;          // staged row: warp row sr / 16
            const int m = m0 + sr / 16 * WTM + mi * 16 + sr % 16;
% if ECHK:
            if (sr >= E_ROWS)
                break;
% endif
% if MCHK:
            if (m >= NPQ)
                continue;
% endif
% if NCHK:
            if (n >= K)
                continue;
% endif
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
        }
    }
}
% else:
    // epilogue: c[2h + j] of tile (mi, ni) is pixel g + 8h, channel 2t + j of the tile. In NHWC
    // pixel m's channels start at m * K: bias, ${"residual, " if residual else ""}activation, float stores
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + wm * WTM + mi * 16 + g + h * 8;
% if MCHK:
            if (m >= NPQ)
                continue;
% endif
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int n = n0 + wn * WTN + ni * 8 + 2 * t;
% if NCHK:
                if (n >= K)
                    continue;
% endif
% if PAIRS:
                // channels n, n + 1 (n even, K even): one float2 of bias, residual and output
                const int i2 = (m * K + n) / 2;
% if has_bias:
                const float2 b2 = ((__global const float2*)bias)[n / 2];
                float s0 = acc[mi][ni][2 * h] + b2.x, s1 = acc[mi][ni][2 * h + 1] + b2.y;
% else:
                float s0 = acc[mi][ni][2 * h], s1 = acc[mi][ni][2 * h + 1];
% endif
% if residual:
                const float2 r2 = ((__global const float2*)res)[i2];
                s0 += r2.x;
                s1 += r2.y;
% endif
                ((__global float2*)y)[i2] = (float2)(${act("s0")}, ${act("s1")});
% else:
                // K odd: channel by channel
                #pragma unroll
                for (int j = 0; j < 2; ++j) {
% if NCHK:
                    if (n + j >= K)
                        continue;
% endif
                    float s = acc[mi][ni][2 * h + j]${" + bias[n + j]" if has_bias else ""};
% if residual:
                    s += res[m * K + n + j];
% endif
                    y[m * K + n + j] = ${act("s")};
                }
% endif
            }
        }
}
% endif

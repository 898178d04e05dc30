<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import indent


def define(name, value, comment=""):
    line = "#define %-10s %s" % (name, value)
    return ("%-30s // %s" % (line, comment)) if comment else line
%>\
<%
    # the input tile's load: a tap in the padding reads 0 (HCHK, WCHK), a row past CRS in a
    # partial last K step reads 0 and nothing (KCHK: its channel would be past the input)
    terms = (["k < CRS"] if KCHK else []) + (["(uint)(ih0[j] + r * DH) < (uint)H"] if HCHK else []) \
        + (["(uint)(iw0[j] + s * DW) < (uint)W"] if WCHK else [])
    bcond = " && ".join(terms)
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    # the emulated mma holds two work-group barriers: unrolled, every one of them would split
    # PoCL's work-group function once more (minutes to compile); the tensor cores want the
    # fragments in registers, so the PTX loops unroll
    mma_unroll = "#pragma unroll 1" if EMULATE else "#pragma unroll"
%>\
// ${prefix}: convolution as an implicit GEMM on the tensor cores, TF32 products, FP32 sums (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}${", plus a fused residual" if residual else ""}; NCHW in and out
// Y[m][n] = sum_k W[m][k] * X[k][n] with M = K = ${M} output channels, N = N*P*Q = ${NPQ} output
//   pixels, k = (c, r, s) over C*R*S = ${CRS}; X (im2col of the input) is read in place.
// A work-group of WM x WN warps computes a BM x BN tile; each warp its WTM x WTN part as
// MI x NI tiles of mma.sync m16n8k8 (16 x 8 outputs, 8 deep). Operands are rounded to TF32
// on their way to local memory (the weights once, when packed); the sums stay FP32.

// -- tunables
${define("BM", BM, "tile in M (output channels) per work-group")}
${define("BN", BN, "tile in N (output pixels) per work-group")}
${define("BK", BK, "reduction step held in local memory")}
${define("WM", WM, "warps along M")}
${define("WN", WN, "warps along N")}
${define("PAD", PAD, "floats of padding per local row")}
${define("DBUF", DBUF, "load step k+1 into registers during step k")}
${define("WG", WG, "work-items: 32 per warp")}
${define("WARPS", WARPS)}
${define("WTM", WTM, "rows of a warp's tile (BM / WM)")}
${define("WTN", WTN, "columns of a warp's tile (BN / WN)")}
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
${define("M", M, "output channels")}
${define("PQ", "(P * Q)")}
${define("NPQ", NPQ, "output pixels (N)")}
${define("CRS", CRS, "reduction length")}
${define("CRSP", CRSP, "... padded to whole BK steps")}
${define("MP", MP, "M padded to whole BM tiles")}
${define("KTILES", "(CRSP / BK)")}
// local memory: weight tiles [BK][LDA] (k-major), input tiles [BK][LDB], NBUF of each
${define("LDA", LDA)}
${define("LDB", LDB)}
${define("A_SIZE", "(BK * LDA)")}
${define("B_SIZE", "(BK * LDB)")}
${define("NBUF", 2 if DBUF else 1)}
// the weight load: A_ITERS float4 per work-item; the input load: BCOLS columns and BROWS
// rows, B_ROWSTEP apart, per work-item
${define("A_ITERS", A_ITERS)}
${define("BCOLS", BCOLS)}
${define("BROWS", BROWS)}
${define("B_ROWSTEP", B_ROWSTEP)}
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable mma even on NVIDIA
% endif
// -- the tensor-core multiply and TF32 rounding: inline PTX where the compiler is NVIDIA's,
// an exact emulation elsewhere (or with AOTCONV_MMA_EMULATE defined)
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

// d[0..3] += A (16 x 8, fragments a[0..3]) * B (8 x 8, fragments b[0..1]), one warp
#define MMA_TF32(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]) \
                 : "r"(as_uint((a)[0])), "r"(as_uint((a)[1])), "r"(as_uint((a)[2])), \
                   "r"(as_uint((a)[3])), "r"(as_uint((b)[0])), "r"(as_uint((b)[1])))
#else
// round to the nearest TF32 (10 mantissa bits), ties away from zero, as cvt.rna.tf32.f32:
// adding half an ulp of TF32 to the magnitude carries into the kept bits exactly when the
// dropped ones are at least half; infinities and NaNs pass unchanged
inline float tf32(float x)
{
    const uint u = as_uint(x);
    return (u & 0x7f800000u) == 0x7f800000u ? x : as_float((u + 0x1000u) & 0xffffe000u);
}

// The warp's fragments meet in its 192 floats of local memory `mx` (A 16 x 8 row-major, then
// B 8 x 8 k-major) in the layout of the PTX ISA; lane (g, t) then computes its outputs
// c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). The barriers span the work-group:
// every work-item reaches every mma, in the same order.
#define MMA_TF32(d, a, b) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    mx[g * 8 + t] = (a)[0]; \
    mx[(g + 8) * 8 + t] = (a)[1]; \
    mx[g * 8 + t + 4] = (a)[2]; \
    mx[(g + 8) * 8 + t + 4] = (a)[3]; \
    mx[128 + t * 8 + g] = (b)[0]; \
    mx[128 + (t + 4) * 8 + g] = (b)[1]; \
    barrier(CLK_LOCAL_MEM_FENCE); \
    for (int q_ = 0; q_ < 4; ++q_) { \
        const int r_ = g + (q_ >> 1) * 8, c_ = 2 * t + (q_ & 1); \
        float s_ = (d)[q_]; \
        for (int k_ = 0; k_ < 8; ++k_) \
            s_ = fma(tf32(mx[r_ * 8 + k_]), tf32(mx[128 + k_ * 8 + c_]), s_); \
        (d)[q_] = s_; \
    } \
} while (0)
#endif

// Weights [K][C][R][S] -> k-major [CRSP][MP], rounded to TF32, zero outside the layer (run once).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const float* restrict w, __global float* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= CRSP * MP)
        return;
    const int m = i % MP, k = i / MP;
    wp[i] = m < M && k < CRS ? tf32(w[m * CRS + k]) : 0.0f;
}
<%def name="load_tile(kt)">\
// weights: BK x BM, float4 vectors, no checks (packed and padded)
#pragma unroll
for (int it = 0; it < A_ITERS; ++it) {
    const int e = tid + it * WG;
    pa[it] = *(__global const float4*)(wp + (${kt} * BK + e / (BM / 4)) * MP + m0 + e % (BM / 4) * 4);
}
// input: BK x BN of the implicit im2col matrix, rounded to TF32
#pragma unroll
for (int tr = 0; tr < BROWS; ++tr) {
    const int k = ${kt} * BK + brow + tr * B_ROWSTEP;
    const int c = k / (R * S), rs = k % (R * S);
    const int r = rs / S, s = rs % S;
    const int off = c * (H * W) + r * (DH * W) + s * DW;
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j)
% if bcond:
        pb[tr][j] = (${bcond}) ? tf32(x[xo[j] + off]) : 0.0f;
% else:
        pb[tr][j] = tf32(x[xo[j] + off]);
% endif
}
</%def>\
<%def name="store_tile(buf)">\
{
    __local float* const as = Abuf + (${buf}) * A_SIZE;
    __local float* const bs = Bbuf + (${buf}) * B_SIZE;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
        const int e = tid + it * WG;
        *(__local float4*)(as + e / (BM / 4) * LDA + e % (BM / 4) * 4) = pa[it];
    }
    #pragma unroll
    for (int tr = 0; tr < BROWS; ++tr)
        #pragma unroll
        for (int j = 0; j < BCOLS; ++j)
            bs[(brow + tr * B_ROWSTEP) * LDB + bcol + j * WG] = pb[tr][j];
}
</%def>\
<%def name="multiply(buf)">\
{
    // this lane's fragments start at row t of the step, column g of its warp's tile
    __local const float* const as = Abuf + (${buf}) * A_SIZE + t * LDA + wm * WTM + g;
    __local const float* const bs = Bbuf + (${buf}) * B_SIZE + t * LDB + wn * WTN + g;
    ${mma_unroll}
    for (int ks = 0; ks < BK / 8; ++ks) {
        float af[MI][4], bf[NI][2];
        ${mma_unroll}
        for (int mi = 0; mi < MI; ++mi) {
            __local const float* const p = as + ks * 8 * LDA + mi * 16;
            af[mi][0] = p[0];                 // (g,     t)
            af[mi][1] = p[8];                 // (g + 8, t)
            af[mi][2] = p[4 * LDA];           // (g,     t + 4)
            af[mi][3] = p[4 * LDA + 8];       // (g + 8, t + 4)
        }
        ${mma_unroll}
        for (int ni = 0; ni < NI; ++ni) {
            __local const float* const q = bs + ks * 8 * LDB + ni * 8;
            bf[ni][0] = q[0];                 // (t,     g)
            bf[ni][1] = q[4 * LDB];           // (t + 4, g)
        }
        ${mma_unroll}
        for (int mi = 0; mi < MI; ++mi)
            ${mma_unroll}
            for (int ni = 0; ni < NI; ++ni)
                MMA_TF32(acc[mi][ni], af[mi], bf[ni]);
    }
}
</%def>\

// One work-group: a BM x BN tile of Y; a 1-D work-group of WG work-items, warp w = tid / 32 at
// (w % WM, w / WM) in the WM x WN grid of warps.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const float* restrict x, __global const float* restrict wp,
% if has_bias:
               __global const float* restrict bias,
% endif
% if residual:
               __global const float* restrict res,     // the fused add's other input
% endif
               __global float* restrict y)
{
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;     // groupID, threadID_in_group
    const int wm = warp % WM, wn = warp / WM;
    const int n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;

    // declared as float4: the vector stores of the weight tile stay aligned
    __local float4 Abuf4[NBUF * A_SIZE / 4];
    __local float4 Bbuf4[(NBUF * B_SIZE + 3) / 4];
    __local float* const Abuf = (__local float*)Abuf4;
    __local float* const Bbuf = (__local float*)Bbuf4;
#ifndef MMA_PTX
    __local float mma_x[WARPS * 192];          // the emulated mma's fragment exchange
    __local float* const mx = mma_x + warp * 192;
#endif

    // Where this work-item loads the input tile: columns bcol + j * WG, rows brow + tr *
    // B_ROWSTEP; per column the offset of its window's top-left tap (ih0, iw0 kept where the
    // padding needs a check). A column past N reads a real pixel instead; it is never stored.
    const int bcol = tid % BN, brow = tid / BN;
    int xo[BCOLS];
% if HCHK:
    int ih0[BCOLS];
% endif
% if WCHK:
    int iw0[BCOLS];
% endif
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j) {
% if NCHK:
        const int n = min(n0 + bcol + j * WG, NPQ - 1);
% else:
        const int n = n0 + bcol + j * WG;
% endif
        const int img = n / PQ, pq = n % PQ;
        const int h0 = pq / Q * SH - PT, w0 = pq % Q * SW - PL;
        xo[j] = img * (C * H * W) + h0 * W + w0;
% if HCHK:
        ih0[j] = h0;
% endif
% if WCHK:
        iw0[j] = w0;
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
    float4 pa[A_ITERS];                        // the next step, on its way to local memory
    float pb[BROWS][BCOLS];

% if DBUF:
    // step 0 into buffer 0; then each step loads step kt+1 into registers, multiplies step
    // kt and stores step kt+1 into the other buffer: one barrier per step
${indent(capture(load_tile, "0"), 4)}\
${indent(capture(store_tile, "0"), 4)}\
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = 0; kt < KTILES; ++kt) {
        const int cur = kt & 1;
        if (kt + 1 < KTILES) {
${indent(capture(load_tile, "(kt + 1)"), 12)}\
        }
${indent(capture(multiply, "cur"), 8)}\
        if (kt + 1 < KTILES) {
${indent(capture(store_tile, "1 - cur"), 12)}\
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% else:
    for (int kt = 0; kt < KTILES; ++kt) {
${indent(capture(load_tile, "kt"), 8)}\
${indent(capture(store_tile, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
${indent(capture(multiply, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif

    // epilogue: c[2h + j] of tile (mi, ni) is row g + 8h, column 2t + j of the tile; bias,
    // ${"residual, " if residual else ""}activation, NCHW stores; partial tiles guarded
    #pragma unroll
    for (int ni = 0; ni < NI; ++ni)
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + wn * WTN + ni * 8 + 2 * t + j;
% if NCHK:
            if (n >= NPQ)
                continue;
% endif
            const int yo = n / PQ * (K * PQ) + n % PQ;
            #pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int m = m0 + wm * WTM + mi * 16 + g + h * 8;
% if MCHK:
                    if (m >= M)
                        continue;
% endif
                    float s = acc[mi][ni][2 * h + j]${" + bias[m]" if has_bias else ""};
% if residual:
                    s += res[yo + m * PQ];
% endif
                    y[yo + m * PQ] = ${c.act(attrs["act"], attrs["alpha"], "s")};
                }
        }
}

<%namespace name="c" file="_common.mako"/>\
<%namespace name="mf" file="_mma_f16.mako"/>\
<%!
from aotconv.variants.kernel_text import indent


def define(name, value, comment=""):
    line = "#define %-10s %s" % (name, value)
    return ("%-30s // %s" % (line, comment)) if comment else line
%>\
<%
    # the input tile's load, per half of a word (k0 = k, k1 = k + 1): a tap in the padding
    # reads 0 (HCHK, WCHK), a k past CRS in a partial last K step reads 0 and nothing (KCHK:
    # its channel would be past the input)
    def bcond(i):
        terms = (["k + 1 < CRS" if i else "k < CRS"] if KCHK else []) \
            + ([f"(uint)(ih0[j] + r{i} * DH) < (uint)H"] if HCHK else []) \
            + ([f"(uint)(iw0[j] + s{i} * DW) < (uint)W"] if WCHK else [])
        return " && ".join(terms)
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    # the emulated mma holds two work-group barriers: unrolled, every one of them would split
    # PoCL's work-group function once more (minutes to compile); the tensor cores want the
    # fragments in registers, so the PTX loops unroll
    mma_unroll = "#pragma unroll 1" if EMULATE else "#pragma unroll"
%>\
// ${prefix}: convolution as an implicit GEMM on the tensor cores, half operands as stored, FP32 sums (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}${", plus a fused residual" if residual else ""}; NCHW in and out, half storage
// Y[m][n] = sum_k W[m][k] * X[k][n] with M = K = ${M} output channels, N = N*P*Q = ${NPQ} output
//   pixels, k = (c, r, s) over C*R*S = ${CRS}; X (im2col of the input) is read in place.
// A work-group of WM x WN warps computes a BM x BN tile; each warp its WTM x WTN part as
// MI x NI tiles of mma.sync m16n8k16 .f16 (16 x 8 outputs, 16 deep, FP32 accumulators).
// Halves travel as their bits (ushort): two consecutive in k make one uint word, the low
// half first (an .f16x2 register); the local tiles hold such words.

// -- tunables
${define("BM", BM, "tile in M (output channels) per work-group")}
${define("BN", BN, "tile in N (output pixels) per work-group")}
${define("BK", BK, "reduction step (halves) held in local memory")}
${define("WM", WM, "warps along M")}
${define("WN", WN, "warps along N")}
${define("PAD", PAD, "words of padding per local row")}
${define("DBUF", DBUF, "load step k+1 into registers during step k")}
% if EPI:
${define("EPI", EPI, "epilogue staged in local memory, 16-byte stores")}
% endif
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
${define("KP", "(BK / 2)", "word rows of a step: k pairs")}
// local memory: weight tiles [KP][LDA] (k-pair-major), input tiles [KP][LDB], NBUF of each,
// in words of two halves (half the bytes of float tiles)
${define("LDA", LDA)}
${define("LDB", LDB)}
${define("A_SIZE", "(KP * LDA)")}
${define("B_SIZE", "(KP * LDB)")}
${define("NBUF", 2 if DBUF else 1)}
// the weight load: A_ITERS uint4 per work-item; the input load: BCOLS columns and BROWS
// word rows, B_ROWSTEP apart, per work-item
${define("A_ITERS", A_ITERS)}
${define("BCOLS", BCOLS)}
${define("BROWS", BROWS)}
${define("B_ROWSTEP", B_ROWSTEP)}
% if EPI:
// the staged epilogue (EPI = 1): MI passes; in pass mi every warp puts its accumulators of rows
// (channels) mi * 16 .. mi * 16 + 15 of its tile, FP32, in rows wm * 16 .. of a
// [WM * 16][ELD] float tile (columns: the BN pixels), which then goes out 8 pixels of one
// channel a 16-byte vector. ELD = BN + 8 = 8 (mod 32) words: a half-warp's float2 writes (rows
// g = 0..3, words 2t, 2t + 1) take 32 banks, and so do a quarter-warp's float4 reads (8
// lanes, one 8-float chunk each, lanes 4-7 of the 8 reading their second float4 first). The
// tiles and the staged pass share one array of SMEM words.
${define("ELD", ELD, "floats per row of the staged tile")}
${define("E_ROWS", "(WM * 16)", "channels staged per pass")}
${define("BN8", "(BN / 8)", "16-byte output vectors per channel of the tile")}
${define("E_VECS", "(E_ROWS * BN8)", "16-byte vectors per pass")}
${define("E_ITERS", E_ITERS, "... per work-item, rounded up")}
${define("SMEM", SMEM, "words of local memory: the tiles, or a pass where larger")}
% endif
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable mma even on NVIDIA
% endif
// -- the tensor-core multiply: inline PTX where the compiler is NVIDIA's, an exact emulation
// elsewhere (or with AOTCONV_MMA_EMULATE defined)
#if (defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)) && !defined(AOTCONV_MMA_EMULATE)
#define MMA_PTX 1
#endif

#ifdef MMA_PTX
${mf.ptx()}\
% if EPI or FLOAT_IN:
// 16 bytes of a read-only global buffer as four words, one vector load (a plain uint4 load
// whose words are used one by one is split into four by the compiler)
#define LDG16(w0, w1, w2, w3, p) asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" \
    : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "l"(p))
// two floats rounded to halves (to nearest even) in one word, lo in the low bits (cvt.rn
// .f16x2.f32 puts its first source in the high half), and the two halves of a word as floats
#define PACK_HALF2_RTE(w, lo, hi) asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(w) : "f"(lo), "f"(hi))
#define UNPACK_HALF2(lo, hi, w) \
    asm("{\n\t.reg .b16 l_, h_;\n\tmov.b32 {l_, h_}, %2;\n\t" \
        "cvt.f32.f16 %0, l_;\n\tcvt.f32.f16 %1, h_;\n\t}" : "=f"(lo), "=f"(hi) : "r"(w))
% endif
#else
${mf.emulated()}\
% if EPI or FLOAT_IN:
// a plain uint4 load, and the conversions of cvt.rn.f16x2.f32 and cvt.f32.f16, exactly
#define LDG16(w0, w1, w2, w3, p) do { \
    const uint4 u_ = *(p); \
    (w0) = u_.x; (w1) = u_.y; (w2) = u_.z; (w3) = u_.w; \
} while (0)
#define PACK_HALF2_RTE(w, lo, hi) vstore_half2_rte((float2)(lo, hi), 0, (__private half*)&(w))
#define UNPACK_HALF2(lo, hi, w) do { \
    (lo) = half_bits((w) & 0xffffu); \
    (hi) = half_bits((w) >> 16); \
} while (0)
% endif
#endif
% if EPI:

// the 8 halves at p (16 bytes: pixel j in bits 16 (j % 2) of word j / 2) as floats, and 8
// floats rounded to halves (to nearest even) as a uint4: the staged epilogue's global
// accesses are 16-byte vectors, converted in registers
inline float8 load_half8(__global const uint4* p)
{
    uint w0, w1, w2, w3;
    float f0, f1, f2, f3, f4, f5, f6, f7;
    LDG16(w0, w1, w2, w3, p);
    UNPACK_HALF2(f0, f1, w0);
    UNPACK_HALF2(f2, f3, w1);
    UNPACK_HALF2(f4, f5, w2);
    UNPACK_HALF2(f6, f7, w3);
    return (float8)(f0, f1, f2, f3, f4, f5, f6, f7);
}

inline uint4 pack_half8_rte(float8 v)
{
    uint w0, w1, w2, w3;
    PACK_HALF2_RTE(w0, v.s0, v.s1);
    PACK_HALF2_RTE(w1, v.s2, v.s3);
    PACK_HALF2_RTE(w2, v.s4, v.s5);
    PACK_HALF2_RTE(w3, v.s6, v.s7);
    return (uint4)(w0, w1, w2, w3);
}
% endif

// Weights [K][C][R][S] (half bits) -> words [CRSP / 2][MP], k-pair-major: word (kp, m) holds
// w[m][2 kp] low and w[m][2 kp + 1] high, zero outside the layer (run once; exact).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ushort* restrict w, __global uint* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= CRSP / 2 * MP)
        return;
    const int m = i % MP, k = i / MP * 2;
    const uint lo = m < M && k < CRS ? w[m * CRS + k] : 0u;
    const uint hi = m < M && k + 1 < CRS ? w[m * CRS + k + 1] : 0u;
    wp[i] = lo | hi << 16;
}
<%def name="load_tile(kt)">\
// weights: KP x BM words, uint4 vectors, no checks (packed and padded)
#pragma unroll
for (int it = 0; it < A_ITERS; ++it) {
    const int e = tid + it * WG;
    pa[it] = *(__global const uint4*)(wp + (${kt} * KP + e / (BM / 4)) * MP + m0 + e % (BM / 4) * 4);
}
// input: KP x BN words of the implicit im2col matrix, rows k and k + 1 of a column in one
#pragma unroll
for (int tr = 0; tr < BROWS; ++tr) {
    const int k = ${kt} * BK + 2 * (brow + tr * B_ROWSTEP);
    const int c0 = k / (R * S), rs0 = k % (R * S);
    const int r0 = rs0 / S, s0 = rs0 % S;
    const int c1 = (k + 1) / (R * S), rs1 = (k + 1) % (R * S);
    const int r1 = rs1 / S, s1 = rs1 % S;
    const int off0 = c0 * (H * W) + r0 * (DH * W) + s0 * DW;
    const int off1 = c1 * (H * W) + r1 * (DH * W) + s1 * DW;
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j) {
% if FLOAT_IN:
        // the network's float input, rounded to half as the cast it replaces would round it
        const float lo = ${"(%s) ? x[xo[j] + off0] : 0.0f" % bcond(0) if bcond(0) else "x[xo[j] + off0]"};
        const float hi = ${"(%s) ? x[xo[j] + off1] : 0.0f" % bcond(1) if bcond(1) else "x[xo[j] + off1]"};
        PACK_HALF2_RTE(pb[tr][j], lo, hi);
% else:
% if bcond(0):
        const uint lo = (${bcond(0)}) ? x[xo[j] + off0] : 0u;
% else:
        const uint lo = x[xo[j] + off0];
% endif
% if bcond(1):
        const uint hi = (${bcond(1)}) ? x[xo[j] + off1] : 0u;
% else:
        const uint hi = x[xo[j] + off1];
% endif
        pb[tr][j] = lo | hi << 16;
% endif
    }
}
</%def>\
<%def name="store_tile(buf)">\
{
    __local uint* const as = Abuf + (${buf}) * A_SIZE;
    __local uint* const bs = Bbuf + (${buf}) * B_SIZE;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
        const int e = tid + it * WG;
        *(__local uint4*)(as + e / (BM / 4) * LDA + e % (BM / 4) * 4) = pa[it];
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
    // this lane's fragments start at word row t of the step, column g of its warp's tile
    __local const uint* const as = Abuf + (${buf}) * A_SIZE + t * LDA + wm * WTM + g;
    __local const uint* const bs = Bbuf + (${buf}) * B_SIZE + t * LDB + wn * WTN + g;
    ${mma_unroll}
    for (int ks = 0; ks < BK / 16; ++ks) {
        uint af[MI][4], bf[NI][2];
        ${mma_unroll}
        for (int mi = 0; mi < MI; ++mi) {
            __local const uint* const p = as + ks * 8 * LDA + mi * 16;
            af[mi][0] = p[0];                 // (g,     2t..2t+1)
            af[mi][1] = p[8];                 // (g + 8, 2t..2t+1)
            af[mi][2] = p[4 * LDA];           // (g,     2t+8..2t+9)
            af[mi][3] = p[4 * LDA + 8];       // (g + 8, 2t+8..2t+9)
        }
        ${mma_unroll}
        for (int ni = 0; ni < NI; ++ni) {
            __local const uint* const q = bs + ks * 8 * LDB + ni * 8;
            bf[ni][0] = q[0];                 // (2t..2t+1,     g)
            bf[ni][1] = q[4 * LDB];           // (2t+8..2t+9,   g)
        }
        ${mma_unroll}
        for (int mi = 0; mi < MI; ++mi)
            ${mma_unroll}
            for (int ni = 0; ni < NI; ++ni)
                MMA_F16(acc[mi][ni], af[mi], bf[ni]);
    }
}
</%def>\

// One work-group: a BM x BN tile of Y; a 1-D work-group of WG work-items, warp w = tid / 32 at
// (w % WM, w / WM) in the WM x WN grid of warps.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${"float" if FLOAT_IN else "ushort"}* restrict x, __global const uint* restrict wp,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input
% endif
               __global ${c.T()}* restrict y)
{
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;     // groupID, threadID_in_group
    const int wm = warp % WM, wn = warp / WM;
    const int n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;

% if EPI:
    // the tiles, then the staged epilogue; declared as uint4: the vector stores of the weight
    // tile stay aligned
    __local uint4 smem4[SMEM / 4];
    __local uint* const Abuf = (__local uint*)smem4;
    __local uint* const Bbuf = Abuf + NBUF * A_SIZE;
% else:
    // declared as uint4: the vector stores of the weight tile stay aligned
    __local uint4 Abuf4[NBUF * A_SIZE / 4];
    __local uint4 Bbuf4[(NBUF * B_SIZE + 3) / 4];
    __local uint* const Abuf = (__local uint*)Abuf4;
    __local uint* const Bbuf = (__local uint*)Bbuf4;
% endif
#ifndef MMA_PTX
    __local uint mma_x[WARPS * 192];           // the emulated mma's fragment exchange
    __local uint* const mx = mma_x + warp * 192;
#endif

    // Where this work-item loads the input tile: columns bcol + j * WG, word rows brow + tr *
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
    uint4 pa[A_ITERS];                         // the next step, on its way to local memory
    uint pb[BROWS][BCOLS];

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

% if EPI:
    // epilogue, staged: c[2h + j] of tile (mi, ni) is row (channel) g + 8h, column (pixel)
    // 2t + j of the tile. Pass mi stages rows mi * 16 .. of every warp's part (FP32, as
    // accumulated), then the work-group stores those channels 8 pixels at a time: with
    // P*Q % 8 == 0, 8 pixels of the tile are 8 consecutive halves of one channel plane of one
    // image, one uint4 of the output (and of the residual). Bias, ${"residual, " if residual else ""}activation and
    // rounding as the direct epilogue does them, per element. BN8 divides the work-group, so a
    // work-item's 8 pixels are the same in every vector it stores, and so is the half of them
    // it reads first (lanes 4-7 of each 8: the second, for the bank analysis above).
    __local float* const ep = (__local float*)smem4;
    const int ec = tid % BN8, n = n0 + ec * 8, eh = (tid >> 2) & 1;
    const int yo = n / PQ * (K * PQ) + n % PQ;         // pixel n of channel 0: a multiple of 8
    ${mma_unroll}
    for (int mi = 0; mi < MI; ++mi) {
        barrier(CLK_LOCAL_MEM_FENCE);          // the last tiles, or the last pass, read out
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            __local float* const e0 = ep + (wm * 16 + g) * ELD + wn * WTN + ni * 8 + 2 * t;
            *(__local float2*)e0 = (float2)(acc[mi][ni][0], acc[mi][ni][1]);
            *(__local float2*)(e0 + 8 * ELD) = (float2)(acc[mi][ni][2], acc[mi][ni][3]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int it = 0; it < E_ITERS; ++it) {
            const int sr = (tid + it * WG) / BN8;          // staged row: warp row sr / 16
            const int m = m0 + sr / 16 * WTM + mi * 16 + sr % 16;
% if ECHK:
            if (sr >= E_ROWS)
                break;
% endif
% if MCHK:
            if (m >= M)
                continue;
% endif
% if NCHK:
            if (n >= NPQ)
                continue;
% endif
            const int i8 = (yo + m * PQ) / 8;
            __local const float4* const p = (__local const float4*)(ep + sr * ELD + ec * 8);
            const float4 f0 = p[eh], f1 = p[1 - eh];
            float8 s = eh ? (float8)(f1, f0) : (float8)(f0, f1);
% if has_bias:
            s += ${c.LOAD("bias", "m")};
% endif
% if residual:
            s += load_half8((__global const uint4*)res + i8);
% endif
% if attrs["act"] == "none":
            ((__global uint4*)y)[i8] = pack_half8_rte(s);
% else:
            const float8 o = (float8)(${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4))},
                                      ${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4, 8))});
            ((__global uint4*)y)[i8] = pack_half8_rte(o);
% endif
        }
    }
% else:
% if PAIRS:
    // epilogue: c[2h + j] of tile (mi, ni) is row g + 8h, column 2t + j of the tile; the two
    // columns of a lane are neighbouring pixels of one image (P*Q and 2t are even), so each
    // pair is read and stored as one half2: bias, ${"residual, " if residual else ""}activation
    #pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + wn * WTN + ni * 8 + 2 * t;
% if NCHK:
        if (n >= NPQ)
            continue;
% endif
        const int yo = n / PQ * (K * PQ) + n % PQ;     // even
        #pragma unroll
        for (int mi = 0; mi < MI; ++mi)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm * WTM + mi * 16 + g + h * 8;
% if MCHK:
                if (m >= M)
                    continue;
% endif
                const int i2 = (yo + m * PQ) / 2;
% if has_bias:
                const float b = ${c.LOAD("bias", "m")};
                float s0 = acc[mi][ni][2 * h] + b, s1 = acc[mi][ni][2 * h + 1] + b;
% else:
                float s0 = acc[mi][ni][2 * h], s1 = acc[mi][ni][2 * h + 1];
% endif
% if residual:
                const float2 r2 = ${c.LOADV(2, "res", "i2")};
                s0 += r2.x;
                s1 += r2.y;
% endif
                ${c.STOREV(2, "y", "i2", "(float2)(%s, %s)" % tuple(capture(c.act, attrs["act"], attrs["alpha"], v).strip() for v in ("s0", "s1")))};
            }
    }
% else:
    // epilogue: c[2h + j] of tile (mi, ni) is row g + 8h, column 2t + j of the tile; bias,
    // ${"residual, " if residual else ""}activation, NCHW half stores; partial tiles guarded
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
                    float s = acc[mi][ni][2 * h + j]${(" + " + capture(c.LOAD, "bias", "m")) if has_bias else ""};
% if residual:
                    s += ${c.LOAD("res", "yo + m * PQ")};
% endif
                    ${c.STORE("y", "yo + m * PQ", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
                }
        }
% endif
% endif
}

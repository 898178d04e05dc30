<%namespace name="c" file="_common.mako"/>\
<%namespace name="mf" file="_mma_f16.mako"/>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    # the emulated mma holds two work-group barriers: unrolled, every one of them would split
    # PoCL's work-group function once more; the tensor cores want the fragments in registers
    unroll = "#pragma unroll 1" if EMULATE else "#pragma unroll"
    # the steps: a few (a 3x3 over 3 channels has 2) unroll whole; a 7x7's 10 stay a loop
    ks_unroll = "#pragma unroll 1" if EMULATE or KS > 4 else "#pragma unroll"
%>\
// ${prefix}: ${layer.op} on the tensor cores, NCHW ${"float in (rounded to half as read)" if FLOAT_IN else "half in"} -> NHWC half out, FP32 sums (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left ${PT}/${PL}, dilation ${DH}x${DW}, bias ${"yes" if HAS_BIAS else "no"}, act ${act_kind}
// Y[m][n] = sum_k X[m][k] W[n][k]: M = ${M} output pixels, N = K = ${K} channels,
//   k = (c, r, s) over C*R*S = ${CRS} in ${KS} steps of 16; A gathered from the input per element.
#define NT ${NT}              // tiles of 8 output channels per warp
#define MT ${MT}              // tiles of 16 output pixels per warp
#define WARPS ${WARPS}           // warps per work-group
#define WG ${WG}
#define BN ${BN}             // output channels per work-group
#define ROWS ${ROWS}           // output pixels per work-group
// ---- the layer (all sizes compile-time constants) ----
#define C ${C}
#define H ${H}
#define W ${W}
#define K ${K}
#define P ${P}
#define Q ${Q}
#define R ${R}
#define S ${S}
#define SH ${SH}
#define SW ${SW}
#define PT ${PT}
#define PL ${PL}
#define DH ${DH}
#define DW ${DW}
#define M ${M}             // output pixels
#define CRS ${CRS}            // reduction length
#define KS ${KS}              // 16-deep steps
#define NPT ${NPT}             // 8-channel tiles of the packed weights (K padded to whole BN)
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable mma even on NVIDIA
% endif
#if (defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)) && !defined(AOTCONV_MMA_EMULATE)
#define MMA_PTX 1
#endif

#ifdef MMA_PTX
${mf.ptx()}\
#else
${mf.emulated()}\
#endif

// two floats rounded to halves (to nearest even) as one word, the first in the low 16 bits
#define PACK_HALF2_RTE(w, lo, hi) vstore_half2_rte((float2)(lo, hi), 0, (__private half*)&(w))

// Weights [K][C][R][S] (half bits) -> the B fragments [KS][NPT][32 lanes][2 words]: word j of
// lane (g, t) in step ks, n-tile nt holds channel nt*8 + g at k = ks*16 + 2t + 8j (low) and
// k + 1 (high), zero past the layer (run once; exact).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ushort* restrict w, __global uint* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= KS * NPT * 64)
        return;
    const int j = i & 1, lane = (i >> 1) & 31, tile = i >> 6;
    const int n = tile % NPT * 8 + (lane >> 2), k = tile / NPT * 16 + 2 * (lane & 3) + 8 * j;
    const uint lo = n < K && k < CRS ? w[n * CRS + k] : 0u;
    const uint hi = n < K && k + 1 < CRS ? w[n * CRS + k + 1] : 0u;
    wp[i] = lo | hi << 16;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${"float" if FLOAT_IN else "ushort"}* restrict x, __global const uint2* restrict wp,
% if HAS_BIAS:
               const __global ${c.T()}* restrict bias,
% endif
               __global ${c.T()}* restrict y)
{
    const int tid = get_local_id(0), lane = tid % 32, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = get_group_id(1) * NT;                  // the work-group's first n-tile
    const int m0 = get_group_id(0) * ROWS + warp * (MT * 16);
#ifndef MMA_PTX
    __local uint mma_x[WARPS * 192];           // the emulated mma's fragment exchange
    __local uint* const mx = mma_x + warp * 192;
#endif
    // each k's input offset and tap; a k past C*R*S gets a row offset no pixel's row brings
    // into the image, so it reads zero like a tap in the padding
    __local int koff[KS * 16], kdy[KS * 16], kdx[KS * 16];
    for (int k = tid; k < KS * 16; k += WG) {
        const int r = k / S % R, s = k % S;
        koff[k] = k / (R * S) * (H * W) + r * DH * W + s * DW;
        kdy[k] = k < CRS ? r * DH : -(1 << 24);
        kdx[k] = s * DW;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    // the lane's pixel rows g and g + 8 of each tile: the input row and column of the
    // window's corner and its offset (a row past M reads the last pixel and is never stored)
    int ih[MT][2], iw[MT][2], xb[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = min(m0 + mt * 16 + g + 8 * h, M - 1);
            ih[mt][h] = m / Q % P * SH - PT;
            iw[mt][h] = m % Q * SW - PL;
            xb[mt][h] = m / (P * Q) * (C * H * W) + ih[mt][h] * W + iw[mt][h];
        }

    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                acc[mt][nt][q] = 0.0f;

    ${ks_unroll}
    for (int ks = 0; ks < KS; ++ks) {
        uint b[NT][2];
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint2 v = wp[(ks * NPT + nt0 + nt) * 32 + lane];
            b[nt][0] = v.x;
            b[nt][1] = v.y;
        }
        // the lane's k of the step: 2t, 2t + 1 (registers a0 a1) and 2t + 8, 2t + 9 (a2 a3)
        int o[4], dy[4], dx[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = ks * 16 + 2 * t + (j & 1) + 8 * (j >> 1);
            o[j] = koff[k];
            dy[j] = kdy[k];
            dx[j] = kdx[k];
        }
        uint a[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
% if FLOAT_IN:
            float v[2][4];
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    v[h][j] = (uint)(ih[mt][h] + dy[j]) < (uint)H
                              && (uint)(iw[mt][h] + dx[j]) < (uint)W ? x[xb[mt][h] + o[j]] : 0.0f;
            PACK_HALF2_RTE(a[mt][0], v[0][0], v[0][1]);  // row g,     k 2t, 2t + 1
            PACK_HALF2_RTE(a[mt][1], v[1][0], v[1][1]);  // row g + 8, k 2t, 2t + 1
            PACK_HALF2_RTE(a[mt][2], v[0][2], v[0][3]);  // row g,     k 2t + 8, 2t + 9
            PACK_HALF2_RTE(a[mt][3], v[1][2], v[1][3]);  // row g + 8, k 2t + 8, 2t + 9
% else:
            uint v[2][4];
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    v[h][j] = (uint)(ih[mt][h] + dy[j]) < (uint)H
                              && (uint)(iw[mt][h] + dx[j]) < (uint)W ? x[xb[mt][h] + o[j]] : 0u;
            a[mt][0] = v[0][0] | v[0][1] << 16;          // row g,     k 2t, 2t + 1
            a[mt][1] = v[1][0] | v[1][1] << 16;          // row g + 8, k 2t, 2t + 1
            a[mt][2] = v[0][2] | v[0][3] << 16;          // row g,     k 2t + 8, 2t + 9
            a[mt][3] = v[1][2] | v[1][3] << 16;          // row g + 8, k 2t + 8, 2t + 9
% endif
        }
        ${unroll}
        for (int mt = 0; mt < MT; ++mt)
            ${unroll}
            for (int nt = 0; nt < NT; ++nt)
                MMA_F16(acc[mt][nt], a[mt], b[nt]);
    }

    // ---- epilogue: bias, activation, halves; accumulator q of lane (g, t) is pixel row
    // g + 8 (q >> 1), channel 2t + (q & 1) of its tile ----
% if STAGE:
    // a warp's 16 x BN tile through local memory, rows BN + 8 halves apart, stored as 16-byte
    // vectors of 8 channels
    __local uint4 stage4[WARPS * ${STAGE // 8}];
    __local uint* const st = (__local uint*)stage4 + warp * ${STAGE // 2};
% endif
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int n = (nt0 + nt) * 8 + 2 * t;
% if HAS_BIAS:
            const float b0 = n < K ? ${c.LOAD("bias", "n")} : 0.0f;
            const float b1 = n < K ? ${c.LOAD("bias", "n + 1")} : 0.0f;
% else:
            const float b0 = 0.0f, b1 = 0.0f;
% endif
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint word;
                PACK_HALF2_RTE(word, ${c.act(act_kind, alpha, "acc[mt][nt][2 * h] + b0")},
                               ${c.act(act_kind, alpha, "acc[mt][nt][2 * h + 1] + b1")});
% if STAGE:
                st[(g + 8 * h) * ((BN + 8) / 2) + nt * 4 + t] = word;
% else:
                const int m = m0 + mt * 16 + g + 8 * h;
                if (m < M && n < K)
                    ((__global uint*)y)[(m * K + n) / 2] = word;
% endif
            }
        }
% if STAGE:
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int v = lane; v < 16 * (BN / 8); v += 32) {
            const int row = v / (BN / 8), col = v % (BN / 8);
            const int m = m0 + mt * 16 + row, n = nt0 * 8 + col * 8;
            if (m < M && n < K)
                ((__global uint4*)y)[(m * K + n) / 8] =
                    *(__local const uint4*)(st + row * ((BN + 8) / 2) + col * 4);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
    }
}

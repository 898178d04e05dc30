<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, vtype
%>\
<%
    act, alpha = attrs["act"], attrs["alpha"]
    fv = vtype(VW)
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
%>\
// ${prefix}: 1x1 convolution as a GEMM (${variant}, after Boda's k1conv)
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, groups ${G},
//   bias ${"yes" if has_bias else "no"}, act ${act}; NCHW in and out
// per group: Y[m][n] = sum_c Wg[m][c] * X[c][n], M = K/G = ${KG}, N = N*H*W = ${NHW}
//   (n = image * H*W + pixel), reduction C/G = ${CG}; both operands read in place.

// -- tunables
#define MT ${MT}            // outputs per work-item along M (rows i*MB + tm)
#define NT ${NT}            // outputs per work-item along N (vectors (j*NB + tn)*VW)
#define MB ${MB}            // work-items along M
#define NB ${NB}            // work-items along N
#define KB ${KB}            // input channels per local-memory step
#define VW ${VW}            // vector width of input loads, local reads and output stores
#define MBLK (MT * MB)      // tile in M per work-group
#define NBLK (NT * NB)      // tile in N per work-group
#define WG (MB * NB)

// -- the layer
#define BATCH ${BATCH}
#define C ${C}
#define K ${K}
#define HW ${HW}            // pixels per image
#define G ${G}
#define CG ${CG}            // input channels per group (the reduction)
#define KG ${KG}            // output channels per group (M)
#define NHW ${NHW}          // N
#define MTILES ${MTILES}
#define KSTEPS ${KSTEPS}    // C/G / KB, rounded up
// local memory: weights [KB][LDA] (one float of padding: the load walks down its columns),
// inputs [KB][LDB]
#define LDA ${LDA}
#define LDB ${LDB}
#define A_ITERS ${A_ITERS}  // weights loaded per work-item per step (rounded up)
#define A_REM ${A_REM}      // work-items loading in the last of them (0: all)
#define B_ITERS ${B_ITERS}  // input vectors loaded per work-item per step (rounded up)
#define B_REM ${B_REM}      // work-items loading in the last of them (0: all)
#define floatV ${fv}
${c.helpers()}
// One work-group: an MBLK x NBLK tile of one group's Y.
__kernel __attribute__((reqd_work_group_size(NB, MB, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict w,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input
% endif
               __global ${c.T()}* restrict y)
{
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int tid = tm * NB + tn;
    const int n0 = get_group_id(0) * NBLK;
    const int g = get_group_id(1) / MTILES;
    const int m0 = get_group_id(1) % MTILES * MBLK;

    __local float Al[KB * LDA];
    __local floatV Bl4[KB * LDB / VW];          // vector-typed: vector accesses stay aligned
    __local float* const Bl = (__local float*)Bl4;

    // the elements this work-item loads: fixed for the whole reduction but for the step offset.
    // Rows past M and columns past N are clamped to real ones: their results are dropped.
    int a_src[A_ITERS], a_dst[A_ITERS], b_src[B_ITERS], b_dst[B_ITERS];
% if KCHK:
    int a_kk[A_ITERS], b_kk[B_ITERS];
% endif
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
        const int e = tid + it * WG, kk = e % KB, ml = e / KB;    // consecutive work-items: consecutive channels
% if MCHK:
        a_src[it] = (g * KG + min(m0 + ml, KG - 1)) * CG + kk;
% else:
        a_src[it] = (g * KG + m0 + ml) * CG + kk;
% endif
        a_dst[it] = kk * LDA + ml;
% if KCHK:
        a_kk[it] = kk;
% endif
    }
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG, nv = e % (NBLK / VW), kk = e / (NBLK / VW);
% if NCHK:
        const int n = min(n0 + nv * VW, NHW - VW);
% else:
        const int n = n0 + nv * VW;
% endif
        b_src[it] = (n / HW * C + g * CG + kk) * HW + n % HW;
        b_dst[it] = kk * LDB + nv * VW;
% if KCHK:
        b_kk[it] = kk;
% endif
    }

    floatV acc[MT][NT / VW];          // acc[i][j]: row i*MB + tm, columns (j*NB + tn)*VW + 0..VW-1
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT / VW; ++j)
            acc[i][j] = (floatV)(0.0f);

    for (int ks = 0; ks < KSTEPS; ++ks) {
        const int k0 = ks * KB;
        #pragma unroll
        for (int it = 0; it < A_ITERS; ++it)
% if A_REM:
            if (it < A_ITERS - 1 || tid < A_REM)     // only the last load is partial
% endif
% if KCHK:
            Al[a_dst[it]] = k0 + a_kk[it] < CG ? ${c.LOAD("w", "a_src[it] + k0")} : 0.0f;
% else:
            Al[a_dst[it]] = ${c.LOAD("w", "a_src[it] + k0")};
% endif
        #pragma unroll
        for (int it = 0; it < B_ITERS; ++it) {
% if B_REM:
            if (it == B_ITERS - 1 && tid >= B_REM)   // only the last load is partial
                break;
% endif
            // aligned: H*W % VW == 0 puts every vector at a multiple of VW floats
% if KCHK:
            const floatV v = k0 + b_kk[it] < CG ? ${c.LOADAT("__global const floatV*", VW, "(x + b_src[it] + k0 * HW)")} : (floatV)(0.0f);
% else:
            const floatV v = ${c.LOADAT("__global const floatV*", VW, "(x + b_src[it] + k0 * HW)")};
% endif
            *(__local floatV*)(Bl + b_dst[it]) = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        #pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
            float am[MT];
            floatV bv[NT / VW];
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                am[i] = Al[kk * LDA + i * MB + tm];
            #pragma unroll
            for (int j = 0; j < NT / VW; ++j)
                bv[j] = *(__local const floatV*)(Bl + kk * LDB + (j * NB + tn) * VW);
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                #pragma unroll
                for (int j = 0; j < NT / VW; ++j)
                    acc[i][j] = mad((floatV)(am[i]), bv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    // epilogue: bias, activation, VW-wide stores; partial tiles guarded
    #pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int m = m0 + i * MB + tm;
% if MCHK:
        if (m >= KG)
            continue;
% endif
% if has_bias:
        const float b = ${c.LOAD("bias", "g * KG + m")};
% endif
        #pragma unroll
        for (int j = 0; j < NT / VW; ++j) {
            const int n = n0 + (j * NB + tn) * VW;
% if NCHK:
            if (n >= NHW)
                continue;
% endif
            __global ${c.T()}* const yo = y + (n / HW * K + g * KG + m) * HW + n % HW;
% if residual:
            // the residual where y is written: the same offset, the same alignment
            const floatV s = acc[i][j]${" + b" if has_bias else ""} + ${c.LOADAT("__global const floatV*", VW, "(res + (yo - y))")};
% else:
            const floatV s = acc[i][j]${" + b" if has_bias else ""};
% endif
% if VW > 1:
            ${c.STOREAT("__global floatV*", VW, "yo", "(floatV)(%s)" % ", ".join(capture(c.act, act, alpha, "s" + comp(VW, v)).strip() for v in range(VW)))};
% elif storage == "fp16":
            ${c.STORE("yo", 0, capture(c.act, act, alpha, "s"))};
% else:
            *yo = ${c.act(act, alpha, "s")};
% endif
        }
    }
}

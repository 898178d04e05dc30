<%namespace name="c" file="_common.mako"/>\
<%namespace name="mf" file="_mma_f16.mako"/>\
<%namespace name="d" file="_dense.mako"/>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    # the emulated mma holds two work-group barriers: unrolled, every one of them would split
    # PoCL's work-group function once more; the tensor cores want the fragments in registers
    unroll = "#pragma unroll 1" if EMULATE else "#pragma unroll"
%>\
// ${prefix}: ${layer.op} on the tensor cores, y[${N}][${OUT}] = act(x[${N}][${K}] W[${OUT}][${K}]^T + bias), act ${act_kind}
// (${variant}: mma.sync m16n8k16 on the stored halves, FP32 sums; each weight read once, in place)
#define NT ${NT}              // tiles of 8 output rows per warp
#define WARPS ${WARPS}           // warps per work-group, taking turns over the chunks of a K slice
#define U ${U}               // chunks whose loads a warp issues before it multiplies
#define KSPLIT ${KSPLIT}          // K slices${" (partials summed by " + prefix + "_reduce)" if KSPLIT > 1 else ""}
#define WG (32 * WARPS)
// ---- the layer (all sizes compile-time constants) ----
#define N ${N}               // batch
#define MT ${MT}              // tiles of 16 batch rows
#define K ${K}            // reduction length: C*H*W of the input
#define OUT ${OUT}          // output rows
#define CH ${CH}             // 32-deep chunks of K
#define KSC ${KSC}            // chunks per K slice
#define ITERS ${ITERS}          // rounds of WARPS * U chunks per slice
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable mma even on NVIDIA
% endif
#if (defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)) && !defined(AOTCONV_MMA_EMULATE)
#define MMA_PTX 1
#endif

#ifdef MMA_PTX
${mf.ptx()}\
// 16 bytes of a read-only global buffer as four words, one vector load (a plain uint4 load
// whose words are used one by one is split into four by the compiler)
#define LDG16(v, p) asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" \
    : "=r"((v)[0]), "=r"((v)[1]), "=r"((v)[2]), "=r"((v)[3]) : "l"(p))
#else
${mf.emulated()}\
#define LDG16(v, p) do { \
    const uint4 u_ = *(p); \
    (v)[0] = u_.x; (v)[1] = u_.y; (v)[2] = u_.z; (v)[3] = u_.w; \
} while (0)
#endif

// Lane (g, t) of a warp loads, per 32-deep chunk, the 8 halves at k offset 8t of weight row g
// of each of its NT tiles and of batch rows g and g + 8 of each of the MT tiles; step j of the
// chunk multiplies their words 2j and 2j + 1 (the same permutation of k for A and B).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}_mma(__global const uint4* restrict x, __global const uint4* restrict wt,
% if KSPLIT == 1:
% if HAS_BIAS:
                   const __global ${c.T()}* restrict bias,
% endif
                   __global ${c.T()}* restrict y)
% else:
                   __global float* restrict part)
% endif
{
    const int tid = get_local_id(0), lane = tid % 32, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = get_group_id(0) * (8 * NT);
    const int slice = get_group_id(1);
#ifndef MMA_PTX
    __local uint mma_x[WARPS * 192];           // the emulated mma's fragment exchange
    __local uint* const mx = mma_x + warp * 192;
#endif
    // this lane's rows, as 16-byte vectors from the slice's first chunk (rows past OUT or the
    // batch read the last real one: their sums are never stored)
    const int k0 = slice * (KSC * 32) + 8 * t;
    const __global uint4* wrow[NT];
    #pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        wrow[nt] = wt + (min(row0 + nt * 8 + g, OUT - 1) * K + k0) / 8;
    const __global uint4* xrow[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        xrow[mt][0] = x + (min(mt * 16 + g, N - 1) * K + k0) / 8;
        xrow[mt][1] = x + (min(mt * 16 + g + 8, N - 1) * K + k0) / 8;
    }
% if KCHK:
    // the lane's k offsets that hold data: below the slice's end and K
    const int klim = min((slice + 1) * (KSC * 32), K) - k0;
% endif

    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                acc[mt][nt][q] = 0.0f;

    #pragma unroll 1                           // U chunks in flight are the knob's, not the loop's
    for (int it = 0; it < ITERS; ++it) {
        uint wv[U][NT][4], xv[U][MT][2][4];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = (it * U + u) * WARPS + warp;        // chunk of the slice
% if KCHK:
            if (ch * 32 < klim) {
% else:
            {
% endif
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    LDG16(wv[u][nt], wrow[nt] + ch * 4);
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    LDG16(xv[u][mt][0], xrow[mt][0] + ch * 4);
                    LDG16(xv[u][mt][1], xrow[mt][1] + ch * 4);
                }
% if KCHK:
            } else {                                           // past the slice or K: zeros
                #pragma unroll
                for (int q = 0; q < 4; ++q) {
                    #pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        wv[u][nt][q] = 0u;
                    #pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        xv[u][mt][0][q] = xv[u][mt][1][q] = 0u;
                }
% endif
            }
        }
        ${unroll}
        for (int u = 0; u < U; ++u) {
            ${unroll}
            for (int j = 0; j < 2; ++j) {
                ${unroll}
                for (int mt = 0; mt < MT; ++mt) {
                    const uint a[4] = {xv[u][mt][0][2 * j], xv[u][mt][1][2 * j],
                                       xv[u][mt][0][2 * j + 1], xv[u][mt][1][2 * j + 1]};
                    ${unroll}
                    for (int nt = 0; nt < NT; ++nt) {
                        const uint b[2] = {wv[u][nt][2 * j], wv[u][nt][2 * j + 1]};
                        MMA_F16(acc[mt][nt], a, b);
                    }
                }
            }
        }
    }

    // ---- the warps' sums: [WARPS][MT * NT * 4][32] in local memory, added per element ----
    __local float red[WARPS * MT * NT * 4 * 32];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                red[((warp * MT + mt) * NT + nt) * 128 + q * 32 + lane] = acc[mt][nt][q];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = tid; i < MT * NT * 128; i += WG) {
        float s = 0.0f;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w)
            s += red[w * (MT * NT * 128) + i];
        // element i: tile (mt, nt) = i / 128, accumulator q, lane (g, t) of the ISA's C layout
        const int tile = i / 128, q = i / 32 % 4, l = i % 32;
        const int b = tile / NT * 16 + (l >> 2) + 8 * (q >> 1);
        const int o = row0 + tile % NT * 8 + 2 * (l & 3) + (q & 1);
        if (b < N && o < OUT) {
% if KSPLIT == 1:
            const float r = s${" + " + capture(c.LOAD, "bias", "o") if HAS_BIAS else ""};
            ${c.STORE("y", "b * OUT + o", capture(c.act, act_kind, alpha, "r").strip())};
% else:
            part[(slice * N + b) * OUT + o] = s;
% endif
        }
    }
}
% if KSPLIT > 1:

${d.reduce(prefix, HAS_BIAS, act_kind, alpha)}\
% endif

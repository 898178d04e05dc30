<%namespace name="c" file="_common.mako"/>\
<%namespace name="s" file="_sgemm.mako"/>\
<%!
from aotconv.variants.kernel_text import comp
%>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    def act(x):
        return capture(c.act, act_kind, alpha, x).strip()
%>\
// ${prefix}: ${layer.op} as GEMM, y[${N}][${OUT}] = act(x[${N}][${K}] W[${OUT}][${K}]^T + bias), act ${act_kind}
// (${variant}: W packed once in set_params, x transposed per run, tiled SGEMM with the
// bias and act in its epilogue)
${s.defines()}
#define KSPLIT ${KSPLIT}  // K slices${" (partials summed by " + prefix + "_reduce)" if KSPLIT > 1 else " (the GEMM writes y itself)"}
// ---- the layer (all sizes compile-time constants) ----
#define N ${N}            // batch = GEMM M
#define OUT ${OUT}        // output features = GEMM N
#define K ${K}            // reduction length: C*H*W of the input
// ---- packed sizes ----
#define MP ${MP}          // N padded to MWG
#define NP ${NP}          // OUT padded to NWG
#define KCH ${KCH}        // K per slice, padded to KWG
#define KP ${KP}          // KSPLIT * KCH
#define PART0 ${PART0}    // scratch offset of the partial sums (after xpack[KP][MP])
#define TT ${TT}          // tile of the transposes
${c.helpers()}
<%def name="transpose(name, rows, rp, what)">
// ${what}: dst[k][r] = src[r][k], zero-padded to [KP][${rp}] (a local-memory tile transpose,
// so both the reads and the writes are coalesced).
__kernel __attribute__((reqd_work_group_size(TT, TT, 1)))
void ${name}(const __global ${c.T()}* restrict src, __global float* restrict dst)
{
    __local float tile[TT][TT + 1];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int k0 = get_group_id(0) * TT, r0 = get_group_id(1) * TT;
    tile[ly][lx] = (r0 + ly < ${rows} && k0 + lx < K) ? ${c.LOAD("src", "(r0 + ly) * K + k0 + lx")} : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (k0 + ly < KP)
        dst[(k0 + ly) * ${rp} + r0 + lx] = tile[lx][ly];
}
</%def>
${transpose(prefix + "_pack_w", "OUT", "NP", "Setup (once): wpack = W^T")}
${transpose(prefix + "_pack_x", "N", "MP", "Per run: xpack = x^T, into scratch")}

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
% if KSPLIT == 1:
void ${prefix}_gemm(const __global float* restrict xpack, const __global float* restrict wpack,
% if HAS_BIAS:
                    const __global ${c.T()}* restrict bias,
% endif
                    __global ${c.T()}* restrict y)
{
${s.mainloop("xpack", "wpack", "MP", "NP", "KP")}
    // ---- epilogue: bias (per column), act, store rows b < N, columns o < OUT ----
    #pragma unroll
    for (int j = 0; j < NVI; ++j) {
        const int o = COL(j);
% if HAS_BIAS:
        realN bj;
% for w in range(VWN):
        bj${comp(VWN, w)} = ${c.LOAD("bias", "min(o + %d, OUT - 1)" % w)};
% endfor
% endif
        #pragma unroll
        for (int i = 0; i < MVI; ++i) {
            #pragma unroll
            for (int v = 0; v < VWM; ++v) {
                const int b = ROW(i, v);
                realN r = acc[i * VWM + v][j]${" + bj" if HAS_BIAS else ""};
% for w in range(VWN):
                r${comp(VWN, w)} = ${act("r" + comp(VWN, w))};
% endfor
                if (b < N) {
% if VEC_STORE:
                    if (o < OUT)                     // OUT % VWN == 0: whole, aligned vectors
                        ${c.STOREAT("__global realN*", VWN, "(y + b * OUT + o)", "r")};
% else:
% for w in range(VWN):
                    if (o + ${w} < OUT)
                        ${c.STORE("y", "b * OUT + o + %d" % w, "r" + comp(VWN, w))};
% endfor
% endif
                }
            }
        }
    }
}
% else:
void ${prefix}_gemm(__global float* restrict scratch, const __global float* restrict wpack)
{
    const int sl = get_group_id(2);
${s.mainloop("scratch + sl * KCH * MP", "wpack + sl * KCH * NP", "MP", "NP", "KCH")}
${s.store_packed("scratch + PART0 + sl * MP * NP", "NP")}
}

// y = act(bias + sum of the KSPLIT partial tiles)
__kernel void ${prefix}_reduce(const __global float* restrict scratch,
% if HAS_BIAS:
                               const __global ${c.T()}* restrict bias,
% endif
                               __global ${c.T()}* restrict y)
{
    const int o = get_global_id(0), b = get_global_id(1);
    if (o >= OUT)
        return;
    float r = ${capture(c.LOAD, "bias", "o") if HAS_BIAS else "0.0f"};
    #pragma unroll
    for (int sl = 0; sl < KSPLIT; ++sl)
        r += scratch[PART0 + (sl * MP + b) * NP + o];
    ${c.STORE("y", "b * OUT + o", act("r"))};
}
% endif

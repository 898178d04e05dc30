<%namespace name="c" file="_common.mako"/>\
<%namespace name="d" file="_dense.mako"/>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    def act(x):
        return capture(c.act, act_kind, alpha, x).strip()
%>\
// ${prefix}: ${layer.op} as GEMV, y[${N}][${OUT}] = act(x[${N}][${K}] W[${OUT}][${K}]^T + bias), act ${act_kind}
// (${variant}: weights read once with ${realV} loads, K split over ${KSPLIT} slice(s), local reduction)
#define WG ${WG}          // work-items per work-group
#define R ${R}            // output rows per work-group
#define VW ${VW}          // vector width of the loads
#define U ${U}            // independent vector loads in flight per work-item
#define KSPLIT ${KSPLIT}  // K slices${" (partials summed by " + prefix + "_reduce)" if KSPLIT > 1 else ""}
// ---- the layer (all sizes compile-time constants) ----
#define N ${N}            // batch
#define K ${K}            // reduction length: C*H*W of the input
#define OUT ${OUT}        // output rows
#define KV ${KV}          // vectors per row: K / VW
#define KS ${KS}          // vectors per K slice: ceil(KV / KSPLIT)
typedef ${realV} realV;
${c.helpers()}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}_gemv(const __global ${c.TV("realV")}* restrict x, const __global ${c.TV("realV")}* restrict wt,
% if KSPLIT == 1:
% if HAS_BIAS:
                    const __global ${c.T()}* restrict bias,
% endif
                    __global ${c.T()}* restrict y)
% else:
                    __global float* restrict part)
% endif
{
    const int lid = get_local_id(0);
    const int row0 = get_group_id(0) * R;
    const int kbeg = get_group_id(1) * KS;
    const int kend = min(kbeg + KS, KV);
    // rows past OUT (in the last work-group) re-read row OUT-1 and are never stored
    const __global ${c.TV("realV")}* wrow[R];
    #pragma unroll
    for (int r = 0; r < R; ++r)
        wrow[r] = wt + min(row0 + r, OUT - 1) * ${"K" if storage == "fp16" else "KV"};
    float acc[R][N];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        #pragma unroll
        for (int b = 0; b < N; ++b)
            acc[r][b] = 0.0f;
    }
    int k = kbeg + lid;
    // main part: U*(R+N) independent loads issued before any is used
    for (; k + (U - 1) * WG < kend; k += U * WG) {
        realV wv[U][R], xv[U][N];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            #pragma unroll
            for (int r = 0; r < R; ++r)
                wv[u][r] = ${c.LOADVEC(VW, "wrow[r]", "k + u * WG")};
            #pragma unroll
            for (int b = 0; b < N; ++b)
                xv[u][b] = ${c.LOADVEC(VW, "x", "b * KV + k + u * WG")};
        }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                #pragma unroll
                for (int b = 0; b < N; ++b)
                    acc[r][b] += dot(wv[u][r], xv[u][b]);
            }
        }
    }
% if U > 1:
    for (; k < kend; k += WG) {                      // tail: fewer than U vectors left
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const realV wv = ${c.LOADVEC(VW, "wrow[r]", "k")};
            #pragma unroll
            for (int b = 0; b < N; ++b)
                acc[r][b] += dot(wv, ${c.LOADVEC(VW, "x", "b * KV + k")});
        }
    }
% endif
    // ---- tree reduction of the R x N sums over the work-group ----
    __local float red[R * N][WG];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        #pragma unroll
        for (int b = 0; b < N; ++b)
            red[r * N + b][lid] = acc[r][b];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            #pragma unroll
            for (int v = 0; v < R * N; ++v)
                red[v][lid] += red[v][lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < R * N) {
        const int o = row0 + lid / N, b = lid % N;
        if (o < OUT) {
% if KSPLIT == 1:
            const float r = red[lid][0]${" + " + capture(c.LOAD, "bias", "o") if HAS_BIAS else ""};
            ${c.STORE("y", "b * OUT + o", act("r"))};
% else:
            part[(get_group_id(1) * N + b) * OUT + o] = red[lid][0];
% endif
        }
    }
}
% if KSPLIT > 1:

${d.reduce(prefix, HAS_BIAS, act_kind, alpha)}\
% endif

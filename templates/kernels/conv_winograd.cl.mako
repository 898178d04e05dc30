<%namespace name="c" file="_common.mako"/>\
<%namespace name="s" file="_sgemm.mako"/>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    def act(x):
        return capture(c.act, act_kind, alpha, x).strip()
    filt_mid, filt_out = TF["filt"]
    in_mid, in_out = TF["inp"]
    out_mid, out_out = TF["out"]
%>\
// ${prefix}: conv ${N}x${C}x${H}x${W} -> ${N}x${OUT}x${P}x${Q}, kernel 3x3, pad (t ${PT}, l ${PL}),
// act ${act_kind} (${variant}: Winograd F(${M}x${M},3x3): filter transform once in set_params,
// input transform, ${AA} batched GEMMs, output transform with bias and act)
#define M ${M}            // output tile M x M
${s.defines()}
// ---- the layer (all sizes compile-time constants) ----
#define C ${C}
#define H ${H}
#define W ${W}
#define OUT ${OUT}
#define P ${P}
#define Q ${Q}
#define PT ${PT}          // padding top
#define PL ${PL}          // padding left
#define A ${A}            // input tile A x A (A = M + 2)
#define TH ${TH}          // tiles down: ceil(P / M)
#define TW ${TW}          // tiles across: ceil(Q / M)
#define T ${T}            // tiles in the batch: N * TH * TW
// ---- the ${AA} GEMMs: M = OUT, N = T, K = C; packed sizes ----
#define KP ${KP}          // OUT padded to MWG
#define CP ${CP}          // C padded to KWG
#define TP ${TP}          // T padded to NWG
#define MO0 ${MO0}        // scratch offset of the GEMM results Mo, after V[A*A][CP][TP]
${c.helpers()}

// Setup (once): U[xi][nu][c][k] = (G g G^T)[xi][nu], g = weight[k][c], zero-padded to [A*A][CP][KP].
__kernel void ${prefix}_filter(const __global ${c.T()}* restrict wt, __global float* restrict u)
{
    const int k = get_global_id(0), c = get_global_id(1);
    const int ok = k < OUT && c < C;
    const __global ${c.T()}* gk = wt + (ok ? (k * C + c) * 9 : 0);
% for i in range(3):
    const float ${", ".join("g%d%d = ok ? %s : 0.0f" % (i, j, capture(c.LOAD, "gk", 3 * i + j)) for j in range(3))};
% endfor
% for lhs, rhs in filt_mid:
    const float ${lhs} = ${rhs};
% endfor
% for lhs, rhs in filt_out:
    u[(${int(lhs[1]) * A + int(lhs[2])} * CP + c) * KP + k] = ${rhs};
% endfor
}

// V[xi][nu][c][t] = (B^T d B)[xi][nu] for the A x A input patch d of tile t, channel c;
// padded tiles and channels are written as zeros.
__kernel void ${prefix}_input(const __global ${c.T()}* restrict x, __global float* restrict v)
{
    const int t = get_global_id(0), c = get_global_id(1);
    if (t >= TP)
        return;
    const int ok = t < T && c < C;
    const int b = t / (TH * TW), ty = (t / TW) % TH, tx = t % TW;
    const int h0 = ty * M - PT, w0 = tx * M - PL;
    const __global ${c.T()}* xc = x + (b * C + (ok ? c : 0)) * H * W;
    float d[A][A];
    #pragma unroll
    for (int i = 0; i < A; ++i) {
        #pragma unroll
        for (int j = 0; j < A; ++j) {
            const int h = h0 + i, w = w0 + j;
            d[i][j] = (ok && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
                      ? ${c.LOAD("xc", "h * W + w")} : 0.0f;
        }
    }
% for i in range(A):
    const float ${", ".join(f"d{i}{j} = d[{i}][{j}]" for j in range(A))};
% endfor
% for lhs, rhs in in_mid:
    const float ${lhs} = ${rhs};
% endfor
% for lhs, rhs in in_out:
    v[(${int(lhs[1]) * A + int(lhs[2])} * CP + c) * TP + t] = ${rhs};
% endfor
}

// Mo[z] = U[z]^T V[z] for each of the A*A transform points z = xi*A + nu.
__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
void ${prefix}_gemm(const __global float* restrict u, __global float* restrict scratch)
{
    const int z = get_group_id(2);
${s.mainloop("u + z * CP * KP", "scratch + z * CP * TP", "KP", "TP", "CP")}
${s.store_packed("scratch + MO0 + z * KP * TP", "TP")}
}

// y tile = act(A^T Mo A + bias), cropped to the P x Q output.
__kernel void ${prefix}_output(const __global float* restrict scratch,
% if HAS_BIAS:
                               const __global ${c.T()}* restrict bias,
% endif
                               __global ${c.T()}* restrict y)
{
    const int t = get_global_id(0), k = get_global_id(1);
    if (t >= T)
        return;
    const __global float* mo = scratch + MO0 + k * TP + t;
% for i in range(A):
    const float ${", ".join(f"o{i}{j} = mo[{i * A + j} * KP * TP]" for j in range(A))};
% endfor
% for lhs, rhs in out_mid:
    const float ${lhs} = ${rhs};
% endfor
    const float bk = ${capture(c.LOAD, "bias", "k") if HAS_BIAS else "0.0f"};
    const int b = t / (TH * TW), ty = (t / TW) % TH, tx = t % TW;
    __global ${c.T()}* yt = y + ((b * OUT + k) * P + ty * M) * Q + tx * M;
% for lhs, rhs in out_out:
<%
    i, j = int(lhs[1]), int(lhs[2])
    cond = " && ".join(([f"ty * M + {i} < P"] if i else []) + ([f"tx * M + {j} < Q"] if j else []))
%>\
% if cond:
    if (${cond})
        ${c.STORE("yt", "%d * Q + %d" % (i, j), act(f"({rhs} + bk)"))};
% else:
    ${c.STORE("yt", "%d * Q + %d" % (i, j), act(f"({rhs} + bk)"))};
% endif
% endfor
}

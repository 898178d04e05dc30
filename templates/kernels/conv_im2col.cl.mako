<%namespace name="c" file="_common.mako"/>\
<%namespace name="s" file="_sgemm.mako"/>\
<%!
from aotconv.variants.kernel_text import comp
%>\
<%
    act_kind, alpha = attrs["act"], attrs["alpha"]
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    def act(x):
        return capture(c.act, act_kind, alpha, x).strip()
%>\
// ${prefix}: conv ${N}x${C}x${H}x${W} -> ${N}x${OUT}x${P}x${Q}, kernel ${KH}x${KW}, stride ${SH}x${SW},
// dilation ${DH}x${DW}, pad (t ${PT}, l ${PL}), groups ${G}, act ${act_kind} (${variant}:
// im2col into the shared scratch buffer + tiled SGEMM, bias and act in the epilogue)
${s.defines()}
#define KSPLIT ${KSPLIT}  // K slices summed by ${prefix}_reduce (1: the GEMM writes y itself)
#define IMGS ${IMGS}      // images per im2col + GEMM pass
// ---- the layer (all sizes compile-time constants) ----
#define C ${C}
#define H ${H}
#define W ${W}
#define OUT ${OUT}
#define P ${P}
#define Q ${Q}
#define PQ ${PQ}
#define G ${G}            // groups
#define CG ${CG}          // input channels per group
#define OG ${OG}          // output channels per group = GEMM M
#define KH ${KH}
#define KW ${KW}
#define SH ${SH}
#define SW ${SW}
#define DH ${DH}
#define DW ${DW}
#define PT ${PT}          // padding top
#define PL ${PL}          // padding left
// ---- the GEMM per group: M = OG, N = NCOLS, K = KDIM; packed sizes ----
#define KDIM ${KDIM}      // CG * KH * KW
#define NCOLS ${NCOLS}    // IMGS * PQ: columns (image, p, q)
#define MP ${MP}          // OG padded to MWG
#define NCP ${NCP}        // NCOLS padded to NWG
#define KCH ${KCH}        // K per slice, padded to KWG
#define KP ${KP}          // KSPLIT * KCH
#define PART0 ${PART0}    // scratch offset of the partial sums (after col[G][KP][NCP])
${c.helpers()}

// Setup (once): wpack[g][k][m] = weight[g*OG + m][k], zero-padded to [G][KP][MP].
__kernel void ${prefix}_pack(const __global ${c.T()}* restrict wt, __global float* restrict wpack)
{
    const int m = get_global_id(0), k = get_global_id(1), g = get_global_id(2);
    wpack[(g * KP + k) * MP + m] = (m < OG && k < KDIM) ? ${c.LOAD("wt", "(g * OG + m) * KDIM + k")} : 0.0f;
}

// col[g][k][n] for the images img0 .. img0+IMGS-1; every padded entry is written (zeros), so the
// scratch buffer needs no clearing between layers.
__kernel void ${prefix}_im2col(const __global ${c.T()}* restrict x, __global float* restrict col,
                               const int img0)
{
    const int n = get_global_id(0), k = get_global_id(1), g = get_global_id(2);
    if (n >= NCP)
        return;
    float v = 0.0f;
    if (n < NCOLS && k < KDIM) {
        const int pq = n % PQ, ij = k % (KH * KW);
        const int h = (pq / Q) * SH - PT + (ij / KW) * DH;
        const int w = (pq % Q) * SW - PL + (ij % KW) * DW;
        if ((unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W)
            v = ${c.LOAD("x", "(((img0 + n / PQ) * C + g * CG + k / (KH * KW)) * H + h) * W + w")};
    }
    col[(g * KP + k) * NCP + n] = v;
}

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
% if KSPLIT == 1:
void ${prefix}_gemm(const __global float* restrict wpack, const __global float* restrict col,
% if HAS_BIAS:
                    const __global ${c.T()}* restrict bias,
% endif
% if residual:
                    const __global ${c.T()}* restrict res,     // the fused add's other input
% endif
                    __global ${c.T()}* restrict y, const int img0)
{
    const int g = get_group_id(2);
${s.mainloop("wpack + g * KP * MP", "col + g * KP * NCP", "MP", "NCP", "KP")}
    // ---- epilogue: bias, act, scatter columns (image, p, q) back to NCHW ----
    #pragma unroll
    for (int i = 0; i < MVI; ++i) {
        #pragma unroll
        for (int v = 0; v < VWM; ++v) {
            const int m = ROW(i, v);
            if (m < OG) {
                const float bm = ${capture(c.LOAD, "bias", "g * OG + m") if HAS_BIAS else "0.0f"};
                __global ${c.T()}* yrow = y + (img0 * OUT + g * OG + m) * PQ;
                #pragma unroll
                for (int j = 0; j < NVI; ++j) {
                    const int n = COL(j);
                    realN r = acc[i * VWM + v][j] + bm;
% if residual:
%   if VEC_STORE:
                    if (n < NCOLS)
                        r += ${c.LOADAT("const __global realN*", VWN, "(res + (yrow - y) + (n / PQ) * (OUT * PQ) + n % PQ)")};
%   else:
%     for w in range(VWN):
                    if (n + ${w} < NCOLS)
                        r${comp(VWN, w)} += ${c.LOAD("res", "(yrow - y) + ((n + %d) / PQ) * (OUT * PQ) + (n + %d) %% PQ" % (w, w))};
%     endfor
%   endif
% endif
% for w in range(VWN):
                    r${comp(VWN, w)} = ${act("r" + comp(VWN, w))};
% endfor
% if VEC_STORE:
                    // PQ % VWN == 0: a vector never straddles two images and stays aligned
                    if (n < NCOLS)
                        ${c.STOREAT("__global realN*", VWN, "(yrow + (n / PQ) * (OUT * PQ) + n % PQ)", "r")};
% else:
% for w in range(VWN):
                    if (n + ${w} < NCOLS)
                        ${c.STORE("yrow", "((n + %d) / PQ) * (OUT * PQ) + (n + %d) %% PQ" % (w, w), "r" + comp(VWN, w))};
% endfor
% endif
                }
            }
        }
    }
}
% else:
void ${prefix}_gemm(const __global float* restrict wpack, __global float* restrict scratch)
{
    const int g = get_group_id(2) / KSPLIT, sl = get_group_id(2) % KSPLIT;
${s.mainloop("wpack + (g * KP + sl * KCH) * MP", "scratch + (g * KP + sl * KCH) * NCP", "MP", "NCP", "KCH")}
${s.store_packed("scratch + PART0 + (g * KSPLIT + sl) * MP * NCP", "NCP")}
}

// y = act(bias + sum of the KSPLIT partial tiles), scattered back to NCHW.
__kernel void ${prefix}_reduce(const __global float* restrict scratch,
% if HAS_BIAS:
                               const __global ${c.T()}* restrict bias,
% endif
% if residual:
                               const __global ${c.T()}* restrict res,     // the fused add's other input
% endif
                               __global ${c.T()}* restrict y, const int img0)
{
    const int n = get_global_id(0), m = get_global_id(1), g = get_global_id(2);
    if (n >= NCOLS)
        return;
    const __global float* part = scratch + PART0 + (g * KSPLIT * MP + m) * NCP + n;
    float r = ${capture(c.LOAD, "bias", "g * OG + m") if HAS_BIAS else "0.0f"};
    #pragma unroll
    for (int sl = 0; sl < KSPLIT; ++sl)
        r += part[sl * MP * NCP];
% if residual:
    r += ${c.LOAD("res", "((img0 + n / PQ) * OUT + g * OG + m) * PQ + n % PQ")};
% endif
    ${c.STORE("y", "((img0 + n / PQ) * OUT + g * OG + m) * PQ + n % PQ", act("r"))};
}
% endif

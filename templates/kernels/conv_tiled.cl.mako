<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, indent, plus, vtype
%>\
<%
    wmem = "__constant" if WCONST else "__global"
    wt = vtype(KT)
    act, alpha = attrs["act"], attrs["alpha"]
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
%>\
// ${prefix}: register-tiled direct convolution (${variant}, after Boda's tconv)
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW}, groups ${G},
//   bias ${"yes" if has_bias else "no"}, act ${act}; NCHW in and out
// one work-item: KT output channels x QT consecutive pixels of one output row, in registers;
//   per input channel and filter row it loads the ${SPAN} input columns its windows cover
//   (guarded only where the layer's padding or edge can be reached) and emits the taps and the
//   KT x QT multiply-adds as straight-line code${"" if UNROLL_R else " (filter rows stay a loop: the block is large)"}.

// -- tunables
#define KT ${KT}            // output channels per work-item
#define QT ${QT}            // output pixels per work-item, along the row
#define WG ${WG}            // work-items per work-group
#define VW ${VW}            // vector width of input-row loads and output stores
#define WCONST ${WCONST}        // packed weights in __constant memory
% if OUTL == "NHWC":
// OUTL NHWC: the output is written channels-last
% endif

// -- the layer
#define BATCH ${BATCH}
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
#define G ${G}
#define CG ${CG}            // input channels per group
#define KG ${KG}            // output channels per group
#define KB ${KB}            // channel blocks per group (KG / KT, rounded up)
#define QB ${QB}            // pixel blocks per output row (Q / QT, rounded up)
#define ITEMS ${ITEMS}      // work-items: BATCH * G * KB * P * QB
${c.helpers()}
// Weights [K][C/G][R][S] -> [G][KB][C/G][R][S][KT], zero past the last channel (run once).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ${c.T()}* restrict w, __global float* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= G * KB * CG * R * S * KT)
        return;
    const int kt = i % KT, rs = i / KT % (R * S), c = i / (KT * R * S) % CG;
    const int kb = i / (KT * R * S * CG) % KB, g = i / (KT * R * S * CG * KB);
    const int k = kb * KT + kt;
    wp[i] = k < KG ? ${c.LOAD("w", "((g * KG + k) * CG + c) * (R * S) + rs")} : 0.0f;
}
<%def name="filter_row(r, guarded)">\
## r: the filter row, an int (unrolled) or the loop variable "r"; the input columns this
## work-item's windows read in that row become registers x<i>, the taps are straight-line code
% if guarded:
if ((uint)(${plus('ih0', r, DH)}) < (uint)H) {
% else:
{
% endif
    const int xr = ${plus('xo', r, DH * W)};
<% i = 0 %>\
% while i < SPAN:
%   if i in VEC_AT:
    const ${vtype(VW)} v${i} = ${c.LOADV(VW, "x + xr + %d" % i, 0)};
%     for v in range(VW):
    const float x${i + v} = v${i}${comp(VW, v)};
%     endfor
<% i += VW %>\
%   else:
%     if i in GUARD_COL and GUARD_COL[i]:
    const float x${i} = (uint)(iw0 + ${i}) < (uint)W ? ${c.LOAD("x", "xr + %d" % i)} : 0.0f;
%     elif i in GUARD_COL:
    const float x${i} = ${c.LOAD("x", "xr + %d" % i)};
%     endif
<% i += 1 %>\
%   endif
% endwhile
% for s in range(S):
    {
        const ${wt} w = wc[${plus('', r, S, s)}];
%   for qq in range(QT):
%     for kt in range(KT):
        acc[${kt}][${qq}] = mad(w${comp(KT, kt)}, x${qq * SW + s * DW}, acc[${kt}][${qq}]);
%     endfor
%   endfor
    }
% endfor
}
</%def>\

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, ${wmem} const float* ${"" if WCONST else "restrict "}wp,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input
% endif
               __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= ITEMS)
        return;
% if OUTL == "NHWC":
    // a pixel's channel blocks (kb, then the group) on consecutive work-items: they write
    // its channels, contiguous in NHWC, together
    const int kb = gid % KB;
    const int g = gid / KB % G;
    const int qb = gid / (KB * G) % QB;
    const int p = gid / (KB * G * QB) % P;
    const int img = gid / (KB * G * QB * P);
% else:
    const int qb = gid % QB;
    const int p = gid / QB % P;
    const int kb = gid / (QB * P) % KB;
    const int g = gid / (QB * P * KB) % G;
    const int img = gid / (QB * P * KB * G);
% endif
    const int q0 = qb * QT;
    const int ih0 = p * SH - PT, iw0 = q0 * SW - PL;     // top-left input of the first window
    int xo = ((img * C + g * CG) * H + ih0) * W + iw0;   // the same, as an offset (may be < 0)
    ${wmem} const ${wt}* wc = (${wmem} const ${wt}*)wp + (g * KB + kb) * (CG * R * S);

    float acc[KT][QT];
    #pragma unroll
    for (int i = 0; i < KT; ++i)
        #pragma unroll
        for (int j = 0; j < QT; ++j)
            acc[i][j] = 0.0f;

    for (int c = 0; c < CG; ++c, xo += H * W, wc += R * S) {
% if UNROLL_R:
%   for r in range(R):
        // filter row ${r}${" (may fall into the padding)" if GUARD_ROW[r] else ""}
${indent(capture(filter_row, r, GUARD_ROW[r]), 8)}\
%   endfor
% else:
        #pragma unroll 1
        for (int r = 0; r < R; ++r) {
${indent(capture(filter_row, "r", any(GUARD_ROW)), 12)}\
        }
% endif
    }

% if OUTL == "NHWC":
    // epilogue: bias, activation, stores channels-last, a pixel's KT channels one vector
    // (guarded only where a block can pass the edge; a fused residual is read NCHW)
    __global ${c.T()}* const yp = y + ((img * P + p) * Q + q0) * K + g * KG + kb * KT;
%   for kt in range(KT):
<%
        bias_k = capture(c.LOAD, "bias", "g * KG + kb * KT + %d" % kt) if has_bias else None
        if bias_k and KCHK:
            bias_k = "(kb * KT + %d < KG ? %s : 0.0f)" % (kt, bias_k)
%>    const float b${kt} = ${bias_k or "0.0f"};
%   endfor
%   for qq in range(QT):
%     if QCHK:
    if (q0 + ${qq} < Q) {
%     else:
    {
%     endif
%     for kt in range(KT):
<%
        s = "acc[%d][%d] + b%d" % (kt, qq, kt)
        if residual:                            # the residual, NCHW
            r = capture(c.LOAD, "res", "((img * K + g * KG + kb * KT + %d) * P + p) * Q + q0 + %d"
                        % (kt, qq))
            s += " + " + ("(kb * KT + %d < KG ? %s : 0.0f)" % (kt, r) if KCHK else r)
%>\
        const float s${kt} = ${c.act(act, alpha, s)};
%     endfor
%     if KCHK or KT == 1:
%       for kt in range(KT):
        ${"if (kb * KT + %d < KG) " % kt if KCHK else ""}${c.STORE("yp", "%d * K + %d" % (qq, kt), "s%d" % kt)};
%       endfor
%     else:
        ${c.STOREV(KT, "yp + %d * K" % qq, 0, "(float%d)(%s)" % (KT, ", ".join("s%d" % k for k in range(KT))))};
%     endif
    }
%   endfor
% else:
    // epilogue: bias, activation, stores (guarded only where a block can pass the edge)
% for kt in range(KT):
    {
        const int k = kb * KT + ${kt};
%   if KCHK:
        if (k < KG) {
%   else:
        {
%   endif
            __global ${c.T()}* const yr = y + ((img * K + g * KG + k) * P + p) * Q + q0;
%   if residual:
            __global const ${c.T()}* const rr = res + ((img * K + g * KG + k) * P + p) * Q + q0;
%     for qq in range(QT):
            const float s${qq} = ${c.act(act, alpha, "acc[%d][%d]%s + %s" % (kt, qq, " + " + capture(c.LOAD, "bias", "g * KG + k") if has_bias else "", "(q0 + %d < Q ? %s : 0.0f)" % (qq, capture(c.LOAD, "rr", qq)) if QCHK else capture(c.LOAD, "rr", qq)))};
%     endfor
%   else:
%   for qq in range(QT):
            const float s${qq} = ${c.act(act, alpha, "acc[%d][%d]%s" % (kt, qq, " + " + capture(c.LOAD, "bias", "g * KG + k") if has_bias else ""))};
%   endfor
%   endif
%   if QCHK:
%     for qq in range(QT):
            if (q0 + ${qq} < Q)
                ${c.STORE("yr", qq, "s%d" % qq)};
%     endfor
%   elif VW > 1:
%     for q in range(0, QT, VW):
            ${c.STOREV(VW, "yr + %d" % q, 0, "(float%d)(%s)" % (VW, ", ".join("s%d" % (q + v) for v in range(VW))))};
%     endfor
%   else:
%     for qq in range(QT):
            ${c.STORE("yr", qq, "s%d" % qq)};
%     endfor
%   endif
        }
    }
% endfor
% endif
}

<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, indent, plus, vtype

# the acts whose formula (templates/kernels/_common.mako, act) holds for a float vector too;
# the others are applied lane by lane
VECTOR_ACTS = ("relu", "relu6", "sigmoid", "tanh")
%>\
<%
    act, alpha = attrs["act"], attrs["alpha"]
    V = vtype(VW)
    nhwc = LAYOUT == "NHWC"
    # the vector axis and the outer axis, by name
    vname, oname = ("channels", "image") if nhwc else ("images", "channel")

    def lanes(e):
        """the VW lanes of the vector expression e, as scalar expressions"""
        return [e + comp(VW, j) for j in range(VW)]

    def wload(t):
        """the weights of tap t (an int or an expression) for this work-item's lanes"""
        if not nhwc:                      # one channel: one weight for every lane (images)
            w = "wv[%s]" % (t * CP if isinstance(t, int) else "(%s) * CP" % t)
            return w if VW == 1 else "(%s)(%s)" % (V, w)
        i = t * (CP // VW) if isinstance(t, int) else "(%s) * %d" % (t, CP // VW)
        return capture(c.LOADV, VW, "wv", i, "fp32")
%>\
<%def name="LDX(base, off)" filter="trim">\
## the VW lanes at base + off (off an int); the last vector block (VTAIL lanes valid) lane by
## lane, the other lanes 0
% if VTAIL:
(full ? ${c.LOADV(VW, plus(base, 0, 0, off), 0)} : (${V})(${", ".join(capture(c.LOAD, base, off + j) if j < VTAIL else "0.0f" for j in range(VW))}))
% else:
${c.LOADV(VW, plus(base, 0, 0, off), 0) if VW > 1 else capture(c.LOAD, base, off)}
% endif
</%def>\
<%def name="STX(base, off, v)" filter="trim">\
## store the VW lanes of v at base + off; the last vector block only its VTAIL valid lanes
% if VTAIL:
if (full) ${c.STOREV(VW, plus(base, 0, 0, off), 0, v)}; else { ${" ".join(capture(c.STORE, base, off + j, v + comp(VW, j)) + ";" for j in range(VTAIL))} }
% else:
${c.STOREV(VW, plus(base, 0, 0, off), 0, v) if VW > 1 else capture(c.STORE, base, off, v)};
% endif
</%def>\
// ${prefix}: depthwise convolution in ${LAYOUT} (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q} (N x C x H x W), kernel ${R}x${S},
//   stride ${SH}x${SW}, pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${act}; input and output in ${LAYOUT}
// element (n, c, h, w) at ((o * H + h) * W + w) * VA + v with (o, v) = ${"(n, c)" if nhwc else "(c, n)"}: the
//   ${vname} are contiguous (the vector axis, VA = ${VA}), one ${oname} is the outer axis (OA = ${OA})
// one work-item: VW = ${VW} consecutive ${vname} of QT = ${QT} consecutive outputs of one output row;
//   per filter row it loads the ${SPAN} input pixels its windows cover as vectors (guarded only
//   where the padding or edge can be reached) and emits the taps as straight-line code${"" if UNROLL_R else "\n//   (filter rows stay a loop: the block is large)"}.
% if VTAIL:
// ${VA} ${vname} are not whole vectors: the last block's ${VTAIL} lanes are loaded and stored one by one
% endif

// -- tunables
#define LAYOUT_${LAYOUT} 1  // layout of the input read and the output written
#define VW ${VW}            // vector width along the ${vname}
#define QT ${QT}            // outputs per work-item along the row
#define TV ${TV}            // work-items per work-group along the ${vname}
#define TX ${TX}            // work-items per work-group along the row
#define TY ${TY}            // output rows per work-group

// -- the layer
#define BATCH ${BATCH}
#define C ${C}
#define H ${H}
#define W ${W}
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
#define VA ${VA}            // extent of the vector axis (the ${vname})
#define OA ${OA}            // extent of the outer axis
#define VB ${VB}            // vector blocks (VA / VW, rounded up)
#define QB ${QB}            // column blocks per output row (Q / QT, rounded up)
#define PPAD ${PPAD}        // rows rounded up to whole blocks of TY
#define CP ${CP}            // channels of the packed weights${" (C rounded up to whole vectors)" if CP != C else ""}
#define PACKED ${PACKED}    // floats of the packed weights: R*S taps of CP${", then CP of bias" if has_bias else ""}
${c.helpers()}
// Weights [C][1][R][S]${" and bias [C]" if has_bias else ""} -> float [R*S][CP]${" then [CP]" if has_bias else ""}${", zero past C" if CP != C else ""} (run once).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ${c.T()}* restrict w,
% if has_bias:
                    __global const ${c.T()}* restrict bias,
% endif
                    __global float* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= PACKED)
        return;
    const int t = i / CP, ch = i % CP;          // tap (R * S: the bias), channel
% if CP != C:
    if (ch >= C) {
        wp[i] = 0.0f;
        return;
    }
% endif
% if has_bias:
    wp[i] = t < R * S ? ${c.LOAD("w", "ch * (R * S) + t")} : ${c.LOAD("bias", "ch")};
% else:
    wp[i] = ${c.LOAD("w", "ch * (R * S) + t")};
% endif
}

<%def name="filter_row(r, guarded)">\
## r: the filter row, an int (unrolled) or the loop variable "r"; the input pixels this
## work-item's windows read in that row become vector registers x<i>, the taps straight-line code
% if guarded:
if ((uint)(${plus('ih0', r, DH)}) < (uint)H) {
% else:
{
% endif
    __global const ${c.T()}* const xr = ${plus('xb', r, DH * W * VA)};
% for i in USED:
%   if GUARD_COL[i]:
    const ${V} x${i} = (uint)(iw0 + ${i}) < (uint)W ? ${LDX("xr", i * VA)} : (${V})(0.0f);
%   else:
    const ${V} x${i} = ${LDX("xr", i * VA)};
%   endif
% endfor
% for s in range(S):
    {
        const ${V} wt = ${wload(r * S + s if isinstance(r, int) else "r * S + %d" % s)};
%   for qq in range(QT):
        acc${qq} = mad(wt, x${qq * SW + s * DW}, acc${qq});
%   endfor
    }
% endfor
}
</%def>\
__kernel __attribute__((reqd_work_group_size(TV, TX, TY)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const float* restrict wp,
               __global ${c.T()}* restrict y)
{
    const int vb = get_global_id(0);                    // vector block along the ${vname}
    const int qb = get_global_id(1);                    // column block
    const int o = get_global_id(2) / PPAD, p = get_global_id(2) % PPAD;   // ${oname}, row
<% checks = [cond for cond, on in (("vb >= VB", VCHK), ("qb >= QB", XCHK), ("p >= P", YCHK)) if on] %>\
% if checks:
    if (${" || ".join(checks)})
        return;
% endif
% if VTAIL:
    const int full = vb < VB - 1;                       // all VW lanes hold ${vname}
% endif
    const int q0 = qb * QT;
    const int ih0 = p * SH - PT, iw0 = q0 * SW - PL;     // top-left input of the first window
    // the same as a pointer (it may point before the image: only guarded loads go there)
    __global const ${c.T()}* const xb = x + ((o * H + ih0) * W + iw0) * VA + vb * VW;
% if nhwc:
    __global const float* const wv = wp + vb * VW;     // this block's channels, tap 0
% else:
    __global const float* const wv = wp + o;           // this work-item's channel, tap 0
% endif

% for qq in range(QT):
    ${V} acc${qq} = (${V})(0.0f);
% endfor

% if UNROLL_R:
%   for r in range(R):
    // filter row ${r}${" (may fall into the padding)" if GUARD_ROW[r] else ""}
${indent(capture(filter_row, r, GUARD_ROW[r]), 4)}\
%   endfor
% else:
    #pragma unroll 1
    for (int r = 0; r < R; ++r) {
${indent(capture(filter_row, "r", any(GUARD_ROW)), 8)}\
    }
% endif

    // epilogue: bias, activation, stores (guarded only where a block can pass the row's end)
% if has_bias:
    const ${V} b = ${wload(R * S)};
% endif
    __global ${c.T()}* const yq = y + ((o * P + p) * Q + q0) * VA + vb * VW;
% for qq in range(QT):
<%  a = "acc%d" % qq %>\
%   if has_bias:
    ${a} += b;
%   endif
%   if act != "none":
%     if VW == 1 or act in VECTOR_ACTS:
    ${a} = ${c.act(act, alpha, a)};
%     else:
    ${a} = (${V})(${", ".join(capture(c.act, act, alpha, e) for e in lanes(a))});
%     endif
%   endif
%   if QCHK:
    if (q0 + ${qq} < Q) {
        ${STX("yq", qq * VA, a)}
    }
%   else:
    ${STX("yq", qq * VA, a)}
%   endif
% endfor
}

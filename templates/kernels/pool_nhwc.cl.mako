<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, vtype
%>\
<%
    V = vtype(VW)
    nhwc = LAYOUT == "NHWC"
    vname, oname = ("channels", "image") if nhwc else ("images", "channel")
    init = "(%s)(-INFINITY)" % V if is_max else "(%s)(0.0f)" % V
%>\
<%def name="LDX(p)" filter="trim">\
## the VW lanes at pointer p; the last vector block (VTAIL lanes valid) lane by lane
% if VTAIL:
(full ? ${c.LOADV(VW, p, 0)} : (${V})(${", ".join(capture(c.LOAD, p, j) if j < VTAIL else "0.0f" for j in range(VW))}))
% else:
${c.LOADV(VW, p, 0)}
% endif
</%def>\
<%def name="STX(p, v)" filter="trim">\
## store the VW lanes of v at pointer p; the last vector block only its VTAIL valid lanes
% if VTAIL:
if (full) ${c.STOREV(VW, p, 0, v)}; else { ${" ".join(capture(c.STORE, p, j, v + comp(VW, j)) + ";" for j in range(VTAIL))} }
% else:
${c.STOREV(VW, p, 0, v)};
% endif
</%def>\
// ${prefix}: ${"max" if is_max else "average"} pooling in ${LAYOUT} (${variant})
//   in ${N}x${C}x${H}x${W} -> out ${N}x${C}x${P}x${Q} (N x C x H x W), kernel ${KH}x${KW}, stride ${SH}x${SW}, pad ${PH}x${PW},
//   ceil_mode ${attrs["ceil_mode"]}${"" if is_max else ", count_include_pad %s" % include_pad}; input and output in ${LAYOUT}
// element (n, c, h, w) at ((o * H + h) * W + w) * VA + v with (o, v) = ${"(n, c)" if nhwc else "(c, n)"}: the
//   ${vname} are contiguous (the vector axis, VA = ${VA}), one ${oname} is the outer axis (OA = ${OA})
// one work-item: VW = ${VW} consecutive ${vname} of one output pixel; work-items ordered (o, p, q, vector block)
% if CLIP_H or CLIP_W:
// windows clipped to the input along ${" and ".join(a for a, on in (("the rows", CLIP_H), ("the columns", CLIP_W)) if on)} (the padding or the ceil_mode overhang reaches there)
% endif
% if VTAIL:
// ${VA} ${vname} are not whole vectors: the last block's ${VTAIL} lanes are loaded and stored one by one
% endif

// -- tunables
#define LAYOUT_${LAYOUT} 1  // layout of the input read and the output written
#define VW ${VW}            // vector width along the ${vname}
#define WG ${WG}            // work-group size

// -- the layer
#define H ${H}
#define W ${W}
#define P ${P}
#define Q ${Q}
#define KH ${KH}
#define KW ${KW}
#define SH ${SH}
#define SW ${SW}
#define PH ${PH}
#define PW ${PW}
#define VA ${VA}            // extent of the vector axis (the ${vname})
#define VB ${VB}            // vector blocks (VA / VW, rounded up)
#define N_ITEMS ${ITEMS}    // OA * P * Q * VB

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
% if ICHK:
    if (gid >= N_ITEMS)
        return;
% endif
    const int vb = gid % VB;
    const int q = (gid / VB) % Q;
    const int p = (gid / (VB * Q)) % P;
    const int o = gid / (VB * Q * P);
% if VTAIL:
    const int full = vb < VB - 1;                       // all VW lanes hold ${vname}
% endif
    const int y0 = p * SH - PH, x0 = q * SW - PW;       // the window's top-left input
% if CLIP_H:
    const int ys = max(y0, 0), ye = min(y0 + KH, H);
% else:
    const int ys = y0, ye = y0 + KH;
% endif
% if CLIP_W:
    const int xs = max(x0, 0), xe = min(x0 + KW, W);
% else:
    const int xs = x0, xe = x0 + KW;
% endif
    __global const ${c.T()}* const xo = x + o * (H * W * VA) + vb * VW;
    ${V} acc = ${init};
    for (int iy = ys; iy < ye; ++iy)
        for (int ix = xs; ix < xe; ++ix) {
            __global const ${c.T()}* const xp = xo + (iy * W + ix) * VA;
% if is_max:
            acc = fmax(acc, ${LDX("xp")});
% else:
            acc += ${LDX("xp")};
% endif
        }
% if not is_max:
<%
    if not CLIP_H:
        rows = "KH"
    elif include_pad:
        rows = "(min(y0 + KH, H + PH) - y0)"      # padding counts, the ceil overhang does not
    else:
        rows = "(ye - ys)"
    if not CLIP_W:
        cols = "KW"
    elif include_pad:
        cols = "(min(x0 + KW, W + PW) - x0)"
    else:
        cols = "(xe - xs)"
%>\
    acc /= (float)(${rows} * ${cols});                 // ${"the window within the padded input" if include_pad else "the window within the input"}
% endif
    __global ${c.T()}* const yp = y + ((o * P + p) * Q + q) * VA + vb * VW;
    ${STX("yp", "acc")}
}

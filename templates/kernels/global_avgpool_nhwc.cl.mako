<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, vtype
%>\
<%
    V = vtype(VW)
    nhwc = LAYOUT == "NHWC"
    vname, oname = ("channels", "image") if nhwc else ("images", "channel")
%>\
// ${prefix}: global average pooling of ${N}x${C} planes of ${HW} values, input in ${LAYOUT} (${variant})
//   pixel i of (n, c) at (o * HW + i) * VA + v with (o, v) = ${"(n, c)" if nhwc else "(c, n)"}: the ${vname} are contiguous
//   (the vector axis, VA = ${VA}), one ${oname} is the outer axis (OA = ${OA}); output N x C x 1 x 1 in NCHW${"" if nhwc else " (the images of a channel C apart)"}
// one work-item: VW = ${VW} consecutive ${vname} of one ${oname}, summed over the ${HW} pixels as vectors
% if VTAIL:
// ${VA} ${vname} are not whole vectors: the last block's ${VTAIL} lanes are loaded and stored one by one
% endif

// -- tunables
#define LAYOUT_${LAYOUT} 1  // layout of the input read
#define VW ${VW}            // vector width along the ${vname}
#define WG ${WG}            // work-group size

// -- the layer
#define C ${C}
#define HW ${HW}            // pixels per plane (H*W)
#define VA ${VA}            // extent of the vector axis (the ${vname})
#define VB ${VB}            // vector blocks (VA / VW, rounded up)
#define N_ITEMS ${ITEMS}    // outer axis * VB

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
% if ICHK:
    if (gid >= N_ITEMS)
        return;
% endif
    const int vb = gid % VB, o = gid / VB;
% if VTAIL:
    const int full = vb < VB - 1;                       // all VW lanes hold ${vname}
% endif
    __global const ${c.T()}* const xo = x + o * (HW * VA) + vb * VW;
    ${V} acc = (${V})(0.0f);
    for (int i = 0; i < HW; ++i) {
        __global const ${c.T()}* const xp = xo + i * VA;
% if VTAIL:
        acc += full ? ${c.LOADV(VW, "xp", 0)} : (${V})(${", ".join(capture(c.LOAD, "xp", j) if j < VTAIL else "0.0f" for j in range(VW))});
% else:
        acc += ${c.LOADV(VW, "xp", 0)};
% endif
    }
    acc *= 1.0f / HW;
% if nhwc:
    __global ${c.T()}* const yp = y + o * C + vb * VW;    // (n, c) at n * C + c: the vector as it is
% if VTAIL:
    if (full) ${c.STOREV(VW, "yp", 0, "acc")}; else { ${" ".join(capture(c.STORE, "yp", j, "acc" + comp(VW, j)) + ";" for j in range(VTAIL))} }
% else:
    ${c.STOREV(VW, "yp", 0, "acc")};
% endif
% else:
    __global ${c.T()}* const yp = y + vb * VW * C + o;    // (n, c) at n * C + c: lane j is image vb * VW + j
% for j in range(VW):
% if VTAIL and j >= VTAIL:
    if (full)
        ${c.STORE("yp", "%d * C" % j, "acc" + comp(VW, j))};
% else:
    ${c.STORE("yp", "%d * C" % j if j else "0", "acc" + comp(VW, j))};
% endif
% endfor
% endif
}

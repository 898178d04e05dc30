<%namespace name="c" file="_common.mako"/>\
<%
    nhwc = LAYOUT == "NHWC"
    # the factor of element i: its (n, c) plane, stored in the layout as s [N, C, 1, 1] is
    factor = "(i / (HW * VA)) * VA + i % VA" if per_plane else "i"
%>\
// ${prefix}: ${layer.op} of ${N_ELEMS} elements in ${LAYOUT} (${variant}): ${"y = x * s, one factor s per (n, c) plane of " + str(HW) + " elements" if per_plane else "y = x * s elementwise"}
% if per_plane:
//   x element i = ((o * H + h) * W + w) * VA + v with (o, v) = ${"(n, c)" if nhwc else "(c, n)"}; s in ${LAYOUT} at o * VA + v
% else:
//   every input and the output in ${LAYOUT} (elementwise: the kernel indexes the flat storage)
% endif
// one work-item: VEC consecutive elements
#define LAYOUT_${LAYOUT} 1  // layout of x, s and y
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements per work-item
#define N_ELEMS ${N_ELEMS}
% if per_plane:
#define HW ${HW}  // elements per plane (H*W)
#define VA ${VA}  // the contiguous axis: ${"channels" if nhwc else "images"}
% endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict s,
               __global ${c.T()}* restrict y)
{
    const int i0 = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = i0 + v;
        if (i < N_ELEMS)
            ${c.STORE("y", "i", capture(c.LOAD, "x", "i") + " * " + capture(c.LOAD, "s", factor))};
    }
}

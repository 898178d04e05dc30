<%namespace name="c" file="_common.mako"/>\
// ${prefix}: ${layer.op} of ${N_ELEMS} elements (${variant}): ${"y = x * s, one factor s per (n, c) plane of " + str(HW) + " elements" if per_plane else "y = x * s elementwise"}
// one work-item: VEC consecutive elements
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements per work-item
#define N_ELEMS ${N_ELEMS}
% if per_plane:
#define HW ${HW}  // elements per plane (H*W)
% endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict s,
               __global ${c.T()}* restrict y)
{
    const int i0 = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = i0 + v;
        if (i < N_ELEMS)
            ${c.STORE("y", "i", capture(c.LOAD, "x", "i") + " * " + capture(c.LOAD, "s", "i / HW" if per_plane else "i"))};
    }
}

<%namespace name="c" file="_common.mako"/>\
// ${prefix}: ${what} (${variant}): ${N}x${C_IN}x${HW} -> ${N}x${C_OUT}x${HW} (N x C x H*W)
// one work-item: VEC consecutive elements of one output plane, copied from its input plane
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements of a plane per work-item
#define N ${N}
#define C_IN ${C_IN}  // input channels
#define C_OUT ${C_OUT}  // output channels
#define HW ${HW}  // H*W
#define PLANE_ITEMS ((HW + VEC - 1) / VEC)  // work-items per plane

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N * C_OUT * PLANE_ITEMS)
        return;
    const int t = gid % PLANE_ITEMS;
    const int nc = gid / PLANE_ITEMS;            // output plane n * C_OUT + o
    const int o = nc % C_OUT;
    const int n = nc / C_OUT;
    __global const ${c.T()}* xp = x + (n * C_IN + ${src}) * HW;
    __global ${c.T()}* yp = y + nc * HW;
    for (int v = 0; v < VEC; ++v) {
        const int i = t * VEC + v;
        if (i < HW)
            ${c.STORE("yp", "i", capture(c.LOAD, "xp", "i"))};
    }
}

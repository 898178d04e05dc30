<%namespace name="c" file="_common.mako"/>\
// ${prefix}: crop (${variant}): ${NC} planes of ${H}x${W} -> ${P}x${Q}, from row ${TOP}, column ${LEFT}
// one work-item: VEC consecutive elements of one output row
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements of a row per work-item
#define NC ${NC}  // planes (N*C)
#define H ${H}
#define W ${W}
#define P ${P}  // output rows
#define Q ${Q}  // output columns
#define TOP ${TOP}  // first input row kept
#define LEFT ${LEFT}  // first input column kept
#define ROW_ITEMS ((Q + VEC - 1) / VEC)  // work-items per output row

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= NC * P * ROW_ITEMS)
        return;
    const int t = gid % ROW_ITEMS;
    const int row = gid / ROW_ITEMS;             // output row nc * P + r
    const int r = row % P;
    const int nc = row / P;
    __global const ${c.T()}* xr = x + (nc * H + TOP + r) * W + LEFT;
    __global ${c.T()}* yr = y + row * Q;
    for (int v = 0; v < VEC; ++v) {
        const int j = t * VEC + v;
        if (j < Q)
            ${c.STORE("yr", "j", capture(c.LOAD, "xr", "j"))};
    }
}

<%namespace name="c" file="_common.mako"/>\
// ${prefix}: global average pooling (${variant}), ${NC} planes of ${HW} values
% if RED == "item":
// one work-item per plane
% else:
// one work-group per plane: WG partial sums, then a tree in local memory
% endif
#define WG ${WG}  // work-group size
#define NC ${NC}  // planes (N*C)
#define HW ${HW}  // values per plane (H*W)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
% if RED == "item":
    const int plane = get_global_id(0);
    if (plane >= NC)
        return;
    __global const ${c.T()}* xp = x + plane * HW;
    float acc = 0.0f;
    for (int i = 0; i < HW; ++i)
        acc += ${c.LOAD("xp", "i")};
    ${c.STORE("y", "plane", "acc * (1.0f / HW)")};
% else:
    __local float part[WG];
    const int lid = get_local_id(0);
    const int plane = get_group_id(0);
    __global const ${c.T()}* xp = x + plane * HW;
    float acc = 0.0f;
    for (int i = lid; i < HW; i += WG)
        acc += ${c.LOAD("xp", "i")};
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        ${c.STORE("y", "plane", "part[0] * (1.0f / HW)")};
% endif
}

// ${prefix}: softmax over ${C} channels (${variant}), ${N}x${C}x${HW} (N x C x H*W)
% if RED == "item":
// one work-item per (n, h, w): max, sum of exp, then scale
% else:
// one work-group per (n, h, w): max and sum reduced by trees in local memory
% endif
#define WG ${WG}  // work-group size
#define N ${N}
#define C ${C}
#define HW ${HW}  // H*W: the stride between channels

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const float* restrict x, __global float* restrict y)
{
% if RED == "item":
    const int gid = get_global_id(0);
    if (gid >= N * HW)
        return;
    const int base = gid / HW * (C * HW) + gid % HW;
    float m = -INFINITY;
    for (int c = 0; c < C; ++c)
        m = fmax(m, x[base + c * HW]);
    float sum = 0.0f;
    for (int c = 0; c < C; ++c)
        sum += exp(x[base + c * HW] - m);
    const float inv = 1.0f / sum;
    for (int c = 0; c < C; ++c)
        y[base + c * HW] = exp(x[base + c * HW] - m) * inv;
% else:
    __local float part[WG];
    const int lid = get_local_id(0);
    const int col = get_group_id(0);
    const int base = col / HW * (C * HW) + col % HW;
    float m = -INFINITY;
    for (int c = lid; c < C; c += WG)
        m = fmax(m, x[base + c * HW]);
    part[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] = fmax(part[lid], part[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);          // everyone has read the max before part is reused
    float sum = 0.0f;
    for (int c = lid; c < C; c += WG)
        sum += exp(x[base + c * HW] - m);
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / part[0];
    for (int c = lid; c < C; c += WG)
        y[base + c * HW] = exp(x[base + c * HW] - m) * inv;
% endif
}

<%namespace name="c" file="_common.mako"/>\
<%
    channels = tuple(axes) == (1,) and not log        # the original kernel, text unchanged
    names = "".join("NCHW"[a] for a in axes)
    what = "log-softmax" if log else "softmax"
%>\
% if channels:
// ${prefix}: softmax over ${C} channels (${variant}), ${N}x${C}x${HW} (N x C x H*W)
% else:
// ${prefix}: ${what} over axes ${names} (${variant}): ${N}x${C}x${HW} (before x ${names} x after)
% endif
% if channels and RED == "item":
// one work-item per (n, h, w): max, sum of exp, then scale
% elif channels:
// one work-group per (n, h, w): max and sum reduced by trees in local memory
% elif RED == "item":
// one work-item per ${what}: max, sum of exp, then ${"x - max - log(sum)" if log else "scale"}
% else:
// one work-group per ${what}: max and sum reduced by trees in local memory
% endif
#define WG ${WG}  // work-group size
% if channels:
#define N ${N}
#define C ${C}
#define HW ${HW}  // H*W: the stride between channels
% else:
#define N ${N}  // positions before the axes (the softmaxes' outer index)
#define C ${C}  // values in one softmax
#define HW ${HW}  // positions after the axes: the stride between its values
% endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T(src_storage)}* restrict x, __global ${c.T()}* restrict y)
{
% if RED == "item":
    const int gid = get_global_id(0);
    if (gid >= N * HW)
        return;
    const int base = gid / HW * (C * HW) + gid % HW;
    float m = -INFINITY;
    for (int c = 0; c < C; ++c)
        m = fmax(m, ${c.LOAD("x", "base + c * HW", src_storage)});
    float sum = 0.0f;
    for (int c = 0; c < C; ++c)
        sum += exp(${c.LOAD("x", "base + c * HW", src_storage)} - m);
% if log:
    const float ls = log(sum);             // (x - m) - ls: x - m is exact near the max
    for (int c = 0; c < C; ++c)
        ${c.STORE("y", "base + c * HW", "(%s - m) - ls" % capture(c.LOAD, "x", "base + c * HW", src_storage))};
% else:
    const float inv = 1.0f / sum;
    for (int c = 0; c < C; ++c)
        ${c.STORE("y", "base + c * HW", "exp(%s - m) * inv" % capture(c.LOAD, "x", "base + c * HW", src_storage))};
% endif
% else:
    __local float part[WG];
    const int lid = get_local_id(0);
    const int col = get_group_id(0);
    const int base = col / HW * (C * HW) + col % HW;
    float m = -INFINITY;
    for (int c = lid; c < C; c += WG)
        m = fmax(m, ${c.LOAD("x", "base + c * HW", src_storage)});
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
        sum += exp(${c.LOAD("x", "base + c * HW", src_storage)} - m);
    part[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% if log:
    const float ls = log(part[0]);
    for (int c = lid; c < C; c += WG)
        ${c.STORE("y", "base + c * HW", "(%s - m) - ls" % capture(c.LOAD, "x", "base + c * HW", src_storage))};
% else:
    const float inv = 1.0f / part[0];
    for (int c = lid; c < C; c += WG)
        ${c.STORE("y", "base + c * HW", "exp(%s - m) * inv" % capture(c.LOAD, "x", "base + c * HW", src_storage))};
% endif
% endif
}

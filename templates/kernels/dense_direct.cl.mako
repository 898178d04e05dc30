<%namespace name="c" file="_common.mako"/>\
<% has_bias = attrs["bias"] %>\
// ${prefix}: fully connected (${variant}), ${N}x${IN} -> ${N}x${OUT}, bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}
% if RED == "item":
// one work-item per output y[n, o]; work-items ordered (n, o)
% else:
// one work-group per output y[n, o]: WG partial sums, then a tree in local memory
% endif
#define WG ${WG}  // work-group size
#define N ${N}
#define IN ${IN}  // inputs per sample (C*H*W)
#define OUT ${OUT}
${c.helpers()}
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict w,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
               __global ${c.T()}* restrict y)
{
% if RED == "item":
    const int gid = get_global_id(0);
    if (gid >= N * OUT)
        return;
    const int o = gid % OUT;
    const int n = gid / OUT;
    __global const ${c.T()}* xn = x + n * IN;
    __global const ${c.T()}* wo = w + o * IN;
    float acc = 0.0f;
    for (int i = 0; i < IN; ++i)
        acc += ${c.LOAD("xn", "i")} * ${c.LOAD("wo", "i")};
% else:
    __local float part[WG];
    const int lid = get_local_id(0);
    const int o = get_group_id(0) % OUT;
    const int n = get_group_id(0) / OUT;
    __global const ${c.T()}* xn = x + n * IN;
    __global const ${c.T()}* wo = w + o * IN;
    float acc = 0.0f;
    for (int i = lid; i < IN; i += WG)
        acc += ${c.LOAD("xn", "i")} * ${c.LOAD("wo", "i")};
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid != 0)
        return;
    acc = part[0];
% endif
    const float s = acc${" + " + capture(c.LOAD, "bias", "o") if has_bias else ""};
    ${c.STORE("y", "n * OUT + o", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
}

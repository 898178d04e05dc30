<%namespace name="c" file="_common.mako"/>\
// ${prefix}: batch normalisation (${variant}), ${N}x${C}x${HW} (N x C x H*W), eps ${"%g" % attrs["eps"]}, act ${attrs["act"]}
// one work-item: VEC consecutive elements; parameters ${"folded once by %s_fold" % prefix if FOLD == "setup" else "folded per element"}
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements per work-item
#define N ${N}
#define C ${C}
#define HW ${HW}  // H*W
#define EPS ${c.flt(attrs["eps"])}
${c.helpers()}
% if FOLD == "setup":
// once, in set_params: scale_shift[c] = gamma / sqrt(var + eps), scale_shift[C + c] = beta - mean * scale
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}_fold(__global const ${c.T()}* restrict gamma, __global const ${c.T()}* restrict beta,
                    __global const ${c.T()}* restrict mean, __global const ${c.T()}* restrict var,
                    __global float* restrict scale_shift)
{
    const int c = get_global_id(0);
    if (c >= C)
        return;
    const float scale = ${c.LOAD("gamma", "c")} / sqrt(${c.LOAD("var", "c")} + EPS);
    scale_shift[c] = scale;
    scale_shift[C + c] = ${c.LOAD("beta", "c")} - ${c.LOAD("mean", "c")} * scale;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const float* restrict scale_shift,
               __global ${c.T()}* restrict y)
% else:
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x,
               __global const ${c.T()}* restrict gamma, __global const ${c.T()}* restrict beta,
               __global const ${c.T()}* restrict mean, __global const ${c.T()}* restrict var,
               __global ${c.T()}* restrict y)
% endif
{
    const int i0 = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = i0 + v;
        if (i < N * C * HW) {
            const int c = i / HW % C;
% if FOLD == "setup":
            const float s = ${c.LOAD("x", "i")} * scale_shift[c] + scale_shift[C + c];
% else:
            const float scale = ${c.LOAD("gamma", "c")} / sqrt(${c.LOAD("var", "c")} + EPS);
            const float s = (${c.LOAD("x", "i")} - ${c.LOAD("mean", "c")}) * scale + ${c.LOAD("beta", "c")};
% endif
            ${c.STORE("y", "i", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
        }
    }
}

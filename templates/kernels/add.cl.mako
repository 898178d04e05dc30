<%namespace name="c" file="_common.mako"/>\
// ${prefix}: sum of ${M} inputs of ${N_ELEMS} elements (${variant}), act ${attrs["act"]}
// one work-item: VEC consecutive elements
#define WG ${WG}  // work-group size
#define VEC ${VEC}  // elements per work-item
#define N_ELEMS ${N_ELEMS}
${c.helpers()}
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(${", ".join("__global const %s* restrict x%d" % (capture(c.T), i) for i in range(M))},
               __global ${c.T()}* restrict y)
{
    const int i0 = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = i0 + v;
        if (i < N_ELEMS) {
            const float s = ${" + ".join(capture(c.LOAD, "x%d" % i, "i") for i in range(M))};
            ${c.STORE("y", "i", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
        }
    }
}

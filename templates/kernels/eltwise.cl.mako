<%namespace name="c" file="_common.mako"/>
// ${prefix}: ${layer.op} over ${N_ELEMS} elements (${variant})
#define N_ELEMS ${N_ELEMS}  // elements in the tensor
#define VEC ${VEC}          // elements per work-item
${c.helpers()}
__kernel void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int i0 = get_global_id(0) * VEC;
    for (int v = 0; v < VEC; ++v) {
        const int i = i0 + v;
        if (i < N_ELEMS) {
            const float s = ${c.LOAD("x", "i")};
            ${c.STORE("y", "i", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
        }
    }
}

<%namespace name="c" file="_common.mako"/>\
<%
    has_bias = attrs["bias"]
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
%>\
// ${prefix}: direct convolution (${variant})
//   in ${N}x${C}x${H}x${W} -> out ${N}x${K}x${P}x${Q}, kernel ${KH}x${KW}, stride ${SH}x${SW},
//   pad top/left ${PT}/${PL}, dilation ${DH}x${DW}, groups ${G}, bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}
// one work-item: KB output channels of one output pixel; work-items ordered (n, k/KB, p, q)
#define WG ${WG}  // work-group size
#define KB ${KB}  // output channels per work-item
#define N ${N}
#define C ${C}
#define H ${H}
#define W ${W}
#define K ${K}
#define P ${P}
#define Q ${Q}
#define KH ${KH}
#define KW ${KW}
#define SH ${SH}
#define SW ${SW}
#define DH ${DH}
#define DW ${DW}
#define PT ${PT}
#define PL ${PL}
#define CG ${CG}  // input channels per group
#define KG ${KG}  // output channels per group
#define N_ITEMS (N * (K / KB) * P * Q)
${c.helpers()}
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict w,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input
% endif
               __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N_ITEMS)
        return;
    const int q = gid % Q;
    const int p = (gid / Q) % P;
    const int k0 = (gid / (Q * P)) % (K / KB) * KB;
    const int n = gid / (Q * P * (K / KB));
    const int c0 = k0 / KG * CG;              // first input channel of this group
    const int iy0 = p * SH - PT;
    const int ix0 = q * SW - PL;
% for r in range(KB):
    float acc${r} = 0.0f;
% endfor
    for (int ci = 0; ci < CG; ++ci) {
        __global const ${c.T()}* xc = x + ((n * C + c0 + ci) * H) * W;
        __global const ${c.T()}* wc = w + (k0 * CG + ci) * (KH * KW);
        #pragma unroll
        for (int i = 0; i < KH; ++i) {
            const int iy = iy0 + i * DH;
            if (iy < 0 || iy >= H)
                continue;
            #pragma unroll
            for (int j = 0; j < KW; ++j) {
                const int ix = ix0 + j * DW;
                if (ix < 0 || ix >= W)
                    continue;
                const float v = ${c.LOAD("xc", "iy * W + ix")};
% for r in range(KB):
                acc${r} += v * ${c.LOAD("wc", "%d * CG * KH * KW + i * KW + j" % r)};
% endfor
            }
        }
    }
% for r in range(KB):
    {
% if residual:
        const int o = ((n * K + k0 + ${r}) * P + p) * Q + q;
        const float s = acc${r}${" + " + capture(c.LOAD, "bias", "k0 + %d" % r) if has_bias else ""} + ${c.LOAD("res", "o")};
        ${c.STORE("y", "o", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
% else:
        const float s = acc${r}${" + " + capture(c.LOAD, "bias", "k0 + %d" % r) if has_bias else ""};
        ${c.STORE("y", "((n * K + k0 + %d) * P + p) * Q + q" % r, capture(c.act, attrs["act"], attrs["alpha"], "s"))};
% endif
    }
% endfor
}

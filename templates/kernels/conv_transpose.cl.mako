<%namespace name="c" file="_common.mako"/>\
<% has_bias = attrs["bias"] %>\
## taps(axis, t, S, D, K, L, i, r): the loop over the filter taps r (and input index i) of one
## axis that land on output position t (= output index + begin pad): i * S + r * D = t
<%def name="taps(t, S, D, K, L, i, r)">\
% if D == 1:
for (int ${r} = ${t} % ${S}, ${i} = ${t} / ${S}; ${r} < ${K} && ${i} >= 0; ${r} += ${S}, --${i}) {
            if (${i} >= ${L})
                continue;
% else:
for (int ${r} = 0; ${r} < ${K} && ${t} - ${r} * ${D} >= 0; ++${r}) {
            if ((${t} - ${r} * ${D}) % ${S})
                continue;
            const int ${i} = (${t} - ${r} * ${D}) / ${S};
            if (${i} >= ${L})
                continue;
% endif
</%def>\
// ${prefix}: transposed convolution (${variant})
//   in ${N}x${C}x${H}x${W} -> out ${N}x${K}x${P}x${Q}, kernel ${KH}x${KW}, stride ${SH}x${SW},
//   pad top/left ${PT}/${PL}, dilation ${DH}x${DW}, groups ${G}, bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}
// weights (C_in, C_out/groups, KH, KW); output (p, q) gathers input (iy, ix) through tap (r, s)
// where iy * SH + r * DH = p + PT and ix * SW + s * DW = q + PL
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
void ${prefix}(__global const float* restrict x, __global const float* restrict w,
% if has_bias:
               __global const float* restrict bias,
% endif
               __global float* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N_ITEMS)
        return;
    const int q = gid % Q;
    const int p = (gid / Q) % P;
    const int k0 = (gid / (Q * P)) % (K / KB) * KB;
    const int n = gid / (Q * P * (K / KB));
    const int c0 = k0 / KG * CG;              // first input channel of this group
    const int ty = p + PT;
    const int tx = q + PL;
% for j in range(KB):
    float acc${j} = 0.0f;
% endfor
    for (int ci = 0; ci < CG; ++ci) {
        __global const float* xc = x + ((n * C + c0 + ci) * H) * W;
        __global const float* wc = w + ((c0 + ci) * KG + k0 % KG) * (KH * KW);
        ${taps("ty", SH, DH, KH, "H", "iy", "r")}
            ${taps("tx", SW, DW, KW, "W", "ix", "s")}
                const float v = xc[iy * W + ix];
% for j in range(KB):
                acc${j} += v * wc[${j} * KH * KW + r * KW + s];
% endfor
            }
        }
    }
% for j in range(KB):
    {
        const float s = acc${j}${" + bias[k0 + %d]" % j if has_bias else ""};
        y[((n * K + k0 + ${j}) * P + p) * Q + q] = ${c.act(attrs["act"], attrs["alpha"], "s")};
    }
% endfor
}

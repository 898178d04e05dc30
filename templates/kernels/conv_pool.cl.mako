<%namespace name="c" file="_common.mako"/>\
<%
has_bias = attrs["bias"]
kind = attrs["act"]
# bias and act after the reduction where they commute with it (see conv_pool.py); padded
# positions counted by count_include_pad add zeros, not the bias
post = is_max or (kind == "none" and not include_pad)
%>\
// ${prefix}: convolution with fused ${"max" if is_max else "average"} pooling (${variant})
//   in ${N}x${C}x${H}x${W} -> conv ${N}x${K}x${CP}x${CQ} (never stored) -> out ${N}x${K}x${P}x${Q}
//   conv: kernel ${KH}x${KW}, stride ${SH}x${SW}, pad top/left ${PT}/${PL}, dilation ${DH}x${DW}, groups ${G}, bias ${"yes" if has_bias else "no"}, act ${kind}
//   pool: kernel ${PKH}x${PKW}, stride ${PSH}x${PSW}, pad ${PPH}x${PPW}, ceil_mode ${ceil_mode}${"" if is_max else ", count_include_pad %s" % include_pad}
//   bias and act ${"after the %s, once" % ("max" if is_max else "sum") if post else "at each window position"}
// one work-item: KB output channels of one pooled pixel; work-items ordered (n, k/KB, p, q)
#define WG ${WG}  // work-group size
#define KB ${KB}  // output channels per work-item
#define N ${N}
#define C ${C}
#define H ${H}
#define W ${W}
#define K ${K}
#define CP ${CP}  // conv output height
#define CQ ${CQ}  // conv output width
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
#define PKH ${PKH}  // pooling window
#define PKW ${PKW}
#define PSH ${PSH}
#define PSW ${PSW}
#define PPH ${PPH}
#define PPW ${PPW}
#define CG ${CG}  // input channels per group
#define KG ${KG}  // output channels per group
#define N_ITEMS (N * (K / KB) * P * Q)
${c.helpers()}
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict w,
% if has_bias:
               __global const ${c.T()}* restrict bias,
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
    __global const ${c.T()}* xn = x + (n * C + c0) * (H * W);
    __global const ${c.T()}* wk = w + k0 * CG * (KH * KW);
    // the pooling window over the conv output, clipped as pool_direct clips it
    const int y0 = p * PSH - PPH;
    const int x0 = q * PSW - PPW;
    const int ys = max(y0, 0), y1 = min(y0 + PKH, CP);
    const int xs = max(x0, 0), x1 = min(x0 + PKW, CQ);
% for r in range(KB):
    float pool${r} = ${"-INFINITY" if is_max else "0.0f"};
% endfor
    for (int cy = ys; cy < y1; ++cy) {
        const int iy0 = cy * SH - PT;
        for (int cx = xs; cx < x1; ++cx) {
            const int ix0 = cx * SW - PL;
% for r in range(KB):
            float acc${r} = 0.0f;
% endfor
            for (int ci = 0; ci < CG; ++ci) {
                __global const ${c.T()}* xc = xn + ci * (H * W);
                __global const ${c.T()}* wc = wk + ci * (KH * KW);
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
% if post:
            pool${r} = ${"fmax(pool%d, acc%d)" % (r, r) if is_max else "pool%d + acc%d" % (r, r)};
% else:
            {
                const float s = acc${r}${" + " + capture(c.LOAD, "bias", "k0 + %d" % r) if has_bias else ""};
                pool${r} += ${c.act(kind, attrs["alpha"], "s")};
            }
% endif
% endfor
        }
    }
% if not is_max:
% if include_pad:
    // padding counts, the ceil overhang does not
    const float inv = 1.0f / (float)((min(y0 + PKH, CP + PPH) - y0) * (min(x0 + PKW, CQ + PPW) - x0));
% else:
    const float inv = 1.0f / (float)((y1 - ys) * (x1 - xs));
% endif
% endif
% for r in range(KB):
    {
% if is_max:
        const float s = pool${r}${" + " + capture(c.LOAD, "bias", "k0 + %d" % r) if has_bias else ""};
        ${c.STORE("y", "((n * K + k0 + %d) * P + p) * Q + q" % r, capture(c.act, kind, attrs["alpha"], "s"))};
% elif post:
        ${c.STORE("y", "((n * K + k0 + %d) * P + p) * Q + q" % r, "pool%d * inv%s" % (r, " + " + capture(c.LOAD, "bias", "k0 + %d" % r) if has_bias else ""))};
% else:
        ${c.STORE("y", "((n * K + k0 + %d) * P + p) * Q + q" % r, "pool%d * inv" % r)};
% endif
    }
% endfor
}

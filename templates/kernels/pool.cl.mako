<%namespace name="c" file="_common.mako"/>\
// ${prefix}: ${"max" if is_max else "average"} pooling (${variant})
//   in ${N}x${C}x${H}x${W} -> out ${N}x${C}x${P}x${Q}, kernel ${KH}x${KW}, stride ${SH}x${SW}, pad ${PH}x${PW},
//   ceil_mode ${attrs["ceil_mode"]}${"" if is_max else ", count_include_pad %s" % include_pad}
// one work-item: QB outputs along a row; work-items ordered (n, c, p, q/QB)
#define WG ${WG}  // work-group size
#define QB ${QB}  // outputs per work-item
#define NC ${N * C}  // planes (N*C)
#define H ${H}
#define W ${W}
#define P ${P}
#define Q ${Q}
#define KH ${KH}
#define KW ${KW}
#define SH ${SH}
#define SW ${SW}
#define PH ${PH}
#define PW ${PW}
#define QBLOCKS ((Q + QB - 1) / QB)
#define N_ITEMS (NC * P * QBLOCKS)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N_ITEMS)
        return;
    const int qb = gid % QBLOCKS;
    const int p = (gid / QBLOCKS) % P;
    const int plane = gid / (QBLOCKS * P);
    __global const ${c.T()}* xp = x + plane * (H * W);
    const int y0 = p * SH - PH;
    const int y1 = min(y0 + KH, H);
    const int ys = max(y0, 0);
% if not is_max:
% if include_pad:
    const int rows = min(y0 + KH, H + PH) - y0;      // padding counts, the ceil overhang does not
% else:
    const int rows = y1 - ys;
% endif
% endif
    for (int r = 0; r < QB; ++r) {
        const int q = qb * QB + r;
        if (q >= Q)
            break;
        const int x0 = q * SW - PW;
        const int x1 = min(x0 + KW, W);
        const int xs = max(x0, 0);
% if is_max:
        float acc = -INFINITY;
        for (int iy = ys; iy < y1; ++iy)
            for (int ix = xs; ix < x1; ++ix)
                acc = fmax(acc, ${c.LOAD("xp", "iy * W + ix")});
        ${c.STORE("y", "(plane * P + p) * Q + q", "acc")};
% else:
        float acc = 0.0f;
        for (int iy = ys; iy < y1; ++iy)
            for (int ix = xs; ix < x1; ++ix)
                acc += ${c.LOAD("xp", "iy * W + ix")};
% if include_pad:
        const int cols = min(x0 + KW, W + PW) - x0;
% else:
        const int cols = x1 - xs;
% endif
        ${c.STORE("y", "(plane * P + p) * Q + q", "acc / (float)(rows * cols)")};
% endif
    }
}

<%namespace name="c" file="_common.mako"/>\
<% size = attrs["size"] %>\
// ${prefix}: local response normalisation across channels (${variant}), ${N}x${C}x${HW} (N x C x H*W)
//   size ${size}, alpha ${"%g" % attrs["alpha"]}, beta ${"%g" % attrs["beta"]}, k ${"%g" % attrs["k"]}
// one work-item: CB consecutive channels of one (n, h, w); work-items ordered (n, c/CB, h*w)
#define WG ${WG}  // work-group size
#define CB ${CB}  // channels per work-item
#define N ${N}
#define C ${C}
#define HW ${HW}  // H*W: the stride between channels
#define LO ${size // 2}  // window: channels c-LO .. c+HI
#define HI ${(size - 1) // 2}
#define LRN_K ${c.flt(attrs["k"])}
#define ALPHA_OVER_SIZE ${c.flt(attrs["alpha"] / size)}
#define BETA ${c.flt(attrs["beta"])}
#define CBLOCKS ((C + CB - 1) / CB)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N * CBLOCKS * HW)
        return;
    const int hw = gid % HW;
    const int c0 = (gid / HW) % CBLOCKS * CB;
    const int n = gid / (HW * CBLOCKS);
    __global const ${c.T()}* xc = x + n * (C * HW) + hw;
    __global ${c.T()}* yc = y + n * (C * HW) + hw;
    float sum = 0.0f;                       // sum of squares over the window of channel c0
    for (int j = max(c0 - LO, 0); j <= min(c0 + HI, C - 1); ++j)
        sum += ${c.LOAD("xc", "j * HW")} * ${c.LOAD("xc", "j * HW")};
    for (int r = 0; r < CB; ++r) {
        const int c = c0 + r;
        if (c >= C)
            break;
        if (r > 0) {                        // slide: channel c+HI enters, c-LO-1 leaves
            const int enter = c + HI, leave = c - LO - 1;
            if (enter < C)
                sum += ${c.LOAD("xc", "enter * HW")} * ${c.LOAD("xc", "enter * HW")};
            if (leave >= 0)
                sum -= ${c.LOAD("xc", "leave * HW")} * ${c.LOAD("xc", "leave * HW")};
        }
        ${c.STORE("yc", "c * HW", capture(c.LOAD, "xc", "c * HW") + " / pow(LRN_K + ALPHA_OVER_SIZE * fmax(sum, 0.0f), BETA)")};
    }
}

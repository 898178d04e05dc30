<%namespace name="c" file="_common.mako"/>\
// ${prefix}: concatenation of ${len(chans)} inputs along channels (${variant}): ${" + ".join(map(str, chans))} -> ${CT} channels of ${N}x${HW} (N x H*W)
#define WG ${WG}  // work-group size
#define N ${N}
#define CT ${CT}  // output channels
#define HW ${HW}  // H*W
% for i, (ci, off) in enumerate(zip(chans, offs)):
#define C${i} ${ci}  // channels of input ${i}, at output channel ${off}
% endfor
% if MODE == "fused":

// one work-item per output element, reading from the input that owns its channel
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(${", ".join("__global const %s* restrict x%d" % (capture(c.T), i) for i in range(len(chans)))},
               __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N * CT * HW)
        return;
    const int hw = gid % HW;
    const int c = (gid / HW) % CT;
    const int n = gid / (HW * CT);
% for i, off in enumerate(offs):
<%
    last = i == len(offs) - 1
    head = "" if len(offs) == 1 else ("else" if last else ("if" if i == 0 else "else if") + " (c < %d)" % (off + chans[i]))
%>\
% if head:
    ${head}
    ${"    "}${c.STORE("y", "gid", capture(c.LOAD, "x%d" % i, "(n * C%d + c%s) * HW + hw" % (i, " - %d" % off if off else "")))};
% else:
    ${c.STORE("y", "gid", capture(c.LOAD, "x%d" % i, "(n * C%d + c) * HW + hw" % i))};
% endif
% endfor
}
% else:
% for i, off in enumerate(offs):

// copy input ${i} into output channels ${off} .. ${off + chans[i] - 1}
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}_${i}(__global const ${c.T()}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= N * C${i} * HW)
        return;
    const int n = gid / (C${i} * HW);
    ${c.STORE("y", "gid + (n * (CT - C%d) + %d) * HW" % (i, off), capture(c.LOAD, "x", "gid"))};
}
% endfor
% endif

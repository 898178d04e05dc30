<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, indent, plus, vtype
%>\
<%
    act, alpha = attrs["act"], attrs["alpha"]
    xmem = "__local" if LMEM else "__global"
    # the storage the windows read: the staged halo (float) or the image (the layer's)
    xs = "fp32" if LMEM else None
    # the row stride of the input the windows read: the staged halo or the image
    ROW = TIW if LMEM else W
%>\
// ${prefix}: depthwise convolution (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, channel multiplier ${M}, kernel ${R}x${S},
//   stride ${SH}x${SW}, pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${act}; NCHW in and out
// one work-item: QT consecutive outputs of one output row of one channel; a work-group: TX x TY
//   work-items over the rows of CB channels of one image; per filter row a work-item loads the
//   ${SPAN} input columns its windows cover ${"from the halo staged in local memory" if LMEM else "(guarded only where the padding or edge can be reached)"}
//   and emits the taps as straight-line code${"" if UNROLL_R else " (filter rows stay a loop: the block is large)"}.

// -- tunables
#define QT ${QT}            // outputs per work-item along the row
#define TX ${TX}            // work-items per work-group along the row
#define TY ${TY}            // output rows per work-group
#define CB ${CB}            // channels per work-group
#define VW ${VW}            // vector width of unguarded loads and of stores
#define LMEM ${LMEM}          // input halo staged in local memory

// -- the layer
#define BATCH ${BATCH}
#define C ${C}
#define H ${H}
#define W ${W}
#define K ${K}
#define M ${M}              // channel multiplier: output channel k reads input channel k / M
#define P ${P}
#define Q ${Q}
#define R ${R}
#define S ${S}
#define SH ${SH}
#define SW ${SW}
#define PT ${PT}
#define PL ${PL}
#define DH ${DH}
#define DW ${DW}
#define QB ${QB}            // column blocks per output row (Q / QT, rounded up)
#define KPAD ${KPAD}        // channels rounded up to whole blocks of CB
% if LMEM:
#define TIH ${TIH}          // rows of the staged halo
#define TIW ${TIW}          // columns of the staged halo
% endif
${c.helpers()}
<%def name="filter_row(r, guarded)">\
## r: the filter row, an int (unrolled) or the loop variable "r"; the input columns this
## work-item's windows read in that row become registers x<i>, the taps straight-line code
% if guarded:
if ((uint)(${plus('ih0', r, DH)}) < (uint)H) {
% else:
{
% endif
    ${xmem} const ${c.T(xs)}* const xr = ${plus('xb', r, DH * ROW)};
<% i = 0 %>\
% while i < SPAN:
%   if i in VEC_AT:
    const ${vtype(VW)} v${i} = ${c.LOADV(VW, "xr + %d" % i, 0, xs)};
%     for v in range(VW):
    const float x${i + v} = v${i}${comp(VW, v)};
%     endfor
<% i += VW %>\
%   else:
%     if i in GUARD_COL and GUARD_COL[i]:
    const float x${i} = (uint)(iw0 + ${i}) < (uint)W ? ${c.LOAD("xr", i, xs)} : 0.0f;
%     elif i in GUARD_COL:
    const float x${i} = ${c.LOAD("xr", i, xs)};
%     endif
<% i += 1 %>\
%   endif
% endwhile
% for s in range(S):
    {
        const float wt = ${c.LOAD("wk", r * S + s if isinstance(r, int) else "r * S + %d" % s)};
%   for qq in range(QT):
        acc[${qq}] = mad(wt, x${qq * SW + s * DW}, acc[${qq}]);
%   endfor
    }
% endfor
}
</%def>\

__kernel __attribute__((reqd_work_group_size(TX, TY, CB)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const ${c.T()}* restrict w,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
               __global ${c.T()}* restrict y)
{
    const int qb = get_global_id(0);
    const int p = get_global_id(1);
    const int n = get_global_id(2) / KPAD, k = get_global_id(2) % KPAD;
% if LMEM:
    // stage the work-group's halo: CB channels x TIH rows x TIW columns, padding as zeros
    __local float tile[CB * TIH * TIW];
    {
        const int lid = (get_local_id(2) * TY + get_local_id(1)) * TX + get_local_id(0);
        const int k0 = k - get_local_id(2);
        const int th0 = get_group_id(1) * (TY * SH) - PT;
        const int tw0 = get_group_id(0) * (TX * QT * SW) - PL;
        for (int i = lid; i < CB * TIH * TIW; i += TX * TY * CB) {
            const int kk = k0 + i / (TIH * TIW);
            const int ih = th0 + i / TIW % TIH, iw = tw0 + i % TIW;
            tile[i] = (${"kk < K && " if KCHK else ""}(uint)ih < (uint)H && (uint)iw < (uint)W)
                      ? ${c.LOAD("x", "((n * C + kk / M) * H + ih) * W + iw")} : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endif
<% checks = [cond for cond, on in (("qb >= QB", XCHK), ("p >= P", YCHK), ("k >= K", KCHK)) if on] %>\
% if checks:
    if (${" || ".join(checks)})
        return;
% endif
    const int q0 = qb * QT;
% if LMEM:
    // this work-item's first window in the halo
    __local const float* const xb = tile + (get_local_id(2) * TIH + get_local_id(1) * SH) * TIW
                                         + get_local_id(0) * (QT * SW);
% else:
    const int ih0 = p * SH - PT, iw0 = q0 * SW - PL;     // top-left input of the first window
    // the same as a pointer (it may point before the image: only guarded loads go there)
    __global const ${c.T()}* const xb = x + ((n * C + k / M) * H + ih0) * W + iw0;
% endif
    __global const ${c.T()}* const wk = w + k * (R * S);

    float acc[QT];
    #pragma unroll
    for (int j = 0; j < QT; ++j)
        acc[j] = 0.0f;

% if UNROLL_R:
%   for r in range(R):
    // filter row ${r}${" (may fall into the padding)" if GUARD_ROW[r] else ""}
${indent(capture(filter_row, r, GUARD_ROW[r]), 4)}\
%   endfor
% else:
    #pragma unroll 1
    for (int r = 0; r < R; ++r) {
${indent(capture(filter_row, "r", any(GUARD_ROW)), 8)}\
    }
% endif

    // epilogue: bias, activation, stores (guarded only where a block can pass the row's end)
    __global ${c.T()}* const yr = y + ((n * K + k) * P + p) * Q + q0;
% for qq in range(QT):
    const float s${qq} = ${c.act(act, alpha, "acc[%d]%s" % (qq, " + " + capture(c.LOAD, "bias", "k") if has_bias else ""))};
% endfor
% if QCHK:
%   for qq in range(QT):
    if (q0 + ${qq} < Q)
        ${c.STORE("yr", qq, "s%d" % qq)};
%   endfor
% elif VW > 1:
%   for q in range(0, QT, VW):
    ${c.STOREV(VW, "yr + %d" % q, 0, "(float%d)(%s)" % (VW, ", ".join("s%d" % (q + v) for v in range(VW))))};
%   endfor
% else:
%   for qq in range(QT):
    ${c.STORE("yr", qq, "s%d" % qq)};
%   endfor
% endif
}

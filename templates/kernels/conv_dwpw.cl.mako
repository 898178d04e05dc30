<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, plus, vtype
%>\
<%
    act, alpha = attrs["act"], attrs["alpha"]
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    fv = vtype(RP)
    # the depthwise conv's act as dw_act(x): the pointwise conv's act_<kind> helper (if any)
    # keeps its name, so the depthwise conv's is renamed dw_act_<kind>
    dw_fns = [l.replace("inline float act_", "inline float dw_act_")
              for l in capture(c.helpers, dw).splitlines() if l.startswith("inline float act_")]
    dw_expr = capture(c.act, dw["act"], dw["alpha"], "x", dw).strip().replace("act_", "dw_act_")
%>\
// ${prefix}: depthwise convolution fused into the pointwise (1x1) convolution after it (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> depthwise ${R}x${S}, stride ${SH}x${SW}, pad top/left ${PT}/${PL},
//   dilation ${DH}x${DW}, bias ${"yes" if dw_bias else "no"}, act ${dw["act"]} -> ${BATCH}x${C}x${P}x${Q} (never stored)
//   -> pointwise ${C} -> ${K}, bias ${"yes" if has_bias else "no"}${", residual" if residual else ""}, act ${act} -> out ${BATCH}x${K}x${P}x${Q}; NCHW in and out
// A work-group: TP output pixels (of all images: pixel = image * P*Q + p*Q + q) x TK output
//   channels. Per chunk of CB input channels it (a) computes the CB x TP depthwise outputs
//   into local memory, (b) stages the TK x CB pointwise weights, then (c) each work-item adds
//   its RK channels x RP consecutive pixels of the chunk's products to its registers.

// -- tunables
#define TP ${TP}            // output pixels per work-group
#define TK ${TK}            // output channels per work-group
#define RP ${RP}            // consecutive pixels per work-item (a vector)
#define RK ${RK}            // output channels per work-item (strided by TK / RK)
#define CB ${CB}            // input channels per step
#define TPW ${TPW}          // work-items along the pixels (TP / RP)
#define TKW ${TKW}          // work-items along the channels (TK / RK)
#define WG (TPW * TKW)

// -- the layer
#define BATCH ${BATCH}
#define C ${C}
#define H ${H}
#define W ${W}
#define K ${K}
#define P ${P}
#define Q ${Q}
#define PQ ${PQ}            // output pixels per image
#define NPQ ${NPQ}          // output pixels of all images
#define R ${R}
#define S ${S}
#define SH ${SH}
#define SW ${SW}
#define PT ${PT}
#define PL ${PL}
#define DH ${DH}
#define DW ${DW}
#define CSTEPS ${CSTEPS}    // C / CB, rounded up
#define LDW ${LDW}          // row of the staged weights: TK and one float of padding
#define DW_ITERS ${DW_ITERS}  // depthwise outputs per work-item per step (rounded up)
#define DW_REM ${DW_REM}      // work-items computing one in the last of them (0: all)
#define W_ITERS ${W_ITERS}    // weights staged per work-item per step (rounded up)
#define W_REM ${W_REM}        // work-items staging one in the last of them (0: all)
${c.helpers()}
% for l in dw_fns:
${l}
% endfor
inline float dw_act(float x) { return ${dw_expr}; }

__kernel __attribute__((reqd_work_group_size(TPW, TKW, 1)))
void ${prefix}(__global const float* restrict x, __global const float* restrict dw_w,
% if dw_bias:
               __global const float* restrict dw_b,
% endif
               __global const float* restrict w,
% if has_bias:
               __global const float* restrict bias,
% endif
% if residual:
               __global const float* restrict res,     // the fused add's other input
% endif
               __global float* restrict y)
{
    const int tp = get_local_id(0), tk = get_local_id(1);
    const int tid = tk * TPW + tp;
    const int p0 = get_group_id(0) * TP;
    const int k0 = get_group_id(1) * TK;

    __local float Dl[CB * TP];      // the step's depthwise outputs [channel][pixel]
    __local float Wl[CB * LDW];     // the step's pointwise weights [channel][output channel]

    // the windows of this work-item's depthwise outputs: fixed for every step but the channel.
    // Pixels past the last are clamped to it: their results are dropped.
    int xo[DW_ITERS];               // the window's top-left input, channel 0
% if GUARDED:
    int ih[DW_ITERS], iw[DW_ITERS];
% endif
    #pragma unroll
    for (int it = 0; it < DW_ITERS; ++it) {
% if PCHK:
        const int g = min(p0 + (tid + it * WG) % TP, NPQ - 1);
% else:
        const int g = p0 + (tid + it * WG) % TP;
% endif
        const int n = g / PQ, pq = g % PQ;
        const int ih0 = pq / Q * SH - PT, iw0 = pq % Q * SW - PL;
        xo[it] = (n * C * H + ih0) * W + iw0;
% if GUARDED:
        ih[it] = ih0;
        iw[it] = iw0;
% endif
    }

    ${fv} acc[RK];                 // acc[j]: channel k0 + j * TKW + tk, pixels p0 + tp * RP + 0..RP-1
    #pragma unroll
    for (int j = 0; j < RK; ++j)
        acc[j] = (${fv})(0.0f);

    for (int cs = 0; cs < CSTEPS; ++cs) {
        const int c0 = cs * CB;
        // (a) the depthwise outputs of channels c0 .. c0 + CB - 1 at the tile's pixels
        #pragma unroll
        for (int it = 0; it < DW_ITERS; ++it) {
% if DW_REM:
            if (it == DW_ITERS - 1 && tid >= DW_REM)      // only the last is partial
                break;
% endif
            const int e = tid + it * WG, cc = e / TP;
            const int ch = c0 + cc;
            float v = 0.0f;
% if CCHK:
            if (ch < C) {
% else:
            {
% endif
                __global const float* const xc = x + xo[it] + ch * (H * W);
                __global const float* const wc = dw_w + ch * (R * S);
                float sum = 0.0f;
% if UNROLL:
%   for r in range(R):
%     for s in range(S):
<% conds = (["(uint)(%s) < (uint)H" % plus("ih[it]", r, DH)] if GUARD_ROW[r] else []) + (["(uint)(%s) < (uint)W" % plus("iw[it]", s, DW)] if GUARD_COL[s] else []) %>\
%       if conds:
                if (${" && ".join(conds)})
                    sum = mad(wc[${r * S + s}], xc[${r * DH * W + s * DW}], sum);
%       else:
                sum = mad(wc[${r * S + s}], xc[${r * DH * W + s * DW}], sum);
%       endif
%     endfor
%   endfor
% else:
                for (int r = 0; r < R; ++r) {
%   if any(GUARD_ROW):
                    if ((uint)(ih[it] + r * DH) >= (uint)H)
                        continue;
%   endif
                    #pragma unroll
                    for (int q = 0; q < S; ++q)
%   if any(GUARD_COL):
                        if ((uint)(iw[it] + q * DW) < (uint)W)
%   endif
                            sum = mad(wc[r * S + q], xc[r * (DH * W) + q * DW], sum);
                }
% endif
                v = dw_act(sum${" + dw_b[ch]" if dw_bias else ""});
            }
            Dl[cc * TP + e % TP] = v;
        }
        // (b) the pointwise weights of output channels k0 .. k0 + TK - 1 for those channels
        #pragma unroll
        for (int it = 0; it < W_ITERS; ++it) {
% if W_REM:
            if (it == W_ITERS - 1 && tid >= W_REM)        // only the last is partial
                break;
% endif
            const int e = tid + it * WG, cc = e % CB, kk = e / CB;   // along C: contiguous
<% wconds = [cond for cond, on in (("k0 + kk < K", KCHK), ("c0 + cc < C", CCHK)) if on] %>\
% if wconds:
            Wl[cc * LDW + kk] = ${" && ".join(wconds)} ? w[(k0 + kk) * C + c0 + cc] : 0.0f;
% else:
            Wl[cc * LDW + kk] = w[(k0 + kk) * C + c0 + cc];
% endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // (c) the products, RK channels x RP pixels per work-item
        #pragma unroll 4
        for (int cc = 0; cc < CB; ++cc) {
% if RP > 1:
            const ${fv} d = vload${RP}(0, Dl + cc * TP + tp * RP);
% else:
            const float d = Dl[cc * TP + tp];
% endif
            #pragma unroll
            for (int j = 0; j < RK; ++j)
                acc[j] = mad((${fv})(Wl[cc * LDW + j * TKW + tk]), d, acc[j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    // epilogue: bias, ${"residual, " if residual else ""}activation, stores${" (RP-wide vectors)" if VEC else ""}
    const int g0 = p0 + tp * RP;
% if PCHK and VEC:
    if (g0 >= NPQ)          // a vector is whole pixels of one image, or none
        return;
% endif
    #pragma unroll
    for (int j = 0; j < RK; ++j) {
        const int k = k0 + j * TKW + tk;
% if KCHK:
        if (k >= K)
            continue;
% endif
% if VEC:
        const int off = (g0 / PQ * K + k) * PQ + g0 % PQ;
        ${fv} s = acc[j]${" + bias[k]" if has_bias else ""};
%   if residual:
        s += vload${RP}(0, res + off);
%   endif
        vstore${RP}((${fv})(${", ".join(capture(c.act, act, alpha, "s" + comp(RP, i)).strip() for i in range(RP))}), 0, y + off);
% else:
%   for i in range(RP):
        {
            const int g = g0 + ${i};
%     if PCHK:
            if (g < NPQ) {
%     else:
            {
%     endif
                const int off = (g / PQ * K + k) * PQ + g % PQ;
                const float s = acc[j]${comp(RP, i)}${" + bias[k]" if has_bias else ""}${" + res[off]" if residual else ""};
                y[off] = ${c.act(act, alpha, "s")};
            }
        }
%   endfor
% endif
    }
}

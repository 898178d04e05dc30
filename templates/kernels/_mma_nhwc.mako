## The channels-last tensor-core GEMM (aotconv/variants/mma_nhwc.py), shared by conv_mma_f16_nhwc
## (halves: 8 per uint4, 2 per 32-bit word) and conv_mma_tf32_nhwc (floats: 4 per float4, 1 per
## word): the loads of a K step (through registers or cp.async), the fragment reads and the mma,
## the kernel's signature, its setup and main loop, and the epilogues' common text. The local
## tiles are rows of 32-bit words (a fragment register each) in both, so everything but the
## element is the same.
##
## `el`, what the element changes in the text (each variant's template builds it):
##   vec, vector, zero   elements per 16-byte load, its OpenCL type, its zero
##   kstep, mma          the mma's k-step (elements) and the macro that issues it
##   ka, a, b            the k of the A (and B) fragment words at word columns t and t + 4, the
##                       names of the A registers (ldmatrix's four matrices) and of the B ones
##   round               the macro rounding an A fragment word as the tensor cores take it, or
##                       None (the operands go as stored)
##   kind                "half" or "float": what the direct epilogue stores
##   load1(p, i), load2(p, i), store1(p, i, v), store2(p, i, v)
##                       the direct epilogue's accesses to one element and to a pair
##   optional, for the cp.async pipeline of a warpgroup GEMM (conv_wgmma_f16_nhwc):
##   at(row, chunk)      the word of a 16-byte chunk of a tile row in a stage (default: rows of
##                       LD words)
##   pipeline(el)        a def for the main loop in place of setup()'s (after the accumulators)
##   halo                True where the pipeline stages the activations itself (setup() then
##                       computes no im2col rows)
##   pixel(row, indent)  a def declaring the NHWC pixel `m` of tile row `row` in the epilogues
##                       (or `continue`-ing past a row that stores nothing), in place of
##                       m0 + row checked against N*P*Q
##
## define(name, value, comment): a #define line, its comment aligned (for the variants' headers)
## sizes(el):               the #defines of the work-group's and the layer's sizes
## ldsm_ptx(), cp_async_ptx(), ldsm_emulated(): the ldmatrix and cp.async macros (where LDSM,
##                          CPASYNC): the inline PTX, and ldmatrix's portable body (cp.async's
##                          moves the element's vector type: each variant writes it)
## head(el):                the kernel's signature and work-item coordinates
## setup(el):               after the declaration of smem4: the local arrays, the activation
##                          rows' offsets, the accumulators and the main loop
## direct_epilogue(el):     the epilogue from the fragments (EPI = 0), and the kernel's end
## staged_passes(el):      the staged epilogue's passes (EPI = 1), and the kernel's end: each
##                          warp's rows of a pass into local memory, then the work-group's
##                          16-byte vectors, each stored by the caller's body (<%call>)
<%!
from aotconv.variants.kernel_text import indent


def define(name, value, comment=""):
    line = "#define %-10s %s" % (name, value)
    return ("%-30s // %s" % (line, comment)) if comment else line


def pragma_unroll(emulate):
    """The emulated mma, ldmatrix and cp.async hold work-group barriers: unrolled, every one
    would split PoCL's work-group function once more (minutes to compile); the tensor cores
    want the fragments in registers, so the PTX loops unroll."""
    return "#pragma unroll 1" if emulate else "#pragma unroll"


def a_cond(kchk, hchk, wchk):
    """The activation load of one step: a tap in the padding (HCHK, WCHK) or a chunk past R*S*C
    in a partial last step (KCHK) reads zeros."""
    return " && ".join((["k < RSC"] if kchk else [])
                       + (["(uint)(ih0[it] + r * DH) < (uint)H"] if hchk else [])
                       + (["(uint)(iw0[it] + s * DW) < (uint)W"] if wchk else []))


def row_major(row, chunk):
    """The word of 16-byte chunk `chunk` of local row `row` in the mma.sync layout: rows of LD
    words (the default of el["at"])."""
    return "%s * LD + %s * 4" % (row, chunk)


def comment(text, indent=8, width=95):
    """`text` as // comment lines of at most `width` columns (more where one word is longer)."""
    lines, line = [], ""
    for word in text.split():
        if line and indent + 3 + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = (line + " " + word) if line else word
    lines.append(line)
    return "\n".join(" " * indent + "// " + l for l in lines)
%>\
<%namespace name="c" file="_common.mako"/>\
<%def name="sizes(el)">\
<% vec, vector = el["vec"], el["vector"] %>\
${define("WG", WG, "work-items: 32 per warp")}
${define("WARPS", WARPS)}
${define("WTM", WTM, "rows (pixels) of a warp's tile (BM / WM)")}
${define("WTN", WTN, "columns (channels) of a warp's tile (BN / WN)")}
${define("MI", MI, "16-row mma tiles per warp")}
${define("NI", NI, "8-column mma tiles per warp")}

// -- the layer
${define("BATCH", BATCH)}
${define("C", C)}
${define("H", H)}
${define("W", W)}
${define("K", K)}
${define("P", P)}
${define("Q", Q)}
${define("R", R)}
${define("S", S)}
${define("SH", SH)}
${define("SW", SW)}
${define("PT", PT)}
${define("PL", PL)}
${define("DH", DH)}
${define("DW", DW)}
${define("PQ", "(P * Q)")}
${define("NPQ", NPQ, "output pixels (M)")}
${define("RSC", RSC, "reduction length")}
${define("RSCP", RSCP, "... padded to whole BK steps")}
${define("KTILES", KTILES, "K steps")}
${define("C%d" % vec, "(C / %d)" % vec, "%s vectors per input pixel" % vector)}
${define("CH", CH, "%s vectors per row of a step (BK / %d)" % (vector, vec))}
</%def>\
<%def name="ldsm_ptx()">\
#define LDSM_X4(r0, r1, r2, r3, p) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" \
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((uint)(p)) : "memory")
#define LDSM_X2(r0, r1, p) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" \
                 : "=r"(r0), "=r"(r1) : "r"((uint)(p)) : "memory")
</%def>\
<%def name="cp_async_ptx()">\
% if CPASYNC:
// 16 bytes from global to local memory, asynchronously; a source size of 0 writes zeros
#define CP_ASYNC16(dst, src, ok) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" \
                 :: "r"((uint)(dst)), "l"((ulong)(src)), "r"((ok) ? 16u : 0u) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
// every copy this work-item issued before its last CPASYNC - 2 groups has landed
#define CP_WAIT() asm volatile("cp.async.wait_group ${CPASYNC - 2};" ::: "memory")
% endif
</%def>\
<%def name="ldsm_emulated()">\
% if LDSM:
// ldmatrix: each lane posts its row address (a word offset into smem) in the warp's 32 words
// `lx`; register i of lane (g, t) is then word t of the row lane 8i + g posted
#define LDSM_X4(r0, r1, r2, r3, p) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    lx[lane] = (int)((p) - smem); \
    barrier(CLK_LOCAL_MEM_FENCE); \
    (r0) = smem[lx[g] + t]; \
    (r1) = smem[lx[8 + g] + t]; \
    (r2) = smem[lx[16 + g] + t]; \
    (r3) = smem[lx[24 + g] + t]; \
} while (0)
#define LDSM_X2(r0, r1, p) do { \
    barrier(CLK_LOCAL_MEM_FENCE); \
    lx[lane] = (int)((p) - smem); \
    barrier(CLK_LOCAL_MEM_FENCE); \
    (r0) = smem[lx[g] + t]; \
    (r1) = smem[lx[8 + g] + t]; \
} while (0)
% endif
</%def>\
<%def name="load_regs(el, kt)">\
<% acond = a_cond(KCHK, HCHK, WCHK) %>\
{
    // activations: this work-item's chunk of ${el["vec"]} channels at k, tap (r, s), of each of its rows
    const int k = ${kt} * BK + achunk * ${el["vec"]};
    const int tap = k / C;
    const int r = tap / S, s = tap % S;
    const int off = (r * DH * W + s * DW) * C${el["vec"]} + k % C / ${el["vec"]};
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
% if acond:
        pa[it] = (${acond}) ? x[xo[it] + off] : ${el["zero"]};
% else:
        pa[it] = x[xo[it] + off];
% endif
    // weights: the step's tile, contiguous (packed and padded: no checks)
    __global const ${el["vector"]}* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it)
        pb[it] = wt[tid + it * WG];
}
</%def>\
<%def name="store_regs(el, buf)">\
<% at = el.get("at") or row_major %>\
{
    __local uint* const as = smem + (${buf}) * STAGE;
    __local uint* const bs = as + A_SIZE;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
        *(__local ${el["vector"]}*)(as + ${at("(arow + it * A_RSTEP)", "achunk")}) = pa[it];
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
        *(__local ${el["vector"]}*)(bs + ${at("e / CH", "e % CH")}) = pb[it];
    }
}
</%def>\
<%def name="load_async(el, kt, buf)">\
<%
    acond = a_cond(KCHK, HCHK, WCHK)
    at = el.get("at") or row_major                 # a 16-byte chunk's word in the stage
%>\
{
    // step ${kt} straight into stage ${buf}: taps in the padding and chunks past R*S*C zeroed
    __local uint* const as = smem + (${buf}) * STAGE;
    __local uint* const bs = as + A_SIZE;
    const int k = ${kt} * BK + achunk * ${el["vec"]};
    const int tap = k / C;
    const int r = tap / S, s = tap % S;
    const int off = (r * DH * W + s * DW) * C${el["vec"]} + k % C / ${el["vec"]};
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
% if acond:
        const bool ok = ${acond};
        CP_ASYNC16(as + ${at("(arow + it * A_RSTEP)", "achunk")}, ok ? x + xo[it] + off : x, ok);
% else:
        CP_ASYNC16(as + ${at("(arow + it * A_RSTEP)", "achunk")}, x + xo[it] + off, true);
% endif
    }
    __global const ${el["vector"]}* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
        CP_ASYNC16(bs + ${at("e / CH", "e % CH")}, wt + e, true);
    }
}
</%def>\
<%def name="multiply(el, buf)">\
<%
    unroll = pragma_unroll(EMULATE)
    (k0, k4), a, b = el["ka"], el["a"], el["b"]
    kw = len(k4) + 1                           # the B comments' k column
%>\
{
    __local const uint* const as = smem + (${buf}) * STAGE + wm * WTM * LD;
    __local const uint* const bs = smem + (${buf}) * STAGE + A_SIZE + wn * WTN * LD;
    ${unroll}
    for (int ks = 0; ks < BK / ${el["kstep"]}; ++ks) {
        uint af[MI][4], bf[NI][2];
% if LDSM:
${comment("A: lanes 0-15 give rows 0-15 at words 0..3 of the k-step, lanes 16-31 rows 0-15 at "
          "words 4..7: the four matrices are " + ", ".join(a))}
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            LDSM_X4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                    as + (mi * 16 + (lane & 15)) * LD + ks * 8 + (lane >> 4) * 4);
% if NI % 2 == 0:
${comment("B, two 8-channel tiles at a time: lanes 0-7 rows 0-7 at words 0..3 (%s of ni), 8-15 "
          "the same rows at words 4..7 (%s), 16-31 likewise rows 8-15 (tile ni + 1)" % b)}
        ${unroll}
        for (int ni = 0; ni < NI; ni += 2)
            LDSM_X4(bf[ni][0], bf[ni][1], bf[ni + 1][0], bf[ni + 1][1],
                    bs + (ni * 8 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 8
                    + ((lane >> 3) & 1) * 4);
% else:
${comment("B, one 8-channel tile at a time: lanes 0-7 rows 0-7 at words 0..3 (%s), 8-15 at "
          "words 4..7 (%s); lanes 16-31 repeat them (.x2 ignores their addresses)" % b)}
        ${unroll}
        for (int ni = 0; ni < NI; ++ni)
            LDSM_X2(bf[ni][0], bf[ni][1],
                    bs + (ni * 8 + (lane & 7)) * LD + ks * 8 + ((lane >> 3) & 1) * 4);
% endif
% else:
        ${unroll}
        for (int mi = 0; mi < MI; ++mi) {
            __local const uint* const p = as + (mi * 16 + g) * LD + ks * 8 + t;
            af[mi][0] = p[0];                 // (g,     ${k0})
            af[mi][1] = p[8 * LD];            // (g + 8, ${k0})
            af[mi][2] = p[4];                 // (g,     ${k4})
            af[mi][3] = p[8 * LD + 4];        // (g + 8, ${k4})
        }
        ${unroll}
        for (int ni = 0; ni < NI; ++ni) {
            __local const uint* const q = bs + (ni * 8 + g) * LD + ks * 8 + t;
            bf[ni][0] = q[0];                 // (${"%-*s" % (kw, k0 + ",")} channel g)
            bf[ni][1] = q[4];                 // (${k4}, channel g)
        }
% endif
% if el["round"]:
        // the activations as the tensor cores take them (the weights were packed rounded)
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                af[mi][q] = ${el["round"]}(af[mi][q]);
% endif
        ${unroll}
        for (int mi = 0; mi < MI; ++mi)
            ${unroll}
            for (int ni = 0; ni < NI; ++ni)
                ${el["mma"]}(acc[mi][ni], af[mi], bf[ni]);
    }
}
</%def>\
<%def name="head(el)">\
<% residual = bool(attrs.get("residual")) %>\
// One work-group: a BM x BN tile of Y (pixels m0.., channels n0..); a 1-D work-group of WG
// work-items, warp w = tid / 32 at (w % WM, w / WM) in the WM x WN grid of warps.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${el["vector"]}* restrict x, __global const ${el["vector"]}* restrict wp,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input, NHWC
% endif
               __global ${c.T()}* restrict y)
{
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;     // groupID, threadID_in_group
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = get_group_id(0) * BM, n0 = get_group_id(1) * BN;

</%def>\
<%def name="setup(el)">\
<% vector = el["vector"] %>\
    __local uint* const smem = (__local uint*)smem4;
#ifndef MMA_PTX
    __local uint mma_x[WARPS * 192];           // the emulated mma's fragment exchange
    __local uint* const mx = mma_x + warp * 192;
% if LDSM:
    __local int ldsm_x[WARPS * 32];            // the emulated ldmatrix's address exchange
    __local int* const lx = ldsm_x + warp * 32;
% endif
#endif

% if not el.get("halo"):
    // This work-item's rows of the activation tile: pixels arow + it * A_RSTEP, at its chunk
    // of ${el["vec"]} channels achunk; per pixel the ${vector} offset of its window's top-left tap (ih0, iw0
    // kept where the padding needs a check). A row past N*P*Q reads a real pixel instead; it
    // is never stored.
    const int achunk = tid % CH, arow = tid / CH;
    int xo[A_ITERS];
% if HCHK:
    int ih0[A_ITERS];
% endif
% if WCHK:
    int iw0[A_ITERS];
% endif
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
% if MCHK:
        const int m = min(m0 + arow + it * A_RSTEP, NPQ - 1);
% else:
        const int m = m0 + arow + it * A_RSTEP;
% endif
        const int img = m / PQ, pq = m % PQ;
        const int h0 = pq / Q * SH - PT, w0 = pq % Q * SW - PL;
        xo[it] = ((img * H + h0) * W + w0) * C${el["vec"]};
% if HCHK:
        ih0[it] = h0;
% endif
% if WCHK:
        iw0[it] = w0;
% endif
    }
% endif

    float acc[MI][NI][4];                      // mma tile (mi, ni) of this warp: c0..c3
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            #pragma unroll
            for (int q = 0; q < 4; ++q)
                acc[mi][ni][q] = 0.0f;

% if el.get("pipeline"):
${capture(el["pipeline"], el)}\
% elif CPASYNC:
    // CPASYNC stages: steps 0 .. CPASYNC-2 in flight first, one commit group a step; at step kt
    // wait for its group, meet (everyone's copies landed, everyone done with stage kt - 1),
    // put step kt + CPASYNC - 1 in flight into that stage, multiply stage kt % CPASYNC
    #pragma unroll 1
    for (int st = 0; st < CPASYNC - 1; ++st) {
        if (st < KTILES)
${indent(capture(load_async, el, "st", "st"), 8)}\
        CP_COMMIT();
    }
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int nk = kt + CPASYNC - 1;
            if (nk < KTILES)
${indent(capture(load_async, el, "nk", "nk % CPASYNC"), 12)}\
            CP_COMMIT();
        }
${indent(capture(multiply, el, "kt % CPASYNC"), 8)}\
    }
% elif DBUF:
    ${"%-42s" % (vector + " pa[A_ITERS], pb[B_ITERS];")} // the next step, on its way to local memory
    // step 0 into buffer 0; then each step loads step kt+1 into registers, multiplies step
    // kt and stores step kt+1 into the other buffer: one barrier per step
${indent(capture(load_regs, el, "0"), 4)}\
${indent(capture(store_regs, el, "0"), 4)}\
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = 0; kt < KTILES; ++kt) {
        const int cur = kt & 1;
        if (kt + 1 < KTILES) {
${indent(capture(load_regs, el, "(kt + 1)"), 12)}\
        }
${indent(capture(multiply, el, "cur"), 8)}\
        if (kt + 1 < KTILES) {
${indent(capture(store_regs, el, "1 - cur"), 12)}\
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% else:
    ${vector} pa[A_ITERS], pb[B_ITERS];
    for (int kt = 0; kt < KTILES; ++kt) {
${indent(capture(load_regs, el, "kt"), 8)}\
${indent(capture(store_regs, el, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
${indent(capture(multiply, el, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif

</%def>\
<%def name="staged_passes(el)">\
<% unroll = pragma_unroll(EMULATE) %>\
    ${unroll}
    for (int mi = 0; mi < MI; ++mi) {
        barrier(CLK_LOCAL_MEM_FENCE);          // the last stage, or the last pass, read out
        #pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            __local float* const e0 = ep + (wm * 16 + g) * ELD + wn * WTN + ni * 8 + 2 * t;
            *(__local float2*)e0 = (float2)(acc[mi][ni][0], acc[mi][ni][1]);
            *(__local float2*)(e0 + 8 * ELD) = (float2)(acc[mi][ni][2], acc[mi][ni][3]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int it = 0; it < E_ITERS; ++it) {
            const int sr = (tid + it * WG) / BN${el["vec"]};          // staged row: warp row sr / 16
% if el.get("pixel"):
% if ECHK:
            if (sr >= E_ROWS)
                break;
% endif
${capture(el["pixel"], "sr / 16 * WTM + mi * 16 + sr % 16", 12)}\
% else:
            const int m = m0 + sr / 16 * WTM + mi * 16 + sr % 16;
% if ECHK:
            if (sr >= E_ROWS)
                break;
% endif
% if MCHK:
            if (m >= NPQ)
                continue;
% endif
% endif
% if NCHK:
            if (n >= K)
                continue;
% endif
${caller.body()}\
        }
    }
}
</%def>\
<%def name="direct_epilogue(el)">\
<%
    residual = bool(attrs.get("residual"))
    act = lambda v: capture(c.act, attrs["act"], attrs["alpha"], v).strip()
%>\
    // epilogue: c[2h + j] of tile (mi, ni) is pixel g + 8h, channel 2t + j of the tile. In NHWC
    // pixel m's channels start at m * K: bias, ${"residual, " if residual else ""}activation, ${el["kind"]} stores
    #pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
% if el.get("pixel"):
${capture(el["pixel"], "wm * WTM + mi * 16 + g + h * 8", 12)}\
% else:
            const int m = m0 + wm * WTM + mi * 16 + g + h * 8;
% if MCHK:
            if (m >= NPQ)
                continue;
% endif
% endif
            #pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
                const int n = n0 + wn * WTN + ni * 8 + 2 * t;
% if NCHK:
                if (n >= K)
                    continue;
% endif
% if PAIRS:
                // channels n, n + 1 (n even, K even): one ${el["kind"]}2 of bias, residual and output
                const int i2 = (m * K + n) / 2;
% if has_bias:
                const float2 b2 = ${el["load2"]("bias", "n / 2")};
                float s0 = acc[mi][ni][2 * h] + b2.x, s1 = acc[mi][ni][2 * h + 1] + b2.y;
% else:
                float s0 = acc[mi][ni][2 * h], s1 = acc[mi][ni][2 * h + 1];
% endif
% if residual:
                const float2 r2 = ${el["load2"]("res", "i2")};
                s0 += r2.x;
                s1 += r2.y;
% endif
                ${el["store2"]("y", "i2", "(float2)(%s, %s)" % (act("s0"), act("s1")))};
% else:
                // K odd: channel by channel
                #pragma unroll
                for (int j = 0; j < 2; ++j) {
% if NCHK:
                    if (n + j >= K)
                        continue;
% endif
                    float s = acc[mi][ni][2 * h + j]${(" + " + el["load1"]("bias", "n + j")) if has_bias else ""};
% if residual:
                    s += ${el["load1"]("res", "m * K + n + j")};
% endif
                    ${el["store1"]("y", "m * K + n + j", act("s"))};
                }
% endif
            }
        }
}
</%def>\

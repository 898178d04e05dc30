<%namespace name="c" file="_common.mako"/>\
<%namespace name="mf" file="_mma_f16.mako"/>\
<%namespace name="nh" file="_mma_nhwc.mako"/>\
<%
    define = nh.attr.define
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
    pool = bool(attrs.get("pool"))              # a 2x2 max pool fused (conv_wgmma_halo_pool_f16_nhwc)
    # the element in the text of the GEMM this shares with conv_mma_tf32_nhwc (_mma_nhwc.mako):
    # 8 halves per uint4 and 2 per word (an .f16x2 register), mma.m16n8k16 .f16
    el = dict(vec=8, vector="uint4", zero="(uint4)(0u)", kstep=16, mma="MMA_F16",
              ka=("k 2t..2t+1", "k 2t+8..2t+9"), a=("a0a1", "a2a3", "a4a5", "a6a7"),
              b=("b0b1", "b2b3"), round=None, kind="half",
              load1=lambda p, i: capture(c.LOAD, p, i),
              load2=lambda p, i: capture(c.LOADV, 2, p, i),
              store1=lambda p, i, v: capture(c.STORE, p, i, v),
              store2=lambda p, i, v: capture(c.STOREV, 2, p, i, v))
    if WGMMA:
        # conv_wgmma_f16_nhwc: the stages in the tensor cores' core matrices, its own main loop
        el.update(at=lambda row, chunk: "CORE(%s, %s)" % (row, chunk), pipeline=wg_pipeline)
    if HALO:
        # conv_wgmma_halo_f16_nhwc: the activations staged once per BK channels as a halo tile,
        # the tile's rows slots of the padded input (the epilogue maps them to pixels)
        el.update(pipeline=halo_pipeline, halo=True, pixel=halo_pixel)
%>\
<%def name="wg_pipeline(el)">\
<% unroll = nh.attr.pragma_unroll(EMULATE) %>\
    // CPASYNC stages, steps 0 .. CPASYNC-2 in flight first, one cp.async group a step. At step
    // kt: wait for its group, fence (the copies, made by the generic proxy, visible to the
    // tensor cores' async proxy), meet (everyone's copies landed); issue the step's wgmmas on
    // stage kt % CPASYNC as one group, and wait until at most WAIT groups are in flight; meet
    // again (every warpgroup done with stage (kt - WAIT) % CPASYNC) and put step
    // kt + CPASYNC - 1 in flight into the stage of step kt - 1 (WAIT = 1: the step kt - 1
    // whose wgmmas the wait just saw finish; so with WAIT = 1 the tensor cores work on step kt
    // through the second meeting and the refill)
    // this warpgroup's 64 rows of the activation tile and WTN channels of the weight tile, as
    // shared-window byte addresses; a 16-deep k-step is the next two 16-byte chunks
    const uint sa0 = SMEM_ADDR(smem) + (wm >> 2) * (8 * CH * 128);
    const uint sb0 = SMEM_ADDR(smem + A_SIZE) + wn * (WTN / 8 * CH * 128);
% if CPASYNC:
    #pragma unroll 1
    for (int st = 0; st < CPASYNC - 1; ++st) {
        if (st < KTILES)
${nh.attr.indent(capture(nh.load_async, el, "st", "st"), 8)}\
        CP_COMMIT();
    }
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
        CP_WAIT();
        FENCE_PROXY_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const uint sa = sa0 + (kt % CPASYNC) * (STAGE * 4), sb = sb0 + (kt % CPASYNC) * (STAGE * 4);
            WG_FENCE();
            ${unroll}
            for (int ks = 0; ks < BK / 16; ++ks) {
% for j0 in range(0, NI, INSN // 8):
                WGMMA_${j0}(DESC(sa + ks * 256), DESC(sb + ${j0} * CH * 128 + ks * 256));
% endfor
            }
            WG_COMMIT();
            WG_WAIT();
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            const int nk = kt + CPASYNC - 1;
            if (nk < KTILES)
${nh.attr.indent(capture(nh.load_async, el, "nk", "nk % CPASYNC"), 12)}\
            CP_COMMIT();
        }
    }
% else:
    // the register double buffer (DBUF): step 0 into stage 0; then each step loads step kt + 1
    // into registers, issues its wgmmas on stage kt % 2, stores step kt + 1 into the other
    // stage while they run (its last reader, step kt - 1, finished before the last meeting),
    // fences, waits for them and meets
    uint4 pa[A_ITERS], pb[B_ITERS];
${nh.attr.indent(capture(nh.load_regs, el, "0"), 4)}\
${nh.attr.indent(capture(nh.store_regs, el, "0"), 4)}\
    FENCE_PROXY_ASYNC();
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
        if (kt + 1 < KTILES) {
${nh.attr.indent(capture(nh.load_regs, el, "(kt + 1)"), 12)}\
        }
        {
            const uint sa = sa0 + (kt & 1) * (STAGE * 4), sb = sb0 + (kt & 1) * (STAGE * 4);
            WG_FENCE();
            ${unroll}
            for (int ks = 0; ks < BK / 16; ++ks) {
% for j0 in range(0, NI, INSN // 8):
                WGMMA_${j0}(DESC(sa + ks * 256), DESC(sb + ${j0} * CH * 128 + ks * 256));
% endfor
            }
            WG_COMMIT();
        }
        if (kt + 1 < KTILES) {
${nh.attr.indent(capture(nh.store_regs, el, "1 - (kt & 1)"), 12)}\
        }
        FENCE_PROXY_ASYNC();
        WG_WAIT_ALL();
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif
    WG_WAIT_ALL();
</%def>\
<%def name="halo_pipeline(el)">\
<% unroll = nh.attr.pragma_unroll(EMULATE) %>\
    // The work-group's slots u0 .. u0 + BM - 1 of strip ox0 / TW. This work-item's vectors of a
    // halo tile: e = tid + it * WG is slot u0 + e / CH at 8-channel chunk e % CH (= tid % CH:
    // CH divides the work-group), read at x[hx[it] + the step's chunk], or zeros where
    // hx[it] < 0 (the padding, a slot past the last image, or e past the tile)
    const int u0 = get_group_id(0) % TILES * BM, ox0 = get_group_id(0) / TILES * TW;
    int hx[H_ITERS];
    #pragma unroll
    for (int it = 0; it < H_ITERS; ++it) {
        const int e = tid + it * WG, su = u0 + e / CH;
        const int pr = su / TWH, iy = pr % HP - PT, ix = ox0 + su % TWH - PL;
        hx[it] = e < NS * CH && pr < BATCH * HP && (uint)iy < (uint)H && (uint)ix < (uint)W
                 ? ((pr / HP * H + iy) * W + ix) * C8 + tid % CH : -1;
    }
    // HBUF halo buffers (planes of slots), then WBUF weight tiles (core matrices); this
    // warpgroup's 64 rows are slots 64 (wm / 4) .. of the halo, its WTN channels those of wn
    __local uint* const hs = smem;
    __local uint* const ws = smem + HBUF * HSIZE;
    const uint sa0 = SMEM_ADDR(hs) + (wm >> 2) * (64 * 16);
    const uint sb0 = SMEM_ADDR(ws) + wn * (WTN / 8 * CH * 128);
    // The register double buffer: the first channels' halo and step 0's weights into buffers
    // 0; then each step loads the next step's weights (and, at the first tap of BK channels,
    // the next channels' halo) into registers, issues its wgmmas, stores them into the other
    // buffers while the wgmmas run (their last readers finished before the last meeting),
    // fences, waits for the wgmmas and meets.${" With one halo buffer (HBUF = 1) the next channels' halo waits in the registers until the last tap's wgmmas are done, then is stored behind one more meeting." if HALO["HBUF"] == 1 else ""}${" With WAIT = 1 a step's wgmmas run on through the meeting and the next step's loads: the wait leaves them in flight and sees the previous step's done, so three weight tiles rotate, and the next channels' halo is stored a tap later (step kt - 1, its old buffer's last reader, done)." if WAIT else ""}
% if CPASYNC:
    // CPASYNC weight tiles filled by cp.async, CPASYNC - 2 steps ahead; the halo through the
    // registers, loaded at the first tap of BK channels and stored at the last. Step kt: wait
    // for its weights, fence (the copies, made by the generic proxy, visible to the tensor
    // cores), meet (everyone's copies and halo stores landed, every warpgroup's step kt - 2
    // done: each waited for it at the end of step kt - 1); issue the step's wgmmas; put step
    // kt + CPASYNC - 2 in flight into the tile of step kt - 2; at the last tap store the next
    // channels' halo into the other buffer (its last reader, the previous channels' last tap,
    // is two steps back or more: R x S >= 2); wait until one wgmma group is left in flight.
    uint4 ph[H_ITERS];
${halo_load("0")}\
${halo_store("0")}\
    #pragma unroll 1
    for (int st = 0; st < CPASYNC - 2; ++st) {
        if (st < KTILES)
${nh.attr.indent(capture(weights_async, "st", "st"), 12)}\
        CP_COMMIT();
    }
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
        const int tap = kt % (R * S), hb = kt / (R * S) & 1;
        CP_WAIT_STEP();
        FENCE_PROXY_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tap == 0 && kt + R * S < KTILES) {
${nh.attr.indent(capture(halo_load, "(kt / (R * S) + 1)"), 8)}\
        }
        {
${halo_multiply("(kt % CPASYNC)", unroll)}\
        }
        {
            const int nk = kt + CPASYNC - 2;
            if (nk < KTILES)
${nh.attr.indent(capture(weights_async, "nk", "(nk % CPASYNC)"), 12)}\
            CP_COMMIT();
        }
        if (tap == R * S - 1 && kt + 1 < KTILES) {
${nh.attr.indent(capture(halo_store, "(1 - hb)"), 8)}\
        }
        WG_WAIT();
    }
% else:
    uint4 ph[H_ITERS], pb[B_ITERS];
${halo_load("0")}\
${halo_store("0")}\
${weights_load("0")}\
${weights_store("0")}\
    FENCE_PROXY_ASYNC();
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll 1
    for (int kt = 0; kt < KTILES; ++kt) {
% if HALO["HBUF"] == 2:
        const int tap = kt % (R * S), hb = kt / (R * S) & 1;
% else:
        const int tap = kt % (R * S), hb = 0;
% endif
        const bool halo_next = tap == 0 && kt + R * S < KTILES;
% if WAIT and HALO["HBUF"] == 2:
        const bool halo_store_now = tap == 1 && kt - 1 + R * S < KTILES;
% endif
        if (kt + 1 < KTILES) {
${nh.attr.indent(capture(weights_load, "(kt + 1)"), 8)}\
        }
        if (halo_next) {
${nh.attr.indent(capture(halo_load, "(kt / (R * S) + 1)"), 8)}\
        }
        {
            // tap (r, s): the halo r rows and s slots on; a 16-deep k-step: two planes on
${halo_multiply("(kt & 1)" if HALO["WBUF"] == 2 else "(kt % WBUF)", unroll)}\
        }
        if (kt + 1 < KTILES) {
${nh.attr.indent(capture(weights_store, "(1 - (kt & 1))" if HALO["WBUF"] == 2 else "((kt + 1) % WBUF)"), 8)}\
        }
% if HALO["HBUF"] == 2:
        if (${"halo_store_now" if WAIT else "halo_next"}) {
${nh.attr.indent(capture(halo_store, "(1 - hb)"), 8)}\
        }
% endif
        FENCE_PROXY_ASYNC();
% if WAIT:
        WG_WAIT();
% else:
        WG_WAIT_ALL();
% endif
        barrier(CLK_LOCAL_MEM_FENCE);
% if HALO["HBUF"] == 1:
        if (tap == R * S - 1 && kt + 1 < KTILES) {
            // every tap of these channels multiplied: the next channels' halo into the buffer
% if WAIT:
            WG_WAIT_ALL();
            barrier(CLK_LOCAL_MEM_FENCE);
% endif
${nh.attr.indent(capture(halo_store, "0"), 12)}\
            FENCE_PROXY_ASYNC();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
% endif
    }
% endif
    WG_WAIT_ALL();
</%def>\
## a step's wgmmas: halo buffer hb at the step's tap, weight tile `stage`
<%def name="halo_multiply(stage, unroll)">\
            const uint sa = sa0 + hb * (HSIZE * 4) + (tap / S * TWH + tap % S) * 16;
            const uint sb = sb0 + ${stage} * (WSIZE * 4);
            WG_FENCE();
            ${unroll}
            for (int ks = 0; ks < BK / 16; ++ks) {
% for j0 in range(0, NI, INSN // 8):
                WGMMA_${j0}(DESC_A(sa + ks * (2 * NSP * 16)), DESC(sb + ${j0} * CH * 128 + ks * 256));
% endfor
            }
            WG_COMMIT();
</%def>\
<%def name="halo_load(chunk)">\
    #pragma unroll
    for (int it = 0; it < H_ITERS; ++it)
        ph[it] = hx[it] >= 0 ? x[hx[it] + ${chunk} * CH] : (uint4)(0u);
</%def>\
<%def name="halo_store(buf)">\
    #pragma unroll
    for (int it = 0; it < H_ITERS; ++it) {
        const int e = tid + it * WG;
% if HALO["NS"] * CH % WG:
        if (e < NS * CH)
% endif
        *(__local uint4*)(hs + ${buf} * HSIZE + (e % CH * NSP + e / CH) * 4) = ph[it];
    }
</%def>\
<%def name="weights_load(kt)">\
    {
        __global const uint4* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
        #pragma unroll
        for (int it = 0; it < B_ITERS; ++it)
% if BN * CH % WG:
            if (tid + it * WG < BN * CH)
% endif
            pb[it] = wt[tid + it * WG];
    }
</%def>\
<%def name="weights_async(kt, buf)">\
{
    __global const uint4* const wt = wp + (get_group_id(1) * KTILES + ${kt}) * (BN * CH);
    __local uint* const wb = ws + ${buf} * WSIZE;
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
% if BN * CH % WG:
        if (e < BN * CH)
% endif
        CP_ASYNC16(wb + e * 4, wt + e, true);
    }
}
</%def>\
<%def name="weights_store(buf)">\
    #pragma unroll
    for (int it = 0; it < B_ITERS; ++it) {
        const int e = tid + it * WG;
% if BN * CH % WG:
        if (e < BN * CH)
% endif
        *(__local uint4*)(ws + ${buf} * WSIZE + e * 4) = pb[it];
    }
</%def>\
<%def name="halo_pixel(row, ind)">\
<% pad = " " * ind %>\
${pad}const int u = u0 + ${row};          // the tile row's slot: padded row pr, column u % TWH
${pad}const int pr = u / TWH, yq = pr % HP, xq = u % TWH;
${pad}if (xq >= TW || ox0 + xq >= Q || yq >= P || pr >= BATCH * HP)
${pad}    continue;
${pad}const int m = (pr / HP * P + yq) * Q + ox0 + xq;
</%def>\
// ${prefix}: channels-last convolution as an implicit GEMM on the tensor cores, half operands as stored, FP32 sums (${variant})
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW},
//   bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}${", plus a fused residual" if residual else ""}; NHWC in and out, half storage
// Y[m][n] = sum_k X[m][k] * W[k][n] with M = N*P*Q = ${NPQ} output pixels, N = K = ${K} output
//   channels, k = (r, s, c) over R*S*C = ${RSC}, c innermost: 8 consecutive k are 8 consecutive
//   halves of one input pixel, one uint4 load. X (im2col of the input) is read in place.
% if WGMMA:
// A work-group of WM / 4 x WN warpgroups (4 warps each) computes a BM x BN tile (pixels x
// channels); each warpgroup its 64 x WTN part with wgmma.mma_async m64n${INSN}k16 .f16 (sm_90a:
// aotconv.ptx), its operands read by the tensor cores from local memory through matrix
// descriptors, FP32 accumulators: warp w of a warpgroup holds rows 16 (w % 4) .. + 15 as the
// NI 8-column tiles of mma.sync's accumulator fragments. Halves travel as their bits.
% if HALO:
// The activations as a halo tile rather than im2col rows (stride 1, dilation 1): the tile's
// rows are BM consecutive slots of the padded input's grid, one strip TW outputs wide (slot
// (img, y, x): image img, padded row y of HP = P + R - 1, column x of TWH = TW + S - 1; the
// slots x >= TW or y >= P are computed and dropped). Output slot u's tap (r, s) is input slot
// u + r TWH + s, so per BK channels the work-group stages NS = BM + (R - 1) TWH + S - 1 slots
// once and every tap's wgmma reads them through a descriptor R x S offsets apart; the weights
// stream one tap (BN x BK) a step: the K steps are (BK channels, tap), taps innermost.
% endif
% else:
// A work-group of WM x WN warps computes a BM x BN tile (pixels x channels); each warp its
// WTM x WTN part as MI x NI tiles of mma.sync m16n8k16 .f16 (16 x 8 outputs, 16 deep, FP32
// accumulators). Halves travel as their bits: a uint word is two consecutive channels, the
// lower first (an .f16x2 register).
% endif

// -- tunables
${define("BM", BM, "tile in M (output pixels) per work-group")}
${define("BN", BN, "tile in N (output channels) per work-group")}
${define("BK", BK, "reduction step (halves) held in local memory")}
${define("WM", WM, "warps along M")}
${define("WN", WN, "warps along N")}
${define("PAD", PAD, "words of padding per local row")}
${define("DBUF", DBUF, "load step k+1 into registers during step k")}
${define("CPASYNC", CPASYNC, "local stages filled by cp.async (0: none)")}
${define("LDSM", LDSM, "fragments read with ldmatrix")}
% if EPI:
${define("EPI", EPI, "epilogue staged in local memory, 16-byte stores")}
% endif
${nh.sizes(el)}\
// local memory: NBUF stages, each the activation tile [BM][LD] then the weight tile [BN][LD],
// in words of two halves, k-contiguous per row. LD = BK/2 + PAD: with PAD = 4 a row is
// LD = 4 (mod 8) words, so rows g = 0..7 start at banks 4 * (g * LD/4 mod 8), eight distinct
// multiples of 4 (LD/4 is odd), and a fragment read (rows g, word columns t = 0..3: a0 of
// A, b0 of B; likewise g + 8 and t + 4) takes 32 different banks; an ldmatrix phase (8 rows
// of 16 bytes) the same 32. Without PAD (LD = 8, 16, 32) rows collide 2 to 8 ways.
${define("LD", LD, "words per local row")}
% if WGMMA:
// ... as the tensor cores' core matrices instead (no swizzle): 8 rows x 16 bytes (8 halves) in
// 128 contiguous bytes; the core matrix of rows 8i.. and chunk j of a tile sits at byte
// 128 (i * CH + j), so chunks adjacent in k are 128 bytes apart (the descriptors' leading
// offset) and row blocks CH * 128 (their stride offset). A warp's cp.async writes (4 rows x CH
// chunks, or 32 rows of one chunk) are 512 contiguous bytes: no bank conflict.
${define("CORE(r, j)", "((((r) >> 3) * CH + (j)) * 32 + ((r) & 7) * 4)", "word of chunk j of row r")}
${define("INSN", INSN, "channels per wgmma (m64nINSNk16)")}
// a matrix descriptor: start address, leading (k) and stride (8-row) byte offsets, each >> 4
#define DESC(a) ((ulong)(((a) >> 4) & 0x3FFFu) | ((ulong)(128 >> 4) << 16) \
                 | ((ulong)((CH * 128) >> 4) << 32))
% endif
% if HALO:
// -- the halo tile: slots of the padded input, TW outputs (TWH slots) wide a strip
${define("TW", HALO["TW"], "outputs per strip")}
${define("TWH", HALO["TWH"], "slots per padded row: TW + S - 1")}
${define("HP", HALO["HP"], "padded rows per image: P + R - 1")}
${define("STRIPS", HALO["STRIPS"], "strips: Q / TW, rounded up")}
${define("TILES", HALO["TILES"], "BM-slot tiles per strip: BATCH * HP * TWH / BM, rounded up")}
${define("NS", HALO["NS"], "slots of a halo tile: BM + (R - 1) * TWH + S - 1")}
// a halo buffer holds CH planes of NSP 16-byte slots (8 channels each); NSP = NS rounded up to
// 8 / CH (mod 8) slots, so the planes start 128 / CH bytes apart (mod 128): the 8 lanes of a
// 16-byte store phase (8 / CH slots x CH planes) take 32 different banks
${define("NSP", HALO["NSP"], "slots per plane")}
${define("HSIZE", "(CH * NSP * 4)", "words per halo buffer")}
${define("HBUF", HALO["HBUF"], "halo buffers")}
${define("WSIZE", "(BN * CH * 4)", "words per weight tile (core matrices)")}
${define("WBUF", HALO["WBUF"], "weight tiles: 2, or 3 with a step's wgmmas left in flight")}
${define("H_ITERS", HALO["H_ITERS"], "16-byte halo vectors per work-item, rounded up")}
${define("B_ITERS", HALO["B_ITERS"], "16-byte weight vectors per work-item, rounded up")}
${define("SMEM", SMEM, "words of local memory: the halo buffers and two weight tiles, or a pass")}
// the halo's descriptor: 8 consecutive slots a core matrix, the next 8 channels a plane on
#define DESC_A(a) ((ulong)(((a) >> 4) & 0x3FFFu) | ((ulong)NSP << 16) | ((ulong)(128 >> 4) << 32))
% else:
${define("A_SIZE", "(BM * LD)")}
${define("B_SIZE", "(BN * LD)")}
${define("STAGE", "(A_SIZE + B_SIZE)")}
${define("NBUF", NBUF)}
// the loads of a step: A_ITERS uint4 of the activation tile per work-item (its chunk column
// achunk of rows arow + it * A_RSTEP), B_ITERS uint4 of the weight tile
${define("A_ITERS", A_ITERS)}
${define("B_ITERS", B_ITERS)}
${define("A_RSTEP", "(WG / CH)")}
% endif
% if EPI:
// the staged epilogue (EPI = 1): MI passes; in pass mi every warp puts its accumulators of rows
// mi * 16 .. mi * 16 + 15 of its tile, FP32, in rows wm * 16 .. of a [WM * 16][ELD] float
// tile (columns: the BN channels), which then goes out whole pixels at a time, 8 channels a
// 16-byte vector. ELD = BN + 8 = 8 (mod 32) words: a half-warp's float2 writes (rows g = 0..3,
// words 2t, 2t + 1) take 32 banks, and so do a quarter-warp's float4 reads (8 lanes, one
// 8-float chunk each, lanes 4-7 of the 8 reading their second float4 first).
${define("ELD", ELD, "floats per row of the staged tile")}
${define("E_ROWS", "(WM * 16)", "pixels staged per pass")}
${define("BN8", "(BN / 8)", "16-byte output vectors per pixel of the tile")}
${define("E_VECS", "(E_ROWS * BN8)", "16-byte vectors per pass")}
${define("E_ITERS", E_ITERS, "... per work-item, rounded up")}
% if not HALO:
${define("SMEM", SMEM, "words of local memory: the stages, or a pass where larger")}
% endif
% endif
${c.helpers()}
% if EMULATE:
#define AOTCONV_MMA_EMULATE 1          // tests: the portable bodies even on NVIDIA
% endif
// -- the tensor-core multiply, and the loads the tuner may try: inline PTX where the compiler
// is NVIDIA's, exact portable bodies elsewhere (or with AOTCONV_MMA_EMULATE defined)
#if (defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)) && !defined(AOTCONV_MMA_EMULATE)
#define MMA_PTX 1
#endif

#ifdef MMA_PTX
${mf.ptx()}\
% if LDSM:
// four (two) 8 x 8 matrices of halves from local memory, one warp: lane 8i + j gives the
// address of row j of matrix i (16 bytes); register i of lane (g, t) gets row g, word t of
// matrix i. A __local pointer as uint is its address in the shared window.
${nh.ldsm_ptx()}\
% endif
${nh.cp_async_ptx()}\
% if HALO and CPASYNC:
// the halo pipeline's wait: step kt's weights landed, the CPASYNC - 3 steps after it in flight
#define CP_WAIT_STEP() asm volatile("cp.async.wait_group ${CPASYNC - 3};" ::: "memory")
% endif
% if EPI:
// 16 bytes of a read-only global buffer as four words, one vector load (a plain uint4 load
// whose words are used one by one is split into four by the compiler)
#define LDG16(w0, w1, w2, w3, p) asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" \
    : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "l"(p))
// two floats rounded to halves (to nearest even) in one word, lo in the low bits (cvt.rn
// .f16x2.f32 puts its first source in the high half), and the two halves of a word as floats
#define PACK_HALF2_RTE(w, lo, hi) asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(w) : "f"(lo), "f"(hi))
#define UNPACK_HALF2(lo, hi, w) \
    asm("{\n\t.reg .b16 l_, h_;\n\tmov.b32 {l_, h_}, %2;\n\t" \
        "cvt.f32.f16 %0, l_;\n\tcvt.f32.f16 %1, h_;\n\t}" : "=f"(lo), "=f"(hi) : "r"(w))
% endif
% if WGMMA:
<%
    nacc = INSN // 2                            # accumulators of one wgmma per lane
    regs = ", ".join("%%%d" % i for i in range(nacc))
%>\
#ifndef AOTCONV_SM90A
#error "conv_wgmma_f16_nhwc runs only as the sm_90a PTX that aotconv makes of it (aotconv.ptx); built from source alone its multiplies would be comments"
#endif
// the sm_90a instructions, each behind the marker aotconv.ptx uncomments (the compiler puts
// the operands' registers in as in any asm text). A __local pointer as uint is its address in
// the shared window.
#define SMEM_ADDR(p) ((uint)(p))
#define FENCE_PROXY_ASYNC() asm volatile("//@sm_90a fence.proxy.async.shared::cta;" ::: "memory")
#define WG_FENCE() asm volatile("//@sm_90a wgmma.fence.sync.aligned;" ::: "memory")
#define WG_COMMIT() asm volatile("//@sm_90a wgmma.commit_group.sync.aligned;" ::: "memory")
#define WG_WAIT() asm volatile("//@sm_90a wgmma.wait_group.sync.aligned ${WAIT};" ::: "memory")
#define WG_WAIT_ALL() asm volatile("//@sm_90a wgmma.wait_group.sync.aligned 0;" ::: "memory")
// acc[0][J0 .. J0 + INSN/8 - 1] += the warpgroup's A (64 x 16) * B (16 x INSN), by descriptors
% for j0 in range(0, NI, INSN // 8):
#define WGMMA_${j0}(da, db) asm volatile( \
    "//@sm_90a { .reg .pred p; setp.ne.b32 p, %${nacc + 2}, 0;\n" \
    "//@sm_90a wgmma.mma_async.sync.aligned.m64n${INSN}k16.f32.f16.f16 {${regs}}, %${nacc}, %${nacc + 1}, p, 1, 1, 0, 0; }" \
% for j in range(0, INSN // 8, 2):
    ${":" if j == 0 else ","} ${", ".join('"+f"(acc[0][%d][%d])' % (j0 + jj, q) for jj in (j, j + 1) for q in range(4))} \
% endfor
    : "l"(da), "l"(db), "r"(1) : "memory")
% endfor
% endif
#else
${mf.emulated()}\
${nh.ldsm_emulated()}\
% if CPASYNC:
// cp.async: the copy (or the zeros) at once; the groups and the wait have nothing to order
#define CP_ASYNC16(dst, src, ok) (*(__local uint4*)(dst) = (ok) ? *(src) : (uint4)(0u))
#define CP_COMMIT()
#define CP_WAIT()
% if HALO:
#define CP_WAIT_STEP()
% endif
% endif
% if EPI:
// a plain uint4 load, and the conversions of cvt.rn.f16x2.f32 and cvt.f32.f16, exactly
#define LDG16(w0, w1, w2, w3, p) do { \
    const uint4 u_ = *(p); \
    (w0) = u_.x; (w1) = u_.y; (w2) = u_.z; (w3) = u_.w; \
} while (0)
#define PACK_HALF2_RTE(w, lo, hi) vstore_half2_rte((float2)(lo, hi), 0, (__private half*)&(w))
#define UNPACK_HALF2(lo, hi, w) do { \
    (lo) = half_bits((w) & 0xffffu); \
    (hi) = half_bits((w) >> 16); \
} while (0)
% endif
% if WGMMA:
// wgmma m64nINSNk16 of the warpgroup: lane (g, t) of warp w computes its accumulators (rows
// 16 (w % 4) + g (+ 8), channels 8 j + 2t (+ 1)) from the halves its descriptors locate
// (start address, leading and stride byte offsets) in local memory, in k order; addresses
// are byte offsets from smem
#define SMEM_ADDR(p) ((uint)(((__local const uint*)(p) - smem) * 4))
#define FENCE_PROXY_ASYNC()
#define WG_FENCE()
#define WG_COMMIT()
#define WG_WAIT()
#define WG_WAIT_ALL()
#define DESC_AT(d, s) (((uint)((d) >> (s)) & 0x3FFFu) << 4)
#define WGMMA_EMU(J0, da, db) do { \
    const uint ab_ = DESC_AT(da, 0), al_ = DESC_AT(da, 16), as_ = DESC_AT(da, 32); \
    const uint bb_ = DESC_AT(db, 0), bl_ = DESC_AT(db, 16), bs_ = DESC_AT(db, 32); \
    for (int j_ = 0; j_ < INSN / 8; ++j_) \
        for (int q_ = 0; q_ < 4; ++q_) { \
            const int r_ = (warp & 3) * 16 + g + (q_ >> 1) * 8, c_ = j_ * 8 + 2 * t + (q_ & 1); \
            float s_ = acc[0][(J0) + j_][q_]; \
            for (int k_ = 0; k_ < 16; k_ += 2) { \
                const uint wa_ = smem[(ab_ + (r_ >> 3) * as_ + (k_ >> 3) * al_ \
                                       + (r_ & 7) * 16 + (k_ & 7) * 2) >> 2]; \
                const uint wb_ = smem[(bb_ + (c_ >> 3) * bs_ + (k_ >> 3) * bl_ \
                                       + (c_ & 7) * 16 + (k_ & 7) * 2) >> 2]; \
                s_ = fma(half_bits(wa_ & 0xffffu), half_bits(wb_ & 0xffffu), s_); \
                s_ = fma(half_bits(wa_ >> 16), half_bits(wb_ >> 16), s_); \
            } \
            acc[0][(J0) + j_][q_] = s_; \
        } \
} while (0)
% for j0 in range(0, NI, INSN // 8):
#define WGMMA_${j0}(da, db) WGMMA_EMU(${j0}, da, db)
% endfor
% endif
#endif
% if EPI:

// the 8 halves at p (16 bytes: channel j in bits 16 (j % 2) of word j / 2) as floats, and 8
// floats rounded to halves (to nearest even) as a uint4: the staged epilogue's global
// accesses are 16-byte vectors, converted in registers
inline float8 load_half8(__global const uint4* p)
{
    uint w0, w1, w2, w3;
    float f0, f1, f2, f3, f4, f5, f6, f7;
    LDG16(w0, w1, w2, w3, p);
    UNPACK_HALF2(f0, f1, w0);
    UNPACK_HALF2(f2, f3, w1);
    UNPACK_HALF2(f4, f5, w2);
    UNPACK_HALF2(f6, f7, w3);
    return (float8)(f0, f1, f2, f3, f4, f5, f6, f7);
}

inline uint4 pack_half8_rte(float8 v)
{
    uint w0, w1, w2, w3;
    PACK_HALF2_RTE(w0, v.s0, v.s1);
    PACK_HALF2_RTE(w1, v.s2, v.s3);
    PACK_HALF2_RTE(w2, v.s4, v.s5);
    PACK_HALF2_RTE(w3, v.s6, v.s7);
    return (uint4)(w0, w1, w2, w3);
}
% endif

// Weights [K][C][R][S] (half bits) -> words [K/BN tiles][KTILES][BN][BK/2]: word (nt, kt, j,
// kp) holds w[n][k] low and w[n][k + 1] high, n = nt * BN + j, k = kt * BK + 2 kp in (r, s, c)
// order (k and k + 1 two channels of one tap: C is even); zero outside the layer (run once;
// exact). A step's weight tile is one contiguous run of BN * BK/2 words.
% if HALO:
// With the halo tile a step is BK channels of one tap: step kt holds channels
// kt / (R S) * BK + 2 kp (+ 1) of tap kt % (R S), so the taps of BK channels are R S steps;
// and a step's words are in core-matrix order (below), copied to local memory as they are.
% endif
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ushort* restrict w, __global uint* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= (K + BN - 1) / BN * BN * (RSCP / 2))
        return;
% if HALO:
    // a step's tile in the tensor cores' core matrices, as local memory holds it: 16-byte chunk
    // q = (row block * CH + chunk) * 8 + row % 8, so the work-group copies it straight
    const int q = i % (BK / 2 * BN) / 4;
    const int kp = q / 8 % CH * 4 + i % 4, j = q / (8 * CH) * 8 + q % 8;
% else:
    const int kp = i % (BK / 2), j = i / (BK / 2) % BN;
% endif
    const int kt = i / (BK / 2 * BN) % KTILES, nt = i / (BK / 2 * BN * KTILES);
    const int n = nt * BN + j, k = kt * BK + 2 * kp;
    uint v = 0u;
    if (n < K && k < RSC) {
% if HALO:
        const int tap = kt % (R * S), ch = kt / (R * S) * BK + 2 * kp;  // steps (BK channels, tap)
% else:
        const int tap = k / C, ch = k % C;
% endif
        const int wi = ((n * C + ch) * R + tap / S) * S + tap % S;
        v = (uint)w[wi] | (uint)w[wi + R * S] << 16;      // channels ch, ch + 1
    }
    wp[i] = v;
}

${nh.head(el)}\
% if HALO:
    __local uint4 smem4[SMEM / 4] __attribute__((aligned(128)));   // halo and weight buffers${", then the staged epilogue" if EPI else ""}
% elif EPI:
    __local uint4 smem4[SMEM / 4]${" __attribute__((aligned(128)))" if WGMMA else ""};             // the stages, then the staged epilogue
% elif WGMMA:
    __local uint4 smem4[NBUF * STAGE / 4] __attribute__((aligned(128)));
% else:
    __local uint4 smem4[NBUF * STAGE / 4];     // uint4: the vector stores stay aligned
% endif
${nh.setup(el)}\
% if EPI:
    // epilogue, staged: c[2h + j] of tile (mi, ni) is pixel g + 8h, channel 2t + j of the tile.
    // Pass mi stages rows mi * 16 .. of every warp's part (FP32, as accumulated), then the
    // work-group stores those pixels 8 channels at a time: in NHWC pixel m's channels start at
    // m * K, so 8 of them are one uint4 of the output (and of the residual, and of the bias).
    // Bias, ${"residual, " if residual else ""}activation and rounding as the direct epilogue does them, per element.
    // BN8 divides the work-group, so a work-item's chunk of 8 channels is the same in every
    // vector it stores, and so is the half of it it reads first (lanes 4-7 of each 8: the
    // second, for the bank analysis above).
    __local float* const ep = (__local float*)smem4;
    const int ec = tid % BN8, n = n0 + ec * 8, eh = (tid >> 2) & 1;
% if has_bias:
% if NCHK:
    const float8 b8 = n < K ? load_half8((__global const uint4*)bias + n / 8) : (float8)(0.0f);
% else:
    const float8 b8 = load_half8((__global const uint4*)bias + n / 8);
% endif
% endif
% if pool:
    // The 2x2 max pool fused: one pass stages the whole tile (BM = 16 WM: warp wm's rows are
    // tile rows 16 wm ..), whose BM slots are whole pairs of padded rows (BM a multiple of
    // 2 TWH, TW even); each window's four outputs get bias and activation per element, their
    // max is rounded to half once and stored at the pooled pixel.
    barrier(CLK_LOCAL_MEM_FENCE);              // the last stage read out
    #pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        __local float* const e0 = ep + (wm * 16 + g) * ELD + wn * WTN + ni * 8 + 2 * t;
        *(__local float2*)e0 = (float2)(acc[0][ni][0], acc[0][ni][1]);
        *(__local float2*)(e0 + 8 * ELD) = (float2)(acc[0][ni][2], acc[0][ni][3]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = tid; e < BM / 4 * BN8; e += WG) {
        // window e / BN8 of the tile: its first slot's row r0 (even padded row, even column)
        const int w = e / BN8, r0 = w / (TWH / 2) * (2 * TWH) + w % (TWH / 2) * 2;
        const int u = u0 + r0, pr = u / TWH, yq = pr % HP, xq = u % TWH;
        if (xq >= TW || ox0 + xq >= Q || yq >= P || pr >= BATCH * HP)
            continue;
% if NCHK:
        if (n >= K)
            continue;
% endif
        float8 o;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            __local const float4* const p = (__local const float4*)(ep + (r0 + j / 2 * TWH + j % 2) * ELD + ec * 8);
            float8 s = (float8)(p[0], p[1]);
% if has_bias:
            s += b8;
% endif
% if attrs["act"] != "none":
            s = (float8)(${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4))},
                         ${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4, 8))});
% endif
            o = j ? fmax(o, s) : s;
        }
        const int mo = (pr / HP * (P / 2) + yq / 2) * (Q / 2) + (ox0 + xq) / 2;
        ((__global uint4*)y)[(mo * K + n) / 8] = pack_half8_rte(o);
    }
}
% else:
<%call expr="nh.staged_passes(el)">\
            const int i8 = (m * K + n) / 8;
            __local const float4* const p = (__local const float4*)(ep + sr * ELD + ec * 8);
            const float4 f0 = p[eh], f1 = p[1 - eh];
            float8 s = eh ? (float8)(f1, f0) : (float8)(f0, f1);
% if has_bias:
            s += b8;
% endif
% if residual:
            s += load_half8((__global const uint4*)res + i8);
% endif
% if attrs["act"] == "none":
            ((__global uint4*)y)[i8] = pack_half8_rte(s);
% else:
            const float8 o = (float8)(${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4))},
                                      ${", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s.s%d" % j).strip() for j in range(4, 8))});
            ((__global uint4*)y)[i8] = pack_half8_rte(o);
% endif
</%call>\
% endif
% else:
${nh.direct_epilogue(el)}\
% endif

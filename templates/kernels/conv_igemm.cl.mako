<%namespace name="c" file="_common.mako"/>\
<%!
from aotconv.variants.kernel_text import comp, indent, vtype


def define(name, value, comment=""):
    line = "#define %-10s %s" % (name, value)
    return ("%-30s // %s" % (line, comment)) if comment else line
%>\
<%
    xs_n, xs_c, xs_h, xs_w = XS
    ys_n, ys_c, ys_h, ys_w = YS
    # The runtime checks of the implicit im2col load, decided here from the layer's sizes:
    # a tap in the padding reads 0 (HCHK, WCHK); a row past CRS in a partial last K tile reads 0,
    # folded into the height or width check when there is one (a huge negative offset fails it).
    fold_h = KCHK and HCHK
    fold_w = KCHK and WCHK and not HCHK
    terms = []
    if HCHK:
        terms.append("(uint)(ih0[j] + rh) < (uint)H")
    if WCHK:
        terms.append("(uint)(iw0[j] + rw) < (uint)W")
    if KCHK and not (HCHK or WCHK):
        terms.append("rowok")
    bcond = " && ".join(terms)
    # store guards: columns past N, and (split-K) the slices that are not the last to arrive
    skip_n = " || ".join((["n >= NPQ"] if NCHK else []) + (["!last"] if KSPLIT > 1 else []))
    keep_n = " && ".join((["n < NPQ"] if NCHK else []) + (["last"] if KSPLIT > 1 else []))
    residual = bool(attrs.get("residual"))      # an add fused in (aotconv.variants.residual)
%>\
// ${prefix}: convolution as a local-memory implicit GEMM (${variant}, after BEAST)
//   in ${BATCH}x${C}x${H}x${W} -> out ${BATCH}x${K}x${P}x${Q}, kernel ${R}x${S}, stride ${SH}x${SW},
//   pad top/left/bottom/right ${PT}/${PL}/${PB}/${PR}, dilation ${DH}x${DW}, groups ${G},
//   bias ${"yes" if has_bias else "no"}, act ${attrs["act"]}; input and output in ${LAYOUT}
// per group: Y[m][n] = sum_k Wt[k][m] * X[k][n] with M = K/G = ${KG} output channels,
//   N = N*P*Q = ${NPQ} output pixels (${"the image index fastest" if BATCH_FAST else "image-major"}), k = ${"(c, r, s)" if RED_CMAJOR else "(r, s, c)"} over C/G*R*S = ${CRS};
//   X (im2col of the input) is never stored: its tiles are read from the input in place.

// -- tunables
${define("MDIM", MDIM, "work-items along M (output channels)")}
${define("NDIM", NDIM, "work-items along N (output pixels)")}
${define("MBLK", MBLK, "tile in M per work-group")}
${define("NBLK", NBLK, "tile in N per work-group")}
${define("KBLK", KBLK, "reduction step held in local memory")}
${define("VW", VW, "vector width: weight loads, local reads, stores")}
${define("UNROLL", UNROLL, "unroll of the KBLK loop (0 = fully)")}
${define("LPAD", LPAD, "floats of padding per local B row")}
${define("DBUF", DBUF, "prefetch tile k+1 into registers during tile k")}
${define("LAYOUT_" + LAYOUT, 1, "layout of the input read and the output written")}
${define("KSPLIT", KSPLIT, "reduction slices (split-K)")}
${define("TAPSTEP", TAPSTEP, "one filter tap per KBLK step: rows are channels")}
${define("KTAIL", KTAIL, "split-K only past the last whole wave of this many work-groups")}
${define("MTHD", MTHD, "accumulator rows per work-item (MBLK/MDIM)")}
${define("NTHD", NTHD, "accumulator columns per work-item (NBLK/NDIM)")}
${define("WG", "(MDIM * NDIM)")}

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
${define("G", G)}
${define("CG", CG, "input channels per group")}
${define("KG", KG, "output channels per group (M)")}
${define("NPQ", NPQ, "output pixels (N)")}
${define("CRS", CRS, "reduction length")}
${define("CRSP", CRSP, "... padded to whole KBLK steps")}
${define("KGP", KGP, "M padded to whole MBLK tiles")}
${define("MTILES", MTILES, "MBLK tiles per group")}
${define("KTILES", "(CRSP / KBLK)")}
${define("KT_PER", KT_PER, "KBLK steps per reduction slice")}
${define("NTILES", NTILES, "NBLK tiles per group")}
${define("FULL", FULL, "split-K: tiles computed whole, by work-groups 0..FULL-1")}
${define("SPLIT_TILES", SPLIT_TILES, "split-K: tiles after those, KSPLIT work-groups each")}
// strides of the input (X_) and output (Y_) layouts
${define("X_SN", xs_n)}
${define("X_SC", xs_c)}
${define("X_SH", xs_h)}
${define("X_SW", xs_w)}
${define("Y_SN", ys_n)}
${define("Y_SC", ys_c)}
${define("Y_SH", ys_h)}
${define("Y_SW", ys_w)}
// local memory: weight tiles [KBLK][LDA], input tiles [KBLK][LDB], NBUF of each
${define("LDA", LDA)}
${define("LDB", LDB)}
${define("A_SIZE", "(KBLK * LDA)")}
${define("B_SIZE", "(KBLK * LDB)")}
${define("NBUF", 2 if DBUF else 1)}
// the weight load: KBLK rows of AVEC vectors, A_ITERS vectors per work-item
${define("AVEC", AVEC)}
${define("A_ITERS", A_ITERS)}
// the input load, along ${"N: a work-item keeps BCOLS columns and walks BROWS rows" if B_ALONG == "n" else "K: a work-item keeps BROWS rows and walks BCOLS columns"}
${define("BCOLS", BCOLS)}
${define("B_COLSTEP", B_COLSTEP)}
${define("BROWS", BROWS)}
${define("B_ROWSTEP", B_ROWSTEP)}
${define("floatV", vtype(VW))}
${c.helpers()}
// Weights [K][C/G][R][S] -> k-major [G][CRSP][KGP], zero outside the layer (run once).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_pack(__global const ${c.T()}* restrict w, __global float* restrict wp)
{
    const int i = get_global_id(0);
    if (i >= G * CRSP * KGP)
        return;
    const int m = i % KGP;
    const int crs = (i / KGP) % CRSP;
    const int g = i / (KGP * CRSP);
    float v = 0.0f;
    if (m < KG && crs < CRS) {
% if RED_CMAJOR:
        const int c = crs / (R * S), rs = crs % (R * S);
% else:
        const int c = crs % CG, rs = crs / CG;
% endif
        v = ${c.LOAD("w", "((g * KG + m) * CG + c) * (R * S) + rs")};
    }
    wp[i] = v;
}
% if KSPLIT > 1:

// The arrival counters of split-K, one per split tile: zeroed once (run() leaves them zero).
__kernel __attribute__((reqd_work_group_size(64, 1, 1)))
void ${prefix}_zero(__global int* restrict sem)
{
    const int i = get_global_id(0);
    if (i < SPLIT_TILES)
        sem[i] = 0;
}

// Split-K's hand-over between work-groups needs a fence at device scope: NVIDIA's OpenCL
// compiles mem_fence(CLK_GLOBAL_MEM_FENCE) to membar.cta (work-group scope), so there the
// fence is written in PTX; elsewhere the OpenCL 1.2 fence is the one there is.
#if defined(cl_nv_pragma_unroll) || defined(cl_nv_compiler_options) || defined(cl_nv_device_attribute_query)
#define DEVICE_FENCE() asm volatile("membar.gl;" ::: "memory")
#else
#define DEVICE_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif
% endif
<%def name="load_tile(kt)">\
// weights: KBLK x MBLK, aligned vectors, no checks (packed and padded)
#pragma unroll
for (int it = 0; it < A_ITERS; ++it) {
    const int e = tid + it * WG;
    pa[it] = *(__global const floatV*)(wg + (${kt} * KBLK + e / AVEC) * KGP + e % AVEC * VW);
}
// input: KBLK x NBLK of the implicit im2col matrix
% if TAPSTEP:
// one tap (r, s) for the whole step: its rows are channels cb, cb + B_ROWSTEP, ... at fixed
// distances in the input, so a column is checked once and its loads share one pointer
{
    const int k0 = ${kt} * KBLK;
    const int rs = k0 / CG, r = rs / S, s = rs % S;
    const int xo_r = (k0 % CG + brow) * X_SC + r * (DH * X_SH) + s * (DW * X_SW);
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j) {
        __global const ${c.T()}* const xj = x + (xo[j] + xo_r);
%   if HCHK or WCHK:
        const bool ok = ${" && ".join((["(uint)(ih0[j] + r * DH) < (uint)H"] if HCHK else []) + (["(uint)(iw0[j] + s * DW) < (uint)W"] if WCHK else []))};
%   endif
        #pragma unroll
        for (int t = 0; t < BROWS; ++t)
%   if HCHK or WCHK:
            pb[t][j] = ok ? ${c.LOAD("xj", "t * (B_ROWSTEP * X_SC)")} : 0.0f;
%   else:
            pb[t][j] = ${c.LOAD("xj", "t * (B_ROWSTEP * X_SC)")};
%   endif
    }
}
% else:
#pragma unroll
for (int t = 0; t < BROWS; ++t) {
    const int crs = ${kt} * KBLK + brow + t * B_ROWSTEP;
% if RED_CMAJOR:
    const int c = crs / (R * S), rs = crs % (R * S);
% else:
    const int c = crs % CG, rs = crs / CG;
% endif
    const int r = rs / S, s = rs % S;
    const int xo_r = c * X_SC + r * (DH * X_SH) + s * (DW * X_SW);
% if HCHK:
    const int rh = ${"crs < CRS ? r * DH : -(1 << 28)" if fold_h else "r * DH"};
% endif
% if WCHK:
    const int rw = ${"crs < CRS ? s * DW : -(1 << 28)" if fold_w else "s * DW"};
% endif
% if KCHK and not (HCHK or WCHK):
    const bool rowok = crs < CRS;
% endif
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j)
% if bcond:
        pb[t][j] = (${bcond}) ? ${c.LOAD("x", "xo[j] + xo_r")} : 0.0f;
% else:
        pb[t][j] = ${c.LOAD("x", "xo[j] + xo_r")};
% endif
}
% endif
</%def>\
<%def name="store_tile(buf)">\
{
    __local float* const as = Abuf + (${buf}) * A_SIZE;
    __local float* const bs = Bbuf + (${buf}) * B_SIZE;
    #pragma unroll
    for (int it = 0; it < A_ITERS; ++it) {
        const int e = tid + it * WG;
        *(__local floatV*)(as + e / AVEC * LDA + e % AVEC * VW) = pa[it];
    }
    #pragma unroll
    for (int t = 0; t < BROWS; ++t)
        #pragma unroll
        for (int j = 0; j < BCOLS; ++j)
            bs[(brow + t * B_ROWSTEP) * LDB + bcol + j * B_COLSTEP] = pb[t][j];
}
</%def>\
<%def name="multiply(buf)">\
{
    __local const float* const as = Abuf + (${buf}) * A_SIZE + tm * VW;
    __local const float* const bs = Bbuf + (${buf}) * B_SIZE + tn * VW;
    #pragma unroll ${"" if UNROLL == 0 else UNROLL}
    for (int kk = 0; kk < KBLK; ++kk) {
        float am[MTHD];
        floatV bv[NTHD / VW];
        #pragma unroll
        for (int i = 0; i < MTHD / VW; ++i) {
            const floatV v = *(__local const floatV*)(as + kk * LDA + i * (MDIM * VW));
% for v in range(VW):
            am[i * VW + ${v}] = v${comp(VW, v)};
% endfor
        }
        #pragma unroll
        for (int j = 0; j < NTHD / VW; ++j)
% if LDB % VW == 0:
            bv[j] = *(__local const floatV*)(bs + kk * LDB + j * (NDIM * VW));
% else:
            bv[j] = vload${VW}(0, bs + kk * LDB + j * (NDIM * VW));
% endif
        #pragma unroll
        for (int i = 0; i < MTHD; ++i)
            #pragma unroll
            for (int j = 0; j < NTHD / VW; ++j)
                acc[i][j] = mad((floatV)(am[i]), bv[j], acc[i][j]);
    }
}
</%def>\

// One work-group: an MBLK x NBLK tile of one group's Y. Work-item (tn, tm) owns its rows
// (i*MDIM + tm)*VW + v and columns (j*NDIM + tn)*VW + v: strided, so neighbouring work-items
// read neighbouring local vectors (no bank conflicts) and write neighbouring outputs.
__kernel __attribute__((reqd_work_group_size(NDIM, MDIM, 1)))
void ${prefix}(__global const ${c.T()}* restrict x, __global const float* restrict wp,
% if has_bias:
               __global const ${c.T()}* restrict bias,
% endif
% if residual:
               __global const ${c.T()}* restrict res,     // the fused add's other input
% endif
               __global ${c.T()}* restrict y${",\n               __global float* restrict part, __global int* restrict sem" if KSPLIT > 1 else ""})
{
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int tid = tm * NDIM + tn;
% if KSPLIT > 1:
    // split-K, one row of work-groups: 0..FULL-1 compute whole tiles, the rest a reduction
    // slice each of the SPLIT_TILES tiles after those (KSPLIT consecutive work-groups a tile);
    // tiles are numbered n-tile fastest, the order of the 2D grid without split-K
    const int wgid = get_group_id(0);
    const int split = wgid >= FULL;                       // uniform over the work-group
    const int stile = (wgid - FULL) / KSPLIT;             // index among the split tiles
    const int slice = split ? (wgid - FULL) % KSPLIT : 0;
    const int tile = split ? FULL + stile : wgid;
    const int n0 = tile % NTILES * NBLK;
    const int g = tile / NTILES / MTILES;
    const int m0 = tile / NTILES % MTILES * MBLK;
    const int kt0 = split ? slice * KT_PER : 0;           // this work-group's K steps
    const int kt1 = split ? min(KTILES, kt0 + KT_PER) : KTILES;
% else:
    const int n0 = get_group_id(0) * NBLK;
    const int g = get_group_id(1) / MTILES;
    const int m0 = get_group_id(1) % MTILES * MBLK;
    const int kt0 = 0, kt1 = KTILES;
% endif
    __global const float* const wg = wp + g * (CRSP * KGP) + m0;

    // declared as float4: vector accesses to local memory stay aligned
    __local float4 Abuf4[NBUF * A_SIZE / 4];
    __local float4 Bbuf4[(NBUF * B_SIZE + 3) / 4];
    __local float* const Abuf = (__local float*)Abuf4;
    __local float* const Bbuf = (__local float*)Bbuf4;
% if KSPLIT > 1:
    __local int arrived;                 // split-K: how many slices reached the tile before this one
% endif

    // Where this work-item loads the input tile, and per column the input offset of its
    // window's top-left tap (ih0, iw0 kept where the padding needs a check). A column past N
    // reads a real pixel instead; its result is never stored.
% if B_ALONG == "n":
    const int bcol = tid % NBLK, brow = tid / NBLK;
% else:
    const int brow = tid % KBLK, bcol = tid / KBLK;
% endif
    int xo[BCOLS];
% if HCHK:
    int ih0[BCOLS];
% endif
% if WCHK:
    int iw0[BCOLS];
% endif
    #pragma unroll
    for (int j = 0; j < BCOLS; ++j) {
% if NCHK:
        const int n = min(n0 + bcol + j * B_COLSTEP, NPQ - 1);
% else:
        const int n = n0 + bcol + j * B_COLSTEP;
% endif
% if BATCH_FAST:
        const int img = n % BATCH, pq = n / BATCH;
% else:
        const int img = n / (P * Q), pq = n % (P * Q);
% endif
        const int h0 = pq / Q * SH - PT, w0 = pq % Q * SW - PL;
        xo[j] = img * X_SN + g * CG * X_SC + h0 * X_SH + w0 * X_SW;
% if HCHK:
        ih0[j] = h0;
% endif
% if WCHK:
        iw0[j] = w0;
% endif
    }

    floatV acc[MTHD][NTHD / VW];      // acc[i][j] holds columns (j*NDIM + tn)*VW + 0..VW-1
    #pragma unroll
    for (int i = 0; i < MTHD; ++i)
        #pragma unroll
        for (int j = 0; j < NTHD / VW; ++j)
            acc[i][j] = (floatV)(0.0f);
    floatV pa[A_ITERS];               // the next tile, on its way to local memory
    float pb[BROWS][BCOLS];

% if DBUF:
    // tile 0 into buffer 0; then each step loads tile kt+1 into registers, multiplies tile kt
    // and stores tile kt+1 into the other buffer: one barrier per step
${indent(capture(load_tile, "kt0"), 4)}\
${indent(capture(store_tile, "0"), 4)}\
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = kt0; kt < kt1; ++kt) {
        const int cur = (kt - kt0) & 1;
        if (kt + 1 < kt1) {
${indent(capture(load_tile, "(kt + 1)"), 12)}\
        }
${indent(capture(multiply, "cur"), 8)}\
        if (kt + 1 < kt1) {
${indent(capture(store_tile, "1 - cur"), 12)}\
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% else:
    for (int kt = kt0; kt < kt1; ++kt) {
${indent(capture(load_tile, "kt"), 8)}\
${indent(capture(store_tile, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
${indent(capture(multiply, "0"), 8)}\
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif

% if KSPLIT > 1:
    // split-K: park this slice's partial tile in scratch, laid out [tile][slice][vector][tid]
    // (coalesced); the last slice to arrive at the tile sums all KSPLIT partials in slice
    // order, its own from registers, and stores the tile; the others run the epilogue with
    // their stores off (PoCL miscompiled the store guards inside a branch on the arrival).
    int last = 1;                                 // whole tiles store their result
    if (split) {
        __global floatV* const pt = (__global floatV*)part + (size_t)stile * (KSPLIT * MTHD * NTHD / VW) * WG + tid;
        #pragma unroll
        for (int i = 0; i < MTHD; ++i)
            #pragma unroll
            for (int j = 0; j < NTHD / VW; ++j)
                pt[((slice * MTHD + i) * (NTHD / VW) + j) * WG] = acc[i][j];
        DEVICE_FENCE();                           // the partial is visible before the arrival
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        if (tid == 0)
            arrived = atomic_inc(sem + stile);
        barrier(CLK_LOCAL_MEM_FENCE);
        last = arrived == KSPLIT - 1;             // uniform over the work-group
        if (last) {
            DEVICE_FENCE();
            volatile __global const floatV* const pv = pt;   // volatile: past any stale cache
            #pragma unroll
            for (int i = 0; i < MTHD; ++i)
                #pragma unroll
                for (int j = 0; j < NTHD / VW; ++j) {
                    floatV s = (floatV)(0.0f);
                    for (int sl = 0; sl < KSPLIT; ++sl)
                        s += sl == slice ? acc[i][j] : pv[((sl * MTHD + i) * (NTHD / VW) + j) * WG];
                    acc[i][j] = s;
                }
            if (tid == 0)
                sem[stile] = 0;                   // ready for the next run
        }
    }
% endif
    // epilogue: bias, activation, stores; partial tiles guarded
    float bm[MTHD];
    #pragma unroll
    for (int i = 0; i < MTHD; ++i) {
% if has_bias:
        bm[i] = ${c.LOAD("bias", "g * KG + min(m0 + (i / VW * MDIM + tm) * VW + i % VW, KG - 1)")};
% else:
        bm[i] = 0.0f;
% endif
    }
% if VSTORE:
    // VW consecutive pixels of one image are VW consecutive, aligned floats of the output
    #pragma unroll
    for (int j = 0; j < NTHD / VW; ++j) {
        const int n = n0 + (j * NDIM + tn) * VW;
%   if skip_n:
        if (${skip_n})
            continue;
%   endif
%   if BATCH_FAST:
        __global ${c.T()}* const yo = y + g * KG * Y_SC + n;
%   else:
        __global ${c.T()}* const yo = y + n / (P * Q) * Y_SN + g * KG * Y_SC + n % (P * Q);
%   endif
        #pragma unroll
        for (int i = 0; i < MTHD; ++i) {
            const int m = m0 + (i / VW * MDIM + tm) * VW + i % VW;
%   if MCHK:
            if (m >= KG)
                continue;
%   endif
%   if residual:
            // the residual where y is written: the same offset, the same alignment
            const floatV s = acc[i][j] + bm[i] + ${c.LOADAT("__global const floatV*", VW, "(res + (yo - y) + m * Y_SC)")};
%   else:
            const floatV s = acc[i][j] + bm[i];
%   endif
            ${c.STOREAT("__global floatV*", VW, "(yo + m * Y_SC)", "(floatV)(%s)" % ", ".join(capture(c.act, attrs["act"], attrs["alpha"], "s" + comp(VW, v)).strip() for v in range(VW)))};
        }
    }
% else:
    #pragma unroll
    for (int j = 0; j < NTHD / VW; ++j) {
%   for v in range(VW):
        {
            const int n = n0 + (j * NDIM + tn) * VW + ${v};
%     if keep_n:
            if (${keep_n}) {
%     else:
            {
%     endif
%     if BATCH_FAST:
                const int img = n % BATCH, pq = n / BATCH;
%     else:
                const int img = n / (P * Q), pq = n % (P * Q);
%     endif
                __global ${c.T()}* const yo = y + img * Y_SN + g * KG * Y_SC + pq / Q * Y_SH + pq % Q * Y_SW;
                #pragma unroll
                for (int i = 0; i < MTHD; ++i) {
                    const int m = m0 + (i / VW * MDIM + tm) * VW + i % VW;
%     if MCHK:
                    if (m >= KG)
                        continue;
%     endif
%     if residual:
                    const float s = acc[i][j]${comp(VW, v)} + bm[i] + ${c.LOAD("res", "(yo - y) + m * Y_SC")};
%     else:
                    const float s = acc[i][j]${comp(VW, v)} + bm[i];
%     endif
                    ${c.STORE("yo", "m * Y_SC", capture(c.act, attrs["act"], attrs["alpha"], "s"))};
                }
            }
        }
%   endfor
    }
% endif
}

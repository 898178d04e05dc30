"""conv_igemm: BEAST-style local-memory implicit-GEMM convolution (forward).

Per group the convolution is the GEMM  Y[m][n] = sum_k Wt[k][m] * X[k][n]  with
M = K/G output channels, N = N*P*Q output pixels and the reduction k = (c, r, s) over
C/G*R*S. X is never materialised: each work-group reads its KBLK x NBLK tile of the implicit
im2col matrix straight from the input image (padding, stride and dilation resolved in the
load with every size a compile-time constant) into local memory, next to a KBLK x MBLK tile of
the weights; each of its MDIM x NDIM work-items accumulates an MTHD x NTHD block
(MTHD = MBLK/MDIM, NTHD = NBLK/NDIM) in registers. Weights are re-laid out once, in set_params
(the `_pack` setup launch), to k-major [G][CRSP][KGP] zero-padded to whole tiles, so A loads
are aligned VW-wide vectors without bounds checks and a partial last K tile multiplies zeros.

Layouts: LAYOUT is the layout of both the input read and the output written: NCHW (the
default and the fallback), CHWN (BEAST's choice: the batch is the contiguous dimension, so a
tile's pixels are consecutive images) or NHWC (channels contiguous: the B tile is then loaded
along the reduction, with reduction order (r, s, c)).

Split-K (KSPLIT > 1), for layers with too few output tiles to fill the device (Boda's 1x1
convolutions over 7x7 and 14x14 images: a few dozen tiles, each a long chain of KBLK steps):
the reduction is cut into KSPLIT slices, KSPLIT work-groups per tile. Each slice parks its
partial tile in the shared scratch buffer and bumps an arrival counter of the tile (an integer
atomic); the last slice to arrive sums the KSPLIT partials in slice order (so the result does
not depend on arrival order), runs the epilogue and resets the counter for the next run. One
launch, no second reduction kernel; the counters are zeroed once, in set_params.
With KTAIL = w (GPU only), only the tiles past the last whole wave of w work-groups are split:
a layer with 1.28 waves of tiles (AlexNet conv5 at batch 128) runs one whole wave and a third
of one instead of two.

One tap per step (TAPSTEP=1, NCHW/CHWN with C/G % KBLK == 0): the reduction runs (r, s, c), so
a KBLK step is KBLK channels of one filter tap; the B load then needs no division per row and
one bounds check per column and step (10-15% on the H100's 3x3 and 5x5 layers).
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, Scratch,
                   ceil_div, pow2_at_least, round_up)
from .conv_common import conv_sizes, enough_work_groups, thread_dims, whole_simd_groups
from .gemm_tiles import whole_vectors
from .limits import first_valid
from .residual import with_residual

LAYOUTS = ("NCHW", "CHWN", "NHWC")


def layout_strides(layout, n, c, h, w):
    """(stride of N, C, H, W) of a tensor stored in `layout`."""
    if layout == "NCHW":
        return c * h * w, h * w, w, 1
    if layout == "CHWN":
        return 1, h * w * n, w * n, n
    if layout == "NHWC":
        return h * w * c, 1, w * c, c
    raise ValueError(layout)


def needs_bounds(size, out, stride, pad_lo, k, dil):
    """True when some tap of some output position falls into the padding (a runtime check)."""
    return pad_lo > 0 or (out - 1) * stride - pad_lo + (k - 1) * dil > size - 1


def _kind(target):
    return "gpu" if target.kind == "gpu" else "cpu"


def _wg(c):
    return c["MDIM"] * c["NDIM"]


def _b_plan(c):
    """How the work-group loads the KBLK x NBLK B tile: (along, cols, colstep, rows, rowstep).

    along "n" (NCHW, CHWN: pixels contiguous): consecutive work-items take consecutive columns,
    so each work-item keeps the same `cols` columns for the whole reduction and walks `rows`
    rows; along "k" (NHWC: channels contiguous) the roles swap."""
    wg, nb, kb = _wg(c), c["NBLK"], c["KBLK"]
    if c["LAYOUT"] == "NHWC":
        colstep = max(1, wg // kb)
        return "k", nb // colstep, colstep, max(1, kb // wg), wg
    rowstep = max(1, wg // nb)
    return "n", max(1, nb // wg), wg, kb // rowstep, rowstep


def _b_covers(c):
    wg, nb, kb = _wg(c), c["NBLK"], c["KBLK"]
    if c["LAYOUT"] == "NHWC":
        return (wg % kb == 0 and nb % (wg // kb) == 0) or kb % wg == 0
    return (wg % nb == 0 and kb % (wg // nb) == 0) or nb % wg == 0


def _gemm_dims(layer):
    """(M, N, reduction) of one group's GEMM."""
    n, k, p, q = layer.out_shape
    a = layer.attrs
    g = a["groups"]
    return k // g, n * p * q, layer.in_shape[1] // g * a["kernel"][0] * a["kernel"][1]


def _work_groups(layer, c):
    m, n, _ = _gemm_dims(layer)
    return ceil_div(m, c["MBLK"]) * ceil_div(n, c["NBLK"]) * layer.attrs["groups"]


def _ktiles(layer, c):
    return ceil_div(_gemm_dims(layer)[2], c["KBLK"])


def _kt_per_split(layer, c):
    return ceil_div(_ktiles(layer, c), c["KSPLIT"])


def _tail(layer, c):
    """(whole tiles, split tiles): with KTAIL = w > 0 only the tiles past the last whole wave of
    w work-groups are split (AlexNet conv5 at batch 128: 338 tiles of 128x128 on 264 resident
    work-groups run 264 whole and split 74), else every tile is when KSPLIT > 1."""
    tiles = _work_groups(layer, c)
    if c["KSPLIT"] == 1:
        return tiles, 0
    full = tiles // c["KTAIL"] * c["KTAIL"] if c["KTAIL"] else 0
    return full, tiles - full


def _split_fills_device(layer, c, t):
    """Split-K only where the output tiles leave compute units idle. KTAIL=0: fewer tiles than
    compute units x min_wg_per_cu, into no more slices than bring the work-groups to 4 per
    compute unit. KTAIL=w: a last partial wave of w work-groups, whose slices fit one wave."""
    if c["KSPLIT"] == 1:
        return c["KTAIL"] == 0
    fill = t.compute_units * max(1, t.min_wg_per_cu)
    wgs = _work_groups(layer, c)
    if c["KTAIL"] == 0:
        return wgs < fill and wgs * c["KSPLIT"] <= 4 * fill
    full, tail = _tail(layer, c)
    return full > 0 and tail > 0 and tail * c["KSPLIT"] <= c["KTAIL"]


def tail_waves(target):
    """KTAIL values: the work-groups a wave holds, for 1, 2 and 4 resident per compute unit
    (which the tuner finds out); a CPU runs no waves worth splitting for."""
    if target.kind != "gpu":
        return (0,)
    return (0,) + tuple(target.compute_units * k for k in (2, 1, 4))


def _one_tap_per_step(layer, c, t=None):
    """TAPSTEP=1: the reduction runs (r, s, c) with C/G a whole number of KBLK steps, so each
    step's rows are KBLK channels of one filter tap (NHWC loads along the reduction anyway;
    a 1x1 filter has one tap and no order to choose)."""
    if not c["TAPSTEP"]:
        return True
    a = layer.attrs
    cg = layer.in_shape[1] // a["groups"]
    return c["LAYOUT"] != "NHWC" and a["kernel"][0] * a["kernel"][1] > 1 and cg % c["KBLK"] == 0


# Partial tiles of split-K live in the shared scratch buffer; beyond this it is not worth it
_MAX_PARTIAL_BYTES = 64 << 20


def _partial_floats(layer, c):
    return _tail(layer, c)[1] * c["KSPLIT"] * c["MBLK"] * c["NBLK"]


def _fallbacks(*rows, **fixed):
    return [dict(zip(("MDIM", "NDIM", "MBLK", "NBLK", "KBLK", "VW"), r), **fixed) for r in rows]


# Preferred fallback points, big tiles first; the last of each list is valid for every layer
# (and, for the GPU list, every target with >= 64 work-items and 2 KiB of local memory).
_FALLBACKS = {
    "gpu": _fallbacks((16, 16, 128, 128, 16, 4), (16, 16, 64, 128, 16, 4), (16, 16, 128, 64, 16, 4),
                      (16, 16, 64, 64, 16, 4), (8, 16, 32, 64, 16, 4), (16, 8, 64, 32, 16, 4),
                      (8, 16, 16, 64, 16, 2), (16, 8, 64, 16, 16, 2), (8, 8, 32, 32, 16, 4),
                      (8, 8, 16, 32, 16, 2), (8, 8, 32, 16, 16, 2), (8, 8, 16, 16, 16, 2),
                      (8, 8, 16, 16, 8, 1), UNROLL=0, LPAD=0, DBUF=1, LAYOUT="NCHW", KSPLIT=1,
                      TAPSTEP=1, KTAIL=0),
    # PoCL runs a work-group's items in a loop between barriers: 2 work-items with 16 x 8
    # accumulators each measured best (docs/variants/conv_igemm.md)
    "cpu": _fallbacks((1, 2, 16, 16, 8, 1), (2, 2, 16, 32, 8, 4), (2, 2, 16, 16, 8, 1),
                      UNROLL=1, LPAD=0, DBUF=0, LAYOUT="NCHW", KSPLIT=1, TAPSTEP=1, KTAIL=0),
}


def _with_tapstep_off(points):
    """Each fallback point with one tap per step where the layer allows it, else without."""
    return [q for p in points for q in (p, dict(p, TAPSTEP=0))]


class ConvIgemm(Variant):
    name = "conv_igemm"
    ops = ("conv",)
    template = "kernels/conv_igemm.cl.mako"
    half_storage = True

    scratch = True              # split-K partial tiles

    constraints = (
        Constraint("split_k_fills_idle_units", "hardware",
                   "split-K only where the output tiles leave compute units idle, into at most "
                   "as many slices as bring the work-groups to 4 per compute unit",
                   _split_fills_device),
        Constraint("tap_per_step_needs_whole_channel_steps", "algorithm",
                   "one filter tap per KBLK step needs C/G % KBLK == 0, a filter of more than "
                   "one tap and a layout read along the pixels (NCHW, CHWN)",
                   _one_tap_per_step),
        Constraint("split_k_slices_nonempty", "algorithm",
                   "every K slice gets at least one KBLK step",
                   lambda l, c, t: c["KSPLIT"] == 1 or
                   (c["KSPLIT"] - 1) * _kt_per_split(l, c) < _ktiles(l, c)),
        Constraint("split_k_partials_fit", "software",
                   "split-K partial tiles above 64 MiB of scratch",
                   lambda l, c, t: 4 * _partial_floats(l, c) <= _MAX_PARTIAL_BYTES),
        whole_vectors("m", "MBLK", "MDIM", "VW"),
        whole_vectors("n", "NBLK", "NDIM", "VW"),
        Constraint("a_load_covers_tile", "algorithm",
                   "the work-group loads the KBLK x MBLK weight tile in whole VW-wide vectors, "
                   "the same number per work-item, so the load needs no bounds check",
                   lambda l, c, t: (c["KBLK"] * c["MBLK"]) % (_wg(c) * c["VW"]) == 0),
        Constraint("b_load_covers_tile", "algorithm",
                   "each work-item loads fixed columns (rows for NHWC) of the KBLK x NBLK input "
                   "tile, the same count each: the work-group size and the tile must divide",
                   lambda l, c, t: _b_covers(c)),
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above K/G (floor 16) computes only "
                   "padding; smaller layers use a partial tile with guarded stores",
                   lambda l, c, t: c["MBLK"] <= max(16, pow2_at_least(_gemm_dims(l)[0]))),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above N*P*Q (floor 16) computes only "
                   "padding",
                   lambda l, c, t: c["NBLK"] <= max(16, pow2_at_least(_gemm_dims(l)[1]))),
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above C/G*R*S (floor 8) multiplies "
                   "zeros",
                   lambda l, c, t: c["KBLK"] <= max(8, pow2_at_least(_gemm_dims(l)[2]))),
        Constraint("lpad_only_when_strided", "software",
                   "local padding only helps the NHWC load, whose work-items store down a "
                   "column of the B tile; elsewhere it duplicates a point",
                   lambda l, c, t: c["LPAD"] == 0 or c["LAYOUT"] == "NHWC"),
        Constraint("accumulators_fit", "software",
                   "more than 128 accumulators per work-item spill on every compiler we target",
                   lambda l, c, t: (c["MBLK"] // c["MDIM"]) * (c["NBLK"] // c["NDIM"]) <= 128),
        whole_simd_groups(_wg),
        enough_work_groups(lambda l, c: _work_groups(l, c) * c["KSPLIT"]),
    )

    # -- domain: any kernel, stride, pad, dilation and groups (all in the loads) ---------------
    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], cfg["LAYOUT"]

    # -- space ---------------------------------------------------------------------------------
    def knobs(self, layer, target):
        dims = thread_dims(target)
        return [Knob("MDIM", dims, "work-items along M (output channels)"),
                Knob("NDIM", dims, "work-items along N (output pixels)"),
                Knob("MBLK", (64, 128, 32, 16, 96), "tile in M per work-group (96: fewer "
                                                     "partial waves of work-groups)"),
                Knob("NBLK", (64, 128, 32, 16, 96), "tile in N per work-group"),
                Knob("KBLK", (16, 8, 32), "reduction step held in local memory"),
                Knob("VW", (4, 2, 1), "vector width: weight loads and local-memory reads"),
                Knob("UNROLL", (0, 1), "unroll of the KBLK inner loop (0 = fully)"),
                Knob("LPAD", (0, 1), "floats of padding per local B row (bank conflicts)"),
                Knob("DBUF", (1, 0), "double buffering: prefetch the next tile into registers "
                                     "while multiplying the current one, one barrier per step"),
                Knob("LAYOUT", LAYOUTS, "layout of the input read and the output written"),
                Knob("KSPLIT", (1, 2, 3, 4, 8, 16), "reduction slices (split-K); the last slice "
                                                    "to finish a tile sums the partials"),
                Knob("TAPSTEP", (1, 0), "one filter tap per KBLK step, reduction order (r, s, c): "
                                        "no division per row, one bounds check per column"),
                Knob("KTAIL", tail_waves(target), "split-K only for the tiles past the last "
                     "whole wave of this many work-groups (0: every tile)")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _with_tapstep_off(_FALLBACKS[_kind(target)]),
                           lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: NBUF weight tiles [KBLK][MBLK] and input tiles
        [KBLK][NBLK + LPAD] as float4 arrays (Abuf4: NBUF * A_SIZE / 4, Bbuf4 rounded up to whole
        float4s) and, with split-K, the int counting the slices arrived at the tile (ptxas
        counts all of it against the 48 KiB of static shared memory)."""
        c = cfg
        nbuf = 2 if c["DBUF"] else 1
        a4 = nbuf * c["KBLK"] * c["MBLK"] // 4
        b4 = ceil_div(nbuf * c["KBLK"] * (c["NBLK"] + c["LPAD"]), 4)
        return 16 * (a4 + b4) + (4 if c["KSPLIT"] > 1 else 0)

    def registers(self, layer, cfg):
        """Accumulators, one k-slice of operands, the prefetched tile, column indices, ~20."""
        c = cfg
        mthd, nthd = c["MBLK"] // c["MDIM"], c["NBLK"] // c["NDIM"]
        _, cols, _, rows, _ = _b_plan(c)
        regs = mthd * nthd + mthd + nthd + 3 * cols + 20
        if c["DBUF"]:
            regs += c["KBLK"] * c["MBLK"] // _wg(c) + cols * rows
        return regs

    # -- code ----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        c = cfg
        m, npq, crs = _gemm_dims(layer)
        along, cols, colstep, rows, rowstep = _b_plan(c)
        lay = c["LAYOUT"]
        d.update(
            MTHD=c["MBLK"] // c["MDIM"], NTHD=c["NBLK"] // c["NDIM"], WG=_wg(c),
            NPQ=npq, CRS=crs, CRSP=round_up(crs, c["KBLK"]), KGP=round_up(m, c["MBLK"]),
            MTILES=ceil_div(m, c["MBLK"]), NTILES=ceil_div(npq, c["NBLK"]),
            KT_PER=_kt_per_split(layer, c),
            FULL=_tail(layer, c)[0] if c["KSPLIT"] > 1 else 0, SPLIT_TILES=_tail(layer, c)[1],
            LDA=c["MBLK"], LDB=c["NBLK"] + c["LPAD"],
            AVEC=c["MBLK"] // c["VW"], A_ITERS=c["KBLK"] * c["MBLK"] // (_wg(c) * c["VW"]),
            B_ALONG=along, BCOLS=cols, B_COLSTEP=colstep, BROWS=rows, B_ROWSTEP=rowstep,
            RED_CMAJOR=lay != "NHWC" and not c["TAPSTEP"], BATCH_FAST=lay == "CHWN",
            HCHK=needs_bounds(d["H"], d["P"], d["SH"], d["PT"], d["R"], d["DH"]),
            WCHK=needs_bounds(d["W"], d["Q"], d["SW"], d["PL"], d["S"], d["DW"]),
            KCHK=crs % c["KBLK"] != 0, NCHK=npq % c["NBLK"] != 0, MCHK=m % c["MBLK"] != 0,
            XS=layout_strides(lay, d["BATCH"], d["C"], d["H"], d["W"]),
            YS=layout_strides(lay, d["BATCH"], d["K"], d["P"], d["Q"]),
            has_bias=bool(layer.attrs["bias"]))
        # vector stores: a work-item's VW consecutive pixels are consecutive, VW-aligned output
        # floats when N is the contiguous output dimension and no vector straddles two images
        d["VSTORE"] = c["VW"] > 1 and (lay == "CHWN" and npq % c["VW"] == 0
                                       or lay == "NCHW" and (d["P"] * d["Q"]) % c["VW"] == 0)
        return d

    def buffers(self, layer, cfg):
        m, _, crs = _gemm_dims(layer)
        out = {"wpack": layer.attrs["groups"] * round_up(crs, cfg["KBLK"])
               * round_up(m, cfg["MBLK"])}
        if cfg["KSPLIT"] > 1:
            out["ksem"] = _tail(layer, cfg)[1]              # one arrival counter per split tile
        return out

    def scratch_floats(self, layer, cfg):
        return _partial_floats(layer, cfg)

    def launches(self, layer, cfg, prefix):
        m, npq, crs = _gemm_dims(layer)
        g = layer.attrs["groups"]
        packed = g * round_up(crs, cfg["KBLK"]) * round_up(m, cfg["MBLK"])
        gsize = (ceil_div(npq, cfg["NBLK"]) * cfg["NDIM"],
                 ceil_div(m, cfg["MBLK"]) * g * cfg["MDIM"])
        lsize = (cfg["NDIM"], cfg["MDIM"])
        run_args = with_residual(layer, _RUN_ARGS[bool(layer.attrs["bias"])])
        out = [Launch(f"{prefix}_pack", _PACK_ARGS, (round_up(packed, 64),), (64,), phase="setup")]
        if cfg["KSPLIT"] == 1:
            return out + [Launch(prefix, run_args, gsize, lsize)]
        full, split = _tail(layer, cfg)
        groups = full + split * cfg["KSPLIT"]           # one row: whole tiles, then slices
        return out + [Launch(f"{prefix}_zero", (Buffer("ksem"),), (round_up(split, 64),), (64,),
                             phase="setup"),
                      Launch(prefix, run_args + (Scratch(), Buffer("ksem")),
                             (groups * cfg["NDIM"], cfg["MDIM"]), lsize)]


_PACK_ARGS = (Param("weight"), Buffer("wpack"))
_RUN_ARGS = {False: (In(0), Buffer("wpack"), Out()),
             True: (In(0), Buffer("wpack"), Param("bias"), Out())}

"""conv_dw_nhwc: depthwise convolution (groups == channels, multiplier 1) in NHWC or CHWN.

conv_depthwise's sibling for the chains of layers the layout plan keeps channels-last (NHWC)
or batch-last (CHWN): reading and writing those layouts itself, a depthwise layer there costs
no conversion on either side. Both layouts store a pixel's values along one contiguous axis,
the channels (NHWC) or the images (CHWN); call it the vector axis, of extent VA. The element
(n, c, h, w) of either sits at ((o * H + h) * W + w) * VA + v, where (o, v) is (n, c) in NHWC
and (c, n) in CHWN, so one kernel text serves both.

One work-item computes VW consecutive values along the vector axis (VW channels of one image,
or VW images of one channel) for QT consecutive output columns of one output row: every load
and store is a VW-wide vector (float4, float2). Per filter row it loads the SPAN input pixels
its QT windows cover once, as vectors, then emits the KH x KW x QT vector multiply-adds as
straight-line code (the filter-row loop stays a loop above MAX_UNROLLED_FMAS). Guards only
where the layer's padding or edges reach (decided at generation time, as conv_depthwise
does); a vector axis that is not whole vectors (VA % VW) makes the last block's work-items
load and store their valid lanes one by one.

Weights and bias are re-laid out once, in set_params (the `_pack` setup launch), as float
[KH*KW][CP] taps then [CP] bias, CP = C rounded up to whole vectors and zero-padded: in NHWC
a tap's VW channel weights are one aligned vector load; in CHWN a work-item's channel is one
weight per tap, the same for every work-item of its work-group.

Work-groups are 3-D tiles (TV, TX, TY): TV work-items along the vector axis (consecutive
vectors: coalesced), TX along the output row, TY output rows of one `o`. The launch is (vector
blocks, column blocks, o x rows), each rounded up to whole tiles.

Domain: groups == C with K == C (multiplier 1: output channel c reads input channel c; a
multiplier M > 1 would gather M output lanes from one input lane, conv_depthwise's domain),
any kernel size, stride, asymmetric pad, dilation, batch; bias and every fused activation in
the epilogue; half storage (--precision fp16). No fused residual add (conv_depthwise takes none
either). NCHW is not in its space: conv_depthwise serves that, and stays every depthwise
layer's fallback.
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, bias_arg,
                   ceil_div, pow2_at_least, round_up)
from .conv_common import (conv_sizes, enough_work_groups, not_oversized, row_reads, row_span,
                          whole_simd_groups)
from .limits import first_valid
from .residual import residual_reason

LAYOUTS = ("NHWC", "CHWN")
# Straight-line code budget, in vector multiply-adds per work-item: above it the filter-row
# loop stays a loop and only the taps of one row are emitted.
MAX_UNROLLED_FMAS = 1024
# The smallest work-group that fills a SIMD group on every GPU: the vector axis may pad a
# work-group up to it where the output plane is too small to.
SIMD_FILL = 64


def axes(layer, layout):
    """(VA, OA): extents of the vector axis (contiguous) and of the outer axis of `layout`."""
    n, c = layer.in_shape[:2]
    return (c, n) if layout == "NHWC" else (n, c)


def _geometry(layer, cfg):
    """(vector blocks VB, column blocks QB, rows padded PPAD, launch extents x, y, z)."""
    va, oa = axes(layer, cfg["LAYOUT"])
    _, _, p, q = layer.out_shape
    vb, qb, ppad = ceil_div(va, cfg["VW"]), ceil_div(q, cfg["QT"]), round_up(p, cfg["TY"])
    return vb, qb, ppad, round_up(vb, cfg["TV"]), round_up(qb, cfg["TX"]), oa * ppad


def _wg(cfg):
    return cfg["TV"] * cfg["TX"] * cfg["TY"]


def _work_groups(layer, cfg):
    _, _, _, x, y, z = _geometry(layer, cfg)
    return (x // cfg["TV"]) * (y // cfg["TX"]) * (z // cfg["TY"])


def _cp(layer, cfg):
    """Channels of the packed weights: C rounded up to whole vectors in NHWC (a tap's vector
    load never needs a guard), C in CHWN (one weight per work-item)."""
    c = layer.in_shape[1]
    return round_up(c, cfg["VW"]) if cfg["LAYOUT"] == "NHWC" else c


def _packed(layer, cfg):
    """Floats of the packed weights: KH*KW taps of CP, then CP of bias (if any)."""
    kh, kw = layer.attrs["kernel"]
    return (kh * kw + (1 if layer.attrs["bias"] else 0)) * _cp(layer, cfg)


def _vw_fits(l, c, t):
    return c["VW"] <= pow2_at_least(axes(l, c["LAYOUT"])[0])


def _tile_fits_output(l, c, t):
    vb, qb, _, _, _, _ = _geometry(l, c)
    p = l.out_shape[2]
    return (c["TX"] <= pow2_at_least(qb) and c["TY"] <= pow2_at_least(p)
            and c["TV"] <= max(pow2_at_least(vb), SIMD_FILL // (c["TX"] * c["TY"])))


def _fallbacks(layer):
    """NHWC, 64 work-items (valid on every target); VW the widest that divides the channels
    (aligned vectors, no tail), then the others; QT = 4, then 2, then 1 (the first
    qt_not_oversized allows); the tile first along the channels (coalesced), then the row,
    then rows, the channels padding it to 64 where the layer is too small."""
    c = layer.in_shape[1]
    _, _, p, q = layer.out_shape
    out = []
    for vw in sorted((4, 2, 1), key=lambda v: (c % v != 0, -v)):
        vb = ceil_div(c, vw)
        for qt in (4, 2, 1):
            tv = min(pow2_at_least(vb), 16)
            tx = min(pow2_at_least(ceil_div(q, qt)), SIMD_FILL // tv, 8)
            ty = min(pow2_at_least(p), SIMD_FILL // (tv * tx), 8)
            tv = SIMD_FILL // (tx * ty)
            out.append(dict(LAYOUT="NHWC", VW=vw, QT=qt, TV=tv, TX=tx, TY=ty))
    return out


class ConvDwNhwc(Variant):
    name = "conv_dw_nhwc"
    ops = ("conv",)
    template = "kernels/conv_dw_nhwc.cl.mako"
    half_storage = True

    constraints = (
        not_oversized("qt_not_oversized",
                      "outputs per work-item beyond the next power of two above the output "
                      "width only compute padding",
                      lambda c: c["QT"], lambda l: l.out_shape[3]),
        Constraint("vw_not_oversized", "software",
                   "a vector wider than the vector axis (channels in NHWC, images in CHWN), to "
                   "the next power of two, only computes padding lanes",
                   _vw_fits),
        Constraint("tile_not_oversized", "software",
                   "a work-group tile wider (TX vs the column blocks), taller (TY vs the rows) "
                   "or deeper (TV vs the vector blocks) than the output, to the next power of "
                   "two, only adds idle work-items; the vector axis may pad a work-group up to "
                   "64, the smallest that fills a SIMD group on every GPU",
                   _tile_fits_output),
        whole_simd_groups(_wg),
        # a layer too small to fill the device with any tile is exempt
        enough_work_groups(_work_groups, SIMD_FILL * 4, "the layer is large enough to give them"),
    )

    def supports(self, layer):
        why = super().supports(layer)
        if why is not None:
            return why
        c, k, g = layer.in_shape[1], layer.out_shape[1], layer.attrs["groups"]
        if g != c:
            return (f"{self.name} needs groups == input channels (depthwise), not groups {g} "
                    f"of {c} channels")
        if k != c:
            return (f"{self.name} needs channel multiplier 1 (out == {c} channels), not "
                    f"{k // c}: each output lane reads its own input lane; conv_depthwise "
                    f"takes multipliers above 1")
        # any kernel, stride, pad, dilation, batch; no residual input
        return residual_reason(self, layer)

    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], cfg["LAYOUT"]

    def knobs(self, layer, target):
        return [Knob("LAYOUT", LAYOUTS, "layout of the input read and the output written"),
                Knob("VW", (4, 2, 1), "vector width along the contiguous axis (channels in "
                                      "NHWC, images in CHWN): loads, multiply-adds, stores"),
                Knob("QT", (1, 2, 4, 8), "output columns per work-item along the row"),
                Knob("TV", (1, 2, 4, 8, 16, 32, 64), "work-items per work-group along the "
                                                     "contiguous axis"),
                Knob("TX", (1, 2, 4, 8, 16, 32), "work-items per work-group along the row"),
                Knob("TY", (1, 2, 4, 8, 16), "output rows per work-group")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _fallbacks(layer),
                           lambda c: _work_groups(layer, c))

    def registers(self, layer, cfg):
        """VW lanes of: QT accumulators, one filter row's SPAN input pixels and the current
        weight; about 20 for indices and pointers."""
        return cfg["VW"] * (cfg["QT"] + row_span(layer, cfg["QT"]) + 1) + 20

    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        vb, qb, ppad, x, y, z = _geometry(layer, cfg)
        va, oa = axes(layer, cfg["LAYOUT"])
        qt = cfg["QT"]
        d.update(row_reads(layer, d, qt, 1, qb))
        d.update(VA=va, OA=oa, VB=vb, QB=qb, PPAD=ppad, CP=_cp(layer, cfg),
                 PACKED=_packed(layer, cfg), VTAIL=va % cfg["VW"],
                 UNROLL_R=d["R"] * d["S"] * qt <= MAX_UNROLLED_FMAS,
                 VCHK=x != vb, XCHK=y != qb, YCHK=ppad != d["P"], QCHK=d["Q"] % qt != 0,
                 has_bias=bool(layer.attrs["bias"]))
        return d

    def buffers(self, layer, cfg):
        return {"wpack": _packed(layer, cfg)}

    def launches(self, layer, cfg, prefix):
        _, _, _, x, y, z = _geometry(layer, cfg)
        pack = (Param("weight"),) + bias_arg(layer) + (Buffer("wpack"),)
        return [Launch(f"{prefix}_pack", pack, (round_up(_packed(layer, cfg), 64),), (64,),
                       phase="setup"),
                Launch(prefix, (In(0), Buffer("wpack"), Out()), (x, y, z),
                       (cfg["TV"], cfg["TX"], cfg["TY"]))]

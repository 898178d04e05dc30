"""conv_depthwise: depthwise convolution (groups == input channels), NCHW in and out.

Output channel k reads one input channel, k / M (M = K / C, the channel multiplier, usually
1), through its own KH x KW filter: no reduction over channels, so the layer is memory-bound
(MobileNet's 3x3 layers do 9 multiply-adds per output) and what matters is reading each input
value from memory once, not from every window that covers it.

One work-item computes QT consecutive outputs of one output row of one channel. Per filter row
it reads the SPAN input values its QT windows cover once, into registers, then emits the
KH x KW x QT multiply-adds as straight-line code with every index a constant (the filter-row
loop stays a loop above MAX_UNROLLED_FMAS); the KH x KW weights of its channel are uniform
across the work-items of that channel. Work-groups are 3-D tiles: TX work-items along the row
(TX * QT outputs), TY output rows, CB channels of one image (the launch's third dimension is
image x channel, channels padded to whole blocks of CB).

LMEM=1 stages the work-group's input halo, CB x TIH x TIW values (padding zero-filled), in local
memory once, then computes from it without a single bounds check. LMEM=0 reads global memory
directly (neighbouring windows meet in the cache) and guards only the loads the layer's
padding or edges can reach, decided at generation time. VW-wide vector loads serve runs of
unguarded columns, and VW-wide stores the QT outputs when the row is whole blocks.

Domain: any kernel size, stride, asymmetric pad, dilation, channel multiplier, batch; bias and
the fused activation in the epilogue. FLOPs and the bytes moved are ops.flops / bytes_moved
(2 x KH x KW per output; every input, weight and output once).
"""
from .base import Variant, Knob, Constraint, Launch, ceil_div, pow2_at_least, round_up
from .conv_common import (conv_sizes, enough_work_groups, row_block_constraints, row_reads,
                          row_span, whole_simd_groups)
from .flat import conv_args
from .limits import first_valid
from .residual import residual_reason

# Straight-line code budget: above this many multiply-adds per work-item the filter-row loop
# stays a loop and only the taps of one row are emitted.
MAX_UNROLLED_FMAS = 1024
# The smallest work-group that fills a SIMD group on every GPU: channel blocks may pad a
# work-group up to it where the output plane is too small to.
SIMD_FILL = 64


def _geometry(layer, cfg):
    """(column blocks QB, launch extent along x, along y, along z, channels padded KPAD)."""
    n, k, p, q = layer.out_shape
    qb = ceil_div(q, cfg["QT"])
    kpad = round_up(k, cfg["CB"])
    return qb, round_up(qb, cfg["TX"]), round_up(p, cfg["TY"]), n * kpad, kpad


def _wg(cfg):
    return cfg["TX"] * cfg["TY"] * cfg["CB"]


def _tile(layer, cfg):
    """(rows, columns) of a work-group's input halo: what LMEM=1 stages per channel."""
    a = layer.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
    return ((cfg["TY"] - 1) * sh + (kh - 1) * dh + 1,
            (cfg["TX"] * cfg["QT"] - 1) * sw + (kw - 1) * dw + 1)


def _work_groups(layer, cfg):
    _, x, y, z, _ = _geometry(layer, cfg)
    return (x // cfg["TX"]) * (y // cfg["TY"]) * (z // cfg["CB"])


def _tile_fits_output(l, c, t):
    n, k, p, q = l.out_shape
    return (c["TX"] <= pow2_at_least(ceil_div(q, c["QT"])) and c["TY"] <= pow2_at_least(p)
            and c["CB"] <= max(pow2_at_least(k), SIMD_FILL // (c["TX"] * c["TY"])))


def _lmem_reuses(l, c, t):
    if not c["LMEM"]:
        return True
    th, tw = _tile(l, c)
    kh, kw = l.attrs["kernel"]
    return c["TY"] * c["TX"] * c["QT"] * kh * kw > th * tw


def _fallbacks(layer):
    """Work-groups of 64 (valid on every target), QT = 4 then 2 then 1 outputs per work-item;
    the tile covers the row (up to 8 work-items), then rows, then channels."""
    n, k, p, q = layer.out_shape
    out = []
    for qt in (4, 2, 1):
        tx = min(pow2_at_least(ceil_div(q, qt)), 8)
        ty = min(pow2_at_least(p), SIMD_FILL // tx, 16)
        out.append(dict(QT=qt, TX=tx, TY=ty, CB=SIMD_FILL // (tx * ty), VW=1, LMEM=0))
    return out


class ConvDepthwise(Variant):
    name = "conv_depthwise"
    ops = ("conv",)
    template = "kernels/conv_depthwise.cl.mako"
    half_storage = True

    constraints = row_block_constraints() + (
        Constraint("tile_not_oversized", "software",
                   "a work-group tile wider, taller or deeper than the output (to the next power "
                   "of two) only adds idle work-items; channels may pad a work-group up to 64, "
                   "the smallest that fills a SIMD group on every GPU",
                   _tile_fits_output),
        Constraint("lmem_needs_reuse", "software",
                   "staging the halo in local memory pays only where the tile's windows read "
                   "each staged value more than once on average (not 1x1, not stride >= kernel)",
                   _lmem_reuses),
        whole_simd_groups(_wg),
        # a layer too small to fill the device with any tile is exempt
        enough_work_groups(_work_groups, SIMD_FILL * 4, "the layer is large enough to give them"),
    )

    def supports(self, layer):
        why = super().supports(layer)
        c = layer.in_shape[1]
        if why is None and layer.attrs["groups"] != c:
            why = (f"{self.name} needs groups == input channels (depthwise), not groups "
                   f"{layer.attrs['groups']} of {c} channels")
        # any kernel, stride, pad, dilation, channel multiplier; no residual input
        return why or residual_reason(self, layer)

    def knobs(self, layer, target):
        return [Knob("QT", (1, 2, 4, 8), "outputs per work-item along the output row"),
                Knob("TX", (1, 2, 4, 8, 16, 32, 64), "work-items per work-group along the row"),
                Knob("TY", (1, 2, 4, 8, 16), "output rows per work-group"),
                Knob("CB", (1, 2, 4, 8, 16, 32, 64), "channels per work-group"),
                Knob("VW", (1, 2, 4), "vector width of unguarded input loads and of stores"),
                Knob("LMEM", (0, 1), "stage the work-group's input halo in local memory")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _fallbacks(layer),
                           lambda c: _work_groups(layer, c))

    def registers(self, layer, cfg):
        """QT accumulators, one filter row's input segment, about 20 for indices, pointers and
        the current weight."""
        return cfg["QT"] + row_span(layer, cfg["QT"]) + 20

    def local_mem_bytes(self, layer, cfg):
        th, tw = _tile(layer, cfg)
        return 4 * cfg["CB"] * th * tw if cfg["LMEM"] else 0

    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        qb, x, y, z, kpad = _geometry(layer, cfg)
        qt = cfg["QT"]
        # the staged halo (LMEM=1) is zero-filled: nothing to guard
        d.update(row_reads(layer, d, qt, cfg["VW"], qb, guarded=not cfg["LMEM"]))
        th, tw = _tile(layer, cfg)
        d.update(M=d["K"] // d["C"], QB=qb, KPAD=kpad, WG=_wg(cfg), TIH=th, TIW=tw,
                 UNROLL_R=d["R"] * d["S"] * qt <= MAX_UNROLLED_FMAS,
                 XCHK=x != qb, YCHK=y != d["P"], KCHK=kpad != d["K"], QCHK=d["Q"] % qt != 0,
                 has_bias=bool(layer.attrs["bias"]))
        return d

    def launches(self, layer, cfg, prefix):
        _, x, y, z, _ = _geometry(layer, cfg)
        return [Launch(prefix, conv_args(layer), (x, y, z), (cfg["TX"], cfg["TY"], cfg["CB"]))]

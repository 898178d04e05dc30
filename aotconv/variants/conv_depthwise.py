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
from .base import Variant, Knob, Constraint, Launch, In, Out, Param, ceil_div, round_up
from .residual import residual_reason
from .conv_igemm import conv_sizes, first_valid, pow2_at_least, simd_groups_ok

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


def _span(layer, cfg):
    """Input columns one work-item's QT windows cover in one filter row."""
    a = layer.attrs
    return (cfg["QT"] - 1) * a["stride"][1] + (a["kernel"][1] - 1) * a["dilation"][1] + 1


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


def _enough_work_groups(l, c, t):
    want = t.min_wg_per_cu * t.compute_units
    n, k, p, q = l.out_shape
    if n * k * p * q < want * SIMD_FILL * 4:
        return True                     # too small to fill the device with any tile
    return _work_groups(l, c) >= want


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

    constraints = (
        Constraint("vw_divides_qt", "algorithm",
                   "a work-item's QT outputs are stored as whole VW-wide vectors",
                   lambda l, c, t: c["QT"] % c["VW"] == 0),
        Constraint("qt_not_oversized", "software",
                   "outputs per work-item beyond the next power of two above the output width "
                   "only compute padding",
                   lambda l, c, t: c["QT"] <= pow2_at_least(l.out_shape[3])),
        Constraint("tile_not_oversized", "software",
                   "a work-group tile wider, taller or deeper than the output (to the next power "
                   "of two) only adds idle work-items; channels may pad a work-group up to 64, "
                   "the smallest that fills a SIMD group on every GPU",
                   _tile_fits_output),
        Constraint("lmem_needs_reuse", "software",
                   "staging the halo in local memory pays only where the tile's windows read "
                   "each staged value more than once on average (not 1x1, not stride >= kernel)",
                   _lmem_reuses),
        Constraint("whole_simd_groups", "hardware",
                   "on a GPU, a work-group that is not a whole number of SIMD groups leaves lanes "
                   "idle",
                   lambda l, c, t: simd_groups_ok(_wg(c), t)),
        Constraint("enough_work_groups", "hardware",
                   "BEAST's occupancy rule: at least min_wg_per_cu work-groups per compute unit "
                   "when the layer is large enough to give them",
                   _enough_work_groups),
    )

    def supports(self, layer):
        if layer.op != "conv":
            return f"{self.name} implements conv, not {layer.op}"
        c = layer.in_shape[1]
        if layer.attrs["groups"] != c:
            return (f"{self.name} needs groups == input channels (depthwise), not groups "
                    f"{layer.attrs['groups']} of {c} channels")
        # any kernel, stride, pad, dilation, channel multiplier; no residual input
        return residual_reason(self, layer)

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
        return cfg["QT"] + _span(layer, cfg) + 20

    def local_mem_bytes(self, layer, cfg):
        th, tw = _tile(layer, cfg)
        return 4 * cfg["CB"] * th * tw if cfg["LMEM"] else 0

    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        qb, x, y, z, kpad = _geometry(layer, cfg)
        qt, sw, dw = cfg["QT"], d["SW"], d["DW"]
        span = _span(layer, cfg)
        used = sorted({qq * sw + j * dw for qq in range(qt) for j in range(d["S"])})
        if cfg["LMEM"]:                 # the staged halo is zero-filled: nothing to guard
            guard_col = {i: False for i in used}
            guard_row = [False] * d["R"]
        else:
            # a column or row needs a guard only if some work-item's window puts it in the
            # padding or past the edge
            last_q0 = (qb - 1) * qt * sw - d["PL"]
            guard_col = {i: (i - d["PL"] < 0) or (last_q0 + i > d["W"] - 1) for i in used}
            guard_row = [(r * d["DH"] - d["PT"] < 0)
                         or ((d["P"] - 1) * d["SH"] - d["PT"] + r * d["DH"] > d["H"] - 1)
                         for r in range(d["R"])]
        # runs of VW consecutive unguarded columns become one vector load
        vec_at, i = {}, 0
        cols = set(used)
        while i < span:
            run = range(i, i + cfg["VW"])
            if cfg["VW"] > 1 and all(j in cols and not guard_col[j] for j in run):
                vec_at[i] = True
                i += cfg["VW"]
            else:
                i += 1
        th, tw = _tile(layer, cfg)
        d.update(M=d["K"] // d["C"], QB=qb, KPAD=kpad, WG=_wg(cfg), SPAN=span, USED=used,
                 GUARD_COL=guard_col, GUARD_ROW=guard_row, VEC_AT=vec_at, TIH=th, TIW=tw,
                 UNROLL_R=d["R"] * d["S"] * qt <= MAX_UNROLLED_FMAS,
                 XCHK=x != qb, YCHK=y != d["P"], KCHK=kpad != d["K"], QCHK=d["Q"] % qt != 0,
                 has_bias=bool(layer.attrs["bias"]))
        return d

    def launches(self, layer, cfg, prefix):
        _, x, y, z, _ = _geometry(layer, cfg)
        args = (In(0), Param("weight")) + ((Param("bias"),) if layer.attrs["bias"] else ()) \
            + (Out(),)
        return [Launch(prefix, args, (x, y, z), (cfg["TX"], cfg["TY"], cfg["CB"]))]

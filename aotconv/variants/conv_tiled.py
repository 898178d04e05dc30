"""conv_tiled: register-tiled direct convolution without local memory (Boda's tconv).

One work-item computes KT output channels x QT consecutive output pixels of one output row in
registers. Per input channel it reads, for each filter row, the one input-row segment its QT
windows cover, and multiplies it with the KT filters' taps: the taps and the KT x QT block of
multiply-adds are emitted by Mako as straight-line code with every index a constant (the
filter-row loop too while the block stays small), and only the segment loads that can fall
into the padding or past the edge of the image carry a guard (decided at generation time from
the layer's sizes). Weights are re-laid out once, in set_params, to [G][K/KT][C/G][R][S][KT]
zero-padded, so a tap's KT filter values are one aligned vector load, uniform across the
work-items of a filter block; WCONST puts them in __constant memory when they fit.

OUTL = NHWC writes the output channels-last: a work-item stores, per pixel, its KT consecutive
channels as one vector (32 bytes of halves at KT = 16), where the channels-last variants read
them; a pixel's channel blocks then run on consecutive work-items, which write its channels
together (whole sectors: written one block at a time, far apart, the partial sectors cost a
read of memory each, measured 7x slower on the H100). That serves a network's first convolution (three input channels: no channels-last
variant takes it, their loads are 8 channels wide) in front of channels-last layers, without a
conversion of its whole output in between; the input (and a fused residual) stays NCHW.

Domain: every convolution (any kernel, stride, asymmetric pad, dilation, groups); NCHW in, NCHW
or NHWC out.
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, bias_arg, ceil_div,
                   pow2_at_least, round_up)
from .conv_common import (conv_sizes, enough_work_groups, not_oversized, row_block_constraints,
                          row_reads, row_span, whole_simd_groups)
from .limits import first_valid
from .residual import with_residual

# Straight-line code budget: above this many multiply-adds per input channel the filter-row
# loop stays a (non-unrolled) loop and only the taps of one row are emitted.
MAX_UNROLLED_FMAS = 1024
# OpenCL guarantees 64 KiB of __constant memory on every full-profile device.
CONSTANT_BYTES = 64 * 1024


def _blocks(layer, cfg):
    n, k, p, q = layer.out_shape
    g = layer.attrs["groups"]
    return ceil_div(k // g, cfg["KT"]), ceil_div(q, cfg["QT"])


def _items(layer, cfg):
    n, k, p, q = layer.out_shape
    kb, qb = _blocks(layer, cfg)
    return n * layer.attrs["groups"] * kb * p * qb


def _packed(layer, cfg):
    kb, _ = _blocks(layer, cfg)
    _, cg, r, s = layer.params[0][1]
    return layer.attrs["groups"] * kb * cg * r * s * cfg["KT"]


def _outl(cfg):
    """OUTL of a point; a point recorded before the knob existed wrote NCHW."""
    return cfg.get("OUTL", "NCHW")


def _work_groups(layer, cfg):
    return ceil_div(_items(layer, cfg), cfg["WG"])


_FALLBACKS = [dict(KT=kt, QT=qt, WG=wg, VW=1, WCONST=0, OUTL="NCHW")
              for kt, qt in ((4, 4), (2, 4), (4, 2), (1, 4), (2, 2), (4, 1), (1, 2), (2, 1), (1, 1))
              for wg in (64, 32, 128, 256)]


class ConvTiled(Variant):
    name = "conv_tiled"
    ops = ("conv",)
    template = "kernels/conv_tiled.cl.mako"
    half_storage = True
    added_knobs = (("OUTL", "NCHW"),)   # a record made before OUTL wrote NCHW

    constraints = row_block_constraints() + (
        not_oversized("kt_not_oversized",
                      "a channel block beyond the next power of two above K/G computes padding",
                      lambda c: c["KT"], lambda l: l.out_shape[1] // l.attrs["groups"]),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch (or one SIMD group) only adds "
                   "idle work-items",
                   lambda l, c, t: c["WG"] <= max(32, min(t.simd_width, 64),
                                                  pow2_at_least(_items(l, c)))),
        Constraint("constant_reads_uniform", "hardware",
                   "with OUTL = NHWC the channel blocks of a pixel run on consecutive "
                   "work-items, so a SIMD group reads K/KT different weight vectors at once: "
                   "__constant memory serves one address at a time (global memory's cache "
                   "serves them together)",
                   lambda l, c, t: not c["WCONST"] or _outl(c) == "NCHW"
                   or _blocks(l, c)[0] == 1),
        Constraint("weights_fit_constant", "hardware",
                   "__constant memory is only guaranteed 64 KiB; larger packed weights stay "
                   "global",
                   lambda l, c, t: not c["WCONST"] or 4 * _packed(l, c) <= CONSTANT_BYTES),
        whole_simd_groups(lambda c: c["WG"]),
        enough_work_groups(_work_groups),
    )

    # domain: every convolution (any kernel, stride, pad, dilation and groups)

    def layouts_of(self, layer, cfg):
        return "NCHW", _outl(cfg)

    def knobs(self, layer, target):
        return [Knob("KT", (4, 8, 2, 1, 16), "output channels per work-item (register block in "
                                             "K; with OUTL = NHWC one vector store per pixel)"),
                Knob("QT", (4, 8, 2, 1), "output pixels along a row per work-item (register "
                                         "block in Q)"),
                Knob("WG", (64, 128, 256, 32), "work-items per work-group"),
                Knob("VW", (1, 2, 4), "vector width of input-row loads and output stores"),
                Knob("WCONST", (0, 1), "packed weights in __constant memory"),
                Knob("OUTL", ("NCHW", "NHWC"), "layout of the output written (the input is "
                                               "read NCHW)")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _FALLBACKS, lambda c: _work_groups(layer, c))

    def registers(self, layer, cfg):
        """Accumulators, one filter row's input segment, one tap's KT weights, ~16 of state."""
        return cfg["KT"] * cfg["QT"] + row_span(layer, cfg["QT"]) + cfg["KT"] + 16

    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        kb, qb = _blocks(layer, cfg)
        qt = cfg["QT"]
        d.update(row_reads(layer, d, qt, cfg["VW"], qb))
        d.update(KB=kb, QB=qb, UNROLL_R=d["R"] * d["S"] * cfg["KT"] * qt <= MAX_UNROLLED_FMAS,
                 ITEMS=_items(layer, cfg), KCHK=(d["KG"] % cfg["KT"]) != 0,
                 QCHK=(d["Q"] % qt) != 0, has_bias=bool(layer.attrs["bias"]),
                 OUTL=_outl(cfg))
        return d

    def buffers(self, layer, cfg):
        return {"wpack": _packed(layer, cfg)}

    def launches(self, layer, cfg, prefix):
        args = with_residual(layer, (In(0), Buffer("wpack")) + bias_arg(layer) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(_packed(layer, cfg), 64),), (64,), phase="setup"),
                Launch(prefix, args, (round_up(_items(layer, cfg), cfg["WG"]),), (cfg["WG"],))]

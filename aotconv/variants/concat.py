"""Concatenation along channels.

MODE="fused": one launch over the output; each work-item picks its source by channel range.
MODE="split": one launch per input (kernels <prefix>_0, <prefix>_1, ...), each a plain copy
into its channel range: no branching, but one launch per input.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, round_up
from ..graph import count


class ConcatDirect(Variant):
    name = "concat_direct"
    ops = ("concat",)
    template = "kernels/concat.cl.mako"
    constraints = (
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["WG"] <= max(64, count(layer.out_shape))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("MODE", ("fused", "split"), "one launch for all inputs, or one per input"),
                Knob("WG", (64, 32, 128, 256), "work-items per work-group")]

    def template_params(self, layer, cfg):
        n, ct, h, w = layer.out_shape
        chans = [s[1] for s in layer.in_shapes]
        offs = [sum(chans[:i]) for i in range(len(chans))]
        return dict(N=n, CT=ct, HW=h * w, chans=chans, offs=offs)

    def launches(self, layer, cfg, prefix):
        wg = cfg["WG"]
        m = len(layer.in_shapes)
        if cfg["MODE"] == "fused":
            args = tuple(In(i) for i in range(m)) + (Out(),)
            return [Launch(prefix, args, (round_up(count(layer.out_shape), wg),), (wg,))]
        return [Launch(f"{prefix}_{i}", (In(i), Out()), (round_up(count(s), wg),), (wg,))
                for i, s in enumerate(layer.in_shapes)]

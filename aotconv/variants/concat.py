"""Concatenation along channels.

MODE="fused": one launch over the output; each work-item picks its source by channel range.
MODE="split": one launch per input (kernels <prefix>_0, <prefix>_1, ...), each a plain copy
into its channel range: no branching, but one launch per input.
"""
from .base import In, Knob, Out, Variant
from .flat import flat_constraints, flat_launch, wg_knob
from ..graph import count


class ConcatDirect(Variant):
    name = "concat_direct"
    ops = ("concat",)
    template = "kernels/concat.cl.mako"
    half_storage = True
    constraints = flat_constraints(lambda layer, cfg: count(layer.out_shape))

    def knobs(self, layer, target):
        return [Knob("MODE", ("fused", "split"), "one launch for all inputs, or one per input"),
                wg_knob()]

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
            return [flat_launch(prefix, args, count(layer.out_shape), wg)]
        return [flat_launch(f"{prefix}_{i}", (In(i), Out()), count(s), wg)
                for i, s in enumerate(layer.in_shapes)]

"""Elementwise sum of two or more equal-shape inputs, with the fused activation."""
from .base import Variant, Knob, Constraint, Launch, In, Out, ceil_div, round_up
from ..graph import count


class AddDirect(Variant):
    name = "add_direct"
    ops = ("add",)
    template = "kernels/add.cl.mako"
    constraints = (
        Constraint("vec_not_wasteful", "software",
                   "a work-item block larger than the tensor only adds idle lanes",
                   lambda layer, cfg, t: cfg["VEC"] <= max(1, count(layer.out_shape))),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["WG"] <= max(64, ceil_div(count(layer.out_shape),
                                                                       cfg["VEC"]))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("WG", (64, 32, 128, 256), "work-items per work-group"),
                Knob("VEC", (1, 2, 4, 8), "elements per work-item")]

    def template_params(self, layer, cfg):
        return dict(N_ELEMS=count(layer.out_shape), M=len(layer.in_shapes))

    def launches(self, layer, cfg, prefix):
        items = ceil_div(count(layer.out_shape), cfg["VEC"])
        args = tuple(In(i) for i in range(len(layer.in_shapes))) + (Out(),)
        return [Launch(prefix, args, (round_up(items, cfg["WG"]),), (cfg["WG"],))]

"""Standalone activation layers (every op of graph.ACT_OPS) that could not be fused."""
from .base import Variant, Knob, Constraint, Launch, In, Out, ceil_div, round_up
from ..graph import ACT_OPS, count


class Eltwise(Variant):
    name = "eltwise"
    ops = ACT_OPS
    template = "kernels/eltwise.cl.mako"
    half_storage = True
    constraints = (
        Constraint("vec_not_wasteful", "software",
                   "a work-item block larger than the tensor only adds idle lanes",
                   lambda layer, cfg, t: cfg["VEC"] <= max(1, count(layer.out_shape))),
    )

    def knobs(self, layer, target):
        return [Knob("WG", (64, 128, 256, 32), "work-group size"),
                Knob("VEC", (1, 2, 4, 8), "elements per work-item")]

    def template_params(self, layer, cfg):
        return {"N_ELEMS": count(layer.out_shape)}

    def launches(self, layer, cfg, prefix):
        items = ceil_div(count(layer.out_shape), cfg["VEC"])
        return [Launch(prefix, (In(0), Out()), (round_up(items, cfg["WG"]),), (cfg["WG"],))]

"""Elementwise sum of two or more equal-shape inputs, with the fused activation."""
from .base import (Variant, In, Out, elementwise_constraints, flat_launch, vec_items, vec_knob,
                   wg_knob)
from ..graph import count


class AddDirect(Variant):
    name = "add_direct"
    ops = ("add",)
    template = "kernels/add.cl.mako"
    constraints = elementwise_constraints()

    def knobs(self, layer, target):
        return [wg_knob(), vec_knob()]

    def template_params(self, layer, cfg):
        return dict(N_ELEMS=count(layer.out_shape), M=len(layer.in_shapes))

    def launches(self, layer, cfg, prefix):
        args = tuple(In(i) for i in range(len(layer.in_shapes))) + (Out(),)
        return [flat_launch(prefix, args, vec_items(layer, cfg), cfg["WG"])]

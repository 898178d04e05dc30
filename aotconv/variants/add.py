"""Elementwise sum of two or more equal-shape inputs, with the fused activation."""
from .base import In, Out
from .flat import Flat, elementwise_constraints, vec_items, vec_knob, wg_knob
from ..graph import count


class AddDirect(Flat):
    name = "add_direct"
    ops = ("add",)
    template = "kernels/add.cl.mako"
    constraints = elementwise_constraints()
    items = staticmethod(vec_items)

    def knobs(self, layer, target):
        return [wg_knob(), vec_knob()]

    def template_params(self, layer, cfg):
        return dict(N_ELEMS=count(layer.out_shape), M=len(layer.in_shapes))

    def args(self, layer):
        return tuple(In(i) for i in range(len(layer.in_shapes))) + (Out(),)

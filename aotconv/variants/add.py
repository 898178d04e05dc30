"""Elementwise sum of two or more equal-shape inputs, with the fused activation."""
from .base import In, Out
from .flat import Elementwise
from ..graph import count


class AddDirect(Elementwise):
    name = "add_direct"
    ops = ("add",)
    template = "kernels/add.cl.mako"
    half_storage = True

    def template_params(self, layer, cfg):
        return dict(N_ELEMS=count(layer.out_shape), M=len(layer.in_shapes))

    def args(self, layer):
        return tuple(In(i) for i in range(len(layer.in_shapes))) + (Out(),)

"""Elementwise products: `scale` (x [N, C, H, W] times s [N, C, 1, 1], each channel plane by
its own factor: squeeze-and-excitation) and `mul` (two tensors of one shape).

One flat launch over the output; each work-item takes VEC consecutive elements of x and the
factor of each element's plane (scale) or the element of the second input (mul).
"""
from .base import In, Out
from .flat import Elementwise
from ..graph import count


class ScaleDirect(Elementwise):
    name = "scale_direct"
    ops = ("scale", "mul")
    template = "kernels/scale.cl.mako"
    half_storage = True

    def template_params(self, layer, cfg):
        n, c, h, w = layer.out_shape
        return dict(N_ELEMS=count(layer.out_shape), HW=h * w, per_plane=layer.op == "scale")

    def args(self, layer):
        return (In(0), In(1), Out())

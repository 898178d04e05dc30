"""Direct fully-connected layer: y[n, o] = act(sum_i x[n, i] * w[o, i] + b[o]).

RED="item": one work-item per output, a sequential dot product of length IN.
RED="group": one work-group per output; its WG work-items stride over IN and combine their
partial sums with a tree in local memory (better when IN is large and N*OUT small).
"""
from .base import (Variant, conv_args, reduction_constraints, reduction_knobs, reduction_launch,
                   reduction_local_mem)
from ..graph import count


def _items(layer):
    return layer.out_shape[0] * layer.out_shape[1]


class DenseDirect(Variant):
    name = "dense_direct"
    ops = ("dense",)
    template = "kernels/dense_direct.cl.mako"
    constraints = reduction_constraints(
        lambda layer: _items(layer), lambda layer: count(layer.in_shape[1:]), "row",
        "in a group reduction, work-items beyond the input length only add zeros")

    def knobs(self, layer, target):
        return reduction_knobs("output")

    def local_mem_bytes(self, layer, cfg):
        return reduction_local_mem(cfg)

    def template_params(self, layer, cfg):
        n, out = layer.out_shape[:2]
        return dict(N=n, IN=count(layer.in_shape[1:]), OUT=out)

    def launches(self, layer, cfg, prefix):
        return [reduction_launch(prefix, conv_args(layer), _items(layer), cfg)]

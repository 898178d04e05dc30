"""Global average pooling: the mean of each (n, c) plane.

RED="item": one work-item per plane sums it sequentially.
RED="group": one work-group per plane, partial sums combined by a tree in local memory
(better for few, large planes).
"""
from .base import (Variant, In, Out, reduction_constraints, reduction_knobs, reduction_launch,
                   reduction_local_mem)


def _planes(layer):
    return layer.in_shape[0] * layer.in_shape[1]


class GlobalAvgpoolDirect(Variant):
    name = "global_avgpool_direct"
    ops = ("global_avgpool",)
    template = "kernels/global_avgpool.cl.mako"
    constraints = reduction_constraints(
        lambda layer: _planes(layer), lambda layer: layer.in_shape[2] * layer.in_shape[3], "plane",
        "in a group reduction, work-items beyond the plane size only add zeros")

    def knobs(self, layer, target):
        return reduction_knobs("plane")

    def local_mem_bytes(self, layer, cfg):
        return reduction_local_mem(cfg)

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(NC=n * c, HW=h * w)

    def launches(self, layer, cfg, prefix):
        return [reduction_launch(prefix, (In(0), Out()), _planes(layer), cfg)]

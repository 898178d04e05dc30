"""Global average pooling: the mean of each (n, c) plane.

RED="item": one work-item per plane sums it sequentially.
RED="group": one work-group per plane, partial sums combined by a tree in local memory
(better for few, large planes).
"""
from .flat import Reduction, reduction_constraints


def _planes(layer):
    return layer.in_shape[0] * layer.in_shape[1]


class GlobalAvgpoolDirect(Reduction):
    name = "global_avgpool_direct"
    ops = ("global_avgpool",)
    template = "kernels/global_avgpool.cl.mako"
    constraints = reduction_constraints(
        _planes, lambda layer: layer.in_shape[2] * layer.in_shape[3], "plane",
        "in a group reduction, work-items beyond the plane size only add zeros")
    what = "plane"
    units = staticmethod(_planes)

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(NC=n * c, HW=h * w)

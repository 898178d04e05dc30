"""Global average pooling: the mean of each (n, c) plane.

RED="item": one work-item per plane sums it sequentially.
RED="group": one work-group per plane, partial sums combined by a tree in local memory
(better for few, large planes).
"""
from .flat import Reduction


class GlobalAvgpoolDirect(Reduction):
    name = "global_avgpool_direct"
    ops = ("global_avgpool",)
    template = "kernels/global_avgpool.cl.mako"
    half_storage = True
    what = "plane"
    width = staticmethod(lambda layer: layer.in_shape[2] * layer.in_shape[3])
    within = ("plane", "in a group reduction, work-items beyond the plane size only add zeros")

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(NC=n * c, HW=h * w)

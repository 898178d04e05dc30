"""Softmax over channels for every (n, h, w), numerically stable (subtract the max first).

RED="item": one work-item per (n, h, w) makes three passes over the C channels.
RED="group": one work-group per (n, h, w); max and sum are tree reductions in local memory
(the classifier case: N*H*W tiny, C large).
"""
from .flat import Reduction, reduction_constraints


def _columns(layer):
    n, _, h, w = layer.in_shape
    return n * h * w


class SoftmaxDirect(Reduction):
    name = "softmax_direct"
    ops = ("softmax",)
    template = "kernels/softmax.cl.mako"
    constraints = reduction_constraints(
        _columns, lambda layer: layer.in_shape[1], "channels",
        "in a group reduction, work-items beyond the channel count only idle")
    what = "(n, h, w)"
    units = staticmethod(_columns)

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

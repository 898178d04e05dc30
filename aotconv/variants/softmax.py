"""Softmax over channels for every (n, h, w), numerically stable (subtract the max first).

RED="item": one work-item per (n, h, w) makes three passes over the C channels.
RED="group": one work-group per (n, h, w); max and sum are tree reductions in local memory
(the classifier case: N*H*W tiny, C large).
"""
from .base import (Variant, In, Out, reduction_constraints, reduction_knobs, reduction_launch,
                   reduction_local_mem)


def _columns(layer):
    n, _, h, w = layer.in_shape
    return n * h * w


class SoftmaxDirect(Variant):
    name = "softmax_direct"
    ops = ("softmax",)
    template = "kernels/softmax.cl.mako"
    constraints = reduction_constraints(
        lambda layer: _columns(layer), lambda layer: layer.in_shape[1], "channels",
        "in a group reduction, work-items beyond the channel count only idle")

    def knobs(self, layer, target):
        return reduction_knobs("(n, h, w)")

    def local_mem_bytes(self, layer, cfg):
        return reduction_local_mem(cfg)

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

    def launches(self, layer, cfg, prefix):
        return [reduction_launch(prefix, (In(0), Out()), _columns(layer), cfg)]

"""Softmax over channels for every (n, h, w), numerically stable (subtract the max first).

RED="item": one work-item per (n, h, w) makes three passes over the C channels.
RED="group": one work-group per (n, h, w); max and sum are tree reductions in local memory
(the classifier case: N*H*W tiny, C large).
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, round_up


def _columns(layer):
    n, _, h, w = layer.in_shape
    return n * h * w


class SoftmaxDirect(Variant):
    name = "softmax_direct"
    ops = ("softmax",)
    template = "kernels/softmax.cl.mako"
    constraints = (
        Constraint("tree_needs_pow2", "algorithm",
                   "the local-memory reduction halves the work-group each step",
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] & (cfg["WG"] - 1) == 0),
        Constraint("group_not_wider_than_channels", "software",
                   "in a group reduction, work-items beyond the channel count only idle",
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] <= max(32, layer.in_shape[1])),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["RED"] == "group" or cfg["WG"] <= max(64, _columns(layer))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("RED", ("item", "group"), "one (n, h, w) per work-item or per work-group"),
                Knob("WG", (64, 32, 128, 256), "work-items per work-group")]

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["WG"] if cfg["RED"] == "group" else 0

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

    def launches(self, layer, cfg, prefix):
        wg = cfg["WG"]
        g = _columns(layer) * wg if cfg["RED"] == "group" else round_up(_columns(layer), wg)
        return [Launch(prefix, (In(0), Out()), (g,), (wg,))]

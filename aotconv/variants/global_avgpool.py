"""Global average pooling: the mean of each (n, c) plane.

RED="item": one work-item per plane sums it sequentially.
RED="group": one work-group per plane, partial sums combined by a tree in local memory
(better for few, large planes).
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, round_up


def _planes(layer):
    return layer.in_shape[0] * layer.in_shape[1]


class GlobalAvgpoolDirect(Variant):
    name = "global_avgpool_direct"
    ops = ("global_avgpool",)
    template = "kernels/global_avgpool.cl.mako"
    constraints = (
        Constraint("tree_needs_pow2", "algorithm",
                   "the local-memory reduction halves the work-group each step",
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] & (cfg["WG"] - 1) == 0),
        Constraint("group_not_wider_than_plane", "software",
                   "in a group reduction, work-items beyond the plane size only add zeros",
                   lambda layer, cfg, t: cfg["RED"] == "item"
                   or cfg["WG"] <= max(32, layer.in_shape[2] * layer.in_shape[3])),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["RED"] == "group" or cfg["WG"] <= max(64, _planes(layer))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("RED", ("item", "group"), "one plane per work-item or per work-group"),
                Knob("WG", (64, 32, 128, 256), "work-items per work-group")]

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["WG"] if cfg["RED"] == "group" else 0

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(NC=n * c, HW=h * w)

    def launches(self, layer, cfg, prefix):
        wg = cfg["WG"]
        g = _planes(layer) * wg if cfg["RED"] == "group" else round_up(_planes(layer), wg)
        return [Launch(prefix, (In(0), Out()), (g,), (wg,))]

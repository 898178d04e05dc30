"""Direct fully-connected layer: y[n, o] = act(sum_i x[n, i] * w[o, i] + b[o]).

RED="item": one work-item per output, a sequential dot product of length IN.
RED="group": one work-group per output; its WG work-items stride over IN and combine their
partial sums with a tree in local memory (better when IN is large and N*OUT small).
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, Param, round_up
from ..graph import count


def _items(layer):
    return layer.out_shape[0] * layer.out_shape[1]


class DenseDirect(Variant):
    name = "dense_direct"
    ops = ("dense",)
    template = "kernels/dense_direct.cl.mako"
    constraints = (
        Constraint("tree_needs_pow2", "algorithm",
                   "the local-memory reduction halves the work-group each step",
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] & (cfg["WG"] - 1) == 0),
        Constraint("group_not_wider_than_row", "software",
                   "in a group reduction, work-items beyond the input length only add zeros",
                   lambda layer, cfg, t: cfg["RED"] == "item"
                   or cfg["WG"] <= max(32, count(layer.in_shape[1:]))),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["RED"] == "group" or cfg["WG"] <= max(64, _items(layer))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("RED", ("item", "group"), "one output per work-item or per work-group"),
                Knob("WG", (64, 32, 128, 256), "work-items per work-group")]

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["WG"] if cfg["RED"] == "group" else 0

    def template_params(self, layer, cfg):
        n, out = layer.out_shape[:2]
        return dict(N=n, IN=count(layer.in_shape[1:]), OUT=out)

    def launches(self, layer, cfg, prefix):
        args = (In(0), Param("weight")) + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),)
        wg = cfg["WG"]
        g = _items(layer) * wg if cfg["RED"] == "group" else round_up(_items(layer), wg)
        return [Launch(prefix, args, (g,), (wg,))]

"""Direct convolution: one work-item computes KB output channels of one output pixel.

The plain, always-valid conv variant (any kernel, stride, pad, dilation, groups, bias, act):
no local memory, no weight re-layout; the reference point the tuned variants must beat.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, Param, ceil_div, round_up


def _sizes(layer):
    a = layer.attrs
    n, c, h, w = layer.in_shape
    _, k, p, q = layer.out_shape
    g = a["groups"]
    return dict(N=n, C=c, H=h, W=w, K=k, P=p, Q=q, G=g, CG=c // g, KG=k // g,
                KH=a["kernel"][0], KW=a["kernel"][1], SH=a["stride"][0], SW=a["stride"][1],
                DH=a["dilation"][0], DW=a["dilation"][1], PT=a["pad"][0], PL=a["pad"][1])


class ConvDirect(Variant):
    name = "conv_direct"
    ops = ("conv",)
    template = "kernels/conv_direct.cl.mako"
    constraints = (
        Constraint("kb_divides_group", "algorithm",
                   "a work-item's block of KB output channels must lie in one group, so that "
                   "it reads one set of input channels",
                   lambda layer, cfg, t: (layer.out_shape[1] // layer.attrs["groups"]) % cfg["KB"] == 0),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["WG"] <= max(64, _items(layer, cfg))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("WG", (64, 32, 128, 256), "work-items per work-group"),
                Knob("KB", (1, 2, 4, 8), "output channels per work-item (register block)")]

    def registers(self, layer, cfg):
        """Estimated 32-bit registers per work-item (aotconv.space checks the device's budget):
        KB accumulators plus about 24 for indices, pointers and the loaded input value."""
        return cfg["KB"] + 24

    def template_params(self, layer, cfg):
        return _sizes(layer)

    def launches(self, layer, cfg, prefix):
        args = (In(0), Param("weight")) + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),)
        return [Launch(prefix, args, (round_up(_items(layer, cfg), cfg["WG"]),), (cfg["WG"],))]


def _items(layer, cfg):
    n, k, p, q = layer.out_shape
    return n * ceil_div(k, cfg["KB"]) * p * q

"""Direct convolution: one work-item computes KB output channels of one output pixel.

The plain, always-valid conv variant (any kernel, stride, pad, dilation, groups, bias, act):
no local memory, no weight re-layout; the reference point the tuned variants must beat.
"""
from .flat import ChannelBlocked, conv_args
from .residual import with_residual


def _sizes(layer):
    a = layer.attrs
    n, c, h, w = layer.in_shape
    _, k, p, q = layer.out_shape
    g = a["groups"]
    return dict(N=n, C=c, H=h, W=w, K=k, P=p, Q=q, G=g, CG=c // g, KG=k // g,
                KH=a["kernel"][0], KW=a["kernel"][1], SH=a["stride"][0], SW=a["stride"][1],
                DH=a["dilation"][0], DW=a["dilation"][1], PT=a["pad"][0], PL=a["pad"][1])


class ConvDirect(ChannelBlocked):
    name = "conv_direct"
    ops = ("conv",)
    template = "kernels/conv_direct.cl.mako"
    half_storage = True

    def registers(self, layer, cfg):
        """Estimated 32-bit registers per work-item (aotconv.space checks the device's budget):
        KB accumulators plus about 24 for indices, pointers and the loaded input value."""
        return cfg["KB"] + 24

    def template_params(self, layer, cfg):
        return _sizes(layer)

    def args(self, layer):
        return with_residual(layer, conv_args(layer))

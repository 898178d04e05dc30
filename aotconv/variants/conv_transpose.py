"""Transposed convolution (deconvolution, ONNX ConvTranspose), direct: each work-item computes
KB output channels of one output pixel by gathering the input pixels whose taps land on it.

Output row p receives input row iy through filter row r where iy * stride + r * dilation =
p + pad_top: the work-item walks only the filter rows (and columns) of its residue modulo the
stride, so it reads each contributing input once and writes each output once, with no atomics
and no zero-inserted copy of the input. Weights stay in ONNX's and PyTorch's layout
(C_in, C_out / groups, kh, kw); groups, pads on each side, output_padding and dilation all
follow from the same formula.
"""
from .flat import ChannelBlocked, conv_args


class ConvTransposeDirect(ChannelBlocked):
    name = "conv_transpose_direct"
    ops = ("conv_transpose",)
    template = "kernels/conv_transpose.cl.mako"

    def registers(self, layer, cfg):
        """Estimated 32-bit registers per work-item (aotconv.space checks the device's budget):
        KB accumulators plus about 24 for indices, pointers and the loaded input value."""
        return cfg["KB"] + 24

    def template_params(self, layer, cfg):
        a = layer.attrs
        n, c, h, w = layer.in_shape
        _, k, p, q = layer.out_shape
        g = a["groups"]
        return dict(N=n, C=c, H=h, W=w, K=k, P=p, Q=q, G=g, CG=c // g, KG=k // g,
                    KH=a["kernel"][0], KW=a["kernel"][1], SH=a["stride"][0], SW=a["stride"][1],
                    DH=a["dilation"][0], DW=a["dilation"][1], PT=a["pad"][0], PL=a["pad"][1])

    def args(self, layer):
        return conv_args(layer)

"""conv_pool_direct: a convolution with its max/avg pool fused, one pooled output per work-item.

A work-item computes KB output channels of one pooled output pixel: for each conv output in
its pooling window (clipped exactly as pool_direct clips it: padding skipped, the ceil_mode
overhang never counted, count_include_pad honoured), the direct convolution over the input,
then bias and activation, then the max or the running sum. The conv output never reaches
memory; windows that overlap (3x3 stride 2) recompute the conv outputs they share, which is
why the fusion is kept only where the tuner measures it faster (aotconv.fusion).

Every act aotconv has (relu, leaky_relu, sigmoid, tanh) is non-decreasing, so for max pooling
bias and act commute with the max and are applied once, after it; likewise the bias of an
average without act that divides by the real positions only (count_include_pad false: the
padded positions it would count add zeros, not the bias). Otherwise they are applied at each
window position, before the sum.
"""
from .flat import ChannelBlocked
from ..ops import split_conv_pool, conv_pool_mid_shape


def _sizes(layer):
    conv, pop, pool = split_conv_pool(layer.attrs)
    n, c, h, w = layer.in_shape
    _, k, p, q = layer.out_shape
    _, _, cp, cq = conv_pool_mid_shape(layer)
    g = conv["groups"]
    return dict(N=n, C=c, H=h, W=w, K=k, P=p, Q=q, CP=cp, CQ=cq, G=g, CG=c // g, KG=k // g,
                KH=conv["kernel"][0], KW=conv["kernel"][1], SH=conv["stride"][0],
                SW=conv["stride"][1], DH=conv["dilation"][0], DW=conv["dilation"][1],
                PT=conv["pad"][0], PL=conv["pad"][1],
                PKH=pool["kernel"][0], PKW=pool["kernel"][1], PSH=pool["stride"][0],
                PSW=pool["stride"][1], PPH=pool["pad"][0], PPW=pool["pad"][1],
                is_max=pop == "maxpool", ceil_mode=pool["ceil_mode"],
                include_pad=pool.get("count_include_pad", False))


class ConvPoolDirect(ChannelBlocked):
    name = "conv_pool_direct"
    ops = ("conv_pool",)
    template = "kernels/conv_pool.cl.mako"
    half_storage = True

    def registers(self, layer, cfg):
        """KB conv accumulators, KB pool accumulators, about 28 for indices and pointers."""
        return 2 * cfg["KB"] + 28

    def template_params(self, layer, cfg):
        return _sizes(layer)

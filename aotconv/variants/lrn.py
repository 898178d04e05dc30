"""Local response normalisation across channels (torch.nn.LocalResponseNorm).

y[c] = x[c] / (k + alpha/size * sum_{j=c-size/2}^{c+(size-1)/2} x[j]^2) ^ beta, zero outside.
One work-item handles CB consecutive channels of one (n, h, w) and slides the window sum
(add the channel entering, subtract the one leaving) instead of re-summing `size` squares.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, ceil_div, round_up


def _items(layer, cfg):
    n, c, h, w = layer.in_shape
    return n * ceil_div(c, cfg["CB"]) * h * w


class LrnDirect(Variant):
    name = "lrn_direct"
    ops = ("lrn",)
    template = "kernels/lrn.cl.mako"
    constraints = (
        Constraint("cb_within_channels", "software",
                   "a channel block longer than the channel count only adds idle iterations",
                   lambda layer, cfg, t: cfg["CB"] <= max(1, layer.in_shape[1])),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["WG"] <= max(64, _items(layer, cfg))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("WG", (64, 32, 128, 256), "work-items per work-group"),
                Knob("CB", (1, 4, 8, 16), "consecutive channels per work-item (sliding window)")]

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

    def launches(self, layer, cfg, prefix):
        return [Launch(prefix, (In(0), Out()), (round_up(_items(layer, cfg), cfg["WG"]),),
                       (cfg["WG"],))]

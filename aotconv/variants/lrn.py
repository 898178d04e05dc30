"""Local response normalisation across channels (torch.nn.LocalResponseNorm).

y[c] = x[c] / (k + alpha/size * sum_{j=c-size/2}^{c+(size-1)/2} x[j]^2) ^ beta, zero outside.
One work-item handles CB consecutive channels of one (n, h, w) and slides the window sum
(add the channel entering, subtract the one leaving) instead of re-summing `size` squares.
"""
from .base import Constraint, Knob, ceil_div
from .flat import Flat, flat_constraints, wg_knob


def _items(layer, cfg):
    n, c, h, w = layer.in_shape
    return n * ceil_div(c, cfg["CB"]) * h * w


class LrnDirect(Flat):
    name = "lrn_direct"
    ops = ("lrn",)
    template = "kernels/lrn.cl.mako"
    constraints = flat_constraints(_items, Constraint(
        "cb_within_channels", "software",
        "a channel block longer than the channel count only adds idle iterations",
        lambda layer, cfg, t: cfg["CB"] <= max(1, layer.in_shape[1])))
    items = staticmethod(_items)

    def knobs(self, layer, target):
        return [wg_knob(),
                Knob("CB", (1, 4, 8, 16), "consecutive channels per work-item (sliding window)")]

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

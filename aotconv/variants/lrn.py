"""Local response normalisation across channels (torch.nn.LocalResponseNorm).

y[c] = x[c] / (k + alpha/size * sum_{j=c-size/2}^{c+(size-1)/2} x[j]^2) ^ beta, zero outside.
One work-item handles CB consecutive channels of one (n, h, w) and slides the window sum
(add the channel entering, subtract the one leaving) instead of re-summing `size` squares.
"""
from .base import Knob
from .flat import Blocked


class LrnDirect(Blocked):
    name = "lrn_direct"
    ops = ("lrn",)
    template = "kernels/lrn.cl.mako"
    half_storage = True
    block = Knob("CB", (1, 4, 8, 16), "consecutive channels per work-item (sliding window)")
    along = 1
    within = ("cb_within_channels",
              "a channel block longer than the channel count only adds idle iterations")

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

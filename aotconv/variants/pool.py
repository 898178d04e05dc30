"""Direct max / average pooling with PyTorch semantics: pad, ceil_mode, count_include_pad.

One work-item computes QB neighbouring outputs along a row. Max pooling skips padded
positions; average pooling divides by the window clipped to the padded input (the ceil_mode
overhang never counts) and, without count_include_pad, clipped to the input itself.
"""
from .base import Knob
from .flat import Blocked


class PoolDirect(Blocked):
    name = "pool_direct"
    ops = ("maxpool", "avgpool")
    template = "kernels/pool.cl.mako"
    half_storage = True
    block = Knob("QB", (1, 2, 4), "outputs along a row per work-item")
    along = 3
    within = ("qb_within_row",
              "a block of outputs longer than the output row only adds idle iterations")

    def template_params(self, layer, cfg):
        a = layer.attrs
        n, c, h, w = layer.in_shape
        _, _, p, q = layer.out_shape
        return dict(N=n, C=c, H=h, W=w, P=p, Q=q, KH=a["kernel"][0], KW=a["kernel"][1],
                    SH=a["stride"][0], SW=a["stride"][1], PH=a["pad"][0], PW=a["pad"][1],
                    is_max=layer.op == "maxpool",
                    include_pad=a.get("count_include_pad", False))

"""Direct max / average pooling with PyTorch semantics: pad, ceil_mode, count_include_pad.

One work-item computes QB neighbouring outputs along a row. Max pooling skips padded
positions; average pooling divides by the window clipped to the padded input (the ceil_mode
overhang never counts) and, without count_include_pad, clipped to the input itself.
"""
from .base import Constraint, Knob, ceil_div
from .flat import Flat, flat_constraints, wg_knob


def _items(layer, cfg):
    n, c, p, q = layer.out_shape
    return n * c * p * ceil_div(q, cfg["QB"])


class PoolDirect(Flat):
    name = "pool_direct"
    ops = ("maxpool", "avgpool")
    template = "kernels/pool.cl.mako"
    constraints = flat_constraints(_items, Constraint(
        "qb_within_row", "software",
        "a block of outputs longer than the output row only adds idle iterations",
        lambda layer, cfg, t: cfg["QB"] <= max(1, layer.out_shape[3])))
    items = staticmethod(_items)

    def knobs(self, layer, target):
        return [wg_knob(),
                Knob("QB", (1, 2, 4), "outputs along a row per work-item")]

    def template_params(self, layer, cfg):
        a = layer.attrs
        n, c, h, w = layer.in_shape
        _, _, p, q = layer.out_shape
        return dict(N=n, C=c, H=h, W=w, P=p, Q=q, KH=a["kernel"][0], KW=a["kernel"][1],
                    SH=a["stride"][0], SW=a["stride"][1], PH=a["pad"][0], PW=a["pad"][1],
                    is_max=layer.op == "maxpool",
                    include_pad=a.get("count_include_pad", False))

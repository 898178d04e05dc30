"""Crop: drop `top` and `bottom` rows and `left` and `right` columns of every (n, c) plane
(what the ONNX importer puts after a pool whose padding differs at the two ends: the pool is
padded symmetrically by the larger amount, then the outputs ONNX does not have are dropped).

One flat launch: each work-item copies VEC consecutive elements of one output row from the
input row it comes from, so reads and writes stay contiguous.
"""
from .base import Constraint, Knob, ceil_div
from .flat import Flat, flat_constraints, wg_knob


def _items(layer, cfg):
    n, c, p, q = layer.out_shape
    return n * c * p * ceil_div(q, cfg["VEC"])


class CropDirect(Flat):
    name = "crop_direct"
    ops = ("crop",)
    template = "kernels/crop.cl.mako"
    half_storage = True
    constraints = flat_constraints(_items, Constraint(
        "vec_within_row", "software",
        "a work-item block longer than an output row only adds idle iterations",
        lambda layer, cfg, t: cfg["VEC"] <= max(1, layer.out_shape[3])))
    items = staticmethod(_items)

    def knobs(self, layer, target):
        return [wg_knob(), Knob("VEC", (1, 2, 4, 8), "consecutive elements of a row per "
                                                     "work-item")]

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        _, _, p, q = layer.out_shape
        return dict(NC=n * c, H=h, W=w, P=p, Q=q, TOP=layer.attrs["top"],
                    LEFT=layer.attrs["left"])

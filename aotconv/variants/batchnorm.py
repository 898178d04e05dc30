"""Inference batch normalisation y = (x - mean) / sqrt(var + eps) * gamma + beta, then act.

FOLD="setup": a setup launch (<prefix>_fold, once in set_params) folds the four parameter
tensors into a per-channel scale and shift; each run is one multiply-add per element.
FOLD="inline": no extra buffer; every element recomputes its channel's scale and shift.
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, ceil_div,
                   round_up)
from ..graph import count


class BatchnormDirect(Variant):
    name = "batchnorm_direct"
    ops = ("batchnorm",)
    template = "kernels/batchnorm.cl.mako"
    constraints = (
        Constraint("vec_not_wasteful", "software",
                   "a work-item block larger than the tensor only adds idle lanes",
                   lambda layer, cfg, t: cfg["VEC"] <= max(1, count(layer.out_shape))),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["WG"] <= max(64, ceil_div(count(layer.out_shape),
                                                                       cfg["VEC"]))),
        Constraint("wg_fills_simd", "hardware",
                   "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes idle",
                   lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0),
    )

    def knobs(self, layer, target):
        return [Knob("FOLD", ("setup", "inline"), "fold parameters once, or per element"),
                Knob("WG", (64, 32, 128, 256), "work-items per work-group"),
                Knob("VEC", (1, 2, 4, 8), "elements per work-item")]

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

    def buffers(self, layer, cfg):
        return {"scale_shift": 2 * layer.in_shape[1]} if cfg["FOLD"] == "setup" else {}

    def launches(self, layer, cfg, prefix):
        wg = cfg["WG"]
        items = round_up(ceil_div(count(layer.out_shape), cfg["VEC"]), wg)
        prm = tuple(Param(t) for t in ("gamma", "beta", "mean", "var"))
        if cfg["FOLD"] == "inline":
            return [Launch(prefix, (In(0),) + prm + (Out(),), (items,), (wg,))]
        return [Launch(f"{prefix}_fold", prm + (Buffer("scale_shift"),),
                       (round_up(layer.in_shape[1], wg),), (wg,), phase="setup"),
                Launch(prefix, (In(0), Buffer("scale_shift"), Out()), (items,), (wg,))]

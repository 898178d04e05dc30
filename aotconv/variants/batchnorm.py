"""Inference batch normalisation y = (x - mean) / sqrt(var + eps) * gamma + beta, then act.

FOLD="setup": a setup launch (<prefix>_fold, once in set_params) folds the four parameter
tensors into a per-channel scale and shift; each run is one multiply-add per element.
FOLD="inline": no extra buffer; every element recomputes its channel's scale and shift.
"""
from .base import Buffer, In, Knob, Out, Param, Variant
from .flat import elementwise_constraints, flat_launch, vec_items, vec_knob, wg_knob

_PARAMS = tuple(Param(t) for t in ("gamma", "beta", "mean", "var"))


class BatchnormDirect(Variant):
    name = "batchnorm_direct"
    ops = ("batchnorm",)
    template = "kernels/batchnorm.cl.mako"
    half_storage = True
    constraints = elementwise_constraints()

    def knobs(self, layer, target):
        return [Knob("FOLD", ("setup", "inline"), "fold parameters once, or per element"),
                wg_knob(), vec_knob()]

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        return dict(N=n, C=c, HW=h * w)

    def buffers(self, layer, cfg):
        return {"scale_shift": 2 * layer.in_shape[1]} if cfg["FOLD"] == "setup" else {}

    def launches(self, layer, cfg, prefix):
        wg, items = cfg["WG"], vec_items(layer, cfg)
        if cfg["FOLD"] == "inline":
            return [flat_launch(prefix, (In(0),) + _PARAMS + (Out(),), items, wg)]
        return [flat_launch(f"{prefix}_fold", _PARAMS + (Buffer("scale_shift"),),
                            layer.in_shape[1], wg, phase="setup"),
                flat_launch(prefix, (In(0), Buffer("scale_shift"), Out()), items, wg)]

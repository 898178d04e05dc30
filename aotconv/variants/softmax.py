"""Softmax and log-softmax over a block of consecutive axes (the channels by default) for
every position of the other axes, numerically stable (subtract the max first).

The tensor is viewed as (OUTER, R, INNER): the R values of one softmax lie INNER apart (over
the channels of NCHW: OUTER = N, R = C, INNER = H*W; over the columns: INNER = 1).
RED="item": one work-item per (outer, inner) column makes three passes over its R values.
RED="group": one work-group per column; max and sum are tree reductions in local memory
(the classifier case: few columns, R large).
In an fp16 build whose output it is, it reads half and writes the float output itself
(aotconv.layouts.fuse_casts): its sums are FP32 either way, so only the last rounding goes.
"""
from .flat import Reduction, reduction_constraints
from ..graph import count
from ..ops import softmax_axes


def _blocks(layer):
    """(OUTER, R, INNER) of the layer's input."""
    shape = layer.in_shape
    axes = softmax_axes(layer.attrs)
    return count(shape[:axes[0]]), count(shape[axes[0]:axes[-1] + 1]), count(shape[axes[-1] + 1:])


def _columns(layer):
    outer, _, inner = _blocks(layer)
    return outer * inner


class SoftmaxDirect(Reduction):
    name = "softmax_direct"
    ops = ("softmax", "log_softmax")
    template = "kernels/softmax.cl.mako"
    half_storage = True
    writes_float = True          # a network output in float: no cast after it
    constraints = reduction_constraints(
        _columns, lambda layer: _blocks(layer)[1], "values",
        "in a group reduction, work-items beyond the values reduced only idle")
    what = "softmax"
    units = staticmethod(_columns)

    def template_params(self, layer, cfg):
        outer, r, inner = _blocks(layer)
        return dict(N=outer, C=r, HW=inner, axes=softmax_axes(layer.attrs),
                    log=layer.op == "log_softmax")

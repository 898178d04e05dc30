"""Direct fully-connected layer: y[n, o] = act(sum_i x[n, i] * w[o, i] + b[o]).

RED="item": one work-item per output, a sequential dot product of length IN.
RED="group": one work-group per output; its WG work-items stride over IN and combine their
partial sums with a tree in local memory (better when IN is large and N*OUT small).
"""
from .flat import Reduction, conv_args
from ..graph import count


class DenseDirect(Reduction):
    name = "dense_direct"
    ops = ("dense",)
    template = "kernels/dense_direct.cl.mako"
    half_storage = True
    what = "output"
    width = staticmethod(lambda layer: count(layer.in_shape[1:]))
    within = ("row", "in a group reduction, work-items beyond the input length only add zeros")
    args = staticmethod(conv_args)

    def template_params(self, layer, cfg):
        n, out = layer.out_shape[:2]
        return dict(N=n, IN=count(layer.in_shape[1:]), OUT=out)

"""A PyTorch model of a validated Network with the same weights: the end-to-end reference.

Every op of DESIGN.md maps onto PyTorch's own (whose semantics aotconv follows where
frameworks differ): conv (asymmetric `same` padding as an explicit F.pad), dense (the input
flattened in C, H, W order), max/avg pooling with ceil_mode and count_include_pad,
global_avgpool, the activations (relu6, hardswish, silu and gelu as PyTorch's own; clip and
hardsigmoid with their alpha and beta as clamps), softmax over channels, LocalResponseNorm,
concat, add, batchnorm (inference), dropout (identity), flatten, scale and mul (x * s),
channel_shuffle (PyTorch's ShuffleNet reshape-transpose-reshape), channel_slice and crop.
Tensors keep aotconv's convention: 4-D NCHW, dense outputs (N, F, 1, 1), so every
intermediate can be compared with ours.
"""
import numpy as np

from .bench.refs.torch_ref import apply_act
from .graph import ACT_OPS


def build(net, params, device="cpu"):
    """A torch.nn.Module running `net` (as spec.load_network gives it, before or after passes)
    with `params` ({layer: {tensor: array}} or the flat array), in eval mode on `device`."""
    import torch
    from torch import nn
    import torch.nn.functional as F
    from .reference import unflatten_params

    if not isinstance(params, dict):
        params = unflatten_params(net, params)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.tensors = nn.ParameterDict()
            # ParameterDict keys may not contain '.', which layer names may (`features.0.0`)
            self.keys = {}
            for lname, ts in params.items():
                for tname, arr in ts.items():
                    self.keys[lname, tname] = k = f"t{len(self.keys)}"
                    self.tensors[k] = nn.Parameter(
                        torch.from_numpy(np.ascontiguousarray(arr, np.float32)),
                        requires_grad=False)

        def p(self, layer, tensor):
            k = self.keys.get((layer.name, tensor))
            return self.tensors[k] if k is not None else None

        def forward(self, *xs):
            # one tensor per network input, in order (a network of one takes forward(x))
            names = self.net.input_names
            if len(xs) != len(names):
                raise TypeError(f"network '{self.net.name}' takes {len(names)} inputs "
                                f"({', '.join(names)}), got {len(xs)}")
            values = dict(zip(names, xs))
            for layer in self.net.layers:
                ins = [values[i] for i in layer.inputs]
                values[layer.name] = self.layer(layer, ins)
            outs = [values[o] for o in self.net.outputs]
            return outs[0] if len(outs) == 1 else outs

        def layer(self, l, ins):
            op, a, x = l.op, l.attrs, ins[0]
            if op == "conv":
                pt, pl, pb, pr = a["pad"]
                if (pt, pl) != (pb, pr):
                    x, pad = F.pad(x, (pl, pr, pt, pb)), (0, 0)
                else:
                    pad = (pt, pl)
                y = F.conv2d(x, self.p(l, "weight"), self.p(l, "bias"), stride=tuple(a["stride"]),
                             padding=pad, dilation=tuple(a["dilation"]), groups=a["groups"])
                return act(y, a)
            if op == "dense":
                y = F.linear(x.reshape(x.shape[0], -1), self.p(l, "weight"), self.p(l, "bias"))
                return act(y, a).reshape(x.shape[0], -1, 1, 1)
            if op == "maxpool":
                return F.max_pool2d(x, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["pad"]),
                                    ceil_mode=a["ceil_mode"])
            if op == "avgpool":
                return F.avg_pool2d(x, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["pad"]),
                                    ceil_mode=a["ceil_mode"],
                                    count_include_pad=a["count_include_pad"])
            if op == "global_avgpool":
                return x.mean(dim=(2, 3), keepdim=True)
            if op in ACT_OPS:
                return act(x, a)
            if op in ("softmax", "log_softmax"):      # over the block of axes it names
                from .ops import softmax_axes
                ax = softmax_axes(a)
                f = torch.log_softmax if op == "log_softmax" else torch.softmax
                return f(x.flatten(ax[0], ax[-1]), dim=ax[0]).reshape(x.shape)
            if op == "lrn":
                return F.local_response_norm(x, a["size"], a["alpha"], a["beta"], a["k"])
            if op == "concat":
                return torch.cat(ins, dim=1)
            if op == "add":
                y = ins[0]
                for other in ins[1:]:
                    y = y + other
                return act(y, a)
            if op == "batchnorm":
                y = F.batch_norm(x, self.p(l, "mean"), self.p(l, "var"), self.p(l, "gamma"),
                                 self.p(l, "beta"), training=False, eps=a["eps"])
                return act(y, a)
            if op == "dropout":
                return x
            if op == "flatten":
                return x.reshape(x.shape[0], -1, 1, 1)
            if op in ("scale", "mul"):
                return x * ins[1]                   # scale: (N, C, 1, 1) broadcasts over H, W
            if op == "channel_shuffle":
                n, c, h, w = x.shape
                g = a["groups"]
                return x.reshape(n, g, c // g, h, w).transpose(1, 2).reshape(n, c, h, w)
            if op == "channel_slice":
                return x[:, a["start"]:a["end"]]
            if op == "crop":
                h, w = x.shape[2], x.shape[3]
                return x[:, :, a["top"]:h - a["bottom"], a["left"]:w - a["right"]]
            raise NotImplementedError(f"layer '{l.name}': op {op} has no PyTorch mapping")

    return Net().to(device).eval()


def act(y, a):
    """The activation a layer's normalised attrs `a` name (graph.py), in PyTorch."""
    import torch
    import torch.nn.functional as F
    kind = a["act"]
    if kind == "relu6":
        return F.relu6(y)
    if kind == "clip":
        return y if a["min"] is None and a["max"] is None else torch.clamp(y, a["min"], a["max"])
    if kind == "hardsigmoid":
        return torch.clamp(a["alpha"] * y + a["beta"], 0.0, 1.0)
    if kind == "hardswish":
        return F.hardswish(y)
    if kind == "silu":
        return F.silu(y)
    if kind == "gelu":
        return F.gelu(y)
    if kind == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return apply_act(y, kind, a["alpha"])

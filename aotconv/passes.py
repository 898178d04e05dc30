"""Graph passes between the validated network and kernel choice: fusion and aliasing.

- Activation layers (relu, sigmoid, tanh, leaky_relu) fold into the epilogue of the producer
  (conv, dense, add, batchnorm) when the producer has no activation yet, the activation is its
  only consumer and the producer's output is not itself a network output.
- flatten and dropout move no data: their output tensor is their input's buffer.

Passes return a new Network; the input network is left as the spec produced it.
"""
import copy

from .graph import ACT_OPS, FUSABLE
from .ops import is_alias


def consumers(net):
    out = {}
    for l in net.layers:
        for t in l.inputs:
            out.setdefault(t, []).append(l.name)
    return out


def fuse_activations(net):
    net = copy.deepcopy(net)
    by_name = {l.name: l for l in net.layers}
    users = consumers(net)
    removed = {}
    for l in list(net.layers):
        if l.op not in ACT_OPS or len(l.inputs) != 1:
            continue
        p = by_name.get(l.inputs[0])
        if (p is None or p.name in removed or p.op not in FUSABLE or p.attrs.get("act") != "none"
                or users.get(p.name) != [l.name] or p.name in net.outputs):
            continue
        p.attrs["act"], p.attrs["alpha"] = l.attrs["act"], l.attrs["alpha"]
        p.fused.append(l.name)
        removed[l.name] = p.name
    if not removed:
        return net
    net.layers = [l for l in net.layers if l.name not in removed]
    for l in net.layers:
        l.inputs = [removed.get(t, t) for t in l.inputs]
    net.outputs = [removed.get(t, t) for t in net.outputs]
    return net


def resolve_alias(net, tensor):
    """The tensor whose buffer holds `tensor` (following flatten/dropout back)."""
    while tensor != "input":
        l = net.layer(tensor)
        if not is_alias(l):
            break
        tensor = l.inputs[0]
    return tensor


def optimise(net):
    """All graph passes, in order."""
    return fuse_activations(net)

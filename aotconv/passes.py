"""Graph passes between the validated network and kernel choice: fusion and aliasing.

- Activation layers (graph.ACT_OPS) fold into the epilogue of the producer
  (conv, dense, add, batchnorm) when the producer has no activation yet, the activation is its
  only consumer and the producer's output is not itself a network output.
- flatten and dropout move no data: their output tensor is their input's buffer.
- A max/avg pool may fold into the convolution before it (`fuse_pool`): one conv_pool layer,
  named after the conv, computes each pooled output from the conv outputs of its window, so
  the conv's output never reaches memory. Whether a pair is fused is decided by
  aotconv.fusion (where the tuner measures the fused kernel faster); this pass only rewrites.

Passes return a new Network; the input network is left as the spec produced it.
"""
import copy

from .graph import ACT_OPS, FUSABLE, act_attrs, act_monotone
from .ops import is_alias, pool_attrs, infer

POOL_OPS = ("maxpool", "avgpool")


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
        p.attrs.update(act_attrs(l.attrs))
        p.fused.append(l.name)
        removed[l.name] = p.name
    if not removed:
        return net
    net.layers = [l for l in net.layers if l.name not in removed]
    for l in net.layers:
        l.inputs = [removed.get(t, t) for t in l.inputs]
    net.outputs = [removed.get(t, t) for t in net.outputs]
    return net


def fusable_pools(net):
    """[(conv name, pool name)]: a conv whose only consumer is a max/avg pool and whose output
    is not a network output (the pool's may be: the fused layer then stands for it)."""
    by_name = {l.name: l for l in net.layers}
    users = consumers(net)
    out = []
    for l in net.layers:
        if l.op not in POOL_OPS or len(l.inputs) != 1:
            continue
        p = by_name.get(l.inputs[0])
        # conv_pool applies a max pool's act once, after the max: only a monotone act may
        if p is not None and p.op == "conv" and users.get(p.name) == [l.name] \
                and p.name not in net.outputs and (l.op == "avgpool" or act_monotone(p.attrs)):
            out.append((p.name, l.name))
    return out


def fuse_pool(net, which=None):
    """`net` with each conv named in `which` (all fusable ones when None) and its pool folded
    into one conv_pool layer named after the conv; `fused` records the pool (after any
    activation already fused into the conv). Names not fusable are an error."""
    pairs = dict(fusable_pools(net))
    which = list(pairs) if which is None else list(which)
    bad = [c for c in which if c not in pairs]
    if bad:
        raise ValueError(f"cannot fuse a pool into {', '.join(bad)}: not a conv whose only "
                         f"consumer is a max/avg pool")
    net = copy.deepcopy(net)
    if not which:
        return net
    by_name = {l.name: l for l in net.layers}
    removed = {}
    for cname in which:
        c, p = by_name[cname], by_name[pairs[cname]]
        kind = "max" if p.op == "maxpool" else "avg"
        c.attrs = dict(c.attrs, pool=pool_attrs(kind, p.attrs))
        c.op = "conv_pool"
        c.out_shape, c.params = infer("conv_pool", c.attrs, c.in_shapes)
        assert tuple(c.out_shape) == tuple(p.out_shape), (c.out_shape, p.out_shape)
        c.fused.append(p.name)
        removed[p.name] = c.name
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

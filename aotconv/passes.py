"""Graph passes between the validated network and kernel choice: fusion and aliasing.

- Activation layers (graph.ACT_OPS) fold into the epilogue of the producer
  (conv, dense, add, batchnorm) when the producer has no activation yet, the activation is its
  only consumer and the producer's output is not itself a network output.
- A batchnorm folds into the conv or dense before it (`fold_batchnorm`) when that layer has
  no activation, the batchnorm is its only consumer and its output is not a network output:
  the layer gets a bias and the batchnorm's activation, and `fused` records the batchnorm
  (then whatever was fused into it). The layer then has the signature of any conv or dense with
  bias and that activation (the same kernels, the same tuning records); its parameters are
  computed from the user's in set_params (`batchnorm_folds`, aotconv.schedule), so the
  documented parameter layout (docs/params.md) is the network's as written.
- A residual add may fold into the conv that produces one of its two inputs (`fuse_residual`):
  the conv, with no act of its own and the add as its only consumer, reads the add's other
  input as a second input (attr `residual`) and computes act(conv(x) + bias + residual) with
  the add's act, so the conv's output never reaches memory. Which pairs are fused is decided
  by aotconv.fusion (where some variant takes the fused layer, and it measures faster or runs
  the conv's own kernel); this pass only rewrites.
- flatten and dropout move no data: their output tensor is their input's buffer.
- A max/avg pool may fold into the convolution before it (`fuse_pool`): one conv_pool layer,
  named after the conv, computes each pooled output from the conv outputs of its window, so
  the conv's output never reaches memory. Whether a pair is fused is decided by
  aotconv.fusion (where the tuner measures the fused kernel faster); this pass only rewrites.
- A depthwise conv may fold into the pointwise (1x1) conv that is its only consumer
  (`fuse_dwpw`): one conv_dwpw layer, named after the pointwise conv, computes the depthwise
  outputs it needs (with the depthwise conv's bias and act) and reduces them over the
  channels at once, so the depthwise output never reaches memory. The fused layer takes the
  depthwise conv's input (then the pointwise conv's residual, if one was fused in) and reads
  the depthwise conv's weight and bias as its own dw_weight and dw_bias; `Layer.origins` says
  so (`param_origin`), and set_params fills them from the depthwise conv's tensors as written,
  folded with that conv's own batchnorms (`batchnorm_folds`). Which pairs are fused is decided
  by aotconv.fusion (where the fused kernel measures faster); this pass only rewrites.

Passes return a new Network; the input network is left as the spec produced it.
"""
import copy

from .graph import ACT_OPS, FUSABLE, act_attrs, act_monotone
from .ops import dw_attrs, dwpw_reason, infer, is_alias, pool_attrs

POOL_OPS = ("maxpool", "avgpool")
# the layers a batchnorm folds into: their weights have one block per output channel
FOLD_INTO = ("conv", "dense")


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


def _rename(net, removed):
    """Drop the layers in `removed` {name: the layer that took it over} and point every reader
    (and the network outputs) at the layer that took each over."""
    net.layers = [l for l in net.layers if l.name not in removed]
    for l in net.layers:
        l.inputs = [removed.get(t, t) for t in l.inputs]
    net.outputs = [removed.get(t, t) for t in net.outputs]


def fold_batchnorm(net):
    """`net` with every batchnorm that can fold into the conv or dense before it folded (a
    chain of batchnorms folds one after another while each leaves the layer without an act).

    The folded layer's attrs are a conv's (or dense's) with `bias: true` and the batchnorm's
    activation, its params weight and bias: its kernel is any conv's with bias. The weights it
    runs with are w * gamma / sqrt(var + eps) per output channel and the bias
    (b - mean) * gamma / sqrt(var + eps) + beta (b = 0 without one), computed from the user's
    parameters by set_params (aotconv.schedule.FoldRow)."""
    net = copy.deepcopy(net)
    by_name = {l.name: l for l in net.layers}
    users = consumers(net)
    removed = {}
    for l in list(net.layers):
        if l.op != "batchnorm" or len(l.inputs) != 1:
            continue
        p = by_name.get(removed.get(l.inputs[0], l.inputs[0]))
        if (p is None or p.op not in FOLD_INTO or p.attrs.get("act") != "none"
                or users.get(l.inputs[0]) != [l.name] or l.inputs[0] in net.outputs):
            continue
        # p's act is none: it has no act extras to drop
        p.attrs = dict(p.attrs, bias=True, **act_attrs(l.attrs))
        p.out_shape, p.params = infer(p.op, p.attrs, p.in_shapes)
        assert tuple(p.out_shape) == tuple(l.out_shape), (p.out_shape, l.out_shape)
        p.fused += [l.name] + l.fused
        removed[l.name] = p.name
    if removed:
        _rename(net, removed)
    return net


def batchnorm_folds(source, net):
    """{conv or dense of `source`: [the batchnorms of `source` folded into it, in order]}: what
    fold_batchnorm did to `source` (the network as written) on the way to `net`. A layer of
    `net` holds the batchnorms folded into each layer its parameters come from (param_origin):
    its own, and for a conv_dwpw the depthwise conv's too; a batchnorm belongs to the layer it
    reads in `source`, through the batchnorms folded before it."""
    src = {l.name: l for l in source.layers}
    out = {}
    for l in net.layers:
        fused = set(l.fused)
        for n in l.fused:
            if n not in src or src[n].op != "batchnorm":
                continue
            root = src[n].inputs[0]
            while root in fused and src[root].op == "batchnorm":
                root = src[root].inputs[0]
            out.setdefault(root, []).append(n)
    return out


def param_origin(layer, tensor):
    """(layer, tensor) of the network as written whose values `layer`'s parameter `tensor`
    takes: its own, unless a fusion gave it another layer's (Layer.origins)."""
    return tuple(layer.origins.get(tensor, (layer.name, tensor)))


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
        if p is not None and p.op == "conv" and not p.attrs.get("residual") \
                and users.get(p.name) == [l.name] \
                and p.name not in net.outputs and (l.op == "avgpool" or act_monotone(p.attrs)):
            out.append((p.name, l.name))
    return out


def _chosen(net, fusable, which, what, rule):
    """(a copy of `net`, [(conv, partner)] of the copy's layers to fuse): the convs named in
    `which` (all of `fusable`, [(conv name, partner name)], when None) and their partners; a
    name in `which` that is not fusable is an error saying what the rule is."""
    pairs = dict(fusable)
    which = list(pairs) if which is None else list(which)
    bad = [c for c in which if c not in pairs]
    if bad:
        raise ValueError(f"cannot fuse {what} into {', '.join(bad)}: not {rule}")
    net = copy.deepcopy(net)
    by_name = {l.name: l for l in net.layers}
    return net, [(by_name[c], by_name[pairs[c]]) for c in which]


def fuse_pool(net, which=None):
    """`net` with each conv named in `which` (all fusable ones when None) and its pool folded
    into one conv_pool layer named after the conv; `fused` records the pool (after any
    activation already fused into the conv). Names not fusable are an error."""
    net, chosen = _chosen(net, fusable_pools(net), which, "a pool",
                          "a conv whose only consumer is a max/avg pool")
    removed = {}
    for c, p in chosen:
        kind = "max" if p.op == "maxpool" else "avg"
        c.attrs = dict(c.attrs, pool=pool_attrs(kind, p.attrs))
        c.op = "conv_pool"
        c.out_shape, c.params = infer("conv_pool", c.attrs, c.in_shapes)
        assert tuple(c.out_shape) == tuple(p.out_shape), (c.out_shape, p.out_shape)
        c.fused.append(p.name)
        removed[p.name] = c.name
    _rename(net, removed)
    return net


def fusable_residuals(net):
    """[(conv name, add name)]: an add of two different tensors where one is made by a conv
    with no act (nor residual of its own) whose only consumer is the add and whose output is
    not a network output. Of two such convs the later one (in the network's order) is taken,
    so that the fused layer needs nothing moved: the add's other input is already there."""
    by_name = {l.name: l for l in net.layers}
    pos = {l.name: i for i, l in enumerate(net.layers)}
    users = consumers(net)
    out = []
    for l in net.layers:
        if l.op != "add" or len(l.inputs) != 2 or l.inputs[0] == l.inputs[1]:
            continue
        for t in sorted(l.inputs, key=lambda t: -pos.get(t, -1)):
            p = by_name.get(t)
            if (p is not None and p.op == "conv" and p.attrs.get("act") == "none"
                    and not p.attrs.get("residual") and users.get(p.name) == [l.name]
                    and p.name not in net.outputs):
                out.append((p.name, l.name))
                break
    return out


def residual_layer(conv, add):
    """The conv that computes act(conv(x) + bias + r): `conv` reading the add's other input r
    as its second input, with the add's act (a copy; `fused` records the add and what was
    fused into it)."""
    c = copy.deepcopy(conv)
    r = [t for t in add.inputs if t != conv.name][0]
    c.attrs = dict(c.attrs, residual=True, **act_attrs(add.attrs))
    c.inputs = [conv.inputs[0], r]
    c.in_shapes = [tuple(conv.in_shapes[0]), tuple(add.out_shape)]
    c.out_shape, c.params = infer("conv", c.attrs, c.in_shapes)
    assert tuple(c.out_shape) == tuple(add.out_shape), (c.out_shape, add.out_shape)
    c.fused += [add.name] + add.fused
    return c


def fuse_residual(net, which=None):
    """`net` with each conv named in `which` (all fusable ones when None) and the add it feeds
    folded into one conv layer named after the conv (residual_layer), in the add's place in the
    order. Names not fusable are an error."""
    net, chosen = _chosen(net, fusable_residuals(net), which, "a residual add",
                          "a conv without act whose only consumer is an add of two tensors")
    fused = {a.name: residual_layer(c, a) for c, a in chosen}
    convs = {c.name for c, _ in chosen}
    # the fused layer runs where the add ran: after both of its inputs
    net.layers = [fused.get(l.name, l) for l in net.layers if l.name not in convs]
    _rename(net, {a: c.name for a, c in fused.items()})
    return net


def fusable_dwpw(net):
    """[(depthwise conv name, pointwise conv name)]: a depthwise conv (groups == input channels
    == output channels; any kernel, stride, pad, dilation; its bias and act) with no residual,
    whose only consumer is a pointwise conv (1x1, stride 1, no padding, one group; its bias,
    act and a fused residual allowed) reading it as its first input, neither a network
    output."""
    by_name = {l.name: l for l in net.layers}
    users = consumers(net)
    out = []
    for l in net.layers:
        if l.op != "conv" or not l.inputs:
            continue
        d = by_name.get(l.inputs[0])
        if (d is not None and d.op == "conv" and users.get(d.name) == [l.name]
                and l.inputs.count(d.name) == 1 and d.name not in net.outputs
                and l.name not in net.outputs
                and dwpw_reason(d.attrs, l.attrs, d.in_shape[1]) is None):
            out.append((d.name, l.name))
    return out


def dwpw_layer(dw, pw):
    """The conv_dwpw layer of depthwise conv `dw` and pointwise conv `pw` (a copy of `pw`):
    `pw`'s attrs plus `dw`, reading `dw`'s input (then `pw`'s residual), its parameters dw_weight
    and dw_bias `dw`'s weight and bias (Layer.origins); `fused` records `dw` and what was fused
    into it, after what was fused into `pw`."""
    f = copy.deepcopy(pw)
    f.op = "conv_dwpw"
    f.attrs = dict(pw.attrs, dw=dw_attrs(dw.attrs))
    f.inputs = [dw.inputs[0]] + list(pw.inputs[1:])
    f.in_shapes = [tuple(dw.in_shapes[0])] + [tuple(s) for s in pw.in_shapes[1:]]
    f.out_shape, f.params = infer("conv_dwpw", f.attrs, f.in_shapes)
    assert tuple(f.out_shape) == tuple(pw.out_shape), (f.out_shape, pw.out_shape)
    f.origins = dict(pw.origins)
    f.origins.update({"dw_" + t: param_origin(dw, t) for t, _ in dw.params})
    f.fused = list(pw.fused) + [dw.name] + list(dw.fused)
    return f


def fuse_dwpw(net, which=None):
    """`net` with each pointwise conv named in `which` (all fusable ones when None) and the
    depthwise conv before it folded into one conv_dwpw layer named after the pointwise conv
    (dwpw_layer), in its place in the order. Names not fusable are an error."""
    net, chosen = _chosen(net, [(pw, dw) for dw, pw in fusable_dwpw(net)], which,
                          "a depthwise conv",
                          "a pointwise conv whose input is a depthwise conv read by it alone")
    fused = {pw.name: dwpw_layer(dw, pw) for pw, dw in chosen}
    gone = {dw.name for _, dw in chosen}
    net.layers = [fused.get(l.name, l) for l in net.layers if l.name not in gone]
    return net


def resolve_alias(net, tensor):
    """The tensor whose buffer holds `tensor` (following flatten/dropout back)."""
    while not net.is_input(tensor):
        l = net.layer(tensor)
        if not is_alias(l):
            break
        tensor = l.inputs[0]
    return tensor


def optimise(net):
    """All graph passes, in order: activations into their producers (a batchnorm's too), then
    batchnorms into the conv or dense before them (which so takes the batchnorm's act)."""
    return fold_batchnorm(fuse_activations(net))

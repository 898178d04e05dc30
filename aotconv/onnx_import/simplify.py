"""Rewrites of the folded graph into the forms aotconv's ops express, each exact:

- Identity, Dropout at inference, Cast to the same type, single-input Concat/Sum, and
  Reshape/Flatten/Squeeze/Unsqueeze that leave the 4-D view unchanged are removed;
- BatchNormalization followed by a per-channel constant Mul/Add takes them into its scale
  and bias;
- a constant-zero Pad before a Conv or AveragePool (or before a MaxPool: -inf, or zero on a
  Relu output) becomes the consumer's padding;
- MatMul by a constant matrix becomes Gemm; Gemm followed by a constant row Add takes it as
  its bias; a Flatten/Reshape to [N, F] before a Gemm is dropped (a dense layer flattens
  its input in C, H, W order itself);
- patterns of several nodes become one internal node (Node.internal) that mapping.INTERNAL
  maps: Reshape [N, C, H, W] -> [N, G, C/G, H, W], Transpose (0, 2, 1, 3, 4), Reshape back
  (ShuffleNet's channel shuffle) is ChannelShuffle(groups=G); a Split along the channels is
  one ChannelSlice(start, end) per output, and so is a Slice of the channels alone with step
  1, and so is a SequenceAt of a SplitToSequence of the channels; Mul(x, Sigmoid(x)) is Silu;
  Flatten(x, axis k), Softmax or LogSoftmax over its last axis, Reshape back to x's shape (what
  the version converter writes for a Softmax before opset 13, which normalises over every axis
  from k on) is SoftmaxAxes(first=k, log); Transpose(perm), Softmax or LogSoftmax over the last
  axis, Transpose back (PyTorch's export of softmax(dim) before opset 13) is a Softmax or
  LogSoftmax over axis perm[-1] of the untransposed tensor.

A node these rules do not fit is left as it is, and mapping reports it.
"""
import numpy as np

from .ir import DEFAULT_DOMAINS, Node
from .shapes import embed, flat_shape

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def run(g):
    remove_identities(g)
    coerced_softmax(g)
    transposed_softmax(g)
    fold_batchnorm_affine(g)
    merge_pads(g)
    gemm_forms(g)
    channel_shuffles(g)
    channel_slices(g)
    sequence_slices(g)
    silu(g)
    remove_identities(g)
    prune_dead(g)
    return g


def _std(n):
    return n.domain in DEFAULT_DOMAINS and not n.internal


def _single_consumer(g, t):
    """The one node reading tensor `t`, if exactly one does and `t` is no graph output."""
    users = g.consumers().get(t, [])
    if len(users) != 1 or t in g.output_tensors():
        return None
    return users[0]


def _bypass(g, n, src, out):
    """Remove node `n`, whose output `out` equals its input `src`. False when `out` is a
    graph output that would become a graph input itself: the node then stays."""
    if out in g.output_tensors() and src in g.inputs:
        return False
    g.replace_uses(out, src)
    g.nodes.remove(n)
    return True


def is_identity(g, n):
    """True when node `n` passes its first input through unchanged (at inference)."""
    if not _std(n):
        return False
    x, y = n.input(0), (n.outputs[0] if n.outputs else None)
    if x is None or not y:
        return False
    if n.op == "Identity":
        return True
    if n.op == "Dropout":
        training = g.const(n.input(2))
        if n.input(2) and (training is None or bool(np.asarray(training).any())):
            return False
        mask = n.outputs[1] if len(n.outputs) > 1 else ""
        return not (mask and (mask in g.consumers() or mask in g.output_tensors()))
    if n.op == "Cast":
        return g.dtypes.get(x) is not None and n.attr("to") == g.dtypes.get(x) \
            and n.attr("saturate", 1) == 1
    if n.op in ("Concat", "Sum"):
        return len([t for t in n.inputs if t]) == 1
    if n.op in RESHAPES and not g.is_const(x) and g.view(n, 0) and y in g.shapes:
        a, b = embed(g.view(n, 0)), embed(g.shapes[y])
        return a is not None and a == b
    return False


def remove_identities(g):
    for n in list(g.nodes):
        if is_identity(g, n) and not g.is_const(n.input(0)):
            _bypass(g, n, n.input(0), n.outputs[0])


# ---------------------------------------------------------------------------------------------
# BatchNormalization + per-channel Mul/Add


def _per_channel(const, shape):
    """`const` as a vector over the channels of a tensor of `shape` when broadcasting it
    there scales or shifts each channel by one value; else None."""
    if const is None or shape is None or const.dtype.kind != "f" or len(shape) < 2:
        return None
    r, c = len(shape), shape[1]
    if const.ndim > r:
        return None
    full = (1,) * (r - const.ndim) + const.shape
    if full[0] != 1 or any(d != 1 for d in full[2:]) or full[1] not in (1, c):
        return None
    return np.broadcast_to(const.reshape(-1).astype(np.float64), (c,)).copy()


def fold_batchnorm_affine(g):
    for bn in [n for n in g.nodes if n.op == "BatchNormalization" and _std(n)]:
        if len([t for t in bn.outputs if t]) != 1 or bn.attr("training_mode", 0):
            continue
        if not all(g.is_const(bn.input(i)) for i in range(1, 5)):
            continue
        while True:
            y = bn.outputs[0]
            nxt = _single_consumer(g, y)
            if nxt is None or nxt.op not in ("Mul", "Add") or not _std(nxt):
                break
            if len(nxt.inputs) != 2 or nxt.inputs.count(y) != 1:
                break
            i = nxt.inputs.index(y)
            seen = g.view(nxt, i)
            v = _per_channel(g.const(nxt.inputs[1 - i]), seen)
            if v is None or g.shapes.get(nxt.outputs[0]) != seen:
                break
            scale, bias = (np.asarray(g.consts[bn.input(i)], np.float64) for i in (1, 2))
            if nxt.op == "Mul":
                scale, bias = scale * v, bias * v
            else:
                bias = bias + v
            for i, a in ((1, scale), (2, bias)):
                # named after the folded node's output: tensor names are unique, node
                # names need not be
                t = f"{nxt.outputs[0]}::{'scale' if i == 1 else 'bias'}"
                g.consts[t] = a.astype(np.float32)
                bn.inputs[i] = t
            bn.outputs[0] = nxt.outputs[0]
            bn.merged.append(nxt.name)
            g.nodes.remove(nxt)


# ---------------------------------------------------------------------------------------------
# Pad into the next Conv / pool


def _pad_amounts(g, p):
    """Full [begins..., ends...] pads of Pad node `p` over its input's axes, its constant
    value and mode; None where they are not constants."""
    shape = g.view(p, 0)
    pads = g.const(p.input(1))
    if shape is None or pads is None:
        return None
    r = len(shape)
    pads = [int(v) for v in np.asarray(pads).reshape(-1)]
    axes = g.const(p.input(3))
    if p.input(3) and axes is None:
        return None
    axes = (list(range(r)) if axes is None
            else [int(a) % r for a in np.asarray(axes).reshape(-1)])
    if len(pads) != 2 * len(axes):
        return None
    full = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a], full[r + a] = pads[i], pads[len(axes) + i]
    value = g.const(p.input(2))
    if p.input(2) and value is None:
        return None
    value = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.size(value) else 0.0
    return full, value, p.attr("mode", "constant")


def merge_pads(g):
    producers = g.producers()
    for p in [n for n in g.nodes if n.op == "Pad" and _std(n)]:
        got = _pad_amounts(g, p)
        nxt = _single_consumer(g, p.outputs[0])
        if got is None or nxt is None or nxt.op not in ("Conv", "MaxPool", "AveragePool") \
                or not _std(nxt) or nxt.input(0) != p.outputs[0]:
            continue
        full, value, mode = got
        r = len(full) // 2
        if mode != "constant" or full[0] or full[1] or full[r] or full[r + 1] \
                or any(v < 0 for v in full):
            continue
        if nxt.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            continue
        own = list(nxt.attr("pads", [0] * (2 * (r - 2))))
        if nxt.op == "Conv" and value != 0.0:
            continue
        if nxt.op == "AveragePool":
            if value != 0.0 or (any(own) and not nxt.attr("count_include_pad", 0)):
                continue
            nxt.attrs["count_include_pad"] = 1
        if nxt.op == "MaxPool":
            src = producers.get(p.input(0))
            relu_zero = value == 0.0 and src is not None and src.op == "Relu"
            if not (value == -np.inf or relu_zero):
                continue
        s = r - 2
        nxt.attrs["pads"] = [own[i] + full[2 + i] for i in range(s)] + \
                            [own[s + i] + full[r + 2 + i] for i in range(s)]
        nxt.attrs["auto_pad"] = "NOTSET"
        nxt.inputs[0] = p.input(0)
        nxt.merged.append(p.name)
        g.nodes.remove(p)


# ---------------------------------------------------------------------------------------------
# MatMul / Gemm / bias / flatten


def _row_vector(const, n_out):
    """A constant that broadcasts onto [M, n_out] the same for every row, as [n_out]."""
    if const is None or const.dtype.kind != "f" or const.ndim > 2:
        return None
    full = (1,) * (2 - const.ndim) + const.shape
    if full[0] != 1 or full[1] not in (1, n_out):
        return None
    return np.broadcast_to(const.reshape(-1).astype(np.float64), (n_out,)).copy()


def gemm_forms(g):
    for n in [n for n in g.nodes if n.op == "MatMul" and _std(n)]:
        a, b = n.input(0), g.const(n.input(1))
        if b is not None and b.ndim == 2 and len(g.view(n, 0) or ()) == 2 \
                and not g.is_const(a):
            n.op, n.attrs = "Gemm", {}
    for n in [n for n in g.nodes if n.op == "Gemm" and _std(n)]:
        _absorb_bias(g, n)
        _skip_flatten(g, n)


def _absorb_bias(g, n):
    while True:
        y = n.outputs[0]
        nxt = _single_consumer(g, y)
        if nxt is None or nxt.op != "Add" or not _std(nxt) or len(nxt.inputs) != 2 \
                or nxt.inputs.count(y) != 1:
            return
        i = nxt.inputs.index(y)
        shape = g.view(nxt, i)
        if shape is None or len(shape) != 2 or g.shapes.get(nxt.outputs[0]) != shape:
            return
        v = _row_vector(g.const(nxt.inputs[1 - i]), shape[1])
        c = g.const(n.input(2))
        if v is None or (n.input(2) and c is None):
            return
        old = np.zeros(shape[1]) if c is None else _row_vector(c, shape[1])
        if old is None:
            return
        t = f"{nxt.outputs[0]}::bias"
        g.consts[t] = (float(n.attr("beta", 1.0)) * old + v).astype(np.float32)
        n.inputs = (n.inputs + ["", ""])[:2] + [t]
        n.attrs["beta"] = 1.0
        n.outputs[0] = nxt.outputs[0]
        n.merged.append(nxt.name)
        g.nodes.remove(nxt)


def _skip_flatten(g, n):
    a = n.input(0)
    prod = g.producers().get(a)
    if prod is None or prod.op not in ("Flatten", "Reshape") or not _std(prod):
        return
    x = prod.input(0)
    if g.is_const(x) or not g.view(prod, 0) or a not in g.shapes:
        return
    if g.shapes[a] != flat_shape(g.shapes[x]) or g.view(prod, 0) != g.shapes[x]:
        return
    n.inputs[0] = x
    n.merged.append(prod.name)
    if not g.consumers().get(a) and a not in g.output_tensors():
        g.nodes.remove(prod)


# ---------------------------------------------------------------------------------------------
# patterns of several nodes: channel shuffle, channel split, SiLU


def _internal(op, like, inputs, outputs, attrs, merged, label=None):
    """An internal node standing for `like` and the nodes named in `merged`."""
    return Node(name=like.name, op=op, inputs=list(inputs), outputs=list(outputs),
                attrs=attrs, opset=like.opset, domain="",
                merged=list(merged) + list(like.merged), internal=True, label=label)


def channel_shuffles(g):
    for t in [n for n in g.nodes if n.op == "Transpose" and _std(n)]:
        producers = g.producers()
        r1 = producers.get(t.input(0))
        r2 = _single_consumer(g, t.outputs[0]) if t.outputs else None
        if r1 is None or r2 is None or r1.op != "Reshape" or r2.op != "Reshape" \
                or not (_std(r1) and _std(r2)) or r2.input(0) != t.outputs[0] \
                or _single_consumer(g, r1.outputs[0]) is not t:
            continue
        x, xs = r1.input(0), g.view(r1, 0)
        mid, ys = g.shapes.get(r1.outputs[0]), g.shapes.get(r2.outputs[0])
        if x is None or g.is_const(x) or xs is None or mid is None or ys is None \
                or len(xs) != 4 or len(mid) != 5 or tuple(ys) != tuple(xs):
            continue
        n, c, h, w = xs
        groups = int(mid[1])
        if groups < 1 or tuple(mid) != (n, groups, c // groups, h, w) or c % groups:
            continue
        perm = t.attr("perm")
        if perm is None or [int(v) for v in perm] != [0, 2, 1, 3, 4]:
            continue
        node = _internal("ChannelShuffle", t, [x], r2.outputs, {"groups": groups},
                         [r1.name, r2.name] + r1.merged + r2.merged)
        node.seen = {0: r1.seen.get(0, x)}
        g.nodes[g.nodes.index(r1)] = node
        g.nodes.remove(t)
        g.nodes.remove(r2)


def _slice_bounds(g, n, shape):
    """[(start, end)] per axis of a Slice node with constant operands and step 1, clamped as
    ONNX specifies; None where they are not constants or a step is not 1."""
    r = len(shape)
    starts, ends = g.const(n.input(1)), g.const(n.input(2))
    axes = g.const(n.input(3)) if n.input(3) else np.arange(r if starts is None else
                                                            np.size(starts))
    steps = g.const(n.input(4)) if n.input(4) else None
    if starts is None or ends is None or axes is None or (n.input(4) and steps is None):
        return None
    starts, ends, axes = (np.asarray(v).reshape(-1).astype(np.int64).tolist()
                          for v in (starts, ends, axes))
    if len(starts) != len(ends) or len(starts) != len(axes):
        return None
    if steps is not None and any(int(v) != 1 for v in np.asarray(steps).reshape(-1)):
        return None
    bounds = [(0, d) for d in shape]
    seen = set()
    for a, b, e in zip(axes, starts, ends):
        a = a % r
        if a in seen:
            return None
        seen.add(a)
        d = shape[a]
        b, e = (v + d if v < 0 else v for v in (b, e))
        bounds[a] = (min(max(b, 0), d), min(max(e, 0), d))
    return bounds


def channel_slices(g):
    for n in [n for n in g.nodes if n.op in ("Split", "Slice") and _std(n)]:
        x, shape = n.input(0), g.view(n, 0)
        if x is None or g.is_const(x) or shape is None or not 2 <= len(shape) <= 4:
            continue
        used = set(g.consumers()) | g.output_tensors()
        if n.op == "Split":
            if int(n.attr("axis", 0)) % len(shape) != 1:
                continue
            outs = [g.shapes.get(t) for t in n.outputs]
            if any(s is None or len(s) != len(shape) for s in outs) \
                    or sum(s[1] for s in outs) != shape[1] \
                    or any(tuple(s[:1]) + tuple(s[2:]) != tuple(shape[:1]) + tuple(shape[2:])
                           for s in outs):
                continue
            starts = [sum(s[1] for s in outs[:i]) for i in range(len(outs))]
            pieces = [(i, t, b, b + s[1]) for i, (t, b, s) in enumerate(zip(n.outputs, starts,
                                                                            outs))
                      if t and t in used]
        else:
            bounds = _slice_bounds(g, n, shape)
            y = n.outputs[0] if n.outputs else None
            if bounds is None or not y or any(bounds[a] != (0, shape[a])
                                              for a in range(len(shape)) if a != 1):
                continue
            b, e = bounds[1]
            if e <= b or g.shapes.get(y) != tuple(shape[:1]) + (e - b,) + tuple(shape[2:]):
                continue
            pieces = [(0, y, b, e)]
        i = g.nodes.index(n)
        new = [_internal("ChannelSlice", n, [x], [t], {"start": b, "end": e}, [],
                         label=None if n.op == "Slice" else f"{n.name}:{k}")
               for k, t, b, e in pieces]
        for m in new:
            m.seen = {0: n.seen.get(0, x)}
        g.nodes[i:i + 1] = new


def _sequence_piece(g, at):
    """(x, start, end) where SequenceAt node `at` takes one piece of a SplitToSequence of x's
    channels (constant split, constant position); else None."""
    sp = g.producers().get(at.input(0))
    pos = g.const(at.input(1))
    if sp is None or sp.op != "SplitToSequence" or not _std(sp) or pos is None \
            or np.size(pos) != 1:
        return None
    x, shape = sp.input(0), g.view(sp, 0)
    if x is None or g.is_const(x) or shape is None or not 2 <= len(shape) <= 4 \
            or int(sp.attr("axis", 0)) % len(shape) != 1:
        return None
    c = shape[1]
    split = g.const(sp.input(1)) if sp.input(1) else None
    if sp.input(1) and split is None:
        return None
    if split is None:
        if not int(sp.attr("keepdims", 1)):          # pieces of one channel, axis dropped
            return None
        sizes = [1] * c
    elif np.ndim(split) == 0:
        k = int(split)
        if k < 1:
            return None
        sizes = [k] * (c // k) + ([c % k] if c % k else [])
    else:
        sizes = [int(v) for v in np.asarray(split).reshape(-1)]
    if sum(sizes) != c or any(v < 1 for v in sizes):
        return None
    i = int(np.asarray(pos).reshape(-1)[0])
    i = i + len(sizes) if i < 0 else i
    if not 0 <= i < len(sizes):
        return None
    start = sum(sizes[:i])
    y = at.outputs[0] if at.outputs else None
    if not y or g.shapes.get(y) != tuple(shape[:1]) + (sizes[i],) + tuple(shape[2:]):
        return None
    return sp, x, start, start + sizes[i]


def sequence_slices(g):
    """SequenceAt(SplitToSequence(x) of the channels, constant position) is a ChannelSlice
    (the dynamo exporter's x.chunk before its optimiser); the sequence, once nothing reads it,
    is dropped as dead."""
    for at in [n for n in g.nodes if n.op == "SequenceAt" and _std(n)]:
        got = _sequence_piece(g, at)
        if got is None:
            continue
        sp, x, start, end = got
        node = _internal("ChannelSlice", at, [x], at.outputs, {"start": start, "end": end},
                         [sp.name])
        node.seen = {0: sp.seen.get(0, x)}
        g.nodes[g.nodes.index(at)] = node


def silu(g):
    for m in [n for n in g.nodes if n.op == "Mul" and _std(n)]:
        ins = [t for t in m.inputs]
        if len(ins) != 2 or ins[0] == ins[1] or not all(ins):
            continue
        producers = g.producers()
        for i in (0, 1):
            s = producers.get(ins[i])
            if s is None or s.op != "Sigmoid" or not _std(s) or s.input(0) != ins[1 - i] \
                    or _single_consumer(g, ins[i]) is not m \
                    or g.shapes.get(ins[i]) != g.shapes.get(m.outputs[0]):
                continue
            node = _internal("Silu", m, [ins[1 - i]], m.outputs, {}, [s.name] + s.merged)
            node.seen = {0: m.seen.get(1 - i, ins[1 - i])}
            g.nodes[g.nodes.index(m)] = node
            g.nodes.remove(s)
            break


def coerced_softmax(g):
    for sm in [n for n in g.nodes if n.op in ("Softmax", "LogSoftmax") and _std(n)]:
        f = g.producers().get(sm.input(0))
        if f is None or f.op != "Flatten" or not _std(f) \
                or _single_consumer(g, f.outputs[0]) is not sm:
            continue
        x, xs, flat = f.input(0), g.view(f, 0), g.shapes.get(f.outputs[0])
        if x is None or g.is_const(x) or xs is None or flat is None or len(flat) != 2 \
                or int(sm.attr("axis", -1)) not in (1, -1) or not sm.outputs:
            continue
        rs = _single_consumer(g, sm.outputs[0])
        if rs is None or rs.op != "Reshape" or not _std(rs) or rs.input(0) != sm.outputs[0] \
                or g.shapes.get(rs.outputs[0]) != tuple(xs):
            continue
        r, k = len(xs), int(f.attr("axis", 1))
        k = k + r if k < 0 else k
        if not 0 <= k < r:
            continue
        node = _internal("SoftmaxAxes", sm, [x], rs.outputs,
                         {"first": k, "log": sm.op == "LogSoftmax"},
                         [f.name, rs.name] + f.merged + rs.merged)
        node.seen = {0: f.seen.get(0, x)}
        g.nodes[g.nodes.index(sm)] = node
        g.nodes.remove(f)
        g.nodes.remove(rs)


def transposed_softmax(g):
    for sm in [n for n in g.nodes if n.op in ("Softmax", "LogSoftmax") and _std(n)]:
        t1 = g.producers().get(sm.input(0))
        if t1 is None or t1.op != "Transpose" or not _std(t1) \
                or _single_consumer(g, t1.outputs[0]) is not sm or not sm.outputs:
            continue
        x, xs = t1.input(0), g.view(t1, 0)
        t2 = _single_consumer(g, sm.outputs[0])
        if x is None or g.is_const(x) or xs is None or t2 is None or t2.op != "Transpose" \
                or not _std(t2) or t2.input(0) != sm.outputs[0]:
            continue
        r = len(xs)
        p1 = [int(v) for v in t1.attr("perm", range(r - 1, -1, -1))]
        p2 = [int(v) for v in t2.attr("perm", range(r - 1, -1, -1))]
        if sorted(p1) != list(range(r)) or [p1[i] for i in p2] != list(range(r)) \
                or int(sm.attr("axis", -1)) % r != r - 1:
            continue
        node = Node(name=sm.name, op=sm.op, inputs=[x], outputs=list(t2.outputs),
                    attrs={"axis": p1[-1]}, opset=sm.opset, domain=sm.domain,
                    merged=[t1.name, t2.name] + t1.merged + sm.merged + t2.merged,
                    seen={0: t1.seen.get(0, x)})
        g.nodes[g.nodes.index(sm)] = node
        g.nodes.remove(t1)
        g.nodes.remove(t2)


def prune_dead(g):
    """Drop nodes none of whose outputs reach a graph output (unused branches)."""
    live = set(g.output_tensors())
    keep = []
    for n in reversed(g.nodes):
        if any(t in live for t in n.outputs if t):
            keep.append(n)
            live.update(t for t in n.inputs if t)
    g.nodes = keep[::-1]

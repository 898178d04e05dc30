"""ONNX nodes -> net.yaml layers, one node (with what simplify merged into it) per layer.

Each supported op has one function that reads the node's attributes and constant operands
and returns the layer's keys and tensors, or says, per attribute, what does not fit. A node
maps only where aotconv's op computes exactly what ONNX specifies for every attribute value
it has; anything else is reported, never approximated. Attributes a function does not know
are reported too, so a newer ONNX attribute cannot slip through with its default ignored.
"""
from dataclasses import dataclass, field
import numpy as np

from .ir import DEFAULT_DOMAINS
from .resize import KNOWN_ATTRS as RESIZE_ATTRS
from .shapes import embed, flat_shape
from .simplify import is_identity

FLOAT = 1          # TensorProto.FLOAT


class _Bad(Exception):
    """Stops mapping a node whose problems are already recorded."""


@dataclass
class Mapped:
    layer: dict                        # net.yaml keys other than name and inputs
    inputs: list                       # run-time tensors it reads
    tensors: dict = field(default_factory=dict)     # aotconv tensor name -> float32 array
    # layers that follow this one, each reading the one before, the last giving the node's
    # output: [(name suffix, net.yaml keys)]; then `shape` is the first layer's output (4-D)
    after: list = field(default_factory=list)
    shape: tuple = None


class _Node:
    """One node being mapped: its graph, and the problems found so far."""

    def __init__(self, n, g):
        self.n, self.g, self.problems = n, g, []

    def bad(self, attr, message):
        self.problems.append((attr, message))

    def stop(self, attr=None, message=None):
        if message:
            self.bad(attr, message)
        raise _Bad()

    def attr(self, name, default=None):
        return self.n.attrs.get(name, default)

    def value(self, i, what="input"):
        """Run-time input i: its ONNX shape (rank 2 to 4, float32, static)."""
        t = self.n.input(i)
        g = self.g
        if t is None:
            self.stop(f"input {i}", "missing")
        if g.is_const(t):
            self.stop(f"input {i}", f"is a constant; aotconv's layers compute on the network "
                                    f"input, so the {what} must be computed from it")
        shape = g.view(self.n, i)
        if shape is None:
            self.stop(f"input {i}", f"tensor {t!r} has no static shape after shape inference")
        if g.dtypes.get(t, FLOAT) != FLOAT:
            self.stop(f"input {i}", "is not float32; aotconv computes in float32")
        if embed(shape) is None:
            self.stop(f"input {i}", f"has rank {len(shape)} {list(shape)}; aotconv maps "
                                    f"tensors of rank 2 to 4 ([N, F], [N, C, L], [N, C, H, W])")
        return shape

    def constant(self, i, what, optional, why):
        """Constant input i as an array of any type, or None where it is absent and optional;
        `why` says what aotconv compiles it into."""
        t = self.n.input(i)
        if t is None:
            if optional:
                return None
            self.stop(what, "missing")
        a = self.g.const(t)
        if a is None:
            self.stop(what, f"must be a constant (an initializer, or computed from constants "
                            f"only); {why}")
        return np.asarray(a)

    def const(self, i, what, optional=False):
        """Constant input i as a float array, or None where it is absent and optional."""
        a = self.constant(i, what, optional, f"aotconv bakes {what} into the library's "
                                             f"parameters")
        if a is None:
            return None
        if a.dtype.kind != "f":
            self.stop(what, f"has type {a.dtype}; expected float")
        if not np.all(np.isfinite(a)):
            self.stop(what, "holds NaN or infinite values")
        return a

    def ints(self, name, n, default):
        v = self.attr(name)
        if v is None:
            return [default] * n
        v = [int(x) for x in v]
        if len(v) != n:
            self.stop(name, f"has {len(v)} values; expected {n}")
        return v


def _f32(v):
    """A float attribute (float32 in ONNX) as the shortest decimal that reads back the same."""
    return float(str(np.float32(v)))


def map_node(n, g):
    """(Mapped, []) for node `n`, or (None, [(attr, message), ...])."""
    c = _Node(n, g)
    try:
        if n.domain not in DEFAULT_DOMAINS:
            c.stop(None, f"op from domain '{n.domain}'; aotconv imports the standard ONNX "
                         f"ops listed in docs/onnx.md")
        if is_identity(g, n):
            c.value(0)
            return Mapped({"op": "dropout"}, [n.input(0)]), []
        fn = INTERNAL[n.op] if n.internal else OPS.get(n.op)
        if fn is None:
            c.stop(None, f"aotconv has no {n.op}; it imports {', '.join(sorted(OPS))}")
        known = set(n.attrs) if n.internal else KNOWN_ATTRS[n.op]
        for a in n.attrs:
            if a not in known:
                c.bad(a, f"is not an attribute aotconv's {n.op} mapping knows (it reads "
                         f"{', '.join(sorted(known)) or 'none'})")
        out = n.outputs[0] if n.outputs else ""
        if not out or out not in g.shapes:
            c.stop("output", "has no static shape after shape inference")
        if embed(g.shapes[out]) is None:
            c.stop("output", f"has rank {len(g.shapes[out])}; aotconv maps tensors of rank 2 "
                             f"to 4")
        used = set(g.consumers()) | g.output_tensors()
        for i, t in enumerate(n.outputs[1:] if n.op != "Split" else [], 1):
            if t and t in used:
                c.bad(f"output {i}", f"'{t}' is used; aotconv computes only the first output "
                                     f"of {n.op}")
        m = fn(c)
        if c.problems:
            raise _Bad()
        return m, []
    except _Bad:
        return None, c.problems


# ---------------------------------------------------------------------------------------------
# windows: kernel, stride, dilation, padding


def _same_pads(size, k, s, d, lower):
    """ONNX SAME_UPPER / SAME_LOWER padding of one axis: (begin, end). The specification's
    total can come out negative (a stride longer than the window): both are then negative."""
    out = -(-size // s)
    total = (out - 1) * s + (k - 1) * d + 1 - size
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def _kernel_shape(c, kernel):
    """Refuses a kernel_shape attribute that differs from the kernel (the weight's)."""
    if c.attr("kernel_shape") is not None and [int(k) for k in c.attr("kernel_shape")] != kernel:
        c.stop("kernel_shape", f"{list(c.attr('kernel_shape'))} differs from the weight's "
                               f"{kernel}")


def _window(c, x_shape, kernel, has_dilation=True):
    """Spatial (kernel, stride, dilation, begins, ends) as 2-D lists, from the attributes."""
    s = len(x_shape) - 2
    if s not in (1, 2):
        c.stop("input 0", f"has {s} spatial axes; aotconv maps 1-D and 2-D windows")
    _kernel_shape(c, kernel)
    stride = c.ints("strides", s, 1)
    dil = c.ints("dilations", s, 1) if has_dilation else [1] * s
    auto = c.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pairs = [_same_pads(x_shape[2 + i], kernel[i], stride[i], dil[i], auto == "SAME_LOWER")
                 for i in range(s)]
        begins, ends = [p[0] for p in pairs], [p[1] for p in pairs]
    elif auto == "VALID":
        begins, ends = [0] * s, [0] * s
    elif auto == "NOTSET":
        pads = c.ints("pads", 2 * s, 0)
        begins, ends = pads[:s], pads[s:]
    else:
        c.stop("auto_pad", f"unknown value {auto!r}")
    if any(p < 0 for p in begins + ends):
        what = "auto_pad" if auto in ("SAME_UPPER", "SAME_LOWER") else "pads"
        c.stop(what, f"gives negative padding {begins + ends} (a stride longer than the "
                     f"window): aotconv pads, never crops, and onnxruntime refuses it too")
    pad1 = [1] * (2 - s)
    return (kernel + pad1, stride + pad1, dil + pad1, begins + [0] * (2 - s),
            ends + [0] * (2 - s))


def _size(v):
    return v[0] if v[0] == v[1] else list(v)


# ---------------------------------------------------------------------------------------------
# the ops


def _conv(c):
    x = c.value(0, "data")
    w = c.const(1, "W")
    b = c.const(2, "B", optional=True)
    if w.ndim != len(x):
        c.stop("W", f"has rank {w.ndim}; the input has rank {len(x)}")
    g = int(c.attr("group", 1))
    m, cg = w.shape[0], w.shape[1]
    if g < 1 or x[1] % g or m % g or cg * g != x[1]:
        c.stop("group", f"group {g} does not fit {x[1]} input channels and weight "
                        f"{list(w.shape)}")
    if b is not None and b.shape != (m,):
        c.stop("B", f"has shape {list(b.shape)}; expected [{m}]")
    kernel = [int(k) for k in w.shape[2:]]
    k2, s2, d2, begins, ends = _window(c, x, kernel)
    x2 = embed(x)
    layer = {"op": "conv", "out": int(m), "kernel": _size(k2)}
    if s2 != [1, 1]:
        layer["stride"] = _size(s2)
    if begins != ends:
        same = [_same_pads(x2[2 + i], k2[i], s2[i], d2[i], False) for i in range(2)]
        if [p[0] for p in same] == begins and [p[1] for p in same] == ends:
            layer["pad"] = "same"
        else:
            c.stop("pads", f"asymmetric padding (begin {begins}, end {ends}): aotconv pads a "
                           f"conv symmetrically, or as SAME_UPPER ('same': any odd pixel at "
                           f"the bottom/right)")
    elif begins != [0, 0]:
        layer["pad"] = _size(begins)
    return _conv_mapped(c, layer, d2, g, w.reshape(m, cg, k2[0], k2[1]), b)


def _conv_mapped(c, layer, d2, g, weight, b):
    """A Conv's or ConvTranspose's layer: `layer` with the keys they share (each left out at
    its default), and its tensors."""
    if d2 != [1, 1]:
        layer["dilation"] = _size(d2)
    if g != 1:
        layer["groups"] = g
    if b is None:
        layer["bias"] = False
    tensors = {"weight": weight}
    if b is not None:
        tensors["bias"] = b
    return Mapped(layer, [c.n.input(0)], tensors)


def _pool(c):
    x = c.value(0)
    s = len(x) - 2
    kernel = c.attr("kernel_shape")
    if kernel is None:
        c.stop("kernel_shape", "missing")
    kernel = [int(k) for k in kernel]
    if len(kernel) != s:
        c.stop("kernel_shape", f"has {len(kernel)} values for {s} spatial axes")
    k2, s2, d2, begins, ends = _window(c, x, kernel)
    if d2 != [1, 1]:
        c.bad("dilations", f"{c.attr('dilations')}: aotconv's pools have no dilation")
    ceil = int(c.attr("ceil_mode", 0))
    avg_counts_pad = c.n.op == "AveragePool" and int(c.attr("count_include_pad", 0))
    x2 = embed(x)
    crop, given = None, (list(begins), list(ends))
    if begins != ends:
        # extra padding at the end only (Caffe's ceil mode, as exporters write it) is
        # ceil_mode where both give the same windows: the extra pads hold no input and,
        # unless an average counts them, change nothing
        same = [_pool_out(x2[2 + i], k2[i], s2[i], begins[i], True) ==
                _pool_out(x2[2 + i] + ends[i] - begins[i], k2[i], s2[i], begins[i], False)
                for i in range(2)]
        if not (ceil or avg_counts_pad or any(e < b for b, e in zip(begins, ends))) \
                and all(same):
            ceil = 1
        elif ceil:
            c.stop("pads", f"asymmetric padding (begin {begins}, end {ends}) with ceil_mode: "
                           f"aotconv takes asymmetric pads without ceil_mode, or end pads "
                           f"that equal ceil_mode")
        else:
            begins, crop = _crop_of(c, x2, k2, s2, begins, ends)
    if any(2 * p > k for p, k in zip(begins, k2)):
        if crop is not None or given[0] != given[1]:
            c.stop("pads", f"asymmetric padding (begin {given[0]}, end {given[1]}): padded "
                           f"symmetrically by the larger, {begins}, the pool would pad more "
                           f"than half the window {k2}, which aotconv's pools do not")
        c.stop("pads", f"pads {begins} exceed half the window {k2}: aotconv's pools pad at "
                       f"most half the window")
    op = "maxpool" if c.n.op == "MaxPool" else "avgpool"
    layer = {"op": op, "kernel": _size(k2), "stride": _size(s2)}
    if begins != [0, 0]:
        layer["pad"] = _size(begins)
    if ceil:
        layer["ceil_mode"] = True
    if avg_counts_pad:
        layer["count_include_pad"] = True
    if crop:
        shape = tuple(x2[:2]) + tuple(_pool_out(x2[2 + i], k2[i], s2[i], begins[i], False)
                                      for i in range(2))
        return Mapped(layer, [c.n.input(0)], after=[("crop", {"op": "crop", **crop})],
                      shape=shape)
    return Mapped(layer, [c.n.input(0)])


def _crop_of(c, x2, k2, s2, begins, ends):
    """Pads (begin b, end e) per axis as a pool padded symmetrically by p = max(b, e) whose
    first (p - b) / s and last outputs are then dropped: the windows ONNX has are those of the
    symmetric pool between them, and hold the same input (the extra pads are outside every
    window kept, so neither a max nor an average, counting pads or not, sees them). Returns the
    symmetric pads and the crop's keys (None where nothing is dropped)."""
    sym, crop = [], {}
    for i, (lo_key, hi_key) in enumerate((("top", "bottom"), ("left", "right"))):
        b, e, k, s, size = begins[i], ends[i], k2[i], s2[i], x2[2 + i]
        p = max(b, e)
        if (p - b) % s:
            c.stop("pads", f"asymmetric padding (begin {begins}, end {ends}): the windows "
                           f"start {p - b} after those of a pool padded by {p} on both sides, "
                           f"not a whole number of strides {s}; aotconv pads its pools "
                           f"symmetrically and crops whole outputs")
        lo = (p - b) // s
        hi = _pool_out(size, k, s, p, False) - lo - _pool_out(size + b + e - 2 * p, k, s, p,
                                                               False)
        sym.append(p)
        if lo:
            crop[lo_key] = lo
        if hi:
            crop[hi_key] = hi
    return sym, crop or None


def _pool_out(size, k, s, p, ceil):
    """Pooled size of one axis, padded by p on both sides, as aotconv (PyTorch) counts it:
    with ceil_mode a last window starting in the right padding is dropped."""
    span = size + 2 * p - k
    if span < 0:
        return 0
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _global_avgpool(c):
    x = c.value(0)
    if len(x) < 3:
        c.stop("input 0", f"has rank {len(x)}; GlobalAveragePool needs spatial axes")
    return Mapped({"op": "global_avgpool"}, [c.n.input(0)])


def _reduce_mean(c):
    x = c.value(0)
    r = len(x)
    if c.n.input(1):                          # opset 18: axes as an input
        axes = c.g.const(c.n.input(1))
        if axes is None:
            c.stop("axes", "must be a constant")
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        axes = [int(a) for a in c.attr("axes", [])]
    if not axes:
        c.stop("axes", "empty: averaging over every axis (or, with noop_with_empty_axes, none) "
                       "is not aotconv's global_avgpool, which averages over H and W")
    axes = sorted({a % r for a in axes})
    spatial_left = [a for a in range(2, r) if a not in axes and x[a] != 1]
    if any(a < 2 for a in axes) or spatial_left:
        c.stop("axes", f"{axes} of a rank-{r} tensor {list(x)}: aotconv averages over every "
                       f"spatial axis and nothing else (global_avgpool)")
    return Mapped({"op": "global_avgpool"}, [c.n.input(0)])


def _activation(op):
    def f(c):
        c.value(0)
        layer = {"op": op}
        if op == "leaky_relu":
            layer["alpha"] = _f32(c.attr("alpha", 0.01))
        return Mapped(layer, [c.n.input(0)])
    return f


def _clip(c):
    c.value(0)
    bounds = []
    for i, name in ((1, "min"), (2, "max")):
        v = c.const(i, name, optional=True)
        if v is not None and v.size != 1:
            c.stop(name, f"has shape {list(v.shape)}; expected a scalar")
        bounds.append(None if v is None else _f32(v.reshape(-1)[0]))
    lo, hi = bounds
    if (lo, hi) == (0.0, 6.0):
        return Mapped({"op": "relu6"}, [c.n.input(0)])
    layer = {"op": "clip"}
    if lo is not None:
        layer["min"] = lo
    if hi is not None:
        layer["max"] = hi
    return Mapped(layer, [c.n.input(0)])


def _hardsigmoid(c):
    c.value(0)
    return Mapped({"op": "hardsigmoid", "alpha": _f32(c.attr("alpha", 0.2)),
                   "beta": _f32(c.attr("beta", 0.5))}, [c.n.input(0)])


def _gelu(c):
    c.value(0)
    approx = c.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        c.stop("approximate", f"{approx!r}: the specification knows 'none' and 'tanh'")
    return Mapped({"op": "gelu" if approx == "none" else "gelu_tanh"}, [c.n.input(0)])


def _mul(c):
    ins = [t for t in c.n.inputs if t]
    consts = [t for t in ins if c.g.is_const(t)]
    if consts:
        c.stop("input", f"multiplies by the constant '{consts[0]}': aotconv folds a constant "
                        f"Mul only into the BatchNormalization (per channel) before it")
    a, b = c.value(0), c.value(1)
    if a == b:
        return Mapped({"op": "mul"}, ins)
    if len(a) == len(b):
        for (big, tb), (small, ts) in (((a, ins[0]), (b, ins[1])), ((b, ins[1]), (a, ins[0]))):
            if embed(small) == (big[0], big[1], 1, 1):
                return Mapped({"op": "scale"}, [tb, ts])
    c.stop("input", f"shapes {list(a)} and {list(b)}: aotconv multiplies tensors of one shape "
                    f"(mul), or each [H, W] plane of an [N, C, H, W] tensor by one value of an "
                    f"[N, C, 1, 1] tensor (scale)")


def _softmax(c):
    """Softmax / LogSoftmax over one axis (opset 13)."""
    x = c.value(0)
    axis = int(c.attr("axis", -1))
    if not -len(x) <= axis < len(x):
        c.stop("axis", f"{axis} is not an axis of a rank-{len(x)} tensor {list(x)}")
    return _softmax_layer(c, x, [axis % len(x)])


def _softmax_axes(c):
    """The internal SoftmaxAxes (simplify.coerced_softmax): Softmax / LogSoftmax over every
    axis from `first` on, as opsets before 13 define it."""
    x = c.value(0)
    return _softmax_layer(c, x, list(range(int(c.attr("first")), len(x))))


def _softmax_layer(c, x, axes):
    """A softmax layer over the [N, C, H, W] axes `axes` of x (rank 2 to 4, embedded with
    trailing 1s: ONNX axis i is aotconv's axis i)."""
    log = c.n.op == "LogSoftmax" or bool(c.attr("log", False))
    what = "LogSoftmax" if log else "Softmax"
    if axes[0] == 0:
        over = "axis 0" if len(axes) == 1 else f"axes {axes} (from axis 0 on: before opset 13)"
        c.stop("axis", f"{what} over {over} of {list(x)} normalises across the batch; aotconv "
                       f"keeps the samples of a batch apart (each its own softmax over axes 1 "
                       f"to 3)")
    layer = {"op": "log_softmax" if log else "softmax"}
    if axes != [1]:
        layer["axis"] = axes[0] if len(axes) == 1 else axes
    return Mapped(layer, [c.n.input(0)])


def _conv_transpose(c):
    x = c.value(0, "X")
    w = c.const(1, "W")
    b = c.const(2, "B", optional=True)
    s = len(x) - 2
    if s not in (1, 2):
        c.stop("input 0", f"has {s} spatial axes; aotconv maps 1-D and 2-D transposed "
                          f"convolutions")
    if w.ndim != len(x):
        c.stop("W", f"has rank {w.ndim}; the input has rank {len(x)}")
    g = int(c.attr("group", 1))
    if g < 1 or x[1] % g or w.shape[0] != x[1]:
        c.stop("group", f"group {g} does not fit {x[1]} input channels and weight "
                        f"{list(w.shape)} (C_in, C_out / group, kernel...)")
    m = int(w.shape[1]) * g
    if b is not None and b.shape != (m,):
        c.stop("B", f"has shape {list(b.shape)}; expected [{m}]")
    kernel = [int(k) for k in w.shape[2:]]
    _kernel_shape(c, kernel)
    stride, dil = c.ints("strides", s, 1), c.ints("dilations", s, 1)
    out_pad = c.ints("output_padding", s, 0)
    if any(v < 1 for v in stride + dil) or any(v < 0 for v in out_pad):
        c.stop("strides", f"strides {stride}, dilations {dil} must be >= 1 and output_padding "
                          f"{out_pad} >= 0")
    begins, ends = _transpose_pads(c, x, kernel, stride, dil, out_pad)
    if any(p < 0 for p in begins):
        c.stop("pads", f"begin pads {begins} are negative (the output would start before the "
                       f"first input's taps); aotconv's conv_transpose pads >= 0")
    # a negative end pad lengthens the output past the last tap: output_padding
    out_pad = [op - min(e, 0) for op, e in zip(out_pad, ends)]
    ends = [max(e, 0) for e in ends]
    pad1 = [1] * (2 - s)
    k2, s2, d2 = kernel + pad1, stride + pad1, dil + pad1
    layer = {"op": "conv_transpose", "out": m, "kernel": _size(k2)}
    if s2 != [1, 1]:
        layer["stride"] = _size(s2)
    pads = begins + [0] * (2 - s) + ends + [0] * (2 - s)
    if pads[:2] == pads[2:] and pads[:2] != [0, 0]:
        layer["pad"] = _size(pads[:2])
    elif pads[:2] != pads[2:]:
        layer["pad"] = [pads[0], pads[1], pads[2], pads[3]]
    if any(out_pad):
        layer["output_padding"] = _size(out_pad + [0] * (2 - s))
    return _conv_mapped(c, layer, d2, g, w.reshape(x[1], m // g, k2[0], k2[1]), b)


def _transpose_pads(c, x, kernel, stride, dil, out_pad):
    """(begins, ends) of a ConvTranspose: its pads, or, given output_shape or auto_pad
    SAME_*, the split of the total padding that gives that shape (x * stride for SAME_*): the
    odd pixel at the end for SAME_UPPER, at the start otherwise, as the specification says and
    onnxruntime does. A larger output than the padding-free one extends at the end (what
    onnxruntime and ONNX's reference do; the specification's formula would start it before
    the first tap, and SAME_* there is reported)."""
    s = len(kernel)
    auto = c.attr("auto_pad", "NOTSET")
    shape = c.attr("output_shape")
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        c.stop("auto_pad", f"unknown value {auto!r}")
    if shape is None and auto in ("NOTSET", "VALID"):
        pads = c.ints("pads", 2 * s, 0) if auto == "NOTSET" else [0] * (2 * s)
        return pads[:s], pads[s:]
    if shape is not None:
        if auto == "VALID":
            c.stop("auto_pad", "VALID (no padding) with an output_shape that asks for some")
        shape = [int(v) for v in shape][-s:]
        if len(shape) != s:
            c.stop("output_shape", f"{list(c.attr('output_shape'))}: expected {s} spatial sizes")
    else:
        shape = [x[2 + i] * stride[i] for i in range(s)]
    begins, ends = [], []
    for i in range(s):
        total = (stride[i] * (x[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1
                 - shape[i])
        if total < 0 and auto != "NOTSET":
            c.stop("auto_pad", f"{auto} asks for output {shape}, larger than the transposed "
                               f"convolution's own: the specification starts it before the "
                               f"first tap, onnxruntime extends it at the end; give pads or "
                               f"output_padding instead")
        if total < 0:
            begins.append(0)
            ends.append(total)
        elif auto == "SAME_UPPER":
            begins.append(total // 2)
            ends.append(total - total // 2)
        else:
            begins.append(total - total // 2)
            ends.append(total // 2)
    return begins, ends


def _lrn(c):
    c.value(0)
    size = int(c.attr("size", 0))
    if size < 1 or size % 2 == 0:
        c.stop("size", f"{size}: aotconv's lrn (PyTorch's) centres its window on odd sizes "
                       f"only; an even window sits differently in ONNX")
    return Mapped({"op": "lrn", "size": size, "alpha": _f32(c.attr("alpha", 1e-4)),
                   "beta": _f32(c.attr("beta", 0.75)), "k": _f32(c.attr("bias", 1.0))},
                  [c.n.input(0)])


def _concat(c):
    ins = [t for t in c.n.inputs if t]
    shapes = [c.value(i) for i in range(len(c.n.inputs)) if c.n.input(i)]
    axis = int(c.attr("axis", 1))
    if axis % len(shapes[0]) != 1:
        c.stop("axis", f"{axis} of rank-{len(shapes[0])} tensors: aotconv concatenates "
                       f"channels (axis 1)")
    return Mapped({"op": "concat"}, ins)


def _add(c):
    ins = [t for t in c.n.inputs if t]
    consts = [t for t in ins if c.g.is_const(t)]
    if consts:
        c.stop("input", f"adds the constant '{consts[0]}': aotconv folds a constant Add only "
                        f"into the BatchNormalization (per channel) or Gemm/MatMul (per output) "
                        f"before it")
    shapes = [c.value(i) for i in range(len(c.n.inputs)) if c.n.input(i)]
    if len(ins) < 2:
        c.stop("input", "needs two or more inputs")
    if any(s != shapes[0] for s in shapes):
        c.stop("input", f"shapes {[list(s) for s in shapes]} differ: aotconv adds tensors of "
                        f"one shape (no broadcasting)")
    return Mapped({"op": "add"}, ins)


def _batchnorm(c):
    x = c.value(0)
    if int(c.attr("training_mode", 0)):
        c.stop("training_mode", "1: aotconv builds inference only (running statistics)")
    ch = x[1]
    names = ("scale", "B", "input_mean", "input_var")
    ts = {}
    for i, (nm, key) in enumerate(zip(names, ("gamma", "beta", "mean", "var")), 1):
        a = c.const(i, nm)
        if a.size != ch or a.ndim != 1:
            c.stop(nm, f"has shape {list(a.shape)}; expected [{ch}]")
        ts[key] = a
    eps = _f32(c.attr("epsilon", 1e-5))
    if not eps > 0:
        c.stop("epsilon", f"{eps}: aotconv's batchnorm needs epsilon > 0")
    if np.any(ts["var"] + eps <= 0):
        c.stop("input_var", "var + epsilon is not positive everywhere")
    return Mapped({"op": "batchnorm", "eps": eps}, [c.n.input(0)], ts)


def _gemm(c):
    a = c.value(0, "A")
    b = c.const(1, "B")
    if int(c.attr("transA", 0)):
        c.stop("transA", "1: A transposed puts the batch on the reduced axis; aotconv's dense "
                         "computes x[N, K] @ W^T")
    if b.ndim != 2:
        c.stop("B", f"has rank {b.ndim}; expected a [K, M] matrix")
    w = b if int(c.attr("transB", 0)) else b.T
    m, k = w.shape
    if flat_shape(a)[1] != k:
        c.stop("B", f"{list(b.shape)} does not fit the input {list(a)}")
    w = np.ascontiguousarray(w, np.float32)
    alpha = float(c.attr("alpha", 1.0))
    if alpha != 1.0:
        w = w * np.float32(alpha)
    layer = {"op": "dense", "out": int(m)}
    tensors = {"weight": w}
    cb = c.const(2, "C", optional=True)
    if cb is not None:
        from .simplify import _row_vector
        row = _row_vector(cb, m)
        if row is None:
            c.stop("C", f"has shape {list(cb.shape)}: a bias that differs per row is not "
                        f"aotconv's dense, which adds one bias per output")
        tensors["bias"] = (float(c.attr("beta", 1.0)) * row).astype(np.float32)
    else:
        layer["bias"] = False
    return Mapped(layer, [c.n.input(0)], tensors)


def _matmul(c):
    c.value(0, "A")
    c.stop(None, "aotconv maps a MatMul only as x[N, K] @ constant[K, M] (a dense layer); "
                 "here A is not [N, K] or B is not a constant matrix")


def _flatten(c):
    x = c.value(0)
    y = c.g.shapes[c.n.outputs[0]]
    if tuple(y) != flat_shape(x):
        what = f"axis {c.attr('axis', 1)}" if c.n.op == "Flatten" else "the new shape"
        c.stop("axis" if c.n.op == "Flatten" else None,
               f"{what} turns {list(x)} into {list(y)}: aotconv keeps the batch axis and "
               f"flattens each item ([N, F]), or leaves the [N, C, H, W] view unchanged")
    return Mapped({"op": "flatten"}, [c.n.input(0)])


def _identity_like(c):
    c.value(0)
    n = c.n
    if n.op == "Dropout":
        c.stop("training_mode", "is set or not a constant: aotconv builds inference only")
    if n.op == "Cast":
        c.stop("to", "converts the type: aotconv computes in float32 only")
    c.stop(None, "does not pass its input through unchanged")


def _pad(c):
    c.value(0)
    c.stop(None, "a Pad is imported only merged into the one Conv (zero padding), "
                 "AveragePool (zero padding) or MaxPool (-inf, or zero on a Relu output) that "
                 "alone reads it, padding H and W by constant amounts >= 0; this one is not")


def _split(c):
    c.value(0)
    c.stop(None, "a Split is imported only along the channels (axis 1) of a tensor of rank 2 "
                 "to 4, each output a channel_slice; this one is not")


def _slice(c):
    c.value(0)
    c.stop(None, "a Slice is imported only as channels [start, end) of a tensor of rank 2 to 4 "
                 "(constant starts, ends and axes, step 1, every other axis whole: "
                 "channel_slice); this one is not")


def _channel_shuffle(c):
    c.value(0)
    return Mapped({"op": "channel_shuffle", "groups": int(c.attr("groups"))}, [c.n.input(0)])


def _channel_slice(c):
    c.value(0)
    return Mapped({"op": "channel_slice", "start": int(c.attr("start")),
                   "end": int(c.attr("end"))}, [c.n.input(0)])


def _silu(c):
    c.value(0)
    return Mapped({"op": "silu"}, [c.n.input(0)])


def _resize(c):
    from .resize import map_resize
    return Mapped(map_resize(c), [c.n.input(0)])


# the internal nodes simplify writes for patterns of several ONNX nodes
INTERNAL = {"ChannelShuffle": _channel_shuffle, "ChannelSlice": _channel_slice, "Silu": _silu,
            "SoftmaxAxes": _softmax_axes}

OPS = {
    "Conv": _conv, "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_avgpool, "ReduceMean": _reduce_mean,
    "Relu": _activation("relu"), "Sigmoid": _activation("sigmoid"),
    "Tanh": _activation("tanh"), "LeakyRelu": _activation("leaky_relu"),
    "Clip": _clip, "HardSigmoid": _hardsigmoid, "HardSwish": _activation("hardswish"),
    "Gelu": _gelu, "Mul": _mul,
    "Softmax": _softmax, "LogSoftmax": _softmax, "LRN": _lrn, "Concat": _concat, "Add": _add, "Sum": _add,
    "BatchNormalization": _batchnorm, "Gemm": _gemm, "MatMul": _matmul,
    "Flatten": _flatten, "Reshape": _flatten, "Squeeze": _flatten, "Unsqueeze": _flatten,
    "Identity": _identity_like, "Dropout": _identity_like, "Cast": _identity_like,
    "Pad": _pad, "Split": _split, "Slice": _slice,
    "ConvTranspose": _conv_transpose, "Resize": _resize, "Upsample": _resize,
}
_WINDOW = {"auto_pad", "kernel_shape", "pads", "strides"}
KNOWN_ATTRS = {
    "Conv": _WINDOW | {"dilations", "group"},
    "MaxPool": _WINDOW | {"ceil_mode", "dilations", "storage_order"},
    "AveragePool": _WINDOW | {"ceil_mode", "count_include_pad", "dilations"},
    "GlobalAveragePool": set(), "ReduceMean": {"axes", "keepdims", "noop_with_empty_axes"},
    "Relu": set(), "Sigmoid": set(), "Tanh": set(), "LeakyRelu": {"alpha"},
    "Clip": set(), "HardSigmoid": {"alpha", "beta"}, "HardSwish": set(),
    "Gelu": {"approximate"}, "Mul": set(),
    "Softmax": {"axis"}, "LogSoftmax": {"axis"}, "LRN": {"alpha", "beta", "bias", "size"}, "Concat": {"axis"},
    "Add": set(), "Sum": set(),
    "BatchNormalization": {"epsilon", "momentum", "training_mode"},
    "Gemm": {"alpha", "beta", "transA", "transB"}, "MatMul": set(),
    "Flatten": {"axis"}, "Reshape": {"allowzero"}, "Squeeze": set(), "Unsqueeze": set(),
    "Identity": set(), "Dropout": {"seed"}, "Cast": {"to", "saturate", "round_mode"},
    "Pad": {"mode"}, "Split": {"axis", "num_outputs"}, "Slice": set(),
    "ConvTranspose": _WINDOW | {"dilations", "group", "output_padding", "output_shape"},
    "Resize": RESIZE_ATTRS["Resize"], "Upsample": RESIZE_ATTRS["Upsample"],
}

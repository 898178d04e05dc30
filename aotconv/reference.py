"""numpy float64 reference of every op: the ground truth for kernels, libraries and tuning.

Conventions are those of aotconv.graph (normalised attrs, every tensor 4-D NCHW) and, where
frameworks differ, PyTorch's (see DESIGN.md). Output shapes are taken from `layer.out_shape`
(ops.infer), so the reference and the kernels agree on ceil_mode and `same` padding by
construction; tests/test_reference.py checks those formulas independently.
"""
import math

import numpy as np

from .graph import ACT_OPS


def act(x, kind, alpha=0.01, beta=0.5, lo=None, hi=None):
    """The activation `kind` (graph.ACTS; definitions in graph.py) of x: `alpha` for leaky_relu
    and hardsigmoid, `beta` for hardsigmoid, the bounds lo / hi (None: none) for clip."""
    if kind == "none":
        return x
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "leaky_relu":
        return np.where(x > 0, x, alpha * x)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if kind == "tanh":
        return np.tanh(x)
    if kind == "relu6":
        return np.minimum(np.maximum(x, 0.0), 6.0)
    if kind == "clip":
        y = x if lo is None else np.maximum(x, lo)
        return y if hi is None else np.minimum(y, hi)
    if kind == "hardsigmoid":
        return np.minimum(np.maximum(alpha * x + beta, 0.0), 1.0)
    if kind == "hardswish":
        return x * np.minimum(np.maximum(x + 3.0, 0.0), 6.0) / 6.0
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    if kind == "gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(kind)


def act_of(x, a):
    """The activation a layer's normalised attrs `a` name, applied to x."""
    return act(x, a["act"], a["alpha"], a.get("beta", 0.5), a.get("min"), a.get("max"))


def _erf(x):
    """erf in float64 without scipy: math.erf elementwise (exact to double precision)."""
    x = np.asarray(x, np.float64)
    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x


def _taps(xp, kh, kw, sh, sw, dh, dw, p, q):
    """Yield (i, j, view) with view[..., y, x] = xp[..., i*dh + y*sh, j*dw + x*sw] for y<p, x<q."""
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            yield i, j, xp[..., y0:y0 + (p - 1) * sh + 1:sh, x0:x0 + (q - 1) * sw + 1:sw]


def _conv_keys(a, out_shape):
    """groups, (stride), (dilation), (top, left, bottom, right) pads and the output's (H, W) of
    a conv or conv_transpose layer."""
    return a["groups"], a["stride"], a["dilation"], a["pad"], tuple(out_shape[2:])


def conv(x, w, b, a, out_shape):
    """Grouped, dilated, strided, padded cross-correlation, as torch.nn.functional.conv2d."""
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    g, (sh, sw), (dh, dw), (pt, pl, pb, pr), (p, q) = _conv_keys(a, out_shape)
    og = o // g
    if g == 1:
        # channels first so that each tap's window is a (c, n*p*q) matrix: one BLAS call per tap
        xp = np.pad(x.transpose(1, 0, 2, 3), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        acc = np.zeros((o, n * p * q), x.dtype)
        for i, j, v in _taps(xp, kh, kw, sh, sw, dh, dw, p, q):
            acc += w[:, :, i, j] @ v.reshape(c, -1)
        y = acc.reshape(o, n, p, q).transpose(1, 0, 2, 3)
    else:
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        xg = xp.reshape(n, g, cg, *xp.shape[2:])
        wg = w.reshape(g, og, cg, kh, kw)
        y = np.zeros((n, g, og, p, q), x.dtype)
        for i, j, v in _taps(xg, kh, kw, sh, sw, dh, dw, p, q):
            if cg == 1 and og == 1:                       # depthwise: no reduction
                y[:, :, 0] += wg[None, :, 0, 0, i, j, None, None] * v[:, :, 0]
            else:
                y += np.einsum("goc,ngcpq->ngopq", wg[:, :, :, i, j], v, optimize=True)
    y = y.reshape(n, o, p, q)
    if b is not None:
        y += b.reshape(1, o, 1, 1)
    return act_of(y, a)


def pool(x, a, out_shape, kind):
    """max/avg pooling with PyTorch semantics (pad, ceil_mode, count_include_pad)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["pad"]
    p, q = out_shape[2], out_shape[3]
    # pad far enough that every window of the ceil_mode output lies inside the array
    eb = max(0, (p - 1) * sh + kh - (h + 2 * ph))
    er = max(0, (q - 1) * sw + kw - (w + 2 * pw))
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph + eb), (pw, pw + er)), constant_values=fill)
    if kind == "max":
        y = np.full((n, c, p, q), -np.inf, x.dtype)
        for _, _, v in _taps(xp, kh, kw, sh, sw, 1, 1, p, q):
            y = np.maximum(y, v)
        return y
    y = np.zeros((n, c, p, q), x.dtype)
    for _, _, v in _taps(xp, kh, kw, sh, sw, 1, 1, p, q):
        y += v

    def divisor(size, k, s, pad, outs):
        start = np.arange(outs) * s - pad
        end = np.minimum(start + k, size + pad)           # the ceil overhang never counts
        if a.get("count_include_pad", False):
            return end - start
        return np.minimum(end, size) - np.maximum(start, 0)

    return y / np.outer(divisor(h, kh, sh, ph, p), divisor(w, kw, sw, pw, q)).astype(x.dtype)


def lrn(x, a):
    """torch.nn.LocalResponseNorm: x / (k + alpha/size * sum_{window} x^2) ** beta."""
    size = a["size"]
    c = x.shape[1]
    sq = np.pad(x * x, ((0, 0), (size // 2, (size - 1) // 2), (0, 0), (0, 0)))
    s = sum(sq[:, i:i + c] for i in range(size))
    return x / (a["k"] + a["alpha"] / size * s) ** a["beta"]


def softmax(x, axes=(1,), log=False):
    """Softmax (log=True: its logarithm) over the block of consecutive `axes` of x together:
    ONNX Softmax / LogSoftmax over one axis (opset 13) or over everything from one axis on
    (before 13), computed stably (the maximum subtracted first)."""
    shape = x.shape
    lo, hi = axes[0], axes[-1] + 1
    v = x.reshape(int(np.prod(shape[:lo])), int(np.prod(shape[lo:hi])), -1)
    z = v - v.max(axis=1, keepdims=True)
    if log:
        return (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).reshape(shape)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).reshape(shape)


def upsample_sources(a, axis, in_len, out_len):
    """Per output index of `axis` (0: rows, 1: columns): nearest, the input index it copies;
    linear, (i0, i1, w) with the value (1 - w) * x[i0] + w * x[i1]. In integer arithmetic on
    ops.upsample_coordinate's exact source coordinate (A x + B) / D, as the kernel computes it:
    rounding as ONNX's nearest_mode, the coordinate clamped to the input for linear."""
    from .ops import upsample_coordinate
    A, B, D = upsample_coordinate(a, axis, in_len, out_len)
    num = A * np.arange(out_len, dtype=object) + B          # Python ints: never overflows
    if a["mode"] == "nearest":
        rounding = a["rounding"]
        if rounding == "floor":
            i = num // D
        elif rounding == "ceil":
            i = -((-num) // D)
        elif rounding == "round_prefer_floor":            # ceil(c - 1/2)
            i = -((D - 2 * num) // (2 * D))
        else:                                             # round_prefer_ceil: floor(c + 1/2)
            i = (2 * num + D) // (2 * D)
        return np.clip(i.astype(np.int64), 0, in_len - 1)
    i0 = np.clip(num // D, 0, in_len - 1).astype(np.int64)
    rem = num - i0 * D
    inside = (num >= 0) & (num // D < in_len - 1)
    w = np.where(inside, rem.astype(np.float64) / D, 0.0)
    return i0, np.minimum(i0 + 1, in_len - 1), w


def upsample(x, a, out_shape):
    """ONNX Resize (modes nearest and linear, separable over H and W) with ops.upsample's
    attributes."""
    _, _, h, w = x.shape
    p, q = out_shape[2], out_shape[3]
    if a["mode"] == "nearest":
        rows, cols = upsample_sources(a, 0, h, p), upsample_sources(a, 1, w, q)
        return x[:, :, rows][:, :, :, cols]
    r0, r1, wy = upsample_sources(a, 0, h, p)
    c0, c1, wx = upsample_sources(a, 1, w, q)
    top = x[:, :, r0] * (1 - wy)[:, None] + x[:, :, r1] * wy[:, None]
    return top[..., c0] * (1 - wx) + top[..., c1] * wx


def conv_transpose(x, w, b, a, out_shape):
    """The transposed convolution (ONNX ConvTranspose, torch.nn.functional.conv_transpose2d)
    by scattering: each input pixel adds w[c, o] times itself at every tap's output, then the
    result is cut by the pads (and extended by output_padding, where only the bias lands)."""
    n, c, h, wd = x.shape
    cin, og, kh, kw = w.shape
    g, (sh, sw), (dh, dw), (pt, pl, _, _), (p, q) = _conv_keys(a, out_shape)
    cg = c // g
    full = np.zeros((n, g, og, max(pt + p, (h - 1) * sh + (kh - 1) * dh + 1),
                     max(pl + q, (wd - 1) * sw + (kw - 1) * dw + 1)))
    xg = x.reshape(n, g, cg, h, wd)
    wg = w.reshape(g, cg, og, kh, kw)
    for i in range(kh):
        for j in range(kw):
            contrib = np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, i, j], optimize=True)
            full[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh,
                 j * dw:j * dw + (wd - 1) * sw + 1:sw] += contrib
    y = full[:, :, :, pt:pt + p, pl:pl + q].reshape(n, g * og, p, q)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return act_of(y, a)


# axes of the logical (N, C, H, W) array in the order a layout stores them
LAYOUT_AXES = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 2, 3, 1), "CHWN": (1, 2, 3, 0)}


def to_layout(x, layout):
    """The flat storage of the logical NCHW array `x` in `layout`."""
    return np.ascontiguousarray(np.asarray(x).transpose(LAYOUT_AXES[layout])).ravel()


def from_layout(buf, layout, shape):
    """The logical NCHW array of `shape` whose storage in `layout` is the flat `buf`."""
    ax = LAYOUT_AXES[layout]
    return np.asarray(buf).reshape([shape[i] for i in ax]).transpose(np.argsort(ax))


def conv_pool(x, w, b, a, out_shape):
    """conv (+bias+act) then max/avg pooling: the unfused pair, by construction."""
    from .ops import split_conv_pool, infer
    ca, pop, pa = split_conv_pool(a)
    mid = infer("conv", dict(ca), [x.shape])[0]
    return pool(conv(x, w, b, ca, mid), pa, out_shape, "max" if pop == "maxpool" else "avg")


def conv_dwpw(xs, prm, a, out_shape):
    """The depthwise conv (+bias+act), then the pointwise conv with its bias, residual (xs[1])
    and act: the unfused pair, by construction."""
    from .ops import split_conv_dwpw, infer
    dw, pw = split_conv_dwpw(a)
    mid = infer("conv", dw, [xs[0].shape])[0]
    d = conv(xs[0], prm["dw_weight"], prm.get("dw_bias"), dw, mid)
    if not pw.get("residual"):
        return conv(d, prm["weight"], prm.get("bias"), pw, out_shape)
    y = conv(d, prm["weight"], prm.get("bias"), dict(pw, act="none"), out_shape)
    return act_of(y + xs[1], pw)


def forward(layer, inputs, params, dtype=np.float64):
    """Output of `layer` (float64) for float64 `inputs` (list) and `params` ({name: array}).
    `dtype` np.float32 computes in float32 instead (precision.half_network_reference: an
    evaluation as exact as FP32 arithmetic)."""
    op, a = layer.op, layer.attrs
    xs = [np.asarray(v, dtype) for v in inputs]
    x = xs[0]
    prm = {k: np.asarray(v, dtype) for k, v in (params or {}).items()}
    if op in ACT_OPS:
        return act_of(x, a)
    if op == "conv" and a.get("residual"):
        # a residual add fused in (passes.fuse_residual): act(conv(x) + bias + r)
        y = conv(x, prm["weight"], prm.get("bias"), dict(a, act="none"), layer.out_shape)
        return act_of(y + xs[1], a)
    if op == "conv":
        return conv(x, prm["weight"], prm.get("bias"), a, layer.out_shape)
    if op == "dense":
        n = x.shape[0]
        y = x.reshape(n, -1) @ prm["weight"].T
        if "bias" in prm:
            y = y + prm["bias"]
        return act_of(y, a).reshape(n, -1, 1, 1)
    if op == "maxpool":
        return pool(x, a, layer.out_shape, "max")
    if op == "avgpool":
        return pool(x, a, layer.out_shape, "avg")
    if op == "global_avgpool":
        return x.mean(axis=(2, 3), keepdims=True)
    if op in ("softmax", "log_softmax"):
        from .ops import softmax_axes
        return softmax(x, softmax_axes(a), log=op == "log_softmax")
    if op == "upsample":
        return upsample(x, a, layer.out_shape)
    if op == "conv_transpose":
        return conv_transpose(x, prm["weight"], prm.get("bias"), a, layer.out_shape)
    if op == "lrn":
        return lrn(x, a)
    if op == "concat":
        return np.concatenate(xs, axis=1)
    if op == "add":
        return act_of(sum(xs[1:], xs[0].copy()), a)
    if op == "batchnorm":
        sc = prm["gamma"] / np.sqrt(prm["var"] + a["eps"])
        y = (x - prm["mean"].reshape(1, -1, 1, 1)) * sc.reshape(1, -1, 1, 1)
        return act_of(y + prm["beta"].reshape(1, -1, 1, 1), a)
    if op == "dropout":
        return x
    if op == "flatten":
        return x.reshape(x.shape[0], -1, 1, 1)
    if op == "conv_pool":
        return conv_pool(x, prm["weight"], prm.get("bias"), a, layer.out_shape)
    if op == "conv_dwpw":
        return conv_dwpw(xs, prm, a, layer.out_shape)
    if op == "scale":
        return x * xs[1]                                  # s (N, C, 1, 1) broadcasts over H, W
    if op == "mul":
        return x * xs[1]
    if op == "channel_shuffle":
        n, c, h, w = x.shape
        g = a["groups"]
        return x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)
    if op == "channel_slice":
        return x[:, a["start"]:a["end"]].copy()
    if op == "crop":
        _, _, h, w = x.shape
        return x[:, :, a["top"]:h - a["bottom"], a["left"]:w - a["right"]].copy()
    if op == "layout_convert":
        # logically the identity: only the storage order changes, which the variant states
        # (layouts_of = (src, dst)) and whoever runs it applies (to_layout / from_layout)
        return x
    raise NotImplementedError(op)


def random_params(layer, rng):
    """Fresh random parameters (never zeros) with a scale that keeps activations O(1).

    Weights ~ N(0, 1/fan_in); biases ~ N(0, 0.1^2) away from 0; batchnorm gamma in [0.5, 1.5],
    var in [0.5, 1.5] (positive), beta and mean ~ N(0, 0.1^2). float32, the user layout.
    """
    out = {}
    for name, shape in layer.params:
        if name.endswith("weight"):                       # a conv_dwpw's dw_weight too
            v = rng.standard_normal(shape, dtype=np.float32)
            v *= np.float32(1.0 / np.sqrt(np.prod(shape[1:])))
        elif name in ("gamma", "var"):
            v = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:                                              # bias, beta, mean
            v = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        v[v == 0] = np.float32(1e-3)
        out[name] = v
    return out


def unflatten_params(net, flat):
    """{layer: {tensor: array}} from one flat array in the documented order (DESIGN.md)."""
    flat = np.asarray(flat).ravel()
    out = {}
    for lname, tname, shape, off in net.param_layout():
        n = int(np.prod(shape))
        if off + n > flat.size:
            raise ValueError(f"flat params have {flat.size} values; {lname}.{tname} needs "
                             f"[{off}, {off + n})")
        out.setdefault(lname, {})[tname] = flat[off:off + n].reshape(shape)
    return out


def random_network_params(net, rng):
    """{layer: {tensor: array}} of random_params for every layer of `net`."""
    return {l.name: random_params(l, rng) for l in net.layers if l.params}


def run_network(net, x, params):
    """Walk `net.layers` in order; returns [output of each name in net.outputs] (float64).

    `x` is the input's array, or with several inputs a list of arrays in the network's input
    order or a dict by name (graph.Network.input_values). `params` is {layer: {tensor:
    array}} or one flat array in the documented order.
    """
    if not isinstance(params, dict):
        params = unflatten_params(net, params)
    values = {t: np.asarray(v, np.float64) for t, v in net.input_values(x).items()}
    for layer in net.layers:
        ins = [values[i] for i in layer.inputs]
        values[layer.name] = forward(layer, ins, params.get(layer.name, {}))
    return [values[o] for o in net.outputs]

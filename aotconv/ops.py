"""The ops: their attribute schema and defaults, shape inference, parameter shapes and costs.

spec.py validates the YAML against SCHEMA and calls `normalise` then `infer`; both raise
OpError(key, message), which spec.py turns into a SpecError naming file, line and layer.
"""

from .graph import ACTS, ACT_EXTRAS, ACT_OPS, count
from .names import shown


class OpError(Exception):
    def __init__(self, key, message):
        self.key, self.message = key, message
        super().__init__(message)


# op -> {key: (types, default)}; a default of REQUIRED means the key must be given, OPTIONAL
# that the normalised attrs have the key only where it applies (the act extras, see graph.py).
REQUIRED = object()
OPTIONAL = object()
_FLT_MIN = 1.1754943508222875e-38
_int = (int,)
_num = (int, float)
_act = {"act": ((str,), "none"), "alpha": (_num, 0.01), "beta": (_num, OPTIONAL),
        "min": (_num, OPTIONAL), "max": (_num, OPTIONAL)}
_size2 = (int, list)
_pool = {"kernel": (_size2, REQUIRED), "stride": (_size2, None), "pad": (_size2, 0),
         "ceil_mode": ((bool,), False)}
SCHEMA = {
    "conv": {"out": (_int, REQUIRED), "kernel": (_size2, REQUIRED), "stride": (_size2, 1),
             "pad": ((int, list, str), 0), "dilation": (_size2, 1), "groups": (_int, 1),
             "bias": ((bool,), True), **_act},
    "dense": {"out": (_int, REQUIRED), "bias": ((bool,), True), **_act},
    "maxpool": dict(_pool),
    "avgpool": {**_pool, "count_include_pad": ((bool,), False)},
    "global_avgpool": {},
    "relu": {}, "sigmoid": {}, "tanh": {}, "leaky_relu": {"alpha": ((int, float), 0.01)},
    "relu6": {}, "clip": {"min": (_num, OPTIONAL), "max": (_num, OPTIONAL)},
    "hardsigmoid": {"alpha": (_num, 0.2), "beta": (_num, 0.5)},
    "hardswish": {}, "silu": {}, "gelu": {}, "gelu_tanh": {},
    "softmax": {},
    "lrn": {"size": (_int, REQUIRED), "alpha": ((int, float), 1e-4), "beta": ((int, float), 0.75),
            "k": ((int, float), 1.0)},
    "concat": {},
    "add": dict(_act),
    "batchnorm": {"eps": ((int, float), 1e-5), **_act},
    "dropout": {"p": ((int, float), 0.5)},
    "flatten": {},
    "scale": {},
    "mul": {},
    "channel_shuffle": {"groups": (_int, REQUIRED)},
    "channel_slice": {"start": (_int, REQUIRED), "end": (_int, REQUIRED)},
    "crop": {"top": (_int, 0), "left": (_int, 0), "bottom": (_int, 0), "right": (_int, 0)},
}
# how many inputs each op takes (None: two or more)
ARITY = {op: 1 for op in SCHEMA}
ARITY.update({"concat": None, "add": None, "scale": 2, "mul": 2})

# Ops the compiler makes and a net.yaml never names (spec.py validates against SCHEMA only):
#   conv_pool       a conv whose max/avg pool is fused into it (passes.fuse_pool): the conv's
#                   attrs plus "pool", the pool's normalised attrs and its kind as sorted
#                   (key, value) pairs, so the layer's signature stays hashable
#   layout_convert  a storage transpose between two layouts of the same logical tensor
#                   (schedule.py inserts it where neighbours disagree): attrs src, dst
INTERNAL_OPS = ("conv_pool", "layout_convert")
ARITY.update({op: 1 for op in INTERNAL_OPS})
LAYOUTS = ("NCHW", "NHWC", "CHWN")


def pool_attrs(kind, attrs):
    """The "pool" attribute of a conv_pool: ("kind", "max"|"avg") plus the pool's attrs."""
    return tuple(sorted(dict(attrs, kind=kind).items()))


def split_conv_pool(attrs):
    """(conv attrs, pool op, pool attrs) of a conv_pool's attrs."""
    conv = {k: v for k, v in attrs.items() if k != "pool"}
    pool = dict(attrs["pool"])
    kind = pool.pop("kind")
    return conv, ("maxpool" if kind == "max" else "avgpool"), pool


def _pair(key, v, positive=True):
    if isinstance(v, bool):
        raise OpError(key, f"expected an int or [h, w], got {shown(v)}")
    if isinstance(v, int):
        v = [v, v]
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                         for x in v)):
        raise OpError(key, f"expected an int or a list of two ints [h, w], got {shown(v, 60)}")
    lo = 1 if positive else 0
    if any(x < lo for x in v):
        raise OpError(key, f"must be >= {lo}, got {v!r}")
    return tuple(v)


def normalise(op, raw):
    """Fill defaults and bring sizes to tuples; `raw` already has only known keys."""
    a = {}
    for key, (types, default) in SCHEMA[op].items():
        if default is not OPTIONAL or key in raw:
            a[key] = raw.get(key, default)
    if op in ACT_OPS:
        a["act"] = op
        a.setdefault("alpha", 0.01)
        if op not in ("leaky_relu", "hardsigmoid"):
            a["alpha"] = 0.01
    if "act" in a:
        if a["act"] not in ACTS:
            raise OpError("act", f"unknown activation '{shown(a['act'])}'; use one of {', '.join(ACTS)}")
        _act_extras(a, raw)
    if op == "conv":
        a["kernel"] = _pair("kernel", a["kernel"])
        a["stride"] = _pair("stride", a["stride"])
        a["dilation"] = _pair("dilation", a["dilation"])
        if a["out"] < 1:
            raise OpError("out", f"must be >= 1, got {a['out']}")
        if a["groups"] < 1:
            raise OpError("groups", f"must be >= 1, got {a['groups']}")
        if a["pad"] != "same":
            if isinstance(a["pad"], str):
                raise OpError("pad", f"expected an int, [ph, pw] or 'same', got "
                                     f"'{shown(a['pad'])}'")
            ph, pw = _pair("pad", a["pad"], positive=False)
            a["pad"] = (ph, pw, ph, pw)
    elif op == "dense":
        if a["out"] < 1:
            raise OpError("out", f"must be >= 1, got {a['out']}")
    elif op in ("maxpool", "avgpool"):
        a["kernel"] = _pair("kernel", a["kernel"])
        a["stride"] = a["kernel"] if a["stride"] is None else _pair("stride", a["stride"])
        a["pad"] = _pair("pad", a["pad"], positive=False)
        if a["pad"][0] * 2 > a["kernel"][0] or a["pad"][1] * 2 > a["kernel"][1]:
            raise OpError("pad", f"pad {a['pad']} must be at most half the kernel {a['kernel']}")
    elif op == "lrn":
        if a["size"] < 1:
            raise OpError("size", f"must be >= 1, got {a['size']}")
        for k in ("alpha", "beta", "k"):
            a[k] = float(a[k])
    elif op == "batchnorm":
        a["eps"] = float(a["eps"])
        # the kernels add eps in float32: one that rounds to 0 there divides by zero
        if not a["eps"] >= _FLT_MIN:
            raise OpError("eps", f"must be > 0 and at least {_FLT_MIN:.4g} (the smallest normal "
                                 f"float32), got {a['eps']}")
    elif op == "channel_shuffle":
        if a["groups"] < 1:
            raise OpError("groups", f"must be >= 1, got {a['groups']}")
    elif op == "channel_slice":
        if a["start"] < 0:
            raise OpError("start", f"must be >= 0, got {a['start']}")
        if a["end"] <= a["start"]:
            raise OpError("end", f"must be greater than start {a['start']}, got {a['end']}")
    elif op == "crop":
        for key in ("top", "left", "bottom", "right"):
            if a[key] < 0:
                raise OpError(key, f"must be >= 0, got {a[key]}")
    elif op == "dropout":
        a["p"] = float(a["p"])
        if not 0.0 <= a["p"] < 1.0:
            raise OpError("p", f"the drop probability must be in [0, 1), got {a['p']}")
    return a


def _act_extras(a, raw):
    """Defaults and checks of the activation attributes; the extras (graph.ACT_EXTRAS) stay
    only on a layer whose act reads them, so every other layer's signature is unchanged."""
    kind = a["act"]
    extras = ACT_EXTRAS.get(kind, ())
    for key in ("beta", "min", "max"):
        if key in raw and key not in extras:
            users = [k for k, v in ACT_EXTRAS.items() if key in v]
            raise OpError(key, f"'{key}' is a parameter of act {' and '.join(users)}, not of "
                               f"act '{kind}'; remove it or change the act")
        a.pop(key, None)
    if kind == "hardsigmoid" and "alpha" not in raw:
        a["alpha"] = 0.2                                # ONNX's default (PyTorch's is 1/6)
    a["alpha"] = float(a["alpha"])
    if kind == "hardsigmoid":
        a["beta"] = float(raw.get("beta", 0.5))
    elif kind == "clip":
        for key in ("min", "max"):
            a[key] = float(raw[key]) if key in raw else None


def _conv_out(size, k, s, p0, p1, d, key, what):
    eff = (k - 1) * d + 1
    if size + p0 + p1 < eff:
        raise OpError(key, f"window {eff} (kernel {k}, dilation {d}) is larger than the padded "
                           f"input {what} {size}+{p0}+{p1}; reduce the kernel or add padding")
    return (size + p0 + p1 - eff) // s + 1


def _pool_out(size, k, s, p, ceil, key, what):
    if size + 2 * p < k:
        raise OpError(key, f"window {k} is larger than the padded input {what} {size}+2*{p}")
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    # PyTorch: the last window must start inside the input or the left padding
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def infer(op, a, in_shapes):
    """Output shape and [(param name, shape)] for `op` with normalised attrs `a`."""
    if op == "concat":
        n, _, h, w = in_shapes[0]
        for s in in_shapes[1:]:
            if (s[0], s[2], s[3]) != (n, h, w):
                raise OpError("inputs", f"concat needs equal N, H, W; got {list(map(list, in_shapes))}")
        return (n, sum(s[1] for s in in_shapes), h, w), []
    if op in ("add", "mul"):
        for s in in_shapes[1:]:
            if tuple(s) != tuple(in_shapes[0]):
                raise OpError("inputs", f"{op} needs equal shapes; got {list(map(list, in_shapes))}")
        return tuple(in_shapes[0]), []
    if op == "scale":
        x, s = in_shapes
        n, c = x[0], x[1]
        if tuple(s) != (n, c, 1, 1):
            raise OpError("inputs", f"scale multiplies x [N, C, H, W] by s [N, C, 1, 1]; got "
                                    f"{list(map(list, in_shapes))} (the second input must be "
                                    f"[{n}, {c}, 1, 1])")
        return tuple(x), []
    n, c, h, w = in_shapes[0]
    if op == "conv":
        kh, kw = a["kernel"]
        sh, sw = a["stride"]
        dh, dw = a["dilation"]
        if a["pad"] == "same":
            def total(size, k, s, d):
                return max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            th, tw = total(h, kh, sh, dh), total(w, kw, sw, dw)
            a["pad"] = (th // 2, tw // 2, th - th // 2, tw - tw // 2)
        pt, pl, pb, pr = a["pad"]
        g = a["groups"]
        if c % g:
            raise OpError("groups", f"input channels {c} are not divisible by groups {g}")
        if a["out"] % g:
            raise OpError("groups", f"output channels {a['out']} are not divisible by groups {g}")
        p = _conv_out(h, kh, sh, pt, pb, dh, "kernel", "height")
        q = _conv_out(w, kw, sw, pl, pr, dw, "kernel", "width")
        params = [("weight", (a["out"], c // g, kh, kw))]
        if a["bias"]:
            params.append(("bias", (a["out"],)))
        return (n, a["out"], p, q), params
    if op == "dense":
        params = [("weight", (a["out"], c * h * w))]
        if a["bias"]:
            params.append(("bias", (a["out"],)))
        return (n, a["out"], 1, 1), params
    if op in ("maxpool", "avgpool"):
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["pad"]
        p = _pool_out(h, kh, sh, ph, a["ceil_mode"], "kernel", "height")
        q = _pool_out(w, kw, sw, pw, a["ceil_mode"], "kernel", "width")
        return (n, c, p, q), []
    if op == "global_avgpool":
        return (n, c, 1, 1), []
    if op == "flatten":
        return (n, c * h * w, 1, 1), []
    if op == "channel_shuffle":
        if c % a["groups"]:
            raise OpError("groups", f"input channels {c} are not divisible by groups {a['groups']}")
        return (n, c, h, w), []
    if op == "channel_slice":
        if a["end"] > c:
            raise OpError("end", f"{a['end']} is past the input's {c} channels; the slice is "
                                 f"channels [start, end) of them")
        return (n, a["end"] - a["start"], h, w), []
    if op == "crop":
        for key, size, lo, hi in (("bottom", h, "top", "bottom"), ("right", w, "left", "right")):
            if a[lo] + a[hi] >= size:
                what = "height" if key == "bottom" else "width"
                raise OpError(key, f"{lo} {a[lo]} and {hi} {a[hi]} leave nothing of the input "
                                   f"{what} {size}; a crop keeps at least one row and column")
        return (n, c, h - a["top"] - a["bottom"], w - a["left"] - a["right"]), []
    if op == "batchnorm":
        return (n, c, h, w), [(t, (c,)) for t in ("gamma", "beta", "mean", "var")]
    if op == "conv_pool":
        conv, pop, pool = split_conv_pool(a)
        mid, params = infer("conv", conv, in_shapes)
        return infer(pop, pool, [mid])[0], params
    if op == "layout_convert":
        for key in ("src", "dst"):
            if a.get(key) not in LAYOUTS:
                raise OpError(key, f"expected one of {', '.join(LAYOUTS)}, got {a.get(key)!r}")
    return (n, c, h, w), []


def conv_pool_mid_shape(layer):
    """The shape of a conv_pool's conv output: the tensor the fusion keeps off memory."""
    conv, _, _ = split_conv_pool(layer.attrs)
    return infer("conv", dict(conv), layer.in_shapes)[0]


def flops(layer):
    """Floating-point operations of one forward pass (multiply-add = 2)."""
    op, a, out = layer.op, layer.attrs, layer.out_shape
    n_out = count(out)
    if op == "conv":
        c = layer.in_shape[1] // a["groups"]
        return 2 * n_out * c * a["kernel"][0] * a["kernel"][1]
    if op == "dense":
        return 2 * n_out * count(layer.in_shape[1:])
    if op in ("maxpool", "avgpool"):
        return n_out * a["kernel"][0] * a["kernel"][1]
    if op == "lrn":
        return count(out) * (a["size"] * 2 + 4)
    if op in ("global_avgpool",):
        return count(layer.in_shape)
    if op == "conv_pool":
        # the unfused pair's work, so that GFLOP/s compare with conv + pool (windows that
        # overlap recompute conv outputs: that extra work is the fused kernel's cost, not FLOPs)
        conv, _, pool = split_conv_pool(a)
        mid = conv_pool_mid_shape(layer)
        c = layer.in_shape[1] // a["groups"]
        return (2 * count(mid) * c * a["kernel"][0] * a["kernel"][1]
                + n_out * pool["kernel"][0] * pool["kernel"][1])
    if op in ("layout_convert", "channel_shuffle", "channel_slice", "crop"):
        return 0                                          # copies: no arithmetic
    if op in ("scale", "mul"):
        return n_out
    return n_out * 2


def bytes_moved(layer):
    """The fewest bytes a kernel must move: every input, parameter and output once."""
    total = sum(count(s) for s in layer.in_shapes) + count(layer.out_shape)
    total += sum(count(s) for _, s in layer.params)
    return 4 * total


def is_alias(layer):
    return layer.op in ("flatten", "dropout")

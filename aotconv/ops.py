"""The ops: their attribute schema and defaults, shape inference, parameter shapes and costs.

spec.py validates the YAML against SCHEMA and calls `normalise` then `infer`; both raise
OpError(key, message), which spec.py turns into a SpecError naming file, line and layer.
"""

from fractions import Fraction
import math
import struct

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
    "softmax": {"axis": ((int, list), OPTIONAL)},
    "log_softmax": {"axis": ((int, list), OPTIONAL)},
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
    "upsample": {"scale": ((int, float, list), OPTIONAL), "size": (_size2, OPTIONAL),
                 "mode": ((str,), "nearest"), "coordinates": ((str,), OPTIONAL),
                 "rounding": ((str,), OPTIONAL)},
    "conv_transpose": {"out": (_int, REQUIRED), "kernel": (_size2, REQUIRED),
                       "stride": (_size2, 1), "pad": ((int, list), 0),
                       "output_padding": (_size2, 0), "dilation": (_size2, 1),
                       "groups": (_int, 1), "bias": ((bool,), True), **_act},
}
# upsample: how output coordinates map to input coordinates (ONNX Resize's
# coordinate_transformation_mode) and how nearest rounds (ONNX's nearest_mode)
UPSAMPLE_MODES = ("nearest", "linear")
UPSAMPLE_COORDINATES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners",
                        "half_pixel_symmetric")
UPSAMPLE_ROUNDING = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")
SOFTMAX_OPS = ("softmax", "log_softmax")
# what a key takes, where the types alone would not say it (spec.py's type errors)
TYPE_HINTS = {
    ("softmax", "axis"): "an axis (1, 2 or 3) or a list of consecutive axes such as [2, 3]",
    ("log_softmax", "axis"): "an axis (1, 2 or 3) or a list of consecutive axes such as [2, 3]",
    ("conv_transpose", "pad"): "an integer, [ph, pw] or [top, left, bottom, right]",
    ("upsample", "scale"): "a number or [height, width] factors",
    ("upsample", "size"): "[height, width]",
}
# how many inputs each op takes (None: two or more)
ARITY = {op: 1 for op in SCHEMA}
ARITY.update({"concat": None, "add": None, "scale": 2, "mul": 2})

# Ops the compiler makes and a net.yaml never names (spec.py validates against SCHEMA only):
#   conv_pool       a conv whose max/avg pool is fused into it (passes.fuse_pool): the conv's
#                   attrs plus "pool", the pool's normalised attrs and its kind as sorted
#                   (key, value) pairs, so the layer's signature stays hashable
#   conv_dwpw       a pointwise (1x1) conv whose input a depthwise conv computes on the fly
#                   (passes.fuse_dwpw): the pointwise conv's attrs (its bias, act, residual)
#                   plus "dw", the depthwise conv's normalised attrs as sorted (key, value)
#                   pairs; params dw_weight, dw_bias (if the dw conv has one), weight, bias
#   layout_convert  a storage transpose between two layouts of the same logical tensor
#                   (schedule.py inserts it where neighbours disagree): attrs src, dst
INTERNAL_OPS = ("conv_pool", "conv_dwpw", "layout_convert")
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


def dw_attrs(attrs):
    """The "dw" attribute of a conv_dwpw: the depthwise conv's attrs as sorted (key, value)
    pairs (hashable, as the layer's signature needs)."""
    return tuple(sorted(attrs.items()))


def split_conv_dwpw(attrs):
    """(depthwise conv attrs, pointwise conv attrs) of a conv_dwpw's attrs."""
    return dict(attrs["dw"]), {k: v for k, v in attrs.items() if k != "dw"}


def dwpw_reason(dw, pw, channels):
    """None when conv attrs `dw` (reading `channels` channels) and `pw` make a conv_dwpw: a
    depthwise conv of channel multiplier 1 with no residual, then a pointwise conv (1x1,
    stride 1, no padding, one group); else what is missing."""
    if dw.get("residual") or dw["groups"] != channels or dw["out"] != channels:
        return (f"the depthwise conv must have groups == in == out channels ({channels}) and "
                f"no residual; got groups {dw['groups']}, out {dw['out']}")
    if (tuple(pw["kernel"]) != (1, 1) or tuple(pw["stride"]) != (1, 1) or any(pw["pad"])
            or pw["groups"] != 1):
        return (f"the pointwise conv must be 1x1, stride 1, unpadded, one group; got kernel "
                f"{tuple(pw['kernel'])}, stride {tuple(pw['stride'])}, pad {tuple(pw['pad'])}, "
                f"groups {pw['groups']}")
    return None


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
    elif op in SOFTMAX_OPS:
        if "axis" in a:
            a["axis"] = _softmax_axes(a["axis"])
            if a["axis"] == (1,):
                del a["axis"]                   # the default: the signature it always had
    elif op == "upsample":
        _upsample_attrs(a)
    elif op == "conv_transpose":
        _conv_transpose_attrs(a)
    return a


def softmax_axes(attrs):
    """The [N, C, H, W] axes a softmax or log_softmax normalises over together (default C)."""
    return attrs.get("axis", (1,))


def _softmax_axes(v):
    axes = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not (isinstance(axes, list) and axes and all(isinstance(x, int) and not isinstance(x, bool)
                                                    for x in axes)):
        raise OpError("axis", f"expected an axis (1, 2 or 3) or a list of consecutive axes "
                              f"such as [1, 2, 3], got {shown(v, 60)}")
    if any(x < 0 or x > 3 for x in axes):
        raise OpError("axis", f"{shown(v, 60)}: axes count 0 to 3 over [N, C, H, W]; use 1 "
                              f"(channels), 2 (rows) or 3 (columns)")
    if 0 in axes:
        raise OpError("axis", f"{shown(v, 60)}: axis 0 is the batch; a softmax normalises "
                              f"within one sample, over axes 1 (channels), 2 (rows), 3 (columns)")
    if axes != list(range(axes[0], axes[0] + len(axes))):
        raise OpError("axis", f"{shown(v, 60)}: the axes must be consecutive and increasing "
                              f"(e.g. [2, 3]): a softmax over several axes normalises the "
                              f"block they span together")
    return tuple(axes)


def _f32(v):
    """v rounded to float32, as a Python float (the kernels compute with float32 values)."""
    return struct.unpack("f", struct.pack("f", float(v)))[0]


def _upsample_attrs(a):
    scale, size = a.get("scale"), a.get("size")
    if (scale is None) == (size is None):
        raise OpError("scale", "give either `scale` (output = floor(input * scale)) or `size` "
                               "([height, width] of the output), not both" if scale is not None
                      else "op 'upsample' needs `scale` (e.g. 2 or [2, 3]) or `size` "
                           "([height, width] of the output)")
    if scale is not None:
        v = [scale, scale] if not isinstance(scale, list) else scale
        if len(v) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                  for x in v):
            raise OpError("scale", f"expected a number or [height, width] factors, got "
                                   f"{shown(scale, 60)}")
        try:
            v = tuple(_f32(x) for x in v)
        except OverflowError:
            raise OpError("scale", f"{shown(scale, 60)} is beyond float32's range") from None
        if not all(x > 0 for x in v):
            raise OpError("scale", f"factors must be > 0 (as float32), got {shown(scale, 60)}")
        a["scale"], a["size"] = v, None
    else:
        a["scale"], a["size"] = None, _pair("size", size)
    if a["mode"] not in UPSAMPLE_MODES:
        raise OpError("mode", f"unknown mode '{shown(a['mode'])}'; use nearest or linear")
    # PyTorch's F.interpolate: nearest takes source pixel floor(x / scale), linear
    # (align_corners=False) samples at (x + 0.5) / scale - 0.5
    a.setdefault("coordinates", "asymmetric" if a["mode"] == "nearest" else "half_pixel")
    if a["coordinates"] not in UPSAMPLE_COORDINATES:
        raise OpError("coordinates", f"unknown coordinates '{shown(a['coordinates'])}'; use "
                                     f"{', '.join(UPSAMPLE_COORDINATES)}")
    if a["mode"] == "nearest":
        a.setdefault("rounding", "floor")
        if a["rounding"] not in UPSAMPLE_ROUNDING:
            raise OpError("rounding", f"unknown rounding '{shown(a['rounding'])}'; use "
                                      f"{', '.join(UPSAMPLE_ROUNDING)}")
    elif "rounding" in a:
        raise OpError("rounding", "is how mode nearest picks its source pixel; mode linear "
                                  "interpolates, so remove it or use mode nearest")


def _conv_transpose_attrs(a):
    a["kernel"] = _pair("kernel", a["kernel"])
    a["stride"] = _pair("stride", a["stride"])
    a["dilation"] = _pair("dilation", a["dilation"])
    a["output_padding"] = _pair("output_padding", a["output_padding"], positive=False)
    if a["out"] < 1:
        raise OpError("out", f"must be >= 1, got {a['out']}")
    if a["groups"] < 1:
        raise OpError("groups", f"must be >= 1, got {a['groups']}")
    pad = a["pad"]
    if isinstance(pad, list) and len(pad) == 4:
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in pad):
            raise OpError("pad", f"expected ints [top, left, bottom, right], got {shown(pad, 60)}")
        if any(x < 0 for x in pad):
            raise OpError("pad", f"must be >= 0, got {pad!r}")
        a["pad"] = tuple(pad)
    else:
        if isinstance(pad, list) and len(pad) != 2:
            raise OpError("pad", f"expected an int, [ph, pw] or [top, left, bottom, right], got "
                                 f"{shown(pad, 60)}")
        ph, pw = _pair("pad", pad, positive=False)
        a["pad"] = (ph, pw, ph, pw)


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
    if op == "upsample":
        return _check_count((n, c) + _upsample_size(a, h, w),
                            "scale" if a["scale"] is not None else "size"), []
    if op == "conv_transpose":
        return _conv_transpose_infer(a, n, c, h, w)
    if op == "conv_pool":
        conv, pop, pool = split_conv_pool(a)
        mid, params = infer("conv", conv, in_shapes)
        return infer(pop, pool, [mid])[0], params
    if op == "conv_dwpw":
        dw, pw = split_conv_dwpw(a)
        why = dwpw_reason(dw, pw, c)
        if why:
            raise OpError("dw", why)
        mid, dwp = infer("conv", dw, in_shapes[:1])
        out, pwp = infer("conv", pw, [mid])
        return out, [("dw_" + t, s) for t, s in dwp] + pwp
    if op == "layout_convert":
        for key in ("src", "dst"):
            if a.get(key) not in LAYOUTS:
                raise OpError(key, f"expected one of {', '.join(LAYOUTS)}, got {a.get(key)!r}")
    return (n, c, h, w), []


def _upsample_size(a, h, w):
    """The output (height, width): `size`, or floor(input * scale) exactly (ONNX Resize's
    output_dimension); fills a["size"] from the scale."""
    out = []
    for i, (size, what) in enumerate(((h, "height"), (w, "width"))):
        if a["scale"] is None:
            o = a["size"][i]
        else:
            o = (Fraction(size) * Fraction(a["scale"][i])).__floor__()
            if o < 1:
                raise OpError("scale", f"{a['scale'][i]!r} gives an empty output from the input "
                                       f"{what} {size}; the output needs at least one row and "
                                       f"column")
            if a["size"] is not None and a["size"][i] != o:
                raise OpError("size", f"{list(a['size'])} is not floor(input * scale) "
                                      f"= {o} for scale {a['scale'][i]!r}")
        out.append(o)
    if a["scale"] is not None:
        a["size"] = tuple(out)
    return tuple(out)


def _check_count(shape, key):
    """An OpError naming `key` when `shape` holds more elements than a 32-bit index reaches."""
    if count(shape) > 2**31 - 1:
        raise OpError(key, f"the output {list(shape)} has {count(shape)} elements, more than "
                           f"2^31 - 1 (the kernels index with 32-bit ints); make it smaller")
    return shape


def upsample_coordinate(a, axis, in_len, out_len):
    """(A, B, D), integers with D > 0, such that output index x of `axis` (0: rows, 1:
    columns) samples the input at coordinate (A * x + B) / D, exactly: ONNX Resize's
    coordinate transformation in rational arithmetic, with the float32 scale when one is given
    (else out_len / in_len)."""
    s = Fraction(out_len, in_len) if a["scale"] is None else Fraction(a["scale"][axis])
    kind = a["coordinates"]
    if kind == "asymmetric":                          # x / s
        slope, offset = 1 / s, Fraction(0)
    elif kind == "half_pixel" or (kind == "pytorch_half_pixel" and out_len > 1):
        slope, offset = 1 / s, 1 / (2 * s) - Fraction(1, 2)   # (x + 1/2) / s - 1/2
    elif kind == "align_corners" and out_len > 1:
        slope, offset = Fraction(in_len - 1, out_len - 1), Fraction(0)
    elif kind == "half_pixel_symmetric":
        # half_pixel shifted so that the centre of the output maps to the centre of the
        # input: in/2 (1 - out / (in s)) + (x + 1/2) / s - 1/2
        slope = 1 / s
        offset = Fraction(in_len, 2) - Fraction(out_len, 2) / s + 1 / (2 * s) - Fraction(1, 2)
    else:                                             # one output: the first input pixel
        slope, offset = Fraction(0), Fraction(0)
    d = math.lcm(slope.denominator, offset.denominator)
    return int(slope * d), int(offset * d), d


def _conv_transpose_infer(a, n, c, h, w):
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
    pt, pl, pb, pr = a["pad"]
    oph, opw = a["output_padding"]
    g = a["groups"]
    if c % g:
        raise OpError("groups", f"input channels {c} are not divisible by groups {g}")
    if a["out"] % g:
        raise OpError("groups", f"output channels {a['out']} are not divisible by groups {g}")
    sizes = []
    for size, k, s, d, p0, p1, op, what in ((h, kh, sh, dh, pt, pb, oph, "height"),
                                            (w, kw, sw, dw, pl, pr, opw, "width")):
        full = (size - 1) * s + (k - 1) * d + 1 + op
        if full - p0 - p1 < 1:
            raise OpError("pad", f"pads {p0} and {p1} remove the whole output {what} {full} "
                                 f"((input - 1) * stride + (kernel - 1) * dilation + 1 + "
                                 f"output_padding); reduce the padding")
        sizes.append(full - p0 - p1)
    params = [("weight", (c, a["out"] // g, kh, kw))]
    if a["bias"]:
        params.append(("bias", (a["out"],)))
    return (n, a["out"], sizes[0], sizes[1]), params


def conv_pool_mid_shape(layer):
    """The shape of a conv_pool's conv output: the tensor the fusion keeps off memory."""
    conv, _, _ = split_conv_pool(layer.attrs)
    return infer("conv", dict(conv), layer.in_shapes)[0]


def conv_dwpw_mid_shape(layer):
    """The shape of a conv_dwpw's depthwise output: the tensor the fusion keeps off memory."""
    dw, _ = split_conv_dwpw(layer.attrs)
    return infer("conv", dw, layer.in_shapes[:1])[0]


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
    if op == "conv_dwpw":
        # the unfused pair's: the depthwise conv's taps, then the pointwise conv's reduction
        dw, _ = split_conv_dwpw(a)
        mid = conv_dwpw_mid_shape(layer)
        return 2 * count(mid) * (dw["kernel"][0] * dw["kernel"][1] + out[1])
    if op == "conv_transpose":
        # every input element meets each of its group's out/groups x kh x kw weights once
        return (2 * count(layer.in_shape) * (a["out"] // a["groups"])
                * a["kernel"][0] * a["kernel"][1])
    if op == "upsample":
        return n_out * (8 if a["mode"] == "linear" else 0)   # 4 taps, 3 lerps
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

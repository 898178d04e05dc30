"""ONNX Resize (opset 13+) and Upsample (opset 7-9, and Resize-10, which the version converter
turns into a Resize that has lost their semantics) as aotconv's `upsample` layer.

Modes nearest and linear over H and W, scales or sizes constant (folded), N and C scale 1.
aotconv's upsample computes the source coordinate of every output pixel exactly (rational
arithmetic on the float32 scale), then rounds or interpolates. A nearest resize maps only where
that picks the same pixels as onnxruntime (which computes the coordinate in float32) and as
ONNX's reference (float64): a scale such as 0.6 puts some coordinates within float32's
precision of a rounding boundary, where the two disagree, and the node is then reported.
"""
from fractions import Fraction

import numpy as np

from .shapes import embed

MODES = ("nearest", "linear")
COORDINATES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
KNOWN_ATTRS = {
    "Resize": {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
               "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
               "nearest_mode"},
    "Upsample": {"mode", "scales"},
}


def _f32(v):
    return float(str(np.float32(v)))


def map_resize(c):
    """The upsample layer's keys of Resize / Upsample node `c` (mapping._Node)."""
    x = c.value(0)
    r = len(x)
    legacy = c.n.op == "Upsample" or c.n.legacy
    mode = c.attr("mode", "nearest")
    if legacy and mode == "bilinear":                # Upsample-7's other name for linear
        mode = "linear"
    if mode not in MODES:
        c.stop("mode", f"{mode!r}: aotconv's upsample is nearest or linear (cubic is not "
                       f"implemented)")
    scales, sizes = _operands(c, x, legacy)
    coords = "asymmetric" if legacy else c.attr("coordinate_transformation_mode", "half_pixel")
    rounding = "floor" if legacy else c.attr("nearest_mode", "round_prefer_floor")
    spatial = list(range(2, r))
    if scales is not None:
        out = [int((Fraction(x[i]) * Fraction(float(scales[i]))).__floor__()) for i in range(r)]
        exact = [Fraction(x[i]) * Fraction(float(scales[i])) == out[i] for i in range(r)]
    else:
        out, exact = list(sizes), [True] * r
    if coords == "half_pixel_symmetric":
        # (x + 1/2) / scale - 1/2 shifted by in/2 * (1 - out / (in * scale)): half_pixel where
        # the output length is exactly in * scale
        if not all(exact[i] for i in spatial):
            c.stop("coordinate_transformation_mode",
                   f"half_pixel_symmetric with scales {_shown(scales)} whose outputs "
                   f"{[float(Fraction(x[i]) * Fraction(float(scales[i]))) for i in spatial]} "
                   f"are not whole: aotconv maps it where it equals half_pixel (give sizes, or "
                   f"scales that give whole outputs)")
        coords = "half_pixel"
    if coords not in COORDINATES:
        c.stop("coordinate_transformation_mode",
               f"{coords!r}: aotconv's upsample takes {', '.join(COORDINATES)} (and "
               f"half_pixel_symmetric where it equals half_pixel)")
    if coords == "align_corners" and not all(exact[i] for i in spatial):
        c.stop("coordinate_transformation_mode",
               f"align_corners with scales {_shown(scales)}: input * scale is not whole, and "
               f"ONNX's reference then aligns to the fractional length where onnxruntime takes "
               f"the output's; give sizes instead")
    if mode == "nearest" and rounding not in NEAREST:
        c.stop("nearest_mode", f"{rounding!r}: expected one of {', '.join(NEAREST)}")
    if int(c.attr("antialias", 0)):
        if mode == "nearest":
            c.stop("antialias", "1 with mode nearest: ONNX defines antialiasing for linear "
                                "and cubic only")
        if any(out[i] < x[i] for i in spatial):
            c.stop("antialias", f"1 while downsampling to {out[2:]} from {list(x[2:])}: "
                                f"aotconv's linear upsample has no antialiasing filter")
    if int(c.attr("exclude_outside", 0)) and mode == "nearest":
        c.stop("exclude_outside", "1 with mode nearest: the pixels clamped to the edge would "
                                  "weigh 0; aotconv's upsample clamps")
    if legacy and mode == "nearest" and any(out[i] < x[i] for i in spatial):
        c.stop("scales", f"{_shown(scales)}: a nearest Upsample (or Resize before opset 11) "
                         f"that shrinks an axis has no specified rounding (onnxruntime rounds "
                         f"up there); aotconv maps it for scales >= 1")
    x2 = embed(x)
    if r < 4:                                          # [N, C, L] is (N, C, L, 1)
        out = out + [1] * (4 - r)
        scales = None if scales is None else list(scales) + [1.0] * (4 - r)
    layer = {"op": "upsample"}
    if scales is not None:
        layer["scale"] = [_f32(scales[2]), _f32(scales[3])]
    else:
        layer["size"] = [int(out[2]), int(out[3])]
    layer["mode"] = mode
    layer["coordinates"] = coords
    if mode == "nearest":
        layer["rounding"] = rounding
        _check_nearest(c, layer, x2, out)
    return layer


def _shown(v):
    return None if v is None else [float(s) for s in v]


def _operands(c, x, legacy):
    """(scales, None) or (None, sizes), each a list over x's axes, with N and C unchanged."""
    r = len(x)
    if c.n.op == "Upsample":
        given = c.attr("scales")
        scales = (np.asarray(given, np.float32) if given is not None
                  else _const(c, 1, "scales", optional=False))
        sizes = None
    else:
        scales = _const(c, 2, "scales", optional=True)
        sizes = _const(c, 3, "sizes", optional=True)
        if scales is not None and scales.size == 0:       # opset 11-12: empty when sizes given
            scales = None
        if (scales is None) == (sizes is None):
            c.stop("scales", "give exactly one of scales and sizes" if scales is not None
                   else "neither scales nor sizes given")
    axes = c.attr("axes")
    axes = list(range(r)) if axes is None else [int(a) % r for a in axes]
    if scales is not None:
        if scales.dtype.kind != "f" or scales.size != len(axes):
            c.stop("scales", f"{scales.tolist()}: expected {len(axes)} float scales")
        full = [1.0] * r
        for a, s in zip(axes, np.asarray(scales, np.float32).reshape(-1)):
            full[a] = np.float32(s)
        if not all(np.isfinite(s) and s > 0 for s in full):
            c.stop("scales", f"{[float(s) for s in full]}: scales must be finite and > 0")
        if full[0] != 1 or full[1] != 1:
            c.stop("scales", f"{[float(s) for s in full]} scale the batch or channel axis: "
                             f"aotconv's upsample resizes H and W only (scales 1 there)")
        return full, None
    if sizes.dtype.kind not in "iu" or sizes.size != len(axes):
        c.stop("sizes", f"{sizes.tolist()}: expected {len(axes)} integer sizes")
    full = list(x)
    for a, s in zip(axes, sizes.reshape(-1)):
        full[a] = int(s)
    if any(s < 1 for s in full):
        c.stop("sizes", f"{full}: sizes must be >= 1")
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        ratios = {Fraction(full[a], x[a]) for a in axes if a >= 2}
        if len(ratios) > 1 or any(full[a] != x[a] for a in axes if a < 2):
            c.stop("keep_aspect_ratio_policy",
                   f"{policy!r} with sizes {sizes.tolist()} for {list(x)}: the one scale it "
                   f"derives is not the sizes' own ratio on each axis, and aotconv's upsample "
                   f"takes a float32 scale or the output size; give sizes of equal ratios or "
                   f"keep_aspect_ratio_policy 'stretch'")
    if full[0] != x[0] or full[1] != x[1]:
        c.stop("sizes", f"{full} change the batch or channel axis of {list(x)}: aotconv's "
                        f"upsample resizes H and W only")
    return None, full


def _const(c, i, what, optional):
    t = c.n.input(i)
    if t is None:
        if optional:
            return None
        c.stop(what, "missing")
    v = c.g.const(t)
    if v is None:
        c.stop(what, "must be a constant (an initializer, or computed from constants only): "
                     "aotconv compiles the output size into the library")
    return np.asarray(v)


# -- nearest: the pixels onnxruntime and ONNX's reference pick ------------------------------------

def _coordinate(kind, x, s, in_len, out_len, dt):
    """The source coordinates of output indices x as onnxruntime (dt float32) and ONNX's
    reference (float64) compute them."""
    x, s, half = x.astype(dt), dt(s), dt(0.5)
    if kind == "asymmetric":
        return x / s
    if kind == "half_pixel" or (kind == "pytorch_half_pixel" and out_len > 1):
        return (x + half) / s - half
    if kind == "align_corners" and out_len > 1:
        return x * dt(in_len - 1) / dt(out_len - 1)
    return np.zeros_like(x)


def _round_ort(v, rounding):
    if rounding == "floor":
        return np.floor(v)
    if rounding == "ceil":
        return np.ceil(v)
    away = np.sign(v) * np.floor(np.abs(v) + v.dtype.type(0.5))       # std::round
    if rounding == "round_prefer_ceil":
        return away
    return np.where(v == np.trunc(v) + v.dtype.type(0.5), np.floor(v), away)


def _round_reference(v, rounding):
    lo = np.floor(v)
    frac = v - lo
    if rounding == "floor":
        up = np.zeros(v.shape, bool)
    elif rounding == "ceil":
        up = frac > 0
    elif rounding == "round_prefer_floor":
        up = frac > 0.5
    else:
        up = frac >= 0.5
    return np.where(frac == 0, v, lo + up)


def _check_nearest(c, layer, x2, out):
    from ..ops import normalise, upsample_coordinate
    from ..reference import upsample_sources
    a = normalise("upsample", {k: v for k, v in layer.items() if k != "op"})
    a["size"] = tuple(out[2:])
    for axis, what in ((0, "row"), (1, "column")):
        n_in, n_out = x2[2 + axis], out[2 + axis]
        ours = upsample_sources(a, axis, n_in, n_out)
        idx = np.arange(n_out)
        if a["scale"] is None:
            s32 = np.float32(n_out) / np.float32(n_in)
            s64 = n_out / n_in
        else:
            s32 = np.float32(a["scale"][axis])
            s64 = float(s32)
        for name, dt, s, rnd in (("onnxruntime (float32)", np.float32, s32, _round_ort),
                                 ("ONNX's reference (float64)", np.float64, s64,
                                  _round_reference)):
            v = _coordinate(a["coordinates"], idx, s, n_in, n_out, dt)
            theirs = np.clip(rnd(v, a["rounding"]), 0, n_in - 1).astype(np.int64)
            bad = np.nonzero(theirs != ours)[0]
            if bad.size:
                i = int(bad[0])
                A, B, D = upsample_coordinate(a, axis, n_in, n_out)
                exact = Fraction(A * i + B, D)
                c.stop("scales" if a["scale"] is not None else "sizes",
                       f"nearest: output {what} {i} samples input coordinate {float(exact):.9g} "
                       f"(exactly {exact}), within rounding error of a {a['rounding']} "
                       f"boundary: {name} takes pixel {int(theirs[i])}, the exact coordinate "
                       f"pixel {int(ours[i])}; aotconv does not guess (give sizes, or a scale "
                       f"exact in binary such as 2 or 0.5)")

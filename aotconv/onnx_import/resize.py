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
COORDINATES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners",
               "half_pixel_symmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
KNOWN_ATTRS = {
    "Resize": {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
               "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
               "nearest_mode"},
    "Upsample": {"mode", "scales"},
}
_BAKED = "aotconv compiles the output size into the library"     # why scales and sizes are constant


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
        in32 = [int(np.floor(np.float32(x[i]) * np.float32(scales[i]))) for i in range(r)]
        if in32 != out:
            c.stop("scales", f"{_shown(scales)} on {list(x)}: floor(input * scale) is {out} "
                             f"exactly (ONNX's shape inference), {in32} in float32 "
                             f"(onnxruntime); give sizes instead")
        if out == list(x) and any(s != 1 for s in scales):
            c.stop("scales", f"{_shown(scales)} leave {list(x)} its size, where onnxruntime "
                             f"copies the input and the specification still resamples it at "
                             f"x / scale; give scales of 1 (or sizes) for a copy")
    else:
        out, exact = list(sizes), [True] * r
    if coords not in COORDINATES:
        c.stop("coordinate_transformation_mode",
               f"{coords!r}: aotconv's upsample takes {', '.join(COORDINATES)}")
    if coords == "half_pixel_symmetric" and mode == "nearest":
        c.stop("coordinate_transformation_mode",
               "half_pixel_symmetric with mode nearest: onnxruntime's float32 offset moves "
               "pixels across rounding boundaries that the exact coordinate does not cross; "
               "aotconv maps half_pixel_symmetric for mode linear")
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
    if "Upsample" in (c.n.op, c.n.legacy) and any(float(scales[i]) < 1 for i in spatial):
        c.stop("scales", f"{_shown(scales)}: Upsample takes scales >= 1 (its specification; "
                         f"onnxruntime refuses smaller ones)")
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
    _check(c, layer, x2, out, legacy)
    return layer


def _shown(v):
    return None if v is None else [float(s) for s in v]


def _operands(c, x, legacy):
    """(scales, None) or (None, sizes), each a list over x's axes, with N and C unchanged."""
    r = len(x)
    if c.n.op == "Upsample":
        given = c.attr("scales")
        scales = (np.asarray(given, np.float32) if given is not None
                  else c.constant(1, "scales", False, _BAKED))
        sizes = None
    else:
        scales = c.constant(2, "scales", True, _BAKED)
        sizes = c.constant(3, "sizes", True, _BAKED)
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
    if policy not in ("stretch", "not_larger", "not_smaller"):
        c.stop("keep_aspect_ratio_policy", f"unknown value {policy!r}")
    if policy != "stretch":
        # one scale for every axis in `axes`: the smallest (not_larger) or largest ratio, and
        # output round(scale * input); that is sizes of one ratio where each is whole
        ratios = [Fraction(full[a], x[a]) for a in axes]
        s = min(ratios) if policy == "not_larger" else max(ratios)
        if any((s * x[a]).denominator != 1 for a in axes):
            c.stop("keep_aspect_ratio_policy",
                   f"{policy!r} with sizes {sizes.tolist()} for {list(x)}: its scale {s} "
                   f"gives fractional lengths {[float(s * x[a]) for a in axes]}, which it "
                   f"rounds, and aotconv's upsample takes the output size (its own ratio on "
                   f"each axis) or a float32 scale; give sizes with policy 'stretch'")
        for a in axes:
            full[a] = int(s * x[a])
    if full[0] != x[0] or full[1] != x[1]:
        c.stop("sizes", f"{full} change the batch or channel axis of {list(x)}: aotconv's "
                        f"upsample resizes H and W only")
    return None, full


# -- the pixels onnxruntime and ONNX's reference read ----------------------------------------------

def _coordinate_ort(kind, x, s, in_len, out_len):
    """The source coordinates of output indices x as onnxruntime computes them (float32)."""
    x, s, half = x.astype(np.float32), np.float32(s), np.float32(0.5)
    if kind == "asymmetric":
        return x / s
    if kind == "half_pixel" or (kind == "pytorch_half_pixel" and out_len > 1):
        return (x + half) / s - half
    if kind == "align_corners" and out_len > 1:
        return x * np.float32(in_len - 1) / np.float32(out_len - 1)
    return np.zeros_like(x)


def _round_ort(v, rounding):
    if rounding == "floor":
        return np.floor(v)
    if rounding == "ceil":
        return np.ceil(v)
    away = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))          # std::round
    if rounding == "round_prefer_ceil":
        return away
    return np.where(v == np.trunc(v) + np.float32(0.5), np.floor(v), away)


def _reference_1d(c, axis_scale, axis_size, n_in):
    """What ONNX's reference evaluator computes for node `c`'s resize of one axis of length
    n_in (a probe: the input 0, 1, ..., n_in - 1 along H, in float64)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
    keep = ("mode", "coordinate_transformation_mode", "nearest_mode", "exclude_outside",
            "antialias")
    attrs = {k: v for k, v in c.n.attrs.items() if k in keep}
    if axis_scale is not None:
        operand = helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, float(axis_scale), 1])
        node = helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)
    else:
        operand = helper.make_tensor("s", TensorProto.INT64, [4], [1, 1, int(axis_size), 1])
        node = helper.make_node("Resize", ["x", "", "", "s"], ["y"], **attrs)
    g = helper.make_graph([node], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [1, 1, n_in, 1])],
                          [helper.make_empty_tensor_value_info("y")], initializer=[operand])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    try:
        y = ReferenceEvaluator(model).run(None, {"x": np.arange(n_in, dtype=np.float64)
                                                 .reshape(1, 1, n_in, 1)})[0]
    except Exception:
        return None
    return np.asarray(y, np.float64).reshape(-1)


def _check(c, layer, x2, out, legacy):
    """Report the node where aotconv's upsample reads other pixels than onnxruntime (nearest:
    its float32 coordinates, emulated) or ONNX's reference evaluator (run on a probe of each
    axis) would; for linear, where the reference interpolates elsewhere."""
    from ..ops import normalise, upsample_coordinate
    from ..reference import upsample_sources
    a = normalise("upsample", {k: v for k, v in layer.items() if k != "op"})
    a["size"] = tuple(out[2:])
    key = "scales" if a["scale"] is not None else "sizes"
    for axis, what in ((0, "row"), (1, "column")):
        n_in, n_out = x2[2 + axis], out[2 + axis]
        if n_in == n_out and (a["scale"] is None or a["scale"][axis] == 1):
            continue                                   # a copy, in every implementation
        idx = np.arange(n_out)
        src = upsample_sources(a, axis, n_in, n_out)
        ours = src if a["mode"] == "nearest" else src[0] + src[2] * (src[1] - src[0])
        A, B, D = upsample_coordinate(a, axis, n_in, n_out)

        def report(name, i, theirs):
            exact = Fraction(A * i + B, D)
            c.stop(key, f"{a['mode']}: output {what} {i} samples input coordinate "
                        f"{float(exact):.9g} (exactly {exact}), where {name} reads "
                        f"{float(theirs):.6g} and aotconv {float(ours[i]):.6g}; aotconv does not "
                        f"guess (a scale exact in binary, such as 2, 3 or 0.5, keeps every "
                        f"coordinate exact)")

        if a["mode"] == "nearest":
            s32 = (np.float32(n_out) / np.float32(n_in) if a["scale"] is None
                   else np.float32(a["scale"][axis]))
            v = _coordinate_ort(a["coordinates"], idx, s32, n_in, n_out)
            theirs = np.clip(_round_ort(v, a["rounding"]), 0, n_in - 1)
            bad = np.nonzero(theirs != ours)[0]
            if bad.size:
                report("onnxruntime (float32)", int(bad[0]), theirs[bad[0]])
        if legacy:
            continue
        ref = _reference_1d(c, None if a["scale"] is None else a["scale"][axis], n_out, n_in)
        if ref is None or ref.shape != ours.shape:
            c.stop(key, f"ONNX's reference evaluator does not resize {what}s {n_in} -> {n_out} "
                        f"as aotconv does; aotconv maps only what both compute alike")
        bad = np.nonzero(np.abs(ref - ours) > 1e-6 * max(1, n_in))[0]
        if bad.size:
            report("ONNX's reference evaluator", int(bad[0]), ref[bad[0]])

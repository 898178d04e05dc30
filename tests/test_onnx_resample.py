"""The importer's Resize, Upsample, ConvTranspose, Softmax and LogSoftmax on any axis, without a
device: each mapping checked for its layer and, through aotconv's numpy reference with the
imported weights, against onnxruntime on the original model; each rejection for its message.
"""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from aotconv.onnx_import import UnsupportedError, import_model  # noqa: E402
from onnx_helpers import assert_matches_onnxruntime, model, node, rand, save  # noqa: E402


def imp(tmp_path, m, name="m.onnx"):
    path = save(m, tmp_path / name)
    im = import_model(path)
    assert_matches_onnxruntime(im, path)
    return im


def rejected(tmp_path, m):
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError) as e:
        import_model(path)
    assert "Traceback" not in str(e.value)
    return e.value.problems[0]


def layers(im, op=None):
    return [{k: v for k, v in l.items() if k not in ("name", "inputs")}
            for l in im.description["layers"] if op is None or l["op"] == op]


def resize(shape, mode="nearest", scales=None, sizes=None, opset=19, **attrs):
    inits = {"roi": np.zeros(0, np.float32)}
    if scales is not None:
        inits["sc"] = np.array(scales, np.float32)
        ins = ["x", "roi", "sc"]
    else:
        inits["sz"] = np.array(sizes, np.int64)
        ins = ["x", "roi", "", "sz"]
    return model([node("Resize", ins, name="r", mode=mode, **attrs)], shape, inits=inits,
                 opset=opset)


# ---------------------------------------------------------------------------------------------
# Resize


@pytest.mark.parametrize("coords", ["asymmetric", "half_pixel", "pytorch_half_pixel",
                                    "align_corners"])
@pytest.mark.parametrize("rounding", ["floor", "ceil", "round_prefer_floor",
                                      "round_prefer_ceil"])
def test_resize_nearest_each_coordinate_mode_and_rounding(tmp_path, coords, rounding):
    m = resize([2, 3, 5, 7], scales=[1, 1, 2, 3], coordinate_transformation_mode=coords,
               nearest_mode=rounding)
    assert layers(imp(tmp_path, m)) == [{"op": "upsample", "scale": [2.0, 3.0],
                                         "mode": "nearest", "coordinates": coords,
                                         "rounding": rounding}]
    m = resize([1, 2, 7, 4], sizes=[1, 2, 14, 6], coordinate_transformation_mode=coords,
               nearest_mode=rounding)
    assert layers(imp(tmp_path, m))[0]["size"] == [14, 6]


@pytest.mark.parametrize("coords", ["asymmetric", "half_pixel", "pytorch_half_pixel",
                                    "align_corners", "half_pixel_symmetric"])
@pytest.mark.parametrize("scales, sizes", [([1, 1, 2, 2], None), ([1, 1, 0.5, 1.5], None),
                                           (None, [1, 3, 11, 4]), (None, [1, 3, 1, 1])])
def test_resize_linear_each_coordinate_mode(tmp_path, coords, scales, sizes):
    m = resize([1, 3, 6, 8], "linear", scales=scales, sizes=sizes,
               coordinate_transformation_mode=coords)
    (layer,) = layers(imp(tmp_path, m))
    assert layer["op"] == "upsample" and layer["mode"] == "linear" \
        and layer["coordinates"] == coords and "rounding" not in layer


def test_resize_defaults_axes_and_rank_3(tmp_path):
    # ONNX's defaults: half_pixel, round_prefer_floor; opset 18's axes; [N, C, L] resizes L
    m = resize([1, 2, 3, 4], scales=[3, 2], axes=[3, 2])
    assert layers(imp(tmp_path, m)) == [{"op": "upsample", "scale": [2.0, 3.0],
                                         "mode": "nearest", "coordinates": "half_pixel",
                                         "rounding": "round_prefer_floor"}]
    im = imp(tmp_path, resize([2, 3, 5], "linear", sizes=[2, 3, 12]))
    assert layers(im)[0]["size"] == [12, 1] and im.network.layers[0].out_shape == (2, 3, 12, 1)


def test_resize_keep_aspect_ratio_where_its_scale_gives_whole_lengths(tmp_path):
    m = resize([1, 1, 2, 4], sizes=[1, 3], axes=[2, 3], keep_aspect_ratio_policy="not_larger")
    assert layers(imp(tmp_path, m))[0]["size"] == [1, 2]      # scale 1/2 on both axes
    m = resize([1, 1, 2, 4], sizes=[1, 3], axes=[2, 3], keep_aspect_ratio_policy="not_smaller")
    p = rejected(tmp_path, m)                                 # 3/4 of 2 rows is 1.5
    assert p.attr == "keep_aspect_ratio_policy" and "fractional lengths" in p.message


@pytest.mark.parametrize("attrs, scales, key, message", [
    ({"mode": "cubic"}, [1, 1, 2, 2], "mode", "nearest or linear"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2],
     "coordinate_transformation_mode", "'tf_crop_and_resize'"),
    ({}, [1, 2, 2, 2], "scales", "batch or channel axis"),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.5], "antialias", "antialiasing"),
    ({"antialias": 1}, [1, 1, 2, 2], "antialias", "linear and cubic only"),
    ({"exclude_outside": 1}, [1, 1, 2, 2], "exclude_outside", "clamps"),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1.25, 2],
     "coordinate_transformation_mode", "fractional length"),
    ({"coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 2, 2],
     "coordinate_transformation_mode", "mode linear"),
    # 10 * 0.7 is 6.99999988 exactly (ONNX: 6 rows), 7.0 in float32 (onnxruntime: 7)
    ({}, [1, 1, 0.7, 1], "scales", "in float32"),
    # the output keeps the input's size: onnxruntime copies, the specification resamples
    ({}, [1, 1, 1.05, 1], "scales", "onnxruntime copies"),
])
def test_resize_rejections(tmp_path, attrs, scales, key, message):
    p = rejected(tmp_path, resize([1, 2, 10, 6], scales=scales, **attrs))
    assert (p.node, p.op, p.attr) == ("r", "Resize", key)
    assert message in p.message


def test_resize_nearest_on_a_float32_rounding_boundary_is_rejected(tmp_path):
    # 3 / float32(0.6) is 4.9999998 exactly (pixel 4), 5.0 in float32 (onnxruntime: 5)
    p = rejected(tmp_path, resize([1, 1, 2, 7], scales=[1, 1, 1, 0.6],
                                  coordinate_transformation_mode="asymmetric",
                                  nearest_mode="floor"))
    assert p.attr == "scales" and "output column 3" in p.message \
        and "onnxruntime (float32) reads 5" in p.message and "aotconv 4" in p.message
    # the same resize given by its sizes is 7 * 4/7 = 4 columns of exact x * 7/4: no boundary
    imp(tmp_path, resize([1, 1, 2, 7], sizes=[1, 1, 2, 4],
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"))


def test_resize_scales_must_be_constants(tmp_path):
    m = model([node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["f"], to=1),
               node("Div", ["f", "f"], ["one"]),
               node("Resize", ["x", "", "one"], name="r")], [1, 2, 3, 3], opset=19)
    # Shape of a static tensor folds: its scales become constants and the node maps
    assert layers(imp(tmp_path, m))[0]["scale"] == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# Upsample (opset 7-9) and Resize-10: asymmetric, floor


@pytest.mark.parametrize("opset, op", [(7, "Upsample"), (9, "Upsample"), (10, "Resize")])
def test_upsample_and_resize_10_keep_their_semantics_through_the_converter(tmp_path, opset,
                                                                           op):
    # two in a row: the version converter renames the first one's output, and turns both into
    # a Resize with ONNX 13's defaults (half_pixel), which would be a wrong answer for linear
    def up(src, dst, mode, s):
        if opset == 7:
            return [node(op, [src], [dst], mode=mode, scales=s)], {}
        return [node(op, [src, f"s_{dst}"], [dst], mode=mode)], {f"s_{dst}": np.array(s,
                                                                                     np.float32)}
    n1, i1 = up("x", "a", "nearest", [1.0, 1.0, 2.0, 3.0])
    n2, i2 = up("a", "y", "linear", [1.0, 1.0, 1.5, 2.0])
    im = imp(tmp_path, model(n1 + n2, [1, 2, 3, 4], inits={**i1, **i2}, opset=opset))
    assert im.source_opset == opset
    assert [(l["mode"], l["coordinates"], l.get("rounding")) for l in layers(im)] == \
        [("nearest", "asymmetric", "floor"), ("linear", "asymmetric", None)]


def test_upsample_below_one_is_rejected(tmp_path):
    m = model([node("Upsample", ["x", "s"], name="u", mode="linear")], [1, 2, 4, 4], opset=9,
              inits={"s": np.array([1, 1, 0.5, 1], np.float32)})
    p = rejected(tmp_path, m)
    assert p.attr == "scales" and "Upsample takes scales >= 1" in p.message
    m = model([node("Resize", ["x", "s"], name="u", mode="nearest")], [1, 2, 4, 4], opset=10,
              inits={"s": np.array([1, 1, 0.5, 1], np.float32)})
    assert "no specified rounding" in rejected(tmp_path, m).message


# ---------------------------------------------------------------------------------------------
# ConvTranspose


@pytest.mark.parametrize("shape, w, attrs, want", [
    ([1, 3, 5, 7], (3, 4, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [1, 1]},
     {"out": 4, "kernel": 3, "stride": 2, "pad": 1, "output_padding": 1}),
    ([2, 4, 3, 5], (4, 3, 3, 2), {"group": 2, "strides": [3, 2], "pads": [1, 0, 2, 1],
                                  "dilations": [2, 1]},
     {"out": 6, "kernel": [3, 2], "stride": [3, 2], "pad": [1, 0, 2, 1], "dilation": [2, 1],
      "groups": 2}),
    ([1, 2, 6], (2, 3, 4), {"strides": [2]},                   # 1-D: a window of width 1
     {"out": 3, "kernel": [4, 1], "stride": [2, 1]}),
    # output_shape: the total padding 2 * (3 - 1) + 3 - 6 = 1, its odd pixel at the start
    ([1, 1, 3, 3], (1, 2, 3, 3), {"strides": [2, 2], "output_shape": [6, 6]},
     {"out": 2, "kernel": 3, "stride": 2, "pad": [1, 1, 0, 0]}),
    # an output_shape past the transposed convolution's own extends it at the end
    ([1, 1, 3, 3], (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]},
     {"out": 2, "kernel": 3, "stride": [3, 2], "output_padding": 1}),
    ([1, 1, 3, 3], (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
     {"out": 2, "kernel": 3, "stride": 2, "pad": [0, 0, 1, 1]}),
    ([1, 1, 3, 3], (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
     {"out": 2, "kernel": 3, "stride": 2, "pad": [1, 1, 0, 0]}),
])
def test_conv_transpose(tmp_path, shape, w, attrs, want):
    g = attrs.get("group", 1)
    m = model([node("ConvTranspose", ["x", "w", "b"], **attrs)], shape,
              inits={"w": rand(*w), "b": rand(w[1] * g)})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "conv_transpose", **want}]
    assert im.tensors[f"{im.network.layers[0].name}.weight"].shape[:2] == w[:2]


def test_conv_transpose_without_bias(tmp_path):
    m = model([node("ConvTranspose", ["x", "w"], strides=[2, 2])], [1, 2, 3, 3],
              inits={"w": rand(2, 2, 2, 2)})
    assert layers(imp(tmp_path, m))[0]["bias"] is False


@pytest.mark.parametrize("shape, w, attrs, key, message", [
    ([1, 1, 3, 3], (1, 1, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER",
                                  "output_shape": [9, 9]}, "auto_pad", "extends it at the end"),
    ([1, 1, 3, 3], (1, 1, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER",
                                  "output_shape": [8, 7]}, "auto_pad", "extends it at the end"),
])
def test_conv_transpose_rejections(tmp_path, shape, w, attrs, key, message):
    m = model([node("ConvTranspose", ["x", "w"], name="t", **attrs)], shape,
              inits={"w": rand(*w)})
    p = rejected(tmp_path, m)
    assert (p.node, p.attr) == ("t", key) and message in p.message


# ---------------------------------------------------------------------------------------------
# Softmax and LogSoftmax: one axis (opset 13), everything from an axis on (before 13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis, want", [([2, 7], -1, None), ([2, 3, 4, 5], 2, 2),
                                               ([2, 3, 4, 5], -1, 3), ([2, 5, 3], 2, 2)])
def test_softmax_and_log_softmax_over_one_axis(tmp_path, op, shape, axis, want):
    im = imp(tmp_path, model([node(op, ["x"], axis=axis)], shape))
    layer = {"op": "softmax" if op == "Softmax" else "log_softmax"}
    if want is not None:
        layer["axis"] = want
    assert layers(im) == [layer]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis, want", [(1, [1, 2, 3]), (2, [2, 3]), (3, 3), (-2, [2, 3])])
def test_softmax_before_opset_13_normalises_from_its_axis_on(tmp_path, op, axis, want):
    # the version converter writes Flatten(axis) -> Softmax -> Reshape: one softmax layer
    im = imp(tmp_path, model([node(op, ["x"], axis=axis)], [2, 3, 4, 5], opset=11))
    assert [l.get("axis") for l in layers(im)] == [want]


def test_softmax_between_transposes_is_over_the_moved_axis(tmp_path):
    # PyTorch's export of softmax(dim=1) before opset 13
    m = model([node("Transpose", ["x"], ["t"], perm=[0, 3, 2, 1]),
               node("LogSoftmax", ["t"], ["s"], axis=3),
               node("Transpose", ["s"], perm=[0, 3, 2, 1])], [2, 3, 4, 5], opset=11)
    assert layers(imp(tmp_path, m)) == [{"op": "log_softmax"}]


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_over_the_batch_is_rejected(tmp_path, opset):
    p = rejected(tmp_path, model([node("LogSoftmax", ["x"], name="s", axis=0)], [2, 3, 4],
                                 opset=opset))
    assert p.attr == "axis" and "normalises across the batch" in p.message

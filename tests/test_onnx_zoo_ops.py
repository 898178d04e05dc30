"""The importer's mappings for what torchvision's MobileNet, EfficientNet and ShuffleNet export:
Clip (relu6 / clip), HardSigmoid, HardSwish, Gelu, Mul (mul, and scale: squeeze-and-excitation),
Mul(x, Sigmoid(x)) (silu), the channel shuffle pattern (Reshape, Transpose, Reshape), Split /
Slice / SplitToSequence of the channels (channel_slice), CastLike of a constant; and pools
padded differently at the two ends (a symmetric pool, then a crop). Each mapping is checked for its layers and, through
aotconv's float64 reference, against onnxruntime; each near miss is rejected with its reason.
The last test builds a model of all of them on PoCL and checks the library against onnxruntime.
"""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from aotconv.onnx_import import UnsupportedError, import_model  # noqa: E402
from onnx_helpers import assert_matches_onnxruntime, model, node, rand, save  # noqa: E402


def imp(tmp_path, m, check=True):
    path = save(m, tmp_path / "m.onnx")
    im = import_model(path)
    if check:
        assert_matches_onnxruntime(im, path)
    return im


def rejected(tmp_path, m):
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError) as e:
        import_model(path)
    return e.value


def layers(im):
    return [{k: v for k, v in l.items() if k not in ("name", "inputs")}
            for l in im.description["layers"]]


def f32(*v):
    return np.array(v, np.float32).reshape(()) if len(v) == 1 else np.array(v, np.float32)


# ---------------------------------------------------------------------------------------------
# activations


@pytest.mark.parametrize("lo,hi,want", [
    (0.0, 6.0, {"op": "relu6"}),
    (-1.5, 0.25, {"op": "clip", "min": -1.5, "max": 0.25}),
    (0.1, None, {"op": "clip", "min": 0.1}),
    (None, 2.0, {"op": "clip", "max": 2.0}),
    (1.0, -1.0, {"op": "clip", "min": 1.0, "max": -1.0}),      # min > max: every value is max
    (None, None, {"op": "clip"}),
])
def test_clip_maps_to_relu6_or_clip(tmp_path, lo, hi, want):
    inits, ins = {}, ["c", "", ""]
    if lo is not None:
        inits["lo"], ins[1] = f32(lo), "lo"
    if hi is not None:
        inits["hi"], ins[2] = f32(hi), "hi"
    while ins[-1] == "":
        ins.pop()
    m = model([node("Conv", ["x", "w"], ["c"]), node("Clip", ins)], [2, 3, 5, 5],
              inits=dict(inits, w=rand(4, 3, 1, 1, scale=3)))
    assert layers(imp(tmp_path, m))[1] == want


def test_clip_with_a_computed_or_non_scalar_bound_is_rejected(tmp_path):
    m = model([node("Relu", ["x"], ["r"]), node("Clip", ["x", "lo"], name="clip")],
              [1, 3, 4, 4], inits={"lo": f32(0, 1)})
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.attr) == ("clip", "min") and "expected a scalar" in p.message


@pytest.mark.parametrize("attrs,want", [
    ({}, {"op": "hardsigmoid", "alpha": 0.2, "beta": 0.5}),
    ({"alpha": 1 / 6}, {"op": "hardsigmoid", "alpha": 0.16666667, "beta": 0.5}),
    ({"alpha": -0.3, "beta": 0.25}, {"op": "hardsigmoid", "alpha": -0.3, "beta": 0.25}),
])
def test_hardsigmoid_keeps_alpha_and_beta(tmp_path, attrs, want):
    m = model([node("HardSigmoid", ["x"], **attrs)], [2, 3, 4, 4])
    assert layers(imp(tmp_path, m)) == [want]


def test_hardswish_and_gelu(tmp_path):
    m = model([node("HardSwish", ["x"], ["a"]), node("Gelu", ["a"], ["b"]),
               node("Gelu", ["b"], approximate="tanh")], [2, 3, 4, 4], opset=20)
    assert layers(imp(tmp_path, m)) == [{"op": "hardswish"}, {"op": "gelu"},
                                        {"op": "gelu_tanh"}]


def test_activations_fold_into_the_conv_they_follow(tmp_path):
    from aotconv import passes
    m = model([node("Conv", ["x", "w", "b"], ["c"]), node("HardSwish", ["c"])], [1, 3, 6, 6],
              inits={"w": rand(5, 3, 3, 3), "b": rand(5)})
    net = passes.fuse_activations(imp(tmp_path, m).network)
    assert [(l.op, l.attrs["act"]) for l in net.layers] == [("conv", "hardswish")]


# ---------------------------------------------------------------------------------------------
# Mul: mul, scale, silu


def test_mul_of_one_shape_is_mul(tmp_path):
    m = model([node("Relu", ["x"], ["r"]), node("Mul", ["x", "r"])], [2, 3, 4, 5])
    assert layers(imp(tmp_path, m)) == [{"op": "relu"}, {"op": "mul"}]


@pytest.mark.parametrize("order", ["x_first", "s_first"])
def test_squeeze_and_excitation_mul_is_scale(tmp_path, order):
    nodes = [node("GlobalAveragePool", ["x"], ["p"]),
             node("Conv", ["p", "w1", "b1"], ["f1"]), node("Relu", ["f1"], ["r"]),
             node("Conv", ["r", "w2", "b2"], ["f2"]),
             node("HardSigmoid", ["f2"], ["s"], alpha=1 / 6),
             node("Mul", ["x", "s"] if order == "x_first" else ["s", "x"], name="se")]
    m = model(nodes, [2, 8, 5, 3], inits={"w1": rand(2, 8, 1, 1), "b1": rand(2),
                                          "w2": rand(8, 2, 1, 1), "b2": rand(8)})
    im = imp(tmp_path, m)
    assert layers(im)[-1] == {"op": "scale"}
    se = im.description["layers"][-1]
    assert se["inputs"] == ["input", im.description["layers"][-2]["name"]]


def test_mul_that_broadcasts_over_the_batch_is_rejected(tmp_path):
    m = model([node("ReduceMean", ["x"], ["p"], axes=[0, 2, 3], keepdims=1),
               node("Mul", ["x", "p"], name="m")], [2, 4, 3, 3], opset=17)
    problems = rejected(tmp_path, m).problems
    assert [(p.node, p.attr) for p in problems if p.op == "Mul"] == [("m", "input")]


def test_mul_over_the_channels_is_rejected(tmp_path):
    m = model([node("ReduceMean", ["x"], ["p"], axes=[1], keepdims=1),
               node("Relu", ["x"], ["r"]), node("Mul", ["r", "p"], name="m")],
              [2, 4, 3, 3], opset=17)
    problems = rejected(tmp_path, m).problems
    assert [(p.node, p.attr) for p in problems if p.op == "Mul"] == [("m", "input")]
    assert "[N, C, 1, 1] tensor (scale)" in str(problems[-1])


def test_mul_by_a_constant_is_rejected(tmp_path):
    m = model([node("Relu", ["x"], ["r"]), node("Mul", ["r", "k"], name="m")], [2, 3, 4, 4],
              inits={"k": rand(4)})
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.attr) == ("m", "input") and "constant 'k'" in p.message


@pytest.mark.parametrize("order", [["c", "s"], ["s", "c"]])
def test_x_times_sigmoid_x_is_silu(tmp_path, order):
    m = model([node("Conv", ["x", "w"], ["c"], name="conv"),
               node("Sigmoid", ["c"], ["s"], name="sig"), node("Mul", order, name="mul")],
              [1, 3, 5, 5], inits={"w": rand(4, 3, 3, 3, scale=2)})
    im = imp(tmp_path, m)
    assert layers(im)[1] == {"op": "silu"}
    assert im.origins[im.description["layers"][1]["name"]] == ["mul", "sig"]


def test_sigmoid_read_twice_stays_sigmoid_and_mul(tmp_path):
    m = model([node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["y"]),
               node("Add", ["y", "s"], ["z"])], [1, 3, 4, 4], outputs=("z",))
    assert [l["op"] for l in layers(imp(tmp_path, m))] == ["sigmoid", "mul", "add"]


# ---------------------------------------------------------------------------------------------
# channel shuffle


def shuffle_nodes(n, c, h, w, g, perm=(0, 2, 1, 3, 4), back=None):
    return [node("Reshape", ["x", "s5"], ["a"], name="r1"),
            node("Transpose", ["a"], ["b"], name="t", perm=list(perm)),
            node("Reshape", ["b", "s4"], name="r2")], \
        {"s5": np.array([n, g, c // g, h, w], np.int64),
         "s4": np.array(back or [n, c, h, w], np.int64)}


@pytest.mark.parametrize("n,c,g", [(1, 8, 2), (2, 12, 3), (1, 6, 6)])
def test_reshape_transpose_reshape_is_channel_shuffle(tmp_path, n, c, g):
    nodes, inits = shuffle_nodes(n, c, 3, 5, g)
    im = imp(tmp_path, model(nodes, [n, c, 3, 5], inits=inits))
    assert layers(im) == [{"op": "channel_shuffle", "groups": g}]
    assert im.origins[im.description["layers"][0]["name"]] == ["t", "r1", "r2"]


@pytest.mark.parametrize("perm,back", [((0, 1, 2, 4, 3), None), ((0, 2, 1, 3, 4), [1, 4, 6, 5])])
def test_other_rank5_transposes_are_rejected(tmp_path, perm, back):
    nodes, inits = shuffle_nodes(1, 8, 3, 5, 2, perm, back)
    e = rejected(tmp_path, model(nodes, [1, 8, 3, 5], inits=inits))
    assert {p.node for p in e.problems} >= {"t"}
    assert any("rank 5" in p.message or "no Transpose" in p.message for p in e.problems)


# ---------------------------------------------------------------------------------------------
# Split and Slice of the channels


def test_split_of_the_channels_is_one_channel_slice_per_output(tmp_path):
    m = model([node("Split", ["x", "sizes"], ["a", "b", "c"], name="split", axis=1),
               node("Relu", ["a"], ["ra"]), node("Concat", ["c", "ra"], axis=1)],
              [2, 9, 3, 4], inits={"sizes": np.array([2, 3, 4], np.int64)})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "channel_slice", "start": 0, "end": 2},
                          {"op": "channel_slice", "start": 5, "end": 9},
                          {"op": "relu"}, {"op": "concat"}]
    assert [l["name"] for l in im.description["layers"][:2]] == ["split.0", "split.2"]
    assert im.origins["split.0"] == im.origins["split.2"] == ["split"]   # the ONNX node


def test_split_in_two_halves_opset18(tmp_path):
    m = model([node("Split", ["x"], ["a", "b"], axis=-3, num_outputs=2),
               node("Concat", ["b", "a"], axis=1)], [1, 6, 4, 4], opset=18)
    assert layers(imp(tmp_path, m))[:2] == [{"op": "channel_slice", "start": 0, "end": 3},
                                            {"op": "channel_slice", "start": 3, "end": 6}]


def test_split_along_height_is_rejected(tmp_path):
    m = model([node("Split", ["x"], ["a", "b"], name="split", axis=2, num_outputs=2),
               node("Concat", ["a", "b"], axis=1)], [1, 6, 4, 4], opset=18)
    p = rejected(tmp_path, m).problems[0]
    assert p.node == "split" and "only along the channels" in p.message


@pytest.mark.parametrize("split,pos,want", [
    (np.array(3, np.int64), 1, (3, 6)),                   # chunks of 3
    (np.array(2, np.int64), -1, (4, 6)),
    (np.array([3, 3], np.int64), 0, (0, 3)),
    (None, 4, (4, 5)),                                    # pieces of one channel, kept
])
def test_sequence_at_of_a_channel_split_to_sequence_is_channel_slice(tmp_path, split, pos, want):
    """What the dynamo exporter writes for x.chunk(2, dim=1) before its optimiser runs."""
    inits = {"pos": np.array(pos, np.int64)}
    ins = ["x"]
    if split is not None:
        inits["split"], ins = split, ["x", "split"]
    m = model([node("SplitToSequence", ins, ["seq"], axis=1),
               node("SequenceAt", ["seq", "pos"], ["piece"], name="at"),
               node("Relu", ["piece"])], [2, 6, 3, 2], inits=inits, opset=18)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "channel_slice", "start": want[0], "end": want[1]},
                          {"op": "relu"}]
    assert im.origins[im.description["layers"][0]["name"]] == ["at", "SplitToSequence_0"]


def test_uneven_split_to_sequence_is_rejected(tmp_path):
    # ONNX's shape inference leaves the pieces of an uneven split without a static shape
    m = model([node("SplitToSequence", ["x", "split"], ["seq"], axis=1),
               node("SequenceAt", ["seq", "pos"], ["piece"], name="at"), node("Relu", ["piece"])],
              [2, 7, 3, 2], inits={"pos": np.array(0, np.int64),
                                   "split": np.array([2, 5], np.int64)}, opset=18)
    assert "at" in {p.node for p in rejected(tmp_path, m).problems}


def test_split_to_sequence_along_height_is_rejected(tmp_path):
    m = model([node("SplitToSequence", ["x"], ["seq"], axis=2),
               node("SequenceAt", ["seq", "pos"], ["piece"], name="at"), node("Relu", ["piece"])],
              [2, 7, 3, 2], inits={"pos": np.array(0, np.int64)}, opset=18)
    assert "at" in {p.node for p in rejected(tmp_path, m).problems}


def test_castlike_of_a_constant_to_the_input_type_folds(tmp_path):
    """The dynamo exporter's zero conv bias before its optimiser: Expand(CastLike(0, x),
    Shape(W)[0:1])."""
    m = model([node("Shape", ["w"], ["n"], start=0, end=1),
               node("CastLike", ["zero", "x"], ["z"]), node("Expand", ["z", "n"], ["b"]),
               node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], [1, 3, 5, 5],
              inits={"w": rand(4, 3, 3, 3), "zero": np.array(0.0, np.float64)}, opset=18)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "conv", "out": 4, "kernel": 3, "pad": 1}]
    bias = im.tensors[im.description["layers"][0]["name"] + ".bias"]
    assert bias.dtype == np.float32 and not bias.any() and bias.shape == (4,)


@pytest.mark.parametrize("starts,ends,axes,want", [
    ([2], [5], [1], (2, 5)),
    ([-4], [2**62], [1], (6, 10)),                        # negative start, end past the end
    ([0, 1], [2**31, 7], [0, -3], (1, 7)),                # the batch axis kept whole
    ([0, 3], [4, 8], [2, 1], (3, 8)),                     # H kept whole
])
def test_slice_of_the_channels_is_channel_slice(tmp_path, starts, ends, axes, want):
    m = model([node("Slice", ["x", "st", "en", "ax"])], [2, 10, 4, 3],
              inits={"st": np.array(starts, np.int64), "en": np.array(ends, np.int64),
                     "ax": np.array(axes, np.int64)})
    assert layers(imp(tmp_path, m)) == [{"op": "channel_slice", "start": want[0],
                                         "end": want[1]}]


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0], [8], [1], [2]),                                 # a step
    ([1], [3], [2], None),                                # along H
    ([0, 1], [10, 3], [1, 3], None),                      # channels and W
])
def test_other_slices_are_rejected(tmp_path, starts, ends, axes, steps):
    inits = {"st": np.array(starts, np.int64), "en": np.array(ends, np.int64),
             "ax": np.array(axes, np.int64)}
    ins = ["x", "st", "en", "ax"]
    if steps:
        inits["sp"], ins = np.array(steps, np.int64), ins + ["sp"]
    m = model([node("Slice", ins, name="slice")], [2, 10, 4, 3], inits=inits)
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.op) == ("slice", "Slice") and "only as channels [start, end)" in p.message


# ---------------------------------------------------------------------------------------------
# pools padded differently at the two ends: a symmetric pool, then a crop


@pytest.mark.parametrize("op,attrs,shape,want_pool,want_crop", [
    # Caffe2's Inception-v1: a 7x7 average padded at the end only, which ceil_mode is not
    ("AveragePool", dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1]), [1, 3, 7, 7],
     {"pad": 1}, {"top": 1, "left": 1}),
    ("AveragePool", dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1], count_include_pad=1),
     [1, 3, 7, 7], {"pad": 1, "count_include_pad": True}, {"top": 1, "left": 1}),
    # SAME_UPPER / SAME_LOWER over an odd total
    ("MaxPool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER"), [1, 2, 5, 5],
     {"pad": 1}, {"top": 1, "left": 1}),
    ("AveragePool", dict(kernel_shape=[3, 2], auto_pad="SAME_LOWER"), [2, 2, 5, 6],
     {"pad": 1}, {"right": 1}),
    # begin larger than end: the last outputs dropped; stride 2 with the difference 2
    ("MaxPool", dict(kernel_shape=[4, 4], strides=[2, 2], pads=[2, 0, 0, 2]), [1, 2, 9, 8],
     {"pad": 2}, {"bottom": 1, "left": 1}),
    ("AveragePool", dict(kernel_shape=[4, 4], strides=[2, 2], pads=[0, 0, 2, 2],
                         count_include_pad=1), [1, 2, 8, 8],
     {"pad": 2, "count_include_pad": True}, {"top": 1, "left": 1}),
    # 1-D
    ("MaxPool", dict(kernel_shape=[3], pads=[0, 1]), [1, 2, 9], {"pad": [1, 0]},
     {"top": 1}),
])
def test_asymmetric_pool_pads_are_a_pool_and_a_crop(tmp_path, op, attrs, shape, want_pool,
                                                    want_crop):
    m = model([node(op, ["x"], name="p", **attrs)], shape)
    got = layers(imp(tmp_path, m))
    assert len(got) == 2 and got[1] == {"op": "crop", **want_crop}
    assert {k: got[0][k] for k in want_pool} == want_pool and "ceil_mode" not in got[0]


@pytest.mark.parametrize("attrs,message", [
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1),
     "not a whole number of strides 2"),
    (dict(kernel_shape=[3, 3], pads=[0, 0, 2, 2]), "more than half the window"),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1), "ceil_mode"),
])
def test_asymmetric_pools_a_crop_cannot_make_are_rejected(tmp_path, attrs, message):
    m = model([node("AveragePool", ["x"], name="p", **attrs)], [1, 2, 14, 14])
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.attr) == ("p", "pads") and message in p.message


def test_the_error_lists_the_new_ops(tmp_path):
    m = model([node("Transpose", ["x"], perm=[0, 1, 3, 2], name="t")], [1, 2, 3, 4])
    text = str(rejected(tmp_path, m))
    for op in ("Clip", "HardSigmoid", "HardSwish", "Gelu", "Mul"):
        assert op in text


# ---------------------------------------------------------------------------------------------
# built on PoCL


def test_se_and_shuffle_model_builds_and_matches_onnxruntime(tmp_path):
    """A ShuffleNet unit with squeeze-and-excitation, SiLU and a SAME_UPPER max pool (a pool
    and a crop): `aotconv build --no-tune --check` on PoCL, then the library against
    onnxruntime."""
    from aotconv.cli import main
    from aotconv.harness import close
    from aotconv.runtime import load
    from onnx_helpers import ort_run
    nodes = [
        node("Split", ["x"], ["h1", "h2"], axis=1, num_outputs=2),
        node("Conv", ["h2", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=4),
        node("Sigmoid", ["c1"], ["sg"]), node("Mul", ["c1", "sg"], ["act"]),
        node("GlobalAveragePool", ["act"], ["p"]), node("Conv", ["p", "w2", "b2"], ["f"]),
        node("HardSigmoid", ["f"], ["s"], alpha=1 / 6), node("Mul", ["s", "act"], ["se"]),
        node("Clip", ["se", "zero", "six"], ["r6"]),
        node("MaxPool", ["r6"], ["mp"], kernel_shape=[2, 2], auto_pad="SAME_UPPER"),
        node("Concat", ["h1", "mp"], ["cat"], axis=1),
    ]
    sh, inits = shuffle_nodes(1, 8, 6, 5, 2)
    sh[0].input[0] = "cat"
    inits.update(w1=rand(4, 1, 3, 3), b1=rand(4), w2=rand(4, 4, 1, 1), b2=rand(4),
                 zero=f32(0), six=f32(6))
    path = save(model(nodes + sh, [1, 8, 6, 5], inits=inits, opset=18), tmp_path / "u.onnx")
    ops = [l["op"] for l in import_model(path).description["layers"]]
    assert ops == ["channel_slice", "channel_slice", "conv", "silu", "global_avgpool", "conv",
                   "hardsigmoid", "scale", "relu6", "maxpool", "crop", "concat",
                   "channel_shuffle"]
    out = tmp_path / "build"
    assert main(["build", path, "--target", "pocl-cpu", "--no-tune", "--check", "--quiet",
                 "-o", str(out)]) == 0
    x = np.random.default_rng(3).standard_normal((1, 8, 6, 5)).astype(np.float32)
    with load(out) as lib:
        got = lib(x)
    ok, err = close(got, ort_run(path, x)[0])
    assert ok, err

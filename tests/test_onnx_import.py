"""The ONNX importer without a device: each mapping checked for its layer and, through aotconv's
numpy reference with the imported weights, against onnxruntime; each rejection for its message.
"""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from aotconv.onnx_import import OnnxError, UnsupportedError, import_model  # noqa: E402
from onnx_helpers import assert_matches_onnxruntime, model, node, rand, save  # noqa: E402


def imp(tmp_path, m, name="m.onnx", check=True, **kw):
    path = save(m, tmp_path / name)
    im = import_model(path, **kw)
    if check:
        assert_matches_onnxruntime(im, path)
    return im


def rejected(tmp_path, m, **kw):
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError) as e:
        import_model(path, **kw)
    return e.value


def layers(im):
    return [{k: v for k, v in l.items() if k not in ("name", "inputs")}
            for l in im.description["layers"]]


# ---------------------------------------------------------------------------------------------
# Conv


def test_conv_maps_kernel_stride_pads_dilation_groups_and_bias(tmp_path):
    w, b = rand(6, 2, 3, 5), rand(6)
    m = model([node("Conv", ["x", "w", "b"], strides=[2, 1], pads=[1, 2, 1, 2],
                    dilations=[1, 2], group=2)], [2, 4, 9, 11], inits={"w": w, "b": b})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "conv", "out": 6, "kernel": [3, 5], "stride": [2, 1],
                           "pad": [1, 2], "dilation": [1, 2], "groups": 2}]
    name = im.description["layers"][0]["name"]
    assert np.array_equal(im.tensors[f"{name}.weight"], w)
    assert np.array_equal(im.tensors[f"{name}.bias"], b)


def test_conv_without_bias_has_bias_false(tmp_path):
    m = model([node("Conv", ["x", "w"], pads=[1, 1, 1, 1])], [1, 3, 7, 7],
              inits={"w": rand(4, 3, 3, 3)})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "conv", "out": 4, "kernel": 3, "pad": 1, "bias": False}]
    assert im.params.size == 4 * 3 * 3 * 3


@pytest.mark.parametrize("auto_pad, size, stride, k, want", [
    ("SAME_UPPER", 8, 1, 4, "same"), ("SAME_UPPER", 7, 2, 3, 1), ("SAME_LOWER", 7, 2, 3, 1),
    ("VALID", 8, 2, 3, None)])
def test_conv_auto_pad(tmp_path, auto_pad, size, stride, k, want):
    # an even total is symmetric padding; an odd one at the end only is 'same'
    m = model([node("Conv", ["x", "w"], auto_pad=auto_pad, strides=[stride, stride])],
              [1, 2, size, size], inits={"w": rand(3, 2, k, k)})
    assert layers(imp(tmp_path, m))[0].get("pad") == want


def test_conv_same_lower_with_odd_total_padding_is_rejected(tmp_path):
    m = model([node("Conv", ["x", "w"], auto_pad="SAME_LOWER", name="c")], [1, 2, 8, 8],
              inits={"w": rand(3, 2, 4, 4)})
    e = rejected(tmp_path, m)
    assert "node 'c' (Conv, opset 17): pads: asymmetric padding" in str(e)


def test_conv_asymmetric_pads_are_rejected(tmp_path):
    m = model([node("Conv", ["x", "w"], pads=[0, 1, 2, 1], name="c")], [1, 2, 8, 8],
              inits={"w": rand(3, 2, 3, 3)})
    e = rejected(tmp_path, m)
    assert len(e.problems) == 1 and e.problems[0].attr == "pads"
    assert "'same'" in e.problems[0].message


def test_conv_1d_is_a_2d_conv_of_width_1(tmp_path):
    m = model([node("Conv", ["x", "w", "b"], pads=[2, 2], strides=[2])], [2, 3, 17],
              inits={"w": rand(5, 3, 5), "b": rand(5)})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "conv", "out": 5, "kernel": [5, 1], "stride": [2, 1],
                           "pad": [2, 0]}]
    assert im.network.input_shape == (2, 3, 17, 1)


def test_conv_weight_computed_at_run_time_is_rejected(tmp_path):
    m = model([node("Relu", ["w"], ["w2"]), node("Conv", ["x", "w2"], name="c")],
              [3, 2, 5, 5], extra_inputs=[("w", [3, 2, 3, 3])])
    with pytest.raises(OnnxError, match="node 'c' .*W: must be a constant"):
        import_model(save(m, tmp_path / "m.onnx"))


# ---------------------------------------------------------------------------------------------
# pooling


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("k, s, p, ceil", [(3, 2, 1, 0), (2, 2, 0, 1), (3, 1, 1, 0),
                                           (3, 2, 0, 1)])
def test_pools_map_kernel_stride_pad_and_ceil_mode(tmp_path, op, k, s, p, ceil):
    m = model([node(op, ["x"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                    ceil_mode=ceil)], [1, 3, 10, 10])
    im = imp(tmp_path, m)
    l = layers(im)[0]
    assert l["op"] == ("maxpool" if op == "MaxPool" else "avgpool")
    assert (l["kernel"], l["stride"], l.get("pad", 0), l.get("ceil_mode", False)) == \
        (k, s, p, bool(ceil))


def test_avgpool_count_include_pad(tmp_path):
    m = model([node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1] * 4,
                    count_include_pad=1)], [1, 2, 6, 6])
    assert layers(imp(tmp_path, m))[0]["count_include_pad"] is True


def test_pool_default_stride_is_one_in_onnx(tmp_path):
    m = model([node("MaxPool", ["x"], kernel_shape=[2, 2])], [1, 1, 5, 5])
    assert layers(imp(tmp_path, m))[0]["stride"] == 1


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_end_padding_that_equals_ceil_mode_is_ceil_mode(tmp_path, op):
    # what Caffe2 exports for ceil_mode: 112 -> 56 with a 3x3 window, stride 2
    m = model([node(op, ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])],
              [1, 2, 14, 14])
    l = layers(imp(tmp_path, m))[0]
    assert l["ceil_mode"] is True and "pad" not in l


def test_pool_end_padding_that_is_not_ceil_mode_is_a_symmetric_pool_then_a_crop(tmp_path):
    # a 7x7 window, stride 1, over 7x7 padded by 1 at the end gives 2x2; ceil_mode gives 1x1:
    # padded by 1 on both sides it gives 3x3, whose first row and column ONNX does not have
    m = model([node("AveragePool", ["x"], kernel_shape=[7, 7], pads=[0, 0, 1, 1], name="p")],
              [1, 2, 7, 7])
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "avgpool", "kernel": 7, "stride": 1, "pad": 1},
                          {"op": "crop", "top": 1, "left": 1}]
    assert [l["name"] for l in im.description["layers"]] == ["p", "p.crop"]
    assert im.origins == {"p": ["p"], "p.crop": ["p"]}


def test_pool_counting_end_padding_is_rejected(tmp_path):
    m = model([node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2],
                    pads=[0, 0, 1, 1], count_include_pad=1)], [1, 2, 14, 14])
    assert rejected(tmp_path, m).problems[0].attr == "pads"


def test_pool_dilation_and_wide_pads_are_rejected_together(tmp_path):
    m = model([node("MaxPool", ["x"], ["a"], kernel_shape=[3, 3], dilations=[2, 2], name="m1"),
               node("MaxPool", ["a"], kernel_shape=[2, 2], pads=[2, 2, 2, 2], name="m2")],
              [1, 2, 12, 12])
    e = rejected(tmp_path, m)
    assert [(p.node, p.attr) for p in e.problems] == [("m1", "dilations"), ("m2", "pads")]


def test_maxpool_indices_output_is_rejected(tmp_path):
    m = model([node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])], [1, 1, 4, 4],
              outputs=("y", "i"))
    assert rejected(tmp_path, m).problems[0].attr == "output 1"


def test_1d_pool(tmp_path):
    m = model([node("MaxPool", ["x"], kernel_shape=[3], strides=[2], pads=[1, 1])], [2, 3, 11])
    assert layers(imp(tmp_path, m))[0] == {"op": "maxpool", "kernel": [3, 1], "stride": [2, 1],
                                           "pad": [1, 0]}


# ---------------------------------------------------------------------------------------------
# global average pooling and ReduceMean


def test_global_average_pool(tmp_path):
    m = model([node("GlobalAveragePool", ["x"])], [2, 3, 5, 4])
    assert layers(imp(tmp_path, m)) == [{"op": "global_avgpool"}]


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_over_h_w_is_global_avgpool(tmp_path, opset, keepdims):
    inits = {}
    if opset >= 18:
        inits["axes"] = np.array([-1, 2], np.int64)
        n = node("ReduceMean", ["x", "axes"], keepdims=keepdims)
    else:
        n = node("ReduceMean", ["x"], axes=[-1, 2], keepdims=keepdims)
    im = imp(tmp_path, model([n], [2, 3, 5, 4], inits=inits, opset=opset))
    assert layers(im) == [{"op": "global_avgpool"}]
    assert im.outputs[0][1] == ((2, 3, 1, 1) if keepdims else (2, 3))


@pytest.mark.parametrize("axes", [[1, 2, 3], [2], [0]])
def test_reduce_mean_over_other_axes_is_rejected(tmp_path, axes):
    m = model([node("ReduceMean", ["x"], axes=axes, name="r")], [2, 3, 5, 4], opset=13)
    assert rejected(tmp_path, m).problems[0].attr == "axes"


# ---------------------------------------------------------------------------------------------
# element-wise, softmax, lrn, concat, add


@pytest.mark.parametrize("op, want", [("Relu", {"op": "relu"}), ("Sigmoid", {"op": "sigmoid"}),
                                      ("Tanh", {"op": "tanh"})])
def test_activations(tmp_path, op, want):
    assert layers(imp(tmp_path, model([node(op, ["x"])], [2, 3, 4, 5]))) == [want]


def test_leaky_relu_alpha_default_and_given(tmp_path):
    m = model([node("LeakyRelu", ["x"], ["a"]), node("LeakyRelu", ["a"], alpha=0.2)], [2, 3])
    assert layers(imp(tmp_path, m)) == [{"op": "leaky_relu", "alpha": 0.01},
                                        {"op": "leaky_relu", "alpha": 0.2}]


@pytest.mark.parametrize("shape, axis", [([2, 7], -1), ([2, 7, 3, 3], 1), ([2, 5, 3], -2)])
def test_softmax_over_channels(tmp_path, shape, axis):
    assert layers(imp(tmp_path, model([node("Softmax", ["x"], axis=axis)], shape))) == \
        [{"op": "softmax"}]


@pytest.mark.parametrize("shape, axis, want", [([2, 7, 3, 3], -1, 3), ([2, 7, 3, 3], 2, 2),
                                              ([2, 5, 3], -1, 2)])
def test_softmax_over_another_axis(tmp_path, shape, axis, want):
    m = model([node("Softmax", ["x"], axis=axis)], shape)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "softmax", "axis": want}]


def test_softmax_over_the_batch_is_rejected(tmp_path):
    m = model([node("Softmax", ["x"], name="s", axis=0)], [2, 7, 3, 3])
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.op, p.attr) == ("s", "Softmax", "axis")
    assert "normalises across the batch" in p.message


def test_softmax_of_opset_11_is_converted_and_flattens(tmp_path):
    # opset < 13 softmax works on the tensor flattened from `axis`: the version converter
    # writes Flatten -> Softmax -> Reshape, which is one softmax over axes axis..3 together
    m = model([node("Softmax", ["x"], axis=1)], [2, 7, 1, 1], opset=11)
    im = imp(tmp_path, m)
    assert im.source_opset == 11 and im.opset == 13
    assert [l["op"] for l in layers(im)] == ["softmax"]
    m = model([node("Softmax", ["x"], axis=1)], [2, 7, 2, 1], opset=11)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "softmax", "axis": [1, 2, 3]}]


def test_lrn(tmp_path):
    m = model([node("LRN", ["x"], size=5, alpha=2e-4, beta=0.6, bias=1.5)], [2, 8, 3, 3])
    assert layers(imp(tmp_path, m)) == [{"op": "lrn", "size": 5, "alpha": 2e-4, "beta": 0.6,
                                         "k": 1.5}]


def test_lrn_even_size_is_rejected(tmp_path):
    m = model([node("LRN", ["x"], size=4, name="n")], [2, 8, 3, 3])
    assert rejected(tmp_path, m).problems[0].attr == "size"


def test_concat_channels_and_add(tmp_path):
    w1, w2 = rand(3, 2, 1, 1), rand(3, 2, 1, 1)
    m = model([node("Conv", ["x", "w1"], ["a"]), node("Conv", ["x", "w2"], ["b"]),
               node("Concat", ["a", "b", "a"], ["c"], axis=-3),
               node("Add", ["a", "b"], ["d"]), node("Sum", ["a", "b", "d"], ["e"])],
              [2, 2, 4, 4], outputs=("c", "e"), inits={"w1": w1, "w2": w2})
    im = imp(tmp_path, m)
    assert [l["op"] for l in layers(im)] == ["conv", "conv", "concat", "add", "add"]
    assert im.description["outputs"] == [im.description["layers"][i]["name"] for i in (2, 4)]


def test_concat_over_another_axis_is_rejected(tmp_path):
    m = model([node("Relu", ["x"], ["a"]), node("Concat", ["x", "a"], axis=2)], [2, 2, 4, 4])
    assert rejected(tmp_path, m).problems[0].attr == "axis"


def test_single_input_concat_and_sum_are_removed(tmp_path):
    m = model([node("Relu", ["x"], ["a"]), node("Concat", ["a"], ["b"], axis=1),
               node("Sum", ["b"], ["c"]), node("Sigmoid", ["c"])], [2, 2, 4, 4])
    assert [l["op"] for l in layers(imp(tmp_path, m))] == ["relu", "sigmoid"]


def test_add_of_a_constant_or_with_broadcasting_is_rejected(tmp_path):
    m = model([node("Add", ["x", "c"], ["a"], name="const"),
               node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1, name="rm"),
               node("Add", ["a", "m"], name="bcast")], [2, 3, 4, 4],
              inits={"c": rand(3, 4, 4)}, opset=13)
    e = rejected(tmp_path, m)
    assert [p.node for p in e.problems] == ["const", "bcast"]
    assert "no broadcasting" in e.problems[1].message


# ---------------------------------------------------------------------------------------------
# batch normalization


def _bn_inits(c):
    return {"s": rand(c), "b": rand(c), "mean": rand(c), "var": np.abs(rand(c)) + 0.5}


def test_batchnorm(tmp_path):
    inits = _bn_inits(3)
    m = model([node("BatchNormalization", ["x", "s", "b", "mean", "var"], epsilon=1e-3)],
              [2, 3, 4, 4], inits=inits)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "batchnorm", "eps": 1e-3}]
    n = im.description["layers"][0]["name"]
    for ours, theirs in (("gamma", "s"), ("beta", "b"), ("mean", "mean"), ("var", "var")):
        assert np.array_equal(im.tensors[f"{n}.{ours}"], inits[theirs])


def test_batchnorm_then_per_channel_mul_add_is_folded(tmp_path):
    inits = dict(_bn_inits(3), m=rand(1, 3, 1, 1), a=rand(3, 1, 1))
    m = model([node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["t"], name="bn"),
               node("Mul", ["m", "t"], ["u"], name="mul"), node("Add", ["u", "a"], name="add")],
              [2, 3, 4, 4], inits=inits)
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "batchnorm", "eps": 1e-5}]
    assert im.origins[im.description["layers"][0]["name"]] == ["bn", "mul", "add"]


def test_batchnorm_then_a_non_channel_mul_is_not_folded(tmp_path):
    inits = dict(_bn_inits(3), m=rand(4, 4))
    m = model([node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["t"]),
               node("Mul", ["t", "m"], name="mul")], [2, 3, 4, 4], inits=inits)
    assert rejected(tmp_path, m).problems[0].node == "mul"


def test_batchnorm_training_mode_is_rejected(tmp_path):
    m = model([node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y", "m", "v"],
                    training_mode=1)], [2, 3, 4, 4], inits=_bn_inits(3))
    assert rejected(tmp_path, m).problems[0].attr == "training_mode"


# ---------------------------------------------------------------------------------------------
# Gemm, MatMul, Flatten, Reshape


@pytest.mark.parametrize("trans_b, alpha, beta, c_shape", [
    (0, 1.0, 1.0, None), (1, 0.5, 2.0, [5]), (0, 1.0, 0.5, [1, 5]), (1, 2.0, 1.0, [])])
def test_gemm_is_dense(tmp_path, trans_b, alpha, beta, c_shape):
    b = rand(5, 6) if trans_b else rand(6, 5)
    inits = {"b": b}
    ins = ["x", "b"]
    if c_shape is not None:
        inits["c"] = rand(*c_shape) if c_shape else np.float32(0.3)
        ins.append("c")
    m = model([node("Gemm", ins, transB=trans_b, alpha=alpha, beta=beta)], [3, 6], inits=inits)
    im = imp(tmp_path, m)
    want = {"op": "dense", "out": 5}
    if c_shape is None:
        want["bias"] = False
    assert layers(im) == [want]


def test_gemm_per_row_bias_and_transposed_a_are_rejected(tmp_path):
    m = model([node("Gemm", ["x", "b", "c"], ["a"], name="rowbias"),
               node("Gemm", ["a", "b2"], transA=1, name="ta")], [3, 6],
              inits={"b": rand(6, 3), "c": rand(3, 3), "b2": rand(3, 2)})
    e = rejected(tmp_path, m)
    assert [(p.node, p.attr) for p in e.problems] == [("rowbias", "C"), ("ta", "transA")]


def test_matmul_add_is_dense_with_bias(tmp_path):
    m = model([node("MatMul", ["x", "w"], ["a"], name="mm"), node("Add", ["bias", "a"])],
              [4, 6], inits={"w": rand(6, 3), "bias": rand(3)})
    im = imp(tmp_path, m)
    assert layers(im) == [{"op": "dense", "out": 3}]
    assert im.origins[im.description["layers"][0]["name"]][0] == "mm"


def test_matmul_of_two_run_time_tensors_is_rejected(tmp_path):
    m = model([node("Relu", ["x"], ["a"]), node("MatMul", ["x", "a"], name="mm")], [4, 4])
    assert rejected(tmp_path, m).problems[0].node == "mm"


def test_flatten_or_reshape_before_gemm_is_dropped(tmp_path):
    shape = np.array([0, -1], np.int64)
    m = model([node("Conv", ["x", "w"], ["c"]),
               node("Reshape", ["c", "shape"], ["f"]), node("Gemm", ["f", "b"], ["g"]),
               node("Flatten", ["c"], ["f2"]), node("Gemm", ["f2", "b"], ["h"])],
              [2, 3, 5, 5], outputs=("g", "h"),
              inits={"w": rand(4, 3, 3, 3), "shape": shape, "b": rand(36, 7)})
    im = imp(tmp_path, m)
    assert [l["op"] for l in layers(im)] == ["conv", "dense", "dense"]


def test_shape_subgraph_is_folded(tmp_path):
    # what torch.onnx writes for x.view(x.size(0), -1)
    m = model([node("Shape", ["x"], ["s"]),
               node("Gather", ["s", "zero"], ["n"], axis=0),
               node("Unsqueeze", ["n", "ax"], ["n1"]),
               node("Concat", ["n1", "minus1"], ["shape"], axis=0),
               node("Reshape", ["x", "shape"], ["f"]), node("Gemm", ["f", "b"], transB=1)],
              [2, 3, 4, 4], inits={"zero": np.array(0, np.int64), "ax": np.array([0], np.int64),
                                   "minus1": np.array([-1], np.int64), "b": rand(5, 48)})
    assert layers(imp(tmp_path, m)) == [{"op": "dense", "out": 5, "bias": False}]


def test_flatten_and_reshape_that_keep_the_batch_are_flatten(tmp_path):
    m = model([node("Relu", ["x"], ["a"]), node("Flatten", ["a"], ["f"]),
               node("Softmax", ["f"])], [2, 3, 4, 4])
    assert [l["op"] for l in layers(imp(tmp_path, m))] == ["relu", "flatten", "softmax"]


@pytest.mark.parametrize("axis", [0, 2])
def test_flatten_across_the_batch_is_rejected(tmp_path, axis):
    m = model([node("Relu", ["x"], ["a"]), node("Flatten", ["a"], axis=axis, name="f")],
              [2, 3, 4, 4])
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.attr) == ("f", "axis")


def test_squeeze_of_trailing_ones_is_removed_and_axis_keeps_its_meaning(tmp_path):
    # softmax axis -1 of the squeezed [N, C] is the channel axis, not W of [N, C, 1, 1]
    m = model([node("GlobalAveragePool", ["x"], ["g"]),
               node("Squeeze", ["g", "axes"], ["s"]), node("Softmax", ["s"], axis=-1)],
              [2, 5, 3, 3], inits={"axes": np.array([2, 3], np.int64)})
    assert [l["op"] for l in layers(imp(tmp_path, m))] == ["global_avgpool", "softmax"]


# ---------------------------------------------------------------------------------------------
# Identity, Dropout, Pad


def test_identity_and_dropout_are_removed(tmp_path):
    m = model([node("Identity", ["x"], ["a"]), node("Relu", ["a"], ["b"]),
               node("Dropout", ["b", "ratio"], ["c"]), node("Sigmoid", ["c"])],
              [2, 3, 4, 4], inits={"ratio": np.array(0.3, np.float32)})
    assert [l["op"] for l in layers(imp(tmp_path, m))] == ["relu", "sigmoid"]


def test_a_graph_that_only_passes_its_input_through_is_one_identity_layer(tmp_path):
    im = imp(tmp_path, model([node("Identity", ["x"])], [1, 2, 3, 3]))
    assert layers(im) == [{"op": "dropout"}]


def test_dropout_in_training_mode_is_rejected(tmp_path):
    m = model([node("Dropout", ["x", "ratio", "t"], name="d")], [2, 3],
              inits={"ratio": np.array(0.5, np.float32), "t": np.array(True)})
    assert rejected(tmp_path, m).problems[0].attr == "training_mode"


def _pads(*p):
    return np.array(p, np.int64)


def test_pad_is_merged_into_conv(tmp_path):
    m = model([node("Pad", ["x", "p"], ["a"], name="pad"), node("Conv", ["a", "w"], name="c")],
              [1, 2, 6, 6], inits={"p": _pads(0, 0, 1, 2, 0, 0, 1, 2), "w": rand(3, 2, 3, 3)})
    im = imp(tmp_path, m)
    assert layers(im)[0]["pad"] == [1, 2]
    assert im.origins[im.description["layers"][0]["name"]] == ["c", "pad"]


def test_pad_into_conv_as_same(tmp_path):
    # TF-style SAME for a stride-2 3x3 conv on 8x8: pad 0 top/left, 1 bottom/right
    m = model([node("Pad", ["x", "p"], ["a"]), node("Conv", ["a", "w"], strides=[2, 2])],
              [1, 2, 8, 8], inits={"p": _pads(0, 0, 0, 0, 0, 0, 1, 1), "w": rand(3, 2, 3, 3)})
    assert layers(imp(tmp_path, m))[0]["pad"] == "same"


def test_pad_with_axes_is_merged_into_avgpool_counting_the_pads(tmp_path):
    m = model([node("Pad", ["x", "p", "", "axes"], ["a"]),
               node("AveragePool", ["a"], kernel_shape=[3, 3])],
              [1, 2, 6, 6], inits={"p": _pads(1, 1, 1, 1), "axes": _pads(2, 3)}, opset=18)
    l = layers(imp(tmp_path, m))[0]
    assert (l["pad"], l["count_include_pad"]) == (1, True)


def test_zero_pad_merges_into_maxpool_only_after_relu(tmp_path):
    p = _pads(0, 0, 1, 1, 0, 0, 1, 1)
    ok = model([node("Relu", ["x"], ["r"]), node("Pad", ["r", "p"], ["a"]),
                node("MaxPool", ["a"], kernel_shape=[3, 3], strides=[2, 2])],
               [1, 2, 7, 7], inits={"p": p})
    assert layers(imp(tmp_path, ok))[1]["pad"] == 1
    bad = model([node("Pad", ["x", "p"], ["a"], name="pad"),
                 node("MaxPool", ["a"], kernel_shape=[3, 3], strides=[2, 2])],
                [1, 2, 7, 7], inits={"p": p})
    assert rejected(tmp_path, bad).problems[0].node == "pad"


def test_reflect_pad_is_rejected(tmp_path):
    m = model([node("Pad", ["x", "p"], ["a"], mode="reflect", name="pad"),
               node("Conv", ["a", "w"])], [1, 2, 6, 6],
              inits={"p": _pads(0, 0, 1, 1, 0, 0, 1, 1), "w": rand(3, 2, 3, 3)})
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.op) == ("pad", "Pad")


# ---------------------------------------------------------------------------------------------
# every problem at once; names; shapes; inputs and outputs


def test_every_unsupported_node_is_reported_in_one_error(tmp_path):
    m = model([node("Conv", ["x", "w"], ["a"], name="/features/conv", pads=[0, 0, 1, 1]),
               node("Transpose", ["a"], ["b"], name="/t", perm=[0, 1, 3, 2]),
               node("Softmax", ["b"], ["c"], name="/sm", axis=0),
               node("Relu", ["c"], name="/ok")], [1, 2, 6, 6], inits={"w": rand(3, 2, 3, 3)})
    e = rejected(tmp_path, m)
    text = str(e)
    assert text.count("\n") == 3 and "3 nodes aotconv cannot build" in text
    assert [(p.node, p.op, p.opset, p.attr) for p in e.problems] == \
        [("/features/conv", "Conv", 17, "pads"), ("/t", "Transpose", 17, None),
         ("/sm", "Softmax", 17, "axis")]
    assert "node '/t' (Transpose, opset 17): aotconv has no Transpose; it imports" in text


def test_an_attribute_the_mapping_does_not_know_is_reported():
    # the checker already refuses unknown attributes; the mapping refuses them too, so that
    # an attribute a newer opset adds is never silently read as its default
    from aotconv.onnx_import import ir, mapping
    n = ir.Node("r", "Relu", ["x"], ["y"], {"flavour": 2}, 17)
    g = ir.Graph([n], {}, {"x": (1, 2, 3, 3), "y": (1, 2, 3, 3)}, {"x": 1, "y": 1}, "x",
                 [("y", "y")], 17)
    m, problems = mapping.map_node(n, g)
    assert m is None and [a for a, _ in problems] == ["flavour"]


def test_node_names_become_readable_unique_layer_names(tmp_path):
    w = rand(2, 2, 1, 1)
    names = ["/layer1/layer1.0/conv1/Conv", "/layer1/layer1.0/conv1/Conv_1", "", "input",
             "1st", "a" * 200, "Layer1.0.Conv1.conv", "x:y z"]
    nodes, prev = [], "x"
    for i, n in enumerate(names):
        nodes.append(node("Conv", [prev, "w"], [f"t{i}"], name=n))
        prev = f"t{i}"
    m = model(nodes, [1, 2, 3, 3], outputs=(prev,), inits={"w": w})
    got = [l["name"] for l in imp(tmp_path, m).description["layers"]]
    assert got[:3] == ["layer1.0.conv1.Conv", "layer1.0.conv1.Conv_1", "Conv_2"]
    assert got[3] == "input_2" and got[4] == "_1st" and len(got[5]) == 128
    assert got[6] == "Layer1.0.Conv1.conv_2" and got[7] == "x.y_z"
    import re
    keys = {n.lower().replace(".", "_").replace("-", "_") for n in got}
    assert len(keys) == len(got)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}", n) for n in got)


def test_symbolic_dims_need_input_shape(tmp_path):
    m = model([node("Relu", ["image"])], ["batch", 3, "h", "w"], x_name="image")
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(OnnxError) as e:
        import_model(path)
    msg = str(e.value)
    assert "\n" not in msg and "'image'" in msg and "--input-shape image=1x3x1x1" in msg
    im = import_model(path, input_shapes=["image=2x3x5x7"])
    assert im.network.input_shape == (2, 3, 5, 7)
    with pytest.raises(OnnxError, match="names 'x', but the model's input is 'image'"):
        import_model(path, input_shapes=["x=2x3x5x7"])


def test_symbolic_batch_alone_takes_batch(tmp_path):
    m = model([node("Relu", ["x"])], ["N", 3, 4, 4])
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(OnnxError, match="or --batch N"):
        import_model(path)
    assert import_model(path, batch=5).network.input_shape == (5, 3, 4, 4)


def test_batch_override_keeps_reshapes_that_use_it(tmp_path):
    m = model([node("Flatten", ["x"], ["f"]), node("Gemm", ["f", "b"])], [1, 2, 3, 3],
              inits={"b": rand(18, 4)})
    im = imp(tmp_path, m, batch=3)
    assert im.network.input_shape == (3, 2, 3, 3)


@pytest.mark.parametrize("shape, extra, match", [
    ([5], (), "rank 1"), ([1, 2, 3, 4, 5], (), "rank 5"),
    ([1, 2, 3, 3], [("z", [1, 2, 3, 3])], "input 'z' is read by no node"),
    ([1, 2, 3, 3], [("z", [2, 2, 3, 3])], "input 'z' has batch 2 .* share one batch")])
def test_inputs_aotconv_cannot_take(tmp_path, shape, extra, match):
    m = model([node("Relu", ["x"])], shape, extra_inputs=extra)
    with pytest.raises(OnnxError, match=match):
        import_model(save(m, tmp_path / "m.onnx"))


def test_integer_input_is_rejected(tmp_path):
    m = model([node("Relu", ["x"])], [1, 2, 3, 3], x_type=TensorProto.INT32)
    with pytest.raises(OnnxError, match="INT32"):
        import_model(save(m, tmp_path / "m.onnx"))


def test_output_that_is_a_constant_is_an_error(tmp_path):
    m = model([node("Relu", ["x"]), node("Identity", ["c"], ["k"])], [1, 2, 3, 3],
              outputs=("y", "k"), inits={"c": rand(2)})
    with pytest.raises(OnnxError, match="'k' is a constant"):
        import_model(save(m, tmp_path / "m.onnx"))


def test_dead_branches_are_not_imported(tmp_path):
    m = model([node("Relu", ["x"]), node("Transpose", ["x"], ["unused"], perm=[0, 1, 3, 2])],
              [1, 2, 3, 3])
    assert layers(imp(tmp_path, m)) == [{"op": "relu"}]


def test_external_data_weights_are_read(tmp_path):
    w = rand(8, 3, 3, 3)
    m = model([node("Conv", ["x", "w"])], [1, 3, 6, 6], inits={"w": w})
    path = save(m, tmp_path / "ext.onnx", save_as_external_data=True,
                all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").stat().st_size >= w.nbytes
    im = import_model(path)
    assert np.array_equal(im.params, w.ravel())


def test_not_an_onnx_file(tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\x00\xffnot a protobuf at all\x12\x99")
    with pytest.raises(OnnxError) as e:
        import_model(p)
    assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)
    with pytest.raises(OnnxError, match="no such file"):
        import_model(tmp_path / "missing.onnx")


def test_model_from_a_newer_domain_op_is_rejected(tmp_path):
    n = helper.make_node("FusedConv", ["x"], ["y"], domain="com.microsoft", name="f")
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", 1, [1, 2, 3, 3])],
                          [helper.make_tensor_value_info("y", 1, [1, 2, 3, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    path = save(m, tmp_path / "m.onnx")
    with pytest.raises(OnnxError):
        import_model(path)


def test_every_command_that_reads_a_network_reads_an_onnx_model(tmp_path):
    # spec.load_network is what tune, space and build --weights read a network with
    from aotconv import spec
    m = model([node("Conv", ["x", "w"], ["c"], name="/c/Conv"), node("Relu", ["c"])],
              ["N", 2, 5, 5], inits={"w": rand(3, 2, 3, 3)})
    path = save(m, tmp_path / "m.onnx")
    net = spec.load_network(path, batch=4)
    assert net.input_shape == (4, 2, 5, 5) and [l.name for l in net.layers] == ["c.Conv", "Relu_1"]


def test_same_padding_that_would_be_negative_is_rejected(tmp_path):
    # stride 3 over a 1-wide window: the specification's SAME total is -1 (onnxruntime
    # refuses it); aotconv does not guess a meaning
    m = model([node("MaxPool", ["x"], kernel_shape=[1, 1], strides=[3, 3],
                    auto_pad="SAME_UPPER", name="p")], [1, 2, 5, 5])
    p = rejected(tmp_path, m).problems[0]
    assert (p.node, p.attr) == ("p", "auto_pad") and "negative padding" in p.message


def test_check_falls_back_to_numpy_where_onnxruntime_lacks_the_op(tmp_path, capsys):
    # onnxruntime implements LRN for 4-D tensors only; ONNX and aotconv take [N, C, L] too
    from aotconv.onnx_import.reference import OrtReference
    m = model([node("LRN", ["x"], size=3)], [2, 5, 7])
    im = imp(tmp_path, m, check=False)
    ref = OrtReference(im)
    x = np.ones(im.network.input_shape, np.float32)
    y = ref(x)
    assert ref.name == "numpy" and "onnxruntime cannot run the model" in capsys.readouterr().err
    assert y[0].shape == (2, 5, 7, 1)


def test_two_nodes_of_one_name_keep_their_own_folded_weights(tmp_path):
    # node names need not be unique in ONNX: each BN keeps its own folded scale and bias
    inits = dict(_bn_inits(3), m1=rand(3, 1, 1), m2=rand(3, 1, 1))
    inits.update({f"{k}2": rand(3) for k in ("s", "b", "mean")}, var2=np.abs(rand(3)) + 0.5)
    m = model([node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["t"], name="bn"),
               node("Mul", ["t", "m1"], ["u"]),
               node("BatchNormalization", ["u", "s2", "b2", "mean2", "var2"], ["v"], name="bn"),
               node("Mul", ["v", "m2"])], [2, 3, 4, 4], inits=inits)
    im = imp(tmp_path, m, check=False)       # onnxruntime refuses repeated node names
    assert [l["name"] for l in im.description["layers"]] == ["bn", "bn_2"]
    from onnx.reference import ReferenceEvaluator
    from aotconv.reference import run_network
    x = rand(2, 3, 4, 4)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert np.allclose(run_network(im.network, x, im.params)[0], want, rtol=1e-5, atol=1e-5)

"""ONNX's node conformance tests on PoCL through aotconv's ONNX backend (conformance.py):
the documented SUBSET by default, every case with AOTCONV_ONNX_CONFORMANCE=all
(`make test-onnx`). A case aotconv does not take is skipped with its reason; a case of the
SUBSET must pass. The backend's split of a model's inputs into the tensors fed at run time
and the parameters it specialises is tested device-free below."""
import functools
import os
import unittest

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import conformance  # noqa: E402
from aotconv.onnx_import import import_model  # noqa: E402
from aotconv.onnx_import.backend import AotconvBackend, tensor_inputs  # noqa: E402

_ALL = os.environ.get("AOTCONV_ONNX_CONFORMANCE") == "all"


@functools.lru_cache(maxsize=None)
def _by_name():
    """{name: ONNX's TestCase} of every case conformance.cases() gives. Loaded by the first test
    that reads it, not at collection: ONNX computes every case's data as it loads them (about
    13 s on two busy cores), which a run that selects none of these tests need not pay."""
    return {c.name: c for cs in conformance.cases().values() for c in cs}


# the cases by name: the SUBSET's names need nothing loaded; every case's needs them all
_NAMES = list(_by_name()) if _ALL else list(conformance.SUBSET)


def test_the_subset_names_cases_that_exist():
    assert set(conformance.SUBSET) <= set(_by_name())


@pytest.mark.parametrize("name", _NAMES)
def test_node(name):
    case = _by_name()[name]
    try:
        conformance.run_case(case)
    except unittest.SkipTest as e:
        if case.name in conformance.SUBSET:      # make test's cases are ones aotconv takes
            pytest.fail(f"{case.name} is in SUBSET but was skipped: {e}")
        raise


def _model(nodes, inputs, outputs, inits=()):
    """A model of `nodes` whose graph inputs are `inputs` and outputs `outputs`, each
    [(name, shape)] in that order."""
    def info(pairs):
        return [helper.make_tensor_value_info(x, TensorProto.FLOAT, s) for x, s in pairs]
    g = helper.make_graph(nodes, "g", info(inputs), info(outputs),
        initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name, tensors", [
    ("test_add", ["x", "y"]), ("test_mul", ["x", "y"]),
    ("test_concat_3d_axis_1", ["value0", "value1"]),
    ("test_sum_two_inputs", ["data_0", "data_1"]),
    ("test_conv_with_strides_padding", ["x"]),            # W: a weight
    ("test_gemm_default_vector_bias", ["a"]),             # B, C: weight and bias
    ("test_batchnorm_epsilon", ["x"]),                    # scale, B, mean, var
    ("test_clip", ["x"]),                                 # min, max: bounds
    ("test_reshape_reduced_dims", ["data"]),              # shape
])
def test_the_backend_feeds_the_tensors_an_op_computes_on(name, tensors):
    assert tensor_inputs(_by_name()[name].model) == tensors


def test_an_input_read_as_a_tensor_anywhere_stays_an_input():
    # w is Conv's weight and also added to the output: a tensor, which the importer then
    # refuses as Conv's W (a constant), rather than a value the backend bakes in silently
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"]),
                helper.make_node("Add", ["c", "w"], ["y"])],
               [("x", [1, 1, 3, 3]), ("w", [1, 1, 3, 3])], [("y", [1, 1, 3, 3])])
    assert tensor_inputs(m) == ["x", "w"]


def test_parameters_become_initializers_and_the_tensors_are_fed_in_the_networks_order(
        tmp_path):
    """A weight listed before the tensors, and an Add reading them in the other order: the
    weight is baked in, and the library gets each tensor's own value, in the imported
    network's order of inputs."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 3, 1, 1)).astype(np.float32)
    a = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    m = _model([helper.make_node("Conv", ["a", "w"], ["c"]),
                helper.make_node("Add", ["b", "c"], ["y"])],
               [("w", [2, 3, 1, 1]), ("a", [1, 3, 4, 4]), ("b", [1, 2, 4, 4])],
               [("y", [1, 2, 4, 4])])
    rep = AotconvBackend.prepare(m, "CPU")
    assert (rep.inputs, rep.tensors) == (["w", "a", "b"], ["a", "b"])
    values = dict(zip(rep.inputs, (w, a, b)))
    s = rep.specialised(values)
    assert [i.name for i in s.graph.input] == ["a", "b"]
    assert np.array_equal(numpy_helper.to_array(s.graph.initializer[0]), w)
    path = tmp_path / "m.onnx"
    path.write_bytes(s.SerializeToString())
    im = import_model(path)
    fed = rep.feeds(im, values)
    assert [x for x, _ in im.inputs] == ["a", "b"]
    assert [f.shape for f in fed] == [(1, 3, 4, 4), (1, 2, 4, 4)]
    assert np.array_equal(fed[0], a) and np.array_equal(fed[1], b)


def test_run_refuses_a_wrong_number_of_inputs():
    rep = AotconvBackend.prepare(_by_name()["test_add"].model, "CPU")
    with pytest.raises(ValueError, match=r"expected 2 inputs \(x, y\), got 1"):
        rep.run([np.zeros((3, 4, 5), np.float32)])

"""Small ONNX models built with onnx.helper for the importer's tests, and onnxruntime runs."""
import numpy as np

import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def model(nodes, x_shape, outputs=("y",), inits=None, opset=17, x_name="x", x_type=None,
          extra_inputs=()):
    """A ModelProto: one float input `x_name` of `x_shape` (dims may be strings: symbolic),
    `nodes`, initializers {name: array}, outputs by name (shapes left to inference)."""
    inputs = [helper.make_tensor_value_info(x_name, x_type or TensorProto.FLOAT, x_shape)]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in extra_inputs]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "g", inputs, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 8)       # what onnxruntime reads
    try:                                      # output types, as exporters write them
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:
        pass
    return m


def save(m, path, **kw):
    onnx.save(m, str(path), **kw)
    return str(path)


def node(op, inputs, outputs=("y",), name=None, **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=name or None, **attrs)


def ort_run(path, x, input_name="x"):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return s.run(None, {input_name: x})


def assert_matches_onnxruntime(im, path, seed=0, tol=1e-4):
    """The imported network, run by aotconv's float64 numpy reference with the imported
    parameters, against onnxruntime on the original model (hybrid error <= tol)."""
    from aotconv.harness import close
    from aotconv.onnx_import.reference import OrtReference
    from aotconv.reference import run_network
    x = np.random.default_rng(seed).standard_normal(im.network.input_shape).astype(np.float32)
    refs = OrtReference(im)(x)
    ours = run_network(im.network, x, im.params)
    assert len(refs) == len(ours) == len(im.network.outputs)
    for name, shape, i in im.outputs:
        ok, err = close(ours[i], refs[i], tol)
        assert ok, f"output {name}: hybrid error {err:.3g}"

"""Whole networks from onnx's own test data (`light_*`, opset 9: converted to 13), their
generated constant weights replaced by random ones so that every channel differs, built with
`aotconv build --no-tune --check` on PoCL against onnxruntime. Part of `make test-onnx`
(AOTCONV_ONNX_CONFORMANCE=all); docs/onnx.md lists the larger ones measured by hand."""
import contextlib
import io
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import numpy_helper  # noqa: E402

from aotconv.cli import main  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
pytestmark = pytest.mark.skipif(os.environ.get("AOTCONV_ONNX_CONFORMANCE") != "all",
                                reason="whole networks run in make test-onnx")


def randomised(src, dst, logits=False, seed=0):
    """`src` with each ConstantOfShape weight replaced by random values of a sane scale (He
    by fan-in for conv and Gemm weights, BN scales, variances and Mul factors in [0.5, 1.5],
    the rest N(0, 0.1^2)); with `logits`, the final Softmax dropped (its 1000 small
    probabilities would hide errors under the hybrid tolerance)."""
    m = onnx.load(str(src))
    g = m.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    use = {}
    for n in g.node:
        for i, t in enumerate(n.input):
            use.setdefault(t, (n.op_type, i))
    rng = np.random.default_rng(seed)
    keep, new = [], []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in consts:
            keep.append(n)
            continue
        shape = tuple(int(v) for v in consts[n.input[0]])
        op, i = use.get(n.output[0], ("?", 0))
        if op in ("Conv", "Gemm") and i == 1 and len(shape) >= 2:
            fan = int(np.prod(shape[1:])) if op == "Conv" else shape[-1]
            a = rng.standard_normal(shape) * np.sqrt(2.0 / fan)
        elif (op == "BatchNormalization" and i in (1, 4)) or op == "Mul":
            a = rng.uniform(0.5, 1.5, shape)
        else:
            a = rng.standard_normal(shape) * 0.1
        new.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new)
    if logits and g.node[-1].op_type == "Softmax":
        last = g.node[-1]
        g.node.remove(last)
        del g.output[:]
        g.output.extend([onnx.helper.make_empty_tensor_value_info(last.input[0])])
    m.ir_version = max(m.ir_version, 4)       # initializers that are not graph inputs
    m = onnx.shape_inference.infer_shapes(m)
    onnx.save(m, str(dst))
    return str(dst)


@pytest.mark.parametrize("name", ["squeezenet", "bvlc_alexnet", "inception_v1"])
def test_light_model_with_random_weights_matches_onnxruntime(name, tmp_path):
    path = randomised(LIGHT / f"light_{name}.onnx", tmp_path / f"{name}.onnx", logits=True)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main(["build", path, "--target", "pocl-cpu", "--no-tune", "--check", "--quiet",
                   "-o", str(tmp_path / "build")])
    out = text.getvalue()
    assert rc == 0 and "check against onnxruntime" in out and "(ok)" in out, out

"""`aotconv build model.onnx` and `aotconv import` end to end: a small CNN written with
onnx.helper, built on PoCL without tuning, its library's output against onnxruntime."""
import sys

import numpy as np
import pytest

from aotconv.cli import main

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_helpers import model, node, ort_run, rand, save  # noqa: E402


def small_cnn(batch=2):
    """Most of what the importer maps, in one graph with two outputs: conv + BN + per-channel
    Mul/Add + relu, a ceil-mode max pool written as end padding, a Pad merged into a grouped
    conv, concat, add, LRN, average pool, a shape sub-graph feeding a Reshape before Gemm,
    softmax."""
    c = 8
    inits = {
        "w1": rand(c, 3, 3, 3, scale=0.4), "b1": rand(c, scale=0.1),
        "s": rand(c) + 1.0, "beta": rand(c, scale=0.1), "mean": rand(c, scale=0.1),
        "var": np.abs(rand(c)) + 0.5, "mul": rand(1, c, 1, 1), "add": rand(c, 1, 1),
        "wa": rand(4, c, 1, 1, scale=0.3), "wb": rand(4, c // 2, 3, 3, scale=0.3),
        "bb": rand(4, scale=0.1), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "wfc": rand(10, c * 4 * 4, scale=0.1), "bfc": rand(10, scale=0.1),
        "zero": np.array(0, np.int64), "ax0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="/stem/conv/Conv", pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", "s", "beta", "mean", "var"], ["bn"], name="/stem/bn"),
        node("Mul", ["bn", "mul"], ["bnm"], name="/stem/Mul"),
        node("Add", ["bnm", "add"], ["bna"], name="/stem/Add"),
        node("Relu", ["bna"], ["r1"], name="/stem/relu/Relu"),
        node("MaxPool", ["r1"], ["p1"], name="/pool/MaxPool", kernel_shape=[3, 3],
             strides=[2, 2], pads=[0, 0, 1, 1]),
        node("Conv", ["p1", "wa"], ["a"], name="/branch_a/Conv"),
        node("Pad", ["p1", "pads"], ["pp"], name="/branch_b/Pad"),
        node("Conv", ["pp", "wb", "bb"], ["b"], name="/branch_b/Conv", group=2),
        node("LeakyRelu", ["b"], ["bl"], name="/branch_b/LeakyRelu", alpha=0.1),
        node("Concat", ["a", "bl"], ["cat"], name="/Concat", axis=1),
        node("Add", ["cat", "p1"], ["sum"], name="/Add"),
        node("Sigmoid", ["sum"], ["sg"], name="/Sigmoid"),
        node("LRN", ["sg"], ["n"], name="/LRN", size=3, alpha=1e-3, beta=0.75, bias=1.0),
        node("AveragePool", ["n"], ["ap"], name="/AveragePool", kernel_shape=[2, 2],
             strides=[2, 2]),
        node("Tanh", ["ap"], ["side"], name="/side/Tanh"),
        node("Shape", ["ap"], ["shp"], name="/Shape"),
        node("Gather", ["shp", "zero"], ["n0"], name="/Gather", axis=0),
        node("Unsqueeze", ["n0", "ax0"], ["n1"], name="/Unsqueeze"),
        node("Concat", ["n1", "minus1"], ["newshape"], name="/Concat_1", axis=0),
        node("Reshape", ["ap", "newshape"], ["flat"], name="/Reshape"),
        node("Gemm", ["flat", "wfc", "bfc"], ["logits"], name="/fc/Gemm", transB=1),
        node("Softmax", ["logits"], ["prob"], name="/Softmax", axis=1),
    ]
    return model(nodes, [batch, 3, 16, 16], outputs=("prob", "side"), inits=inits)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`aotconv build small_cnn.onnx --no-tune --check`: (model path, build dir, rc, stdout)."""
    import contextlib
    import io
    d = tmp_path_factory.mktemp("onnx_cnn")
    path = save(small_cnn(), d / "small_cnn.onnx")
    out, text = d / "build", io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main(["build", path, "--target", "pocl-cpu", "--no-tune", "--check", "--quiet",
                   "-o", str(out)])
    return path, out, rc, text.getvalue()


def test_build_onnx_checks_against_onnxruntime(built):
    _, _, rc, text = built
    assert rc == 0, text
    assert "check against onnxruntime: max hybrid error" in text and "(ok)" in text


def test_library_output_matches_onnxruntime(built):
    from aotconv.harness import close
    from aotconv.runtime import load
    path, out, rc, _ = built
    assert rc == 0
    x = np.random.default_rng(11).standard_normal((2, 3, 16, 16)).astype(np.float32)
    prob, side = ort_run(path, x)
    with load(out) as lib:
        y = lib(x)
    got = dict(zip(lib.output_shapes, y))
    assert set(got) == {(2, 10, 1, 1), (2, 8, 4, 4)}
    ok1, e1 = close(got[(2, 10, 1, 1)].reshape(prob.shape), prob)
    ok2, e2 = close(got[(2, 8, 4, 4)], side)
    assert ok1 and ok2, (e1, e2)
    assert np.abs(prob.sum(axis=1) - 1).max() < 1e-5 and prob.std() > 1e-3   # not degenerate


def test_import_writes_a_net_yaml_and_weights_that_rebuild_the_model(tmp_path, capsys):
    from aotconv import spec
    from aotconv.onnx_import import import_model
    from aotconv.params import from_npz
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    out, npz = tmp_path / "cnn.yaml", tmp_path / "w" / "cnn.npz"
    assert main(["import", path, "-o", str(out), "--weights-out", str(npz)]) == 0
    assert "build it with: aotconv build" in capsys.readouterr().out
    text = out.read_text()
    assert "# /stem/conv/Conv" in text and "stem.conv.Conv" in text
    net = spec.load_network(str(out))
    im = import_model(path)
    assert [(l.name, l.op, l.attrs, l.inputs, l.out_shape) for l in net.layers] == \
        [(l.name, l.op, l.attrs, l.inputs, l.out_shape) for l in im.network.layers]
    assert net.outputs == im.network.outputs
    assert np.array_equal(from_npz(net, npz), im.params)
    # the stem's BN took the Mul and Add; the Pad went into the grouped conv
    ops = [l.op for l in net.layers]
    assert ops.count("batchnorm") == 1 and "pad" not in ops and ops.count("conv") == 3


def test_import_does_not_overwrite_without_force(tmp_path, capsys):
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    out = tmp_path / "cnn.yaml"
    out.write_text("# my edits\n")
    assert main(["import", path, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists; pass --force" in err and err.count("\n") == 1
    assert out.read_text() == "# my edits\n" and not (tmp_path / "cnn.npz").exists()
    assert main(["import", path, "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("# imported by `aotconv import`")


def test_cli_unsupported_nodes_one_error_no_traceback(tmp_path, capsys):
    m = model([node("Transpose", ["x"], ["t"], name="/t", perm=[0, 1, 3, 2]),
               node("Softmax", ["t"], name="/s", axis=0)], [1, 2, 3, 3])
    path = save(m, tmp_path / "bad.onnx")
    assert main(["build", path, "--target", "pocl-cpu", "--no-tune", "-o",
                 str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aotconv: error: {path}: 2 nodes aotconv cannot build")
    assert "node '/t' (Transpose, opset 17)" in err and "node '/s' (Softmax, opset 17): axis" \
        in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_cli_symbolic_input_needs_input_shape(tmp_path, capsys):
    m = model([node("Relu", ["x"])], ["N", 3, 4, 4])
    path = save(m, tmp_path / "sym.onnx")
    assert main(["import", path, "-o", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--input-shape x=1x3x4x4 or --batch N" in err
    assert main(["import", path, "-o", str(tmp_path / "s.yaml"), "--input-shape",
                 "x=2x3x4x4"]) == 0
    assert "input: [2, 3, 4, 4]" in (tmp_path / "s.yaml").read_text()
    assert main(["build", "lenet5", "--input-shape", "x=1x1x32x32", "--no-tune",
                 "-o", str(tmp_path / "l")]) == 2
    assert "--input-shape applies to .onnx models" in capsys.readouterr().err


def test_without_the_onnx_package_an_onnx_source_is_one_line(tmp_path, capsys, monkeypatch):
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)          # import onnx -> ImportError
    for argv in (["import", path, "-o", str(tmp_path / "c.yaml")],
                 ["build", path, "--target", "pocl-cpu", "--no-tune", "-o", str(tmp_path / "b")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'aotconv[onnx]'" in err
    assert not (tmp_path / "c.yaml").exists() and not (tmp_path / "b").exists()

"""Never a wrong answer: random single-op ONNX models over the attribute space of every op the
importer maps (pads, auto_pad, strides, dilations, groups, ceil_mode, count_include_pad, axes,
Gemm's transB/alpha/beta/C shapes, BN + Mul/Add shapes, Pad values, Resize's modes, coordinate
transformations, rounding, scales and sizes, ConvTranspose's pads, output_padding and
output_shape, Softmax and LogSoftmax before and after opset 13 ...). Each one onnxruntime
runs is either rejected by the importer or, imported, computes what onnxruntime computes
(aotconv's float64 reference with the imported weights). Device-free, fixed seed."""
import random

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from aotconv.harness import close  # noqa: E402
from aotconv.onnx_import import OnnxError, import_model  # noqa: E402
from aotconv.onnx_import.reference import OrtReference  # noqa: E402
from aotconv.reference import run_network  # noqa: E402
from onnx_helpers import model, node, save  # noqa: E402

OPS = ("Conv", "PadConv", "MaxPool", "AveragePool", "PadPool", "LRN", "Softmax", "ReduceMean",
       "Flatten", "Gemm", "BN", "Concat", "Squeeze", "Resize", "ConvTranspose", "LogSoftmax",
       "Softmax11")


def random_model(R, op):
    def r(a, b):
        return R.randint(a, b)

    def f32(*s):
        return np.random.default_rng(r(0, 10**6)).standard_normal(s).astype(np.float32)

    rank = R.choice([3, 4, 4])
    N, C = r(1, 2), r(1, 4)
    x = [N, C] + [r(1, 9) for _ in range(rank - 2)]
    s = rank - 2
    inits, nodes, opset = {}, [], 17

    def window():
        a = {"strides": [r(1, 3) for _ in range(s)]}
        auto = R.choice(["NOTSET"] * 3 + ["SAME_UPPER", "SAME_LOWER", "VALID"])
        if auto != "NOTSET":
            a["auto_pad"] = auto
        else:
            a["pads"] = [r(0, 2) for _ in range(2 * s)]
            if R.random() < 0.5:                  # symmetric, as most models pad
                a["pads"] = a["pads"][:s] * 2
        return [r(1, 4) for _ in range(s)], a

    def pad_node(src, value=0.0, most=2):
        begin = [r(0, most) for _ in range(s)]
        end = begin if R.random() < 0.5 else [r(0, most) for _ in range(s)]
        inits["p"] = np.array([0, 0] + begin + [0, 0] + end, np.int64)
        inits["v"] = np.array(value, np.float32)
        nodes.append(node("Pad", [src, "p", "v"], ["xp"]))
        return "xp"

    if op in ("Conv", "PadConv"):
        k, a = window()
        g = R.choice([d for d in range(1, C + 1) if C % d == 0])
        m = g * r(1, 3)
        if R.random() < 0.5:
            a["dilations"] = [r(1, 2) for _ in range(s)]
        a["group"] = g
        inits["w"] = f32(m, C // g, *k)
        ins = ["x", "w"] + (["b"] if R.random() < 0.5 else [])
        if "b" in ins:
            inits["b"] = f32(m)
        if op == "PadConv":
            a.pop("auto_pad", None)
            a["pads"] = [0] * (2 * s)
            ins[0] = pad_node("x")
        nodes.append(node("Conv", ins, **a))
    elif op in ("MaxPool", "AveragePool", "PadPool"):
        kind = op if op != "PadPool" else R.choice(["MaxPool", "AveragePool"])
        k, a = window()
        a["kernel_shape"] = k
        if R.random() < 0.5:
            a["ceil_mode"] = 1
        if kind == "AveragePool" and R.random() < 0.5:
            a["count_include_pad"] = 1
        src = "x"
        if op == "PadPool":
            a.pop("auto_pad", None)
            a["pads"] = [0] * (2 * s)
            if R.random() < 0.5:
                nodes.append(node("Relu", ["x"], ["xr"]))
                src = "xr"
            a["kernel_shape"] = [r(2, 4) for _ in range(s)]
            src = pad_node(src, R.choice([0.0, 0.0, -np.inf, 1.0]), most=1)
        nodes.append(node(kind, [src], **a))
    elif op == "LRN":
        nodes.append(node("LRN", ["x"], size=r(1, 6), alpha=R.random(), beta=R.random(),
                          bias=R.random() + 0.5))
    elif op in ("Softmax", "LogSoftmax"):
        nodes.append(node(op, ["x"], axis=r(-rank, rank - 1)))
    elif op == "Softmax11":                       # the axis flattens everything after it
        nodes.append(node(R.choice(["Softmax", "LogSoftmax"]), ["x"], axis=r(-rank, rank - 1)))
        opset = 11
    elif op == "Resize":
        a = {"mode": R.choice(["nearest", "linear"]),
             "coordinate_transformation_mode": R.choice(
                 ["asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners",
                  "half_pixel_symmetric"]),
             "nearest_mode": R.choice(["floor", "ceil", "round_prefer_floor",
                                       "round_prefer_ceil"])}
        inits["roi"] = np.zeros(0, np.float32)
        if R.random() < 0.5:
            inits["sc"] = np.array([1, 1] + [R.choice([0.5, 1, 2, 3, 1.5, 0.25, 0.6, 4])
                                             for _ in range(s)], np.float32)
            nodes.append(node("Resize", ["x", "roi", "sc"], **a))
        else:
            inits["sz"] = np.array([N, C] + [r(1, 17) for _ in range(s)], np.int64)
            nodes.append(node("Resize", ["x", "roi", "", "sz"], **a))
        opset = 19
    elif op == "ConvTranspose":
        k = [r(1, 4) for _ in range(s)]
        g = R.choice([d for d in range(1, C + 1) if C % d == 0])
        a = {"group": g, "strides": [r(1, 3) for _ in range(s)]}
        if R.random() < 0.3:
            a["dilations"] = [r(1, 2) for _ in range(s)]
        choice = R.random()
        if choice < 0.4:
            a["pads"] = [r(0, 2) for _ in range(2 * s)]
        elif choice < 0.55:
            a["auto_pad"] = R.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
        elif choice < 0.7:
            a["output_shape"] = [(x[2 + i] - 1) * a["strides"][i] + k[i] + r(-2, 1)
                                 for i in range(s)]
        if R.random() < 0.3:
            a["output_padding"] = [r(0, a["strides"][i] - 1) for i in range(s)]
        inits["w"] = f32(C, r(1, 3), *k)
        ins = ["x", "w"]
        if R.random() < 0.5:
            inits["b"] = f32(inits["w"].shape[1] * g)
            ins.append("b")
        nodes.append(node("ConvTranspose", ins, **a))
    elif op == "ReduceMean":
        axes = (list(range(2, rank)) if R.random() < 0.3 else
                sorted({a % rank for a in R.sample(range(-rank, rank), r(1, rank))}))
        nodes.append(node("ReduceMean", ["x"], axes=axes, keepdims=r(0, 1)))
        opset = 13
    elif op == "Flatten":
        nodes.append(node("Flatten", ["x"], axis=r(-rank, rank)))
    elif op == "Gemm":
        f, m = int(np.prod(x[1:])), r(1, 5)
        nodes.append(node("Flatten", ["x"], ["f"]))
        tb = r(0, 1)
        inits["B"] = f32(m, f) if tb else f32(f, m)
        ins = ["f", "B"]
        cs = R.choice([None, [m], [1, m], [], [N, m], [1], [N, 1]])
        if cs is not None:
            inits["c"] = f32(*cs) if cs else np.float32(R.random())
            ins.append("c")
        nodes.append(node("Gemm", ins, transB=tb, alpha=R.random() + 0.5,
                          beta=R.random() + 0.5))
    elif op == "BN":
        for t in ("s", "bb", "m"):
            inits[t] = f32(C)
        inits["v"] = np.abs(f32(C)) + 0.1
        nodes.append(node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["t"],
                          epsilon=R.random() * 1e-3 + 1e-6))
        inits["k"] = f32(*R.choice([[C, 1, 1][:rank - 1], [1, C] + [1] * s, [1], [C], x[1:]]))
        nodes.append(node(R.choice(["Mul", "Add"]), R.choice([["t", "k"], ["k", "t"]])))
    elif op == "Concat":
        nodes.append(node("Relu", ["x"], ["a"]))
        nodes.append(node("Concat", ["x", "a"], axis=r(-rank, rank - 1)))
    elif op == "Squeeze":
        nodes.append(node("GlobalAveragePool", ["x"], ["g"]))
        inits["ax"] = np.array(sorted(R.sample(range(2, rank), r(1, rank - 2))), np.int64)
        nodes.append(node("Squeeze", ["g", "ax"], ["q"]))
        nodes.append(node("Softmax", ["q"], axis=R.choice([1, -1])))
    return model(nodes, x, inits=inits, opset=opset)


def _ort_runs(path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


@pytest.mark.parametrize("op", OPS)
def test_random_models_are_rejected_or_right(tmp_path, op, capfd):
    R = random.Random(f"aotconv-onnx-{op}")
    imported = 0
    for i in range(25):
        path = save(random_model(R, op), tmp_path / f"{op}{i}.onnx")
        if not _ort_runs(path):                   # not a valid model for onnxruntime either
            continue
        try:
            im = import_model(path)
        except OnnxError:
            continue
        ref = OrtReference(im)
        x = np.random.default_rng(i).standard_normal(im.network.input_shape).astype(np.float32)
        refs = ref(x)
        if ref.name != "onnxruntime":             # onnxruntime lacks it (LRN of rank 3 ...)
            continue
        ours = run_network(im.network, x, im.params)
        for o, rf in zip(ours, refs):
            ok, err = close(o, rf, 1e-4)
            assert ok, f"{path}: hybrid error {err:.3g} against onnxruntime"
        imported += 1
    assert imported >= 3, f"only {imported} of 25 random {op} models imported"

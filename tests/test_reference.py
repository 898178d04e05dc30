"""The numpy reference against independent computations: naive loops and PyTorch's formulas
written out by hand (torch itself is not a dependency)."""
import math

import numpy as np
import pytest

from aotconv import ops, reference as R
from aotconv.graph import Layer, Network


def mk(op, in_shapes, name="l", inputs=("input",), line=None, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(name, op, a, list(inputs), line=line, in_shapes=[tuple(s) for s in in_shapes],
                 out_shape=out, params=params)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- conv -----------------------------------------------------------------------------------------

def naive_conv(x, w, b, a):
    """torch conv2d, one multiply-add at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = a["groups"]
    og = o // g
    pt, pl, pb, pr = a["pad"]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    p = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    q = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    y = np.zeros((n, o, p, q))
    for nn in range(n):
        for oo in range(o):
            grp = oo // og
            for yy in range(p):
                for xx in range(q):
                    s = 0.0 if b is None else b[oo]
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                iy, ix = yy * sh - pt + i * dh, xx * sw - pl + j * dw
                                if 0 <= iy < h and 0 <= ix < wd:
                                    s += x[nn, grp * cg + ci, iy, ix] * w[oo, ci, i, j]
                    y[nn, oo, yy, xx] = s
    return y


CONV_CASES = [
    ((1, 1, 5, 5), dict(out=1, kernel=3)),
    ((2, 3, 7, 6), dict(out=5, kernel=[3, 2], stride=[2, 1], pad=[1, 0])),
    ((1, 4, 9, 8), dict(out=6, kernel=3, groups=2, dilation=[2, 1], pad=2)),
    ((2, 5, 7, 7), dict(out=5, kernel=3, groups=5, bias=False, pad=1)),           # depthwise
    ((1, 3, 6, 5), dict(out=6, kernel=[1, 3], groups=3, stride=2)),               # multiplier 2
    ((1, 2, 8, 7), dict(out=3, kernel=[2, 3], stride=[2, 3], pad="same")),
    ((1, 2, 11, 13), dict(out=2, kernel=[3, 5], stride=2, dilation=[2, 1], pad="same")),
]


@pytest.mark.parametrize("shape,raw", CONV_CASES)
def test_conv_matches_naive_loop(shape, raw, rng):
    l = mk("conv", [shape], **raw)
    x = rng.standard_normal(shape)
    p = R.random_params(l, rng)
    b = p.get("bias")
    want = naive_conv(x, p["weight"].astype(np.float64), None if b is None else b.astype(np.float64),
                      l.attrs)
    got = R.forward(l, [x], p)
    assert got.shape == l.out_shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size,k,s,d,want_pad", [
    (7, 3, 1, 1, (1, 1)), (7, 3, 2, 1, (1, 1)), (8, 3, 2, 1, (0, 1)), (8, 4, 1, 1, (1, 2)),
    (5, 3, 1, 2, (2, 2)), (6, 1, 2, 1, (0, 0)), (9, 5, 3, 1, (1, 1)), (10, 4, 3, 1, (1, 2)),
])
def test_same_padding_is_onnx_same_upper(size, k, s, d, want_pad):
    # ONNX SAME_UPPER: out = ceil(in / s), total = max((out-1)*s + (k-1)*d + 1 - in, 0),
    # the odd one at the end (bottom/right)
    l = mk("conv", [(1, 1, size, size)], out=1, kernel=k, stride=s, dilation=d, pad="same")
    assert l.out_shape[2:] == (math.ceil(size / s),) * 2
    pt, pl, pb, pr = l.attrs["pad"]
    assert (pt, pb) == want_pad and (pl, pr) == want_pad


def test_conv_fused_activation_and_bias(rng):
    l = mk("conv", [(1, 2, 4, 4)], out=3, kernel=1, act="leaky_relu", alpha=0.2)
    x = rng.standard_normal((1, 2, 4, 4))
    p = R.random_params(l, rng)
    lin = np.einsum("oc,nchw->nohw", p["weight"][:, :, 0, 0].astype(np.float64), x)
    lin += p["bias"].astype(np.float64).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(R.forward(l, [x], p), np.where(lin > 0, lin, 0.2 * lin), rtol=1e-12)


# -- pooling: PyTorch's CPU kernels, transcribed ----------------------------------------------------

def torch_out_size(size, k, s, p, ceil):
    # aten/src/ATen/native/Pool.h pooling_output_shape
    out = (size + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def torch_avgpool(x, k, s, p, ceil, include_pad):
    # aten/src/ATen/native/cpu/AvgPoolKernel.cpp cpu_avg_pool
    n, c, h, w = x.shape
    oh, ow = torch_out_size(h, k[0], s[0], p[0], ceil), torch_out_size(w, k[1], s[1], p[1], ceil)
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
            pool_size = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
            div = pool_size if include_pad else (h1 - h0) * (w1 - w0)
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3)) / div
    return y


def torch_maxpool(x, k, s, p, ceil):
    n, c, h, w = x.shape
    oh, ow = torch_out_size(h, k[0], s[0], p[0], ceil), torch_out_size(w, k[1], s[1], p[1], ceil)
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h), min(w0 + k[1], w)
            y[:, :, i, j] = x[:, :, max(h0, 0):h1, max(w0, 0):w1].max(axis=(2, 3))
    return y


POOL_CASES = [
    # shape, kernel, stride, pad, ceil
    ((1, 1, 4, 4), 2, 2, 0, False),
    ((1, 2, 5, 5), 2, 2, 0, True),
    ((2, 3, 7, 6), 3, 2, 1, True),
    ((1, 2, 6, 6), 3, 2, 1, True),        # last window starts in the right padding: dropped
    ((1, 1, 4, 4), 3, 2, 1, True),        # ceil overhang past the padding
    ((1, 3, 13, 11), [3, 2], [2, 3], [1, 1], True),
    ((1, 1, 1, 1), 1, 1, 0, False),
    ((1, 2, 7, 7), 3, 1, 1, False),
]


@pytest.mark.parametrize("shape,k,s,p,ceil", POOL_CASES)
@pytest.mark.parametrize("include_pad", [False, True])
def test_avgpool_matches_torch_kernel(shape, k, s, p, ceil, include_pad, rng):
    l = mk("avgpool", [shape], kernel=k, stride=s, pad=p, ceil_mode=ceil,
           count_include_pad=include_pad)
    a = l.attrs
    x = rng.standard_normal(shape)
    want = torch_avgpool(x, a["kernel"], a["stride"], a["pad"], ceil, include_pad)
    assert l.out_shape == want.shape
    np.testing.assert_allclose(R.forward(l, [x], {}), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,k,s,p,ceil", POOL_CASES)
def test_maxpool_matches_torch_kernel(shape, k, s, p, ceil, rng):
    l = mk("maxpool", [shape], kernel=k, stride=s, pad=p, ceil_mode=ceil)
    a = l.attrs
    x = -np.abs(rng.standard_normal(shape)) - 1.0       # all negative: padding must not win
    want = torch_maxpool(x, a["kernel"], a["stride"], a["pad"], ceil)
    assert l.out_shape == want.shape
    np.testing.assert_array_equal(R.forward(l, [x], {}), want)


def test_pool_hand_computed_values():
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    # kernel 3, stride 2, pad 1, ceil: out 3x3 (rows start at -1, 1, 3; the last overhangs by 1)
    l = mk("avgpool", [x.shape], kernel=3, stride=2, pad=1, ceil_mode=True, count_include_pad=True)
    assert l.out_shape == (1, 1, 3, 3)
    y = R.forward(l, [x], {})
    assert y[0, 0, 0, 0] == pytest.approx((0 + 1 + 4 + 5) / 9)        # 3x3 incl. 5 padded
    assert y[0, 0, 2, 2] == pytest.approx(15 / 4)                      # 2x2: overhang not counted
    assert y[0, 0, 1, 2] == pytest.approx((7 + 11 + 15) / 6)          # 3 rows x 2 cols
    l = mk("avgpool", [x.shape], kernel=3, stride=2, pad=1, ceil_mode=True)
    y = R.forward(l, [x], {})
    assert y[0, 0, 0, 0] == pytest.approx((0 + 1 + 4 + 5) / 4)
    assert y[0, 0, 2, 2] == pytest.approx(15.0)
    l = mk("maxpool", [x.shape], kernel=3, stride=2, pad=1, ceil_mode=True)
    np.testing.assert_array_equal(R.forward(l, [-x - 1], {})[0, 0],
                                  [[-1, -2, -4], [-5, -6, -8], [-13, -14, -16]])
    # without ceil_mode the 2x2 / stride 2 pool of 5x5 drops the last row and column
    l = mk("maxpool", [(1, 1, 5, 5)], kernel=2)
    assert l.out_shape == (1, 1, 2, 2)


def test_global_avgpool(rng):
    x = rng.standard_normal((2, 3, 5, 7))
    l = mk("global_avgpool", [x.shape])
    y = R.forward(l, [x], {})
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(y[1, 2, 0, 0], x[1, 2].sum() / 35, rtol=1e-12)


# -- the rest -------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 6])
def test_lrn_matches_torch_formula(size, rng):
    x = rng.standard_normal((2, 7, 3, 2))
    l = mk("lrn", [x.shape], size=size, alpha=0.1, beta=0.75, k=2.0)
    want = np.zeros_like(x)
    for c in range(7):
        # torch pads size//2 channels before and (size-1)//2 after, then averages over `size`
        lo, hi = max(0, c - size // 2), min(7, c + (size - 1) // 2 + 1)
        s = (x[:, lo:hi] ** 2).sum(axis=1)
        want[:, c] = x[:, c] / (2.0 + 0.1 * s / size) ** 0.75
    np.testing.assert_allclose(R.forward(l, [x], {}), want, rtol=1e-12)


def test_softmax_is_stable_and_normalised(rng):
    x = rng.standard_normal((2, 5, 3, 1)) * 3 + 1000.0
    y = R.forward(mk("softmax", [x.shape]), [x], {})
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-12)
    e = np.exp(x[0, :, 1, 0] - 1000.0)
    np.testing.assert_allclose(y[0, :, 1, 0], e / e.sum(), rtol=1e-12)


@pytest.mark.parametrize("act", ["none", "relu", "sigmoid", "tanh", "leaky_relu"])
def test_dense_flattens_chw(act, rng):
    x = rng.standard_normal((3, 2, 3, 4))
    l = mk("dense", [x.shape], out=5, act=act, alpha=0.3)
    p = R.random_params(l, rng)
    w, b = p["weight"].astype(np.float64), p["bias"].astype(np.float64)
    y = R.forward(l, [x], p)
    assert y.shape == (3, 5, 1, 1)
    for n in range(3):
        for o in range(5):
            s = b[o]
            for c in range(2):
                for i in range(3):
                    for j in range(4):
                        s += w[o, c * 12 + i * 4 + j] * x[n, c, i, j]
            want = {"none": s, "relu": max(s, 0.0), "sigmoid": 1 / (1 + math.exp(-s)),
                    "tanh": math.tanh(s), "leaky_relu": s if s > 0 else 0.3 * s}[act]
            assert y[n, o, 0, 0] == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_batchnorm_per_channel(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    l = mk("batchnorm", [x.shape], eps=1e-3, act="relu")
    p = R.random_params(l, rng)
    assert np.all(p["var"] > 0)
    y = R.forward(l, [x], p)
    for c in range(3):
        g, b, m, v = (float(p[t][c]) for t in ("gamma", "beta", "mean", "var"))
        want = np.maximum((x[:, c] - m) / math.sqrt(v + 1e-3) * g + b, 0)
        np.testing.assert_allclose(y[:, c], want, rtol=1e-12, atol=1e-12)


def test_concat_add_flatten_dropout(rng):
    a, b, c = (rng.standard_normal((2, k, 3, 3)) for k in (1, 4, 2))
    y = R.forward(mk("concat", [a.shape, b.shape, c.shape]), [a, b, c], {})
    assert y.shape == (2, 7, 3, 3)
    np.testing.assert_array_equal(y[:, 1:5], b)
    np.testing.assert_array_equal(y[:, 5:], c)
    b2, b3 = (rng.standard_normal(b.shape) for _ in range(2))
    y = R.forward(mk("add", [b.shape] * 3, act="tanh"), [b, b2, b3], {})
    np.testing.assert_allclose(y, np.tanh(b + b2 + b3), rtol=1e-12)
    y = R.forward(mk("flatten", [b.shape]), [b], {})
    assert y.shape == (2, 36, 1, 1)
    np.testing.assert_array_equal(y[1, :, 0, 0], b[1].ravel())
    np.testing.assert_array_equal(R.forward(mk("dropout", [b.shape]), [b], {}), b)


@pytest.mark.parametrize("op", ["relu", "sigmoid", "tanh", "leaky_relu"])
def test_activation_ops(op, rng):
    x = rng.standard_normal((1, 3, 2, 2))
    raw = {"alpha": 0.05} if op == "leaky_relu" else {}
    y = R.forward(mk(op, [x.shape], **raw), [x], {})
    want = {"relu": np.maximum(x, 0), "sigmoid": 1 / (1 + np.exp(-x)), "tanh": np.tanh(x),
            "leaky_relu": np.where(x > 0, x, 0.05 * x)}[op]
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_random_params_nonzero_and_scaled(rng):
    l = mk("conv", [(1, 64, 5, 5)], out=128, kernel=3)
    p = R.random_params(l, rng)
    assert p["weight"].dtype == np.float32 and np.all(p["weight"] != 0) and np.all(p["bias"] != 0)
    assert p["weight"].std() == pytest.approx(1 / math.sqrt(64 * 9), rel=0.05)


def test_run_network_dict_and_flat_params(rng):
    s = (2, 3, 8, 8)
    c1 = mk("conv", [s], name="c1", line=1, out=4, kernel=3, pad=1, act="relu")
    c2 = mk("conv", [s], name="c2", line=2, out=2, kernel=1)
    cat = mk("concat", [c1.out_shape, c2.out_shape], name="cat", inputs=("c1", "c2"), line=3)
    mp = mk("maxpool", [cat.out_shape], name="mp", inputs=("cat",), line=4, kernel=2)
    fc = mk("dense", [mp.out_shape], name="fc", inputs=("mp",), line=5, out=3)
    sm = mk("softmax", [fc.out_shape], name="sm", inputs=("fc",), line=6)
    c2.inputs = ["input"]
    net = Network("t", s, [c1, c2, cat, mp, fc, sm], ["sm", "c2"])
    params = R.random_network_params(net, rng)
    x = rng.standard_normal(s)
    prob, out2 = R.run_network(net, x, params)
    # by hand, layer by layer
    h1 = R.forward(c1, [x], params["c1"])
    h2 = R.forward(c2, [x], params["c2"])
    h = R.forward(fc, [R.forward(mp, [np.concatenate([h1, h2], 1)], {})], params["fc"])
    np.testing.assert_allclose(prob, R.softmax(h), rtol=1e-12)
    np.testing.assert_allclose(out2, h2, rtol=1e-12)
    flat = np.concatenate([params[l][t].ravel() for l, t, _, _ in net.param_layout()])
    assert flat.size == net.param_count()
    prob_flat, _ = R.run_network(net, x, flat)
    np.testing.assert_array_equal(prob_flat, prob)

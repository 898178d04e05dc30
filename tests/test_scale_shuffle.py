"""The ops of squeeze-and-excitation and ShuffleNet: scale (x [N, C, H, W] times s [N, C, 1, 1]),
mul (same shapes), channel_shuffle (groups) and channel_slice (start, end); and crop (top, left,
bottom, right), which follows a pool whose ONNX padding differs at the two ends.

Device-free: the schema, shape inference and errors, the numpy reference against an independent
loop, the variants' spaces (the fallback valid on every target) and rendering. PoCL: each variant
over a shape sweep (odd sizes, 1x1 planes, partial work-groups) with its fallback and three
other points of its space, and a network of all four built into a library.
"""
import re
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, reference
from aotconv.errors import SpecError
from aotconv.graph import Layer
from aotconv.space import variant_space
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer

POCL = TARGETS["pocl-cpu"]


def make_layer(op, in_shapes, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(op, op, a, [f"in{i}" for i in range(len(in_shapes))],
                 in_shapes=[tuple(s) for s in in_shapes], out_shape=out, params=params)


# (id, op, input shapes, raw attrs): odd channel counts and planes, 1x1 planes, a batch > 1
SWEEP = [
    ("scale_1x1", "scale", [(1, 7, 1, 1), (1, 7, 1, 1)], {}),
    ("scale_se_b2", "scale", [(2, 16, 7, 5), (2, 16, 1, 1)], {}),
    ("scale_prime", "scale", [(1, 13, 11, 3), (1, 13, 1, 1)], {}),
    ("scale_wide", "scale", [(1, 96, 14, 14), (1, 96, 1, 1)], {}),
    ("mul_odd", "mul", [(3, 5, 7, 1)] * 2, {}),
    ("mul_flat", "mul", [(2, 33, 1, 1)] * 2, {}),
    ("shuffle_g2", "channel_shuffle", [(1, 8, 5, 5)], {"groups": 2}),
    ("shuffle_g3_b2", "channel_shuffle", [(2, 12, 3, 7)], {"groups": 3}),
    ("shuffle_g1", "channel_shuffle", [(1, 5, 2, 2)], {"groups": 1}),
    ("shuffle_gc", "channel_shuffle", [(1, 6, 1, 1)], {"groups": 6}),
    ("shuffle_shufflenet", "channel_shuffle", [(1, 116, 28, 28)], {"groups": 2}),
    ("slice_first_half", "channel_slice", [(1, 10, 5, 5)], {"start": 0, "end": 5}),
    ("slice_second_half_b2", "channel_slice", [(2, 10, 3, 7)], {"start": 5, "end": 10}),
    ("slice_middle_1x1", "channel_slice", [(1, 9, 1, 1)], {"start": 3, "end": 4}),
    ("slice_all", "channel_slice", [(1, 3, 7, 11)], {"start": 0, "end": 3}),
    ("crop_top_left", "crop", [(1, 3, 3, 3)], {"top": 1, "left": 1}),
    ("crop_all_sides_b2", "crop", [(2, 5, 9, 13)], {"top": 2, "left": 1, "bottom": 3, "right": 4}),
    ("crop_to_1x1", "crop", [(1, 7, 2, 2)], {"bottom": 1, "right": 1}),
    ("crop_nothing", "crop", [(1, 2, 5, 3)], {}),
    ("crop_rows_only", "crop", [(1, 4, 29, 31)], {"top": 3, "bottom": 5}),
]
VARIANT_OF = {"scale": "scale_direct", "mul": "scale_direct",
              "channel_shuffle": "channel_shuffle_direct", "channel_slice": "channel_slice_direct",
              "crop": "crop_direct"}


def loop_reference(op, xs, a):
    """The ops written out element by element, independent of reference.forward."""
    x = xs[0]
    n, c, h, w = x.shape
    if op == "scale":
        y = np.empty_like(x)
        for i in range(n):
            for j in range(c):
                y[i, j] = x[i, j] * xs[1][i, j, 0, 0]
        return y
    if op == "mul":
        return x * xs[1]
    if op == "channel_shuffle":
        g = a["groups"]
        y = np.empty_like(x)
        for i in range(g):                       # group i, channel k of the group
            for k in range(c // g):
                y[:, k * g + i] = x[:, i * (c // g) + k]
        return y
    if op == "crop":
        rows = range(a["top"], h - a["bottom"])
        cols = range(a["left"], w - a["right"])
        return np.array([[[[x[i, j, r, q] for q in cols] for r in rows] for j in range(c)]
                         for i in range(n)])
    return np.stack([x[:, j] for j in range(a["start"], a["end"])], axis=1)


_data = {}


def data(case_id):
    if case_id not in _data:
        cid, op, shapes, raw = next(s for s in SWEEP if s[0] == case_id)
        layer = make_layer(op, shapes, **raw)
        rng = np.random.default_rng(zlib.crc32(cid.encode()))
        xs, params = harness.random_inputs(layer, rng)
        _data[case_id] = layer, xs, params, reference.forward(layer, xs, params)
    return _data[case_id]


@pytest.mark.parametrize("case_id", [s[0] for s in SWEEP])
def test_reference_matches_an_element_loop(case_id):
    layer, xs, _, want = data(case_id)
    assert want.shape == layer.out_shape
    np.testing.assert_array_equal(want, loop_reference(layer.op, [np.float64(x) for x in xs],
                                                       layer.attrs))


def test_shuffle_is_pytorch_shufflenet_and_slice_is_chunk():
    """channel_shuffle is torchvision's channel_shuffle (view, transpose(1, 2), view); two
    channel_slices are x.chunk(2, dim=1)."""
    x = np.arange(2 * 12 * 2 * 3, dtype=np.float64).reshape(2, 12, 2, 3)
    layer = make_layer("channel_shuffle", [x.shape], groups=4)
    got = reference.forward(layer, [x], {})
    want = x.reshape(2, 4, 3, 2, 3).swapaxes(1, 2).reshape(2, 12, 2, 3)
    np.testing.assert_array_equal(got, want)
    assert list(got[0, :, 0, 0]) == [x[0, c, 0, 0] for c in (0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11)]
    lo = reference.forward(make_layer("channel_slice", [x.shape], start=0, end=6), [x], {})
    hi = reference.forward(make_layer("channel_slice", [x.shape], start=6, end=12), [x], {})
    np.testing.assert_array_equal(np.concatenate([lo, hi], axis=1), x)


# -- schema and shape errors (device-free) -----------------------------------------------------

def net(layers, shape=(1, 8, 4, 4)):
    return network_from_dict({"name": "n", "input": list(shape), "layers": layers})


@pytest.mark.parametrize("layers,key,message", [
    ([{"name": "g", "op": "global_avgpool"}, {"name": "d", "op": "dense", "out": 4},
      {"name": "s", "op": "scale", "inputs": ["input", "d"]}],
     "inputs", r"the second input must be \[1, 8, 1, 1\]"),
    ([{"name": "s", "op": "scale", "inputs": ["input"]}], "inputs", "takes exactly 2 input"),
    ([{"name": "g", "op": "global_avgpool"}, {"name": "m", "op": "mul", "inputs": ["input", "g"]}],
     "inputs", "mul needs equal shapes"),
    ([{"name": "c", "op": "channel_shuffle", "groups": 3}], "groups",
     "input channels 8 are not divisible by groups 3"),
    ([{"name": "c", "op": "channel_shuffle", "groups": 0}], "groups", "must be >= 1"),
    ([{"name": "c", "op": "channel_shuffle"}], "groups", "needs key 'groups'"),
    ([{"name": "c", "op": "channel_slice", "start": 2, "end": 9}], "end",
     "9 is past the input's 8 channels"),
    ([{"name": "c", "op": "channel_slice", "start": 4, "end": 4}], "end",
     "must be greater than start 4"),
    ([{"name": "c", "op": "channel_slice", "start": -1, "end": 4}], "start", "must be >= 0"),
    ([{"name": "c", "op": "crop", "top": 2, "bottom": 2}], "bottom",
     "top 2 and bottom 2 leave nothing of the input height 4"),
    ([{"name": "c", "op": "crop", "left": -1}], "left", "must be >= 0"),
])
def test_bad_layers_are_one_line_errors(layers, key, message):
    with pytest.raises(SpecError, match=message) as e:
        net(layers)
    assert e.value.key == key and e.value.layer == layers[-1]["name"]
    assert "\n" not in str(e.value)


def test_shapes_and_flops():
    n = net([{"name": "g", "op": "global_avgpool"}, {"name": "s", "op": "scale",
                                                      "inputs": ["input", "g"]},
             {"name": "h", "op": "channel_shuffle", "groups": 4},
             {"name": "a", "op": "channel_slice", "start": 1, "end": 6}])
    assert n.layer("s").out_shape == (1, 8, 4, 4) and n.layer("a").out_shape == (1, 5, 4, 4)
    assert ops.flops(n.layer("s")) == 128 and ops.flops(n.layer("h")) == 0
    assert n.param_count() == 0


# -- the variants' spaces (device-free) ----------------------------------------------------------

@pytest.mark.parametrize("case_id", [s[0] for s in SWEEP])
def test_fallback_valid_on_every_target_and_every_point_renders(case_id):
    layer = data(case_id)[0]
    v = BY_NAME[VARIANT_OF[layer.op]]
    assert for_layer(layer)[:1] == [v]      # the fallback; scale_nhwc: test_eltwise_nhwc.py
    for t in TARGETS.values():
        space = variant_space(layer, v, t)
        assert v.fallback(layer, t) in space.points and not space.errors, t.name
    for cfg in v.configs(layer, POCL):
        src = v.render(layer, cfg, "net_l1")
        assert re.search(rf"^#define WG {cfg['WG']}\b", src, re.M) and "${" not in src
        (launch,) = v.launches(layer, cfg, "net_l1")
        assert launch.gsize[0] % launch.lsize[0] == 0
        assert {a.kind for a in launch.args} <= {"in", "out"}


def test_vec_longer_than_the_plane_is_pruned():
    layer = make_layer("channel_shuffle", [(1, 64, 1, 1)], groups=2)
    v = BY_NAME["channel_shuffle_direct"]
    space = variant_space(layer, v, POCL)
    assert {p["VEC"] for p in space.points} == {1}


# -- PoCL ---------------------------------------------------------------------------------------

def alt_points(layer, v):
    """Up to three other valid points of the space, spread over it."""
    fb = v.fallback(layer, POCL)
    pts = [p for p in variant_space(layer, v, POCL).points if p != fb]
    return pts[::max(1, -(-len(pts) // 3))]


# make test runs one case per op (with a batch > 1 where the op has one), the slow tier the rest
QUICK = {"scale_se_b2", "mul_odd", "shuffle_g3_b2", "slice_second_half_b2", "crop_all_sides_b2"}


@pytest.mark.parametrize("case_id", [s[0] if s[0] in QUICK else
                                     pytest.param(s[0], marks=pytest.mark.slow) for s in SWEEP])
def test_variant_matches_reference_on_pocl(case_id):
    layer, xs, params, want = data(case_id)
    v = BY_NAME[VARIANT_OF[layer.op]]
    ctx = harness.context_for(POCL)[:2]
    for cfg in [v.fallback(layer, POCL)] + list(alt_points(layer, v)):
        got = harness.run_layer(layer, v, cfg, xs, params, ctx=ctx)
        ok, err = harness.close(got, want, tol=1e-6 if layer.op in ("scale", "mul") else 0.0)
        assert ok, f"{v.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"


# slow tier (tests/conftest.py): 3 to 4 s; make test keeps each op's variant against the
# reference on PoCL (test_variant_matches_reference_on_pocl) and networks of several inputs
# through the library (tests/test_fold_fuse.py, tests/test_inputs.py)
@pytest.mark.slow
def test_network_of_the_new_ops_through_the_library(tmp_path):
    """squeeze-and-excitation, a ShuffleNet unit and a crop built with --no-tune, run through the
    emitted library against the numpy reference and, where installed, PyTorch."""
    import yaml
    from aotconv import params as params_mod
    from aotconv.compiler import compile_network
    from aotconv.runtime import load
    desc = {"name": "se_shuffle", "input": [1, 12, 9, 7], "layers": [
        {"name": "c1", "op": "conv", "out": 12, "kernel": 3, "pad": 1, "act": "relu"},
        {"name": "pool", "op": "global_avgpool"},
        {"name": "fc1", "op": "conv", "out": 4, "kernel": 1, "act": "relu"},
        {"name": "fc2", "op": "conv", "out": 12, "kernel": 1, "act": "hardsigmoid",
         "alpha": 1 / 6},
        {"name": "se", "op": "scale", "inputs": ["c1", "fc2"]},
        {"name": "left", "op": "channel_slice", "start": 0, "end": 6},
        {"name": "right", "op": "channel_slice", "start": 6, "end": 12, "inputs": ["se"]},
        {"name": "c2", "op": "conv", "out": 6, "kernel": 3, "pad": 1, "groups": 6},
        {"name": "sq", "op": "mul", "inputs": ["c2", "c2"]},
        {"name": "cat", "op": "concat", "inputs": ["left", "sq"]},
        {"name": "shuffle", "op": "channel_shuffle", "groups": 2},
        {"name": "crop", "op": "crop", "top": 1, "right": 2},
    ]}
    src = tmp_path / "se_shuffle.yaml"
    src.write_text(yaml.safe_dump(desc))
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "b",
                          tune_mode="fallback", measure=False, quiet=True, seed=5)
    n = network_from_dict(desc)
    flat = params_mod.read_bin(res.outdir / "se_shuffle.params.bin", n)
    x = np.random.default_rng(6).standard_normal(n.input_shape).astype(np.float32)
    with load(res.outdir) as lib:
        out = lib(x)
    want = reference.run_network(n, x, params_mod.split(n, flat))[0]
    ok, err = harness.close(out, want)
    assert ok, err
    try:
        import torch
    except ImportError:
        return
    from aotconv import torch_model
    with torch.no_grad():
        got = torch_model.build(n, flat)(torch.from_numpy(x)).numpy()
    ok, err = harness.close(got, want, tol=1e-5)
    assert ok, err

"""upsample (nearest and linear, each coordinate mode and rounding), conv_transpose (strides,
pads on each side, output_padding, dilation, groups) and softmax / log_softmax over any block
of axes.

Device-free: the schema and its one-line errors, the exact source coordinates, the numpy
reference against independent element loops, the default softmax's signature and kernel
unchanged (its tuning records stay valid), the variants' spaces. PoCL: each variant against the
reference (its fallback; more points of each space under the `slow` marker), and a small
decoder exported as ONNX built with `aotconv build --check` against onnxruntime.
"""
import json
import math
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


def make_layer(op, shape, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(shape)])
    return Layer(op, op, a, ["in0"], in_shapes=[tuple(shape)], out_shape=out, params=params)


# (id, op, input shape, raw attrs): odd sizes, 1x1 planes, batches, each mode
SWEEP = [
    ("up_nearest_2x", "upsample", (2, 3, 5, 7), {"scale": 2}),
    ("up_nearest_size_half_pixel", "upsample", (1, 2, 7, 4),
     {"size": [11, 9], "coordinates": "half_pixel", "rounding": "round_prefer_floor"}),
    ("up_nearest_down_ceil", "upsample", (1, 3, 9, 10),
     {"scale": [0.5, 0.25], "coordinates": "pytorch_half_pixel", "rounding": "ceil"}),
    ("up_nearest_align_round_ceil", "upsample", (1, 1, 4, 5),
     {"size": [13, 1], "coordinates": "align_corners", "rounding": "round_prefer_ceil"}),
    ("up_linear_2x", "upsample", (1, 3, 5, 7), {"scale": 2, "mode": "linear"}),
    ("up_linear_odd_scale", "upsample", (2, 2, 5, 6),
     {"scale": [1.5, 0.6], "mode": "linear", "coordinates": "asymmetric"}),
    ("up_linear_align", "upsample", (1, 2, 4, 3),
     {"size": [9, 8], "mode": "linear", "coordinates": "align_corners"}),
    ("up_linear_symmetric", "upsample", (1, 2, 6, 5),
     {"scale": [1.25, 0.7], "mode": "linear", "coordinates": "half_pixel_symmetric"}),
    ("ct_s2_pad_outpad", "conv_transpose", (1, 3, 5, 7),
     {"out": 4, "kernel": 3, "stride": 2, "pad": 1, "output_padding": 1}),
    ("ct_groups_dilation", "conv_transpose", (2, 4, 3, 5),
     {"out": 6, "kernel": [3, 2], "stride": [3, 2], "pad": [1, 0, 2, 1], "groups": 2,
      "dilation": [2, 1], "act": "relu"}),
    ("ct_1x1_input_no_bias", "conv_transpose", (1, 3, 1, 1),
     {"out": 5, "kernel": 4, "bias": False}),
    ("ct_depthwise_s3", "conv_transpose", (1, 4, 4, 3),
     {"out": 8, "kernel": 5, "stride": 3, "pad": [2, 1], "groups": 4}),
    ("softmax_w", "softmax", (2, 3, 5, 7), {"axis": 3}),
    ("softmax_hw", "softmax", (2, 3, 5, 7), {"axis": [2, 3]}),
    ("softmax_chw_wide", "softmax", (1, 1000, 1, 1), {"axis": [1, 2, 3]}),
    ("log_softmax_c", "log_softmax", (2, 5, 3, 3), {}),
    ("log_softmax_h", "log_softmax", (3, 2, 7, 1), {"axis": 2}),
]
VARIANT_OF = {"upsample": "upsample_direct", "conv_transpose": "conv_transpose_direct",
              "softmax": "softmax_direct", "log_softmax": "softmax_direct"}
_data = {}


def data(case_id):
    if case_id not in _data:
        _, op, shape, raw = next(s for s in SWEEP if s[0] == case_id)
        layer = make_layer(op, shape, **raw)
        rng = np.random.default_rng(zlib.crc32(case_id.encode()))
        xs, params = harness.random_inputs(layer, rng)
        _data[case_id] = layer, xs, params, reference.forward(layer, xs, params)
    return _data[case_id]


# -- schema and shapes (device-free) -----------------------------------------------------------

def net(layers, shape=(1, 4, 6, 6)):
    return network_from_dict({"name": "n", "input": list(shape), "layers": layers})


@pytest.mark.parametrize("layer, key, message", [
    ({"op": "upsample"}, "scale", "needs `scale`"),
    ({"op": "upsample", "scale": 2, "size": [3, 3]}, "scale", "not both"),
    ({"op": "upsample", "scale": 0}, "scale", "must be > 0"),
    ({"op": "upsample", "scale": [1, 2, 3]}, "scale", "[height, width] factors"),
    ({"op": "upsample", "scale": 0.1}, "scale", "gives an empty output"),
    ({"op": "upsample", "size": [0, 4]}, "size", "must be >= 1"),
    ({"op": "upsample", "scale": 2, "mode": "cubic"}, "mode", "use nearest or linear"),
    ({"op": "upsample", "scale": 2, "coordinates": "tf_crop"}, "coordinates", "unknown"),
    ({"op": "upsample", "scale": 2, "mode": "linear", "rounding": "floor"}, "rounding",
     "mode linear interpolates"),
    ({"op": "upsample", "scale": 2, "rounding": "nearest"}, "rounding", "unknown rounding"),
    ({"op": "upsample", "scale": 1e20}, "scale", "more than 2^31 - 1"),
    ({"op": "conv_transpose", "out": 4, "kernel": 3, "groups": 3}, "groups",
     "input channels 4 are not divisible by groups 3"),
    ({"op": "conv_transpose", "out": 4, "kernel": 2, "pad": [4, 0]}, "pad",
     "remove the whole output height"),
    ({"op": "conv_transpose", "out": 4, "kernel": 2, "pad": [1, 2, 3]}, "pad",
     "[top, left, bottom, right]"),
    ({"op": "conv_transpose", "out": 4, "kernel": 2, "output_padding": -1}, "output_padding",
     "must be >= 0"),
    ({"op": "softmax", "axis": 0}, "axis", "axis 0 is the batch"),
    ({"op": "softmax", "axis": 4}, "axis", "axes count 0 to 3"),
    ({"op": "log_softmax", "axis": [1, 3]}, "axis", "consecutive"),
    ({"op": "softmax", "axis": "c"}, "axis", "expected an axis (1, 2 or 3) or a list"),
    ({"op": "conv_transpose", "out": 4, "kernel": 2, "pad": "same"}, "pad",
     "[top, left, bottom, right]"),
])
def test_bad_layers_are_one_line_errors(layer, key, message):
    with pytest.raises(SpecError) as e:
        net([{"name": "l", **layer}])
    assert e.value.key == key and e.value.layer == "l" and "\n" not in str(e.value)
    assert message in str(e.value)


def test_shapes_params_and_defaults():
    n = net([{"name": "up", "op": "upsample", "scale": [1.5, 2]},
             {"name": "lin", "op": "upsample", "size": [7, 3], "mode": "linear"},
             {"name": "ct", "op": "conv_transpose", "out": 6, "kernel": 3, "stride": 2,
              "pad": [1, 0, 0, 1], "output_padding": 1, "groups": 2},
             {"name": "sm", "op": "softmax", "axis": [2, 3]}])
    up, lin, ct, sm = n.layers
    assert up.out_shape == (1, 4, 9, 12) and up.attrs["coordinates"] == "asymmetric" \
        and up.attrs["rounding"] == "floor"                 # PyTorch's nearest
    assert lin.attrs["coordinates"] == "half_pixel" and "rounding" not in lin.attrs
    # (7 - 1) * 2 + 3 + 1 - 1 - 0 rows, (3 - 1) * 2 + 3 + 1 - 0 - 1 columns
    assert ct.out_shape == (1, 6, 15, 7) and ct.params == [("weight", (4, 3, 3, 3)),
                                                           ("bias", (6,))]
    assert ops.flops(ct) == 2 * 4 * 7 * 3 * 3 * 3 * 3 and sm.attrs == {"axis": (2, 3)}
    # the default softmax keeps the attributes (and so the signature) it always had
    assert make_layer("softmax", (1, 10, 1, 1), axis=1).attrs == {}


@pytest.mark.parametrize("raw, axis, n_in, n_out, want", [
    ({"scale": 2}, 0, 4, 8, (1, 0, 2)),                                       # x / 2
    ({"scale": 2, "coordinates": "half_pixel"}, 0, 4, 8, (2, -1, 4)),          # x/2 - 1/4
    ({"size": [7, 1], "coordinates": "align_corners"}, 0, 4, 7, (1, 0, 2)),    # x * 3 / 6
    ({"size": [1, 1], "coordinates": "pytorch_half_pixel"}, 0, 5, 1, (0, 0, 1)),
    ({"scale": 0.6}, 0, 5, 3, (8388608, 0, 5033165)),                         # float32 0.6
    ({"scale": 2, "mode": "linear", "coordinates": "half_pixel_symmetric"}, 1, 3, 6,
     (2, -1, 4)),                                      # whole output: half_pixel
    ({"scale": 1.25, "mode": "linear", "coordinates": "half_pixel_symmetric"}, 1, 5, 6,
     (4, 0, 5)),                                       # 5/2 (1 - 6/6.25) + (x + 1/2) / 1.25 - 1/2
])
def test_exact_source_coordinates(raw, axis, n_in, n_out, want):
    a = ops.normalise("upsample", raw)
    a["size"] = a["size"] or (n_out, n_out)
    assert ops.upsample_coordinate(a, axis, n_in, n_out) == want


# -- the reference against element loops (device-free) ---------------------------------------

def _loop_upsample(x, a, out_shape):
    """ONNX Resize's formulas one output at a time, in float64 (exact for these scales)."""
    n, c, h, w = x.shape
    p, q = out_shape[2:]
    y = np.empty((n, c, p, q))

    def coord(o, n_in, n_out, s):
        kind = a["coordinates"]
        if kind == "asymmetric":
            return o / s
        if kind == "align_corners":
            return o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        if kind == "pytorch_half_pixel" and n_out == 1:
            return 0.0
        if kind == "half_pixel_symmetric":
            return n_in / 2 * (1 - n_out / (s * n_in)) + (o + 0.5) / s - 0.5
        return (o + 0.5) / s - 0.5

    def nearest(v, n_in):
        r = {"floor": math.floor(v), "ceil": math.ceil(v),
             "round_prefer_floor": math.ceil(v - 0.5),
             "round_prefer_ceil": math.floor(v + 0.5)}[a["rounding"]]
        return min(max(r, 0), n_in - 1)

    def taps(v, n_in):
        v = min(max(v, 0.0), n_in - 1)
        i = int(math.floor(v))
        return i, min(i + 1, n_in - 1), v - i

    sh, sw = a["scale"] or (p / h, q / w)
    for i in range(p):
        cy = coord(i, h, p, sh)
        for j in range(q):
            cx = coord(j, w, q, sw)
            if a["mode"] == "nearest":
                y[:, :, i, j] = x[:, :, nearest(cy, h), nearest(cx, w)]
            else:
                r0, r1, wy = taps(cy, h)
                c0, c1, wx = taps(cx, w)
                y[:, :, i, j] = ((1 - wy) * ((1 - wx) * x[:, :, r0, c0] + wx * x[:, :, r0, c1])
                                 + wy * ((1 - wx) * x[:, :, r1, c0] + wx * x[:, :, r1, c1]))
    return y


def _loop_conv_transpose(x, wt, b, a, out_shape):
    """Scatter every input pixel through every tap, then bias and act."""
    n, c, h, w = x.shape
    g = a["groups"]
    cg, og = c // g, wt.shape[1]
    (sh, sw), (dh, dw), (pt, pl) = a["stride"], a["dilation"], a["pad"][:2]
    y = np.zeros(out_shape)
    for ci in range(c):
        for o in range(og):
            k = ci // cg * og + o
            for r in range(wt.shape[2]):
                for s in range(wt.shape[3]):
                    for iy in range(h):
                        oy = iy * sh - pt + r * dh
                        if not 0 <= oy < out_shape[2]:
                            continue
                        for ix in range(w):
                            ox = ix * sw - pl + s * dw
                            if 0 <= ox < out_shape[3]:
                                y[:, k, oy, ox] += x[:, ci, iy, ix] * wt[ci, o, r, s]
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return reference.act_of(y, a)


def _loop_softmax(x, axes, log):
    y = np.empty_like(x)
    other = [d for d in range(4) if d not in axes]
    for idx in np.ndindex(*[x.shape[d] for d in other]):
        sl = [slice(None)] * 4
        for d, i in zip(other, idx):
            sl[d] = i
        v = x[tuple(sl)]
        e = np.exp(v - v.max())
        y[tuple(sl)] = np.log(e / e.sum()) if log else e / e.sum()
    return y


@pytest.mark.parametrize("case_id", [s[0] for s in SWEEP])
def test_reference_matches_an_element_loop(case_id):
    layer, xs, params, want = data(case_id)
    x = np.float64(xs[0])
    assert want.shape == layer.out_shape
    if layer.op == "upsample":
        got = _loop_upsample(x, layer.attrs, layer.out_shape)
    elif layer.op == "conv_transpose":
        got = _loop_conv_transpose(x, np.float64(params["weight"]),
                                   None if "bias" not in params else np.float64(params["bias"]),
                                   layer.attrs, layer.out_shape)
    else:
        got = _loop_softmax(x, ops.softmax_axes(layer.attrs), layer.op == "log_softmax")
    np.testing.assert_allclose(want, got, rtol=1e-12, atol=1e-12)


def test_default_softmax_kernel_is_unchanged_so_shipped_records_stay_valid():
    """Its template now takes any axes: what it renders for the channel axis must hash as the
    kernels the shipped records timed, or those records would no longer be used."""
    from aotconv.tune.records import DATA_DIR, cfg_from_json, kernel_hash, layer_of
    v = BY_NAME["softmax_direct"]
    seen = 0
    for target in ("h100", "pocl-cpu"):
        for line in (DATA_DIR / f"{target}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("variant") == "softmax_direct" and "kernel" in rec:
                assert kernel_hash(v, layer_of(rec["op"]), cfg_from_json(rec["cfg"])) == \
                    rec["kernel"], rec["op"]
                seen += 1
    assert seen >= 4


# -- spaces (device-free) ----------------------------------------------------------------------

@pytest.mark.parametrize("case_id", [s[0] for s in SWEEP])
def test_fallback_valid_on_every_target_and_every_point_renders(case_id):
    layer = data(case_id)[0]
    v = BY_NAME[VARIANT_OF[layer.op]]
    assert for_layer(layer) == [v]
    for t in TARGETS.values():
        space = variant_space(layer, v, t)
        assert v.fallback(layer, t) in space.points and not space.errors, t.name
    for cfg in v.configs(layer, POCL):
        src = v.render(layer, cfg, "net_l1")
        assert f"#define WG {cfg['WG']}" in src and "${" not in src
        (launch,) = v.launches(layer, cfg, "net_l1")
        assert launch.gsize[0] % launch.lsize[0] == 0


def test_upsample_coordinates_past_int_use_long():
    # float32 0.6 is 10066330 / 2^24: (2^24 x + ...) for x up to 999 overflows an int
    layer = make_layer("upsample", (1, 1, 1000, 4), scale=[0.6, 1], mode="linear",
                       coordinates="half_pixel")
    v = BY_NAME["upsample_direct"]
    src = v.render(layer, v.fallback(layer, POCL), "k")
    assert "const long n = (long)16777216 * o + 3355443;" in src
    assert "const int n = o;" in src                        # columns: scale 1


# -- PoCL ---------------------------------------------------------------------------------------

def _points(layer, v, how_many):
    fb = v.fallback(layer, POCL)
    others = [p for p in variant_space(layer, v, POCL).points if p != fb]
    return [fb] + others[::max(1, -(-len(others) // how_many))][:how_many]


@pytest.mark.parametrize("case_id", [
    pytest.param(s[0], marks=() if i % 3 == 0 else pytest.mark.slow)
    for i, s in enumerate(SWEEP)])
def test_variant_matches_reference_on_pocl(case_id):
    layer, xs, params, want = data(case_id)
    v = BY_NAME[VARIANT_OF[layer.op]]
    ctx = harness.context_for(POCL)[:2]
    for cfg in _points(layer, v, 1):
        got = harness.run_layer(layer, v, cfg, xs, params, ctx=ctx)
        ok, err = harness.close(got, want, tol=1e-5)
        assert ok, f"{v.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("case_id", [s[0] for s in SWEEP])
def test_more_points_of_each_space_on_pocl(case_id):
    layer, xs, params, want = data(case_id)
    v = BY_NAME[VARIANT_OF[layer.op]]
    ctx = harness.context_for(POCL)[:2]
    for cfg in _points(layer, v, 4)[1:]:
        got = harness.run_layer(layer, v, cfg, xs, params, ctx=ctx)
        ok, err = harness.close(got, want, tol=1e-5)
        assert ok, f"{v.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"


# slow tier (tests/conftest.py): 2.5 to 5 s; make test keeps the importer's mapping of these ops
# (tests/test_onnx_resample.py), each variant against the reference on PoCL (above) and an ONNX
# build checked against onnxruntime (tests/test_onnx_build.py)
@pytest.mark.slow
def test_onnx_decoder_built_and_checked_against_onnxruntime(tmp_path, capsys):
    """Conv, ConvTranspose + Relu (folded into its kernel), Resize nearest and linear, Softmax
    over the channels and LogSoftmax over the columns: `aotconv build model.onnx --check`."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from aotconv.cli import main
    from onnx_helpers import model, node, rand, save
    m = model([node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
               node("ConvTranspose", ["c1", "w2", "b2"], ["d1"], strides=[2, 2],
                    pads=[1, 1, 1, 1], output_padding=[1, 1]),
               node("Relu", ["d1"], ["r1"]),
               node("Resize", ["r1", "roi", "sc"], ["u1"], mode="nearest"),
               node("Resize", ["u1", "roi", "", "sz"], ["u2"], mode="linear",
                    coordinate_transformation_mode="align_corners"),
               node("Softmax", ["u2"], ["p"], axis=1),
               node("LogSoftmax", ["p"], axis=3)], [1, 3, 9, 11],
              inits={"w1": rand(8, 3, 3, 3), "b1": rand(8), "w2": rand(8, 4, 3, 3),
                     "b2": rand(4), "roi": np.zeros(0, np.float32),
                     "sc": np.array([1, 1, 2, 2], np.float32),
                     "sz": np.array([1, 4, 29, 37], np.int64)}, opset=17)
    path = save(m, tmp_path / "decoder.onnx")
    assert main(["build", path, "--target", "pocl-cpu", "--no-tune", "--check",
                 "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "7 layers (6 after fusion)" in text
    assert "check against onnxruntime" in text and "(ok)" in text

"""conv_mma_f16_stem: a network's first convolutions (few input channels, NCHW in, NHWC out) on
the tensor cores for an fp16 build.

Device-free: where it is offered (half layers with C % 8 != 0 and K % 8 == 0, groups 1, no
residual; the tensor cores or the emulation switch) and its reasons for the others, its packed
weights and setup launch, its PTX through clang's nvptx and ptxas for sm_90 without spills at
VGG-16's conv1_1 and ResNet-50's conv1.

PoCL (the mma emulated): a 3x3 over 3 channels with padding, a strided 7x7 with K = 24 (a
work-group's channels past K) and no bias, a dilated 5x5 over one channel with asymmetric
padding and 16 pixels in all, both epilogues, against the float64 reference within the half
tolerance and the half model within one half ulp; both epilogues store the same bits; a kernel
whose A fragments swap two registers is caught. Read as float (the network's input, its cast
fused in), the kernel stores the half-input kernel's bits on the cast input; an fp16 library
whose stem reads the float input and whose softmax writes the float output has no cast kernel
and passes --check.
"""
import functools

import numpy as np
import pytest

from aotconv import harness, ops, protocol, reference
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.space import variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)
from mma_nhwc_helpers import random_case

V = BY_NAME["conv_mma_f16_stem"]
H100 = TARGETS["h100"]


def conv(in_shape, storage="fp16", pads=None, **raw):
    a = ops.normalise("conv", raw)
    if pads:
        a["pad"] = tuple(pads)                   # top, left, bottom, right (as ONNX gives)
    if storage == "fp16":
        a["storage"] = "fp16"
    o, params = ops.infer("conv", a, [tuple(in_shape)])
    return Layer("conv1", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=o,
                 params=params)


def _cfg(**kw):
    return Config(tuple(kw.items()))


VGG_CONV1_1 = dict(in_shape=(16, 3, 224, 224), out=64, kernel=3, pad=1, act="relu")
R50_CONV1 = dict(in_shape=(32, 3, 224, 224), out=64, kernel=7, stride=2, pad=3, act="relu")


# -- where it is offered ------------------------------------------------------------------------

def test_offered_to_fp16_first_convolutions_on_tensor_cores_only(monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv(**VGG_CONV1_1)
    assert V.supports(layer) is None
    assert V.layouts_of(layer, V.fallback(layer, with_precision(H100, "fp16"))) == ("NCHW",
                                                                                   "NHWC")
    assert variant_space(layer, V, with_precision(H100, "fp16"), explain=False).points
    assert "--precision fp16" in V.supports(conv(storage="fp32", **VGG_CONV1_1))
    assert "C % 8 != 0" in V.supports(conv((2, 16, 8, 8), out=16, kernel=3))
    assert "K % 8 == 0" in V.supports(conv((2, 3, 8, 8), out=12, kernel=3))
    assert "groups" in V.supports(conv((2, 3, 8, 8), out=6, kernel=3, groups=3))
    residual = conv((2, 3, 8, 8), out=16, kernel=3, pad=1)
    residual.attrs["residual"] = True
    assert "residual" in V.supports(residual)
    # no tensor cores, no switch: no point on PoCL
    assert not variant_space(layer, V, with_precision(TARGETS["pocl-cpu"], "fp16"),
                             explain=False).points


def test_the_weights_are_packed_once_as_b_fragments():
    """One setup launch packs [steps][n-tiles][32 lanes][2 words]: a 7x7 over 3 channels is
    147 k in 10 steps of 16; K = 64 at BN = 128 pads to 16 tiles of 8."""
    layer = conv(**R50_CONV1)
    cfg = _cfg(NT=16, MT=1, WARPS=4, EPI=1)
    assert V.buffers(layer, cfg) == {"wpack": 10 * 16 * 64}
    pack, run = V.launches(layer, cfg, "k")
    assert pack.phase == "setup" and run.phase == "run"
    assert [a.name for a in pack.args] == ["weight", "wpack"]


# -- the PTX for NVIDIA's compiler --------------------------------------------------------------

@pytest.mark.parametrize("shape", [VGG_CONV1_1, R50_CONV1], ids=["vgg16_conv1_1",
                                                                 "resnet50_conv1"])
def test_the_kernel_assembles_for_sm_90_without_spills(monkeypatch, shape):
    """The kernel through clang's nvptx and ptxas for sm_90 (the H100), at the space's point of
    the most accumulators and one of each epilogue: mma.sync, no spilled register."""
    from mma_nhwc_helpers import assemble_sm90
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv(**shape)
    points = variant_space(layer, V, with_precision(H100, "fp16"), explain=False).points
    largest = max(points, key=lambda c: (c["NT"] * c["MT"], c["EPI"]))
    for cfg in (largest, _cfg(NT=8, MT=1, WARPS=1, EPI=0)):
        assert cfg in set(points), cfg
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in assemble_sm90(V, layer,
                                                                                     cfg)


# -- on PoCL: the emulated mma ------------------------------------------------------------------

# id -> (layer, points): K = 24 leaves BN = 16's second work-group half its channels; 16 pixels
# fill one tile of one warp
CASES = {
    "c3_3x3_pad_relu": (lambda: conv((2, 3, 9, 11), out=16, kernel=3, pad=1, act="relu"),
                        [dict(NT=2, MT=2, WARPS=4, EPI=0), dict(NT=2, MT=1, WARPS=2, EPI=1)]),
    "c3_7x7_s2_k24_nobias": (lambda: conv((1, 3, 15, 13), out=24, kernel=7, stride=2, pad=3,
                                          bias=False),
                             [dict(NT=2, MT=1, WARPS=2, EPI=1), dict(NT=4, MT=2, WARPS=1, EPI=0)]),
    "c1_5x5_dilated_asym_tanh": (lambda: conv((2, 1, 8, 8), out=8, kernel=5, dilation=2,
                                              pads=(1, 2, 3, 0), act="tanh"),
                                 [dict(NT=1, MT=1, WARPS=1, EPI=1)]),
}


@functools.lru_cache(maxsize=None)
def case(cid):
    return random_case(CASES[cid][0](), cid)


def _run(layer, cfg, xs, prm, target, ctx):
    out = harness.run_layer(layer, V, cfg, xs, prm, target=target, ctx=ctx)
    return reference.from_layout(out.ravel(), "NHWC", layer.out_shape)


@pytest.mark.parametrize("cid", list(CASES))
def test_emulated_stem_against_the_reference(emulated, cid):
    target, ctx = emulated
    layer, xs, prm = case(cid)
    valid = set(variant_space(layer, V, target, explain=False).points)
    outs = {}
    for point in CASES[cid][1] + [None]:
        cfg = V.fallback(layer, target) if point is None else _cfg(**point)
        assert cfg in valid, cfg
        outs[cfg] = check_half_output(layer, xs, prm, cfg, _run(layer, cfg, xs, prm, target, ctx))
    # the staged epilogue rounds and stores what the direct one does
    by_epi = {c["EPI"]: o for c, o in outs.items()}
    if len(by_epi) == 2:
        assert np.array_equal(by_epi[0], by_epi[1])


def test_a_wrong_fragment_register_is_caught(emulated, monkeypatch):
    """a1 is row g + 8 at k 2t, a2 row g at k 2t + 8 (the PTX ISA's order): a kernel that swaps
    them multiplies the wrong pixels' taps, and the check fails."""
    target, ctx = emulated
    layer, xs, prm = case("c3_3x3_pad_relu")
    cfg = _cfg(NT=2, MT=1, WARPS=2, EPI=0)
    good = V.render(layer, cfg, "k")
    a1, a2 = "a[mt][1] = v[1][0] | v[1][1] << 16;", "a[mt][2] = v[0][2] | v[0][3] << 16;"
    assert good.count(a1) == 1 and good.count(a2) == 1
    bad = good.replace(a1, "a[mt][1] = v[0][2] | v[0][3] << 16;").replace(
        a2, "a[mt][2] = v[1][0] | v[1][1] << 16;")
    monkeypatch.setattr(type(V), "render", lambda self, l, c, p: bad)
    out = _run(layer, cfg, xs, prm, target, ctx)
    with pytest.raises(AssertionError, match="half tolerance"):
        check_half_output(layer, xs, prm, cfg, out)


# -- the network's float input, read in place of a cast -----------------------------------------

def test_float_input_stores_the_bits_of_the_cast_input(emulated):
    """Read as float (a network's input, the cast fused in: aotconv.layouts.fuse_casts), the
    kernel rounds each value to half as it gathers it: its output is the half-input kernel's
    on the input the cast would have stored, bit for bit, at both epilogues; and it meets the
    half tolerance against the float64 reference on the float input itself."""
    target, ctx = emulated
    layer, xs, prm = case("c3_3x3_pad_relu")
    floating = conv((2, 3, 9, 11), out=16, kernel=3, pad=1, act="relu")
    floating.attrs = dict(floating.attrs, src_storage="fp32")
    assert V.supports(floating) is None and V.reads_float
    # values between halves, so that rounding them matters
    x = (xs[0] * np.float32(1 + 2.0 ** -13)).astype(np.float32)
    assert not np.array_equal(x, x.astype(np.float16).astype(np.float32))
    rounded = [x.astype(np.float16).astype(np.float32)]
    for point in CASES["c3_3x3_pad_relu"][1]:
        cfg = _cfg(**point)
        text = V.render(floating, cfg, "k")
        assert "__global const float* restrict x" in text and "float in" in text
        got = _run(floating, cfg, [x], prm, target, ctx)
        want = _run(layer, cfg, rounded, prm, target, ctx)
        assert np.array_equal(got, want), point
        check_half_output(floating, [x], prm, cfg, got)
    # the half-input kernel renders as it did before float input existed
    assert "__global const ushort* restrict x" in V.render(layer, cfg, "k")


STEM_NET = """name: stemnet
input: [2, 3, 10, 12]
layers:
  - {name: c1, op: conv, out: 16, kernel: 3, pad: 1, act: relu}
  - {name: c2, op: conv, out: 8, kernel: 3, stride: 2, pad: 1, act: relu}
  - {name: f, op: flatten}
  - {name: d, op: dense, out: 10}
  - {name: prob, op: softmax}
"""


def test_an_fp16_library_casts_nothing_at_its_edges(tmp_path, monkeypatch, emulated):
    """An fp16 network whose first conv runs on the stem (records make it fastest) and whose
    output is a softmax's, built for PoCL with --check: no cast kernel at either edge (c1
    reads the float input, the softmax writes the float output), the library's outputs
    within T of the float64 half model, which rounds c1's input to half."""
    from mma_nhwc_helpers import built_from_records
    res = built_from_records(tmp_path, monkeypatch, "stemnet", STEM_NET, "fp16",
                             lambda net, _, t: [(net.layer("c1"), V,
                                                 V.fallback(net.layer("c1"), t))])
    sch = res.schedule
    assert sch.choices["c1"].variant == V.name
    assert not [l.name for l in sch.net.layers if "src_storage" in l.attrs
                and l.op == "layout_convert"]
    assert sch.net.layer("c1").inputs == ["input"] and sch.net.outputs == ["prob"]
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE
    sources = "".join(p.read_text() for p in (tmp_path / "out").rglob("*.cl"))
    assert "NCHW float in (rounded to half as read)" in sources

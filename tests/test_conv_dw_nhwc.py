"""conv_dw_nhwc: depthwise convolution that reads and writes NHWC or CHWN.

Device-free: its domain (depthwise, multiplier 1, no residual) and the reasons it gives
otherwise; that it declares the layout of its LAYOUT knob and is never a layer's fallback; its
fallback valid on every target for the sweep and MobileNet-v2's depthwise layers; pruning with
named reasons; guards, lane-by-lane tails and half storage emitted only where the sizes and the
build need them; its launches and packed-weight buffer. PoCL: the sweep (3x3 s1 p1, 3x3 s2
with asymmetric padding, 5x5, dilation 2, channels not whole vectors, batch 2 and 3, bias and
relu6, every act form, a filter large enough to keep its row loop) with every value of every
knob, against reference.forward in the layout the variant declares; half storage; and the
tuner choosing it for the depthwise layers of a small inverted-residual network (in the slow
tier: that network built and checked against numpy with every layer in NHWC).
"""
import functools
import json
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, protocol, reference
from aotconv.choose import fallback_choice
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.layouts import layout_capable
from aotconv.space import point_ok, variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]
H100 = TARGETS["h100"]
DWN = BY_NAME["conv_dw_nhwc"]


def conv(in_shape, storage=None, **raw):
    a = ops.normalise("conv", raw)
    if storage:
        a["storage"] = storage
    out, params = ops.infer("conv", a, [tuple(in_shape)])
    return Layer("conv", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params)


def cfg(layout, vw, qt, tv, tx, ty):
    return Config.of(LAYOUT=layout, VW=vw, QT=qt, TV=tv, TX=tx, TY=ty)


# id -> (input shape, attributes): multiplier 1 throughout
SWEEP = {
    "c16_9x9_k3_s1_p1_relu6": ((1, 16, 9, 9), dict(out=16, kernel=3, pad=1, groups=16,
                                                   act="relu6")),
    # pad same at stride 2 on an even size: 0 above and left, 1 below and right
    "c12_10x10_k3_s2_asym_relu": ((1, 12, 10, 10), dict(out=12, kernel=3, stride=2, pad="same",
                                                        groups=12, act="relu")),
    "c5_11x9_k5_p2_silu_nobias": ((1, 5, 11, 9), dict(out=5, kernel=5, pad=2, groups=5,
                                                      act="silu", bias=False)),
    "b3_c7_9x9_k3_d2_leaky": ((3, 7, 9, 9), dict(out=7, kernel=3, pad=2, dilation=2, groups=7,
                                                 act="leaky_relu", alpha=0.1)),
    "b2_c6_5x40_k3_p1_relu6": ((2, 6, 5, 40), dict(out=6, kernel=3, pad=1, groups=6,
                                                   act="relu6")),
    "c4_20x6_k3x5_hardswish": ((1, 4, 20, 6), dict(out=4, kernel=[3, 5], pad=[1, 2], groups=4,
                                                   act="hardswish")),
    "b2_c3_15x15_k13_p6": ((2, 3, 15, 15), dict(out=3, kernel=13, pad=6, groups=3)),
}

# the points each shape runs besides its fallback: together every value of every knob
POINTS = {
    "c16_9x9_k3_s1_p1_relu6": [cfg("NHWC", 4, 2, 4, 4, 4), cfg("NHWC", 1, 1, 64, 1, 1),
                               cfg("NHWC", 1, 2, 16, 4, 1), cfg("NHWC", 1, 1, 32, 2, 1)],
    "c12_10x10_k3_s2_asym_relu": [cfg("NHWC", 4, 1, 2, 8, 4)],
    # 5 channels: 1 lane past the last whole float4, 1 past the last float2
    "c5_11x9_k5_p2_silu_nobias": [cfg("NHWC", 4, 4, 1, 2, 8), cfg("NHWC", 2, 8, 8, 1, 2)],
    # CHWN: 3 images in float2 (one lane past), 7 channels in NHWC float2
    "b3_c7_9x9_k3_d2_leaky": [cfg("CHWN", 2, 2, 2, 4, 2), cfg("NHWC", 2, 4, 4, 2, 8)],
    "b2_c6_5x40_k3_p1_relu6": [cfg("CHWN", 2, 1, 1, 32, 2), cfg("NHWC", 1, 2, 2, 16, 2),
                               cfg("NHWC", 2, 8, 4, 4, 4)],
    "c4_20x6_k3x5_hardswish": [cfg("NHWC", 4, 2, 1, 2, 16)],
    # 13 x 13 x 8 multiply-adds: the filter-row loop stays a loop; x 4 it is unrolled
    "b2_c3_15x15_k13_p6": [cfg("CHWN", 1, 8, 2, 2, 8), cfg("NHWC", 1, 4, 4, 4, 4)],
}

# MobileNet-v2's depthwise layers at 224x224 (channels, input size, stride)
MOBILENET = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
             (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]


def mobilenet_layer(c, size, stride, batch=1):
    return conv((batch, c, size, size), out=c, kernel=3, pad=1, stride=stride, groups=c)


@functools.lru_cache(maxsize=None)
def layer_of(lid):
    shape, attrs = SWEEP[lid]
    return conv(shape, **attrs)


@functools.lru_cache(maxsize=None)
def data_of(lid):
    layer = layer_of(lid)
    rng = np.random.default_rng(zlib.crc32(lid.encode()))
    xs, prm = harness.random_inputs(layer, rng)
    return xs, prm


# -- device-free: the domain -------------------------------------------------------------------

def test_domain_is_depthwise_with_multiplier_one():
    assert DWN.supports(conv((1, 4, 5, 5), out=4, kernel=3, groups=4)) is None
    assert DWN.supports(conv((3, 1, 5, 5), out=1, kernel=[1, 5], groups=1)) is None     # C = 1
    why = DWN.supports(conv((1, 4, 5, 5), out=4, kernel=3, groups=2))
    assert why == "conv_dw_nhwc needs groups == input channels (depthwise), not groups 2 of 4 " \
                  "channels"
    why = DWN.supports(conv((1, 4, 5, 5), out=8, kernel=3, groups=4))
    assert "channel multiplier 1" in why and "not 2" in why and "conv_depthwise" in why
    dense = Layer("d", "dense", ops.normalise("dense", dict(out=3)), ["input"],
                  in_shapes=[(1, 4, 1, 1)], out_shape=(1, 3, 1, 1))
    assert DWN.supports(dense) == "conv_dw_nhwc implements conv, not dense"


def test_it_declines_a_fused_residual_saying_so():
    from aotconv.passes import residual_layer
    plain = conv((1, 8, 6, 6), out=8, kernel=3, pad=1, groups=8)
    add = Layer("a", "add", ops.normalise("add", {}), ["conv", "r"],
                in_shapes=[plain.out_shape] * 2, out_shape=plain.out_shape)
    fused = residual_layer(plain, add)
    assert DWN.supports(plain) is None
    assert DWN.supports(fused) == ("conv_dw_nhwc takes no residual input in its epilogue (a "
                                   "conv with an add fused in)")


def test_it_declares_the_layout_of_its_knob_and_no_other():
    layer = layer_of("c16_9x9_k3_s1_p1_relu6")
    (knob,) = [k for k in DWN.knobs(layer, POCL) if k.name == "LAYOUT"]
    assert knob.values == ("NHWC", "CHWN")
    for lay in knob.values:
        assert DWN.layouts_of(layer, cfg(lay, 4, 2, 4, 4, 4)) == (lay, lay)
    assert layout_capable(layer)
    # every point of the space reads and writes one layout, never NCHW
    pts = variant_space(layer, DWN, POCL).points
    assert {DWN.layouts_of(layer, c) for c in pts} == {("NHWC", "NHWC"), ("CHWN", "CHWN")}


def test_it_is_a_tuned_alternative_never_the_fallback():
    """conv_depthwise (NCHW) stays every depthwise layer's fallback; conv_dw_nhwc competes
    with it when tuning."""
    for lid in SWEEP:
        vs = for_layer(layer_of(lid))
        assert vs[0].name == "conv_depthwise" and DWN in vs, lid
    for c, s, st in MOBILENET[:3]:
        assert fallback_choice(mobilenet_layer(c, s, st), POCL).variant == "conv_depthwise"
    assert DWN not in for_layer(conv((1, 4, 5, 5), out=8, kernel=3, groups=4))      # M = 2


# -- device-free: the space --------------------------------------------------------------------

@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fallback_valid_on_every_target(target):
    t = TARGETS[target]
    layers = [layer_of(lid) for lid in SWEEP]
    layers += [mobilenet_layer(c, s, st, b) for c, s, st in MOBILENET for b in (1, 16)]
    for layer in layers:
        fb = DWN.fallback(layer, t)
        assert point_ok(layer, DWN, fb, t), (layer.signature_str(), fb)
        c = layer.in_shape[1]
        # NHWC, a vector that divides the channels (aligned, no lane-by-lane tail): the widest
        # where that gives every compute unit a work-group (two on PoCL), else a narrower one
        assert fb["LAYOUT"] == "NHWC" and c % fb["VW"] == 0
        if target == "pocl-cpu":
            assert fb["VW"] == max(v for v in (4, 2, 1) if c % v == 0)
        if t.kind == "gpu":
            assert fb["TV"] * fb["TX"] * fb["TY"] == 64
    space = variant_space(mobilenet_layer(144, 56, 2), DWN, t)
    assert space.points and not space.errors, space.errors


def test_every_sweep_point_is_in_the_pruned_space_and_every_knob_value_runs():
    seen = {k.name: set() for k in DWN.knobs(layer_of("c16_9x9_k3_s1_p1_relu6"), POCL)}
    for lid, pts in POINTS.items():
        for c in pts:
            assert point_ok(layer_of(lid), DWN, c, POCL), (lid, c)
            for k, v in c.items:
                seen[k].add(v)
    knobs = DWN.knobs(layer_of("c16_9x9_k3_s1_p1_relu6"), POCL)
    assert {k.name: set(k.values) for k in knobs} == seen


def test_space_prunes_with_reasons():
    # CHWN at batch 1: one image, so only scalar lanes; NHWC with 2 channels: at most float2
    one = conv((1, 2, 9, 9), out=2, kernel=3, pad=1, groups=2)
    space = variant_space(one, DWN, POCL)
    assert space.first["vw_not_oversized"] > 0
    assert {c["VW"] for c in space.points if c["LAYOUT"] == "CHWN"} == {1}
    assert {c["VW"] for c in space.points if c["LAYOUT"] == "NHWC"} == {1, 2}
    # a 7x7 output: no tile wider or taller than 8 outputs
    small = conv((1, 32, 7, 7), out=32, kernel=3, pad=1, groups=32)
    space = variant_space(small, DWN, POCL)
    assert max(c["TX"] * c["QT"] for c in space.points) == 8
    assert max(c["TY"] for c in space.points) == 8
    assert space.first["tile_not_oversized"] > 0
    # 3 columns: at most 4 outputs per work-item
    narrow = conv((1, 8, 3, 3), out=8, kernel=3, pad=1, groups=8)
    space = variant_space(narrow, DWN, POCL)
    assert space.first["qt_not_oversized"] > 0 and max(c["QT"] for c in space.points) == 4
    # GPUs: whole SIMD groups, and enough work-groups for a large layer
    gpu = variant_space(mobilenet_layer(144, 56, 1, 16), DWN, H100)
    assert gpu.first["whole_simd_groups"] > 0 and gpu.first["enough_work_groups"] > 0
    assert all((c["TV"] * c["TX"] * c["TY"]) % 32 == 0 for c in gpu.points)
    reasons = {c.name: c.reason for c in DWN.constraints}
    assert "padding lanes" in reasons["vw_not_oversized"]
    assert "SIMD group" in reasons["tile_not_oversized"]


def test_register_estimate_counts_vector_lanes():
    layer = mobilenet_layer(144, 56, 1)
    # float4 lanes of: 4 accumulators, 6 input pixels (span of 4 windows of 3), 1 weight
    assert DWN.registers(layer, cfg("NHWC", 4, 4, 4, 4, 4)) == 4 * (4 + 6 + 1) + 20
    assert DWN.registers(layer, cfg("NHWC", 1, 1, 4, 4, 4)) == 1 + 3 + 1 + 20


# -- device-free: the kernel text --------------------------------------------------------------

def test_guards_only_where_the_sizes_need_them():
    inside = conv((1, 8, 9, 9), out=8, kernel=3, groups=8)                 # no padding
    src = DWN.render(inside, cfg("NHWC", 4, 1, 2, 8, 4), "k")
    assert "< (uint)W" not in src and "< (uint)H" not in src
    assert "full" not in src and "if (q0 +" not in src            # whole vectors, whole blocks
    padded = conv((1, 8, 9, 9), out=8, kernel=3, pad=1, groups=8)
    src = DWN.render(padded, cfg("NHWC", 4, 1, 2, 8, 4), "k")
    assert "(uint)(ih0) < (uint)H" in src and "(uint)(iw0 + 0) < (uint)W" in src
    assert "vload4(0, xr + 8)" in src and "vstore4(acc0, 0, yq)" in src
    # 9 columns in blocks of 2: the last block's second output is guarded
    src = DWN.render(padded, cfg("NHWC", 4, 2, 2, 4, 4), "k")
    assert "if (q0 + 1 < Q)" in src and "if (q0 + 0 < Q)" in src
    # 6 channels in float4: the last block's 2 lanes one by one
    odd = conv((1, 6, 9, 9), out=6, kernel=3, pad=1, groups=6)
    src = DWN.render(odd, cfg("NHWC", 4, 1, 2, 8, 4), "k")
    assert "const int full = vb < VB - 1;" in src
    assert "(float4)(xr[6], xr[7], 0.0f, 0.0f)" in src
    assert "else { yq[0] = acc0.s0; yq[1] = acc0.s1; }" in src


def test_weights_are_one_vector_per_tap_in_nhwc_one_scalar_in_chwn():
    layer = conv((2, 6, 9, 9), out=6, kernel=3, pad=1, groups=6, act="relu6")
    nhwc = DWN.render(layer, cfg("NHWC", 4, 1, 2, 8, 4), "k")
    # taps of 8 packed channels (6 rounded up to float4s): vector t at t * 8 / 4
    assert "vload4(2, wv)" in nhwc and "const float4 b = vload4(18, wv);" in nhwc
    assert "fmin(fmax(acc0, 0.0f), 6.0f)" in nhwc                 # relu6 on the whole vector
    chwn = DWN.render(layer, cfg("CHWN", 2, 1, 1, 8, 4), "k")
    assert "(float2)(wv[6])" in chwn and "wp + o;" in chwn
    # an act without a vector form is applied lane by lane
    silu = conv((1, 8, 9, 9), out=8, kernel=3, pad=1, groups=8, act="silu")
    src = DWN.render(silu, cfg("NHWC", 2, 1, 2, 8, 4), "k")
    assert "acc0 = (float2)(act_silu(acc0.s0), act_silu(acc0.s1));" in src


def test_filter_rows_stay_a_loop_when_the_block_is_large():
    layer = layer_of("b2_c3_15x15_k13_p6")
    assert "for (int r = 0; r < R; ++r)" in DWN.render(layer, cfg("CHWN", 1, 8, 2, 2, 8), "k")
    assert "for (int r = 0; r < R; ++r)" not in DWN.render(layer, cfg("NHWC", 1, 4, 4, 4, 4),
                                                           "k")


def test_launches_pack_the_weights_once_and_run_one_kernel():
    layer = layer_of("c5_11x9_k5_p2_silu_nobias")
    c = cfg("NHWC", 4, 4, 1, 2, 8)
    pack, run = DWN.launches(layer, c, "net_l1")
    assert (pack.kernel, pack.phase, pack.lsize) == ("net_l1_pack", "setup", (64,))
    assert [(a.kind, a.name) for a in pack.args] == [("param", "weight"), ("buffer", "wpack")]
    assert [(a.kind, a.name or a.index) for a in run.args] == [("in", 0), ("buffer", "wpack"),
                                                               ("out", 0)]
    # 25 taps of 5 channels rounded up to 8, no bias
    assert DWN.buffers(layer, c) == {"wpack": 25 * 8}
    assert pack.gsize[0] >= 25 * 8 and pack.gsize[0] % 64 == 0
    # (vector blocks 2 -> 2, column blocks 3 -> 4, image x rows 11 -> 16)
    assert run.lsize == (1, 2, 8) and run.gsize == (2, 4, 16)
    biased = layer_of("c16_9x9_k3_s1_p1_relu6")
    pack, _ = DWN.launches(biased, cfg("CHWN", 1, 2, 4, 4, 4), "k")
    assert [a.name for a in pack.args] == ["weight", "bias", "wpack"]
    assert DWN.buffers(biased, cfg("CHWN", 1, 2, 4, 4, 4)) == {"wpack": (9 + 1) * 16}


def test_half_storage_reads_and_writes_half():
    layer = conv((1, 6, 9, 9), storage="fp16", out=6, kernel=3, pad=1, groups=6)
    src = DWN.render(layer, cfg("NHWC", 4, 1, 2, 8, 4), "k")
    assert "vload_half4(0, xr + 6)" in src and "vstore_half4_rte(" in src
    assert "vload_half(6, xr)" in src and "__global const float* restrict wp" in src
    assert "vload_half" not in DWN.render(conv((1, 6, 9, 9), out=6, kernel=3, pad=1, groups=6),
                                          cfg("NHWC", 4, 1, 2, 8, 4), "k")


# -- PoCL --------------------------------------------------------------------------------------

def cases():
    for lid in SWEEP:
        yield pytest.param(lid, None, id=f"{lid}-fallback")
        for i, c in enumerate(POINTS[lid]):
            yield pytest.param(lid, c, id=f"{lid}-{c['LAYOUT']}{i}")


@pytest.mark.parametrize("lid,point", list(cases()))
def test_against_reference(cl_ctx, lid, point):
    """Through the protocol the tuner uses: the input given in the variant's layout, the output
    read back from it."""
    layer = layer_of(lid)
    c = point or DWN.fallback(layer, POCL)
    xs, prm = data_of(lid)
    check = harness.verify_point(*cl_ctx, layer, DWN, c, xs, prm)
    assert check["ok"], f"conv_dw_nhwc [{c}] on {lid}: {check}"


@pytest.mark.parametrize("layout", ["NHWC", "CHWN"])
def test_it_reads_and_writes_the_layout_it_declares(cl_ctx, layout):
    """The buffers as the network holds them: the input stored in `layout` goes in as it is,
    the output comes back in `layout`, and is the reference's once reordered."""
    lid = "b3_c7_9x9_k3_d2_leaky"
    layer = layer_of(lid)
    xs, prm = data_of(lid)
    c = cfg(layout, 2, 2, 2, 4, 2)
    stored = reference.to_layout(xs[0], layout).reshape(layer.in_shape)
    out = harness.run_layer(layer, DWN, c, [stored], prm, ctx=cl_ctx)
    want = reference.forward(layer, xs, prm)
    assert harness.close(reference.from_layout(out.ravel(), layout, layer.out_shape), want)[0]
    # read as NCHW, the same floats are another tensor
    assert not harness.close(out, want)[0]


@pytest.mark.parametrize("point", [cfg("NHWC", 4, 2, 2, 4, 2), cfg("CHWN", 2, 1, 1, 8, 4)])
def test_half_storage_meets_the_half_tolerance(point):
    layer = conv((2, 6, 9, 9), storage="fp16", out=6, kernel=3, pad=1, groups=6, act="relu6")
    t16 = with_precision(POCL, "fp16")
    assert point_ok(layer, DWN, point, t16)
    try:
        ctx, queue, _ = harness.context_for(POCL)
    except Exception as e:
        pytest.skip(f"PoCL not available: {e}")
    xs, prm = harness.random_inputs(layer, np.random.default_rng(7))
    k = protocol.Kernel(ctx, queue, layer, DWN, point, xs, prm)
    check, _ = protocol.verify(k, protocol.Reference(layer, xs, prm))
    assert check["ok"], check
    out = k.output()
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32))   # stored in half


# -- through the tuner and the build -----------------------------------------------------------

# an inverted-residual pair: 1x1 expand, depthwise 3x3 stride 1, 1x1 project with the block's
# input added, depthwise 3x3 stride 2 (pad same: asymmetric), 1x1 project
BLOCKS = """\
name: irblocks
input: [2, 24, 10, 10]
layers:
  - {name: expand1, op: conv, out: 48, kernel: 1, act: relu6}
  - {name: dw1, op: conv, out: 48, kernel: 3, pad: 1, groups: 48, act: relu6}
  - {name: project1, op: conv, out: 24, kernel: 1}
  - {name: add1, op: add, inputs: [project1, input]}
  - {name: dw2, op: conv, out: 24, kernel: 3, stride: 2, pad: same, groups: 24, act: relu6}
  - {name: project2, op: conv, out: 40, kernel: 1}
"""
DW_WHERE = "conv_dw_nhwc:LAYOUT=NHWC,QT=2"
# one conv_igemm point in NHWC for the 1x1 layers; MBLK=32 is past a depthwise layer's one
# output channel per group (m_tile_not_oversized), so that the depthwise layers are searched
# over conv_dw_nhwc alone
IGEMM_WHERE = ("conv_igemm:MDIM=2,NDIM=2,MBLK=32,NBLK=16,KBLK=8,VW=4,UNROLL=0,LPAD=0,DBUF=0,"
               "LAYOUT=NHWC,KSPLIT=1,TAPSTEP=0")


@pytest.fixture
def blocks(tmp_path, monkeypatch, cl_ctx):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))   # these records only
    src, db = tmp_path / "irblocks.yaml", tmp_path / "db.jsonl"
    src.write_text(BLOCKS)
    db.write_text("")
    return src, db


def _tune(src, db, *args):
    from aotconv.cli import main
    assert main(["tune", str(src), "--target", "pocl-cpu", "--tuning-db", str(db), "-q",
                 "-j", "1", *args]) == 0


def _chosen(outdir):
    doc = json.loads((outdir / "tuning.json").read_text())
    return {l["layer"]: l for l in doc["layers"]}


# slow tier (tests/conftest.py): a tune and a build, 5 to 8 s; make test keeps conv_dw_nhwc's
# space and kernels (above), a tune restricted by --where and the build's plan of its NHWC
# choices (tests/test_nhwc_chain.py)
@pytest.mark.slow
def test_the_tuner_chooses_it_and_the_build_plans_its_layout(blocks, tmp_path):
    """`aotconv tune --where conv_dw_nhwc:...` on the depthwise layers, then a build from the
    records: they run conv_dw_nhwc in NHWC, the untuned 1x1 layers their NCHW fallbacks, with
    conversions between (the library compiled, its kernels not: the slow test below runs it)."""
    from aotconv.compiler import compile_network
    src, db = blocks
    _tune(src, db, "--layer", "dw1", "--layer", "dw2", "--where", DW_WHERE, "--budget", "4")
    recs = [json.loads(l) for l in db.read_text().splitlines() if l.strip()]
    assert recs and {r["variant"] for r in recs} == {"conv_dw_nhwc"}
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="records", tuning_db=[str(db)], measure=False, quiet=True,
                          binaries=False)
    got = _chosen(res.outdir)
    for name in ("dw1", "dw2"):
        assert got[name]["variant"] == "conv_dw_nhwc" and got[name]["layouts"] == ["NHWC"] * 2
        assert got[name]["config"]["QT"] == 2
    assert got["expand1"]["layouts"] == ["NCHW", "NCHW"]
    net = res.schedule.net
    assert net.layer("dw1").inputs == ["expand1_to_nhwc"]
    assert net.layer("dw2").inputs[0].endswith("_to_nhwc")
    assert net.layer("project2").inputs == ["dw2_to_nchw"]


@pytest.mark.slow
def test_an_nhwc_chain_built_from_the_tuner_matches_numpy(blocks, tmp_path):
    """The whole network tuned with the 1x1 layers on conv_igemm in NHWC and the depthwise ones
    on conv_dw_nhwc, built from those records and run through the library: one conversion in,
    none between the layers of the chain but around a residual add left unfused, one out."""
    from aotconv.compiler import compile_network
    from aotconv import params as params_mod
    from aotconv.runtime import load
    from aotconv.spec import load_network
    src, db = blocks
    _tune(src, db, "--where", DW_WHERE, "--where", IGEMM_WHERE, "--budget", "8")
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="records", tuning_db=[str(db)], quiet=True, check=True,
                          fuse_dwpw="never")       # dw1 and project1 stay layers of the chain
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE
    got = _chosen(res.outdir)
    assert got["dw1"]["variant"] == got["dw2"]["variant"] == "conv_dw_nhwc"
    for name in ("expand1", "dw1", "project1", "dw2", "project2"):
        assert got[name]["layouts"] == ["NHWC", "NHWC"], got[name]
    net = res.schedule.net
    assert net.layer("dw1").inputs == ["expand1"] and net.layer("project1").inputs[0] == "dw1"
    assert net.layer("project2").inputs == ["dw2"]
    # and once more, outside the build: the library against the float64 reference
    net0 = load_network(str(src))
    flat = params_mod.read_bin(res.outdir / "irblocks.params.bin", net0)
    x = np.random.default_rng(3).standard_normal(net0.input_shape).astype(np.float32)
    with load(res.outdir) as lib:
        out = lib(x)
    ok, err = harness.close(out, reference.run_network(net0, x, params_mod.split(net0, flat))[0])
    assert ok, err

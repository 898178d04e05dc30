"""conv_depthwise: its domain, space, fallback and kernels; grouped convs that are not depthwise.

Device-free: which layers it takes (groups == input channels, any channel multiplier) and that
it is their fallback, its fallback valid on every target for the sweep and for MobileNet-v2's
depthwise layers, pruning with named reasons, guards emitted only where the sizes need them,
the local-memory estimate. Device (PoCL): a sweep over odd sizes (1, 7, 13), strides 1 and 2,
pads (asymmetric too), dilation, kernels 3 and 5 (and one large enough to keep its filter-row
loop), multipliers 1 and 2, batch 1 and 3 and every act, each with its fallback and points of
its pruned space (with and without the halo in local memory) against reference.forward; and
grouped convolutions that are not depthwise through the variants that take them.
"""
import functools
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, reference
from aotconv.graph import Layer
from aotconv.space import point_ok, variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]
DW = BY_NAME["conv_depthwise"]


def conv(in_shape, **raw):
    a = ops.normalise("conv", raw)
    out, params = ops.infer("conv", a, [tuple(in_shape)])
    return Layer("conv", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params)


# id -> (input shape, attributes): every act once, multiplier M = out / in channels
SWEEP = {
    "c1_1x1_k3_p1": ((1, 1, 1, 1), dict(out=1, kernel=3, pad=1, groups=1)),
    "c7_7x7_k3_p1_relu": ((1, 7, 7, 7), dict(out=7, kernel=3, pad=1, groups=7, act="relu")),
    "b3_c13_13x13_k3_s2_relu6": ((3, 13, 13, 13), dict(out=13, kernel=3, pad=1, stride=2,
                                                       groups=13, act="relu6")),
    "c8_13x7_k5_p2_sigmoid": ((1, 8, 13, 7), dict(out=8, kernel=5, pad=2, groups=8,
                                                  act="sigmoid")),
    "b2_m2_7x13_k5_s2_asym_tanh": ((2, 5, 7, 13), dict(out=10, kernel=5, stride=2, pad=[2, 1],
                                                       groups=5, act="tanh")),
    "m2_13x13_k3_s2_nopad_leaky_nobias": ((1, 4, 13, 13), dict(out=8, kernel=3, stride=2,
                                                               groups=4, bias=False,
                                                               act="leaky_relu", alpha=0.1)),
    "c6_9x11_k3_d2_clip": ((1, 6, 9, 11), dict(out=6, kernel=3, dilation=2, pad=2, groups=6,
                                               act="clip", min=-1, max=1)),
    "b3_7x7_k3x5_same_hardsigmoid": ((3, 3, 7, 7), dict(out=3, kernel=[3, 5], pad="same",
                                                        groups=3, act="hardsigmoid")),
    "c16_14x14_same_s2_hardswish": ((1, 16, 14, 14), dict(out=16, kernel=3, stride=2,
                                                          pad="same", groups=16,
                                                          act="hardswish")),
    "c32_7x7_k3_p1_silu_nobias": ((1, 32, 7, 7), dict(out=32, kernel=3, pad=1, groups=32,
                                                      bias=False, act="silu")),
    "c3_13x1_k5x1_gelu": ((1, 3, 13, 1), dict(out=3, kernel=[5, 1], pad=[2, 0], groups=3,
                                              act="gelu")),
    "b2_m2_1x13_k1x3_s1x2_gelu_tanh": ((2, 9, 1, 13), dict(out=18, kernel=[1, 3], stride=[1, 2],
                                                           pad=[0, 1], groups=9,
                                                           act="gelu_tanh")),
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
    return xs, prm, reference.forward(layer, xs, prm)


# -- device-free -------------------------------------------------------------------------------

def test_domain_is_depthwise_with_any_multiplier():
    assert DW.supports(conv((1, 4, 5, 5), out=4, kernel=3, groups=4)) is None
    assert DW.supports(conv((1, 4, 5, 5), out=12, kernel=3, groups=4)) is None     # M = 3
    assert DW.supports(conv((1, 1, 5, 5), out=2, kernel=3)) is None                # C = 1
    for shape, attrs in (((1, 4, 5, 5), dict(out=4, kernel=3, groups=2)),
                         ((1, 4, 5, 5), dict(out=4, kernel=3))):
        why = DW.supports(conv(shape, **attrs))
        assert why and "groups == input channels" in why
    dense = Layer("d", "dense", ops.normalise("dense", dict(out=3)), ["input"],
                  in_shapes=[(1, 4, 1, 1)], out_shape=(1, 3, 1, 1))
    assert "not dense" in DW.supports(dense)


def test_it_is_the_fallback_of_depthwise_layers_only():
    for lid in SWEEP:
        assert for_layer(layer_of(lid))[0] is DW, lid
    grouped = conv((1, 8, 9, 9), out=8, kernel=3, groups=4)
    assert DW not in for_layer(grouped) and for_layer(grouped)[0].name == "conv_direct"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fallback_valid_on_every_target(target):
    t = TARGETS[target]
    layers = [layer_of(lid) for lid in SWEEP]
    layers += [mobilenet_layer(c, s, st, b) for c, s, st in MOBILENET for b in (1, 16)]
    for layer in layers:
        fb = DW.fallback(layer, t)
        assert point_ok(layer, DW, fb, t), (layer.signature_str(), fb)
    # no constraint fails to judge a point (an exception would prune it silently)
    space = variant_space(mobilenet_layer(144, 56, 2), DW, t)
    assert space.points and not space.errors, space.errors


def test_space_prunes_with_reasons():
    # a 1x1 window reads every staged value once: local memory never pays
    one = conv((1, 8, 7, 7), out=8, kernel=1, groups=8)
    space = variant_space(one, DW, POCL)
    assert space.first["lmem_needs_reuse"] > 0
    assert all(c["LMEM"] == 0 for c in space.points)
    # a 7x7 output: no tile wider than 8 outputs
    small = layer_of("c32_7x7_k3_p1_silu_nobias")
    space = variant_space(small, DW, POCL)
    assert max(c["TX"] * c["QT"] for c in space.points) == 8
    assert space.first["tile_not_oversized"] > 0 and space.first["vw_divides_qt"] > 0
    # GPUs: whole SIMD groups only
    gpu = variant_space(mobilenet_layer(144, 56, 1), DW, TARGETS["h100"])
    assert gpu.first["whole_simd_groups"] > 0
    assert all((c["TX"] * c["TY"] * c["CB"]) % 32 == 0 for c in gpu.points)
    assert any(c["LMEM"] for c in gpu.points) and any(not c["LMEM"] for c in gpu.points)


def test_local_memory_is_the_staged_halo():
    layer = mobilenet_layer(144, 56, 2)
    cfg = Config.of(QT=2, TX=8, TY=4, CB=2, VW=1, LMEM=1)
    # rows (4 - 1) * 2 + 3 = 9, columns (8 * 2 - 1) * 2 + 3 = 33, two channels, 4 B each
    assert DW.local_mem_bytes(layer, cfg) == 4 * 2 * 9 * 33
    assert DW.local_mem_bytes(layer, Config.of(QT=2, TX=8, TY=4, CB=2, VW=1, LMEM=0)) == 0
    # Mali's 32 KiB: the biggest halos are pruned by the device limit
    space = variant_space(layer, DW, TARGETS["mali-t628"])
    assert space.first["device.local_mem"] > 0
    assert all(DW.local_mem_bytes(layer, c) <= 32 * 1024 for c in space.points)


def test_guards_only_where_the_sizes_need_them():
    cfg = Config.of(QT=1, TX=8, TY=8, CB=1, VW=1, LMEM=0)
    inside = conv((1, 4, 9, 9), out=4, kernel=3, groups=4)               # no padding
    src = DW.render(inside, cfg, "k")
    assert "< (uint)W" not in src and "< (uint)H" not in src
    padded = conv((1, 4, 9, 9), out=4, kernel=3, pad=1, groups=4)
    src = DW.render(padded, cfg, "k")
    assert "(uint)(ih0) < (uint)H" in src and "(uint)(iw0 + 0) < (uint)W" in src
    # the halo in local memory: the staging load is guarded, the windows never are
    src = DW.render(padded, Config.of(QT=1, TX=8, TY=8, CB=1, VW=1, LMEM=1), "k")
    assert src.count("< (uint)W") == 1 and "barrier(CLK_LOCAL_MEM_FENCE)" in src


def test_every_sampled_point_renders_with_constants():
    rng = np.random.default_rng(5)
    for lid in SWEEP:
        layer = layer_of(lid)
        pts = variant_space(layer, DW, POCL).points
        for i in rng.choice(len(pts), min(8, len(pts)), replace=False):
            cfg = pts[i]
            src = DW.render(layer, cfg, "net_l3")
            assert f"#define QT {cfg['QT']}" in src and "${" not in src
            (launch,) = DW.launches(layer, cfg, "net_l3")
            assert launch.lsize == (cfg["TX"], cfg["TY"], cfg["CB"])
            assert all(g % s == 0 for g, s in zip(launch.gsize, launch.lsize))
            assert {a.kind for a in launch.args} <= {"in", "out", "param"}


# -- device: PoCL ------------------------------------------------------------------------------

def picks(lid):
    """[(tag, cfg)]: the fallback, a seeded random point with the halo in local memory and one
    without, from the pruned space."""
    layer = layer_of(lid)
    pts = variant_space(layer, DW, POCL).points
    rng = np.random.default_rng(zlib.crc32(lid.encode()))
    out = [("fallback", DW.fallback(layer, POCL))]
    for tag, lmem in (("lmem", 1), ("direct", 0)):
        cands = [c for c in pts if c["LMEM"] == lmem and c not in [x for _, x in out]]
        if cands:
            out.append((tag, cands[rng.integers(len(cands))]))
    return out


# make test runs every shape's fallback (what an untuned build runs) and the other points of
# one shape; the slow tier the other points of the rest
QUICK = "c7_7x7_k3_p1_relu"


def cases():
    for lid in SWEEP:
        for tag, cfg in picks(lid):
            quick = tag == "fallback" or lid == QUICK
            yield pytest.param(lid, cfg, id=f"{lid}-{tag}", marks=() if quick else pytest.mark.slow)


@pytest.mark.parametrize("lid,cfg", list(cases()))
def test_against_reference(cl_ctx, lid, cfg):
    layer = layer_of(lid)
    xs, prm, ref = data_of(lid)
    out = harness.run_layer(layer, DW, cfg, xs, prm, ctx=cl_ctx)
    ok, err = harness.close(out, ref)
    assert ok, f"conv_depthwise [{cfg}] on {lid}: max error {err:.3g}"


@pytest.mark.parametrize("lmem", [0, 1])
def test_filter_rows_stay_a_loop_when_the_block_is_large(cl_ctx, lmem):
    layer = conv((1, 2, 15, 15), out=4, kernel=13, pad=6, groups=2, act="relu")
    cfg = Config.of(QT=8, TX=2, TY=8, CB=1, VW=2, LMEM=lmem)
    src = DW.render(layer, cfg, "k")
    assert "for (int r = 0; r < R; ++r)" in src
    rng = np.random.default_rng(13)
    xs, prm = harness.random_inputs(layer, rng)
    out = harness.run_layer(layer, DW, cfg, xs, prm, ctx=cl_ctx)
    ok, err = harness.close(out, reference.forward(layer, xs, prm))
    assert ok, err


# grouped, not depthwise: groups < channels, each group several channels in and out
GROUPED = [((1, 6, 9, 9), dict(out=9, kernel=3, pad=1, groups=3, act="relu6")),
           ((2, 8, 7, 7), dict(out=4, kernel=[3, 1], stride=2, groups=2, bias=False)),
           ((1, 4, 13, 13), dict(out=8, kernel=1, groups=2, act="silu"))]


# make test: the second (a 3x1 kernel, stride 2, no bias); the slow tier the others
@pytest.mark.parametrize("i", [i if i == 1 else pytest.param(i, marks=pytest.mark.slow)
                               for i in range(len(GROUPED))])
def test_grouped_convs_that_are_not_depthwise(cl_ctx, i):
    shape, attrs = GROUPED[i]
    layer = conv(shape, **attrs)
    vs = for_layer(layer)
    assert DW not in vs
    rng = np.random.default_rng(i)
    xs, prm = harness.random_inputs(layer, rng)
    ref = reference.forward(layer, xs, prm)
    for v in vs:
        cfg = v.fallback(layer, POCL)
        lin, lout = v.layouts_of(layer, cfg)
        x = reference.to_layout(xs[0], lin).reshape(layer.in_shape)
        out = harness.run_layer(layer, v, cfg, [x], prm, ctx=cl_ctx)
        out = reference.from_layout(out.ravel(), lout, layer.out_shape)
        ok, err = harness.close(out, ref)
        assert ok, f"{v.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"

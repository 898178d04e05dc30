"""pool_nhwc and global_avgpool_nhwc: pooling that reads (and writes) NHWC or CHWN.

Device-free: they declare the layout of their LAYOUT knob, are tuned alternatives and never a
layer's fallback; their fallbacks are valid on every target; pruning with a named reason;
clipping, bounds checks and lane-by-lane tails emitted only where the sizes need them; half
storage. PoCL: max and average pooling (2x2 s2, 3x3 s2 p1, 3x3 s1 p1, padding that differs
per axis, ceil_mode, count_include_pad, channels not whole vectors, batch 2) in both layouts
and every vector width, against the float64 reference in the layout the variant declares;
the buffers as the network holds them; half storage; global average pooling likewise.
"""
import functools
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
POOL = BY_NAME["pool_nhwc"]
GAP = BY_NAME["global_avgpool_nhwc"]


def layer(op, in_shape, storage=None, **raw):
    a = ops.normalise(op, raw)
    if storage:
        a["storage"] = storage
    out, params = ops.infer(op, a, [tuple(in_shape)])
    return Layer("p", op, a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params)


def cfg(layout, vw, wg=64):
    return Config.of(LAYOUT=layout, VW=vw, WG=wg)


# id -> (op, input shape, attributes)
SWEEP = {
    "max_2x2s2": ("maxpool", (1, 8, 8, 8), dict(kernel=2)),
    "avg_2x2s2_b2": ("avgpool", (2, 8, 6, 10), dict(kernel=2)),
    "max_3x3s2p1_c6_b2": ("maxpool", (2, 6, 9, 9), dict(kernel=3, stride=2, pad=1)),
    "avg_3x3s2p1_c6": ("avgpool", (1, 6, 9, 9), dict(kernel=3, stride=2, pad=1)),
    "avg_3x3s1p1_incl": ("avgpool", (2, 5, 7, 6), dict(kernel=3, stride=1, pad=1,
                                                      count_include_pad=True)),
    "max_3x3s1p1": ("maxpool", (1, 12, 7, 6), dict(kernel=3, stride=1, pad=1)),
    # padding 1 on the rows, none on the columns, and a 3x2 window
    "max_3x2_pad10_b2": ("maxpool", (2, 7, 8, 7), dict(kernel=[3, 2], stride=[2, 1],
                                                       pad=[1, 0])),
    "avg_3x2_pad10": ("avgpool", (1, 4, 8, 7), dict(kernel=[3, 2], stride=[2, 1], pad=[1, 0])),
    # ceil_mode: the last window overhangs the input (and the padding) at the bottom and right
    "max_3x3s2_ceil_c3": ("maxpool", (3, 3, 10, 12), dict(kernel=3, stride=2, ceil_mode=True)),
    "avg_3x3s2p1_ceil_incl": ("avgpool", (2, 6, 10, 10), dict(kernel=3, stride=2, pad=1,
                                                             ceil_mode=True,
                                                             count_include_pad=True)),
    "avg_3x3s2p1_ceil_excl": ("avgpool", (1, 9, 10, 11), dict(kernel=3, stride=2, pad=1,
                                                             ceil_mode=True)),
}

# points run besides the fallback: both layouts, every vector width, vectors with a tail
POINTS = {
    "max_2x2s2": [cfg("CHWN", 1), cfg("NHWC", 4, 32)],
    "avg_2x2s2_b2": [cfg("CHWN", 2), cfg("NHWC", 1, 128)],
    "max_3x3s2p1_c6_b2": [cfg("NHWC", 4), cfg("CHWN", 2)],
    "avg_3x3s2p1_c6": [cfg("NHWC", 4)],
    "avg_3x3s1p1_incl": [cfg("NHWC", 4), cfg("CHWN", 2)],
    "max_3x3s1p1": [cfg("NHWC", 2, 32)],
    "max_3x2_pad10_b2": [cfg("NHWC", 4), cfg("CHWN", 2)],
    "avg_3x2_pad10": [cfg("NHWC", 2)],
    "max_3x3s2_ceil_c3": [cfg("NHWC", 4), cfg("CHWN", 4)],
    "avg_3x3s2p1_ceil_incl": [cfg("NHWC", 4), cfg("CHWN", 2)],
    "avg_3x3s2p1_ceil_excl": [cfg("NHWC", 4), cfg("NHWC", 2)],
}


@functools.lru_cache(maxsize=None)
def layer_of(lid):
    op, shape, attrs = SWEEP[lid]
    return layer(op, shape, **attrs)


@functools.lru_cache(maxsize=None)
def data_of(lid):
    return harness.random_inputs(layer_of(lid), np.random.default_rng(zlib.crc32(lid.encode())))


# -- device-free: the domain and the layouts ----------------------------------------------------

def test_they_declare_the_layout_of_their_knob():
    p = layer_of("max_3x3s2p1_c6_b2")
    (knob,) = [k for k in POOL.knobs(p, POCL) if k.name == "LAYOUT"]
    assert knob.values == ("NHWC", "CHWN")
    assert POOL.layouts_of(p, cfg("CHWN", 2)) == ("CHWN", "CHWN")
    assert {POOL.layouts_of(p, c) for c in variant_space(p, POOL, POCL).points} == \
        {("NHWC", "NHWC"), ("CHWN", "CHWN")}
    g = layer("global_avgpool", (2, 8, 5, 5))
    # the output N x C x 1 x 1 is written NCHW: in NHWC the same storage
    assert GAP.layouts_of(g, cfg("NHWC", 4)) == ("NHWC", "NCHW")
    assert GAP.layouts_of(g, cfg("CHWN", 2)) == ("CHWN", "NCHW")
    assert layout_capable(p) and layout_capable(g)


def test_they_are_tuned_alternatives_never_the_fallback():
    for lid in SWEEP:
        vs = for_layer(layer_of(lid))
        assert vs[0].name == "pool_direct" and POOL in vs, lid
        assert fallback_choice(layer_of(lid), POCL).variant == "pool_direct"
    g = layer("global_avgpool", (1, 2048, 7, 7))
    assert [v.name for v in for_layer(g)] == ["global_avgpool_direct", "global_avgpool_nhwc"]
    assert fallback_choice(g, POCL).variant == "global_avgpool_direct"
    assert POOL.supports(g) == "pool_nhwc implements maxpool or avgpool, not global_avgpool"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fallbacks_valid_on_every_target(target):
    t = TARGETS[target]
    pools = [layer_of(lid) for lid in SWEEP]
    # VGG-16's and ResNet-50's pools at batch 1 and 16
    for b in (1, 16):
        pools += [layer("maxpool", (b, c, s, s), kernel=2) for c, s in ((64, 224), (512, 14))]
        pools.append(layer("maxpool", (b, 64, 112, 112), kernel=3, stride=2, pad=1))
    for p in pools:
        fb = POOL.fallback(p, t)
        assert point_ok(p, POOL, fb, t), (p.signature_str(), fb)
        # NHWC, the widest vector that divides the channels
        assert fb["LAYOUT"] == "NHWC" and fb["VW"] == max(v for v in (4, 2, 1)
                                                          if p.in_shape[1] % v == 0)
    # ResNet-50's and MobileNet-v2's heads at batch 1 and 16
    for shape in ((1, 2048, 7, 7), (16, 2048, 7, 7), (1, 1280, 7, 7), (16, 1280, 7, 7),
                  (2, 3, 5, 5)):
        g = layer("global_avgpool", shape)
        fb = GAP.fallback(g, t)
        assert point_ok(g, GAP, fb, t) and fb["LAYOUT"] == "NHWC"


def test_space_prunes_vectors_wider_than_the_axis():
    p = layer("maxpool", (1, 2, 8, 8), kernel=2)           # 2 channels, 1 image
    space = variant_space(p, POOL, POCL)
    assert space.first["vw_not_oversized"] > 0
    assert {c["VW"] for c in space.points if c["LAYOUT"] == "CHWN"} == {1}
    assert {c["VW"] for c in space.points if c["LAYOUT"] == "NHWC"} == {1, 2}
    reasons = {c.name: c.reason for c in POOL.constraints}
    assert "padding lanes" in reasons["vw_not_oversized"]
    assert "idle work-items" in reasons["wg_not_wasteful"]


def test_launch_is_one_work_item_per_vector_of_an_output_pixel():
    p = layer_of("max_3x3s2p1_c6_b2")                      # out 2x6x5x5
    (l,) = POOL.launches(p, cfg("NHWC", 4), "k")
    assert l.gsize == (128,) and l.lsize == (64,)           # 2 * 25 * 2 = 100 items
    (l,) = POOL.launches(p, cfg("CHWN", 2), "k")           # 6 * 25 * 1 = 150
    assert l.gsize == (192,)
    (l,) = GAP.launches(layer("global_avgpool", (2, 6, 5, 5)), cfg("NHWC", 4, 32), "k")
    assert l.gsize == (32,)                                  # 2 * 2 = 4 items


# -- device-free: the kernel text --------------------------------------------------------------

def test_clipping_and_bounds_checks_only_where_the_sizes_need_them():
    inside = layer_of("max_2x2s2")                          # no padding, no overhang
    src = POOL.render(inside, cfg("NHWC", 4, 32), "k")
    assert "const int ys = y0, ye = y0 + KH;" in src and "const int xs = x0, xe = x0 + KW;" in src
    assert "max(y0, 0)" not in src and "full" not in src
    assert "if (gid >= N_ITEMS)" not in src                 # 1 * 16 * 2 = 32 items, WG 32
    assert "vload4(0, xp)" in src and "vstore4(acc, 0, yp);" in src
    assert "if (gid >= N_ITEMS)" in POOL.render(inside, cfg("NHWC", 4, 64), "k")
    # padding on the rows only: the columns keep the window's constant extent
    rows = POOL.render(layer_of("max_3x2_pad10_b2"), cfg("NHWC", 4), "k")
    assert "const int ys = max(y0, 0), ye = min(y0 + KH, H);" in rows
    assert "const int xs = x0, xe = x0 + KW;" in rows
    # the ceil_mode overhang clips though there is no padding
    ceil = POOL.render(layer_of("max_3x3s2_ceil_c3"), cfg("NHWC", 4), "k")
    assert "min(y0 + KH, H)" in ceil and "min(x0 + KW, W)" in ceil
    # 3 channels in float4: the last (only) block lane by lane
    assert "(full ? vload4(0, xp) : (float4)(xp[0], xp[1], xp[2], 0.0f))" in ceil
    assert "else { yp[0] = acc.s0; yp[1] = acc.s1; yp[2] = acc.s2; }" in ceil


def test_average_divisor_follows_count_include_pad():
    excl = POOL.render(layer_of("avg_3x3s2p1_ceil_excl"), cfg("NHWC", 4), "k")
    assert "acc /= (float)((ye - ys) * (xe - xs));" in excl
    incl = POOL.render(layer_of("avg_3x3s2p1_ceil_incl"), cfg("NHWC", 4), "k")
    assert "acc /= (float)((min(y0 + KH, H + PH) - y0) * (min(x0 + KW, W + PW) - x0));" in incl
    plain = POOL.render(layer_of("avg_2x2s2_b2"), cfg("NHWC", 4), "k")
    assert "acc /= (float)(KH * KW);" in plain
    assert "(float4)(-INFINITY)" in POOL.render(layer_of("max_2x2s2"), cfg("NHWC", 4), "k")


def test_half_storage_reads_and_writes_half():
    p = layer("maxpool", (1, 6, 9, 9), storage="fp16", kernel=3, stride=2, pad=1)
    src = POOL.render(p, cfg("NHWC", 4), "k")
    assert "vload_half4(0, xp)" in src and "vload_half(1, xp)" in src
    assert "vstore_half4_rte(acc, 0, yp)" in src and "vstore_half_rte(acc.s1, 1, yp)" in src
    assert "vload_half" not in POOL.render(layer_of("max_3x3s2p1_c6_b2"), cfg("NHWC", 4), "k")
    g = layer("global_avgpool", (2, 6, 5, 5), storage="fp16")
    src = GAP.render(g, cfg("CHWN", 2), "k")
    assert "vload_half2(0, xp)" in src and "vstore_half_rte(acc.s1, 1 * C, yp)" in src


# -- PoCL --------------------------------------------------------------------------------------

def cases():
    for lid in SWEEP:
        yield pytest.param(lid, None, id=f"{lid}-fallback")
        for c in POINTS[lid]:
            yield pytest.param(lid, c, id=f"{lid}-{c['LAYOUT']}-vw{c['VW']}-wg{c['WG']}")


def test_the_sweep_points_are_in_the_space_and_run_every_knob_value():
    seen = {"LAYOUT": set(), "VW": set(), "WG": set()}
    for lid, pts in POINTS.items():
        for c in pts:
            assert point_ok(layer_of(lid), POOL, c, POCL), (lid, c)
            for k, v in c.items:
                seen[k].add(v)
    knobs = POOL.knobs(layer_of("max_2x2s2"), POCL)
    assert seen["LAYOUT"] == set(knobs[0].values) and seen["VW"] == set(knobs[1].values)


@pytest.mark.parametrize("lid,point", list(cases()))
def test_pool_against_reference(cl_ctx, lid, point):
    """Through the protocol the tuner uses: the input given in the variant's layout, the output
    read back from it."""
    p = layer_of(lid)
    c = point or POOL.fallback(p, POCL)
    xs, prm = data_of(lid)
    check = harness.verify_point(*cl_ctx, p, POOL, c, xs, prm)
    assert check["ok"], f"pool_nhwc [{c}] on {lid}: {check}"


@pytest.mark.parametrize("layout", ["NHWC", "CHWN"])
def test_it_reads_and_writes_the_layout_it_declares(cl_ctx, layout):
    """The buffers as the network holds them: the input stored in `layout` goes in as it is,
    the output comes back in `layout`, and is the reference's once reordered."""
    lid = "max_3x3s2p1_c6_b2"
    p = layer_of(lid)
    xs, prm = data_of(lid)
    stored = reference.to_layout(xs[0], layout).reshape(p.in_shape)
    out = harness.run_layer(p, POOL, cfg(layout, 2), [stored], prm, ctx=cl_ctx)
    want = reference.forward(p, xs, prm)
    assert harness.close(reference.from_layout(out.ravel(), layout, p.out_shape), want)[0]
    assert not harness.close(out, want)[0]          # read as NCHW, another tensor


GAP_CASES = [((2, 6, 5, 7), cfg("NHWC", 4)), ((2, 6, 5, 7), cfg("CHWN", 2)),
             ((3, 8, 4, 4), cfg("CHWN", 4)), ((1, 10, 3, 3), cfg("NHWC", 2, 32)),
             ((2, 3, 6, 6), cfg("NHWC", 1))]


@pytest.mark.parametrize("shape,point", GAP_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{c['LAYOUT']}-vw{c['VW']}"
                              for s, c in GAP_CASES])
def test_global_avgpool_against_reference(cl_ctx, shape, point):
    g = layer("global_avgpool", shape)
    assert point_ok(g, GAP, point, POCL)
    xs, prm = harness.random_inputs(g, np.random.default_rng(11))
    check = harness.verify_point(*cl_ctx, g, GAP, point, xs, prm)
    assert check["ok"], check
    # the output as the reader takes it: NCHW, whatever the input's layout
    stored = reference.to_layout(xs[0], point["LAYOUT"]).reshape(shape)
    out = harness.run_layer(g, GAP, point, [stored], prm, ctx=cl_ctx)
    assert harness.close(out, reference.forward(g, xs, prm))[0]


@pytest.mark.parametrize("variant,op,shape,attrs,point", [
    ("pool_nhwc", "maxpool", (2, 6, 9, 9), dict(kernel=3, stride=2, pad=1), cfg("NHWC", 4)),
    ("pool_nhwc", "avgpool", (3, 5, 8, 8), dict(kernel=2), cfg("CHWN", 2)),
    ("global_avgpool_nhwc", "global_avgpool", (2, 6, 5, 5), {}, cfg("NHWC", 4))])
def test_half_storage_meets_the_half_tolerance(variant, op, shape, attrs, point):
    v = BY_NAME[variant]
    p = layer(op, shape, storage="fp16", **attrs)
    assert point_ok(p, v, point, with_precision(POCL, "fp16"))
    try:
        ctx, queue, _ = harness.context_for(POCL)
    except Exception as e:
        pytest.skip(f"PoCL not available: {e}")
    xs, prm = harness.random_inputs(p, np.random.default_rng(7))
    k = protocol.Kernel(ctx, queue, p, v, point, xs, prm)
    check, _ = protocol.verify(k, protocol.Reference(p, xs, prm))
    assert check["ok"], check
    out = k.output()
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32))   # stored in half

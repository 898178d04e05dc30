"""conv_wgmma_halo_pool_f16_nhwc: the halo-tile wgmma convolution with its 2x2 max pool in the
staged epilogue (conv_pool layers of an fp16 build).

Device-free: its domain and reasons (2x2 stride-2 max pools of even outputs only), the strips
it offers, the constraints that keep a window's four outputs in one staged pass, that every
conv kernel of the shared template renders as before (tests/test_records_kernel.py checks the
shipped records' hashes), and that the fusion search measures the pair where the conv runs the
kernel this variant pools.

PoCL (the wgmma emulated): two layers against the float64 reference within the half tolerance,
and bit for bit against the unfused pair (conv_wgmma_halo_f16_nhwc at the same point, then
the max); a kernel that pools the wrong neighbour is caught. `aotconv tune --layer conv+pool`
tunes the fused layer.
"""
import functools
import json

import numpy as np
import pytest

from aotconv import fusion, harness, ops, reference
from aotconv.choose import Choice
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.space import variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_wgmma_halo_pool_f16_nhwc import conv_view, pool_strips
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)
from mma_nhwc_helpers import random_case

V = BY_NAME["conv_wgmma_halo_pool_f16_nhwc"]
CONV = BY_NAME["conv_wgmma_halo_f16_nhwc"]
H100_FP16 = with_precision(TARGETS["h100"], "fp16")


def conv_pool(in_shape, kind="max", pool=None, **raw):
    a = ops.normalise("conv", dict(raw, pad=raw.get("pad", 1)))
    a["storage"] = "fp16"
    pa = ops.normalise("maxpool" if kind == "max" else "avgpool", dict(pool or {"kernel": 2}))
    a["pool"] = ops.pool_attrs(kind, pa)
    o, params = ops.infer("conv_pool", a, [tuple(in_shape)])
    return Layer("c", "conv_pool", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=o,
                 params=params)


def _cfg(**kw):
    return Config(tuple(kw.items()))


def _point(**kw):
    p = dict(BM=64, BN=32, BK=16, WM=4, WN=1, TW=14, PAD=0, DBUF=1, HBUF=2, CPASYNC=0, LDSM=0,
             INSN=32, WAIT=0, EPI=1)
    p.update(kw)
    return _cfg(**p)


# -- where it is offered ------------------------------------------------------------------------

def test_offered_to_2x2_max_pools_of_even_outputs():
    layer = conv_pool((2, 16, 14, 14), out=32, kernel=3, act="relu")
    assert V.supports(layer) is None
    assert V.layouts_of(layer, V.fallback(layer, H100_FP16)) == ("NHWC", "NHWC")
    view = conv_view(layer)
    assert view.op == "conv" and view.out_shape == (2, 32, 14, 14) and view.attrs["pool"]
    assert "max pool only" in V.supports(conv_pool((2, 16, 14, 14), kind="avg", out=32, kernel=3))
    assert "not kernel (3, 3)" in V.supports(
        conv_pool((2, 16, 14, 14), out=32, kernel=3, pool=dict(kernel=3, stride=2)))
    assert "P and Q even" in V.supports(conv_pool((2, 16, 13, 14), out=32, kernel=3))
    assert "stride" in V.supports(conv_pool((2, 16, 28, 28), out=32, kernel=3, stride=2))
    conv = conv_view(layer)
    assert "implements conv_pool, not conv" in V.supports(conv)


def test_strips_pair_up_and_the_window_stays_in_one_staged_pass():
    assert pool_strips(14, 3) == (14, 6)
    assert pool_strips(224, 3) == (14, 30, 62, 6)
    layer = conv_pool((2, 16, 28, 28), out=32, kernel=3, act="relu")
    names = lambda c: [k.name for k in V.constraints if not k.check(layer, c, H100_FP16)]  # noqa
    assert names(_point()) == []
    assert "pool_one_staged_pass" in names(_point(EPI=0))
    assert "pool_one_staged_pass" in names(_point(BM=128, WM=4))        # two tiles per warp
    assert "pool_rows_pair_in_tile" not in names(_point(TW=30))          # 64 = 2 x 32 slots
    assert "pool_rows_pair_in_tile" in names(_point(TW=62))              # 64 < 2 x 64
    assert "pool_rows_pair_in_tile" not in names(_point(BM=128, WM=8, TW=62))
    points = variant_space(layer, V, H100_FP16, explain=False).points
    assert points and all(c["EPI"] == 1 and c["BM"] == 16 * c["WM"] for c in points)


def test_the_pair_is_measured_where_the_conv_runs_the_kernel_it_pools():
    """The fusion search measures conv_pool layers where the conv runs a direct kernel, where
    the pool is a real share of the pair, and now where the conv's own kernel pools in its
    epilogue: conv_wgmma_halo_f16_nhwc, however cheap the pool."""
    cheap = {"c": Choice("conv_wgmma_halo_f16_nhwc", Config(()), time_ms=1.0),
             "p": Choice("pool_nhwc", Config(()), time_ms=0.01)}
    fused = conv_pool((2, 16, 14, 14), out=32, kernel=3, act="relu")
    assert fusion.pool_epilogue_of("conv_wgmma_halo_f16_nhwc") == [V.name]
    assert fusion.worth_measuring(cheap, "c", "p", fused)
    other = dict(cheap, c=Choice("conv_mma_f16_nhwc", Config(()), time_ms=1.0))
    assert not fusion.worth_measuring(other, "c", "p", fused)
    # a pool the sibling does not take (3x3 stride 2) is not worth a search for a cheap pool
    s2 = conv_pool((2, 16, 14, 14), out=32, kernel=3, pool=dict(kernel=3, stride=2))
    assert not fusion.worth_measuring(cheap, "c", "p", s2)


# -- on PoCL: the emulated wgmma ----------------------------------------------------------------

# id -> (layer, points): Q = 28 is two strips of 14; act none leaves negative outputs (the max
# starts from the first window position, not zero); TW = 6 strips of 8 slots
CASES = {
    "c16_14x14_relu": (lambda: conv_pool((1, 16, 14, 14), out=32, kernel=3, act="relu"),
                       [_point(), _point(BM=128, WM=8, CPASYNC=4, WAIT=1)]),
    "c16_28x28_b2_none_nobias": (lambda: conv_pool((2, 16, 28, 28), out=32, kernel=3,
                                                   bias=False),
                                 [_point(), _point(TW=6)]),
}


@functools.lru_cache(maxsize=None)
def case(cid):
    return random_case(CASES[cid][0](), cid)


def _run(variant, layer, cfg, xs, prm, target, ctx):
    out = harness.run_layer(layer, variant, cfg, [reference.to_layout(x, "NHWC") for x in xs],
                            prm, target=target, ctx=ctx)
    return reference.from_layout(out.ravel(), "NHWC", layer.out_shape)


@pytest.mark.parametrize("cid", list(CASES))
def test_emulated_pooled_epilogue_against_the_reference_and_the_unfused_pair(emulated, cid):
    target, ctx = emulated
    layer, xs, prm = case(cid)
    valid = set(variant_space(layer, V, target, explain=False).points)
    conv = conv_view(layer)
    conv.attrs.pop("pool")
    n, k, p, q = conv.out_shape
    for cfg in CASES[cid][1] + [V.fallback(layer, target)]:
        assert cfg in valid, cfg
        out = check_half_output(layer, xs, prm, cfg, _run(V, layer, cfg, xs, prm, target, ctx))
        # the unfused pair at the same point: the conv's halves, then their max
        unfused = _run(CONV, conv, cfg, xs, prm, target, ctx)
        pooled = unfused.reshape(n, k, p // 2, 2, q // 2, 2).max(axis=(3, 5))
        assert np.array_equal(out, pooled), cfg


def test_pooling_the_wrong_neighbour_is_caught(emulated, monkeypatch):
    """The window's second row is TWH slots on: a kernel that takes the slot after it pools
    a pixel of the next column, and the check fails."""
    target, ctx = emulated
    layer, xs, prm = case("c16_14x14_relu")
    cfg = _point()
    good = V.render(layer, cfg, "k")
    row = "(r0 + j / 2 * TWH + j % 2) * ELD"
    assert good.count(row) == 1
    bad = good.replace(row, "(r0 + j / 2 * (TWH + 1) + j % 2) * ELD")
    monkeypatch.setattr(type(V), "render", lambda self, l, c, p: bad)
    out = _run(V, layer, cfg, xs, prm, target, ctx)
    with pytest.raises(AssertionError, match="half tolerance"):
        check_half_output(layer, xs, prm, cfg, out)


def test_tune_names_a_conv_and_its_pool(tmp_path):
    """`aotconv tune --layer c1+s2` searches the conv_pool layer a build measures (lenet5 on
    PoCL: conv_pool_direct) and records it; the conv itself is left alone."""
    from aotconv import cli
    db = tmp_path / "db.jsonl"
    db.touch()
    assert cli.main(["tune", "lenet5", "--target", "pocl-cpu", "--layer", "c1+s2", "--budget",
                     "2", "--tuning-db", str(db), "--quiet"]) == 0
    ops_recorded = {json.loads(line)["op"].split("|")[0] for line in db.read_text().splitlines()}
    assert ops_recorded == {"conv_pool"}

"""conv_wgmma_halo_f16_nhwc: stride-1 convolutions on wgmma from a halo tile of the padded
input, staged once per BK channels, every tap a descriptor offset into it.

Device-free: where it is offered (stride 1, dilation 1, C % 16 == 0, an fp16 build, compute
capability 9.0) and why it declines the rest; the strip widths; the halo planes' spread over
the banks; that one large work-group per compute unit is allowed (two warpgroups or more) and
the target's minimum kept for smaller ones; the existing variants' kernels unchanged by the
template's hooks (their shipped records name those texts); where clang (nvptx) and ptxas are at
hand, the kernel rewritten and assembled for sm_90a without spilling.

PoCL (the wgmma emulated): 3x3 with padding over several K steps of channels, a 3x3 without
padding over two images with a fused residual, 1x1, 5x5 and a strip narrower than the row (the
last strip partly past it), at the fallback and points across HBUF, WAIT, WN, EPI and the
strips, against the float64 reference within the half tolerance; the check catching a kernel
whose taps read the wrong slots; an fp16 library running two convs on it, passing --check.
"""
import functools
import random
from pathlib import Path

import pytest

from aotconv import protocol
from aotconv.context import with_precision
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.conv_wgmma_halo_f16_nhwc import geometry, strips
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)
import mma_nhwc_helpers as mh

V = BY_NAME["conv_wgmma_halo_f16_nhwc"]
H16 = with_precision(TARGETS["h100"], "fp16")
conv = functools.partial(mh.conv, storage="fp16")
VGG_3X3 = dict(in_shape=(16, 512, 28, 28), out=512, kernel=3, pad=1, act="relu")


# -- where it is offered ------------------------------------------------------------------------

@pytest.mark.unit
def test_domain():
    assert V.supports(conv(**VGG_3X3)) is None
    why = V.supports(conv((1, 64, 28, 28), out=64, kernel=3, stride=2, pad=1))
    assert why and "stride 1x1" in why
    why = V.supports(conv((1, 64, 28, 28), out=64, kernel=3, dilation=2, pad=2))
    assert why and "dilation 1x1" in why
    why = V.supports(conv((1, 24, 28, 28), out=64, kernel=3, pad=1))
    assert why and "C % 16 == 0" in why
    assert V.supports(mh.conv(**VGG_3X3)) is not None          # an FP32 build's layer
    assert mh.part(V, conv(**VGG_3X3), H16).points
    # the wgmma constraint: compute capability 9.0 exactly (an sm_80 or sm_100 device has none)
    from dataclasses import replace
    for cc in ((8, 0), (10, 0)):
        assert not mh.part(V, conv(**VGG_3X3), replace(H16, compute_capability=cc)).points


@pytest.mark.unit
def test_strips():
    assert strips(28) == (28, 14)
    assert strips(224)[0] == 56 and strips(224)[-1] == 224
    assert all(224 % w == 0 for w in strips(224))
    assert strips(20) == (20, 16, 14)          # none divides: the two widest narrower ones
    assert strips(7) == (7,)


@pytest.mark.unit
@pytest.mark.parametrize("bk", [16, 32, 64])
def test_halo_planes_take_every_bank(bk):
    """The 8 work-items of a 16-byte store phase (8 / CH slots of CH planes) write 8 different
    16-byte bank groups: the planes start 128 / CH bytes apart (mod 128)."""
    layer = conv(**VGG_3X3)
    ch = bk // 8
    for bm, tw in ((128, 28), (64, 14), (256, 28)):
        g = geometry(layer, dict(BM=bm, BK=bk, TW=tw, WM=bm // 16, WN=1, BN=64, HBUF=2,
                                 WAIT=0, CPASYNC=0))
        assert g["NSP"] >= g["NS"] and g["NSP"] - g["NS"] < 8
        phase = [((e % ch) * g["NSP"] + e // ch) * 16 % 128 for e in range(8)]
        assert sorted(phase) == list(range(0, 128, 16))


@pytest.mark.unit
def test_one_large_work_group_per_compute_unit():
    """Two warpgroups or more may run alone on an SM (the register and local-memory occupancy
    rules ask for one such work-group); one warpgroup keeps the target's minimum."""
    layer = conv(**VGG_3X3)
    pts = mh.part(V, layer, H16).points
    assert any(c["BM"] == 256 and c["WM"] == 16 for c in pts)
    assert V.min_wg_per_cu(layer, dict(WM=8, WN=1), H16) == 1
    assert V.min_wg_per_cu(layer, dict(WM=4, WN=1), H16) == H16.min_wg_per_cu > 1


@pytest.mark.unit
def test_the_other_variants_kernels_are_unchanged(monkeypatch):
    """The template's hooks (halo, pixel, HALO) leave the kernels of conv_mma_f16_nhwc and
    conv_wgmma_f16_nhwc as their shipped H100 records name them, and the halo variant's own
    records name what it renders: each record's kernel hash is what the current templates
    render for its layer and point."""
    import json
    from aotconv.tune.records import cfg_from_json, kernel_hash, layer_of
    monkeypatch.delenv("AOTCONV_MMA_EMULATE", raising=False)
    path = Path(__file__).resolve().parents[1] / "aotconv" / "data" / "h100.jsonl"
    recs = [r for r in map(json.loads, path.read_text().splitlines())
            if r.get("variant") in ("conv_wgmma_f16_nhwc", "conv_mma_f16_nhwc", V.name)
            and r.get("kernel")]
    assert len({r["variant"] for r in recs}) == 3
    for r in random.Random(0).sample(recs, min(16, len(recs))):
        v, layer = BY_NAME[r["variant"]], layer_of(r["op"])
        assert kernel_hash(v, layer, cfg_from_json(r["cfg"])) == r["kernel"], r["layer"]


# -- the kernel, assembled for sm_90a ----------------------------------------------------------

@pytest.mark.parametrize("want", [dict(BM=128, BN=64, BK=32, HBUF=2, WAIT=1, EPI=1),
                                  dict(BM=256, BN=128, BK=32, HBUF=1, WAIT=1, EPI=0)])
def test_its_ptx_assembles_for_sm_90a(monkeypatch, want):
    monkeypatch.delenv("AOTCONV_MMA_EMULATE", raising=False)
    layer = conv(**VGG_3X3)
    cfg = next(c for c in mh.part(V, layer, H16).points
               if all(c[k] == v for k, v in want.items()))
    fixed, r = mh.assemble_sm90a(V, layer, cfg)
    assert sum(line.lstrip().startswith("wgmma.mma_async.sync.aligned.m64n%dk16" % cfg["INSN"])
               for line in fixed.splitlines()) >= 1
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stderr and "serializ" not in r.stderr


# -- on PoCL ------------------------------------------------------------------------------------

SHAPES = {
    "k3_p1_relu_3steps": ((1, 48, 9, 10), dict(out=64, kernel=3, pad=1, act="relu"), False),
    "k3_nopad_residual": ((2, 32, 7, 9), dict(out=40, kernel=3), True),
    "k1": ((2, 16, 6, 5), dict(out=32, kernel=1), False),
    "k5_p2_strips": ((1, 16, 6, 20), dict(out=32, kernel=5, pad=2, act="tanh"), False),
}


@pytest.mark.parametrize("lid", SHAPES)
def test_emulated_against_the_reference(emulated, lid):
    target, ctx = emulated
    shape, attrs, res = SHAPES[lid]
    layer, xs, prm = mh.random_case(conv(shape, res=res, **attrs), lid)
    picks = mh.spread(V, layer, target, (
        dict(HBUF=1, WAIT=1), dict(HBUF=2, WAIT=1), dict(HBUF=1, WAIT=0, EPI=1), dict(WN=2),
        dict(TW=strips(layer.out_shape[3])[-1])), lid)
    assert len(picks) >= 4
    for cfg in picks:
        check_half_output(layer, xs, prm, cfg, mh.run_point(V, layer, xs, prm, cfg, ctx))


def test_the_check_sees_taps_reading_the_wrong_slots(emulated):
    target, ctx = emulated
    shape, attrs, _ = SHAPES["k3_p1_relu_3steps"]
    layer, xs, prm = mh.random_case(conv(shape, **attrs), "wrong")
    cfg = V.fallback(layer, target)
    src = V.render(layer, cfg, "k")
    bad = src.replace("(tap / S * TWH + tap % S) * 16", "(tap / S * TWH) * 16")
    assert bad != src
    with pytest.raises(AssertionError, match="beyond the half tolerance"):
        check_half_output(layer, xs, prm, cfg,
                          mh.run_point(V, layer, xs, prm, cfg, ctx, source=bad))


NET = """name: halo
input: [2, 3, 8, 8]
layers:
  - {name: c0, op: conv, out: 16, kernel: 3, pad: 1, act: relu}
  - {name: c1, op: conv, out: 32, kernel: 3, pad: 1, act: relu}
  - {name: c2, op: conv, out: 32, kernel: 3, pad: 1}
  - {name: add, op: add, inputs: [c2, c1], act: relu}
  - {name: gap, op: global_avgpool}
  - {name: fc, op: dense, out: 5}
"""


def test_an_fp16_library_runs_it(tmp_path, monkeypatch, emulated):
    """c1 and c2 (the add fused in, staged epilogue) on the variant from records, an fp16
    build for PoCL with --check."""
    def picks(net, fused, target):
        return [(layer, V, mh.with_knobs(V.fallback(layer, target), EPI=epi, HBUF=1, WAIT=1))
                for layer, epi in ((net.layer("c1"), 0), (net.layer("c2"), 1),
                                   (fused.layer("c2"), 1))]

    res = mh.built_from_records(tmp_path, monkeypatch, "halo", NET, "fp16", picks, fuse=["c2"])
    choices = res.schedule.choices
    assert choices["c1"].variant == V.name and choices["c2"].variant == V.name
    assert res.schedule.net.layer("c2").attrs.get("residual")
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE

"""A chain kept in NHWC end to end: conv (conv_igemm, LAYOUT=NHWC) -> maxpool (pool_nhwc) ->
conv -> residual add (add_nhwc) -> global average pool (global_avgpool_nhwc) -> dense.

The network is tuned on PoCL with every layer restricted to its NHWC points (`--where`), so
that the records make the NHWC choices the measured ones; built from those records, it
converts once (the input to NHWC) where the same records without the NHWC pools and add
convert four times (around the pool and the add), and the library matches the float64
reference.
"""
import json
import os

import numpy as np
import pytest

from aotconv import harness
from aotconv.targets import TARGETS

POCL = TARGETS["pocl-cpu"]

NET = """\
name: nhwcchain
input: [2, 8, 12, 12]
layers:
  - {name: c1, op: conv, out: 16, kernel: 3, pad: 1, act: relu}
  - {name: p1, op: maxpool, kernel: 2}
  - {name: c2, op: conv, out: 16, kernel: 3, pad: 1, act: relu}
  - {name: add1, op: add, inputs: [c2, p1]}
  - {name: gap, op: global_avgpool}
  - {name: fc, op: dense, out: 10}
"""
# c2 has an act, so the add stays a layer of its own (passes.fusable_residuals)
WHERE = ["conv_igemm:MDIM=1,NDIM=2,MBLK=16,NBLK=16,KBLK=16,VW=4,UNROLL=0,LPAD=0,DBUF=0,"
         "LAYOUT=NHWC,KSPLIT=1,TAPSTEP=0",
         "pool_nhwc:LAYOUT=NHWC,WG=64", "add_nhwc:LAYOUT=NHWC,WG=64,VEC=4",
         "global_avgpool_nhwc:LAYOUT=NHWC,WG=64"]
NHWC_LAYERS = {"c1": "conv_igemm", "p1": "pool_nhwc", "c2": "conv_igemm", "add1": "add_nhwc",
               "gap": "global_avgpool_nhwc"}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    try:
        harness.context_for(POCL)
    except Exception as e:                          # no PoCL: the device tier is skipped
        pytest.skip(f"PoCL not available: {e}")
    from aotconv.cli import main
    tmp = tmp_path_factory.mktemp("nhwcchain")
    src, db = tmp / "nhwcchain.yaml", tmp / "db.jsonl"
    src.write_text(NET)
    db.write_text("")
    mp = pytest.MonkeyPatch()
    mp.setenv("AOTCONV_CACHE_DIR", str(tmp / "cache"))     # these records only
    args = ["tune", str(src), "--target", "pocl-cpu", "--tuning-db", str(db), "-q", "-j", "1"]
    for w in WHERE:
        args += ["--where", w]
    for name in NHWC_LAYERS:
        args += ["--layer", name]
    try:
        assert main(args) == 0
        yield tmp, src, db, mp
    finally:
        mp.undo()


def _build(tmp, src, db, out, **kw):
    from aotconv.compiler import compile_network
    return compile_network(str(src), target="pocl-cpu", outdir=tmp / out, tune_mode="records",
                           tuning_db=[str(db)], quiet=True, fuse_pool="never", **kw)


def _tuning(res):
    doc = json.loads((res.outdir / "tuning.json").read_text())
    return {l["layer"]: l for l in doc["layers"]}


def test_the_chain_stays_in_nhwc_and_matches_numpy(tuned):
    tmp, src, db, _ = tuned
    recs = [json.loads(l) for l in db.read_text().splitlines() if l.strip()]
    assert set(NHWC_LAYERS.values()) <= {r["variant"] for r in recs}
    res = _build(tmp, src, db, "nhwc", check=True)
    assert res.check_error is not None and res.check_error <= 1e-3
    got = _tuning(res)
    for name, variant in NHWC_LAYERS.items():
        assert got[name]["variant"] == variant, got[name]
        assert got[name]["layouts"][0] == "NHWC", got[name]
    converts = [n for n, l in got.items() if l["variant"] == "layout_convert"]
    assert converts == ["input_to_nhwc"], converts
    net = res.schedule.net
    assert net.layer("p1").inputs == ["c1"] and net.layer("c2").inputs == ["p1"]
    assert net.layer("add1").inputs == ["c2", "p1"] and net.layer("gap").inputs == ["add1"]
    # gap writes N x C x 1 x 1 as NCHW: the dense layer reads it as it is
    assert net.layer("fc").inputs == ["gap"]
    # and once more, outside the build: the library against the float64 reference
    from aotconv import params as params_mod, reference
    from aotconv.runtime import load
    from aotconv.spec import load_network
    net0 = load_network(str(src))
    flat = params_mod.read_bin(res.outdir / "nhwcchain.params.bin", net0)
    x = np.random.default_rng(3).standard_normal(net0.input_shape).astype(np.float32)
    with load(res.outdir) as lib:
        out = lib(x)
    ok, err = harness.close(out, reference.run_network(net0, x, params_mod.split(net0, flat))[0])
    assert ok, err


def test_without_the_nhwc_pool_and_add_the_build_converts_around_them(tuned):
    """The same records with pool_nhwc, add_nhwc and global_avgpool_nhwc left out: the convs
    keep NHWC, the pool and the add run NCHW, and the build converts four times."""
    tmp, src, db, mp = tuned
    mp.setenv("AOTCONV_EXCLUDE_VARIANTS", "pool_nhwc,add_nhwc,global_avgpool_nhwc")
    try:
        res = _build(tmp, src, db, "nchw", measure=False, binaries=False)
    finally:
        mp.delenv("AOTCONV_EXCLUDE_VARIANTS")
    got = _tuning(res)
    assert got["c1"]["layouts"] == ["NHWC", "NHWC"] and got["p1"]["layouts"] == ["NCHW", "NCHW"]
    converts = sorted(n for n, l in got.items() if l["variant"] == "layout_convert")
    assert converts == ["c1_to_nchw", "c2_to_nchw", "input_to_nhwc", "p1_to_nhwc"], converts

"""A chain kept in NHWC end to end: conv (conv_igemm, LAYOUT=NHWC) -> maxpool (pool_nhwc) ->
conv -> residual add (add_nhwc) -> global average pool (global_avgpool_nhwc) -> dense.

The network is tuned on PoCL with every layer restricted to its NHWC points (`--where`), so
that the records make the NHWC choices the measured ones; built from those records, it
converts once (the input to NHWC) where the same records without the NHWC pools and add
convert four times (around the pool and the add), and the library matches the float64
reference. Device-free: the layout plan reads both inputs of the add in NHWC where they arrive
so, and prices a tensor's several readers at their current picks.
"""
import json

import numpy as np
import pytest
import yaml

from aotconv import harness
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME

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


# slow tier: a build with its check, 2 to 25 s (the tuned choices vary, and with them PoCL's
# compile of the joined program); make test keeps the NHWC tune and the build's plan of it (the
# test below) and the NHWC kernels against the reference (test_pool_nhwc.py,
# test_eltwise_nhwc.py)
@pytest.mark.slow
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


# -- the layout plan with several inputs (device-free) ------------------------------------------

def _plan(times, conv_ms):
    """{layer: {layout: ms}} -> the plan's read layout of each layer (the tuned pick: each
    layer's fastest), the conversion between two layouts costing `conv_ms`."""
    from aotconv import layouts, passes
    from aotconv.choose import Choice
    from aotconv.spec import network_from_dict
    net = passes.optimise(network_from_dict(yaml.safe_load(NET)))
    nchw = {"c1": "conv_direct", "p1": "pool_direct", "c2": "conv_direct", "add1": "add_direct",
            "gap": "global_avgpool_direct"}

    def choice(name, layout, ms):
        if layout == "NCHW":
            v = BY_NAME[nchw[name]]
        else:
            v = BY_NAME[NHWC_LAYERS[name]]
        cfg = next(c for c in _points(net.layer(name), v) if v.layouts_of(net.layer(name), c)[0]
                   == layout)
        return Choice(v.name, cfg, ms, "tuned")

    opts = {n: [choice(n, lay, ms) for lay, ms in t.items()] for n, t in times.items()}
    choices = {n: min(o, key=lambda c: c.time_ms) for n, o in opts.items()}
    got, _ = layouts.plan(net, choices, opts, lambda s, a, b: 0.0 if a == b else conv_ms)
    return {n: layouts.layouts_of(net.layer(n), c)[0] for n, c in got.items()}


def _points(layer, v):
    from aotconv.variants.base import Config
    fb = v.fallback(layer, POCL)
    yield fb
    if "LAYOUT" in fb.as_dict():
        for lay in ("NHWC", "CHWN", "NCHW"):
            yield Config(tuple((k, lay if k == "LAYOUT" else x) for k, x in fb.items))


def test_the_plan_reads_both_inputs_of_an_add_in_nhwc():
    """A layer of several inputs reads them all in its one read layout: the residual add
    starts its own chain and takes NHWC where both its inputs arrive in NHWC, though its NCHW
    kernel was the faster by a little (the same kernel text: the times are noise)."""
    times = {"c1": {"NCHW": 1.0, "NHWC": 0.5}, "p1": {"NCHW": 0.10, "NHWC": 0.11},
             "c2": {"NCHW": 1.0, "NHWC": 0.5}, "add1": {"NCHW": 0.10, "NHWC": 0.11},
             "gap": {"NCHW": 0.05, "NHWC": 0.05}}
    lay = _plan(times, 0.2)
    assert lay == {"c1": "NHWC", "p1": "NHWC", "c2": "NHWC", "add1": "NHWC", "gap": "NHWC"}


def test_where_chains_meet_the_tail_is_priced_at_the_readers_picks():
    """Where chains meet the plan is greedy: the pool's chain prices its two readers at their
    current picks. With the add's tuned pick in NHWC and convs a little faster in NHWC, NHWC
    throughout (one conversion, 2.17 ms) beats NCHW throughout (2.25 ms) and is planned.
    (With the add's pick in NCHW instead, the same times plan NCHW throughout: the limit
    docs/variants/pool_nhwc.md, The layout plan, describes.)"""
    times = {"c1": {"NCHW": 1.0, "NHWC": 0.85}, "p1": {"NCHW": 0.10, "NHWC": 0.11},
             "c2": {"NCHW": 1.0, "NHWC": 0.85}, "add1": {"NCHW": 0.11, "NHWC": 0.10},
             "gap": {"NCHW": 0.05, "NHWC": 0.05}}
    assert set(_plan(times, 0.2).values()) == {"NHWC"}

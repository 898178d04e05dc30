"""`aotconv bench`: the device-free parts (layer sets, roofline, hints, summaries, tables, JSON
re-rendering), the net -> torch converter against the numpy reference, and one small layer
measured for real on PoCL through the bench path (torch and CLBlast when they are present).
"""
import argparse
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from aotconv.bench import cli as bench_cli, report as br
from aotconv.bench.device import Device, target_dict
from aotconv.bench.layer import bench_layer
from aotconv.bench.options import Options, parse_scale
from aotconv.bench.refs import Refs, clblast
from aotconv.bench.rerender import rerender
from aotconv.bench.sets import SET_NAMES, SETS, conv_layer, select
from aotconv.protocol import counts
from devices import pocl_present

H100 = {"name": "h100", "kind": "gpu", "peak_gflops": 66900.0, "peak_gbps": 3350.0,
        "summary": "h100"}


def has(mod):
    return importlib.util.find_spec(mod) is not None


# -- the layer sets ----------------------------------------------------------------------------

def test_sets_have_their_published_sizes():
    assert [len(SETS[s]) for s in SET_NAMES] == [5, 13, 43]
    assert {t[1] for t in SETS["alexnet_n128"]} == {128}
    assert {t[1] for t in SETS["boda43_n5"]} == {5}


@pytest.mark.parametrize("t", SETS["alexnet_n128"] + SETS["vgg16_n1"] + SETS["boda43_n5"],
                         ids=lambda t: t[0])
def test_conv_layer_matches_the_tables_flops(t):
    from aotconv.bench.sets import flops
    from aotconv.ops import flops as op_flops
    layer, n0 = conv_layer(t)
    assert n0 == t[1] and layer.in_shape == tuple(t[1:5])
    assert op_flops(layer) == flops(*t[1:])
    assert not layer.attrs["bias"] and layer.attrs["act"] == "none"


def test_scale_caps_the_batch_and_keeps_the_original():
    layer, n0 = conv_layer(SETS["alexnet_n128"][0], max_batch=1)
    assert layer.in_shape[0] == 1 and layer.out_shape[0] == 1 and n0 == 128
    assert parse_scale("N=1") == 1 and parse_scale("4") == 4
    assert parse_scale(None) is None
    with pytest.raises(Exception):
        parse_scale("N=0")


def test_select_filters_by_globs():
    got = select(["vgg16_n1", "boda43_n5"], ["vgg.conv5_*", "boda.0[0-1]*"])
    assert [t[0] for _, t in got] == ["vgg.conv5_1", "vgg.conv5_2", "vgg.conv5_3",
                                      "boda.00.k5s1o32i28c16", "boda.01.k5s1o64i14c32"]
    assert len(select(["alexnet_n128"], [])) == 5


# -- roofline, hints, summaries ----------------------------------------------------------------

def test_geomean_ignores_missing_values():
    assert br.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert br.geomean([2.0, None, 0.0, math.inf, 8.0]) == pytest.approx(4.0)
    assert br.geomean([]) is None


def test_roofline_classifies_launch_bandwidth_and_compute():
    # 1 GFLOP over 1 MB: AI 1000 >> ridge 20: compute-bound at 1 ms (1 TFLOP/s, 1.5% of peak)
    r = br.roofline(1e9, 1e6, 1.0, 66900.0, 3350.0)
    assert r["bound"] == "compute" and r["ridge"] == pytest.approx(66900 / 3350)
    assert r["tflops"] == pytest.approx(1.0) and r["pct_peak"] == pytest.approx(100 / 66.9)
    # AI 1: bandwidth-bound; 1 GB in 1 ms is 1000 GB/s = 29.9% of HBM
    r = br.roofline(1e9, 1e9, 1.0, 66900.0, 3350.0)
    assert r["bound"] == "bandwidth" and r["pct_bw"] == pytest.approx(100 * 1000 / 3350)
    assert r["attainable_gflops"] == pytest.approx(3350.0)
    # any kernel under 10 us on a GPU is launch-bound, whatever its intensity
    assert br.roofline(1e9, 1e6, 0.005, 66900.0, 3350.0)["bound"] == "launch"
    # the CPU's launch threshold is higher (PoCL's scheduler): 20 us is still launch-bound
    assert br.roofline(1e9, 1e6, 0.02, 320.0, 20.0, "cpu")["bound"] == "launch"


def row_for(t, ours_ms, torch_ms=None, clblast_ms=None, variant="conv_direct"):
    from aotconv.ops import bytes_moved, flops
    layer, n0 = conv_layer(t)
    r = {"set": "x", "name": t[0], "N": t[1], "N_orig": n0, "C": t[2], "H": t[3], "W": t[4],
         "K": t[5], "R": t[6], "S": t[7], "stride": t[8], "pad": t[9], "P": layer.out_shape[2],
         "Q": layer.out_shape[3], "flops": flops(layer), "bytes": bytes_moved(layer),
         "ours": {"ms": ours_ms, "variant": variant, "launches": 1,
                  "verify": {"ok": True, "error": 1e-6, "images": 1}},
         "refs": {"torch": {"ms": torch_ms} if torch_ms else {"note": "absent"},
                  "clblast": {"ms": clblast_ms} if clblast_ms else {"note": "absent"}}}
    return r


def test_derive_ratios_and_hints():
    vgg = SETS["vgg16_n1"][4]                                 # 3x3 stride 1, compute-bound
    r = br.derive(dict(row_for(vgg, 2.0, torch_ms=1.0, clblast_ms=6.0),
                       variants=["conv_direct", "conv_winograd"]), H100)
    assert r["ours_over_torch"] == pytest.approx(2.0)
    assert r["clblast_over_ours"] == pytest.approx(3.0)
    assert r["short"] and r["roofline"]["bound"] == "compute"
    assert "Winograd" in r["close_it"] and "registered but was not picked" in r["close_it"]
    # faster than the reference: no hint
    r = br.derive(row_for(vgg, 0.5, torch_ms=1.0), H100)
    assert not r["short"] and r["close_it"] == ""
    # the 1x1 conv over a 1x1 image is a GEMV: bandwidth-bound, the hint says so
    fc = next(t for t in SETS["boda43_n5"] if t[0].startswith("boda.13"))
    r = br.derive(row_for(fc, 2.0, torch_ms=1.0), H100)
    assert r["roofline"]["bound"] == "bandwidth" and "GEMV" in r["close_it"]
    assert "to write" in r["close_it"]                 # no conv GEMV variant exists
    assert "bandwidth-bound" in r["why"]
    # a 5 us kernel slower than cuDNN is launch-bound
    r = br.derive(row_for(fc, 0.005, torch_ms=0.003), H100)
    assert r["roofline"]["bound"] == "launch" and "launch" in r["close_it"]


def test_summary_geomean_totals_and_clblast_speedup():
    ts = SETS["vgg16_n1"][:3]
    rows = [br.derive(row_for(t, ms, torch_ms=1.0, clblast_ms=4.0), H100)
            for t, ms in zip(ts, (0.5, 2.0, 1.0))]
    rows.append(br.derive(row_for(SETS["vgg16_n1"][3], None), H100))   # a failed layer
    s = br.summarise(rows)
    assert s["layers"] == 4 and s["measured"] == 3
    assert s["geomean_ours_over_torch"] == pytest.approx(1.0)
    assert s["faster_than_torch"] == 1
    assert s["total_ours_ms"] == pytest.approx(3.5) and s["total_torch_ms"] == pytest.approx(3.0)
    assert s["geomean_clblast_over_ours"] == pytest.approx(4.0)


def fake_doc():
    t = SETS["vgg16_n1"][4]
    rows = [row_for(t, 2.0, torch_ms=1.0, clblast_ms=6.0)]
    doc = {"tool": "aotconv bench", "version": "0", "date": "2026-01-01",
           "command": "aotconv bench --target h100", "target": H100, "device_kind": "gpu",
           "environment": {"device": "NVIDIA H100"}, "mode": "tune", "repeats": 30,
           "refs": {"torch": {"available": True, "note": "cuDNN 9"}}, "ref_label": "cuDNN",
           "registered_variants": ["conv_direct"], "sets": {"vgg16_n1": {"rows": rows}},
           "e2e": [{"net": "vgg16", "batch": 1, "batch_orig": 1, "build_s": 300.0,
                    "ours": {"run_ms": 3.0, "kernels_ms": 2.5},
                    "torch": {"eager_ms": 1.5, "wall_ms": 2.0}, "ratio_wall": 1.5,
                    "ratio_kernels": 2.5 / 1.5, "max_error": 1e-6}],
           "notes": []}
    return br.finish(doc, H100, ["conv_direct"])


def test_markdown_and_text_tables():
    doc = fake_doc()
    md = br.markdown(doc)
    assert "Command: `aotconv bench --target h100`" in md and "2026-01-01" in md
    assert "| vgg.conv3_1 |" in md and "| 2.00 |" in md          # ours/cuDNN
    assert "Winograd" in md and "## End to end" in md and "| vgg16 | 1 |  | 300.0 |" in md
    head = [l for l in md.splitlines() if l.startswith("| layer |")][0]
    sep = md.splitlines()[md.splitlines().index(head) + 1]
    assert head.count("|") == sep.count("|")                      # a well-formed table
    txt = br.text_table(doc)
    assert "vgg.conv3_1" in txt and "2.00" in txt and "e2e vgg16 b1" in txt


def test_from_json_merges_and_rerenders(tmp_path):
    a, b = fake_doc(), fake_doc()
    b["sets"] = {"boda43_n5": {"rows": [row_for(SETS["boda43_n5"][2], 1.0, torch_ms=2.0)]}}
    failed = dict(a["e2e"][0], ours={"error": "build failed"})
    b["e2e"] = [failed]                      # a failed re-run does not replace a good row
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    out = tmp_path / "m.json"
    ns = argparse.Namespace(from_json=[str(pa), str(pb)], out=str(out), md=None, quiet=True,
                            note=["merged by a test"])
    assert rerender(ns) == 0
    m = json.loads(out.read_text())
    assert set(m["sets"]) == {"vgg16_n1", "boda43_n5"}
    assert len(m["e2e"]) == 1 and m["e2e"][0]["ours"]["run_ms"] == 3.0
    assert m["sets"]["boda43_n5"]["summary"]["geomean_ours_over_torch"] == pytest.approx(0.5)
    md = out.with_suffix(".md").read_text()
    assert "## boda43_n5" in md and "- merged by a test" in md


def test_the_cli_registers_bench():
    from aotconv.cli import parser
    a = parser().parse_args(["bench", "--target", "pocl-cpu", "--sets", "boda43_n5",
                             "--scale", "N=1", "--no-tune", "--repeats", "3"])
    assert a.func is bench_cli._entry and a.no_tune and a.scale == "N=1" and a.repeats == 3


def test_clblast_refuses_what_convgemm_cannot_compute():
    from aotconv import ops
    from aotconv.graph import Layer

    def layer(**raw):
        a = ops.normalise("conv", {"out": 4, "kernel": 3, "bias": False, **raw})
        out, params = ops.infer("conv", a, [(1, 4, 8, 8)])
        return Layer("l", "conv", a, ["input"], in_shapes=[(1, 4, 8, 8)], out_shape=out,
                     params=params)
    assert clblast.unsupported(layer(pad=1)) is None
    assert "grouped" in clblast.unsupported(layer(groups=2))
    assert "asymmetric" in clblast.unsupported(layer(pad="same", stride=2))
    assert "bias" in clblast.unsupported(layer(bias=True))


# -- the torch model of a network --------------------------------------------------------------

EVERY_OP = """
name: every_op
input: [2, 3, 11, 10]
layers:
  - {name: c1, op: conv, out: 8, kernel: 3, stride: 2, pad: same, act: leaky_relu, alpha: 0.1}
  - {name: n1, op: lrn, size: 3}
  - {name: p1, op: maxpool, kernel: 3, stride: 2, pad: 1, ceil_mode: true}
  - {name: b1, op: conv, out: 4, kernel: 1, inputs: [p1]}
  - {name: b2, op: conv, out: 4, kernel: 3, pad: 1, groups: 2, dilation: 1, act: tanh, inputs: [p1]}
  - {name: cat, op: concat, inputs: [b1, b2]}
  - {name: bn, op: batchnorm}
  - {name: s1, op: sigmoid}
  - {name: a1, op: avgpool, kernel: 2, stride: 1, pad: 1, count_include_pad: true}
  - {name: a2, op: avgpool, kernel: 2, stride: 1, pad: 1, inputs: [s1]}
  - {name: sum, op: add, inputs: [a1, a2], act: relu}
  - {name: g, op: global_avgpool}
  - {name: f, op: flatten}
  - {name: d0, op: dropout}
  - {name: fc, op: dense, out: 5}
  - {name: prob, op: softmax}
"""


@pytest.mark.skipif(not has("torch"), reason="torch is not installed")
@pytest.mark.parametrize("source", ["every_op", "lenet5"])
def test_torch_model_matches_the_numpy_reference(tmp_path, source):
    import torch
    from aotconv import params, spec, torch_model
    from aotconv.harness import close
    from aotconv.reference import run_network
    if source == "every_op":
        p = tmp_path / "every_op.yaml"
        p.write_text(EVERY_OP)
        source = str(p)
    net = spec.load_network(source, batch=2)
    flat = params.random_params(net, seed=3)
    x = np.random.default_rng(4).standard_normal(net.input_shape).astype(np.float32)
    with torch.no_grad():
        y = torch_model.build(net, flat)(torch.from_numpy(x)).numpy()
    ref = run_network(net, x, flat)[0]
    ok, err = close(y, ref)
    assert ok, err
    assert y.shape == tuple(net.layers[-1].out_shape)


# -- one layer, for real, on PoCL --------------------------------------------------------------


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_one_layer_through_the_bench_path():
    from aotconv.targets import TARGETS
    dev = Device(TARGETS["pocl-cpu"])
    refs = Refs(["torch", "clblast"], dev, quiet=True)
    a = argparse.Namespace(no_tune=True, budget=None, set_budget=None, e2e_budget=None,
                           strategy=None, quiet=True, scale="N=1", repeats=3, warmup=1, seed=0,
                           verify_images=1, verify_max_gflop=10.0, max_measure_s=1.0, workdir="build/bench",
                           target="pocl-cpu", deadline=None, jobs=None)
    opts = Options(a, dev.target)
    t = ("tiny.k3", 5, 6, 9, 7, 5, 3, 3, 1, 1)
    row = bench_layer(dev, refs, "tiny", t, opts)
    o = row["ours"]
    assert "error" not in o, o
    assert row["N"] == 1 and row["N_orig"] == 5 and (row["P"], row["Q"]) == (9, 7)
    assert o["verify"]["ok"] and o["ms"] > 0 and len(o["times"]) == 3    # --repeats 3
    assert o["source"] == "best fallback" and any("ms" in c for c in o["tried"])
    for name in ("torch", "clblast"):
        r = row["refs"][name]
        if not refs.status[name]["available"]:
            assert r == {"note": "absent"}
            continue
        assert r["verify"]["ok"], (name, r)                      # same data, same answer
        assert r["ms"] > 0
    br.derive(row, target_dict(dev.target))
    assert row["roofline"]["bound"] in ("launch", "bandwidth", "compute")


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
@pytest.mark.parametrize("layout", ["CHWN", "NHWC"])
def test_the_bench_verifies_variants_of_another_storage_order(layout):
    """A kernel that reads and writes CHWN/NHWC gets its input in that order and its output
    read back to NCHW before the check (a bench once marked correct CHWN kernels WRONG)."""
    from aotconv.choose import Choice
    from aotconv.space import point_ok
    from aotconv.targets import TARGETS
    from aotconv.variants import BY_NAME
    from aotconv.variants.base import Config
    dev = Device(TARGETS["pocl-cpu"])
    refs = Refs([], dev, quiet=True)
    a = argparse.Namespace(no_tune=False, budget=None, set_budget=None, e2e_budget=None,
                           strategy=None, quiet=True, scale="N=4", repeats=2, warmup=1, seed=0,
                           verify_images=2, verify_max_gflop=10.0, max_measure_s=1.0,
                           workdir="build/bench", target="pocl-cpu", deadline=None, jobs=None)
    opts = Options(a, dev.target)
    t = ("tiny.k3", 4, 8, 9, 7, 16, 3, 3, 1, 1)
    layer, _ = conv_layer(t, opts.max_batch)
    v = BY_NAME["conv_igemm"]
    cfg = Config.from_dict({**v.fallback(layer, dev.target).as_dict(), "LAYOUT": layout,
                            "TAPSTEP": int(layout != "NHWC")})
    assert point_ok(layer, v, cfg, dev.target)
    assert v.layouts_of(layer, cfg) == (layout, layout)
    row = bench_layer(dev, refs, "tiny", t, opts,
                            choice=Choice("conv_igemm", cfg, 1.0, "tuned"))
    assert "error" not in row["ours"], row["ours"]
    assert row["ours"]["verify"]["ok"], row["ours"]["verify"]


def test_repeats_shrink_for_slow_kernels_and_budgets_for_the_deadline():
    import time
    o = argparse.Namespace(repeats=30, warmup=5, max_measure_s=3.0)
    assert counts(0.01, o) == (5, 30)                        # fast: as asked
    assert counts(1000.0, o) == (1, 3)                       # 1 s a run: the floor of 3
    assert counts(200.0, o) == (1, 15)                       # 3 s / 200 ms
    opts = argparse.Namespace(deadline=time.monotonic() + 100)
    notes = []
    fit = Options.fit_budget
    got = fit(opts, "5m", 20, "vgg16_n1", notes)
    assert got.endswith("s") and 75 <= int(got[:-1]) <= 80 and "shrunk" in notes[0]
    assert fit(opts, "30s", 20, "x", notes) == "30s"          # fits: unchanged
    assert fit(opts, "400", 20, "x", notes) == "400"          # trials: cannot be fitted
    opts.deadline = None
    assert fit(opts, "5m", 20, "x", notes) == "5m"


def test_end_to_end_row_on_pocl_times_run_from_numpy_and_from_the_pinned_buffers(tmp_path):
    """`aotconv bench --sets e2e` on PoCL: the library is built, run from numpy memory and from
    its pinned host buffers (whose output must equal the first), and both times are reported."""
    from aotconv.cli import main
    out = tmp_path / "e2e.json"
    assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:2",
                 "--no-tune", "--refs", "none", "--repeats", "3", "--warmup", "1", "--quiet",
                 "--out", str(out), "--workdir", str(tmp_path / "work")]) == 0
    row = json.loads(out.read_text())["e2e"][0]
    o = row["ours"]
    assert "error" not in o and "run_pinned_error" not in o, o
    assert o["run_ms"] > 0 and o["run_pinned_ms"] > 0 and o["kernels_ms"] > 0
    # and from a second handle with profiling off, its output checked equal first
    assert "run_pinned_noprof_error" not in o and o["run_pinned_noprof_ms"] > 0, o
    # and run_buffers() on an input already on the device, on a queue of the timing process's
    # own, its output checked equal first: what the references' device-resident times compare
    assert "run_resident_error" not in o and o["run_resident_ms"] > 0, o
    md = out.with_suffix(".md").read_text()
    assert "ours run() from pinned buffers ms | ours the same, profiling off ms" in md


# slow tier: 4.5 to 6 s; make test keeps the e2e bench on PoCL (the test above) and builds
# --records-only --require-tuned (tests/test_shipped_choices.py, tests/test_borrow.py)
@pytest.mark.slow
def test_records_only_builds_the_end_to_end_network_from_the_records_alone(tmp_path, capsys,
                                                                          monkeypatch):
    """`aotconv bench --records-only`: the network is built as `aotconv build --records-only`
    builds it (from the records of lenet5 at batch 100), nothing is tuned; and it cannot be
    combined with --no-tune. The records are the shipped pocl-cpu ones keyed to the PoCL device
    of this machine (records of another CPU are ignored where a device is present, and the
    shipped ones were measured on one CPU model), in a cache of the test's own."""
    from aotconv.cli import main
    from aotconv.targets import device_identity, find_device, get_target
    from aotconv.tune.records import shipped_file
    here = device_identity(*find_device(get_target("pocl-cpu")))
    cache = tmp_path / "cache"
    cache.mkdir()
    with open(cache / "records.jsonl", "w") as f:
        for line in shipped_file("pocl-cpu").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("op", "").split("|")[1:2] and rec["op"].split("|")[1].startswith("100x"):
                f.write(json.dumps({**rec, "device": here}) + "\n")
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(cache))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    out = tmp_path / "e2e.json"
    assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:100",
                 "--records-only", "--refs", "none", "--repeats", "3", "--warmup", "1",
                 "--quiet", "--out", str(out), "--workdir", str(tmp_path / "work")]) == 0
    doc = json.loads(out.read_text())
    row = doc["e2e"][0]
    assert doc["mode"].startswith("records-only") and row["mode"] == "from the records alone"
    assert "error" not in row["ours"], row["ours"]
    layers = json.loads((Path(row["build_dir"]) / "tuning.json").read_text())["layers"]
    assert layers and {l["source"] for l in layers} == {"record"}
    assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:100",
                 "--records-only", "--no-tune", "--refs", "none", "--quiet",
                 "--out", str(tmp_path / "x.json")]) != 0
    assert "--no-tune and --records-only" in capsys.readouterr().err

"""`aotconv bench --precision tf32|fp16`: the end-to-end set in a reduced precision.

Device-free: which sets a precision runs (the per-layer sets refuse it in one line), the
library's check against the numpy reference its --check uses, the tables (one per precision,
the precision in the heading and the columns), --from-json keeping two precisions of one
network apart; with torch installed (it is optional: the bench runs without it), PyTorch run
in each precision (TF32 allowed and restored, the model in half and channels_last) through
the one end-to-end function the fp32 rows use. On PoCL: lenet5 built in fp16 and benchmarked.
"""
import argparse
import importlib.util
import json
from types import SimpleNamespace

import numpy as np
import pytest

from aotconv import params as params_mod, passes, precision, spec
from aotconv.bench import report as br
from aotconv.bench.e2e import build_dir_name, numpy_check, torch_e2e
from aotconv.bench.options import Options, parse_sets
from aotconv.bench.rerender import rerender
from aotconv.bench.sets import SET_NAMES
from aotconv.errors import AotconvError
from aotconv.protocol import TOLERANCE
from aotconv.reference import run_network
from devices import pocl_present

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
CPU = {"name": "pocl-cpu", "kind": "cpu", "peak_gflops": 320.0, "peak_gbps": 20.0,
       "summary": "pocl-cpu"}


# -- which sets run in which precision ---------------------------------------------------------

def test_a_reduced_precision_runs_the_end_to_end_set_alone():
    assert parse_sets(None, SET_NAMES) == list(SET_NAMES) + ["e2e"]
    assert parse_sets(None, SET_NAMES, "fp32") == list(SET_NAMES) + ["e2e"]
    for p in ("tf32", "fp16"):
        assert parse_sets(None, SET_NAMES, p) == ["e2e"]
        assert parse_sets("e2e", SET_NAMES, p) == ["e2e"]
        assert parse_sets("", SET_NAMES, p) == ["e2e"]         # an empty --sets: the default
    assert parse_sets("vgg16_n1,e2e", SET_NAMES) == ["vgg16_n1", "e2e"]


@pytest.mark.parametrize("sets", ["vgg16_n1", "e2e,boda43_n5"])
def test_a_per_layer_set_in_a_reduced_precision_is_one_line(sets):
    with pytest.raises(AotconvError) as e:
        parse_sets(sets, SET_NAMES, "fp16")
    msg = str(e.value)
    assert "\n" not in msg and "only the end-to-end set (--sets e2e)" in msg
    assert sets.replace("e2e,", "") in msg and "fp16" in msg
    with pytest.raises(AotconvError, match="unknown set 'nope'"):
        parse_sets("e2e,nope", SET_NAMES, "tf32")
    with pytest.raises(AotconvError, match="--precision fp8"):
        parse_sets("e2e", SET_NAMES, "fp8")


def test_the_command_line_refuses_per_layer_sets_before_opening_a_device(capsys):
    from aotconv.cli import main
    # pocl-cpu is a profile whether or not its device is here: the refusal comes first
    rc = main(["bench", "--target", "pocl-cpu", "--sets", "alexnet_n128", "--precision",
               "tf32", "--out", "/nonexistent/x.json"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "--sets alexnet_n128 with --precision tf32" in err


def test_options_carry_the_precision_and_builds_of_two_precisions_do_not_share_a_directory():
    a = argparse.Namespace(no_tune=True, budget=None, set_budget=None, e2e_budget=None,
                           strategy=None, quiet=True, scale=None, repeats=3, warmup=1, seed=0,
                           max_measure_s=1.0, verify_images=2, verify_max_gflop=200.0,
                           workdir="w", target="pocl-cpu", deadline=None, jobs=None)
    cpu = SimpleNamespace(kind="cpu")
    assert Options(a, cpu).precision == "fp32"             # a namespace without the option
    a.precision = "fp16"
    assert Options(a, cpu).precision == "fp16"
    assert Options(a, cpu).e2e_rounds == 1
    a.e2e_rounds = 5
    assert Options(a, cpu).e2e_rounds == 5
    a.e2e_rounds = 0
    with pytest.raises(AotconvError, match="--e2e-rounds 0: give 1"):
        Options(a, cpu)
    assert build_dir_name("vgg16", 1, "fp32") == "vgg16-b1"   # where fp32 rows always built
    names = {build_dir_name("vgg16", 1, p) for p in precision.PRECISIONS}
    assert len(names) == 3


# -- the check against the numpy reference of the build's precision ----------------------------

@pytest.fixture(scope="module")
def lenet3():
    net0 = spec.load_network("lenet5", batch=3)
    flat = params_mod.random_params(net0, seed=5)
    x = np.random.default_rng(6).standard_normal(net0.input_shape).astype(np.float32)
    return net0, passes.optimise(net0), flat, x


def tf32_schedule(net, variant):
    """What check_reference reads of a schedule: its layers and which variant each runs."""
    return SimpleNamespace(net=net, choices={"c1": SimpleNamespace(variant=variant),
                                             "c3": SimpleNamespace(variant="conv_direct")})


OPTS = SimpleNamespace(verify_images=2, verify_max_gflop=200.0)


def test_a_tf32_library_is_checked_against_the_tf32_reference_on_the_first_images(lenet3):
    net0, net, flat, x = lenet3
    sch = tf32_schedule(net, "conv_mma")
    exact = precision.network_reference(net0, net, x, params_mod.split(net0, flat), ["c1"])[0]
    c = numpy_check(sch, net0, flat, x, exact, OPTS)
    assert c["reference"] == precision.TF32Reference.name and c["images"] == 2
    assert c["within"] and c["error"] < 1e-12 and c["tolerance"] == TOLERANCE
    # the FP32 model's output is not what a TF32 library computes: it differs, by TF32's
    # rounding of c1's operands
    fp32 = run_network(net0, x, params_mod.split(net0, flat))[0]
    assert numpy_check(sch, net0, flat, x, fp32, OPTS)["error"] > 1e-7
    wrong = exact.copy()
    wrong[1, 3] += 0.01                                  # the second image is checked too
    c = numpy_check(sch, net0, flat, x, wrong, OPTS)
    assert not c["within"] and c["error"] == pytest.approx(0.01, rel=1e-3)
    # past T by far more than the spread of TF32's roundings through lenet3 on these images
    assert c["spread"] < 1e-3 and c["tolerance"] == pytest.approx(TOLERANCE + 2 * c["spread"])


def test_a_build_that_computes_in_fp32_is_checked_against_the_plain_reference(lenet3):
    net0, net, flat, x = lenet3
    sch = tf32_schedule(net, "conv_direct")              # tf32 asked for, no tensor cores
    fp32 = run_network(net0, x, params_mod.split(net0, flat))[0]
    c = numpy_check(sch, net0, flat, x, fp32, OPTS)
    assert c["reference"] == "the float64 numpy reference" and c["error"] < 1e-12
    assert numpy_check(sch, net0, flat, x, fp32,
                       SimpleNamespace(verify_images=0, verify_max_gflop=200.0)) == \
        {"skipped": "--verify-images 0"}
    skipped = numpy_check(sch, net0, flat, x, fp32,
                          SimpleNamespace(verify_images=2, verify_max_gflop=1e-6))
    assert "--verify-max-gflop" in skipped["skipped"]


# -- the tables and the JSON -------------------------------------------------------------------

def e2e_row(prec, run_ms, eager_ms, numpy=None, net="vgg16"):
    r = {"net": net, "batch": 1, "batch_orig": 1, "precision": prec, "build_s": 10.0,
         "mode": "fallback (no tuner)",
         "ours": {"run_ms": run_ms, "kernels_ms": run_ms / 2, "computes": prec},
         "torch": {"eager_ms": eager_ms, "wall_ms": eager_ms * 1.5},
         "ratio_wall": run_ms / (eager_ms * 1.5), "ratio_kernels": run_ms / 2 / eager_ms,
         "max_error": 1e-4}
    if numpy is not None:
        r["numpy"] = numpy
    return r


def doc_of(rows):
    return {"tool": "aotconv bench", "version": "0", "date": "2026-01-01",
            "command": "aotconv bench --sets e2e", "target": CPU, "device_kind": "cpu",
            "environment": {}, "mode": "no-tune", "repeats": 3, "refs": {},
            "ref_label": "PyTorch CPU", "registered_variants": [], "sets": {}, "e2e": rows,
            "notes": []}


def tables(md):
    """[(heading line or None, [table lines])] of the markdown's pipe tables."""
    out, heading, cur = [], None, []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
            continue
        if cur:
            out.append((heading, cur))
            cur = []
        if line.startswith("#"):
            heading = line
    return out


def test_an_fp32_only_document_renders_as_before():
    md = br.markdown(doc_of([e2e_row("fp32", 3.0, 1.5)]))
    ts = tables(md)
    assert len(ts) == 1 and ts[0][0] == "## End to end (the emitted C library)"
    assert ts[0][1][0].startswith("| network | batch | kernels chosen by | tune + build s | "
                                  "ours run() ms |")
    assert "###" not in md and "fp32" not in md


def test_each_precision_has_its_table_and_says_it():
    checked = {"reference": precision.HalfReference.name, "images": 1, "error": 2.3e-2,
               "tolerance": TOLERANCE + 2 * 1.1e-2, "within": False, "spread": 1.1e-2}
    rows = [e2e_row("fp32", 3.0, 1.5), e2e_row("fp16", 2.0, 0.5, checked),
            e2e_row("tf32", 2.5, 1.0, {"reference": "the float64 numpy reference",
                                       "images": 1, "error": 1e-7, "tolerance": TOLERANCE,
                                       "within": True})]
    doc = doc_of(rows)
    md = br.markdown(doc)
    ts = tables(md)
    assert [h.split(":")[0] for h, _ in ts] == ["### FP32", "### FP16", "### TF32"]
    for head, lines in ts:
        prec = head.split(":")[0][4:].lower()
        assert all(l.count("|") == lines[0].count("|") for l in lines), head
        assert len(lines) == 3                              # the header, its rule, one row
        if prec != "fp32":
            assert f"ours {prec} run() ms" in lines[0] and f"PyTorch CPU {prec} eager" in lines[0]
        others = {"fp32", "tf32", "fp16"} - {prec}
        assert not any(o in lines[0] for o in others)      # no column of another precision
    fp16_row = ts[1][1][2]
    assert "| 2.67 | 2.00 |" in fp16_row     # run 2.0 vs 0.75 with copies; kernels 1.0 vs 0.5
    assert "2.3e-02 on 1 image(s), **past T + 2 x spread 1.1e-02 = 2.3e-02**" in fp16_row
    assert "within T = 0.001" in ts[2][1][2]
    assert "so every ratio compares one precision" in md
    txt = br.text_table(doc)
    assert "e2e vgg16 b1 fp16:" in txt and "vs numpy 2.3e-02 (past T + 2 x spread)" in txt
    assert "e2e vgg16 b1:" in txt                           # the fp32 row as before


def test_from_json_keeps_two_precisions_of_one_network_apart(tmp_path):
    a = doc_of([e2e_row("fp32", 3.0, 1.5)])
    b = doc_of([e2e_row("fp16", 2.0, 0.5), e2e_row("fp32", 2.8, 1.5)])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    out = tmp_path / "m.json"
    assert rerender(argparse.Namespace(from_json=[str(pa), str(pb)], out=str(out), md=None,
                                       quiet=True, note=None)) == 0
    rows = json.loads(out.read_text())["e2e"]
    assert [(r["precision"], r["ours"]["run_ms"]) for r in rows] == [("fp32", 2.8),
                                                                     ("fp16", 2.0)]


# -- PyTorch in each precision (device-free: torch on the CPU) ---------------------------------

@needs_torch
def test_tf32_allows_tf32_inside_and_restores_the_settings_after():
    import torch
    from aotconv.bench.refs.torch_ref import Precision, configure
    configure("cpu")                                     # the bench's FP32 settings
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
              torch.get_float32_matmul_precision())
    assert before == (False, False, "highest")
    with pytest.raises(RuntimeError):
        with Precision("tf32", "cuda") as p:
            assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
            s = p.settings()
            assert s["cudnn.allow_tf32"] and s["cuda.matmul.allow_tf32"] and "note" not in s
            raise RuntimeError("a failure inside the block")
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision()) == before
    with Precision("fp32", "cuda") as p:
        assert not torch.backends.cudnn.allow_tf32 and p.settings()["dtype"] == "float32"
    with Precision("tf32", "cpu") as p:
        assert "computes in FP32" in p.settings()["note"]


@needs_torch
def test_fp16_runs_the_model_in_half_and_channels_last():
    import torch
    from aotconv import torch_model
    from aotconv.bench.refs.torch_ref import Precision
    net = spec.load_network("lenet5", batch=2)
    p = Precision("fp16")
    m = p.model(torch_model.build(net, params_mod.random_params(net, seed=1)))
    assert {t.dtype for t in m.parameters()} == {torch.float16}
    w = [t for t in m.parameters() if t.dim() == 4][0]
    assert w.is_contiguous(memory_format=torch.channels_last)
    x = p.input(torch.randn(2, 1, 32, 32))
    assert x.dtype == torch.float16 and x.is_contiguous(memory_format=torch.channels_last)
    assert p.settings()["memory_format"] == "channels_last"
    fp32 = Precision("fp32")
    x32 = torch.randn(2, 1, 32, 32)
    assert fp32.input(x32) is x32


@needs_torch
@pytest.mark.parametrize("prec", ["fp32", "tf32", "fp16"])
def test_torch_end_to_end_in_each_precision(prec):
    """The fp32 rows' function, parametrised: its output within what the precision allows of
    the float64 model, its settings recorded, the bench's FP32 settings back after it."""
    import torch
    from aotconv.bench.refs.torch_ref import configure
    configure("cpu")
    net = spec.load_network("lenet5", batch=2)
    flat = params_mod.random_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal(net.input_shape).astype(np.float32)
    opts = SimpleNamespace(repeats=3, warmup=1, max_measure_s=1.0, torch_compile=[])
    res, y = torch_e2e(net, flat, x, "cpu", opts, prec)
    assert res["settings"]["precision"] == prec
    assert res["settings"]["dtype"] == ("float16" if prec == "fp16" else "float32")
    assert res["eager_ms"] > 0 and res["wall_ms"] > 0 and res["best"] == "eager_ms"
    assert y.dtype == np.float32 and y.shape == tuple(net.layers[-1].out_shape)
    err = np.max(np.abs(y - run_network(net, x, params_mod.split(net, flat))[0]))
    # half: a probability near 1 carries about 2^-11 of relative rounding per layer
    assert err < (2e-2 if prec == "fp16" else 1e-5)
    assert err > (1e-5 if prec == "fp16" else -1)       # it really ran in half
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


@needs_torch
def test_torch_rounds_alternate_with_ours():
    """--e2e-rounds: ours (between()) then the best way timed again, N - 1 times."""
    net = spec.load_network("lenet5", batch=2)
    flat = params_mod.random_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal(net.input_shape).astype(np.float32)
    opts = SimpleNamespace(repeats=3, warmup=1, max_measure_s=1.0, torch_compile=[],
                           e2e_rounds=3)
    calls = []

    def between():
        calls.append(len(calls))
        return 1.0 + len(calls)
    res, _ = torch_e2e(net, flat, x, "cpu", opts, "fp32", between=between)
    assert calls == [0, 1] and res["best"] == "eager_ms"
    assert [r["ours"] for r in res["rounds"]] == [2.0, 3.0]
    assert all(r["reference"] > 0 for r in res["rounds"])
    res, _ = torch_e2e(net, flat, x, "cpu", opts, "fp32")
    assert "rounds" not in res


# -- for real on PoCL --------------------------------------------------------------------------


# slow tier: 5 to 6 s; make test keeps the e2e bench on PoCL (tests/test_bench.py), an fp16
# library against its half model (tests/test_fp16.py) and the check's tolerance of a deep fp16
# library (tests/test_check_spread.py)
@pytest.mark.slow
@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_lenet5_end_to_end_in_fp16_on_pocl(tmp_path):
    """`aotconv bench --sets e2e --e2e lenet5:1 --precision fp16`: the library built in fp16,
    timed, checked against the half model within T, beside PyTorch in half where torch is
    installed (else without a reference)."""
    from aotconv.cli import main
    out = tmp_path / "fp16.json"
    assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:1",
                 "--precision", "fp16", "--refs", "torch" if HAS_TORCH else "none",
                 "--no-tune", "--repeats", "3", "--warmup", "1", "--quiet", "--out", str(out),
                 "--workdir", str(tmp_path / "work")]) == 0
    doc = json.loads(out.read_text())
    row = doc["e2e"][0]
    assert doc["precision"] == row["precision"] == "fp16"
    o = row["ours"]
    assert "error" not in o and o["run_ms"] > 0 and o["kernels_ms"] > 0, o
    assert o["run_pinned_ms"] > 0 and o["computes"] == "fp16"
    assert row["build_dir"].endswith("lenet5-b1-fp16")
    assert "AOTCONV_LENET5_PRECISION \"fp16\"" in \
        (tmp_path / "work" / "lenet5-b1-fp16" / "lenet5.h").read_text()
    c = row["numpy"]
    assert c["reference"] == precision.HalfReference.name and c["images"] == 1
    assert c["within"] and c["error"] <= TOLERANCE
    md = out.with_suffix(".md").read_text()
    assert "### FP16: ours built with --precision fp16" in md and "ours fp16 run() ms" in md
    t = row["torch"]
    if HAS_TORCH:
        assert t["settings"]["dtype"] == "float16" and t["eager_ms"] > 0
        assert 0 < row["max_error"] < 1e-2 and row["ratio_wall"] > 0
    else:
        assert "not asked for" in t["note"] and "max_error" not in row
    # the check of an fp16 library past T is held to T + twice the spread of half's roundings
    from aotconv.compiler import compile_network
    net0 = spec.load_network("lenet5", batch=1)
    flat = params_mod.random_params(net0, seed=0)
    built = compile_network("lenet5", target="pocl-cpu", outdir=tmp_path / "again", batch=1,
                            tune_mode="fallback", quiet=True, measure=False,
                            precision="fp16")
    x = np.random.default_rng(1).standard_normal(net0.input_shape).astype(np.float32)
    y = precision.HalfReference(built.schedule, flat)(x)[0]
    assert numpy_check(built.schedule, net0, flat, x, y, OPTS)["error"] == 0.0
    y[0, 2] += 0.01
    c = numpy_check(built.schedule, net0, flat, x, y, OPTS)
    assert not c["within"] and c["error"] == pytest.approx(0.01, rel=1e-2)
    assert 0 < c["spread"] < 1e-3                  # lenet5: a fraction of an ulp of half
    assert c["tolerance"] == pytest.approx(TOLERANCE + 2 * c["spread"])

"""`aotconv bench` end to end times the emitted library in a process of its own (as an
application runs it, without PyTorch), or with --ours-in-process in the bench's own: the same
figures either way, the output checked against the numpy reference, and a timing process that
fails, crashes or hangs is a one-line error in its row while the next row still runs.
"""
import argparse
import json
import resource
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from aotconv import params as params_mod, spec
from aotconv.bench import e2e, library_timing as lt
from aotconv.harness import close
from aotconv.reference import run_network
from devices import pocl_present

pytestmark = pytest.mark.skipif(not pocl_present(), reason="no PoCL device")

OPTS = argparse.Namespace(repeats=3, warmup=1, max_measure_s=0.05)


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    """lenet5 at batch 2 built with the fallbacks: (build dir, net, parameters, input)."""
    from aotconv.compiler import compile_network
    d = tmp_path_factory.mktemp("timing") / "lenet5-b2"
    compile_network("lenet5", target="pocl-cpu", outdir=d, batch=2, tune_mode="fallback",
                    measure=False, quiet=True)
    net = spec.load_network("lenet5", batch=2)
    flat = params_mod.random_params(net, seed=0)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    return d, net, flat, x


def test_the_child_gives_the_in_process_figures_without_torch(lenet5, tmp_path, monkeypatch):
    """The child's row has the keys of the in-process one, its output is the numpy
    reference's, and it has not loaded torch even where an `import torch` would succeed on
    the sys.path it inherits; the bench's process here has (a stand-in) torch loaded."""
    d, net, flat, x = lenet5
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(fake))           # the child gets the parent's sys.path
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    # the stand-in is importable by a process started with that sys.path, so the assertion
    # below on the child would fail if anything it imports loaded torch
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.LOADED)"],
                           env={"PYTHONPATH": str(fake)}, capture_output=True, text=True)
    assert probe.stdout.strip() == "True", probe.stderr
    own, y_own = lt.in_own_process(d, flat, x, OPTS)
    here, y_here = lt.in_bench_process(d, flat, x, OPTS)
    assert "error" not in own and "error" not in here, (own, here)
    assert set(own) == set(here)
    assert {"run_ms", "kernels_ms", "run_times", "launches", "run_pinned_ms",
            "run_pinned_noprof_ms", "run_resident_ms"} <= set(own)
    assert own["process"] == "own" and here["process"] == "bench"
    assert own["torch_loaded"] is False and here["torch_loaded"] is True
    assert own["launches"] == here["launches"] > 0 and len(own["run_times"]) >= 3
    assert own["run_ms"] > 0 and own["kernels_ms"] > 0 and own["run_pinned_noprof_ms"] > 0
    assert y_own.dtype == np.float32 and y_own.shape == y_here.shape
    want = run_network(net, x, params_mod.split(net, flat))[0]
    ok, err = close(y_own, want)
    assert ok, err
    assert close(y_own, y_here)[0]


# a library whose create() ends its process as a broken driver would
FAILING_CREATE = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int aotconv_lenet5_create(void **out, const void *opts) {
#if MODE == 1
    fprintf(stderr, "lenet5: the driver gave up\n");
    exit(3);
#elif MODE == 2
    fprintf(stderr, "lenet5: about to crash\n");
    raise(SIGSEGV);
#else
    for (;;)
        pause();
#endif
    return 0;
}
"""


def break_library(d, how):
    """Replace the library in build dir `d`: "garbage" bytes, or one whose create() exits
    with status 3 ("exit"), crashes ("segv") or never returns ("hang")."""
    so = d / "liblenet5.so"
    so.unlink()
    if how == "garbage":
        so.write_bytes(b"\x7fELF not a library")
        return
    src = d / "failing.c"
    src.write_text(FAILING_CREATE)
    mode = {"exit": 1, "segv": 2, "hang": 3}[how]
    subprocess.run(["cc", "-shared", "-fPIC", f"-DMODE={mode}", "-o", str(so), str(src)],
                   check=True)


@pytest.fixture
def no_core_files():
    """A crashing child leaves no core file behind (the limit is inherited)."""
    old = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, old)


@pytest.mark.parametrize("how, says", ids=["garbage", "exit", "segv", "hang"], argvalues=[
    ("garbage", "AotconvError: "),
    ("exit", "no result (the timing process exited with status 3: lenet5: the driver gave up)"),
    ("segv", "no result (the timing process was killed by SIGSEGV: lenet5: about to crash)"),
    ("hang", "no result (the timing process was stopped after "),
])
def test_a_failing_child_is_a_one_line_error(lenet5, tmp_path, monkeypatch, no_core_files,
                                             how, says):
    d = tmp_path / "broken"
    shutil.copytree(lenet5[0], d)
    break_library(d, how)
    monkeypatch.setattr(lt, "LOAD_TIMEOUT_S", 2.0)     # the hang: stopped after 2 s
    ours, y = lt.in_own_process(d, lenet5[2], lenet5[3], OPTS)
    assert y is None and ours["process"] == "own"
    assert ours["error"].startswith(says), ours["error"]
    assert "\n" not in ours["error"] and "Traceback" not in ours["error"]
    if how == "garbage":            # raised in the child, reported as in the bench's process
        assert "cannot load the library" in ours["error"] and ours["where"]
    if how == "hang":
        assert "its time limit" in ours["error"]


# slow tier: two builds and their timings, 4 to 9 s; make test keeps a crashed timing process as
# a one-line error (test_a_failing_child_is_a_one_line_error)
@pytest.mark.slow
def test_the_bench_goes_on_after_a_timing_process_crashed(tmp_path, monkeypatch, no_core_files):
    """The first network's library crashes its timing process: that row says so in one line,
    and the next network is built and timed as usual."""
    from aotconv.cli import main
    real = e2e.compile_network
    built = []

    def compile_then_break_the_first(*args, **kwargs):
        out = real(*args, **kwargs)
        if not built:
            break_library(kwargs["outdir"], "segv")
        built.append(kwargs["outdir"])
        return out
    monkeypatch.setattr(e2e, "compile_network", compile_then_break_the_first)
    out = tmp_path / "e2e.json"
    assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:2,lenet5:1",
                 "--no-tune", "--refs", "none", "--repeats", "3", "--warmup", "1", "--quiet",
                 "--out", str(out), "--workdir", str(tmp_path / "work")]) == 0
    rows = json.loads(out.read_text())["e2e"]
    assert len(built) == 2 and [r["batch"] for r in rows] == [2, 1]
    assert rows[0]["ours"]["error"].startswith(
        "run failed: no result (the timing process was killed by SIGSEGV"), rows[0]["ours"]
    assert "error" not in rows[1]["ours"] and rows[1]["ours"]["run_ms"] > 0, rows[1]["ours"]
    assert rows[1]["ours"]["process"] == "own"
    md = out.with_suffix(".md").read_text()
    assert "killed by SIGSEGV" in md


# slow tier: two benches, 8 to 12 s; make test keeps the in-process timing against the child's
# (test_the_child_gives_the_in_process_figures_without_torch)
@pytest.mark.slow
def test_ours_in_process_gives_a_row_of_the_same_keys(tmp_path):
    """`--ours-in-process` times the library in the bench's own process: a row of the same
    keys as the default's, which says where ours was timed."""
    from aotconv.cli import main
    rows = {}
    for how in ("own", "bench"):
        out = tmp_path / f"{how}.json"
        assert main(["bench", "--target", "pocl-cpu", "--sets", "e2e", "--e2e", "lenet5:2",
                     "--no-tune", "--refs", "none", "--repeats", "3", "--warmup", "1",
                     "--quiet", "--out", str(out), "--workdir", str(tmp_path / "work")]
                    + (["--ours-in-process"] if how == "bench" else [])) == 0
        doc = json.loads(out.read_text())
        rows[how] = doc["e2e"][0]
        assert any("--ours-in-process" in n for n in doc["notes"]) == (how == "bench")
    own, here = rows["own"], rows["bench"]
    assert "error" not in own["ours"] and "error" not in here["ours"], (own, here)
    assert set(own) == set(here) and set(own["ours"]) == set(here["ours"])
    assert own["ours"]["process"] == "own" and here["ours"]["process"] == "bench"
    assert own["ours"]["torch_loaded"] is False


def test_a_timing_process_that_cannot_start_is_a_one_line_error(lenet5, tmp_path, monkeypatch):
    missing = tmp_path / "no-such-python"
    monkeypatch.setattr(sys, "executable", str(missing))
    ours, y = lt.in_own_process(lenet5[0], lenet5[2], lenet5[3], OPTS)
    assert y is None and ours["process"] == "own"
    assert ours["error"].startswith("FileNotFoundError: ") and str(missing) in ours["error"]
    assert "\n" not in ours["error"]


def test_the_device_resident_timing_runs_on_the_librarys_device_and_says_when_it_cannot(
        lenet5, monkeypatch):
    """resident_run: run_buffers() on an input already on the device, its output equal to
    run()'s; where no device here is the library's, a sentence instead of a time, and the
    table's figure falls back to the pinned run and says so."""
    from aotconv.bench.report import best_ours, best_ours_way
    d, net, flat, x = lenet5
    want = run_network(net, x, params_mod.split(net, flat))[0]
    with lt.load(d) as lib:
        lib.set_params(flat)
        y = lib(x)
    assert close(y, want)[0]
    got = lt.resident_run(d, flat, x, y, 1, 3)
    assert set(got) == {"run_resident_ms"} and got["run_resident_ms"] > 0, got
    # an output other than run()'s is reported, not timed
    got = lt.resident_run(d, flat, x, y + 1, 1, 3)
    assert "differs" in got["run_resident_error"], got
    monkeypatch.setenv("AOTCONV_DEVICE", "no such device anywhere")
    got = lt.resident_run(d, flat, x, y, 1, 3)
    assert got == {"run_resident_error": "no OpenCL device here matches AOTCONV_DEVICE "
                                         "'no such device anywhere'"}
    o = {"run_ms": 3.0, "run_pinned_ms": 2.0, "run_pinned_noprof_ms": 1.5}
    assert (best_ours(o), best_ours_way(o)) == (1.5, "from pinned buffers")
    o["run_resident_ms"] = 1.2
    assert (best_ours(o), best_ours_way(o)) == (1.2, "input on the device")


def test_a_resident_round_times_the_device_resident_run_alone(lenet5):
    """--e2e-rounds' later rounds: the child times run_buffers() alone, its output that of
    run(); the parent turns it into a time, or a sentence where the output moved."""
    d, net, flat, x = lenet5
    ours, y = lt.in_own_process(d, flat, x, OPTS, resident_only=True)
    assert set(ours) == {"run_resident_ms", "process", "torch_loaded"}, ours
    assert ours["run_resident_ms"] > 0 and ours["torch_loaded"] is False
    want = run_network(net, x, params_mod.split(net, flat))[0]
    assert close(y, want)[0]
    got = e2e.resident_round(lt.in_own_process, d, flat, x, y, OPTS)
    assert isinstance(got, float) and got > 0
    assert e2e.resident_round(lt.in_bench_process, d, flat, x, y + 1, OPTS) == \
        "the output differs from the first round's"


def test_rounds_are_summarised_per_round_and_in_the_median():
    from aotconv.bench.report import e2e_table
    ours = {"run_resident_ms": 1.60}
    ref = {"best": "compile_reduce_overhead_ms", "best_ms": 1.50,
           "rounds": [{"ours": 1.50, "reference": 1.60}, {"ours": "no OpenCL device",
                                                          "reference": 1.55},
                      {"ours": 1.55, "reference": 1.60}]}
    z = e2e.rounds_summary(ours, ref)
    assert z["way"] == "compile_reduce_overhead" and z["rounds"] == 4
    assert z["ratios"] == [round(1.6 / 1.5, 4), round(1.5 / 1.6, 4), round(1.55 / 1.6, 4)]
    assert z["ratio_median"] == pytest.approx(1.55 / 1.6)
    assert z["ahead"] == 2 and z["notes"] == ["no OpenCL device"]
    assert z["ours"] == [1.60, 1.50, None, 1.55]
    row = {"net": "vgg16", "batch": 16, "ours": {**ours, "launches": 20},
           "torch": {**ref, "eager_ms": 2.0, "compile_reduce_overhead_ms": 1.5},
           "ratio_best": 1.6 / 1.5, "rounds": z}
    md = e2e_table([row], "torch")
    line = next(l for l in md.splitlines() if l.startswith("| vgg16 | 16 | compile_reduce"))
    assert "| 4 | 1.550 (1.500-1.600) | 1.575 (1.500-1.600) | 1.07, 0.94, 0.97 | 0.969 | " \
        "2 of 3 | (no OpenCL device)" in line, line

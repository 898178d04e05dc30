"""The measurement protocol (aotconv.protocol): its rules on a recording subject (device-free),
that the tuner, the bench and the tools follow it rather than rules of their own, and, on
PoCL, that a kernel which leaves part of its output unwritten is caught the same way by the
tuner's runner and by the bench, and that kernel_probe measures through it.
"""
import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

from aotconv import protocol
from aotconv.bench.sets import conv_layer
from aotconv.harness import random_inputs
from aotconv.space import Candidate
from aotconv.targets import get_target, find_device, with_limits
from aotconv.tune.measure import Measurer, Status
from aotconv.variants.base import In, Knob, Launch, Out, Variant
from devices import pocl_present

ROOT = Path(__file__).resolve().parent.parent
POCL = get_target("pocl-cpu")


class Recorder:
    """A subject that records what the protocol asks of it; `writes`: whether a launch writes
    the output (a kernel that does not leaves what was there)."""

    def __init__(self, copies, out, writes=True):
        self.copies, self.out, self.writes = copies, np.asarray(out, np.float32), writes
        self.buf = self.out.copy()                 # what an earlier, correct run left there
        self.calls = []

    def poison(self):
        self.calls.append("poison")
        self.buf[...] = np.nan

    def _launch(self, kind, i):
        self.calls.append((kind, i % self.copies))
        if self.writes:
            self.buf[...] = self.out

    def run(self, i):
        self._launch("run", i)

    def timed(self, i):
        self._launch("timed", i)
        return 1.0 + i % self.copies

    def finish(self):
        self.calls.append("finish")

    def ms(self, h):
        return h

    def output(self):
        self.calls.append("output")
        return self.buf.copy()


@pytest.fixture(scope="module")
def small():
    layer, _ = conv_layer(("t", 2, 3, 7, 5, 4, 3, 3, 1, 1))
    xs, params = random_inputs(layer, np.random.default_rng(0))
    return layer, xs, params


# -- the rules ---------------------------------------------------------------------------------

def test_verify_poisons_the_output_before_the_checked_run(small):
    layer, xs, params = small
    ref = protocol.Reference(layer, xs, params)
    good = Recorder(1, ref.expected())
    check, ms = protocol.verify(good, ref)
    assert check["ok"] and check["images"] == 2 and ms == 1.0
    assert good.calls == ["poison", ("timed", 0), "finish", "output"]
    # a kernel that writes nothing: what an earlier correct run left is poisoned away
    lazy = Recorder(1, ref.expected(), writes=False)
    check, _ = protocol.verify(lazy, ref)
    assert check["ok"] is False and check["error"] == math.inf


def test_the_hybrid_tolerance_and_the_checked_images(small):
    layer, xs, params = small
    ref = protocol.Reference(layer, xs, params)
    exp = ref.expected()
    scale = np.maximum(1.0, np.abs(exp))
    assert ref.check(exp + 0.9 * protocol.TOLERANCE * scale)["ok"]
    assert not ref.check(exp + 1.1 * protocol.TOLERANCE * scale)["ok"]
    assert ref.check(exp + 1.1 * protocol.TOLERANCE * scale, tol=2e-3)["ok"]
    wrong_second = exp.copy()
    wrong_second[1] += 1.0
    assert not ref.check(wrong_second)["ok"]
    first = protocol.Reference(layer, xs, params, images=1)       # the bench's --verify-images
    got = first.check(wrong_second)
    assert got["ok"] and got["images"] == 1
    skipped = protocol.Reference(layer, xs, params, images=1, max_gflop=1e-9)
    assert "GFLOP" in skipped.check(wrong_second)["skipped"]


def test_timing_rotates_over_the_copies_after_the_warm_up():
    r = Recorder(3, np.zeros(4))
    times = protocol.time_repeats(r, 2, 4)
    assert r.calls == [("run", 0), ("run", 1), "finish", ("timed", 2), ("timed", 0),
                       ("timed", 1), ("timed", 2), "finish"]
    assert times == [3.0, 1.0, 2.0, 3.0]
    r.calls.clear()
    assert protocol.estimate_ms(r) == 3.0 and r.calls == [("timed", 2), "finish"]
    assert protocol.median(times) == 2.5


def test_copies_spill_the_last_level_cache_twice_within_the_limits():
    mib, gib = 1 << 20, 1 << 30
    assert protocol.copies(10 * mib, 32 * mib, 80 * gib) == 7            # ceil(64 / 10)
    assert protocol.copies(1 * mib, 32 * mib, 80 * gib) == protocol.MAX_COPIES == 16
    assert protocol.copies(10 * mib, 0, 80 * gib) == 1                    # no cache known
    assert protocol.copies(10 * mib, 32 * mib, 240 * mib) == 3            # 1/8 of the memory
    assert protocol.copies(100 * mib, 32 * mib, 80 * mib) == 1            # never fewer than 1
    layer, _ = conv_layer(("t", 1, 3, 8, 8, 4, 3, 3, 1, 1))
    assert protocol.layer_footprint(layer) == 4 * (3 * 64 + 4 * 64 + 4 * 3 * 9)


def test_the_repeat_policies():
    class O:
        repeats, warmup, max_measure_s = 30, 5, 3.0
    assert protocol.counts(0.01, O) == (5, 30)
    assert protocol.counts(1000.0, O) == (1, 3)
    assert protocol.repeats_for_total(0.5, 20.0, 5, 30) == 30           # capped
    assert protocol.repeats_for_total(1.0, 20.0, 5, 30) == 20
    assert protocol.repeats_for_total(10.0, 20.0, 5, 30) == 5            # at least lo
    assert protocol.repeats_for_total(0.0, 20.0, 5, 30) == 30


# -- written once ------------------------------------------------------------------------------

CALLERS = ["aotconv/tune/measure.py", "tools/kernel_probe.py", "tools/splitk_stress.py",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "aotconv" / "bench").rglob("*.py"))]
# what running a kernel by hand needs: a caller that names one of these has rules of its own
BY_HAND = {"LayerRun", "poison_output", "read_output", "to_layout", "from_layout",
           "enqueue_nd_range_kernel", "MAX_COPIES"}


@pytest.mark.parametrize("path", CALLERS)
def test_callers_measure_through_the_protocol_only(path):
    tree = ast.parse((ROOT / path).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & BY_HAND, f"{path} runs kernels by hand: {sorted(names & BY_HAND)}"


# -- on PoCL: one decision for the tuner and the bench -----------------------------------------

HALF = """__kernel void k(__global const float* x, __global float* y)
{ const int i = get_global_id(0); if (i < %d) y[i] = fmax(x[i], 0.0f); }"""


class HalfRelu(Variant):
    """A relu that writes only the first half of its output."""
    name = "half_relu"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"

    def knobs(self, layer, target):
        return [Knob("WG", (8,))]

    def render(self, layer, cfg, prefix):
        return HALF % (int(np.prod(layer.out_shape)) // 2)

    def launches(self, layer, cfg, prefix):
        return [Launch("k", (In(0), Out()), (int(np.prod(layer.out_shape)),), (8,))]


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_an_unwritten_output_is_wrong_for_the_tuner_and_for_the_bench(monkeypatch, tmp_path):
    from aotconv.bench.device import Device
    from aotconv.spec import network_from_dict
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path))
    layer = network_from_dict({"name": "h", "input": [1, 2, 4, 4], "layers": [
        {"name": "r", "op": "relu"}]}).layers[0]
    v = HalfRelu()
    cfg = v.fallback(layer, POCL)
    live = with_limits(POCL, find_device(POCL)[1])
    with Measurer(live, jobs=0) as m:
        [tuned] = m.measure(layer, [Candidate(v.name, cfg)], {v.name: v})
    assert tuned.status == Status.WRONG and tuned.error == math.inf     # NaN: poisoned first
    dev = Device(POCL)
    xs, params = random_inputs(layer, np.random.default_rng(1))
    k = protocol.Kernel(dev.ctx, dev.queue, layer, v, cfg, xs, params, 3)
    check, _ = protocol.verify(k, protocol.Reference(layer, xs, params))
    assert check["ok"] is False and check["error"] == math.inf


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_kernel_probe_measures_a_case_by_the_protocol(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("kernel_probe", ROOT / "tools" /
                                                  "kernel_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    from aotconv.variants import BY_NAME
    t = ["tiny", 2, 4, 6, 6, 8, 3, 3, 1, 1]
    layer, _ = conv_layer(tuple(t))
    cfg = BY_NAME["conv_direct"].fallback(layer, POCL)
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"name": "direct", "layer": t, "variant": "conv_direct",
                                  "cfg": str(cfg)},
                                 {"name": "opts", "layer": t, "variant": "conv_direct",
                                  "cfg": str(cfg), "options": "-cl-fast-relaxed-math"}]))
    assert probe.main([str(cases), "--out", str(tmp_path / "o"), "--target", "pocl-cpu",
                       "--repeats", "3"]) == 0
    rows = json.loads((tmp_path / "o" / "probe.json").read_text())
    assert [r["name"] for r in rows] == ["direct", "opts"]
    for r in rows:
        assert "error" not in r, r
        assert r["verify"]["ok"] and r["verify"]["images"] == 1 and r["ms"] > 0
        assert (tmp_path / "o" / f"{r['name']}.bin").stat().st_size > 0
    assert rows[1]["options"] == "-cl-fast-relaxed-math"


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_clblast_is_poisoned_and_checked_like_ours():
    from aotconv.bench.device import Device
    from aotconv.bench.refs import clblast
    if not clblast.available()[0]:
        pytest.skip("libclblast is not installed")
    dev = Device(POCL)
    layer, _ = conv_layer(("t", 1, 4, 6, 6, 4, 3, 3, 1, 1))
    xs, params = random_inputs(layer, np.random.default_rng(2))
    conv = clblast.ClblastConv(dev.ctx, dev.queue, layer, xs[0], params["weight"], copies=2)
    ref = protocol.Reference(layer, xs, params)
    check, ms = protocol.verify(conv, ref)
    assert check["ok"] and ms > 0
    conv.poison()
    assert np.isnan(conv.output()).all()
    assert len(protocol.time_repeats(conv, 1, 3)) == 3


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_a_program_is_loaded_from_its_binary_else_built_from_the_source():
    """The tuner's runner gets binaries from its builder processes (on a GPU): a binary the
    driver takes is used as it is, one it refuses falls back to the source."""
    from aotconv.bench.device import Device
    from aotconv.errors import KernelBuildError
    dev = Device(POCL)
    src = "__kernel void k(__global float* y) { y[get_global_id(0)] = 2.0f; }"
    opts = ["-cl-mad-enable"]
    binary = bytes(protocol.build(dev.ctx, dev.device, src, opts).binaries[0])
    assert protocol.build(dev.ctx, dev.device, "not OpenCL", opts, binary=binary).k
    assert protocol.build(dev.ctx, dev.device, src, opts, binary=b"not a binary").k
    with pytest.raises(KernelBuildError):
        protocol.build(dev.ctx, dev.device, "not OpenCL", opts, binary=b"not a binary",
                       name="nonsense")


def test_a_whole_network_is_warmed_and_timed_for_a_stated_wall_time():
    from types import SimpleNamespace
    from aotconv.protocol import E2E_TOTAL_MS, E2E_WARM_MS, counts, e2e_counts
    opts = SimpleNamespace(repeats=30, warmup=5, max_measure_s=3.0)
    # a 0.3-ms network: five warm-up runs were 1.5 ms; now at least E2E_WARM_MS of them
    w, r = e2e_counts(0.3, opts)
    assert w * 0.3 >= E2E_WARM_MS and r * 0.3 >= E2E_TOTAL_MS
    assert (w, r) != counts(0.3, opts)
    # a slow network keeps the bench's counts, and --max-measure-s still bounds the runs
    assert e2e_counts(400.0, opts) == counts(400.0, opts)
    w, r = e2e_counts(0.3, SimpleNamespace(repeats=30, warmup=5, max_measure_s=0.05))
    assert w * 0.3 <= 50 + 0.3 * 5 and r * 0.3 <= 50 + 0.3 * 30

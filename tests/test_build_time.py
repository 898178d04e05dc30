"""Where a build's time goes (aotconv.buildtime) and a whole build under a tiny time budget.

The phases add up to the wall time (a phase inside another is not counted twice); the build
log's last line and report.md name them with the budget. On PoCL, with a stand-in measurer: a
budget the build's floor cannot fit is said before anything is measured, with a figure the
build then keeps to.
"""
import re
import time

import pytest

from aotconv import buildtime
from aotconv.buildtime import BuildTimes, phase


class Ticks:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_phases_count_their_own_time_and_add_up_to_the_wall_time():
    t = Ticks()
    times = BuildTimes(clock=t)
    t.now += 1.0                                  # before any phase: the set-up
    times.lap("setup")
    with times.active():
        with phase("search"):
            t.now += 2.0
            with phase("spaces"):                 # inside the search, not counted to it
                t.now += 5.0
            t.now += 3.0
        with phase("spaces"):                     # a second enumeration adds to the first
            t.now += 0.5
        with phase("library"):
            t.now += 4.0
    t.now += 0.25                                 # after the phases: other
    assert times.seconds == {"setup": 1.0, "search": 5.0, "spaces": 5.5, "library": 4.0}
    assert times.line() == ("time: setup 1.0 s, spaces 5.5 s, search 5.0 s, library 4.0 s, "
                            "other 0.2 s; 15.8 s in all")
    times.budget = "90 s"
    assert times.line(head="Build time").endswith("; 15.8 s in all, budget 90 s")
    with times.active(), phase("run"):            # a phase gone through is named, however short
        t.now += 0.01
    assert "library 4.0 s, run 0.0 s, other 0.2 s; 15.8 s in all" in times.line()


def test_a_phase_outside_a_timed_build_times_nothing():
    times = BuildTimes(clock=Ticks())
    with phase("search"):                         # no active BuildTimes
        pass
    assert times.seconds == {} and buildtime._ACTIVE.get() is None
    with times.active():
        with phase("search"):
            pass
    assert buildtime._ACTIVE.get() is None and "search" in times.seconds


def test_a_tiny_budget_is_said_before_anything_is_measured(tmp_path, monkeypatch, capfd):
    """A three-layer network under --budget 3s, its layers measured by a stand-in that takes
    0.4 s a layer: the floor (spaces, one measurement per layer, the library) is past 3.3 s,
    so the build warns before its first measurement, with a figure it then keeps to; the log's
    last line and report.md give the phases and the budget."""
    from aotconv.compiler import compile_network
    from aotconv.context import BuildContext
    from aotconv.tune.measure import MeasurerBase, Outcome, Status
    from aotconv.tune.progress import Progress

    class Device(MeasurerBase):
        first = None

        def measure(self, layer, candidates, variants=None, on_outcome=None):
            Device.first = Device.first or time.monotonic()
            time.sleep(0.4)
            out = [Outcome(Status.OK, time_ms=0.5, times=(0.5,), build_s=0.2)
                   for _ in candidates]
            for c, o in zip(candidates, out):
                on_outcome(c, o)
            return out

    warned = []
    real_warn = Progress.warn

    def warn(self, text):
        warned.append((time.monotonic(), text))
        real_warn(self, text)
    monkeypatch.setattr(Progress, "warn", warn)
    monkeypatch.setattr(BuildContext, "measurer", lambda self: Device())
    # the stand-in's outcomes go to records of this test's own (and none are there before)
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    net = tmp_path / "tiny.yaml"
    net.write_text("name: tiny\ninput: [1, 4, 8, 8]\nlayers:\n"
                   "  - {name: c, op: conv, out: 4, kernel: 1}\n"
                   "  - {name: p, op: maxpool, kernel: 2}\n"
                   "  - {name: d, op: dense, out: 5}\n")
    ctx = BuildContext.make("pocl-cpu", mode="fallback")
    if not ctx.present:
        pytest.skip("PoCL is not present")
    t0 = time.monotonic()
    res = compile_network(str(net), target="pocl-cpu", outdir=tmp_path / "o", budget="3s",
                          quiet=False)
    took = time.monotonic() - t0
    budget_warnings = [(t, w) for t, w in warned if w.startswith("budget 3 s")]
    assert len(budget_warnings) == 1 and budget_warnings[0][0] < Device.first
    need = float(re.search(r"needs about (\d+) s", budget_warnings[0][1]).group(1))
    assert need > 3.3 and took <= 1.1 * need + 1, (need, took)
    err = capfd.readouterr().err.splitlines()
    last = err[-2] if err[-1].endswith("report.md") else err[-1]
    assert re.fullmatch(r"aotconv: time: (setup [\d.]+ s, )?spaces [\d.]+ s, search [\d.]+ s, "
                        r".*library [\d.]+ s, run [\d.]+ s.*; [\d.]+ s in all, budget 3 s "
                        r"\(the library's reserve \d+ s\)", last)
    phases = re.findall(r"([a-z ]+) ([\d.]+) s", last[len("aotconv: time:"):last.index(";")])
    total = float(re.search(r"([\d.]+) s in all", last).group(1))
    assert abs(sum(float(s) for _, s in phases) - total) < 0.3      # each rounded to 0.1 s
    report = (tmp_path / "o" / "report.md").read_text()
    assert re.search(r"^Build time up to this report: .*spaces .* budget 3 s \(the library's "
                     r"reserve \d+ s\)\.$", report, re.M)
    assert res.times is not None and res.runs >= 1

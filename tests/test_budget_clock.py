"""A time budget is one clock for the whole build (aotconv.tune.search.Clock), device-free: a
measurer that takes a fixed time per candidate stands in for the device.

Before the clock, every choose() of a build (the network's, then the pool-fusion, residual and
layout-conversion searches) got the whole budget again, a batch begun just before a layer's
deadline ran to its end, every variant's fallback was owed whatever the time, and nothing was
kept for building the library: lenet5 --budget 30s took 64 s on PoCL.
"""
import time

import pytest

from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Status
from aotconv.tune.progress import Progress
from aotconv.tune.records import Store
from aotconv.tune.search import Clock, parse_budget, tune_network, unique_layers
from aotconv.tune.strategies import Evaluator, Exhausted
from aotconv.tune.strategies.base import Pace

POCL = get_target("pocl-cpu")


class Slow(MeasurerBase):
    """Every candidate takes `per` seconds and `build` seconds of it compiling."""

    def __init__(self, per, build=0.01):
        self.per, self.build, self.count = per, build, 0

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        out = []
        for c in candidates:
            time.sleep(self.per)
            self.count += 1
            o = Outcome(Status.OK, time_ms=1.0 + 0.001 * self.count, times=(1.0,),
                        build_s=self.build)
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


class Warnings(Progress):
    def __init__(self):
        super().__init__("quiet")
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)


def groups_of(layers):
    net = network_from_dict({"name": "n", "input": [1, 8, 16, 16], "layers": layers})
    return unique_layers(net.layers)


ELTWISE = [{"name": f"a{i}", "op": op} for i, op in enumerate(["relu", "tanh", "sigmoid"])]


def test_a_batch_is_cut_to_what_fits_before_the_deadline():
    pace = Pace(0.05)
    calls = []

    def measure(idx):
        calls.append(list(idx))
        time.sleep(0.05 * len(idx))
        return [1.0] * len(idx)

    ev = Evaluator(100, measure, trials=100, deadline=time.monotonic() + 0.17, pace=pace)
    t0 = time.monotonic()
    with pytest.raises(Exhausted):
        ev(range(16))
    assert calls == [[0, 1, 2]]                # 3 x 0.05 s fit in 0.17 s; 16 would take 0.8 s
    assert time.monotonic() - t0 < 0.3
    assert pace.count == 3 and abs(pace.per - 0.05) < 0.03


def test_under_a_deadline_only_one_trial_is_owed():
    ev = Evaluator(10, lambda idx: [1.0] * len(idx), trials=10,
                   deadline=time.monotonic() - 1, min_trials=1, pace=Pace(1.0))
    with pytest.raises(Exhausted):
        ev([3, 4, 5])                           # the fallbacks of three variants
    assert list(ev.visited) == [3]
    # without a deadline every point of the first batch is measured, as before
    ev = Evaluator(10, lambda idx: [1.0] * len(idx), trials=10, min_trials=3)
    assert ev([3, 4, 5]) == [1.0, 1.0, 1.0]


def test_one_clock_for_every_search_of_a_build(tmp_path, monkeypatch):
    """The network's search leaves the later searches and the library their reserves, and
    the later searches (fusion) draw on the same clock instead of a budget of their own."""
    monkeypatch.setattr(search, "FINAL_BASE_S", 0.3)
    monkeypatch.setitem(search.BUILD_DEFAULT, "cpu", 0.2)
    clock = Clock.make("3s", POCL)
    m = Slow(0.1, build=0.2)
    store = Store(write=[tmp_path / "r.jsonl"])
    tune_network(groups_of(ELTWISE), POCL, m, store, None, budget=clock, strategy="random")
    reserve = clock.final_reserve
    assert reserve == pytest.approx(search.FINAL_BASE_S + 3 * 0.2)
    assert clock.follow_up > 0
    assert clock.left() >= reserve + clock.follow_up - 0.15        # one candidate of slack
    first = m.count
    tune_network(groups_of([{"name": "p", "op": "maxpool", "kernel": 2}]), POCL, m, store,
                 None, budget=clock, strategy="random")
    assert m.count > first                                         # at least its fallback
    assert clock.left() >= reserve - 0.15
    assert clock.elapsed() <= 1.1 * (3.0 - reserve)
    assert parse_budget(clock) == parse_budget("3s")


def test_a_budget_given_as_text_starts_its_own_clock(tmp_path):
    m = Slow(0.05)
    t0 = time.monotonic()
    tune_network(groups_of(ELTWISE), POCL, m, Store(write=[tmp_path / "r.jsonl"]), None,
                 budget="2s", strategy="random")
    assert time.monotonic() - t0 <= 1.1 * 2.0


def test_the_build_says_before_it_starts_when_the_minimum_cannot_fit(tmp_path):
    p = Warnings()
    clock = Clock.make("1s", POCL)              # 5 layers at 1.5 s each cannot fit
    layers = ELTWISE + [{"name": "p", "op": "maxpool", "kernel": 2},
                        {"name": "q", "op": "avgpool", "kernel": 2}]
    search.tune_network(groups_of(layers), POCL, Slow(0.01), Store(write=[tmp_path / "r"]),
                        None, budget=clock, strategy="random", progress=p)
    assert len(p.warnings) == 1
    assert p.warnings[0].startswith("budget 1 s: this build needs about")
    assert "7 layers measuring a fallback" in p.warnings[0]       # 5, and 2 pools to fuse


def test_trial_budgets_and_the_default_have_no_clock():
    assert Clock.make("200", POCL) is None and Clock.make(None, POCL) is None
    c = Clock.make("90s", POCL)
    assert c.end - c.start == pytest.approx(90)


def test_the_build_context_starts_the_clock_with_the_build():
    from aotconv.context import BuildContext
    ctx = BuildContext.make("pocl-cpu", mode="fallback", budget="30s")
    assert isinstance(ctx.budget, Clock) and ctx.budget.left() > 29
    assert BuildContext.make("pocl-cpu", mode="fallback", budget="40").budget == "40"


def test_a_batch_is_measured_chunk_by_chunk_at_its_own_pace():
    """The fallbacks of a heavy layer (PoCL: big convs compile for seconds where a pool takes
    a fraction): the shared pace says all fit, the first chunk shows they do not."""
    calls = []

    def measure(idx):
        calls.append(list(idx))
        time.sleep(0.15 * len(idx))
        return [1.0] * len(idx)

    ev = Evaluator(100, measure, trials=100, deadline=time.monotonic() + 0.4,
                   pace=Pace(0.01), chunk=2)
    with pytest.raises(Exhausted):
        ev(range(6))
    assert calls == [[0, 1]] and list(ev.visited) == [0, 1]

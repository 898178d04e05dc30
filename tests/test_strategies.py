"""Every strategy replayed against a recorded exhaustive log (device-free).

tests/data/pocl_conv_tiled.jsonl: every candidate of conv_tiled (plus the conv_direct fallback)
for VGG conv3_2 shrunk by 8, measured on PoCL by
`python -m aotconv.bench.study --target pocl-cpu --scale 8 --layers vgg.conv3_2
 --variants conv_tiled`.
"""
from pathlib import Path
import statistics

import numpy as np
import pytest

from aotconv.errors import AotconvError
from aotconv.tune.replay import Recorded, quality
from aotconv.tune.strategies import STRATEGIES, Evaluator, Exhausted, parse, run

LOG = Path(__file__).parent / "data" / "pocl_conv_tiled.jsonl"
ALL = ["exhaustive", "random", "annealing", "annealing:T=2", "pso", "pso:S=6", "model"]


@pytest.fixture(scope="module")
def rec():
    r = Recorded.from_file(LOG)
    assert len(r.grid) > 100 and np.isfinite(r.costs).sum() > 50
    return r


def test_the_log_is_a_real_measurement(rec):
    assert rec.fallback is not None and rec.fallback.variant == "conv_direct"
    assert {c.variant for c in rec.grid.points} == {"conv_tiled", "conv_direct"}
    assert rec.best > 0 and rec.best < rec.costs[rec.grid.index[rec.fallback]]


@pytest.mark.parametrize("strategy", ALL)
def test_budget_is_respected_and_points_are_unique(rec, strategy):
    trials = len(rec.grid) // 8
    calls = []
    ev = Evaluator(len(rec.grid), lambda idx: calls.extend(idx) or [rec.costs[i] for i in idx],
                   trials=trials)
    run(strategy, rec.grid, ev, np.random.default_rng(3))
    assert len(ev.visited) == trials
    assert len(calls) == len(set(calls)) == trials      # nothing measured twice
    assert ev.best[1] == min(rec.costs[i] for i in calls)
    assert len(ev.trace) == trials and all(a >= b for a, b in zip(ev.trace, ev.trace[1:]))


@pytest.mark.parametrize("strategy", ALL)
def test_seeded_runs_are_reproducible(rec, strategy):
    a = rec.replay(strategy, 20, seed=5)
    b = rec.replay(strategy, 20, seed=5)
    assert a == b


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "model"])
def test_the_whole_space_finds_the_best(rec, strategy):
    found, _ = rec.replay(strategy, len(rec.grid), seed=0)
    assert found == rec.best


def test_model_beats_random_and_the_cltune_strategies(rec):
    """aotconv's own strategy against CLTune's at 1/16 of the space, 20 seeds each."""
    trials = max(4, len(rec.grid) // 16)
    med = {s: statistics.median(quality(rec, s, trials, range(20)))
           for s in ("random", "annealing", "pso", "model")}
    worst = {s: min(quality(rec, s, trials, range(20))) for s in ("random", "model")}
    assert med["model"] >= max(med["random"], med["annealing"], med["pso"]), med
    assert worst["model"] >= worst["random"], worst


def test_resume_replays_the_trajectory_and_measures_only_the_rest(rec):
    """A seeded search interrupted after 6 trials and restarted with those 6 as records
    measures exactly the trials it had not reached."""
    full = Evaluator(len(rec.grid), lambda idx: [rec.costs[i] for i in idx], trials=15)
    run("annealing", rec.grid, full, np.random.default_rng(9))
    order = list(full.visited)
    known = {i: rec.costs[i] for i in order[:6]}
    measured = []
    resumed = Evaluator(len(rec.grid),
                        lambda idx: measured.extend(idx) or [rec.costs[i] for i in idx],
                        trials=15, known=known)
    run("annealing", rec.grid, resumed, np.random.default_rng(9))
    assert list(resumed.visited) == order
    assert measured == order[6:]


def test_evaluator_stops_and_revisits_are_free():
    ev = Evaluator(10, lambda idx: [float(i + 1) for i in idx], trials=3)
    assert ev([4, 4, 2]) == [5.0, 5.0, 3.0]
    assert ev([4]) == [5.0]                       # revisit: free
    with pytest.raises(Exhausted):
        ev([7, 8])                                # one left: 7 is measured, then stop
    assert list(ev.visited) == [4, 2, 7] and ev.best == (2, 3.0)
    with pytest.raises(Exhausted):
        ev([9])


def test_strategy_names_and_options_are_checked():
    assert set(STRATEGIES) >= {"exhaustive", "random", "annealing", "pso", "model"}
    assert parse("annealing:T=6") == ("annealing", {"T": 6.0})
    assert parse("pso:S=6,gamma=0.5") == ("pso", {"S": 6, "gamma": 0.5})
    with pytest.raises(AotconvError, match="unknown strategy"):
        parse("genetic")
    with pytest.raises(AotconvError, match="unknown option"):
        parse("annealing:temperature=3")
    with pytest.raises(AotconvError, match="needs a int"):
        parse("pso:S=many")


def test_report_figures_from_a_recorded_log(rec, tmp_path):
    """BEAST's Fig. 7 (every valid candidate of a layer) and a roofline, from the log's times."""
    pytest.importorskip("matplotlib")
    from aotconv.choose import Choice, Stats
    from aotconv.graph import Network
    from aotconv.report_plots import histogram_png, roofline_png
    from aotconv.targets import TARGETS
    i = int(np.argmin(rec.costs))
    valid = tuple(float(t) for t in rec.valid)
    st = Stats(space=len(rec.grid), tried=len(rec.grid), ok=len(valid), times=valid,
               fallback_ms=float(rec.costs[rec.grid.index[rec.fallback]]), flops=2 * 32 * 49 * 288,
               bytes=4 * (2 * 32 * 49 + 32 * 288), layers=("c1", "c2"))
    c = Choice(rec.grid.points[i].variant, rec.grid.points[i].cfg, rec.best, "tuned", st)
    choices = {"c1": c, "c2": c, "fc": Choice("dense_direct", c.cfg, None, "fallback", Stats())}
    h = histogram_png(choices, tmp_path / "hist.png")
    r = roofline_png(Network("n", (1, 32, 7, 7), [], []), choices, TARGETS["pocl-cpu"],
                     tmp_path / "roof.png")
    for p in (h, r):
        assert p is not None and p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG"
    assert histogram_png({"fc": choices["fc"]}, tmp_path / "none.png") is None

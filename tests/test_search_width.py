"""A search's batch widens where the measurer has room in flight that the searches beside it
leave (strategies.model.wide, Evaluator.width): replayed against the recorded PoCL log of
tests/test_strategies.py, device-free."""
import statistics
from pathlib import Path

import numpy as np

from aotconv.tune.replay import Recorded
from aotconv.tune.strategies import Evaluator, run
from aotconv.tune.strategies.model import wide

LOG = Path(__file__).parent / "data" / "pocl_conv_tiled.jsonl"


def _calls(rec, trials, width=None, seed=3):
    calls = []
    ev = Evaluator(len(rec.grid), lambda idx: calls.append(list(idx)) or
                   [rec.costs[i] for i in idx], trials=trials)
    if width is not None:
        ev.width = lambda: width
    run("model", rec.grid, ev, np.random.default_rng(seed))
    return ev, calls


def test_a_search_with_room_proposes_wider_batches():
    rec = Recorded.from_file(LOG)
    trials = 60
    ev, calls = _calls(rec, trials, width=16)
    assert len(ev.visited) == trials
    flat = [i for c in calls for i in c]
    assert len(flat) == len(set(flat)) == trials                  # nothing measured twice
    # after the random start, batches of 16 (the last one cut to the trials left)
    assert [len(c) for c in calls[1:-1]] and all(len(c) == 16 for c in calls[1:-1]), calls
    _, narrow = _calls(rec, trials)
    assert len(calls) < len(narrow) / 2                           # fewer rounds of waiting


def test_no_room_beyond_the_batch_leaves_the_search_as_it_was():
    rec = Recorded.from_file(LOG)
    a, ca = _calls(rec, 30, width=3, seed=7)
    b, cb = _calls(rec, 30, seed=7)
    assert ca == cb and a.visited == b.visited


def test_wide_batches_still_find_good_points():
    """Wide batches fit `batch` models per round, not one per pick: at the same trials their
    result stays near the narrow search's (median over seeds, within 10%)."""
    rec = Recorded.from_file(LOG)
    trials = max(8, len(rec.grid) // 8)
    narrow = statistics.median(_calls(rec, trials, seed=s)[0].best[1] for s in range(8))
    wide16 = statistics.median(_calls(rec, trials, width=16, seed=s)[0].best[1]
                               for s in range(8))
    assert wide16 <= narrow * 1.10, (wide16, narrow)


def test_wide_never_goes_past_the_trials_left():
    class Ev:
        remaining = 5

        @staticmethod
        def width():
            return 32
    assert wide(Ev, 4) == 5
    Ev.remaining = 2
    assert wide(Ev, 4) == 4          # never below the batch: the evaluator cuts it itself
    assert wide(object(), 4) == 4


def test_tune_layer_shares_the_measurers_capacity_among_the_running_searches(tmp_path):
    """A measurer with room for 12 in flight: a search alone proposes 12 at once, one beside
    another running search 6; the count drops back when the search ends."""
    from aotconv.space import layer_space
    from aotconv.spec import network_from_dict
    from aotconv.targets import get_target
    from aotconv.tune.measure import MeasurerBase, Outcome, Status
    from aotconv.tune.records import Store
    from aotconv.tune.search import Lanes, tune_layer

    pocl = get_target("pocl-cpu")
    layer = network_from_dict({"name": "s", "input": [1, 64, 16, 16], "layers": [
        {"name": "c", "op": "conv", "out": 64, "kernel": 3, "pad": 1}]}).layers[0]
    space = layer_space(layer, pocl)

    class Wide(MeasurerBase):
        capacity = 12

        def __init__(self):
            self.calls = []

        def measure(self, layer, candidates, variants=None, on_outcome=None):
            self.calls.append(len(candidates))
            out = []
            for c in candidates:
                o = Outcome(Status.OK, time_ms=1.0 + len(str(c)) % 7, times=(1.0,))
                out.append(o)
                on_outcome and on_outcome(c, o)
            return out

    def batches(lane):
        m = Wide()
        tune_layer(space, pocl, m, Store(write=[tmp_path / f"{id(m)}.jsonl"]), None,
                   strategy="model", trials=60, lane=lane)
        return m.calls

    alone = batches(None)
    assert max(alone[2:-1]) == 12, alone           # after the seeds and the random start
    lane = Lanes(2)
    lane.active = 1                                # another search is running
    beside = batches(lane)
    assert max(beside[2:-1]) == 6 and lane.active == 1, beside

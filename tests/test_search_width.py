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

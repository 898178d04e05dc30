"""A streaming search keeps the measurer's capacity full (strategies.base, Streaming;
strategies.model): it proposes for the slots that came free instead of waiting for a whole
batch's slowest candidate. Device-free: the recorded PoCL log of tests/test_strategies.py as
costs, and measurements that take a few milliseconds each, some much longer."""
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from aotconv.tune.replay import Recorded
from aotconv.tune.strategies import Evaluator, Exhausted, run
from aotconv.tune.strategies.base import Pace

LOG = Path(__file__).parent / "data" / "pocl_conv_tiled.jsonl"


class Flight:
    """measure() of a measurer that works on every candidate of a call at once, each taking
    `slow` seconds (every seventh point) or `fast`, and returns when the call's slowest is
    done; callable from several threads. It counts the candidates in flight and the seconds
    they kept a slot busy."""

    def __init__(self, costs, fast=0.02, slow=0.2, fail_at=None):
        self.costs, self.fast, self.slow, self.fail_at = costs, fast, slow, fail_at
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.busy = 0.0
        self.measured = []

    def took(self, i):
        return self.slow if i % 7 == 0 else self.fast

    def __call__(self, idx):
        with self.lock:
            self.now += len(idx)
            self.peak = max(self.peak, self.now)
            self.measured.extend(idx)
            self.busy += sum(self.took(i) for i in idx)
        try:
            if self.fail_at is not None and len(self.measured) >= self.fail_at:
                raise RuntimeError("the device went away")
            time.sleep(max(self.took(i) for i in idx))
            return [self.costs[i] for i in idx]
        finally:
            with self.lock:
                self.now -= len(idx)


def _search(rec, trials, width, stream, seed=3, flight=None, **kw):
    flight = flight or Flight(rec.costs)
    ev = Evaluator(len(rec.grid), flight, trials=trials, **kw)
    ev.width = lambda: width
    ev.can_stream = stream
    t0 = time.monotonic()
    run("model", rec.grid, ev, np.random.default_rng(seed))
    ev.drain()
    ev.wall = time.monotonic() - t0
    return ev, flight


@pytest.mark.timing           # a wall-time ratio: the serial tier, not beside another worker
def test_a_streaming_search_keeps_its_slots_full_and_measures_each_point_once():
    rec = Recorded.from_file(LOG)
    trials, width = 64, 8
    ev, f = _search(rec, trials, width, stream=True)
    assert len(ev.visited) == trials and not ev.pending
    assert len(f.measured) == len(set(f.measured)) == trials      # nothing measured twice
    assert set(f.measured) == set(ev.visited)                      # nothing in flight lost
    assert f.peak <= width                                         # never past its width
    # the slots a result frees are filled again at once, where a batch waits for its
    # slowest candidate with the other slots idle
    used = f.busy / (ev.wall * width)
    b, bf = _search(rec, trials, width, stream=False)
    assert used > 0.6 and used > 1.5 * bf.busy / (b.wall * width), (used, bf.busy / b.wall)
    assert ev.wall < 0.75 * b.wall, (ev.wall, b.wall)


def test_without_the_measurer_s_leave_or_with_stream_0_the_search_is_the_batched_one():
    rec = Recorded.from_file(LOG)

    def calls(stream, spec="model"):
        got = []
        ev = Evaluator(len(rec.grid), lambda idx: got.append(list(idx)) or
                       [rec.costs[i] for i in idx], trials=30)
        ev.width = lambda: 8
        ev.can_stream = stream
        run(spec, rec.grid, ev, np.random.default_rng(5))
        return got, ev.visited

    assert calls(False) == calls(True, "model:stream=0")


def test_streaming_finds_points_as_good_at_the_same_trials():
    """Fitted every `batch` results instead of every batch of `width`: at equal trials the
    result stays near the batched search's (median over seeds, within 10%)."""
    rec = Recorded.from_file(LOG)
    trials = max(16, len(rec.grid) // 8)
    batched = statistics.median(_search(rec, trials, 8, False, seed=s,
                                        flight=Flight(rec.costs, 0.001, 0.005))[0].best[1]
                                for s in range(6))
    streamed = statistics.median(_search(rec, trials, 8, True, seed=s,
                                         flight=Flight(rec.costs, 0.001, 0.005))[0].best[1]
                                 for s in range(6))
    assert streamed <= batched * 1.10, (streamed, batched)


def test_a_deadline_puts_in_flight_only_what_fits_and_what_is_in_flight_is_kept():
    """Every candidate 40 ms, 8 in flight: the whole space (231 points) would take 1.2 s; a
    deadline at 0.4 s ends the search near it, the results in flight awaited and kept."""
    rec = Recorded.from_file(LOG)
    f = Flight(rec.costs, fast=0.04, slow=0.04)
    t0 = time.monotonic()
    pace = Pace(default=0.04 / 8)          # 8 in flight: a result every 5 ms
    ev, f = _search(rec, 10_000, 8, True, flight=f, deadline=t0 + 0.4, pace=pace)
    took = time.monotonic() - t0
    assert took < 0.4 + 0.3                # not the 1.2 s of the whole space
    assert 8 <= len(ev.visited) < len(rec.grid) * 0.7
    assert set(f.measured) == set(ev.visited) and not ev.pending
    assert pace.count > 0                  # the pace learnt from the stream


def test_an_error_in_a_measurement_reaches_the_search():
    rec = Recorded.from_file(LOG)
    with pytest.raises(RuntimeError, match="went away"):
        _search(rec, 64, 8, True, flight=Flight(rec.costs, fail_at=20))


def test_trials_count_what_is_in_flight():
    rec = Recorded.from_file(LOG)
    ev = Evaluator(len(rec.grid), Flight(rec.costs), trials=10)
    ev.can_stream = True
    assert ev.stream(2)
    ev(list(range(8)))
    assert ev.remaining == 10 - len(ev.visited) - len(ev.pending)
    ev(list(range(8, 20)))                 # only two more fit in the trials
    ev.drain()
    assert len(ev.visited) == 10
    with pytest.raises(Exhausted):
        ev([30])


# slow tier (tests/conftest.py): a real conv space and two searches, 4.5 to 6.5 s; make test
# keeps the streaming search (the tests above) and tune_layer on real measurers
# (tests/test_lanes.py)
@pytest.mark.slow
def test_tune_layer_streams_with_a_measurer_that_overlaps_and_keeps_every_outcome(tmp_path):
    """A layer's search on a measurer that overlaps its work (streams = True) and has room
    for 8: candidates go in flight one by one while others are still measured, every one
    measured is recorded and in the result, none twice; a measurer that does not overlap is
    asked batch after batch."""
    import random
    from aotconv.space import layer_space
    from aotconv.spec import network_from_dict
    from aotconv.targets import get_target
    from aotconv.tune.measure import MeasurerBase, Outcome, Status
    from aotconv.tune.records import Key, Store
    from aotconv.tune.search import tune_layer

    pocl = get_target("pocl-cpu")
    layer = network_from_dict({"name": "s", "input": [1, 64, 16, 16], "layers": [
        {"name": "c", "op": "conv", "out": 64, "kernel": 3, "pad": 1}]}).layers[0]
    space = layer_space(layer, pocl)

    class Overlapping(MeasurerBase):
        capacity = 8

        def __init__(self, streams):
            self.streams = streams
            self.calls, self.asked = [], []
            self.lock = threading.Lock()
            self.now = self.peak = 0

        def measure(self, layer, candidates, variants=None, on_outcome=None):
            with self.lock:
                self.calls.append(len(candidates))
                self.asked += candidates
                self.now += len(candidates)
                self.peak = max(self.peak, self.now)
            time.sleep(random.Random(str(candidates)).choice((0.002, 0.002, 0.002, 0.02)))
            out = []
            for c in candidates:
                o = Outcome(Status.OK, time_ms=1.0 + len(str(c)) % 7, times=(1.0,))
                out.append(o)
                on_outcome and on_outcome(c, o)
            with self.lock:
                self.now -= len(candidates)
            return out

    m = Overlapping(True)
    store = Store(write=[tmp_path / "s.jsonl"])
    r = tune_layer(space, pocl, m, store, None, strategy="model", trials=60)
    assert len(m.asked) == len(set(m.asked)) == 60
    assert set(r.outcomes) == set(m.asked)
    assert max(m.calls[1:]) == 1 and m.peak > 2          # one by one, several in flight
    recorded = sum(len(store.lookup(Key(layer, p.variant, pocl))) for p in space.parts)
    assert recorded == 60
    batched = Overlapping(False)
    tune_layer(space, pocl, batched, Store(write=[tmp_path / "b.jsonl"]), None,
               strategy="model", trials=60)
    assert max(batched.calls[2:-1]) == 8


def test_a_measurer_signals_every_process_before_it_waits_for_any():
    """close() kills the runner and the builders together: each process is sent its kill
    first, then each is waited for, so their ends (seconds where each holds a GPU context)
    overlap instead of adding up."""
    from aotconv.targets import get_target
    from aotconv.tune.measure import Measurer

    events = []

    class Proc:
        def __init__(self, n):
            self.n = n

        def signal(self):
            events.append(("signal", self.n))

        def reap(self):
            events.append(("reap", self.n))

    m = Measurer(get_target("pocl-cpu"), jobs=0)
    m.runner = Proc(0)
    m._pool = type("Pool", (), {"shutdown": lambda self, wait=False: None})()
    for n in (1, 2, 3):
        m.builders.put(Proc(n))
    m.close()
    kinds = [k for k, _ in events]
    assert sorted(n for _, n in events) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert kinds == ["signal"] * 4 + ["reap"] * 4, events

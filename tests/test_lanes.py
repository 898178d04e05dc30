"""Layer lanes (aotconv.tune.search): several layers searched at once, so that one layer's
compiles overlap another's measurements.

Device-free: a stand-in device whose compiles sleep (in parallel, as a builder pool's do) and
whose runs take the device one at a time shows the wall time falling with lanes, the same
results as one lane, a trial budget kept exactly, the grants of running layers reserved and
their unused trials returned, time budgets shared by the lanes, progress events of layers in
flight, and errors and interrupts ending every lane. On PoCL: the local Measurer called from
two lanes at once (runs one at a time, compiles never beside a timing).
"""
import contextlib
import io
import json
import threading
import time
import zlib

import pytest

from aotconv import cli
from aotconv.errors import AotconvError
from aotconv.spec import network_from_dict
from aotconv.targets import find_device, get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Phases, Status
from aotconv.tune.progress import Progress
from aotconv.tune.records import Store
from aotconv.tune.search import (Budget, Grants, Lanes, lanes_for, run_lanes, tune_network,
                                 unique_layers)

POCL = get_target("pocl-cpu")

# four unique layers: three element-wise (16 points each) and a dense one (about 300)
NET = {"name": "n", "input": [1, 8, 8, 8], "layers": [
    {"name": "r", "op": "relu"},
    {"name": "t", "op": "tanh"},
    {"name": "s", "op": "sigmoid"},
    {"name": "d", "op": "dense", "out": 10}]}


class Device(MeasurerBase):
    """A batch's compiles take `compile_s` together (a pool compiles them side by side); each
    run then takes the device alone for `run_s`. A candidate's time is a fixed function of
    the layer and the candidate, so every run measures the same."""

    def __init__(self, compile_s=0.0, run_s=0.0, lanes=1, fail_layer=None):
        self.compile_s, self.run_s, self.lanes = compile_s, run_s, lanes
        self.fail_layer = fail_layer
        self.device = threading.Lock()
        self.count = 0
        self.calls = 0
        self._count = threading.Lock()

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        with self._count:
            self.calls += 1
        if layer.name == self.fail_layer:
            raise AotconvError(f"the device of layer '{layer.name}' was lost")
        time.sleep(self.compile_s)
        out = []
        for c in candidates:
            with self.device:
                time.sleep(self.run_s)
            h = zlib.crc32(f"{layer.signature_str()} {c}".encode())
            o = Outcome(Status.OK, time_ms=1.0 + h % 1000 / 100, times=(1.0,), build_s=0.01)
            with self._count:
                self.count += 1
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


@pytest.fixture(scope="module")
def groups():
    return unique_layers(network_from_dict(NET).layers)


@pytest.fixture(autouse=True)
def spaces_once(monkeypatch, groups):
    """The layers' spaces enumerated once for the module (the search's own cost, not the
    lanes', and the same whatever the lanes)."""
    spaces = _spaces(tuple(g[0] for g in groups))
    monkeypatch.setattr(search, "layer_spaces",
                        lambda layers, target: [spaces[l.signature_str()] for l in layers])
    monkeypatch.delenv(search.LANES_ENV, raising=False)


_SPACES = {}


def _spaces(layers):
    if not _SPACES:
        from aotconv.space import layer_spaces
        _SPACES.update({l.signature_str(): sp
                        for l, sp in zip(layers, layer_spaces(list(layers), POCL))})
    return _SPACES


def _tune(groups, device, tmp_path, lanes, budget=40, progress=None, name="r.jsonl",
          strategy="model"):
    store = Store(write=[tmp_path / f"{lanes}-{name}"])
    t0 = time.monotonic()
    res = tune_network(groups, POCL, device, store, None, budget=budget, lanes=lanes,
                       seeding=False, progress=progress, strategy=strategy)
    return res, time.monotonic() - t0


# -- the wall time, the results and the budget ------------------------------------------------

@pytest.mark.timing           # a wall-time ratio: the serial tier, not beside another worker
def test_lanes_overlap_compiles_and_keep_the_results(groups, tmp_path):
    """Each layer waits for its batch's compiles (0.1 s) before its short runs: one lane
    leaves the device idle meanwhile, four lanes keep it busy. Same measurements, same
    choices, and the trial budget spent exactly."""
    one, four = Device(0.1, 0.002), Device(0.1, 0.002)
    r1, t1 = _tune(groups, one, tmp_path, lanes=1)
    r4, t4 = _tune(groups, four, tmp_path, lanes=4)
    assert t4 < 0.6 * t1, (t1, t4)
    assert one.count == four.count == 40                  # the budget, exactly
    assert list(r1) == list(r4)                           # network order, whatever finished first
    for sig in r1:
        a, b = r1[sig], r4[sig]
        assert a.best == b.best and a.best_outcome == b.best_outcome
        assert set(a.outcomes) == set(b.outcomes) and a.trials == b.trials
        assert len(a.trace) == len(b.trace)


@pytest.mark.parametrize("budget", [4, 7, 23, 61])
def test_a_trial_budget_is_never_exceeded(groups, tmp_path, budget):
    for lanes in (1, 2, 4):
        d = Device()
        res, _ = _tune(groups, d, tmp_path, lanes, budget=budget, name=f"{budget}.jsonl",
                       strategy="random")
        assert d.count == budget, (lanes, d.count)        # every layer's space is big enough
        assert sum(len(r.trace) for r in res.values()) == budget


def test_running_layers_hold_their_grants_and_return_what_they_leave():
    g = Grants(Budget("trials", 20), [1, 1, 1], [100, 100, 100], lanes=2)
    a, _ = g.start(0)
    b, _ = g.start(1)                     # layer 0 still running: its grant is reserved
    assert (a, b) == (7, 7) and a + b <= 20
    g.done(0, 3)                          # it visited 3 of its 7
    c, _ = g.start(2)
    assert c == 20 - 3 - 7                # its 4 unused trials came back
    g.done(1, 7)
    g.done(2, c)
    assert g.spent == 20
    # a layer's space caps its grant; the rest goes to the layers after it
    g = Grants(Budget("trials", 20), [10, 1, 1], [2, 100, 100], lanes=3)
    assert [g.start(i)[0] for i in range(3)] == [2, 9, 9]
    # fewer trials than layers: each still gets its fallback, as with one lane
    g = Grants(Budget("trials", 2), [1, 1, 1], [9, 9, 9], lanes=3)
    assert [g.start(i)[0] for i in range(3)] == [1, 1, 1]


class Left:
    """A clock with a fixed search time left."""

    def __init__(self, seconds):
        self.seconds = seconds

    def search_left(self):
        return self.seconds


def test_a_time_budget_is_shared_by_the_lanes_running_at_once():
    budget = Budget("seconds", 10)
    one = Grants(budget, [1, 1, 1, 1], [5] * 4, Left(10.0), lanes=1)
    _, d1 = one.start(0)
    two = Grants(budget, [1, 1, 1, 1], [5] * 4, Left(10.0), lanes=2)
    now = time.monotonic()
    _, d0 = two.start(0)
    _, d1b = two.start(1)
    assert d1 - now == pytest.approx(2.5, abs=0.1)        # a quarter of 10 s
    assert d0 - now == pytest.approx(5.0, abs=0.1)        # 2 lanes: 20 lane-seconds, a quarter
    assert d1b - now == pytest.approx(5.0, abs=0.1)       # (20 - 5 held) / 3
    # no deadline passes the clock's end however few layers are left
    last = Grants(budget, [1], [5], Left(10.0), lanes=4)
    assert last.start(0)[1] - time.monotonic() == pytest.approx(10.0, abs=0.1)


def test_a_time_budget_with_lanes_ends_on_time(groups, tmp_path):
    t0 = time.monotonic()
    d = Device(0.05, 0.002)
    tune_network(groups, POCL, d, Store(write=[tmp_path / "r"]), None, budget="1.5s",
                 lanes=3, seeding=False)
    assert time.monotonic() - t0 <= 1.1 * 1.5 and d.count >= len(groups)


# -- progress, errors, interrupts ----------------------------------------------------------------

def test_progress_shows_layers_in_flight_and_trials_by_layer(groups, tmp_path):
    out = io.StringIO()
    _tune(groups, Device(0.05, 0.002), tmp_path, lanes=3, budget=24,
          progress=Progress("json", out))
    events = [json.loads(l) for l in out.getvalue().splitlines()]
    flying, most = set(), 0
    for e in events:
        if e["event"] == "layer_start":
            flying.add(e["layers"][0])
            most = max(most, len(flying))
        elif e["event"] == "layer_done":
            flying.remove(e["layers"][0])
        elif e["event"] == "trial":
            assert e["layer"] in flying               # attributed to its own layer
    assert most == 3 and not flying
    assert sum(e["event"] == "trial" for e in events) == 24
    done = {e["layers"][0]: e["new"] for e in events if e["event"] == "layer_done"}
    assert sum(done.values()) == 24 and len(done) == len(groups)


def test_an_error_in_one_lane_ends_them_all(groups, tmp_path):
    d = Device(0.05, 0.001, fail_layer="t")
    before = threading.active_count()
    with pytest.raises(AotconvError, match="layer 't' was lost"):
        _tune(groups, d, tmp_path, lanes=4, budget=200)
    assert threading.active_count() == before            # every lane has ended
    calls = d.calls
    time.sleep(0.2)
    assert d.calls == calls                               # nothing measures after it


def test_an_interrupt_marks_the_lanes_so_late_outcomes_are_not_recorded():
    lanes = Lanes(2)
    seen = {}
    started = threading.Event()

    def begin(i):
        if i == 1:
            started.wait(5)
            raise KeyboardInterrupt
        return i

    def work(i, args):
        started.set()
        lanes.stop.wait(5)                    # a lane busy measuring when Ctrl-C comes
        seen["interrupted"] = lanes.interrupted

    with pytest.raises(KeyboardInterrupt):
        run_lanes(3, 2, begin, work, lambda i, r: None, lanes)
    time.sleep(0.1)
    assert seen == {"interrupted": True} and lanes.stop.is_set()


def test_how_many_lanes(monkeypatch, capsys):
    class M:
        lanes = 4
    assert lanes_for(M()) == 4 and lanes_for(M(), layers=3) == 3
    assert lanes_for(None) == 1 and lanes_for(M(), 2) == 2
    monkeypatch.setenv(search.LANES_ENV, "3")
    assert lanes_for(M()) == 3 and lanes_for(M(), 1) == 1
    monkeypatch.setenv(search.LANES_ENV, "many")
    with pytest.raises(AotconvError, match="AOTCONV_LANES='many': give a positive number"):
        lanes_for(M())
    with pytest.raises(AotconvError, match="--lanes 0"):
        lanes_for(M(), 0)
    monkeypatch.delenv(search.LANES_ENV)
    rc = cli.main(["tune", "lenet5", "--target", "pocl-cpu", "--lanes", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--lanes 0: give a positive integer" in err and err.count("\n") == 1


def test_compiles_and_runs_of_a_cpu_device_never_overlap():
    phases = Phases()
    log, lock = [], threading.Lock()

    def note(what):
        with lock:
            log.append((what, phases.compiling, phases.running))

    def compile_():
        with phases.compile():
            note("c")
            time.sleep(0.02)

    def run():
        with phases.run():
            note("r")
            time.sleep(0.02)

    threads = [threading.Thread(target=f) for f in [compile_] * 6 + [run] * 3 + [compile_] * 3]
    for t in threads:
        t.start()
        time.sleep(0.003)
    for t in threads:
        t.join(5)
    assert len(log) == 12
    assert all(r == 0 for w, c, r in log if w == "c")        # no compile while a run times
    assert all((c, r) == (0, 1) for w, c, r in log if w == "r")
    # a waiting run goes before the compiles that came after it
    assert [w for w, _, _ in log].index("r") < 9


# -- the local Measurer from two lanes, on PoCL --------------------------------------------------

def test_the_measurer_serves_two_lanes_at_once(tmp_path, monkeypatch):
    """Two layers measured from two threads at once through one Measurer: every candidate
    measured correctly (the runner taken by one at a time, each layer's data kept), and no
    compile beside a timing (Phases)."""
    from aotconv.space import layer_space
    from aotconv.tune.measure import Measurer
    if find_device(POCL) is None:
        pytest.skip("PoCL is not installed")
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    net = network_from_dict({"name": "e", "input": [1, 4, 8, 8], "layers": [
        {"name": "a", "op": "relu"}, {"name": "b", "op": "tanh"}]})
    work = {l.name: (l, layer_space(l, POCL).candidates[:3]) for l in net.layers}
    results, errors = {}, []
    with Measurer(POCL, jobs=2) as m:
        assert m.lanes == 1                              # PoCL's own choice
        seen = []
        runs = m._phases.run

        @contextlib.contextmanager
        def watched():
            with runs():
                seen.append(m._phases.compiling)     # compiles in flight while it times
                yield
        m._phases.run = watched

        def lane(name):
            try:
                layer, cands = work[name]
                for _ in range(2):                   # the layers take turns on the runner
                    results.setdefault(name, []).extend(m.measure(layer, cands))
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=lane, args=(n,)) for n in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors
    for name, outs in results.items():
        assert len(outs) == 6 and all(o.ok for o in outs), [o.message for o in outs]
    assert len(seen) == 12 and not any(seen)


def test_a_gpu_measurer_runs_each_candidate_as_its_build_finishes(tmp_path, monkeypatch):
    """Where compiles overlap runs (a GPU), the runner takes a batch's candidates as their
    builds finish: a slow build first in the batch no longer keeps the others waiting (NVIDIA's
    compiler took 0.16-2.6 s for candidates of one ResNet-50 layer). The outcomes still come
    back in the batch's order."""
    from aotconv.space import layer_space
    from aotconv.tune.measure import Measurer
    if find_device(POCL) is None:
        pytest.skip("PoCL is not installed")
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    net = network_from_dict({"name": "e", "input": [1, 4, 8, 8], "layers": [
        {"name": "a", "op": "relu"}]})
    layer = net.layers[0]
    cands = layer_space(layer, POCL).candidates[:3]
    with Measurer(POCL, jobs=3, overlap=True) as m:
        build = m._build
        from aotconv.variants import BY_NAME
        slow = m._prepare(layer, cands[0], BY_NAME).source

        def slowed(source):
            if source == slow:
                time.sleep(3.0)
            return build(source)
        m._build = slowed
        arrived = []
        outs = m.measure(layer, cands, on_outcome=lambda c, o: arrived.append(c))
    assert all(o.ok for o in outs) and len(outs) == 3
    assert arrived[-1] == cands[0] and sorted(map(str, arrived)) == sorted(map(str, cands))


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_trial_budget_is_shared_by_cost_or_equally(groups, tmp_path, lanes):
    """share_by="cost" (a network's time) gives the dense layer, by far the costliest, more
    trials than the three element-wise ones together; share_by="equal" (the bench's independent
    layers) gives every unique layer the same count; another word is a one-line error."""
    def tried(share_by):
        store = Store(write=[tmp_path / f"{lanes}-{share_by}.jsonl"])
        res = tune_network(groups, POCL, Device(), store, None, budget=24, lanes=lanes,
                           seeding=False, strategy="random", share_by=share_by)
        return {r.layers[0].name: len(r.trace) for r in res.values()}
    by_cost = tried("cost")
    assert by_cost["d"] > by_cost["r"] + by_cost["t"] + by_cost["s"], by_cost
    assert sum(by_cost.values()) == 24
    assert tried("equal") == {"r": 6, "t": 6, "s": 6, "d": 6}
    with pytest.raises(AotconvError, match="budget sharing"):
        tried("fair")

"""A budgeted build spends its time measuring, not waiting: the layers' spaces are enumerated
beside the search (aotconv.space.Spaces, tune.search.NetworkSpaces), the first layers first.

Before, tune_network enumerated every unique layer's space (worker processes, the layers dealt
round-robin into one chunk per worker, all awaited) before the first layer's search started:
ResNet-50 b1 on an H100 spent 12.6 s of a 90-s build there. Device-free: real enumerations of
the h100 profile's conv spaces (about a second each here) and stand-in measurers.
"""
import time
import zlib

import pytest

from aotconv import space as space_mod
from aotconv.space import layer_space, layer_spaces
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Phases, Status
from aotconv.tune.records import Store
from aotconv.tune.search import Clock, tune_network, unique_layers

pytestmark = pytest.mark.timing

H100 = get_target("h100")
POCL = get_target("pocl-cpu")
SCHED_S = 0.15       # seconds of thread scheduling a timed test allows beyond its rule

# a tiny layer first, then convs whose h100 spaces take about a second each to enumerate
HEAVY = {"name": "n", "input": [1, 32, 28, 28], "layers": [
    {"name": "r", "op": "relu"},
    {"name": "c1", "op": "conv", "out": 32, "kernel": 3, "pad": 1},
    {"name": "c2", "op": "conv", "out": 48, "kernel": 3, "pad": 1},
    {"name": "c3", "op": "conv", "out": 64, "kernel": 3, "pad": 1},
    {"name": "c4", "op": "conv", "out": 80, "kernel": 3, "pad": 1}]}


def groups_of(net):
    return unique_layers(network_from_dict(net).layers)


class Fixed(MeasurerBase):
    """Every candidate takes `per` seconds and measures a time that depends on the layer and
    the candidate alone; every call is logged with the time it started."""

    def __init__(self, per=0.0, on_call=None):
        self.per, self.on_call = per, on_call
        self.calls = []

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        self.calls.append((time.monotonic(), layer.name, len(candidates)))
        if self.on_call is not None:
            self.on_call(layer)
        out = []
        for c in candidates:
            time.sleep(self.per)
            ms = 1.0 + (zlib.crc32(f"{layer.signature_str()} {c}".encode()) % 1000) / 100
            o = Outcome(Status.OK, time_ms=ms, times=(ms,), build_s=0.01)
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


def test_the_first_spaces_come_while_the_others_are_enumerated():
    """Two workers take the layers one at a time in order: the tiny first layer's space is
    there long before the last conv's (a space from a worker is the one layer_space
    enumerates: tests/test_space.py)."""
    layers = [g[0] for g in groups_of(HEAVY)]
    t0 = time.monotonic()
    spaces = layer_spaces(layers, H100, jobs=2)
    try:
        first = spaces[0]
        assert not spaces.ready(len(layers) - 1)       # the last conv: still being enumerated
        assert first.candidates == layer_space(layers[0], H100).candidates
        assert len(spaces[1].candidates) > 1000       # the first conv, waited for alone
        assert spaces.seconds(1) > 0.1 and time.monotonic() - t0 > spaces.seconds(1)
    finally:
        spaces.close()


def test_the_first_layers_search_starts_before_the_last_space_is_enumerated(tmp_path,
                                                                             monkeypatch):
    """The search measures its first layer while the convs after it are being enumerated
    (before: only once every space was)."""
    streams, at_first = [], []
    real = search.layer_spaces

    def spied(layers, target, **kw):
        streams.append(real(layers, target, **kw))
        return streams[-1]

    class Seen(Exception):
        pass

    def on_call(layer):
        s = streams[0]
        at_first.append(all(s.ready(i) for i in range(len(s))) if hasattr(s, "ready")
                        else True)
        raise Seen()             # the rest of the search is not what is tested

    monkeypatch.setattr(search, "layer_spaces", spied)
    m = Fixed(on_call=on_call)
    with pytest.raises(Seen):
        tune_network(groups_of(HEAVY), H100, m, Store(write=[tmp_path / "r.jsonl"]), None,
                     strategy="random")
    assert m.calls[0][1] == "r" and at_first == [False]


def test_a_cpu_devices_timing_holds_the_enumeration_back():
    """On a CPU device the enumeration takes the cores as a compile does (measure.Phases):
    no layer is enumerated while a run is being timed, and they come once it ends."""
    layers = [g[0] for g in groups_of(HEAVY)]
    phases = Phases()
    with phases.run():
        spaces = layer_spaces(layers, H100, jobs=2).start(gate=phases.compile)
        try:
            time.sleep(1.2)          # the workers have started and would have sent the relu
            assert not any(spaces.ready(i) for i in range(len(layers)))
        except BaseException:
            spaces.close()
            raise
    try:
        assert len(spaces[0].candidates) == len(layer_space(layers[0], H100).candidates)
    finally:
        spaces.close()


@pytest.mark.parametrize("budget", [None, 30], ids=["default", "trials"])
def test_a_budget_of_trials_or_none_chooses_as_before(tmp_path, monkeypatch, budget):
    """Streamed spaces choose what spaces enumerated first chose: the same candidates
    measured, the same best, under the default budget and under a trial budget (which waits
    for every space: its grants are shared by every layer's size)."""
    net = {"name": "n", "input": [1, 8, 12, 12], "layers": [
        {"name": "c", "op": "conv", "out": 8, "kernel": 3, "pad": 1},
        {"name": "r", "op": "relu"},
        {"name": "p", "op": "maxpool", "kernel": 2},
        {"name": "d", "op": "dense", "out": 10},
        {"name": "s", "op": "softmax"}]}
    groups = groups_of(net)
    monkeypatch.setattr(space_mod, "PARALLEL_MIN_LAYERS", 2)

    def run(store_name):
        store = Store(write=[tmp_path / store_name])
        res = tune_network(groups, POCL, Fixed(), store, None, budget=budget,
                           strategy="random")
        return {sig: (r.best, r.new, sorted(map(str, r.outcomes))) for sig, r in res.items()}

    streamed = run("a.jsonl")
    first = [layer_space(g[0], POCL) for g in groups]
    monkeypatch.setattr(search, "layer_spaces", lambda layers, target, **kw: first)
    assert run("b.jsonl") == streamed


def test_waiting_for_the_spaces_is_kept_out_of_the_shares(tmp_path, monkeypatch):
    """Spaces enumerated here when each layer starts (0.2 s each): a first layer with most of
    the network's cost left the layers after it their one measurement but not the wait for
    their spaces, and the search ran past the clock by about that wait (3.5 to 3.6 s of 3).
    Each wait is the 0.2 s alone: the real spaces are enumerated before the clock starts, so
    the shares do not depend on how fast this machine enumerates them."""
    monkeypatch.setattr(search, "FINAL_BASE_S", 0.0)
    monkeypatch.setitem(search.LIBRARY_S_PER_BYTE, "cpu", 0.0)       # no library to keep
    monkeypatch.setitem(search.END_S, "cpu", 0.0)
    monkeypatch.setitem(search.LATENCY_BASE, "cpu", 0.1)
    monkeypatch.setitem(search.LATENCY_PER_GFLOP, "cpu", 0.0)
    monkeypatch.setitem(search.PACE_DEFAULT, "cpu", 0.05)
    monkeypatch.setattr(space_mod, "PARALLEL_MIN_LAYERS", 100)         # enumerated here
    real = space_mod.layer_space
    net = {"name": "n", "input": [1, 8, 8, 8], "layers": [
        {"name": "d", "op": "dense", "out": 64}] + [
        {"name": f"a{i}", "op": op} for i, op in
        enumerate(["relu", "tanh", "sigmoid", "leaky_relu", "softmax"])]}
    groups = groups_of(net)
    ready = {}

    def key(layer, a, kw):
        return layer.signature_str(), repr(a), repr(sorted(kw.items()))

    for g in groups:
        ready[key(g[0], (), {})] = real(g[0], POCL)

    def slow(layer, target, *a, **kw):
        time.sleep(0.2)
        k = key(layer, a, kw)
        return ready[k] if k in ready and target is POCL else real(layer, target, *a, **kw)
    monkeypatch.setattr(space_mod, "layer_space", slow)
    m = Fixed(per=0.05)
    clock = Clock.make("3s", POCL)
    t0 = time.monotonic()
    tune_network(groups, POCL, m, Store(write=[tmp_path / "r"]), None, budget=clock,
                 strategy="random", seeding=False)
    took = time.monotonic() - t0
    assert {name for _, name, _ in m.calls} == {g[0].name for g in groups}
    assert sum(k for _, name, k in m.calls if name == "d") > 5      # the dense searched
    assert took <= 1.1 * 3.0 + SCHED_S, (took, m.calls)


def test_workers_that_fail_leave_their_layers_to_the_caller(monkeypatch):
    """A worker that cannot start (here: no interpreter) is an optimisation lost, not an
    error: the layers are enumerated in the caller's process, with one warning."""
    import sys
    layers = [g[0] for g in groups_of(HEAVY)][:2]      # the relu and a conv (4 layers: 7 s)
    monkeypatch.setattr(space_mod, "PARALLEL_MIN_LAYERS", 2)     # two are enough for workers
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    spaces = layer_spaces(layers, POCL, jobs=2)
    with pytest.warns(UserWarning, match="parallel space enumeration failed"):
        got = [spaces[i] for i in range(len(layers))]
    for layer, sp in zip(layers, got):
        assert sp.candidates == layer_space(layer, POCL).candidates

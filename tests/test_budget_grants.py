"""A time budget shared among a network's layers by their cost (tune.search.Grants), device-free:
ResNet-50 at batch 1 on the h100 profile (its 30 unique layers, their real cost shares), guided
by records of similar layers, tuned with two lanes by a stand-in with the H100's timing (a
layer's first measurement 1.5-2.5 s, 3-3.3 s for the first layer of each lane, which also
waits for the measuring processes' start; each candidate after it 0.1-0.3 s), every time of it
and of the build (the budget, the latencies expected, the pace, the library's reserve) divided
by TIME_DIV, so that a 90-s build runs in about 11 s.

A guided 90-s build on the H100 measured the fallback alone of layers that started early,
layer1's 3x3 convs (7% of the network's cost) among them, while the layers after them measured
20-50 candidates each. The clock's latency, learnt from the first layers (which had waited for
the processes' start), was twice what the next ones took; those were granted about that latency
and little more, their first batch (the fallback, the seeds, the other variants' fallbacks) was
cut to what fitted at it, the fallback alone, and a cut batch ended the search: when the
fallback's measurement came, sooner than expected, the rest of the layer's time went back to
the pool, for the layers after it.
"""
import random
import time
import zlib

import pytest

from aotconv import passes, spec
from aotconv.ops import is_alias
from aotconv.space import layer_space
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Status
from aotconv.tune.progress import Progress
from aotconv.tune.records import Key, Store
from aotconv.tune.search import Clock, est_seconds, tune_network, unique_layers
from aotconv.variants import for_layer

pytestmark = pytest.mark.timing

H100 = get_target("h100")
TIME_DIV = 8.0
BUDGET_S = 90.0
BEFORE_S = 8.6          # the spaces' enumeration before the search (the H100 builds: 8.6-11 s)
# variants whose spaces take seconds to enumerate (hundreds of thousands of points): the
# search's time is what is tested, and a layer's other variants leave it hundreds of points
HEAVY_SPACES = {"conv_igemm", "conv_im2col", "conv_winograd", "conv_1x1"}


class H100Timing(MeasurerBase):
    """A layer's first measurement takes FIRST seconds (STARTING for the first layer of each
    lane, which also waits for the measuring processes' start and the build's first compiles),
    each candidate after it EACH, drawn per layer from its signature and the call (the same in
    every run), all divided by TIME_DIV."""
    STARTING, FIRST, EACH = (3.0, 3.3), (1.5, 2.5), (0.1, 0.3)
    slots, lanes = 2, 2

    def __init__(self):
        self.seen = set()

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        rng = random.Random(zlib.crc32(layer.signature_str().encode()) + len(candidates))
        first = layer.signature_str() not in self.seen
        self.seen.add(layer.signature_str())
        slow = self.STARTING if len(self.seen) <= self.lanes else self.FIRST
        out = []
        for j, c in enumerate(candidates):
            time.sleep(rng.uniform(*(slow if first and j == 0 else self.EACH)) / TIME_DIV)
            ms = 0.01 + 0.05 * rng.random()
            o = Outcome(Status.OK, time_ms=ms, times=(ms,), build_s=0.4 / TIME_DIV)
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


class Measured(Progress):
    def __init__(self):
        super().__init__("quiet")
        self.deadlines = {}

    def layer_start(self, i, n, group, space, grant, deadline):
        self.deadlines[group[0].signature_str()] = deadline - time.monotonic()


def resnet50_at(batch, leave=HEAVY_SPACES):
    """ResNet-50's unique layers at `batch` as the compiler groups them, and their spaces (of
    the variants not in `leave`)."""
    net = passes.optimise(spec.load_network("resnet50", batch=batch))
    groups = unique_layers([l for l in net.layers if not is_alias(l)])
    spaces = [layer_space(g[0], H100, variants=[v for v in for_layer(g[0])
                                                if v.name not in leave])
              for g in groups]
    return groups, spaces


@pytest.fixture(scope="module")
def resnet50():
    return resnet50_at(1)


def other_networks_records(path):
    """Records of similar layers measured before (a guided build's): ResNet-50's at batch 2,
    a few points of each variant, so that each layer of batch 1 has seeds."""
    store = Store(write=[path])
    rng = random.Random(7)
    for g, sp in zip(*resnet50_at(2)):
        for part in sp.parts:
            for cfg in part.points[:4]:
                store.append(Key(g[0], part.variant, H100), cfg,
                             Outcome(Status.OK, time_ms=0.01 + 0.05 * rng.random(),
                                     times=(0.02,)))
    return store


def h100_build_at(monkeypatch, groups, spaces):
    """The h100 profile's clock constants divided by TIME_DIV, and the spaces given."""
    for table in (search.LATENCY_BASE, search.LATENCY_PER_GFLOP, search.PACE_DEFAULT,
                  search.LIBRARY_S_PER_BYTE, search.END_S, search.BUILD_REF):
        monkeypatch.setitem(table, "gpu", table["gpu"] / TIME_DIV)
    monkeypatch.setattr(search, "FINAL_BASE_S", search.FINAL_BASE_S / TIME_DIV)
    monkeypatch.setattr(search, "GROUPS_START_S", search.GROUPS_START_S / TIME_DIV)
    monkeypatch.setattr(search.os, "cpu_count", lambda: 16)      # the H100's host
    by_sig = {g[0].signature_str(): sp for g, sp in zip(groups, spaces)}
    monkeypatch.setattr(search, "layer_spaces",
                        lambda layers, target: [by_sig[l.signature_str()] for l in layers])


# slow tier (tests/conftest.py): a scaled 90-s ResNet-50 search, 7 to 8 s of the timing tier;
# make test keeps the grants and a layer's share after a late first measurement
# (tests/test_budget_clock.py: test_grants_keep_each_later_layer_its_measurement,
# test_a_layer_keeps_its_share_after_a_late_first_measurement)
@pytest.mark.slow
def test_the_layers_that_start_first_measure_their_share(tmp_path, monkeypatch, resnet50):
    """Every layer of 5% or more of the network's cost measures at least two fifths of its
    share of the candidates measured (and 4), whatever its place in the network (before: layer1's
    3x3 convs 1 to 3 of about 230, 7% of the cost); the search leaves the library and the
    searches after it their reserves (the build within 10% of its budget)."""
    groups, spaces = resnet50
    h100_build_at(monkeypatch, groups, spaces)
    budget = BUDGET_S / TIME_DIV
    clock = Clock.make(f"{budget}s", H100, start=time.monotonic() - BEFORE_S / TIME_DIV)
    progress = Measured()
    store = other_networks_records(tmp_path / "r.jsonl")
    res = tune_network(groups, H100, H100Timing(), store, None, budget=clock,
                       strategy="random", progress=progress)
    # the search's end leaves the rest of the build its reserves, within the budget's 10%
    assert clock.elapsed() + clock.final_reserve + clock.follow_up <= 1.1 * budget
    weights = [est_seconds(g[0], H100) * len(g) for g in groups]
    total = sum(r.new for r in res.values())
    rows = [(g[0].name, w / sum(weights), res[g[0].signature_str()].new,
             progress.deadlines[g[0].signature_str()]) for g, w in zip(groups, weights)]
    table = "\n".join(f"{n:24s} {s:6.1%} {k:3d} measured, {d:.2f} s granted"
                      for n, s, k, d in rows)
    heavy = [(n, s, k) for n, s, k, _ in rows if s >= 0.05]
    assert len(heavy) >= 6, table        # layer1's, layer2's and layer3's 3x3 convs among them
    for name, part, new in heavy:
        assert new >= max(4, 0.4 * part * total), f"{name}:\n{table}"

"""A search on the device times the fastest recorded points of its layer again before they
decide (tune.search, Rechecks): a record that was low by chance in another run does not win.

Device-free, through a measurer whose times come from a table."""
import pytest

from aotconv.errors import AotconvError
from aotconv.context import BuildContext
from aotconv.space import layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.variants import BY_NAME

POCL = get_target("pocl-cpu")
VARIANT = "conv_direct"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")


class Table(MeasurerBase):
    """Times from a dict (1.0 ms for a point it does not name); records what was asked."""

    def __init__(self, times):
        self.times, self.asked = times, []

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        out = []
        for c in candidates:
            self.asked.append(c)
            t = self.times.get(c, 1.0)
            o = Outcome(Status.OK, time_ms=t, times=(t,))
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


def setup(tmp_path, recorded):
    """The conv's one-variant space, and a store holding `recorded` ({index: ms}) of its
    points (indices into the space's candidates, the fallback not among them)."""
    net = network_from_dict({"name": "n", "input": [1, 16, 12, 12], "layers": [
        {"name": "c", "op": "conv", "out": 16, "kernel": 3, "pad": 1}]})
    layer = net.layer("c")
    sp = layer_space(layer, POCL, [BY_NAME[VARIANT]])
    fb = search.fallback_candidate(layer, POCL, sp)
    pts = [c for c in sp.candidates if c != fb]
    store = Store(write=[tmp_path / "r.jsonl"])
    for i, ms in recorded.items():
        store.append(Key(layer, BY_NAME[VARIANT], POCL), pts[i].cfg,
                     Outcome(Status.OK, time_ms=ms, times=(ms,)))
    return layer, sp, pts, store


def test_the_fastest_records_are_timed_first_and_a_lucky_one_loses(tmp_path):
    # records: 0 at 0.5 ms (low by chance: 0.9 now), 1 at 0.6 (0.7 now), 2 and 3 slower
    layer, sp, pts, store = setup(tmp_path, {0: 0.5, 1: 0.6, 2: 0.8, 3: 0.85})
    m = Table({pts[0]: 0.9, pts[1]: 0.7, pts[2]: 0.8, pts[3]: 0.75})
    r = search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=6)
    assert m.asked[:3] == [pts[0], pts[1], pts[2]]           # the 3 fastest records first
    assert r.best == pts[1] and r.best_outcome.time_ms == 0.7
    # the 4th record came into the 3 fastest after the rechecks: timed again too
    assert pts[3] in m.asked
    # the later record of a point wins: the store keeps the times of this run
    assert store.lookup(Key(layer, BY_NAME[VARIANT], POCL))[pts[0].cfg].time_ms == 0.9


def test_recheck_0_trusts_the_records(tmp_path):
    layer, sp, pts, store = setup(tmp_path, {0: 0.5, 1: 0.6})
    m = Table({pts[0]: 0.9, pts[1]: 0.7})
    r = search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=6, recheck=0)
    assert pts[0] not in m.asked and pts[1] not in m.asked
    assert r.best == pts[0] and r.best_outcome.time_ms == 0.5


def test_without_records_nothing_is_timed_twice(tmp_path):
    layer, sp, pts, store = setup(tmp_path, {})
    m = Table({pts[5]: 0.2})
    search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=10)
    assert len(m.asked) == len(set(m.asked))


def test_a_passed_deadline_stops_the_rechecks_after_the_search(tmp_path):
    """Under a deadline already past, the first seed (the fastest record) is still owed; no
    other record is timed again."""
    layer, sp, pts, store = setup(tmp_path, {0: 0.5, 1: 0.6, 2: 0.8})
    m = Table({pts[0]: 0.9})
    r = search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=6,
                          deadline=0.0)
    assert m.asked == [pts[0]]
    assert r.best == pts[1]                      # its record (0.6) beats 0.9 timed now


@pytest.mark.parametrize("bad", [-1, "3", 1.5, True])
def test_a_bad_recheck_count_is_refused(bad):
    with pytest.raises(AotconvError, match="--recheck"):
        BuildContext.make("pocl-cpu", mode="records", recheck=bad)


def test_at_most_twice_recheck_recorded_points_are_timed_again(tmp_path):
    """Ten records, each slower now than every record left: each recheck brings another
    into the 3 fastest, but no more than 6 recorded points are timed again."""
    layer, sp, pts, store = setup(tmp_path, {i: 0.1 + 0.01 * i for i in range(10)})
    m = Table({pts[i]: 1.0 + i for i in range(10)})
    search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=12)
    assert len([c for c in m.asked if c in pts[:10]]) == 6

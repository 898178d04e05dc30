"""Seeded search (aotconv.tune.strategies.seeding), device-free: the distance between op
signatures, the seeds and the prior taken from the records of similar layers, tune_layer
measuring them right after the layer's fallback (before the other variants'), and the replay showing fewer trials for the same
quality on a recorded PoCL log.
"""
from pathlib import Path
import math
import time

import pytest

from aotconv.space import layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune.measure import MeasurerBase, Outcome, Status
from aotconv.tune.records import Key, Store, read_log
from aotconv.tune.replay import Recorded
from aotconv.tune.search import tune_layer
from aotconv.tune.strategies.seeding import (MAX_DISTANCE, MAX_SEEDS, Library, distance,
                                             parse_signature, snap)
from aotconv.variants import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
POCL = get_target("pocl-cpu")
POCL_LOGS = ROOT / "results" / "pocl-cpu" / "study-logs-scale8"
H100_LOGS = ROOT / "results" / "h100" / "study-logs"


def conv(n=1, c=8, h=16, w=16, out=16, k=3, pad=1, act="none"):
    net = network_from_dict({"name": "s", "input": [n, c, h, w], "layers": [
        {"name": "c", "op": "conv", "out": out, "kernel": k, "pad": pad, "act": act}]})
    return net.layers[0]


def test_a_signature_parses_back_to_its_shapes_and_attributes():
    l = conv(act="relu")
    name, ins, out, attrs = parse_signature(l.signature_str())
    assert name == "conv" and ins == [(1, 8, 16, 16)] and out == (1, 16, 16, 16)
    assert attrs["kernel"] == (3, 3) and attrs["act"] == "relu" and attrs["bias"] is True
    assert parse_signature("not a signature") is None


def test_the_documented_distance():
    base = conv().signature_str()
    assert distance(base, base) == 0
    # halving the image: H and W of the input and of the output
    assert distance(base, conv(h=8, w=8).signature_str()) == pytest.approx(4.0)
    # doubling the output channels: the output shape, and the `out` attribute
    assert distance(base, conv(out=32).signature_str()) == pytest.approx(
        1 + math.log2(33 / 17))
    # a 5x5 kernel against a 3x3 (pad 2 against 1, so the shapes stay)
    assert distance(base, conv(k=5, pad=2).signature_str()) == pytest.approx(
        2 * math.log2(6 / 4) + 2 * 2 * math.log2(3 / 2))    # kernel (2), pad (4 elements)
    assert distance(base, conv(act="relu").signature_str()) == 1.0
    relu = network_from_dict({"name": "r", "input": [1, 8, 16, 16], "layers": [
        {"name": "r", "op": "relu"}]}).layers[0]
    assert distance(base, relu.signature_str()) == math.inf       # another op: never similar


def logs(folder):
    return {p.stem: read_log(p) for p in sorted(folder.glob("*.jsonl"))}


def test_seeds_are_the_best_points_of_the_nearest_similar_layer():
    all_logs = logs(POCL_LOGS)
    target = all_logs.pop("vgg.conv5_1")
    lib = Library.from_records([r for rs in all_logs.values() for r in rs])
    rec = Recorded(target)
    h = lib.hints(target[0]["op"], rec.grid)
    assert [round(d, 2) for d, _ in h.sources] == [7.87, 11.85]
    assert 0 < len(h.seeds) <= MAX_SEEDS and len(set(h.seeds)) == len(h.seeds)
    assert all(0 <= i < len(rec.grid) for i in h.seeds)
    # the first seed is the nearest signature's fastest point, mapped onto this grid
    nearest = all_logs["vgg.conv3_2"]
    best = min((r for r in nearest if r["status"] == "ok"), key=lambda r: r["time_ms"])
    from aotconv.tune.records import cfg_from_json
    assert h.seeds[0] == snap(rec.grid, best["variant"], cfg_from_json(best["cfg"]))
    # the prior: every ok record of those signatures, relative to its own best
    assert h.has_prior and len(h.y) == sum(len(v) for v in all_logs.values())
    assert h.y.min() == 0 and (h.y >= 0).all() and (h.w > 0).all()


def test_signatures_past_the_cutoff_are_not_similar():
    all_logs = logs(H100_LOGS)
    target = all_logs.pop("vgg.conv3_1")
    lib = Library.from_records([r for rs in all_logs.values() for r in rs])
    assert all(d > MAX_DISTANCE for d in
               (distance(target[0]["op"], rs[0]["op"]) for rs in all_logs.values()))
    h = lib.hints(target[0]["op"], Recorded(target).grid)
    assert h.sources == [] and h.seeds == [] and not h.has_prior


def test_seeding_reaches_the_same_quality_in_fewer_trials():
    """The replay of docs/tuning.md's table, on one recorded layer: the model strategy from
    scratch against the same strategy seeded by the other layers' logs."""
    from aotconv.bench.seeding_study import study_folder
    rows = study_folder(POCL_LOGS, runs=6, only=["vgg.conv5_1"])
    r = rows["vgg.conv5_1"]
    scratch, seeded = r["to"][95.0]["scratch"], r["to"][95.0]["seeded"]
    assert seeded is not None and (scratch is None or seeded < scratch)
    assert r["budgets"][8]["seeded"] > r["budgets"][8]["scratch"]


class Fixed(MeasurerBase):
    """Times from a table; records what was asked, in order."""

    def __init__(self, times):
        self.times, self.asked = times, []

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        out = []
        for c in candidates:
            self.asked.append(c)
            o = Outcome(Status.OK, time_ms=self.times(c), times=(1.0,))
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out


def test_tune_layer_measures_the_seeds_right_after_the_fallback(tmp_path):
    """A layer of 64 channels on 16x16 tuned after one of 64 channels on 32x32 was: the
    latter's fastest points are measured right after the fallbacks."""
    a, b = conv(c=64, h=32, w=32, out=64), conv(c=64, h=16, w=16, out=64)
    variant = "conv_direct"
    sa, sb = (layer_space(x, POCL, [BY_NAME[variant]]) for x in (a, b))
    pts = [c for c in sa.candidates if c.variant == variant]
    rank = {c: i for i, c in enumerate(reversed(pts))}        # the last points are fastest
    store = Store(write=[tmp_path / "r.jsonl"])
    for c in pts:
        store.append(Key(a, BY_NAME[variant], POCL), c.cfg,
                     Outcome(Status.OK, time_ms=1.0 + rank[c], times=(1.0,)))
    lib = Library.from_store(store, POCL, None)
    m = Fixed(lambda c: 1.0)
    r = tune_layer(sb, POCL, m, store, None, strategy="random", trials=12, library=lib)
    grid = sb.grid()
    top2 = sorted(pts, key=rank.get)[:2]
    want = [grid.points[snap(grid, variant, top2[0].cfg)]]
    want.append(grid.points[snap(grid, variant, top2[1].cfg, exclude={grid.index[want[0]]})])
    assert m.asked[0] == r.fallback and m.asked[1:3] == want   # then the strategy's picks
    assert len(m.asked) == 12 and r.trials == 12


def test_the_seeds_come_before_the_other_variants_fallbacks(tmp_path):
    """Under a tight deadline a layer's first batch is cut to its first few points: a guided
    build's seeds must be among them, not behind every variant's default (ResNet-50 b1 guided
    for 90 s on an H100 left its early layers on their fallback)."""
    from aotconv.space import fallback_point
    a, b = conv(c=64, h=32, w=32, out=64), conv(c=64, h=16, w=16, out=64)
    sa = layer_space(a, POCL, [BY_NAME["conv_direct"]])
    sb = layer_space(b, POCL)
    assert len(sb.parts) >= 3
    store = Store(write=[tmp_path / "r.jsonl"])
    for i, c in enumerate(sa.candidates):
        store.append(Key(a, BY_NAME["conv_direct"], POCL), c.cfg,
                     Outcome(Status.OK, time_ms=1.0 + i, times=(1.0,)))
    lib = Library.from_store(store, POCL, None)
    m = Fixed(lambda c: 1.0)
    r = tune_layer(sb, POCL, m, store, None, strategy="random", trials=16, library=lib)
    grid = sb.grid()
    seeds = lib.hints(b.signature_str(), grid, exclude={grid.index[r.fallback]},
                      max_seeds=4).seeds
    assert seeds and m.asked[0] == r.fallback
    assert m.asked[1:1 + len(seeds)] == [grid.points[i] for i in seeds]
    from aotconv.tune.search import Candidate
    defaults = {Candidate(p.variant.name, cfg) for p in sb.parts
                if (cfg := fallback_point(b, p.variant, POCL)) is not None} - {r.fallback}
    assert defaults and defaults <= set(m.asked[1 + len(seeds):])


def test_no_records_no_hints():
    lib = Library()
    sp = layer_space(conv(), POCL, [BY_NAME["conv_direct"]])
    from aotconv.space import Grid
    h = lib.hints(conv().signature_str(), Grid(sp.candidates))
    assert h.seeds == [] and not h.has_prior

"""Spaces and pruning, device-free: sizes, per-constraint counts, device limits, the report."""
from dataclasses import replace
import itertools

import numpy as np
import pytest

from aotconv.graph import Layer
from aotconv.space import layer_space, variant_space, report, Grid, Candidate
from aotconv.targets import TARGETS
from aotconv.variants.base import Variant, Knob, Constraint, Launch, Config, In, Out
from aotconv.variants.eltwise import Eltwise
from aotconv.tune.search import parse_budget, share, Budget
from aotconv.errors import AotconvError


def relu_layer(shape=(2, 8, 16, 16)):
    return Layer("r", "relu", {"act": "relu", "alpha": 0.01}, ["input"], in_shapes=[shape],
                 out_shape=shape)


class Tiles(Variant):
    """A toy 2-D tiled variant: local size (WX, WY), local memory WX*WY*T floats."""
    name = "toy_tiles"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"
    constraints = (
        Constraint("t_le_wx", "algorithm", "a tile row needs a work-item per element",
                   lambda l, c, t: c["T"] <= c["WX"]),
        Constraint("square_enough", "software", "very flat work-groups waste the cache",
                   lambda l, c, t: c["WX"] <= 8 * c["WY"]),
        Constraint("simd", "hardware", "whole warps", lambda l, c, t: c["WX"] * c["WY"] % 32 == 0),
    )

    def knobs(self, layer, target):
        return [Knob("WX", (4, 8, 16, 32, 64)), Knob("WY", (1, 2, 4, 8, 16)),
                Knob("T", (1, 2, 4, 8))]

    def launches(self, layer, cfg, prefix):
        return [Launch(prefix, (In(0), Out()), (cfg["WX"] * 64, cfg["WY"] * 64),
                       (cfg["WX"], cfg["WY"]))]

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["WX"] * cfg["WY"] * cfg["T"]

    def registers(self, layer, cfg):
        return 16 + 8 * cfg["T"]


SMALL = replace(TARGETS["h100"], name="small", max_wg_size=256, local_mem_bytes=8192,
                max_wg_dims=(64, 8, 1), min_wg_per_cu=2, local_mem_per_cu=12288,
                registers_per_cu=16384, max_regs_per_thread=64)


def brute(variant, target, layer):
    """Independent count: which points violate which constraints, and the survivors."""
    ks = variant.knobs(layer, target)
    pts = [dict(zip([k.name for k in ks], v)) for v in itertools.product(*(k.values for k in ks))]
    rules = {
        "t_le_wx": lambda p: p["T"] <= p["WX"],
        "square_enough": lambda p: p["WX"] <= 8 * p["WY"],
        "simd": lambda p: p["WX"] * p["WY"] % 32 == 0,
        "device.wg_size": lambda p: p["WX"] * p["WY"] <= 256,
        "device.local_mem": lambda p: 4 * p["WX"] * p["WY"] * p["T"] <= 8192,
        "device.wg_dims": lambda p: p["WX"] <= 64 and p["WY"] <= 8,
        "device.occupancy_local_mem": lambda p: 2 * 4 * p["WX"] * p["WY"] * p["T"] <= 12288,
        "device.registers": lambda p: 16 + 8 * p["T"] <= 64,
        "device.occupancy_registers": lambda p: 2 * p["WX"] * p["WY"] * (16 + 8 * p["T"]) <= 16384,
        "device.index_width": lambda p: True,       # 2x8x16x16 and 64x64 tiles: far below 2^31
        "device.max_alloc": lambda p: True,         # no buffer, no scratch
    }
    alone = {n: sum(not f(p) for p in pts) for n, f in rules.items()}
    survivors = [p for p in pts if all(f(p) for f in rules.values())]
    return len(pts), alone, survivors


def test_toy_space_counts_match_an_independent_count():
    layer = relu_layer()
    vs = variant_space(layer, Tiles(), SMALL)
    total, alone, survivors = brute(Tiles(), SMALL, layer)
    assert vs.total == total == 100
    assert [c.as_dict() for c in vs.points] == survivors
    assert vs.alone == alone
    # sequential attribution adds up to the pruned total, in level order
    assert sum(vs.first.values()) == vs.pruned == total - len(survivors)
    assert [c.level for c in vs.constraints][:3] == ["algorithm", "software", "hardware"]
    # the algorithm-level rule is applied first, so it is charged with all its violations
    assert vs.first["t_le_wx"] == alone["t_le_wx"] == 5   # T=8 with WX=4, any of 5 WY
    assert len(survivors) > 0


def test_the_search_s_quick_enumeration_prunes_the_same_points():
    layer = relu_layer()
    full = variant_space(layer, Tiles(), SMALL, explain=True)
    quick = variant_space(layer, Tiles(), SMALL, explain=False)
    assert quick.points == full.points and quick.alone == {}
    assert quick.total == full.total and sum(quick.first.values()) == full.pruned
    # the staged walk prunes whole subtrees: "simd" (WX*WY) judges before T is chosen, so
    # it is charged for whole rows of 4 T values
    assert quick.first["simd"] % 4 == 0 and quick.first["simd"] > 0


class Picky(Variant):
    """Constraints that read knobs in awkward ways, for the staged enumeration."""
    name = "toy_picky"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"
    constraints = (
        # swallows every Exception: an unset knob must not look like a verdict
        Constraint("swallow", "algorithm", "catches everything",
                   lambda l, c, t: _swallow(c)),
        # reads a knob with a default: B unset must not read as 0
        Constraint("defaulted", "software", "cfg.get with a default",
                   lambda l, c, t: c.get("B", 0) != 2),
        # reads through as_dict(): C unset must wait, not reject
        Constraint("dict_read", "software", "as_dict", lambda l, c, t: c.as_dict()["C"] != 1),
        Constraint("broken", "hardware", "raises on one point",
                   lambda l, c, t: 1 // (c["A"] - 3) is not None),
    )

    def knobs(self, layer, target):
        return [Knob("A", (1, 2, 3)), Knob("B", (0, 1, 2)), Knob("C", (0, 1, 2))]

    def launches(self, layer, cfg, prefix):
        return [Launch(prefix, (In(0), Out()), (64,), (64,))]


def _swallow(c):
    try:
        return not (c["A"] == 2 and c["C"] == 2)
    except Exception:
        return False


def test_staged_enumeration_waits_for_the_knobs_a_constraint_reads():
    layer = relu_layer()
    full = variant_space(layer, Picky(), SMALL, explain=True)
    quick = variant_space(layer, Picky(), SMALL, explain=False)
    want = [dict(A=a, B=b, C=c) for a in (1, 2, 3) for b in (0, 1, 2) for c in (0, 1, 2)
            if not (a == 2 and c == 2) and b != 2 and c != 1 and a != 3]
    assert [c.as_dict() for c in full.points] == want
    assert quick.points == full.points
    assert sum(quick.first.values()) == quick.total - len(want) == 27 - len(want)
    assert "ZeroDivisionError" in quick.errors["broken"]


# the slow tier (tests/conftest.py) takes h100, 4.5 to 8.5 s; pocl-cpu stays in make test, and
# h100's spaces against the walk too (tests/test_space_enum.py, conv_igemm on h100)
@pytest.mark.parametrize("target", [pytest.param("h100", marks=pytest.mark.slow), "pocl-cpu"])
def test_staged_enumeration_keeps_exactly_the_valid_points_of_the_real_variants(target):
    """Every registered variant that supports these small layers. Small products: the staged
    walk equals the full walk, points and order. Big ones (conv_igemm's millions): random
    points of the product are in the staged space exactly when point_ok, which checks every
    constraint on the whole point, accepts them."""
    from aotconv.bench import conv_layer
    from aotconv.space import point_ok
    from aotconv.variants import active
    t = TARGETS[target]
    rng = np.random.default_rng(7)
    layers = [conv_layer(tup, None)[0] for tup in [("a", 2, 8, 9, 9, 16, 3, 3, 1, 1),
                                                   ("b", 1, 32, 7, 7, 24, 1, 1, 1, 0)]]
    full_walks = sampled = 0
    for layer in layers:
        for v in active():
            if v.supports(layer) is not None:
                continue
            quick = variant_space(layer, v, t, explain=False)
            if quick.total <= 20000:
                full = variant_space(layer, v, t, explain=True)
                assert quick.points == full.points, (layer.name, v.name)
                assert sum(quick.first.values()) == full.pruned
                full_walks += 1
                continue
            kept = set(quick.points)
            assert len(kept) == len(quick.points) > 0
            assert quick.points == sorted(quick.points, key=lambda c: tuple(
                k.values.index(c[k.name]) for k in quick.knobs))      # product order
            for _ in range(1500):
                cfg = Config(tuple((k.name, k.values[rng.integers(len(k.values))])
                                   for k in quick.knobs))
                assert (cfg in kept) == point_ok(layer, v, cfg, t), (v.name, str(cfg))
            for i in rng.choice(len(quick.points), size=min(300, len(quick.points)),
                                replace=False):
                assert point_ok(layer, v, quick.points[i], t)
            sampled += 1
    assert full_walks >= 6 and sampled >= 2


def test_device_limits_are_applied_to_every_variant():
    layer = relu_layer()
    names = [c.name for c in variant_space(layer, Tiles(), SMALL).constraints]
    for n in ("device.wg_size", "device.local_mem", "device.wg_dims",
              "device.occupancy_local_mem", "device.registers", "device.occupancy_registers"):
        assert n in names
    # a variant without a register estimate gets no register constraints
    names = [c.name for c in variant_space(layer, Eltwise(), SMALL).constraints]
    assert "device.wg_size" in names and "device.registers" not in names


def test_eltwise_space_under_a_small_work_group_limit(monkeypatch):
    monkeypatch.setenv("AOTCONV_EXCLUDE_VARIANTS", "eltwise_nhwc")     # eltwise's space alone
    layer = relu_layer()
    big = layer_space(layer, TARGETS["pocl-cpu"])
    assert (big.total, len(big.candidates)) == (16, 16)
    small = layer_space(layer, replace(TARGETS["pocl-cpu"], max_wg_size=64), explain=True)
    assert small.total == 16
    assert len(small.candidates) == 8          # WG 128 and 256 pruned, for each of 4 VEC
    part = small.parts[0]
    assert part.first["device.wg_size"] == part.alone["device.wg_size"] == 8
    assert all(c.cfg["WG"] <= 64 for c in small.candidates)


def test_software_constraint_on_a_tiny_tensor():
    layer = relu_layer((1, 1, 1, 3))           # 3 elements: VEC 4 and 8 only add idle lanes
    sp = layer_space(layer, TARGETS["pocl-cpu"], explain=True)
    assert sp.parts[0].alone["vec_not_wasteful"] == 8
    assert sorted({c.cfg["VEC"] for c in sp.candidates}) == [1, 2]


def test_a_constraint_that_raises_rejects_the_point_and_says_why():
    class Raising(Tiles):
        name = "raising"
        constraints = (Constraint("divides", "software", "needs WY to divide 8",
                                  lambda l, c, t: 8 % (c["WY"] - 1) == 0),)
    vs = variant_space(relu_layer(), Raising(), TARGETS["h100"])
    assert vs.alone["divides"] >= 20                  # WY=1 raises ZeroDivisionError (20 points)
    assert "ZeroDivisionError" in vs.errors["divides"]
    assert all(c["WY"] != 1 for c in vs.points)


def test_report_text_names_sizes_and_constraints(monkeypatch):
    monkeypatch.setenv("AOTCONV_EXCLUDE_VARIANTS", "eltwise_nhwc")     # eltwise's space alone
    layer = relu_layer()
    sp = layer_space(layer, replace(TARGETS["pocl-cpu"], max_wg_size=64), explain=True)
    text = report(sp)
    assert "variant eltwise: 16 points -> 8 after pruning (8 pruned, 50.0%)" in text
    assert "device.wg_size" in text and "vec_not_wasteful" in text
    assert "total: 16 points -> 8 candidates (8 pruned)" in text


def test_space_report_through_choose():
    from aotconv.choose import space_report
    target = replace(TARGETS["pocl-cpu"], max_wg_size=64)
    quick = space_report(relu_layer(), target)
    assert "eltwise" in quick and "16 points -> 8 after pruning" in quick
    assert "pruned  reason" in quick and "'alone'" in quick and "--exact" in quick
    exact = space_report(relu_layer(), target, exact=True)
    assert "16 points -> 8 after pruning" in exact and "first   alone  reason" in exact


# -- the strategies' geometry ------------------------------------------------------------------

def test_grid_neighbours_and_nearest():
    pts = [Candidate("a", Config.of(X=x, Y=y)) for x in (1, 2, 4) for y in (1, 2)]
    pts += [Candidate("b", Config.of(X=x, Z=z)) for x in (1, 2) for z in (8, 16)]
    g = Grid(pts)
    assert g.dims == ["variant", "X", "Y", "Z"]
    i = g.index[Candidate("a", Config.of(X=2, Y=1))]
    nb = {str(g.points[j]) for j in g.neighbours(i)}
    # one knob differs in the same variant; or the variant differs with shared knobs equal
    assert nb == {"a[X=1,Y=1]", "a[X=4,Y=1]", "a[X=2,Y=2]", "b[X=2,Z=8]", "b[X=2,Z=16]"}
    rng = np.random.default_rng(0)
    coord = g.coords[i].copy()
    coord[1] = 2                              # X=4, still variant a: valid
    assert g.points[g.nearest(coord, rng)] == Candidate("a", Config.of(X=4, Y=1))
    assert g.nearest(coord, rng, exclude=[g.index[Candidate("a", Config.of(X=4, Y=1))]]) != \
        g.index[Candidate("a", Config.of(X=4, Y=1))]


# -- budgets -----------------------------------------------------------------------------------

def test_budget_parsing():
    assert parse_budget("200") == Budget("trials", 200)
    assert parse_budget("10m") == Budget("seconds", 600)
    assert parse_budget("90s") == Budget("seconds", 90)
    assert parse_budget("1.5h") == Budget("seconds", 5400)
    assert parse_budget(None).kind == "default"
    for bad in ("ten", "10x", "1.5", "-3"):
        with pytest.raises(AotconvError):
            parse_budget(bad)


def test_budget_shared_by_cost_and_capped_by_space():
    # the cheap layer gets its floor, the capped layer its whole space, the rest the big one
    assert share(200, [1, 10, 100], [16, 1000, 50]) == [14, 136, 50]
    assert sum(share(97, [3, 1, 1, 5], [1000] * 4)) == 97
    assert share(10, [0, 0], [3, 100]) == [3, 7]
    assert share(4, [1, 1, 1, 1], [5, 5, 5, 5]) == [1, 1, 1, 1]
    s = share(10.0, [1, 3], [float("inf")] * 2, floor=0.0)
    assert s == pytest.approx([2.5, 7.5])


# slow tier: 5 to 9 s; make test keeps the worker processes' spaces against layer_space
# (tests/test_space_enum.py, test_worker_processes_send_the_same_points)
@pytest.mark.slow
def test_parallel_enumeration_equals_the_sequential_one(monkeypatch):
    """layer_spaces enumerates in worker processes; the points, counts and constraints it
    rebuilds are those of layer_space, layer by layer."""
    from aotconv.space import layer_spaces
    from aotconv.bench import conv_layer
    t = TARGETS["h100"]
    layers = [conv_layer(tup, None)[0] for tup in [("a", 2, 8, 9, 9, 16, 3, 3, 1, 1),
                                                   ("b", 1, 32, 7, 7, 24, 1, 1, 1, 0),
                                                   ("c", 2, 4, 12, 12, 8, 5, 5, 2, 0)]]
    import aotconv.space as space
    monkeypatch.setattr(space, "PARALLEL_MIN_LAYERS", 2)   # three layers: use the workers anyway
    par = layer_spaces(layers, t, jobs=2)
    seq = [layer_space(l, t) for l in layers]
    for a, b in zip(par, seq):
        assert [p.variant.name for p in a.parts] == [p.variant.name for p in b.parts]
        assert a.unsupported == b.unsupported
        for pa, pb in zip(a.parts, b.parts):
            assert (pa.total, pa.first) == (pb.total, pb.first)
            assert pa.points == pb.points and len(pa.points) > 0
            assert [c.name for c in pa.constraints] == [c.name for c in pb.constraints]
        assert a.candidates == b.candidates

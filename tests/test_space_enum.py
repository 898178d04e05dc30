"""The space enumeration (aotconv.space_enum) against the walks it replaced
(tests/space_reference.py): every point, in order, and every count (`first`, `alone`) and error
text, for the search's staged walk and for `aotconv space --exact`; then the lazily made
points, candidates and grid against the lists and the grid they stand for. Device-free.

The whole comparison (every shipped network's layers on h100 and pocl-cpu, against digests of
the code before a change) is tools/space_digest.py; the slow tier here compares every shipped
network on pocl-cpu, and lenet5 on h100, with the reference walk.
"""
import math

import numpy as np
import pytest

from aotconv import passes, spec
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.ops import is_alias
from aotconv.precision import reason as precision_reason, stored
from aotconv.space import (Candidate, Candidates, Grid, LayerSpace, layer_space, layer_spaces,
                           parse_where, restrict, variant_space)
import aotconv.space_enum as space_enum
from aotconv.space_enum import Points
from aotconv.targets import TARGETS
from aotconv.tune.search import unique_layers
from aotconv.variants import BY_NAME, active
from aotconv.variants.base import (Config, Constraint, In, Knob, Launch, Out, Variant, traced,
                                   whole)

from space_reference import reference_space

H100, POCL = TARGETS["h100"], TARGETS["pocl-cpu"]


def same(layer, variant, target, exact):
    """Assert the enumeration equals the reference walk for one variant; its point count."""
    got = variant_space(layer, variant, target, explain=exact)
    total, points, first, alone, errors = reference_space(layer, variant, target, exact)
    where = f"{layer.name} {variant.name} {target.name} exact={exact}"
    assert got.total == total, where
    assert len(got.points) == len(points), where
    assert got.points == points, where
    assert got.first == first, where
    assert got.alone == alone, where
    assert got.errors == errors, where
    return len(points)


def relu_layer(shape=(2, 8, 16, 16)):
    return Layer("r", "relu", {"act": "relu", "alpha": 0.01}, ["input"], in_shapes=[shape],
                 out_shape=shape)


class Awkward(Variant):
    """Constraints that read knobs every way a constraint can: by value, with a default,
    through as_dict (membership, iteration, copies), str(), whole(), traced(), reads that
    depend on earlier values, exceptions on some points or on every one; a knob listing a
    value twice."""
    name = "toy_awkward"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"
    constraints = (
        Constraint("short_circuit", "algorithm", "reads C only when A is 2",
                   lambda l, c, t: c["A"] != 2 or c["C"] != 0),
        Constraint("swallow", "algorithm", "catches every Exception",
                   lambda l, c, t: _swallow(c)),
        Constraint("defaulted", "software", "cfg.get with a default, and a missing knob",
                   lambda l, c, t: c.get("B", 0) != 2 and c.get("NOPE", 3) == 3),
        Constraint("dict_read", "software", "as_dict: an item, membership, a copy",
                   lambda l, c, t: _dict_read(c)),
        Constraint("depth_dependent", "software", "judges differently before D is set",
                   lambda l, c, t: "D" in c.as_dict() or c["A"] != 3),
        Constraint("text", "software", "reads the point's text",
                   lambda l, c, t: "B=1,C=2" not in str(c)),
        Constraint("whole_point", "hardware", "waits for the whole point",
                   lambda l, c, t: _whole(c)),
        Constraint("shared", "hardware", "a traced value, read twice",
                   lambda l, c, t: traced(c, "ab", lambda: c["A"] * c["B"]) != 2
                   or traced(c, "ab", lambda: c["A"] * c["B"]) + c["D"] < 3),
        Constraint("broken", "hardware", "raises on A == 1",
                   lambda l, c, t: 1 // (c["A"] - 1) is not None),
        Constraint("never", "hardware", "raises everywhere it is reached",
                   lambda l, c, t: c["NOPE"] if c["C"] == 2 and c["D"] == 2 else True),
        Constraint("not_that_one", "hardware", "compares the point with a Config",
                   lambda l, c, t: c != Config.of(A=4, B=1, C=0, D=2)),
    )

    def knobs(self, layer, target):
        return [Knob("A", (1, 2, 3, 4)), Knob("B", (0, 1, 2)), Knob("C", (0, 1, 2)),
                Knob("D", (1, 2, 1))]

    def launches(self, layer, cfg, prefix):
        return [Launch(prefix, (In(0), Out()), (64 * cfg["A"],), (cfg["A"] * 16,))]


def _swallow(c):
    try:
        return not (c["A"] == 4 and c["C"] == 1)
    except Exception:
        return False


def _dict_read(c):
    d = c.as_dict()
    copy = dict(d)
    return d["C"] != 1 or len(copy) < 3 or sorted(d) != ["A", "B", "C"]


def _whole(c):
    whole(c)
    return c["B"] + c["D"] != 4


class NoKnobs(Variant):
    name = "toy_no_knobs"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"
    constraints = (Constraint("layer_only", "algorithm", "reads the layer alone",
                              lambda l, c, t: l.out_shape[1] > 4),)

    def knobs(self, layer, target):
        return []

    def launches(self, layer, cfg, prefix):
        return [Launch(prefix, (In(0), Out()), (64,), (64,))]


class EmptyKnob(NoKnobs):
    name = "toy_empty_knob"

    def knobs(self, layer, target):
        return [Knob("A", (1, 2)), Knob("B", ())]


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("variant", [Awkward(), NoKnobs(), EmptyKnob()],
                         ids=lambda v: v.name)
def test_awkward_constraints_are_judged_as_the_walks_judge_them(variant, exact):
    for layer in (relu_layer(), relu_layer((1, 3, 2, 2))):
        same(layer, variant, H100, exact)
    sp = variant_space(relu_layer(), Awkward(), H100, explain=exact)
    if variant.name == "toy_awkward":
        assert "ZeroDivisionError" in sp.errors["broken"] and "KeyError" in sp.errors["never"]
        assert 0 < len(sp.points) < sp.total


def test_chunks_of_a_big_space_judge_as_one(monkeypatch):
    """A space past CHUNK points is judged in chunks of its leading knobs: the same points,
    counts and errors."""
    layer = relu_layer()
    for exact in (False, True):
        whole_space = variant_space(layer, Awkward(), H100, explain=exact)
        monkeypatch.setattr(space_enum, "CHUNK", 5)
        chunked = variant_space(layer, Awkward(), H100, explain=exact)
        monkeypatch.undo()
        assert chunked.points == whole_space.points
        assert (chunked.first, chunked.alone, chunked.errors) == \
            (whole_space.first, whole_space.alone, whole_space.errors)
        same(layer, Awkward(), H100, exact)


# -- the real variants ---------------------------------------------------------------------------

def _net(name, inp, layers):
    return spec.network_from_dict({"name": name, "input": list(inp), "layers": layers})


def _conv(**kw):
    return dict(dict(name="c", op="conv"), **kw)


def odd_networks():
    """Small networks whose layers reach every variant and its corners."""
    return [
        _net("s2", (2, 5, 13, 11), [_conv(out=7, kernel=3, stride=2, pad=1, act="relu")]),
        _net("dil", (1, 6, 17, 17), [_conv(out=8, kernel=3, dilation=2, pad=2)]),
        _net("grp", (3, 8, 9, 9), [_conv(out=12, kernel=3, groups=4, pad=1, bias=False)]),
        _net("dw", (2, 16, 14, 14), [_conv(out=16, kernel=3, groups=16, pad=1, act="relu")]),
        _net("k1", (4, 32, 7, 7), [_conv(out=24, kernel=1, act="sigmoid")]),
        _net("k1s2", (2, 16, 14, 14), [_conv(out=32, kernel=1, stride=2)]),
        _net("w3", (1, 64, 28, 28), [_conv(out=128, kernel=3, pad=1)]),
        _net("d1", (1, 4096, 1, 1), [dict(name="f", op="dense", out=1000, act="relu")]),
        _net("d4", (4, 3, 5, 7), [dict(name="f", op="dense", out=13, bias=False)]),
        _net("pool", (2, 6, 13, 13), [dict(name="p", op="maxpool", kernel=3, stride=2,
                                           ceil_mode=True)]),
        _net("gap", (2, 30, 7, 7), [dict(name="g", op="global_avgpool")]),
        _net("soft", (3, 10, 2, 2), [dict(name="s", op="softmax")]),
        _net("lrn", (2, 17, 5, 5), [dict(name="n", op="lrn", size=5)]),
        _net("bn", (2, 7, 3, 5), [dict(name="b", op="batchnorm")]),
        _net("cat", (1, 3, 6, 6), [dict(name="a", op="relu"),
                                   dict(name="b", op="sigmoid", inputs=["input"]),
                                   dict(name="k", op="concat", inputs=["a", "b"])]),
        _net("add", (2, 4, 5, 5), [dict(name="a", op="relu"),
                                   dict(name="s", op="add", inputs=["a", "input"], act="relu")]),
        _net("cpool", (2, 3, 16, 16), [_conv(out=6, kernel=5, act="relu"),
                                       dict(name="p", op="maxpool", kernel=2)]),
        _net("res", (1, 8, 10, 10), [_conv(out=8, kernel=3, pad=1),
                                     dict(name="s", op="add", inputs=["c", "input"])]),
        _net("se", (2, 8, 5, 5), [dict(name="g", op="global_avgpool"),
                                  dict(name="s", op="scale", inputs=["input", "g"])]),
        _net("shuf", (2, 12, 5, 7), [dict(name="s", op="channel_shuffle", groups=3)]),
        _net("slice", (1, 10, 6, 6), [dict(name="s", op="channel_slice", start=2, end=7)]),
        _net("up", (1, 3, 4, 5), [dict(name="u", op="upsample", scale=2)]),
    ]


def network_layers(net):
    """The unique layers a build enumerates, with the pool and residual fusions the fusion
    searches enumerate."""
    out = {}
    for n in (passes.optimise(net), passes.fuse_pool(passes.optimise(net)),
              passes.fuse_residual(passes.optimise(net))):
        for g in unique_layers([l for l in n.layers if not is_alias(l)]):
            out.setdefault(g[0].signature_str(), g[0])
    return list(out.values())


def _targets():
    """(name, target, the largest space compared): the GEMM variants' 31 000 to 39 000 points
    on h100 alone, to keep the others quick. The h100 cases (6 to 12 s each) are in the slow
    tier; make test keeps pocl-cpu in both precisions, and h100's spaces against the walk in
    test_conv_igemm_s_millions_of_points_as_the_walk."""
    slow = pytest.mark.slow
    return [pytest.param("h100", H100, 40000, marks=slow, id="h100"),
            pytest.param("pocl-cpu", POCL, 20000, id="pocl-cpu"),
            pytest.param("h100 tf32", with_precision(H100, "tf32"), 20000, marks=slow,
                         id="h100 tf32"),
            pytest.param("pocl-cpu fp16", with_precision(POCL, "fp16"), 20000,
                         id="pocl-cpu fp16")]


def _judged(layers, target, largest):
    """(variant names compared, points) over `layers` for the variants of at most `largest`
    points, staged and, up to 3000 points, exact too."""
    names, points = set(), 0
    for layer in layers:
        for v in active():
            if v.supports(layer) is not None or precision_reason(v, target) is not None:
                continue
            size = math.prod(len(k.values) for k in v.knobs(layer, target))
            if size > largest:
                continue
            points += same(layer, v, target, exact=False)
            if size <= 3000:
                same(layer, v, target, exact=True)
            names.add(v.name)
    return names, points


@pytest.mark.parametrize("name,target,largest", _targets())
def test_every_variant_on_odd_layers_as_the_walks(name, target, largest):
    """Every variant that supports one of the odd layers (fused pools and residual adds, the
    precisions' own variants), up to `largest` points (conv_igemm below)."""
    layers = []
    for net in odd_networks():
        if target.precision == "fp16":
            net = stored(net, "fp16")
        layers += network_layers(net)
    names, points = _judged(layers, target, largest)
    assert points > 1000
    if target.precision == "fp32":
        assert {"conv_direct", "conv_tiled", "conv_1x1", "conv_depthwise", "conv_winograd",
                "dense_gemv", "pool_direct", "conv_pool_direct", "upsample_direct"} <= names
    if largest >= 40000:
        assert {"conv_im2col", "dense_gemm"} <= names
    if target.precision == "tf32":
        assert "conv_mma" in names
    if target.precision == "fp16":                   # the variants with half storage
        assert {"conv_tiled", "conv_1x1", "conv_depthwise", "dense_gemv"} <= names


@pytest.mark.parametrize("net,layer,target", [
    ("lenet5", "c1", "pocl-cpu"),
    pytest.param("lenet5", "c3", "h100", marks=pytest.mark.slow),     # 2 to 4.5 s
    ("mobilenet_v2", "features.1.conv.0.0", "h100")])
def test_conv_igemm_s_millions_of_points_as_the_walk(net, layer, target):
    """conv_igemm's 1 to 4 million points on small layers (the reference walk takes about a
    second there; the slow tier and tools/space_digest.py take the big ones)."""
    n = passes.optimise(spec.load_network(net, batch=1))
    assert same(n.layer(layer), BY_NAME["conv_igemm"], TARGETS[target], exact=False) > 1000


@pytest.mark.slow
@pytest.mark.parametrize("net,target", [(n, "pocl-cpu") for n in spec.shipped_networks()]
                         + [("lenet5", "h100")])
def test_shipped_networks_spaces_as_the_walk(net, target):
    """Every unique layer a build of a shipped network at batch 1 enumerates, every variant:
    3 s (lenet5) to 150 s (inception-v1) a network on pocl-cpu (whose conv_igemm has a
    million points), the reference walk most of it."""
    n = passes.optimise(spec.load_network(net, batch=1))
    layers = [g[0] for g in unique_layers([l for l in n.layers if not is_alias(l)])]
    names, points = _judged(layers, TARGETS[target], math.inf)
    assert "conv_igemm" in names and points > 0


# -- points, candidates and the grid, made where they are read -----------------------------------

def _space():
    n = passes.optimise(spec.load_network("lenet5", batch=1))
    return layer_space(n.layer("c3"), H100)


def test_points_read_like_the_list_they_stand_for():
    sp = _space()
    for p in sp.parts:
        assert isinstance(p.points, Points)
        listed = list(p.points)
        assert len(p.points) == len(listed) and p.points == listed
        fresh = Points(p.knobs, p.points.flat)           # nothing made yet
        for i in (0, len(listed) // 2, -1, np.int64(len(listed) - 1)):
            assert fresh[i] == listed[i]
        assert fresh[1:4] == listed[1:4]
        with pytest.raises(IndexError):
            fresh[len(listed)]
        for i in (0, len(listed) // 3, len(listed) - 1):
            assert fresh.position(listed[i]) == i and listed[i] in fresh
            assert fresh.index(listed[i]) == i
        other = Config(tuple((k, v) for k, v in listed[0].items[:-1]))
        assert other not in fresh and fresh.position(other) is None
        assert fresh.position("not a config") is None
    # a knob value the point lacks, and a point the constraints pruned
    igemm = next(p for p in sp.parts if p.variant.name == "conv_igemm")
    odd = Config(tuple((k, 7777 if k == "MBLK" else v) for k, v in igemm.points[0].items))
    assert odd not in igemm.points
    full = Config(tuple((k.name, k.values[0]) for k in igemm.knobs))
    assert (full in igemm.points) == (full in set(igemm.points))


def test_a_knob_that_lists_a_value_twice_looks_points_up_as_a_dict_would():
    sp = variant_space(relu_layer(), Awkward(), H100, explain=False)
    listed = list(sp.points)
    index = {c: i for i, c in enumerate(listed)}
    fresh = Points(sp.knobs, sp.points.flat)
    assert any(listed.count(c) > 1 for c in listed)      # D lists 1 twice
    for c in listed:
        assert fresh.position(c) == index[c]


def test_candidates_are_the_list_of_every_part_s_points():
    sp = _space()
    want = [Candidate(p.variant.name, c) for p in sp.parts for c in p.points]
    cands = sp.candidates
    assert isinstance(cands, Candidates) and len(cands) == len(want)
    assert cands == want and want == list(cands)
    for i in (0, 17, len(want) - 1, -1):
        assert sp.candidates[i] == want[i]
        assert sp.candidates.index(want[i]) == (i % len(want))
    assert Candidate("conv_igemm", Config.of(MDIM=3)) not in sp.candidates
    grown = sp.candidates
    grown.append(Candidate("x", Config()))                # a caller's own list
    assert len(grown) == len(want) + 1 and grown[-1].variant == "x"
    assert len(sp.candidates) == len(want)


def test_the_grid_of_a_space_is_the_grid_of_its_candidate_list():
    sp = _space()
    lazy, listed = sp.grid(), Grid(list(sp.candidates))
    assert lazy.dims == listed.dims and lazy.values == listed.values
    assert np.array_equal(lazy.coords, listed.coords)
    assert len(lazy) == len(listed)
    rng = np.random.default_rng(3)
    for i in rng.choice(len(listed), size=50, replace=False):
        c = listed.points[i]
        assert lazy.points[i] == c and lazy.index[c] == listed.index[c] == i
        assert c in lazy.index and lazy.index.get(c) == i
    missing = Candidate("conv_igemm", Config.of(MDIM=3))
    assert missing not in lazy.index and lazy.index.get(missing) is None
    with pytest.raises(KeyError):
        lazy.index[missing]
    assert list(lazy.neighbours(5)) == list(listed.neighbours(5))
    empty = LayerSpace(sp.layer, H100, [], []).grid()
    assert len(empty) == 0 and empty.dims == ["variant"] and empty.coords.shape == (0, 1)


def test_where_restriction_keeps_the_points_a_list_filter_keeps():
    sp = _space()
    where = parse_where(["conv_igemm:VW=4/2,LAYOUT=NHWC", "conv_im2col:PRE=1"])
    got = restrict(sp, where)
    for p in got.parts:
        wanted = where[p.variant.name]
        whole_part = next(q for q in sp.parts if q.variant.name == p.variant.name)
        want = [c for c in whole_part.points
                if all(str(c[k]) in v for k, v in wanted.items())]
        assert list(p.points) == want and len(want) > 0


def test_worker_processes_send_the_same_points(monkeypatch):
    import aotconv.space as space
    n = passes.optimise(spec.load_network("lenet5", batch=1))
    layers = [l for l in n.layers if not is_alias(l)][:4]
    monkeypatch.setattr(space, "PARALLEL_MIN_LAYERS", 2)
    par = layer_spaces(layers, H100, jobs=2)
    for layer, a in zip(layers, par):
        b = layer_space(layer, H100)
        for pa, pb in zip(a.parts, b.parts):
            assert isinstance(pa.points, Points)
            assert pa.points == pb.points and pa.first == pb.first


def test_probes_left_in_memos_never_reach_later_points():
    """What a probe leaves behind (a variant's memo of the last point judged, the geometry of
    the last point) is never taken for a later point's: after an enumeration, points judged one
    by one and a point's launches come out as the variant's own."""
    from aotconv.space import point_ok
    from aotconv.variants.limits import _Geometry
    sp = _space()
    for p in sp.parts:
        if p.variant.name not in ("conv_im2col", "conv_igemm"):
            continue
        kept = p.points[len(p.points) // 2]
        assert type(kept) is Config and point_ok(sp.layer, p.variant, kept, H100)
        pruned = Config(tuple((k.name, k.values[-1]) for k in p.knobs))
        assert point_ok(sp.layer, p.variant, pruned, H100) == (pruned in p.points)
        geo = _Geometry(p.variant)
        launches = p.variant.launches(sp.layer, kept, "k")
        assert geo.wg(sp.layer, kept) == max(math.prod(l.lsize) for l in launches
                                             if l.lsize and l.phase == "run")

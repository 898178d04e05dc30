"""A search narrowed by --where measures first the layer's fastest records projected onto the
narrowed space (space.projected): a new knob value tried on the points the records know are
fast, before the strategy's picks. Device-free (a measurer of fixed times)."""
from aotconv.space import Candidate, layer_space, parse_where, projected, restrict
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.tune.search import tune_layer
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from test_borrow import Fixed    # every candidate 1 ms; what was asked, in order

POCL = get_target("pocl-cpu")
TILED = "conv_tiled"


def conv():
    return network_from_dict({"name": "s", "input": [1, 64, 16, 16], "layers": [
        {"name": "c", "op": "conv", "out": 64, "kernel": 3, "pad": 1}]}).layers[0]


def spaces():
    layer = conv()
    whole = layer_space(layer, POCL, [BY_NAME["conv_direct"], BY_NAME[TILED]])
    return layer, whole, restrict(whole, parse_where([f"{TILED}:VW=1"]))


def test_a_point_is_projected_onto_the_narrowed_knob():
    _, whole, narrow = spaces()
    pts = [c.cfg for c in whole.candidates if c.variant == TILED]
    zero = [c for c in pts if c["VW"] != 1]
    twins = [projected(narrow, TILED, c) for c in zero]
    assert any(t is not None for t in twins)
    for c, t in zip(zero, twins):
        if t is not None:
            assert t["VW"] == 1 and all(t[k] == c[k] for k, _ in c.items if k != "VW")
            assert Candidate(TILED, t) in narrow.grid().index
    one = next(c for c in pts if c["VW"] == 1)
    assert projected(narrow, TILED, one) is None          # already inside: nothing to project
    assert projected(whole, TILED, zero[0]) is None       # not narrowed
    assert projected(narrow, "conv_direct", zero[0]) is None    # a variant it does not search
    # a point whose twin breaks a constraint (not in the narrowed space) has none
    bad = Config(tuple((k, 999 if k == "KT" else v) for k, v in zero[0].items))
    assert projected(narrow, TILED, bad) is None


def test_the_fastest_records_are_measured_first_as_their_twins(tmp_path):
    layer, whole, narrow = spaces()
    pts = [c for c in whole.candidates if c.variant == TILED and c.cfg["VW"] != 1]
    twins = [(c, projected(narrow, TILED, c.cfg)) for c in pts]
    twins = [(c, t) for c, t in twins if t is not None]
    assert len(twins) >= 3
    def records(name):
        store = Store(write=[tmp_path / name])
        key = Key(layer, BY_NAME[TILED], POCL)
        for i, (c, _) in enumerate(twins):            # the first records are the fastest
            store.append(key, c.cfg, Outcome(Status.OK, time_ms=0.1 + i, times=(1.0,)))
        return store
    store = records("a.jsonl")
    m = Fixed()
    tune_layer(narrow, POCL, m, store, None, strategy="random", trials=8)
    want = list(dict.fromkeys(Candidate(TILED, t) for _, t in twins))[:3]   # RECHECK of them
    assert m.asked[:3] == want
    assert all(c.variant == TILED and c.cfg["VW"] == 1 for c in m.asked)
    # without --where the records are only timed again, not projected
    m2 = Fixed()
    tune_layer(whole, POCL, m2, records("b.jsonl"), None, strategy="random", trials=8)
    assert m2.asked[:3] == [c for c, _ in twins[:3]]

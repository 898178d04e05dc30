"""A layer with no tuning record of its own borrows the record of its twin: the signature of the
same op and shapes that differs only in the epilogue (bias, fused activation, fused residual
add), as an ONNX export that drops an all-zero bias makes (tune.records.borrow).

Device-free: which signatures are twins, what records_only and choose borrow and what they
refuse (another device, version or storage, a point outside the layer's own space, a point
the layer's own records say failed), --require-tuned, a shipped network's classifier, and the
seeds a search takes from twins. On PoCL: a records-only build of a net.yaml whose conv and
dense differ from the recorded ones only in bias, checked against numpy.
"""
import json
import math

import pytest

from aotconv import passes, spec
from aotconv.choose import choose
from aotconv.errors import AotconvError
from aotconv.space import Candidate, Grid, layer_space, variant_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import MeasurerBase, Outcome, Status
from aotconv.tune.records import Key, Store, borrow, read_log, twin_key
from aotconv.tune.strategies.seeding import Library, distance
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

FURY = get_target("fury-x")          # its device is absent here: choices come from records
POCL = get_target("pocl-cpu")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    return tmp_path / "cache"


def net_of(layers, shape=(1, 8, 9, 9)):
    return passes.optimise(network_from_dict({"name": "n", "input": list(shape),
                                              "layers": layers}))


def conv(bias=True, act="none", h=9, **kw):
    return net_of([dict(name="c", op="conv", out=8, kernel=3, pad=1, bias=bias, act=act, **kw)],
                  shape=(1, 8, h, h)).layer("c")


def residual_conv(act="relu"):
    """The conv `c` with the add after it fused in (passes.residual_layer)."""
    net = net_of([dict(name="c", op="conv", out=8, kernel=3, pad=1),
                  dict(name="a", op="add", inputs=["input", "c"], act=act)])
    return passes.residual_layer(net.layer("c"), net.layer("a"))


def points(layer, variant, n=3, target=FURY):
    """`n` points of `variant`'s space for `layer`, the fallback not among them."""
    v = BY_NAME[variant]
    fb = v.fallback(layer, target)
    return [c for c in variant_space(layer, v, target).points if c != fb][:n]


def record(store, layer, variant, cfg, ms, target=FURY, device=None, status=Status.OK):
    store.append(Key(layer, BY_NAME[variant], target, device), cfg,
                 Outcome(status, time_ms=ms if status == Status.OK else None, times=(ms,)))


# -- which signatures are twins --------------------------------------------------------------

def test_twins_differ_only_in_the_epilogue():
    base = twin_key(conv().signature_str())
    assert twin_key(conv(bias=False).signature_str()) == base
    assert twin_key(conv(act="relu").signature_str()) == base
    assert twin_key(conv(act="leaky_relu", alpha=0.2).signature_str()) == base
    assert twin_key(conv(act="clip", min=0.0, max=6.0).signature_str()) == base
    assert twin_key(residual_conv().signature_str()) == base     # its residual input left out
    # the main loop differs: not twins
    assert twin_key(conv(h=11).signature_str()) != base
    assert twin_key(conv(stride=2).signature_str()) != base
    half = passes.optimise(network_from_dict({"name": "n", "input": [1, 8, 9, 9], "layers": [
        dict(name="c", op="conv", out=8, kernel=3, pad=1)]}))
    from aotconv.precision import stored
    assert twin_key(stored(half, "fp16").layer("c").signature_str()) != base
    # no fused epilogue: an activation layer's alpha, lrn's alpha and beta are the op's own
    for layer in (dict(name="r", op="leaky_relu", alpha=0.2), dict(name="n", op="lrn", size=3)):
        op = net_of([layer]).layers[0].signature_str()
        assert twin_key(op) == (op,)


def test_the_store_lists_a_layers_twins(tmp_path):
    store = Store(write=[tmp_path / "r.jsonl"])
    a, b, far = conv(bias=False), conv(act="relu"), conv(h=11)
    for l in (a, b, far):
        record(store, l, "conv_direct", BY_NAME["conv_direct"].fallback(l, FURY), 1.0)
    assert Store(read=[tmp_path / "r.jsonl"]).twins(a.signature_str()) == [b.signature_str()]
    assert store.twins(b.signature_str()) == [a.signature_str()]


# -- what is borrowed ------------------------------------------------------------------------

def test_records_only_borrows_the_fastest_point_of_the_twins(tmp_path):
    layer, bias, relu = conv(bias=False), conv(), conv(act="relu")
    p = points(bias, "conv_tiled")
    db = tmp_path / "db.jsonl"
    store = Store(write=[db])
    record(store, bias, "conv_tiled", p[0], 2.0)
    record(store, relu, "conv_tiled", p[1], 1.5)        # another twin, faster
    record(store, relu, "conv_tiled", p[2], 3.0)
    sig = layer.signature_str()
    r = search.records_only([[layer]], FURY, Store(read=[db]), borrow=True)[sig]
    assert r.best == Candidate("conv_tiled", p[1]) and r.best_outcome is None
    assert r.borrowed.op == relu.signature_str() and r.borrowed.outcome.time_ms == 1.5
    assert r.borrowed.source == "record of act=relu,bias=True"
    # without borrow (distill, layouts, the fuzzers): the fallback, as before
    r = search.records_only([[layer]], FURY, Store(read=[db]))[sig]
    assert r.best is None and r.borrowed is None


def test_a_point_outside_the_layers_own_space_is_not_borrowed(tmp_path):
    """The residual conv's twin without the add: its fastest point is Winograd's (which takes
    no residual input) and a conv_tiled configuration the space has no value for; the borrowed
    point is the fastest that is a point of the residual layer's space."""
    layer, plain = residual_conv(), conv()
    assert BY_NAME["conv_winograd"].supports(layer) is not None
    store = Store(write=[tmp_path / "r.jsonl"])
    record(store, plain, "conv_winograd", points(plain, "conv_winograd", 1)[0], 0.5)
    good = points(plain, "conv_tiled", 1)[0]
    bad = Config(tuple((k, 7 if k == "WG" else v) for k, v in good.items))
    record(store, plain, "conv_tiled", bad, 0.6)
    record(store, plain, "conv_tiled", good, 0.9)
    b = borrow(layer, FURY, store)
    assert b.candidate == Candidate("conv_tiled", good)
    assert b.source == "record of act=none,no residual"
    assert distance(layer.signature_str(), plain.signature_str()) == math.inf


def test_only_records_of_this_device_version_and_storage_are_borrowed(tmp_path):
    layer, twin = conv(bias=False), conv()
    cfg = points(twin, "conv_tiled", 1)[0]
    here = {"vendor": "V", "name": "here", "driver": "1"}
    there = dict(here, name="there")
    store = Store(write=[tmp_path / "r.jsonl"])
    record(store, twin, "conv_tiled", cfg, 1.0, device=there)
    assert borrow(layer, FURY, store, device=here) is None
    assert borrow(layer, FURY, store, device=there).candidate.cfg == cfg
    # another aotconv version's record is stale: ignored, never trusted
    old = tmp_path / "old.jsonl"
    rec = read_log(tmp_path / "r.jsonl")[0]
    old.write_text(json.dumps(dict(rec, aotconv="0.0.1", device=None)) + "\n")
    assert borrow(layer, FURY, Store(read=[old])) is None
    # a half-storage layer (an fp16 build) does not borrow a float32 record
    from aotconv.precision import stored
    half = stored(network_from_dict({"name": "n", "input": [1, 8, 9, 9], "layers": [
        dict(name="c", op="conv", out=8, kernel=3, pad=1, bias=False)]}), "fp16").layer("c")
    record(store, twin, "conv_tiled", cfg, 1.0)
    assert borrow(half, FURY, store) is None and borrow(layer, FURY, store) is not None


def test_a_point_the_layers_own_records_failed_is_not_borrowed(tmp_path):
    layer, twin = conv(bias=False), conv()
    p = points(twin, "conv_tiled", 2)
    store = Store(write=[tmp_path / "r.jsonl"])
    record(store, twin, "conv_tiled", p[0], 1.0)
    record(store, twin, "conv_tiled", p[1], 2.0)
    record(store, layer, "conv_tiled", p[0], 1.0, status=Status.WRONG)
    r = search.records_only([[layer]], FURY, store, borrow=True)[layer.signature_str()]
    assert r.best == Candidate("conv_tiled", p[1]) and r.borrowed is not None


# -- what a build makes of it ----------------------------------------------------------------

def two_layer_net():
    return net_of([dict(name="c", op="conv", out=8, kernel=3, pad=1, bias=False, act="relu"),
                   dict(name="d", op="dense", out=5)])


def test_choose_marks_the_source_and_require_tuned_accepts_it(tmp_path, capsys):
    net = two_layer_net()
    twin = net_of([dict(name="c", op="conv", out=8, kernel=3, pad=1, act="relu")]).layer("c")
    cfg = points(twin, "conv_tiled", 1)[0]
    db = tmp_path / "db.jsonl"
    store = Store(write=[db])
    record(store, twin, "conv_tiled", cfg, 0.25)
    d_cfg = BY_NAME["dense_gemv"].fallback(net.layer("d"), FURY)
    record(store, net.layer("d"), "dense_gemv", d_cfg, 0.1)
    before = db.read_bytes()
    ch = choose(net, FURY, mode="records", tuning_db=str(db), require_tuned=True)
    c = ch["c"]
    assert (c.variant, c.cfg, c.source, c.time_ms) == ("conv_tiled", cfg, "record of bias=True",
                                                       None)
    assert ch["d"].source == "record" and ch["d"].time_ms == 0.1
    err = capsys.readouterr().err
    assert "1 of 2 layers have no tuning record of their own" in err
    assert "c: conv_tiled" in err and "from the record of bias=True (0.25 ms there)" in err
    assert db.read_bytes() == before                   # nothing recorded for the layer
    # a layer with neither a record nor a twin's is still refused
    db.write_bytes(before.splitlines(keepends=True)[0])
    with pytest.raises(AotconvError, match="--require-tuned refuses the untuned fallback: d"):
        choose(net, FURY, mode="records", tuning_db=str(db), require_tuned=True)


def test_a_shipped_classifier_without_its_bias_borrows_the_shipped_record(tmp_path, monkeypatch):
    """mobilenet_v2 with its classifier's bias dropped (as torch's dynamo exporter drops an
    all-zero bias): a records-only h100 build runs the point the shipped records chose for the
    classifier with its bias, not the untuned fallback."""
    import yaml
    monkeypatch.delenv("AOTCONV_SHIPPED_RECORDS")
    from aotconv.spec import load_network
    shipped = passes.optimise(load_network("mobilenet_v2"))
    fc = [l for l in shipped.layers if l.op == "dense"][-1]
    doc = yaml.safe_load(open(shipped.file, encoding="utf-8"))
    for l in doc["layers"]:
        if l["name"] == fc.name:
            l["bias"] = False
    src = tmp_path / "mnv2.yaml"
    src.write_text(yaml.safe_dump(doc))
    bare = passes.optimise(load_network(str(src)))
    assert bare.layer(fc.name).attrs["bias"] is False
    want = choose(shipped, "h100", mode="records", only=[fc.name])[fc.name]
    got = choose(bare, "h100", mode="records", only=[fc.name], require_tuned=True)[fc.name]
    assert want.source == "record"
    assert (got.variant, got.cfg, got.source, got.time_ms) == (want.variant, want.cfg,
                                                               "record of bias=True", None)


# -- seeds -----------------------------------------------------------------------------------

def test_a_twins_points_are_the_first_seeds(tmp_path):
    """A signature nearer by distance (a 10x10 image against 9x9, 0.6 apart) and a twin (bias,
    1 apart), and a residual twin (not similar by distance at all): the twins' fastest points
    come first, fastest first, then the other signature's."""
    layer = conv(bias=False)
    near, twin, res = conv(bias=False, h=10), conv(), residual_conv()
    assert distance(layer.signature_str(), near.signature_str()) < 1.0
    lib = Library()
    grid = Grid(layer_space(layer, FURY, [BY_NAME["conv_tiled"]]).candidates)
    p = points(layer, "conv_tiled", 4)
    lib.add(near.signature_str(), "conv_tiled", p[0], 0.1)
    lib.add(twin.signature_str(), "conv_tiled", p[1], 0.5)
    lib.add(res.signature_str(), "conv_tiled", p[2], 0.4)
    h = lib.hints(layer.signature_str(), grid)
    assert [grid.points[i].cfg for i in h.seeds[:3]] == [p[2], p[1], p[0]]
    assert [o for _, o in h.sources][:2] == [twin.signature_str(), res.signature_str()]


class Fixed(MeasurerBase):
    """Every candidate 1 ms; records what was asked, in order."""

    def __init__(self):
        self.asked = []

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        out = []
        for c in candidates:
            self.asked.append(c)
            out.append(Outcome(Status.OK, time_ms=1.0, times=(1.0,)))
            if on_outcome is not None:
                on_outcome(c, out[-1])
        return out


def test_a_search_measures_the_borrowed_point_right_after_the_fallback(tmp_path):
    layer, twin = conv(bias=False), conv()
    store = Store(write=[tmp_path / "r.jsonl"])
    p = points(twin, "conv_tiled", 1, POCL)[0]
    record(store, twin, "conv_tiled", p, 0.3, target=POCL)
    sp = layer_space(layer, POCL, [BY_NAME["conv_tiled"]])
    m = Fixed()
    r = search.tune_layer(sp, POCL, m, store, None, strategy="random", trials=8,
                          library=Library.from_store(store, POCL, None))
    assert m.asked[0] == r.fallback and m.asked[1] == Candidate("conv_tiled", p)
    # measured here, it is this layer's own record now
    assert store.lookup(Key(layer, BY_NAME["conv_tiled"], POCL))[p].time_ms == 1.0


# -- on PoCL ---------------------------------------------------------------------------------

NET = """\
name: bare
input: [2, 3, 8, 8]
layers:
  - {name: c, op: conv, out: 4, kernel: 3, pad: 1, bias: false, act: relu}
  - {name: d, op: dense, out: 5, bias: false}
"""


def test_pocl_build_of_a_net_without_biases_runs_the_borrowed_points(tmp_path):
    """The recorded layers have biases, the net.yaml's do not: a records-only build with
    --require-tuned runs the recorded (non-fallback) points, says where they came from, and
    matches the numpy reference."""
    from aotconv.compiler import compile_network
    from aotconv.context import BuildContext
    from aotconv.protocol import TOLERANCE
    src = tmp_path / "bare.yaml"
    src.write_text(NET)
    twin_src = tmp_path / "twin.yaml"
    twin_src.write_text(NET.replace(", bias: false", ""))
    twins = passes.optimise(spec.load_network(str(twin_src)))
    db = tmp_path / "db.jsonl"
    db.touch()
    picked = {}
    with BuildContext.make("pocl-cpu", mode="records") as ctx:
        if not ctx.present:
            pytest.skip("no PoCL device")
        for name, variant in (("c", "conv_tiled"), ("d", "dense_gemv")):
            cfg = points(twins.layer(name), variant, 1, ctx.target)[0]
            record(Store(write=[db]), twins.layer(name), variant, cfg, 0.05, target=ctx.target,
                   device=ctx.device)
            picked[name] = (variant, cfg)
    before = db.read_bytes()
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="records", tuning_db=str(db), require_tuned=True,
                          check=True, quiet=True)
    for name, (variant, cfg) in picked.items():
        c = res.schedule.choices[name]
        assert (c.variant, c.cfg, c.source) == (variant, cfg, "record of bias=True")
    assert res.check_error is not None and res.check_error <= TOLERANCE
    doc = json.loads((tmp_path / "out" / "tuning.json").read_text())
    assert {l["layer"]: l["source"] for l in doc["layers"]} == {
        "c": "record of bias=True", "d": "record of bias=True"}
    assert "| record of bias=True |" in (tmp_path / "out" / "report.md").read_text()
    assert db.read_bytes() == before

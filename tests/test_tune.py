"""The tuner on PoCL: a real tuning run, resume, stale keys, broken candidates as typed records.

Every test writes its records under a temporary AOTCONV_CACHE_DIR.
"""
import json

import numpy as np
import pytest

from aotconv.choose import choose, Choice
from aotconv.errors import AotconvError
from aotconv.harness import run_layer, random_inputs, close
from aotconv.reference import forward
from aotconv.space import layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target, find_device, with_limits, device_identity
from aotconv.tune.measure import Measurer, Status
from aotconv.tune.records import Store, cache_file, read_log
from aotconv.tune.progress import Progress
from aotconv.tune.search import tune_layer
from aotconv.variants.base import Variant, Knob, Launch, In, Out
from aotconv.variants import BY_NAME

POCL = get_target("pocl-cpu")
pytestmark = pytest.mark.skipif(find_device(POCL) is None, reason="PoCL is not installed")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def eltwise_net(n=3):
    return network_from_dict({"name": "acts", "input": [1, 4, 8, 8], "layers": [
        {"name": f"a{i}", "op": ["relu", "tanh", "sigmoid"][i % 3]} for i in range(n)]})


# -- a real run --------------------------------------------------------------------------------

def test_tuning_a_small_network_end_to_end(cache):
    net = network_from_dict({"name": "small", "input": [1, 8, 8, 8], "layers": [
        {"name": "r1", "op": "relu"},
        {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "pad": 1},
        {"name": "r2", "op": "relu"},                  # identical to r1: tuned once
        {"name": "f", "op": "flatten"}]})
    ch = choose(net, "pocl-cpu", budget=6, strategy="random", jobs=2, quiet=True)
    assert set(ch) == {"r1", "c1", "r2"}               # the alias gets no choice
    assert ch["r1"] is ch["r2"] and ch["r1"].stats.layers == ("r1", "r2")
    for name, c in ch.items():
        assert isinstance(c, Choice) and c.source == "tuned" and c.time_ms > 0
        st = c.stats
        assert st.tried >= 1 and st.ok >= 1 and len(st.times) == st.ok
        assert min(st.times) == c.time_ms and st.fallback_ms is not None
        assert st.tried == st.ok + st.build_failed + st.launch_failed + st.wrong + st.timed_out
        assert st.space >= st.pruned and st.flops > 0
        hash(c)                                        # frozen and hashable
    assert sum(c.stats.new for c in {id(c): c for c in ch.values()}.values()) <= 6
    recs = read_log(cache_file())
    dev = device_identity(*find_device(POCL))
    assert len(recs) == sum(c.stats.new for c in (ch["r1"], ch["c1"]))
    assert all(r["device"] == dev and r["target"] == "pocl-cpu" for r in recs)
    assert {r["op"] for r in recs} == {net.layer("r1").signature_str(),
                                       net.layer("c1").signature_str()}
    # the winner really computes the layer
    c1 = net.layer("c1")
    rng = np.random.default_rng(1)
    xs, params = random_inputs(c1, rng)
    out = run_layer(c1, BY_NAME[ch["c1"].variant], ch["c1"].cfg, xs, params, target=POCL)
    assert close(out, forward(c1, xs, params))[0]
    # the records alone now give the same choices, without measuring
    again = choose(net, "pocl-cpu", mode="records", quiet=True)
    assert {n: (c.variant, c.cfg, c.source) for n, c in again.items()} == \
        {n: (c.variant, c.cfg, "record") for n, c in ch.items()}


@pytest.mark.slow        # about a minute of PoCL compiles cold; tests/test_lanes.py checks the
def test_network_budget_shared_by_cost_or_equally(cache, monkeypatch):   # sharing device-free
    """share="cost" (a network's time) gives the conv most trials; share="equal" (the bench's
    independent layers) gives every unique layer the same count."""
    net = network_from_dict({"name": "mixed", "input": [1, 16, 24, 24], "layers": [
        {"name": "r1", "op": "relu"},
        {"name": "t1", "op": "tanh"},
        {"name": "c1", "op": "conv", "out": 64, "kernel": 3, "pad": 1}]})  # 9x their cost
    sizes = {n: len(layer_space(net.layer(n), with_limits(POCL, find_device(POCL)[1])).candidates)
             for n in ("c1", "r1", "t1")}
    assert min(sizes.values()) >= 4
    by_cost = choose(net, "pocl-cpu", budget=12, strategy="random", jobs=2, quiet=True)
    assert by_cost["c1"].stats.tried > by_cost["r1"].stats.tried + by_cost["t1"].stats.tried
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(cache.parent / "fresh"))   # no records reused
    again = choose(net, "pocl-cpu", budget=12, strategy="random", jobs=2, quiet=True,
                   share="equal")
    assert [again[n].stats.tried for n in ("c1", "r1", "t1")] == [4, 4, 4]
    with pytest.raises(AotconvError, match="budget sharing"):
        choose(net, "pocl-cpu", budget=12, quiet=True, share="fair")


# -- resume ------------------------------------------------------------------------------------

class Interrupt(Progress):
    def __init__(self, after):
        super().__init__("quiet")
        self.after, self.seen = after, 0

    def trial(self, cand, outcome, outcomes):
        self.seen += 1
        if self.seen == self.after:
            raise KeyboardInterrupt


def test_resume_after_interruption(cache):
    net = eltwise_net(1)
    with pytest.raises(KeyboardInterrupt):
        choose(net, "pocl-cpu", budget=9, strategy="random", jobs=0, progress=Interrupt(4))
    assert len(read_log(cache_file())) == 4
    ch = choose(net, "pocl-cpu", budget=9, strategy="random", jobs=0, quiet=True, recheck=0)
    st = ch["a0"].stats
    assert (st.tried, st.new) == (9, 5)               # 4 from the records, 5 measured now
    recs = read_log(cache_file())
    assert len(recs) == 9 and len({json.dumps(r["cfg"]) for r in recs}) == 9
    # done: the same command again measures nothing, but for the rechecks
    assert choose(net, "pocl-cpu", budget=9, strategy="random", jobs=0, quiet=True,
                  recheck=0)["a0"].stats.new == 0
    # by default the 3 fastest records are timed again, and any that comes into the 3
    # fastest after them (up to 6 in all)
    assert 3 <= choose(net, "pocl-cpu", budget=9, strategy="random", jobs=0,
                       quiet=True)["a0"].stats.new <= 6


# -- stale keys --------------------------------------------------------------------------------

def _rewrite(path, **change):
    recs = read_log(path)
    for r in recs:
        for k, v in change.items():
            r[k] = v(r[k]) if callable(v) else v
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize("change", [
    # the kernel template was edited and renders another kernel (tests/test_records_kernel.py:
    # an edit that renders the same kernel keeps the records)
    {"template": "0123456789abcdef", "kernel": "0123456789abcdef"},
    {"aotconv": "0.0.1"},                              # another release measured it
    {"device": lambda d: dict(d, driver="another driver")},
    {"op": lambda s: s.replace("relu", "tanh")},       # another layer's record
])
def test_stale_records_are_ignored(cache, change):
    net = eltwise_net(1)
    choose(net, "pocl-cpu", budget=3, strategy="random", jobs=0, quiet=True)
    assert choose(net, "pocl-cpu", mode="records", quiet=True)["a0"].source == "record"
    _rewrite(cache_file(), **change)
    c = choose(net, "pocl-cpu", mode="records", quiet=True)["a0"]
    assert c.source == "fallback" and c.stats.tried == 0
    with pytest.raises(AotconvError, match="a0"):
        choose(net, "pocl-cpu", mode="records", quiet=True, require_tuned=True)
    # and tuning again does not trust it either: it measures afresh
    assert choose(net, "pocl-cpu", budget=3, strategy="random", jobs=0,
                  quiet=True)["a0"].stats.new == 3


def test_absent_device_uses_recorded_results_and_warns(cache, tmp_path, capsys):
    net = eltwise_net(3)
    ch = choose(net, "pocl-cpu", budget=6, strategy="random", jobs=0, quiet=True)
    db = tmp_path / "fury.jsonl"
    # records made for fury-x (as if shipped): only a0's layer is covered
    lines = [r for r in read_log(cache_file()) if r["op"] == net.layer("a0").signature_str()]
    db.write_text("".join(json.dumps(dict(r, target="fury-x", device={"vendor": "AMD",
                          "name": "Fiji", "driver": "x"})) + "\n" for r in lines))
    capsys.readouterr()
    got = choose(net, "fury-x", tuning_db=str(db), quiet=True)
    err = capsys.readouterr().err
    assert got["a0"].source == "record" and got["a0"].cfg == ch["a0"].cfg
    assert got["a1"].source == got["a2"].source == "fallback"
    assert "WARNING" in err and "fury-x" in err and "a1, a2" in err
    fury = get_target("fury-x")
    assert all(c.cfg["WG"] <= fury.max_wg_size for c in got.values())
    with pytest.raises(AotconvError, match="a1, a2"):
        choose(net, "fury-x", tuning_db=str(db), quiet=True, require_tuned=True)


# -- broken candidates -------------------------------------------------------------------------

GOOD = """__kernel void k(__global const float* x, __global float* y)
{ const int i = get_global_id(0); if (i < %d) y[i] = fmax(x[i], 0.0f); }"""
SOURCES = {
    "ok": GOOD,
    "wrong": GOOD.replace("fmax(x[i], 0.0f)", "fmax(x[i], 0.0f) + 0.5f"),
    "build_error": GOOD.replace("fmax(x[i], 0.0f);", "fmax(x[i], 0.0f)  /* no ; */ }"),
    "hang": """__kernel void k(__global const float* x, __global float* y)
{ volatile __global float* v = y; const int i = get_global_id(0);
  if (i < %d) { for (;;) { v[i] = v[i] + x[i]; } } }""",
    "bad_launch": GOOD,           # a global size that is not a multiple of the local size
    "too_big": GOOD,              # a work-group above the device limit: pruned
}


class Broken(Variant):
    name = "broken_relu"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"

    def knobs(self, layer, target):
        return [Knob("MODE", tuple(SOURCES))]

    def render(self, layer, cfg, prefix):
        n = int(np.prod(layer.out_shape))
        src = SOURCES[cfg["MODE"]]
        return src % n if "%d" in src else src

    def launches(self, layer, cfg, prefix):
        n = int(np.prod(layer.out_shape))
        g, l = {"bad_launch": (n + 1, 64), "too_big": (8192, 8192)}.get(cfg["MODE"], (n, 64))
        return [Launch("k", (In(0), Out()), (g,), (l,))]


def test_broken_candidates_end_as_the_right_typed_records(cache):
    layer = eltwise_net(1).layers[0]
    p, d = find_device(POCL)
    live = with_limits(POCL, d)
    sp = layer_space(layer, live, [Broken()])
    assert sp.total == 6 and sp.parts[0].first["device.wg_size"] == 1   # too_big: pruned
    store = Store.default(live)
    with Measurer(live, jobs=2, timeout_s=2.0) as m:
        r = tune_layer(sp, live, m, store, device_identity(p, d), strategy="exhaustive",
                       trials=10)
    by_mode = {c.cfg["MODE"]: o for c, o in r.outcomes.items()}
    assert by_mode["ok"].status == Status.OK and by_mode["ok"].time_ms > 0
    assert by_mode["wrong"].status == Status.WRONG and by_mode["wrong"].error == pytest.approx(
        0.5, rel=0.01)
    assert by_mode["build_error"].status == Status.BUILD_FAILED
    assert "error" in by_mode["build_error"].message.lower()
    assert by_mode["hang"].status == Status.TIMED_OUT
    assert by_mode["bad_launch"].status == Status.LAUNCH_FAILED
    assert "INVALID_WORK_GROUP_SIZE" in by_mode["bad_launch"].message
    assert "too_big" not in by_mode
    assert r.best.cfg["MODE"] == "ok"
    # each outcome is on disk, typed, under the variant's key
    recs = {r["cfg"][0][1]: r for r in read_log(cache_file())}
    assert {m: recs[m]["status"] for m in recs} == {
        "ok": "ok", "wrong": "wrong", "build_error": "build_failed", "hang": "timed_out",
        "bad_launch": "launch_failed"}
    from aotconv.choose import stats_of
    st = stats_of(r)
    assert (st.space, st.pruned, st.tried, st.ok, st.wrong, st.build_failed, st.launch_failed,
            st.timed_out) == (6, 1, 5, 1, 1, 1, 1, 1)


def test_a_variant_in_another_layout_is_fed_and_checked_in_its_layout():
    """conv_igemm with LAYOUT=NHWC / CHWN reads and writes those orders: right, not 'wrong'."""
    layer = network_from_dict({"name": "l", "input": [2, 4, 6, 6], "layers": [
        {"name": "c", "op": "conv", "out": 8, "kernel": 3, "pad": 1}]}).layers[0]
    live = with_limits(POCL, find_device(POCL)[1])
    sp = layer_space(layer, live, [BY_NAME["conv_igemm"]])
    picks = {}
    for c in sp.candidates:
        picks.setdefault(c.cfg["LAYOUT"], c)
    assert set(picks) >= {"NHWC", "CHWN"}
    with Measurer(live, jobs=0) as m:
        outs = m.measure(layer, [picks["NHWC"], picks["CHWN"]])
    assert [o.status for o in outs] == [Status.OK, Status.OK], outs


def test_shipped_records_can_be_left_out(monkeypatch):
    """AOTCONV_SHIPPED_RECORDS=0 tunes from nothing: the package's records are not read."""
    from aotconv.tune.records import shipped_file
    h100 = get_target("h100")
    assert shipped_file("h100") in Store.default(h100).read_paths
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    assert shipped_file("h100") not in Store.default(h100).read_paths

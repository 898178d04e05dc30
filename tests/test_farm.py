"""The tuning farm (aotconv.tune.farm): device-free checks of its rules and options, and, with
`make test-farm` (Ray installed, AOTCONV_FARM_TESTS=1), a local Ray with two PoCL workers, each
its own OpenCL context: records equal to one local worker's, a killed worker and a hung one
cost nothing but a re-queued candidate, and several layers in flight at once (lanes) keep
the trial budget and survive a killed worker.
"""
import json
import os
import signal
import sys
import time

import pytest

from aotconv import cli
from aotconv.errors import AotconvError
from aotconv.tune import farm as farm_mod
from aotconv.tune.farm import identity_key, pick_group, resource_name

A = {"vendor": "V", "name": "gpu-a", "driver": "1.0"}
B = {"vendor": "V", "name": "gpu-b", "driver": "1.0"}
A2 = {"vendor": "V", "name": "gpu-a", "driver": "2.0"}      # same model, another driver


# -- device-free ---------------------------------------------------------------------------------

def test_only_the_callers_identity_is_used():
    infos = [{"identity": A}, {"identity": B}, {"identity": A2}, {"identity": A}, None]
    assert pick_group(infos, A) == (A, [0, 3])
    assert pick_group(infos, A2) == (A2, [2])              # another driver is another device
    assert pick_group(infos, {"vendor": "V", "name": "x", "driver": "1"})[1] == []


def test_without_a_local_device_the_largest_identity_group_is_used():
    assert pick_group([{"identity": B}, {"identity": A}, {"identity": A}]) == (A, [1, 2])
    assert pick_group([{"identity": B}, {"identity": A}]) == (B, [0])    # ties: the first
    assert pick_group([None, None]) == (None, [])
    assert identity_key(A) == identity_key(dict(reversed(list(A.items()))))


def test_the_resource_is_named_after_the_target():
    assert resource_name("h100") == "aotconv-dev:h100"


def test_without_ray_the_option_is_one_line_saying_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)           # import ray raises ImportError
    monkeypatch.delenv("AOTCONV_RAY", raising=False)
    rc = cli.main(["tune", "lenet5", "--target", "pocl-cpu", "--ray", "local"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "pip install aotconv[farm]" in err and "Traceback" not in err
    assert "AOTCONV_RAY" not in os.environ


@pytest.mark.parametrize("argv, says", [
    (["--ray-workers", "2"], "--ray-workers needs --ray"),
    (["--ray", "local", "--ray-workers", "0"], "--ray-workers 0: give a positive integer"),
])
def test_farm_options_are_checked_before_anything_runs(argv, says, capsys, monkeypatch):
    monkeypatch.delenv("AOTCONV_RAY", raising=False)
    rc = cli.main(["build", "lenet5", "--target", "pocl-cpu", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1


def test_the_option_reaches_the_build_context(monkeypatch):
    """--ray sets AOTCONV_RAY for BuildContext (compile_network and choose make it); a bad
    AOTCONV_RAY_WORKERS is one line too."""
    from aotconv.context import _farm_options
    monkeypatch.setattr(farm_mod, "require_ray", lambda: None)
    monkeypatch.delenv("AOTCONV_RAY", raising=False)
    monkeypatch.delenv("AOTCONV_RAY_WORKERS", raising=False)
    args = cli.parser().parse_args(["tune", "lenet5", "--ray", "local", "--ray-workers", "3"])
    cli.check_farm(args)
    try:
        assert _farm_options(None, None) == ("local", 3)
    finally:
        os.environ.pop("AOTCONV_RAY", None)
        os.environ.pop("AOTCONV_RAY_WORKERS", None)
    assert _farm_options(None, None) == (None, None)
    monkeypatch.setenv("AOTCONV_RAY", "auto")
    monkeypatch.setenv("AOTCONV_RAY_WORKERS", "many")
    with pytest.raises(AotconvError, match="AOTCONV_RAY_WORKERS='many'"):
        _farm_options(None, None)


# -- on a local Ray ------------------------------------------------------------------------------

farm_tests = pytest.mark.skipif(
    os.environ.get("AOTCONV_FARM_TESTS") != "1",
    reason="the Ray farm tests run with `make test-farm` (pip install aotconv[farm])")

TINY = {"name": "tiny", "input": [2, 3, 12, 12], "layers": [
    {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "pad": 1, "act": "relu"},
    {"name": "p1", "op": "maxpool", "kernel": 2},
    {"name": "f1", "op": "dense", "out": 10}]}


@pytest.fixture(scope="module")
def pocl():
    if os.environ.get("AOTCONV_FARM_TESTS") != "1":
        pytest.skip("the Ray farm tests run with `make test-farm`")
    pytest.importorskip("ray", reason="Ray is not installed: pip install aotconv[farm]")
    from aotconv.targets import find_device, get_target
    t = get_target("pocl-cpu")
    if find_device(t) is None:
        pytest.skip("no PoCL device")
    return t


@pytest.fixture(scope="module")
def farm(pocl, tmp_path_factory):
    """Two workers on a local Ray, started the way `--ray local --ray-workers 2` starts them."""
    from aotconv.context import BuildContext
    os.environ["AOTCONV_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    ctx = BuildContext.make(pocl, mode="tune", ray="local", ray_workers=2, quiet=True)
    f = ctx.measurer()
    yield f
    ctx.close()
    os.environ.pop("AOTCONV_CACHE_DIR", None)


def _keys(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        out[(r["op"], r["variant"], json.dumps(r["cfg"]))] = r["status"]
    return out


def _tune(pocl, db, measurer):
    from aotconv.choose import choose
    from aotconv.context import BuildContext
    from aotconv.passes import optimise
    from aotconv.spec import network_from_dict
    net = optimise(network_from_dict(TINY))
    with BuildContext.make(pocl, mode="tune", tuning_db=str(db), budget=9, strategy="random",
                           quiet=True, measurer=measurer) as ctx:
        return choose(net, ctx)


@farm_tests
def test_two_workers_each_with_its_own_context(farm):
    assert len(farm.hosts) == 2 and farm.slots == 2
    assert len(set(farm.pids())) == 2 and os.getpid() not in farm.pids()
    assert [h.ordinal for h in farm.hosts] == [0, 1]        # one context each, same device


@farm_tests
def test_farm_records_equal_one_local_workers(pocl, farm, tmp_path, monkeypatch):
    """The same candidates (a seeded random search under a trial budget) measured by the
    farm's two workers, in the farm's lanes, and by this machine's Measurer in one: the same
    records (op, variant, cfg) with the same outcomes. (The order layers finish in changes
    which similar layers' records seed a layer; TINY's layers are of different ops, which
    never seed each other, so here the candidates are the same whatever the order.)"""
    from aotconv.tune.measure import Measurer
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    local_db, farm_db = tmp_path / "local.jsonl", tmp_path / "farm.jsonl"
    local_db.touch()
    farm_db.touch()
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "c1"))
    with Measurer(pocl, jobs=1) as m:
        assert m.lanes == 1
        local = _tune(pocl, local_db, m)
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "c2"))
    assert farm.lanes > 1
    farmed = _tune(pocl, farm_db, farm)
    a, b = _keys(local_db), _keys(farm_db)
    assert len(a) >= 9 and a == b
    assert all(s == "ok" for s in b.values())
    assert set(local) == set(farmed) and all(c.source == "tuned" for c in farmed.values())


def _conv_candidates(pocl, n):
    from aotconv.space import layer_space
    from aotconv.spec import network_from_dict
    layer = network_from_dict({"name": "k", "input": [1, 8, 16, 16], "layers": [
        {"name": "c", "op": "conv", "out": 16, "kernel": 3, "pad": 1}]}).layers[0]
    cands = [c for c in layer_space(layer, pocl).candidates if c.variant == "conv_direct"]
    return layer, cands[:n]


def _store(tmp_path, layer, pocl, farm):
    from aotconv.tune.records import Key, Store
    from aotconv.variants import BY_NAME
    path = tmp_path / "records.jsonl"
    store = Store(write=[path])

    def record(c, o):
        store.append(Key(layer, BY_NAME[c.variant], pocl, farm.device), c.cfg, o)
    return path, record


def _wait_for_hosts(farm, n, seconds=120):
    """The dispatcher starts replacements and adds them as they answer."""
    t0 = time.monotonic()
    while len(farm.hosts) < n and time.monotonic() - t0 < seconds:
        time.sleep(0.5)
    return len(farm.hosts)


@farm_tests
def test_a_killed_worker_costs_only_its_candidate(pocl, farm, tmp_path):
    layer, cands = _conv_candidates(pocl, 8)
    path, record = _store(tmp_path, layer, pocl, farm)
    killed = []

    def on_outcome(c, o):
        record(c, o)
        busy = farm.pids(busy=True)
        if not killed and busy:                     # mid-run: a worker with a candidate
            killed.append(busy[0])
            os.kill(busy[0], signal.SIGKILL)

    before = farm.requeued
    outs = farm.measure(layer, cands, on_outcome=on_outcome)
    assert killed and farm.requeued == before + 1
    assert all(o is not None and o.ok for o in outs)
    lines = [json.loads(l) for l in open(path)]
    assert len(lines) == len(cands)                 # each once: nothing lost, nothing twice
    assert {json.dumps(l["cfg"]) for l in lines} == {
        json.dumps([[k, v] for k, v in c.cfg.items]) for c in cands}
    assert killed[0] not in farm.pids()
    assert _wait_for_hosts(farm, 2) == 2            # replaced where the device is free


@farm_tests
def test_a_hung_worker_is_replaced_after_its_heartbeat_deadline(pocl, farm, tmp_path):
    layer, cands = _conv_candidates(pocl, 6)
    stopped = []

    def on_outcome(c, o):
        busy = farm.pids(busy=True)
        if not stopped and busy:
            stopped.append(busy[0])
            os.kill(busy[0], signal.SIGSTOP)        # alive, but answers nothing

    before, hang = farm.requeued, farm.hang_s
    farm.hang_s = 3.0
    try:
        outs = farm.measure(layer, cands, on_outcome=on_outcome)
    finally:
        farm.hang_s = hang
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped and farm.requeued == before + 1
    assert all(o is not None and o.ok for o in outs)
    assert stopped[0] not in farm.pids()


LANES_NET = {"name": "lanes", "input": [1, 4, 8, 8], "layers": [
    {"name": "r", "op": "relu"}, {"name": "t", "op": "tanh"}, {"name": "s", "op": "sigmoid"},
    {"name": "d", "op": "dense", "out": 10}]}


class KillOnce:
    """Progress that kills a busy farm worker at the `after`-th trial (in a lane's thread)."""

    def __init__(self, farm, after, stream):
        from aotconv.tune.progress import Progress
        self.p = Progress("json", stream)
        self.farm, self.after, self.seen, self.killed = farm, after, 0, []

    def __getattr__(self, name):
        return getattr(self.p, name)

    def trial(self, cand, outcome, outcomes):
        self.p.trial(cand, outcome, outcomes)
        self.seen += 1
        busy = self.farm.pids(busy=True)
        if self.seen >= self.after and not self.killed and busy:
            self.killed.append(busy[0])
            os.kill(busy[0], signal.SIGKILL)


@farm_tests
def test_lanes_keep_several_layers_in_flight_and_survive_a_killed_worker(pocl, farm, tmp_path):
    """Four layers, four lanes on the two workers: layers overlap (a layer starts before
    another is done), the trial budget is spent exactly, each candidate is recorded once, and
    a worker killed mid-run costs only a re-queued candidate."""
    import io
    from aotconv.spec import network_from_dict
    from aotconv.tune.records import Store
    from aotconv.tune.search import tune_network, unique_layers
    assert _wait_for_hosts(farm, 2) == 2
    groups = unique_layers(network_from_dict(LANES_NET).layers)
    path = tmp_path / "lanes.jsonl"
    out = io.StringIO()
    progress = KillOnce(farm, 5, out)
    before = farm.requeued
    res = tune_network(groups, pocl, farm, Store(write=[path]), farm.device, budget=16,
                       strategy="random", progress=progress, lanes=4, seeding=False)
    events = [json.loads(l) for l in out.getvalue().splitlines()]
    flying, most = set(), 0
    for e in events:
        if e["event"] == "layer_start":
            flying.add(e["layers"][0])
            most = max(most, len(flying))
        elif e["event"] == "layer_done":
            flying.remove(e["layers"][0])
    assert most >= 2 and not flying
    lines = [json.loads(l) for l in open(path)]
    assert len(lines) == 16                                 # the budget, exactly
    assert len({(l["op"], l["variant"], json.dumps(l["cfg"])) for l in lines}) == 16
    assert all(l["status"] == "ok" for l in lines)
    assert progress.killed and farm.requeued == before + 1
    assert all(r.best is not None for r in res.values()) and len(res) == 4
    assert _wait_for_hosts(farm, 2) == 2


@farm_tests
def test_the_trace_has_one_ordered_line_per_candidate(pocl, farm, tmp_path):
    """AOTCONV_FARM_TRACE: each candidate's line says which device ran it and when it was
    queued, compiled, built, run and done, in that order (written as each ends)."""
    layer, cands = _conv_candidates(pocl, 4)
    path = tmp_path / "trace.jsonl"
    farm._trace = open(path, "a", encoding="utf-8")
    try:
        outs = farm.measure(layer, cands)
    finally:
        farm._trace.close()
        farm._trace = None
    assert all(o.ok for o in outs)
    lines = [json.loads(l) for l in open(path)]
    assert len(lines) == len(cands)
    for l in lines:
        assert l["layer"] == "c" and l["variant"] == "conv_direct" and l["status"] == "ok"
        assert l["host"] in {h.ordinal for h in farm.hosts}
        ts = [l[k] for k in ("queued", "compile", "built", "run", "done")]
        assert ts == sorted(ts) and ts[0] >= 0

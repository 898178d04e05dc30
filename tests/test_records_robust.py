"""A damaged tuning-records file never breaks a build (device-free).

Records files are caches: a line that is not UTF-8, not JSON, torn by a killed run, or holds an
impossible value is skipped with one warning per file; appends write whole lines; a
--tuning-db that does not exist is an error; tuning.json is always strict JSON.
"""
import dataclasses
import json
import math
import multiprocessing

import pytest

from aotconv.choose import choose
from aotconv.errors import AotconvError
from aotconv.space import layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import (DATA_DIR, Key, Store, cfg_to_json, check_record, read_log,
                                  read_records)
from aotconv.variants import for_layer

FURY = get_target("fury-x")          # its device is absent here: choices come from records


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def net():
    return network_from_dict({"name": "acts", "input": [1, 4, 8, 8],
                              "layers": [{"name": "a0", "op": "relu"}]})


def _key(net):
    layer = net.layer("a0")
    return Key(layer, for_layer(layer)[0], FURY)


def _points(net, n=2):
    return layer_space(net.layer("a0"), FURY).parts[0].points[:n]


def _record(key, point, **fields):
    rec = dict(key.fields(), cfg=cfg_to_json(point), status="ok", time_ms=4.0,
               times=[4.0, 4.1], build_s=0.1, at="2026-11-22T10:00:00", layer="a0")
    rec.update(fields)
    return rec


def _line(rec):
    return json.dumps(rec) + "\n"


def _warnings(err):
    return [l for l in err.splitlines() if "damaged tuning record" in l]


# -- reading: bad lines are skipped, counted once per file ------------------------------------

def test_non_utf8_and_non_json_lines_are_skipped_with_one_warning(net, tmp_path, capsys):
    key = _key(net)
    a, b = _points(net)
    db = tmp_path / "db.jsonl"
    db.write_bytes(_line(_record(key, a)).encode() + b"\xff\xfe{not utf-8}\n"
                   + b"{\"format\": 1, half a record\n" + _line(_record(key, b, time_ms=2.0))
                   .encode())
    got = Store(read=[db]).lookup(key)
    assert {c: o.time_ms for c, o in got.items()} == {a: 4.0, b: 2.0}
    warn = _warnings(capsys.readouterr().err)
    assert len(warn) == 1 and str(db) in warn[0] and "skipped 2 damaged" in warn[0]
    assert "line 2: not UTF-8" in warn[0] and "line 3: not JSON" in warn[0]
    # another store (choose makes several per build) does not repeat the same warning
    Store(read=[db]).lookup(key)
    assert _warnings(capsys.readouterr().err) == []


BAD_FIELDS = {
    "time as a string": dict(time_ms="fast"),
    "negative time": dict(time_ms=-1.0),
    "zero time": dict(time_ms=0.0),
    "ok without a time": dict(time_ms=None),
    "time a bool": dict(time_ms=True),
    "unknown outcome": dict(status="great"),
    "outcome not a string": dict(status=["ok"]),
    "times with a string": dict(times=[1.0, "x"]),
    "times negative": dict(times=[-1.0]),
    "error not a number": dict(status="wrong", error="big"),
    "build_s negative": dict(build_s=-2),
    "fallback not a bool": dict(fallback="yes"),
    "layer not a string": dict(layer=5),
    "message not a string": dict(message=["log"]),
    "op missing": dict(op=None),
    "variant empty": dict(variant=""),
    "device a string": dict(device="gpu"),
    "device without driver": dict(device={"vendor": "AMD", "name": "Fiji"}),
    "cfg a dict": dict(cfg={"WG": 64}),
    "cfg pair of three": dict(cfg=[["WG", 64, 1]]),
    "cfg value a dict": dict(cfg=[["WG", {"x": 1}]]),
    "cfg knob twice": dict(cfg=[["WG", 64], ["WG", 32]]),
    "format a string": dict(format="1"),
}


@pytest.mark.parametrize("change", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_every_field_is_validated(net, tmp_path, capsys, change):
    key = _key(net)
    a, b = _points(net)
    bad = _record(key, b, **change)
    bad = {k: v for k, v in bad.items() if not (k in change and change[k] is None)}
    assert check_record(bad) is not None
    db = tmp_path / "db.jsonl"
    db.write_text(_line(_record(key, a)) + _line(bad))
    assert set(Store(read=[db]).lookup(key)) == {a}
    warn = _warnings(capsys.readouterr().err)
    assert len(warn) == 1 and "skipped 1 damaged tuning record " in warn[0] and "line 2" in warn[0]


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_times_are_not_believed(net, tmp_path, capsys, token):
    """A NaN or infinite time (JSON has neither; Python writes them) is a damaged record."""
    key = _key(net)
    a, b = _points(net)
    db = tmp_path / "db.jsonl"
    db.write_text(_line(_record(key, a)) + _line(_record(key, b, time_ms=1.0))
                  .replace('"time_ms": 1.0', f'"time_ms": {token}'))
    assert set(Store(read=[db]).lookup(key)) == {a}
    assert len(_warnings(capsys.readouterr().err)) == 1


@pytest.mark.parametrize("bad", ['-1.0', '"fast"', 'NaN', '0'])
def test_choice_ignores_impossible_times(net, tmp_path, capsys, bad):
    """The record with the impossible time is not chosen (a negative one used to win, a
    string one used to crash the build): the measured 4 ms point is."""
    key = _key(net)
    a, b = _points(net)
    db = tmp_path / "fury.jsonl"
    db.write_text(_line(_record(key, a)) + _line(_record(key, b, time_ms=1.0))
                  .replace('"time_ms": 1.0', f'"time_ms": {bad}'))
    got = choose(net, "fury-x", tuning_db=str(db), quiet=True)["a0"]
    assert (got.source, got.cfg, got.time_ms) == ("record", a, 4.0)
    assert len(_warnings(capsys.readouterr().err)) == 1


def test_damaged_user_cache_does_not_break_choose(net, cache, capsys):
    key = _key(net)
    a, _ = _points(net)
    cache.mkdir()
    (cache / "records.jsonl").write_bytes(b"\x80\x81\n" + _line(_record(key, a)).encode()
                                          + b'{"format": 1, "op": ')
    got = choose(net, "fury-x", quiet=True)["a0"]
    assert (got.source, got.cfg) == ("record", a)
    warn = _warnings(capsys.readouterr().err)
    assert len(warn) == 1 and "skipped 2 damaged" in warn[0] and "cut short" in warn[0]


def test_unreadable_cache_is_a_warning_not_an_error(net, cache, capsys):
    (cache / "records.jsonl").mkdir(parents=True)       # a directory where the file should be
    got = choose(net, "fury-x", quiet=True)["a0"]
    assert got.source == "fallback"
    err = capsys.readouterr().err
    assert "cannot read tuning records" in err and "records.jsonl" in err


def test_read_log_skips_damaged_lines(net, tmp_path, capsys):
    key = _key(net)
    a, b = _points(net)
    log = tmp_path / "log.jsonl"
    log.write_text(_line(_record(key, a)) + "garbage\n" + _line(_record(key, b, status="x")))
    assert [r["cfg"] for r in read_log(log)] == [cfg_to_json(a)]
    assert "skipped 2 damaged" in capsys.readouterr().err
    with pytest.raises(AotconvError, match="cannot read tuning records"):
        read_log(tmp_path / "missing.jsonl")


def test_shipped_records_are_all_well_formed():
    files = sorted(DATA_DIR.glob("*.jsonl"))
    assert files
    for f in files:
        records, damaged = read_records(f)
        assert records and damaged == [], f


# -- --tuning-db ----------------------------------------------------------------------------------

def test_tuning_db_must_be_an_existing_file(net, tmp_path):
    with pytest.raises(AotconvError, match=r"--tuning-db .*missing.jsonl: no such file.*touch"):
        Store.default(FURY, str(tmp_path / "missing.jsonl"))
    with pytest.raises(AotconvError, match="not a regular file"):
        Store.default(FURY, str(tmp_path))
    with pytest.raises(AotconvError, match="no such file"):
        choose(net, "fury-x", tuning_db=str(tmp_path / "typo.jsonl"), quiet=True)
    empty = tmp_path / "new.jsonl"
    empty.touch()
    assert Store.default(FURY, [str(empty)]).lookup(_key(net)) == {}


# -- appending ---------------------------------------------------------------------------------

def test_torn_tail_does_not_swallow_the_next_record(net, tmp_path, capsys):
    """A run killed mid-write leaves half a line; the next append starts a fresh line."""
    key = _key(net)
    a, b = _points(net)
    db = tmp_path / "db.jsonl"
    torn = _line(_record(key, a, time_ms=9.0))
    db.write_text(_line(_record(key, a)) + torn[:len(torn) // 2])
    Store(read=[db], write=[db]).append(key, b, Outcome(Status.OK, 2.5, (2.5,)), layer="a0")
    raw = db.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 3
    records, damaged = read_records(db)
    assert [(r["cfg"], r["time_ms"]) for r in records] == [(cfg_to_json(a), 4.0),
                                                           (cfg_to_json(b), 2.5)]
    assert [n for n, _ in damaged] == [2]
    got = Store(read=[db]).lookup(key)
    assert got[b].time_ms == 2.5 and got[a].time_ms == 4.0


def test_impossible_outcome_is_not_recorded(net, tmp_path, capsys):
    key = _key(net)
    a, _ = _points(net)
    db = tmp_path / "db.jsonl"
    db.touch()
    Store(write=[db]).append(key, a, Outcome(Status.OK, math.nan, (math.nan,)), layer="a0")
    assert db.read_bytes() == b""
    assert "not recording" in capsys.readouterr().err


def _append_many(path, n, tag):
    net = network_from_dict({"name": "acts", "input": [1, 4, 8, 8],
                             "layers": [{"name": "a0", "op": "relu"}]})
    key, store = _key(net), Store(write=[path])
    cfg = _points(net, 1)[0]
    for i in range(n):
        store.append(key, cfg, Outcome(Status.BUILD_FAILED, message=f"{tag}{i} " + "x" * 3000),
                     layer="a0")


def test_concurrent_appends_write_whole_lines(tmp_path):
    db = tmp_path / "db.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(db, 40, t)) for t in "pq"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records, damaged = read_records(db)
    assert damaged == [] and len(records) == 80
    assert sorted(r["message"].split()[0] for r in records) == sorted(
        f"{t}{i}" for t in "pq" for i in range(40))


# -- tuning.json -----------------------------------------------------------------------------------

def test_tuning_json_is_strict_json_with_non_finite_numbers_as_null(tmp_path):
    from aotconv.emit import write_tuning_json
    from aotconv.schedule import build_schedule
    net = network_from_dict({"name": "t", "input": [1, 4, 8, 8], "layers": [
        {"name": "a0", "op": "relu"}, {"name": "a1", "op": "tanh"}]})
    choices = choose(net, "fury-x", mode="fallback", quiet=True)
    st = dataclasses.replace(choices["a1"].stats, fallback_ms=math.inf)
    choices = {"a0": dataclasses.replace(choices["a0"], time_ms=math.nan),
               "a1": dataclasses.replace(choices["a1"], time_ms=math.inf, stats=st)}
    sch = build_schedule(net, choices)
    sch.fusion, sch.layout_plan = [], None
    path = tmp_path / "tuning.json"
    write_tuning_json(sch, FURY, path)

    def no_constant(name):
        raise AssertionError(f"{name} in tuning.json")
    doc = json.loads(path.read_text(), parse_constant=no_constant)
    layers = {l["layer"]: l for l in doc["layers"]}
    assert layers["a0"]["time_ms"] is None and layers["a1"]["time_ms"] is None
    assert layers["a1"]["stats"]["fallback_ms"] is None

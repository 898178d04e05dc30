"""`aotconv tune` measures what a build of its choices measures after the network's search: the
layout_convert layers the build inserts (an fp16 build's casts at the input and the output
among them) and the pools fused into their conv, so that `aotconv build --records-only
--require-tuned` after it finds every kernel in the records; `--layer` names a conversion too.

On PoCL, lenet5 with small trial budgets; every test writes its records under a temporary
AOTCONV_CACHE_DIR and leaves the shipped records out.
"""
import json
import re
import shlex

import pytest

from aotconv import cli
from aotconv.context import BuildContext
from aotconv.spec import load_network
from aotconv.targets import find_device, get_target
from aotconv.tune import cli as tune_cli
from aotconv.tune.records import cache_file, read_log
from aotconv.tune.search import Budget, Clock

POCL = get_target("pocl-cpu")
pytestmark = pytest.mark.skipif(find_device(POCL) is None, reason="PoCL is not installed")
LENET = [l.name for l in load_network("lenet5").layers]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    return tmp_path / "cache"


def _tune(argv, capsys):
    """`aotconv tune ... --json`: its summary's rows {name: row}."""
    assert cli.main(["tune", *argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["event"] == "summary"
    return summary["layers"]


def _build(tmp_path, capsys, *extra):
    """`aotconv build lenet5 --precision fp16 --records-only --require-tuned`: (exit status,
    stderr)."""
    rc = cli.main(["build", "lenet5", "--target", "pocl-cpu", "--precision", "fp16",
                   "--records-only", "--require-tuned", "--quiet", "-o",
                   str(tmp_path / "out"), *extra])
    return rc, capsys.readouterr().err


# slow tier (tests/conftest.py): a tune of lenet5 in fp16 and a build of its choices, about
# 50 s; make test keeps a conversion tuned by `aotconv tune` (the test below), the conversions
# it lists (test_an_unknown_layer_is_one_line_that_lists_the_conversions) and a network's tune
# measuring what its build measures (test_an_fp32_tune_that_inserts_no_conversion_...)
@pytest.mark.slow
def test_an_fp16_build_from_the_records_of_the_advised_tune_has_every_layer(tmp_path, capsys):
    # with no records the build refuses, and says which tune fills them
    rc, err = _build(tmp_path, capsys)
    assert rc == 2 and "--require-tuned refuses the untuned fallback" in err
    advice = re.search(r"Tune them with `([^`]*)`", err).group(1)
    assert "--precision fp16" in advice and "--target pocl-cpu" in advice
    argv = [("lenet5" if w == "NET" else w) for w in shlex.split(advice)][2:]
    rows = _tune(argv + ["--budget", "12"], capsys)     # the advice, with a small budget
    # the network's layers, then the casts the fp16 build inserts at its input and output
    assert list(rows)[:len(LENET)] == LENET
    for name in ("input_to_fp16", "prob_to_fp32"):
        assert rows[name]["op"] == "layout_convert" and rows[name]["source"] == "tuned"
        assert rows[name]["time_ms"] > 0
    assert all(r["source"] == "tuned" for r in rows.values())
    # the build now takes every kernel from the records, the conversions' included
    rc, err = _build(tmp_path, capsys)
    assert rc == 0, err
    built = json.loads((tmp_path / "out" / "tuning.json").read_text())
    sources = {l["layer"]: l["source"] for l in built["layers"]}
    assert {"input_to_fp16", "prob_to_fp32"} <= set(sources)
    assert set(sources.values()) == {"record"}, sources


def test_layer_names_a_conversion_and_tunes_it_alone(capsys):
    rows = _tune(["lenet5", "--target", "pocl-cpu", "--precision", "fp16",
                  "--layer", "input_to_fp16", "--budget", "3"], capsys)
    assert list(rows) == ["input_to_fp16"]
    row = rows["input_to_fp16"]
    assert row["op"] == "layout_convert" and row["source"] == "tuned" and row["tried"] >= 1
    recs = read_log(cache_file())
    assert recs and {r["op"].split("|")[0] for r in recs} == {"layout_convert"}
    assert all("src_storage=fp32" in r["op"] and "storage=fp16" in r["op"] for r in recs)


@pytest.mark.parametrize("precision, lists", [
    ("fp16", "its layers are: c1, s2, c3, s4, f5, f6, prob; the layout conversions a build "
             "inserts: input_to_fp16"),
    ("fp32", "its layers are: c1, s2, c3, s4, f5, f6, prob; a build of it inserts no layout "
             "conversion"),
])
def test_an_unknown_layer_is_one_line_that_lists_the_conversions(precision, lists, capsys,
                                                                   monkeypatch):
    def no_tuning(*a, **k):
        raise AssertionError("tune ran despite the unknown --layer")
    monkeypatch.setattr(tune_cli, "cmd_tune", no_tuning)
    rc = cli.main(["tune", "lenet5", "--target", "pocl-cpu", "--precision", precision,
                   "--layer", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("aotconv: error: --layer nope: network 'lenet5' has no layer 'nope'")
    assert lists in err


def test_an_fp32_tune_that_inserts_no_conversion_tunes_the_network_as_before(capsys):
    rows = _tune(["lenet5", "--target", "pocl-cpu", "--budget", "7"], capsys)
    assert list(rows)[:len(LENET)] == LENET
    assert all(r["source"] == "tuned" for r in rows.values())
    # after the network: only what a build fuses and measures (a pool in its conv), no
    # conversion
    extra = {n: r for n, r in rows.items() if n not in LENET}
    assert all(r["op"] != "layout_convert" for r in rows.values())
    assert all("+" in n and r["op"] == "conv_pool" for n, r in extra.items()), extra


def test_a_time_budget_spent_measures_no_conversion(capsys):
    """A search after the network's that a time budget has no room for measures nothing and
    says so, as in a build: the budget stays a budget."""
    net = load_network("lenet5")
    clock = Clock(Budget("seconds", 1.0), start=0.0)         # ended long ago
    clock.searches = 1                                        # the network's search ran
    with BuildContext.make("pocl-cpu", mode="tune", budget=clock, quiet=True) as ctx:
        got, rows = tune_cli._search(net, ctx, quiet=False, taken=set(), only=["c1"])
    assert got == {} and rows == {}
    err = capsys.readouterr().err
    assert "no time left to measure 1 conv layer after the network's search" in err
    assert not cache_file().exists() or read_log(cache_file()) == []

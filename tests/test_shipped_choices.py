"""The choices a build makes from the shipped tuning records never change unnoticed.

For every shipped network, every target with shipped records (aotconv/data/<target>.jsonl) and
every batch size those records cover, tests/data/shipped_choices.json holds what
`aotconv build NET --target T --batch B` chose from the shipped records alone: per layer the
variant, its configuration, its layouts and the recorded time; which pools were fused into
their conv and the times compared; the layout conversions inserted and what the layout plan
changed. Each case is recomputed here through compile_network in records-only mode, stopped
before emit (no kernels rendered, no ninja, no library loaded), with every OpenCL device hidden
(the records are matched by the target's name, as on a machine without that device) and an
empty user cache: device-free and deterministic.

A difference means a change altered what the shipped records build. Where the change is meant
to (a retune, a new variant), regenerate the file and say so in the commit:

    .venv/bin/python tests/test_shipped_choices.py --write

Where only the form of the snapshot changed (a renamed field), adapt `snapshot`, not the
expected choices.
"""
import contextlib
import json
import math
import os
from pathlib import Path
import subprocess
import sys
import tempfile

import pytest

GOLDEN = Path(__file__).resolve().parent / "data" / "shipped_choices.json"


class _Stop(Exception):
    """Raised in place of emit: everything the build chose is in the schedule by then."""


@contextlib.contextmanager
def records_only_build():
    """No OpenCL device visible, no user cache, compile_network stopped at emit."""
    from aotconv import compiler, targets
    saved = (targets._devices, compiler.emit, os.environ.get("AOTCONV_CACHE_DIR"),
             os.environ.get("AOTCONV_SHIPPED_RECORDS"))
    got = {}

    def stop(sch, target, outdir, *a, **k):
        got["schedule"] = sch
        raise _Stop()

    with tempfile.TemporaryDirectory() as cache:
        targets._devices = lambda: []
        compiler.emit = stop
        os.environ["AOTCONV_CACHE_DIR"] = cache
        os.environ.pop("AOTCONV_SHIPPED_RECORDS", None)
        try:
            yield got
        finally:
            targets._devices, compiler.emit = saved[0], saved[1]
            for name, v in (("AOTCONV_CACHE_DIR", saved[2]), ("AOTCONV_SHIPPED_RECORDS", saved[3])):
                if v is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = v


def _plain(x):
    return json.loads(json.dumps(x))


def snapshot(net, target, batch):
    """What a records-only build of `net` for `target` at `batch` chose (JSON-ready)."""
    from aotconv.compiler import compile_network
    from aotconv.layouts import layouts_of
    with records_only_build() as got, tempfile.TemporaryDirectory() as out:
        with contextlib.redirect_stderr(open(os.devnull, "w")):
            try:
                compile_network(net, target=target, outdir=out, batch=batch,
                                tune_mode="records", quiet=True)
            except _Stop:
                pass
    sch = got["schedule"]
    layers = []
    for l in sch.net.layers:
        c = sch.choices.get(l.name)
        if c is None:
            continue
        layers.append(dict(layer=l.name, op=l.op, fused=list(l.fused), variant=c.variant,
                           config=c.cfg.as_dict(), source=c.source, time_ms=c.time_ms,
                           layouts=list(layouts_of(l, c))))
    fusion = [dict(conv=d.conv, pool=d.pool, fused=d.fused, conv_ms=d.conv_ms,
                   pool_ms=d.pool_ms, fused_ms=d.fused_ms) for d in (sch.fusion or [])]
    conversions = [dict(name=n, tensor=sch.net.layer(n).inputs[0],
                        src=sch.net.layer(n).attrs["src"], dst=sch.net.layer(n).attrs["dst"])
                   for n in sch.conversions]
    plan = sch.layout_plan
    changed = [dict(layer=ch["layer"],
                    tuned=[ch["tuned"]["variant"], ch["tuned"]["config"]],
                    planned=[ch["planned"]["variant"], ch["planned"]["config"]])
               for ch in (plan.changed if plan is not None else [])]
    return _plain(dict(network=net, target=target, batch=batch, layers=layers,
                       pool_fusion=fusion, layout_conversions=conversions,
                       layout_plan_changed=changed))


def shipped_batches(target):
    """The batch sizes the shipped records of `target` cover (the N of each recorded op)."""
    from aotconv.tune.records import shipped_file
    path = shipped_file(target)
    batches = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                op = json.loads(line)["op"]
                batches.add(int(op.split("|")[1].split("x")[0]))
    return sorted(batches)


def discover():
    """Every (network, target, batch) whose records-only build takes a layer from records."""
    from aotconv.spec import shipped_networks
    from aotconv.tune.records import DATA_DIR
    cases = []
    for target in sorted(p.stem for p in DATA_DIR.glob("*.jsonl")):
        for batch in shipped_batches(target):
            for net in shipped_networks():
                snap = snapshot(net, target, batch)
                if any(l["source"] == "record" for l in snap["layers"]):
                    cases.append(snap)
    return cases


def write_golden(path=GOLDEN):
    import aotconv
    root = Path(aotconv.__file__).resolve().parent.parent
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cases = discover()
    doc = dict(commit=commit,
               how="records-only builds, no OpenCL device, empty user cache, shipped records "
                   "of that commit; regenerate with: python tests/test_shipped_choices.py --write",
               cases=cases)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# -- the test ------------------------------------------------------------------------------------

def _golden_cases():
    if not GOLDEN.is_file():
        return []
    return json.loads(GOLDEN.read_text())["cases"]


def _same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _differences(want, got):
    """Readable lines: what differs between the golden case and the recomputed one."""
    out = []
    w = {l["layer"]: l for l in want["layers"]}
    g = {l["layer"]: l for l in got["layers"]}
    for name in list(w) + [n for n in g if n not in w]:
        if name not in g:
            out.append(f"layer {name}: gone (was {w[name]['variant']} {w[name]['config']})")
        elif name not in w:
            out.append(f"layer {name}: new ({g[name]['variant']} {g[name]['config']})")
        elif not _same(w[name], g[name]):
            for k in w[name]:
                if not _same(w[name].get(k), g[name].get(k)):
                    out.append(f"layer {name} {k}: {w[name].get(k)} -> {g[name].get(k)}")
    if [l["layer"] for l in want["layers"]] != [l["layer"] for l in got["layers"]] and not out:
        out.append("layer order changed")
    for k in ("pool_fusion", "layout_conversions", "layout_plan_changed"):
        a, b = want[k], got[k]
        for i in range(max(len(a), len(b))):
            x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
            if not _same(x, y):
                out.append(f"{k}[{i}]: {x} -> {y}")
    return out


CASES = _golden_cases()


def test_golden_file_covers_the_shipped_records():
    """Every target with shipped records has cases, each taking some layers from records."""
    from aotconv.tune.records import DATA_DIR
    assert CASES, f"{GOLDEN} is missing or empty"
    targets = {c["target"] for c in CASES}
    assert targets == {p.stem for p in DATA_DIR.glob("*.jsonl")}
    for c in CASES:
        assert c["batch"] in shipped_batches(c["target"])
        assert any(l["source"] == "record" for l in c["layers"])


def _quick(case):
    """make test: each network at its smallest batch, and every batch of the two quickest
    (alexnet, nin) so that every batch runs; the slow tier the rest."""
    smallest = min(c["batch"] for c in CASES
                   if (c["network"], c["target"]) == (case["network"], case["target"]))
    return case["batch"] == smallest or case["network"] in ("alexnet", "nin")


@pytest.mark.parametrize("case", [
    pytest.param(c, id=f"{c['network']}-{c['target']}-b{c['batch']}",
                 marks=() if _quick(c) else pytest.mark.slow) for c in CASES])
def test_shipped_choices_unchanged(case):
    got = snapshot(case["network"], case["target"], case["batch"])
    diff = _differences(case, got)
    assert not diff, (f"{case['network']} --target {case['target']} --batch {case['batch']}: "
                      f"the build from the shipped records chose differently:\n  "
                      + "\n  ".join(diff))


def _covered(case):
    """Every layer but the layout conversions has a record: what `--require-tuned` promises
    to build from the shipped records alone."""
    return all(l["source"] != "fallback" for l in case["layers"] if l["op"] != "layout_convert")


def require_tuned_build(net, target, batch, precision="fp32"):
    """The schedule of a records-only `--require-tuned` build, device hidden, before emit."""
    from aotconv.compiler import compile_network
    with records_only_build() as got, tempfile.TemporaryDirectory() as out:
        with contextlib.redirect_stderr(open(os.devnull, "w")):
            try:
                compile_network(net, target=target, outdir=out, batch=batch, precision=precision,
                                tune_mode="records", require_tuned=True, quiet=True)
            except _Stop:
                pass
    return got["schedule"]


@pytest.mark.parametrize("case", [
    pytest.param(c, id=f"{c['network']}-{c['target']}-b{c['batch']}",
                 marks=() if _quick(c) else pytest.mark.slow)
    for c in CASES if _covered(c)])
def test_a_covered_network_builds_with_require_tuned(case):
    """Where the records cover every layer, `aotconv build NET --target T --require-tuned`
    builds without a device: the layout plan keeps to conversions the records time
    (layouts.plan_network), so no conversion it inserts is left to an untuned fallback."""
    sch = require_tuned_build(case["network"], case["target"], case["batch"])
    untuned = [n for n, c in sch.choices.items() if c.source == "fallback"]
    assert not untuned, untuned
    assert sch.conversions == [n for n in sch.conversions if sch.choices[n].time_ms]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python tests/test_shipped_choices.py --write   (regenerates {GOLDEN})")
    doc = write_golden()
    print(f"{GOLDEN}: {len(doc['cases'])} cases from {doc['commit'][:12]}")
    for c in doc["cases"]:
        n = sum(l["source"] == "record" for l in c["layers"])
        print(f"  {c['network']} {c['target']} b{c['batch']}: {n} of {len(c['layers'])} "
              f"layers from records")

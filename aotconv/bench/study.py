"""The search-quality study (CLTune's experiment), one command:

    python -m aotconv.bench.study --target h100 --max-points 200

1. For each benchmark layer (aotconv.bench.sets), measure every candidate of its pruned space
   on the device (all conv variants together), in parallel compiles, writing the exhaustive
   log as tuning records (--logs, default results/<target>/study-logs/<layer>.jsonl; they
   double as records a build can use).
2. Replay every strategy against each log (no device): for 1/32 and 1/8 of the space, over
   `--runs` seeds, the median and worst % of the exhaustive best reached.
3. Write the table (--md, default: --out with .md) with the command that made it, and the JSON
   (--out, default build/study/search-study-<target>.json; results/<target>/search-study.*
   keep the current one).

`--scale S` shrinks the layers (batch 1, channels and image / S) so that the whole study runs
on PoCL in minutes (logs in results/<target>/study-logs-scale<S>/); `--replay-only` redoes
steps 2-3 from the logs already there.
"""
import importlib.util
import json
import math
import os
from pathlib import Path
import statistics
import sys
import time

import numpy as np

from ..context import BuildContext
from ..errors import AotconvError
from ..space import layer_space
from ..spec import network_from_dict
from ..targets import get_target
from ..tune.measure import Measurer
from ..tune.records import Key, Store
from ..tune.replay import Recorded, quality
from ..tune.search import fallback_candidate
from . import script
from .sets import SETS

MODULE = "aotconv.bench.study"
REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_LAYERS = ["alex.conv2", "vgg.conv3_2", "vgg.conv5_1", "boda.03.k1s1o112i14c512"]
STRATEGIES = ["random", "annealing:T=2", "annealing:T=4", "annealing:T=6", "pso:S=3", "pso:S=6",
              "model"]
FRACTIONS = (32, 8)


def benchmark_layers(path=None):
    """{name: (N, C, H, W, K, R, S, stride, pad)} of every benchmark set: aotconv's own
    (aotconv.bench.sets), or those of a Python file of the same form (a SETS dict)."""
    sets = SETS
    if path is not None:
        spec = importlib.util.spec_from_file_location("benchmark_layers", Path(path))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sets = mod.SETS
    return {row[0]: tuple(row[1:]) for rows in sets.values() for row in rows}


def study_layer(name, dims, scale=1):
    """A one-layer network's conv layer for benchmark dims, shrunk by `scale` if > 1."""
    n, c, h, w, k, r, s, stride, pad = dims
    if scale > 1:
        n = 1
        c, k = max(1, c // scale), max(1, k // scale)
        h, w = max(r, h // scale), max(s, w // scale)
    net = network_from_dict({"name": "study", "input": [n, c, h, w], "layers": [
        {"name": name.replace(".", "_"), "op": "conv", "out": k, "kernel": [r, s],
         "stride": stride, "pad": pad}]})
    return net.layers[0]


def default_logs(target, scale=1):
    """Where a study's logs go unless --logs says: results/<target>/study-logs[-scale<S>]."""
    return Path("results") / target / ("study-logs" + (f"-scale{scale}" if scale > 1 else ""))


def default_out(target, scale=1):
    return Path("build") / "study" / (f"search-study-{target}"
                                      + (f"-scale{scale}" if scale > 1 else "") + ".json")


def log_path(logs, name):
    return Path(logs) / f"{name}.jsonl"


def record_exhaustive(layer, target, path, jobs=None, max_points=None, seed=0, quiet=False,
                      variants=None):
    """Measure every candidate of `layer` (or a seeded sample of `max_points`) into `path`."""
    ctx = BuildContext.make(target, mode="tune").require_device()
    live, device = ctx.target, ctx.device
    full = sp = layer_space(layer, live)
    if variants:
        sp = layer_space(layer, live, [p.variant for p in full.parts
                                       if p.variant.name in variants])
    cands = sp.candidates
    fb = fallback_candidate(layer, live, full)      # the untuned choice, whatever is studied
    if max_points and len(cands) > max_points:
        rng = np.random.default_rng(seed)
        pick = sorted(rng.choice(len(cands), size=max_points, replace=False))
        cands = [cands[i] for i in pick]
    if fb not in cands:
        cands.append(fb)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    store = Store(write=[path])
    keys = {p.variant.name: Key(layer, p.variant, live, device) for p in full.parts}
    variants = {p.variant.name: p.variant for p in full.parts}
    t0 = time.time()
    done = [0]

    def on_outcome(c, o):
        extra = {"fallback": True} if c == fb else {}
        store.append(keys[c.variant], c.cfg, o, layer=layer.name, **extra)
        done[0] += 1
        if not quiet:
            print(f"\r  {layer.name}: {done[0]}/{len(cands)} measured", end="", file=sys.stderr,
                  flush=True)

    with Measurer(live, jobs=jobs) as m:
        for s in range(0, len(cands), 64):
            m.measure(layer, cands[s:s + 64], variants, on_outcome)
    if not quiet:
        print(f" ({time.time() - t0:.0f} s)", file=sys.stderr)
    return {"space": sp.total, "pruned": sp.pruned, "candidates": len(sp.candidates),
            "measured": len(cands), "seconds": round(time.time() - t0, 1)}


def analyse(path, runs=24, strategies=STRATEGIES, fractions=FRACTIONS):
    """Replays of every strategy against one exhaustive log."""
    rec = Recorded.from_file(path)
    n = len(rec.grid)
    valid = rec.valid
    best = rec.best
    out = {"points": n, "valid": int(len(valid)), "best_ms": best,
           "best": str(rec.grid.points[int(rec.costs.argmin())]) if n else None,
           "space_median_pct": 100 * best / float(statistics.median(valid)) if len(valid) else 0,
           "fallback_ms": None, "speedup": None, "strategies": {}}
    if rec.fallback is not None:
        fc = rec.costs[rec.grid.index[rec.fallback]]
        out["fallback_ms"] = float(fc) if math.isfinite(fc) else None
        out["fallback"] = str(rec.fallback)
        if math.isfinite(fc):
            out["speedup"] = float(fc / best)
    for s in strategies:
        row = {}
        for f in fractions:
            trials = max(1, round(n / f))
            q = quality(rec, s, trials, range(runs))
            row[f"1/{f}"] = {"trials": trials, "median": statistics.median(q), "worst": min(q),
                             "mean": statistics.fmean(q)}
        out["strategies"][s] = row
    return out


def markdown(study):
    t = study["target"]
    lines = [f"# Search-quality study on {t}", "",
             "CLTune's experiment (Nugteren & Codreanu, section V.B): every candidate of each "
             "layer's pruned space measured once (the exhaustive log), then each strategy "
             f"replayed against the log {study['runs']} times with seeds 0..{study['runs'] - 1}, "
             "given 1/32 and 1/8 of the space as its budget. Cells: median / worst % of the "
             "exhaustive best reached (100 = found the best). `model` is aotconv's own "
             "cost-model-guided search.", "",
             "Made with:", "", f"    {study['command']}", ""]
    if study.get("scale", 1) > 1:
        lines += [f"Layers shrunk by --scale {study['scale']} (batch 1, channels and image "
                  f"divided by {study['scale']}) to fit the device.", ""]
    lines += ["## Layers", "",
              "| layer | shape (N,C,H,W -> K, RxS, stride, pad) | space | pruned | measured | "
              "valid | best | best config | fallback | tuned vs untuned | random point |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, L in study["layers"].items():
        a = L["analysis"]
        d = L["dims"]
        shape = f"{d[0]},{d[1]},{d[2]},{d[3]} -> {d[4]}, {d[5]}x{d[6]}, {d[7]}, {d[8]}"
        sp = L.get("recorded", {})
        lines.append(
            f"| {name} | {shape} | {sp.get('space', '-')} | {sp.get('pruned', '-')} | "
            f"{a['points']} | {a['valid']} | {a['best_ms']:.4g} ms | `{a['best']}` | "
            f"{'%.4g ms' % a['fallback_ms'] if a['fallback_ms'] else '-'} | "
            f"{'%.2fx' % a['speedup'] if a['speedup'] else '-'} | "
            f"{a['space_median_pct']:.0f}% |")
    lines += ["", "'random point': the median valid candidate's % of the best (CLTune's "
              "'search space' violin).", ""]
    strategies = list(next(iter(study["layers"].values()))["analysis"]["strategies"])
    for f in FRACTIONS:
        lines += [f"## Budget 1/{f} of the space", "",
                  "| strategy | " + " | ".join(study["layers"]) + " | mean of medians |",
                  "|---|" + "---|" * (len(study["layers"]) + 1)]
        for s in strategies:
            cells, meds = [], []
            for L in study["layers"].values():
                c = L["analysis"]["strategies"][s][f"1/{f}"]
                cells.append(f"{c['median']:.0f} / {c['worst']:.0f} ({c['trials']})")
                meds.append(c["median"])
            lines.append(f"| {s} | " + " | ".join(cells) + f" | {statistics.fmean(meds):.1f} |")
        lines += ["", "(trials in parentheses)", ""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = script.parser(MODULE, __doc__)
    p.add_argument("--target", default="auto")
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS),
                   help="benchmark layer names, comma separated")
    p.add_argument("--benchmarks", help="a Python file with a SETS dict of benchmark tuples "
                                        "(default: aotconv.bench.sets)")
    p.add_argument("--scale", type=int, default=1, help="shrink the layers by this factor")
    p.add_argument("--runs", type=int, default=24, help="seeded runs per strategy (>= 20)")
    p.add_argument("--strategies", default=",".join(STRATEGIES).replace(",", ";"),
                   help="strategies separated by ';'")
    p.add_argument("--logs", help="folder of the exhaustive logs, one <layer>.jsonl each "
                                  "(default results/<target>/study-logs, -scale<S> when scaled)")
    p.add_argument("--out", help="the study's JSON (default "
                                 "build/study/search-study-<target>[-scale<S>].json)")
    p.add_argument("--md", help="markdown table (default: --out with .md)")
    p.add_argument("--jobs", type=int, help="parallel compiles")
    p.add_argument("--max-points", type=int, help="measure a seeded sample of at most this "
                                                  "many points per layer")
    p.add_argument("--variants", help="only these variants (comma separated; default: all "
                                      "that support the layer)")
    p.add_argument("--keep", action="store_true", help="do not re-record a layer whose log "
                                                        "exists")
    p.add_argument("--replay-only", action="store_true", help="use the logs already recorded")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)

    target = get_target(a.target)
    bench = benchmark_layers(a.benchmarks)
    names = [x.strip() for x in a.layers.split(",") if x.strip()]
    unknown = [n for n in names if n not in bench]
    if unknown:
        raise AotconvError(f"unknown benchmark layers {unknown}; known: {sorted(bench)}")
    logs = Path(a.logs) if a.logs else default_logs(target.name, a.scale)
    out = Path(a.out) if a.out else default_out(target.name, a.scale)
    study = {"target": target.name, "scale": a.scale, "runs": a.runs,
             "command": script.command(MODULE, argv),
             "layers": {}}
    strategies = [s for s in a.strategies.split(";") if s]
    for name in names:
        layer = study_layer(name, bench[name], a.scale)
        path = log_path(logs, name)
        entry = {"dims": list(layer.in_shape) + [layer.out_shape[1], *layer.attrs["kernel"],
                                                 layer.attrs["stride"][0],
                                                 layer.attrs["pad"][0]]}
        if a.keep and path.is_file():
            entry["recorded"] = {"measured": sum(1 for _ in open(path)), "kept": True}
        elif not a.replay_only:
            entry["recorded"] = record_exhaustive(
                layer, target, path, a.jobs, a.max_points, quiet=a.quiet,
                variants=[v for v in (a.variants or "").split(",") if v])
        elif not path.is_file():
            raise AotconvError(f"no log {path}; run without --replay-only first")
        else:
            old = {}
            if out.is_file():
                old = json.loads(out.read_text()).get("layers", {}).get(name, {})
            entry["recorded"] = old.get("recorded", {})
        entry["log"] = os.path.relpath(path, REPO)
        entry["analysis"] = analyse(path, a.runs, strategies)
        study["layers"][name] = entry
    table = markdown(study)
    script.write_results(out, study, table, a.md)
    print(table)
    return 0


entry = script.entry("study", main)


if __name__ == "__main__":
    sys.exit(entry())

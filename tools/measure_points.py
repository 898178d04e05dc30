"""Measure chosen points the way the tuner does, and keep them as tuning records.

    python3 tools/measure_points.py points.json [--target h100] [--jobs 16]

points.json is a list of {"layer": [name, N, C, H, W, K, R, S, stride, pad] (a benchmark
layer, as aotconv bench builds it) or "net": "vgg16", "batch": 16, "layer_name": "conv2_1"
(a layer of a shipped network), "variant", "cfgs": ["K=V,...", ...]}. Every point goes
through the tuner's Measurer (parallel compiles, fresh random data, verification against the
float64 reference, cold-cache timing) and its outcome is appended to the tuning records
(the cache, or --tuning-db), so a later `aotconv tune`/`bench`/`build` on the same device
uses it like any tuned point. A table (ms, TFLOP/s, % of the target's peak) goes to stdout
and --out as JSON. The tool behind A/B experiments on kernel changes: the points come from
the experimenter, not from a search strategy.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotconv.bench.sets import conv_layer                                  # noqa: E402
from aotconv.ops import flops                                              # noqa: E402
from aotconv.space import Candidate, point_ok                              # noqa: E402
from aotconv.context import BuildContext                                  # noqa: E402
from aotconv.errors import AotconvError                                   # noqa: E402
from aotconv.targets import TARGETS, detect                               # noqa: E402
from aotconv.tune.measure import Measurer                                  # noqa: E402
from aotconv.tune.records import Key                                       # noqa: E402
from aotconv.variants import BY_NAME                                       # noqa: E402
from aotconv.variants.base import Config                                   # noqa: E402


def parse_cfg(text):
    items = []
    for part in text.split(","):
        k, v = part.split("=")
        items.append((k.strip(), int(v) if v.strip().lstrip("-").isdigit() else v.strip()))
    return Config(tuple(items))


def layer_of(case):
    if "layer" in case:
        return conv_layer(tuple(case["layer"]))[0]
    from aotconv.spec import load_network
    from aotconv.passes import optimise
    net = optimise(load_network(case["net"], batch=case.get("batch")))
    try:
        return net.layer(case["layer_name"])
    except KeyError:
        raise SystemExit(f"{case['net']} has no layer '{case['layer_name']}'; its layers: "
                         f"{', '.join(l.name for l in net.layers)}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("points")
    ap.add_argument("--target", default="auto")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--tuning-db", help="records file to append to (default: the cache)")
    ap.add_argument("--out", help="JSON of the rows")
    a = ap.parse_args(argv)
    target = detect() if a.target == "auto" else TARGETS[a.target]
    try:
        ctx = BuildContext.make(target, mode="tune", tuning_db=a.tuning_db).require_device()
    except AotconvError as e:
        print(f"measure_points: {e}", file=sys.stderr)
        return 2
    live, device, store = ctx.target, ctx.device, ctx.store
    rows = []
    with Measurer(live, jobs=a.jobs) as m:
        for case in json.loads(Path(a.points).read_text()):
            layer, v = layer_of(case), BY_NAME[case["variant"]]
            cfgs = [parse_cfg(c) for c in case["cfgs"]]
            bad = [str(c) for c in cfgs if not point_ok(layer, v, c, live)]
            for c in bad:
                print(f"{layer.name}: not a valid point, skipped: {c}", flush=True)
            cfgs = [c for c in cfgs if str(c) not in bad]
            key = Key(layer, v, live, device)
            label = case.get("name", layer.name)

            def keep(cand, o, key=key, layer=layer, label=label):
                store.append(key, cand.cfg, o, layer=layer.name)
                row = {"name": label, "variant": cand.variant, "cfg": str(cand.cfg),
                       "status": o.status.value if hasattr(o.status, "value") else str(o.status)}
                if o.ok:
                    row["ms"] = o.time_ms
                    row["tflops"] = flops(layer) / o.time_ms / 1e9
                    row["pct_peak"] = 100 * row["tflops"] * 1e3 / live.peak_gflops
                    print(f"{label:14s} {o.time_ms:8.4f} ms {row['tflops']:6.1f} TFLOP/s "
                          f"{row['pct_peak']:5.1f}%  {cand.cfg}", flush=True)
                else:
                    row["message"] = (o.message or "")[:300]
                    print(f"{label:14s} {row['status']}: {row['message'][:120]}  {cand.cfg}",
                          flush=True)
                rows.append(row)
                if a.out:
                    Path(a.out).write_text(json.dumps(rows, indent=1))

            m.measure(layer, [Candidate(v.name, c) for c in cfgs], {v.name: v}, keep)
    best = {}
    for r in rows:
        if "ms" in r and (r["name"] not in best or r["ms"] < best[r["name"]]["ms"]):
            best[r["name"]] = r
    print("\nbest per layer:")
    for name, r in best.items():
        print(f"{name:14s} {r['ms']:8.4f} ms {r['pct_peak']:5.1f}%  {r['cfg']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

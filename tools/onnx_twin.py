"""An imported torchvision model against its shipped net.yaml twin: both built from the same
records (no tuning), both timed the same way (tools/time_library.py's medians, each in a process of its own, then
both in one process in turn, round after round, which no ordering or host noise favours), and
their kernels compared (variant and configuration per layer), one table.

    python tools/onnx_twin.py --target h100 --models resnet50,mobilenet_v2 --out build/twin

With --onnx-budget, both builds tune with that budget, so the imported one tunes what the
records lack (an exporter that
drops an all-zero bias makes a layer of another signature).
The model is exported with tests/zoo/models.py (seeded weights, randomised BatchNorm statistics,
torch.onnx.export dynamo=True); `aotconv build model.onnx --records-only --check` compares the
library with onnxruntime (or the numpy reference) before it is timed.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
sys.path.insert(0, str(ROOT / "tools"))


def build(source, target, out, check, budget=None):
    how = ["--budget", budget] if budget else ["--records-only"]
    cmd = [sys.executable, "-m", "aotconv.cli", "build", str(source), "--target", target,
           *how, "--quiet", "-o", str(out)] + (["--check"] if check else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    warn = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    if r.returncode != 0:
        raise SystemExit(f"build of {source} failed ({r.returncode}):\n" + "\n".join(warn[-20:]))
    return warn


def choices(d):
    """[(layer, variant, config)] of a build, in the order of its layers."""
    meta = json.loads((Path(d) / "tuning.json").read_text())
    return [(L["layer"], L["variant"], json.dumps(L.get("config"), sort_keys=True))
            for L in meta["layers"]]


def interleaved(dirs, rounds=20, per_round=10):
    """Both libraries loaded in this process and timed in turn, round after round, so that
    neither gets the quieter moments of the host: each one's median run() from its pinned
    buffers and median kernel sum over every run."""
    import time
    import numpy as np
    from aotconv.runtime import load
    nets = [load(d, profile=True) for d in dirs]     # the kernels' times: profile()
    try:
        for net in nets:
            xin, _ = net.host_buffers()
            xin[...] = np.random.default_rng(0).standard_normal(xin.shape).astype(np.float32)
            for _ in range(5):
                net.run_host()
        wall = [[] for _ in nets]
        kern = [[] for _ in nets]
        for _ in range(rounds):
            for i, net in enumerate(nets):
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    net.run_host()
                    wall[i].append((time.perf_counter() - t0) * 1e3)
                    kern[i].append(sum(ms for _, ms in net.profile()))
        return [(float(np.median(w)), float(np.median(k))) for w, k in zip(wall, kern)]
    finally:
        for net in nets:
            net.close()


def main(argv=None):
    import models
    from time_library import main as time_main
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--exporter", default="dynamo", choices=models.EXPORTERS)
    ap.add_argument("--out", default="build/twin")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--onnx-budget", help="build both with this tuning budget, so that the "
                    "layers the records lack are tuned (default: records only, fallbacks there)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    rows = []
    for name in a.models.split(","):
        onnx_path = models.export(name, a.exporter, out / "onnx")
        row = {"model": name, "exporter": a.exporter}
        for kind, source, check, budget in (("onnx", onnx_path, True, a.onnx_budget),
                                            ("yaml", name, False, a.onnx_budget)):
            d = out / f"{name}-{kind}"
            row[f"{kind}_build_messages"] = build(source, a.target, d, check, budget)
            js = out / f"{name}-{kind}.json"
            time_main([str(d), "--label", f"{name} {kind}", "--runs", str(a.runs),
                       "--json", str(js)])
            row[kind] = json.loads(js.read_text())
            kernels = (d / "report.md").read_text() if (d / "report.md").exists() else ""
            row[f"{kind}_report_lines"] = len(kernels.splitlines())
        a_ch, b_ch = choices(out / f"{name}-onnx"), choices(out / f"{name}-yaml")
        same = sorted((v, c) for _, v, c in a_ch) == sorted((v, c) for _, v, c in b_ch)
        row["same_kernels"] = same
        (ow, ok), (yw, yk) = interleaved([out / f"{name}-onnx", out / f"{name}-yaml"])
        row["interleaved"] = {"onnx_pinned_ms": round(ow, 4), "yaml_pinned_ms": round(yw, 4),
                              "onnx_kernels_ms": round(ok, 4), "yaml_kernels_ms": round(yk, 4),
                              "ratio_pinned": round(ow / yw, 3), "ratio_kernels": round(ok / yk, 3)}
        print(f"{name}: {'the same' if same else 'DIFFERENT'} kernels (variant and configuration "
              f"per layer: {len(a_ch)} and {len(b_ch)} layers); timed in turn in one process: "
              f"imported {ow:.3f} ms, twin {yw:.3f} ms from pinned buffers (ratio {ow / yw:.3f}), "
              f"kernels {ok:.3f} and {yk:.3f} ms (ratio {ok / yk:.3f})")
        row["ratio_run"] = round(row["onnx"]["run_ms"] / row["yaml"]["run_ms"], 3)
        row["ratio_pinned"] = round(row["onnx"]["pinned_run_ms"] / row["yaml"]["pinned_run_ms"], 3)
        rows.append(row)
        print(f"{name}: imported {row['onnx']['pinned_run_ms']:.3f} ms in "
              f"{row['onnx']['launches']} launches, net.yaml twin {row['yaml']['pinned_run_ms']:.3f} "
              f"ms in {row['yaml']['launches']}: ratio {row['ratio_pinned']:.3f} (pinned), "
              f"{row['ratio_run']:.3f} (run())")
    (out / "twin.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

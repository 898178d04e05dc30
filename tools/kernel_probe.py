"""Time chosen (layer, variant, cfg[, template]) cases on the device present and keep their
device binaries: the tool behind kernel A/B experiments on the GPU.

    python3 tools/kernel_probe.py cases.json --out DIR [--target h100] [--repeats 20]

cases.json is a list of {"name", "layer": [name, N, C, H, W, K, R, S, stride, pad],
"variant", "cfg": "K=V,...", "template": optional path under templates/ to render instead of
the variant's own, "options": optional extra OpenCL build options, e.g.
"-cl-nv-maxrregcount=192"}. Each case is built and measured by aotconv.protocol, as the tuner
and the bench measure: its output poisoned, checked on the first image against the float64
reference (hybrid tolerance 1e-3), timed with profiling events (median of --repeats after 3
warm-ups, one copy of the buffers); its program binary is written to DIR/<name>.bin (PTX on
NVIDIA's OpenCL, for `ptxas -v`). The table goes to stdout and DIR/probe.json.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotconv import harness, protocol                                # noqa: E402
from aotconv.bench.device import Device                              # noqa: E402
from aotconv.bench.sets import conv_layer                            # noqa: E402
from aotconv.ops import flops                                        # noqa: E402
from aotconv.targets import TARGETS, detect                          # noqa: E402
from aotconv.variants import BY_NAME                                 # noqa: E402
from aotconv.variants.base import Config                             # noqa: E402


def parse_cfg(text):
    items = []
    for part in text.split(","):
        k, v = part.split("=")
        try:
            v = int(v)
        except ValueError:
            pass
        items.append((k, v))
    return Config(tuple(items))


def probe(case, dev, repeats):
    layer, _ = conv_layer(tuple(case["layer"]))
    v = BY_NAME[case["variant"]]
    cfg = parse_cfg(case["cfg"])
    if case.get("template"):
        v = type(v)()
        v.template = case["template"]
    out = {"name": case["name"], "variant": v.name, "cfg": str(cfg),
           "template": v.template}
    rng = np.random.default_rng(0)
    xs, params = harness.random_inputs(layer, rng)
    ref = protocol.Reference(layer, xs, params, images=1, max_gflop=1e9)
    t0 = time.perf_counter()
    prog = src = None
    if case.get("options"):
        src = v.render(layer, cfg, "k")
        prog = protocol.build(dev.ctx, dev.device, src,
                              harness.BUILD_OPTIONS + case["options"].split(), name=v.name)
        out["options"] = case["options"]
    k = protocol.Kernel(dev.ctx, dev.queue, layer, v, cfg, xs, params, program=prog, source=src)
    out["build_s"] = round(time.perf_counter() - t0, 2)
    out["verify"], _ = protocol.verify(k, ref)
    out["ms"] = protocol.median(protocol.time_repeats(k, 3, repeats))
    out["tflops"] = flops(layer) / out["ms"] / 1e9
    out["pct_peak"] = 100 * out["tflops"] * 1e3 / dev.target.peak_gflops
    out["binary"] = k.program.get_info(cl.program_info.BINARIES)[0]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="auto")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    target = detect() if a.target == "auto" else TARGETS[a.target]
    dev = Device(target)
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in json.loads(Path(a.cases).read_text()):
        try:
            row = probe(case, dev, a.repeats)
            (outdir / f"{case['name']}.bin").write_bytes(row.pop("binary"))
        except Exception as e:                     # keep going: one bad case is one row
            row = {"name": case["name"], "error": f"{type(e).__name__}: {str(e)[:400]}"}
        rows.append(row)
        if "error" in row:
            print(f"{row['name']:28s} ERROR {row['error']}", flush=True)
        else:
            print(f"{row['name']:36s} {row['ms']:8.4f} ms {row['tflops']:6.1f} TFLOP/s "
                  f"{row['pct_peak']:5.1f}% ok={row['verify'].get('ok')} {row['cfg']}",
                  flush=True)
        (outdir / "probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

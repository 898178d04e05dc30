"""The model zoo through the ONNX importer: every model of tests/zoo/models.py, exported by both
PyTorch exporters (and by the dynamo one before its optimiser), imported, built for pocl-cpu (--no-tune, batch 1) and compared with
onnxruntime on the original .onnx (hybrid error < 1e-3 on the logits, the same top-1 class).

    make test-zoo                                    # all of them; writes results/pocl-cpu/zoo.md
    .venv-zoo/bin/python tests/zoo/run_zoo.py --models resnet18,alexnet --exporters dynamo

It needs torch and torchvision (the Makefile's .venv-zoo), onnx and onnxruntime. It prints one
line per case and ends with 'N passed, N failed'; it exits 1 if any case failed: an import
error (every node it names, one line each, goes into the table's notes), a build error, an
error of 1e-3 or more, or a different top-1 class.
"""
import argparse
import datetime
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import models  # noqa: E402

TOL = 1e-3


def run_case(name, exporter, work, seed=0):
    """One row of the table: a dict with the case's figures and, where it failed, why."""
    import onnx
    import onnxruntime as ort
    from aotconv.compiler import compile_network
    from aotconv.errors import AotconvError
    from aotconv.harness import close
    from aotconv.onnx_import import import_model
    from aotconv.runtime import load

    row = dict(model=name, exporter=exporter, nodes=None, layers=None, error=None, top1=None,
               build_s=None, scale=None, ok=False, why="")
    path = models.export(name, exporter, work / "onnx", seed)
    row["nodes"] = len(onnx.load(str(path), load_external_data=False).graph.node)
    try:
        row["layers"] = len(import_model(path, batch=1).network.layers)
        t0 = time.time()
        res = compile_network(str(path), target="pocl-cpu", outdir=work / "lib" /
                              f"{name}-{exporter}", batch=1, tune_mode="fallback",
                              measure=False, quiet=True, seed=seed)
        row["build_s"] = time.time() - t0
    except AotconvError as e:
        row["why"] = str(e)
        return row
    x = np.random.default_rng(seed + 7).standard_normal(models.INPUT_SHAPE).astype(np.float32)
    with load(res.outdir) as lib:
        got = np.asarray(lib(x), np.float64).reshape(x.shape[0], -1)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    want = np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0], np.float64)
    want = want.reshape(x.shape[0], -1)
    ok, err = close(got, want, TOL)
    row["error"], row["scale"] = err, float(np.abs(want).max())
    row["top1"] = bool(np.array_equal(got.argmax(axis=1), want.argmax(axis=1)))
    row["ok"] = ok and row["top1"]
    if not ok:
        row["why"] = f"hybrid error {err:.3g} >= {TOL}"
    elif not row["top1"]:
        row["why"] = "top-1 differs"
    return row


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, command, started, wall):
    import onnx
    import onnxruntime
    import torch
    import torchvision
    lines = [
        "# The model zoo through the ONNX importer, on pocl-cpu",
        "",
        f"    {command}",
        "",
        f"Measured {started:%Y-%m-%d} on {platform.node() or 'this machine'} "
        f"({platform.machine()}, PoCL): torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, onnx {onnx.__version__}, onnxruntime "
        f"{onnxruntime.__version__}, opset {models.OPSET}; {wall / 60:.1f} minutes in all "
        f"(exports cached in build/zoo/onnx, PoCL's kernel cache as the machine had it). Each "
        f"model: torchvision's architecture with weights=None, seeded, BatchNorm running "
        f"statistics randomised; exported by torch.onnx.export with dynamo=True (dynamo), "
        f"dynamo=False (torchscript), and dynamo=True, optimize=False (dynamo-raw: the "
        f"BatchNormalization nodes kept, which the other two fold into the convs themselves, so "
        f"aotconv folds them); `aotconv build model.onnx "
        f"--target pocl-cpu --no-tune --batch 1`; the library's logits against onnxruntime's on "
        f"the same random input (hybrid error: max |ours - ort| / max(1, |ort|); max logit: the largest |logit| of "
        f"onnxruntime's, the scale that error is measured against). ONNX nodes: "
        f"in the exported file; layers: aotconv's after import (before fusion); build: import, "
        f"kernels, C runtime and ninja, in seconds.",
        "",
        "| model | exporter | ONNX nodes | layers | max error | max logit | top-1 equal | build s "
        "| result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        top1 = "-" if r["top1"] is None else ("yes" if r["top1"] else "NO")
        lines.append(f"| {r['model']} | {r['exporter']} | {_fmt(r['nodes'], 'd')} | "
                     f"{_fmt(r['layers'], 'd')} | {_fmt(r['error'], '.1e')} | "
                     f"{_fmt(r['scale'], '.2g')} | {top1} | "
                     f"{_fmt(r['build_s'], '.0f')} | {'pass' if r['ok'] else 'FAIL'} |")
    failed = [r for r in rows if not r["ok"]]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines += [f"{r['model']} ({r['exporter']}):", "", "    " +
                      r["why"].replace("\n", "\n    "), ""]
    lines.append("")
    lines.append(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(models.MODELS))
    ap.add_argument("--exporters", default=",".join(models.EXPORTERS))
    ap.add_argument("--work", default=str(ROOT / "build" / "zoo"))
    ap.add_argument("--out", default=str(ROOT / "results" / "pocl-cpu" / "zoo.md"),
                    help="the table (markdown); '' for none")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    exporters = [e for e in args.exporters.split(",") if e]
    unknown = sorted(set(names) - set(models.MODELS)) + sorted(set(exporters) -
                                                                set(models.EXPORTERS))
    if unknown:
        ap.error(f"unknown {unknown}; models: {', '.join(models.MODELS)}; exporters: "
                 f"{', '.join(models.EXPORTERS)}")
    started, t0 = datetime.datetime.now(), time.time()
    rows = []
    for name in names:
        for exporter in exporters:
            try:
                row = run_case(name, exporter, Path(args.work))
            except Exception as e:                     # a crash is a failure with its trace
                row = dict(model=name, exporter=exporter, nodes=None, layers=None, error=None,
                           top1=None, build_s=None, scale=None, ok=False,
                           why=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            rows.append(row)
            print(f"{name:20s} {exporter:12s} nodes {_fmt(row['nodes'], '4d')} layers "
                  f"{_fmt(row['layers'], '4d')} error {_fmt(row['error'], '.1e')} top-1 "
                  f"{row['top1']} build {_fmt(row['build_s'], '.0f')} s "
                  f"{'pass' if row['ok'] else 'FAIL: ' + row['why'].splitlines()[0]}",
                  flush=True)
    command = "make test-zoo" if len(rows) == len(models.MODELS) * len(models.EXPORTERS) \
        else "python tests/zoo/run_zoo.py " + " ".join(argv if argv is not None
                                                        else sys.argv[1:])
    text = table(rows, command, started, time.time() - t0)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text.rsplit("\n", 2)[-2])
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""One network end to end: build the emitted library with `compile_network`, time its run()
(from numpy memory and from its pinned host buffers) and its per-kernel profile, against
PyTorch eager on a model of the same net.yaml with the same weights (aotconv.torch_model).
The library is timed first, in a process of its own (aotconv.bench.library_timing: as an
application runs it, without PyTorch; --ours-in-process: in this one), then PyTorch in this
process.

The repeat counts follow the protocol's policy for the bench (aotconv.protocol.e2e_counts); the
outputs are compared with the hybrid tolerance before anything is timed.

`--precision tf32|fp16` builds the library in that precision and runs PyTorch in the same
one (refs.torch_ref.Precision), so that every ratio of a row compares two implementations of
one precision; the library's output is also checked against the float64 numpy reference that
its own --check uses (aotconv.precision.check_reference, docs/precision.md), within T.
"""
import json
from pathlib import Path
import time

import numpy as np

from .. import params as params_mod
from .. import precision as precision_mod
from .. import spec, torch_model
from ..compiler import compile_network, judge
from ..harness import close
from ..ops import flops
from ..protocol import e2e_counts
from ..reference import run_network
from .library_timing import in_bench_process, in_own_process
from .refs.torch_ref import Precision, Timer, sync, torch
from .report import best_ours, failure, rounded


def bench_e2e(dev, refs, net_name, batch, opts, notes):
    """Build `net_name` at `batch` (capped by --scale), run the library, compare with torch."""
    net0 = spec.load_network(net_name, batch=batch)
    b0 = net0.input_shape[0]
    if opts.max_batch and b0 > opts.max_batch:
        net0 = spec.load_network(net_name, batch=opts.max_batch)
    b = net0.input_shape[0]
    prec = opts.precision
    row = {"net": net_name, "batch": b, "batch_orig": b0, "precision": prec, "ours": {},
           "torch": {}}
    outdir = Path(opts.workdir) / build_dir_name(net_name, b, prec)
    budget = opts.fit_budget(opts.e2e_budget, 60, f"end to end {net_name} batch {b}", notes)
    row["budget"] = budget
    row["mode"] = ("fallback (no tuner)" if opts.mode == "fallback" else
                   "from the records alone" if opts.mode == "records" else
                   f"tuned, budget {budget or 'default'}")
    t0 = time.monotonic()
    try:
        built = compile_network(net_name, target=opts.target_arg, outdir=outdir, batch=b,
                                tune_mode=opts.mode,
                                budget=budget, strategy=opts.strategy, quiet=opts.quiet,
                                measure=False, seed=opts.seed, precision=prec)
    except Exception as e:
        row["ours"].update(failure(e))
        row["ours"]["error"] = "build failed: " + row["ours"]["error"]
        row["build_s"] = round(time.monotonic() - t0, 1)
        return row
    row["build_s"] = round(time.monotonic() - t0, 1)
    row["build_dir"] = str(outdir)
    # what the library computes in: a tf32 build computes in FP32 where no tensor-core
    # variant served a layer (on a device without tensor cores, every layer)
    row["ours"]["computes"], row["ours"]["arithmetic"] = precision_mod.of_schedule(
        built.schedule, built.target)
    try:
        tj = json.loads((outdir / "tuning.json").read_text())
        row["kernels"] = len(tj.get("kernels", tj.get("layers", [])))
    except Exception:
        pass
    flat = params_mod.random_params(net0, seed=opts.seed)
    x = np.random.default_rng(opts.seed + 1).standard_normal(net0.input_shape).astype(np.float32)
    # the library timed as an application runs it, in a process of its own (PyTorch, timed
    # below, leaves its CUDA context, threads and compile workers in this one), or here with
    # --ours-in-process
    if getattr(opts.a, "ours_in_process", False):
        timed = in_bench_process
        note = ("end to end: ours timed in the bench's own process (--ours-in-process), after "
                "PyTorch's previous rows")
        if note not in notes:
            notes.append(note)
    else:
        timed = in_own_process
    ours, y = timed(outdir, flat, x, opts)
    row["ours"].update(ours)
    if "error" in ours:
        row["ours"]["error"] = "run failed: " + ours["error"]
        return row
    if prec != "fp32":
        # PyTorch in half or TF32 is another rounding of the same model, not a reference
        # within T: the library is held to the one its --check derives
        row["numpy"] = numpy_check(built.schedule, net0, flat, x, y, opts)
    if refs.torch_device is None:
        row["torch"]["note"] = refs.status["torch"]["note"]
        return row
    between = None
    if getattr(opts, "e2e_rounds", 1) > 1 and refs.torch_device == "cuda":
        def between():
            return resident_round(timed, outdir, flat, x, y, opts)
    try:
        row["torch"], yt = torch_e2e(net0, flat, x, refs.torch_device, opts, prec,
                                     between=between)
        ys = y if isinstance(y, list) else [y]
        yts = yt if isinstance(yt, list) else [yt]
        errs = [close(a, b)[1] for a, b in zip(ys, yts)]
        row["max_error"] = max(errs)
        row["match"] = row["max_error"] <= 1e-3
        o, t = row["ours"], row["torch"]
        row["ratio_wall"] = o["run_ms"] / t["wall_ms"] if t.get("wall_ms") else None
        row["ratio_kernels"] = o["kernels_ms"] / t["eager_ms"] if t.get("eager_ms") else None
        ours = best_ours(o)
        row["ratio_best"] = ours / t["best_ms"] if t.get("best_ms") else None
        if t.get("rounds"):
            row["rounds"] = rounds_summary(o, t)
    except Exception as e:
        row["torch"] = {"note": "failed", **failure(e)}
    return row


def build_dir_name(net_name, batch, precision):
    """The end-to-end build's directory under --workdir: one per network, batch and precision
    (an fp16 run does not rebuild over the fp32 library of the same network)."""
    return f"{net_name}-b{batch}" + ("" if precision == "fp32" else f"-{precision}")


def numpy_check(sch, net0, flat, x, y, opts):
    """The library's output `y` on the first --verify-images images of `x` against the float64
    numpy reference that the --check of its build compares with (aotconv.precision
    .check_reference: the operands rounded to TF32, or every weight and stored output rounded
    to half, as the library rounds them; the plain reference where the build computes in
    FP32), with the FP32 tolerance T: {reference, images, error, tolerance, within}, and
    where an fp16 check fails `resolution`, how far the same reference evaluated in float32 is
    from it (what half storage itself does on this network, docs/precision.md). {skipped}
    when --verify-images is 0 or the reference would cost more than --verify-max-gflop."""
    n = net0.input_shape[0]
    k = min(opts.verify_images, n)
    if k < 1:
        return {"skipped": "--verify-images 0"}
    gflop = sum(flops(l) for l in net0.layers) / n * k / 1e9
    if gflop > opts.verify_max_gflop:
        return {"skipped": f"the reference of {k} image{'s' if k > 1 else ''} would cost "
                           f"{gflop:.0f} GFLOP (--verify-max-gflop {opts.verify_max_gflop:g})"}
    ref = precision_mod.check_reference(sch, net0, flat)
    name = getattr(ref, "name", "the float64 numpy reference")
    if ref is None:
        ref = lambda v: run_network(net0, v, params_mod.split(net0, flat))   # noqa: E731
    xs = x[:k]
    try:
        want = ref(xs)
    except Exception as e:
        return {"reference": name, "images": k, **failure(e)}
    got = [v[:k] for v in (y if isinstance(y, list) else [y])]
    err, tol, spread = judge(got, ref, xs, want)
    out = {"reference": name, "images": k, "error": err, "tolerance": tol, "within": err <= tol}
    if spread is not None:
        out["spread"] = spread
    return out


def resident_round(timed, outdir, flat, x, y, opts):
    """One more round of our device-resident timing (`timed`: in_own_process or
    in_bench_process, resident_only): its ms, or a sentence saying why there is none (its
    output differing from the first round's is one)."""
    ours, y2 = timed(outdir, flat, x, opts, resident_only=True)
    if ours.get("run_resident_ms") is None:
        return ours.get("run_resident_error") or ours.get("error") or "no time"
    ys = y if isinstance(y, list) else [y]
    y2s = y2 if isinstance(y2, list) else [y2]
    if len(ys) != len(y2s) or not all(np.array_equal(a, b) for a, b in zip(ys, y2s)):
        return "the output differs from the first round's"
    return ours["run_resident_ms"]


def rounds_summary(ours, torch_res):
    """{ours, reference, ratios, ratio_median, way} over the interleaved rounds: round 1 is
    the row's own timing (ours on the device-resident input, the reference's best way); a
    round where ours gave no time is left out of the ratios and says why in `notes`."""
    way = torch_res["best"][:-3]
    o = [ours.get("run_resident_ms")] + [r["ours"] for r in torch_res["rounds"]]
    t = [torch_res["best_ms"]] + [r["reference"] for r in torch_res["rounds"]]
    pairs = [(a, b) for a, b in zip(o, t) if isinstance(a, float) and isinstance(b, float)]
    ratios = [a / b for a, b in pairs]
    return {"way": way, "ours": [a if isinstance(a, float) else None for a in o],
            "reference": t, "ratios": [round(r, 4) for r in ratios],
            "ratio_median": float(np.median(ratios)) if ratios else None,
            "ahead": sum(r < 1 for r in ratios), "rounds": len(o),
            "notes": [a for a in o if isinstance(a, str)]}


def torch_e2e(net0, flat, x, device, opts, precision="fp32", between=None):
    """PyTorch on a model of the same net in `precision` (refs.torch_ref.Precision): eager
    device time (CUDA events, input resident) and wall time including the input upload and
    output download, as our run() does (the float input uploaded and cast on the device, the
    output widened to float there, as our library's casts do); on a GPU also replayed from a
    CUDA graph and through torch.compile, every way under the same precision settings.

    `between()` (with --e2e-rounds N > 1): our timing of one more round, called N - 1 times,
    each followed by the best way timed again with the same counts, so that both sides are
    sampled alternately over the same stretch of the GPU's time: res["rounds"] is
    [{ours, reference}] for rounds 2..N."""
    t = torch()
    with Precision(precision, device) as prec:
        model = prec.model(torch_model.build(net0, flat, device))
        xd = prec.input(t.from_numpy(x).to(device))
        with t.no_grad():
            y = model(xd)
            ys = [v.float().cpu().numpy() for v in (y if isinstance(y, list) else [y])]
            timer = Timer(device)
            warmup, repeats = e2e_counts(timer(lambda: model(xd)), opts)
            for _ in range(warmup):
                model(xd)
            sync(device)
            eager = [timer(lambda: model(xd)) for _ in range(repeats)]
            walls = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = model(prec.input(t.from_numpy(x).to(device)))
                (out if not isinstance(out, list) else out[0]).float().cpu()
                walls.append((time.perf_counter() - t0) * 1e3)
        res = {"eager_ms": float(np.median(eager)), "wall_ms": float(np.median(walls)),
               "eager_times": rounded(eager), "settings": prec.settings()}
        runners = {"eager": lambda: model(xd)}
        if device == "cuda":
            res.update(_timed_variant("graph", lambda: cuda_graph(model, xd), ys, timer,
                                      warmup, repeats, runners))
            for mode in opts.torch_compile:
                res.update(_timed_variant(f"compile_{mode.replace('-', '_')}",
                                          lambda m=mode: compiled(model, xd, m), ys, timer,
                                          warmup, repeats, runners))
        best = [(k, v) for k, v in res.items() if k.endswith("_ms") and k != "wall_ms"]
        if best:
            res["best"], res["best_ms"] = min(best, key=lambda kv: kv[1])
            if between is not None:
                res["rounds"] = _rounds(runners[res["best"][:-3]], between, timer, warmup,
                                        repeats, opts.e2e_rounds - 1, device)
    return res, (ys[0] if len(ys) == 1 else ys)


def cuda_graph(model, xd):
    """The model captured in a CUDA graph on a static input: a replay launches every kernel
    with no Python and no per-op launch cost (what torch.compile's reduce-overhead uses)."""
    t = torch()
    static = xd.clone()
    s = t.cuda.Stream()
    s.wait_stream(t.cuda.current_stream())
    with t.cuda.stream(s):
        for _ in range(3):
            model(static)
    t.cuda.current_stream().wait_stream(s)
    g = t.cuda.CUDAGraph()
    with t.cuda.graph(g):
        out = model(static)
    g.replay()
    return g.replay, (lambda: out)


def compiled(model, xd, mode):
    """torch.compile of the model in `mode`, compiled and warmed up before it is timed."""
    t = torch()
    fn = t.compile(model, mode=mode)
    for _ in range(3):
        fn(xd)
    return (lambda: fn(xd)), (lambda: fn(xd))


def _rounds(run, between, timer, warmup, repeats, n, device):
    """`n` rounds of ours (`between()`) then `run` timed as before (the same counts, under
    no_grad as it was timed): [{ours, reference}]."""
    t = torch()
    out = []
    with t.no_grad():
        for _ in range(n):
            ours_ms = between()
            for _ in range(warmup):
                run()
            sync(device)
            times = [timer(run) for _ in range(repeats)]
            out.append({"ours": ours_ms, "reference": float(np.median(times))})
    return out


def _timed_variant(name, make, ys, timer, warmup, repeats, runners=None):
    """{name_ms, name_times, name_error} of one PyTorch way to run the model, its output
    checked against eager's first; {name_note} when it cannot be had. The way's run callable
    goes into `runners[name]` where it was timed."""
    t = torch()
    try:
        with t.no_grad():
            t0 = time.monotonic()
            run, output = make()
            setup_s = time.monotonic() - t0
            out = output()
            got = [v.float().cpu().numpy() for v in (out if isinstance(out, list) else [out])]
            err = max(close(a, b)[1] for a, b in zip(got, ys))
            for _ in range(warmup):
                run()
            sync("cuda")
            times = [timer(run) for _ in range(repeats)]
    except Exception as e:              # a PyTorch feature missing here is a note, not a failure
        return {f"{name}_note": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    if runners is not None:
        runners[name] = run
    return {f"{name}_ms": float(np.median(times)), f"{name}_times": rounded(times),
            f"{name}_error": err, f"{name}_setup_s": round(setup_s, 1)}

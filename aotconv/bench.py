"""`aotconv bench`: our tuned kernels and the emitted library against PyTorch (cuDNN / CPU) and
CLBlast's convgemm, timed in one process on the same data; JSON and a markdown table.

Per layer of the benchmark sets (aotconv.bench_layers): build the conv Layer, pick its kernel
(the tuner through `choose`, or with --no-tune the best of every registered variant's
fallback), time it with OpenCL profiling events (warm-up, median, buffers rotated so repeats
do not hit a warm cache), verify it against the float64 numpy reference on the first images of
the batch, then time the references on the same inputs and weights and verify them too. End to
end: build the shipped networks with `compile_network`, time the library's run() and its
per-kernel profile against a torch model of the same net.yaml (aotconv.torch_model).
Derived figures and tables: aotconv.bench_report.
"""
import argparse
import datetime
import fnmatch
import json
import math
import os
from pathlib import Path
import platform
import shlex
import sys
import time
import traceback

import numpy as np

from . import __version__
from .errors import AotconvError

SET_NAMES = ("alexnet_n128", "vgg16_n1", "boda43_n5")
E2E_DEFAULT = (("vgg16", 1), ("vgg16", 16), ("alexnet", 128))
REF_NAMES = ("torch", "clblast")
MAX_COPIES = 16


def log(msg, quiet=False):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


# -- the layers -------------------------------------------------------------------------------

def conv_layer(t, max_batch=None):
    """A conv Layer (no bias, no activation) from a benchmark tuple; the batch capped at
    `max_batch` when given. Returns (layer, original batch)."""
    from .graph import Layer
    from . import ops
    name, n, c, h, w, k, r, s, stride, pad = t
    n0 = n
    if max_batch:
        n = min(n, max_batch)
    a = ops.normalise("conv", {"out": k, "kernel": [r, s], "stride": stride, "pad": pad,
                               "bias": False})
    out, params = ops.infer("conv", a, [(n, c, h, w)])
    return Layer(name, "conv", a, ["input"], in_shapes=[(n, c, h, w)], out_shape=out,
                 params=params), n0


def select(set_names, patterns):
    """[(set name, tuple)] of the chosen sets, filtered by name globs."""
    from .bench_layers import SETS
    out = []
    for s in set_names:
        for t in SETS[s]:
            if not patterns or any(fnmatch.fnmatch(t[0], p) for p in patterns):
                out.append((s, t))
    return out


def parse_scale(text):
    """'N=1' or '1' -> the largest batch to run; None -> no scaling."""
    if text is None:
        return None
    t = str(text).strip().lower()
    if t.startswith("n="):
        t = t[2:]
    try:
        n = int(t)
    except ValueError:
        raise AotconvError(f"--scale '{text}': give the largest batch, as N=1") from None
    if n < 1:
        raise AotconvError(f"--scale '{text}': the batch must be >= 1")
    return n


def parse_e2e(text):
    if not text:
        return list(E2E_DEFAULT)
    out = []
    for item in text.split(","):
        net, _, b = item.strip().partition(":")
        out.append((net, int(b) if b else None))
    return out


# -- the device side --------------------------------------------------------------------------

class Device:
    """The OpenCL context and queue of the target, and what the JSON says about them."""

    def __init__(self, target):
        from .harness import context_for
        from .targets import find_device, with_limits
        found = find_device(target)
        if found is None:
            raise AotconvError(f"target '{target.name}': its OpenCL device is not present here; "
                               f"`aotconv targets` lists what is")
        self.platform, self.device = found
        self.target = with_limits(target, self.device)
        self.ctx, self.queue, _ = context_for(target)
        d, p = self.device, self.platform
        self.info = {"device": d.name.strip(), "vendor": d.vendor.strip(),
                     "driver": d.driver_version.strip(), "platform": p.name.strip(),
                     "platform_version": p.version.strip(),
                     "global_mem_gb": round(d.global_mem_size / 2 ** 30, 1)}

    def copies(self, footprint):
        """How many buffer sets to rotate over: enough to spill the last-level cache twice,
        at most MAX_COPIES and 1/8 of the device's memory."""
        size = max(int(footprint), 1)
        want = math.ceil(2 * self.target.cache_bytes / size) if self.target.cache_bytes else 1
        cap = self.device.global_mem_size // 8 // size
        return int(max(1, min(MAX_COPIES, want, cap)))


def footprint(layer):
    from .graph import count
    return 4 * (sum(count(s) for s in layer.in_shapes) + count(layer.out_shape)
                + sum(count(s) for _, s in layer.params))


def counts(once_ms, opts):
    """(warm-up, repeats) for a kernel whose single run took `once_ms`: the asked-for numbers,
    fewer (at least 3 repeats) where they would take longer than --max-measure-s; a slow
    reference on the 2-core CPU would otherwise cost minutes per layer."""
    cap = opts.max_measure_s * 1e3 / max(once_ms, 1e-6)
    repeats = int(max(3, min(opts.repeats, cap)))
    warmup = int(max(1, min(opts.warmup, cap - repeats)))
    return warmup, repeats


def time_runs(runs, queue, repeats, warmup):
    """ms per repeat of LayerRuns rotated over their copies, after `warmup` untimed runs."""
    for i in range(warmup):
        runs[i % len(runs)].run()
    queue.finish()
    events = [runs[(warmup + i) % len(runs)].run() for i in range(repeats)]
    queue.finish()
    return [runs[0].time_ms(e) for e in events]


def first_ms(run, queue):
    """One run's kernel time: the estimate `counts` plans with."""
    ev = run.run()
    queue.finish()
    return run.time_ms(ev)


def build_runs(dev, layer, variant, cfg, xs, params, copies, program=None, source=None):
    """LayerRuns of one (variant, cfg) over `copies` buffer sets, sharing one program (built
    here, or `program` built from `source` by the caller, with other options say)."""
    import warnings
    from .harness import LayerRun
    from .reference import to_layout
    first = LayerRun(dev.ctx, dev.queue, layer, variant, cfg, program=program, source=source)
    runs = [first]
    with warnings.catch_warnings():
        # the copies share one program, so each fetches the same kernels again: intended
        warnings.filterwarnings("ignore", message=".*retrieved more than once.*")
        for _ in range(copies - 1):
            runs.append(LayerRun(dev.ctx, dev.queue, layer, variant, cfg,
                                 program=first.program, source=first.source))
    lin = variant.layouts_of(layer, cfg)[0]
    if lin != "NCHW":                        # the variant reads another storage order
        xs = [to_layout(x, lin) for x in xs]
    for r in runs:
        r.set_inputs(xs)
        r.set_params(params)
    return runs


def logical_output(run):
    """The output of a LayerRun as the logical NCHW array, whatever order the variant wrote."""
    from .reference import from_layout
    lout = run.variant.layouts_of(run.layer, run.cfg)[1]
    out = run.read_output()
    return out if lout == "NCHW" else from_layout(out.ravel(), lout, run.layer.out_shape)


class Reference:
    """The float64 numpy output of a layer on the first `images` images (cheap at any batch)."""

    def __init__(self, layer, x, w, images, max_gflop):
        from .ops import flops
        n = layer.in_shape[0]
        self.images = min(n, images)
        cost = flops(layer) * self.images / n / 1e9
        self.skipped = None
        self._ref = None
        if cost > max_gflop:
            self.skipped = (f"the float64 reference of {self.images} image(s) is {cost:.0f} "
                            f"GFLOP (> --verify-max-gflop {max_gflop:g})")
        else:
            self.layer, self.x, self.w = layer, x, w

    def check(self, out):
        """{'ok', 'error', 'images'} or {'skipped': why}."""
        from .harness import close
        from .reference import conv
        if self.skipped:
            return {"skipped": self.skipped}
        if self._ref is None:
            self._ref = conv(self.x[:self.images].astype(np.float64), self.w.astype(np.float64),
                             None, self.layer.attrs, self.layer.out_shape)
        ok, err = close(np.asarray(out)[:self.images], self._ref)
        return {"ok": ok, "error": err, "images": self.images}


# -- picking our kernel -----------------------------------------------------------------------

def one_layer_net(layers, name="bench"):
    """A Network holding independent layers (each reading its own input), for `choose`."""
    from .graph import Network
    return Network(name, layers[0].in_shape, list(layers), [layers[-1].name])


def fallback_candidates(layer, target):
    """[(variant, cfg)] of every registered variant's fallback that is valid for `layer`."""
    from .space import device_constraints
    from .variants import for_layer
    out, skipped = [], []
    for v in for_layer(layer):
        try:
            cfg = v.fallback(layer, target)
            bad = [c.name for c in list(v.constraints) + device_constraints(v, target)
                   if not c.check(layer, cfg, target)]
        except Exception as e:                     # a variant without a valid fallback here
            skipped.append(f"{v.name}: {type(e).__name__}: {e}")
            continue
        if bad:
            skipped.append(f"{v.name}: fallback violates {', '.join(bad)}")
        else:
            out.append((v, cfg))
    return out, skipped


def best_fallback(dev, layer, xs, params, ref, opts, quick_repeats=3):
    """--no-tune: time each variant's fallback (verified) and keep the fastest; one whose
    single run is over 3x the best median so far is not timed further (it cannot win).
    Returns (variant, cfg, tried) with tried = [{variant, cfg, ms | error}]."""
    cands, skipped = fallback_candidates(layer, dev.target)
    tried = [{"variant": s.split(":")[0], "error": s} for s in skipped]
    best = None
    for v, cfg in cands:
        entry = {"variant": v.name, "cfg": str(cfg)}
        try:
            runs = build_runs(dev, layer, v, cfg, xs, params, 1)
            runs[0].poison_output()
            runs[0].run()
            chk = ref.check(logical_output(runs[0]))
            if chk.get("ok") is False:
                entry["error"] = f"wrong (max scaled error {chk['error']:.2g})"
            else:
                one = first_ms(runs[0], dev.queue)
                if best is not None and one > 3 * best[2]:
                    entry["ms_once"] = one
                else:
                    warm, reps = counts(one, replace_repeats(opts, quick_repeats))
                    ms = float(np.median(time_runs(runs, dev.queue, reps, warm)))
                    entry["ms"] = ms
                    if best is None or ms < best[2]:
                        best = (v, cfg, ms)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        tried.append(entry)
    if best is None:
        raise AotconvError(f"layer {layer.name}: no variant's fallback ran correctly: "
                           + "; ".join(t.get("error", "") for t in tried))
    return best[0], best[1], tried


# -- one layer --------------------------------------------------------------------------------

class Refs:
    """The reference implementations present in this process, set up once."""

    def __init__(self, wanted, dev, quiet=False):
        self.dev, self.status, self.torch_device = dev, {}, None
        kind = dev.target.kind
        if "torch" in wanted:
            from .benchrefs import torch_ref
            tdev = "cuda" if kind == "gpu" else "cpu"
            ok, note = torch_ref.available(tdev)
            if ok:
                settings = torch_ref.configure(tdev)
                self.torch_device = tdev
                self.status["torch"] = {"available": True, "note": note, "settings": settings}
            else:
                self.status["torch"] = {"available": False, "note": note}
        else:
            self.status["torch"] = {"available": False, "note": "not asked for (--refs)"}
        if "clblast" in wanted:
            from .benchrefs import clblast
            ok, note = clblast.available()
            self.status["clblast"] = {"available": ok,
                                      "note": "Debian libclblast1, CLBlastSconvgemm via ctypes"
                                      if ok else note}
        else:
            self.status["clblast"] = {"available": False, "note": "not asked for (--refs)"}
        for k, v in self.status.items():
            if not v["available"]:
                log(f"aotconv bench: reference {k} skipped: {v['note']}", quiet)

    def label(self):
        if self.torch_device == "cuda":
            return "cuDNN"
        return "PyTorch CPU" if self.dev.target.kind == "cpu" else "PyTorch"

    def time_torch(self, layer, x, w, ref, copies, opts):
        from .benchrefs.torch_ref import TorchConv, Timer
        conv = TorchConv(layer, x, w, device=self.torch_device, copies=copies)
        out = {"verify": ref.check(conv.output())}
        warmup, repeats = counts(Timer(self.torch_device)(lambda: conv(len(conv.sets) - 1)),
                                 opts)
        times = conv.time(repeats, warmup)
        out.update(ms=float(np.median(times)), times=_round(times))
        return out

    def time_clblast(self, layer, x, w, ref, copies, opts):
        from .benchrefs.clblast import ClblastConv, unsupported
        why = unsupported(layer)
        if why:
            return {"note": f"unsupported: {why}"}
        conv = ClblastConv(self.dev.ctx, self.dev.queue, layer, x, w, copies)
        conv.run(0)
        self.dev.queue.finish()
        out = {"verify": ref.check(conv.output(0))}
        ev = conv.run(len(conv.sets) - 1)
        self.dev.queue.finish()
        warmup, repeats = counts((ev.profile.end - ev.profile.start) * 1e-6, opts)
        for i in range(warmup):
            conv.run(i)
        self.dev.queue.finish()
        evs = [conv.run(warmup + i) for i in range(repeats)]
        self.dev.queue.finish()
        times = [(e.profile.end - e.profile.start) * 1e-6 for e in evs]
        out.update(ms=float(np.median(times)), times=_round(times))
        return out


def replace_repeats(opts, repeats):
    """A view of `opts` with another repeat count (for the quick fallback comparison)."""
    import copy
    o = copy.copy(opts)
    o.repeats = repeats
    return o


def failure(e):
    """A caught exception as JSON: what it was and where (for runs read only afterwards)."""
    tb = traceback.extract_tb(e.__traceback__)[-3:]
    return {"error": f"{type(e).__name__}: {str(e)[:500]}",
            "where": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb]}


def _round(xs):
    return [float(f"{x:.6g}") for x in xs]


def bench_layer(dev, refs, set_name, t, opts, choice=None):
    """Measure one benchmark layer; returns its JSON row (derived figures added later)."""
    from .harness import random_inputs
    from .variants import for_layer
    layer, _ = conv_layer(t, opts.max_batch)
    row = _skeleton(set_name, t, opts)
    row["variants"] = [v.name for v in for_layer(layer)]
    rng = np.random.default_rng([opts.seed, len(layer.name), sum(map(ord, layer.name))])
    xs, params = random_inputs(layer, rng)
    x, w = xs[0], params["weight"]
    ref = Reference(layer, x, w, opts.verify_images, opts.verify_max_gflop)
    copies = dev.copies(footprint(layer))
    row["copies"] = copies
    ours = {}
    row["ours"] = ours
    try:
        t0 = time.monotonic()
        if choice is None and opts.mode == "tune":
            choice = tune_layers(dev, [layer], opts)[layer.name]
        if choice is not None:
            variant, cfg = choice.impl, choice.cfg
            ours.update(source=choice.source, tuner_ms=choice.time_ms,
                        tune_s=getattr(choice.stats, "seconds", None) or
                        round(time.monotonic() - t0, 3),
                        tried=getattr(choice.stats, "tried", None))
        else:
            variant, cfg, tried = best_fallback(dev, layer, xs, params, ref, opts)
            ours.update(source="best fallback", tune_s=round(time.monotonic() - t0, 3),
                        tried=tried)
        ours.update(variant=variant.name, cfg=str(cfg))
        runs = build_runs(dev, layer, variant, cfg, xs, params, copies)
        ours["launches"] = len([l for l in runs[0].launches if l.phase == "run"])
        runs[0].poison_output()
        runs[0].run()
        ours["verify"] = ref.check(logical_output(runs[0]))
        warm, reps = counts(first_ms(runs[-1], dev.queue), opts)
        times = time_runs(runs, dev.queue, reps, warm)
        ours.update(ms=float(np.median(times)), times=_round(times))
        del runs
    except Exception as e:
        ours.update(failure(e))
        log(f"aotconv bench: {layer.name}: ours failed: {ours['error']}", opts.quiet)
    for name in REF_NAMES:
        st = refs.status[name]
        if not st["available"]:
            row["refs"][name] = {"note": "absent"}
            continue
        try:
            fn = refs.time_torch if name == "torch" else refs.time_clblast
            row["refs"][name] = fn(layer, x, w, ref, copies, opts)
        except Exception as e:
            row["refs"][name] = {"note": "failed", **failure(e)}
            log(f"aotconv bench: {layer.name}: {name} failed: {row['refs'][name]['error']}",
                opts.quiet)
    return row


def tune_layers(dev, layers, opts, budget=None):
    """{name: Choice} from the tuner for independent `layers` sharing one budget."""
    from .choose import choose
    net = one_layer_net(layers)
    # each layer of a set counts once in its geometric mean: the set budget is shared equally
    return choose(net, dev.target, mode="tune", budget=budget or opts.budget,
                  strategy=opts.strategy, quiet=opts.quiet, measurer=opts.measurer(dev),
                  share="equal")


# -- end to end -------------------------------------------------------------------------------

def bench_e2e(dev, refs, net_name, batch, opts, notes):
    """Build `net_name` at `batch` (capped by --scale), run the library, compare with torch."""
    from .compiler import compile_network
    from . import params as params_mod, spec
    from .harness import close
    from .runtime import load
    net0 = spec.load_network(net_name, batch=batch)
    b0 = net0.input_shape[0]
    if opts.max_batch and b0 > opts.max_batch:
        net0 = spec.load_network(net_name, batch=opts.max_batch)
    b = net0.input_shape[0]
    row = {"net": net_name, "batch": b, "batch_orig": b0, "ours": {}, "torch": {}}
    outdir = Path(opts.workdir) / f"{net_name}-b{b}"
    budget = opts.fit_budget(opts.e2e_budget, 60, f"end to end {net_name} batch {b}", notes)
    row["budget"] = budget
    row["mode"] = ("fallback (no tuner)" if opts.mode != "tune" else
                   f"tuned, budget {budget or 'default'}")
    t0 = time.monotonic()
    try:
        compile_network(net_name, target=opts.target_arg, outdir=outdir, batch=b,
                        tune_mode=opts.mode if opts.mode == "tune" else "fallback",
                        budget=budget, strategy=opts.strategy, quiet=opts.quiet,
                        measure=False, seed=opts.seed)
    except Exception as e:
        row["ours"].update(failure(e))
        row["ours"]["error"] = "build failed: " + row["ours"]["error"]
        row["build_s"] = round(time.monotonic() - t0, 1)
        return row
    row["build_s"] = round(time.monotonic() - t0, 1)
    row["build_dir"] = str(outdir)
    try:
        tj = json.loads((outdir / "tuning.json").read_text())
        row["kernels"] = len(tj.get("kernels", tj.get("layers", [])))
    except Exception:
        pass
    flat = params_mod.random_params(net0, seed=opts.seed)
    x = np.random.default_rng(opts.seed + 1).standard_normal(net0.input_shape).astype(np.float32)
    try:
        with load(outdir) as lib:
            lib.set_params(flat)
            y = lib(x)
            t1 = time.perf_counter()
            lib(x)
            warmup, repeats = counts((time.perf_counter() - t1) * 1e3, opts)
            for _ in range(warmup):
                lib(x)
            walls, sums = [], []
            for _ in range(repeats):
                t1 = time.perf_counter()
                lib(x)
                walls.append((time.perf_counter() - t1) * 1e3)
                sums.append(sum(ms for _, ms in lib.profile()))
            row["ours"].update(run_ms=float(np.median(walls)), kernels_ms=float(np.median(sums)),
                               run_times=_round(walls))
            row["ours"].update(pinned_run(lib, x, y, warmup, repeats))
    except Exception as e:
        row["ours"].update(failure(e))
        row["ours"]["error"] = "run failed: " + row["ours"]["error"]
        return row
    if refs.torch_device is None:
        row["torch"]["note"] = refs.status["torch"]["note"]
        return row
    try:
        row["torch"], yt = torch_e2e(net0, flat, x, refs.torch_device, opts)
        ys = y if isinstance(y, list) else [y]
        yts = yt if isinstance(yt, list) else [yt]
        errs = [close(a, b)[1] for a, b in zip(ys, yts)]
        row["max_error"] = max(errs)
        row["match"] = row["max_error"] <= 1e-3
        o, t = row["ours"], row["torch"]
        row["ratio_wall"] = o["run_ms"] / t["wall_ms"] if t.get("wall_ms") else None
        row["ratio_kernels"] = o["kernels_ms"] / t["eager_ms"] if t.get("eager_ms") else None
    except Exception as e:
        row["torch"] = {"note": "failed", **failure(e)}
    return row


def pinned_run(lib, x, y, warmup, repeats):
    """run() from the library's pinned host buffers (host_buffers()), what an application that
    writes its input there gets: {"run_pinned_ms"}, or {"run_pinned_error"} when the buffers
    cannot be had or the output differs from run() on numpy memory."""
    try:
        xin, _ = lib.host_buffers()
        xin[...] = x
        got = lib.run_host().copy()
        want = np.concatenate([v.ravel() for v in (y if isinstance(y, list) else [y])])
        if not np.array_equal(got, want):
            return {"run_pinned_error": "the output from the pinned buffers differs from "
                                        "run() on numpy memory"}
        for _ in range(warmup):
            lib.run_host()
        times = []
        for _ in range(repeats):
            t1 = time.perf_counter()
            lib.run_host()
            times.append((time.perf_counter() - t1) * 1e3)
        return {"run_pinned_ms": float(np.median(times))}
    except Exception as e:
        return {"run_pinned_error": f"{type(e).__name__}: {e}"}


def torch_e2e(net0, flat, x, device, opts):
    """PyTorch eager on a model of the same net: device time (CUDA events, input resident) and
    wall time including the input upload and output download, as our run() does."""
    import torch
    from . import torch_model
    from .benchrefs.torch_ref import Timer, sync
    model = torch_model.build(net0, flat, device)
    xd = torch.from_numpy(x).to(device)
    with torch.no_grad():
        y = model(xd)
        ys = [t.float().cpu().numpy() for t in (y if isinstance(y, list) else [y])]
        timer = Timer(device)
        warmup, repeats = counts(timer(lambda: model(xd)), opts)
        for _ in range(warmup):
            model(xd)
        sync(device)
        eager = [timer(lambda: model(xd)) for _ in range(repeats)]
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model(torch.from_numpy(x).to(device))
            (out if not isinstance(out, list) else out[0]).cpu()
            walls.append((time.perf_counter() - t0) * 1e3)
    res = {"eager_ms": float(np.median(eager)), "wall_ms": float(np.median(walls)),
           "eager_times": _round(eager)}
    return res, (ys[0] if len(ys) == 1 else ys)


# -- the whole run ----------------------------------------------------------------------------

class Options:
    """The parsed command line, plus the shared tuner measurer."""

    def __init__(self, a, target):
        self.a = a
        self.mode = "fallback" if a.no_tune else "tune"
        self.budget, self.set_budget, self.e2e_budget = a.budget, a.set_budget, a.e2e_budget
        self.strategy = a.strategy
        self.quiet = a.quiet
        self.max_batch = parse_scale(a.scale)
        gpu = target.kind == "gpu"
        self.repeats = a.repeats or (30 if gpu else 7)
        self.warmup = a.warmup if a.warmup is not None else (5 if gpu else 2)
        self.max_measure_s = a.max_measure_s or (3.0 if gpu else 1.5)
        self.seed = a.seed
        self.verify_images = a.verify_images
        self.verify_max_gflop = a.verify_max_gflop
        self.workdir = a.workdir
        self.target_arg = a.target
        self.deadline = (time.monotonic() + a.deadline) if a.deadline else None
        self._measurer = None

    def measurer(self, dev):
        if self._measurer is None:
            from .tune.measure import Measurer
            self._measurer = Measurer(dev.target, jobs=self.a.jobs)
        return self._measurer

    def out_of_time(self):
        return self.deadline is not None and time.monotonic() >= self.deadline

    def fit_budget(self, budget, reserve_s, what, notes):
        """`budget` shrunk so that a time budget leaves `reserve_s` before --deadline (tuning
        cannot be stopped half-way; the measurements after it must still fit)."""
        if budget is None or self.deadline is None:
            return budget
        from .tune.search import parse_budget
        b = parse_budget(budget)
        left = self.deadline - time.monotonic() - reserve_s
        if b.kind != "seconds" or b.amount <= left:
            return budget
        fitted = f"{max(10.0, left):.0f}s"
        notes.append(f"{what}: tuning budget {budget} shrunk to {fitted} to end before "
                     f"--deadline")
        return fitted

    def close(self):
        if self._measurer is not None:
            self._measurer.close()
            self._measurer = None


def environment(dev):
    env = dict(dev.info)
    env.update(python=platform.python_version(), host=platform.node(), numpy=np.__version__,
               machine=platform.machine(), cpus=os.cpu_count(),
               loadavg_at_start=[round(x, 2) for x in os.getloadavg()],
               omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"))
    try:
        import pyopencl
        env["pyopencl"] = pyopencl.VERSION_TEXT
    except Exception:
        pass
    return env


def default_paths(a, target_name, date):
    out = Path(a.out) if a.out else Path("build") / "bench" / f"bench-{target_name}-{date}.json"
    md = Path(a.md) if a.md else out.with_suffix(".md")
    return out, md


def finish(doc, target_dict, registered):
    """Derive every row's figures and the per-set summaries (in place)."""
    from .bench_report import derive, summarise
    for s in doc["sets"].values():
        for r in s["rows"]:
            derive(r, target_dict, registered)
        s["summary"] = summarise(s["rows"])
    return doc


def write(doc, out, md):
    from .bench_report import markdown
    out.parent.mkdir(parents=True, exist_ok=True)
    md.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(out)
    md.write_text(markdown(doc) + "\n")


def target_dict(t):
    return {"name": t.name, "kind": t.kind, "peak_gflops": t.peak_gflops,
            "peak_gbps": t.peak_gbps, "summary": t.summary(), "cache_bytes": t.cache_bytes}


def cmd_bench(a):
    from .bench_report import text_table
    if a.from_json:
        return rerender(a)
    from .targets import get_target
    from .variants import VARIANTS
    started = time.monotonic()
    target = get_target(a.target)
    if target.kind == "cpu":
        # idle OpenMP threads must sleep, not spin: spinning ones starve PoCL's (and torch's
        # own, on a loaded machine, by 100x: 80 ms instead of 0.4 ms for a small conv)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    dev = Device(target)
    opts = Options(a, dev.target)
    sets = [s.strip() for s in (a.sets or ",".join(SET_NAMES + ("e2e",))).split(",") if s.strip()]
    for s in sets:
        if s not in SET_NAMES + ("e2e",):
            raise AotconvError(f"unknown set '{s}'; choose from {', '.join(SET_NAMES + ('e2e',))}")
    patterns = [p for p in (a.layers or "").split(",") if p]
    date = datetime.date.today().isoformat()
    out, md = default_paths(a, target.name, date)
    refs = Refs([r for r in REF_NAMES if a.refs == "auto" or r in a.refs.split(",")], dev,
                a.quiet)
    registered = [v.name for v in VARIANTS]
    tdict = target_dict(dev.target)
    doc = {"tool": "aotconv bench", "version": __version__, "date": date,
           "command": "aotconv bench " + " ".join(shlex.quote(x) for x in a.argv),
           "target": tdict, "device_kind": dev.target.kind, "environment": environment(dev),
           "mode": "tune" if opts.mode == "tune" else "no-tune (best registered fallback)",
           "budget": (f"{opts.budget} per layer" if opts.budget and not opts.set_budget else
                      f"{opts.set_budget} per set" if opts.set_budget else
                      "tuner default per layer" if opts.mode == "tune" else None),
           "e2e_budget": opts.e2e_budget, "repeats": opts.repeats, "warmup": opts.warmup,
           "max_measure_s": opts.max_measure_s,
           "verify_images": opts.verify_images,
           "scale": (f"batch capped at N={opts.max_batch} (layers and end to end); the "
                     f"original N is kept in each row" if opts.max_batch else None),
           "refs": refs.status, "ref_label": refs.label(), "registered_variants": registered,
           "sets": {}, "e2e": [], "notes": list(a.note or [])}
    if refs.torch_device is None and dev.target.kind == "gpu":
        doc["notes"].append("PyTorch/cuDNN was not available: no reference ratios.")
    try:
        for s in sets:
            if s == "e2e":
                continue
            chosen = select([s], patterns)
            if not chosen:
                continue
            rows = []
            doc["sets"][s] = {"rows": rows}
            choices = {}
            if opts.mode == "tune" and opts.set_budget:
                layers = [conv_layer(t, opts.max_batch)[0] for _, t in chosen]
                budget = opts.fit_budget(opts.set_budget, 20 + 3 * len(layers), s,
                                         doc["notes"])
                log(f"aotconv bench: tuning {s} ({len(layers)} layers, budget {budget})",
                    a.quiet)
                t0 = time.monotonic()
                try:
                    choices = tune_layers(dev, layers, opts, budget=budget)
                except Exception as e:
                    doc["notes"].append(f"{s}: set tuning failed ({type(e).__name__}: {e}); "
                                        f"each layer tuned alone instead")
                doc["sets"][s]["tune_s"] = round(time.monotonic() - t0, 1)
            for i, (_, t) in enumerate(chosen):
                if opts.out_of_time():
                    ours = {"error": "skipped: --deadline reached"}
                    c = choices.get(t[0])
                    if c is not None:                 # keep what the tuning found
                        ours.update(variant=c.variant, cfg=str(c.cfg), source=c.source,
                                    tuner_ms=c.time_ms)
                    rows.append({**_skeleton(s, t, opts), "ours": ours})
                    continue
                log(f"aotconv bench: [{s} {i + 1}/{len(chosen)}] {t[0]}", a.quiet)
                row = bench_layer(dev, refs, s, t, opts, choices.get(t[0]))
                rows.append(row)
                finish(doc, tdict, registered)
                write(doc, out, md)
                _print_row(row, refs.label(), a.quiet)
        if "e2e" in sets:
            seen = set()
            for net_name, batch in parse_e2e(a.e2e):
                key = (net_name, min(batch, opts.max_batch) if batch and opts.max_batch
                       else batch)
                if key in seen:
                    doc["notes"].append(f"end to end {net_name} batch {batch}: the same as an "
                                        f"earlier row once scaled; not run twice")
                    continue
                seen.add(key)
                if opts.out_of_time():
                    doc["e2e"].append({"net": net_name, "batch": batch, "ours":
                                       {"error": "skipped: --deadline reached"}, "torch": {}})
                    continue
                log(f"aotconv bench: end to end {net_name} batch {batch}", a.quiet)
                doc["e2e"].append(bench_e2e(dev, refs, net_name, batch, opts, doc["notes"]))
                doc["elapsed_s"] = round(time.monotonic() - started, 1)
                finish(doc, tdict, registered)
                write(doc, out, md)
    finally:
        opts.close()
        doc["environment"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        doc["elapsed_s"] = round(time.monotonic() - started, 1)
        finish(doc, tdict, registered)
        write(doc, out, md)
    if not a.quiet:
        print(text_table(doc))
    print(f"{out}\n{md}")
    return 0


def _skeleton(s, t, opts):
    """A layer's row before anything is measured: its shape, FLOPs and compulsory bytes."""
    layer, n0 = conv_layer(t, opts.max_batch)
    from .ops import flops, bytes_moved
    return {"set": s, "name": t[0], "N": layer.in_shape[0], "N_orig": n0, "C": t[2], "H": t[3],
            "W": t[4], "K": t[5], "R": t[6], "S": t[7], "stride": t[8], "pad": t[9],
            "P": layer.out_shape[2], "Q": layer.out_shape[3], "flops": flops(layer),
            "bytes": bytes_moved(layer), "refs": {}}


def _print_row(row, label, quiet):
    if quiet:
        return
    o = row.get("ours") or {}
    t = (row["refs"].get("torch") or {}).get("ms")
    c = (row["refs"].get("clblast") or {}).get("ms")
    r = row.get("ours_over_torch")
    print(f"  {row['name']}: ours {o.get('ms', float('nan')):.4f} ms ({o.get('variant', '?')})"
          + (f", {label} {t:.4f} ms, ratio {r:.2f}" if t else "")
          + (f", CLBlast {c:.4f} ms" if c else "")
          + (f", {o['error']}" if o.get("error") else ""), file=sys.stderr, flush=True)


def _e2e_mode(row, doc):
    if row.get("mode"):
        return row["mode"]
    if str(doc.get("mode", "")).startswith("no-tune"):
        return "fallback (no tuner)"
    return f"tuned, budget {row.get('budget') or 'default'}"


def _merge_rows(rows, new, key):
    """Append `new` rows to `rows`; a row with the key of an earlier one replaces it (a re-run),
    unless it failed where the earlier one succeeded."""
    where = {key(r): i for i, r in enumerate(rows)}
    for r in new:
        k = key(r)
        if k not in where:
            where[k] = len(rows)
            rows.append(r)
        elif not (r.get("ours") or {}).get("error") or (rows[where[k]].get("ours") or {}).get(
                "error"):
            rows[where[k]] = r


def rerender(a):
    """--from-json: merge bench JSON files and write the markdown (and the merged JSON) without
    running anything. Rows are appended in order; a later row for the same layer (or network,
    batch and mode) replaces an earlier one unless it failed where that one did not."""
    from .bench_report import text_table
    docs = [json.loads(Path(p).read_text()) for p in a.from_json]
    for d in docs:
        for r in d.get("e2e", []):
            r["mode"] = _e2e_mode(r, d)
    doc = docs[0]
    commands = list(doc.get("commands") or [doc["command"]])
    e2e_key = lambda r: (r["net"], r["batch"], r.get("mode"))
    rows = list(doc.get("e2e", []))
    doc["e2e"] = []
    _merge_rows(doc["e2e"], rows, e2e_key)
    for d in docs[1:]:
        for name, s in d.get("sets", {}).items():
            _merge_rows(doc["sets"].setdefault(name, {"rows": []})["rows"], s["rows"],
                        lambda r: r["name"])
        _merge_rows(doc["e2e"], d.get("e2e", []), e2e_key)
        doc["notes"].extend(n for n in d.get("notes", []) if n not in doc["notes"])
        for c in d.get("commands") or [d["command"]]:
            if c not in commands:
                commands.append(c)
        if d.get("elapsed_s") and doc.get("elapsed_s"):
            doc["elapsed_s"] += d["elapsed_s"]
    if len(commands) > 1:
        doc["commands"] = commands
    doc["notes"].extend(n for n in (a.note or []) if n not in doc["notes"])
    finish(doc, doc["target"], doc.get("registered_variants", ()))
    out = Path(a.out) if a.out else Path(a.from_json[0])
    md = Path(a.md) if a.md else out.with_suffix(".md")
    write(doc, out, md)
    if not a.quiet:
        print(text_table(doc))
    print(f"{out}\n{md}")
    return 0


def add_commands(sub):
    b = sub.add_parser(
        "bench", help="benchmark tuned kernels and built networks against PyTorch and CLBlast",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--target", default="auto", help="h100, pocl-cpu, ... or auto (the device "
                   "present)")
    b.add_argument("--sets", help=f"comma-separated: {', '.join(SET_NAMES)}, e2e (default all)")
    b.add_argument("--layers", help="comma-separated globs on layer names (alex.conv*, "
                   "boda.0*)")
    b.add_argument("--budget", help="tuning budget per layer: trials (40) or time (30s)")
    b.add_argument("--set-budget", help="tuning budget per set, shared equally among its "
                   "layers (each counts once in the set's geometric mean)")
    b.add_argument("--e2e-budget", help="tuning budget per end-to-end network (default: the "
                   "tuner's)")
    b.add_argument("--strategy", help="tuner search strategy (see `aotconv tune --help`)")
    b.add_argument("--no-tune", action="store_true", help="no tuner: time every registered "
                   "variant's fallback for each layer and take the fastest correct one")
    b.add_argument("--refs", default="auto", help="auto (every one present), none, or "
                   "comma-separated from: torch, clblast")
    b.add_argument("--e2e", help="networks end to end as net:batch,... (default "
                   "vgg16:1,vgg16:16,alexnet:128)")
    b.add_argument("--scale", help="cap every batch (layers and end to end), e.g. N=1 for the "
                   "2-core CPU; recorded in the JSON")
    b.add_argument("--repeats", type=int, help="timed repeats (default 30 on a GPU, 7 on a CPU)")
    b.add_argument("--warmup", type=int, help="untimed runs first (default 5 GPU, 2 CPU)")
    b.add_argument("--max-measure-s", type=float, help="seconds one kernel's timing may take: "
                   "fewer repeats (at least 3) for slow ones (default 3 on a GPU, 1.5 on a CPU)")
    b.add_argument("--verify-images", type=int, default=2, help="images of the batch checked "
                   "against the float64 reference (default 2)")
    b.add_argument("--verify-max-gflop", type=float, default=200.0, help="skip verification "
                   "when the reference of those images would cost more (default 200)")
    b.add_argument("--deadline", type=float, help="seconds: start nothing new after this, "
                   "write what was measured")
    b.add_argument("--jobs", type=int, help="parallel kernel compiles while tuning")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--workdir", default="build/bench", help="where end-to-end builds go")
    b.add_argument("--out", help="JSON path (default build/bench/bench-<target>-<date>.json)")
    b.add_argument("--md", help="markdown path (default: the JSON path with .md)")
    b.add_argument("--from-json", nargs="+", metavar="JSON", help="re-render (and merge) "
                   "earlier results; runs nothing")
    b.add_argument("--note", action="append", help="a sentence for the report's notes "
                   "(repeatable; with --from-json too)")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    b.set_defaults(func=_entry)


def _entry(a):
    a.argv = _argv_after("bench")
    return cmd_bench(a)


def _argv_after(word):
    argv = sys.argv[1:]
    return argv[argv.index(word) + 1:] if word in argv else argv

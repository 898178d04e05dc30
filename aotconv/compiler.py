"""The whole flow of `aotconv build`: spec -> passes -> choose -> schedule -> emit -> ninja ->
params -> (device present) run the library, check it against numpy, profile, report.

With several batch sizes (`--batch 1,8,32`) every size goes through spec -> schedule on its
own (tuned per shape), and aotconv.batches merges the schedules into one library."""
from dataclasses import dataclass, replace
from pathlib import Path
import sys
import threading
import time

import numpy as np

from . import params as params_mod
from . import batches, binaries, fusion, layouts, passes, precision, spec
from .build import build as ninja_build
from .buildtime import BuildTimes, phase
from .choose import choose
from .context import BuildContext, with_precision
from .emit import emit
from .graph import Network
from .ops import is_alias
from .outdir import OutputDir
from .precision import check_storage, stored
from .report import write_report
from .reference import run_network
from .schedule import build_schedule, c_ident
from .targets import get_target
from .tune.progress import Progress
from .tune.search import Budget, Clock, unique_layers


@dataclass
class BuildResult:
    outdir: Path
    net: object              # after passes
    schedule: object
    target: object
    profile: list = None     # [(kernel, ms)] median over runs, when the device was present
    check_error: float = None
    check_reference: str = "numpy"   # what --check compared with (onnxruntime for .onnx)
    check_tolerance: float = None    # what --check admitted (None: T); past T only for a
    check_spread: float = None       # reduced-precision reference, from its spread there
    programs: object = None  # binaries.ProgramPlan: joined or per layer, binaries embedded
    times: object = None     # buildtime.BuildTimes: where the build's time went
    runs: int = 5            # the profiled runs of the library that `profile` is the median of
    sizes: list = None       # several batch sizes: [SizeResult] in increasing order
    check_n: int = None      # and the n between two sizes that --check ran, if any
    unmeasured: str = None   # why report.md has no times, where the device was present


@dataclass
class SizeResult:
    """One batch size of a library of several: its schedule, its kernels' times (when
    measured) and its --check error."""
    batch: int
    schedule: object
    profile: list = None
    check_error: float = None
    check_tolerance: float = None
    check_spread: float = None

    @property
    def net(self):
        return self.schedule.net


def log(msg, quiet=False):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def compile_network(source, target="auto", outdir=None, batch=None, weights=None, seed=0,
                    tune_mode="tune", budget=None, strategy=None, tuning_db=None,
                    require_tuned=False, check=False, measure=True, quiet=False, json_progress=False,
                    jobs=None, fuse_pool="measure", input_shapes=None, binaries=True,
                    precision="fp32", recheck=None, fuse_dwpw="measure"):
    """Build the library of `source` (a net.yaml, a shipped network's name or an .onnx model)
    for `target` into `outdir`; the keywords are `aotconv build`'s options (`fuse_pool` and
    `fuse_dwpw`: the pool and depthwise fusion policies, aotconv.fusion). `batch`: None (the
    network's own), a size, or increasing sizes (a list, or the text "1,8,32"): one library
    that runs any number of samples up to the largest (docs/c-api.md, Batch sizes)."""
    t0 = time.time()
    times = BuildTimes()         # a time budget's clock starts with it, and so with the build
    sizes = batches.parse_sizes(batch, where="batch")
    tgt = get_target(target)
    units = [_Unit(b, *_load(source, b, input_shapes)) for b in (sizes or (None,))]
    first = units[0]
    # the user's weights are read and checked before anything is tuned; the parameters do not
    # depend on the batch size
    flat = (params_mod.from_npz(first.net0, weights) if weights else
            first.imported.params if first.imported else None)
    for u in units:
        # an fp16 build's layers say they store half (their kernels, records and buffers)
        u.net = stored(passes.optimise(u.net0), precision)
        # before any work: an fp16 build of a layer no half-storage variant serves stops here
        check_storage([l for l in u.net.layers if not is_alias(l)],
                      with_precision(tgt, precision))
    net0, net = units[-1].net0, units[-1].net
    outdir = Path(outdir or Path("build") / net.name)
    job = _Job(units, flat, seed, check, measure, fuse_pool, fuse_dwpw,
               reference_ok=first.imported is not None and not weights, binaries=binaries)
    sized = (f"batch sizes {', '.join(str(u.batch) for u in units)}, "
             if len(units) > 1 else "")
    # the output directory is checked, locked and marked before any kernel is built;
    # everything is written under od.staging and moved into place at the end (aotconv.outdir)
    closing = _Closing()
    with BuildContext.make(tgt, mode=tune_mode, tuning_db=tuning_db, budget=budget,
                           strategy=strategy, jobs=jobs, require_tuned=require_tuned,
                           quiet=quiet, json_progress=json_progress,
                           precision=precision, times=times, recheck=recheck) as ctx, \
            OutputDir(outdir, network=net.name, quiet=quiet) as od:
        try:
            times.lap("setup")
            log(f"aotconv: {net.name}: {len(net0.layers)} layers ({len(net.layers)} after "
                f"fusion), {sized}target {tgt.name}, output {outdir}", quiet)
            res = _build_into(od, ctx, job, quiet, closing)
            with phase("end"):
                closing.wait()
                od.commit()
        finally:
            closing.wait()             # before the context closes what is left
    res.outdir = outdir
    log(f"aotconv: built {outdir}/lib{c_ident(net.name)}.so and .a "
        f"({time.time() - t0:.1f} s)", quiet)
    log(f"aotconv: {times.line()}", quiet)
    return res


def _load(source, batch, input_shapes):
    """(the ONNX import or None, the network as written) of `source` at `batch`."""
    imported = _import_onnx(source, batch, input_shapes)
    return imported, imported.network if imported else spec.load_network(source, batch=batch)


@dataclass
class _Unit:
    """One batch size of a build: the network as written (parameters follow its layout), after
    passes, and its ONNX import (whose reference --check may use)."""
    batch: int               # None: the network's own, in a single-size build
    imported: object
    net0: object
    net: object = None


@dataclass
class _Job:
    """What a build makes besides the kernels: the network at each batch size, its
    parameters, and what to do with the library once it is built."""
    units: list              # [_Unit], increasing batch sizes
    flat: object             # the parameters given (weights file, ONNX initializers), or None
    seed: int                # seeds the random parameters and the check's input
    check: bool
    measure: bool
    fuse_pool: str
    fuse_dwpw: str
    reference_ok: bool = False   # the ONNX import's reference may stand for numpy's
    binaries: bool = True    # embed device binaries where the target's device is present

    @property
    def net0(self):
        return self.units[-1].net0

    @property
    def ranged(self):
        return len(self.units) > 1


class _Closing:
    """The build's measuring processes (tune.measure.Measurer: the runner and a builder a
    core), closed in a thread of their own once the library's programs are built, while the
    library is compiled, linked and run: closed after the build, one after another, they were
    most of its end (H100 builds of ResNet-50 and VGG-16: 4.4 to 11.7 s outside any phase, a
    runner and 16 builders each with its device context; PoCL here: 0.16 s). A tuning farm is
    closed with the build's context, as before."""

    def __init__(self):
        self.thread = None

    def start(self, ctx):
        if ctx.tuning and ctx.farm is None and self.thread is None:
            self.thread = threading.Thread(target=ctx.close, daemon=True,
                                           name="aotconv-close-measurer")
            self.thread.start()

    def wait(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def _build_into(od, ctx, job, quiet, closing=None):
    """Everything of a build written into the staging directory `od.staging`; `closing`
    (_Closing) closes the measuring processes once the library's programs are built."""
    stage = od.staging
    scheds = []
    clock = ctx.budget if isinstance(ctx.budget, Clock) else None
    for i, u in enumerate(job.units):
        if clock is not None and job.ranged:
            ctx.budget = _size_clock(clock, scheds, len(job.units) - i)
        scheds.append(_schedule(ctx, u, job, quiet))
    if clock is not None:
        ctx.budget = clock
    sch = batches.merge([(u.batch, s) for u, s in zip(job.units, scheds)]) if job.ranged \
        else scheds[0]
    if clock is not None and clock.reserved is not None:     # what the searches left it
        ctx.times.budget += f" (the library's reserve {clock.reserved:.0f} s)"
    with phase("library"):
        # the joined programs are built in the measurer's builder processes, where its
        # searches started them (binaries._built_elsewhere); nothing is measured after that
        plan = binaries.plan(sch.programs, ctx, binaries=job.binaries,
                             log=lambda m: log(m, quiet), launches=sch.launches,
                             buffers=sch.buffers,
                             measurer=ctx.measurer() if ctx.tuning else None)
        if closing is not None:
            closing.start(ctx)
        log(f"aotconv: programs: {plan.note}", quiet)
        emit(sch, ctx.profile, stage, prefix=od.path, programs=plan)
        flat = job.flat if job.flat is not None else \
            params_mod.random_params(job.net0, seed=job.seed)
        params_mod.write_bin(stage / f"{c_ident(sch.net.name)}.params.bin", flat)
        t0 = time.monotonic()
        ninja_build(stage)
        log(f"aotconv: library: compiled and linked in {time.monotonic() - t0:.1f} s", quiet)

    res = BuildResult(od.path, sch.net, sch, ctx.profile, programs=plan, times=ctx.times)
    if job.ranged:
        res.sizes = [SizeResult(u.batch, s) for u, s in zip(job.units, scheds)]
    if job.measure and ctx.present:
        with phase("run and check" if job.check else "run"):
            refs = [_reference(u, job, flat, s) for u, s in zip(job.units, scheds)]
            if job.ranged:
                measure_sizes(stage, res, job, flat, refs)
            else:
                # a time budget's end, less the build's own end after them, cuts the
                # profiled runs to what fits (one at least)
                res.profile, judged, res.runs = measure_library(
                    stage, job.net0, flat, job.seed, job.check, ref=refs[0],
                    until=clock.end - clock.end_s if clock is not None else None)
                res.check_error, res.check_tolerance, res.check_spread = judged
        res.check_reference = getattr(refs[0], "name", "numpy")
    elif job.measure:
        log(f"aotconv: the {ctx.profile.name} device is not present: library built, not run; "
            f"report.md has no measured times", quiet)
    if not job.measure:
        res.unmeasured = ("The library was built without running it (its caller, such as "
                          "`aotconv bench`, times it): no measured times here.")
    with phase("end"):
        write_report(res, stage / "report.md")
    return res


def _size_clock(clock, done, sizes_left):
    """A time budget shared by the batch sizes: the next size's clock, an equal part of what
    the build's clock has left once the library's build of the sizes already scheduled is
    kept (each size's clock keeps its own kernels' build, as a one-size build does). The pace
    and compile times learnt so far carry over."""
    kept = sum(len(s.programs) for s in done) * clock.build_s()
    part = Clock(Budget("seconds", max(clock.left() - kept, 1.0) / sizes_left), kind=clock.kind)
    part.pace, part.builds, part.latencies = clock.pace, clock.builds, clock.latencies
    return part


def _schedule(ctx, u, job, quiet):
    """The Schedule of one batch size: choices (tuned, recorded or fallback), pools, residual
    adds and depthwise convs fused where measured faster, layouts planned, conversions
    inserted."""
    net = u.net

    def choose_only(n, only):
        # a search after the network's that a time budget has no room for measures nothing
        return choose(n, ctx, only=only) if _time_for(ctx, n, only, quiet) else {}

    def choose_fused(n, only):
        # the depthwise fusion's layers: measured when tuning; from records otherwise, where
        # one the records lack is left unfused (not measured), which neither warns of an
        # untuned layer nor is refused by --require-tuned: the build does not run it
        if ctx.tuning:
            return choose_only(n, only)
        look = replace(ctx, require_tuned=False, progress=Progress.make(quiet=True))
        return choose(n, look, only=only)

    def choose_conversions(layers):
        n = Network(net.name, net.input_shape, layers, [layers[-1].name])
        return choose_only(n, [l.name for l in layers]) or \
            layouts.fallback_convert_choices(layers)

    with phase("search"):
        choices = choose(net, ctx)
    # pools fused where measured faster, then layouts across the network (aotconv.fusion,
    # aotconv.layouts); build_schedule inserts the conversions the layouts still need
    with phase("fusion searches"):
        net, choices, fused = fusion.apply(net, choices, ctx.profile, job.fuse_pool, ctx.mode,
                                           choose_only)
        net, choices, residual = fusion.apply_residual(net, choices, ctx.profile, "measure",
                                                       ctx.mode, choose_only)
        net, choices, dwpw = fusion.apply_dwpw(net, choices, ctx.profile, job.fuse_dwpw,
                                               ctx.mode, choose_fused)
    with phase("layouts"):
        choices, layout_plan = layouts.plan_network(net, choices, ctx)
        sch = build_schedule(net, choices, convert=choose_conversions, source=u.net0,
                             file_suffix=batches.file_suffix(u.batch, job.ranged))
    sch.fusion, sch.residual, sch.dwpw, sch.layout_plan = fused, residual, dwpw, layout_plan
    if fused or residual or dwpw or sch.conversions:
        at = f"batch {u.batch}: " if job.ranged else ""
        log(f"aotconv: {at}{sum(d.fused for d in fused)} of {len(fused)} pools and "
            f"{sum(d.fused for d in residual)} of {len(residual)} residual adds fused into "
            f"their conv, {sum(d.fused for d in dwpw)} of {len(dwpw)} depthwise convs into "
            f"the pointwise conv after them; {len(sch.conversions)} layout conversions "
            f"inserted", quiet)
    return sch


def _time_for(ctx, net, only, quiet):
    """Whether a search after the network's (fused pools, adds and depthwise convs, layout
    conversions) of the layers `only` of `net` fits in what a time budget has left before the
    library, measuring each unique layer once at least; when it does not, says so and it
    measures nothing (its pools and depthwise convs stay unfused, an add is fused only where
    the conv's own kernel takes it, its conversions run their fallback)."""
    clock = ctx.budget
    if not isinstance(clock, Clock) or not ctx.tuning:
        return True
    layers = [l for l in net.layers if l.name in only]
    unique = [g[0] for g in unique_layers(layers)]
    if clock.affords(unique):
        return True
    k, what = len(unique), sorted({l.op for l in layers})
    log(f"aotconv: budget {clock.budget}: no time left to measure {k} "
        f"{'/'.join(what)} layer{'s' if k != 1 else ''} after the network's search (about "
        f"{clock.follow_up_min(unique):.0f} s; "
        f"{max(0.0, clock.left() - clock.final_reserve):.0f} s left before the library's "
        f"build): not measured", quiet)
    return False


def _reference(u, job, flat, sch):
    """What --check compares size `u` (scheduled as `sch`) with: where layers compute in
    TF32 or store half, the float64 reference with their operands (and, for half, every stored
    output) rounded as the library rounds them (aotconv.precision, docs/precision.md); else the
    ONNX import's reference (onnxruntime) where it may stand, else the float64 numpy reference
    of the network as written. None without --check."""
    if not job.check:
        return None
    rounded = precision.check_reference(sch, u.net0, flat)
    if rounded is not None:
        return rounded
    if job.reference_ok:
        ref = u.imported.reference()
        if ref is not None:
            return ref
    return lambda x: run_network(u.net0, x, params_mod.split(u.net0, flat))


def judge(out, ref, x, want=None):
    """(error, tolerance, spread) of the library's outputs `out` on `x` against the reference
    `ref` (`want`: its outputs on `x`, when already computed): the largest hybrid error, and
    what it may be: T, or past T for a reference that rounds as a reduced-precision library
    does (precision.RoundedReference), T plus twice the spread of the roundings on this
    network and input (docs/precision.md)."""
    from .protocol import TOLERANCE
    want = ref(x) if want is None else want
    err = _error(out, want)
    if err <= TOLERANCE or not hasattr(ref, "spread"):
        return err, TOLERANCE, None
    spread = ref.spread(x, want)
    return err, ref.tolerance(spread), spread


def _import_onnx(source, batch, input_shapes):
    """An .onnx source through aotconv.onnx_import (docs/onnx.md); None for a net.yaml."""
    from . import onnx_import
    if onnx_import.is_onnx(source):
        return onnx_import.import_model(source, input_shapes=input_shapes, batch=batch)
    if input_shapes:
        raise onnx_import.OnnxError("--input-shape applies to .onnx models; a net.yaml gives "
                                    "its input shape with `input:`", str(source))
    return None


def random_inputs(net, rng, n=None):
    """Random float32 input of `net` (n samples, default its batch): one array for a network
    of one input, else a list of arrays in input order (what the library and the references
    take)."""
    xs = [rng.standard_normal((n or s[0],) + tuple(s[1:])).astype(np.float32)
          for _, s in net.inputs]
    return xs[0] if len(xs) == 1 else xs


def measure_library(outdir, net0, flat, seed, check, runs=5, ref=None, until=None):
    """Run the built library on random input (every input of it): (median per-kernel times,
    (error, tolerance, spread) of the optional check (judge), the runs the median is of).
    `until`: a time.monotonic() deadline (a time budget's end): only the runs that fit by then,
    at the first run's pace, one at least."""
    from .runtime import load
    rng = np.random.default_rng(seed + 1)
    x = random_inputs(net0, rng)
    with load(outdir, profile=True) as lib:     # the report's per-kernel times
        lib.set_params(flat)
        t = time.monotonic()
        out = lib(x)
        if until is not None:
            once = max(time.monotonic() - t, 1e-3)
            runs = max(1, min(runs, int((until - time.monotonic()) / once)))
        prof = _median_profile(lib, x, runs)
    judged = (None, None, None)
    if check:
        ref = ref or (lambda x: run_network(net0, x, params_mod.split(net0, flat)))
        judged = judge(out, ref, x)
    return prof, judged, runs


def measure_sizes(outdir, res, job, flat, refs, runs=5):
    """Every size of a ranged library run with its own number of samples (median per-kernel
    times, --check against its reference), and with --check one n between two sizes (the
    first gap: 5 of sizes 1, 8), against the reference of the size that serves it on the n
    samples padded with zeros, its first n outputs."""
    from .runtime import load
    rng = np.random.default_rng(job.seed + 1)
    with load(outdir, profile=True) as lib:     # the report's per-kernel times
        lib.set_params(flat)
        for z, u, ref in zip(res.sizes, job.units, refs):
            x = random_inputs(u.net0, rng)
            out = lib(x)
            z.profile = _median_profile(lib, x, runs, batch=z.batch)
            if ref:
                z.check_error, z.check_tolerance, z.check_spread = judge(out, ref, x)
        n, at = between(lib.batch_sizes)
        if job.check and n is not None:
            k = lib.batch_sizes.index(at)
            xs = [np.zeros(s, np.float32) for _, s in job.units[k].net0.inputs]
            for x in xs:
                x[:n] = rng.standard_normal((n,) + x.shape[1:])
            one = len(xs) == 1
            out = lib(xs[0][:n] if one else [x[:n] for x in xs])
            res.check_n = n
            res.check_error, res.check_tolerance, res.check_spread = judge(
                out, _first(refs[k], n), xs[0] if one else xs)
    res.profile = [p for z in res.sizes for p in (z.profile or [])]
    # the verdict of the check nearest its tolerance (or past it) stands for the library's
    checks = [(e, t, s) for e, t, s in [(res.check_error, res.check_tolerance, res.check_spread)]
              + [(z.check_error, z.check_tolerance, z.check_spread) for z in res.sizes]
              if e is not None]
    if checks:
        res.check_error, res.check_tolerance, res.check_spread = max(
            checks, key=lambda c: c[0] / c[1])


class _first:
    """A reference whose outputs are those of `ref` cut to their first n samples (the check
    of an n between two batch sizes); its spread cut alike, over evaluations of at least
    SPREAD_SAMPLES of the n images."""

    def __init__(self, ref, n):
        self.ref, self.n = ref, n
        if hasattr(ref, "spread"):
            samples = -(-precision.SPREAD_SAMPLES // n)
            self.spread = lambda x, want=None: ref.spread(x, want, samples, cut=self.cut)
            self.tolerance = ref.tolerance

    def __call__(self, x):
        return self.cut(self.ref(x))

    def cut(self, want):
        return [r[:self.n] for r in want] if isinstance(want, list) else want[:self.n]


def between(sizes):
    """(n, size): an n that is not a batch size, from the first gap among 0 and the sizes, and
    the size that serves it; (None, None) when the sizes leave no gap (1, 2, 3)."""
    for a, b in zip((0,) + tuple(sizes), sizes):
        if b - a > 1:
            return a + (b - a + 1) // 2, b
    return None, None


def _median_profile(lib, x, runs, batch=None):
    """[(kernel, median ms)] of `runs` runs of `x` (the kernels of size `batch`, else all)."""
    times = []
    for _ in range(runs):
        lib(x)
        times.append([ms for _, ms in lib.profile(batch=batch)])
    med = np.median(np.array(times), axis=0) if times and times[0] else []
    names = [k for k, _ in lib.profile(batch=batch)]
    return list(zip(names, [float(t) for t in med]))


def _error(out, ref):
    """The largest hybrid error of the library's outputs against the reference's."""
    from .harness import close
    outs = out if isinstance(out, list) else [out]
    refs = ref if isinstance(ref, list) else [ref]
    return max(close(o, r)[1] for o, r in zip(outs, refs))

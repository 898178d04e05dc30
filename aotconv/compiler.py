"""The whole flow of `aotconv build`: spec -> passes -> choose -> schedule -> emit -> ninja ->
params -> (device present) run the library, check it against numpy, profile, report."""
from dataclasses import dataclass
from pathlib import Path
import sys
import time

import numpy as np

from . import params as params_mod
from . import binaries, fusion, layouts, passes, spec
from .build import build as ninja_build
from .choose import choose
from .context import BuildContext
from .emit import emit
from .graph import Network
from .outdir import OutputDir
from .report import write_report
from .schedule import build_schedule, c_ident
from .targets import get_target


@dataclass
class BuildResult:
    outdir: Path
    net: object              # after passes
    schedule: object
    target: object
    profile: list = None     # [(kernel, ms)] median over runs, when the device was present
    check_error: float = None
    check_reference: str = "numpy"   # what --check compared with (onnxruntime for .onnx)
    programs: object = None  # binaries.ProgramPlan: joined or per layer, binaries embedded


def log(msg, quiet=False):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def compile_network(source, target="auto", outdir=None, batch=None, weights=None, seed=0,
                    tune_mode="tune", budget=None, strategy=None, tuning_db=None,
                    require_tuned=False, check=False, measure=True, quiet=False, json_progress=False,
                    jobs=None, fuse_pool="measure", input_shapes=None, binaries=True):
    """Build the library of `source` (a net.yaml, a shipped network's name or an .onnx model)
    for `target` into `outdir`; the keywords are `aotconv build`'s options."""
    t0 = time.time()
    tgt = get_target(target)
    imported = _import_onnx(source, batch, input_shapes)
    net0 = imported.network if imported else spec.load_network(source, batch=batch)
    # the user's weights are read and checked before anything is tuned
    flat = (params_mod.from_npz(net0, weights) if weights else
            imported.params if imported else None)
    net = passes.optimise(net0)
    outdir = Path(outdir or Path("build") / net.name)
    job = _Job(net0, flat, seed, check, measure, fuse_pool, imported,
               reference_ok=imported is not None and not weights, binaries=binaries)
    # the output directory is checked, locked and marked before any kernel is built;
    # everything is written under od.staging and moved into place at the end (aotconv.outdir)
    with BuildContext.make(tgt, mode=tune_mode, tuning_db=tuning_db, budget=budget,
                           strategy=strategy, jobs=jobs, require_tuned=require_tuned,
                           quiet=quiet, json_progress=json_progress) as ctx, \
            OutputDir(outdir, network=net.name, quiet=quiet) as od:
        log(f"aotconv: {net.name}: {len(net0.layers)} layers ({len(net.layers)} after fusion), "
            f"target {tgt.name}, output {outdir}", quiet)
        res = _build_into(od, ctx, net, job, quiet)
        od.commit()
    res.outdir = outdir
    log(f"aotconv: built {outdir}/lib{c_ident(net.name)}.so and .a "
        f"({time.time() - t0:.1f} s)", quiet)
    return res


@dataclass
class _Job:
    """What a build makes besides the kernels: the network as written, its parameters, and
    what to do with the library once it is built."""
    net0: object             # the network before passes (parameters follow its layout)
    flat: object             # the parameters given (weights file, ONNX initializers), or None
    seed: int                # seeds the random parameters and the check's input
    check: bool
    measure: bool
    fuse_pool: str
    imported: object = None  # the ONNX import, whose reference --check may use
    reference_ok: bool = False
    binaries: bool = True    # embed device binaries where the target's device is present


def _build_into(od, ctx, net, job, quiet):
    """Everything of a build written into the staging directory `od.staging`."""
    stage = od.staging

    def choose_only(n, only):
        return choose(n, ctx, only=only)

    def choose_conversions(layers):
        n = Network(net.name, net.input_shape, layers, [layers[-1].name])
        return choose_only(n, [l.name for l in layers])

    choices = choose(net, ctx)
    # pools fused where measured faster, then layouts across the network (aotconv.fusion,
    # aotconv.layouts); build_schedule inserts the conversions the layouts still need
    net, choices, fused = fusion.apply(net, choices, ctx.profile, job.fuse_pool, ctx.mode,
                                       choose_only)
    net, choices, residual = fusion.apply_residual(net, choices, ctx.profile, "measure",
                                                   ctx.mode, choose_only)
    choices, layout_plan = layouts.plan_network(net, choices, ctx)
    sch = build_schedule(net, choices, convert=choose_conversions, source=job.net0)
    sch.fusion, sch.residual, sch.layout_plan = fused, residual, layout_plan
    net = sch.net
    if fused or residual or sch.conversions:
        log(f"aotconv: {sum(d.fused for d in fused)} of {len(fused)} pools and "
            f"{sum(d.fused for d in residual)} of {len(residual)} residual adds fused into "
            f"their conv; {len(sch.conversions)} layout conversions inserted", quiet)
    plan = binaries.plan(sch.programs, ctx, binaries=job.binaries, log=lambda m: log(m, quiet))
    log(f"aotconv: programs: {plan.note}", quiet)
    emit(sch, ctx.profile, stage, prefix=od.path, programs=plan)
    flat = job.flat if job.flat is not None else params_mod.random_params(job.net0, seed=job.seed)
    params_mod.write_bin(stage / f"{c_ident(net.name)}.params.bin", flat)
    ninja_build(stage)

    res = BuildResult(od.path, net, sch, ctx.profile, programs=plan)
    if job.measure and ctx.present:
        ref = job.imported.reference() if job.reference_ok and job.check else None
        res.profile, res.check_error = measure_library(stage, job.net0, flat, job.seed,
                                                       job.check, ref=ref)
        res.check_reference = ref.name if ref else "numpy"
    elif job.measure:
        log(f"aotconv: the {ctx.profile.name} device is not present: library built, not run; "
            f"report.md has no measured times", quiet)
    write_report(res, stage / "report.md")
    return res


def _import_onnx(source, batch, input_shapes):
    """An .onnx source through aotconv.onnx_import (docs/onnx.md); None for a net.yaml."""
    from . import onnx_import
    if onnx_import.is_onnx(source):
        return onnx_import.import_model(source, input_shapes=input_shapes, batch=batch)
    if input_shapes:
        raise onnx_import.OnnxError("--input-shape applies to .onnx models; a net.yaml gives "
                                    "its input shape with `input:`", str(source))
    return None


def measure_library(outdir, net0, flat, seed, check, runs=5, ref=None):
    """Run the built library on random input: median per-kernel times, optional numpy check."""
    from .harness import close
    from .reference import run_network
    from .runtime import load
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal(net0.input_shape).astype(np.float32)
    with load(outdir) as lib:
        lib.set_params(flat)
        out = lib(x)
        times = []
        for _ in range(runs):
            lib(x)
            times.append([ms for _, ms in lib.profile()])
        med = np.median(np.array(times), axis=0) if times and times[0] else []
        prof = list(zip(lib.kernel_names, [float(t) for t in med]))
    err = None
    if check:
        ref = ref(x) if ref else run_network(net0, x, params_mod.split(net0, flat))
        outs = out if isinstance(out, list) else [out]
        refs = ref if isinstance(ref, list) else [ref]
        err = max(close(o, r)[1] for o, r in zip(outs, refs))
    return prof, err

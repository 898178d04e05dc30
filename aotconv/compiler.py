"""The whole flow of `aotconv build`: spec -> passes -> choose -> schedule -> emit -> ninja ->
params -> (device present) run the library, check it against numpy, profile, report."""
from dataclasses import dataclass
from pathlib import Path
import sys
import time

import numpy as np

from . import params as params_mod
from . import fusion, layouts, passes, spec
from .build import build as ninja_build
from .choose import choose
from .emit import emit
from .graph import Network
from .outdir import OutputDir
from .report import write_report
from .schedule import build_schedule, c_ident
from .targets import find_device, get_target


@dataclass
class BuildResult:
    outdir: Path
    net: object              # after passes
    schedule: object
    target: object
    profile: list = None     # [(kernel, ms)] median over runs, when the device was present
    check_error: float = None
    check_reference: str = "numpy"   # what --check compared with (onnxruntime for .onnx)


def log(msg, quiet=False):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def compile_network(source, target="auto", outdir=None, batch=None, weights=None, seed=0,
                    tune_mode="tune", budget=None, strategy=None, tuning_db=None,
                    require_tuned=False, check=False, measure=True, quiet=False, json_progress=False,
                    jobs=None, fuse_pool="measure", input_shapes=None):
    t0 = time.time()
    tgt = get_target(target)
    imported = _import_onnx(source, batch, input_shapes)
    net0 = imported.network if imported else spec.load_network(source, batch=batch)
    net = passes.optimise(net0)
    outdir = Path(outdir or Path("build") / net.name)
    # checked, locked and marked before any kernel is built; everything is written under
    # od.staging and moved into place at the end (aotconv.outdir)
    with OutputDir(outdir, network=net.name, quiet=quiet) as od:
        log(f"aotconv: {net.name}: {len(net0.layers)} layers ({len(net.layers)} after fusion), "
            f"target {tgt.name}, output {outdir}", quiet)
        res = _build_into(od, net0, net, tgt, weights, seed, tune_mode, budget, strategy,
                          tuning_db, require_tuned, check, measure, quiet, json_progress, jobs,
                          fuse_pool, imported)
        od.commit()
    res.outdir = outdir
    log(f"aotconv: built {outdir}/lib{c_ident(net.name)}.so and .a "
        f"({time.time() - t0:.1f} s)", quiet)
    return res


def _build_into(od, net0, net, tgt, weights, seed, tune_mode, budget, strategy, tuning_db,
                require_tuned, check, measure, quiet, json_progress, jobs, fuse_pool,
                imported=None):
    """Everything of a build written into the staging directory `od.staging`."""
    stage = od.staging
    choose_kw = dict(mode=tune_mode, budget=budget, strategy=strategy, tuning_db=tuning_db,
                     require_tuned=require_tuned, quiet=quiet, json_progress=json_progress,
                     jobs=jobs)

    def choose_only(n, only):
        return choose(n, tgt, only=only, **choose_kw)

    def choose_conversions(layers):
        n = Network(net.name, net.input_shape, layers, [layers[-1].name])
        return choose_only(n, [l.name for l in layers])

    choices = choose(net, tgt, **choose_kw)
    # pools fused where measured faster, then layouts across the network (aotconv.fusion,
    # aotconv.layouts); build_schedule inserts the conversions the layouts still need
    net, choices, fused = fusion.apply(net, choices, tgt, fuse_pool, tune_mode, choose_only)
    choices, layout_plan = layouts.plan_network(net, choices, tgt, tune_mode, tuning_db,
                                                choose_only)
    sch = build_schedule(net, choices, convert=choose_conversions)
    sch.fusion, sch.layout_plan = fused, layout_plan
    net = sch.net
    if fused or sch.conversions:
        log(f"aotconv: {sum(d.fused for d in fused)} of {len(fused)} pools fused into their "
            f"conv; {len(sch.conversions)} layout conversions inserted", quiet)
    emit(sch, tgt, stage, prefix=od.path)
    flat = (params_mod.from_npz(net0, weights) if weights else imported.params if imported
            else params_mod.random_params(net0, seed=seed))
    params_mod.write_bin(stage / f"{c_ident(net.name)}.params.bin", flat)
    ninja_build(stage)

    res = BuildResult(od.path, net, sch, tgt)
    if measure and find_device(tgt) is not None:
        ref = imported.reference() if imported and check and not weights else None
        res.profile, res.check_error = measure_library(stage, net0, flat, seed, check, ref=ref)
        res.check_reference = ref.name if ref else "numpy"
    elif measure:
        log(f"aotconv: the {tgt.name} device is not present: library built, not run; "
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

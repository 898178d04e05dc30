"""Time an emitted library: create() (the OpenCL platform, context, queue, programs and buffers), load_params, the first run(), then run() from numpy memory, run() from its pinned buffers, and the sum
of its kernels, each the median of --runs calls after --warmup; one line (and --json). With
--warm-driver, the process first makes an OpenCL context of its own, so that create() does not
pay the driver's own start (as in an application that already uses OpenCL).

    python tools/time_library.py build/resnet50 --label "devices=2" [--runs 50] [--json out.json]

--stage-threads N and --stage-bytes B go to create() as options.stage_threads and stage_bytes
(run()'s staging: the threads that copy, the chunk; 0 the defaults), --flush-every N as
options.flush_every (a clFlush after the input and every N kernels); --no-profile creates the
handle with profiling off (options.profile = 0: no kernel times, the kernels figure is left out).

On PoCL: --fresh-pocl-cache points POCL_CACHE_DIR at a new empty directory (removed after), PoCL's
cold start; where POCL_CACHE_DIR is set, the line also counts the work-group functions (.so
files) PoCL compiled during load_params and the first run() (docs/c-api.md, Programs: binaries
and source).

    python tools/time_library.py build/lenet5 --fresh-pocl-cache --runs 20
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aotconv.bench.library_timing import median_ms  # noqa: E402
from aotconv.runtime import load  # noqa: E402


def pocl_objects(cache):
    """The compiled kernel objects (.so) under PoCL's cache directory `cache`."""
    return {str(p.relative_to(cache)) for p in Path(cache).rglob("*.so")} if cache else set()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the build's output directory")
    p.add_argument("--label", default="", help="a label printed at the start of the line")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--warm-driver", action="store_true",
                   help="start the OpenCL driver (a context of this process's own) before create()")
    p.add_argument("--app-queue", action="store_true",
                   help="with --warm-driver: create_with_queue on that context and a profiling "
                        "queue of it, as an application that owns its OpenCL does")
    p.add_argument("--stage-threads", type=int, default=0, metavar="N",
                   help="options.stage_threads: threads that copy run()'s staged input and "
                        "output (0: one per CPU, at most 8; 1: the calling thread alone)")
    p.add_argument("--stage-bytes", type=int, default=0, metavar="B",
                   help="options.stage_bytes: run()'s staging chunk (0: 4 MiB; < 0: no staging)")
    p.add_argument("--flush-every", type=int, default=0, metavar="N",
                   help="options.flush_every: a clFlush after the input and every N kernels of "
                        "a run (0: none, the default)")
    p.add_argument("--no-profile", action="store_true",
                   help="options.profile = 0: the queue without profiling, no kernel times")
    p.add_argument("--fresh-pocl-cache", action="store_true",
                   help="POCL_CACHE_DIR: a new empty directory (PoCL's cold start), removed after")
    a = p.parse_args(argv)
    fresh = None
    if a.fresh_pocl_cache:      # before this process starts any OpenCL driver
        fresh = os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="aotconv-pocl-cache-")
    try:
        return _time(p, a)
    finally:
        if fresh:
            shutil.rmtree(fresh, ignore_errors=True)


def _time(p, a):
    driver_ms = None
    cache = os.environ.get("POCL_CACHE_DIR")
    if a.warm_driver:
        import pyopencl as cl
        t0 = time.perf_counter()
        devices = [d for pf in cl.get_platforms() for d in pf.get_devices()]
        gpus = [d for d in devices if d.type & cl.device_type.GPU]
        ctx = cl.Context([(gpus or devices)[0]])       # the first GPU, as the library's pick
        queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        queue.finish()
        driver_ms = round((time.perf_counter() - t0) * 1e3, 1)
    if a.app_queue and not a.warm_driver:
        p.error("--app-queue needs --warm-driver")
    t0 = time.perf_counter()
    with load(a.dir, params=False, stage_threads=a.stage_threads, stage_bytes=a.stage_bytes,
              flush_every=a.flush_every, profile=not a.no_profile,
              queue=queue if a.app_queue else None) as net:
        create_ms = (time.perf_counter() - t0) * 1e3        # dlopen, create()
        from_binary, why = net.program_source()
        before = pocl_objects(cache)
        t0 = time.perf_counter()
        params = net.dir / f"{net.name}.params.bin"
        if params.exists():
            net.load_params(params)
        params_ms = (time.perf_counter() - t0) * 1e3
        after = pocl_objects(cache)
        compiled_params, before = len(after - before), after
        load_ms = create_ms + params_ms
        x0 = np.zeros(net.input_shape, np.float32)
        t0 = time.perf_counter()
        net(x0)
        first_ms = (time.perf_counter() - t0) * 1e3
        compiled = len(pocl_objects(cache) - before) if cache else None
        x = np.random.default_rng(0).standard_normal(net.input_shape).astype(np.float32)
        t0 = time.perf_counter()
        net(x)
        second_ms = (time.perf_counter() - t0) * 1e3
        run_ms = median_ms(lambda: net(x), a.warmup, a.runs)
        xin, _ = net.host_buffers()
        xin[...] = x
        pinned_ms = median_ms(net.run_host, a.warmup, a.runs)
        kernels, per, prof = [], [], []
        for _ in range(0 if a.no_profile else a.runs):
            net.run_host()
            prof = net.profile()
            kernels.append(sum(ms for _, ms in prof))
            per.append([ms for _, ms in prof])
        out = {"label": a.label, "dir": str(a.dir), "driver_start_ms": driver_ms,
               "create_ms": round(create_ms, 1), "params_ms": round(params_ms, 1),
               "programs_from_binary": bool(from_binary), "programs_why": why,
               "load_ms": round(load_ms, 1),
               "first_run_ms": round(first_ms, 2), "second_run_ms": round(second_ms, 2),
               "pocl_cache": cache, "pocl_compiled_load_params": compiled_params if cache
               else None, "pocl_compiled_first_run": compiled,
               "run_ms": round(run_ms, 4),
               "pinned_run_ms": round(pinned_ms, 4),
               "kernels_ms": round(float(np.median(kernels)), 4) if kernels else None,
               "launches": len(net.kernel_names),
               "stage_threads": a.stage_threads, "stage_bytes": a.stage_bytes,
               "flush_every": a.flush_every, "profile": not a.no_profile,
               "per_kernel_ms": [[name, round(float(ms), 5)] for name, ms in
                                 zip([n for n, _ in prof], np.median(np.array(per), axis=0))]
               if kernels else []}
    pre = f"driver start {driver_ms:.1f} ms, " if driver_ms is not None else ""
    call = "create_with_queue()" if a.app_queue else "create()"
    print(f"{a.label} {pre}{call} {out['create_ms']:.1f} ms "
          f"({'binary' if from_binary else 'source'}), load_params {out['params_ms']:.1f} ms"
          f"{f' ({compiled_params} compiled)' if cache else ''}, "
          f"load {out['load_ms']:.1f} ms, first run() {out['first_run_ms']:.2f} ms"
          f"{f' ({compiled} compiled)' if compiled is not None else ''}, "
          f"second run() {out['second_run_ms']:.2f} ms, "
          f"run() {out['run_ms']:.3f} ms, from pinned {out['pinned_run_ms']:.3f} ms, "
          + (f"kernels {out['kernels_ms']:.3f} ms" if kernels else "profiling off")
          + f" in {out['launches']} launches"
          + (f", a flush every {a.flush_every}" if a.flush_every > 0 else "") + f" ({a.dir})")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

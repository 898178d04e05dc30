"""Parallel-compile speed-up: candidate kernels made ready to run with 1, 2, 4... builders.

    python -m aotconv.bench.compile_speedup --target pocl-cpu --kernels 24 --jobs 1,2

The candidates are a seeded sample of a benchmark layer's pruned space (all its conv
variants). What is timed is what a tuning run waits for before it can launch them: with one
job, the runner process builds each from source; with N, N builder processes build them in
parallel and the runner then loads each (from the binary on a GPU, from the kernel cache the
builders filled on PoCL). Each setting starts with a fresh, empty driver cache
(POCL_CACHE_DIR, CUDA_CACHE_PATH), and its processes are started and warmed up before the
clock starts, as they are in a tuning run (they live as long as the run).
"""
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ..context import BuildContext
from ..errors import AotconvError
from ..space import layer_space
from ..targets import get_target
from ..tune.measure import Measurer, build_binary, load_program
from ..variants import BY_NAME
from . import script
from .study import benchmark_layers, study_layer


def main(argv=None):
    p = script.parser("aotconv.bench.compile_speedup", __doc__)
    p.add_argument("--target", default="auto")
    p.add_argument("--layer", default="vgg.conv3_2", help="benchmark layer")
    p.add_argument("--scale", type=int, default=8, help="shrink the layer (as the study does)")
    p.add_argument("--kernels", type=int, default=24, help="candidates to compile")
    p.add_argument("--jobs", default=None, help="comma-separated builder counts "
                                                "(default 1,2,4,... up to the cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the numbers as JSON here")
    a = p.parse_args(argv)

    target = get_target(a.target)
    ctx = BuildContext.make(target, mode="tune").require_device()
    live = ctx.target
    layers = benchmark_layers()
    if a.layer not in layers:
        raise AotconvError(f"--layer {a.layer}: not a benchmark layer; known: {sorted(layers)}")
    layer = study_layer(a.layer, layers[a.layer], a.scale)
    cands = layer_space(layer, live).candidates
    rng = np.random.default_rng(a.seed)
    pick = rng.choice(len(cands), size=min(a.kernels, len(cands)), replace=False)
    sources = [BY_NAME[cands[i].variant].render(layer, cands[i].cfg, "k") for i in pick]
    cores = os.cpu_count() or 1
    jobs = [int(j) for j in a.jobs.split(",")] if a.jobs else \
        [j for j in (1, 2, 4, 8, 16, 32) if j <= cores]
    rows = []
    warm = "__kernel void w(__global float* x) { x[get_global_id(0)] = 1.0f; }"
    for j in jobs:
        cache = tempfile.mkdtemp(prefix="aotconv-bench-cache-")
        os.environ["POCL_CACHE_DIR"] = os.environ["CUDA_CACHE_PATH"] = cache
        m = Measurer(live, jobs=j)
        runner = m.runner
        runner.call(load_program, (live, warm, None, m.options), 600)
        pool = m._builder_pool()
        if pool:                               # start every builder before the clock
            for w in list(m.builders.queue):
                w.call(build_binary, (live, warm, m.options, False), 600)
        t0 = time.perf_counter()
        if pool:
            res = list(pool.map(m._build, sources))
            failed = sum(r[0] != "ok" for r in res)
            for src, r in zip(sources, res):
                if r[0] == "ok":
                    runner.call(load_program, (live, src, r[1], m.options), 600)
        else:
            failed = 0
            for src in sources:
                try:
                    runner.call(load_program, (live, src, None, m.options), 600)
                except RuntimeError:
                    failed += 1
        dt = time.perf_counter() - t0
        m.close()
        shutil.rmtree(cache, ignore_errors=True)
        rows.append({"jobs": j, "kernels": len(sources), "seconds": round(dt, 2),
                     "per_kernel_s": round(dt / len(sources), 3), "failed": failed})
        print(f"jobs {j:2d}: {len(sources)} kernels ready in {dt:7.2f} s "
              f"({dt / len(sources):.3f} s each, speed-up "
              f"{rows[0]['seconds'] / dt:.2f}x){' ' + str(failed) + ' failed' if failed else ''}",
              flush=True)
    out = {"target": live.name, "device": ctx.found[1].name, "cores": cores, "layer": a.layer,
           "scale": a.scale, "rows": rows}
    if a.out:
        script.write_results(a.out, out)
    return 0


entry = script.entry("compile_speedup", main)


if __name__ == "__main__":
    sys.exit(entry())

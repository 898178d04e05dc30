"""Where a tuning candidate's time goes on the GPU: the runner's phases for candidates of two
ResNet-50 b1 layers, and the Measurer's rate with one and two lanes."""
import time, threading
import numpy as np
from aotconv import passes, spec, protocol
from aotconv.ops import is_alias
from aotconv.targets import get_target
from aotconv.tune.search import unique_layers
from aotconv.tune import measure as M
from aotconv.space import layer_spaces
from aotconv.harness import cl as pyopencl

import os
t = get_target(os.environ.get("PROBE_TARGET", "h100"))
N = int(os.environ.get("PROBE_N", "6"))
net = passes.optimise(spec.load_network("resnet50", batch=1))
groups = unique_layers([l for l in net.layers if not is_alias(l)])
names = ["layer1.0.conv1", "layer3.1.conv2", "layer4.1.conv2"]
gs = [g for g in groups if g[0].name in names]
sps = layer_spaces([g[0] for g in gs], t)
rng = np.random.default_rng(1)
cl = pyopencl()
ctx, q, dev = M._context(t)
for g, sp in zip(gs, sps):
    layer = g[0]
    cands = [sp.candidates[i] for i in rng.choice(len(sp.candidates), N, replace=False)]
    T = {}
    def tick(s): pass
    t0 = time.perf_counter(); xs, params, ref = M._data(layer, 0); T["data+ref"] = time.perf_counter() - t0
    print(layer.name, "data+ref %.3f s" % T["data+ref"], flush=True)
    for c in cands:
        job = M.prepare_job(t, layer, c, {p.variant.name: p.variant for p in sp.parts}, M.BUILD_OPTIONS if hasattr(M, "BUILD_OPTIONS") else ())
        if isinstance(job, M.Outcome):
            print("  render failed"); continue
        row = {}
        a = time.perf_counter(); st, binary, bs = M.build_binary(tick, t, job.source, job.options); row["builder"] = time.perf_counter() - a
        if st != "ok": print("  build failed"); continue
        a = time.perf_counter(); prog = protocol.build(ctx, dev, job.source, job.options, binary=binary, name=job.plan.name); row["load_ptx"] = time.perf_counter() - a
        a = time.perf_counter(); k = protocol.Kernel(ctx, q, layer, job.plan, job.cfg, xs, params, program=prog, source=job.source); q.finish(); row["kernel_obj"] = time.perf_counter() - a
        a = time.perf_counter(); check, t1 = protocol.verify(k, ref, job.tol, job.precision); row["verify"] = time.perf_counter() - a
        a = time.perf_counter(); n = protocol.copies(protocol.buffers_footprint(k.runs[0]), job.rotate_bytes, dev.global_mem_size) - 1; k.add_copies(n); q.finish(); row["copies"] = time.perf_counter() - a
        reps = protocol.repeats_for_total(t1, job.min_total_ms, *job.repeats)
        a = time.perf_counter(); times = protocol.time_repeats(k, k.copies, reps); row["time"] = time.perf_counter() - a
        print("  %-10s ok=%s t=%.4f ms copies=%d reps=%d " % (c.variant, check["ok"], protocol.median(times), k.copies, reps) + " ".join("%s=%.3f" % kv for kv in row.items()), flush=True)
# the Measurer, end to end: one lane, then two
m = M.Measurer(t)
try:
    for lanes in (1, 2):
        done = []
        def work(g, sp, seed):
            r = np.random.default_rng(seed)
            cands = [sp.candidates[i] for i in r.choice(len(sp.candidates), 24, replace=False)]
            a = time.perf_counter()
            stamps = []
            m.measure(g[0], cands[:8], None, lambda c, o: stamps.append(time.perf_counter() - a))
            m.measure(g[0], cands[8:], None, lambda c, o: stamps.append(time.perf_counter() - a))
            done.append((g[0].name, time.perf_counter() - a, [round(s, 2) for s in stamps]))
        a = time.perf_counter()
        ths = [threading.Thread(target=work, args=(gs[i], sps[i], 10 * lanes + i)) for i in range(lanes)]
        [th.start() for th in ths]; [th.join() for th in ths]
        print("lanes", lanes, "wall %.2f s" % (time.perf_counter() - a), done, flush=True)
finally:
    m.close()

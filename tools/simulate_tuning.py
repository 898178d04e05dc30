"""A tuning run's wall time on simulated devices, device-free: the real search (tune_network,
the model strategy, lanes, the budget in trials) against a stand-in measurer whose candidates
take the compile and run times of a farm trace (AOTCONV_FARM_TRACE: one JSON line per
candidate with its compile, built, run and done times), drawn per layer and variant.

    python tools/simulate_tuning.py TRACE [--net resnet50] [--batch 1] [--trials 400]
        [--devices 1 2] [--cpus-per-device 16] [--mode batched streamed] [--div 2]
        [--out results.json]

The stand-in compiles on `cpus` processes (a compile holds one for its trace time) and runs a
candidate on any free device of `devices` (one at a time each, its trace run time); every
time is divided by `--div`. What it leaves out: the host's own work per candidate (rendering
its source, the runner's set-up beyond the trace's run), and the spaces are those of the
variants that enumerate in seconds unless --all-variants. A projection from a measured trace,
not a measurement: the table says so.
"""
import argparse
import collections
import json
import random
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotconv import passes, spec                                    # noqa: E402
from aotconv.ops import is_alias                                    # noqa: E402
from aotconv.space import layer_space                               # noqa: E402
from aotconv.targets import get_target                              # noqa: E402
from aotconv.tune import search                                     # noqa: E402
from aotconv.tune.measure import MeasurerBase, Outcome, Status, prepare_job  # noqa: E402
from aotconv.tune.records import Store                              # noqa: E402
from aotconv.variants import for_layer                              # noqa: E402

HEAVY = {"conv_igemm", "conv_im2col", "conv_winograd", "conv_1x1"}


class Trace:
    """Compile and run seconds of the trace's candidates, by (layer, variant), by variant, and
    all together."""

    def __init__(self, path):
        self.by = collections.defaultdict(list)
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if not all(r.get(k) is not None for k in ("compile", "built", "run", "done")):
                continue
            t = (r["built"] - r["compile"], r["done"] - r["run"])
            for key in ((r["layer"], r["variant"]), r["variant"], None):
                self.by[key].append(t)
        if not self.by[None]:
            raise SystemExit(f"{path}: no candidate with compile and run times")

    def draw(self, layer, variant, rng):
        for key in ((layer, variant), variant, None):
            if self.by.get(key):
                return rng.choice(self.by[key])


class Simulated(MeasurerBase):
    """`devices` devices and `cpus` compile processes, the trace's times divided by `div`;
    `streams` as a farm of GPUs (compiles overlap the runs) or not."""

    def __init__(self, trace, devices, cpus, div, streams, target):
        self.trace, self.div, self.target = trace, div, target
        self.cpus = threading.Semaphore(cpus)
        self.devices = threading.Semaphore(devices)
        self.capacity, self.slots, self.lanes = cpus, 2 * devices, 2 * devices
        self.streams = streams
        self.pool = ThreadPoolExecutor(4 * cpus)
        self.busy = 0.0
        self.count = 0
        self.lock = threading.Lock()

    def _one(self, layer, cand):
        rng = random.Random(zlib.crc32(f"{layer.name}|{cand}".encode()))
        compile_s, run_s = self.trace.draw(layer.name, cand.variant, rng)
        with self.cpus:
            time.sleep(compile_s / self.div)
        with self.devices:
            time.sleep(run_s / self.div)
        with self.lock:
            self.busy += run_s / self.div
            self.count += 1
        ms = 0.01 + 0.05 * rng.random()
        return Outcome(Status.OK, time_ms=ms, times=(ms,), build_s=compile_s / self.div)

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        from aotconv.variants import BY_NAME
        for c in candidates:           # the host's own work per candidate, as a measurer does
            prepare_job(self.target, layer, c, variants or BY_NAME, ())
        futures = {self.pool.submit(self._one, layer, c): i for i, c in enumerate(candidates)}
        out = [None] * len(candidates)
        for f in as_completed(futures):
            i = futures[f]
            out[i] = f.result()
            if on_outcome is not None:
                on_outcome(candidates[i], out[i])
        return out

    def close(self):
        self.pool.shutdown(wait=False)


def network(name, batch, target, heavy):
    net = passes.optimise(spec.load_network(name, batch=batch))
    groups = search.unique_layers([l for l in net.layers if not is_alias(l)])
    spaces = [layer_space(g[0], target, variants=[v for v in for_layer(g[0])
                                                  if heavy or v.name not in HEAVY])
              for g in groups]
    return groups, spaces


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cpus-per-device", type=int, default=16)
    ap.add_argument("--mode", nargs="+", default=["batched", "streamed"],
                    choices=["batched", "streamed"])
    ap.add_argument("--div", type=float, default=2.0)
    ap.add_argument("--all-variants", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    trace = Trace(a.trace)
    target = get_target(a.target)
    groups, spaces = network(a.net, a.batch, target, a.all_variants)
    by_sig = {g[0].signature_str(): sp for g, sp in zip(groups, spaces)}
    search.layer_spaces = lambda layers, t: [by_sig[l.signature_str()] for l in layers]
    rows = []
    for d in a.devices:
        for mode in a.mode:
            m = Simulated(trace, d, d * a.cpus_per_device, a.div, mode == "streamed", target)
            t0 = time.monotonic()
            try:
                res = search.tune_network(groups, target, m, Store(write=[]), None,
                                          budget=str(a.trials), strategy="model",
                                          lanes=m.lanes)
            finally:
                m.close()
            wall = (time.monotonic() - t0) * a.div
            rows.append(dict(devices=d, cpus=d * a.cpus_per_device, mode=mode,
                             trials=sum(r.new for r in res.values()), wall_s=round(wall, 1),
                             per_s=round(m.count / wall * a.div / a.div, 1),
                             device_busy=round(m.busy / (wall / a.div) / d, 3)))
            print(f"{d} device(s), {d * a.cpus_per_device} CPUs, {mode:8s}: "
                  f"{rows[-1]['trials']} candidates in {wall:.1f} s (simulated), "
                  f"devices {rows[-1]['device_busy']:.0%} busy", flush=True)
    print()
    print("| devices | CPUs | search | candidates | wall s (simulated) | devices busy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['devices']} | {r['cpus']} | {r['mode']} | {r['trials']} | {r['wall_s']} | "
              f"{r['device_busy']:.0%} |")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(trace=str(a.trace), net=a.net, batch=a.batch,
                                               trials=a.trials, div=a.div, rows=rows),
                                          indent=1))


if __name__ == "__main__":
    main()

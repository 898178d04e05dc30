"""Per-kernel CUDA times of PyTorch FP16 on a shipped network (model.half(), channels-last, the
bench's model of the same net.yaml), eager and under torch.compile's default mode (the kernels
that reduce-overhead replays from a CUDA graph): one line per kernel of one run, in launch
order, with its mean time over ten runs; a kernel that serves several layers shows its mean.
Then torch.compile reduce-overhead timed with CUDA events, one run and ten back to back between
the events. Needs a CUDA device and PyTorch.

    python tools/torch_profile.py vgg16 16
"""
import collections
import sys
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aotconv import params as params_mod, spec, torch_model  # noqa: E402
from aotconv.bench.refs.torch_ref import Precision  # noqa: E402

RUNS = 10


def kernels(fn, xd, label):
    for _ in range(5):
        fn(xd)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(RUNS):
            fn(xd)
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    first = ev[:len(ev) // RUNS]
    total, calls = collections.defaultdict(float), collections.Counter(e.name for e in first)
    for e in ev:
        total[e.name] += e.device_time / RUNS
    print(f"== {label}: {len(first)} kernels per run, {sum(total.values()) / 1e3:.3f} ms")
    for e in first:
        print(f"  {total[e.name] / 1e3 / calls[e.name]:.4f} ms  {e.name[:110]}")


def events(fn, xd, n):
    times = []
    for _ in range(60):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn(xd)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / n)
    return float(np.median(times))


def main(name, batch):
    net = spec.load_network(name, batch=batch)
    flat = params_mod.random_params(net, seed=0)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    with Precision("fp16", "cuda") as prec, torch.no_grad():
        model = prec.model(torch_model.build(net, flat, "cuda"))
        xd = prec.input(torch.from_numpy(x).cuda())
        kernels(model, xd, "eager")
        kernels(torch.compile(model), xd, "torch.compile (default mode)")
        fn = torch.compile(model, mode="reduce-overhead")
        for _ in range(10):
            fn(xd)
        torch.cuda.synchronize()
        for n in (1, 10):
            print(f"reduce-overhead, {n} run(s) between the events: {events(fn, xd, n):.4f} ms a run")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "vgg16", int(sys.argv[2]) if len(sys.argv) > 2 else 16)

"""Does run_async() let the host work while the device runs? An application loop that prepares
each input on the host (uint8 HWC pixels to normalised float NCHW, as a camera or decoder feeds a
classifier) and infers it, timed three ways over --iters iterations:

  prepare   the host work alone, per iteration
  run       run() alone, per iteration
  serial    prepare, then run(), one after the other
  overlap   run_async() of input i, then prepare input i+1 while the device runs, then wait()

With overlap, an iteration takes about max(prepare, run) instead of prepare + run. One table line
(and --json).

    python tools/async_overlap.py build/vgg16 [--iters 50] [--json out.json]
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aotconv.runtime import load  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def prepare(pixels, out):
    """uint8 (N, H, W, C) to float (N, C, H, W), scaled to [0, 1] and normalised per channel
    (the first three channels by ImageNet's statistics, any further ones as the third)."""
    c = pixels.shape[-1]
    mean = np.resize(MEAN, c)
    std = np.resize(STD, c)
    x = pixels.astype(np.float32) * (1.0 / 255.0)
    x -= mean
    x /= std
    out[...] = x.transpose(0, 3, 1, 2)
    return out


def per_iteration_ms(loop, iters):
    t0 = time.perf_counter()
    loop(iters)
    return (time.perf_counter() - t0) * 1e3 / iters


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the build's output directory")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--label", default="")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)
    with load(a.dir, profile=False) as net:
        if len(net.inputs) != 1 or len(net.input_shape) != 4:
            p.error(f"{net.name}: takes one NCHW input only")
        n, c, h, w = net.input_shape
        rng = np.random.default_rng(0)
        frames = [rng.integers(0, 256, (n, h, w, c), dtype=np.uint8) for _ in range(4)]
        bufs = [np.empty(net.input_shape, np.float32) for _ in range(2)]
        for _ in range(3):                                   # warm-up
            net(prepare(frames[0], bufs[0]))

        def prep_only(k):
            for i in range(k):
                prepare(frames[i % 4], bufs[i % 2])

        def run_only(k):
            x = prepare(frames[0], bufs[0])
            for _ in range(k):
                net(x)

        outs = []

        def serial(k):
            outs.clear()
            for i in range(k):
                outs.append(net(prepare(frames[i % 4], bufs[i % 2])).copy())

        def overlap(k):
            outs.clear()
            net.run_async(prepare(frames[0], bufs[0]))
            for i in range(1, k + 1):
                nxt = prepare(frames[i % 4], bufs[i % 2]) if i < k else None
                outs.append(net.wait().copy())               # run i-1 ends
                if nxt is not None:
                    net.run_async(nxt)

        prep_ms = per_iteration_ms(prep_only, a.iters)
        run_ms = per_iteration_ms(run_only, a.iters)
        serial_ms = per_iteration_ms(serial, a.iters)
        serial_out = list(outs)
        overlap_ms = per_iteration_ms(overlap, a.iters)
        same = all(np.array_equal(x, y) for x, y in zip(serial_out, outs))
    out = {"label": a.label, "dir": str(a.dir), "iters": a.iters, "prepare_ms": round(prep_ms, 3),
           "run_ms": round(run_ms, 3), "serial_ms": round(serial_ms, 3),
           "overlap_ms": round(overlap_ms, 3), "outputs_equal": same}
    print(f"{a.label} prepare {prep_ms:.3f} ms, run() {run_ms:.3f} ms; per iteration: serial "
          f"{serial_ms:.3f} ms, run_async + prepare + wait {overlap_ms:.3f} ms "
          f"(max of the two {max(prep_ms, run_ms):.3f}, sum {prep_ms + run_ms:.3f}); outputs "
          f"{'equal' if same else 'DIFFER'}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

"""What one more kernel launch costs a run beyond its kernel's own time, on a target's device.

    python3 tools/launch_gap.py --target pocl-cpu [--launches 200] [--json FILE]

A library's run() enqueues its kernels one after another on an in-order queue and waits for
the last; profile() gives each kernel's time between its start and end events. What run()
takes beyond their sum, less the copies, is the time between kernels: the host's enqueue and
the device's hand-over from one kernel to the next. This measures it with a chain of
`--launches` small kernels, each reading what the one before wrote (one work-group of 64
work-items), on an in-order queue, timed from the first enqueue to clFinish, with profiling off
(what an application gets by default, options.profile = 0) and on (options.profile = 1),
against the kernels' own profiled time:

    gap = (wall - sum of kernel times) / launches

The figure belongs in the target's profile (`launch_gap_us`, aotconv/targets.py), where the
choices that change how many kernels a run launches (a variant of several launches against
one of one, a fusion, a layout conversion) count it.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SOURCE = """
__kernel void chain_step(__global const float *x, __global float *y) {
    size_t i = get_global_id(0);
    y[i] = x[i] * 0.5f + 1.0f;
}
"""


def chain(cl, queue, kernel, bufs, launches):
    """Enqueue `launches` dependent kernels (ping-pong between two buffers); returns
    (seconds from the first enqueue to the end of clFinish, their events)."""
    events = []
    t0 = time.perf_counter()
    for i in range(launches):
        kernel.set_args(bufs[i % 2], bufs[(i + 1) % 2])
        events.append(cl.enqueue_nd_range_kernel(queue, kernel, (64,), (64,)))
    queue.finish()
    return time.perf_counter() - t0, events


def measure(target_name, launches=200, repeats=7):
    import numpy as np
    import pyopencl as cl
    from aotconv.targets import find_device, get_target
    target = get_target(target_name)
    found = find_device(target)
    if found is None:
        raise SystemExit(f"launch_gap: target '{target_name}': no matching OpenCL device")
    _, device = found
    ctx = cl.Context([device])
    prog = cl.Program(ctx, SOURCE).build()
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                      hostbuf=np.ones(64, np.float32)) for _ in range(2)]
    out = {"target": target_name, "device": device.name, "launches": launches}
    for profiled in (False, True):
        props = cl.command_queue_properties.PROFILING_ENABLE if profiled else 0
        queue = cl.CommandQueue(ctx, properties=props)
        kernel = cl.Kernel(prog, "chain_step")
        chain(cl, queue, kernel, bufs, launches)            # warm-up: native code, caches
        walls, kernels = [], []
        for _ in range(repeats):
            wall, events = chain(cl, queue, kernel, bufs, launches)
            walls.append(wall)
            if profiled:
                kernels.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in events))
        wall = statistics.median(walls)
        key = "profiling_on" if profiled else "profiling_off"
        out[key] = {"wall_us_per_launch": round(wall / launches * 1e6, 3)}
        if profiled:
            k = statistics.median(kernels)
            out[key]["kernel_us"] = round(k / launches * 1e6, 3)
            out["kernel_us"] = out[key]["kernel_us"]
    k = out["kernel_us"]
    for key in ("profiling_off", "profiling_on"):
        out[key]["gap_us"] = round(max(0.0, out[key]["wall_us_per_launch"] - k), 3)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="pocl-cpu")
    p.add_argument("--launches", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)
    out = measure(a.target, a.launches, a.repeats)
    print(f"{out['target']} ({out['device']}), {out['launches']} dependent launches: kernel "
          f"{out['kernel_us']:.2f} us each; between kernels {out['profiling_off']['gap_us']:.2f} "
          f"us with profiling off, {out['profiling_on']['gap_us']:.2f} us with it on")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

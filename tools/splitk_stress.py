"""Run one split-K conv_igemm kernel many times and count wrong outputs, with the device-scope fences of its
arrival handshake as rendered and with the OpenCL 1.2 mem_fence instead: the check behind the split-K ordering fix.

    python3 tools/splitk_stress.py --runs 300 [--target h100]

Each variant of the source is built, the fence / atomic / barrier lines of its program binary
(PTX on NVIDIA) are printed, and it runs --runs times on one random input; every run is
checked as aotconv.protocol checks (output poisoned first, compared with the float64 reference,
hybrid tolerance 1e-3).
"""
import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotconv import harness, protocol                                # noqa: E402
from aotconv.bench.device import Device                              # noqa: E402
from aotconv.bench.sets import conv_layer                            # noqa: E402
from aotconv.targets import TARGETS, detect                          # noqa: E402
from aotconv.variants import BY_NAME                                 # noqa: E402
from tools.measure_points import parse_cfg                            # noqa: E402

CASES = [
    (("boda.09", 5, 192, 28, 28, 96, 1, 1, 1, 0),
     "MDIM=8,NDIM=16,MBLK=32,NBLK=64,KBLK=16,VW=4,UNROLL=1,LPAD=0,DBUF=1,LAYOUT=NCHW,KSPLIT=4,TAPSTEP=0,KTAIL=0"),
    (("boda.02", 5, 832, 7, 7, 256, 1, 1, 1, 0),
     "MDIM=8,NDIM=8,MBLK=64,NBLK=32,KBLK=16,VW=4,UNROLL=0,LPAD=0,DBUF=1,LAYOUT=NCHW,KSPLIT=4,TAPSTEP=0,KTAIL=0"),
    (("alex.conv5", 8, 192, 13, 13, 256, 3, 3, 1, 1),
     "MDIM=8,NDIM=8,MBLK=64,NBLK=64,KBLK=16,VW=4,UNROLL=0,LPAD=0,DBUF=0,LAYOUT=CHWN,KSPLIT=2,TAPSTEP=1,KTAIL=132"),
]

FENCE = "DEVICE_FENCE();"


def variants(src):
    yield "as-rendered", src, []
    # the OpenCL 1.2 fence alone (membar.cta on NVIDIA): what split-K had before the fix
    yield "mem_fence-only", src.replace(FENCE, "mem_fence(CLK_GLOBAL_MEM_FENCE);"), []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--target", default="auto")
    a = ap.parse_args(argv)
    target = detect() if a.target == "auto" else TARGETS[a.target]
    dev = Device(target)
    v = BY_NAME["conv_igemm"]
    for t, cfg_text in CASES:
        layer, _ = conv_layer(t)
        cfg = parse_cfg(cfg_text)
        rng = np.random.default_rng(1)
        xs, params = harness.random_inputs(layer, rng)
        ref = protocol.Reference(layer, xs, params)
        src0 = v.render(layer, cfg, "k")
        assert FENCE in src0, "the template's fences moved: update this tool"
        for name, src, opts in variants(src0):
            try:
                prog = protocol.build(dev.ctx, dev.device, src, harness.BUILD_OPTIONS + opts)
            except Exception as e:
                print(f"{t[0]} {name}: build failed: {str(e)[:300]}", flush=True)
                continue
            ptx = bytes(prog.get_info(cl.program_info.BINARIES)[0]).replace(b"\0", b"").decode(
                "latin1")
            lines = [l.strip()[:100] for l in ptx.splitlines() if len(l) < 200
                     if re.search(r"membar|fence|atom|bar\.sync|barrier|ld\.volatile", l)]
            print(f"{t[0]} {name}: {len(lines)} sync lines: "
                  f"{sorted(set(re.sub(r'[%].*', '', l) for l in lines))}", flush=True)
            k = protocol.Kernel(dev.ctx, dev.queue, layer, v, cfg, xs, params, program=prog,
                                source=src)
            bad, worst = 0, 0.0
            for _ in range(a.runs):
                check, _ = protocol.verify(k, ref)
                bad += not check["ok"]
                worst = max(worst, check["error"])
            print(f"{t[0]} {name}: {bad} of {a.runs} runs wrong (worst error {worst:.3g})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the sanitizer job's network and its reference data: prepare.py NET.yaml OUTDIR.

Writes OUTDIR/ (the aotconv build directory: <net>.c, runtime/, <net>.params.bin, ...),
OUTDIR/input.bin (seeded random input; of several inputs, one after another) and
OUTDIR/expected.bin (the float64 numpy reference of
the library's output, as float32, the outputs one after another); prints the network's C name.
No device is needed: the library is built with every variant's fallback choice.
"""
import sys

import numpy as np

from aotconv import params, spec
from aotconv.compiler import compile_network
from aotconv.reference import run_network


def main(src, outdir):
    res = compile_network(src, target="pocl-cpu", outdir=outdir, tune_mode="fallback",
                          measure=False, quiet=True)
    net = spec.load_network(src)
    name = res.outdir.joinpath("tuning.json").read_text()
    import json
    c_name = json.loads(name)["c_name"]
    flat = params.read_bin(res.outdir / f"{c_name}.params.bin", net)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(s).astype(np.float32) for _, s in net.inputs]
    x = np.concatenate([a.ravel() for a in xs])
    outs = run_network(net, xs[0] if len(xs) == 1 else xs, params.split(net, flat))
    outs = outs if isinstance(outs, list) else [outs]
    y = np.concatenate([np.asarray(o, np.float32).ravel() for o in outs])
    x.astype("<f4").tofile(res.outdir / "input.bin")
    y.astype("<f4").tofile(res.outdir / "expected.bin")
    print(c_name)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Emitted libraries the application tests (tests/test_app_*.py) share, each built once per
pytest run: lenet5 on PoCL, a small network with two outputs on PoCL, and lenet5 for an
absent target (h100). All with fallback choices (no tuning) and no measuring."""
import contextlib
import io
from dataclasses import dataclass

import numpy as np

from aotconv import params as params_mod
from aotconv import spec
from aotconv.compiler import compile_network
from aotconv.reference import run_network

TWO_OUTPUTS = """\
name: twoout
input: [2, 3, 9, 9]
outputs: [c1, fc]
layers:
  - {name: c1, op: conv, out: 4, kernel: 3, act: relu}
  - {name: mp, op: maxpool, kernel: 2}
  - {name: fc, op: dense, out: 5}
"""


@dataclass
class Built:
    res: object          # compiler.BuildResult
    log: str             # what the build wrote to stderr
    source: str          # the network given to compile_network

    @property
    def dir(self):
        return self.res.outdir


def build(source, outdir, target="pocl-cpu", **kw):
    """compile_network with fallback choices, nothing measured; the build's log kept."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        res = compile_network(source, target=target, outdir=outdir, tune_mode="fallback",
                              measure=False, quiet=False, **kw)
    return Built(res, err.getvalue(), str(source))


def reference(built, x):
    """The float64 numpy reference of the built network on `x`, with the build's parameters
    (seed 0), the outputs concatenated flat."""
    net = spec.load_network(built.source)
    flat = params_mod.random_params(net, seed=0)
    ref = run_network(net, x, params_mod.split(net, flat))
    refs = ref if isinstance(ref, list) else [ref]
    return np.concatenate([r.ravel() for r in refs])


_built = {}


def library(factory, name):
    """The shared library `name` (lenet5, twoout, lenet5-h100), built on first use."""
    if name not in _built:
        d = factory.mktemp(name)
        if name == "lenet5":
            _built[name] = build("lenet5", d / "out")
        elif name == "lenet5-h100":
            _built[name] = build("lenet5", d / "out", target="h100")
        elif name == "twoout":
            (d / "twoout.yaml").write_text(TWO_OUTPUTS)
            _built[name] = build(d / "twoout.yaml", d / "out")
        else:
            raise KeyError(name)
    return _built[name]

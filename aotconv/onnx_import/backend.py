"""An onnx.backend.base.Backend over the importer and the compiler, to run ONNX's own node
conformance tests (onnx.backend.test) on a device.

A graph input is either a tensor the model computes on, which stays a network input and is
fed to the library at run time (run_inputs where there are several), or a parameter that
aotconv compiles into the library (a weight, a bias, a shape, axes, bounds, scales, pads):
`run` specialises the model to the value it is given for each parameter, which becomes an
initializer (a constant). An input is a parameter where every node that reads it reads it as
an operand after the first of an op other than those that compute on all their operands
alike (the elementwise ops of several operands, Concat): Conv's W, Gemm's B and C, Reshape's
shape, Clip's bounds, Resize's scales. Each run then imports the model, builds the library
with every variant's fallback choice (no tuning), and runs it on the tensors. A model
outside what the importer supports raises its OnnxError (the tests report those as skipped,
with the reason); anything else is a failure.
"""
import itertools
from pathlib import Path
import tempfile

import numpy as np

import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from .shapes import embed

_names = itertools.count()

# ops whose every operand is a tensor they compute on, none a parameter
ALL_OPERANDS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sum", "Mean", "Max", "Min",
                          "Concat"})


def tensor_inputs(model):
    """The names of the model's graph inputs (initializers aside) that are tensors it computes
    on, in the model's order; the others are parameters (the module's docstring)."""
    init = {t.name for t in model.graph.initializer}
    uses = {}
    for n in model.graph.node:
        for i, t in enumerate(n.input):
            if t:
                uses.setdefault(t, []).append(i == 0 or n.op_type in ALL_OPERANDS)
    # an input no node reads (or a graph output itself) stays an input: the importer says why
    # it cannot take it
    return [x.name for x in model.graph.input
            if x.name not in init and any(uses.get(x.name, [True]))]


class AotconvRep(BackendRep):
    def __init__(self, model, target, workdir=None):
        self.model, self.target, self.workdir = model, target, workdir
        init = {t.name for t in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in init]
        self.tensors = tensor_inputs(model)

    def specialised(self, values):
        """The model with each parameter input made an initializer of its value in `values`
        ({input name: array})."""
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        params = [x for x in self.inputs if x not in self.tensors]
        for x in params:
            g.initializer.append(numpy_helper.from_array(values[x], x))
        keep = [i for i in g.input if i.name not in set(params)]
        del g.input[:]
        g.input.extend(keep)
        return m

    @staticmethod
    def feeds(im, values):
        """The library's input arrays: the value of each input of the imported network `im`
        (its tensor inputs), float32 and 4-D, in the network's order."""
        return [values[x].astype(np.float32).reshape(embed(values[x].shape))
                for x, _ in im.inputs]

    def run(self, inputs, **kwargs):
        """The outputs of the model on `inputs`, one array per graph input (initializers
        aside) in the model's order."""
        from ..compiler import compile_network
        from ..runtime import load
        from . import import_model
        if len(inputs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs ({', '.join(self.inputs)}), "
                             f"got {len(inputs)}")
        values = {x: np.asarray(v) for x, v in zip(self.inputs, inputs)}
        with tempfile.TemporaryDirectory(prefix="aotconv-onnx-", dir=self.workdir) as d:
            path = Path(d) / f"onnx_case_{next(_names)}.onnx"
            onnx.save(self.specialised(values), str(path))
            im = import_model(path)           # OnnxError: outside what aotconv supports
            res = compile_network(str(path), target=self.target, outdir=Path(d) / "build",
                                  tune_mode="fallback", measure=False, quiet=True)
            with load(res.outdir) as lib:
                y = lib(*self.feeds(im, values))
            ys = y if isinstance(y, list) else [y]
            return tuple(np.asarray(ys[i], np.float32).reshape(shape)
                         for _, shape, i in im.outputs)


class AotconvBackend(Backend):
    """Runs models through aotconv on `target` (PoCL, the CPU OpenCL device, by default)."""
    target = "pocl-cpu"

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        return AotconvRep(model, cls.target)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("aotconv builds whole models: use run_model or prepare")

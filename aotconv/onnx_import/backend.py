"""An onnx.backend.base.Backend over the importer and the compiler, to run ONNX's own node
conformance tests (onnx.backend.test) on a device.

An aotconv network has one input and bakes its weights into the library, so `run` specialises
the model to the values it is given: the first graph input stays the network input, every
other input becomes an initializer (a constant). Each run then imports the model, builds the
library with every variant's fallback choice (no tuning), and runs it. A model outside what
the importer supports raises its OnnxError (the tests report those as skipped, with the
reason); anything else is a failure.
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


class AotconvRep(BackendRep):
    def __init__(self, model, target, workdir=None):
        self.model, self.target, self.workdir = model, target, workdir

    def specialised(self, inputs):
        """The model with its second and later graph inputs made initializers of `inputs`."""
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        init = {t.name for t in g.initializer}
        real = [i for i in g.input if i.name not in init]
        if len(inputs) != len(real):
            raise ValueError(f"expected {len(real)} inputs, got {len(inputs)}")
        for vi, value in zip(real[1:], inputs[1:]):
            g.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
        keep = [i for i in g.input if i.name not in {v.name for v in real[1:]}]
        del g.input[:]
        g.input.extend(keep)
        return m

    def run(self, inputs, **kwargs):
        from ..compiler import compile_network
        from ..runtime import load
        from . import import_model
        inputs = [np.asarray(v) for v in inputs]
        with tempfile.TemporaryDirectory(prefix="aotconv-onnx-", dir=self.workdir) as d:
            path = Path(d) / f"onnx_case_{next(_names)}.onnx"
            onnx.save(self.specialised(inputs), str(path))
            im = import_model(path)           # OnnxError: outside what aotconv supports
            res = compile_network(str(path), target=self.target, outdir=Path(d) / "build",
                                  tune_mode="fallback", measure=False, quiet=True)
            x = inputs[0].astype(np.float32).reshape(embed(inputs[0].shape))
            with load(res.outdir) as lib:
                y = lib(x)
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

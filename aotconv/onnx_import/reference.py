"""onnxruntime as the reference of an imported model: `--check` compares the built library
with what onnxruntime computes from the original .onnx file on the same input."""
import numpy as np

from .load import one_line
from .problems import OnnxError
from .shapes import embed


class OrtReference:
    """Callable: aotconv input (N, C, H, W) -> [outputs in the network's output order], each
    float64 in the library's 4-D shape; a model of several inputs takes a list of them, in the
    network's input order (or a dict by its input names)."""
    name = "onnxruntime"

    def __init__(self, imported):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        try:
            self.ort_model = ort.InferenceSession(imported.path, opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:
            raise OnnxError(f"onnxruntime cannot load the model: {one_line(e)}",
                            imported.path) from None
        self.imported = imported

    def __call__(self, x):
        im = self.imported
        given = im.network.input_values(x)        # {network input: array}, in input order
        xs = {onnx: np.ascontiguousarray(a, np.float32).reshape(shape)
              for (onnx, shape), a in zip(im.inputs, given.values())}
        n = len(next(iter(xs.values())))
        names = [o for o, _, _ in im.outputs]
        # a model exported for a fixed batch runs a larger --batch in slices of its own
        fixed = self.ort_model.get_inputs()[0].shape[0]
        step = fixed if isinstance(fixed, int) and 0 < fixed < n and n % fixed == 0 else n
        try:
            parts = [self.ort_model.run(names, {k: a[i:i + step] for k, a in xs.items()})
                     for i in range(0, n, step)]
        except Exception as e:
            # onnxruntime leaves some valid models unimplemented (LRN of rank 3, dilated
            # SAME convolutions): the numpy reference then stands in, and the result says so
            import sys
            from ..reference import run_network
            print(f"aotconv: {im.path}: onnxruntime cannot run the model ({one_line(e)}); "
                  f"checking against the numpy reference instead", file=sys.stderr)
            self.name = "numpy"
            vals = [a.reshape(s) for a, (_, s) in zip(xs.values(), im.network.inputs)]
            return run_network(im.network, vals[0] if len(vals) == 1 else vals, im.params)
        got = [np.concatenate([p[j] for p in parts]) for j in range(len(names))]
        refs = [None] * len(im.network.outputs)
        for (_, shape, i), y in zip(im.outputs, got):
            refs[i] = np.asarray(y, np.float64).reshape(embed(shape))
        return refs


def onnxruntime_reference(imported):
    """An OrtReference for `imported`, or None when onnxruntime is not installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    return OrtReference(imported)

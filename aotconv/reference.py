"""numpy float64 reference of every op: the ground truth for kernels, libraries and tuning."""
import numpy as np


def act(x, kind, alpha=0.01):
    if kind == "none":
        return x
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "leaky_relu":
        return np.where(x > 0, x, alpha * x)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if kind == "tanh":
        return np.tanh(x)
    raise ValueError(kind)


def forward(layer, inputs, params):
    """Output of `layer` (float64) for float64 `inputs` (list) and `params` ({name: array})."""
    op, a = layer.op, layer.attrs
    x = np.asarray(inputs[0], np.float64)
    if op in ("relu", "sigmoid", "tanh", "leaky_relu"):
        return act(x, a["act"], a["alpha"])
    raise NotImplementedError(op)


def random_params(layer, rng):
    """Fresh random parameters (never zeros) with a scale that keeps activations O(1)."""
    out = {}
    for name, shape in layer.params:
        out[name] = rng.standard_normal(shape).astype(np.float32)
    return out

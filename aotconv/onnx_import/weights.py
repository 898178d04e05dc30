"""The imported tensors (`<layer>.<tensor>`, the frameworks' layouts) as aotconv's flat
parameter array in the documented order (docs/params.md), or as an .npz for --weights."""
import numpy as np

from .problems import OnnxError


def flat_params(net, tensors, file=None):
    """One float32 array: net.param_layout() order, every tensor present with its shape."""
    parts = []
    for lname, tname, shape, _ in net.param_layout():
        key = f"{lname}.{tname}"
        a = tensors.get(key)
        if a is None or tuple(a.shape) != tuple(shape):
            got = "missing" if a is None else f"shape {list(a.shape)}"
            raise OnnxError(f"imported tensor '{key}' is {got}; the layer needs "
                            f"{list(shape)}", file)
        parts.append(np.ascontiguousarray(a, np.float32).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def save_npz(path, tensors):
    """The tensors as an .npz that `aotconv build --weights` reads (params.from_npz)."""
    np.savez(path, **{k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()})

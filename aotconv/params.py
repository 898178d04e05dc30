"""The flat float32 parameter array: make it (seeded random, or from an .npz), split it, store it.

The layout is Network.param_layout() (docs/params.md): layers in file order, each layer's
tensors in the frameworks' order and shapes, packed with no gaps or alignment. On disk
(`<net>.params.bin`) it is exactly those floats, little-endian IEEE-754 binary32, no header:
the library's load_params and numpy.fromfile read it alike on any host.
"""
from pathlib import Path

import numpy as np

from .errors import SpecError
from .graph import count

DISK_DTYPE = np.dtype("<f4")


def _key(layer, tensor):
    return f"{layer}.{tensor}"


def _range(tensor, shape):
    """(low, high) of the uniform values of one tensor; chosen to keep activations O(1)."""
    if tensor == "weight":
        # He-style: variance 2/fan_in offsets the half a relu removes, so VGG's 16 layers
        # neither vanish nor blow up; uniform, so no weight is far out in a tail
        bound = float(np.sqrt(6.0 / count(shape[1:])))
        return -bound, bound
    if tensor in ("gamma", "var"):
        # gamma near 1 keeps the scale; var strictly positive so sqrt(var + eps) is sane
        return 0.75, 1.25
    # bias, beta, mean: small but never all zero, so a dropped bias fails verification
    return -0.1, 0.1


def random_params(net, seed=0):
    """Seeded random parameters for `net`, one flat float32 array in the documented order."""
    rng = np.random.default_rng(seed)
    flat = np.empty(net.param_count(), np.float32)
    for lname, tname, shape, off in net.param_layout():
        v = flat[off:off + count(shape)]
        # drawn in place, in float32: VGG's fc6 alone would need 800 MB as float64
        rng.random(out=v, dtype=np.float32)
        lo, hi = _range(tname, shape)
        v *= hi - lo
        v += lo
        v[v == 0] = 1e-3                 # never an exact zero: it hides indexing bugs
    return flat


def split(net, flat):
    """{layer: {tensor: view of `flat` in its shape}}, for every layer with parameters."""
    flat = np.asarray(flat)
    if flat.ndim != 1 or flat.size != net.param_count():
        raise ValueError(f"expected a flat array of {net.param_count()} parameters for "
                         f"'{net.name}', got shape {flat.shape}")
    out = {}
    for lname, tname, shape, off in net.param_layout():
        out.setdefault(lname, {})[tname] = flat[off:off + count(shape)].reshape(shape)
    return out


def to_npz(net, flat, path):
    """Write `flat` as an .npz with keys `<layer>.<tensor>` (what from_npz reads back)."""
    arrays = {_key(l, t): a for l, ts in split(net, flat).items() for t, a in ts.items()}
    np.savez(path, **arrays)


def from_npz(net, path):
    """The flat parameters of `net` from an .npz holding `<layer>.<tensor>` arrays.

    Every tensor the network needs must be present with exactly its shape and finite values;
    a key the network does not use is an error too, since it usually means a misnamed layer.
    """
    path = str(path)
    arrays = _read_npz(path)
    expected = {_key(l, t) for l, t, _, _ in net.param_layout()}
    extra = sorted(set(arrays) - expected)
    flat = np.empty(net.param_count(), np.float32)
    for lname, tname, shape, off in net.param_layout():
        key = _key(lname, tname)
        if key not in arrays:
            hint = f"; the file has keys this network does not use: {', '.join(extra)}" \
                if extra else ""
            raise SpecError(f"missing tensor '{key}' of shape {list(shape)}{hint}",
                            file=path, layer=lname, key=key)
        a = arrays[key]
        if tuple(a.shape) != tuple(shape):
            raise SpecError(f"'{key}' has shape {list(a.shape)}, expected {list(shape)} "
                            f"(layout: docs/params.md)", file=path, layer=lname, key=key)
        if a.dtype.kind not in "fiu":
            raise SpecError(f"'{key}' has dtype {a.dtype}, expected a float array",
                            file=path, layer=lname, key=key)
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise SpecError(f"'{key}' holds NaN or infinite values", file=path, layer=lname,
                            key=key)
        flat[off:off + a.size] = a.ravel()
    if extra:
        raise SpecError(f"keys this network does not use: {', '.join(extra)}; expected "
                        f"'<layer>.<tensor>' for the layers of '{net.name}'", file=path)
    return flat


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read as an .npz file: {e}", file=path) from None


def write_bin(path, flat):
    """Write the flat parameters as raw little-endian float32 (no header)."""
    flat = np.asarray(flat)
    if flat.ndim != 1:
        raise ValueError(f"expected a flat array, got shape {flat.shape}")
    Path(path).write_bytes(flat.astype(DISK_DTYPE).tobytes())


def read_bin(path, net):
    """Read a params.bin written by write_bin, checking it holds exactly net's parameter count."""
    path = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read the parameters file: {e}", file=path) from None
    want = net.param_count()
    if len(data) != want * DISK_DTYPE.itemsize:
        raise SpecError(f"holds {len(data)} bytes ({len(data) / 4:g} floats); network "
                        f"'{net.name}' needs {want} float32 = {want * 4} bytes", file=path)
    return np.frombuffer(data, DISK_DTYPE).astype(np.float32)

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
    if any(l.op == "batchnorm" for l in net.layers):
        calibrate_batchnorms(net, flat, rng)
    return flat


CALIBRATION_IMAGES = 4


def calibrate_batchnorms(net, flat, rng, images=CALIBRATION_IMAGES):
    """Set each batchnorm's running mean and var in `flat` (in place) to the statistics of its
    input, per channel, on `images` unit-normal inputs drawn from `rng`: what training leaves
    there, so that random weights give a network whose activations keep their scale, as a
    trained network's do. Without it the residual adds of a deep network double the variance
    block after block (resnet50's logits reach thousands). Walks the layers in order in the
    float64 reference; a var below 1e-3 (a channel that hardly varies) is kept at 1e-3."""
    from .reference import forward
    prm = split(net, flat)
    values = {name: rng.standard_normal((images,) + tuple(shape[1:]))
              for name, shape in net.inputs}
    for layer in net.layers:
        ins = [values[i] for i in layer.inputs]
        if layer.op == "batchnorm":
            x = ins[0]
            axes = (0,) + tuple(range(2, x.ndim))
            prm[layer.name]["mean"][...] = x.mean(axis=axes)
            prm[layer.name]["var"][...] = np.maximum(x.var(axis=axes), 1e-3)
        values[layer.name] = forward(layer, ins, prm.get(layer.name, {}))


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

    Every tensor the network needs must be present with exactly its shape, a floating-point
    dtype and finite values (after the cast to float32); a key the network does not use is an
    error too, since it usually means a misnamed layer. Nothing in the file is unpickled.
    """
    path = str(path)
    layout = net.param_layout()
    with _open_npz(path) as z:
        names = list(z.files)
        expected = {_key(l, t) for l, t, _, _ in layout}
        extra = sorted(set(names) - expected)
        if not names:
            raise SpecError(f"holds no arrays; network '{net.name}' needs "
                            f"{_tensor_list(layout)} (layout: docs/params.md)", file=path)
        flat = np.empty(net.param_count(), np.float32)
        for lname, tname, shape, off in layout:
            key = _key(lname, tname)
            if key not in names:
                hint = f"; the file has keys this network does not use: {', '.join(extra)}" \
                    if extra else ""
                raise SpecError(f"missing tensor '{key}' of shape {list(shape)}{hint}",
                                file=path, layer=lname, key=key)
            a = _member(z, key, path, lname)
            if tuple(a.shape) != tuple(shape):
                raise SpecError(f"'{key}' has shape {list(a.shape)}, expected {list(shape)} "
                                f"(layout: docs/params.md)", file=path, layer=lname, key=key)
            if a.dtype.kind != "f":
                raise SpecError(f"'{key}' has dtype {a.dtype}, expected a floating-point array "
                                f"(float16, float32 or float64) of shape {list(shape)}",
                                file=path, layer=lname, key=key)
            if not np.all(np.isfinite(a)):
                raise SpecError(f"'{key}' holds NaN or infinite values", file=path, layer=lname,
                                key=key)
            with np.errstate(over="ignore"):
                a = a.astype(np.float32)
            if not np.all(np.isfinite(a)):
                raise SpecError(f"'{key}' holds values too large for float32 (|x| > 3.4e38)",
                                file=path, layer=lname, key=key)
            flat[off:off + a.size] = a.ravel()
    if extra:
        raise SpecError(f"keys this network does not use: {', '.join(extra)}; expected "
                        f"'<layer>.<tensor>' for the layers of '{net.name}'", file=path)
    return flat


def _tensor_list(layout, most=6):
    items = [f"{_key(l, t)} {list(s)}" for l, t, s, _ in layout]
    more = f", ... ({len(items)} tensors)" if len(items) > most else ""
    return ", ".join(items[:most]) + more if items else "no parameters"


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")     # a zip with members; an empty zip


def _open_npz(path):
    """np.load of an .npz archive, never unpickling; anything else is a located error."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise SpecError(f"cannot read the weights file: {e.strerror or e}", file=path) from None
    if head.startswith(_NPY_MAGIC):
        raise SpecError("is a single .npy array; --weights needs an .npz archive with one array "
                        "per tensor, keys '<layer>.<tensor>' (numpy.savez(path, **arrays); "
                        "docs/params.md)", file=path)
    if not head.startswith(_ZIP_MAGICS):
        raise SpecError("is not an .npz archive (not a zip file); --weights needs an .npz "
                        "with one array per tensor, keys '<layer>.<tensor>' (docs/params.md)",
                        file=path)
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:       # zipfile.BadZipFile, OSError, ValueError, EOFError, ...
        raise SpecError(f"cannot read as an .npz archive: {e}", file=path) from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise SpecError("is not an .npz archive", file=path)
    return z


def _member(z, key, path, layer):
    try:
        a = z[key]
    except ValueError as e:
        why = ("holds Python objects (pickled data), which aotconv never loads; save plain "
               "float arrays" if "allow_pickle" in str(e) else f"cannot be read: {e}")
        raise SpecError(f"'{key}' {why}", file=path, layer=layer, key=key) from None
    except Exception as e:       # a damaged member of the zip
        raise SpecError(f"'{key}' cannot be read: {e}", file=path, layer=layer,
                        key=key) from None
    if not isinstance(a, np.ndarray):
        raise SpecError(f"'{key}' is not a .npy array inside the archive", file=path,
                        layer=layer, key=key)
    return a


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
        raise SpecError(f"cannot read the parameters file: {e.strerror or e}", file=path) from None
    check_bin_size(path, len(data), net.param_count(), net.name)
    return np.frombuffer(data, DISK_DTYPE).astype(np.float32)


def check_bin_size(path, size, want, name):
    """A params.bin of `size` bytes must hold exactly `want` float32 (no header, no padding)."""
    if size == want * DISK_DTYPE.itemsize:
        return
    got = f"{size // 4} floats" + (f" and {size % 4} stray bytes" if size % 4 else "")
    what = "truncated: " if size < want * 4 else "too long: "
    raise SpecError(f"{what}holds {size} bytes ({got}); network '{name}' needs {want} float32 "
                    f"= {want * 4} bytes (raw little-endian, docs/params.md); rebuild it with "
                    f"`aotconv build` or write it with aotconv.params.write_bin", file=path)

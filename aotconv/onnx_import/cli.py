"""`aotconv import model.onnx -o model.yaml --weights-out model.npz`: see, edit and rebuild an
ONNX model as a net.yaml (registered by aotconv.cli like the other sub-command modules)."""
import os
from pathlib import Path
import tempfile

from ..errors import AotconvError


def add_commands(sub):
    p = sub.add_parser("import", help="convert an ONNX model into a net.yaml and an .npz of "
                                      "its weights (docs/onnx.md)")
    p.add_argument("model", help="the .onnx file (external data is read from beside it)")
    p.add_argument("-o", "--output", help="the net.yaml to write (default: <model>.yaml in "
                                          "the current directory)")
    p.add_argument("--weights-out", help="the .npz of weights to write (default: the "
                                         "net.yaml's path with .npz)")
    add_shape_args(p)
    p.add_argument("--name", help="the network's name (default: from the file name)")
    p.add_argument("--force", action="store_true", help="replace output files that exist")
    p.set_defaults(func=cmd_import)


def add_shape_args(p):
    p.add_argument("--input-shape", action="append", metavar="NAME=NxCxHxW",
                   help="static shape of an ONNX model's input where it has symbolic dims")
    if not any("--batch" in a.option_strings for a in p._actions):
        p.add_argument("--batch", type=int, help="the batch size (dim 0 of the input)")


def cmd_import(a):
    from . import import_model, is_onnx, parse_input_shapes
    from .netyaml import dump
    from .weights import save_npz
    if not is_onnx(a.model):
        raise AotconvError(f"{a.model}: `aotconv import` reads .onnx models; a net.yaml is "
                           f"built directly with `aotconv build`")
    if a.batch is not None and a.batch < 1:
        raise AotconvError(f"--batch {a.batch}: the batch size must be a positive integer")
    out = Path(a.output or Path(Path(a.model).stem + ".yaml"))
    npz = Path(a.weights_out or out.with_suffix(".npz"))
    for p in (out, npz):
        if p.exists() and p.resolve() == Path(a.model).resolve():
            raise AotconvError(f"{p}: that is the model itself; choose another output path")
    if out.resolve() == npz.resolve():
        raise AotconvError(f"{out}: the net.yaml and the weights need two different files")
    for p in (out, npz):
        if p.exists() and not a.force:
            raise AotconvError(f"{p} exists; pass --force to replace it, or choose another "
                               f"path with {'-o' if p == out else '--weights-out'}")
    im = import_model(a.model, input_shapes=parse_input_shapes(a.input_shape), batch=a.batch,
                      name=a.name)
    _write(npz, lambda f: save_npz(f, im.tensors))
    _write(out, lambda f: f.write(dump(im).encode("utf-8")))
    n_nodes = sum(len(v) for v in im.origins.values())
    print(f"{out}: {len(im.network.layers)} layers from {n_nodes} ONNX nodes; {npz}: "
          f"{len(im.tensors)} tensors, {im.params.size} parameters")
    print(f"build it with: aotconv build {out} --weights {npz}")
    return 0


def _write(path, fill):
    """Write `path` whole or not at all: into a temporary file beside it, then renamed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        raise AotconvError(f"{path}: cannot write it: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise AotconvError(f"{path}: cannot write it: {e.strerror or e}") from None
    except BaseException:
        os.unlink(tmp)
        raise

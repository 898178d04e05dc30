"""Read an ONNX model for import: the optional onnx package, the file (external data read
from beside it), the checker, one opset floor (the version converter), local functions
inlined, and the graph inputs (initializers aside) with static shapes (from the model,
--input-shape, --batch).
"""
from pathlib import Path
import re

from .problems import OnnxError

# Models older than this are converted up to it with onnx.version_converter, so the mapping
# reads one form of each op: Softmax over one axis (13), Pad/Squeeze/Unsqueeze/ReduceSum
# operands as inputs (11/13), Dropout's ratio as an input (12), Gemm's C optional (11).
MIN_OPSET = 13
INSTALL_HINT = "pip install 'aotconv[onnx]' (or pip install onnx)"


def require_onnx(file=None):
    try:
        import onnx
    except ImportError:
        raise OnnxError(f"reading .onnx models needs the onnx package: {INSTALL_HINT}",
                        file) from None
    return onnx


def one_line(e):
    lines = [s.strip() for s in str(e).strip().splitlines() if s.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def parse_input_shapes(specs):
    """{input name: shape} from `name=1x3x224x224` strings, one per input (a bare
    `1x3x224x224` names the model's only input: key None)."""
    out = {}
    for s in specs or ():
        name, _, dims = s.rpartition("=")
        if not re.fullmatch(r"[0-9]+(x[0-9]+)*", dims) or any(int(d) < 1 for d in dims.split("x")):
            raise OnnxError(f"--input-shape {s!r}: expected NAME=DIMS with positive sizes "
                            f"joined by 'x', e.g. input=1x3x224x224")
        key = name or None
        if key in out:
            raise OnnxError(f"--input-shape gives input {name or '(the only input)'!r} twice")
        out[key] = tuple(int(d) for d in dims.split("x"))
    return out


def read(path):
    """The checked ModelProto at `path`, its weights (external data included) loaded."""
    onnx = require_onnx(path)
    file = str(path)
    if not Path(path).is_file():
        raise OnnxError("no such file", file)
    try:
        model = onnx.load(file)
    except Exception as e:               # protobuf, missing external data, permissions ...
        raise OnnxError(f"cannot read as an ONNX model: {one_line(e)}", file) from None
    try:
        if model.ByteSize() < 2**31 - 1:
            onnx.checker.check_model(model)
        else:
            onnx.checker.check_model(file)
    except Exception as e:
        raise OnnxError(f"the ONNX checker rejects the model: {one_line(e)}; fix the exporter "
                        f"or the model", file) from None
    return model


def default_opset(model):
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return None


def normalise(model, file):
    """The model at opset >= MIN_OPSET with its local functions inlined."""
    onnx = require_onnx(file)
    opset = default_opset(model)
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        raise OnnxError("the model imports no version of the default ONNX domain; aotconv "
                        "imports models of standard ONNX ops", file)
    if opset > newest:
        raise OnnxError(f"the model uses opset {opset}, newer than the installed onnx knows "
                        f"({newest}); upgrade onnx (pip install -U onnx)", file)
    if model.functions:
        from onnx import inliner
        model = inliner.inline_local_functions(model)
    if opset < MIN_OPSET:
        from onnx import version_converter
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as e:
            raise OnnxError(f"onnx.version_converter cannot bring opset {opset} to "
                            f"{MIN_OPSET}: {one_line(e)}; re-export the model with opset "
                            f">= {MIN_OPSET}", file) from None
    return model


def legacy_resizes(model):
    """['Upsample' or 'Resize-10', ...]: the nodes, in graph order, that the version converter
    turns into a Resize of other semantics. Upsample (opset 7-9) and Resize-10 sample at
    x / scale (asymmetric) and, upsampling, copy pixel floor(x / scale); the converter writes a
    Resize with ONNX 13's defaults (half_pixel, round_prefer_floor), and may rename its output.
    A model below opset 11 has no other Resize, so every Resize it converts to is one of
    these, in the same order. Read before `normalise`."""
    opset = default_opset(model)
    if opset is None or opset >= 11:
        return []
    return ["Upsample" if n.op_type == "Upsample" else "Resize-10" for n in model.graph.node
            if n.domain in ("", "ai.onnx") and n.op_type in ("Upsample", "Resize")]


def restore_legacy_resizes(model, legacy):
    """Give every Resize of a model converted from below opset 11 (`legacy`, from
    legacy_resizes, not empty) the coordinate transformation and rounding of the node it was:
    asymmetric, floor."""
    from onnx import helper
    if not legacy:
        return model
    for n in model.graph.node:
        if n.op_type == "Resize" and n.domain in ("", "ai.onnx"):
            keep = [a for a in n.attribute
                    if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
            del n.attribute[:]
            n.attribute.extend(keep + [
                helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                helper.make_attribute("nearest_mode", "floor")])
    return model


def set_input_shapes(model, file, input_shapes=None, batch=None):
    """[(name, shape)] of the model's graph inputs (initializers are no inputs), in its order,
    each shape made static in `model` from its own dims, `input_shapes` ({name or None:
    shape}; None, a bare --input-shape, for a model of one input) and `batch` (dim 0 of every
    input). Several inputs share one batch: a model whose inputs' dims 0 differ is refused."""
    g = model.graph
    init = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in init]
    names = ", ".join(repr(i.name) for i in inputs)
    if not inputs:
        raise OnnxError("the model has no inputs (every graph input is an initializer); "
                        "aotconv networks compute on at least one input tensor", file)
    given = dict(input_shapes or {})
    if None in given:
        if len(inputs) > 1:
            raise OnnxError(f"--input-shape {'x'.join(map(str, given[None]))} names no input; "
                            f"the model has {len(inputs)} ({names}): give each as "
                            f"--input-shape NAME=DIMS", file)
        given[inputs[0].name] = given.pop(None)
    for name in given:
        if name not in {i.name for i in inputs}:
            raise OnnxError(f"--input-shape names {name!r}, but the model's input"
                            f"{'s are' if len(inputs) > 1 else ' is'} {names}", file)
    out = [(x.name, _static_shape(x, file, given, batch)) for x in inputs]
    first = out[0]
    for name, shape in out[1:]:
        if shape[0] != first[1][0]:
            raise OnnxError(f"input {name!r} has batch {shape[0]} (dim 0), input "
                            f"{first[0]!r} {first[1][0]}: aotconv's inputs share one batch; "
                            f"give them the same dim 0 (--input-shape or --batch N)", file)
    return out


def _static_shape(x, file, given, batch):
    """The static shape of graph input `x`, written into the model."""
    from onnx import TensorProto
    tt = x.type.tensor_type
    if not x.type.HasField("tensor_type") or tt.elem_type != TensorProto.FLOAT:
        what = TensorProto.DataType.Name(tt.elem_type) if x.type.HasField("tensor_type") \
            else "not a tensor"
        raise OnnxError(f"input {x.name!r} is {what}; aotconv networks take a float32 "
                        f"tensor", file)
    if not tt.HasField("shape"):
        dims = None
    else:
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else
                (d.dim_param or "?") for d in tt.shape.dim]
    if x.name in given:
        shape = list(given[x.name])
        if dims is not None and len(dims) != len(shape):
            raise OnnxError(f"--input-shape {x.name}={'x'.join(map(str, shape))} has "
                            f"{len(shape)} dims; input {x.name!r} has {len(dims)} "
                            f"({_dims_text(dims)})", file)
        for i, (d, s) in enumerate(zip(dims or shape, shape)):
            if isinstance(d, int) and d != s and not (i == 0 and batch is not None):
                raise OnnxError(f"--input-shape {x.name}={'x'.join(map(str, shape))}: dim {i} "
                                f"of {x.name!r} is fixed at {d} by the model", file)
    elif dims is None:
        raise OnnxError(f"input {x.name!r} has no shape in the model; give it with "
                        f"--input-shape {x.name}=NxCxHxW", file)
    else:
        shape = list(dims)
    if batch is not None and shape:
        shape[0] = batch
    symbolic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    if symbolic:
        example = "x".join(str(d) if isinstance(d, int) else "1" for d in shape)
        only_batch = symbolic == [0]
        raise OnnxError(f"input {x.name!r} has symbolic dimensions ({_dims_text(shape)}); "
                        f"aotconv compiles for static shapes: give them with --input-shape "
                        f"{x.name}={example}" + (" or --batch N" if only_batch else ""), file)
    if not 2 <= len(shape) <= 4:
        raise OnnxError(f"input {x.name!r} has rank {len(shape)} ({_dims_text(shape)}); aotconv "
                        f"networks take [N, C, H, W], [N, C, L] or [N, F]", file)
    del tt.shape.dim[:]
    for d in shape:
        tt.shape.dim.add().dim_value = d
    return tuple(shape)


def _dims_text(dims):
    return "[" + ", ".join(map(str, dims)) + "]"

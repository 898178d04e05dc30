"""ONNX models in: `aotconv build model.onnx` and `aotconv import model.onnx` (docs/onnx.md).

load (read, check, opset, static input) -> fold (shape inference, constant folding) ->
simplify (exact rewrites into aotconv's ops) -> mapping (node -> net.yaml layer, or a
reported problem) -> importer (the validated Network, its tensors and flat parameters).
Needs the optional onnx package (`pip install 'aotconv[onnx]'`), imported only when used.
"""
from pathlib import Path

from .problems import OnnxError, UnsupportedError


def is_onnx(source):
    """True when `source` names an ONNX model (by its .onnx suffix)."""
    return Path(str(source)).suffix.lower() == ".onnx"


def import_model(path, input_shapes=None, batch=None, name=None):
    """The Imported model at `path` (see importer.import_model). `input_shapes` is
    {input name: shape} or the command line's ['name=1x3x224x224', ...]."""
    from .importer import import_model as _import
    if isinstance(input_shapes, (list, tuple)):
        input_shapes = parse_input_shapes(input_shapes)
    return _import(path, input_shapes=input_shapes, batch=batch, name=name)


def parse_input_shapes(specs):
    from .load import parse_input_shapes as _parse
    return _parse(specs)


__all__ = ["is_onnx", "import_model", "parse_input_shapes", "OnnxError", "UnsupportedError"]

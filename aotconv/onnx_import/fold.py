"""Shape inference and constant folding, alternated until nothing changes.

onnx's own shape inference (strict, with data propagation) gives every run-time tensor its
static shape; then every node whose inputs are all constants is evaluated once with onnx's
reference evaluator, and Shape/Size of a tensor with a static shape become constants. The
shape sub-graphs exporters emit (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and
generated weights (ConstantOfShape, Transpose of an initializer, CastLike of a constant to the
input's type ...) so disappear; what is left computes on the input.
"""
import numpy as np

from . import ir
from .load import one_line
from .problems import OnnxError

# never evaluated at import time: their output is random (Dropout only in training, but it
# is removed, or rejected, by simplify)
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli", "Dropout"}
# constants larger than this go to shape inference as typed inputs, not copied as data
INLINE_CONST_LIMIT = 4096
MAX_ROUNDS = 8


def run(graph, meta):
    """Infer shapes and fold constants in `graph` (in place) until a fixed point."""
    for _ in range(MAX_ROUNDS):
        infer_shapes(graph, meta)
        if not fold_once(graph, meta):
            return graph
    return graph


def infer_shapes(graph, meta):
    """graph.shapes/dtypes from onnx.shape_inference on the graph's current nodes."""
    import onnx
    big = {t for t, a in graph.consts.items() if np.asarray(a).size > INLINE_CONST_LIMIT}
    model = ir.to_model(graph, meta.ir_version, meta.opset_imports, consts_as_inputs=big)
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                  data_prop=True)
    except Exception as e:
        raise OnnxError(f"onnx shape inference fails: {one_line(e)}", graph.file) from None
    g = model.graph
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        if vi.name in graph.consts or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        graph.dtypes[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None for d in dims):
                graph.shapes[vi.name] = tuple(dims)


def fold_once(graph, meta):
    """Replace every foldable node by constants; True if any was."""
    changed = False
    keep = []
    for n in graph.nodes:
        values = _fold(n, graph, meta)
        if values is None:
            keep.append(n)
            continue
        for t, v in zip(n.outputs, values):
            if t:
                graph.consts[t] = v
                graph.shapes.pop(t, None)
        changed = True
    graph.nodes = keep
    return changed


def _fold(n, graph, meta):
    if n.domain not in ir.DEFAULT_DOMAINS or n.op in NOT_FOLDED or ir.has_subgraph(n):
        return None
    x = n.input(0)
    if n.op in ("Shape", "Size") and x in graph.shapes and x not in graph.consts:
        dims = graph.shapes[x]
        if n.op == "Size":
            return [np.array(int(np.prod(dims, dtype=np.int64)), np.int64)]
        start, end = n.attr("start", 0), n.attr("end", None)
        return [np.array(dims[start:end] if end is not None else dims[start:], np.int64)]
    like = n.input(1)
    if n.op == "CastLike" and x in graph.consts and like and like not in graph.consts \
            and graph.dtypes.get(like):
        # CastLike reads only the element type of its second input (the exporters cast
        # constants to the input's type this way): evaluated with an empty tensor of that type
        from onnx import helper
        dtype = helper.tensor_dtype_to_np_dtype(graph.dtypes[like])
        return _evaluate(n, graph, meta, {like: np.zeros(0, dtype)})
    ins = [t for t in n.inputs if t]
    if not all(t in graph.consts for t in ins):
        return None
    return _evaluate(n, graph, meta)


def _evaluate(n, graph, meta, stand_ins=None):
    """Outputs of `n` on its constant inputs (onnx.reference), or None if it cannot run;
    `stand_ins` {tensor: array} gives inputs of which only the type matters."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    values = dict(graph.consts, **(stand_ins or {}))
    names = [t for t in n.inputs if t]
    inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(
        np.asarray(values[t]).dtype), np.asarray(values[t]).shape)
        for t in dict.fromkeys(names)]
    outputs = [helper.make_empty_tensor_value_info(t) for t in n.outputs if t]
    g = helper.make_graph([ir.node_proto(n)], "fold", inputs, outputs)
    model = helper.make_model(g, ir_version=meta.ir_version, opset_imports=meta.opset_imports)
    try:
        got = ReferenceEvaluator(model).run(None, {t: values[t] for t in names})
    except Exception:
        return None                       # left in the graph: mapping reports the node
    it = iter(got)
    return [np.asarray(next(it)) if t else None for t in n.outputs]

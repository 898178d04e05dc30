"""The importer's working graph: ONNX nodes with decoded attributes, constant tensors and the
static shape of every other tensor. The simplify passes rewrite it; mapping reads it.

Every tensor is named as in the model. A tensor is either a constant (`consts`, numpy) or a
value computed at run time from the graph inputs (`shapes` gives its static shape).
"""
from dataclasses import dataclass, field

import numpy as np

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class Node:
    name: str                  # the ONNX node's name, or '<op>_<index>' when it has none
    op: str
    inputs: list               # tensor names; '' where an optional input is left out
    outputs: list
    attrs: dict                # name -> python value (ints, floats, str, lists, numpy arrays)
    opset: int                 # the model's opset of the node's domain
    domain: str = ""
    merged: list = field(default_factory=list)   # names of ONNX nodes folded into this one
    # input index -> the tensor whose shape this node was written against, where a removed
    # reshape now feeds it another tensor with the same 4-D view: axis attributes count
    # in the rank the node saw
    seen: dict = field(default_factory=dict)
    # True for the nodes simplify writes for a pattern of several ONNX nodes (ChannelShuffle,
    # ChannelSlice, Silu): they map through mapping.INTERNAL, never as an op of the model
    internal: bool = False
    label: str = None          # the name its layer takes, where not the node's own (a piece
                               # of a Split: '<split>:<output index>')
    # the op as the model wrote it where the version converter rewrote it into one with other
    # semantics: 'Upsample' or 'Resize-10' for a Resize converted from them (load.py)
    legacy: str = None

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def input(self, i):
        """The i-th input's tensor name, or None where it is absent or left out."""
        return self.inputs[i] if i < len(self.inputs) and self.inputs[i] else None


@dataclass
class Graph:
    nodes: list                # topological order
    consts: dict               # tensor -> numpy array
    shapes: dict               # tensor -> static shape (tuple) of run-time values
    dtypes: dict               # tensor -> ONNX element type of run-time values
    input: object              # the graph input's name, or a tuple of the names of several
    outputs: list              # [(ONNX output name, tensor it now resolves to)]
    opset: int                 # of the default domain
    file: str = None

    @property
    def inputs(self):
        """The names of the graph inputs (initializers aside), in the model's order."""
        return (self.input,) if isinstance(self.input, str) else tuple(self.input)

    def producers(self):
        return {t: n for n in self.nodes for t in n.outputs if t}

    def consumers(self):
        out = {}
        for n in self.nodes:
            for t in n.inputs:
                if t:
                    out.setdefault(t, []).append(n)
        return out

    def is_const(self, t):
        return t in self.consts

    def const(self, t):
        return self.consts.get(t) if t else None

    def output_tensors(self):
        return {t for _, t in self.outputs}

    def replace_uses(self, old, new):
        """Every reader of tensor `old` (nodes and graph outputs) reads `new` instead; each
        node keeps seeing `old`'s shape (Node.seen)."""
        for n in self.nodes:
            for i, t in enumerate(n.inputs):
                if t == old:
                    n.seen.setdefault(i, old)
                    n.inputs[i] = new
        self.outputs = [(name, new if t == old else t) for name, t in self.outputs]

    def view(self, n, i):
        """The static shape node `n` reads at input i, as the model wrote it; None if unknown."""
        t = n.seen.get(i, n.input(i))
        return self.shapes.get(t) if t else None


def attribute_values(proto_attrs):
    """{name: python value} of a NodeProto's attributes (strings decoded, tensors as numpy)."""
    from onnx import AttributeProto, helper, numpy_helper
    out = {}
    for a in proto_attrs:
        if a.type == AttributeProto.TENSOR:
            out[a.name] = numpy_helper.to_array(a.t)
        elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            out[a.name] = a                # kept as is: no pass looks inside a subgraph
        else:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode("utf-8", "replace") for s in v]
            out[a.name] = v
    return out


def has_subgraph(node):
    from onnx import AttributeProto
    return any(isinstance(v, AttributeProto) for v in node.attrs.values())


def from_model(model, input_name, file=None):
    """The Graph of an ONNX model whose shapes were inferred (load.infer_shapes); `input_name`
    is its input's name, or a tuple of the names of several."""
    from onnx import numpy_helper
    g = model.graph
    versions = {o.domain: o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    shapes, dtypes = {}, {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if all(d is not None for d in dims):
            shapes[vi.name] = tuple(dims)
        dtypes[vi.name] = tt.elem_type
    nodes = []
    for i, p in enumerate(g.node):
        dom = p.domain or ""
        nodes.append(Node(name=p.name or f"{p.op_type}_{i}", op=p.op_type, inputs=list(p.input),
                          outputs=list(p.output), attrs=attribute_values(p.attribute),
                          opset=versions.get(dom, opset if dom in DEFAULT_DOMAINS else 0),
                          domain=dom))
    outputs = [(o.name, o.name) for o in g.output]
    return Graph(nodes, consts, shapes, dtypes, input_name, outputs, opset, file)


def to_model(graph, ir_version, opset_imports, consts_as_inputs=()):
    """A ModelProto of the graph's current nodes (for shape inference and evaluation).

    Constants named in `consts_as_inputs` become typed graph inputs instead of initializers,
    so large weights need not be copied where only their shapes matter."""
    from onnx import TensorProto, helper, numpy_helper
    used = {t for n in graph.nodes for t in n.inputs if t} | graph.output_tensors()
    inits, inputs = [], []
    for x in graph.inputs:
        x_type = graph.dtypes.get(x, TensorProto.FLOAT)
        inputs.append(helper.make_tensor_value_info(x, x_type, graph.shapes[x]))
    for t in sorted(used & set(graph.consts)):
        a = graph.consts[t]
        if t in consts_as_inputs:
            inputs.append(helper.make_tensor_value_info(
                t, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        else:
            inits.append(numpy_helper.from_array(np.asarray(a), t))
    nodes = [node_proto(n) for n in graph.nodes]
    outs = [helper.make_empty_tensor_value_info(t) for t in dict.fromkeys(
        t for _, t in graph.outputs)]
    g = helper.make_graph(nodes, "g", inputs, outs, initializer=inits)
    return helper.make_model(g, ir_version=ir_version, opset_imports=opset_imports)


def node_proto(n):
    from onnx import AttributeProto, helper, numpy_helper
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
             for k, v in n.attrs.items() if not isinstance(v, AttributeProto)}
    p = helper.make_node(n.op, n.inputs, n.outputs, name=n.name, domain=n.domain or None,
                         **attrs)
    p.attribute.extend(v for v in n.attrs.values() if isinstance(v, AttributeProto))
    return p

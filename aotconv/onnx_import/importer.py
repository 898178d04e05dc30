"""The whole import: read -> opset -> static inputs -> fold constants -> simplify -> map every
node -> one validated aotconv Network, its tensors and flat parameters.

The graph inputs (initializers aside) become the network's inputs, in the model's order: one
is the net.yaml's `input`, several its `inputs`, named after the ONNX inputs.

Every node that cannot be mapped exactly is collected and reported in one error. The Network
is built by spec.network_from_dict, the validator every net.yaml goes through, and each
layer's shape is then checked against ONNX's own shape inference.
"""
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from . import fold, ir, load, mapping, simplify
from .names import Namer, key, net_name, readable
from .problems import OnnxError, Problem, Problems, UnsupportedError
from .shapes import embed
from .weights import flat_params


@dataclass
class Meta:
    ir_version: int
    opset_imports: list


@dataclass
class Imported:
    path: str
    description: dict          # the net.yaml, as network_from_dict takes it
    network: object            # the validated aotconv.graph.Network
    tensors: dict              # '<layer>.<tensor>' -> float32 array
    params: object             # the flat float32 parameters, documented order
    origins: dict              # layer name -> [ONNX node names it stands for]
    input_name: str            # the (first) ONNX input's name
    input_shape: tuple         # and its static shape
    outputs: list              # [(ONNX output name, its ONNX shape, index in network.outputs)]
    opset: int                 # the opset mapped from
    source_opset: int          # the model's own
    inputs: list = None        # [(ONNX input name, its static ONNX shape)], network input order

    def __post_init__(self):
        if self.inputs is None:
            self.inputs = [(self.input_name, tuple(self.input_shape))]

    def reference(self):
        """onnxruntime running the original model, or None where it is not installed or
        cannot load the model (then --check compares with the numpy reference, and says so)."""
        import sys
        from .reference import onnxruntime_reference
        try:
            return onnxruntime_reference(self)
        except OnnxError as e:
            print(f"aotconv: {e}; checking against the numpy reference instead",
                  file=sys.stderr)
            return None


def import_model(path, input_shapes=None, batch=None, name=None):
    """Import the ONNX model at `path`; `input_shapes` {input name or None: shape} and `batch`
    give the input's static shape where the model leaves dims symbolic."""
    file = str(path)
    model = load.read(path)
    source_opset = load.default_opset(model)
    legacy = load.legacy_resizes(model)
    model = load.restore_legacy_resizes(load.normalise(model, file), legacy)
    inputs = load.set_input_shapes(model, file, input_shapes, batch)
    meta = Meta(max(model.ir_version, 7), list(model.opset_import))
    names = tuple(x for x, _ in inputs)
    g = ir.from_model(model, names[0] if len(names) == 1 else names, file)
    resizes = [n for n in g.nodes if n.op == "Resize"]
    for i, n in enumerate(resizes if legacy else ()):
        n.legacy = legacy[i] if len(legacy) == len(resizes) else \
            ("Upsample" if source_opset < 10 else "Resize-10")
    for x, shape in inputs:
        g.shapes[x], g.dtypes[x] = shape, 1
    fold.run(g, meta)
    simplify.run(g)
    return _assemble(g, file, name or net_name(Path(file).stem), inputs, source_opset)


def _input_names(g, namer, file):
    """{ONNX input: network input name}: `input` for a model of one, else each input's own
    name made valid (names.readable) and unique; `namer` keeps layers off them. An input no
    node reads is refused: the library would take data it never uses."""
    read = {t for n in g.nodes for t in n.inputs} | g.output_tensors()
    for x in g.inputs:
        if x not in read:
            raise OnnxError(f"input {x!r} is read by no node; aotconv networks read every "
                            f"input they take: remove it from the model", file)
    if len(g.inputs) == 1:
        return {g.inputs[0]: "input"}
    out, used = {}, set()
    for x in g.inputs:
        base = name = readable(x, "input")
        i = 1
        while key(name) in used:
            i += 1
            name = base[:120] + f"_{i}"
        used.add(key(name))
        namer.taken.add(key(name))
        out[x] = name
    return out


def _assemble(g, file, net, inputs, source_opset):
    problems = Problems()
    namer = Namer()
    layer_of = _input_names(g, namer, file)
    layers, tensors, origins, onnx_shapes, nodes = [], {}, {}, {}, {}
    for n in g.nodes:
        m, bad = mapping.map_node(n, g)
        for attr, msg in bad:
            problems.add(n, attr, msg)
        if m is None or any(t not in layer_of for t in m.inputs):
            continue                      # this node, or one it reads, is reported
        lname = namer(n.label or n.name, n.op)
        d = {"name": lname, **m.layer, "inputs": [layer_of[t] for t in m.inputs]}
        layers.append(d)
        for k, a in m.tensors.items():
            tensors[f"{lname}.{k}"] = a
        origins[lname] = [n.name] + list(n.merged)
        onnx_shapes[lname] = m.shape if m.after else g.shapes[n.outputs[0]]
        nodes[lname] = n
        for suffix, keys in m.after:          # layers that finish the node, one after another
            prev, lname = lname, namer(f"{n.name}:{suffix}", n.op)
            layers.append({"name": lname, **keys, "inputs": [prev]})
            origins[lname] = [n.name]
            onnx_shapes[lname] = g.shapes[n.outputs[0]]
            nodes[lname] = n
        layer_of[n.outputs[0]] = lname
    note = (f" (read at opset {g.opset}, converted from {source_opset})"
            if source_opset != g.opset else "")
    if problems:
        raise UnsupportedError(problems.items, file + note)
    out_layers, outputs = [], []
    for oname, t in g.outputs:
        if t in g.consts:
            raise OnnxError(f"output {oname!r} is a constant; aotconv builds networks whose "
                            f"outputs are computed from the input", file)
        if t not in layer_of or t in g.inputs:
            what = "the input" if len(g.inputs) == 1 else f"the input {t!r}"
            raise OnnxError(f"output {oname!r} is {what} itself; there is nothing to "
                            f"build", file)
        lname = layer_of[t]
        if lname not in out_layers:
            out_layers.append(lname)
        outputs.append((oname, g.shapes.get(oname, g.shapes[t]), out_layers.index(lname)))
    if len(inputs) == 1:
        description = {"name": net, "input": list(embed(inputs[0][1])), "layers": layers}
    else:
        description = {"name": net, "inputs": {layer_of[x]: list(embed(s)) for x, s in inputs},
                       "layers": layers}
    if out_layers != [layers[-1]["name"]]:
        description["outputs"] = out_layers
    network = _validate(description, file, nodes)
    for l in network.layers:
        want = embed(onnx_shapes[l.name])
        if tuple(l.out_shape) != want:
            n = nodes[l.name]
            raise UnsupportedError([Problem(n.name, n.op, n.opset, None,
                                            f"aotconv computes shape {list(l.out_shape)} where "
                                            f"ONNX gives {list(onnx_shapes[l.name])}")], file)
    return Imported(file, description, network, tensors, flat_params(network, tensors, file),
                    origins, inputs[0][0], tuple(inputs[0][1]), outputs, g.opset, source_opset,
                    [(x, tuple(s)) for x, s in inputs])


def _validate(description, file, nodes):
    from ..spec import network_from_dict
    try:
        return network_from_dict(description, file=file)
    except SpecError as e:
        n = nodes.get(e.layer)
        if n is None:
            raise OnnxError(f"the imported network is invalid: {e.message}", file) from None
        raise UnsupportedError([Problem(n.name, n.op, n.opset, e.key, e.message)],
                               file) from None

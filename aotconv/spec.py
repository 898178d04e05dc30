"""Read a net.yaml into a validated graph.Network: every error located by file, line, layer, key.

The YAML is composed (parsed to nodes, never constructed or evaluated) with PyYAML's safe
loader, so every key keeps its line and duplicate keys can be caught, which yaml.safe_load
silently merges. The nodes become `_Map`s (key -> (value, line)); a Python dict given to
`network_from_dict` becomes the same structure, so both sources share one validator.

Steps: top-level keys -> each layer's keys, types and normalised attributes (ops.SCHEMA,
ops.normalise) -> input names and arity -> stable topological sort (file order where the
graph allows) -> shape inference (ops.infer) in that order.
"""
import heapq
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import ops
from .errors import SpecError
from .graph import Layer, Network, c_ident

NETS_DIR = Path(__file__).parent / "nets"
TOP_KEYS = ("name", "input", "layers", "outputs")
LAYER_KEYS = ("name", "op", "inputs")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---------------------------------------------------------------------------------------------
# sources


def shipped_networks():
    """Names of the networks shipped in aotconv/nets (usable wherever a path is)."""
    return sorted(p.stem for p in NETS_DIR.glob("*.yaml"))


def resolve(source):
    """Path of `source`: an existing file, else a shipped network's name."""
    p = Path(source)
    if p.is_file():
        return p
    if p.suffix not in (".yaml", ".yml") and os.sep not in str(source):
        shipped = NETS_DIR / f"{source}.yaml"
        if shipped.is_file():
            return shipped
    raise SpecError(f"no such file, nor a shipped network; shipped networks are: "
                    f"{', '.join(shipped_networks())}", file=str(source))


def load_network(source, batch=None):
    """The validated Network described by a net.yaml path or a shipped network's name.

    `batch`, when given, replaces the batch size input[0] (the `--batch N` option).
    """
    path = resolve(source)
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read the file: {e}", file=file) from None
    return _build(_parse(text, file), file, batch)


def network_from_dict(d, file="<dict>", batch=None):
    """The validated Network of an already-parsed description (tests, other front ends).

    A dict has no lines, so errors give a layer's 1-based position in `layers` as its line.
    """
    if not isinstance(d, dict):
        raise SpecError("the description must be a mapping with name, input, layers", file=file)
    items = {}
    for k, v in d.items():
        if k == "layers" and isinstance(v, list):
            v = [_Map(i + 1, {lk: (lv, i + 1) for lk, lv in l.items()}) if isinstance(l, dict)
                 else l for i, l in enumerate(v)]
        items[k] = (v, None)
    return _build(_Map(None, items), file, batch)


# ---------------------------------------------------------------------------------------------
# YAML nodes -> located values


@dataclass
class _Map:
    """A mapping that remembers where it starts and where each of its keys is."""
    line: int
    items: dict             # key -> (value, line of the key)

    def line_of(self, key):
        return self.items[key][1] if key in self.items else self.line


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-4 as a float (YAML 1.2 does; PyYAML's 1.1 wants 1.0e-4)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _parse(text, file):
    """Compose `text` into a _Map tree; YAML syntax errors become SpecErrors at their line."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError("the file is empty; it needs name, input and layers", file=file,
                            line=1)
        return _value(root, loader, file, {})
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = ": ".join(s for s in (e.context, e.problem) if s)
        raise SpecError(f"invalid YAML: {what}; fix the syntax", file=file,
                        line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise SpecError(f"invalid YAML: {e}", file=file) from None
    finally:
        loader.dispose()


def _value(node, loader, file, memo):
    """Plain values for scalars, lists for sequences, _Maps for mappings.

    `memo` converts an aliased node once, so `*anchor` costs nothing and cannot explode.
    """
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.MappingNode):
        m = memo[id(node)] = _Map(node.start_mark.line + 1, {})
        for knode, vnode in node.value:
            line = knode.start_mark.line + 1
            if not isinstance(knode, yaml.ScalarNode):
                raise SpecError("a key must be a plain name", file=file, line=line)
            key = loader.construct_object(knode)
            if key in m.items:
                raise SpecError(f"duplicate key '{key}' (first given on line {m.items[key][1]}); "
                                f"remove one of them", file=file, line=line,
                                layer=_name_in(m.items), key=str(key))
            m.items[key] = (_value(vnode, loader, file, memo), line)
        return m
    if isinstance(node, yaml.SequenceNode):
        out = memo[id(node)] = []
        out.extend(_value(n, loader, file, memo) for n in node.value)
        return out
    return loader.construct_object(node)


def _name_in(items):
    name = items.get("name", (None,))[0]
    return name if isinstance(name, str) else None


# ---------------------------------------------------------------------------------------------
# validation


def _type_name(types):
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             list: "a list [h, w]"}
    if float in types:
        types = tuple(t for t in types if t is not int)
    if types == (int, list, str):
        return "an integer, a list [h, w] or 'same'"
    parts = [names[t] for t in types]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def _has_type(v, types):
    # YAML's true is a Python int; a flag is never a size and a size never a flag
    if isinstance(v, bool):
        return bool in types
    return isinstance(v, tuple(types))


def _describe(v):
    return "a mapping" if isinstance(v, _Map) else repr(v)


class _Where:
    """Raises SpecErrors for one file (and optionally one layer), located at a key's line."""

    def __init__(self, file, m, layer=None):
        self.file, self.m, self.layer = file, m, layer

    def error(self, key, message, line=None):
        if line is None:
            line = self.m.line_of(key) if key is not None else self.m.line
        return SpecError(message, file=self.file, line=line, layer=self.layer, key=key)


def _build(top, file, batch):
    where = _Where(file, top)
    if not isinstance(top, _Map):
        raise where.error(None, "the file must be a mapping with name, input and layers", line=1)
    for key in top.items:
        if key not in TOP_KEYS:
            raise where.error(str(key), f"unknown top-level key; valid keys are "
                                        f"{', '.join(TOP_KEYS)}")
    for key in ("name", "input", "layers"):
        if key not in top.items:
            raise where.error(key, f"missing required top-level key '{key}'")
    name = _net_name(top, where)
    input_shape = _input_shape(top, where, batch)
    raw_layers = _layer_list(top, where)
    specs = [_layer_spec(m, file) for m in raw_layers]
    _check_names(specs)
    _link_inputs(specs)
    order = _toposort(specs)
    layers = _infer_shapes(order, input_shape)
    outputs = _outputs(top, where, specs)
    return Network(name=name, input_shape=input_shape, layers=layers, outputs=outputs, file=file)


def _net_name(top, where):
    name = top.items["name"][0]
    if not (isinstance(name, str) and _C_IDENT.match(name)):
        raise where.error("name", f"must be a C identifier (letters, digits, _; not starting "
                                  f"with a digit): it prefixes every emitted symbol; got "
                                  f"{_describe(name)}")
    return name


def _input_shape(top, where, batch):
    shape = top.items["input"][0]
    if not (isinstance(shape, list) and len(shape) == 4
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise where.error("input", f"must be [N, C, H, W], four positive integers; got "
                                   f"{_describe(shape)}")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise SpecError(f"the batch override must be a positive integer, got {batch!r}",
                            file=where.file, key="batch")
        shape = [batch] + shape[1:]
    return tuple(shape)


def _layer_list(top, where):
    layers = top.items["layers"][0]
    if not isinstance(layers, list) or not layers:
        raise where.error("layers", "must be a non-empty list of layers")
    for i, m in enumerate(layers):
        if not isinstance(m, _Map):
            raise where.error("layers", f"layer {i + 1} must be a mapping like "
                                        f"{{name: c1, op: conv, ...}}; got {_describe(m)}")
    return layers


@dataclass
class _Spec:
    """One layer as written: validated keys, normalised attributes, where it is."""
    name: str
    op: str
    attrs: dict
    inputs: list
    inputs_given: bool
    index: int              # position in the file
    where: _Where


def _layer_spec(m, file):
    w = _Where(file, m, _name_in(m.items))
    for key in ("name", "op"):
        if key not in m.items:
            raise w.error(key, f"missing required key '{key}'")
    name, op = m.items["name"][0], m.items["op"][0]
    if not isinstance(name, str) or not name:
        raise w.error("name", f"must be a non-empty string, got {_describe(name)}")
    if not isinstance(op, str) or op not in ops.SCHEMA:
        raise w.error("op", f"unknown op {_describe(op)}; known ops are "
                            f"{', '.join(sorted(ops.SCHEMA))}")
    schema = ops.SCHEMA[op]
    valid = LAYER_KEYS + tuple(schema)
    raw = {}
    for key, (value, _) in m.items.items():
        if key in LAYER_KEYS:
            continue
        if key not in schema:
            raise w.error(str(key), f"unknown key for op '{op}'; valid keys are "
                                    f"{', '.join(valid)}")
        types, _default = schema[key]
        if not _has_type(value, types):
            raise w.error(key, f"expected {_type_name(types)}, got {_describe(value)}")
        raw[key] = value
    for key, (_types, default) in schema.items():
        if default is ops.REQUIRED and key not in raw:
            raise w.error(key, f"op '{op}' needs key '{key}'; add `{key}: ...` to the layer")
    try:
        attrs = ops.normalise(op, raw)
    except ops.OpError as e:
        raise w.error(e.key, e.message) from None
    inputs = _inputs_of(m, w)
    return _Spec(name, op, attrs, inputs or [], inputs is not None, 0, w)


def _inputs_of(m, w):
    if "inputs" not in m.items:
        return None
    v = m.items["inputs"][0]
    if isinstance(v, str):               # `inputs: a` for one input reads naturally; allow it
        v = [v]
    if not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)):
        raise w.error("inputs", f"expected a non-empty list of layer names, got {_describe(v)}")
    return list(v)


def _sanitise(name):
    """The C identifier a layer name becomes in emitted code."""
    return c_ident(name)


def _check_names(specs):
    seen, c_names = {}, {}
    for i, s in enumerate(specs):
        s.index = i
        if s.name == "input":
            raise s.where.error("name", "'input' names the network input; rename the layer")
        if s.name in seen:
            raise s.where.error("name", f"duplicate layer name (first used on line "
                                        f"{seen[s.name].where.m.line}); rename one of them")
        c = _sanitise(s.name)
        if c in c_names:
            raise s.where.error("name", f"'{s.name}' and '{c_names[c].name}' both become the C "
                                        f"name '{c}'; rename one of them")
        seen[s.name], c_names[c] = s, s


def _link_inputs(specs):
    """Fill default inputs, check every name exists and the count suits the op."""
    by_name = {s.name: s for s in specs}
    for i, s in enumerate(specs):
        if not s.inputs_given:
            s.inputs = [specs[i - 1].name if i else "input"]
        for n in s.inputs:
            if n != "input" and n not in by_name:
                raise s.where.error("inputs", f"unknown input '{n}'; use 'input' or the name "
                                              f"of a layer in this file")
        arity = ops.ARITY[s.op]
        if arity is None and len(s.inputs) < 2:
            raise s.where.error("inputs", f"op '{s.op}' needs two or more inputs; list them "
                                          f"as `inputs: [a, b]`")
        if arity is not None and len(s.inputs) != arity:
            raise s.where.error("inputs", f"op '{s.op}' takes exactly {arity} input, "
                                          f"got {len(s.inputs)}")


def _toposort(specs):
    """Kahn's algorithm, always taking the earliest ready layer in file order (stable)."""
    by_name = {s.name: s for s in specs}
    waiting = {s.name: {n for n in s.inputs if n != "input"} for s in specs}
    users = {s.name: [] for s in specs}
    for s in specs:
        for n in waiting[s.name]:
            users[n].append(s)
    ready = [s.index for s in specs if not waiting[s.name]]
    heapq.heapify(ready)
    order = []
    while ready:
        s = specs[heapq.heappop(ready)]
        order.append(s)
        for u in users[s.name]:
            waiting[u.name].discard(s.name)
            if not waiting[u.name]:
                heapq.heappush(ready, u.index)
    if len(order) < len(specs):
        stuck = [s for s in specs if waiting[s.name]]
        cycle = _find_cycle(stuck[0], by_name, waiting)
        first = min(cycle, key=lambda s: s.index)
        path = " -> ".join(s.name for s in cycle + [cycle[0]])
        raise first.where.error("inputs", f"cycle in the layer graph: {path}; a layer cannot "
                                          f"depend on its own output")
    return order


def _find_cycle(start, by_name, waiting):
    """Follow unfinished inputs from `start` until a layer repeats: that loop is a cycle."""
    path, pos, s = [], {}, start
    while s.name not in pos:
        pos[s.name] = len(path)
        path.append(s)
        s = by_name[min(waiting[s.name], key=lambda n: by_name[n].index)]
    return path[pos[s.name]:]


def _infer_shapes(order, input_shape):
    shapes = {"input": input_shape}
    layers = []
    for s in order:
        in_shapes = [shapes[n] for n in s.inputs]
        try:
            out, params = ops.infer(s.op, s.attrs, in_shapes)
        except ops.OpError as e:
            msg = e.message
            if len(s.inputs) == 1:      # multi-input ops already list their shapes
                msg += f" (its input '{s.inputs[0]}' is {list(in_shapes[0])})"
            raise s.where.error(e.key, msg) from None
        shapes[s.name] = tuple(out)
        layers.append(Layer(name=s.name, op=s.op, attrs=s.attrs, inputs=list(s.inputs),
                            line=s.where.m.line if s.where.m.line is not None else s.index + 1,
                            in_shapes=[tuple(x) for x in in_shapes], out_shape=tuple(out),
                            params=[(p, tuple(sh)) for p, sh in params], index=s.index))
    return layers


def _outputs(top, where, specs):
    if "outputs" not in top.items:
        return [specs[-1].name]
    v = top.items["outputs"][0]
    if isinstance(v, str):
        v = [v]
    if not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)):
        raise where.error("outputs", f"expected a non-empty list of layer names, got "
                                     f"{_describe(v)}")
    names = {s.name for s in specs}
    for n in v:
        if n not in names:
            raise where.error("outputs", f"unknown layer '{n}'; outputs must name layers of "
                                         f"this file")
    if len(set(v)) != len(v):
        raise where.error("outputs", "a layer is listed twice; list each output once")
    return list(v)

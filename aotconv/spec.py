"""Read a net.yaml into a validated graph.Network: every error located by file, line, layer, key.

The YAML is composed (parsed to nodes, never constructed or evaluated) with PyYAML's safe
loader, so every key keeps its line and duplicate keys can be caught, which yaml.safe_load
silently merges. The nodes become `_Map`s (key -> (value, line)); a Python dict given to
`network_from_dict` becomes the same structure, so both sources share one validator.

Steps: top-level keys -> the network's inputs (`input: [N, C, H, W]`, or several named ones,
`inputs: {a: [N, C, H, W], b: ...}`, one batch N) -> each layer's keys, types and normalised
attributes (ops.SCHEMA, ops.normalise) -> names (aotconv.names: the rule, and no two layers or
inputs one C name) -> input names and arity, every network input read -> stable topological
sort (file order where the graph allows) -> shape inference (ops.infer) in that order.

Hostile input stays an error on one line: nesting is bounded (MAX_DEPTH) while nodes are
composed and converted, numbers must be finite and fit the kernels' types, and every user
string a message quotes is escaped and shortened (names.shown).
"""
import heapq
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import ops
from .errors import SpecError
from .graph import INPUT, Layer, Network, count
from .names import c_ident, layer_name_problem, net_name_problem, shown

NETS_DIR = Path(__file__).parent / "nets"
TOP_KEYS = ("name", "input", "layers", "outputs", "inputs")
LAYER_KEYS = ("name", "op", "inputs")
# a net.yaml nests 4 levels (top mapping, layers, a layer, a [h, w] list); anything far deeper
# is a mistake or an attack on the recursion limit
MAX_DEPTH = 32
# kernels index tensors and take sizes as 32-bit ints; float attributes become float32 literals
INT_MAX = 2**31 - 1
MAX_ELEMENTS = INT_MAX
FLT_MAX = 3.4028234663852886e38


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
    """The validated Network described by a net.yaml path or a shipped network's name (or
    an .onnx model, through aotconv.onnx_import: docs/onnx.md).

    `batch`, when given, replaces the batch size N of every input (the `--batch N` option).
    """
    if Path(str(source)).suffix.lower() == ".onnx":
        from .onnx_import import import_model
        return import_model(source, batch=batch).network
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
    The same rules as a net.yaml's apply (names, numbers, nesting depth); tuples count as lists.
    """
    if not isinstance(d, dict):
        raise SpecError("the description must be a mapping with name, input, layers", file=file)
    items = {}
    for k, v in d.items():
        if k == "layers" and isinstance(v, (list, tuple)):
            v = [_from_py(l, file, i + 1, 2) for i, l in enumerate(v)]
        else:
            v = _from_py(v, file, None, 1)
        items[k] = (v, None)
    return _build(_Map(None, items), file, batch)


def _from_py(v, file, line, depth, stack=()):
    """Python values -> the located values _parse makes: dicts become _Maps (at `line`), tuples
    lists; nesting deeper than MAX_DEPTH, or a container inside itself, is an error."""
    if not isinstance(v, (dict, list, tuple)):
        return v
    if depth > MAX_DEPTH or id(v) in stack:
        what = "contains itself" if id(v) in stack else f"nests more than {MAX_DEPTH} levels deep"
        raise SpecError(f"the description {what}; a network needs 4 levels", file=file,
                        line=line)
    stack = stack + (id(v),)
    if isinstance(v, dict):
        return _Map(line, {k: (_from_py(x, file, line, depth + 1, stack), line)
                           for k, x in v.items()})
    return [_from_py(x, file, line, depth + 1, stack) for x in v]


# ---------------------------------------------------------------------------------------------
# YAML nodes -> located values


@dataclass
class _Map:
    """A mapping that remembers where it starts and where each of its keys is."""
    line: int
    items: dict             # key -> (value, line of the key)

    def line_of(self, key):
        return self.items[key][1] if key in self.items else self.line


class _TooDeep(Exception):
    def __init__(self, line):
        self.line = line


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-4 as a float (YAML 1.2 does; PyYAML's 1.1 wants 1.0e-4)
    and stops composing past MAX_DEPTH levels (its composer recurses once per level)."""

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(self.peek_event().start_mark.line + 1)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _parse(text, file):
    """Compose `text` into a _Map tree; YAML syntax errors become SpecErrors at their line."""
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as e:        # a character YAML refuses (NUL, controls)
        raise SpecError(f"invalid YAML: character {e.character:#x}: {e.reason}; remove it",
                        file=file, line=text[:e.position].count("\n") + 1) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError("the file is empty; it needs name, input and layers", file=file,
                            line=1)
        return _value(root, loader, file, {})
    except _TooDeep as e:
        raise SpecError(f"nested more than {MAX_DEPTH} levels deep; a net.yaml needs 4 (top, "
                        f"layers, a layer, a [h, w] list)", file=file, line=e.line) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = ": ".join(s for s in (e.context, e.problem) if s)
        raise SpecError(f"invalid YAML: {what}; fix the syntax", file=file,
                        line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise SpecError(f"invalid YAML: {e}", file=file) from None
    finally:
        loader.dispose()


def _value(node, loader, file, memo, heights=None):
    """Plain values for scalars, lists for sequences, _Maps for mappings.

    `memo` converts an aliased node once, so `*anchor` costs nothing and cannot explode.
    Converting recurses no deeper than the composer did (MAX_DEPTH), but aliases can stack
    shallow anchors into a deep value (`- &b [*a]`, `- &c [*b]`, ...): `heights` (each
    collection's depth) keeps every value within MAX_DEPTH, and a collection inside itself
    (`&a [*a]`) is an error too.
    """
    heights = {} if heights is None else heights
    if id(node) in memo:
        if id(node) not in heights:
            raise SpecError("a collection contains itself (through an alias); remove the alias",
                            file=file, line=node.start_mark.line + 1)
        return memo[id(node)]
    if isinstance(node, yaml.MappingNode):
        m = memo[id(node)] = _Map(node.start_mark.line + 1, {})
        children = []
        for knode, vnode in node.value:
            line = knode.start_mark.line + 1
            if not isinstance(knode, yaml.ScalarNode):
                raise SpecError("a key must be a plain name", file=file, line=line)
            key = _scalar(knode, loader, file)
            if not isinstance(key, (str, int, float)) or isinstance(key, bool):
                raise SpecError("a key must be a plain name", file=file, line=line)
            if key in m.items:
                raise SpecError(f"duplicate key '{shown(key)}' (first given on line "
                                f"{m.items[key][1]}); remove one of them", file=file, line=line,
                                layer=_name_in(m.items), key=shown(key))
            m.items[key] = (_value(vnode, loader, file, memo, heights), line)
            children.append(vnode)
        out = m
    elif isinstance(node, yaml.SequenceNode):
        out = memo[id(node)] = []
        out.extend(_value(n, loader, file, memo, heights) for n in node.value)
        children = node.value
    else:
        return _scalar(node, loader, file)
    h = heights[id(node)] = 1 + max((heights.get(id(c), 0) for c in children), default=0)
    if h > MAX_DEPTH:
        raise SpecError(f"nested more than {MAX_DEPTH} levels deep (through aliases); a "
                        f"net.yaml needs 4", file=file, line=node.start_mark.line + 1)
    return out


def _scalar(node, loader, file):
    """A scalar's value; a number too long for Python to read (past 4300 digits: int() raises)
    is an error at its line."""
    try:
        return loader.construct_object(node)
    except (ValueError, OverflowError):
        raise SpecError(f"the number starting {shown(node.value[:20])} is too long to read; "
                        f"write a number of a sensible size", file=file,
                        line=node.start_mark.line + 1) from None


def _name_in(items):
    """The layer name to show in messages: as written when valid, else escaped and shortened."""
    name = items.get("name", (None,))[0]
    return shown(name) if isinstance(name, str) and name else None


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
    """A value as a message shows it: one line, bounded however long or deep it is."""
    if isinstance(v, _Map):
        return "a mapping"
    return shown(v, 60) if not isinstance(v, str) else "'" + shown(v, 60) + "'"


class _Where:
    """Raises SpecErrors for one file (and optionally one layer), located at a key's line."""

    def __init__(self, file, m, layer=None):
        self.file, self.m, self.layer = file, m, layer

    def error(self, key, message, line=None):
        if line is None:
            line = self.m.line_of(key) if key is not None else self.m.line
        return SpecError(message, file=self.file, line=line, layer=self.layer,
                         key=None if key is None else shown(key))


def _build(top, file, batch):
    where = _Where(file, top)
    if not isinstance(top, _Map):
        raise where.error(None, "the file must be a mapping with name, input and layers", line=1)
    for key in top.items:
        if key not in TOP_KEYS:
            raise where.error(key, f"unknown top-level key; valid keys are "
                                        f"{', '.join(TOP_KEYS)}")
    for key in ("name", "layers"):
        if key not in top.items:
            raise where.error(key, f"missing required top-level key '{key}'")
    if "input" in top.items and "inputs" in top.items:
        raise where.error("inputs", "give either `input: [N, C, H, W]` (one input) or "
                                    "`inputs: {name: [N, C, H, W], ...}` (several), not both")
    if "input" not in top.items and "inputs" not in top.items:
        raise where.error("input", "missing required top-level key 'input' ([N, C, H, W]; or "
                                   "`inputs:` for several named inputs)")
    name = _net_name(top, where)
    if "input" in top.items:
        inputs, named = [(INPUT, _input_shape(top, where, batch), top.line_of("input"))], False
    else:
        inputs, named = _named_inputs(top, where, batch), True
    raw_layers = _layer_list(top, where)
    specs = [_layer_spec(m, file) for m in raw_layers]
    _check_names(specs, inputs, where)
    _link_inputs(specs, inputs)
    order = _toposort(specs, inputs)
    _check_inputs_read(specs, inputs, where)
    layers = _infer_shapes(order, inputs)
    outputs = _outputs(top, where, specs)
    return Network(name=name, input_shape=inputs[0][1], layers=layers, outputs=outputs,
                   file=file, named_inputs=[(n, s) for n, s, _ in inputs] if named else None)


def _net_name(top, where):
    name = top.items["name"][0]
    problem = net_name_problem(name)
    if problem:
        raise where.error("name", problem)
    return name


_INPUT = object()        # _input_shape's default: the shape of `input:`


def _input_shape(top, where, batch, shape=_INPUT, key="input", line=None, what="the input"):
    """The shape of an input as given (`input:`, or `shape` of the input `key` of `inputs:`
    at `line`), with the batch override; `what` names it in messages."""
    shape = top.items["input"][0] if shape is _INPUT else shape
    line = where.m.line_of(key) if line is None else line
    if not (isinstance(shape, list) and len(shape) == 4
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise where.error(key, f"must be [N, C, H, W], four positive integers; got "
                               f"{_describe(shape)}", line=line)
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise SpecError(f"the batch override must be a positive integer, got "
                            f"{shown(batch)}", file=where.file, key="batch")
        shape = [batch] + shape[1:]
    if count(shape) > MAX_ELEMENTS:
        over = "batch" if batch is not None and count(shape[1:]) <= MAX_ELEMENTS else key
        raise SpecError(_too_big(what, shape), file=where.file,
                        line=None if over == "batch" else line, key=over)
    return tuple(shape)


def _named_inputs(top, where, batch):
    """[(name, shape, line)] of `inputs: {name: [N, C, H, W], ...}`, in the order written (the
    order of the library's calls): names by the layer name rule, one batch N for all."""
    m = top.items["inputs"][0]
    if not isinstance(m, _Map) or not m.items:
        raise where.error("inputs", f"must map each input's name to its [N, C, H, W], e.g. "
                                    f"`inputs: {{image: [1, 3, 32, 32], scale: [1, 3, 1, 1]}}`;"
                                    f" got {_describe(m)}")
    out = []
    for name, (shape, line) in m.items.items():
        line = line if line is not None else where.m.line_of("inputs")
        problem = layer_name_problem(name)
        if problem:
            raise SpecError(f"the input name {problem}", file=where.file, line=line,
                            key="inputs")
        shape = _input_shape(top, where, batch, shape, key=name, line=line,
                             what=f"the input '{name}'")
        if out and shape[0] != out[0][1][0]:
            raise SpecError(f"the input '{name}' has batch {shape[0]}, the input "
                            f"'{out[0][0]}' {out[0][1][0]}: the inputs share one batch N; "
                            f"give them the same first dimension", file=where.file,
                            line=line, key=shown(name))
        out.append((name, shape, line))
    return out


def _too_big(what, shape):
    return (f"{what} {'x'.join(map(str, shape))} has {count(shape):.3g} elements; a tensor "
            f"holds at most {MAX_ELEMENTS} (2^31 - 1: kernels index with 32-bit ints)")


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
    problem = layer_name_problem(name)
    if problem:
        raise w.error("name", f"the name {problem}")
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
            raise w.error(key, f"unknown key for op '{op}'; valid keys are "
                               f"{', '.join(valid)}")
        types, _default = schema[key]
        if not _has_type(value, types):
            hint = ops.TYPE_HINTS.get((op, key)) or _type_name(types)
            raise w.error(key, f"expected {hint}, got {_describe(value)}")
        problem = _number_problem(value)
        if problem:
            raise w.error(key, problem)
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


def _number_problem(value):
    """What is wrong with a number (or a list's numbers) as the kernels would see it, or None:
    a float must be finite within float32's range, an int fit a 32-bit int."""
    for v in (value if isinstance(value, list) else [value]):
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and abs(v) > INT_MAX:
            # an int is shown by its size: formatting one past 4300 digits raises
            shown = f"{float(v):.3g}" if v.bit_length() <= 1000 else f"an integer of {v.bit_length()} bits"
            return f"{shown} is out of range: integers are at most {INT_MAX} (2^31 - 1)"
        if isinstance(v, float) and not math.isfinite(v):
            return f"must be a finite number, got {v}"
        if isinstance(v, float) and abs(v) > FLT_MAX:
            return f"{v:.3g} is beyond float32's range (about 3.4e38)"
    return None


def _names_list(v, w, key, what):
    """A list of layer names (`inputs`, `outputs`), each following the name rule."""
    if isinstance(v, str):               # `inputs: a` for one input reads naturally; allow it
        v = [v]
    if not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)):
        raise w.error(key, f"expected a non-empty list of layer names, got {_describe(v)}")
    for n in v:
        problem = n != "input" and layer_name_problem(n)
        if problem:
            raise w.error(key, f"{what} '{shown(n)}' {problem}")
    return list(v)


def _inputs_of(m, w):
    if "inputs" not in m.items:
        return None
    return _names_list(m.items["inputs"][0], w, "inputs", "an input")


def _check_names(specs, inputs, where):
    """No two layers share a name, nor a C name (names.c_ident) ignoring case: the header
    upper-cases C names into macros, and kernels/<C name>.cl files meet on case-insensitive
    file systems. No layer is named as a network input, nor two inputs have one C name (the
    header's AOTCONV_<NET>_INPUT_INDEX_<C NAME>)."""
    given = {n: line for n, _, line in inputs}
    c_inputs = {}
    for n, _, line in inputs:
        c = c_ident(n).lower()
        if c in c_inputs:
            raise SpecError(f"the inputs '{c_inputs[c]}' and '{n}' both become the C name "
                            f"'{c_ident(n)}' once upper-cased; rename one of them",
                            file=where.file, line=line, key="inputs")
        c_inputs[c] = n
    seen, c_names = {}, {}
    for i, s in enumerate(specs):
        s.index = i
        if s.name == INPUT:
            raise s.where.error("name", "'input' names the network input; rename the layer")
        if s.name in given:
            at = f" (line {given[s.name]})" if given[s.name] is not None else ""
            raise s.where.error("name", f"the network input '{s.name}'{at} has this name; "
                                        f"rename the layer or the input")
        if s.name in seen:
            raise s.where.error("name", f"duplicate layer name (first used on line "
                                        f"{_line(seen[s.name])}); rename one of them")
        c = c_ident(s.name)
        other = c_names.get(c.lower())
        if other is not None:
            oc = c_ident(other.name)
            same = f"the C name '{c}'" if oc == c else f"the C names '{oc}' and '{c}'"
            raise s.where.error("name", f"collides with layer '{other.name}' at "
                                        f"{s.where.file}:{_line(other)}: both become {same}, "
                                        f"one macro and one kernel file once upper-cased; "
                                        f"rename one of them")
        seen[s.name], c_names[c.lower()] = s, s


def _line(spec):
    return spec.where.m.line if spec.where.m.line is not None else spec.index + 1


def _link_inputs(specs, inputs):
    """Fill default inputs (the first layer reads the network's only input), check every name
    exists and the count suits the op."""
    by_name = {s.name: s for s in specs}
    names = [n for n, _, _ in inputs]
    for i, s in enumerate(specs):
        if not s.inputs_given:
            if not i and len(names) > 1:
                raise s.where.error("inputs", f"the network has {len(names)} inputs "
                                              f"({', '.join(names)}); name the ones the first "
                                              f"layer reads, e.g. `inputs: [{names[0]}]`")
            s.inputs = [specs[i - 1].name if i else names[0]]
        for n in s.inputs:
            if n not in names and n not in by_name:
                use = (f"'{names[0]}'" if len(names) == 1 else
                       "a network input (" + ", ".join(names) + ")")
                raise s.where.error("inputs", f"unknown input '{shown(n)}'; use {use} or the "
                                              f"name of a layer in this file")
        arity = ops.ARITY[s.op]
        if arity is None and len(s.inputs) < 2:
            raise s.where.error("inputs", f"op '{s.op}' needs two or more inputs; list them "
                                          f"as `inputs: [a, b]`")
        if arity is not None and len(s.inputs) != arity:
            raise s.where.error("inputs", f"op '{s.op}' takes exactly {arity} input, "
                                          f"got {len(s.inputs)}")


def _check_inputs_read(specs, inputs, where):
    """Every network input is read by some layer: an input nobody reads is a mistake (a
    misspelt name, a layer left out), and the library would take data it never uses."""
    read = {n for s in specs for n in s.inputs}
    for n, _, line in inputs:
        if n not in read:
            raise SpecError(f"no layer reads the input '{n}'; name it in a layer's `inputs:` "
                            f"or remove it", file=where.file, line=line, key=shown(n))


def _toposort(specs, inputs):
    """Kahn's algorithm, always taking the earliest ready layer in file order (stable)."""
    by_name = {s.name: s for s in specs}
    names = {n for n, _, _ in inputs}
    waiting = {s.name: {n for n in s.inputs if n not in names} for s in specs}
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


def _infer_shapes(order, inputs):
    shapes = {n: shape for n, shape, _ in inputs}
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
        for what, shape in [("the output", out)] + [(f"the {p}", sh) for p, sh in params]:
            if count(shape) > MAX_ELEMENTS:
                raise s.where.error(_size_key(s), _too_big(what, shape) + "; make it smaller")
        shapes[s.name] = tuple(out)
        layers.append(Layer(name=s.name, op=s.op, attrs=s.attrs, inputs=list(s.inputs),
                            line=s.where.m.line if s.where.m.line is not None else s.index + 1,
                            in_shapes=[tuple(x) for x in in_shapes], out_shape=tuple(out),
                            params=[(p, tuple(sh)) for p, sh in params], index=s.index))
    return layers


def _size_key(s):
    """The key that most likely made a layer's tensor too large (out, pad or its inputs)."""
    if s.op == "concat":
        return "inputs"
    if s.op == "conv" and max(s.attrs["pad"]) > max(s.attrs["kernel"]):
        return "pad"
    return "out" if "out" in s.attrs else "inputs"


def _outputs(top, where, specs):
    if "outputs" not in top.items:
        return [specs[-1].name]
    v = _names_list(top.items["outputs"][0], where, "outputs", "an output")
    names = {s.name for s in specs}
    for n in v:
        if n not in names:
            raise where.error("outputs", f"unknown layer '{n}'; outputs must name layers of "
                                         f"this file")
    if len(set(v)) != len(v):
        raise where.error("outputs", "a layer is listed twice; list each output once")
    return list(v)

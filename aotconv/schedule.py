"""From a network and its chosen kernels to the tables the C runtime replays.

One program per layer (its rendered source), one device buffer per parameter tensor and per
variant-owned buffer, one shared scratch buffer, and activation buffers assigned by liveness:
a tensor's buffer is reused once every layer that reads it has run. Before any of that, a
layout_convert layer is inserted wherever a layer reads a layout its producer does not write
(aotconv.layouts; the network's input and outputs are NCHW).
"""
from dataclasses import dataclass, field

from .graph import count
from .names import c_comment, c_ident, kernel_prefix
from .ops import is_alias
from .passes import resolve_alias
from .layouts import insert_conversions, fallback_convert_choices


@dataclass
class Buffer:
    name: str
    bytes: int
    kind: str           # "act" | "param" | "extra" | "scratch"


@dataclass
class Program:
    layer: str
    file: str           # kernels/<file>.cl: the layer's C name, unique ignoring case
    source: str


def program_files(layers):
    """{layer name: kernels/ file stem}: the C name of each layer, made unique ignoring case.

    spec.py already rejects user layers whose C names meet; a layer the compiler adds (a
    layout conversion, `<tensor>_to_nhwc`) may still meet one, and then takes a suffix."""
    used, out = set(), {}
    for l in layers:
        base = stem = c_ident(l.name)
        i = 2
        while stem.lower() in used:
            stem, i = f"{base}_{i}", i + 1
        used.add(stem.lower())
        out[l.name] = stem
    return out


@dataclass
class LaunchRow:
    layer: str
    kernel: str
    program: int
    phase: str
    args: list          # [("buf", index) | ("int", v) | ("float", v)]
    gsize: tuple
    lsize: tuple


@dataclass
class ParamRow:
    name: str
    buffer: int
    offset: int
    count: int


@dataclass
class Schedule:
    net: object
    choices: dict
    programs: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    params: list = field(default_factory=list)
    input: tuple = None             # (buffer, count)
    outputs: list = field(default_factory=list)
    tensor_buffer: dict = field(default_factory=dict)
    naive_act_bytes: int = 0
    conversions: list = field(default_factory=list)   # names of the layout_convert layers
    fusion: list = None             # pool fusion decisions (aotconv.fusion), set by compiler
    layout_plan: object = None      # layouts.LayoutPlan, set by compiler

    @property
    def act_bytes(self):
        return sum(b.bytes for b in self.buffers if b.kind == "act")

    @property
    def scratch_bytes(self):
        return sum(b.bytes for b in self.buffers if b.kind == "scratch")

    @property
    def run_launches(self):
        return [l for l in self.launches if l.phase == "run"]

    @property
    def param_count(self):
        return self.net.param_count()

    @property
    def output_count(self):
        return sum(c for _, c in self.outputs)


def plan_activations(net):
    """{tensor: slot}, [slot bytes]: greedy best-fit reuse of buffers by liveness."""
    order = [l for l in net.layers if not is_alias(l)]
    step = {"input": -1}
    for i, l in enumerate(order):
        step[l.name] = i
    last = {t: step[t] for t in step}
    for i, l in enumerate(order):
        for t in l.inputs:
            t = resolve_alias(net, t)
            last[t] = max(last[t], i)
    for t in net.outputs:
        last[resolve_alias(net, t)] = float("inf")
    size = {"input": 4 * count(net.input_shape)}
    size.update({l.name: 4 * count(l.out_shape) for l in order})

    slots, holder, assign = [], [], {}
    for t in ["input"] + [l.name for l in order]:
        s = step[t]
        free = [i for i, h in enumerate(holder) if h is None or last[h] < s]
        fits = [i for i in free if slots[i] >= size[t]]
        if fits:
            i = min(fits, key=lambda i: slots[i])
        elif free:
            i = max(free, key=lambda i: slots[i])
            slots[i] = size[t]
        else:
            slots.append(size[t])
            holder.append(None)
            i = len(slots) - 1
        holder[i] = t
        assign[t] = i
    return assign, slots, sum(size.values())


def _source_head(layer, choice):
    """The first line of a layer's kernel file: which layer (by its own name, which the file
    name and the kernel names only map) and what was chosen for it."""
    fused = f", fused {', '.join(layer.fused)}" if layer.fused else ""
    return "// " + c_comment(f"layer {layer.name}: {layer.op}, {choice.variant}{fused}") + "\n"


def build_schedule(net, choices, convert=None):
    """The Schedule for `net` (after passes) with `choices` {layer: Choice}.

    Layout conversions are inserted first; `convert(layers)` gives their choices ({name:
    Choice}; default: the layout_convert fallback). `sch.net` is the network with them."""
    net, new = insert_conversions(net, choices)
    if new:
        choices = dict(choices)
        choices.update((convert or fallback_convert_choices)(new))
    sch = Schedule(net, choices)
    sch.conversions = [l.name for l in net.layers if l.op == "layout_convert"]
    assign, slots, naive = plan_activations(net)
    sch.naive_act_bytes = naive
    for i, b in enumerate(slots):
        sch.buffers.append(Buffer(f"act{i}", max(b, 4), "act"))
    sch.tensor_buffer = {t: assign[resolve_alias(net, t)]
                         for t in ["input"] + [l.name for l in net.layers]}

    for lname, tname, shape, off in net.param_layout():
        sch.buffers.append(Buffer(f"{lname}.{tname}", 4 * count(shape), "param"))
        sch.params.append(ParamRow(f"{lname}.{tname}", len(sch.buffers) - 1, off, count(shape)))
    param_buf = {p.name: p.buffer for p in sch.params}

    scratch = 0
    for l in net.layers:
        if l.name in choices:
            c = choices[l.name]
            scratch = max(scratch, c.impl.scratch_floats(l, c.cfg))
    scratch_buf = None
    if scratch:
        sch.buffers.append(Buffer("scratch", 4 * scratch, "scratch"))
        scratch_buf = len(sch.buffers) - 1

    files = program_files([l for l in net.layers if not is_alias(l)])
    for l in net.layers:
        if is_alias(l):
            continue
        c = choices[l.name]
        # kernels are named k_<file>: a layer may be called N, WG, int or kernel, which the
        # templates #define or OpenCL reserves
        v, prefix = c.impl, kernel_prefix(files[l.name])
        extra = {}
        for bname, floats in v.buffers(l, c.cfg).items():
            sch.buffers.append(Buffer(f"{l.name}.{bname}", 4 * max(floats, 1), "extra"))
            extra[bname] = len(sch.buffers) - 1
        sch.programs.append(Program(l.name, files[l.name], _source_head(l, c) +
                                    v.render(l, c.cfg, prefix)))
        prog = len(sch.programs) - 1
        for launch in v.launches(l, c.cfg, prefix):
            args = []
            for a in launch.args:
                if a.kind == "in":
                    args.append(("buf", sch.tensor_buffer[l.inputs[a.index]]))
                elif a.kind == "out":
                    args.append(("buf", sch.tensor_buffer[l.name]))
                elif a.kind == "param":
                    args.append(("buf", param_buf[f"{l.name}.{a.name}"]))
                elif a.kind == "buffer":
                    args.append(("buf", extra[a.name]))
                elif a.kind == "scratch":
                    args.append(("buf", scratch_buf))
                elif a.kind in ("int", "float"):
                    args.append((a.kind, a.value))
                else:
                    raise ValueError(f"layer {l.name}: unknown argument kind {a.kind}")
            sch.launches.append(LaunchRow(l.name, launch.kernel, prog, launch.phase, args,
                                          tuple(launch.gsize), tuple(launch.lsize or ())))
    sch.input = (sch.tensor_buffer["input"], count(net.input_shape))
    sch.outputs = [(sch.tensor_buffer[t], count(net.shape_of(t))) for t in net.outputs]
    return sch

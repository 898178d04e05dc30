"""From a network and its chosen kernels to the tables the C runtime replays.

One program per layer (its rendered source), one device buffer per parameter tensor a kernel
reads and per variant-owned buffer, one shared scratch buffer, and activation buffers assigned
by liveness: a tensor's buffer is reused once every layer that reads it has run. Before any of
that, a layout_convert layer is inserted wherever a layer reads a layout its producer does not
write (aotconv.layouts; the network's inputs and outputs are NCHW). Each network input is a
buffer like the others, live from the start of a run until its last reader.

Parameters keep the layout of the network as written (the `source` of build_schedule,
docs/params.md): a tensor a kernel reads as the user gave it is a ParamRow (copied in
set_params); the weight and bias of a layer a batchnorm was folded into (passes.fold_batchnorm)
are a FoldRow, computed in set_params from the user's conv/dense and batchnorm tensors. A
tensor of a fused layer may come from another layer as written (passes.param_origin: a
conv_dwpw's dw_weight and dw_bias are its depthwise conv's weight and bias): its rows read that
layer's tensors, folded with that layer's own batchnorms.
"""
from dataclasses import dataclass, field

from .graph import count
from .names import c_comment, c_ident, kernel_prefix
from .ops import is_alias
from .passes import batchnorm_folds, param_origin, resolve_alias
from .precision import element_bytes, storage_of
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
class FoldRow:
    """A layer's weight and bias folded with batchnorms, made in set_params: per output channel
    c, in float64, with s = prod over the batchnorms of gamma[c] / sqrt(var[c] + eps),
    weight'[c] = weight[c] * s and bias'[c] = the bias (0 without one) taken through each
    batchnorm in turn, (b - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c]; both rounded
    to float32 once."""
    layer: str
    weight: int             # buffer of the folded weight
    bias: int               # buffer of the folded bias
    channels: int
    per_channel: int        # weights per output channel (a contiguous block)
    weight_offset: int      # of the user's weight in the flat parameters
    bias_offset: int        # of the user's bias, or None where the layer had none
    batchnorms: list        # [(name, gamma, beta, mean, var offsets, eps)] in fold order
    source: str = None      # the layer as written whose weight and bias these are, where not
                            # `layer` (a conv_dwpw's depthwise conv: passes.param_origin)


class InOut:
    """What a table of buffers says about the network's inputs and outputs, from its `inputs`
    and `outputs`: each [(buffer, floats)] in the network's order."""

    @property
    def input(self):
        """(buffer, count) of the network's one input (the first of several)."""
        return self.inputs[0]

    @property
    def input_count(self):
        """Floats of all the inputs together."""
        return sum(c for _, c in self.inputs)

    @property
    def output_count(self):
        """Floats of all the outputs together."""
        return sum(c for _, c in self.outputs)


@dataclass
class Schedule(InOut):
    net: object
    choices: dict
    programs: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    params: list = field(default_factory=list)
    folds: list = field(default_factory=list)         # FoldRow
    source: object = None           # the network as written: its parameter layout is the API's
    inputs: list = field(default_factory=list)        # [(buffer, count)] in input order
    outputs: list = field(default_factory=list)
    tensor_buffer: dict = field(default_factory=dict)
    naive_act_bytes: int = 0
    conversions: list = field(default_factory=list)   # names of the layout_convert layers
    fusion: list = None             # pool fusion decisions (aotconv.fusion), set by compiler
    residual: list = None           # residual add fusion decisions (aotconv.fusion), likewise
    dwpw: list = None               # depthwise -> pointwise fusion decisions, likewise
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
        return self.source.param_count()

    def param_layout(self):
        """[(layer, tensor, shape, offset)] of the parameters set_params takes (docs/params.md)."""
        return self.source.param_layout()


def plan_activations(net):
    """{tensor: slot}, [slot bytes]: greedy best-fit reuse of buffers by liveness. The network
    inputs are written before the first kernel: all live at step -1, each in its own slot."""
    order = [l for l in net.layers if not is_alias(l)]
    inputs = net.input_names
    step = {t: -1 for t in inputs}
    for i, l in enumerate(order):
        step[l.name] = i
    last = {t: step[t] for t in step}
    for i, l in enumerate(order):
        for t in l.inputs:
            t = resolve_alias(net, t)
            last[t] = max(last[t], i)
    for t in net.outputs:
        last[resolve_alias(net, t)] = float("inf")
    size = {t: 4 * count(s) for t, s in net.inputs}     # the inputs are float
    size.update({l.name: element_bytes(storage_of(l)) * count(l.out_shape) for l in order})

    slots, holder, assign = [], [], {}
    for t in inputs + [l.name for l in order]:
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


def _plan_params(sch, net):
    """The parameter buffers of `net`'s kernels, each a ParamRow (the user's tensor as given)
    or part of a FoldRow (weight and bias folded with batchnorms); {"<layer>.<tensor>": buffer}.
    Each tensor is read from the layer as written it comes from (passes.param_origin), the
    tensors of one such layer with the batchnorms folded into it forming one FoldRow."""
    user = {(l, t): (shape, off) for l, t, shape, off in sch.source.param_layout()}
    folds = batchnorm_folds(sch.source, net)
    src = {l.name: l for l in sch.source.layers}
    param_buf = {}

    def buffer(lname, tname, shape):
        esize = element_bytes(storage_of(net.layer(lname)))    # half in an fp16 build
        sch.buffers.append(Buffer(f"{lname}.{tname}", esize * count(shape), "param"))
        param_buf[f"{lname}.{tname}"] = len(sch.buffers) - 1
        return len(sch.buffers) - 1

    def user_tensor(lname, origin, shape):
        got = user.get(origin)
        if got is None or tuple(got[0]) != tuple(shape):
            what = origin[1] if origin[0] == lname else f"{origin[0]}.{origin[1]}"
            raise ValueError(f"layer {lname}: its kernel reads parameter '{what}' "
                             f"{list(shape)}, which the source network's layout "
                             f"{'has as ' + str(list(got[0])) if got else 'lacks'}; pass the "
                             f"network as written (before passes) as source")
        return got[1]

    def file_order(l):
        # the tables in the user's order, as param_layout lists the tensors
        return user.get(param_origin(l, l.params[0][0]), (None, -1))[1]

    for l in sorted((l for l in net.layers if l.params), key=file_order):
        # the layer's tensors grouped by the layer as written each comes from, in their order
        parts = {}
        for tname, shape in l.params:
            origin = param_origin(l, tname)
            parts.setdefault(origin[0], []).append((tname, origin, shape))
        for sname, tensors in parts.items():
            if sname not in folds:
                for tname, origin, shape in tensors:
                    off = user_tensor(l.name, origin, shape)
                    sch.params.append(ParamRow(f"{l.name}.{tname}",
                                               buffer(l.name, tname, shape), off, count(shape)))
                continue
            # a folded layer's weight and bias: the user's, through its batchnorms
            mine = {origin[1]: (tname, origin, shape) for tname, origin, shape in tensors}
            wname, worigin, wshape = mine["weight"]
            bname, _, bshape = mine["bias"]
            w_off = user_tensor(l.name, worigin, wshape)
            b_off = (user_tensor(l.name, (sname, "bias"), bshape)
                     if src[sname].attrs.get("bias") else None)
            bns = []
            for bn in folds[sname]:
                offs = [user_tensor(l.name, (bn, t), (wshape[0],))
                        for t in ("gamma", "beta", "mean", "var")]
                bns.append((bn, *offs, float(src[bn].attrs["eps"])))
            sch.folds.append(FoldRow(l.name, buffer(l.name, wname, wshape),
                                     buffer(l.name, bname, bshape), wshape[0],
                                     count(wshape[1:]), w_off, b_off, bns,
                                     sname if sname != l.name else None))
    return param_buf


def build_schedule(net, choices, convert=None, source=None, file_suffix=""):
    """The Schedule for `net` (after passes) with `choices` {layer: Choice}.

    Layout conversions are inserted first; `convert(layers)` gives their choices ({name:
    Choice}; default: the layout_convert fallback). `sch.net` is the network with them.
    `source`: the network as written, whose parameter layout set_params takes (default `net`;
    required when a batchnorm was folded). `file_suffix` ends every kernel file stem and with
    it every kernel name (aotconv.batches: `_b<N>` keeps the sizes of one library apart)."""
    net, new = insert_conversions(net, choices)
    if new:
        choices = dict(choices)
        choices.update((convert or fallback_convert_choices)(new))
    sch = Schedule(net, choices, source=source if source is not None else net)
    sch.conversions = [l.name for l in net.layers if l.op == "layout_convert"]
    assign, slots, naive = plan_activations(net)
    sch.naive_act_bytes = naive
    for i, b in enumerate(slots):
        sch.buffers.append(Buffer(f"act{i}", max(b, 4), "act"))
    sch.tensor_buffer = {t: assign[resolve_alias(net, t)]
                         for t in net.input_names + [l.name for l in net.layers]}

    param_buf = _plan_params(sch, net)

    scratch = 0
    for l in net.layers:
        if l.name in choices:
            c = choices[l.name]
            scratch = max(scratch, c.impl.scratch_floats(l, c.cfg))
    scratch_buf = None
    if scratch:
        sch.buffers.append(Buffer("scratch", 4 * scratch, "scratch"))
        scratch_buf = len(sch.buffers) - 1

    files = {k: v + file_suffix
             for k, v in program_files([l for l in net.layers if not is_alias(l)]).items()}
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
    sch.inputs = [(sch.tensor_buffer[t], count(s)) for t, s in net.inputs]
    sch.outputs = [(sch.tensor_buffer[t], count(net.shape_of(t))) for t in net.outputs]
    return sch

"""Storage layouts across the network: pick each layer's layout, insert the conversions.

Every variant states the layout it reads and the layout it writes (`Variant.layouts_of`:
NCHW, NHWC or CHWN); the network's input and outputs are NCHW, and so are flatten and dropout
(they reinterpret their input's buffer). Two steps:

- `plan_network` (after choose): per layer, the best measured configuration in each
  (read, write) layout pair its variants offer (re-queried from the tuning records the tuner
  just wrote, or shipped ones), and a cost for each conversion (measured by tuning the
  layout_convert kernel, or a roofline estimate); a dynamic programme over each chain of
  single-producer single-consumer layers, in topological order, minimises the kernels' time
  plus the conversions', each launch beyond a layer's first and each conversion counted with
  the target's launch gap (aotconv.launch_cost). Where chains meet (a layer with several inputs, a tensor with several
  readers) it is greedy: a chain starts from the layouts already committed upstream and
  prices its tail against its readers' current picks. When two layouts are close, the one that
  avoids a conversion wins; when one is much faster, the conversion is paid.
- `insert_conversions` (from schedule.build_schedule): a layout_convert layer wherever a
  reader's layout differs from its producer's, one per (tensor, layout) shared by all the
  readers that want it, placed just before the first of them. Two layouts whose storage
  coincides for a shape (NCHW and NHWC when H = W = 1, NCHW and CHWN when N = 1, ...) need none.
  The same goes for the element type (aotconv.precision): in an fp16 build the layers store
  half while the network's inputs and outputs are float, so a layout_convert that also casts
  (`src_storage` beside its `storage`) follows each input and precedes each output, unless
  the layer at that edge takes the cast itself (`fuse_casts`): a layer reading only network
  inputs whose variant `reads_float` reads them as float and rounds each value to half as it
  reads it (`src_storage: fp32`, the values the cast would have stored), and a layer without
  parameters whose output is a network output and nothing else's, whose variant
  `writes_float`, writes it as float (`storage: fp32`, `src_storage: fp16`), unrounded.
"""
from dataclasses import dataclass, field
import copy
import math

from .graph import Layer, count
from .launch_cost import choice_ms, extra_ms, gap_ms, planned_ms
from .ops import is_alias
from .passes import consumers

NCHW = "NCHW"


# -- layouts of layers and tensors -------------------------------------------------------------

def layouts_of(layer, choice):
    """(read, write) of `layer` run by `choice` (None for aliases: NCHW both ways)."""
    if layer.op == "layout_convert":
        return layer.attrs["src"], layer.attrs["dst"]
    if is_alias(layer) or choice is None:
        return NCHW, NCHW
    return tuple(choice.impl.layouts_of(layer, choice.cfg))


def same_storage(shape, a, b):
    """True when `shape` stored in layout a and in layout b is the same sequence of floats:
    the orders agree once the dimensions of size 1 are dropped."""
    if a == b:
        return True
    size = dict(zip("NCHW", shape))
    return [d for d in a if size[d] > 1] == [d for d in b if size[d] > 1]


def layout_capable(layer):
    """True when some variant for `layer` may read or write something other than NCHW."""
    from .variants import for_layer
    from .variants.base import Variant
    return any(type(v).layouts_of is not Variant.layouts_of or tuple(v.layouts) != (NCHW, NCHW)
               for v in for_layer(layer))


# -- conversions -------------------------------------------------------------------------------

def convert_layer(name, tensor, shape, src, dst, storage="fp32", src_storage="fp32"):
    """A layout_convert of `tensor` from layout `src` stored as `src_storage` to `dst` stored
    as `storage` (the attributes of a conversion of an FP32 build are src and dst alone)."""
    attrs = {"src": src, "dst": dst}
    if storage != "fp32":
        attrs["storage"] = storage
    if src_storage != storage:
        attrs["src_storage"] = src_storage
    return Layer(name, "layout_convert", attrs, [tensor],
                 in_shapes=[tuple(shape)], out_shape=tuple(shape))


def fallback_convert_choices(layers):
    """{name: Choice}: the layout_convert fallback (one element per work-item) for each."""
    from .choose import Choice
    from .variants import BY_NAME
    v = BY_NAME["layout_convert"]
    return {l.name: Choice(v.name, v.fallback(l, None)) for l in layers}


def fuse_casts(net, choices):
    """Mark (in place) the layers of `net`, an fp16 build's network, that take the cast at
    the network's edges themselves (see the module's docstring); their kernels are the ones
    `choices` chose, rendered for float input or output. Returns the names marked."""
    from .precision import src_storage_of, storage_of
    inputs = set(net.input_names)
    shape_of = dict(net.inputs)
    readers = {}
    for l in net.layers:
        for t in l.inputs:
            readers.setdefault(t, []).append(l)
    marked = []

    def variant(l):
        c = choices.get(l.name)
        return None if c is None or is_alias(l) or l.op == "layout_convert" else c.impl

    for l in net.layers:
        v = variant(l)
        if (v is not None and v.reads_float and storage_of(l) == "fp16"
                and src_storage_of(l) == "fp16" and l.inputs and set(l.inputs) <= inputs
                and all(same_storage(shape_of[t], NCHW, layouts_of(l, choices[l.name])[0])
                        for t in l.inputs)):
            l.attrs = dict(l.attrs, src_storage="fp32")
            marked.append(l.name)
    by_name = {l.name: l for l in net.layers}
    for t in net.outputs:
        l = by_name.get(t)
        v = None if l is None else variant(l)
        if (v is not None and v.writes_float and storage_of(l) == "fp16"
                and src_storage_of(l) == "fp16" and not l.params and t not in readers
                and net.outputs.count(t) == 1
                and same_storage(l.out_shape, layouts_of(l, choices[l.name])[1], NCHW)):
            l.attrs = dict(l.attrs, storage="fp32", src_storage="fp16")
            marked.append(l.name)
    return marked


def insert_conversions(net, choices):
    """(net with layout_convert layers where readers and producers disagree, [new layers]).

    In an fp16 build, the layers at the network's edges whose variants can take the cast
    there do (`fuse_casts`). Idempotent: a network whose conversions are already in place
    gets none."""
    from .precision import src_storage_of, storage_of
    net = copy.deepcopy(net)
    fuse_casts(net, choices)
    names = {l.name for l in net.layers} | set(net.input_names)
    write = {t: NCHW for t in net.input_names}
    stored = {t: "fp32" for t in net.input_names}      # the inputs are float
    made, new, layers = {}, [], []

    shape_of = {t: tuple(s) for t, s in net.inputs}

    def reader_wants(tensor, layout, storage):
        shape = shape_of[tensor]
        if stored[tensor] == storage and same_storage(shape, write[tensor], layout):
            return tensor
        key = (tensor, layout, storage)
        if key not in made:
            base = f"{tensor}_to_{layout.lower()}"
            if stored[tensor] != storage:
                base = (f"{tensor}_to_{storage}" if same_storage(shape, write[tensor], layout)
                        else f"{base}_{storage}")
            name, i = base, 2
            while name in names:
                name, i = f"{base}_{i}", i + 1
            names.add(name)
            conv = convert_layer(name, tensor, shape, write[tensor], layout, storage,
                                 stored[tensor])
            layers.append(conv)
            new.append(conv)
            made[key] = name
            write[name], stored[name], shape_of[name] = layout, storage, shape
        return made[key]

    for l in net.layers:
        read, wrote = layouts_of(l, choices.get(l.name))
        l.inputs = [reader_wants(t, read, src_storage_of(l)) for t in l.inputs]
        layers.append(l)
        write[l.name], stored[l.name] = wrote, storage_of(l)
        shape_of[l.name] = tuple(l.out_shape)
    net.outputs = [reader_wants(t, NCHW, "fp32") for t in net.outputs]
    net.layers = layers
    return net, new


# Calibration of the estimate: tuned layout_convert on the H100 took 8.4-9.2 us for 1x256x56x56
# and 13-15 us for 1x64x224x224 and 16x256x28x28 (docs/variants/layout_convert.md): about one
# kernel's start plus the traffic at 60 % of the peak bandwidth.
CONVERT_EFFICIENCY = 0.6
CONVERT_START_MS = 0.005


def estimate_convert_ms(shape, target):
    """A conversion's time when none was measured: read and write the tensor once at 60 % of
    the target's peak bandwidth, plus one kernel's start."""
    gbps = (target.peak_gbps or 10.0) * CONVERT_EFFICIENCY
    return CONVERT_START_MS + 2 * 4 * count(shape) / (gbps * 1e6)


class ConvertCosts:
    """ms of converting a tensor of `shape` from one layout to another on `target`: measured
    (the layout_convert kernel tuned or looked up like any layer) where `prepare` could, else
    the roofline estimate."""

    def __init__(self, target, measured=None):
        self.target = target
        self.measured = dict(measured or {})       # (shape, src, dst) -> ms
        self.source = {}                            # (shape, src, dst) -> "measured"|"estimate"
        self.unrecorded = set()                     # keys priced as not to be planned

    def __call__(self, shape, src, dst):
        if same_storage(shape, src, dst):
            return 0.0
        key = (tuple(shape), src, dst)
        if key in self.measured:
            self.source[key] = "no record" if key in self.unrecorded else "measured"
            return self.measured[key]
        self.source[key] = "estimate"
        return estimate_convert_ms(shape, self.target)

    def prepare(self, keys, choose_fn, unrecorded=None):
        """Measure the conversions `keys` [(shape, src, dst)] with `choose_fn(net, only)`.
        `unrecorded`: the cost of a conversion that got no time (no record, in a build from
        records) instead of the roofline estimate (plan_network: math.inf, not to be planned)."""
        from .graph import Network
        keys = [k for k in dict.fromkeys(keys) if k not in self.measured
                and not same_storage(*k)]
        if not keys:
            return
        from .precision import STORAGE, of_target
        st = STORAGE[of_target(self.target)]           # an fp16 build's tensors are half
        layers = [convert_layer(f"convert{i}", "input", s, a, b, st, st)
                  for i, (s, a, b) in enumerate(keys)]
        net = Network("layout_conversions", keys[0][0], layers, [layers[-1].name])
        got = choose_fn(net, [l.name for l in layers])
        for k, l in zip(keys, layers):
            c = got.get(l.name)
            if c is not None and c.time_ms is not None:
                self.measured[k] = c.time_ms
            elif unrecorded is not None:
                self.measured[k] = unrecorded
                self.unrecorded.add(k)


# -- options and the plan ----------------------------------------------------------------------

def layout_options(net, choices, ctx):
    """{layer: [Choice]}: the chosen one first, then for every other (read, write) pair the
    layer's variants reach, the best configuration measured in it (from the tuning records of
    the BuildContext `ctx`). Only measured choices get alternatives: times must be comparable.
    A residual fusion carried onto the conv's own kernel, unmeasured as a fused layer, is
    planned at the conv's measured time (its `plan_ms`: the same kernel, which reads the
    residual in its epilogue), against the fused layer's own measured points in the other
    layouts."""
    from .choose import Choice
    from .variants import BY_NAME
    from .tune import search
    out = {l.name: [choices[l.name]] for l in net.layers if l.name in choices}
    if ctx.mode == "fallback":
        return out
    todo = [l for l in net.layers if l.name in choices
            and planned_ms(choices[l.name]) is not None and layout_capable(l)]
    if not todo:
        return out
    results = search.records_only(search.unique_layers(todo), ctx.target, ctx.store, ctx.device)
    for l in todo:
        r = results[l.signature_str()]
        chosen = choices[l.name]
        mine = layouts_of(l, chosen)
        best = {}
        for cand, o in r.outcomes.items():
            if not o.ok or o.time_ms is None:
                continue
            impl = BY_NAME[cand.variant]
            lay = tuple(impl.layouts_of(l, cand.cfg))
            ms = o.time_ms + extra_ms(impl, l, cand.cfg, ctx.profile)   # launches priced
            if lay != mine and (lay not in best or ms < best[lay][0]):
                best[lay] = (ms, cand, o.time_ms)
        carried = {}
        if chosen.time_ms is None:
            # a carried kernel: the twin (the conv the fusion took it from) measured it in
            # other layouts too; each is planned at its twin's time, as the carried one is
            carried = _carried_options(l, ctx, mine, exclude=set(r.outcomes))
            for lay, (ms, cand, _) in list(carried.items()):
                if lay in best and best[lay][0] <= ms:
                    del carried[lay]
        for lay, (_, cand, ms) in sorted(best.items()):
            if lay not in carried:
                out[l.name].append(Choice(cand.variant, cand.cfg, ms, chosen.source,
                                          chosen.stats))
        for lay, (_, cand, ms) in sorted(carried.items()):
            out[l.name].append(Choice(cand.variant, cand.cfg, None, chosen.source,
                                      chosen.stats, plan_ms=ms))
    return out


def _carried_options(layer, ctx, mine, exclude=()):
    """{(read, write): (ms priced, Candidate, ms)}: per layout pair other than `mine`, the
    fastest point the records of `layer`'s twins measured that is also a point of `layer`'s
    space (records.twin_points), its launches priced. A residual fusion carried onto its
    conv's kernel is planned at the conv's time (fusion._carried); the conv's search measured
    it in other layouts as well, and those are the same kernels with the residual read in the
    epilogue. ResNet-50 b1 guided for 90 s on an H100: the carried NHWC kernel of layer2's
    fused 1x1 convs sat between CHWN neighbours, and the only other option, their fallback
    in NCHW (24.3 us, the one point their own search measured), won over two conversions,
    where the conv's search had measured a CHWN kernel at 12 us."""
    from .tune.records import twin_points
    from .variants import BY_NAME
    best = {}
    for _, _, cand, o in twin_points(layer, ctx.target, ctx.store, ctx.device, exclude):
        if o.time_ms is None:
            continue
        impl = BY_NAME[cand.variant]
        lay = tuple(impl.layouts_of(layer, cand.cfg))
        ms = o.time_ms + extra_ms(impl, layer, cand.cfg, ctx.profile)
        if lay != mine and (lay not in best or ms < best[lay][0]):
            best[lay] = (ms, cand, o.time_ms)
    return best


@dataclass
class LayoutPlan:
    """What plan_network decided, for tuning.json and report.md."""
    alternatives: int = 0              # layers that had a choice of layout
    changed: list = field(default_factory=list)  # [dict(layer, tuned, planned)]
    independent_ms: float = None       # the tuner's per-layer picks plus the conversions they need
    planned_ms: float = None           # the plan's picks plus its conversions
    conversion_costs: dict = field(default_factory=dict)   # "shape src->dst" -> (ms, source)
    refined: list = field(default_factory=list)  # [dict(layer, layouts, before_ms, after_ms)]:
                                       # searched again in the layouts the plan gave them

    def as_dict(self):
        return dict(layers_with_alternatives=self.alternatives, changed=self.changed,
                    independent_ms=self.independent_ms, planned_ms=self.planned_ms,
                    conversion_costs={k: {"ms": v[0], "source": v[1]}
                                      for k, v in self.conversion_costs.items()},
                    refined=self.refined)


def _time(layer, c, target=None):
    """A choice's time; with `target`, plus the gaps of its launches beyond the first."""
    if target is not None:
        return choice_ms(layer, c, target)
    return planned_ms(c) or 0.0


def _priced(cost, target):
    """`cost` with each conversion's launch gap added where `target` is given."""
    if target is None:
        return cost
    gap = gap_ms(target)

    def priced(shape, src, dst):
        c = cost(shape, src, dst)
        return c + gap if c else c
    return priced


def total_ms(net, choices, cost, target=None):
    """Kernel time of `choices` plus the conversions they imply (the cost model the plan
    minimises, evaluated on a whole assignment); with `target`, every launch beyond a layer's
    first and every conversion also costs the target's launch gap (aotconv.launch_cost)."""
    write, total, seen = {t: NCHW for t in net.input_names}, 0.0, set()
    cost = _priced(cost, target)

    def need(t, lay):
        nonlocal total
        if (t, lay) not in seen:
            seen.add((t, lay))
            total += cost(net.shape_of(t), write[t], lay)
    for l in net.layers:
        r, w = layouts_of(l, choices.get(l.name))
        for t in dict.fromkeys(l.inputs):
            need(t, r)
        total += _time(l, choices.get(l.name), target)
        write[l.name] = w
    for t in net.outputs:
        need(t, NCHW)
    return total


def chains(net):
    """The layers cut into chains: a layer continues its input's chain when it has one input,
    that input has no other reader and is not a network output."""
    users = consumers(net)
    out, where = [], {}
    for l in net.layers:
        p = l.inputs[0] if len(l.inputs) == 1 else None
        if p is not None and not net.is_input(p) and users.get(p) == [l.name] \
                and p not in net.outputs:
            out[where[p]].append(l)
            where[l.name] = where[p]
        else:
            where[l.name] = len(out)
            out.append([l])
    return out


def plan(net, choices, opts, cost, target=None):
    """(choices, LayoutPlan): per layer one of its `opts` {layer: [Choice]}, minimising kernel
    time plus conversion cost `cost(shape, src, dst)` (ms) by dynamic programming along each
    chain (greedy where chains meet). With `target`, each conversion and each launch beyond a
    layer's first also costs the target's launch gap."""
    raw = cost
    cost = _priced(cost, target)
    users = consumers(net)
    by_name = {l.name: l for l in net.layers}
    cur = dict(choices)
    write = {t: NCHW for t in net.input_names}

    def options(l):
        return opts.get(l.name) or [choices.get(l.name)]

    def conv(t, a, b):
        return cost(net.shape_of(t), a, b)

    def tail(l, w):
        wants = {NCHW} if l.name in net.outputs else set()
        for u in users.get(l.name, ()):
            wants.add(layouts_of(by_name[u], cur.get(u))[0])
        return sum(conv(l.name, w, r) for r in wants)

    for chain in chains(net):
        table = []                     # per layer: [(cost, write, option, back)]
        for i, l in enumerate(chain):
            row = []
            for o in options(l):
                r, w = layouts_of(l, o)
                if i == 0:
                    c = sum(conv(t, write[t], r) for t in dict.fromkeys(l.inputs))
                    back = None
                else:
                    c, back = min((pc + conv(chain[i - 1].name, pw, r), j)
                                  for j, (pc, pw, _, _) in enumerate(table[-1]))
                row.append((c + _time(l, o, target), w, o, back))
            table.append(row)
        last = chain[-1]
        j = min(range(len(table[-1])), key=lambda j: table[-1][j][0] + tail(last, table[-1][j][1]))
        for i in range(len(chain) - 1, -1, -1):
            _, w, o, back = table[i][j]
            if o is not None:
                cur[chain[i].name] = o
            write[chain[i].name] = w
            j = back
    rep = LayoutPlan(alternatives=sum(1 for v in opts.values() if len(v) > 1))
    for name, c in choices.items():
        if cur[name] != c:
            l = by_name[name]
            rep.changed.append(dict(
                layer=name,
                tuned=dict(variant=c.variant, config=str(c.cfg), layouts=list(layouts_of(l, c)),
                           ms=c.time_ms),
                planned=dict(variant=cur[name].variant, config=str(cur[name].cfg),
                             layouts=list(layouts_of(l, cur[name])), ms=cur[name].time_ms)))
    if rep.alternatives:
        rep.independent_ms = total_ms(net, choices, raw, target)
        rep.planned_ms = total_ms(net, cur, raw, target)
    return cur, rep


def needed_conversions(net, choices):
    """[(shape, src, dst)] the conversions `choices` need between producers and readers."""
    written = {t: NCHW for t in net.input_names}
    keys = []
    for l in net.layers:
        read, write = layouts_of(l, choices.get(l.name))
        for t in dict.fromkeys(l.inputs):
            src = written.get(t, NCHW)
            if src != read and not same_storage(net.shape_of(t), src, read):
                keys.append((tuple(net.shape_of(t)), src, read))
        written[l.name] = write
    for t in net.outputs:
        if written.get(t, NCHW) != NCHW and not same_storage(net.shape_of(t), written[t], NCHW):
            keys.append((tuple(net.shape_of(t)), written[t], NCHW))
    return keys


# A build from records with --require-tuned plans again at most this many times, each time
# pricing the conversions its plan needs that have no record as not to be planned
STRICT_REPLANS = 4

# The refinement (plan_network): a layer the plan moved to another layout is searched again in
# that layout where its planned kernel is slower than its own search's pick by more than
# REFINE_MARGIN of it and REFINE_MIN_MS. Its search measured the other layouts only where its
# strategy happened to go: on the H100, ResNet-50 b1's fused layer4 1x1 convs had their best
# NHWC point at 16.8 us and, measured in NCHW (which their neighbours chose), 7 points, the
# best at 32.2 us.
REFINE_MARGIN = 0.10
REFINE_MIN_MS = 0.002
REFINE_TRIALS = 8                  # at least, of a trial budget, per layer searched again


def refinable(net, choices, planned, target=None):
    """{layer name: (read, write)}: the layers whose planned choice is in another layout than
    their search's pick and slower than it by more than REFINE_MARGIN and REFINE_MIN_MS (both
    measured, or the pick planned at its conv's time where a residual add was carried onto that
    kernel; launches priced), with the layouts the plan gave them."""
    out = {}
    for l in net.layers:
        a, b = choices.get(l.name), planned.get(l.name)
        if a is None or b is None or a is b or planned_ms(a) is None or planned_ms(b) is None:
            continue
        rw = layouts_of(l, b)
        if rw == layouts_of(l, a):
            continue
        ta, tb = _time(l, a, target), _time(l, b, target)
        if tb - ta > max(REFINE_MARGIN * ta, REFINE_MIN_MS):
            out[l.name] = rw
    return out


def _refine_context(ctx, net, todo, choices):
    """The BuildContext the refinement searches `todo` ({layer: layouts}) with, or None where a
    time budget has no room for them: a trial budget grants each layer what the network's
    search granted it (REFINE_TRIALS at least); a time budget's clock is shared, as the fusion
    searches share it."""
    from dataclasses import replace
    from .tune.search import Clock, parse_budget, unique_layers
    budget = ctx.budget
    layers = [l for l in net.layers if l.name in todo]
    if isinstance(budget, Clock):
        unique = [g[0] for g in unique_layers(layers)]
        if budget.affords(unique):
            return ctx
        if getattr(ctx.progress, "mode", "quiet") not in ("quiet", "json"):
            import sys
            print(f"aotconv: budget {budget.budget}: no time left to search {len(unique)} "
                  f"layer{'s' if len(unique) != 1 else ''} again in the layouts the plan gave "
                  f"them ({', '.join(sorted(todo))})", file=sys.stderr, flush=True)
        return None
    b = parse_budget(budget) if budget is not None else None
    if b is None or b.kind != "trials":
        return ctx
    groups = unique_layers(layers)
    return replace(ctx, budget=str(sum(max(REFINE_TRIALS, choices[g[0].name].stats.trials)
                                       for g in groups)))


def plan_network(net, choices, ctx, measure_conversions=True):
    """The layouts of `net` after choose: (choices, LayoutPlan), with the BuildContext `ctx`.
    The conversions the plan needs are chosen like any layer (measured when tuning) unless
    `measure_conversions` is false (roofline estimates only).

    A build from records that requires every kernel tuned (--require-tuned, no tuning) plans
    only conversions that have a record: one with none is priced as never to be planned
    (math.inf) rather than by its roofline estimate, so a layout change is kept only where
    the records time the conversions it needs; the layers then keep a layout the records can
    serve. (Planned on an estimate, the build would stop at a conversion the records lack.)"""
    from .choose import choose
    opts = layout_options(net, choices, ctx)
    cost = ConvertCosts(ctx.profile)
    strict = ctx.require_tuned and not ctx.tuning
    look = ctx
    if strict:
        from dataclasses import replace
        from .tune.progress import Progress
        # looked up, not required: a missing record is priced below, not an error here
        look = replace(ctx, require_tuned=False, progress=Progress.make(quiet=True))
    choose_fn = (lambda n, only: choose(n, look, only=only)) if measure_conversions else None
    if not any(len(v) > 1 for v in opts.values()):
        return dict(choices), LayoutPlan()
    out, rep = plan(net, choices, opts, cost, ctx.profile)

    def measure_conversions_needed():
        # plan on estimates, then measure only the conversions that plan needs and plan again
        # (measuring every conversion a layer could need cost VGG-16 32 tunings for none used)
        nonlocal out, rep
        for _ in range(STRICT_REPLANS if strict else 1):
            keys = [k for k in needed_conversions(net, out) if k not in cost.measured]
            if not keys:
                break
            cost.prepare(keys, choose_fn, unrecorded=math.inf if strict else None)
            out, rep = plan(net, choices, opts, cost, ctx.profile)
    if choose_fn is not None:
        measure_conversions_needed()
    refined = []
    todo = refinable(net, choices, out, ctx.profile) if ctx.tuning and choose_fn else {}
    sub = _refine_context(ctx, net, todo, choices) if todo else None
    if sub is not None:
        # the layers the plan moved to a slower kernel, searched again in the layouts it gave
        # them; their new points are records, which the options and the plan read again
        before = {n: _time(net.layer(n), out[n], ctx.profile) for n in todo}
        choose(net, sub, only=list(todo), layouts=todo)
        opts = layout_options(net, choices, ctx)
        out, rep = plan(net, choices, opts, cost, ctx.profile)
        measure_conversions_needed()
        refined = [dict(layer=n, layouts=list(todo[n]), before_ms=round(before[n], 6),
                        after_ms=round(_time(net.layer(n), out[n], ctx.profile), 6))
                   for n in todo]
    rep.refined = refined
    for f in ("independent_ms", "planned_ms"):
        if not math.isfinite(getattr(rep, f) or 0.0):
            setattr(rep, f, None)          # a plan through a conversion with no record
    rep.conversion_costs = {
        f"{'x'.join(map(str, s))} {a}->{b}":
            (round(c, 6) if math.isfinite(c := cost(s, a, b)) else None, cost.source.get((s, a, b)))
        for (s, a, b) in sorted(cost.source)}
    return out, rep


"""Pick one (variant, configuration) per layer: from tuning, from records, or the fallback.

    choose(net, target, mode="tune")   the target's device is here: search (tune.search),
                                       reading and appending records; absent: as "records",
                                       warning loudly about every layer left untuned
    mode="records"                     recorded results only (shipped, cache, --tuning-db),
                                       fallbacks for the rest
    mode="fallback"                    every layer's fallback, valid under the target's limits

The build's precision (`ctx.precision`, aotconv.precision) bounds what it considers: the
spaces it searches and checks records against hold only the variants that precision allows
(aotconv.space), so an fp32 build never chooses a TF32 kernel and a tf32 build chooses one
where it measured fastest.

Choice and Stats are frozen (hashable) dataclasses; Stats carries what report.md and the
histogram need: counts of candidates tried / pruned / failed by kind, every valid time measured.
"""
from dataclasses import dataclass, field, asdict

from .context import BuildContext
from .errors import AotconvError
from .fits import check_memory
from .ops import is_alias, flops as op_flops, bytes_moved
from .tune import search
from .variants import BY_NAME
from .variants.base import Config


@dataclass(frozen=True)
class Stats:
    space: int = 0              # points before pruning, all variants
    pruned: int = 0             # removed by constraints (algorithm, software, device limits)
    tried: int = 0              # candidates measured on the device (records included)
    ok: int = 0
    build_failed: int = 0
    launch_failed: int = 0
    wrong: int = 0
    timed_out: int = 0
    times: tuple = ()           # ms of every valid candidate measured (the histogram)
    fallback_ms: float = None   # the untuned fallback's time, when measured
    flops: int = 0              # of one run of the layer
    bytes: int = 0              # the fewest bytes one run must move (roofline)
    new: int = 0                # measured in this run (the rest came from records)
    trials: int = 0             # the share of the budget this layer was granted
    seconds: float = 0.0        # wall time spent tuning it
    strategy: str = ""
    layers: tuple = ()          # the identical layers that share this choice
    per_variant: tuple = ()     # ((variant, space, pruned, tried, ok, best_ms), ...)

    @property
    def failed(self):
        return self.build_failed + self.launch_failed + self.timed_out

    def as_dict(self):
        return asdict(self)

    # mapping-like, so that dict(choice.stats) works as it did when stats was pairs
    def keys(self):
        return self.as_dict().keys()

    def __getitem__(self, name):
        return getattr(self, name)


@dataclass(frozen=True)
class Choice:
    variant: str
    cfg: Config
    time_ms: float = None
    source: str = "fallback"        # "tuned" | "record" | "fallback" | "record of <epilogue>"
                                    # (borrowed: a twin signature's record, no time here)
    stats: Stats = field(default_factory=Stats)
    plan_ms: float = None           # where time_ms is None, the time the layout plan prices
                                    # it at: a residual fusion carried onto the conv's own
                                    # kernel (fusion._carried) is planned at the conv's time

    @property
    def impl(self):
        return BY_NAME[self.variant]

    @property
    def gflops(self):
        if not self.time_ms or not self.stats.flops:
            return None
        return self.stats.flops / (self.time_ms * 1e6)

    @property
    def speedup(self):
        """How much faster than the untuned fallback (both measured), or None."""
        if self.time_ms and self.stats.fallback_ms:
            return self.stats.fallback_ms / self.time_ms
        return None


def fallback_choice(layer, target):
    """The fallback valid under `target`'s limits (tune.search.fallback_candidate)."""
    from .tune.search import fallback_candidate
    c = fallback_candidate(layer, target)
    return Choice(c.variant, c.cfg, stats=_base_stats(layer))


def _base_stats(layer, space=None):
    if space is None:
        return Stats(flops=op_flops(layer), bytes=bytes_moved(layer), layers=(layer.name,))
    return Stats(space=space.total, pruned=space.pruned, flops=op_flops(layer),
                 bytes=bytes_moved(layer), layers=(layer.name,))


def stats_of(result):
    """Stats of a tune.search.LayerResult."""
    from .tune.measure import Status
    layer = result.layers[0]
    count = {s: 0 for s in Status}
    for o in result.outcomes.values():
        count[o.status] += 1
    times = tuple(o.time_ms for o in result.outcomes.values() if o.ok)
    fb = result.outcomes.get(result.fallback)
    per = []
    for p in result.space.parts:
        mine = [o for c, o in result.outcomes.items() if c.variant == p.variant.name]
        oks = [o.time_ms for o in mine if o.ok]
        per.append((p.variant.name, p.total, p.pruned, len(mine), len(oks),
                    min(oks) if oks else None))
    return Stats(space=result.space.total, pruned=result.space.pruned,
                 tried=len(result.outcomes), ok=count[Status.OK],
                 build_failed=count[Status.BUILD_FAILED],
                 launch_failed=count[Status.LAUNCH_FAILED], wrong=count[Status.WRONG],
                 timed_out=count[Status.TIMED_OUT], times=times,
                 fallback_ms=fb.time_ms if fb is not None and fb.ok else None,
                 flops=op_flops(layer), bytes=bytes_moved(layer), new=result.new,
                 trials=result.trials, seconds=round(result.seconds, 3),
                 strategy=result.strategy, layers=tuple(l.name for l in result.layers),
                 per_variant=tuple(per))


def _choice_of(result, source):
    st = stats_of(result)
    if result.best is None:
        fb = result.fallback
        return Choice(fb.variant, fb.cfg, None, "fallback", st)
    if result.borrowed is not None:
        # the twin's time is not this layer's: none is given (tune.records.borrow)
        return Choice(result.best.variant, result.best.cfg, None, result.borrowed.source, st)
    return Choice(result.best.variant, result.best.cfg, result.best_outcome.time_ms, source, st)


def choose(net, ctx, *, only=None, layouts=None, **options):
    """{layer name: Choice} for every layer that runs a kernel (aliases excluded).

    `ctx` is a BuildContext (aotconv.context), or a target (name or profile) with the
    BuildContext.make options: mode, budget, strategy, tuning_db, require_tuned, quiet,
    json_progress, jobs, seed, progress, measurer, share, where. `only`: layer names to
    consider (the rest are left out).

    The budget (trials, '10m' or None: up to 64 trials per unique layer) is shared among the
    unique layers by roofline cost (share="cost": the network's time) or equally
    (share="equal": independent layers each judged on its own, as the benchmark sets are);
    `where` restrictions narrow the search to some variants and knob values (records and
    fallbacks are unaffected). `layouts` ({layer name: (read, write)}) searches those layers
    only in points that store their input and output as those layouts do (the layout plan's
    refinement, aotconv.layouts).
    """
    if not isinstance(ctx, BuildContext):
        with BuildContext.make(ctx, **options) as own:
            return choose(net, own, only=only, layouts=layouts)
    if options:
        raise TypeError(f"choose() with a BuildContext takes no options: {', '.join(options)}")
    layers = [l for l in net.layers if not is_alias(l) and (only is None or l.name in only)]
    groups = search.unique_layers(layers)

    # before anything is tuned, built or allocated: every tensor within the device's memory
    # (the live device's figures when it is here)
    check_memory(net, ctx.target, layers)

    if ctx.mode == "fallback":
        # the profile's own limits, as a build for an absent device would use them
        return {l.name: fallback_choice(l, ctx.profile) for l in layers}

    if ctx.tuning:
        results = search.tune_network(groups, ctx.target, ctx.measurer(), ctx.store, ctx.device,
                                      budget=ctx.budget, strategy=ctx.strategy, seed=ctx.seed,
                                      progress=ctx.progress, share_by=ctx.share,
                                      where=ctx.where, recheck=ctx.recheck,
                                      layouts=_by_signature(net, layouts))
        source = "tuned"
    else:
        results = search.records_only(groups, ctx.target, ctx.store, ctx.device, borrow=True)
        source = "record"

    out, untuned, borrowed = {}, [], []
    for g in groups:
        r = results[g[0].signature_str()]
        c = _choice_of(r, source)
        if c.source == "fallback":
            untuned.extend(l.name for l in g)
        elif r.borrowed is not None:
            borrowed.append((g, r.borrowed))
        for l in g:
            out[l.name] = c
    if borrowed:
        _warn_borrowed(ctx, borrowed, len(layers), _tune_command(net, ctx))
    if untuned:
        why = ("no matching OpenCL device is present" if not ctx.present else
               "the device is present but records were asked for" if ctx.mode == "records" else
               "no candidate ran correctly")
        name = ctx.profile.name
        msg = (f"target '{name}': {why}; {len(untuned)} of {len(layers)} layers have no "
               f"tuning record and use their untuned fallback: {', '.join(untuned)}. Tune them "
               f"with `{_tune_command(net, ctx)}` on that device, or pass --tuning-db FILE.")
        if ctx.require_tuned:
            raise AotconvError(msg.replace("use their untuned fallback",
                                           "--require-tuned refuses the untuned fallback"))
        ctx.progress.warn(msg)
    return {l.name: out[l.name] for l in layers}


def _by_signature(net, layouts):
    """{signature: (read, write)} of choose's `layouts` ({layer name: (read, write)})."""
    if not layouts:
        return None
    return {l.signature_str(): rw for l in net.layers if (rw := layouts.get(l.name))}


def _tune_command(net, ctx):
    """The `aotconv tune` command that records what this build looks up: at its batch size and
    precision (tune measures the layout conversions and fusions a build adds too)."""
    precision = f" --precision {ctx.precision}" if ctx.precision != "fp32" else ""
    return (f"aotconv tune NET --target {ctx.profile.name} --batch {net.input_shape[0]}"
            f"{precision}")


def _warn_borrowed(ctx, borrowed, total, command):
    """The build's line for layers that run a twin signature's recorded point
    (tune.records.borrow): which, from which epilogue, and that its time is not theirs.
    --require-tuned accepts them (docs/tuning.md, Borrowed records)."""
    name = ctx.profile.name
    k = sum(len(g) for g, _ in borrowed)
    each = "; ".join(f"{', '.join(l.name for l in g)}: {b.candidate.variant} {b.candidate.cfg} "
                     f"from the {b.source} ({b.outcome.time_ms:.4g} ms there)"
                     for g, b in borrowed)
    ctx.progress.warn(
        f"target '{name}': {k} of {total} layers have no tuning record of their own and run "
        f"the point recorded for the same shapes with another epilogue, not timed at theirs: "
        f"{each}. Tune them with `{command}` to time their own.")


def space_report(layer, target, exact=False):
    """Text for `aotconv space NET --layer L`: each variant's space before and after pruning
    and what every constraint removed (exact=True: every constraint checked on every point)."""
    from .space import layer_space, report
    from .targets import get_target
    if isinstance(target, str):
        target = get_target(target)
    return report(layer_space(layer, target, explain=exact), exact)

"""`aotconv space` and `aotconv tune`: registered on the top-level CLI by add_commands."""
import json
import os
import sys

from ..errors import AotconvError


def add_commands(subparsers, load=None):
    """Register `space` and `tune`. `load(source, batch)` returns the network as the build
    sees it (after fusion passes); by default aotconv.spec.load_network."""
    sp = _network_command(
        subparsers, "space", "layer name (repeatable; default: all)",
        help="show each variant's parameter space for a layer, before and after pruning",
        description="Print the size of each kernel variant's parameter space for a layer, "
                    "before and after pruning, and how many points each constraint removed.")
    sp.add_argument("--exact", action="store_true",
                    help="check every constraint on every point: per constraint the points it "
                         "rejects first (in level order) and all it rejects (minutes for the "
                         "implicit-GEMM convolution's millions of points)")
    sp.set_defaults(func=lambda a: cmd_space(a, load))

    tp = _network_command(
        subparsers, "tune", "tune only this layer (repeatable); CONV+POOL: that conv with "
                            "its pool folded in (a conv_pool layer)",
        help="tune every layer on the target device and fill the tuning records",
        description="Search every layer's space on the target's device and append the "
                    "results to the tuning records (nothing is emitted).")
    add_tuning_options(tp)
    tp.set_defaults(func=lambda a: cmd_tune(a, load))


def _network_command(subparsers, name, layer_help, **kw):
    """The subcommand `name` (add_parser's `kw`) with what `space` and `tune` both take: the
    network, --target, --batch and --layer (`layer_help`)."""
    p = subparsers.add_parser(name, **kw)
    p.add_argument("net", help="a net.yaml or a shipped network's name")
    p.add_argument("--target", default="auto", help="target profile (default: auto)")
    p.add_argument("--batch", type=int, help="override the batch size")
    p.add_argument("--layer", action="append", help=layer_help)
    return p


def add_tuning_options(p):
    """The options `build` shares with `tune` (the lead's build command can call this too)."""
    from .strategies import STRATEGIES, DEFAULT
    p.add_argument("--budget", help="for the whole network: trials (200) or time (90s, 10m, "
                                    "1.5h); default: up to 64 trials per layer")
    p.add_argument("--strategy", default=DEFAULT,
                   help=f"search strategy: {', '.join(STRATEGIES)} (default {DEFAULT}); "
                        f"options as name:key=value,... e.g. annealing:T=6, pso:S=6")
    p.add_argument("--tuning-db", action="append", metavar="FILE",
                   help="extra tuning records to read (and to append to when tuning)")
    add_recheck_option(p)
    p.add_argument("--jobs", "-j", type=int, help="parallel compiles (default: every core)")
    p.add_argument("--seed", type=int, default=0, help="seed of the search (default 0)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="progress as JSON lines on stderr")
    p.add_argument("--where", action="append", metavar="VARIANT:KNOB=V/V,...",
                   help="search only this variant, and of its points only those whose knobs "
                        "take these values, e.g. conv_igemm:VW=4,LAYOUT=NCHW/CHWN "
                        "(repeatable; layers it does not implement are searched as usual)")


def add_recheck_option(p):
    from .search import RECHECK
    p.add_argument("--recheck", type=int, metavar="N",
                   help=f"time again, in this run, each layer's N fastest recorded points "
                        f"before they decide (default {RECHECK}; 0: trust the records' "
                        f"times; docs/tuning.md)")


def _load(load, source, batch):
    if load is not None:
        return load(source, batch)
    from ..spec import load_network
    net = load_network(source, batch=batch)
    try:
        from ..passes import optimise
    except ImportError:
        return net
    return optimise(net)


def cmd_space(args, load=None):
    from ..choose import space_report
    from ..ops import is_alias
    from ..targets import get_target
    net = _load(load, args.net, args.batch)
    target = get_target(args.target)
    if getattr(args, "precision", None):            # what the spaces of that build offer
        from ..context import with_precision
        from ..precision import stored
        target = with_precision(target, args.precision)
        net = stored(net, args.precision)               # fp16: its layers store half
    names = args.layer or [l.name for l in net.layers if not is_alias(l)]
    for i, name in enumerate(names):
        try:
            layer = net.layer(name)
        except KeyError:
            raise AotconvError(f"network '{net.name}' has no layer '{name}'; its layers are: "
                               f"{', '.join(l.name for l in net.layers)}") from None
        if i:
            print()
        print(space_report(layer, target, exact=args.exact))
    return 0


def cmd_tune(args, load=None):
    """Tune the network's layers, then what a build of those choices measures after them (the
    pool, residual-add and depthwise fusion searches, the layout plan's conversions and the layout_convert
    layers it inserts: an fp16 build's casts at the input and the outputs among them), so that a
    build from the records finds every kernel it runs. With --layer: those layers, network
    layers or the conversions a build from the records inserts."""
    from ..choose import choose
    from ..context import BuildContext
    from ..targets import get_target, find_device
    net = _load(load, args.net, args.batch)
    target = get_target(args.target)
    if find_device(target) is None and not os.environ.get("AOTCONV_RAY"):   # --ray: a farm's
        raise AotconvError(f"target '{target.name}': no matching OpenCL device is present; "
                           f"tuning runs on the device itself")
    precision = getattr(args, "precision", None) or "fp32"
    net = _stored(net, precision)
    if precision != "fp32":                             # fp16: its layers store half
        _check_storage(net, target, precision, args.layer)
    with BuildContext.make(target, mode="tune", budget=args.budget, strategy=args.strategy,
                           tuning_db=args.tuning_db, quiet=args.quiet,
                           json_progress=args.json, jobs=args.jobs, seed=args.seed,
                           where=getattr(args, "where", None), precision=precision,
                           recheck=getattr(args, "recheck", None)) as ctx:
        own, converts = _named_layers(net, ctx, args.layer)
        pools = _fused_pools(net, args.layer)
        rows = {}
        choices = choose(net, ctx, only=own) if own is None or own else {}
        rows.update((n, (net.layer(n), c)) for n, c in choices.items())
        if own is None:
            rows.update(_after_network(net, choices, ctx, args.quiet, set(rows)))
        elif converts:
            rows.update(_search(_conversions_net(net, converts), ctx, args.quiet,
                                set(rows))[1])
        if pools:
            from ..passes import fuse_pool
            rows.update(_search(fuse_pool(net, pools), ctx, args.quiet, set(rows), pools)[1])
    if args.json:
        print(json.dumps({"event": "summary", "target": target.name,
                          "layers": {n: summary_row(l, c, target)
                                     for n, (l, c) in rows.items()}}, default=str))
    else:
        print(summary_table(rows, target))
    return 0


def _stored(net, precision):
    """`net` as a build of `precision` stores it (fp16: its layers store half)."""
    if precision == "fp32":
        return net
    from ..precision import stored
    return stored(net, precision)


def _check_storage(net, target, precision, names=None):
    """Before any work: every layer of `net` (those `names` only, where given) is served by a
    variant that stores what `precision` stores (precision.check_storage's one-line error)."""
    from ..context import with_precision
    from ..ops import is_alias
    from ..precision import check_storage
    check_storage([l for l in net.layers if not is_alias(l) and (not names or l.name in names)],
                  with_precision(target, precision))


def check_layer_names(args, load=None):
    """`tune --layer NAME`, before any work: every name must be a layer of the network as it is
    tuned (after the fusion passes) or a layout conversion a build of it from the records
    inserts (an fp16 build's `input_to_fp16`, ...); else a one-line error listing both."""
    from ..context import BuildContext
    from ..targets import get_target
    precision = getattr(args, "precision", None) or "fp32"
    net = _stored(_load(load, args.net, args.batch), precision)
    known = {l.name for l in net.layers}
    _fused_pools(net, args.layer)
    if all(n in known or "+" in n for n in args.layer):
        return
    if precision != "fp32":              # the conversions follow from every layer's choice
        _check_storage(net, get_target(args.target), precision)
    with BuildContext.make(args.target, mode="records", tuning_db=args.tuning_db, quiet=True,
                           precision=precision) as ctx:
        _named_layers(net, ctx, args.layer)


def _fused_pools(net, names):
    """The convs of the `conv+pool` pairs among --layer `names` (the conv_pool layers a build
    measures where the conv's pool may fold into it, passes.fusable_pools); a pair that is
    not one is a one-line error listing the network's."""
    from ..passes import fusable_pools
    pairs = dict(fusable_pools(net))
    convs = []
    for n in names or ():
        if "+" not in n:
            continue
        conv, _, pool = n.partition("+")
        if pairs.get(conv) != pool:
            have = ", ".join(f"{c}+{p}" for c, p in pairs.items()) or "none"
            raise AotconvError(f"--layer {n}: not a conv and the pool that may fold into it; "
                               f"network '{net.name}' has: {have}")
        convs.append(conv)
    return list(dict.fromkeys(convs))


def _named_layers(net, ctx, names):
    """(network layers to tune, [conversion layers to tune]) for --layer `names` (the
    `conv+pool` pairs aside: _fused_pools): (None, []) when there are none (the whole
    network, and what a build measures after it)."""
    if not names:
        return None, []
    names = [n for n in names if "+" not in n]
    if not names:                                   # conv+pool pairs only
        return [], []
    known = [l.name for l in net.layers]
    rest = [n for n in names if n not in known]
    converts = recorded_conversions(net, ctx) if rest else []
    by_name = {l.name: l for l in converts}
    for n in rest:
        if n not in by_name:
            also = (f"; the layout conversions a build inserts: "
                    f"{', '.join(by_name)}" if by_name else
                    "; a build of it inserts no layout conversion")
            raise AotconvError(f"--layer {n}: network '{net.name}' has no layer '{n}' (after "
                               f"fusion); its layers are: {', '.join(known)}{also}")
    return [n for n in names if n in known], [by_name[n] for n in dict.fromkeys(rest)]


def recorded_conversions(net, ctx):
    """The layout_convert layers a build of `net` (stored as it builds it) inserts with the
    choices the records of BuildContext `ctx` give (each layer's fastest recorded point, its
    fallback where none), before fusion and the layout plan: what `--layer` may name. Nothing
    is measured."""
    from ..choose import Choice
    from ..layouts import insert_conversions
    from ..ops import is_alias
    from .search import records_only, unique_layers
    groups = unique_layers([l for l in net.layers if not is_alias(l)])
    found = records_only(groups, ctx.target, ctx.store, ctx.device, borrow=True)
    choices = {}
    for g in groups:
        r = found[g[0].signature_str()]
        cand = r.best or r.fallback
        choices.update((l.name, Choice(cand.variant, cand.cfg)) for l in g)
    return insert_conversions(net, choices)[1]


def _after_network(net, choices, ctx, quiet, taken):
    """{row: (layer, Choice)} of what a build measures after the network's search, as the
    build does it (compiler._schedule): the pools and residual adds fused into their conv,
    where worth measuring, then the depthwise convs into the pointwise conv after them; the layout plan (the conversions it prices are measured through
    choose); the layout_convert layers the plan's choices need. Each search shares the
    context's budget (a time budget's one clock, each measuring nothing where it has no room
    left, as in a build; a trial budget as a build's later searches take it). A fused layer's
    row is named after it and what it took in (`c1+s2`)."""
    from .. import fusion, layouts
    rows = {}

    def choose_only(n, only):
        got, more = _search(n, ctx, quiet, taken | set(rows), only)
        rows.update(more)
        return got

    net, choices, _ = fusion.apply(net, choices, ctx.profile, "measure", ctx.mode, choose_only)
    net, choices, _ = fusion.apply_residual(net, choices, ctx.profile, "measure", ctx.mode,
                                            choose_only)
    net, choices, _ = fusion.apply_dwpw(net, choices, ctx.profile, "measure", ctx.mode,
                                        choose_only)
    choices, _ = layouts.plan_network(net, choices, ctx)
    _, new = layouts.insert_conversions(net, choices)
    if new:
        rows.update(_search(_conversions_net(net, new), ctx, quiet, taken | set(rows))[1])
    return rows


def _conversions_net(net, layers):
    """A Network of the conversion `layers` alone, to choose them as the build does."""
    from ..graph import Network
    return Network(net.name, net.input_shape, layers, [layers[-1].name])


def _search(net, ctx, quiet, taken, only=None):
    """({layer: Choice}, {row: (layer, Choice)}) of the layers `only` (default all) of `net`
    chosen with `ctx`; nothing where a time budget has no room left for them after the
    searches before. A row is the layer's name, or where that is `taken` the name and what was
    fused into it."""
    from ..choose import choose
    only = [l.name for l in net.layers] if only is None else list(only)
    if not _time_for(ctx, net, only, quiet):
        return {}, {}
    got, rows = choose(net, ctx, only=only), {}
    for n, c in got.items():
        l = net.layer(n)
        rows[n if n not in taken else "+".join([n, *l.fused])] = (l, c)
    return got, rows


def _time_for(ctx, net, only, quiet):
    """Whether a search of the layers `only` of `net` after the first one fits in what a time
    budget has left (each unique layer measured once at least), as a build judges it
    (compiler._time_for); when it does not, says so on stderr (unless quiet)."""
    from .search import Clock, unique_layers
    clock = ctx.budget
    if not isinstance(clock, Clock) or not ctx.tuning or not clock.searches:
        return True
    layers = [l for l in net.layers if l.name in only]
    unique = [g[0] for g in unique_layers(layers)]
    if clock.affords(unique):
        return True
    if not quiet:
        k, what = len(unique), "/".join(sorted({l.op for l in layers}))
        print(f"aotconv: budget {clock.budget}: no time left to measure {k} {what} "
              f"layer{'s' if k != 1 else ''} after the network's search: not measured "
              f"({', '.join(only)})", file=sys.stderr, flush=True)
    return False


def summary_row(layer, c, target):
    st = c.stats
    g = c.gflops
    return {"op": layer.op, "variant": c.variant, "cfg": dict(c.cfg.items), "source": c.source,
            "time_ms": c.time_ms, "gflops": g,
            "peak_pct": 100 * g / target.peak_gflops if g and target.peak_gflops else None,
            "space": st.space, "pruned": st.pruned, "tried": st.tried,
            "failed": st.failed, "wrong": st.wrong, "fallback_ms": st.fallback_ms,
            "speedup": c.speedup}


def summary_table(rows_in, target):
    """The table `aotconv tune` prints: one row per {name: (layer, Choice)}."""
    rows = [("layer", "op", "variant", "parameters", "ms", "GFLOP/s", "%peak",
             "tried", "pruned", "failed", "wrong", "vs fallback")]
    for name, (layer, c) in rows_in.items():
        r = summary_row(layer, c, target)
        rows.append((name, r["op"], c.variant, str(c.cfg),
                     f"{c.time_ms:.4g}" if c.time_ms else "-",
                     f"{r['gflops']:.1f}" if r["gflops"] else "-",
                     f"{r['peak_pct']:.1f}" if r["peak_pct"] else "-",
                     str(r["tried"]), f"{r['pruned']}/{r['space']}", str(r["failed"]),
                     str(r["wrong"]), f"{r['speedup']:.2f}x" if r["speedup"] else "-"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(x.ljust(w[i]) for i, x in enumerate(r)).rstrip() for r in rows)


def main(argv=None):
    """Stand-alone entry (python -m aotconv.tune.cli) until the top-level CLI calls us."""
    import argparse
    p = argparse.ArgumentParser(prog="aotconv")
    add_commands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except AotconvError as e:
        print(f"aotconv: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

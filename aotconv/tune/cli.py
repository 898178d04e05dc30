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
        subparsers, "tune", "tune only this layer (repeatable)",
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
    p.add_argument("--jobs", "-j", type=int, help="parallel compiles (default: every core)")
    p.add_argument("--seed", type=int, default=0, help="seed of the search (default 0)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="progress as JSON lines on stderr")
    p.add_argument("--where", action="append", metavar="VARIANT:KNOB=V/V,...",
                   help="search only this variant, and of its points only those whose knobs "
                        "take these values, e.g. conv_igemm:VW=4,LAYOUT=NCHW/CHWN "
                        "(repeatable; layers it does not implement are searched as usual)")


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
    from ..choose import choose
    from ..targets import get_target, find_device
    net = _load(load, args.net, args.batch)
    target = get_target(args.target)
    if find_device(target) is None and not os.environ.get("AOTCONV_RAY"):   # --ray: a farm's
        raise AotconvError(f"target '{target.name}': no matching OpenCL device is present; "
                           f"tuning runs on the device itself")
    if args.layer:
        for n in args.layer:
            net.layer(n)
    precision = getattr(args, "precision", None) or "fp32"
    if precision != "fp32":                             # fp16: its layers store half
        from ..context import with_precision
        from ..ops import is_alias
        from ..precision import check_storage, stored
        net = stored(net, precision)
        check_storage([l for l in net.layers if not is_alias(l)
                       and (not args.layer or l.name in args.layer)],
                      with_precision(target, precision))
    choices = choose(net, target, mode="tune", budget=args.budget, strategy=args.strategy,
                     tuning_db=args.tuning_db, quiet=args.quiet, json_progress=args.json,
                     jobs=args.jobs, seed=args.seed, only=args.layer,
                     where=getattr(args, "where", None),
                     precision=precision)
    if args.json:
        print(json.dumps({"event": "summary", "target": target.name,
                          "layers": {n: summary_row(net.layer(n), c, target)
                                     for n, c in choices.items()}}, default=str))
    else:
        print(summary_table(net, choices, target))
    return 0


def summary_row(layer, c, target):
    st = c.stats
    g = c.gflops
    return {"op": layer.op, "variant": c.variant, "cfg": dict(c.cfg.items), "source": c.source,
            "time_ms": c.time_ms, "gflops": g,
            "peak_pct": 100 * g / target.peak_gflops if g and target.peak_gflops else None,
            "space": st.space, "pruned": st.pruned, "tried": st.tried,
            "failed": st.failed, "wrong": st.wrong, "fallback_ms": st.fallback_ms,
            "speedup": c.speedup}


def summary_table(net, choices, target):
    rows = [("layer", "op", "variant", "parameters", "ms", "GFLOP/s", "%peak",
             "tried", "pruned", "failed", "wrong", "vs fallback")]
    for name, c in choices.items():
        r = summary_row(net.layer(name), c, target)
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

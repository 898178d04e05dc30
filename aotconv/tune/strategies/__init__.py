"""The search strategies: one module per strategy, one line per strategy in STRATEGIES.

Every strategy is `search(grid, evaluate, rng, **options)`; see base.py for the contract.
Options are given on the command line as `name:key=value,key=value` (`annealing:T=6`,
`pso:S=6`); unknown strategies and unknown options raise.
"""
import inspect

from ...errors import AotconvError
from . import exhaustive, random_search, annealing, pso, model
from .base import Evaluator, Exhausted

STRATEGIES = {
    "exhaustive": exhaustive.search,
    "random": random_search.search,
    "annealing": annealing.search,
    "pso": pso.search,
    "model": model.search,
}
DEFAULT = "model"


def parse(spec):
    """'annealing:T=6' -> ('annealing', {'T': 6.0}); checks the name and the options."""
    name, _, rest = str(spec).partition(":")
    name = name.strip()
    if name not in STRATEGIES:
        raise AotconvError(f"unknown strategy '{name}'; choose one of: {', '.join(STRATEGIES)}")
    params = inspect.signature(STRATEGIES[name]).parameters
    allowed = [p for p in params if p not in ("grid", "evaluate", "rng")]
    opts = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq or k not in allowed:
            raise AotconvError(f"strategy '{name}': unknown option '{item}'; it takes "
                               f"{', '.join(allowed) or 'no options'} (as key=value)")
        default = params[k].default
        try:
            if default is None:
                opts[k] = int(v) if v.lstrip("-").isdigit() else float(v)
            else:
                opts[k] = type(default)(v)
        except ValueError:
            raise AotconvError(f"strategy '{name}': option {k} needs a "
                               f"{type(default).__name__}, got '{v}'") from None
    return name, opts


def run(spec, grid, evaluate, rng):
    """Run strategy `spec` until the evaluator says the budget is spent."""
    name, opts = parse(spec)
    try:
        STRATEGIES[name](grid, evaluate, rng, **opts)
    except Exhausted:
        pass

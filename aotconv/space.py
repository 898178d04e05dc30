"""The search space of one layer on one target: enumerate each variant's knobs, prune, explain.

A point is a `Candidate` (variant name, Config). Each variant's unpruned space is the product of
its knobs; its own constraints (BEAST's algorithm / software / hardware levels) and the target's
device limits (aotconv.variants.limits: added for every variant; their names and index-width
helpers are importable from here too) prune it. Every constraint is counted two ways:
`first` (the points it was the first to reject, in level order: these add up to the pruned
total) and `alone` (every point that violates it, whatever else does).

`Grid` gives the strategies a uniform geometry over the survivors of all variants: one integer
coordinate per dimension ("variant" plus the union of the knobs, -1 where a variant lacks a
knob), Hamming neighbours and the nearest valid point.
"""
from dataclasses import dataclass, field
import math

import numpy as np

from .precision import reason as precision_reason
from .variants import active
from .variants.base import Config, Partial, Unbound, Variant
from .variants.limits import (INDEX_LIMIT, constraints_of, device_constraints,  # noqa: F401
                              index_extents, index_stride, indices_fit, own_constraints,
                              tensor_extents, variant_buffers_fit)


@dataclass(frozen=True)
class Candidate:
    variant: str
    cfg: Config

    def __str__(self):
        return f"{self.variant}[{self.cfg}]"


# -- one variant's space ----------------------------------------------------------------------

@dataclass
class VariantSpace:
    variant: object
    knobs: list
    total: int
    points: list                    # surviving Configs, in knob order
    constraints: list               # in the order they were applied
    first: dict                     # constraint name -> points it was first to reject
    alone: dict                     # constraint name -> points violating it
    errors: dict = field(default_factory=dict)   # constraint name -> first exception text
    enumerated: bool = True         # False: `points` are only those checked one by one

    @property
    def pruned(self):
        return self.total - len(self.points) if self.enumerated else 0


def variant_space(layer, variant, target, explain=True):
    """Enumerate and prune `variant`'s space for `layer` under `target`.

    explain=True checks every constraint on every point of the product: `first` counts the
    points each constraint was first to reject in level order, `alone` every violation
    (`aotconv space`). explain=False (the search) prunes while it enumerates (`_staged`): the
    survivors are the same, in the same order, `first` counts what each constraint pruned in
    that walk, `alone` is left empty, and big spaces take a fraction of the time."""
    cons = constraints_of(variant, target)
    if not explain and type(variant).configs is Variant.configs:
        return _staged(layer, variant, target, cons)
    first = {c.name: 0 for c in cons}
    alone = {c.name: 0 for c in cons}
    errors = {}
    points, total = [], 0
    for cfg in variant.configs(layer, target):
        total += 1
        failed = None
        for c in cons:
            try:
                ok = bool(c.check(layer, cfg, target))
            except Exception as e:         # a constraint that cannot judge a point rejects it
                ok = False
                errors.setdefault(c.name, f"{type(e).__name__}: {e}")
            if not ok:
                alone[c.name] += 1
                if failed is None:
                    failed = c.name
                    first[c.name] += 1
                if not explain:
                    break
        if failed is None:
            points.append(cfg)
    return VariantSpace(variant, list(variant.knobs(layer, target)), total, points, cons,
                        first, alone if explain else {}, errors)


def _staged(layer, variant, target, cons):
    """variant_space(explain=False): walk the product of the knobs depth first, in knob order,
    and judge each constraint as soon as the knobs it reads are set, so one verdict prunes a
    whole subtree. A constraint that reads an unset knob waits until that knob is set; one that
    fails otherwise on a partial point waits for the whole point, where an exception rejects
    the point as in the full walk. The constraints are pure functions of (layer, knobs read,
    target), so a verdict on the knobs it read holds for every completion: the survivors are
    exactly those of the full walk, in the same order."""
    knobs = list(variant.knobs(layer, target))
    names = frozenset(k.name for k in knobs)
    depth_of = {k.name: i for i, k in enumerate(knobs)}
    n = len(knobs)
    below = [1] * (n + 1)                    # points under a node of depth d
    for d in range(n - 1, -1, -1):
        below[d] = below[d + 1] * len(knobs[d].values)
    first = {c.name: 0 for c in cons}
    errors = {}
    points = []

    def judge(d, items, pending):
        """Judge the pending constraints that can judge at depth d: None when one prunes the
        node, else those still waiting (a point at the full depth is kept)."""
        cfg = Config(items) if d == n else Partial(items, names, knobs[-1].name)
        later = []
        for wait, c in pending:
            if wait > d:
                later.append((wait, c))
                continue
            try:
                ok = bool(c.check(layer, cfg, target))
            except Unbound as u:
                later.append((depth_of[u.name] + 1, c))
                continue
            except Exception as e:
                if d < n:                    # maybe only the unset knobs are missing
                    later.append((n, c))
                    continue
                ok = False
                errors.setdefault(c.name, f"{type(e).__name__}: {e}")
            if not ok:
                first[c.name] += below[d]
                return None
        if d == n:
            points.append(cfg)
        return later

    def walk(d, items, pending):
        pending = judge(d, items, pending)
        if pending is None or d == n:
            return
        name, values = knobs[d].name, knobs[d].values
        for v in values:
            walk(d + 1, items + ((name, v),), pending)

    walk(0, (), [(0, c) for c in cons])
    return VariantSpace(variant, knobs, below[0], points, cons, first, {}, errors)


def point_ok(layer, variant, cfg, target):
    """Is `cfg` a point of `variant`'s pruned space? (One point, without enumerating.)"""
    knobs = variant.knobs(layer, target)
    if [k for k, _ in cfg.items] != [k.name for k in knobs]:
        return False
    if any(v not in k.values for (_, v), k in zip(cfg.items, knobs)):
        return False
    for c in constraints_of(variant, target):
        try:
            if not c.check(layer, cfg, target):
                return False
        except Exception:
            return False
    return True


def fallback_point(layer, variant, target):
    """`variant`'s fallback for `layer` if it is a point of its pruned space, else None: a
    variant none of whose points survives for this layer has no fallback, whether its
    fallback() says so (NoFallback) or returns a point the constraints reject."""
    try:
        cfg = variant.fallback(layer, target)
    except Exception:                  # as for a constraint: what cannot be judged is rejected
        return None
    return cfg if point_ok(layer, variant, cfg, target) else None


def why_pruned(space):
    """Why an enumerated LayerSpace has no point: per variant, the constraints that pruned it
    (most points first), and what to do when the index width is among them."""
    parts, index = [], False
    for p in space.parts:
        top = sorted((n for n, k in p.first.items() if k), key=lambda n: -p.first[n])
        index = index or "device.index_width" in top
        parts.append(f"{p.variant.name} by {', '.join(top[:3]) or 'nothing'}")
    text = "pruned: " + "; ".join(parts)
    if index:
        text += (". The layer's padding, scratch or work-item ids pass the 32-bit indices of the "
                 "kernels (device.index_width): use a smaller batch")
    return text


def checked_space(layer, target, cfgs):
    """A LayerSpace of given points only ({variant name: [Config]}), each checked with
    point_ok: what records-only choices need, in milliseconds instead of an enumeration."""
    parts = []
    for v in active():
        if v.supports(layer) is not None or precision_reason(v, target) is not None:
            continue
        knobs = list(v.knobs(layer, target))
        total = 1
        for k in knobs:
            total *= len(k.values)
        pts = [c for c in cfgs.get(v.name, ()) if point_ok(layer, v, c, target)]
        parts.append(VariantSpace(v, knobs, total, pts, [], {}, {}, enumerated=False))
    return LayerSpace(layer, target, parts, [])


# -- restricting a search (`--where`) ----------------------------------------------------------

def parse_where(texts):
    """{variant: {knob: (value text, ...)}} from `--where` texts 'VARIANT:KNOB=V/V,KNOB=V'
    (e.g. 'conv_igemm:VW=4,LAYOUT=NCHW/CHWN'); the same variant or knob named twice merges
    (the values of a knob add up)."""
    from .errors import AotconvError
    from .variants import BY_NAME
    out = {}
    for text in texts or ():
        name, sep, rest = text.partition(":")
        name = name.strip()
        if name not in BY_NAME:
            raise AotconvError(f"--where '{text}': no variant '{name}'; variants: "
                               f"{', '.join(sorted(BY_NAME))}")
        knobs = out.setdefault(name, {})
        for part in filter(None, (x.strip() for x in rest.split(","))) if sep else ():
            knob, eq, vals = part.partition("=")
            values = tuple(v.strip() for v in vals.split("/") if v.strip())
            if not eq or not knob.strip() or not values:
                raise AotconvError(f"--where '{text}': '{part}' is not KNOB=VALUE[/VALUE...]")
            knobs[knob.strip()] = tuple(dict.fromkeys(knobs.get(knob.strip(), ()) + values))
    return out


def restrict(space, where):
    """`space` searched only over the variants `where` names and, of theirs, the points whose
    knobs take the listed values. A layer that none of those variants implements keeps its
    whole space (a pooling layer of a network tuned with `--where conv_igemm:...`)."""
    from .errors import AotconvError
    if not where or not any(p.variant.name in where for p in space.parts):
        return space
    parts = []
    for p in space.parts:
        if p.variant.name not in where:
            continue
        names = {k.name for k in p.knobs}
        wanted = where[p.variant.name]
        unknown = sorted(set(wanted) - names)
        if unknown:
            raise AotconvError(f"--where {p.variant.name}: no knob {', '.join(unknown)}; its "
                               f"knobs: {', '.join(k.name for k in p.knobs)}")
        pts = [c for c in p.points
               if all(str(c[k]) in vals for k, vals in wanted.items())]
        parts.append(VariantSpace(p.variant, p.knobs, p.total, pts, p.constraints, p.first,
                                  p.alone, p.errors, p.enumerated))
    if not any(p.points for p in parts):
        named = ", ".join(f"{n}:" + ",".join(f"{k}={'/'.join(v)}" for k, v in w.items())
                          for n, w in where.items())
        raise AotconvError(f"layer '{space.layer.name}': no valid point of {named} (--where); "
                           f"see `aotconv space` for the values its constraints allow")
    return LayerSpace(space.layer, space.target, parts, space.unsupported)


# -- a layer's space --------------------------------------------------------------------------

@dataclass
class LayerSpace:
    layer: object
    target: object
    parts: list                     # VariantSpace per supporting variant
    unsupported: list               # (variant name, reason)

    @property
    def candidates(self):
        return [Candidate(p.variant.name, cfg) for p in self.parts for cfg in p.points]

    @property
    def total(self):
        return sum(p.total for p in self.parts)

    @property
    def pruned(self):
        return sum(p.pruned for p in self.parts)

    def grid(self):
        return Grid(self.candidates)


def layer_space(layer, target, variants=None, explain=False):
    """The spaces of every variant that supports `layer` (or of `variants`, when given);
    explain=True also counts every constraint's violations (`aotconv space`)."""
    parts, unsupported = [], []
    for v in (active() if variants is None else variants):
        why = v.supports(layer) or precision_reason(v, target)
        if why is None:
            parts.append(variant_space(layer, v, target, explain))
        elif variants is not None or layer.op in v.ops:
            unsupported.append((v.name, why))
    return LayerSpace(layer, target, parts, unsupported)


def enumerate_plain(layers, target):
    """[(parts, unsupported)] of each layer's pruned space as plain, picklable data (the
    constraints hold lambdas; `layer_spaces` rebuilds them)."""
    out = []
    for layer in layers:
        sp = layer_space(layer, target)
        out.append(([(p.variant.name, p.total, [c.items for c in p.points], p.first, p.errors)
                     for p in sp.parts], sp.unsupported))
    return out


# below this many layers the worker processes' start-up (importing numpy and aotconv, about a
# second each) costs more than it saves
PARALLEL_MIN_LAYERS = 4


def layer_spaces(layers, target, jobs=None):
    """[LayerSpace] of several layers, the same as [layer_space(l, target) for l in layers],
    enumerated by `jobs` worker processes (default: one per core) when there are enough
    layers: the big spaces take seconds each, a 43-layer set minutes on one core. The
    workers are fresh interpreters (`python -m aotconv._space_worker`), so the caller's script
    is never re-imported; if they fail, the enumeration runs here."""
    import os
    jobs = min(jobs or os.cpu_count() or 1, len(layers))
    if jobs <= 1 or len(layers) < PARALLEL_MIN_LAYERS:
        return [layer_space(l, target) for l in layers]
    try:
        done = _enumerate_in_workers(layers, target, jobs)
    except Exception as e:                       # the workers are an optimisation only
        import warnings
        warnings.warn(f"parallel space enumeration failed ({type(e).__name__}: {e}); "
                      f"enumerating in this process")
        return [layer_space(l, target) for l in layers]
    from .variants import BY_NAME
    out = []
    for layer, (parts, unsupported) in zip(layers, done):
        vs = []
        for name, total, points, first, errors in parts:
            v = BY_NAME[name]
            vs.append(VariantSpace(v, list(v.knobs(layer, target)), total,
                                   [Config(items) for items in points],
                                   constraints_of(v, target), first, {}, errors))
        out.append(LayerSpace(layer, target, vs, unsupported))
    return out


def _enumerate_in_workers(layers, target, jobs):
    import os
    import pickle
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    chunks = [list(range(i, len(layers), jobs)) for i in range(jobs)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)      # where `aotconv` is importable
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    def one(idx):
        r = subprocess.run([sys.executable, "-m", "aotconv._space_worker"],
                           input=pickle.dumps(([layers[i] for i in idx], target)),
                           capture_output=True, env=env, check=False)
        if r.returncode != 0:
            last = r.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(last[0] if last else f"exit status {r.returncode}")
        return pickle.loads(r.stdout)

    done = [None] * len(layers)
    with ThreadPoolExecutor(jobs) as ex:
        for idx, res in zip(chunks, ex.map(one, chunks)):
            for i, r in zip(idx, res):
                done[i] = r
    return done


def report(space, exact=True):
    """Text for `aotconv space`: sizes before and after pruning and each constraint's toll.
    exact=True: `space` was enumerated with explain=True ('first' and 'alone' per constraint);
    exact=False: by the search's staged walk ('pruned': what each constraint removed there)."""
    l, t = space.layer, space.target
    shape = " + ".join("x".join(map(str, s)) for s in l.in_shapes)
    lines = [f"layer {l.name}: {l.op} {shape} -> {'x'.join(map(str, l.out_shape))}"
             f"  on {t.name} (max work-group {t.max_wg_size}, local memory {t.local_mem_bytes} B)"]
    for p in space.parts:
        kn = ", ".join(f"{k.name} {list(k.values)}" for k in p.knobs)
        pct = 100.0 * p.pruned / p.total if p.total else 0.0
        lines.append(f"  variant {p.variant.name}: {p.total} points -> {len(p.points)} after "
                     f"pruning ({p.pruned} pruned, {pct:.1f}%)")
        lines.append(f"    knobs: {kn}")
        if p.constraints:
            counts = f"{'first':>7s} {'alone':>7s}" if exact else f"{'pruned':>8s}"
            lines.append(f"    {'constraint':32s} {'level':9s} {counts}  reason")
        for c in p.constraints:
            counts = (f"{p.first[c.name]:7d} {p.alone[c.name]:7d}" if exact
                      else f"{p.first[c.name]:8d}")
            lines.append(f"    {c.name:32s} {c.level:9s} {counts}  {c.reason}")
            if c.name in p.errors:
                lines.append(f"      (raised on some points: {p.errors[c.name]})")
    for name, why in space.unsupported:
        lines.append(f"  variant {name}: not applicable ({why})")
    lines.append(f"  total: {space.total} points -> {len(space.candidates)} candidates "
                 f"({space.pruned} pruned)")
    if exact:
        lines.append("  'first' counts the points a constraint was first to reject (they add up "
                     "to the pruned total); 'alone' every point that violates it.")
    else:
        lines.append("  'pruned' counts the points each constraint removed in the search's "
                     "walk, which judges a constraint as soon as the knobs it reads are set "
                     "(they add up to the pruned total); --exact checks every constraint on "
                     "every point ('first' in level order, 'alone'), minutes for conv_igemm.")
    return "\n".join(lines)


# -- geometry for the strategies --------------------------------------------------------------

def _sort_values(vals):
    try:
        return sorted(vals)
    except TypeError:
        return sorted(vals, key=repr)


class Grid:
    """Integer coordinates of candidates: dimension 0 is the variant, then the union of knobs."""

    def __init__(self, candidates):
        self.points = list(candidates)
        self.index = {c: i for i, c in enumerate(self.points)}
        # the points come in runs of one variant whose configs share a knob order: build the
        # coordinates column by column per run (a 150k-point space in a fraction of a second)
        runs, names = [], []
        for i, c in enumerate(self.points):
            keys = tuple(k for k, _ in c.cfg.items)
            if runs and runs[-1][0] == (c.variant, keys):
                continue
            runs.append(((c.variant, keys), i))
            names.extend(k for k in keys if k not in names)
        bounds = [i for _, i in runs] + [len(self.points)]
        self.dims = ["variant"] + names
        col = {k: j for j, k in enumerate(names, start=1)}
        seen = [set() for _ in self.dims]
        columns = []                    # (start, stop, dim, values of the run)
        for ((variant, keys), start), stop in zip(runs, bounds[1:]):
            seen[0].add(variant)
            for pos, k in enumerate(keys):
                vals = [c.cfg.items[pos][1] for c in self.points[start:stop]]
                seen[col[k]].update(vals)
                columns.append((start, stop, col[k], vals))
        self.values = [_sort_values(v) for v in seen]
        codes = [{v: i for i, v in enumerate(vs)} for vs in self.values]
        m = np.full((len(self.points), len(self.dims)), -1, dtype=np.int32)
        for ((variant, _), start), stop in zip(runs, bounds[1:]):
            m[start:stop, 0] = codes[0][variant]
        for start, stop, j, vals in columns:
            code = codes[j]
            m[start:stop, j] = [code[v] for v in vals]
        self.coords = m

    def __len__(self):
        return len(self.points)

    def distance(self, coord):
        """Per-point distance to `coord`: differing dimensions, a missing knob counting as one."""
        return (self.coords != np.asarray(coord)[None, :]).sum(axis=1)

    def neighbours(self, i):
        """Points that differ from point i in one knob, or only in the variant (shared knobs
        equal): CLTune's neighbourhood, extended across variants."""
        c = self.coords[i]
        both = (self.coords >= 0) & (c[None, :] >= 0)
        diff = ((self.coords != c[None, :]) & both)
        diff[:, 0] = self.coords[:, 0] != c[0]
        knob_diff = diff[:, 1:].sum(axis=1)
        same_var = ~diff[:, 0]
        n = np.nonzero((same_var & (knob_diff == 1)) | (~same_var & (knob_diff == 0)))[0]
        return n

    def nearest(self, coord, rng, exclude=()):
        """A valid point closest to a (possibly invalid) coordinate vector; ties broken at random."""
        d = self.distance(coord).astype(float)
        if exclude:
            d[list(exclude)] = math.inf
        best = np.nonzero(d == d.min())[0]
        return int(best[rng.integers(len(best))])

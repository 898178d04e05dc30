"""The search space of one layer on one target: enumerate each variant's knobs, prune, explain.

A point is a `Candidate` (variant name, Config). Each variant's unpruned space is the product of
its knobs; its own constraints (BEAST's algorithm / software / hardware levels) and the target's
device limits (aotconv.variants.limits: added for every variant; their names and index-width
helpers are importable from here too) prune it. Every constraint is counted two ways:
`first` (the points it was the first to reject, in level order: these add up to the pruned
total) and `alone` (every point that violates it, whatever else does); the search counts
`first` as its staged walk prunes instead (variant_space). aotconv.space_enum computes both
without visiting the product's points one by one, and holds the survivors as `Points`;
`Candidates` are a layer's, made where they are read.

`Grid` gives the strategies a uniform geometry over the survivors of all variants: one integer
coordinate per dimension ("variant" plus the union of the knobs, -1 where a variant lacks a
knob), Hamming neighbours and the nearest valid point.
"""
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
import bisect
import contextlib
import math
import operator

import numpy as np

from .precision import reason as precision_reason
from .variants import active
from .space_enum import ListEquality, Points, judge
from .variants.base import Config, Variant
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

    @property
    def members(self):
        """The points as a collection that answers `cfg in` at once (Points look a point up by
        its knob values; a list becomes a set), without making every Config."""
        return self.points if isinstance(self.points, Points) else set(self.points)


def variant_space(layer, variant, target, explain=True):
    """Enumerate and prune `variant`'s space for `layer` under `target`.

    explain=True counts as a check of every constraint on every point of the product would:
    `first` the points each constraint was first to reject in level order, `alone` every
    violation (`aotconv space --exact`). explain=False (the search) counts as the staged walk
    does, which judges each constraint as soon as the knobs it reads are set: the survivors
    are the same, in the same order, `first` counts what each constraint pruned in that walk,
    `alone` is left empty. Both are computed by aotconv.space_enum, which judges a constraint
    once per combination of the knobs it reads, not once per point; the survivors are a
    `Points` sequence, made into Configs where they are read."""
    cons = constraints_of(variant, target)
    knobs = list(variant.knobs(layer, target))
    if type(variant).configs is Variant.configs:
        j = judge(layer, variant, target, cons, knobs, exact=explain)
        return VariantSpace(variant, knobs, j.total, Points(knobs, j.survivors), cons, j.first,
                            j.alone if explain else {}, j.errors)
    # a variant whose points are not the product of its knobs: judged point by point
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
    return VariantSpace(variant, knobs, total, points, cons, first,
                        alone if explain else {}, errors)


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
        pts = _where_points(p, wanted)
        parts.append(VariantSpace(p.variant, p.knobs, p.total, pts, p.constraints, p.first,
                                  p.alone, p.errors, p.enumerated))
    if not any(p.points for p in parts):
        named = ", ".join(f"{n}:" + ",".join(f"{k}={'/'.join(v)}" for k, v in w.items())
                          for n, w in where.items())
        raise AotconvError(f"layer '{space.layer.name}': no valid point of {named} (--where); "
                           f"see `aotconv space` for the values its constraints allow")
    return LayerSpace(space.layer, space.target, parts, space.unsupported,
                      {**(space.where or {}), **where})


def projected(space, variant, cfg):
    """The point of the narrowed `space` nearest a recorded point `cfg` of `variant` that lies
    outside it: each knob that `--where` narrowed and whose value it does not list takes the
    first value listed, the other knobs keep theirs. None where the space was not narrowed, the
    variant is not searched, or that point breaks a constraint (it is not in the space). Under
    `--where conv_mma_f16:EPI=1`, a layer's fastest EPI=0 records become the same points with
    EPI=1: what a search restricted to a new knob value should measure first."""
    wanted = (space.where or {}).get(variant)
    part = next((p for p in space.parts if p.variant.name == variant), None)
    if not wanted or part is None:
        return None
    values = {k.name: k.values for k in part.knobs}
    items = []
    for name, v in cfg.items:
        listed = wanted.get(name)
        if listed and str(v) not in listed:
            v = next((x for x in values.get(name, ()) if str(x) == listed[0]), None)
            if v is None:
                return None
        items.append((name, v))
    out = Config(tuple(items))
    return out if out != cfg and out in part.members else None


def restrict_layouts(space, read, write):
    """`space` narrowed to the points that read their input and write their output stored as
    `read` and `write` store them (layouts.same_storage: at batch 1, CHWN is NCHW): the layout
    plan's refinement searches a layer in the layouts its neighbours chose. A variant with a
    LAYOUT knob keeps the values that do; one without keeps its whole part or none. A space
    with no such point is returned whole (nothing to narrow to)."""
    from .layouts import same_storage
    layer = space.layer

    def fits(lay):
        r, w = lay
        return same_storage(layer.in_shape, r, read) and same_storage(layer.out_shape, w, write)
    parts = []
    for p in space.parts:
        names = [k.name for k in p.knobs]
        if "LAYOUT" in names:
            knob = p.knobs[names.index("LAYOUT")]
            vals = tuple(str(v) for v in knob.values
                         if fits(p.variant.layouts_of(layer, {"LAYOUT": v})))
            if not vals:
                continue
            pts = _where_points(p, {"LAYOUT": vals})
        else:
            first = Candidates([(p.variant.name, p.points)])
            if not len(first) or not fits(p.variant.layouts_of(layer, first[0].cfg)):
                continue
            pts = p.points
        if len(pts):
            parts.append(VariantSpace(p.variant, p.knobs, p.total, pts, p.constraints, p.first,
                                      p.alone, p.errors, p.enumerated))
    if not parts:
        return space
    return LayerSpace(space.layer, space.target, parts, space.unsupported, space.where)


def _where_points(part, wanted):
    """The points of `part` whose knobs take the values (as text) `wanted` lists."""
    if not isinstance(part.points, Points):
        return [c for c in part.points if all(str(c[k]) in vals for k, vals in wanted.items())]
    keep = np.ones(len(part.points), dtype=bool)
    cols = part.points.columns()
    for j, k in enumerate(part.knobs):
        if k.name in wanted:
            ok = np.array([str(v) in wanted[k.name] for v in k.values], dtype=bool)
            keep &= ok[cols[j]]
    return part.points.subset(keep)


# -- a layer's space --------------------------------------------------------------------------

@dataclass
class LayerSpace:
    layer: object
    target: object
    parts: list                     # VariantSpace per supporting variant
    unsupported: list               # (variant name, reason)
    where: dict = None              # the --where it was narrowed by (restrict), else None

    @property
    def candidates(self):
        """Every variant's points as Candidates, variant after variant: a list, whose
        Candidates are made where they are read (`Candidates`)."""
        return Candidates([(p.variant.name, p.points) for p in self.parts])

    @property
    def total(self):
        return sum(p.total for p in self.parts)

    @property
    def pruned(self):
        return sum(p.pruned for p in self.parts)

    def grid(self):
        return Grid(self.candidates)


def supporting(layer, target, variants=None):
    """(the variants of `variants`, default every active one, that may search `layer` under
    `target`, [(variant name, why not)] of the others that name its op (all of `variants`'
    others, when given)): what `layer_space` enumerates, found without enumerating."""
    parts, unsupported = [], []
    for v in (active() if variants is None else variants):
        why = v.supports(layer) or precision_reason(v, target)
        if why is None:
            parts.append(v)
        elif variants is not None or layer.op in v.ops:
            unsupported.append((v.name, why))
    return parts, unsupported


def layer_space(layer, target, variants=None, explain=False):
    """The spaces of every variant that supports `layer` (or of `variants`, when given);
    explain=True also counts every constraint's violations (`aotconv space`)."""
    vs, unsupported = supporting(layer, target, variants)
    return LayerSpace(layer, target, [variant_space(layer, v, target, explain) for v in vs],
                      unsupported)


def enumerate_plain(layers, target):
    """[(parts, unsupported)] of each layer's pruned space as plain, picklable data (the
    constraints hold lambdas; `layer_spaces` rebuilds them): per variant its name, size, the
    survivors' flat indices into its knob product, `first` and `errors`."""
    out = []
    for layer in layers:
        sp = layer_space(layer, target)
        out.append(([(p.variant.name, p.total, p.points.flat if isinstance(p.points, Points)
                      else [c.items for c in p.points], p.first, p.errors)
                     for p in sp.parts], sp.unsupported))
    return out


def _rebuilt(layer, target, plain):
    """The LayerSpace of `layer` from enumerate_plain's data of it."""
    from .variants import BY_NAME
    parts, unsupported = plain
    vs = []
    for name, total, flat, first, errors in parts:
        v = BY_NAME[name]
        knobs = list(v.knobs(layer, target))
        pts = (Points(knobs, flat) if isinstance(flat, np.ndarray)
               else [Config(items) for items in flat])
        vs.append(VariantSpace(v, knobs, total, pts, constraints_of(v, target), first, {},
                               errors))
    return LayerSpace(layer, target, vs, unsupported)


# below this many layers the worker processes' start-up (importing numpy and aotconv, about a
# second each) costs more than it saves
PARALLEL_MIN_LAYERS = 4


def layer_spaces(layers, target, jobs=None):
    """The spaces of several layers, the same as [layer_space(l, target) for l in layers], as a
    `Spaces` sequence that enumerates them while its caller goes on: `spaces[i]` waits for
    layer i's alone. With enough layers `jobs` worker processes (default: one per core) take
    the layers one at a time in their order, the first layers first (the big spaces take
    seconds each, a 43-layer set minutes on one core); with fewer, a layer is enumerated here
    when it is first asked for. The workers are fresh interpreters (`python -m
    aotconv._space_worker`), so the caller's script is never re-imported; if they fail, the
    layers they left are enumerated here. They start when the sequence is first read, or at
    its `start()`."""
    import os
    layers = list(layers)
    jobs = min(jobs or os.cpu_count() or 1, len(layers))
    if jobs <= 1 or len(layers) < PARALLEL_MIN_LAYERS:
        jobs = 0
    return Spaces(layers, target, jobs)


class Spaces(Sequence):
    """The pruned spaces of `layers`, enumerated by `jobs` worker processes (0: here, each
    when first asked for) while the caller goes on. Layers are handed to the workers one at a
    time in order (a layer asked for that no worker has taken yet goes next), so the first
    layers' spaces come first and a search may start on them while the rest are enumerated.

    The workers start at `start()` or when the sequence is first read. `gate`: a callable
    whose context a worker holds while it enumerates a layer (default none): a CPU device's
    measurer keeps its timings apart from it, as from its compiles. `seconds(i)`: what layer
    i's enumeration took, in its worker. `close()` stops the workers; a sequence read to its
    end needs none (they end with their last layer)."""

    def __init__(self, layers, target, jobs=0, gate=None):
        import threading
        self.layers, self.target = list(layers), target
        self.jobs = jobs
        self.gate = gate or contextlib.nullcontext
        self._done = {}                  # index -> LayerSpace (rebuilt) or plain data
        self._seconds = {}               # index -> seconds of its enumeration
        self._todo = list(range(len(self.layers)))
        self._cv = threading.Condition()
        self._live = 0                   # workers running
        self._started = False
        self._failure = None             # the first worker's failure, as text
        self._warned = False
        self._closed = False
        self._procs = []

    def start(self, jobs=None, gate=None):
        """Start the workers (at most `jobs`, where given and the sequence has workers), each
        holding `gate` while it enumerates a layer; nothing once they have started."""
        import threading
        with self._cv:
            if self._started:
                return self
            self._started = True
            if jobs is not None and self.jobs:
                self.jobs = max(1, min(self.jobs, jobs))
            if gate is not None:
                self.gate = gate
            self._live = self.jobs
        for k in range(self.jobs):
            threading.Thread(target=self._work, daemon=True,
                             name=f"aotconv-space-{k}").start()
        return self

    @classmethod
    def of(cls, spaces, seconds=0.0):
        """Spaces already enumerated, `seconds` in all (shared evenly among them)."""
        out = cls([sp.layer for sp in spaces], None, 0)
        out._done = dict(enumerate(spaces))
        out._seconds = {i: seconds / max(1, len(spaces)) for i in range(len(spaces))}
        out._todo, out._started = [], True
        return out

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        self.start()
        with self._cv:
            if i in self._todo:          # asked for before a worker took it: it goes next
                self._todo.remove(i)
                self._todo.insert(0, i)
            while i not in self._done and self._live > 0 and not self._closed:
                self._cv.wait()
            got = self._done.get(i)
            here = got is None
            if here and self._live <= 0 and self._failure and not self._warned:
                self._warned = True
                import warnings
                warnings.warn(f"parallel space enumeration failed ({self._failure}); "
                              f"enumerating the rest in this process")
            if here and i in self._todo:
                self._todo.remove(i)
        if here:                         # no workers (or none left): enumerate it here
            import time
            with self.gate():
                t0 = time.perf_counter()
                got = layer_space(self.layers[i], self.target)
                took = time.perf_counter() - t0
            with self._cv:
                self._done[i], self._seconds[i] = got, took
                self._cv.notify_all()
        elif not isinstance(got, LayerSpace):
            got = _rebuilt(self.layers[i], self.target, got)
            with self._cv:
                self._done[i] = got
        return got

    def ready(self, i):
        """Whether layer i's space is there (reading it will not wait)."""
        self.start()
        with self._cv:
            return i in self._done

    def seconds(self, i):
        """Seconds layer i's enumeration took (None before it is done)."""
        with self._cv:
            return self._seconds.get(i)

    def close(self):
        """Stop the workers (the layers not enumerated yet are, if asked for, here)."""
        with self._cv:
            self._closed = True
            self._todo = []
            procs, self._procs = self._procs, []
            self._cv.notify_all()
        for p in procs:
            p.kill()
            p.wait()

    def _next(self):
        with self._cv:
            return None if self._closed or not self._todo else self._todo.pop(0)

    def _work(self):
        """One worker process's thread: hand it the next layer, wait for its space, again."""
        import os
        import pickle
        import subprocess
        import sys
        import tempfile
        from pathlib import Path
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)      # where `aotconv` is importable
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        i, proc = None, None
        with tempfile.TemporaryFile() as err:
            try:
                i = self._next()
                if i is None:
                    return
                proc = subprocess.Popen([sys.executable, "-m", "aotconv._space_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=err, env=env)
                with self._cv:
                    if self._closed:
                        proc.kill()
                        proc.wait()
                        return
                    self._procs.append(proc)
                pickle.dump(self.target, proc.stdin)
                while i is not None:
                    with self.gate():
                        pickle.dump(self.layers[i], proc.stdin)
                        proc.stdin.flush()
                        plain, took = pickle.load(proc.stdout)
                    with self._cv:
                        self._done[i], self._seconds[i] = plain, took
                        self._cv.notify_all()
                    i = self._next()
                proc.stdin.close()
                proc.wait()
            except Exception as e:       # the workers are an optimisation only
                if proc is not None:
                    proc.kill()
                    proc.wait()
                    err.seek(0)
                    last = err.read().decode(errors="replace").strip().splitlines()[-1:]
                    why = last[0] if last else f"exit status {proc.returncode}"
                else:
                    why = f"{type(e).__name__}: {e}"
                with self._cv:
                    if i is not None and i not in self._done and not self._closed:
                        self._todo.insert(0, i)          # another worker, or the caller
                    if not self._closed:
                        self._failure = self._failure or why
            finally:
                with self._cv:
                    if proc in self._procs:
                        self._procs.remove(proc)
                    self._live -= 1          # a caller waiting on no worker enumerates here
                    self._cv.notify_all()


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


# -- a layer's candidates, made where they are read --------------------------------------------

class Candidates(ListEquality, MutableSequence):
    """The Candidates of several variants' points ([(variant name, points)]), variant after
    variant, made one by one where they are read; a change (append, insert...) makes them all
    into a list of its own first."""

    def __init__(self, parts):
        self.parts = [(name, pts) for name, pts in parts if len(pts)]
        self.starts = []
        n = 0
        for _, pts in self.parts:
            self.starts.append(n)
            n += len(pts)
        self._n = n
        self._list = None

    def _all(self):
        if self._list is None:
            self._list = [Candidate(name, c) for name, pts in self.parts for c in pts]
        return self._list

    def __len__(self):
        return self._n if self._list is None else len(self._list)

    def __getitem__(self, i):
        if self._list is not None or isinstance(i, slice):
            return self._all()[i]
        i = operator.index(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("candidate index out of range")
        k = bisect.bisect_right(self.starts, i) - 1
        name, pts = self.parts[k]
        return Candidate(name, pts[i - self.starts[k]])

    def position(self, cand):
        """The index of `cand`, or None when it is not one of the candidates."""
        if self._list is not None or type(cand) is not Candidate:
            try:
                return self._all().index(cand)
            except ValueError:
                return None
        for (name, pts), start in zip(self.parts, self.starts):
            if name == cand.variant:
                at = (pts.position(cand.cfg) if isinstance(pts, Points)
                      else _list_position(pts, cand.cfg))
                if at is not None:
                    return start + at
        return None

    def __contains__(self, cand):
        return self.position(cand) is not None

    def index(self, cand, *args):
        at = None if args else self.position(cand)
        return self._all().index(cand, *args) if at is None else at

    def __iter__(self):
        return iter(self._all())

    def __add__(self, other):
        return self._all() + list(other) if isinstance(other, (list, Candidates)) \
            else NotImplemented

    def __radd__(self, other):
        return list(other) + self._all() if isinstance(other, list) else NotImplemented

    def copy(self):
        return list(self._all())

    def sort(self, **kw):
        self._all().sort(**kw)

    def __repr__(self):
        return f"Candidates({len(self)})"

    def __setitem__(self, i, value):
        self._all()[i] = value

    def __delitem__(self, i):
        del self._all()[i]

    def insert(self, i, value):
        self._all().insert(i, value)


def _list_position(points, cfg):
    try:
        return points.index(cfg)
    except ValueError:
        return None


class _GridIndex(Mapping):
    """Grid.index of a grid over `Candidates`: a candidate's index, found from its knob values
    (no dict of every point)."""

    def __init__(self, cands):
        self._cands = cands

    def __getitem__(self, cand):
        at = self._cands.position(cand)
        if at is None:
            raise KeyError(cand)
        return at

    def __iter__(self):
        return iter(self._cands)

    def __len__(self):
        return len(self._cands)


# -- geometry for the strategies --------------------------------------------------------------

def _sort_values(vals):
    try:
        return sorted(vals)
    except TypeError:
        return sorted(vals, key=repr)


class Grid:
    """Integer coordinates of candidates: dimension 0 is the variant, then the union of knobs."""

    def __init__(self, candidates):
        if (isinstance(candidates, Candidates) and candidates._list is None
                and all(isinstance(pts, Points) for _, pts in candidates.parts)):
            self._of_points(candidates)
            return
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

    def _of_points(self, cands):
        """The same grid from Candidates whose points are all `Points`: the coordinates from
        their knob value indices with numpy; points and index made where they are read."""
        self.points = cands
        self.index = _GridIndex(cands)
        names = []
        for _, pts in cands.parts:
            names.extend(k.name for k in pts.knobs if k.name not in names)
        self.dims = ["variant"] + names
        col = {k: j for j, k in enumerate(names, start=1)}
        seen = [set() for _ in self.dims]
        columns = [pts.columns() for _, pts in cands.parts]
        for (name, pts), cols in zip(cands.parts, columns):
            seen[0].add(name)
            for k, c in zip(pts.knobs, cols):
                # the values in the order the points first take them, as a walk would add them
                present, at = np.unique(c, return_index=True)
                seen[col[k.name]].update(k.values[i] for i in present[np.argsort(at)])
        self.values = [_sort_values(v) for v in seen]
        codes = [{v: i for i, v in enumerate(vs)} for vs in self.values]
        m = np.full((len(cands), len(self.dims)), -1, dtype=np.int32)
        for (name, pts), cols, start in zip(cands.parts, columns, cands.starts):
            stop = start + len(pts)
            m[start:stop, 0] = codes[0][name]
            for k, c in zip(pts.knobs, cols):
                code = codes[col[k.name]]
                lut = np.array([code.get(v, -1) for v in k.values], dtype=np.int32)
                m[start:stop, col[k.name]] = lut[c]
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

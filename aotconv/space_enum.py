"""Judge a variant's constraints over its whole knob grid without visiting the points one by one.

A constraint is a pure function of (layer, the knobs it reads, target). So it is judged on
*probes*: a probe holds only the knobs the constraint has read so far; when it reads another
one, the probe is split into one probe per value of that knob and the constraint runs again on
each. A constraint is thus judged once per combination of the knobs it actually reads (on
conv_igemm's 4.1 million points: its launch geometry reads 7 of the 13 knobs, a tile rule 3),
and each verdict holds for a box of the grid, the knobs it did not read free. numpy combines
the boxes over the grid (a small integer per point), and the survivors are its points that no
constraint rejected, in knob order: the points a walk of the product would keep, in its order.

The counts are those of the two walks aotconv.space defines:

- staged (the search, `aotconv space`): a constraint judges a point at the depth where the
  knobs it reads are set (a probe of depth d holds the first d knobs; reading a later one is
  `Unbound`, and the constraint waits for that knob, as in the walk; any other exception on a
  partial point waits for the whole point, where it rejects the point). A point is charged to
  the constraint that judges it false at the smallest depth, the first in order among those at
  that depth: the node of the walk that it prunes. A probe whose points are all charged already
  to an earlier verdict is not judged further.
- exact (`aotconv space --exact`): every constraint on every whole point; a point is charged
  to the first constraint in order that rejects it (`first`), and every violation is counted
  (`alone`).

A constraint that raises on a whole point rejects it; the first such point (in knob order)
that the constraint is charged with (exact: any) gives its text in `errors`, as in the walks.

What several constraints compute from one point (its launches, buffers, register estimate:
`variants.base.traced`) is remembered while a space is judged, by the knobs it read, so that
each combination's launches are computed once. `Points` holds the survivors as flat indices
into the product and makes their Configs where they are read.
"""
from collections.abc import Sequence
from dataclasses import dataclass
import math
import operator

import numpy as np

from .variants.base import Config, Partial, Unbound

# a space of more points is judged in chunks of its leading knobs, each of at most this many
CHUNK = 1 << 24

_MISSING = object()


class _Need(BaseException):
    """A probe was asked for a knob it does not hold yet: split it over that knob's values.
    A BaseException, so that a constraint's own `except Exception` cannot take it for a
    verdict."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _Unset(Unbound):
    """Unbound raised by a probe's read of a knob that is not set yet: the constraint reads
    that knob next, so the probe is split over its values at the depth where it is set."""


class _Knobs:
    """A variant's knob grid: names in order, each knob's position and values; while it is
    judged, the memo of `traced` values its probes share."""

    def __init__(self, knobs):
        self.names = tuple(k.name for k in knobs)
        self.values = [tuple(k.values) for k in knobs]
        self.pos = {name: i for i, name in enumerate(self.names)}
        self.shape = tuple(len(v) for v in self.values)
        self.n = len(self.names)
        self.last = self.names[-1] if self.names else None
        self.nameset = frozenset(self.names)
        self.memo = {}
        self.live = True            # False once judged: its probes are stale points


class _Leaf:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Probe(Config):
    """A whole point of which only the knobs read so far are known (`_vals`); the first `_d`
    knobs are set (a whole point: all of them). Reading a set knob not known yet raises _Need;
    reading one not set (a partial point: `_PartialProbe`) raises Unbound, as Partial does.
    Two probes are never equal, so no memo keyed on points mistakes one for another."""

    def __init__(self, grid, vals, d):
        self.__dict__.update(_g=grid, _vals=vals, _d=d, _recs=None)

    def _read(self, name, default=_MISSING):
        v = self._vals.get(name, _MISSING)
        if v is not _MISSING:
            if self._recs:
                for rec in self._recs:
                    if name not in rec[1]:
                        rec[1].add(name)
                        rec[0].append((name, v))
            return v
        pos = self._g.pos.get(name)
        if pos is None:                              # not a knob: as a Config's missing key
            if default is _MISSING:
                raise KeyError(name)
            return default
        if pos < self._d:
            raise _Need(name)
        raise _Unset(name)

    def _force(self):
        """Every set knob's value (what reading the whole point needs)."""
        self._asked()
        return tuple((name, self._read(name)) for name in self._g.names[:self._d])

    def __getitem__(self, name):
        if not self._recs:
            try:
                return self._vals[name]
            except KeyError:
                pass
        return self._read(name)

    def get(self, name, default=None):
        return self._read(name, default)

    def _traced(self, key, fn):
        """base.traced on a probe: fn's value, remembered by the knobs fn read, in order, and
        their values. The memo of a key holds, per sequence of knobs fn has been seen to read,
        a table from their values to fn's value (one lookup when the probe holds those knobs),
        and a trie of the reads, which raises _Need (or Unbound) where fn itself would when
        the probe lacks a knob fn reads. A value holds at every depth, unless fn asked which
        knobs are set (membership, the items) or whether the point is whole (`whole()`): then
        at its own depth only."""
        memo, vals = self._g.memo, self._vals
        for entry in (memo.get(key), memo.get((key, self._d))):
            if entry is None:
                continue
            for names, get, table in entry[0]:
                try:
                    hit = table.get(get(vals), _MISSING)
                except KeyError:                     # the probe lacks one of them
                    continue
                if hit is not _MISSING:
                    if self._recs:
                        for n in names:
                            self._read(n)
                    return hit
            node = entry[1]
            while node is not None:                  # a trie walk: the reads fn would do
                if type(node) is _Leaf:
                    return node.value
                name, children = node
                v = vals.get(name, _MISSING)
                if v is _MISSING or self._recs:
                    v = self._read(name)
                node = children.get(v)
        rec = [[], set(), False]
        if self._recs is None:
            self.__dict__["_recs"] = []
        self._recs.append(rec)
        try:
            value = fn()
        finally:
            self._recs.remove(rec)
        trace, sensitive = rec[0], rec[2]
        if sensitive and self._recs:                 # what encloses fn asked too
            for outer in self._recs:
                outer[2] = True
        mkey = (key, self._d) if sensitive else key
        entry = memo.get(mkey)
        if entry is None:
            entry = memo[mkey] = [[], None, {}]
        if not trace:
            entry[1] = _Leaf(value)
            return value
        names = tuple(n for n, _ in trace)
        table = entry[2].get(names)
        if table is None:                            # a new sequence of reads
            table = entry[2][names] = {}
            entry[0].append((names, operator.itemgetter(*names), table))
        table[trace[0][1] if len(trace) == 1 else tuple(v for _, v in trace)] = value
        if entry[1] is None:
            entry[1] = (trace[0][0], {})
        node = entry[1]
        for i, (name, v) in enumerate(trace):
            children = node[1]
            if i + 1 == len(trace):
                children[v] = _Leaf(value)
                break
            nxt = children.get(v)
            if nxt is None:
                nxt = children[v] = (trace[i + 1][0], {})
            node = nxt
        return value

    def _asked(self):
        """fn asked which knobs are set: its value depends on the depth."""
        if self._recs:
            for rec in self._recs:
                rec[2] = True

    @property
    def items(self):
        return self._force()

    @property
    def _map(self):
        return dict(self._force())

    def as_dict(self):
        return _ProbeDict(self)

    def __eq__(self, other):
        # as a Config compares: a whole point equals a Config of the same items (which reads
        # every knob); two probes are two points (a memo of the last point sees a new one)
        # (a probe left in such a memo after its enumeration equals nothing)
        if other is self:
            return True
        if type(other) is Config and type(self) is _Probe and self._g.live:
            return self._force() == other.items
        return False

    def __hash__(self):
        return hash((self._force(),)) if self._g.live else id(self)

    def __str__(self):
        return ",".join(f"{k}={v}" for k, v in self._force()) or "-"

    def __repr__(self):
        return f"Config(items={self._force()!r})"


class _PartialProbe(_Probe, Partial):
    """A probe of a partial point (the staged walk before its last knob): `whole()` sees a
    Partial and waits for the whole point."""

    @property
    def _names(self):
        return self._g.nameset

    @property
    def _last(self):
        return self._g.last


class _ProbeDict(dict):
    """`as_dict()` of a probe: a key is read from the probe when asked for; what needs every
    key (iteration, items, length, copies) reads every set knob first."""

    def __init__(self, probe):
        super().__init__()
        self._p = probe

    def __missing__(self, key):
        return self._p._read(key)

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return self._p._read(key, default)

    def __contains__(self, key):
        if dict.__contains__(self, key):
            return True
        self._p._asked()
        pos = self._p._g.pos.get(key)
        return pos is not None and pos < self._p._d

    def _all(self):
        for k, v in self._p._force():
            if not dict.__contains__(self, k):
                dict.__setitem__(self, k, v)
        return self

    def __iter__(self):
        return dict.__iter__(self._all())

    def keys(self):
        return dict.keys(self._all())

    def items(self):
        return dict.items(self._all())

    def values(self):
        return dict.values(self._all())

    def __len__(self):
        return dict.__len__(self._all())

    def copy(self):
        return dict(self._all())

    def __reversed__(self):
        return dict.__reversed__(self._all())

    def __eq__(self, other):
        return dict.__eq__(self._all(), other)

    def __ne__(self, other):
        return dict.__ne__(self._all(), other)

    def __or__(self, other):
        return dict.__or__(dict(self._all()), other)

    def __ror__(self, other):
        return dict.__ror__(dict(self._all()), other)

    __hash__ = None

    def __repr__(self):
        return dict.__repr__(self._all())

    def pop(self, key, *default):
        return dict.pop(self._all(), key, *default)

    def popitem(self):
        return dict.popitem(self._all())

    def setdefault(self, key, default=None):
        return dict.setdefault(self._all(), key, default)


@dataclass
class Judged:
    """One variant's space judged: the survivors as flat indices into the knob product (C
    order: the last knob fastest), what each constraint was charged with, the errors."""
    grid: _Knobs
    total: int
    survivors: np.ndarray          # int64, ascending
    first: dict                    # constraint name -> points charged to it
    alone: dict                    # exact only: constraint name -> points violating it
    errors: dict                   # constraint name -> text of the exception it raised


def judge(layer, variant, target, cons, knobs, exact=False):
    """Judge `cons` (constraints_of order) over the product of `knobs`: a Judged with the
    counts of the staged walk (exact=False) or of every constraint on every point (True)."""
    grid = _Knobs(knobs)
    total = math.prod(grid.shape)
    first = {c.name: 0 for c in cons}
    alone = {c.name: 0 for c in cons} if exact else {}
    errors = {}
    survivors = []
    if not total:
        return Judged(grid, 0, np.zeros(0, dtype=np.int64), first, alone, errors)
    # chunks: fix the leading knobs until a chunk holds at most CHUNK points
    lead, size = 0, total
    while size > CHUNK and lead < grid.n:
        size //= grid.shape[lead]
        lead += 1
    try:
        for fixed in np.ndindex(*grid.shape[:lead]) if lead else [()]:
            _judge_chunk(layer, target, cons, grid, fixed, exact, first, alone, errors,
                         survivors)
    finally:
        # the last probes stay referenced from the constraints' own caches (a point's
        # geometry): let the memo they reach go with this enumeration
        grid.memo = {}
        grid.live = False
    alive = (np.concatenate(survivors) if survivors else np.zeros(0, dtype=np.int64))
    return Judged(grid, total, alive, first, alone, errors)


def _judge_chunk(layer, target, cons, grid, fixed, exact, first, alone, errors, survivors):
    """Judge the points whose leading knobs take the value indices `fixed`; add to the counts,
    the errors not found yet and the survivors (flat indices into the whole product)."""
    n, lead = grid.n, len(fixed)
    stride = 1
    for s in grid.shape[lead:]:
        stride *= s
    offset = 0
    for j, i in enumerate(fixed):
        offset = offset * grid.shape[j] + i
    offset *= stride
    shape = (1,) * lead + grid.shape[lead:]
    ncons = len(cons) + 1
    never = (n + 1) * ncons                      # a point no constraint rejected
    dtype = np.int16 if never < np.iinfo(np.int16).max else np.int32
    charged = np.full(shape or (1,), never, dtype=dtype)
    # the chunk's leading knobs are not known at the root: a probe is split over them, as over
    # any knob, where a constraint reads them (the depth it is judged at stays the walk's), but
    # into the chunk's one value
    root_vals = {}
    root_box = ((slice(0, 1),) * lead) + ((slice(None),) * (n - lead))
    if not shape:                                # no knobs: one point, the empty Config
        root_box = (slice(None),)
    failed = {}                                  # constraint index -> [(box, text)] that raised

    axes = tuple(range(len(charged.shape)))
    # box[j] of a probe that holds knob j's i-th value, and the axes to reduce to split on j
    picks = [[slice(i, i + 1) for i in range(len(vals))] for vals in grid.values]
    for j, i in enumerate(fixed):
        picks[j] = {i: slice(0, 1)}
    others = [axes[:j] + axes[j + 1:] for j in range(grid.n)]
    for ci, c in enumerate(cons):
        check = c.check
        raised = []
        # (knob values read, box of the grid, depth, whether the box is known to matter)
        stack = [(root_vals, root_box, n if exact else 0, exact)]
        pop, push = stack.pop, stack.append
        while stack:
            vals, box, d, live = pop()
            if not live and charged[box].max() < d * ncons + ci:
                continue                         # every point charged at a shallower node
            text = None
            try:
                ok = bool(check(layer, (_Probe if d >= n else _PartialProbe)(grid, vals, d),
                                target))
            except (_Need, _Unset) as need:
                # split over the knob read; a knob not set yet (_Unset) is set, and read,
                # at the depth past it: the constraint waits for it, as in the staged walk
                name = need.name
                j = grid.pos[name]
                if j >= d:
                    d = j + 1
                values = grid.values[j]
                if j < lead:                     # a leading knob: the chunk's value
                    keep = [fixed[j]] if exact or charged[box].max() >= d * ncons + ci else []
                elif exact:
                    keep = range(len(values))
                else:                            # the values under which a point matters
                    bound = d * ncons + ci
                    keep = [i for i, m in enumerate(charged[box].max(axis=others[j]).tolist())
                            if m >= bound]
                head, tail, pick = box[:j], box[j + 1:], picks[j]
                for i in keep:
                    sub = vals.copy()
                    sub[name] = values[i]
                    push((sub, head + (pick[i],) + tail, d, True))
                continue
            except Unbound as u:                 # whole(): wait for the whole point
                push((vals, box, grid.pos[u.name] + 1, exact))
                continue
            except Exception as e:               # noqa: BLE001 -- a verdict, as in the walks
                if d < n:                        # maybe only the unset knobs are missing
                    push((vals, box, n, exact))
                    continue
                ok, text = False, f"{type(e).__name__}: {e}"
            if ok:
                continue
            view = charged[box]
            np.minimum(view, (ci if exact else d * ncons + ci), out=view)
            if exact:
                alone[c.name] += view.size
            if text is not None:
                raised.append((box, text))
        if raised:
            failed[ci] = raised

    flat = charged.reshape(-1)
    rejected = flat != never
    if rejected.any():
        counts = np.bincount(flat[rejected] % ncons, minlength=ncons)
        for ci, c in enumerate(cons):
            first[c.name] += int(counts[ci])
    survivors.append(np.flatnonzero(~rejected).astype(np.int64) + offset)
    for ci, raised in failed.items():
        name = cons[ci].name
        if name in errors:                       # an earlier chunk's point came first
            continue
        best = None
        for box, text in raised:
            at = _first_charged(charged, box, None if exact else n * ncons + ci)
            if at is not None and (best is None or at < best[0]):
                best = (at, text)
        if best is not None:
            errors[name] = best[1]


def _first_charged(charged, box, key):
    """Flat index (in `charged`) of the first point of `box` charged with `key` (None: the
    box's first point)."""
    starts = [s.start or 0 for s in box]
    if key is not None:
        hit = charged[box] == key
        if not hit.any():
            return None
        local = np.unravel_index(int(np.argmax(hit)), hit.shape)
        starts = [a + b for a, b in zip(starts, local)]
    return int(np.ravel_multi_index(starts, charged.shape))


class ListEquality:
    """Equality of a list-like sequence held in some other form: equal to one of its own kind
    or to a list of the same items in the same order (`_all()`: the items as a list); not
    hashable, as a list is not."""

    def __eq__(self, other):
        if isinstance(other, type(self)):
            return self._all() == other._all()
        if isinstance(other, list):
            return self._all() == other
        return NotImplemented

    __hash__ = None


class Points(ListEquality, Sequence):
    """A variant's surviving points, in knob order, held as their flat indices into the knob
    product (one integer each) and made into Configs only where they are read: a search reads
    a few hundred of a space's 10^5 points, and looks the others up by their knob values
    (`position`). Equal to a list of the same Configs; iterating makes (and keeps) them all."""

    def __init__(self, knobs, flat):
        self.knobs = list(knobs)
        self.flat = np.asarray(flat, dtype=np.int64)
        self._list = None
        self._lookup = None
        self._g = None

    def _grid(self):
        if self._g is None:
            self._g = _Knobs(self.knobs)
        return self._g

    def __len__(self):
        return len(self.flat)

    def columns(self):
        """Per knob, the index of each point's value among the knob's values."""
        g = self._grid()
        if not g.n:
            return ()
        return np.unravel_index(self.flat, g.shape)

    def _make(self, flat):
        g = self._grid()
        if not len(flat):
            return []
        if not g.n:
            return [Config(()) for _ in range(len(flat))]
        per = [[(name, v) for v in vals] for name, vals in zip(g.names, g.values)]
        cols = np.unravel_index(flat, g.shape)
        rows = zip(*([pairs[i] for i in col.tolist()] for pairs, col in zip(per, cols)))
        return [Config(items) for items in rows]

    def _all(self):
        if self._list is None:
            self._list = self._make(self.flat)
        return self._list

    def __getitem__(self, i):
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return self._make(self.flat[i])
        n = len(self.flat)
        i = operator.index(i)
        if not -n <= i < n:
            raise IndexError("point index out of range")
        return self._make(self.flat[i:i + 1] if i >= 0 else self.flat[n + i:n + i + 1])[0]

    def __iter__(self):
        return iter(self._all())

    def __reversed__(self):
        return reversed(self._all())

    def position(self, cfg):
        """The index of `cfg` among the points, or None when it is not one of them."""
        if type(cfg) is not Config:          # a Config equals only a Config (dataclass eq)
            return None
        if self._lookup is None:
            g = self._grid()
            luts = [{} for _ in g.values]
            unique = True
            for lut, vals in zip(luts, g.values):
                for i, v in enumerate(vals):
                    if v in lut:
                        unique = False
                    lut.setdefault(v, i)
            # a knob listing equal values twice: its points repeat, so look them up as a dict
            # of the points would (the last of equal points)
            self._lookup = (g, luts) if unique else {c: i for i, c in enumerate(self._all())}
        if isinstance(self._lookup, dict):
            try:
                return self._lookup.get(cfg)
            except TypeError:
                return None
        g, luts = self._lookup
        items = cfg.items
        if len(items) != g.n:
            return None
        flat = 0
        for (name, v), want, lut, size in zip(items, g.names, luts, g.shape):
            if name != want:
                return None
            try:
                i = lut.get(v)
            except TypeError:                # an unhashable value is no knob's value
                return None
            if i is None:
                return None
            flat = flat * size + i
        at = int(np.searchsorted(self.flat, flat))
        return at if at < len(self.flat) and self.flat[at] == flat else None

    def __contains__(self, cfg):
        return self.position(cfg) is not None

    def index(self, cfg, *args):
        at = self.position(cfg)
        if at is None or args:
            return self._all().index(cfg, *args)
        return at

    def __repr__(self):
        return f"Points({len(self)} of {math.prod(len(k.values) for k in self.knobs)})"

    def subset(self, mask):
        """The points where the boolean array `mask` is true, in order."""
        return Points(self.knobs, self.flat[np.asarray(mask, dtype=bool)])

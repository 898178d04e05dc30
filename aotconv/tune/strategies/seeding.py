"""What the records of similar layers say about a layer before any of its points is measured.

A layer's search used to start from nothing but its fallbacks. Records of other layers
measured on the same device usually hold the answer's neighbourhood: a 3x3 convolution of 64
channels on 56x56 and one of 64 channels on 28x28 like the same tiles. `Library` indexes the
records of one device by op signature and variant; `Library.hints(op, grid)` gives a layer's
search two things (`Hints`):

- seeds: the best points of the nearest signatures of the same op (per variant of the layer's
  space, nearest signature first, each mapped onto the layer's own grid: the same
  configuration where it is a valid point here, else the nearest valid point of the same
  variant), measured right after the layer's fallback (before the other variants');
- a prior for the cost model (`model`, its `prior` option): every ok record of those
  signatures as a training row, its time relative to the best of its signature,
  log(t / t_best), weighted by similarity, so the model ranks the grid before anything of
  this layer is measured.

Distance between two op signatures (Layer.signature_str) of the same op with the same number
of inputs (otherwise: not similar):

    d = sum over every dimension of the inputs' and the output's shapes of |log2(a / b)|
      + sum over every numeric attribute element (kernel, stride, pad, dilation, groups, out,
        ...) of |log2((a + 1) / (b + 1))|
      + 1 for every other attribute that differs or is missing on one side (act, bias, ...)

so halving the image (H and W of the input and of the output) costs 4, doubling a conv's
output channels 1 for the output shape plus 0.99 for its `out` attribute, and a 5x5 kernel
against a 3x3 about 1.2. The `NEIGHBOURS` nearest signatures within MAX_DISTANCE are used
(past it, in the study of docs/tuning.md, the records misled more searches than they helped);
from each, its `PER_SIGNATURE` fastest points (over the variants the layer's space has), the
nearest signature's best first.

Twins come before them all: the signatures that differ from the layer's only in the epilogue
(tune.records.twin_key: the bias, the fused activation, a fused residual add, which the
distance above counts as 1 each, or as not similar at all for a residual's extra input). They
are used whatever their number and distance (which is how many epilogue fields differ), and
their `PER_SIGNATURE` fastest points are the first seeds, fastest first: the first, where it
is a point of the layer's grid, is what a records-only build would borrow (records.borrow).
"""
import ast
from dataclasses import dataclass, field
import math
import re

import numpy as np

NEIGHBOURS = 3              # nearest similar signatures whose points are used
MAX_DISTANCE = 16.0         # beyond it a signature is not similar (docs/tuning.md, Seeded search)
PER_SIGNATURE = 2           # best points taken from each, per variant
MAX_SEEDS = 4               # seeds measured per layer (at most a quarter of its trials)

_ATTR = re.compile(r",(?=[A-Za-z_][A-Za-z_0-9]*=)")


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text                             # a bare word: act=relu


def parse_signature(op):
    """(op name, [input shapes], output shape, {attr: value}) of an op signature, or None."""
    try:
        name, ins, out, attrs = str(op).split("|", 3)
        shapes = [tuple(int(x) for x in s.split("x")) for s in ins.split("+")]
        out_shape = tuple(int(x) for x in out.split("x"))
        kv = dict(a.split("=", 1) for a in _ATTR.split(attrs)) if attrs else {}
    except ValueError:
        return None
    return name, shapes, out_shape, {k: _value(v) for k, v in kv.items()}


def _numbers(v):
    """The numeric elements of an attribute value, or None when it is not numeric."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return [float(v)]
    if isinstance(v, (tuple, list)) and v and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return None


def _log_ratio(a, b):
    if a <= 0 or b <= 0:
        return 0.0 if a == b else 1.0
    return abs(math.log2(a / b))


def distance(a, b):
    """The documented distance between two op signatures (text or parsed); inf when they are
    not the same op with the same number of inputs of the same rank."""
    a = parse_signature(a) if isinstance(a, str) else a
    b = parse_signature(b) if isinstance(b, str) else b
    if a is None or b is None or a[0] != b[0] or len(a[1]) != len(b[1]):
        return math.inf
    d = 0.0
    for sa, sb in zip(a[1] + [a[2]], b[1] + [b[2]]):
        if len(sa) != len(sb):
            return math.inf
        d += sum(_log_ratio(x, y) for x, y in zip(sa, sb))
    for k in set(a[3]) | set(b[3]):
        va, vb = a[3].get(k), b[3].get(k)
        na, nb = _numbers(va), _numbers(vb)
        if na is not None and nb is not None and len(na) == len(nb):
            d += sum(abs(math.log2((x + 1) / (y + 1))) if x > -1 and y > -1 else float(x != y)
                     for x, y in zip(na, nb))
        elif va != vb:
            d += 1.0
    return d


# -- a configuration on another layer's grid ---------------------------------------------------

def _nearest_code(values, v):
    """The code of `v` in a grid dimension's `values`: exact, else the nearest number by
    log ratio; -1 when it has no counterpart there."""
    try:
        return values.index(v)
    except ValueError:
        pass
    if _numbers(v) is None or len(_numbers(v)) != 1:
        return -1
    x = float(v)
    nums = [(i, float(u)) for i, u in enumerate(values)
            if _numbers(u) is not None and len(_numbers(u)) == 1]
    if not nums:
        return -1
    return min(nums, key=lambda iu: (_log_ratio(abs(x) + 1, abs(iu[1]) + 1), iu[0]))[0]


def coords_of(grid, variant, cfg):
    """The coordinate vector of (variant, cfg) in `grid`'s dimensions (space.Grid), values
    snapped to the nearest the grid has; None when the grid has no such variant."""
    try:
        v = grid.values[0].index(variant)
    except ValueError:
        return None
    items = dict(cfg.items)
    c = [v]
    for j, name in enumerate(grid.dims[1:], start=1):
        c.append(_nearest_code(grid.values[j], items[name]) if name in items else -1)
    return np.asarray(c, dtype=np.int32)


def snap(grid, variant, cfg, exclude=()):
    """The grid index of (variant, cfg): itself when it is a point, else the nearest point of
    the same variant (fewest differing dimensions, then the lowest index); None if none."""
    from ...space import Candidate
    i = grid.index.get(Candidate(variant, cfg))
    if i is not None:
        return None if i in exclude else i
    c = coords_of(grid, variant, cfg)
    if c is None:
        return None
    d = grid.distance(c).astype(float)
    d[grid.coords[:, 0] != c[0]] = math.inf
    if exclude:
        d[list(exclude)] = math.inf
    if not len(d) or not math.isfinite(d.min()):
        return None
    return int(np.argmin(d))


# -- what similar layers measured -----------------------------------------------------------------

_TEMPLATES = {}


def _template_hash(variant):
    """variant.template_hash(), once per process (it reads and hashes the template and the
    class's source)."""
    if variant.name not in _TEMPLATES:
        _TEMPLATES[variant.name] = variant.template_hash()
    return _TEMPLATES[variant.name]


@dataclass
class Hints:
    """Seeds and a cost-model prior for one layer's grid (see the module's docstring)."""
    seeds: list = field(default_factory=list)          # grid indices, best first
    coords: np.ndarray = None                          # prior rows: coordinates in the grid
    y: np.ndarray = None                               # log(t / best of its signature)
    w: np.ndarray = None                               # similarity weights
    sources: list = field(default_factory=list)        # [(distance, op)] that were used

    @property
    def has_prior(self):
        return self.y is not None and len(self.y) > 0


class Library:
    """Ok times of one device's records by op signature and variant: {op: {variant: {cfg: ms}}}
    (the fastest time of a configuration measured more than once)."""

    def __init__(self):
        self.by_op = {}
        self._parsed = {}
        self._twins = {}                       # op -> records.twin_key(op)

    def add(self, op, variant, cfg, time_ms):
        if time_ms is None or not (time_ms > 0) or not math.isfinite(time_ms):
            return
        d = self.by_op.setdefault(op, {}).setdefault(variant, {})
        d[cfg] = min(time_ms, d.get(cfg, math.inf))

    @classmethod
    def from_records(cls, records, device=None, target=None, version=None, templates=None):
        """From parsed records (tune.records.read_records): those measured on `device` (when
        given, else made for `target`), of aotconv `version` (when given) and, for a variant
        in `templates` ({variant: template hash}), of its current template."""
        from ..records import cfg_from_json
        lib = cls()
        for r in records:
            if r.get("status") != "ok":
                continue
            if device is not None and r.get("device") != device:
                continue
            if device is None and target is not None and r.get("target") != target:
                continue
            if version is not None and r.get("aotconv") != version:
                continue
            if templates and r.get("variant") in templates and \
                    r.get("template") != templates[r["variant"]]:
                continue
            try:
                lib.add(r["op"], r["variant"], cfg_from_json(r["cfg"]), r.get("time_ms"))
            except (KeyError, TypeError, ValueError):
                continue
        return lib

    @classmethod
    def from_store(cls, store, target, device, variants=None):
        """Every records file the store reads, filtered as a Key would (the device, or the
        target's name when the device is absent; this aotconv version; current templates),
        keeping only `variants` (names; default all)."""
        from ... import __version__
        from ...variants import BY_NAME
        from ..records import read_records
        records, seen = [], set()
        for p in list(store.read_paths) + list(store.write_paths):
            if p in seen or not p.is_file():
                continue
            seen.add(p)
            try:
                records.extend(r for r in read_records(p)[0]
                               if variants is None or r.get("variant") in variants)
            except OSError:
                continue
        names = {r.get("variant") for r in records} & set(BY_NAME)
        templates = {n: _template_hash(BY_NAME[n]) for n in names}
        return cls.from_records(records, device=device, target=target.name,
                                version=__version__, templates=templates)

    def _sig(self, op):
        if op not in self._parsed:
            self._parsed[op] = parse_signature(op)
        return self._parsed[op]

    def twins(self, op, variants=None):
        """[(distance, op)] of the other signatures that have ok records of any of `variants`
        (default: any) and differ from `op` only in the epilogue (records.twin_key: bias,
        activation, residual), the distance being how many epilogue fields differ; fewest
        first."""
        from ..records import epilogue_difference, twin_key
        if op not in self._twins:
            self._twins[op] = twin_key(op)
        key, out = self._twins[op], []
        if key is None or len(key) == 1:
            return out
        for other, byv in self.by_op.items():
            if other == op or (variants is not None and not set(byv) & set(variants)):
                continue
            if other not in self._twins:
                self._twins[other] = twin_key(other)
            if self._twins[other] == key:
                out.append((float(len(epilogue_difference(op, other).split(","))), other))
        return sorted(out)

    def nearest(self, op, k=NEIGHBOURS, variants=None, exclude=()):
        """[(distance, op)] of the k nearest other signatures (finite distance) that have ok
        records of any of `variants` (default: any), the ops in `exclude` left out."""
        me = self._sig(op)
        out = []
        for other, byv in self.by_op.items():
            if other == op or other in exclude or \
                    (variants is not None and not set(byv) & set(variants)):
                continue
            d = distance(me, self._sig(other))
            if d <= MAX_DISTANCE:
                out.append((d, other))
        out.sort()
        return out[:k]

    def hints(self, op, grid, k=NEIGHBOURS, per=PER_SIGNATURE, max_seeds=MAX_SEEDS,
              exclude=()):
        """Hints for the layer of signature `op` searching `grid` (space.Grid)."""
        variants = list(grid.values[0]) if len(grid) else []
        twins = self.twins(op, variants)
        near = twins + self.nearest(op, k, variants, exclude={o for _, o in twins})
        h = Hints(sources=near)
        if not near:
            return h
        taken = set(exclude)
        ranked = []                    # (not a twin, rank, distance, ...) of every candidate seed
        rows, ys, ws = [], [], []
        for i, (d, other) in enumerate(near):
            byv = self.by_op[other]
            best = min(t for v in variants for t in byv.get(v, {}).values())
            weight = 1.0 / (1.0 + d)
            pts = sorted(((t, v, cfg) for v in variants for cfg, t in byv.get(v, {}).items()),
                         key=lambda p: (p[0], p[1], str(p[2])))
            for rank, (t, v, cfg) in enumerate(pts):
                c = coords_of(grid, v, cfg)
                if c is None:
                    continue
                rows.append(c)
                ys.append(math.log(t / best))
                ws.append(weight)
                if rank < per:
                    order = (0, rank, t) if i < len(twins) else (1, rank, d, t / best)
                    ranked.append((order, v, cfg))
        # the twins' points first (the same shapes, another epilogue: the fastest is what a
        # records-only build borrows), fastest first; then every other signature's fastest,
        # nearest first, before any one's second
        ranked.sort(key=lambda r: r[0])
        for _, v, cfg in ranked:
            if len(h.seeds) >= max_seeds:
                break
            i = snap(grid, v, cfg, exclude=taken)
            if i is not None:
                h.seeds.append(i)
                taken.add(i)
        if rows:
            h.coords = np.vstack(rows)
            h.y, h.w = np.asarray(ys, dtype=float), np.asarray(ws, dtype=float)
        return h

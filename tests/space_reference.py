"""The space enumeration as it was before aotconv.space_enum: a walk over every point of the
knob product (exact) and the staged depth-first walk (the search's), kept here only as the
reference the tests compare the enumeration with. Slow: seconds to minutes on conv_igemm.

`reference_space(layer, variant, target, exact)` returns (total, [Config], first, alone, errors)
as aotconv.space.variant_space's VariantSpace holds them.
"""
import itertools

from aotconv.variants.base import Config, Partial, Unbound
from aotconv.variants.limits import constraints_of


def reference_space(layer, variant, target, exact=False):
    cons = constraints_of(variant, target)
    knobs = list(variant.knobs(layer, target))
    if exact:
        return _every_point(layer, knobs, target, cons)
    return _staged(layer, knobs, target, cons)


def _every_point(layer, knobs, target, cons):
    first = {c.name: 0 for c in cons}
    alone = {c.name: 0 for c in cons}
    errors = {}
    points, total = [], 0
    for values in itertools.product(*(k.values for k in knobs)):
        cfg = Config(tuple(zip((k.name for k in knobs), values)))
        total += 1
        failed = None
        for c in cons:
            try:
                ok = bool(c.check(layer, cfg, target))
            except Exception as e:
                ok = False
                errors.setdefault(c.name, f"{type(e).__name__}: {e}")
            if not ok:
                alone[c.name] += 1
                if failed is None:
                    failed = c.name
                    first[c.name] += 1
        if failed is None:
            points.append(cfg)
    return total, points, first, alone, errors


def _staged(layer, knobs, target, cons):
    names = frozenset(k.name for k in knobs)
    depth_of = {k.name: i for i, k in enumerate(knobs)}
    n = len(knobs)
    below = [1] * (n + 1)
    for d in range(n - 1, -1, -1):
        below[d] = below[d + 1] * len(knobs[d].values)
    first = {c.name: 0 for c in cons}
    errors = {}
    points = []

    def judge(d, items, pending):
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
                if d < n:
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
    return below[0], points, first, {}, errors

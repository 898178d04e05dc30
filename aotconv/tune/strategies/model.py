"""Cost-model-guided search (aotconv's own): learn log(time) from what was measured, measure
where the model predicts the fastest untried points.

The model is ridge regression on features of the knob values: one-hot per dimension (variant
included), and for numeric knobs log2(value), its square and the pairwise products of the logs,
so that products of knobs (work-group size = X * Y, tile = work-per-item * work-group) are
linear in the features. Each pick of a batch fits the model to a bootstrap resample of the
measurements (a cheap Thompson sampling), so a batch spreads over several promising regions
instead of piling onto one, and with probability `explore` a pick is uniform at random.
Failures count as slower than the slowest success, which teaches the model where the space
breaks. Like TVM's and Kernel Tuner's model-based tuners, minus the dependencies: numpy only.

With hints (seeding.Hints: the records of similar layers on the same device), their points are
training rows too, weighted by `prior` and their similarity, with their times relative to the
best of their own layer (an indicator feature absorbs the offset to this layer's absolute
times): the first `init` picks follow the prior's ranking instead of being random, as TVM's
transfer learning starts its XGBoost model from earlier tasks' logs.

Width: a batch is `batch` picks, or more where the measurer has room for more in flight than the
searches running beside this one fill (`evaluate.width()`, the measurer's capacity shared by the
running searches): a search left alone at the end of a build, or on a farm of many compile CPUs,
proposes that many at once instead of a chain of batches of `batch`, each waiting for its
slowest compile. The picks beyond `batch` come from the same `batch` bootstrap fits, each fit's
next-best untried point in turn, so a wide batch costs no more fitting than a narrow one.

Streaming (`stream=1`, the default, where the measurer overlaps compiles with runs: base.py):
the first proposal fills the width; after that the model is fitted again each time `batch`
results have come back, and proposes for the slots that came free plus `batch` picks queued for
the slots the next results free, leaving out the points still in flight. `stream=0` measures batch after batch, each waiting for its slowest.
"""
import math

import numpy as np


def _recipe(grid):
    """The feature columns, in order, as (kind, dimension, what): a one-hot column per value of
    each dimension ("is"), one for a dimension's absent value ("absent"), and for numeric knobs
    log2(value) ("log"), its square ("square") and the pairwise products of the logs
    ("product", with the other dimension)."""
    cols, logs = [], []
    for k, vals in enumerate(grid.values):
        cols += [("is", k, v) for v in range(len(vals))]
        if (grid.coords[:, k] < 0).any():
            cols.append(("absent", k, None))
        if k > 0 and len(vals) > 1 and all(isinstance(v, (int, float)) and
                                           not isinstance(v, bool) and v > 0 for v in vals):
            logs.append(k)
            cols += [("log", k, None), ("square", k, None)]
    cols += [("product", a, b) for i, a in enumerate(logs) for b in logs[i + 1:]]
    return cols


def _raw(grid, coords, recipe):
    """Unscaled float32 feature columns (`recipe`) of coordinate rows `coords` in `grid`'s
    dimensions, written into one array (a large space is 200k points x 220 columns: built
    column by column in float64 and stacked, they took 5 s of a layer's search)."""
    coords = np.ascontiguousarray(np.asarray(coords).T)       # a dimension's codes together
    X = np.empty((coords.shape[1], len(recipe)), dtype=np.float32, order="F")   # by column
    logs = {}

    def log(k):
        if k not in logs:
            lv = np.log2(np.asarray(grid.values[k], dtype=np.float32))
            code = coords[k]
            logs[k] = np.where(code >= 0, lv[np.maximum(code, 0)], np.float32(0.0))
        return logs[k]

    for j, (kind, k, what) in enumerate(recipe):
        if kind == "is":
            X[:, j] = coords[k] == what
        elif kind == "absent":
            X[:, j] = coords[k] < 0
        elif kind == "log":
            X[:, j] = log(k)
        elif kind == "square":
            X[:, j] = log(k) * log(k)
        else:
            X[:, j] = log(k) * log(what)
    return X


def _stats(X):
    """Column means and standard deviations of X accumulated in float64, and which columns
    vary."""
    n = max(1, len(X))
    mu = X.sum(axis=0, dtype=np.float64) / n
    var = np.maximum(0.0, np.einsum("ij,ij->j", X, X, dtype=np.float64) / n - mu * mu)
    return mu, np.sqrt(var), var > 1e-9 * (1.0 + mu * mu)


def features(grid, extra=None):
    """Standardised float32 feature matrix (points x features) of the grid's coordinates;
    with `extra` (coordinate rows of other points, e.g. a prior's), (grid's, extra's), both
    scaled by the grid's own statistics."""
    recipe = _recipe(grid)
    X = _raw(grid, grid.coords, recipe)
    mu, sd, keep = _stats(X)
    mu, sd = mu[keep].astype(np.float32), sd[keep].astype(np.float32)
    out = X[:, keep] if not keep.all() else X
    out -= mu
    out /= sd
    if extra is None:
        return out
    E = _raw(grid, extra, recipe)[:, keep]
    return out, (E - mu) / sd


def _fit(X, y, ridge, w=None):
    X = np.asarray(X, dtype=np.float64)
    if w is None:
        mu = y.mean()
        A = X.T @ X + ridge * np.eye(X.shape[1])
        return np.linalg.solve(A, X.T @ (y - mu)), mu
    mu = float(np.average(y, weights=w))
    Xw = X * w[:, None]
    A = Xw.T @ X + ridge * np.eye(X.shape[1])
    return np.linalg.solve(A, Xw.T @ (y - mu)), mu


def _with_prior(Xs, ys, P, py, pw, prior):
    """Measured rows plus the prior's rows (weight `prior` x similarity); an indicator column
    absorbs the offset between absolute log-times (this layer) and relative ones (the prior)."""
    X = np.vstack([np.column_stack([Xs, np.zeros(len(Xs))]),
                   np.column_stack([P, np.ones(len(P))])])
    y = np.concatenate([ys, py])
    w = np.concatenate([np.ones(len(ys)), prior * pw])
    return X, y, w


def wide(evaluate, batch):
    """How many picks the next batch has: `batch`, or evaluate.width() where that is more (the
    measurer's room in flight that the searches running beside this one leave), never more
    than the trials left."""
    width = getattr(evaluate, "width", None)
    n = int(width()) if callable(width) else 0
    if n <= batch:
        return batch
    left = getattr(evaluate, "remaining", None)
    return max(batch, min(n, left)) if isinstance(left, int) else n


def search(grid, evaluate, rng, batch=4, init=None, ridge=3.0, explore=0.1, prior=6.0,
           stream=1):
    """`prior`: how many of this layer's own measurements the records of similar layers
    (evaluate.hints, seeding.Hints) count for together (0 turns them off), so they guide the
    first picks and fade as this layer's own measurements accumulate; with them, half of the
    first `init` picks follow the prior's ranking instead of being random. `stream`: 1 measures
    as a stream where the evaluator can (module docstring), 0 batch after batch."""
    n = len(grid)
    if stream and callable(getattr(evaluate, "stream", None)):
        evaluate.stream(batch)
    hints = getattr(evaluate, "hints", None)
    use_prior = prior > 0 and hints is not None and hints.has_prior
    if use_prior:
        X, P = features(grid, hints.coords)
        py, pw = hints.y, hints.w / hints.w.sum()
    else:
        X = features(grid)
    budget = evaluate.trials
    if init is None:
        init = int(min(12, max(3, round(0.15 * budget))))
    if use_prior and X.shape[1]:
        # rank the grid by the prior alone (bootstrap picks, as below) before measuring
        free = np.ones(n, dtype=bool)
        free[list(evaluate.visited)] = False
        picks = []
        for _ in range(min((init + 1) // 2, int(free.sum()))):
            boot = rng.integers(len(py), size=len(py))
            w, mu = _fit(P[boot], py[boot], ridge, pw[boot] * len(pw))
            pred = X @ w.astype(np.float32) + mu
            pred[~free] = math.inf
            i = int(np.argmin(pred))
            picks.append(i)
            free[i] = False
        rest = np.nonzero(free)[0]
        picks += [int(i) for i in rng.choice(rest, size=min(init - len(picks), len(rest)),
                                              replace=False)]
        if picks:
            evaluate(picks)
    else:
        evaluate(rng.choice(n, size=min(init, n), replace=False))
    while True:
        seen = np.fromiter(evaluate.visited.keys(), dtype=np.int64)
        cost = np.fromiter(evaluate.visited.values(), dtype=float)
        ok = np.isfinite(cost) & (cost > 0)
        free = np.ones(n, dtype=bool)
        free[seen] = False
        flying = list(getattr(evaluate, "pending", None) or ())
        free[flying] = False
        picks = []
        # streaming: the slots that came free, and `batch` more queued for the slots the
        # next results free while the model is fitted again
        width = wide(evaluate, batch)
        if getattr(evaluate, "streaming", False):
            width = max(0, width - len(flying)) + batch
        if (ok.sum() < 2 and not use_prior) or X.shape[1] == 0 or not ok.any():
            cand = np.nonzero(free)[0]
            picks = [int(i) for i in rng.choice(cand, size=min(width, len(cand)), replace=False)]
        else:
            y = np.log(np.where(ok, cost, 1.0))
            y[~ok] = y[ok].max() + 1.0
            if use_prior:
                y = y - y[ok].min()            # relative to the best so far, as the prior is
            preds = []
            for j in range(width):
                if not free.any():
                    break
                if rng.random() < explore:
                    cand = np.nonzero(free)[0]
                    i = int(cand[rng.integers(len(cand))])
                else:
                    if j < batch:
                        boot = rng.integers(len(seen), size=len(seen))
                        if use_prior:
                            Xa, ya, wa = _with_prior(X[seen[boot]], y[boot], P, py, pw, prior)
                            w, mu = _fit(Xa, ya, ridge, wa)
                            pred = X @ w[:-1].astype(np.float32) + mu
                        else:
                            w, mu = _fit(X[seen[boot]], y[boot], ridge)
                            pred = X @ w.astype(np.float32) + mu
                        preds.append(pred)
                    else:
                        pred = preds[j % len(preds)] if preds else None
                    if pred is None:
                        cand = np.nonzero(free)[0]
                        i = int(cand[rng.integers(len(cand))])
                    else:
                        pred[~free] = math.inf
                        i = int(np.argmin(pred))
                picks.append(i)
                free[i] = False
        evaluate(picks)

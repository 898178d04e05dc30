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
"""
import math

import numpy as np


def _raw(grid, coords):
    """Unscaled feature columns of coordinate rows `coords` in `grid`'s dimensions."""
    cols = []
    logs = []
    for k, vals in enumerate(grid.values):
        code = coords[:, k]
        for v in range(len(vals)):
            cols.append(code == v)
        if (grid.coords[:, k] < 0).any():
            cols.append(code < 0)
        if k > 0 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                         for v in vals) and len(vals) > 1:
            lv = np.log2(np.asarray(vals, dtype=float))
            z = np.where(code >= 0, lv[np.maximum(code, 0)], 0.0)
            logs.append(z)
            cols.append(z)
            cols.append(z * z)
    for a in range(len(logs)):
        for b in range(a + 1, len(logs)):
            cols.append(logs[a] * logs[b])
    return np.column_stack([np.asarray(c, dtype=float) for c in cols]) if cols else \
        np.zeros((len(coords), 0))


def features(grid, extra=None):
    """Standardised feature matrix (points x features) of the grid's coordinates; with
    `extra` (coordinate rows of other points, e.g. a prior's), (grid's, extra's), both scaled
    by the grid's own statistics."""
    X = _raw(grid, grid.coords)
    sd = X.std(axis=0)
    keep = sd > 0
    mu = X[:, keep].mean(axis=0)
    out = (X[:, keep] - mu) / sd[keep]
    if extra is None:
        return out
    E = _raw(grid, np.asarray(extra))
    return out, (E[:, keep] - mu) / sd[keep]


def _fit(X, y, ridge, w=None):
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


def search(grid, evaluate, rng, batch=4, init=None, ridge=3.0, explore=0.1, prior=6.0):
    """`prior`: how many of this layer's own measurements the records of similar layers
    (evaluate.hints, seeding.Hints) count for together (0 turns them off), so they guide the
    first picks and fade as this layer's own measurements accumulate; with them, half of the
    first `init` picks follow the prior's ranking instead of being random."""
    n = len(grid)
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
            pred = X @ w + mu
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
        picks = []
        if (ok.sum() < 2 and not use_prior) or X.shape[1] == 0 or not ok.any():
            cand = np.nonzero(free)[0]
            picks = [int(i) for i in rng.choice(cand, size=min(batch, len(cand)), replace=False)]
        else:
            y = np.log(np.where(ok, cost, 1.0))
            y[~ok] = y[ok].max() + 1.0
            if use_prior:
                y = y - y[ok].min()            # relative to the best so far, as the prior is
            for _ in range(batch):
                if not free.any():
                    break
                if rng.random() < explore:
                    cand = np.nonzero(free)[0]
                    i = int(cand[rng.integers(len(cand))])
                else:
                    boot = rng.integers(len(seen), size=len(seen))
                    if use_prior:
                        Xa, ya, wa = _with_prior(X[seen[boot]], y[boot], P, py, pw, prior)
                        w, mu = _fit(Xa, ya, ridge, wa)
                        pred = X @ w[:-1] + mu
                    else:
                        w, mu = _fit(X[seen[boot]], y[boot], ridge)
                        pred = X @ w + mu
                    pred[~free] = math.inf
                    i = int(np.argmin(pred))
                picks.append(i)
                free[i] = False
        evaluate(picks)

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
"""
import math

import numpy as np


def features(grid):
    """Standardised feature matrix (points x features) of the grid's coordinates."""
    cols = []
    logs = []
    for k, vals in enumerate(grid.values):
        code = grid.coords[:, k]
        for v in range(len(vals)):
            cols.append(code == v)
        if (code < 0).any():
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
    X = np.column_stack([np.asarray(c, dtype=float) for c in cols]) if cols else \
        np.zeros((len(grid), 0))
    sd = X.std(axis=0)
    keep = sd > 0
    X = (X[:, keep] - X[:, keep].mean(axis=0)) / sd[keep]
    return X


def _fit(X, y, ridge):
    mu = y.mean()
    A = X.T @ X + ridge * np.eye(X.shape[1])
    w = np.linalg.solve(A, X.T @ (y - mu))
    return w, mu


def search(grid, evaluate, rng, batch=4, init=None, ridge=3.0, explore=0.1):
    n = len(grid)
    X = features(grid)
    budget = evaluate.trials
    if init is None:
        init = int(min(12, max(3, round(0.15 * budget))))
    evaluate(rng.choice(n, size=min(init, n), replace=False))
    while True:
        seen = np.fromiter(evaluate.visited.keys(), dtype=np.int64)
        cost = np.fromiter(evaluate.visited.values(), dtype=float)
        ok = np.isfinite(cost) & (cost > 0)
        free = np.ones(n, dtype=bool)
        free[seen] = False
        picks = []
        if ok.sum() < 2 or X.shape[1] == 0:
            cand = np.nonzero(free)[0]
            picks = [int(i) for i in rng.choice(cand, size=min(batch, len(cand)), replace=False)]
        else:
            y = np.log(np.where(ok, cost, 1.0))
            y[~ok] = y[ok].max() + 1.0
            for _ in range(batch):
                if not free.any():
                    break
                if rng.random() < explore:
                    cand = np.nonzero(free)[0]
                    i = int(cand[rng.integers(len(cand))])
                else:
                    boot = rng.integers(len(seen), size=len(seen))
                    w, mu = _fit(X[seen[boot]], y[boot], ridge)
                    pred = X @ w + mu
                    pred[~free] = math.inf
                    i = int(np.argmin(pred))
                picks.append(i)
                free[i] = False
        evaluate(picks)

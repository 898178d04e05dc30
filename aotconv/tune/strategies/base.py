"""What a strategy is handed: the Evaluator, which owns the budget and the memo of results.

A strategy is one function `search(grid, evaluate, rng, **options)` that calls
`evaluate([point indices])` (a batch, so candidates can be compiled in parallel) and gets back
their costs (median time in ms; inf for any failure). It never sees the budget: `evaluate`
raises Exhausted when the budget is spent or every point is known, and the caller catches it.
Revisiting a point is free. A point known from records costs one trial the first time the
search asks for it, so a seeded search resumed from its records replays its own trajectory
for free and goes on exactly where it stopped.
"""
import math
import time


class Exhausted(Exception):
    """The budget is spent (or nothing is left to try): the search is over."""


class Evaluator:
    def __init__(self, n, measure, trials=None, deadline=None, known=None, max_calls=None,
                 min_trials=1):
        """`measure(indices) -> costs` does the work; `known` {index: cost} is free memo.

        trials: distinct points this search may visit; deadline: time.monotonic() limit,
        which does not stop the first `min_trials` visits.
        """
        self.min_trials = min_trials
        self.n, self.measure = n, measure
        self.trials = n if trials is None else min(trials, n)
        self.deadline = deadline
        self.known = dict(known or {})
        self.visited = {}              # index -> cost, in visiting order
        self.trace = []                # best cost after each visit (search progress)
        self.calls = 0
        self.max_calls = max_calls if max_calls is not None else 50 * max(self.trials, 1) + 1000

    @property
    def remaining(self):
        return self.trials - len(self.visited)

    @property
    def best(self):
        """(index, cost) of the best point visited, or (None, inf)."""
        if not self.visited:
            return None, math.inf
        i = min(self.visited, key=self.visited.get)
        return i, self.visited[i]

    def _out_of_time(self):
        return (self.deadline is not None and len(self.visited) >= self.min_trials
                and time.monotonic() >= self.deadline)

    def __call__(self, indices):
        self.calls += 1
        if self.calls > self.max_calls:
            raise Exhausted("the strategy keeps revisiting known points")
        indices = [int(i) for i in indices]
        new = []
        for i in indices:
            if i not in self.visited and i not in new:
                new.append(i)
        if (new and (self.remaining <= 0 or self._out_of_time())) or len(self.visited) >= self.n:
            raise Exhausted()
        take = new[:self.remaining]
        fresh = [i for i in take if i not in self.known]
        costs = dict(zip(fresh, self.measure(fresh))) if fresh else {}
        for i in take:
            c = self.known[i] if i in self.known else costs[i]
            c = math.inf if c is None or c != c else float(c)
            self.visited[i] = c
            self.trace.append(min(self.trace[-1], c) if self.trace else c)
        if len(take) < len(new):
            raise Exhausted()
        return [self.visited[i] for i in indices]

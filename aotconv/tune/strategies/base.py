"""What a strategy is handed: the Evaluator, which owns the budget and the memo of results.

A strategy is one function `search(grid, evaluate, rng, **options)` that calls
`evaluate([point indices])` (a batch, so candidates can be compiled in parallel) and gets back
their costs (median time in ms; inf for any failure). It never sees the budget: `evaluate`
raises Exhausted when the budget is spent or every point is known, and the caller catches it.
Revisiting a point is free. A point known from records costs one trial the first time the
search asks for it, so a seeded search resumed from its records replays its own trajectory
for free and goes on exactly where it stopped.

Under a deadline the Evaluator also keeps a `Pace` (seconds of wall time one new measurement
has cost so far, shared by the searches of a build): a batch is cut to the candidates that fit
in the time left, so a batch started just before the deadline does not run far past it. What
the cut part measured corrects the pace, and the rest of the batch is fitted again to the time
left, until nothing more fits: a cut made at a pace guessed before anything was measured does
not end the search while its time lasts. The pace may move the deadline (`Pace.moved`: a
layer's first measurement that came later than its grant counted, search.FirstPace).
`evaluate.hints` holds what the caller knows before anything is measured (seeding.Hints: the
records of similar layers); a strategy may use it or ignore it.
"""
import math
import time


class Exhausted(Exception):
    """The budget is spent (or nothing is left to try): the search is over."""


class Pace:
    """Wall seconds per newly measured candidate, learnt from the batches measured so far (a
    build's first layer starts from `default`, the target kind's typical cost)."""

    def __init__(self, default=1.0):
        self.default = default
        self.count = 0
        self.seconds = 0.0

    def add(self, count, seconds):
        self.count += count
        self.seconds += seconds

    @property
    def per(self):
        return self.seconds / self.count if self.count else self.default

    def marginal(self, count, seconds):
        """(count, seconds) of a batch that this pace learns from: all of it (FirstPace takes
        a layer's first measurement out of its first batch)."""
        return count, seconds

    def moved(self, deadline):
        """The deadline as what was measured moves it: itself (FirstPace moves a layer's
        deadline by what its first measurement took beyond what was expected)."""
        return deadline

    def fits(self, seconds):
        """How many new candidates fit in `seconds`."""
        if seconds <= 0:
            return 0
        return int(seconds / self.per) if self.per > 0 else 1 << 30


class Evaluator:
    def __init__(self, n, measure, trials=None, deadline=None, known=None, max_calls=None,
                 min_trials=1, pace=None, hints=None, chunk=None):
        """`measure(indices) -> costs` does the work; `known` {index: cost} is free memo.

        trials: distinct points this search may visit; deadline: time.monotonic() limit,
        which does not stop the first `min_trials` visits; pace: a Pace, so that under a
        deadline a batch is cut to what fits in the time left (at this search's own pace
        once it has one), and measured `chunk` candidates at a time (the measurer's parallel
        width), the deadline checked between chunks; hints: seeding.Hints or None.
        """
        self.min_trials = min_trials
        self.pace = pace if pace is not None else (Pace() if deadline is not None else None)
        self.own = Pace()              # this search's own pace: layers differ a lot
        self.chunk = chunk
        self.hints = hints
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

    def _end(self):
        """The deadline, as the pace moves it (Pace.moved)."""
        return self.pace.moved(self.deadline) if self.pace is not None else self.deadline

    def _out_of_time(self):
        return (self.deadline is not None and len(self.visited) >= self.min_trials
                and time.monotonic() >= self._end())

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
        want = new[:self.remaining]
        # a batch is cut to what fits at the pace known when it starts; what is measured
        # then shows the pace (a layer's first measurement, the build's first candidates), so
        # the rest of the batch is fitted again to the time left, until nothing more fits
        while True:
            rest = [i for i in want if i not in self.visited]
            more = self._fit(rest)
            if not more or len(self._measure(more)) < len(more) or len(more) == len(rest):
                break
        if any(i not in self.visited for i in new):
            raise Exhausted()
        return [self.visited[i] for i in indices]

    def _measure(self, take):
        """Measure the new points of `take` (known points are free), a chunk at a time under a
        deadline, and visit them in order; returns the points visited (the chunks after one
        that would run past the deadline are left)."""
        fresh = [i for i in take if i not in self.known]
        costs = {}
        step = self.chunk if self.deadline is not None and self.chunk else len(fresh) or 1
        for s in range(0, len(fresh), step):
            part = fresh[s:s + step]
            if s and len(self.visited) + s >= self.min_trials and \
                    self._fits(self._end() - time.monotonic()) < len(part):
                take = [i for i in take if i in self.known or i in costs]
                break
            t0 = time.monotonic()
            costs.update(zip(part, self.measure(part)))
            if self.pace is not None:
                count, seconds = self.pace.marginal(len(part), time.monotonic() - t0)
                self.pace.add(count, seconds)
                self.own.add(count, seconds)
        for i in take:
            c = self.known[i] if i in self.known else costs[i]
            c = math.inf if c is None or c != c else float(c)
            self.visited[i] = c
            self.trace.append(min(self.trace[-1], c) if self.trace else c)
        return take

    def _fits(self, seconds):
        return (self.own if self.own.count else self.pace).fits(seconds)

    def _fit(self, take):
        """`take` cut after the last new measurement that fits before the deadline (known
        points are free); never below what min_trials still needs."""
        if self.deadline is None or self.pace is None:
            return take
        room = max(self._fits(self._end() - time.monotonic()),
                   self.min_trials - len(self.visited))
        out = []
        for i in take:
            if i not in self.known:
                if room <= 0:
                    break
                room -= 1
            out.append(i)
        return out

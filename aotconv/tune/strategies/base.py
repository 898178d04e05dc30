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

Streaming: where the measurer overlaps compiles with runs (a GPU, a farm: `can_stream`), a
strategy may call `evaluate.stream(refit)` and from then on `evaluate(picks)` puts its new
picks in flight as far as the measurer's room for this search allows (`width()`), queues the
rest, and returns as soon as `refit` results have come back, without waiting for the others:
each result's slot takes the next queued pick at once, and the strategy's next proposal, made
from what came back, replaces the queue. The picks in flight are `evaluate.pending`, which the
strategy leaves out of its proposals. A batch no longer waits for its slowest
compile (on an H100 0.74 s mean against 0.23 s for the median candidate), so the measurer's
capacity stays full. The pace learns from the time between results; under a deadline no more
is put in flight than fits in the time left with what is in flight already. `drain()` waits for
what is still in flight (the caller's, at the end of the search), so nothing measured is lost.
The order in which results arrive decides what the strategy sees next: a streaming search is
not replayable the way a batched one is, so a search of recorded costs (replay, the studies)
never streams.
"""
import math
import queue
import threading
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
        self.can_stream = False        # set by the caller where the measurer overlaps its work
        self.streaming = False
        self.refit = 1                 # results a streaming call waits for before it returns
        self.pending = {}              # index -> the time it was put in flight (streaming)
        self.queued = []               # the strategy's picks waiting for a free slot
        self._done = queue.Queue()     # (index, cost, error, when) as results come back
        self._last = None              # the previous result's arrival (or the stream's start)

    @property
    def remaining(self):
        return self.trials - len(self.visited) - len(self.pending)

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
        if self.streaming:
            return self._stream(indices)
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
            self._visit(i, self.known[i] if i in self.known else costs[i])
        return take

    def _visit(self, i, c):
        c = math.inf if c is None or c != c else float(c)
        self.visited[i] = c
        self.trace.append(min(self.trace[-1], c) if self.trace else c)

    # -- streaming ------------------------------------------------------------------------------
    def stream(self, refit=1):
        """Measure as a stream from now on, where the caller allowed it (`can_stream`); each
        call then returns once `refit` results have come back. Whether it streams."""
        if self.can_stream:
            self.streaming, self.refit = True, max(1, int(refit))
        return self.streaming

    def _stream(self, indices):
        new = [i for i in dict.fromkeys(indices) if i not in self.visited and i not in self.pending]
        if not self.pending and ((new and (self.remaining <= 0 or self._out_of_time()))
                                 or len(self.visited) >= self.n):
            raise Exhausted()
        self.queued = [] if self._out_of_time() else \
            self._fit(new[:max(0, self.remaining)], len(self.pending))
        if new and not self.queued and not self.pending:
            raise Exhausted()              # nothing more fits before the deadline
        self._refill()
        self._collect(min(len(self.pending), self.refit))
        return [self.visited.get(i) for i in indices]

    def _slots(self):
        """Candidates this search may have in flight: the measurer's room it has
        (`width()`, set by the caller), else as many as it proposes."""
        width = getattr(self, "width", None)
        return max(1, int(width())) if callable(width) else 1 << 30

    def _refill(self):
        """Put the queued picks in flight while slots are free, the trials last and each fits
        before the deadline after what is in flight (a known point is visited at once)."""
        while self.queued and len(self.pending) < self._slots():
            i = self.queued.pop(0)
            if i in self.visited or i in self.pending:
                continue
            if i in self.known:            # free: visited at once, as a batch visits it
                self._visit(i, self.known[i])
                continue
            if self.remaining <= 0 or (self.pending and (self._out_of_time()
                                                          or not self._fit([i], len(self.pending)))):
                self.queued = []
                return
            self._submit(i)

    def _submit(self, i):
        now = time.monotonic()
        if not self.pending:
            self._last = now               # the stream (re)starts: its first result's time
        self.pending[i] = now

        def one():
            try:
                cost, error = self.measure([i])[0], None
            except BaseException as e:     # handed to the search's thread (Stopped, a crash)
                cost, error = None, e
            self._done.put((i, cost, error, time.monotonic()))

        t = threading.Thread(target=one, name="aotconv-stream", daemon=True)
        t.start()

    def _collect(self, need):
        """Visit results as they come back until `need` have (or nothing is in flight), each
        freed slot taking the next queued pick at once; the first error a measurement raised
        is raised here."""
        got = 0
        while self.pending and got < need:
            i, cost, error, when = self._done.get()
            del self.pending[i]
            if error is not None:
                self.queued = []
                raise error
            if self.pace is not None:
                count, seconds = self.pace.marginal(1, max(0.0, when - self._last))
                self.pace.add(count, seconds)
                self.own.add(count, seconds)
            self._last = max(self._last, when)
            self._visit(i, cost)
            got += 1
            self._refill()

    def drain(self):
        """Wait for every candidate in flight and visit it (nothing queued is put in flight);
        the search streams no more."""
        self.streaming, self.queued = False, []
        self._collect(len(self.pending))

    def _fits(self, seconds):
        return (self.own if self.own.count else self.pace).fits(seconds)

    def _fit(self, take, in_flight=0):
        """`take` cut after the last new measurement that fits before the deadline (known
        points are free) with `in_flight` measurements still to come first; never below what
        min_trials still needs."""
        if self.deadline is None or self.pace is None:
            return take
        room = max(self._fits(self._end() - time.monotonic()) - in_flight,
                   self.min_trials - len(self.visited) - in_flight)
        out = []
        for i in take:
            if i not in self.known:
                if room <= 0:
                    break
                room -= 1
            out.append(i)
        return out

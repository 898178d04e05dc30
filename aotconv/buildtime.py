"""Where a build's wall time goes: seconds per phase, for the build log's last line and report.md.

    times = BuildTimes()
    with times.active(), times.phase("search"):
        ...                                    # anything here may open a phase of its own:
        with phase("spaces"):                  # the module-level phase() finds the active
            ...                                # BuildTimes, and does nothing without one

A phase's seconds are its own: a phase opened inside another is not counted in the outer one,
so the phases add up to the wall time they cover. The active BuildTimes is a context variable,
so a step deep inside the flow (the space enumeration inside a search) is timed without being
handed anything; phases are opened on the build's own thread (lane threads open none).
"""
import contextlib
import contextvars
import time

# the order of the phases in the summary line; a phase not listed here comes after them
ORDER = ("setup", "spaces", "search", "fusion searches", "layouts", "library", "run",
         "run and check", "end", "other")

_ACTIVE = contextvars.ContextVar("aotconv_build_times", default=None)


class BuildTimes:
    """Wall seconds of one build, by phase (each phase's own time, nested phases excluded)."""

    def __init__(self, start=None, clock=time.monotonic):
        self._clock = clock
        self.start = clock() if start is None else start
        self.seconds = {}
        self.budget = None               # the build's time budget, as text, when it has one
        self._stack = []                 # [name, started, seconds of the phases inside it]

    @contextlib.contextmanager
    def phase(self, name):
        """Count the time of the `with` body to `name`, less the phases opened inside it."""
        frame = [name, self._clock(), 0.0]
        self._stack.append(frame)
        try:
            yield self
        finally:
            self._stack.pop()
            took = self._clock() - frame[1]
            self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, took - frame[2])
            if self._stack:
                self._stack[-1][2] += took

    @contextlib.contextmanager
    def active(self):
        """Make this the BuildTimes that `phase()` (module level) counts to."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def elapsed(self):
        return self._clock() - self.start

    def lap(self, name):
        """Count to `name` the time since the start that no phase has counted yet (the steps
        before the phases began)."""
        rest = self.elapsed() - sum(self.seconds.values())
        if rest > 0:
            self.seconds[name] = self.seconds.get(name, 0.0) + rest

    def line(self, total=None, head="time"):
        """'time: setup 1.2 s, spaces 8.1 s, search 61.0 s, ...; 93.0 s in all, budget 90 s'.
        The time not inside any phase is `other`; `total` defaults to the time since start."""
        total = self.elapsed() if total is None else total
        parts = dict(self.seconds)
        rest = total - sum(parts.values())
        if rest >= 0.05:
            parts["other"] = parts.get("other", 0.0) + rest
        names = sorted(parts, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
        # every phase the build went through is named, a short one too (run 0.0 s); the
        # unaccounted rest only when it is worth a figure
        text = ", ".join(f"{n} {parts[n]:.1f} s" for n in names
                         if n in self.seconds or parts[n] >= 0.05)
        tail = f"{total:.1f} s in all"
        if self.budget is not None:
            tail += f", budget {self.budget}"
        return f"{head}: {text or 'nothing timed'}; {tail}"


def phase(name):
    """A phase of the active BuildTimes, or nothing when no build is being timed."""
    times = _ACTIVE.get()
    return times.phase(name) if times is not None else contextlib.nullcontext()

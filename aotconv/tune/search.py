"""Search: one layer's space with a strategy, and a whole network under one shared budget.

A network's identical layers (same op signature, fused activation included) are tuned once.
The budget, trials (`200`) or wall time (`10m`, `90s`, `1.5h`), is shared among the unique
layers by their share of the network's estimated cost (roofline time of one layer times the
number of times it occurs), capped by each layer's space; whatever a layer leaves unspent goes
back to the pool for the layers after it. Every layer measures its fallback first (the
untuned baseline, so the report can show what tuning bought) and at least that one trial.

A time budget is one `Clock` for the whole build (the compiler starts it with the build):
space enumeration, the worker processes' start, every search (the network's, then the
pool-fusion, residual and layout-conversion searches that choose is called for afterwards),
and a reserve for building and running the final library all come out of it. A search's
spaces are enumerated beside it, the first layers first, and a layer waits only for its own
(`NetworkSpaces`: what the budget needs of the others is estimated from those known). The first search
reserves FOLLOW_UP of what is left for the searches after it (at least one enumeration and
measurement of each conv a pool or an add may be fused into) and `Clock.final_reserve` for the
library (its kernels' source at seconds a byte, the network's runs at its layers' measured
times); each layer's deadline is recomputed from the clock when the layer starts and
keeps one measurement (a layer's first measurement's latency, learnt as the build goes) for
every layer after it; a batch is cut to what fits before the deadline, and the rest of it
fitted again at the pace the cut part showed (strategies.base.Pace, Evaluator). A layer's
first batch is fitted to its deadline at its first measurement's latency, then the build's
pace (FirstPace), and a first measurement later than that latency moves the deadline by as
much: the layer's share of the time is what it has after that measurement. When even the floor
(one measurement per layer, the lanes measuring side by side, the library and the build's end,
and the fusion searches' minimum where the budget leaves room for it: a late build leaves them
out) cannot fit, the build says so before anything is measured, and again as soon as the
layers measured show it (once in all).

Before its strategy runs, a layer measures its fallbacks and the best points of similar layers
in the records (strategies.seeding: nearest op signatures of the same op on the same device),
and the `model` strategy starts from a cost model trained on those records.

Rechecks: a record's time comes from another run (another clock state of the device, other
kernels around it), and of many records of a layer the lowest wins, so a reading that was low
by chance is kept and chosen. So a search on the device first re-times the layer's `recheck`
(RECHECK) fastest recorded points before anything else, and after its strategy re-times any
point among the `recheck` fastest that this run has not timed, while its time lasts (2 x
`recheck` recorded points at most in all): the point
a build freezes was timed in the same run as the points it beat (the later record of a point
wins, so the records keep the new time). recheck=0 trusts the records' times.

Lanes: up to `lanes` layer searches run at once, each in a thread of its own (`run_lanes`), so
that one layer's compiles overlap another's measurements and every device of a farm has work.
A layer's grant is computed when it starts, from what is left (`Grants`): trials granted to
running layers are reserved and what they leave unused returns when they finish, so the total
stays within the budget; a time budget's remaining search time is shared as with one lane,
times the lanes (what the running layers still hold deducted), and never past the clock. The
record store, the seeding library, the clock and the progress events are touched under one
lock (`Lanes.lock`); results are those of one lane, in network order, except that a layer's
seeds come from the records of the layers measured before it starts.
"""
from collections.abc import Sequence
import contextlib
from dataclasses import dataclass
import math
import os
import queue
import re
import threading
import time
import zlib

import numpy as np

from ..buildtime import phase
from ..errors import AotconvError
from ..space import layer_space, layer_spaces, Candidate, Spaces, fallback_point, supporting
from ..launch_cost import Pricer
from .measure import Outcome
from .records import Key
from .strategies import Evaluator, run as run_strategy, parse as parse_strategy, DEFAULT
from .strategies.base import Pace
from .strategies.seeding import Library

DEFAULT_TRIALS = 64            # per unique layer when no budget is given
FOLLOW_UP = 0.10               # of a time budget, kept by the first search for the later ones
FUSABLE_OPS = ("maxpool", "avgpool", "add")     # what the fusion searches may fuse into a conv
# wall seconds a new candidate costs before this run has measured one (compile dominated:
# PoCL 1-3 s a kernel on 2 cores, NVIDIA's compiler 0.2-0.5 s)
PACE_DEFAULT = {"cpu": 1.5, "gpu": 0.5}
LANES_ENV = "AOTCONV_LANES"     # how many layers are searched at once (default: the measurer's)
# the final library (Clock.library_s): FINAL_BASE_S for the emitted files, ninja's runtime
# objects and the library's load; then its kernels' source at LIBRARY_S_PER_BYTE, for the
# joined program's build, its binary, ninja's embedding of both and each kernel's first launch
# (scaled by this run's candidates' compile times against BUILD_REF's: a busy or a faster
# host); then LIBRARY_RUNS runs of the network at the times its layers measured. The joined
# program is one build, not one per kernel, and what it costs grows with the code: PoCL's build
# takes about a second whatever the size, but its binary and each kernel's first launch compile
# every kernel to native code (on two busy cores 0.07-0.15 ms a source byte in all: fallback
# mobilenet_v2 and resnet50, of 2.2-3.4 kB a kernel, tuned lenet5 and resnet50; 0.3 ms for
# tuned mobilenet_v2, below). NVIDIA's build and ptxas took 0.018-0.021 ms a byte in a probe
# with nothing else running (vgg16, resnet50 on an H100: results/h100/nvidia-binaries.md), but
# 0.034-0.037 ms in builds of tuned ResNet-50 b1 (757 kB; the joined program 17.8-20.1 s, its
# cubin 7.6-7.9 s), which is what is counted; the embedded cubin compiles in under a second
FINAL_BASE_S = 3.0
LIBRARY_S_PER_BYTE = {"cpu": 1.0e-4, "gpu": 3.6e-5}
# A GPU's library is made as a few joined programs built at once, one process each
# (aotconv.binaries.groups_for): the build above is shared among them, plus the processes'
# start. Measured on the H100: ResNet-50 b1 (757 kB, 9 programs) built in 6.2-7.0 s and
# assembled in 1.5 s (3.4 s counted at 0.036 ms a byte over 8 of 16 cores: the rest is the
# processes' start and contexts), VGG-16 b1 (275 kB, 3) in 3.0 s and 0.8 s
GROUPS_START_S = 4.0
KERNEL_BYTES = 3000             # a kernel's source before a layer's choice is known
# But code size says little of what native code costs: PoCL made 2-4 s of it for a tuned conv
# of 10 kB and 0.2 s for a fallback of 6 kB. Its runner made that code when it first launched
# the chosen kernel: what that took beyond the compile and the timed runs, less
# RUNNER_OVERHEAD_S (its load and warm-up), is most of its native code (0.8 of it, measured on
# tuned convs alone), which the library makes twice again (its binary, its first launch) and
# ninja compiles into it as a binary of megabytes: RUNNER_SHARE times that in all, counted
# where it is more than the source says (tuned mobilenet_v2 and resnet50, 56 kernels and 3.2-4
# MB of binary, took 66-130 s; 2.5 times fell short by up to 1.8x, 3.5 by none measured).
# NVIDIA: the driver compiles the runner's PTX at load, not measured apart yet: the source only
RUNNER_SHARE = {"cpu": 3.5, "gpu": 0.0}
RUNNER_OVERHEAD_S = 0.2
# the build's end after the library (its "end" phase): the report, the output moved into
# place, and what is left of the measuring processes' close, begun beside the library's
# compile and runs once its programs are built (compiler._Closing). PoCL here: 0.1 s. The H100
# builds of ResNet-50 and VGG-16 (a runner and 16 builder processes to close) took 4.4 to
# 11.7 s when the close came after the build (ResNet-50 b1: 7.2 s with a 150-s budget, 11.7 s
# with 40 s); kept as the GPU's figure until measured with the close overlapped.
END_S = {"cpu": 0.3, "gpu": 9.0}
BUILD_REF = {"cpu": 0.35, "gpu": 0.4}           # a candidate's compile where those were measured
LIBRARY_RUNS = 6                # compiler.measure_library: one run, then five profiled
# wall seconds of a layer's first measurement, expected (Clock.prior): its random data and
# float64 reference, one compile, the verifying, warm-up and timed runs of its fallback, one
# after another: LATENCY_BASE plus LATENCY_PER_GFLOP a GFLOP of the layer. PoCL on two busy
# cores (resnet50 and mobilenet_v2, every layer measuring its fallback): 0.4-1.1 s and 9-36 s a
# GFLOP, the fallbacks running at about 1 GFLOP/s some ten times. NVIDIA (a compile of 0.3-1 s,
# the reference on the host): fp16 builds on an H100 from no records, where every layer
# measured its fallback alone, two lanes: 2 x the search's time over the layers came to 1.7 s a
# layer for ResNet-50 at batch 1 (4 GFLOP in its 30 unique layers), 3.0 s at batch 32 (126
# GFLOP), 5.3 s for VGG-16's 18 at batch 16 (347 GFLOP); 1.6 s and 0.25 s a GFLOP fit the
# three within about 20% (the 1.0 s and 0.5 s before said twice VGG-16's). The build then
# scales the expectation by what its own layers took (Clock.scale), and warns if need be.
LATENCY_BASE = {"cpu": 0.7, "gpu": 1.6}
LATENCY_PER_GFLOP = {"cpu": 18.0, "gpu": 0.25}
LATE_SAMPLES = 4                # layers measured before their latency may warn of the floor


# -- budget ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    kind: str                  # "trials" | "seconds" | "default"
    amount: float = 0

    def __str__(self):
        if self.kind == "trials":
            return f"{int(self.amount)} trials"
        if self.kind == "seconds":
            return f"{self.amount:g} s"
        return f"up to {DEFAULT_TRIALS} trials per layer"


def parse_budget(text):
    """'200' -> 200 trials; '10m', '90s', '1.5h' -> seconds; None -> the default."""
    if isinstance(text, Clock):
        return text.budget
    if text is None or isinstance(text, Budget):
        return text or Budget("default")
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Budget("trials", int(text))
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or (not m.group(2) and "." in m.group(1)):
        raise AotconvError(f"--budget '{text}': give a number of trials (200) or a time "
                           f"(90s, 10m, 1.5h)")
    n = float(m.group(1))
    if not m.group(2):
        return Budget("trials", int(n))
    return Budget("seconds", n * {"s": 1, "m": 60, "h": 3600}[m.group(2)])


class SharedPace(Pace):
    """A Pace that the searches of several lanes add to at once."""

    def __init__(self, default=1.0):
        super().__init__(default)
        self._lock = threading.Lock()

    def add(self, count, seconds):
        with self._lock:
            super().add(count, seconds)


class FirstPace(Pace):
    """The pace of one layer's search: its first new measurement costs its latency (`first`
    seconds expected: its data, float64 reference and one compile, one after another), the
    others the build's pace. A batch cut at the build's pace alone fitted `first / pace`
    candidates into a deadline that only the first one filled (at batch 32 on an H100 a
    fallback conv's first measurement took seconds, a candidate in a batch 0.5 s).

    The first batch's time, less what its first measurement took (`came`, told by the search
    when that outcome arrives; else the expected latency), is what the build's pace and the
    search's own learn from: counted whole, a layer's first measurement (1.5 s on an H100
    against 0.3 s for a candidate after it) made every later batch of the layer, and of the
    build, look several times slower than it was, so that a guided ResNet-50 b1 search cut its
    early layers' second batches to nothing and left them on their fallback."""

    def __init__(self, shared, first, since=None, until=None):
        super().__init__(shared.default)
        self.shared, self.first = shared, max(0.0, first)
        self.since = time.monotonic() if since is None else since
        self.until = until             # () -> the latest a deadline may be moved to
        self.started = False           # the first batch was measured
        self.took = None               # seconds its first measurement took
        self.late = None               # seconds it came after the expected time (< 0: before)

    def came(self, seconds):
        """The layer's first measurement arrived `seconds` after its batch started."""
        if self.took is None:
            self.took = max(0.0, seconds)
            self.late = time.monotonic() - self.since - self.first

    def moved(self, deadline):
        """The layer's deadline moved later by what its first measurement took beyond the
        `first` seconds its grant counted for it, never past `until()` (the clock's search
        time): the layer keeps its share of the time after that measurement. Fixed, a first
        measurement that took longer than expected (the build's first compiles queue behind
        each other) ate the layer's share and left it on its fallback, and the time passed to
        the layers after it. One that took less leaves the deadline where it is (moved
        earlier too, a layer lost what the clock's latency, learnt from a few layers,
        over-counted)."""
        if deadline is None or not self.late or self.late <= 0:
            return deadline
        moved = deadline + self.late
        return moved if self.until is None else min(moved, max(deadline, self.until()))

    def marginal(self, count, seconds):
        if self.started:
            return count, seconds
        self.started = True
        took = min(seconds, self.first if self.took is None else self.took)
        return max(0, count - 1), max(0.0, seconds - took)

    def add(self, count, seconds):
        if count:
            self.shared.add(count, seconds)

    @property
    def per(self):
        return self.shared.per

    def fits(self, seconds):
        if self.started:
            return self.shared.fits(seconds)
        if seconds < self.first:
            return 0
        return 1 + self.shared.fits(seconds - self.first)


class Clock:
    """A time budget for a whole build, started once and drawn on by every search of it.

    `end` is start + the budget. What the build owes whatever the budget (its floor): one
    measurement of every unique layer (`latency(layer)` each: expected from its FLOPs, scaled
    by what the layers measured so far took; lanes measure side by side), one of every layer the fusion searches may add
    (pools and adds fused into their conv: an enumeration and a measurement each), and the
    library (`final_reserve`: the emitted files, its kernels' source at seconds a byte, since
    the joined program is one build whose cost grows with its code, and the runs of the
    network at its layers' measured times). The first search keeps FOLLOW_UP of its time (at least that minimum) for the
    searches after it, and each layer's deadline keeps one measurement for every layer after
    it. `pace` learns what one new measurement costs in a batch."""

    def __init__(self, budget, start=None, kind="gpu"):
        self.budget = parse_budget(budget)
        if self.budget.kind != "seconds":
            raise ValueError("a Clock needs a time budget")
        self.start = time.monotonic() if start is None else start
        self.end = self.start + self.budget.amount
        self.kind = kind
        self.pace = SharedPace(PACE_DEFAULT.get(kind, 1.0))
        self.builds = []                 # compile seconds of this run's measured candidates
        self.latencies = []              # (seconds to a layer's first new measurement, prior)
        self.net_ms = {}                 # op signature -> ms of its layers in one run
        self.sources = {}                # op signature -> (its kernel's source bytes, what
                                         # its runner took (or None), its layers)
        self.kernels = None              # kernels of the final library (the first search's layers)
        self.lanes = 1                   # layers measured at once (the first search's)
        self.spaces_s = 0.0              # spent enumerating the first search's spaces
        self.spaced = (0, 0)             # and how many (layers, points) they held
        self.searches = 0
        self.follow_up = 0.0             # kept for the searches after the first
        self.follow_share = 0.0          # FOLLOW_UP of what was left when the first began
        self.follow_owed = 0.0           # and the later searches' measurements counted then
        self.waits = 0.0                 # seconds the first search may still wait for the
                                         # spaces enumerated beside it (an estimate)
        self.fusable = ([], 0)           # (layers, points) the searches after the first may
                                         # enumerate and measure: the convs that may take a
                                         # pool or an add
        self.expected = 0.0              # the first search's layers' mean prior
        self.warned = False
        self.reserved = None             # the library's reserve when the first search ended

    @classmethod
    def make(cls, budget, target=None, start=None):
        """A Clock for a time budget (a Clock given stays itself); None for a trial budget or
        none."""
        if isinstance(budget, Clock):
            return budget
        b = parse_budget(budget)
        if b.kind != "seconds":
            return None
        return cls(b, start, getattr(target, "kind", "gpu") or "gpu")

    def left(self):
        return self.end - time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.start

    def byte_s(self):
        """Seconds one byte of kernel source adds to the library's build: LIBRARY_S_PER_BYTE,
        scaled by this run's mean candidate compile against BUILD_REF's (within 2x)."""
        ref = BUILD_REF.get(self.kind, 0.4)
        speed = float(np.mean(self.builds)) / ref if self.builds else 1.0
        return LIBRARY_S_PER_BYTE.get(self.kind, 1e-4) * min(2.0, max(0.5, speed))

    def kernel_s(self, size, runner=None):
        """What a kernel of `size` bytes of source adds to the library's build, or, where its
        measurement's runner took more than its source says (`runner` seconds), that."""
        by_size = size * self.byte_s()
        if runner is None:
            return by_size
        native = RUNNER_SHARE.get(self.kind, 0.0) * max(0.0, runner - RUNNER_OVERHEAD_S)
        return max(by_size, native)

    def build_s(self):
        """What one kernel adds to the library's build: the mean of the kernels chosen so
        far, KERNEL_BYTES of source before any."""
        n = sum(k for _, _, k in self.sources.values())
        if not n:
            return self.kernel_s(KERNEL_BYTES)
        return sum(self.kernel_s(b, r) * k for b, r, k in self.sources.values()) / n

    def prior(self, layer):
        """Wall seconds `layer`'s first measurement is expected to take, before any is made:
        LATENCY_BASE and LATENCY_PER_GFLOP of its FLOPs."""
        from ..ops import flops
        return (LATENCY_BASE.get(self.kind, 1.0)
                + LATENCY_PER_GFLOP.get(self.kind, 1.0) * flops(layer) / 1e9)

    def scale(self):
        """What this run's layers took against their priors: the median ratio, 1 before any
        was measured (the build's first layer, which also started the measuring processes,
        counts only while it is the only one)."""
        took = self.latencies[1:] or self.latencies
        return float(np.median([s / p for s, p in took if p > 0] or [1.0]))

    def measured(self, layer, seconds):
        """`layer`'s first new measurement came `seconds` after its search started."""
        self.latencies.append((seconds, self.prior(layer)))

    def latency(self, layer=None):
        """Wall seconds `layer`'s first measurement takes (its prior, scaled); without a
        layer, the first search's mean."""
        p = self.prior(layer) if layer is not None else (
            self.expected or LATENCY_BASE.get(self.kind, 1.0))
        return p * self.scale()

    def run_s(self):
        """One run of the network at its layers' measured times (those measured so far)."""
        return sum(self.net_ms.values()) / 1e3

    def library_s(self, kernels=None):
        """The library's build and runs: FINAL_BASE_S, the `kernels` (default the first
        search's layers: those chosen so far at kernel_s() of their own, the others at the
        mean source size), LIBRARY_RUNS runs of the network."""
        kernels = (self.kernels if kernels is None else kernels) or 0
        known = sum(k for _, _, k in self.sources.values())
        build = sum(self.kernel_s(b, r) * k for b, r, k in self.sources.values())
        # the layers not searched yet at their source's mean size: a network's heavy convs
        # (and their native code) tell little of the pools and adds after them
        size = sum(b * k for b, _, k in self.sources.values()) / known if known else \
            KERNEL_BYTES
        build += max(0, kernels - known) * self.kernel_s(size)
        total = sum(b * k for b, _, k in self.sources.values()) + max(0, kernels - known) * size
        return FINAL_BASE_S + self._joined(build, total) + LIBRARY_RUNS * self.run_s() + \
            self.end_s

    def _joined(self, build, total):
        """`build` seconds of one program's build shared by the joined programs a library of
        `total` source bytes is made as, built at once (binaries.groups_for: a GPU's), plus
        their processes' start (GROUPS_START_S)."""
        from ..binaries import GROUP_BYTES
        per = GROUP_BYTES.get(self.kind)
        if not per or total <= 0:
            return build
        parallel = max(1, min(os.cpu_count() or 1, -(-int(total) // per)))
        return build / parallel + (GROUPS_START_S if parallel > 1 else 0.0)

    @property
    def end_s(self):
        """The build's end after the library: END_S of the target's kind."""
        return END_S.get(self.kind, 1.0)

    @property
    def final_reserve(self):
        return self.library_s()

    def owed(self, layers):
        """Seconds searches of one measurement each of `layers` (Layers) take, `lanes` at a
        time."""
        return sum(self.latency(l) for l in layers) / max(1, self.lanes)

    def follow_up_min(self, layers=None):
        """What the searches after the first take at least: `layers` (default: the convs
        that may take a pool or an add) enumerated, at the first search's seconds per point of
        space and its fusable convs' points per layer, and measured once each."""
        convs, _ = self.fusable
        layers = convs if layers is None else list(layers)
        return self.enumeration_s(layers) + self.owed(layers)

    def enumeration_s(self, layers):
        """Seconds `layers` take to enumerate, at the first search's seconds per point of
        space and its fusable convs' points per layer."""
        convs, points = self.fusable
        per_layer = points / len(convs) if convs else (
            self.spaced[1] / self.spaced[0] if self.spaced[0] else 0.0)
        rate = self.spaces_s / self.spaced[1] if self.spaced[1] else 0.0
        return len(layers) * per_layer * rate

    def floor(self, layers):
        """When the build ends at the soonest, `layers` (Layers) still to measure once: the
        network's search measures each once, the library and the build's end follow, and the
        searches after the network's take their minimum where the budget leaves room for it
        and what room it leaves otherwise (one that does not fit measures nothing:
        compiler._time_for). Counting them whatever the room said far more than a late build
        took (VGG-16 at batch 16 on an H100: 177 s said, 62 s taken, its five fusion
        searches left out)."""
        main = self.elapsed() + self.waits + self.owed(layers) + self.final_reserve
        return main + self.follow_ups(main)

    def follow_ups(self, main):
        """Seconds the searches after the network's take in a build whose network search,
        library and end take it to `main` seconds: their minimum where it fits in the budget,
        else what the budget leaves."""
        need = self.follow_up_min()
        return need if main + need <= self.budget.amount else \
            max(0.0, self.budget.amount - main)

    def search_left(self):
        """Seconds this moment's search may still spend (after the reserves)."""
        keep = self.final_reserve + (self.follow_up if self.searches <= 1 else 0.0)
        return self.left() - keep

    def search_end(self):
        """When this moment's search must end (time.monotonic()), the reserves kept."""
        return time.monotonic() + self.search_left()

    def affords(self, layers):
        """Whether a later search of `layers` (its unique Layers), enumerated and measured
        once each, fits before the library's reserve."""
        return self.left() - self.final_reserve >= self.follow_up_min(layers)

    def begin(self, layers, fusable=([], 0), progress=None, kernels=None, lanes=1,
              spaces=(0.0, 0)):
        """A search of `layers` (its unique Layers) starts, their spaces enumerated in
        spaces = (seconds, points): the first fixes the reserves, for `fusable` = (the convs
        that may take a pool or an add, their points) and the library's `kernels` (default
        one a layer), `lanes` layers measured at once; it says so before anything is
        measured when the floor exceeds the budget by more than 10%."""
        self.searches += 1
        if self.searches == 1:
            layers = list(layers)
            self.kernels = len(layers) if kernels is None else kernels
            self.lanes, self.fusable = max(1, lanes), (list(fusable[0]), fusable[1])
            self.spaces_s, self.spaced = spaces[0], (len(layers), spaces[1])
            self.expected = (sum(self.prior(l) for l in layers) / len(layers) if layers
                             else 0.0)
            spare = self.left() - self.waits - self.final_reserve - self.owed(layers)
            self.follow_share = FOLLOW_UP * max(0.0, spare)
            self.follow_owed = self.owed(self.fusable[0])
            self.follow_up = max(self.follow_share, self.follow_up_min())
            self.check(layers, progress)

    def enumerated(self, spaces, fusable, waits=0.0):
        """The first search's spaces as known now, while they are still being enumerated
        beside it: `spaces` and `fusable` as begin() takes them (estimates for the layers not
        enumerated yet, NetworkSpaces), `waits` what the search may still wait for them. The
        reserve for the searches after it follows the estimate of their enumeration (their
        measurements counted as when it began, so that it moves only by what the spaces say:
        FOLLOW_UP of what was left then, or their minimum, whichever is more)."""
        if self.searches != 1:
            return
        self.spaces_s, self.spaced = spaces[0], (self.spaced[0], spaces[1])
        self.fusable = (list(fusable[0]), fusable[1])
        self.waits = waits
        self.follow_up = max(self.follow_share,
                             self.enumeration_s(self.fusable[0]) + self.follow_owed)

    def check(self, layers, progress):
        """Warn (once) when the floor, `layers` (Layers) still to measure, is past 1.1 x the
        budget: before anything is measured, at the priors, or once LATE_SAMPLES layers are."""
        if progress is None or self.warned or 0 < len(self.latencies) < LATE_SAMPLES:
            return False
        floor = self.floor(layers)
        if floor <= 1.1 * self.budget.amount:
            return False
        self.warned = True
        # past the budget, the network's search alone is: the searches after it will find
        # no room (floor)
        n = len(layers)
        basis = (f"{self.scale():.1f}x what their FLOPs suggest, as the "
                 f"{len(self.latencies)} measured so far took" if self.latencies
                 else "expected from their FLOPs")
        convs = len(self.fusable[0])
        after = (f"; no time left for the searches after it ({convs} conv"
                 f"{'s' if convs != 1 else ''} a pool or an add may be fused into, layout "
                 f"conversions): they will measure nothing" if convs else "")
        progress.warn(
            f"budget {self.budget}: this build needs about {floor:.0f} s at least "
            f"({self.elapsed():.0f} s spent so far; {n} layer{'s' if n != 1 else ''} still to "
            f"measure once, {self.lanes} at a time, about {self.owed(layers):.0f} s, {basis}; "
            f"the library's build and runs and the build's end about "
            f"{self.final_reserve:.0f} s{after}); it will take about that, not "
            f"{self.budget.amount:g} s")
        return True

    def layer_done(self, result):
        """A layer of the first search finished: its time counts to the network's run, its
        chosen kernel's source to the library's."""
        if self.searches > 1:
            return
        sig = result.layers[0].signature_str()
        if result.best_outcome is not None and result.best_outcome.ok:
            self.net_ms[sig] = result.best_outcome.time_ms * len(result.layers)
        size = source_bytes(result)
        if size:
            runner = (result.runner_s or {}).get(result.best or result.fallback)
            self.sources[sig] = (size, runner, len(result.layers))


def source_bytes(result):
    """Bytes of the OpenCL source of the kernel a layer search chose (its fallback where none
    ran), or None where it does not render."""
    cand = result.best or result.fallback
    variants = {p.variant.name: p.variant for p in result.space.parts}
    v = variants.get(cand.variant)
    if v is None:
        return None
    try:
        return len(v.render(result.layers[0], cand.cfg, "k"))
    except Exception:          # an estimate only: a point that does not render is no size
        return None


def share(total, weights, caps, floor=1):
    """Split `total` among items by `weights`, each at least min(floor, cap) and at most cap;
    what a capped item cannot take goes to the others (water-filling). Integers when `total` is
    an int, summing to at most `total`."""
    n = len(weights)
    integral = isinstance(total, int)
    alloc = [min(floor, c) for c in caps]
    left = total - sum(alloc)
    active = [i for i in range(n) if alloc[i] < caps[i]]
    while left > 1e-9 and active:
        w = sum(weights[i] for i in active)
        give = {i: left * (weights[i] / w if w > 0 else 1.0 / len(active)) for i in active}
        capped = [i for i in active if alloc[i] + give[i] >= caps[i]]
        if not capped:
            for i in active:
                alloc[i] += give[i]
            left = 0
            break
        for i in capped:
            left -= caps[i] - alloc[i]
            alloc[i] = caps[i]
        active = [i for i in active if i not in capped]
    if not integral:
        return alloc
    base = [int(math.floor(a + 1e-9)) for a in alloc]
    rest = total - sum(base)
    order = sorted(range(n), key=lambda i: -(alloc[i] - base[i]))
    for i in order:
        if rest <= 0:
            break
        if base[i] < caps[i]:
            base[i] += 1
            rest -= 1
    return base


def est_seconds(layer, target):
    """Roofline estimate of one run of `layer` on `target`: what budget sharing weighs."""
    from ..ops import flops, bytes_moved
    f, b = flops(layer), bytes_moved(layer)
    if target.peak_gflops and target.peak_gbps:
        return max(f / (target.peak_gflops * 1e9), b / (target.peak_gbps * 1e9))
    return (f + b) * 1e-9


# -- one layer ---------------------------------------------------------------------------------

@dataclass
class LayerResult:
    layers: list               # the identical layers this result serves
    space: object              # space.LayerSpace
    best: Candidate            # None when nothing valid was found
    best_outcome: Outcome
    outcomes: dict             # Candidate -> Outcome, every candidate measured (records too)
    fallback: Candidate
    new: int = 0               # measured in this run
    trials: int = 0            # granted
    seconds: float = 0.0
    strategy: str = ""
    trace: list = None         # best cost after each trial of this search
    runner_s: dict = None      # Candidate -> seconds measuring it took beyond its compile and
                               # its timed runs (its load and first launch, where PoCL makes
                               # its native code), for those measured in this run after the
                               # layer's first
    borrowed: object = None    # records.Borrowed: `best` is a twin signature's recorded
                               # point (records_only with borrow), best_outcome None


def fallback_candidate(layer, target, space=None):
    """The first variant's fallback valid under `target`'s limits; failing that another
    variant's, failing that the first surviving point of any space."""
    from ..space import why_pruned
    from ..variants import for_layer
    variants = [p.variant for p in space.parts] if space is not None else for_layer(layer)
    for v in variants:                           # the usual case: no enumeration needed
        cfg = fallback_point(layer, v, target)
        if cfg is not None:
            return Candidate(v.name, cfg)
    if space is None or not all(p.enumerated for p in space.parts):
        space = layer_space(layer, target)
    for p in space.parts:
        if p.points:
            return Candidate(p.variant.name, p.points[0])
    if not space.parts:
        raise AotconvError(f"layer '{layer.name}': no kernel variant implements op "
                           f"'{layer.op}' with these attributes")
    raise AotconvError(f"layer '{layer.name}': no configuration of "
                       f"{', '.join(p.variant.name for p in space.parts)} is valid under "
                       f"target '{target.name}' limits, {why_pruned(space)} "
                       f"(see `aotconv space`)")


def known_outcomes(space, store, target, device):
    """{Candidate: Outcome} from records matching the live key, restricted to valid points."""
    out = {}
    for p in space.parts:
        valid = p.members
        for cfg, o in store.lookup(Key(space.layer, p.variant, target, device)).items():
            if cfg in valid:
                out[Candidate(p.variant.name, cfg)] = o
    return out


RECHECK = 3


def tune_layer(space, target, measurer, store, device, strategy=DEFAULT, trials=DEFAULT_TRIALS,
               deadline=None, seed=0, progress=None, layers=None, clock=None, library=None,
               lane=None, recheck=RECHECK):
    """Search `space` (a LayerSpace) on the device; records every outcome as it comes.

    clock: the build's Clock (its pace cuts batches to the deadline; build times feed its
    reserve); library: a seeding.Library of this device's records, for seeds and a prior;
    lane: the `Lanes` this search runs in beside others (their lock guards the store, the
    library, the clock and the progress; their stop ends it at its next batch); recheck: how
    many of the fastest recorded points are timed again in this run (module docstring)."""
    started = time.monotonic()
    layer = space.layer
    layers = layers or [layer]
    # a streaming search's outcomes arrive on threads of their own: one lock for what they touch
    streams = bool(getattr(measurer, "streams", False))
    guard = lane.lock if lane is not None else \
        (threading.RLock() if streams else contextlib.nullcontext())
    variants = {p.variant.name: p.variant for p in space.parts}
    keys = {p.variant.name: Key(layer, p.variant, target, device) for p in space.parts}
    fb = fallback_candidate(layer, target, space)
    grid = space.grid()
    with guard:
        known = known_outcomes(space, store, target, device)
    outcomes = dict(known)
    t0 = time.monotonic()
    state = {"new": 0, "at": None, "first": False}
    runner_s = {}
    timed = set()                   # the candidates this run has measured

    def on_outcome(cand, o):
        with guard:
            if lane is not None and lane.interrupted:
                return              # the run is going away: a worker killed now is no result
            outcomes[cand] = o
            timed.add(cand)
            now = time.monotonic()
            if clock is not None and not state["new"]:
                clock.measured(layer, now - started)
                if pace is not None:
                    pace.came(now - state["at"])
            if state["at"] is not None and state["new"] and not ev.streaming:
                # a CPU device's measurer compiles a batch, then runs it one by one: the time
                # since the previous outcome is this one's run, less its repeats (and the
                # batch's compile for its first); not the layer's first, whose run also made
                # the layer's data and float64 reference
                gap = now - state["at"] - (o.build_s or 0.0 if state["first"] else 0.0)
                runner_s[cand] = max(0.0, gap - (len(o.times) + 2) * (o.time_ms or 0.0) / 1e3)
            state["at"], state["first"] = now, False
            state["new"] += 1
            extra = {"fallback": True} if cand == fb else {}
            store.append(keys[cand.variant], cand.cfg, o, layer=layer.name, **extra)
            if clock is not None and o.build_s:
                clock.builds.append(o.build_s)
            if library is not None and o.ok:
                library.add(keys[cand.variant].op, cand.variant, cand.cfg, o.time_ms)
            if progress is not None:
                progress.trial(cand, o, outcomes)

    price = Pricer(layer, variants, target)     # time + the gaps of launches beyond one
    pace = FirstPace(clock.pace, clock.latency(layer), started, clock.search_end) \
        if clock is not None else None

    def measure(indices):
        if lane is not None and lane.stop.is_set():
            raise Stopped()
        cands = [grid.points[i] for i in indices]
        state["at"], state["first"] = time.monotonic(), True
        return [price(c, o) for c, o in
                zip(cands, measurer.measure(layer, cands, variants, on_outcome))]

    known_costs = {grid.index[c]: price(c, o) for c, o in known.items() if c in grid.index}
    # the fastest records first, timed again; then every variant's fallback: cheap, diverse
    # starting points, so a small budget never leaves a layer on a variant that another
    # variant's default beats
    again = [c for c in fastest(known, price, recheck) if c in grid.index]
    for c in again:
        del known_costs[grid.index[c]]
    if space.where:
        # narrowed by --where: the fastest records outside it, projected onto it (a knob value
        # tried first where the records know the rest of the point is fast)
        with guard:
            again += twins(space, store, keys, price, recheck, set(again) | set(known))
    # The best points of similar layers in the records come right after the layer's own
    # fallback: under a tight deadline a batch is cut to its first few, and a guided build's
    # seeds beat the other variants' defaults (ResNet-50 b1 guided for 90 s on an H100: its
    # early layers measured their fallback alone)
    seeds = again + [fb] + [Candidate(p.variant.name, cfg) for p in space.parts
                            if (cfg := fallback_point(layer, p.variant, target)) is not None]
    seeds = [c for c in dict.fromkeys(seeds) if c in grid.index][:max(1, trials)]
    seed_idx = [grid.index[c] for c in seeds]
    hints = None
    if library is not None and len(grid):
        with guard:
            hints = library.hints(layer.signature_str(), grid, exclude=seed_idx,
                                  max_seeds=min(seeding_max(trials),
                                                max(0, trials - len(seeds))))
        first = sum(1 for c in seeds if c == fb or c in again)
        seed_idx = seed_idx[:first] + list(hints.seeds) + seed_idx[first:]
    # under a deadline only the first fallback is owed; without one, every variant's
    ev = Evaluator(len(grid), measure, trials=max(1, trials), deadline=deadline,
                   known=known_costs, min_trials=1 if deadline is not None else len(seeds),
                   pace=pace, hints=hints,
                   chunk=getattr(measurer, "slots", None))
    # the measurer's room in flight, shared by the searches running now: a search left alone
    # proposes batches that wide (strategies.model.wide)
    capacity = max(1, int(getattr(measurer, "capacity", 1) or 1))
    ev.width = (lambda: capacity // max(1, lane.active)) if lane is not None else \
        (lambda: capacity)
    # where the measurer overlaps compiles with runs, the strategy may keep its candidates in
    # flight while it proposes more (strategies.base, Streaming)
    ev.can_stream = streams
    rng = np.random.default_rng([seed, zlib.crc32(layer.signature_str().encode())])
    if lane is not None:
        with guard:
            lane.active += 1
    try:
        if len(grid):
            try:
                ev(seed_idx)
                run_strategy(strategy, grid, ev, rng)
                ev.drain()                  # what is still in flight is measured and kept
            except Exception as e:
                from .strategies import Exhausted
                if not isinstance(e, Exhausted):
                    raise
                ev.drain()
            if again:
                _recheck(outcomes, timed, price, recheck, grid, measure, deadline,
                         done=sum(1 for c in known if c in timed))
    finally:
        if lane is not None:
            with guard:
                lane.active -= 1
    valid = [(price(c, o), c) for c, o in outcomes.items() if o.ok]
    best = min(valid, key=lambda x: (x[0], str(x[1])))[1] if valid else None
    return LayerResult(layers, space, best, outcomes.get(best), outcomes, fb,
                       new=state["new"], trials=ev.trials, seconds=time.monotonic() - t0,
                       strategy=strategy, trace=list(ev.trace), runner_s=runner_s)


def twins(space, store, keys, price, k, exclude=()):
    """Up to `k` Candidates of the narrowed `space` (space.where): the layer's fastest correct
    records that lie outside it, each projected onto it (space.projected), fastest first,
    without repeats or `exclude`."""
    from ..space import projected
    outside = {}
    for p in space.parts:
        if p.variant.name not in (space.where or {}):
            continue
        members = p.members
        for cfg, o in store.lookup(keys[p.variant.name]).items():
            if o.ok and cfg not in members:
                outside[Candidate(p.variant.name, cfg)] = o
    out = []
    for c in fastest(outside, price, len(outside)):
        t = projected(space, c.variant, c.cfg)
        if t is not None:
            t = Candidate(c.variant, t)
            if t not in exclude and t not in out:
                out.append(t)
                if len(out) >= k:
                    break
    return out


def fastest(outcomes, price, k):
    """The `k` fastest correct candidates of {Candidate: Outcome} by `price`, fastest first."""
    ok = sorted((price(c, o), str(c), c) for c, o in outcomes.items() if o.ok)
    return [c for _, _, c in ok[:max(0, k)]]


def _recheck(outcomes, timed, price, k, grid, measure, deadline, done=0):
    """Time again, while the deadline allows, each of the `k` fastest points that this run
    has not timed (records from other runs), until the `k` fastest were all timed here or
    2k recorded points were (`done` of them already)."""
    from .strategies import Exhausted
    while done < 2 * k and (deadline is None or time.monotonic() < deadline):
        stale = [c for c in fastest(outcomes, price, k) if c not in timed and c in grid.index]
        if not stale:
            return
        stale = stale[:2 * k - done]
        try:
            measure([grid.index[c] for c in stale])
        except Exhausted:
            return
        timed.update(stale)         # a point that failed now is not timed again
        done += len(stale)


def seeding_max(trials):
    """Seeds from similar layers a search of `trials` takes: at most MAX_SEEDS, a quarter of
    its trials."""
    from .strategies.seeding import MAX_SEEDS
    return min(MAX_SEEDS, max(0, trials // 4))


# -- a network ---------------------------------------------------------------------------------

def unique_layers(layers):
    """[[layer, identical layers...]] in network order, one group per op signature."""
    groups = {}
    for l in layers:
        groups.setdefault(l.signature_str(), []).append(l)
    return list(groups.values())


def fusable_index(groups):
    """The indices of the unique convs among `groups` whose output a pool or an add reads
    (the fusion searches may enumerate and measure each fused with it)."""
    where = {l.name: i for i, g in enumerate(groups) for l in g}
    return sorted({where[t] for g in groups for l in g if l.op in FUSABLE_OPS
                   for t in l.inputs if t in where and groups[where[t]][0].op == "conv"})


def fusable_convs(groups, spaces):
    """([layer], points): the convs of fusable_index and their spaces' points."""
    convs = fusable_index(groups)
    return [groups[i][0] for i in convs], sum(len(spaces[i].candidates) for i in convs)


class NetworkSpaces:
    """The spaces of a network search's layers (one of each group) while they are enumerated
    beside it (`space.Spaces`: the first layers first): `spaces[i]` waits for layer i's alone
    (the build's "spaces" phase counts the wait), narrowed by `where` and `layouts` as
    tune_network narrows them.

    What the budget needs of every space before a layer starts is estimated from those known
    by then, and the estimates follow as the others arrive: the seconds a point of space takes
    to enumerate and the points of a space (the mean of those known, for the fusion searches'
    reserve: `enumeration`, `fusable`), and how long the search may still wait for the spaces
    not known yet (`waiting`). A trial budget shares its trials by every layer's size, so it
    (and a search narrowed by `where`, whose errors name a layer's space) waits for them all
    before the first layer starts, as when they were enumerated first."""

    def __init__(self, stream, groups, where=None, layouts=None, seconds=0.0):
        self.stream = stream if isinstance(stream, Spaces) else Spaces.of(list(stream), seconds)
        self.groups, self.where, self.layouts = groups, where, layouts
        self._got, self._size = {}, {}
        self.sizes = _Sizes(self)

    def __len__(self):
        return len(self.groups)

    def __getitem__(self, i):
        if i not in self._got:
            with phase("spaces"):
                sp = self.stream[i]
            if self.where:
                from ..space import restrict
                sp = restrict(sp, self.where)
            sig = self.groups[i][0].signature_str()
            if self.layouts and sig in self.layouts:
                from ..space import restrict_layouts
                sp = restrict_layouts(sp, *self.layouts[sig])
            self._got[i] = sp
        return self._got[i]

    def size(self, i):
        """Points of layer i's space (waits for it)."""
        if i not in self._size:
            self._size[i] = len(self[i].candidates)
        return self._size[i]

    def all(self):
        return [self[i] for i in range(len(self))]

    def known(self):
        """The layers whose spaces are known now (taken, or there to be taken at once)."""
        for i in range(len(self)):
            if i not in self._got and self.stream.ready(i):
                self[i]
        return sorted(self._got)

    def _seconds(self, known):
        """Wall seconds the `known` spaces took, their workers side by side."""
        return sum(self.stream.seconds(i) or 0.0 for i in known) / max(1, self.stream.jobs)

    def enumeration(self):
        """(seconds, points) of every layer's space (Clock.begin's `spaces`): those known,
        and the others at their mean."""
        known = self.known()
        if not known:
            return 0.0, 0
        scale = len(self) / len(known)
        return self._seconds(known) * scale, sum(self.size(i) for i in known) * scale

    def fusable(self):
        """([conv], points) of the convs a pool or an add may be fused into (Clock.begin's
        `fusable`): the points of those known, the others at the mean of the convs known (of
        every layer known, where no conv is)."""
        idx, known = fusable_index(self.groups), self.known()
        points = sum(self.size(i) for i in idx if i in self._got)
        unknown = [i for i in idx if i not in self._got]
        if unknown and known:
            like = [self.size(i) for i in known if self.groups[i][0].op == "conv"] or \
                [self.size(i) for i in known]
            points += len(unknown) * sum(like) / len(like)
        return [self.groups[i][0] for i in idx], points

    def waiting(self, i, ahead=0.0):
        """Seconds the search may still wait for the spaces of the layers after `i`: the
        layers not enumerated yet at the mean time of those that are, over the workers, less
        `ahead` (layer i's own time, during which the workers go on); enumerated here (no
        workers), each of them in full when it starts. A bound more than a forecast: most
        spaces are there before the search reaches them."""
        known = self.known()
        pending = [j for j in range(i + 1, len(self)) if j not in self._got]
        if not pending or not known:
            return 0.0
        per = sum(self.stream.seconds(j) or 0.0 for j in known) / len(known)
        if not self.stream.jobs:
            return len(pending) * per
        return max(0.0, len(pending) * per / self.stream.jobs - ahead)

    def close(self):
        self.stream.close()


class _Sizes(Sequence):
    """Each layer's number of points, read when asked for (Grants' caps)."""

    def __init__(self, spaces):
        self.spaces = spaces

    def __len__(self):
        return len(self.spaces)

    def __getitem__(self, i):
        return self.spaces.size(i)


class Grants:
    """What each layer of a network search may spend, decided when the layer starts from what
    is left then (layers start in network order; with lanes, while others still run).

    trials: the pool is shared among the layers not started yet by `share`; trials granted to
    running layers are reserved, and what a layer leaves unused returns to the pool when it
    finishes, so the total never exceeds the budget (each layer still gets at least its
    fallback). seconds: the clock's search time left, times the lanes, less what the running
    layers' deadlines still hold and one measurement (`clock.latency(layer)`) for each layer
    not started, is shared the same way on top of the layer's own measurement (a later one
    moves the deadline: FirstPace.moved), and no deadline passes the clock's (with one lane:
    the clock's time left). default: up to DEFAULT_TRIALS per layer.

    `sizes` is read when a layer starts: its own size (time budgets, the default), every
    later layer's too (trials). `waiting(i, ahead)`, where given, is what the layers after
    layer i may wait for their spaces (NetworkSpaces.waiting): kept from the share as the
    time every lane may lose then."""

    def __init__(self, budget, weights, sizes, clock=None, lanes=1, layers=None, waiting=None):
        self.budget, self.weights = budget, list(weights)
        self.sizes = sizes if isinstance(sizes, Sequence) else list(sizes)
        self.clock, self.lanes = clock, max(1, int(lanes))
        self.layers = layers           # the layers (one of each group), for what each is owed
        self.waiting = waiting
        self.pool = budget.amount if budget.kind == "trials" else 0
        self.reserved = {}             # layer -> trials granted while it runs
        self.deadlines = {}            # layer -> its deadline while it runs

    def start(self, i):
        """(trials, deadline or None) of layer `i`, starting now."""
        rest = range(i, len(self.weights))
        w = [self.weights[j] for j in rest]
        deadline = None
        if self.budget.kind == "trials":
            free = int(self.pool - sum(self.reserved.values()))
            grant = share(max(0, free), w, [max(1, self.sizes[j]) for j in rest])[0]
            self.reserved[i] = grant
        elif self.budget.kind == "seconds":
            # recomputed from the clock at every layer: an earlier layer's overrun is paid
            # here. Each layer not started yet is owed one measurement (`latency` of a lane's
            # time, whatever its share); what is left after those is shared by weight.
            now = time.monotonic()
            left = max(0.0, self.clock.search_left())
            held = sum(max(0.0, d - now) for d in self.deadlines.values())
            owed = [self.clock.latency(self.layers[j]) if self.layers is not None else
                    self.clock.latency() for j in rest] \
                if hasattr(self.clock, "latency") else [0.0 for _ in rest]
            spare = self.lanes * left - held - sum(owed)
            if self.waiting is not None:
                spare -= self.lanes * self.waiting(i, owed[0])
            grant_s = owed[0] + share(max(0.0, spare), w, [math.inf for _ in rest],
                                      floor=0.0)[0]
            grant, deadline = max(1, self.sizes[i]), now + min(left, grant_s)
            self.deadlines[i] = deadline
        else:
            grant = min(max(1, self.sizes[i]), DEFAULT_TRIALS)
        return grant, deadline

    def done(self, i, used):
        """Layer `i` finished having visited `used` points: the rest of its grant returns."""
        if self.budget.kind == "trials":
            self.pool -= min(self.reserved.pop(i), used)
        self.deadlines.pop(i, None)

    @property
    def spent(self):
        return self.budget.amount - self.pool if self.budget.kind == "trials" else None


class Stopped(Exception):
    """A lane's search ended because another lane failed or the run was interrupted."""


class Lanes:
    """What the searches running at once share: one lock for the store, the library, the clock
    and the progress, and the signals to stop (an error in another lane: no new batch starts)
    and that the run was interrupted (outcomes arriving after that are not recorded: a worker
    killed while the caller closes it is no measurement)."""

    def __init__(self, width):
        self.width = width
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.interrupted = False
        self.active = 0                 # searches running now (they share the measurer)


def lanes_for(measurer, lanes=None, layers=None):
    """How many layers are searched at once: `lanes`, else $AOTCONV_LANES, else the
    measurer's own choice (MeasurerBase.lanes); at least 1, at most `layers`."""
    given = f"--lanes {lanes}"
    if lanes is None and os.environ.get(LANES_ENV):
        lanes = os.environ[LANES_ENV]
        given = f"{LANES_ENV}={lanes!r}"
    if lanes is None:
        lanes = getattr(measurer, "lanes", 1) or 1
    text = str(lanes).strip()
    if not text.isdigit() or int(text) < 1:
        raise AotconvError(f"{given}: give a positive number of layers to search at once")
    n = int(text)
    return min(n, max(1, layers)) if layers is not None else n


def run_lanes(n, width, begin, work, end, lanes=None):
    """For i = 0..n-1 in order: args = begin(i) and, when it finishes, end(i, work(i, args)).
    begin and end run on this thread; work on up to `width` lane threads at once (width 1:
    on this thread). An exception in a lane stops the others at their next batch, waits for
    them and is raised here; an interrupt (or any exception) on this thread marks the lanes
    interrupted and is raised at once (the lane threads are daemons: they die with the
    process)."""
    if width <= 1:
        for i in range(n):
            end(i, work(i, begin(i)))
        return
    lanes = lanes or Lanes(width)
    done = queue.Queue()

    def lane(i, args):
        try:
            done.put((i, True, work(i, args)))
        except BaseException as e:          # KeyboardInterrupt from a callback too
            done.put((i, False, e))

    active, nxt, error = {}, 0, None
    try:
        while nxt < n or active:
            while nxt < n and len(active) < width and error is None:
                t = threading.Thread(target=lane, args=(nxt, begin(nxt)), daemon=True,
                                     name=f"aotconv-lane-{nxt}")
                active[nxt] = t
                t.start()
                nxt += 1
            if not active:
                break
            i, ok, value = done.get()
            active.pop(i).join()
            if ok:
                end(i, value)
            elif error is None or isinstance(error, Stopped):
                error = value
                lanes.stop.set()
    except BaseException:
        lanes.interrupted = True
        lanes.stop.set()
        raise
    if error is not None:
        raise error


def tune_network(groups, target, measurer, store, device, *, budget=None, strategy=DEFAULT,
                 seed=0, progress=None, share_by="cost", where=None, seeding=True, lanes=None,
                 recheck=RECHECK, layouts=None):
    """{signature: LayerResult} for each group of identical layers (in network order),
    sharing `budget` by roofline cost times occurrences (share_by="cost") or equally
    (share_by="equal"); `where` ({variant: {knob: values}}, space.parse_where) narrows the
    search. A time budget may be the build's Clock (shared with the build's other searches);
    given as text or a Budget, it starts now. seeding=False: no seeds or prior from similar
    layers' records. lanes: how many layers are searched at once (lanes_for). recheck: how
    many of a layer's fastest recorded points it times again (module docstring). layouts:
    {signature: (read, write)}, those layers searched only in points that store their input and
    output as those layouts do (space.restrict_layouts: the layout plan's refinement)."""
    if share_by not in ("cost", "equal"):
        raise AotconvError(f"unknown budget sharing '{share_by}': use cost or equal")
    parse_strategy(strategy)
    width = lanes_for(measurer, lanes, len(groups))
    clock = budget if isinstance(budget, Clock) else Clock.make(budget, target)
    budget = parse_budget(budget)
    firsts = [g[0] for g in groups]
    t0 = time.monotonic()
    with phase("spaces"):
        stream = layer_spaces(firsts, target)
        if isinstance(stream, Spaces):
            # enumerated beside the search, the first layers first (NetworkSpaces), by half
            # the cores' worth of workers: the search's compiles take the rest. A CPU
            # device's timings share the cores with them as with its compiles: a layer is
            # enumerated only where a compile could run (measure.Phases)
            phases = getattr(measurer, "_phases", None)
            stream.start(jobs=max(1, (os.cpu_count() or 1) // 2),
                         gate=phases.compile if phases is not None else None)
        spaces = NetworkSpaces(stream, groups, where, layouts, time.monotonic() - t0)
    try:
        return _tune_spaces(groups, spaces, target, measurer, store, device, budget, clock,
                            strategy, seed, progress, share_by, seeding, width, recheck)
    finally:
        spaces.close()


def _tune_spaces(groups, spaces, target, measurer, store, device, budget, clock, strategy,
                 seed, progress, share_by, seeding, width, recheck):
    """tune_network once its spaces are being enumerated (`spaces`: NetworkSpaces)."""
    firsts = [g[0] for g in groups]
    if budget.kind == "trials" or spaces.where:
        spaces.all()
    elif groups:
        spaces[0]
    weights = [est_seconds(g[0], target) * len(g) if share_by == "cost" else 1.0
               for g in groups]
    library = None
    if seeding and store is not None:
        # every variant that may search a layer (a layer's seeds and prior read the records
        # of its own space's variants only: more are never read)
        names = {v.name for l in firsts for v in supporting(l, target)[0]}
        library = Library.from_store(store, target, device, names)
    first = clock is not None and clock.searches == 0
    if clock is not None:
        if first:
            clock.waits = spaces.waiting(0)
        clock.begin(firsts, spaces.fusable(), progress,
                    kernels=sum(len(g) for g in groups), lanes=width,
                    spaces=spaces.enumeration())
    extra = {k: v for k, v in (("clock", clock), ("library", library)) if v is not None}
    shared = None
    if width > 1:
        shared = extra["lane"] = Lanes(width)
    guard = shared.lock if shared is not None else contextlib.nullcontext()
    grants = Grants(budget, weights, spaces.sizes, clock, width, firsts,
                    waiting=spaces.waiting if clock is not None else None)
    results = {}

    def begin(i):
        spaces[i]                        # its space (waited for here, not under the lock)
        with guard:
            if first and i:
                clock.enumerated(spaces.enumeration(), spaces.fusable(), spaces.waiting(i))
            return grants.start(i)

    def work(i, grant_deadline):
        grant, deadline = grant_deadline
        if progress is not None:
            with guard:
                progress.layer_start(i, len(groups), groups[i], spaces[i], grant, deadline)
        r = tune_layer(spaces[i], target, measurer, store, device, strategy, grant, deadline,
                       seed, progress, layers=groups[i], recheck=recheck, **extra)
        if progress is not None:
            with guard:
                progress.layer_done(r)
        return r

    def end(i, r):
        results[groups[i][0].signature_str()] = r
        with guard:
            grants.done(i, len(r.trace))
            if clock is not None:
                clock.layer_done(r)
                # the layers measured so far say what one costs: warn now if the floor is
                # past the budget after all (once; the first warning may have come before)
                if clock.searches == 1:
                    clock.check([g[0] for g in groups if g[0].signature_str() not in results],
                                progress)

    run_lanes(len(groups), width, begin, work, end, shared)
    if first:
        # every space is known now: the searches after this one are reserved for at what
        # they took
        clock.enumerated(spaces.enumeration(), spaces.fusable())
    if clock is not None and clock.searches == 1:
        clock.reserved = clock.final_reserve
    return {g[0].signature_str(): results[g[0].signature_str()] for g in groups}


def records_only(groups, target, store, device=None, borrow=False):
    """{signature: LayerResult} from records alone (no device needed). The recorded points
    are checked one by one against the current constraints and limits, not enumerated.
    borrow=True: a layer with no ok record of its own takes the best recorded point of a
    signature that differs from its own only in the epilogue (records.borrow), as
    `borrowed`, with no time of its own."""
    from ..space import checked_space
    from ..variants import for_layer
    results = {}
    for g in groups:
        recs = {v.name: store.lookup(Key(g[0], v, target, device)) for v in for_layer(g[0])}
        sp = checked_space(g[0], target, {n: list(r) for n, r in recs.items()})
        outcomes = {Candidate(p.variant.name, c): recs[p.variant.name][c]
                    for p in sp.parts for c in p.points}
        price = Pricer(g[0], {p.variant.name: p.variant for p in sp.parts}, target)
        valid = [(price(c, o), c) for c, o in outcomes.items() if o.ok]
        best = min(valid, key=lambda x: (x[0], str(x[1])))[1] if valid else None
        lent = None
        if best is None and borrow:
            from .records import borrow as borrow_point
            lent = borrow_point(g[0], target, store, device, exclude=set(outcomes))
            best = lent.candidate if lent is not None else None
        try:
            fb = fallback_candidate(g[0], target, sp)
        except AotconvError:
            if best is None:
                raise
            fb = best
        results[g[0].signature_str()] = LayerResult(g, sp, best, outcomes.get(best), outcomes,
                                                    fb, strategy="records", borrowed=lent)
    return results

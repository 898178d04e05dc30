"""Measure candidates on the device: build in parallel, then run, verify and time one at a time.

Every outcome is a typed `Outcome` (TVM's MeasureErrorNo, Kernel Tuner's failed-config
values); nothing a candidate does escapes as an exception:

    ok             median time of the repeats (ms), every repeat's time
    build_failed   the compiler's log (or why rendering failed)
    launch_failed  the OpenCL error by name (or the worker process's death)
    wrong          the largest scaled error against the numpy reference
    timed_out      the kernel (or the compiler) ran past its deadline and its process was killed
    pruned         a constraint rejected the point (written by the search, never measured)

Processes: `jobs` builder processes compile OpenCL sources to program binaries in parallel
(pyopencl objects do not pickle, so sources go in and binaries come out; on PoCL the builds
fill its kernel cache instead, which the runner's rebuild hits); one runner process
owns the device context, loads each binary and measures the candidate by aotconv.protocol,
the rules `aotconv bench` follows too: fresh random data in the variant's storage order, the
output poisoned, checked against reference.forward (float64, hybrid tolerance), then a warm-up
launch on every copy of the buffers (as many as spill the last-level cache twice) and repeats
until about `min_total_ms`, each on the next copy. The parent waits on each process with a
deadline and kills one that overstays it, so a hung kernel costs `timeout_s`.
On a CPU device builds finish before timing starts (they would steal the cores being timed);
on a GPU they overlap.

Several searches may measure at once (tune.search lanes): `measure` is safe to call from
several threads. Their compiles share the builder pool, their runs take the runner one at a
time (a lock), and on a CPU device no run starts while a compile of any of them is in flight,
nor a compile while a run is (`Phases`), so a timing never shares the cores with a compile.
`Measurer.lanes` says how many searches it serves best: 2 on a GPU (one search's compiles
overlap another's runs), 1 on a CPU device (see there).

`MeasurerBase` is what the search measures with: this module's `Measurer` (the processes of
this machine) and `tune.farm.Farm` (devices and CPUs of a Ray cluster) implement it. Both
prepare candidates with `prepare_job` and run them with `run_job`, so an outcome means the
same whichever measured it.
"""
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
import warnings
import zlib

import numpy as np

from .. import protocol, ptx
from ..closeable import Closeable
from ..errors import KernelBuildError
from ..harness import BUILD_OPTIONS, cl as pyopencl, context_for, random_inputs
from ..variants import BY_NAME

MAX_LOG = 4000


class Status(str, Enum):
    OK = "ok"
    PRUNED = "pruned"
    BUILD_FAILED = "build_failed"
    LAUNCH_FAILED = "launch_failed"
    WRONG = "wrong"
    TIMED_OUT = "timed_out"


FAILURES = (Status.BUILD_FAILED, Status.LAUNCH_FAILED, Status.WRONG, Status.TIMED_OUT)


@dataclass(frozen=True)
class Outcome:
    status: Status
    time_ms: float = None           # ok: median of the repeats
    times: tuple = ()               # ok: every repeat (ms)
    error: float = None             # wrong: max |out - ref| / max(1, |ref|)
    message: str = ""               # build log, CL error, reason
    build_s: float = None           # compile time, when built

    @property
    def ok(self):
        return self.status == Status.OK

    @property
    def cost(self):
        """What strategies minimise: the time, or inf for anything that is not a valid kernel."""
        return self.time_ms if self.ok and self.time_ms is not None else math.inf

    def as_dict(self):
        d = {"status": self.status.value}
        if self.time_ms is not None:
            d["time_ms"] = self.time_ms
        if self.times:
            d["times"] = list(self.times)
        if self.error is not None:
            d["error"] = self.error if math.isfinite(self.error) else "inf"
        if self.message:
            d["message"] = self.message[:MAX_LOG]
        if self.build_s is not None:
            d["build_s"] = round(self.build_s, 4)
        return d

    @classmethod
    def from_dict(cls, d):
        err = d.get("error")
        return cls(Status(d["status"]), d.get("time_ms"), tuple(d.get("times", ())),
                   float(err) if err is not None else None, d.get("message", ""),
                   d.get("build_s"))


# -- what crosses the process boundary ---------------------------------------------------------

class Plan:
    """A variant's launch plan for one cfg, computed in the parent: LayerRun reads it as it
    would read the variant, so the runner never needs the variant's class."""

    def __init__(self, variant, layer, cfg):
        self.name = variant.name
        self._launches = variant.launches(layer, cfg, "k")
        self._buffers = variant.buffers(layer, cfg)
        self._scratch = variant.scratch_floats(layer, cfg)
        lay = getattr(variant, "layouts_of", None)
        self.layouts = tuple(lay(layer, cfg)) if lay else ("NCHW", "NCHW")   # (reads, writes)

    def launches(self, layer, cfg, prefix):
        return self._launches

    def buffers(self, layer, cfg):
        return self._buffers

    def scratch_floats(self, layer, cfg):
        return self._scratch

    def layouts_of(self, layer, cfg):
        return self.layouts


@dataclass
class Job:
    layer: object
    cfg: object
    plan: Plan
    source: str
    options: tuple
    binary: bytes = None
    seed: int = 0
    timeout_s: float = 20.0
    min_total_ms: float = 20.0
    repeats: tuple = (5, 30)
    rotate_bytes: int = 0
    tol: float = protocol.TOLERANCE
    device: int = 0                 # which of the matching devices of this machine runs it
    precision: str = "fp32"         # what the variant computes in: its tolerance (protocol)


def prepare_job(target, layer, cand, variants, options, seed=0, timeout_s=20.0,
                min_total_ms=20.0, repeats=(5, 30)):
    """A Job for `cand` (space.Candidate) of `layer`, rendered here; a build_failed Outcome
    when the variant cannot render the configuration."""
    v = variants[cand.variant]
    try:
        source = v.render(layer, cand.cfg, "k")
        plan = Plan(v, layer, cand.cfg)
    except Exception as e:
        return Outcome(Status.BUILD_FAILED, message=f"the variant could not render this "
                       f"configuration: {type(e).__name__}: {e}")
    return Job(layer, cand.cfg, plan, source, tuple(options), seed=seed, timeout_s=timeout_s,
               min_total_ms=min_total_ms, repeats=tuple(repeats),
               rotate_bytes=target.cache_bytes, precision=getattr(v, "precision", "fp32"))


# -- worker processes --------------------------------------------------------------------------

class _TimedOut(Exception):
    pass


class _Died(Exception):
    pass


def _serve(conn):
    """A worker's loop: run (fn, args) with a `tick` to move its deadline, send the result."""
    def tick(seconds):
        conn.send(("tick", seconds))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            conn.send(("result", fn(tick, *args)))
        except Exception as e:                         # a bug of ours: report it, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-MAX_LOG:]}"))


class Worker:
    """One spawned process; `call` waits for it with a deadline and kills it past that."""

    def __init__(self):
        self.proc = self.conn = None

    def start(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        with _main_not_reimported():
            self.proc.start()
        child.close()

    def call(self, fn, args, timeout, setup_timeout=600.0):
        """fn(tick, *args) in the worker. The deadline starts at `setup_timeout` (process start,
        context, reference data) and each tick(s) from the worker moves it to now + s."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send((fn, args))
        deadline = time.monotonic() + max(setup_timeout, timeout)
        while True:
            left = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(left, 0.0))
            except (EOFError, OSError):
                ready = True
            if not ready:
                self.kill()
                raise _TimedOut()
            try:
                kind, value = self.conn.recv()
            except (EOFError, OSError):
                code = self.proc.exitcode if self.proc is not None else None
                self.kill()
                raise _Died(_describe_exit(code))
            if kind == "tick":
                deadline = time.monotonic() + value
            elif kind == "error":
                raise RuntimeError(value)
            else:
                return value

    def kill(self):
        self.signal()
        self.reap()

    def signal(self):
        """Send the process its kill, without waiting for it to end."""
        if self.proc is not None:
            self.proc.kill()

    def reap(self):
        """Wait for the killed process (5 s at most) and drop it."""
        if self.proc is not None:
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    close = kill


def kill_all(workers):
    """Kill `workers` together: every one signalled first, then each waited for, so that
    their ends overlap (a process holding a GPU context takes a while to end: one after
    another, a measurer's runner and 16 builders took seconds)."""
    workers = list(workers)
    for w in workers:
        w.signal()
    for w in workers:
        w.reap()


_START_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_not_reimported():
    """Start a spawned worker without re-running the caller's main module: a script that calls
    the tuner outside `if __name__ == "__main__":` would otherwise run again in every worker
    (and fail there, starting workers of its own). The worker needs nothing from it.

    The builders start from several threads at once: the lock keeps one thread's save and
    restore of __main__ from interleaving with another's (which once left __spec__ None and
    __file__ set, so that later workers ran `python -m aotconv.cli`'s module as a script)."""
    with _START_LOCK:
        main = sys.modules.get("__main__")
        saved = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                 if main and k in main.__dict__}
        try:
            if main is not None:
                main.__dict__.pop("__file__", None)
                main.__spec__ = None
            yield
        finally:
            if main is not None:
                main.__dict__.pop("__spec__", None)
                main.__dict__.update(saved)


def _describe_exit(code):
    if code is None:
        return "the worker process stopped answering"
    if code < 0:
        try:
            return f"the worker process died of {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker process died of signal {-code}"
    return f"the worker process exited with status {code}"


# -- in the worker processes -------------------------------------------------------------------

_state = {}


def _context(target, index=0):
    """The device context of this process: the first device matching `target`, or its
    `index`-th (modulo how many there are: N workers may share one PoCL device)."""
    if _state.get("ctx_index") != index or "ctx" not in _state:
        _state["ctx"] = context_for(target) if index == 0 else _nth_context(target, index)
        _state["ctx_index"] = index
    return _state["ctx"]


def _nth_context(target, index):
    from ..targets import matches
    cl = pyopencl()
    found = []
    for p in cl.get_platforms():
        try:
            found.extend(d for d in p.get_devices() if matches(target, p, d))
        except cl.Error:
            continue
    if not found:
        return context_for(target)              # says which target has no device
    d = found[index % len(found)]
    ctx = cl.Context([d])
    return ctx, cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE), d


def _quiet_cl():
    warnings.simplefilter("ignore")


def build_binary(tick, target, source, options, binary=True):
    """Builder: compile `source`; ("ok", binary or None, seconds) or ("fail", log, seconds).

    Without `binary` the build only fills the driver's kernel cache (PoCL's kcache), which the
    runner's rebuild from source then hits: PoCL makes a binary by compiling every kernel to
    native code, several times slower than the build itself."""
    cl = pyopencl()
    _quiet_cl()
    ctx, _, dev = _context(target)
    t0 = time.perf_counter()
    try:
        prog = ptx.program(cl, ctx, source, options)
    except cl.Error as e:
        return "fail", str(e)[:MAX_LOG], time.perf_counter() - t0
    return "ok", bytes(prog.binaries[0]) if binary else None, time.perf_counter() - t0


def load_program(tick, target, source, binary, options):
    """Runner-side program load (the compile benchmark): seconds to a built program."""
    cl = pyopencl()
    _quiet_cl()
    ctx, _, dev = _context(target)
    t0 = time.perf_counter()
    if binary is not None:
        cl.Program(ctx, [dev], [binary]).build(options=list(options))
    else:
        ptx.program(cl, ctx, source, options)
    return time.perf_counter() - t0


DATA_KEPT = 4           # layers whose data a runner keeps: lanes interleave their candidates


def _data(layer, seed):
    """Fresh random inputs and parameters for a layer and its float64 reference (computed
    here, once per layer, not inside a candidate's measurement; the last DATA_KEPT layers'
    are kept, since the searches of several lanes take turns on the runner)."""
    key = (layer.signature_str(), seed)
    kept = _state.setdefault("data", {})
    if key not in kept:
        rng = np.random.default_rng([seed, zlib.crc32(key[0].encode())])
        xs, params = random_inputs(layer, rng)
        ref = protocol.Reference(layer, xs, params)
        ref.expected()
        while len(kept) >= DATA_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = (xs, params, ref)
    kept[key] = kept.pop(key)                  # the most recently used last
    return kept[key]


def _cl_error(e):
    """'clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE' and the like."""
    if hasattr(e, "code"):
        return str(e)
    return f"{type(e).__name__}: {e}"


def run_candidate(tick, target, job):
    """Runner: build from the binary (or source), then measure by the protocol: verify, and
    time only a correct kernel. Returns an Outcome."""
    cl = pyopencl()
    _quiet_cl()
    ctx, q, dev = _context(target, job.device)
    xs, params, ref = _data(job.layer, job.seed)
    t0 = time.perf_counter()
    try:
        prog = protocol.build(ctx, dev, job.source, job.options, binary=job.binary,
                              name=job.plan.name)
    except KernelBuildError as e:
        return Outcome(Status.BUILD_FAILED, message=e.log[:MAX_LOG],
                       build_s=time.perf_counter() - t0)
    build_s = time.perf_counter() - t0 if job.binary is None else None
    try:
        k = protocol.Kernel(ctx, q, job.layer, job.plan, job.cfg, xs, params, program=prog,
                            source=job.source)
        tick(job.timeout_s)
        check, t1 = protocol.verify(k, ref, job.tol, job.precision)
    except (cl.Error, TypeError, ValueError, AttributeError) as e:   # CL errors, bad arguments
        return Outcome(Status.LAUNCH_FAILED, message=_cl_error(e), build_s=build_s)
    if not check["ok"]:
        err = check["error"]
        return Outcome(Status.WRONG, error=err, build_s=build_s,
                       message=f"max scaled error {err:.3g} > {job.tol:g}")
    try:
        k.add_copies(protocol.copies(protocol.buffers_footprint(k.runs[0]), job.rotate_bytes,
                                     dev.global_mem_size) - 1)
        lo, hi = job.repeats
        reps = protocol.repeats_for_total(t1, job.min_total_ms, lo, hi)
        t1 = max(t1, 1e-6)
        tick(job.timeout_s + 4.0 * (reps + k.copies) * t1 / 1e3)
        times = tuple(round(t, 6) for t in protocol.time_repeats(k, k.copies, reps))
    except cl.Error as e:
        return Outcome(Status.LAUNCH_FAILED, message=_cl_error(e), build_s=build_s)
    return Outcome(Status.OK, time_ms=protocol.median(times), times=times, build_s=build_s)


# -- the parent's side -------------------------------------------------------------------------

class MeasurerBase(Closeable):
    """The interface the search measures with.

    measure(layer, candidates, variants=None, on_outcome=None) -> [Outcome], in the order of
    `candidates`, calling on_outcome(candidate, outcome) as each is known (in any order), so
    that records are written as results arrive; close() releases the processes or devices.
    `slots`: how many candidates it works on at the same time (its parallel compiles, or
    its devices): under a deadline the search measures that many between checks. `lanes`:
    how many layer searches should call measure at once (from threads of their own) to keep
    it busy; measure must be safe to call so. `capacity`: how many candidates it can have in
    flight at once before they queue (its compile processes): the searches running at once
    share it, and a search running alone proposes batches that wide (strategies.model).
    `streams`: whether a search may keep candidates in flight while it proposes more
    (strategies.base, Streaming): where compiles overlap the runs; a CPU device, which
    compiles a batch and then times it on the same cores, measures batch after batch."""

    target = None
    slots = 1
    capacity = 1
    streams = False
    lanes = 1                  # layer searches it serves best at once (tune.search lanes)

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        raise NotImplementedError


class Phases:
    """Compiles and runs of a CPU device kept apart: any number of compiles at once, or one
    run, never both. A waiting run goes first (new compiles wait for it), so the runs of a
    batch whose compiles are done are not held up by another search's compiles."""

    def __init__(self):
        self._cv = threading.Condition()
        self.compiling = self.running = self.waiting = 0

    @contextlib.contextmanager
    def compile(self):
        with self._cv:
            self._cv.wait_for(lambda: not self.running and not self.waiting)
            self.compiling += 1
        try:
            yield
        finally:
            with self._cv:
                self.compiling -= 1
                self._cv.notify_all()

    @contextlib.contextmanager
    def run(self):
        with self._cv:
            self.waiting += 1
            try:
                self._cv.wait_for(lambda: not self.compiling and not self.running)
            finally:
                self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._cv:
                self.running -= 1
                self._cv.notify_all()


class Measurer(MeasurerBase):
    """Measures candidates of any layer on `target`'s device (present on this machine).

    lanes: 2 on a GPU, where one search's compiles (NVIDIA's compiler: 0.3-1 s a kernel)
    overlap another's runs instead of leaving the device idle. 1 on a CPU device: its
    compiles and timings share the same cores, so they must not overlap (Phases), and then a
    second search gains nothing (lenet5 on PoCL was no faster with 2 lanes, docs/tuning.md
    "Lanes"); `--lanes N` still gives more, under the same rule."""

    def __init__(self, target, jobs=None, timeout_s=20.0, build_timeout_s=300.0, seed=0,
                 min_total_ms=20.0, repeats=(5, 30), options=None, overlap=None,
                 binaries=None, device=0):
        self.target = target
        self.jobs = max(0, os.cpu_count() or 1) if jobs is None else int(jobs)
        self.timeout_s, self.build_timeout_s = timeout_s, build_timeout_s
        self.seed, self.min_total_ms, self.repeats = seed, min_total_ms, tuple(repeats)
        self.options = tuple(options if options is not None else BUILD_OPTIONS)
        self.overlap = (target.kind == "gpu") if overlap is None else overlap
        # GPUs hand back their binary (PTX...) for free; PoCL shares a kernel cache instead
        self.binaries = (target.kind == "gpu") if binaries is None else binaries
        self.device = device
        self.runner = Worker()
        self.builders = queue.Queue()
        self._nbuilders = self.jobs if self.jobs >= 2 else 0
        self.slots = max(1, self._nbuilders)     # candidates compiled at the same time
        self.capacity = self.slots
        self.streams = self.overlap
        self.lanes = 2 if self.overlap else 1
        self._pool = None
        self._lock = threading.Lock()             # the pool's start, build_seconds
        self._runner_lock = threading.Lock()      # one run at a time on the device
        self._phases = None if self.overlap else Phases()
        self.build_seconds = 0.0

    def _builder_pool(self):
        with self._lock:
            if self._pool is None and self._nbuilders:
                for _ in range(self._nbuilders):
                    self.builders.put(Worker())
                self._pool = ThreadPoolExecutor(self._nbuilders)
            return self._pool

    def _build(self, source):
        w = self.builders.get()
        try:
            with self._phases.compile() if self._phases else contextlib.nullcontext():
                t0 = time.perf_counter()
                try:
                    res = w.call(build_binary, (self.target, source, self.options,
                                                self.binaries), self.build_timeout_s)
                except _TimedOut:
                    return "timeout", f"the compiler ran past {self.build_timeout_s:g} s", None
                except (_Died, RuntimeError) as e:
                    return "fail", str(e), None
            with self._lock:
                self.build_seconds += time.perf_counter() - t0
            return res
        finally:
            self.builders.put(w)

    def _prepare(self, layer, cand, variants):
        return prepare_job(self.target, layer, cand, variants, self.options, self.seed,
                           self.timeout_s, self.min_total_ms, self.repeats)

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        """Outcomes of `candidates` (space.Candidate) of `layer`, in order. `on_outcome(cand,
        outcome)` is called as each is known (records are written there, so an interrupted
        search keeps what it measured)."""
        variants = variants or BY_NAME
        jobs = [self._prepare(layer, c, variants) for c in candidates]
        pool = self._builder_pool()
        futures = [pool.submit(self._build, j.source) if pool and isinstance(j, Job) else None
                   for j in jobs]
        if futures and not self.overlap:
            for f in futures:
                if f is not None:
                    f.exception()
        out = [None] * len(jobs)
        for i in self._ready(jobs, futures):
            o = jobs[i] if isinstance(jobs[i], Outcome) else self._run(jobs[i], futures[i])
            out[i] = o
            if on_outcome is not None:
                on_outcome(candidates[i], o)
        return out

    def _ready(self, jobs, futures):
        """The order in which the runner takes a batch's candidates: on a GPU as their builds
        finish (NVIDIA's compiler took 0.16-2.6 s for candidates of one ResNet-50 layer: in
        the batch's order, a slow one kept the device idle while the builds after it were
        done), else the batch's order."""
        if not self.overlap:
            yield from range(len(jobs))
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        yield from [i for i, f in enumerate(futures) if f is None]
        pending = {f: i for i, f in enumerate(futures) if f is not None}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            yield from sorted(pending.pop(f) for f in done)

    def _run(self, job, fut):
        return self.run_job(job, fut.result() if fut is not None else None)

    def run_job(self, job, built=None):
        """Run, verify and time `job` in the runner process. `built`: a builder's result
        (build_binary's ("ok", binary or None, seconds), ("fail", log, seconds)) or
        ("timeout", message, None); None: the runner builds from source."""
        build_s = None
        job.device = self.device
        if built is not None:
            kind, value, build_s = built
            if kind == "fail":
                return Outcome(Status.BUILD_FAILED, message=value, build_s=build_s)
            if kind == "timeout":
                return Outcome(Status.TIMED_OUT, message=value)
            job.binary = value              # None: the runner rebuilds from the warm cache
        with self._runner_lock, \
                self._phases.run() if self._phases else contextlib.nullcontext():
            o = self._call_runner(job, build_s)
        if build_s is not None:                  # the builder's compile, not the reload
            o = replace(o, build_s=build_s)
        return o

    def _call_runner(self, job, build_s):
        """run_candidate in the runner process (the caller holds the runner), an Outcome."""
        try:
            o = self.runner.call(run_candidate, (self.target, job), self.timeout_s)
        except _TimedOut:
            return Outcome(Status.TIMED_OUT, build_s=build_s,
                           message=f"no result within {self.timeout_s:g} s: the process was "
                                   f"killed")
        except _Died as e:
            return Outcome(Status.LAUNCH_FAILED, message=str(e), build_s=build_s)
        except RuntimeError as e:
            self.runner.kill()
            return Outcome(Status.LAUNCH_FAILED, message=f"measurement failed: {e}"[:MAX_LOG],
                           build_s=build_s)
        if o.status == Status.LAUNCH_FAILED:
            self.runner.kill()        # a failed launch may leave the context unusable
        return o

    def close(self):
        workers = [self.runner]
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            while not self.builders.empty():
                workers.append(self.builders.get())
            self._pool = None
        kill_all(workers)

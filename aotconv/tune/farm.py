"""The tuning farm: candidates measured on every device of the target's kind a Ray cluster has.

    aotconv tune vgg16 --target h100 --ray auto              # the cluster `ray start` made
    aotconv build lenet5 --target pocl-cpu --ray local --ray-workers 2

Ray does the scheduling; this module only says what runs where:

- devices: one Ray actor (`DeviceHost`) per device. A node offers its devices as a custom
  resource named after the target, {"aotconv-dev:<target>": <devices>} (`ray start
  --resources=...`; `--ray local` starts a Ray on this machine offering `--ray-workers` of
  them, by default as many as it has devices of the target); each actor takes one unit and
  owns a runner process (tune.measure.Measurer without builders) whose OpenCL context is the
  k-th matching device of its node (k modulo their number: on one machine N workers of one
  PoCL device are N contexts);
- compiles: Ray tasks of one CPU each, spread over the nodes that host the devices (a CPU
  device's compile fills that node's kernel cache, so its result is run on an actor of the
  same node when one is free); a window of as many as the cluster has CPUs is in flight;
- identity: every actor reports its device's identity (targets.device_identity: vendor, name,
  driver) and the farm keeps only the actors of one identity, this machine's device's when it
  has one, else the identity most actors share; the others are released, never mixed into one
  measurement, and records are keyed by that identity;
- lanes: several layer searches measure at once (tune.search lanes; `Farm.lanes`, by default
  two per device of a GPU farm), each calling `measure` from its own thread. One dispatcher
  thread, started with the farm, owns the actors, the compile window and the ready queue over
  the candidates of every pending call; `measure` hands its candidates to it and waits for
  its own outcomes, so one search's compiles overlap another's runs and no device waits for a
  compile while another search has a candidate ready;
- results: each outcome is handed to the caller's `on_outcome` as it arrives (tune_layer
  appends it to the record store then), on the caller's thread, so an interrupted run keeps
  everything measured;
- failures: a compile or run is typed as locally (tune.measure). An actor that dies (its
  process killed, its node lost) or stops answering its heartbeat for `hang_s` costs only its
  candidate in flight, which goes back to the queue and runs on another device (`retries`
  times; a candidate that takes down that many workers is recorded as launch_failed); the
  actor is replaced where its device is free again. A compile past `build_timeout_s` is
  cancelled and recorded as timed_out, as locally.

Ray is optional (`pip install aotconv[farm]`); without `--ray` nothing here is imported.
"""
from collections import deque
import json
import os
import queue
import socket
import threading
import time

from ..errors import AotconvError
from .measure import MAX_LOG, MeasurerBase, Measurer, Outcome, Status, build_binary, prepare_job

POLL_S = 0.5             # how long an idle dispatcher waits for work before looking again
WAKE_S = 0.05            # a busy dispatcher's wait on Ray, so that new work starts at once
PING_S = 5.0             # heartbeat period of a busy actor
INSTALL = "pip install aotconv[farm]"
TRACE_ENV = "AOTCONV_FARM_TRACE"   # a file: one JSON line per candidate, when it passed where


def resource_name(target_name):
    """The custom Ray resource a node offers per device of `target_name`."""
    return f"aotconv-dev:{target_name}"


def require_ray():
    try:
        import ray
    except ImportError:
        raise AotconvError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


def local_devices(target):
    """[(platform, device)] of this machine that match `target`."""
    from ..harness import cl
    from ..targets import matches
    pcl = cl()
    out = []
    try:
        plats = pcl.get_platforms()
    except pcl.Error:
        return out
    for p in plats:
        try:
            out.extend((p, d) for d in p.get_devices() if matches(target, p, d))
        except pcl.Error:
            continue
    return out


def identity_key(identity):
    return json.dumps(identity, sort_keys=True)


def pick_group(infos, device=None):
    """(identity, [indices]) of the actors to use among `infos` ([{identity...} or None]):
    those of `device` when given, else of the identity most share (ties: the first seen)."""
    groups = {}
    for i, info in enumerate(infos):
        if info and info.get("identity"):
            groups.setdefault(identity_key(info["identity"]), []).append(i)
    if device is not None:
        return device, groups.get(identity_key(device), [])
    if not groups:
        return None, []
    key = max(groups, key=lambda k: len(groups[k]))      # max keeps the first of equals
    return json.loads(key), groups[key]


# -- on the cluster ----------------------------------------------------------------------------

class DeviceHost:
    """One device of the farm, as a Ray actor: a runner process owning its OpenCL context."""

    def __init__(self, target, timeout_s=20.0):
        self.target, self.timeout_s = target, timeout_s
        self.m = None

    def where(self):
        import ray
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "host": socket.gethostname()}

    def open(self, ordinal):
        """Take the `ordinal`-th matching device of this node; its identity and live limits."""
        from ..targets import device_identity, with_limits
        devs = local_devices(self.target)
        if not devs:
            return None
        k = ordinal % len(devs)
        p, d = devs[k]
        live = with_limits(self.target, d)
        self.m = Measurer(live, jobs=0, timeout_s=self.timeout_s, device=k)
        return {"identity": device_identity(p, d), "live": live, "device": k}

    def run(self, job, built):
        return self.m.run_job(job, built)

    def ping(self):
        return True

    def close(self):
        if self.m is not None:
            self.m.close()


def _compile(target, source, options, binary):
    """A compile as a Ray task: build_binary's result and the node it ran on."""
    import ray
    res = build_binary(lambda s: None, target, source, options, binary)
    return res, ray.get_runtime_context().get_node_id()


# -- the caller's side -------------------------------------------------------------------------

class _Call:
    """One measure() call: what its caller waits for (outcomes come through `events`)."""

    def __init__(self, layer, candidates):
        self.layer, self.candidates = layer, candidates
        self.out = [None] * len(candidates)
        self.left = 0                  # tasks not finished (the dispatcher's count)
        self.events = queue.Queue()    # (index, Outcome), or (None, an exception to raise)
        self.cancelled = False         # its caller stopped waiting


class _Task:
    """One candidate of a call, through compile and run; `at` {event: monotonic time} for
    the trace (queued, compile, built, run, done) and `host`, the ordinal that ran it."""
    __slots__ = ("call", "i", "job", "attempts", "at", "host")

    def __init__(self, call, i, job):
        self.call, self.i, self.job, self.attempts = call, i, job, 0
        self.at, self.host = {"queued": time.monotonic()}, None


class _Host:
    def __init__(self, actor, node, pid, ordinal, live):
        self.actor, self.node, self.pid, self.ordinal, self.live = actor, node, pid, ordinal, live
        self.job = None            # (task, ref, built, node) in flight
        self.ping = None           # (ref, sent at)


class Farm(MeasurerBase):
    """MeasurerBase over a Ray cluster's devices of `target` (see the module docstring).

    address: "local" (start a Ray on this machine), "auto" or a Ray address (join a running
    cluster); workers: how many devices to use (local: how many to offer; default all);
    device: this machine's device identity, when it has the target's device."""

    def __init__(self, target, address="local", workers=None, device=None, timeout_s=20.0,
                 build_timeout_s=300.0, seed=0, min_total_ms=20.0, repeats=(5, 30),
                 options=None, retries=1, hang_s=60.0, start_timeout_s=180.0, binaries=None,
                 overlap=None, say=None, lanes=None):
        from ..harness import BUILD_OPTIONS
        self.ray = ray = require_ray()
        self.profile = target
        self.res = resource_name(target.name)
        self.timeout_s, self.build_timeout_s = timeout_s, build_timeout_s
        self.seed, self.min_total_ms, self.repeats = seed, min_total_ms, tuple(repeats)
        self.options = tuple(options if options is not None else BUILD_OPTIONS)
        self.retries, self.hang_s, self.start_timeout_s = retries, hang_s, start_timeout_s
        self.binaries = (target.kind == "gpu") if binaries is None else binaries
        self.overlap = (target.kind == "gpu") if overlap is None else overlap
        self.say = say or (lambda msg: None)
        self.requeued = 0          # candidates whose worker died or hung, measured again
        self.replaced = 0          # actors started in place of lost ones
        self.hosts = []
        self._starting = []        # (actor, its where() ref, the host it replaces, started at)
        self._own_ray = False
        # the dispatcher's state (its thread is the only one that changes it)
        self._inbox = queue.Queue()        # lists of new _Tasks from measure()
        self._to_compile = deque()         # _Task
        self._compiling = {}               # ref -> (_Task, submitted at)
        self._ready = deque()              # (_Task, built, node)
        self._calls = set()                # _Calls with tasks not finished
        self._spread = 0                   # round robin of compiles over the nodes
        self._closing = threading.Event()
        self._thread = None
        self._broken = None                # the error every later measure() raises
        self._t0 = time.monotonic()
        trace = os.environ.get(TRACE_ENV)
        self._trace = open(trace, "a", encoding="utf-8") if trace else None
        if workers is not None and workers < 1:
            raise AotconvError(f"--ray-workers {workers}: give a positive integer")
        self._start_ray(address, workers)
        try:
            self._start_hosts(workers, device)
        except BaseException:
            self.close()
            raise
        # lanes: a GPU farm's devices idle while a search waits for its compiles, so two
        # searches per device keep them busy (ResNet-50 on two H200s: 7.7 candidates a second
        # against 4.4 with one lane); a CPU farm times nothing while it compiles, and there a
        # lane per worker did best (lenet5 on PoCL: two lanes per worker were slower)
        self.lanes = lanes or (2 * len(self.hosts) if self.overlap else len(self.hosts))
        self._thread = threading.Thread(target=self._dispatch, name="aotconv-farm",
                                        daemon=True)
        self._thread.start()

    # -- start -------------------------------------------------------------------------------
    def _start_ray(self, address, workers):
        ray = self.ray
        if ray.is_initialized():
            pass
        elif address == "local":
            n = workers or len(local_devices(self.profile))
            if n < 1:
                raise AotconvError(f"--ray local: this machine has no device of target "
                                   f"'{self.profile.name}'; name a cluster's address instead")
            ray.init(address="local", num_cpus=os.cpu_count() or 1, resources={self.res: n},
                     include_dashboard=False, log_to_driver=False)
            self._own_ray = True
        else:
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise AotconvError(f"--ray {address}: cannot join the Ray cluster: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                                   ) from None
            self._own_ray = True
        offered = int(ray.cluster_resources().get(self.res, 0))
        if offered < 1:
            raise AotconvError(
                f"--ray {address}: the cluster offers no '{self.res}' resource; start each "
                f"node with `ray start --resources='{{\"{self.res}\": <devices>}}'`")
        self.offered = offered
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote_host = ray.remote(DeviceHost)
        self._remote_compile = ray.remote(_compile)

    def _spawn(self):
        return self._remote_host.options(resources={self.res: 1}, num_cpus=0, max_concurrency=2,
                                         max_restarts=0).remote(self.profile, self.timeout_s)

    def _start_hosts(self, workers, device):
        ray = self.ray
        n = min(self.offered, workers) if workers else self.offered
        actors = [self._spawn() for _ in range(n)]
        try:
            wheres = ray.get([a.where.remote() for a in actors], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise AotconvError(f"--ray: the farm's {n} device workers did not start within "
                               f"{self.start_timeout_s:g} s") from None
        per_node = {}
        ordinals = []
        for w in wheres:
            ordinals.append(per_node.get(w["node"], 0))
            per_node[w["node"]] = ordinals[-1] + 1
        infos = ray.get([a.open.remote(k) for a, k in zip(actors, ordinals)],
                        timeout=self.start_timeout_s)
        self.device, use = pick_group(infos, device)
        for i, a in enumerate(actors):
            if i not in use:
                ray.kill(a)
        if not use:
            seen = sorted({identity_key(x["identity"]) for x in infos if x})
            raise AotconvError(
                f"--ray: none of the farm's {n} devices of target '{self.profile.name}' is "
                f"this machine's ({device['name'] if device else 'none'}, "
                f"{device['driver'] if device else ''}); it has: {', '.join(seen) or 'none'}")
        self.hosts = [_Host(actors[i], wheres[i]["node"], wheres[i]["pid"], ordinals[i],
                            infos[i]["live"]) for i in use]
        self.target = self.hosts[0].live
        # candidates worked on at once, which a search under a deadline measures between its
        # checks: a GPU farm compiles while it runs, so two per device (one compiling, one
        # running); one per device kept a search's compile and run in turn (ResNet-50 b1 on
        # one H200 through the farm: 1.6 candidates in flight, the device 40% busy)
        self.slots = 2 * len(self.hosts) if self.overlap else len(self.hosts)
        # in flight at once before candidates queue: a compile per CPU of the cluster (the
        # dispatcher's window) where compiles overlap the runs; else the slots
        self.capacity = max(self.slots, self.cpus) if self.overlap else self.slots
        self.streams = self.overlap
        others = n - len(use)
        self.say(f"aotconv: farm: {len(use)} {self.device['name']} device"
                 f"{'s' if len(use) > 1 else ''} of target {self.profile.name} on "
                 f"{len(per_node)} node{'s' if len(per_node) > 1 else ''}, {self.cpus} CPUs for "
                 f"compiles" + (f"; {others} device{'s' if others > 1 else ''} of another "
                                f"identity left out" if others else ""))

    def _replace(self, lost):
        """Start a new actor where `lost`'s device is free again (it joins when it answers;
        see _joined)."""
        a = self._spawn()
        self._starting.append((a, a.where.remote(), lost, time.monotonic()))

    def _joined(self):
        """Replacement actors that answered: opened on their node's free device and added;
        those past start_timeout_s, or of another identity, are given up."""
        ray = self.ray
        for item in list(self._starting):
            a, ref, lost, t0 = item
            answered, _ = ray.wait([ref], timeout=0)
            if not answered:
                if time.monotonic() - t0 > self.start_timeout_s:
                    self._starting.remove(item)
                    ray.kill(a)
                continue
            self._starting.remove(item)
            try:
                w = ray.get(ref)
                taken = {h.ordinal for h in self.hosts if h.node == w["node"]}
                k = lost.ordinal if w["node"] == lost.node and lost.ordinal not in taken \
                    else min(set(range(len(self.hosts) + 1)) - taken)
                info = ray.get(a.open.remote(k), timeout=self.start_timeout_s)
            except Exception:
                ray.kill(a)
                continue
            if not info or identity_key(info["identity"]) != identity_key(self.device):
                ray.kill(a)
                continue
            self.replaced += 1
            self.hosts.append(_Host(a, w["node"], w["pid"], k, info["live"]))

    # -- measure -----------------------------------------------------------------------------
    def measure(self, layer, candidates, variants=None, on_outcome=None):
        """MeasurerBase.measure, safe to call from several threads at once (one per lane):
        the candidates join the dispatcher's queues and this thread waits for their outcomes,
        handing each to `on_outcome` as it arrives."""
        from ..variants import BY_NAME
        variants = variants or BY_NAME
        call = _Call(layer, candidates)
        tasks = []
        for i, c in enumerate(candidates):
            j = prepare_job(self.target, layer, c, variants, self.options, self.seed,
                            self.timeout_s, self.min_total_ms, self.repeats)
            if isinstance(j, Outcome):
                call.out[i] = j
                if on_outcome is not None:
                    on_outcome(c, j)
            else:
                tasks.append(_Task(call, i, j))
        if not tasks:
            return call.out
        if self._broken is not None:
            raise self._broken
        call.left = len(tasks)
        self._inbox.put(tasks)
        pending = len(tasks)
        try:
            while pending:
                try:
                    i, o = call.events.get(timeout=POLL_S)
                except queue.Empty:
                    if self._thread is None or not self._thread.is_alive():
                        raise self._broken or AotconvError("the farm was closed") from None
                    continue
                if i is None:
                    raise o
                call.out[i] = o
                pending -= 1
                if on_outcome is not None:
                    on_outcome(candidates[i], o)
        finally:
            if pending:
                call.cancelled = True       # its compiles are cancelled, its runs dropped
        return call.out

    # -- the dispatcher (one thread: the only one that touches hosts, refs and queues) --------
    def _dispatch(self):
        try:
            while not self._closing.is_set():
                idle = not (self._compiling or self._to_compile or self._ready
                            or any(h.job is not None for h in self.hosts))
                self._take(block=idle)
                self._step()
        except BaseException as e:                  # a bug of ours: every caller hears of it
            self._broken = AotconvError(f"the tuning farm's dispatcher failed: "
                                        f"{type(e).__name__}: {e}")
            self._fail_all(self._broken)

    def _take(self, block):
        """New calls' tasks into the compile queue (waiting up to POLL_S for one if `block`)."""
        try:
            tasks = self._inbox.get(timeout=POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._to_compile.extend(tasks)
            self._calls.update(t.call for t in tasks)
            try:
                tasks = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _finish(self, task, o):
        if self._trace is not None:
            self._write_trace(task, o)
        call = task.call
        call.left -= 1
        if call.left <= 0:
            self._calls.discard(call)
        if not call.cancelled:
            call.events.put((task.i, o))

    def _write_trace(self, task, o):
        """One line of the trace: the candidate's layer, variant, status, the device ordinal
        that ran it, and the seconds since the farm started at which it was queued (its
        measure() call), compiled, built, began its run and was done; written and flushed as
        each candidate ends, so a run that is killed keeps its trace."""
        now = time.monotonic()
        line = {"layer": task.call.layer.name, "variant": task.job.plan.name,
                "status": o.status.value, "host": task.host,
                **{k: round(t - self._t0, 4) for k, t in task.at.items()},
                "done": round(now - self._t0, 4)}
        self._trace.write(json.dumps(line) + "\n")
        self._trace.flush()

    def _fail_all(self, error):
        """Every pending call ends with `error` (an exception, or a function of the call that
        makes one); their queued work is dropped."""
        for call in list(self._calls):
            call.events.put((None, error(call) if callable(error) else error))
        self._calls.clear()
        self._to_compile.clear()
        self._ready.clear()

    def _step(self):
        ray = self.ray
        self._drop_cancelled()
        running = any(h.job is not None for h in self.hosts)
        # compiles: a window of as many as the cluster has CPUs; on a CPU device none starts
        # while a run times (it would steal the cores being timed)
        if self.overlap or not running:
            nodes = sorted({h.node for h in self.hosts})
            while self._to_compile and len(self._compiling) < self.cpus:
                task = self._to_compile.popleft()
                node = nodes[self._spread % len(nodes)] if nodes else None
                self._spread += 1
                opts = {"num_cpus": 1}
                if node is not None:
                    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
                    opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
                ref = self._remote_compile.options(**opts).remote(
                    self.profile, task.job.source, self.options, self.binaries)
                self._compiling[ref] = (task, time.monotonic())
                task.at["compile"] = self._compiling[ref][1]
        # runs: a CPU device times nothing while compiles run or wait
        if self.overlap or not (self._compiling or self._to_compile):
            for h in [h for h in self.hosts if h.job is None]:
                if not self._ready:
                    break
                pick = next((k for k, r in enumerate(self._ready) if r[2] == h.node), 0)
                task, built, node = self._ready[pick]
                del self._ready[pick]
                h.job = (task, h.actor.run.remote(task.job, built), built, node)
                task.at["run"], task.host = time.monotonic(), h.ordinal
                h.ping = None
        self._joined()
        if self._calls and not self.hosts and not self._starting:
            for ref in self._compiling:
                ray.cancel(ref, force=True)
            self._compiling.clear()
            self._fail_all(lambda call: AotconvError(
                f"every device of the farm was lost; {call.left} candidates of layer "
                f"'{call.layer.name}' are not measured (what was measured is in the records)"))
            return
        running = {h.job[1]: h for h in self.hosts if h.job is not None}
        refs = list(self._compiling) + list(running)
        if not refs:
            if self._starting and not self._inbox.qsize():
                time.sleep(WAKE_S)          # waiting for a replacement worker
            return
        # short waits, so that a new call's compiles start at once
        done, _ = ray.wait(refs, num_returns=1, timeout=WAKE_S)
        for ref in done:
            if ref in self._compiling:
                task, _ = self._compiling.pop(ref)
                try:
                    (kind, value, secs), node = ray.get(ref)
                except Exception as e:
                    self._finish(task, Outcome(Status.BUILD_FAILED, message=(
                        f"the compile task failed: {type(e).__name__}: {e}")[:MAX_LOG]))
                    continue
                if kind == "fail":
                    self._finish(task, Outcome(Status.BUILD_FAILED, message=value,
                                               build_s=secs))
                else:
                    self._ready.append((task, (kind, value, secs), node))
                    task.at["built"] = time.monotonic()
            else:
                h = running[ref]
                task = h.job[0]
                try:
                    o = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                        ray.exceptions.ObjectLostError) as e:
                    self._lost(h, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                except Exception as e:          # a bug of ours in the actor
                    h.job = None
                    self._finish(task, Outcome(Status.LAUNCH_FAILED, message=(
                        f"measurement failed: {type(e).__name__}: {e}")[:MAX_LOG]))
                    continue
                h.job = None
                self._finish(task, o)
        self._deadlines()

    def _drop_cancelled(self):
        """The work of calls whose caller stopped waiting (interrupted) is not done."""
        if not any(c.cancelled for c in self._calls):
            return
        for ref, (task, _) in list(self._compiling.items()):
            if task.call.cancelled:
                del self._compiling[ref]
                self.ray.cancel(ref, force=True)
        self._to_compile = deque(t for t in self._to_compile if not t.call.cancelled)
        self._ready = deque(r for r in self._ready if not r[0].call.cancelled)
        busy = {h.job[0].call for h in self.hosts if h.job is not None}
        for call in [c for c in self._calls if c.cancelled and c not in busy]:
            self._calls.discard(call)

    def _lost(self, h, why):
        """`h` died or hung: its candidate goes back to the queue, a new actor in its place."""
        if h.job is not None:
            task, _, built, node = h.job
            task.attempts += 1
            if task.attempts > self.retries:
                self._finish(task, Outcome(Status.LAUNCH_FAILED, message=(
                    f"{task.attempts} farm workers were lost measuring it; the last: "
                    f"{why}")[:MAX_LOG]))
            else:
                self.requeued += 1
                self._ready.appendleft((task, built, node))
        try:
            self.ray.kill(h.actor)
        except Exception:
            pass
        self.hosts.remove(h)
        self.say(f"aotconv: farm: lost the worker on {h.node[:8]} (pid {h.pid}): {why}; "
                 f"{'its candidate goes to another' if h.job else 'no candidate lost'}")
        self._replace(h)

    def _deadlines(self):
        ray = self.ray
        now = time.monotonic()
        for ref, (task, t0) in list(self._compiling.items()):
            if now - t0 > self.build_timeout_s:
                del self._compiling[ref]
                ray.cancel(ref, force=True)
                self._finish(task, Outcome(Status.TIMED_OUT, message=f"the compiler ran past "
                                                                     f"{self.build_timeout_s:g} s"))
        for h in [h for h in self.hosts if h.job is not None]:
            if h.ping is None:
                h.ping = (h.actor.ping.remote(), now)
                continue
            ref, sent = h.ping
            answered, _ = ray.wait([ref], timeout=0)
            if answered:
                if now - sent >= PING_S:
                    h.ping = None                    # the next heartbeat
            elif now - sent > self.hang_s:
                self._lost(h, f"no answer to its heartbeat for {self.hang_s:g} s")

    def pids(self, busy=None):
        """The actors' process ids (busy=True: those measuring now; False: idle)."""
        return [h.pid for h in list(self.hosts)
                if busy is None or (h.job is not None) == busy]

    def close(self):
        ray = self.ray
        self._closing.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        self._broken = self._broken or AotconvError("the tuning farm was closed")
        self._fail_all(self._broken)
        for ref in self._compiling:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        self._compiling = {}
        for a in [h.actor for h in self.hosts] + [x[0] for x in self._starting]:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.hosts, self._starting = [], []
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
        self._own_ray = False
        if self._trace is not None:
            self._trace.close()
            self._trace = None

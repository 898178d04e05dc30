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
- results: each outcome is handed to the caller's `on_outcome` as it arrives (tune_layer
  appends it to the record store then), so an interrupted run keeps everything measured;
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
import socket
import time

from ..errors import AotconvError
from .measure import MAX_LOG, MeasurerBase, Measurer, Outcome, Status, build_binary, prepare_job

POLL_S = 0.5             # how often the loop looks at deadlines and heartbeats
PING_S = 5.0             # heartbeat period of a busy actor
INSTALL = "pip install aotconv[farm]"


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

class _Host:
    def __init__(self, actor, node, pid, ordinal, live):
        self.actor, self.node, self.pid, self.ordinal, self.live = actor, node, pid, ordinal, live
        self.job = None            # (index, ref, attempt) in flight
        self.ping = None           # (ref, sent at)


class Farm(MeasurerBase):
    """MeasurerBase over a Ray cluster's devices of `target` (see the module docstring).

    address: "local" (start a Ray on this machine), "auto" or a Ray address (join a running
    cluster); workers: how many devices to use (local: how many to offer; default all);
    device: this machine's device identity, when it has the target's device."""

    def __init__(self, target, address="local", workers=None, device=None, timeout_s=20.0,
                 build_timeout_s=300.0, seed=0, min_total_ms=20.0, repeats=(5, 30),
                 options=None, retries=1, hang_s=60.0, start_timeout_s=180.0, binaries=None,
                 overlap=None, say=None):
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
        if workers is not None and workers < 1:
            raise AotconvError(f"--ray-workers {workers}: give a positive integer")
        self._start_ray(address, workers)
        try:
            self._start_hosts(workers, device)
        except BaseException:
            self.close()
            raise

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
        self.slots = len(self.hosts)
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
        from ..variants import BY_NAME
        ray = self.ray
        variants = variants or BY_NAME
        out = [None] * len(candidates)
        jobs = {}
        to_compile = deque()
        for i, c in enumerate(candidates):
            j = prepare_job(self.target, layer, c, variants, self.options, self.seed,
                            self.timeout_s, self.min_total_ms, self.repeats)
            if isinstance(j, Outcome):
                out[i] = j
                if on_outcome is not None:
                    on_outcome(c, j)
            else:
                jobs[i] = j
                to_compile.append(i)
        compiling = {}             # ref -> (index, submitted at)
        ready = deque()            # (index, built, node)
        attempts = {}

        def finish(i, o):
            out[i] = o
            if on_outcome is not None:
                on_outcome(candidates[i], o)

        def lost(h, why):
            """`h` died or hung: its candidate goes back to the queue, a new actor in its
            place."""
            if h.job is not None:
                i, _, built, node = h.job
                attempts[i] = attempts.get(i, 0) + 1
                if attempts[i] > self.retries:
                    finish(i, Outcome(Status.LAUNCH_FAILED, message=(
                        f"{attempts[i]} farm workers were lost measuring it; the last: "
                        f"{why}")[:MAX_LOG]))
                else:
                    self.requeued += 1
                    ready.appendleft((i, built, node))
            try:
                ray.kill(h.actor)
            except Exception:
                pass
            self.hosts.remove(h)
            self.say(f"aotconv: farm: lost the worker on {h.node[:8]} (pid {h.pid}): {why}; "
                     f"{'its candidate goes to another' if h.job else 'no candidate lost'}")
            self._replace(h)

        try:
            while any(o is None for o in out):
                # compiles: a window of as many as the cluster has CPUs
                nodes = sorted({h.node for h in self.hosts})
                while to_compile and len(compiling) < self.cpus:
                    i = to_compile.popleft()
                    node = nodes[i % len(nodes)] if nodes else None
                    opts = {"num_cpus": 1}
                    if node is not None:
                        from ray.util.scheduling_strategies import \
                            NodeAffinitySchedulingStrategy
                        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node,
                                                                                     soft=True)
                    ref = self._remote_compile.options(**opts).remote(
                        self.profile, jobs[i].source, self.options, self.binaries)
                    compiling[ref] = (i, time.monotonic())
                # runs: a CPU device times nothing while compiles run (they steal its cores)
                if self.overlap or not (compiling or to_compile):
                    for h in [h for h in self.hosts if h.job is None]:
                        if not ready:
                            break
                        pick = next((k for k, r in enumerate(ready) if r[2] == h.node), 0)
                        i, built, node = ready[pick]
                        del ready[pick]
                        h.job = (i, h.actor.run.remote(jobs[i], built), built, node)
                        h.ping = None
                self._joined()
                if not self.hosts and not self._starting:
                    left = sum(o is None for o in out)
                    raise AotconvError(f"every device of the farm was lost; {left} candidates "
                                       f"of layer '{layer.name}' are not measured (what was "
                                       f"measured is in the records)")
                running = {h.job[1]: h for h in self.hosts if h.job is not None}
                refs = list(compiling) + list(running)
                if refs:
                    done, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
                else:                               # waiting for a replacement worker
                    done = []
                    time.sleep(POLL_S)
                for ref in done:
                    if ref in compiling:
                        i, _ = compiling.pop(ref)
                        try:
                            (kind, value, secs), node = ray.get(ref)
                        except Exception as e:
                            finish(i, Outcome(Status.BUILD_FAILED, message=(
                                f"the compile task failed: {type(e).__name__}: "
                                f"{e}")[:MAX_LOG]))
                            continue
                        if kind == "fail":
                            finish(i, Outcome(Status.BUILD_FAILED, message=value, build_s=secs))
                        else:
                            ready.append((i, (kind, value, secs), node))
                    else:
                        h = running[ref]
                        i = h.job[0]
                        try:
                            o = ray.get(ref)
                        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                                ray.exceptions.ObjectLostError) as e:
                            lost(h, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                            continue
                        except Exception as e:          # a bug of ours in the actor
                            h.job = None
                            finish(i, Outcome(Status.LAUNCH_FAILED, message=(
                                f"measurement failed: {type(e).__name__}: {e}")[:MAX_LOG]))
                            continue
                        h.job = None
                        finish(i, o)
                self._deadlines(compiling, finish, lost)
        finally:
            for ref in compiling:
                ray.cancel(ref, force=True)
        return out

    def _deadlines(self, compiling, finish, lost):
        ray = self.ray
        now = time.monotonic()
        for ref, (i, t0) in list(compiling.items()):
            if now - t0 > self.build_timeout_s:
                del compiling[ref]
                ray.cancel(ref, force=True)
                finish(i, Outcome(Status.TIMED_OUT,
                                  message=f"the compiler ran past {self.build_timeout_s:g} s"))
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
                lost(h, f"no answer to its heartbeat for {self.hang_s:g} s")

    def pids(self, busy=None):
        """The actors' process ids (busy=True: those measuring now; False: idle)."""
        return [h.pid for h in self.hosts
                if busy is None or (h.job is not None) == busy]

    def close(self):
        ray = self.ray
        for a in [h.actor for h in self.hosts] + [x[0] for x in self._starting]:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.hosts, self._starting = [], []
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
        self._own_ray = False

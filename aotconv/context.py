"""One value for a build: the target and its device, the records, the measurer and the mode.

Every step that picks kernels (choose, pool fusion, layout planning, conversions) needs the
same things: the target profile with the live device's limits, the device's identity that
tuning records are keyed by, the record store, the way choices are made (tune, records,
fallback) with its budget and strategy, where progress goes, and, when tuning, the measuring
worker processes. A BuildContext looks the device up and opens the records once; the steps
take it instead of a dozen keyword arguments each, and one measurer serves the whole build.

The measurer is this machine's processes (tune.measure.Measurer), or, given `ray` (an address,
"auto" or "local"; the environment's AOTCONV_RAY when not given, which is what `--ray` sets),
the tuning farm (tune.farm.Farm): the devices of the target a Ray cluster offers, started when
the context is made. With a farm the records are keyed by the identity of the farm's devices,
and tuning needs no device on this machine.

`precision` (fp32, tf32, fp16: aotconv.precision) is what the build may compute in and store
its tensors in. The context
carries it on both target profiles (`profile`, `target`), with the live device's compute
capability where the device is here, so that every step that judges a kernel (spaces,
records, fallbacks, fusion) applies the variants' `build.precision`, `build.storage` and
`tensor_cores` constraints to the same build.

    with BuildContext.make("pocl-cpu", mode="tune", budget="2m") as ctx:
        choices = choose(net, ctx)

A time budget is one clock (tune.search.Clock) started when the context is made (or given
started, as the compiler does when the build starts). `times` (aotconv.buildtime) counts where
the build's time goes; inside `with ctx:` the steps' phases count to it.
"""
from dataclasses import dataclass, field, replace
import os
import sys

from .errors import AotconvError
from .precision import check as check_precision
from .targets import device_identity, find_device, get_target, with_limits

MODES = ("tune", "records", "fallback")


@dataclass
class BuildContext:
    profile: object              # the target profile as written (targets.py)
    target: object               # the profile with the live device's limits, when present
    found: tuple = None          # (platform, device) of the target, or None when absent
    device: dict = None          # device_identity(*found): what records are keyed by
    store: object = None         # tune.records.Store
    mode: str = "tune"           # tune | records | fallback
    budget: object = None        # trials, None (the tuner's default), or a time budget's
                                 # tune.search.Clock, started with the build
    strategy: str = None         # a name from tune.strategies, with options
    seed: int = 0
    jobs: int = None             # parallel compiles (None: every core)
    require_tuned: bool = False
    share: str = "cost"          # how a network budget is shared: cost | equal
    where: object = None         # parsed `--where` restrictions
    recheck: int = 3             # recorded points timed again per layer (tune.search.RECHECK)
    progress: object = None      # tune.progress.Progress
    ray: str = None              # measure on a Ray tuning farm: an address, "auto" or "local"
    ray_workers: int = None      # how many of its devices (default: all it offers)
    precision: str = "fp32"      # what the build may compute in (aotconv.precision)
    times: object = None         # buildtime.BuildTimes: seconds by phase, while inside `with`
    _measurer: object = field(default=None, repr=False)
    _own_measurer: bool = field(default=False, repr=False)
    _farm: object = field(default=None, repr=False)

    @classmethod
    def make(cls, target="auto", *, mode="tune", tuning_db=None, budget=None, strategy=None,
             seed=0, jobs=None, require_tuned=False, share="cost", where=None, quiet=False,
             json_progress=False, progress=None, measurer=None, ray=None, ray_workers=None,
             precision="fp32", times=None, recheck=None):
        """Look the target's device up and open its records; `target` is a name or a profile.
        With `ray` (default: $AOTCONV_RAY) and mode "tune", start the tuning farm too.
        `precision`: fp32, tf32 or fp16. `recheck`: the fastest recorded points of a layer
        that a search times again (default tune.search.RECHECK; 0: trust the records)."""
        from .buildtime import BuildTimes
        from .space import parse_where
        from .tune import strategies
        from .tune.progress import Progress
        from .tune.records import Store
        from .tune.search import Clock, RECHECK
        if mode not in MODES:
            raise AotconvError(f"unknown choice mode '{mode}'; use {', '.join(MODES)}")
        precision = check_precision(precision)
        profile = get_target(target) if isinstance(target, str) else target
        strategy = strategy or strategies.DEFAULT
        strategies.parse(strategy)
        found = find_device(profile)
        profile = with_precision(profile, precision, found[1] if found is not None else None)
        live = with_limits(profile, found[1]) if found is not None else profile
        ray, ray_workers = _farm_options(ray, ray_workers)
        ctx = cls(profile=profile, target=live, found=found,
                   device=device_identity(*found) if found is not None else None,
                   store=Store.default(profile, tuning_db), mode=mode,
                   budget=Clock.make(budget, profile, start=times and times.start) or budget,
                   strategy=strategy, seed=seed, jobs=jobs, require_tuned=require_tuned,
                   share=share, where=parse_where(where),
                   recheck=RECHECK if recheck is None else _recheck(recheck),
                   progress=progress or Progress.make(quiet=quiet, json_progress=json_progress),
                   ray=ray, ray_workers=ray_workers, precision=precision,
                   times=times or BuildTimes(), _measurer=measurer)
        if isinstance(ctx.budget, Clock):
            ctx.times.budget = str(ctx.budget.budget)
        if ray and mode == "tune" and measurer is None and found is None:
            ctx._start_farm()            # the farm's devices say what records are keyed by
        return ctx

    def _start_farm(self):
        from .tune.farm import Farm
        quiet = self.progress.mode == "quiet"
        farm = Farm(self.profile, self.ray, self.ray_workers, device=self.device,
                    say=lambda m: quiet or print(m, file=sys.stderr, flush=True))
        if self.device is None:              # no device here: the farm's stand for it
            self.device = farm.device
            self.target = replace(farm.target, precision=self.precision,
                                  compute_capability=self.profile.compute_capability)
        self._measurer, self._own_measurer, self._farm = farm, True, farm

    @property
    def present(self):
        """Whether the target's device is on this machine."""
        return self.found is not None

    @property
    def tuning(self):
        """Whether choices are measured on the device (tune mode with the device present, or
        a tuning farm that has it)."""
        return self.mode == "tune" and (self.present or self.farm is not None)

    @property
    def farm(self):
        """The tuning farm measuring for this build, or None."""
        return self._farm

    def require_device(self):
        """This context, or an error when the target's device is not on this machine (the
        commands that measure and have no records to fall back on)."""
        if not self.present:
            raise AotconvError(f"target '{self.profile.name}': its OpenCL device is not present "
                               f"here; `aotconv targets` lists what is")
        return self

    def measurer(self):
        """The measuring worker processes (or the tuning farm), started on first use and
        shared by the build."""
        if self._measurer is None and self.ray and self.mode == "tune":
            self._start_farm()
        if self._measurer is None:
            from .buildtime import phase
            from .tune.measure import Measurer
            with phase("setup"):
                self._measurer = Measurer(self.target, jobs=self.jobs)
            self._own_measurer = True
        return self._measurer

    def close(self):
        if self._own_measurer and self._measurer is not None:
            self._measurer.close()
        self._measurer, self._own_measurer, self._farm = None, False, None

    def __enter__(self):
        self._timing = self.times.active()
        self._timing.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        finally:
            self._timing.__exit__(*exc)


def with_precision(target, precision, device=None):
    """`target` (a profile) carrying `precision` and, given its live OpenCL `device`, that
    device's compute capability (NVIDIA; a profile's own stands for an absent device)."""
    from .variants.limits import compute_capability
    cc = compute_capability(device) if device is not None else ()
    return replace(target, precision=check_precision(precision),
                   compute_capability=cc or target.compute_capability)


def _farm_options(ray, workers):
    """(address, workers) from the arguments or, where not given, AOTCONV_RAY and
    AOTCONV_RAY_WORKERS."""
    if ray is None:
        ray = os.environ.get("AOTCONV_RAY") or None
    if workers is None and os.environ.get("AOTCONV_RAY_WORKERS"):
        text = os.environ["AOTCONV_RAY_WORKERS"]
        try:
            workers = int(text)
        except ValueError:
            raise AotconvError(f"AOTCONV_RAY_WORKERS={text!r}: give a positive integer") from None
    if workers is not None and workers < 1:
        raise AotconvError(f"--ray-workers {workers}: give a positive integer")
    if workers is not None and not ray:
        raise AotconvError("--ray-workers needs --ray ADDRESS (or --ray local)")
    return ray, workers


def _recheck(n):
    """A --recheck count, checked."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise AotconvError(f"--recheck {n!r}: give how many recorded points per layer to time "
                           f"again, 0 or more")
    return n

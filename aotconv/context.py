"""One value for a build: the target and its device, the records, the measurer and the mode.

Every step that picks kernels (choose, pool fusion, layout planning, conversions) needs the
same things: the target profile with the live device's limits, the device's identity that
tuning records are keyed by, the record store, the way choices are made (tune, records,
fallback) with its budget and strategy, where progress goes, and, when tuning, the measuring
worker processes. A BuildContext looks the device up and opens the records once; the steps
take it instead of a dozen keyword arguments each, and one measurer serves the whole build.

    with BuildContext.make("pocl-cpu", mode="tune", budget="2m") as ctx:
        choices = choose(net, ctx)
"""
from dataclasses import dataclass, field

from .errors import AotconvError
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
    progress: object = None      # tune.progress.Progress
    _measurer: object = field(default=None, repr=False)
    _own_measurer: bool = field(default=False, repr=False)

    @classmethod
    def make(cls, target="auto", *, mode="tune", tuning_db=None, budget=None, strategy=None,
             seed=0, jobs=None, require_tuned=False, share="cost", where=None, quiet=False,
             json_progress=False, progress=None, measurer=None):
        """Look the target's device up and open its records; `target` is a name or a profile."""
        from .space import parse_where
        from .tune import strategies
        from .tune.progress import Progress
        from .tune.records import Store
        from .tune.search import Clock
        if mode not in MODES:
            raise AotconvError(f"unknown choice mode '{mode}'; use {', '.join(MODES)}")
        profile = get_target(target) if isinstance(target, str) else target
        strategy = strategy or strategies.DEFAULT
        strategies.parse(strategy)
        found = find_device(profile)
        live = with_limits(profile, found[1]) if found is not None else profile
        return cls(profile=profile, target=live, found=found,
                   device=device_identity(*found) if found is not None else None,
                   store=Store.default(profile, tuning_db), mode=mode,
                   budget=Clock.make(budget, profile) or budget,
                   strategy=strategy, seed=seed, jobs=jobs, require_tuned=require_tuned,
                   share=share, where=parse_where(where),
                   progress=progress or Progress.make(quiet=quiet, json_progress=json_progress),
                   _measurer=measurer)

    @property
    def present(self):
        """Whether the target's device is on this machine."""
        return self.found is not None

    @property
    def tuning(self):
        """Whether choices are measured on the device (tune mode with the device present)."""
        return self.mode == "tune" and self.present

    def require_device(self):
        """This context, or an error when the target's device is not on this machine (the
        commands that measure and have no records to fall back on)."""
        if not self.present:
            raise AotconvError(f"target '{self.profile.name}': its OpenCL device is not present "
                               f"here; `aotconv targets` lists what is")
        return self

    def measurer(self):
        """The measuring worker processes, started on first use and shared by the build."""
        if self._measurer is None:
            from .tune.measure import Measurer
            self._measurer = Measurer(self.target, jobs=self.jobs)
            self._own_measurer = True
        return self._measurer

    def close(self):
        if self._own_measurer and self._measurer is not None:
            self._measurer.close()
        self._measurer, self._own_measurer = None, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

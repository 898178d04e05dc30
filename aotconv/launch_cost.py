"""What a kernel launch costs a run beyond the kernel's own time, and the choices that count it.

A tuning record times a candidate by its kernels' profiled durations (harness: end - start
of each launch, summed), which leave out what the queue spends between two dependent
kernels: the host's enqueue and the device's hand-over from one kernel to the next. The
emitted library pays that gap at every launch of run(). tools/launch_gap.py measures it with
profiling off (the library's default): 3.4 us on the H100 with NVIDIA's OpenCL, 2.6 us on
PoCL. At batch 1, where most of ResNet-50's or MobileNetV2's kernels take 5-25 us, a launch
more or less is a real share of a layer, so every comparison between choices that launch
different numbers of kernels per run counts it, at the target's figure (`launch_gap_us`, or
DEFAULT_GAP_US where the target has none measured):

- the candidates of one layer (search, records): conv_winograd's three launches against
  conv_igemm's one are compared at time + gap x (launches - 1);
- the layout plan (aotconv.layouts): each conversion is one launch more;
- fusion (aotconv.fusion): a conv and the pool or add it absorbs are two launches unfused,
  one fused.

The records keep the measured kernel time; reports show it, and the gap where it decided.
"""

# Where a target's profile has no measured gap: of the order both measured drivers show
# (NVIDIA OpenCL 3.4 us, PoCL 2.6 us); an assumption, not a measurement.
DEFAULT_GAP_US = 4.0


def gap_ms(target):
    """The launch gap of `target` in ms."""
    us = getattr(target, "launch_gap_us", 0.0) or DEFAULT_GAP_US
    return us / 1000.0


def run_launches(variant, layer, cfg):
    """Kernels `variant` launches per run() for `layer` at `cfg` (its setup launches, made
    once in set_params, do not count)."""
    try:
        return sum(1 for l in variant.launches(layer, cfg, "k") if l.phase == "run")
    except Exception:
        return 1                        # a point the variant cannot plan is priced as one


def extra_ms(variant, layer, cfg, target):
    """The gaps a candidate adds beyond one launch: gap x (launches - 1)."""
    return gap_ms(target) * max(0, run_launches(variant, layer, cfg) - 1)


class Pricer:
    """cost(candidate, outcome) for one layer's search: the outcome's cost (its time, inf
    when not a valid kernel) plus the gaps of the candidate's launches beyond the first.
    Launch counts are computed once per (variant, cfg)."""

    def __init__(self, layer, variants, target):
        self.layer, self.variants, self.target = layer, variants, target
        self._extra = {}

    def extra(self, cand):
        if cand not in self._extra:
            v = self.variants.get(cand.variant)
            self._extra[cand] = extra_ms(v, self.layer, cand.cfg, self.target) if v else 0.0
        return self._extra[cand]

    def __call__(self, cand, outcome):
        return outcome.cost + self.extra(cand)


def choice_ms(layer, choice, target):
    """A Choice's time plus the gaps of its launches beyond the first (0 for no choice or no
    time)."""
    t = planned_ms(choice)
    if t is None:
        return 0.0
    return t + extra_ms(choice.impl, layer, choice.cfg, target)


def planned_ms(choice):
    """The time a plan prices `choice` at: its measured time, else its `plan_ms` (None for
    neither)."""
    if choice is None:
        return None
    return choice.time_ms if choice.time_ms is not None else getattr(choice, "plan_ms", None)

"""The parsed `aotconv bench` command line: modes, budgets, repeat counts, the deadline, and
the tuner's measurer shared by every layer of a run."""
import time

from ..errors import AotconvError
from ..precision import DEFAULT as FP32, check as check_precision
from ..tune.measure import Measurer
from ..tune.search import parse_budget

E2E_DEFAULT = (("vgg16", 1), ("vgg16", 16), ("alexnet", 128), ("resnet50", 1), ("resnet50", 32),
               ("mobilenet_v2", 1))


def parse_scale(text):
    """'N=1' or '1' -> the largest batch to run; None -> no scaling."""
    if text is None:
        return None
    t = str(text).strip().lower()
    if t.startswith("n="):
        t = t[2:]
    try:
        n = int(t)
    except ValueError:
        raise AotconvError(f"--scale '{text}': give the largest batch, as N=1") from None
    if n < 1:
        raise AotconvError(f"--scale '{text}': the batch must be >= 1")
    return n


def parse_sets(text, layer_sets, precision=FP32):
    """--sets as a list: `layer_sets` (the per-layer sets' names) and e2e; default every one,
    or with a --precision other than fp32 e2e alone. The per-layer sets measure FP32 kernels
    against FP32 references only: naming one with another precision is a one-line error."""
    known = tuple(layer_sets) + ("e2e",)
    reduced = check_precision(precision) != FP32
    if not text:
        return ["e2e"] if reduced else list(known)
    sets = [s.strip() for s in text.split(",") if s.strip()]
    for s in sets:
        if s not in known:
            raise AotconvError(f"unknown set '{s}'; choose from {', '.join(known)}")
    per_layer = [s for s in sets if s != "e2e"]
    if reduced and per_layer:
        raise AotconvError(f"--sets {','.join(per_layer)} with --precision {precision}: only "
                           f"the end-to-end set (--sets e2e) runs in {precision}; the per-layer "
                           f"sets compare FP32 kernels (run them without --precision)")
    return sets


def parse_e2e(text):
    """'vgg16:1,alexnet:128' -> [(net, batch or None)]; empty -> the default networks."""
    if not text:
        return list(E2E_DEFAULT)
    out = []
    for item in text.split(","):
        net, _, b = item.strip().partition(":")
        out.append((net, int(b) if b else None))
    return out


class Options:
    """The parsed command line, plus the shared tuner measurer."""

    def __init__(self, a, target):
        self.a = a
        if a.no_tune and getattr(a, "records_only", False):
            raise AotconvError("--no-tune and --records-only: choose one (fallbacks timed, or "
                               "the recorded choices)")
        self.mode = ("fallback" if a.no_tune else
                     "records" if getattr(a, "records_only", False) else "tune")
        self.budget, self.set_budget, self.e2e_budget = a.budget, a.set_budget, a.e2e_budget
        self.strategy = a.strategy
        self.quiet = a.quiet
        self.max_batch = parse_scale(a.scale)
        gpu = target.kind == "gpu"
        self.repeats = a.repeats or (30 if gpu else 7)
        self.warmup = a.warmup if a.warmup is not None else (5 if gpu else 2)
        self.max_measure_s = a.max_measure_s or (3.0 if gpu else 1.5)
        self.seed = a.seed
        # the precision of the end-to-end builds and of PyTorch beside them
        self.precision = check_precision(getattr(a, "precision", None))
        self.verify_images = a.verify_images
        self.verify_max_gflop = a.verify_max_gflop
        self.workdir = a.workdir
        self.target_arg = a.target
        self.torch_compile = [m for m in (getattr(a, "torch_compile", None) or "none").split(",")
                              if m and m != "none"]
        rounds = getattr(a, "e2e_rounds", None)
        self.e2e_rounds = 1 if rounds is None else rounds
        if self.e2e_rounds < 1:
            raise AotconvError(f"--e2e-rounds {self.e2e_rounds}: give 1 (the first timing "
                               "alone) or more")
        self.deadline = (time.monotonic() + a.deadline) if a.deadline else None
        self._measurer = None

    def measurer(self, dev):
        if self._measurer is None:
            self._measurer = Measurer(dev.target, jobs=self.a.jobs)
        return self._measurer

    def out_of_time(self):
        return self.deadline is not None and time.monotonic() >= self.deadline

    def fit_budget(self, budget, reserve_s, what, notes):
        """`budget` shrunk so that a time budget leaves `reserve_s` before --deadline (tuning
        cannot be stopped half-way; the measurements after it must still fit)."""
        if budget is None or self.deadline is None:
            return budget
        b = parse_budget(budget)
        left = self.deadline - time.monotonic() - reserve_s
        if b.kind != "seconds" or b.amount <= left:
            return budget
        fitted = f"{max(10.0, left):.0f}s"
        notes.append(f"{what}: tuning budget {budget} shrunk to {fitted} to end before "
                     f"--deadline")
        return fitted

    def close(self):
        if self._measurer is not None:
            self._measurer.close()
            self._measurer = None

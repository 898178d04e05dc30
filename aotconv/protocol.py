"""The measurement protocol: how aotconv runs, checks and times a built kernel of one layer.

One set of rules for every caller: the tuner's runner process (aotconv.tune.measure), `aotconv
bench` (our kernels and the reference libraries beside them) and tools/kernel_probe.py.

- Data: fresh random inputs and parameters, never zeros (harness.random_inputs).
- Storage order: a variant that reads NHWC or CHWN (`layouts_of`) gets its input in that
  order, and its output is read back to the logical NCHW array before any comparison.
- Poisoning: the output is filled with NaN before the checked run, so a kernel that leaves
  part of its output unwritten cannot pass on what an earlier run left there.
- Verification: against the float64 numpy reference (reference.forward) on the first
  `images` images of the batch (all by default), hybrid relative/absolute tolerance:
  |out - ref| <= TOLERANCE * max(1, |ref|) everywhere (harness.close). A kernel that
  multiplies in TF32 (aotconv.precision) is allowed, on top of that, the worst case of
  rounding both operands of every product to TF32: |out - ref| <= TOLERANCE * max(1, |ref|)
  + L * (2u + u^2) * sum_k |w_k| |x_k| per output, u = 2^-11 (TF32's unit roundoff), L the
  Lipschitz constant of the fused activation (`tf32_allowance`; docs/precision.md derives it).
  A kernel of a layer stored in half (an fp16 build) is allowed, on top of TOLERANCE, what
  storing in half does: the exact effect of rounding its stored inputs and parameters to half
  ((1 + TOLERANCE) |ref16 - ref|, ref16 the float64 reference on the rounded operands) and
  the rounding of its stored output, u (|ref16| + TOLERANCE max(1, |ref16|)) + 2^-25 with
  u = 2^-11 (`half_allowance`; docs/precision.md derives it).
- Copies: as many sets of the buffers as spill the last-level cache twice, at most
  MAX_COPIES and 1/8 of the device memory (`copies`); launch i runs on copy i % copies, so
  a repeat is not served from a cache the previous one warmed.
- Timing: one run's time (the checked run's, or `estimate_ms`'s) is what the repeat counts
  are planned with; warm-up launches, then the timed repeats; the median is the figure.

What is measured is a *subject*: anything with `copies`, `poison()`, `run(i)` (enqueue on
copy i, untimed), `timed(i)` (enqueue on copy i, returning a handle), `finish()`,
`ms(handle)` and `output()` (the logical output of copy 0).
`Kernel` is ours (LayerRuns through pyopencl); aotconv.bench.refs wraps PyTorch and CLBlast
the same way. How many warm-ups and repeats is the caller's policy (`counts` for the bench,
`repeats_for_total` for the tuner); the rest is here.
"""
import math
import warnings

import numpy as np

from .graph import count
from .harness import LayerRun, build as build_source, cl, close
from .ops import flops
from .reference import forward, from_layout, to_layout

TOLERANCE = 1e-3
MAX_COPIES = 16
# TF32 keeps 10 of FP32's 23 mantissa bits: rounding to nearest is off by at most half an ulp,
# a relative 2^-11; a product of two rounded operands by at most (1 + u)^2 - 1 = 2u + u^2
TF32_UNIT_ROUNDOFF = 2.0 ** -11
TF32_PRODUCT_BOUND = 2 * TF32_UNIT_ROUNDOFF + TF32_UNIT_ROUNDOFF ** 2
# half keeps 10 of FP32's 23 mantissa bits and 5 exponent bits: rounding to nearest even is off
# by at most a relative 2^-11 in the normal range and by half its subnormal spacing, 2^-25, below
FP16_UNIT_ROUNDOFF = 2.0 ** -11
FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25
# the largest slope of each fused activation (|act(a) - act(b)| <= L |a - b|): an error in the
# sum reaches the output at most L times as large
_LIPSCHITZ = {"none": 1.0, "relu": 1.0, "relu6": 1.0, "clip": 1.0, "tanh": 1.0,
              "sigmoid": 0.25, "hardswish": 1.5, "silu": 1.0999, "gelu": 1.129,
              "gelu_tanh": 1.13}


# -- building ----------------------------------------------------------------------------------

def build(ctx, device, source, options, binary=None, name="kernel"):
    """A built program: from `binary` when given and the driver takes it, else from `source`
    (a failed build raises KernelBuildError, with the source, options and log saved)."""
    if binary is not None:
        cl_ = cl()
        try:
            return cl_.Program(ctx, [device], [binary]).build(options=list(options))
        except cl_.Error:
            pass                                          # the driver refused it: use the source
    return build_source(ctx, source, options, name=name)


# -- the reference -----------------------------------------------------------------------------

def act_lipschitz(attrs):
    """The largest slope of a layer's fused activation (graph.ACTS)."""
    kind = attrs.get("act", "none")
    if kind in ("leaky_relu", "hardsigmoid"):
        a = abs(float(attrs.get("alpha", 0.01)))
        return max(1.0, a) if kind == "leaky_relu" else a
    try:
        return _LIPSCHITZ[kind]
    except KeyError:
        raise ValueError(f"no Lipschitz bound for activation '{kind}'") from None


def tf32_allowance(layer, xs, params):
    """Per output of a conv `layer` (float64, the output's shape): the most that rounding the
    operands of its products to TF32 can move it, L * (2u + u^2) * sum_k |w_k| |x_k| (the
    bias, the fused residual and the FP32 accumulation are not rounded to TF32)."""
    from .reference import conv
    if layer.op != "conv":
        raise ValueError(f"no TF32 allowance for op '{layer.op}'")
    x = np.abs(np.asarray(xs[0], np.float64))
    w = np.abs(np.asarray(params["weight"], np.float64))
    s = conv(x, w, None, dict(layer.attrs, act="none"), x.shape[:1] + tuple(layer.out_shape[1:]))
    return act_lipschitz(layer.attrs) * TF32_PRODUCT_BOUND * s


def half_allowance(layer, xs, params, expected, tol=TOLERANCE):
    """Per output of a `layer` stored in half (float64, the output's shape): what storing its
    operands and its output in half may move it from `expected` (the float64 reference on `xs`
    and `params` as given). The kernel computes, in FP32, on the operands rounded to half, so
    within tol max(1, |ref16|) of ref16, the float64 reference on those operands; that is
    within tol max(1, |expected|) + tol |ref16 - expected| of it. To that come the exact effect
    of the rounding, |ref16 - expected|, and the rounding of a half output, u (|ref16| +
    tol max(1, |ref16|)) + 2^-25 (u = 2^-11; 2^-25, half the spacing of half's subnormals)."""
    from .precision import round_fp16, src_storage_of, storage_of
    # a layer that stores half rounds what it reads to half, read as half or as float
    half_out = storage_of(layer) == "fp16"
    half_in = src_storage_of(layer) == "fp16" or half_out
    as_stored = lambda v, half: (round_fp16(np.asarray(v, np.float32)) if half  # noqa: E731
                                 else np.asarray(v, np.float64))
    ref16 = forward(layer, [as_stored(x, half_in) for x in xs],
                    {k: as_stored(v, half_out) for k, v in params.items()})
    a = (1.0 + tol) * np.abs(ref16 - np.asarray(expected, np.float64))
    if half_out:
        mag = np.abs(ref16)
        a = a + FP16_UNIT_ROUNDOFF * (mag + tol * np.maximum(1.0, mag)) + FP16_SUBNORMAL_HALF_ULP
    return a


def close_within(out, ref, tol, allowance):
    """The hybrid check with an allowance per output: |out - ref| <= tol * max(1, |ref|) +
    allowance everywhere. The error reported is the largest |out - ref| / (max(1, |ref|) +
    allowance / tol), so that it passes exactly where it is at most `tol`, as harness.close's
    does."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return False, float("inf")
    if not out.size:
        return True, 0.0
    err = float(np.max(np.abs(out - ref) / (np.maximum(1.0, np.abs(ref)) + allowance / tol)))
    return bool(err <= tol), err


class Reference:
    """The float64 output of `layer` on the first `images` images (every image when None),
    computed once when first needed; skipped, and saying why, where it would cost more than
    `max_gflop`. check() with precision "tf32" adds the TF32 allowance (tf32_allowance), and
    for a layer stored in half the half allowance (half_allowance), each computed once too."""

    def __init__(self, layer, xs, params, images=None, max_gflop=None, tol=TOLERANCE):
        n = layer.in_shape[0]
        self.layer, self.tol = layer, tol
        self.images = n if images is None else min(n, images)
        self.xs = [np.asarray(x)[:self.images] for x in xs]
        self.params = params
        self.skipped = None
        self._expected = None
        self._allowance = None
        self._half = None
        if max_gflop is not None:
            cost = flops(layer) * self.images / n / 1e9
            if cost > max_gflop:
                self.skipped = (f"the float64 reference of {self.images} image(s) is "
                                f"{cost:.0f} GFLOP (> --verify-max-gflop {max_gflop:g})")

    def expected(self):
        if self._expected is None:
            self._expected = forward(self.layer, [x.astype(np.float64) for x in self.xs],
                                     {k: np.asarray(v, np.float64)
                                      for k, v in self.params.items()})
        return self._expected

    def allowance(self):
        """tf32_allowance of the checked images."""
        if self._allowance is None:
            self._allowance = tf32_allowance(self.layer, self.xs, self.params)
        return self._allowance

    def half(self, tol):
        """half_allowance of the checked images."""
        if self._half is None or self._half[0] != tol:
            self._half = (tol, half_allowance(self.layer, self.xs, self.params, self.expected(),
                                              tol))
        return self._half[1]

    def check(self, out, tol=None, precision="fp32"):
        """{'ok', 'error', 'images'} (error: the largest scaled difference) or {'skipped': why}.
        `precision`: what the kernel computes in (aotconv.precision): "tf32" adds the
        allowance of TF32 operands. A layer stored in half (the layer says so: its storage,
        aotconv.precision) adds the half allowance to FP32 arithmetic."""
        from .precision import src_storage_of, storage_of
        if self.skipped:
            return {"skipped": self.skipped}
        tol = self.tol if tol is None else tol
        out = np.asarray(out)[:self.images]
        if "fp16" in (storage_of(self.layer), src_storage_of(self.layer)):
            if precision != "fp32":
                raise ValueError(f"no tolerance for {precision} arithmetic on half storage")
            ok, err = close_within(out, self.expected(), tol, self.half(tol))
        elif precision == "fp32":
            ok, err = close(out, self.expected(), tol)
        elif precision == "tf32":
            ok, err = close_within(out, self.expected(), tol, self.allowance())
        else:
            raise ValueError(f"no tolerance for precision '{precision}'")
        return {"ok": ok, "error": err, "images": self.images}


# -- how many copies ---------------------------------------------------------------------------

def copies(footprint, cache_bytes, mem_bytes):
    """Buffer sets to rotate over: enough to spill a last-level cache of `cache_bytes` twice,
    at most MAX_COPIES and 1/8 of the device's `mem_bytes`."""
    size = max(int(footprint), 1)
    want = math.ceil(2 * cache_bytes / size) if cache_bytes else 1
    return int(max(1, min(MAX_COPIES, want, mem_bytes // 8 // size)))


def layer_footprint(layer):
    """Bytes of a layer's inputs, output and parameters: one copy, whoever computes it."""
    from .precision import element_bytes, src_storage_of, storage_of
    return (element_bytes(src_storage_of(layer)) * sum(count(s) for s in layer.in_shapes)
            + element_bytes(storage_of(layer)) * (count(layer.out_shape)
                                                  + sum(count(s) for _, s in layer.params)))


def buffers_footprint(run):
    """Bytes of every buffer of one LayerRun (a variant's own buffers and scratch too)."""
    bufs = list(run.inputs) + [run.output] + list(run.params.values()) + list(run.extra.values())
    if run.scratch is not None:
        bufs.append(run.scratch)
    return sum(b.size for b in bufs)


# -- our kernel as a subject -------------------------------------------------------------------

class Kernel:
    """One (variant, cfg) of `layer` built once, over `n` copies of its buffers that hold the
    same inputs (in the variant's storage order) and parameters. `variant` may be the tuner's
    Plan. `program`/`source`: a program the caller built (with other options, say) and its
    source; by default the variant's source is rendered and built here."""

    def __init__(self, ctx, queue, layer, variant, cfg, xs, params, n=1, program=None,
                 source=None):
        self.queue, self.layer, self.variant, self.cfg = queue, layer, variant, cfg
        self.layouts = tuple(variant.layouts_of(layer, cfg))         # (reads, writes)
        lin = self.layouts[0]
        self.xs = xs if lin == "NCHW" else [to_layout(x, lin) for x in xs]
        self.params = params
        first = LayerRun(ctx, queue, layer, variant, cfg, program=program, source=source)
        self.runs = [first]
        self._fill(first)
        self.add_copies(n - 1)

    def _fill(self, run):
        run.set_inputs(self.xs)
        run.set_params(self.params)

    def add_copies(self, k):
        """`k` more copies sharing the first one's program."""
        first = self.runs[0]
        with warnings.catch_warnings():
            # the copies share one program, so each fetches the same kernels again: intended
            warnings.filterwarnings("ignore", message=".*retrieved more than once.*")
            for _ in range(max(0, k)):
                r = LayerRun(first.ctx, self.queue, self.layer, self.variant, self.cfg,
                             program=first.program, source=first.source)
                self._fill(r)
                self.runs.append(r)

    @property
    def copies(self):
        return len(self.runs)

    @property
    def program(self):
        return self.runs[0].program

    def poison(self):
        self.runs[0].poison_output()

    def run(self, i):
        return self.runs[i % len(self.runs)].run()

    timed = run                    # profiling events: every launch can be timed afterwards

    def finish(self):
        self.queue.finish()

    def ms(self, events):
        return self.runs[0].time_ms(events)

    def output(self):
        """Copy 0's output as the logical NCHW array, whatever order the variant wrote."""
        out = self.runs[0].read_output()
        lout = self.layouts[1]
        return out if lout == "NCHW" else from_layout(out.ravel(), lout, self.layer.out_shape)


# -- running a subject -------------------------------------------------------------------------

def verify(subject, reference, tol=None, precision="fp32"):
    """Poison copy 0's output, run it, read it back and check it (with the tolerance of
    `precision`, what the subject computes in): (check, ms of that run)."""
    subject.poison()
    h = subject.timed(0)
    subject.finish()
    return reference.check(subject.output(), tol, precision), subject.ms(h)


def estimate_ms(subject):
    """One run's time (on the last copy): what the repeat counts are planned with."""
    h = subject.timed(subject.copies - 1)
    subject.finish()
    return subject.ms(h)


def time_repeats(subject, warmup, repeats):
    """ms of each of `repeats` timed launches after `warmup` untimed ones, rotating over the
    subject's copies (launch i on copy i)."""
    for i in range(warmup):
        subject.run(i)
    subject.finish()
    handles = [subject.timed(warmup + i) for i in range(repeats)]
    subject.finish()
    return [subject.ms(h) for h in handles]


def median(times):
    return float(np.median(times))


# -- how many repeats --------------------------------------------------------------------------

def counts(once_ms, opts):
    """(warm-up, repeats) for a kernel whose single run took `once_ms`: opts.warmup and
    opts.repeats, fewer (at least 3 repeats) where they would take longer than
    opts.max_measure_s; a slow reference on a 2-core CPU would otherwise cost minutes."""
    cap = opts.max_measure_s * 1e3 / max(once_ms, 1e-6)
    repeats = int(max(3, min(opts.repeats, cap)))
    warmup = int(max(1, min(opts.warmup, cap - repeats)))
    return warmup, repeats


# a whole network's run: warm-up and timed runs of at least these wall times, so that a
# sub-millisecond network (MobileNetV2 b1 on an H100: 0.3 ms) is not timed from a handle five
# runs old, its device and host still leaving their idle states
E2E_WARM_MS = 300.0
E2E_TOTAL_MS = 300.0
E2E_MAX_RUNS = 2000


def e2e_counts(once_ms, opts):
    """(warm-up, repeats) for a whole network whose single run took `once_ms`: those of
    counts(), raised where they add up to less than E2E_WARM_MS and E2E_TOTAL_MS (at most
    E2E_MAX_RUNS each, and at most what --max-measure-s allows). Ours and PyTorch's ways are
    timed by the same rule."""
    warmup, repeats = counts(once_ms, opts)
    once = max(once_ms, 1e-3)
    most = min(E2E_MAX_RUNS, int(opts.max_measure_s * 1e3 / once))   # --max-measure-s holds
    warmup = max(warmup, min(most, math.ceil(E2E_WARM_MS / once)))
    repeats = max(repeats, min(most, math.ceil(E2E_TOTAL_MS / once)))
    return warmup, repeats


def repeats_for_total(once_ms, min_total_ms, lo, hi):
    """Repeats adding up to about `min_total_ms`, between `lo` and `hi` (the tuner's policy:
    its warm-up is one launch on every copy)."""
    return int(min(hi, max(lo, math.ceil(min_total_ms / max(once_ms, 1e-6)))))

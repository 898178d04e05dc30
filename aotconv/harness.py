"""Run one layer's variant on an OpenCL device through pyopencl: build, fill, launch, read, time.

Used by the per-op tests and by the tuner's measurements; the emitted C library does the same
thing without Python. Buffers follow the Arg kinds of variants.base. A layer stored in half
(aotconv.precision) gets half input, output and parameter buffers, filled from float32 rounded
to nearest even and read back as float32; a variant's own buffers and scratch stay float.
"""
import os
import tempfile
import warnings

import numpy as np

from . import ptx
from .errors import KernelBuildError
from .graph import count


def cl():
    import pyopencl
    return pyopencl


_contexts = {}


def context_for(target=None):
    """(context, queue, device) for `target` (a Target) or the first device; cached per device."""
    from .targets import find_device, detect
    cl_ = cl()
    if target is None:
        target = detect()
    found = find_device(target)
    if found is None:
        from .errors import AotconvError
        raise AotconvError(f"target '{target.name}': no matching OpenCL device is present")
    p, d = found
    key = (p.name, d.name)
    if key not in _contexts:
        ctx = cl_.Context([d])
        q = cl_.CommandQueue(ctx, properties=cl_.command_queue_properties.PROFILING_ENABLE)
        _contexts[key] = (ctx, q, d)
    return _contexts[key]


BUILD_OPTIONS = ["-cl-mad-enable"]


def build(ctx, source, options=BUILD_OPTIONS, name="kernel"):
    """Build a program; on failure save source, options and log and raise KernelBuildError."""
    cl_ = cl()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ptx.program(cl_, ctx, source, options)
        except cl_.Error as e:
            log = str(e)
            fd, path = tempfile.mkstemp(prefix=f"aotconv-{name}-", suffix=".cl")
            with os.fdopen(fd, "w") as f:
                f.write(f"// build options: {' '.join(options)}\n// build log:\n")
                f.write("".join(f"// {line}\n" for line in log.splitlines()))
                f.write(source)
            raise KernelBuildError(f"OpenCL build of {name} failed", log=log, path=path) from None


class LayerRun:
    """A built variant of one layer with its device buffers, ready to launch repeatedly."""

    def __init__(self, ctx, queue, layer, variant, cfg, program=None, source=None):
        cl_ = cl()
        self.ctx, self.queue, self.layer, self.variant, self.cfg = ctx, queue, layer, variant, cfg
        self.prefix = "k"
        self.source = source if source is not None else variant.render(layer, cfg, self.prefix)
        self.program = program if program is not None else build(ctx, self.source,
                                                                 name=f"{variant.name}")
        self.launches = variant.launches(layer, cfg, self.prefix)
        mf = cl_.mem_flags
        nbytes = lambda n, t=np.float32: max(np.dtype(t).itemsize * int(n), 4)
        self.in_dtype, self.dtype = _dtypes(layer)
        self.inputs = [cl_.Buffer(ctx, mf.READ_WRITE, nbytes(count(s), self.in_dtype))
                       for s in layer.in_shapes]
        self.output = cl_.Buffer(ctx, mf.READ_WRITE, nbytes(count(layer.out_shape), self.dtype))
        self.params = {n: cl_.Buffer(ctx, mf.READ_WRITE, nbytes(count(s), self.dtype))
                       for n, s in layer.params}
        self.extra = {n: cl_.Buffer(ctx, mf.READ_WRITE, nbytes(c))
                      for n, c in variant.buffers(layer, cfg).items()}
        sc = variant.scratch_floats(layer, cfg)
        self.scratch = cl_.Buffer(ctx, mf.READ_WRITE, nbytes(sc)) if sc else None
        self.kernels = []
        for l in self.launches:
            k = getattr(self.program, l.kernel)
            k.set_args(*[self._arg(a) for a in l.args])
            self.kernels.append((l, k))

    def _arg(self, a):
        if a.kind == "in":
            return self.inputs[a.index]
        if a.kind == "out":
            return self.output
        if a.kind == "param":
            return self.params[a.name]
        if a.kind == "buffer":
            return self.extra[a.name]
        if a.kind == "scratch":
            return self.scratch
        if a.kind == "int":
            return np.int32(a.value)
        if a.kind == "float":
            return np.float32(a.value)
        raise ValueError(f"unknown arg kind {a.kind}")

    def set_inputs(self, inputs):
        cl_ = cl()
        for buf, x in zip(self.inputs, inputs):
            cl_.enqueue_copy(self.queue, buf, _stored(x, self.in_dtype))

    def set_params(self, params):
        """Upload the user-layout parameters and run the variant's setup launches."""
        cl_ = cl()
        for n, _ in self.layer.params:
            cl_.enqueue_copy(self.queue, self.params[n], _stored(params[n], self.dtype))
        for l, k in self.kernels:
            if l.phase == "setup":
                cl_.enqueue_nd_range_kernel(self.queue, k, l.gsize, l.lsize)
        self.queue.finish()

    def poison_output(self):
        cl_ = cl()
        cl_.enqueue_copy(self.queue, self.output,
                         np.full(count(self.layer.out_shape), np.nan, self.dtype))

    def run(self):
        """Enqueue the run launches; returns their events."""
        cl_ = cl()
        return [cl_.enqueue_nd_range_kernel(self.queue, k, l.gsize, l.lsize)
                for l, k in self.kernels if l.phase == "run"]

    def read_output(self):
        cl_ = cl()
        out = np.empty(count(self.layer.out_shape), self.dtype)
        cl_.enqueue_copy(self.queue, out, self.output)
        return out.astype(np.float32).reshape(self.layer.out_shape)

    def time_ms(self, events):
        return sum((e.profile.end - e.profile.start) * 1e-6 for e in events)


def _dtypes(layer):
    """(numpy type of the buffers `layer` reads, of its output and parameters)."""
    from .precision import src_storage_of, storage_of
    of = {"fp32": np.float32, "fp16": np.float16}
    return of[src_storage_of(layer)], of[storage_of(layer)]


def _stored(x, dtype):
    """`x` as a buffer of `dtype` holds it: through float32 (what the library is given), then
    rounded to nearest even where `dtype` is half."""
    return np.ascontiguousarray(np.asarray(x, np.float32).astype(dtype))


def run_layer(layer, variant, cfg, inputs, params, target=None, ctx=None):
    """Build and run `variant` for `layer` once; returns the output as float32 NCHW."""
    if ctx is None:
        ctx, queue, _ = context_for(target)
    else:
        ctx, queue = ctx
    r = LayerRun(ctx, queue, layer, variant, cfg)
    r.set_inputs(inputs)
    r.set_params(params)
    r.poison_output()
    r.run()
    return r.read_output()


def verify_point(ctx, queue, layer, variant, cfg, inputs, params):
    """Check one point as the tuner does (protocol.Kernel against protocol.Reference: inputs
    in the variant's layout, the output read back from it); the check's dict, "ok" among its
    keys."""
    from . import protocol
    k = protocol.Kernel(ctx, queue, layer, variant, cfg, inputs, params)
    return protocol.verify(k, protocol.Reference(layer, inputs, params))[0]


def random_inputs(layer, rng):
    """Fresh random data (never zeros) for a layer's inputs and parameters."""
    from .reference import random_params
    xs = [rng.standard_normal(s).astype(np.float32) for s in layer.in_shapes]
    return xs, random_params(layer, rng)


def close(out, ref, tol=1e-3):
    """Hybrid relative/absolute check (Boda): |out-ref| <= tol * max(1, |ref|) everywhere."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return False, float("inf")
    err = np.max(np.abs(out - ref) / np.maximum(1.0, np.abs(ref))) if out.size else 0.0
    return bool(err <= tol), float(err)

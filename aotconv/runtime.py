"""Load an emitted library through cffi (ABI mode) as a callable network, for tests and scripts."""
import json
import os
from pathlib import Path

import numpy as np

from .closeable import Closeable
from .errors import AotconvError

_CDEF = """
typedef struct _cl_context *cl_context;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct aotconv_{n} aotconv_{n};
typedef struct {{ int platform_index; int device_index; const char *device_name; int profile;
                  int source_only; long stage_bytes; int stage_threads; int flush_every; }}
                  aotconv_{n}_options;
typedef struct {{ size_t activation_bytes, parameter_bytes, variant_bytes, scratch_bytes,
                  device_bytes, pinned_bytes; }} aotconv_{n}_memory_info;
int aotconv_{n}_create(aotconv_{n} **out, const aotconv_{n}_options *opts);
int aotconv_{n}_create_with_queue(aotconv_{n} **out, cl_context context, cl_device_id device,
                                  cl_command_queue queue, const aotconv_{n}_options *opts);
int aotconv_{n}_run_async(aotconv_{n} *net, const float *input, size_t input_count,
                          float *output, size_t output_count);
int aotconv_{n}_run_buffers(aotconv_{n} *net, cl_mem input, cl_mem output);
int aotconv_{n}_run_n(aotconv_{n} *net, size_t n, const float *input, size_t input_count,
                      float *output, size_t output_count);
int aotconv_{n}_run_async_n(aotconv_{n} *net, size_t n, const float *input, size_t input_count,
                            float *output, size_t output_count);
int aotconv_{n}_run_buffers_n(aotconv_{n} *net, size_t n, cl_mem input, cl_mem output);
int aotconv_{n}_run_inputs(aotconv_{n} *net, const float *const inputs[], const size_t counts[],
                           size_t n_inputs, float *output, size_t output_count);
int aotconv_{n}_run_async_inputs(aotconv_{n} *net, const float *const inputs[],
                                 const size_t counts[], size_t n_inputs, float *output,
                                 size_t output_count);
int aotconv_{n}_run_buffers_inputs(aotconv_{n} *net, const cl_mem inputs[], size_t n_inputs,
                                   cl_mem output);
int aotconv_{n}_run_inputs_n(aotconv_{n} *net, size_t n, const float *const inputs[],
                             const size_t counts[], size_t n_inputs, float *output,
                             size_t output_count);
int aotconv_{n}_run_async_inputs_n(aotconv_{n} *net, size_t n, const float *const inputs[],
                                   const size_t counts[], size_t n_inputs, float *output,
                                   size_t output_count);
int aotconv_{n}_run_buffers_inputs_n(aotconv_{n} *net, size_t n, const cl_mem inputs[],
                                     size_t n_inputs, cl_mem output);
const char *aotconv_{n}_input_name(size_t i);
size_t aotconv_{n}_batch_sizes(const size_t **sizes);
int aotconv_{n}_wait(aotconv_{n} *net);
int aotconv_{n}_program_source(const aotconv_{n} *net, const char **why);
int aotconv_{n}_memory(const aotconv_{n} *net, aotconv_{n}_memory_info *info);
int aotconv_{n}_set_params(aotconv_{n} *net, const float *params, size_t count);
int aotconv_{n}_load_params(aotconv_{n} *net, const char *path);
int aotconv_{n}_run(aotconv_{n} *net, const float *input, size_t input_count,
                    float *output, size_t output_count);
int aotconv_{n}_profile(aotconv_{n} *net, double *layer_ms, size_t n);
int aotconv_{n}_host_buffers(aotconv_{n} *net, float **input, float **output);
const char *aotconv_{n}_last_error(const aotconv_{n} *net);
void aotconv_{n}_destroy(aotconv_{n} *net);
const char *aotconv_{n}_kernel_name(size_t i);
"""


class LibraryError(AotconvError):
    def __init__(self, code, message):
        self.code = code
        super().__init__(f"[{code}] {message}")


class Network(Closeable):
    """A built network: `net(x)` runs the library on a float32 NCHW array and returns the output.

    `x` holds the library's input (run()), or any n samples from 1 to the largest batch size
    (run_n: the smallest size >= n runs, the output has n samples); `batch_sizes` lists the
    sizes the library was built for. A network of several inputs (`inputs`: [(name, shape)])
    takes one array per input: `net(x1, x2)`, `net([x1, x2])` or `net({"a": x1, "b": x2})`,
    each of the same n samples (run_inputs, run_inputs_n).

    `profile`: keep per-kernel times for profile() (options.profile = 1). Off by default, as
    in C: a queue with profiling widens the gap between dependent kernels (on an H100 about
    5.7 us a launch), and profile() then raises the library's -7 saying to ask for it.

    `queue`: a pyopencl CommandQueue to create the handle on (create_with_queue); then
    run_buffers() takes pyopencl Buffers of its context. `source_only`: compile the embedded
    source even where a device binary is embedded. `stage_bytes`: run()'s staging chunk (0:
    the default, < 0: no staging). `stage_threads`: the threads that copy run()'s staged
    chunks (0: the default, one per CPU up to 8; 1: the calling thread alone). `flush_every`:
    a clFlush after the input and every N kernels of a run (0: the default, none)."""

    def __init__(self, directory, device_name=None, profile=False, params=True, queue=None,
                 source_only=False, stage_bytes=0, stage_threads=0, flush_every=0):
        from cffi import FFI
        if not -2**31 <= int(stage_threads) < 2**31:
            raise AotconvError(f"stage_threads is {stage_threads}; give 0 (the default), 1 (the "
                               f"calling thread alone) or more (at most 64 are used)")
        if not -2**31 <= int(flush_every) < 2**31:
            raise AotconvError(f"flush_every is {flush_every}; give 0 (the default: no "
                               f"flushes), N > 0 (a clFlush every N kernels) or -1 (none)")
        d = Path(directory)
        if not (d / "tuning.json").is_file():
            raise AotconvError(f"{d}: not an aotconv build directory (no tuning.json); "
                               f"run `aotconv build NET -o {d}` first")
        meta = _read_meta(d / "tuning.json")
        self.dir, self.meta = d, meta
        n = meta["c_name"]
        self.name = n
        self.input_shape = tuple(meta["input_shape"])
        # [(name, shape)] in the order of run_inputs; a library built before several inputs
        # existed has one, "input"
        self.inputs = [(i["name"], tuple(i["shape"])) for i in meta.get("inputs") or []] \
            or [("input", self.input_shape)]
        self.output_shapes = [tuple(o["shape"]) for o in meta["outputs"]]
        self.param_count = meta["param_count"]
        # [(batch, first profile entry, entries)]; a library of one size before batch ranges
        # existed has no batch_sizes
        self._sizes = [(s["batch"], s["first_kernel"], s["kernels"])
                       for s in meta.get("batch_sizes") or []] or None
        self.ffi = ffi = FFI()
        ffi.cdef(_CDEF.format(n=n))
        so = d / f"lib{n}.so"
        try:
            self.lib = ffi.dlopen(str(so.resolve()))
        except OSError as e:
            raise AotconvError(f"{so}: cannot load the library ({e}); rebuild it with "
                               f"`aotconv build NET -o {d}`") from None
        self._f = lambda s: getattr(self.lib, f"aotconv_{n}_{s}")
        opts = ffi.new(f"aotconv_{n}_options *")
        opts.platform_index, opts.device_index, opts.profile = -1, -1, int(profile)
        opts.source_only, opts.stage_bytes = int(source_only), int(stage_bytes)
        opts.stage_threads = int(stage_threads)
        opts.flush_every = int(flush_every)
        self._name_keep = ffi.new("char[]", device_name.encode()) if device_name else ffi.NULL
        opts.device_name = self._name_keep
        h = ffi.new(f"aotconv_{n} **")
        self.handle, self._pending = None, []
        if queue is None:
            self._check(self._f("create")(h, opts), None)
        else:
            cast = lambda t, o: ffi.cast(t, o.int_ptr)
            self._check(self._f("create_with_queue")(
                h, cast("cl_context", queue.context), cast("cl_device_id", queue.device),
                cast("cl_command_queue", queue), opts), None)
        self.handle = h[0]
        self.kernel_names = []
        i = 0
        while True:
            s = self._f("kernel_name")(i)
            if s == ffi.NULL:
                break
            self.kernel_names.append(ffi.string(s).decode())
            i += 1
        if self._sizes is None:
            self._sizes = [(self.input_shape[0], 0, len(self.kernel_names))]
        self.batch_sizes = [b for b, _, _ in self._sizes]
        self._host = None
        if params and (d / f"{n}.params.bin").exists():
            self.load_params(d / f"{n}.params.bin")

    def _check(self, rc, handle="self"):
        if rc != 0:
            h = self.ffi.NULL if handle is None else self.handle
            raise LibraryError(rc, self.ffi.string(self._f("last_error")(h)).decode())

    def set_params(self, flat):
        flat = np.ascontiguousarray(flat, np.float32).ravel()
        self._check(self._f("set_params")(self.handle, self.ffi.from_buffer("float[]", flat),
                                          flat.size))

    def load_params(self, path):
        """Load a <net>.params.bin (the C load_params: a missing, unreadable or wrongly sized
        file is a LibraryError [-6] naming the file and the size the network needs)."""
        self._check(self._f("load_params")(self.handle, os.fsencode(str(path))))

    def __call__(self, *x):
        """The outputs of `x`: the library's whole input (run), or n samples (run_n); of
        several inputs, one array each (run_inputs, run_inputs_n)."""
        _, out, n = self._start("run", x)
        self._pending = []        # run() ends every run before it
        return self._split(out, n)

    def _arrays(self, x):
        """The input arrays of a call's arguments `x` (a tuple): one array for a network of one
        input; of several, one per input, as arguments, one list or one dict by name."""
        names = [t for t, _ in self.inputs]
        if len(x) == 1 and isinstance(x[0], dict):
            x = x[0]
            if set(x) != set(names):
                raise AotconvError(f"{self.name}: the inputs are {', '.join(names)}; got "
                                   f"{', '.join(map(str, x))}")
            x = [x[t] for t in names]
        elif len(x) == 1 and len(names) > 1 and isinstance(x[0], (list, tuple)):
            x = x[0]
        if len(x) != len(names):
            raise AotconvError(f"{self.name}: the network takes {len(names)} input"
                               f"{'s' if len(names) > 1 else ''} ({', '.join(names)}), got "
                               f"{len(x)}")
        return [np.ascontiguousarray(a, np.float32) for a in x]

    def _start(self, call, x):
        """The arrays of `x` through the C `call` (run, run_async) where they are the library's
        whole inputs, else through its _n twin; of several inputs, through the _inputs twins:
        (the arrays, the output array, n or None)."""
        xs = self._arrays(x)
        n = self._samples(xs)
        out = self._empty_output(n)
        ffi = self.ffi
        outp = (ffi.from_buffer("float[]", out), out.size)
        if len(self.inputs) == 1:
            args = (ffi.from_buffer("float[]", xs[0]), xs[0].size) + outp
            self._check(self._f(call)(self.handle, *args) if n is None else
                        self._f(call + "_n")(self.handle, n, *args))
            return xs[0], out, n
        ptrs = ffi.new("float *[]", [ffi.from_buffer("float[]", a) for a in xs])
        counts = ffi.new("size_t[]", [a.size for a in xs])
        args = (ffi.cast("const float *const *", ptrs), counts, len(xs)) + outp
        self._check(self._f(call + "_inputs")(self.handle, *args) if n is None else
                    self._f(call + "_inputs_n")(self.handle, n, *args))
        return (xs, ptrs), out, n

    def _samples(self, xs):
        """None where the arrays `xs` are the library's whole inputs (or sizes that are no
        number of samples, or differ: run() then says what it expected), else their number of
        samples."""
        got = set()
        for a, (_, shape) in zip(xs, self.inputs):
            sample = int(np.prod(shape[1:]))
            if a.size == int(np.prod(shape)) or a.size % sample:
                return None
            got.add(a.size // sample)
        return got.pop() if len(got) == 1 else None

    def serving(self, n):
        """The batch size that runs a call with `n` samples (the smallest >= n), or None when
        n is 0 or above the largest."""
        return next((b for b in self.batch_sizes if n and b >= n), None)

    def _empty_output(self, n=None):
        n = self.input_shape[0] if n is None else n
        return np.empty(sum(n * int(np.prod(s[1:])) for s in self.output_shapes), np.float32)

    def _split(self, out, n=None):
        n = self.input_shape[0] if n is None else n
        outs, off = [], 0
        for s in self.output_shapes:
            shape = (n,) + tuple(s[1:])
            c = int(np.prod(shape))
            outs.append(out[off:off + c].reshape(shape))
            off += c
        return outs[0] if len(outs) == 1 else outs

    def run_async(self, *x):
        """Enqueue a run of `x` (C run_async, or run_async_n for n samples; the _inputs twins
        of several inputs) and return; wait() gives the output. The inputs and the output
        array of every run in flight are kept alive here until then."""
        self._pending.append(self._start("run_async", x))

    def wait(self):
        """Block until the runs in flight have ended (C wait); the output of the last, if
        run_async enqueued it, else None."""
        self._check(self._f("wait")(self.handle))
        pending, self._pending = self._pending, []
        return self._split(pending[-1][1], pending[-1][2]) if pending and pending[-1] else None

    def run_buffers(self, inp, out, n=None):
        """Enqueue a run from and into pyopencl Buffers of the handle's context (C
        run_buffers, or run_buffers_n for `n` samples; `inp` a list of Buffers, one per input,
        for run_buffers_inputs and run_buffers_inputs_n); wait() or the queue orders what
        follows."""
        cast = lambda o: self.ffi.NULL if o is None else self.ffi.cast("cl_mem", o.int_ptr)
        if isinstance(inp, (list, tuple)):
            mems = self.ffi.new("cl_mem[]", [cast(b) for b in inp])
            if n is None:
                self._check(self._f("run_buffers_inputs")(self.handle, mems, len(inp),
                                                          cast(out)))
            else:
                self._check(self._f("run_buffers_inputs_n")(self.handle, n, mems, len(inp),
                                                            cast(out)))
        elif n is None:
            self._check(self._f("run_buffers")(self.handle, cast(inp), cast(out)))
        else:
            self._check(self._f("run_buffers_n")(self.handle, n, cast(inp), cast(out)))
        self._pending.append(None)

    def program_source(self):
        """(from_binary, why): whether create() made every program from the embedded device
        binaries, and the library's own words on it."""
        why = self.ffi.new("const char **")
        rc = self._f("program_source")(self.handle, why)
        if rc < 0:
            self._check(rc)
        return rc == 1, self.ffi.string(why[0]).decode()

    def memory(self):
        """The C memory() as a dict of bytes."""
        info = self.ffi.new(f"aotconv_{self.name}_memory_info *")
        self._check(self._f("memory")(self.handle, info))
        return {k: int(getattr(info, k)) for k in (
            "activation_bytes", "parameter_bytes", "variant_bytes", "scratch_bytes",
            "device_bytes", "pinned_bytes")}

    def host_buffers(self):
        """(input, output): numpy arrays over the library's pinned host memory (C
        host_buffers()), the input in its NCHW shape (of several inputs, a list of them, one
        after another in the pinned memory), the output flat. Fill the input, call run_host(),
        read the output. They are valid until close()."""
        if self._host is None:
            ffi = self.ffi
            pin, pout = ffi.new("float **"), ffi.new("float **")
            self._check(self._f("host_buffers")(self.handle, pin, pout))
            counts = [int(np.prod(s)) for _, s in self.inputs]
            cout = sum(int(np.prod(s)) for s in self.output_shapes)
            block = np.frombuffer(ffi.buffer(pin[0], 4 * sum(counts)), np.float32)
            offs = np.cumsum([0] + counts)
            xins = [block[a:b].reshape(s) for a, b, (_, s) in zip(offs, offs[1:], self.inputs)]
            xout = np.frombuffer(ffi.buffer(pout[0], 4 * cout), np.float32)
            xin = xins[0] if len(xins) == 1 else xins
            self._host = (xin, xout, pin[0], pout[0], xins)
        return self._host[0], self._host[1]

    def run_host(self, n=None):
        """run() from the pinned input to the pinned output of host_buffers(), or run_n() of
        their first `n` samples (the _inputs twins of several inputs, each from its place in
        the pinned memory); the output (of n samples) flat."""
        _, xout = self.host_buffers()
        xins, batch = self._host[4], self.inputs[0][1][0]
        k = batch if n is None else n
        counts = [k * (a.size // batch) for a in xins]
        cout = k * (xout.size // batch)
        if len(xins) == 1:
            args = (self._host[2], counts[0], self._host[3], cout)
            call = "run"
        else:
            ffi = self.ffi
            ptrs = ffi.new("float *[]", [self._host[2] + int(o) for o in
                                         np.cumsum([0] + [a.size for a in xins])[:-1]])
            args = (ffi.cast("const float *const *", ptrs), ffi.new("size_t[]", counts),
                    len(xins), self._host[3], cout)
            call = "run_inputs"
        if n is None:
            self._check(self._f(call)(self.handle, *args))
            return xout
        self._check(self._f(call + "_n")(self.handle, n, *args))
        return xout[:cout]

    def profile(self, batch=None):
        """[(kernel name, ms)] of the last run of every batch size (NaN for a size not run
        yet), or of size `batch` only; on a network loaded with profile=True."""
        ms = np.empty(len(self.kernel_names), np.float64)
        self._check(self._f("profile")(self.handle, self.ffi.from_buffer("double[]", ms), ms.size))
        got = list(zip(self.kernel_names, ms.tolist()))
        if batch is None:
            return got
        for b, first, count in self._sizes:
            if b == batch:
                return got[first:first + count]
        raise AotconvError(f"{self.dir}: batch size {batch} is not one of the library's "
                           f"({', '.join(map(str, self.batch_sizes))})")

    def close(self):
        self._host = None
        if getattr(self, "handle", None) is not None:
            self._f("destroy")(self.handle)     # waits for a run in flight
            self.handle = None
        self._pending = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _read_meta(path):
    """tuning.json's fields the loader needs, or an AotconvError saying the file is damaged."""
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
        ok = (isinstance(meta, dict) and isinstance(meta.get("c_name"), str)
              and meta["c_name"].isidentifier()
              and all(isinstance(x, int) for x in meta.get("input_shape") or [None])
              and isinstance(meta.get("param_count"), int)
              and isinstance(meta.get("outputs"), list) and meta["outputs"]
              and all(isinstance(o, dict) and isinstance(o.get("shape"), list)
                      for o in meta["outputs"])
              # several inputs (absent before they existed): [{name, shape}], shapes of ints
              and isinstance(meta.get("inputs", []), list)
              and all(isinstance(i, dict) and isinstance(i.get("name"), str)
                      and isinstance(i.get("shape"), list) and len(i["shape"]) == 4
                      and all(isinstance(d, int) and d > 0 for d in i["shape"])
                      for i in meta.get("inputs", [])))
        why = None if ok else "a field the loader needs (c_name, input_shape, inputs, " \
                              "outputs, param_count) is missing or has the wrong type"
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
        why = str(e)
    except RecursionError:
        why = "nested too deeply"
    if why:
        raise AotconvError(f"{path}: damaged build metadata ({why}); rebuild the directory "
                           f"with `aotconv build NET -o {path.parent}`")
    return meta


def load(directory, profile=False, **kwargs):
    """The built network in `directory` (a Network). Per-kernel profiling is off unless
    profile=True, as create() with opts NULL: only then does profile() give kernel times."""
    return Network(directory, profile=profile, **kwargs)

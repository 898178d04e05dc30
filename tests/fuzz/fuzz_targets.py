"""The fuzz targets and their oracle: every input either loads or raises an AotconvError whose
message is one non-empty line.

A target pairs a hypothesis strategy (fuzz_inputs) with a check that feeds one input to a real
aotconv reader: the net.yaml loader (file and dict), the --weights reader, the tuning-records
reader and its records-only consumer, the parameter-file readers (Python and the emitted C
library's load_params) and the emitted C itself (hostile layer names through a whole build).
Anything else (another exception type, a multi-line or empty message, no answer within the
target's time limit, a result that contradicts the input) raises, and hypothesis shrinks it.

`run` drives one target for a number of inputs; after a failure it records the smallest input
hypothesis found, then goes on with a fresh seed, counting later inputs that fail the same way
(same kind, same place in aotconv) instead of chasing them again. tools/fuzz.py (`make fuzz`)
runs every target at volume; tests/fuzz/test_fuzz_slice.py runs a short fixed-seed slice.
"""
from collections import Counter
from contextlib import contextmanager, redirect_stderr, redirect_stdout
import io
from dataclasses import dataclass, field
import json
import math
import os
from pathlib import Path
import pickle
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
import zlib

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings, seed as hseed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, HypothesisWarning
import yaml

import fuzz_inputs as fi
from aotconv import params, spec
from aotconv.errors import AotconvError, BuildError

AOTCONV_DIR = str(Path(spec.__file__).resolve().parent)
MAX_MESSAGE = 100_000          # a message longer than this was amplified by the input


class Failure(Exception):
    """An input broke the oracle without raising anything itself: `kind` says how, `site`
    where in aotconv (file:line), `detail` what was seen."""

    def __init__(self, kind, site, detail=""):
        self.kind, self.site, self.detail = kind, site, detail
        super().__init__(f"{kind} at {site}: {detail}")


class Hang(Exception):
    """Raised by the alarm inside a check that has not returned within its time limit."""


@contextmanager
def time_limit(seconds):
    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def guarded(target, x):
    """target.check(x) under its time limit, with what it prints to stderr and the Python
    warnings it raises captured: a warning must be one line starting 'aotconv: ', and no
    Python warning may come out of aotconv's own lines (a user would see source lines)."""
    buf = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, redirect_stderr(buf), \
            time_limit(target.timeout):
        warnings.simplefilter("always")
        target.check(x)
    caught = [w for w in caught if not issubclass(w.category, HypothesisWarning)]
    for line in buf.getvalue().split("\n"):
        if line and (not line.startswith("aotconv: ") or "\r" in line):
            raise Failure("multi-line or stray stderr output", "stderr", repr(line[:200]))
    for w in caught:
        # warnings Python hides by default (ResourceWarning, DeprecationWarning) reach no user
        if issubclass(w.category, (ResourceWarning, DeprecationWarning,
                                   PendingDeprecationWarning)):
            continue
        if str(w.filename).startswith(AOTCONV_DIR):
            site = f"{os.path.relpath(w.filename, os.path.dirname(AOTCONV_DIR))}:{w.lineno}"
            raise Failure("Python warning", site, f"{w.category.__name__}: {w.message}")


def aotconv_site(tb):
    """'aotconv/x.py:N in f' of the innermost aotconv frame of a traceback (else the innermost
    frame): where the fix belongs."""
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if f.filename.startswith(AOTCONV_DIR)] or frames[-1:]
    if not ours:
        return "?"
    f = ours[-1]
    return f"{os.path.relpath(f.filename, os.path.dirname(AOTCONV_DIR))}:{f.lineno} in {f.name}"


def signature(e):
    """What makes two failures the same bug: the kind of failure and the place in aotconv."""
    if isinstance(e, Failure):
        return (e.kind, e.site)
    if isinstance(e, Hang):
        return ("hang", "")
    return (type(e).__name__, aotconv_site(e.__traceback__))


def last_line(e):
    """The last line of the traceback a user would see."""
    return traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0][:500]


def expect_clean(fn, *args, **kw):
    """fn(*args, **kw): its result, or None when it raised a clean AotconvError. An error with
    an empty, multi-line or amplified message raises Failure; any other exception propagates."""
    try:
        return fn(*args, **kw)
    except AotconvError as e:
        check_message(e)
        return None


def check_message(e):
    msg = str(e)
    site = aotconv_site(e.__traceback__)
    if not msg.strip():
        raise Failure("empty message", site, repr(msg)) from None
    if "\n" in msg or "\r" in msg:
        raise Failure("multi-line message", site, repr(msg[:300])) from None
    if len(msg) > MAX_MESSAGE:
        raise Failure("huge message", site, f"{len(msg)} characters: {msg[:200]!r}") from None


# ---------------------------------------------------------------------------------------------
# the work directory and the fixed networks the readers are given

_WORK = None


def workdir():
    global _WORK
    if _WORK is None:
        _WORK = Path(tempfile.mkdtemp(prefix="aotconv-fuzz-"))
        import atexit
        atexit.register(shutil.rmtree, _WORK, True)
    return _WORK


def scratch(name, data=None):
    """A path in the work directory, written with `data` when given."""
    p = workdir() / name
    if data is not None:
        p.write_bytes(data)
    return p


def fresh_dir():
    """A new empty directory for one input (the previous one is removed): readers that warn
    once per file and process must see a new file each time, or a failure would not replay."""
    n = _cache["fresh"] = _cache.get("fresh", 0) + 1
    shutil.rmtree(workdir() / f"in{n - 1}", ignore_errors=True)
    d = workdir() / f"in{n}"
    d.mkdir()
    return d


# conv (grouped, with bias), batchnorm, conv without bias, dense: every tensor kind
PARAMS_NET = {
    "name": "fzp", "input": [1, 4, 5, 5],
    "layers": [
        {"name": "c1", "op": "conv", "out": 4, "kernel": 3, "groups": 2, "pad": 1},
        {"name": "bn", "op": "batchnorm"},
        {"name": "c2", "op": "conv", "out": 3, "kernel": [1, 2], "bias": False},
        {"name": "r", "op": "relu"},
        {"name": "fc", "op": "dense", "out": 3},
    ]}
_cache = {}


def params_net():
    if "net" not in _cache:
        _cache["net"] = spec.network_from_dict(PARAMS_NET, file="fuzz")
    return _cache["net"]


def params_yaml():
    p = workdir() / "fzp.yaml"
    if not p.exists():
        p.write_bytes(yaml.safe_dump(PARAMS_NET).encode())
    return p


def params_layout():
    return [(f"{l}.{t}", tuple(s)) for l, t, s, _ in params_net().param_layout()]


# ---------------------------------------------------------------------------------------------
# targets

@dataclass
class Target:
    name: str
    doc: str
    strategy: object                    # () -> hypothesis strategy
    check: object                       # (input) -> None, raises on failure
    suffix: str = ".bin"                # of the reproducer file
    timeout: float = 10.0               # seconds per input before it counts as a hang
    needs: str = ""                     # "device": a PoCL device, "cc": a C compiler
    to_bytes: object = None             # input -> reproducer bytes (default: the input)
    from_bytes: object = None           # reproducer bytes -> input

    def save(self, x, stem):
        path = Path(str(stem) + self.suffix)
        path.write_bytes(self.to_bytes(x) if self.to_bytes else x)
        return path

    def load(self, path):
        data = Path(path).read_bytes()
        return self.from_bytes(data) if self.from_bytes else data


def _loaded_network(net):
    """What the CLI does next with a loaded network (layout, passes): it must not fail either."""
    from aotconv import passes
    net.param_layout()
    net.param_count()
    passes.optimise(net)


def cli_refuses(argv):
    """`aotconv ARGV` for an input its reader refused: exit status 2 and exactly one line on
    stderr, `aotconv: error: ...` (no traceback), before any work."""
    from aotconv import cli
    buf = io.StringIO()
    with redirect_stderr(buf), redirect_stdout(io.StringIO()):
        rc = cli.main(argv)
    err = buf.getvalue()
    if rc != 2 or err.count("\n") != 1 or not err.startswith("aotconv: error: "):
        raise Failure("the CLI does not give a one-line error", "aotconv/cli.py main",
                      f"exit status {rc}, stderr {err[:300]!r}")


def check_netyaml(data, batch=None):
    path = scratch("net.yaml", data)
    net = expect_clean(spec.load_network, str(path), batch=batch)
    if net is not None:
        _loaded_network(net)
    elif zlib.crc32(data) % 4 == 0 and (batch is None or (isinstance(batch, int)
                                                           and not isinstance(batch, bool))):
        cli_refuses(["build", str(path), "--target", "pocl-cpu", "--no-tune", "-o",
                     str(workdir() / "cli-out")] + ([] if batch is None else
                                                    ["--batch", str(batch)]))


def check_netdict(x):
    d, batch = x
    d = fi.materialise(d)
    net = expect_clean(spec.network_from_dict, d, batch=batch)
    if net is not None:
        _loaded_network(net)


def check_weights(w):
    path = scratch("weights.npz", w.data)
    try:
        flat = params.from_npz(params_net(), str(path))
    except AotconvError as e:
        check_message(e)
        if w.expect is not None:
            raise Failure("valid weights refused", "aotconv/params.py from_npz",
                          f"{w.note}: {e}") from None
        flat = None
    if flat is None:
        cli_refuses(["build", str(params_yaml()), "--weights", str(path), "--target",
                     "pocl-cpu", "--no-tune", "-o", str(workdir() / "cli-out")])
        return
    n = params_net().param_count()
    if not (isinstance(flat, np.ndarray) and flat.dtype == np.float32 and flat.shape == (n,)):
        raise Failure("wrong result", "aotconv/params.py from_npz",
                      f"{type(flat).__name__} {getattr(flat, 'dtype', '')} "
                      f"{getattr(flat, 'shape', '')}, expected float32 ({n},)")
    if not np.all(np.isfinite(flat)):
        raise Failure("non-finite weights accepted", "aotconv/params.py from_npz", w.note)
    if w.expect is not None and not np.array_equal(flat, w.expect):
        raise Failure("wrong result", "aotconv/params.py from_npz",
                      "the flat parameters differ from the file's arrays")


def _params_path(p):
    path = workdir() / "params.bin"
    if path.is_dir():
        path.rmdir()
    elif path.exists():
        path.unlink()
    if p.path_kind == "file":
        path.write_bytes(p.data)
    elif p.path_kind == "directory":
        path.mkdir()
    return path


def check_params_bin(p):
    net = params_net()
    flat = expect_clean(params.read_bin, str(_params_path(p)), net)
    ok = p.path_kind == "file" and len(p.data) == 4 * net.param_count()
    if (flat is not None) != ok:
        raise Failure("wrong result", "aotconv/params.py read_bin",
                      f"{'accepted' if flat is not None else 'refused'} {len(p.data)} bytes "
                      f"for {net.param_count()} float32")
    if flat is not None and not np.array_equal(flat.view(np.uint32),
                                               np.frombuffer(p.data, "<u4").astype(np.uint32)):
        raise Failure("wrong result", "aotconv/params.py read_bin", "values differ from the file")


# -- records ---------------------------------------------------------------------------------

def records_setup():
    """The keys of a real conv layer's records on pocl-cpu, and real points of its variants."""
    if "records" not in _cache:
        from aotconv.space import layer_space
        from aotconv.targets import get_target
        from aotconv.tune.records import Key
        net = spec.network_from_dict({"name": "fzr", "input": [1, 3, 8, 8], "layers": [
            {"name": "c", "op": "conv", "out": 4, "kernel": 3, "pad": 1}]}, file="fuzz")
        layer, target = net.layers[0], get_target("pocl-cpu")
        sp = layer_space(layer, target)
        keys, bases, knobs = [], [], set()
        for part in sp.parts:
            if not part.points:
                continue
            key = Key(layer, part.variant, target, None)
            step = max(1, len(part.points) // 12)
            keys.append(key)
            bases.append((key.fields(), tuple(part.points[::step][:12])))
            knobs.update(k.name for k in part.knobs)
        _cache["records"] = (layer, target, keys, bases, tuple(sorted(knobs)))
    return _cache["records"]


def records_strategy():
    _, _, _, bases, knobs = records_setup()
    return fi.records_file(bases, knobs)


def check_records(data):
    """Store.lookup for every variant's key, read_log, and for one input in four (it is
    slow: it hashes every variant's template) records_only, what --records-only builds use."""
    from aotconv.tune.records import Store, read_log
    from aotconv.tune.search import records_only
    layer, target, keys, _, _ = records_setup()
    path = fresh_dir() / "records.jsonl"
    path.write_bytes(data)
    store = Store(read=[path])
    for key in keys:
        found = expect_clean(store.lookup, key)
        for cfg, o in (found or {}).items():
            hash(cfg)
            if o.ok:
                cost = o.cost
                if (isinstance(cost, bool) or not isinstance(cost, (int, float))
                        or math.isnan(cost) or cost < 0):
                    raise Failure("unusable record accepted", "aotconv/tune/records.py lookup",
                                  f"an ok outcome with time {cost!r}")
    expect_clean(read_log, str(path))
    if zlib.crc32(data) % 4:
        return
    res = expect_clean(records_only, [[layer]], target, Store(read=[path]))
    for r in (res or {}).values():
        if r.best is not None:
            cost = r.best_outcome.cost if r.best_outcome is not None else None
            if not isinstance(cost, (int, float)) or isinstance(cost, bool) or math.isnan(cost) \
                    or cost < 0:
                raise Failure("unusable record chosen", "aotconv/tune/search.py records_only",
                              f"best {r.best} with time {cost!r}")


# -- the emitted library's load_params (PoCL) ---------------------------------------------------

def c_library():
    """A library built for PARAMS_NET (fallback choices, no tuning), opened once with a
    handle: the fuzz loop calls load_params on it and builds no kernels."""
    if "lib" not in _cache:
        from aotconv.compiler import compile_network
        from aotconv.runtime import load
        src = params_yaml()
        out = workdir() / "fzp"
        compile_network(str(src), target="pocl-cpu", outdir=out, tune_mode="fallback",
                        measure=False, quiet=True)
        lib = load(out, params=False)
        x = np.random.default_rng(0).standard_normal(lib.input_shape).astype(np.float32)
        _cache["lib"] = (lib, x)
    return _cache["lib"]


def check_params_c(p):
    lib, x = c_library()
    net = params_net()
    path = _params_path(p)
    py = expect_clean(params.read_bin, str(path), net)
    try:
        lib.load_params(str(path))
        c_ok = True
    except AotconvError as e:
        check_message(e)
        c_ok = False
    if c_ok != (py is not None):
        raise Failure("readers disagree", "runtime_c/rt_net.c aotrt_load_params",
                      f"C {'accepted' if c_ok else 'refused'}, Python "
                      f"{'accepted' if py is not None else 'refused'} {len(p.data)} bytes")
    if c_ok:
        y = lib(x)
        lib.set_params(py)
        want = lib(x)
        if not np.array_equal(y, want, equal_nan=True):
            raise Failure("wrong result", "runtime_c/rt_net.c aotrt_load_params",
                          "the run after load_params differs from the run after set_params "
                          "of the same floats")


# -- hostile layer names through emit and the C compiler ----------------------------------------

def _dump_yaml(d):
    return yaml.safe_dump(d, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")


_GCC_NOISE = re.compile(r"^[^:]*:\d+:\d+: |'[^']*'|\"[^\"]*\"|\d+")


def check_emit(data):
    """A valid network with hostile layer names: its library must build, and kernel_name()
    must give back each layer's name exactly."""
    from cffi import FFI
    from aotconv.compiler import compile_network
    src = scratch("emit.yaml", data)
    n = _cache["emit_n"] = _cache.get("emit_n", 0) + 1
    out = workdir() / f"emit{n}"
    try:
        res = compile_network(str(src), target="pocl-cpu", outdir=out, tune_mode="fallback",
                              measure=False, quiet=True)
    except BuildError as e:
        log = str(e)
        first = next((l for l in log.splitlines() if "error" in l), log.splitlines()[-1])
        raise Failure("emitted C does not build", "aotconv/emit.py",
                      _GCC_NOISE.sub("_", first).strip()[:120]) from None
    except AotconvError as e:
        check_message(e)
        return
    finally:
        old = workdir() / f"emit{n - 1}"
        shutil.rmtree(old, ignore_errors=True)
    c = res.net.name
    ffi = FFI()
    ffi.cdef("const char *aotconv_%s_kernel_name(size_t i);" % c)
    lib = ffi.dlopen(str((out / f"lib{c}.so").resolve()))
    try:
        want = [f"{l.layer}/{l.kernel}" for l in res.schedule.launches if l.phase == "run"]
        got = []
        for i in range(len(want) + 1):
            s = getattr(lib, f"aotconv_{c}_kernel_name")(i)
            if s == ffi.NULL:
                break
            got.append(ffi.string(s).decode("utf-8", "surrogateescape"))
    finally:
        ffi.dlclose(lib)
    if got != want:
        bad = next((f"{g!r} for {w!r}" for g, w in zip(got, want) if g != w),
                   f"{len(got)} names for {len(want)} kernels")
        raise Failure("kernel_name differs from the layer", "aotconv/emit.py", bad)


# -- hostile file names -----------------------------------------------------------------------

def check_path(case):
    """A broken input stored under a hostile file name: the message that names the file must
    still be one line."""
    p = fresh_dir() / case.name
    if case.reader == "netyaml":
        p.write_bytes(b"name: x\ninput: [1]\nlayers: []\n")
        expect_clean(spec.load_network, str(p))
    elif case.reader == "weights":
        p.write_bytes(b"not a zip")
        expect_clean(params.from_npz, params_net(), str(p))
    elif case.reader == "params":
        p.write_bytes(b"abc")
        expect_clean(params.read_bin, str(p), params_net())
    else:
        p.write_bytes(b'{"op": 1}\n')
        from aotconv.tune.records import read_log
        expect_clean(read_log, str(p))


def _pickled(x):
    return pickle.dumps(x)


TARGETS = {t.name: t for t in [
    Target("netyaml", "net.yaml text: plausible networks, hostile edits, varied YAML",
           lambda: st.tuples(fi.net_yaml(), fi.batch_override()),
           lambda x: check_netyaml(*x), suffix=".pickle", to_bytes=_pickled,
           from_bytes=pickle.loads),
    Target("netyaml_raw", "net.yaml bytes: noise and mutated shipped networks",
           fi.net_yaml_raw, check_netyaml, suffix=".yaml"),
    Target("netdict", "network_from_dict on Python values a caller could pass",
           lambda: st.tuples(fi.net_dict(), fi.batch_override()), check_netdict,
           suffix=".pickle", to_bytes=_pickled, from_bytes=pickle.loads),
    Target("weights", "--weights files: .npz with wrong keys/shapes/dtypes/values, damage",
           lambda: fi.weights_file(params_layout()), check_weights, suffix=".pickle",
           to_bytes=_pickled, from_bytes=pickle.loads),
    Target("records", "tuning records: damaged lines, wrong types, NaN, torn tails",
           records_strategy, check_records, suffix=".jsonl"),
    Target("params_bin", "<net>.params.bin through aotconv.params.read_bin",
           lambda: fi.params_file(params_net().param_count()), check_params_bin,
           suffix=".pickle", to_bytes=_pickled, from_bytes=pickle.loads),
    Target("params_c", "<net>.params.bin through the emitted library's load_params (PoCL)",
           lambda: fi.params_file(params_net().param_count()), check_params_c,
           suffix=".pickle", to_bytes=_pickled, from_bytes=pickle.loads, needs="device"),
    Target("emit", "hostile layer names through emit, ninja and the C compiler",
           lambda: fi.emit_net().map(_dump_yaml), check_emit, suffix=".yaml", timeout=120,
           needs="cc"),
    Target("paths", "broken inputs under hostile file names",
           fi.path_case, check_path, suffix=".pickle", to_bytes=_pickled,
           from_bytes=pickle.loads),
]}


def available(target):
    """None when the target can run here, else why not."""
    if target.needs == "device":
        from aotconv.targets import find_device, get_target
        if find_device(get_target("pocl-cpu")) is None:
            return "no PoCL device"
    if target.needs in ("device", "cc") and shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler"
    return None


# ---------------------------------------------------------------------------------------------
# running a target

@dataclass
class Found:
    """One distinct failure: its signature, the smallest input hypothesis found, the error."""
    target: str
    sig: tuple
    input: object
    error: str
    traceback: str
    hits: int = 1
    flaky: bool = False


@dataclass
class Stats:
    target: str
    inputs: int = 0
    seconds: float = 0.0                # wall
    cpu_seconds: float = 0.0            # this process and its children (ninja, the compiler)
    found: list = field(default_factory=list)
    hits: Counter = field(default_factory=Counter)


def _settings(n, derandomize):
    return settings(max_examples=n, database=None, deadline=None, derandomize=derandomize,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate,
                                                                      Phase.shrink],
                    report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)


def _cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def place(sig):
    """A signature without its line number: (kind, file, function), stable across edits."""
    m = re.match(r"(.*?):\d+ in (.*)$", sig[1])
    return (sig[0],) + (m.groups() if m else (sig[1], ""))


def run(target, inputs, seed=0, derandomize=False, max_seconds=None, stats=None,
        max_failures=20, inflight=None, ignore=()):
    """Feed `target` about `inputs` generated inputs (shrinking adds some); every distinct
    failure ends up in stats.found with its smallest input. `inflight`: a path stem where each
    input is saved before it runs, so an input that kills the process is not lost. `ignore`:
    places (see `place`) of known failures, counted in stats.hits but not chased."""
    stats = stats or Stats(target.name)
    known = {f.sig for f in stats.found}
    ignore = set(ignore)
    t0, c0 = time.monotonic(), _cpu()
    generated = 0
    round_ = 0
    strategy = target.strategy()
    while generated < inputs and len(stats.found) < max_failures:
        if max_seconds is not None and time.monotonic() - t0 > max_seconds:
            break
        hunted = {}
        count = {"n": 0}

        def test(x):
            count["n"] += 1
            stats.inputs += 1
            if inflight is not None:
                target.save(x, inflight)
            try:
                guarded(target, x)
            except Exception as e:
                sig = signature(e)
                stats.hits[sig] += 1
                if sig in known or place(sig) in ignore or (hunted and hunted["sig"] != sig):
                    return
                hunted.update(sig=sig, x=x, error=last_line(e),
                              tb="".join(traceback.format_exception(type(e), e,
                                                                    e.__traceback__))[-4000:])
                raise

        want = inputs - generated
        t = given(strategy)(test)
        t = _settings(want, derandomize)(t)
        if not derandomize:
            t = hseed(seed * 1000 + round_)(t)
        round_ += 1
        flaky = False
        try:
            with warnings.catch_warnings():
                # hypothesis warns when it prints a big failing input; the reproducer is saved
                warnings.simplefilter("ignore", HypothesisWarning)
                t()
        except Flaky:
            flaky = True
        except Exception:
            if not hunted:
                raise
        generated += count["n"]
        if hunted:
            known.add(hunted["sig"])
            stats.found.append(Found(target.name, hunted["sig"], hunted["x"], hunted["error"],
                                     hunted["tb"], flaky=flaky))
        elif derandomize or count["n"] < want:
            break                    # hypothesis ran out of new inputs (or replays one seed)
    stats.seconds += time.monotonic() - t0
    stats.cpu_seconds += _cpu() - c0
    for f in stats.found:
        f.hits = stats.hits[f.sig]
    return stats


def describe(found, limit=300):
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)           # the input may hold a huge int on purpose
    try:
        r = repr(found.input)
    finally:
        sys.set_int_max_str_digits(old)
    return r if len(r) <= limit else r[:limit] + f"... ({len(r)} characters)"


def replay(target, path):
    """Run one saved input through `target`'s check; the exception or None."""
    x = target.load(path)
    try:
        guarded(target, x)
    except Exception as e:
        return e
    return None


if __name__ == "__main__":
    sys.exit("run tools/fuzz.py")

"""Time an emitted library as `aotconv bench` reports it end to end: run() from numpy memory,
the sum of its per-kernel profile, run() from its pinned host buffers with profiling on and on
a second handle with it off, run_buffers() on an input already on the device (the way the
references are timed), and the first run's output.

`time_library` does the timing; `in_own_process` runs it in a child process of its own
(`python -m aotconv.bench.library_timing`, the bench's interpreter and sys.path), as an
application that links the library runs it: without PyTorch's CUDA context, threads, compile
workers and caches, which the bench process carries once it has timed PyTorch. The child
takes the parameters and the input as .npy files, writes the figures as JSON and the output
as .npz, and never imports torch (it says whether 'torch' was loaded). A child that exits with
an error, is killed by a signal or runs past its time limit gives a one-line error, not a
traceback.
"""
import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

from ..protocol import e2e_counts
from ..runtime import _read_meta, load
from ..targets import _devices, find_device, get_target
from .report import failure, rounded

# the child announces its first timing on stdout with this prefix; the rest of its stdout
# (a driver's own prints) is ignored
MARK = "aotconv-timing: "
# until the first timing: dlopen, create() (PoCL compiles the embedded source there), the
# parameters and two runs; no count to derive a limit from yet, so a generous fixed one
LOAD_TIMEOUT_S = 1800.0
# after it: this many times what the remaining runs and the second handle's load should take,
# plus a constant for the process's exit
SLACK = 10.0
EXIT_S = 60.0
STDERR_LINES = 3
MODULE = "aotconv.bench.library_timing"


def time_library(build_dir, flat, x, opts, on_first=None, resident_only=False):
    """Time the library in `build_dir` on the parameters `flat` and the input `x`, with the
    warm-up and repeats of protocol.e2e_counts(first timing, opts) (opts: repeats, warmup,
    max_measure_s). Returns (ours, y): ours holds run_ms, kernels_ms, run_times, launches,
    run_pinned_ms (or run_pinned_error) and run_pinned_noprof_ms (or ..._error), or what was
    measured and {error, where} once something failed; y is the first run's output (None
    when it could not be had). `on_first(once_ms, load_s)` is called after the first timing.
    With `resident_only`, ours holds run_resident_ms (or run_resident_error) alone: one more
    round of the device-resident timing (`aotconv bench --e2e-rounds`)."""
    if resident_only:
        return _resident_round(build_dir, flat, x, opts, on_first)
    ours, y = {}, None
    try:
        t0 = time.perf_counter()
        with load(build_dir, profile=True) as lib:      # the kernels column: profile()
            y, load_s, once_ms = _first_runs(lib, flat, x, t0)
            if on_first is not None:
                on_first(once_ms, load_s)
            warmup, repeats = e2e_counts(once_ms, opts)
            for _ in range(warmup):
                lib(x)
            walls, sums = [], []
            for _ in range(repeats):
                t1 = time.perf_counter()
                lib(x)
                walls.append((time.perf_counter() - t1) * 1e3)
                sums.append(sum(ms for _, ms in lib.profile()))
            ours.update(run_ms=float(np.median(walls)), kernels_ms=float(np.median(sums)),
                        run_times=rounded(walls), launches=len(lib.kernel_names))
            ours.update(pinned_run(lib, x, y, warmup, repeats))
        # what an application gets by default (options.profile = 0, or opts NULL): a queue
        # without CL_QUEUE_PROFILING_ENABLE, whose kernels record no timestamps
        with load(build_dir, profile=False) as lib:
            lib.set_params(flat)
            quiet = pinned_run(lib, x, y, warmup, repeats)
        ours.update({k.replace("run_pinned", "run_pinned_noprof"): v for k, v in quiet.items()})
        ours.update(resident_run(build_dir, flat, x, y, warmup, repeats))
    except Exception as e:
        ours.update(failure(e))
    return ours, y


def _first_runs(lib, flat, x, t0):
    """The parameters set and two runs on a handle loaded since `t0`: (the first run's output,
    seconds from t0 to it, ms of the second run)."""
    lib.set_params(flat)
    y = lib(x)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    lib(x)
    return y, load_s, (time.perf_counter() - t1) * 1e3


def _resident_round(build_dir, flat, x, opts, on_first):
    """time_library(resident_only=True): run() once for the output that the device-resident
    runs must match and once timed for the counts, then resident_run."""
    ours, y = {}, None
    try:
        t0 = time.perf_counter()
        with load(build_dir, profile=False) as lib:
            y, load_s, once_ms = _first_runs(lib, flat, x, t0)
        if on_first is not None:
            on_first(once_ms, load_s)
        ours.update(resident_run(build_dir, flat, x, y, *e2e_counts(once_ms, opts)))
    except Exception as e:
        ours.update(failure(e))
    return ours, y


def median_ms(call, warmup, repeats):
    """The median wall time of `call()` in ms over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        t1 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t1) * 1e3)
    return float(np.median(times))


def pinned_run(lib, x, y, warmup, repeats):
    """run() from the library's pinned host buffers (host_buffers()), what an application that
    writes its input there gets: {"run_pinned_ms"}, or {"run_pinned_error"} when the buffers
    cannot be had or the output differs from run() on numpy memory."""
    try:
        xin, _ = lib.host_buffers()
        xin[...] = x
        got = lib.run_host().copy()
        want = np.concatenate([v.ravel() for v in (y if isinstance(y, list) else [y])])
        if not np.array_equal(got, want):
            return {"run_pinned_error": "the output from the pinned buffers differs from "
                                        "run() on numpy memory"}
        return {"run_pinned_ms": median_ms(lib.run_host, warmup, repeats)}
    except Exception as e:
        return {"run_pinned_error": f"{type(e).__name__}: {e}"}


def resident_run(build_dir, flat, x, y, warmup, repeats):
    """run_buffers() from an input already in device memory to an output left there, on a
    queue of this process's own (create_with_queue, profiling off), each call timed from the
    enqueue to clFinish: what an application whose data lives on the device gets, and what the
    references' CUDA-event times measure. {"run_resident_ms"}, or {"run_resident_error"} when
    the library's device cannot be found here or the output differs from run()."""
    try:
        found = _library_device(_read_meta(Path(build_dir) / "tuning.json").get("target"))
        if isinstance(found, str):
            return {"run_resident_error": found}
        ctx = cl.Context([found])
        q = cl.CommandQueue(ctx, found)
        with load(build_dir, queue=q) as lib:
            lib.set_params(flat)
            xs = x if isinstance(x, list) else [x]
            mf = cl.mem_flags
            ins = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                             hostbuf=np.ascontiguousarray(v, np.float32)) for v in xs]
            want = np.concatenate([v.ravel() for v in (y if isinstance(y, list) else [y])])
            out = cl.Buffer(ctx, mf.READ_WRITE, 4 * want.size)
            inp = ins if len(ins) > 1 else ins[0]

            def once():
                lib.run_buffers(inp, out)
                q.finish()
            once()
            got = np.empty_like(want)
            cl.enqueue_copy(q, got, out)
            if not np.array_equal(got, want):
                return {"run_resident_error": "the output of run_buffers() differs from run() "
                                              "on numpy memory"}
            return {"run_resident_ms": median_ms(once, warmup, repeats)}
    except Exception as e:
        return {"run_resident_error": f"{type(e).__name__}: {e}"}


def _library_device(target_name):
    """The pyopencl device that the library's create() picks: the one named by AOTCONV_DEVICE
    (a substring of "platform-vendor platform-name device-vendor device-name", as in C), else
    the first that matches its target; or a sentence saying why there is none."""
    want = os.environ.get("AOTCONV_DEVICE")
    if want:
        for p, d in _devices():
            if want.lower() in f"{p.vendor} {p.name} {d.vendor} {d.name}".lower():
                return d
        return f"no OpenCL device here matches AOTCONV_DEVICE '{want}'"
    try:
        found = find_device(get_target(target_name))
    except Exception:
        return f"the library's target '{target_name}' is not a known profile here"
    return found[1] if found else \
        f"no OpenCL device here matches the library's target '{target_name}'"


def in_bench_process(build_dir, flat, x, opts, resident_only=False):
    """time_library in this process (`aotconv bench --ours-in-process`); ours says so."""
    ours, y = time_library(build_dir, flat, x, opts, resident_only=resident_only)
    ours.update(process="bench", torch_loaded="torch" in sys.modules)
    return ours, y


def child_command(build_dir, files, opts, resident_only=False):
    """The child's command line: this interpreter, this module, the files and the counts."""
    return [sys.executable, "-m", MODULE, str(Path(build_dir).resolve()),
            "--params", str(files / "params.npy"), "--input", str(files / "input.npy"),
            "--out", str(files), "--repeats", str(opts.repeats), "--warmup", str(opts.warmup),
            "--max-measure-s", str(opts.max_measure_s)] + (
                ["--resident-only"] if resident_only else [])


def in_own_process(build_dir, flat, x, opts, resident_only=False):
    """time_library in a child process of its own: (ours, y) as time_library gives them, ours
    with process "own" and whether the child had loaded torch; where the child gave no result
    (it exited with an error, was killed, or ran past its limit), ours is {error} saying so
    with the last lines of its stderr, and y is None; where this side failed (the files not
    written, the process not started), {error, where} as time_library gives them."""
    try:
        return _in_own_process(build_dir, flat, x, opts, resident_only)
    except Exception as e:
        return {**failure(e), "process": "own"}, None


def _in_own_process(build_dir, flat, x, opts, resident_only):
    with tempfile.TemporaryDirectory(prefix="aotconv-timing-") as tmp:
        files = Path(tmp)
        np.save(files / "params.npy", np.ascontiguousarray(flat, np.float32))
        np.save(files / "input.npy", np.ascontiguousarray(x, np.float32))
        env = dict(os.environ)
        # the bench's own sys.path (a tool may have put aotconv on it by hand)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(files / "stderr.txt", "w+b") as err:
            clean, ended = _run_child(child_command(build_dir, files, opts, resident_only),
                                       env, err)
            err.seek(0)
            tail = _tail(err.read().decode("utf-8", "replace"))
        result = files / "ours.json"
        if not result.is_file():
            return {"error": f"no result ({ended}{': ' + tail if tail else ''})",
                    "process": "own"}, None
        doc = json.loads(result.read_text())
        ours = doc["ours"]
        y = None
        if doc["outputs"]:
            with np.load(files / "y.npz") as z:
                ys = [z[f"y{i}"] for i in range(doc["outputs"])]
            y = ys if doc["list"] else ys[0]
        ours["process"] = "own"
        if not clean:
            # the figures were written before it ended so: kept, and the end recorded
            ours["process_end"] = ended + (f": {tail}" if tail else "")
        return ours, y


def _run_child(cmd, env, err):
    """Run the child to its end: (whether it exited with status 0, how it ended as a phrase:
    "the timing process exited with status 1", "... was killed by SIGSEGV", "... was stopped
    after N s, its time limit")."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                            env=env, start_new_session=True)
    lines = queue.Queue()

    def read():
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put(None)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = t0 + LOAD_TIMEOUT_S
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                return False, _stopped(t0)
            if line is None:
                break
            if line.startswith(MARK):
                first = json.loads(line[len(MARK):])
                deadline = time.monotonic() + SLACK * first["rest_s"] + EXIT_S
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            return False, _stopped(t0)
    finally:
        if proc.poll() is None:          # interrupted (Ctrl-C): the child goes too
            _kill(proc)
        reader.join(timeout=5)
        proc.stdout.close()
    rc = proc.returncode
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return False, f"the timing process was killed by {name}"
    return rc == 0, f"the timing process exited with status {rc}"


def _stopped(t0):
    return f"the timing process was stopped after {time.monotonic() - t0:.0f} s, its time limit"


def _kill(proc):
    """The child and whatever it started (its own process group) killed, and reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def _tail(text):
    """The last lines of a stderr on one line."""
    lines = [" ".join(l.split()) for l in text.splitlines() if l.strip()]
    return " / ".join(lines[-STDERR_LINES:])[-600:]


def main(argv=None):
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the build's output directory")
    p.add_argument("--params", required=True, help="the parameters, a float32 .npy")
    p.add_argument("--input", required=True, help="the input, a float32 .npy")
    p.add_argument("--out", required=True,
                   help="where ours.json (the figures) and y.npz (the output) go")
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--max-measure-s", type=float, required=True)
    p.add_argument("--resident-only", action="store_true",
                   help="time run_buffers() on a device-resident input alone (one more round)")
    a = p.parse_args(argv)
    opts = argparse.Namespace(repeats=a.repeats, warmup=a.warmup, max_measure_s=a.max_measure_s)
    flat, x = np.load(a.params), np.load(a.input)

    def first(once_ms, load_s):
        # the parent's time limit: the runs left (about four times warm-up and repeats: the
        # profiled handle's, the pinned runs of two handles, the device-resident runs) and the
        # load of two more handles
        warmup, repeats = e2e_counts(once_ms, opts)
        rest_s = (4 * (warmup + repeats) + 3) * once_ms / 1e3 + 2 * load_s
        print(MARK + json.dumps({"once_ms": once_ms, "load_s": load_s, "rest_s": rest_s}),
              flush=True)

    ours, y = time_library(a.dir, flat, x, opts, on_first=first, resident_only=a.resident_only)
    ours["torch_loaded"] = "torch" in sys.modules
    out = Path(a.out)
    ys = [] if y is None else (y if isinstance(y, list) else [y])
    if ys:
        np.savez(out / "y.npz", **{f"y{i}": v for i, v in enumerate(ys)})
    tmp = out / "ours.json.tmp"
    tmp.write_text(json.dumps({"ours": ours, "outputs": len(ys), "list": isinstance(y, list)}))
    tmp.replace(out / "ours.json")          # whole, or absent
    return 0


if __name__ == "__main__":
    sys.exit(main())

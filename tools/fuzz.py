"""Fuzz aotconv's readers of user input with hypothesis (`make fuzz`).

    .venv/bin/python tools/fuzz.py                    # every target, ~170,000 inputs, 2 jobs
    .venv/bin/python tools/fuzz.py --targets netyaml,weights --scale 0.1
    .venv/bin/python tools/fuzz.py --replay build/fuzz/netyaml-1.pickle

The targets and the oracle are in tests/fuzz/fuzz_targets.py: every input either loads or
raises an AotconvError whose message is one non-empty line. Each distinct failure (kind of
failure and place in aotconv) is shrunk by hypothesis to a small input, written to --out as a
reproducer, and listed at the end with the last line of its traceback; the exit status is 1
when anything failed. --replay runs one reproducer again and prints its traceback.
"""
import argparse
import json
import os
from pathlib import Path
import resource
import sys
import time
import traceback

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

# inputs per target in one `make fuzz` (scaled by --scale): about 170,000 in all and about
# 1,500 CPU seconds, so about 13 minutes on 2 idle cores (measured: 25 minutes on 2 cores
# shared with other work); the slow targets (records, the C library, emit) get fewer
COUNTS = {
    "netyaml": 40_000,
    "netyaml_raw": 40_000,
    "netdict": 40_000,
    "weights": 24_000,
    "params_bin": 10_000,
    "paths": 4_000,
    "records": 8_000,
    "params_c": 3_000,
    "emit": 300,
}
# seconds per input on one unloaded core (generation, check and shrinking), for the order
PER_INPUT_S = {"netyaml": 9.5e-3, "netyaml_raw": 9.3e-3, "netdict": 5.2e-3, "weights": 9.4e-3,
               "params_bin": 1.5e-3, "paths": 2.3e-3, "records": 15.5e-3, "params_c": 2.7e-3,
               "emit": 0.63}
MEMORY_LIMIT_GB = 8       # per process: an input that wants more fails with MemoryError


def run_target(name, args, out):
    """Run one target in this process; its summary dict (also written to <out>/<name>.json)."""
    import fuzz_targets as ft
    _limit_memory()
    t = ft.TARGETS[name]
    why = ft.available(t)
    if why:
        print(f"  {name}: skipped ({why})", flush=True)
        return _write(out, dict(target=name, inputs=0, seconds=0.0, cpu_seconds=0.0,
                                skipped=why, failures=[]))
    n = max(1, int(COUNTS[name] * args.scale)) if args.inputs is None else args.inputs
    inflight = out / f"{name}-inflight" if t.needs else None
    stats = ft.run(t, n, seed=args.seed + 7919 * list(ft.TARGETS).index(name),
                   inflight=inflight)
    if inflight is not None:
        Path(str(inflight) + t.suffix).unlink(missing_ok=True)
    fails = []
    for j, f in enumerate(stats.found, 1):
        path = t.save(f.input, out / f"{name}-{j}")
        (out / f"{name}-{j}.txt").write_text(
            f"target {name}: {f.sig[0]} at {f.sig[1]}\n{f.error}\n\ninput: "
            f"{ft.describe(f, 2000)}\n\n{f.traceback}")
        fails.append(dict(kind=f.sig[0], site=f.sig[1], error=f.error, hits=f.hits,
                          flaky=f.flaky, reproducer=str(path), input=ft.describe(f)))
    print(f"  {name}: {stats.inputs} inputs, {stats.seconds:.0f} s ({stats.cpu_seconds:.0f} s "
          f"CPU), {len(fails)} failures", flush=True)
    return _write(out, dict(target=name, inputs=stats.inputs, seconds=stats.seconds,
                            cpu_seconds=stats.cpu_seconds, failures=fails))


def _write(out, result):
    (out / f"{result['target']}.json").write_text(json.dumps(result) + "\n")
    return result


def _limit_memory():
    gb = MEMORY_LIMIT_GB * 1024 ** 3
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft > gb:
        resource.setrlimit(resource.RLIMIT_AS, (gb, hard))


def _child(name, args, out):
    try:
        run_target(name, args, out)
    except BaseException as e:
        traceback.print_exc()
        (out / f"{name}.error").write_text(traceback.format_exception_only(type(e), e)[-1])
        os._exit(3)


def run_all(names, args, out):
    """Each target in its own process, `args.jobs` at a time, the longest first. A process
    that dies (a crash in the C library, say) is reported as a failure of its target, with
    the input it was running when the target saves one."""
    import multiprocessing as mp
    import fuzz_targets as ft
    ctx = mp.get_context("fork")
    todo = sorted(names, key=lambda n: -COUNTS[n] * PER_INPUT_S[n])
    running, results = {}, []
    while todo or running:
        while todo and len(running) < max(1, args.jobs):
            name = todo.pop(0)
            p = ctx.Process(target=_child, args=(name, args, out))
            p.start()
            running[name] = p
        time.sleep(0.5)
        for name, p in list(running.items()):
            if p.is_alive():
                continue
            p.join()
            del running[name]
            res = out / f"{name}.json"
            if res.is_file():
                results.append(json.loads(res.read_text()))
                continue
            t = ft.TARGETS[name]
            inflight = Path(str(out / f"{name}-inflight") + t.suffix)
            err = out / f"{name}.error"
            if err.is_file():       # the harness itself failed (the target never ran)
                fail = dict(kind="target did not run", site="tools/fuzz.py", hits=0,
                            flaky=False, error=err.read_text().strip(), reproducer="",
                            input="none")
            else:                   # killed: a crash in the C library, the memory limit
                fail = dict(kind="process died", site=f"exit code {p.exitcode}", hits=1,
                            flaky=False, error=f"the {name} process ended with exit code "
                            f"{p.exitcode}", input="the input it was running" if
                            inflight.is_file() else "unknown",
                            reproducer=str(inflight) if inflight.is_file() else "")
            print(f"  {name}: {fail['kind']} ({fail['error']})", flush=True)
            results.append(dict(target=name, inputs=0, seconds=0.0, cpu_seconds=0.0,
                                failures=[fail]))
    return results


def replay(path):
    import fuzz_targets as ft
    name = Path(path).name.split("-")[0]
    t = ft.TARGETS.get(name)
    if t is None:
        sys.exit(f"{path}: the file name must start with a target name "
                 f"({', '.join(ft.TARGETS)}) and '-'")
    e = ft.replay(t, path)
    if e is None:
        print(f"{path}: passes the {name} oracle now")
        return 0
    traceback.print_exception(type(e), e, e.__traceback__)
    print(f"\n{path}: {ft.signature(e)}")
    return 1


def main(argv=None):
    import fuzz_targets as ft
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--targets", help=f"comma-separated, of: {', '.join(ft.TARGETS)}")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every target's count")
    p.add_argument("--inputs", type=int, help="inputs per target (instead of the counts)")
    p.add_argument("--seed", type=int, help="default: from the clock (printed)")
    p.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    p.add_argument("--out", default=str(ROOT / "build" / "fuzz"),
                   help="reproducers and summary.json (default build/fuzz)")
    p.add_argument("--replay", metavar="FILE", help="run one reproducer again")
    args = p.parse_args(argv)
    if args.replay:
        return replay(args.replay)
    names = args.targets.split(",") if args.targets else list(ft.TARGETS)
    unknown = [n for n in names if n not in ft.TARGETS]
    if unknown:
        p.error(f"unknown target(s) {', '.join(unknown)}; targets: {', '.join(ft.TARGETS)}")
    if args.seed is None:
        args.seed = int(time.time()) % 100_000
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*-*.*")) + list(out.glob("*.json")) + list(out.glob("*.error")):
        old.unlink()
    print(f"aotconv fuzz: seed {args.seed}, {len(names)} targets, {args.jobs} at a time, "
          f"reproducers in {out}", flush=True)
    t0 = time.monotonic()
    results = run_all(names, args, out)
    wall = time.monotonic() - t0
    results.sort(key=lambda r: names.index(r["target"]))
    (out / "summary.json").write_text(json.dumps(dict(seed=args.seed, wall_s=wall,
                                                      results=results), indent=1) + "\n")
    print(f"\n{'target':14s} {'inputs':>8s} {'seconds':>8s} {'CPU s':>8s} {'failures':>8s}")
    for r in results:
        extra = f"  (skipped: {r['skipped']})" if r.get("skipped") else ""
        print(f"{r['target']:14s} {r['inputs']:8d} {r['seconds']:8.0f} {r['cpu_seconds']:8.0f} "
              f"{len(r['failures']):8d}{extra}")
    total = sum(r["inputs"] for r in results)
    nfail = sum(len(r["failures"]) for r in results)
    cpu = sum(r["cpu_seconds"] for r in results)
    print(f"{'total':14s} {total:8d} {wall:8.0f} {cpu:8.0f} {nfail:8d}   "
          f"(seconds: wall of the whole run; seed {args.seed})")
    for r in results:
        for f in r["failures"]:
            print(f"\nFAIL {r['target']}: {f['kind']} at {f['site']} ({f['hits']} inputs"
                  f"{', flaky' if f['flaky'] else ''})\n  {f['error']}\n  input: {f['input']}"
                  f"\n  replay: .venv/bin/python tools/fuzz.py --replay {f['reproducer']}")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())

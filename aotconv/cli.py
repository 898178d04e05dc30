"""The `aotconv` command line: build, targets, networks (and space/tune/bench where present)."""
import argparse
import math
import os
import sys

# One BLAS thread per aotconv process unless the user says otherwise, set before numpy is
# imported: a tuning run's searches fit their cost models (numpy) beside a compile process per
# core, and OpenBLAS's default of a thread per core then spins on every core. ResNet-50 b1 from
# nothing, 400 trials, on a 32-core host with two H200s: 130.5 s with the default, 73.4 s with
# one thread (a Ray farm of both: 121.0 s and 67.0 s). docs/tuning.md, CPU threads.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from . import __version__
from .errors import AotconvError


def add_target_args(p):
    p.add_argument("--target", default="auto",
                   help="target profile (see `aotconv targets`), or auto for the device present")
    p.add_argument("--batch", metavar="N[,N...]",
                   help="override the network's batch size; increasing sizes (1,8,32) build "
                        "one library that runs any number of samples up to the largest "
                        "(docs/c-api.md, Batch sizes)")


# -- option values, checked before any work ---------------------------------------------------
# Checked by name, so every subcommand that has the option (build, run, tune, space, bench) gets
# the same check and the same one-line message, before a kernel is built or a device touched.

SEED_LIMIT = 2 ** 32           # numpy's seeds and the C side's are 32-bit


def _opt(name):
    return "--" + name.replace("_", "-")


def add_precision_option(p):
    p.add_argument("--precision", default="fp32", metavar="fp32|tf32|fp16",
                   help="what the kernels may compute in: fp32 (default), tf32 (FP32 storage; "
                        "TF32 tensor-core math with FP32 sums in the conv layers a tensor-core "
                        "variant serves, on NVIDIA GPUs of compute capability 8.0 or newer), fp16 "
                        "(weights and activations stored in half, FP32 math; docs/precision.md)")


def check_args(a):
    """Raise AotconvError (one line, naming the option) for any option value that is out of
    range, so that bad input fails before anything is built or measured."""
    if getattr(a, "precision", None) is not None:
        from .precision import check as check_precision
        check_precision(a.precision)
    seed = getattr(a, "seed", None)
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise AotconvError(f"--seed {seed}: give an integer from 0 to {SEED_LIMIT - 1}")
    if isinstance(getattr(a, "batch", None), str):      # build: one size or several
        from .batches import parse_sizes
        a.batch = parse_sizes(a.batch, "--batch")
    for name, low in (("batch", 1), ("jobs", 0), ("repeats", 1), ("warmup", 0),
                      ("verify_images", 0)):
        v = getattr(a, name, None)
        if isinstance(v, int) and v < low:
            what = "a positive integer" if low == 1 else "an integer >= 0"
            raise AotconvError(f"{_opt(name)} {v}: give {what}")
    for name, positive in (("max_measure_s", True), ("deadline", True),
                           ("verify_max_gflop", False)):
        v = getattr(a, name, None)
        if v is not None and not (math.isfinite(v) and (v > 0 if positive else v >= 0)):
            raise AotconvError(f"{_opt(name)} {v}: give a finite number "
                               f"{'> 0' if positive else '>= 0'}")
    for name in ("budget", "set_budget", "e2e_budget"):
        text = getattr(a, name, None)
        if text is not None:
            from .tune.search import parse_budget
            try:
                b = parse_budget(text)
            except AotconvError:
                raise AotconvError(f"{_opt(name)} '{text}': give a number of trials (200) or "
                                   f"a time (90s, 10m, 1.5h)") from None
            if not b.amount > 0 or not math.isfinite(b.amount):
                raise AotconvError(f"{_opt(name)} '{text}': the budget must be more than "
                                   f"zero trials or seconds")
    if getattr(a, "strategy", None) is not None:
        from .tune import strategies
        strategies.parse(a.strategy)
    check_farm(a)
    dbs = getattr(a, "tuning_db", None)
    if dbs is not None:
        from .tune.records import check_tuning_db
        for p in [dbs] if isinstance(dbs, str) else dbs:
            check_tuning_db(p)
    if getattr(a, "command", None) == "tune" and getattr(a, "layer", None):
        from .tune.cli import check_layer_names       # network layers and conversions
        check_layer_names(a)


def add_farm_options(p):
    p.add_argument("--ray", metavar="ADDRESS|local",
                   help="measure on a Ray tuning farm: every device of the target the cluster "
                        "at ADDRESS (or auto) offers, or `local`: a Ray on this machine "
                        "(docs/tuning.md, Tuning farm; pip install aotconv[farm])")
    p.add_argument("--ray-workers", type=int, metavar="N",
                   help="use N of the farm's devices (with --ray local: offer N workers)")
    p.add_argument("--lanes", type=int, metavar="N",
                   help="tune N layers at once (default: 2 per GPU, 1 per CPU device; "
                        "docs/tuning.md, Lanes)")


def check_farm(a):
    """--ray needs Ray installed; --ray-workers a positive count and --ray. The choice goes
    to BuildContext through AOTCONV_RAY / AOTCONV_RAY_WORKERS."""
    ray, workers = getattr(a, "ray", None), getattr(a, "ray_workers", None)
    lanes = getattr(a, "lanes", None)
    if lanes is not None and lanes < 1:
        raise AotconvError(f"--lanes {lanes}: give a positive integer")
    if lanes is not None:
        from .tune.search import LANES_ENV
        os.environ[LANES_ENV] = str(lanes)
    if workers is not None and workers < 1:
        raise AotconvError(f"--ray-workers {workers}: give a positive integer")
    if workers is not None and not ray:
        raise AotconvError("--ray-workers needs --ray ADDRESS (or --ray local)")
    if ray:
        from .tune.farm import require_ray
        require_ray()
        os.environ["AOTCONV_RAY"] = ray
        if workers is not None:
            os.environ["AOTCONV_RAY_WORKERS"] = str(workers)


def check_weights(a):
    """`build --weights FILE`: read and check the whole file against the network now, not
    after tuning."""
    from .params import from_npz
    from .spec import load_network
    from .compiler import _import_onnx
    batch = a.batch[0] if a.batch else None     # the parameters are those of every size
    im = _import_onnx(a.net, batch, a.input_shape)
    from_npz(im.network if im else load_network(a.net, batch=batch), a.weights)


def cmd_build(a):
    from .compiler import compile_network
    if a.weights:
        check_weights(a)
    mode = "fallback" if a.no_tune else ("records" if a.records_only else "tune")
    res = compile_network(a.net, target=a.target, outdir=a.output, batch=a.batch,
                          weights=a.weights, seed=a.seed, tune_mode=mode, budget=a.budget,
                          strategy=a.strategy, tuning_db=a.tuning_db,
                          require_tuned=a.require_tuned, check=a.check, quiet=a.quiet,
                          json_progress=a.json, jobs=a.jobs, input_shapes=a.input_shape,
                          binaries=not a.no_binaries, precision=a.precision,
                          recheck=a.recheck)
    if res.check_error is not None:
        from .precision import verdict
        ok, text = verdict(res.check_error, res.check_tolerance, res.check_spread)
        print(f"check against {res.check_reference}: {text}")
        if not ok:
            return 1
    if not a.quiet:
        print(f"{res.outdir}/report.md")
    return 0


def cmd_targets(a):
    from .targets import TARGETS, find_device
    for t in TARGETS.values():
        present = "present" if find_device(t) else "absent"
        print(f"{t.summary()}  [{present}]")
    return 0


def cmd_networks(a):
    from .spec import shipped_networks, load_network
    for name in shipped_networks():
        net = load_network(name)
        print(f"{name}: input {'x'.join(map(str, net.input_shape))}, {len(net.layers)} layers")
    return 0


def cmd_run(a):
    import numpy as np
    from .runtime import load
    with load(a.dir, profile=True) as net:     # it prints the kernels' times
        n = a.batch or net.batch_sizes[-1]
        rng = np.random.default_rng(a.seed)
        xs = [rng.standard_normal((n,) + tuple(s[1:])).astype(np.float32)
              for _, s in net.inputs]     # every input of the library, in order
        y = net(*xs)
        if len(xs) > 1:
            print("random inputs: " + ", ".join(f"{t} {'x'.join(map(str, x.shape))}"
                                               for (t, _), x in zip(net.inputs, xs)))
        ys = y if isinstance(y, list) else [y]
        if len(net.batch_sizes) > 1 or n != net.batch_sizes[-1]:
            print(f"{n} samples, run at batch size {net.serving(n)} (the library's: "
                  f"{', '.join(map(str, net.batch_sizes))})")
        for v in ys:
            flat = v.reshape(v.shape[0], -1)
            print(f"output {'x'.join(map(str, v.shape))}: mean {v.mean():.6f} std {v.std():.6f}; "
                  f"argmax of the first item {int(flat[0].argmax())}")
        prof = net.profile(batch=net.serving(n))
        print(f"{'kernel':40s} {'ms':>10s}")
        for k, ms in prof:
            print(f"{k:40s} {ms:10.4f}")
        print(f"{'total':40s} {sum(ms for _, ms in prof):10.4f}")
    return 0


def parser():
    p = argparse.ArgumentParser(prog="aotconv", description=__doc__)
    p.add_argument("--version", action="version", version=f"aotconv {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile a network into a tuned C library")
    b.add_argument("net", help="a net.yaml path, an .onnx model or the name of a shipped "
                   "network")
    add_target_args(b)
    b.add_argument("-o", "--output", help="output directory (default build/<net>)")
    b.add_argument("--input-shape", action="append", metavar="NAME=NxCxHxW",
                   help="an .onnx model's input shape where it has symbolic dims, once per "
                        "input (docs/onnx.md)")
    b.add_argument("--weights", help="an .npz with <layer>.<tensor> arrays (default: seeded random)")
    b.add_argument("--seed", type=int, default=0,
                   help=f"seed of the random weights (0 to {SEED_LIMIT - 1})")
    b.add_argument("--budget", help="tuning budget for the whole network: "
                   "trials (200) or time (10m)")
    b.add_argument("--strategy", help="search strategy (see `aotconv tune --help`)")
    b.add_argument("--tuning-db", help="an existing JSON-lines file of tuning records to use "
                   "(and to append to when tuning)")
    from .tune.cli import add_recheck_option
    add_recheck_option(b)
    b.add_argument("--no-tune", action="store_true", help="use every variant's fallback choice")
    b.add_argument("--records-only", action="store_true",
                   help="use recorded tuning results and fallbacks; measure nothing new")
    b.add_argument("--require-tuned", action="store_true",
                   help="fail instead of using a fallback for an untuned layer")
    b.add_argument("--check", action="store_true",
                   help="run the built library and compare with the float64 numpy reference "
                   "(with onnxruntime, where installed, for an .onnx model)")
    b.add_argument("--jobs", type=int, help="parallel kernel compiles while tuning")
    b.add_argument("--no-binaries", action="store_true", help="embed no device binaries: "
                   "create() compiles the OpenCL source (docs/c-api.md)")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    b.add_argument("--json", action="store_true", help="progress as JSON lines on stderr")
    add_precision_option(b)
    add_farm_options(b)
    b.set_defaults(func=cmd_build)

    r = sub.add_parser("run", help="run a built library on random input; print output and times")
    r.add_argument("dir")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--batch", type=int, metavar="N",
                   help="run N samples (1 to the library's largest batch size, the default): "
                        "the smallest batch size >= N runs")
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("targets", help="list target profiles and whether their device is present")
    t.set_defaults(func=cmd_targets)
    n = sub.add_parser("networks", help="list the shipped networks")
    n.set_defaults(func=cmd_networks)

    for mod in ("aotconv.tune.cli", "aotconv.bench.cli", "aotconv.onnx_import.cli"):
        try:
            m = __import__(mod, fromlist=["add_commands"])
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        m.add_commands(sub)
    if "tune" in sub.choices:
        add_farm_options(sub.choices["tune"])
    for name in ("tune", "space", "bench"):
        if name in sub.choices:
            add_precision_option(sub.choices[name])
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        check_args(args)
        return args.func(args) or 0
    except AotconvError as e:
        print(f"aotconv: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aotconv: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

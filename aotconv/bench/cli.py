"""`aotconv bench`: our tuned kernels and the emitted library against PyTorch (cuDNN / CPU) and
CLBlast's convgemm, timed in one process on the same data; JSON and a markdown table.

Per layer of the benchmark sets (aotconv.bench.sets): build the conv Layer, pick its kernel
(the tuner through `choose`, or with --no-tune the best of every registered variant's
fallback), time it with OpenCL profiling events (warm-up, median, buffers rotated so repeats
do not hit a warm cache), verify it against the float64 numpy reference on the first images of
the batch, then time the references on the same inputs and weights and verify them too
(aotconv.protocol, the rules every measurement follows). End to end: build the shipped
networks with `compile_network`, time the library's run() and its per-kernel profile against
a torch model of the same net.yaml (aotconv.torch_model). --precision tf32|fp16 (end to end
only): the library built in that precision against PyTorch in the same one (TF32 allowed, or
the model in half and channels_last), and checked against the float64 numpy reference its
--check uses (docs/precision.md). Derived figures and tables: aotconv.bench.report.
"""
import argparse
import sys

from .sets import SET_NAMES


def add_commands(sub):
    b = sub.add_parser(
        "bench", help="benchmark tuned kernels and built networks against PyTorch and CLBlast",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--target", default="auto", help="h100, pocl-cpu, ... or auto (the device "
                   "present)")
    b.add_argument("--sets", help=f"comma-separated: {', '.join(SET_NAMES)}, e2e (default all; "
                   f"with --precision tf32 or fp16, e2e alone: the per-layer sets are FP32)")
    b.add_argument("--layers", help="comma-separated globs on layer names (alex.conv*, "
                   "boda.0*)")
    b.add_argument("--budget", help="tuning budget per layer: trials (40) or time (30s)")
    b.add_argument("--set-budget", help="tuning budget per set, shared equally among its "
                   "layers (each counts once in the set's geometric mean)")
    b.add_argument("--e2e-budget", help="tuning budget per end-to-end network (default: the "
                   "tuner's)")
    b.add_argument("--strategy", help="tuner search strategy (see `aotconv tune --help`)")
    b.add_argument("--no-tune", action="store_true", help="no tuner: time every registered "
                   "variant's fallback for each layer and take the fastest correct one")
    b.add_argument("--records-only", action="store_true", help="no tuner: every layer and "
                   "network from the tuning records alone (shipped, cache), as `aotconv build "
                   "--records-only` builds it; fallbacks where none is recorded")
    b.add_argument("--refs", default="auto", help="auto (every one present), none, or "
                   "comma-separated from: torch, clblast")
    b.add_argument("--e2e", help="networks end to end as net:batch,... (default "
                   "vgg16:1,vgg16:16,alexnet:128,resnet50:1,resnet50:32,mobilenet_v2:1)")
    b.add_argument("--scale", help="cap every batch (layers and end to end), e.g. N=1 for the "
                   "2-core CPU; recorded in the JSON")
    b.add_argument("--repeats", type=int, help="timed repeats (default 30 on a GPU, 7 on a CPU)")
    b.add_argument("--warmup", type=int, help="untimed runs first (default 5 GPU, 2 CPU)")
    b.add_argument("--max-measure-s", type=float, help="seconds one kernel's timing may take: "
                   "fewer repeats (at least 3) for slow ones (default 3 on a GPU, 1.5 on a CPU)")
    b.add_argument("--verify-images", type=int, default=2, help="images of the batch checked "
                   "against the float64 reference (default 2)")
    b.add_argument("--verify-max-gflop", type=float, default=200.0, help="skip verification "
                   "when the reference of those images would cost more (default 200)")
    b.add_argument("--deadline", type=float, help="seconds: start nothing new after this, "
                   "write what was measured")
    b.add_argument("--jobs", type=int, help="parallel kernel compiles while tuning")
    b.add_argument("--torch-compile", default="reduce-overhead",
                   help="torch.compile modes timed end to end on a GPU beside eager and its "
                        "CUDA graph, comma-separated (reduce-overhead, max-autotune, default) or "
                        "none (default: reduce-overhead)")
    b.add_argument("--e2e-rounds", type=int, default=1,
                   help="on a GPU: after the first timing of each network, N - 1 more rounds "
                        "that time ours on the device-resident input and the best PyTorch way "
                        "alternately; the report gives each round's ratio and their median "
                        "(default 1)")
    b.add_argument("--ours-in-process", action="store_true",
                   help="time the end-to-end library in the bench's own process, beside PyTorch "
                        "(default: a process of its own, as an application runs it)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--workdir", default="build/bench", help="where end-to-end builds go")
    b.add_argument("--out", help="JSON path (default build/bench/bench-<target>-<date>.json)")
    b.add_argument("--md", help="markdown path (default: the JSON path with .md)")
    b.add_argument("--from-json", nargs="+", metavar="JSON", help="re-render (and merge) "
                   "earlier results; runs nothing")
    b.add_argument("--note", action="append", help="a sentence for the report's notes "
                   "(repeatable; with --from-json too)")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    b.set_defaults(func=_entry)


def _entry(a):
    # the run needs the compiler, the tuner and pyopencl: loaded when `aotconv bench` runs,
    # not each time the `aotconv` command line is built
    from .run import cmd_bench
    a.argv = _argv_after("bench")
    return cmd_bench(a)


def _argv_after(word):
    argv = sys.argv[1:]
    return argv[argv.index(word) + 1:] if word in argv else argv

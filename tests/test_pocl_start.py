"""A PoCL library's first inference compiles nothing (aotconv/binaries.py, warm_up): PoCL
compiles a kernel's work-group function at the kernel's first launch of each geometry, and its
program binary carries what its cache holds when the binary is read. The build launches every
distinct launch of the library once before reading it, so the embedded binary holds them.

The observable is PoCL's cache directory: create() from the binary unpacks the compiled code
into it, and a work-group function PoCL compiles later appears there as a new .so file. Each
build and each start runs in a process of its own with an empty POCL_CACHE_DIR: a build in a
process whose PoCL cache already holds the program's compiled launches would embed them without
any warm-up."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from aotconv import binaries
from aotconv.harness import close
from aotconv.schedule import Buffer, LaunchRow, Program

from app_helpers import reference

ROOT = Path(__file__).resolve().parents[1]

# a batchnorm at the input is not folded: its fold is a setup launch, made in load_params
NET = """\
name: warmnet
input: [2, 3, 10, 10]
layers:
  - {name: bn, op: batchnorm}
  - {name: c1, op: conv, out: 4, kernel: 3, act: relu}
  - {name: mp, op: maxpool, kernel: 2}
  - {name: fc, op: dense, out: 5}
"""

BUILD = """\
import json, sys
from aotconv import binaries
from aotconv.compiler import compile_network
if sys.argv[3] == "off":            # the build as it was: the binary read before any launch
    binaries.compiles_at_launch = lambda device: False
res = compile_network(sys.argv[1], target="pocl-cpu", outdir=sys.argv[2],
                      tune_mode="fallback", measure=False, quiet=True)
p = res.programs
print(json.dumps({"warmed": p.warmed, "note": p.note, "joined": p.joined,
                  "geometries": len({(l.program, l.kernel, l.gsize, l.lsize)
                                     for l in res.schedule.launches}),
                  "setup": sum(l.phase == "setup" for l in res.schedule.launches)}))
"""

START = """\
import json, os, sys
from pathlib import Path
import numpy as np
from aotconv.runtime import load
cache = Path(os.environ["POCL_CACHE_DIR"])
objects = lambda: sorted(str(p.relative_to(cache)) for p in cache.rglob("*.so"))
with load(sys.argv[1], params=False) as net:
    created = objects()
    net.load_params(net.dir / (net.name + ".params.bin"))
    x = np.random.default_rng(7).standard_normal(net.input_shape).astype(np.float32)
    y = net(x)
    after = objects()
    from_binary, why = net.program_source()
np.save(sys.argv[2], x)
np.save(sys.argv[3], y)
print(json.dumps({"created": created, "after": after, "from_binary": bool(from_binary),
                  "why": why}))
"""


def _python(script, args, cache):
    env = dict(os.environ, POCL_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    env.pop("POCL_KERNEL_CACHE", None)        # 0 would keep PoCL's files out of `cache`
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """{"on"|"off": (build's answer, first start's answer, x, y)}: warmnet built with the
    warm-up and without it, each started once, every process with an empty PoCL cache."""
    d = tmp_path_factory.mktemp("pocl-start")
    (d / "warmnet.yaml").write_text(NET)
    out = {}
    for mode in ("on", "off"):
        built = _python(BUILD, [d / "warmnet.yaml", d / mode, mode], d / f"cache-build-{mode}")
        start = _python(START, [d / mode, d / f"x-{mode}.npy", d / f"y-{mode}.npy"],
                        d / f"cache-start-{mode}")
        out[mode] = (built, start, np.load(d / f"x-{mode}.npy"), np.load(d / f"y-{mode}.npy"))
    out["source"] = d / "warmnet.yaml"
    return out


def test_the_first_run_of_a_pocl_library_compiles_no_work_group_function(started):
    built, start, x, y = started["on"]
    assert built["joined"] and built["setup"] >= 1
    assert built["warmed"] == built["geometries"]
    assert f"the work-group functions of the library's {built['geometries']} launch " \
           f"geometries compiled in" in built["note"]
    assert start["from_binary"], start["why"]
    assert start["created"], "create() unpacked no compiled code into PoCL's cache"
    compiled = sorted(set(start["after"]) - set(start["created"]))
    assert compiled == [], f"load_params and the first run() compiled {compiled}"
    assert close(y.ravel(), reference(SimpleNamespace(source=str(started["source"])), x))[0]


def test_without_the_warm_up_the_first_run_compiles_every_launch(started):
    """The observable above fails where the binary is read before any launch: PoCL compiles
    one work-group function per launch geometry in load_params and the first run()."""
    built, start, x, y = started["off"]
    assert built["warmed"] == 0 and "compiled in" not in built["note"]
    assert start["from_binary"], start["why"]
    compiled = set(start["after"]) - set(start["created"])
    assert len(compiled) == built["geometries"]
    assert np.array_equal(x, started["on"][2]) and np.array_equal(y, started["on"][3])


# -- the plan on PoCL, in this process ------------------------------------------------------

A = "__kernel void k_a(__global float *y) { y[0] = 1.0f; }\n"
B = "__kernel __attribute__((reqd_work_group_size(2, 1, 1))) void k_b(__global float *y) " \
    "{ y[get_global_id(0)] = 2.0f; }\n"


def _pocl_ctx():
    from aotconv.harness import context_for
    from aotconv.targets import get_target
    _, _, device = context_for(get_target("pocl-cpu"))
    return SimpleNamespace(present=True, found=(None, device),
                           profile=SimpleNamespace(name="pocl-cpu"))


def test_programs_one_per_layer_are_each_launched_on_their_own_program(monkeypatch):
    """Where the joined program does not build, each layer's program is launched with its
    own launches: a kernel looked up in another layer's program would fail the warm-up."""
    monkeypatch.setattr(binaries, "joined_source", lambda sources, sections: "not OpenCL C")
    rows = [_row(0, "k_a", (1,), (1,), args=[("buf", 0)]),
            _row(1, "k_b", (4,), (2,), args=[("buf", 0)])]
    said = []
    plan = binaries.plan([Program("a", "a", A), Program("b", "b", B)], _pocl_ctx(),
                         log=said.append, launches=rows, buffers=[Buffer("y", 16, "act")])
    assert not plan.joined and all(plan.blobs) and len(plan.blobs) == 2
    assert plan.warmed == 2, said
    assert "2 programs, one per layer" in plan.note
    assert "the work-group functions of the library's 2 launch geometries compiled in" \
        in plan.note


def test_a_launch_that_fails_at_build_time_costs_the_warm_up_not_the_binary():
    """A launch the device refuses (here a local size that does not divide the global one)
    is a warning: the binary is embedded without the compiled launches, the build goes on."""
    rows = [_row(0, "k_a", (1,), (1,), args=[("buf", 0)]),
            _row(1, "k_b", (5,), (2,), args=[("buf", 0)])]
    said = []
    plan = binaries.plan([Program("a", "a", A), Program("b", "b", B)], _pocl_ctx(),
                         log=said.append, launches=rows, buffers=[Buffer("y", 20, "act")])
    assert plan.joined and plan.has_binaries and plan.warmed == 0
    assert "compiled in" not in plan.note
    assert any(m.startswith("aotconv: warning: launching the kernels on ") and
               "kernel k_b: clEnqueueNDRangeKernel failed" in m and
               "the library's first run() compiles PoCL's work-group functions" in m
               for m in said), said


# -- device-free -----------------------------------------------------------------------------

def _row(program, kernel, gsize, lsize, phase="run", args=()):
    return LaunchRow("l", kernel, program, phase, list(args), gsize, lsize)


def test_geometries_are_distinct_launches_setup_first():
    rows = [_row(0, "k_a", (64,), (64,)),
            _row(0, "k_a", (64,), (64,), args=[("buf", 3)]),   # same code, other buffers
            _row(0, "k_a", (128,), (64,)),                      # another grid: its own code
            _row(1, "k_b", (8, 8, 1), ()),                      # no local size
            _row(0, "k_pack", (64,), (64,), phase="setup"),
            _row(2, "k_c", (4,), (4,))]                         # a program not built
    got = binaries.geometries(rows, {0: "p0", 1: "p1"})
    assert [(l.kernel, l.gsize, l.phase) for l in got] == [
        ("k_pack", (64,), "setup"), ("k_a", (64,), "run"), ("k_a", (128,), "run"),
        ("k_b", (8, 8, 1), "run")]


def test_only_pocl_compiles_at_launch():
    def dev(version, platform):
        return SimpleNamespace(version=version, platform=SimpleNamespace(name=platform))
    assert binaries.compiles_at_launch(
        dev("OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-skylake-avx512",
            "Portable Computing Language"))
    assert not binaries.compiles_at_launch(dev("OpenCL 3.0 CUDA", "NVIDIA CUDA"))
    assert not binaries.compiles_at_launch(dev("OpenCL 2.1 AMD-APP (3614.0)",
                                               "AMD Accelerated Parallel Processing"))

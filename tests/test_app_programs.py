"""How the emitted library makes its programs (aotconv/binaries.py, runtime_c/rt_program.c):
one joined program per network where verified, device binaries built at build time and used
by create() on the device and driver they were built for, the source otherwise; what the
library, the build log and report.md say about it; and the memory it reports."""
import dataclasses
import re

import numpy as np
import pytest

from aotconv import binaries
from aotconv.binaries import join_sections, joined_source, top_level_names
from aotconv.harness import close
from aotconv.report import staging_bytes
from aotconv.runtime import LibraryError, load

from app_helpers import TWO_OUTPUTS, build, library, reference


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    return library(tmp_path_factory, "lenet5")


# -- joining, device-free and on PoCL --------------------------------------------------------

A = """#define N 4
inline float leaky(float x, float a) { return x > 0.0f ? x : a * x; }
__kernel void k_a(__global float *y) { y[0] = leaky(N, 0.5f); }
"""
B = """// the same macro and helper names, other values
#define N 8
inline float leaky(float x, float a) { return a; }
__constant float t[2] = {1.0f, 2.0f};
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void k_b(__global float *y)
{
    y[0] = leaky(N, t[1]);
}
"""


def test_top_level_names_are_helpers_and_globals_not_kernels():
    assert top_level_names(A) == ["leaky"]
    assert top_level_names(B) == ["leaky", "t"]
    src = """static inline float4 f4(float4 v) { if (v.x > 0) { return v; } return -v; }
float proto(int);
typedef struct { int a; } pair_t;
__constant int z = 3;
kernel void k(__global float *y) { y[0] = proto(z); }
"""
    assert top_level_names(src) == ["f4", "proto", "pair_t", "z"]


def test_joined_sections_keep_each_layer_to_itself():
    sections = join_sections([A, B], ["a", "b"])
    (pro_a, epi_a), (pro_b, epi_b) = sections
    assert "#define leaky leaky__a" in pro_a and "#define leaky leaky__b" in pro_b
    assert "#define t t__b" in pro_b
    assert set(re.findall(r"#undef (\w+)", epi_a)) == {"N", "leaky"}
    assert set(re.findall(r"#undef (\w+)", epi_b)) == {"N", "leaky", "t"}


def test_joined_program_builds_and_each_kernel_sees_its_own_definitions():
    cl = pytest.importorskip("pyopencl")
    from aotconv.harness import context_for
    from aotconv.targets import get_target
    ctx, queue, _ = context_for(get_target("pocl-cpu"))
    with pytest.raises(cl.Error):     # concatenated as they are, the sources clash
        cl.Program(ctx, A + B).build()
    prog = cl.Program(ctx, joined_source([A, B], join_sections([A, B], ["a", "b"]))).build()
    y = np.zeros(1, np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
    for kernel, want in (("k_a", 4.0), ("k_b", 2.0)):
        getattr(prog, kernel)(queue, (1,), (1,), buf)
        cl.enqueue_copy(queue, y, buf)
        assert y[0] == want, kernel


# -- the library's programs ------------------------------------------------------------------

def test_create_uses_the_embedded_binary_and_agrees_with_the_source(lenet5):
    d = lenet5.dir
    h = (d / "lenet5.h").read_text()
    assert "#define AOTCONV_LENET5_EMBEDS_BINARIES 1" in h
    assert (d / "lenet5_binaries.h").is_file()
    c = (d / "lenet5.c").read_text()
    assert '#include "lenet5_binaries.h"' in c and "pro_0" in c     # joined, with binaries
    x = np.random.default_rng(1).standard_normal((100, 1, 32, 32)).astype(np.float32)
    with load(d) as fast, load(d, source_only=True) as slow:
        ok, why = fast.program_source()
        assert ok and "embedded device binary" in why
        ok, why = slow.program_source()
        assert not ok and why == "from source: options.source_only is set"
        y = fast(x)
        assert np.array_equal(y, slow(x))
        assert close(y.ravel(), reference(lenet5, x))[0]


def test_build_log_and_report_say_what_the_library_embeds(lenet5):
    assert re.search(r"aotconv: programs: one program for the network, with its device binary "
                     r"\(the driver.s binary, \d+ KiB\) for .+ \(driver .+\) beside the source", lenet5.log)
    report = (lenet5.dir / "report.md").read_text()
    assert "## Programs" in report and "with its device binary" in report


def test_a_binary_built_for_another_device_is_not_used(tmp_path, monkeypatch):
    plan = binaries.plan
    monkeypatch.setattr(binaries, "plan", lambda *a, **k: dataclasses.replace(
        plan(*a, **k), device="Another Device 9000"))
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    b = build(tmp_path / "twoout.yaml", tmp_path / "out")
    x = np.random.default_rng(2).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with load(b.dir) as lib:
        ok, why = lib.program_source()
        assert not ok
        assert why.startswith("from source: the embedded binaries were built for 'Another "
                              "Device 9000' (driver ")
        assert close(np.concatenate([o.ravel() for o in lib(x)]), reference(b, x))[0]


def test_a_binary_the_driver_rejects_falls_back_to_the_source(tmp_path, monkeypatch):
    """Programs one per layer, the first layer's binary garbage: that program comes from its
    source, the others from their binaries, and the library says so."""
    plan = binaries.plan

    def per_layer_first_broken(programs, ctx, **kw):
        p = plan(programs, ctx, **kw)
        import pyopencl as cl
        cctx = cl.Context([ctx.found[1]])
        blobs = [cl.Program(cctx, q.source).build(["-cl-mad-enable"]).binaries[0]
                 for q in programs]
        return dataclasses.replace(p, joined=False, blobs=(b"not a binary" * 8, *blobs[1:]))
    monkeypatch.setattr(binaries, "plan", per_layer_first_broken)
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    b = build(tmp_path / "twoout.yaml", tmp_path / "out")
    assert "pro_0" not in (b.dir / "twoout.c").read_text()
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with load(b.dir) as lib:
        ok, why = lib.program_source()
        assert not ok
        assert re.fullmatch(r"1 of 3 programs from source: the driver rejected the embedded "
                            r"binary of layer 'c1': clCreateProgramWithBinary: CL_INVALID_BINARY", why)
        assert close(np.concatenate([o.ravel() for o in lib(x)]), reference(b, x))[0]


def test_no_binaries_embeds_source_only(tmp_path):
    from aotconv.cli import main
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    out = tmp_path / "out"
    assert main(["build", str(tmp_path / "twoout.yaml"), "--target", "pocl-cpu", "--no-tune",
                 "--no-binaries", "--quiet", "-o", str(out)]) == 0
    assert "#define AOTCONV_TWOOUT_EMBEDS_BINARIES 0" in (out / "twoout.h").read_text()
    assert not (out / "twoout_binaries.h").exists()
    assert "device binaries off (--no-binaries)" in (out / "report.md").read_text()
    with load(out) as lib:
        ok, why = lib.program_source()
        assert not ok and "--no-binaries" in why


def test_a_build_for_an_absent_target_says_it_embeds_source_only(tmp_path_factory):
    b = library(tmp_path_factory, "lenet5-h100")
    said = ("the h100 device was not present at build time: the library embeds OpenCL source "
            "only")
    assert f"aotconv: programs: {said}" in b.log
    assert said in (b.dir / "report.md").read_text()
    assert "#define AOTCONV_LENET5_EMBEDS_BINARIES 0" in (b.dir / "lenet5.h").read_text()
    assert "pro_0" not in (b.dir / "lenet5.c").read_text()     # not verified: one per layer
    with pytest.raises(LibraryError, match=r"\[-2\].*no OpenCL device matches target 'h100'"):
        load(b.dir)


def test_a_device_that_cannot_build_the_programs_leaves_source_only(monkeypatch):
    """Binaries only speed create() up: a failure on the device at build time is a warning
    and a source-only plan, never a failed build."""
    import pyopencl as cl
    from types import SimpleNamespace
    from aotconv.schedule import Program

    def no_context(*a, **k):
        raise cl.RuntimeError("clCreateContext failed: OUT_OF_HOST_MEMORY")
    monkeypatch.setattr(cl, "Context", no_context)
    ctx = SimpleNamespace(present=True, found=(None, None), profile=SimpleNamespace(name="x1"))
    said = []
    plan = binaries.plan([Program("a", "a", A), Program("b", "b", B)], ctx, log=said.append)
    assert not plan.joined and not plan.has_binaries
    assert plan.note.startswith("building the programs on the device failed at build time "
                                "(RuntimeError: clCreateContext failed")
    assert said and said[0].startswith("aotconv: warning: building the programs on the x1 "
                                       "device failed")


# -- memory ----------------------------------------------------------------------------------

def test_memory_in_the_header_the_call_and_the_report(lenet5):
    sch = lenet5.res.schedule
    want = {"activation": sum(b.bytes for b in sch.buffers if b.kind == "act"),
            "parameter": sum(b.bytes for b in sch.buffers if b.kind == "param"),
            "variant": sum(b.bytes for b in sch.buffers if b.kind == "extra"),
            "scratch": sum(b.bytes for b in sch.buffers if b.kind == "scratch")}
    want["device"] = sum(want.values())
    assert want["activation"] == sch.act_bytes < sch.naive_act_bytes
    h = (lenet5.dir / "lenet5.h").read_text()
    for k, v in want.items():
        assert f"#define AOTCONV_LENET5_{k.upper()}_BYTES {v}u" in h
    io_bytes = 4 * (sch.input[1] + sch.output_count)
    with load(lenet5.dir) as lib:
        m = lib.memory()
        assert {k: m[f"{k}_bytes"] for k in want} == want
        assert m["pinned_bytes"] == staging_bytes(sch) == 4 * sch.input[1]   # < 4 MiB: 1 slot
        lib.host_buffers()
        assert lib.memory()["pinned_bytes"] == staging_bytes(sch) + io_bytes
    with load(lenet5.dir, stage_bytes=-1) as lib:
        assert lib.memory()["pinned_bytes"] == 0
    report = (lenet5.dir / "report.md").read_text()
    assert f"| **device total** | **{want['device']}** |" in report
    assert f"| activations | {want['activation']} |" in report


# -- several joined programs, each of a run of layers ------------------------------------------

def test_groups_are_runs_of_about_the_group_size_at_most_one_per_core(monkeypatch):
    monkeypatch.setitem(binaries.GROUP_BYTES, "gpu", 100)
    g = binaries.groups_for
    assert g([60, 60, 60, 60], "cpu") == [0, 0, 0, 0]         # a kind not listed: one program
    assert g([60, 60, 60, 60], "gpu", cores=8) == [0, 1, 1, 2]  # 240 bytes: 3 runs
    assert g([60, 60, 60, 60], "gpu", cores=2) == [0, 0, 1, 1]
    assert g([400, 10, 10, 10], "gpu", cores=8) == [0, 1, 1, 1]     # by bytes, none empty
    assert g([10] * 7, "gpu", cores=16) == [0] * 7                # 70 bytes: one program
    got = g([30] * 20, "gpu", cores=4)                            # 600 bytes, 4 cores: 4
    assert got == sorted(got) and set(got) == {0, 1, 2, 3}
    assert [got.count(k) for k in range(4)] == [5, 5, 5, 5]
    assert g([], "gpu") == []


def test_several_joined_programs_from_their_binaries_and_from_source(tmp_path, monkeypatch):
    """With a group size that splits the network, the build makes a few joined programs at once,
    each with its binary; create() makes them from the binaries, or each from its source, and
    both agree with the reference."""
    monkeypatch.setitem(binaries.GROUP_BYTES, "cpu", 1)      # as many as the cores allow
    monkeypatch.setattr(binaries.os, "cpu_count", lambda: 2)
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    b = build(tmp_path / "twoout.yaml", tmp_path / "out")
    assert b.res.programs.joined_count == 2 and len(b.res.programs.blobs) == 2
    c = (b.dir / "twoout.c").read_text()
    assert "The programs are made as 2 joined programs" in c and "pro_0" in c
    assert re.search(r"programs: 2 programs, each joining a run of layers, with their device "
                     r"binaries", b.log)
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with load(b.dir) as fast, load(b.dir, source_only=True) as slow:
        ok, why = fast.program_source()
        assert ok and why.startswith("from the embedded device binaries")
        assert not slow.program_source()[0]
        y = np.concatenate([o.ravel() for o in fast(x)])
        assert np.array_equal(y, np.concatenate([o.ravel() for o in slow(x)]))
        assert close(y, reference(b, x))[0]


def test_a_rejected_binary_of_one_joined_program_is_made_from_its_source(tmp_path, monkeypatch):
    monkeypatch.setitem(binaries.GROUP_BYTES, "cpu", 1)
    monkeypatch.setattr(binaries.os, "cpu_count", lambda: 2)
    plan = binaries.plan
    monkeypatch.setattr(binaries, "plan", lambda *a, **k: dataclasses.replace(
        p := plan(*a, **k), blobs=(p.blobs[0], b"not a binary" * 8)))
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    b = build(tmp_path / "twoout.yaml", tmp_path / "out")
    x = np.random.default_rng(6).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with load(b.dir) as lib:
        ok, why = lib.program_source()
        assert not ok
        assert re.fullmatch(r"1 of 2 programs from source: the driver rejected the embedded "
                            r"binary of joined program 2 of 2: clCreateProgramWithBinary: "
                            r"CL_INVALID_BINARY", why)
        assert close(np.concatenate([o.ravel() for o in lib(x)]), reference(b, x))[0]


def test_joined_programs_built_in_processes_of_their_own(tmp_path, monkeypatch):
    """Where the device compiles nothing at launch (a GPU), each joined program is built in a
    process of its own, all at once, and its binary embedded: the library makes its programs
    from them and agrees with the reference."""
    monkeypatch.setitem(binaries.GROUP_BYTES, "cpu", 1)
    monkeypatch.setattr(binaries.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(binaries, "compiles_at_launch", lambda device: False)
    calls = []
    elsewhere = binaries._built_elsewhere
    monkeypatch.setattr(binaries, "_built_elsewhere",
                        lambda target, texts: calls.append(len(texts)) or elsewhere(target, texts))
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    b = build(tmp_path / "twoout.yaml", tmp_path / "out")
    assert calls == [2] and b.res.programs.joined_count == 2
    assert all(b.res.programs.blobs)
    x = np.random.default_rng(7).standard_normal((2, 3, 9, 9)).astype(np.float32)
    with load(b.dir) as lib:
        ok, why = lib.program_source()
        assert ok and why.startswith("from the embedded device binaries"), why
        assert close(np.concatenate([o.ravel() for o in lib(x)]), reference(b, x))[0]
    # a program that does not build there: every program one per layer, as before
    monkeypatch.setattr(binaries, "_built_elsewhere", lambda target, texts: (None, "no device"))
    b = build(tmp_path / "twoout.yaml", tmp_path / "out2")
    assert b.res.programs.joined_count == 0
    assert "joined program does not build" in b.log and "(no device)" in b.log

"""One library for several batch sizes (`aotconv build --batch 1,8`, aotconv/batches.py): every
size compiled with its own kernels, run_n serving any n up to the largest through the smallest
size >= n (input padded with zeros, n outputs returned), the header's sizes, the error codes,
the shared buffers, --check and report.md per size, the CLI, and a C program calling run_n.
PoCL; lenet5 at sizes 1 and 8 and a small two-output network at sizes 2 and 5."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aotconv import batches, cli
from aotconv import params as params_mod
from aotconv import spec
from aotconv.compiler import between, compile_network
from aotconv.harness import close
from aotconv.reference import run_network
from aotconv.runtime import LibraryError, load

from app_helpers import TWO_OUTPUTS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    """lenet5 at batch sizes 1 and 8, fallback choices, measured and checked at build time."""
    d = tmp_path_factory.mktemp("ranged")
    res = compile_network("lenet5", target="pocl-cpu", outdir=d / "out", batch="1,8",
                          tune_mode="fallback", check=True, quiet=True)
    return res


@pytest.fixture(scope="module")
def twoout(tmp_path_factory):
    """Two outputs (a conv's and a dense's) at batch sizes 2 and 5, nothing measured."""
    d = tmp_path_factory.mktemp("ranged2")
    (d / "twoout.yaml").write_text(TWO_OUTPUTS)
    res = compile_network(str(d / "twoout.yaml"), target="pocl-cpu", outdir=d / "out",
                          batch=[2, 5], tune_mode="fallback", measure=False, quiet=True)
    return d / "twoout.yaml", res


def _reference(source, n, seed=0, x=None):
    """The float64 reference of `source` at batch n on `x` (random by default), with the
    build's parameters (seed 0): (x, [outputs])."""
    net = spec.load_network(str(source), batch=n)
    if x is None:
        x = np.random.default_rng(100 + n).standard_normal(net.input_shape).astype(np.float32)
    flat = params_mod.random_params(net, seed=seed)
    ref = run_network(net, x, params_mod.split(net, flat))
    return x, ref if isinstance(ref, list) else [ref]


def _raw(lib, call, *args):
    """A C call of `lib` with raw arguments: (code, message)."""
    rc = lib._f(call)(lib.handle, *args)
    return rc, lib.ffi.string(lib._f("last_error")(lib.handle)).decode()


# -- device-free: the option, the merge ----------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("8,1,8", r"^aotconv: error: --batch 8,1,8: give each batch size once, in increasing "
              r"order: --batch 1,8$"),
    ("8,1", r"--batch 8,1: .* --batch 1,8$"),
    ("0", r"--batch 0: give a positive integer \(8\) or increasing positive integers "
          r"separated by commas \(1,8,32\)$"),
    ("1,0", r"--batch 1,0: give a positive integer"),
    ("x", r"--batch x: give a positive integer"),
    ("1,,8", r"--batch 1,,8: give"),
    ("1;8", r"--batch 1;8: give"),
    ("\u00b2", r"--batch \\xb2: give"),
])
def test_bad_batch_lists_are_one_line_errors_before_any_work(text, want, capsys, monkeypatch):
    built = []
    monkeypatch.setattr("aotconv.compiler.compile_network", lambda *a, **k: built.append(a))
    assert cli.main(["build", "lenet5", "--target", "pocl-cpu", "--batch", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(want, err[0]), err
    assert built == []


def test_batch_lists_reach_the_build_as_sizes(monkeypatch):
    got = []

    class Result:
        check_error, outdir = None, Path("x")
    monkeypatch.setattr("aotconv.compiler.compile_network",
                        lambda *a, **k: got.append(k["batch"]) or Result())
    for text in ("8", "1,8,32", " 2, 3 "):
        assert cli.main(["build", "lenet5", "--target", "pocl-cpu", "--batch", text,
                         "--quiet"]) == 0
    assert got == [(8,), (1, 8, 32), (2, 3)]


def test_the_api_takes_ints_lists_and_text():
    assert batches.parse_sizes(None) is None
    assert batches.parse_sizes(4) == (4,)
    assert batches.parse_sizes([1, np.int64(8)]) == (1, 8)
    assert batches.parse_sizes("1,8") == (1, 8)
    for bad in ([], [8, 8], [True], 0, 1.5, "8,4"):
        with pytest.raises(batches.BatchError):
            batches.parse_sizes(bad, where="batch")


def test_between_picks_an_n_that_is_no_size():
    assert between([1, 8]) == (5, 8)
    assert between([1, 8, 32]) == (5, 8)
    assert between([4, 8]) == (2, 4)
    assert between([1, 2, 3]) == (None, None)
    assert between([2]) == (1, 2)


# branches, a concat, two outputs, batchnorms folded into a conv and a dense and one not
FOLDS = Path(__file__).resolve().parent / "sanitize" / "net.yaml"


def _schedule(batch, suffix=""):
    from aotconv.choose import fallback_choice
    from aotconv.ops import is_alias
    from aotconv.passes import optimise
    from aotconv.schedule import build_schedule
    from aotconv.targets import get_target
    net0 = spec.load_network(str(FOLDS), batch=batch)
    net = optimise(net0)
    tgt = get_target("h100")
    return build_schedule(net, {l.name: fallback_choice(l, tgt) for l in net.layers
                                if not is_alias(l)}, source=net0, file_suffix=suffix)


def test_one_size_merges_into_its_own_tables():
    """A single-size library is the schedule's tables unchanged (--batch N as it always was)."""
    sch = _schedule(2)
    assert sch.folds                                    # the folded weights are in the tables
    lib = batches.merge([(2, sch)])
    assert lib.buffers == sch.buffers and lib.params == sch.params and lib.folds == sch.folds
    assert lib.launches == sch.launches and lib.programs == sch.programs
    assert (lib.input, lib.outputs) == (sch.input, sch.outputs)
    assert not any(p.file.endswith("_b2") for p in lib.programs)


def test_sizes_share_activations_parameters_and_folds_not_variant_buffers():
    small, large = _schedule(1, "_b1"), _schedule(4, "_b4")
    lib = batches.merge([(1, small), (4, large)])
    kinds = lambda bs, k: [b for b in bs if b.kind == k]
    assert len(kinds(lib.buffers, "param")) == len(kinds(small.buffers, "param"))
    assert len(lib.params) == len(small.params) and len(lib.folds) == len(small.folds)
    acts = kinds(lib.buffers, "act")
    assert [b.bytes for b in acts] == [max(a.bytes, b.bytes) for a, b in
                                       zip(kinds(small.buffers, "act"), kinds(large.buffers, "act"))]
    extra = kinds(lib.buffers, "extra")
    assert len(extra) == len(kinds(small.buffers, "extra")) + len(kinds(large.buffers, "extra"))
    assert all(re.search(r" \(batch [14]\)$", b.name) for b in extra)
    # each size's launches read its own buffers through the library's indices
    z1, z4 = lib.sizes
    assert (z1.first_launch, z4.first_launch) == (0, len(small.launches))
    assert z4.first_run == len(small.run_launches)
    assert lib.programs[len(small.programs)].file.endswith("_b4")
    assert z1.input[0] == z4.input[0] or lib.buffers[z4.input[0]].kind == "act"


# -- the built library -----------------------------------------------------------------------------

def test_every_size_has_its_own_kernels_in_one_program(lenet5):
    out = lenet5.outdir
    files = sorted(p.stem for p in (out / "kernels").glob("*.cl"))
    assert files == sorted(f"{l}_b{b}" for l in ("c1", "s2", "c3", "s4", "f5", "f6", "prob")
                           for b in (1, 8))
    names = [l.kernel for l in lenet5.schedule.launches]
    assert len(names) == len(set(names)) == 14
    assert lenet5.programs.joined            # PoCL is present: one program holds both sizes
    with load(out) as lib:
        assert lib.program_source()[0]       # and its embedded binary is used
        assert lib.batch_sizes == [1, 8]
        assert [k.split("/")[1] for k in lib.kernel_names] == names


def test_the_header_states_the_sizes(lenet5):
    h = (lenet5.outdir / "lenet5.h").read_text()
    for line in ("#define AOTCONV_LENET5_BATCH_SIZES {1u, 8u}",
                 "#define AOTCONV_LENET5_BATCH_COUNT 2u", "#define AOTCONV_LENET5_BATCH_MAX 8u",
                 "#define AOTCONV_LENET5_INPUT_SAMPLE_COUNT 1024u",
                 "#define AOTCONV_LENET5_OUTPUT_SAMPLE_COUNT 10u",
                 "#define AOTCONV_LENET5_INPUT_COUNT 8192u",        # run(): the largest size
                 "#define AOTCONV_LENET5_OUTPUT_COUNT 80u",
                 "#define AOTCONV_LENET5_KERNEL_COUNTS {7u, 7u}",
                 "#define AOTCONV_LENET5_KERNEL_COUNT 14u"):
        assert line in h, line
    assert "aotconv_lenet5_run_n(aotconv_lenet5 *net, size_t n," in h
    with load(lenet5.outdir) as lib:
        p = lib.ffi.new("const size_t **")
        assert lib._f("batch_sizes")(p) == 2 and list(p[0][0:2]) == [1, 8]
        assert lib._f("batch_sizes")(lib.ffi.NULL) == 2


@pytest.mark.parametrize("n", [1, 8, 5, 2, 7])
def test_any_n_matches_the_reference_on_its_samples(lenet5, n):
    x, (ref,) = _reference("lenet5", n)
    with load(lenet5.outdir) as lib:
        got = lib(x)
        assert got.shape == (n, 10, 1, 1)
        assert close(got, ref)[0]


def test_run_is_the_largest_size_and_n_samples_ignore_the_rest(lenet5):
    x, (ref,) = _reference("lenet5", 8)
    with load(lenet5.outdir) as lib:
        full = lib(x)                                    # run(): 8 samples
        assert np.array_equal(full, lib(x[:8].copy()))
        assert close(full, ref)[0]
        # 5 samples after a run of 8 others: the stale samples 6-8 of the input buffer are
        # not theirs (padded with zeros), and each of the 5 is its own
        y = np.random.default_rng(9).standard_normal((8, 1, 32, 32)).astype(np.float32) * 50
        lib(y)
        assert np.array_equal(lib(x[:5]), full[:5])
        assert np.array_equal(lib(x[:1]), lib(x[:1]))


def test_n_out_of_range_and_wrong_counts_are_error_codes(lenet5):
    with load(lenet5.outdir) as lib:
        x = np.zeros(9 * 1024, np.float32)
        y = np.zeros(9 * 10, np.float32)
        fx, fy = lib.ffi.from_buffer("float[]", x), lib.ffi.from_buffer("float[]", y)
        for call in ("run_n", "run_async_n"):
            rc, msg = _raw(lib, call, 0, fx, 0, fy, 0)
            assert rc == -1 and re.search(rf"lenet5_{call}: n is 0; give 1 to 8 samples \(the "
                                          r"library's batch sizes: 1, 8\)", msg), msg
            rc, msg = _raw(lib, call, 9, fx, 9 * 1024, fy, 90)
            assert rc == -1 and f"lenet5_{call}: n is 9; give 1 to 8 samples" in msg, msg
            rc, msg = _raw(lib, call, 5, fx, 4 * 1024, fy, 50)
            assert rc == -1 and "input has 4096 floats, expected 5120 (5 samples of 1024)" in msg
            rc, msg = _raw(lib, call, 5, fx, 5 * 1024, fy, 80)
            assert rc == -1 and "output has room for 80 floats, expected 50 (5 samples of 10)" \
                in msg
        rc, msg = _raw(lib, "run_buffers_n", 0, lib.ffi.NULL, lib.ffi.NULL)
        assert rc == -1 and "lenet5_run_buffers_n: n is 0" in msg
        assert lib._f("run_n")(lib.ffi.NULL, 1, fx, 1024, fy, 10) == -1
        # through Python: the C message, as a LibraryError
        with pytest.raises(LibraryError, match=r"\[-1\].*n is 9; give 1 to 8"):
            lib(np.zeros((9, 1, 32, 32), np.float32))
        with pytest.raises(LibraryError, match=r"\[-1\].*n is 0"):
            lib(np.zeros((0, 1, 32, 32), np.float32))
        # the handle still works after the refusals
        x5, (ref,) = _reference("lenet5", 5)
        assert close(lib(x5), ref)[0]


def test_profile_holds_every_size_nan_until_it_ran(lenet5):
    with load(lenet5.outdir, profile=True) as lib:
        x, _ = _reference("lenet5", 3)
        lib(x)                                            # size 8 runs 3 samples
        prof = lib.profile()
        assert len(prof) == 14
        first, second = prof[:7], prof[7:]
        assert all(np.isnan(ms) for _, ms in first)     # size 1 never ran
        assert all(np.isfinite(ms) and ms >= 0 for _, ms in second)
        assert [k for k, _ in lib.profile(batch=8)] == [k for k, _ in second]
        lib(x[:1])
        assert all(np.isfinite(ms) for _, ms in lib.profile())
        with pytest.raises(Exception, match="batch size 4 is not one of the library's"):
            lib.profile(batch=4)


def test_async_and_pinned_runs_take_n(lenet5):
    x, (ref,) = _reference("lenet5", 6)
    with load(lenet5.outdir) as lib:
        lib.run_async(x)
        lib.run_async(x[:2])
        assert np.array_equal(lib.wait(), lib(x[:2]))
        lib.run_async(x)
        got = lib.wait()
        assert got.shape == (6, 10, 1, 1) and close(got, ref)[0]
        xin, _ = lib.host_buffers()
        xin[:6] = x
        assert np.array_equal(lib.run_host(n=6), got.ravel())


def test_buffers_are_shared_by_the_sizes(lenet5):
    """Activations and parameters once for the library, not once per size."""
    sch = lenet5.schedule
    own = [z.schedule for z in lenet5.sizes]
    with load(lenet5.outdir) as lib:
        mem = lib.memory()
    h = (lenet5.outdir / "lenet5.h").read_text()
    assert f"#define AOTCONV_LENET5_DEVICE_BYTES {mem['device_bytes']}u" in h
    # parameters: one copy, as in a library of one size
    assert mem["parameter_bytes"] == sum(b.bytes for b in own[0].buffers if b.kind == "param")
    # activations: buffer i of the library is the larger of the sizes' buffer i
    acts = [[b.bytes for b in s.buffers if b.kind == "act"] for s in own]
    assert mem["activation_bytes"] == sum(max(a[i] if i < len(a) else 0 for a in acts)
                                          for i in range(max(map(len, acts))))
    assert mem["activation_bytes"] < sum(sum(a) for a in acts)
    assert mem["device_bytes"] < batches.unshared_bytes(sch)


def test_check_and_report_cover_every_size(lenet5):
    assert lenet5.check_n == 5
    assert lenet5.check_error is not None and lenet5.check_error <= 1e-3
    for z in lenet5.sizes:
        assert z.check_error <= 1e-3
        assert len(z.profile) == 7 and all(np.isfinite(ms) for _, ms in z.profile)
    report = (lenet5.outdir / "report.md").read_text()
    assert "Batch sizes **1, 8** in one library" in report
    assert ("checked against the float64 numpy reference at every size and n = 5 (between two "
            "sizes)") in report
    for z in lenet5.sizes:
        total = sum(ms for _, ms in z.profile)
        assert re.search(rf"^\| {z.batch} \| 7 \| {total:.4f} \|", report, re.M), z.batch
        assert f"## Batch {z.batch}\n" in report
        assert f"| c1 | conv (tanh) | {z.batch}x1x32x32 | {z.batch}x6x28x28 |" in report
    assert "shared by the batch sizes" in report
    meta = json.loads((lenet5.outdir / "tuning.json").read_text())
    assert [(s["batch"], s["first_kernel"], s["kernels"]) for s in meta["batch_sizes"]] == [
        (1, 0, 7), (8, 7, 7)]
    assert meta["input_shape"] == [8, 1, 32, 32]
    assert meta["batch_sizes"][0]["input_shape"] == [1, 1, 32, 32]


def test_two_outputs_return_n_samples_each(twoout):
    src, res = twoout
    assert [z.batch for z in res.sizes] == [2, 5]
    with load(res.outdir) as lib:
        for n in (1, 2, 3, 5):
            x, refs = _reference(src, n)
            got = lib(x)
            assert [g.shape for g in got] == [(n, 4, 7, 7), (n, 5, 1, 1)]
            for g, r in zip(got, refs):
                assert close(g, r)[0], n


def test_run_buffers_n_on_the_applications_queue(twoout):
    cl = pytest.importorskip("pyopencl")
    from aotconv.targets import find_device, get_target
    dev = find_device(get_target("pocl-cpu"))[1]
    q = cl.CommandQueue(cl.Context([dev]), dev)
    src, res = twoout
    x, refs = _reference(src, 3)
    mf = cl.mem_flags
    with load(res.outdir, queue=q) as lib:
        din = cl.Buffer(q.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        want = np.concatenate([r.ravel() for r in refs]).astype(np.float32)
        dout = cl.Buffer(q.context, mf.READ_WRITE, want.nbytes)
        lib.run_buffers(din, dout, n=3)
        got = np.empty_like(want)
        cl.enqueue_copy(q, got, dout)
        assert close(got, want)[0]
        small = cl.Buffer(q.context, mf.READ_WRITE, want.nbytes - 4)
        with pytest.raises(LibraryError, match=r"\[-1\].*run_buffers_n: output holds"):
            lib.run_buffers(din, small, n=3)
        lib.wait()


def test_a_single_size_library_takes_n_too(tmp_path):
    """run_n in a library of one size: any n up to it, padded."""
    (tmp_path / "t.yaml").write_text(TWO_OUTPUTS)
    res = compile_network(str(tmp_path / "t.yaml"), target="pocl-cpu", outdir=tmp_path / "o",
                          batch=3, tune_mode="fallback", measure=False, quiet=True)
    assert res.sizes is None
    assert not any(p.file.endswith("_b3") for p in res.schedule.programs)
    h = (tmp_path / "o" / "twoout.h").read_text()
    assert "#define AOTCONV_TWOOUT_BATCH_SIZES {3u}" in h
    with load(res.outdir) as lib:
        assert lib.batch_sizes == [3]
        x, refs = _reference(tmp_path / "t.yaml", 2)
        for g, r in zip(lib(x), refs):
            assert close(g, r)[0]


def test_aotconv_run_takes_n(lenet5, capsys):
    assert cli.main(["run", str(lenet5.outdir), "--batch", "5"]) == 0
    out = capsys.readouterr().out
    assert "5 samples, run at batch size 8 (the library's: 1, 8)" in out
    assert "output 5x10x1x1:" in out
    assert len(re.findall(r"_b8 ", out)) == 7 and "_b1 " not in out
    assert cli.main(["run", str(lenet5.outdir), "--batch", "9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n is 9; give 1 to 8 samples" in err[0]


@pytest.mark.skipif(not shutil.which("pkg-config"), reason="pkg-config is not installed")
def test_a_c_program_runs_n_images(lenet5, tmp_path):
    d = lenet5.outdir
    env = dict(os.environ, PKG_CONFIG_PATH=str(d))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "lenet5"], capture_output=True,
                           text=True, env=env, check=True).stdout.split()
    exe = tmp_path / "classify_n"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                    str(EXAMPLES / "c/classify_n.c"), *flags, f"-Wl,-rpath,{d}", "-o", str(exe)],
                   check=True)
    x, (ref,) = _reference("lenet5", 3)
    x.tofile(tmp_path / "in.bin")
    p = subprocess.run([str(exe), str(d / "lenet5.params.bin"), str(tmp_path / "in.bin"), "3",
                        str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("batch sizes: 1 8 (at most 8 images a call)\n")
    assert p.stdout.count("image ") == 3
    assert close(np.fromfile(tmp_path / "out.bin", np.float32), ref.ravel())[0]
    p = subprocess.run([str(exe), str(d / "lenet5.params.bin"), str(tmp_path / "in.bin"), "0",
                        str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "run_n failed (-1): lenet5_run_n: n is 0" in p.stderr


def test_a_time_budget_is_shared_by_the_sizes(tmp_path, monkeypatch):
    """Each size's searches get an equal part of what the build's clock has left, the library
    build of the sizes before it kept; the build's own clock is back afterwards."""
    from aotconv import compiler
    from aotconv.tune.search import Clock
    seen, real = [], compiler._schedule

    def spy(ctx, u, job, quiet):
        seen.append((u.batch, ctx.budget))
        return real(ctx, u, job, quiet)
    monkeypatch.setattr(compiler, "_schedule", spy)
    compile_network("lenet5", target="pocl-cpu", outdir=tmp_path / "o", batch=[1, 2, 8],
                    tune_mode="fallback", budget="90s", measure=False, quiet=True)
    assert [b for b, _ in seen] == [1, 2, 8]
    clocks = [c for _, c in seen]
    assert all(isinstance(c, Clock) for c in clocks)
    parts = [c.budget.amount for c in clocks]
    kept = 7 * clocks[0].build_s()                   # one size's kernels, built in the library
    assert 25 < parts[0] <= 30                       # a third of 90 s
    assert (80 - kept) / 2 < parts[1] <= (90 - kept) / 2      # half of what is left
    assert 70 - 2 * kept < parts[2] <= 90 - 2 * kept          # the rest
    assert clocks[0].pace is clocks[2].pace          # what one measurement costs carries over


def test_an_onnx_model_with_a_symbolic_batch_is_checked_at_every_size(tmp_path):
    """--check of an .onnx model against onnxruntime, at each size and at an n between."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx_helpers import model, node, rand, save
    m = model([node("Conv", ["x", "w", "b"], ["c"], name="/conv", pads=[1, 1, 1, 1]),
               node("Relu", ["c"], ["y"], name="/relu")], ["N", 3, 6, 6],
              inits={"w": rand(4, 3, 3, 3, scale=0.3), "b": rand(4, scale=0.1)})
    path = save(m, tmp_path / "m.onnx")
    res = compile_network(path, target="pocl-cpu", outdir=tmp_path / "o", batch=[1, 4],
                          tune_mode="fallback", check=True, quiet=True)
    assert res.check_reference == "onnxruntime"
    assert res.check_n == 3 and res.check_error <= 1e-3
    assert [z.batch for z in res.sizes] == [1, 4] and all(z.check_error <= 1e-3 for z in res.sizes)
    assert "checked against onnxruntime at every size and n = 3" in (
        tmp_path / "o" / "report.md").read_text()

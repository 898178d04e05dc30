"""The emitted library on PoCL: built with ninja, loaded with cffi, linked into a C program,
compared with the float64 numpy reference, and its error paths."""
import subprocess

import numpy as np
import pytest

from aotconv import params as params_mod
from aotconv import spec
from aotconv.compiler import compile_network
from aotconv.harness import close
from aotconv.reference import run_network
from aotconv.runtime import load, LibraryError

# A small network over most ops, with odd sizes, a fused and an unfusable activation, two
# branches joined by concat and add, an alias (flatten) and two outputs.
SMALL = """\
name: small
input: [2, 3, 11, 13]
outputs: [prob, side]
layers:
  - {name: c1, op: conv, out: 5, kernel: [3, 2], stride: [2, 1], pad: [1, 0]}
  - {name: r1, op: relu}
  - {name: b1, op: conv, out: 4, kernel: 1, inputs: [r1], act: tanh}
  - {name: b2, op: conv, out: 6, kernel: 3, pad: same, dilation: 2, inputs: [r1]}
  - {name: cat, op: concat, inputs: [b1, b2]}
  - {name: bn, op: batchnorm, act: leaky_relu, alpha: 0.1}
  - {name: lrn, op: lrn, size: 3}
  - {name: mp, op: maxpool, kernel: 3, stride: 2, ceil_mode: true}
  - {name: side, op: avgpool, kernel: 2, inputs: [cat], count_include_pad: true, pad: 1}
  - {name: dw, op: conv, out: 10, kernel: 3, pad: 1, groups: 10, inputs: [mp], bias: false}
  - {name: sum, op: add, inputs: [mp, dw]}
  - {name: sig, op: sigmoid}
  - {name: gap, op: global_avgpool}
  - {name: th, op: tanh}
  - {name: fl, op: flatten}
  - {name: fc, op: dense, out: 7}
  - {name: drop, op: dropout}
  - {name: prob, op: softmax}
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    src = d / "small.yaml"
    src.write_text(SMALL)
    res = compile_network(str(src), target="pocl-cpu", outdir=d / "out", tune_mode="fallback",
                          measure=False, quiet=True)
    return src, res


def _reference(src, seed=3):
    net = spec.load_network(str(src))
    flat = params_mod.random_params(net, seed=seed)
    x = np.random.default_rng(seed).standard_normal(net.input_shape).astype(np.float32)
    ref = run_network(net, x, params_mod.split(net, flat))
    return net, flat, x, ref if isinstance(ref, list) else [ref]


def test_emitted_files(small):
    _, res = small
    out = res.outdir
    for f in ("small.c", "small.h", "build.ninja", "libsmall.so", "libsmall.a", "small.pc",
              "small.params.bin", "tuning.json", "report.md"):
        assert (out / f).is_file(), f
    kernels = sorted(p.stem for p in (out / "kernels").glob("*.cl"))
    # r1 fused into c1 and sig into sum; flatten and dropout are aliases; th follows a pool
    assert "r1" not in kernels and "sig" not in kernels
    assert "fl" not in kernels and "drop" not in kernels
    assert "c1" in kernels and "th" in kernels
    c1 = (out / "kernels" / "c1.cl").read_text()
    assert "fmax(" in c1                      # the fused relu is in the conv's epilogue
    h = (out / "small.h").read_text()
    assert "#define AOTCONV_SMALL_INPUT_COUNT 858u" in h
    assert f"#define AOTCONV_SMALL_PARAM_COUNT {res.net.param_count()}u" in h
    # the device (PoCL) is here, but this build was asked not to run the library
    report = (out / "report.md").read_text()
    assert "built without running it" in report and "not present" not in report


def test_library_matches_reference(small):
    src, res = small
    net, flat, x, refs = _reference(src)
    with load(res.outdir, profile=True) as lib:
        lib.set_params(flat)
        outs = lib(x)
        assert [o.shape for o in outs] == [r.shape for r in refs]
        for o, r in zip(outs, refs):
            ok, err = close(o, r)
            assert ok, err
        # a second input through the same handle: nothing stale survives between runs
        x2 = np.random.default_rng(99).standard_normal(net.input_shape).astype(np.float32)
        ref2 = run_network(net, x2, params_mod.split(net, flat))
        for o, r in zip(lib(x2), ref2):
            assert close(o, r)[0]
        prof = lib.profile()
        assert len(prof) == len(res.schedule.run_launches)
        assert all(ms > 0 for _, ms in prof)


def test_run_from_the_pinned_host_buffers(small):
    src, res = small
    net, flat, x, refs = _reference(src, seed=5)
    with load(res.outdir) as lib:
        lib.set_params(flat)
        want = np.concatenate([o.ravel() for o in lib(x)])
        xin, xout = lib.host_buffers()
        assert xin.shape == tuple(net.input_shape) and xout.size == want.size
        xin[...] = x
        got = lib.run_host()
        assert got is xout and np.array_equal(got, want)
        assert close(got, np.concatenate([r.ravel() for r in refs]))[0]
        # the same memory on the next call; a new input through it gives the new output
        xin2, _ = lib.host_buffers()
        assert np.shares_memory(xin2, xin)
        x2 = np.random.default_rng(8).standard_normal(net.input_shape).astype(np.float32)
        xin[...] = x2
        assert np.array_equal(lib.run_host(), np.concatenate([o.ravel() for o in lib(x2)]))


def test_liveness_reuses_buffers(small):
    _, res = small
    sch = res.schedule
    assert sch.act_bytes < sch.naive_act_bytes
    # no layer writes a buffer it reads
    for l in sch.launches:
        if l.phase != "run":
            continue
        out = sch.tensor_buffer[l.layer]
        layer = res.net.layer(l.layer)
        assert all(sch.tensor_buffer[t] != out for t in layer.inputs)


C_APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "small.h"
int main(int argc, char **argv) {
    static float in[AOTCONV_SMALL_INPUT_COUNT], out[AOTCONV_SMALL_OUTPUT_COUNT];
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(in, sizeof(float), AOTCONV_SMALL_INPUT_COUNT, f) != AOTCONV_SMALL_INPUT_COUNT)
        return 10;
    fclose(f);
    aotconv_small *net = NULL;
    int rc = aotconv_small_create(&net, NULL);
    if (rc) { fprintf(stderr, "create: %d %s\n", rc, aotconv_small_last_error(NULL)); return 11; }
    if ((rc = aotconv_small_load_params(net, argv[2]))) {
        fprintf(stderr, "load: %s\n", aotconv_small_last_error(net)); return 12; }
    if ((rc = aotconv_small_run(net, in, AOTCONV_SMALL_INPUT_COUNT, out, AOTCONV_SMALL_OUTPUT_COUNT))) {
        fprintf(stderr, "run: %s\n", aotconv_small_last_error(net)); return 13; }
    /* the same run from the library's pinned host buffers gives the same output */
    float *pin = NULL, *pout = NULL, *pin2 = NULL;
    if (aotconv_small_host_buffers(net, &pin, &pout) || !pin || !pout) {
        fprintf(stderr, "host_buffers: %s\n", aotconv_small_last_error(net)); return 17; }
    memcpy(pin, in, sizeof in);
    if ((rc = aotconv_small_run(net, pin, AOTCONV_SMALL_INPUT_COUNT, pout, AOTCONV_SMALL_OUTPUT_COUNT))) {
        fprintf(stderr, "run pinned: %s\n", aotconv_small_last_error(net)); return 18; }
    if (memcmp(pout, out, sizeof out) != 0) return 19;
    if (aotconv_small_host_buffers(net, &pin2, NULL) || pin2 != pin) return 20;
    if (aotconv_small_host_buffers(net, NULL, NULL) != AOTCONV_SMALL_ERR_ARGUMENT) return 21;
    if (aotconv_small_host_buffers(NULL, &pin, &pout) != AOTCONV_SMALL_ERR_ARGUMENT) return 22;
    /* the error paths an app meets: each returns a code and a message, nothing aborts */
    if (aotconv_small_run(net, NULL, 1, out, 1) != AOTCONV_SMALL_ERR_ARGUMENT) return 14;
    if (aotconv_small_run(NULL, in, 1, out, 1) != AOTCONV_SMALL_ERR_ARGUMENT) return 15;
    if (aotconv_small_set_params(net, in, 3) != AOTCONV_SMALL_ERR_ARGUMENT) return 16;
    aotconv_small_destroy(net);
    aotconv_small_destroy(NULL);
    f = fopen(argv[3], "wb");
    fwrite(out, sizeof(float), AOTCONV_SMALL_OUTPUT_COUNT, f);
    fclose(f);
    return 0;
}
"""


def test_static_library_in_a_c_program(small, tmp_path):
    src, res = small
    net, flat, x, refs = _reference(src, seed=0)   # build wrote params with seed 0
    (tmp_path / "app.c").write_text(C_APP)
    exe = tmp_path / "app"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(res.outdir), str(tmp_path / "app.c"),
                    str(res.outdir / "libsmall.a"), "-lOpenCL", "-o", str(exe)], check=True)
    x.tofile(tmp_path / "in.bin")
    p = subprocess.run([str(exe), str(tmp_path / "in.bin"), str(res.outdir / "small.params.bin"),
                        str(tmp_path / "out.bin")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""                      # the library prints nothing
    out = np.fromfile(tmp_path / "out.bin", np.float32)
    ref = np.concatenate([r.ravel() for r in refs])
    assert close(out, ref)[0]


def test_c_errors_name_what_went_wrong(small, tmp_path):
    _, res = small
    lib = load(res.outdir, params=False, profile=True)
    x = np.ones(lib.input_shape, np.float32)
    with pytest.raises(LibraryError, match=r"\[-7\].*parameters are not set"):
        lib(x)
    with pytest.raises(LibraryError, match=r"\[-1\].*got 3 floats, the network has"):
        lib.set_params(np.ones(3, np.float32))
    bad = tmp_path / "short.bin"
    np.ones(5, np.float32).tofile(bad)
    with pytest.raises(LibraryError, match=r"\[-6\].*short.bin' holds 5 floats"):
        lib.load_params(bad)
    with pytest.raises(LibraryError, match=r"\[-6\].*cannot open"):
        lib.load_params(tmp_path / "missing.bin")
    lib.load_params(res.outdir / "small.params.bin")
    with pytest.raises(LibraryError, match=r"\[-1\].*input has 5 floats, expected 858"):
        lib(np.ones(5, np.float32))
    with pytest.raises(LibraryError, match=r"\[-7\].*no completed run"):
        lib.profile()
    lib.close()


def test_create_without_matching_device(small):
    _, res = small
    with pytest.raises(LibraryError, match=r"\[-2\].*no OpenCL device matches 'no-such-gpu'"):
        load(res.outdir, device_name="no-such-gpu")


def test_kernel_build_failure_names_the_layer(tmp_path, monkeypatch):
    from aotconv.variants.eltwise import Eltwise
    orig = Eltwise.render
    monkeypatch.setattr(Eltwise, "render",
                        lambda self, layer, cfg, prefix: orig(self, layer, cfg, prefix)
                        .replace("const float s = x[i];", "const float s = x[i] +;"))
    src = tmp_path / "t.yaml"
    src.write_text("name: broken\ninput: [1, 2, 3, 3]\nlayers:\n  - {name: act1, op: sigmoid}\n")
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="fallback", measure=False, quiet=True)
    with pytest.raises(LibraryError, match=r"\[-3\].*layer 'act1'.*CL_BUILD_PROGRAM_FAILURE"):
        load(res.outdir)

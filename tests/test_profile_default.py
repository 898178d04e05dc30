"""Per-kernel profiling is opt-in (runtime_c/rt_net.c, templates/c/net.c.mako): create() with
opts NULL makes a queue without CL_QUEUE_PROFILING_ENABLE, whose profile() is -7 saying to
create with options.profile = 1; options.profile = 1 gives the kernel times. The Python
loader mirrors it: load() without profiling, load(profile=True) with. On PoCL."""
import math

import numpy as np
import pytest

from aotconv.runtime import LibraryError, load
from app_helpers import library, reference
from devices import pocl_present

pytestmark = pytest.mark.skipif(not pocl_present(), reason="no PoCL device")

OFF = "created with profiling off: create with options.profile = 1 for per-kernel times"


@pytest.fixture(scope="module")
def twoout(tmp_path_factory):
    return library(tmp_path_factory, "twoout")


def _input(built, seed=1):
    shape = built.res.net.input_shape
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _raw_run_and_profile(net, opts, x):
    """The C API alone: create(&h, opts), load_params, run, profile; (profile's code, its
    last_error, the times)."""
    ffi, f, name = net.ffi, net._f, net.name
    h = ffi.new(f"aotconv_{name} **")
    assert f("create")(h, opts) == 0, ffi.string(f("last_error")(ffi.NULL)).decode()
    try:
        params = str(net.dir / f"{name}.params.bin").encode()
        assert f("load_params")(h[0], params) == 0
        y = np.empty(sum(math.prod(s) for s in net.output_shapes), np.float32)
        assert f("run")(h[0], ffi.from_buffer("float[]", x), x.size,
                        ffi.from_buffer("float[]", y), y.size) == 0
        ms = np.full(len(net.kernel_names), -1.0)
        rc = f("profile")(h[0], ffi.from_buffer("double[]", ms), ms.size)
        return rc, ffi.string(f("last_error")(h[0])).decode(), ms, y
    finally:
        f("destroy")(h[0])


def test_create_with_null_options_has_profiling_off(twoout):
    x = _input(twoout)
    with load(twoout.dir, params=False) as net:
        rc, msg, ms, y = _raw_run_and_profile(net, net.ffi.NULL, x)
        assert rc == -7, msg
        assert msg == f"twoout_profile: {OFF}"
        assert np.all(ms == -1.0)                       # nothing written
        assert np.allclose(y, reference(twoout, x), atol=1e-4, rtol=1e-4)  # and it runs


def test_options_profile_1_gives_per_kernel_times(twoout):
    x = _input(twoout)
    with load(twoout.dir, params=False) as net:
        opts = net.ffi.new(f"aotconv_{net.name}_options *")
        opts.platform_index, opts.device_index, opts.profile = -1, -1, 1
        rc, msg, ms, _ = _raw_run_and_profile(net, opts, x)
        assert rc == 0, msg
        assert len(ms) == len(twoout.res.schedule.run_launches)
        assert np.all(np.isfinite(ms)) and np.all(ms >= 0) and ms.sum() > 0
        # zeroed options (an application's `= {0}` plus the indices) mean profiling off too
        opts.profile = 0
        rc, msg, _, _ = _raw_run_and_profile(net, opts, x)
        assert rc == -7 and OFF in msg


def test_python_load_has_profiling_off_unless_asked(twoout):
    x = _input(twoout, 2)
    with load(twoout.dir) as net:
        y = net(x)
        with pytest.raises(LibraryError, match=r"^\[-7\] twoout_profile: created with "
                                               r"profiling off: create with options.profile = 1"):
            net.profile()
    with load(twoout.dir, profile=True) as net:
        assert all(np.array_equal(a, b) for a, b in zip(net(x), y))
        prof = net.profile()
        assert [k for k, _ in prof] == net.kernel_names
        assert all(math.isfinite(t) and t >= 0 for _, t in prof)


def test_the_package_level_load_mirrors_it(twoout):
    import aotconv
    with aotconv.load(twoout.dir) as net:
        net(_input(twoout, 3))
        with pytest.raises(LibraryError, match=r"\[-7\].*options.profile = 1"):
            net.profile()
    with aotconv.load(twoout.dir, profile=True) as net:
        net(_input(twoout, 3))
        assert len(net.profile()) == len(net.kernel_names)


def test_the_build_still_reports_kernel_times(tmp_path):
    """`aotconv build` on a present device runs the library with profiling asked for: the
    report's per-kernel times are measured, not dropped with the default."""
    from aotconv.compiler import compile_network
    from app_helpers import TWO_OUTPUTS
    (tmp_path / "twoout.yaml").write_text(TWO_OUTPUTS)
    res = compile_network(str(tmp_path / "twoout.yaml"), target="pocl-cpu",
                          outdir=tmp_path / "out", tune_mode="fallback", quiet=True)
    assert res.profile and len(res.profile) == len(res.schedule.run_launches)
    assert all(math.isfinite(ms) and ms >= 0 for _, ms in res.profile)
    assert "OpenCL profiling events; total kernel time" in (res.outdir / "report.md").read_text()

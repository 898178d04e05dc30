"""options.flush_every (runtime_c/rt_run.c): a clFlush after a run's input and every N of its
kernels, so that a driver that holds commands until a flush starts the device while the host
enqueues the rest. On PoCL: the outputs are the bytes of a run without flushes, from numpy
memory, through run_async and from the pinned buffers, with profiling on and off; a value below -1
is refused by create() in one line."""
import numpy as np
import pytest

from aotconv.errors import AotconvError
from aotconv.runtime import LibraryError, load
from app_helpers import library, reference
from devices import pocl_present

pytestmark = pytest.mark.skipif(not pocl_present(), reason="no PoCL device")


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    return library(tmp_path_factory, "lenet5")


def outputs(directory, x, **opts):
    with load(directory, **opts) as net:
        y = net(x).copy()
        net.run_async(x)
        y1 = net.wait().copy()
        xin, _ = net.host_buffers()
        xin[...] = x
        pinned = net.run_host().copy()
        kernels = len(net.profile()) if opts.get("profile") else None
    return y, y1, pinned, kernels


@pytest.mark.parametrize("every", [1, 3, 1000, -1])
def test_flushes_change_no_output(lenet, every):
    x = np.random.default_rng(5).standard_normal(lenet.res.net.input_shape).astype(np.float32)
    want = outputs(lenet.dir, x, profile=True)
    got = outputs(lenet.dir, x, flush_every=every, profile=True)
    for a, b in zip(want[:3], got[:3]):
        assert np.array_equal(a, b)
    assert got[3] == want[3] and want[3] > 1      # profile() sees every kernel of the run
    assert np.allclose(got[0].ravel(), reference(lenet, x), atol=1e-3, rtol=1e-3)
    quiet = outputs(lenet.dir, x, flush_every=every, profile=False)
    assert all(np.array_equal(a, b) for a, b in zip(want[:3], quiet[:3]))


def test_a_value_below_minus_one_is_refused(lenet):
    with pytest.raises(LibraryError, match=r"\[-1\] lenet5: options.flush_every is -2; give 0 "
                                           r"\(the default: no flushes\), N > 0"):
        load(lenet.dir, flush_every=-2)
    with pytest.raises(AotconvError, match="flush_every is 4294967296; give 0"):
        load(lenet.dir, flush_every=1 << 32)


def test_the_header_declares_it_last(lenet):
    """A member added at the end: an application's zeroed options mean no flushes."""
    text = (lenet.dir / "lenet5.h").read_text()
    body = text[text.index("    int platform_index;"):text.index("} aotconv_lenet5_options;")]
    members = [ln.split("/*")[0].strip() for ln in body.splitlines()]
    assert [m for m in members if m.endswith(";")][-1] == "int flush_every;"


# -- the flushes themselves: counted by a shim around clFlush ----------------------------------

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <CL/cl.h>

static long flushes;
long shim_flushes(void) { return flushes; }

cl_int clFlush(cl_command_queue q)
{
    static cl_int (*real)(cl_command_queue);
    if (!real)      /* the ICD loader, loaded by then (a library's dependency: no global scope) */
        real = (cl_int (*)(cl_command_queue))dlsym(RTLD_NEXT, "clFlush");
    if (!real) {
        void *h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
        real = h ? (cl_int (*)(cl_command_queue))dlsym(h, "clFlush") : 0;
    }
    if (!real)
        return CL_INVALID_COMMAND_QUEUE;
    ++flushes;
    return real(q);
}
"""

SCRIPT = r"""
import ctypes, json, sys
import numpy as np
from aotconv.runtime import load
shim = ctypes.CDLL(sys.argv[1])
shim.shim_flushes.restype = ctypes.c_long
out = {}
for every in (0, -1, 1, 3):
    with load(sys.argv[2], flush_every=every) as net:
        x = np.ones(net.input_shape, np.float32)
        net(x)
        before = shim.shim_flushes()
        net(x)
        xin, _ = net.host_buffers()
        net.run_host()
        out[every] = [shim.shim_flushes() - before, len(net.kernel_names)]
print(json.dumps(out))
"""


def test_a_run_flushes_after_its_input_and_every_n_kernels(lenet, tmp_path):
    import json
    import os
    import shutil
    import subprocess
    import sys
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and the dynamic linker's LD_PRELOAD")
    (tmp_path / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", str(tmp_path / "shim.c"), "-o",
                    str(tmp_path / "shim.so"), "-ldl"], check=True, capture_output=True)
    shim = str(tmp_path / "shim.so")
    p = subprocess.run([sys.executable, "-c", SCRIPT, shim, str(lenet.dir)],
                       env=dict(os.environ, LD_PRELOAD=shim), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    kernels = got["0"][1]
    assert kernels > 3
    # two blocking runs (numpy memory, pinned buffers); the staging ring flushes its chunks
    # in every case: with N, one more after the input and one after every N kernels, each run
    base = got["0"][0]
    assert got["-1"][0] == base
    assert got["1"][0] - base == 2 * (1 + kernels)
    assert got["3"][0] - base == 2 * (1 + kernels // 3)

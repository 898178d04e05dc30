"""The emitted library's step trace and its load_params, on PoCL.

AOTCONV_TRACE set: create(), create_with_queue(), set_params() and load_params() each write one
line to stderr with the time of every step; unset (or "0"): nothing. load_params reads the file
in chunks through a ring of pinned memory (runtime_c/rt_net.c): a network of more parameters
than the ring holds, with tensors and folded batchnorms across the chunks' edges, loads exactly
what set_params of the same floats gives; a file that shrinks, grows or fails while it is read
(made so by an LD_PRELOAD shim around read()) is refused with its message, no crash, and leaves
the handle without parameters; a file refused before any read keeps the parameters it had.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aotconv import params as params_mod
from aotconv import reference, spec
from aotconv.harness import close

SMALL = """\
name: tr
input: [2, 3, 8, 8]
layers:
  - {name: c1, op: conv, out: 4, kernel: 3}
  - {name: bn, op: batchnorm}
  - {name: r, op: relu}
  - {name: fc, op: dense, out: 5}
"""

# 5,985,802 floats (23.9 MB): six 4 MiB chunks through the four slots of load_params' ring.
# c1's weight (folded with bn1) ends past the first chunk, c2's (folded with bn2) spans the
# second and third, c3's (uploaded as it is) the fourth to sixth.
BIG = """\
name: big
input: [1, 256, 4, 4]
layers:
  - {name: c1, op: conv, out: 512, kernel: 3, pad: 1}
  - {name: bn1, op: batchnorm}
  - {name: r1, op: relu}
  - {name: c2, op: conv, out: 512, kernel: 3, pad: 1}
  - {name: bn2, op: batchnorm}
  - {name: c3, op: conv, out: 512, kernel: 3, pad: 1, act: relu}
  - {name: fc, op: dense, out: 10}
"""

CHUNK_FLOATS = (4 << 20) // 4       # runtime_c/rt_net.c LOAD_CHUNK

MS = r"\d+\.\d ms"


def _pocl():
    from aotconv.targets import find_device, get_target
    return find_device(get_target("pocl-cpu")) is not None


def _build(tmp_path_factory, text, name, **kw):
    if not _pocl():
        pytest.skip("PoCL is not installed")
    from aotconv.compiler import compile_network
    d = tmp_path_factory.mktemp(name)
    src = d / f"{name}.yaml"
    src.write_text(text)
    res = compile_network(str(src), target="pocl-cpu", outdir=d / "out", tune_mode="fallback",
                          measure=False, quiet=True, **kw)
    return spec.load_network(str(src)), res.outdir


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _build(tmp_path_factory, SMALL, "tr")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return _build(tmp_path_factory, BIG, "big")


@pytest.fixture(scope="module")
def big16(tmp_path_factory):
    return _build(tmp_path_factory, BIG, "big", precision="fp16")


def _lines(err):
    return [l for l in err.splitlines() if l.startswith("aotconv ")]


# -- the trace ----------------------------------------------------------------------------------

def test_trace_lines_with_the_variable(small, monkeypatch, capfd):
    from aotconv.runtime import load
    _, out = small
    monkeypatch.setenv("AOTCONV_TRACE", "1")
    capfd.readouterr()
    with load(out, params=False) as lib:
        lib.load_params(out / "tr.params.bin")
        lib.set_params(np.ones(lib.param_count, np.float32))
    create, loadp, setp = _lines(capfd.readouterr().err)
    assert re.fullmatch(
        rf"aotconv tr: create: device {MS}, context {MS}, queue {MS}, staging {MS} "
        rf"\(\d+\.\d MiB pinned\), buffers {MS} \(\d+, \d+\.\d MiB\), programs {MS} "
        rf"\((1 binary: create {MS}, build {MS}|1 from source: {MS})\), kernels {MS} \(\d+\); "
        rf"{MS}", create), create
    assert re.fullmatch(
        rf"aotconv tr: load_params: open {MS}, ring {MS} \(1 x 0\.0 MiB, pinned\), read {MS} "
        rf"\(0\.0 MB\), enqueue {MS} \(\d+ tensors\), slot waits {MS}, folds {MS} \(1\), "
        rf"setup launches {MS} \(\d+\), finish {MS}; {MS}", loadp), loadp
    assert re.fullmatch(
        rf"aotconv tr: set_params: upload {MS} \(\d+ tensors, 0\.0 MB enqueued\), folds {MS} "
        rf"\(1\), setup launches {MS} \(\d+\), finish {MS}; {MS}", setp), setp
    # the steps (their details in parentheses aside) add up to no more than the call
    steps = [float(m) for m in re.findall(r" (\d+\.\d) ms", re.sub(r" \([^)]*\)", "", create))]
    assert len(steps) == 8 and sum(steps[:-1]) <= steps[-1] + 0.1 * len(steps)


def test_trace_of_a_failed_create(small, monkeypatch, capfd):
    from aotconv.runtime import LibraryError, load
    _, out = small
    monkeypatch.setenv("AOTCONV_TRACE", "yes")
    monkeypatch.setenv("AOTCONV_DEVICE", "no such device anywhere")
    capfd.readouterr()
    with pytest.raises(LibraryError, match=r"\[-2\]"):
        load(out, params=False)
    (line,) = _lines(capfd.readouterr().err)
    assert re.fullmatch(rf"aotconv tr: create: failed \(-2\) after {MS}", line), line


def test_trace_of_a_refused_load_params(small, monkeypatch, capfd, tmp_path):
    from aotconv.runtime import LibraryError, load
    _, out = small
    with load(out, params=False) as lib:
        monkeypatch.setenv("AOTCONV_TRACE", "1")
        capfd.readouterr()
        short = tmp_path / "short.bin"
        short.write_bytes(b"\0" * 12)
        with pytest.raises(LibraryError, match=r"\[-6\].*holds 3 floats"):
            lib.load_params(short)
        (line,) = _lines(capfd.readouterr().err)
        assert re.fullmatch(rf"aotconv tr: load_params: failed \(-6\) after {MS}", line), line


@pytest.mark.parametrize("value", [None, "", "0"])
def test_no_trace_without_the_variable(small, monkeypatch, capfd, value):
    from aotconv.runtime import load
    _, out = small
    if value is None:
        monkeypatch.delenv("AOTCONV_TRACE", raising=False)
    else:
        monkeypatch.setenv("AOTCONV_TRACE", value)
    capfd.readouterr()
    with load(out, params=False) as lib:
        lib.load_params(out / "tr.params.bin")
        lib.set_params(np.ones(lib.param_count, np.float32))
        lib(np.ones(lib.input_shape, np.float32))
    assert capfd.readouterr().err == ""


def test_trace_of_create_with_queue(small, monkeypatch, capfd):
    cl = pytest.importorskip("pyopencl")
    from aotconv.runtime import load
    _, out = small
    dev = next(d for p in cl.get_platforms() for d in p.get_devices()
               if "portable" in p.name.lower() or "pocl" in p.name.lower())
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx, dev)
    monkeypatch.setenv("AOTCONV_TRACE", "1")
    capfd.readouterr()
    with load(out, params=False, queue=queue):
        pass
    (line,) = _lines(capfd.readouterr().err)
    assert re.fullmatch(rf"aotconv tr: create_with_queue: device {MS}, staging {MS} .*, "
                        rf"programs {MS} \(.*\), kernels {MS} \(\d+\); {MS}", line), line


# -- load_params through the ring ---------------------------------------------------------------

def test_big_load_params_is_set_params_of_the_same_floats(big):
    from aotconv.runtime import load
    net, out = big
    assert net.param_count() > 5 * CHUNK_FLOATS      # the ring's four slots are reused
    flat = params_mod.read_bin(out / "big.params.bin", net)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    (ref,) = reference.run_network(net, x, params_mod.split(net, flat))
    with load(out, params=False) as lib:
        lib.load_params(out / "big.params.bin")
        y = lib(x)
        ok, err = close(y, ref)
        assert ok, f"max hybrid error {err:.2e}"
        other = params_mod.random_params(net, seed=7)
        lib.set_params(other)
        assert not np.array_equal(lib(x), y)
        lib.set_params(flat)
        assert np.array_equal(lib(x), y)
        # loaded again over other parameters: every chunk's part of every tensor replaced
        lib.set_params(other)
        lib.load_params(out / "big.params.bin")
        assert np.array_equal(lib(x), y)


def test_big_fp16_load_params_rounds_each_chunks_part_where_set_params_does(big16):
    """half parameters: each chunk's part of a tensor rounded and written at its offset"""
    from aotconv.runtime import load
    net, out = big16
    flat = params_mod.read_bin(out / "big.params.bin", net)
    x = np.random.default_rng(2).standard_normal(net.input_shape).astype(np.float32)
    with load(out, params=False) as lib:
        lib.set_params(flat)
        want = lib(x)
        lib.set_params(params_mod.random_params(net, seed=7))
        assert not np.array_equal(lib(x), want)
        lib.load_params(out / "big.params.bin")
        assert np.array_equal(lib(x), want)


def test_a_file_refused_before_reading_keeps_the_parameters(big, tmp_path):
    from aotconv.runtime import LibraryError, load
    net, out = big
    x = np.ones(net.input_shape, np.float32)
    with load(out) as lib:
        y = lib(x)
        bad = tmp_path / "short.bin"
        bad.write_bytes(b"\0" * 400)
        with pytest.raises(LibraryError, match=r"\[-6\].*holds 100 floats"):
            lib.load_params(bad)
        assert np.array_equal(lib(x), y)


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* read() of the file SHIM_PATH, once its offset reaches SHIM_AT bytes: SHIM_DO shrink (the file
   truncated to SHIM_SIZE bytes first), grow (4 bytes appended first) or fail (EIO). Once. */
static int fired;

ssize_t read(int fd, void *buf, size_t len)
{
    static ssize_t (*real)(int, void *, size_t);
    if (!real)
        real = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    const char *path = getenv("SHIM_PATH"), *what = getenv("SHIM_DO");
    if (!fired && path && what) {
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k > 0) {
            target[k] = '\0';
            if (strcmp(target, path) == 0 && lseek(fd, 0, SEEK_CUR) >= atol(getenv("SHIM_AT"))) {
                fired = 1;
                if (strcmp(what, "shrink") == 0) {
                    if (truncate(path, atol(getenv("SHIM_SIZE"))) != 0)
                        abort();
                } else if (strcmp(what, "grow") == 0) {
                    int w = open(path, O_WRONLY | O_APPEND);
                    if (w < 0 || write(w, "grow", 4) != 4)
                        abort();
                    close(w);
                } else {
                    errno = EIO;
                    return -1;
                }
            }
        }
    }
    return real(fd, buf, len);
}
"""

SCRIPT = r"""
import json, sys
import numpy as np
from aotconv.runtime import LibraryError, load
out, path = sys.argv[1], sys.argv[2]
lib = load(out)
x = np.ones(lib.input_shape, np.float32)
lib(x)
res = {}
for what, call in (("load", lambda: lib.load_params(path)), ("run", lambda: lib(x))):
    try:
        call()
        res[what] = "ok"
    except LibraryError as e:
        res[what] = str(e)
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and Linux's /proc")
    d = tmp_path_factory.mktemp("shim")
    (d / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", str(d / "shim.c"), "-o", str(d / "shim.so"),
                    "-ldl"], check=True, capture_output=True)
    return d / "shim.so"


@pytest.mark.parametrize("what, at, size, message", [
    # truncated in the middle of the third chunk's read: the floats read until the end
    ("shrink", 2 * 4 * CHUNK_FLOATS, 3 * CHUNK_FLOATS,
     rf"\[-6\] big_load_params: '.*big\.params\.bin' holds {2 * CHUNK_FLOATS} floats, the "
     rf"network has 5985802 parameters \(float32, little-endian, in the header's order\)"),
    # grown while read: found by the read past its end
    ("grow", 0, 0, r"\[-6\] big_load_params: '.*' holds more than 5985802 floats, the network "
                   r"has 5985802 parameters \(float32, little-endian, in the header's order\)"),
    ("fail", 4 * CHUNK_FLOATS, 0, rf"\[-6\] big_load_params: reading '.*big\.params\.bin' "
                                  rf"failed after {CHUNK_FLOATS} floats: Input/output error"),
])
def test_a_file_that_changes_while_read_is_refused(big, shim, tmp_path, what, at, size, message):
    _, out = big
    path = tmp_path / "big.params.bin"
    shutil.copyfile(out / "big.params.bin", path)
    env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_PATH=str(path.resolve()), SHIM_DO=what,
               SHIM_AT=str(at), SHIM_SIZE=str(size))
    env.pop("AOTCONV_TRACE", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert re.fullmatch(message, res["load"]), res["load"]
    # some tensors were written: the handle has no parameters until a load succeeds
    assert re.search(r"\[-7\].*parameters are not set", res["run"]), res["run"]

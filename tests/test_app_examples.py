"""examples/: the C and the C++ application built against an emitted library (lenet5 on PoCL)
both ways, with pkg-config (<net>.pc) and with CMake (find_package(<net>), <net>Config.cmake),
run, and checked against numpy."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aotconv.harness import close

from app_helpers import library, reference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    return library(tmp_path_factory, "lenet5")


@pytest.fixture(scope="module")
def case(lenet5, tmp_path_factory):
    """An input file and the reference output for it."""
    d = tmp_path_factory.mktemp("examples")
    x = np.random.default_rng(7).standard_normal((100, 1, 32, 32)).astype(np.float32)
    x.tofile(d / "in.bin")
    return d, reference(lenet5, x)


def _run(exe, lenet5, case, tag):
    d, want = case
    out = d / f"out_{tag}.bin"
    p = subprocess.run([str(exe), str(lenet5.dir / "lenet5.params.bin"), str(d / "in.bin"),
                        str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("image 0: class ")
    got = np.fromfile(out, np.float32)
    assert got.size == want.size and close(got, want)[0]
    return got


def _pkg_config(lenet5, *pkgs):
    env = dict(os.environ, PKG_CONFIG_PATH=str(lenet5.dir))
    p = subprocess.run(["pkg-config", "--cflags", "--libs", *pkgs], capture_output=True,
                       text=True, env=env, check=True)
    return p.stdout.split()


@pytest.mark.skipif(not shutil.which("pkg-config"), reason="pkg-config is not installed")
def test_examples_with_pkg_config(lenet5, case, tmp_path):
    rpath = f"-Wl,-rpath,{lenet5.dir}"
    c, cpp = tmp_path / "classify_c", tmp_path / "classify_cpp"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", str(EXAMPLES / "c/classify.c"),
                    *_pkg_config(lenet5, "lenet5"), rpath, "-o", str(c)], check=True)
    subprocess.run(["c++", "-std=c++14", "-Wall", "-Wextra", "-Werror",
                    str(EXAMPLES / "cpp/classify.cpp"), *_pkg_config(lenet5, "lenet5", "OpenCL"),
                    rpath, "-o", str(cpp)], check=True)
    assert np.array_equal(_run(c, lenet5, case, "pc_c"), _run(cpp, lenet5, case, "pc_cpp"))


@pytest.mark.skipif(not shutil.which("cmake"), reason="cmake is not installed")
def test_examples_with_cmake(lenet5, case, tmp_path):
    b = tmp_path / "build"
    cfg = subprocess.run(["cmake", "-S", str(EXAMPLES), "-B", str(b),
                          f"-Dlenet5_DIR={lenet5.dir}", "-DCMAKE_BUILD_TYPE=Release",
                          "-DCMAKE_COMPILE_WARNING_AS_ERROR=ON"],
                         capture_output=True, text=True, timeout=300)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    mk = subprocess.run(["cmake", "--build", str(b)], capture_output=True, text=True,
                        timeout=300)
    assert mk.returncode == 0, mk.stdout + mk.stderr
    outs = [_run(b / exe, lenet5, case, exe)
            for exe in ("classify_c", "classify_c_static", "classify_cpp")]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    # the shared-library target links the library by its soname, found through the rpath
    ldd = subprocess.run(["ldd", str(b / "classify_c")], capture_output=True, text=True)
    assert f"liblenet5.so => {lenet5.dir}/liblenet5.so" in ldd.stdout
    ldd = subprocess.run(["ldd", str(b / "classify_c_static")], capture_output=True, text=True)
    assert "liblenet5" not in ldd.stdout


def test_the_cmake_package_names_its_files_relative_to_itself(lenet5):
    """No absolute path in <net>Config.cmake: the build directory may be moved as a whole."""
    text = (lenet5.dir / "lenet5Config.cmake").read_text()
    assert str(lenet5.dir) not in text
    assert "add_library(lenet5::lenet5 SHARED IMPORTED)" in text
    assert "add_library(lenet5::lenet5_static STATIC IMPORTED)" in text
    assert 'IMPORTED_SONAME "liblenet5.so"' in text

"""The slow tier (tests/conftest.py): `make test` deselects what is marked slow, `make
test-full` runs it, `make test-unit` keeps to the quick device-free tests, and a sweep cannot
mark every case slow. Each check runs pytest, with the real conftest and the marker
expressions of the Makefile's own recipes, over a small suite written here."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).parent
MAKEFILE = TESTS.parent / "Makefile"

# a module of each tier: one named as a device-free module is, one named as none is
UNIT, DEVICE = sorted(conftest.DEVICE_FREE)[0], "test_not_a_device_free_module"
SUITE = {
    f"{UNIT}.py": """
import pytest

@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_sweep(n):
    pass

@pytest.mark.slow
def test_whole():
    pass

@pytest.mark.slow
@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow)])
def test_slow_sweep(n):
    pass

def test_quick():
    pass
""",
    f"{DEVICE}.py": """
import pytest

@pytest.mark.parametrize("shape", ["a", pytest.param("b", marks=pytest.mark.slow)])
@pytest.mark.parametrize("layout", ["NCHW", pytest.param("NHWC", marks=[pytest.mark.slow])])
def test_grid(shape, layout):
    pass

def test_device():
    pass
""",
}
UNIT_QUICK = {"test_sweep[1]", "test_sweep[3]", "test_quick"}
QUICK = UNIT_QUICK | {"test_grid[NCHW-a]", "test_device"}
SLOW = {"test_sweep[2]", "test_whole", "test_slow_sweep[1]", "test_grid[NCHW-b]",
        "test_grid[NHWC-a]", "test_grid[NHWC-b]"}


def recipe_marks(target):
    """The -m expression of the pytest command in `target`'s recipe (None without one)."""
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE.read_text(), re.M)
    assert m, f"no recipe for {target} in the Makefile"
    lex = shlex.shlex(m.group(1), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = list(lex)
    assert "pytest" in words, (target, words)
    words = words[words.index("pytest"):]
    for w in (";", "&&", "||", "|"):
        words = words[:words.index(w)] if w in words else words
    return words[words.index("-m") + 1] if "-m" in words else None


def run_pytest(tmp_path, *args, files=SUITE):
    """pytest over `files` in tmp_path with tests/conftest.py: (process, names of the tests
    that passed)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")   # no plugins: 1 s less a run
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                        *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    return p, set(re.findall(r"^PASSED \S+::(\S+)$", p.stdout, re.M))


def test_make_test_deselects_the_slow_cases_only(tmp_path):
    p, ran = run_pytest(tmp_path, str(tmp_path), "-m", recipe_marks("test"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert ran == QUICK, p.stdout


def test_make_test_full_runs_every_case(tmp_path):
    assert recipe_marks("test-full") is None
    p, ran = run_pytest(tmp_path, str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert ran == QUICK | SLOW, p.stdout


def test_make_test_unit_runs_the_quick_device_free_cases(tmp_path):
    p, ran = run_pytest(tmp_path, str(tmp_path), "-m", recipe_marks("test-unit"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert ran == UNIT_QUICK, p.stdout


def test_a_sweep_with_every_case_slow_is_an_error(tmp_path):
    """Every value of one of two parametrize lists slow (the list given by keyword): no case
    of the sweep would be left for `make test`."""
    body = """import pytest

@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(argnames="m", argvalues=[pytest.param(3, marks=pytest.mark.slow)])
def test_all(n, m):
    pass

def test_other():
    pass
"""
    p, ran = run_pytest(tmp_path, str(tmp_path), files={"test_sweep_marks.py": body})
    out = p.stdout + p.stderr
    assert p.returncode != 0 and not ran, out
    assert "test_sweep_marks.py::test_all: every value of parametrize 'm' is marked slow, " \
           "so `make test` runs none of them" in out, out


def test_a_selection_of_slow_cases_is_no_error(tmp_path):
    """The check reads the parametrize lists, not the cases selected: one slow case picked by
    its id runs."""
    p, ran = run_pytest(tmp_path, f"{tmp_path / UNIT}.py::test_sweep[2]")
    assert p.returncode == 0 and ran == {"test_sweep[2]"}, p.stdout + p.stderr

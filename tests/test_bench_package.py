"""The benchmark harness as a package (aotconv.bench): one job per module, imports at module
level, and the `aotconv` command line not loading the harness until `aotconv bench` runs."""
import ast
from pathlib import Path
import subprocess
import sys

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "aotconv" / "bench"
# function-local imports that stay: torch (optional, seconds to load) and the bench run (the
# compiler, the tuner and pyopencl, not needed to build the command line)
LOCAL_OK = {("refs/torch_ref.py", "torch"), ("cli.py", "run")}


def test_imports_are_at_module_level():
    local = set()
    for path in BENCH.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(fn):
                    if isinstance(n, ast.Import):
                        local |= {(str(path.relative_to(BENCH)), a.name) for a in n.names}
                    elif isinstance(n, ast.ImportFrom):
                        local.add((str(path.relative_to(BENCH)), n.module))
    assert local == LOCAL_OK


def test_the_command_line_does_not_load_the_harness():
    code = ("import sys, aotconv.cli; aotconv.cli.parser(); "
            "print(sorted(m for m in sys.modules if m.startswith('aotconv.bench')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['aotconv.bench', 'aotconv.bench.cli', 'aotconv.bench.sets']"

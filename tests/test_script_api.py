"""The Python API from a plain script: tuning works without an `if __name__ == "__main__":`
guard (the tuner's worker processes must not run the caller's script again)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aotconv.targets import find_device, get_target

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
print("script body ran")
from aotconv.choose import choose
from aotconv.spec import network_from_dict
net = network_from_dict({"name": "s", "input": [1, 4, 6, 6], "layers": [
    {"name": "c1", "op": "conv", "out": 4, "kernel": 3, "pad": 1}]})
ch = choose(net, "pocl-cpu", budget=2, strategy="random", jobs=1, quiet=True)
print("choice", ch["c1"].source, ch["c1"].stats.ok)
"""


@pytest.mark.skipif(find_device(get_target("pocl-cpu")) is None, reason="no PoCL device")
def test_tuning_from_an_unguarded_script(tmp_path):
    script = tmp_path / "tune_me.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, AOTCONV_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("script body ran") == 1             # never re-run in a worker
    assert "choice tuned" in r.stdout and "choice tuned 0" not in r.stdout


MODULE = """
import sys, threading
from aotconv.tune.measure import Worker
from spawnpkg.fns import square

if __name__ == "__main__":
    workers = [Worker() for _ in range(6)]
    out = [None] * 6
    def go(i):
        out[i] = workers[i].call(square, (i,), 120)
    ts = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in ts: t.start()
    for t in ts: t.join()
    main = sys.modules["__main__"]
    print("results", out)
    print("spec", getattr(main.__spec__, "name", None), "file" , "__file__" in main.__dict__)
    w = Worker()                                   # a later start must still work
    print("later", w.call(square, (7,), 120))
    for x in workers + [w]:
        x.kill()
"""


def test_workers_started_from_threads_under_python_m(tmp_path):
    """`python -m pkg.mod` (as `python -m aotconv.cli tune` runs): builders start their worker
    processes from several threads at once; __main__ must come back whole, or later workers
    run the module as a script and die on its relative imports."""
    pkg = tmp_path / "spawnpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fns.py").write_text("def square(tick, x):\n    return x * x\n")
    (pkg / "mod.py").write_text("from . import __name__ as _pkg\n" + MODULE)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "spawnpkg.mod"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "results [0, 1, 4, 9, 16, 25]" in r.stdout
    assert "spec spawnpkg.mod file True" in r.stdout
    assert "later 49" in r.stdout
    assert "ImportError" not in r.stderr

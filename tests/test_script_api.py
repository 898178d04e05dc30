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

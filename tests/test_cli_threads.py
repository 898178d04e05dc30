"""The aotconv command holds BLAS to one thread unless the environment says otherwise
(docs/tuning.md, CPU threads)."""
import os
import subprocess
import sys

import pytest

PROBE = ("import aotconv.cli, os, sys; "
         "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MKL_NUM_THREADS'], "
         "'numpy' in sys.modules)")


def _probe(**env):
    base = {k: v for k, v in os.environ.items()
            if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_one_blas_thread_by_default_set_before_numpy_loads():
    assert _probe() == ["1", "1", "False"]


@pytest.mark.parametrize("value", ["4", "16"])
def test_the_users_setting_is_kept(value):
    assert _probe(OPENBLAS_NUM_THREADS=value, MKL_NUM_THREADS=value) == [value, value, "False"]

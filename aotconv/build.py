"""Run ninja on an emitted directory: lib<net>.so and lib<net>.a."""
import os
import shutil
import subprocess
from pathlib import Path

from .errors import BuildError


def ninja_path():
    exe = shutil.which("ninja")
    if exe:
        return exe
    try:
        import ninja
        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise BuildError("ninja is not installed: pip install ninja (or apt-get install "
                         "ninja-build)") from None


def build(outdir, quiet=True):
    """Build the libraries; on failure raise BuildError with ninja's output saved to build.log."""
    outdir = Path(outdir)
    # run in the directory (not -C): the log then names no directory, only its own files
    proc = subprocess.run([os.path.abspath(ninja_path())], cwd=outdir, capture_output=True,
                          text=True)
    log = outdir / "build.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise BuildError(f"ninja failed in {outdir} (full log: {log}):\n{tail}")
    return outdir

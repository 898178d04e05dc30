"""The output directory of `aotconv build`: aotconv never deletes or overwrites a file it did not
write, never writes or deletes through a symlink, replaces its outputs atomically, refuses a
directory it cannot use before building anything, locks it against a concurrent build, and
writes .pc and build.ninja files that survive spaces and shell characters in the path.

Builds here use the variants' fallback choices and no device (measure=False) unless a test
says otherwise; the concurrent and interrupted builds run the real CLI in subprocesses."""
import hashlib
import json
import os
from pathlib import Path
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aotconv import outdir as od_mod
from aotconv.compiler import compile_network
from aotconv.errors import BuildError
from aotconv.outdir import (LOCK, MARKER, STAGING_PREFIX, OutputDir, OutputDirError,
                            check_output_dir, ninja_escape, ninja_shell_word, pc_escape)

ROOT = Path(__file__).resolve().parent.parent
AOTCONV = [sys.executable, "-m", "aotconv.cli"]


def net_yaml(tmp_path, name, layers=3):
    """A small network; `layers` convolutions named <name>_k1... (so kernel files differ)."""
    src = tmp_path / f"{name}.yaml"
    body = "".join(f"  - {{name: {name}_k{i}, op: conv, out: 3, kernel: 3, pad: 1}}\n"
                   for i in range(1, layers + 1))
    src.write_text(f"name: {name}\ninput: [1, 2, 9, 9]\nlayers:\n{body}")
    return src


def build(src, out, **kw):
    return compile_network(str(src), target="pocl-cpu", outdir=out, tune_mode="fallback",
                           measure=False, quiet=True, **kw)


def snapshot(d):
    """{relative path: sha256} of every file under d (symlinks not followed)."""
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            p = Path(root) / n
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def outputs(snap):
    """A snapshot without aotconv's own bookkeeping (marker, lock) and staging directories."""
    return {k: v for k, v in snap.items()
            if k not in (MARKER, LOCK) and not k.startswith(STAGING_PREFIX)}


def marker(d):
    return json.loads((d / MARKER).read_text())


def one_line(err):
    text = str(err).strip()
    assert "\n" not in text, text
    return text


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    d = tmp_path_factory.mktemp("nets")
    return dict(alpha=net_yaml(d, "alpha", 3), beta=net_yaml(d, "beta", 1))


@pytest.fixture(scope="module")
def alpha_build(tmp_path_factory, nets):
    out = tmp_path_factory.mktemp("alpha") / "new" / "out"      # parents made too
    build(nets["alpha"], out)
    return out


def built(alpha_build, out):
    """A copy of a finished build of alpha (times kept, so its marker's record holds)."""
    shutil.copytree(alpha_build, out, symlinks=True)
    return out


# ---- marking, rebuilding, refusing -----------------------------------------------------------

def test_build_marks_directory_with_manifest_of_its_files(alpha_build):
    out = alpha_build
    doc = marker(out)
    assert doc["state"] == "complete" and doc["network"] == "alpha" and doc["staging"] == []
    written = set(snapshot(out)) - {MARKER, LOCK}
    assert set(doc["files"]) == written
    assert {"alpha.h", "libalpha.so", "libalpha.a", "tuning.json", "kernels/alpha_k3.cl",
            "runtime/rt_net.c"} <= written
    assert not [p for p in os.listdir(out) if p.startswith(STAGING_PREFIX)]


@pytest.mark.parametrize("legacy", [False, True])
def test_refuses_non_empty_directory_it_did_not_mark(tmp_path, nets, legacy):
    out = tmp_path / "mine"
    out.mkdir()
    (out / ("tuning.json" if legacy else "notes.txt")).write_text("user data")
    (out / "runtime").mkdir()
    (out / "runtime" / "my.c").write_text("int x;")
    before = snapshot(out)
    with pytest.raises(OutputDirError) as e:
        build(nets["alpha"], out)
    msg = one_line(e.value)
    assert str(out) in msg and "remove" in msg and "choose a new or empty directory" in msg
    assert snapshot(out) == before and sorted(os.listdir(out)) == sorted(
        ["runtime", "tuning.json" if legacy else "notes.txt"])      # not even a lock file


def test_rebuild_removes_only_files_of_the_previous_build(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    user = {"notes.txt": "keep me", "runtime/my.c": "int mine;", "kernels/mine.cl": "// mine",
            "obj/keep.o": "not ours"}
    for rel, text in user.items():
        (out / rel).write_text(text)
    # a stale output the user changed since the build is not removed either
    (out / "kernels" / "alpha_k2.cl").write_text("// edited by hand\n")
    build(nets["beta"], out)
    files = snapshot(out)
    for rel, text in user.items():
        assert (out / rel).read_text() == text
    assert (out / "kernels" / "alpha_k2.cl").read_text() == "// edited by hand\n"
    gone = ["alpha.c", "alpha.h", "alpha.pc", "libalpha.so", "libalpha.a", "alpha.params.bin",
            "kernels/alpha_k1.cl", "kernels/alpha_k3.cl", "obj/alpha.o"]
    assert not [g for g in gone if g in files]
    assert {"beta.h", "libbeta.so", "kernels/beta_k1.cl"} <= set(files)
    assert set(marker(out)["files"]) == set(files) - set(user) - {
        MARKER, LOCK, "kernels/alpha_k2.cl"}


def test_refuses_to_overwrite_a_file_the_previous_build_did_not_write(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    (out / "beta.h").write_text("/* the user's own header */")
    before, doc = snapshot(out), marker(out)
    with pytest.raises(OutputDirError) as e:
        build(nets["beta"], out)
    msg = one_line(e.value)
    assert str(out / "beta.h") in msg and "did not write" in msg
    assert outputs(snapshot(out)) == outputs(before)
    assert marker(out)["files"] == doc["files"]
    build(nets["alpha"], out)                      # the next build clears the staging
    assert not [p for p in os.listdir(out) if p.startswith(STAGING_PREFIX)]


def test_tampered_manifest_never_reaches_outside(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    victim = tmp_path / "outside.txt"
    victim.write_text("precious")
    st = victim.stat()
    doc = marker(out)
    doc["files"]["../outside.txt"] = [st.st_size, st.st_mtime_ns]
    (out / MARKER).write_text(json.dumps(doc))
    with pytest.raises(OutputDirError) as e:
        build(nets["beta"], out)
    assert "not a readable aotconv build record" in one_line(e.value)
    assert victim.read_text() == "precious"


# ---- atomic replacement, failed and interrupted builds --------------------------------------

def test_outputs_are_replaced_by_rename_not_rewritten(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    old = {n: (out / n).read_bytes() for n in ("libalpha.so", "alpha.h", "tuning.json")}
    fds = {n: os.open(out / n, os.O_RDONLY) for n in old}
    try:
        build(nets["alpha"], out, seed=5)
        for n, fd in fds.items():
            # a reader that opened the previous file still reads all of it, unchanged
            assert os.pread(fd, len(old[n]) + 1, 0) == old[n]
            assert os.fstat(fd).st_ino != (out / n).stat().st_ino
    finally:
        for fd in fds.values():
            os.close(fd)


def test_failed_build_leaves_previous_build_untouched(tmp_path, nets, alpha_build, monkeypatch,
                                                     capsys):
    out = built(alpha_build, tmp_path / "out")
    before, doc = snapshot(out), marker(out)
    fail = tmp_path / "failcc"
    fail.write_text("#!/bin/sh\ncase \" $* \" in *\" -c \"*) echo broken >&2; exit 1;; esac\n"
                    "exec cc \"$@\"\n")
    fail.chmod(0o755)
    monkeypatch.setenv("CC", str(fail))
    with pytest.raises(BuildError):
        compile_network(str(nets["beta"]), target="pocl-cpu", outdir=out, tune_mode="fallback",
                        measure=False)
    assert "still holds the previous build" in capsys.readouterr().err
    after = snapshot(out)
    assert outputs(after) == outputs(before)
    assert marker(out)["files"] == doc["files"]
    assert not [k for k in after if k.startswith("beta")]


# slow tier: 3.5 to 4 s; make test keeps a failed build leaving the previous one untouched
# (test_failed_build_leaves_previous_build_untouched)
@pytest.mark.slow
def test_killed_build_leaves_previous_build_untouched(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    before, doc = snapshot(out), marker(out)
    flag = tmp_path / "compiling"
    slow = tmp_path / "slowcc"
    slow.write_text(f"#!/bin/sh\ncase \" $* \" in *\" -c \"*) touch {shlex.quote(str(flag))}; "
                    f"sleep 60;; esac\nexec cc \"$@\"\n")
    slow.chmod(0o755)
    env = dict(os.environ, CC=str(slow))
    p = subprocess.Popen(AOTCONV + ["build", str(nets["beta"]), "--target", "pocl-cpu",
                                    "--no-tune", "-o", str(out)],
                         env=env, cwd=ROOT, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not flag.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert flag.exists(), "the build never reached its compile step"
    finally:
        os.killpg(p.pid, signal.SIGKILL)      # the build, ninja and the compiler it started
        p.wait()
    after = snapshot(out)
    staged = [k for k in after if k.startswith(STAGING_PREFIX)]
    assert staged and any(k.endswith("beta.h") for k in staged)   # written, never moved in
    assert outputs(after) == outputs(before)
    assert marker(out)["files"] == doc["files"]
    build(nets["beta"], out)
    assert not [p for p in os.listdir(out) if p.startswith(STAGING_PREFIX)]
    assert (out / "libbeta.so").exists() and not (out / "libalpha.so").exists()


# ---- symlinks ----------------------------------------------------------------------------

@pytest.mark.parametrize("link", ["kernels", "runtime", "obj", "alpha.h", LOCK])
def test_never_writes_or_deletes_through_a_symlink(tmp_path, nets, alpha_build, link):
    out = built(alpha_build, tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"
    src = out / link
    if src.is_dir():
        shutil.move(src, elsewhere)
    else:
        elsewhere.write_bytes(src.read_bytes())
        src.unlink()
    os.symlink(elsewhere, src)
    before = snapshot(elsewhere) if elsewhere.is_dir() else elsewhere.read_bytes()
    with pytest.raises(OutputDirError) as e:
        build(nets["beta"], out)               # beta would remove alpha's files
    msg = one_line(e.value)
    assert f"{src}: is a symlink" in msg and "remove the link" in msg
    assert (snapshot(elsewhere) if elsewhere.is_dir() else elsewhere.read_bytes()) == before


def test_symlink_at_a_new_output_path_is_refused(tmp_path, nets, alpha_build):
    out = built(alpha_build, tmp_path / "out")
    target = tmp_path / "precious.h"
    target.write_text("precious")
    os.symlink(target, out / "beta.h")
    with pytest.raises(OutputDirError) as e:
        build(nets["beta"], out)
    assert f"{out / 'beta.h'}: is a symlink" in one_line(e.value)
    assert target.read_text() == "precious" and (out / "libalpha.so").exists()


def test_output_directory_itself_may_be_a_symlink(tmp_path, nets):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    build(nets["beta"], tmp_path / "link")
    assert (real / "libbeta.so").exists()
    assert f"prefix={real.resolve()}\n" in (real / "beta.pc").read_text()


# ---- unusable -o: one line, before anything is built ----------------------------------------

def _cli_build(args, tmp_path, wrap=None, **env_extra):
    """`aotconv build ARGS` (inside the shell command `wrap` % the command, if given) with an
    empty tuning cache of its own; returns (rc, stderr, records written)."""
    cache = tmp_path / "cache"
    env = dict(os.environ, AOTCONV_CACHE_DIR=str(cache), **env_extra)
    cmd = AOTCONV + ["build"] + args
    if wrap:
        cmd = ["sh", "-c", wrap.replace("{cmd}", " ".join(map(shlex.quote, cmd)))]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    records = [f for f in cache.rglob("*") if f.is_file()] if cache.exists() else []
    return p.returncode, p.stderr, records


@pytest.mark.parametrize("case", ["file", "under_file", "dollar", "paren", "newline"])
def test_unusable_output_path_fails_before_any_kernel_is_built(tmp_path, nets, case):
    f = tmp_path / "afile"
    f.write_text("x")
    path = {"file": f, "under_file": f / "sub", "dollar": tmp_path / "a$HOME",
            "paren": tmp_path / "x (copy)", "newline": tmp_path / "a\nb"}[case]
    # tuning mode: had the build gone on, it would have measured kernels and kept records
    rc, err, records = _cli_build([str(nets["beta"]), "--target", "pocl-cpu", "-o", str(path)],
                                  tmp_path)
    assert rc == 2 and records == []
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("aotconv: error: output directory")
    assert {"file": "is not a directory", "under_file": "is not a directory",
            "dollar": "'$'", "paren": "'('", "newline": "control character"}[case] in err
    assert f.read_text() == "x"
    if case != "file":
        assert not Path(path).exists()


def test_read_only_output_directory_fails_before_any_kernel_is_built(tmp_path, nets):
    out = tmp_path / "ro"
    out.mkdir()
    args = [str(nets["beta"]), "--target", "pocl-cpu", "-o", str(out)]
    wrap = None
    if os.geteuid() != 0:
        out.chmod(0o555)
    else:
        # root writes through permission bits: a read-only bind mount in a mount namespace
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) \
            if shutil.which("unshare") else None
        if probe is None or probe.returncode != 0:
            pytest.skip("running as root without unshare -m: no read-only directory to test")
        wrap = ("unshare -m sh -c 'mount --bind \"$RO\" \"$RO\" && "
                "mount -o remount,bind,ro \"$RO\" \"$RO\" || exit 99; exec \"$0\" \"$@\"' {cmd}")
    rc, err, records = _cli_build(args, tmp_path, wrap, RO=str(out))
    if rc == 99:
        pytest.skip(f"cannot mount here: {err.strip()}")
    assert rc == 2 and records == [], err
    assert len(err.strip().splitlines()) == 1
    assert "not writable" in err and str(out) in err


def test_check_output_dir_changes_nothing(tmp_path):
    out = tmp_path / "a" / "b"
    assert check_output_dir(out) == out and not (tmp_path / "a").exists()
    out.mkdir(parents=True)
    (out / "x").write_text("1")
    with pytest.raises(OutputDirError):
        check_output_dir(out)
    assert os.listdir(out) == ["x"]


# ---- lock ------------------------------------------------------------------------------

def test_second_open_of_a_locked_directory_fails_at_once(tmp_path):
    out = tmp_path / "out"
    with OutputDir(out, network="first", quiet=True):
        t = time.time()
        with pytest.raises(OutputDirError) as e:
            OutputDir(out, network="second").open()
        assert time.time() - t < 1
        assert f"another aotconv build (pid {os.getpid()}) holds the directory" in \
            one_line(e.value)
    with OutputDir(out, quiet=True) as od:            # released on exit
        assert od.staging.is_dir()


# slow tier: two builds in processes of their own, 4 s; make test keeps the directory's lock
# (test_second_open_of_a_locked_directory_fails_at_once)
@pytest.mark.slow
def test_concurrent_builds_into_one_directory(tmp_path, nets):
    """A real build holds the directory; a second build of another network fails at once with
    one line, and the first finishes with its own files only."""
    out = tmp_path / "out"
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import sys, aotconv.cli, aotconv.compiler; sys.stdin.readline(); "
         "sys.exit(aotconv.cli.main(sys.argv[1:]))", "build", str(nets["beta"]),
         "--target", "pocl-cpu", "--no-tune", "-o", str(out)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    first = subprocess.Popen(AOTCONV + ["build", "lenet5", "--target", "pocl-cpu", "--no-tune",
                                        "-o", str(out)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while first.poll() is None and time.time() < deadline and not (
                out.is_dir() and any(n.startswith(STAGING_PREFIX) for n in os.listdir(out))):
            time.sleep(0.01)
        assert first.poll() is None, "the first build ended before the second could start"
        out2, err2 = waiter.communicate("go\n", timeout=60)
        assert first.poll() is None, "the first build did not hold the directory long enough"
    finally:
        out1, err1 = first.communicate(timeout=120)
        if waiter.poll() is None:
            waiter.kill()
    assert first.returncode == 0, err1
    assert waiter.returncode == 2
    assert err2.strip() == (f"aotconv: error: output directory {out}: another aotconv build "
                            f"(pid {first.pid}) holds the directory; wait for it to finish, "
                            f"or build into another directory")
    meta = json.loads((out / "tuning.json").read_text())
    assert meta["network"] == "lenet5"
    assert not [f for f in snapshot(out) if "beta" in f]
    assert set(os.listdir(out / "kernels")) == {
        Path(f).name for f in marker(out)["files"] if f.startswith("kernels/")}


# ---- paths with spaces and shell characters -------------------------------------------------

SPECIAL = "with space #;&'\"`!*?[]{}~%"


def test_pc_flags_and_ninja_survive_special_characters(tmp_path, nets):
    out = tmp_path / SPECIAL / "out dir"
    build(nets["beta"], out)
    env = dict(os.environ, PKG_CONFIG_PATH=str(out))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "beta"], env=env,
                           capture_output=True, text=True, check=True).stdout
    assert shlex.split(flags) == [f"-I{out}", f"-L{out}", "-lbeta"]
    # a shell that reads the flags (make's recipes, eval) compiles and links against them
    app = tmp_path / "app.c"
    app.write_text('#include "beta.h"\nint main(void) { aotconv_beta_destroy(0); return 0; }\n')
    subprocess.run(["sh", "-c", f'eval "cc {shlex.quote(str(app))} -o app $(pkg-config '
                                f'--cflags --libs beta)"'],
                   env=env, cwd=tmp_path, check=True)
    assert (tmp_path / "app").exists()
    # ninja rebuilds in place from the emitted build.ninja
    (out / "beta.c").touch()
    r = subprocess.run(["ninja", "-C", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "LINK libbeta.so" in r.stdout, r.stdout + r.stderr


def test_escapes_agree_with_pkg_config_and_ninja(tmp_path):
    weird = "a b$c:d#e;f'g\"h\\i(j)"
    # ninja: a build edge whose paths and command word hold every one of them
    d = tmp_path / "n"
    d.mkdir()
    (d / weird).write_text("payload")
    (d / "build.ninja").write_text(
        "rule cp\n  command = cp $in $out\n"
        f"build {ninja_escape(weird + '.out')}: cp {ninja_escape(weird)}\n"
        f"rule echo\n  command = printf %s {ninja_shell_word(weird)} > $out\n"
        f"build echoed: echo\n")
    r = subprocess.run(["ninja"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (d / (weird + ".out")).read_text() == "payload"
    assert (d / "echoed").read_text() == weird
    # pkg-config: a .pc whose prefix holds every character pkg-config can pass on
    p = tmp_path / "p"
    p.mkdir()
    path = "/x/" + SPECIAL + "\\"
    (p / "t.pc").write_text(f"prefix={pc_escape(path)}\nName: t\nDescription: t\nVersion: 1\n"
                            "Libs: -L${prefix} -lt\nCflags: -I${prefix}\n")
    out = subprocess.run(["pkg-config", "--cflags", "--libs", "t"], capture_output=True,
                         text=True, env=dict(os.environ, PKG_CONFIG_PATH=str(p)), check=True)
    assert shlex.split(out.stdout) == [f"-I{path}", f"-L{path}", "-lt"]
    for bad in ("/x/$y", "/x/(y)", "/x/a\nb"):
        with pytest.raises(OutputDirError):
            pc_escape(bad)

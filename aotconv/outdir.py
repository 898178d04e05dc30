"""The output directory of `aotconv build`: which directory may be written, the lock against a
concurrent build, the staging directory the build writes into, and the move of its files into
place. aotconv never deletes or overwrites a file it did not write, and never follows a symlink
inside the directory.

    with OutputDir("build/net") as od:     # checked, locked, marked; before any kernel is built
        ...write every output under od.staging...
        od.commit()            # move into place; remove the previous build's stale files

The directory holds a marker, `.aotconv-build` (JSON): the files the last build wrote, with
their size and modification time, and the staging directories it made. The rules are in
docs/guarantees.md, section "Output directory".
"""
import contextlib
import errno
import fcntl
import json
import os
from pathlib import Path, PurePosixPath
import secrets
import shlex
import shutil
import stat
import sys

from . import __version__
from .errors import AotconvError

MARKER = ".aotconv-build"
MARKER_TMP = ".aotconv-build.tmp"
LOCK = ".aotconv-lock"
STAGING_PREFIX = ".aotconv-staging-"
# Subdirectories every build writes into: checked for symlinks before anything is built.
OUTPUT_SUBDIRS = ("kernels", "runtime", "obj")
# Entries of a directory that only aotconv makes: a directory holding nothing else is empty.
_OWN_ENTRIES = {LOCK, MARKER_TMP}
# pkg-config (pkgconf) drops the backslash before these, so no .pc can hand them to a shell.
_PC_UNSAFE = set("$()")
_PC_PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+,=:@^~")


class OutputDirError(AotconvError):
    """The output directory cannot be used as it is; the message says what to do."""


def pc_escape(path):
    """`path` as a .pc variable value: pkg-config --cflags/--libs print it backslash-escaped,
    so that a shell (make, eval) reads it back as one word."""
    text = str(path)
    bad = sorted(c for c in set(text) if c in _PC_UNSAFE or ord(c) < 32 or ord(c) == 127)
    if bad:
        raise OutputDirError(f"{text!r}: pkg-config cannot pass {' '.join(map(repr, bad))} "
                             f"in a path to a shell; choose a path without it")
    return "".join(c if c in _PC_PLAIN or ord(c) > 127 else "\\" + c for c in text)


def ninja_escape(path):
    """`path` as one path of a build.ninja `build` line ($, space and : are ninja syntax)."""
    text = str(path)
    if "\n" in text or "\r" in text:
        raise OutputDirError(f"{text!r}: a path with a line break cannot be written to build.ninja")
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def ninja_shell_word(word):
    """`word` inside a build.ninja command: quoted for the shell, then $ escaped for ninja."""
    return shlex.quote(str(word)).replace("$", "$$")


def _err(path, what, todo):
    """A one-line error: a path inside the output directory, what is wrong, what to do."""
    return OutputDirError(f"{path}: {what}; {todo}")


def _dir_err(path, what, todo):
    return _err(f"output directory {path}", what, todo)


_CHOOSE = "choose a new or empty directory with -o"


def check_output_dir(path):
    """Check, without creating or changing anything, that `aotconv build -o path` may write
    there: a usable path, a directory (or creatable), writable, and empty or made by aotconv.
    Returns the path; raises OutputDirError with a one-line message otherwise."""
    p = Path(os.path.abspath(os.fspath(path)))
    for text in dict.fromkeys([str(p), os.path.realpath(p)]):   # the .pc holds the real path
        _check_text(p, text)
    if p.exists():
        if not p.is_dir():
            raise _dir_err(p, "exists and is not a directory",
                           "-o names the directory to write the build into: " + _CHOOSE)
        if not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            raise _dir_err(p, "the directory is not writable (read-only, or owned by another "
                              "user)", _CHOOSE + ", or make it writable")
        _check_owned(p)
        _check_subdirs(p)
        return p
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise _dir_err(p, f"cannot be created: {parent} is not a directory", _CHOOSE)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _dir_err(p, f"cannot be created: {parent} is not writable", _CHOOSE)
    return p


def _check_text(p, text):
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise _dir_err(repr(text), "the path holds a control character (a line break?)", _CHOOSE)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _dir_err(repr(text), "the path is not valid UTF-8", _CHOOSE) from None
    bad = sorted(set(text) & _PC_UNSAFE)
    if bad:
        raise _dir_err(p, f"pkg-config cannot pass {' '.join(map(repr, bad))} of the path "
                          f"{text} to a shell (the .pc file's flags)",
                       "choose a path without it")


def _check_owned(p):
    """The directory is empty (but for aotconv's own lock) or carries aotconv's marker."""
    entries = set(os.listdir(p))
    if MARKER in entries:
        _read_marker(p)                # refuse a marker that is not ours
        return
    if entries - _OWN_ENTRIES:
        what = ("holds an aotconv build without the " + MARKER + " marker (an older "
                "aotconv's?)" if "tuning.json" in entries else
                "is not empty and was not made by aotconv build (no " + MARKER + " marker)")
        raise _dir_err(p, f"{what}; aotconv writes only into a new or empty directory or one "
                          f"it built", f"{_CHOOSE}, or empty or remove {p} yourself")


def _check_subdirs(p):
    for sub in OUTPUT_SUBDIRS:
        _check_dir(p / sub)


def _check_dir(q):
    """`q`, a directory aotconv writes its outputs in, is a real directory or absent."""
    if q.is_symlink():
        raise _symlink_error(q)
    if q.exists() and not q.is_dir():
        raise _err(q, "is not a directory but aotconv writes its outputs there",
                   f"move it away or {_CHOOSE}")


def _symlink_error(q):
    return _err(q, "is a symlink; aotconv never writes or deletes through a symlink in its "
                   "output directory", f"remove the link or {_CHOOSE}")


def _read_marker(p):
    m = p / MARKER
    try:
        if m.is_symlink() or not m.is_file():
            raise ValueError("not a regular file")
        doc = json.loads(m.read_text())
        files = doc["files"]
        staging = doc.get("staging", [])
        if not isinstance(files, dict) or not isinstance(staging, list):
            raise ValueError("bad layout")
        for rel, st in files.items():
            _relpath(rel)
            if not (isinstance(st, list) and len(st) == 2 and all(isinstance(x, int) for x in st)):
                raise ValueError(f"bad entry for {rel}")
        for name in staging:
            if not (isinstance(name, str) and name.startswith(STAGING_PREFIX) and "/" not in name):
                raise ValueError(f"bad staging entry {name!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise _err(m, f"not a readable aotconv build record ({e})",
                   f"{_CHOOSE}, or remove {p} yourself") from None
    return doc


def _relpath(rel):
    """A manifest entry: a relative path inside the directory, never '..' nor absolute."""
    pp = PurePosixPath(rel)
    if not rel or pp.is_absolute() or any(part in ("..", ".", "") for part in pp.parts) \
            or str(pp) != rel:
        raise ValueError(f"path {rel!r} outside the directory")
    return pp


class OutputDir:
    """One build's hold on its output directory (a context manager): checked, locked against a
    concurrent build and marked on entry; outputs are written under `staging` and moved into
    place by commit(). Without commit (a failure, an interrupt) the directory keeps the
    previous build; the staging directory is left for inspection and removed by the next build."""

    def __init__(self, path, network=None, quiet=False):
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.network = network
        self.quiet = quiet
        self.staging = None
        self.committed = False
        self._fd = None
        self._doc = None

    # ---- entry: check, lock, mark, stage -------------------------------------------------
    def open(self):
        p = check_output_dir(self.path)
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _dir_err(p, f"cannot create the directory ({e.strerror})", _CHOOSE) from None
        created = self._lock()
        try:
            try:
                _check_owned(p)        # again, now that no other build can change it
            except OutputDirError:
                if created:            # changed between the check and the lock: leave no trace
                    os.unlink(p / LOCK)
                raise
            _check_subdirs(p)
            doc = _read_marker(p) if (p / MARKER).exists() else None
            self._doc = doc = doc or dict(files={}, staging=[])
            for rel in doc["files"]:       # nothing of the last build became a symlink
                self._check_parents(rel)
                if (p / rel).is_symlink():
                    raise _symlink_error(p / rel)
            self._remove_old_staging()
            # recorded before it exists: an interrupt leaves no staging directory unaccounted
            name = STAGING_PREFIX + secrets.token_hex(4)
            doc["staging"] = doc["staging"] + [name]
            self._write_marker(state=doc.get("state", "empty"))
            self.staging = p / name
            self.staging.mkdir()
        except BaseException:
            self._unlock()
            raise
        return self

    def _lock(self):
        """Take the lock; True when this call created the lock file."""
        path = self.path / LOCK
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                fd, created = os.open(path, flags), False
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _symlink_error(path) from None
            raise _dir_err(self.path, f"cannot create the lock file {LOCK} ({e.strerror})",
                           _CHOOSE + ", or make it writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip()
            finally:
                os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise _dir_err(self.path, f"another aotconv build{who} holds the directory",
                           "wait for it to finish, or build into another directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return created

    def _unlock(self):
        if self._fd is not None:
            os.close(self._fd)         # releases the flock; the file stays (no unlink race)
            self._fd = None

    def _remove_old_staging(self):
        """Staging directories of earlier builds that failed or were interrupted (recorded in
        the marker, so made by aotconv): removed; a symlink there is left alone."""
        keep = []
        for name in self._doc["staging"]:
            q = self.path / name
            if q.is_symlink():
                keep.append(name)
            elif q.is_dir():
                shutil.rmtree(q)       # does not follow symlinks inside
        self._doc["staging"] = keep

    def _check_parents(self, rel):
        """Every directory between the output directory and `rel` is a real directory (or
        absent): nothing is written or deleted through a symlink."""
        q = self.path
        for part in PurePosixPath(rel).parts[:-1]:
            q = q / part
            _check_dir(q)

    def _write_marker(self, state):
        doc = dict(self._doc, aotconv=__version__, network=self.network, state=state)
        tmp = self.path / MARKER_TMP
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / MARKER)
        self._doc = doc

    # ---- commit: move the staged files into place ------------------------------------------
    def staged_files(self):
        """{relative path: [size, mtime_ns]} of every file under the staging directory."""
        files = {}
        for root, dirs, names in os.walk(self.staging):
            for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                full = os.path.join(root, name)
                st = os.lstat(full)
                rel = PurePosixPath(os.path.relpath(full, self.staging)).as_posix()
                if not stat.S_ISREG(st.st_mode):
                    raise OutputDirError(f"{full}: the build made something other than a file "
                                         f"(a symlink?); aotconv moves only files into {self.path}")
                files[rel] = [st.st_size, st.st_mtime_ns]
        return files

    def commit(self):
        """Move every staged file into the output directory (each by one atomic rename), then
        remove the files of the previous build that this one did not write again, if they are
        unchanged since. Everything is checked before the first file moves."""
        new = self.staged_files()
        prev = self._doc["files"]
        for rel in sorted(new):
            self._check_parents(rel)
            dst = self.path / rel
            if dst.is_symlink():
                raise _symlink_error(dst)
            if dst.is_dir():
                raise _err(dst, "is a directory where the build writes a file",
                           f"move it away or {_CHOOSE}")
            if dst.exists() and rel not in prev:
                raise _err(dst, "exists and was not written by aotconv's previous build here; "
                                "aotconv never overwrites a file it did not write",
                           f"move it away or {_CHOOSE}")
        # while files move, the marker lists both builds' files: an interrupted commit leaves
        # nothing the next build cannot account for
        self._doc["files"] = dict(prev, **new)
        self._write_marker(state="committing")
        for rel in sorted(new):
            (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.staging / rel, self.path / rel)
        kept = self._remove_stale(prev, new)
        self._doc["files"] = new
        self._doc["staging"] = [n for n in self._doc["staging"] if n != self.staging.name]
        self._write_marker(state="complete")
        shutil.rmtree(self.staging)    # empty directories only by now
        self.committed = True
        for rel in kept:
            self._log(f"aotconv: kept {self.path / rel}: the previous build wrote it but it "
                      f"changed since")

    def _remove_stale(self, prev, new):
        kept = []
        for rel in sorted(set(prev) - set(new)):
            q = self.path / rel
            try:
                self._check_parents(rel)
                st = os.lstat(q)
            except (OutputDirError, FileNotFoundError, NotADirectoryError):
                continue
            if not stat.S_ISREG(st.st_mode) or [st.st_size, st.st_mtime_ns] != prev[rel]:
                kept.append(rel)
                continue
            os.unlink(q)
        return kept

    # ---- exit -------------------------------------------------------------------------------
    def close(self, failed=False):
        try:
            if not self.committed and self.staging is not None and self.staging.is_dir():
                if not any(self.staging.iterdir()):
                    self.staging.rmdir()
                    self._doc["staging"] = [n for n in self._doc["staging"]
                                            if n != self.staging.name]
                    with contextlib.suppress(OSError):
                        self._write_marker(state=self._doc.get("state", "empty"))
                elif failed:
                    self._log(f"aotconv: the build did not finish; {self.path} still holds the "
                              f"previous build; this build's files are in {self.staging} "
                              f"until the next build there")
        finally:
            self._unlock()

    def _log(self, msg):
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        self.close(failed=exc_type is not None)

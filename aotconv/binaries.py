"""How the emitted library makes its OpenCL programs: one joined program or one per layer, and
the device binaries (CL_PROGRAM_BINARIES) built here, at build time, to embed beside the source.

create() compiling every program from source costs seconds on a cold driver cache (PoCL:
LLVM; NVIDIA: the front end before ptxas), and each program costs its own driver call. So:

- The layers' sources are joined into one program per network where that is verified: each
  section is wrapped so that it cannot see or clash with another (its top-level helpers are
  renamed by a #define before it, every macro it defines and every rename is #undef'd after
  it), and the joined program is built on the target device here. Where it does not build,
  or the device is absent, the programs stay one per layer, as they always compile.
- Where the device's compiler is slow (a GPU's: NVIDIA's took 17.8-22.3 s for a tuned
  ResNet-50 b1's 757 kB of source, and ptxas 7-11 s more, one thread each), the layers are
  joined into a few programs instead, each of a run of layers of about GROUP_BYTES of source
  (at most one per core), built at the same time here: create() makes each from its binary in
  a millisecond or two, and the library's build takes a fraction of the time (groups_for).
- Where the target's device is present, the programs (the joined one, or each layer's) are
  built on it and their binaries embedded with the device's name and driver version. create()
  uses a binary only on a device of that name and driver version, falls back to the embedded
  source when the driver rejects it, and says which it did (aotconv_<net>_program_source).

On NVIDIA, CL_PROGRAM_BINARIES is PTX, which the driver still compiles at create() (seconds for a
network on a cold compute cache). NVIDIA's OpenCL also takes the device's own machine code (a cubin
from ptxas) as a program binary, and builds that in milliseconds: where ptxas is found (PATH,
$CUDA_HOME/bin, /usr/local/cuda/bin), the PTX is assembled for the device's compute capability, the
cubin is built on the device here, and it is embedded instead of the PTX; where ptxas is missing or
fails, or the driver rejects the cubin, the PTX is embedded as before.

On PoCL, CL_PROGRAM_BINARIES bundles PoCL's cache directory of the program: its LLVM bitcode,
a generic work-group function per kernel, and every work-group function compiled so far. PoCL
compiles a kernel's work-group function for its local size (and whether the global offset is
zero and the grid small) at the kernel's first launch of that geometry, 0.1-0.2 s a kernel on
two cores, and only then: a `reqd_work_group_size` attribute does not make PoCL 3.1 compile it
any earlier. So where the target's device is PoCL, every distinct launch of the library (its
kernel, global and local size, as the emitted runtime enqueues it) is made once on the built
program, on zeroed buffers, before the binary is read: the binary then carries the compiled
work-group functions, and the library's first run() compiles nothing (warm_up).

A build for an absent target embeds source only and says so; `aotconv build --no-binaries`
embeds none. The runtime side is runtime_c/rt_program.c.
"""
from dataclasses import dataclass
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import ptx
from .harness import BUILD_OPTIONS

# source bytes per joined program where the device's compiler is slow (by target kind; a kind
# not listed joins every layer into one program): NVIDIA's compiler and ptxas each take one
# thread, 0.034-0.037 ms a byte of a tuned network (results/h100/real-nets.md)
GROUP_BYTES = {"gpu": 96_000}


@dataclass(frozen=True)
class ProgramPlan:
    joined: bool              # the layers' sections made as joined programs (verified on the
                              # device): one, or one per run of layers (group_of)
    sections: tuple           # ((prologue, epilogue), ...) per layer program
    blobs: tuple = ()         # binaries: one per joined program, else one per program
                              # (None: none)
    device: str = None        # CL_DEVICE_NAME of the device they were built on
    driver: str = None        # its CL_DRIVER_VERSION
    note: str = ""            # one line: what the library embeds, or why no binaries
    warmed: int = 0           # launch geometries compiled into the binaries (PoCL: warm_up)
    group_of: tuple = ()      # when joined: per layer program, the joined program holding it
                              # (empty: all in one)

    @property
    def binary_bytes(self):
        return sum(len(b) for b in self.blobs if b)

    @property
    def has_binaries(self):
        return any(self.blobs)

    def group(self, i):
        """The joined program that holds layer program `i` (0 when not joined)."""
        return self.group_of[i] if self.joined and self.group_of else 0

    @property
    def joined_count(self):
        """How many joined programs there are: 0 when the programs are one per layer."""
        if not self.joined:
            return 0
        return max(self.group_of) + 1 if self.group_of else 1

    @property
    def what(self):
        """The programs in words: one for the network, k joined, or one per layer."""
        return programs_what(self.joined_count)


def programs_what(k):
    """`k` joined programs in words (0: the programs are one per layer)."""
    return ("one program per layer" if k == 0 else "one program for the network"
            if k == 1 else f"{k} programs, each joining a run of layers")


def groups_for(sizes, kind, cores=None):
    """[the joined program of each layer program] for programs of `sizes` source bytes, in
    order: all in one where `kind` is not in GROUP_BYTES or there are too few, else contiguous
    runs of about GROUP_BYTES (as many as the bytes call for, at most `cores`, default this
    host's), cut where the running total of bytes crosses an equal share."""
    per = GROUP_BYTES.get(kind)
    total = sum(sizes)
    k = 1 if not per or not total else min(len(sizes), max(1, cores or os.cpu_count() or 1),
                                           -(-total // per))
    if k <= 1:
        return [0] * len(sizes)
    out, acc = [], 0
    for n in sizes:
        out.append(min(k - 1, int((acc + n / 2) * k / total)))
        acc += n
    renumber = {g: i for i, g in enumerate(dict.fromkeys(out))}
    return [renumber[g] for g in out]


# -- joining ---------------------------------------------------------------------------------

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.M)
_CALLED = re.compile(r"([A-Za-z_]\w*)\s*\(")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_KERNEL = re.compile(r"\b(?:__kernel|kernel)\b")
_NOT_NAMES = {"__attribute__", "__attribute"}


def top_level_names(source):
    """The names a program source defines at file scope other than its kernels: helper
    functions (`inline float leaky(...) {...}`) and global constants (`__constant float t[] =
    {...};`). Preprocessor lines and comments are skipped; braces are counted."""
    text = _DIRECTIVE.sub("", _COMMENTS.sub(" ", source))
    names, depth, stmt, initializer = [], 0, "", False
    for ch in text:
        if depth:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            continue
        if ch == "{":
            head = stmt.split("=")[0]
            if "=" in stmt:                       # a global's initializer
                initializer = True
                name = _IDENT.findall(head.split("[")[0])
                names += name[-1:]
            elif "(" in stmt and not _KERNEL.search(stmt):
                names += [n for n in _CALLED.findall(stmt) if n not in _NOT_NAMES][:1]
            depth, stmt = 1, ""
        elif ch == ";":
            if stmt.strip() and not initializer and not _KERNEL.search(stmt):
                if "(" in stmt and "=" not in stmt:   # a prototype
                    names += [n for n in _CALLED.findall(stmt) if n not in _NOT_NAMES][:1]
                else:                                 # a global without a braced initializer
                    name = _IDENT.findall(stmt.split("=")[0].split("[")[0])
                    names += name[-1:]
            stmt, initializer = "", False
        else:
            stmt += ch
    return list(dict.fromkeys(names))


def join_sections(sources, stems):
    """((prologue, epilogue), ...): the text around each source in the joined program. The
    prologue renames the source's top-level helpers to <name>__<stem> (stems are the unique
    kernel-file names); the epilogue #undefs them and every macro the source defines, so the
    next section starts from a clean preprocessor state."""
    out = []
    for src, stem in zip(sources, stems):
        helpers = top_level_names(src)
        macros = list(dict.fromkeys(_DEFINE.findall(src)))
        pro = "".join(f"#define {h} {h}__{stem}\n" for h in helpers)
        epi = "".join(f"#undef {m}\n" for m in list(dict.fromkeys(macros + helpers)))
        out.append((f"\n/* ---- {stem} ---- */\n" + pro, "\n" + epi))
    return tuple(out)


def joined_source(sources, sections):
    """The joined program's text, as create() hands it to the driver (one string per piece)."""
    return "".join(pro + src + epi for src, (pro, epi) in zip(sources, sections))


# -- building on the device ------------------------------------------------------------------

def plan(programs, ctx, binaries=True, log=None, launches=(), buffers=(), measurer=None):
    """The ProgramPlan of `programs` (schedule.Program) for the build context `ctx`.
    `launches` (schedule.LaunchRow, `program` indexing `programs`) and `buffers`
    (schedule.Buffer) are the library's: where the device compiles code at a kernel's launch
    (PoCL), they are launched once before the binaries are read (warm_up). `measurer`: the
    build's (tune.measure.Measurer), whose builder processes, started by its searches with
    their device contexts, build the joined programs made elsewhere (_built_elsewhere)."""
    log = log or (lambda msg: None)
    sources = [p.source for p in programs]
    sections = join_sections(sources, [p.file for p in programs])
    name = ctx.profile.name
    if not ctx.present:
        return ProgramPlan(False, sections, note=(
            f"the {name} device was not present at build time: the library embeds OpenCL "
            f"source only, one program per layer, compiled by create()"))
    try:
        return _on_device(programs, sources, sections, ctx, binaries, log, launches, buffers,
                          measurer)
    except Exception as e:     # binaries and joining only speed create() up: never fail a build
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        log(f"aotconv: warning: building the programs on the {name} device failed ({why}); "
            f"the library embeds OpenCL source only")
        return ProgramPlan(False, sections, note=(
            f"building the programs on the device failed at build time ({why}): the library "
            f"embeds OpenCL source only, one program per layer, compiled by create()"))


def _on_device(programs, sources, sections, ctx, binaries, log, launches, buffers,
               measurer=None):
    """plan() where the target's device is present."""
    import pyopencl as cl
    device = ctx.found[1]
    cctx = cl.Context([device])
    # as runtime_c/rt_program.c compares them: trailing blanks dropped
    dev_name, driver = device.name.rstrip(), device.driver_version.rstrip()

    def build(text):
        try:
            return ptx.program(cl, cctx, text, BUILD_OPTIONS), None
        except cl.Error as e:
            return None, str(e).strip().splitlines()[0] if str(e).strip() else "failed"

    native = Native(device, cctx) if binaries else None
    warm = binaries and bool(launches) and compiles_at_launch(device)
    warmed = 0

    def warmed_up(built):
        """{program index: cl.Program} launched where the device compiles at launch (PoCL),
        before any binary of it is read: PoCL serialises a program's binary once, at the
        first CL_PROGRAM_BINARIES query."""
        nonlocal warm, warmed
        if warm:
            try:
                warmed += warm_up(cctx, device, built, launches, buffers)
            except Exception as e:     # the binary only loses the compiled launches
                first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                log(f"aotconv: warning: launching the kernels on {dev_name} before reading "
                    f"the binaries failed ({type(e).__name__}: {first}); the library's first "
                    f"run() compiles PoCL's work-group functions")
                warm, warmed = False, 0

    t0 = time.monotonic()
    group_of = groups_for([len(s) for s in sources], getattr(ctx.profile, "kind", None))
    ngroups = max(group_of) + 1 if group_of else 0
    members = [[i for i, g in enumerate(group_of) if g == k] for k in range(ngroups)]
    texts = [joined_source([sources[i] for i in m], [sections[i] for i in m]) for m in members]
    joined, why, data = None, "a single program", None
    if len(sources) > 1:
        if ngroups > 1 and binaries and not warm:
            # a driver builds one program at a time in a process (NVIDIA: 9 joined programs
            # of ResNet-50 b1 in 20.0 s in threads, as one of them all): one process each,
            # the measurer's builders where a search started them (their start and device
            # context paid already), else new ones
            idle = _idle_builders(measurer)
            try:
                data, why = _built_elsewhere(ctx.target, texts,
                                             **({"builders": idle} if idle else {}))
            finally:
                _give_back(measurer, idle)
            if data is not None:
                joined = [None] * len(texts)
        else:
            with ThreadPoolExecutor(max(1, len(texts))) as pool:
                built = list(pool.map(build, texts))
            why = next((e for p, e in built if p is None), None)
            joined = [p for p, _ in built] if why is None else None
        log(f"aotconv: programs: {len(texts)} joined program{'s' if len(texts) != 1 else ''} "
            f"{'built' if joined is not None else 'tried'} on {dev_name} in "
            f"{time.monotonic() - t0:.1f} s")
    if joined is not None:
        if binaries:
            warmed_up({i: joined[group_of[i]] for i in range(len(programs))})
        t0 = time.monotonic()
        if binaries:
            names = [sorted({r.kernel for r in launches if group_of[r.program] == k})
                     for k in range(len(joined))]
            with ThreadPoolExecutor(len(joined)) as pool:       # ptxas, one process each
                blobs = tuple(pool.map(native.binary, joined, data or [None] * len(joined),
                                       names))
            log(f"aotconv: programs: {'its binary' if len(joined) == 1 else 'their binaries'} "
                f"({native.what()}) in {time.monotonic() - t0:.1f} s")
        else:
            blobs = ()
        how = programs_what(len(joined))
    else:
        if len(sources) > 1:
            log(f"aotconv: the joined program does not build on {dev_name} ({why}): one "
                f"program per layer")
        blobs = []
        if binaries:
            built = {}
            for i, (p, src) in enumerate(zip(programs, sources)):
                prog, err = build(src)
                if prog is None:
                    log(f"aotconv: warning: layer '{p.layer}': its program does not build on "
                        f"{dev_name} ({err}); its source alone is embedded")
                else:
                    built[i] = prog
            warmed_up(built)
            blobs = [native.binary(built[i]) if i in built else None
                     for i in range(len(programs))]
        blobs = tuple(blobs)
        how = f"{len(sources)} program{'s' if len(sources) != 1 else ''}, one per layer"
    if not binaries:
        note = f"{how}; device binaries off (--no-binaries): source only, compiled by create()"
    elif not any(blobs):
        note = f"{how}; no program built on {dev_name}: source only"
    else:
        size = sum(len(b) for b in blobs if b)
        one = joined is not None and len(joined) == 1
        note = (f"{how}, with {'its' if one else 'their'} device binar"
                f"{'y' if one else 'ies'} ({native.what()}, {size / 1024:.0f} KiB) "
                f"for {dev_name} (driver {driver}) beside the source")
        if warmed:
            note += (f"; the work-group functions of the library's {warmed} launch geometr"
                     f"{'y' if warmed == 1 else 'ies'} compiled in")
    return ProgramPlan(joined is not None, sections, blobs, dev_name, driver, note,
                       warmed if any(blobs) else 0,
                       tuple(group_of) if joined is not None and ngroups > 1 else ())


def _built_elsewhere(target, texts, builders=(), timeout=600.0):
    """([CL_PROGRAM_BINARIES of each of `texts`], None), each built on `target`'s device in a
    process of its own (aotconv.tune.measure's builder), all at once; or (None, why) where one
    fails, with the first failure. `builders`: started builder processes (tune.measure.Worker)
    to build them in, one text each (they are left running); the texts beyond them get new
    processes, closed after."""
    from .tune.measure import Worker, build_binary
    given = list(builders)

    def one(k):
        w = given[k] if k < len(given) else Worker()
        try:
            return w.call(build_binary, (target, texts[k], BUILD_OPTIONS, True), timeout)
        except Exception as e:           # the worker died or ran out of time
            return "fail", f"{type(e).__name__}: {e}", None
        finally:
            if k >= len(given):
                w.kill()
    with ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(one, range(len(texts))))
    for status, value, _ in got:
        if status != "ok" or not value:
            first = str(value or "no binary").strip().splitlines()
            return None, first[0][:200] if first else status
    return [value for _, value, _ in got], None


def _idle_builders(measurer):
    """The builder processes of `measurer` (tune.measure.Measurer.builders) idle now, taken
    from it until _give_back; none where it has none (a tuning farm, no measurer)."""
    q = getattr(measurer, "builders", None)
    out = []
    while q is not None:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            break
    return out


def _give_back(measurer, builders):
    for w in builders:
        measurer.builders.put(w)


# -- PoCL: the work-group functions compiled at launch ------------------------------------------

def compiles_at_launch(device):
    """Whether `device` compiles kernel code at a kernel's launch that its program binary then
    carries: PoCL (its CL_DEVICE_VERSION names it: "OpenCL 3.0 PoCL HSTR: ..."). The other
    drivers' binaries are what clBuildProgram made; a launch adds nothing to them."""
    try:
        return "POCL" in (device.version or "").upper() or \
            "PORTABLE COMPUTING LANGUAGE" in (device.platform.name or "").upper()
    except Exception:
        return False


def geometries(launches, programs):
    """The distinct launches of `launches` whose program is in `programs`, setup launches
    first (load_params makes them before any run()), in the library's order: one per
    (program, kernel, global size, local size), the key of the code PoCL compiles at launch."""
    seen, out = set(), []
    for l in sorted(launches, key=lambda l: l.phase != "setup"):
        key = (l.program, l.kernel, tuple(l.gsize), tuple(l.lsize))
        if l.program in programs and key not in seen:
            seen.add(key)
            out.append(l)
    return out


def warm_up(cctx, device, programs, launches, buffers):
    """Launch each of geometries(launches, programs) once on `programs` ({program index:
    built cl.Program}) as the emitted runtime does (runtime_c/rt_run.c: no global offset, the
    local size or NULL where the launch has none), with the library's `buffers` zeroed and the
    launch's own int and float arguments; the number of launches made. What the kernels
    compute is dropped: the launches only make PoCL compile their work-group functions."""
    import numpy as np
    import pyopencl as cl
    todo = geometries(launches, programs)
    if not todo:
        return 0
    queue = cl.CommandQueue(cctx, device)
    mems = {}

    def mem(i):
        if i not in mems:
            size = max(int(buffers[i].bytes), 4)
            mems[i] = cl.Buffer(cctx, cl.mem_flags.READ_WRITE, size)
            cl.enqueue_fill_buffer(queue, mems[i], np.uint8(0), 0, size)
        return mems[i]

    kernels = {}
    try:
        for l in todo:
            try:
                k = kernels.get((l.program, l.kernel))
                if k is None:
                    k = kernels[(l.program, l.kernel)] = cl.Kernel(programs[l.program],
                                                                   l.kernel)
                for a, (kind, v) in enumerate(l.args):
                    k.set_arg(a, mem(v) if kind == "buf" else
                              np.int32(v) if kind == "int" else np.float32(v))
                cl.enqueue_nd_range_kernel(queue, k, tuple(l.gsize), tuple(l.lsize) or None)
            except cl.Error as e:
                raise cl.Error(f"layer '{l.layer}', kernel {l.kernel}: {e}") from None
        queue.finish()
    finally:
        for m in mems.values():
            m.release()
    return len(todo)


def _binary(program):
    import pyopencl as cl
    data = program.get_info(cl.program_info.BINARIES)[0]
    return bytes(data) if data else None


# -- NVIDIA: machine code instead of PTX ---------------------------------------------------------

CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV = 0x4000
CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV = 0x4001
PTXAS_TIMEOUT_S = 300


def find_ptxas(env=None):
    """Path of ptxas: on PATH, else under $CUDA_HOME/bin or /usr/local/cuda/bin; None if none."""
    env = os.environ if env is None else env
    found = shutil.which("ptxas", path=env.get("PATH"))
    if found:
        return found
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(Path(root, "bin", "ptxas"), os.X_OK):
            return str(Path(root, "bin", "ptxas"))
    return None


def assemble(ptx, arch, ptxas):
    """(cubin bytes, None) or (None, why): `ptx` (the driver's PTX) assembled by `ptxas` for
    `arch` (sm_XY)."""
    if not re.fullmatch(r"sm_\d{2,3}[a-z]?", arch):
        return None, f"not a compute capability: {arch!r}"
    with tempfile.TemporaryDirectory(prefix="aotconv-ptxas-") as tmp:
        src, out = Path(tmp, "program.ptx"), Path(tmp, "program.cubin")
        src.write_bytes(ptx.rstrip(b"\0"))
        try:
            # PTX rewritten for sm_90a (aotconv.ptx) is assembled for that architecture
            if arch == "sm_90" and re.search(rb"^\s*\.target\s+sm_90a", ptx, re.M):
                arch = "sm_90a"
            r = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(out)],
                               capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"ptxas did not run: {type(e).__name__}: {e}"
        if r.returncode != 0 or not out.is_file():
            last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            return None, f"ptxas failed: {last[:200]}"
        return out.read_bytes(), None


class Native:
    """The binary to embed for a built program: on an NVIDIA device with ptxas at hand, its
    PTX assembled into a cubin and checked on the device (built, every kernel created); else
    the driver's own CL_PROGRAM_BINARIES. Counts what it embedded for the build's note."""

    def __init__(self, device, cctx):
        self.device, self.cctx = device, cctx
        self.arch = self.ptxas = None
        self.counts = {"cubin": 0, "driver": 0}
        self.why = None
        self._lock = threading.Lock()           # binary() runs in threads, one per program
        if not ptx.is_nvidia(device):
            return
        try:
            major = device.get_info(CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV)
            minor = device.get_info(CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV)
        except Exception as e:      # an NVIDIA driver without the attribute query
            self.why = f"no compute capability ({type(e).__name__})"
            return
        self.arch = f"sm_{major}{minor}"
        self.ptxas = find_ptxas()
        if self.ptxas is None:
            self.why = "no ptxas (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"

    def binary(self, program, data=None, names=None):
        """The binary of `program` (a built cl.Program), or of `data` (its
        CL_PROGRAM_BINARIES, built elsewhere) whose kernels are `names`."""
        if data is None:
            data = _binary(program)
        if data and self.arch and self.ptxas and self.why is None:
            cubin, why = assemble(data, self.arch, self.ptxas)
            if cubin is not None:
                why = self._verify(cubin, program, names)
            with self._lock:
                if why is None:
                    self.counts["cubin"] += 1
                    return cubin
                # the first failure stands for the rest: PTX from here
                self.why = self.why or why
        if data:
            with self._lock:
                self.counts["driver"] += 1
        return data

    def _verify(self, cubin, program, names=None):
        """None where the driver builds `cubin` and makes each kernel of it (`names`, default
        those of `program`), else why not."""
        import pyopencl as cl
        if names is None:
            names = [n for n in program.get_info(cl.program_info.KERNEL_NAMES).split(";") if n]
        try:
            prog = cl.Program(self.cctx, [self.device], [cubin]).build(options=list(BUILD_OPTIONS))
            for name in names:
                cl.Kernel(prog, name)
        except Exception as e:
            return f"the driver rejected the cubin: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return None

    def what(self):
        """What the binaries are, for the build's note."""
        if self.counts["cubin"] and not self.counts["driver"]:
            return f"{self.arch} machine code from ptxas"
        kind = "PTX" if self.arch else "the driver's binary"
        if self.counts["cubin"]:
            return f"{self.arch} machine code for {self.counts['cubin']}, {kind} for the rest ({self.why})"
        return kind + (f", not machine code: {self.why}" if self.arch and self.why else "")

"""Write a build directory: kernels/*.cl, <net>.c (with <net>_binaries.h where device binaries
were built), <net>.h, build.ninja, <net>.pc, <net>Config.cmake, tuning.json.

Only text is produced here; aotconv.build runs ninja and aotconv.report writes report.md.
"""
import functools
import json
import math
import os
from pathlib import Path
import re
import shutil
import subprocess

from mako.lookup import TemplateLookup

from . import __version__, precision
from .errors import AotconvError
from .variants.base import TEMPLATE_DIR
from .harness import BUILD_OPTIONS
from .names import c_comment, c_ident
from .names import c_string as c_literal
from .layouts import layouts_of

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime_c"
_lookup = TemplateLookup(directories=[str(TEMPLATE_DIR)], strict_undefined=True)


def c_string(text):
    """`text` as a C string literal, one source line per literal piece, readable in the .c
    (each piece escaped by names.c_string, so any text is safe)."""
    return "\n".join(f"    {c_literal(line)}" for line in text.splitlines(keepends=True) or [""])


def _pattern(regex):
    """Target regexes are simple ('|' alternatives, '.*'); drop regex escapes for the C matcher."""
    return re.sub(r"\\(.)", r"\1", regex)


def _param_macros(sch):
    """[(macro, offset, comment)] of the parameter tensors in the user's layout (the network as
    written, schedule.Schedule.param_layout); two tensors one macro is an error (spec.py keeps
    layer C names apart ignoring case; this holds for any Network)."""
    out, seen = [], {}
    for lname, tname, shape, off in sch.param_layout():
        macro = c_ident(f"{lname}_{tname}").upper()
        if macro in seen:
            raise AotconvError(f"layers '{seen[macro]}' and '{lname}' both give the header macro "
                               f"..._PARAM_{macro}_OFFSET; rename one of them")
        seen[macro] = lname
        out.append(dict(macro=macro, offset=off,
                        shape=f"{lname}.{tname} " + "x".join(map(str, shape))))
    return out


def check_net_name(name, cc=None):
    """Raise when the network name is a macro of the headers the runtime includes (NULL,
    stdout, CL_SUCCESS...): the build pastes it into the runtime's symbols as AOTRT_NS.

    Asks the C compiler that will build the library; when it cannot run, ninja reports."""
    cc = cc or os.environ.get("CC", "cc")
    if name in _header_macros(cc):
        raise AotconvError(f"the network name '{name}' is a macro of the C headers the library "
                           f"is built with ({cc}); rename the network (`name:` in the net.yaml)")


@functools.lru_cache(maxsize=None)
def _header_macros(cc):
    """Every macro defined after the runtime's includes, by `cc` (empty when it cannot run)."""
    macros = set()
    for src in sorted(RUNTIME_DIR.glob("*.c")):
        try:
            proc = subprocess.run(cc.split() + ["-std=c11", "-dM", "-E", "-DAOTRT_NS=aotconv_ns",
                                                f"-I{RUNTIME_DIR}", str(src)],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return frozenset()
        if proc.returncode != 0:
            return frozenset()
        macros.update(m.group(1) for m in re.finditer(r"^#define ([A-Za-z_]\w*)", proc.stdout,
                                                       re.M))
    return frozenset(macros)


def _inputs_of(lib):
    """The header's rows of the network's inputs, in order: name, its macro (C name upper-cased;
    spec.py keeps inputs' C names apart), shape, floats at the largest size, of one sample, and
    offset in host_buffers' input memory."""
    out, off, seen = [], 0, {}
    for (tname, shape), (_, c) in zip(lib.net.inputs, lib.inputs):
        macro = c_ident(tname).upper()
        if macro in seen:
            raise AotconvError(f"the inputs '{seen[macro]}' and '{tname}' both give the header "
                               f"macro ..._INPUT_INDEX_{macro}; rename one of them")
        seen[macro] = tname
        out.append(dict(name=tname, macro=macro, shape=tuple(shape), count=c,
                        sample=c // lib.largest.batch, offset=off))
        off += c
    return out


def _arg_c(a):
    kind, v = a
    if kind == "buf":
        return f"{{AOTRT_ARG_BUF, {v}, 0, 0.0f}}"
    if kind == "int":
        return f"{{AOTRT_ARG_INT, 0, {int(v)}, 0.0f}}"
    return f"{{AOTRT_ARG_FLOAT, 0, 0, {float(v)!r}f}}"


def _render(template, **ns):
    return _lookup.get_template(template).render(**ns)


def memory_of(sch):
    """{kind: bytes} of the device buffers create() allocates (the header's *_BYTES)."""
    by = {k: sum(b.bytes for b in sch.buffers if b.kind == kind)
          for k, kind in (("activation", "act"), ("parameter", "param"), ("variant", "extra"),
                          ("scratch", "scratch"))}
    by["device"] = sum(b.bytes for b in sch.buffers)
    return by


_OCTAL = tuple(f"\\{b:03o}" for b in range(256))


def binary_array(blob):
    """A C initializer of `blob`'s bytes: string literals of three-digit octal escapes, 32
    bytes to a line (a C array of exactly len(blob) chars takes no terminating NUL). A
    compiler reads a literal an order of magnitude faster than a list of numbers: megabytes of
    a cubin in a fraction of a second, not seconds."""
    if not blob:
        return '""'
    return "\n".join('"' + "".join(_OCTAL[b] for b in blob[i:i + 32]) + '"'
                     for i in range(0, len(blob), 32))


def library_of(sch):
    """The batches.Library of `sch`: itself, or a Schedule's one size."""
    from .batches import Library, merge
    return sch if isinstance(sch, Library) else merge([(sch.net.input_shape[0], sch)])


def emit(sch, target, outdir, cc=None, prefix=None, programs=None):
    """Write every generated text file of `sch` (a Schedule, or a batches.Library of several
    batch sizes) into `outdir`, a new empty directory (aotconv.outdir's staging; nothing is
    deleted here). `prefix`: the directory the files end up in, for the .pc (default `outdir`).
    `programs`: the binaries.ProgramPlan (default: one program per layer, source only)."""
    from .binaries import ProgramPlan, join_sections
    lib = library_of(sch)
    if programs is None:
        programs = ProgramPlan(False, join_sections([p.source for p in lib.programs],
                                                    [p.file for p in lib.programs]),
                               note="built without a program plan: source only")
    net = lib.net
    name = c_ident(net.name)
    check_net_name(name, cc)
    out = Path(outdir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    for p in lib.programs:
        (out / "kernels" / f"{p.file}.cl").write_text(p.source)

    runtime = out / "runtime"
    shutil.copytree(RUNTIME_DIR, runtime)

    launches = []
    for l in lib.launches:
        dims = len(l.gsize)
        g = list(l.gsize) + [1] * (3 - dims)
        loc = list(l.lsize) + [1] * (3 - len(l.lsize)) if l.lsize else [0, 0, 0]
        launches.append(dict(layer=l.layer, kernel=l.kernel, program=l.program, phase=l.phase,
                             nargs=len(l.args), args=[_arg_c(a) for a in l.args] or ["{0}"],
                             dims=dims, **{"global": ", ".join(map(str, g))},
                             local=", ".join(map(str, loc))))
    params = _param_macros(lib)
    outputs_doc = ", ".join(f"{t} {'x'.join(map(str, net.shape_of(t)))}" for t in net.outputs)
    inputs = _inputs_of(lib)
    ns = dict(name=name, NAME=name.upper(), target=target.name, version=__version__,
              input_shape=net.input_shape, input_count=lib.input_count, inputs=inputs,
              output_count=lib.output_count, outputs_doc=outputs_doc,
              param_count=lib.param_count, kernel_count=len(lib.run_launches), params=params,
              batch_sizes=lib.batches, input_sample=lib.input_sample,
              output_sample=lib.output_sample, kernel_counts=[z.nrun for z in lib.sizes],
              memory=memory_of(lib), programs_doc=programs.note,
              has_binaries=programs.has_binaries, comment=c_comment, cstr=c_literal)
    ns["precision"], ns["precision_doc"] = precision.of_schedule(sch, target)
    (out / f"{name}.h").write_text(_render("c/net.h.mako", **ns))
    progs = [dict(layer=p.layer, file=p.file, cstring=c_string(p.source), prologue=pro,
                  epilogue=epi, group=programs.group(i))
             for i, (p, (pro, epi)) in enumerate(zip(lib.programs, programs.sections))]
    binaries_file = f"{name}_binaries.h"
    blobs = list(programs.blobs) if programs.has_binaries else []
    if blobs:
        (out / binaries_file).write_text(_binaries_text(name, blobs, programs))
    (out / f"{name}.c").write_text(_render(
        "c/net.c.mako", name=name, target=target.name, version=__version__, programs=progs,
        joined=programs.joined_count, binaries=blobs, binaries_file=binaries_file,
        binary_device=programs.device or "", binary_driver=programs.driver or "",
        binary_note=programs.note,
        buffers=lib.buffers, params=lib.params, folds=lib.folds, launches=launches,
        sizes=lib.sizes, noutputs=len(lib.outputs), param_count=lib.param_count,
        input_names=[i["name"] for i in inputs], half_params=ns["precision"] == "fp16",
        kernel_count=len(lib.run_launches), vendor_pattern=_pattern(target.vendor),
        device_pattern=_pattern(target.device), build_options=" ".join(BUILD_OPTIONS),
        comment=c_comment, cstr=c_literal))
    objects = [(f"{name}.c", f"{name}.o")] + [
        (f"runtime/{f.name}", f"rt_{f.stem}.o") for f in sorted(runtime.glob("*.c"))]
    (out / "build.ninja").write_text(_render(
        "c/build.ninja.mako", name=name, version=__version__, cc=cc or os.environ.get("CC", "cc"),
        runtime_dir="runtime", ldflags="-lOpenCL -pthread", objects=objects))
    (out / f"{name}.pc").write_text(_render(
        "c/net.pc.mako", name=name, target=target.name, version=__version__,
        prefix=str(Path(prefix or out).resolve())))
    (out / f"{name}Config.cmake").write_text(_render(
        "c/netConfig.cmake.mako", name=name, target=target.name, version=__version__,
        comment=c_comment))
    write_tuning_json(lib, target, out / "tuning.json")
    return out


def _binaries_text(name, blobs, programs):
    """<net>_binaries.h: the device binaries as byte arrays and their table, included by
    <net>.c (a separate file keeps <net>.c readable)."""
    lines = [f"/* {name}_binaries.h: CL_PROGRAM_BINARIES built by aotconv {__version__} on "
             f"{c_comment(programs.device)} (driver {c_comment(programs.driver)}), "
             f"{programs.what}; "
             f"included by {name}.c. */", ""]
    for i, b in enumerate(blobs):
        if b:
            lines += [f"static const unsigned char binary_{i}[{len(b)}] =",
                      binary_array(b) + ";", ""]
    lines.append("static const aotrt_binary binaries[] = {")
    lines += [f"    {{binary_{i}, {len(b)}u}}," if b else "    {0, 0}," for i, b in enumerate(blobs)]
    lines += ["};", ""]
    return "\n".join(lines)


# what every size of a library has in common: written once, at the top of tuning.json
_COMMON = ("aotconv", "network", "c_name", "target", "param_count")


def write_tuning_json(sch, target, path):
    """tuning.json: what was chosen for `sch` (a Schedule or a batches.Library) and why; the
    largest size's choices at the top, and under `batch_sizes` each size's profile() entries
    (and, with several sizes, each size's own document)."""
    lib = library_of(sch)
    doc = _tuning_doc(lib.largest.schedule, target)
    doc["batch_sizes"] = []
    for z in lib.sizes:
        entry = dict(batch=z.batch, first_kernel=z.first_run, kernels=z.nrun)
        if lib.ranged:
            own = _tuning_doc(z.schedule, target)
            entry.update((k, v) for k, v in own.items() if k not in _COMMON)
        doc["batch_sizes"].append(entry)
    if lib.ranged:
        # the library's own buffers, shared by the sizes
        doc["activation_bytes"] = lib.act_bytes
        doc["scratch_bytes"] = sum(b.bytes for b in lib.buffers if b.kind == "scratch")
    Path(path).write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")


def _tuning_doc(sch, target):
    """tuning.json's document of one Schedule."""
    layers = []
    for l in sch.net.layers:
        if l.name not in sch.choices:
            continue
        c = sch.choices[l.name]
        launches = [dict(kernel=x.kernel, phase=x.phase, global_size=list(x.gsize),
                         local_size=list(x.lsize) or None)
                    for x in sch.launches if x.layer == l.name]
        layers.append(dict(layer=l.name, op=l.op, fused=l.fused, signature=l.signature_str(),
                           variant=c.variant, config=c.cfg.as_dict(), source=c.source,
                           time_ms=c.time_ms, stats=_jsonable(c.stats), launches=launches,
                           layouts=list(layouts_of(l, c))))
    net = sch.net
    doc = dict(aotconv=__version__, network=net.name, c_name=c_ident(net.name), target=target.name,
               input_shape=list(net.input_shape),
               inputs=[dict(name=t, shape=list(s)) for t, s in net.inputs],
               outputs=[dict(name=t, shape=list(net.shape_of(t))) for t in net.outputs],
               param_count=sch.param_count, layers=layers,
               activation_bytes=sch.act_bytes, activation_bytes_unshared=sch.naive_act_bytes,
               scratch_bytes=sch.scratch_bytes)
    # aotconv.fusion and aotconv.layouts: which pools were fused (and the times compared),
    # the layout conversions inserted and what the layout plan changed
    doc["pool_fusion"] = [d.as_dict() for d in (sch.fusion or [])]
    # aotconv.passes and aotconv.fusion: batchnorms folded (set_params computes the weights),
    # residual adds fused into their conv's epilogue
    doc["batchnorm_folds"] = [dict(layer=f.layer, batchnorms=[b[0] for b in f.batchnorms])
                              for f in sch.folds]
    doc["residual_fusion"] = [d.as_dict() for d in (sch.residual or [])]
    # depthwise convs fused into the pointwise conv after them
    doc["dwpw_fusion"] = [d.as_dict() for d in (getattr(sch, "dwpw", None) or [])]
    doc["layout_conversions"] = dict(
        count=len(sch.conversions),
        layers=[dict(name=n, tensor=net.layer(n).inputs[0], src=net.layer(n).attrs["src"],
                     dst=net.layer(n).attrs["dst"]) for n in sch.conversions])
    doc["layout_plan"] = sch.layout_plan.as_dict() if sch.layout_plan is not None else None
    return doc


def _finite(v):
    """strict JSON: a non-finite number (an unmeasured or impossible time) is written as null"""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _jsonable(stats):
    import dataclasses
    if dataclasses.is_dataclass(stats):
        d = dataclasses.asdict(stats)
        d.pop("times", None)      # every measured time: kept in the records, not here
        return _jsonable(d)
    if isinstance(stats, dict):
        return {k: _jsonable(v) for k, v in stats.items()}
    if isinstance(stats, (list, tuple)):
        if all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in stats):
            return {k: _jsonable(v) for k, v in stats}
        return [_jsonable(x) for x in stats]
    return stats

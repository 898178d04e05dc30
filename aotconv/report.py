"""report.md of a build: per layer shapes, FLOPs, chosen kernel, measured time, memory plan."""
from collections import defaultdict

from . import __version__
from .precision import of_schedule
from .graph import ACT_OPS
from .ops import is_alias, flops as op_flops


def _shape(s):
    return "x".join(map(str, s))


def _stats(c):
    st = c.stats
    if not getattr(st, "tried", 0) and not getattr(st, "pruned", 0):
        return ""
    return " / ".join(str(getattr(st, k)) for k in ("tried", "pruned", "build_failed",
                                                   "launch_failed", "wrong", "timed_out"))


def write_report(res, path):
    net, sch, tgt = res.net, res.schedule, res.target
    lines = [f"# {net.name} for {tgt.name}", "",
             f"aotconv {__version__}; target: {tgt.summary()}.", "",
             f"Precision: {of_schedule(sch, tgt)[1]} (docs/precision.md).", ""]
    if getattr(res, "times", None) is not None:      # up to this report: phases, budget
        lines += [res.times.line(head="Build time up to this report") + ".", ""]
    if res.sizes:
        lines += _sizes(res)
    else:
        lines += _measured(res) + _layer_table(net, sch, tgt, res.profile)
    lines += _memory(sch, res)
    lines += _programs(res)
    if res.sizes:
        for z in res.sizes:
            lines += [f"## Batch {z.batch}"] + _layer_table(z.net, z.schedule, tgt, z.profile)
            lines += [""] + _fusion_and_layouts(z.schedule, level="###")
    else:
        lines += _fusion_and_layouts(sch)
    lines += _figures(res, path)
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _measured(res):
    """How the times were measured and what the output was checked against."""
    lines = []
    if res.profile:
        total = sum(ms for _, ms in res.profile)
        runs = getattr(res, "runs", 5)           # fewer where a time budget ran out
        lines.append(f"Measured on the device through the emitted library: median of {runs} "
                     f"run{'s' if runs != 1 else ''}, OpenCL profiling events; total kernel "
                     f"time **{total:.3f} ms**.")
    else:
        lines.append(_unmeasured(res))
    if res.check_error is not None:
        lines.append(f"Output checked against {_against(res)}: {_verdict(res)}.")
    return lines


def _unmeasured(res):
    """Why report.md has no measured times."""
    return getattr(res, "unmeasured", None) or ("The target's device was not present at "
                                                "build time: no measured times.")


def _verdict(res):
    from .precision import verdict
    spread = getattr(res, "check_spread", None)
    if spread is None:
        return f"max hybrid error {res.check_error:.2e} (tolerance 1e-3)"
    return verdict(res.check_error, res.check_tolerance, spread)[1]


def _against(res):
    """What --check compared the library with."""
    return ("the float64 numpy reference" if res.check_reference == "numpy"
            else res.check_reference)


def _sizes(res):
    """A library of several batch sizes: which, how a call picks one, each size's kernels and
    time."""
    sizes = res.sizes
    measured = any(z.profile for z in sizes)
    lines = [f"Batch sizes **{', '.join(str(z.batch) for z in sizes)}** in one library: a call "
             f"with n samples (`run_n`, 1 to {sizes[-1].batch}) runs the smallest size >= n, "
             f"its input padded with zeros; `run()` runs {sizes[-1].batch} (docs/c-api.md, "
             f"Batch sizes).", ""]
    if measured:
        lines.append("Measured on the device through the emitted library, each size with its "
                     "own number of samples: median of 5 runs, OpenCL profiling events.")
    else:
        lines.append(_unmeasured(res))
    if res.check_error is not None:
        between = f" and n = {res.check_n} (between two sizes)" if res.check_n else ""
        lines.append(f"Output checked against {_against(res)} at every size{between}: "
                     f"{_verdict(res)}.")
    lines += ["", "| batch | kernels per run | kernel ms | ms per sample | activations (its own "
              "plan) | check error |", "|---|---|---|---|---|---|"]
    for z in sizes:
        ms = sum(t for _, t in z.profile) if z.profile else None
        err = f"{z.check_error:.2e}" if z.check_error is not None else "-"
        lines.append(f"| {z.batch} | {len(z.schedule.run_launches)} | {_ms(ms)} "
                     f"| {_ms(ms / z.batch if ms is not None else None)} "
                     f"| {_size(z.schedule.act_bytes)} | {err} |")
    return lines + [""]


def _layer_table(net, sch, tgt, profile):
    """Per layer: op, shapes, MFLOP, the chosen kernel and configuration, its measured time."""
    per_layer = defaultdict(float)
    for kname, ms in profile or []:
        per_layer[kname.split("/")[0]] += ms
    lines = ["", "| layer | op | in | out | MFLOP | kernel | config | source | ms | GFLOP/s "
             "| % peak | tried / pruned / build fail / launch fail / wrong / timeout |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # the network as written: what each fused name was
    src = {l.name: l for l in (getattr(sch, "source", None) or net).layers}
    for l in net.layers:
        if is_alias(l):
            lines.append(f"| {l.name} | {l.op} | {_shape(l.in_shape)} | {_shape(l.out_shape)} "
                         f"| 0 | (no kernel: same buffer) | | | | | | |")
            continue
        c = sch.choices[l.name]
        fl = op_flops(l)
        op = l.op + ("+" + "+".join(l.fused) if l.fused else "")
        # the layer's act, unless it came with a fused act layer (folded batchnorms, adds and
        # pools fused in are not act layers)
        acts = [n for n in l.fused if n in src and src[n].op in ACT_OPS]
        if l.attrs.get("act", "none") != "none" and not acts and l.op not in ACT_OPS:
            op += f" ({l.attrs['act']})"
        ms = per_layer.get(l.name)
        gf = fl / (ms * 1e6) if ms else None
        pk = 100 * gf / tgt.peak_gflops if gf and tgt.peak_gflops else None
        lines.append(
            f"| {l.name} | {op} | {' + '.join(_shape(s) for s in l.in_shapes)} | {_shape(l.out_shape)} "
            f"| {fl / 1e6:.2f} | {c.variant} | {c.cfg} | {c.source} "
            f"| {'%.4f' % ms if ms is not None else '-'} | {'%.1f' % gf if gf else '-'} "
            f"| {'%.1f' % pk if pk else '-'} | {_stats(c)} |")
    return lines


STAGE_BYTES, STAGE_SLOTS = 4 << 20, 4     # runtime_c/aotconv_rt.h: run()'s staging ring


def _size(b):
    if b >= 2 ** 20:
        return f"{b / 2 ** 20:.2f} MiB"
    return f"{b / 1024:.1f} KiB" if b >= 1024 else f"{b} B"


def staging_bytes(sch, chunk=STAGE_BYTES):
    """The pinned host memory of run()'s staging ring (runtime_c/rt_run.c aotrt_stage_setup)."""
    most = 4 * max([c for _, c in sch.inputs] + [sch.output_count])
    if not most or chunk < 0:
        return 0
    slot = min(chunk, most)
    return slot * min(STAGE_SLOTS, -(-most // slot))


def _memory(sch, res):
    """The device memory create() allocates (the header's *_BYTES, the C memory() call) and
    the pinned host memory."""
    from .emit import memory_of
    m = memory_of(sch)
    acts = sum(1 for b in sch.buffers if b.kind == "act")
    io = 4 * (sch.input_count + sch.output_count)
    if res.sizes:
        from .batches import unshared_bytes
        own = ", ".join(f"{z.batch}: {_size(z.schedule.act_bytes)}" for z in res.sizes)
        act_note = (f"{_size(m['activation'])} in {acts} buffers shared by the batch sizes "
                    f"(buffer i as large as the largest size's buffer i; each size's own plan: "
                    f"{own})")
        param_note = "shared by the batch sizes"
        variant_note = "each batch size its own"
        scratch_note = "shared by all layers of every batch size"
        total_note = (f" (the sizes as libraries of their own: "
                      f"{_size(unshared_bytes(sch))})")
        io_note = f"one input and one output of batch {res.sizes[-1].batch}"
    else:
        act_note = (f"{_size(m['activation'])} in {acts} buffers reused by liveness (one buffer "
                    f"per tensor: {_size(sch.naive_act_bytes)})")
        param_note = "as the kernels read them"
        variant_note = "packed or transformed weights"
        scratch_note = "shared by all layers"
        total_note, io_note = "", "one input and one output"
    return ["", "## Memory", "",
            "Device memory that create() allocates (the header's `AOTCONV_<NET>_*_BYTES`, "
            "`aotconv_<net>_memory()` at run time):", "",
            "| what | bytes | |", "|---|---|---|",
            f"| activations | {m['activation']} | {act_note} |",
            f"| parameters | {m['parameter']} | {_size(m['parameter'])} {param_note} (the "
            f"user's array: {sch.param_count} floats, {_size(4 * sch.param_count)}) |",
            f"| variant-owned | {m['variant']} | {_size(m['variant'])} ({variant_note}) |",
            f"| scratch | {m['scratch']} | {_size(m['scratch'])}, {scratch_note} |",
            f"| **device total** | **{m['device']}** | **{_size(m['device'])}**{total_note} |",
            "",
            f"Pinned host memory: run()'s staging ring {_size(staging_bytes(sch))} (made by "
            f"create; `options.stage_bytes` < 0: none), and {_size(io)} for {io_note} once "
            f"`host_buffers()` is called.", "",
            f"Kernels per run: {_per_run(sch, res)}, in set_params: "
            f"{len(sch.launches) - len(sch.run_launches)}.", ""]


def _per_run(sch, res):
    if res.sizes:
        return ", ".join(f"{len(z.schedule.run_launches)} at batch {z.batch}" for z in res.sizes)
    return str(len(sch.run_launches))


def _programs(res):
    plan = res.programs
    if plan is None:
        return []
    return ["## Programs", "",
            f"{len(res.schedule.programs)} kernel files; {plan.note}.", ""]


def _figures(res, path):
    """The histogram of every tried candidate per layer and the roofline (the report extra:
    matplotlib); nothing when it is absent or nothing was measured."""
    from pathlib import Path
    from . import report_plots
    out = Path(path).parent
    # of the largest batch size where there are several
    sch = res.sizes[-1].schedule if res.sizes else res.schedule
    hist = report_plots.histogram_png(sch.choices, out / "tuning_histogram.png")
    roof = report_plots.roofline_png(sch.net, sch.choices, res.target, out / "roofline.png")
    lines = []
    if hist or roof:
        lines += ["## Figures", ""]
    if hist:
        lines += ["Every valid candidate the tuner measured, per layer (time, log scale):", "",
                  "![tuning histogram](tuning_histogram.png)", ""]
    if roof:
        lines += [f"The chosen kernels against {res.target.name}'s roofline:", "",
                  "![roofline](roofline.png)", ""]
    return lines


def _ms(v):
    return "-" if v is None else f"{v:.4f}"


def _fold_text(f):
    """A FoldRow as the report names it: the layer as written and its batchnorms (and, for
    one fused into another layer's kernel, that layer)."""
    bns = ", ".join(b[0] for b in f.batchnorms)
    if f.source:
        return f"{f.source} ({bns}; run in {f.layer})"
    return f"{f.layer} ({bns})"


def _decision_table(intro, names, times, rows):
    """Lines of one kind of fusion decision: `intro`, then a table of the `names` columns, the
    `times` columns (ms), fused and why; `rows` [(names, times, decision)]."""
    cols = names + times + ["fused", "why"]
    out = [intro, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join([*n, *(_ms(x) for x in t), "yes" if d.fused else "no", d.why])
            + " |" for n, t, d in rows]
    return out + [""]


def _fusion_and_layouts(sch, level="##"):
    """The batchnorms folded, which pools, residual adds and depthwise convs were fused (times
    compared) and the layout conversions (aotconv.passes, aotconv.fusion, aotconv.layouts)."""
    out = [f"{level} Fusion and layouts", ""]
    folds = getattr(sch, "folds", None) or []
    if folds:
        out += [f"Batchnorms folded into the conv or dense before them (weights and bias "
                f"computed in set_params): {sum(len(f.batchnorms) for f in folds)}, into "
                + ", ".join(_fold_text(f) for f in folds) + ".", ""]
    res = getattr(sch, "residual", None) or []
    if res:
        out += _decision_table(
            f"Residual adds fused into the epilogue of the conv before them: "
            f"{sum(d.fused for d in res)} of {len(res)} candidates (kept where the fused "
            f"kernel measures faster than conv + add, or, unmeasured, runs the conv's own "
            f"kernel).", ["conv", "add", "residual"], ["conv ms", "add ms", "fused ms"],
            [([d.conv, d.add, d.residual], [d.conv_ms, d.add_ms, d.fused_ms], d) for d in res])
    dwpw = getattr(sch, "dwpw", None) or []
    if dwpw:
        out += _decision_table(
            f"Depthwise convs fused into the pointwise conv after them (conv_dwpw: the "
            f"depthwise output never reaches memory): {sum(d.fused for d in dwpw)} of "
            f"{len(dwpw)} candidates (kept where the fused kernel measures faster than "
            f"dw + pw).", ["pw conv", "dw conv"], ["pw ms", "dw ms", "fused ms"],
            [([d.conv, d.dw], [d.conv_ms, d.dw_ms, d.fused_ms], d) for d in dwpw])
    fusion = sch.fusion or []
    if fusion:
        out += _decision_table(
            f"Pools fused into the convolution before them: {sum(d.fused for d in fusion)} "
            f"of {len(fusion)} candidates (kept where the fused kernel measures faster than "
            f"conv + pool).", ["conv", "pool"], ["conv ms", "pool ms", "fused ms"],
            [([d.conv, d.pool], [d.conv_ms, d.pool_ms, d.fused_ms], d) for d in fusion])
    else:
        out += ["No convolution is followed by a pool it could absorb.", ""]
    net = sch.net
    conv = [net.layer(n) for n in sch.conversions]
    out.append(f"Layout conversions inserted: **{len(conv)}**"
               + (": " + ", ".join(f"{l.name} ({l.inputs[0]} {l.attrs['src']} -> "
                                   f"{l.attrs['dst']})" for l in conv) if conv else "") + ".")
    lp = sch.layout_plan
    if lp is not None and lp.alternatives:
        out.append(f"Layout plan: {lp.alternatives} layers had measured configurations in more "
                   f"than one layout; estimated kernel + conversion time {lp.planned_ms:.4f} ms "
                   f"(the per-layer best picks would cost {lp.independent_ms:.4f} ms).")
        for c in lp.changed:
            out.append(f"- {c['layer']}: {c['tuned']['variant']} {'/'.join(c['tuned']['layouts'])} "
                       f"({_ms(c['tuned']['ms'])} ms) -> {c['planned']['variant']} "
                       f"{'/'.join(c['planned']['layouts'])} ({_ms(c['planned']['ms'])} ms)")
        if getattr(lp, "refined", None):
            out.append("Searched again in the layouts the plan gave them (their kernel there was "
                       "much slower than their search's pick):")
            out += [f"- {r['layer']} in {'/'.join(r['layouts'])}: {_ms(r['before_ms'])} -> "
                    f"{_ms(r['after_ms'])} ms" for r in lp.refined]
    out.append("")
    return out

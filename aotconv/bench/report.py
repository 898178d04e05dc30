"""What `aotconv bench` records, derives and prints: failures and times as JSON, roofline
figures, the why / what-would-close-it column, per-set summaries (geometric means, totals), the
markdown and text tables, and the files they are written to.

Everything here is device-free: it reads the JSON rows that aotconv.bench measures, so a
table can be re-rendered (`aotconv bench --from-json`) and tested without a device.
"""
import json
import math
import statistics
from pathlib import Path
import sys
import traceback

from ..precision import SPREAD_FACTOR

# below this kernel time the launch and the ramp-up of the machine dominate (a GPU launch is a
# few microseconds; PoCL's, through its pthread scheduler, tens)
LAUNCH_BOUND_US = {"gpu": 10.0, "cpu": 50.0}
# a layer "falls short" when ours is this much slower than the reference
SHORT = 1.05


def log(msg, quiet=False):
    """Progress on stderr (stdout is the table)."""
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def failure(e):
    """A caught exception as JSON: what it was and where (for runs read only afterwards)."""
    tb = traceback.extract_tb(e.__traceback__)[-3:]
    return {"error": f"{type(e).__name__}: {str(e)[:500]}",
            "where": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb]}


def rounded(xs):
    """Times as the JSON keeps them: 6 significant digits."""
    return [float(f"{x:.6g}") for x in xs]


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def roofline(flops, nbytes, ms, peak_gflops, peak_gbps, kind="gpu"):
    """The roofline figures of one measured kernel.

    ai: FLOP per byte of compulsory traffic; ridge: peak_gflops / peak_gbps; bound: "launch"
    (time under LAUNCH_BOUND_US), else "bandwidth" (ai below the ridge) or "compute";
    attainable_gflops: min(peak, ai * bandwidth); pct_roof: achieved / attainable.
    """
    ai = flops / nbytes if nbytes else math.inf
    ridge = peak_gflops / peak_gbps if peak_gbps else math.inf
    out = {"ai": ai, "ridge": ridge}
    attainable = min(peak_gflops, ai * peak_gbps) if peak_gbps else peak_gflops
    out["attainable_gflops"] = attainable
    if ms is None or not ms > 0:
        out["bound"] = "bandwidth" if ai < ridge else "compute"
        return out
    gflops = flops / ms / 1e6
    gbps = nbytes / ms / 1e6
    out.update(gflops=gflops, tflops=gflops / 1e3, gbps=gbps,
               pct_peak=100.0 * gflops / peak_gflops if peak_gflops else None,
               pct_bw=100.0 * gbps / peak_gbps if peak_gbps else None,
               pct_roof=100.0 * gflops / attainable if attainable else None)
    if ms * 1e3 < LAUNCH_BOUND_US.get(kind, 10.0):
        out["bound"] = "launch"
    else:
        out["bound"] = "bandwidth" if ai < ridge else "compute"
    return out


def shape_of(row):
    return {k: row[k] for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad", "P", "Q")}


def hint(row, bound, registered=(), chosen=None, launches=1):
    """What variant would close the gap, from the layer's shape and where it sits on the
    roofline. `registered`: the variants that implement this layer now (so the hint can say
    'tune longer' for one that exists but was not picked, and 'to write' for one that does
    not)."""
    s = shape_of(row)
    have = set(registered)

    def v(name, what):
        if name in have and name != chosen:
            return f"{what} ({name} is registered but was not picked: tune it longer)"
        if name in have:
            return f"{what} ({name}: a larger tile / more tuning)"
        return f"{what} (a {name} variant, to write)"

    pixels = s["N"] * s["P"] * s["Q"]
    if bound == "launch":
        extra = " in one launch instead of several" if launches > 1 else ""
        return (f"launch-bound: the kernel is too short to fill the device; fuse it with its "
                f"neighbours{extra}, or batch more images")
    if pixels <= 16:
        return v("conv_gemv", "dense in disguise (a GEMV over the weights): lower it to dense "
                 "(dense_gemv) in a graph pass, or a GEMV/K-split conv variant that streams "
                 "the weights once at full bandwidth")
    if bound == "bandwidth":
        if s["R"] == s["S"] == 1 and s["stride"] == 1 and s["pad"] == 0:
            return v("conv_1x1", "1x1 conv at low reuse: a direct GEMM over NCHW (no im2col "
                     "buffer), vector loads, the epilogue fused")
        return v("conv_igemm", "implicit GEMM (no im2col buffer: one pass over the input), "
                 "vector loads")
    if s["R"] == s["S"] == 3 and s["stride"] == 1:
        return v("conv_winograd", "Winograd F(2x2,3x3): 2.25x fewer multiplies than direct")
    if s["R"] == s["S"] == 1 and s["stride"] == 1 and s["pad"] == 0:
        return v("conv_1x1", "a 1x1 conv is a plain GEMM: larger register tiles "
                 "(128x128 per work-group, 8x8 per work-item)")
    return v("conv_igemm", "implicit GEMM with larger tiles (128x128) and double-buffered "
             "local memory")


def derive(row, target, registered=()):
    """Fill a measured layer row's derived fields in place: roofline, ratios, why, hint."""
    ours = row.get("ours") or {}
    ms = ours.get("ms")
    rf = roofline(row["flops"], row["bytes"], ms, target["peak_gflops"], target["peak_gbps"],
                  target["kind"])
    row["roofline"] = rf
    refs = row.get("refs", {})
    t = (refs.get("torch") or {}).get("ms")
    c = (refs.get("clblast") or {}).get("ms")
    row["ours_over_torch"] = ms / t if ms and t else None
    row["clblast_over_ours"] = c / ms if ms and c else None
    short = row["ours_over_torch"] is not None and row["ours_over_torch"] > SHORT
    row["short"] = short
    if ms:
        b = rf["bound"]
        if b == "launch":
            why = f"launch-bound ({ms * 1e3:.1f} us)"
        elif b == "bandwidth":
            why = (f"bandwidth-bound (AI {rf['ai']:.1f} < ridge {rf['ridge']:.1f}); "
                   f"{rf['pct_bw']:.0f}% of peak bandwidth")
        else:
            why = (f"compute-bound (AI {rf['ai']:.0f} >= ridge {rf['ridge']:.1f}); "
                   f"{rf['pct_peak']:.0f}% of FP32 peak")
        row["why"] = why
        row["close_it"] = (hint(row, b, row.get("variants", registered), ours.get("variant"),
                                ours.get("launches", 1)) if short else "")
    return row


def summarise(rows):
    """Per-set figures: geomean of ours/reference, totals, ours vs CLBlast."""
    done = [r for r in rows if (r.get("ours") or {}).get("ms")]
    tr = [r for r in done if r.get("ours_over_torch")]
    cr = [r for r in done if r.get("clblast_over_ours")]
    both = [r for r in tr]
    return {
        "layers": len(rows), "measured": len(done),
        "geomean_ours_over_torch": geomean([r["ours_over_torch"] for r in tr]),
        "geomean_clblast_over_ours": geomean([r["clblast_over_ours"] for r in cr]),
        "faster_than_torch": sum(1 for r in tr if r["ours_over_torch"] < 1.0),
        "compared_with_torch": len(tr),
        "total_ours_ms": sum(r["ours"]["ms"] for r in done),
        "total_ours_ms_where_torch": sum(r["ours"]["ms"] for r in both),
        "total_torch_ms": sum(r["refs"]["torch"]["ms"] for r in both),
        "total_clblast_ms": sum(r["refs"]["clblast"]["ms"] for r in cr),
        "total_ours_ms_where_clblast": sum(r["ours"]["ms"] for r in cr),
        "tune_s": sum((r.get("ours") or {}).get("tune_s") or 0.0 for r in rows),
    }


# -- formatting -------------------------------------------------------------------------------

def _f(x, fmt="{:.3f}", none="-"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return fmt.format(x)


def best_ours(o):
    """Our time against the best reference, timed as it is on an input already on the device:
    run_buffers() where that was measured; else (a document from before it, or a device this
    process could not open) run() from the pinned buffers, profiling off where that was
    measured, else on, or run() from numpy memory where the buffers were not had."""
    return (o.get("run_resident_ms") or o.get("run_pinned_noprof_ms") or o.get("run_pinned_ms")
            or o["run_ms"])


def best_ours_way(o):
    """How best_ours(o) was timed, in words for a table."""
    return ("input on the device" if o.get("run_resident_ms") else
            "from pinned buffers" if o.get("run_pinned_noprof_ms") or o.get("run_pinned_ms")
            else "from numpy memory")


def _ms(x):
    if x is None:
        return "-"
    return f"{x:.4f}" if x < 1 else f"{x:.3f}" if x < 100 else f"{x:.1f}"


def shape_text(r):
    return (f"{r['N']}x{r['C']}x{r['H']}x{r['W']} -> {r['K']}x{r['P']}x{r['Q']}, "
            f"{r['R']}x{r['S']}/{r['stride']} p{r['pad']}")


def _verified(ours):
    v = ours.get("verify")
    if not v:
        return ""
    if v.get("skipped"):
        return " (unverified)"
    return "" if v.get("ok") else " **WRONG**"


def layer_table(rows, ref_label, unit="TFLOP/s"):
    """The per-layer markdown table; `unit` TFLOP/s (GPUs) or GFLOP/s (CPUs)."""
    scale = 1e3 if unit == "TFLOP/s" else 1.0
    head = (f"| layer | shape | GFLOP | ours ms | kernel | {ref_label} ms | ours/{ref_label} "
            f"| CLBlast ms | CLBlast/ours | {unit} | % peak | % BW | why | what would close it |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        o = r.get("ours") or {}
        refs = r.get("refs", {})
        rf = r.get("roofline", {})
        if not o.get("ms"):
            lines.append(f"| {r['name']} | {shape_text(r)} | {r['flops'] / 1e9:.3f} | "
                         f"{o.get('error', 'not run')} | | | | | | | | | | |")
            continue
        t, c = refs.get("torch") or {}, refs.get("clblast") or {}
        pct_bw = _f(rf.get("pct_bw"), "{:.0f}") if rf.get("bound") == "bandwidth" else ""
        lines.append(
            f"| {r['name']} | {shape_text(r)} | {r['flops'] / 1e9:.3f} | "
            f"{_ms(o['ms'])}{_verified(o)} | {o.get('variant', '')} | "
            f"{_ms(t.get('ms')) if t.get('ms') else t.get('note', '-')} | "
            f"{_f(r.get('ours_over_torch'), '{:.2f}')} | "
            f"{_ms(c.get('ms')) if c.get('ms') else c.get('note', '-')} | "
            f"{_f(r.get('clblast_over_ours'), '{:.2f}')} | "
            f"{_f(rf['gflops'] / scale if rf.get('gflops') else None, '{:.3g}')} | "
            f"{_f(rf.get('pct_peak'), '{:.1f}')} | {pct_bw} | "
            f"{r.get('why', '')} | {r.get('close_it', '')} |")
    return "\n".join(lines)


def summary_line(name, s, ref_label):
    parts = [f"**{name}**: {s['measured']}/{s['layers']} layers measured"]
    if s["geomean_ours_over_torch"] is not None:
        parts.append(f"geomean ours/{ref_label} **{s['geomean_ours_over_torch']:.2f}** "
                     f"(faster on {s['faster_than_torch']} of {s['compared_with_torch']}); "
                     f"total ours {s['total_ours_ms_where_torch']:.3f} ms vs {ref_label} "
                     f"{s['total_torch_ms']:.3f} ms")
    if s["geomean_clblast_over_ours"] is not None:
        parts.append(f"speed-up over CLBlast convgemm: geomean **"
                     f"{s['geomean_clblast_over_ours']:.2f}x**, total "
                     f"{s['total_clblast_ms']:.3f} ms vs ours "
                     f"{s['total_ours_ms_where_clblast']:.3f} ms")
    if s.get("tune_s"):
        parts.append(f"picking the kernels (tuning, or comparing fallbacks) took "
                     f"{s['tune_s']:.0f} s")
    return "; ".join(parts) + "."


# how each precision's end-to-end table is headed: what ours and the reference ran in
PRECISION_HEADINGS = {
    "fp32": "FP32: ours built with --precision fp32; {ref} in float32, TF32 off",
    "tf32": ("TF32: ours built with --precision tf32 (TF32 products, FP32 sums, in the conv "
             "layers a tensor-core variant serves); {ref} in float32 with TF32 allowed "
             "(cudnn.allow_tf32, cuda.matmul.allow_tf32)"),
    "fp16": ("FP16: ours built with --precision fp16 (half storage, FP32 math); {ref} "
             "model.half() on half input, channels_last"),
}


def precision_of(row):
    """The precision an end-to-end row was measured in (rows from before --precision: fp32)."""
    return row.get("precision") or "fp32"


def by_precision(rows):
    """{precision: [rows]} in first-seen order: each precision's rows form a table of their
    own, so that no ratio or column compares two precisions."""
    out = {}
    for r in rows:
        out.setdefault(precision_of(r), []).append(r)
    return out


def e2e_table(rows, ref_label):
    """The end-to-end tables: one (and the table of PyTorch's ways) per precision, each under
    a heading naming the precision where any row is not fp32 (FP32 alone renders as it did
    before precisions existed)."""
    groups = by_precision(rows)
    if list(groups) == ["fp32"]:
        return _e2e_table(rows, ref_label, "fp32")
    parts = []
    for prec, rs in groups.items():
        head = PRECISION_HEADINGS.get(prec, prec).format(ref=ref_label)
        parts += [f"### {head}", "", _e2e_table(rs, ref_label, prec), ""]
    return "\n".join(parts).rstrip("\n")


def numpy_cell(r):
    """The row's check against the float64 numpy reference of its build's --check."""
    c = r.get("numpy")
    if not c:
        return "-"
    if c.get("skipped"):
        return f"skipped: {c['skipped']}"
    if c.get("error") is None or isinstance(c.get("error"), str):
        return f"failed: {c.get('error', '?')}"[:80]
    t = c.get("tolerance", 1e-3)
    name, tt = "T", f"{t:g}"
    if c.get("spread") is not None:
        name, tt = f"T + {SPREAD_FACTOR:g} x spread {c['spread']:.1e}", f"{t:.1e}"
    text = (f"{c['error']:.1e} on {c.get('images', '?')} image(s), "
            + (f"within {name} = {tt}" if c.get("within") else f"**past {name} = {tt}**"))
    if c.get("resolution") is not None:          # a document from before the spread
        text += f" (the reference in float32 vs float64: {c['resolution']:.1e})"
    return text


def _e2e_table(rows, ref_label, prec):
    # the columns of a reduced precision say it, and add what ours computed in and its check
    # against the numpy reference; an fp32 table is as it was
    tag = "" if prec == "fp32" else f" {prec}"
    ours, ref = f"ours{tag}", f"{ref_label}{tag}"
    extra = prec != "fp32"
    lines = [f"| network | batch | kernels chosen by | tune + build s | {ours} run() ms | "
             f"{ours} run() from pinned buffers ms | {ours} the same, profiling off ms | "
             f"{ours} kernels ms | "
             f"{ref} eager ms | {ref} incl. copies ms | {ours}/{ref} (run vs "
             f"incl. copies) | {ours}/{ref} (kernels vs eager) | max error vs {ref} |"
             + (f" {ours} computes in | {ours} vs the float64 numpy reference |" if extra
                else ""),
             "|" + "---|" * (15 if extra else 13)]
    for r in rows:
        o, t = r.get("ours") or {}, r.get("torch") or {}
        b0 = r.get("batch_orig", r["batch"])
        scaled = f" (scaled from {b0})" if b0 != r["batch"] else ""
        if o.get("error"):
            lines.append(f"| {r['net']} | {r['batch']} | {r.get('mode', '')} | "
                         f"{_f(r.get('build_s'), '{:.1f}')} | {o['error']} | | | | | | | | |"
                         + (" | |" if extra else ""))
            continue
        lines.append(
            f"| {r['net']} | {r['batch']}{scaled} | {r.get('mode', '')} | "
            f"{_f(r.get('build_s'), '{:.1f}')} | {_ms(o.get('run_ms'))} | "
            f"{_ms(o.get('run_pinned_ms'))} | {_ms(o.get('run_pinned_noprof_ms'))} | "
            f"{_ms(o.get('kernels_ms'))} | "
            f"{_ms(t.get('eager_ms')) if t.get('eager_ms') else t.get('note', '-')} | "
            f"{_ms(t.get('wall_ms'))} | {_f(r.get('ratio_wall'), '{:.2f}')} | "
            f"{_f(r.get('ratio_kernels'), '{:.2f}')} | {_f(r.get('max_error'), '{:.1e}')} |"
            + (f" {o.get('computes', '-')} | {numpy_cell(r)} |" if extra else ""))
    ways = _torch_ways(rows)
    if ways:
        lines += ["", f"The best {ref} time of each network, every way it was run on a "
                      f"device-resident input (CUDA events), against {ours} timed the same way: "
                      f"run_buffers() on an input already in device memory, each call from its "
                      f"enqueue to clFinish, profiling off (where that was not had, run() from "
                      f"the pinned buffers, which adds the input's upload; the column says "
                      f"which):", "",
                  f"| network | batch | {ours} kernels | {ours} ms | {ours} timed | "
                  + " | ".join(f"{ref} {w} ms" for w in ways)
                  + f" | best {ref} | {ours} / best |",
                  "|" + "---|" * (7 + len(ways))]
        for r in rows:
            o, t = r.get("ours") or {}, r.get("torch") or {}
            if o.get("error") or not t.get("best_ms"):
                continue
            cells = [_ms(t.get(f"{w}_ms")) if t.get(f"{w}_ms") else
                     (t.get(f"{w}_note") or "-").replace("|", "/")[:60] for w in ways]
            lines.append(f"| {r['net']} | {r['batch']} | {o.get('launches', '-')} | "
                         f"{_ms(best_ours(o))} | {best_ours_way(o)} | "
                         + " | ".join(cells)
                         + f" | {t['best'][:-3]} | {_f(r.get('ratio_best'), '{:.2f}')} |")
    rounds = [r for r in rows if r.get("rounds")]
    if rounds:
        lines += ["", f"Interleaved rounds (`--e2e-rounds`): {ours} on the device-resident "
                      f"input and {ref}'s best way, timed alternately, each round with the "
                      f"same counts; round 1 is the row above:", "",
                  f"| network | batch | {ref} way | rounds | {ours} ms, median (range) | "
                  f"{ref} ms, median (range) | {ours} / {ref} per round | median ratio | "
                  f"{ours} ahead |",
                  "|" + "---|" * 9]
        for r in rounds:
            z = r["rounds"]
            o = [v for v in z["ours"] if v is not None]
            lines.append(f"| {r['net']} | {r['batch']} | {z['way']} | {z['rounds']} | "
                         f"{_spread(o)} | {_spread(z['reference'])} | "
                         f"{', '.join(f'{v:.2f}' for v in z['ratios'])} | "
                         f"{_f(z.get('ratio_median'), '{:.3f}')} | "
                         f"{z['ahead']} of {len(z['ratios'])} |"
                         + (f" ({'; '.join(z['notes'])})" if z.get("notes") else ""))
    return "\n".join(lines)


def _spread(values):
    """'median (min-max)' of ms values, or '-'."""
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _torch_ways(rows):
    """The ways the reference ran (eager, graph, compile_<mode>), in first-seen order."""
    ways = []
    for r in rows:
        for k in (r.get("torch") or {}):
            for suffix in ("_ms", "_note"):
                if k.endswith(suffix) and k not in ("wall_ms", "best_ms"):
                    w = k[:-len(suffix)]
                    if w not in ways:
                        ways.append(w)
    return ways if len(ways) > 1 else []


def markdown(doc):
    """The whole report of one bench JSON document."""
    tgt, env = doc["target"], doc.get("environment", {})
    ref_label = doc.get("ref_label", "torch")
    L = [f"# aotconv bench: {tgt['name']} ({doc['date']})", ""]
    if doc.get("commands"):
        L += ["Commands (their results merged with `aotconv bench --from-json`):", "",
              *[f"    {c}" for c in doc["commands"]], ""]
    else:
        L += [f"Command: `{doc['command']}`", ""]
    ridge = (f", ridge {tgt['peak_gflops'] / tgt['peak_gbps']:.1f} FLOP/B"
             if tgt.get("peak_gbps") else "")
    L += [f"- Target: {tgt.get('summary', tgt['name'])}; device: {env.get('device', '?')}; "
          f"FP32 peak {tgt['peak_gflops'] / 1e3:.1f} TFLOP/s, {tgt['peak_gbps']:.0f} GB/s"
          f"{ridge}.",
          f"- aotconv {doc.get('version', '?')}; mode: {doc.get('mode')}"
          + (f", budget {doc['budget']}" if doc.get("budget") else "") + "."]
    for name, r in doc.get("refs", {}).items():
        L.append(f"- Reference {name}: {r.get('note', '')}")
    if doc.get("scale"):
        L.append(f"- **Scaled run**: {doc['scale']}.")
    if env.get("loadavg_at_start"):
        L.append(f"- Host: {env.get('cpus', '?')} CPUs, load average (1, 5, 15 min) "
                 f"{env['loadavg_at_start']} at the start"
                 + (f", {env['loadavg_at_end']} at the end" if env.get("loadavg_at_end") else "")
                 + (f"; OMP_WAIT_POLICY={env['omp_wait_policy']}"
                    if env.get("omp_wait_policy") else "")
                 + (f"; {doc['elapsed_s']:.0f} s in all" if doc.get("elapsed_s") else "") + ".")
    L += ["", "Per-layer convolutions have no bias and no activation, so all three "
          "implementations compute the same thing. Our time: OpenCL profiling events, median "
          f"of up to {doc.get('repeats')} after warm-up (at least 3 where more would take over "
          f"{doc.get('max_measure_s', '?')} s), rotating over copies of the buffers sized to "
          "spill the last-level cache (the references rotate the same way). "
          f"{ref_label}: " + ("CUDA events around each call, cudnn.benchmark on, TF32 off. "
                              if doc.get("device_kind") == "gpu" else
                              "wall time around each call (torch CPU, all threads). ")
          + "CLBlast: Debian's libclblast1, CLBlastSconvgemm, its OpenCL event. Ratios above "
          "1 mean ours is slower. '% BW' is given for bandwidth-bound layers only (bytes = "
          "input + weights + output once). 'why' places our kernel on the roofline; 'what "
          "would close it' appears where ours is slower than the reference.", ""]
    for set_name, s in doc.get("sets", {}).items():
        L += [f"## {set_name}", "", summary_line(set_name, s["summary"], ref_label), "",
              layer_table(s["rows"], ref_label,
                          "GFLOP/s" if doc.get("device_kind") == "cpu" else "TFLOP/s"), ""]
    if doc.get("e2e"):
        L += ["## End to end (the emitted C library)", "",
              f"`run()` is the library's wall time per call (input upload, every kernel, output "
              f"download), median of up to {doc.get('repeats')}; kernels is the sum of its per-kernel "
              f"profile. run() and run() from pinned buffers are timed on the handle made with "
              f"profiling on for it (options.profile = 1); 'the same, profiling off' on a second "
              f"handle with the library's default (off). {ref_label} eager runs a torch model "
              f"built from the same net.yaml with the same weights (aotconv.torch_model); "
              f"outputs are compared before timing.", "",
              *_precision_paragraph(doc["e2e"], ref_label),
              e2e_table(doc["e2e"], ref_label), ""]
    if doc.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(L)


def _precision_paragraph(rows, ref_label):
    """What the end-to-end section's reduced-precision tables compare, where it has any."""
    if set(by_precision(rows)) <= {"fp32"}:
        return []
    return [f"Each precision has its table: ours built with `--precision` P against {ref_label} "
            f"run in P (TF32 allowed in float32, or the model in half and channels_last), "
            f"so every ratio compares one precision. Outside FP32 {ref_label}'s output is "
            f"another rounding of the model, reported but no reference: each tf32 or fp16 "
            f"library is also checked against the float64 numpy reference that its build's "
            f"--check uses (the operands, or the weights and stored outputs, rounded as the "
            f"library rounds them; docs/precision.md) with the FP32 tolerance T, or where its "
            f"error is past T with T + {SPREAD_FACTOR:g} x the spread of the precision's "
            f"roundings (the reference evaluated again with them made stochastic), on the first "
            f"images of the batch.", ""]


def text_table(doc):
    """A short plain-text summary for the terminal (and the end of the GPU script's log)."""
    ref_label = doc.get("ref_label", "torch")
    cpu = doc.get("device_kind") == "cpu"
    unit, scale = ("GFLOP/s", 1.0) if cpu else ("TFLOP/s", 1e3)
    L = [f"{'layer':34s} {'ours ms':>10s} {ref_label + ' ms':>12s} {'ratio':>6s} "
         f"{'CLBlast ms':>10s} {unit:>8s} {'bound':>9s}"]
    for set_name, s in doc.get("sets", {}).items():
        for r in s["rows"]:
            o = r.get("ours") or {}
            t = (r.get("refs", {}).get("torch") or {}).get("ms")
            c = (r.get("refs", {}).get("clblast") or {}).get("ms")
            rf = r.get("roofline", {})
            L.append(f"{r['name'][:34]:34s} {_f(o.get('ms'), '{:.4f}'):>10s} "
                     f"{_f(t, '{:.4f}'):>12s} {_f(r.get('ours_over_torch'), '{:.2f}'):>6s} "
                     f"{_f(c, '{:.4f}'):>10s} "
                     f"{_f(rf['gflops'] / scale if rf.get('gflops') else None, '{:.3g}'):>8s} "
                     f"{rf.get('bound', '-'):>9s}")
        L.append("  " + summary_line(set_name, s["summary"], ref_label))
    for r in doc.get("e2e", []):
        o, t = r.get("ours") or {}, r.get("torch") or {}
        pinned = (f" (from pinned buffers {o['run_pinned_ms']:.3f} ms)"
                  if o.get("run_pinned_ms") else "")
        if o.get("run_resident_ms"):
            pinned += f", input on the device {o['run_resident_ms']:.3f} ms"
        prec = precision_of(r)
        c = r.get("numpy") or {}
        tol = "T" if c.get("spread") is None else "T + 2 x spread"
        check = (f"; vs numpy {c['error']:.1e} ({'within' if c.get('within') else 'past'} "
                 f"{tol})" if isinstance(c.get("error"), float) else "")
        L.append(f"e2e {r['net']} b{r['batch']}{'' if prec == 'fp32' else ' ' + prec}: run() "
                 f"{_f(o.get('run_ms'), '{:.3f}')} ms{pinned}, "
                 f"kernels {_f(o.get('kernels_ms'), '{:.3f}')} ms; {ref_label} eager "
                 f"{_f(t.get('eager_ms'), '{:.3f}')} ms"
                 + (f", best {t['best'][:-3]} {t['best_ms']:.3f} ms (ours / best "
                    f"{_f(r.get('ratio_best'), '{:.2f}')})" if t.get("best_ms") else "")
                 + (f"; {r['rounds']['rounds']} interleaved rounds: ours / best median "
                    f"{_f(r['rounds'].get('ratio_median'), '{:.3f}')}, ahead in "
                    f"{r['rounds']['ahead']} of {len(r['rounds']['ratios'])}"
                    if r.get("rounds") else "")
                 + "; tune+build "
                 f"{_f(r.get('build_s'), '{:.1f}')} s"
                 + check + (f"; {o['error']}" if o.get("error") else ""))
    return "\n".join(L)


# -- the whole document -----------------------------------------------------------------------

def finish(doc, target_dict, registered):
    """Derive every row's figures and the per-set summaries (in place)."""
    for s in doc["sets"].values():
        for r in s["rows"]:
            derive(r, target_dict, registered)
        s["summary"] = summarise(s["rows"])
    return doc


def write(doc, out, md):
    """The JSON (replaced atomically: a run cut short keeps the last complete file) and the
    markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    md.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(out)
    md.write_text(markdown(doc) + "\n")

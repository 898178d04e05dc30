"""One `aotconv bench` run: the chosen sets layer by layer, then the networks end to end,
the JSON and markdown rewritten after each row (a run cut short keeps what it measured)."""
import datetime
import os
from pathlib import Path
import shlex
import sys
import time

from .. import __version__
from ..targets import get_target
from ..variants import VARIANTS
from .device import Device, environment, target_dict
from .e2e import bench_e2e
from .layer import bench_layer, skeleton, tune_layers
from .options import Options, parse_e2e, parse_sets
from .refs import NAMES as REF_NAMES, Refs
from .report import finish, log, text_table, write
from .rerender import rerender
from .sets import SET_NAMES, conv_layer, select


def default_paths(a, target_name, date):
    out = Path(a.out) if a.out else Path("build") / "bench" / f"bench-{target_name}-{date}.json"
    md = Path(a.md) if a.md else out.with_suffix(".md")
    return out, md


def cmd_bench(a):
    if a.from_json:
        return rerender(a)
    started = time.monotonic()
    target = get_target(a.target)
    if target.kind == "cpu":
        # idle OpenMP threads must sleep, not spin: spinning ones starve PoCL's (and torch's
        # own, on a loaded machine, by 100x: 80 ms instead of 0.4 ms for a small conv)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # before the device is opened: a set the precision cannot run is a one-line error
    sets = parse_sets(a.sets, SET_NAMES, getattr(a, "precision", None))
    dev = Device(target)
    opts = Options(a, dev.target)
    patterns = [p for p in (a.layers or "").split(",") if p]
    date = datetime.date.today().isoformat()
    out, md = default_paths(a, target.name, date)
    refs = Refs([r for r in REF_NAMES if a.refs == "auto" or r in a.refs.split(",")], dev,
                a.quiet)
    registered = [v.name for v in VARIANTS]
    tdict = target_dict(dev.target)
    doc = {"tool": "aotconv bench", "version": __version__, "date": date,
           "command": "aotconv bench " + " ".join(shlex.quote(x) for x in a.argv),
           "target": tdict, "device_kind": dev.target.kind, "environment": environment(dev),
           "mode": {"tune": "tune", "records": "records-only (the recorded choices)"}.get(
               opts.mode, "no-tune (best registered fallback)"),
           "budget": (f"{opts.budget} per layer" if opts.budget and not opts.set_budget else
                      f"{opts.set_budget} per set" if opts.set_budget else
                      "tuner default per layer" if opts.mode == "tune" else None),
           "e2e_budget": opts.e2e_budget, "precision": opts.precision, "repeats": opts.repeats, "warmup": opts.warmup,
           "max_measure_s": opts.max_measure_s,
           "verify_images": opts.verify_images,
           "scale": (f"batch capped at N={opts.max_batch} (layers and end to end); the "
                     f"original N is kept in each row" if opts.max_batch else None),
           "refs": refs.status, "ref_label": refs.label(), "registered_variants": registered,
           "sets": {}, "e2e": [], "notes": list(a.note or [])}
    if refs.torch_device is None and dev.target.kind == "gpu":
        doc["notes"].append("PyTorch/cuDNN was not available: no reference ratios.")
    try:
        for s in sets:
            if s == "e2e":
                continue
            chosen = select([s], patterns)
            if not chosen:
                continue
            rows = []
            doc["sets"][s] = {"rows": rows}
            choices = {}
            if opts.mode == "tune" and opts.set_budget:
                layers = [conv_layer(t, opts.max_batch)[0] for _, t in chosen]
                budget = opts.fit_budget(opts.set_budget, 20 + 3 * len(layers), s,
                                         doc["notes"])
                log(f"aotconv bench: tuning {s} ({len(layers)} layers, budget {budget})",
                    a.quiet)
                t0 = time.monotonic()
                try:
                    choices = tune_layers(dev, layers, opts, budget=budget)
                except Exception as e:
                    doc["notes"].append(f"{s}: set tuning failed ({type(e).__name__}: {e}); "
                                        f"each layer tuned alone instead")
                doc["sets"][s]["tune_s"] = round(time.monotonic() - t0, 1)
            for i, (_, t) in enumerate(chosen):
                if opts.out_of_time():
                    ours = {"error": "skipped: --deadline reached"}
                    c = choices.get(t[0])
                    if c is not None:                 # keep what the tuning found
                        ours.update(variant=c.variant, cfg=str(c.cfg), source=c.source,
                                    tuner_ms=c.time_ms)
                    rows.append({**skeleton(s, t, opts), "ours": ours})
                    continue
                log(f"aotconv bench: [{s} {i + 1}/{len(chosen)}] {t[0]}", a.quiet)
                row = bench_layer(dev, refs, s, t, opts, choices.get(t[0]))
                rows.append(row)
                finish(doc, tdict, registered)
                write(doc, out, md)
                print_row(row, refs.label(), a.quiet)
        if "e2e" in sets:
            seen = set()
            for net_name, batch in parse_e2e(a.e2e):
                key = (net_name, min(batch, opts.max_batch) if batch and opts.max_batch
                       else batch)
                if key in seen:
                    doc["notes"].append(f"end to end {net_name} batch {batch}: the same as an "
                                        f"earlier row once scaled; not run twice")
                    continue
                seen.add(key)
                if opts.out_of_time():
                    doc["e2e"].append({"net": net_name, "batch": batch, "ours":
                                       {"error": "skipped: --deadline reached"}, "torch": {}})
                    continue
                log(f"aotconv bench: end to end {net_name} batch {batch}", a.quiet)
                doc["e2e"].append(bench_e2e(dev, refs, net_name, batch, opts, doc["notes"]))
                doc["elapsed_s"] = round(time.monotonic() - started, 1)
                finish(doc, tdict, registered)
                write(doc, out, md)
    finally:
        opts.close()
        doc["environment"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        doc["elapsed_s"] = round(time.monotonic() - started, 1)
        finish(doc, tdict, registered)
        write(doc, out, md)
    if not a.quiet:
        print(text_table(doc))
    print(f"{out}\n{md}")
    return 0


def print_row(row, label, quiet):
    if quiet:
        return
    o = row.get("ours") or {}
    t = (row["refs"].get("torch") or {}).get("ms")
    c = (row["refs"].get("clblast") or {}).get("ms")
    r = row.get("ours_over_torch")
    print(f"  {row['name']}: ours {o.get('ms', float('nan')):.4f} ms ({o.get('variant', '?')})"
          + (f", {label} {t:.4f} ms, ratio {r:.2f}" if t else "")
          + (f", CLBlast {c:.4f} ms" if c else "")
          + (f", {o['error']}" if o.get("error") else ""), file=sys.stderr, flush=True)

"""Does seeding from similar layers reach the same quality in fewer trials? A replay, no device:

    python -m aotconv.bench.seeding_study results/h100/study-logs results/pocl-cpu/study-logs-scale8

Each folder holds the search-quality study's logs (aotconv.bench.study): one layer's space
measured exhaustively (or a seeded sample of it) per file, all on one device. Every log is
replayed as the layer to tune, leave-one-out: the other logs of its folder are "the records"
(strategies.seeding.Library), which give the layer its seeds (the best points of the nearest
signatures, mapped onto its grid) and the `model` strategy its prior. The same strategy is
replayed without them (today's search from scratch) with the same seeds of the random
generator. Per layer and budget: the median (over `--runs` seeds) % of the log's best reached,
and the median number of trials until the search first reached 95% of the best (and the best
itself; "-" when the median run never did within the whole log's size).
"""
import math
from pathlib import Path
import statistics
import sys

import numpy as np

from ..errors import AotconvError
from ..tune.records import read_log
from ..tune.replay import Recorded
from ..tune.strategies import Evaluator, Exhausted, run as run_strategy
from ..tune.strategies.seeding import Library, MAX_SEEDS
from . import script

MODULE = "aotconv.bench.seeding_study"
BUDGETS = (4, 8, 16, 32)
LEVELS = (95.0, 100.0)
HORIZON = 64                # trials of each replay: "trials to" counts within these


def replay(recorded, strategy, trials, seed, hints=None):
    """The trace (best cost after each trial) of one search of `recorded`'s grid: with hints,
    their seeds first and the prior given to the strategy, as tune_layer does."""
    ev = Evaluator(len(recorded.grid), lambda idx: [recorded.costs[i] for i in idx],
                   trials=trials, hints=hints)
    try:
        if hints is not None and hints.seeds:
            ev(hints.seeds[:max(0, trials)])
        run_strategy(strategy, recorded.grid, ev, np.random.default_rng(seed))
    except Exhausted:
        pass
    return ev.trace


def pct(best, found):
    return 100.0 * best / found if math.isfinite(found) and found > 0 else 0.0


def trials_to(trace, best, level):
    """1-based trial at which `trace` first reached `level` % of `best`, or None."""
    for i, c in enumerate(trace, 1):
        if pct(best, c) >= level - 1e-9:
            return i
    return None


def _median_trials(values, cap):
    """Median of trial counts where a run that never got there counts as past `cap`."""
    m = statistics.median([v if v is not None else math.inf for v in values])
    return None if not math.isfinite(m) else m


def study_folder(folder, strategy="model", runs=24, budgets=BUDGETS, only=None):
    """{layer: row} of every log of `folder` (or those named in `only`) against the others."""
    logs = sorted(Path(folder).glob("*.jsonl"))
    if len(logs) < 2:
        raise AotconvError(f"{folder}: leave-one-out needs at least two logs, found {len(logs)}")
    records = {p.stem: read_log(p) for p in logs}
    out = {}
    for name, recs in records.items():
        if only is not None and name not in only:
            continue
        rec = Recorded(recs)
        n = len(rec.grid)
        op = recs[0]["op"]
        lib = Library.from_records([r for other, rs in records.items() if other != name
                                    for r in rs])
        hints = lib.hints(op, rec.grid, max_seeds=MAX_SEEDS)
        best = rec.best
        row = {"points": n, "op": op, "sources": [[round(d, 2), o] for d, o in hints.sources],
               "seeds": len(hints.seeds), "budgets": {}, "to": {}}
        full = {}
        for label, h in (("scratch", None), ("seeded", hints)):
            full[label] = [replay(rec, strategy, min(n, HORIZON), s, h) for s in range(runs)]
        for b in budgets:
            if b > n:
                continue
            row["budgets"][b] = {
                label: statistics.median(pct(best, t[min(b, len(t)) - 1]) for t in traces)
                for label, traces in full.items()}
        for level in LEVELS:
            row["to"][level] = {label: _median_trials([trials_to(t, best, level)
                                                       for t in traces], n)
                                for label, traces in full.items()}
        out[name] = row
    return out


def markdown(study):
    lines = [f"Made with: `{study['command']}` ({study['runs']} seeds per cell, strategy "
             f"`{study['strategy']}`).", ""]
    budgets = [b for b in BUDGETS if any(str(b) in r["budgets"] or b in r["budgets"]
                                         for f in study["folders"].values() for r in f.values())]
    head = "| layer | points | nearest signatures (distance) | " + " | ".join(
        f"{b} trials" for b in budgets) + " | trials to 95% | trials to the best |"
    lines += [head, "|" + "---|" * (5 + len(budgets))]
    for folder, rows in study["folders"].items():
        for name, r in rows.items():
            cells = []
            for b in budgets:
                c = r["budgets"].get(b) or r["budgets"].get(str(b))
                cells.append(f"{c['scratch']:.0f} -> **{c['seeded']:.0f}**" if c else "-")
            to = []
            for level in LEVELS:
                c = r["to"].get(level) or r["to"].get(str(level))
                fmt = lambda v: "-" if v is None else f"{v:g}"
                to.append(f"{fmt(c['scratch'])} -> **{fmt(c['seeded'])}**")
            src = ", ".join(f"{o.split('|')[1]} ({d:g})" for d, o in r["sources"][:2])
            lines.append(f"| {Path(folder).parent.name}/{name} | {r['points']} | {src} | "
                         + " | ".join(cells) + " | " + " | ".join(to) + " |")
    lines += ["", "Cells: from scratch -> seeded; % of the log's best reached (median), trials "
              f"until the median run first reached 95% of the best and the best itself (\"-\": "
              f"not within {HORIZON} trials)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = script.parser(MODULE, __doc__)
    p.add_argument("folders", nargs="+", help="folders of one device's exhaustive logs")
    p.add_argument("--strategy", default="model")
    p.add_argument("--runs", type=int, default=24)
    p.add_argument("--out", help="write the study's JSON here (and the table next to it, .md)")
    a = p.parse_args(argv)
    study = {"command": script.command(MODULE, argv),
             "strategy": a.strategy, "runs": a.runs,
             "folders": {f: study_folder(f, a.strategy, a.runs) for f in a.folders}}
    text = markdown(study)
    if a.out:
        script.write_results(a.out, study, text)
    print(text)
    return 0


entry = script.entry("seeding_study", main)


if __name__ == "__main__":
    sys.exit(entry())

"""Distil tuning records to what a build reads from them (the shipped aotconv/data/<target>.jsonl).

A tuning run appends one record per trial, each with the time of every repeat. A build reads
far less. For one op signature, per variant (aotconv.tune.records.Key: the device or target,
the op, the variant, its template hash, aotconv's version), the records give {cfg: outcome}, the
last record of a cfg winning, and the points the current constraints still allow are read by:

  - choose (tune.search.records_only): the fastest correct point of all variants, and its time;
  - layouts.layout_options: the fastest correct point in each (read, write) layout pair the
    variants offer, to price a layout change against the conversions it saves;
  - fusion.decide: the chosen times of the conv, the pool and the fused conv_pool (each the
    fastest of its own signature), and layouts.ConvertCosts: the chosen layout_convert's time;
  - report.md: the fallback's time (what tuning bought) and the counts of points tried.

So this keeps, per key and per (read, write) layout pair, the KEEP (default 2) fastest correct
points, ties included: the fastest decides, the next is a spare for when a stricter constraint
prunes it; and each key's record of the fallback. The selection reads the records and the
variants' layouts_of only, not the constraints, so it is the same whatever the space code
says. It drops the times of the repeats (the median stays), failed points and superseded
duplicates. The kept records stay in input order, so a later record of a cfg still wins.
Report counts of records-built layers (points tried, the histogram) then describe the
distilled records.

Before anything is written, every op signature whose records aotconv can read (its layer
rebuilt from the signature, its target a known profile) is chosen from the input and from the
distilled records through aotconv's own reader and records-only search, matched by the target
name (device absent) and by each recorded device (device present); any difference is an error
and the output is left as it was.

    python tools/distill_records.py RAW.jsonl [MORE.jsonl ...] -o aotconv/data/h100.jsonl

The inputs are read in full first, so the output may be one of them (merging new tuning
results into a shipped file). Distilling a distilled file gives the same file.
"""
import argparse
import json
import os
from pathlib import Path
import sys
import tempfile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotconv.errors import AotconvError                                    # noqa: E402

KEEP = 2
# what groups records into one lookup: the key fields Key.matches compares, by target name
# (the device absent) or by device (present)
_BASE = ("format", "aotconv", "op", "variant", "template")
VIEWS = (_BASE + ("target",), _BASE + ("device",))
_NO_TEMPLATE = {v: tuple(k for k in v if k != "template") for v in VIEWS}


class DistillError(AotconvError):
    """Input that cannot be distilled, or a distilled file that would choose differently."""


def read(paths):
    """Every record of `paths` in order, as (where, record); where = 'file:line'."""
    out = []
    for path in paths:
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            raise DistillError(f"{path}: cannot read it ({e.strerror})") from None
        with f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise DistillError(f"{path}:{n}: not a JSON record ({e.msg}); delete or "
                                       f"repair the line") from None
                missing = [k for k in _BASE + ("target", "cfg", "status") if k not in rec] \
                    if isinstance(rec, dict) else ["(not an object)"]
                if missing:
                    raise DistillError(f"{path}:{n}: not a tuning record (missing "
                                       f"{', '.join(missing)}); delete the line")
                out.append((f"{path}:{n}", rec))
    return out


def _group(rec, view):
    return tuple(json.dumps(rec.get(k), sort_keys=True) for k in view)


def _cfg_key(rec):
    return json.dumps(rec["cfg"])


# -- layers and layouts from an op signature -----------------------------------------------------

def layer_of(op):
    """The layer an op signature describes (aotconv.tune.records.layer_of), or None."""
    from aotconv.tune.records import layer_of as rebuild
    return rebuild(op)


class Ops:
    """Per op signature: its rebuilt layer; per record: the layouts its point reads and writes."""

    def __init__(self):
        self.layers = {}

    def layer(self, op):
        if op not in self.layers:
            self.layers[op] = layer_of(op)
        return self.layers[op]

    def layouts(self, rec):
        from aotconv.tune.records import cfg_from_json
        from aotconv.variants import BY_NAME
        layer, v = self.layer(rec["op"]), BY_NAME.get(rec["variant"])
        if layer is None or v is None:
            return None
        try:
            return tuple(v.layouts_of(layer, cfg_from_json(rec["cfg"])))
        except Exception:               # a record of a knob this version does not know
            return None


# -- selection -----------------------------------------------------------------------------------

def _fastest(recs, idx, keep):
    """The `keep` fastest of the records `idx` index, and every one tied with the last."""
    idx = sorted(idx, key=lambda i: (recs[i]["time_ms"], _cfg_key(recs[i])))
    if len(idx) <= keep:
        return idx
    cut = recs[idx[keep - 1]]["time_ms"]
    return [i for i in idx if recs[i]["time_ms"] <= cut]


def _ok(rec):
    t = rec.get("time_ms")
    return rec.get("status") == "ok" and isinstance(t, (int, float)) and t > 0


def distill(records, keep=KEEP, ops=None):
    """The records a build reads, in input order (records: [(where, record)])."""
    ops = ops or Ops()
    recs = [r for _, r in records]
    kept = set()
    last = {}                                       # (view, group, cfg) -> index of its last
    for view in VIEWS:
        # a record of another template with the same kernel hash is the same point
        # (Key.matches): a later one supersedes it as a later record of its own template does
        same = {}
        for i, r in enumerate(recs):
            if isinstance(r.get("kernel"), str):
                same[(_group(r, _NO_TEMPLATE[view]), _cfg_key(r), r["kernel"])] = i
        effective = {}                              # group -> {cfg: index}
        for i, r in enumerate(recs):
            g = _group(r, view)
            effective.setdefault(g, {})[_cfg_key(r)] = i
            last[(view, g, _cfg_key(r))] = i
        for g, by_cfg in effective.items():
            by_cfg = {c: i for c, i in by_cfg.items()
                      if not isinstance(recs[i].get("kernel"), str)
                      or same[(_group(recs[i], _NO_TEMPLATE[view]), c, recs[i]["kernel"])] == i}
            idx = list(by_cfg.values())
            kept.update(i for i in idx if recs[i].get("fallback") is True)
            ok = [i for i in idx if _ok(recs[i])]
            by_layout = {}
            for i in ok:
                by_layout.setdefault(ops.layouts(recs[i]), []).append(i)
            for group in by_layout.values():
                kept.update(_fastest(recs, group, keep))
    # a cfg kept under one view is seen under the other too: keep its last record there, so
    # that no view reads an older, superseded record of it; and a record of another template
    # whose kernel is the same (Key.matches) is the same point: keep the cfg's last record
    # of any template
    anyt = {}
    for i, r in enumerate(recs):
        for v in VIEWS:
            anyt[(v, _group(r, _NO_TEMPLATE[v]), _cfg_key(r))] = i
    while True:
        more = {last[(v, _group(recs[i], v), _cfg_key(recs[i]))] for i in kept for v in VIEWS}
        more |= {anyt[(v, _group(recs[i], _NO_TEMPLATE[v]), _cfg_key(recs[i]))]
                 for i in kept for v in VIEWS}
        if more <= kept:
            break
        kept |= more
    out = []
    for i in sorted(kept):
        r = dict(recs[i])
        r.pop("times", None)
        out.append(r)
    return out


# -- the check: the same choices from both -------------------------------------------------------

def _choices(path, ops, sigs):
    """{(op, view, target/device): what a records-only build reads} from the records in `path`."""
    from aotconv.space import Candidate
    from aotconv.targets import TARGETS
    from aotconv.tune import search
    from aotconv.tune.records import Store
    from aotconv.variants import BY_NAME
    store = Store(read=[path])
    out = {}
    for op, target_name, device in sigs:
        layer, target = ops.layer(op), TARGETS[target_name]
        r = search.records_only([[layer]], target, store, device)[op]
        per_layout = {}
        for cand, o in r.outcomes.items():
            if o.ok and o.time_ms is not None:
                lay = tuple(BY_NAME[cand.variant].layouts_of(layer, cand.cfg))
                per_layout[lay] = min(per_layout.get(lay, (float("inf"), "")),
                                      (o.time_ms, str(cand)))
        fb = r.outcomes.get(r.fallback)
        out[(op, target_name, json.dumps(device, sort_keys=True))] = dict(
            best=str(Candidate(r.best.variant, r.best.cfg)) if r.best else None,
            best_ms=r.best_outcome.time_ms if r.best_outcome else None,
            layouts={"/".join(k): v for k, v in sorted(per_layout.items())},
            fallback_ms=fb.time_ms if fb is not None and fb.ok else None)
    return out


def check(raw_path, out_path, records, ops):
    """[difference lines] between the choices read from `raw_path` and from `out_path`."""
    from aotconv.targets import TARGETS
    sigs = set()
    for _, r in records:
        if ops.layer(r["op"]) is None or r.get("target") not in TARGETS:
            continue
        sigs.add((r["op"], r["target"], None))
        if isinstance(r.get("device"), dict):
            sigs.add((r["op"], r["target"], json.dumps(r["device"], sort_keys=True)))
    sigs = [(op, t, json.loads(d) if d else None) for op, t, d in sorted(sigs, key=str)]
    a, b = _choices(raw_path, ops, sigs), _choices(out_path, ops, sigs)
    diff = []
    for k in a:
        if a[k] != b[k]:
            fields = [f for f in a[k] if a[k][f] != b[k][f]]
            diff.append(f"{k[0]} ({k[1]}{', device ' + k[2] if k[2] != 'null' else ''}): "
                        + "; ".join(f"{f} {a[k][f]} -> {b[k][f]}" for f in fields))
    chosen = sum(1 for v in a.values() if v["best"] is not None)
    return diff, len(sigs), chosen


def stamp_kernels(records):
    """Give each kept record of its variant's current template hash its kernel hash (the
    `kernel` field: what keeps a record usable after a refactor that renders the same kernel);
    (stamped now, had it, left without)."""
    from aotconv.tune.records import stamp_kernels as stamp
    return stamp(records)


def _default_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write(records, path):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="records files (JSON lines), read in this order")
    p.add_argument("-o", "--output", required=True, help="the distilled file (replaced whole)")
    p.add_argument("--keep", type=int, default=KEEP,
                   help=f"fastest points kept per key and layout pair (default {KEEP})")
    p.add_argument("--no-check", action="store_true",
                   help="skip comparing the choices read from the input and the output")
    a = p.parse_args(argv)
    try:
        if a.keep < 1:
            raise DistillError(f"--keep {a.keep}: keep at least the fastest point (1)")
        records = read(a.inputs)
        size_in = sum(os.path.getsize(x) for x in a.inputs)
        ops = Ops()
        out = distill(records, a.keep, ops)
        stamped, already, unstamped = stamp_kernels(out)
        outp = Path(a.output)
        outp.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=outp.name + ".", suffix=".tmp", dir=outp.parent)
        os.close(fd)
        try:
            _write(out, tmp)
            checked = chosen = 0
            if not a.no_check:
                fd, raw = tempfile.mkstemp(suffix=".jsonl")
                os.close(fd)
                try:
                    _write([r for _, r in records], raw)
                    diff, checked, chosen = check(raw, tmp, records, ops)
                finally:
                    os.unlink(raw)
                if diff:
                    raise DistillError(f"the distilled records would choose differently for "
                                       f"{len(diff)} op(s), {outp} left as it was: "
                                       + " | ".join(diff[:5]))
            os.chmod(tmp, outp.stat().st_mode & 0o777 if outp.exists() else _default_mode())
            os.replace(tmp, outp)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except AotconvError as e:
        print(f"distill_records: error: {e}", file=sys.stderr)
        return 2
    print(f"{outp}: {len(out)} of {len(records)} records kept, {outp.stat().st_size} bytes "
          f"(input {size_in} bytes)"
          + (f"; the same choices from both in {checked} lookups (op, target or device), "
             f"{chosen} of them from records" if checked else "")
          + f"; kernel hashes: {stamped} added, {already} kept, {unstamped} records without "
            f"(a template hash older than this version's, or an op it cannot rebuild)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`aotconv bench --from-json`: merge earlier bench JSON files and render them again (JSON and
markdown) without running anything."""
import json
from pathlib import Path

from .report import finish, precision_of, text_table, write


def e2e_mode(row, doc):
    """How an end-to-end row's kernels were chosen (older files kept it only per document)."""
    if row.get("mode"):
        return row["mode"]
    if str(doc.get("mode", "")).startswith("no-tune"):
        return "fallback (no tuner)"
    return f"tuned, budget {row.get('budget') or 'default'}"


def merge_rows(rows, new, key):
    """Append `new` rows to `rows`; a row with the key of an earlier one replaces it (a re-run),
    unless it failed where the earlier one succeeded."""
    where = {key(r): i for i, r in enumerate(rows)}
    for r in new:
        k = key(r)
        if k not in where:
            where[k] = len(rows)
            rows.append(r)
        elif not (r.get("ours") or {}).get("error") or (rows[where[k]].get("ours") or {}).get(
                "error"):
            rows[where[k]] = r


def rerender(a):
    """--from-json: merge bench JSON files and write the markdown (and the merged JSON) without
    running anything. Rows are appended in order; a later row for the same layer (or network,
    batch, mode and precision) replaces an earlier one unless it failed where that one did not."""
    docs = [json.loads(Path(p).read_text()) for p in a.from_json]
    for d in docs:
        for r in d.get("e2e", []):
            r["mode"] = e2e_mode(r, d)
    doc = docs[0]
    commands = list(doc.get("commands") or [doc["command"]])
    # a network's rows of two precisions are two rows, never one replacing the other
    e2e_key = lambda r: (r["net"], r["batch"], r.get("mode"), precision_of(r))
    rows = list(doc.get("e2e", []))
    doc["e2e"] = []
    merge_rows(doc["e2e"], rows, e2e_key)
    for d in docs[1:]:
        for name, s in d.get("sets", {}).items():
            merge_rows(doc["sets"].setdefault(name, {"rows": []})["rows"], s["rows"],
                       lambda r: r["name"])
        merge_rows(doc["e2e"], d.get("e2e", []), e2e_key)
        doc["notes"].extend(n for n in d.get("notes", []) if n not in doc["notes"])
        for c in d.get("commands") or [d["command"]]:
            if c not in commands:
                commands.append(c)
        if d.get("elapsed_s") and doc.get("elapsed_s"):
            doc["elapsed_s"] += d["elapsed_s"]
    if len(commands) > 1:
        doc["commands"] = commands
    doc["notes"].extend(n for n in (a.note or []) if n not in doc["notes"])
    finish(doc, doc["target"], doc.get("registered_variants", ()))
    out = Path(a.out) if a.out else Path(a.from_json[0])
    md = Path(a.md) if a.md else out.with_suffix(".md")
    write(doc, out, md)
    if not a.quiet:
        print(text_table(doc))
    print(f"{out}\n{md}")
    return 0

"""The autotuner: measure candidates on the device, search each layer's space, keep records.

Modules, in the order data flows: strategies/ (how to walk a space), measure.py (build, run,
verify, time one candidate, every failure a typed Outcome), records.py (append-only JSON lines
keyed by device, op, variant, template and version), search.py (one layer's search and the
network-wide budget), progress.py, cli.py (`aotconv space`, `aotconv tune`), study.py (the
search-quality experiment), replay.py (strategies against a recorded log, no device).
"""

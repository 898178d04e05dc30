"""Tuning records: append-only JSON lines, one per measured (or pruned-on-the-device) candidate.

Each record carries its key: the device (vendor, name, driver), the target profile's name, the
op signature (op, shapes, attributes incl. a fused activation), the variant, the variant's
template hash and aotconv's version. A record is used only when every part of its key matches
what would be measured now; anything else (another driver, an edited template, a new release)
is ignored, never trusted. When the target's device is absent the device part cannot be
checked, and the target's name stands for it (shipped records, --tuning-db).

Where records live:
  - the user cache: $AOTCONV_CACHE_DIR or platformdirs.user_cache_dir("aotconv"), file
    records.jsonl, read and appended by every tuning run;
  - shipped with the package: aotconv/data/<target>.jsonl (read only; AOTCONV_SHIPPED_RECORDS=0
    leaves them out, to tune from nothing);
  - --tuning-db FILE: read, and appended to as well when tuning.
"""
import json
import os
from pathlib import Path
import sys
import time

from .. import __version__
from .measure import Outcome

FORMAT = 1
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def cache_dir():
    d = os.environ.get("AOTCONV_CACHE_DIR")
    if not d:
        import platformdirs
        d = platformdirs.user_cache_dir("aotconv")
    return Path(d)


def cache_file():
    return cache_dir() / "records.jsonl"


def shipped_file(target_name):
    return DATA_DIR / f"{target_name}.jsonl"


def _jsonable(v):
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def cfg_to_json(cfg):
    return [[k, _jsonable(v)] for k, v in cfg.items]


def cfg_from_json(items):
    from ..variants.base import Config
    return Config(tuple((k, _hashable(v)) for k, v in items))


class Key:
    """What a record must match to be used for one (layer, variant) on one device/target."""

    def __init__(self, layer, variant, target, device=None):
        self.op = layer.signature_str()
        self.variant = variant.name
        self.template = variant.template_hash()
        self.target = target.name
        self.device = device                 # device_identity dict, or None when absent
        self.version = __version__

    def fields(self):
        return {"format": FORMAT, "aotconv": self.version, "device": self.device,
                "target": self.target, "op": self.op, "variant": self.variant,
                "template": self.template}

    def matches(self, rec):
        if (rec.get("format") != FORMAT or rec.get("aotconv") != self.version
                or rec.get("op") != self.op or rec.get("variant") != self.variant
                or rec.get("template") != self.template):
            return False
        if self.device is not None:
            return rec.get("device") == self.device
        return rec.get("target") == self.target


class Store:
    """Records read from several files, appended to one (or two) of them."""

    def __init__(self, read=(), write=()):
        self.read_paths = [Path(p) for p in read]
        self.write_paths = [Path(p) for p in write]
        self._by_op = None
        self.malformed = 0

    @classmethod
    def default(cls, target, tuning_db=None):
        dbs = [tuning_db] if isinstance(tuning_db, (str, os.PathLike)) else list(tuning_db or [])
        shipped = [] if os.environ.get("AOTCONV_SHIPPED_RECORDS") == "0" else \
            [shipped_file(target.name)]
        read = shipped + [cache_file()] + dbs
        return cls(read=read, write=[cache_file()] + dbs)

    def _load(self):
        if self._by_op is not None:
            return
        self._by_op = {}
        seen = set()
        for p in self.read_paths + self.write_paths:
            if p in seen or not p.is_file():
                continue
            seen.add(p)
            with open(p, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rec = json.loads(line)
                        self._by_op.setdefault((rec["op"], rec["variant"]), []).append(rec)
                    except (ValueError, KeyError, TypeError):
                        self.malformed += 1        # a torn last line of a killed run, say

    def lookup(self, key):
        """{Config: Outcome} of the records matching `key`; a later record of a cfg wins."""
        self._load()
        out = {}
        for rec in self._by_op.get((key.op, key.variant), ()):
            if key.matches(rec):
                try:
                    out[cfg_from_json(rec["cfg"])] = Outcome.from_dict(rec)
                except (ValueError, KeyError, TypeError):
                    self.malformed += 1
        return out

    def append(self, key, cfg, outcome, **extra):
        """Write one record to every write path (flushed at once: a killed run loses nothing)."""
        rec = key.fields()
        rec["cfg"] = cfg_to_json(cfg)
        rec.update(outcome.as_dict())
        rec["at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        rec.update(extra)
        line = json.dumps(rec, sort_keys=False) + "\n"
        for p in self.write_paths:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                with open(p, "a", encoding="utf-8") as f:
                    _lock(f)
                    f.write(line)
                    f.flush()
            except OSError as e:
                print(f"aotconv: warning: cannot append a tuning record to {p}: {e}",
                      file=sys.stderr)
        if self._by_op is not None:
            self._by_op.setdefault((rec["op"], rec["variant"]), []).append(rec)
        return rec


def _lock(f):
    try:
        import fcntl
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)   # released when the file closes
    except (ImportError, OSError):
        pass


def read_log(path):
    """Every record of a file (for replays and the study), in order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out

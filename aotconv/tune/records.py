"""Tuning records: append-only JSON lines, one per measured (or pruned-on-the-device) candidate.

Each record carries its key: the device (vendor, name, driver), the target profile's name, the
op signature (op, shapes, attributes incl. a fused activation), the variant, the variant's
template hash, aotconv's version, and the kernel hash of what was measured (`kernel_hash`: the
rendered source, build options, launches and buffers of that configuration). A record is used
only when every part of its key matches what would be measured now, its template hash or,
failing that, its kernel hash: a record stays valid as long as the kernel it timed is the one
that would run now, whatever was refactored around it. Anything else (another driver, a kernel
that renders differently, a new release) is ignored, never trusted. When the target's device is
absent the device part cannot be checked, and the target's name stands for it (shipped
records, --tuning-db).

Where records live:
  - the user cache: $AOTCONV_CACHE_DIR or platformdirs.user_cache_dir("aotconv"), file
    records.jsonl, read and appended by every tuning run;
  - shipped with the package: aotconv/data/<target>.jsonl (read only; AOTCONV_SHIPPED_RECORDS=0
    leaves them out, to tune from nothing);
  - --tuning-db FILE: read, and appended to as well when tuning (it must exist).

A layer with no usable record of its own may borrow a twin's (`borrow`): the fastest recorded
point of a signature that differs from its own only in the epilogue (bias, fused activation,
fused residual add: `twin_key`), where that point is one of the layer's own space. Its time is
the twin's, so the choice carries none and nothing is recorded for the layer
(docs/tuning.md, Borrowed records).

A records file is a cache, so damage never breaks a build: a line that is not UTF-8, not JSON,
cut short by a killed run or holds a field of the wrong type or an impossible value (a NaN,
infinite, zero or negative time, an unknown outcome) is skipped, and each file's damaged lines
are reported in one warning. Appends write one whole line with one write, starting on a fresh
line when the file does not end with one, so a torn tail never swallows the next record.
"""
from dataclasses import dataclass
import hashlib
import json
import math
import os
from pathlib import Path
import re
import sys
import time

from .. import __version__
from ..errors import AotconvError, one_line
from ..harness import BUILD_OPTIONS
from .measure import Outcome, Status

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


# -- the kernel a record timed -------------------------------------------------------------------

# The tuner renders and launches every candidate with this kernel name (harness.LayerRun,
# measure.Plan); a built library names a layer's kernels k_<file> instead (schedule), which is
# why the hash renders with this one: the layer's name never enters it.
KERNEL_PREFIX = "k"


def _arg_json(a):
    value = a.value
    if a.kind == "int":
        value = int(value)
    elif a.kind == "float":
        value = float(value)
    return [a.kind, a.name, a.index, value]


def kernel_description(variant, layer, cfg):
    """Everything that determines what runs, and how it is timed, for `cfg` of `variant` on
    `layer` (whose op signature the record's key holds): the rendered program, the build
    options, every launch (kernel name, arguments, global and local sizes, phase), the
    variant's own buffers, its scratch, and the storage order of the input it reads and the
    output it writes. Rendered with KERNEL_PREFIX, as measured."""
    launches = [[l.kernel, [_arg_json(a) for a in l.args], [int(x) for x in l.gsize],
                 [int(x) for x in l.lsize] if l.lsize else None, l.phase]
                for l in variant.launches(layer, cfg, KERNEL_PREFIX)]
    return {"sources": [variant.render(layer, cfg, KERNEL_PREFIX)],
            "options": list(BUILD_OPTIONS),
            "launches": launches,
            "buffers": sorted([k, int(n)] for k, n in variant.buffers(layer, cfg).items()),
            "scratch": int(variant.scratch_floats(layer, cfg)),
            "layouts": list(variant.layouts_of(layer, cfg))}


def kernel_hash(variant, layer, cfg):
    """The first 16 hex digits of the sha256 of kernel_description as canonical JSON (sorted
    keys, no spaces): the same exactly when the same kernel would be built and timed the same
    way."""
    text = json.dumps(kernel_description(variant, layer, cfg), sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def layer_of(op):
    """The layer (shapes, attributes and parameters) an op signature (Layer.signature_str)
    describes, or None when the text does not rebuild to the same signature."""
    from ..graph import Layer
    from ..ops import infer
    from .strategies.seeding import parse_signature
    parsed = parse_signature(op)
    if parsed is None:
        return None
    name, shapes, out_shape, attrs = parsed
    try:
        layer = Layer("record", name, attrs, ["input"] * len(shapes), in_shapes=shapes,
                      out_shape=out_shape)
        if layer.signature_str() != op:
            return None
        shape, layer.params = infer(name, dict(attrs), [list(s) for s in shapes])
        return layer if tuple(shape) == out_shape else None
    except Exception:                           # not a signature of any op this version knows
        return None


def stamp_kernels(records, variants=None):
    """Give every record of the current template hash of its variant that lacks a `kernel`
    field its kernel hash (in place), so that it stays usable after its variant or template is
    next edited without changing what it renders. Returns (stamped, already, left): records
    stamped now, records that had the field, records left without (a stale template hash, an
    op or variant this version cannot rebuild)."""
    if variants is None:
        from ..variants import BY_NAME as variants
    layers, stamped, already, left = {}, 0, 0, 0
    for rec in records:
        if isinstance(rec.get("kernel"), str):
            already += 1
            continue
        v = variants.get(rec.get("variant"))
        if v is None or rec.get("template") != v.template_hash():
            left += 1
            continue
        op = rec.get("op")
        if op not in layers:
            layers[op] = layer_of(op)
        try:
            kernel = kernel_hash(v, layers[op], cfg_from_json(rec["cfg"]))
        except Exception:
            left += 1
            continue
        items = list(rec.items())               # the field goes after the template hash
        at = next(i for i, (k, _) in enumerate(items) if k == "template") + 1
        rec.clear()
        rec.update(items[:at] + [("kernel", kernel)] + items[at:])
        stamped += 1
    return stamped, already, left


# -- records of the same shapes with another epilogue ------------------------------------------

def epilogue_fields():
    """The attributes of a layer's epilogue, what it does to each output after its main loop:
    the bias, the fused activation (act, alpha and the extras an act reads, graph.ACT_EXTRAS)
    and a fused residual add (`residual`, with its second input)."""
    from ..graph import ACT_EXTRAS
    extras = sorted({k for ks in ACT_EXTRAS.values() for k in ks})
    return ("act", "alpha", *extras, "bias", "residual")


def twin_key(op):
    """What an op signature (Layer.signature_str) holds besides its epilogue: the op, the
    shapes of the inputs its main loop reads (a residual's input left out), the output shape
    and every other attribute (storage included). Two signatures of one key are twins: the
    same kernel but for the epilogue. Only a layer with a fused epilogue (an `act` attribute,
    not an activation op itself, whose alpha is its own) has one; any other signature's key
    is itself, so it has no twins. None when `op` does not parse."""
    from ..graph import ACT_OPS
    from .strategies.seeding import parse_signature
    parsed = parse_signature(op)
    if parsed is None:
        return None
    name, shapes, out, attrs = parsed
    if "act" not in attrs or name in ACT_OPS:
        return (op,)
    if attrs.get("residual") and len(shapes) > 1:
        shapes = shapes[:-1]
    drop = epilogue_fields()
    rest = ",".join(f"{k}={v!r}" for k, v in sorted(attrs.items()) if k not in drop)
    return (name, tuple(shapes), out, rest)


def epilogue_difference(op, other):
    """The epilogue fields in which signature `other` differs from `op`, as `other` has them:
    "bias=True", "act=relu", "no residual" (text for a choice's source)."""
    from .strategies.seeding import parse_signature
    a, b = parse_signature(op)[3], parse_signature(other)[3]
    out = []
    for k in epilogue_fields():
        if a.get(k) == b.get(k):
            continue
        out.append(f"no {k}" if k not in b else f"{k}={b[k]}")
    return ",".join(out)


@dataclass(frozen=True)
class Borrowed:
    """A layer's choice taken from the records of a twin signature (twin_key): the twin's op
    signature, how its epilogue differs from the layer's (epilogue_difference), the point
    (space.Candidate) and what the record measured, on the twin: not this layer's time."""
    op: str
    epilogue: str
    candidate: object
    outcome: Outcome

    @property
    def source(self):
        """The choice's source in tuning.json, report.md and the build's log."""
        return f"record of {self.epilogue}"


def twin_points(layer, target, store, device=None, exclude=()):
    """[(cost, twin op, Candidate, Outcome)]: the ok records of `layer`'s twins (Store.twins)
    that match a Key of the twin (this device, or the target's name when absent; this version;
    the variant's template or kernel hash) and whose point is a point of `layer`'s own space
    (its variant serves this layer's epilogue and this build's precision, the configuration
    passes this layer's constraints and the target's limits: space.checked_space), `exclude`
    (Candidates) left out. The times are the twins': not this layer's."""
    from ..space import Candidate, checked_space
    from ..variants import for_layer
    found = []
    mine = {v.name for v in for_layer(layer)}
    for op in store.twins(layer.signature_str()):
        twin = layer_of(op)
        if twin is None:
            continue
        for v in for_layer(twin):
            if v.name not in mine:
                continue
            for cfg, o in store.lookup(Key(twin, v, target, device)).items():
                if o.ok and Candidate(v.name, cfg) not in exclude:
                    found.append((o.cost, op, Candidate(v.name, cfg), o))
    if not found:
        return []
    points = {}
    for _, _, c, _ in found:
        points.setdefault(c.variant, []).append(c.cfg)
    sp = checked_space(layer, target, points)
    valid = {Candidate(p.variant.name, c) for p in sp.parts for c in p.points}
    return [f for f in found if f[2] in valid]


def borrow(layer, target, store, device=None, exclude=()):
    """The Borrowed point of `layer` (which has no usable record of its own): the fastest of
    its twin_points, `exclude` (Candidates this layer's own records say failed) left out; None
    when there is none. Ties: the twin's signature, then the point, in text order."""
    found = twin_points(layer, target, store, device, exclude)
    if not found:
        return None
    _, op, cand, o = min(found, key=lambda f: (f[0], f[1], str(f[2])))
    return Borrowed(op, epilogue_difference(layer.signature_str(), op), cand, o)


# -- what a well-formed record is --------------------------------------------------------------

_STATUSES = frozenset(s.value for s in Status)
_KEY_STRINGS = ("aotconv", "target", "op", "variant", "template")
_KERNEL = re.compile(r"[0-9a-f]{16}")
_DEVICE_FIELDS = ("vendor", "name", "driver")


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    # an int past a float's range is no measurement (and math.isfinite would raise on it)
    return v.bit_length() <= 64 if isinstance(v, int) else math.isfinite(v)


def _knob_value(v):
    if isinstance(v, list):
        return all(_knob_value(x) for x in v)
    return isinstance(v, (str, bool, int)) or _number(v)


def check_record(rec):
    """Why `rec` (a parsed line) is not a well-formed record of this FORMAT, or None if it is.

    Only the known fields are judged; a field this version does not know is carried along,
    never read. A record of another format is not judged (its fields may differ): Key.matches
    ignores it."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    fmt = rec.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        return "'format' is missing or not an integer"
    if fmt != FORMAT:
        return None
    for k in _KEY_STRINGS:
        if not isinstance(rec.get(k), str) or not rec[k]:
            return f"'{k}' is missing or not a non-empty string"
    dev = rec.get("device", False)
    if dev is not None and not (isinstance(dev, dict) and set(dev) == set(_DEVICE_FIELDS)
                                and all(isinstance(dev[k], str) for k in _DEVICE_FIELDS)):
        return "'device' is neither null nor {vendor, name, driver} strings"
    cfg = rec.get("cfg")
    if not isinstance(cfg, list) or not all(
            isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) and kv[0]
            and _knob_value(kv[1]) for kv in cfg):
        return "'cfg' is not a list of [knob, value] pairs"
    if len({kv[0] for kv in cfg}) != len(cfg):
        return "'cfg' names a knob twice"
    status = rec.get("status")
    if not isinstance(status, str):
        return "'status' is missing or not a string"
    if status not in _STATUSES:
        return f"'status' {status!r} is not one of {', '.join(sorted(_STATUSES))}"
    t = rec.get("time_ms")
    if t is None and status == Status.OK.value:
        return "an 'ok' record without 'time_ms'"
    if t is not None and not (_number(t) and t > 0):
        return f"'time_ms' {t!r} is not a finite positive number of milliseconds"
    times = rec.get("times", [])
    if not isinstance(times, list) or not all(_number(x) and x >= 0 for x in times):
        return "'times' is not a list of finite non-negative numbers"
    err = rec.get("error")
    if err is not None and err != "inf" and not (_number(err) and err >= 0):
        return f"'error' {err!r} is neither a non-negative number nor \"inf\""
    b = rec.get("build_s")
    if b is not None and not (_number(b) and b >= 0):
        return f"'build_s' {b!r} is not a finite non-negative number"
    for k in ("message", "at", "layer"):
        if k in rec and not isinstance(rec[k], str):
            return f"'{k}' is not a string"
    if "kernel" in rec and not (isinstance(rec["kernel"], str) and _KERNEL.fullmatch(rec["kernel"])):
        return "'kernel' is not a kernel hash (16 hex digits)"
    if "fallback" in rec and not isinstance(rec["fallback"], bool):
        return "'fallback' is not true or false"
    return None


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def read_records(path):
    """(records, damaged) of one file: the well-formed records of this FORMAT in file order,
    and [(line number, why)] of the lines skipped. Raises OSError when the file cannot be read."""
    records, damaged = [], []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
            except UnicodeDecodeError:
                damaged.append((n, "not UTF-8"))
                continue
            except RecursionError:
                damaged.append((n, "nested too deeply to be a record"))
                continue
            except ValueError as e:
                torn = not raw.endswith(b"\n")
                damaged.append((n, "cut short (the last line, no newline)" if torn
                                else f"not JSON ({getattr(e, 'msg', e)})"))
                continue
            why = check_record(rec)
            if why:
                damaged.append((n, why))
            elif rec["format"] == FORMAT:
                records.append(rec)
    return records, damaged


_warned = {}        # path -> damaged lines already reported (one warning per file, not per read)


def _warn_damaged(path, damaged):
    if not damaged or _warned.get(str(path)) == len(damaged):
        return
    _warned[str(path)] = len(damaged)
    shown = "; ".join(f"line {n}: {why}" for n, why in damaged[:3])
    more = f"; and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    print(f"aotconv: warning: {one_line(path)}: skipped {len(damaged)} damaged tuning "
          f"record{'s' if len(damaged) > 1 else ''} ({shown}{more}); the other records are "
          f"used; delete those lines to silence this", file=sys.stderr, flush=True)


def _load_file(path, required=False):
    """The usable records of `path`, damaged lines skipped and reported; an unreadable file is
    a warning (a cache must not break a build) unless `required`."""
    try:
        records, damaged = read_records(path)
    except OSError as e:
        if required:
            raise AotconvError(f"{path}: cannot read tuning records: "
                               f"{e.strerror or e}") from None
        if _warned.get(str(path)) != "unreadable":
            _warned[str(path)] = "unreadable"
            print(f"aotconv: warning: {one_line(path)}: cannot read tuning records "
                  f"({e.strerror or e}); going on without them", file=sys.stderr, flush=True)
        return [], 0
    _warn_damaged(path, damaged)
    return records, len(damaged)


def check_tuning_db(path):
    """A --tuning-db FILE must be an existing, readable regular file: a misspelt name must not
    silently tune (and write) into nowhere."""
    p = Path(path)
    if not p.exists():
        raise AotconvError(f"--tuning-db {path}: no such file; name an existing records file "
                           f"(to start a new one, create it empty first: touch {path})")
    if not p.is_file():
        raise AotconvError(f"--tuning-db {path}: not a regular file; name a JSON-lines "
                           f"records file")
    if not os.access(p, os.R_OK):
        raise AotconvError(f"--tuning-db {path}: not readable (permission denied)")
    return p


class Key:
    """What a record must match to be used for one (layer, variant) on one device/target:
    format, version, op signature, variant, device (or the target's name), and either the
    variant's template hash or, for a record made before the variant or its template last
    changed, the kernel hash of the record's configuration (computed only for such records,
    once per configuration)."""

    def __init__(self, layer, variant, target, device=None):
        self.op = layer.signature_str()
        self.variant = variant.name
        self.template = variant.template_hash()
        self.target = target.name
        self.device = device                 # device_identity dict, or None when absent
        self.version = __version__
        self._layer, self._impl = layer, variant
        self._kernels = {}                   # Config -> kernel hash (None: it cannot render)

    def fields(self):
        return {"format": FORMAT, "aotconv": self.version, "device": self.device,
                "target": self.target, "op": self.op, "variant": self.variant,
                "template": self.template}

    def kernel(self, cfg):
        """The kernel hash of `cfg` for this key's layer and variant; None when the variant
        cannot render it (a knob it no longer has, say)."""
        if cfg not in self._kernels:
            try:
                self._kernels[cfg] = kernel_hash(self._impl, self._layer, cfg)
            except Exception:
                self._kernels[cfg] = None
        return self._kernels[cfg]

    def matches(self, rec):
        if (rec.get("format") != FORMAT or rec.get("aotconv") != self.version
                or rec.get("op") != self.op or rec.get("variant") != self.variant):
            return False
        if self.device is not None:
            if rec.get("device") != self.device:
                return False
        elif rec.get("target") != self.target:
            return False
        if rec.get("template") == self.template:
            return True
        kernel = rec.get("kernel")
        if not isinstance(kernel, str):
            return False
        try:
            cfg = cfg_from_json(rec["cfg"])
        except (KeyError, TypeError, ValueError):
            return False
        return self.kernel(cfg) == kernel


class Store:
    """Records read from several files, appended to one (or two) of them."""

    def __init__(self, read=(), write=(), required=()):
        self.read_paths = [Path(p) for p in read]
        self.write_paths = [Path(p) for p in write]
        self.required = {Path(p) for p in required}   # unreadable: an error, not a warning
        self._by_op = None
        self._twin_keys = {}                          # op -> twin_key(op)
        self.malformed = 0                            # damaged lines skipped

    @classmethod
    def default(cls, target, tuning_db=None):
        dbs = [tuning_db] if isinstance(tuning_db, (str, os.PathLike)) else list(tuning_db or [])
        dbs = [check_tuning_db(p) for p in dbs]
        shipped = [] if os.environ.get("AOTCONV_SHIPPED_RECORDS") == "0" else \
            [shipped_file(target.name)]
        read = shipped + [cache_file()] + dbs
        return cls(read=read, write=[cache_file()] + dbs, required=dbs)

    def _load(self):
        if self._by_op is not None:
            return
        self._by_op = {}
        seen = set()
        for p in self.read_paths + self.write_paths:
            if p in seen or not (p.exists() or p in self.required):
                continue
            seen.add(p)
            records, damaged = _load_file(p, required=p in self.required)
            self.malformed += damaged
            for rec in records:
                self._by_op.setdefault((rec["op"], rec["variant"]), []).append(rec)

    def lookup(self, key):
        """{Config: Outcome} of the records matching `key`; a later record of a cfg wins."""
        self._load()
        out = {}
        for rec in self._by_op.get((key.op, key.variant), ()):
            if key.matches(rec):
                try:
                    out[key._impl.completed(cfg_from_json(rec["cfg"]))] = \
                        Outcome.from_dict(rec)
                except (ValueError, KeyError, TypeError):
                    self.malformed += 1
        return out

    def twins(self, op):
        """The other op signatures the records hold that are twins of `op` (twin_key: the same
        but for the epilogue), in text order."""
        self._load()
        key = self._twin_key(op)
        if key is None or len(key) == 1:
            return []
        ops = {o for o, _ in self._by_op} - {op}
        return sorted(o for o in ops if self._twin_key(o) == key)

    def _twin_key(self, op):
        if op not in self._twin_keys:
            self._twin_keys[op] = twin_key(op)
        return self._twin_keys[op]

    def append(self, key, cfg, outcome, **extra):
        """Write one record to every write path, as one whole line in one write (a killed run
        loses at most the record being written, and never damages the ones before or after)."""
        rec = key.fields()
        kernel = key.kernel(cfg)
        if kernel is not None:
            rec["kernel"] = kernel
        rec["cfg"] = cfg_to_json(cfg)
        rec.update(outcome.as_dict())
        rec["at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        rec.update(extra)
        why = check_record(rec)
        try:
            line = None if why else (json.dumps(rec, allow_nan=False) + "\n").encode("utf-8")
        except (TypeError, ValueError) as e:
            why = str(e)
        if why:
            # an impossible measurement (a NaN time, say) is not kept: it would mislead later
            print(f"aotconv: warning: not recording {rec['variant']} {cfg} of layer "
                  f"{rec.get('layer', rec['op'])}: {why}", file=sys.stderr)
            return rec
        for p in self.write_paths:
            try:
                append_line(p, line)
            except OSError as e:
                print(f"aotconv: warning: cannot append a tuning record to {one_line(p)}: {e}",
                      file=sys.stderr)
        if self._by_op is not None:
            self._by_op.setdefault((rec["op"], rec["variant"]), []).append(rec)
        return rec


def append_line(path, line):
    """Append `line` (bytes ending in a newline) to `path` under an exclusive lock, in one
    write; if the file's last byte is not a newline (a torn record), start a fresh line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _lock(fd)                                   # released when the file closes
        size = os.fstat(fd).st_size
        if size:
            os.lseek(fd, size - 1, os.SEEK_SET)     # O_APPEND: writes still go to the end
            if os.read(fd, 1) != b"\n":
                line = b"\n" + line
        done = os.write(fd, line)
        while done < len(line):                     # a short write (disk full) goes on, or raises
            done += os.write(fd, line[done:])
    finally:
        os.close(fd)


def _lock(fd):
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass


def read_log(path):
    """Every well-formed record of a file (for replays and the study), in order; damaged lines
    are skipped with one warning."""
    records, _ = _load_file(path, required=True)
    return records

"""Hypothesis strategies for hostile aotconv inputs: net.yaml text and dicts, weights files,
tuning-record files and parameter files.

Each strategy returns plain values (bytes, dicts, small dataclasses) so that a failing example
can be written to a file as it is and replayed without hypothesis. Sizes are bounded so that
no input can exhaust the machine by itself: the amplification cases (YAML aliases, deep
nesting, huge shapes in .npy headers) grow the work, never the input.
"""
from dataclasses import dataclass
from functools import lru_cache
import io
import json
import os
import math
import pickle
import random
import re
import zipfile

import numpy as np
from hypothesis import strategies as st

from aotconv.graph import ACTS
from aotconv.ops import SCHEMA

# ---------------------------------------------------------------------------------------------
# hostile atoms

# pieces that break a C comment or string, a YAML scalar, a format string, a Mako template,
# a terminal line, or a file name; mixed into names and values
HOSTILE_PIECES = (
    "*/", "/*", "//", '"', "'", "\\", "\\n", "\n", "\r\n", "\r", "\t", "\x00", "\x1b[2J",
    "??/", "??=", "??'", "??(", "??)", "??!", "??<", "??>", "??-", "%s", "%n", "%%", "{}",
    "${x}", "<%", "%>", "#", "# ", ": ", "- ", "&a", "*a", "!!", "{", "}", "[", "]", ",", "?",
    "\u202e", "\u2028", "\u2029", "\x85", "\ufeff", "\u00e9", "\U0001d518", "\u0301", " ",
    "..", "/", "\\x", "0", "-", "_", ".", "input", "NULL", "__LINE__",
)
# names that collide with something the compiler itself writes or reserves
COLLIDING_NAMES = (
    "input", "aotconv_rt", "aotconv", "aotrt", "rt_rt_device", "rt_rt_net", "rt_rt_errors",
    "runtime", "kernels", "obj", "build", "desc", "programs", "buffers", "launches", "main",
    "int", "float", "struct", "static", "const", "void", "default", "NULL", "errno", "stdin",
    "scratch", "params", "report", "tuning", "lib", "a" * 300,
)


def pick(draw, seq):
    """One element of `seq`, drawn by index (cheaper than building a sampled_from per draw)."""
    seq = tuple(seq)
    return seq[draw(st.integers(0, len(seq) - 1))]


def weighted(*pairs):
    """One of the strategies, drawn with the given weights: (weight, strategy), ... (st.one_of
    flattens nested one_ofs and drops repeated branches, so it cannot weigh)."""
    choices = tuple(s for w, s in pairs for _ in range(w))
    return st.integers(0, len(choices) - 1).flatmap(choices.__getitem__)


def _joined(pieces):
    return st.lists(pieces, min_size=1, max_size=6).map("".join)


@lru_cache(maxsize=None)
def hostile_text(max_size=40):
    """Strings built to break whatever quotes, escapes or prints them."""
    pieces = _joined(st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(max_size=3)))
    return weighted(
        (5, pieces),
        (1, st.text(max_size=max_size)),
        (1, st.text(alphabet=st.characters(codec="utf-8"), max_size=max_size)),
        (1, st.sampled_from(COLLIDING_NAMES)),
        (1, st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)),
        (1, st.just("")),
        (1, st.sampled_from((1000, 20000)).map(lambda n: "n" * n)),
    )


@lru_cache(maxsize=None)
def c_identifier():
    return st.one_of(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
        st.sampled_from([n for n in COLLIDING_NAMES if n.isidentifier()]),
    )


@dataclass(frozen=True)
class BigInt:
    """An integer with more decimal digits than Python 3.11 converts by default (4300)."""
    digits: int

    def text(self):
        return "1" + "0" * (self.digits - 1)

    def value(self):
        return 10 ** (self.digits - 1)


@lru_cache(maxsize=None)
def hostile_number():
    return st.one_of(
        st.integers(),
        st.sampled_from([0, -1, -(2 ** 31), 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53 + 1,
                         2 ** 63 - 1, 2 ** 63, 2 ** 64, -(2 ** 63), 10 ** 30, 10 ** 400]),
        st.integers(4200, 6000).map(BigInt),
        st.floats(),
        st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 5e-324, -0.0, 0.5, 1e-4]),
    )


@lru_cache(maxsize=None)
def hostile_scalar():
    return st.one_of(hostile_number(), hostile_text(), st.booleans(), st.none())


@dataclass(frozen=True)
class Deep:
    """A value nested `depth` levels deep: [[[...]]] or {k: {k: ...}}."""
    depth: int
    kind: str = "list"

    def value(self):
        v = 1
        for _ in range(self.depth):
            v = [v] if self.kind == "list" else {"k": v}
        return v

    def yaml(self):
        if self.kind == "list":
            return "[" * self.depth + "1" + "]" * self.depth
        return "{k: " * self.depth + "1" + "}" * self.depth


@lru_cache(maxsize=None)
def deep():
    return st.builds(Deep, st.one_of(st.integers(1, 60), st.integers(200, 3000),
                                     st.sampled_from([10_000, 50_000])),
                     st.sampled_from(["list", "map"]))


@lru_cache(maxsize=None)
def hostile_value():
    """Any value a YAML document or a caller's dict could hold where a number was expected."""
    return st.one_of(
        hostile_scalar(),
        deep(),
        st.lists(hostile_scalar(), max_size=5),
        st.dictionaries(st.text(max_size=5), hostile_scalar(), max_size=3),
    )


# ---------------------------------------------------------------------------------------------
# plausible networks (dicts), then hostile edits

def _size(r):
    return r.randint(1, 3) if r.random() < 0.7 else [r.randint(1, 3), r.randint(1, 3)]


def _act(r):
    return r.choice(ACTS)


# op -> key -> a value in the key's range, drawn from a random.Random
_OPTIONAL = {
    "conv": {"stride": _size, "dilation": _size, "groups": lambda r: r.choice([1, 2]),
             "pad": lambda r: r.choice([0, 1, 2, "same", [0, 1], [1, 0]]),
             "bias": lambda r: r.random() < 0.5, "act": _act, "alpha": lambda r: r.random()},
    "dense": {"bias": lambda r: r.random() < 0.5, "act": _act},
    "maxpool": {"stride": lambda r: r.randint(1, 3), "pad": lambda r: r.randint(0, 1),
                "ceil_mode": lambda r: r.random() < 0.5},
    "avgpool": {"stride": lambda r: r.randint(1, 3), "pad": lambda r: r.randint(0, 1),
                "ceil_mode": lambda r: r.random() < 0.5,
                "count_include_pad": lambda r: r.random() < 0.5},
    "leaky_relu": {"alpha": lambda r: r.random()},
    "lrn": {"alpha": lambda r: r.uniform(1e-5, 1), "beta": lambda r: r.uniform(0.1, 2),
            "k": lambda r: r.uniform(0.5, 2)},
    "add": {"act": _act},
    "batchnorm": {"eps": lambda r: r.uniform(1e-6, 1e-2), "act": _act},
    "dropout": {"p": lambda r: r.uniform(0, 0.9)},
}
_REQUIRED = {
    "conv": {"out": lambda r: r.randint(1, 6), "kernel": _size},
    "dense": {"out": lambda r: r.randint(1, 12)},
    "maxpool": {"kernel": lambda r: r.randint(1, 3)},
    "avgpool": {"kernel": lambda r: r.randint(1, 3)},
    "lrn": {"size": lambda r: r.randint(1, 5)},
}
OPS = tuple(sorted(SCHEMA))
CHEAP_OPS = ("conv", "dense", "maxpool", "avgpool", "relu", "tanh", "leaky_relu", "add",
             "concat", "batchnorm", "dropout", "flatten", "softmax", "global_avgpool")


@st.composite
def plausible_net(draw, ops=OPS, max_layers=6, names=None, max_hw=12):
    """A mostly valid network description: real ops with values in their ranges, inputs that
    name earlier layers. `names` draws layer names (default l0, l1, ...). Hypothesis draws the
    layer count and the names; the rest comes from one seeded random.Random (fast)."""
    n = draw(st.integers(1, max_layers))
    r = random.Random(draw(st.integers(0, 2 ** 32 - 1)))
    layers, seen = [], []
    for i in range(n):
        op = r.choice(ops)
        name = draw(names) if names is not None else f"l{i}"
        layer = {"name": name, "op": op}
        for key, f in _REQUIRED.get(op, {}).items():
            layer[key] = f(r)
        for key, f in _OPTIONAL.get(op, {}).items():
            if r.random() < 0.25:
                layer[key] = f(r)
        if op in ("add", "concat"):
            layer["inputs"] = [r.choice(seen + ["input"]) for _ in range(r.randint(2, 3))]
        elif seen and r.random() < 0.15:
            layer["inputs"] = [r.choice(seen + ["input"])]
        layers.append(layer)
        seen.append(name)
    d = {"name": draw(c_identifier()),
         "input": [r.randint(1, 2), r.randint(1, 4), r.randint(1, max_hw), r.randint(1, max_hw)],
         "layers": layers}
    if r.random() < 0.12:
        d["outputs"] = r.sample(seen, min(len(seen), r.randint(1, 2)))
    return d


@st.composite
def hostile_edits(draw, d, value=hostile_value):
    """`d` with 0-3 hostile edits: values, keys, ops, names, inputs and whole layers replaced,
    keys added or dropped."""
    d = json_copy(d)
    for _ in range(draw(st.integers(0, 3))):
        layers = d.get("layers")
        target = d
        if isinstance(layers, list) and layers and draw(st.booleans()):
            i = draw(st.integers(0, len(layers) - 1))
            if not isinstance(layers[i], dict) or draw(st.integers(0, 9)) == 0:
                layers[i] = draw(value())
                continue
            target = layers[i]
        what = pick(draw, ["value", "key", "drop", "name", "op", "inputs", "input",
                                     "layers", "outputs"])
        keys = list(target)
        if what == "value" and keys:
            target[pick(draw, keys)] = draw(value())
        elif what == "key":
            target[draw(st.one_of(hostile_text(), st.sampled_from(
                sorted({k for s in SCHEMA.values() for k in s}))))] = draw(value())
        elif what == "drop" and keys:
            del target[pick(draw, keys)]
        elif what == "name":
            target["name"] = draw(st.one_of(hostile_text(), value()))
        elif what == "op" and target is not d:
            target["op"] = draw(st.one_of(st.sampled_from(OPS), hostile_text(), value()))
        elif what == "inputs" and target is not d:
            names = [l.get("name") for l in layers if isinstance(l, dict)] + ["input"]
            names = [n for n in names if isinstance(n, str)] or ["input"]
            target["inputs"] = draw(st.one_of(
                st.lists(st.one_of(st.sampled_from(names), hostile_text()), max_size=4),
                st.sampled_from(names), value()))
        elif what == "input":
            d["input"] = draw(st.one_of(
                st.lists(st.one_of(st.integers(-2, 2 ** 40), hostile_number()), max_size=6),
                value()))
        elif what == "layers":
            d["layers"] = draw(value())
        elif what == "outputs":
            d["outputs"] = draw(value())
    return d


def json_copy(v):
    if isinstance(v, dict):
        return {k: json_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_copy(x) for x in v]
    return v


# ---------------------------------------------------------------------------------------------
# net.yaml text: a small YAML writer that can also write what yaml.dump never does (duplicate
# keys, anchors and aliases, tags, merge keys, odd number forms, several documents)

@dataclass(frozen=True)
class Raw:
    """YAML text inserted as it is."""
    text: str


YAML_PLAIN_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _yaml_key_ok(s):
    return bool(_PLAIN.match(s)) and s.lower() not in YAML_PLAIN_WORDS


class YamlWriter:
    """Renders a value as YAML text. The style choices come from a seeded random.Random (drawn
    once from hypothesis), so a document costs one draw for its style, not one per node."""

    def __init__(self, rnd):
        self.rnd, self.anchors = rnd, []

    def choice(self, options):
        return self.rnd.choice(options)

    def odds(self, n):
        """True once in `n`."""
        return self.rnd.randrange(n) == 0

    def scalar(self, v):
        if isinstance(v, Raw):
            return v.text
        if isinstance(v, Deep):
            return v.yaml()
        if isinstance(v, BigInt):
            return ("-" if self.odds(2) else "") + v.text()
        if v is None:
            return self.choice(["null", "~", "Null", ""])
        if isinstance(v, bool):
            return self.choice(["true", "True", "yes", "on"] if v else ["false", "no", "off"])
        if isinstance(v, int):
            forms = [str(v)] * 4
            if v >= 0:
                forms += [hex(v), "0o" + format(v, "o"), "0" + format(v, "o"), f"+{v}",
                          f"{v:_}"]
                if v < 10 ** 6:
                    forms.append(f"{v // 60}:{v % 60:02d}")        # YAML 1.1 base 60
            return self.choice(forms)
        if isinstance(v, float):
            if math.isnan(v):
                return self.choice([".nan", ".NaN", ".NAN", "nan"])
            if math.isinf(v):
                return self.choice([".inf", "+.inf", ".Inf"] if v > 0 else ["-.inf", "-.Inf"])
            return self.choice([repr(v), f"{v:.6e}", f"{v:.17g}"])
        if isinstance(v, str):
            return self.string(v)
        return self.string(repr(v))

    def string(self, s):
        styles = ["double", "single"]
        if _yaml_key_ok(s):
            styles += ["plain", "plain"]
        style = self.choice(styles)
        if style == "plain":
            return s
        if style == "single":
            return "'" + s.replace("'", "''") + "'"
        return json.dumps(s, ensure_ascii=self.odds(2))

    def prefix(self):
        """An optional anchor or tag before a flow node."""
        k = self.rnd.randrange(16)
        if k == 0:
            a = f"a{len(self.anchors)}"
            self.anchors.append(a)
            return f"&{a} "
        if k == 1:
            return self.choice(["!!str ", "!!int ", "!!float ", "!!seq ", "!!map ", "!!binary ",
                                "!!set ", "!!omap ", "!custom ", "!!python/object:os.system ",
                                "!!python/name:os.system ", "!<tag:yaml.org,2002:int> "])
        return ""

    def alias_or(self, text):
        if self.anchors and self.odds(20):
            return "*" + self.choice(self.anchors)
        return text

    def flow(self, v):
        if isinstance(v, dict):
            items = list(v.items())
            items += self.duplicates(items)
            body = ", ".join(f"{self.key(k)}: {self.flow(x)}" for k, x in items)
            return self.alias_or(self.prefix() + "{" + body + "}")
        if isinstance(v, list):
            return self.alias_or(self.prefix() + "[" + ", ".join(self.flow(x) for x in v) + "]")
        return self.alias_or(self.scalar(v))

    def key(self, k):
        if isinstance(k, str):
            return k if _yaml_key_ok(k) else self.string(k)
        return self.scalar(k)

    def duplicates(self, items):
        if items and self.odds(12):
            k, v = self.choice(items)
            return [(k, self.choice([v, 1, "x", None, -1, [1, 2]]))]
        if self.anchors and self.odds(25):
            return [("<<", Raw("*" + self.choice(self.anchors)))]
        return []

    def block_map(self, d, indent):
        lines = []
        items = list(d.items())
        items += self.duplicates(items)
        pad = "  " * indent
        for k, v in items:
            if isinstance(v, list) and v and self.odds(2):
                lines.append(f"{pad}{self.key(k)}:")
                lines += self.block_seq(v, indent + self.rnd.randrange(2))
            elif isinstance(v, dict) and v and self.odds(2):
                lines.append(f"{pad}{self.key(k)}:")
                lines += self.block_map(v, indent + 1)
            else:
                lines.append(f"{pad}{self.key(k)}: {self.flow(v)}")
            if self.odds(15):
                lines.append(pad + "# " + self.choice(HOSTILE_PIECES).replace("\n", " "))
        return lines

    def block_seq(self, items, indent):
        lines = []
        pad = "  " * indent
        for v in items:
            if isinstance(v, dict) and v and self.odds(2):
                sub = self.block_map(v, indent + 1)
                sub[0] = pad + "- " + sub[0].lstrip(" ")
                lines += sub
            else:
                lines.append(f"{pad}- {self.flow(v)}")
        return lines

    def document(self, d):
        if isinstance(d, dict) and not self.odds(7):
            lines = self.block_map(d, 0)
        else:
            lines = [self.flow(d)]
        head = self.choice(["", "", "", "", "", "---\n", "%YAML 1.1\n---\n", "%YAML 1.2\n---\n",
                            "\ufeff", "# net\n", "%TAG !e! tag:example.com,2000:\n---\n"])
        tail = self.choice(["\n"] * 6 + ["", "\n...\n", "\n---\n", "\n---\nname: second\n",
                                         "\n\x00"])
        eol = self.choice(["\n"] * 6 + ["\r\n", "\r"])
        return head + eol.join(lines) + tail


LAUGHS = Raw("[&l0 [x, x, x, x, x, x, x, x, x, x], &l1 [*l0, *l0, *l0, *l0, *l0, *l0, *l0, "
             "*l0, *l0, *l0], &l2 [*l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1, *l1], "
             "&l3 [*l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2, *l2], "
             "&l4 [*l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3, *l3]]")   # 10^5 leaves, no more


@lru_cache(maxsize=None)
def yaml_value():
    return st.one_of(hostile_value(), st.sampled_from([
        LAUGHS, Raw("&r [*r]"), Raw("*undefined"), Raw("!!python/object/apply:os.system [id]"),
        Raw("? [a, b]\n: 1"), Raw("{? [a]: 1}"), Raw("2001-12-14"), Raw("!!binary aGVsbG8="),
        Raw("|\n  a\n  b"), Raw(">-\n  x"), Raw("\"\\ud800\""), Raw("'unterminated"),
        Raw("{a: 1"), Raw("@x"), Raw("`x`"), Raw("%x"), Raw("\t1"), Raw("1e400"), Raw("-1e400"),
        Raw("0x_ff"), Raw("1_0"), Raw("0b101"), Raw("190:20:30"), Raw("!!int 1e3"),
        Raw("!!float [1]"), Raw("!!str {a: 1}")]))


@st.composite
def net_yaml(draw):
    """net.yaml bytes: a plausible network, hostile edits, written in varied YAML."""
    d = draw(plausible_net(names=st.one_of(st.builds(lambda i: f"l{i}", st.integers(0, 9)),
                                           hostile_text(), c_identifier())))
    d = draw(hostile_edits(d, value=yaml_value))
    text = YamlWriter(random.Random(draw(st.integers(0, 2 ** 32 - 1)))).document(d)
    enc = pick(draw, ["utf-8"] * 6 + ["utf-16", "latin-1", "utf-8-sig"])
    return text.encode(enc, errors="surrogatepass" if enc.startswith("utf-8") else "replace")


def _shipped_texts():
    from aotconv.spec import NETS_DIR
    return [p.read_bytes() for p in sorted(NETS_DIR.glob("*.yaml"))]


@st.composite
def mutated_bytes(draw, seeds):
    """One of `seeds` with 1-6 byte-level mutations: spans deleted, duplicated or replaced,
    bytes inserted, lines swapped, the end torn off."""
    b = bytearray(pick(draw, seeds))
    for _ in range(draw(st.integers(1, 6))):
        n = len(b)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 40)))
        op = pick(draw, ["delete", "insert", "dup", "replace", "swaplines", "tear",
                                   "piece"])
        if op == "delete":
            del b[i:j]
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "dup":
            b[i:i] = b[i:j]
        elif op == "replace" and i < n:
            b[i] = draw(st.integers(0, 255))
        elif op == "piece":
            b[i:i] = pick(draw, HOSTILE_PIECES).encode("utf-8", "surrogatepass")
        elif op == "swaplines":
            lines = bytes(b).split(b"\n")
            if len(lines) > 1:
                x = draw(st.integers(0, len(lines) - 1))
                y = draw(st.integers(0, len(lines) - 1))
                lines[x], lines[y] = lines[y], lines[x]
                b = bytearray(b"\n".join(lines))
        elif op == "tear":
            del b[i:]
    return bytes(b)


@lru_cache(maxsize=None)
def net_yaml_raw():
    """Raw bytes for a net.yaml: noise, text, and mutated shipped networks."""
    seeds = _shipped_texts()
    return st.one_of(
        st.binary(max_size=400),
        st.text(max_size=400).map(lambda s: s.encode("utf-8", "surrogatepass")),
        mutated_bytes(seeds),
        mutated_bytes(seeds),
        mutated_bytes(seeds),
    )


# ---------------------------------------------------------------------------------------------
# net dicts for network_from_dict: Python values a caller could pass

class Opaque:
    """An object of no type aotconv knows; its repr is fine."""

    def __repr__(self):
        return "Opaque()"


@lru_cache(maxsize=None)
def py_value():
    """Deep and BigInt stay markers here (the check builds the values: see materialise), so
    an input pickles and prints small."""
    return st.one_of(
        hostile_value(),
        st.tuples(st.integers(1, 3), st.integers(1, 3)),
        st.binary(max_size=5),
        st.frozensets(st.integers(0, 3), max_size=3),
        st.builds(Opaque),
        st.sampled_from([np.int64(3), np.float32(0.5), np.array([3, 3]), np.array(2)]),
    )


def materialise(v, memo=None):
    """`v` with its Deep and BigInt markers replaced by the values they stand for (lists and
    dicts that contain themselves stay so)."""
    memo = {} if memo is None else memo
    if isinstance(v, (Deep, BigInt)):
        return v.value()
    if isinstance(v, (dict, list)):
        if id(v) in memo:
            return memo[id(v)]
        out = memo[id(v)] = {} if isinstance(v, dict) else []
        if isinstance(v, dict):
            out.update((materialise(k, memo), materialise(x, memo)) for k, x in v.items())
        else:
            out.extend(materialise(x, memo) for x in v)
        return out
    return v


@st.composite
def net_dict(draw):
    d = draw(plausible_net(names=st.one_of(st.builds(lambda i: f"l{i}", st.integers(0, 9)),
                                           hostile_text())))
    d = draw(hostile_edits(d, value=py_value))
    if draw(st.integers(0, 30)) == 0:
        return draw(py_value())
    return d


@lru_cache(maxsize=None)
def batch_override():
    return st.one_of(st.none(), st.none(), st.integers(-3, 5), st.sampled_from(
        [2 ** 31, 2 ** 63, True, 1.5, "2"]))


# ---------------------------------------------------------------------------------------------
# weights files (.npz and what a user might pass instead)

@dataclass
class WeightsFile:
    """Bytes of a --weights file, and the flat parameters it must give if it is intact."""
    data: bytes
    expect: object = None           # np.ndarray when the file is a complete, valid .npz
    note: str = ""

    def __repr__(self):
        e = "None" if self.expect is None else f"<{self.expect.size} floats>"
        return f"WeightsFile(note={self.note!r}, expect={e}, data={self.data!r})"


DTYPES = ["<f4", ">f4", "<f8", "<f2", "<i1", "<i4", "<i8", "<u1", "<u8", "|b1", "<c8", "<U3",
          "|S2", "<M8[s]", "<m8[s]", "|V4"]


def _npy_bytes(arr, allow_pickle=False):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=allow_pickle)
    return buf.getvalue()


def _npy_header(header_dict_text):
    """An .npy file whose header is exactly `header_dict_text`, with 16 floats of data."""
    h = header_dict_text.encode("latin-1", "replace")
    pad = 64 - (10 + len(h) + 1) % 64
    h = h + b" " * (pad % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + b"\0" * 64


HOSTILE_NPY_HEADERS = [
    "{'descr': '<f4', 'fortran_order': False, 'shape': (4503599627370496,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1073741824, 1073741824), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000,), }",
    "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 4), }",
    "{'descr': 'O', 'fortran_order': False, 'shape': (2,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': 7, }",
    "{'descr': '<f4', 'fortran_order': False}",
    "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
    "[1, 2, 3]",
    "__import__('os').system('id')",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1," * 40 + "), }",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,), }",
    "{'descr': 'x', 'fortran_order': False, 'shape': (2,), }",
]


def weights_file(layout):
    return _weights_file(tuple(layout))


@st.composite
def _weights_file(draw, layout):
    """`layout`: [(key, shape)] of the network. An .npz built from it with some keys missing,
    renamed or extra, shapes and dtypes changed, NaN and Inf values, members damaged; or an
    .npy, a pickle, noise, an empty file."""
    kind = pick(draw, ["npz"] * 8 + ["npy", "pickle", "noise", "empty", "zip-junk",
                                               "npz-header"])
    if kind == "noise":
        return WeightsFile(draw(st.binary(max_size=300)), note="noise")
    if kind == "empty":
        return WeightsFile(b"", note="empty")
    if kind == "pickle":
        obj = {k: np.zeros(s, np.float32) for k, s in layout[:2]}
        return WeightsFile(pickle.dumps(pick(draw, [obj, [1, 2], "x", None])),
                           note="pickle")
    if kind == "npy":
        a = np.zeros(pick(draw, [s for _, s in layout]), np.float32)
        return WeightsFile(_npy_bytes(a), note="npy")
    members = []
    if kind == "zip-junk":
        members.append((pick(draw, [k for k, _ in layout]) + ".npy",
                        draw(st.binary(max_size=100))))
    elif kind == "npz-header":
        members.append((pick(draw, [k for k, _ in layout]) + ".npy",
                        _npy_header(pick(draw, HOSTILE_NPY_HEADERS))))
    intact = kind == "npz"
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    flat = []
    for key, shape in layout:
        change = draw(st.integers(0, 12)) if kind == "npz" else 0
        if change == 1:
            intact = False
            continue                                           # missing
        if change == 2:
            intact = False
            key = draw(st.one_of(hostile_text(10), st.just(key.upper()),
                                 st.just(key.replace(".", "/"))))
        if change == 3:
            intact = False
            shape = pick(draw, [shape[::-1], shape + (1,), shape[1:], (), (0,),
                                          tuple(x + 1 for x in shape)])
        dtype = "<f4"
        if change == 4:
            dtype = pick(draw, DTYPES)
        a = rng.standard_normal(shape).astype(np.float64)
        if change == 5:
            a.flat[draw(st.integers(0, max(a.size - 1, 0)))] = pick(draw,
                [np.nan, np.inf, -np.inf, 1e39, -1e300])
            with np.errstate(all="ignore"):
                intact = intact and bool(np.isfinite(a.astype(np.float32)).all())
        try:
            with np.errstate(all="ignore"):
                a = a.astype(np.dtype(dtype))
        except (TypeError, ValueError):
            a = np.zeros(shape, np.dtype(dtype))
        if dtype[1] != "f":             # the reader takes float16/32/64 only
            intact = False
        with np.errstate(all="ignore"):
            flat.append(a.astype(np.float32).ravel() if intact else None)
        members.append((key + ".npy", _npy_bytes(a, allow_pickle=dtype == "O")))
    for _ in range(draw(st.integers(0, 2)) if kind == "npz" and draw(st.integers(0, 4)) == 0
                   else 0):
        intact = False
        members.append((draw(hostile_text(12)) + pick(draw, [".npy", ""]),
                        _npy_bytes(np.zeros(draw(st.integers(0, 3)), np.float32))))
    if len(members) > 1 and draw(st.integers(0, 10)) == 0:
        intact = False
        members.append(members[0])                             # a member twice
    buf = io.BytesIO()
    comp = pick(draw, [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
    with zipfile.ZipFile(buf, "w", comp) as z:
        for name, data in members:
            try:
                info = zipfile.ZipInfo(name.encode("utf-8", "replace").decode("utf-8"))
                info.compress_type = comp
                with _quiet():
                    z.writestr(info, data)
            except (ValueError, UnicodeError):
                intact = False
    data = buf.getvalue()
    damage = draw(st.integers(0, 9)) if kind == "npz" else 0
    if damage == 1:
        data = data[:draw(st.integers(0, len(data)))]
    elif damage == 2:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif damage == 3:
        data += draw(st.binary(min_size=1, max_size=20))
    if damage in (1, 2):
        intact = False
    expect = np.concatenate(flat) if intact and flat and all(f is not None for f in flat) \
        else None
    return WeightsFile(data, expect, note=f"{kind} damage={damage}")


class _quiet:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *a):
        self._w.__exit__(*a)


# ---------------------------------------------------------------------------------------------
# tuning records

RECORD_FIELDS = ("format", "aotconv", "device", "target", "op", "variant", "template", "cfg",
                 "status", "time_ms", "times", "error", "message", "build_s", "at", "layer")


def _json_slot(v, slots):
    """A placeholder for what json.dumps cannot write (huge ints, deep nesting), filled after."""
    if isinstance(v, list):
        return [_json_slot(x, slots) for x in v]
    if isinstance(v, dict):
        return {k: _json_slot(x, slots) for k, x in v.items()}
    if isinstance(v, BigInt):
        text = v.text()
    elif isinstance(v, Deep):
        text = ("[" * v.depth + "1" + "]" * v.depth if v.kind == "list"
                else '{"k": ' * v.depth + "1" + "}" * v.depth)
    else:
        return v
    slot = f"@@slot{len(slots)}@@"
    slots[slot] = text
    return slot


@st.composite
def record_line(draw, bases, knobs):
    """One line of a records.jsonl: a record matching the key (so the reader goes on to its
    cfg and outcome), with hostile fields, or a damaged line."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.one_of(
            st.binary(max_size=60),
            st.sampled_from([b"", b"   ", b"null", b"[]", b"1", b'"x"', b"{}", b"{", b"\xff\xfe",
                             b"NaN", b"Infinity", b"\xef\xbb\xbf{}", b"\x00",
                             b"[" * 100_000 + b"]" * 100_000, b'{"op": ' * 5000])))
    slots = {}
    base_fields, cfgs = pick(draw, bases)
    rec = dict(base_fields)
    rec["cfg"] = [list(kv) for kv in pick(draw, cfgs).items]
    rec.update(pick(draw, [
        {"status": "ok", "time_ms": 0.5, "times": [0.5, 0.6]},
        {"status": "pruned", "message": "x"}, {"status": "wrong", "error": "inf"},
        {"status": "build_failed", "message": "log\nline"}, {"status": "timed_out"}]))
    if kind <= 4:
        rec["time_ms"] = _json_slot(draw(st.one_of(st.floats(), st.integers(), hostile_value())),
                                    slots)
    for _ in range(draw(st.integers(0, 3))):
        key = pick(draw, RECORD_FIELDS)
        if key == "cfg":
            rec["cfg"] = _json_slot(draw(st.one_of(cfg_value(knobs), hostile_value())), slots)
        else:
            rec[key] = _json_slot(draw(hostile_value()), slots)
    if draw(st.integers(0, 8)) == 0:
        rec["status"] = "ok"
    text = json.dumps(rec, allow_nan=True, ensure_ascii=draw(st.booleans()))
    for slot, value in slots.items():
        text = text.replace(f'"{slot}"', value)
    if draw(st.integers(0, 10)) == 0:
        text = text[:draw(st.integers(0, len(text)))]             # torn
    return text.encode("utf-8", "surrogatepass")


@lru_cache(maxsize=None)
def cfg_value(knobs):
    """A record's cfg items: knobs missing, unknown, repeated, retyped."""
    item = st.one_of(
        st.tuples(st.sampled_from(knobs), hostile_value()).map(list),
        st.tuples(hostile_text(8), st.integers()).map(list),
        st.lists(st.sampled_from(knobs), max_size=3),
        hostile_scalar())
    return st.lists(item, max_size=6)


@st.composite
def records_file(draw, bases, knobs):
    """A records.jsonl: `bases` are (key fields, [Config]) of the variants the reader will be
    asked about, `knobs` their knob names."""
    lines = draw(st.lists(record_line(bases, knobs), min_size=0, max_size=8))
    eol = pick(draw, [b"\n", b"\r\n", b"\n\n"])
    data = eol.join(lines)
    if draw(st.booleans()):
        data += eol
    return data


# ---------------------------------------------------------------------------------------------
# params.bin

@dataclass
class ParamsFile:
    data: bytes
    path_kind: str = "file"          # file, missing, directory

    def __repr__(self):
        return f"ParamsFile(path_kind={self.path_kind!r}, {len(self.data)} bytes, " \
               f"data={self.data[:64]!r}{'...' if len(self.data) > 64 else ''})"


@st.composite
def params_file(draw, count):
    """Bytes for a <net>.params.bin of a network with `count` parameters: the right size or
    near it, with NaN/Inf/denormal values, or nothing at all."""
    n = draw(st.one_of(st.just(count), st.sampled_from(
        [0, 1, count - 1, count + 1, 2 * count, count // 2]), st.integers(0, 2 * count)))
    extra = pick(draw, [0, 0, 0, 1, 2, 3])
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    a = rng.standard_normal(max(n, 0)).astype("<f4")
    for _ in range(draw(st.integers(0, 3))):
        if a.size:
            a[draw(st.integers(0, a.size - 1))] = pick(draw,
                [np.nan, np.inf, -np.inf, 1e-45, -0.0, 3.4e38])
    data = a.tobytes() + bytes(extra)
    if draw(st.integers(0, 10)) == 0:
        data = draw(st.binary(max_size=4 * count + 8))
    kind = pick(draw, ["file"] * 12 + ["missing", "directory"])
    return ParamsFile(data, kind)


# ---------------------------------------------------------------------------------------------
# small valid-shaped networks with hostile names, for the emitted C

@lru_cache(maxsize=None)
def layer_name():
    """Names a net.yaml may use (letters, digits, '_', '.', '-'; they reach the emitted C)
    and near them: colliding once sanitised, at and past the length limit, C keywords,
    hostile pieces (refused, with a one-line message)."""
    allowed = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
    return weighted(
        (12, allowed),
        (2, st.sampled_from(["a.b", "a-b", "a_b", "a..b", "_", "_.", "x-", "input.", "l0", "L0",
                             "int", "struct", "main", "errno", "NULL", "desc", "aotrt_net",
                             "a" * 127, "b" * 128, "c" * 129, "d" * 300])),
        (2, st.builds(lambda i: f"l{i}", st.integers(0, 9))),
        (1, hostile_text(12).filter(lambda s: s and s != "input")),
    )


@st.composite
def emit_net(draw):
    d = draw(plausible_net(ops=CHEAP_OPS, max_layers=4, names=layer_name(), max_hw=6))
    d["name"] = draw(c_identifier())
    return d


@dataclass(frozen=True)
class PathCase:
    """A file (one of the readers' inputs) stored under a hostile file name."""
    reader: str
    name: str


@lru_cache(maxsize=None)
def path_case():
    return st.builds(PathCase, st.sampled_from(["netyaml", "weights", "params", "records"]),
                     hostile_text(30).filter(_file_name_ok))


def _file_name_ok(s):
    try:
        b = os.fsencode(s)
    except UnicodeError:
        return False
    return 0 < len(b) < 200 and b"/" not in b and b"\0" not in b and b not in (b".", b"..")

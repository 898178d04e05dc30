"""Layer names from ONNX node names, valid under net.yaml's rule and unique.

The rule: letters, digits, '_', '.', '-', starting with a letter or '_', at most 128
characters, no two names equal ignoring case once '.' and '-' read as '_'. An exporter's
scope path `/layer1/layer1.0/conv1/Conv` reads `layer1.0.conv1.Conv`: '/' separates, and a
scope that repeats its parent's name as a prefix (PyTorch's module paths) replaces it.
"""
import re

MAX_LEN = 128
RESERVED = ("input",)            # the network input's name in a net.yaml
_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")


def readable(name, op):
    """The layer name `name` (an ONNX node name) reads as, before de-duplication."""
    parts = []
    for p in (s for s in re.split(r"[/\\:]+", name or "") if s):
        if parts and p.startswith(parts[-1] + "."):
            parts[-1] = p
        else:
            parts.append(p)
    s = _BAD.sub("_", ".".join(parts)).strip("._-") or op.lower() or "layer"
    if not re.match(r"[A-Za-z_]", s):
        s = "_" + s
    return s[:MAX_LEN]


def key(name):
    """Two names clash when their keys are equal."""
    return name.lower().replace(".", "_").replace("-", "_")


class Namer:
    """Hands out unique layer names: the readable name, or it with `_2`, `_3` ... appended."""

    def __init__(self):
        self.taken = {key(r) for r in RESERVED}

    def __call__(self, onnx_name, op):
        base = readable(onnx_name, op)
        name, i = base, 1
        while key(name) in self.taken:
            i += 1
            suffix = f"_{i}"
            name = base[:MAX_LEN - len(suffix)] + suffix
        self.taken.add(key(name))
        return name


def net_name(stem):
    """A network name (a C identifier of at most 64 characters, not reserved) from a file
    name's stem: it prefixes every symbol of the emitted library."""
    s = re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_") or "model"
    if s[0].isdigit() or s.lower().startswith(("aotconv", "aotrt", "rt_")):
        s = "net_" + s
    return s[:64]

"""The importer's errors: a model it cannot read (one line), and the nodes it cannot build
(one error listing every such node, one line each, so a user sees all of them at once)."""
from dataclasses import dataclass

from ..errors import AotconvError


class OnnxError(AotconvError):
    """A model aotconv cannot read or import; names the file and what to do."""

    def __init__(self, message, file=None):
        self.message, self.file = message, file
        super().__init__(f"{file}: {message}" if file else message)


@dataclass(frozen=True)
class Problem:
    """One node aotconv cannot build: where, which attribute, what it supports instead."""
    node: str
    op: str
    opset: int
    attr: str          # the attribute (or input) at fault, None for the op as a whole
    message: str

    def __str__(self):
        where = f"node '{self.node}' ({self.op}, opset {self.opset})"
        return f"{where}: {self.attr}: {self.message}" if self.attr else f"{where}: {self.message}"


class UnsupportedError(OnnxError):
    """Nodes whose semantics aotconv's ops do not cover exactly: all of them, one per line."""

    def __init__(self, problems, file=None):
        self.problems = list(problems)
        n = len(self.problems)
        head = (f"{n} node{'s' if n > 1 else ''} aotconv cannot build (docs/onnx.md lists "
                f"what the importer supports):")
        super().__init__(head + "".join(f"\n  {p}" for p in self.problems), file)


class Problems:
    """Collects the problems of every node, then raises them together."""

    def __init__(self):
        self.items = []

    def add(self, node, attr, message):
        p = Problem(node.name, node.op, node.opset, attr, message)
        if p not in self.items:
            self.items.append(p)

    def __bool__(self):
        return bool(self.items)

    def raise_if_any(self, file):
        if self.items:
            raise UnsupportedError(self.items, file)

"""Error types that carry where a problem is (file, line, layer, key) and what to do about it."""
import re


def one_line(text):
    """`text` with its control characters escaped (a newline in a file name cannot split a
    message over two lines)."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: ascii(m.group())[1:-1], str(text))


class AotconvError(Exception):
    """Base of every error aotconv reports to a user; the CLI prints it without a traceback."""


class SpecError(AotconvError):
    """A problem in a net.yaml or a weights file, located as precisely as we can."""

    def __init__(self, message, file=None, line=None, layer=None, key=None):
        self.message, self.file, self.line, self.layer, self.key = message, file, line, layer, key
        super().__init__(str(self))

    def __str__(self):
        # a file or key name with a newline in it cannot split the message over two lines
        return one_line(self._text())

    def _text(self):
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}" if self.line is not None else f"{self.file}"
            where += ": "
        ctx = []
        if self.layer is not None:
            ctx.append(f"layer '{self.layer}'")
        if self.key is not None:
            ctx.append(f"key '{self.key}'")
        return where + (", ".join(ctx) + ": " if ctx else "") + self.message


class BuildError(AotconvError):
    """An emitted library failed to compile or link; names the log to read."""


class KernelBuildError(AotconvError):
    """An OpenCL program failed to build; the source, options and log are saved to a file."""

    def __init__(self, message, log="", path=None):
        self.log, self.path = log, path
        super().__init__(message + (f" (source and log saved to {path})" if path else ""))

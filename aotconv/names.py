"""Names that reach generated code: the rules they follow, their C form, and escaping.

A layer name or a network name ends up in file names, C identifiers, macros, comments and
string literals of the emitted library. spec.py enforces the rules below on every front end;
the emitters then still escape every piece of text they place in a comment or a string
literal (`c_comment`, `c_string`), so no text can close a comment, end a literal, form a
trigraph or splice a line, whatever produced it.

- A layer name: 1 to MAX_LAYER_NAME characters, letters, digits, '_', '.', '-', starting with
  a letter or '_'. Its C form (`c_ident`) maps '.' and '-' to '_'. Two layers whose C forms
  are equal ignoring case are an error: the header upper-cases them into macros, and kernel
  files differing only in case are one file on case-insensitive file systems.
- A network name: a C identifier of 1 to MAX_NET_NAME characters, not reserved by the C
  standard (leading '__' or '_' and a capital) and not starting with a prefix the runtime and
  its files use (RESERVED_NET_PREFIXES, any case).
- Generated identifiers never are a user name alone: kernel functions are `k_<c name>`, macros
  `AOTCONV_<NET>_PARAM_<C NAME>_...`, so a layer may be called `N`, `int` or `kernel`.
"""
import re
import reprlib

MAX_LAYER_NAME = 128
MAX_NET_NAME = 64
LAYER_NAME_RULE = (f"1 to {MAX_LAYER_NAME} characters: letters, digits, '_', '.', '-', "
                   f"starting with a letter or '_'")
NET_NAME_RULE = (f"a C identifier of 1 to {MAX_NET_NAME} characters (letters, digits, '_', "
                 f"not starting with a digit)")
# aotconv_rt.h and the runtime's rt_*.c objects sit beside <net>.h and <net>.o; aotrt_* are
# the runtime's macros, which the network name is pasted into
RESERVED_NET_PREFIXES = ("aotconv", "aotrt", "rt_")
KERNEL_PREFIX = "k_"

_LAYER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAYER_CHAR = re.compile(r"[A-Za-z0-9_.\-]")


def c_ident(name):
    """The C identifier a name becomes in emitted code (kernels, symbols, files)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if re.match(r"[A-Za-z_]", s) else "_" + s


def kernel_prefix(c_name):
    """The OpenCL function name of a layer's kernel (its other kernels append '_<what>'):
    prefixed, so that no layer name meets a keyword, a built-in or a template's macro."""
    return KERNEL_PREFIX + c_name


def layer_name_problem(name):
    """None when `name` is a valid layer name, else what is wrong with it: one line that
    reads after the name, as in f"'{name}' {problem}"."""
    if not isinstance(name, str):
        return f"is not a string ({shown(name)}); layer names are {LAYER_NAME_RULE}"
    if len(name) > MAX_LAYER_NAME:
        return f"has {len(name)} characters; layer names have at most {MAX_LAYER_NAME}"
    if _LAYER_NAME.fullmatch(name):
        return None
    if not name:
        return f"is empty; layer names are {LAYER_NAME_RULE}"
    if not re.match(r"[A-Za-z_]", name):
        why = f"starts with {ascii(name[0])}"
    else:
        bad = next(i for i, ch in enumerate(name) if not _LAYER_CHAR.match(ch))
        why = f"has the character {ascii(name[bad])} at position {bad + 1}"
    return (f"{why}; layer names are {LAYER_NAME_RULE}: rename it (e.g. '/layer1/conv' -> "
            f"'layer1.conv')")


def net_name_problem(name):
    """None when `name` is a valid network name, else what is wrong with it (one line)."""
    if not isinstance(name, str) or not _NET_NAME.fullmatch(name):
        return f"must be {NET_NAME_RULE}: it prefixes every emitted symbol; got {shown(name)}"
    if len(name) > MAX_NET_NAME:
        return f"has at most {MAX_NET_NAME} characters, got {len(name)}"
    if name.startswith("__") or re.match(r"_[A-Z]", name):
        return (f"'{name}' is reserved by the C standard (a leading '__' or '_' and a capital "
                f"letter); rename the network")
    for p in RESERVED_NET_PREFIXES:
        if name.lower().startswith(p):
            return (f"'{name}' starts with '{p}', reserved for the runtime compiled into the "
                    f"library (names starting with {', '.join(RESERVED_NET_PREFIXES)} in any "
                    f"case); rename the network")
    return None


class _Repr(reprlib.Repr):
    def repr_int(self, x, level):
        # repr() of an int past 4300 digits raises; its size says enough
        if x.bit_length() > 128:
            return f"{'-' if x < 0 else ''}<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


def shown(value, limit=40):
    """`value` as safe one-line text for a message: escaped, at most `limit` characters."""
    if isinstance(value, str):
        s = ascii(value)[1:-1]
    else:
        r = _Repr()
        r.maxstring, r.maxother, r.maxlevel = limit, limit, 3
        s = r.repr(value)
        s = ascii(s)[1:-1] if not s.isascii() else s
    return s if len(s) <= limit else s[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# escaping text into C and OpenCL C

_CTRL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _octal(ch):
    return "".join(f"\\{b:03o}" for b in ch.encode("utf-8"))


def c_string(text):
    """`text` as one C (or OpenCL C) string literal, quotes included.

    Escapes '\\' and '"', every control character (named or 3-digit octal, which cannot run
    into a following digit as \\x can), every non-ASCII character (its UTF-8 bytes, so the
    literal does not depend on the compiler's source charset), and each '?' next to another
    '?', so no trigraph (??/ ??' ...) forms even under -std=c11, which enables them."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\" or ch == '"':
            out.append("\\" + ch)
        elif ch == "?" and ((i and text[i - 1] == "?") or text[i + 1:i + 2] == "?"):
            out.append("\\?")
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif _CTRL.match(ch) or not ch.isascii():
            out.append(_octal(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def c_comment(text):
    """`text` made safe inside a C or OpenCL C comment, /* ... */ or // ... (one line).

    No '*/' or '/*' (they become '* /' and '/ *'), no '??' (trigraphs: '? ?'), no control or
    non-ASCII character and no backslash (written as \\xHH or \\uHHHH, so none can splice the
    next line into a // comment)."""
    s = "".join(ch if " " <= ch <= "~" and ch != "\\" else
                (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
                 if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
                for ch in text)
    # each rewrite can expose another ('*/*' -> '* /*'): repeat until none is left
    while True:
        t = s.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
        if t == s:
            return s
        s = t

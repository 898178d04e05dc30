"""Small helpers the kernel templates use to write OpenCL text (imported at the top of a
template: `<%! from aotconv.variants.kernel_text import vtype, comp, indent %>`).

The templates' own Mako helpers (act(), helpers(), flt()) are in templates/kernels/_common.mako;
these are plain Python, for use inside expressions and `<% %>` blocks as well as in text.
"""


def vtype(w):
    """The OpenCL type of a vector of `w` floats: float, float2, float4..."""
    return "float" if w == 1 else "float%d" % w


def comp(w, i):
    """The suffix that selects component `i` of a `w`-wide vector ("" for a scalar)."""
    return "" if w == 1 else ".s%x" % i


def indent(text, n):
    """`text` with every non-blank line indented by `n` spaces (captured Mako defs placed in a
    deeper block)."""
    pad = " " * n
    return "".join(pad + l if l.strip() else l for l in text.splitlines(True))


def plus(base, r, k, c=0):
    """base + r * k + c as code, folded where r (a filter row, say) is a constant."""
    if isinstance(r, int):
        v = r * k + c
        return base if v == 0 and base else ("%s + %d" % (base, v) if base else str(v))
    e = "%s + %s * %d" % (base, r, k) if base else "%s * %d" % (r, k)
    return e + (" + %d" % c if c else "")

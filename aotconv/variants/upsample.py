"""Upsample (ONNX Resize, nearest and linear over H and W): every output pixel samples the
input at an exact rational coordinate, (A*y + B) / D down the rows and (A*x + B) / D along the
columns (ops.upsample_coordinate), computed in integers: nearest rounds it as the layer's
`rounding` says and clamps it to the input, linear interpolates between the two pixels around
it (the coordinate clamped to the input first). No float ever decides which pixel is read, so
the kernel picks the pixels the numpy reference does on every device.

One flat launch: each work-item computes QB consecutive outputs of one output row, reading one
input row (nearest) or two (linear).
"""
from .base import Knob
from .flat import Blocked
from ..ops import upsample_coordinate

INT_MAX = 2**31 - 1


def axis_map(layer, axis):
    """The template's constants for `axis` (0: rows, 1: columns): A, B, D of the coordinate
    (A*o + B) / D, and the integer type that holds every intermediate (2n + D and 2D of the
    rounding included) for o in [0, out)."""
    in_len, out_len = layer.in_shape[2 + axis], layer.out_shape[2 + axis]
    a, b, d = upsample_coordinate(layer.attrs, axis, in_len, out_len)
    big = 2 * max(abs(b), abs(a * (out_len - 1) + b)) + 2 * d
    t = "int" if big <= INT_MAX else "long"
    return dict(A=a, B=b, D=d, T=t, IN=in_len, EXPR=_affine(a, b, t))


def _affine(a, b, t):
    """A*o + B as readable C in type t ('o', '2 * o - 1', '(long)16777216 * o + 3355443')."""
    term = "0" if a == 0 else "o" if a == 1 else f"{a} * o"
    if a > 1 and t == "long":
        term = f"({t}){a} * o"
    if b == 0:
        return term
    if a == 0:
        return str(b)
    return f"{term} {'+' if b > 0 else '-'} {abs(b)}"


class UpsampleDirect(Blocked):
    name = "upsample_direct"
    ops = ("upsample",)
    template = "kernels/upsample.cl.mako"
    block = Knob("QB", (1, 2, 4, 8), "outputs along a row per work-item")
    along = 3
    within = ("qb_within_row",
              "a block of outputs longer than the output row only adds idle iterations")

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        _, _, p, q = layer.out_shape
        a = layer.attrs
        return dict(NC=n * c, H=h, W=w, P=p, Q=q, mode=a["mode"],
                    coordinates=a["coordinates"], rounding=a.get("rounding"),
                    rows=axis_map(layer, 0), cols=axis_map(layer, 1))

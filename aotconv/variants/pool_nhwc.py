"""pool_nhwc: max / average pooling that reads and writes NHWC or CHWN.

pool_direct's sibling for the chains of layers the layout plan keeps channels-last (NHWC) or
batch-last (CHWN): a pool there costs no conversion on either side. Both layouts store a
pixel's values along one contiguous axis, the channels (NHWC) or the images (CHWN): the vector
axis, of extent VA. Element (n, c, h, w) sits at ((o * H + h) * W + w) * VA + v, where (o, v)
is (n, c) in NHWC and (c, n) in CHWN, so one kernel text serves both.

One work-item computes VW consecutive values along the vector axis of one output pixel: every
load and store is a VW-wide vector (float4, float2; vload_halfN in half storage). The window's
rows (columns) are clipped to the input only where the padding or the ceil_mode overhang can
reach them, decided at generation time; elsewhere the loops have the window's constant extent.
A vector axis that is not whole vectors (VA % VW) makes the last block's work-items load and
store their valid lanes one by one.

Semantics are pool_direct's (PyTorch's): max pooling skips padded positions; average pooling
divides by the window clipped to the padded input (the ceil_mode overhang never counts) and,
without count_include_pad, clipped to the input itself.

Domain: every maxpool and avgpool (kernel, stride, pad per axis, ceil_mode,
count_include_pad), any batch, half storage. NCHW is not in its space: pool_direct serves that
and stays every pool's fallback.
"""
from .base import Constraint, Knob, pow2_at_least
from .flat import Flat, flat_constraints, wg_knob
from .limits import first_valid
from ..graph import count

LAYOUTS = ("NHWC", "CHWN")


def axes(shape, layout):
    """(VA, OA): extents of the vector axis (contiguous) and of the outer axis of `layout` for
    a tensor of NCHW `shape`."""
    n, c = shape[:2]
    return (c, n) if layout == "NHWC" else (n, c)


def vector_blocks(layer, cfg):
    va, _ = axes(layer.in_shape, cfg["LAYOUT"])
    return -(-va // cfg["VW"])


def vector_items(layer, cfg):
    """Work-items: one per VW values along the vector axis of every output pixel."""
    return count(layer.out_shape) // layer.out_shape[1 if cfg["LAYOUT"] == "NHWC" else 0] \
        * vector_blocks(layer, cfg)


def vw_fits():
    return Constraint("vw_not_oversized", "software",
                      "a vector wider than the vector axis (channels in NHWC, images in CHWN), "
                      "to the next power of two, only computes padding lanes",
                      lambda l, c, t: c["VW"] <= pow2_at_least(axes(l.in_shape, c["LAYOUT"])[0]))


def layout_knob():
    return Knob("LAYOUT", LAYOUTS, "layout of the input read and the output written")


def vw_knob():
    return Knob("VW", (4, 2, 1), "vector width along the contiguous axis (channels in NHWC, "
                                 "images in CHWN): loads, stores")


def fallback_points(layer):
    """NHWC; VW the widest that divides the channels (aligned vectors, no lane-by-lane tail),
    then the others; 64 work-items, then the other sizes."""
    c = layer.in_shape[1]
    return [dict(LAYOUT="NHWC", VW=vw, WG=wg)
            for vw in sorted((4, 2, 1), key=lambda v: (c % v != 0, -v))
            for wg in (64, 32, 128, 256)]


def clipped(size, out, k, s, pad):
    """Can a window along an axis of `size` (`out` windows of `k`, stride `s`, padding `pad`)
    reach past the input: the padding or the ceil_mode overhang?"""
    return pad > 0 or (out - 1) * s + k > size


class PoolNhwc(Flat):
    name = "pool_nhwc"
    ops = ("maxpool", "avgpool")
    template = "kernels/pool_nhwc.cl.mako"
    half_storage = True
    constraints = flat_constraints(vector_items, vw_fits())

    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], cfg["LAYOUT"]

    def knobs(self, layer, target):
        return [layout_knob(), vw_knob(), wg_knob()]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, fallback_points(layer))

    items = staticmethod(vector_items)

    def template_params(self, layer, cfg):
        a = layer.attrs
        n, c, h, w = layer.in_shape
        _, _, p, q = layer.out_shape
        (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["pad"]
        va, oa = axes(layer.in_shape, cfg["LAYOUT"])
        vb = vector_blocks(layer, cfg)
        items = oa * p * q * vb
        return dict(N=n, C=c, H=h, W=w, P=p, Q=q, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
                    VA=va, OA=oa, VB=vb, VTAIL=va % cfg["VW"], ITEMS=items,
                    ICHK=items % cfg["WG"] != 0,
                    CLIP_H=clipped(h, p, kh, sh, ph), CLIP_W=clipped(w, q, kw, sw, pw),
                    is_max=layer.op == "maxpool",
                    include_pad=a.get("count_include_pad", False))

"""layout_convert: copy a tensor from one storage layout to another (NCHW, NHWC, CHWN).

schedule.py inserts one wherever a consumer reads a layout its producer does not write. Each
of the three layouts is an order of three "super dimensions", N, C and S = H*W (H and W stay
together and in order in all of them): NCHW = (N, C, S), NHWC = (N, S, C), CHWN = (C, S, N).
A conversion therefore reads along one super dimension (the source's innermost, A) and writes
along another (the destination's innermost, B); the third (R) is a batch of independent
planes. Two ways:

  TILE = 0   one work-item per output element, in destination order: the writes are
             contiguous, the reads strided (the plain fallback)
  TILE > 0   a TILE x TILE tile of the (A, B) plane through local memory: read along A,
             barrier, write along B, so both sides are contiguous; the work-group is
             (TILE, WG/TILE) and each work-item moves TILE/(WG/TILE) elements each way; the
             local tile has one float of padding per row against bank conflicts

In an fp16 build (aotconv.precision) the tensors are half, and a layout_convert whose
`src_storage` differs from its `storage` is also a cast: aotconv.layouts puts one after each
network input (float to half, rounded to nearest even) and before each output (half to float,
exact), in the same kernel as any change of layout.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, ceil_div
from .flat import flat_launch, wg_fills_simd, wg_not_wasteful
from ..graph import count
from ..precision import src_storage_of

ORDER = {"NCHW": "NCS", "NHWC": "NSC", "CHWN": "CSN"}


def super_dims(layer):
    n, c, h, w = layer.in_shape
    return {"N": n, "C": c, "S": h * w}


def strides(layout, dims):
    """{super dim: stride in floats} of a tensor stored in `layout`."""
    out, s = {}, 1
    for d in reversed(ORDER[layout]):
        out[d] = s
        s *= dims[d]
    return out


def plan(layer):
    """(A, B, R): the source's innermost super dim, the destination's, and the third."""
    a, b = ORDER[layer.attrs["src"]][-1], ORDER[layer.attrs["dst"]][-1]
    if a == b:                      # same innermost dim (src == dst): any order works
        b = ORDER[layer.attrs["dst"]][-2]
    r = ({"N", "C", "S"} - {a, b}).pop()
    return a, b, r


class LayoutConvert(Variant):
    name = "layout_convert"
    ops = ("layout_convert",)
    template = "kernels/layout_convert.cl.mako"
    half_storage = True
    constraints = (
        Constraint("tile_rows_whole", "algorithm",
                   "a tiled work-group is TILE wide and WG/TILE rows tall; the rows must "
                   "divide the tile so every work-item moves the same number of elements",
                   lambda l, c, t: c["TILE"] == 0 or (c["WG"] % c["TILE"] == 0
                                                      and c["TILE"] % (c["WG"] // c["TILE"]) == 0)),
        wg_not_wasteful(lambda l, c: count(l.out_shape)),
        Constraint("tile_not_oversized", "software",
                   "a tile wider than both transposed dimensions only moves padding",
                   lambda l, c, t: c["TILE"] == 0 or c["TILE"] <= 2 * max(
                       super_dims(l)[plan(l)[0]], super_dims(l)[plan(l)[1]])),
        wg_fills_simd(),
    )

    def layouts_of(self, layer, cfg):
        """Reads src, writes dst: the op is logically the identity, its layouts are its point."""
        return layer.attrs["src"], layer.attrs["dst"]

    def knobs(self, layer, target):
        return [Knob("TILE", (0, 32, 16), "local-memory tile side (0: one element per work-item)"),
                Knob("WG", (64, 128, 256, 32), "work-items per work-group")]

    def local_mem_bytes(self, layer, cfg):
        t = cfg["TILE"]
        return 4 * t * (t + 1)

    def template_params(self, layer, cfg):
        dims = super_dims(layer)
        a, b, r = plan(layer)
        src, dst = strides(layer.attrs["src"], dims), strides(layer.attrs["dst"], dims)
        return dict(COUNT=count(layer.out_shape), A=a, B=b, R=r,
                    SA=dims[a], SB=dims[b], SR=dims[r],
                    SRC_A=src[a], SRC_B=src[b], SRC_R=src[r],
                    DST_A=dst[a], DST_B=dst[b], DST_R=dst[r],
                    ROWS=cfg["WG"] // cfg["TILE"] if cfg["TILE"] else 0,
                    DIMS=dims, SRC_STRIDE=src, DORDER=ORDER[layer.attrs["dst"]],
                    src=layer.attrs["src"], dst=layer.attrs["dst"],
                    src_storage=src_storage_of(layer))

    def launches(self, layer, cfg, prefix):
        t, wg = cfg["TILE"], cfg["WG"]
        if not t:
            return [flat_launch(prefix, (In(0), Out()), count(layer.out_shape), wg)]
        dims = super_dims(layer)
        a, b, r = plan(layer)
        rows = wg // t
        return [Launch(prefix, (In(0), Out()),
                       (ceil_div(dims[a], t) * t, ceil_div(dims[b], t) * rows, dims[r]),
                       (t, rows, 1))]

"""conv_wgmma_halo_pool_f16_nhwc: conv_wgmma_halo_f16_nhwc with the 2x2 max pool after it
fused into its staged epilogue (a conv_pool layer, passes.fuse_pool), for --precision fp16.

VGG-16's pools each read the whole output of the convolution before them, at full resolution
(pool1: 103 MB at batch 16), to write a quarter of it. Here the convolution's output never
reaches memory: the work-group stages its FP32 accumulators in local memory (EPI = 1, as
conv_wgmma_halo_f16_nhwc's staged epilogue does) and stores the max of each 2x2 window, after
bias and activation per element, rounded to half once. Max commutes with rounding to nearest
(a monotone map), so it stores the bits the unfused pair stores.

A window's four outputs must be in one tile. The tile's rows are BM consecutive slots of the
padded input's grid, TWH = TW + S - 1 slots a padded row (conv_wgmma_halo_f16_nhwc.md): with
BM a multiple of 2 TWH every tile starts on an even padded row and holds whole pairs of rows;
with P even (so HP = P + R - 1 even for an odd R) a pair never straddles two images, and with TW
even a strip's columns pair up. So the strips offered are those whose TWH is a power of two
(TW = 2^j - S + 1, even), and a work-group stages its BM slots in one pass (BM = 16 WM: one
16-row mma tile per warp).

The variant is conv_wgmma_halo_f16_nhwc on the conv inside the conv_pool (`conv_view`): the
same space but for the strips, the same kernel text but for the epilogue (guarded by the
view's `pool` attribute, so every conv kernel renders as before).

Domain: a conv_pool of conv_wgmma_halo_f16_nhwc's convolutions and a 2x2 stride-2 max pool
without padding, the conv's output P and Q even.
"""
from dataclasses import replace

from .base import Constraint, Knob
from .conv_wgmma_halo_f16_nhwc import ConvWgmmaHaloF16Nhwc
from .limits import first_valid
from ..ops import conv_pool_mid_shape, split_conv_pool


def conv_view(layer):
    """The conv inside a conv_pool layer as a conv layer (its output the pool's input), its
    attrs keeping `pool` for the template; a conv layer as it is."""
    if layer.op != "conv_pool":
        return layer
    conv, _, _ = split_conv_pool(layer.attrs)
    return replace(layer, op="conv", attrs=dict(conv, pool=layer.attrs["pool"]),
                   out_shape=conv_pool_mid_shape(layer))


def _pool_reason(layer):
    conv, kind, pool = split_conv_pool(layer.attrs)
    if kind != "maxpool":
        return "fuses a max pool only (an average of halves would round differently)"
    for key, want in (("kernel", (2, 2)), ("stride", (2, 2)), ("pad", (0, 0))):
        if tuple(pool[key]) != want:
            return f"fuses a 2x2 stride-2 pool without padding, not {key} {tuple(pool[key])}"
    _, _, p, q = conv_pool_mid_shape(layer)
    if p % 2 or q % 2:
        return f"needs the conv's output P and Q even (whole 2x2 windows), not {p}x{q}"
    return None


def pool_strips(q, s):
    """TW values: even strips whose padded row TW + S - 1 is a power of two (16 first), no
    wider than the row rounded up to one."""
    tws = [2 ** j - s + 1 for j in (4, 5, 6, 3)]
    ok = [tw for tw in tws if tw >= 2 and tw % 2 == 0 and tw < 2 * q]
    return tuple(ok or [min(tw for tw in tws if tw >= 2 and tw % 2 == 0)])


def _on_view(constraint):
    return replace(constraint, check=lambda l, c, t: constraint.check(conv_view(l), c, t))


_BASE = ConvWgmmaHaloF16Nhwc()


class ConvWgmmaHaloPoolF16Nhwc(ConvWgmmaHaloF16Nhwc):
    name = "conv_wgmma_halo_pool_f16_nhwc"
    ops = ("conv_pool",)
    pool_of = "conv_wgmma_halo_f16_nhwc"    # the conv variant whose kernel this is, pooled

    constraints = tuple(_on_view(c) for c in ConvWgmmaHaloF16Nhwc.constraints) + (
        Constraint("pool_one_staged_pass", "algorithm",
                   "the window's four outputs are read back from one staged pass of the whole "
                   "tile: the staged epilogue (EPI = 1) and one 16-row tile per warp "
                   "(BM = 16 WM)",
                   lambda l, c, t: c["EPI"] == 1 and c["BM"] == 16 * c["WM"]),
        Constraint("pool_rows_pair_in_tile", "algorithm",
                   "a tile starts on an even padded row and holds whole pairs of rows: BM a "
                   "multiple of 2 (TW + S - 1)",
                   lambda l, c, t: c["BM"] % (2 * (c["TW"] + l.attrs["kernel"][1] - 1)) == 0),
    )

    def supports(self, layer):
        if layer.op != "conv_pool":
            return f"{self.name} implements conv_pool, not {layer.op}"
        why = _pool_reason(layer)
        if why:
            return f"{self.name} {why}"
        return _BASE.supports(conv_view(layer))

    def knobs(self, layer, target):
        v = conv_view(layer)
        tw = Knob("TW", pool_strips(v.out_shape[3], v.attrs["kernel"][1]),
                  "outputs per strip: even, TW + S - 1 a power of two (whole 2x2 windows in a "
                  "tile)")
        return [tw if k.name == "TW" else k for k in super().knobs(v, target)]

    def fallback(self, layer, target):
        v = conv_view(layer)
        tw = pool_strips(v.out_shape[3], v.attrs["kernel"][1])[0]
        pts = [dict(p, TW=tw, EPI=1, BM=16 * p["WM"]) for p in self.fallbacks]
        return first_valid(self, layer, target, pts)

    def registers(self, layer, cfg):
        return super().registers(conv_view(layer), cfg)

    def local_mem_bytes(self, layer, cfg):
        return super().local_mem_bytes(conv_view(layer), cfg)

    def template_params(self, layer, cfg):
        return super().template_params(conv_view(layer), cfg)

    def render(self, layer, cfg, prefix):
        return super().render(conv_view(layer), cfg, prefix)

    def buffers(self, layer, cfg):
        return super().buffers(conv_view(layer), cfg)

    def m_groups(self, layer, cfg):
        return super().m_groups(conv_view(layer), cfg)

    def launches(self, layer, cfg, prefix):
        return super().launches(conv_view(layer), cfg, prefix)


__all__ = ["ConvWgmmaHaloPoolF16Nhwc", "conv_view"]

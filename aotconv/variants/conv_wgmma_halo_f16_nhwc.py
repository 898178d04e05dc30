"""conv_wgmma_halo_f16_nhwc: conv_wgmma_f16_nhwc with the activations staged once per BK
channels as a halo tile, for stride-1 convolutions (3x3 above all) of a --precision fp16 build.

The im2col GEMM of conv_wgmma_f16_nhwc gathers each input pixel once per filter tap: R x S
times per BK channels (nine for a 3x3), through registers or cp.async, and filling local
memory is what holds that kernel back on the H100 (the tensor cores alone run a VGG-16 layer
in under a third of its time; docs/variants/conv_wgmma_f16_nhwc.md). Here the tile's BM rows
are consecutive slots of the zero-padded input's grid, a strip TW outputs wide at a time:
slot (img, y, x) for image img, padded row y of HP = P + R - 1 and column x of
TWH = TW + S - 1 (the slots of the extra rows and columns compute outputs nobody stores). The
output at slot u reads, at tap (r, s), the input at slot u + r TWH + s. So the work-group
stages the NS = BM + (R - 1) TWH + S - 1 slots its rows reach, BK channels at a time (one
16-byte load per 8 channels of a slot, zeros in the padding), and each tap's wgmma reads the
same halo through a descriptor whose start is r TWH + s slots on. A halo plane (8 channels
of every slot, 16 bytes each) is the descriptor's operand: 8 consecutive slots are one core
matrix, the next 8 channels the next plane (the leading offset), the next 8 rows 128 bytes on
(the stride offset). The weights stream one tap a step, BN x BK in core matrices as in
conv_wgmma_f16_nhwc, packed so that the K steps run (BK channels, tap) with the taps
innermost.

For a 128-slot tile of a 3x3 layer 28 wide (TW = 28, TWH = 30), the halo is 190 slots where
im2col loads 9 x 128 rows: 6 times fewer activation loads, each pixel's bounds checked once;
the slots the strip's two extra columns and each image's two extra rows add cost 7% of the
multiplies at 28 x 28 and 23% at 14 x 14 (smaller strips trade those for a larger halo).

Pipeline: the register double buffer (two halo buffers, two weight tiles): each step loads
the next step's weights into registers, and at the first tap of BK channels the next
channels' halo, while the tensor cores multiply; wgmma, its descriptors, the sm_90a rewrite,
the emulation on PoCL and the epilogues are conv_wgmma_f16_nhwc's, the epilogues mapping a
row's slot back to its pixel (or skipping it).

Domain: conv_wgmma_f16_nhwc's with stride 1 and dilation 1, and C % 16 == 0 (a BK of 16
channels or more never straddles a tap).
"""
from .base import Constraint, Knob, ceil_div, pow2_at_least
from .conv_common import domain_reason, enough_work_groups
from .conv_mma import ACCUMULATORS_FIT, _wg, emulated
from .conv_mma_f16 import F16_MMA_CONSTRAINTS
from .conv_wgmma_f16_nhwc import ConvWgmmaF16Nhwc, has_wgmma
from .mma_nhwc import HALF, epilogue_constraint, _dims, _epi_words

# strip widths offered besides the whole row: each divides many networks' widths (224, 112,
# 56, 28, 14) and keeps the halo of a 3x3 within a few rows of slots
STRIPS = (56, 32, 28, 16, 14)


def geometry(layer, c):
    """The halo tile's sizes for `layer` at point `c` (the template's HALO)."""
    n, _, p, q = layer.out_shape
    r, s = layer.attrs["kernel"]
    tw = c["TW"]
    twh, hp = tw + s - 1, p + r - 1
    ch = c["BK"] // HALF.vec
    ns = c["BM"] + (r - 1) * twh + s - 1
    # planes 128 / CH bytes apart (mod 128): NSP = 8 / CH (mod 8)
    nsp = ns + (8 // ch - ns) % 8
    return dict(TW=tw, TWH=twh, HP=hp, STRIPS=ceil_div(q, tw),
                TILES=ceil_div(n * hp * twh, c["BM"]), NS=ns, NSP=nsp,
                H_ITERS=ceil_div(ns * ch, _wg(c)), B_ITERS=ceil_div(c["BN"] * ch, _wg(c)),
                HBUF=c["HBUF"], WBUF=c["CPASYNC"] or 2 + c["WAIT"])


def _slots(layer, c):
    """Slots of one strip: every image's padded rows, TW + S - 1 each."""
    n, _, p, _ = layer.out_shape
    r, s = layer.attrs["kernel"]
    return n * (p + r - 1) * (c["TW"] + s - 1)


def work_groups(layer, c):
    g = geometry(layer, c)
    return g["STRIPS"] * g["TILES"] * ceil_div(_dims(layer)[1], c["BN"])


def _stage_words(layer, c):
    """HBUF halo buffers and WBUF weight tiles, in 32-bit words."""
    g = geometry(layer, c)
    ch = c["BK"] // HALF.vec
    return c["HBUF"] * ch * g["NSP"] * 4 + g["WBUF"] * c["BN"] * ch * 4


def min_wg_per_cu(layer, c, target):
    """One work-group of two warpgroups or more (256 work-items and up) per compute unit keeps
    its tensor cores fed, as one CTA an SM does in CUTLASS's Hopper GEMMs; smaller ones want
    the target's minimum."""
    return 1 if _wg(c) >= 256 else target.min_wg_per_cu


def busy_per_cu(layer, c, target):
    """Work-groups wanted per compute unit by enough_work_groups: one, so that every compute
    unit has work. Each work-group here is a warpgroup or more with a pipeline of its own
    (cp.async or register loads ahead, wgmmas in flight), and up to four of them share a
    compute unit, so they need not come in pairs. On the H100, VGG-16 b16's 14x14 conv5_1 as
    256 work-groups of one warpgroup (BM 64, BN 128) on 132 compute units tuned to 0.0557 ms,
    against 0.0566 ms for the best point at two work-groups per compute unit or more (and
    conv5_3 with its pool 0.0541 against 0.0571 ms). The register and local-memory occupancy
    rules keep min_wg_per_cu."""
    return 1


def strips(q):
    """TW values for an output width q, the first preferred: the whole row where it is at most
    64 wide (a 3x3's halo then spans three rows of at most 66 slots), the narrower strips of
    STRIPS that divide it (or, where none does, the two widest narrower ones), then the whole
    row where wider."""
    narrower = [w for w in STRIPS if w < q]
    parts = [w for w in narrower if q % w == 0] or narrower[:2]
    return tuple([q] + parts if q <= 64 else parts + [q])


# conv_wgmma_f16_nhwc's constraints this variant keeps, by name
_PARENT = {c.name: c for c in ConvWgmmaF16Nhwc.constraints}


class ConvWgmmaHaloF16Nhwc(ConvWgmmaF16Nhwc):
    name = "conv_wgmma_halo_f16_nhwc"
    added_knobs = ()

    constraints = (
        F16_MMA_CONSTRAINTS[0],                                         # storage_half
        _PARENT["wgmma"],
        _PARENT["warpgroup_rows"],
        _PARENT["instructions_cover_warpgroup"],
        Constraint("channels_whole_steps", "algorithm",
                   "a step is BK channels of one tap: BK divides C",
                   lambda l, c, t: l.in_shape[1] % c["BK"] == 0),
        Constraint("chunks_divide_work_group", "algorithm",
                   "each work-item loads one fixed 8-channel chunk of the halo's slots and of "
                   "the weights' rows: BK / 8 divides the work-group",
                   lambda l, c, t: _wg(c) % HALF.chunks(c) == 0),
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above a strip's slots (floor 64) "
                   "computes only padding",
                   lambda l, c, t: c["BM"] <= max(64, pow2_at_least(_slots(l, c)))),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above K (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BN"] <= max(32, pow2_at_least(_dims(l)[1]))),
        epilogue_constraint(HALF),
        ACCUMULATORS_FIT,
        Constraint("wait_with_taps", "algorithm",
                   "WAIT = 1 with two halo buffers stores the next channels' halo at the second "
                   "tap: R x S >= 2",
                   lambda l, c, t: not (c["WAIT"] and c["HBUF"] == 2)
                   or l.attrs["kernel"][0] * l.attrs["kernel"][1] >= 2),
        Constraint("cp_async_pipeline", "algorithm",
                   "the cp.async weight stages leave a step's wgmmas in flight (WAIT = 1) and "
                   "store the next channels' halo at the last tap into the other of two "
                   "buffers (HBUF = 2, R x S >= 2)",
                   lambda l, c, t: not c["CPASYNC"] or (
                       c["WAIT"] == 1 and c["HBUF"] == 2
                       and l.attrs["kernel"][0] * l.attrs["kernel"][1] >= 2)),
        enough_work_groups(work_groups, per_cu=busy_per_cu),
    )

    min_wg_per_cu = staticmethod(min_wg_per_cu)

    def supports(self, layer):
        why = super().supports(layer) or domain_reason(self, layer, (
            ("stride", (1, 1), "the halo tile's slots step one input pixel per output"),
            ("dilation", (1, 1), "the taps are consecutive slots of the halo")))
        if why is None and layer.in_shape[1] % 16:
            return (f"{self.name} needs C % 16 == 0, not C = {layer.in_shape[1]}: a step is "
                    "16 channels or more of one tap")
        return why

    def knobs(self, layer, target):
        """conv_wgmma_f16_nhwc's knobs, BK, the pipeline's (DBUF, CPASYNC, WAIT) and BM's
        meaning replaced, with the strip width TW and the halo buffers HBUF."""
        p = {k.name: k for k in super().knobs(layer, target)}
        return [Knob("BM", (128, 64, 256), "slots (output pixels and the padding's) per "
                                           "work-group: 64 per warpgroup along M"),
                p["BN"],
                Knob("BK", (32, 16, 64), "channels of a halo tile and of a step"),
                p["WM"], p["WN"],
                Knob("TW", strips(layer.out_shape[3]), "outputs per strip of the padded "
                                                       "input's grid (its slots per row: "
                                                       "TW + S - 1)"),
                p["PAD"],
                Knob("DBUF", (1,), "register double buffer"),
                Knob("HBUF", (2, 1), "halo buffers: 2 (the next channels' halo stored while "
                                     "the tensor cores multiply), or 1 (held in registers "
                                     "until the last tap, one more barrier per BK channels; "
                                     "room for larger tiles)"),
                Knob("CPASYNC", (0, 4, 5), "weight tiles filled by cp.async, CPASYNC - 2 steps "
                                           "ahead (0: through the registers, one step ahead)"),
                p["LDSM"], p["INSN"],
                Knob("WAIT", (1, 0), "wgmma groups left in flight at a step's end (1: the "
                                     "tensor cores run on through the meeting and the next "
                                     "step's loads; three weight tiles)"),
                p["EPI"]]

    fallbacks = [dict(BM=bm, BN=bn, BK=bk, WM=wm, WN=1, PAD=0, DBUF=1, HBUF=2, CPASYNC=0, LDSM=0,
                      INSN=ins, WAIT=0, EPI=0)
                 for bm, bn, bk, wm, ins in ((128, 128, 32, 8, 128), (64, 128, 32, 4, 128),
                                             (64, 64, 16, 4, 64), (64, 32, 16, 4, 32))]

    def fallback(self, layer, target):
        from .limits import first_valid
        tw = strips(layer.out_shape[3])[0]
        pts = [dict(p, TW=tw) for p in self.fallbacks]
        return first_valid(self, layer, target, pts, lambda c: work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Two halo buffers and two weight tiles, or a pass of the staged epilogue where
        larger, and where the wgmma is emulated the mma exchange the template declares."""
        c = cfg
        words = max(_stage_words(layer, c), _epi_words(c)) // 4 * 4
        if emulated():
            words += c["WM"] * c["WN"] * 192
        return 4 * words

    def registers(self, layer, cfg):
        """Accumulators (WTN / 2), a halo offset and a 16-byte vector per halo load and per
        weight load through the registers, ~24; the staged epilogue holds a bias chunk."""
        c = cfg
        g = geometry(layer, c)
        h, b = g["H_ITERS"], g["B_ITERS"]
        b = 0 if c["CPASYNC"] else b                   # cp.async: no weight registers
        return c["BN"] // c["WN"] // 2 + 5 * h + 4 * b + 24 + (HALF.vec if c["EPI"] else 0)

    def template_params(self, layer, cfg):
        d = super().template_params(layer, cfg)
        d.update(HALO=geometry(layer, cfg), SMEM=max(_stage_words(layer, cfg), _epi_words(cfg)))
        return d

    def m_groups(self, layer, cfg):
        g = geometry(layer, cfg)
        return g["STRIPS"] * g["TILES"]


__all__ = ["ConvWgmmaHaloF16Nhwc", "has_wgmma"]

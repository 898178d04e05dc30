"""What the channels-last tensor-core variants share (conv_mma_f16_nhwc: half storage, mma
m16n8k16 .f16; conv_mma_tf32_nhwc: FP32 storage, mma m16n8k8 .tf32).

Both are CUTLASS's NHWC fprop GEMM: M = N*P*Q output pixels, N = K output channels, the
reduction k = (r, s, c) over R*S*C with channels innermost, every global load one 16-byte
vector of `Element.vec` consecutive channels, local tiles of k-contiguous rows of 32-bit words
(a fragment register each: two halves, or one float), the same warp tiles, cp.async stages,
ldmatrix reads and staged epilogue. They differ in the element (`Element`: 8 halves or 4
floats per 16 bytes, 2 or 1 per word), the mma and its k-step, the epilogue's stores (in the
templates) and which builds they serve. `MmaNhwc` is their space, geometry and launches,
parameterised by `element`; each variant's module holds its constraints (their order is its
own: `aotconv space` reports them in it), its knob BK, its fallbacks and its domain.
"""
from dataclasses import dataclass
import hashlib
from pathlib import Path

from .base import TEMPLATE_DIR, Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, \
    ceil_div, pow2_at_least, round_up
from .conv_common import conv_sizes, domain_reason
from .conv_igemm import needs_bounds
from .conv_mma import _frags, _wg, emulated
from .limits import first_valid
from .residual import with_residual


# What both variants' kernels come from besides their own template and class: the shared
# template (loads, mma, main loop, epilogues) and this module (space, geometry, launches)
SHARED_SOURCES = (TEMPLATE_DIR / "kernels" / "_mma_nhwc.mako",
                  TEMPLATE_DIR / "kernels" / "_mma_f16.mako", Path(__file__))


@dataclass(frozen=True)
class Element:
    """What a variant stores: `vec` elements per 16-byte vector (the unit of every global
    load), `per_word` per 32-bit word of local memory, their name in the plural, the 16-byte
    vector type the kernel loads and the pair type the direct epilogue stores."""
    vec: int
    per_word: int
    name: str
    vector: str
    pair: str

    def chunks(self, c):
        """16-byte vectors per row of a step."""
        return c["BK"] // self.vec

    def ld(self, c):
        """Words per local row: BK / per_word of data and PAD of padding."""
        return c["BK"] // self.per_word + c["PAD"]

    def covers(self, rows, c):
        """A tile of `rows` rows of BK/vec vectors is loaded by the work-group in whole rounds,
        each work-item keeping one chunk column (so its rows, and their bounds, are fixed)."""
        ch, wg = self.chunks(c), _wg(c)
        return wg % ch == 0 and (rows * ch) % wg == 0

    def smem_words(self, c):
        """Local words the kernel declares: the stages, or a pass of the staged epilogue where
        larger."""
        return max((c["BM"] + c["BN"]) * self.ld(c) * _stages(c), _epi_words(c))


HALF = Element(8, 2, "halves", "uint4", "half2")
FLOAT = Element(4, 1, "floats", "float4", "float2")


def _dims(layer):
    """(M, N, reduction) of the GEMM: pixels, output channels, R*S*C."""
    n, k, p, q = layer.out_shape
    a = layer.attrs
    return n * p * q, k, layer.in_shape[1] * a["kernel"][0] * a["kernel"][1]


def _stages(c):
    return c["CPASYNC"] or (2 if c["DBUF"] else 1)


def work_groups(layer, c):
    m, n, _ = _dims(layer)
    return ceil_div(m, c["BM"]) * ceil_div(n, c["BN"])


def _ktiles(layer, c):
    return ceil_div(_dims(layer)[2], c["BK"])


def _epi(c):
    """EPI of a point; a point recorded before the knob existed ran the direct epilogue."""
    return c.get("EPI", 0)


def _eld(c):
    """Floats per row of the staged epilogue tile: BN + 8, 8 (mod 32) (the templates' bank
    analysis)."""
    return c["BN"] + 8


def _epi_words(c):
    """Local words of the staged epilogue: one pass, WM * 16 pixels of BN + 8 floats."""
    return c["WM"] * 16 * _eld(c) if _epi(c) else 0


_KNOBS = ("BM", "BN", "BK", "WM", "WN", "PAD", "DBUF", "CPASYNC", "LDSM", "EPI")


def fallback_points(*rows):
    """Fallback points (dicts) from rows of knob values in knob order."""
    return [dict(zip(_KNOBS, r)) for r in rows]


# -- constraints: each variant lists them in its own order -------------------------------------

def load_constraints(el):
    """a_load_covers_tile, b_load_covers_tile and one_pipeline."""
    v, vector = el.vec, el.vector
    return (
        Constraint("a_load_covers_tile", "algorithm",
                   f"the work-group loads the activation tile (BM pixels x BK/{v} {vector}) in "
                   f"whole rounds, each work-item at one fixed {v}-channel chunk of its pixels: "
                   f"BK/{v} divides the work-group and the work-group divides the tile",
                   lambda l, c, t: el.covers(c["BM"], c)),
        Constraint("b_load_covers_tile", "algorithm",
                   f"the work-group loads the weight tile (BN channels x BK/{v} {vector}) in "
                   "whole rounds, the same number per work-item, so the load needs no bounds "
                   "check",
                   lambda l, c, t: el.covers(c["BN"], c)),
        Constraint("one_pipeline", "algorithm",
                   "cp.async stages (CPASYNC) replace the register double buffer (DBUF): with "
                   "both, DBUF changes nothing and duplicates the point",
                   lambda l, c, t: not (c["CPASYNC"] and c["DBUF"])),
    )


def tile_constraints(k_floor):
    """m_tile_not_oversized, n_tile_not_oversized and k_tile_not_oversized, whose floor of 16
    the reason calls `k_floor`."""
    return (
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above N*P*Q (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BM"] <= max(32, pow2_at_least(_dims(l)[0]))),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above K (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BN"] <= max(32, pow2_at_least(_dims(l)[1]))),
        Constraint("k_tile_not_oversized", "software",
                   f"a K step beyond the next power of two above R*S*C (floor 16, {k_floor}) "
                   "multiplies zeros",
                   lambda l, c, t: c["BK"] <= max(16, pow2_at_least(_dims(l)[2]))),
    )


def epilogue_constraint(el):
    """epilogue_whole_vectors: the staged epilogue's 16-byte vectors of el.vec channels."""
    v = el.vec
    return Constraint(
        "epilogue_whole_vectors", "algorithm",
        "the staged epilogue (EPI = 1) stores, and reads the bias and residual, in 16-byte "
        f"vectors of {v} channels of one pixel: K % {v} == 0 keeps every pixel's channels on a "
        "16-byte boundary (else the direct epilogue, EPI = 0)",
        lambda l, c, t: not _epi(c) or _dims(l)[1] % v == 0)


STAGES_NOT_OVERSIZED = Constraint(
    "stages_not_oversized", "software",
    "more cp.async stages than K steps (floor 2) hold nothing",
    lambda l, c, t: c["CPASYNC"] <= max(2, _ktiles(l, c)))


class MmaNhwc(Variant):
    """The channels-last tensor-core GEMM of `element`; a subclass sets the variant's name,
    template, constraints, `bk` (its BK knob) and `fallbacks` (preferred untuned points)."""
    ops = ("conv",)
    layouts = ("NHWC", "NHWC")
    element = None              # HALF or FLOAT
    bk = None                   # the Knob BK: its values count elements
    fallbacks = ()

    def template_hash(self):
        """Variant.template_hash and the shared sources: an edit of either makes the records of
        both variants stale (kept only where they name the kernel still rendered)."""
        h = hashlib.sha256(super().template_hash().encode())
        for path in SHARED_SOURCES:
            h.update(path.read_bytes())
        return h.hexdigest()[:16]

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        why = super().supports(layer) or domain_reason(self, layer, (
            ("groups", 1, "the tensor-core GEMM is one dense GEMM"),))
        v = self.element.vec
        if why is None and layer.in_shape[1] % v:
            # conv1 of an RGB network (C = 3) stays on the other variants
            return (f"{self.name} needs C % {v} == 0, not C = {layer.in_shape[1]}: it loads "
                    f"the input channels in 16-byte vectors of {v} {self.element.name}")
        return why

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("BM", (64, 128, 32), "tile in M (output pixels) per work-group"),
                Knob("BN", (64, 128, 32), "tile in N (output channels) per work-group"),
                self.bk,
                Knob("WM", (2, 1, 4), "warps along M"),
                Knob("WN", (2, 1, 4), "warps along N"),
                Knob("PAD", (4, 0), "words of padding per local row: 4 makes a row 4 banks off "
                                    "the next mod 32, so a warp's fragment reads hit 32 banks"),
                Knob("DBUF", (1, 0), "double buffering: load step k+1 into registers while the "
                                     "tensor cores multiply step k, one barrier per step"),
                Knob("CPASYNC", (0, 3, 2), "local stages filled by cp.async (0: loads through "
                                           "registers); unmeasured on hardware"),
                Knob("LDSM", (0, 1), "fragments read with ldmatrix.x4; unmeasured on "
                                     "hardware"),
                Knob("EPI", (0, 1), "epilogue staged through local memory, stored in 16-byte "
                                    f"vectors (0: {self.element.pair} stores from the "
                                    "fragments); unmeasured on hardware")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, self.fallbacks, lambda c: work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: the stages of both tiles (words of 32 bits) as
        an array of 16-byte vectors (smem4: SMEM / 4), SMEM the larger of the stages and a pass
        of the staged epilogue (EPI = 1), and where the mma is emulated its fragment exchange
        (192 words a warp) and ldmatrix's address exchange (32 a warp)."""
        c = cfg
        words = self.element.smem_words(c) // 4 * 4
        if emulated():
            words += c["WM"] * c["WN"] * (192 + (32 if c["LDSM"] else 0))
        return 4 * words

    def registers(self, layer, cfg):
        """Accumulators, one k-step's fragment words, the pixel state of the activation rows,
        the prefetched step (a 16-byte vector each), ~24; the staged epilogue holds a bias
        chunk (vec floats) through its passes."""
        c, el = cfg, self.element
        mi, ni = _frags(c)
        a_iters = c["BM"] * el.chunks(c) // _wg(c)
        b_iters = c["BN"] * el.chunks(c) // _wg(c)
        regs = 4 * mi * ni + 4 * mi + 2 * ni + 3 * a_iters + 24
        if c["DBUF"] and not c["CPASYNC"]:
            regs += 4 * (a_iters + b_iters)
        if _epi(c):
            regs += el.vec
        return regs

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        c, el = cfg, self.element
        npq, k, rsc = _dims(layer)
        mi, ni = _frags(c)
        wg, ch = _wg(c), el.chunks(c)
        # the staged epilogue's pass: WM * 16 pixels of BN channels in 16-byte vectors (the
        # template reads ELD, E_ITERS and ECHK where EPI = 1 only)
        vecs = c["WM"] * 16 * c["BN"] // el.vec
        d.update(
            NPQ=npq, RSC=rsc, RSCP=round_up(rsc, c["BK"]), KTILES=_ktiles(layer, c),
            WG=wg, WARPS=c["WM"] * c["WN"], MI=mi, NI=ni,
            WTM=c["BM"] // c["WM"], WTN=c["BN"] // c["WN"], CH=ch, LD=el.ld(c),
            NBUF=_stages(c), A_ITERS=c["BM"] * ch // wg, B_ITERS=c["BN"] * ch // wg,
            HCHK=needs_bounds(d["H"], d["P"], d["SH"], d["PT"], d["R"], d["DH"]),
            WCHK=needs_bounds(d["W"], d["Q"], d["SW"], d["PL"], d["S"], d["DW"]),
            KCHK=rsc % c["BK"] != 0, MCHK=npq % c["BM"] != 0, NCHK=k % c["BN"] != 0,
            PAIRS=k % 2 == 0, EMULATE=emulated(), has_bias=bool(layer.attrs["bias"]),
            EPI=_epi(c), ELD=_eld(c), E_ITERS=ceil_div(vecs, wg), ECHK=vecs % wg != 0,
            SMEM=el.smem_words(c), WGMMA=False, INSN=0, WAIT=0, HALO=None)
        return d

    def _packed_words(self, layer, cfg):
        """Words of the packed weights: [K/BN tiles][K steps][BN][BK / per_word]."""
        _, k, rsc = _dims(layer)
        return round_up(k, cfg["BN"]) * round_up(rsc, cfg["BK"]) // self.element.per_word

    def buffers(self, layer, cfg):
        return {"wpack": self._packed_words(layer, cfg)}

    def m_groups(self, layer, cfg):
        """Work-groups along M: BM output pixels each."""
        return ceil_div(_dims(layer)[0], cfg["BM"])

    def launches(self, layer, cfg, prefix):
        _, k, _ = _dims(layer)
        run_args = with_residual(layer, (In(0), Buffer("wpack"))
                                 + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(self._packed_words(layer, cfg), 64),), (64,), phase="setup"),
                Launch(prefix, run_args,
                       (self.m_groups(layer, cfg) * _wg(cfg), ceil_div(k, cfg["BN"])),
                       (_wg(cfg), 1))]

"""conv_mma: implicit-GEMM convolution on NVIDIA's tensor cores in TF32 (mma.sync m16n8k8).

The convolution is the GEMM  Y[m][n] = sum_k W[m][k] * X[k][n]  with M = K output channels,
N = batch * P * Q output pixels and the reduction k = (c, r, s) over C * R * S (groups 1).
A work-group of WM x WN warps computes a BM x BN tile of Y: per BK-deep step it stages a
BK x BM slice of the weights (packed once, in set_params, k-major and zero-padded to whole
tiles, already rounded to TF32) and the BK x BN slice of the implicit im2col matrix (read
from the NCHW input in place, padding, stride and dilation resolved in the load, rounded to
TF32 on its way to local memory) in local memory; each warp multiplies its
(BM/WM) x (BN/WN) part as a grid of 16 x 8 tiles, one `mma.sync.aligned.m16n8k8.row.col.f32
.tf32.tf32.f32` per tile and 8-deep k-step, accumulating in FP32 registers. The epilogue
adds the bias (and a fused residual), applies the activation and stores NCHW.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32; groupID g = lane >> 2,
threadID_in_group t = lane & 3): A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4);
B b0 (t, g), b1 (t+4, g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).

The mma is a macro with two bodies: the inline PTX where the OpenCL compiler is NVIDIA's,
and elsewhere (or with AOTCONV_MMA_EMULATE defined) an exact portable emulation: each warp
exchanges its fragments through local memory and every lane computes its four outputs with
the operands rounded to TF32 as cvt.rna rounds them. The emulation is what the tests run on
PoCL; a build offers the variant only where the tensor cores are (an NVIDIA device of compute
capability 8.0 or newer) and the build's precision allows TF32 (`build.precision`,
aotconv.variants.limits). AOTCONV_MMA_EMULATE=1 in the environment is a switch for tests
only: it admits any device and renders the emulation, on NVIDIA too.

Domain: conv with groups 1, any kernel, stride, padding and dilation, NCHW in and out,
a fused residual add.
"""
import os
import re

from .base import Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, ceil_div, \
    pow2_at_least, round_up
from .conv_common import conv_sizes, domain_reason, enough_work_groups
from .conv_igemm import needs_bounds
from .limits import first_valid
from .residual import with_residual

EMULATE_ENV = "AOTCONV_MMA_EMULATE"
MIN_CC = (8, 0)                      # mma.sync m16n8k8 .tf32 and cvt.rna.tf32: sm_80


def emulated():
    """The test-only switch: AOTCONV_MMA_EMULATE=1 admits devices without tensor cores and
    renders the portable emulation of the mma (docs/precision.md)."""
    return os.environ.get(EMULATE_ENV, "") not in ("", "0")


def has_tensor_cores(target):
    """An NVIDIA device of compute capability 8.0 or newer (the profile's, or the live
    device's when aotconv.context read it)."""
    cc = tuple(getattr(target, "compute_capability", ()) or ())
    return bool(re.search("nvidia", target.vendor, re.I)) and bool(cc) and cc >= MIN_CC


def _dims(layer):
    """(M, N, reduction) of the GEMM."""
    n, k, p, q = layer.out_shape
    a = layer.attrs
    return k, n * p * q, layer.in_shape[1] * a["kernel"][0] * a["kernel"][1]


def _wg(c):
    return 32 * c["WM"] * c["WN"]


def _frags(c):
    """(16-row tiles, 8-column tiles) of one warp."""
    return c["BM"] // c["WM"] // 16, c["BN"] // c["WN"] // 8


def _b_plan(c, per_word=1):
    """How the work-group loads the input tile, BK/per_word rows of 32-bit words (per_word
    consecutive k in a word: 1 in tf32, 2 in f16) by BN columns: (columns per work-item, word
    rows per work-item, row step). Consecutive work-items take consecutive columns (pixels)."""
    wg, bn, rows = _wg(c), c["BN"], c["BK"] // per_word
    if wg >= bn:
        step = wg // bn
        return 1, rows // step, step
    return bn // wg, rows, 1


def _b_covers(c, per_word=1):
    wg, bn, rows = _wg(c), c["BN"], c["BK"] // per_word
    return (wg % bn == 0 and rows % (wg // bn) == 0) if wg >= bn else bn % wg == 0


def mma_registers(c, per_word=1):
    """Registers per work-item of the NCHW tensor-core kernels: accumulators, one k-step's
    fragment words, the prefetched step, column state, ~24."""
    mi, ni = _frags(c)
    cols, rows, _ = _b_plan(c, per_word)
    regs = 4 * mi * ni + 4 * mi + 2 * ni + 3 * cols + 24
    if c["DBUF"]:
        regs += c["BK"] // per_word * c["BM"] // _wg(c) + cols * rows
    return regs


def mma_template_params(layer, c, per_word=1):
    """The sizes the NCHW tensor-core templates read (per_word: k values in a 32-bit word)."""
    d = conv_sizes(layer)
    m, npq, crs = _dims(layer)
    mi, ni = _frags(c)
    cols, rows, step = _b_plan(c, per_word)
    d.update(
        M=m, NPQ=npq, CRS=crs, CRSP=round_up(crs, c["BK"]), MP=round_up(m, c["BM"]),
        WG=_wg(c), WARPS=c["WM"] * c["WN"], MI=mi, NI=ni,
        WTM=c["BM"] // c["WM"], WTN=c["BN"] // c["WN"],
        LDA=c["BM"] + c["PAD"], LDB=c["BN"] + c["PAD"],
        A_ITERS=c["BK"] // per_word * c["BM"] // (4 * _wg(c)),
        BCOLS=cols, BROWS=rows, B_ROWSTEP=step,
        HCHK=needs_bounds(d["H"], d["P"], d["SH"], d["PT"], d["R"], d["DH"]),
        WCHK=needs_bounds(d["W"], d["Q"], d["SW"], d["PL"], d["S"], d["DW"]),
        KCHK=crs % c["BK"] != 0, NCHK=npq % c["BN"] != 0, MCHK=m % c["BM"] != 0,
        EMULATE=emulated(), has_bias=bool(layer.attrs["bias"]))
    return d


def _work_groups(layer, c):
    m, n, _ = _dims(layer)
    return ceil_div(m, c["BM"]) * ceil_div(n, c["BN"])


def _fallbacks(*rows):
    return [dict(zip(("BM", "BN", "BK", "WM", "WN", "PAD", "DBUF"), r)) for r in rows]


# Preferred untuned points, big tiles first; the last is valid for every layer of the domain
# (a 32 x 32 tile of one warp is never oversized, its loads always cover the tile).
_FALLBACKS = _fallbacks((64, 128, 16, 2, 2, 8, 1), (64, 64, 16, 2, 2, 8, 1),
                        (64, 64, 16, 2, 2, 8, 0), (32, 64, 16, 1, 2, 8, 0),
                        (32, 32, 16, 1, 1, 8, 0), (32, 32, 8, 1, 1, 8, 0))


# The constraints conv_mma_f16 shares: its mma tiles and accumulators are these too
WARP_TILES_WHOLE = Constraint(
    "warp_tiles_whole", "algorithm",
    "each warp computes a whole grid of 16 x 8 mma tiles: BM % (16 WM) == 0 and BN % (8 WN) == 0",
    lambda l, c, t: c["BM"] % (16 * c["WM"]) == 0 and c["BN"] % (8 * c["WN"]) == 0)
M_TILE_NOT_OVERSIZED = Constraint(
    "m_tile_not_oversized", "software",
    "a tile beyond the next power of two above K (floor 32) computes only padding",
    lambda l, c, t: c["BM"] <= max(32, pow2_at_least(_dims(l)[0])))
N_TILE_NOT_OVERSIZED = Constraint(
    "n_tile_not_oversized", "software",
    "a tile beyond the next power of two above N*P*Q (floor 32) computes only padding",
    lambda l, c, t: c["BN"] <= max(32, pow2_at_least(_dims(l)[1])))
ACCUMULATORS_FIT = Constraint(
    "accumulators_fit", "software",
    "more than 128 FP32 accumulators per lane (4 per mma tile) spill",
    lambda l, c, t: 4 * _frags(c)[0] * _frags(c)[1] <= 128)

def mma_knobs(bk, bk_what, unit):
    """The knobs of the tensor-core GEMM variants (conv_mma, conv_mma_f16): the same tiles and
    warps, a reduction step `bk` (values, what it holds) and local rows padded in `unit`s."""
    return [Knob("BM", (64, 128, 32), "tile in M (output channels) per work-group"),
            Knob("BN", (64, 128, 32), "tile in N (output pixels) per work-group"),
            Knob("BK", bk, bk_what),
            Knob("WM", (2, 1, 4), "warps along M"),
            Knob("WN", (2, 1, 4), "warps along N"),
            Knob("PAD", (8, 0), f"{unit} of padding per local row: 8 makes the fragment "
                                "reads of a warp hit 32 different banks"),
            Knob("DBUF", (1, 0), "double buffering: load step k+1 into registers while the "
                                 "tensor cores multiply step k, one barrier per step")]


class ConvMma(Variant):
    name = "conv_mma"
    ops = ("conv",)
    template = "kernels/conv_mma.cl.mako"
    precision = "tf32"           # TF32 products, FP32 accumulation (aotconv.precision)

    constraints = (
        Constraint("tensor_cores", "hardware",
                   "mma.sync m16n8k8 in TF32 needs an NVIDIA GPU of compute capability 8.0 or "
                   "newer (its tensor cores)",
                   lambda l, c, t: emulated() or has_tensor_cores(t)),
        WARP_TILES_WHOLE,
        Constraint("k_step_whole_mmas", "algorithm",
                   "a BK-deep step is whole 8-deep mma k-steps",
                   lambda l, c, t: c["BK"] % 8 == 0),
        Constraint("a_load_covers_tile", "algorithm",
                   "the work-group loads the BK x BM weight tile in float4 vectors, the same "
                   "number per work-item, so the load needs no bounds check",
                   lambda l, c, t: (c["BK"] * c["BM"]) % (4 * _wg(c)) == 0),
        Constraint("b_load_covers_tile", "algorithm",
                   "each work-item loads fixed columns of the BK x BN input tile, the same count "
                   "each: the work-group size and the tile width must divide",
                   lambda l, c, t: _b_covers(c)),
        M_TILE_NOT_OVERSIZED,
        N_TILE_NOT_OVERSIZED,
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above C*R*S (floor 8) multiplies "
                   "zeros",
                   lambda l, c, t: c["BK"] <= max(8, pow2_at_least(_dims(l)[2]))),
        ACCUMULATORS_FIT,
        enough_work_groups(_work_groups),
    )

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        return super().supports(layer) or domain_reason(self, layer, (
            ("groups", 1, "the tensor-core GEMM is one dense GEMM"),))

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return mma_knobs((16, 32, 8), "reduction step held in local memory", "floats")

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _FALLBACKS, lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: NBUF weight tiles [BK][BM + PAD] and input tiles
        [BK][BN + PAD] as float4 arrays (Abuf4: NBUF * A_SIZE / 4, Bbuf4 rounded up to whole
        float4s) and, where the mma is emulated, its fragment exchange (192 floats a warp)."""
        c = cfg
        nbuf = 2 if c["DBUF"] else 1
        a4 = nbuf * c["BK"] * (c["BM"] + c["PAD"]) // 4
        b4 = ceil_div(nbuf * c["BK"] * (c["BN"] + c["PAD"]), 4)
        exchange = c["WM"] * c["WN"] * 192 if emulated() else 0
        return 16 * (a4 + b4) + 4 * exchange

    def registers(self, layer, cfg):
        return mma_registers(cfg)

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        return mma_template_params(layer, cfg)

    def buffers(self, layer, cfg):
        m, _, crs = _dims(layer)
        return {"wpack": round_up(crs, cfg["BK"]) * round_up(m, cfg["BM"])}

    def launches(self, layer, cfg, prefix):
        m, npq, crs = _dims(layer)
        packed = round_up(crs, cfg["BK"]) * round_up(m, cfg["BM"])
        run_args = with_residual(layer, (In(0), Buffer("wpack"))
                                 + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(packed, 64),), (64,), phase="setup"),
                Launch(prefix, run_args,
                       (ceil_div(npq, cfg["BN"]) * _wg(cfg), ceil_div(m, cfg["BM"])),
                       (_wg(cfg), 1))]

"""conv_mma_f16_nhwc: channels-last implicit-GEMM convolution on NVIDIA's tensor cores for half
storage (mma.sync m16n8k16 .f16, FP32 accumulation), NHWC in and out.

The GEMM is oriented as CUTLASS's NHWC fprop: Y[m][n] = sum_k X[m][k] * W[k][n] with M = N*P*Q
output pixels (the rows of A: activations gathered from the NHWC input), N = K output channels
(the columns of B: the weights) and the reduction k = (r, s, c) over R*S*C, channels innermost
(groups 1). With C % 8 == 0, eight consecutive k are eight consecutive halves of one input
pixel: one 16-byte load (uint4) per 8 k, one (h, w) bounds check per pixel and filter tap, and
every 32-bit word is one .f16x2 fragment register (two consecutive channels), where NCHW
(conv_mma_f16) gathers 16-bit loads with (c, r, s) -> (h, w) arithmetic per element.

A work-group of WM x WN warps computes a BM x BN tile (pixels x output channels). Per BK-deep
step it stages in local memory the BM x BK/2 words of the activations (uint4 loads from the
input, a tap in the padding or a step past R*S*C reading zeros) and the BN x BK/2 words of the
weights (packed once, in set_params, tile-major and zero-padded to whole tiles, so a step's
weight tile is one contiguous run of uint4), both k-contiguous per row. Each warp multiplies
its (BM/WM) x (BN/WN) part as MI x NI tiles of 16 x 8 per 16-deep k-step. The accumulator
fragment c0, c1 (row g, columns 2t, 2t+1) is two consecutive output channels of one pixel:
the epilogue reads the bias and a fused residual two channels at a time (vload_half2), adds in
FP32, applies the activation and stores one half2 (vstore_half2_rte) into the NHWC output.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .f16;
g = lane >> 2, t = lane & 3): A a0a1 (g, 2t..2t+1), a2a3 (g+8, ..), a4a5 (g, 2t+8..2t+9),
a6a7 (g+8, ..); B b0b1 (2t..2t+1, g), b2b3 (2t+8..2t+9, g); C c0 (g, 2t), c1 (g, 2t+1),
c2 (g+8, 2t), c3 (g+8, 2t+1). A lane reads its A words at rows g, g+8 and word columns t, t+4
of an 8-word step; its B words at row g (a channel), word columns t, t+4.

Three data-movement knobs the H100 has yet to measure (docs/variants/conv_mma_f16_nhwc.md):
CPASYNC = S > 0 fills S local stages with `cp.async.cg.shared.global` (16 bytes, zero-filled
where the source size is 0) in a multi-stage pipeline, LDSM = 1 reads the fragments with
`ldmatrix.sync.aligned.m8n8.x4` (.x2 for a lone B tile), and EPI = 1 stages the epilogue:
in MI passes each warp writes 16 rows of its FP32 accumulators into local memory (the stages'
space, reused), and the work-group then stores whole pixels 8 channels a 16-byte vector,
reading the bias and the residual likewise, as CUTLASS's epilogue does (the direct epilogue's
half2 stores from the fragments use half of every 32-byte sector a warp touches). It adds the
bias, the residual and the activation per element and rounds once, as EPI = 0 does, so both
store the same bits. Each has, like the mma, an exact portable body (plain loads; an address
exchange through local memory; vstore_half2_rte and an exact decoding in place of the cvt
instructions) that the PoCL tests run, with AOTCONV_MMA_EMULATE=1 (conv_mma's test-only
switch) or off NVIDIA.

Domain: conv with groups 1 and C % 8 == 0, any kernel, stride, padding and dilation, NHWC in
and out, a fused residual add; half storage, on tensor cores (compute capability 8.0 or
newer) or with the switch.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, ceil_div, \
    pow2_at_least, round_up
from .conv_common import conv_sizes, domain_reason, enough_work_groups
from .conv_igemm import needs_bounds
from .conv_mma import ACCUMULATORS_FIT, _frags, _wg, emulated
from .conv_mma_f16 import F16_MMA_CONSTRAINTS, _half_layer
from .limits import first_valid
from .residual import with_residual

VEC = 8                              # halves per uint4: the unit of every global load


def _dims(layer):
    """(M, N, reduction) of the GEMM: pixels, output channels, R*S*C."""
    n, k, p, q = layer.out_shape
    a = layer.attrs
    return n * p * q, k, layer.in_shape[1] * a["kernel"][0] * a["kernel"][1]


def _chunks(c):
    """uint4 vectors (8 halves each) per row of a step."""
    return c["BK"] // VEC


def _ld(c):
    """Words per local row: BK/2 of data and PAD of padding."""
    return c["BK"] // 2 + c["PAD"]


def _stages(c):
    return c["CPASYNC"] or (2 if c["DBUF"] else 1)


def _work_groups(layer, c):
    m, n, _ = _dims(layer)
    return ceil_div(m, c["BM"]) * ceil_div(n, c["BN"])


def _ktiles(layer, c):
    return ceil_div(_dims(layer)[2], c["BK"])


def _covers(rows, c):
    """A tile of `rows` rows of BK/8 uint4 is loaded by the work-group in whole rounds, each
    work-item keeping one chunk column (so its rows, and their bounds, are fixed)."""
    ch, wg = _chunks(c), _wg(c)
    return wg % ch == 0 and (rows * ch) % wg == 0


_KNOBS = ("BM", "BN", "BK", "WM", "WN", "PAD", "DBUF", "CPASYNC", "LDSM", "EPI")


def _fallbacks(*rows):
    return [dict(zip(_KNOBS, r)) for r in rows]


# Preferred untuned points, big tiles first, none with the knobs the H100 has not measured
# (CPASYNC, LDSM, EPI); the last is valid for every layer of the domain (one warp on a 32 x 32
# tile is never oversized and its loads, 64 uint4 of each tile per step, always cover the
# tiles).
_FALLBACKS = _fallbacks((128, 128, 32, 2, 2, 4, 1, 0, 0, 0), (128, 64, 32, 2, 2, 4, 1, 0, 0, 0),
                        (64, 64, 32, 2, 2, 4, 1, 0, 0, 0), (64, 64, 16, 2, 2, 4, 0, 0, 0, 0),
                        (64, 32, 16, 2, 1, 4, 0, 0, 0, 0), (32, 32, 16, 1, 1, 4, 0, 0, 0, 0))


def _epi(c):
    """EPI of a point; a point recorded before the knob existed ran the direct epilogue."""
    return c.get("EPI", 0)


def _eld(c):
    """Floats per row of the staged epilogue tile: BN + 8, 8 (mod 32) (the template's bank
    analysis)."""
    return c["BN"] + 8


def _epi_words(c):
    """Local words of the staged epilogue: one pass, WM * 16 pixels of BN channels."""
    return c["WM"] * 16 * _eld(c) if _epi(c) else 0


class ConvMmaF16Nhwc(Variant):
    name = "conv_mma_f16_nhwc"
    ops = ("conv",)
    template = "kernels/conv_mma_f16_nhwc.cl.mako"
    layouts = ("NHWC", "NHWC")
    half_storage = True          # reads and writes half; FP32 products and sums (the fp16 math)
    added_knobs = (("EPI", 0),)  # a record made before EPI ran the direct epilogue

    constraints = (
        *F16_MMA_CONSTRAINTS,
        Constraint("a_load_covers_tile", "algorithm",
                   "the work-group loads the activation tile (BM pixels x BK/8 uint4) in whole "
                   "rounds, each work-item at one fixed 8-channel chunk of its pixels: "
                   "BK/8 divides the work-group and the work-group divides the tile",
                   lambda l, c, t: _covers(c["BM"], c)),
        Constraint("b_load_covers_tile", "algorithm",
                   "the work-group loads the weight tile (BN channels x BK/8 uint4) in whole "
                   "rounds, the same number per work-item, so the load needs no bounds check",
                   lambda l, c, t: _covers(c["BN"], c)),
        Constraint("one_pipeline", "algorithm",
                   "cp.async stages (CPASYNC) replace the register double buffer (DBUF): with "
                   "both, DBUF changes nothing and duplicates the point",
                   lambda l, c, t: not (c["CPASYNC"] and c["DBUF"])),
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above N*P*Q (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BM"] <= max(32, pow2_at_least(_dims(l)[0]))),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above K (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BN"] <= max(32, pow2_at_least(_dims(l)[1]))),
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above R*S*C (floor 16, one mma "
                   "k-step) multiplies zeros",
                   lambda l, c, t: c["BK"] <= max(16, pow2_at_least(_dims(l)[2]))),
        Constraint("epilogue_whole_vectors", "algorithm",
                   "the staged epilogue (EPI = 1) stores, and reads the bias and residual, in "
                   "16-byte vectors of 8 channels of one pixel: K % 8 == 0 keeps every pixel's "
                   "channels on a 16-byte boundary (else the direct epilogue, EPI = 0)",
                   lambda l, c, t: not _epi(c) or _dims(l)[1] % VEC == 0),
        Constraint("stages_not_oversized", "software",
                   "more cp.async stages than K steps (floor 2) hold nothing",
                   lambda l, c, t: c["CPASYNC"] <= max(2, _ktiles(l, c))),
        ACCUMULATORS_FIT,
        enough_work_groups(_work_groups),
    )

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        why = super().supports(layer) or domain_reason(self, layer, (
            ("groups", 1, "the tensor-core GEMM is one dense GEMM"),))
        if why is None and layer.in_shape[1] % VEC:
            # conv1 of an RGB network (C = 3) stays on the other variants
            return (f"{self.name} needs C % {VEC} == 0, not C = {layer.in_shape[1]}: it loads "
                    f"the input channels in 16-byte vectors of {VEC} halves")
        if why is None and not _half_layer(layer):
            # an FP32 or TF32 build's layer: its spaces leave the variant out, with this reason
            return (f"{self.name} multiplies the half values a --precision fp16 build stores: "
                    f"only a build of --precision fp16 runs it")
        return why

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("BM", (64, 128, 32), "tile in M (output pixels) per work-group"),
                Knob("BN", (64, 128, 32), "tile in N (output channels) per work-group"),
                Knob("BK", (32, 16, 64), "reduction step (halves, (r, s, c) order) held in "
                                         "local memory"),
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
                                    "vectors (0: half2 stores from the fragments); unmeasured "
                                    "on hardware")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _FALLBACKS, lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: the stages of both tiles in words of two halves
        as a uint4 array (smem4: NBUF * STAGE / 4), or the staged epilogue's pass (EPI = 1)
        where it is larger, and where the mma is emulated its fragment exchange (192 words a
        warp) and ldmatrix's address exchange (32 a warp)."""
        c = cfg
        words = max((c["BM"] + c["BN"]) * _ld(c) * _stages(c), _epi_words(c)) // 4 * 4
        if emulated():
            words += c["WM"] * c["WN"] * (192 + (32 if c["LDSM"] else 0))
        return 4 * words

    def registers(self, layer, cfg):
        """Accumulators, one k-step's fragment words, the pixel state of the activation rows,
        the prefetched step (uint4 each), ~24; the staged epilogue holds a bias chunk (8
        floats) through its passes."""
        c = cfg
        mi, ni = _frags(c)
        a_iters = c["BM"] * _chunks(c) // _wg(c)
        b_iters = c["BN"] * _chunks(c) // _wg(c)
        regs = 4 * mi * ni + 4 * mi + 2 * ni + 3 * a_iters + 24
        if c["DBUF"] and not c["CPASYNC"]:
            regs += 4 * (a_iters + b_iters)
        if _epi(c):
            regs += 8
        return regs

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        c = cfg
        npq, k, rsc = _dims(layer)
        mi, ni = _frags(c)
        wg, ch = _wg(c), _chunks(c)
        d.update(
            NPQ=npq, RSC=rsc, RSCP=round_up(rsc, c["BK"]), KTILES=_ktiles(layer, c),
            WG=wg, WARPS=c["WM"] * c["WN"], MI=mi, NI=ni,
            WTM=c["BM"] // c["WM"], WTN=c["BN"] // c["WN"], CH=ch, LD=_ld(c),
            NBUF=_stages(c), A_ITERS=c["BM"] * ch // wg, B_ITERS=c["BN"] * ch // wg,
            HCHK=needs_bounds(d["H"], d["P"], d["SH"], d["PT"], d["R"], d["DH"]),
            WCHK=needs_bounds(d["W"], d["Q"], d["SW"], d["PL"], d["S"], d["DW"]),
            KCHK=rsc % c["BK"] != 0, MCHK=npq % c["BM"] != 0, NCHK=k % c["BN"] != 0,
            PAIRS=k % 2 == 0, EMULATE=emulated(), has_bias=bool(layer.attrs["bias"]),
            EPI=_epi(c))
        # the staged epilogue's pass: WM * 16 pixels of BN channels in 16-byte vectors (the
        # template reads these where EPI = 1 only)
        vecs = c["WM"] * 16 * c["BN"] // VEC
        d.update(ELD=_eld(c), E_ITERS=ceil_div(vecs, wg), ECHK=vecs % wg != 0,
                 SMEM=max((c["BM"] + c["BN"]) * _ld(c) * _stages(c), _epi_words(c)))
        return d

    def buffers(self, layer, cfg):
        """The packed weights: [K/BN tiles][K steps][BN][BK/2] words of two halves."""
        _, k, rsc = _dims(layer)
        return {"wpack": round_up(k, cfg["BN"]) * round_up(rsc, cfg["BK"]) // 2}

    def launches(self, layer, cfg, prefix):
        npq, k, rsc = _dims(layer)
        words = round_up(k, cfg["BN"]) * round_up(rsc, cfg["BK"]) // 2
        run_args = with_residual(layer, (In(0), Buffer("wpack"))
                                 + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(words, 64),), (64,), phase="setup"),
                Launch(prefix, run_args,
                       (ceil_div(npq, cfg["BM"]) * _wg(cfg), ceil_div(k, cfg["BN"])),
                       (_wg(cfg), 1))]

"""conv_mma_tf32_nhwc: channels-last implicit-GEMM convolution on NVIDIA's tensor cores for a
--precision tf32 build (mma.sync m16n8k8 .tf32, FP32 storage, FP32 accumulation), NHWC in and
out.

The GEMM is oriented as CUTLASS's NHWC fprop, as conv_mma_f16_nhwc's: Y[m][n] = sum_k X[m][k]
* W[k][n] with M = N*P*Q output pixels (the rows of A: activations gathered from the NHWC
input), N = K output channels (the columns of B: the weights) and the reduction k = (r, s, c)
over R*S*C, channels innermost (groups 1). With C % 4 == 0, four consecutive k are four
consecutive floats of one input pixel: one 16-byte load (float4) per 4 k, one (h, w) bounds
check per pixel and filter tap, where NCHW (conv_mma) gathers 4-byte loads with
(c, r, s) -> (h, w) arithmetic per element.

The fragments of mma.m16n8k8 .tf32 (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32;
g = lane >> 2, t = lane & 3): A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0
(t, g), b1 (t+4, g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1). These are the
32-bit word positions conv_mma_f16_nhwc reads for an m16n8k16 step (A at rows g, g + 8 and
word columns t, t + 4 of an 8-word step; B at row g, word columns t, t + 4), in the same
register order, so its local-memory layout (k-contiguous rows of LD = BK + PAD words), bank
analysis, cp.async stages (16 bytes: 4 floats), ldmatrix reads (.b16 pairs move 32-bit words)
and staged epilogue carry over word for word; a k-step is 8 floats here.

The weights are packed once, in set_params, tile-major and zero-padded to whole tiles, already
rounded to TF32. The activations reach local memory as stored (cp.async bypasses the
registers), and each A fragment word is rounded to TF32 (cvt.rna.tf32.f32: to nearest, ties
away from zero, as conv_mma and precision.round_tf32 round) when it is read for the mma. The
accumulator fragment c0, c1 is two consecutive output channels of one pixel: the direct
epilogue (EPI = 0) reads the bias and a fused residual as float2 and stores one float2; the
staged one (EPI = 1) stores whole pixels 4 channels a float4, reading the bias and the residual
likewise, with the same arithmetic per element (the same bits).

Each PTX body (the mma, cvt.rna, ldmatrix, cp.async) has an exact portable twin that PoCL runs
with AOTCONV_MMA_EMULATE=1 (conv_mma's test-only switch) or off NVIDIA: the same data movement
and the same rounding.

Domain: conv with groups 1 and C % 4 == 0, any kernel, stride, padding and dilation, NHWC in
and out, a fused residual add; FP32 storage, a tf32 build, on tensor cores (compute capability
8.0 or newer) or with the switch.
"""
from .base import Variant, Knob, Constraint, Launch, In, Out, Param, Buffer, ceil_div, \
    pow2_at_least, round_up
from .conv_common import conv_sizes, domain_reason, enough_work_groups
from .conv_igemm import needs_bounds
from .conv_mma import ACCUMULATORS_FIT, MIN_CC, WARP_TILES_WHOLE, _frags, _wg, emulated, \
    has_tensor_cores
from .limits import first_valid
from .residual import with_residual

VEC = 4                              # floats per float4: the unit of every global load
KSTEP = 8                            # floats (32-bit words) per mma k-step


def _dims(layer):
    """(M, N, reduction) of the GEMM: pixels, output channels, R*S*C."""
    n, k, p, q = layer.out_shape
    a = layer.attrs
    return n * p * q, k, layer.in_shape[1] * a["kernel"][0] * a["kernel"][1]


def _chunks(c):
    """float4 vectors per row of a step."""
    return c["BK"] // VEC


def _ld(c):
    """Words per local row: BK floats of data and PAD of padding."""
    return c["BK"] + c["PAD"]


def _stages(c):
    return c["CPASYNC"] or (2 if c["DBUF"] else 1)


def _work_groups(layer, c):
    m, n, _ = _dims(layer)
    return ceil_div(m, c["BM"]) * ceil_div(n, c["BN"])


def _ktiles(layer, c):
    return ceil_div(_dims(layer)[2], c["BK"])


def _covers(rows, c):
    """A tile of `rows` rows of BK/4 float4 is loaded by the work-group in whole rounds, each
    work-item keeping one chunk column (so its rows, and their bounds, are fixed)."""
    ch, wg = _chunks(c), _wg(c)
    return wg % ch == 0 and (rows * ch) % wg == 0


def _epi_words(c):
    """Local words of the staged epilogue: one pass, WM * 16 pixels of BN + 8 floats."""
    return c["WM"] * 16 * (c["BN"] + 8) if c["EPI"] else 0


def _smem_words(c):
    """Local words the kernel declares: the stages, or a pass of the staged epilogue."""
    return max((c["BM"] + c["BN"]) * _ld(c) * _stages(c), _epi_words(c))


_KNOBS = ("BM", "BN", "BK", "WM", "WN", "PAD", "DBUF", "CPASYNC", "LDSM", "EPI")


def _fallbacks(*rows):
    return [dict(zip(_KNOBS, r)) for r in rows]


# Preferred untuned points, big tiles first, none with the knobs the H100 has not measured
# (CPASYNC, LDSM, EPI); the last is valid for every layer of the domain (one warp on a 32 x 32
# tile is never oversized and its loads, 128 float4 of each tile per step, always cover the
# tiles).
_FALLBACKS = _fallbacks((128, 128, 16, 2, 2, 4, 1, 0, 0, 0), (128, 64, 16, 2, 2, 4, 1, 0, 0, 0),
                        (64, 64, 16, 2, 2, 4, 1, 0, 0, 0), (64, 64, 16, 2, 2, 4, 0, 0, 0, 0),
                        (64, 32, 16, 2, 1, 4, 0, 0, 0, 0), (32, 32, 16, 1, 1, 4, 0, 0, 0, 0))


class ConvMmaTf32Nhwc(Variant):
    name = "conv_mma_tf32_nhwc"
    ops = ("conv",)
    template = "kernels/conv_mma_tf32_nhwc.cl.mako"
    layouts = ("NHWC", "NHWC")
    precision = "tf32"           # TF32 products, FP32 accumulation (aotconv.precision)

    constraints = (
        Constraint("tensor_cores", "hardware",
                   "mma.sync m16n8k8 in TF32 needs an NVIDIA GPU of compute capability %d.%d "
                   "or newer (its tensor cores)" % MIN_CC,
                   lambda l, c, t: emulated() or has_tensor_cores(t)),
        WARP_TILES_WHOLE,
        Constraint("k_step_whole_mmas", "algorithm",
                   "a BK-deep step is whole 8-deep mma k-steps (BK a multiple of 8)",
                   lambda l, c, t: c["BK"] % KSTEP == 0),
        Constraint("a_load_covers_tile", "algorithm",
                   "the work-group loads the activation tile (BM pixels x BK/4 float4) in whole "
                   "rounds, each work-item at one fixed 4-channel chunk of its pixels: "
                   "BK/4 divides the work-group and the work-group divides the tile",
                   lambda l, c, t: _covers(c["BM"], c)),
        Constraint("b_load_covers_tile", "algorithm",
                   "the work-group loads the weight tile (BN channels x BK/4 float4) in whole "
                   "rounds, the same number per work-item, so the load needs no bounds check",
                   lambda l, c, t: _covers(c["BN"], c)),
        Constraint("one_pipeline", "algorithm",
                   "cp.async stages (CPASYNC) replace the register double buffer (DBUF): with "
                   "both, DBUF changes nothing and duplicates the point",
                   lambda l, c, t: not (c["CPASYNC"] and c["DBUF"])),
        Constraint("epilogue_whole_vectors", "algorithm",
                   "the staged epilogue (EPI = 1) stores, and reads the bias and residual, in "
                   "16-byte vectors of 4 channels of one pixel: K % 4 == 0 keeps every pixel's "
                   "channels on a 16-byte boundary (else the direct epilogue, EPI = 0)",
                   lambda l, c, t: not c["EPI"] or _dims(l)[1] % VEC == 0),
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above N*P*Q (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BM"] <= max(32, pow2_at_least(_dims(l)[0]))),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above K (floor 32) computes only "
                   "padding",
                   lambda l, c, t: c["BN"] <= max(32, pow2_at_least(_dims(l)[1]))),
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above R*S*C (floor 16, the smallest "
                   "step) multiplies zeros",
                   lambda l, c, t: c["BK"] <= max(16, pow2_at_least(_dims(l)[2]))),
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
                    f"the input channels in 16-byte vectors of {VEC} floats")
        return why

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("BM", (64, 128, 32), "tile in M (output pixels) per work-group"),
                Knob("BN", (64, 128, 32), "tile in N (output channels) per work-group"),
                Knob("BK", (16, 32), "reduction step (floats, (r, s, c) order) held in local "
                                     "memory: 2 or 4 mma k-steps"),
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
                                    "vectors (0: float2 stores from the fragments); unmeasured "
                                    "on hardware")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _FALLBACKS, lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: the stages of both tiles as a float4 array
        (smem4: SMEM / 4), SMEM the larger of the stages and a pass of the staged epilogue
        (EPI = 1), and where the mma is emulated its fragment exchange (192 words a warp) and
        ldmatrix's address exchange (32 a warp)."""
        c = cfg
        words = _smem_words(c)
        if emulated():
            words += c["WM"] * c["WN"] * (192 + (32 if c["LDSM"] else 0))
        return 4 * words

    def registers(self, layer, cfg):
        """Accumulators, one k-step's fragment words, the pixel state of the activation rows,
        the prefetched step (float4 each), ~24; the staged epilogue holds a bias chunk (4
        floats) through its passes."""
        c = cfg
        mi, ni = _frags(c)
        a_iters = c["BM"] * _chunks(c) // _wg(c)
        b_iters = c["BN"] * _chunks(c) // _wg(c)
        regs = 4 * mi * ni + 4 * mi + 2 * ni + 3 * a_iters + 24
        if c["DBUF"] and not c["CPASYNC"]:
            regs += 4 * (a_iters + b_iters)
        if c["EPI"]:
            regs += 4
        return regs

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        c = cfg
        npq, k, rsc = _dims(layer)
        mi, ni = _frags(c)
        wg, ch = _wg(c), _chunks(c)
        # the staged epilogue's pass: WM * 16 pixels of BN channels in float4 (the template
        # reads ELD, E_ITERS and ECHK where EPI = 1 only)
        vecs = c["WM"] * 16 * c["BN"] // VEC
        d.update(
            NPQ=npq, RSC=rsc, RSCP=round_up(rsc, c["BK"]), KTILES=_ktiles(layer, c),
            WG=wg, WARPS=c["WM"] * c["WN"], MI=mi, NI=ni,
            WTM=c["BM"] // c["WM"], WTN=c["BN"] // c["WN"], CH=ch, LD=_ld(c),
            NBUF=_stages(c), A_ITERS=c["BM"] * ch // wg, B_ITERS=c["BN"] * ch // wg,
            HCHK=needs_bounds(d["H"], d["P"], d["SH"], d["PT"], d["R"], d["DH"]),
            WCHK=needs_bounds(d["W"], d["Q"], d["SW"], d["PL"], d["S"], d["DW"]),
            KCHK=rsc % c["BK"] != 0, MCHK=npq % c["BM"] != 0, NCHK=k % c["BN"] != 0,
            PAIRS=k % 2 == 0, EMULATE=emulated(), has_bias=bool(layer.attrs["bias"]),
            ELD=c["BN"] + 8, E_ITERS=ceil_div(vecs, wg), ECHK=vecs % wg != 0,
            SMEM=_smem_words(c))
        return d

    def buffers(self, layer, cfg):
        """The packed weights: [K/BN tiles][K steps][BN][BK] floats rounded to TF32."""
        _, k, rsc = _dims(layer)
        return {"wpack": round_up(k, cfg["BN"]) * round_up(rsc, cfg["BK"])}

    def launches(self, layer, cfg, prefix):
        npq, k, rsc = _dims(layer)
        floats = round_up(k, cfg["BN"]) * round_up(rsc, cfg["BK"])
        run_args = with_residual(layer, (In(0), Buffer("wpack"))
                                 + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(floats, 64),), (64,), phase="setup"),
                Launch(prefix, run_args,
                       (ceil_div(npq, cfg["BM"]) * _wg(cfg), ceil_div(k, cfg["BN"])),
                       (_wg(cfg), 1))]

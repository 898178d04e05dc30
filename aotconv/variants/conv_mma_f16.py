"""conv_mma_f16: implicit-GEMM convolution on NVIDIA's tensor cores for half storage (mma.sync
m16n8k16 .f16, FP32 accumulation), the kernel of a --precision fp16 build's conv layers.

The GEMM is conv_mma's: Y[m][n] = sum_k W[m][k] * X[k][n], M = K output channels, N = batch *
P * Q output pixels, k = (c, r, s) over C * R * S (groups 1). In an fp16 build the weights are
halves already (set_params rounded them) and the input is stored in half, so the operands go
to the tensor cores as they are stored: `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`
multiplies two halves, exactly in FP32 (11 x 11 significant bits fit FP32's 24), and sums in
FP32. That is what an FP32 kernel computes on the same half operands, up to the order of the
sums: the fp16 precision's arithmetic (aotconv.precision: FP32 math on half storage), held to
its tolerance (protocol.half_allowance) unchanged, so the variant's `precision` is FP32 and it
is a sibling of conv_mma (TF32 products of FP32 storage) rather than a mode of it: conv_mma's
renders, hash and records stay what they are, and the two never share a record key.

NVIDIA's OpenCL has no cl_khr_fp16 arithmetic, so halves travel as their 16 bits: the input
is read as `ushort`, two halves consecutive in k are packed into one `uint` (the low half
first: the .f16x2 register of the PTX ISA) on their way to local memory, and the weights are
packed once, in set_params, into such words ([CRSP/2][MP], k-pair-major, zero-padded to whole
tiles: exact, they are halves already). As a network's first layer it may read the float
input instead (aotconv.layouts.fuse_casts), each pair rounded to half as it is packed
(cvt.rn.f16x2.f32), the word the cast it replaces would have stored. The local tiles hold these words: half the bytes of
conv_mma's float tiles for the same BK. The epilogue reads the bias and a fused residual with
vload_half, adds in FP32, applies the activation and stores with vstore_half_rte (the storage
helpers of templates/kernels/_common.mako), two outputs a vstore_half2_rte where P*Q is even.
EPI = 1 stages it instead (as conv_mma_f16_nhwc's, docs/variants/conv_mma_f16_nhwc.md): in MI
passes each warp writes 16 rows (channels) of its FP32 accumulators into local memory (one
array with the tiles), and the work-group stores 8 pixels of a channel plane a 16-byte vector
(P*Q % 8 == 0), reading the residual likewise; the same arithmetic per element, so the same
bits as EPI = 0.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .f16;
groupID g = lane >> 2, threadID_in_group t = lane & 3; each .f16x2 register holds two
elements, the lower-numbered one in its low 16 bits):
A (16 x 16, row)  a0,a1 (g, 2t..2t+1)    a2,a3 (g+8, 2t..2t+1)
                  a4,a5 (g, 2t+8..2t+9)  a6,a7 (g+8, 2t+8..2t+9)
B (16 x 8, col)   b0,b1 (2t..2t+1, g)    b2,b3 (2t+8..2t+9, g)
C, D (16 x 8)     c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)     (f32)
So every register pairs two consecutive k of one row of A or column of B: a local word
[k/2][m] (or [k/2][n]) is exactly one register, and a lane reads its fragments at word rows
t and t + 4 of a 16-deep step, columns g (+ 8), as conv_mma reads its TF32 ones.

The mma is a macro with two bodies, as conv_mma's: the inline PTX where the OpenCL compiler
is NVIDIA's, and elsewhere (or with AOTCONV_MMA_EMULATE=1, conv_mma's test-only switch) an
exact portable emulation: each warp exchanges its fragment words through local memory in the
ISA's layout and every lane computes its four outputs from the halves decoded exactly to float
(fma of two halves is their exact product, rounded once into the FP32 sum). The variant is
offered only where the tensor cores are (an NVIDIA device of compute capability 8.0 or newer,
or the switch) and only to a layer an fp16 build stores in half.

Domain: conv with groups 1, any kernel, stride, padding and dilation, NCHW in and out, a fused
residual add; half storage.
"""
from .base import Variant, Constraint, Knob, Launch, In, Out, Param, Buffer, ceil_div, \
    pow2_at_least, round_up
from .conv_common import domain_reason, enough_work_groups
from .conv_mma import ACCUMULATORS_FIT, MIN_CC, M_TILE_NOT_OVERSIZED, N_TILE_NOT_OVERSIZED, \
    WARP_TILES_WHOLE, _b_covers, _dims, _fallbacks, _wg, _work_groups, emulated, \
    has_tensor_cores, mma_knobs, mma_registers, mma_template_params
from .limits import first_valid
from .residual import with_residual
from ..precision import src_storage_of


def _half_layer(layer):
    from ..precision import storage_of
    return storage_of(layer) == "fp16"


# What every f16 tensor-core variant asks (conv_mma_f16 and its channels-last sibling): half
# operands, the tensor cores, whole warp tiles and whole 16-deep mma k-steps.
F16_MMA_CONSTRAINTS = (
    Constraint("storage_half", "algorithm",
               "the operands are the half values an fp16 build stores (weights rounded by "
               "set_params, activations stored in half); an FP32 or TF32 build rounds "
               "nothing to half",
               lambda l, c, t: _half_layer(l)),
    Constraint("tensor_cores", "hardware",
               "mma.sync m16n8k16 in f16 with FP32 accumulation needs an NVIDIA GPU of "
               "compute capability %d.%d or newer (its tensor cores)" % MIN_CC,
               lambda l, c, t: emulated() or has_tensor_cores(t)),
    WARP_TILES_WHOLE,
    Constraint("k_step_whole_mmas", "algorithm",
               "a BK-deep step is whole 16-deep mma k-steps (BK a multiple of 16)",
               lambda l, c, t: c["BK"] % 16 == 0),
)


# Preferred untuned points, big tiles first, the direct epilogue (EPI = 0: unmeasured on the
# H100); the last is valid for every layer of the domain (a 32 x 32 tile of one warp is never
# oversized, its loads always cover the tile).
_FALLBACKS = [dict(p, EPI=0) for p in _fallbacks(
    (128, 128, 32, 2, 2, 8, 1), (64, 128, 32, 2, 2, 8, 1), (64, 64, 32, 2, 2, 8, 1),
    (64, 64, 16, 2, 2, 8, 0), (32, 64, 16, 1, 2, 8, 0), (32, 32, 16, 1, 1, 8, 0))]

VEC = 8                              # halves per uint4: the staged epilogue's stores


def _epi(c):
    """EPI of a point; a point recorded before the knob existed ran the direct epilogue."""
    return c.get("EPI", 0)


def _tiles_words(c):
    """Local words of the NBUF weight and input tiles, as declared (whole uint4s)."""
    nbuf, kp = (2 if c["DBUF"] else 1), c["BK"] // 2
    a4 = nbuf * kp * (c["BM"] + c["PAD"]) // 4
    b4 = ceil_div(nbuf * kp * (c["BN"] + c["PAD"]), 4)
    return 4 * (a4 + b4)


def _epi_words(c):
    """Local words of one pass of the staged epilogue: WM * 16 channels of BN + 8 floats."""
    return c["WM"] * 16 * (c["BN"] + 8) if _epi(c) else 0


class ConvMmaF16(Variant):
    name = "conv_mma_f16"
    ops = ("conv",)
    template = "kernels/conv_mma_f16.cl.mako"
    includes = ("kernels/_mma_f16.mako",)
    half_storage = True          # reads and writes half; FP32 products and sums (the fp16 math)
    reads_float = True           # a network's float input, rounded to half as loaded
    added_knobs = (("EPI", 0),)  # a record made before EPI ran the direct epilogue

    constraints = (
        *F16_MMA_CONSTRAINTS,
        Constraint("a_load_covers_tile", "algorithm",
                   "the work-group loads the weight tile (BK/2 x BM words of two halves) in "
                   "uint4 vectors, the same number per work-item, so the load needs no bounds "
                   "check",
                   lambda l, c, t: (c["BK"] // 2 * c["BM"]) % (4 * _wg(c)) == 0),
        Constraint("b_load_covers_tile", "algorithm",
                   "each work-item loads fixed columns of the input tile (BK/2 rows of words "
                   "by BN), the same count each: the work-group size and the tile width must "
                   "divide",
                   lambda l, c, t: _b_covers(c, 2)),
        Constraint("epilogue_whole_vectors", "algorithm",
                   "the staged epilogue (EPI = 1) stores, and reads the residual, in 16-byte "
                   "vectors of 8 pixels of one channel plane: P*Q % 8 == 0 keeps every plane on "
                   "a 16-byte boundary and 8 pixels of a tile in one image (else the direct "
                   "epilogue, EPI = 0)",
                   lambda l, c, t: not _epi(c) or l.out_shape[2] * l.out_shape[3] % VEC == 0),
        M_TILE_NOT_OVERSIZED,
        N_TILE_NOT_OVERSIZED,
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above C*R*S (floor 16, one mma "
                   "k-step) multiplies zeros",
                   lambda l, c, t: c["BK"] <= max(16, pow2_at_least(_dims(l)[2]))),
        ACCUMULATORS_FIT,
        enough_work_groups(_work_groups),
    )

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        why = super().supports(layer) or domain_reason(self, layer, (
            ("groups", 1, "the tensor-core GEMM is one dense GEMM"),))
        if why is None and not _half_layer(layer):
            # an FP32 or TF32 build's layer: its spaces leave the variant out, with this reason
            return (f"{self.name} multiplies the half values a --precision fp16 build stores: "
                    f"only a build of --precision fp16 runs it")
        return why

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return mma_knobs((32, 16, 64), "reduction step (halves) held in local memory", "words") \
            + [Knob("EPI", (0, 1), "epilogue staged through local memory, stored in 16-byte "
                                   "vectors of 8 pixels (0: half2 stores from the fragments); "
                                   "unmeasured on hardware")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, _FALLBACKS, lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: the tiles hold words of two halves, NBUF weight
        tiles [BK/2][BM + PAD] and input tiles [BK/2][BN + PAD] as uint4 arrays (Abuf4:
        NBUF * A_SIZE / 4, Bbuf4 rounded up to whole uint4s), with EPI = 1 one array of the
        larger of those and a pass of the staged epilogue, and, where the mma is emulated, its
        fragment exchange (192 words a warp)."""
        c = cfg
        exchange = c["WM"] * c["WN"] * 192 if emulated() else 0
        return 4 * (max(_tiles_words(c), _epi_words(c)) + exchange)

    def registers(self, layer, cfg):
        return mma_registers(cfg, per_word=2)          # two halves of k in a word

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        c = cfg
        d = mma_template_params(layer, c, per_word=2)
        d["PAIRS"] = d["P"] * d["Q"] % 2 == 0
        d["FLOAT_IN"] = src_storage_of(layer) == "fp32"
        # the staged epilogue's pass: WM * 16 channels of BN pixels in 16-byte vectors (the
        # template reads these where EPI = 1 only)
        vecs, wg = c["WM"] * 16 * c["BN"] // VEC, d["WG"]
        d.update(EPI=_epi(c), ELD=c["BN"] + 8, E_ITERS=ceil_div(vecs, wg), ECHK=vecs % wg != 0,
                 SMEM=max(_tiles_words(c), _epi_words(c)))
        return d

    def buffers(self, layer, cfg):
        """The packed weights: words of two halves (4 bytes each, as a float's)."""
        m, _, crs = _dims(layer)
        return {"wpack": round_up(crs, cfg["BK"]) // 2 * round_up(m, cfg["BM"])}

    def launches(self, layer, cfg, prefix):
        m, npq, crs = _dims(layer)
        words = round_up(crs, cfg["BK"]) // 2 * round_up(m, cfg["BM"])
        run_args = with_residual(layer, (In(0), Buffer("wpack"))
                                 + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),))
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (round_up(words, 64),), (64,), phase="setup"),
                Launch(prefix, run_args,
                       (ceil_div(npq, cfg["BN"]) * _wg(cfg), ceil_div(m, cfg["BM"])),
                       (_wg(cfg), 1))]

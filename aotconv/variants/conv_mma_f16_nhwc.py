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

The space, geometry and launches are conv_mma_tf32_nhwc's too (aotconv.variants.mma_nhwc, with
the element HALF); this module holds what is the f16 variant's own.
"""
from .base import Knob
from .conv_common import enough_work_groups
from .conv_mma import ACCUMULATORS_FIT
from .conv_mma_f16 import F16_MMA_CONSTRAINTS, _half_layer
from .mma_nhwc import HALF, STAGES_NOT_OVERSIZED, MmaNhwc, epilogue_constraint, \
    fallback_points, load_constraints, tile_constraints, work_groups


class ConvMmaF16Nhwc(MmaNhwc):
    name = "conv_mma_f16_nhwc"
    template = "kernels/conv_mma_f16_nhwc.cl.mako"
    element = HALF               # 8 halves per uint4, two per word (an .f16x2 register)
    half_storage = True          # reads and writes half; FP32 products and sums (the fp16 math)
    added_knobs = (("EPI", 0),)  # a record made before EPI ran the direct epilogue

    constraints = (
        *F16_MMA_CONSTRAINTS,
        *load_constraints(HALF),
        *tile_constraints("one mma k-step"),
        epilogue_constraint(HALF),
        STAGES_NOT_OVERSIZED,
        ACCUMULATORS_FIT,
        enough_work_groups(work_groups),
    )

    bk = Knob("BK", (32, 16, 64), "reduction step (halves, (r, s, c) order) held in local "
                                  "memory")

    # Preferred untuned points, big tiles first, none with the knobs the H100 has not measured
    # (CPASYNC, LDSM, EPI); the last is valid for every layer of the domain (one warp on a
    # 32 x 32 tile is never oversized and its loads, 64 uint4 of each tile per step, always
    # cover the tiles).
    fallbacks = fallback_points(
        (128, 128, 32, 2, 2, 4, 1, 0, 0, 0), (128, 64, 32, 2, 2, 4, 1, 0, 0, 0),
        (64, 64, 32, 2, 2, 4, 1, 0, 0, 0), (64, 64, 16, 2, 2, 4, 0, 0, 0, 0),
        (64, 32, 16, 2, 1, 4, 0, 0, 0, 0), (32, 32, 16, 1, 1, 4, 0, 0, 0, 0))

    def supports(self, layer):
        why = super().supports(layer)
        if why is None and not _half_layer(layer):
            # an FP32 or TF32 build's layer: its spaces leave the variant out, with this reason
            return (f"{self.name} multiplies the half values a --precision fp16 build stores: "
                    f"only a build of --precision fp16 runs it")
        return why

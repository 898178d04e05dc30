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

The space, geometry and launches are conv_mma_f16_nhwc's (aotconv.variants.mma_nhwc, with the
element FLOAT); this module holds what is the TF32 variant's own.
"""
from .base import Constraint, Knob
from .conv_common import enough_work_groups
from .conv_mma import ACCUMULATORS_FIT, MIN_CC, WARP_TILES_WHOLE, emulated, has_tensor_cores
from .mma_nhwc import FLOAT, STAGES_NOT_OVERSIZED, MmaNhwc, epilogue_constraint, \
    fallback_points, load_constraints, tile_constraints, work_groups

KSTEP = 8                            # floats (32-bit words) per mma k-step


class ConvMmaTf32Nhwc(MmaNhwc):
    name = "conv_mma_tf32_nhwc"
    template = "kernels/conv_mma_tf32_nhwc.cl.mako"
    element = FLOAT              # 4 floats per float4, one per word
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
        *load_constraints(FLOAT),
        epilogue_constraint(FLOAT),
        *tile_constraints("the smallest step"),
        STAGES_NOT_OVERSIZED,
        ACCUMULATORS_FIT,
        enough_work_groups(work_groups),
    )

    bk = Knob("BK", (16, 32), "reduction step (floats, (r, s, c) order) held in local memory: "
                              "2 or 4 mma k-steps")

    # Preferred untuned points, big tiles first, none with the knobs the H100 has not measured
    # (CPASYNC, LDSM, EPI); the last is valid for every layer of the domain (one warp on a
    # 32 x 32 tile is never oversized and its loads, 128 float4 of each tile per step, always
    # cover the tiles).
    fallbacks = fallback_points(
        (128, 128, 16, 2, 2, 4, 1, 0, 0, 0), (128, 64, 16, 2, 2, 4, 1, 0, 0, 0),
        (64, 64, 16, 2, 2, 4, 1, 0, 0, 0), (64, 64, 16, 2, 2, 4, 0, 0, 0, 0),
        (64, 32, 16, 2, 1, 4, 0, 0, 0, 0), (32, 32, 16, 1, 1, 4, 0, 0, 0, 0))

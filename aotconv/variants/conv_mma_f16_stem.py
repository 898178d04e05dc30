"""conv_mma_f16_stem: a network's first convolutions (few input channels) on the tensor cores
for a --precision fp16 build, NCHW half input, channels-last (NHWC) half output.

The channels-last tensor-core variants load their operands 8 channels (16 bytes) at a time;
a convolution of 3 input channels (an RGB image) has no such vectors, so it ran on FP32
arithmetic (conv_tiled) although its output, 64 channels of every pixel at full resolution,
is among the largest tensors of the network: VGG-16's conv1_1 writes 103 MB at batch 16.
Here the GEMM is Y[m][n] = sum_k X[m][k] W[n][k] with M = the output pixels (batch, P, Q),
N = the K output channels and k = (c, r, s) over C*R*S padded to whole 16-deep steps (27 to
32 for a 3x3 over 3 channels, 147 to 160 for a 7x7): few steps, so the kernel is bound by the
output it stores, which it writes channels-last for the layers after it.

A work-group of WARPS warps takes WARPS x MT tiles of 16 consecutive output pixels; a warp
multiplies each of its MT tiles with all BN = 8 NT output channels of the work-group. The A
fragments are gathered per element from the NCHW input (lane (g, t) holds rows g and g + 8,
k = 2t, 2t + 1, 2t + 8, 2t + 9 of each step): the input offset and the tap (dy, dx) of each k
come from a table the work-group builds in local memory once (a k past C*R*S gets a tap that
fails every bound, so it reads zero), and a tap in the padding reads zero. Consecutive pixels
of a row are consecutive lanes' g, so a gather is one contiguous run of halves per k. The
weights are packed once, in set_params, into the B fragments themselves ([step][n-tile][lane]
two words of two halves, zeros past the layer): one 8-byte load per lane per n-tile and step.

As the first layer, it reads the network's input: in float where the library's input is float
(aotconv.layouts.fuse_casts), each gathered value rounded to half (to nearest even, what the
cast it replaces stores) as two are packed into an A register, so the cast's launch, its
write and its read are saved for one more read of the float input.

EPI = 0 stores each accumulator pair with bias and activation as two halves (4 bytes); EPI = 1
stages a warp's 16 x BN tile in local memory and stores 16-byte vectors of 8 channels, the
same arithmetic and rounding, so the same bits.

The mma is conv_mma_f16's (templates/kernels/_mma_f16.mako): the inline PTX where the OpenCL
compiler is NVIDIA's, an exact emulation elsewhere (AOTCONV_MMA_EMULATE=1, the tests' switch).
Domain: conv with groups 1, any kernel, stride, padding and dilation, C % 8 != 0 (the layers
no channels-last variant loads), K % 8 == 0, no fused residual; half storage, the input half
or float.
"""
from .base import Variant, Constraint, Knob, Launch, In, Out, Param, Buffer, bias_arg, \
    ceil_div, pow2_at_least
from .conv_common import conv_sizes, domain_reason, enough_work_groups
from .conv_mma import emulated
from .conv_mma_f16 import F16_MMA_CONSTRAINTS, _half_layer
from .limits import first_valid
from .residual import residual_reason
from ..precision import src_storage_of

VEC = 8                     # halves per 16-byte store (EPI = 1), and channels per n-tile


def _dims(layer):
    """(M: output pixels, N: output channels, k: C*R*S, KS: 16-deep steps)."""
    d = conv_sizes(layer)
    crs = d["C"] * d["R"] * d["S"]
    return d["BATCH"] * d["P"] * d["Q"], d["K"], crs, ceil_div(crs, 16)


def _bn(c):
    return 8 * c["NT"]


def _rows(c):
    """Output pixels per work-group: WARPS x MT tiles of 16."""
    return 16 * c["WARPS"] * c["MT"]


def _n_tiles(layer, c):
    """8-channel tiles of the packed weights: K padded to whole BN."""
    return ceil_div(layer.out_shape[1], _bn(c)) * c["NT"]


def _packed_words(layer, c):
    return _dims(layer)[3] * _n_tiles(layer, c) * 64


def work_groups(layer, c):
    m, n, _, _ = _dims(layer)
    return ceil_div(m, _rows(c)) * ceil_div(n, _bn(c))


def _stage_halves(c):
    """A warp's 16 x BN staged tile, rows 8 halves (16 bytes) longer against bank conflicts."""
    return 16 * (_bn(c) + VEC) if c["EPI"] else 0


class ConvMmaF16Stem(Variant):
    name = "conv_mma_f16_stem"
    ops = ("conv",)
    template = "kernels/conv_mma_f16_stem.cl.mako"
    includes = ("kernels/_mma_f16.mako",)
    layouts = ("NCHW", "NHWC")
    half_storage = True          # reads and writes half; FP32 products and sums (the fp16 math)
    reads_float = True           # the network's float input, rounded to half as gathered

    constraints = (
        F16_MMA_CONSTRAINTS[0],      # storage_half
        F16_MMA_CONSTRAINTS[1],      # tensor_cores
        Constraint("n_tile_not_oversized", "software",
                   "output channels per work-group beyond the next power of two above K "
                   "(floor 8) only compute padding",
                   lambda l, c, t: _bn(c) <= max(8, pow2_at_least(l.out_shape[1]))),
        Constraint("m_tile_not_oversized", "software",
                   "output pixels per work-group beyond the next power of two above the "
                   "layer's (floor 16) only compute padding",
                   lambda l, c, t: _rows(c) <= max(16, pow2_at_least(_dims(l)[0]))),
        enough_work_groups(work_groups),
    )

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        why = super().supports(layer) or domain_reason(self, layer, (
            ("groups", 1, "the tensor-core GEMM is one dense GEMM"),)) \
            or residual_reason(self, layer)
        if why:
            return why
        c, k = layer.in_shape[1], layer.out_shape[1]
        if not _half_layer(layer):
            return (f"{self.name} multiplies the half values a --precision fp16 build stores: "
                    f"only a build of --precision fp16 runs it")
        if c % 8 == 0:
            return (f"{self.name} takes the convolutions whose input channels the "
                    f"channels-last variants cannot load 8 at a time (C % 8 != 0), not "
                    f"C = {c}")
        if k % 8:
            return (f"{self.name} needs K % 8 == 0, not K = {k}: it stores a pixel's channels "
                    f"in pairs and 16-byte vectors of 8")
        return None

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("NT", (8, 4, 2, 1, 16), "tiles of 8 output channels per warp (BN = 8 NT)"),
                Knob("MT", (2, 1, 4), "tiles of 16 output pixels per warp"),
                Knob("WARPS", (4, 8, 2, 1), "warps per work-group"),
                Knob("EPI", (1, 0), "1: the output tile staged in local memory, stored in "
                                    "16-byte vectors; 0: stored in pairs of halves from the "
                                    "accumulators")]

    def fallback(self, layer, target):
        points = [dict(NT=nt, MT=mt, WARPS=w, EPI=0) for nt in (8, 4, 2, 1, 16)
                  for mt in (2, 1) for w in (4, 2, 8, 1)]
        return first_valid(self, layer, target, points, lambda c: work_groups(layer, c))

    def registers(self, layer, cfg):
        """MT x NT x 4 accumulators, NT x 2 weight and MT x 4 input words, 3 words of a row's
        position per pixel row (two a tile), ~24 for addresses and the rest."""
        mt, nt = cfg["MT"], cfg["NT"]
        return 4 * mt * nt + 2 * nt + 4 * mt + 6 * mt + 24

    def local_mem_bytes(self, layer, cfg):
        """The k table (three ints a k), the warps' staged tiles (EPI = 1) and where the mma
        is emulated its fragment exchange (192 words a warp)."""
        ks = _dims(layer)[3]
        words = 3 * 16 * ks + cfg["WARPS"] * _stage_halves(cfg) // 2
        return 4 * (words + (cfg["WARPS"] * 192 if emulated() else 0))

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        m, _, crs, ks = _dims(layer)
        d.update(M=m, CRS=crs, KS=ks, NPT=_n_tiles(layer, cfg), BN=_bn(cfg), ROWS=_rows(cfg),
                 WG=32 * cfg["WARPS"], STAGE=_stage_halves(cfg),
                 HAS_BIAS=bool(layer.attrs["bias"]), EMULATE=emulated(),
                 FLOAT_IN=src_storage_of(layer) == "fp32")
        return d

    def buffers(self, layer, cfg):
        """The B fragments: words of two halves (4 bytes each, as a float's)."""
        return {"wpack": _packed_words(layer, cfg)}

    def launches(self, layer, cfg, prefix):
        m, n, _, _ = _dims(layer)
        wg = 32 * cfg["WARPS"]
        words = _packed_words(layer, cfg)
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                       (ceil_div(words, 64) * 64,), (64,), phase="setup"),
                Launch(prefix, (In(0), Buffer("wpack")) + bias_arg(layer) + (Out(),),
                       (ceil_div(m, _rows(cfg)) * wg, ceil_div(n, _bn(cfg))), (wg, 1))]

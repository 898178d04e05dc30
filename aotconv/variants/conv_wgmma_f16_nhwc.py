"""conv_wgmma_f16_nhwc: channels-last implicit-GEMM convolution on Hopper's warpgroup tensor-core
instruction (wgmma.mma_async m64nNk16 .f16, FP32 accumulation) for a --precision fp16 build.

The GEMM, its loads and its epilogues are conv_mma_f16_nhwc's (aotconv.variants.mma_nhwc, the
template conv_mma_f16_nhwc.cl.mako rendered with WGMMA): M = N*P*Q output pixels, N = K output
channels, the reduction k = (r, s, c), every global load 16 bytes of 8 channels, through
CPASYNC cp.async stages or the register double buffer (DBUF). What differs is the multiply:

- A warpgroup (4 warps, 128 work-items) computes 64 rows (pixels) by WTN = BN / WN channels of
  the tile with one wgmma per INSN channels per 16-deep k-step. The tensor cores read both
  operands from local memory through matrix descriptors, so no fragment passes through
  registers: the instruction mma.sync needs 2 x MI x NI ldmatrix-fed registers per k-step for.
- The stages hold the tiles as the descriptors' core matrices (8 rows x 16 bytes, contiguous;
  no swizzle): chunk j of rows 8i.. at byte 128 (i * CH + j); the leading (k) byte offset of
  the descriptors is 128, the stride (8-row) offset CH * 128. PAD and LDSM are fixed at 0: the
  layout needs no padding, and nothing is read by ldmatrix.
- With cp.async, each step: its group waited for, `fence.proxy.async` (the copies, made by the
  generic proxy, visible to the tensor cores' async proxy), the work-group barrier, then
  wgmma.fence, the step's wgmmas, commit and a wait until at most WAIT groups are in flight,
  a second barrier, and the refill of the stage the previous step read. With the register
  double buffer, the next step is loaded into registers while the step's wgmmas run and
  stored into the other stage before the wait (docs/variants/conv_wgmma_f16_nhwc.md).
- Warp w of a warpgroup holds rows 16 (w % 4) .. + 15 of its 64 as the accumulator fragments of
  NI = WTN / 8 mma.sync tiles (the wgmma's D layout is m16n8's, repeated), so both epilogues
  are conv_mma_f16_nhwc's with one 16-row tile per warp (MI = 1, WM = 4 warps per warpgroup
  along M).

wgmma is sm_90a code, which NVIDIA's OpenCL does not compile (it targets sm_90): the kernel's
sm_90a lines are PTX comments behind a marker that aotconv.ptx uncomments in the compiled PTX,
retargeted to sm_90a and built as the program's binary; the source refuses to build without
that step (an #error), so no path runs it with its multiplies commented out. The library
embeds that PTX (or the cubin ptxas makes of it for sm_90a).

The portable body (PoCL, or AOTCONV_MMA_EMULATE=1) computes each lane's accumulators from the
halves its descriptors locate in local memory (start address, leading and stride offsets
decoded as the hardware does), exact products summed in FP32 in k order: the tests check the
layout, the descriptors and the epilogue's fragment mapping on the CPU.

Domain: conv_mma_f16_nhwc's (groups 1, C % 8 == 0, NHWC in and out, a fused residual add, half
storage), on a device of compute capability 9.0 exactly (sm_90a code runs there alone) or with
the switch.
"""
from .base import Constraint, Knob
from .conv_common import enough_work_groups
from .conv_mma import ACCUMULATORS_FIT, emulated, has_tensor_cores
from .conv_mma_f16 import F16_MMA_CONSTRAINTS
from .conv_mma_f16_nhwc import ConvMmaF16Nhwc
from .mma_nhwc import HALF, STAGES_NOT_OVERSIZED, epilogue_constraint, load_constraints, \
    tile_constraints, work_groups

SM90A = (9, 0)                       # sm_90a: Hopper (H100, H200, GH200) alone


def has_wgmma(target):
    """An NVIDIA device of compute capability 9.0 (the profile's, or the live device's)."""
    return has_tensor_cores(target) and tuple(target.compute_capability) == SM90A


def _wtn(c):
    """Channels of one warpgroup's part of the tile."""
    return c["BN"] // c["WN"]


class ConvWgmmaF16Nhwc(ConvMmaF16Nhwc):
    name = "conv_wgmma_f16_nhwc"
    added_knobs = ()

    constraints = (
        F16_MMA_CONSTRAINTS[0],                                         # storage_half
        Constraint("wgmma", "hardware",
                   "wgmma.mma_async is sm_90a code: it runs on an NVIDIA GPU of compute "
                   "capability 9.0 (Hopper) alone",
                   lambda l, c, t: emulated() or has_wgmma(t)),
        Constraint("warpgroup_rows", "algorithm",
                   "a warpgroup (4 warps along M) computes 64 rows: BM = 16 WM, WM a multiple "
                   "of 4",
                   lambda l, c, t: c["WM"] % 4 == 0 and c["BM"] == 16 * c["WM"]),
        Constraint("instructions_cover_warpgroup", "algorithm",
                   "a warpgroup's BN / WN channels are whole wgmmas of INSN channels",
                   lambda l, c, t: c["BN"] % c["WN"] == 0 and _wtn(c) % c["INSN"] == 0),
        Constraint("k_step_whole_wgmmas", "algorithm",
                   "a BK-deep step is whole 16-deep wgmma k-steps (BK a multiple of 16)",
                   lambda l, c, t: c["BK"] % 16 == 0),
        *load_constraints(HALF),
        Constraint("pipelined", "algorithm",
                   "the stages are filled by cp.async (CPASYNC) or through the registers "
                   "(DBUF): one of the two",
                   lambda l, c, t: bool(c["CPASYNC"]) or bool(c["DBUF"])),
        Constraint("wait_with_cpasync", "algorithm",
                   "WAIT = 1 keeps a step's wgmmas in flight through the cp.async refill; the "
                   "register double buffer waits for every step's (WAIT = 0)",
                   lambda l, c, t: bool(c["CPASYNC"]) or c["WAIT"] == 0),
        *tile_constraints("one wgmma k-step"),
        epilogue_constraint(HALF),
        STAGES_NOT_OVERSIZED,
        ACCUMULATORS_FIT,
        enough_work_groups(work_groups),
    )

    bk = Knob("BK", (32, 64, 16), "reduction step (halves, (r, s, c) order) held in local "
                                  "memory")

    def knobs(self, layer, target):
        return [Knob("BM", (128, 64, 256), "tile in M (output pixels) per work-group: 64 per "
                                           "warpgroup along M"),
                Knob("BN", (128, 64, 256, 32), "tile in N (output channels) per work-group"),
                self.bk,
                Knob("WM", (8, 4, 16), "warps along M (4 per warpgroup)"),
                Knob("WN", (1, 2), "warpgroups along N"),
                Knob("PAD", (0,), "no padding: the core matrices are contiguous"),
                Knob("DBUF", (1, 0), "register double buffer: load step k+1 into registers "
                                     "while the tensor cores multiply step k"),
                Knob("CPASYNC", (0, 3, 4, 2), "local stages filled by cp.async (0: the "
                                              "register double buffer)"),
                Knob("LDSM", (0,), "no ldmatrix: the tensor cores read local memory"),
                Knob("INSN", (128, 64, 256, 32), "channels per wgmma (its N)"),
                Knob("WAIT", (1, 0), "wgmma groups left in flight through a step's refill "
                                     "(1: the tensor cores work on step k while step k - 1's "
                                     "stage is refilled)"),
                Knob("EPI", (0, 1), "epilogue staged through local memory, stored in 16-byte "
                                    "vectors (0: half2 stores from the fragments)")]

    # Preferred untuned points: two warpgroups on 128 x 128, then one on 64 x 128, 64 x 64 and
    # 64 x 32 (whose loads cover its tiles with BK 32: 256 and 128 chunks for 128 work-items).
    fallbacks = [dict(BM=bm, BN=bn, BK=bk, WM=wm, WN=1, PAD=0, DBUF=0, CPASYNC=st, LDSM=0,
                      INSN=ins, WAIT=1, EPI=0)
                 for bm, bn, bk, wm, st, ins in ((128, 128, 32, 8, 3, 128),
                                                 (64, 128, 32, 4, 3, 128),
                                                 (64, 64, 32, 4, 3, 64),
                                                 (64, 32, 32, 4, 2, 32))]

    def registers(self, layer, cfg):
        """Accumulators (WTN / 2: no fragment passes through registers), the pixel state of the
        activation rows, ~24; the staged epilogue holds a bias chunk (8 floats)."""
        c = cfg
        wg = 32 * c["WM"] * c["WN"]
        a_iters = c["BM"] * HALF.chunks(c) // wg
        regs = _wtn(c) // 2 + 3 * a_iters + 24 + (HALF.vec if c["EPI"] else 0)
        if c["DBUF"]:                                   # the next step: a uint4 per load
            regs += 4 * (a_iters + c["BN"] * HALF.chunks(c) // wg)
        return regs

    def template_params(self, layer, cfg):
        d = super().template_params(layer, cfg)
        d.update(WGMMA=True, INSN=cfg["INSN"], WAIT=cfg["WAIT"])
        return d

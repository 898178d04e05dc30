"""dense_mma_f16: dense layers of an fp16 build at small batch on the tensor cores (mma.sync
m16n8k16 .f16, FP32 accumulation), every weight read once, straight from its row.

    y[b][o] = act(bias[o] + sum_k x[b][k] * W[o][k])     M = batch, N = OUT, K = C*H*W

A classifier at batch 16 reads each weight once and multiplies it with 16 inputs: bound by
the weights' bytes (VGG-16's fc6: 205 MB of halves), it needs 16 multiply-adds per half
loaded, which FP32 arithmetic on every work-item cannot issue at the memory's rate; one
m16n8k16 mma does 2048 of them. The weight W[OUT][K] is already the mma's B operand in
column order (its rows are the columns of B, k contiguous), so the kernel reads it in place:
no packed copy, nothing done in set_params.

A warp owns NT tiles of 8 output rows. Per 32-deep chunk of k every lane loads one 16-byte
vector (8 halves) of a weight row, lane (g, t) row g at k offset 8t, and the two 16-byte
vectors of the input rows g and g + 8 at the same offset: 8 rows x 64 contiguous bytes per
load instruction. The sum over k does not depend on its order, so the chunk is fed to the
mma as two 16-deep steps whose k are a permutation of the chunk's, the same for A and B: in
step j, the words 2j and 2j + 1 of a lane's vectors are the fragment registers the PTX ISA
gives lane (g, t) for k = 2t, 2t+1 and 2t+8, 2t+9 (B: b0 = word 2j, b1 = word 2j + 1; A: a0,
a2 = words 2j, 2j + 1 of row g, a1, a3 those of row g + 8). So every fragment comes from a
vector load, with no shuffle and no local memory.

The WARPS warps of a work-group take turns over the chunks of its K slice (chunk i to warp
i % WARPS, U chunks in flight per warp), then sum their accumulators in local memory and store
with bias and activation fused; KSPLIT > 1 slices K over work-groups too, writing partial sums
that a second launch adds (dense_gemv's reduce). Batch rows are tiles of 16 (MT of them, one
set of weight vectors for all): a row past the batch reads the last real row and is never
stored, a weight row past OUT likewise; a chunk past K (K % 32) reads zeros.

The mma is conv_mma_f16's (templates/kernels/_mma_f16.mako): the inline PTX where the OpenCL
compiler is NVIDIA's, an exact emulation elsewhere (AOTCONV_MMA_EMULATE=1, the tests' switch).
Domain: dense layers and convolutions equal to one (dense_gemv.dense_reason) of an fp16 build,
K % 8 == 0 (16-byte aligned rows), batch up to 64.
"""
from .base import Variant, Knob, Constraint, ceil_div, pow2_at_least
from .conv_mma import emulated
from .conv_mma_f16 import F16_MMA_CONSTRAINTS, _half_layer
from .dense_gemv import dense_dims, dense_reason, split_k_launches, split_k_scratch
from .limits import first_valid

MAX_BATCH = 64          # 4 tiles of 16 batch rows held in registers against one weight load
CHUNK = 32              # k per chunk: 4 lanes x 8 halves of one weight row


def _chunks(layer, c):
    """(chunks of K, chunks per K slice)."""
    ch = ceil_div(dense_dims(layer)["K"], CHUNK)
    return ch, ceil_div(ch, c["KSPLIT"])


def _mt(layer):
    return ceil_div(dense_dims(layer)["N"], 16)


def _row_groups(layer, c):
    return ceil_div(dense_dims(layer)["OUT"], 8 * c["NT"])


class DenseMmaF16(Variant):
    name = "dense_mma_f16"
    ops = ("dense", "conv")
    template = "kernels/dense_mma_f16.cl.mako"
    includes = ("kernels/_mma_f16.mako", "kernels/_dense.mako")
    half_storage = True          # reads and writes half; FP32 products and sums (the fp16 math)
    scratch = True

    constraints = (
        F16_MMA_CONSTRAINTS[0],      # storage_half
        F16_MMA_CONSTRAINTS[1],      # tensor_cores
        Constraint("rows_not_oversized", "software",
                   "a warp's 8*NT weight rows beyond the next power of two above OUT only "
                   "re-read the last row",
                   lambda l, c, t: 8 * c["NT"] <= max(8, pow2_at_least(dense_dims(l)["OUT"]))),
        Constraint("warps_have_chunks", "software",
                   "a K slice of fewer 32-deep chunks than WARPS * U leaves warps, or their "
                   "loads in flight, without work",
                   lambda l, c, t: c["WARPS"] * c["U"] <= max(1, _chunks(l, c)[1])
                   or (c["KSPLIT"] == 1 and c["WARPS"] == 1 and c["U"] == 1)),
        Constraint("slices_not_empty", "software",
                   "more K slices than the chunks fill leave the last ones only zeros to add",
                   lambda l, c, t: _chunks(l, c)[1] * (c["KSPLIT"] - 1) < _chunks(l, c)[0]),
        Constraint("split_only_if_underfilled", "hardware",
                   "split-K pays its partial sums and a second launch only when the row groups "
                   "alone are fewer than four work-groups per compute unit",
                   lambda l, c, t: c["KSPLIT"] == 1 or
                   _row_groups(l, c) < 4 * t.compute_units * max(1, t.min_wg_per_cu)),
    )

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        why = dense_reason(layer)
        if why:
            return f"{self.name} {why}"
        d = dense_dims(layer)
        if not _half_layer(layer):
            return (f"{self.name} multiplies the half values a --precision fp16 build stores: "
                    f"only a build of --precision fp16 runs it")
        if d["K"] % 8:
            return (f"{self.name} needs K = C*H*W % 8 == 0, not {d['K']}: it reads weight and "
                    f"input rows in 16-byte vectors of 8 halves")
        if d["N"] > MAX_BATCH:
            return (f"batch {d['N']} > {MAX_BATCH}: the batch rows are held in registers "
                    f"against each weight load; a tiled GEMM (dense_gemm) takes larger batches")
        return None

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("NT", (2, 4, 1), "tiles of 8 output rows per warp (the input vectors "
                                      "shared by NT weight tiles)"),
                Knob("WARPS", (8, 4, 2, 1, 16), "warps per work-group, taking turns over the "
                                             "chunks of its K slice"),
                Knob("U", (2, 4, 1, 8), "32-deep chunks whose loads a warp issues before it "
                                     "multiplies"),
                Knob("KSPLIT", (1, 2, 4, 8, 16), "K slices over work-groups; > 1 writes "
                                                 "partial sums and adds a reduction launch")]

    def fallback(self, layer, target):
        points = [dict(NT=nt, WARPS=w, U=u, KSPLIT=ks) for ks in (1, 2, 4, 8, 16)
                  for nt in (2, 1, 4) for w in (8, 4, 2, 1) for u in (2, 1)]
        return first_valid(self, layer, target, points,
                           lambda c: _row_groups(layer, c) * c["KSPLIT"])

    def registers(self, layer, cfg):
        """MT x NT x 4 accumulators, U chunks of NT weight and 2 MT input vectors of 4 words,
        ~24 for addresses and the rest."""
        mt, nt, u = _mt(layer), cfg["NT"], cfg["U"]
        return 4 * mt * nt + 4 * u * (nt + 2 * mt) + 24

    def local_mem_bytes(self, layer, cfg):
        """The warps' accumulators, summed across the work-group ([WARPS][MT*NT*4][32] floats),
        and where the mma is emulated its fragment exchange (192 words a warp)."""
        c = cfg
        acc = c["WARPS"] * _mt(layer) * c["NT"] * 4 * 32
        return 4 * (acc + (c["WARPS"] * 192 if emulated() else 0))

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        d = dense_dims(layer)
        ch, per_slice = _chunks(layer, cfg)
        d.update(MT=_mt(layer), CH=ch, KSC=per_slice,
                 ITERS=ceil_div(per_slice, cfg["WARPS"] * cfg["U"]),
                 KCHK=d["K"] % CHUNK != 0 or per_slice * cfg["KSPLIT"] != ch
                 or per_slice % (cfg["WARPS"] * cfg["U"]) != 0,
                 HAS_BIAS=bool(layer.attrs["bias"]), EMULATE=emulated())
        return d

    def scratch_floats(self, layer, cfg):
        return split_k_scratch(layer, cfg)

    def launches(self, layer, cfg, prefix):
        wg = 32 * cfg["WARPS"]
        return split_k_launches(layer, cfg, f"{prefix}_mma",
                                (_row_groups(layer, cfg) * wg, cfg["KSPLIT"]), (wg, 1), prefix)

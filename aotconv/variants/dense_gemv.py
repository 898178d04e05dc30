"""Dense layers at small batch as a bandwidth-bound GEMV: every weight is read exactly once, with
wide vector loads, by enough work-groups to fill the device (Boda: fully-connected layers deserve
their own variant; Rovder 4.2.4: xGEMV beats xGEMM at batch 1).

    y[b][o] = act(bias[o] + sum_k W[o][k] * x[b][k]),   k over C*H*W of the input

Also takes convolutions that are dense layers in disguise (the kernel covers the whole,
unpadded input: output 1x1, e.g. a 6x6 filter over a 6x6 input, or 1x1 over 1x1): their weight
[out, C, kh, kw] is [out, C*H*W] in its natural layout and the input flattens in the same
(C, H, W) order, so no re-layout is needed.

A work-group owns R output rows and one of KSPLIT slices of K: its work-items stride over the
slice with VW-wide loads, U independent loads in flight each, then reduce in local memory.
KSPLIT > 1 writes partial sums to scratch and a second small launch adds them with bias and act
(for layers with too few rows to fill the device: split-K).
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, Scratch, ceil_div,
                   pow2_at_least, round_up)
from .limits import first_valid
from ..graph import count

MAX_BATCH = 16


def dense_reason(layer):
    """None when `layer` is a dense layer or a convolution equal to one, else why not."""
    if layer.op == "dense":
        return None
    if layer.op != "conv":
        return f"implements dense (and convolutions that are dense layers), not {layer.op}"
    a = layer.attrs
    if a.get("residual"):
        return "takes no residual input in its epilogue (a conv with an add fused in)"
    _, _, h, w = layer.in_shape
    (kh, kw), (dh, dw) = a["kernel"], a["dilation"]
    if a["groups"] != 1:
        return "a grouped convolution is not one dense layer"
    if any(a["pad"]):
        return "a padded convolution weights padding zeros: not a dense layer over the input"
    if (kh, kw) != (h, w):
        return (f"the kernel {kh}x{kw} does not cover the whole {h}x{w} input, so the output is "
                f"not 1x1")
    if (kh > 1 and dh != 1) or (kw > 1 and dw != 1):
        return "a dilated kernel larger than 1 does not cover the input densely"
    return None


def dense_dims(layer):
    n = layer.in_shape[0]
    return dict(N=n, K=count(layer.in_shape[1:]), OUT=layer.out_shape[1])


def split_k_scratch(layer, cfg):
    """Floats of the KSPLIT partial sums [KSPLIT][N][OUT] (none without a split)."""
    d = dense_dims(layer)
    return cfg["KSPLIT"] * d["N"] * d["OUT"] if cfg["KSPLIT"] > 1 else 0


def split_k_launches(layer, cfg, kernel, gsize, lsize, prefix):
    """The launches of a dense kernel reading x and the weight as given: `kernel` writes the
    output with bias and act (KSPLIT 1), or its partial sums to scratch and `<prefix>_reduce`
    (templates/kernels/_dense.mako) adds them with bias and act."""
    d = dense_dims(layer)
    bias = (Param("bias"),) if layer.attrs["bias"] else ()
    if cfg["KSPLIT"] == 1:
        return [Launch(kernel, (In(0), Param("weight")) + bias + (Out(),), gsize, lsize)]
    return [Launch(kernel, (In(0), Param("weight"), Scratch()), gsize, lsize),
            Launch(f"{prefix}_reduce", (Scratch(),) + bias + (Out(),),
                   (round_up(d["OUT"], 64), d["N"]), (64, 1))]


def _slice(layer, cfg):
    d = dense_dims(layer)
    return ceil_div(d["K"] // cfg["VW"], cfg["KSPLIT"])          # vectors per K slice


class DenseGemv(Variant):
    name = "dense_gemv"
    ops = ("dense", "conv")
    template = "kernels/dense_gemv.cl.mako"
    includes = ("kernels/_dense.mako",)
    half_storage = True
    scratch = True
    constraints = (
        Constraint("vw_divides_k", "algorithm",
                   "rows start VW-aligned only if VW divides K; then W and x are read as "
                   "aligned floatVW vectors",
                   lambda l, c, t: dense_dims(l)["K"] % c["VW"] == 0),
        Constraint("outputs_fit_group", "algorithm",
                   "the R x N results of a work-group are written by its first R*N work-items",
                   lambda l, c, t: c["R"] * dense_dims(l)["N"] <= c["WG"]),
        Constraint("rows_not_oversized", "software",
                   "more rows per work-group than the layer has only reads the last row again",
                   lambda l, c, t: c["R"] <= max(1, pow2_at_least(dense_dims(l)["OUT"]))),
        Constraint("wg_not_idle", "software",
                   "more work-items than vectors in a K slice leave work-items idle",
                   lambda l, c, t: c["WG"] <= max(t.simd_width, pow2_at_least(_slice(l, c)))),
        Constraint("split_slices_full", "software",
                   "a K slice shorter than WG*U loads leaves the split with nothing to gain",
                   lambda l, c, t: c["KSPLIT"] == 1 or _slice(l, c) >= c["WG"] * c["U"]),
        Constraint("whole_warps", "hardware",
                   "a work-group that is not a whole number of SIMD groups leaves lanes idle",
                   lambda l, c, t: c["WG"] % t.simd_width == 0),
        Constraint("split_only_if_underfilled", "hardware",
                   "split-K pays its second launch only when the row groups alone are fewer than "
                   "four work-groups per compute unit",
                   lambda l, c, t: c["KSPLIT"] == 1 or
                   ceil_div(dense_dims(l)["OUT"], c["R"]) < 4 * t.compute_units * max(1, t.min_wg_per_cu)),
    )

    def supports(self, layer):
        why = dense_reason(layer)
        if why:
            return f"{self.name} {why}"
        if layer.in_shape[0] > MAX_BATCH:
            return (f"batch {layer.in_shape[0]} > {MAX_BATCH}: every weight is reused that often, "
                    f"a tiled GEMM (dense_gemm) is the right algorithm")
        return None

    def knobs(self, layer, target):
        return [Knob("WG", (256, 128, 64, 512, 32), "work-items per work-group (power of two)"),
                Knob("R", (1, 2, 4, 8), "output rows per work-group (x loads shared by R rows)"),
                Knob("VW", (4, 2, 1), "vector width of the weight and input loads"),
                Knob("U", (2, 1, 4), "independent vector loads in flight per work-item"),
                Knob("KSPLIT", (1, 2, 4, 8, 16, 32), "K slices (split-K); > 1 adds a reduction launch")]

    def fallback(self, layer, target):
        """The first valid point, in order of preference, whose grid gives every compute unit
        a work-group (splitting K if the rows alone do not); else the largest valid grid."""
        points = [dict(WG=wg, R=r, VW=vw, U=u, KSPLIT=ks) for ks in (1, 2, 4, 8, 16, 32)
                  for wg in (256, 128, 64, 32) for vw in (4, 2, 1) for r in (2, 1) for u in (2, 1)]
        out = dense_dims(layer)["OUT"]
        return first_valid(self, layer, target, points,
                           lambda c: ceil_div(out, c["R"]) * c["KSPLIT"])

    def registers(self, layer, cfg):
        """R*N accumulators, U*VW*(R+N) loaded values, R row pointers, ~16 for the rest."""
        n = dense_dims(layer)["N"]
        return cfg["R"] * n + cfg["U"] * cfg["VW"] * (cfg["R"] + n) + 2 * cfg["R"] + 16

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["R"] * dense_dims(layer)["N"] * cfg["WG"]

    def template_params(self, layer, cfg):
        d = dense_dims(layer)
        d.update(KV=d["K"] // cfg["VW"], KS=_slice(layer, cfg), HAS_BIAS=bool(layer.attrs["bias"]),
                 realV="float" if cfg["VW"] == 1 else f"float{cfg['VW']}")
        return d

    def scratch_floats(self, layer, cfg):
        return split_k_scratch(layer, cfg)

    def launches(self, layer, cfg, prefix):
        groups = ceil_div(dense_dims(layer)["OUT"], cfg["R"])
        return split_k_launches(layer, cfg, f"{prefix}_gemv", (groups * cfg["WG"], cfg["KSPLIT"]),
                                (cfg["WG"], 1), prefix)

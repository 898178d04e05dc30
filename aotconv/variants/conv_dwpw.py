"""conv_dwpw: a depthwise convolution fused into the pointwise (1x1) convolution after it.

The op conv_dwpw (passes.fuse_dwpw) is a pointwise conv whose input a depthwise conv computes
from the layer's input: y = act(W * act_dw(dwconv(x) + b_dw) + b [+ residual]). At batch 1
both halves of a MobileNet block are a few microseconds each, so one launch instead of two
is what pays (aotconv.launch_cost), and the depthwise output never goes through memory.

A work-group computes a tile of TP output pixels (the pixels of all images in a row, image
by image) x TK output channels. It walks the C input channels in steps of CB: (a) its
work-items compute the CB x TP depthwise outputs of the step (the KH x KW taps read from
global memory, guarded only where the padding or an edge can be reached, decided at
generation time; bias, act) into local memory, (b) they stage the TK x CB pointwise weights
(read along C, contiguous), (c) after a barrier each work-item adds the step's products to
its RK channels x RP consecutive pixels in registers. After the last step: bias, residual,
act, and the stores, RP-wide vectors where the pixels of an image are whole vectors. A
work-group recomputes the depthwise outputs of its pixels for each of the K / TK tiles of
output channels: KH * KW multiply-adds against the TK each depthwise output feeds, which is
cheap where TK is not tiny.

Domain: every conv_dwpw (any depthwise kernel, stride, pad, dilation, bias, act; the
pointwise conv's bias, act and residual; any batch), FP32 storage only: an fp16 build leaves
the pair unfused (aotconv.fusion). NCHW in and out, which at batch 1 is CHWN's storage too, so
the layout planner needs no conversion next to a CHWN neighbour there (layouts.same_storage).
FLOPs: the unfused pair's (ops.flops); bytes: the input, the parameters and the output once.
"""
from .base import (Variant, Knob, Constraint, Launch, In, Out, Param, ceil_div, pow2_at_least)
from .conv_common import enough_work_groups, not_oversized, whole_simd_groups
from .limits import first_valid
from .residual import with_residual
from ..ops import split_conv_dwpw

# Above this many taps the depthwise window stays a loop over its rows.
MAX_UNROLLED_TAPS = 49
# A work-item keeps the window offsets of its depthwise outputs of a step in registers.
MAX_DW_PER_ITEM = 16


def _sizes(layer):
    dw, _ = split_conv_dwpw(layer.attrs)
    n, c, h, w = layer.in_shape
    _, k, p, q = layer.out_shape
    (r, s), (sh, sw), (dh, dwd) = dw["kernel"], dw["stride"], dw["dilation"]
    pt, pl, _, _ = dw["pad"]
    return dict(BATCH=n, C=c, H=h, W=w, K=k, P=p, Q=q, PQ=p * q, NPQ=n * p * q, R=r, S=s,
                SH=sh, SW=sw, DH=dh, DW=dwd, PT=pt, PL=pl)


def _wg(c):
    # at least 1, so that the constraints after rp_divides_tp and rk_divides_tk may read it
    # on a point those reject (aotconv space --exact judges every constraint on every point)
    return max(1, c["TP"] // c["RP"] * (c["TK"] // c["RK"]))


def _dw_iters(c):
    return ceil_div(c["CB"] * c["TP"], _wg(c))


def _work_groups(layer, c):
    d = _sizes(layer)
    return ceil_div(d["NPQ"], c["TP"]) * ceil_div(d["K"], c["TK"])


def _guards(d):
    """(rows, columns) of the depthwise window that may fall into the padding or past the
    edge for some output pixel."""
    rows = [r * d["DH"] - d["PT"] < 0 or (d["P"] - 1) * d["SH"] - d["PT"] + r * d["DH"] > d["H"] - 1
            for r in range(d["R"])]
    cols = [s * d["DW"] - d["PL"] < 0 or (d["Q"] - 1) * d["SW"] - d["PL"] + s * d["DW"] > d["W"] - 1
            for s in range(d["S"])]
    return rows, cols


def _points(*rows):
    return [dict(zip(("TP", "TK", "RP", "RK", "CB"), r)) for r in rows]


# Preferred fallback points; the last of each is valid for every layer on every target
# (work-groups of 64, the oversize floors, one depthwise output per work-item and step).
_FALLBACKS = {
    "gpu": _points((64, 16, 4, 4, 16), (32, 16, 2, 4, 16), (16, 16, 1, 4, 8), (16, 4, 1, 1, 4)),
    "cpu": _points((32, 16, 8, 8, 16), (16, 8, 4, 4, 8), (16, 4, 1, 1, 4)),
}


class ConvDwpw(Variant):
    name = "conv_dwpw"
    ops = ("conv_dwpw",)
    template = "kernels/conv_dwpw.cl.mako"

    constraints = (
        Constraint("rp_divides_tp", "algorithm",
                   "a work-group's TP pixels are whole blocks of RP, one block per work-item",
                   lambda l, c, t: c["TP"] % c["RP"] == 0),
        Constraint("rk_divides_tk", "algorithm",
                   "a work-group's TK channels are RK per work-item",
                   lambda l, c, t: c["TK"] % c["RK"] == 0),
        not_oversized("tp_not_oversized",
                      "pixels per work-group beyond the next power of two above N*P*Q (floor "
                      "16) only compute padding",
                      lambda c: c["TP"], lambda l: _sizes(l)["NPQ"], 16),
        not_oversized("tk_not_oversized",
                      "channels per work-group beyond the next power of two above K (floor 4) "
                      "only compute padding",
                      lambda c: c["TK"], lambda l: l.out_shape[1], 4),
        not_oversized("cb_not_oversized",
                      "a step beyond the next power of two above C (floor 4) computes zeros",
                      lambda c: c["CB"], lambda l: l.in_shape[1], 4),
        Constraint("dw_share_fits", "software",
                   f"a work-item computes at most {MAX_DW_PER_ITEM} depthwise outputs per step "
                   f"(CB * TP / work-items): it keeps each one's window offset in registers",
                   lambda l, c, t: _dw_iters(c) <= MAX_DW_PER_ITEM),
        whole_simd_groups(_wg),
        enough_work_groups(_work_groups),
    )

    def supports(self, layer):
        why = super().supports(layer)
        if why is None and layer.attrs.get("storage", "fp32") != "fp32":
            why = (f"{self.name} stores FP32 only (an fp16 build leaves the depthwise conv "
                   f"and the pointwise conv unfused)")
        return why

    def knobs(self, layer, target):
        return [Knob("TP", (64, 32, 16, 128, 256), "output pixels per work-group"),
                Knob("TK", (16, 32, 8, 4, 64), "output channels per work-group"),
                Knob("RP", (4, 2, 1, 8), "consecutive pixels per work-item (vector width)"),
                Knob("RK", (4, 2, 1, 8), "output channels per work-item"),
                Knob("CB", (16, 8, 4, 32), "input channels per step")]

    def fallback(self, layer, target):
        # a step no deeper than the channels (to the next power of two, floor 4)
        cb = max(4, pow2_at_least(layer.in_shape[1]))
        points = [dict(p, CB=min(p["CB"], cb))
                  for p in _FALLBACKS["gpu" if target.kind == "gpu" else "cpu"]]
        return first_valid(self, layer, target, points, lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: Dl[CB * TP] and Wl[CB * (TK + 1)] floats."""
        return 4 * cfg["CB"] * (cfg["TP"] + cfg["TK"] + 1)

    def registers(self, layer, cfg):
        """RK x RP accumulators, one step's RP depthwise outputs and RK weights, the window
        offsets of the work-item's depthwise outputs (and their rows and columns where
        guarded), about 24 for indices and pointers."""
        rows, cols = _guards(_sizes(layer))
        offsets = _dw_iters(cfg) * (3 if any(rows) or any(cols) else 1)
        return cfg["RK"] * cfg["RP"] + cfg["RP"] + cfg["RK"] + offsets + 24

    def template_params(self, layer, cfg):
        d = _sizes(layer)
        dw, _ = split_conv_dwpw(layer.attrs)
        wg, cb, tp, tk = _wg(cfg), cfg["CB"], cfg["TP"], cfg["TK"]
        rows, cols = _guards(d)
        d.update(dw=dw, dw_bias=bool(dw["bias"]), has_bias=bool(layer.attrs["bias"]),
                 TPW=tp // cfg["RP"], TKW=tk // cfg["RK"], LDW=tk + 1,
                 CSTEPS=ceil_div(d["C"], cb), DW_ITERS=ceil_div(cb * tp, wg),
                 DW_REM=cb * tp % wg, W_ITERS=ceil_div(cb * tk, wg), W_REM=cb * tk % wg,
                 GUARD_ROW=rows, GUARD_COL=cols, GUARDED=any(rows) or any(cols),
                 UNROLL=d["R"] * d["S"] <= MAX_UNROLLED_TAPS,
                 PCHK=d["NPQ"] % tp != 0, KCHK=d["K"] % tk != 0, CCHK=d["C"] % cb != 0,
                 VEC=cfg["RP"] > 1 and d["PQ"] % cfg["RP"] == 0)
        return d

    def launches(self, layer, cfg, prefix):
        d = _sizes(layer)
        dw, _ = split_conv_dwpw(layer.attrs)
        args = (In(), Param("dw_weight")) + ((Param("dw_bias"),) if dw["bias"] else ()) + \
            (Param("weight"),) + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),)
        tpw, tkw = cfg["TP"] // cfg["RP"], cfg["TK"] // cfg["RK"]
        gsize = (ceil_div(d["NPQ"], cfg["TP"]) * tpw, ceil_div(d["K"], cfg["TK"]) * tkw)
        return [Launch(prefix, with_residual(layer, args), gsize, (tpw, tkw))]

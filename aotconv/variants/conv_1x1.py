"""conv_1x1: a 1x1, stride-1, unpadded convolution as a GEMM (Boda's k1conv).

Such a convolution is exactly, per group, Y[m][n] = sum_c Wg[m][c] * X[c][n] with the pixels of
all images as N (n = image * H*W + pixel): no window, no padding, and the input read as it is
stored, so both operands stream from memory contiguously (the pixels of a channel are
consecutive in NCHW). A work-group of MB x NB work-items stages a KB-deep slice of the weights
(M x KB, user layout, no re-layout) and of the input (KB x N, VW-wide vector loads) in local
memory; each work-item accumulates MT x NT outputs in registers, its NT columns as NT/VW
vectors of VW consecutive pixels, stored as vectors. Bounds checks appear only where the
layer's sizes leave a partial tile (decided at generation time).

Domain: 1x1 kernels with stride 1 and no padding, any dilation (it has no effect on a 1x1
kernel) and any groups; NCHW in and out.
"""
from .base import Variant, Knob, Constraint, Launch, ceil_div
from .conv_common import (conv_sizes, domain_reason, enough_work_groups, not_oversized,
                          thread_dims, vw_divides, whole_simd_groups)
from .flat import conv_args
from .limits import first_valid
from .residual import with_residual


def _dims(layer):
    """(M, N, reduction) of one group's GEMM."""
    n, k, p, q = layer.out_shape
    g = layer.attrs["groups"]
    return k // g, n * p * q, layer.in_shape[1] // g


def _tile(c):
    return c["MT"] * c["MB"], c["NT"] * c["NB"]


def _wg(c):
    return c["MB"] * c["NB"]


def _work_groups(layer, c):
    m, n, _ = _dims(layer)
    mblk, nblk = _tile(c)
    return ceil_div(m, mblk) * ceil_div(n, nblk) * layer.attrs["groups"]


def _fallbacks(*rows):
    return [dict(zip(("MT", "NT", "MB", "NB", "KB", "VW"), r)) for r in rows]


# Preferred fallback points; the last of each list is valid for every supported layer.
_FALLBACKS = {
    "gpu": _fallbacks((4, 8, 16, 16, 16, 4), (4, 4, 16, 16, 16, 4), (4, 4, 16, 16, 16, 1),
                      (2, 4, 8, 16, 16, 4), (2, 4, 8, 16, 16, 1), (4, 2, 16, 8, 16, 2),
                      (4, 2, 16, 8, 16, 1), (2, 2, 8, 8, 8, 2), (2, 2, 8, 8, 8, 1),
                      (1, 1, 8, 8, 4, 1)),
    "cpu": _fallbacks((8, 8, 2, 2, 16, 4), (4, 8, 2, 2, 16, 4), (4, 4, 2, 2, 8, 4),
                      (4, 4, 2, 2, 8, 2), (4, 4, 2, 2, 8, 1), (4, 4, 1, 1, 4, 1)),
}


class Conv1x1(Variant):
    name = "conv_1x1"
    ops = ("conv",)
    template = "kernels/conv_1x1.cl.mako"
    half_storage = True

    constraints = (
        vw_divides("NT", "a work-item's NT columns are whole VW-wide vectors"),
        Constraint("vectors_stay_in_image", "algorithm",
                   "a VW-wide load or store must not straddle two images: H*W % VW == 0",
                   lambda l, c, t: (l.out_shape[2] * l.out_shape[3]) % c["VW"] == 0),
        not_oversized("m_tile_not_oversized",
                      "a tile beyond the next power of two above K/G (floor 8) computes padding",
                      lambda c: _tile(c)[0], lambda l: _dims(l)[0], 8),
        not_oversized("n_tile_not_oversized",
                      "a tile beyond the next power of two above N*H*W (floor 8) computes "
                      "padding",
                      lambda c: _tile(c)[1], lambda l: _dims(l)[1], 8),
        not_oversized("kb_not_oversized",
                      "a step beyond the next power of two above C/G (floor 4) multiplies zeros",
                      lambda c: c["KB"], lambda l: _dims(l)[2], 4),
        Constraint("accumulators_fit", "software",
                   "more than 128 accumulators per work-item spill on every compiler we target",
                   lambda l, c, t: c["MT"] * c["NT"] <= 128),
        whole_simd_groups(_wg),
        enough_work_groups(_work_groups),
    )

    def supports(self, layer):
        return super().supports(layer) or domain_reason(self, layer, (
            ("kernel", (1, 1)),
            ("stride", (1, 1), "a strided 1x1 conv reads a subsampled input that is not a plain "
                               "matrix"),
            ("pad", 0)))

    def knobs(self, layer, target):
        return [Knob("MT", (4, 8, 2, 1), "outputs per work-item along M (register block)"),
                Knob("NT", (4, 8, 2, 1), "outputs per work-item along N (register block)"),
                Knob("MB", thread_dims(target), "work-items along M (thread block)"),
                Knob("NB", thread_dims(target), "work-items along N (thread block)"),
                Knob("KB", (16, 8, 32, 4), "input channels per local-memory step (unrolled)"),
                Knob("VW", (4, 2, 1), "vector width of input loads, local reads and stores")]

    def fallback(self, layer, target):
        return first_valid(self, layer, target,
                           _FALLBACKS["gpu" if target.kind == "gpu" else "cpu"],
                           lambda c: _work_groups(layer, c))

    def local_mem_bytes(self, layer, cfg):
        """Exactly what the template declares: Al[KB * LDA] floats (LDA = MBLK + 1) and
        Bl4[KB * LDB / VW] VW-wide vectors (LDB = NBLK)."""
        mblk, nblk = _tile(cfg)
        kb, vw = cfg["KB"], cfg["VW"]
        return 4 * kb * (mblk + 1) + 4 * vw * (kb * nblk // vw)

    def registers(self, layer, cfg):
        """Accumulators, one k-slice of operands, load offsets, ~20 of state."""
        mblk, nblk = _tile(cfg)
        loads = ceil_div(mblk * cfg["KB"], _wg(cfg)) + ceil_div(nblk * cfg["KB"] // cfg["VW"], _wg(cfg))
        return cfg["MT"] * cfg["NT"] + cfg["MT"] + cfg["NT"] + loads + 20

    def template_params(self, layer, cfg):
        d = conv_sizes(layer)
        m, n, red = _dims(layer)
        mblk, nblk = _tile(cfg)
        wg = _wg(cfg)
        # loads per step; when the work-group does not divide them only the last is guarded
        a_loads, b_loads = mblk * cfg["KB"], nblk // cfg["VW"] * cfg["KB"]
        d.update(NHW=n, HW=d["H"] * d["W"], MBLK=mblk, NBLK=nblk, LDA=mblk + 1, LDB=nblk,
                 MTILES=ceil_div(m, mblk), KSTEPS=ceil_div(red, cfg["KB"]),
                 A_ITERS=ceil_div(a_loads, wg), A_REM=a_loads % wg,
                 B_ITERS=ceil_div(b_loads, wg), B_REM=b_loads % wg,
                 MCHK=m % mblk != 0, NCHK=n % nblk != 0, KCHK=red % cfg["KB"] != 0,
                 has_bias=bool(layer.attrs["bias"]))
        return d

    def launches(self, layer, cfg, prefix):
        m, n, _ = _dims(layer)
        mblk, nblk = _tile(cfg)
        args = with_residual(layer, conv_args(layer))
        gsize = (ceil_div(n, nblk) * cfg["NB"], ceil_div(m, mblk) * layer.attrs["groups"] * cfg["MB"])
        return [Launch(prefix, args, gsize, (cfg["NB"], cfg["MB"]))]

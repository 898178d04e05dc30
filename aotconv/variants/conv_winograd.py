"""Winograd F(MxM, 3x3) convolution (Lavin & Gray), M = 2 or 4, for 3x3 stride-1 undilated
ungrouped convolutions with any padding and batch.

With alpha = M + 2 and T = N * ceil(P/M) * ceil(Q/M) output tiles:

    setup (once, set_params):  U[xi][nu][c][k] = (G g[k][c] G^T)[xi][nu]     (variant buffer "u")
    run 1  input transform:    V[xi][nu][c][t] = (B^T d[c][t] B)[xi][nu]     (scratch)
    run 2  alpha^2 GEMMs:      Mo[xi][nu][k][t] = sum_c U[xi][nu][c][k] V[xi][nu][c][t]
                               (the tiled SGEMM core, one batch per (xi, nu); scratch)
    run 3  output transform:   y tile = act(A^T Mo[k][t] A + bias[k]), cropped to P x Q

F(2x2) does 2.25x fewer multiplies than direct convolution, F(4x4) 4x, at the cost of larger
rounding error (measured in docs/variants/conv_winograd.md) and of transform traffic. The
transforms are unrolled at render time from the exact matrices below with zero terms dropped.
"""
from fractions import Fraction as F

from .base import Knob, Constraint, Launch, In, Out, Param, Buffer, Scratch, bias_arg, \
    ceil_div, round_up
from .residual import residual_reason
from . import gemm_tiles as gt
from .conv_common import domain_reason

# (G, B^T, A^T) of F(m x m, 3 x 3), interpolation points 0, +-1 (, +-2), infinity.
MATRICES = {
    2: ([[1, 0, 0], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)], [0, 0, 1]],
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[F(1, 4), 0, 0], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [0, 0, 1]],
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def lincomb(coeffs, names):
    """'a - b + 0.5f * c' for sum(coeffs[i] * names[i]), zero terms dropped, +-1 without a
    multiply; '0.0f' when every coefficient is zero."""
    out = []
    for k, n in zip(coeffs, names):
        k = F(k)
        if k == 0:
            continue
        sign = "-" if k < 0 else "+"
        mag = abs(k)
        lit = f"{float(mag):.9g}"
        lit += "" if any(ch in lit for ch in ".e") else ".0"
        term = n if mag == 1 else f"{lit}f * {n}"
        out.append((sign, term))
    if not out:
        return "0.0f"
    s = ("-" if out[0][0] == "-" else "") + out[0][1]
    for sign, term in out[1:]:
        s += f" {sign} {term}"
    return s


def transforms(m):
    """C statements of the three transforms, as lists of (lhs, rhs) strings."""
    g, bt, at = MATRICES[m]
    a = m + 2

    def sandwich(left, src, right, mid, dst, n_in):
        # dst[i][j] = sum_k right[j][k] * (sum_l left[i][l] * src[l][k])
        rows_l, cols_r = len(left), len(right)
        first = [(f"{mid}{i}{k}", lincomb(left[i], [f"{src}{l}{k}" for l in range(n_in)]))
                 for i in range(rows_l) for k in range(n_in)]
        second = [(f"{dst}{i}{j}", lincomb(right[j], [f"{mid}{i}{k}" for k in range(n_in)]))
                  for i in range(rows_l) for j in range(cols_r)]
        return first, second

    return dict(
        filt=sandwich(g, "g", g, "gt", "u", 3),       # U = G g G^T
        inp=sandwich(bt, "d", bt, "bt", "v", a),     # V = B^T d B
        out=sandwich(at, "o", at, "at", "r", a),     # Y = A^T Mo A
    )


def _static(layer):
    n, c, h, w = layer.in_shape
    _, out, p, q = layer.out_shape
    a = layer.attrs
    return dict(N=n, C=c, H=h, W=w, OUT=out, P=p, Q=q, PT=a["pad"][0], PL=a["pad"][1])


def _point(d, c):
    m = c["M"]
    d.update(M=m, A=m + 2, TH=ceil_div(d["P"], m), TW=ceil_div(d["Q"], m))
    d["T"] = d["N"] * d["TH"] * d["TW"]
    d["KP"] = round_up(d["OUT"], c["MWG"])
    d["CP"] = round_up(d["C"], c["KWG"])
    d["TP"] = round_up(d["T"], c["NWG"])
    d["AA"] = d["A"] * d["A"]
    d["MO0"] = d["AA"] * d["CP"] * d["TP"]           # scratch offset of Mo, after V
    d["GEMM"] = d["OUT"], d["T"], d["C"]
    d["TILES"] = d["AA"] * (d["KP"] // c["MWG"]) * (d["TP"] // c["NWG"])
    d["PACKED"] = d["AA"] * d["CP"] * d["KP"]
    d["SCRATCH"] = d["MO0"] + d["AA"] * d["KP"] * d["TP"]
    return d


_dims = gt.dims_of("conv_winograd", _static, _point)


# F(4x4)'s error grows with C (about C^0.4): measured 6e-5 at C = 512 and 3.0e-4 at C = 16384
# against float64 (random N(0, 1/fan_in) weights, N(0, 1) or post-ReLU inputs; docs/variants/
# conv_winograd.md), a third of the 1e-3 tolerance. Beyond the measured range we do not vouch.
F4_MAX_C = 16384


class ConvWinograd(gt.GemmVariant):
    name = "conv_winograd"
    ops = ("conv",)
    template = "kernels/conv_winograd.cl.mako"
    half_storage = True
    dims = staticmethod(_dims)
    packed = "u"
    constraints = gt.gemm_constraints(_dims) + (
        Constraint("f4_accuracy", "algorithm",
                   f"F(4x4,3x3) rounding error grows with the reduction length C; it is measured "
                   f"within the 1e-3 tolerance (3e-4) only up to C = {F4_MAX_C}",
                   lambda l, c, t: c["M"] == 2 or l.in_shape[1] <= F4_MAX_C),
        Constraint("tile_fits_output", "software",
                   "an output tile larger than the output computes mostly cropped values",
                   lambda l, c, t: c["M"] == 2 or c["M"] <= max(l.out_shape[2], l.out_shape[3])),
    )

    def supports(self, layer):
        return super().supports(layer) or domain_reason(self, layer, (
            ("kernel", (3, 3), "Winograd F(m, 3x3)"),
            ("stride", (1, 1), "Winograd tiles"),
            ("dilation", (1, 1), "Winograd tiles"),
            ("groups", 1, "this Winograd variant implements ungrouped convolutions only"),
        )) or residual_reason(self, layer)

    def knobs(self, layer, target):
        return [Knob("M", (2, 4), "output tile M x M: F(2x2,3x3) or F(4x4,3x3)")] + \
            list(gt.GEMM_KNOBS)

    def fallback(self, layer, target):
        return gt.first_valid(self, layer, target, [dict(M=2)],
                              lambda l, c: _dims(l, c)["TILES"])

    def template_params(self, layer, cfg):
        d = super().template_params(layer, cfg)
        d["TF"] = transforms(cfg["M"])
        return d

    def launches(self, layer, cfg, prefix):
        d = _dims(layer, cfg)
        bias = bias_arg(layer)
        gg, gl = gt.launch_geometry(cfg, d["KP"], d["TP"], d["AA"])
        return [
            Launch(f"{prefix}_filter", (Param("weight"), Buffer("u")),
                   (d["KP"], d["CP"]), (16, 8), phase="setup"),
            Launch(f"{prefix}_input", (In(0), Scratch()), (round_up(d["TP"], 64), d["CP"]),
                   (64, 1)),
            Launch(f"{prefix}_gemm", (Buffer("u"), Scratch()), gg, gl),
            Launch(f"{prefix}_output", (Scratch(),) + bias + (Out(),),
                   (round_up(d["T"], 64), d["OUT"]), (64, 1)),
        ]

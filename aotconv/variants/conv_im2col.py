"""Convolution as im2col into the shared scratch buffer + the tiled SGEMM core, bias and the
activation fused into the GEMM epilogue (Rovder, Section 7.3; CLBlast's im2col + xgemm).

Per group g and chunk of IMGS images, with K = C/groups * kh * kw and columns (image, p, q):

    col[g][k][n]   = x[n0 + n / PQ][g*CG + k / (KH*KW)][h(p, i)][w(q, j)]   (0 in the padding)
    y[.][g*OG + m] = act(bias + sum_k wpack[g][k][m] * col[g][k][n])

The weights are packed once in set_params (transposed to k-major, zero-padded to whole tiles:
a variant-owned buffer). All groups are one batched launch (NDRange dimension 2). KSPLIT > 1
splits K over more work-groups for layers whose tile grid underfills the device (deep layers at
batch 1); partial tiles then go to scratch and a small launch sums them with bias and act.
"""
from .base import Knob, Constraint, Launch, In, Out, Param, Buffer, Scratch, Arg, bias_arg, \
    ceil_div, round_up
from .residual import with_residual
from . import gemm_tiles as gt


def _static(layer):
    n, c, h, w = layer.in_shape
    a = layer.attrs
    g = a["groups"]
    kh, kw = a["kernel"]
    _, out, p, q = layer.out_shape
    return dict(N=n, C=c, H=h, W=w, OUT=out, P=p, Q=q, G=g, CG=c // g, OG=out // g, KH=kh, KW=kw,
                SH=a["stride"][0], SW=a["stride"][1], DH=a["dilation"][0], DW=a["dilation"][1],
                PT=a["pad"][0], PL=a["pad"][1], PQ=p * q, KDIM=c // g * kh * kw)


def _point(d, c):
    ks = c["KSPLIT"]
    d["KSPLIT"], d["IMGS"] = ks, c["IMGS"]
    d["KCH"] = round_up(ceil_div(d["KDIM"], ks), c["KWG"])          # K per split, padded
    d["KP"] = ks * d["KCH"]
    d["MP"] = round_up(d["OG"], c["MWG"])
    d["NCOLS"] = c["IMGS"] * d["PQ"]
    d["NCP"] = round_up(d["NCOLS"], c["NWG"])
    d["CHUNKS"] = d["N"] // c["IMGS"]
    d["PART0"] = d["G"] * d["KP"] * d["NCP"]                         # partials follow col
    d["GEMM"] = d["OG"], d["NCOLS"], ceil_div(d["KDIM"], ks)
    d["TILES"] = d["G"] * (d["MP"] // c["MWG"]) * (d["NCP"] // c["NWG"])
    d["PACKED"] = d["G"] * d["KP"] * d["MP"]
    d["SCRATCH"] = d["PART0"] + (d["G"] * ks * d["MP"] * d["NCP"] if ks > 1 else 0)
    return d


_dims = gt.dims_of("conv_im2col", _static, _point)


def _imgs_values(n):
    """Images per pass: the whole batch, or chunks of about a quarter and an eighth of it
    (divisors of N, at most 8 passes): bigger GEMMs against less scratch."""
    vals = {n}
    for parts in (4, 8):
        d = max(d for d in range(1, max(1, n // parts) + 1) if n % d == 0)
        if n // d <= 8:
            vals.add(d)
    return tuple(sorted(vals, reverse=True))


class ConvIm2col(gt.GemmVariant):
    """Every conv: any stride, pad, dilation and group count."""
    name = "conv_im2col"
    ops = ("conv",)
    template = "kernels/conv_im2col.cl.mako"
    half_storage = True
    dims = staticmethod(_dims)
    constraints = gt.gemm_constraints(_dims) + (
        Constraint("imgs_divide_batch", "algorithm",
                   "every chunk of images is the same GEMM, so IMGS must divide the batch",
                   lambda l, c, t: l.in_shape[0] % c["IMGS"] == 0),
    ) + gt.split_k_constraints(lambda l: _dims(l)["KDIM"], _dims)

    def knobs(self, layer, target):
        return list(gt.GEMM_KNOBS) + [
            Knob("KSPLIT", (1, 2, 4, 8), "K slices computed by separate work-groups, then summed"),
            Knob("IMGS", _imgs_values(layer.in_shape[0]), "images per im2col + GEMM pass "
                 "(bounds the scratch size)"),
        ]

    def fallback(self, layer, target):
        return gt.first_valid(self, layer, target,
                              [dict(KSPLIT=k, IMGS=v) for v in _imgs_values(layer.in_shape[0])
                               for k in (1, 2, 4, 8)],
                              lambda l, c: _dims(l, c)["TILES"] * c["KSPLIT"])

    def template_params(self, layer, cfg):
        d = super().template_params(layer, cfg)
        d["VEC_STORE"] = cfg["VWN"] > 1 and d["PQ"] % cfg["VWN"] == 0
        return d

    def launches(self, layer, cfg, prefix):
        d = _dims(layer, cfg)
        bias = bias_arg(layer)
        out = [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wpack")),
                      (d["MP"], d["KP"], d["G"]), (16, 8, 1), phase="setup")]
        gg, gl = gt.launch_geometry(cfg, d["MP"], d["NCP"], d["G"] * d["KSPLIT"])
        for chunk in range(d["CHUNKS"]):
            n0 = Arg("int", value=chunk * d["IMGS"])
            out.append(Launch(f"{prefix}_im2col", (In(0), Scratch(), n0),
                              (round_up(d["NCP"], 64), d["KP"], d["G"]), (64, 1, 1)))
            if d["KSPLIT"] == 1:
                out.append(Launch(f"{prefix}_gemm", with_residual(
                    layer, (Buffer("wpack"), Scratch()) + bias + (Out(), n0)), gg, gl))
            else:
                out.append(Launch(f"{prefix}_gemm", (Buffer("wpack"), Scratch()), gg, gl))
                out.append(Launch(f"{prefix}_reduce",
                                  with_residual(layer, (Scratch(),) + bias + (Out(), n0)),
                                  (round_up(d["NCOLS"], 64), d["OG"], d["G"]), (64, 1, 1)))
        return out

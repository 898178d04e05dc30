"""Dense layers at large batch (e.g. AlexNet fc6 at N = 128) as a tiled SGEMM, and convolutions
that are dense layers in disguise (see dense_gemv.dense_reason).

    y[b][o] = act(bias[o] + sum_k x[b][k] * W[o][k])     GEMM M = batch, N = OUT, K = C*H*W

The weight is transposed and zero-padded once in set_params into a variant buffer wpack[KP][NP];
each run transposes the (small) input into scratch xpack[KP][MP] with a local-memory tile
transpose, then runs the SGEMM core (gemm_tiles) with bias and act fused into its epilogue.
Output columns are the OUT rows of W, so the stores are coalesced along y's contiguous axis.
KSPLIT > 1 splits K for layers whose tile grid underfills the device (few batch rows x OUT);
partial tiles go to scratch and a small launch sums them with bias and act.
"""
from .base import Knob, Launch, In, Out, Param, Buffer, Scratch, bias_arg, \
    ceil_div, round_up
from . import gemm_tiles as gt
from .dense_gemv import dense_reason, dense_dims

TT = 8      # tile of the transpose launches (64 work-items: below any GEMM work-group)


def _point(d, c):
    ks = c["KSPLIT"]
    d["KSPLIT"] = ks
    d["MP"] = round_up(d["N"], c["MWG"])
    d["NP"] = round_up(d["OUT"], c["NWG"])
    d["KCH"] = round_up(ceil_div(d["K"], ks), c["KWG"])
    d["KP"] = ks * d["KCH"]
    d["PART0"] = d["KP"] * d["MP"]
    d["GEMM"] = d["N"], d["OUT"], ceil_div(d["K"], ks)
    d["TILES"] = (d["MP"] // c["MWG"]) * (d["NP"] // c["NWG"])
    d["PACKED"] = d["KP"] * d["NP"]
    d["SCRATCH"] = d["PART0"] + (ks * d["MP"] * d["NP"] if ks > 1 else 0)
    return d


_dims = gt.dims_of("dense_gemm", dense_dims, _point)


class DenseGemm(gt.GemmVariant):
    name = "dense_gemm"
    ops = ("dense", "conv")
    template = "kernels/dense_gemm.cl.mako"
    half_storage = True
    dims = staticmethod(_dims)
    constraints = gt.gemm_constraints(_dims) + gt.split_k_constraints(
        lambda l: _dims(l)["K"], _dims)

    def supports(self, layer):
        why = dense_reason(layer)
        return f"{self.name} {why}" if why else None

    def knobs(self, layer, target):
        return list(gt.GEMM_KNOBS) + [
            Knob("KSPLIT", (1, 2, 4, 8, 16), "K slices computed by separate work-groups, then summed")]

    def fallback(self, layer, target):
        return gt.first_valid(self, layer, target, [dict(KSPLIT=k) for k in (1, 2, 4, 8, 16)],
                              lambda l, c: _dims(l, c)["TILES"] * c["KSPLIT"])

    def local_mem_bytes(self, layer, cfg):
        return max(gt.local_mem_bytes(cfg), 4 * TT * (TT + 1))

    def template_params(self, layer, cfg):
        d = super().template_params(layer, cfg)
        d["VEC_STORE"] = cfg["VWN"] > 1 and d["OUT"] % cfg["VWN"] == 0
        d["TT"] = TT
        return d

    def launches(self, layer, cfg, prefix):
        d = _dims(layer, cfg)
        bias = bias_arg(layer)
        tr = (TT, TT)
        out = [Launch(f"{prefix}_pack_w", (Param("weight"), Buffer("wpack")),
                      (round_up(d["KP"], TT), d["NP"]), tr, phase="setup"),
               Launch(f"{prefix}_pack_x", (In(0), Scratch()),
                      (round_up(d["KP"], TT), d["MP"]), tr)]
        gg, gl = gt.launch_geometry(cfg, d["MP"], d["NP"], d["KSPLIT"])
        if d["KSPLIT"] == 1:
            out.append(Launch(f"{prefix}_gemm", (Scratch(), Buffer("wpack")) + bias + (Out(),), gg, gl))
        else:
            out.append(Launch(f"{prefix}_gemm", (Scratch(), Buffer("wpack")), gg, gl))
            out.append(Launch(f"{prefix}_reduce", (Scratch(),) + bias + (Out(),),
                              (round_up(d["OUT"], 64), d["N"]), (64, 1)))
        return out

"""conv_mma_tf32_nhwc: the channels-last tensor-core convolution of --precision tf32 builds
(mma.sync m16n8k8 .tf32, FP32 storage and accumulation, NHWC in and out, reduction (r, s, c)).

Device-free: where it is offered (a tf32 build's layers with C % 4 == 0 and groups 1, on a
device with tensor cores or with AOTCONV_MMA_EMULATE; never an fp32 or fp16 build, whose
records it never serves), its layouts and precision (a layer on it is a TF32 layer for the
summary and the check), the fallback on every ResNet-50 conv it takes, the knobs'
constraints, the bank analysis of its local rows and of the staged epilogue's tile, its
rendered loads and stores, the preprocessor giving NVIDIA's compiler the PTX bodies (mma,
cvt.rna, ldmatrix, cp.async) and every other compiler the emulation, and the whole kernel
compiled to PTX by clang for nvptx and assembled by ptxas for sm_90 at points across the
space (its register estimate against ptxas's count).

PoCL (the device tier, the mma, ldmatrix and cp.async emulated): 1x1 stride 1 and 2, 3x3 pad 1
and stride 2, a dilated asymmetric kernel, 7x7 stride 2, tails in M, N and R*S*C, an odd K,
bias or none, relu and tanh, a fused residual, at the fallback and at points with DBUF,
CPASYNC 2 and 3, LDSM (B by .x4 and .x2), PAD 0 and EPI, within the TF32 tolerance of the
float64 reference and within 1e-5 of the TF32 operand model, and not within that of the
exact reference; every operand rounded bitwise as cvt.rna rounds; inputs whose rounding
errors add up fail the FP32 tolerance and pass the TF32 one; the staged epilogue bitwise equal
to the direct one; its local memory as PoCL reports it; a tf32 library that runs three of its
convs in NHWC (one with the residual add fused in) and passes --check against the TF32 model.

On an NVIDIA GPU (marker gpu): the same layers through the inline PTX.
"""
import functools
import re

import numpy as np
import pytest

from aotconv import harness, protocol, reference
from aotconv.context import with_precision
from aotconv.precision import round_tf32
from aotconv.space import fallback_point, layer_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV
import mma_nhwc_helpers as mh
from mma_nhwc_helpers import RESNET_3X3, conv, with_knobs as _with

V = BY_NAME["conv_mma_tf32_nhwc"]
NCHW_TF32 = BY_NAME["conv_mma"]
H100 = TARGETS["h100"]
H32 = with_precision(H100, "tf32")
POCL = TARGETS["pocl-cpu"]


_part = functools.partial(mh.part, V)
pick = functools.partial(mh.pick, V)


# -- where it is offered ------------------------------------------------------------------------

def test_a_tf32_build_offers_it_for_c_multiple_of_4_and_no_other_build_does():
    layer = conv(**RESNET_3X3)
    some = [V, NCHW_TF32, BY_NAME["conv_direct"]]
    part = [p for p in layer_space(layer, H32, variants=some).parts if p.variant is V]
    assert part and part[0].points and fallback_point(layer, V, H32) is not None
    assert V.layouts_of(layer, V.fallback(layer, H32)) == ("NHWC", "NHWC")
    # an fp32 build's spaces leave it out, saying why; its own constraint would prune it anyway
    sp = layer_space(layer, H100, variants=some)
    assert V.name not in [q.variant.name for q in sp.parts]
    assert dict(sp.unsupported)[V.name] == (
        "conv_mma_tf32_nhwc computes in TF32: only a build of --precision tf32 runs it")
    assert fallback_point(layer, V, H100) is None
    whole = _part(layer, H100)
    assert not whole.points and whole.first["build.precision"] == whole.total
    # an fp16 build stores half: it has no half-storage kernel
    h16 = with_precision(H100, "fp16")
    half = conv(storage="fp16", **RESNET_3X3)
    sp = layer_space(half, h16, variants=some)
    assert V.name in dict(sp.unsupported) and fallback_point(half, V, h16) is None
    mh.assert_the_domain(V, NCHW_TF32, H32, 4, "floats")


@pytest.mark.parametrize("name,cc", [("h100", (7, 5)), ("pocl-cpu", ())])
def test_no_tensor_cores_no_switch_no_points(name, cc, monkeypatch):
    mh.assert_no_tensor_cores_no_points(V, "tf32", name, cc, monkeypatch)


def test_its_records_never_serve_an_fp32_build(tmp_path):
    """A recorded point of the variant faster than everything else: a tf32 build takes it, an
    fp32 build of the same target and records does not."""
    from aotconv.tune.measure import Outcome, Status
    from aotconv.tune.records import Key, Store
    from aotconv.tune.search import records_only
    layer = conv((8, 64, 28, 28), out=128, kernel=3, pad=1, act="relu")
    store = Store(read=[tmp_path / "r.jsonl"], write=[tmp_path / "r.jsonl"])
    igemm = BY_NAME["conv_igemm"]
    store.append(Key(layer, V, H32), V.fallback(layer, H32), Outcome(Status.OK, 0.01, (0.01,)))
    store.append(Key(layer, igemm, H100), igemm.fallback(layer, H100),
                 Outcome(Status.OK, 1.0, (1.0,)))
    sig = layer.signature_str()
    assert records_only([[layer]], H32, store)[sig].best.variant == V.name
    assert records_only([[layer]], H100, store)[sig].best.variant == "conv_igemm"


def test_a_layer_on_it_is_a_tf32_layer():
    """The header's and report's summary, the tuner's tolerance and --check's reference treat
    a layer on the variant as one that multiplies in TF32."""
    from aotconv.choose import Choice
    from aotconv.precision import of_variant, reduced_layers, summary
    from aotconv.space import Candidate
    from aotconv.tune.measure import prepare_job
    assert of_variant(V) == of_variant(V.name) == "tf32"
    choices = {"c1": Choice(V.name, Config()), "c2": Choice("conv_igemm", Config()),
               "c3": Choice("conv_mma", Config())}
    assert reduced_layers(choices) == [("c1", "tf32"), ("c3", "tf32")]
    assert summary(choices, "tf32") == (
        "tf32", "FP32 storage; TF32 tensor-core math with FP32 accumulation in 2 of 3 conv "
                "layers (c1, c3); FP32 math everywhere else")
    layer = conv((1, 8, 6, 6), out=16, kernel=3, pad=1)
    job = prepare_job(H32, layer, Candidate(V.name, V.fallback(layer, H32)), BY_NAME, [])
    assert job.precision == "tf32"


def test_the_fallback_is_valid_on_every_resnet50_layer_it_takes(monkeypatch):
    """Every conv of ResNet-50 (batch 1 and 32) with C % 4 == 0 gets a fallback point on the
    h100 in a tf32 build, none with the knobs the H100 has not measured; conv1 (C = 3) gets
    none."""
    mh.assert_the_fallback_fits_resnet50(V, H32, 4, monkeypatch)


def test_constraints_name_what_they_prune():
    layer = conv(**RESNET_3X3)
    by = {c.name: c for c in V.constraints}
    base = dict(BM=64, BN=64, BK=16, WM=2, WN=2, PAD=4, DBUF=0, CPASYNC=0, LDSM=0, EPI=0)
    ok = lambda name, **kw: by[name].check(layer, Config.of(**dict(base, **kw)), H32)  # noqa
    assert ok("one_pipeline", CPASYNC=3) and ok("one_pipeline", DBUF=1)
    assert not ok("one_pipeline", CPASYNC=3, DBUF=1)
    # 32 pixels x 4 float4 (BK 16) is 128 vectors: one round of 128 work-items, half a round
    # of 256 (8 warps)
    assert ok("a_load_covers_tile", BM=32, BK=16)
    assert not ok("a_load_covers_tile", BM=32, BK=16, WM=2, WN=4)
    assert ok("a_load_covers_tile", BM=32, BK=32, WM=2, WN=4)
    assert not ok("b_load_covers_tile", BN=32, BK=16, WM=2, WN=4)
    assert not ok("k_step_whole_mmas", BK=12) and ok("k_step_whole_mmas", BK=16)
    assert not ok("warp_tiles_whole", BM=32, WM=4)
    # a 1x1 conv over 4 channels: R*S*C = 4, one 16-deep step; 3 cp.async stages hold nothing
    small = conv((1, 4, 8, 8), out=16, kernel=1)
    assert not by["k_tile_not_oversized"].check(small, Config.of(**dict(base, BK=32)), H32)
    assert by["k_tile_not_oversized"].check(small, Config.of(**base), H32)
    assert not by["stages_not_oversized"].check(small, Config.of(**dict(base, CPASYNC=3)), H32)
    assert by["stages_not_oversized"].check(small, Config.of(**dict(base, CPASYNC=2)), H32)
    # the staged epilogue stores 4 channels a vector: K % 4 == 0
    epi = by["epilogue_whole_vectors"]
    odd, six = conv((1, 8, 9, 9), out=13, kernel=1), conv((1, 8, 9, 9), out=6, kernel=1)
    for l in (odd, six):
        assert not epi.check(l, Config.of(**dict(base, EPI=1)), H32)
        assert epi.check(l, Config.of(**base), H32)
        assert not [c for c in _part(l, H32).points if c["EPI"]]
    assert epi.check(conv((1, 8, 9, 9), out=12, kernel=1), Config.of(**dict(base, EPI=1)), H32)


@pytest.mark.parametrize("bk", [16, 32])
def test_pad_4_makes_every_fragment_read_conflict_free(bk):
    """The bank analysis of the template's comment: with PAD = 4 a local row is 4 (mod 8) words
    long and every fragment read of a warp (and every 8-row phase of ldmatrix) hits 32
    different banks; without padding some lanes share a bank."""
    mh.assert_pad_4_conflict_free(V, bk, per_word=1)


def _staged_banks(bn, eld):
    """The banks of the staged epilogue's local accesses, per phase: a half-warp's float2
    writes (lane (g, t) at row g, words 2t, 2t + 1) and a quarter-warp's float4 reads
    (work-item tid at row tid / (BN/4), chunk tid % (BN/4))."""
    phases = []
    for half in (0, 1):
        lanes = range(16 * half, 16 * half + 16)
        phases.append([((l >> 2) * eld + 2 * (l & 3) + j) % 32 for l in lanes for j in (0, 1)])
    bn4 = bn // 4
    for q in range(4):
        phases.append([((tid // bn4) * eld + tid % bn4 * 4 + j) % 32
                       for tid in range(8 * q, 8 * q + 8) for j in range(4)])
    return phases


@pytest.mark.parametrize("bn", [32, 64, 128])
def test_the_staged_tile_s_rows_make_its_accesses_conflict_free(bn):
    """The bank analysis of the template's comment, from its own ELD: every phase of the
    staged epilogue's local writes and reads hits 32 different banks; rows of BN floats (no
    padding) would make the writes collide."""
    layer = conv((2, 40, 16, 16), out=128, kernel=1)
    cfg = Config.of(BM=64, BN=bn, BK=16, WM=2, WN=2, PAD=4, DBUF=0, CPASYNC=0, LDSM=0, EPI=1)
    eld = V.template_params(layer, cfg)["ELD"]
    assert eld == bn + 8 and eld % 4 == 0                  # float4 rows stay aligned
    assert all(len(set(b)) == 32 for b in _staged_banks(bn, eld))
    assert not all(len(set(b)) == 32 for b in _staged_banks(bn, bn))


def test_local_memory_is_the_stages_or_a_staged_pass(monkeypatch):
    """The larger of the stages ((BM + BN) x LD words, NBUF of them) and one pass of the staged
    tile (WM * 16 pixels of BN + 8 floats), as the template declares it (SMEM)."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((32, 128, 28, 28), res=True, out=512, kernel=1)
    cfg = Config.of(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0, CPASYNC=0, LDSM=0, EPI=1)
    assert V.local_mem_bytes(layer, cfg) == 4 * 64 * 136        # a pass: 64 x 136 floats
    assert V.local_mem_bytes(layer, _with(cfg, EPI=0)) == 4 * 256 * 16
    assert V.template_params(layer, cfg)["SMEM"] == 64 * 136
    big = Config.of(BM=128, BN=128, BK=16, WM=2, WN=2, PAD=4, DBUF=1, CPASYNC=0, LDSM=0, EPI=1)
    assert V.local_mem_bytes(layer, big) == V.local_mem_bytes(layer, _with(big, EPI=0)) \
        == 4 * 2 * 256 * 20                                     # 40 KiB: under the H100's 48
    assert big in _part(layer, H32).members
    assert "__local float4 smem4[SMEM / 4];" in V.render(layer, big, "k")


def test_the_kernel_reads_float4_and_stores_float2_in_nhwc(monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((2, 16, 8, 8), res=True, out=32, kernel=3, pad=1, act="relu")
    src = V.render(layer, V.fallback(layer, H32), "k")
    assert "__global const float4* restrict x" in src
    assert "__global const float4* restrict wp" in src
    assert "__global const float* restrict res" in src and "__global float* restrict y" in src
    assert "((__global const float2*)bias)[n / 2]" in src
    assert "((__global const float2*)res)[i2]" in src and "((__global float2*)y)[i2] = " in src
    assert "af[mi][q] = TF32_WORD(af[mi][q]);" in src and "v = tf32(w[" in src
    assert "AOTCONV_MMA_EMULATE 1" not in src
    staged = V.render(layer, pick(layer, H32, EPI=1), "k")
    assert "((__global float4*)y)[i4] = " in staged and "const int i2" not in staged
    assert "s += ((__global const float4*)res)[i4];" in staged
    # an odd K: channel by channel
    layer = conv((1, 8, 7, 7), out=13, kernel=1)
    src = V.render(layer, V.fallback(layer, H32), "k")
    assert "y[m * K + n + j] = " in src and "float2" not in src.split("// epilogue")[1]
    # the packed weights: whole BN x BK tiles of floats
    cfg = Config.of(BM=64, BN=32, BK=32, WM=2, WN=1, PAD=4, DBUF=0, CPASYNC=0, LDSM=0, EPI=0)
    assert V.buffers(layer, cfg) == {"wpack": 32 * 32}


def test_nvidia_s_compiler_gets_the_ptx_and_every_other_the_emulation(monkeypatch):
    layer = conv(**RESNET_3X3)
    nv, other = mh.preprocessed(V, layer, pick(layer, H32, CPASYNC=3, LDSM=1, EPI=1),
                                monkeypatch)
    for ins in ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32",
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                "cp.async.commit_group", "cp.async.wait_group 1"):
        assert ins in nv, ins
    assert "0xffffe000u" not in nv and "lx[lane]" not in nv and "mx[r_ * 8 + p_]" not in nv
    assert "0xffffe000u" in other and "lx[lane]" in other
    assert "fma(as_float(mx[r_ * 8 + p_]), as_float(mx[128 + c_ * 8 + p_]), s_)" in other


# -- the PTX through clang (nvptx) and ptxas ---------------------------------------------------

PTX_POINTS = mh.ptx_points(16)             # BK 16 and 32: 64 and 128 bytes of k


def test_the_kernel_compiles_to_ptx_that_ptxas_assembles_for_sm_90(tmp_path, monkeypatch):
    """clang's OpenCL front end and nvptx back end (the stand-in for NVIDIA's compiler, absent
    here) compile the whole kernel with its inline PTX, and ptxas assembles it for sm_90 (the
    H100), at points across the data-movement knobs: the TF32 mma, one cvt.rna per A fragment
    word of a step (and the pack's), cp.async and ldmatrix where asked, no register spills,
    and the registers() estimate within 35% of ptxas's count. The staged epilogue (EPI = 1)
    stores one st.global.v4.f32 per output vector; the direct one stores float2 (v2). What
    the instructions compute is tested through the emulation (PoCL) and on the H100."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((8, 64, 14, 14), res=True, out=64, kernel=3, pad=1, act="relu")

    def check_ptx(cfg, p, ptx):
        # the main loop's body is one K step: MI x NI mmas per 8-deep k-step, 4 MI words rounded
        ksteps = cfg["BK"] // 8
        assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == \
            p["MI"] * p["NI"] * ksteps, cfg
        assert ptx.count("cvt.rna.tf32.f32") == 4 * p["MI"] * ksteps + 1, cfg
        stores = re.findall(r"st\.global\.v4\.f32", ptx)
        assert len(stores) == (p["MI"] * p["E_ITERS"] if cfg["EPI"] else 0), (cfg, len(stores))
        assert bool(re.search(r"st\.global\.v2\.f32", ptx)) == (not cfg["EPI"]), cfg
        assert "st.local" not in ptx and "ld.local" not in ptx, cfg

    mh.assert_ptx_assembles(V, layer, H32, PTX_POINTS,
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", tmp_path,
                            check_ptx)


# -- on PoCL: the emulated mma, ldmatrix and cp.async -----------------------------------------

@pytest.fixture
def emulated(monkeypatch, cl_ctx):
    """(the tf32 PoCL target, (context, queue)) with the mma emulated."""
    monkeypatch.setenv(EMULATE_ENV, "1")
    return with_precision(POCL, "tf32"), cl_ctx


# id -> (input shape, attributes, residual, points beside the fallback: knob values picked
# from the pruned space); across them every data-movement knob value, tails in M (N*P*Q not a
# multiple of BM), N (K not a multiple of BN) and R*S*C (not a multiple of BK)
SHAPES = {
    "k1_tails": ((2, 40, 7, 5), dict(out=40, kernel=1), False,
                 [dict(CPASYNC=3, LDSM=1, BK=16, EPI=1)]),
    "k3_p1_residual_relu": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu"), True,
                            [dict(DBUF=1, LDSM=1, PAD=0, BK=32, EPI=0)]),
    "k3_s2_nobias": ((1, 12, 11, 9), dict(out=16, kernel=3, stride=2, pad=1, bias=False),
                     False, [dict(CPASYNC=2, LDSM=0, BK=32, EPI=1)]),
    "k1_s2_odd_k": ((1, 24, 9, 9), dict(out=13, kernel=1, stride=2), False,
                    [dict(LDSM=1, BN=32, WN=4)]),
    "k3x2_dilated_residual": ((1, 8, 10, 9), dict(out=24, kernel=[3, 2], stride=[1, 2],
                                                  dilation=[2, 1], pad=[2, 0], act="relu"),
                              True, [dict(CPASYNC=2, LDSM=1, BK=16, EPI=1)]),
    "k7_s2_p3_tanh": ((1, 4, 13, 11), dict(out=8, kernel=7, stride=2, pad=3, act="tanh"),
                      False, [dict(CPASYNC=3, LDSM=1, BK=32)]),
}
QUICK = ("k1_tails", "k3_p1_residual_relu", "k1_s2_odd_k", "k3x2_dilated_residual")


@functools.lru_cache(maxsize=None)
def case(lid):
    shape, attrs, res, _ = SHAPES[lid]
    return mh.random_case(conv(shape, res=res, **attrs), lid)


def model_of(layer, xs, prm):
    """The float64 reference on operands rounded to TF32: what the tensor cores multiply (bias
    and residual added unrounded)."""
    p = dict(prm, weight=round_tf32(prm["weight"]))
    return reference.forward(layer, [round_tf32(xs[0])] + list(xs[1:]), p)


run_point = functools.partial(mh.run_point, V)


def check_point(layer, xs, prm, cfg, ctx, program=None, source=None):
    """`cfg`'s output within the TF32 tolerance of the float64 reference, within 1e-5 of the
    TF32 operand model and not within that of the exact reference (it multiplies in TF32)."""
    out = run_point(layer, xs, prm, cfg, ctx, program, source)
    got = protocol.Reference(layer, xs, prm).check(out, precision="tf32")
    assert got["ok"], f"[{cfg}]: scaled error {got['error']:.3g} beyond the TF32 tolerance"
    ok, err = harness.close(out, model_of(layer, xs, prm), 1e-5)
    assert ok, f"[{cfg}]: {err:.3g} from the TF32 operand model"
    assert not harness.close(out, reference.forward(layer, xs, prm), 1e-5)[0], \
        f"[{cfg}]: the exact products, not TF32 ones"
    return out


@pytest.mark.parametrize("lid", [lid if lid in QUICK else pytest.param(lid, marks=pytest.mark.slow)
                                 for lid in SHAPES])
def test_emulated_conv_mma_tf32_nhwc_against_the_model(emulated, lid):
    """The fallback and the shape's points of the space (DBUF, CPASYNC, LDSM, PAD 0, EPI)."""
    target, ctx = emulated
    layer, xs, prm = case(lid)
    points = [V.fallback(layer, target)] + [pick(layer, target, **w) for w in SHAPES[lid][3]]
    for cfg in points:
        check_point(layer, xs, prm, cfg, ctx)


def test_every_operand_is_rounded_as_cvt_rna(emulated):
    """Through an identity 1x1 conv each output is one product of an input and 1.0, so it is
    the input as the tensor cores took it: bitwise round_tf32 of it (ties away from zero,
    carries into the exponent, subnormals); through one-hot inputs each output is a weight as
    packed: bitwise round_tf32 of it. Both with cp.async and ldmatrix, as with plain loads."""
    target, ctx = emulated
    layer = conv((1, 16, 8, 16), out=16, kernel=1, bias=False)
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, size=(1, 16, 8, 16), dtype=np.uint64).astype(np.uint32)
    bits = (bits & np.uint32(0x807fffff)) | (rng.integers(100, 150, size=bits.shape,
                                                          dtype=np.uint32) << 23)
    bits.reshape(-1)[:64] = (bits.reshape(-1)[:64] & ~np.uint32(0x1fff)) | np.uint32(0x1000)
    bits.reshape(-1)[64:72] = np.uint32(0x3fffffff)             # rounds up into the exponent
    bits.reshape(-1)[72:80] = np.uint32(0x00012345)             # subnormal
    x = bits.view(np.float32)
    w = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    wbits = w.view(np.uint32)
    wbits.reshape(-1)[:32] = (wbits.reshape(-1)[:32] & ~np.uint32(0x1fff)) | np.uint32(0x1000)
    eye = np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1)
    onehot = np.zeros_like(x)
    for c in range(16):
        onehot[0, c, c % 8::8, c // 8::2] = 1.0                  # a 1 somewhere per channel
    for cfg in (V.fallback(layer, target), pick(layer, target, CPASYNC=2, LDSM=1)):
        out = run_point(layer, [x], {"weight": eye}, cfg, ctx)
        assert np.array_equal(out.view(np.uint32), round_tf32(x).view(np.uint32)), cfg
        assert not np.array_equal(out, x)
        out = run_point(layer, [onehot], {"weight": w}, cfg, ctx)
        want = np.einsum("kc,nchw->nkhw", round_tf32(w)[:, :, 0, 0].astype(np.float64),
                         onehot.astype(np.float64))
        assert np.array_equal(out, want.astype(np.float32)), cfg


def test_tf32_products_fail_the_fp32_tolerance_and_pass_their_own(emulated):
    """Inputs that cancel while their rounding errors add up: channel pairs x_a = 1 + 2^-11 -
    2^-23 (rounds down by almost 2^-11) and x_b = 1 + 2^-11 (a tie: rounds up by 2^-11) under
    weights +1 and -1, so each output is about 0 and off by 2^-10 per pair and tap. An FP32
    kernel passes (conv_igemm); conv_mma_tf32_nhwc fails the FP32 tolerance by two orders and
    passes the TF32 one, on the same data."""
    target, ctx = emulated
    layer = conv((1, 64, 6, 6), out=32, kernel=3, pad=1, bias=False)
    x = np.empty(layer.in_shape, np.float32)
    x[:, 0::2], x[:, 1::2] = np.float32(1 + 2.0 ** -11 - 2.0 ** -23), np.float32(1 + 2.0 ** -11)
    w = np.ones(dict(layer.params)["weight"], np.float32)
    w[:, 1::2] = -1
    ref = protocol.Reference(layer, [x], {"weight": w})
    out = run_point(layer, [x], {"weight": w}, V.fallback(layer, target), ctx)
    assert ref.check(out, precision="tf32")["ok"]
    assert ref.check(out)["error"] > 100 * protocol.TOLERANCE
    igemm = BY_NAME["conv_igemm"]
    out = harness.run_layer(layer, igemm, igemm.fallback(layer, POCL), [x], {"weight": w},
                            target=target, ctx=ctx)
    assert ref.check(out)["ok"]


# id -> (input shape, attributes, residual, the EPI = 1 point's other knob values): tails in M
# and N, bias or none, residual or none, activations, EPI = 1 with the register double buffer,
# cp.async, ldmatrix (.x4 and .x2), PAD 0, a pass of more work-items than vectors (E_ITERS
# rounded up) and a pass larger than the stages
STAGED = {
    "tails_cpasync3_ldsm": ((2, 40, 7, 5), dict(out=40, kernel=1), False,
                            dict(BN=64, CPASYNC=3, LDSM=1, BK=16)),
    "residual_nobias_relu_dbuf": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu",
                                                      bias=False), True,
                                  dict(DBUF=1, LDSM=0, PAD=0)),
    "ldsm_x2_half_a_pass": ((1, 24, 11, 9), dict(out=16, kernel=3, stride=2, pad=1,
                                                 bias=False, act="tanh"), False,
                            dict(LDSM=1, BN=32, WN=4, DBUF=0, CPASYNC=0)),
    "pass_beyond_the_stages": ((1, 16, 12, 12), dict(out=72, kernel=1, act="hardsigmoid",
                                                     alpha=0.3, beta=0.4), True,
                               dict(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0,
                                    CPASYNC=0, LDSM=0)),
}
STAGED_QUICK = ("tails_cpasync3_ldsm",)


@pytest.mark.parametrize("sid", [sid if sid in STAGED_QUICK
                                 else pytest.param(sid, marks=pytest.mark.slow)
                                 for sid in STAGED])
def test_the_staged_epilogue_is_bitwise_the_direct_one(emulated, sid):
    """EPI = 1 stores exactly what EPI = 0 stores at the same point (the same FP32 sums, bias,
    residual and activation, per element), and so matches the model; its local memory is
    what PoCL reports for the kernel."""
    target, ctx = emulated
    layer, xs, prm, staged, p = mh.staged_case(V, STAGED, sid, target)
    if sid == "ldsm_x2_half_a_pass":
        assert p["NI"] % 2 == 1
    if sid == "pass_beyond_the_stages":
        stages = p["NBUF"] * (staged["BM"] + staged["BN"]) * p["LD"]
        assert p["SMEM"] == 64 * (128 + 8) > stages and p["MCHK"] and p["NCHK"]
    if sid.startswith("tails"):
        assert p["MCHK"] and p["NCHK"] and p["KCHK"]
    mh.assert_staged_is_direct(V, layer, xs, prm, staged, ctx, check_point)


def test_the_check_sees_a_wrong_layout(emulated):
    """The same kernel read back as if it wrote NCHW is far from the reference: the tests above
    pass because the output is NHWC, not whatever the check would accept."""
    target, ctx = emulated
    mh.assert_the_check_sees_a_wrong_layout(V, case("k3_p1_residual_relu"), target, ctx,
                                            "tf32")


# -- on an NVIDIA GPU: the inline PTX -----------------------------------------------------------

@pytest.fixture
def gpu():
    from devices import h100_tensor_cores
    return h100_tensor_cores("tf32")


@pytest.mark.gpu
def test_ptx_conv_mma_tf32_nhwc_against_the_model(gpu, monkeypatch):
    """The tensor cores on every layer of SHAPES at the fallback, the shape's own points, the
    first point of the space with DBUF alone, CPASYNC 2, CPASYNC 3, LDSM and EPI, each within
    the TF32 tolerance and 1e-5 of the TF32 operand model; the driver's binary holds the TF32
    mma and cvt.rna (and cp.async, ldmatrix where asked), and an EPI = 1 point stores bitwise
    what its EPI = 0 twin stores where both ran. Every point is tried and its outcome printed
    (`pytest -s`); a wrong answer, a failed launch, or a point without CPASYNC, LDSM and EPI
    that does not build fails the test; a point with them that the driver does not build is
    reported (printed and warned), not failed."""
    target, ctx = gpu
    monkeypatch.delenv(EMULATE_ENV, raising=False)

    def check_binary(cfg, binary):
        assert b"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in binary
        assert b"cvt.rna.tf32.f32" in binary
        assert (b"cp.async" in binary) == bool(cfg["CPASYNC"]), "cp.async in the binary"
        assert (b"ldmatrix" in binary) == bool(cfg["LDSM"]), "ldmatrix in the binary"

    mh.ptx_sweep(V, SHAPES, case, target, ctx, check_point, check_binary)


# -- a tf32 library on PoCL ---------------------------------------------------------------------

def test_a_tf32_library_runs_it_in_nhwc_and_checks_against_the_tf32_model(emulated, tmp_path,
                                                                          monkeypatch):
    """conv_mma_tf32_nhwc recorded fastest for c1, c2 (with the add fused in, relu after it)
    and c3, the last two with the staged epilogue (EPI = 1): the tf32 build runs them in NHWC,
    converting c0's output (C = 3 in: another variant, NCHW) once for both of its readers and
    c3's back for the pool; its header names the three as TF32 layers, and --check compares
    with the reference whose TF32 layers' operands are rounded, within what FP32 sums leave."""
    res = mh.library_on_the_variant(V, "tfnhwc", "tf32", tmp_path, monkeypatch)
    assert "TF32 layers' operands rounded" in res.check_reference
    assert res.check_error is not None and res.check_error <= 1e-5
    header = (tmp_path / "out" / "tfnhwc.h").read_text()
    assert '#define AOTCONV_TFNHWC_PRECISION "tf32"' in header
    assert "TF32 tensor-core math with FP32 accumulation in 3 of 4 conv layers (c1, c2, c3)" \
        in " ".join(header.replace("*", " ").split())

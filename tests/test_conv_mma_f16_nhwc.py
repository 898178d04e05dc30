"""conv_mma_f16_nhwc: the channels-last tensor-core convolution of --precision fp16 builds
(mma.sync m16n8k16 .f16, FP32 accumulation, NHWC in and out, reduction (r, s, c)).

Device-free: where it is offered (an fp16 build's half layers with C % 8 == 0 and groups 1, on
a device with tensor cores or with AOTCONV_MMA_EMULATE), its layouts, the bank analysis of its
local rows, its rendered loads and stores, the preprocessor giving NVIDIA's compiler the PTX
bodies (mma, ldmatrix, cp.async) and every other compiler the emulation, and the whole kernel
compiled to PTX by clang for nvptx and assembled by ptxas for sm_90 at points across the
space (its register estimate against ptxas's count); the knobs' constraints. The staged
epilogue (EPI): a point without the knob renders as EPI = 0 and a shipped record is read so,
its constraint, its local memory, the bank analysis of its staged tile, its 16-byte PTX.

PoCL (the device tier, the mma, ldmatrix and cp.async emulated): 1x1 stride 1 and 2, 3x3 pad 1
and stride 2, 7x7 stride 2, a dilated asymmetric kernel, tails in M, N and R*S*C, an odd K,
bias or none, relu and tanh, a fused residual, at the fallback and at points with DBUF,
CPASYNC 2 and 3, LDSM (B by .x4 and .x2) and PAD 0, against the float64 reference within the
half tolerance and the half model within one half ulp; every finite half through an identity
1x1 conv, exactly; the staged epilogue (EPI = 1) bitwise equal to the direct one at the same
point, across tails, bias, residual, every activation (most in the slow tier) and the
data-movement knobs, its local memory as PoCL reports it; an fp16 library that runs three of
its convs in NHWC (one with the residual add fused in; two with EPI = 1) between the layout
conversions its build inserts, passing --check.

On an NVIDIA GPU (marker gpu): the same layers through the inline PTX, printing every point's
outcome and reporting the knob points the driver does not build.
"""
import functools
import re

import numpy as np
import pytest

from aotconv import protocol
from aotconv.context import with_precision
from aotconv.space import fallback_point, layer_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)
import mma_nhwc_helpers as mh
from mma_nhwc_helpers import RESNET_3X3, without as _without, with_knobs as _with

V = BY_NAME["conv_mma_f16_nhwc"]
NCHW_F16 = BY_NAME["conv_mma_f16"]
H100 = TARGETS["h100"]
H16 = with_precision(H100, "fp16")
POCL = TARGETS["pocl-cpu"]


conv = functools.partial(mh.conv, storage="fp16")
_part = functools.partial(mh.part, V)
pick = functools.partial(mh.pick, V)


# -- where it is offered ------------------------------------------------------------------------

def test_an_fp16_build_offers_it_for_c_multiple_of_8_and_no_other_build_does():
    half, fp32 = conv(**RESNET_3X3), conv(storage="fp32", **RESNET_3X3)
    some = [V, NCHW_F16, BY_NAME["conv_direct"]]
    part = [p for p in layer_space(half, H16, variants=some).parts if p.variant is V]
    assert part and part[0].points and fallback_point(half, V, H16) is not None
    assert V.layouts_of(half, V.fallback(half, H16)) == ("NHWC", "NHWC")
    for p in ("fp32", "tf32"):
        t = with_precision(H100, p)
        sp = layer_space(fp32, t, variants=some)
        assert V.name not in [q.variant.name for q in sp.parts], p
        assert dict(sp.unsupported)[V.name] == (
            "conv_mma_f16_nhwc multiplies the half values a --precision fp16 build stores: "
            "only a build of --precision fp16 runs it"), p
        assert fallback_point(fp32, V, t) is None
    mh.assert_the_domain(V, NCHW_F16, H16, 8, "halves")


@pytest.mark.parametrize("name,cc", [("h100", (7, 5)), ("pocl-cpu", ())])
def test_no_tensor_cores_no_switch_no_points(name, cc, monkeypatch):
    mh.assert_no_tensor_cores_no_points(V, "fp16", name, cc, monkeypatch)


def test_the_fallback_is_valid_on_every_resnet50_layer_it_takes(monkeypatch):
    """Every conv of ResNet-50 (batch 1 and 32) with C % 8 == 0 gets a fallback point on the
    h100, none with the knobs the H100 has not measured; conv1 (C = 3) gets none."""
    mh.assert_the_fallback_fits_resnet50(V, H16, 8, monkeypatch)


def test_constraints_name_what_they_prune():
    layer = conv(**RESNET_3X3)
    by = {c.name: c for c in V.constraints}
    base = dict(BM=64, BN=64, BK=32, WM=2, WN=2, PAD=4, DBUF=0, CPASYNC=0, LDSM=0)
    ok = lambda name, **kw: by[name].check(layer, Config.of(**dict(base, **kw)), H16)  # noqa
    assert ok("one_pipeline", CPASYNC=3) and ok("one_pipeline", DBUF=1)
    assert not ok("one_pipeline", CPASYNC=3, DBUF=1)
    # 32 pixels x 2 uint4 (BK 16) is 64 vectors, not a whole round of 128 work-items
    assert ok("a_load_covers_tile", BM=64, BK=16) and not ok("a_load_covers_tile", BM=32, BK=16)
    assert not ok("b_load_covers_tile", BN=32, BK=16)
    assert not ok("k_step_whole_mmas", BK=24)
    # a 1x1 conv over 8 channels: R*S*C = 8, one 16-deep step; 3 cp.async stages hold nothing
    small = conv((1, 8, 8, 8), out=16, kernel=1)
    assert not by["k_tile_not_oversized"].check(small, Config.of(**dict(base, BK=32)), H16)
    assert not by["stages_not_oversized"].check(small, Config.of(**dict(base, CPASYNC=3)), H16)
    assert by["stages_not_oversized"].check(small, Config.of(**dict(base, CPASYNC=2)), H16)


@pytest.mark.parametrize("bk", [16, 32, 64])
def test_pad_4_makes_every_fragment_read_conflict_free(bk):
    """The bank analysis of the template's comment: with PAD = 4 a local row is 4 (mod 8) words
    long and every fragment read of a warp (and every 8-row phase of ldmatrix) hits 32
    different banks; without padding some lanes share a bank."""
    mh.assert_pad_4_conflict_free(V, bk, per_word=2)


# -- the staged epilogue (EPI) -------------------------------------------------------------------

def test_epi_0_is_the_direct_epilogue_and_what_a_point_without_epi_renders(monkeypatch):
    """EPI's first value is 0 (the fallback's), and a point without the knob (a record made
    before it) renders and hashes as EPI = 0: the half2 stores from the fragments. EPI = 1
    renders the staged epilogue instead: no half2 store, 16-byte vectors of the output."""
    from aotconv.tune.records import kernel_hash
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((2, 16, 8, 8), res=True, out=32, kernel=3, pad=1, act="relu")
    knob = [k for k in V.knobs(layer, H16) if k.name == "EPI"]
    assert knob and knob[0].values[0] == 0 and V.knobs(layer, H16)[-1].name == "EPI"
    assert V.fallback(layer, H16)["EPI"] == 0
    for want in (dict(DBUF=1), dict(CPASYNC=3, LDSM=1)):
        cfg = pick(layer, H16, EPI=0, **want)
        old = _without(cfg, "EPI")
        direct = V.render(layer, cfg, "k")
        assert V.render(layer, old, "k") == direct
        assert kernel_hash(V, layer, old) == kernel_hash(V, layer, cfg)
        assert "const int i2 = (m * K + n) / 2;" in direct and "pack_half8_rte" not in direct
        staged = V.render(layer, _with(cfg, EPI=1), "k")
        assert "const int i2" not in staged and "vload_half2(i2, res)" not in staged
        assert "((__global uint4*)y)[i8] = pack_half8_rte(o);" in staged
        assert "s += load_half8((__global const uint4*)res + i8);" in staged
        assert "#define EPI" in staged and "#define EPI" not in direct


def test_a_shipped_record_without_epi_is_its_point_with_epi_0(monkeypatch):
    """The h100's shipped records of the variant were made before EPI: the search reads each
    as its point with EPI = 0, a point of the layer's space (without Variant.completed it
    would be no point of the space, and the layer would lose its records)."""
    from aotconv.tune.records import Key, Store, layer_of, read_log, shipped_file
    from aotconv.tune.search import known_outcomes
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    recs = [r for r in read_log(shipped_file("h100")) if r["variant"] == V.name]
    # the shapes whose records all predate the knob (later records of other shapes have it)
    staged = {r["op"] for r in recs if "EPI" in dict(r["cfg"])}
    older = [r for r in recs if r["op"] not in staged]
    assert older and all("EPI" not in dict(r["cfg"]) for r in older)
    op = older[0]["op"]
    layer = layer_of(op)
    store = Store(read=[shipped_file("h100")])
    got = store.lookup(Key(layer, V, H16))
    assert len(got) == len([r for r in recs if r["op"] == op])
    assert all(c.items[-1] == ("EPI", 0) for c in got)
    space = layer_space(layer, H16, variants=[V])
    known = known_outcomes(space, store, H16, None)
    assert {c.cfg for c in known} == set(got)


def test_an_edit_of_the_shared_sources_makes_both_variants_records_stale(tmp_path,
                                                                          monkeypatch):
    """conv_mma_f16_nhwc and conv_mma_tf32_nhwc render from a shared template and module
    besides their own (the templates include the one the hash reads): an edit of either
    changes both variants' template hash, part of every record's key, as an edit of a
    variant's own template does, so no record made before it is taken as current."""
    from aotconv.variants import mma_nhwc
    from aotconv.variants.base import TEMPLATE_DIR
    both = [V, BY_NAME["conv_mma_tf32_nhwc"]]
    shared = mma_nhwc.SHARED_SOURCES
    for v in both:
        assert f'file="{shared[0].name}"' in (TEMPLATE_DIR / v.template).read_text()
    before = [v.template_hash() for v in both]
    assert before == [v.template_hash() for v in both]
    for i, path in enumerate(shared):
        edited = tmp_path / path.name
        edited.write_bytes(path.read_bytes() + b"\n")
        monkeypatch.setattr(mma_nhwc, "SHARED_SOURCES", shared[:i] + (edited,) + shared[i + 1:])
        after = [v.template_hash() for v in both]
        assert after[0] != before[0] and after[1] != before[1], path.name
    monkeypatch.setattr(mma_nhwc, "SHARED_SOURCES", shared)
    assert [v.template_hash() for v in both] == before


def test_the_staged_epilogue_needs_k_multiple_of_8():
    by = {c.name: c for c in V.constraints}["epilogue_whole_vectors"]
    base = Config.of(BM=64, BN=64, BK=32, WM=2, WN=2, PAD=4, DBUF=0, CPASYNC=0, LDSM=0, EPI=1)
    odd, tail = conv((1, 24, 9, 9), out=13, kernel=1), conv((2, 40, 7, 5), out=36, kernel=1)
    assert not by.check(odd, base, H16) and by.check(odd, _with(base, EPI=0), H16)
    assert not by.check(tail, base, H16)                   # 36 channels: 4.5 vectors a pixel
    assert by.check(conv((2, 40, 7, 5), out=40, kernel=1), base, H16)
    assert not [c for c in _part(odd, H16).points if c["EPI"]]
    assert [c for c in _part(odd, H16).points if not c["EPI"]]


def test_the_staged_epilogue_reuses_the_stages_local_memory(monkeypatch):
    """Local memory is the larger of the stages and one pass of the staged tile (WM * 16
    pixels of BN + 8 floats), as the template declares it (SMEM); a 128 x 128 tile fits the
    H100's 48 KiB with EPI = 1 (a whole FP32 tile would take 64 KiB): ResNet-50's
    layer2.0.conv3 at batch 32 keeps its recorded tiles with the staged epilogue."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((32, 128, 28, 28), res=True, out=512, kernel=1)
    small_stages = Config.of(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0, CPASYNC=0,
                             LDSM=0, EPI=1)
    # stages (128 + 128) x 8 words; a pass 64 x 136 floats
    assert V.local_mem_bytes(layer, small_stages) == 4 * 64 * 136
    assert V.local_mem_bytes(layer, _with(small_stages, EPI=0)) == 4 * 256 * 8
    assert V.template_params(layer, small_stages)["SMEM"] == 64 * 136
    big_stages = Config.of(BM=128, BN=128, BK=32, WM=2, WN=2, PAD=4, DBUF=1, CPASYNC=0,
                           LDSM=0, EPI=1)
    # stages 2 x 256 x 20 words; a pass 32 x 136
    assert V.local_mem_bytes(layer, big_stages) == V.local_mem_bytes(
        layer, _with(big_stages, EPI=0)) == 4 * 2 * 256 * 20
    assert big_stages in _part(layer, H16).members
    assert "__local uint4 smem4[SMEM / 4];" in V.render(layer, big_stages, "k")


def _staged_banks(bn, eld, swizzle=True):
    """The banks of the staged epilogue's local accesses, per phase: a half-warp's float2
    writes (lane (g, t) at row g, words 2t, 2t + 1) and a quarter-warp's float4 reads (work-item
    tid at row tid / (BN/8), chunk tid % (BN/8), its half (tid >> 2) & 1 first)."""
    phases = []
    for half in (0, 1):
        lanes = range(16 * half, 16 * half + 16)
        phases.append([((l >> 2) * eld + 2 * (l & 3) + j) % 32 for l in lanes for j in (0, 1)])
    bn8 = bn // 8
    for q in range(4):
        for second in (0, 1):
            banks = []
            for tid in range(8 * q, 8 * q + 8):
                h = ((tid >> 2) & 1 if swizzle else 0) ^ second
                banks += [((tid // bn8) * eld + tid % bn8 * 8 + 4 * h + j) % 32 for j in range(4)]
            phases.append(banks)
    return phases


@pytest.mark.parametrize("bn", [32, 64, 128])
def test_the_staged_tile_s_rows_make_its_accesses_conflict_free(bn):
    """The bank analysis of the template's comment, from its own ELD: every phase of the
    staged epilogue's local writes and reads hits 32 different banks. Rows of BN floats
    (no padding) or reads without the lanes' half order would collide."""
    layer = conv((2, 40, 16, 16), out=128, kernel=1)
    cfg = Config.of(BM=64, BN=bn, BK=32, WM=2, WN=2, PAD=4, DBUF=0, CPASYNC=0, LDSM=0, EPI=1)
    eld = V.template_params(layer, cfg)["ELD"]
    assert eld == bn + 8 and eld % 4 == 0                  # float4 rows stay aligned
    assert all(len(set(b)) == 32 for b in _staged_banks(bn, eld))
    assert not all(len(set(b)) == 32 for b in _staged_banks(bn, bn))
    assert not all(len(set(b)) == 32 for b in _staged_banks(bn, eld, swizzle=False))


def test_the_kernel_reads_uint4_and_stores_half2_in_nhwc(monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((2, 16, 8, 8), res=True, out=32, kernel=3, pad=1, act="relu")
    src = V.render(layer, V.fallback(layer, H16), "k")
    assert "__global const uint4* restrict x" in src and "__global const uint4* restrict wp" in src
    assert "__global const half* restrict res" in src and "__global half* restrict y" in src
    assert "vload_half2(n / 2, bias)" in src and "vload_half2(i2, res)" in src
    assert "vstore_half2_rte(" in src and "const int i2 = (m * K + n) / 2;" in src
    assert "AOTCONV_MMA_EMULATE 1" not in src
    # an odd K: channel by channel
    layer = conv((1, 8, 7, 7), out=13, kernel=1)
    src = V.render(layer, V.fallback(layer, H16), "k")
    assert "vstore_half_rte(" in src and "vstore_half2" not in src
    # the packed weights: whole BN x BK tiles of words, half the bytes of float tiles
    cfg = Config.of(BM=64, BN=32, BK=32, WM=2, WN=1, PAD=4, DBUF=0, CPASYNC=0, LDSM=0)
    assert V.buffers(layer, cfg) == {"wpack": 32 * 32 // 2}


def test_nvidia_s_compiler_gets_the_ptx_and_every_other_the_emulation(monkeypatch):
    layer = conv(**RESNET_3X3)
    nv, other = mh.preprocessed(V, layer, pick(layer, H16, CPASYNC=3, LDSM=1, EPI=1),
                                monkeypatch)
    for ins in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                "cp.async.commit_group", "cp.async.wait_group 1", "cvt.rn.f16x2.f32",
                "cvt.f32.f16", "ld.global.nc.v4.u32"):
        assert ins in nv, ins
    assert "half_bits" not in nv and "lx[lane]" not in nv and "vstore_half2_rte" not in nv
    assert "half_bits(wa_ & 0xffffu)" in other and "lx[lane]" in other
    assert "half_bits((w0) & 0xffffu)" in other and "vstore_half2_rte((float2)(v.s0, v.s1)" \
        in other


# -- the PTX through clang (nvptx) and ptxas ---------------------------------------------------

PTX_POINTS = mh.ptx_points(32)             # BK 32 and 64: 64 and 128 bytes of k


def test_the_kernel_compiles_to_ptx_that_ptxas_assembles_for_sm_90(tmp_path, monkeypatch):
    """clang's OpenCL front end and nvptx back end (the stand-in for NVIDIA's compiler, absent
    here) compile the whole kernel with its inline PTX, and ptxas assembles it for sm_90 (the
    H100), at points across the data-movement knobs: the asm statements' operands bind as
    their constraints say (a __local pointer as the 32-bit shared address, a global one as
    64 bits), no register spills, and the registers() estimate within 35% of ptxas's count.
    The staged epilogue (EPI = 1) stores the output and reads the residual in 16-byte vectors
    (st.global.v4, ld.global.nc.v4), converting in registers (cvt.rn.f16x2.f32), never
    through a private array in local memory; the direct one (EPI = 0) has no vector store.
    What the instructions compute is tested through the emulation (PoCL) and on the H100."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((8, 64, 14, 14), res=True, out=64, kernel=3, pad=1, act="relu")

    def check_ptx(cfg, p, ptx):
        stores = re.findall(r"st\.global\.v4\.u32", ptx)
        assert bool(stores) == bool(cfg["EPI"]), cfg
        if cfg["EPI"]:
            # one store per 16-byte vector: MI passes of E_ITERS vectors each
            assert len(stores) == p["MI"] * p["E_ITERS"], (cfg, len(stores))
            assert "cvt.rn.f16x2.f32" in ptx and "ld.global.nc.v4.u32" in ptx
            assert "st.local" not in ptx and "ld.local" not in ptx, cfg

    mh.assert_ptx_assembles(V, layer, H16, PTX_POINTS,
                            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", tmp_path,
                            check_ptx)


# -- on PoCL: the emulated mma, ldmatrix and cp.async -----------------------------------------

# id -> (input shape, attributes, residual, points beside the fallback: knob values picked
# from the pruned space); across them every data-movement knob value, tails in M (N*P*Q not a
# multiple of BM), N (K not a multiple of BN) and R*S*C (not a multiple of BK)
SHAPES = {
    "k1_tails": ((2, 40, 7, 5), dict(out=40, kernel=1), False,
                 [dict(CPASYNC=3, LDSM=1, BK=16)]),
    "k3_p1_residual_relu": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu"), True,
                            [dict(DBUF=1, LDSM=1, PAD=0, BK=32)]),
    "k3_s2_nobias": ((1, 24, 11, 9), dict(out=16, kernel=3, stride=2, pad=1, bias=False),
                     False, [dict(CPASYNC=2, LDSM=0, BK=32)]),
    "k1_s2_odd_k": ((1, 24, 9, 9), dict(out=13, kernel=1, stride=2), False,
                    [dict(LDSM=1, BN=32, WN=4)]),
    "k7_s2_p3_tanh": ((1, 8, 13, 11), dict(out=8, kernel=7, stride=2, pad=3, act="tanh"),
                      False, [dict(CPASYNC=3, LDSM=1, BK=64)]),
    "k3x2_dilated_residual": ((1, 16, 10, 9), dict(out=24, kernel=[3, 2], stride=[1, 2],
                                                   dilation=[2, 1], pad=[2, 0], act="relu"),
                              True, [dict(CPASYNC=2, LDSM=1, BK=16)]),
}
SLOW = ("k7_s2_p3_tanh",)


@functools.lru_cache(maxsize=None)
def case(lid):
    shape, attrs, res, _ = SHAPES[lid]
    return mh.random_case(conv(shape, res=res, **attrs), lid)


run_point = functools.partial(mh.run_point, V)


def check_point(layer, xs, prm, cfg, ctx, program=None, source=None):
    return check_half_output(layer, xs, prm, cfg, run_point(layer, xs, prm, cfg, ctx, program,
                                                            source))


@pytest.mark.parametrize("lid", [pytest.param(lid, marks=pytest.mark.slow) if lid in SLOW
                                 else lid for lid in SHAPES])
def test_emulated_conv_mma_f16_nhwc_against_the_reference(emulated, lid):
    """The fallback and the shape's points of the space (DBUF, CPASYNC, LDSM, PAD 0)."""
    target, ctx = emulated
    layer, xs, prm = case(lid)
    points = [V.fallback(layer, target)] + [pick(layer, target, **w) for w in SHAPES[lid][3]]
    for cfg in points:
        check_point(layer, xs, prm, cfg, ctx)


# id -> (input shape, attributes, residual, the EPI = 1 point's other knob values): across them
# tails in M and N, bias or none, a residual or none, every activation (the slow tier has
# those not here), EPI = 1 with the register double buffer, with cp.async in 2 and 3 stages,
# with ldmatrix (B by .x4 and by .x2), with neither (the plain pipeline), with PAD 0, a pass
# of more work-items than vectors (E_ITERS rounded up), and a pass larger than the stages
STAGED = {
    "tails_cpasync3_ldsm": ((2, 40, 7, 5), dict(out=40, kernel=1), False,
                            dict(BN=64, CPASYNC=3, LDSM=1, BK=16)),
    "residual_nobias_relu_dbuf": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu",
                                                      bias=False), True,
                                  dict(DBUF=1, LDSM=0, PAD=0)),
    "residual_tanh_cpasync2_ldsm": ((1, 16, 10, 9), dict(out=24, kernel=[3, 2], stride=[1, 2],
                                                         dilation=[2, 1], pad=[2, 0],
                                                         act="tanh"), True,
                                    dict(CPASYNC=2, LDSM=1, BK=16)),
    "ldsm_x2_half_a_pass": ((1, 24, 11, 9), dict(out=16, kernel=3, stride=2, pad=1,
                                                 bias=False), False,
                            dict(LDSM=1, BN=32, WN=4, DBUF=0, CPASYNC=0)),
    "pass_beyond_the_stages": ((1, 16, 12, 12), dict(out=72, kernel=1, act="relu"), True,
                               dict(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0,
                                    CPASYNC=0, LDSM=0)),
    **{f"act_{a}": ((1, 8, 6, 6), dict(out=16, kernel=3, pad=1, act=a, **extra), False,
                    dict(DBUF=0, CPASYNC=0, LDSM=0))
       for a, extra in (("sigmoid", {}), ("leaky_relu", dict(alpha=0.1)), ("relu6", {}),
                        ("clip", dict(min=-0.5, max=0.25)),
                        ("hardsigmoid", dict(alpha=0.3, beta=0.4)), ("hardswish", {}),
                        ("silu", {}), ("gelu", {}), ("gelu_tanh", {}))},
}
STAGED_QUICK = ("act_hardsigmoid",)        # alpha * x + beta: a product and a sum to fuse


@pytest.mark.parametrize("sid", [
    pytest.param(sid, marks=pytest.mark.slow)
    if sid.startswith("act_") and sid not in STAGED_QUICK else sid for sid in STAGED])
def test_the_staged_epilogue_is_bitwise_the_direct_one(emulated, sid):
    """EPI = 1 stores exactly what EPI = 0 stores at the same point (the same FP32 sums, bias,
    residual, activation and rounding, per element), and so matches the float64 reference
    within the half tolerance; its local memory is what PoCL reports for the kernel."""
    target, ctx = emulated
    layer, xs, prm, staged, p = mh.staged_case(V, STAGED, sid, target)
    if sid == "ldsm_x2_half_a_pass":
        assert p["ECHK"] and p["NI"] % 2 == 1
    if sid == "pass_beyond_the_stages":
        stages = p["NBUF"] * (staged["BM"] + staged["BN"]) * p["LD"]
        assert p["SMEM"] == 64 * (128 + 8) > stages and p["MCHK"] and p["NCHK"]
    if sid.startswith("tails"):
        assert p["MCHK"] and p["NCHK"]
    mh.assert_staged_is_direct(V, layer, xs, prm, staged, ctx, check_point)


def test_the_check_sees_a_wrong_layout(emulated):
    """The same kernel read back as if it wrote NCHW is far from the reference: the tests above
    pass because the output is NHWC, not whatever the check would accept."""
    target, ctx = emulated
    mh.assert_the_check_sees_a_wrong_layout(V, case("k3_p1_residual_relu"), target, ctx,
                                            "fp32")


def test_every_finite_half_passes_through_exactly(emulated):
    """An identity 1x1 conv over all 63488 finite halves (subnormals, zeros, the largest): the
    uint4 loads, the packing, the fragments and the half2 stores put every value at its own
    pixel and channel, and the decoding of the bits is exact, so the output is the input."""
    target, ctx = emulated
    bits = np.arange(1 << 16, dtype=np.uint16)
    vals = bits.view(np.float16)
    vals = vals[np.isfinite(vals)].astype(np.float32)
    assert vals.size == 16 * 62 * 64
    layer = conv((1, 16, 62, 64), out=16, kernel=1, bias=False)
    x = vals.reshape(1, 16, 62, 64)
    w = np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1)
    out = run_point(layer, [x], {"weight": w}, V.fallback(layer, target), ctx)
    assert np.array_equal(out, x)


# -- on an NVIDIA GPU: the inline PTX -----------------------------------------------------------

@pytest.fixture
def gpu():
    from devices import h100_tensor_cores
    return h100_tensor_cores("fp16")


@pytest.mark.gpu
def test_ptx_conv_mma_f16_nhwc_against_the_reference(gpu, monkeypatch):
    """The tensor cores on every layer of SHAPES at the fallback, the shape's own points, the
    first point of the space with DBUF alone, CPASYNC 2, CPASYNC 3, LDSM and EPI, and the
    fallback's twin with EPI = 1 (44 points), each within the half tolerance and one half ulp
    of the half model; the driver's binary holds the f16 mma (and cp.async, ldmatrix where
    asked, the 16-byte stores where EPI = 1), and the fallback's EPI = 1 twin stores bitwise
    what the fallback stores. Every point is tried and the outcome of each printed (`pytest
    -s`); the test fails where a point computes a wrong answer or fails to launch, or a point
    with only measured knobs does not build. A point with CPASYNC, LDSM or EPI that the driver
    does not build is reported (printed and warned, naming layer, point and log), not failed:
    the tuner prunes such a point as build_failed."""
    target, ctx = gpu
    monkeypatch.delenv(EMULATE_ENV, raising=False)

    def check_binary(cfg, binary):
        assert b"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in binary, \
            "the f16 mma in the binary"
        assert (b"cp.async" in binary) == bool(cfg["CPASYNC"]), "cp.async in the binary"
        assert (b"ldmatrix" in binary) == bool(cfg["LDSM"]), "ldmatrix in the binary"
        assert (b"st.global.v4" in binary) == bool(cfg["EPI"]), "16-byte stores"

    mh.ptx_sweep(V, SHAPES, case, target, ctx, check_point, check_binary)


# -- an fp16 library on PoCL --------------------------------------------------------------------

def test_an_fp16_library_runs_it_in_nhwc_and_checks_against_the_half_model(emulated, tmp_path,
                                                                           monkeypatch):
    """conv_mma_f16_nhwc recorded fastest for c1, c2 (with the add fused in, relu after it) and
    c3, the last two with the staged epilogue (EPI = 1): the fp16 build runs them in NHWC,
    converting c0's output (C = 3 in: another variant, NCHW) once for both of its readers and
    c3's back for the pool, and --check against the half model passes."""
    res = mh.library_on_the_variant(V, "halfnhwc", "fp16", tmp_path, monkeypatch)
    assert res.check_reference.startswith("the float64 numpy reference with every weight")
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE
    report = (tmp_path / "out" / "report.md").read_text()
    assert "on the tensor cores (f16 products, exact in FP32) in 3 of 5 conv and dense layers " \
           "(c1, c2, c3)" in report

"""conv_im2col, conv_winograd, dense_gemv and dense_gemm on PoCL against reference.forward.

Each workload table covers the variant's whole declared domain (odd sizes, primes, partial
tiles, strides, pads incl. asymmetric, dilation, groups where supported, bias on/off, every
fused act, batch 1 and > 1). Each layer runs several configurations: the fallbacks for PoCL and
for the H100, random valid points of the H100 space (the one the lead tunes; PoCL's limits are
looser, so they run here too) and extreme corners where valid. The scratch buffer and the
variant's own buffers are filled with NaN before set_params, so a kernel that relies on zeroed
memory or leaves padding unwritten fails. Device-free checks at the end: domains with reasons,
fallbacks valid on every target, the Winograd matrices exact, the layer memo honest.
"""
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, reference
from aotconv.graph import Layer, count
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config
from aotconv.variants.gemm_tiles import is_valid

POCL, H100 = TARGETS["pocl-cpu"], TARGETS["h100"]
# per-chunk launches of one kernel need independent kernel objects (their args differ)
pytestmark = pytest.mark.filterwarnings("ignore::pyopencl.RepeatedKernelRetrieval")


def make(op, shape, pad4=None, **raw):
    a = ops.normalise(op, raw)
    if pad4 is not None:                         # asymmetric pads, as `same` produces them
        a["pad"] = tuple(pad4)
    out, params = ops.infer(op, a, [tuple(shape)])
    return Layer(op, op, a, ["input"], in_shapes=[tuple(shape)], out_shape=out, params=params)


def conv(shape, **raw):
    return make("conv", shape, **raw)


def dense(shape, **raw):
    return make("dense", shape, **raw)


# -- configurations -------------------------------------------------------------------------

def random_valid(variant, layer, target, rng, n, tries=20000):
    """n distinct random points of the space that pass every constraint and device limit."""
    knobs = variant.knobs(layer, target)
    out = []
    for _ in range(tries):
        cfg = Config(tuple((k.name, k.values[rng.integers(len(k.values))]) for k in knobs))
        if cfg not in out and is_valid(variant, layer, cfg, target):
            out.append(cfg)
            if len(out) == n:
                break
    return out


def corner(variant, layer, target, **want):
    """The fallback with `want` overridden, if that point is valid (else None)."""
    d = variant.fallback(layer, target).as_dict()
    d.update(want)
    cfg = Config(tuple((k.name, d[k.name]) for k in variant.knobs(layer, target)))
    return cfg if is_valid(variant, layer, cfg, target) else None


BIG = dict(MWG=128, NWG=128, KWG=32, MDIMC=16, NDIMC=16, VWM=4, VWN=4, PRE=1)
SMALL = dict(MWG=16, NWG=16, KWG=8, MDIMC=8, NDIMC=8, VWM=1, VWN=1, PRE=0)
ODD = dict(MWG=32, NWG=64, KWG=8, MDIMC=16, NDIMC=8, VWM=2, VWN=1, PRE=0)


def configs_for(variant, layer, n_random, corners=()):
    """Both fallbacks, n_random random valid points, then the corners that are valid."""
    seed = zlib.crc32(f"{variant.name}{layer.signature_str()}".encode())
    rng = np.random.default_rng(seed)
    cfgs = [variant.fallback(layer, POCL), variant.fallback(layer, H100)]
    cfgs += random_valid(variant, layer, H100, rng, n_random)
    for want in corners:
        c = corner(variant, layer, H100, **want)
        if c is not None:
            cfgs.append(c)
    seen, out = set(), []
    for c in cfgs:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


# -- running --------------------------------------------------------------------------------

_refs = {}


def data_and_reference(layer):
    """Random inputs and params (never zeros) and the float64 reference, cached per layer."""
    key = layer.signature_str()
    if key not in _refs:
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        xs, ps = harness.random_inputs(layer, rng)
        _refs[key] = (xs, ps, reference.forward(layer, xs, ps))
    return _refs[key]


def run_poisoned(layer, variant, cfg):
    """Build and run with NaN in the scratch and variant buffers before set_params."""
    cl = harness.cl()
    ctx, queue, _ = harness.context_for(POCL)
    xs, ps, ref = data_and_reference(layer)
    r = harness.LayerRun(ctx, queue, layer, variant, cfg)
    bufs = list(r.extra.values()) + ([r.scratch] if r.scratch is not None else [])
    for b in bufs:
        cl.enqueue_copy(queue, b, np.full(b.size // 4, np.nan, np.float32))
    r.set_inputs(xs)
    r.set_params(ps)
    r.poison_output()
    r.run()
    return r.read_output(), ref


def check(layer, variant, cfg):
    assert variant.supports(layer) is None
    out, ref = run_poisoned(layer, variant, cfg)
    ok, err = harness.close(out, ref)
    assert ok, f"{variant.name} [{cfg}] on {layer.signature_str()}: max hybrid error {err:.3g}"


def params_for(table, variant_name, n_random, corners=()):
    """pytest parameters (layer, cfg) with readable ids; layer i also gets corner i mod len
    (one extreme point per layer keeps the suite within its time budget on two cores).
    make test runs one configuration of each layer, layer i its i-th (mod their count), so
    that every layer and every kind of point runs; the others are in the slow tier."""
    v = BY_NAME[variant_name]
    out = []
    for i, (lid, layer) in enumerate(table):
        mine = [corners[i % len(corners)]] if corners else []
        cfgs = configs_for(v, layer, n_random, mine)
        for j, cfg in enumerate(cfgs):
            out.append(pytest.param(layer, cfg, id=f"{lid}[{cfg}]",
                                    marks=() if j == i % len(cfgs) else pytest.mark.slow))
    return out


# -- conv_im2col: every convolution -----------------------------------------------------------

IM2COL_LAYERS = [
    ("k5_s2_p2_prime_nobias_tanh", conv((1, 3, 17, 13), out=7, kernel=5, stride=2, pad=2,
                                        bias=False, act="tanh")),
    ("g2_n2_relu", conv((2, 6, 9, 9), out=10, kernel=3, pad=1, groups=2, act="relu")),
    ("dil2_asym_pad_n3", conv((3, 8, 11, 11), out=16, kernel=3, pad=[1, 2], dilation=2)),
    ("depthwise_s2x1_leaky", conv((2, 12, 10, 7), out=12, kernel=3, groups=12, stride=[2, 1],
                                  pad=1, act="leaky_relu", alpha=0.2)),
    ("same_k4_s2_sigmoid", conv((4, 5, 7, 7), out=3, kernel=4, stride=2, pad="same",
                                act="sigmoid")),
    ("c64_k3_deep_k", conv((1, 64, 14, 14), out=96, kernel=3, pad=1, act="relu")),
    ("k1x3_dil1x2_g3_n8", conv((8, 6, 5, 9), out=9, kernel=[1, 3], dilation=[1, 2], groups=3,
                                pad=[0, 2], bias=False)),
    ("window_is_input", conv((2, 16, 6, 6), out=33, kernel=6)),
]


@pytest.mark.parametrize("layer,cfg", params_for(
    IM2COL_LAYERS, "conv_im2col", 1,
    corners=[dict(BIG), dict(SMALL, KSPLIT=4), dict(ODD, KSPLIT=2, IMGS=1)]))
def test_conv_im2col(layer, cfg):
    check(layer, BY_NAME["conv_im2col"], cfg)


# -- conv_winograd: 3x3, stride 1, dilation 1, groups 1, any pad and batch --------------------

WINO_LAYERS = [
    ("nopad_nobias", conv((1, 3, 8, 8), out=4, kernel=3, bias=False)),
    ("pad1_partial_tiles_n2_relu", conv((2, 5, 9, 7), out=6, kernel=3, pad=1, act="relu")),
    ("pad2x0_prime_n3_tanh", conv((3, 17, 13, 11), out=9, kernel=3, pad=[2, 0], act="tanh")),
    ("asym_pad_leaky", conv((1, 7, 10, 9), out=5, kernel=3, pad4=(0, 1, 2, 0),
                            act="leaky_relu", alpha=0.1)),
    ("c40_same_sigmoid", conv((1, 40, 6, 6), out=36, kernel=3, pad="same", act="sigmoid")),
    ("out_1x1", conv((2, 2, 3, 3), out=3, kernel=3)),
]


@pytest.mark.parametrize("layer,cfg", params_for(
    WINO_LAYERS, "conv_winograd", 1,
    corners=[dict(BIG, M=4), dict(SMALL, M=4), dict(ODD, M=4)]))
def test_conv_winograd(layer, cfg):
    check(layer, BY_NAME["conv_winograd"], cfg)


# -- dense_gemv and dense_gemm: dense layers and convolutions that are dense ------------------

GEMV_LAYERS = [
    ("flatten_k105_relu", dense((1, 3, 5, 7), out=13, act="relu")),
    ("n4_nobias", dense((4, 64, 1, 1), out=37, bias=False)),
    ("conv6x6_over_6x6_n2_tanh", conv((2, 16, 6, 6), out=33, kernel=6, act="tanh")),
    ("conv1x1_over_1x1_n3_leaky", conv((3, 40, 1, 1), out=7, kernel=1, act="leaky_relu")),
    ("n16_sigmoid", dense((16, 128, 2, 2), out=29, act="sigmoid")),
    ("k1000_out10_split", dense((1, 1000, 1, 1), out=10)),
]


@pytest.mark.parametrize("layer,cfg", params_for(
    GEMV_LAYERS, "dense_gemv", 1,
    corners=[dict(WG=32, R=1, VW=1, U=1, KSPLIT=1), dict(WG=64, R=8, VW=4, U=4, KSPLIT=1),
             dict(WG=32, R=1, VW=4, U=1, KSPLIT=8)]))
def test_dense_gemv(layer, cfg):
    check(layer, BY_NAME["dense_gemv"], cfg)


GEMM_LAYERS = [
    ("flatten_k105_n1", dense((1, 3, 5, 7), out=13, act="relu")),
    ("n37_nobias", dense((37, 64, 1, 1), out=37, bias=False)),
    ("conv6x6_n5_tanh", conv((5, 16, 6, 6), out=33, kernel=6, act="tanh")),
    ("n20_k1000_leaky", dense((20, 1000, 1, 1), out=10, act="leaky_relu", alpha=0.1)),
    ("n64_vec_store", dense((64, 256, 2, 2), out=96)),
    ("conv1x1_over_1x1_n3", conv((3, 40, 1, 1), out=7, kernel=1, act="sigmoid")),
]


@pytest.mark.parametrize("layer,cfg", params_for(
    GEMM_LAYERS, "dense_gemm", 1,
    corners=[dict(BIG), dict(SMALL, KSPLIT=4), dict(ODD, KSPLIT=2)]))
def test_dense_gemm(layer, cfg):
    check(layer, BY_NAME["dense_gemm"], cfg)


# -- device-free: domains, fallbacks, spaces, transforms -------------------------------------

DOMAIN = [
    # (layer, {variant: supported?})
    (conv((1, 4, 9, 9), out=4, kernel=3, pad=1),
     dict(conv_im2col=True, conv_winograd=True, dense_gemv=False, dense_gemm=False)),
    (conv((1, 4, 9, 9), out=4, kernel=3, stride=2),
     dict(conv_im2col=True, conv_winograd=False)),
    (conv((1, 4, 9, 9), out=4, kernel=3, dilation=2),
     dict(conv_im2col=True, conv_winograd=False)),
    (conv((1, 4, 9, 9), out=4, kernel=3, groups=2),
     dict(conv_im2col=True, conv_winograd=False)),
    (conv((1, 4, 9, 9), out=4, kernel=5),
     dict(conv_im2col=True, conv_winograd=False)),
    (conv((1, 4, 6, 6), out=8, kernel=6),
     dict(conv_im2col=True, conv_winograd=False, dense_gemv=True, dense_gemm=True)),
    (conv((2, 4, 6, 6), out=8, kernel=6, stride=3),          # still one output pixel
     dict(dense_gemv=True, dense_gemm=True)),
    (conv((1, 4, 4, 4), out=8, kernel=6, pad=1),              # covers the padded input only
     dict(conv_im2col=True, dense_gemv=False, dense_gemm=False)),
    (conv((1, 4, 6, 6), out=8, kernel=6, groups=2),
     dict(dense_gemv=False, dense_gemm=False)),
    (conv((1, 4, 6, 6), out=8, kernel=3),
     dict(dense_gemv=False, dense_gemm=False)),
    (conv((1, 4, 1, 1), out=8, kernel=1, dilation=3),         # one tap: dilation is moot
     dict(dense_gemv=True, dense_gemm=True)),
    (dense((16, 4, 3, 3), out=8), dict(dense_gemv=True, dense_gemm=True, conv_im2col=False)),
    (dense((17, 4, 3, 3), out=8), dict(dense_gemv=False, dense_gemm=True)),
]


@pytest.mark.parametrize("layer,expect", DOMAIN, ids=[l.signature_str() for l, _ in DOMAIN])
def test_domains(layer, expect):
    listed = {v.name for v in for_layer(layer)}
    for name, ok in expect.items():
        why = BY_NAME[name].supports(layer)
        if ok:
            assert why is None, f"{name}: {why}"
        else:
            assert isinstance(why, str) and why, f"{name} should refuse, with a reason"
        assert (name in listed) == ok


FALLBACK_LAYERS = [l for _, l in IM2COL_LAYERS + WINO_LAYERS + GEMV_LAYERS + GEMM_LAYERS] + [
    conv((1, 512, 14, 14), out=512, kernel=3, pad=1),            # VGG conv5: split-K fallback
    conv((128, 3, 227, 227), out=96, kernel=11, stride=4),        # AlexNet conv1 at N = 128
    conv((5, 256, 6, 6), out=4096, kernel=6),                     # AlexNet fc6 in disguise
    dense((128, 9216, 1, 1), out=4096),
    dense((1, 84, 1, 1), out=10),
    conv((1, 3, 3, 3), out=1, kernel=3),
]


@pytest.mark.parametrize("name", ["conv_im2col", "conv_winograd", "dense_gemv", "dense_gemm"])
def test_fallback_valid_on_every_target(name):
    v = BY_NAME[name]
    for layer in FALLBACK_LAYERS:
        if v.supports(layer) is not None:
            continue
        for t in TARGETS.values():
            cfg = v.fallback(layer, t)
            assert is_valid(v, layer, cfg, t), f"{name} fallback {cfg} on {t.name}"
            launches = v.launches(layer, cfg, "k")
            for l in launches:
                assert l.kernel == "k" or l.kernel.startswith("k_")
                if l.lsize:
                    assert all(g % s == 0 for g, s in zip(l.gsize, l.lsize)), l
            assert any(l.phase == "run" for l in launches)
            assert (v.scratch_floats(layer, cfg) > 0) == any(
                a.kind == "scratch" for l in launches for a in l.args)


def test_fallbacks_fill_the_h100():
    """Untuned H100 builds must not leave most SMs idle on deep layers at batch 1."""
    vgg5 = conv((1, 512, 14, 14), out=512, kernel=3, pad=1)
    cfg = BY_NAME["conv_im2col"].fallback(vgg5, H100)
    groups = 1
    for l in BY_NAME["conv_im2col"].launches(vgg5, cfg, "k"):
        if l.kernel == "k_gemm":
            groups = (l.gsize[0] // l.lsize[0]) * (l.gsize[1] // l.lsize[1]) * l.gsize[2]
    assert groups >= H100.compute_units, (cfg, groups)
    fc8 = dense((1, 4096, 1, 1), out=1000)
    cfg = BY_NAME["dense_gemv"].fallback(fc8, H100)
    assert -(-1000 // cfg["R"]) * cfg["KSPLIT"] >= H100.compute_units


def test_tunables_visible_at_top():
    """Readable kernels: knobs and sizes are #defines before the first kernel."""
    layer = conv((2, 6, 9, 9), out=10, kernel=3, pad=1, groups=2)
    for name in ("conv_im2col", "conv_winograd"):
        v = BY_NAME[name]
        if v.supports(layer) is not None:
            layer = conv((2, 6, 9, 9), out=10, kernel=3, pad=1)
        cfg = v.fallback(layer, H100)
        src = v.render(layer, cfg, "k")
        head = src[:src.index("__kernel")]
        for knob, value in cfg.items:
            assert f"#define {knob} {value}" in head, (name, knob)


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_matrices_exact(m):
    """A^T [(G g G^T) * (B^T d B)] A is the valid 3x3 correlation of d, in exact arithmetic."""
    from fractions import Fraction
    from aotconv.variants.conv_winograd import MATRICES
    g_, bt, at = (np.array(x, dtype=object) for x in MATRICES[m])
    rng = np.random.default_rng(m)
    d = np.array([[Fraction(int(v)) for v in row] for row in rng.integers(-9, 9, (m + 2, m + 2))])
    g = np.array([[Fraction(int(v)) for v in row] for row in rng.integers(-9, 9, (3, 3))])
    y = at.dot(g_.dot(g).dot(g_.T) * bt.dot(d).dot(bt.T)).dot(at.T)
    want = np.array([[sum(d[i + a, j + b] * g[a, b] for a in range(3) for b in range(3))
                      for j in range(m)] for i in range(m)])
    assert (y == want).all()


def test_winograd_f4_constraint_is_the_measured_domain():
    from aotconv.variants.conv_winograd import F4_MAX_C
    v = BY_NAME["conv_winograd"]
    con = next(c for c in v.constraints if c.name == "f4_accuracy")
    for c, ok in ((F4_MAX_C, True), (F4_MAX_C + 1, False)):
        layer = conv((1, c, 4, 4), out=1, kernel=3, pad=1)
        assert con.check(layer, Config.of(M=4), H100) is ok
        assert con.check(layer, Config.of(M=2), H100)


def test_layer_memo_sees_changes():
    """The constraint memo must not serve stale sizes when a layer object is reused."""
    from aotconv.variants.conv_im2col import _dims
    layer = conv((1, 4, 9, 9), out=4, kernel=3, pad=1)
    assert _dims(layer)["KDIM"] == 36
    layer.attrs["kernel"] = (1, 1)
    assert _dims(layer)["KDIM"] == 4


def test_scratch_sizes_cover_the_kernels():
    """scratch_floats is what the launches index: col (+ partials) for im2col."""
    v = BY_NAME["conv_im2col"]
    layer = conv((2, 16, 9, 9), out=10, kernel=3, pad=1, groups=2)
    cfg = corner(v, layer, H100, **dict(SMALL, KSPLIT=1, IMGS=1))
    cfg2 = corner(v, layer, H100, **dict(SMALL, KSPLIT=2, IMGS=1))
    assert cfg is not None and cfg2 is not None
    ncp = 96           # 81 columns -> 96 with NWG 16; MP = 16 (5 rows)
    assert v.scratch_floats(layer, cfg) == 2 * 72 * ncp               # K = 8 * 9 = 72
    assert v.scratch_floats(layer, cfg2) == 2 * 80 * ncp + 2 * 2 * 16 * ncp   # 2 x 40
    assert v.buffers(layer, cfg) == {"wpack": 2 * 72 * 16}

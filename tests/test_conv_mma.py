"""--precision and the tensor-core convolution conv_mma (TF32 mma.sync m16n8k8).

Device-free: the precision option (an unknown value refused naming the choices), TF32 rounding as cvt.rna
rounds, the TF32 tolerance (a bound the worst case reaches), conv_mma offered only to tf32
builds on tensor-core devices, its records never serving an fp32 build.

PoCL (the device tier): conv_mma with its mma emulated (AOTCONV_MMA_EMULATE, the test-only
switch) over kernel sizes, strides, pads, dilations, partial tiles and a fused residual,
against the float64 reference within the TF32 tolerance and against the TF32 operand model
(reference.forward on operands rounded to TF32) within FP32 accumulation: the fragments of
the ISA's layout, exchanged in local memory, compute exactly the TF32 products.

GPU (marker gpu, an NVIDIA device of compute capability 8.0 or newer): the inline PTX path,
the same checks.

Marked slow: three more shapes, five points of the space per shape, and a tf32 library built
on PoCL through records (its header, report and --check against the TF32 model).
"""
from dataclasses import replace
import functools
import zlib

import numpy as np
import pytest

from aotconv import cli, harness, ops, protocol, reference
from aotconv.context import with_precision
from aotconv.errors import AotconvError
from aotconv.graph import Layer
from aotconv.precision import check, round_tf32
from aotconv.space import layer_space, variant_space
from aotconv.targets import TARGETS
from aotconv.tune.measure import Outcome, Status, prepare_job, run_candidate
from aotconv.tune.records import Key, Store
from aotconv.tune.search import records_only
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV, has_tensor_cores

MMA = BY_NAME["conv_mma"]
H100 = TARGETS["h100"]
POCL = TARGETS["pocl-cpu"]


def conv(in_shape, **raw):
    a = ops.normalise("conv", dict(raw))
    out, params = ops.infer("conv", a, [tuple(in_shape)])
    return Layer("conv", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params)


def residual(in_shape, **raw):
    """A conv with an add fused in (passes.fuse_residual): a second input of the output's
    shape."""
    layer = conv(in_shape, **raw)
    layer.attrs = dict(layer.attrs, residual=True)
    layer.inputs = ["input", "skip"]
    layer.in_shapes = [tuple(in_shape), tuple(layer.out_shape)]
    return layer


def points(layer, target, n):
    """n points of conv_mma's pruned space for `layer`, spread over it."""
    pts = variant_space(layer, MMA, target, explain=False).points
    return [pts[i * (len(pts) - 1) // max(1, n - 1)] for i in range(n)] if n > 1 else pts[:1]


# -- the option ---------------------------------------------------------------------------------

def test_an_unknown_precision_is_refused_with_the_choices():
    with pytest.raises(AotconvError, match="--precision fp64: choose one of fp32, tf32, fp16"):
        check("fp64")
    assert check(None) == "fp32" and check("tf32") == "tf32" and check("fp16") == "fp16"


@pytest.mark.parametrize("argv", [["build", "lenet5", "--precision", "fp64"],
                                  ["tune", "lenet5", "--precision", "fp64"],
                                  ["space", "lenet5", "--precision", "fp64"]])
def test_the_cli_refuses_an_unknown_precision_in_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "choose one of fp32, tf32, fp16" in err
    assert "Traceback" not in err


# -- TF32 arithmetic ----------------------------------------------------------------------------

def test_round_tf32_is_cvt_rna():
    ulp = 2.0 ** -10                        # of TF32 at 1.0
    x = np.array([1.0, 1 + ulp / 2, 1 + ulp / 2 - 2 ** -23, -(1 + ulp / 2), 1 + 3 * ulp / 2,
                  3.0e-39, np.inf, -np.inf], np.float32)
    want = np.array([1.0, 1 + ulp, 1.0, -(1 + ulp), 1 + 2 * ulp, 3.0e-39, np.inf, -np.inf])
    got = round_tf32(x)
    keep = [0, 1, 2, 3, 4, 6, 7]
    assert np.array_equal(got[keep], want[keep].astype(np.float32))
    # a subnormal keeps the top 10 bits of its field: off by at most half of the 13 dropped
    assert not got[5:6].view(np.uint32) & 0x1FFF and abs(got[5] - x[5]) <= 2.0 ** (-149 + 12)
    assert np.isnan(round_tf32(np.array([np.nan], np.float32))[0])
    r = round_tf32(np.random.default_rng(0).standard_normal(1000).astype(np.float32))
    assert not np.any(r.view(np.uint32) & 0x1FFF)


def test_the_tf32_allowance_bounds_the_worst_case_and_is_reached():
    """The allowance L(2u + u^2) sum|w||x| holds for random data, and operands that each round
    by almost half an ulp (in the same direction) bring the error within 1% of it."""
    layer = conv((1, 16, 6, 6), out=8, kernel=3, pad=1, bias=False)
    rng = np.random.default_rng(1)
    xs, prm = harness.random_inputs(layer, rng)
    exact = reference.forward(layer, xs, prm)
    model = reference.forward(layer, [round_tf32(xs[0])], {"weight": round_tf32(prm["weight"])})
    allow = protocol.tf32_allowance(layer, xs, prm)
    assert np.all(np.abs(model - exact) <= allow)
    worst = np.float32(1 + 2.0 ** -11 - 2.0 ** -23)       # rounds down by almost 2^-11
    x = np.full(layer.in_shape, worst, np.float32)
    w = np.full(dict(layer.params)["weight"], worst, np.float32)
    exact = reference.forward(layer, [x], {"weight": w})
    model = reference.forward(layer, [round_tf32(x)], {"weight": round_tf32(w)})
    allow = protocol.tf32_allowance(layer, [x], {"weight": w})
    ratio = np.abs(model - exact) / allow
    assert ratio.max() <= 1 and ratio.min() > 0.99


def test_the_tf32_check_adds_the_allowance_to_the_fp32_tolerance():
    layer = conv((1, 4, 5, 5), out=3, kernel=3, act="sigmoid")
    rng = np.random.default_rng(2)
    xs, prm = harness.random_inputs(layer, rng)
    ref = protocol.Reference(layer, xs, prm)
    want = ref.expected()
    allow = protocol.tf32_allowance(layer, xs, prm)
    assert protocol.act_lipschitz(layer.attrs) == 0.25
    slack = protocol.TOLERANCE * np.maximum(1, np.abs(want)) + allow
    assert ref.check(want + 0.99 * slack, precision="tf32")["ok"]
    assert not ref.check(want + 1.01 * slack, precision="tf32")["ok"]
    assert not ref.check(want + 0.99 * slack)["ok"]           # fp32 alone: no allowance
    with pytest.raises(ValueError):
        ref.check(want, precision="fp16")


def test_the_summary_says_which_layers_compute_in_tf32():
    from aotconv.choose import Choice
    from aotconv.precision import summary
    choices = {"c1": Choice("conv_mma", Config()), "p": Choice("pool_direct", Config()),
               "c2": Choice("conv_igemm", Config()), "c3": Choice("conv_mma", Config())}
    assert summary(choices, "tf32") == (
        "tf32", "FP32 storage; TF32 tensor-core math with FP32 accumulation in 2 of 3 conv "
                "layers (c1, c3); FP32 math everywhere else")
    del choices["c1"], choices["c3"]
    assert summary(choices) == ("fp32", "FP32 storage and math in every layer")
    p, text = summary(choices, "tf32")
    assert p == "fp32" and "--precision tf32 asked for TF32" in text and "none did" in text


def test_the_tf32_model_of_a_network_rounds_the_folded_weights():
    """network_reference: a conv with a batchnorm folded into it multiplies the folded weight
    rounded to TF32; the layers not named stay exact."""
    from aotconv.passes import optimise
    from aotconv.precision import network_reference
    from aotconv.reference import random_network_params, run_network
    from aotconv.spec import network_from_dict
    src = network_from_dict({"name": "n", "input": [1, 6, 7, 7], "layers": [
        {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "pad": 1, "bias": False},
        {"name": "bn", "op": "batchnorm", "act": "relu"},
        {"name": "c2", "op": "conv", "out": 4, "kernel": 1}]})
    net = optimise(src)
    assert net.layer("c1").fused == ["bn"]
    prm = random_network_params(src, np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal(src.input_shape).astype(np.float32)
    assert np.array_equal(network_reference(src, net, x, prm, [])[0],
                          run_network(src, x, prm)[0])
    q = prm["bn"]
    sc = q["gamma"].astype(np.float64) / np.sqrt(q["var"].astype(np.float64) + 1e-5)
    w = round_tf32((prm["c1"]["weight"] * sc.reshape(-1, 1, 1, 1)).astype(np.float32))
    b = ((0 - q["mean"].astype(np.float64)) * sc + q["beta"]).astype(np.float32)
    a = dict(net.layer("c1").attrs)
    y = reference.conv(round_tf32(x).astype(np.float64), w.astype(np.float64),
                       b.astype(np.float64), a, net.layer("c1").out_shape)
    want = reference.forward(src.layer("c2"), [y], prm["c2"])
    got = network_reference(src, net, x, prm, ["c1"])[0]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    assert not np.allclose(got, run_network(src, x, prm)[0], rtol=0, atol=1e-6)


# -- where conv_mma is offered ------------------------------------------------------------------

def _mma_part(layer, target):
    return variant_space(layer, MMA, target, explain=False)


def test_conv_mma_is_offered_only_to_tf32_builds_on_tensor_cores():
    layer = conv((8, 64, 28, 28), out=128, kernel=3, pad=1, act="relu")
    # an fp32 build's spaces leave it out; its own constraint would prune it anyway
    sp = layer_space(layer, H100, variants=[MMA])
    assert not sp.parts and sp.unsupported == [
        ("conv_mma", "conv_mma computes in TF32: only a build of --precision tf32 runs it")]
    part = _mma_part(layer, H100)
    assert not part.points and part.first["build.precision"] == part.total
    assert _mma_part(layer, with_precision(H100, "tf32")).points
    for t, cc in ((H100, ()), (H100, (7, 5)), (TARGETS["gtx1080"], (6, 1)), (POCL, ())):
        part = _mma_part(layer, replace(t, precision="tf32", compute_capability=cc))
        assert not part.points and part.first["tensor_cores"] == part.total, (t.name, cc)
    assert has_tensor_cores(replace(H100, compute_capability=(8, 0)))
    assert "conv_mma needs groups 1, not 2" in MMA.supports(conv((1, 4, 5, 5), out=4,
                                                                  kernel=3, groups=2))


def test_conv_mma_records_never_serve_an_fp32_build(tmp_path):
    """A recorded conv_mma point faster than everything else: a tf32 build takes it, an fp32
    build of the same target and records does not."""
    layer = conv((8, 64, 28, 28), out=128, kernel=3, pad=1, act="relu")
    tf32 = with_precision(H100, "tf32")
    store = Store(read=[tmp_path / "r.jsonl"], write=[tmp_path / "r.jsonl"])
    mma_cfg = MMA.fallback(layer, tf32)
    igemm = BY_NAME["conv_igemm"]
    store.append(Key(layer, MMA, tf32), mma_cfg, Outcome(Status.OK, 0.01, (0.01,)))
    store.append(Key(layer, igemm, H100), igemm.fallback(layer, H100),
                 Outcome(Status.OK, 1.0, (1.0,)))
    sig = layer.signature_str()
    assert records_only([[layer]], tf32, store)[sig].best.variant == "conv_mma"
    best = records_only([[layer]], H100, store)[sig].best
    assert best.variant == "conv_igemm"


def test_a_tf32_candidate_is_measured_with_the_tf32_tolerance():
    layer = conv((1, 8, 6, 6), out=16, kernel=3, pad=1)
    tf32 = with_precision(H100, "tf32")
    from aotconv.space import Candidate
    job = prepare_job(tf32, layer, Candidate("conv_mma", MMA.fallback(layer, tf32)), BY_NAME, [])
    assert job.precision == "tf32"
    igemm = BY_NAME["conv_igemm"]
    job = prepare_job(H100, layer, Candidate("conv_igemm", igemm.fallback(layer, H100)),
                      BY_NAME, [])
    assert job.precision == "fp32"


# -- on PoCL: the emulated mma ------------------------------------------------------------------

# id -> (input shape, attributes, residual); odd sizes leave partial tiles in M, N and K
SHAPES = {
    "k1_partial_tiles": ((2, 19, 7, 5), dict(out=33, kernel=1), False),
    "k3_s1_p1_relu": ((2, 13, 9, 11), dict(out=20, kernel=3, pad=1, act="relu"), False),
    "k3_s2_nobias": ((1, 8, 11, 9), dict(out=16, kernel=3, stride=2, pad=1, bias=False), False),
    "k7_s2_p3": ((1, 3, 17, 15), dict(out=8, kernel=7, stride=2, pad=3, act="tanh"), False),
    "k3x2_dilated_asym": ((1, 5, 10, 9), dict(out=7, kernel=[3, 2], stride=[1, 2],
                                              dilation=[2, 1], pad=[2, 0]), False),
    "k3_residual_relu": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu"), True),
}


@functools.lru_cache(maxsize=None)
def case(lid):
    shape, attrs, res = SHAPES[lid]
    layer = (residual if res else conv)(shape, **attrs)
    rng = np.random.default_rng(zlib.crc32(lid.encode()))
    xs, prm = harness.random_inputs(layer, rng)
    return layer, xs, prm


def model_of(layer, xs, prm):
    """The float64 reference on operands rounded to TF32: what the tensor cores multiply."""
    p = dict(prm, weight=round_tf32(prm["weight"]))
    return reference.forward(layer, [round_tf32(xs[0])] + list(xs[1:]), p)


def check_point(layer, xs, prm, cfg, target, ctx=None):
    out = harness.run_layer(layer, MMA, cfg, xs, prm, target=target, ctx=ctx)
    got = protocol.Reference(layer, xs, prm).check(out, precision="tf32")
    assert got["ok"], f"[{cfg}]: scaled error {got['error']:.3g} beyond the TF32 tolerance"
    ok, err = harness.close(out, model_of(layer, xs, prm), 1e-5)
    assert ok, f"[{cfg}]: {err:.3g} from the TF32 operand model"
    return out


@pytest.fixture
def emulated(monkeypatch, cl_ctx):
    monkeypatch.setenv(EMULATE_ENV, "1")
    return replace(POCL, precision="tf32"), cl_ctx


# the quick tier: a 1x1 with partial tiles in M, N and K, the 7x7 stride 2 pad 3, the fused
# residual (the library test below adds a 3x3 at stride 1 and 2); the rest are slow
QUICK = ("k1_partial_tiles", "k7_s2_p3", "k3_residual_relu")


# one point each, cycling through the space's spread so the knobs all move (DBUF, PAD, BK,
# warps along M and N); more points per shape are slow
@pytest.mark.parametrize("lid", [lid if lid in QUICK else pytest.param(lid, marks=pytest.mark.slow)
                                 for lid in SHAPES])
def test_emulated_conv_mma_against_the_reference(emulated, lid):
    target, ctx = emulated
    layer, xs, prm = case(lid)
    pts = points(layer, target, 5)
    cfg = pts[sorted(SHAPES).index(lid) % len(pts)]
    check_point(layer, xs, prm, cfg, target, ctx)


@pytest.mark.slow
@pytest.mark.parametrize("lid", list(SHAPES))
def test_emulated_conv_mma_over_its_space(emulated, lid):
    target, ctx = emulated
    layer, xs, prm = case(lid)
    for cfg in [MMA.fallback(layer, target)] + points(layer, target, 4):
        check_point(layer, xs, prm, cfg, target, ctx)


def test_the_runner_measures_conv_mma_with_the_tf32_tolerance(emulated):
    """The tuner's runner (in this process) measures a conv_mma candidate by its precision's
    tolerance: OK."""
    target, _ = emulated
    from aotconv.space import Candidate
    layer = conv((1, 16, 6, 6), out=32, kernel=3, pad=1)
    job = prepare_job(target, layer, Candidate("conv_mma", MMA.fallback(layer, target)),
                      BY_NAME, harness.BUILD_OPTIONS, repeats=(1, 1), min_total_ms=0.0)
    assert job.precision == "tf32"
    assert run_candidate(lambda s: None, target, job).status == Status.OK


def test_tf32_products_fail_the_fp32_tolerance_and_pass_their_own(emulated):
    """Inputs that cancel while their rounding errors add up: channel pairs x_a = 1 + 2^-11 -
    2^-23 (rounds down by almost 2^-11) and x_b = 1 + 2^-11 (a tie: rounds up by 2^-11) under
    weights +1 and -1, so each output is about 0 and off by 2^-10 per pair and tap. An FP32
    kernel passes (conv_igemm); conv_mma fails the FP32 tolerance by two orders and passes
    the TF32 one, on the same data."""
    target, ctx = emulated
    layer = conv((1, 64, 6, 6), out=32, kernel=3, pad=1, bias=False)
    x = np.empty(layer.in_shape, np.float32)
    x[:, 0::2], x[:, 1::2] = np.float32(1 + 2.0 ** -11 - 2.0 ** -23), np.float32(1 + 2.0 ** -11)
    w = np.ones(dict(layer.params)["weight"], np.float32)
    w[:, 1::2] = -1
    ref = protocol.Reference(layer, [x], {"weight": w})
    out = harness.run_layer(layer, MMA, MMA.fallback(layer, target), [x], {"weight": w},
                            target=target, ctx=ctx)
    assert ref.check(out, precision="tf32")["ok"]
    assert ref.check(out)["error"] > 100 * protocol.TOLERANCE
    igemm = BY_NAME["conv_igemm"]
    out = harness.run_layer(layer, igemm, igemm.fallback(layer, POCL), [x], {"weight": w},
                            target=target, ctx=ctx)
    assert ref.check(out)["ok"]


# -- on an NVIDIA GPU: the inline PTX -----------------------------------------------------------

@pytest.fixture
def gpu():
    from devices import h100_tensor_cores
    return h100_tensor_cores("tf32")


@pytest.mark.gpu
@pytest.mark.parametrize("lid", list(SHAPES))
def test_ptx_conv_mma_against_the_reference(gpu, lid, monkeypatch):
    """The tensor cores over the space's spread, and the emulation on the same device agrees."""
    target, ctx = gpu
    layer, xs, prm = case(lid)
    for cfg in [MMA.fallback(layer, target)] + points(layer, target, 6):
        out = check_point(layer, xs, prm, cfg, target, ctx)
    # the driver compiled the tensor-core path (its binary is PTX), not the emulation
    ptx = harness.build(ctx[0], MMA.render(layer, cfg, "k")).binaries[0]
    assert b"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
    assert b"cvt.rna.tf32.f32" in ptx
    monkeypatch.setenv(EMULATE_ENV, "1")
    emu = check_point(layer, xs, prm, cfg, target, ctx)
    assert harness.close(out, emu, 1e-5)[0]


# -- a tf32 library on PoCL ---------------------------------------------------------------------

NET = """name: tcnet
input: [2, 8, 9, 9]
layers:
  - {name: c1, op: conv, out: 16, kernel: 3, pad: 1, bias: false}
  - {name: bn1, op: batchnorm}
  - {name: r1, op: relu}
  - {name: c2, op: conv, out: 24, kernel: 3, stride: 2, act: relu}
  - {name: gap, op: global_avgpool}
  - {name: fc, op: dense, out: 5}
"""


@pytest.mark.slow
def test_a_tf32_library_says_so_and_checks_against_the_tf32_model(emulated, tmp_path,
                                                                  monkeypatch):
    """conv_mma recorded fastest for both convs (one with a batchnorm folded into it): the
    tf32 build runs it in both, its header and report say so, and --check compares with the
    reference whose TF32 layers' operands are rounded (the folded weights included)."""
    from aotconv.compiler import compile_network
    from aotconv.context import BuildContext
    from aotconv.passes import optimise
    from aotconv.spec import load_network
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    (tmp_path / "tcnet.yaml").write_text(NET)
    db = tmp_path / "records.jsonl"
    with BuildContext.make("pocl-cpu", mode="records", precision="tf32") as ctx:
        store = Store(write=[db])
        for name in ("c1", "c2"):
            layer = optimise(load_network(str(tmp_path / "tcnet.yaml"))).layer(name)
            store.append(Key(layer, MMA, ctx.target, ctx.device),
                         MMA.fallback(layer, ctx.target), Outcome(Status.OK, 1e-3, (1e-3,)))
    res = compile_network(str(tmp_path / "tcnet.yaml"), target="pocl-cpu",
                          outdir=tmp_path / "out", tune_mode="records", tuning_db=str(db),
                          check=True, quiet=True, precision="tf32")
    assert {n: c.variant for n, c in res.schedule.choices.items()
            if n in ("c1", "c2")} == {"c1": "conv_mma", "c2": "conv_mma"}
    assert "TF32 layers' operands rounded" in res.check_reference
    assert res.check_error <= 1e-5            # the emulation is the TF32 model, FP32 sums aside
    header = (tmp_path / "out" / "tcnet.h").read_text()
    assert '#define AOTCONV_TCNET_PRECISION "tf32"' in header
    assert "TF32 tensor-core math with FP32 accumulation in 2 of 2 conv layers (c1, c2)" in header
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Precision: FP32 storage; TF32 tensor-core math" in report

"""The activations beyond relu/sigmoid/tanh/leaky_relu: relu6, clip, hardsigmoid, hardswish,
silu, gelu and gelu_tanh, as layer ops and fused into every epilogue that takes an act.

Device-free: attribute defaults and errors, layer signatures (the extras appear only on the
layers that use them), fusion copying the extras, max-pool fusion refused after an act that
is not monotone, the float64 reference against the formulas, and rendering byte-identical to
the act helper as it was for the acts that existed before. Device (PoCL): each act fused into
conv and dense and as a standalone layer over a shape sweep, and once in the epilogue of every
other variant that takes an act, against reference.forward.
"""
import math
import shutil
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, passes, reference
from aotconv.errors import AotconvError
from aotconv.graph import ACT_OPS, ACTS, Layer, act_monotone
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, base
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]
NEW = ("relu6", "clip", "hardsigmoid", "hardswish", "silu", "gelu", "gelu_tanh")

# every new act with its parameter forms: (id, raw attributes)
ACT_CASES = [
    ("relu6", dict(act="relu6")),
    ("clip_0_6", dict(act="clip", min=0, max=6)),
    ("clip_min", dict(act="clip", min=-0.5)),
    ("clip_max", dict(act="clip", max=0.25)),
    ("hardsigmoid_onnx", dict(act="hardsigmoid")),
    ("hardsigmoid_torch", dict(act="hardsigmoid", alpha=1 / 6, beta=0.5)),
    ("hardswish", dict(act="hardswish")),
    ("silu", dict(act="silu")),
    ("gelu", dict(act="gelu")),
    ("gelu_tanh", dict(act="gelu_tanh")),
]


def make_layer(op, in_shapes, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(op, op, a, [f"in{i}" for i in range(len(in_shapes))],
                 in_shapes=[tuple(s) for s in in_shapes], out_shape=out, params=params)


def standalone(raw):
    """The act of `raw` as its own layer op: the act's name is the op."""
    r = dict(raw)
    return r.pop("act"), r


def net(*layers, shape=(1, 3, 8, 8)):
    return network_from_dict({"name": "n", "input": list(shape), "layers": list(layers)})


# -- attributes and signatures -----------------------------------------------------------------

def test_every_act_is_an_op_and_a_fusable_act():
    assert set(NEW) <= set(ACTS) and set(ACT_OPS) == set(ACTS) - {"none"}
    assert set(ACT_OPS) <= set(ops.SCHEMA)
    assert set(ACT_OPS) <= set(BY_NAME["eltwise"].ops)


def test_existing_layers_keep_their_signature():
    """The extras (min, max, beta) are absent unless the act reads them: the signatures of
    existing layers, part of every tuning-record key, are what they were."""
    n = net({"name": "c", "op": "conv", "out": 4, "kernel": 3, "act": "relu"},
            {"name": "d", "op": "dense", "out": 5},
            {"name": "r", "op": "relu"})
    assert n.layer("c").signature_str() == (
        "conv|1x3x8x8|1x4x6x6|act=relu,alpha=0.01,bias=True,dilation=(1, 1),groups=1,"
        "kernel=(3, 3),out=4,pad=(0, 0, 0, 0),stride=(1, 1)")
    assert n.layer("d").signature_str() == (
        "dense|1x4x6x6|1x5x1x1|act=none,alpha=0.01,bias=True,out=5")
    assert n.layer("r").signature_str() == "relu|1x5x1x1|1x5x1x1|act=relu,alpha=0.01"
    for op in ("batchnorm", "add"):
        a = ops.normalise(op, {"act": "leaky_relu", "alpha": 0.2})
        assert not {"beta", "min", "max"} & set(a), (op, a)


def test_act_defaults_and_extras():
    a = ops.normalise("conv", dict(out=2, kernel=1, act="hardsigmoid"))
    assert (a["alpha"], a["beta"]) == (0.2, 0.5)           # ONNX's defaults
    a = ops.normalise("hardsigmoid", {"alpha": 1 / 6})
    assert (a["act"], a["alpha"], a["beta"]) == ("hardsigmoid", 1 / 6, 0.5)
    a = ops.normalise("clip", {"max": 6})
    assert (a["act"], a["min"], a["max"]) == ("clip", None, 6.0)
    a = ops.normalise("dense", dict(out=2, act="clip", min=-1))
    assert (a["min"], a["max"]) == (-1.0, None)
    for op in ("relu6", "hardswish", "silu", "gelu", "gelu_tanh"):
        assert ops.normalise(op, {}) == {"act": op, "alpha": 0.01}
    assert ops.normalise("leaky_relu", {}) == {"alpha": 0.01, "act": "leaky_relu"}


@pytest.mark.parametrize("layer,key,words", [
    ({"op": "conv", "out": 4, "kernel": 3, "act": "relu", "beta": 1}, "beta",
     "'beta' is a parameter of act hardsigmoid, not of act 'relu'"),
    ({"op": "conv", "out": 4, "kernel": 3, "min": 0}, "min",
     "'min' is a parameter of act clip, not of act 'none'"),
    ({"op": "batchnorm", "act": "hardsigmoid", "max": 1}, "max", "parameter of act clip"),
    ({"op": "clip", "min": float("inf")}, "min", "must be a finite number"),
    ({"op": "clip", "max": "6"}, "max", "expected"),
    ({"op": "relu6", "min": 0}, "min", "unknown key for op 'relu6'"),
    ({"op": "dense", "out": 3, "act": "gelu_erf"}, "act", "unknown activation 'gelu_erf'"),
    ({"op": "hardswish", "alpha": 0.5}, "alpha", "unknown key for op 'hardswish'"),
])
def test_bad_act_attributes_are_one_line_errors(layer, key, words):
    with pytest.raises(AotconvError) as e:
        net(dict(layer, name="bad"))
    msg = str(e.value)
    assert "\n" not in msg and "layer 'bad'" in msg and f"key '{key}'" in msg and words in msg


def test_fusion_carries_the_act_parameters():
    """A standalone clip / hardsigmoid folds into its producer with its bounds / alpha and
    beta: the fused layer is the layer written with the act inline."""
    for act, raw in (("clip", {"min": -1, "max": 2.5}), ("hardsigmoid", {"alpha": 0.25}),
                     ("gelu", {})):
        n = net({"name": "c", "op": "conv", "out": 4, "kernel": 3},
                dict(raw, name="a", op=act))
        f = passes.optimise(n)
        assert [l.name for l in f.layers] == ["c"] and f.layer("c").fused == ["a"]
        inline = net(dict(raw, name="c", op="conv", out=4, kernel=3, act=act))
        assert f.layer("c").signature() == inline.layer("c").signature(), act


def test_max_pool_fuses_only_after_a_monotone_act():
    """conv_pool applies a max pool's act once, after the max: right for a non-decreasing act
    only. hardswish, silu, gelu (and leaky_relu / hardsigmoid with alpha < 0) keep the pool
    apart; an average pool applies the act per position and fuses with any."""
    for act, raw, mono in (("relu6", {}, True), ("clip", {"min": 0}, True),
                           ("hardsigmoid", {}, True), ("hardswish", {}, False),
                           ("silu", {}, False), ("gelu", {}, False), ("gelu_tanh", {}, False),
                           ("leaky_relu", {"alpha": -0.5}, False),
                           ("hardsigmoid", {"alpha": -0.2}, False)):
        for pool in ("maxpool", "avgpool"):
            n = net(dict(raw, name="c", op="conv", out=4, kernel=3, act=act),
                    {"name": "p", "op": pool, "kernel": 2},
                    {"name": "d", "op": "dense", "out": 3})
            assert act_monotone(n.layer("c").attrs) is mono
            want = [("c", "p")] if mono or pool == "avgpool" else []
            assert passes.fusable_pools(n) == want, (act, raw, pool)


# -- the reference -----------------------------------------------------------------------------

def test_reference_formulas():
    x = np.linspace(-9, 9, 721)
    act = reference.act
    assert np.array_equal(act(x, "relu6"), np.clip(x, 0, 6))
    assert np.array_equal(act(x, "clip", lo=-1.5, hi=2.0), np.clip(x, -1.5, 2.0))
    assert np.array_equal(act(x, "clip", lo=-1.5), np.maximum(x, -1.5))
    assert np.array_equal(act(x, "clip", hi=2.0), np.minimum(x, 2.0))
    assert np.array_equal(act(x, "clip"), x)
    # PyTorch's hardsigmoid is relu6(x + 3) / 6 = alpha 1/6, beta 1/2
    assert np.allclose(act(x, "hardsigmoid", alpha=1 / 6, beta=0.5), np.clip(x + 3, 0, 6) / 6)
    assert np.allclose(act(x, "hardsigmoid", alpha=0.2), np.clip(0.2 * x + 0.5, 0, 1))
    assert np.allclose(act(x, "hardswish"), x * act(x, "hardsigmoid", alpha=1 / 6, beta=0.5))
    assert np.allclose(act(x, "silu"), x * act(x, "sigmoid"))
    erf = np.array([math.erf(v / math.sqrt(2)) for v in x])
    assert np.allclose(act(x, "gelu"), 0.5 * x * (1 + erf), rtol=0, atol=1e-15)
    # the tanh form is an approximation of the erf form: close, not equal
    d = np.abs(act(x, "gelu_tanh") - act(x, "gelu"))
    assert d.max() < 1e-3 and d.max() > 1e-5
    # gelu(x) -> x for large x, -> 0 for very negative x
    assert act(np.array([30.0]), "gelu")[0] == 30.0 and act(np.array([-30.0]), "gelu")[0] == 0


def test_reference_forward_reads_the_layers_act():
    rng = np.random.default_rng(0)
    for _, raw in ACT_CASES:
        op, r = standalone(raw)
        layer = make_layer(op, [(2, 3, 4, 5)], **r)
        x = rng.standard_normal((2, 3, 4, 5)) * 4
        a = layer.attrs
        want = reference.act(x, a["act"], a["alpha"], a.get("beta", 0.5), a.get("min"),
                             a.get("max"))
        assert np.array_equal(reference.forward(layer, [x], {}), want)


# -- rendering ---------------------------------------------------------------------------------

# templates/kernels/_common.mako as it was before the acts of this file: every template must
# render byte for byte the same with it as with the current helper for the older acts
ORIGINAL_COMMON = '''## Shared Mako helpers for kernel templates.
## act(kind, alpha, x): the fused activation applied to the float expression x.
<%def name="act(kind, alpha, x)" filter="trim">
% if kind == "none":
${x}
% elif kind == "relu":
fmax(${x}, 0.0f)
% elif kind == "leaky_relu":
leaky(${x}, ${flt(alpha)})
% elif kind == "sigmoid":
(1.0f / (1.0f + exp(-(${x}))))
% elif kind == "tanh":
tanh(${x})
% endif
</%def>
## helpers(): small inline functions every kernel file may use.
<%def name="helpers()">
inline float leaky(float x, float a) { return x > 0.0f ? x : a * x; }
</%def>
## flt(v): v as an OpenCL float literal that always parses ("1.0f", not "1f").
<%!
def _flt(v):
    s = "%.9g" % float(v)
    return (s if any(ch in s for ch in ".e") else s + ".0") + "f"
%>
<%def name="flt(v)" filter="trim">
${_flt(v)}
</%def>
'''

OLD_ACTS = [dict(act="none"), dict(act="relu"), dict(act="sigmoid"), dict(act="tanh"),
            dict(act="leaky_relu", alpha=0.2), dict(act="leaky_relu", alpha=2)]


def epilogue_layers(raw):
    """One layer per variant that takes an act, all with the act `raw`."""
    from aotconv.ops import pool_attrs
    conv3 = make_layer("conv", [(1, 5, 9, 9)], out=7, kernel=3, pad=1, **raw)
    cp_attrs = dict(conv3.attrs, pool=pool_attrs("avg", ops.normalise("avgpool", {"kernel": 2})))
    out, params = ops.infer("conv_pool", cp_attrs, [(1, 5, 9, 9)])
    conv_pool = Layer("cp", "conv_pool", cp_attrs, ["in0"], in_shapes=[(1, 5, 9, 9)],
                      out_shape=out, params=params)
    return {
        "conv_direct": conv3, "conv_tiled": conv3, "conv_igemm": conv3, "conv_im2col": conv3,
        "conv_winograd": conv3,
        "conv_1x1": make_layer("conv", [(1, 6, 5, 7)], out=9, kernel=1, **raw),
        "conv_pool_direct": conv_pool,
        "dense_direct": make_layer("dense", [(2, 3, 4, 5)], out=11, **raw),
        "dense_gemv": make_layer("dense", [(2, 3, 4, 5)], out=11, **raw),
        "dense_gemm": make_layer("dense", [(2, 3, 4, 5)], out=11, **raw),
        "add_direct": make_layer("add", [(1, 3, 5, 7)] * 2, **raw),
        "batchnorm_direct": make_layer("batchnorm", [(2, 7, 3, 5)], **raw),
    }


def test_older_acts_render_byte_identical(tmp_path, monkeypatch):
    from mako.lookup import TemplateLookup
    old = tmp_path / "templates"
    shutil.copytree(base.TEMPLATE_DIR, old)
    # the acts as they were, with the storage helpers of today (they render FP32 text as it was
    # before storage existed: tests/test_fp16.py keeps that so)
    common = (base.TEMPLATE_DIR / "kernels" / "_common.mako").read_text()
    storage = common[common.index("## Storage:"):]
    (old / "kernels" / "_common.mako").write_text(ORIGINAL_COMMON + storage)
    old_lookup = TemplateLookup(directories=[str(old)], strict_undefined=True,
                                input_encoding="utf-8")
    new_lookup = base._lookup
    checked = 0
    for raw in OLD_ACTS:
        layers = epilogue_layers(raw)
        op, r = ("relu", {}) if raw["act"] == "none" else standalone(raw)
        layers["eltwise"] = make_layer(op, [(1, 3, 5, 7)], **r)
        for name, layer in layers.items():
            v = BY_NAME[name]
            assert v.supports(layer) is None, (name, v.supports(layer))
            cfg = v.fallback(layer, POCL)
            monkeypatch.setattr(base, "_lookup", new_lookup)
            now = v.render(layer, cfg, "k_x")
            monkeypatch.setattr(base, "_lookup", old_lookup)
            before = v.render(layer, cfg, "k_x")
            assert now == before, (name, raw)
            checked += 1
    assert checked == len(OLD_ACTS) * 13


def test_new_acts_render_as_functions_of_the_layers_parameters():
    layer = make_layer("conv", [(1, 2, 5, 5)], out=3, kernel=3, act="clip", max=0.25)
    src = BY_NAME["conv_direct"].render(layer, BY_NAME["conv_direct"].fallback(layer, POCL), "k")
    assert "inline float act_clip(float x) { return fmin(x, 0.25f); }" in src
    assert "= act_clip(s);" in src
    layer = make_layer("dense", [(1, 4, 1, 1)], out=3, act="hardsigmoid", alpha=1 / 6)
    src = BY_NAME["dense_direct"].render(layer, BY_NAME["dense_direct"].fallback(layer, POCL),
                                         "k")
    assert "return fmin(fmax(0.166666667f * x + 0.5f, 0.0f), 1.0f);" in src


# -- device: PoCL ------------------------------------------------------------------------------

def check(cl_ctx, layer, variant, cfg=None, scale=4.0):
    """Run `variant` on `layer` (inputs scaled so that every act's bends and saturations are
    reached) and compare with reference.forward."""
    rng = np.random.default_rng(zlib.crc32(layer.signature_str().encode()))
    xs, prm = harness.random_inputs(layer, rng)
    xs = [x * np.float32(scale) for x in xs]
    want = reference.forward(layer, xs, prm)
    cfg = cfg or variant.fallback(layer, POCL)
    lin, lout = variant.layouts_of(layer, cfg)
    x = [reference.to_layout(v, lin).reshape(v.shape) for v in xs]
    got = harness.run_layer(layer, variant, cfg, x, prm, ctx=cl_ctx)
    got = reference.from_layout(got.ravel(), lout, layer.out_shape)
    ok, err = harness.close(got, want)
    assert ok, f"{variant.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"


# odd sizes, strides, pads, groups, batch: one per act case, cycled
CONV_SHAPES = [((1, 3, 7, 7), dict(out=5, kernel=3, pad=1)),
               ((2, 4, 13, 11), dict(out=6, kernel=5, stride=2, pad=2, groups=2)),
               ((1, 1, 1, 1), dict(out=3, kernel=1)),
               ((3, 5, 9, 8), dict(out=7, kernel=[3, 1], stride=[1, 2], dilation=[2, 1],
                                   bias=False))]
DENSE_SHAPES = [((1, 7, 1, 1), 13), ((3, 2, 5, 3), 1), ((2, 97, 1, 1), 10)]
ELT_SHAPES = [(1, 1, 1, 1), (2, 3, 7, 13), (1, 13, 1, 7)]


def act_params(host):
    """ACT_CASES for the test of one host (0 conv, 1 dense, 2 the act as a layer): make test
    runs every act once, in one of the three hosts by turns; the slow tier the rest."""
    return [pytest.param(aid, raw, id=aid, marks=() if i % 3 == host else pytest.mark.slow)
            for i, (aid, raw) in enumerate(ACT_CASES)]


@pytest.mark.parametrize("aid,raw", act_params(0))
def test_act_fused_into_conv(cl_ctx, aid, raw):
    i = [a for a, _ in ACT_CASES].index(aid)
    shape, attrs = CONV_SHAPES[i % len(CONV_SHAPES)]
    check(cl_ctx, make_layer("conv", [shape], **attrs, **raw), BY_NAME["conv_direct"])


@pytest.mark.parametrize("aid,raw", act_params(1))
def test_act_fused_into_dense(cl_ctx, aid, raw):
    i = [a for a, _ in ACT_CASES].index(aid)
    shape, out = DENSE_SHAPES[i % 3]
    layer = make_layer("dense", [shape], out=out, bias=i % 2 == 0, **raw)
    check(cl_ctx, layer, BY_NAME["dense_direct"], scale=8.0)


@pytest.mark.parametrize("aid,raw", act_params(2))
def test_act_as_a_layer(cl_ctx, aid, raw):
    i = [a for a, _ in ACT_CASES].index(aid)
    op, r = standalone(raw)
    layer = make_layer(op, [ELT_SHAPES[i % len(ELT_SHAPES)]], **r)
    # the fallback, or a point with several elements per work-item
    cfg = None if i % 2 == 0 else Config.of(WG=32, VEC=(2, 4, 8)[i % 3])
    check(cl_ctx, layer, BY_NAME["eltwise"], cfg, scale=5.0)


# each other epilogue once, the act cycled over the cases
OTHER = ("conv_tiled", "conv_igemm", "conv_im2col", "conv_winograd", "conv_1x1",
         "conv_pool_direct", "dense_gemv", "dense_gemm", "add_direct", "batchnorm_direct")


# make test: all but conv_igemm's (the slowest to compile; its act is the shared helper the
# conv_igemm cases of tests/test_conv_variants.py run)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "conv_igemm"
                                  else n for n in OTHER])
def test_act_in_every_epilogue(cl_ctx, name):
    _, raw = ACT_CASES[OTHER.index(name) % len(ACT_CASES)]
    check(cl_ctx, epilogue_layers(raw)[name], BY_NAME[name])


# -- PyTorch (where installed) -----------------------------------------------------------------

def test_torch_model_has_every_act():
    """aotconv.torch_model (the end-to-end reference of the benchmarks) maps every act, as a
    layer and fused, onto PyTorch's own (relu6, hardswish, silu, gelu) or clamps, and agrees
    with the numpy reference; layer names with '.' are fine."""
    torch = pytest.importorskip("torch")
    from aotconv import params, torch_model
    layers = [{"name": "in.0", "op": "conv", "out": 6, "kernel": 3, "pad": 1}]
    for i, (aid, raw) in enumerate(ACT_CASES):
        op, r = standalone(raw)
        layers.append(dict(raw, name=f"c.{i}", op="conv", out=6, kernel=3, pad=1))
        layers.append(dict(r, name=f"a.{i}", op=op))
    layers += [{"name": "d.0", "op": "dense", "out": 5, "act": "gelu_tanh"}]
    n = network_from_dict({"name": "acts", "input": [2, 3, 9, 7], "layers": layers})
    flat = params.random_params(n, seed=3)
    x = np.random.default_rng(4).standard_normal(n.input_shape).astype(np.float32) * 3
    with torch.no_grad():
        got = torch_model.build(n, flat)(torch.from_numpy(x)).numpy()
    ok, err = harness.close(got, reference.run_network(n, x, flat)[0])
    assert ok, err

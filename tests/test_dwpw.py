"""A depthwise conv fused into the pointwise (1x1) conv after it (op conv_dwpw).

Device-free: which pairs passes.fusable_dwpw finds and which it leaves, the fused layer
fuse_dwpw makes (attrs, params and where they come from, inputs, shape, a fused residual),
the op's costs, the parameter tables (the depthwise conv's batchnorms folded into its own
tensors of the fused layer), the fusion decision, the variant's domain, constraints and
fallbacks, its space as the reference walk enumerates it. PoCL: conv_dwpw against the float64
reference on shapes that take every knob value and every guard of the kernel, and a small
MobileNet-like network built with the fusion forced on and off, whose library matches the
numpy reference of the network as written with the user's parameters.
"""
from dataclasses import replace
import json
import zlib

import numpy as np
import pytest
import yaml

from aotconv import fusion, harness, ops, passes, reference, spec
from aotconv import params as params_mod
from aotconv.choose import Choice, fallback_choice
from aotconv.context import with_precision
from aotconv.graph import count
from aotconv.precision import stored
from aotconv.schedule import build_schedule
from aotconv.space import point_ok, variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

POCL, H100 = TARGETS["pocl-cpu"], TARGETS["h100"]
V = BY_NAME["conv_dwpw"]


def conv(name, out, kernel=1, **kw):
    return dict(name=name, op="conv", out=out, kernel=kernel, **kw)


def network(layers, shape=(1, 8, 10, 10), outputs=None):
    """A network of `layers` followed by a global average pool (so that the last of them is
    not a network output), unless `outputs` names them."""
    d = {"name": "n", "input": list(shape), "layers": list(layers)}
    if outputs is None:
        d["layers"].append(dict(name="gap", op="global_avgpool"))
    else:
        d["outputs"] = outputs
    return spec.network_from_dict(d)


DW = conv("dw", 8, 3, pad=1, groups=8, act="relu6")

FUSABLE = [
    ("plain", [DW, conv("pw", 16)], None, [("dw", "pw")]),
    ("dw_stride2_dilated_5x5", [conv("dw", 8, 5, stride=2, pad=4, dilation=2, groups=8),
                                conv("pw", 4, act="relu")], None, [("dw", "pw")]),
    ("dw_two_consumers", [DW, conv("pw", 16), dict(name="r", op="relu", inputs=["dw"]),
                          dict(name="cat", op="concat", inputs=["pw", "r"])], None, []),
    ("pw_3x3", [DW, conv("pw", 16, 3, pad=1)], None, []),
    ("pw_stride2", [DW, conv("pw", 16, stride=2)], None, []),
    ("pw_groups2", [DW, conv("pw", 16, groups=2)], None, []),
    ("dw_is_an_output", [DW, conv("pw", 16), dict(name="g", op="global_avgpool")],
     ["dw", "g"], []),
    ("pw_is_an_output", [DW, conv("pw", 16)], ["pw"], []),
    ("channel_multiplier_2", [conv("dw", 16, 3, pad=1, groups=8), conv("pw", 16)], None, []),
    ("grouped_not_depthwise", [conv("dw", 8, 3, pad=1, groups=4), conv("pw", 16)], None, []),
]


@pytest.mark.parametrize("layers,outputs,want", [c[1:] for c in FUSABLE],
                         ids=[c[0] for c in FUSABLE])
def test_fusable_pairs(layers, outputs, want):
    net = passes.optimise(network(layers, outputs=outputs))
    assert passes.fusable_dwpw(net) == want


def mobilenet_dict():
    """An inverted-residual network as written: expand 1x1 + bn + relu6, depthwise 3x3 + bn +
    relu6, project 1x1 + bn, the residual add; then a stride-2 block without a residual."""
    def bn(name, act="none"):
        return dict(name=name, op="batchnorm", act=act, eps=1e-3)
    return {"name": "mbtiny", "input": [1, 3, 16, 16], "layers": [
        conv("stem", 8, 3, stride=2, pad=1, bias=False), bn("stem_bn", "relu6"),
        conv("b1_dw", 8, 3, pad=1, groups=8, bias=False), bn("b1_dw_bn", "relu6"),
        conv("b1_pw", 8, bias=False), bn("b1_pw_bn"),
        conv("b2_ex", 24, bias=False), bn("b2_ex_bn", "relu6"),
        conv("b2_dw", 24, 3, pad=1, groups=24, bias=False), bn("b2_dw_bn", "relu6"),
        conv("b2_pw", 8, bias=False), bn("b2_pw_bn"),
        dict(name="b2_add", op="add", inputs=["b2_pw_bn", "b1_pw_bn"]),
        conv("b3_ex", 16, bias=False), bn("b3_ex_bn", "relu6"),
        conv("b3_dw", 16, 3, stride=2, pad=1, groups=16), bn("b3_dw_bn", "relu6"),
        conv("b3_pw", 12), bn("b3_pw_bn"),
        dict(name="gap", op="global_avgpool")]}


def mobilenet_like():
    return spec.network_from_dict(mobilenet_dict())


def test_fuse_dwpw_rewrites_the_graph():
    net = passes.fuse_residual(passes.optimise(mobilenet_like()))
    assert passes.fusable_dwpw(net) == [("b1_dw", "b1_pw"), ("b2_dw", "b2_pw"),
                                        ("b3_dw", "b3_pw")]
    f = passes.fuse_dwpw(net)
    assert [l.name for l in f.layers] == ["stem", "b1_pw", "b2_ex", "b2_pw", "b3_ex", "b3_pw",
                                          "gap"]
    dw, pw, fl = net.layer("b3_dw"), net.layer("b3_pw"), f.layer("b3_pw")
    assert fl.op == "conv_dwpw" and fl.inputs == ["b3_ex"] and fl.in_shapes == [(1, 16, 8, 8)]
    assert fl.out_shape == pw.out_shape == (1, 12, 4, 4)
    dw_a, pw_a = ops.split_conv_dwpw(fl.attrs)
    assert dw_a == dw.attrs and pw_a == pw.attrs and dw_a["act"] == "relu6"
    assert fl.params == [("dw_weight", (16, 1, 3, 3)), ("dw_bias", (16,)),
                         ("weight", (12, 16, 1, 1)), ("bias", (12,))]
    assert {t: passes.param_origin(fl, t) for t, _ in fl.params} == {
        "dw_weight": ("b3_dw", "weight"), "dw_bias": ("b3_dw", "bias"),
        "weight": ("b3_pw", "weight"), "bias": ("b3_pw", "bias")}
    assert fl.fused == ["b3_pw_bn", "b3_dw", "b3_dw_bn"]
    # the residual fused into the pointwise conv stays its second input
    r = f.layer("b2_pw")
    assert r.attrs["residual"] and r.inputs == ["b2_ex", "b1_pw"]
    assert r.in_shapes == [(1, 24, 8, 8), (1, 8, 8, 8)]
    assert r.fused == ["b2_pw_bn", "b2_add", "b2_dw", "b2_dw_bn"]
    # only some, by the pointwise conv's name; the input network is left as it was
    g = passes.fuse_dwpw(net, ["b3_pw"])
    assert [l.op for l in g.layers].count("conv_dwpw") == 1 and g.layer("b1_dw").op == "conv"
    assert net.layer("b3_pw").op == "conv"
    with pytest.raises(ValueError, match="cannot fuse a depthwise conv into b2_ex: not a "
                                         "pointwise conv whose input is a depthwise conv"):
        passes.fuse_dwpw(net, ["b2_ex"])
    # the rewritten network computes what the network as written does
    params = reference.random_network_params(net, np.random.default_rng(0))
    fused_params = {l.name: {t: params[passes.param_origin(l, t)[0]][passes.param_origin(l, t)[1]]
                             for t, _ in l.params} for l in f.layers if l.params}
    x = np.random.default_rng(1).standard_normal(net.input_shape)
    for a, b in zip(reference.run_network(net, x, params),
                    reference.run_network(f, x, fused_params)):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_mobilenet_v2_has_17_pairs():
    """Every inverted-residual block of MobileNetV2 (and the first, without expansion)."""
    net = passes.fuse_residual(passes.optimise(spec.load_network("mobilenet_v2")))
    pairs = passes.fusable_dwpw(net)
    assert len(pairs) == 17
    f = passes.fuse_dwpw(net)
    assert len(f.layers) == len(net.layers) - 17
    assert all(V.supports(l) is None for l in f.layers if l.op == "conv_dwpw")


def test_infer_rejects_attrs_that_are_not_a_dwpw():
    dw = ops.normalise("conv", dict(out=8, kernel=3, pad=1, groups=8))
    pw = ops.normalise("conv", dict(out=4, kernel=1))
    out, params = ops.infer("conv_dwpw", dict(pw, dw=ops.dw_attrs(dw)), [(2, 8, 6, 6)])
    assert out == (2, 4, 6, 6) and [t for t, _ in params] == ["dw_weight", "dw_bias", "weight",
                                                              "bias"]
    wide = ops.normalise("conv", dict(out=16, kernel=3, pad=1, groups=8))
    with pytest.raises(ops.OpError, match="groups == in == out channels"):
        ops.infer("conv_dwpw", dict(pw, dw=ops.dw_attrs(wide)), [(1, 8, 6, 6)])
    k3 = ops.normalise("conv", dict(out=4, kernel=3))
    with pytest.raises(ops.OpError, match="must be 1x1"):
        ops.infer("conv_dwpw", dict(k3, dw=ops.dw_attrs(dw)), [(1, 8, 6, 6)])


def fused_pair(shape, dw_raw, pw_raw):
    """(the conv_dwpw layer, the dw layer, the pw layer) as fuse_dwpw builds them."""
    c = shape[1]
    net = passes.optimise(network([conv("dw", c, groups=c, **dw_raw), conv("pw", **pw_raw)],
                                  shape))
    return passes.fuse_dwpw(net).layer("pw"), net.layer("dw"), net.layer("pw")


def residual_pair(shape, dw_raw, pw_raw):
    """(the conv_dwpw layer with a residual add fused into its pointwise conv, dw, pw): the
    add's other input a conv of the network's input with the depthwise conv's geometry; the
    act of `pw_raw` is the add's."""
    c = shape[1]
    geometry = {k: v for k, v in dw_raw.items() if k in ("kernel", "stride", "pad", "dilation")}
    act = {k: v for k, v in pw_raw.items() if k in ("act", "alpha", "min", "max")}
    pw_raw = {k: v for k, v in pw_raw.items() if k not in act}
    net = network([conv("side", pw_raw["out"], inputs=["input"], **geometry),
                   conv("dw", c, groups=c, inputs=["input"], **dw_raw), conv("pw", **pw_raw),
                   dict(name="add", op="add", inputs=["pw", "side"], **act)], shape)
    net = passes.fuse_residual(passes.optimise(net), ["pw"])
    return passes.fuse_dwpw(net).layer("pw"), net.layer("dw"), net.layer("pw")


def test_costs():
    l, dw, pw = fused_pair((2, 8, 9, 9), dict(kernel=3, pad=1), dict(out=16))
    assert ops.flops(l) == ops.flops(dw) + ops.flops(pw)
    # the depthwise output never reaches memory
    assert ops.bytes_moved(l) == 4 * (count(l.in_shape) + count(l.out_shape)
                                      + sum(count(s) for _, s in l.params))
    assert ops.bytes_moved(l) == ops.bytes_moved(dw) + ops.bytes_moved(pw) - 8 * count(dw.out_shape)


def test_parameters_stay_the_network_as_written():
    """The fused layer's tensors are filled from the layers as written: the depthwise conv's
    weight and bias folded with its own batchnorm, the pointwise conv's with its."""
    net0 = mobilenet_like()
    net = passes.fuse_dwpw(passes.fuse_residual(passes.optimise(net0)))
    assert passes.batchnorm_folds(net0, net) == {
        "stem": ["stem_bn"], "b1_dw": ["b1_dw_bn"], "b1_pw": ["b1_pw_bn"],
        "b2_ex": ["b2_ex_bn"], "b2_dw": ["b2_dw_bn"], "b2_pw": ["b2_pw_bn"],
        "b3_ex": ["b3_ex_bn"], "b3_dw": ["b3_dw_bn"], "b3_pw": ["b3_pw_bn"]}
    sch = build_schedule(net, fallbacks(net), source=net0)
    assert sch.param_layout() == net0.param_layout()
    off = {f"{l}.{t}": o for l, t, _, o in net0.param_layout()}
    folds = [(f.layer, f.source) for f in sch.folds]
    assert ("b3_pw", "b3_dw") in folds and ("b3_pw", None) in folds
    dwf = next(f for f in sch.folds if f.source == "b3_dw")
    assert (dwf.channels, dwf.per_channel) == (16, 9)
    assert (dwf.weight_offset, dwf.bias_offset) == (off["b3_dw.weight"], off["b3_dw.bias"])
    assert [b[0] for b in dwf.batchnorms] == ["b3_dw_bn"]
    assert dwf.batchnorms[0][1:] == (off["b3_dw_bn.gamma"], off["b3_dw_bn.beta"],
                                     off["b3_dw_bn.mean"], off["b3_dw_bn.var"], 1e-3)
    pwf = next(f for f in sch.folds if f.layer == "b3_pw" and f.source is None)
    assert (pwf.channels, pwf.per_channel, pwf.weight_offset) == (12, 16, off["b3_pw.weight"])
    bufs = {b.name for b in sch.buffers}
    assert {"b3_pw.dw_weight", "b3_pw.dw_bias", "b3_pw.weight", "b3_pw.bias"} <= bufs
    # without batchnorms: the depthwise conv's tensors copied as given
    plain0 = network([conv("dw", 8, 3, pad=1, groups=8), conv("pw", 4)])
    plain = passes.fuse_dwpw(passes.optimise(plain0))
    sch = build_schedule(plain, fallbacks(plain), source=plain0)
    off = {f"{l}.{t}": o for l, t, _, o in plain0.param_layout()}
    assert {p.name: p.offset for p in sch.params} == {
        "pw.dw_weight": off["dw.weight"], "pw.dw_bias": off["dw.bias"],
        "pw.weight": off["pw.weight"], "pw.bias": off["pw.bias"]}
    assert not sch.folds


def fallbacks(net, ms=None):
    """{layer: its fallback Choice on pocl-cpu}, timed `ms` where given."""
    return {l.name: replace(fallback_choice(l, POCL), time_ms=ms) for l in net.layers
            if not ops.is_alias(l)}


# -- the fusion decision (device-free) ------------------------------------------------------------

def test_dwpw_decisions():
    def ch(ms):
        return Choice("x", Config(), ms, "tuned")
    pairs = [("d1", "p1"), ("d2", "p2"), ("d3", "p3"), ("d4", "p4")]
    choices = {"d1": ch(1.0), "p1": ch(0.5), "d2": ch(1.0), "p2": ch(0.5), "d3": ch(None),
               "p3": ch(0.5), "d4": ch(1.0), "p4": ch(0.5)}
    fused = {"p1": ch(1.2), "p2": ch(1.6), "p3": ch(0.1)}
    d = fusion.decide_dwpw(pairs, choices, fused, "measure")
    assert [x.fused for x in d] == [True, False, False, False]
    assert (d[0].conv, d[0].dw, d[0].conv_ms, d[0].dw_ms, d[0].fused_ms) == \
        ("p1", "d1", 0.5, 1.0, 1.2)
    assert "faster" in d[0].why and "slower" in d[1].why
    assert "not measured: dw" in d[2].why and "not measured: fused" in d[3].why
    assert all(x.fused for x in fusion.decide_dwpw(pairs, choices, fused, "always"))
    assert not any(x.fused for x in fusion.decide_dwpw(pairs, choices, fused, "never"))
    d = fusion.decide_dwpw(pairs, choices, fused, "always", declined={"p1": "none takes it"})
    assert not d[0].fused and "none takes it" in d[0].why and d[1].fused


def test_apply_dwpw_fuses_what_measures_faster():
    """A launch counts (Price): fused at 1.0 + 1.0 + the gap, not above; the fused layer's
    choice replaces both; unmeasured (fallback mode) nothing is asked and nothing fused."""
    net = passes.optimise(network([DW, conv("pw", 16), conv("dw2", 16, 3, groups=16),
                                   conv("pw2", 4)]))
    choices = fallbacks(net, 1.0)
    gap = fusion.Price(POCL).gap
    asked = []

    def choose_fn(n, only):
        asked.append(list(only))
        times = {"pw": 2.0 + gap / 2, "pw2": 2.0 + 2 * gap}
        return {c: replace(fallback_choice(n.layer(c), POCL), time_ms=times[c]) for c in only}

    out, ch, d = fusion.apply_dwpw(net, choices, POCL, "measure", "tune", choose_fn)
    assert asked == [["pw", "pw2"]]
    assert [(x.conv, x.dw, x.fused) for x in d] == [("pw", "dw", True), ("pw2", "dw2", False)]
    assert [l.name for l in out.layers] == ["pw", "dw2", "pw2", "gap"]
    assert out.layer("pw").op == "conv_dwpw" and "dw" not in ch
    assert ch["pw"].variant == "conv_dwpw" and ch["pw2"] == choices["pw2"]
    # forced, but a time budget left no room to choose the fused layers: nothing fused
    out, _, d = fusion.apply_dwpw(net, choices, POCL, "always", "tune", lambda n, only: {})
    assert out.layers == net.layers and not any(x.fused for x in d)
    assert all("got no choice" in x.why for x in d)
    asked.clear()
    out, ch, d = fusion.apply_dwpw(net, choices, POCL, "measure", "fallback", choose_fn)
    assert asked == [] and out.layers == net.layers and not any(x.fused for x in d)
    assert all("not measured: fused" in x.why for x in d)
    with pytest.raises(Exception, match="unknown depthwise fusion policy 'sometimes'"):
        fusion.apply_dwpw(net, choices, POCL, "sometimes", "tune", choose_fn)


def test_aotconv_tune_measures_the_fusions_in_the_builds_order(monkeypatch):
    """`aotconv tune` measures what a build measures after the network, in its order: the
    pools, the residual adds, then the depthwise convs (each with the network the one before
    left)."""
    from aotconv import layouts
    from aotconv.tune import cli
    order = []

    def step(name):
        def run(net, choices, target, policy, mode, choose_fn):
            order.append((name, [l.name for l in net.layers]))
            return passes.fuse_residual(net) if name == "residual" else net, choices, []
        return run
    monkeypatch.setattr(fusion, "apply", step("pool"))
    monkeypatch.setattr(fusion, "apply_residual", step("residual"))
    monkeypatch.setattr(fusion, "apply_dwpw", step("dwpw"))
    monkeypatch.setattr(layouts, "plan_network", lambda net, choices, ctx: (choices, None))
    monkeypatch.setattr(layouts, "insert_conversions", lambda net, choices: (net, []))
    net = passes.optimise(mobilenet_like())

    class Ctx:
        profile, mode = POCL, "tune"
    assert cli._after_network(net, {}, Ctx(), True, set()) == {}
    assert [n for n, _ in order] == ["pool", "residual", "dwpw"]
    assert "b2_add" in order[1][1] and "b2_add" not in order[2][1]


def test_an_fp16_build_leaves_the_pair_unfused():
    """conv_dwpw stores FP32 only: in an fp16 build no variant takes the fused layer, so even
    "always" leaves the pair as it is, saying why, and nothing is chosen for it."""
    net = stored(passes.optimise(network([DW, conv("pw", 16)])), "fp16")
    fused = passes.fuse_dwpw(net).layer("pw")
    why = V.supports(fused)
    assert why and "FP32 only" in why
    called = []
    out, _, d = fusion.apply_dwpw(net, {}, with_precision(POCL, "fp16"), "always", "tune",
                                  lambda n, only: called.append(only) or {})
    assert called == [] and out.layers == net.layers
    assert not d[0].fused and "no variant takes the fused layer" in d[0].why


# -- the variant: domain, constraints, fallbacks, space (device-free) -----------------------------

def test_supports_and_constraint_reasons():
    l, dw, pw = fused_pair((1, 16, 9, 9), dict(kernel=3, pad=1), dict(out=24))
    assert V.supports(l) is None
    assert V.supports(dw) == "conv_dwpw implements conv_dwpw, not conv"
    names = {c.name: c for c in V.constraints}
    assert all(c.reason for c in V.constraints)

    def failed(**kw):
        cfg = Config.of(**dict(dict(TP=32, TK=16, RP=4, RK=4, CB=8), **kw))
        return [c.name for c in V.constraints if not c.check(l, cfg, H100)]
    assert failed() == []
    assert failed(TP=16, RP=8, TK=64, RK=8) == ["tk_not_oversized", "whole_simd_groups"]
    assert failed(TK=4, RK=8)[0] == "rk_divides_tk"
    assert failed(TP=256) == ["tp_not_oversized"]          # 81 pixels
    assert failed(CB=32, TP=64, RP=2) == ["cb_not_oversized"]
    assert failed(TP=64, RP=8, TK=32, RK=8, CB=16) == ["dw_share_fits"]   # 32 each
    assert "registers" in names["dw_share_fits"].reason
    # GPUs take whole SIMD groups: 8 x 4 = 32 work-items, fine on NVIDIA, not AMD's 64
    assert names["whole_simd_groups"].check(l, Config.of(TP=32, TK=16, RP=4, RK=4, CB=8),
                                            H100)
    # every local array counted
    assert V.local_mem_bytes(l, Config.of(TP=32, TK=16, RP=4, RK=4, CB=8)) == 4 * 8 * (32 + 17)


SHAPES = [
    ((1, 8, 112, 112), dict(kernel=3, pad=1), dict(out=16)),        # MobileNetV2 shapes
    ((1, 144, 56, 56), dict(kernel=3, pad=1), dict(out=24)),
    ((1, 576, 14, 14), dict(kernel=3, pad=1), dict(out=96)),
    ((1, 960, 7, 7), dict(kernel=3, pad=1), dict(out=320)),
    ((1, 3, 1, 1), dict(kernel=1), dict(out=1)),                    # the smallest
    ((3, 13, 7, 5), dict(kernel=[5, 3], stride=[2, 1], pad=[2, 1], dilation=2), dict(out=7)),
]


@pytest.mark.parametrize("shape,dw,pw", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_fallback_valid_on_every_target(shape, dw, pw):
    l = fused_pair(shape, dw, pw)[0]
    for t in TARGETS.values():
        cfg = V.fallback(l, t)
        assert point_ok(l, V, cfg, t), (shape, t.name, cfg)
    # big layers get the big tiles, small ones the small tiles that give more work-groups
    if shape[2] == 112:
        assert V.fallback(l, H100)["TP"] == 64
    if shape[2] == 7:
        assert V.fallback(l, H100)["TP"] == 16


def test_space_as_the_reference_walk():
    from space_reference import reference_space
    for shape, dw, pw in (SHAPES[2], SHAPES[5]):
        l = fused_pair(shape, dw, pw)[0]
        for t, exact in ((H100, True), (POCL, False)):
            got = variant_space(l, V, t, explain=exact)
            total, points, first, alone, errors = reference_space(l, V, t, exact)
            assert (got.total, got.points, got.first, got.alone, got.errors) == \
                (total, points, first, alone, errors)
            assert points and not errors


# -- on PoCL ----------------------------------------------------------------------------------

# id, input, dw attrs, pw attrs, residual, a configuration (None: the fallback). Between them
# every value of every knob, the window guarded and not, the tap loop unrolled and not, the
# vector and the scalar stores, partial tiles along pixels, channels and the reduction.
CASES = [
    ("s1p1_relu6_fallback", (1, 16, 9, 9), dict(kernel=3, pad=1, act="relu6"),
     dict(out=24), False, None),
    ("s2_relu", (1, 16, 15, 15), dict(kernel=3, stride=2, pad=1, act="relu6"),
     dict(out=20, act="relu"), False, dict(TP=32, TK=32, RP=2, RK=2, CB=8)),
    ("k5_clip_clip", (1, 12, 11, 11), dict(kernel=5, pad=2, act="clip", min=0.0, max=0.5),
     dict(out=16, act="clip", min=-0.2, max=0.3), False, dict(TP=16, TK=16, RP=1, RK=4, CB=4)),
    ("dil2_nobias_leaky", (1, 10, 13, 13), dict(kernel=3, pad=2, dilation=2, bias=False),
     dict(out=7, bias=False, act="leaky_relu", alpha=0.2), False,
     dict(TP=64, TK=4, RP=4, RK=1, CB=16)),
    ("batch2_residual_relu", (2, 24, 12, 12), dict(kernel=3, pad=1, act="relu6"),
     dict(out=40, act="relu"), True, dict(TP=256, TK=64, RP=8, RK=8, CB=16)),
    ("asym_hardswish_twice", (1, 20, 15, 10), dict(kernel=[3, 1], stride=[2, 1], pad=[1, 0],
                                                  act="hardswish"),
     dict(out=9, act="hardswish"), False, dict(TP=128, TK=8, RP=2, RK=1, CB=32)),
    ("k9_tap_loop", (1, 8, 12, 12), dict(kernel=9, pad=4, act="relu"), dict(out=8), False,
     None),
    ("unpadded_partial_steps", (2, 6, 10, 10), dict(kernel=3), dict(out=5), False, None),
]


def case_layer(case):
    _, shape, dw, pw, res, _ = case
    return (residual_pair if res else fused_pair)(shape, dw, pw)[0]


def test_the_cases_take_every_knob_value():
    seen = {}
    for case in CASES:
        l = case_layer(case)
        cfg = Config.from_dict(case[5]) if case[5] else V.fallback(l, POCL)
        assert point_ok(l, V, cfg, POCL), (case[0], cfg)
        for k, v in cfg.items:
            seen.setdefault(k, set()).add(v)
    assert seen == {k.name: set(k.values) for k in V.knobs(None, POCL)}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_dwpw_matches_reference(case, cl_ctx):
    cid, cfg = case[0], case[5]
    l = case_layer(case)
    cfg = Config.from_dict(cfg) if cfg else V.fallback(l, POCL)
    rng = np.random.default_rng(zlib.crc32(cid.encode()))
    xs, prm = harness.random_inputs(l, rng)
    want = reference.forward(l, xs, prm)
    got = harness.run_layer(l, V, cfg, xs, prm, ctx=cl_ctx)
    ok, err = harness.close(got, want)
    assert ok, f"{cid} [{cfg}]: max error {err:.3g}"


def test_reference_is_the_unfused_pair():
    l, dw, pw = residual_pair((1, 8, 7, 7), dict(kernel=3, pad=1, act="relu6"),
                              dict(out=4, act="relu"))
    rng = np.random.default_rng(3)
    xs, prm = harness.random_inputs(l, rng)
    d = reference.forward(dw, xs[:1], {"weight": prm["dw_weight"], "bias": prm["dw_bias"]})
    y = reference.forward(pw, [d, xs[1]], {"weight": prm["weight"], "bias": prm["bias"]})
    assert np.array_equal(reference.forward(l, xs, prm), y)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The MobileNet-like network built with the fusion forced on and off (fallback kernels,
    not run by the build)."""
    from aotconv.compiler import compile_network
    out = tmp_path_factory.mktemp("dwpw")
    src = out / "mbtiny.yaml"
    src.write_text(yaml.safe_dump(mobilenet_dict(), sort_keys=False))
    return src, {p: compile_network(str(src), target="pocl-cpu", outdir=out / p,
                                    tune_mode="fallback", measure=False, quiet=True,
                                    fuse_dwpw=p) for p in ("always", "never")}


def test_network_fused_and_not_matches_numpy(builds):
    from aotconv.runtime import load
    src, res = builds
    on, off = res["always"], res["never"]
    assert [l.op for l in on.net.layers].count("conv_dwpw") == 3
    assert "conv_dwpw" not in [l.op for l in off.net.layers]
    assert len(on.schedule.run_launches) == len(off.schedule.run_launches) - 3
    assert [d.fused for d in on.schedule.dwpw] == [True] * 3
    # after the residual adds: the add fused into b2_pw first, then b2_dw into it
    assert on.net.layer("b2_pw").attrs.get("residual") and [d.fused for d in on.schedule.residual]
    assert [d.fused for d in off.schedule.dwpw] == [False] * 3
    doc = json.loads((on.outdir / "tuning.json").read_text())
    assert [d["conv"] for d in doc["dwpw_fusion"] if d["fused"]] == ["b1_pw", "b2_pw", "b3_pw"]
    report = (on.outdir / "report.md").read_text()
    assert "| b2_pw | b2_dw |" in report and "b2_dw (b2_dw_bn; run in b2_pw)" in report

    net0 = spec.load_network(str(src))
    flat = params_mod.random_params(net0, seed=11)       # the user's parameters, as written
    x = np.random.default_rng(7).standard_normal(net0.input_shape).astype(np.float32)
    want = reference.run_network(net0, x, params_mod.split(net0, flat))[0]
    for r in (on, off):
        with load(r.outdir) as lib:
            lib.set_params(flat)
            ok, err = harness.close(lib(x), want)
            assert ok, err

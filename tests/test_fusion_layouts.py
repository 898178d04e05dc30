"""Pool fusion and layouts: conv_pool_direct and layout_convert on PoCL against the reference,
the fuse_pool rewrite, the fusion decision, the layout plan (dynamic programme over chains),
conversion insertion, and one network built end to end with a fused pool and three layout
conversions that still matches numpy.

The layouts mechanism is proven with a test-only variant (a direct conv that reads and writes
NHWC and re-lays its filter out in set_params), registered here through monkeypatch. The
network tests restrict the registry to the plain variants: what is under test is the fusion
and the conversions, and the tuned variants' large spaces would cost a minute of enumeration
in choose's fallback mode alone.
"""
import json
import zlib

import numpy as np
import pytest

from aotconv import fusion, harness, layouts, ops, passes, reference, spec, variants
from aotconv import params as params_mod
from aotconv.choose import Choice
from aotconv.context import BuildContext
from aotconv.graph import Layer, count
from aotconv.schedule import build_schedule
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Variant, Knob, Config, Launch, In, Out, Param, Buffer, round_up

POCL = TARGETS["pocl-cpu"]


def make_layer(op, in_shapes, name=None, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(name or op, op, a, ["input"], in_shapes=[tuple(s) for s in in_shapes],
                 out_shape=out, params=params)


def conv_pool_layer(in_shape, conv, pool_op, pool):
    """(conv_pool layer, conv layer, pool layer) built as fuse_pool builds them."""
    c = make_layer("conv", [in_shape], **conv)
    p = make_layer(pool_op, [c.out_shape], **pool)
    a = dict(c.attrs, pool=ops.pool_attrs("max" if pool_op == "maxpool" else "avg", p.attrs))
    out, params = ops.infer("conv_pool", a, [tuple(in_shape)])
    return Layer("cp", "conv_pool", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params), c, p


# -- conv_pool_direct against the reference ---------------------------------------------------

CONV_POOL = [
    # id, input, conv attrs, pool op, pool attrs, a non-fallback config
    ("max2x2s2_relu", (2, 3, 12, 12), dict(out=8, kernel=3, pad=1, act="relu"),
     "maxpool", dict(kernel=2), dict(WG=64, KB=4)),
    ("max3x3s2_ceil_overlap_tanh", (1, 4, 15, 13), dict(out=6, kernel=5, act="tanh"),
     "maxpool", dict(kernel=3, stride=2, ceil_mode=True), dict(WG=32, KB=2)),
    ("avg_pad_incl_ceil_conv_s2p2", (1, 3, 13, 11), dict(out=4, kernel=3, stride=2, pad=2),
     "avgpool", dict(kernel=3, stride=2, pad=1, ceil_mode=True, count_include_pad=True),
     dict(WG=32, KB=4)),
    ("avg_pad_excl_groups_dil_sigmoid_nobias", (1, 4, 11, 11),
     dict(out=6, kernel=3, groups=2, dilation=2, pad=1, act="sigmoid", bias=False),
     "avgpool", dict(kernel=3, stride=2, pad=1), dict(WG=32, KB=1)),
    ("max_depthwise_leaky_s1", (1, 5, 9, 7),
     dict(out=5, kernel=[3, 2], pad=[1, 0], groups=5, act="leaky_relu", alpha=0.2),
     "maxpool", dict(kernel=2, stride=1), dict(WG=128, KB=1)),
    ("avg_incl_leaky_conv_stride", (2, 3, 10, 9),
     dict(out=4, kernel=3, stride=[2, 1], pad=1, act="leaky_relu", alpha=0.1),
     "avgpool", dict(kernel=2, pad=1, count_include_pad=True), dict(WG=32, KB=2)),
]


@pytest.mark.parametrize("which", ["fallback", "alt"])
@pytest.mark.parametrize("case", CONV_POOL, ids=[c[0] for c in CONV_POOL])
def test_conv_pool_matches_reference(case, which):
    cid, shape, conv, pool_op, pool, alt = case
    layer, c, p = conv_pool_layer(shape, conv, pool_op, pool)
    v = BY_NAME["conv_pool_direct"]
    assert v.supports(layer) is None and v.supports(c) is not None
    rng = np.random.default_rng(zlib.crc32(cid.encode()))
    xs, prm = harness.random_inputs(layer, rng)
    want = reference.forward(layer, xs, prm)
    # the reference of the fused op is the unfused pair's
    unfused = reference.forward(p, [reference.forward(c, xs, prm)], {})
    assert np.allclose(want, unfused, rtol=0, atol=0)
    cfg = v.fallback(layer, POCL) if which == "fallback" else Config.from_dict(alt)
    assert all(k.check(layer, cfg, POCL) for k in v.constraints), cfg
    got = harness.run_layer(layer, v, cfg, xs, prm)
    ok, err = harness.close(got, want)
    assert ok, f"{cid} [{cfg}]: max error {err:.3g}"


def test_conv_pool_fallback_valid_on_every_target():
    from aotconv.space import variant_space
    v = BY_NAME["conv_pool_direct"]
    for case in CONV_POOL:
        layer = conv_pool_layer(*case[1:5])[0]
        for t in TARGETS.values():
            sp = variant_space(layer, v, t)
            assert v.fallback(layer, t) in sp.points and not sp.errors, (case[0], t.name)


def test_conv_pool_costs():
    layer, c, p = conv_pool_layer((1, 3, 12, 12), dict(out=8, kernel=3, pad=1), "maxpool",
                                  dict(kernel=2))
    assert ops.flops(layer) == ops.flops(c) + ops.flops(p)
    # the conv's output never reaches memory
    assert ops.bytes_moved(layer) == 4 * (count(layer.in_shape) + count(layer.out_shape)
                                          + sum(count(s) for _, s in layer.params))
    assert ops.bytes_moved(layer) < ops.bytes_moved(c) + ops.bytes_moved(p)


# -- layout_convert against the reference -------------------------------------------------------

PAIRS = [(a, b) for a in ops.LAYOUTS for b in ops.LAYOUTS if a != b]


@pytest.mark.parametrize("cfg", [dict(TILE=0, WG=64), dict(TILE=16, WG=64)],
                         ids=["elementwise", "tiled16"])
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_layout_convert_matches_reference(src, dst, cfg):
    shape = (3, 5, 7, 2) if cfg["TILE"] == 0 else (2, 19, 5, 7)   # partial tiles on both sides
    layer = Layer("lc", "layout_convert", dict(src=src, dst=dst), ["input"], in_shapes=[shape],
                  out_shape=shape)
    v = BY_NAME["layout_convert"]
    cfg = Config.from_dict(cfg)
    assert all(k.check(layer, cfg, POCL) for k in v.constraints)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    # logically the identity; the variant states the layouts, the caller lays the data out
    assert np.array_equal(reference.forward(layer, [x], {}), x)
    assert v.layouts_of(layer, cfg) == (src, dst)
    stored = reference.to_layout(x, src).reshape(shape)        # the harness passes buffers as is
    got = harness.run_layer(layer, v, cfg, [stored], {})
    assert np.array_equal(got.ravel(), reference.to_layout(x, dst))


def test_same_storage():
    assert layouts.same_storage((4, 8, 1, 1), "NCHW", "NHWC")      # dense-like: no transpose
    assert layouts.same_storage((1, 8, 5, 5), "NCHW", "CHWN")      # batch 1
    assert not layouts.same_storage((1, 8, 5, 5), "NCHW", "NHWC")
    assert not layouts.same_storage((2, 8, 1, 1), "NCHW", "CHWN")


# -- the fuse_pool rewrite (device-free) --------------------------------------------------------

NET = """\
name: fp
input: [2, 3, 16, 16]
outputs: [out, side]
layers:
  - {name: c1, op: conv, out: 4, kernel: 3, pad: 1}
  - {name: r1, op: relu}
  - {name: p1, op: maxpool, kernel: 2}
  - {name: c2, op: conv, out: 6, kernel: 3}
  - {name: p2, op: avgpool, kernel: 3, stride: 2, pad: 1, ceil_mode: true}
  - {name: side, op: maxpool, kernel: 2, inputs: [c2]}
  - {name: c3, op: conv, out: 5, kernel: 1, inputs: [p2]}
  - {name: out, op: avgpool, kernel: 2}
"""


def _net(tmp_path, text=NET):
    f = tmp_path / "net.yaml"
    f.write_text(text)
    return passes.optimise(spec.load_network(str(f)))


def test_fuse_pool_rewrites_the_graph(tmp_path):
    net = _net(tmp_path)
    # c2 has two readers; c3 -> out is fusable although out is a network output
    assert passes.fusable_pools(net) == [("c1", "p1"), ("c3", "out")]
    f = passes.fuse_pool(net)
    names = [l.name for l in f.layers]
    assert names == ["c1", "c2", "p2", "side", "c3"]
    c1 = f.layer("c1")
    assert c1.op == "conv_pool" and c1.fused == ["r1", "p1"] and c1.attrs["act"] == "relu"
    assert dict(c1.attrs["pool"]) == dict(kind="max", kernel=(2, 2), stride=(2, 2), pad=(0, 0),
                                         ceil_mode=False)
    assert c1.out_shape == net.layer("p1").out_shape and c1.params == net.layer("c1").params
    assert f.layer("c2").inputs == ["c1"]
    assert f.outputs == ["c3", "side"]
    assert dict(f.layer("c3").attrs["pool"])["kind"] == "avg"
    # the weights keep their place in the flat parameter array
    assert f.param_layout() == net.param_layout()
    # the signature carries the pool: a fused layer never shares records with its conv
    assert c1.signature() != net.layer("c1").signature()
    hash(c1.signature())
    # only the named pairs; the input network is untouched; bad names are refused
    g = passes.fuse_pool(net, ["c3"])
    assert [l.op for l in g.layers].count("conv_pool") == 1 and net.layer("c1").op == "conv"
    with pytest.raises(ValueError, match="c2"):
        passes.fuse_pool(net, ["c2"])
    # the reference of the fused network equals the original's
    params = reference.random_network_params(net, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal(net.input_shape)
    for a, b in zip(reference.run_network(net, x, params), reference.run_network(f, x, params)):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_fusion_decision():
    def ch(ms):
        return Choice("x", Config(), ms, "tuned")
    pairs = [("a", "pa"), ("b", "pb"), ("c", "pc")]
    choices = {"a": ch(1.0), "pa": ch(0.5), "b": ch(1.0), "pb": ch(0.2), "c": ch(None),
               "pc": ch(0.1)}
    fused = {"a": ch(1.2), "b": ch(1.3), "c": ch(0.5)}
    d = fusion.decide(pairs, choices, fused, "measure")
    assert [x.fused for x in d] == [True, False, False]
    assert (d[0].conv_ms, d[0].pool_ms, d[0].fused_ms) == (1.0, 0.5, 1.2)
    assert "faster" in d[0].why and "slower" in d[1].why and "not measured: conv" in d[2].why
    assert all(x.fused for x in fusion.decide(pairs, choices, fused, "always"))
    assert not any(x.fused for x in fusion.decide(pairs, choices, fused, "never"))


def test_fusion_apply_never_fuses_unmeasured(tmp_path):
    net = _net(tmp_path)
    choices = {l.name: Choice("x", Config(), None) for l in net.layers}
    called = []
    out, ch, d = fusion.apply(net, choices, POCL, "measure", "fallback",
                              lambda n, only: called.append(only) or {})
    assert out.layers == net.layers and ch == choices and not any(x.fused for x in d)
    assert called == []                       # fallback mode: nothing to measure, nothing asked
    with pytest.raises(Exception, match="fuse_pool"):
        fusion.apply(net, choices, POCL, "sometimes", "fallback", None)


# -- a test-only NHWC variant -------------------------------------------------------------------

NHWC_SRC = """\
// ${prefix}: test-only direct convolution, NHWC in and out, filter [KH][KW][C][K]
__kernel void ${prefix}_pack(__global const float* restrict w, __global float* restrict wt)
{
    const int gid = get_global_id(0);          // over w in its user layout [K][C][KH][KW]
    if (gid >= ${K * C * KH * KW})
        return;
    const int j = gid % ${KW}, i = gid / ${KW} % ${KH}, c = gid / ${KW * KH} % ${C};
    const int k = gid / ${KW * KH * C};
    wt[((i * ${KW} + j) * ${C} + c) * ${K} + k] = w[gid];
}
__kernel void ${prefix}(__global const float* restrict x, __global const float* restrict wt,
                        __global const float* restrict b, __global float* restrict y)
{
    const int gid = get_global_id(0);          // over y in NHWC order
    if (gid >= ${N * P * Q * K})
        return;
    const int k = gid % ${K}, q = gid / ${K} % ${Q}, p = gid / ${K * Q} % ${P};
    const int n = gid / ${K * Q * P};
    float acc = b[k];
    for (int i = 0; i < ${KH}; ++i) {
        const int iy = p * ${SH} - ${PT} + i;
        if (iy < 0 || iy >= ${H}) continue;
        for (int j = 0; j < ${KW}; ++j) {
            const int ix = q * ${SW} - ${PL} + j;
            if (ix < 0 || ix >= ${W}) continue;
            for (int c = 0; c < ${C}; ++c)
                acc += x[((n * ${H} + iy) * ${W} + ix) * ${C} + c]
                       * wt[((i * ${KW} + j) * ${C} + c) * ${K} + k];
        }
    }
    y[gid] = ${ACT};
}
"""


class ConvNHWC(Variant):
    """Reads and writes NHWC; supports only convs named nhwc* (groups 1, dilation 1, bias)."""
    name = "test_conv_nhwc"
    ops = ("conv",)
    layouts = ("NHWC", "NHWC")
    template = "kernels/conv_direct.cl.mako"       # for template_hash only

    def supports(self, layer):
        a = layer.attrs
        if (layer.op == "conv" and layer.name.startswith("nhwc") and a["groups"] == 1
                and a["dilation"] == (1, 1) and a["bias"] and a["act"] in ("none", "relu")):
            return None
        return "test-only"

    def knobs(self, layer, target):
        return [Knob("WG", (64,))]

    def _sizes(self, layer):
        a = layer.attrs
        n, c, h, w = layer.in_shape
        _, k, p, q = layer.out_shape
        return dict(N=n, C=c, H=h, W=w, K=k, P=p, Q=q, KH=a["kernel"][0], KW=a["kernel"][1],
                    SH=a["stride"][0], SW=a["stride"][1], PT=a["pad"][0], PL=a["pad"][1])

    def render(self, layer, cfg, prefix):
        from mako.template import Template
        act = "fmax(acc, 0.0f)" if layer.attrs["act"] == "relu" else "acc"
        return Template(NHWC_SRC, strict_undefined=True).render(prefix=prefix, ACT=act,
                                                                 **self._sizes(layer))

    def buffers(self, layer, cfg):
        return {"wt": count(layer.params[0][1])}

    def launches(self, layer, cfg, prefix):
        nw = count(layer.params[0][1])
        return [Launch(f"{prefix}_pack", (Param("weight"), Buffer("wt")), (round_up(nw, 64),),
                       (64,), phase="setup"),
                Launch(prefix, (In(0), Buffer("wt"), Param("bias"), Out()),
                       (round_up(count(layer.out_shape), 64),), (64,))]


PLAIN = ("conv_direct", "dense_direct", "pool_direct", "softmax_direct", "conv_pool_direct",
         "layout_convert")


@pytest.fixture
def registry(monkeypatch):
    """The plain variants, ours and the test-only NHWC conv first (so it is the fallback of the
    layers it supports)."""
    vs = [ConvNHWC()] + [BY_NAME[n] for n in PLAIN]
    monkeypatch.setattr(variants, "VARIANTS", vs)     # space reads it through variants.active()
    monkeypatch.setitem(BY_NAME, ConvNHWC.name, vs[0])
    return vs


def test_nhwc_variant_against_reference(registry):
    layer = make_layer("conv", [(2, 3, 7, 6)], name="nhwc_t", out=5, kernel=3, stride=2, pad=1,
                       act="relu")
    rng = np.random.default_rng(4)
    xs, prm = harness.random_inputs(layer, rng)
    v = registry[0]
    # the harness passes buffers as they are: give it NHWC, read NHWC back
    x_nhwc = reference.to_layout(xs[0], "NHWC").reshape(layer.in_shape)
    got = harness.run_layer(layer, v, Config.of(WG=64), [x_nhwc], prm)
    got = reference.from_layout(got.ravel(), "NHWC", layer.out_shape)
    assert harness.close(got, reference.forward(layer, xs, prm))[0]


# -- the layout plan (device-free) ------------------------------------------------------------

CHAIN = """\
name: ch
input: [2, 3, 12, 12]
layers:
  - {name: a, op: conv, out: 4, kernel: 3, pad: 1}
  - {name: nhwc_b, op: conv, out: 4, kernel: 3, pad: 1}
  - {name: nhwc_c, op: conv, out: 4, kernel: 3, pad: 1}
"""


def _fake(variant, ms):
    return Choice(variant, Config.of(WG=64) if variant == "test_conv_nhwc"
                  else Config.of(WG=64, KB=1), ms, "tuned")


def _plan(net, times, conv_ms):
    """Options {layer: [(variant, ms)]} -> the plan's layouts of each layer, and the report."""
    opts = {n: [_fake(v, ms) for v, ms in o] for n, o in times.items()}
    choices = {n: min(o, key=lambda c: c.time_ms) for n, o in opts.items()}
    got, rep = layouts.plan(net, choices, opts, lambda s, a, b: 0.0 if a == b else conv_ms)
    return {n: layouts.layouts_of(net.layer(n), c)[1] for n, c in got.items()}, rep


def test_plan_prefers_the_layout_that_avoids_conversions(tmp_path, registry):
    net = _net(tmp_path, CHAIN)
    # b is a little faster in NHWC, not enough to pay two conversions: NCHW throughout
    lay, rep = _plan(net, {"a": [("conv_direct", 1.0)],
                           "nhwc_b": [("conv_direct", 1.0), ("test_conv_nhwc", 0.9)],
                           "nhwc_c": [("conv_direct", 1.0)]}, 0.2)
    assert lay == {"a": "NCHW", "nhwc_b": "NCHW", "nhwc_c": "NCHW"}
    assert rep.alternatives == 1 and rep.changed[0]["layer"] == "nhwc_b"
    assert rep.planned_ms == pytest.approx(3.0) and rep.independent_ms == pytest.approx(3.3)
    # much faster: the conversions are paid
    lay, rep = _plan(net, {"a": [("conv_direct", 1.0)],
                           "nhwc_b": [("conv_direct", 1.0), ("test_conv_nhwc", 0.3)],
                           "nhwc_c": [("conv_direct", 1.0)]}, 0.2)
    assert lay["nhwc_b"] == "NHWC" and not rep.changed
    # b and c together: one NHWC stretch needs two conversions, whichever is the better deal
    both = {"a": [("conv_direct", 1.0)],
            "nhwc_b": [("conv_direct", 1.0), ("test_conv_nhwc", 0.9)],
            "nhwc_c": [("conv_direct", 1.0), ("test_conv_nhwc", 0.9)]}
    assert set(_plan(net, both, 0.2)[0].values()) == {"NCHW"}          # 3.0 < 3.2
    lay, rep = _plan(net, both, 0.05)                                   # 2.9 < 3.0
    assert (lay["nhwc_b"], lay["nhwc_c"]) == ("NHWC", "NHWC")
    assert rep.planned_ms == pytest.approx(2.9)
    opts = {n: [_fake(v, ms) for v, ms in o] for n, o in both.items()}
    planned, _ = layouts.plan(net, {n: o[0] for n, o in opts.items()}, opts,
                              lambda s, a, b: 0.05)
    assert build_schedule(net, planned).conversions == ["a_to_nhwc", "nhwc_c_to_nchw"]


def test_layout_options_from_records(tmp_path, registry, monkeypatch):
    """The plan's per-layout times come from the tuning records (re-queried after choose)."""
    from aotconv.targets import find_device, with_limits, device_identity
    from aotconv.tune.measure import Outcome, Status
    from aotconv.tune.records import Key, Store
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    net = _net(tmp_path, CHAIN)
    found = find_device(POCL)
    live, dev = with_limits(POCL, found[1]), device_identity(*found)
    db = tmp_path / "db.jsonl"
    store = Store(write=[db])
    b = net.layer("nhwc_b")
    for v, cfg, ms in [("conv_direct", Config.of(WG=64, KB=1), 1.0),
                       ("conv_direct", Config.of(WG=64, KB=2), 0.8),
                       ("test_conv_nhwc", Config.of(WG=64), 0.7)]:
        store.append(Key(b, BY_NAME[v], live, dev), cfg, Outcome(Status.OK, ms))
    chosen = {n: _fake("conv_direct", 1.0) for n in ("a", "nhwc_c")}
    chosen["nhwc_b"] = Choice("test_conv_nhwc", Config.of(WG=64), 0.7, "record")
    with BuildContext.make(POCL, mode="records", tuning_db=str(db)) as ctx:
        opts = layouts.layout_options(net, chosen, ctx)
    assert [(c.variant, c.time_ms) for c in opts["nhwc_b"]] == [("test_conv_nhwc", 0.7),
                                                                ("conv_direct", 0.8)]
    assert opts["a"] == [chosen["a"]]
    got, rep = layouts.plan(net, chosen, opts, lambda s, a, b: 0.0 if a == b else 0.3)
    assert got["nhwc_b"].variant == "conv_direct" and got["nhwc_b"].cfg["KB"] == 2
    assert rep.changed and rep.planned_ms == pytest.approx(2.8)
    assert rep.independent_ms == pytest.approx(2.7 + 0.6)


# -- insertion, and a whole network on PoCL ---------------------------------------------------

E2E = """\
name: fl
input: [2, 3, 12, 12]
outputs: [prob, nhwc2]
layers:
  - {name: nhwc1, op: conv, out: 4, kernel: 3, pad: 1, act: relu}
  - {name: nhwc2, op: conv, out: 6, kernel: 3}
  - {name: c3, op: conv, out: 5, kernel: 3, pad: 1, act: tanh, inputs: [nhwc2]}
  - {name: mp, op: maxpool, kernel: 3, stride: 2, ceil_mode: true}
  - {name: nhwc3, op: conv, out: 8, kernel: 5}
  - {name: fc, op: dense, out: 7}
  - {name: prob, op: softmax}
"""


def test_insert_conversions(tmp_path, registry):
    net = _net(tmp_path, E2E)
    choices = {l.name: Choice(layouts_variant(l), Config()) for l in net.layers}
    out, new = layouts.insert_conversions(net, choices)
    # input -> NHWC for nhwc1; nhwc2 -> NCHW shared by c3 and the output; mp -> NHWC for
    # nhwc3; nhwc3's 1x1 NHWC output is already NCHW storage for fc: no conversion
    assert [(l.name, l.inputs[0], l.attrs["src"], l.attrs["dst"]) for l in new] == [
        ("input_to_nhwc", "input", "NCHW", "NHWC"),
        ("nhwc2_to_nchw", "nhwc2", "NHWC", "NCHW"),
        ("mp_to_nhwc", "mp", "NCHW", "NHWC")]
    assert out.layer("nhwc1").inputs == ["input_to_nhwc"]
    assert out.layer("c3").inputs == ["nhwc2_to_nchw"] and out.outputs == ["prob", "nhwc2_to_nchw"]
    assert out.layer("fc").inputs == ["nhwc3"]
    names = [l.name for l in out.layers]
    assert names.index("nhwc2_to_nchw") == names.index("c3") - 1       # just before its reader
    # idempotent
    choices.update(layouts.fallback_convert_choices(new))
    assert layouts.insert_conversions(out, choices)[1] == []
    # conversions are logically the identity: the rewritten network computes the same outputs
    params = reference.random_network_params(net, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal(net.input_shape)
    for a, b in zip(reference.run_network(net, x, params), reference.run_network(out, x, params)):
        assert np.array_equal(a, b)


def layouts_variant(layer):
    if layer.name.startswith("nhwc"):
        return "test_conv_nhwc"
    return {"conv": "conv_direct", "maxpool": "pool_direct", "dense": "dense_direct",
            "softmax": "softmax_direct"}[layer.op]


@pytest.fixture
def e2e(tmp_path, registry):
    from aotconv.compiler import compile_network
    src = tmp_path / "fl.yaml"
    src.write_text(E2E)
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="fallback", measure=False, quiet=True, fuse_pool="always")
    return src, res


def test_network_with_fusion_and_conversions_matches_numpy(e2e):
    from aotconv.runtime import load
    src, res = e2e
    sch = res.schedule
    # c3 + mp fused into one kernel; three conversions as in test_insert_conversions
    assert res.net.layer("c3").op == "conv_pool" and res.net.layer("c3").fused == ["mp"]
    assert [d.fused for d in sch.fusion] == [True]
    assert sch.conversions == ["input_to_nhwc", "nhwc2_to_nchw", "c3_to_nhwc"]
    assert sch.choices["nhwc1"].variant == "test_conv_nhwc"
    assert sch.choices["c3"].variant == "conv_pool_direct"
    assert sum(1 for l in sch.launches if l.phase == "setup") == 3       # filters re-laid out
    doc = json.loads((res.outdir / "tuning.json").read_text())
    assert doc["layout_conversions"]["count"] == 3
    assert doc["pool_fusion"][0]["conv"] == "c3" and doc["pool_fusion"][0]["fused"]
    report = (res.outdir / "report.md").read_text()
    assert "Layout conversions inserted: **3**" in report and "| c3 | mp |" in report

    net0 = spec.load_network(str(src))
    flat = params_mod.read_bin(res.outdir / "fl.params.bin", net0)
    x = np.random.default_rng(7).standard_normal(net0.input_shape).astype(np.float32)
    refs = reference.run_network(net0, x, params_mod.split(net0, flat))
    with load(res.outdir) as lib:
        outs = lib(x)
        assert len(outs) == 2
        for o, r in zip(outs, refs):
            ok, err = harness.close(o, r)
            assert ok, err

"""Every plain variant on PoCL against reference.forward, over a workload table.

Each workload runs twice: with the variant's fallback configuration and with another point of
its knob space (the `alt` column). Shapes are odd on purpose (1, 7, primes) so that launches
end in partial work-groups. The device-free checks at the end keep the knob spaces honest: the
fallback passes every constraint, the alternatives too, and every point renders.
"""
from dataclasses import dataclass
import re
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, reference
from aotconv.graph import Layer
from aotconv.space import variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]

VARIANT_OF = {"conv": "conv_direct", "dense": "dense_direct", "maxpool": "pool_direct",
              "avgpool": "pool_direct", "global_avgpool": "global_avgpool_direct",
              "softmax": "softmax_direct", "lrn": "lrn_direct", "concat": "concat_direct",
              "add": "add_direct", "batchnorm": "batchnorm_direct"}


def make_layer(op, in_shapes, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(op, op, a, [f"in{i}" for i in range(len(in_shapes))],
                 in_shapes=[tuple(s) for s in in_shapes], out_shape=out, params=params)


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    in_shapes: tuple
    attrs: tuple          # raw net.yaml attributes, as (key, value) pairs
    alt: tuple            # a non-fallback configuration, as (knob, value) pairs

    def layer(self):
        return make_layer(self.op, self.in_shapes, **dict(self.attrs))

    @property
    def variant(self):
        return BY_NAME[VARIANT_OF[self.op]]


def case(id, op, in_shapes, alt, **attrs):
    return Case(id, op, tuple(map(tuple, in_shapes)), tuple(attrs.items()), tuple(alt.items()))


CASES = [
    # conv: kernel, stride, pad (incl. asymmetric same), dilation, groups, bias, every act
    case("conv_1ch_k3", "conv", [(1, 1, 7, 7)], dict(WG=32, KB=1), out=1, kernel=3),
    case("conv_k3x5_s2x1_p1x2_relu", "conv", [(2, 3, 13, 11)], dict(WG=128, KB=4),
         out=8, kernel=[3, 5], stride=[2, 1], pad=[1, 2], act="relu"),
    case("conv_same_s2_leaky", "conv", [(1, 4, 9, 10)], dict(WG=32, KB=2),
         out=6, kernel=4, stride=2, pad="same", act="leaky_relu", alpha=0.2),
    case("conv_dil2_g3_nobias_sigmoid", "conv", [(1, 6, 11, 11)], dict(WG=128, KB=2),
         out=6, kernel=3, dilation=2, pad=2, groups=3, bias=False, act="sigmoid"),
    case("conv_depthwise_s2_tanh", "conv", [(2, 8, 7, 9)], dict(WG=256, KB=1),
         out=8, kernel=3, groups=8, pad=1, stride=2, act="tanh"),
    case("conv_depthwise_x2_k1x3", "conv", [(1, 5, 8, 8)], dict(WG=32, KB=2),
         out=10, kernel=[1, 3], groups=5, pad=[0, 1]),
    case("conv_1x1_nobias", "conv", [(1, 16, 5, 5)], dict(WG=64, KB=8),
         out=24, kernel=1, bias=False),
    case("conv_same_dil_k3x2_s1x2", "conv", [(1, 3, 10, 7)], dict(WG=128, KB=1),
         out=5, kernel=[3, 2], dilation=[1, 2], stride=[1, 2], pad="same", act="leaky_relu"),
    case("conv_32to64_k3_relu", "conv", [(1, 32, 17, 17)], dict(WG=64, KB=8),
         out=64, kernel=3, pad=1, act="relu"),
    case("conv_window_is_input_tanh", "conv", [(3, 2, 5, 5)], dict(WG=32, KB=1),
         out=3, kernel=5, act="tanh"),
    # dense: flatten of C,H,W, bias on/off, every act, both reduction modes
    case("dense_7to3", "dense", [(1, 7, 1, 1)], dict(RED="group", WG=32), out=3),
    case("dense_flatten_relu", "dense", [(2, 3, 5, 5)], dict(RED="group", WG=64),
         out=13, act="relu"),
    case("dense_nobias_sigmoid", "dense", [(3, 97, 1, 1)], dict(RED="group", WG=64),
         out=10, bias=False, act="sigmoid"),
    case("dense_512_tanh", "dense", [(1, 512, 1, 1)], dict(RED="group", WG=256),
         out=37, act="tanh"),
    case("dense_to1_leaky", "dense", [(2, 11, 1, 1)], dict(RED="item", WG=32),
         out=1, act="leaky_relu", alpha=0.3),
    # pooling: floor and ceil_mode (incl. a dropped last window and an overhang), pads,
    # asymmetric windows and strides, count_include_pad both ways
    case("maxpool_k2", "maxpool", [(1, 3, 7, 7)], dict(WG=32, QB=2), kernel=2),
    case("maxpool_k3s2p1_ceil", "maxpool", [(2, 3, 13, 11)], dict(WG=32, QB=4),
         kernel=3, stride=2, pad=1, ceil_mode=True),
    case("maxpool_ceil_drop", "maxpool", [(1, 2, 6, 6)], dict(WG=32, QB=2),
         kernel=3, stride=2, pad=1, ceil_mode=True),
    case("maxpool_k3x2_s2x3_ceil", "maxpool", [(1, 3, 13, 11)], dict(WG=32, QB=4),
         kernel=[3, 2], stride=[2, 3], pad=[1, 1], ceil_mode=True),
    case("avgpool_k2", "avgpool", [(1, 3, 7, 7)], dict(WG=32, QB=2), kernel=2),
    case("avgpool_ceil_incl", "avgpool", [(2, 3, 13, 11)], dict(WG=32, QB=4),
         kernel=3, stride=2, pad=1, ceil_mode=True, count_include_pad=True),
    case("avgpool_ceil_excl", "avgpool", [(2, 3, 13, 11)], dict(WG=32, QB=2),
         kernel=3, stride=2, pad=1, ceil_mode=True),
    case("avgpool_overhang_incl", "avgpool", [(1, 1, 4, 4)], dict(WG=32, QB=2),
         kernel=3, stride=2, pad=1, ceil_mode=True, count_include_pad=True),
    case("avgpool_ceil_drop_incl", "avgpool", [(1, 2, 6, 6)], dict(WG=32, QB=4),
         kernel=3, stride=2, pad=1, ceil_mode=True, count_include_pad=True),
    case("avgpool_k1_1x1", "avgpool", [(1, 5, 1, 1)], dict(WG=32, QB=1), kernel=1),
    case("avgpool_k3x2_s1_p1x1_excl", "avgpool", [(1, 2, 7, 5)], dict(WG=32, QB=4),
         kernel=[3, 2], stride=1, pad=[1, 1]),
    # global average pooling
    case("gap_1x1", "global_avgpool", [(1, 7, 1, 1)], dict(RED="group", WG=32)),
    case("gap_7x7", "global_avgpool", [(2, 13, 7, 7)], dict(RED="group", WG=32)),
    case("gap_29x31", "global_avgpool", [(1, 3, 29, 31)], dict(RED="group", WG=256)),
    # softmax over channels
    case("softmax_10", "softmax", [(1, 10, 1, 1)], dict(RED="group", WG=32)),
    case("softmax_1000", "softmax", [(2, 1000, 1, 1)], dict(RED="group", WG=256)),
    case("softmax_spatial", "softmax", [(2, 7, 3, 5)], dict(RED="item", WG=32)),
    case("softmax_1ch", "softmax", [(1, 1, 2, 3)], dict(RED="group", WG=32)),
    # lrn: odd and even sizes, size 1, partial channel blocks
    case("lrn_alexnet", "lrn", [(1, 7, 3, 3)], dict(WG=32, CB=4), size=5),
    case("lrn_s3", "lrn", [(2, 13, 5, 4)], dict(WG=32, CB=8), size=3, alpha=0.5, k=2.0),
    case("lrn_even", "lrn", [(1, 17, 2, 3)], dict(WG=32, CB=16), size=4, alpha=0.9, beta=0.5),
    case("lrn_size1", "lrn", [(1, 5, 3, 1)], dict(WG=32, CB=4), size=1, alpha=0.3, k=1.5),
    case("lrn_window_wider_than_c", "lrn", [(1, 3, 2, 2)], dict(WG=32, CB=1), size=7, alpha=0.7),
    # concat
    case("concat_2", "concat", [(1, 3, 5, 5), (1, 4, 5, 5)], dict(MODE="split", WG=32)),
    case("concat_3", "concat", [(2, 1, 7, 3), (2, 5, 7, 3), (2, 2, 7, 3)],
         dict(MODE="split", WG=128)),
    # add: two or more inputs, fused act
    case("add_2_relu", "add", [(1, 3, 5, 5)] * 2, dict(WG=32, VEC=4), act="relu"),
    case("add_3", "add", [(2, 7, 3, 1)] * 3, dict(WG=32, VEC=2)),
    case("add_4_leaky", "add", [(1, 5, 7, 11)] * 4, dict(WG=32, VEC=8),
         act="leaky_relu", alpha=0.1),
    # batchnorm with fused act
    case("bn_leaky_alpha2", "batchnorm", [(1, 3, 5, 5)], dict(FOLD="inline", WG=32, VEC=2),
         act="leaky_relu", alpha=2),          # an integral alpha must still render "2.0f"
    case("bn_relu", "batchnorm", [(2, 7, 3, 11)], dict(FOLD="inline", WG=128, VEC=1),
         act="relu", eps=1e-3),
    case("bn_sigmoid_1x1", "batchnorm", [(1, 16, 1, 1)], dict(FOLD="setup", WG=32, VEC=4),
         act="sigmoid"),
]


_workloads = {}


def workload(c):
    """(layer, inputs, params, float64 reference) for a case: computed once, shared."""
    if c.id not in _workloads:
        layer = c.layer()
        rng = np.random.default_rng(zlib.crc32(c.id.encode()))
        xs, params = harness.random_inputs(layer, rng)
        _workloads[c.id] = layer, xs, params, reference.forward(layer, xs, params)
    return _workloads[c.id]


def config(c, which):
    layer = c.layer()
    return c.variant.fallback(layer, POCL) if which == "fallback" else Config(c.alt)


def fallback_and_alt():
    """(case, which) for every case and both configurations. make test runs every fallback
    and each alt that sets a knob (other than the work-group size) to a value no earlier case
    of its op did, so that every knob value runs; the slow tier the other alts."""
    seen, out = {}, []
    for c in CASES:
        knobs = {kv for kv in c.alt if kv[0] != "WG"}
        quick_alt = bool(knobs - seen.setdefault(c.op, set()))
        seen[c.op] |= knobs
        for which in ("fallback", "alt"):
            quick = which == "fallback" or quick_alt
            out.append(pytest.param(c, which, id=f"{c.id}-{which}",
                                    marks=() if quick else pytest.mark.slow))
    return out


@pytest.mark.parametrize("c,which", fallback_and_alt())
def test_variant_matches_reference(c, which):
    layer, xs, params, want = workload(c)
    cfg = config(c, which)
    got = harness.run_layer(layer, c.variant, cfg, xs, params)
    ok, err = harness.close(got, want)
    assert ok, f"{c.variant.name} [{cfg}] on {layer.signature_str()}: max error {err:.3g}"


# -- device-free ------------------------------------------------------------------------------------

def violated(variant, layer, cfg, target):
    return [k.name for k in variant.constraints if not k.check(layer, cfg, target)]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_fallback_valid_everywhere_and_alt_valid_on_pocl(c):
    layer = c.layer()
    v = c.variant
    # the first variant is the plain fallback; a depthwise conv's is conv_depthwise
    first = "conv_depthwise" if BY_NAME["conv_depthwise"].supports(layer) is None else v.name
    assert v.supports(layer) is None and v in for_layer(layer)
    assert for_layer(layer)[0].name == first
    for t in TARGETS.values():
        fb = v.fallback(layer, t)
        assert not violated(v, layer, fb, t), (t.name, fb)
        space = variant_space(layer, v, t)          # adds the device limits
        assert fb in space.points and not space.errors, (t.name, fb, space.errors)
    alt = Config(c.alt)
    assert alt != v.fallback(layer, POCL)
    knobs = {k.name: k.values for k in v.knobs(layer, POCL)}
    assert set(alt.as_dict()) == set(knobs) and all(x in knobs[k] for k, x in alt.items)
    assert not violated(v, layer, alt, POCL)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_every_point_renders_with_constants_and_prefixed_kernels(c):
    layer = c.layer()
    v = c.variant
    for cfg in v.configs(layer, POCL):
        src = v.render(layer, cfg, "net_l3")
        assert re.search(rf"^#define WG {cfg['WG']}\b", src, re.M)
        assert "${" not in src and "%>" not in src
        for l in v.launches(layer, cfg, "net_l3"):
            assert l.kernel == "net_l3" or l.kernel.startswith("net_l3_")
            assert re.search(rf"__kernel [^\n]*\n?void {l.kernel}\(", src), l.kernel
            assert all(g % s == 0 for g, s in zip(l.gsize, l.lsize))
            # sizes are compile-time constants: the only kernel arguments are buffers
            assert {a.kind for a in l.args} <= {"in", "out", "param", "buffer"}


def test_space_prunes_with_reasons():
    layer = make_layer("conv", [(1, 6, 9, 9)], out=6, kernel=3, groups=6)
    v = BY_NAME["conv_direct"]
    pruned = {}
    for cfg in v.configs(layer, TARGETS["fury-x"]):
        for name in violated(v, layer, cfg, TARGETS["fury-x"]):
            pruned[name] = pruned.get(name, 0) + 1
    # depthwise: only KB=1 keeps a block inside a group; WG=32 is below a 64-wide wavefront
    assert pruned["kb_divides_group"] == 12 and pruned["wg_fills_simd"] == 4
    assert [c["KB"] for c in v.configs(layer, POCL) if not violated(v, layer, c, POCL)] == [1] * 4

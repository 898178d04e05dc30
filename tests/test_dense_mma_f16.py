"""dense_mma_f16: the fp16 build's dense layers at small batch on the tensor cores (mma.sync
m16n8k16 .f16, FP32 sums), weights read in place.

Device-free: where it is offered (half layers of an fp16 build, K % 8 == 0, batch <= 64; the
tensor cores or the emulation switch), that it owns no buffer and no setup launch (the weight
is read as the user gave it), its reasons for the layers it leaves, its PTX through clang's
nvptx and ptxas for sm_90 without spills at VGG-16's fc6 size.

PoCL (the mma emulated): batches of 3, 16 and 17 (two tiles of 16 rows), K with a partial
32-deep chunk, a convolution that is a dense layer, bias or none, relu and tanh, split-K over
work-groups and warps taking turns, against the float64 reference within the half tolerance
and the half model within one half ulp; a kernel whose A fragments take the k of the other
step is caught.
"""
import functools
import zlib

import numpy as np
import pytest

from aotconv import harness, ops
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.space import variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)

V = BY_NAME["dense_mma_f16"]
H100 = TARGETS["h100"]


def dense(in_shape, out, storage="fp16", **raw):
    a = ops.normalise("dense", dict(out=out, **raw))
    if storage == "fp16":
        a["storage"] = "fp16"
    o, params = ops.infer("dense", a, [tuple(in_shape)])
    return Layer("fc", "dense", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=o,
                 params=params)


def conv_as_dense(in_shape, out, pad=0):
    a = ops.normalise("conv", dict(out=out, kernel=list(in_shape[2:]), act="relu", pad=pad))
    a["storage"] = "fp16"
    o, params = ops.infer("conv", a, [tuple(in_shape)])
    return Layer("fc", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=o,
                 params=params)


def _cfg(**kw):
    return Config(tuple(kw.items()))


# -- where it is offered ------------------------------------------------------------------------

def test_offered_to_fp16_dense_layers_on_tensor_cores_only(monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = dense((16, 512, 7, 7), 4096, act="relu")
    assert V.supports(layer) is None
    assert variant_space(layer, V, with_precision(H100, "fp16"), explain=False).points
    assert "--precision fp16" in V.supports(dense((16, 512, 7, 7), 4096, storage="fp32"))
    assert "K = C*H*W % 8 == 0" in V.supports(dense((16, 3, 5, 5), 10))
    assert "batch 65 > 64" in V.supports(dense((65, 64, 1, 1), 10))
    assert "padding zeros" in V.supports(conv_as_dense((2, 8, 4, 4), 6, pad=1))
    # no tensor cores, no switch: no point on PoCL
    assert not variant_space(layer, V, with_precision(TARGETS["pocl-cpu"], "fp16"),
                             explain=False).points


def test_the_weight_is_read_in_place():
    """No packed copy and no setup launch: the weight buffer the user gave is the mma's B."""
    layer = dense((16, 512, 7, 7), 4096, act="relu")
    for cfg in (_cfg(NT=1, WARPS=8, U=8, KSPLIT=1), _cfg(NT=2, WARPS=4, U=2, KSPLIT=4)):
        assert V.buffers(layer, cfg) == {}
        launches = V.launches(layer, cfg, "k")
        assert all(l.phase == "run" for l in launches)
        assert [a.name for a in launches[0].args if a.kind == "param"][0] == "weight"
        assert len(launches) == (1 if cfg["KSPLIT"] == 1 else 2)


def test_empty_slices_and_idle_warps_are_pruned():
    layer = dense((16, 256, 1, 1), 64)                   # 8 chunks of 32
    t = with_precision(H100, "fp16")
    names = lambda c: [k.name for k in V.constraints if not k.check(layer, c, t)]  # noqa: E731
    assert "slices_not_empty" in names(_cfg(NT=1, WARPS=1, U=1, KSPLIT=16))
    assert "warps_have_chunks" in names(_cfg(NT=1, WARPS=16, U=1, KSPLIT=1))
    assert names(_cfg(NT=1, WARPS=4, U=2, KSPLIT=1)) == []


# -- the PTX for NVIDIA's compiler --------------------------------------------------------------

def test_the_kernel_assembles_for_sm_90_without_spills(monkeypatch):
    """The whole kernel through clang's nvptx and ptxas for sm_90 (the H100) at fc6's size,
    the largest points of the space: mma.sync and 16-byte loads, no spilled register."""
    from mma_nhwc_helpers import assemble_sm90
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = dense((16, 512, 7, 7), 4096, act="relu")
    for cfg in (_cfg(NT=1, WARPS=8, U=8, KSPLIT=1), _cfg(NT=4, WARPS=2, U=4, KSPLIT=2)):
        ptx = assemble_sm90(V, layer, cfg)
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
        assert "ld.global.nc.v4.u32" in ptx


# -- on PoCL: the emulated mma ------------------------------------------------------------------

# id -> (layer, points); K = 72 and 200 leave a partial 32-deep chunk, 17 rows two tiles of 16
CASES = {
    "b3_k72_relu": (lambda: dense((3, 72, 1, 1), 20, act="relu"),
                    [dict(NT=2, WARPS=2, U=1, KSPLIT=1), dict(NT=1, WARPS=1, U=1, KSPLIT=2)]),
    "b17_k200_nobias_tanh": (lambda: dense((17, 8, 5, 5), 33, act="tanh", bias=False),
                             [dict(NT=4, WARPS=2, U=2, KSPLIT=1),
                              dict(NT=1, WARPS=2, U=1, KSPLIT=2)]),
    "b16_conv_is_dense": (lambda: conv_as_dense((16, 16, 4, 4), 24),
                          [dict(NT=1, WARPS=4, U=2, KSPLIT=1), dict(NT=2, WARPS=1, U=4, KSPLIT=2)]),
}


@functools.lru_cache(maxsize=None)
def case(cid):
    layer = CASES[cid][0]()
    xs, prm = harness.random_inputs(layer, np.random.default_rng(zlib.crc32(cid.encode())))
    return layer, xs, prm


@pytest.mark.parametrize("cid", list(CASES))
def test_emulated_dense_mma_f16_against_the_reference(emulated, cid):
    target, ctx = emulated
    layer, xs, prm = case(cid)
    valid = set(variant_space(layer, V, target, explain=False).points)
    for point in CASES[cid][1] + [None]:
        cfg = V.fallback(layer, target) if point is None else _cfg(**point)
        assert cfg in valid, cfg
        out = harness.run_layer(layer, V, cfg, xs, prm, target=target, ctx=ctx)
        check_half_output(layer, xs, prm, cfg, out)


def test_a_wrong_k_pairing_is_caught(emulated, monkeypatch):
    """The A fragments of step j must take the words of step j, as B does: a kernel whose A
    takes the other step's words multiplies x and W at different k, and the check fails."""
    target, ctx = emulated
    layer, xs, prm = case("b3_k72_relu")
    cfg = _cfg(NT=2, WARPS=2, U=1, KSPLIT=1)
    good = V.render(layer, cfg, "k")
    a_words = "{xv[u][mt][0][2 * j], xv[u][mt][1][2 * j],\n" \
              "                                       xv[u][mt][0][2 * j + 1], xv[u][mt][1][2 * j + 1]}"
    assert good.count(a_words) == 1
    bad = good.replace(a_words, a_words.replace("2 * j", "2 * (1 - j)"))
    monkeypatch.setattr(type(V), "render", lambda self, l, c, p: bad)
    out = harness.run_layer(layer, V, cfg, xs, prm, target=target, ctx=ctx)
    with pytest.raises(AssertionError, match="half tolerance"):
        check_half_output(layer, xs, prm, cfg, out)


def test_the_header_names_the_dense_layers_on_the_tensor_cores():
    from aotconv.choose import Choice
    from aotconv.precision import summary
    layer = dense((16, 512, 7, 7), 4096, act="relu")
    cfg = V.fallback(layer, with_precision(H100, "fp16"))
    choices = {"fc6": Choice(V.name, cfg), "fc7": Choice("dense_gemv", Config(())),
               "pool5": Choice("pool_direct", Config(()))}
    kind, text = summary(choices, "fp16", "fp16")
    assert kind == "fp16" and text.endswith(
        "on the tensor cores (f16 products, exact in FP32) in 1 of 2 conv and dense layers (fc6)")

"""Index width and memory: no kernel computes an index past INT_MAX, no tensor is planned past
the device's largest allocation or its global memory, and a variant without a valid point for a
layer never stops the build with an AssertionError.

Device-free except the last tests (PoCL: the live device's memory figures, and a tuned build of
a dense layer 10 -> 3 whose dense_gemv space is empty).
"""
import copy
from dataclasses import replace
import random

import pytest

from aotconv import space
from aotconv.choose import choose
from aotconv.errors import AotconvError, SpecError
from aotconv.fits import check_memory
from aotconv.graph import count
from aotconv.space import (INDEX_LIMIT, constraints_of, fallback_point, index_extents,
                           index_stride, indices_fit, layer_space, point_ok, report)
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS, Target, find_device, with_limits
from aotconv.tune.search import fallback_candidate
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config, NoFallback, round_up, ceil_div

H100 = TARGETS["h100"]
# a target no machine has (its device pattern matches nothing): its profile is all there is
NOWHERE = dict(vendor="no such vendor", device="^no such device$")


def with_batch(net, n):
    """`net` with batch n: spec refuses a tensor past INT_MAX elements, so the oversized
    networks below are a valid network with every shape scaled here."""
    net = copy.deepcopy(net)
    net.input_shape = (n,) + tuple(net.input_shape[1:])
    for l in net.layers:
        l.in_shapes = [(n,) + tuple(s[1:]) for s in l.in_shapes]
        l.out_shape = (n,) + tuple(l.out_shape[1:])
    return net


def vgg_conv1_1(batch):
    net = network_from_dict({"name": "v", "input": [1, 3, 224, 224], "layers": [
        {"name": "conv1_1", "op": "conv", "out": 64, "kernel": 3, "pad": 1, "act": "relu"}]})
    return with_batch(net, batch)


def relu_net(elements):
    """One relu over a tensor of exactly `elements` elements."""
    net = network_from_dict({"name": "r", "input": [1, 1, 1, 8], "layers": [
        {"name": "act", "op": "relu"}]})
    net.input_shape = (1, 1, 1, elements)
    net.layers[0].in_shapes = [(1, 1, 1, elements)]
    net.layers[0].out_shape = (1, 1, 1, elements)
    return net


# -- the constraint --------------------------------------------------------------------------

def test_a_layer_past_int32_has_no_point_in_any_variant():
    """VGG-16's conv1_1 at batch 1024: 3,288,334,336 output elements. Every conv variant's space
    is pruned whole by device.index_width, at the root of the staged walk."""
    layer = vgg_conv1_1(1024).layers[0]
    assert count(layer.out_shape) == 3_288_334_336
    sp = layer_space(layer, H100)
    from aotconv.precision import reason as precision_reason
    assert {p.variant.name for p in sp.parts} == {v.name for v in for_layer(layer)
                                                  if precision_reason(v, H100) is None}
    for p in sp.parts:
        assert p.points == [], p.variant.name
        assert p.first["device.index_width"] == p.total > 0, p.variant.name
    assert "device.index_width" in report(sp, exact=False)


def test_the_same_layer_fits_at_a_batch_that_does():
    layer = vgg_conv1_1(600).layers[0]              # 1,926,758,400 elements
    sp = layer_space(layer, H100, variants=[BY_NAME["conv_direct"]])
    assert sp.parts[0].points and sp.parts[0].first["device.index_width"] == 0


def test_padding_and_work_items_count_exactly():
    """An elementwise layer 200 elements below 2^31: whether a point fits depends on how far its
    work-group rounding and its VEC elements per work-item reach, and on a work-group stride of
    headroom. The space keeps exactly the points an independent count keeps."""
    n = 2 ** 31 - 200
    layer = relu_net(n).layers[0]
    v = BY_NAME["eltwise"]
    target = replace(H100, name="big-wg", max_wg_size=1024)
    sp = layer_space(layer, target, variants=[v])
    expect = []
    for cfg in v.configs(layer, target):
        wg, vec = cfg["WG"], cfg["VEC"]
        reach = round_up(ceil_div(n, vec), wg) * vec         # one past the largest i0 + v
        fits = max(n, reach) <= INDEX_LIMIT - wg + 1         # `i` stays an int, with headroom
        others = all(c.check(layer, cfg, target) for c in constraints_of(v, target)
                     if c.name != "device.index_width")
        if fits and others:
            expect.append(cfg)
    assert sp.parts[0].points == expect
    assert 0 < len(expect) < sp.parts[0].total            # the boundary cuts through the space
    # WG=256, VEC=1 rounds 2^31 - 200 up to 2^31: the last work-item's id is past INT_MAX
    assert not indices_fit(v, layer, Config.of(WG=256, VEC=1))
    assert indices_fit(v, layer, Config.of(WG=64, VEC=1))
    # the named extents agree with the fast check
    for cfg in v.configs(layer, target):
        limit = INDEX_LIMIT - index_stride(v, layer, cfg) + 1
        assert indices_fit(v, layer, cfg) == all(e <= limit for _, e in
                                                 index_extents(v, layer, cfg)), cfg
    ext = dict(index_extents(v, layer, Config.of(WG=64, VEC=4)))
    assert ext["elements indexed by k"] == round_up(ceil_div(n, 4), 64) * 4


def test_the_staged_walk_and_the_full_walk_agree_at_the_boundary():
    layer = relu_net(2 ** 31 - 200).layers[0]
    v = BY_NAME["eltwise"]
    fast = space.variant_space(layer, v, H100, explain=False)
    full = space.variant_space(layer, v, H100, explain=True)
    assert fast.points == full.points
    assert full.alone["device.index_width"] > 0


def _random_points(variant, layer, target, k, seed=0):
    rng = random.Random(seed)
    knobs = variant.knobs(layer, target)
    for _ in range(k):
        yield Config(tuple((kn.name, rng.choice(kn.values)) for kn in knobs))


def conv_layer(c, hw, out, batch):
    return with_batch(network_from_dict({"name": "c", "input": [1, c, hw, hw], "layers": [
        {"name": "c", "op": "conv", "out": out, "kernel": 3, "pad": 1}]}), batch).layers[0]


def dense_layer(k, out, batch=1):
    """A dense layer k -> out, built small and then resized (spec refuses a weight past
    INT_MAX elements)."""
    layer = copy.deepcopy(network_from_dict({"name": "d", "input": [1, 8, 1, 1], "layers": [
        {"name": "d", "op": "dense", "out": 4}]}).layers[0])
    layer.in_shapes, layer.out_shape = [(batch, k, 1, 1)], (batch, out, 1, 1)
    layer.params = [("weight", (out, k)), ("bias", (out,))]
    return layer


@pytest.mark.parametrize("name,make", [
    ("conv_im2col", lambda: conv_layer(512, 56, 512, 256)),     # scratch past INT_MAX at IMGS=256
    ("conv_winograd", lambda: conv_layer(64, 224, 64, 160)),    # V and Mo in scratch
    ("dense_gemm", lambda: dense_layer(46340, 46340, 64)),      # the weight padded to tiles
    ("dense_gemv", lambda: dense_layer(50000, 50000)),          # the weight itself
])
def test_device_index_width_covers_the_checks_the_variants_once_made(name, make):
    """conv_im2col, conv_winograd, dense_gemm and dense_gemv once checked 32-bit indices
    themselves: no buffer, scratch or tensor of theirs past INT_MAX. They declare no index
    check now; device.index_width, judged once for every variant, rejects every point theirs
    rejected."""
    v = BY_NAME[name]
    layer = make()
    assert not any("int32" in c.name for c in v.constraints)
    names = [c.name for c in constraints_of(v, H100)]
    assert names.count("device.index_width") == 1
    tensors = max(n for _, n in space.tensor_extents(layer))
    rejected = 0
    for cfg in _random_points(v, layer, H100, 300):
        own = list(v.buffers(layer, cfg).values()) + [v.scratch_floats(layer, cfg), tensors]
        if max(own) > INDEX_LIMIT:
            rejected += 1
            assert not indices_fit(v, layer, cfg), cfg
    assert rejected > 0                                   # the layers are big enough to matter


def test_device_max_alloc_prunes_oversized_scratch():
    """im2col's scratch at batch 32 for a 512-channel 56x56 3x3 layer: 462M floats (1.7 GiB)
    with every image in one pass, 116M with IMGS=8. Under a 1 GiB allocation limit only the
    smaller chunks are left."""
    layer = conv_layer(512, 56, 512, 32)
    v = BY_NAME["conv_im2col"]
    small = replace(H100, name="1gib", max_alloc_bytes=1 << 30)
    for cfg in _random_points(v, layer, small, 200, seed=1):
        biggest = max(list(v.buffers(layer, cfg).values()) + [v.scratch_floats(layer, cfg)])
        check = [c for c in constraints_of(v, small) if c.name == "device.max_alloc"][0]
        assert check.check(layer, cfg, small) == (4 * biggest <= 1 << 30), cfg
    assert point_ok(layer, v, v.fallback(layer, small), small)
    assert v.fallback(layer, small)["IMGS"] < 32                # the whole batch does not fit


# -- choose: the error a user sees -------------------------------------------------------------

def test_choose_without_a_device_names_the_layer_the_reason_and_what_to_do():
    net = vgg_conv1_1(1024)
    for mode in ("records", "fallback"):
        with pytest.raises(AotconvError) as e:
            choose(net, replace(H100, name="h100-absent", **NOWHERE), mode=mode, quiet=True)
        msg = str(e.value)
        assert "\n" not in msg and "conv1_1" in msg
        assert "device.index_width" in msg and "smaller batch" in msg
        assert "conv_direct" in msg and "conv_igemm" in msg


def test_choose_an_elementwise_layer_whose_padding_alone_overflows():
    """2^31 - 1 elements fit an int, but every launch of the activation rounds past it."""
    net = relu_net(2 ** 31 - 1)
    with pytest.raises(AotconvError, match=r"layer 'act'.*eltwise by device\.index_width.*"
                                           r"smaller batch"):
        choose(net, replace(H100, name="h100-absent", **NOWHERE), mode="fallback", quiet=True)


# -- memory ------------------------------------------------------------------------------------

TINY = Target("tiny", "no such vendor", "^no such device$", "gpu", 256, 32 * 1024, 4, 32,
              max_alloc_bytes=64 << 20, global_mem_bytes=256 << 20,
              description="a device with 64 MiB buffers and 256 MiB in all")


def test_targets_have_memory_figures():
    for t in TARGETS.values():
        assert 128 << 20 <= t.max_alloc_bytes <= t.global_mem_bytes, t.name
        # the OpenCL minimum a device may report: a quarter of global memory (or 128 MiB)
        assert t.max_alloc_bytes >= max(t.global_mem_bytes // 4, 128 << 20), t.name


def test_a_parameter_past_the_largest_allocation_is_an_error_naming_file_layer_tensor():
    net = network_from_dict({"name": "d", "input": [1, 64, 1, 1], "layers": [
        {"name": "r", "op": "relu"},
        {"name": "fc", "op": "dense", "out": 300000}]}, file="net.yaml")
    with pytest.raises(SpecError) as e:
        check_memory(net, TINY)
    msg = str(e.value)
    assert msg.startswith("net.yaml:2: layer 'fc': its parameter 'weight' (300000x64 floats")
    assert "largest buffer target 'tiny' can allocate (64.0 MiB)" in msg
    assert "make the layer smaller" in msg and "\n" not in msg


def test_an_activation_past_the_largest_allocation_names_the_largest_batch_that_fits():
    src = {"name": "c", "input": [64, 16, 128, 128], "layers": [
        {"name": "c1", "op": "conv", "out": 64, "kernel": 3, "pad": 1},
        {"name": "p", "op": "maxpool", "kernel": 2}]}
    with pytest.raises(SpecError, match=r"layer 'c1': its output \(64x64x128x128 floats, "
                                        r"256\.0 MiB\).*--batch (\d+) or less") as e:
        check_memory(network_from_dict(src), TINY)
    most = int(e.value.message.split("--batch ")[1].split()[0])
    check_memory(network_from_dict(dict(src, input=[most, 16, 128, 128])), TINY)   # fits
    with pytest.raises(SpecError):
        check_memory(network_from_dict(dict(src, input=[most + 1, 16, 128, 128])), TINY)


def test_a_network_past_global_memory_is_an_error_before_anything_is_chosen():
    """Every tensor fits one 64 MiB buffer, but the parameters (7 x 39 MiB) do not fit 256 MiB
    together."""
    net = network_from_dict({"name": "m", "input": [1, 3200, 1, 1], "layers": [
        {"name": f"fc{i}", "op": "dense", "out": 3200} for i in range(7)]}, file="m.yaml")
    with pytest.raises(SpecError, match=r"^m\.yaml:\d+: layer 'fc\d': the network needs at "
                                        r"least .* more than target 'tiny' has \(256\.0 MiB\)"):
        choose(net, TINY, mode="fallback", quiet=True)


def test_the_build_refuses_before_rendering_or_allocating(tmp_path, monkeypatch):
    """`out: 2000000` on a 64-feature input: a 488 MiB weight. The build stops at choose:
    no kernel rendered, no parameters generated, nothing written."""
    from aotconv import compiler, params
    monkeypatch.setitem(TARGETS, "tiny", TINY)
    src = tmp_path / "big.yaml"
    src.write_text("name: big\ninput: [1, 64, 1, 1]\nlayers:\n"
                   "  - {name: fc, op: dense, out: 2000000}\n")

    def never(*a, **k):
        raise AssertionError("reached after the memory check")

    monkeypatch.setattr(params, "random_params", never)
    monkeypatch.setattr(compiler, "emit", never)
    with pytest.raises(SpecError, match=r"big\.yaml:4: layer 'fc': its parameter 'weight'"):
        compiler.compile_network(str(src), target="tiny", outdir=tmp_path / "out",
                                 tune_mode="fallback", quiet=True)
    assert not (tmp_path / "out" / "kernels").exists()


# -- no fallback: no AssertionError ------------------------------------------------------------

def dense_10_3():
    return network_from_dict({"name": "d", "input": [1, 10, 1, 1], "layers": [
        {"name": "y", "op": "dense", "out": 3}]})


def test_a_variant_with_an_empty_space_offers_no_fallback():
    """dense 10 -> 3 on PoCL's profile: dense_gemv's work-groups (32 and up) are wider than the
    5-vector rows they would stride over (wg_not_idle allows 16), so its space is empty and its
    fallback() raises NoFallback; fallback_point says None and the layer falls back on
    dense_direct."""
    layer = dense_10_3().layers[0]
    t = TARGETS["pocl-cpu"]
    gemv = BY_NAME["dense_gemv"]
    assert layer_space(layer, t, variants=[gemv]).parts[0].points == []
    with pytest.raises(NoFallback, match="dense_gemv: no fallback point is valid"):
        gemv.fallback(layer, t)
    assert fallback_point(layer, gemv, t) is None
    assert fallback_candidate(layer, t).variant == "dense_direct"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fallback_point_never_raises(target):
    t = TARGETS[target]
    layers = dense_10_3().layers + network_from_dict({"name": "o", "input": [1, 3, 7, 7],
                                                      "layers": [
        {"name": "c", "op": "conv", "out": 5, "kernel": 7},            # a dense layer in disguise
        {"name": "g", "op": "conv", "out": 6, "kernel": 3, "groups": 3, "stride": 2,
         "inputs": ["input"]}]}).layers
    for layer in layers:
        for v in for_layer(layer):
            cfg = fallback_point(layer, v, t)
            assert cfg is None or point_ok(layer, v, cfg, t)


# -- PoCL --------------------------------------------------------------------------------------

POCL = TARGETS["pocl-cpu"]
pocl = pytest.mark.skipif(find_device(POCL) is None, reason="PoCL is not installed")


@pocl
def test_the_live_device_s_memory_replaces_the_profile_s():
    dev = find_device(POCL)[1]
    live = with_limits(POCL, dev)
    assert live.max_alloc_bytes == dev.max_mem_alloc_size
    assert live.global_mem_bytes == min(dev.global_mem_size, 1 << dev.address_bits)


@pocl
def test_tuning_a_dense_layer_whose_gemv_space_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    ch = choose(dense_10_3(), "pocl-cpu", budget=3, strategy="random", jobs=1, quiet=True)
    c = ch["y"]
    assert c.source == "tuned" and c.stats.ok >= 1 and c.variant != "dense_gemv"

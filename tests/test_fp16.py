"""--precision fp16: half storage of weights and activations, FP32 arithmetic.

Device-free: FP32 kernels render byte for byte as before half storage existed (every variant's
fallback over the layers of tools/compare_variants.py, tests/data/fp32_renders.json); the
storage helpers' half text; the option accepted; the spaces of an fp16 build leaving out the
variants without half storage, with the reason; the refusal naming the layers no half variant
serves; records of an fp16 layer and an fp32 one never serving each other; the casts at the
inputs and outputs and the halved buffers of a schedule; the half tolerance; the C runtime's
float -> half rounding against numpy's float16 on edge values.

PoCL: every half-storage variant against the float64 reference within the half tolerance
(one layer each; more layers and configurations marked slow), and a small network built with
--precision fp16 --check, run through cffi: its header, memory() and outputs.

    .venv/bin/python tests/test_fp16.py --write    # regenerate tests/data/fp32_renders.json
"""
import copy
import ctypes
import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

from aotconv import cli, harness, passes, precision, protocol, reference
from aotconv.context import with_precision
from aotconv.errors import AotconvError
from aotconv.graph import Network
from aotconv.precision import (check_storage, half_network_reference, half_params, round_fp16,
                               storage_of, stored)
from aotconv.space import fallback_point, layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS
from aotconv.tune.records import Key, Store, cfg_from_json, layer_of
from aotconv.variants import BY_NAME, VARIANTS

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "fp32_renders.json"
POCL = TARGETS["pocl-cpu"]
POCL16 = with_precision(POCL, "fp16")


def _sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def half(layer):
    """`layer` as an fp16 build stores it."""
    layer = copy.deepcopy(layer)
    layer.attrs = dict(layer.attrs, storage="fp16")
    return layer


def net_of(layers, shape=(2, 3, 9, 9), name="n", outputs=None):
    d = {"name": name, "input": list(shape), "layers": layers}
    if outputs:
        d["outputs"] = outputs
    return network_from_dict(d)


# -- FP32 kernels unchanged ---------------------------------------------------------------------

def golden_cases():
    """(variant, layer signature, cfg, sha) of every FP32 fallback kernel snapshotted."""
    return json.loads(GOLDEN.read_text())["cases"]


def test_fp32_kernels_render_byte_for_byte_as_before():
    """Every variant's fallback kernel of every snapshotted layer renders the same FP32 text
    as before the storage helpers existed (their fp32 expansion is the old text)."""
    cases = golden_cases()
    assert len(cases) > 1000 and len({c[0] for c in cases}) >= 23
    changed = []
    for name, sig, cfg, sha in cases:
        layer = layer_of(sig)
        assert layer is not None and storage_of(layer) == "fp32", sig
        if _sha(BY_NAME[name].render(layer, cfg_from_json(cfg), "k")) != sha:
            changed.append(f"{name} {sig}")
    assert not changed, f"{len(changed)} FP32 kernels render differently, e.g. {changed[:3]}"


def test_half_kernels_store_half_and_compute_in_float():
    """The same cases rendered for an fp16 build (the variants with half storage): half
    buffers read with vload_half and written with vstore_half_rte, no float tensor buffer."""
    seen, cases = set(), golden_cases()
    for name, sig, cfg, _ in cases:
        v = BY_NAME[name]
        if not v.half_storage or (name, sig.split("|")[0]) in seen:
            continue
        seen.add((name, sig.split("|")[0]))
        layer = half(layer_of(sig))
        src = v.render(layer, cfg_from_json(cfg), "k")
        assert "vstore_half" in src and "_rte(" in src, name
        assert "vload_half" in src, name
        fp32 = v.render(layer_of(sig), cfg_from_json(cfg), "k")
        assert "vload_half" not in fp32 and "vstore_half" not in fp32, name
    # but crop, the tensor-core variants: they serve half layers only
    # (tests/test_conv_mma_f16.py, tests/test_conv_mma_f16_nhwc.py), and the variants newer
    # than the snapshot: conv_dw_nhwc (its half kernels: tests/test_conv_dw_nhwc.py), the
    # pools and elementwise layers in NHWC (tests/test_pool_nhwc.py, tests/test_eltwise_nhwc.py)
    newer = {"conv_dw_nhwc", "pool_nhwc", "global_avgpool_nhwc", "add_nhwc", "eltwise_nhwc",
             "scale_nhwc"}
    assert len({n for n, _ in seen}) >= (sum(v.half_storage for v in VARIANTS) - 1 - len(newer)
                                         - len(precision.TENSOR_CORE_HALF))


# -- the option, the spaces, the refusal --------------------------------------------------------

def test_fp16_is_a_precision_and_stores_every_layer_in_half():
    assert precision.check("fp16") == "fp16"
    net = passes.optimise(net_of([dict(name="c", op="conv", out=4, kernel=3, act="relu"),
                                  dict(name="f", op="flatten"),
                                  dict(name="d", op="dense", out=5)]))
    assert stored(net, "fp32") is net and stored(net, "tf32") is net
    h = stored(net, "fp16")
    assert all(storage_of(l) == "fp16" for l in h.layers)
    assert all(storage_of(l) == "fp32" for l in net.layers)      # the original is untouched
    assert "storage=fp16" in h.layer("c").signature_str()
    assert "storage" not in net.layer("c").signature_str()


def test_an_fp16_space_leaves_out_the_variants_without_half_storage():
    base = net_of([dict(name="c", op="conv", out=8, kernel=3, pad=1)],
                  shape=(1, 8, 10, 10)).layer("c")
    layer = half(base)
    h100 = with_precision(TARGETS["h100"], "fp16")
    some = [BY_NAME[n] for n in ("conv_direct", "conv_1x1", "conv_mma")]
    sp = layer_space(layer, h100, variants=some)
    assert [p.variant.name for p in sp.parts] == ["conv_direct"]
    left = dict(sp.unsupported)
    # conv_mma multiplies in TF32: an fp16 build computes in FP32
    assert left["conv_mma"].startswith("conv_mma computes in TF32")
    assert left["conv_1x1"].startswith("conv_1x1 needs kernel 1x1")
    # a variant without half storage: left out of the space, with the reason, and rejected
    # where a single point is judged (build.storage)
    up = half(net_of([dict(name="u", op="upsample", scale=2)], shape=(1, 2, 3, 3)).layer("u"))
    v = BY_NAME["upsample_direct"]
    assert not v.half_storage
    assert dict(layer_space(up, POCL16).unsupported)["upsample_direct"] == (
        "upsample_direct has no half-storage kernel: only a build of --precision fp32 or "
        "tf32 runs it")
    assert fallback_point(up, v, POCL16) is None
    assert fallback_point(layer_of(up.signature_str().replace(",storage=fp16", "")), v,
                          POCL) is not None
    # an fp32 build's spaces are what they were: no such constraint
    fp32 = layer_space(base, TARGETS["h100"], variants=some)
    assert [p.variant.name for p in fp32.parts] == ["conv_direct"]
    assert [c.name for c in fp32.parts[0].constraints] == \
        [c.name for c in sp.parts[0].constraints]
    assert "build.storage" not in [c.name for c in
                                   layer_space(up, POCL).parts[0].constraints]


@pytest.mark.parametrize("name", ["lenet5", "alexnet", "vgg16", "nin", "inception-v1",
                                  "resnet50", "mobilenet_v2"])
def test_every_layer_of_the_shipped_networks_has_a_half_variant(name):
    from aotconv.ops import is_alias
    from aotconv.spec import load_network
    net = stored(passes.optimise(load_network(name)), "fp16")
    check_storage([l for l in net.layers if not is_alias(l)], POCL16)      # raises if not
    for fused in (passes.fuse_pool(net), passes.fuse_residual(net)):
        check_storage([l for l in fused.layers if not is_alias(l)], POCL16)


def test_a_layer_no_half_variant_serves_is_refused_naming_it(tmp_path, capsys):
    y = tmp_path / "up.yaml"
    y.write_text("name: up\ninput: [1, 2, 4, 4]\nlayers:\n"
                 "  - {name: c, op: conv, out: 2, kernel: 1}\n"
                 "  - {name: big, op: upsample, scale: 2}\n"
                 "  - {name: r, op: relu}\n")
    from aotconv.spec import load_network
    net = stored(passes.optimise(load_network(str(y))), "fp16")
    with pytest.raises(AotconvError) as e:
        check_storage(net.layers, POCL16)
    msg = str(e.value)
    assert "\n" not in msg and "big (upsample, line 5)" in msg and "--precision fp32" in msg
    assert "c (conv" not in msg and "r (relu" not in msg
    check_storage(stored(passes.optimise(load_network(str(y))), "fp32").layers, POCL)
    assert cli.main(["build", str(y), "--precision", "fp16", "--no-tune",
                     "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "big (upsample, line 5)" in err and "Traceback" not in err


# -- records ------------------------------------------------------------------------------------

def test_records_of_fp16_and_fp32_layers_never_serve_each_other(tmp_path):
    from aotconv.tune.measure import Outcome, Status
    layer = net_of([dict(name="c", op="conv", out=4, kernel=3)]).layer("c")
    layer16 = half(layer)
    v = BY_NAME["conv_direct"]
    cfg = fallback_point(layer, v, POCL)
    store = Store(read=[tmp_path / "r.jsonl"], write=[tmp_path / "r.jsonl"])
    k32, k16 = Key(layer, v, POCL), Key(layer16, v, POCL16)
    assert k32.op == layer.signature_str() and "storage" not in k32.op
    assert k16.op != k32.op and k16.kernel(cfg) != k32.kernel(cfg)
    store.append(k32, cfg, Outcome(Status.OK, time_ms=1.0))
    assert store.lookup(k32) and not store.lookup(k16)
    store.append(k16, cfg, Outcome(Status.OK, time_ms=2.0))
    fresh = Store(read=[tmp_path / "r.jsonl"])
    assert fresh.lookup(k32)[cfg].time_ms == 1.0 and fresh.lookup(k16)[cfg].time_ms == 2.0
    assert layer_of(k16.op).signature_str() == k16.op      # an fp16 record rebuilds its layer


# -- the schedule: casts and halved buffers -----------------------------------------------------

SMALL = [dict(name="c1", op="conv", out=8, kernel=3, pad=1),
         dict(name="bn", op="batchnorm", act="relu"),
         dict(name="p1", op="maxpool", kernel=2),
         dict(name="c2", op="conv", out=8, kernel=3, pad=1, act="relu"),
         dict(name="s", op="add", inputs=["p1", "c2"]),
         dict(name="c3", op="conv", out=4, kernel=1),
         dict(name="k", op="concat", inputs=["c3", "s"]),
         dict(name="f", op="flatten"),
         dict(name="d", op="dense", out=10),
         dict(name="prob", op="softmax")]


def _schedule(src, prec):
    from aotconv.choose import choose
    from aotconv.schedule import build_schedule
    net = stored(passes.optimise(src), prec)
    choices = choose(net, with_precision(POCL, prec), mode="fallback")
    return build_schedule(net, choices, source=src)


def test_an_fp16_schedule_casts_at_its_edges_and_halves_its_buffers():
    src = net_of(SMALL, shape=(2, 3, 8, 8), outputs=["prob", "c3"])
    s32, s16 = _schedule(src, "fp32"), _schedule(src, "fp16")
    assert not s32.conversions
    casts = {l.name: l for l in s16.net.layers if l.op == "layout_convert"}
    # c1's variant on PoCL reads half only; the softmax writes its float output itself
    assert set(casts) == {"input_to_fp16", "c3_to_fp32"}
    assert casts["input_to_fp16"].attrs == {"src": "NCHW", "dst": "NCHW", "storage": "fp16",
                                            "src_storage": "fp32"}
    assert casts["c3_to_fp32"].attrs == {"src": "NCHW", "dst": "NCHW", "src_storage": "fp16"}
    prob = s16.net.layer("prob")
    assert (prob.attrs["storage"], prob.attrs["src_storage"]) == ("fp32", "fp16")
    assert s16.net.outputs == ["prob", "c3_to_fp32"]
    assert s16.net.layer("c1").inputs == ["input_to_fp16"]
    # parameters half; the float input and outputs keep 4 bytes an element
    p32 = {b.name: b.bytes for b in s32.buffers if b.kind == "param"}
    p16 = {b.name: b.bytes for b in s16.buffers if b.kind == "param"}
    assert p16 and {k: 2 * v for k, v in p16.items()} == p32
    assert s16.folds and s16.folds[0].layer == "c1"
    act16 = {b.name: b.bytes for b in s16.buffers if b.kind == "act"}
    assert sum(act16.values()) < sum(b.bytes for b in s32.buffers if b.kind == "act")
    in_buf = s16.tensor_buffer["input"]
    assert s16.buffers[in_buf].bytes >= 4 * 2 * 3 * 8 * 8
    # the header and report say so
    assert precision.of_schedule(s16, POCL16)[0] == "fp16"
    assert precision.of_schedule(s32, POCL)[0] == "fp32"


def _choices(net, names):
    """{layer: Choice} of `net`'s non-alias layers: the variant named in `names`, else the
    fallback variant the PoCL fp16 build gives it."""
    from aotconv.choose import Choice, choose
    got = choose(net, POCL16, mode="fallback")
    for lname, vname in names.items():
        v = BY_NAME[vname]
        got[lname] = Choice(v.name, v.fallback(net.layer(lname), POCL16))
    return got


def test_the_casts_at_the_edges_go_into_the_layers_that_can_take_them(monkeypatch):
    """aotconv.layouts.fuse_casts: a layer reading only the network's input whose variant
    reads float takes the input's cast (it reads `input`, src_storage fp32); a parameterless
    layer whose output is a network output and nothing else's, whose variant writes float,
    takes the output's. A layer with parameters, an output another layer reads too and a
    variant that reads or writes half only keep their casts; inserting again adds none."""
    from aotconv.layouts import insert_conversions
    from aotconv.variants.conv_mma import EMULATE_ENV
    monkeypatch.setenv(EMULATE_ENV, "1")          # the stem variant offered on PoCL
    layers = [dict(name="c1", op="conv", out=8, kernel=3, pad=1, act="relu"),
              dict(name="c2", op="conv", out=8, kernel=1),
              dict(name="f", op="flatten"), dict(name="d", op="dense", out=10),
              dict(name="prob", op="softmax")]
    net = stored(passes.optimise(net_of(layers, shape=(2, 3, 6, 6))), "fp16")
    got, new = insert_conversions(net, _choices(net, {"c1": "conv_mma_f16_stem"}))
    # no cast left: the stem's NHWC output converted for c2 stays half
    assert [(l.name, l.attrs.get("src_storage")) for l in new] == [("c1_to_nchw", None)]
    assert got.outputs == ["prob"]
    assert got.layer("c1").inputs == ["input"] and got.layer("c1").attrs["src_storage"] == "fp32"
    assert "src_storage" not in got.layer("c2").attrs
    assert (got.layer("prob").attrs["storage"], got.layer("prob").attrs["src_storage"]) == \
        ("fp32", "fp16")
    assert "src_storage" not in net.layer("c1").attrs            # the network given is kept
    again, more = insert_conversions(got, _choices(got, {"c1": "conv_mma_f16_stem"}))
    assert more == [] and [l.name for l in again.layers] == [l.name for l in got.layers]
    # the input's variant reads half only: the cast stays
    got, new = insert_conversions(net, _choices(net, {"c1": "conv_direct"}))
    assert [l.name for l in new] == ["input_to_fp16"]
    assert "src_storage" not in got.layer("c1").attrs
    # the dense output has parameters; the softmax's output read by another layer too
    for outs, extra in ((["d"], []), (["prob", "t"], [dict(name="t", op="tanh",
                                                           inputs=["prob"])])):
        n2 = stored(passes.optimise(net_of(layers + extra, shape=(2, 3, 6, 6), outputs=outs)),
                    "fp16")
        got, new = insert_conversions(n2, _choices(n2, {"c1": "conv_mma_f16_stem"}))
        assert {l.name for l in new if "src_storage" in l.attrs} == {f"{o}_to_fp32"
                                                                     for o in outs}
        assert got.outputs == [f"{o}_to_fp32" for o in outs]


def test_the_half_model_rounds_every_stored_output_and_measures_its_spread():
    """The --check reference: every stored output a half, the float outputs the widened
    halves (c3's) or, for the softmax that writes its float output itself, unrounded;
    computed in float32 it stays a model of half storage (c3 a half) and differs from the
    float64 one only by neighbouring halves here. Its spread: evaluations that round every
    stored output stochastically, c3 a half again, within an ulp or two."""
    from aotconv.params import random_params
    from aotconv.precision import HalfReference
    src = net_of(SMALL, shape=(2, 3, 8, 8), outputs=["prob", "c3"])
    sch = _schedule(src, "fp16")
    flat = random_params(src, seed=3)
    ref = HalfReference(sch, flat)
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    outs = ref(x)
    assert [o.shape for o in outs] == [(2, 10, 1, 1), (2, 4, 4, 4)]
    assert np.array_equal(outs[1], round_fp16(outs[1]))
    assert not np.array_equal(outs[0], round_fp16(outs[0]))
    f32 = half_network_reference(sch, x, ref.params, np.float32)
    assert np.array_equal(f32[1], round_fp16(f32[1]))
    ulps = [np.abs(a - b) / np.maximum(np.abs(a), 2.0 ** -14) for a, b in zip(outs, f32)]
    assert all(u.max() <= 2.0 ** -9 for u in ulps)        # a neighbouring half at most
    sample = ref.evaluate(x, np.random.default_rng(0))
    assert np.array_equal(sample[1], round_fp16(sample[1]))
    assert any(not np.array_equal(a, b) for a, b in zip(sample, outs))
    spread = ref.spread(x)
    assert 0 < spread < 10 * protocol.TOLERANCE           # a small network: a few ulps of half
    assert ref.spread(x, outs) == spread                  # seeded: the same samples each time


def test_a_check_past_T_says_what_admitted_it_or_not(monkeypatch, capsys):
    from aotconv import compiler
    from aotconv.compiler import BuildResult
    res = BuildResult("out", None, None, None, check_error=2.5e-3,
                      check_reference=precision.HalfReference.name, check_tolerance=2e-3,
                      check_spread=5e-4)
    monkeypatch.setattr(compiler, "compile_network", lambda *a, **k: res)
    assert cli.main(["build", "lenet5", "--precision", "fp16", "--quiet"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0
    assert out.startswith("check against the float64 numpy reference with every weight")
    assert "max hybrid error 2.50e-03 (tolerance 2.00e-03 = T + 2 x 5.00e-04, the spread " \
           "of this precision's roundings through this network on this input: FAILED" in out
    res.check_tolerance = 3e-3
    assert cli.main(["build", "lenet5", "--precision", "fp16", "--quiet"]) == 0
    assert "this input: ok; docs/precision.md)" in capsys.readouterr().out
    res.check_error, res.check_tolerance, res.check_spread = 2.5e-4, None, None
    assert cli.main(["build", "lenet5", "--precision", "fp16", "--quiet"]) == 0
    assert "2.50e-04 (ok)" in capsys.readouterr().out


# -- the tolerance ------------------------------------------------------------------------------

def test_the_half_tolerance_is_what_rounding_the_stored_operands_does():
    """Operands whose products cancel: their rounding to half moves the output far past the
    FP32 tolerance, which an FP32 kernel meets and the half kernel's result (the float64
    conv of the half operands, rounded to half) meets only with the half allowance; a result
    a little past the allowance fails."""
    base = net_of([dict(name="c", op="conv", out=1, kernel=1, bias=False)],
                  shape=(1, 64, 4, 4)).layer("c")
    layer = half(base)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 64, 1, 1)).astype(np.float32) * 100
    x = rng.standard_normal((1, 64, 4, 4)).astype(np.float32)
    x[:, 32:] = -x[:, :32] * (w[0, :32, 0, 0] / w[0, 32:, 0, 0]).reshape(1, 32, 1, 1)
    ref = protocol.Reference(layer, [x], {"weight": w})
    exact = ref.expected()
    got = round_fp16(reference.forward(layer, [round_fp16(x)], {"weight": round_fp16(w)}))
    assert not harness.close(got, exact)[0]                  # past the FP32 tolerance
    assert ref.check(got)["ok"]                              # within the half one
    allow = ref.half(protocol.TOLERANCE)
    slack = protocol.TOLERANCE * np.maximum(1, np.abs(exact)) + allow
    sign = np.where(got >= exact, 1.0, -1.0)
    assert ref.check(exact + 0.99 * sign * slack)["ok"]
    assert not ref.check(exact + 1.01 * sign * slack)["ok"]
    # an FP32 layer's check is unchanged
    assert not protocol.Reference(base, [x], {"weight": w}).check(got)["ok"]


# -- the C runtime's rounding -------------------------------------------------------------------

@pytest.fixture(scope="module")
def c_halves(tmp_path_factory):
    """aotrt_halves_from_floats of runtime_c/rt_half.c, built on its own."""
    out = tmp_path_factory.mktemp("half") / "libhalf.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run(cc.split() + ["-std=c11", "-O2", "-shared", "-fPIC", "-DAOTRT_NS=t",
                                 f"-I{ROOT / 'runtime_c'}", str(ROOT / "runtime_c" / "rt_half.c"),
                                 "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    f = lib.aotrt_t_halves_from_floats
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]

    def halves(x):
        x = np.ascontiguousarray(x, np.float32)
        h = np.empty(x.shape, np.uint16)
        f(h.ctypes.data, x.ctypes.data, x.size)
        return h
    return halves


def test_the_c_rounding_to_half_is_numpys(c_halves):
    u = np.float32(2.0 ** -11)
    edges = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65519.99, 65520.0, 65536.0,
                      3.0e38, np.inf, -np.inf, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -12),
                      2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -20), 3 * 2.0 ** -25,
                      5 * 2.0 ** -25, 2.0 ** -26, 1e-45, -1e-40, 1 + u, 1 + 3 * u,
                      1 + u * (1 + 2.0 ** -12), 2047.0, 2049.0, 2051.0, -2051.0],
                     np.float32)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    # every exponent near half's range, with the mantissa's low bits at and around the ties
    exps = np.arange(95, 145, dtype=np.uint32) << 23
    lows = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFFFF],
                    np.uint32)
    grid = (exps[:, None] | lows[None, :]).ravel()
    grid = np.concatenate([grid, grid | 0x80000000, grid | 0x00400000])
    for x in (edges, bits.view(np.float32), grid.view(np.float32)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(np.float16)
        got = c_halves(x)
        nan = np.isnan(x)
        assert np.array_equal(got[~nan], want[~nan].view(np.uint16))
        g = got[nan]
        assert np.all((g & 0x7C00) == 0x7C00) and np.all(g & 0x3FF)   # NaN stays NaN
        assert np.array_equal(g >> 15, (x[nan].view(np.uint32) >> 31).astype(np.uint16))


# -- PoCL: every half-storage variant -----------------------------------------------------------

def _layer(layers, shape, name, fuse=None):
    net = passes.optimise(net_of(layers, shape=shape))
    if fuse == "pool":
        net = passes.fuse_pool(net)
    elif fuse == "residual":
        net = passes.fuse_residual(net)
    return net.layer(name)


# (variant, layers, input shape, the layer, fusion or a layout conversion's layout[, "slow"]:
# a variant's second case, in the slow tier)
CASES = [
    ("eltwise", [dict(name="a", op="sigmoid")], (2, 3, 5, 7), "a", None),
    ("add_direct", [dict(name="a", op="tanh"), dict(name="s", op="add", inputs=["a", "input"],
                                                    act="relu")], (2, 4, 5, 5), "s", None),
    ("pool_direct", [dict(name="p", op="avgpool", kernel=3, stride=2, pad=1)], (1, 5, 11, 9),
     "p", None),
    ("global_avgpool_direct", [dict(name="g", op="global_avgpool")], (2, 30, 7, 7), "g", None),
    ("softmax_direct", [dict(name="s", op="softmax")], (3, 10, 2, 2), "s", None),
    ("lrn_direct", [dict(name="n", op="lrn", size=5)], (2, 17, 5, 5), "n", None),
    ("concat_direct", [dict(name="a", op="relu"), dict(name="b", op="tanh", inputs=["input"]),
                       dict(name="k", op="concat", inputs=["a", "b"])], (1, 3, 6, 6), "k",
     None),
    ("channel_shuffle_direct", [dict(name="s", op="channel_shuffle", groups=3)],
     (2, 12, 5, 7), "s", None),
    ("channel_slice_direct", [dict(name="s", op="channel_slice", start=2, end=7)],
     (1, 10, 6, 6), "s", None),
    ("crop_direct", [dict(name="c", op="crop", top=1, left=2, bottom=0, right=1)],
     (1, 3, 6, 7), "c", None),
    ("scale_direct", [dict(name="g", op="global_avgpool"),
                      dict(name="s", op="scale", inputs=["input", "g"])], (2, 8, 5, 5), "s",
     None),
    ("batchnorm_direct", [dict(name="b", op="batchnorm", act="silu")], (2, 7, 3, 5), "b",
     None),
    ("dense_direct", [dict(name="f", op="dense", out=13, act="relu")], (4, 3, 5, 7), "f",
     None),
    ("conv_direct", [dict(name="c", op="conv", out=6, kernel=3, stride=2, pad=1, groups=2,
                          act="relu")], (2, 4, 9, 9), "c", None, "slow"),
    ("conv_direct", [dict(name="c", op="conv", out=4, kernel=3, pad=1),
                     dict(name="s", op="add", inputs=["c", "input"], act="relu")],
     (1, 4, 7, 7), "c", "residual"),
    ("conv_pool_direct", [dict(name="c", op="conv", out=6, kernel=5, act="relu"),
                          dict(name="p", op="maxpool", kernel=2)], (2, 3, 16, 16), "c", "pool"),
    ("layout_convert", [dict(name="r", op="relu")], (2, 5, 7, 3), None, "NHWC", "slow"),
    ("conv_depthwise", [dict(name="c", op="conv", out=16, kernel=3, groups=16, pad=1,
                             act="relu6")], (2, 16, 14, 14), "c", None),
    ("conv_dw_nhwc", [dict(name="c", op="conv", out=6, kernel=3, groups=6, pad=1,
                           act="relu6")], (2, 6, 9, 9), "c", None),
    ("pool_nhwc", [dict(name="p", op="maxpool", kernel=3, stride=2, pad=1)], (2, 6, 9, 9),
     "p", None),
    ("global_avgpool_nhwc", [dict(name="g", op="global_avgpool")], (2, 30, 7, 7), "g", None),
    ("add_nhwc", [dict(name="a", op="tanh"), dict(name="s", op="add", inputs=["a", "input"],
                                                  act="relu")], (2, 4, 5, 5), "s", None),
    ("eltwise_nhwc", [dict(name="a", op="sigmoid")], (2, 3, 5, 7), "a", None),
    ("scale_nhwc", [dict(name="g", op="global_avgpool"),
                    dict(name="s", op="scale", inputs=["input", "g"])], (2, 8, 5, 5), "s", None),
    ("conv_tiled", [dict(name="c", op="conv", out=9, kernel=3, pad=1, act="clip", max=0.5)],
     (2, 7, 10, 10), "c", None),
    ("conv_1x1", [dict(name="c", op="conv", out=32, kernel=1),
                  dict(name="s", op="add", inputs=["c", "input"], act="relu")],
     (2, 32, 7, 7), "c", "residual"),
    ("dense_gemv", [dict(name="f", op="dense", out=100, act="hardswish")], (1, 256, 2, 2), "f",
     None),
    ("conv_im2col", [dict(name="c", op="conv", out=7, kernel=3, stride=2, pad=1, act="relu")],
     (2, 5, 13, 11), "c", None),
    ("dense_gemm", [dict(name="f", op="dense", out=40, bias=False)], (16, 64, 1, 1), "f", None),
    ("conv_winograd", [dict(name="c", op="conv", out=8, kernel=3, pad=1, act="tanh")],
     (1, 8, 12, 12), "c", None),
    ("conv_igemm", [dict(name="c", op="conv", out=32, kernel=3, pad=1),
                    dict(name="s", op="add", inputs=["c", "input"], act="relu")],
     (1, 32, 8, 8), "c", "residual"),
]
# the point a case runs where its fallback would take long to compile on PoCL: these knobs
# set, the others the fallback's (vector loads and stores of half, a fused residual)
POINTS = {"conv_igemm": dict(MDIM=4, NDIM=4, MBLK=16, NBLK=16, KBLK=16, VW=4, UNROLL=0,
                             DBUF=0, LAYOUT="NCHW", KSPLIT=1, TAPSTEP=1)}


def _point(v, layer, target):
    """The point a case runs: its fallback, or the POINTS knobs over it."""
    from aotconv.space import point_ok
    from aotconv.variants.base import Config
    cfg = fallback_point(layer, v, target)
    if v.name in POINTS:
        cfg = Config(tuple((k.name, POINTS[v.name].get(k.name, cfg[k.name]))
                           for k in v.knobs(layer, target)))
        assert point_ok(layer, v, cfg, target), cfg
    return cfg


def _case_layer(layers, shape, name, fuse):
    if fuse in ("NHWC", "CHWN"):
        from aotconv.layouts import convert_layer
        return convert_layer("cv", "input", shape, "NCHW", fuse, "fp16", "fp16")
    return _layer(layers, shape, name, fuse)


def _check(v, layer, cfg, rng):
    ctx, q, _ = harness.context_for(POCL)
    xs, params = harness.random_inputs(layer, rng)
    k = protocol.Kernel(ctx, q, layer, v, cfg, xs, params)
    ref = protocol.Reference(layer, xs, params)
    check, _ = protocol.verify(k, ref)
    return check, k.output(), xs


@pytest.mark.parametrize("name,layers,shape,lname,fuse", [
    pytest.param(*c[:5], marks=pytest.mark.slow) if c[5:] else c[:5] for c in CASES],
    ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_half_variants_meet_the_half_tolerance(name, layers, shape, lname, fuse):
    v = BY_NAME[name]
    layer = half(_case_layer(layers, shape, lname, fuse))
    assert v.supports(layer) is None
    cfg = _point(v, layer, POCL16)
    assert cfg is not None
    check, out, _ = _check(v, layer, cfg, np.random.default_rng(7))
    assert check["ok"], (name, cfg, check)
    # the output is stored in half: every value read back is a half
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32))


def test_every_half_variant_has_a_case():
    # the tensor-core variants need the tensor cores or AOTCONV_MMA_EMULATE: their own tests
    assert {c[0] for c in CASES} == ({v.name for v in VARIANTS if v.half_storage}
                                     - set(precision.TENSOR_CORE_HALF))


@pytest.mark.parametrize("src,dst,s_in,s_out,tiled", [
    ("NCHW", "NCHW", "fp32", "fp16", False),
    ("CHWN", "NCHW", "fp16", "fp32", True),
    pytest.param("NCHW", "NHWC", "fp32", "fp16", True, marks=pytest.mark.slow),
    pytest.param("NCHW", "NCHW", "fp16", "fp32", False, marks=pytest.mark.slow)])
def test_the_casts_round_to_half_and_widen_exactly(src, dst, s_in, s_out, tiled):
    from aotconv.layouts import convert_layer
    v = BY_NAME["layout_convert"]
    layer = convert_layer("cv", "input", (2, 5, 7, 3), src, dst, s_out, s_in)
    cfg = (layer_space(layer, POCL16, variants=[v]).parts[0].points[-1] if tiled
           else fallback_point(layer, v, POCL16))
    assert (cfg["TILE"] > 0) == tiled
    check, out, xs = _check(v, layer, cfg, np.random.default_rng(5))
    assert check["ok"], cfg
    # the input rounded to nearest even once (by the cast, or on upload to a half buffer),
    # the widening exact: numpy's rounding, bit for bit
    assert np.array_equal(out, xs[0].astype(np.float16).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({c[0] for c in CASES}))
def test_sampled_points_of_every_half_variant_meet_the_half_tolerance(name):
    """Four points spread over the space of each case of the variant (split-K, vector
    widths, layouts, tiles and guards the fallback does not reach)."""
    from aotconv.space import variant_space
    v = BY_NAME[name]
    rng = np.random.default_rng(9)
    for _, layers, shape, lname, fuse in [c[:5] for c in CASES if c[0] == name]:
        layer = half(_case_layer(layers, shape, lname, fuse))
        pts = variant_space(layer, v, POCL16, explain=False).points
        for i in range(4):
            cfg = pts[i * (len(pts) - 1) // 3]
            check, out, _ = _check(v, layer, cfg, rng)
            assert check["ok"], (name, cfg, check)
            assert np.array_equal(out, out.astype(np.float16).astype(np.float32))


# -- PoCL: a network through the library --------------------------------------------------------

def test_an_fp16_library_checks_against_its_half_model(tmp_path):
    from aotconv.compiler import compile_network
    from aotconv.runtime import load
    y = tmp_path / "halfnet.yaml"
    import yaml
    y.write_text(yaml.safe_dump({"name": "halfnet", "input": [2, 3, 8, 8], "layers": SMALL,
                                 "outputs": ["prob", "c3"]}))
    res = compile_network(str(y), target="pocl-cpu", outdir=tmp_path / "b",
                          tune_mode="fallback", check=True, quiet=True, precision="fp16")
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE
    assert res.check_reference.startswith("the float64 numpy reference with every weight")
    header = (tmp_path / "b" / "halfnet.h").read_text()
    assert '#define AOTCONV_HALFNET_PRECISION "fp16"' in header
    assert "FP16 storage" in (tmp_path / "b" / "report.md").read_text()
    src = res.net                       # after passes
    flat = np.fromfile(tmp_path / "b" / "halfnet.params.bin", np.float32)
    x = np.random.default_rng(11).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with load(tmp_path / "b") as lib:
        lib.set_params(flat)
        outs = lib(x)
        mem = lib.memory()
    outs = outs if isinstance(outs, list) else [outs]
    model = half_network_reference(res.schedule, x, half_params(res.schedule, flat))
    for o, m in zip(outs, model):
        assert harness.close(o, m)[0]
    # c3 widened from halves by its cast; the softmax's output never stored in half
    prob, c3 = outs
    assert np.array_equal(c3, c3.astype(np.float16).astype(np.float32))
    assert not np.array_equal(prob, prob.astype(np.float16).astype(np.float32))
    assert mem["parameter_bytes"] == sum(b.bytes for b in res.schedule.buffers
                                         if b.kind == "param")
    n_params = sum(int(np.prod(s)) for l in src.layers for _, s in l.params)
    assert mem["parameter_bytes"] == 2 * n_params


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        rows = []
        for name, sig, cfg, _ in golden_cases():
            layer = layer_of(sig)
            rows.append([name, sig, cfg, _sha(BY_NAME[name].render(layer, cfg_from_json(cfg),
                                                                    "k"))])
        doc = json.loads(GOLDEN.read_text())
        doc["cases"] = rows
        GOLDEN.write_text(json.dumps(doc, indent=0) + "\n")
        print(f"{GOLDEN}: {len(rows)} kernels")
    else:
        sys.exit("usage: tests/test_fp16.py --write")

"""Batchnorm folded into the conv or dense before it, and residual adds fused into the conv's
epilogue: the graph rewrites (device-free), the parameter tables that keep the user's layout,
and networks built untuned on PoCL against the numpy reference of the network as written.
"""
import re

import numpy as np
import pytest

from aotconv import fusion, ops, passes, reference, spec
from aotconv import params as params_mod
from aotconv.choose import Choice, fallback_choice
from aotconv.graph import Layer
from aotconv.harness import close
from aotconv.schedule import build_schedule
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]


def load(tmp_path, text, name="n"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return spec.load_network(str(p))


def make_layer(op, in_shapes, name=None, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer(name or op, op, a, ["input"], in_shapes=[tuple(s) for s in in_shapes],
                 out_shape=out, params=params)


# Every case of folding and of not folding in one network: c1 (no bias) + b1 (relu); c2 (bias)
# + b2 + b3 (a chain); f (dense) + bf; and batchnorms that must stay: after a conv read twice
# (c4), after a conv that is a network output (c5), after a pool (p6), after a conv with an act
# of its own (c7).
FOLDS = """\
name: folds
input: [2, 3, 11, 9]
outputs: [sum, c5, b5, b6, b7, bf]
layers:
  - {name: c1, op: conv, out: 8, kernel: 3, pad: 1, bias: false}
  - {name: b1, op: batchnorm, act: relu}
  - {name: c2, op: conv, out: 8, kernel: 3, stride: 2, pad: 1}
  - {name: b2, op: batchnorm, eps: 0.001}
  - {name: b3, op: batchnorm, act: leaky_relu, alpha: 0.2}
  - {name: c4, op: conv, out: 8, kernel: 1, bias: false}
  - {name: b4, op: batchnorm}
  - {name: sum, op: add, inputs: [b4, c4]}
  - {name: c5, op: conv, out: 4, kernel: 3, inputs: [b3]}
  - {name: b5, op: batchnorm}
  - {name: p6, op: maxpool, kernel: 2, inputs: [b3]}
  - {name: b6, op: batchnorm}
  - {name: c7, op: conv, out: 4, kernel: 1, act: relu, inputs: [b3]}
  - {name: b7, op: batchnorm}
  - {name: f, op: dense, out: 7, bias: false, inputs: [b3]}
  - {name: bf, op: batchnorm, act: tanh}
"""


def test_fold_batchnorm_rewrites_only_what_it_may(tmp_path):
    net0 = load(tmp_path, FOLDS)
    net = passes.optimise(net0)
    names = [l.name for l in net.layers]
    assert [n for n in names if n.startswith("b")] == ["b4", "b5", "b6", "b7"]
    c1, c2, f = net.layer("c1"), net.layer("c2"), net.layer("f")
    assert c1.fused == ["b1"] and c2.fused == ["b2", "b3"] and f.fused == ["bf"]
    assert (c1.attrs["act"], c2.attrs["act"], c2.attrs["alpha"], f.attrs["act"]) == \
        ("relu", "leaky_relu", 0.2, "tanh")
    assert c1.params == [("weight", (8, 3, 3, 3)), ("bias", (8,))]
    assert f.params == [("weight", (7, 8 * 6 * 5)), ("bias", (7,))]
    assert net.layer("c5").fused == [] and net.layer("c7").fused == []
    assert net.layer("c4").attrs["bias"] is False
    assert net.outputs == ["sum", "c5", "b5", "b6", "b7", "f"]
    assert net.layer("c2").inputs == ["c1"] and net.layer("p6").inputs == ["c2"]
    # the user's network is left as written
    assert [l.name for l in net0.layers][:2] == ["c1", "b1"] and net0.layer("c1").attrs["bias"] is False


def test_folded_conv_has_the_signature_of_a_conv_with_bias_and_act(tmp_path):
    """So it takes the records (and kernels) of any such conv."""
    net = passes.optimise(load(tmp_path, FOLDS))
    plain = make_layer("conv", [(2, 3, 11, 9)], name="other", out=8, kernel=3, pad=1,
                       act="relu")
    assert net.layer("c1").signature() == plain.signature()
    assert net.layer("c1").signature_str() == plain.signature_str()
    dense = make_layer("dense", [(2, 8, 6, 5)], out=7, act="tanh")
    assert net.layer("f").signature() == dense.signature()


def fallback_choices(net):
    """Fallback choices of the plain variants (fast to enumerate), as a fallback build takes."""
    plain = {"conv": "conv_direct", "dense": "dense_direct", "batchnorm": "batchnorm_direct",
             "add": "add_direct", "maxpool": "pool_direct"}
    out = {}
    for l in net.layers:
        v = BY_NAME[plain[l.op]]
        assert v.supports(l) is None, (l.name, v.supports(l))
        out[l.name] = Choice(v.name, v.fallback(l, POCL))
    return out


def test_schedule_keeps_the_users_parameter_layout(tmp_path):
    net0 = load(tmp_path, FOLDS)
    net = passes.optimise(net0)
    sch = build_schedule(net, fallback_choices(net), source=net0)
    assert sch.param_count == net0.param_count() and sch.param_layout() == net0.param_layout()
    off = {f"{l}.{t}": o for l, t, _, o in net0.param_layout()}
    # tensors the kernels read as given: copied from their own offsets
    rows = {p.name: p.offset for p in sch.params}
    assert rows == {k: off[k] for k in ("c4.weight", "b4.gamma", "b4.beta", "b4.mean", "b4.var",
                                        "c5.weight", "c5.bias", "b5.gamma", "b5.beta",
                                        "b5.mean", "b5.var", "b6.gamma", "b6.beta", "b6.mean",
                                        "b6.var", "c7.weight", "c7.bias", "b7.gamma", "b7.beta",
                                        "b7.mean", "b7.var")}
    assert [p.offset for p in sch.params] == sorted(p.offset for p in sch.params)
    folds = {f.layer: f for f in sch.folds}
    assert list(folds) == ["c1", "c2", "f"]
    c1, c2, f = folds["c1"], folds["c2"], folds["f"]
    assert (c1.channels, c1.per_channel, c1.weight_offset, c1.bias_offset) == \
        (8, 27, off["c1.weight"], None)
    assert (c2.weight_offset, c2.bias_offset) == (off["c2.weight"], off["c2.bias"])
    assert [b[0] for b in c2.batchnorms] == ["b2", "b3"]
    assert c2.batchnorms[0] == ("b2", off["b2.gamma"], off["b2.beta"], off["b2.mean"],
                                off["b2.var"], 0.001)
    assert (f.channels, f.per_channel) == (7, 240)
    # the kernels read the folded tensors from buffers of their own
    buf = {b.name: (i, b.bytes) for i, b in enumerate(sch.buffers)}
    assert (c1.weight, c1.bias) == (buf["c1.weight"][0], buf["c1.bias"][0])
    assert buf["c1.bias"][1] == 4 * 8 and "b1.gamma" not in buf


def test_schedule_refuses_a_source_that_is_not_the_networks(tmp_path):
    net0 = load(tmp_path, FOLDS)
    net = passes.optimise(net0)
    other = load(tmp_path, FOLDS.replace("c4, op: conv, out: 8", "c4, op: conv, out: 6"),
                 "other")
    with pytest.raises(ValueError, match="c4: its kernel reads parameter 'weight'"):
        build_schedule(net, fallback_choices(net), source=other)


def test_emitted_tables_and_header_keep_the_users_layout(tmp_path):
    from aotconv.emit import emit
    net0 = load(tmp_path, FOLDS)
    net = passes.optimise(net0)
    sch = build_schedule(net, fallback_choices(net), source=net0)
    out = emit(sch, POCL, tmp_path / "out")
    h = (out / "folds.h").read_text()
    assert re.search(rf"AOTCONV_FOLDS_PARAM_COUNT {net0.param_count()}u", h)
    for lname, tname, _, off in net0.param_layout():
        macro = f"{lname}_{tname}".upper()
        assert f"AOTCONV_FOLDS_PARAM_{macro}_OFFSET {off}u" in h
    c = (out / "folds.c").read_text()
    assert '{"b2", ' in c and "0.001}" in c and "static const aotrt_fold folds[]" in c


# -- on PoCL ----------------------------------------------------------------------------------

def build(tmp_path, text, name, **kw):
    from aotconv.compiler import compile_network
    src = tmp_path / f"{name}.yaml"
    src.write_text(text)
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / name,
                          tune_mode="fallback", measure=False, quiet=True, **kw)
    return spec.load_network(str(src)), res


def check_library(net0, res, seed=3):
    """The library, loading <net>.params.bin (the user's layout) through load_params, against
    the numpy reference of the network as written."""
    from aotconv.runtime import load as load_lib
    from aotconv.names import c_ident
    flat = params_mod.read_bin(res.outdir / f"{c_ident(net0.name)}.params.bin", net0)
    x = np.random.default_rng(seed).standard_normal(net0.input_shape).astype(np.float32)
    refs = reference.run_network(net0, x, params_mod.split(net0, flat))
    with load_lib(res.outdir) as lib:
        assert lib.param_count == net0.param_count()
        outs = lib(x)
        outs = outs if isinstance(outs, list) else [outs]
        for name, o, r in zip(net0.outputs, outs, refs):
            ok, err = close(o, r)
            assert ok, f"output {name}: max hybrid error {err:.2e}"
        # set_params with another flat array folds again, from that array
        flat2 = params_mod.random_params(net0, seed=seed + 10)
        lib.set_params(flat2)
        refs2 = reference.run_network(net0, x, params_mod.split(net0, flat2))
        outs2 = lib(x)
        outs2 = outs2 if isinstance(outs2, list) else [outs2]
        for name, o, r in zip(net0.outputs, outs2, refs2):
            ok, err = close(o, r)
            assert ok, f"output {name} after set_params: max hybrid error {err:.2e}"
    return outs


def test_folded_network_matches_numpy_on_pocl(tmp_path):
    net0, res = build(tmp_path, FOLDS, "folds")
    sch = res.schedule
    # c1, c2 (+b2+b3), c4, b4, sum, c5, b5, p6, b6, c7, b7, f (+bf): 12 kernels
    assert [l.layer for l in sch.run_launches] == [
        "c1", "c2", "c4", "b4", "sum", "c5", "b5", "p6", "b6", "c7", "b7", "f"]
    check_library(net0, res)


# -- residual adds ----------------------------------------------------------------------------

# Two bottleneck-like blocks: r1 with a downsample branch (both branches conv + batchnorm, so
# the add has two fusable convs: the later, d1, is taken), r2 with an identity shortcut; then
# adds that must stay: after a conv with its own act (a3), after a conv read twice (a4), of
# three tensors (a5), of one tensor twice (a6), and one whose conv is a network output (a7).
RESIDUAL = """\
name: residual
input: [1, 4, 10, 10]
outputs: [a4, a5, a6, a7, c7, relu2]
layers:
  - {name: c1, op: conv, out: 8, kernel: 3, pad: 1, bias: false}
  - {name: b1, op: batchnorm, act: relu}
  - {name: c2, op: conv, out: 16, kernel: 1, bias: false}
  - {name: b2, op: batchnorm}
  - {name: d1, op: conv, out: 16, kernel: 3, stride: 1, pad: 1, bias: false, inputs: [input]}
  - {name: e1, op: batchnorm, inputs: [d1]}
  - {name: r1, op: add, inputs: [b2, e1], act: relu}
  - {name: c3, op: conv, out: 16, kernel: 3, pad: 1, inputs: [r1]}
  - {name: b3, op: batchnorm}
  - {name: r2, op: add, inputs: [r1, b3]}
  - {name: relu2, op: relu}
  - {name: c4, op: conv, out: 16, kernel: 1, act: relu, inputs: [r1]}
  - {name: a3, op: add, inputs: [c4, r1]}
  - {name: c5, op: conv, out: 16, kernel: 1, inputs: [a3]}
  - {name: a4, op: add, inputs: [c5, c5]}
  - {name: c6, op: conv, out: 16, kernel: 1, inputs: [r1]}
  - {name: a5, op: add, inputs: [c6, r1, a3]}
  - {name: c8, op: conv, out: 16, kernel: 1, inputs: [r1]}
  - {name: a6, op: add, inputs: [c8, c8]}
  - {name: c7, op: conv, out: 16, kernel: 1, inputs: [r1]}
  - {name: a7, op: add, inputs: [c7, r1]}
"""


def test_fusable_residuals_and_the_rewrite(tmp_path):
    net = passes.optimise(load(tmp_path, RESIDUAL))
    # relu2 folded into r2; r2 added c3 (folded with b3) to r1
    assert passes.fusable_residuals(net) == [("d1", "r1"), ("c3", "r2")]
    out = passes.fuse_residual(net)
    d1, c3 = out.layer("d1"), out.layer("c3")
    assert d1.inputs == ["input", "c2"] and d1.attrs["residual"] is True
    assert d1.attrs["act"] == "relu" and d1.fused == ["e1", "r1"]
    assert d1.in_shapes == [(1, 4, 10, 10), (1, 16, 10, 10)]
    assert d1.params == [("weight", (16, 4, 3, 3)), ("bias", (16,))]
    # the next block reads the fused layer; its own add, with the relu fused into it, too
    assert c3.inputs == ["d1", "d1"] and c3.attrs["act"] == "relu"
    assert c3.fused == ["b3", "r2", "relu2"]
    assert out.outputs == ["a4", "a5", "a6", "a7", "c7", "c3"]
    names = [l.name for l in out.layers]
    assert "r1" not in names and "r2" not in names
    assert names.index("d1") > names.index("c2") and names.index("c3") > names.index("d1")
    for l in out.layers:                      # still in topological order
        for t in l.inputs:
            assert t == "input" or names.index(t) < names.index(l.name)
    # the rest stays: a3 (c4 has an act), a4 and a6 (one tensor twice), a5 (three), a7 (output)
    assert {"a3", "a4", "a5", "a6", "a7"} <= set(names)
    with pytest.raises(ValueError, match="c4"):
        passes.fuse_residual(net, ["c4"])
    # the input network is left as it was
    assert net.layer("r1").op == "add" and "residual" not in net.layer("d1").attrs


def residual_conv(in_shape, **conv):
    """(the conv with a residual fused in, the plain conv, the add) built as the pass does."""
    c = make_layer("conv", [in_shape], name="c", **conv)
    act = {k: conv[k] for k in ("act", "alpha") if k in conv}
    a = Layer("a", "add", ops.normalise("add", act),
              ["c", "r"], in_shapes=[c.out_shape, c.out_shape], out_shape=c.out_shape)
    plain = make_layer("conv", [in_shape], name="c", **dict(conv, act="none"))
    return passes.residual_layer(plain, a), plain, a


def test_reference_of_the_fused_layer_is_the_unfused_pair():
    fused, plain, add = residual_conv((2, 3, 7, 6), out=5, kernel=3, pad=1, act="leaky_relu",
                                      alpha=0.3)
    rng = np.random.default_rng(1)
    from aotconv.harness import random_inputs
    xs, prm = random_inputs(fused, rng)
    want = reference.forward(add, [reference.forward(plain, xs[:1], prm), xs[1]], {})
    assert np.array_equal(reference.forward(fused, xs, prm), want)


RESIDUAL_VARIANTS = ("conv_direct", "conv_tiled", "conv_1x1", "conv_igemm", "conv_im2col")


def test_every_variant_takes_the_residual_or_declines_it():
    """A variant that accepts a conv with a residual passes it (In(1), before the output) to the
    launch that writes the output and reads it in its kernel; the others say why not."""
    from aotconv.precision import reason as precision_reason
    from aotconv.variants import VARIANTS
    fused, plain, _ = residual_conv((1, 8, 6, 6), out=8, kernel=1, act="relu")
    takers = []
    for v in VARIANTS:
        if precision_reason(v, POCL) is not None:   # an FP32 build never offers it (conv_mma's
            continue                                 # residual: tests/test_conv_mma.py)
        why = v.supports(fused)
        if why is not None:
            if v.supports(plain) is None:
                assert "residual" in why, (v.name, why)
            continue
        takers.append(v.name)
        cfg = v.fallback(fused, POCL)
        for l in v.launches(fused, cfg, "k"):
            if any(a.kind == "out" for a in l.args):
                i = [a.kind for a in l.args].index("out")
                assert l.args[i - 1].kind == "in" and l.args[i - 1].index == 1, (v.name, l)
            else:
                assert all(a.kind != "in" or a.index == 0 for a in l.args)
        src, plain_src = v.render(fused, cfg, "k"), v.render(plain, cfg, "k")
        assert "res" in src and src != plain_src
        assert tuple(v.layouts_of(fused, cfg))[0] == tuple(v.layouts_of(fused, cfg))[1]
    assert sorted(takers) == sorted(RESIDUAL_VARIANTS)


def test_residual_decisions():
    ch = {"c": Choice("conv_direct", Config.of(WG=64, KB=2), 1.0),
          "a": Choice("add_direct", Config.of(WG=64, VEC=1), 0.3)}
    pairs = [("c", "a", "r")]
    fast = {"c": Choice("conv_tiled", Config.of(KT=4), 1.2)}
    slow = {"c": Choice("conv_tiled", Config.of(KT=4), 1.4)}
    assert fusion.decide_residual(pairs, ch, fast, "measure")[0].fused
    assert not fusion.decide_residual(pairs, ch, slow, "measure")[0].fused
    assert not fusion.decide_residual(pairs, ch, fast, "never")[0].fused
    # unmeasured: fused only where the fused layer runs the conv's own kernel
    untimed = {k: Choice(v.variant, v.cfg) for k, v in ch.items()}
    same = {"c": Choice("conv_direct", Config.of(WG=64, KB=2))}
    other = {"c": Choice("conv_direct", Config.of(WG=64, KB=4))}
    d = fusion.decide_residual(pairs, untimed, same, "measure")[0]
    assert d.fused and "own kernel" in d.why and d.residual == "r"
    assert not fusion.decide_residual(pairs, untimed, other, "measure")[0].fused
    # a tuned conv against the fused layer's untuned fallback: fused only where that is the
    # tuned conv's own kernel
    assert fusion.decide_residual(pairs, ch, same, "measure")[0].fused
    assert not fusion.decide_residual(pairs, ch, other, "measure")[0].fused
    d = fusion.decide_residual(pairs, ch, {}, "always", declined={"c": "none takes it"})[0]
    assert not d.fused and "none takes it" in d.why


# -- on PoCL ----------------------------------------------------------------------------------

# what a configuration may change in the epilogue: split-K (the partial sums' pass), the layout
# of the output and residual, vector stores, several outputs per work-item along a row
EPILOGUE_OPTIONS = (lambda p: p.get("KSPLIT", 1) > 1,
                    lambda p: p.get("KSPLIT", 1) == 1 and max(p.get("VW", 1), p.get("VWN", 1)) > 1,
                    lambda p: p.get("LAYOUT", "NCHW") != "NCHW",
                    lambda p: max(p.get("QT", 1), p.get("KB", 1)) > 1)


def residual_configs(v, layer, extra):
    """The fallback and up to `extra` valid points of `v` for `layer` that between them take
    the epilogue options it has (preferring small, not unrolled kernels: PoCL compiles them
    faster)."""
    from aotconv.space import variant_space
    pts = variant_space(layer, v, POCL, explain=False).points
    out = [v.fallback(layer, POCL)]
    todo = [f for f in EPILOGUE_OPTIONS if not f(out[0])]
    for _ in range(extra):
        best = max(pts, key=lambda p: (sum(f(p) for f in todo), -p.get("UNROLL", 0),
                                       -p.get("MBLK", 1) * p.get("NBLK", 1)), default=None)
        if best is None or not any(f(best) for f in todo):
            break
        out.append(best)
        todo = [f for f in todo if not f(best)]
    return list(dict.fromkeys(out))


# make test: the epilogues of conv_direct, conv_tiled and conv_1x1; conv_igemm's and
# conv_im2col's (35 and 5 s of PoCL compiles on 2 cores, kernel cache empty) in the slow tier
@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.slow) if v in ("conv_igemm", "conv_im2col") else v
    for v in RESIDUAL_VARIANTS])
def test_residual_epilogue_matches_the_reference(variant):
    from aotconv.harness import LayerRun, context_for, random_inputs
    from aotconv.reference import from_layout, to_layout
    v = BY_NAME[variant]
    # the fallbacks (what an untuned build runs) of three layers, and on the first the other
    # epilogue options (few: PoCL takes seconds to compile each, a split-K conv_igemm most)
    layers = [(residual_conv((1, 16, 6, 10), out=24, kernel=1, act="relu")[0], 2),
              (residual_conv((2, 6, 9, 7), out=10, kernel=3, stride=2, pad=1, act="tanh",
                             bias=False)[0], 0),
              (residual_conv((1, 40, 7, 7), out=12, kernel=3, pad=1, act="sigmoid")[0], 0)]
    ctx, queue, _ = context_for(POCL)
    ran = 0
    for layer, extra in layers:
        if v.supports(layer) is not None:
            continue
        rng = np.random.default_rng(7)
        xs, prm = random_inputs(layer, rng)
        want = reference.forward(layer, xs, prm)
        for cfg in residual_configs(v, layer, extra):
            lin, lout = v.layouts_of(layer, cfg)
            r = LayerRun(ctx, queue, layer, v, cfg)
            r.set_inputs([x if lin == "NCHW" else to_layout(x, lin) for x in xs])
            r.set_params(prm)
            r.poison_output()
            r.run()
            got = r.read_output()
            got = got if lout == "NCHW" else from_layout(got.ravel(), lout, layer.out_shape)
            ok, err = close(got, want)
            assert ok, f"{variant} {layer.in_shapes} [{cfg}]: max hybrid error {err:.3g}"
            ran += 1
    assert ran >= 1


def test_residual_network_matches_numpy_on_pocl(tmp_path):
    net0, res = build(tmp_path, RESIDUAL, "residual")
    sch = res.schedule
    # c3's residual is r1, which d1 computes once r1 is fused into it
    assert [(d.conv, d.add, d.residual, d.fused) for d in sch.residual] == [
        ("d1", "r1", "c2", True), ("c3", "r2", "d1", True)]
    run = [l.layer for l in sch.run_launches]
    assert "r1" not in run and "r2" not in run and {"a3", "a4", "a5", "a6", "a7"} <= set(run)
    # b1, b2, e1, b3 folded; relu2 into r2, r1 and r2 into their convs
    assert len(run) == len(net0.layers) - 7
    check_library(net0, res)
    import json
    doc = json.loads((res.outdir / "tuning.json").read_text())
    assert [d["conv"] for d in doc["residual_fusion"] if d["fused"]] == ["d1", "c3"]
    assert {f["layer"]: f["batchnorms"] for f in doc["batchnorm_folds"]}["c3"] == ["b3"]
    report = (res.outdir / "report.md").read_text()
    assert "| d1 | r1 | c2 |" in report and "Batchnorms folded" in report


@pytest.mark.slow
def test_resnet50_untuned_on_pocl(tmp_path):
    """ResNet-50 at batch 1, built untuned: 53 convs with their batchnorms folded in and the 16
    residual adds in their epilogue, 56 kernels in all; against the numpy reference of the
    network as written, with the parameters the build wrote (seed 0) and loads unchanged."""
    from aotconv.compiler import compile_network
    from aotconv.runtime import load as load_lib
    res = compile_network("resnet50", target="pocl-cpu", outdir=tmp_path / "r50", batch=1,
                          tune_mode="fallback", measure=False, quiet=True)
    net0 = spec.load_network("resnet50", batch=1)
    sch = res.schedule
    assert sch.param_count == net0.param_count()
    assert sum(d.fused for d in sch.residual) == 16
    assert len(sch.run_launches) == 56 and not sch.conversions
    flat = params_mod.read_bin(res.outdir / "resnet50.params.bin", net0)
    # the input the build's own --check uses
    x = np.random.default_rng(1).standard_normal(net0.input_shape).astype(np.float32)
    with load_lib(res.outdir) as lib:
        out = lib(x)
    ref = reference.run_network(net0, x, params_mod.split(net0, flat))[0]
    ok, err = close(out, ref)
    assert ok, f"resnet50: max hybrid error {err:.2e}"


# -- elementwise chains -----------------------------------------------------------------------

CHAINS = """\
name: chains
input: [1, 3, 8, 8]
layers:
  - {name: c1, op: conv, out: 8, kernel: 3, pad: 1, bias: false}
  - {name: b1, op: batchnorm}
  - {name: r1, op: relu}
  - {name: c2, op: conv, out: 8, kernel: 3, pad: 1, bias: false}
  - {name: b2, op: batchnorm}
  - {name: a2, op: add, inputs: [b2, r1]}
  - {name: r2, op: leaky_relu, alpha: 0.1}
  - {name: c3, op: conv, out: 8, kernel: 1}
  - {name: b3, op: batchnorm, act: relu6}
  - {name: a3, op: add, inputs: [r2, b3], act: hardswish}
  - {name: f, op: dense, out: 4, bias: false}
  - {name: bf, op: batchnorm}
  - {name: s, op: sigmoid}
"""


def test_elementwise_chains_leave_no_kernel_of_their_own(tmp_path):
    """An act layer after a batchnorm folded into a conv, and after an add fused into a conv,
    ends in the conv's epilogue; the same for dense + batchnorm + act: one kernel per conv or
    dense and nothing else."""
    from aotconv.choose import choose
    net0 = load(tmp_path, CHAINS)
    net = passes.optimise(net0)

    def choose_fn(n, only):
        return choose(n, POCL, mode="fallback", only=only)
    net, _, decisions = fusion.apply_residual(net, choose(net, POCL, mode="fallback"), POCL,
                                              "measure", "fallback", choose_fn)
    # a3 stays: c3 has an act (b3's relu6), c2 has a2's residual and act
    assert [(d.conv, d.add, d.fused) for d in decisions] == [("c2", "a2", True)]
    assert [(l.name, l.op) for l in net.layers] == [("c1", "conv"), ("c2", "conv"),
                                                   ("c3", "conv"), ("a3", "add"), ("f", "dense")]
    c1, c2, f = net.layer("c1"), net.layer("c2"), net.layer("f")
    assert (c1.fused, c1.attrs["act"]) == (["b1", "r1"], "relu")
    assert (c2.fused, c2.attrs["act"], c2.attrs["alpha"]) == (["b2", "a2", "r2"], "leaky_relu", 0.1)
    assert c2.inputs == ["c1", "c1"] and c2.attrs["residual"]
    assert (f.fused, f.attrs["act"]) == (["bf", "s"], "sigmoid")


def test_a_tuned_conv_carries_its_kernel_into_the_fused_layer():
    """A fused layer whose own search measured only a slow fallback (a small share of a time
    budget) runs the conv's chosen kernel with the add in its epilogue, where that kernel
    takes the fused layer; a kernel that does not take it is not carried."""
    net = passes.optimise(spec.network_from_dict({
        "name": "carry", "input": [1, 8, 6, 6],
        "layers": [{"name": "c", "op": "conv", "out": 8, "kernel": 3, "pad": 1},
                   {"name": "a", "op": "add", "inputs": ["c", "input"], "act": "relu"}]}))
    tuned = {"c": Choice("conv_direct", Config.of(WG=64, KB=2), 1.0, "tuned"),
             "a": Choice("add_direct", Config.of(WG=64, VEC=1), 0.3, "tuned")}
    slow = Choice("conv_tiled", Config.of(KT=4), 2.0, "tuned")
    out, ch, dec = fusion.apply_residual(net, tuned, POCL, "measure", "tune",
                                         lambda n, only: {"c": slow})
    assert [d.fused for d in dec] == [True] and "own kernel" in dec[0].why
    assert (ch["c"].variant, ch["c"].cfg) == ("conv_direct", Config.of(WG=64, KB=2))
    assert [l.name for l in out.layers] == ["c"]
    # measured faster fused: the search's own kernel stays
    fast = Choice("conv_tiled", Config.of(KT=4), 1.1, "tuned")
    _, ch, dec = fusion.apply_residual(net, tuned, POCL, "measure", "tune",
                                       lambda n, only: {"c": fast})
    assert dec[0].fused and ch["c"].variant == "conv_tiled"
    # measured faster than the conv plus the add, but slower than the conv's kernel with the
    # add's read would be (1.0 + 0.3 / 3): the conv's kernel is carried
    between = Choice("conv_tiled", Config.of(KT=4), 1.25, "tuned")
    _, ch, dec = fusion.apply_residual(net, tuned, POCL, "measure", "tune",
                                       lambda n, only: {"c": between})
    assert dec[0].fused and "own kernel" in dec[0].why
    assert (ch["c"].variant, ch["c"].cfg) == ("conv_direct", Config.of(WG=64, KB=2))
    # ... but not where the search's kernel has other layouts than the conv's (the layout
    # plan would meet new conversions)
    from aotconv.variants import BY_NAME
    ig = BY_NAME["conv_igemm"]
    nhwc = Config.of(**dict(dict(ig.fallback(out.layers[0], POCL).items), LAYOUT="NHWC"))
    assert ig.layouts_of(out.layers[0], nhwc)[0] == "NHWC"
    other = Choice("conv_igemm", nhwc, 1.25, "tuned")
    _, ch, dec = fusion.apply_residual(net, tuned, POCL, "measure", "tune",
                                       lambda n, only: {"c": other})
    assert dec[0].fused and ch["c"].variant == "conv_igemm"
    # the add without a time: the search's kernel is kept where it is as fast as the conv
    untimed = dict(tuned, a=Choice("add_direct", Config.of(WG=64, VEC=1), None, "fallback"))
    quick = Choice("conv_tiled", Config.of(KT=4), 0.95, "tuned")
    _, ch, _ = fusion.apply_residual(net, untimed, POCL, "measure", "tune",
                                     lambda n, only: {"c": quick})
    assert ch["c"].variant == "conv_tiled"
    # a configuration that is no point of the fused layer's space is not carried
    odd = dict(tuned, c=Choice("conv_direct", Config.of(WG=7, KB=2), 1.0, "tuned"))
    _, _, dec = fusion.apply_residual(net, odd, POCL, "measure", "tune",
                                      lambda n, only: {"c": slow})
    assert not dec[0].fused


def test_a_kernel_that_declines_the_residual_is_not_carried():
    """conv_depthwise declines a fused layer: its configuration is a point of its space for
    the fused layer's shape, but carrying it would drop the residual."""
    net = passes.optimise(spec.network_from_dict({
        "name": "carrydw", "input": [1, 8, 6, 6],
        "layers": [{"name": "c", "op": "conv", "out": 8, "kernel": 3, "pad": 1, "groups": 8},
                   {"name": "a", "op": "add", "inputs": ["c", "input"]}]}))
    from aotconv.variants import BY_NAME
    dw = BY_NAME["conv_depthwise"]
    layer = net.layer("c")
    ch = {"c": Choice("conv_depthwise", dw.fallback(layer, POCL), None, "fallback"),
          "a": Choice("add_direct", Config.of(WG=64, VEC=1), None, "fallback")}
    other = Choice("conv_direct", Config.of(WG=64, KB=1), None, "fallback")
    _, _, dec = fusion.apply_residual(net, ch, POCL, "measure", "fallback",
                                      lambda n, only: {"c": other})
    assert not dec[0].fused

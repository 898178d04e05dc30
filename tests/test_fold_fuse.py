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

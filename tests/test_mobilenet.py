"""The shipped MobileNet-v2: generated from its table, torchvision's structure, names and sizes;
its depthwise layers on conv_depthwise untuned; built on PoCL without tuning against numpy."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from aotconv.choose import choose
from aotconv.graph import c_ident
from aotconv.passes import optimise
from aotconv.spec import load_network
from aotconv.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
TORCHVISION_PARAMS = 3_504_872          # sum(p.numel() for p in mobilenet_v2().parameters())


def generator():
    path = ROOT / "tools" / "gen_mobilenet.py"
    mod_spec = importlib.util.spec_from_file_location("gen_mobilenet", path)
    gen = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(gen)
    return gen


def test_mobilenet_v2_yaml_is_what_the_generator_writes():
    assert (ROOT / "aotconv" / "nets" / "mobilenet_v2.yaml").read_text() == generator().render()


def depthwise(net):
    return [l for l in net.layers if l.op == "conv" and l.attrs["groups"] == l.in_shape[1] > 1]


def test_mobilenet_v2_has_torchvisions_shapes_names_and_parameters():
    net = load_network("mobilenet_v2")
    convs = [l for l in net.layers if l.op == "conv"]
    bns = [l for l in net.layers if l.op == "batchnorm"]
    adds = [l for l in net.layers if l.op == "add"]
    dws = depthwise(net)
    assert (len(convs), len(bns), len(adds), len(dws)) == (52, 52, 10, 17)
    assert all(not l.attrs["bias"] for l in convs)
    assert all(l.attrs["kernel"] == (3, 3) and l.attrs["pad"] == (1, 1, 1, 1) for l in dws)
    # Conv2dNormActivation's relu6 on every batchnorm but the projections' (conv.2 / conv.3)
    linear = {l.name for l in bns if l.attrs["act"] == "none"}
    assert linear == {"features.1.conv.2"} | {f"features.{i}.conv.3" for i in range(2, 18)}
    assert all(l.attrs["act"] == "relu6" for l in bns if l.name not in linear)
    # torchvision's module names: block 1 has no expansion, the others conv.0 to conv.3
    assert net.layer("features.1.conv.0.0").attrs["groups"] == 32
    assert net.layer("features.2.conv.1.0").attrs["stride"] == (2, 2)
    assert net.layer("features.2.conv.0.0").attrs["kernel"] == (1, 1)
    assert net.shape_of("features.0.1") == (1, 32, 112, 112)
    assert net.shape_of("features.1.conv.2") == (1, 16, 112, 112)
    assert net.shape_of("features.3.add") == (1, 24, 56, 56)
    assert net.shape_of("features.13.add") == (1, 96, 14, 14)
    assert net.shape_of("features.17.conv.3") == (1, 320, 7, 7)
    assert net.shape_of("features.18.1") == (1, 1280, 7, 7)
    assert net.layer("classifier.0").attrs["p"] == 0.2
    assert net.shape_of("classifier.1") == (1, 1000, 1, 1) and net.outputs == ["classifier.1"]
    # residual adds where stride 1 keeps the channels: blocks 3, 5, 6, 8-10, 12, 13, 15, 16
    assert [l.name.split(".")[1] for l in adds] == ["3", "5", "6", "8", "9", "10", "12", "13",
                                                    "15", "16"]
    # torchvision's 3,504,872 parameters plus each batchnorm's running mean and variance
    assert net.param_count() == TORCHVISION_PARAMS + sum(l.out_shape[1] for l in bns) * 2


def test_untuned_depthwise_layers_run_conv_depthwise():
    """No depthwise layer falls back to a generic kernel, on any target."""
    net = optimise(load_network("mobilenet_v2"))
    names = {l.name for l in depthwise(net)}
    for target in ("pocl-cpu", "h100", "mali-t628"):
        got = choose(net, TARGETS[target], mode="fallback")
        assert {n: got[n].variant for n in names} == {n: "conv_depthwise" for n in names}


@pytest.mark.slow
def test_builds_without_tuning_and_matches_numpy(tmp_path):
    """`aotconv build mobilenet_v2 --no-tune --batch 1` on PoCL, against the numpy reference."""
    from aotconv import params as params_mod
    from aotconv.compiler import compile_network
    from aotconv.harness import close
    from aotconv.reference import run_network
    from aotconv.runtime import load
    res = compile_network("mobilenet_v2", target="pocl-cpu", outdir=tmp_path / "mn", batch=1,
                          tune_mode="fallback", measure=False, quiet=True, seed=5)
    net0 = load_network("mobilenet_v2", batch=1)
    flat = params_mod.read_bin(res.outdir / f"{c_ident(net0.name)}.params.bin", net0)
    x = np.random.default_rng(11).standard_normal(net0.input_shape).astype(np.float32)
    with load(res.outdir) as lib:
        out = lib(x)
    ref = run_network(net0, x, params_mod.split(net0, flat))[0]
    ok, err = close(out, ref)
    assert ok, f"mobilenet_v2: max hybrid error {err:.2e}"
    chosen = {l["layer"]: l for l in json.loads((res.outdir / "tuning.json").read_text())["layers"]}
    for l in depthwise(net0):
        assert chosen[l.name]["variant"] == "conv_depthwise", chosen[l.name]


def test_torchvision_weights_map_by_name(tmp_path):
    """torchvision's state_dict keys are `<layer>.weight` etc. of the same names: its model
    and the numpy reference agree on random weights (where torchvision is installed)."""
    torch = pytest.importorskip("torch")
    models = pytest.importorskip("torchvision.models")
    from aotconv.reference import run_network
    model = models.mobilenet_v2(weights=None).eval()
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS
    net = load_network("mobilenet_v2")
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    params = {}
    for l in net.layers:
        for tensor, shape in l.params:
            key = {"gamma": "weight", "beta": "bias", "mean": "running_mean",
                   "var": "running_var"}.get(tensor, tensor) if l.op == "batchnorm" else tensor
            v = sd[f"{l.name}.{key}"]
            assert v.shape == tuple(shape), (l.name, tensor)
            if l.op == "batchnorm":           # untrained stats are 0 and 1: make them count
                v = (rng.uniform(0.5, 1.5, shape) if tensor in ("gamma", "var")
                     else rng.standard_normal(shape) * 0.1).astype(np.float32)
                sd[f"{l.name}.{key}"] = v
            params.setdefault(l.name, {})[tensor] = v
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in sd.items()})
    x = rng.standard_normal(net.input_shape).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = run_network(net, x, params)[0].reshape(want.shape)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)

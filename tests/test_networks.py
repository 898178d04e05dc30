"""Every shipped network builds for PoCL and its library matches the numpy reference."""
import numpy as np
import pytest

from aotconv import params as params_mod
from aotconv.compiler import compile_network
from aotconv.graph import c_ident
from aotconv.spec import load_network
from aotconv.harness import close
from aotconv.reference import run_network
from aotconv.runtime import load

# batch 1 where the network's own batch would be slow on 2 cores; lenet5 keeps its 100.
# make test builds lenet5; the others (10 to 45 s each on 2 cores with PoCL's kernel cache
# empty) are in the slow tier
NETS = [("lenet5", None), ("alexnet", 1), ("vgg16", 1), ("nin", 1), ("inception-v1", 1)]


@pytest.mark.parametrize("name,batch", [
    pytest.param(n, b, id=n, marks=() if n == "lenet5" else pytest.mark.slow) for n, b in NETS])
def test_shipped_network(name, batch, tmp_path):
    res = compile_network(name, target="pocl-cpu", outdir=tmp_path / name, batch=batch,
                          tune_mode="fallback", measure=False, quiet=True, seed=5)
    net0 = load_network(name, batch=batch)
    flat = params_mod.read_bin(res.outdir / f"{c_ident(net0.name)}.params.bin", net0)
    x = np.random.default_rng(11).standard_normal(net0.input_shape).astype(np.float32)
    with load(res.outdir) as lib:
        out = lib(x)
    ref = run_network(net0, x, params_mod.split(net0, flat))
    ref = ref[0] if isinstance(ref, list) else ref
    ok, err = close(out, ref)
    assert ok, f"{name}: max hybrid error {err:.2e}"
    # softmax outputs: a real distribution per item
    assert np.allclose(out.reshape(out.shape[0], -1).sum(axis=1), 1.0, atol=1e-4)

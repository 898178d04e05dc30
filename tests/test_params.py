"""Device-free tests of aotconv.params: layout order, random values, npz and bin round trips."""
import numpy as np
import pytest

from aotconv import params
from aotconv.errors import SpecError
from aotconv.spec import load_network, network_from_dict


@pytest.fixture(scope="module")
def net():
    """conv (grouped, with bias), batchnorm, conv without bias, dense: every tensor kind."""
    return network_from_dict({
        "name": "p", "input": [2, 4, 7, 7],
        "layers": [
            {"name": "c1", "op": "conv", "out": 6, "kernel": 3, "groups": 2},
            {"name": "bn", "op": "batchnorm"},
            {"name": "c2", "op": "conv", "out": 5, "kernel": [1, 2], "bias": False},
            {"name": "r", "op": "relu"},
            {"name": "fc", "op": "dense", "out": 3},
        ]})


def test_layout_order_and_offsets(net):
    lay = net.param_layout()
    assert [(l, t, s) for l, t, s, _ in lay] == [
        ("c1", "weight", (6, 2, 3, 3)), ("c1", "bias", (6,)),
        ("bn", "gamma", (6,)), ("bn", "beta", (6,)), ("bn", "mean", (6,)), ("bn", "var", (6,)),
        ("c2", "weight", (5, 6, 1, 2)),
        ("fc", "weight", (3, 5 * 5 * 4)), ("fc", "bias", (3,))]
    offsets = [o for _, _, _, o in lay]
    assert offsets == [0, 108, 114, 120, 126, 132, 138, 198, 498]
    assert net.param_count() == 501


def test_split_views_the_flat_array(net):
    flat = np.arange(net.param_count(), dtype=np.float32)
    p = params.split(net, flat)
    assert p["c1"]["weight"][1, 0, 0, 0] == 18          # row-major [out, in/groups, kh, kw]
    assert p["bn"]["gamma"][0] == 114 and p["fc"]["bias"][-1] == 500
    assert "r" not in p
    with pytest.raises(ValueError, match="501"):
        params.split(net, flat[:-1])


def test_random_params_seeded_scaled_and_never_zero(net):
    a, b = params.random_params(net, seed=3), params.random_params(net, seed=3)
    assert a.dtype == np.float32 and a.shape == (net.param_count(),)
    assert np.array_equal(a, b) and not np.array_equal(a, params.random_params(net, seed=4))
    assert np.all(a != 0)
    p = params.split(net, a)
    assert np.all(p["bn"]["var"] > 0) and np.all(np.abs(p["bn"]["gamma"] - 1) <= 0.25)
    # weights shrink with fan-in: 1/sqrt(fan_in) scaling
    assert np.abs(p["c1"]["weight"]).max() <= np.sqrt(6 / 18)
    assert np.abs(p["fc"]["weight"]).max() <= np.sqrt(6 / 100)
    assert p["fc"]["weight"].std() > 0.5 * np.sqrt(2 / 100)


def test_npz_round_trip(net, tmp_path):
    flat = params.random_params(net, seed=1)
    path = tmp_path / "w.npz"
    params.to_npz(net, flat, path)
    assert sorted(np.load(path).files) == sorted(f"{l}.{t}" for l, t, _, _ in net.param_layout())
    assert np.array_equal(params.from_npz(net, path), flat)


def _npz(net, tmp_path, edit):
    arrays = {f"{l}.{t}": a for l, ts in params.split(net, params.random_params(net)).items()
              for t, a in ts.items()}
    edit(arrays)
    path = tmp_path / "w.npz"
    np.savez(path, **arrays)
    return path


def test_npz_missing_tensor_is_located(net, tmp_path):
    path = _npz(net, tmp_path, lambda a: a.pop("bn.var"))
    with pytest.raises(SpecError) as ei:
        params.from_npz(net, path)
    e = ei.value
    assert (e.file, e.layer, e.key) == (str(path), "bn", "bn.var")
    assert str(path) in str(e) and "missing" in str(e) and "[6]" in str(e)


def test_npz_misnamed_layer_hints_at_the_extra_key(net, tmp_path):
    path = _npz(net, tmp_path, lambda a: a.update({"fc1.bias": a.pop("fc.bias")}))
    with pytest.raises(SpecError, match="does not use: fc1.bias") as ei:
        params.from_npz(net, path)
    assert ei.value.key == "fc.bias"


def test_npz_misshaped_tensor_is_located(net, tmp_path):
    path = _npz(net, tmp_path, lambda a: a.update({"c2.weight": a["c2.weight"].reshape(5, 6, 2)}))
    with pytest.raises(SpecError) as ei:
        params.from_npz(net, path)
    e = ei.value
    assert (e.file, e.layer, e.key) == (str(path), "c2", "c2.weight")
    assert "[5, 6, 2]" in str(e) and "expected [5, 6, 1, 2]" in str(e)


def test_npz_extra_key_and_nan_are_errors(net, tmp_path):
    path = _npz(net, tmp_path, lambda a: a.update({"zz.weight": np.ones(2), "r.bias": np.ones(1)}))
    with pytest.raises(SpecError, match="r.bias, zz.weight"):
        params.from_npz(net, path)

    def nan(a):
        a["fc.bias"] = a["fc.bias"].copy()
        a["fc.bias"][1] = np.nan
    path = _npz(net, tmp_path, nan)
    with pytest.raises(SpecError, match="NaN") as ei:
        params.from_npz(net, path)
    assert ei.value.key == "fc.bias"


def test_npz_unreadable_file(net, tmp_path):
    path = tmp_path / "w.npz"
    path.write_text("not a zip")
    with pytest.raises(SpecError, match="npz") as ei:
        params.from_npz(net, path)
    assert ei.value.file == str(path)


def test_bin_round_trip_is_raw_little_endian(net, tmp_path):
    flat = params.random_params(net, seed=2)
    path = tmp_path / "p.params.bin"
    params.write_bin(path, flat)
    raw = path.read_bytes()
    assert len(raw) == 4 * net.param_count()
    assert np.frombuffer(raw[:4], "<f4")[0] == flat[0]
    back = params.read_bin(path, net)
    assert back.dtype == np.float32 and np.array_equal(back, flat)


def test_bin_wrong_count_is_an_error(net, tmp_path):
    path = tmp_path / "p.params.bin"
    params.write_bin(path, np.ones(net.param_count() - 1, np.float32))
    with pytest.raises(SpecError, match="needs 501 float32") as ei:
        params.read_bin(path, net)
    assert ei.value.file == str(path)


@pytest.mark.parametrize("size, want", [(0, "truncated: holds 0 bytes"),
                                        (4 * 501 - 2, "truncated: .*and 2 stray bytes"),
                                        (4 * 502, "too long: holds 2008 bytes")])
def test_bin_of_the_wrong_size_says_what_it_holds_and_needs(net, tmp_path, size, want):
    p = tmp_path / "p.params.bin"
    p.write_bytes(b"\0" * size)
    with pytest.raises(SpecError, match=want + r".*needs 501 float32 = 2004 bytes") as ei:
        params.read_bin(p, net)
    assert ei.value.file == str(p)


def test_bin_missing_or_a_directory(net, tmp_path):
    with pytest.raises(SpecError, match="cannot read the parameters file: No such file"):
        params.read_bin(tmp_path / "none.bin", net)
    with pytest.raises(SpecError, match="Is a directory"):
        params.read_bin(tmp_path, net)


def test_shipped_layout_follows_file_order():
    net = load_network("inception-v1")
    layers = []
    for l, _, _, _ in net.param_layout():
        if not layers or layers[-1] != l:
            layers.append(l)
    file_order = sorted((x for x in net.layers if x.params), key=lambda x: x.line)
    assert layers == [x.name for x in file_order]
    assert layers[:3] == ["conv1_7x7_s2", "conv2_3x3_reduce", "conv2_3x3"]
    assert layers[3:6] == ["inception_3a_1x1", "inception_3a_3x3_reduce", "inception_3a_3x3"]


def test_layers_on_one_line_keep_file_order(tmp_path):
    # flow style puts every layer on one line; 'b' reads 'a' so it runs second but is written first
    p = tmp_path / "flow.yaml"
    p.write_text("name: t\ninput: [1, 2, 5, 5]\noutputs: [b]\nlayers: [{name: b, op: conv, out: 3, "
                 "kernel: 1, inputs: [a]}, {name: a, op: conv, out: 2, kernel: 1, inputs: [input]}]\n")
    from aotconv.spec import load_network
    net = load_network(str(p))
    assert [l.name for l in net.layers] == ["a", "b"]
    assert [(l, t, off) for l, t, _, off in net.param_layout()] == [
        ("b", "weight", 0), ("b", "bias", 6), ("a", "weight", 9), ("a", "bias", 13)]


def test_random_batchnorm_statistics_are_those_of_their_input():
    """A deep residual network of random weights: each batchnorm's mean and var are its input's
    statistics, so its output is beta + gamma * (roughly unit normal) per channel, and the
    activations keep their scale to the end instead of doubling their variance per block."""
    from aotconv.reference import run_network
    layers = [{"name": "c0", "op": "conv", "out": 8, "kernel": 3, "pad": 1}]
    for i in range(1, 13):
        layers += [{"name": f"c{i}", "op": "conv", "out": 8, "kernel": 3, "pad": 1},
                   {"name": f"b{i}", "op": "batchnorm", "act": "relu"},
                   {"name": f"a{i}", "op": "add",
                    "inputs": [f"b{i}", "c0" if i == 1 else f"a{i - 1}"]}]
    deep = network_from_dict({"name": "deep", "input": [16, 4, 8, 8], "layers": layers,
                              "outputs": ["c1", "a12"]})
    flat = params.random_params(deep, seed=0)
    p = params.split(deep, flat)
    x = np.random.default_rng(9).standard_normal((16, 4, 8, 8))
    c1, a12 = run_network(deep, x, flat)
    # b1 normalises c1 with c1's own statistics (on other draws of the input: within 25%)
    assert np.allclose(p["b1"]["mean"], c1.mean(axis=(0, 2, 3)),
                       atol=0.25 * np.sqrt(c1.var(axis=(0, 2, 3))).max())
    assert np.allclose(p["b1"]["var"], c1.var(axis=(0, 2, 3)), rtol=0.25)
    # twelve residual blocks: an rms of a few, not 2^6 times the first block's
    assert np.sqrt((a12 ** 2).mean()) < 8
    assert np.array_equal(flat, params.random_params(deep, seed=0))   # still seeded
    assert not np.array_equal(flat, params.random_params(deep, seed=1))

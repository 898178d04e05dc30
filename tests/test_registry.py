"""The variant registry and AOTCONV_EXCLUDE_VARIANTS (device-free)."""
import pytest

from aotconv.errors import AotconvError
from aotconv.space import layer_space
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS
from aotconv.variants import for_layer


def conv3x3():
    net = network_from_dict({"name": "n", "input": [1, 8, 9, 9], "layers": [
        {"name": "c", "op": "conv", "out": 8, "kernel": 3, "pad": 1}]})
    return net.layer("c")


def test_exclusion_removes_a_variant_everywhere(monkeypatch):
    layer = conv3x3()
    assert "conv_winograd" in [v.name for v in for_layer(layer)]
    monkeypatch.setenv("AOTCONV_EXCLUDE_VARIANTS", "conv_winograd, conv_tiled")
    names = [v.name for v in for_layer(layer)]
    assert "conv_winograd" not in names and "conv_tiled" not in names and "conv_direct" in names
    parts = [p.variant.name for p in layer_space(layer, TARGETS["h100"]).parts]
    assert "conv_winograd" not in parts and "conv_igemm" in parts


def test_unknown_excluded_name_is_an_error(monkeypatch):
    monkeypatch.setenv("AOTCONV_EXCLUDE_VARIANTS", "conv_winogard")
    with pytest.raises(AotconvError, match="unknown variants \\['conv_winogard'\\]"):
        for_layer(conv3x3())

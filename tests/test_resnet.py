"""The shipped ResNet-50: generated from its table, torchvision's structure and sizes."""
import importlib.util
from pathlib import Path

from aotconv.spec import load_network

ROOT = Path(__file__).resolve().parent.parent


def test_resnet50_yaml_is_what_the_generator_writes():
    path = ROOT / "tools" / "gen_resnet.py"
    mod_spec = importlib.util.spec_from_file_location("gen_resnet", path)
    gen = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(gen)
    assert (ROOT / "aotconv" / "nets" / "resnet50.yaml").read_text() == gen.render()


def test_resnet50_has_torchvisions_shapes_and_parameters():
    net = load_network("resnet50")
    convs = [l for l in net.layers if l.op == "conv"]
    bns = [l for l in net.layers if l.op == "batchnorm"]
    adds = [l for l in net.layers if l.op == "add"]
    assert (len(convs), len(bns), len(adds)) == (53, 53, 16)
    assert net.shape_of("layer1.2.add") == (1, 256, 56, 56)
    assert net.shape_of("layer2.0.conv2") == (1, 128, 28, 28)     # v1.5: stride on the 3x3
    assert net.shape_of("layer4.2.add") == (1, 2048, 7, 7)
    assert net.shape_of("fc") == (1, 1000, 1, 1)
    # torchvision's 25,557,032 parameters plus each batchnorm's running mean and variance
    assert net.param_count() == 25_557_032 + sum(l.out_shape[1] for l in bns) * 2

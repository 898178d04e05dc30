"""The model zoo: torchvision classifiers with seeded random weights, exported to ONNX by both
PyTorch exporters.

Each model is built with weights=None under a fixed seed, and its BatchNorm running statistics
(never trained, so mean 0 and var 1, which folding would pass untested) are randomised: mean
~ N(0, 0.1^2), var in [0.5, 1.5], gamma in [0.5, 1.5], beta ~ N(0, 0.1^2). The export is
cached under build/zoo/ by model, exporter and the versions of torch and torchvision.
"""
from pathlib import Path

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
          "squeezenet1_1", "googlenet", "shufflenet_v2_x1_0", "vgg16", "alexnet")
# dynamo: torch.onnx.export(dynamo=True), as users call it (its optimiser folds every
# BatchNormalization into the conv before it); torchscript: dynamo=False (which folds them too);
# dynamo-raw: dynamo=True, optimize=False, which keeps the BatchNormalization nodes, so that
# aotconv's own batchnorm folding meets the randomised statistics
EXPORTERS = ("dynamo", "torchscript", "dynamo-raw")
INPUT_SHAPE = (1, 3, 224, 224)
OPSET = 18


def model(name, seed=0):
    """torchvision's `name` in eval mode, seeded, with randomised BatchNorm statistics."""
    import torch
    import torchvision
    torch.manual_seed(seed)
    kwargs = {"weights": None}
    if name == "googlenet":
        kwargs.update(aux_logits=False, init_weights=True)
    m = getattr(torchvision.models, name)(**kwargs).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.1)
    return m


def export(name, exporter, out_dir, seed=0):
    """Path of `name` exported by `exporter` (EXPORTERS), written once and reused."""
    import torch
    import torchvision
    tag = f"torch{torch.__version__}-tv{torchvision.__version__}".replace("+", "_")
    path = Path(out_dir) / tag / f"{name}-{exporter}.onnx"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    m = model(name, seed)
    x = torch.randn(*INPUT_SHAPE, generator=torch.Generator().manual_seed(seed))
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        if exporter in ("dynamo", "dynamo-raw"):
            prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=OPSET,
                                     input_names=["input"], output_names=["logits"],
                                     external_data=False, verbose=False,
                                     optimize=exporter == "dynamo")
            prog.save(str(tmp))
        else:
            torch.onnx.export(m, (x,), str(tmp), dynamo=False, opset_version=OPSET,
                              input_names=["input"], output_names=["logits"])
    tmp.replace(path)
    return path

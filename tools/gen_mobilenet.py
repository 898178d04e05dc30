"""Write aotconv/nets/mobilenet_v2.yaml: MobileNet-v2 as torchvision builds it.

Seventeen inverted-residual blocks (1x1 expansion, 3x3 depthwise, 1x1 linear projection, each
conv without bias and followed by batchnorm, relu6 after the first two) are too many to type,
so this script is the source and the yaml is generated; both are committed, and tests check
they agree. Layer names are torchvision's module names (`features.2.conv.1.0` is block 2's
depthwise conv), so a state_dict maps onto the layers by name; the relu6 of each
Conv2dNormActivation is its batchnorm's act, the residual add is `features.<i>.add` and the
global average pool `avgpool`. Run: python tools/gen_mobilenet.py
"""
from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import netgen                                                   # noqa: E402
from tools.netgen import layer                                             # noqa: E402

# torchvision's inverted_residual_setting: expansion t, output channels c, blocks n, stride s
SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]
STEM, LAST, CLASSES, DROPOUT = 32, 1280, 1000, 0.2

ABOUT = """
MobileNet-v2 (Sandler et al. 2018; torchvision's mobilenet_v2, width 1.0): batch 1, 224x224
RGB. Inverted residual blocks: 1x1 expansion -> 3x3 depthwise (stride here) -> 1x1 linear
projection, convs without bias, each followed by batchnorm, relu6 after the first two; the
residual add where stride is 1 and the channels match. Names are torchvision's module names.
"""


def conv_bn(conv, bn, out, kernel, stride=1, groups=1, relu6=True, inputs=None):
    """A conv without bias named `conv` and its batchnorm named `bn`, with relu6 (the
    activation of torchvision's Conv2dNormActivation) as the batchnorm's act, or linear; the
    padding keeps the size (divided by the stride)."""
    return netgen.conv_bn(conv, bn, out, kernel, act="relu6" if relu6 else None, stride=stride,
                          pad=(kernel - 1) // 2, groups=groups, inputs=inputs)


def render():
    out = [netgen.header(ABOUT, "gen_mobilenet.py", "mobilenet_v2", (1, 3, 224, 224))]
    out += conv_bn("features.0.0", "features.0.1", STEM, 3, stride=2)
    prev, channels, index = "features.0.1", STEM, 1
    for t, c, n, s in SETTING:
        for b in range(n):
            stride = s if b == 0 else 1
            hidden = channels * t
            p = f"features.{index}.conv"
            expand = f"1x1 {channels} -> {hidden}, " if t != 1 else ""
            out.append("")
            out.append(f"  # features.{index}: {expand}3x3 depthwise {hidden}"
                       + (f" /{stride}" if stride > 1 else "") + f", 1x1 -> {c}")
            # conv.0 is the expansion where there is one; then the depthwise conv (with its
            # batchnorm) and the projection's conv and batchnorm, numbered on
            k = 0
            if t != 1:
                out += conv_bn(f"{p}.0.0", f"{p}.0.1", hidden, 1, inputs=prev)
                k = 1
            out += conv_bn(f"{p}.{k}.0", f"{p}.{k}.1", hidden, 3, stride=stride, groups=hidden,
                           inputs=prev if t == 1 else None)
            out += conv_bn(f"{p}.{k + 1}", f"{p}.{k + 2}", c, 1, relu6=False)
            last = f"{p}.{k + 2}"
            if stride == 1 and channels == c:
                out.append(layer(name=f"features.{index}.add", op="add",
                                 inputs=f"[{last}, {prev}]"))
                last = f"features.{index}.add"
            prev, channels, index = last, c, index + 1
    out.append("")
    out += conv_bn(f"features.{index}.0", f"features.{index}.1", LAST, 1, inputs=prev)
    out.append("")
    out.append(layer(name="avgpool", op="global_avgpool"))
    out.append(layer(name="classifier.0", op="dropout", p=DROPOUT))
    out.append(layer(name="classifier.1", op="dense", out=CLASSES))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    netgen.write("mobilenet_v2.yaml", render())

"""Write aotconv/nets/resnet50.yaml: ResNet-50 v1.5 as torchvision builds it.

Sixteen bottleneck blocks of conv/batchnorm/relu with a residual add are too many to type, so
this script is the source and the yaml is generated; both are committed, and tests check they
agree. Layer names are torchvision's module names (`layer1.0.conv1`), so a state_dict maps onto
the layers by name. Run: python tools/gen_resnet.py
"""
from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import netgen                                                   # noqa: E402
from tools.netgen import layer                                             # noqa: E402

# (blocks, bottleneck width, stride of the first block) per stage; the output is 4x the width
STAGES = [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]
EXPANSION = 4

ABOUT = """
ResNet-50 v1.5 (He et al. 2015; torchvision's resnet50): batch 1, 224x224 RGB. Bottleneck
blocks 1x1 -> 3x3 (stride here, v1.5) -> 1x1, convs without bias, each followed by batchnorm;
the residual add applies the block's relu. Names are torchvision's module names.
"""


def conv_bn(name, bn, out, kernel, relu=True, **kw):
    """A conv without bias and its batchnorm, with relu as the batchnorm's act or linear."""
    return netgen.conv_bn(name, bn, out, kernel, act="relu" if relu else None, **kw)


def render():
    out = [netgen.header(ABOUT, "gen_resnet.py", "resnet50", (1, 3, 224, 224))]
    out += conv_bn("conv1", "bn1", 64, 7, stride=2, pad=3)
    out.append(layer(name="maxpool", op="maxpool", kernel=3, stride=2, pad=1))
    prev, channels = "maxpool", 64
    for s, (blocks, width, stride) in enumerate(STAGES, start=1):
        for b in range(blocks):
            p = f"layer{s}.{b}"
            st = stride if b == 0 else 1
            out.append("")
            out.append(f"  # {p}: 1x1 {width} -> 3x3 {width}" + (f" /{st}" if st > 1 else "")
                       + f" -> 1x1 {width * EXPANSION}")
            out += conv_bn(f"{p}.conv1", f"{p}.bn1", width, 1, inputs=prev)
            out += conv_bn(f"{p}.conv2", f"{p}.bn2", width, 3, stride=st, pad=1)
            out += conv_bn(f"{p}.conv3", f"{p}.bn3", width * EXPANSION, 1, relu=False)
            shortcut = prev
            if b == 0 and (st != 1 or channels != width * EXPANSION):
                out += conv_bn(f"{p}.downsample.0", f"{p}.downsample.1", width * EXPANSION, 1,
                               stride=st, inputs=prev, relu=False)
                shortcut = f"{p}.downsample.1"
            out.append(layer(name=f"{p}.add", op="add", inputs=f"[{p}.bn3, {shortcut}]",
                             act="relu"))
            prev, channels = f"{p}.add", width * EXPANSION
    out.append("")
    out.append(layer(name="avgpool", op="global_avgpool"))
    out.append(layer(name="fc", op="dense", out=1000))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    netgen.write("resnet50.yaml", render())

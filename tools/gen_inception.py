"""Write aotconv/nets/inception-v1.yaml: GoogLeNet as Caffe's bvlc_googlenet deploy model.

Nine inception modules of four branches each are tedious and error-prone to type, so the
table below (the paper's Table 1) is the source and the yaml is generated; both are committed,
and tests/test_spec.py checks they agree. Run: python tools/gen_inception.py
"""
from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import netgen                                                   # noqa: E402
from tools.netgen import layer                                             # noqa: E402

# module: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj); None marks a 3x3/2 maxpool
MODULES = [
    ("3a", (64, 96, 128, 16, 32, 32)),
    ("3b", (128, 128, 192, 32, 96, 64)),
    None,
    ("4a", (192, 96, 208, 16, 48, 64)),
    ("4b", (160, 112, 224, 24, 64, 64)),
    ("4c", (128, 128, 256, 24, 64, 64)),
    ("4d", (112, 144, 288, 32, 64, 64)),
    ("4e", (256, 160, 320, 32, 128, 128)),
    None,
    ("5a", (256, 160, 320, 32, 128, 128)),
    ("5b", (384, 192, 384, 48, 128, 128)),
]

ABOUT = """
Inception-v1 (GoogLeNet, Szegedy et al. 2014) as Caffe's bvlc_googlenet deploy model:
batch 1, 224x224 RGB, LRN after the stem, nine inception modules, no auxiliary classifiers.
Caffe rounds pooled sizes up, hence ceil_mode: true on the stride-2 pools (112 -> 56 -> 28
-> 14 -> 7). Every conv has a fused relu except the classifier.
"""


def conv(name, out, kernel, **kw):
    """A conv with its fused relu (every conv of the network has one)."""
    return netgen.conv(name, out, kernel, act="relu", **kw)


def pool(name):
    """A 3x3/2 max pool that rounds its output size up, as Caffe's do."""
    return layer(name=name, op="maxpool", kernel=3, stride=2, ceil_mode="true")


def module(name, widths, x):
    """One inception module reading layer `x`; its concat is named `inception_<name>`."""
    c1, r3, c3, r5, c5, pp = widths
    p = f"inception_{name}"
    return [
        f"  # {p}: 1x1 {c1} | 1x1 {r3} -> 3x3 {c3} | 1x1 {r5} -> 5x5 {c5} | pool -> 1x1 {pp}",
        conv(f"{p}_1x1", c1, 1, inputs=x),
        conv(f"{p}_3x3_reduce", r3, 1, inputs=x),
        conv(f"{p}_3x3", c3, 3, pad=1),
        conv(f"{p}_5x5_reduce", r5, 1, inputs=x),
        conv(f"{p}_5x5", c5, 5, pad=2),
        layer(name=f"{p}_pool", op="maxpool", kernel=3, stride=1, pad=1, inputs=f"[{x}]"),
        conv(f"{p}_pool_proj", pp, 1),
        # wrapped: a flow mapping may span lines, and the branch list reads better whole
        f"  - {{name: {p}_output, op: concat,\n"
        f"     inputs: [{p}_1x1, {p}_3x3, {p}_5x5, {p}_pool_proj]}}",
        "",
    ]


def render():
    lines = [netgen.header(ABOUT, "gen_inception.py", "inception_v1", (1, 3, 224, 224)),
             conv("conv1_7x7_s2", 64, 7, pad=3, stride=2),
             pool("pool1_3x3_s2"),
             layer(name="pool1_norm1", op="lrn", size=5, alpha="1.0e-4", beta=0.75),
             conv("conv2_3x3_reduce", 64, 1),
             conv("conv2_3x3", 192, 3, pad=1),
             layer(name="conv2_norm2", op="lrn", size=5, alpha="1.0e-4", beta=0.75),
             pool("pool2_3x3_s2"),
             ""]
    x, pools = "pool2_3x3_s2", iter(["pool3_3x3_s2", "pool4_3x3_s2"])
    for m in MODULES:
        if m is None:
            name = next(pools)
            lines += [pool(name), ""]
            x = name
        else:
            lines += module(m[0], m[1], x)
            x = f"inception_{m[0]}_output"
    lines += [layer(name="pool5_7x7_s1", op="global_avgpool"),
              layer(name="pool5_drop_7x7_s1", op="dropout", p=0.4),
              layer(name="loss3_classifier", op="dense", out=1000),
              layer(name="prob", op="softmax")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    netgen.write("inception-v1.yaml", render())

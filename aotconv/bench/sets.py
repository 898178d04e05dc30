"""The benchmark layer sets: (name, N, C, H, W, K, R, S, stride, pad), and the conv layer of each.

AlexNet's five convolutions at batch 128 (the BEAST paper's L1-L5), VGG-16's thirteen at
batch 1, and Boda's 43 unique convolutions of AlexNet, NiN and Inception-V1 at batch 5.
"""
import fnmatch

from .. import ops
from ..graph import Layer

# AlexNet (Caffe, groups unrolled as in the BEAST paper's L1..L5), batch 128.
ALEXNET_N128 = [
    ("alex.conv1", 128, 3, 227, 227, 96, 11, 11, 4, 0),
    ("alex.conv2", 128, 48, 27, 27, 256, 5, 5, 1, 2),
    ("alex.conv3", 128, 256, 13, 13, 384, 3, 3, 1, 1),
    ("alex.conv4", 128, 192, 13, 13, 384, 3, 3, 1, 1),
    ("alex.conv5", 128, 192, 13, 13, 256, 3, 3, 1, 1),
]

# VGG-16 conv layers, batch 1 (Rovder thesis Table 5.4), padding 1.
_vgg = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56), (256, 256, 56),
        (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 28), (512, 512, 14), (512, 512, 14), (512, 512, 14)]
_vgg_names = ["1_1", "1_2", "2_1", "2_2", "3_1", "3_2", "3_3", "4_1", "4_2", "4_3", "5_1", "5_2", "5_3"]
VGG16_N1 = [(f"vgg.conv{n}", 1, c, h, h, k, 3, 3, 1, 1) for n, (c, k, h) in zip(_vgg_names, _vgg)]

# Boda Table 1: 43 unique convolutions of AlexNet, NiN, Inception-V1, batch 5.
# (ksz, stride, out_chan, in_xy, in_chan); pad = (ksz-1)//2 except 11x11 and 6x6 (pad 0).
_boda = [(5,1,32,28,16),(5,1,64,14,32),(1,1,256,7,832),(1,1,112,14,512),(1,1,128,14,512),(1,1,64,28,256),
         (1,1,64,56,64),(1,1,128,14,528),(1,1,144,14,512),(1,1,96,28,192),(1,1,384,7,832),(1,1,160,14,512),
         (1,1,160,14,528),(1,1,4096,1,4096),(1,1,192,14,480),(5,1,128,14,32),(3,1,320,7,160),(1,1,384,13,384),
         (1,1,128,28,256),(1,1,256,14,528),(1,1,96,54,96),(3,1,384,7,192),(3,1,208,14,96),(1,1,1000,6,1024),
         (1,1,1024,6,1024),(6,1,4096,6,256),(3,1,224,14,112),(1,1,256,27,256),(3,1,256,14,128),(5,1,96,28,32),
         (3,1,288,14,144),(3,1,128,28,96),(3,1,320,14,160),(11,4,96,224,3),(11,4,96,227,3),(7,2,64,224,3),
         (3,1,1024,6,384),(3,1,256,13,384),(3,1,384,13,256),(3,1,192,28,128),(3,1,384,13,384),(3,1,192,56,64),
         (5,1,256,27,96)]
def _pad(k):
    return 0 if k in (11, 6) else (k - 1) // 2
BODA43_N5 = [(f"boda.{i:02d}.k{k}s{s}o{o}i{xy}c{c}", 5, c, xy, xy, o, k, k, s, _pad(k))
             for i, (k, s, o, xy, c) in enumerate(_boda)]

def flops(N, C, H, W, K, R, S, stride, pad):
    P = (H + 2 * pad - R) // stride + 1
    Q = (W + 2 * pad - S) // stride + 1
    return 2 * N * K * P * Q * C * R * S

SETS = {"alexnet_n128": ALEXNET_N128, "vgg16_n1": VGG16_N1, "boda43_n5": BODA43_N5}
SET_NAMES = tuple(SETS)


def conv_layer(t, max_batch=None):
    """A conv Layer (no bias, no activation) from a benchmark tuple; the batch capped at
    `max_batch` when given. Returns (layer, original batch)."""
    name, n, c, h, w, k, r, s, stride, pad = t
    n0 = n
    if max_batch:
        n = min(n, max_batch)
    a = ops.normalise("conv", {"out": k, "kernel": [r, s], "stride": stride, "pad": pad,
                               "bias": False})
    out, params = ops.infer("conv", a, [(n, c, h, w)])
    return Layer(name, "conv", a, ["input"], in_shapes=[(n, c, h, w)], out_shape=out,
                 params=params), n0


def select(set_names, patterns):
    """[(set name, tuple)] of the chosen sets, filtered by name globs."""
    out = []
    for s in set_names:
        for t in SETS[s]:
            if not patterns or any(fnmatch.fnmatch(t[0], p) for p in patterns):
                out.append((s, t))
    return out

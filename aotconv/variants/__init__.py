"""The registry of kernel variants: one module per variant, one line here per variant.

AOTCONV_EXCLUDE_VARIANTS (comma-separated names) leaves variants out of every search and
choice, e.g. `AOTCONV_EXCLUDE_VARIANTS=conv_winograd` to measure the best non-Winograd
convolution; an unknown name is an error.
"""
import os
from .eltwise import Eltwise
from .conv_pool import ConvPoolDirect
from .conv_dwpw import ConvDwpw
from .layout_convert import LayoutConvert
from .conv_direct import ConvDirect
from .conv_depthwise import ConvDepthwise
from .dense_direct import DenseDirect
from .pool import PoolDirect
from .pool_nhwc import PoolNhwc
from .global_avgpool import GlobalAvgpoolDirect
from .global_avgpool_nhwc import GlobalAvgpoolNhwc
from .softmax import SoftmaxDirect
from .lrn import LrnDirect
from .concat import ConcatDirect
from .add import AddDirect
from .batchnorm import BatchnormDirect
from .conv_igemm import ConvIgemm
from .conv_dw_nhwc import ConvDwNhwc
from .conv_tiled import ConvTiled
from .conv_1x1 import Conv1x1
from .conv_im2col import ConvIm2col
from .conv_winograd import ConvWinograd
from .conv_mma import ConvMma
from .conv_mma_f16 import ConvMmaF16
from .conv_mma_f16_nhwc import ConvMmaF16Nhwc
from .conv_mma_f16_stem import ConvMmaF16Stem
from .conv_wgmma_f16_nhwc import ConvWgmmaF16Nhwc
from .conv_wgmma_halo_f16_nhwc import ConvWgmmaHaloF16Nhwc
from .conv_wgmma_halo_pool_f16_nhwc import ConvWgmmaHaloPoolF16Nhwc
from .conv_mma_tf32_nhwc import ConvMmaTf32Nhwc
from .dense_gemv import DenseGemv
from .dense_gemm import DenseGemm
from .dense_mma_f16 import DenseMmaF16
from .scale import ScaleDirect
from .channel_copy import ChannelShuffleDirect, ChannelSliceDirect
from .crop import CropDirect
from .upsample import UpsampleDirect
from .conv_transpose import ConvTransposeDirect
from .eltwise_nhwc import AddNhwc, EltwiseNhwc, ScaleNhwc

VARIANTS = [
    Eltwise(),
    ConvPoolDirect(),
    ConvDwpw(),
    LayoutConvert(),
    ConvDepthwise(),            # before conv_direct: the fallback of depthwise layers
    ConvDirect(),
    DenseDirect(),
    PoolDirect(),
    PoolNhwc(),                 # ... in NHWC/CHWN: tuned, never the fallback
    GlobalAvgpoolDirect(),
    GlobalAvgpoolNhwc(),        # ... reading NHWC/CHWN: tuned, never the fallback
    SoftmaxDirect(),
    LrnDirect(),
    ConcatDirect(),
    AddDirect(),
    BatchnormDirect(),
    ConvIgemm(),
    ConvDwNhwc(),               # depthwise in NHWC/CHWN: tuned, never the fallback
    ConvTiled(),
    Conv1x1(),
    ConvIm2col(),
    ConvWinograd(),
    ConvMma(),                  # TF32 tensor cores: tf32 builds only (aotconv.precision)
    ConvMmaF16(),               # f16 tensor cores on half storage: fp16 builds only
    ConvMmaF16Nhwc(),           # ... channels last (NHWC in and out)
    ConvMmaF16Stem(),           # ... first layers: NCHW in (few channels), NHWC out
    ConvWgmmaF16Nhwc(),         # ... on Hopper's warpgroup instruction (sm_90a)
    ConvWgmmaHaloF16Nhwc(),     # ... its 3x3s from a halo tile staged once per BK channels
    ConvWgmmaHaloPoolF16Nhwc(), # ... with a 2x2 max pool fused (conv_pool layers)
    ConvMmaTf32Nhwc(),          # TF32 tensor cores channels last: tf32 builds only
    DenseGemv(),
    DenseGemm(),
    DenseMmaF16(),              # f16 tensor cores, weights read in place: fp16 builds only
    ScaleDirect(),
    ChannelShuffleDirect(),
    ChannelSliceDirect(),
    CropDirect(),
    UpsampleDirect(),
    ConvTransposeDirect(),
    EltwiseNhwc(),              # the elementwise layers in NHWC/CHWN: tuned, never the
    AddNhwc(),                  # fallback
    ScaleNhwc(),
]
BY_NAME = {v.name: v for v in VARIANTS}


def active():
    """The registry less the variants AOTCONV_EXCLUDE_VARIANTS names."""
    names = {n.strip() for n in os.environ.get("AOTCONV_EXCLUDE_VARIANTS", "").split(",") if n.strip()}
    unknown = names - set(BY_NAME)
    if unknown:
        from ..errors import AotconvError
        raise AotconvError(f"AOTCONV_EXCLUDE_VARIANTS names unknown variants {sorted(unknown)}; "
                           f"known: {', '.join(BY_NAME)}")
    return [v for v in VARIANTS if v.name not in names]


def for_layer(layer):
    """The variants that handle `layer`, in registry order (the first is the plain fallback)."""
    return [v for v in active() if v.supports(layer) is None]

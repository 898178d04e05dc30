"""The registry of kernel variants: one module per variant, one line here per variant."""
from .eltwise import Eltwise
from .conv_pool import ConvPoolDirect
from .layout_convert import LayoutConvert
from .conv_direct import ConvDirect
from .dense_direct import DenseDirect
from .pool import PoolDirect
from .global_avgpool import GlobalAvgpoolDirect
from .softmax import SoftmaxDirect
from .lrn import LrnDirect
from .concat import ConcatDirect
from .add import AddDirect
from .batchnorm import BatchnormDirect
from .conv_igemm import ConvIgemm
from .conv_tiled import ConvTiled
from .conv_1x1 import Conv1x1
from .conv_im2col import ConvIm2col
from .conv_winograd import ConvWinograd
from .dense_gemv import DenseGemv
from .dense_gemm import DenseGemm

VARIANTS = [
    Eltwise(),
    ConvPoolDirect(),
    LayoutConvert(),
    ConvDirect(),
    DenseDirect(),
    PoolDirect(),
    GlobalAvgpoolDirect(),
    SoftmaxDirect(),
    LrnDirect(),
    ConcatDirect(),
    AddDirect(),
    BatchnormDirect(),
    ConvIgemm(),
    ConvTiled(),
    Conv1x1(),
    ConvIm2col(),
    ConvWinograd(),
    DenseGemv(),
    DenseGemm(),
]
BY_NAME = {v.name: v for v in VARIANTS}


def for_layer(layer):
    """The variants that handle `layer`, in registry order (the first is the plain fallback)."""
    return [v for v in VARIANTS if v.supports(layer) is None]

"""How ONNX tensors of rank 2 to 4 sit in aotconv's 4-D NCHW tensors: trailing sizes of 1.

[N, F] is a dense layer's (N, F, 1, 1); [N, C, L] is (N, C, L, 1), so a 1-D convolution or
pooling is the 2-D one with a kernel of width 1. Axis 0 stays the batch, axis 1 the channels.
"""


def embed(shape):
    """The aotconv shape of an ONNX tensor shape, or None for ranks aotconv has no view of."""
    shape = tuple(int(d) for d in shape)
    if not 2 <= len(shape) <= 4:
        return None
    return shape + (1,) * (4 - len(shape))


def flat_shape(shape):
    """[N, prod(rest)]: what Flatten(axis=1) gives."""
    n = 1
    for d in shape[1:]:
        n *= int(d)
    return (int(shape[0]), n)

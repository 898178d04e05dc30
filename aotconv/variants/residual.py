"""A residual add fused into a convolution's epilogue (passes.fuse_residual): what the variants
that take one share, and the reason the others give for declining.

The fused layer is a conv with attr `residual` and a second input, the add's other tensor, of
the output's shape. A variant that takes it passes In(1) to the launch that writes the output,
just before the output (`with_residual`); its template (which reads `residual` from the
layer's attrs) takes the extra `res` parameter before `y` and adds the residual where it
writes y, before the activation, at the output's offset in the output's layout (so the variant
must read and write one layout). The templates guard all of it with `% if residual:`, so every
other layer renders as before (its kernels, and the tuning records keyed by them, are
unchanged).
"""
from .base import In, Out


def is_residual(layer):
    return bool(layer.attrs.get("residual"))


def with_residual(layer, args):
    """`args` of a launch, with the residual input (In(1)) just before the output where the
    layer has a residual and the launch writes the output; otherwise `args` unchanged."""
    args = tuple(args)
    if not is_residual(layer) or Out() not in args:
        return args
    i = args.index(Out())
    return args[:i] + (In(1),) + args[i:]


def residual_reason(variant, layer):
    """None, or why `variant` declines `layer`: it takes no residual input."""
    if is_residual(layer):
        return (f"{variant.name} takes no residual input in its epilogue (a conv with an add "
                f"fused in)")
    return None

"""The registry of kernel variants: one module per variant, one line here per variant."""
from .eltwise import Eltwise

VARIANTS = [Eltwise()]
BY_NAME = {v.name: v for v in VARIANTS}


def for_layer(layer):
    """The variants that handle `layer`, in registry order (the first is the plain fallback)."""
    return [v for v in VARIANTS if v.supports(layer) is None]

"""aotconv: an ahead-of-time OpenCL kernel compiler for convolutional networks."""

__version__ = "0.1.0"


def load(directory, **kwargs):
    """Load a built network directory (see `aotconv build`) as a callable, through cffi."""
    from .runtime import load as _load
    return _load(directory, **kwargs)

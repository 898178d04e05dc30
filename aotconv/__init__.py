"""aotconv: an ahead-of-time OpenCL kernel compiler for convolutional networks."""

__version__ = "0.1.0"


def load(directory, profile=False, **kwargs):
    """Load a built network directory (see `aotconv build`) as a callable, through cffi.
    profile=True keeps per-kernel times for its profile() (off by default, as in C)."""
    from .runtime import load as _load
    return _load(directory, profile=profile, **kwargs)

"""Which OpenCL devices the tests can use here, asked once per test process."""
import functools


@functools.lru_cache(maxsize=None)
def pocl_present():
    """Whether the PoCL CPU device (target pocl-cpu) is there: a test that needs it is skipped
    with the reason where it is not (a machine without PoCL, or with a broken ICD)."""
    try:
        from aotconv.targets import TARGETS, find_device
        return find_device(TARGETS["pocl-cpu"]) is not None
    except Exception:
        return False

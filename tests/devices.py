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


def h100_tensor_cores(precision):
    """(the h100 target in `precision` with the live device's compute capability, (context,
    queue)) for the tests marked gpu; skipped where no H100 with tensor cores is here."""
    import pytest
    from aotconv import harness
    from aotconv.context import with_precision
    from aotconv.targets import TARGETS, find_device
    from aotconv.variants.conv_mma import has_tensor_cores
    h100 = TARGETS["h100"]
    found = find_device(h100)
    if found is None:
        pytest.skip("no H100 here")
    target = with_precision(h100, precision, found[1])
    if not has_tensor_cores(target):
        pytest.skip("the H100's compute capability reads below 8.0")
    ctx, queue, _ = harness.context_for(h100)
    return target, (ctx, queue)

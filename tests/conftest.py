"""Test tiers.

- device-free (marker `unit`): spec parsing, shape inference, spaces and pruning, strategies
  replayed from recorded logs, records, emitted text, the ONNX importer's mapping. These
  modules pass with no OpenCL device at all (`make test-unit` runs them with the OpenCL loader
  pointed at an empty vendor directory).
- device (marker `device`): kernels compiled and run, libraries built with ninja and loaded
  with cffi, on the OpenCL device present: PoCL in CI. A module of this tier may hold
  device-free tests too; it needs the device for the rest.
- GPU (marker `gpu`): what needs a GPU target's own device; skipped where it is absent.

Across the tiers, marker `slow` (heavy PoCL sweeps: `make test-full`): the cases of a sweep
that cost compile time on PoCL without adding a feature the sweep's other cases lack,
whole-network builds beyond a small one, and the heavy tests (seconds each) whose feature a
cheaper test keeps in `make test` (a comment above each names it). `make test` deselects them
(`-m "not slow"`), `make test-full` runs everything. Mark a sweep's extra cases with
`pytest.param(..., marks=pytest.mark.slow)`, or a whole test with `@pytest.mark.slow`; a
parametrize list whose every value is slow is an error (check_sweeps_keep_a_quick_case), so
that `make test` still runs one case of every swept feature.

Every test module is in exactly one of the two lists below, so a new module must say which
tier it belongs to (test_every_module_has_a_tier).
"""
from pathlib import Path

import pytest

DEVICE_FREE = {
    "test_bench_package", "test_onnx_import", "test_onnx_random", "test_onnx_resample",
    "test_params",
    "test_records_kernel", "test_records_robust", "test_reference", "test_registry",
    "test_resnet", "test_space", "test_space_enum", "test_spec", "test_strategies", "test_study",
    "test_fuzz_slice", "test_tiers", "test_slow_tier",
}


def tier_of(path):
    return "unit" if Path(path).stem in DEVICE_FREE else "device"


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: device-free; passes with no OpenCL device")
    config.addinivalue_line("markers", "device: needs an OpenCL device (PoCL in CI)")
    config.addinivalue_line("markers", "gpu: needs a GPU target's device")
    config.addinivalue_line("markers", "slow: heavy PoCL sweeps: `make test-full`")
    config.addinivalue_line("markers", "timing: a search against a scaled wall clock, whose "
                            "counts a second test process on the same cores can starve: "
                            "`make test` runs these alone, after the others")


_PARAM = type(pytest.param(None))


def _is_slow(value):
    return isinstance(value, _PARAM) and any(m.name == "slow" for m in value.marks)


def _marked_slow(holder):
    marks = getattr(holder, "pytestmark", [])
    return any(m.name == "slow" for m in (marks if isinstance(marks, list) else [marks]))


def check_sweeps_keep_a_quick_case(items):
    """A parametrize list whose every value is marked slow leaves `make test` no case of the
    sweep: an error, unless the test itself (its function, class or module) is marked slow.
    Read from the parametrize lists, so it does not depend on which cases were selected."""
    seen = set()
    for item in items:
        fn = getattr(item, "function", None)
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if any(_marked_slow(h) for h in (fn, item.cls, item.module)):
            continue
        for mark in item.iter_markers("parametrize"):
            a, kw = mark.args, mark.kwargs
            names = a[0] if a else kw.get("argnames")
            values = list(a[1] if len(a) > 1 else kw.get("argvalues", ()))
            if values and all(_is_slow(v) for v in values):
                raise pytest.UsageError(
                    f"{item.path.name}::{item.originalname}: every value of parametrize "
                    f"{names!r} is marked slow, so `make test` runs none of them; leave one "
                    f"unmarked, or mark the test itself @pytest.mark.slow")


def pytest_collection_modifyitems(config, items):
    check_sweeps_keep_a_quick_case(items)
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.path)))


@pytest.fixture(scope="module")
def cl_ctx():
    """(context, queue) of the PoCL device, for a module's device tier; skips it without PoCL."""
    from aotconv import harness
    from aotconv.targets import TARGETS
    try:
        ctx, queue, _ = harness.context_for(TARGETS["pocl-cpu"])
    except Exception as e:                          # no PoCL: the device tier is skipped
        pytest.skip(f"PoCL not available: {e}")
    return ctx, queue

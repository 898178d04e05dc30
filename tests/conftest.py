"""Test tiers.

- device-free (marker `unit`): spec parsing, shape inference, spaces and pruning, strategies
  replayed from recorded logs, records, emitted text, the ONNX importer's mapping. These
  modules pass with no OpenCL device at all (`make test-unit` runs them with the OpenCL loader
  pointed at an empty vendor directory).
- device (marker `device`): kernels compiled and run, libraries built with ninja and loaded
  with cffi, on the OpenCL device present: PoCL in CI. A module of this tier may hold
  device-free tests too; it needs the device for the rest.
- GPU (marker `gpu`): what needs a GPU target's own device; skipped where it is absent.

Every test module is in exactly one of the two lists below, so a new module must say which
tier it belongs to (test_every_module_has_a_tier).
"""
from pathlib import Path

import pytest

DEVICE_FREE = {
    "test_bench_package", "test_onnx_import", "test_onnx_random", "test_params",
    "test_records_kernel", "test_records_robust", "test_reference", "test_registry",
    "test_resnet", "test_space", "test_spec", "test_strategies", "test_study",
    "test_fuzz_slice", "test_tiers",
}


def tier_of(path):
    return "unit" if Path(path).stem in DEVICE_FREE else "device"


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: device-free; passes with no OpenCL device")
    config.addinivalue_line("markers", "device: needs an OpenCL device (PoCL in CI)")
    config.addinivalue_line("markers", "gpu: needs a GPU target's device")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.path)))

"""ONNX's node conformance tests on PoCL through aotconv's ONNX backend (conformance.py):
the documented SUBSET by default, every case with AOTCONV_ONNX_CONFORMANCE=all
(`make test-onnx`). A case aotconv does not take is skipped with its reason."""
import os

import pytest

pytest.importorskip("onnx")

import conformance  # noqa: E402

_ALL = os.environ.get("AOTCONV_ONNX_CONFORMANCE") == "all"
_CASES = [c for cs in conformance.cases().values() for c in cs
          if _ALL or c.name in conformance.SUBSET]


def test_the_subset_names_cases_that_exist():
    names = {c.name for cs in conformance.cases().values() for c in cs}
    assert set(conformance.SUBSET) <= names


@pytest.mark.parametrize("case", _CASES, ids=lambda c: c.name)
def test_node(case):
    conformance.run_case(case)

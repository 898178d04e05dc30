"""Every test module belongs to a tier (tests/conftest.py), and the device-free tier is."""
from pathlib import Path

import conftest

TESTS = Path(__file__).parent


def test_every_device_free_module_exists():
    stems = {p.stem for p in TESTS.rglob("test_*.py")}
    assert conftest.DEVICE_FREE <= stems, sorted(conftest.DEVICE_FREE - stems)


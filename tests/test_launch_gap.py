"""tools/launch_gap.py: what one more kernel launch costs a run, measured on PoCL."""
import importlib.util
import json
from pathlib import Path

import pytest

from devices import pocl_present

ROOT = Path(__file__).resolve().parent.parent


def tool():
    spec = importlib.util.spec_from_file_location("launch_gap", ROOT / "tools" / "launch_gap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not pocl_present(), reason="no PoCL device")
def test_the_chain_is_measured_with_profiling_off_and_on(tmp_path, capsys):
    out = tmp_path / "gap.json"
    assert tool().main(["--target", "pocl-cpu", "--launches", "20", "--repeats", "2",
                        "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["launches"] == 20 and got["kernel_us"] > 0
    for key in ("profiling_off", "profiling_on"):
        f = got[key]
        # the wall time per launch holds the kernel's own time and the gap after it
        assert f["wall_us_per_launch"] > 0 and f["gap_us"] >= 0
        assert f["gap_us"] == pytest.approx(max(0.0, f["wall_us_per_launch"] - got["kernel_us"]),
                                            abs=2e-3)
    assert "between kernels" in capsys.readouterr().out


def test_an_absent_target_is_one_line():
    from aotconv.targets import find_device, get_target
    if find_device(get_target("h100")) is not None:
        pytest.skip("an H100 is present here")
    with pytest.raises(SystemExit) as e:
        tool().measure("h100", launches=2, repeats=1)
    assert "no matching OpenCL device" in str(e.value)

"""The search-quality study's command (python -m aotconv.bench.study): its default paths, a
replay of every strategy against a recorded log without a device, and bad input as one line.
"""
import json
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

from aotconv.bench import study

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "data" / "pocl_conv_tiled.jsonl"       # vgg.conv3_2 shrunk 8x, on PoCL


def test_default_paths_keep_logs_in_results_and_tables_in_build():
    assert study.default_logs("h100") == Path("results/h100/study-logs")
    assert study.default_logs("pocl-cpu", 8) == Path("results/pocl-cpu/study-logs-scale8")
    assert study.default_out("h100") == Path("build/study/search-study-h100.json")
    assert study.default_out("pocl-cpu", 8).parent == Path("build/study")
    for target, logs in (("h100", "study-logs"), ("pocl-cpu", "study-logs-scale8")):
        assert (ROOT / "results" / target / logs).is_dir()          # where the shipped ones are


def test_the_study_layers_are_the_benchmark_sets():
    layers = study.benchmark_layers()
    assert len(layers) == 5 + 13 + 43 and layers["vgg.conv3_2"] == (1, 256, 56, 56, 256, 3, 3,
                                                                     1, 1)
    shrunk = study.study_layer("vgg.conv3_2", layers["vgg.conv3_2"], 8)
    assert shrunk.in_shape == (1, 32, 7, 7) and shrunk.out_shape == (1, 32, 7, 7)


def test_replay_only_writes_the_tables_from_a_recorded_log(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(LOG, logs / "vgg.conv3_2.jsonl")
    out = tmp_path / "study.json"
    assert study.main(["--target", "pocl-cpu", "--scale", "8", "--layers", "vgg.conv3_2",
                       "--replay-only", "--logs", str(logs), "--out", str(out), "--runs", "2",
                       "--strategies", "random;model"]) == 0
    doc = json.loads(out.read_text())
    a = doc["layers"]["vgg.conv3_2"]["analysis"]
    assert doc["command"].startswith("python -m aotconv.bench.study ")
    assert set(a["strategies"]) == {"random", "model"} and a["valid"] > 50
    assert 0 < a["strategies"]["model"]["1/8"]["median"] <= 100
    md = out.with_suffix(".md").read_text()
    assert "# Search-quality study on pocl-cpu" in md and "| vgg.conv3_2 |" in md
    assert md in capsys.readouterr().out


def test_bad_input_is_one_line_without_a_traceback(tmp_path):
    for argv, says in ((["--target", "pocl-cpu", "--layers", "vgg.conv9_9", "--replay-only"],
                        "unknown benchmark layers"),
                       (["--target", "pocl-cpu", "--layers", "vgg.conv3_2", "--replay-only",
                         "--logs", str(tmp_path)], "no log")):
        p = subprocess.run([sys.executable, "-m", "aotconv.bench.study", *argv], cwd=ROOT,
                           capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("study: error: ") and says in lines[0]


@pytest.mark.parametrize("module", ["aotconv.bench.study", "aotconv.bench.compile_speedup"])
def test_the_entry_points_run_as_modules(module):
    p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0 and f"python -m {module}" in p.stdout

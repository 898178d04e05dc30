"""What the bench studies share (aotconv.bench.script): the results they write and a bad input
said in one line, whichever study it is."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aotconv.bench import script
from aotconv.errors import AotconvError

ROOT = Path(__file__).resolve().parent.parent


def test_results_are_json_and_the_table_beside_it_in_a_new_folder(tmp_path):
    out = tmp_path / "new" / "study.json"
    script.write_results(out, {"rows": [1, 2]}, "| a |\n")
    assert json.loads(out.read_text()) == {"rows": [1, 2]} and out.read_text().endswith("}\n")
    assert out.with_suffix(".md").read_text() == "| a |\n"
    other = tmp_path / "elsewhere.md"
    script.write_results(tmp_path / "s.json", {}, "t\n", other)
    assert other.read_text() == "t\n" and not (tmp_path / "s.md").exists()
    script.write_results(tmp_path / "plain.json", {"x": 1})
    assert not (tmp_path / "plain.md").exists()


def test_the_command_line_is_quoted_for_a_shell():
    assert script.command("aotconv.bench.study", ["--out", "a b.json"]) == \
        "python -m aotconv.bench.study --out 'a b.json'"


def test_an_aotconv_error_is_one_line_and_status_2(capsys):
    def main(argv):
        raise AotconvError("no log x.jsonl; run without --replay-only first")
    assert script.entry("study", main)([]) == 2
    assert capsys.readouterr().err == ("study: error: no log x.jsonl; run without "
                                       "--replay-only first\n")


@pytest.mark.parametrize("module, prog", [("aotconv.bench.seeding_study", "seeding_study"),
                                          ("aotconv.bench.study", "study")])
def test_each_study_says_a_bad_input_in_one_line(module, prog, tmp_path):
    argv = {"seeding_study": [str(tmp_path)],
            "study": ["--target", "pocl-cpu", "--layers", "vgg.conv9_9", "--replay-only"]}[prog]
    p = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True,
                       text=True)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: ")

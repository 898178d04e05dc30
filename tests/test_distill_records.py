"""tools/distill_records.py: what it keeps of a tuning log, that the shipped records are its
output, and that it refuses bad input and a distillation that would choose differently.

Device-free: records are written by hand with the keys aotconv itself computes
(tune.records.Key) for a lenet5 layer on the pocl-cpu profile.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from aotconv import passes, spec
from aotconv.targets import TARGETS
from aotconv.tune.records import DATA_DIR, Key, cfg_to_json
from aotconv.variants import BY_NAME

ROOT = Path(__file__).resolve().parent.parent
POCL = TARGETS["pocl-cpu"]


def _tool():
    path = ROOT / "tools" / "distill_records.py"
    mod_spec = importlib.util.spec_from_file_location("distill_records", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


dr = _tool()


@pytest.fixture(scope="module")
def c3():
    net = passes.optimise(spec.load_network("lenet5"))
    return net.layer("c3")


def igemm_cfg(layer, layout, vw):
    """The conv_igemm fallback of `layer` with LAYOUT and VW changed (valid points)."""
    v = BY_NAME["conv_igemm"]
    cfg = v.fallback(layer, POCL)
    return type(cfg)(tuple((k, layout if k == "LAYOUT" else vw if k == "VW" else x)
                           for k, x in cfg.items))


def rec(layer, cfg, ms, status="ok", **extra):
    r = Key(layer, BY_NAME["conv_igemm"], POCL).fields()
    r["device"] = {"vendor": "v", "name": "n", "driver": "d"}
    r.update(cfg=cfg_to_json(cfg), status=status)
    if ms is not None:
        r.update(time_ms=ms, times=[ms, ms * 1.1, ms * 0.9])
    r.update(extra)
    return r


def write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def log(layer):
    """A tuning log: per layout several points, one superseded by a later slower record, a
    failed point and the fallback's record."""
    a, b, c = (igemm_cfg(layer, "NCHW", w) for w in (1, 2, 4))
    d, e = (igemm_cfg(layer, "NHWC", w) for w in (1, 2))
    return [rec(layer, a, 5.0, fallback=True),  # 0: the fallback, slowest NCHW
            rec(layer, b, 4.0),                 # 1
            rec(layer, c, 1.0),                 # 2: superseded by 6
            rec(layer, d, 2.5),                 # 3: fastest NHWC
            rec(layer, e, 6.0),                 # 4
            rec(layer, e, None, status="wrong", error=0.5),     # 5: e failed when rerun
            rec(layer, c, 9.0)]                 # 6: c rerun, slower: the one that counts


def test_distill_keeps_per_layout_the_fastest_and_the_fallback(c3):
    raw = [("x", r) for r in log(c3)]
    kept = dr.distill(raw, keep=1)
    # NCHW: b (4.0; c counts 9.0 now), NHWC: d; the fallback a; nothing of the failed e
    assert [r["time_ms"] for r in kept] == [5.0, 4.0, 2.5]
    assert kept[0]["fallback"] is True
    assert all("times" not in r for r in kept)
    assert all(r["cfg"] != raw[2][1]["cfg"] for r in kept)       # neither c's old 1.0 nor 9.0
    assert dr.distill(raw, keep=2) == kept          # the fallback a is NCHW's second
    three = dr.distill(raw, keep=3)
    assert [r["time_ms"] for r in three] == [5.0, 4.0, 2.5, 9.0]   # the spare c, rerun
    assert dr.distill([("x", r) for r in three], keep=3) == three  # a fixed point


def test_a_later_record_of_the_same_kernel_under_another_template_supersedes(c3, tmp_path):
    """Records of an older template hash still count where their kernel hash is the current
    one (Key.matches): a rerun of the point under the current template, slower, is the one
    that counts, and the next fastest takes its place."""
    a, b, c = (igemm_cfg(c3, "NCHW", w) for w in (1, 2, 4))
    kernel = {cfg: Key(c3, BY_NAME["conv_igemm"], POCL).kernel(cfg) for cfg in (a, b, c)}
    old = dict(template="0123456789abcdef")
    recs = [rec(c3, a, 5.0, fallback=True, kernel=kernel[a]),
            rec(c3, c, 1.0, kernel=kernel[c], **old),      # older template, the same kernel
            rec(c3, b, 3.0, kernel=kernel[b], **old),
            rec(c3, c, 9.0, kernel=kernel[c])]             # c rerun now: slower
    kept = dr.distill([("x", r) for r in recs], keep=1)
    # b takes c's place; c's old 1.0 is gone, so nothing reads it as c's time
    assert [r["time_ms"] for r in kept] == [5.0, 3.0]
    raw = write(tmp_path / "raw.jsonl", recs)
    good = write(tmp_path / "good.jsonl", kept)
    assert dr.check(raw, good, [("x", r) for r in recs], dr.Ops())[0] == []


def test_distill_cli_checks_the_choices_and_is_idempotent(c3, tmp_path, capsys):
    raw = write(tmp_path / "raw.jsonl", log(c3))
    out = tmp_path / "out" / "pocl-cpu.jsonl"
    assert dr.main([str(raw), "-o", str(out), "--keep", "1"]) == 0
    first = out.read_bytes()
    assert len(first.splitlines()) == 3
    said = capsys.readouterr().out
    assert "3 of 7 records kept" in said
    assert "2 lookups (op, target or device), 2 of them from records" in said
    assert dr.main([str(out), "-o", str(out), "--keep", "1"]) == 0
    assert out.read_bytes() == first


def test_check_finds_a_distillation_that_would_choose_differently(c3, tmp_path):
    recs = log(c3)
    raw = write(tmp_path / "raw.jsonl", recs)
    ops = dr.Ops()
    bad = write(tmp_path / "bad.jsonl", [r for i, r in enumerate(recs) if i != 3])  # no NHWC best
    diff, checked, chosen = dr.check(raw, bad, [("x", r) for r in recs], ops)
    assert checked == 2 and chosen == 2             # by target name and by the device
    assert len(diff) == 2 and "best conv_igemm" in diff[0] and "NHWC" in diff[0]
    good = write(tmp_path / "good.jsonl", dr.distill([("x", r) for r in recs], 1, ops))
    assert dr.check(raw, good, [("x", r) for r in recs], ops)[0] == []


def test_bad_input_is_one_line_naming_file_and_line(c3, tmp_path, capsys):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(log(c3)[0]) + "\n{\"op\": \n")
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    assert dr.main([str(raw), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distill_records: error: ") and f"{raw}:2: not a JSON record" in err
    assert "\n" not in err and out.read_text() == "kept\n"          # the output untouched
    raw.write_text('{"op": "conv|1x1x1x1|1x1x1x1|", "cfg": []}\n')
    assert dr.main([str(raw), "-o", str(out)]) == 2
    assert f"{raw}:1: not a tuning record (missing format" in capsys.readouterr().err
    assert dr.main([str(tmp_path / "none.jsonl"), "-o", str(out)]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_shipped_records_are_distilled_and_readable():
    """The shipped files are the distiller's output (nothing left to drop), under 3 MiB (the
    H100 file, with FP32, TF32 and FP16 records of ResNet-50 at batch 1 and 32, MobileNetV2 and
    VGG-16, and the channels-last variants, is 2.1 MB; the tuning logs it came from were
    10 MB), and every op signature in them rebuilds to a layer, so the distiller checked every
    one."""
    files = sorted(DATA_DIR.glob("*.jsonl"))
    assert files
    for path in files:
        assert path.stat().st_size < 3 << 20, f"{path}: distil it (docs/tuning.md)"
        raw = dr.read([path])
        assert all("times" not in r for _, r in raw), f"{path}: holds repeat times"
        ops = dr.Ops()
        assert [op for op in {r["op"] for _, r in raw} if ops.layer(op) is None] == []
        assert dr.distill(raw, dr.KEEP, ops) == [r for _, r in raw], \
            f"{path} is not distilled: run tools/distill_records.py on it (docs/tuning.md)"

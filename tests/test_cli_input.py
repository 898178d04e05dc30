"""Bad input on the command line and to the emitted library: a one-line error, before any work.

Device-free: every CLI option of every subcommand (build, run, tune, space, bench) and every
kind of broken --weights file, checked before compile_network (or the tuner) is reached; the C
runtime's device matcher compiled on its own (substring for the user's name, linear-time
'.*' patterns for the target's). On PoCL: load_params with a missing, truncated or overlong
file, and AOTCONV_DEVICE taken literally by create().
"""
import json
import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from aotconv import cli, params
from aotconv.spec import load_network

NET = """\
name: p
input: [2, 4, 7, 7]
layers:
  - {name: c1, op: conv, out: 6, kernel: 3, groups: 2}
  - {name: bn, op: batchnorm}
  - {name: c2, op: conv, out: 5, kernel: [1, 2], bias: false}
  - {name: r, op: relu}
  - {name: fc, op: dense, out: 3}
"""


@pytest.fixture
def net_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(NET)
    return p


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """compile_network, the tuner and the bench replaced by recorders: a test sees whether the
    command got as far as doing any work."""
    seen = []

    class Result:
        check_error = None
        outdir = tmp_path / "out"

    def fake_compile(*args, **kw):
        seen.append(("build", args, kw))
        return Result()
    monkeypatch.setattr("aotconv.compiler.compile_network", fake_compile)
    monkeypatch.setattr("aotconv.tune.cli.cmd_tune", lambda a, load=None: seen.append("tune"))
    monkeypatch.setattr("aotconv.tune.cli.cmd_space", lambda a, load=None: seen.append("space"))
    for where in ("aotconv.bench", "aotconv.bench.cli"):
        try:
            monkeypatch.setattr(f"{where}._entry", lambda a: seen.append("bench"))
        except (ImportError, AttributeError):
            pass
    monkeypatch.setattr(cli, "cmd_run", lambda a: seen.append("run"))
    return seen


def _error_line(argv, capsys):
    """Run the CLI; it must fail with exit status 2 and exactly one 'aotconv: error:' line."""
    rc = cli.main([str(x) for x in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aotconv: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- --weights -----------------------------------------------------------------------------------

def _arrays(net_file):
    net = load_network(str(net_file))
    return {f"{l}.{t}": a.copy() for l, ts in params.split(net, params.random_params(net)).items()
            for t, a in ts.items()}


def _weights(kind, net_file, path):
    a = _arrays(net_file)
    if kind == "empty":
        np.savez(path)
    elif kind == "npy":
        with open(path, "wb") as f:
            np.save(f, params.random_params(load_network(str(net_file))))
    elif kind == "not a zip":
        path.write_bytes(b"\x80\x04K\x01.")            # pickle bytes: never unpickled
    elif kind == "pickled array":
        a["bn.var"] = np.array([{"x": 1}] * 6, dtype=object)
        np.savez(path, **a)
    elif kind == "missing":
        del a["bn.var"]
        np.savez(path, **a)
    elif kind == "extra":
        np.savez(path, **a, **{"zz.weight": np.ones(2)})
    elif kind == "misshaped":
        a["c2.weight"] = a["c2.weight"].reshape(5, 6, 2)
        np.savez(path, **a)
    elif kind == "integer":
        a["fc.bias"] = np.arange(3, dtype=np.int32)
        np.savez(path, **a)
    elif kind == "nan":
        a["c1.bias"][2] = np.nan
        np.savez(path, **a)
    elif kind == "float32 overflow":
        a["fc.weight"] = a["fc.weight"].astype(np.float64)
        a["fc.weight"][0, 0] = 1e300
        np.savez(path, **a)
    elif kind == "directory":
        path.mkdir()
    elif kind != "missing file":
        raise ValueError(kind)


WEIGHTS = {
    "empty": r"holds no arrays; network 'p' needs c1\.weight \[6, 2, 3, 3\]",
    "npy": r"is a single \.npy array; --weights needs an \.npz",
    "not a zip": r"is not an \.npz archive \(not a zip file\)",
    "pickled array": r"key 'bn\.var': 'bn\.var' holds Python objects \(pickled data\)",
    "missing": r"key 'bn\.var': missing tensor 'bn\.var' of shape \[6\]",
    "extra": r"keys this network does not use: zz\.weight",
    "misshaped": r"key 'c2\.weight': .*shape \[5, 6, 2\], expected \[5, 6, 1, 2\]",
    "integer": r"key 'fc\.bias': 'fc\.bias' has dtype int32, expected a floating-point array",
    "nan": r"key 'c1\.bias': 'c1\.bias' holds NaN",
    "float32 overflow": r"key 'fc\.weight': .*too large for float32",
    "missing file": r"cannot read the weights file: No such file",
    "directory": r"cannot read the weights file: Is a directory",
}


@pytest.mark.parametrize("kind", WEIGHTS, ids=WEIGHTS)
def test_bad_weights_are_one_line_errors_before_the_build(kind, net_file, tmp_path, capsys,
                                                          calls):
    w = tmp_path / "w.npz"
    _weights(kind, net_file, w)
    line = _error_line(["build", net_file, "--target", "fury-x", "--weights", w], capsys)
    assert re.search(WEIGHTS[kind], line), line
    assert line.startswith(f"aotconv: error: {w}: ")
    assert "pickle=" not in line and "allow_pickle" not in line
    assert calls == []


def test_good_weights_reach_the_build(net_file, tmp_path, capsys, calls):
    w = tmp_path / "w.npz"
    np.savez(w, **_arrays(net_file))
    assert cli.main(["build", str(net_file), "--target", "fury-x", "--weights", str(w),
                     "--quiet"]) == 0
    assert len(calls) == 1 and calls[0][2]["weights"] == str(w)


# -- every other option ---------------------------------------------------------------------------

def _bad_options(tmp):
    missing, folder = tmp / "missing.jsonl", tmp
    return {
        "build --seed -1": (["build", "{net}", "--seed", "-1"], r"--seed -1: give an integer from 0 to 4294967295"),
        "build --seed 2^32": (["build", "{net}", "--seed", "4294967296"], r"--seed 4294967296"),
        "run --seed -1": (["run", tmp, "--seed", "-1"], r"--seed -1"),
        "tune --seed 2^40": (["tune", "{net}", "--seed", str(2 ** 40)], r"--seed 1099511627776"),
        "bench --seed -5": (["bench", "--seed", "-5"], r"--seed -5"),
        "build --batch 0": (["build", "{net}", "--batch", "0"], r"--batch 0: give a positive integer"),
        "tune --batch -1": (["tune", "{net}", "--batch", "-1"], r"--batch -1"),
        "space --batch 0": (["space", "{net}", "--batch", "0"], r"--batch 0"),
        "build --tuning-db missing": (["build", "{net}", "--tuning-db", missing],
                                      r"--tuning-db .*missing\.jsonl: no such file.*touch"),
        "build --tuning-db directory": (["build", "{net}", "--tuning-db", folder],
                                        r"--tuning-db .*: not a regular file"),
        "tune --tuning-db missing": (["tune", "{net}", "--tuning-db", missing], r"no such file"),
        "build --budget garbage": (["build", "{net}", "--budget", "garbage"],
                                   r"--budget 'garbage': give a number of trials"),
        "build --budget 0": (["build", "{net}", "--budget", "0"], r"--budget '0': .*more than zero"),
        "tune --budget 0s": (["tune", "{net}", "--budget", "0s"], r"--budget '0s'"),
        "tune --budget 1.5": (["tune", "{net}", "--budget", "1.5"], r"--budget '1\.5'"),
        "bench --set-budget x": (["bench", "--set-budget", "x"], r"--set-budget 'x': give"),
        "build --jobs -1": (["build", "{net}", "--jobs", "-1"], r"--jobs -1: give an integer >= 0"),
        "tune -j -2": (["tune", "{net}", "-j", "-2"], r"--jobs -2"),
        "build --strategy": (["build", "{net}", "--strategy", "nope"], r"unknown strategy 'nope'"),
        "tune --strategy option": (["tune", "{net}", "--strategy", "annealing:Q=1"],
                                   r"unknown option 'Q=1'"),
        "tune --layer": (["tune", "{net}", "--layer", "nope"],
                         r"--layer nope: network 'p' has no layer 'nope'.*c1, c2"),
        "tune --layer conv+pool": (["tune", "{net}", "--layer", "c1+c2"],
                                   r"--layer c1\+c2: not a conv and the pool that may fold "
                                   r"into it; network 'p' has: none"),
        "bench --repeats 0": (["bench", "--repeats", "0"], r"--repeats 0: give a positive integer"),
        "bench --warmup -1": (["bench", "--warmup", "-1"], r"--warmup -1"),
        "bench --deadline nan": (["bench", "--deadline", "nan"], r"--deadline nan: give a finite"),
        "bench --max-measure-s inf": (["bench", "--max-measure-s", "inf"], r"--max-measure-s inf"),
        "bench --verify-max-gflop -1": (["bench", "--verify-max-gflop", "-1"],
                                        r"--verify-max-gflop -1\.0: give a finite number >= 0"),
    }


BAD_OPTIONS = list(_bad_options(Path("/tmp")))


def _has_command(name):
    import argparse
    return any(isinstance(a, argparse._SubParsersAction) and name in a.choices
               for a in cli.parser()._actions)


@pytest.mark.parametrize("case", BAD_OPTIONS)
def test_bad_options_are_one_line_errors_before_any_work(case, net_file, tmp_path, capsys,
                                                         calls):
    argv, want = _bad_options(tmp_path)[case]
    if argv[0] == "bench" and not _has_command("bench"):
        pytest.skip("no bench command")
    argv = [str(net_file) if x == "{net}" else x for x in argv]
    line = _error_line(argv, capsys)
    assert re.search(want, line), line
    assert calls == []


@pytest.mark.parametrize("seed", [0, 2 ** 32 - 1])
def test_seeds_at_the_limits_are_accepted(seed, net_file, calls):
    assert cli.main(["build", str(net_file), "--target", "fury-x", "--seed", str(seed),
                     "--quiet"]) == 0
    assert calls[0][2]["seed"] == seed


def test_an_existing_empty_tuning_db_is_accepted(net_file, tmp_path, calls):
    db = tmp_path / "new.jsonl"
    db.touch()
    assert cli.main(["build", str(net_file), "--target", "fury-x", "--tuning-db", str(db),
                     "--quiet"]) == 0
    assert calls[0][2]["tuning_db"] == str(db)


# -- a build directory handed to `aotconv run` / aotconv.load -------------------------------------

@pytest.mark.parametrize("content, want", [
    (b"{\"c_name\": \"p\", \"input_shape\": [1, 2", r"damaged build metadata \(Expecting"),
    (b"\xff\xfe", r"damaged build metadata"),
    (b"[1, 2]", r"damaged build metadata \(a field the loader needs"),
    (b'{"c_name": "p; rm", "input_shape": [1], "outputs": [{"shape": [1]}], "param_count": 1}',
     r"damaged build metadata \(a field the loader needs"),
])
def test_run_with_damaged_tuning_json_is_one_line(tmp_path, capsys, content, want):
    (tmp_path / "tuning.json").write_bytes(content)
    line = _error_line(["run", tmp_path], capsys)
    assert re.search(want, line) and "tuning.json" in line and "aotconv build" in line, line


def test_run_without_the_library_is_one_line(tmp_path, capsys):
    (tmp_path / "tuning.json").write_text(json.dumps(
        {"c_name": "p", "input_shape": [1, 2, 3, 3], "outputs": [{"name": "o", "shape": [1, 3]}],
         "param_count": 5}))
    line = _error_line(["run", tmp_path], capsys)
    assert "libp.so: cannot load the library" in line and "rebuild it" in line, line


# -- the C runtime's device matcher, compiled on its own --------------------------------------------

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"


@pytest.fixture(scope="module")
def matcher(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not Path("/usr/include/CL/cl.h").exists():
        pytest.skip("no C compiler or OpenCL headers")
    from cffi import FFI
    d = tmp_path_factory.mktemp("matcher")
    so = d / "libmatch.so"
    subprocess.run([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-DAOTRT_NS=t", f"-I{RUNTIME}",
                    str(RUNTIME / "rt_device.c"), str(RUNTIME / "rt_errors.c"), "-o", str(so),
                    "-lOpenCL"], check=True, capture_output=True)
    ffi = FFI()
    ffi.cdef("int aotrt_t_match(const char *pattern, const char *text);"
             "int aotrt_t_contains(const char *text, const char *needle);")
    lib = ffi.dlopen(str(so))
    return (lambda p, t: lib.aotrt_t_match(p.encode(), t.encode()),
            lambda t, n: lib.aotrt_t_contains(t.encode(), n.encode()))


@pytest.mark.parametrize("pattern, text, want", [
    ("H100", "NVIDIA H100 80GB HBM3", 1),
    ("h100", "NVIDIA H100 80GB HBM3", 1),                # case-insensitive
    ("A100", "NVIDIA H100 80GB HBM3", 0),
    ("pocl|Portable Computing Language", "The pocl project", 1),
    ("Advanced Micro Devices|AMD", "NVIDIA Corporation", 0),
    ("Fiji|Fury", "AMD Radeon R9 Fury X", 1),            # the second alternative
    (".*", "", 1),
    ("", "anything", 1),
    ("Adreno.*530", "QUALCOMM Adreno(TM) 530", 1),
    ("Adreno.*530", "530 Adreno", 0),                    # pieces in order
    ("a.*a", "a", 0),                                    # pieces do not overlap
    ("ab.*ba", "aba", 0),
    ("ab.*ba", "abba", 1),
    ("GTX 1080", "GeForce GTX 1080 Ti", 1),
    ("x|", "zzz", 1),                                    # an empty alternative matches
])
def test_target_pattern_semantics(matcher, pattern, text, want):
    match, _ = matcher
    assert match(pattern, text) == want
    assert bool(re.search(pattern, text, re.I)) == bool(want)     # what targets.py means


def test_target_patterns_agree_with_python_regex(matcher):
    """Patterns of literals, '.*' and '|' (all that targets.py uses) against random texts."""
    match, _ = matcher
    rng = random.Random(5)
    for _ in range(3000):
        alts = ["".join(rng.choice(["a", "b", "A", ".*"]) for _ in range(rng.randint(0, 5)))
                for _ in range(rng.randint(1, 3))]
        pattern = "|".join(alts)
        text = "".join(rng.choice("abB") for _ in range(rng.randint(0, 8)))
        assert match(pattern, text) == bool(re.search(pattern, text, re.I)), (pattern, text)


@pytest.mark.parametrize("pattern, text, want", [
    (".*" * 60, "x" * 100_000, 1),
    (".*" * 60 + "z", "x" * 100_000, 0),
    (".*a" * 60 + ".*b", "a" * 100_000, 0),
    (".*a" * 60, "a" * 100_000, 1),
    ("|".join([".*a" * 60 + ".*b"] * 4), "a" * 100_000, 0),
], ids=["60 wildcards", "60 wildcards then a missing letter", "60 pieces then a missing letter",
        "60 pieces", "four such alternatives"])
def test_target_patterns_match_in_linear_time(matcher, pattern, text, want):
    match, _ = matcher
    t0 = time.perf_counter()
    assert match(pattern, text) == want
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("needle, want", [
    ("pocl", 1), ("PORTABLE computing", 1), ("skylake-avx512", 1), ("", 1),
    (".*", 0), ("pocl|nvidia", 0), ("nvidia|pocl", 0), ("AMD.*EPYC", 0), ("[pP]ocl", 0),
    ("x" * 5000, 0)])
def test_user_device_name_is_a_literal_substring(matcher, needle, want):
    _, contains = matcher
    text = "The pocl project Portable Computing Language AuthenticAMD pthread-skylake-avx512"
    assert contains(text, needle) == want
    assert contains("a " + needle + " b", needle) == 1          # itself, taken literally
    t0 = time.perf_counter()
    assert contains("a" * 100_000, ".*" * 60 + "b") == 0
    assert time.perf_counter() - t0 < 1.0


# -- the emitted library on PoCL: load_params and AOTCONV_DEVICE ------------------------------------

def _pocl():
    from aotconv.targets import find_device, get_target
    return find_device(get_target("pocl-cpu")) is not None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not _pocl():
        pytest.skip("PoCL is not installed")
    from aotconv.compiler import compile_network
    d = tmp_path_factory.mktemp("lib")
    src = d / "p.yaml"
    src.write_text(NET)
    res = compile_network(str(src), target="pocl-cpu", outdir=d / "out", tune_mode="fallback",
                          measure=False, quiet=True)
    return res.outdir


def test_load_params_errors_from_the_c_runtime(built, tmp_path):
    from aotconv.runtime import LibraryError, load
    with load(built, params=False) as lib:
        short = tmp_path / "short.bin"
        short.write_bytes(b"\0" * (4 * 100 + 3))
        with pytest.raises(LibraryError, match=r"\[-6\].*short\.bin' holds 100 floats and stray "
                                               r"bytes \(403 bytes, truncated\).*2004 bytes"):
            lib.load_params(short)
        long = tmp_path / "long.bin"
        long.write_bytes(b"\0" * (4 * 600))
        with pytest.raises(LibraryError, match=r"\[-6\].*holds 600 floats \(2400 bytes, too long"):
            lib.load_params(long)
        with pytest.raises(LibraryError, match=r"\[-6\].*cannot open '.*none\.bin': No such file"):
            lib.load_params(tmp_path / "none.bin")
        with pytest.raises(LibraryError, match=r"\[-6\].*is not a regular file"):
            lib.load_params(tmp_path)
        with pytest.raises(LibraryError, match=r"\[-7\].*parameters are not set"):
            lib(np.ones(lib.input_shape, np.float32))
        lib.load_params(built / "p.params.bin")
        assert np.all(np.isfinite(lib(np.ones(lib.input_shape, np.float32))))


def test_run_with_a_truncated_params_file_is_one_line(built, tmp_path, capsys):
    d = tmp_path / "copy"
    shutil.copytree(built, d)
    pb = d / "p.params.bin"
    pb.write_bytes(pb.read_bytes()[:-6])
    line = _error_line(["run", d], capsys)
    assert re.search(r"\[-6\].*holds \d+ floats and stray bytes \(\d+ bytes, truncated\)", line)


@pytest.mark.parametrize("name, ok", [("pocl", True), ("PORTABLE COMPUTING", True),
                                      (".*", False), ("pocl|nvidia", False)])
def test_aotconv_device_is_a_literal_substring(built, monkeypatch, name, ok):
    from aotconv.runtime import LibraryError, load
    monkeypatch.setenv("AOTCONV_DEVICE", name)
    if ok:
        load(built, params=False).close()
    else:
        with pytest.raises(LibraryError, match=r"\[-2\].*no OpenCL device matches '" +
                           re.escape(name) + "' \\(from AOTCONV_DEVICE\\)"):
            load(built, params=False)

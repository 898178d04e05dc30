"""Networks of several inputs: net.yaml's `inputs:` (validated with file:line errors), the
planner's input buffers, the numpy and torch references, the library's run_inputs family
(run_inputs, run_async_inputs, run_buffers_inputs and their _n twins, with batch ranges), the
header's input tables, the error codes of the calls of one input, the Python loader, `aotconv
run`, a C program, and ONNX models of several inputs checked against onnxruntime.

PoCL: one three-input network at batch sizes 2 and 4 (the device-free tests need none)."""
import os
import re
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

from aotconv import cli
from aotconv import params as params_mod
from aotconv import spec
from aotconv.compiler import compile_network
from aotconv.errors import AotconvError, SpecError
from aotconv.harness import close
from aotconv.reference import run_network
from aotconv.runtime import LibraryError, load
from aotconv.schedule import plan_activations

# two images and a per-channel gain: the images added, a conv, the gain applied per channel,
# the conv concatenated with the second image, a 1x1 conv; two outputs
THREE = """\
name: threein
inputs:
  left: [4, 3, 6, 6]
  right: [4, 3, 6, 6]
  gain: [4, 4, 1, 1]
outputs: [c2, g]
layers:
  - {name: sum, op: add, inputs: [left, right]}
  - {name: c1, op: conv, out: 4, kernel: 3, pad: 1, act: relu}
  - {name: g, op: scale, inputs: [c1, gain]}
  - {name: cat, op: concat, inputs: [g, right]}
  - {name: c2, op: conv, out: 2, kernel: 1}
"""
SHAPES = {"left": (3, 6, 6), "right": (3, 6, 6), "gain": (4, 1, 1)}


def write(tmp_path, text, name="net.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((n,) + s).astype(np.float32) for k, s in SHAPES.items()}


def reference(source, n, xs, seed=0):
    """The float64 outputs of `source` at batch n on the inputs `xs` (dict), with the
    parameters a build of seed `seed` writes."""
    net = spec.load_network(str(source), batch=n)
    flat = params_mod.random_params(net, seed=seed)
    return run_network(net, xs, params_mod.split(net, flat))


def all_close(got, want):
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        ok, err = close(g, w)
        assert ok, err


# -- device-free: net.yaml, planner, references ----------------------------------------------

def test_inputs_are_named_ordered_and_share_the_batch(tmp_path):
    net = spec.load_network(write(tmp_path, THREE))
    assert net.inputs == [("left", (4, 3, 6, 6)), ("right", (4, 3, 6, 6)),
                          ("gain", (4, 4, 1, 1))]
    assert net.input_shape == (4, 3, 6, 6) and net.is_input("gain") and not net.is_input("g")
    assert net.layer("sum").in_shapes == [(4, 3, 6, 6)] * 2
    assert net.layer("g").in_shapes == [(4, 4, 6, 6), (4, 4, 1, 1)]
    over = spec.load_network(write(tmp_path, THREE), batch=2)
    assert [s for _, s in over.inputs] == [(2, 3, 6, 6), (2, 3, 6, 6), (2, 4, 1, 1)]


def test_one_input_networks_are_as_before(tmp_path):
    net = spec.load_network("lenet5")
    assert net.named_inputs is None and net.inputs == [("input", net.input_shape)]
    # one named input: the network of one input it describes, its input called so
    one = spec.network_from_dict({"name": "t", "inputs": {"image": [1, 2, 5, 5]},
                                  "layers": [{"name": "c", "op": "conv", "out": 3,
                                              "kernel": 3}]})
    assert one.inputs == [("image", (1, 2, 5, 5))] and one.layers[0].inputs == ["image"]


@pytest.mark.parametrize("text, line, key, words", [
    # two inputs of one name: the YAML key appears twice
    ("inputs:\n  a: [1, 3, 4, 4]\n  a: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: relu, "
     "inputs: [a]}\n", 3, "a", "duplicate key 'a' (first given on line 3)"),
    ("inputs:\n  a: [1, 3, 4, 4]\n  b: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: relu, "
     "inputs: [a]}\n", 3, "b", "no layer reads the input 'b'"),
    ("inputs:\n  a: [1, 3, 4, 4]\n  b: [2, 3, 4, 4]\nlayers:\n  - {name: s, op: add, "
     "inputs: [a, b]}\n", 3, "b", "the input 'b' has batch 2, the input 'a' 1: the inputs "
                                 "share one batch N"),
    ("input: [1, 3, 4, 4]\ninputs:\n  a: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: relu}\n",
     2, "inputs", "give either `input: [N, C, H, W]` (one input) or `inputs:"),
    ("inputs: [[1, 3, 4, 4]]\nlayers:\n  - {name: s, op: relu}\n", 1, "inputs",
     "must map each input's name to its [N, C, H, W]"),
    ("inputs:\n  a: [1, 3, 4]\nlayers:\n  - {name: s, op: relu}\n", 2, "a",
     "must be [N, C, H, W], four positive integers"),
    ("inputs:\n  a:\nlayers:\n  - {name: s, op: relu}\n", 2, "a",
     "must be [N, C, H, W], four positive integers; got None"),
    ("inputs:\n  a b: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: relu}\n", 2, "inputs",
     "the input name has the character ' ' at position 2"),
    ("inputs:\n  a.b: [1, 3, 4, 4]\n  a_b: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: add, "
     "inputs: [a.b, a_b]}\n", 3, "inputs", "both become the C name 'a_b'"),
    ("inputs:\n  a: [1, 3, 4, 4]\n  b: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: relu}\n",
     5, "inputs", "the network has 2 inputs (a, b); name the ones the first layer reads"),
    ("inputs:\n  a: [1, 3, 4, 4]\n  b: [1, 3, 4, 4]\nlayers:\n  - {name: s, op: add, "
     "inputs: [a, input]}\n", 5, "inputs", "unknown input 'input'; use a network input (a, b)"),
    ("inputs:\n  a: [1, 3, 4, 4]\n  b: [1, 3, 4, 4]\nlayers:\n  - {name: b, op: add, "
     "inputs: [a, a]}\n", 5, "name", "the network input 'b' (line 4) has this name"),
    # no input at all: the file's first line, where the top-level mapping starts
    ("layers:\n  - {name: s, op: relu}\n", 0, "input", "missing required top-level key "
                                                      "'input'"),
])
def test_inputs_errors_are_located(tmp_path, text, line, key, words):
    p = write(tmp_path, "name: t\n" + text)
    with pytest.raises(SpecError) as ei:
        spec.load_network(p)
    e = ei.value
    msg = str(e)
    assert (e.line, e.key) == (line + 1, key), msg
    assert f"{p}:{line + 1}:" in msg and words in msg, msg
    assert "\n" not in msg


def test_the_planner_gives_each_input_its_own_buffer_live_from_the_start(tmp_path):
    net = spec.load_network(write(tmp_path, THREE))
    assign, slots, _ = plan_activations(net)
    ins = [assign[t] for t in ("left", "right", "gain")]
    assert len(set(ins)) == 3
    # `left` is read by the first layer only: its buffer is free for a later layer's output,
    # `right` (read by cat) is not while cat has not run
    later = {assign[t] for t in ("c1", "g", "cat", "c2")}
    assert assign["left"] in later and assign["right"] not in {assign["c1"], assign["g"]}


def test_the_references_take_every_input(tmp_path):
    src = write(tmp_path, THREE)
    xs = inputs(4)
    by_name = reference(src, 4, xs)
    in_order = reference(src, 4, [xs["left"], xs["right"], xs["gain"]])
    for a, b in zip(by_name, in_order):
        assert np.array_equal(a, b)
    s = xs["left"] + xs["right"]
    assert by_name[0].shape == (4, 2, 6, 6) and by_name[1].shape == (4, 4, 6, 6)
    assert not np.allclose(s, 0)
    net = spec.load_network(src)
    with pytest.raises(ValueError, match="takes 3 inputs"):
        run_network(net, [xs["left"]] * 2, params_mod.random_params(net, seed=0))
    with pytest.raises(ValueError, match="takes inputs left, right, gain"):
        run_network(net, {"left": xs["left"]}, params_mod.random_params(net, seed=0))


def test_the_torch_model_takes_every_input(tmp_path):
    torch = pytest.importorskip("torch")
    from aotconv import torch_model
    src = write(tmp_path, THREE)
    net = spec.load_network(src)
    flat = params_mod.random_params(net, seed=0)
    xs = inputs(4)
    model = torch_model.build(net, flat)
    got = model(*(torch.from_numpy(xs[k]) for k in ("left", "right", "gain")))
    all_close([g.detach().numpy() for g in got], reference(src, 4, xs))
    with pytest.raises(TypeError, match="takes 3 inputs"):
        model(torch.from_numpy(xs["left"]))


@pytest.mark.parametrize("inputs_field", [
    [1], [{"name": "a"}], [{"name": "a", "shape": [1, 2]}], [{"name": 3, "shape": [1, 2, 3, 3]}],
    "a"])
def test_damaged_inputs_metadata_is_one_line(tmp_path, capsys, inputs_field):
    import json
    (tmp_path / "tuning.json").write_text(json.dumps(
        {"c_name": "p", "input_shape": [1, 2, 3, 3], "inputs": inputs_field,
         "outputs": [{"name": "o", "shape": [1, 3]}], "param_count": 5}))
    assert cli.main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged build metadata (a field the loader needs" in err[0]


# -- the library (PoCL) ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """THREE at batch sizes 2 and 4, fallback choices, measured and --check'ed."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "threein.yaml").write_text(THREE)
    res = compile_network(str(d / "threein.yaml"), target="pocl-cpu", outdir=d / "out",
                          batch="2,4", tune_mode="fallback", check=True, quiet=True)
    return d / "threein.yaml", res


def _raw(lib, call, *args):
    rc = lib._f(call)(lib.handle, *args)
    return rc, lib.ffi.string(lib._f("last_error")(lib.handle)).decode()


def test_check_fed_every_input_at_every_size(three):
    _, res = three
    assert [z.batch for z in res.sizes] == [2, 4] and res.check_n == 1
    assert res.check_error is not None and res.check_error <= 1e-3
    assert all(z.check_error <= 1e-3 for z in res.sizes)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_run_inputs_of_any_n_matches_the_reference(three, n):
    src, res = three
    xs = inputs(n, seed=n)
    want = reference(src, n, xs)
    order = [xs["left"], xs["right"], xs["gain"]]
    with load(res.outdir) as lib:
        assert [t for t, _ in lib.inputs] == ["left", "right", "gain"]
        all_close(lib(*order), want)           # positional
        all_close(lib(order), want)            # one list
        all_close(lib(xs), want)               # by name


def test_the_header_tables_the_inputs(three):
    _, res = three
    h = (res.outdir / "threein.h").read_text()

    def macro(m):
        return re.search(rf"#define AOTCONV_THREEIN_{m} (.*?)(?:  +/\*|$)", h, re.M).group(1)
    assert macro("INPUTS") == "3u"
    assert macro("INPUT_NAMES") == '{"left", "right", "gain"}'
    assert macro("INPUT_COUNTS") == "{432u, 432u, 16u}"
    assert macro("INPUT_SAMPLE_COUNTS") == "{108u, 108u, 4u}"
    assert macro("INPUT_OFFSETS") == "{0u, 432u, 864u}"
    assert macro("INPUT_SHAPES") == "{{4u, 3u, 6u, 6u}, {4u, 3u, 6u, 6u}, {4u, 4u, 1u, 1u}}"
    assert macro("INPUT_2_COUNT") == "16u" and macro("INPUT_2_OFFSET") == "864u"
    assert macro("INPUT_INDEX_GAIN") == "2u" and macro("INPUT_INDEX_LEFT") == "0u"
    assert macro("INPUT_COUNT") == "880u" and macro("INPUT_SAMPLE_COUNT") == "220u"
    for call in ("run_inputs", "run_async_inputs", "run_buffers_inputs", "run_inputs_n",
                 "run_async_inputs_n", "run_buffers_inputs_n", "input_name"):
        assert f"aotconv_threein_{call}(" in h
    with load(res.outdir) as lib:
        names = [lib._f("input_name")(i) for i in range(4)]
        assert [lib.ffi.string(s).decode() for s in names[:3]] == ["left", "right", "gain"]
        assert names[3] == lib.ffi.NULL


def test_calls_of_one_input_and_wrong_inputs_are_error_codes(three):
    _, res = three
    xs = inputs(4)
    with load(res.outdir) as lib:
        ffi = lib.ffi
        x = ffi.from_buffer("float[]", xs["left"])
        out = np.empty(4 * (2 + 4) * 36, np.float32)
        y = ffi.from_buffer("float[]", out)
        names = "the network has 3 inputs (left, right, gain); call threein_"
        for call, twin, args in (
                ("run", "run_inputs", (x, 432, y, out.size)),
                ("run_async", "run_async_inputs", (x, 432, y, out.size)),
                ("run_n", "run_inputs_n", (1, x, 108, y, out.size // 4)),
                ("run_async_n", "run_async_inputs_n", (1, x, 108, y, out.size // 4)),
                ("run_buffers", "run_buffers_inputs", (ffi.NULL, ffi.NULL)),
                ("run_buffers_n", "run_buffers_inputs_n", (1, ffi.NULL, ffi.NULL))):
            rc, msg = _raw(lib, call, *args)
            assert rc == -1 and msg == f"threein_{call}: {names}{twin} with all of them", msg
        arrays = [np.ascontiguousarray(xs[k]) for k in ("left", "right", "gain")]
        ptrs = ffi.new("float *[]", [ffi.from_buffer("float[]", a) for a in arrays])
        cptrs = ffi.cast("const float *const *", ptrs)
        counts = ffi.new("size_t[]", [432, 432, 16])
        assert _raw(lib, "run_inputs", cptrs, counts, 3, y, out.size)[0] == 0
        for args, want in (
                ((cptrs, counts, 2, y, out.size), "run_inputs: n_inputs is 2; the network has "
                                                  "3 inputs (left, right, gain)"),
                ((ffi.NULL, counts, 3, y, out.size), "run_inputs: inputs is NULL"),
                ((cptrs, ffi.NULL, 3, y, out.size), "run_inputs: counts is NULL"),
                ((cptrs, ffi.new("size_t[]", [432, 432, 15]), 3, y, out.size),
                 "run_inputs: input 2 ('gain') has 15 floats, expected 16"),
                ((cptrs, counts, 3, y, out.size - 1), "run_inputs: output has room for")):
            rc, msg = _raw(lib, "run_inputs", *args)
            assert rc == -1 and want in msg, msg
        ptrs[1] = ffi.NULL
        rc, msg = _raw(lib, "run_inputs", cptrs, counts, 3, y, out.size)
        assert rc == -1 and "input 1 ('right') is NULL" in msg, msg
        rc, msg = _raw(lib, "run_inputs_n", 0, cptrs, counts, 3, y, out.size)
        assert rc == -1 and "run_inputs_n: n is 0" in msg
        rc, msg = _raw(lib, "run_inputs_n", 5, cptrs, counts, 3, y, out.size)
        assert rc == -1 and "n is 5; give 1 to 4 samples (the library's batch sizes: 2, 4)" \
            in msg
        rc, msg = _raw(lib, "run_inputs_n", 1, cptrs, counts, 3, y, out.size)
        assert rc == -1 and "input 0 ('left') is NULL" not in msg
        with pytest.raises(AotconvError, match=r"takes 3 inputs \(left, right, gain\), got 2"):
            lib(xs["left"], xs["right"])
        with pytest.raises(AotconvError, match="the inputs are left, right, gain; got left"):
            lib({"left": xs["left"]})
        with pytest.raises(LibraryError, match=r"input 1 \('right'\) has 431 floats"):
            lib(xs["left"], xs["right"].ravel()[:-1], xs["gain"])


def test_async_pinned_and_buffer_runs_take_every_input(three):
    src, res = three
    xs = inputs(3, seed=5)
    want = reference(src, 3, xs)
    order = [xs["left"], xs["right"], xs["gain"]]
    with load(res.outdir) as lib:
        lib.run_async(*order)
        all_close(lib.wait(), want)
        pins, pout = lib.host_buffers()
        assert [p.shape for p in pins] == [(4, 3, 6, 6), (4, 3, 6, 6), (4, 4, 1, 1)]
        assert pins[1].__array_interface__["data"][0] == \
            pins[0].__array_interface__["data"][0] + 4 * 432
        for p, x in zip(pins, order):
            p[:3] = x
        flat = lib.run_host(n=3)
        all_close(lib._split(flat.copy(), 3), want)
        assert lib.memory()["pinned_bytes"] >= 4 * (880 + pout.size)
    cl = pytest.importorskip("pyopencl")
    from aotconv.targets import find_device, get_target
    dev = find_device(get_target("pocl-cpu"))[1]
    q = cl.CommandQueue(cl.Context([dev]), dev)
    mf = cl.mem_flags
    with load(res.outdir, queue=q) as lib:
        bufs = [cl.Buffer(q.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x) for x in order]
        flat_want = np.concatenate([w.ravel() for w in want]).astype(np.float32)
        dout = cl.Buffer(q.context, mf.READ_WRITE, flat_want.nbytes)
        lib.run_buffers(bufs, dout, n=3)
        lib.wait()
        got = np.empty_like(flat_want)
        cl.enqueue_copy(q, got, dout)
        assert close(got, flat_want)[0]
        with pytest.raises(LibraryError, match=r"run_buffers_inputs_n: input 2 \('gain'\) "
                                               r"holds 8 bytes, the network's input 2"):
            lib.run_buffers(bufs[:2] + [cl.Buffer(q.context, mf.READ_WRITE, 8)], dout, n=3)
        with pytest.raises(LibraryError, match="run_buffers_inputs: n_inputs is 2"):
            lib.run_buffers(bufs[:2], dout)


def test_staging_by_a_few_bytes_keeps_the_inputs_apart(three):
    """run() stages every input through one ring of pinned slots: with slots of 4 bytes each
    input takes many turns of it, and no slot is refilled before the device has read it."""
    src, res = three
    xs = inputs(4, seed=9)
    want = reference(src, 4, xs)
    with load(res.outdir, stage_bytes=4) as lib:
        for _ in range(3):
            all_close(lib(xs), want)


def test_aotconv_run_feeds_every_input(three, capsys):
    _, res = three
    assert cli.main(["run", str(res.outdir), "--batch", "3"]) == 0
    out = capsys.readouterr().out
    assert "random inputs: left 3x3x6x6, right 3x3x6x6, gain 3x4x1x1" in out
    assert "output 3x2x6x6:" in out and "output 3x4x6x6:" in out


C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include "threein.h"

/* argv: params.bin, the inputs one after another (INPUT_COUNT floats), n, output file */
int main(int argc, char **argv)
{
    static const size_t counts[] = AOTCONV_THREEIN_INPUT_COUNTS;
    static const size_t per[] = AOTCONV_THREEIN_INPUT_SAMPLE_COUNTS;
    static const size_t offsets[] = AOTCONV_THREEIN_INPUT_OFFSETS;
    static const char *const names[] = AOTCONV_THREEIN_INPUT_NAMES;
    float *in = malloc(AOTCONV_THREEIN_INPUT_COUNT * sizeof *in);
    float *out = malloc(AOTCONV_THREEIN_OUTPUT_COUNT * sizeof *out);
    FILE *f = fopen(argv[2], "rb");
    if (argc != 5 || !in || !out || !f ||
        fread(in, sizeof *in, AOTCONV_THREEIN_INPUT_COUNT, f) != AOTCONV_THREEIN_INPUT_COUNT)
        return 2;
    fclose(f);
    size_t n = (size_t)atoi(argv[3]), given[AOTCONV_THREEIN_INPUTS];
    const float *inputs[AOTCONV_THREEIN_INPUTS];
    for (size_t i = 0; i < AOTCONV_THREEIN_INPUTS; ++i) {
        inputs[i] = in + offsets[i];
        given[i] = n * per[i];
        printf("%s %zu of %zu\n", names[i], given[i], counts[i]);
    }
    aotconv_threein *net = NULL;
    int rc = aotconv_threein_create(&net, NULL);
    if (!rc)
        rc = aotconv_threein_load_params(net, argv[1]);
    if (!rc)
        rc = aotconv_threein_run(net, in, AOTCONV_THREEIN_INPUT_COUNT, out,
                                 AOTCONV_THREEIN_OUTPUT_COUNT);
    if (rc != AOTCONV_THREEIN_ERR_ARGUMENT) {
        fprintf(stderr, "run of one input: %d\n", rc);
        return 1;
    }
    rc = aotconv_threein_run_inputs_n(net, n, inputs, given, AOTCONV_THREEIN_INPUTS, out,
                                      n * AOTCONV_THREEIN_OUTPUT_SAMPLE_COUNT);
    if (rc) {
        fprintf(stderr, "run_inputs_n failed (%d): %s\n", rc, aotconv_threein_last_error(net));
        return 1;
    }
    f = fopen(argv[4], "wb");
    fwrite(out, sizeof *out, n * AOTCONV_THREEIN_OUTPUT_SAMPLE_COUNT, f);
    fclose(f);
    aotconv_threein_destroy(net);
    free(in);
    free(out);
    return 0;
}
"""


@pytest.mark.skipif(not shutil.which("pkg-config"), reason="pkg-config is not installed")
def test_a_c_program_runs_every_input(three, tmp_path):
    src, res = three
    d = res.outdir
    (tmp_path / "app.c").write_text(C_PROGRAM)
    env = dict(os.environ, PKG_CONFIG_PATH=str(d))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "threein"], capture_output=True,
                           text=True, env=env, check=True).stdout.split()
    exe = tmp_path / "app"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", str(tmp_path / "app.c"),
                    *flags, f"-Wl,-rpath,{d}", "-o", str(exe)], check=True)
    xs = inputs(3, seed=3)
    block = np.zeros(880, np.float32)          # each input at its offset, 4 samples' room
    for (k, s), off in zip(SHAPES.items(), (0, 432, 864)):
        block[off:off + xs[k].size] = xs[k].ravel()
    block.tofile(tmp_path / "in.bin")
    p = subprocess.run([str(exe), str(d / "threein.params.bin"), str(tmp_path / "in.bin"), "3",
                        str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "left 324 of 432\nright 324 of 432\ngain 12 of 16\n"
    want = np.concatenate([w.ravel() for w in reference(src, 3, xs)])
    assert close(np.fromfile(tmp_path / "out.bin", np.float32), want)[0]


def test_a_one_input_library_takes_run_inputs_of_one(tmp_path):
    src = write(tmp_path, """
        name: onein
        input: [2, 2, 5, 5]
        layers:
          - {name: c, op: conv, out: 3, kernel: 3}
    """)
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "o",
                          tune_mode="fallback", measure=False, quiet=True)
    h = (tmp_path / "o" / "onein.h").read_text()
    assert "#define AOTCONV_ONEIN_INPUT_COUNT 100u    /* float32, NCHW 2x2x5x5 */" in h
    assert '#define AOTCONV_ONEIN_INPUTS 1u' in h
    assert '#define AOTCONV_ONEIN_INPUT_NAMES {"input"}' in h
    assert "#define AOTCONV_ONEIN_INPUT_INDEX_INPUT 0u" in h
    x = np.random.default_rng(1).standard_normal((2, 2, 5, 5)).astype(np.float32)
    net = spec.load_network(str(src))
    (want,) = run_network(net, x, params_mod.split(net, params_mod.random_params(net, seed=0)))
    with load(res.outdir) as lib:
        ffi = lib.ffi
        out = np.empty(2 * 3 * 9, np.float32)
        ptrs = ffi.new("float *[]", [ffi.from_buffer("float[]", x)])
        counts = ffi.new("size_t[]", [100])
        rc, msg = _raw(lib, "run_inputs", ffi.cast("const float *const *", ptrs), counts, 1,
                       ffi.from_buffer("float[]", out), out.size)
        assert rc == 0, msg
        assert close(out.reshape(want.shape), want)[0]
        rc, msg = _raw(lib, "run_inputs", ffi.cast("const float *const *", ptrs), counts, 2,
                       ffi.from_buffer("float[]", out), out.size)
        assert rc == -1 and "onein_run_inputs: n_inputs is 2; the network has 1 input (input)" \
            in msg
        assert close(lib(x), want)[0]            # run(), as ever


# -- ONNX models of several inputs -------------------------------------------------------------

def _two_input_model(tmp_path, x_shape=(2, 3, 5, 5), s_shape=(2, 3, 1, 1)):
    """An image times a per-channel scale (both run-time inputs), a conv, plus a second
    image: three graph inputs, one initializer."""
    pytest.importorskip("onnx")
    from onnx_helpers import model, node, rand, save
    m = model([node("Mul", ["x", "s"], ["xs"]),
               node("Conv", ["xs", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
               node("Add", ["c", "z"], ["y"], name="add")],
              list(x_shape), inits={"w": rand(4, 3, 3, 3)},
              extra_inputs=[("s", list(s_shape)), ("z", [x_shape[0], 4] + list(x_shape[2:]))])
    return save(m, tmp_path / "three.onnx")


def test_an_onnx_model_of_several_inputs_imports_them_in_order(tmp_path):
    from aotconv.onnx_import import import_model
    from aotconv.onnx_import.netyaml import dump
    path = _two_input_model(tmp_path)
    im = import_model(path)
    assert im.inputs == [("x", (2, 3, 5, 5)), ("s", (2, 3, 1, 1)), ("z", (2, 4, 5, 5))]
    assert im.network.inputs == im.inputs
    assert [(l.op, l.inputs) for l in im.network.layers][0] == ("scale", ["x", "s"])
    text = dump(im)
    assert "inputs: {x: [2, 3, 5, 5], s: [2, 3, 1, 1], z: [2, 4, 5, 5]}" in text
    again = spec.network_from_dict(__import__("yaml").safe_load(text))
    assert again.inputs == im.network.inputs
    assert import_model(path, batch=3).network.inputs[2] == ("z", (3, 4, 5, 5))


def test_an_onnx_model_of_several_inputs_checks_against_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    path = _two_input_model(tmp_path, x_shape=("N", 3, 5, 5), s_shape=("N", 3, 1, 1))
    res = compile_network(path, target="pocl-cpu", outdir=tmp_path / "o", tune_mode="fallback",
                          check=True, quiet=True,
                          input_shapes=["x=2x3x5x5", "s=2x3x1x1", "z=2x4x5x5"])
    assert res.check_reference == "onnxruntime"
    assert res.check_error is not None and res.check_error <= 1e-3
    with load(res.outdir) as lib:
        assert lib.inputs == [("x", (2, 3, 5, 5)), ("s", (2, 3, 1, 1)), ("z", (2, 4, 5, 5))]


@pytest.mark.parametrize("shapes, batch, words", [
    (["2x3x5x5"], None, "--input-shape 2x3x5x5 names no input; the model has 3 ('x', 's', "
                        "'z'): give each as --input-shape NAME=DIMS"),
    (["x=2x3x5x5", "q=2x3x1x1"], None, "--input-shape names 'q', but the model's inputs are "
                                       "'x', 's', 'z'"),
    (["x=2x3x5x5", "s=3x3x1x1", "z=2x4x5x5"], None, "input 's' has batch 3 (dim 0), input "
                                                    "'x' 2: aotconv's inputs share one batch"),
    (["x=2x3x5x5", "z=2x4x5x5"], None, "input 's' has symbolic dimensions ([N, 3, 1, 1]); "
                                       "aotconv compiles for static shapes: give them with "
                                       "--input-shape s=1x3x1x1 or --batch N"),
])
def test_onnx_input_shapes_are_given_per_input(tmp_path, shapes, batch, words):
    from aotconv.onnx_import import OnnxError, import_model
    path = _two_input_model(tmp_path, x_shape=("N", 3, 5, 5), s_shape=("N", 3, 1, 1))
    with pytest.raises(OnnxError) as ei:
        import_model(path, input_shapes=shapes, batch=batch)
    assert words in str(ei.value) and "\n" not in str(ei.value)
    # --batch fills every input's symbolic batch
    assert [s for _, s in import_model(path, batch=2).inputs] == \
        [(2, 3, 5, 5), (2, 3, 1, 1), (2, 4, 5, 5)]

"""Names that reach generated code: the name rules at spec time, the escaping helpers fed
hostile text (compiled with the C compiler), the emitted files with hostile names, and layers
named like C/OpenCL keywords or template macros built and run on PoCL."""
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aotconv import names, params as params_mod, passes, spec
from aotconv.choose import choose
from aotconv.emit import check_net_name, emit
from aotconv.errors import AotconvError, SpecError
from aotconv.graph import Layer
from aotconv.names import c_comment, c_ident, c_string
from aotconv.schedule import build_schedule, program_files
from aotconv.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")


def write(tmp_path, text, name="net.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def spec_error(path):
    with pytest.raises(SpecError) as ei:
        spec.load_network(path)
    msg = str(ei.value)
    assert "\n" not in msg and "\r" not in msg, msg
    return ei.value, msg


def one_layer(tmp_path, layer_yaml, net_name="t"):
    return write(tmp_path, f"name: {net_name}\ninput: [1, 2, 5, 5]\nlayers:\n  - {layer_yaml}\n")


# ---------------------------------------------------------------------------------------------
# the injection: a name that closes a comment and adds a constructor


def _payload(marker):
    """C that, outside a comment, makes a directory named `marker` when the library loads."""
    codes = ",".join(str(b) for b in marker.encode()) + ",0"
    return (f"a */ int mkdir(); __attribute__((constructor)) static void f(void) "
            f"{{ mkdir((char[]){{{codes}}}, 448); }} /* ")


def test_comment_injection_is_rejected_at_spec_time(tmp_path):
    name = _payload("pwn")
    assert len(name) <= names.MAX_LAYER_NAME      # rejected for its characters, not its length
    src = write(tmp_path, f"""
        name: inj
        input: [1, 1, 4, 4]
        layers:
          - name: '{name}'
            op: relu
          - {{name: b, op: sigmoid}}
    """)
    proc = subprocess.run([sys.executable, "-m", "aotconv.cli", "build", str(src), "--target",
                           "pocl-cpu", "--no-tune", "-o", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode != 0
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"aotconv: error: {src}:4: layer 'a */ int mkdir()"), err
    assert "key 'name'" in err and "character ' ' at position 2" in err, err
    assert not (tmp_path / "pwn").exists()            # the constructor never ran
    assert not (tmp_path / "out").exists()            # nothing was built


# ---------------------------------------------------------------------------------------------
# the name rules


@pytest.mark.parametrize("name", ["a", "_x", "conv1_1", "layer1.0.conv1", "Conv-2", "__global",
                                  "N", "int", "x" * names.MAX_LAYER_NAME])
def test_valid_layer_names(tmp_path, name):
    net = spec.load_network(one_layer(tmp_path, f"{{name: '{name}', op: relu}}"))
    assert net.layers[0].name == name


@pytest.mark.parametrize("name, words", [
    ("", "empty"),
    ("1a", "starts with '1'"),
    ("/layer1/layer1.0/conv1/Conv", "starts with '/'"),
    ("a/b", "character '/' at position 2"),
    ("a b", "character ' ' at position 2"),
    ('a"b', "character '\"' at position 2"),
    ("a\\nb", "character '\\\\' at position 2"),     # YAML single quotes: a backslash
    ("a??/", "character '?' at position 2"),
    ("a*/", "character '*' at position 2"),
    ("caf\u00e9", "character '\\xe9' at position 4"),
    ("x" * (names.MAX_LAYER_NAME + 1), f"at most {names.MAX_LAYER_NAME}"),
    ("x" * 5000, "has 5000 characters"),
])
def test_invalid_layer_names_are_located(tmp_path, name, words):
    e, msg = spec_error(one_layer(tmp_path, f"{{name: '{name}', op: relu}}"))
    assert (e.line, e.key) == (4, "name"), msg
    assert words in msg, msg
    assert len(msg) < 400, msg


def test_newline_and_control_characters_in_a_name(tmp_path):
    # YAML double quotes: a real newline, a NUL, a trigraph and a comment close
    e, msg = spec_error(one_layer(tmp_path, '{name: "a\\n*/ ??/\\0", op: relu}'))
    assert (e.line, e.key) == (4, "name") and "'\\n'" in msg, msg


def test_inputs_and_outputs_follow_the_rule(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 2, 5, 5]
        layers:
          - {name: a, op: relu}
          - {name: b, op: relu, inputs: ["a\\n*/"]}
    """)
    e, msg = spec_error(p)
    assert (e.line, e.layer, e.key) == (5, "b", "inputs") and "character '\\n'" in msg, msg
    p = write(tmp_path, """
        name: t
        input: [1, 2, 5, 5]
        outputs: ['/x']
        layers:
          - {name: a, op: relu}
    """)
    e, msg = spec_error(p)
    assert (e.line, e.key) == (3, "outputs") and "starts with '/'" in msg, msg


@pytest.mark.parametrize("first, second", [
    ("conv", "CONV"),            # the header upper-cases them into one macro
    ("a.b", "a-b"),              # both map to a_b
    ("a.b", "A_B"),
    ("x_1", "X-1"),
])
def test_names_colliding_after_mapping_name_both_layers(tmp_path, first, second):
    p = write(tmp_path, f"""
        name: t
        input: [1, 2, 5, 5]
        layers:
          - {{name: {first}, op: conv, out: 2, kernel: 1}}
          - {{name: {second}, op: conv, out: 2, kernel: 1}}
    """)
    e, msg = spec_error(p)
    assert (e.line, e.layer, e.key) == (5, second, "name"), msg
    assert f"layer '{first}' at {p}:4" in msg, msg
    assert f"{p}:5:" in msg and "rename one of them" in msg, msg


@pytest.mark.parametrize("name, words", [
    ("9t", "C identifier"),
    ("a-b", "C identifier"),
    ("x" * (names.MAX_NET_NAME + 1), f"at most {names.MAX_NET_NAME}"),
    ("__x", "reserved by the C standard"),
    ("_X", "reserved by the C standard"),
    ("aotconv_rt", "starts with 'aotconv'"),   # would be aotconv_rt.h, the runtime's header
    ("AOTRT_NS", "starts with 'aotrt'"),
    ("rt_rt_net", "starts with 'rt_'"),        # would be obj/rt_rt_net.o, a runtime object
])
def test_invalid_network_names(tmp_path, name, words):
    e, msg = spec_error(one_layer(tmp_path, "{name: a, op: relu}", net_name=name))
    assert (e.line, e.key) == (1, "name"), msg
    assert words in msg, msg


@needs_cc
@pytest.mark.parametrize("name", ["NULL", "stdout", "errno", "CL_SUCCESS", "EOF"])
def test_network_named_like_a_header_macro_is_an_error(name):
    assert spec  # the spec rule lets these through: only the compiler knows its headers' macros
    with pytest.raises(AotconvError, match=f"'{name}' is a macro of the C headers"):
        check_net_name(name)


@needs_cc
def test_ordinary_network_names_are_not_macros():
    for name in ("lenet5", "vgg16", "N", "main", "int"):
        check_net_name(name)


def test_network_from_dict_applies_the_same_rules():
    good = {"name": "d", "input": (1, 2, 4, 4),
            "layers": [{"name": "layer1.0.conv1", "op": "conv", "out": 2, "kernel": (3, 3),
                        "pad": (1, 1)}]}
    net = spec.network_from_dict(good)
    assert net.layers[0].attrs["kernel"] == (3, 3) and net.shape_of("layer1.0.conv1") == (1, 2, 4, 4)
    cases = [
        ({"name": "/layer1/conv", "op": "relu"}, "name", "starts with '/'"),
        ({"name": "a", "op": "lrn", "size": 3, "beta": float("nan")}, "beta", "finite"),
        ({"name": "a", "op": "dropout", "p": 1.0}, "p", "[0, 1)"),
        ({"name": "a", "op": "conv", "out": 2**40, "kernel": 1}, "out", "out of range"),
    ]
    for layer, key, words in cases:
        with pytest.raises(SpecError) as ei:
            spec.network_from_dict({"name": "d", "input": [1, 2, 4, 4],
                                    "layers": [{"name": "r", "op": "relu"}, layer]})
        assert (ei.value.line, ei.value.key) == (2, key) and words in str(ei.value), str(ei.value)
    with pytest.raises(SpecError, match="collides with layer 'conv'"):
        spec.network_from_dict({"name": "d", "input": [1, 2, 4, 4], "layers": [
            {"name": "conv", "op": "relu"}, {"name": "CONV", "op": "relu"}]})
    deep = []
    for _ in range(20000):
        deep = [deep]
    with pytest.raises(SpecError, match="nests more than") as ei:
        spec.network_from_dict({"name": "d", "input": [1, 2, 4, 4],
                                "layers": [{"name": "a", "op": "relu", "x": deep}]})
    assert ei.value.line == 1
    loop = []
    loop.append(loop)
    with pytest.raises(SpecError, match="contains itself"):
        spec.network_from_dict({"name": "d", "input": [1, 2, 4, 4],
                                "layers": [{"name": "a", "op": "relu", "inputs": loop}]})


def test_program_files_stay_apart_ignoring_case():
    """A layer the compiler adds (a layout conversion) can meet a user layer's C name."""
    layers = [Layer(n, "relu", {}, ["input"]) for n in ("a_to_nhwc", "a.to-nhwc", "A_TO_NHWC",
                                                        "a_to_nhwc_2", "b")]
    files = program_files(layers)
    assert len({f.lower() for f in files.values()}) == len(layers)
    assert files["a_to_nhwc"] == "a_to_nhwc" and files["b"] == "b"


# ---------------------------------------------------------------------------------------------
# the escaping helpers, fed hostile text, compiled

HOSTILE = [
    "plain",
    "",
    "*/ _Static_assert(0, \"comment closed\"); /*",
    "*/*/ /* /*/ **/",
    "\"; _Static_assert(0, \"string closed\"); static const char *z = \"",
    "??/\n_Static_assert(0, \"trigraph spliced\");",
    "x??/", "???/", "??=define X", "??' ??( ??) ??! ??< ??> ??-", "a?b??c???d",
    "back\\slash\\", "trailing backslash \\",
    "line\nbreak", "cr\rlf\r\n", "tab\tvt\x0bff\x0c", "nul\x00byte", "del\x7f",
    "\\\n_Static_assert(0, \"line spliced\");",
    "octal\x012345 then digits",
    "caf\u00e9 \u2028 \U0001f600",
    "// */ /* \"\\\" ??/",
]


@needs_cc
def test_c_string_round_trips_hostile_text(tmp_path):
    """Each literal compiles under -std=c11 (trigraphs on) and holds exactly the text."""
    lines = ["#include <stdio.h>", "static const char *const s[] = {"]
    lines += [f"    {c_string(t)}," for t in HOSTILE]
    lines += ["};", "static const unsigned long n[] = {"]
    lines += [f"    sizeof({c_string(t)}) - 1," for t in HOSTILE]
    lines += ["};", "int main(void) {",
              "    for (unsigned i = 0; i < sizeof s / sizeof s[0]; i++) {",
              "        for (unsigned long j = 0; j < n[i]; j++) printf(\"%02x\", (unsigned char)s[i][j]);",
              "        printf(\"\\n\");", "    }", "    return 0;", "}"]
    src = tmp_path / "strings.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "strings"
    cc = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wtrigraphs",
                         str(src), "-o", str(exe)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:-1] == [t.encode("utf-8").hex() for t in HOSTILE]


@needs_cc
def test_c_comment_keeps_hostile_text_inside(tmp_path):
    """In /* */ and // comments, under -std=c11: no payload escapes (each would fail the
    build), -Wcomment and -Wtrigraphs stay quiet."""
    lines = []
    for t in HOSTILE:
        c = c_comment(t)
        assert "*/" not in c and "/*" not in c and "??" not in c, c
        assert not re.search(r"[\x00-\x1f\x7f-\U0010ffff]", c) and not c.endswith("\\"), c
        lines += [f"/* {c} */", f"// {c}", f"int x_{len(lines)}; // {c}"]
    lines.append("int last_line_compiled = 1;")
    src = tmp_path / "comments.c"
    src.write_text("\n".join(lines) + "\n")
    cc = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wtrigraphs",
                         "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    # and the text stays readable where it was harmless
    assert c_comment("layer conv1: conv, conv_igemm") == "layer conv1: conv, conv_igemm"


def test_opencl_comments_and_strings_hold_hostile_text():
    """The same helpers in OpenCL C, built by the OpenCL compiler (PoCL)."""
    cl = pytest.importorskip("pyopencl")
    try:
        ctx = cl.Context(dev_type=cl.device_type.ALL)
    except Exception as e:                      # noqa: BLE001 (no platform at all)
        pytest.skip(f"no OpenCL device: {e}")
    body = []
    for i, t in enumerate(HOSTILE):
        body += [f"// {c_comment(t)}", f"/* {c_comment(t)} */",
                 f"__constant char s{i}[] = {c_string(t)};"]
    body.append("__kernel void k_probe(__global int *y) { y[0] = s0[0]; }")
    cl.Program(ctx, "\n".join(body) + "\n").build()


@needs_cc
def test_emitted_c_is_safe_for_any_name(tmp_path):
    """Defence in depth: layers renamed after validation (as a buggy front end might) to
    hostile text still give a .c and .h that compile, with the text only in comments and
    literals."""
    src = write(tmp_path, """
        name: hostile
        input: [1, 2, 5, 5]
        layers:
          - {name: a, op: conv, out: 2, kernel: 1}
          - {name: b, op: sigmoid}
          - {name: c, op: conv, out: 3, kernel: 1, act: relu}
    """)
    net = passes.optimise(spec.load_network(src))
    evil = {"a": '*/ _Static_assert(0, "comment"); /* ??/',
            "b": '"; _Static_assert(0, "string"); static const char *z = "\n',
            "c": "\\\n_Static_assert(0, \"splice\"); ??= ??' \u2028"}
    for l in net.layers:
        l.name = evil[l.name]
        l.inputs = [evil.get(n, n) for n in l.inputs]
    net.outputs = [evil[n] for n in net.outputs]
    tgt = get_target("pocl-cpu")
    sch = build_schedule(net, choose(net, tgt, mode="fallback", quiet=True))
    out = tmp_path / "out"
    out.mkdir()
    emit(sch, tgt, out)
    c, h = (out / "hostile.c").read_text(), (out / "hostile.h").read_text()
    assert "\u2028" not in c + h and "??" not in c + h
    for f in ("hostile.c", "hostile.h"):
        proc = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-Wno-unused-function",
                               "-Wtrigraphs", "-fsyntax-only", "-DAOTRT_NS=hostile",
                               f"-I{out}", f"-I{out / 'runtime'}", str(out / f)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    # every kernel file is a C name; the kernels' first line names the layer, escaped
    for p in (out / "kernels").glob("*.cl"):
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.cl", p.name), p.name
        first = p.read_text().split("\n", 1)[0]
        assert first.startswith("// layer ") and "*/" not in first and "??" not in first


# ---------------------------------------------------------------------------------------------
# layers named like keywords, built-ins and the templates' macros, built and run on PoCL

KEYWORDS = """\
name: kw
input: [2, 3, 7, 9]
outputs: [main, N]
layers:
  - {name: N, op: conv, out: 4, kernel: 3, pad: 1}
  - {name: WG, op: relu}
  - {name: int, op: conv, out: 5, kernel: 1, act: tanh}
  - {name: kernel, op: batchnorm}
  - {name: exp, op: maxpool, kernel: 2}
  - {name: float, op: lrn, size: 3}
  - {name: restrict, op: conv, out: 6, kernel: 3, pad: same, inputs: [float]}
  - {name: __global, op: add, inputs: [restrict, restrict]}
  - {name: VEC, op: sigmoid}
  - {name: N_ELEMS, op: global_avgpool}
  - {name: a.b-c, op: dense, out: 7}
  - {name: main, op: softmax}
"""


def test_layers_named_like_keywords_and_macros_build_and_run(tmp_path):
    pytest.importorskip("pyopencl")
    from aotconv.compiler import compile_network
    from aotconv.harness import close
    from aotconv.reference import run_network
    from aotconv.runtime import load
    from aotconv.targets import find_device
    if find_device(get_target("pocl-cpu")) is None:
        pytest.skip("PoCL is not present")
    src = tmp_path / "kw.yaml"
    src.write_text(KEYWORDS)
    res = compile_network(str(src), target="pocl-cpu", outdir=tmp_path / "out",
                          tune_mode="fallback", measure=False, quiet=True)
    kernels = {p.stem for p in (res.outdir / "kernels").glob("*.cl")}
    assert {"N", "int", "kernel", "exp", "float", "restrict", "__global", "main",
            "a_b_c"} <= kernels
    assert re.search(r"void k_N\(", (res.outdir / "kernels" / "N.cl").read_text())
    h = (res.outdir / "kw.h").read_text()
    assert "#define AOTCONV_KW_PARAM_A_B_C_WEIGHT_OFFSET" in h

    net = spec.load_network(str(src))
    flat = params_mod.random_params(net, seed=1)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    refs = run_network(net, x, params_mod.split(net, flat))
    with load(res.outdir) as lib:
        lib.set_params(flat)
        outs = lib(x)
        assert [n.split("/")[1] for n in lib.kernel_names] == [
            l.kernel for l in res.schedule.run_launches]
    assert len(outs) == len(refs) == 2
    for o, r in zip(outs, refs):
        ok, err = close(o, r)
        assert ok, err


def test_messages_show_huge_integers_by_their_size():
    from aotconv.names import shown
    from aotconv.spec import network_from_dict
    assert shown(10 ** 5000) == "<an integer of 16610 bits>"
    assert "16610 bits" in shown([1, {"k": 10 ** 5000}])
    with pytest.raises(SpecError) as ei:
        network_from_dict({"name": 10 ** 5000, "input": [1, 1, 1, 1], "layers": []})
    assert "\n" not in str(ei.value) and "16610 bits" in str(ei.value)

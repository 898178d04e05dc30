"""Device-free tests of aotconv.spec: shipped networks, shape inference, located errors."""
import importlib.util
import textwrap
from pathlib import Path

import pytest

from aotconv.errors import SpecError
from aotconv.spec import load_network, network_from_dict, shipped_networks

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path, text, name="net.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def located_error(path, line, layer, key):
    """Load `path`, expecting a SpecError at file:line naming `layer` and `key`."""
    with pytest.raises(SpecError) as ei:
        load_network(path)
    e = ei.value
    msg = str(e)
    assert f"{path}:{line}:" in msg, msg
    assert (e.file, e.line, e.layer, e.key) == (str(path), line, layer, key), msg
    if layer is not None:
        assert f"layer '{layer}'" in msg
    if key is not None:
        assert f"key '{key}'" in msg
    return msg


# ---------------------------------------------------------------------------------------------
# shipped networks

OUTPUT_SHAPES = {
    "lenet5": (100, 10, 1, 1),
    "alexnet": (128, 1000, 1, 1),
    "vgg16": (1, 1000, 1, 1),
    "nin": (1, 1000, 1, 1),
    "inception-v1": (1, 1000, 1, 1),
}


def test_shipped_list():
    assert set(OUTPUT_SHAPES) <= set(shipped_networks())


@pytest.mark.parametrize("name", sorted(OUTPUT_SHAPES))
def test_shipped_output_shape(name):
    net = load_network(name)
    assert [net.shape_of(o) for o in net.outputs] == [OUTPUT_SHAPES[name]]
    assert net.name.isidentifier()
    # every layer located and ordered so that each reads only earlier layers
    seen = {"input"}
    for l in net.layers:
        assert l.line and set(l.inputs) <= seen
        seen.add(l.name)


@pytest.mark.parametrize("name, count", [("alexnet", 60965224), ("vgg16", 138357544),
                                         ("inception-v1", 6998552), ("lenet5", 51902)])
def test_shipped_param_counts_match_the_published_models(name, count):
    assert load_network(name).param_count() == count


def _bench():
    from aotconv.bench import sets as bench_layers
    return bench_layers


def _convs(net, per_group=True):
    """(N, C, H, W, K, R, S, stride, pad) of each conv: the benchmark tables' form.

    The BEAST tables give a grouped conv's C per group; Boda's AlexNet has no groups.
    """
    out = []
    for l in net.layers:
        if l.op == "conv":
            n, c, h, w = l.in_shape
            a = l.attrs
            assert a["pad"][0] == a["pad"][2] and a["stride"][0] == a["stride"][1]
            out.append((n, c // a["groups"] if per_group else c, h, w, a["out"], *a["kernel"], a["stride"][0],
                        a["pad"][0]))
    return out


def test_alexnet_and_vgg16_convs_are_the_benchmark_layers():
    b = _bench()
    assert _convs(load_network("alexnet")) == [t[1:] for t in b.ALEXNET_N128]
    assert _convs(load_network("vgg16")) == [t[1:] for t in b.VGG16_N1]


def test_boda_convs_come_from_alexnet_nin_inception():
    ours = set()
    for name in ("alexnet", "nin", "inception-v1"):
        ours |= {t[1:] for t in _convs(load_network(name, batch=5), per_group=False)}
    boda = {t[2:] for t in _bench().BODA43_N5}
    # Boda writes AlexNet's fc6/fc7 as convs (6x6 on 6x6, 1x1 on 1x1); ours are dense layers
    fc_as_conv = {(256, 6, 6, 4096, 6, 6, 1, 0), (4096, 1, 1, 4096, 1, 1, 1, 0)}
    assert boda - ours == fc_as_conv
    assert (96, 54, 54, 96, 1, 1, 1, 0) in {t[1:] for t in _convs(load_network("nin"))}


def test_nin_pools_round_up_like_caffe():
    net = load_network("nin")
    assert [l.out_shape[2] for l in net.layers if l.op == "maxpool"] == [27, 13, 6]


def test_inception_yaml_is_what_the_generator_writes():
    path = ROOT / "tools" / "gen_inception.py"
    mod_spec = importlib.util.spec_from_file_location("gen_inception", path)
    gen = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(gen)
    assert (ROOT / "aotconv" / "nets" / "inception-v1.yaml").read_text() == gen.render()
    net = load_network("inception-v1")
    concats = [l for l in net.layers if l.op == "concat"]
    assert len(concats) == 9 and all(len(l.inputs) == 4 for l in concats)
    assert net.shape_of("inception_5b_output") == (1, 1024, 7, 7)


def test_lenet5_lines_and_batch_override():
    net = load_network("lenet5", batch=3)
    assert net.input_shape == (3, 1, 32, 32)
    assert net.shape_of("prob") == (3, 10, 1, 1)
    assert net.layer("c1").line == 5 and net.layer("prob").line == 11
    assert net.layer("f5").in_shapes == [(3, 16, 5, 5)]
    assert net.layer("f5").params == [("weight", (120, 400)), ("bias", (120,))]


def test_unknown_source_lists_shipped_networks():
    with pytest.raises(SpecError, match="lenet5"):
        load_network("no-such-net")


# ---------------------------------------------------------------------------------------------
# semantics

def test_pad_same_stride2_odd_input_pads_bottom_right(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 2, 9, 7]
        layers:
          - {name: c, op: conv, out: 3, kernel: 4, stride: 2, pad: same}
    """)
    l = load_network(p).layer("c")
    # ceil(9/2)=5, ceil(7/2)=4; total pads 3 and 3 split with the odd one at bottom/right
    assert l.out_shape == (1, 3, 5, 4)
    assert l.attrs["pad"] == (1, 1, 2, 2)


def test_forward_reference_is_sorted_and_params_follow_file_order(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 2, 6, 6]
        layers:
          - {name: late, op: conv, out: 4, kernel: 1, inputs: [early]}
          - {name: early, op: conv, out: 3, kernel: 3, pad: 1, inputs: [input]}
          - {name: unused, op: relu, inputs: [early]}
        outputs: [late]
    """)
    net = load_network(p)
    assert [l.name for l in net.layers] == ["early", "late", "unused"]
    assert [(l, t) for l, t, _, _ in net.param_layout()] == [
        ("late", "weight"), ("late", "bias"), ("early", "weight"), ("early", "bias")]
    assert net.outputs == ["late"]


def test_default_inputs_and_outputs(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [2, 4, 5, 5]
        layers:
          - name: a
            op: relu
          - name: b
            op: add
            inputs: [input, a]
            act: relu
          - {name: c, op: lrn, size: 3, alpha: 1e-4}
    """)
    net = load_network(p)
    assert net.layer("a").inputs == ["input"] and net.layer("c").inputs == ["b"]
    assert net.outputs == ["c"]
    assert net.layer("c").attrs["alpha"] == pytest.approx(1e-4)    # YAML 1.1 reads 1e-4 as str


def test_network_from_dict():
    net = network_from_dict({"name": "d", "input": [1, 1, 4, 4],
                             "layers": [{"name": "p", "op": "avgpool", "kernel": 2}]}, batch=2)
    assert net.shape_of("p") == (2, 1, 2, 2)
    with pytest.raises(SpecError) as ei:
        network_from_dict({"name": "d", "input": [1, 1, 4, 4],
                           "layers": [{"name": "p", "op": "relu"}, {"name": "q", "op": "x"}]})
    assert (ei.value.layer, ei.value.key, ei.value.line) == ("q", "op", 2)


def test_yaml_tags_are_never_evaluated(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 1, 4, 4]
        layers:
          - {name: a, op: lrn, size: !!python/object/apply:os.getpid []}
    """)
    with pytest.raises(SpecError, match="expected an integer"):
        load_network(p)
    p = write(tmp_path, """
        name: t
        input: [1, 1, 4, 4]
        layers:
          - {name: a, op: lrn, size: !!python/name:os.getpid}
    """)
    located_error(p, 4, None, None)


# ---------------------------------------------------------------------------------------------
# errors: each names file, line, layer and key

GOOD_HEAD = """
    name: t
    input: [1, 3, 8, 8]
    layers:
"""


def test_malformed_yaml(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 3, 8, 8]
        layers:
          - name: c1
            op: conv
           out: 4
    """)
    msg = located_error(p, 6, None, None)
    assert "invalid YAML" in msg


def test_a_character_yaml_refuses_is_an_error_at_its_line(tmp_path):
    p = write(tmp_path, """
        name: t
        input: [1, 3, 8, 8]
        layers:
          - {name: c1, op: relu}
    """ + "\x00\n")
    msg = located_error(p, 5, None, None)
    assert "invalid YAML: character 0x0" in msg


def test_unknown_top_level_key(tmp_path):
    p = write(tmp_path, """
        name: t
        version: 2
        input: [1, 3, 8, 8]
        layers:
          - {name: a, op: relu}
    """)
    msg = located_error(p, 2, None, "version")
    assert "name, input, layers, outputs" in msg


@pytest.mark.parametrize("body, line, layer, key, words", [
    # unknown layer key: lists the valid ones
    ("""
      - name: c1
        op: conv
        out: 4
        kernal: 3
    """, 7, "c1", "kernal", ["valid keys are", "kernel", "stride"]),
    # duplicate key inside one layer mapping (safe_load would silently keep the last)
    ("""
      - name: c1
        op: conv
        out: 4
        kernel: 3
        out: 8
    """, 8, "c1", "out", ["duplicate key", "line 6"]),
    # duplicate layer name
    ("""
      - {name: c1, op: relu}
      - {name: c2, op: relu}
      - {name: c1, op: relu}
    """, 6, "c1", "name", ["duplicate layer name", "line 4"]),
    # names that collide once made C identifiers
    ("""
      - {name: c-1, op: relu}
      - {name: c_1, op: relu}
    """, 5, "c_1", "name", ["C name 'c_1'"]),
    # wrong types: a string where an int is needed; bool is not an int
    ("""
      - name: c1
        op: conv
        out: 4
        kernel: "3"
    """, 7, "c1", "kernel", ["expected an integer or a list [h, w]", "'3'"]),
    ("""
      - name: c1
        op: conv
        out: 4
        kernel: 3
        stride: true
    """, 8, "c1", "stride", ["expected an integer", "True"]),
    ("""
      - {name: c1, op: conv, out: 4, kernel: [3, 3.5]}
    """, 4, "c1", "kernel", ["list of two ints"]),
    # a required key missing: reported at the layer
    ("""
      - {name: a, op: relu}
      - name: c1
        op: conv
        kernel: 3
    """, 5, "c1", "out", ["needs key 'out'"]),
    # unknown op
    ("""
      - {name: c1, op: convolution, out: 3}
    """, 4, "c1", "op", ["known ops are", "conv"]),
    # a window larger than the padded input (8 + 2*0 < 9)
    ("""
      - name: c1
        op: conv
        out: 4
        kernel: 9
    """, 7, "c1", "kernel", ["larger than the padded input"]),
    ("""
      - {name: p1, op: maxpool, kernel: 9}
    """, 4, "p1", "kernel", ["larger than the padded input"]),
    # channels (3) not divisible by groups
    ("""
      - name: c1
        op: conv
        out: 4
        kernel: 3
        groups: 2
    """, 8, "c1", "groups", ["not divisible by groups 2"]),
    # unknown input name
    ("""
      - {name: a, op: relu}
      - name: b
        op: relu
        inputs: [aa]
    """, 7, "b", "inputs", ["unknown input 'aa'"]),
    # a cycle, reported at the first of its layers in the file
    ("""
      - {name: a, op: relu}
      - name: b
        op: add
        inputs: [a, d]
      - {name: c, op: relu}
      - {name: d, op: relu, inputs: [b]}
    """, 7, "b", "inputs", ["cycle", "b -> d -> b"]),
    ("""
      - {name: a, op: relu, inputs: [a]}
    """, 4, "a", "inputs", ["cycle", "a -> a"]),
    # add of different shapes
    ("""
      - {name: a, op: conv, out: 3, kernel: 3}
      - name: b
        op: add
        inputs: [input, a]
    """, 7, "b", "inputs", ["equal shapes", "[1, 3, 6, 6]"]),
    # arity
    ("""
      - {name: a, op: concat}
    """, 4, "a", "inputs", ["two or more inputs"]),
    ("""
      - {name: a, op: relu, inputs: [input, input]}
    """, 4, "a", "inputs", ["exactly 1 input"]),
    # bad values caught by normalisation
    ("""
      - {name: a, op: conv, out: 2, kernel: 1, act: swish}
    """, 4, "a", "act", ["relu"]),
])
def test_layer_errors_are_located(tmp_path, body, line, layer, key, words):
    p = write(tmp_path, GOOD_HEAD + textwrap.indent(textwrap.dedent(body).lstrip("\n"), "    "))
    msg = located_error(p, line, layer, key)
    for w in words:
        assert w in msg


@pytest.mark.parametrize("head, line, key", [
    ("name: 9t\ninput: [1, 3, 8, 8]\n", 1, "name"),
    ("name: t\ninput: [1, 3, 8]\n", 2, "input"),
    ("name: t\ninput: [1, 0, 8, 8]\n", 2, "input"),
    ("name: t\ninput: [1, 3, 8, 8]\noutputs: [zz]\n", 3, "outputs"),
])
def test_top_level_errors_are_located(tmp_path, head, line, key):
    p = write(tmp_path, head + "layers:\n  - {name: a, op: relu}\n")
    located_error(p, line, None, key)


def test_missing_layers_key(tmp_path):
    p = write(tmp_path, "name: t\ninput: [1, 3, 8, 8]\n")
    with pytest.raises(SpecError, match="missing required top-level key 'layers'") as ei:
        load_network(p)
    assert ei.value.file == str(p)


def test_bad_batch_override():
    with pytest.raises(SpecError, match="batch"):
        load_network("lenet5", batch=0)


# ---------------------------------------------------------------------------------------------
# numbers the kernels could not take, and nesting that would exhaust the recursion limit

@pytest.mark.parametrize("layer, key, words", [
    # NaN and infinities, as YAML writes them, in every float attribute
    ("{name: a, op: batchnorm, eps: .nan}", "eps", ["finite", "nan"]),
    ("{name: a, op: batchnorm, eps: .inf}", "eps", ["finite", "inf"]),
    ("{name: a, op: lrn, size: 3, alpha: .NaN}", "alpha", ["finite"]),
    ("{name: a, op: lrn, size: 3, beta: -.inf}", "beta", ["finite", "-inf"]),
    ("{name: a, op: lrn, size: 3, k: .Inf}", "k", ["finite"]),
    ("{name: a, op: leaky_relu, alpha: .nan}", "alpha", ["finite"]),
    ("{name: a, op: conv, out: 2, kernel: 1, act: leaky_relu, alpha: -.inf}", "alpha", ["finite"]),
    ("{name: a, op: dropout, p: .nan}", "p", ["finite"]),
    ("{name: a, op: leaky_relu, alpha: 1e39}", "alpha", ["float32"]),
    # ranges
    ("{name: a, op: dropout, p: 5}", "p", ["[0, 1)", "5.0"]),
    ("{name: a, op: dropout, p: 1}", "p", ["[0, 1)"]),
    ("{name: a, op: dropout, p: -0.1}", "p", ["[0, 1)"]),
    ("{name: a, op: batchnorm, eps: 0}", "eps", ["> 0"]),
    ("{name: a, op: batchnorm, eps: 1e-50}", "eps", ["float32"]),
    # absurd integers: a float where an int belongs, beyond 32 bits, negative, zero
    ("{name: a, op: dense, out: 1e9}", "out", ["expected an integer"]),
    ("{name: a, op: conv, out: 99999999999999999999, kernel: 1}", "out", ["out of range"]),
    ("{name: a, op: conv, out: 2, kernel: [1, 4294967297]}", "kernel", ["out of range"]),
    ("{name: a, op: conv, out: -3, kernel: 1}", "out", [">= 1"]),
    ("{name: a, op: conv, out: 2, kernel: 0}", "kernel", [">= 1"]),
    ("{name: a, op: conv, out: 2, kernel: 1, stride: -1}", "stride", [">= 1"]),
    ("{name: a, op: conv, out: 2, kernel: 1, pad: -2}", "pad", [">= 0"]),
    ("{name: a, op: lrn, size: 0}", "size", [">= 1"]),
    ("{name: a, op: maxpool, kernel: 2, stride: 0}", "stride", [">= 1"]),
    # sizes that fit 32 bits but make a tensor no 32-bit index can address
    ("{name: a, op: conv, out: 1000000000, kernel: 1}", "out", ["2^31 - 1", "1x1000000000x5x5"]),
    ("{name: a, op: conv, out: 2, kernel: 1, pad: 100000000}", "pad", ["2^31 - 1"]),
    ("{name: a, op: dense, out: 2000000000}", "out", ["weight", "2^31 - 1"]),
])
def test_bad_numbers_are_located(tmp_path, layer, key, words):
    p = write(tmp_path, f"name: t\ninput: [1, 2, 5, 5]\nlayers:\n  - {layer}\n")
    msg = located_error(p, 4, "a", key)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_huge_input_and_batch(tmp_path):
    p = write(tmp_path, "name: t\ninput: [1, 3, 100000, 100000]\nlayers:\n  - {name: a, op: relu}\n")
    msg = located_error(p, 2, None, "input")
    assert "2^31 - 1" in msg
    p = write(tmp_path, "name: t\ninput: [1, 3, 8, 8]\nlayers:\n  - {name: a, op: relu}\n")
    with pytest.raises(SpecError, match="2\\^31 - 1") as ei:
        load_network(p, batch=10**9)
    assert ei.value.key == "batch"


@pytest.mark.parametrize("open_, close", [("[", "]"), ("{a: ", "}")])
def test_deep_flow_nesting_is_an_error_at_its_line(tmp_path, open_, close):
    deep = open_ * 20000 + close * 20000
    p = write(tmp_path, f"name: t\ninput: [1, 3, 8, 8]\nlayers:\n  - {{name: a, op: relu}}\n"
                        f"  - {{name: b, op: relu, x: {deep}}}\n")
    msg = located_error(p, 5, None, None)
    assert "nested more than" in msg


def test_deep_block_nesting_is_an_error_at_its_line(tmp_path):
    body = "".join("  " * i + "- \n" for i in range(1, 1500))   # past the recursion limit
    p = write(tmp_path, f"name: t\ninput: [1, 3, 8, 8]\nlayers:\n{body}")
    with pytest.raises(SpecError, match="nested more than") as ei:
        load_network(p)
    assert ei.value.line is not None and 30 <= ei.value.line <= 40


def test_deep_nesting_through_aliases_is_an_error(tmp_path):
    # each anchor is shallow in the text; followed, the aliases nest 3000 levels
    chain = "".join(f"  - &a{i} [*a{i - 1}]\n" for i in range(1, 3000))
    p = write(tmp_path, f"name: t\ninput: [1, 3, 8, 8]\nlayers:\n  - &a0 [1]\n{chain}"
                        f"  - {{name: a, op: conv, out: 2, kernel: *a2999}}\n")
    with pytest.raises(SpecError, match="nested more than .* aliases") as ei:
        load_network(p)
    assert ei.value.line == 4 + 32
    p = write(tmp_path, "name: t\ninput: [1, 3, 8, 8]\nlayers:\n"
                        "  - {name: a, op: conv, out: 2, kernel: &k [1, *k]}\n")
    located_error(p, 4, None, None)

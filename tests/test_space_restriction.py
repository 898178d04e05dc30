"""`aotconv tune --where VARIANT:KNOB=V/V,...`: parsing, restricting a layer's space, and the
errors it reports, device-free (nothing is measured).

conv_igemm's unpruned space is about a million points whatever the layer (its knobs depend on
the target only), 5-10 s to enumerate on a busy two-core machine; so the conv layer's space
here is that of every conv variant but with conv_igemm's tile knobs (MBLK, NBLK, KBLK, KSPLIT)
cut to a few values: a few thousand points, still pruned by conv_igemm's own constraints and the
target's limits, and every value of VW and LAYOUT kept. It is enumerated once per module.
"""
import pytest

from aotconv import ops
from aotconv.bench import conv_layer
from aotconv.errors import AotconvError
from aotconv.graph import Layer
from aotconv.space import LayerSpace, layer_space, parse_where, restrict
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, active
from aotconv.variants.base import Knob

POCL = TARGETS["pocl-cpu"]
WHERE_TEXT = "conv_igemm:VW=4,LAYOUT=NCHW/CHWN"


def pool_layer():
    return Layer("p", "maxpool", ops.normalise("maxpool", {"kernel": 2}), ["input"],
                 in_shapes=[(1, 1, 4, 4)], out_shape=(1, 1, 2, 2))


IGEMM = BY_NAME["conv_igemm"]
NARROW = {"MBLK": (16, 32), "NBLK": (64, 32), "KBLK": (16, 8), "KSPLIT": (1, 2)}


class NarrowIgemm(type(IGEMM)):
    """conv_igemm (same name, constraints, launches) with fewer tile sizes to enumerate."""

    def knobs(self, layer, target):
        return [Knob(k.name, NARROW.get(k.name, k.values), k.doc)
                for k in super().knobs(layer, target)]


@pytest.fixture(scope="module")
def conv_space():
    """The pruned space of a small 3x3 conv layer on pocl-cpu: every variant that implements
    it, conv_igemm narrowed as above."""
    layer = conv_layer(("t", 1, 16, 8, 8, 16, 3, 3, 1, 1))[0]
    variants = [NarrowIgemm() if v is IGEMM else v for v in active() if v.supports(layer) is None]
    sp = layer_space(layer, POCL, variants=variants)
    igemm = next(p for p in sp.parts if p.variant.name == "conv_igemm")
    knobs = {k.name: k.values for k in igemm.knobs}
    assert knobs["VW"] == (4, 2, 1) and set(knobs["LAYOUT"]) == {"NCHW", "CHWN", "NHWC"}
    assert 0 < len(igemm.points) < igemm.total                # pruned, not empty
    return sp


# -- parse_where --------------------------------------------------------------------------------

def test_parse_where_knobs_and_values():
    assert parse_where([WHERE_TEXT]) == {
        "conv_igemm": {"VW": ("4",), "LAYOUT": ("NCHW", "CHWN")}}
    # spaces around the parts are ignored
    assert parse_where([" conv_igemm : VW = 4 , LAYOUT = NCHW / CHWN "]) == {
        "conv_igemm": {"VW": ("4",), "LAYOUT": ("NCHW", "CHWN")}}


def test_parse_where_merges_the_same_variant_and_keeps_others_apart():
    assert parse_where(["conv_igemm:VW=4", "conv_igemm:LAYOUT=NCHW/CHWN"]) == {
        "conv_igemm": {"VW": ("4",), "LAYOUT": ("NCHW", "CHWN")}}
    assert parse_where(["conv_igemm:VW=4", "conv_tiled:VW=2/4"]) == {
        "conv_igemm": {"VW": ("4",)}, "conv_tiled": {"VW": ("2", "4")}}


def test_parse_where_bare_variant_and_nothing():
    assert parse_where(["conv_igemm"]) == {"conv_igemm": {}}
    assert parse_where(["conv_igemm:"]) == {"conv_igemm": {}}
    assert parse_where(["conv_igemm", "conv_igemm:VW=4"]) == {"conv_igemm": {"VW": ("4",)}}
    assert parse_where(None) == {}
    assert parse_where([]) == {}


def test_parse_where_unknown_variant():
    with pytest.raises(AotconvError) as e:
        parse_where(["nosuchvariant:VW=4"])
    msg = str(e.value)
    assert "nosuchvariant" in msg
    assert "conv_igemm" in msg and "conv_tiled" in msg      # the variants are listed
    assert all(name in msg for name in BY_NAME)


@pytest.mark.parametrize("text", ["conv_igemm:VW", "conv_igemm:VW=", "conv_igemm:=4",
                                  "conv_igemm:VW=4,LAYOUT", "conv_igemm:VW=/"])
def test_parse_where_malformed_part(text):
    with pytest.raises(AotconvError) as e:
        parse_where([text])
    assert "KNOB=VALUE" in str(e.value)
    assert text in str(e.value)


# -- restrict -------------------------------------------------------------------------------------

def test_restrict_keeps_only_the_named_variant_and_values(conv_space):
    names = [p.variant.name for p in conv_space.parts]
    assert "conv_igemm" in names and len(names) > 1          # something to drop
    before = list(conv_space.candidates)
    igemm = next(p for p in conv_space.parts if p.variant.name == "conv_igemm")
    expected = [c for c in igemm.points if c["VW"] == 4 and c["LAYOUT"] in ("NCHW", "CHWN")]
    assert expected and len(expected) < len(igemm.points)    # a real restriction

    r = restrict(conv_space, parse_where([WHERE_TEXT]))
    assert isinstance(r, LayerSpace)
    assert [p.variant.name for p in r.parts] == ["conv_igemm"]
    cands = r.candidates
    assert cands, "the restricted space is empty"
    assert all(c.variant == "conv_igemm" for c in cands)
    assert all(c.cfg["VW"] == 4 for c in cands)
    assert all(c.cfg["LAYOUT"] in ("NCHW", "CHWN") for c in cands)
    assert len(cands) == len(expected)
    assert [c.cfg for c in cands] == expected                # same points, same order
    assert r.layer is conv_space.layer and r.target is conv_space.target
    # the original space is left as it was
    assert conv_space.candidates == before


def test_restrict_bare_variant_keeps_all_its_points(conv_space):
    igemm = next(p for p in conv_space.parts if p.variant.name == "conv_igemm")
    r = restrict(conv_space, parse_where(["conv_igemm"]))
    assert [p.variant.name for p in r.parts] == ["conv_igemm"]
    assert [c.cfg for c in r.candidates] == list(igemm.points)


def test_restrict_two_variants(conv_space):
    r = restrict(conv_space, parse_where(["conv_igemm:VW=4,LAYOUT=NCHW/CHWN",
                                          "conv_tiled:VW=2"]))
    assert sorted(p.variant.name for p in r.parts) == ["conv_igemm", "conv_tiled"]
    tiled = next(p for p in conv_space.parts if p.variant.name == "conv_tiled")
    got = [c.cfg for c in r.candidates if c.variant == "conv_tiled"]
    assert got and got == [c for c in tiled.points if c["VW"] == 2]


def test_restrict_unknown_knob(conv_space):
    with pytest.raises(AotconvError) as e:
        restrict(conv_space, parse_where(["conv_igemm:NOSUCHKNOB=1"]))
    msg = str(e.value)
    assert "NOSUCHKNOB" in msg and "conv_igemm" in msg
    assert "VW" in msg and "LAYOUT" in msg                   # its knobs are listed


def test_restrict_to_nothing_is_an_error(conv_space):
    """A value the knob lacks (or that pruning removes) leaves no point: said, not searched."""
    with pytest.raises(AotconvError, match=r"no valid point of conv_igemm:VW=3"):
        restrict(conv_space, parse_where(["conv_igemm:VW=3"]))


def test_parse_where_same_knob_twice_adds_values():
    assert parse_where(["conv_igemm:VW=4", "conv_igemm:VW=2/4"]) == {
        "conv_igemm": {"VW": ("4", "2")}}


def test_restrict_layer_no_named_variant_implements():
    sp = layer_space(pool_layer(), POCL)
    assert sp.candidates                                     # pool_direct's points
    assert all(c.variant != "conv_igemm" for c in sp.candidates)
    r = restrict(sp, parse_where([WHERE_TEXT]))
    assert r.candidates == sp.candidates
    assert [p.variant.name for p in r.parts] == [p.variant.name for p in sp.parts]
    # a knob conv_igemm lacks is not judged on a layer it does not implement
    assert restrict(sp, parse_where(["conv_igemm:NOSUCHKNOB=1"])).candidates == sp.candidates
    # nothing asked: nothing changes
    assert restrict(sp, {}).candidates == sp.candidates
    assert restrict(sp, None).candidates == sp.candidates


def test_restrict_pool_layer_by_its_own_variant():
    sp = layer_space(pool_layer(), POCL)
    r = restrict(sp, parse_where(["pool_direct:QB=1"]))
    # pool_direct's points with QB=1; the layer's other variants (pool_nhwc) left out
    expected = [c for c in sp.candidates if c.variant == "pool_direct" and c.cfg["QB"] == 1]
    assert expected and len(expected) < len(sp.candidates)
    assert r.candidates == expected


# -- tune_network applies it to every layer (tune_layer stubbed: nothing measured) ----------------

def test_tune_network_restricts_every_layer_space(monkeypatch):
    from aotconv.spec import network_from_dict
    from aotconv.tune import search

    net = network_from_dict({"name": "m", "input": [1, 4, 8, 8], "layers": [
        {"name": "r", "op": "relu"}, {"name": "p", "op": "maxpool", "kernel": 2}]})
    seen = {}

    class Stub:
        trace = []

    def fake_tune_layer(sp, target, measurer, store, device, strategy, grant, deadline, seed,
                        progress, layers, recheck):
        seen[layers[0].name] = sp
        return Stub()

    monkeypatch.setattr(search, "tune_layer", fake_tune_layer)
    groups = search.unique_layers(list(net.layers))
    search.tune_network(groups, POCL, None, None, None, budget=4,
                        where=parse_where(["pool_direct:QB=2"]))
    assert set(seen) == {"r", "p"}
    full_r = layer_space(net.layer("r"), POCL)
    full_p = layer_space(net.layer("p"), POCL)
    assert seen["r"].candidates == full_r.candidates        # eltwise: untouched
    want = [c for c in full_p.candidates if c.variant == "pool_direct" and c.cfg["QB"] == 2]
    assert want and len(want) < len(full_p.candidates)
    assert seen["p"].candidates == want


# -- the command line ------------------------------------------------------------------------------

def test_cli_tune_unknown_variant(capsys, monkeypatch, tmp_path):
    """cmd_tune checks the device, then choose() parses --where before any space is enumerated
    or anything measured: the error comes at once, as exit code 2."""
    from aotconv.cli import main

    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))

    def no_tuning(*a, **k):
        raise AssertionError("tune_network ran despite the bad --where")

    monkeypatch.setattr("aotconv.tune.search.tune_network", no_tuning)
    rc = main(["tune", "lenet5", "--target", "pocl-cpu", "--where", "nosuchvariant:X=1"])
    err = capsys.readouterr().err
    if "no matching OpenCL device" in err:
        pytest.skip("PoCL is not installed")
    assert rc == 2
    assert "nosuchvariant" in err and "error" in err
    assert "conv_igemm" in err                               # the variants are listed


def test_cli_tune_malformed_where(capsys, monkeypatch, tmp_path):
    from aotconv.cli import main

    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))

    def no_tuning(*a, **k):
        raise AssertionError("tune_network ran despite the bad --where")

    monkeypatch.setattr("aotconv.tune.search.tune_network", no_tuning)
    rc = main(["tune", "lenet5", "--target", "pocl-cpu", "--where", "conv_igemm:VW"])
    err = capsys.readouterr().err
    if "no matching OpenCL device" in err:
        pytest.skip("PoCL is not installed")
    assert rc == 2
    assert "KNOB=VALUE" in err


def test_cli_tune_help_lists_where(capsys):
    from aotconv.cli import main
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert "--where" in capsys.readouterr().out


def test_choose_rejects_bad_where_before_measuring(monkeypatch):
    """choose() itself, with a measurer that must never be used."""
    from aotconv.choose import choose
    from aotconv.spec import network_from_dict

    class Boom:
        def __getattr__(self, name):
            raise AssertionError(f"the measurer was used ({name})")

    net = network_from_dict({"name": "m", "input": [1, 4, 8, 8],
                             "layers": [{"name": "r", "op": "relu"}]})
    with pytest.raises(AotconvError, match="nosuchvariant"):
        choose(net, "pocl-cpu", where=["nosuchvariant:X=1"], measurer=Boom(), quiet=True)

"""add_nhwc, eltwise_nhwc, scale_nhwc: the elementwise layers in NHWC or CHWN.

Device-free: each declares the layout of its LAYOUT knob for every input and the output, is a
tuned alternative and never the fallback, its own fallback valid on every target; add_nhwc
and eltwise_nhwc render their NCHW sibling's kernel with one line naming the layout; the NCHW
siblings are untouched (their records stay valid); scale_nhwc indexes the factor by the
element's plane in its layout. PoCL: each in both layouts against the float64 reference, every
input given in the layout declared, with an add of three inputs, scale's per-plane factor and
mul.
"""
import numpy as np
import pytest

from aotconv import harness, ops, reference
from aotconv.choose import fallback_choice
from aotconv.graph import Layer
from aotconv.layouts import layout_capable
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, for_layer
from aotconv.variants.base import Config

POCL = TARGETS["pocl-cpu"]


def layer(op, in_shapes, **raw):
    a = ops.normalise(op, raw)
    out, params = ops.infer(op, a, [tuple(s) for s in in_shapes])
    return Layer("e", op, a, ["input"] * len(in_shapes), in_shapes=[tuple(s) for s in in_shapes],
                 out_shape=out, params=params)


def at(variant, l, layout, **knobs):
    """The fallback point of `variant` for `l` with LAYOUT (and `knobs`) set."""
    v = BY_NAME[variant]
    return Config(tuple((k.name, layout if k.name == "LAYOUT" else knobs.get(k.name, k.values[0]))
                        for k in v.knobs(l, POCL)))


CASES = {
    "add_relu": ("add_nhwc", "add_direct", layer("add", [(2, 5, 3, 4)] * 2, act="relu")),
    "add3": ("add_nhwc", "add_direct", layer("add", [(3, 4, 5, 2)] * 3)),
    "sigmoid": ("eltwise_nhwc", "eltwise", layer("sigmoid", [(2, 5, 3, 4)])),
    "scale": ("scale_nhwc", "scale_direct", layer("scale", [(3, 5, 3, 4), (3, 5, 1, 1)])),
    "mul": ("scale_nhwc", "scale_direct", layer("mul", [(2, 3, 5, 3)] * 2)),
}


@pytest.mark.parametrize("cid", sorted(CASES))
def test_they_declare_one_layout_and_are_never_the_fallback(cid):
    variant, sibling, l = CASES[cid]
    v = BY_NAME[variant]
    assert [x.name for x in for_layer(l)] == [sibling, variant]
    assert fallback_choice(l, POCL).variant == sibling
    assert v.knobs(l, POCL)[0].values == ("NHWC", "CHWN")
    assert v.layouts_of(l, at(variant, l, "CHWN")) == ("CHWN", "CHWN")
    assert layout_capable(l)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fallbacks_valid_on_every_target(target):
    from aotconv.space import point_ok
    t = TARGETS[target]
    for cid, (variant, _, l) in CASES.items():
        v = BY_NAME[variant]
        fb = v.fallback(l, t)
        assert fb["LAYOUT"] == "NHWC" and point_ok(l, v, fb, t), (cid, fb)
    big = layer("add", [(16, 256, 56, 56)] * 2)
    assert point_ok(big, BY_NAME["add_nhwc"], BY_NAME["add_nhwc"].fallback(big, t), t)


@pytest.mark.parametrize("cid", ["add_relu", "sigmoid", "mul"])
def test_the_kernel_is_the_siblings_with_the_layout_named(cid):
    variant, sibling, l = CASES[cid]
    mine = BY_NAME[variant].render(l, at(variant, l, "NHWC", VEC=4), "k")
    theirs = BY_NAME[sibling].render(l, Config.of(WG=64, VEC=4), "k")
    named = [x for x in mine.splitlines() if "NHWC" in x]
    assert named and all(x.startswith("//") or x.startswith("#define LAYOUT_") for x in named)
    code = lambda s: [x for x in s.splitlines() if x.strip() and not x.lstrip().startswith("//")
                      and not x.startswith("#define LAYOUT_")]
    if cid == "mul":                            # scale_nhwc: its own template, the same code
        assert [x.split("//")[0].rstrip() for x in code(mine)] == \
            [x.split("//")[0].rstrip() for x in code(theirs)]
    else:
        assert code(mine) == code(theirs)


def test_scale_indexes_the_factor_by_the_plane_in_its_layout():
    _, _, l = CASES["scale"]
    v = BY_NAME["scale_nhwc"]
    nhwc = v.render(l, at("scale_nhwc", l, "NHWC"), "k")
    assert "#define VA 5" in nhwc and "s[(i / (HW * VA)) * VA + i % VA]" in nhwc
    assert "#define VA 3" in v.render(l, at("scale_nhwc", l, "CHWN"), "k")      # the images
    assert "s[i / HW]" in BY_NAME["scale_direct"].render(l, Config.of(WG=64, VEC=1), "k")


def test_the_nchw_siblings_are_untouched():
    """Their template hash is what it was: their records stay valid as they are."""
    from aotconv.variants.add import AddDirect
    from aotconv.variants.eltwise import Eltwise
    from aotconv.variants.scale import ScaleDirect
    for cls in (AddDirect, Eltwise, ScaleDirect):
        assert "LAYOUT" not in {k.name for k in cls().knobs(CASES["add_relu"][2], POCL)}
        assert cls.layouts == ("NCHW", "NCHW") and "layouts_of" not in cls.__dict__
    # and the siblings' hashes differ from theirs (their records are not shared)
    assert BY_NAME["add_nhwc"].template_hash() != BY_NAME["add_direct"].template_hash()


# -- PoCL --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cid", sorted(CASES))
@pytest.mark.parametrize("layout", ["NHWC", "CHWN"])
def test_against_reference(cl_ctx, cid, layout):
    """Every input stored in `layout` as the network holds it, the output read back in it."""
    variant, _, l = CASES[cid]
    v, c = BY_NAME[variant], at(variant, l, layout, VEC=2)
    xs, prm = harness.random_inputs(l, np.random.default_rng(5))
    stored = [reference.to_layout(x, layout).reshape(x.shape) for x in xs]
    out = harness.run_layer(l, v, c, stored, prm, ctx=cl_ctx)
    want = reference.forward(l, xs, prm)
    ok, err = harness.close(reference.from_layout(out.ravel(), layout, l.out_shape), want)
    assert ok, (cid, layout, err)
    assert harness.verify_point(*cl_ctx, l, v, c, xs, prm)["ok"]   # and as the tuner checks

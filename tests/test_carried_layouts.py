"""A residual add carried onto its conv's kernel (fusion._carried) is planned in every layout the
conv's own search measured, not only in the layout of the kernel carried (layouts.layout_options,
from the conv's records through records.twin_points).

Device-free: records written for an absent target, the options and the plan read from them.
"""
import pytest

from aotconv import layouts, passes
from aotconv.choose import Choice
from aotconv.context import BuildContext
from aotconv.space import point_ok, variant_space
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

FURY = get_target("fury-x")          # its device is absent here: everything comes from records


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")


def nets():
    """(the network with its conv and add, the same with the add fused into the conv)."""
    net = passes.optimise(network_from_dict({
        "name": "n", "input": [1, 16, 9, 9],
        "layers": [dict(name="c", op="conv", out=16, kernel=3, pad=1),
                   dict(name="a", op="add", inputs=["input", "c"], act="relu")]}))
    return net, passes.fuse_residual(net, ["c"])


def igemm_point(layer, layout, tapstep=0):
    """conv_igemm's fallback for `layer` moved to `layout` (a point of its space: checked)."""
    v = BY_NAME["conv_igemm"]
    cfg = Config.from_dict(dict(v.fallback(layer, FURY).as_dict(), LAYOUT=layout,
                                TAPSTEP=tapstep))
    assert point_ok(layer, v, cfg, FURY)
    return cfg


def record(store, layer, variant, cfg, ms):
    store.append(Key(layer, BY_NAME[variant], FURY, None), cfg,
                 Outcome(Status.OK, time_ms=ms, times=(ms,)))


@pytest.fixture
def setup(tmp_path):
    """The fused layer's own records hold its NCHW fallback alone (2.0 ms); its conv's, three
    conv_igemm kernels: NHWC 1.0 ms (the one carried), CHWN 1.1 ms, NCHW 1.2 ms."""
    net, fused = nets()
    conv, f = net.layer("c"), fused.layer("c")
    db = tmp_path / "db.jsonl"
    store = Store(write=[db])
    fb = BY_NAME["conv_direct"].fallback(f, FURY)
    record(store, f, "conv_direct", fb, 2.0)
    pts = {lay: igemm_point(conv, lay) for lay in ("NHWC", "CHWN", "NCHW")}
    for lay, ms in (("NHWC", 1.0), ("CHWN", 1.1), ("NCHW", 1.2)):
        record(store, conv, "conv_igemm", pts[lay], ms)
    return fused, db, pts


def options(fused, db, chosen):
    with BuildContext.make(FURY, mode="records", tuning_db=str(db)) as ctx:
        return layouts.layout_options(fused, {"c": chosen}, ctx)["c"]


def test_a_carried_kernel_is_planned_in_the_layouts_its_conv_measured(setup):
    fused, db, pts = setup
    carried = Choice("conv_igemm", pts["NHWC"], None, "tuned", plan_ms=1.0)
    opts = options(fused, db, carried)
    got = {layouts.layouts_of(fused.layer("c"), c): c for c in opts}
    assert opts[0] is carried
    # CHWN: the conv's kernel, planned at its time; NCHW: the conv's (1.2 ms) beats the fused
    # layer's own fallback (2.0 ms) and takes its place
    assert set(got) == {("NHWC", "NHWC"), ("CHWN", "CHWN"), ("NCHW", "NCHW")}
    chwn, nchw = got[("CHWN", "CHWN")], got[("NCHW", "NCHW")]
    assert (chwn.variant, chwn.cfg, chwn.time_ms, chwn.plan_ms) == \
        ("conv_igemm", pts["CHWN"], None, pytest.approx(1.1, abs=0.01))
    assert (nchw.variant, nchw.cfg, nchw.time_ms) == ("conv_igemm", pts["NCHW"], None)
    # batch 1: CHWN is NCHW's storage, so the plan takes the CHWN kernel and no conversion over
    # the carried NHWC one and two conversions
    got, rep = layouts.plan(fused, {"c": carried}, {"c": opts},
                            lambda s, a, b: 0.0 if layouts.same_storage(s, a, b) else 0.5)
    assert got["c"].cfg == pts["CHWN"] and rep.changed


def test_a_measured_choice_gets_no_points_of_its_conv(setup):
    """A fused layer whose kernel was measured as itself keeps to its own records: the conv's
    times are another layer's."""
    fused, db, pts = setup
    own = Choice("conv_direct", BY_NAME["conv_direct"].fallback(fused.layer("c"), FURY), 2.0,
                 "record")
    assert [c.variant for c in options(fused, db, own)] == ["conv_direct"]


def test_the_fused_layers_own_faster_point_is_kept(setup, tmp_path):
    """Where the fused layer's own records have a layout's point faster than the conv's, the
    measured one is offered, not the conv's."""
    fused, db, pts = setup
    f = fused.layer("c")
    store = Store(write=[db])
    cfg = igemm_point(f, "CHWN", tapstep=1)
    assert cfg != pts["CHWN"]
    record(store, f, "conv_igemm", cfg, 0.9)
    carried = Choice("conv_igemm", pts["NHWC"], None, "tuned", plan_ms=1.0)
    chwn = [c for c in options(fused, db, carried)
            if layouts.layouts_of(f, c) == ("CHWN", "CHWN")]
    assert [(c.cfg, c.time_ms) for c in chwn] == [(cfg, 0.9)]


# -- on PoCL: the kernels a carried residual may take, in each layout --------------------------

def residual_layer(batch):
    net = passes.optimise(network_from_dict({
        "name": "n", "input": [batch, 16, 7, 6],
        "layers": [dict(name="c", op="conv", out=16, kernel=3, pad=1),
                   dict(name="a", op="add", inputs=["input", "c"], act="relu")]}))
    return passes.fuse_residual(net, ["c"]).layer("c")


@pytest.mark.device
@pytest.mark.parametrize("layout", ["NCHW", "CHWN", "NHWC"])
@pytest.mark.parametrize("ksplit", [1, 2])
def test_conv_igemm_computes_the_fused_residual_in_each_layout(layout, ksplit):
    """The conv's kernel run as the fused layer, in each layout its LAYOUT knob offers (batch 2,
    so that CHWN is not NCHW's storage), split-K included (the residual is added once), checked
    as the tuner checks a candidate: inputs and output in the kernel's layout, against the
    float64 reference of the conv and the add."""
    import numpy as np
    from aotconv import harness
    pocl = get_target("pocl-cpu")
    layer = residual_layer(2)
    v = BY_NAME["conv_igemm"]
    cfg = next((c for c in variant_space(layer, v, pocl, explain=False).points
                if c["LAYOUT"] == layout and c["KSPLIT"] == ksplit), None)
    assert cfg is not None, f"conv_igemm has no point of LAYOUT={layout} KSPLIT={ksplit} here"
    assert tuple(v.layouts_of(layer, cfg)) == (layout, layout)
    ctx, queue, _ = harness.context_for(pocl)
    xs, prm = harness.random_inputs(layer, np.random.default_rng(7))
    got = harness.verify_point(ctx, queue, layer, v, cfg, xs, prm)
    assert got["ok"], got

"""The layout plan's refinement (aotconv.layouts.plan_network): a layer the plan moved to
another layout at a kernel much slower than its search's pick is searched again in that layout,
and the plan reads the new records. Also the narrowing of a space to layouts
(space.restrict_layouts) on real variants.

The plan is driven with a fake `choose` (the searches are not what is under test): it times the
conversions and, for the refinement, records a new point, as a real search would."""
import pytest

from aotconv import layouts, space
from aotconv.choose import Choice, Stats
from aotconv.context import BuildContext
from aotconv.targets import TARGETS, device_identity, find_device, with_limits
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

from test_fusion_layouts import CHAIN, POCL, _net, registry  # noqa: F401 (registry: a fixture)


def _choice(variant, ms, trials=4, **cfg):
    return Choice(variant, Config.of(**cfg), ms, "tuned", Stats(trials=trials))


def _setup(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    net = _net(tmp_path, CHAIN)
    found = find_device(POCL)
    if found is None:
        pytest.skip("no PoCL device")
    live, dev = with_limits(POCL, found[1]), device_identity(*found)
    db = tmp_path / "db.jsonl"
    store = Store(write=[db])
    b = net.layer("nhwc_b")
    # nhwc_b (and nhwc_c, the same layer): fast in NHWC, in NCHW one slow point measured
    for v, cfg, ms in [("test_conv_nhwc", Config.of(WG=64), 0.5),
                       ("conv_direct", Config.of(WG=64, KB=1), 1.0)]:
        store.append(Key(b, BY_NAME[v], live, dev), cfg, Outcome(Status.OK, ms))
    choices = {"a": _choice("conv_direct", 1.0, WG=64, KB=1),
               "nhwc_b": _choice("test_conv_nhwc", 0.5, WG=64),
               "nhwc_c": _choice("test_conv_nhwc", 0.5, WG=64)}
    calls = []

    def fake_choose(n, ctx, only=None, layouts=None):
        calls.append((sorted(only or []), layouts, ctx.budget))
        if layouts:             # the refinement: a real search would find and record this
            ctx.store.append(Key(net.layer("nhwc_b"), BY_NAME["conv_direct"], live, dev),
                         Config.of(WG=64, KB=2), Outcome(Status.OK, 0.55))
            return {}
        return {name: Choice("layout_convert", Config.of(TILE=0, WG=64), 0.6, "tuned")
                for name in only}
    monkeypatch.setattr("aotconv.choose.choose", fake_choose)
    return net, db, choices, calls


def test_a_layer_moved_to_a_slow_kernel_is_searched_again_in_its_planned_layouts(
        tmp_path, monkeypatch, registry):  # noqa: F811
    net, db, choices, calls = _setup(tmp_path, monkeypatch)
    with BuildContext.make(POCL, mode="tune", tuning_db=str(db), budget="20") as ctx:
        out, rep = layouts.plan_network(net, choices, ctx)
    # the conversions around the NHWC stretch cost more than it saves (0.5 + 0.5 + 2 x 0.6
    # against 2 x 1.0): the plan keeps NCHW and searches the layer again there, once for both
    # of its occurrences, with its own trials (8 at least), then plans again
    refine = [c for c in calls if c[1]]
    assert refine == [(["nhwc_b", "nhwc_c"], {"nhwc_b": ("NCHW", "NCHW"),
                                              "nhwc_c": ("NCHW", "NCHW")}, "8")]
    for n in ("nhwc_b", "nhwc_c"):
        assert out[n].variant == "conv_direct" and out[n].cfg["KB"] == 2
        assert out[n].time_ms == pytest.approx(0.55)
    assert [r["layer"] for r in rep.refined] == ["nhwc_b", "nhwc_c"]
    for r in rep.refined:
        assert r["layouts"] == ["NCHW", "NCHW"] and r["after_ms"] < r["before_ms"]
    assert rep.as_dict()["refined"] == rep.refined


def test_no_refinement_from_records_alone_or_where_the_plan_costs_little(
        tmp_path, monkeypatch, registry):  # noqa: F811
    net, db, choices, calls = _setup(tmp_path, monkeypatch)
    with BuildContext.make(POCL, mode="records", tuning_db=str(db)) as ctx:
        out, rep = layouts.plan_network(net, choices, ctx)
    assert out["nhwc_b"].cfg["KB"] == 1 and rep.refined == []
    assert not any(c[1] for c in calls)
    # a planned kernel within REFINE_MARGIN of the search's pick is not searched again
    a = _choice("conv_direct", 1.0, WG=64, KB=1)
    close = _choice("test_conv_nhwc", 1.0 / (1 + layouts.REFINE_MARGIN) + 1e-3, WG=64)
    assert layouts.refinable(net, {"nhwc_b": close}, {"nhwc_b": a}) == {}
    far = _choice("test_conv_nhwc", 0.5, WG=64)
    assert layouts.refinable(net, {"nhwc_b": far}, {"nhwc_b": a}) == {
        "nhwc_b": ("NCHW", "NCHW")}
    # a residual add carried onto the conv's own kernel is planned at the conv's time
    carried = Choice("test_conv_nhwc", Config.of(WG=64), None, "tuned", plan_ms=0.5)
    assert layouts.refinable(net, {"nhwc_b": carried}, {"nhwc_b": a}) == {
        "nhwc_b": ("NCHW", "NCHW")}
    # the same layouts, or no time measured: nothing to refine
    assert layouts.refinable(net, {"nhwc_b": a}, {"nhwc_b": _choice("conv_direct", 2.0,
                                                                    WG=64, KB=2)}) == {}
    assert layouts.refinable(net, {"nhwc_b": Choice("test_conv_nhwc", Config.of(WG=64))},
                             {"nhwc_b": a}) == {}


def _layer(batch, c=64, hw=7, k=128):
    from test_fusion_layouts import make_layer
    return make_layer("conv", [(batch, c, hw, hw)], name="c", out=k, kernel=1)


# batch 2 (CHWN stored apart from NCHW) in the slow tier (tests/conftest.py): 3 to 4.5 s
@pytest.mark.parametrize("batch", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_restrict_layouts_keeps_the_points_that_store_as_asked(batch):
    target = TARGETS["h100"]
    layer = _layer(batch)
    sp = space.layer_space(layer, target, variants=[BY_NAME["conv_igemm"],
                                                    BY_NAME["conv_direct"]])
    lays = {str(c.cfg["LAYOUT"]) for c in sp.candidates if c.variant == "conv_igemm"}
    assert {"NCHW", "CHWN", "NHWC"} <= lays
    nchw = space.restrict_layouts(sp, "NCHW", "NCHW")
    kept = {(c.variant, str(c.cfg["LAYOUT"]) if c.variant == "conv_igemm" else None)
            for c in nchw.candidates}
    # at batch 1, CHWN is stored as NCHW is
    want = {("conv_igemm", "NCHW"), ("conv_direct", None)} | (
        {("conv_igemm", "CHWN")} if batch == 1 else set())
    assert kept == want
    nhwc = space.restrict_layouts(sp, "NHWC", "NHWC")
    assert {c.variant for c in nhwc.candidates} == {"conv_igemm"}
    assert {str(c.cfg["LAYOUT"]) for c in nhwc.candidates} == {"NHWC"}
    chwn = sum(1 for c in sp.candidates if c.variant == "conv_igemm" and c.cfg["LAYOUT"] == "CHWN")
    assert len(nhwc.candidates) + len(nchw.candidates) == len(sp.candidates) - (
        0 if batch == 1 else chwn)

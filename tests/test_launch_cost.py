"""Choices that change how many kernels a run launches count the target's launch gap
(aotconv.launch_cost): a layer's candidates, the layout plan's conversions, fusions.
Device-free: records and choices are made up, the decisions are the code's."""
import pytest

from aotconv import fusion, launch_cost, layouts, passes
from aotconv.choose import Choice
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config

H100 = get_target("h100")            # its device is absent here: choices come from records
GAP = H100.launch_gap_us / 1000.0


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")


def net_of(layers, shape=(1, 64, 14, 14)):
    return passes.optimise(network_from_dict({"name": "n", "input": list(shape),
                                              "layers": layers}))


def conv3x3():
    return net_of([dict(name="c", op="conv", out=64, kernel=3, pad=1)]).layer("c")


def test_targets_state_their_gap_and_others_take_the_default():
    assert H100.launch_gap_us == pytest.approx(3.4)
    assert get_target("pocl-cpu").launch_gap_us == pytest.approx(2.6)
    assert launch_cost.gap_ms(get_target("fury-x")) == launch_cost.DEFAULT_GAP_US / 1000.0


def test_winograd_launches_three_kernels_per_run_and_igemm_one():
    layer = conv3x3()
    wino, igemm = BY_NAME["conv_winograd"], BY_NAME["conv_igemm"]
    assert launch_cost.run_launches(wino, layer, wino.fallback(layer, H100)) == 3
    assert launch_cost.run_launches(igemm, layer, igemm.fallback(layer, H100)) == 1
    assert launch_cost.extra_ms(wino, layer, wino.fallback(layer, H100), H100) == \
        pytest.approx(2 * GAP)


@pytest.mark.parametrize("saving_gaps, picks", [(1.5, "conv_igemm"), (2.5, "conv_winograd")])
def test_records_pick_the_fewer_launches_unless_the_saving_pays_for_them(tmp_path, saving_gaps,
                                                                          picks):
    """Winograd's three launches win only where its kernels save more than two gaps."""
    layer = conv3x3()
    db = tmp_path / "r.jsonl"
    store = Store(write=[db])
    t = 0.020
    for name, ms in (("conv_igemm", t), ("conv_winograd", t - saving_gaps * GAP)):
        v = BY_NAME[name]
        store.append(Key(layer, v, H100, None), v.fallback(layer, H100),
                     Outcome(Status.OK, time_ms=ms, times=(ms,)))
    r = search.records_only([[layer]], H100, Store(read=[db]))[layer.signature_str()]
    assert r.best.variant == picks


def _plan_net():
    return net_of([dict(name="a", op="conv", out=64, kernel=1),
                   dict(name="b", op="conv", out=64, kernel=1),
                   dict(name="c", op="conv", out=64, kernel=1)], shape=(2, 64, 14, 14))


def test_the_layout_plan_pays_a_gap_per_conversion():
    """b runs 2 us faster in NHWC; its two conversions take 0.5 us each. Without the gap the
    plan converts (1 < 2 us); with the H100's gap (2 x 3.9 us) it does not."""
    net = _plan_net()
    igemm = BY_NAME["conv_igemm"]
    lb = net.layer("b")
    nchw = [p for p in (igemm.fallback(lb, H100),) if igemm.layouts_of(lb, p)[0] == "NCHW"][0]
    nhwc = Config.of(**{**nchw.as_dict(), "LAYOUT": "NHWC"})
    assert tuple(igemm.layouts_of(lb, nhwc)) == ("NHWC", "NHWC")
    ch = {n: Choice("conv_igemm", nchw, 0.010, "tuned") for n in "abc"}
    ch["b"] = Choice("conv_igemm", nhwc, 0.008, "tuned")           # the per-layer best
    opts = {"a": [ch["a"]], "b": [ch["b"], Choice("conv_igemm", nchw, 0.010, "tuned")],
            "c": [ch["c"]]}
    cost = lambda s, a, b: 0.0 if a == b else 0.0005               # noqa: E731
    got, _ = layouts.plan(net, ch, opts, cost)
    assert igemm.layouts_of(lb, got["b"].cfg)[0] == "NHWC"
    got, rep = layouts.plan(net, ch, opts, cost, H100)
    assert igemm.layouts_of(lb, got["b"].cfg)[0] == "NCHW"
    assert rep.planned_ms == pytest.approx(0.030 + 3 * 0.0)         # no conversion planned
    assert rep.independent_ms == pytest.approx(0.028 + 2 * (0.0005 + GAP))


def test_fusion_counts_the_launch_the_unfused_pair_has_more():
    """fused 10 us against conv 7 us + add 2 us: slower on kernel time alone, faster once
    the add's launch is counted."""
    ch = {"c": Choice("conv_direct", Config.of(WG=64, KB=2), 0.007),
          "a": Choice("add_direct", Config.of(WG=64, VEC=1), 0.002)}
    fused = {"c": Choice("conv_direct", Config.of(WG=64, KB=2), 0.010)}
    pairs = [("c", "a", "r")]
    assert not fusion.decide_residual(pairs, ch, fused, "measure")[0].fused
    d = fusion.decide_residual(pairs, ch, fused, "measure", price=fusion.Price(H100))[0]
    assert d.fused and "(a launch)" in d.why
    assert (d.conv_ms, d.add_ms, d.fused_ms) == (0.007, 0.002, 0.010)    # measured times kept
    pool = fusion.decide([("c", "a")], ch, fused, "measure", fusion.Price(H100))[0]
    assert pool.fused


def test_a_carried_residual_fusion_is_planned_at_the_conv_s_time():
    """A fused layer carried onto the conv's own kernel has no time of its own; the layout plan
    prices it at the conv's (plan_ms), so an NHWC alternative measured for the fused layer can
    win, and one that is slower does not."""
    net = _plan_net()
    igemm = BY_NAME["conv_igemm"]
    lb = net.layer("b")
    nchw = igemm.fallback(lb, H100)
    nhwc = Config.of(**{**nchw.as_dict(), "LAYOUT": "NHWC"})
    carried = Choice("conv_igemm", nchw, None, "record", plan_ms=0.010)
    assert launch_cost.planned_ms(carried) == 0.010
    assert launch_cost.choice_ms(lb, carried, H100) == pytest.approx(0.010)
    base = {n: Choice("conv_igemm", nhwc, 0.010, "tuned") for n in "ac"}
    for alt_ms, want in ((0.006, "NHWC"), (0.030, "NCHW")):
        ch = dict(base, b=carried)
        opts = {"a": [base["a"]], "b": [carried, Choice("conv_igemm", nhwc, alt_ms, "tuned")],
                "c": [base["c"]]}
        got, _ = layouts.plan(net, ch, opts, lambda s, a, b: 0.0 if a == b else 0.002, H100)
        assert igemm.layouts_of(lb, got["b"].cfg)[0] == want

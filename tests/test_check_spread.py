"""The tolerance of a reduced-precision --check past T: twice the spread of the precision's
roundings through the network (precision.RoundedReference, compiler.judge, docs/precision.md).

Stochastic rounding (the Monte Carlo model of the roundings) is checked for what makes it a
model: each value goes to one of its two neighbours in the format, and on average to itself.
On PoCL: a deep fp16 network's library is within its tolerance, and the same library with one
parameter wrong is not.
"""
import numpy as np
import pytest

from aotconv import precision, protocol
from aotconv.compiler import judge
from aotconv.precision import (HalfReference, round_fp16, round_tf32, stochastic_fp16,
                               stochastic_tf32, verdict)

T = protocol.TOLERANCE


def tf32_neighbours(x):
    """The TF32 values at or below and at or above each float32 magnitude of x."""
    u = np.asarray(x, np.float32).view(np.uint32)
    low = u & np.uint32(0xFFFFE000)
    return low.view(np.float32), (low + np.uint32(0x2000)).view(np.float32)


def fp16_neighbours(x):
    """The halves next to each value of x: (below, above), equal where x is a half."""
    h = x.astype(np.float16)
    below = np.where(h.astype(np.float64) > x, np.nextafter(h, np.float16(-np.inf)), h)
    above = np.where(h.astype(np.float64) < x, np.nextafter(h, np.float16(np.inf)), h)
    return below.astype(np.float64), above.astype(np.float64)


@pytest.mark.parametrize("fmt", ["fp16", "tf32"])
def test_stochastic_rounding_goes_to_a_neighbour_and_on_average_to_the_value(fmt):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2000) * np.exp(rng.uniform(-6, 6, 2000))
    if fmt == "fp16":
        x = x.astype(np.float64)
        lo, hi = fp16_neighbours(x)
        draw, ulp = (lambda: stochastic_fp16(x, rng)), hi - lo
    else:
        x = x.astype(np.float32)
        a, b = tf32_neighbours(x)
        lo, hi = np.minimum(a, b).astype(np.float64), np.maximum(a, b).astype(np.float64)
        draw, ulp = (lambda: stochastic_tf32(x, rng).astype(np.float64)), hi - lo
    draws = np.stack([draw() for _ in range(400)])
    assert np.all((draws == lo) | (draws == hi))
    assert np.any(draws != draws[0])                     # not the same rounding every time
    # unbiased: the mean of 400 draws is within 5 standard errors of the value
    # (a two-point distribution on an ulp has a standard deviation of at most ulp / 2)
    err = np.abs(draws.mean(axis=0) - np.asarray(x, np.float64))
    assert np.all(err <= 5 * (ulp / 2) / np.sqrt(400))
    # rounding to nearest always picks the nearer of the two
    near = round_fp16(x) if fmt == "fp16" else round_tf32(x).astype(np.float64)
    assert np.all((near == lo) | (near == hi))


def test_stochastic_rounding_keeps_what_the_format_holds_and_the_specials():
    rng = np.random.default_rng(1)
    halves = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 2.0 ** -24, np.inf, -np.inf])
    assert np.array_equal(stochastic_fp16(halves, rng), halves)
    past = np.array([65519.0, 1e6, -1e6])                # round_fp16's: the largest half, or inf
    assert np.array_equal(stochastic_fp16(past, rng), round_fp16(past))
    assert np.isnan(stochastic_fp16(np.array([np.nan]), rng)).all()
    tf = round_tf32(rng.standard_normal(100).astype(np.float32))
    assert np.array_equal(stochastic_tf32(tf, rng), tf)
    special = np.array([np.inf, -np.inf, np.nan], np.float32)
    got = stochastic_tf32(special, rng)
    assert np.array_equal(got[:2], special[:2]) and np.isnan(got[2])


class Rounded(precision.RoundedReference):
    """A reference whose stochastic evaluations move every output by `spread`, relative."""

    def __init__(self, value, spread):
        self.value, self.by, self.spreads = value, spread, 0

    def evaluate(self, x, rng):
        if rng is None:
            return [self.value]
        self.spreads += 1
        return [self.value * (1 + self.by * rng.choice([-1.0, 1.0], self.value.shape))]


def test_judge_admits_T_plus_twice_the_spread_and_computes_it_only_past_T():
    v = np.linspace(-3, 3, 50).reshape(1, 50)
    one = np.zeros((1, 3))                                # an input of one image
    ref = Rounded(v, 0.01)
    err, tol, spread = judge([v * (1 + 5e-4)], ref, one)
    assert err < T and tol == T and spread is None and ref.spreads == 0
    err, tol, spread = judge([v * 1.015], ref, one)
    assert spread == pytest.approx(0.01 * 3 / 3, rel=1e-9)   # the hybrid error of 1% of |3|
    assert ref.spreads == precision.SPREAD_SAMPLES        # four images evaluated
    ref.spreads = 0
    judge([v * 1.015], ref, np.zeros((3, 3)))             # three images: two evaluations
    assert ref.spreads == 2
    ref.spreads = 0
    judge([v * 1.015], ref, [np.zeros((32, 3)), np.zeros((32, 5))])
    assert ref.spreads == 1
    assert tol == pytest.approx(T + 2 * spread) and err == pytest.approx(0.015) and err <= tol
    err, tol, _ = judge([v * 1.03], ref, one)
    assert err > tol                                      # three times the spread: a wrong result
    # a reference that does not round as a reduced precision does is held to T alone
    err, tol, spread = judge([v * 1.015], lambda x: [v], one)
    assert tol == T and spread is None and err > tol


def test_the_verdict_says_what_the_tolerance_is():
    ok, text = verdict(5e-4)
    assert ok and text == "max hybrid error 5.00e-04 (ok)"
    assert verdict(2e-3) == (False, "max hybrid error 2.00e-03 (FAILED)")
    ok, text = verdict(2e-2, T + 2 * 1.5e-2, 1.5e-2)
    assert ok and "(tolerance 3.10e-02 = T + 2 x 1.50e-02, the spread" in text
    assert text.endswith("ok; docs/precision.md)")
    assert not verdict(4e-2, T + 2 * 1.5e-2, 1.5e-2)[0]


# -- PoCL: a deep half-storage network --------------------------------------------------------

DEEP = ([dict(name="c0", op="conv", out=16, kernel=3, pad=1, act="relu")]
        + [l for i in range(1, 7) for l in (
            dict(name=f"c{i}", op="conv", out=16, kernel=3, pad=1),
            dict(name=f"b{i}", op="batchnorm", act="relu"),
            dict(name=f"a{i}", op="add", inputs=[f"b{i}", "c0" if i == 1 else f"a{i - 1}"]))]
        + [dict(name="g", op="global_avgpool"), dict(name="f", op="flatten"),
           dict(name="d", op="dense", out=10)])


@pytest.fixture(scope="module")
def deep_fp16(tmp_path_factory):
    """(BuildResult, the network as written, flat parameters, input) of the deep network built
    in fp16 with --check."""
    import yaml
    from aotconv.compiler import compile_network, random_inputs
    from aotconv.spec import load_network
    d = tmp_path_factory.mktemp("deep")
    y = d / "deep.yaml"
    y.write_text(yaml.safe_dump({"name": "deep", "input": [2, 8, 12, 12], "layers": DEEP}))
    res = compile_network(str(y), target="pocl-cpu", outdir=d / "b", tune_mode="fallback",
                          check=True, quiet=True, precision="fp16")
    flat = np.fromfile(d / "b" / "deep.params.bin", np.float32)
    return (res, load_network(str(y)), flat,
            random_inputs(res.schedule.net, np.random.default_rng(3)))


def test_a_deep_fp16_library_is_within_its_tolerance(deep_fp16):
    res = deep_fp16[0]
    assert res.check_reference == HalfReference.name
    assert res.check_error is not None
    tol = res.check_tolerance
    assert res.check_error <= tol
    if res.check_spread is not None:                   # past T: admitted by the spread only
        assert res.check_error > T and tol == pytest.approx(T + 2 * res.check_spread)
    report = (res.outdir / "report.md").read_text()
    assert f"max hybrid error {res.check_error:.2e} (" in report


def test_the_same_library_with_one_parameter_wrong_is_past_its_tolerance(deep_fp16):
    from aotconv.runtime import load
    res, src, flat, x = deep_fp16
    ref = HalfReference(res.schedule, flat)
    bad = flat.copy()
    off = next(o for l, t, _, o in src.param_layout() if (l, t) == ("c4", "weight"))
    bad[off:off + 16] *= 1.5                         # c4's first output channel, in part
    with load(res.outdir) as lib:
        lib.set_params(flat)
        good = lib(x)
        lib.set_params(bad)
        wrong = lib(x)
    err, tol, _ = judge(good, ref, x)
    assert err <= tol
    err, tol, spread = judge(wrong, ref, x)
    assert err > tol, (err, tol, spread)


def test_the_check_between_two_batch_sizes_judges_the_first_n_images():
    """A library of sizes 1 and 8 run with n = 2: its outputs are the first 2 of the size-8
    reference's on the input padded with zeros, and the spread is taken over those 2 images,
    in two evaluations (four images at least)."""
    from aotconv.compiler import _first
    v = np.linspace(-3, 3, 8 * 50).reshape(8, 50)
    ref = Rounded(v, 0.01)
    cut = _first(ref, 2)
    padded = np.zeros((8, 3))
    assert np.array_equal(cut(padded)[0], v[:2])
    err, tol, spread = judge([v[:2] * 1.015], cut, padded)
    assert ref.spreads == 2
    assert spread == pytest.approx(0.01)      # uncut, the evaluations would not compare: inf
    assert tol == pytest.approx(T + 2 * spread) and err <= tol

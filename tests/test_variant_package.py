"""The variant package: what the variants share, and that data flows variants -> space.

Device-free. The kernels themselves are checked elsewhere (test_kernels, test_conv_variants*:
on PoCL against numpy; test_records_kernel: the shipped records' kernel hashes, which change
with any rendered byte, launch or buffer).
"""
import subprocess
import sys
from pathlib import Path

import pytest

from aotconv.errors import AotconvError
from aotconv.spec import network_from_dict
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, VARIANTS
from aotconv.variants.base import Config, Constraint, Knob, NoFallback, Variant
from aotconv.variants.flat import Blocked, block_items
from aotconv.variants.limits import first_valid

ROOT = Path(__file__).resolve().parent.parent
H100, POCL = TARGETS["h100"], TARGETS["pocl-cpu"]


def test_the_variants_never_import_the_space():
    """Importing the registry and asking every variant for its fallback on layers of every op
    loads no aotconv.space: the constraints every variant gets live in variants.limits."""
    code = """
import sys
from aotconv.spec import load_network
from aotconv import passes
from aotconv.targets import TARGETS
from aotconv.variants import for_layer
net = passes.fuse_pool(passes.optimise(load_network("inception-v1")))
net2 = passes.optimise(load_network("alexnet"))
for layer in net.layers + net2.layers:
    for v in for_layer(layer):
        for t in ("h100", "pocl-cpu"):
            try:
                v.fallback(layer, TARGETS[t])
            except Exception:
                pass
print("aotconv.space" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    assert r.stdout.strip() == "False"


class _Toy(Variant):
    """Two knobs; a point is valid when A + B is even; work-groups: A * B."""
    name = "toy"
    ops = ("relu",)
    template = "kernels/eltwise.cl.mako"
    constraints = (Constraint("even", "algorithm", "A + B even",
                              lambda l, c, t: (c["A"] + c["B"]) % 2 == 0),)

    def knobs(self, layer, target):
        return [Knob("A", (1, 2, 3, 4)), Knob("B", (1, 2, 3, 4))]

    def launches(self, layer, cfg, prefix):
        return []


@pytest.fixture(scope="module")
def relu():
    return network_from_dict({"name": "n", "input": [1, 2, 3, 3],
                              "layers": [{"name": "r", "op": "relu"}]}).layer("r")


def test_first_valid_takes_the_first_valid_point_that_fills_the_device(relu):
    v = _Toy()
    pts = [dict(A=1, B=2), dict(A=1, B=1), dict(A=2, B=2), dict(A=9, B=1), dict(A=4, B=4)]
    assert first_valid(v, relu, H100, pts) == Config.of(A=1, B=1)
    # no point gives the 132 compute units a work-group each: the first with the most
    assert first_valid(v, relu, H100, pts, lambda c: c["A"] * c["B"]) == Config.of(A=4, B=4)
    pts.insert(0, dict(A=3, B=3))
    few = type(H100)(**{**H100.__dict__, "compute_units": 9})
    assert first_valid(v, relu, few, pts, lambda c: c["A"] * c["B"]) == Config.of(A=3, B=3)
    with pytest.raises(NoFallback, match="toy: no fallback point is valid for layer 'r'"):
        first_valid(v, relu, H100, [dict(A=1, B=2), dict(A=9, B=9)])
    assert issubclass(NoFallback, AotconvError)


def test_a_blocked_variant_counts_its_work_items_and_declares_its_constraints(relu):
    class Rows(Blocked):
        name = "rows"
        ops = ("relu",)
        template = "kernels/eltwise.cl.mako"
        block = Knob("QB", (1, 2, 4))
        along = 3
        within = ("qb_within_row", "a block longer than the row")

    n, c, h, w = relu.out_shape
    for qb in (1, 2, 4):
        cfg = Config.of(WG=64, QB=qb)
        assert Rows().items(relu, cfg) == n * c * h * -(-w // qb)
        assert block_items(3, "QB")(relu, cfg) == Rows().items(relu, cfg)
    names = [k.name for k in Rows().knobs(relu, POCL)]
    assert names == ["WG", "QB"]
    assert [x.name for x in Rows.constraints] == ["qb_within_row", "wg_not_wasteful",
                                                  "wg_fills_simd"]
    within = Rows.constraints[0]
    assert within.check(relu, Config.of(WG=64, QB=2), POCL)
    assert not within.check(relu, Config.of(WG=64, QB=4), POCL)       # the row is 3 wide


def test_every_variant_declares_its_constraints_with_levels_and_reasons():
    for v in VARIANTS:
        assert v.constraints, v.name
        for c in v.constraints:
            assert c.reason and c.level in ("algorithm", "software", "hardware"), (v.name, c)
    assert BY_NAME["pool_direct"].supports(
        network_from_dict({"name": "n", "input": [1, 2, 3, 3],
                           "layers": [{"name": "r", "op": "relu"}]}).layer("r")) == \
        "pool_direct implements maxpool or avgpool, not relu"


def _conv(**kw):
    return network_from_dict({"name": "n", "input": [1, 4, 9, 9], "layers": [
        dict(name="c", op="conv", out=4, **kw)]}).layer("c")


@pytest.mark.parametrize("kw, variant, why", [
    (dict(kernel=3), "conv_1x1", "conv_1x1 needs kernel 1x1, not 3x3"),
    (dict(kernel=1, stride=2), "conv_1x1", "needs stride 1x1, not 2x2: a strided 1x1 conv"),
    (dict(kernel=1, pad=1), "conv_1x1", "conv_1x1 needs pad none, not (1, 1, 1, 1)"),
    (dict(kernel=5), "conv_winograd", "conv_winograd needs kernel 3x3, not 5x5"),
    (dict(kernel=3, stride=2), "conv_winograd", "needs stride 1x1, not 2x2"),
    (dict(kernel=3, dilation=2, pad=2), "conv_winograd", "needs dilation 1x1, not 2x2"),
    (dict(kernel=3, groups=2), "conv_winograd", "needs groups 1, not 2"),
])
def test_a_conv_outside_a_variants_domain_is_declined_with_the_reason(kw, variant, why):
    assert why in BY_NAME[variant].supports(_conv(**kw))


@pytest.mark.parametrize("kw, variant", [(dict(kernel=1), "conv_1x1"),
                                         (dict(kernel=3, pad=1), "conv_winograd")])
def test_a_conv_inside_a_variants_domain_is_taken(kw, variant):
    assert BY_NAME[variant].supports(_conv(**kw)) is None


def test_the_gemm_variants_own_their_packed_weights_and_scratch():
    """GemmVariant's buffer and scratch are the dims' PACKED and SCRATCH; the launches use
    that buffer by its name."""
    layer = _conv(kernel=3, pad=1)
    for name, buf in (("conv_im2col", "wpack"), ("conv_winograd", "u")):
        v = BY_NAME[name]
        cfg = v.fallback(layer, POCL)
        d = v.dims(layer, cfg)
        assert v.buffers(layer, cfg) == {buf: d["PACKED"]} and d["PACKED"] > 0
        assert v.scratch_floats(layer, cfg) == d["SCRATCH"] > 0
        used = {a.name for l in v.launches(layer, cfg, "k") for a in l.args if a.kind == "buffer"}
        assert used == {buf}

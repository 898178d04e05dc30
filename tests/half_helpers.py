"""What the f16 tensor-core variants' tests share (conv_mma_f16 and conv_mma_f16_nhwc): the
half model of a convolution, the check of an output against the reference and that model, and
PoCL with the mma emulated."""
import numpy as np
import pytest

from aotconv import harness, protocol, reference
from aotconv.context import with_precision
from aotconv.precision import round_fp16
from aotconv.targets import TARGETS
from aotconv.variants.conv_mma import EMULATE_ENV

POCL = TARGETS["pocl-cpu"]


def half_model(layer, xs, prm):
    """The float64 convolution of the operands as the device holds them (every input and
    parameter rounded to half), its output rounded to half: what the kernel stores, up to
    the FP32 sums' order."""
    p = {k: round_fp16(v) for k, v in prm.items()}
    return round_fp16(reference.forward(layer, [round_fp16(x) for x in xs], p))


def check_half_output(layer, xs, prm, cfg, out):
    """`out` (the logical NCHW output of point `cfg`) within the half tolerance of the float64
    reference, within one half ulp of the half model and equal to it almost everywhere, and
    stored in half; returns it."""
    got = protocol.Reference(layer, xs, prm).check(out)
    assert got["ok"], f"[{cfg}]: scaled error {got['error']:.3g} beyond the half tolerance"
    # one half ulp where FP32 sums in another order fall on the other side of a rounding
    model = half_model(layer, xs, prm)
    ok, err = harness.close(out, model, 2.0 ** -10)
    assert ok, f"[{cfg}]: {err:.3g} from the half model"
    assert np.mean(out == model) > 0.98, f"[{cfg}]: {np.mean(out != model):.3%} not the model's"
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32))
    return out


@pytest.fixture
def emulated(monkeypatch, cl_ctx):
    """(the fp16 PoCL target, (context, queue)) with the mma emulated."""
    monkeypatch.setenv(EMULATE_ENV, "1")
    return with_precision(POCL, "fp16"), cl_ctx

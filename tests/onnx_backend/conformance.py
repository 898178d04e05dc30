"""ONNX's node conformance tests (onnx.backend.test) through aotconv's ONNX backend.

The cases: every single-node test model of onnx.backend.test whose op is one the importer
maps (aotconv.onnx_import.mapping.OPS). Each runs through AotconvBackend (import, build on
PoCL without tuning, run) and is compared with ONNX's expected outputs by ONNX's own
Runner.assert_similar_outputs (its rtol/atol, shapes and dtypes). The inputs the op computes
on are the network's inputs, fed at run time; its parameters (weights, shapes, bounds) are
baked in (aotconv.onnx_import.backend). A model the importer does not take is skipped with
its reason (unittest.SkipTest), never counted as passed.

    python tests/onnx_backend/conformance.py [--subset] [--ops Clip,Mul]   # runs them, prints
                                                                          # the table
"""
import sys
import time
import unittest
import warnings

import numpy as np

# `make test` runs these (one or two per op type that builds: docs/onnx.md), each a library
# build of about 2 s on two shared cores; `make test-onnx` runs every case (1-D pools, as
# 2-D ones of width 1: test_1d_pool in tests/test_onnx_import.py, device-free)
SUBSET = (
    "test_conv_with_strides_and_asymmetric_padding", "test_conv_with_autopad_same",
    "test_maxpool_2d_ceil",
    "test_averagepool_2d_precomputed_pads_count_include_pad",
    "test_averagepool_2d_ceil_last_window_starts_on_pad", "test_globalaveragepool",
    "test_lrn", "test_batchnorm_epsilon", "test_gemm_transposeB", "test_softmax_axis_1",
    "test_leakyrelu", "test_flatten_axis1",
    "test_add", "test_mul", "test_concat_3d_axis_1",      # several inputs, fed at run time
)


def cases():
    """{op type: [onnx TestCase]} of the single-node node tests of the ops aotconv maps."""
    from onnx.backend.test.loader import load_model_tests
    from aotconv.onnx_import.mapping import OPS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        all_cases = load_model_tests(kind="node")
    out = {}
    for c in all_cases:
        nodes = c.model.graph.node
        if len(nodes) == 1 and nodes[0].domain in ("", "ai.onnx") and nodes[0].op_type in OPS:
            out.setdefault(nodes[0].op_type, []).append(c)
    return out


def _array(v):
    from onnx import TensorProto, numpy_helper
    if isinstance(v, TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, np.generic):
        return np.asarray(v)
    if not isinstance(v, np.ndarray):
        raise unittest.SkipTest(f"an input or output of type {type(v).__name__}; aotconv "
                                f"networks take and give float32 tensors")
    return v


def short_reason(e):
    """One line naming why the importer does not take the model."""
    from aotconv.onnx_import import UnsupportedError
    if isinstance(e, UnsupportedError):
        p = e.problems[0]
        text = f"{p.op}: {p.attr}: {p.message}" if p.attr else f"{p.op}: {p.message}"
    else:
        text = getattr(e, "message", str(e))
    return text if len(text) <= 160 else text[:157] + "..."


def run_case(case):
    """Run one case; raises unittest.SkipTest (with the reason) where aotconv does not take
    the model, AssertionError where an output differs."""
    from onnx.backend.test.runner import Runner
    from aotconv.onnx_import import OnnxError
    from aotconv.onnx_import.backend import AotconvBackend
    rep = AotconvBackend.prepare(case.model, "CPU")
    for inputs, refs in case.data_sets:
        inputs = [_array(v) for v in inputs]
        refs = [_array(v) for v in refs]
        try:
            outs = rep.run(inputs)
        except OnnxError as e:
            raise unittest.SkipTest(short_reason(e)) from None
        Runner.assert_similar_outputs(refs, outs, rtol=case.rtol, atol=case.atol,
                                      model_dir=case.name)


def table(results):
    """Markdown: per op, cases, passed, skipped (with each reason and its count), failed."""
    lines = ["| op | cases | passed | skipped | failed | why skipped (cases) |",
             "|---|---|---|---|---|---|"]
    for op in sorted(results):
        rs = results[op]
        n = {k: sum(1 for s, _, _ in rs if s == k) for k in ("passed", "skipped", "failed")}
        why = {}
        for s, _, reason in rs:
            if s == "skipped":
                why[reason] = why.get(reason, 0) + 1
        text = "; ".join(f"{r} ({k})" for r, k in sorted(why.items(), key=lambda x: -x[1]))
        lines.append(f"| {op} | {len(rs)} | {n['passed']} | {n['skipped']} | {n['failed']} | "
                     f"{text.replace('|', '/')} |")
    tot = {k: sum(1 for rs in results.values() for s, _, _ in rs if s == k)
           for k in ("passed", "skipped", "failed")}
    lines.append(f"| all | {sum(len(r) for r in results.values())} | {tot['passed']} | "
                 f"{tot['skipped']} | {tot['failed']} | |")
    return "\n".join(lines)


def main(argv):
    subset = "--subset" in argv
    only = set(argv[argv.index("--ops") + 1].split(",")) if "--ops" in argv else None
    results, t0 = {}, time.time()
    for op, cs in sorted(cases().items()):
        if only is not None and op not in only:
            continue
        for c in cs:
            if subset and c.name not in SUBSET:
                continue
            t = time.time()
            try:
                run_case(c)
                status, reason = "passed", ""
            except unittest.SkipTest as e:
                status, reason = "skipped", str(e)
            except Exception as e:            # a failure: reported, the table goes on
                status, reason = "failed", f"{type(e).__name__}: {str(e).splitlines()[0:1]}"
            results.setdefault(op, []).append((status, c.name, reason))
            print(f"{status:8s} {time.time() - t:5.1f} s  {c.name}  {reason[:100]}",
                  file=sys.stderr, flush=True)
    print(table(results))
    print(f"\n{time.time() - t0:.0f} s", file=sys.stderr)
    return 1 if any(s == "failed" for rs in results.values() for s, _, _ in rs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

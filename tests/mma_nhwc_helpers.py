"""What the channels-last tensor-core variants' tests share (conv_mma_f16_nhwc and
conv_mma_tf32_nhwc, one implementation: aotconv.variants.mma_nhwc): their layers and points,
the bank analysis of a local row, the C preprocessor, clang for nvptx and ptxas, a point run on
PoCL as the tuner runs it, the sweep of the inline PTX on an H100, and a library that runs
three convs on the variant from records. Each test module keeps its own assertions on what
differs (the element, the mma, the stores, the tolerance)."""
from dataclasses import replace
import re
import shutil
import subprocess
from pathlib import Path
import time
import warnings
import zlib

import numpy as np
import pytest

from aotconv import harness, ops, protocol
from aotconv.context import with_precision
from aotconv.errors import KernelBuildError
from aotconv.graph import Layer
from aotconv.space import fallback_point, variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV

POCL = TARGETS["pocl-cpu"]
RESNET_3X3 = dict(in_shape=(1, 128, 28, 28), out=128, kernel=3, pad=1, act="relu")


def conv(in_shape, storage="fp32", res=False, **raw):
    """A conv layer as a build of `storage` holds it; `res`: with an add fused in (a second
    input of the output's shape)."""
    a = ops.normalise("conv", dict(raw))
    if storage == "fp16":
        a["storage"] = "fp16"
    out, params = ops.infer("conv", a, [tuple(in_shape)])
    layer = Layer("conv", "conv", a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                  params=params)
    if res:
        layer.attrs = dict(layer.attrs, residual=True)
        layer.inputs = ["input", "skip"]
        layer.in_shapes = [tuple(in_shape), tuple(out)]
    return layer


def build_storage(precision):
    """What a build of `precision` stores: half in an fp16 build, FP32 in the others."""
    return "fp16" if precision == "fp16" else "fp32"


def part(v, layer, target):
    return variant_space(layer, v, target, explain=False)


def pick(v, layer, target, **want):
    """The first point of `v`'s pruned space with the knob values `want`."""
    for cfg in part(v, layer, target).points:
        if all(cfg[k] == val for k, val in want.items()):
            return cfg
    raise AssertionError(f"no point with {want} for {layer.in_shape} -> {layer.out_shape}")


def spread(v, layer, target, wants, seed):
    """The fallback, then for each dict of `wants` the first point of the pruned space, in an
    order shuffled by `seed`, with those knob values and not picked already (none where the
    layer has no such point)."""
    import random
    pts = list(part(v, layer, target).points)
    random.Random(seed).shuffle(pts)
    picks = [v.fallback(layer, target)]
    for want in wants:
        found = [c for c in pts if all(c[k] == val for k, val in want.items()) and c not in picks]
        if found:
            picks.append(found[0])
    return picks


def with_knobs(cfg, **kw):
    """`cfg` with the knobs of `kw` set to their values, in the same order."""
    return Config(tuple((k, kw.get(k, v)) for k, v in cfg.items))


def without(cfg, knob):
    return Config(tuple(kv for kv in cfg.items if kv[0] != knob))


# -- where it is offered ------------------------------------------------------------------------

def assert_no_tensor_cores_no_points(v, precision, name, cc, monkeypatch):
    """No point without tensor cores (an H100 made to report an older GPU, PoCL), all of them
    pruned by `tensor_cores`, and no fallback; the test-only switch admits PoCL."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv(storage=build_storage(precision), **RESNET_3X3)
    t = replace(with_precision(TARGETS[name], precision), compute_capability=cc)
    got = part(v, layer, t)
    assert not got.points and got.first["tensor_cores"] == got.total, name
    assert fallback_point(layer, v, t) is None
    if name == "pocl-cpu":
        monkeypatch.setenv(EMULATE_ENV, "1")
        assert part(v, layer, t).points


def assert_the_domain(v, nchw, target, vec, element):
    """An RGB input (ResNet's conv1, C = 3) stays on the other variants (`nchw`, the NCHW
    sibling, takes it), saying why; C not a multiple of `vec` and groups 2 are declined with
    the reason; C = 3 `vec` is taken."""
    from aotconv.space import layer_space
    storage = build_storage(target.precision)
    rgb = conv((1, 3, 32, 32), storage, out=64, kernel=7, stride=2, pad=3)
    assert v.supports(rgb) == (f"{v.name} needs C % {vec} == 0, not C = 3: it loads the input "
                               f"channels in 16-byte vectors of {vec} {element}")
    sp = layer_space(rgb, target, variants=[v, nchw, BY_NAME["conv_direct"]])
    assert v.name in dict(sp.unsupported) and any(p.variant is nchw and p.points
                                                  for p in sp.parts)
    odd = vec * 3 // 2                                 # 12 channels for 8, 6 for 4
    assert v.supports(conv((1, odd, 8, 8), storage, out=8, kernel=3)).startswith(
        f"{v.name} needs C % {vec} == 0, not C = {odd}")
    assert f"{v.name} needs groups 1, not 2" in v.supports(
        conv((1, 16, 5, 5), storage, out=16, kernel=3, groups=2))
    assert v.supports(conv((1, 3 * vec, 5, 5), storage, out=8, kernel=3)) is None


def assert_the_fallback_fits_resnet50(v, target, vec, monkeypatch):
    """Every conv of ResNet-50 (batch 1 and 32, stored as a build of target.precision stores
    it) with C % vec == 0 gets a fallback point, none with the knobs the H100 has not measured
    (CPASYNC, LDSM, EPI); conv1 (C = 3) gets none."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    from aotconv.precision import stored
    from aotconv.spec import load_network
    from aotconv.passes import optimise
    for batch in (1, 32):
        net = optimise(load_network("resnet50", batch=batch))
        if target.precision == "fp16":
            net = stored(net, "fp16")
        convs = [l for l in net.layers if l.op == "conv"]
        assert len(convs) > 50
        for l in convs:
            if l.in_shape[1] % vec:
                assert f"C % {vec} == 0" in v.supports(l)
                assert fallback_point(l, v, target) is None
                continue
            cfg = fallback_point(l, v, target)
            assert cfg is not None, l.name
            assert (cfg["CPASYNC"], cfg["LDSM"], cfg["EPI"]) == (0, 0, 0), (l.name, cfg)


# -- the local rows' banks ----------------------------------------------------------------------

def fragment_banks(ld, ldsm):
    """The banks the 32 lanes of a warp read for each fragment register: lane (g, t) reads
    word column t (+4) of rows g (+8) of a local tile of rows `ld` words apart (4-byte banks,
    32 of them); `ldsm`: an ldmatrix phase (8 rows of 4 words) instead."""
    if ldsm:
        return [[(r * ld + w) % 32 for r in range(8) for w in range(4)]]
    return [[((g + dr) * ld + t + dc) % 32 for g in range(8) for t in range(4)]
            for dr in (0, 8) for dc in (0, 4)]


def assert_pad_4_conflict_free(v, bk, per_word):
    """With PAD = 4 a local row (BK / per_word + PAD words) is 4 (mod 8) words long and every
    fragment read of a warp (and every 8-row phase of ldmatrix) hits 32 different banks;
    without padding some lanes share a bank."""
    layer = conv(**RESNET_3X3)
    for pad, free in ((4, True), (0, False)):
        cfg = Config.of(BM=64, BN=64, BK=bk, WM=2, WN=2, PAD=pad, DBUF=0, CPASYNC=0, LDSM=0,
                        EPI=0)
        ld = v.template_params(layer, cfg)["LD"]
        assert ld == bk // per_word + pad and ld % 4 == 0  # 16-byte rows stay aligned
        for phase in (False, True):
            for banks in fragment_banks(ld, phase):
                assert (len(set(banks)) == 32) == free, (bk, pad, phase)


# -- the rendered text: the C preprocessor, clang for nvptx, ptxas ------------------------------

def cpp(src, *defines):
    return subprocess.run([shutil.which("cpp"), "-P", *defines], input=src,
                          capture_output=True, text=True, check=True).stdout


def preprocessed(v, layer, cfg, monkeypatch):
    """(what NVIDIA's compiler sees, what every other compiler sees) of `cfg`'s kernel after
    the C preprocessor: the other has no asm, and with the test-only switch neither has."""
    if shutil.which("cpp") is None:
        pytest.skip("no C preprocessor (cpp) here")
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    src = v.render(layer, cfg, "k")
    nv, other = cpp(src, "-Dcl_nv_compiler_options"), cpp(src)
    assert "asm" not in other
    monkeypatch.setenv(EMULATE_ENV, "1")
    assert "asm" not in cpp(v.render(layer, cfg, "k"), "-Dcl_nv_compiler_options")
    monkeypatch.delenv(EMULATE_ENV)
    return nv, other


# Definitions of the OpenCL builtins the kernels call, for clang's nvptx target where no libclc
# is installed (what they compute does not matter here: only that the kernel compiles)
NVPTX_PRELUDE = r"""
#define OVL __attribute__((overloadable))
size_t OVL get_local_id(uint d) {
    return d == 0 ? __nvvm_read_ptx_sreg_tid_x() : d == 1 ? __nvvm_read_ptx_sreg_tid_y()
                                                          : __nvvm_read_ptx_sreg_tid_z(); }
size_t OVL get_group_id(uint d) {
    return d == 0 ? __nvvm_read_ptx_sreg_ctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_ctaid_y()
                                                            : __nvvm_read_ptx_sreg_ctaid_z(); }
size_t OVL get_local_size(uint d) {
    return d == 0 ? __nvvm_read_ptx_sreg_ntid_x() : d == 1 ? __nvvm_read_ptx_sreg_ntid_y()
                                                           : __nvvm_read_ptx_sreg_ntid_z(); }
size_t OVL get_global_id(uint d) { return get_group_id(d) * get_local_size(d) + get_local_id(d); }
void OVL barrier(cl_mem_fence_flags f) { __nvvm_bar_sync(0); }
static inline float h2f_(ushort h) {
    float f; __asm__("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static inline ushort f2h_(float f) {
    ushort h; __asm__("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
float OVL vload_half(size_t i, const __global half* p) {
    return h2f_(((const __global ushort*)p)[i]); }
float2 OVL vload_half2(size_t i, const __global half* p) {
    return (float2)(vload_half(2 * i, p), vload_half(2 * i + 1, p)); }
void OVL vstore_half_rte(float v, size_t i, __global half* p) {
    ((__global ushort*)p)[i] = f2h_(v); }
void OVL vstore_half2_rte(float2 v, size_t i, __global half* p) {
    vstore_half_rte(v.x, 2 * i, p); vstore_half_rte(v.y, 2 * i + 1, p); }
void OVL vstore_half2_rte(float2 v, size_t i, __private half* p) {
    ((__private ushort*)p)[2 * i] = f2h_(v.x); ((__private ushort*)p)[2 * i + 1] = f2h_(v.y); }
int OVL min(int a, int b) { return a < b ? a : b; }
float OVL fmax(float a, float b) { return __builtin_fmaxf(a, b); }
float OVL tanh(float x) {
    float e = __nvvm_ex2_approx_f(2.8853900818f * x); return (e - 1.0f) / (e + 1.0f); }
#undef OVL
"""


def clang_nvptx():
    """A clang that compiles OpenCL C for nvptx64 (PoCL's clang here), and ptxas; else skip."""
    ptxas = shutil.which("ptxas") or shutil.which("/usr/local/cuda/bin/ptxas")
    if ptxas is None:
        pytest.skip("ptxas (the CUDA toolkit's PTX assembler) is not installed here")
    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        clang = shutil.which(name)
        if clang and to_ptx(clang, "__kernel void k(__global int* p) { p[0] = 1; }")[0] == 0:
            return clang, ptxas
    pytest.skip("no clang with the nvptx64 target here")


def to_ptx(clang, src):
    run = subprocess.run(
        [clang, "-x", "cl", "-cl-std=CL1.2", "-target", "nvptx64-nvidia-nvcl", "-O2",
         "-Xclang", "-finclude-default-header", "-Xclang", "-target-cpu", "-Xclang", "sm_80",
         "-Xclang", "-target-feature", "-Xclang", "+ptx75", "-Dcl_nv_compiler_options",
         "-Dasm=__asm__", "-Wno-pointer-to-int-cast", "-S", "-", "-o", "-"],
        input=src, capture_output=True, text=True)
    return run.returncode, run.stdout, run.stderr


def assemble_sm90a(v, layer, cfg):
    """clang's PTX of `v`'s kernel (nvptx, built with aotconv.ptx's define), rewritten for
    sm_90a as aotconv.ptx does, and ptxas -v run on it: (the rewritten PTX, ptxas's result)."""
    import tempfile
    from aotconv import ptx
    clang, ptxas = clang_nvptx()
    rc, out, err = to_ptx(clang, NVPTX_PRELUDE + f"#define {ptx.NEEDS} 1\n"
                          + v.render(layer, cfg, "k"))
    assert rc == 0, err[-2000:]
    fixed = ptx.rewrite(out.replace(".target sm_80", ".target sm_90"))
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(fixed)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(Path(d, "k.ptx")), "-o",
                            str(Path(d, "k.cubin"))], capture_output=True, text=True)
    return fixed, r


def assemble_sm90(v, layer, cfg):
    """`v`'s kernel at `cfg` through clang's nvptx and ptxas -v for sm_90 (an mma.sync kernel:
    no sm_90a rewrite), every entry without a spilled register: clang's PTX."""
    import tempfile
    clang, ptxas = clang_nvptx()
    rc, out, err = to_ptx(clang, NVPTX_PRELUDE + v.render(layer, cfg, "k"))
    assert rc == 0, err[-2000:]
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(out.replace(".target sm_80", ".target sm_90")
                                    .replace(".version 7.5", ".version 7.8"))
        run = subprocess.run([ptxas, "-arch=sm_90", "-v", str(Path(d, "k.ptx")), "-o",
                              str(Path(d, "k.cubin"))], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores", run.stderr)
    assert spills and all(n == "0" for n in spills), (cfg, run.stderr)
    return out


def ptxas_registers(ptxas, ptx, tmp_path, cfg):
    """ptxas assembles `ptx` (kernel k) for sm_90 without spilling a register: the registers
    it uses."""
    (tmp_path / "k.ptx").write_text(ptx)
    run = subprocess.run([ptxas, "--gpu-name", "sm_90", "-v", str(tmp_path / "k.ptx"),
                          "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert run.returncode == 0, f"[{cfg}] {run.stderr[-2000:]}"
    m = re.search(r"entry function 'k'.*?(\d+) bytes spill stores.*?Used (\d+) registers",
                  run.stderr, re.S)
    assert m, run.stderr
    spills, regs = int(m.group(1)), int(m.group(2))
    assert spills == 0, (cfg, run.stderr)
    return regs


def ptx_points(bk):
    """Points across the space's data movement, for the PTX checks: the register double
    buffer, cp.async in 2 and 3 stages, ldmatrix with B by .x4 (NI even) and .x2 (NI odd), no
    padding, a K step of `bk` (64 bytes of k) and of 2 `bk`, the staged epilogue (with the
    register double buffer, with cp.async and ldmatrix, and with a 128-pixel tile in four
    passes)."""
    return [dict(DBUF=1, CPASYNC=0, LDSM=0, BK=bk, EPI=0), dict(CPASYNC=3, LDSM=1, BK=bk, EPI=0),
            dict(CPASYNC=2, LDSM=0, PAD=0, EPI=0),
            dict(DBUF=0, CPASYNC=0, LDSM=1, BN=32, WN=4, EPI=0),
            dict(DBUF=1, LDSM=1, BK=2 * bk, EPI=0), dict(DBUF=1, CPASYNC=0, LDSM=0, BK=bk, EPI=1),
            dict(CPASYNC=3, LDSM=1, BK=bk, EPI=1), dict(BM=128, BN=64, DBUF=1, EPI=1)]


def assert_ptx_assembles(v, layer, target, points, mma, tmp_path, check_ptx):
    """At each of `points` (knob values picked from the pruned space) clang compiles the whole
    kernel with its inline PTX to PTX holding the mma `mma`, cp.async and ldmatrix (.x4, or .x2
    where NI is odd) where asked; check_ptx(cfg, template params, ptx) checks the rest; ptxas
    assembles it for sm_90 without a spill, within 35% of the registers() estimate; and
    ptxas refuses a broken mma, so that the check can fail."""
    clang, ptxas = clang_nvptx()
    for want in points:
        cfg = pick(v, layer, target, **want)
        p = v.template_params(layer, cfg)
        rc, ptx, err = to_ptx(clang, NVPTX_PRELUDE + v.render(layer, cfg, "k"))
        assert rc == 0, f"[{cfg}] {err[-2000:]}"
        assert mma in ptx, cfg
        assert ("cp.async.cg.shared.global" in ptx) == bool(cfg["CPASYNC"]), cfg
        ldsm = "ldmatrix.sync.aligned.m8n8.x2" if p["NI"] % 2 else \
            "ldmatrix.sync.aligned.m8n8.x4"
        assert (ldsm in ptx) == bool(cfg["LDSM"]), cfg
        check_ptx(cfg, p, ptx)
        regs = ptxas_registers(ptxas, ptx, tmp_path, cfg)
        est = v.registers(layer, cfg)
        assert 0.65 * regs <= est <= 1.35 * regs, (cfg, est, regs)
    assert_ptxas_refuses(ptxas, ptx, mma, tmp_path)


def assert_ptxas_refuses(ptxas, ptx, mma, tmp_path):
    """The assembler does refuse a broken kernel (the mma `mma` given an f64 accumulator), so
    the check that it assembles the others can fail."""
    bad = ptx.replace(mma, mma[:-len(".f32")] + ".f64", 1)
    assert bad != ptx
    (tmp_path / "bad.ptx").write_text(bad)
    assert subprocess.run([ptxas, "--gpu-name", "sm_90", str(tmp_path / "bad.ptx"), "-o",
                           str(tmp_path / "bad.cubin")], capture_output=True).returncode != 0


# -- on PoCL ------------------------------------------------------------------------------------

def random_case(layer, name):
    """(layer, its random inputs, its random parameters), seeded by `name`."""
    xs, prm = harness.random_inputs(layer, np.random.default_rng(zlib.crc32(name.encode())))
    return layer, xs, prm


def run_point(v, layer, xs, prm, cfg, ctx, program=None, source=None):
    """The layer's logical NCHW output from `cfg`, its inputs given in NHWC and its output read
    from NHWC as the tuner does (protocol.Kernel), the output poisoned first."""
    k = protocol.Kernel(ctx[0], ctx[1], layer, v, cfg, xs, prm, program=program, source=source)
    k.poison()
    k.run(0)
    k.finish()
    return k.output()


def pocl_local(program):
    """The local memory PoCL reports for a program's kernels (the largest)."""
    _, _, dev = harness.context_for(POCL)
    info = harness.cl().kernel_work_group_info.LOCAL_MEM_SIZE
    return max(k.get_work_group_info(info, dev) for k in program.all_kernels())


def assert_the_check_sees_a_wrong_layout(v, case, target, ctx, precision):
    """The same kernel read back as if it wrote NCHW is far from the reference: the tests pass
    because the output is NHWC, not whatever the check would accept."""
    layer, xs, prm = case
    k = protocol.Kernel(ctx[0], ctx[1], layer, v, v.fallback(layer, target), xs, prm)
    k.run(0)
    k.finish()
    nhwc_as_nchw = k.runs[0].read_output()
    ref = protocol.Reference(layer, xs, prm)
    assert not ref.check(nhwc_as_nchw, precision=precision)["ok"]
    assert ref.check(k.output(), precision=precision)["ok"]


# -- on an NVIDIA GPU: the inline PTX -----------------------------------------------------------

# the knobs whose PTX the H100 has not run yet: a point with one of them that the driver does
# not build is reported, not failed (the tuner prunes it as build_failed)
UNMEASURED = ("CPASYNC", "LDSM", "EPI")


def ptx_sweep(v, shapes, case, target, ctx, check_point, check_binary):
    """Every layer of `shapes` (id -> (..., the shape's own points)) at the fallback, the
    shape's own points, the first point of the space with DBUF alone, CPASYNC 2, CPASYNC 3,
    LDSM and EPI, and the fallback's twin with EPI = 1, through the driver: check_binary(cfg,
    binary) on what it built and check_point(layer, xs, prm, cfg, ctx, program, src) on what
    it computes; an EPI = 1 point stores bitwise what its EPI = 0 twin stores where both ran.
    Every point is tried and its outcome printed (`pytest -s`); a wrong answer, a failed
    launch, or a point without CPASYNC, LDSM and EPI that does not build fails; a point with
    them that the driver does not build is reported (printed and warned), not failed."""
    rows, failed, unbuilt, t0 = [], [], [], time.time()
    for lid in shapes:
        layer, xs, prm = case(lid)
        pts = part(v, layer, target).points
        extra = [pick(v, layer, target, **w) for w in shapes[lid][3]]
        for want in (dict(DBUF=1, CPASYNC=0, LDSM=0), dict(CPASYNC=2), dict(CPASYNC=3),
                     dict(LDSM=1), dict(EPI=1)):
            extra += [c for c in pts if all(c[k] == val for k, val in want.items())][:1]
        fb = v.fallback(layer, target)
        extra += [c for c in (with_knobs(fb, EPI=1),) if c in pts]
        done = {}
        for cfg in dict.fromkeys([fb] + extra):
            src = v.render(layer, cfg, "k")
            try:
                program = harness.build(ctx[0], src)
            except KernelBuildError as e:
                log = " ".join(str(e.log or e).split())[:400]
                (unbuilt if any(cfg[k] for k in UNMEASURED) else failed).append(
                    f"{lid} [{cfg}]: not built: {log}")
                rows.append(f"{lid} [{cfg}]: NOT BUILT")
                continue
            try:
                check_binary(cfg, program.binaries[0])
                out = check_point(layer, xs, prm, cfg, ctx, program, src)
                twin = with_knobs(cfg, EPI=1 - cfg["EPI"])
                if twin in done:
                    assert np.array_equal(out, done[twin]), "EPI 0 and 1 differ"
                done[cfg] = out
                rows.append(f"{lid} [{cfg}]: ok")
            except Exception as e:                      # noqa: BLE001 (every point reported)
                failed.append(f"{lid} [{cfg}]: {type(e).__name__}: {e}")
                rows.append(f"{lid} [{cfg}]: FAILED")
    print(f"{v.name} on the GPU ({time.time() - t0:.0f} s):", *rows, sep="\n  ")
    for u in unbuilt:
        warnings.warn(f"{v.name}: the driver does not build {u}")
    assert not failed, "\n".join(failed)
    assert sum(r.endswith(": ok") for r in rows) >= len(shapes)


# -- a library on PoCL --------------------------------------------------------------------------

NET = """name: {name}
input: [2, 3, 10, 10]
layers:
  - {{name: c0, op: conv, out: 16, kernel: 3, pad: 1, act: relu}}
  - {{name: c1, op: conv, out: 16, kernel: 3, pad: 1, act: relu}}
  - {{name: c2, op: conv, out: 16, kernel: 1}}
  - {{name: add, op: add, inputs: [c2, c0], act: relu}}
  - {{name: c3, op: conv, out: 24, kernel: 3, stride: 2, pad: 1, act: relu}}
  - {{name: gap, op: global_avgpool}}
  - {{name: fc, op: dense, out: 5}}
"""


def built_from_records(tmp_path, monkeypatch, name, text, precision, picks, fuse=()):
    """compile_network's result for the network `text` (a net.yaml) written as `name`.yaml,
    built for PoCL in `precision` with --check from records alone, in a cache of the test's own
    with no shipped records: the records make each pick fastest. `picks(net, fused)` gives
    [(layer, variant, cfg)] for the network as the build stores it (after the passes, half in
    an fp16 build) and for `fused`, the same with the adds after the convs named in `fuse`
    fused into them."""
    from aotconv.compiler import compile_network
    from aotconv.context import BuildContext
    from aotconv.passes import fuse_residual, optimise
    from aotconv.precision import stored
    from aotconv.spec import load_network
    from aotconv.tune.measure import Outcome, Status
    from aotconv.tune.records import Key, Store
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    yaml = tmp_path / f"{name}.yaml"
    yaml.write_text(text)
    db = tmp_path / "records.jsonl"
    with BuildContext.make("pocl-cpu", mode="records", precision=precision) as ctx:
        store = Store(write=[db])
        net = stored(optimise(load_network(str(yaml))), precision)
        fused = fuse_residual(net, list(fuse)) if fuse else net
        for layer, v, cfg in picks(net, fused, ctx.target):
            store.append(Key(layer, v, ctx.target, ctx.device), cfg,
                         Outcome(Status.OK, 1e-3, (1e-3,)))
    return compile_network(str(yaml), target="pocl-cpu", outdir=tmp_path / "out",
                           tune_mode="records", tuning_db=str(db), check=True, quiet=True,
                           precision=precision)


def library_on_the_variant(v, name, precision, tmp_path, monkeypatch):
    """Network `name` (NET) built for PoCL in `precision` with --check, from records that
    make `v` fastest for c1, c2 (with the add fused in, relu after it) and c3, the last two
    with the staged epilogue (EPI = 1): the build runs the three on `v` in NHWC, converting
    c0's output (C = 3 in: another variant, NCHW) once for both of its readers and c3's back
    for the pool. Returns compile_network's result."""
    def picks(net, fused, target):
        assert v.supports(net.layer("c0")) is not None
        # c2's kernel, carried over to c2 with the add fused in, and c3's: EPI = 1
        return [(layer, v, with_knobs(v.fallback(layer, target), EPI=epi))
                for layer, epi in ((net.layer("c1"), 0), (net.layer("c2"), 1),
                                   (fused.layer("c2"), 1), (net.layer("c3"), 1))]

    res = built_from_records(tmp_path, monkeypatch, name, NET.format(name=name), precision,
                             picks, fuse=["c2"])
    sch = res.schedule
    assert {n: c.variant for n, c in sch.choices.items() if n in ("c1", "c2", "c3")} == \
        {"c1": v.name, "c2": v.name, "c3": v.name}
    assert [sch.choices[n].cfg["EPI"] for n in ("c1", "c2", "c3")] == [0, 1, 1]
    c2 = sch.net.layer("c2")
    assert c2.attrs.get("residual") and "add" not in [l.name for l in sch.net.layers]
    converts = {l.name: (l.inputs[0], l.attrs["src"], l.attrs["dst"])
                for l in sch.net.layers if l.op == "layout_convert"}
    to_nhwc = [n for n, (t, a, b) in converts.items() if t == "c0" and b == "NHWC"]
    assert len(to_nhwc) == 1 and c2.inputs[1] == to_nhwc[0] \
        and sch.net.layer("c1").inputs == to_nhwc
    assert any(t == "c3" and (a, b) == ("NHWC", "NCHW") for t, a, b in converts.values())
    return res


def staged_case(v, staged, sid, target):
    """The layer of staged[sid] (id -> (input shape, attributes, residual, knob values)) as
    a build of target.precision holds it, its random inputs and parameters, its EPI = 1 point
    with those knob values and the point's template parameters."""
    shape, attrs, res, want = staged[sid]
    layer, xs, prm = random_case(conv(shape, storage=build_storage(target.precision), res=res,
                                      **attrs), sid)
    cfg = pick(v, layer, target, EPI=1, **want)
    return layer, xs, prm, cfg, v.template_params(layer, cfg)


def assert_staged_is_direct(v, layer, xs, prm, staged, ctx, check_point):
    """EPI = 1 at `staged` passes check_point and stores exactly what EPI = 0 stores at the
    same point; its local memory is what PoCL reports for the kernel."""
    src = v.render(layer, staged, "k")
    program = harness.build(ctx[0], src)
    assert pocl_local(program) == v.local_mem_bytes(layer, staged)
    got = check_point(layer, xs, prm, staged, ctx, program, src)
    direct = run_point(v, layer, xs, prm, with_knobs(staged, EPI=0), ctx)
    assert np.array_equal(got, direct), f"{np.mean(got != direct):.3%} differ"

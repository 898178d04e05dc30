"""conv_mma_f16: the tensor-core convolution of --precision fp16 builds (mma.sync m16n8k16
.f16, FP32 accumulation, half storage).

Device-free: where it is offered (an fp16 build's half layers on a device with tensor cores,
or with AOTCONV_MMA_EMULATE; never an fp32 or tf32 build, never a non-NVIDIA target without
the switch), `aotconv space` listing it for ResNet-50 on the h100, its records keyed apart
from conv_mma's and from FP32 layers', its local tiles half the bytes of conv_mma's, the
preprocessor giving NVIDIA's compiler the PTX body and every other the emulation, and the PTX
it emits assembled by ptxas for sm_90. The staged epilogue (EPI): a point without the knob
renders as EPI = 0 and a shipped record is read so, its constraint (P*Q % 8 == 0), its local
memory shared with the tiles, the whole kernel through clang's nvptx and ptxas with 16-byte
stores.

PoCL (the device tier, the mma emulated): 1x1, 3x3 stride 2 padded, odd channel counts, a
fused residual with relu, batch > 1, against the float64 reference within the half tolerance
and against the half model (the float64 convolution of the half operands, its output rounded
to half) within one half ulp; every finite half through an identity 1x1 conv, exactly. The
staged epilogue (EPI = 1) bitwise equal to the direct one at the same point, with tails,
bias or none, residual or none, DBUF 0 and 1, PAD 0, and its local memory as PoCL reports it.

Marked slow: more points of the space per shape, a dilated asymmetric kernel, the staged
epilogue under every other activation.
"""
from dataclasses import replace
import functools
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest

from aotconv import cli, harness, protocol
from aotconv.context import with_precision
from aotconv.space import fallback_point, layer_space, variant_space
from aotconv.targets import TARGETS
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import Key, Store
from aotconv.tune.search import records_only
from aotconv.variants import BY_NAME
from aotconv.variants.base import Config
from aotconv.variants.conv_mma import EMULATE_ENV
from half_helpers import check_half_output, emulated  # noqa: F401 (emulated: a fixture)

F16 = BY_NAME["conv_mma_f16"]
TF32 = BY_NAME["conv_mma"]
H100 = TARGETS["h100"]
POCL = TARGETS["pocl-cpu"]


def conv(in_shape, storage="fp16", res=False, **raw):
    """A conv layer as a build of `storage` (half by default here) holds it; `res`: with an
    add fused in."""
    from mma_nhwc_helpers import conv as held
    return held(in_shape, storage, res, **raw)


RESNET_3X3 = dict(in_shape=(1, 128, 28, 28), out=128, kernel=3, pad=1, act="relu")


def _part(layer, target):
    return variant_space(layer, F16, target, explain=False)


# -- where it is offered ------------------------------------------------------------------------

def test_an_fp16_build_on_tensor_cores_offers_it_and_no_other_build_does():
    half, fp32 = conv(**RESNET_3X3), conv(storage="fp32", **RESNET_3X3)
    h16 = with_precision(H100, "fp16")
    some = [F16, TF32, BY_NAME["conv_direct"]]
    sp = layer_space(half, h16, variants=some)
    part = [p for p in sp.parts if p.variant is F16]
    assert part and part[0].points and fallback_point(half, F16, h16) is not None
    # the TF32 sibling stays out of an fp16 build (it rounds FP32 operands to TF32)
    assert dict(sp.unsupported)["conv_mma"].startswith("conv_mma computes in TF32")
    # fp32 and tf32 builds: their layers are stored in FP32; the space says why it is left out
    for p in ("fp32", "tf32"):
        t = with_precision(H100, p)
        sp = layer_space(fp32, t, variants=some)
        assert F16.name not in [q.variant.name for q in sp.parts], p
        assert dict(sp.unsupported)[F16.name] == (
            "conv_mma_f16 multiplies the half values a --precision fp16 build stores: only a "
            "build of --precision fp16 runs it"), p
        # a single point judged outside a space (a fallback): storage_half rejects it
        cfg = F16.fallback(half, h16)
        assert fallback_point(fp32, F16, t) is None
        assert not [c for c in F16.constraints if c.name == "storage_half"][0].check(fp32, cfg, t)
    assert "conv_mma_f16 needs groups 1, not 2" in F16.supports(
        conv((1, 4, 5, 5), out=4, kernel=3, groups=2))


@pytest.mark.parametrize("name,cc", [("h100", (7, 5)), ("gtx1080", (6, 1)), ("pocl-cpu", ()),
                                     ("fury-x", ())])
def test_no_tensor_cores_no_switch_no_points(name, cc, monkeypatch):
    """A device without tensor cores (an NVIDIA one below 8.0, any other vendor's) lists no
    point of it in an fp16 build: every point falls to `tensor_cores`; with the test-only
    switch it has points on PoCL."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv(**RESNET_3X3)
    t = replace(with_precision(TARGETS[name], "fp16"), compute_capability=cc)
    part = _part(layer, t)
    assert not part.points and part.first["tensor_cores"] == part.total, name
    assert fallback_point(layer, F16, t) is None
    # nor is it among the candidates of the layer's space
    assert not any(p.points for p in layer_space(layer, t, variants=[F16, TF32]).parts)
    if name == "pocl-cpu":
        monkeypatch.setenv(EMULATE_ENV, "1")
        assert _part(layer, t).points


# slow tier: `aotconv space` on a ResNet-50 layer twice, 9 to 11 s; make test keeps the variant
# offered by an fp16 build on tensor cores and by no other build
# (test_an_fp16_build_on_tensor_cores_offers_it_and_no_other_build_does)
@pytest.mark.slow
def test_aotconv_space_lists_it_for_resnet50_on_the_h100(capsys, monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    argv = ["space", "resnet50", "--target", "h100", "--layer", "layer2.1.conv2"]
    assert cli.main(argv + ["--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"variant conv_mma_f16: (\d+) points -> (\d+) after pruning", out)
    assert m and int(m.group(2)) > 0, out
    assert re.search(r"storage_half +algorithm", out) and re.search(r"tensor_cores +hardware", out)
    assert cli.main(argv + ["--precision", "tf32"]) == 0
    out = capsys.readouterr().out
    assert "variant conv_mma_f16: not applicable (conv_mma_f16 multiplies the half" in out
    assert re.search(r"variant conv_mma: \d+ points", out)


def test_its_records_key_on_half_storage_and_never_serve_another_build(tmp_path):
    """A conv_mma_f16 record of an fp16 layer and a conv_mma record of the same layer in FP32,
    each faster than anything: the fp16 build takes the first, the tf32 build the second, an
    fp32 build neither."""
    half, fp32 = conv(**RESNET_3X3), conv(storage="fp32", **RESNET_3X3)
    h16, tf32 = with_precision(H100, "fp16"), with_precision(H100, "tf32")
    k16, k32 = Key(half, F16, h16), Key(fp32, TF32, tf32)
    assert "storage=fp16" in k16.op and "storage" not in k32.op
    assert (k16.variant, k16.template) != (k32.variant, k32.template)
    store = Store(read=[tmp_path / "r.jsonl"], write=[tmp_path / "r.jsonl"])
    store.append(k16, F16.fallback(half, h16), Outcome(Status.OK, 0.01, (0.01,)))
    store.append(k32, TF32.fallback(fp32, tf32), Outcome(Status.OK, 0.01, (0.01,)))
    igemm = BY_NAME["conv_igemm"]
    for layer, t in ((half, h16), (fp32, H100)):
        store.append(Key(layer, igemm, t), igemm.fallback(layer, t),
                     Outcome(Status.OK, 1.0, (1.0,)))
    assert records_only([[half]], h16, store)[half.signature_str()].best.variant == F16.name
    assert records_only([[fp32]], tf32, store)[fp32.signature_str()].best.variant == TF32.name
    assert records_only([[fp32]], H100, store)[fp32.signature_str()].best.variant == "conv_igemm"


def test_its_local_tiles_take_half_the_bytes_of_float_tiles():
    layer = conv(**RESNET_3X3)
    for bk, dbuf in ((16, 0), (32, 1), (64, 1)):
        cfg = Config.of(BM=128, BN=64, BK=bk, WM=2, WN=2, PAD=8, DBUF=dbuf)
        assert 2 * F16.local_mem_bytes(layer, cfg) == TF32.local_mem_bytes(layer, cfg)
    # the packed weights: words of two halves, half the bytes of conv_mma's floats
    cfg = Config.of(BM=64, BN=64, BK=32, WM=2, WN=2, PAD=8, DBUF=1)
    assert 2 * F16.buffers(layer, cfg)["wpack"] == TF32.buffers(layer, cfg)["wpack"]


def test_the_half_kernel_reads_bits_and_stores_half(monkeypatch):
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((2, 16, 8, 8), res=True, out=32, kernel=3, pad=1, act="relu")
    src = F16.render(layer, F16.fallback(layer, with_precision(H100, "fp16")), "k")
    assert "__global const ushort* restrict x" in src and "__global const uint* restrict wp" in src
    assert "__global const half* restrict res" in src and "__global half* restrict y" in src
    assert "vstore_half2_rte(" in src and "vload_half2(" in src and "vload_half(m, bias)" in src
    assert "AOTCONV_MMA_EMULATE 1" not in src
    # odd P*Q: one vstore_half_rte a value
    layer = conv((1, 5, 7, 7), out=8, kernel=3, pad=1)
    src = F16.render(layer, F16.fallback(layer, with_precision(H100, "fp16")), "k")
    assert "vstore_half_rte(" in src and "vstore_half2" not in src


# -- the staged epilogue (EPI) -------------------------------------------------------------------

H16 = with_precision(H100, "fp16")


def _with(cfg, **kw):
    return Config(tuple((k, kw.get(k, v)) for k, v in cfg.items))


def _without(cfg, knob):
    return Config(tuple(kv for kv in cfg.items if kv[0] != knob))


def _pick(layer, target, **want):
    for cfg in _part(layer, target).points:
        if all(cfg[k] == v for k, v in want.items()):
            return cfg
    raise AssertionError(f"no point with {want} for {layer.in_shape} -> {layer.out_shape}")


def test_epi_0_is_the_direct_epilogue_and_what_a_point_without_epi_renders(monkeypatch):
    """EPI's first value is 0 (the fallback's), and a point without the knob (a record made
    before it) renders and hashes as EPI = 0: the half2 stores from the fragments. EPI = 1
    renders the staged epilogue: 16-byte vectors of 8 pixels of one channel plane."""
    from aotconv.tune.records import kernel_hash
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((2, 16, 8, 8), res=True, out=32, kernel=3, pad=1, act="relu")
    knobs = F16.knobs(layer, H16)
    assert knobs[-1].name == "EPI" and knobs[-1].values[0] == 0
    assert F16.fallback(layer, H16)["EPI"] == 0
    for dbuf in (0, 1):
        cfg = _pick(layer, H16, EPI=0, DBUF=dbuf)
        old = _without(cfg, "EPI")
        direct = F16.render(layer, cfg, "k")
        assert F16.render(layer, old, "k") == direct
        assert kernel_hash(F16, layer, old) == kernel_hash(F16, layer, cfg)
        assert F16.local_mem_bytes(layer, old) == F16.local_mem_bytes(layer, cfg)
        assert "vload_half2(i2, res)" in direct and "pack_half8_rte" not in direct
        staged = F16.render(layer, _with(cfg, EPI=1), "k")
        assert "vload_half2(i2, res)" not in staged and "vstore_half2_rte((float2)" in staged
        assert "((__global uint4*)y)[i8] = pack_half8_rte(o);" in staged
        assert "s += load_half8((__global const uint4*)res + i8);" in staged
        assert "s += vload_half(m, bias);" in staged


def test_a_shipped_record_without_epi_is_its_point_with_epi_0(monkeypatch):
    """The h100's shipped records of the variant were made before EPI: the search reads each
    as its point with EPI = 0, a point of the layer's space."""
    from aotconv.tune.records import layer_of, read_log, shipped_file
    from aotconv.tune.search import known_outcomes
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    recs = [r for r in read_log(shipped_file("h100")) if r["variant"] == F16.name]
    # the shapes whose records all predate the knob (later records of other shapes have it)
    staged = {r["op"] for r in recs if "EPI" in dict(r["cfg"])}
    older = [r for r in recs if r["op"] not in staged]
    assert older and all("EPI" not in dict(r["cfg"]) for r in older)
    op = older[0]["op"]
    layer = layer_of(op)
    store = Store(read=[shipped_file("h100")])
    got = store.lookup(Key(layer, F16, H16))
    assert len(got) == len([r for r in recs if r["op"] == op])
    assert all(c.items[-1] == ("EPI", 0) for c in got)
    known = known_outcomes(layer_space(layer, H16, variants=[F16]), store, H16, None)
    assert {c.cfg for c in known} == set(got)


def test_the_staged_epilogue_needs_p_q_multiple_of_8():
    """ResNet's 28 x 28 and 56 x 56 planes take it; 14 x 14 (196) and 7 x 7 keep EPI = 0."""
    by = {c.name: c for c in F16.constraints}["epilogue_whole_vectors"]
    cfg = Config.of(BM=64, BN=64, BK=32, WM=2, WN=2, PAD=8, DBUF=1, EPI=1)
    for hw, ok in ((28, True), (56, True), (14, False), (7, False)):
        layer = conv((1, 64, hw, hw), out=64, kernel=1)
        assert by.check(layer, cfg, H16) == ok, hw
        assert by.check(layer, _with(cfg, EPI=0), H16)
        assert any(c["EPI"] for c in _part(layer, H16).points) == ok, hw


def test_the_staged_epilogue_shares_the_tiles_local_memory(monkeypatch):
    """With EPI = 1 the tiles and one pass (WM * 16 channels of BN + 8 floats) share one array
    of the larger size, as the template declares it (SMEM)."""
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((32, 128, 28, 28), res=True, out=512, kernel=1)
    small = Config.of(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0, EPI=1)
    assert F16.local_mem_bytes(layer, small) == 4 * 64 * 136
    assert F16.local_mem_bytes(layer, _with(small, EPI=0)) == 4 * 2 * 8 * 128
    big = Config.of(BM=128, BN=128, BK=32, WM=2, WN=2, PAD=8, DBUF=1, EPI=1)
    assert F16.local_mem_bytes(layer, big) == F16.local_mem_bytes(layer, _with(big, EPI=0)) \
        == 4 * 2 * 2 * 16 * 136
    assert F16.template_params(layer, big)["SMEM"] == 2 * 2 * 16 * 136
    assert big in _part(layer, H16).members
    src = F16.render(layer, big, "k")
    assert "__local uint4 smem4[SMEM / 4];" in src and "Abuf4" not in src


def test_the_staged_epilogue_compiles_to_16_byte_ptx(tmp_path, monkeypatch):
    """clang's nvptx back end compiles the whole kernel with EPI = 1 and ptxas assembles it for
    sm_90 without spills: one st.global.v4.u32 per output vector, the residual by
    ld.global.nc.v4.u32, the halves packed by cvt.rn.f16x2.f32, nothing through local memory;
    the direct epilogue (EPI = 0) has no vector store."""
    from mma_nhwc_helpers import NVPTX_PRELUDE, clang_nvptx as _clang_nvptx, to_ptx as _to_ptx
    clang, ptxas = _clang_nvptx()
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    layer = conv((8, 64, 14, 16), res=True, out=64, kernel=3, pad=1, act="relu")
    for want in (dict(DBUF=1, BK=32), dict(DBUF=0, BM=64, BN=128)):
        for epi in (0, 1):
            cfg = _pick(layer, H16, EPI=epi, **want)
            rc, ptx, err = _to_ptx(clang, NVPTX_PRELUDE + F16.render(layer, cfg, "k"))
            assert rc == 0, f"[{cfg}] {err[-2000:]}"
            stores = re.findall(r"st\.global\.v4\.u32", ptx)
            p = F16.template_params(layer, cfg)
            assert len(stores) == (p["MI"] * p["E_ITERS"] if epi else 0), cfg
            if epi:
                assert "cvt.rn.f16x2.f32" in ptx and "ld.global.nc.v4.u32" in ptx
                assert "st.local" not in ptx and "ld.local" not in ptx, cfg
            (tmp_path / "k.ptx").write_text(ptx)
            run = subprocess.run([ptxas, "--gpu-name", "sm_90", "-v", str(tmp_path / "k.ptx"),
                                  "-o", str(tmp_path / "k.cubin")], capture_output=True,
                                 text=True)
            assert run.returncode == 0, f"[{cfg}] {run.stderr[-2000:]}"
            assert re.search(r"entry function 'k'.*? 0 bytes spill stores", run.stderr, re.S), \
                run.stderr


# -- the PTX ------------------------------------------------------------------------------------

def _ptxas():
    return shutil.which("ptxas") or next(
        (p for p in ("/usr/local/cuda/bin/ptxas",) if shutil.which(p)), None)


def asm_statements(src):
    """[(template, [constraint])] of every `asm(...)` / `asm volatile(...)` in the OpenCL
    source `src` (macro continuations joined): the instruction text, its string literals
    concatenated, and the constraint of each operand, outputs first."""
    text = src.replace("\\\n", " ")
    out = []
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", text):
        i, depth, parts, cur, in_str = m.end(), 1, [], "", False
        while depth:
            ch = text[i]
            if in_str:
                cur += ch
                if ch == "\\":
                    cur += text[i + 1]
                    i += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str, cur = True, cur + ch
            elif ch in "([":
                depth, cur = depth + 1, cur + ch
            elif ch in ")]":
                depth -= 1
                if depth:
                    cur += ch
            elif ch == ":" and depth == 1:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
            i += 1
        parts.append(cur)
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', parts[0]))
        cons = [c for p in parts[1:3] for c in re.findall(r'"([=+]?[a-z])"\s*\(', p)]
        out.append((template, cons))
    return out


def ptx_stub(statements):
    """A PTX kernel holding `statements` (asm_statements), each operand a register of its
    constraint's class (f: .f32, r: .b32), inputs set and results stored so none is dead."""
    body, regs, stored = [], {"f": 0, "r": 0}, 0
    for n, (template, cons) in enumerate(statements):
        names = []
        for c in cons:
            cls = c[-1]
            names.append(f"%{cls}{regs[cls]}")
            regs[cls] += 1
            if not c.startswith("="):
                body.append(f"    mov.{'f32' if cls == 'f' else 'b32'} {names[-1]}, "
                            f"{'0f3F800000' if cls == 'f' else '0x3c003c00'};")
        body.append("    " + re.sub(r"%(\d+)", lambda m: names[int(m.group(1))],
                                    template.replace("%%", "%")))
        for c, name in zip(cons, names):
            if c[0] in "=+":
                t = "f32" if c[-1] == "f" else "b32"
                body.append(f"    st.global.{t} [%rd0+{4 * stored}], {name};")
                stored += 1
    return "\n".join([
        ".version 7.8", ".target sm_90", ".address_size 64", "",
        ".visible .entry asm_check(.param .u64 out)", "{",
        f"    .reg .f32 %f<{max(regs['f'], 1)}>;", f"    .reg .b32 %r<{max(regs['r'], 1)}>;",
        "    .reg .b64 %rd<1>;", "    ld.param.u64 %rd0, [out];", *body, "    ret;", "}", ""])


@pytest.mark.parametrize("variant,precision", [("conv_mma_f16", "fp16"), ("conv_mma", "tf32")])
def test_the_inline_ptx_assembles_for_sm_90(variant, precision, tmp_path, monkeypatch):
    """ptxas (CUDA's assembler) assembles, for sm_90 (the H100), every inline-asm instruction
    of the kernel rendered for NVIDIA's compiler, its operands as the asm's constraints bind
    them. No NVIDIA OpenCL driver is here, so this is the only check of the PTX strings
    possible on this machine: that the instructions, their types and operand counts are
    valid PTX for the target; what they compute is tested through the emulation (PoCL) and on
    the H100 itself."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas (the CUDA toolkit's PTX assembler) is not installed here")
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    v = BY_NAME[variant]
    layer = conv(storage=precision if precision == "fp16" else "fp32", **RESNET_3X3)
    t = with_precision(H100, precision)
    src = v.render(layer, v.fallback(layer, t), "k")
    stmts = asm_statements(src)
    mma = {"fp16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
           "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"}[precision]
    assert any(s[0].startswith(mma) for s in stmts), stmts
    if precision == "fp16":        # 4 accumulators in and out, 4 + 2 .f16x2 words
        assert stmts == [(mma + " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                                "{%0, %1, %2, %3};", ["+f"] * 4 + ["r"] * 6)]
    (tmp_path / "k.ptx").write_text(ptx_stub(stmts))
    run = subprocess.run([ptxas, "--gpu-name", "sm_90", str(tmp_path / "k.ptx"), "-o",
                          str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr + ptx_stub(stmts)
    assert (tmp_path / "k.cubin").stat().st_size > 0
    # and the assembler does refuse a wrong operand count: the check can fail
    (tmp_path / "bad.ptx").write_text(ptx_stub([(stmts[-1][0].replace("{%8, %9}", "{%8}")
                                                 if precision == "fp16" else
                                                 stmts[-1][0].replace(", {%8, %9}", ""),
                                                 stmts[-1][1])]))
    bad = subprocess.run([ptxas, "--gpu-name", "sm_90", str(tmp_path / "bad.ptx"), "-o",
                          str(tmp_path / "bad.cubin")], capture_output=True, text=True)
    assert bad.returncode != 0


def test_nvidia_s_compiler_gets_the_ptx_and_every_other_the_emulation(monkeypatch):
    """The preprocessor gate of the two bodies, run through the C preprocessor with and
    without the macro NVIDIA's OpenCL compiler defines (cl_nv_compiler_options), and with
    the test-only switch rendered in."""
    cpp = shutil.which("cpp")
    if cpp is None:
        pytest.skip("no C preprocessor (cpp) here")
    layer = conv(**RESNET_3X3)
    cfg = F16.fallback(layer, with_precision(H100, "fp16"))

    def expanded(*defines):
        src = F16.render(layer, cfg, "k")
        return subprocess.run([cpp, "-P", *defines], input=src, capture_output=True,
                              text=True, check=True).stdout

    monkeypatch.delenv(EMULATE_ENV, raising=False)
    nv = expanded("-Dcl_nv_compiler_options")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in nv and "half_bits" not in nv
    other = expanded()
    assert "mma.sync" not in other and "half_bits(wa_ & 0xffffu)" in other
    # the staged epilogue's conversions: the cvt instructions, or their exact twins
    cfg = _with(cfg, EPI=1)
    nv = expanded("-Dcl_nv_compiler_options")
    for ins in ("cvt.rn.f16x2.f32", "cvt.f32.f16", "ld.global.nc.v4.u32"):
        assert ins in nv, ins
    assert "half_bits" not in nv and "vstore_half2_rte" not in nv
    other = expanded()
    assert "asm" not in other and "half_bits((w0) & 0xffffu)" in other
    monkeypatch.setenv(EMULATE_ENV, "1")
    assert "mma.sync" not in expanded("-Dcl_nv_compiler_options")


# -- on PoCL: the emulated mma ------------------------------------------------------------------

# id -> (input shape, attributes, residual); odd sizes leave partial tiles in M, N and K
SHAPES = {
    "k1_odd_channels": ((2, 19, 7, 5), dict(out=33, kernel=1), False),
    "k3_s2_p1_nobias": ((1, 8, 11, 9), dict(out=16, kernel=3, stride=2, pad=1, bias=False), False),
    "k3_odd_channels_relu": ((2, 13, 9, 11), dict(out=20, kernel=3, pad=1, act="relu"), False),
    "k3_residual_relu": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu"), True),
    "k7_s2_p3_tanh": ((1, 3, 17, 15), dict(out=8, kernel=7, stride=2, pad=3, act="tanh"), False),
    "k3x2_dilated_asym": ((1, 5, 10, 9), dict(out=7, kernel=[3, 2], stride=[1, 2],
                                              dilation=[2, 1], pad=[2, 0]), False),
}
SLOW = ("k7_s2_p3_tanh", "k3x2_dilated_asym")


@functools.lru_cache(maxsize=None)
def case(lid):
    shape, attrs, res = SHAPES[lid]
    layer = conv(shape, res=res, **attrs)
    rng = np.random.default_rng(zlib.crc32(lid.encode()))
    xs, prm = harness.random_inputs(layer, rng)
    return layer, xs, prm


def check_point(layer, xs, prm, cfg, target, ctx):
    out = harness.run_layer(layer, F16, cfg, xs, prm, target=target, ctx=ctx)
    return check_half_output(layer, xs, prm, cfg, out)


@pytest.mark.parametrize("lid", [pytest.param(lid, marks=pytest.mark.slow) if lid in SLOW
                                 else lid for lid in SHAPES])
def test_emulated_conv_mma_f16_against_the_reference(emulated, lid):
    """The fallback and one point from the middle of the space (other tiles, warps, DBUF)."""
    target, ctx = emulated
    layer, xs, prm = case(lid)
    pts = _part(layer, target).points
    for cfg in (F16.fallback(layer, target), pts[len(pts) // 2]):
        check_point(layer, xs, prm, cfg, target, ctx)


@pytest.mark.parametrize("epi", [0, 1])
def test_float_input_stores_the_bits_of_the_cast_input(emulated, epi):
    """Read as float (a network's input, its cast fused in: aotconv.layouts.fuse_casts), the
    kernel rounds each value to half as it packs it: the half-input kernel's output on the
    input the cast would have stored, bit for bit, with both epilogues and both bounds of
    the image (a 7x7 strided and padded over 3 channels, ResNet-50's first layer in small)."""
    target, ctx = emulated
    layer, xs, prm = case("k7_s2_p3_tanh")
    floating = replace(layer, attrs=dict(layer.attrs, src_storage="fp32"))
    x = (xs[0] * np.float32(1 + 2.0 ** -13)).astype(np.float32)     # between halves
    rounded = x.astype(np.float16).astype(np.float32)
    assert not np.array_equal(x, rounded)
    cfg = next(c for c in _part(layer, target).points if c["EPI"] == epi)
    assert "__global const float* restrict x" in F16.render(floating, cfg, "k")
    assert "__global const ushort* restrict x" in F16.render(layer, cfg, "k")
    got = harness.run_layer(floating, F16, cfg, [x], prm, target=target, ctx=ctx)
    want = harness.run_layer(layer, F16, cfg, [rounded], prm, target=target, ctx=ctx)
    assert np.array_equal(got, want)
    check_half_output(floating, [x], prm, cfg, got)


# id -> (input shape, attributes, residual, the EPI = 1 point's other knob values): across them
# tails in M (K not a multiple of BM) and N (N*P*Q not a multiple of BN), bias or none, a
# residual or none, relu, tanh and leaky_relu (the slow tier: every other activation), DBUF 0
# and 1, PAD 0, a pass of more work-items than vectors, a pass larger than the tiles
STAGED = {
    "tails_residual_tanh": ((2, 19, 4, 6), dict(out=33, kernel=1, act="tanh"), True,
                            dict(BM=64, BN=64, DBUF=1)),
    "residual_nobias_relu_pad0": ((2, 16, 8, 8), dict(out=32, kernel=3, pad=1, act="relu",
                                                      bias=False), True,
                                  dict(DBUF=0, PAD=0)),
    "half_a_pass_leaky": ((1, 8, 16, 12), dict(out=24, kernel=3, pad=1, act="leaky_relu",
                                               alpha=0.1), False,
                          dict(BN=32, WN=4, WM=1)),
    "pass_beyond_the_tiles": ((1, 16, 12, 12), dict(out=72, kernel=1), True,
                              dict(BM=128, BN=128, BK=16, WM=4, WN=1, PAD=0, DBUF=0)),
    **{f"act_{a}": ((1, 8, 4, 8), dict(out=16, kernel=3, pad=1, act=a, **extra), False,
                    dict(DBUF=0))
       for a, extra in (("sigmoid", {}), ("relu6", {}), ("clip", dict(min=-0.5, max=0.25)),
                        ("hardsigmoid", dict(alpha=0.3, beta=0.4)), ("hardswish", {}),
                        ("silu", {}), ("gelu", {}), ("gelu_tanh", {}))},
}


@pytest.mark.parametrize("sid", [pytest.param(sid, marks=pytest.mark.slow)
                                 if sid.startswith("act_") else sid for sid in STAGED])
def test_the_staged_epilogue_is_bitwise_the_direct_one(emulated, sid):
    """EPI = 1 stores exactly what EPI = 0 stores at the same point (the same FP32 sums, bias,
    residual, activation and rounding, per element), and so matches the float64 reference
    within the half tolerance; its local memory is what PoCL reports for the kernel."""
    target, ctx = emulated
    shape, attrs, res, want = STAGED[sid]
    layer = conv(shape, res=res, **attrs)
    xs, prm = harness.random_inputs(layer, np.random.default_rng(zlib.crc32(sid.encode())))
    staged = _pick(layer, target, EPI=1, **want)
    p = F16.template_params(layer, staged)
    if sid.startswith("tails"):
        assert p["MCHK"] and p["NCHK"]
    if sid.startswith("half_a_pass"):
        assert p["ECHK"]
    if sid == "pass_beyond_the_tiles":
        assert p["SMEM"] == 64 * (128 + 8) > 2 * 8 * 128
    program = harness.build(ctx[0], F16.render(layer, staged, "k"))
    dev = harness.context_for(POCL)[2]
    info = harness.cl().kernel_work_group_info.LOCAL_MEM_SIZE
    assert max(k.get_work_group_info(info, dev) for k in program.all_kernels()) == \
        F16.local_mem_bytes(layer, staged)
    got = check_point(layer, xs, prm, staged, target, ctx)
    direct = harness.run_layer(layer, F16, _with(staged, EPI=0), xs, prm, target=target,
                               ctx=ctx)
    assert np.array_equal(got, direct), f"{np.mean(got != direct):.3%} differ"


def test_the_header_and_report_name_the_layers_on_the_tensor_cores():
    from aotconv.choose import Choice
    from aotconv.precision import summary
    layer = conv((1, 16, 8, 8), out=16, kernel=3, pad=1)
    cfg = F16.fallback(layer, with_precision(H100, "fp16"))
    choices = {"c2": Choice(F16.name, cfg), "c1": Choice(F16.name, cfg),
               "c3": Choice("conv_direct", Config({})),
               # a conv with its pool fused in is a conv layer, on the tensor cores or not
               "c4": Choice("conv_wgmma_halo_pool_f16_nhwc", Config({})),
               "c5": Choice("conv_pool_direct", Config({}))}
    kind, text = summary(choices, "fp16", "fp16")
    assert kind == "fp16" and text.endswith(
        "FP32 math and accumulation in every layer, on the tensor cores (f16 products, exact in "
        "FP32) in 3 of 5 conv and dense layers (c1, c2, c4)")
    # without it the sentence stops at the math
    kind, text = summary({"c3": choices["c3"]}, "fp16", "fp16")
    assert text.endswith("FP32 math and accumulation in every layer")


# -- on an NVIDIA GPU: the inline PTX -----------------------------------------------------------

@pytest.fixture
def gpu():
    from devices import h100_tensor_cores
    return h100_tensor_cores("fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("lid", list(SHAPES))
def test_ptx_conv_mma_f16_against_the_reference(gpu, lid, monkeypatch):
    """The tensor cores on the fallback and points across the space, each within the half
    tolerance and one half ulp of the half model; the driver's binary holds the f16 mma, and
    the emulation on the same device stores the same halves but where the two sum orders
    fall on the two sides of a rounding (one half ulp). Where P*Q % 8 == 0 the fallback's
    twin with the staged epilogue (EPI = 1, unmeasured on hardware before) stores bitwise what
    the fallback stores, through 16-byte stores."""
    target, ctx = gpu
    layer, xs, prm = case(lid)
    pts = _part(layer, target).points
    fb = F16.fallback(layer, target)
    fb_out = check_point(layer, xs, prm, fb, target, ctx)
    twin = _with(fb, EPI=1)
    if twin in pts:
        assert b"st.global.v4" in harness.build(ctx[0], F16.render(layer, twin, "k")).binaries[0]
        assert np.array_equal(check_point(layer, xs, prm, twin, target, ctx), fb_out)
    for cfg in pts[::max(1, len(pts) // 6)][:6]:
        out = check_point(layer, xs, prm, cfg, target, ctx)
    ptx = harness.build(ctx[0], F16.render(layer, cfg, "k")).binaries[0]
    assert b"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    monkeypatch.setenv(EMULATE_ENV, "1")
    emu = check_point(layer, xs, prm, cfg, target, ctx)
    assert harness.close(out, emu, 2.0 ** -10)[0] and np.mean(out == emu) > 0.98


@pytest.mark.slow
@pytest.mark.parametrize("lid", list(SHAPES))
def test_emulated_conv_mma_f16_over_its_space(emulated, lid):
    target, ctx = emulated
    layer, xs, prm = case(lid)
    pts = _part(layer, target).points
    for i in range(5):
        check_point(layer, xs, prm, pts[i * (len(pts) - 1) // 4], target, ctx)


def test_every_finite_half_passes_through_exactly(emulated):
    """An identity 1x1 conv over all 63488 finite halves (subnormals, zeros, the largest): the
    fragment exchange puts every value at its own channel and the decoding of the bits is
    exact, so the output is the input."""
    target, ctx = emulated
    bits = np.arange(1 << 16, dtype=np.uint16)
    vals = bits.view(np.float16)
    vals = vals[np.isfinite(vals)].astype(np.float32)
    assert vals.size == 16 * 62 * 64
    layer = conv((1, 16, 62, 64), out=16, kernel=1, bias=False)
    x = vals.reshape(1, 16, 62, 64)
    w = np.eye(16, dtype=np.float32).reshape(16, 16, 1, 1)
    out = harness.run_layer(layer, F16, F16.fallback(layer, target), [x], {"weight": w},
                            target=target, ctx=ctx)
    assert np.array_equal(out, x)


# -- an fp16 library on PoCL --------------------------------------------------------------------

NET = """name: halfmma
input: [2, 8, 9, 9]
layers:
  - {name: c1, op: conv, out: 16, kernel: 3, pad: 1, bias: false}
  - {name: bn1, op: batchnorm}
  - {name: r1, op: relu}
  - {name: c2, op: conv, out: 24, kernel: 3, stride: 2, act: relu}
  - {name: gap, op: global_avgpool}
  - {name: fc, op: dense, out: 5}
"""


@pytest.mark.slow
def test_an_fp16_library_runs_it_and_checks_against_the_half_model(emulated, tmp_path,
                                                                    monkeypatch):
    """conv_mma_f16 recorded fastest for both convs (one with a batchnorm folded into it, its
    folded weight rounded to half by set_params and packed from there): the fp16 build runs
    it in both, and --check against the half model passes."""
    from aotconv.compiler import compile_network
    from aotconv.context import BuildContext
    from aotconv.passes import optimise
    from aotconv.precision import stored
    from aotconv.spec import load_network
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    (tmp_path / "halfmma.yaml").write_text(NET)
    db = tmp_path / "records.jsonl"
    with BuildContext.make("pocl-cpu", mode="records", precision="fp16") as ctx:
        store = Store(write=[db])
        net = stored(optimise(load_network(str(tmp_path / "halfmma.yaml"))), "fp16")
        for name in ("c1", "c2"):
            layer = net.layer(name)
            store.append(Key(layer, F16, ctx.target, ctx.device),
                         F16.fallback(layer, ctx.target), Outcome(Status.OK, 1e-3, (1e-3,)))
    res = compile_network(str(tmp_path / "halfmma.yaml"), target="pocl-cpu",
                          outdir=tmp_path / "out", tune_mode="records", tuning_db=str(db),
                          check=True, quiet=True, precision="fp16")
    assert {n: c.variant for n, c in res.schedule.choices.items()
            if n in ("c1", "c2")} == {"c1": F16.name, "c2": F16.name}
    assert res.check_reference.startswith("the float64 numpy reference with every weight")
    assert res.check_error is not None and res.check_error <= protocol.TOLERANCE
    header = (tmp_path / "out" / "halfmma.h").read_text()
    assert '#define AOTCONV_HALFMMA_PRECISION "fp16"' in header
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("on the tensor cores (f16 products, exact in FP32) in 2 of 3 conv and dense layers "
            "(c1, c2)") \
        in report

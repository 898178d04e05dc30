"""Every variant's local-memory estimate counts what its kernels declare.

aotconv.space prunes a point whose `local_mem_bytes` exceeds the target's local memory per
work-group (device.local_mem) or its share of a compute unit's (device.occupancy_local_mem).
A compiler counts every `__local` a kernel declares: the tiles as declared (rounded up to the
whole vectors they are declared in) and any flag beside them. An estimate below that lets a
point through that the device compiler then refuses (ptxas: "uses too much shared data
(0xc004 bytes, 0xc000 max)" for a conv_igemm point whose tiles were exactly 48 KiB and whose
split-K flag was not counted), and a library built from it loses its embedded binary.

Device-free: the point that ptxas refused is pruned on the h100 profile by the local
memory limit alone, and every variant whose template declares local memory is in the device
check below. Device (PoCL): for each of those variants, a few points of its pruned space on
representative layers (the largest estimate, the knob values that change the declarations,
a seeded greedy cover of the other knob values) are rendered and built, and the estimate
equals the local memory PoCL reports for the program's kernels (the largest of them). PoCL
reports the sum of the __local sizes a kernel keeps (checked first on a known kernel); it
drops only what the optimiser removes, so an exact estimate may exceed it there, never the
reverse.
"""
import functools
import random
import re

import pytest

from aotconv import harness, ops
from aotconv.context import with_precision
from aotconv.graph import Layer
from aotconv.space import constraints_of, point_ok, variant_space
from aotconv.targets import TARGETS
from aotconv.variants import BY_NAME, VARIANTS
from aotconv.variants.base import TEMPLATE_DIR, Config
from aotconv.variants.conv_mma import EMULATE_ENV
from devices import pocl_present

POCL = TARGETS["pocl-cpu"]
H100 = TARGETS["h100"]


def layer(op, in_shape, storage="fp32", name="l", **raw):
    a = ops.normalise(op, dict(raw))
    if storage == "fp16":
        a["storage"] = "fp16"
    out, params = ops.infer(op, a, [tuple(in_shape)])
    return Layer(name, op, a, ["input"], in_shapes=[tuple(in_shape)], out_shape=out,
                 params=params)


def layout_convert(shape, src, dst):
    return Layer("lc", "layout_convert", dict(src=src, dst=dst), ["input"],
                 in_shapes=[tuple(shape)], out_shape=tuple(shape))


# ResNet-50's layer2.0.conv1 at batch 1, and the point of it that ptxas refused
RESNET_L2_CONV1 = dict(in_shape=(1, 256, 56, 56), out=128, kernel=1, act="relu")
REFUSED = Config((("MDIM", 32), ("NDIM", 16), ("MBLK", 128), ("NBLK", 64), ("KBLK", 32),
                  ("VW", 4), ("UNROLL", 1), ("LPAD", 0), ("DBUF", 1), ("LAYOUT", "NCHW"),
                  ("KSPLIT", 2), ("TAPSTEP", 0), ("KTAIL", 0)))


# -- device-free --------------------------------------------------------------------------------

def test_the_split_k_point_ptxas_refused_is_pruned_by_the_local_memory_limit():
    l, v = layer("conv", **RESNET_L2_CONV1), BY_NAME["conv_igemm"]
    # tiles of exactly 48 KiB and the split-K arrival flag: 0xc004 bytes, as ptxas counted
    assert v.local_mem_bytes(l, REFUSED) == 0xc004 > H100.local_mem_bytes
    failed = [c.name for c in constraints_of(v, H100) if not c.check(l, REFUSED, H100)]
    assert failed == ["device.local_mem"]
    assert not point_ok(l, v, REFUSED, H100)
    assert REFUSED not in variant_space(l, v, H100, explain=False).members
    # the same tiles without split-K are exactly the limit, and stay
    whole = Config(tuple((k, 1 if k == "KSPLIT" else x) for k, x in REFUSED.items))
    assert v.local_mem_bytes(l, whole) == 0xc000
    assert [c.name for c in constraints_of(v, H100) if not c.check(l, whole, H100)] == []


# a declaration: `__local type name[...]` or `__local type name;`, not a pointer into one
_DECLARES_LOCAL = re.compile(r"^\s*__local\s+(?:const\s+)?\w+\s+\w+\s*(?:\[|;)", re.M)
_NAMESPACE = re.compile(r"""<%namespace\s[^>]*file=["']([^"']+)["']""")


def _template_text(path, seen=None):
    """A template's text with that of the templates it pulls in (Mako namespaces)."""
    seen = set() if seen is None else seen
    if path in seen:
        return ""
    seen.add(path)
    text = (TEMPLATE_DIR / path).read_text()
    base = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    return text + "".join(_template_text(base + f, seen) for f in _NAMESPACE.findall(text))


def test_the_device_check_covers_every_variant_that_declares_local_memory():
    declaring = {v.name for v in VARIANTS if _DECLARES_LOCAL.search(_template_text(v.template))}
    assert {"conv_igemm", "conv_1x1", "conv_im2col", "softmax_direct"} <= declaring
    assert declaring == {name for name, _, _, _ in CASES}


def test_the_sgemm_core_declares_its_tiles_where_its_users_see_them():
    """conv_im2col, conv_winograd and dense_gemm declare their tiles through _sgemm.mako."""
    for name in ("conv_im2col", "conv_winograd", "dense_gemm"):
        assert _DECLARES_LOCAL.search(_template_text(BY_NAME[name].template)), name


# -- PoCL -------------------------------------------------------------------------------------

needs_pocl = pytest.mark.skipif(not pocl_present(), reason="PoCL not available")


def _kernels_local(source):
    """{kernel name: local memory PoCL reports} of a program built from `source`."""
    ctx, _, dev = harness.context_for(POCL)
    cl = harness.cl()
    prog = harness.build(ctx, source)
    return {k.function_name: k.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, dev)
            for k in prog.all_kernels()}


@needs_pocl
def test_pocl_reports_the_sum_of_the_local_arrays_a_kernel_keeps():
    """What the device check relies on: PoCL's LOCAL_MEM_SIZE of a kernel is the sum of its
    __local declarations as declared, float4 arrays and a lone int included."""
    got = _kernels_local("""
__kernel void tiles(__global float* y, __global int* n)
{
    __local float4 a[25];
    __local float b[3][7];
    __local int flag;
    const int i = get_local_id(0);
    if (i == 0)
        flag = atomic_add(n, 1);
    ((__local float*)a)[i % 100] = y[i];
    b[i % 3][i % 7] = y[i + 1];
    barrier(CLK_LOCAL_MEM_FENCE);
    y[get_global_id(0)] = ((__local float*)a)[99 - i % 100] + b[2 - i % 3][6 - i % 7] + flag;
}
__kernel void none(__global float* y) { y[get_global_id(0)] = 1.0f; }
""")
    assert got == {"tiles": 16 * 25 + 4 * 21 + 4, "none": 0}


H100_TF32 = with_precision(H100, "tf32")
H100_FP16 = with_precision(H100, "fp16")


def _knob_is(name, pred):
    return lambda c: pred(c[name])


# (variant, layer, target, points that must be among those checked: the knob values that
# change what the template declares). The targets are where the big tiles are: the rendered
# kernel does not depend on the target, and PoCL builds any of them.
CASES = [
    ("conv_igemm", "resnet_l2_conv1", H100,
     (_knob_is("KSPLIT", lambda k: k > 1), _knob_is("LPAD", bool), _knob_is("DBUF", lambda d: not d))),
    ("conv_igemm", "k3_64to96", H100, (_knob_is("TAPSTEP", bool),)),
    ("conv_1x1", "k1_64to96", H100, (_knob_is("VW", lambda w: w > 1),)),
    ("conv_im2col", "k3_32to48", H100, (_knob_is("KSPLIT", lambda k: k > 1),)),
    ("conv_winograd", "k3_32to48", H100, ()),
    ("conv_depthwise", "dw3_s2", H100, (_knob_is("LMEM", bool),)),
    ("conv_dwpw", "dwpw_96to24", H100, (_knob_is("CB", lambda c: c == 32),)),
    ("conv_mma", "k3_64to64", H100_TF32, (_knob_is("DBUF", lambda d: not d),)),
    ("conv_mma_f16", "k3_64to64_half", H100_FP16, (_knob_is("DBUF", lambda d: not d),)),
    ("conv_mma_f16_nhwc", "k3_64to64_half", H100_FP16,
     (_knob_is("LDSM", bool), _knob_is("CPASYNC", bool))),
    ("conv_mma_f16_stem", "k3_3to64_half", H100_FP16, (_knob_is("EPI", bool),
                                                       _knob_is("EPI", lambda e: not e))),
    ("conv_wgmma_f16_nhwc", "k3_64to64_half", H100_FP16,
     (_knob_is("DBUF", bool), _knob_is("CPASYNC", bool), _knob_is("EPI", bool))),
    ("conv_wgmma_halo_f16_nhwc", "k3_64to64_half", H100_FP16,
     (_knob_is("HBUF", lambda h: h == 1), _knob_is("WAIT", bool), _knob_is("EPI", bool))),
    ("conv_wgmma_halo_pool_f16_nhwc", "k3_16to32_pool_half", H100_FP16,
     (_knob_is("HBUF", lambda h: h == 1),)),
    ("conv_mma_tf32_nhwc", "k3_64to64", H100_TF32,
     (_knob_is("LDSM", bool), _knob_is("CPASYNC", bool), _knob_is("EPI", bool))),
    ("dense_direct", "dense_512to100", H100, (_knob_is("RED", lambda r: r == "group"),)),
    ("dense_gemv", "dense_512to100", H100, ()),
    ("dense_gemm", "dense_b32_256to200", H100, ()),
    ("dense_mma_f16", "dense_b17_512to100_half", H100_FP16,
     (_knob_is("KSPLIT", lambda k: k > 1), _knob_is("WARPS", lambda w: w == 16))),
    ("global_avgpool_direct", "gap_64x7x7", H100, (_knob_is("RED", lambda r: r == "group"),)),
    ("softmax_direct", "softmax_1000", H100, (_knob_is("RED", lambda r: r == "group"),)),
    ("layout_convert", "nchw_to_nhwc", H100, (_knob_is("TILE", bool),)),
]


@functools.lru_cache(maxsize=None)
def layer_of(lid):
    if lid == "nchw_to_nhwc":
        return layout_convert((2, 19, 5, 7), "NCHW", "NHWC")
    if lid == "k3_16to32_pool_half":          # a conv with a 2x2 max pool fused
        c = layer("conv", (1, 16, 28, 28), name="c", out=32, kernel=3, pad=1, storage="fp16")
        a = dict(c.attrs, pool=ops.pool_attrs("max", ops.normalise("maxpool", {"kernel": 2})))
        o, params = ops.infer("conv_pool", a, c.in_shapes)
        return Layer("c", "conv_pool", a, ["input"], in_shapes=c.in_shapes, out_shape=o,
                     params=params)
    if lid == "dwpw_96to24":                  # a depthwise conv fused into a pointwise conv
        from aotconv.passes import dwpw_layer
        dw = layer("conv", (1, 96, 14, 14), name="dw", out=96, kernel=3, pad=1, groups=96)
        return dwpw_layer(dw, layer("conv", dw.out_shape, name="pw", out=24, kernel=1))
    op, shape, raw = {
        "resnet_l2_conv1": ("conv", RESNET_L2_CONV1["in_shape"],
                            {k: x for k, x in RESNET_L2_CONV1.items() if k != "in_shape"}),
        "k3_64to96": ("conv", (1, 64, 28, 28), dict(out=96, kernel=3, pad=1)),
        "k1_64to96": ("conv", (1, 64, 14, 14), dict(out=96, kernel=1)),
        "k3_32to48": ("conv", (1, 32, 15, 15), dict(out=48, kernel=3, pad=1)),
        "dw3_s2": ("conv", (1, 32, 29, 29), dict(out=32, kernel=3, stride=2, pad=1, groups=32)),
        "k3_64to64": ("conv", (1, 64, 28, 28), dict(out=64, kernel=3, pad=1)),
        "k3_64to64_half": ("conv", (1, 64, 28, 28), dict(out=64, kernel=3, pad=1,
                                                         storage="fp16")),
        "k3_3to64_half": ("conv", (1, 3, 28, 28), dict(out=64, kernel=3, pad=1,
                                                       storage="fp16")),
        "dense_512to100": ("dense", (2, 512, 1, 1), dict(out=100)),
        "dense_b32_256to200": ("dense", (32, 256, 1, 1), dict(out=200)),
        "dense_b17_512to100_half": ("dense", (17, 512, 1, 1), dict(out=100, storage="fp16")),
        "gap_64x7x7": ("global_avgpool", (2, 64, 7, 7), {}),
        "softmax_1000": ("softmax", (2, 1000, 1, 1), {}),
    }[lid]
    return layer(op, shape, **raw)


def sample(variant, l, target, must, extra=2, seed=0):
    """The point of the largest estimate, one point per `must` predicate, and `extra` more
    that cover knob values not yet covered (greedily, from a seeded sample of the space)."""
    points = list(variant_space(l, variant, target, explain=False).points)
    assert points, f"{variant.name}: no valid point for {l.in_shape} on {target.name}"
    rng = random.Random(seed)
    chosen = [max(points, key=lambda c: variant.local_mem_bytes(l, c))]
    for pred in must:
        matching = [c for c in points if pred(c)]
        assert matching, f"{variant.name}: no valid point with a knob value the test needs"
        chosen.append(rng.choice(matching))
    pool = rng.sample(points, min(len(points), 300))
    for _ in range(extra):
        covered = {kv for c in chosen for kv in c.items}
        best = max(pool, key=lambda c: len(set(c.items) - covered))
        if best in chosen:
            break
        chosen.append(best)
    return list(dict.fromkeys(chosen))


@needs_pocl
@pytest.mark.parametrize("name,lid,target,must", CASES,
                         ids=[f"{name}-{lid}" for name, lid, _, _ in CASES])
def test_the_estimate_is_the_local_memory_the_kernels_declare(name, lid, target, must,
                                                              monkeypatch):
    if name.startswith("conv_mma") or name == "dense_mma_f16":
        # the portable mma, as on PoCL: its fragment exchange is local memory too
        monkeypatch.setenv(EMULATE_ENV, "1")
    variant, l = BY_NAME[name], layer_of(lid)
    for cfg in sample(variant, l, target, must):
        got = _kernels_local(variant.render(l, cfg, "k"))
        assert variant.local_mem_bytes(l, cfg) == max(got.values()), f"{name}[{cfg}]: {got}"

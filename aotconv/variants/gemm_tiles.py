"""The tiled SGEMM core shared by conv_im2col, conv_winograd and dense_gemm: its knobs, named
constraints, local-memory and register estimates, launch geometry and template helpers.

The core (templates/kernels/_sgemm.mako) computes, per batch z of a 3-D NDRange,

    C[m][n] = sum_k A[k][m] * B[k][n]

with A and B *packed*: k-major, the other index contiguous, zero-padded to whole tiles
(Mp = round_up(M, MWG), Np = round_up(N, NWG), Kp = round_up(K, KWG)). Packing happens once in
set_params for weights and in one cheap run launch (im2col, Winograd input transform, input
transpose) for activations, so the hot loop has no bounds checks and every global load is a
coalesced, aligned VWM/VWN-wide vector. Knobs follow CLBlast's xgemm (MWG, NWG, KWG, MDIMC,
NDIMC, VWM, VWN; strided per-thread layout, STRM=STRN=1 in CLBlast's terms) plus PRE, a
register prefetch of the next K tile while the current one is multiplied.
"""
from .base import Knob, Constraint, Variant, ceil_div, pow2_at_least, round_up
from . import limits
from .kernel_text import vtype
from .limits import is_valid

GEMM_KNOBS = (
    Knob("MWG", (64, 128, 32, 16), "rows of C (M) per work-group tile"),
    Knob("NWG", (64, 128, 32, 16), "columns of C (N) per work-group tile"),
    Knob("KWG", (16, 32, 8), "K step: depth of the A and B tiles held in local memory"),
    Knob("MDIMC", (16, 8, 32), "work-items along M; each owns MWG/MDIMC rows"),
    Knob("NDIMC", (16, 8, 32), "work-items along N; each owns NWG/NDIMC columns"),
    Knob("VWM", (4, 2, 1), "vector width of A loads and of the M register block"),
    Knob("VWN", (4, 2, 1), "vector width of B loads, of the N register block and of C stores"),
    Knob("PRE", (1, 0), "prefetch the next K tile into registers during the multiply"),
)
GEMM_KNOB_NAMES = tuple(k.name for k in GEMM_KNOBS)


def _fallback_point(mwg, nwg):
    """The untuned point of a MWG x NWG tile: 16 work-items along a side of 64 or more, else 8;
    vectors of 4 along a side of 32 or more, else 2; a K step of 16 (8 for the 16 x 16 tile);
    the next K tile prefetched."""
    return dict(MWG=mwg, NWG=nwg, KWG=8 if mwg == nwg == 16 else 16,
                MDIMC=16 if mwg >= 64 else 8, NDIMC=16 if nwg >= 64 else 8,
                VWM=4 if mwg >= 32 else 2, VWN=4 if nwg >= 32 else 2, PRE=1)


# Preferred tiles for the untuned fallback, best-for-big-layers first; the last one passes
# every constraint below for any problem size and any target with >= 64 work-items.
_FALLBACKS = tuple(_fallback_point(m, n) for m, n in (
    (128, 128), (64, 128), (128, 64), (64, 64), (32, 64), (64, 32), (32, 32), (16, 64),
    (64, 16), (16, 32), (32, 16), (16, 16)))


def derived(cfg):
    """Names the template and the estimates use, derived from the knobs."""
    cfg = cfg.as_dict() if hasattr(cfg, "as_dict") else cfg
    mwi, nwi = cfg["MWG"] // cfg["MDIMC"], cfg["NWG"] // cfg["NDIMC"]
    threads = cfg["MDIMC"] * cfg["NDIMC"]
    return dict(MWI=mwi, NWI=nwi, MVI=mwi // max(1, cfg["VWM"]), NVI=nwi // max(1, cfg["VWN"]),
                THREADS=threads,
                ALOADS=cfg["KWG"] * cfg["MWG"] // (cfg["VWM"] * threads),
                BLOADS=cfg["KWG"] * cfg["NWG"] // (cfg["VWN"] * threads))


def est_registers(cfg):
    """A rough count of 32-bit registers per work-item: accumulators, operands, prefetch, ~20
    for addresses and loop state. The variants return it from registers(), and aotconv.space
    checks it against the target's per-thread budget and minimum occupancy."""
    cfg = cfg.as_dict()
    d = derived(cfg)
    regs = d["MWI"] * d["NWI"] + cfg["VWM"] + d["NWI"] + 20
    if cfg["PRE"]:
        regs += d["ALOADS"] * cfg["VWM"] + d["BLOADS"] * cfg["VWN"]
    return regs


def local_mem_bytes(cfg):
    return 4 * cfg["KWG"] * (cfg["MWG"] + cfg["NWG"])


def whole_vectors(axis, tile, threads, width):
    """`{axis}_tile_whole_vectors`: the `tile` knob's rows (m) or columns (n) are shared by
    `threads` work-items, each holding its part as whole `width`-wide vectors."""
    what = "rows" if axis == "m" else "columns"
    return Constraint(f"{axis}_tile_whole_vectors", "algorithm",
                      f"each work-item holds {tile}/{threads} {what} as whole {width}-wide vectors",
                      lambda l, c, t: c[tile] % (c[threads] * c[width]) == 0)


def gemm_constraints(dims):
    """The core's constraints; `dims(layer, cfg)["GEMM"]` is the problem's (M, N, K) before
    padding (dims_of)."""
    def ok_pow2(size, tile, floor):
        return tile <= max(floor, pow2_at_least(size))

    return (
        whole_vectors("m", "MWG", "MDIMC", "VWM"),
        whole_vectors("n", "NWG", "NDIMC", "VWN"),
        Constraint("a_tile_even_loads", "algorithm",
                   "every work-item loads the same whole number of A vectors per K tile",
                   lambda l, c, t: (c["KWG"] * c["MWG"]) % (c["MDIMC"] * c["NDIMC"] * c["VWM"]) == 0),
        Constraint("b_tile_even_loads", "algorithm",
                   "every work-item loads the same whole number of B vectors per K tile",
                   lambda l, c, t: (c["KWG"] * c["NWG"]) % (c["MDIMC"] * c["NDIMC"] * c["VWN"]) == 0),
        Constraint("accumulators_fit", "software",
                   "more than 128 accumulators per work-item spill registers on every compiler "
                   "we target",
                   lambda l, c, t: (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) <= 128),
        Constraint("m_tile_not_oversized", "software",
                   "a tile beyond the next power of two above M (floor 16) computes only padding",
                   lambda l, c, t: ok_pow2(dims(l, c)["GEMM"][0], c["MWG"], 16)),
        Constraint("n_tile_not_oversized", "software",
                   "a tile beyond the next power of two above N (floor 16) computes only padding",
                   lambda l, c, t: ok_pow2(dims(l, c)["GEMM"][1], c["NWG"], 16)),
        Constraint("k_tile_not_oversized", "software",
                   "a K step beyond the next power of two above K (floor 8) multiplies zeros",
                   lambda l, c, t: ok_pow2(dims(l, c)["GEMM"][2], c["KWG"], 8)),
        Constraint("whole_warps", "hardware",
                   "a work-group that is not a whole number of SIMD groups leaves lanes idle",
                   lambda l, c, t: (c["MDIMC"] * c["NDIMC"]) % t.simd_width == 0),
    )


def first_valid(variant, layer, target, extra_points, work_groups=None):
    """The untuned choice (limits.first_valid): the first fallback GEMM point, each merged with
    `extra_points` (dicts of the variant's own knobs in order of preference, e.g. split-K), valid
    for `layer` under `target` whose grid `work_groups(layer, cfg)` gives every compute unit a
    work-group; when none does, the valid point with the largest grid. Big tiles first:
    splitting K is cheaper than shrinking the tiles."""
    points = [dict(p, **extra) for p in _FALLBACKS for extra in extra_points]
    return limits.first_valid(variant, layer, target, points,
                              None if work_groups is None else lambda c: work_groups(layer, c))


_MEMO = {}


def layer_memo(layer, tag, fn):
    """fn(layer), remembered per layer object while its shapes and attributes stay the same:
    constraints run on every point of a space of ~10^5 points, and the layer-only part of
    their arithmetic need not be redone each time."""
    key = (id(layer), tag)
    hit = _MEMO.get(key)
    state = (tuple(map(tuple, layer.in_shapes)), tuple(layer.out_shape or ()), layer.attrs)
    if hit is not None and hit[0] is layer and hit[1] == state:
        return hit[2]
    if len(_MEMO) > 512:
        _MEMO.clear()
    value = fn(layer)
    _MEMO[key] = (layer, (state[0], state[1], dict(layer.attrs)), value)
    return value


_LAST = {}


def point_memo(layer, cfg, tag, fn):
    """fn(layer, cfg) for the point being judged: the space checks every constraint of one
    point in a row, so remembering the last point per tag saves most of the recomputation."""
    hit = _LAST.get(tag)
    if hit is not None and hit[0] is layer and hit[1] == cfg:
        return hit[2]
    value = fn(layer, cfg)
    _LAST[tag] = (layer, cfg, value)
    return value


def dims_of(tag, static, point):
    """`dims(layer, cfg=None)` of a variant: with no cfg, static(layer), its sizes that read no
    knob, remembered per layer; with a cfg, point(d, c) (d: a fresh copy of those sizes, c:
    the knobs as a dict) for the point being judged, which also gives GEMM (the core's M, N and
    K before padding), TILES (the work-groups of one GEMM launch), PACKED (floats of the packed
    weights) and SCRATCH (floats of scratch)."""
    def at_point(layer, cfg):
        return point(dict(layer_memo(layer, tag, static)), cfg.as_dict())

    def dims(layer, cfg=None):
        if cfg is None:
            return layer_memo(layer, tag, static)
        return point_memo(layer, cfg, tag, at_point)
    return dims


def split_k_constraints(reduction, dims):
    """The constraints of knob KSPLIT (K slices computed by separate work-groups, summed after):
    `reduction(layer)` is the length of K, `dims(layer, cfg)["TILES"]` the tile grid's
    work-groups."""
    return (
        Constraint("split_slices_deep", "software",
                   "each K slice must hold at least 4 K steps, or the partial-sum traffic costs "
                   "more than the parallelism gained",
                   lambda l, c, t: c["KSPLIT"] == 1 or
                   ceil_div(reduction(l), c["KSPLIT"]) >= 4 * c["KWG"]),
        Constraint("split_only_if_underfilled", "hardware",
                   "split-K pays only when the tile grid alone is smaller than two work-groups "
                   "per compute unit",
                   lambda l, c, t: c["KSPLIT"] == 1 or
                   dims(l, c)["TILES"] < 2 * t.compute_units * max(1, t.min_wg_per_cu)),
    )


class GemmVariant(Variant):
    """A variant around the core: the core's register and local-memory estimates, and as
    template parameters its sizes `dims(layer, cfg)` (dims_of), the core's names
    (template_names) and HAS_BIAS. It owns one buffer, `packed` (the packed weights, PACKED
    floats), and SCRATCH floats of scratch (the packed activations, partial sums)."""
    scratch = True
    dims = None                 # staticmethod(dims_of(...))
    packed = "wpack"

    def buffers(self, layer, cfg):
        return {self.packed: self.dims(layer, cfg)["PACKED"]}

    def scratch_floats(self, layer, cfg):
        return self.dims(layer, cfg)["SCRATCH"]

    def registers(self, layer, cfg):
        return est_registers(cfg)

    def local_mem_bytes(self, layer, cfg):
        return local_mem_bytes(cfg)

    def template_params(self, layer, cfg):
        d = dict(self.dims(layer, cfg))
        d.update(template_names(cfg))
        d["HAS_BIAS"] = bool(layer.attrs["bias"])
        return d


def launch_geometry(cfg, mp, np_, batches):
    """(gsize, lsize) of the core over a padded Mp x Np problem with `batches` in dimension 2."""
    g = (np_ // cfg["NWG"] * cfg["NDIMC"], mp // cfg["MWG"] * cfg["MDIMC"], batches)
    return g, (cfg["NDIMC"], cfg["MDIMC"], 1)


def template_names(cfg):
    """The names the core's template reads beyond the knobs: derived sizes and the vector
    types of A (realM) and B and C (realN)."""
    d = derived(cfg)
    d.update(realM=vtype(cfg["VWM"]), realN=vtype(cfg["VWN"]))
    return d


__all__ = ["GEMM_KNOBS", "GEMM_KNOB_NAMES", "GemmVariant", "dims_of", "gemm_constraints",
           "split_k_constraints", "local_mem_bytes", "is_valid", "first_valid", "launch_geometry",
           "template_names", "derived", "est_registers", "ceil_div", "round_up", "pow2_at_least"]

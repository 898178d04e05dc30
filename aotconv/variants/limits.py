"""The constraints every variant gets from the target, and what judges a point with them.

aotconv.space enumerates and prunes a variant's space with `constraints_of`: the variant's own
constraints (BEAST's algorithm / software / hardware levels) in level order, then these, added
for every variant as CLTune does:

- the target's limits: work-items per work-group and per dimension, local memory, the minimum
  occupancy in local memory and in registers, registers per work-item (variants that estimate
  them), the largest allocation;
- the index width of the kernels (`device.index_width`): every index they compute fits the
  32-bit ints they compute it in;
- for a variant that computes in less than FP32 (`precision`: TF32), the build's precision
  (`build.precision`): an fp32 build never runs it (aotconv.precision);
- in an fp16 build, for a variant without half storage (`half_storage`), `build.storage`: it
  runs in FP32 builds only. Added for fp16 builds alone, so an FP32 build's constraints are
  what they were.

`compute_capability` reads an NVIDIA device's compute capability (the tensor cores a variant
may ask for) through cl_nv_device_attribute_query.

`is_valid` and `first_valid` judge single points with the same constraints: what a variant's
fallback() picks from its preferred points is never pruned. This module sits below the space
and beside the variants, so that both read it and data flows one way: variants -> space.
"""
from .base import Config, Constraint, LEVELS, NoFallback, traced, whole

# cl_nv_device_attribute_query
CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV = 0x4000
CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV = 0x4001


def compute_capability(device):
    """(major, minor) of an NVIDIA OpenCL device (pyopencl), or () for a device without
    cl_nv_device_attribute_query (every other vendor's)."""
    try:
        if "cl_nv_device_attribute_query" not in device.extensions.split():
            return ()
        return (int(device.get_info(CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV)),
                int(device.get_info(CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV)))
    except Exception:                # a driver that lists the extension and fails the query
        return ()


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


class _Geometry:
    """The launches and buffers of the point being judged, computed once and shared by the
    limit checks: the run launches' local sizes and largest work-group, the work-items of every
    launch (run and setup), the sizes of the variant's own buffers and of its scratch. The
    constraints of one point are judged one after the other on the same Config, so only the
    last point is kept: a memo of every point would hold hundreds of thousands of objects that
    the garbage collector then walks over and over."""

    class _Point:
        __slots__ = ("lsizes", "wg", "work_items", "items", "sizes", "largest_own")

    def __init__(self, variant):
        self.variant = variant
        self._layer = self._cfg = self._point = self._largest = None

    def of(self, layer, cfg):
        if cfg is self._cfg and layer is self._layer:
            return self._point
        if layer is not self._layer:
            self._largest = None
        p = self._Point()
        p.lsizes, p.wg, p.work_items, p.items = traced(
            cfg, ("geometry", id(self)), lambda: self._launch_figures(layer, cfg))
        p.sizes = p.largest_own = None
        self._layer, self._cfg, self._point = layer, cfg, p
        return p

    def _launch_figures(self, layer, cfg):
        ls = self.variant.launches(layer, cfg, "k")
        lsizes = [tuple(l.lsize) for l in ls if l.lsize and l.phase == "run"]
        wg = max([_prod(s) for s in lsizes] or [1])
        work_items = [(l.kernel, l.phase, _prod(l.gsize)) for l in ls]
        # the largest work-item id extent, an elementwise launch's VEC elements each
        vec = cfg.get("VEC", 1)
        items = max([n * vec if ph == "run" else n for _, ph, n in work_items] or [0])
        return lsizes, wg, work_items, items

    def lsizes(self, layer, cfg):
        return self.of(layer, cfg).lsizes

    def wg(self, layer, cfg):
        return self.of(layer, cfg).wg

    def work_items(self, layer, cfg):
        """[(kernel, phase, global work-items)] of every launch."""
        return self.of(layer, cfg).work_items

    def sizes(self, layer, cfg, p=None):
        """(floats of each of the variant's own buffers, floats of its scratch); `p`: the
        point's entry, when the caller has it."""
        p = p or self.of(layer, cfg)
        if p.sizes is None:
            p.sizes = traced(cfg, ("sizes", id(self)),
                             lambda: (list(self.variant.buffers(layer, cfg).values()),
                                      self.variant.scratch_floats(layer, cfg)))
            p.largest_own = max(p.sizes[0] + [p.sizes[1]])
        return p.sizes

    def largest_own(self, layer, cfg, p=None):
        """Floats of the largest of the variant's own buffers and its scratch."""
        p = p or self.of(layer, cfg)
        if p.sizes is None:
            self.sizes(layer, cfg, p)
        return p.largest_own

    def largest_tensor(self, layer):
        if layer is not self._layer:
            self._layer, self._cfg, self._point, self._largest = layer, None, None, None
        if self._largest is None:
            self._largest = max(n for _, n in tensor_extents(layer))
        return self._largest


# -- index width -------------------------------------------------------------------------------
# Every kernel template indexes with OpenCL `int` (32 bits: faster address arithmetic on GPUs),
# and its sizes are `int` constants, so a kernel is correct only if every index it computes is
# an int. An extent is one past the largest index into something: a tensor, a padded buffer,
# the scratch, the work-item ids of a launch. The kernels compare indices with extents, so each
# extent must be an int itself, and a loop that strides by work-groups (`i += WG`; dense_gemv:
# U work-groups) computes one stride past its extent before it stops: each extent must be at
# most INT_MAX - stride + 1. A variant whose template indexes with 64-bit integers sets
# `index_bits = 64` and is exempt.

INDEX_LIMIT = 2 ** 31 - 1          # INT_MAX


def tensor_extents(layer):
    """[(what, elements)] of the tensors a layer's kernels index whatever the variant: its
    inputs, its output and its parameters."""
    out = [("input" if len(layer.in_shapes) == 1 else f"input {i}", _prod(s))
           for i, s in enumerate(layer.in_shapes)]
    out.append(("output", _prod(layer.out_shape)))
    out += [(name, _prod(shape)) for name, shape in layer.params]
    return out


def index_extents(variant, layer, cfg, geo=None):
    """[(what, extent)] of everything `cfg`'s kernels index: the layer's tensors, the variant's
    own buffers and its scratch (padding included), the global work-item ids of each launch,
    and for an elementwise launch (knob VEC, elements per work-item: work-item i indexes
    i*VEC .. i*VEC + VEC-1) work-items x VEC."""
    geo = geo or _Geometry(variant)
    out = tensor_extents(layer)
    out += [(f"buffer {n}", c) for n, c in variant.buffers(layer, cfg).items()]
    out.append(("scratch", variant.scratch_floats(layer, cfg)))
    vec = cfg.get("VEC", 1)
    for kernel, phase, items in geo.work_items(layer, cfg):
        out.append((f"work-items of {kernel}", items))
        if vec > 1 and phase == "run":
            out.append((f"elements indexed by {kernel}", items * vec))
    return out


def index_stride(variant, layer, cfg, geo=None):
    """The longest step a loop of `cfg`'s kernels takes past its extent: a work-group, or U of
    them where U vector loads per work-item are in flight (dense_gemv)."""
    geo = geo or _Geometry(variant)
    return geo.wg(layer, cfg) * cfg.get("U", 1)


def indices_fit(variant, layer, cfg, geo=None):
    """Does every index `cfg`'s kernels compute fit their 32-bit ints? (each of index_extents
    at most INT_MAX - index_stride + 1; computed here without naming them, for speed)"""
    if getattr(variant, "index_bits", 32) >= 64:
        return True
    geo = geo or _Geometry(variant)
    # the layer's own tensors first: they read no knob, so an oversized layer is pruned at
    # the root of the staged walk
    largest = geo.largest_tensor(layer)
    if largest > INDEX_LIMIT:
        return False
    whole(cfg)
    p = geo.of(layer, cfg)
    limit = INDEX_LIMIT - p.wg * cfg.get("U", 1) + 1          # index_stride
    return largest <= limit and p.items <= limit and geo.largest_own(layer, cfg, p) <= limit


def variant_buffers_fit(variant, layer, cfg, limit, geo=None):
    """Do the variant's own buffers and its scratch each fit one allocation of `limit` B?"""
    whole(cfg)
    return 4 * (geo or _Geometry(variant)).largest_own(layer, cfg) <= limit



def own_constraints(variant):
    """The variant's constraints in level order (algorithm, software, hardware)."""
    return sorted(variant.constraints, key=lambda c: LEVELS.index(c.level))


def device_constraints(variant, target):
    """The constraints every variant gets automatically: the target's limits (hardware level)
    and the index width of the kernels (software level)."""
    geo = _Geometry(variant)

    def local_mem(l, c):
        return traced(c, ("local_mem", id(variant)), lambda: variant.local_mem_bytes(l, c))

    out = [
        Constraint("device.wg_size", "hardware",
                   f"work-items per work-group above the device limit ({target.max_wg_size})",
                   lambda l, c, t: geo.wg(l, c) <= t.max_wg_size),
        Constraint("device.local_mem", "hardware",
                   f"local memory per work-group above the device's {target.local_mem_bytes} B",
                   lambda l, c, t: local_mem(l, c) <= t.local_mem_bytes),
        Constraint("device.index_width", "software",
                   f"an index the kernels compute (tensors, padding, scratch, work-item ids) "
                   f"past the {INDEX_LIMIT} that their 32-bit ints reach",
                   lambda l, c, t: indices_fit(variant, l, c, geo)),
    ]
    from ..precision import NAMES, STORAGE, allowing, allows, of_target, storage_reason
    wants = getattr(variant, "precision", "fp32")
    if wants != "fp32":
        out.append(Constraint(
            "build.precision", "hardware",
            f"the variant computes in {NAMES[wants]}: only a build of --precision "
            f"{' or '.join(allowing(wants))} runs it (docs/precision.md)",
            lambda l, c, t: allows(of_target(t), wants)))
    if not getattr(variant, "half_storage", False):
        if STORAGE[of_target(target)] == "fp16":
            out.append(Constraint(
                "build.storage", "hardware", storage_reason(variant) + " (docs/precision.md)",
                lambda l, c, t: STORAGE[of_target(t)] != "fp16"))
    if target.max_alloc_bytes:
        out.append(Constraint(
            "device.max_alloc", "hardware",
            f"a buffer of the variant (packed weights, scratch) larger than the device's largest "
            f"allocation ({target.max_alloc_bytes} B)",
            lambda l, c, t: variant_buffers_fit(variant, l, c, t.max_alloc_bytes, geo)))
    if target.max_wg_dims:
        out.append(Constraint(
            "device.wg_dims", "hardware",
            f"a work-group dimension above the device limit {tuple(target.max_wg_dims)}",
            lambda l, c, t: all(d <= m for s in geo.lsizes(l, c)
                                for d, m in zip(s, t.max_wg_dims))))
    # the work-groups a compute unit should hold: the target's, or fewer where the variant says
    # so for a point (min_wg_per_cu(layer, cfg, target), e.g. one large warpgroup work-group)
    occupancy = getattr(variant, "min_wg_per_cu", None) or (lambda l, c, t: t.min_wg_per_cu)
    if target.min_wg_per_cu > 1:
        per_cu = target.local_mem_per_cu or target.local_mem_bytes
        out.append(Constraint(
            "device.occupancy_local_mem", "hardware",
            f"fewer than {target.min_wg_per_cu} work-groups per compute unit fit in its "
            f"{per_cu} B of local memory (BEAST's minimum occupancy)",
            lambda l, c, t: occupancy(l, c, t) * local_mem(l, c) <= per_cu))
    own_regs = getattr(variant, "registers", None)
    if own_regs is not None:
        def regs(l, c):
            return traced(c, ("registers", id(variant)), lambda: own_regs(l, c))

        out.append(Constraint(
            "device.registers", "hardware",
            f"estimated registers per work-item above the device's {target.max_regs_per_thread}",
            lambda l, c, t: regs(l, c) <= t.max_regs_per_thread))
        if target.registers_per_cu:
            out.append(Constraint(
                "device.occupancy_registers", "hardware",
                f"fewer than {target.min_wg_per_cu} work-groups per compute unit fit in its "
                f"{target.registers_per_cu} registers",
                lambda l, c, t: occupancy(l, c, t) * geo.wg(l, c) * regs(l, c)
                <= t.registers_per_cu))
    return out



def constraints_of(variant, target):
    """The variant's own constraints in level order (algorithm, software, hardware), then the
    target's device limits: the order in which a point is checked."""
    return own_constraints(variant) + device_constraints(variant, target)


# -- single points -----------------------------------------------------------------------------

def is_valid(variant, layer, cfg, target):
    """Does `variant` handle `layer` and `cfg` pass every constraint of constraints_of? A
    constraint that raises propagates (fallback_point in aotconv.space rejects the point)."""
    if variant.supports(layer) is not None:
        return False
    return all(c.check(layer, cfg, target) for c in constraints_of(variant, target))


def first_valid(variant, layer, target, points, work_groups=None):
    """The untuned choice: the first of `points` (dicts of knob values, in order of preference)
    valid for `layer` under `target`, so that the fallback is never pruned. With
    `work_groups(cfg)`, the first valid point that gives every compute unit a work-group wins
    over earlier ones that would leave compute units idle (big tiles on a small layer); when
    none does, the first of those with the most work-groups. A point with a value its knob
    does not offer is skipped."""
    knobs = variant.knobs(layer, target)
    best, most = None, -1
    for p in points:
        if any(p[k.name] not in k.values for k in knobs):
            continue
        cfg = Config(tuple((k.name, p[k.name]) for k in knobs))
        if not is_valid(variant, layer, cfg, target):
            continue
        if work_groups is None:
            return cfg
        groups = work_groups(cfg)
        if groups >= target.compute_units:
            return cfg
        if groups > most:
            best, most = cfg, groups
    if best is None:
        raise NoFallback(f"{variant.name}: no fallback point is valid for layer '{layer.name}' "
                         f"on {target.name}")
    return best

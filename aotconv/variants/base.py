"""What a kernel variant declares: knobs, named constraints, launch geometry, FLOPs, buffers.

A variant is one Python class plus one Mako template. Everything the tuner, the emitter and the
tests need to know about it is declared here, in one place:

- `supports(layer)`: None when the variant handles the layer, else the reason it does not
  (its shape domain: groups, dilation, stride, kernel sizes...).
- `knobs(layer, target)`: the tunable parameters and their candidate values.
- `constraints`: named predicates at the three levels of the BEAST paper (algorithm, software,
  hardware), each with the reason it exists. The target's device limits (work-group size, local
  memory) are applied automatically by aotconv.space from `local_size` and `local_mem_bytes`.
- `fallback(layer, target)`: the configuration used untuned, valid under the target's limits
  whenever the variant has a valid point for the layer (else it raises NoFallback, or returns a
  point the space rejects: aotconv.space.fallback_point then offers none).
- `render(layer, cfg, prefix)`: the OpenCL source; every size a compile-time constant.
- `launches(layer, cfg, prefix)`: the kernels to enqueue, in order, with their arguments and
  global/local sizes. Launches with phase "setup" run once in set_params (weight re-layout).
- `buffers(layer, cfg)`: extra device buffers the variant needs (packed weights, scratch).
- `flops(layer)`, `bytes_moved(layer)`: for GFLOP/s, the roofline and budget sharing.
"""
from dataclasses import dataclass
from pathlib import Path
import hashlib
import itertools

from mako.lookup import TemplateLookup

from ..errors import AotconvError
from ..graph import count

TEMPLATE_DIR = Path(__file__).resolve().parent.parent.parent / "templates"
_lookup = TemplateLookup(directories=[str(TEMPLATE_DIR)], strict_undefined=True,
                         input_encoding="utf-8")

LEVELS = ("algorithm", "software", "hardware")


class NoFallback(AotconvError):
    """A variant has no valid fallback point for a layer (every point of its space is pruned
    under the target's limits); callers try another variant (aotconv.space.fallback_point)."""


@dataclass(frozen=True)
class Config:
    """A frozen, ordered assignment of knob values: hashable, so a cache key and a test id."""
    items: tuple = ()

    @classmethod
    def of(cls, **kw):
        return cls(tuple(kw.items()))

    @classmethod
    def from_dict(cls, d):
        return cls(tuple(d.items()))

    def __post_init__(self):
        # a lookup table beside the ordered items (not a field: equality and hash ignore it);
        # constraints read knobs millions of times while a space is enumerated
        object.__setattr__(self, "_map", dict(self.items))

    def __getitem__(self, name):
        return self._map[name]

    def get(self, name, default=None):
        return self._map.get(name, default)

    def as_dict(self):
        return dict(self.items)

    def __str__(self):
        return ",".join(f"{k}={v}" for k, v in self.items) or "-"


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple
    doc: str = ""


@dataclass(frozen=True)
class Constraint:
    """A named predicate over (layer, cfg, target); False prunes the point."""
    name: str
    level: str          # one of LEVELS
    reason: str
    check: object       # callable(layer, cfg, target) -> bool

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"constraint {self.name}: level must be one of {LEVELS}")


@dataclass(frozen=True)
class Arg:
    """One kernel argument.

    kind:  "in"      the layer's input tensor number `index`
           "out"     the layer's output tensor
           "param"   the layer's parameter tensor `name` as the user gave it (e.g. "weight")
           "buffer"  a variant buffer declared in `buffers()` (e.g. packed weights)
           "scratch" the network-wide scratch buffer
           "int" / "float"  a scalar `value`
    """
    kind: str
    name: str = ""
    index: int = 0
    value: object = None


def In(i=0):
    return Arg("in", index=i)


def Out():
    return Arg("out")


def Param(name):
    return Arg("param", name=name)


def Buffer(name):
    return Arg("buffer", name=name)


def Scratch():
    return Arg("scratch")


@dataclass(frozen=True)
class Launch:
    kernel: str                 # kernel function name in the rendered source
    args: tuple                 # of Arg
    gsize: tuple                # global work size (already a multiple of lsize)
    lsize: tuple = None         # local work size, or None to let the driver choose
    phase: str = "run"          # "run" every inference, "setup" once in set_params


def round_up(x, m):
    return (x + m - 1) // m * m


def ceil_div(a, b):
    return -(-a // b)


# -- what the one-dimensional variants share ----------------------------------------------------
# The direct variants (pooling, LRN, elementwise, the direct convolutions, the reductions)
# launch one flat range of work-items in work-groups of WG; these are their common knob,
# constraints and launch.

def wg_knob():
    return Knob("WG", (64, 32, 128, 256), "work-items per work-group")


def wg_fills_simd():
    return Constraint("wg_fills_simd", "hardware",
                      "a work-group smaller than the SIMD width (warp, wavefront) leaves lanes "
                      "idle", lambda layer, cfg, t: cfg["WG"] % t.simd_width == 0)


def wg_not_wasteful(items):
    """`items(layer, cfg)`: the work-items the launch needs before rounding up to WG."""
    return Constraint("wg_not_wasteful", "software",
                      "a work-group larger than the whole launch only adds idle work-items",
                      lambda layer, cfg, t: cfg["WG"] <= max(64, items(layer, cfg)))


def flat_launch(prefix, args, items, wg, phase="run"):
    """One launch of `items` work-items (rounded up to whole work-groups of `wg`)."""
    return Launch(prefix, args, (round_up(items, wg),), (wg,), phase)


def vec_items(layer, cfg):
    """Work-items of an elementwise launch over the output, VEC elements each."""
    return ceil_div(count(layer.out_shape), cfg["VEC"])


def vec_knob():
    return Knob("VEC", (1, 2, 4, 8), "elements per work-item")


def elementwise_constraints():
    """An elementwise launch: VEC elements per work-item, vec_items work-items."""
    return (
        Constraint("vec_not_wasteful", "software",
                   "a work-item block larger than the tensor only adds idle lanes",
                   lambda layer, cfg, t: cfg["VEC"] <= max(1, count(layer.out_shape))),
        wg_not_wasteful(vec_items),
        wg_fills_simd(),
    )


def channel_block_knob():
    return Knob("KB", (1, 2, 4, 8), "output channels per work-item (register block)")


def channel_block_constraints(items):
    """A direct convolution whose work-items compute KB output channels each; `items(layer,
    cfg)` is its launch's work-item count."""
    return (
        Constraint("kb_divides_group", "algorithm",
                   "a work-item's block of KB output channels must lie in one group, so that "
                   "it reads one set of input channels",
                   lambda layer, cfg, t: (layer.out_shape[1] // layer.attrs["groups"]) % cfg["KB"] == 0),
        wg_not_wasteful(items),
        wg_fills_simd(),
    )


def reduction_knobs(what):
    return [Knob("RED", ("item", "group"), f"one {what} per work-item or per work-group"),
            wg_knob()]


def reduction_constraints(units, width, width_name, width_reason):
    """The constraints of a variant with knob RED: "item" gives each of `units(layer)` outputs
    one work-item; "group" gives each a work-group whose work-items stride over `width(layer)`
    values and combine them by a tree in local memory."""
    return (
        Constraint("tree_needs_pow2", "algorithm",
                   "the local-memory reduction halves the work-group each step",
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] & (cfg["WG"] - 1) == 0),
        Constraint(f"group_not_wider_than_{width_name}", "software", width_reason,
                   lambda layer, cfg, t: cfg["RED"] == "item" or cfg["WG"] <= max(32, width(layer))),
        Constraint("wg_not_wasteful", "software",
                   "a work-group larger than the whole launch only adds idle work-items",
                   lambda layer, cfg, t: cfg["RED"] == "group" or cfg["WG"] <= max(64, units(layer))),
        wg_fills_simd(),
    )


def reduction_local_mem(cfg):
    return 4 * cfg["WG"] if cfg["RED"] == "group" else 0


def reduction_launch(prefix, args, units, cfg):
    """A work-item per unit (RED=item) or a work-group per unit (RED=group)."""
    wg = cfg["WG"]
    g = units * wg if cfg["RED"] == "group" else round_up(units, wg)
    return Launch(prefix, args, (g,), (wg,))


def conv_args(layer):
    """The arguments of a direct convolution or dense kernel: input, weight, [bias], output."""
    return (In(0), Param("weight")) + ((Param("bias"),) if layer.attrs["bias"] else ()) + (Out(),)


class Variant:
    """Base class; subclasses set the class attributes and override the methods."""
    name = None                 # unique, e.g. "conv_direct"
    ops = ()                    # ops it implements, e.g. ("conv",)
    template = None             # path under templates/, e.g. "kernels/conv_direct.cl.mako"
    layouts = ("NCHW", "NCHW")  # (reads, writes)
    constraints = ()            # tuple of Constraint
    scratch = False             # True if it uses the shared scratch buffer
    index_bits = 32             # the template's index type: int (aotconv.space checks every
                                # index it computes fits) or 64 for long

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        return None if layer.op in self.ops else f"{self.name} implements {self.ops}, not {layer.op}"

    def layouts_of(self, layer, cfg):
        """(layout of the input read, layout of the output written) by `cfg`: "NCHW", "CHWN" or
        "NHWC". Variants with a layout knob override this; NCHW/NCHW must stay in the space."""
        return self.layouts

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("WG", (64,), "work-group size")]

    def fallback(self, layer, target):
        """The untuned configuration: valid under `target`'s limits whenever the space has a
        valid point (callers check it: aotconv.space.fallback_point)."""
        return Config(tuple((k.name, k.values[0]) for k in self.knobs(layer, target)))

    def configs(self, layer, target):
        """Every point of the unpruned space, in knob order."""
        ks = self.knobs(layer, target)
        for values in itertools.product(*(k.values for k in ks)):
            yield Config(tuple(zip((k.name for k in ks), values)))

    def local_size(self, layer, cfg):
        """Work-items per work-group of the largest run launch (for the device limit)."""
        n = 1
        for l in self.launches(layer, cfg, "k"):
            if l.lsize and l.phase == "run":
                m = 1
                for d in l.lsize:
                    m *= d
                n = max(n, m)
        return n

    def local_mem_bytes(self, layer, cfg):
        return 0

    # -- code -----------------------------------------------------------------------------------
    def template_params(self, layer, cfg):
        """Extra names for the template beyond layer, cfg, prefix, attrs."""
        return {}

    def render(self, layer, cfg, prefix):
        t = _lookup.get_template(self.template)
        ns = dict(layer=layer, cfg=cfg.as_dict(), prefix=prefix, attrs=layer.attrs,
                  variant=self.name)
        ns.update(cfg.as_dict())
        ns.update(self.template_params(layer, cfg))
        return t.render(**ns)

    def launches(self, layer, cfg, prefix):
        raise NotImplementedError

    def buffers(self, layer, cfg):
        """{name: float count} of extra device buffers (packed weights...) this variant owns."""
        return {}

    def scratch_floats(self, layer, cfg):
        return 0

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, layer):
        from ..ops import flops
        return flops(layer)

    def bytes_moved(self, layer):
        from ..ops import bytes_moved
        return bytes_moved(layer)

    def template_hash(self):
        """Changes whenever the template or this variant's source changes: part of tuning keys."""
        import inspect
        h = hashlib.sha256()
        h.update((TEMPLATE_DIR / self.template).read_bytes())
        h.update(inspect.getsource(type(self)).encode())
        return h.hexdigest()[:16]

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
- `render(layer, cfg, prefix)`: the OpenCL source; every size a compile-time constant. The
  template's namespace holds `storage`, how the layer's tensors are stored (aotconv.precision:
  "fp32", or "fp16" in a --precision fp16 build), which templates/kernels/_common.mako's
  storage helpers (T, LOAD, STORE...) read; `half_storage = True` declares that the template
  renders half-storage kernels (the spaces of an fp16 build leave out the others).
- `launches(layer, cfg, prefix)`: the kernels to enqueue, in order, with their arguments and
  global/local sizes. Launches with phase "setup" run once in set_params (weight re-layout).
- `buffers(layer, cfg)`: extra device buffers the variant needs (packed weights, scratch).
- `flops(layer)`, `bytes_moved(layer)`: for GFLOP/s, the roofline and budget sharing.
"""
from dataclasses import dataclass
from pathlib import Path
import functools
import hashlib
import itertools
import threading

from mako.lookup import TemplateLookup

from ..errors import AotconvError

TEMPLATE_DIR = Path(__file__).resolve().parent.parent.parent / "templates"
_lookup = TemplateLookup(directories=[str(TEMPLATE_DIR)], strict_undefined=True,
                         input_encoding="utf-8")


# Reading a class's source and compiling a template both parse Python with `ast`, which
# CPython 3.11 cannot do from two threads at once (the tuner's lanes are threads).
_parse_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _class_source(cls):
    import inspect
    return inspect.getsource(cls)


def class_source(cls):
    """The source text of `cls`, read once."""
    with _parse_lock:
        return _class_source(cls)


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


class Unbound(BaseException):
    """A constraint read a knob that the partial point being judged has not set yet. A
    BaseException, so that a constraint's own `except Exception` cannot mistake it for a
    verdict."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _PartialDict(dict):
    """`as_dict()` of a partial point: reading an unset knob raises Unbound."""

    def __init__(self, items, names):
        super().__init__(items)
        self._names = names

    def __missing__(self, key):
        raise Unbound(key) if key in self._names else KeyError(key)

    def get(self, key, default=None):
        if key in self._names and not dict.__contains__(self, key):
            raise Unbound(key)
        return dict.get(self, key, default)


class Partial(Config):
    """The first knobs of a point (in knob order), judged before the rest are chosen
    (aotconv.space's staged walk)."""

    def __init__(self, items, names, last=None):
        super().__init__(items)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_last", last)          # the last knob in knob order

    def __getitem__(self, name):
        try:
            return self._map[name]
        except KeyError:
            raise (Unbound(name) if name in self._names else KeyError(name)) from None

    def get(self, name, default=None):
        if name in self._names and name not in self._map:
            raise Unbound(name)
        return self._map.get(name, default)

    def as_dict(self):
        return _PartialDict(self.items, self._names)


def whole(cfg):
    """For a constraint that reads every knob (launches, buffers): on a partial point of the
    staged walk, wait for the whole point instead of waking at each knob it reads in turn.
    (The one way a constraint tells a partial point from a whole one: aotconv.space_enum's
    probes hear of it.)"""
    if isinstance(cfg, Partial):
        raise Unbound(cfg._last)
    asked = getattr(type(cfg), "_asked", None)
    if asked is not None:
        asked(cfg)


def traced(cfg, key, fn):
    """fn(): something a constraint computes from the knobs of `cfg` alone (with the layer and
    target of the space being judged), such as a point's launches. aotconv.space_enum judges
    constraints on probes that hold only the knobs read so far; a probe remembers fn's value
    by the knobs fn read and their values (`key` names fn within the space), so that every
    constraint that needs a point's launches shares one computation of them. Anywhere else it
    is fn(). The value is shared: the caller must not change it."""
    hook = getattr(type(cfg), "_traced", None)
    return fn() if hook is None else hook(cfg, key, fn)


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


def pow2_at_least(x):
    """The smallest power of two >= x (1 for x <= 1)."""
    p = 1
    while p < x:
        p *= 2
    return p


def bias_arg(layer):
    """The bias argument of a layer's epilogue: (Param("bias"),), or () for a layer without."""
    return (Param("bias"),) if layer.attrs["bias"] else ()



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
    half_storage = False        # True: renders half-storage kernels (--precision fp16), its
                                # own buffers and scratch staying FP32 (docs/precision.md)
    reads_float = False         # True: in an fp16 build it may read a float input (a network
                                # input), rounding each value to half as it reads it, so the
                                # cast before it is fused into it (aotconv.layouts)
    writes_float = False        # True: in an fp16 build it may write a float output (a layer
                                # without parameters producing a network output), so the cast
                                # after it is fused into it (aotconv.layouts)
    includes = ()               # the shared templates the template renders defs of (paths
                                # under templates/, e.g. "kernels/_mma_f16.mako"): hashed with it
    added_knobs = ()            # ((name, value), ...): knobs added after records of the
                                # variant were made, last in knob order, each with the value
                                # whose kernel those records ran (Variant.completed)

    # -- domain ---------------------------------------------------------------------------------
    def supports(self, layer):
        """None when the variant implements `layer`'s op; variants with a narrower domain
        (kernel sizes, strides, groups...) call this first, then say what else they need."""
        if layer.op in self.ops:
            return None
        ops = self.ops[0] if len(self.ops) == 1 else " or ".join(self.ops)
        return f"{self.name} implements {ops}, not {layer.op}"

    def layouts_of(self, layer, cfg):
        """(layout of the input read, layout of the output written) by `cfg`: "NCHW", "CHWN" or
        "NHWC". Variants with a layout knob override this; NCHW/NCHW must stay in the space."""
        return self.layouts

    # -- space ----------------------------------------------------------------------------------
    def knobs(self, layer, target):
        return [Knob("WG", (64,), "work-group size")]

    def completed(self, cfg):
        """`cfg` (a recorded point) with the added knobs it lacks at the values its kernel
        had before they existed, so that a record made before a knob keeps matching the
        point it timed."""
        missing = tuple((k, v) for k, v in self.added_knobs if cfg.get(k, cfg) is cfg)
        return Config(cfg.items + missing) if missing else cfg

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
        with _parse_lock:
            t = _lookup.get_template(self.template)
        from ..precision import src_storage_of, storage_of
        ns = dict(layer=layer, cfg=cfg.as_dict(), prefix=prefix, attrs=layer.attrs,
                  variant=self.name, storage=storage_of(layer),
                  src_storage=src_storage_of(layer))
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
        h = hashlib.sha256()
        h.update((TEMPLATE_DIR / self.template).read_bytes())
        for path in self.includes:
            h.update((TEMPLATE_DIR / path).read_bytes())
        h.update(class_source(type(self)).encode())
        return h.hexdigest()[:16]

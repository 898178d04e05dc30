"""What the direct variants share: one flat range of work-items in work-groups of WG.

Pooling, LRN, concat, the elementwise ops and the direct convolutions launch one flat range of
work-items, each computing a few outputs; the reductions (dense_direct, global_avgpool,
softmax) give each output a work-item or a work-group. Here are their common knobs,
constraints and launches, and two base classes that declare such a variant from what differs:

- `Flat`: one launch of `items(layer, cfg)` work-items over `args(layer)`; its constraints are
  `flat_constraints(items, *own)`: the variant's own, then a work-group no larger than the
  launch and a whole number of SIMD groups; `Blocked`: work-items that each take a block of
  consecutive outputs along one dimension (pool_direct, lrn_direct), `ChannelBlocked`: KB
  output channels (the direct convolutions); `Elementwise`: VEC elements of the output;
- `Reduction`: knob RED, one of `units(layer)` outputs per work-item ("item") or per
  work-group ("group", a tree in local memory); its constraints are `reduction_constraints`.
"""
from .base import Constraint, In, Knob, Launch, Out, Param, Variant, bias_arg, ceil_div, \
    round_up
from ..graph import count


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


def flat_constraints(items, *own):
    """The variant's `own` constraints, then those of any flat launch of `items(layer, cfg)`
    work-items."""
    return own + (wg_not_wasteful(items), wg_fills_simd())


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
    return flat_constraints(vec_items, Constraint(
        "vec_not_wasteful", "software",
        "a work-item block larger than the tensor only adds idle lanes",
        lambda layer, cfg, t: cfg["VEC"] <= max(1, count(layer.out_shape))))


def conv_args(layer):
    """The arguments of a direct convolution or dense kernel: input, weight, [bias], output."""
    return (In(0), Param("weight")) + bias_arg(layer) + (Out(),)


class Flat(Variant):
    """A variant of one flat launch: `items(layer, cfg)` work-items in work-groups of WG, over
    `args(layer)` (the input and the output unless it says otherwise)."""

    def items(self, layer, cfg):
        raise NotImplementedError

    def args(self, layer):
        return (In(0), Out())

    def launches(self, layer, cfg, prefix):
        return [flat_launch(prefix, self.args(layer), self.items(layer, cfg), cfg["WG"])]


class Elementwise(Flat):
    """A flat launch over the output, VEC elements per work-item (add, scale, mul)."""
    constraints = elementwise_constraints()
    items = staticmethod(vec_items)

    def knobs(self, layer, target):
        return [wg_knob(), vec_knob()]


def block_items(along, knob):
    """`items(layer, cfg)` of a launch whose work-items each take `knob` consecutive outputs
    along output dimension `along`, and one of every other dimension."""
    def items(layer, cfg):
        shape = layer.out_shape
        return count(shape) // shape[along] * ceil_div(shape[along], cfg[knob])
    return items


class Blocked(Flat):
    """A flat launch whose work-items each compute `block` (a knob, after WG) consecutive
    outputs along output dimension `along`. A subclass names those, and `within` (the name and
    reason of the constraint that keeps a block no longer than that dimension) or its `own`
    constraints; its constraints are then flat_constraints(block_items(along, block), *own)."""
    block = None                # Knob
    along = None                # dimension of the output shape
    within = None               # (name, reason)
    own = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "constraints" in cls.__dict__:           # declared outright
            return
        own, knob, along = tuple(cls.own), cls.block.name, cls.along
        if cls.within:
            name, reason = cls.within
            own += (Constraint(name, "software", reason,
                               lambda layer, cfg, t: cfg[knob] <= max(1, layer.out_shape[along])),)
        cls.constraints = flat_constraints(block_items(along, knob), *own)

    def knobs(self, layer, target):
        return [wg_knob(), self.block]

    def items(self, layer, cfg):
        return block_items(self.along, self.block.name)(layer, cfg)


def kb_divides_group():
    return Constraint("kb_divides_group", "algorithm",
                      "a work-item's block of KB output channels must lie in one group, so that "
                      "it reads one set of input channels",
                      lambda layer, cfg, t: (layer.out_shape[1] // layer.attrs["groups"])
                      % cfg["KB"] == 0)


class ChannelBlocked(Blocked):
    """A direct convolution: each work-item computes KB output channels of one output, in one
    flat launch over input, weight, [bias] and output."""
    block = Knob("KB", (1, 2, 4, 8), "output channels per work-item (register block)")
    along = 1
    own = (kb_divides_group(),)

    def args(self, layer):
        return conv_args(layer)


# -- reductions ----------------------------------------------------------------------------------

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


class Reduction(Variant):
    """A variant with knob RED: each of `units(layer)` outputs (by default every element of the
    output) gets a work-item ("item") or a work-group ("group") that reduces the `width(layer)`
    values of one `what` by a tree in local memory, over `args(layer)`. A subclass names those
    and `within` (the name and reason of the constraint that keeps a group no wider than the
    values); its constraints are then reduction_constraints(units, width, *within)."""
    what = None                 # what one output reduces, for the knob's doc
    within = None               # (name, reason)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "constraints" not in cls.__dict__:       # else declared outright
            cls.constraints = reduction_constraints(cls.units, cls.width, *cls.within)

    @staticmethod
    def units(layer):
        return count(layer.out_shape)

    @staticmethod
    def width(layer):
        raise NotImplementedError

    def args(self, layer):
        return (In(0), Out())

    def knobs(self, layer, target):
        return [Knob("RED", ("item", "group"), f"one {self.what} per work-item or per work-group"),
                wg_knob()]

    def local_mem_bytes(self, layer, cfg):
        return 4 * cfg["WG"] if cfg["RED"] == "group" else 0

    def launches(self, layer, cfg, prefix):
        wg, units = cfg["WG"], self.units(layer)
        g = units * wg if cfg["RED"] == "group" else round_up(units, wg)
        return [Launch(prefix, self.args(layer), (g,), (wg,))]

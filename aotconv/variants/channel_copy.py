"""Channel permutations and selections that copy whole (n, c) planes: `channel_shuffle`
(ShuffleNet: output channel a*g + b is input channel b*(C/g) + a) and `channel_slice`
(output channel o is input channel start + o).

Both are one flat launch: every output plane reads one input plane (the variant names which,
as a C expression of the output channel `o`), and each work-item copies VEC consecutive
elements of a plane, so reads and writes stay contiguous.
"""
from .base import Constraint, Knob, ceil_div, class_source
from .flat import Flat, flat_constraints, wg_knob


def _items(layer, cfg):
    n, c, h, w = layer.out_shape
    return n * c * ceil_div(h * w, cfg["VEC"])


class _ChannelCopy(Flat):
    template = "kernels/channel_copy.cl.mako"
    half_storage = True
    constraints = flat_constraints(_items, Constraint(
        "vec_within_plane", "software",
        "a work-item block longer than an H*W plane only adds idle iterations",
        lambda layer, cfg, t: cfg["VEC"] <= max(1, layer.out_shape[2] * layer.out_shape[3])))
    items = staticmethod(_items)

    def knobs(self, layer, target):
        return [wg_knob(), Knob("VEC", (1, 2, 4, 8), "consecutive elements of a plane per "
                                                     "work-item")]

    def template_hash(self):
        # the shared base is part of every subclass's kernel
        import hashlib
        return hashlib.sha256((super().template_hash() + class_source(_ChannelCopy))
                              .encode()).hexdigest()[:16]

    def source_channel(self, layer):
        """The input channel output channel `o` copies, as a C expression."""
        raise NotImplementedError

    def describe(self, layer):
        raise NotImplementedError

    def template_params(self, layer, cfg):
        n, ci, h, w = layer.in_shape
        return dict(N=n, C_IN=ci, C_OUT=layer.out_shape[1], HW=h * w,
                    src=self.source_channel(layer), what=self.describe(layer))


class ChannelShuffleDirect(_ChannelCopy):
    name = "channel_shuffle_direct"
    ops = ("channel_shuffle",)

    def source_channel(self, layer):
        g = layer.attrs["groups"]
        return f"(o % {g}) * {layer.in_shape[1] // g} + o / {g}"

    def describe(self, layer):
        return f"channel shuffle of {layer.attrs['groups']} groups"


class ChannelSliceDirect(_ChannelCopy):
    name = "channel_slice_direct"
    ops = ("channel_slice",)

    def source_channel(self, layer):
        return f"{layer.attrs['start']} + o" if layer.attrs["start"] else "o"

    def describe(self, layer):
        return f"channels [{layer.attrs['start']}, {layer.attrs['end']})"

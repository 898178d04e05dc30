"""Elementwise layers in NHWC or CHWN: add, the standalone activations, scale and mul.

An elementwise layer whose inputs and output share one layout computes the same values
whichever layout that is: the kernels of add_direct, eltwise and scale_direct (mul) never look
at a coordinate, only at the flat index. These siblings declare a LAYOUT knob (NHWC, CHWN), so
that the layout plan can keep a chain channels-last (NHWC) or batch-last (CHWN) through a
residual add or an activation it could not fuse, with no conversion on either side; every
input is read in that layout (aotconv.layouts: a layer has one read layout for all its inputs).

- add_nhwc and eltwise_nhwc render their NCHW sibling's template (the kernel text is the same
  but for a line naming the layout): the same knobs (WG, VEC), constraints and launches.
- scale_nhwc (scale and mul) has a template of its own: scale's factor s [N, C, 1, 1] is
  indexed by the (n, c) plane of each element, which in NHWC is (i / (H*W*C), i % C) and in
  CHWN (i % N, i / (H*W*N)); the factor itself is read in the same layout (in NHWC the same
  storage as NCHW, so never converted). mul's two tensors are indexed alike.

The NCHW siblings stay first in the registry: every layer's fallback, their records and
renders untouched.
"""
import hashlib

from .add import AddDirect
from .base import Knob, class_source
from .eltwise import Eltwise
from .scale import ScaleDirect
from .pool_nhwc import LAYOUTS


def layout_knob():
    return Knob("LAYOUT", LAYOUTS, "layout of every input read and of the output written")


class _AnyLayout:
    """Mixin: an elementwise variant whose NCHW sibling (the next class in the MRO with a
    template) computes the same thing in any layout shared by its inputs and output."""

    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], cfg["LAYOUT"]

    def knobs(self, layer, target):
        return [layout_knob()] + super().knobs(layer, target)

    def render(self, layer, cfg, prefix):
        src = super().render(layer, cfg, prefix)
        return _after_title(src, f"// every input and the output in {cfg['LAYOUT']} "
                                 f"(elementwise: the kernel indexes the flat storage)")

    def template_hash(self):
        # the sibling's code and this mixin are part of the kernel
        h = hashlib.sha256(super().template_hash().encode())
        for cls in type(self).__mro__[1:]:
            if cls.__module__.startswith("aotconv.variants.") and cls.__name__ != "Variant":
                h.update(class_source(cls).encode())
        return h.hexdigest()[:16]


def _after_title(src, line):
    """`src` with `line` inserted after its first comment line (the kernel's title)."""
    at = src.index("//")
    end = src.index("\n", at) + 1
    return src[:end] + line + "\n" + src[end:]


class AddNhwc(_AnyLayout, AddDirect):
    name = "add_nhwc"


class EltwiseNhwc(_AnyLayout, Eltwise):
    name = "eltwise_nhwc"


class ScaleNhwc(ScaleDirect):
    name = "scale_nhwc"
    template = "kernels/scale_nhwc.cl.mako"

    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], cfg["LAYOUT"]

    def knobs(self, layer, target):
        return [layout_knob()] + super().knobs(layer, target)

    def template_params(self, layer, cfg):
        n, c, h, w = layer.out_shape
        d = super().template_params(layer, cfg)
        d["VA"] = c if cfg["LAYOUT"] == "NHWC" else n
        return d

    def template_hash(self):
        h = hashlib.sha256(super().template_hash().encode())
        h.update(class_source(ScaleDirect).encode())
        return h.hexdigest()[:16]

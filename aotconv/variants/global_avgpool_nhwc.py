"""global_avgpool_nhwc: global average pooling that reads NHWC or CHWN.

global_avgpool_direct's sibling for a network whose last chain the layout plan keeps
channels-last (NHWC) or batch-last (CHWN), as ResNet's and MobileNet's heads are: the pool then
reads the tensor where it lies instead of after a conversion to NCHW.

One work-item per (outer index, VW consecutive values along the vector axis): it sums the H*W
pixels of its VW channels (NHWC) or images (CHWN) as VW-wide vectors, each pixel's vector
VA values after the last, and divides by H*W. The output, N x C x 1 x 1, is written in NCHW:
stored in NHWC that is the same sequence of values (the layout plan needs no conversion
before a reader in either), and a CHWN input gets it transposed on the way out (the images of a
channel are VW values C apart), so the dense or softmax layer after it reads it as it is.

Domain: every global_avgpool, any batch, half storage. NCHW is not in its space:
global_avgpool_direct serves that and stays the fallback.
"""
from .flat import Flat, flat_constraints, wg_knob
from .limits import first_valid
from .pool_nhwc import axes, fallback_points, layout_knob, vw_fits, vw_knob


def items(layer, cfg):
    """Work-items: one per VW values along the vector axis of each outer index."""
    va, oa = axes(layer.in_shape, cfg["LAYOUT"])
    return oa * -(-va // cfg["VW"])


class GlobalAvgpoolNhwc(Flat):
    name = "global_avgpool_nhwc"
    ops = ("global_avgpool",)
    template = "kernels/global_avgpool_nhwc.cl.mako"
    half_storage = True
    constraints = flat_constraints(items, vw_fits())
    items = staticmethod(items)

    def layouts_of(self, layer, cfg):
        return cfg["LAYOUT"], "NCHW"

    def knobs(self, layer, target):
        return [layout_knob(), vw_knob(), wg_knob()]

    def fallback(self, layer, target):
        return first_valid(self, layer, target, fallback_points(layer))

    def template_params(self, layer, cfg):
        n, c, h, w = layer.in_shape
        va, oa = axes(layer.in_shape, cfg["LAYOUT"])
        vb = -(-va // cfg["VW"])
        return dict(N=n, C=c, HW=h * w, VA=va, OA=oa, VB=vb, VTAIL=va % cfg["VW"],
                    ITEMS=oa * vb, ICHK=oa * vb % cfg["WG"] != 0)

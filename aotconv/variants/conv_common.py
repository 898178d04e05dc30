"""What the tiled convolution variants share (conv_igemm, conv_1x1, conv_tiled, conv_depthwise).

- `conv_sizes`: a conv layer's sizes under the names their templates use;
- work-groups on GPUs and CPUs: `thread_dims`, `simd_groups_ok` and the `whole_simd_groups`
  constraint, and BEAST's occupancy rule `enough_work_groups`;
- register blocks: `vw_divides` (a block is whole vectors) and `not_oversized` (a block no
  larger than the next power of two above the size it covers), and `row_block_constraints`,
  those of QT consecutive outputs of one row;
- `row_reads`: how a work-item that computes QT consecutive outputs of one output row reads,
  per filter row, the input segment its windows cover: which columns it uses, which loads
  need a guard against the padding and the edges, and which runs of columns become one vector
  load.
"""
from .base import Constraint, pow2_at_least
from ..graph import count

# A tile this size keeps a big GPU's compute unit busy: a layer with at least this many outputs
# per wanted work-group is large enough to ask for min_wg_per_cu work-groups per compute unit.
OCCUPANCY_TILE = 64 * 64


def conv_sizes(layer):
    """The layer's sizes under the names the conv templates use."""
    a = layer.attrs
    n, c, h, w = layer.in_shape
    _, k, p, q = layer.out_shape
    g = a["groups"]
    (r, s), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
    pt, pl, pb, pr = a["pad"]
    return dict(BATCH=n, C=c, H=h, W=w, K=k, P=p, Q=q, R=r, S=s, SH=sh, SW=sw, DH=dh, DW=dw,
                PT=pt, PL=pl, PB=pb, PR=pr, G=g, CG=c // g, KG=k // g)


def thread_dims(target):
    """Work-items per work-group dimension: GPUs want 64-1024 work-items; on a CPU (PoCL) a
    work-group is a loop and 1-64 work-items with big register blocks do best."""
    return (16, 8, 32, 4) if target.kind == "gpu" else (2, 4, 1, 8)


def simd_groups_ok(wg, target):
    """GPUs run work-items in SIMD groups (warps, wavefronts) that a work-group should fill;
    PoCL's CPU device runs a work-group's items in a loop, so small groups are fine there."""
    return target.kind != "gpu" or wg % min(target.simd_width, 64) == 0


def whole_simd_groups(wg):
    """`wg(cfg)`: the work-items of a work-group."""
    return Constraint("whole_simd_groups", "hardware",
                      "on a GPU, a work-group that is not a whole number of SIMD groups leaves "
                      "lanes idle",
                      lambda l, c, t: simd_groups_ok(wg(c), t))


def enough_work_groups(work_groups, tile=OCCUPANCY_TILE,
                       when="the layer has enough 64x64 tiles to give them", per_cu=None):
    """BEAST's minimum occupancy; `work_groups(layer, cfg)`: the work-groups of the run. A
    layer with fewer than `tile` outputs per wanted work-group is exempt (`when` says when it
    is not, in the reason). `per_cu(layer, cfg, target)`: the work-groups wanted per compute
    unit where not the target's min_wg_per_cu."""
    def ok(l, c, t):
        want = (per_cu(l, c, t) if per_cu else t.min_wg_per_cu) * t.compute_units
        if count(l.out_shape) < want * tile:
            return True                             # too small to fill the device anyway
        return work_groups(l, c) >= want

    return Constraint("enough_work_groups", "hardware",
                      "BEAST's occupancy rule: at least min_wg_per_cu work-groups per compute "
                      f"unit when {when}", ok)


def vw_divides(block, reason):
    """`vw_divides_<block>`: a work-item's `block` outputs (a knob) are whole VW-wide vectors."""
    return Constraint(f"vw_divides_{block.lower()}", "algorithm", reason,
                      lambda l, c, t: c[block] % c["VW"] == 0)


def not_oversized(name, reason, value, size, floor=1):
    """`name`: `value(cfg)` (a block of a work-item or a work-group) at most the next power of
    two above `size(layer)`, or `floor`: beyond that it only computes padding."""
    return Constraint(name, "software", reason,
                      lambda l, c, t: value(c) <= max(floor, pow2_at_least(size(l))))


def _shown(key, v):
    if key == "pad":
        return "none" if not any(v) else str(tuple(v))
    return "x".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def domain_reason(variant, layer, needs):
    """None when the conv `layer` has what `needs` asks, else why `variant` declines it: each
    need is (attribute, value[, why]), an attribute equal to its value (a tuple for kernel,
    stride and dilation; pad 0 for no padding at all)."""
    a = layer.attrs
    for key, want, *why in needs:
        got = a[key]
        ok = not any(got) if key == "pad" and want == 0 else (
            tuple(got) == tuple(want) if isinstance(want, tuple) else got == want)
        if not ok:
            return (f"{variant.name} needs {key} {_shown(key, want if key != 'pad' else (0,))}, "
                    f"not {_shown(key, got)}" + (f": {why[0]}" if why else ""))
    return None


def row_block_constraints():
    """Those of a work-item that computes QT consecutive outputs of one output row, stored as
    VW-wide vectors (conv_tiled, conv_depthwise)."""
    return (vw_divides("QT", "a work-item's QT outputs are stored as whole VW-wide vectors"),
            not_oversized("qt_not_oversized",
                          "outputs per work-item beyond the next power of two above the output "
                          "width only compute padding",
                          lambda c: c["QT"], lambda l: l.out_shape[3]))


def row_span(layer, qt):
    """Input columns QT consecutive windows of one filter row cover."""
    a = layer.attrs
    return (qt - 1) * a["stride"][1] + (a["kernel"][1] - 1) * a["dilation"][1] + 1


def row_reads(layer, d, qt, vw, qb, guarded=True):
    """How a work-item reads the input segment of its QT outputs' windows, per filter row (`d`:
    conv_sizes, `qb`: blocks of QT outputs along the row): SPAN columns, of which USED are
    read; GUARD_COL[i] (column i may fall into the padding or past the edge for some
    work-item) and GUARD_ROW[r] (filter row r may), all False where nothing needs a guard
    (`guarded` False: a zero-filled copy in local memory); VEC_AT[i]: a run of VW unguarded
    used columns from i, read as one vector."""
    sw, dw = d["SW"], d["DW"]
    span = row_span(layer, qt)
    used = sorted({qq * sw + j * dw for qq in range(qt) for j in range(d["S"])})
    if guarded:
        last_q0 = (qb - 1) * qt * sw - d["PL"]
        guard_col = {i: (i - d["PL"] < 0) or (last_q0 + i > d["W"] - 1) for i in used}
        guard_row = [(r * d["DH"] - d["PT"] < 0)
                     or ((d["P"] - 1) * d["SH"] - d["PT"] + r * d["DH"] > d["H"] - 1)
                     for r in range(d["R"])]
    else:
        guard_col = {i: False for i in used}
        guard_row = [False] * d["R"]
    vec_at, i = {}, 0
    cols = set(used)
    while i < span:
        run = range(i, i + vw)
        if vw > 1 and all(j in cols and not guard_col[j] for j in run):
            vec_at[i] = True
            i += vw
        else:
            i += 1
    return dict(SPAN=span, USED=used, GUARD_COL=guard_col, GUARD_ROW=guard_row, VEC_AT=vec_at)

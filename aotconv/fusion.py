"""Which pools, residual adds and depthwise convs fold into the convolution next to them.

Pools: where the tuner measures it faster.

After the unfused network's choices are made, every conv -> max/avg pool pair that
passes.fusable_pools finds is fused in a copy of the network (passes.fuse_pool) and the fused
conv_pool layers get choices of their own (choose(..., only=[...]), tuned like any layer). A
pair stays fused when the fused kernel's measured time is below the conv's plus the pool's:

    policy "measure"  (the default) fuse where t(conv_pool) < t(conv) + t(pool) + gap, all
                      three measured in this run or taken from records (the same device key);
                      where any of the three is unmeasured (fallback mode, no record, the
                      device absent and no records) the pair is left unfused
    policy "always"   fuse every pair (tests; a device whose records say so)
    policy "never"    fuse none

The times are the kernels' measured times with the target's launch gap counted
(aotconv.launch_cost): `gap` for the launch the unfused pair has more, and for each of the
three, the gaps of the launches its variant makes beyond one. Every pair's decision, its
three times and the reason go to tuning.json and report.md.

Residual adds (`apply_residual`): every add that passes.fusable_residuals pairs with a conv is
fused in a copy of the network (passes.fuse_residual) and the fused convs get choices of their
own, as above. Under policy "measure" a pair is fused

    where no variant takes the fused layer        never (the add stays a kernel of its own)
    where all three times are measured            when t(fused) < t(conv) + t(add) + gap
    where the add's is not, the other two are     when t(fused) <= t(conv): one kernel no
                                                  slower than the conv alone
    where they are not (fallback mode, no record) when the fused layer runs the conv's own
                                                  variant and configuration: the same kernel
                                                  with the add's read of the residual moved
                                                  into its epilogue, one write and one read of
                                                  the tensor and a launch fewer, so it cannot
                                                  lose; otherwise (a tuned conv against the
                                                  fused layer's untuned fallback) not fused

Before deciding, a fused layer whose own search measured nothing as fast as the conv's kernel
is expected to run with the add's read in its epilogue (the conv's time plus a third of the
add's) takes that kernel instead, where it takes the fused layer (`_carried`); it is then
unmeasured and decided by the last rule.

Depthwise convs (`apply_dwpw`, after the residual adds): every (depthwise conv, pointwise conv)
pair that passes.fusable_dwpw finds is fused in a copy of the network (passes.fuse_dwpw), the
conv_dwpw layers are chosen like any layer, and under policy "measure" a pair is fused where
t(conv_dwpw) < t(dw) + t(pw) + gap, all three measured (in this run or in records); where one
is unmeasured, or no variant takes the fused layer (an fp16 build: conv_dwpw stores FP32
only), it is not.
"""
from dataclasses import asdict, field, make_dataclass, replace

from . import passes
from .errors import AotconvError
from .launch_cost import extra_ms, gap_ms
from .variants import for_layer

POLICIES = ("measure", "always", "never")


def _decision(name, partner, doc, *extra):
    """The frozen dataclass `name` of one fusion decision: the conv, its `partner` (the layer
    folded into it), the `extra` fields, the three times compared (the conv's, the partner's,
    the fused layer's: None where unmeasured), whether the pair is fused and why."""
    times = [(f"{who}_ms", float, field(default=None)) for who in ("conv", partner, "fused")]
    return make_dataclass(
        name, [("conv", str), (partner, str), *extra, *times,
               ("fused", bool, field(default=False)), ("why", str, field(default=""))],
        frozen=True, namespace={"__doc__": doc, "__module__": __name__, "as_dict": asdict})


Decision = _decision("Decision", "pool", "Whether a conv and the pool after it are fused.")


class Price:
    """The times a fusion decision compares, launches counted (aotconv.launch_cost): a
    choice's time plus the target's gap for each launch beyond its first, and `gap` for the
    launch the unfused pair has more. Without a target, the times alone."""

    def __init__(self, target=None, *nets):
        self.target = target
        self.gap = gap_ms(target) if target is not None else 0.0
        self.layers = {}
        for n in reversed(nets):
            self.layers.update({l.name: l for l in n.layers})

    def __call__(self, name, choice, fused=None):
        t = getattr(choice, "time_ms", None)
        if t is None or self.target is None:
            return t
        layer = (fused or self.layers).get(name)
        return t + (extra_ms(choice.impl, layer, choice.cfg, self.target) if layer else 0.0)

    def compare(self, t):
        """(fused faster, why) for the priced times [conv, partner, fused]."""
        ok = t[2] < t[0] + t[1] + self.gap
        launch = f" + {self.gap:.4g} (a launch)" if self.gap else ""
        return ok, (f"fused {'faster' if ok else 'slower'}: {t[2]:.4g} {'<' if ok else '>='} "
                    f"{t[0]:.4g} + {t[1]:.4g}{launch} ms")


def _decide(kind, pairs, choices, fused_choices, policy, price, fused_layers, declined,
            names, forced):
    """[kind] for each (conv, partner) pair: the conv names the fused layer (its choice in
    `fused_choices`); fused where measured faster (Price.compare), never where `declined`
    {conv: why} or unmeasured, always or never by `policy`. `names` label the three times in
    the "not measured" reason, `forced` the policy in its reasons."""
    declined = declined or {}
    price = price or Price()
    out = []
    for conv, partner in pairs:
        a, b, f = choices.get(conv), choices.get(partner), fused_choices.get(conv)
        t = [price(conv, a), price(partner, b), price(conv, f, fused_layers)]
        if conv in declined:
            ok, why = False, f"no variant takes the fused layer: {declined[conv]}"
        elif policy == "always":
            ok, why = True, f"fusion forced ({forced}always)"
        elif policy == "never":
            ok, why = False, f"fusion off ({forced}never)"
        elif None in t:
            ok = False
            why = "not measured: " + ", ".join(n for n, x in zip(names, t) if x is None)
        else:
            ok, why = price.compare(t)
        out.append(kind(conv, partner, *(getattr(x, "time_ms", None) for x in (a, b, f)),
                        ok, why))
    return out


def decide(pairs, choices, fused_choices, policy, price=None, fused_layers=None):
    """[Decision] for each (conv, pool) pair given the unfused and the fused choices; `price`
    (a Price) counts launches, `fused_layers` {conv: the fused layer} for its fused choice."""
    return _decide(Decision, pairs, choices, fused_choices, policy, price, fused_layers, None,
                   ("conv", "pool", "fused"), "fuse_pool=")


# conv_pool_direct is a direct convolution that recomputes overlapping windows: it can only
# win where the conv itself runs a direct kernel, or where the pool is a real share of the
# pair's time, unless the conv's own kernel has a sibling that pools in its epilogue
# (conv_wgmma_halo_pool_f16_nhwc: pool_epilogue_of). Elsewhere (a tuned GEMM-like or Winograd conv and a cheap pool) measuring it
# costs tuning time and cannot change the decision (H100, vgg16: 0.35-1.3 ms fused against
# 0.04-0.08 ms for Winograd + pool).
DIRECT_CONVS = ("conv_direct", "conv_tiled")
POOL_SHARE = 0.25


def pool_epilogue_of(variant, fused=None):
    """The conv_pool variants that are `variant`'s kernel with the pool in its epilogue (their
    `pool_of`), those that take the conv_pool layer `fused` where given: fused, the conv
    costs about what it did, so the pair is worth measuring."""
    from .variants import VARIANTS
    return [v.name for v in VARIANTS if getattr(v, "pool_of", None) == variant
            and (fused is None or v.supports(fused) is None)]


def worth_measuring(choices, conv, pool, fused=None):
    """Whether the pair's conv_pool layer (`fused`, where known) is worth a search."""
    c, p = choices.get(conv), choices.get(pool)
    if c is None or p is None:
        return False
    if c.variant in DIRECT_CONVS or pool_epilogue_of(c.variant, fused):
        return True
    return bool(c.time_ms and p.time_ms and p.time_ms >= POOL_SHARE * c.time_ms)


def apply(net, choices, target, policy="measure", mode="tune", choose_fn=None):
    """(net, choices, [Decision]): `net` with the pools worth fusing fused, and its choices.

    `choose_fn(net, only)` returns {layer: Choice} for the named layers of `net` (the
    compiler's choose with its mode, budget and records)."""
    if policy not in POLICIES:
        raise AotconvError(f"unknown fuse_pool policy '{policy}'; use {', '.join(POLICIES)}")
    pairs = passes.fusable_pools(net)
    if not pairs:
        return net, dict(choices), []
    fused_choices, all_fused = {}, None
    # in fallback mode nothing is measured, so "measure" could never fuse: skip the choosing
    if policy == "always" or (policy == "measure" and mode != "fallback"):
        if policy == "always":
            worth = [c for c, _ in pairs]
        else:
            every = {l.name: l for l in passes.fuse_pool(net).layers}  # each pair fused
            worth = [c for c, p in pairs if worth_measuring(choices, c, p, every[c])]
        if worth:
            all_fused = passes.fuse_pool(net, worth)
            fused_choices = choose_fn(all_fused, worth)
    fused_layers = ({l.name: l for l in all_fused.layers} if fused_choices else None)
    decisions = decide(pairs, choices, fused_choices, policy, Price(target, net), fused_layers)
    keep = [d.conv for d in decisions if d.fused]
    if not keep:
        return net, dict(choices), decisions
    out = passes.fuse_pool(net, keep)
    gone = {d.pool for d in decisions if d.fused}
    new = {k: v for k, v in choices.items() if k not in gone}
    new.update({c: fused_choices[c] for c in keep})
    return out, new, decisions


ResidualDecision = _decision(
    "ResidualDecision", "add", "Whether a conv and the residual add it feeds are fused; "
    "`residual` is the add's other input, which the fused conv reads.",
    ("residual", str, field(default=None)))


def decide_residual(pairs, choices, fused_choices, policy, declined=None, price=None,
                    fused_layers=None):
    """[ResidualDecision] for each (conv, add, residual) given the unfused and the fused
    choices; `declined` {conv: why} names the pairs no variant takes fused; `price` and
    `fused_layers` as for decide."""
    declined = declined or {}
    price = price or Price()
    out = []
    for conv, add, res in pairs:
        a, b, f = choices.get(conv), choices.get(add), fused_choices.get(conv)
        t = [price(conv, a), price(add, b), price(conv, f, fused_layers)]
        if conv in declined:
            ok, why = False, f"no variant takes the fused layer: {declined[conv]}"
        elif policy == "always":
            ok, why = True, "fusion forced (policy always)"
        elif policy == "never":
            ok, why = False, "fusion off (policy never)"
        elif None not in t:
            ok, why = price.compare(t)
        elif t[0] is not None and t[2] is not None and t[2] <= t[0]:
            ok, why = True, (f"the add not measured; fused no slower than the conv alone: "
                             f"{t[2]:.4g} <= {t[0]:.4g} ms")
        elif f is not None and a is not None and (f.variant, f.cfg) == (a.variant, a.cfg):
            ok, why = True, (f"not measured; the conv's own kernel ({a.variant} {a.cfg}) with "
                             f"the add in its epilogue: one kernel and one write and read of "
                             f"the tensor fewer")
        else:
            ok = False
            why = ("not measured, and the fused layer would run "
                   f"{f.variant if f else 'nothing'} where the conv runs "
                   f"{a.variant if a else 'nothing'}")
        out.append(ResidualDecision(conv, add, res,
                                    *(getattr(x, "time_ms", None) for x in (a, b, f)), ok, why))
    return out


def _layouts(variant, layer, cfg):
    of = getattr(variant, "layouts_of", None)
    return tuple(of(layer, cfg)) if of else ("NCHW", "NCHW")


def _carried(fused_net, triples, takers, choices, fused_choices, target):
    """{conv: Choice} where the fused layer's own search found nothing as fast as the conv's
    chosen kernel would be with the add's read in its epilogue (a small share of a budget may
    measure no more than a fallback), and that kernel takes the fused layer as it is: then it
    runs the fused layer, which decide_residual fuses as one kernel and one write and read
    fewer. That kernel is expected to take the conv's time plus a third of the add's (the add
    reads two tensors and writes one; the epilogue reads one of them), so the search's own
    kernel is kept only where it measured no slower than that (the conv's time alone where
    the add has none). Before, a fused layer that measured only its fallback kept it wherever
    it beat the conv plus the add: ResNet-50 b1 guided for 90 s on an H100 ran layer1's three
    fused 1x1 convs in conv_direct at 22.8 us, where their conv_igemm took 10.7 us alone."""
    from .choose import Choice
    from .space import point_ok
    from .variants import BY_NAME
    layers = {l.name: l for l in fused_net.layers}
    out = {}
    for conv, add, _ in triples:
        a, f = choices.get(conv), fused_choices.get(conv)
        if conv not in takers or a is None or conv not in layers:
            continue
        if f is not None and (f.variant, f.cfg) == (a.variant, a.cfg):
            continue
        t = [getattr(x, "time_ms", None) for x in (a, choices.get(add), f)]
        v = BY_NAME[a.variant]
        if t[0] is not None and t[2] is not None and t[2] <= t[0] + (t[1] or 0.0) / 3:
            continue            # the search's own fused kernel is as fast as the carried one
        if None not in t and t[2] < t[0] + t[1] + gap_ms(target) and \
                _layouts(v, layers[conv], a.cfg) != _layouts(BY_NAME[f.variant], layers[conv],
                                                             f.cfg):
            # measured faster than the conv plus the add: carried only where the layout plan
            # sees the same layouts (ResNet-50 b1 guided for 90 s on an H100: NHWC kernels
            # carried between CHWN neighbours brought in 12 conversions)
            continue
        # a variant that declines the fused layer would drop the residual, whatever its knobs
        if v.supports(layers[conv]) is None and point_ok(layers[conv], v, a.cfg, target):
            out[conv] = Choice(a.variant, a.cfg, None, a.source, a.stats, plan_ms=a.time_ms)
    return out


def apply_residual(net, choices, target, policy="measure", mode="tune", choose_fn=None):
    """(net, choices, [ResidualDecision]): `net` with the residual adds worth fusing fused into
    the conv before them, and its choices (`choose_fn` as for `apply`)."""
    if policy not in POLICIES:
        raise AotconvError(f"unknown residual fusion policy '{policy}'; use "
                           f"{', '.join(POLICIES)}")
    pairs = passes.fusable_residuals(net)
    if not pairs:
        return net, dict(choices), []
    by_name = {l.name: l for l in net.layers}
    triples, declined, takers = [], {}, []
    for conv, add in pairs:
        fused = passes.residual_layer(by_name[conv], by_name[add])
        triples.append((conv, add, fused.inputs[1]))
        if not for_layer(fused):
            from .variants import active
            declined[conv] = "; ".join(filter(None, (v.supports(fused) for v in active()
                                                     if "conv" in v.ops)))
        else:
            takers.append(conv)
    fused_choices, fused_layers = {}, None
    if takers and policy != "never":
        all_fused = passes.fuse_residual(net, takers)
        fused_layers = {l.name: l for l in all_fused.layers}
        fused_choices = choose_fn(all_fused, takers)
        fused_choices.update(_carried(all_fused, triples, takers, choices, fused_choices,
                                      target))
    decisions = decide_residual(triples, choices, fused_choices, policy, declined,
                                Price(target, net), fused_layers)
    keep = [d.conv for d in decisions if d.fused]
    if not keep:
        return net, dict(choices), decisions
    out = passes.fuse_residual(net, keep)
    # a residual that was itself an add fused into its conv is that conv's output now
    now = {d.add: d.conv for d in decisions if d.fused}
    decisions = [replace(d, residual=now.get(d.residual, d.residual)) for d in decisions]
    gone = {d.add for d in decisions if d.fused}
    new = {k: v for k, v in choices.items() if k not in gone}
    new.update({c: fused_choices[c] for c in keep})
    return out, new, decisions


DwpwDecision = _decision(
    "DwpwDecision", "dw", "Whether a depthwise conv and the pointwise conv after it are fused "
    "into one conv_dwpw layer; `conv` is the pointwise conv, whose name the fused layer takes.")


def decide_dwpw(pairs, choices, fused_choices, policy, declined=None, price=None,
                fused_layers=None):
    """[DwpwDecision] for each (depthwise conv, pointwise conv) pair given the unfused and the
    fused choices (the fused layer's under the pointwise conv's name); `declined` {pointwise
    conv: why} names the pairs no variant takes fused; `price` and `fused_layers` as for
    decide."""
    return _decide(DwpwDecision, [(pw, dw) for dw, pw in pairs], choices, fused_choices,
                   policy, price, fused_layers, declined, ("pw", "dw", "fused"), "policy ")


def _dwpw_declined(net, pairs, target):
    """{pointwise conv: why} of the pairs whose fused layer no variant takes in a build for
    `target` (its precision: an fp16 build stores half, which conv_dwpw does not)."""
    from .precision import reason
    from .variants import active
    by_name = {l.name: l for l in net.layers}
    out = {}
    for dw, pw in pairs:
        fused = passes.dwpw_layer(by_name[dw], by_name[pw])
        why = [v.supports(fused) or reason(v, target) for v in active()
               if "conv_dwpw" in v.ops]
        if all(why):
            out[pw] = "; ".join(why) or "no conv_dwpw variant is registered"
    return out


def apply_dwpw(net, choices, target, policy="measure", mode="tune", choose_fn=None):
    """(net, choices, [DwpwDecision]): `net` with the depthwise convs worth fusing fused into
    the pointwise conv after them, and its choices (`choose_fn` as for `apply`)."""
    if policy not in POLICIES:
        raise AotconvError(f"unknown depthwise fusion policy '{policy}'; use "
                           f"{', '.join(POLICIES)}")
    pairs = passes.fusable_dwpw(net)
    if not pairs:
        return net, dict(choices), []
    declined = _dwpw_declined(net, pairs, target)
    takers = [pw for _, pw in pairs if pw not in declined]
    fused_choices, fused_layers = {}, None
    # in fallback mode nothing is measured, so "measure" could never fuse: skip the choosing
    if takers and (policy == "always" or (policy == "measure" and mode != "fallback")):
        all_fused = passes.fuse_dwpw(net, takers)
        fused_layers = {l.name: l for l in all_fused.layers}
        fused_choices = choose_fn(all_fused, takers)
    decisions = decide_dwpw(pairs, choices, fused_choices, policy, declined,
                            Price(target, net), fused_layers)
    # a pair with no choice for its fused layer (a time budget with no room left to measure
    # it) stays unfused whatever the policy
    keep = [d.conv for d in decisions if d.fused and d.conv in fused_choices]
    decisions = [d if not d.fused or d.conv in keep else
                 replace(d, fused=False, why=d.why + ", but the fused layer got no choice (no "
                                                     "time left to measure it): not fused")
                 for d in decisions]
    if not keep:
        return net, dict(choices), decisions
    out = passes.fuse_dwpw(net, keep)
    gone = {d.dw for d in decisions if d.fused}
    new = {k: v for k, v in choices.items() if k not in gone}
    new.update({c: fused_choices[c] for c in keep})
    return out, new, decisions

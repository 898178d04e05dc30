"""The arithmetic and storage a build allows (`--precision`), what each variant computes in,
TF32 and half storage.

    fp32  FP32 storage and math everywhere (the default).
    tf32  FP32 storage; every conv layer a tensor-core variant serves may multiply in TF32
          (10-bit mantissa, operands rounded to nearest, ties away from zero, as cvt.rna does)
          with FP32 accumulation; the tuner picks it where it measures faster, every other
          layer computes in FP32 (more precise, so within tf32's tolerance).
    fp16  half storage: every layer's weights and output are stored in half (IEEE binary16,
          rounded to nearest even) in device memory, read with vload_half and written with
          vstore_half_rte; all arithmetic and accumulation stays FP32. The library's calls
          stay float: set_params converts the parameters once, and a cast kernel converts the
          network's inputs to half and its outputs back to float on the device, or the first
          or last layer does as it reads or writes them (aotconv.layouts.fuse_casts).

A variant declares what it computes in with a class attribute `precision` (FP32 when it has
none), and whether its template renders half-storage kernels with `half_storage`. A build of
precision P allows the variants whose arithmetic is at least as precise as P's (`allows`: an
fp16 build computes in FP32) and, for fp16, only those with half storage (`reason`);
aotconv.variants.limits turns that into hardware-level constraints, so spaces, records and
fallbacks never offer a TF32 kernel to an FP32 build nor an FP32-storage kernel to an fp16 one.
An fp16 build's layers carry `storage: fp16` in their attributes (`stored`), so their
signatures, and with them every tuning record's key, differ from an FP32 build's, whose are
unchanged. docs/precision.md has the rules and the tolerances derived for TF32 and half
(aotconv.protocol checks tuning candidates with them).

The rest is for the reports and the checks: which layers of a schedule compute in TF32
(`reduced_layers`, `summary`), numpy's TF32 and half rounding (`round_tf32`, `round_fp16`),
and the float64 references of a network whose operands are rounded as the library rounds
them (`network_reference` for TF32 layers, `half_network_reference` for half storage: what
the --check of a tf32 or fp16 build compares with).
"""
import numpy as np

from .errors import AotconvError

PRECISIONS = ("fp32", "tf32", "fp16")
BUILT = PRECISIONS
DEFAULT = "fp32"
# the arithmetic of each build: fp16 stores half and computes in FP32
MATH = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp32"}
# most precise first: a build allows the variants at or before its arithmetic's place
_ORDER = {"fp32": 0, "tf32": 1}
NAMES = {"fp32": "FP32", "tf32": "TF32", "fp16": "FP16"}
# how each build stores weights and activations in device memory, and the bytes of an element
STORAGE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}
ELEMENT_BYTES = {"fp32": 4, "fp16": 2}


def check(precision):
    """`precision` if a build can be made in it; else a one-line error that says what to use."""
    if precision is None:
        return DEFAULT
    if precision not in BUILT:
        raise AotconvError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    return precision


def of_variant(variant):
    """What `variant` (a Variant, or a variant name) computes in."""
    if isinstance(variant, str):
        from .variants import BY_NAME
        variant = BY_NAME[variant]
    return getattr(variant, "precision", DEFAULT)


def allows(build, variant_precision):
    """May a build of precision `build` run a kernel that computes in `variant_precision`?"""
    return _ORDER[variant_precision] <= _ORDER[MATH[build]]


def allowing(variant_precision):
    """The built precisions whose builds allow a kernel computing in `variant_precision`."""
    return [p for p in BUILT if allows(p, variant_precision)]


def reason(variant, target):
    """None when a build for `target` (a profile carrying its precision) may run `variant`,
    else why not: the spaces leave such a variant out, as they leave out one that does not
    implement the layer."""
    p, build = of_variant(variant), of_target(target)
    if not allows(build, p):
        return (f"{variant.name} computes in {NAMES[p]}: only a build of --precision "
                f"{' or '.join(allowing(p))} runs it")
    if STORAGE[build] == "fp16" and not getattr(variant, "half_storage", False):
        return storage_reason(variant)
    return None


def storage_reason(variant):
    """Why an fp16 build does not run `variant`."""
    return (f"{variant.name} has no half-storage kernel: only a build of --precision "
            f"{' or '.join(p for p in BUILT if STORAGE[p] == 'fp32')} runs it")


def of_target(target):
    """The precision a target profile carries (aotconv.context sets it; a profile as written
    is fp32)."""
    return getattr(target, "precision", DEFAULT) or DEFAULT


# -- half storage ------------------------------------------------------------------------------

def storage_of(layer):
    """How `layer`'s output and parameters are stored: "fp32", or "fp16" in an fp16 build."""
    return layer.attrs.get("storage", "fp32")


def src_storage_of(layer):
    """How the tensors `layer` reads are stored: its own storage, but for a cast (a
    layout_convert between a float and a half tensor, aotconv.layouts) its `src_storage`."""
    return layer.attrs.get("src_storage", storage_of(layer))


def element_bytes(storage):
    return ELEMENT_BYTES[storage]


def stored(net, precision):
    """`net` (after passes) as a build of `precision` stores it: for fp16 a copy whose every
    layer carries `storage: fp16` in its attributes (so its signature and every record key
    say so, and its kernels render half loads and stores); else `net` itself, unchanged."""
    import copy
    storage = STORAGE[check(precision)]
    if storage == "fp32":
        return net
    net = copy.deepcopy(net)
    for l in net.layers:
        l.attrs = dict(l.attrs, storage=storage)
    return net


def check_storage(layers, target):
    """Every layer of `layers` stored as a build for `target` stores it (an internal error
    otherwise: a network must go through `stored` before its kernels are chosen), and, for
    fp16, served by some variant with half storage: else a one-line error naming the layers
    none serves."""
    from .variants import active
    storage = STORAGE[of_target(target)]
    wrong = [l.name for l in layers if storage_of(l) != storage and l.op != "layout_convert"]
    if wrong:
        raise AotconvError(f"internal: layers {', '.join(wrong)} are not stored as the "
                           f"--precision {of_target(target)} build stores them")
    if storage == "fp32":
        return
    variants = active()
    missing = [l for l in layers
               if not any(v.supports(l) is None and reason(v, target) is None for v in variants)]
    if missing:
        raise AotconvError(
            f"--precision {of_target(target)}: no kernel variant stores half for "
            f"{len(missing)} layer(s): "
            + ", ".join(f"{l.name} ({l.op}{', line %d' % l.line if l.line else ''})"
                        for l in missing)
            + "; build the network with --precision fp32 or tf32")


# -- a schedule's precision --------------------------------------------------------------------

def reduced_layers(choices):
    """[(layer, precision)] of the choices ({layer: Choice}) whose variant computes in less
    than FP32, in the order given."""
    out = []
    for name, c in choices.items():
        p = of_variant(c.variant)
        if p != DEFAULT:
            out.append((name, p))
    return out


# the variants of an fp16 build that multiply on the tensor cores (FP32 math on the halves:
# a product of two halves is exact in FP32), which the header and report name
TENSOR_CORE_HALF = ("conv_mma_f16", "conv_mma_f16_nhwc", "conv_mma_f16_stem",
                    "conv_wgmma_f16_nhwc", "conv_wgmma_halo_f16_nhwc",
                    "conv_wgmma_halo_pool_f16_nhwc", "dense_mma_f16")


# the ops of the layers the summary counts as conv and dense layers
GEMM_OPS = frozenset(("conv", "dense", "conv_pool", "conv_dwpw"))


def summary(choices, requested=DEFAULT, storage="fp32"):
    """(what the library computes in, one sentence saying where): the header's and the
    report's precision. The library computes in `requested` only where a layer does: a tf32
    build where no tensor-core variant served a layer computes in FP32 and says so. `storage`:
    how its layers store their tensors ("fp16": an fp16 build)."""
    if storage == "fp16":
        text = ("FP16 storage of every layer's weights and output (the inputs and outputs "
                "float at the calls, converted on the device); FP32 math and accumulation in "
                "every layer")
        cores = sorted(n for n, c in choices.items() if c.variant in TENSOR_CORE_HALF)
        if cores:
            # the layers a conv or dense variant runs (a dense variant takes convolutions that
            # are dense layers too; a conv with its pool or its depthwise neighbour fused in
            # is one)
            gemms = sum(1 for c in choices.values() if c.impl.ops and GEMM_OPS & set(c.impl.ops))
            text += (f", on the tensor cores (f16 products, exact in FP32) in {len(cores)} of "
                     f"{gemms} conv and dense layers ({', '.join(cores)})")
        return "fp16", text
    reduced = reduced_layers(choices)
    convs = sum(1 for c in choices.values()
                if c.impl.ops and (GEMM_OPS - {"dense"}) & set(c.impl.ops))
    if not reduced:
        text = "FP32 storage and math in every layer"
        if requested != DEFAULT:
            text += (f" (--precision {requested} asked for {NAMES[requested]} where a "
                     f"tensor-core variant serves a conv layer; none did on this target)")
        return DEFAULT, text
    kinds = sorted({p for _, p in reduced}, key=_ORDER.get)
    names = ", ".join(n for n, _ in reduced)
    text = (f"FP32 storage; {'/'.join(NAMES[k] for k in kinds)} tensor-core math with FP32 "
            f"accumulation in {len(reduced)} of {convs} conv layers ({names}); FP32 math "
            f"everywhere else")
    return kinds[-1], text


def of_schedule(sch, target):
    """summary() of what `sch` (a Schedule, or a library of several batch sizes whose `sizes`
    each hold one) runs, for a build whose profile `target` carries the precision asked for."""
    sizes = getattr(sch, "sizes", None)
    scheds = [z.schedule for z in sizes] if sizes else [sch]
    choices = {}
    for s in scheds:
        choices.update(s.choices)
    half = any(storage_of(l) == "fp16" for s in scheds for l in s.net.layers)
    return summary(choices, of_target(target), "fp16" if half else "fp32")


# -- TF32 arithmetic in numpy ------------------------------------------------------------------

def round_tf32(a):
    """`a` (any float array) as float32 values rounded to TF32: 10 mantissa bits, to nearest,
    ties away from zero (PTX cvt.rna.tf32.f32); infinities and NaNs unchanged."""
    f = np.ascontiguousarray(np.asarray(a, np.float32))
    u = f.view(np.uint32)
    special = (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    r = (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(special, u, r).astype(np.uint32).view(np.float32)


def stochastic_tf32(a, rng):
    """`a` rounded to TF32 at random, as a Monte Carlo model of rounding (not what a kernel
    does): each float32 value goes to the TF32 value below or above its magnitude with the
    probability that makes the expected result the value itself (stochastic rounding);
    values already TF32, infinities and NaNs unchanged."""
    f = np.ascontiguousarray(np.asarray(a, np.float32))
    u = f.view(np.uint32)
    special = (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    low = u & np.uint32(0xFFFFE000)
    up = rng.random(u.shape) * 0x2000 < (u & np.uint32(0x1FFF))
    r = np.where(up, low + np.uint32(0x2000), low).astype(np.uint32)
    return np.where(special, u, r).astype(np.uint32).view(np.float32)


def network_reference(source, net, x, params, layers, rounding=None):
    """The float64 outputs of `source` (the network as written) on `x` with `params` ({layer:
    {tensor: array}}), where the conv layers `layers` of `net` (after passes) take their input
    and weight rounded to TF32 as the library's kernels do: a conv with batchnorms folded into
    it (passes.fold_batchnorm) rounds the folded weight w * gamma / sqrt(var + eps), computed
    in double and stored as float as set_params computes it, and the batchnorms then pass its
    output on. `x`: the input, or the inputs as reference.run_network takes them. `rounding`:
    what rounds the activations to TF32 instead of round_tf32 (RoundedReference.spread)."""
    from .graph import act_attrs
    from .passes import batchnorm_folds
    from .reference import conv, forward
    folds = batchnorm_folds(source, net)
    chains = {name: folds.get(name, []) for name in layers}
    src = {l.name: l for l in source.layers}
    values = {t: np.asarray(v, np.float64) for t, v in source.input_values(x).items()}
    skip = {}
    for layer in source.layers:
        ins = [values[i] for i in layer.inputs]
        if layer.name in skip:                      # a batchnorm folded into a TF32 conv
            values[layer.name] = values[skip[layer.name]]
            continue
        if layer.name not in chains:
            values[layer.name] = forward(layer, ins, params.get(layer.name, {}))
            continue
        p = params.get(layer.name, {})
        w = np.asarray(p["weight"], np.float64)
        b = np.asarray(p["bias"], np.float64) if "bias" in p else np.zeros(w.shape[0])
        a, s = layer.attrs, np.ones(w.shape[0])
        for bn in chains[layer.name]:               # set_params' fold (rt_net.c), in double
            q = {k: np.asarray(v, np.float64) for k, v in params[bn].items()}
            sk = q["gamma"] / np.sqrt(q["var"] + float(src[bn].attrs["eps"]))
            s = s * sk
            b = (b - q["mean"]) * sk + q["beta"]
            a = dict(a, **act_attrs(src[bn].attrs))
            skip[bn] = layer.name
        w = (w * s.reshape(-1, 1, 1, 1)).astype(np.float32)
        b = b.astype(np.float32)
        xr = (rounding or round_tf32)(ins[0]).astype(np.float64)
        wr = round_tf32(w).astype(np.float64)
        has_bias = "bias" in p or chains[layer.name]
        values[layer.name] = conv(xr, wr, b.astype(np.float64) if has_bias else None, a,
                                  layer.out_shape)
    return [values[o] for o in source.outputs]


SPREAD_SAMPLES = 4         # images evaluated with stochastic rounding, at least (spread)
SPREAD_FACTOR = 2.0        # a reduced-precision --check admits T + this x the spread


class RoundedReference:
    """A reference that rounds as a reduced-precision library rounds, and knows how far the
    network carries those roundings: `spread`, the farthest of SPREAD_SAMPLES evaluations in
    which every rounding that the library's precision makes of a computed value is stochastic
    instead of to nearest (Monte Carlo arithmetic), from the evaluation to nearest."""

    def __call__(self, x):
        return self.evaluate(x, None)

    def spread(self, x, want=None, samples=None, seed=0, cut=None):
        """The largest hybrid distance on `x` between this reference (`want`: its outputs,
        when already computed) and evaluations of it rounded stochastically: `samples` of
        them, by default as many as make SPREAD_SAMPLES images evaluated (the images of a
        batch are independent samples of the roundings), one at least; `cut`, where given,
        applied to each evaluation's outputs first (`want` is cut already)."""
        from .harness import close
        cut = cut or (lambda v: v)
        want = cut(self(x)) if want is None else want
        want = want if isinstance(want, list) else [want]
        if samples is None:
            images = (x[0] if isinstance(x, (list, tuple)) else np.asarray(x)).shape[0]
            samples = -(-SPREAD_SAMPLES // max(images, 1))
        rng = np.random.default_rng(seed)
        worst = 0.0
        for _ in range(samples):
            other = cut(self.evaluate(x, rng))
            other = other if isinstance(other, list) else [other]
            worst = max([worst] + [close(a, b)[1] for a, b in zip(other, want)])
        return worst

    def tolerance(self, spread):
        """What a library checked against this reference may be off by, in hybrid error, on
        an input where its spread is `spread` (docs/precision.md, The network's tolerance)."""
        from .protocol import TOLERANCE
        return TOLERANCE + SPREAD_FACTOR * spread


def verdict(error, tolerance=None, spread=None):
    """(ok, text) of a --check: its largest hybrid error against the tolerance, and where that
    is past T, how (RoundedReference.tolerance)."""
    from .protocol import TOLERANCE
    tolerance = TOLERANCE if tolerance is None else tolerance
    ok = error <= tolerance
    if spread is None:
        return ok, f"max hybrid error {error:.2e} ({'ok' if ok else 'FAILED'})"
    return ok, (f"max hybrid error {error:.2e} (tolerance {tolerance:.2e} = T + "
                f"{SPREAD_FACTOR:g} x {spread:.2e}, the spread of this precision's roundings "
                f"through this network on this input: {'ok' if ok else 'FAILED'}; "
                f"docs/precision.md)")


class TF32Reference(RoundedReference):
    """What a build whose conv layers `layers` compute in TF32 checks its library against
    (--check): network_reference of the network as written, `source`, with the parameters
    `flat`; callable on an input batch like the other references of aotconv.compiler."""

    name = "the float64 numpy reference with the TF32 layers' operands rounded to TF32"

    def __init__(self, source, net, flat, layers):
        self.source, self.net, self.flat, self.layers = source, net, flat, list(layers)

    def evaluate(self, x, rng):
        """The outputs on `x`; with `rng`, each activation rounded to TF32 stochastically."""
        from .params import split
        rounding = None if rng is None else (lambda a: stochastic_tf32(a, rng))
        return network_reference(self.source, self.net, x, split(self.source, self.flat),
                                 self.layers, rounding)


def check_reference(sch, source, flat):
    """What the --check of the schedule `sch` of `source` compares with: a HalfReference when
    its layers store half, a TF32Reference when some compute in TF32, else None (the FP32
    reference stands)."""
    if any(storage_of(l) == "fp16" for l in sch.net.layers):
        return HalfReference(sch, flat)
    layers = [n for n, p in reduced_layers(sch.choices) if p == "tf32"]
    return TF32Reference(source, sch.net, flat, layers) if layers else None


# -- half storage in numpy ---------------------------------------------------------------------

def round_fp16(a):
    """`a` (any float array) rounded to half as the library rounds it (vstore_half_rte and
    set_params: to nearest, ties to even, subnormals kept, overflow to infinity), as float64."""
    with np.errstate(over="ignore"):               # past 65504: infinity, as the device's
        return np.asarray(a).astype(np.float16).astype(np.float64)


def stochastic_fp16(a, rng):
    """`a` rounded to half at random, as a Monte Carlo model of rounding (not what a kernel
    does): each value goes to the half below or above it with the probability that makes the
    expected result the value itself (stochastic rounding); halves, values past the largest
    half, infinities and NaNs as round_fp16 leaves them. float64."""
    a = np.asarray(a, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        near = a.astype(np.float16)
        far = np.nextafter(near, np.where(a > near, np.inf, -np.inf).astype(np.float16))
        n64, f64 = near.astype(np.float64), far.astype(np.float64)
        fixed = (a == n64) | ~np.isfinite(n64) | ~np.isfinite(f64)
        p = np.where(fixed, 0.0, np.abs(a - n64) / np.where(fixed, 1.0, np.abs(f64 - n64)))
    return np.where(rng.random(a.shape) < p, f64, n64)


def half_params(sch, flat):
    """{layer: {tensor: float64 array}} of the parameters of the schedule `sch` (its net's
    layers) as an fp16 library holds them after set_params(`flat`): each tensor of the user's
    rounded from float32 to half; a weight and bias folded with batchnorms computed as
    set_params computes them (per channel in double, rounded to float32), then to half."""
    flat = np.asarray(flat, np.float32).ravel()
    shapes = {f"{l.name}.{t}": (l.name, t, tuple(s)) for l in sch.net.layers for t, s in l.params}
    out = {}
    for p in sch.params:
        lname, tname, shape = shapes[p.name]
        out.setdefault(lname, {})[tname] = round_fp16(flat[p.offset:p.offset + p.count]
                                                      .reshape(shape))
    for f in sch.folds:
        w = flat[f.weight_offset:f.weight_offset + f.channels * f.per_channel].astype(np.float64)
        w = w.reshape(f.channels, f.per_channel)
        b = (flat[f.bias_offset:f.bias_offset + f.channels].astype(np.float64)
             if f.bias_offset is not None else np.zeros(f.channels))
        s = np.ones(f.channels)
        for _, g, beta, mean, var, eps in f.batchnorms:    # set_folds (rt_net.c), in double
            sk = flat[g:g + f.channels] / np.sqrt(flat[var:var + f.channels].astype(np.float64)
                                                  + eps)
            s = s * sk
            b = (b - flat[mean:mean + f.channels]) * sk + flat[beta:beta + f.channels]
        lname, _, wshape = shapes[f"{f.layer}.weight"]
        out.setdefault(lname, {})["weight"] = round_fp16(
            (w * s.reshape(-1, 1)).astype(np.float32).reshape(wshape))
        out[lname]["bias"] = round_fp16(b.astype(np.float32))
    return out


def half_network_reference(sch, x, params, dtype=np.float64, rounding=None):
    """The float64 outputs of the schedule `sch` of an fp16 build on `x` (the input, or the
    inputs as reference.run_network takes them) with `params` (half_params): every layer of
    the network as the library runs it (after passes, fusion, layout conversions and casts)
    computes in float64 on its inputs and parameters as stored, and its output is rounded to
    half where the library stores it in half; the casts to float at the outputs are exact.
    A layer that stores half and reads float (a cast, or a layer that took one:
    aotconv.layouts.fuse_casts) rounds what it reads to half first, as its kernel does.
    `dtype` np.float32: every layer computes in float32 instead. `rounding`: what rounds the
    stored outputs instead of round_fp16 (RoundedReference.spread)."""
    from .ops import is_alias
    from .reference import forward
    net = sch.net
    values = {t: np.asarray(v, dtype) for t, v in net.input_values(x).items()}
    for layer in net.layers:
        xs = [values[i] for i in layer.inputs]
        if storage_of(layer) == "fp16" and src_storage_of(layer) == "fp32":
            xs = [round_fp16(v).astype(dtype) for v in xs]
        y = forward(layer, xs, params.get(layer.name, {}), dtype)
        if storage_of(layer) == "fp16" and not is_alias(layer):
            y = (rounding or round_fp16)(y).astype(dtype)
        values[layer.name] = y
    return [np.asarray(values[o], np.float64) for o in net.outputs]


class HalfReference(RoundedReference):
    """What an fp16 build checks its library against (--check): half_network_reference of
    the schedule `sch` with the parameters `flat`; callable on an input batch like the other
    references of aotconv.compiler."""

    name = ("the float64 numpy reference with every weight and every layer's stored output "
            "rounded to half")

    def __init__(self, sch, flat):
        self.sch = sch
        self.params = half_params(sch, flat)

    def evaluate(self, x, rng):
        """The outputs on `x`; with `rng`, each stored output rounded to half stochastically
        (the parameters stay rounded to nearest: the library holds exactly those)."""
        rounding = None if rng is None else (lambda a: stochastic_fp16(a, rng))
        return half_network_reference(self.sch, x, self.params, rounding=rounding)

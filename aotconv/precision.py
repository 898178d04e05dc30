"""The arithmetic a build allows (`--precision`), what each variant computes in, and TF32.

    fp32  FP32 storage and math everywhere (the default).
    tf32  FP32 storage; every conv layer a tensor-core variant serves may multiply in TF32
          (10-bit mantissa, operands rounded to nearest, ties away from zero, as cvt.rna does)
          with FP32 accumulation; the tuner picks it where it measures faster, every other
          layer computes in FP32 (more precise, so within tf32's tolerance).
    fp16  half storage: not built yet; asking for it is an error that says what to use.

A variant declares what it computes in with a class attribute `precision` (FP32 when it has
none). A build of precision P allows the variants whose precision is at least as precise as P
(`allows`); aotconv.variants.limits turns that into a hardware-level constraint of every
reduced-precision variant, so spaces, records and fallbacks never offer a TF32 kernel to an
FP32 build. docs/precision.md has the rules and the tolerance derived for TF32
(aotconv.protocol checks tuning candidates with it).

The rest is for the reports and the checks: which layers of a schedule compute in TF32
(`reduced_layers`, `summary`), numpy's TF32 rounding (`round_tf32`), and the float64
reference of a network whose TF32 layers' operands are rounded as the library rounds them
(`network_reference`: what a tf32 build's --check compares with).
"""
import numpy as np

from .errors import AotconvError

PRECISIONS = ("fp32", "tf32", "fp16")
BUILT = ("fp32", "tf32")
DEFAULT = "fp32"
# most precise first: a build allows the variants at or before its own place
_ORDER = {"fp32": 0, "tf32": 1, "fp16": 2}
NAMES = {"fp32": "FP32", "tf32": "TF32", "fp16": "FP16"}


def check(precision):
    """`precision` if a build can be made in it; else a one-line error that says what to use."""
    if precision is None:
        return DEFAULT
    if precision == "fp16":
        raise AotconvError("--precision fp16: half-precision storage is not built yet; use "
                           "--precision tf32 (FP32 storage, TF32 tensor-core math on NVIDIA GPUs "
                           "of compute capability 8.0 or newer) or fp32")
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
    return _ORDER[variant_precision] <= _ORDER[build]


def allowing(variant_precision):
    """The built precisions whose builds allow a kernel computing in `variant_precision`."""
    return [p for p in BUILT if allows(p, variant_precision)]


def reason(variant, target):
    """None when a build for `target` (a profile carrying its precision) may run `variant`,
    else why not: the spaces leave such a variant out, as they leave out one that does not
    implement the layer."""
    p = of_variant(variant)
    if allows(of_target(target), p):
        return None
    return (f"{variant.name} computes in {NAMES[p]}: only a build of --precision "
            f"{' or '.join(allowing(p))} runs it")


def of_target(target):
    """The precision a target profile carries (aotconv.context sets it; a profile as written
    is fp32)."""
    return getattr(target, "precision", DEFAULT) or DEFAULT


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


def summary(choices, requested=DEFAULT):
    """(what the library computes in, one sentence saying where): the header's and the
    report's precision. The library computes in `requested` only where a layer does: a tf32
    build where no tensor-core variant served a layer computes in FP32 and says so."""
    reduced = reduced_layers(choices)
    convs = sum(1 for c in choices.values() if c.impl.ops and "conv" in c.impl.ops)
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
    return summary(choices, of_target(target))


# -- TF32 arithmetic in numpy ------------------------------------------------------------------

def round_tf32(a):
    """`a` (any float array) as float32 values rounded to TF32: 10 mantissa bits, to nearest,
    ties away from zero (PTX cvt.rna.tf32.f32); infinities and NaNs unchanged."""
    f = np.ascontiguousarray(np.asarray(a, np.float32))
    u = f.view(np.uint32)
    special = (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    r = (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(special, u, r).astype(np.uint32).view(np.float32)


def network_reference(source, net, x, params, layers):
    """The float64 outputs of `source` (the network as written) on `x` with `params` ({layer:
    {tensor: array}}), where the conv layers `layers` of `net` (after passes) take their input
    and weight rounded to TF32 as the library's kernels do: a conv with batchnorms folded into
    it (passes.fold_batchnorm) rounds the folded weight w * gamma / sqrt(var + eps), computed
    in double and stored as float as set_params computes it, and the batchnorms then pass its
    output on. `x`: the input, or the inputs as reference.run_network takes them."""
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
        xr = round_tf32(ins[0]).astype(np.float64)
        wr = round_tf32(w).astype(np.float64)
        has_bias = "bias" in p or chains[layer.name]
        values[layer.name] = conv(xr, wr, b.astype(np.float64) if has_bias else None, a,
                                  layer.out_shape)
    return [values[o] for o in source.outputs]


class TF32Reference:
    """What a build whose conv layers `layers` compute in TF32 checks its library against
    (--check): network_reference of the network as written, `source`, with the parameters
    `flat`; callable on an input batch like the other references of aotconv.compiler."""

    name = "the float64 numpy reference with the TF32 layers' operands rounded to TF32"

    def __init__(self, source, net, flat, layers):
        self.source, self.net, self.flat, self.layers = source, net, flat, list(layers)

    def __call__(self, x):
        from .params import split
        return network_reference(self.source, self.net, x, split(self.source, self.flat),
                                 self.layers)


def check_reference(sch, source, flat):
    """A TF32Reference for the schedule `sch` of `source` when some of its layers compute in
    TF32, else None (the FP32 reference stands)."""
    layers = [n for n, p in reduced_layers(sch.choices) if p == "tf32"]
    return TF32Reference(source, sch.net, flat, layers) if layers else None

"""The validated network: layers in topological order with inferred shapes, and graph passes.

Every tensor is 4-D NCHW float32 (N, C, H, W); dense and flatten produce (N, F, 1, 1), so a
flatten is free and every kernel sees one shape convention.

Normalised layer attributes (spec.py produces them, variants and the reference read them):

    conv       out, kernel (kh, kw), stride (sh, sw), pad (top, left, bottom, right),
               dilation (dh, dw), groups, bias, act, alpha [+ the act's extras]
    dense      out, bias, act, alpha [+ extras]
    maxpool    kernel (kh, kw), stride (sh, sw), pad (ph, pw), ceil_mode
    avgpool    the same plus count_include_pad
    global_avgpool, softmax, concat, flatten, dropout (p)
    an activation op (ACT_OPS)   act (= the op), alpha [+ extras]
    lrn        size, alpha, beta, k
    add        act, alpha [+ extras]
    batchnorm  eps, act, alpha [+ extras]

`act` is one of ACTS. `alpha` is the slope of leaky_relu and hardsigmoid (0.01 and ignored for
the other acts). The extras (ACT_EXTRAS) are present only on layers whose act reads them, so
that a layer's signature, part of every tuning-record key, is the same as before they existed
for every other layer: clip has `min` and `max` (a float, or None for no bound), hardsigmoid
`beta`. Definitions (reference.act is the executable form):

    relu6        min(max(x, 0), 6)
    clip         min(max(x, min), max), a bound that is None left out
    hardsigmoid  min(max(alpha * x + beta, 0), 1)
    hardswish    x * min(max(x + 3, 0), 6) / 6
    silu         x * sigmoid(x)
    gelu         x / 2 * (1 + erf(x / sqrt(2)))
    gelu_tanh    x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))
"""
from dataclasses import dataclass, field

from .names import c_ident  # noqa: F401  (where the other modules import it from)

ACTS = ("none", "relu", "sigmoid", "tanh", "leaky_relu", "relu6", "clip", "hardsigmoid",
        "hardswish", "silu", "gelu", "gelu_tanh")
# every activation is also a layer op of the same name
ACT_OPS = ACTS[1:]
# the attributes an activation reads beyond `act` and `alpha`
ACT_EXTRAS = {"clip": ("min", "max"), "hardsigmoid": ("beta",)}
# ops that take a fused activation in their epilogue
FUSABLE = ("conv", "dense", "add", "batchnorm", "conv_transpose")
# ops that move no data: their output is their input's buffer
ALIAS_OPS = ("flatten", "dropout")


def act_attrs(attrs):
    """The activation attributes of a layer's normalised attrs: act, alpha and its extras
    (what fusing an activation layer into its producer copies)."""
    kind = attrs["act"]
    return {k: attrs[k] for k in ("act", "alpha") + ACT_EXTRAS.get(kind, ())}


def act_monotone(attrs):
    """Is the layer's activation non-decreasing? Then it commutes with a max (a fused max pool
    may apply it once, after the max). hardswish, silu and the gelus dip below zero."""
    kind = attrs.get("act", "none")
    if kind in ("leaky_relu", "hardsigmoid"):
        return attrs["alpha"] >= 0
    return kind in ("none", "relu", "sigmoid", "tanh", "relu6", "clip")


@dataclass
class Layer:
    name: str
    op: str
    attrs: dict
    inputs: list                      # names of producing layers, or "input"
    line: int = None                  # line in the net.yaml, for error messages
    in_shapes: list = field(default_factory=list)
    out_shape: tuple = None
    params: list = field(default_factory=list)   # [(tensor name, shape)] in file order
    fused: list = field(default_factory=list)    # names of layers folded into this one
    index: int = None                 # position in the file (parameter order), when known
    # {param tensor: (layer, tensor) of the network as written} where a fusion gave this layer
    # another layer's tensor (passes.fuse_dwpw); every other tensor is (this layer, tensor)
    origins: dict = field(default_factory=dict)

    @property
    def in_shape(self):
        return self.in_shapes[0]

    def signature(self):
        """What determines the kernel: op, shapes and attributes, not the name."""
        attrs = tuple(sorted((k, v) for k, v in self.attrs.items()))
        return (self.op, tuple(map(tuple, self.in_shapes)), tuple(self.out_shape), attrs)

    def signature_str(self):
        op, ins, out, attrs = self.signature()
        a = ",".join(f"{k}={v}" for k, v in attrs)
        return f"{op}|{'+'.join('x'.join(map(str, s)) for s in ins)}|{'x'.join(map(str, out))}|{a}"


INPUT = "input"                       # the name of a network's one input (net.yaml `input:`)


@dataclass
class Network:
    """A network in topological order. Its inputs are `inputs`: [(name, shape)] in the order
    of the library's calls; a network of one input (net.yaml `input:`) has the one named
    `input`, of shape `input_shape`. With several (net.yaml `inputs:`), `input_shape` is the
    first one's and `named_inputs` holds them all."""
    name: str
    input_shape: tuple                # the (first) input's shape, N first
    layers: list                      # topological order
    outputs: list                     # layer names
    file: str = None
    named_inputs: list = None         # [(name, shape)] of a net.yaml's `inputs:`; None: `input`

    @property
    def inputs(self):
        """[(name, shape)] of the network's inputs, in the order the library takes them."""
        if self.named_inputs:
            return [(n, tuple(s)) for n, s in self.named_inputs]
        return [(INPUT, tuple(self.input_shape))]

    @property
    def input_names(self):
        return [n for n, _ in self.inputs]

    def is_input(self, tensor):
        return tensor in self.input_names

    def input_values(self, x):
        """{input name: array} of `x`: one array (a network of one input), a list or tuple of
        arrays in input order, or a dict by name; a wrong number or name is a ValueError."""
        names = self.input_names
        if isinstance(x, dict):
            if set(x) != set(names):
                raise ValueError(f"network '{self.name}' takes inputs {', '.join(names)}; "
                                 f"got {', '.join(map(str, x))}")
            return {n: x[n] for n in names}
        if isinstance(x, (list, tuple)) and len(names) > 1:
            if len(x) != len(names):
                raise ValueError(f"network '{self.name}' takes {len(names)} inputs "
                                 f"({', '.join(names)}); got {len(x)}")
            return dict(zip(names, x))
        if len(names) != 1:
            raise ValueError(f"network '{self.name}' takes {len(names)} inputs "
                             f"({', '.join(names)}); give a list or a dict of them")
        return {names[0]: x}

    def layer(self, name):
        for l in self.layers:
            if l.name == name:
                return l
        raise KeyError(name)

    def shape_of(self, tensor):
        for n, s in self.inputs:
            if n == tensor:
                return tuple(s)
        return tuple(self.layer(tensor).out_shape)

    def param_layout(self):
        """[(layer, tensor, shape, offset)] in the documented order: layers in file order."""
        out, off = [], 0
        def file_order(l):
            return (l.index if l.index is not None else (l.line or 0), l.line or 0)
        for l in sorted(self.layers, key=file_order):
            for pname, shape in l.params:
                n = 1
                for d in shape:
                    n *= d
                out.append((l.name, pname, tuple(shape), off))
                off += n
        return out

    def param_count(self):
        lay = self.param_layout()
        if not lay:
            return 0
        _, _, shape, off = lay[-1]
        n = 1
        for d in shape:
            n *= d
        return off + n


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n

"""The validated network: layers in topological order with inferred shapes, and graph passes.

Every tensor is 4-D NCHW float32 (N, C, H, W); dense and flatten produce (N, F, 1, 1), so a
flatten is free and every kernel sees one shape convention.

Normalised layer attributes (spec.py produces them, variants and the reference read them):

    conv       out, kernel (kh, kw), stride (sh, sw), pad (top, left, bottom, right),
               dilation (dh, dw), groups, bias, act, alpha
    dense      out, bias, act, alpha
    maxpool    kernel (kh, kw), stride (sh, sw), pad (ph, pw), ceil_mode
    avgpool    the same plus count_include_pad
    global_avgpool, softmax, concat, flatten, dropout (p)
    relu / sigmoid / tanh / leaky_relu   act (= the op), alpha
    lrn        size, alpha, beta, k
    add        act, alpha
    batchnorm  eps, act, alpha

`act` is one of none, relu, sigmoid, tanh, leaky_relu; `alpha` is the leaky slope.
"""
from dataclasses import dataclass, field

from .names import c_ident  # noqa: F401  (where the other modules import it from)

ACTS = ("none", "relu", "sigmoid", "tanh", "leaky_relu")
ACT_OPS = ("relu", "sigmoid", "tanh", "leaky_relu")
# ops that take a fused activation in their epilogue
FUSABLE = ("conv", "dense", "add", "batchnorm")
# ops that move no data: their output is their input's buffer
ALIAS_OPS = ("flatten", "dropout")


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


@dataclass
class Network:
    name: str
    input_shape: tuple
    layers: list                      # topological order
    outputs: list                     # layer names
    file: str = None

    def layer(self, name):
        for l in self.layers:
            if l.name == name:
                return l
        raise KeyError(name)

    def shape_of(self, tensor):
        return tuple(self.input_shape) if tensor == "input" else tuple(self.layer(tensor).out_shape)

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

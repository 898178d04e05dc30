## Shared Mako helpers for kernel templates.
## act(kind, alpha, x): the fused activation applied to the float expression x. The acts with
## more parameters than alpha (clip's bounds, hardsigmoid's beta) and the longer formulas are
## inline functions act_<kind>(x) that helpers() defines from the layer's attrs (the render
## namespace's `attrs`, or `p` where a template passes them).
<%def name="act(kind, alpha, x, p=None)" filter="trim">
% if kind == "none":
${x}
% elif kind == "relu":
fmax(${x}, 0.0f)
% elif kind == "leaky_relu":
leaky(${x}, ${flt(alpha)})
% elif kind == "sigmoid":
(1.0f / (1.0f + exp(-(${x}))))
% elif kind == "tanh":
tanh(${x})
% elif kind == "relu6":
fmin(fmax(${x}, 0.0f), 6.0f)
% else:
act_${_act_fn(kind, p if p is not None else context.get("attrs"))}(${x})
% endif
</%def>
## helpers(p=None): small inline functions every kernel file may use; with an activation that
## needs one (see act), its act_<kind> too.
<%def name="helpers(p=None)">
inline float leaky(float x, float a) { return x > 0.0f ? x : a * x; }
<% a = p if p is not None else context.get("attrs") %>\
% if isinstance(a, dict) and a.get("act") in _ACT_BODIES:
inline float act_${a["act"]}(float x) { return ${_act_body(a)}; }
% endif
</%def>
## flt(v): v as an OpenCL float literal that always parses ("1.0f", not "1f").
<%!
def _flt(v):
    s = "%.9g" % float(v)
    return (s if any(ch in s for ch in ".e") else s + ".0") + "f"


# the acts written as an inline function act_<kind>(x), and its body
_ACT_BODIES = ("clip", "hardsigmoid", "hardswish", "silu", "gelu", "gelu_tanh")


def _act_body(a):
    kind = a["act"]
    if kind == "clip":
        body = "x"
        if a["min"] is not None:
            body = "fmax(%s, %s)" % (body, _flt(a["min"]))
        if a["max"] is not None:
            body = "fmin(%s, %s)" % (body, _flt(a["max"]))
        return body
    if kind == "hardsigmoid":
        return "fmin(fmax(%s * x + %s, 0.0f), 1.0f)" % (_flt(a["alpha"]), _flt(a["beta"]))
    if kind == "hardswish":
        return "x * (fmin(fmax(x + 3.0f, 0.0f), 6.0f) / 6.0f)"
    if kind == "silu":
        return "x / (1.0f + exp(-x))"
    if kind == "gelu":
        return "0.5f * x * (1.0f + erf(x * 0.707106781f))"
    if kind == "gelu_tanh":
        return "0.5f * x * (1.0f + tanh(0.797884561f * (x + 0.044715f * x * x * x)))"
    raise ValueError(kind)


def _act_fn(kind, a):
    """The name suffix of act_<kind>, checked against the attrs helpers() defined it from."""
    if kind not in _ACT_BODIES:
        raise ValueError("unknown activation %r" % (kind,))
    if not isinstance(a, dict) or a.get("act") != kind:
        raise ValueError("act %r needs the layer's attrs (act_%s is defined by helpers())"
                         % (kind, kind))
    return kind
%>
<%def name="flt(v)" filter="trim">
${_flt(v)}
</%def>
## Storage: how a kernel reads and writes its global tensor buffers (inputs, outputs, the
## layer's parameters). The render namespace's `storage` (aotconv.variants.base: the layer's
## storage, aotconv.precision) is "fp32" (float buffers, read and written as today's kernels
## do) or "fp16" (half buffers: vload_half / vstore_half_rte, core OpenCL on every device;
## the arithmetic stays FP32). Every helper takes `s` to name another storage for one buffer (a
## __local tile, a variant's own FP32 buffer, a cast's input). In fp32 each expands to exactly
## the text the templates had before storage existed, so an FP32 kernel renders unchanged.
##   T()                      the element type of a buffer: float | half
##   LOAD(p, i)               element i of p, as a float
##   LOADV(n, p, i)           n-vector i of p (elements n*i ..), as a floatn (n = 1: LOAD)
##   LOADAT(pt, n, ptr)       the n-vector at pointer ptr: *(pt)ptr in fp32 (pt the pointer's
##                            type and ptr as the template writes them)
##   STORE(p, i, v)           element i of p = v (no semicolon)
##   STOREV(n, p, i, v)       n-vector i of p = v (n = 1: STORE)
##   STOREAT(pt, n, ptr, v)   the n-vector at pointer ptr = v: *(pt)ptr = v in fp32
##   TV(t)                    the type of a buffer read as n-vectors of type t: t | half
##   LOADVEC(n, p, i)         n-vector i of such a buffer p: p[i] | vload_halfn(i, p)
<%!
def _half(context, s):
    return (s or context.get("storage", None) or "fp32") == "fp16"


def _n(n):
    return "" if int(n) == 1 else str(int(n))
%>
<%def name="T(s=None)" filter="trim">
${"half" if _half(context, s) else "float"}
</%def>
<%def name="LOAD(p, i, s=None)" filter="trim">
% if _half(context, s):
vload_half(${i}, ${p})
% else:
${p}[${i}]
% endif
</%def>
<%def name="LOADV(n, p, i, s=None)" filter="trim">
% if int(n) == 1:
${LOAD(p, i, s)}
% elif _half(context, s):
vload_half${n}(${i}, ${p})
% else:
vload${n}(${i}, ${p})
% endif
</%def>
<%def name="LOADAT(pt, n, ptr, s=None)" filter="trim">
% if _half(context, s):
vload_half${_n(n)}(0, ${ptr})
% else:
*(${pt})${ptr}
% endif
</%def>
<%def name="STORE(p, i, v, s=None)" filter="trim">
% if _half(context, s):
vstore_half_rte(${v}, ${i}, ${p})
% else:
${p}[${i}] = ${v}
% endif
</%def>
<%def name="STOREV(n, p, i, v, s=None)" filter="trim">
% if int(n) == 1:
${STORE(p, i, v, s)}
% elif _half(context, s):
vstore_half${n}_rte(${v}, ${i}, ${p})
% else:
vstore${n}(${v}, ${i}, ${p})
% endif
</%def>
<%def name="TV(t, s=None)" filter="trim">
${"half" if _half(context, s) else t}
</%def>
<%def name="LOADVEC(n, p, i, s=None)" filter="trim">
% if _half(context, s):
vload_half${_n(n)}(${i}, ${p})
% else:
${p}[${i}]
% endif
</%def>
<%def name="STOREAT(pt, n, ptr, v, s=None)" filter="trim">
% if _half(context, s):
vstore_half${_n(n)}_rte(${v}, 0, ${ptr})
% else:
*(${pt})${ptr} = ${v}
% endif
</%def>

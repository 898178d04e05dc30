## Shared Mako helpers for kernel templates.
## act(kind, alpha, x): the fused activation applied to the float expression x.
<%def name="act(kind, alpha, x)" filter="trim">
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
% endif
</%def>
## helpers(): small inline functions every kernel file may use.
<%def name="helpers()">
inline float leaky(float x, float a) { return x > 0.0f ? x : a * x; }
</%def>
## flt(v): v as an OpenCL float literal that always parses ("1.0f", not "1f").
<%!
def _flt(v):
    s = "%.9g" % float(v)
    return (s if any(ch in s for ch in ".e") else s + ".0") + "f"
%>
<%def name="flt(v)" filter="trim">
${_flt(v)}
</%def>

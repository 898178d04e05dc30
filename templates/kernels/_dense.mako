<%namespace name="c" file="_common.mako"/>\
## What the dense-layer templates share.
## reduce(prefix, has_bias, act_kind, alpha): the split-K epilogue launch, y[N][OUT] = act(bias +
## the sum of the KSPLIT partial sums part[KSPLIT][N][OUT]) in the storage of the build (the
## template defines N, OUT and KSPLIT).
<%def name="reduce(prefix, has_bias, act_kind, alpha)">\
// y = act(bias + sum of the KSPLIT partial sums)
__kernel void ${prefix}_reduce(const __global float* restrict part,
% if has_bias:
                               const __global ${c.T()}* restrict bias,
% endif
                               __global ${c.T()}* restrict y)
{
    const int o = get_global_id(0), b = get_global_id(1);
    if (o >= OUT)
        return;
    float r = ${capture(c.LOAD, "bias", "o") if has_bias else "0.0f"};
    #pragma unroll
    for (int s = 0; s < KSPLIT; ++s)
        r += part[(s * N + b) * OUT + o];
    ${c.STORE("y", "b * OUT + o", capture(c.act, act_kind, alpha, "r").strip())};
}
</%def>

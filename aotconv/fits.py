"""Does a network fit its target's memory? Checked by `choose`, before anything is tuned, built
or allocated (the parameters included: they are generated after the choice).

- Every tensor (the network input, each layer's output, each parameter tensor) must fit one
  buffer of the target: `max_alloc_bytes`, CL_DEVICE_MAX_MEM_ALLOC_SIZE.
- The least the network can run in, all its parameters plus the largest layer's inputs and
  output (no buffer plan does with less), must fit its global memory: `global_mem_bytes`.

A failure is one SpecError naming the network file and line, the layer, the tensor, the limit
and what to do (the largest batch that fits, when a smaller batch helps). The variants' own
buffers and scratch are checked per point by aotconv.space (device.max_alloc), and every index
the kernels compute by device.index_width; spec.py keeps each tensor within INT_MAX elements.
"""
from .errors import SpecError
from .graph import count
from .ops import is_alias
from .space import INDEX_LIMIT

FLOAT = 4       # bytes: every tensor is float32


def human(nbytes):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def _shape(shape):
    return "x".join(map(str, shape))


def _tensors(layer, net):
    """[(what, shape, scales with the batch)] of the tensors `layer` adds to the network: the
    network input (for the layers that read it), its output, its parameters."""
    out = []
    for t in dict.fromkeys(layer.inputs):
        if net.is_input(t):
            what = "the network input" if len(net.inputs) == 1 else f"the network input '{t}'"
            out.append((what, net.shape_of(t), True))
    if not is_alias(layer):
        out.append(("its output", tuple(layer.out_shape), True))
    out += [(f"its parameter '{name}'", tuple(shape), False) for name, shape in layer.params]
    return out


def _max_batch(net, target):
    """The largest batch at which every tensor that scales with the batch fits one buffer and
    the kernels' indices, and the network fits the global memory (parameters do not scale)."""
    n = net.input_shape[0]
    per = [count(s) // n for _, s in net.inputs]
    peak = 0
    for layer in net.layers:
        if is_alias(layer):
            continue
        per.append(count(layer.out_shape) // n)
        peak = max(peak, (sum(count(s) for s in layer.in_shapes) + count(layer.out_shape)) // n)
    most = INDEX_LIMIT // max(per)
    if target.max_alloc_bytes:
        most = min(most, target.max_alloc_bytes // (FLOAT * max(per)))
    if target.global_mem_bytes and peak:
        params = sum(count(s) for l in net.layers for _, s in l.params) * FLOAT
        most = min(most, max(0, target.global_mem_bytes - params) // (FLOAT * peak))
    return most


def _hint(net, target, batched):
    """What to do about a tensor that does not fit: the largest batch that fits, when the
    tensor scales with the batch and some batch does."""
    most = _max_batch(net, target) if batched else 0
    if 1 <= most < net.input_shape[0]:
        return f"use a smaller batch (--batch {most} or less)"
    return "make the layer smaller" + (" (it does not fit even at batch 1)" if batched else "")


def _error(net, layer, message):
    return SpecError(message, file=net.file, line=layer.line, layer=layer.name)


def check_memory(net, target, layers=None):
    """Raise a SpecError if a tensor of `net` exceeds `target`'s largest allocation or the
    network cannot fit its global memory; `layers` (default: all) are the ones checked one
    tensor at a time."""
    layers = net.layers if layers is None else layers
    n = net.input_shape[0]
    cap = target.max_alloc_bytes
    if cap:
        for layer in layers:
            for what, shape, batched in _tensors(layer, net):
                size = count(shape) * FLOAT
                if size <= cap:
                    continue
                hint = _hint(net, target, batched)
                raise _error(net, layer, f"{what} ({_shape(shape)} floats, {human(size)}) is "
                             f"larger than the largest buffer target '{target.name}' can "
                             f"allocate ({human(cap)}); {hint}")
    total = target.global_mem_bytes
    if not total:
        return
    params = sum(count(s) for l in net.layers for _, s in l.params) * FLOAT
    peak, peak_layer = 0, None
    for layer in net.layers:
        if is_alias(layer):
            continue
        live = sum(count(s) for s in layer.in_shapes) + count(layer.out_shape)
        if live > peak:
            peak, peak_layer = live, layer
    need = params + peak * FLOAT
    if need <= total or peak_layer is None:
        return
    most = _max_batch(net, target)
    hint = (f"use a smaller batch (--batch {most} or less)" if 1 <= most < n else
            "use a smaller network")
    raise _error(net, peak_layer, f"the network needs at least {human(need)} of device memory "
                 f"(its parameters, {human(params)}, and this layer's inputs and output, "
                 f"{human(peak * FLOAT)}), more than target '{target.name}' has "
                 f"({human(total)}); {hint}")

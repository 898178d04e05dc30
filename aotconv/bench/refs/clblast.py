"""CLBlast's convgemm (CLBlastSconvgemm, libclblast.so.1) through ctypes, on pyopencl buffers.

The signature and the layouts are CLBlast's own (include/clblast_c.h, doc/api.md, 1.5.x):

    CLBlastStatusCode CLBlastSconvgemm(kernel_mode, channels, height, width, kernel_h, kernel_w,
        pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, num_kernels, batch_count,
        cl_mem im, size_t im_offset, cl_mem kernel, size_t kernel_offset,
        cl_mem result, size_t result_offset, cl_command_queue *queue, cl_event *event)

im is NCHW, kernel KCHW (= [out, in, kh, kw], PyTorch's layout), result NCHW; offsets count
floats. Kernel mode 151 is cross-correlation (what frameworks call convolution). Padding is
symmetric, there are no groups and no bias: layers outside that are reported as unsupported.
Since 1.5 the routine is one kernel (XconvgemmNormal), so the returned event times all of it.
pyopencl's wheel carries its own ICD loader and CLBlast links the system's; both dispatch
through the driver's object, so the handles cross between them unchanged. `ClblastConv` is a
subject of aotconv.protocol: verified and timed exactly as our kernels are.
"""
import ctypes
import ctypes.util
import os

import numpy as np
import pyopencl as cl

CROSS_CORRELATION = 151

# CLBlastStatusCode values that are not OpenCL error codes (clblast_c.h)
STATUS = {
    -1024: "NotImplemented", -1017: "InvalidDimension", -1011: "InsufficientMemoryA",
    -1010: "InsufficientMemoryB", -1009: "InsufficientMemoryC", -2050: "InsufficientMemoryTemp",
    -2049: "InvalidBatchCount", -2048: "InvalidOverrideKernel", -2047: "MissingOverrideParameter",
    -2046: "InvalidLocalMemUsage", -2041: "DatabaseError", -2040: "UnknownError",
    -2039: "UnexpectedError",
}

LIB_NAMES = ("libclblast.so.1", "libclblast.so")


class ClblastError(RuntimeError):
    pass


def status_name(code):
    if code in STATUS:
        return f"CLBlast{STATUS[code]} ({code})"
    for name in dir(cl.status_code):
        if not name.startswith("_") and getattr(cl.status_code, name) == code:
            return f"CL_{name} ({code})"
    return f"status {code}"


_lib = {}


def load():
    """The loaded library, or raise ClblastError saying where it was looked for."""
    if "lib" in _lib:
        return _lib["lib"]
    tried = []
    names = [os.environ["AOTCONV_CLBLAST"]] if os.environ.get("AOTCONV_CLBLAST") else []
    found = ctypes.util.find_library("clblast")
    names += list(LIB_NAMES) + ([found] if found else [])
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
            continue
        f = lib.CLBlastSconvgemm
        f.restype = ctypes.c_int
        f.argtypes = ([ctypes.c_int] + [ctypes.c_size_t] * 13
                      + [ctypes.c_void_p, ctypes.c_size_t] * 3
                      + [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)])
        _lib["lib"] = lib
        return lib
    raise ClblastError("libclblast.so.1 not found (apt-get install libclblast1, or set "
                       "AOTCONV_CLBLAST to its path); tried: " + "; ".join(tried))


def available():
    """(True, path-ish note) or (False, why)."""
    try:
        lib = load()
    except ClblastError as e:
        return False, str(e)
    return True, getattr(lib, "_name", "libclblast")


def unsupported(layer):
    """None when convgemm computes `layer` exactly, else why not."""
    a = layer.attrs
    pt, pl, pb, pr = a["pad"]
    if layer.op != "conv":
        return f"op {layer.op}"
    if a["groups"] != 1:
        return "grouped convolution"
    if (pt, pl) != (pb, pr):
        return "asymmetric padding"
    if a["bias"] or a["act"] != "none":
        return "bias or activation (convgemm has no epilogue)"
    return None


class ClblastConv:
    """One conv layer as CLBlastSconvgemm over `copies` sets of buffers (rotated when timing)."""

    def __init__(self, ctx, queue, layer, x, w, copies=1):
        why = unsupported(layer)
        if why:
            raise ClblastError(f"convgemm does not support this layer: {why}")
        self.lib, self.ctx, self.queue, self.layer = load(), ctx, queue, layer
        mf = cl.mem_flags
        x = np.ascontiguousarray(x, np.float32)
        w = np.ascontiguousarray(w, np.float32)
        nout = int(np.prod(layer.out_shape))
        self.sets = []
        for _ in range(max(1, copies)):
            self.sets.append((cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x),
                              cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=w),
                              cl.Buffer(ctx, mf.READ_WRITE, 4 * nout)))
        self._queue_ptr = ctypes.c_void_p(queue.int_ptr)
        a = layer.attrs
        n, c, h, wd = layer.in_shape
        self.dims = (c, h, wd, a["kernel"][0], a["kernel"][1], a["pad"][0], a["pad"][1],
                     a["stride"][0], a["stride"][1], a["dilation"][0], a["dilation"][1],
                     layer.out_shape[1], n)

    def run(self, i=0):
        """Enqueue copy i's convolution; returns its pyopencl Event (profiling when enabled)."""
        im, ker, res = self.sets[i % len(self.sets)]
        ev = ctypes.c_void_p()
        st = self.lib.CLBlastSconvgemm(CROSS_CORRELATION, *self.dims,
                                       im.int_ptr, 0, ker.int_ptr, 0, res.int_ptr, 0,
                                       ctypes.byref(self._queue_ptr), ctypes.byref(ev))
        if st != 0:
            raise ClblastError(f"CLBlastSconvgemm returned {status_name(st)}")
        return cl.Event.from_int_ptr(ev.value, retain=False) if ev.value else None

    # -- the protocol's subject

    timed = run

    @property
    def copies(self):
        return len(self.sets)

    def poison(self):
        cl.enqueue_copy(self.queue, self.sets[0][2],
                        np.full(int(np.prod(self.layer.out_shape)), np.nan, np.float32))

    def finish(self):
        self.queue.finish()

    def ms(self, ev):
        return (ev.profile.end - ev.profile.start) * 1e-6

    def output(self, i=0):
        out = np.empty(self.layer.out_shape, np.float32)
        cl.enqueue_copy(self.queue, out, self.sets[i % len(self.sets)][2])
        return out

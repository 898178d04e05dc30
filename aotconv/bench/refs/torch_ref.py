"""PyTorch as the reference: cuDNN on an NVIDIA GPU (FP32, TF32 off, cudnn.benchmark on), or
PyTorch's own CPU convolution; timed in this process on the same data as our kernels.

GPU times are CUDA events around each call (device time, one call per event pair, so the
launch gap is not counted but every kernel cuDNN runs is); CPU times are perf_counter around
each call. `TorchConv` is a subject of aotconv.protocol: it is verified and timed (warm-up,
median of repeats, rotating over `copies` sets of tensors) exactly as our kernels are.
`Precision` runs a whole model end to end in the precision of one of our builds (TF32
allowed, or half and channels_last) and restores the FP32 settings after it.

torch is imported only when called: it is optional, and loading it costs seconds.
"""
import time

import numpy as np


def torch():
    import torch as t                  # optional and slow to load: only when asked for
    return t


def available(device):
    """(True, description) or (False, why) for device "cuda" or "cpu"."""
    try:
        t = torch()
    except ImportError as e:
        return False, f"PyTorch is not installed ({e})"
    if device == "cuda":
        if not t.cuda.is_available():
            return False, "PyTorch sees no CUDA device"
        return True, (f"PyTorch {t.__version__}, cuDNN {t.backends.cudnn.version()}, "
                      f"{t.cuda.get_device_name(0)}")
    return True, f"PyTorch {t.__version__} CPU, {t.get_num_threads()} threads"


def configure(device):
    """FP32 for real: TF32 off for convolutions and matmuls; cuDNN picks its fastest algorithm
    for each shape (benchmark mode). Returns the settings as recorded in the JSON."""
    t = torch()
    t.backends.cudnn.benchmark = True
    t.backends.cudnn.allow_tf32 = False
    t.backends.cuda.matmul.allow_tf32 = False
    try:
        t.set_float32_matmul_precision("highest")
    except AttributeError:
        pass
    return {"cudnn.benchmark": True, "cudnn.allow_tf32": False, "cuda.matmul.allow_tf32": False,
            "threads": t.get_num_threads(), "device": device}


class Precision:
    """How PyTorch runs a model in the precision of one of our builds (`aotconv bench
    --precision`), as a PyTorch user would ask for it:

        fp32  the float32 model with TF32 off (configure's settings, unchanged);
        tf32  the float32 model with TF32 allowed in cuDNN's convolutions and in matmuls
              (cudnn.allow_tf32, cuda.matmul.allow_tf32), for as long as the `with` block
              lasts: the settings before it are restored after it;
        fp16  model.half() in the channels_last memory format, its input cast to half and
              channels_last on the device (a user's half model: cuDNN's and PyTorch's own half
              kernels, whatever they accumulate in).

    The flags are CUDA's: on a CPU, tf32 runs in FP32 and `settings` says so."""

    def __init__(self, name, device="cpu"):
        self.name, self.device = name, device
        self._saved = None

    def __enter__(self):
        if self.name == "tf32":
            t = torch()
            self._saved = (t.backends.cudnn.allow_tf32, t.backends.cuda.matmul.allow_tf32,
                           t.get_float32_matmul_precision())
            t.backends.cudnn.allow_tf32 = True
            t.backends.cuda.matmul.allow_tf32 = True
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            t = torch()
            cudnn, matmul, highest = self._saved
            t.backends.cudnn.allow_tf32 = cudnn
            t.backends.cuda.matmul.allow_tf32 = matmul
            t.set_float32_matmul_precision(highest)
            self._saved = None
        return False

    @property
    def half(self):
        return self.name == "fp16"

    def model(self, m):
        """The float32 model `m` as this precision runs it."""
        if self.half:
            return m.half().to(memory_format=torch().channels_last)
        return m

    def input(self, x):
        """A float32 input tensor on the device as the model of this precision takes it."""
        if self.half:
            x = x.half()
            return x.contiguous(memory_format=torch().channels_last) if x.dim() == 4 else x
        return x

    def settings(self):
        """What the JSON records of how PyTorch ran (the flags as they are now: inside the
        `with` block, the ones the model ran with)."""
        t = torch()
        s = {"precision": self.name, "dtype": "float16" if self.half else "float32",
             "memory_format": "channels_last" if self.half else "contiguous (NCHW)",
             "cudnn.allow_tf32": bool(t.backends.cudnn.allow_tf32),
             "cuda.matmul.allow_tf32": bool(t.backends.cuda.matmul.allow_tf32)}
        if self.name == "tf32" and self.device != "cuda":
            s["note"] = "the TF32 flags are CUDA's: PyTorch on a CPU computes in FP32"
        return s


def sync(device):
    if device == "cuda":
        torch().cuda.synchronize()


class Timer:
    """Times a zero-argument callable on `device`: returns one duration (ms) per call."""

    def __init__(self, device):
        self.device = device

    def __call__(self, fn):
        t = torch()
        if self.device == "cuda":
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


class TorchConv:
    """F.conv2d for one conv layer (groups, dilation, asymmetric pad, bias, act as ours), over
    `copies` sets of tensors: a measurement subject of aotconv.protocol."""

    def __init__(self, layer, x, w, b=None, device="cpu", copies=1):
        t = torch()
        self.t, self.layer, self.device = t, layer, device
        a = layer.attrs
        pt, pl, pb, pr = a["pad"]
        self.sym = (pt, pl) == (pb, pr)
        self.pad = (pl, pr, pt, pb)
        self.kw = dict(stride=tuple(a["stride"]), dilation=tuple(a["dilation"]),
                       groups=a["groups"], padding=(pt, pl) if self.sym else 0)
        dev = t.device(device)
        self.timer = Timer(device)
        self._out0 = None
        self.sets = []
        with t.no_grad():
            for _ in range(max(1, copies)):
                self.sets.append((t.from_numpy(np.ascontiguousarray(x, np.float32)).to(dev),
                                  t.from_numpy(np.ascontiguousarray(w, np.float32)).to(dev),
                                  None if b is None else
                                  t.from_numpy(np.ascontiguousarray(b, np.float32)).to(dev)))

    def __call__(self, i=0):
        F = self.t.nn.functional
        x, w, b = self.sets[i % len(self.sets)]
        with self.t.no_grad():
            if not self.sym:
                x = F.pad(x, self.pad)
            y = F.conv2d(x, w, b, **self.kw)
            y = apply_act(y, self.layer.attrs["act"], self.layer.attrs["alpha"])
        if i % len(self.sets) == 0:
            self._out0 = y
        return y

    # -- the protocol's subject: a call is a launch; its result is a new tensor, so there is
    # no output buffer to poison, and a timed call returns its time directly

    @property
    def copies(self):
        return len(self.sets)

    def poison(self):
        self._out0 = None

    def run(self, i):
        self(i)

    def timed(self, i):
        return self.timer(lambda: self(i))

    def finish(self):
        sync(self.device)

    def ms(self, handle):
        return handle

    def output(self):
        """Copy 0's output of the last call on it."""
        if self._out0 is None:
            self(0)
        return self._out0.float().cpu().numpy()


def apply_act(y, act, alpha):
    F = torch().nn.functional
    if act == "none":
        return y
    if act == "relu":
        return F.relu(y)
    if act == "leaky_relu":
        return F.leaky_relu(y, alpha)
    if act == "sigmoid":
        return torch().sigmoid(y)
    if act == "tanh":
        return torch().tanh(y)
    raise ValueError(f"unknown activation {act}")

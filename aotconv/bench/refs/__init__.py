"""The reference implementations `aotconv bench` times beside ours, in the same process:
torch_ref (PyTorch: cuDNN on an NVIDIA GPU, its own convolution on a CPU) and clblast
(CLBlast's convgemm through ctypes). Each is optional; each module's `available()` says
whether it is present here and, if not, why. Both are subjects of aotconv.protocol, verified
and timed by the same rules as our kernels, over the same number of buffer copies."""
from ... import protocol
from . import clblast, torch_ref
from ..report import log, rounded

NAMES = ("torch", "clblast")


class Refs:
    """The reference implementations present in this process, set up once."""

    def __init__(self, wanted, dev, quiet=False):
        self.dev, self.status, self.torch_device = dev, {}, None
        kind = dev.target.kind
        if "torch" in wanted:
            tdev = "cuda" if kind == "gpu" else "cpu"
            ok, note = torch_ref.available(tdev)
            if ok:
                settings = torch_ref.configure(tdev)
                self.torch_device = tdev
                self.status["torch"] = {"available": True, "note": note, "settings": settings}
            else:
                self.status["torch"] = {"available": False, "note": note}
        else:
            self.status["torch"] = {"available": False, "note": "not asked for (--refs)"}
        if "clblast" in wanted:
            ok, note = clblast.available()
            self.status["clblast"] = {"available": ok,
                                      "note": "Debian libclblast1, CLBlastSconvgemm via ctypes"
                                      if ok else note}
        else:
            self.status["clblast"] = {"available": False, "note": "not asked for (--refs)"}
        for k, v in self.status.items():
            if not v["available"]:
                log(f"aotconv bench: reference {k} skipped: {v['note']}", quiet)

    def label(self):
        if self.torch_device == "cuda":
            return "cuDNN"
        return "PyTorch CPU" if self.dev.target.kind == "cpu" else "PyTorch"

    def subject(self, name, layer, x, w, copies):
        """Reference `name` set up for `layer` on `copies` sets of (x, w); or a str saying why
        it cannot compute this layer."""
        if name == "torch":
            return torch_ref.TorchConv(layer, x, w, device=self.torch_device, copies=copies)
        why = clblast.unsupported(layer)
        if why:
            return f"unsupported: {why}"
        return clblast.ClblastConv(self.dev.ctx, self.dev.queue, layer, x, w, copies)

    def measure(self, name, layer, x, w, ref, copies, opts):
        """Reference `name` on `layer`: {verify, ms, times} by the protocol, or {note}."""
        subject = self.subject(name, layer, x, w, copies)
        if isinstance(subject, str):
            return {"note": subject}
        out = {"verify": protocol.verify(subject, ref)[0]}
        warmup, repeats = protocol.counts(protocol.estimate_ms(subject), opts)
        times = protocol.time_repeats(subject, warmup, repeats)
        out.update(ms=protocol.median(times), times=rounded(times))
        return out

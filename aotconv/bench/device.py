"""The OpenCL device `aotconv bench` measures on, and what its JSON says about the machine."""
import os
import platform

import numpy as np
import pyopencl

from .. import protocol
from ..context import BuildContext
from ..harness import context_for


class Device:
    """The OpenCL context and queue of the target, and what the JSON says about them."""

    def __init__(self, target):
        ctx = BuildContext.make(target, mode="tune").require_device()
        self.platform, self.device = ctx.found
        self.target = ctx.target
        self.ctx, self.queue, _ = context_for(target)
        d, p = self.device, self.platform
        self.info = {"device": d.name.strip(), "vendor": d.vendor.strip(),
                     "driver": d.driver_version.strip(), "platform": p.name.strip(),
                     "platform_version": p.version.strip(),
                     "global_mem_gb": round(d.global_mem_size / 2 ** 30, 1)}

    def copies(self, footprint):
        """How many buffer sets to rotate over for data of `footprint` bytes (the protocol's
        rule for this device's last-level cache and memory)."""
        return protocol.copies(footprint, self.target.cache_bytes, self.device.global_mem_size)


def environment(dev):
    """The machine and software a run was measured on (the JSON's `environment`)."""
    env = dict(dev.info)
    env.update(python=platform.python_version(), host=platform.node(), numpy=np.__version__,
               machine=platform.machine(), cpus=os.cpu_count(),
               loadavg_at_start=[round(x, 2) for x in os.getloadavg()],
               omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
               pyopencl=pyopencl.VERSION_TEXT)
    return env


def target_dict(t):
    """A target profile as the JSON (and the report's derived figures) read it."""
    return {"name": t.name, "kind": t.kind, "peak_gflops": t.peak_gflops,
            "peak_gbps": t.peak_gbps, "summary": t.summary(), "cache_bytes": t.cache_bytes}

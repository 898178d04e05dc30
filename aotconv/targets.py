"""Target profiles: how to recognise a device, its limits (for pruning) and peaks (for rooflines).

Figures for fury-x, r9-nano, gtx1080, titan-x, mali-t628 and adreno-530 come from the published
autotuning papers that measured them and the vendors' data sheets; h100 is the H100 SXM (132 SMs
x 128 lanes x 2 x 1.98 GHz FP32, HBM3 ~3.35 TB/s); pocl-cpu is PoCL on a 2-core AVX-512 machine
(2 cores x 16 lanes x 2 FMA x 2 x ~2.5 GHz, conservative).

Memory (`max_alloc_bytes`: the largest buffer, CL_DEVICE_MAX_MEM_ALLOC_SIZE; `global_mem_bytes`:
all buffers together, CL_DEVICE_GLOBAL_MEM_SIZE capped by the address width): h100 and pocl-cpu
as their OpenCL drivers report them (NVIDIA's on the project's H100 80GB: 79.2 GiB and exactly
a quarter of it; PoCL on a 2-core machine: 4.19 GiB and 2 GiB). For the other devices the
board's memory and, for the
largest buffer, a quarter of it: the least an OpenCL 1.2 device may report
(max(global / 4, 128 MiB)), so a build for an absent device never plans a buffer its driver
could refuse. With the device present its own figures replace these (`with_limits`).

The launch gap (`launch_gap_us`: what one more dependent kernel costs a run beyond its own
time, which choices that change the number of launches count, aotconv.launch_cost) is measured
by tools/launch_gap.py with profiling off: 3.4 us on the H100 with NVIDIA's OpenCL (driver
580), 2.6 us for PoCL on the 2-core machine. The other profiles have none measured.
"""
from dataclasses import dataclass, replace
import re

from .errors import AotconvError


@dataclass(frozen=True)
class Target:
    name: str
    vendor: str                 # regex on the OpenCL platform vendor / device vendor
    device: str                 # regex on the OpenCL device name
    kind: str                   # "gpu" or "cpu"
    max_wg_size: int            # work-items per work-group
    local_mem_bytes: int        # per work-group
    compute_units: int
    simd_width: int             # warp / wavefront / vector lanes
    registers_per_cu: int = 0   # 32-bit registers per compute unit, 0 when unknown
    max_regs_per_thread: int = 255
    min_wg_per_cu: int = 1      # minimum occupancy the hardware constraints ask for
    peak_gflops: float = 0.0    # FP32
    peak_gbps: float = 0.0
    description: str = ""
    # added for the tuner (all optional; 0 / () means "unknown: no constraint")
    max_wg_dims: tuple = ()     # work-items per work-group along each dimension
    local_mem_per_cu: int = 0   # local memory shared by the work-groups of one CU (occupancy)
    cache_bytes: int = 0        # last-level cache timing must defeat by rotating inputs
    max_alloc_bytes: int = 0    # the largest single buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE)
    global_mem_bytes: int = 0   # all buffers together (global memory, within the address width)
    compute_capability: tuple = ()   # NVIDIA (major, minor): the tensor cores it has
    precision: str = "fp32"     # what a build may compute in (aotconv.precision; context sets it)
    launch_gap_us: float = 0.0  # between two dependent kernels of one queue beyond their own
                                # time (tools/launch_gap.py, profiling off); 0: not measured
                                # (aotconv.launch_cost.DEFAULT_GAP_US)

    def summary(self):
        mem = (f", buffers up to {self.max_alloc_bytes / 2**30:.1f} of "
               f"{self.global_mem_bytes / 2**30:.1f} GiB" if self.global_mem_bytes else "")
        return (f"{self.name}: {self.description} ({self.compute_units} CUs, "
                f"{self.peak_gflops:.0f} GFLOP/s, {self.peak_gbps:.0f} GB/s{mem})")


TARGETS = {t.name: t for t in [
    Target("h100", "NVIDIA", r"H100", "gpu", 1024, 48 * 1024, 132, 32, 65536, 255, 2,
           66900.0, 3350.0, "NVIDIA H100 SXM, NVIDIA OpenCL",
           max_wg_dims=(1024, 1024, 64), local_mem_per_cu=228 * 1024, cache_bytes=50 << 20,
           max_alloc_bytes=21254373376, global_mem_bytes=85017493504,
           compute_capability=(9, 0), launch_gap_us=3.4),
    Target("pocl-cpu", r"pocl|Portable Computing Language", r".*", "cpu", 4096, 2 * 1024 * 1024,
           2, 16, 0, 255, 1, 320.0, 20.0, "PoCL pthread CPU device",
           max_wg_dims=(4096, 4096, 4096), cache_bytes=32 << 20,
           max_alloc_bytes=2 << 30, global_mem_bytes=4500126720, launch_gap_us=2.6),
    Target("fury-x", r"Advanced Micro Devices|AMD", r"Fiji|Fury", "gpu", 256, 64 * 1024, 64, 64,
           65536, 255, 2, 8602.0, 512.0, "AMD Radeon R9 Fury X (Fiji)",
           max_wg_dims=(256, 256, 256), local_mem_per_cu=64 * 1024, cache_bytes=2 << 20,
           max_alloc_bytes=1 << 30, global_mem_bytes=4 << 30),
    Target("r9-nano", r"Advanced Micro Devices|AMD", r"Fiji|Nano", "gpu", 256, 64 * 1024, 64, 64,
           65536, 255, 2, 8192.0, 512.0, "AMD Radeon R9 Nano (Fiji)",
           max_wg_dims=(256, 256, 256), local_mem_per_cu=64 * 1024, cache_bytes=2 << 20,
           max_alloc_bytes=1 << 30, global_mem_bytes=4 << 30),
    Target("gtx1080", "NVIDIA", r"GTX 1080", "gpu", 1024, 48 * 1024, 20, 32, 65536, 255, 2,
           8873.0, 320.0, "NVIDIA GeForce GTX 1080 (Pascal)",
           max_wg_dims=(1024, 1024, 64), local_mem_per_cu=96 * 1024, cache_bytes=2 << 20,
           max_alloc_bytes=2 << 30, global_mem_bytes=8 << 30),
    Target("titan-x", "NVIDIA", r"TITAN X", "gpu", 1024, 48 * 1024, 24, 32, 65536, 255, 2,
           6605.0, 336.0, "NVIDIA GeForce GTX TITAN X (Maxwell)",
           max_wg_dims=(1024, 1024, 64), local_mem_per_cu=96 * 1024, cache_bytes=3 << 20,
           max_alloc_bytes=3 << 30, global_mem_bytes=12 << 30),
    Target("mali-t628", r"ARM", r"Mali-T628", "gpu", 256, 32 * 1024, 4, 4, 0, 64, 1,
           34.0, 14.9, "ARM Mali-T628 MP6 (Odroid-XU3)",
           max_wg_dims=(256, 256, 256), cache_bytes=256 << 10,
           max_alloc_bytes=512 << 20, global_mem_bytes=2 << 30),
    Target("adreno-530", r"QUALCOMM", r"Adreno.*530", "gpu", 1024, 32 * 1024, 4, 64, 0, 64, 1,
           407.0, 29.9, "Qualcomm Adreno 530 (Snapdragon 820)",
           max_wg_dims=(1024, 1024, 1024), cache_bytes=1 << 20,
           max_alloc_bytes=768 << 20, global_mem_bytes=3 << 30),
]}


def get_target(name):
    if name == "auto":
        return detect()
    try:
        return TARGETS[name]
    except KeyError:
        raise AotconvError(f"unknown target '{name}'; choose one of: auto, "
                           + ", ".join(sorted(TARGETS))) from None


def _devices():
    import pyopencl as cl
    try:
        plats = cl.get_platforms()
    except cl.Error:
        return []
    out = []
    for p in plats:
        try:
            for d in p.get_devices():
                out.append((p, d))
        except cl.Error:
            pass
    return out


def matches(target, platform, device):
    vend = f"{platform.vendor} {platform.name} {device.vendor}"
    return bool(re.search(target.vendor, vend, re.I) and re.search(target.device, device.name, re.I))


def find_device(target):
    """The OpenCL (platform, device) that `target` describes, or None when absent."""
    for p, d in _devices():
        if matches(target, p, d):
            return p, d
    return None


def detect():
    """The profile of the device present: a known profile if one matches, else one read off it."""
    devs = _devices()
    if not devs:
        raise AotconvError("no OpenCL device found: install an OpenCL driver (for the CPU: "
                           "apt-get install pocl-opencl-icd) or name a --target to build for")
    # prefer GPUs, then the first device
    import pyopencl as cl
    devs.sort(key=lambda pd: 0 if pd[1].type & cl.device_type.GPU else 1)
    p, d = devs[0]
    for t in TARGETS.values():
        if matches(t, p, d):
            return t
    return from_device(p, d)


def from_device(platform, device):
    import pyopencl as cl
    is_gpu = bool(device.type & cl.device_type.GPU)
    name = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")[:40]
    return Target(name, re.escape(platform.vendor), re.escape(device.name), "gpu" if is_gpu else "cpu",
                  device.max_work_group_size, device.local_mem_size, device.max_compute_units,
                  32 if is_gpu else 8, description=f"{device.name} (read off the device)",
                  max_wg_dims=tuple(device.max_work_item_sizes),
                  cache_bytes=int(device.global_mem_cache_size), **memory_of(device))


def memory_of(device):
    """{max_alloc_bytes, global_mem_bytes} as the live device reports them: the global memory
    is capped by what its address width reaches (a 32-bit device addresses 4 GiB)."""
    bits = int(device.address_bits)
    return {"max_alloc_bytes": int(device.max_mem_alloc_size),
            "global_mem_bytes": min(int(device.global_mem_size), 1 << bits if bits else 1 << 64)}


def with_limits(target, device):
    """The profile with the limits the live device reports where they are tighter; its memory
    figures are the device's own (the profile's are what a build without it assumes)."""
    dims = tuple(device.max_work_item_sizes)
    if target.max_wg_dims:
        dims = tuple(min(a, b) for a, b in zip(target.max_wg_dims, dims))
    return replace(target, max_wg_size=min(target.max_wg_size, device.max_work_group_size),
                   local_mem_bytes=min(target.local_mem_bytes, device.local_mem_size),
                   max_wg_dims=dims,
                   cache_bytes=target.cache_bytes or int(device.global_mem_cache_size),
                   **memory_of(device))


def device_identity(platform, device):
    """What tuning records are keyed by: results measured on one driver are not another's."""
    return {"vendor": device.vendor.strip(), "name": device.name.strip(),
            "driver": f"{platform.version.strip()} / {device.driver_version.strip()}"}

"""What NVIDIA's OpenCL accepts as a program binary, and what each costs at create() time.

    CUDA_CACHE_DISABLE=1 python tools/probe_nv_binary.py build/vgg16 [--arch sm_90]

For an emitted library's kernels (kernels/*.cl, joined into one program as create() joins them):
build from source; fetch CL_PROGRAM_BINARIES (PTX on NVIDIA) and
build from that; assemble the PTX with ptxas into a cubin and offer that as the binary. Each is
timed in a fresh context (create + build), with NVIDIA's compute cache disabled by the caller
(CUDA_CACHE_DISABLE=1) so that every build is cold. Prints one line per path and whether a
kernel of the program could be created from it.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_build(cl, dev, make, BUILD_OPTIONS=()):
    ctx = cl.Context([dev])
    t0 = time.perf_counter()
    try:
        prg = make(ctx).build(options=BUILD_OPTIONS)
        names = prg.get_info(cl.program_info.KERNEL_NAMES).split(";")
        cl.Kernel(prg, names[0])
        ok = f"ok, {len(names)} kernels"
    except Exception as e:  # the driver's answer is the finding
        prg, ok = None, f"rejected: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return (time.perf_counter() - t0) * 1e3, ok, prg


def main(argv=None):
    import pyopencl as cl
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", help="an emitted library's directory")
    ap.add_argument("--arch", default=None, help="ptxas -arch (default: from the device)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aotconv.binaries import join_sections, joined_source
    from aotconv.harness import BUILD_OPTIONS
    files = sorted(Path(a.build, "kernels").glob("*.cl"))
    sources = [f.read_text() for f in files]
    src = joined_source(sources, join_sections(sources, [f.stem for f in files]))
    devs = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    plat, dev = next(((p, d) for p, d in devs if "NVIDIA" in p.vendor.upper()), devs[0])
    nvidia = "NVIDIA" in plat.vendor.upper()
    arch = a.arch
    if arch is None and nvidia:
        cc = (dev.get_info(0x4000), dev.get_info(0x4001))   # CL_DEVICE_COMPUTE_CAPABILITY_*_NV
        arch = f"sm_{cc[0]}{cc[1]}"
    print(f"device {dev.name}, driver {dev.driver_version}, arch {arch}, "
          f"{len(src)} bytes of source")
    ms, ok, prg = timed_build(cl, dev, lambda c: cl.Program(c, src), BUILD_OPTIONS)
    print(f"source:  {ms:9.1f} ms  {ok}")
    ptx = prg.get_info(cl.program_info.BINARIES)[0] if prg is not None else None
    if ptx is not None:
        ms, ok, _ = timed_build(cl, dev, lambda c: cl.Program(c, [dev], [ptx]), BUILD_OPTIONS)
        print(f"binary:  {ms:9.1f} ms  {ok} ({len(ptx)} bytes)")
    ptxas = shutil.which("ptxas")
    if not nvidia or ptxas is None or ptx is None:
        print("cubin:   no ptxas on PATH")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        p, c = Path(tmp) / "p.ptx", Path(tmp) / "p.cubin"
        p.write_bytes(ptx.rstrip(b"\0"))
        t0 = time.perf_counter()
        r = subprocess.run([ptxas, f"-arch={arch}", str(p), "-o", str(c)],
                           capture_output=True, text=True)
        print(f"ptxas:   {(time.perf_counter() - t0) * 1e3:9.1f} ms  rc {r.returncode} "
              f"{r.stderr.strip()[:200]}")
        if r.returncode == 0:
            cubin = c.read_bytes()
            ms, ok, _ = timed_build(cl, dev, lambda ctx: cl.Program(ctx, [dev], [cubin]), BUILD_OPTIONS)
            print(f"cubin:   {ms:9.1f} ms  {ok} ({len(cubin)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hopper's sm_90a instructions (wgmma) from NVIDIA's OpenCL: OpenCL C in, sm_90a PTX out.

NVIDIA's OpenCL compiles a program for the device's plain architecture (sm_90 on an H100), and
ptxas rejects the warpgroup instructions there: wgmma is sm_90a code. The driver, though, takes
PTX as a program binary and assembles it itself, and PTX that says `.target sm_90a` builds and
runs on an H100 (driver 580.159.04: conv_wgmma_f16_nhwc's tuning and libraries, results/h100/
fp16-e2e.md). So:

- A kernel writes each sm_90a instruction of its inline asm behind the marker MARK, a PTX
  comment: the compiler substitutes the asm operands (registers) into the comment as into any
  asm text, and the plain-architecture build accepts it as a comment.
- Its source tests NEEDS: built without it (from source, by a driver or a path that did not
  come through here) the kernel stops at an #error instead of running with its multiplies
  commented out.
- program() builds such a source with NEEDS defined, takes the PTX (CL_PROGRAM_BINARIES on
  NVIDIA), uncomments the marked lines, retargets `.target sm_90` to `sm_90a` (and `.version`
  to at least 8.0, wgmma's first), and builds that PTX as the program's binary: the program a
  caller gets, whose binary is the rewritten PTX (what the emitted library embeds).

A source without NEEDS, or a device that is not NVIDIA's (PoCL runs the portable bodies of the
same kernels), builds as it always did.
"""
import re

MARK = "//@sm_90a "
NEEDS = "AOTCONV_SM90A"
OPTION = "-D" + NEEDS

_TARGET = re.compile(r"^(\s*\.target\s+)sm_90(?![0-9a-z])", re.M)
_VERSION = re.compile(r"^(\s*\.version\s+)(\d+)\.(\d+)", re.M)


def needs_rewrite(source):
    """True when `source` holds sm_90a instructions behind MARK (it tests NEEDS)."""
    return NEEDS in source


def is_nvidia(device):
    """An OpenCL device of NVIDIA's driver (whose CL_PROGRAM_BINARIES is PTX)."""
    return "NVIDIA" in (device.vendor or "").upper()


def rewrite(ptx):
    """The PTX with its marked lines uncommented, retargeted to sm_90a. Raises ValueError where
    it holds no marked line (the source's sm_90a instructions did not reach the PTX) or its
    target is not sm_90 (sm_90a code runs on compute capability 9.0 alone)."""
    # the driver's binary ends in the NUL of a C string: left in, it would end the text that
    # ptxas reads before its last line (the driver's own build stops at it unharmed)
    ptx = ptx.replace("\0", "")
    if MARK not in ptx:
        raise ValueError("the PTX holds no marked sm_90a instruction")
    if not _TARGET.search(ptx):
        raise ValueError("the PTX does not target sm_90: its sm_90a instructions need a "
                         "device of compute capability 9.0")
    out = "\n".join(line.replace(MARK, "", 1) if line.lstrip().startswith(MARK) else line
                    for line in ptx.splitlines()) + "\n"
    out = _TARGET.sub(r"\1sm_90a", out, count=1)

    def version(m):
        major, minor = int(m.group(2)), int(m.group(3))
        return m.group(0) if (major, minor) >= (8, 0) else m.group(1) + "8.0"
    return _VERSION.sub(version, out, count=1)


def program(cl, ctx, source, options):
    """A built cl.Program of `source` on `ctx`: through the sm_90a rewrite where the source
    needs it and the device is NVIDIA's, else built from source. A failed build raises
    cl.Error as a plain build does (the rewritten PTX's log where that one failed)."""
    device = ctx.devices[0]
    if not (needs_rewrite(source) and is_nvidia(device)):
        return cl.Program(ctx, source).build(options=list(options))
    options = list(options) + [OPTION]
    first = cl.Program(ctx, source).build(options=options)
    ptx = bytes(first.binaries[0]).decode("utf-8", "replace")
    if MARK not in ptx:
        # the portable bodies (AOTCONV_MMA_EMULATE): nothing to rewrite
        return first
    return cl.Program(ctx, [device], [rewrite(ptx).encode()]).build(options=options)

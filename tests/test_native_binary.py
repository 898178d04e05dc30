"""The NVIDIA machine-code path of the embedded binaries (aotconv/binaries.py): ptxas is found,
run and checked; every failure falls back to the driver's own binary with its reason."""
import os
import stat

import pytest

from aotconv import binaries

pytestmark = pytest.mark.unit


def _tool(tmp_path, body, name="ptxas"):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_ptxas_is_found_on_path_then_under_cuda_home(tmp_path):
    tool = _tool(tmp_path, "exit 0\n")
    assert binaries.find_ptxas({"PATH": str(tool.parent)}) == str(tool)
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    other = _tool(home, "exit 0\n")
    assert binaries.find_ptxas({"PATH": str(tmp_path / "nothing"), "CUDA_HOME": str(home)}) \
        == str(other)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert binaries.find_ptxas({"PATH": str(tmp_path / "nothing"), "CUDA_HOME": str(empty)}) \
        in (None, "/usr/local/cuda/bin/ptxas")


def test_assemble_passes_the_arch_and_returns_what_ptxas_wrote(tmp_path):
    # the fake ptxas writes its arguments as the "cubin": -arch=... <ptx> -o <out>
    tool = _tool(tmp_path, 'echo "$@" > "$4"\n')
    cubin, why = binaries.assemble(b".version 8.0\n\0", "sm_90", str(tool))
    assert why is None
    args = cubin.decode().split()
    assert args[0] == "-arch=sm_90" and args[1].endswith(".ptx") and args[2] == "-o"


def test_a_failing_ptxas_gives_its_last_line_and_no_cubin(tmp_path):
    tool = _tool(tmp_path, 'echo "ptxas fatal : Unresolved extern function" >&2; exit 255\n')
    cubin, why = binaries.assemble(b"ptx", "sm_90", str(tool))
    assert cubin is None and "Unresolved extern function" in why


def test_an_arch_that_is_not_a_compute_capability_never_reaches_the_shell(tmp_path):
    marker = tmp_path / "ran"
    tool = _tool(tmp_path, f'touch "{marker}"\n')
    cubin, why = binaries.assemble(b"ptx", "sm_90; rm -rf /", str(tool))
    assert cubin is None and "compute capability" in why and not marker.exists()


def test_a_missing_ptxas_binary_is_a_reason_not_a_crash(tmp_path):
    cubin, why = binaries.assemble(b"ptx", "sm_90", str(tmp_path / "no-such-ptxas"))
    assert cubin is None and "did not run" in why


class _Dev:
    def __init__(self, vendor, cc=(9, 0)):
        self.vendor, self.cc = vendor, cc

    def get_info(self, what):
        if self.cc is None:
            raise RuntimeError("INVALID_VALUE")
        return {binaries.CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV: self.cc[0],
                binaries.CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV: self.cc[1]}[what]


def test_other_vendors_keep_the_drivers_binary(monkeypatch):
    monkeypatch.setattr(binaries, "_binary", lambda prog: b"native")
    n = binaries.Native(_Dev("Portable Computing Language"), None)
    assert n.arch is None and n.binary(object()) == b"native"
    assert n.counts == {"cubin": 0, "driver": 1} and n.what() == "the driver's binary"


def test_nvidia_without_ptxas_embeds_ptx_and_says_why(monkeypatch):
    monkeypatch.setattr(binaries, "_binary", lambda prog: b"// PTX")
    monkeypatch.setattr(binaries, "find_ptxas", lambda env=None: None)
    n = binaries.Native(_Dev("NVIDIA Corporation", (9, 0)), None)
    assert n.arch == "sm_90" and n.binary(object()) == b"// PTX"
    assert "PTX" in n.what() and "no ptxas" in n.what()


def test_nvidia_with_ptxas_embeds_the_checked_cubin(monkeypatch):
    monkeypatch.setattr(binaries, "_binary", lambda prog: b"// PTX")
    monkeypatch.setattr(binaries, "find_ptxas", lambda env=None: "/opt/ptxas")
    monkeypatch.setattr(binaries, "assemble", lambda ptx, arch, tool: (b"CUBIN:" + arch.encode(), None))
    monkeypatch.setattr(binaries.Native, "_verify", lambda self, cubin, prog, names=None: None)
    n = binaries.Native(_Dev("NVIDIA Corporation", (9, 0)), None)
    assert n.binary(object()) == b"CUBIN:sm_90"
    assert n.what() == "sm_90 machine code from ptxas"


def test_a_rejected_cubin_falls_back_to_ptx_for_this_and_later_programs(monkeypatch):
    calls = []
    monkeypatch.setattr(binaries, "_binary", lambda prog: b"// PTX")
    monkeypatch.setattr(binaries, "find_ptxas", lambda env=None: "/opt/ptxas")
    monkeypatch.setattr(binaries, "assemble",
                        lambda ptx, arch, tool: calls.append(arch) or (b"CUBIN", None))
    monkeypatch.setattr(binaries.Native, "_verify",
                        lambda self, cubin, prog, names=None: "the driver rejected the cubin: INVALID_BINARY")
    n = binaries.Native(_Dev("NVIDIA Corporation", (8, 6)), None)
    assert n.binary(object()) == b"// PTX" and n.binary(object()) == b"// PTX"
    assert calls == ["sm_86"]          # not tried again after the first rejection
    assert "INVALID_BINARY" in n.what() and "PTX" in n.what()


def test_an_nvidia_driver_without_the_capability_query_embeds_ptx(monkeypatch):
    monkeypatch.setattr(binaries, "_binary", lambda prog: b"// PTX")
    n = binaries.Native(_Dev("NVIDIA Corporation", None), None)
    assert n.arch is None and n.binary(object()) == b"// PTX"


def test_an_embedded_binary_compiles_to_its_exact_bytes(tmp_path):
    """emit.binary_array: every byte value, quotes, backslashes, '?' runs (trigraphs in C11)
    and a length that is not a whole line come back out of the compiled array unchanged."""
    import shutil
    import subprocess
    from aotconv.emit import binary_array
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    blob = bytes(range(256)) * 3 + b'??=??/"\\\0' + bytes(range(255, -1, -7))
    src = tmp_path / "blob.c"
    src.write_text(
        "#include <stdio.h>\n"
        f"static const unsigned char blob[{len(blob)}] =\n{binary_array(blob)};\n"
        "int main(void) { fwrite(blob, 1, sizeof blob, stdout); return 0; }\n")
    exe = tmp_path / "blob"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", str(src), "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], capture_output=True, check=True).stdout == blob

#!/usr/bin/env bash
# Prepare, on the development machine, what tools/gpu_bench.sh needs carried to the GPU machine
# (which has python3 3.12 with torch and numpy, and reaches no registry):
#   .whl/  wheels for CPython 3.12 manylinux x86_64 of what aotconv needs beyond the image
#          (and pytest, for the tests marked gpu)
#   .deb/  Debian's libclblast1, its ICD loader, libOpenCL.so and the CL headers
# Both are ignored by git (.gitignore). Idempotent; keeps one version of each package and
# leaves other files in .whl/ and .deb/ alone.
set -eu
cd "$(dirname "$0")/.."
WHEELS="pyopencl pytools siphash24 platformdirs mako markupsafe cffi pycparser ninja pytest pluggy iniconfig packaging pygments"
DEBS="libclblast1 ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers"
mkdir -p .whl .deb
# drop older copies of these packages only: others' wheels in .whl/ stay
for n in $WHEELS; do rm -f .whl/"$n"-*.whl .whl/"$(echo "$n" | tr - _)"-*.whl; done
for n in $DEBS; do rm -f .deb/"$n"_*.deb; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS
# every Requires-Dist of the wheels must be here or on the GPU image (numpy, typing_extensions)
for w in .whl/*.whl; do
    unzip -p "$w" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | grep -v 'python_version < "3.9"' \
        | sed 's/Requires-Dist: *//; s/[ ;<>=!~(\[].*//' ; done | sort -u | while read -r dep; do
    n=$(echo "$dep" | tr 'A-Z_' 'a-z-')
    case $n in numpy|typing-extensions) continue ;; esac
    ls .whl | tr 'A-Z_' 'a-z-' | grep -q "^$n-" || echo "warning: $dep (needed by a wheel) is not in .whl/"
done
(cd .deb && apt-get download $DEBS 2>/dev/null)
ls -la .whl .deb
du -sh .whl .deb

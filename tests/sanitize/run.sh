#!/usr/bin/env bash
# `make test-sanitize`: an emitted library and runtime_c compiled with ASan and UBSan, driven
# through every C API call and error path on PoCL by tests/sanitize/driver.c.
#
# The library's sources are compiled here from its build directory (not through its
# build.ninja) so the sanitizer flags reach every file: <net>.c, runtime/*.c and the driver
# form one executable; that is done for tests/sanitize/net.yaml (one input) and inputs.yaml
# (several). Fails on any failed check and on any sanitizer report, leaks included,
# except leaks allocated inside PoCL or its LLVM (lsan.supp: they compile kernels on PoCL's
# worker threads and keep what they allocate there).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
OUT="${OUT:-$ROOT/build/sanitize}"
CC="${CC:-gcc}"
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
status=0
# each network in its own folder: the flow of one input (net.yaml), then that of several
for net in net inputs; do
    t0=$(date +%s)
    out="$OUT/$net"
    mkdir -p "$out"
    name="$(cd "$ROOT" && "$PY" "$HERE/prepare.py" "$HERE/$net.yaml" "$out/lib")"
    upper="$(echo "$name" | tr '[:lower:]' '[:upper:]')"
    cd "$out/lib"
    # shellcheck disable=SC2086
    "$CC" -std=c11 -g -O1 -Wall -Wno-unused-function $SAN -DAOTRT_NS="$name" -I. -Iruntime \
        -DNET="$name" -DNETU="$upper" -DNET_HEADER="\"$name.h\"" -DNET_NAME="\"$name\"" \
        "$name.c" runtime/*.c "$HERE/driver.c" -o "$out/driver" -lOpenCL -lpthread -lm
    t1=$(date +%s)

    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=1:exitcode=23"
    export LSAN_OPTIONS="suppressions=$HERE/lsan.supp:print_suppressions=0:exitcode=23"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=24"
    set +e
    "$out/driver" "$out/lib" "$out/lib/input.bin" "$out/lib/expected.bin" >"$out/driver.log" 2>&1
    rc=$?
    set -e
    t2=$(date +%s)
    cat "$out/driver.log"
    reports=$(grep -cE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer)" "$out/driver.log" || true)
    echo "sanitize: $net.yaml built in $((t1 - t0)) s, ran in $((t2 - t1)) s; exit status $rc, sanitizer reports: $reports"
    if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
        echo "sanitize: $net.yaml FAILED (log: $out/driver.log)"
        status=1
    fi
    cd "$ROOT"
done
[ "$status" -eq 0 ] && echo "sanitize: ok"
exit "$status"

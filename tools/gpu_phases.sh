#!/usr/bin/env bash
# Run tools/gpu_bench.sh phases on the device machine with the records of .gpurec/ as the
# tuning cache, then pack everything the phases wrote into one file, $OUT/out.tgz (a remote
# runner may return only a few files).
#   bash tools/gpu_phases.sh PHASE...      (env: ALEX_BUDGET, VGG_BUDGET, BODA_BUDGET, ...)
set -u
REAL_OUT=${OUT:-build/gpu-out}
export OUT=/tmp/o
mkdir -p "$OUT" /tmp/aotconv-cache "$REAL_OUT"
if [ ! -s /tmp/aotconv-cache/records.jsonl ] && ls .gpurec/*.jsonl >/dev/null 2>&1; then
    cat .gpurec/*.jsonl > /tmp/aotconv-cache/records.jsonl
fi
bash "$(dirname "$0")/gpu_bench.sh" "$@"
cp /tmp/aotconv-cache/records.jsonl "$OUT/records-all.jsonl" 2>/dev/null
tar czf "$REAL_OUT/out.tgz" -C "$OUT" .
tail -n 40 "$OUT/gpu_bench.log"

#!/usr/bin/env bash
# aotconv on the GPU machine: set up NVIDIA OpenCL, the carried wheels and Debian packages,
# then run `aotconv bench --target h100` phases, writing JSON, markdown and logs under $OUT.
#
#   bash tools/gpu_bench.sh [PHASE...]        (default: check notune)
#
# Phases (each fits one 10-minute device command; TOTAL_LIMIT, 570 s, bounds one call of the
# script, so phases given together share it and the later ones are cut or skipped):
#   check        set-up and a report of what is there (OpenCL platforms, CLBlast, torch,
#                cc); about 1 minute with the first install
#   smoke        two layers and lenet5 end to end, no tuner: a one-minute first try
#   notune       all 61 layers of the three sets and the three networks end to end, no tuner
#                (best registered fallback per layer; networks with fallbacks): ~4 minutes
#   tune-layers  the three sets tuned, each set sharing a budget (ALEX_BUDGET, VGG_BUDGET,
#                BODA_BUDGET): ~9 minutes
#   tune-vgg16   VGG-16 batch 1 tuned and built end to end (VGG16_E2E_BUDGET, default 7m):
#                the "tune the whole of VGG-16 within 10 minutes" figure
#   tune-e2e     VGG-16 batch 16 and AlexNet batch 128 tuned end to end (E2E_BUDGET each)
#   tune-vgg16b16, tune-alexnet-e2e, tune-boda   one network or set of the phases above
#   nowinograd   AlexNet's set and VGG-16 conv2-4 at batch 16 without conv_winograd (the
#                "non-Winograd convolution at 60% of peak" figures)
#   e2e          end to end only: the networks of E2E_NETS (default vgg16:1,vgg16:16,
#                alexnet:128), each with E2E_BUDGET (default 20s) of tuning on top of the records
#   retune-direct  the layers the direct variants serve (pooling, LRN, softmax) of the shipped
#                records' networks (vgg16 b1 and b16, alexnet b128) tuned over their whole spaces,
#                then each network built (its conv+pool fusions measured): fresh records after
#                a change to those variants' classes
#   tune-resnet50  ResNet-50 batch 1 tuned and built from nothing (AOTCONV_SHIPPED_RECORDS=0;
#                RESNET_BUDGET, default 4m), against PyTorch eager, CUDA graph and torch.compile
#   tune-resnet50b32, tune-mobilenet   ResNet-50 batch 32 and MobileNetV2 batch 1 end to end
#                (RESNET_BUDGET, MOBILENET_BUDGET), on top of the records of the calls before
#   launch-gap   tools/launch_gap.py: the time between dependent kernels, profiling off and on
#   fp16-tc      the fp16 tensor-core kernel (conv_mma_f16): its `gpu` tests (the PTX against
#                the reference and the emulation), then FP16_NETS (default resnet50:1,
#                resnet50:32,vgg16:16) end to end in fp16 with FP16_BUDGET (default 60s) each,
#                against PyTorch FP16
#   all          every phase above in turn (with TOTAL_LIMIT=100000, where no 10-minute
#                limit applies)
#
# Needs, carried into the repository copy: .whl/ (pyopencl, mako, cffi, pycparser,
# platformdirs, pytools, siphash24, markupsafe, ninja for cp312 manylinux) and .deb/
# (libclblast1, ocl-icd-libopencl1, ocl-icd-opencl-dev, opencl-c-headers). A step that fails
# is logged and the rest go on; the bench writes its JSON after every layer, so a phase cut
# short still leaves what it measured. Tuning records go to $OUT/records-<phase>.jsonl.
# Afterwards, on the development machine:
#   aotconv bench --from-json OUT/bench-h100-*.json --out results/h100/sets.json
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/build/gpu-out}
mkdir -p "$OUT"
LOG=$OUT/gpu_bench.log
TARGET=${TARGET:-h100}                   # another target only to try this script elsewhere
PHASE_LIMIT=${PHASE_LIMIT:-560}          # seconds one phase may take
TOTAL_LIMIT=${TOTAL_LIMIT:-570}          # seconds this whole call may take (a device command: 600)
SITE=/tmp/aotconv-site
DEBROOT=/tmp/aotconv-deb
export PYTHONUNBUFFERED=1
export AOTCONV_CACHE_DIR=${AOTCONV_CACHE_DIR:-/tmp/aotconv-cache}
FAILED=()

say() { echo "[gpu_bench $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
step() {   # step NAME CMD...: run, log, remember failures, never stop the script
    local name=$1; shift
    say "== $name"
    if "$@" >>"$LOG" 2>&1; then say "   ok: $name"; else
        local rc=$?; say "   FAILED ($rc): $name (see $LOG)"; FAILED+=("$name"); return $rc; fi
}

# -- set-up (idempotent: a warm machine keeps /tmp between commands) --------------------------
register_icd() {
    local lib=libnvidia-opencl.so.1 f
    if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-opencl.so.1'; then
        f=$(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/cuda* \
                 -name 'libnvidia-opencl.so.1' 2>/dev/null | head -n1)
        if [ -n "$f" ]; then   # its sibling libnvidia-* libraries must resolve as well
            lib=$f; export LD_LIBRARY_PATH=$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        fi
    fi
    echo "NVIDIA OpenCL ICD library: $lib"
    if mkdir -p /etc/OpenCL/vendors 2>/dev/null && echo "$lib" > /etc/OpenCL/vendors/nvidia.icd; then
        export OCL_ICD_VENDORS=/etc/OpenCL/vendors
    else                                  # a read-only /etc: point the loaders elsewhere
        mkdir -p /tmp/OpenCL/vendors && echo "$lib" > /tmp/OpenCL/vendors/nvidia.icd
        export OCL_ICD_VENDORS=/tmp/OpenCL/vendors
    fi
    cat "$OCL_ICD_VENDORS/nvidia.icd"
}

install_wheels() {
    ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/ here: carry it"; return 1; }
    if [ -f "$SITE/.ok" ] && cmp -s "$SITE/.ok" <(ls .whl); then echo "already installed"; return 0; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl && ls .whl > "$SITE/.ok"
}

unpack_debs() {
    ls .deb/*.deb >/dev/null 2>&1 || { echo "no .deb/ here: carry it"; return 1; }
    mkdir -p "$DEBROOT"
    for f in .deb/*.deb; do dpkg -x "$f" "$DEBROOT" || return 1; done
    ls "$DEBROOT/usr/lib/x86_64-linux-gnu" "$DEBROOT/usr/include/CL" | head -n 20
}

setup_env() {
    export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}
    local lib=$DEBROOT/usr/lib/x86_64-linux-gnu
    # CLBlast and the emitted libraries find libOpenCL.so.1 here at run time; cc finds the CL
    # headers and libOpenCL.so here when ninja builds a network
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
    export CPATH=$DEBROOT/usr/include${CPATH:+:$CPATH}
    [ -e "$lib/libclblast.so.1" ] && export AOTCONV_CLBLAST=$lib/libclblast.so.1
    export PATH=$SITE/bin:$PATH
    if [ -z "${CC:-}" ]; then
        for c in cc gcc clang; do command -v $c >/dev/null && { export CC=$c; break; }; done
    fi
}

report_env() {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || true
    python3 --version
    echo "CC=${CC:-none} ($(${CC:-false} --version 2>/dev/null | head -n1))"
    python3 - <<'EOF'
import numpy, sys
print("numpy", numpy.__version__)
try:
    import pyopencl as cl
    for p in cl.get_platforms():
        print("OpenCL platform:", p.name, "|", p.version, "|",
              [(d.name, d.driver_version) for d in p.get_devices()])
except Exception as e:
    print("pyopencl / OpenCL FAILED:", type(e).__name__, e)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
          "cudnn", torch.backends.cudnn.version())
except Exception as e:
    print("torch FAILED:", e)
from aotconv.bench.refs import clblast
print("CLBlast:", clblast.available())
EOF
    python3 -m aotconv.cli targets
}

farm_ray() {   # Ray from the carried build/ray/raysite.tar.xz (the GPU image has no Ray)
    python3 -c "import ray" 2>/dev/null && return 0
    [ -f build/ray/raysite.tar.xz ] || { say "no Ray: carry build/ray/raysite.tar.xz"; FAILED+=(ray); return 1; }
    mkdir -p /tmp/raysite && tar -xJf build/ray/raysite.tar.xz -C /tmp/raysite
    export PYTHONPATH=$PYTHONPATH:/tmp/raysite RAY_USAGE_STATS_ENABLED=0
    python3 -c "import ray; print('ray', ray.__version__)"
}

# -- phases ----------------------------------------------------------------------------------
T0=$(date +%s)
left() {   # seconds left: the phase's and the whole call's limits, whichever comes first
    local now; now=$(date +%s)
    local a=$(( PHASE_LIMIT - (now - PHASE_T0) )) b=$(( TOTAL_LIMIT - (now - T0) ))
    echo $(( a < b ? a : b ))
}

bench() {  # bench NAME ARGS...: one `aotconv bench` run with the phase's remaining time
    local name=$1; shift
    local budget_s; budget_s=$(left)
    if [ "$budget_s" -lt 30 ]; then say "skip $name: the phase is out of time"; return 1; fi
    say "== bench $name (deadline $((budget_s - 25)) s)"
    timeout -k 10 "$budget_s" \
        python3 -m aotconv.cli bench --target "$TARGET" --deadline $((budget_s - 25)) \
            --out "$OUT/bench-$TARGET-$name.json" --workdir /tmp/aotconv-bench "$@" \
            > >(tee "$OUT/bench-$name.txt") 2> >(tee -a "$LOG" >&2)
    local rc=$?
    cp "$AOTCONV_CACHE_DIR/records.jsonl" "$OUT/records-$name.jsonl" 2>/dev/null
    if [ $rc -ne 0 ]; then say "   bench $name exited $rc"; FAILED+=("bench $name"); fi
    return 0
}

run_phase() {
    PHASE_T0=$(date +%s)
    case $1 in
        check) report_env 2>&1 | tee -a "$LOG" ;;
        smoke)
            bench smoke --sets vgg16_n1,boda43_n5,e2e --layers 'vgg.conv5_1,boda.13*' \
                --e2e lenet5:8 --no-tune ;;
        notune)
            bench notune-layers --sets alexnet_n128,vgg16_n1,boda43_n5 --no-tune
            bench notune-e2e --sets e2e --no-tune ;;
        tune-layers)
            bench tune-alexnet --sets alexnet_n128 --set-budget "${ALEX_BUDGET:-90s}"
            bench tune-vgg16-layers --sets vgg16_n1 --set-budget "${VGG_BUDGET:-120s}"
            bench tune-boda --sets boda43_n5 --set-budget "${BODA_BUDGET:-150s}" ;;
        tune-vgg16)
            bench tune-vgg16-e2e --sets e2e --e2e vgg16:1 --e2e-budget "${VGG16_E2E_BUDGET:-7m}" ;;
        tune-e2e) run_phase tune-vgg16b16; run_phase tune-alexnet-e2e ;;
        tune-vgg16b16)
            bench tune-vgg16b16-e2e --sets e2e --e2e vgg16:16 --e2e-budget "${E2E_BUDGET:-200s}" ;;
        tune-alexnet-e2e)
            bench tune-alexnet-e2e --sets e2e --e2e alexnet:128 --e2e-budget "${E2E_BUDGET:-200s}" ;;
        tune-boda)
            bench tune-boda --sets boda43_n5 --set-budget "${BODA_BUDGET:-150s}" ;;
        nowinograd)   # the best non-Winograd convolution: AlexNet's set and VGG-16 conv2-4 at b16
            AOTCONV_EXCLUDE_VARIANTS=conv_winograd bench nowinograd-alexnet --sets alexnet_n128 \
                --set-budget "${ALEX_BUDGET:-100s}" --note "AOTCONV_EXCLUDE_VARIANTS=conv_winograd"
            AOTCONV_EXCLUDE_VARIANTS=conv_winograd timeout -k 10 $(( $(left) > 40 ? $(left) - 20 : 20 )) \
                python3 -m aotconv.cli tune vgg16 --batch 16 --target "$TARGET" \
                --budget "${VGG16B16_BUDGET:-150s}" --layer conv2_1 --layer conv2_2 --layer conv3_1 \
                --layer conv3_2 --layer conv4_1 --layer conv4_2 --quiet \
                > "$OUT/nowinograd-vgg16b16.txt" 2>>"$LOG" || say "   nowinograd vgg16 b16 failed"
            cp "$AOTCONV_CACHE_DIR/records.jsonl" "$OUT/records-nowinograd.jsonl" 2>/dev/null ;;
        e2e)
            bench e2e --sets e2e --e2e "${E2E_NETS:-vgg16:1,vgg16:16,alexnet:128}" \
                --e2e-budget "${E2E_BUDGET:-20s}" ;;
        tune-resnet50)   # ResNet-50 batch 1 tuned and built from nothing (no shipped records)
            AOTCONV_SHIPPED_RECORDS=0 bench tune-resnet50-e2e --sets e2e --e2e resnet50:1 \
                --e2e-budget "${RESNET_BUDGET:-4m}" --torch-compile "${TORCH_COMPILE:-reduce-overhead}" \
                --note "resnet50 b1 tuned from nothing: AOTCONV_SHIPPED_RECORDS=0, empty cache" ;;
        tune-resnet50b32)
            bench tune-resnet50b32-e2e --sets e2e --e2e resnet50:32 \
                --e2e-budget "${RESNET_BUDGET:-4m}" --torch-compile "${TORCH_COMPILE:-reduce-overhead}" ;;
        tune-mobilenet)
            bench tune-mobilenet-e2e --sets e2e --e2e mobilenet_v2:1 \
                --e2e-budget "${MOBILENET_BUDGET:-3m}" --torch-compile "${TORCH_COMPILE:-reduce-overhead}" ;;
        retune-direct)
            local spec net batch layers
            for spec in "vgg16 1 pool1,pool2,pool3,pool4,pool5,prob" \
                        "vgg16 16 pool1,pool2,pool3,pool4,pool5,prob" \
                        "alexnet 128 norm1,pool1,norm2,pool2,pool5,prob"; do
                read -r net batch layers <<< "$spec"
                step "tune $net b$batch: $layers" timeout -k 10 $(( $(left) > 40 ? $(left) - 20 : 20 )) \
                    python3 -m aotconv.cli tune "$net" --batch "$batch" --target "$TARGET" \
                    --budget 200 --quiet $(printf -- '--layer %s ' ${layers//,/ })
                step "build $net b$batch" timeout -k 10 $(( $(left) > 40 ? $(left) - 20 : 20 )) \
                    python3 -m aotconv.cli build "$net" --batch "$batch" --target "$TARGET" \
                    --budget "${RETUNE_BUILD_BUDGET:-30s}" --quiet -o "/tmp/aotconv-retune/$net-b$batch"
            done
            cp "$AOTCONV_CACHE_DIR/records.jsonl" "$OUT/records-retune-direct.jsonl" 2>/dev/null ;;
        farm)  # ResNet-50 b1 tuned from nothing with one trial budget: on one device (no Ray), then
               # on a local Ray farm of FARM_WORKERS devices; each built from its records and timed
            farm_ray || return
            local w trials=${FARM_TRIALS:-1500}
            for w in ${FARM_RUNS:-1 2}; do
                local cache=/tmp/aotconv-farm-$w lib=/tmp/aotconv-farm-lib-$w t0 t1 ray=()
                rm -rf "$cache" "$lib"; mkdir -p "$cache"
                [ "$w" -gt 1 ] && ray=(--ray local --ray-workers "$w")
                t0=$(date +%s.%N)
                AOTCONV_CACHE_DIR=$cache AOTCONV_SHIPPED_RECORDS=0 step "tune resnet50 b1, $w device(s)" \
                    timeout -k 10 $(( $(left) - 50 < ${FARM_TUNE_LIMIT:-240} ? $(left) - 50 : ${FARM_TUNE_LIMIT:-240} )) python3 -m aotconv.cli tune resnet50 \
                    --batch 1 --target "${FARM_TARGET:-auto}" --budget "$trials" --json "${ray[@]}" \
                    2> "$OUT/farm-tune-$w.jsonl"
                t1=$(date +%s.%N)
                echo "farm devices=$w trials=$trials tune_wall_s=$(python3 -c "print(round($t1-$t0,1))") records=$(wc -l < "$cache/records.jsonl")" | tee -a "$OUT/farm.txt"
                AOTCONV_CACHE_DIR=$cache AOTCONV_SHIPPED_RECORDS=0 step "build resnet50 b1 from the $w-device records" \
                    timeout -k 10 120 python3 -m aotconv.cli build resnet50 --batch 1 --target "${FARM_TARGET:-auto}" \
                    --records-only --quiet -o "$lib"
                python3 tools/time_library.py "$lib" --label "devices=$w" | tee -a "$OUT/farm.txt"
                cp "$cache/records.jsonl" "$OUT/records-farm-$w.jsonl"
            done ;;
        launch-gap)
            step "launch gap" timeout -k 10 60 python3 tools/launch_gap.py --target "$TARGET" \
                --json "$OUT/launch-gap.json" ;;
        fp16-tc)
            step "conv_mma_f16 on the tensor cores" timeout -k 10 240 \
                python3 -m pytest -q -m gpu tests/test_conv_mma_f16.py
            bench fp16-e2e --sets e2e --e2e "${FP16_NETS:-resnet50:1,resnet50:32,vgg16:16}" \
                --e2e-budget "${FP16_BUDGET:-60s}" --precision fp16 \
                --torch-compile "${TORCH_COMPILE:-reduce-overhead}" ;;
        cmd)   # GPU_CMD, a shell command, run with the environment set up above (e.g. a pytest file)
            step "GPU_CMD: ${GPU_CMD:-unset}" timeout -k 10 $(( $(left) > 20 ? $(left) - 10 : 10 )) \
                bash -c "${GPU_CMD:-false}"
            tail -n 60 "$LOG" ;;
        all) for p in check smoke notune tune-layers tune-vgg16 tune-e2e; do run_phase "$p"; done ;;
        *) say "unknown phase '$1' (check, smoke, notune, tune-layers, tune-vgg16, tune-e2e, all)";
           FAILED+=("phase $1") ;;
    esac
}

say "aotconv GPU bench in $REPO, output $OUT, phases: ${*:-check notune}"
if command -v nvidia-smi >/dev/null 2>&1; then step "register the NVIDIA OpenCL driver" register_icd; fi
step "install the carried wheels into $SITE" install_wheels
step "unpack the carried .deb packages into $DEBROOT" unpack_debs
setup_env
for phase in ${@:-check notune}; do run_phase "$phase"; done

# -- the short table ---------------------------------------------------------------------------
shopt -s nullglob
results=()
for f in "$OUT"/bench-"$TARGET"-*.json; do
    case $f in *-merged.json) ;; *) results+=("$f") ;; esac
done
if [ ${#results[@]} -gt 0 ]; then
    say "== summary of ${#results[@]} result file(s)"
    python3 -m aotconv.cli bench --from-json "${results[@]}" --out "$OUT/bench-$TARGET-merged.json" \
        2>>"$LOG" | tee "$OUT/summary.txt" || say "summary FAILED"
fi
say "done in $(( $(date +%s) - T0 )) s; failed steps: ${FAILED[*]:-none}"
exit 0

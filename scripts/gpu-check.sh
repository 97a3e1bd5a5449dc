#!/usr/bin/env bash
# The GPU check in one command: the CUDA tests, compute-sanitizer on every CUDA test, and
# the benchmark rows of docs/cuda-backend.md ("End to end") on random-weight files of the
# real shapes, with a one-screen summary. Meant for a machine with an NVIDIA GPU (the H200
# the figures come from); takes about 15 minutes there with a prebuilt binary (--quick: 2).
#
#   usage: scripts/gpu-check.sh [-b BIN_DIR] [-o OUT_DIR] [-m MODEL_DIR] [--quick | --sanitize]
#     -b BIN_DIR   use the binaries there (smelt, test_cuda_*, test_memplan); without it the
#                  tree is built into build-gpu (Release, the GPU's own architecture)
#     -o OUT_DIR   where the logs and summary.txt go (default gpu-check-out)
#     -m DIR       where the random-weight models are made or found (default /tmp/smelt-models)
#     --quick      tests and tg128 only (no pp512, depth or batched rows, no sanitizer)
#     --sanitize   compute-sanitizer only: memcheck on every CUDA test, racecheck on those
#                  with shared memory (test_cuda_mmq's shapes up to 4M weights)
#   env: SMELT_CUDA_REAL_MODELS (colon separated real GGUF files for test_cuda_forward's
#        strict check; models/*.gguf are picked up by the test itself when present)
#
# Exit status: 0 when every test passed, 1 otherwise (the benchmarks never fail the run).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="" out=gpu-check-out models=/tmp/smelt-models quick=0 sanitize=0
while [ $# -gt 0 ]; do
    case "$1" in
    -b) bin=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -m) models=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$out" "$models"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed)" >&2
    exit 2
fi
say "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | head -1)"
say "tree: $(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)'), $(date -u +%Y-%m-%dT%H:%MZ)"

# the packages scripts/gpu-bundle.sh carried, on a machine without them installed
[ -d .device/debs ] && ! pkg-config --exists jansson libmicrohttpd yaml-0.1 2> /dev/null && . scripts/gpu-env.sh
if [ -z "$bin" ]; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
    arch=$cc
    [ "$cc" = 90 ] && arch=90a # Hopper: the sm_90a instructions (wgmma, setmaxnreg)
    echo "gpu-check: building build-gpu for sm_$arch"
    if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSMELT_CUDA_ARCHS="$arch" > "$out/build.log" 2>&1 &&
           cmake --build build-gpu -j "$(nproc)" >> "$out/build.log" 2>&1; }; then
        tail -30 "$out/build.log"
        say "build: FAILED (see $out/build.log)"
        exit 1
    fi
    bin=build-gpu
fi
bin=$(cd "$bin" && pwd)
export SMELT_SOURCE_DIR=$root

fail=0
sanitize() { # compute-sanitizer over the test binaries: memcheck on all, racecheck on those with shared memory
    local san=/usr/local/cuda/bin/compute-sanitizer
    [ -x $san ] || san=$(command -v compute-sanitizer)
    [ -n "$san" ] || { say "compute-sanitizer: not found, skipped"; fail=1; return; }
    local t tool
    for tool in memcheck racecheck; do
        for t in test_cuda_mmv test_cuda_attn test_cuda_mmq test_cuda_mmb test_cuda_topk test_cuda_ssm test_cuda_moe test_memplan test_cuda_multi \
            test_cuda_forward; do
            [ $tool = racecheck ] && case $t in test_cuda_ssm|test_memplan|test_cuda_multi|test_cuda_forward) continue ;; esac
            [ -x "$bin/$t" ] || continue
            local t0=$SECONDS
            # racecheck: SMELT_TEST_SMALL=1 skips test_cuda_mmq's shapes above 4M weights
            # (minutes each under racecheck; the same kernels run at the smaller shapes)
            SMELT_TEST_SMALL=$([ $tool = racecheck ] && echo 1 || echo 0) timeout 900 $san --tool $tool \
                $([ $tool = racecheck ] && echo --racecheck-report hazard --print-limit 1000000) "$bin/$t" \
                > "$out/$tool-$t.log" 2>&1
            local sum
            sum=$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/$tool-$t.log" | tail -1)
            [ -n "$sum" ] || { sum="no summary (timeout?)"; fail=1; }
            case "$sum" in
            *" 0 errors"* | *" 0 hazards"* | "no summary"*) ;;
            *RACECHECK*)
                # cuBLAS's own Hopper kernels (nvjet_*, the dequantize + cuBLAS path) report
                # WAR hazards that racecheck does not model (asynchronous copies): counted
                # apart; any hazard in another kernel fails the check
                local kernels ours theirs
                kernels=$(grep -A1 "hazard detected" "$out/$tool-$t.log" | grep "Thread" | sed 's/.* at //')
                ours=$(grep -vE '^nvjet_' <<< "$kernels" | grep -c .)
                theirs=$(grep -cE '^nvjet_' <<< "$kernels")
                sum="$ours hazards in smelt's kernels, $theirs in cuBLAS's nvjet kernels"
                [ "$ours" = 0 ] || fail=1 ;;
            *) fail=1 ;;
            esac
            say "$tool $t: $sum, $((SECONDS - t0)) s"
        done
    done
}
if [ $sanitize = 1 ]; then
    sanitize
    say "sanitizers: $([ $fail = 0 ] && echo 'all clean' || echo 'SOME FAILED')"
    exit $fail
fi

# the models, made in the background while the tests run (smelt quantize --random)
make_model() { # preset type file
    [ -s "$3" ] && return 0
    "$bin/smelt" quantize --random "$1" "$3.part" "$2" && mv -f "$3.part" "$3"
}
L8Q4=$models/llama3-8b-q4_k_m.gguf L8Q8=$models/llama3-8b-q8_0.gguf L8F16=$models/llama3-8b-f16.gguf
Q05Q8=$models/qwen2.5-0.5b-q8_0.gguf Q05Q4=$models/qwen2.5-0.5b-q4_k_m.gguf
Q35Q4=$models/qwen3.5-9b-q4_k_m.gguf
(
    make_model qwen2.5-0.5b Q8_0 "$Q05Q8"
    make_model llama3-8b Q4_K_M "$L8Q4"
    make_model qwen2.5-0.5b Q4_K_M "$Q05Q4"
    make_model qwen3.5-9b Q4_K_M "$Q35Q4"
    if [ $quick = 0 ]; then
        make_model llama3-8b Q8_0 "$L8Q8"
        make_model llama3-8b F16 "$L8F16"
    fi
) > "$out/models.log" 2>&1 &
gen=$!

run_test() { # name [prefix command...]
    local name=$1; shift
    local t0=$SECONDS
    "$@" "$bin/$name" > "$out/$name.log" 2>&1
    local rc=$?
    local verdict=passed
    [ $rc = 0 ] || { verdict="FAILED (rc $rc)"; fail=1; }
    [ $rc = 77 ] && { verdict="SKIPPED: $(grep -m1 -i skip "$out/$name.log")"; fail=1; }
    say "test $name: $verdict, $((SECONDS - t0)) s"
}
for t in test_cuda_mmv test_cuda_attn test_cuda_mmq test_cuda_mmb test_cuda_topk test_cuda_ssm test_cuda_moe test_memplan test_cuda_multi; do
    [ -x "$bin/$t" ] && run_test $t || say "test $t: not built"
done
# several models in one smelt serve on the CUDA backend (backend auto picks it): three tiny
# llamas in one process, loaded, unloaded and reloaded; every model's KV pool bounded so
# that the three fit one GPU whatever its share
if python3 -c 'import pytest, gguf' 2> /dev/null; then
    t0=$SECONDS
    if SMELT_BIN=$bin/smelt SMELT_KV_SIZE=16384 python3 -m pytest -q tests/py/test_server_models.py \
        > "$out/test_server_models.log" 2>&1; then v=passed; else v=FAILED; fail=1; fi
    say "test test_server_models.py (CUDA): $v, $((SECONDS - t0)) s"
else
    say "test test_server_models.py (CUDA): SKIPPED: no pytest or gguf"
fi
[ $quick = 0 ] && sanitize
wait $gen
# whole models: the fixtures, models/*.gguf when present, the real files named in
# SMELT_CUDA_REAL_MODELS (strict) and the random-weight files (lenient)
SMELT_CUDA_MODELS="$Q05Q8:$Q05Q4:$Q35Q4" run_test test_cuda_forward
grep -E "cosine|argmax|greedy" "$out/test_cuda_forward.log" | grep -iE "fail|models/|real" | head -20 >> "$summary"
grep -E " on cuda: |SKIP gpu vs transformers" "$out/test_cuda_forward.log" | head -10 >> "$summary" # the hybrid fixtures

bench() { # label file args...
    local label=$1 file=$2; shift 2
    [ -s "$file" ] || { say "bench $label: no model file"; return; }
    "$bin/smelt" bench -m "$file" "$@" -o md > "$out/bench-$label.log" 2>&1
    grep -E "^\|.*(pp|tg)[0-9]" "$out/bench-$label.log" | tr -s ' ' | sed "s/^/bench $label /" | tee -a "$summary"
}
if [ $quick = 1 ]; then
    bench 8B-Q4_K_M "$L8Q4" -p 0 -n 128 -r 3
    bench 0.5B-Q8_0 "$Q05Q8" -p 0 -n 128 -r 3
    bench 0.5B-Q4_K_M "$Q05Q4" -p 0 -n 128 -r 3
    bench Q3.5-9B-Q4_K_M "$Q35Q4" -p 0 -n 128 -r 3
else
    bench 8B-Q4_K_M "$L8Q4" -p 512 -n 128 -r 3
    bench 8B-Q8_0 "$L8Q8" -p 512 -n 128 -r 3
    bench 8B-F16 "$L8F16" -p 512 -n 128 -r 3
    bench 0.5B-Q8_0 "$Q05Q8" -p 512 -n 128 -r 3
    bench 0.5B-Q4_K_M "$Q05Q4" -p 0 -n 128 -r 3
    bench Q3.5-9B-Q4_K_M "$Q35Q4" -p 512 -n 128 -r 3
    bench Q3.5-9B-batched "$Q35Q4" -p 0 -n 64 -B 8,32 -r 2
    bench 8B-depth "$L8Q4" -p 0 -n 64 -d 4096 -r 2
    bench 0.5B-depth "$Q05Q8" -p 0 -n 64 -d 4096 -r 2
    bench 8B-batched "$L8Q4" -p 0 -n 64 -B 8,32,64 -r 2
    bench 0.5B-batch "$Q05Q8" -p 0 -n 64 -B 8,32,64 -r 2
fi
say "tests: $([ $fail = 0 ] && echo 'all passed' || echo 'SOME FAILED OR SKIPPED')"
exit $fail

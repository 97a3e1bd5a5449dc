#!/usr/bin/env bash
# The GPU run of the small-batch tensor-core matmul (cuda_mmb, issue 19) in one command:
# test_cuda_mmb (every row count 1..64) and test_cuda_mmq (its helpers moved to cuda_mma.cuh),
# compute-sanitizer memcheck and racecheck on test_cuda_mmb, its SMELT_BENCH table (mmb
# against mmv and mmq per shape and row count), and Llama-3-8B Q4_K_M batched decode
# (`smelt bench -p 0 -n 128 -d 128 -B 1,8,32,64`) three ways: the measured path choice
# (default), SMELT_MM_PATH=mmb (forced from 2 to 64 rows) and SMELT_MM_PATH=legacy (never
# mmb: main's behaviour). Builds nothing. Prints one summary at the end (also OUT/summary.txt).
#
#   usage: scripts/gpu-batchmm.sh BIN_DIR [OUT_DIR] [MODEL_DIR]
#     BIN_DIR    smelt, test_cuda_mmb, test_cuda_mmq built with CUDA
#     OUT_DIR    logs (default gpu-batchmm-out); MODEL_DIR: where the random 8B file is made
#                or found (default /tmp/smelt-models)
set -uo pipefail
bin=${1:?usage: scripts/gpu-batchmm.sh BIN_DIR [OUT_DIR] [MODEL_DIR]}
out=${2:-gpu-batchmm-out}
models=${3:-/tmp/smelt-models}
mkdir -p "$out" "$models"
sum=$out/summary.txt
: > "$sum"
note() { echo "$*" | tee -a "$sum"; }
fail=0
m8=$models/llama3-8b-Q4_K_M.gguf
if [ ! -f "$m8" ]; then # in the background while the tests run
    ( "$bin/smelt" quantize --random llama3-8b "$m8.part" Q4_K_M > "$out/quantize.log" 2>&1 && mv -f "$m8.part" "$m8" ) &
    qpid=$!
fi

t0=$SECONDS
if "$bin/test_cuda_mmb" > "$out/test_cuda_mmb.log" 2>&1; then note "test_cuda_mmb: passed ($((SECONDS - t0)) s): $(tail -1 "$out/test_cuda_mmb.log")"
else note "test_cuda_mmb: FAILED, see $out/test_cuda_mmb.log:"; grep -m 8 'FAIL\|MISMATCH' "$out/test_cuda_mmb.log" | tee -a "$sum"; fail=1; fi
t0=$SECONDS
if "$bin/test_cuda_mmq" > "$out/test_cuda_mmq.log" 2>&1; then note "test_cuda_mmq: passed ($((SECONDS - t0)) s): $(tail -1 "$out/test_cuda_mmq.log")"
else note "test_cuda_mmq: FAILED, see $out/test_cuda_mmq.log"; grep -m 8 'FAIL' "$out/test_cuda_mmq.log" | tee -a "$sum"; fail=1; fi

san=/usr/local/cuda/bin/compute-sanitizer
[ -x $san ] || san=$(command -v compute-sanitizer || true)
if [ -n "$san" ]; then
    for tool in memcheck racecheck; do
        t0=$SECONDS
        SMELT_TEST_SMALL=1 timeout 900 $san --tool $tool $([ $tool = racecheck ] && echo --racecheck-report hazard) \
            "$bin/test_cuda_mmb" > "$out/$tool.log" 2>&1
        rc=$?
        line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1)
        note "$tool test_cuda_mmb (SMELT_TEST_SMALL=1): rc $rc, ${line:-no summary} ($((SECONDS - t0)) s)"
        [ $rc = 0 ] || fail=1
    done
else
    note "compute-sanitizer: not found"
fi

t0=$SECONDS
SMELT_BENCH=1 SMELT_TEST_SMALL=1 "$bin/test_cuda_mmb" > "$out/bench-mmb.log" 2>&1
note "SMELT_BENCH table ($((SECONDS - t0)) s; us per product, graph-replayed, weights from HBM):"
grep '^bench mmb' "$out/bench-mmb.log" | sed 's/^bench mmb //' | tee -a "$sum"

# the K split's target of blocks per SM (default 4): the 4096x4096 / 1024x4096 products get 2
# / 1 super-block per block at 4; the sweep says whether fewer, longer blocks (1, 2) or more
# (8) read the weights faster. The tests run under each value too (the bits must not change
# with n whatever the split).
for bps in 1 2 8; do
    t0=$SECONDS
    SMELT_MMB_BLOCKS_PER_SM=$bps SMELT_BENCH=1 SMELT_TEST_SMALL=1 "$bin/test_cuda_mmb" > "$out/bench-mmb-bps$bps.log" 2>&1
    note "SMELT_MMB_BLOCKS_PER_SM=$bps: rc $? ($((SECONDS - t0)) s): $(tail -1 "$out/bench-mmb-bps$bps.log")"
    grep '^bench mmb' "$out/bench-mmb-bps$bps.log" | sed 's/^bench mmb //' | tee -a "$sum"
done

[ -n "${qpid:-}" ] && wait "$qpid"
if [ -f "$m8" ]; then
    for mode in default mmb legacy; do
        env=()
        [ $mode = default ] || env=(SMELT_MM_PATH=$mode)
        t0=$SECONDS
        env "${env[@]}" SMELT_LOG=debug "$bin/smelt" bench -m "$m8" -p 0 -n 128 -d 128 -B 1,8,32,64 -o md \
            > "$out/bench-8b-$mode.log" 2>&1
        note "8B Q4_K_M batched decode, SMELT_MM_PATH=${mode} (rc $?, $((SECONDS - t0)) s):"
        grep '^|' "$out/bench-8b-$mode.log" | tee -a "$sum"
    done
    note "measured path table (default run, SMELT_LOG=debug):"
    grep -A 12 'matmul paths measured' "$out/bench-8b-default.log" | grep 'Q4_K\|Q6_K' | head -12 | tee -a "$sum"
    # where a step of 8 rows goes: per kernel, mmb's Q4_K products against the Q6_K ones
    # (attn_v, half the ffn_down, output) that still take mmv (docs/cuda-backend.md)
    t0=$SECONDS
    SMELT_PROFILE=1 "$bin/smelt" bench -m "$m8" -p 0 -n 32 -d 128 -B 8 -r 1 -o md > "$out/profile-8b-B8.log" 2>&1
    note "SMELT_PROFILE, 8 rows, default path (rc $?, $((SECONDS - t0)) s):"
    grep -A 25 '^SMELT_PROFILE' "$out/profile-8b-B8.log" | tee -a "$sum"
else
    note "no 8B file: $(tail -2 "$out/quantize.log" 2>/dev/null)"
fi
# Q8_0: no mmb kernel yet, so default = legacy there; the baseline for the Q8_0 kernel
m8q8=$models/llama3-8b-Q8_0.gguf
[ -f "$m8q8" ] || { "$bin/smelt" quantize --random llama3-8b "$m8q8.part" Q8_0 > "$out/quantize-q8.log" 2>&1 &&
    mv -f "$m8q8.part" "$m8q8"; }
if [ -f "$m8q8" ]; then
    t0=$SECONDS
    "$bin/smelt" bench -m "$m8q8" -p 0 -n 128 -d 128 -B 1,8,32,64 -o md > "$out/bench-8b-q8.log" 2>&1
    note "8B Q8_0 batched decode, default path (rc $?, $((SECONDS - t0)) s):"
    grep '^|' "$out/bench-8b-q8.log" | tee -a "$sum"
else
    note "no 8B Q8_0 file: $(tail -2 "$out/quantize-q8.log" 2>/dev/null)"
fi
echo "=== summary ($sum) ==="
cat "$sum"
exit $fail

#!/usr/bin/env bash
# Issue 23's CPU speed floors in one command: smelt against llama.cpp on the four files
# of docs/benchmarks.md ("CPU decode against llama.cpp"), side by side through
# scripts/bench-vs-llamacpp.sh, at 1, 2 and all cores, once with both engines at their
# best ISA level and once at AVX2 only.
#
#   usage: scripts/cpu-floors.sh LLAMA_SRC OUT_DIR
#   e.g.:  make build && ROUNDS=6 scripts/cpu-floors.sh /work/lcpp-src /tmp/floors
#
# LLAMA_SRC holds two llama.cpp builds for this CPU (this script builds nothing):
# build-avx512/bin/llama-bench (-DGGML_NATIVE=OFF, AVX-512 and VNNI on, AMX off: it faults on
# these machines) and build-avx2/bin/llama-bench (-DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF
# -DGGML_AVX_VNNI=OFF); a missing one skips its sitting. The two random files (Qwen2.5-0.5B
# shape Q8_0, Llama-3.2-1B shape Q4_K_M) are written into OUT_DIR/files once by
# `smelt quantize --random`. ROUNDS (default 6), NICE and GAP go to bench-vs-llamacpp.sh;
# smelt's rows carry its decode GB/s against the read bandwidth it measures (--bw measure).
# THREADS (default 1,2 and all cores) and ISAS (default "avx512 avx2") narrow a sitting.
# Results: OUT_DIR/{avx512,avx2}/summary.md and OUT_DIR/floors.md (both, with the CPU model,
# the date, smelt's commit and the load average).
set -euo pipefail
[ $# -eq 2 ] || { sed -n 2,18p "$0"; exit 2; }
LSRC=$1
OUT=$2
SMELT=${SMELT:-build/smelt}
export ROUNDS=${ROUNDS:-6}
[ -x "$SMELT" ] || { echo "no smelt binary at $SMELT (make build)" >&2; exit 2; }
mkdir -p "$OUT/files"
q8="$OUT/files/qwen2.5-0.5b-shape-q8_0.gguf"
l1b="$OUT/files/llama3.2-1b-shape-q4_k_m.gguf"
[ -s "$q8" ] || "$SMELT" quantize --random qwen2.5-0.5b "$q8" Q8_0
[ -s "$l1b" ] || "$SMELT" quantize --random llama3-1b "$l1b" Q4_K_M
FILES=(models/gemma3-270m-q4_k_m.gguf models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf "$q8" "$l1b")
n=$(nproc)
if [ -z "${THREADS:-}" ]; then
    THREADS=1,2
    [ "$n" -gt 2 ] && THREADS="1,2,$n"
fi
export THREADS

{
    echo "# CPU floors (issue 23)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $n CPUs;" \
        "smelt $(git rev-parse --short HEAD 2>/dev/null || echo '?'); llama.cpp in $LSRC"
} > "$OUT/floors.md"
for isa in ${ISAS:-avx512 avx2}; do
    bin="$LSRC/build-$isa/bin"
    [ -x "$bin/llama-bench" ] || { echo "skip $isa: no $bin/llama-bench" >&2; continue; }
    echo -e "\n## $isa\n" >> "$OUT/floors.md"
    SMELT_CPU_ISA=$isa SMELT_ARGS="--bw measure" SMELT="$SMELT" \
        scripts/bench-vs-llamacpp.sh "$bin" "$OUT/$isa" "${FILES[@]}"
    cat "$OUT/$isa/summary.md" >> "$OUT/floors.md"
done
echo "written: $OUT/floors.md" >&2

#!/usr/bin/env bash
# The mixture-of-experts benchmarks of issue 17 on the GPU machine, smelt and llama.cpp on the
# same random-weight files in one run (docs/bench.md, "Mixture of experts"):
#   Qwen3-30B-A3B Q4_K_M: tg128, pp512, decode with 8 and 64 sequences;
#   gpt-oss-20b (MXFP4 experts, the rest Q8_0): tg128, pp512;
# then the GPU-vs-CPU check of the Qwen3-30B-A3B file (test_cuda_forward, lenient: cosine per
# row, greedy text), and a line per figure in OUT/summary.txt.
#
#   usage: scripts/gpu-moe-bench.sh -b BIN_DIR [-l LLAMA_BIN_DIR] [-m MODELS_DIR] [-o OUT_DIR] [--no-check]
#     -b  smelt's build folder (smelt, test_cuda_forward)
#     -l  llama.cpp's bin folder (llama-bench, llama-batched-bench; ../shared/bench/LLAMACPP.md
#         says how to build it there); without it only smelt runs
#     -m  where the random files go (default /tmp/smelt-models: 16 GB + 13 GB)
#     --no-check  skip test_cuda_forward on the 30B file (its CPU side takes minutes)
set -uo pipefail
bin="" lcpp="" models=/tmp/smelt-models out=gpu-moe-out check=1
while [ $# -gt 0 ]; do
    case "$1" in
    -b) bin=$2; shift 2 ;;
    -l) lcpp=$2; shift 2 ;;
    -m) models=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    --no-check) check=0; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-moe-bench: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bin/smelt" ] || { echo "gpu-moe-bench: $bin/smelt not found (-b BIN_DIR)" >&2; exit 2; }
mkdir -p "$out" "$models"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

Q30=$models/qwen3-30b-a3b-q4_k_m.gguf OSS=$models/gpt-oss-20b-mxfp4.gguf
make_model() { # preset type file
    [ -s "$3" ] && return 0
    "$bin/smelt" quantize --random "$1" "$3.part" "$2" > "$out/quantize-$(basename "$3").log" 2>&1 && mv -f "$3.part" "$3"
}
make_model qwen3-30b-a3b Q4_K_M "$Q30" || say "quantize qwen3-30b-a3b: FAILED"
make_model gpt-oss-20b MXFP4_MOE "$OSS" || say "quantize gpt-oss-20b: FAILED"

sm() { # label file args...: smelt bench
    local label=$1 file=$2; shift 2
    "$bin/smelt" bench -m "$file" "$@" -o md > "$out/smelt-$label.log" 2>&1 || say "smelt $label: FAILED (rc $?)"
    grep -E "^\|.*(pp|tg)[0-9]" "$out/smelt-$label.log" | tr -s ' ' | sed "s/^/smelt $label /" | tee -a "$summary"
}
lb() { # label file args...: llama-bench
    [ -n "$lcpp" ] || return 0
    local label=$1 file=$2; shift 2
    "$lcpp/llama-bench" -m "$file" -ngl 99 -fa 1 "$@" > "$out/llama-$label.log" 2>&1 || say "llama-bench $label: FAILED"
    grep -E "^\|.*(pp|tg)[0-9]" "$out/llama-$label.log" | tr -s ' ' | sed "s/^/llama.cpp $label /" | tee -a "$summary"
}
lbb() { # label file: llama-batched-bench at 1, 8, 64 sequences (its S_TG column)
    [ -n "$lcpp" ] || return 0
    local label=$1 file=$2
    "$lcpp/llama-batched-bench" -m "$file" -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,64 -ngl 99 -fa on \
        > "$out/llama-$label.log" 2>&1 || say "llama-batched-bench $label: FAILED"
    grep -E "^\|\s+128\s+\|" "$out/llama-$label.log" | tr -s ' ' | sed "s/^/llama.cpp $label /" | tee -a "$summary"
}

# Qwen3-30B-A3B Q4_K_M: single sequence, then 8 and 64 sequences decoding at depth 128
sm q30-tg-pp "$Q30" -p 512 -n 128 -r 3
lb q30-tg-pp "$Q30" -p 512 -n 128 -r 3
sm q30-batched "$Q30" -p 0 -n 128 -d 128 -B 1,8,64 -r 2
lbb q30-batched "$Q30"
# gpt-oss-20b (MXFP4 experts)
sm oss-tg-pp "$OSS" -p 512 -n 128 -r 3
lb oss-tg-pp "$OSS" -p 512 -n 128 -r 3
# where a decode step's time goes (one profiled run; graphs off)
SMELT_PROFILE=1 "$bin/smelt" bench -m "$Q30" -p 0 -n 32 -r 1 > "$out/profile-q30.log" 2>&1 || true
# GPU against CPU on the real-shape file: cosine >= 0.999 per row and greedy 64/64 expected
if [ $check = 1 ] && [ -x "$bin/test_cuda_forward" ]; then
    SMELT_CUDA_MODELS="$Q30" "$bin/test_cuda_forward" > "$out/test_cuda_forward-q30.log" 2>&1
    say "test_cuda_forward on $Q30: rc $?"
    grep -E "cuda vs cpu" "$out/test_cuda_forward-q30.log" | grep -F "$(basename "$Q30")" | tee -a "$summary"
fi
echo "gpu-moe-bench: logs in $out, figures in $summary"

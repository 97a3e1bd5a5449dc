#!/usr/bin/env bash
# Side-by-side CPU speed of smelt and llama.cpp on the same GGUF files, same thread count.
#
#   usage: scripts/bench-vs-llamacpp.sh LLAMA_BIN_DIR OUT_DIR MODEL.gguf [MODEL.gguf ...]
#   env:   ROUNDS=3     alternating rounds (each round runs every model with both engines)
#          THREADS=2    -t for both engines; a list (1,2,16) gives a row per thread count
#          ARGS="-p 128 -n 32 -r 3"   the llama-bench test flags, passed to both
#          NICE=0       niceness of the benchmark processes (negative needs root). On a
#                       shared box a negative value keeps other load from stealing the
#                       cores mid-run; with the kernel's autogroup scheduling on, plain
#                       nice only ranks processes within one session, so the script then
#                       runs in a session of its own and sets that session's autogroup
#                       nice too (see docs/benchmarks.md)
#          GAP=0        seconds to sleep after each run (lets other work on a shared box
#                       catch up when NICE is negative)
#          SMELT=build/smelt
#          SMELT_ARGS=  flags for smelt only, e.g. "--bw measure": the summary then gives
#                       smelt's decode GB/s against the measured read bandwidth
#          SMELT_CPU_ISA=avx2 (read by smelt) with an AVX2-only llama.cpp build: the AVX2 floors
#
# LLAMA_BIN_DIR is a llama.cpp build's bin/ folder holding llama-bench (built separately:
# this script downloads and builds nothing). Within a round the two engines run one after
# the other on each model, and the order flips every round, so slow drifts in the
# machine's load hit both alike. Each run's JSONL goes to OUT_DIR/ENGINE__MODEL__rN.jsonl
# with the 1-minute load average before it in OUT_DIR/load.tsv; at the end a table of
# median tokens/s over all timed samples (ROUNDS x -r per engine, model and test) and the
# ratio smelt/llama.cpp is printed and written to OUT_DIR/summary.md.
# scripts/cpu-floors.sh runs issue 23's floors (four files, AVX-512 and AVX2) through it.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,24p "$0"; exit 2; }
LLAMA=$1
OUT=$2
shift 2
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
ARGS=${ARGS:--p 128 -n 32 -r 3}
NICE=${NICE:-0}
GAP=${GAP:-0}
SMELT=${SMELT:-build/smelt}
SMELT_ARGS=${SMELT_ARGS:-}
[ -x "$LLAMA/llama-bench" ] || { echo "no llama-bench in $LLAMA" >&2; exit 2; }
[ -x "$SMELT" ] || { echo "no smelt binary at $SMELT (make build)" >&2; exit 2; }
if [ "$NICE" -lt 0 ] && [ -w /proc/self/autogroup ]; then
    if [ -z "${BVL_OWN_SESSION:-}" ]; then
        BVL_OWN_SESSION=1 exec setsid -w "$0" "$LLAMA" "$OUT" "$@"
    fi
    echo "$NICE" > /proc/self/autogroup
fi
mkdir -p "$OUT"
: > "$OUT/load.tsv"

run() { # engine model round
    local eng=$1 m=$2 r=$3 tag
    tag="$eng"__"$(basename "$m" .gguf)"__r"$r"
    printf '%s\t%s\n' "$tag" "$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/load.tsv"
    # shellcheck disable=SC2086  # ARGS is a flag list on purpose
    if [ "$eng" = llama ]; then
        nice -n "$NICE" "$LLAMA/llama-bench" -m "$m" -t "$THREADS" $ARGS -o jsonl \
            > "$OUT/$tag.jsonl" 2> "$OUT/$tag.err"
    else
        nice -n "$NICE" "$SMELT" bench -m "$m" -t "$THREADS" $ARGS $SMELT_ARGS --backend cpu -o jsonl \
            > "$OUT/$tag.jsonl" 2> "$OUT/$tag.err"
    fi
    echo "done $tag (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    sleep "$GAP"
}

for r in $(seq 1 "$ROUNDS"); do
    for m in "$@"; do
        if [ $((r % 2)) = 1 ]; then run llama "$m" "$r"; run smelt "$m" "$r"
        else run smelt "$m" "$r"; run llama "$m" "$r"; fi
    done
done

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import glob, json, os, statistics, sys
out = sys.argv[1]
samples = {}  # (model, test, threads) -> engine -> [tok/s]
step_bytes, bw = {}, {}  # (model, test, threads) -> smelt's bytes per step, measured GB/s
for p in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    eng, model, _ = os.path.basename(p)[:-6].split("__")
    for line in open(p):
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        test = f"pp{j['n_prompt']}" if j["n_gen"] == 0 else (
            f"tg{j['n_gen']}" if j["n_prompt"] == 0 else f"pp{j['n_prompt']}+tg{j['n_gen']}")
        key = (model, test, j["n_threads"])
        samples.setdefault(key, {}).setdefault(eng, []).extend(j["samples_ts"])
        if eng == "smelt" and j.get("bw_pct") and j.get("bw_gbs"):
            # bw_pct = 100 avg_ts / (bw_gbs 1e9 / bytes): the step's bytes
            step_bytes[key] = j["bw_pct"] * j["bw_gbs"] * 1e9 / (100 * j["avg_ts"])
            bw.setdefault(key, []).append(j["bw_gbs"])
loads = [float(l.split("\t")[1]) for l in open(os.path.join(out, "load.tsv"))]
print(f"load average (1 min) before the runs: min {min(loads):.2f}, median "
      f"{statistics.median(loads):.2f}, max {max(loads):.2f}\n")
print("| model | test | threads | llama.cpp t/s (median, min-max, n) | smelt t/s (median, min-max, n) "
      "| smelt / llama.cpp | smelt GB/s of measured |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for (model, test, nt), d in sorted(samples.items()):
    def cell(v):
        return f"{statistics.median(v):.2f} ({min(v):.1f}-{max(v):.1f}, {len(v)})" if v else "-"
    a, b = d.get("llama", []), d.get("smelt", [])
    ratio = f"{statistics.median(b) / statistics.median(a):.2f}" if a and b else "-"
    key = (model, test, nt)
    gbs = (f"{statistics.median(b) * step_bytes[key] / 1e9:.1f} of {statistics.median(bw[key]):.1f}"
           if key in step_bytes and b else "-")
    print(f"| {model} | {test} | {nt} | {cell(a)} | {cell(b)} | {ratio} | {gbs} |")
EOF

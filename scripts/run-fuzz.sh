#!/usr/bin/env bash
# Runs every built fuzz target for a bounded time on a copy of its seed corpus.
#   usage: run-fuzz.sh BUILD_DIR SECONDS
set -euo pipefail
build=$1; secs=$2
cd "$(dirname "$0")/.."
shopt -s nullglob
targets=("$build"/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then echo "fuzz: no targets built"; exit 0; fi
for t in "${targets[@]}"; do
    [[ -f "$t" && -x "$t" && "$(basename "$t")" != *.* ]] || continue # skip fuzz_*.log of earlier runs
    name=$(basename "$t")
    seeds=fuzz/corpus/${name#fuzz_}
    work=$build/corpus-run/${name#fuzz_}
    mkdir -p "$work"
    [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
    echo "fuzz: $name for ${secs}s"
    dict=fuzz/${name#fuzz_}.dict
    extra=(); [ -f "$dict" ] && extra=(-dict="$dict")
    "$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
        "${extra[@]}" "$work" 2>"$build/$name.log" || { tail -50 "$build/$name.log"; echo "fuzz: $name FOUND A CRASH"; exit 1; }
    grep -E '^#[0-9]+.*DONE' "$build/$name.log" | tail -1 || true
done
echo "fuzz: all targets ran with no finding"

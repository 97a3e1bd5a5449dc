#!/usr/bin/env bash
# Runs every built fuzz target for a bounded time on a copy of its seed corpus, JOBS targets
# at a time (default: the number of cores; each libFuzzer run is one process on one core).
#   usage: run-fuzz.sh BUILD_DIR SECONDS [JOBS]
set -euo pipefail
build=$1; secs=$2; jobs=${3:-$(nproc)}
cd "$(dirname "$0")/.."
shopt -s nullglob
targets=()
for t in "$build"/fuzz_*; do
    [[ -f "$t" && -x "$t" && "$(basename "$t")" != *.* ]] && targets+=("$t") # not fuzz_*.log
done
if [ ${#targets[@]} -eq 0 ]; then echo "fuzz: no targets built"; exit 0; fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, $jobs at a time"

one() { # one target on its corpus copy; its log in BUILD/NAME.log, status 1 on a finding
    local t=$1 name seeds work dict
    name=$(basename "$t")
    seeds=fuzz/corpus/${name#fuzz_}
    work=$build/corpus-run/${name#fuzz_}
    mkdir -p "$work"
    [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
    dict=fuzz/${name#fuzz_}.dict
    local extra=(); [ -f "$dict" ] && extra=(-dict="$dict")
    "$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
        "${extra[@]}" "$work" 2>"$build/$name.log"
}

report() { # NAME STATUS: the target's last progress line, or its crash report
    local name=$1 rc=$2
    if [ "$rc" -ne 0 ]; then
        tail -50 "$build/$name.log"; echo "fuzz: $name FOUND A CRASH"; return 1
    fi
    echo "fuzz: $name: $(grep -E '^#[0-9]+.*DONE' "$build/$name.log" | tail -1 || true)"
}

declare -A pid_name=()
failed=0
reap() { # waits for one running target and reports it
    local done_pid rc=0
    wait -n -p done_pid "${!pid_name[@]}" || rc=$?
    report "${pid_name[$done_pid]}" "$rc" || failed=1
    unset "pid_name[$done_pid]"
}
for t in "${targets[@]}"; do
    [ ${#pid_name[@]} -ge "$jobs" ] && reap
    one "$t" & pid_name[$!]=$(basename "$t")
done
while [ ${#pid_name[@]} -gt 0 ]; do reap; done
[ $failed -eq 0 ] || { echo "fuzz: a target found a crash (its report above)"; exit 1; }
echo "fuzz: all targets ran with no finding"

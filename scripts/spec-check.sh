#!/usr/bin/env bash
# Speculative decoding checked and measured in one command (docs/speculative.md), on the CPU
# or on a GPU: the same script gives the CPU figures of the doc and the H200 ones still to
# measure.
#
#   usage: scripts/spec-check.sh [-b BIN_DIR] [-o OUT_DIR] [-m MODEL_DIR] [--backend cpu|cuda]
#                                [--qwen FILE] [--quick] [--costs] [--costs-only]
#     -b BIN_DIR   the binaries (smelt, test_spec, test_engine); default build
#     -o OUT_DIR   logs and summary.txt (default spec-check-out)
#     -m DIR       where the truncated drafts and random-weight files are made (default
#                  /tmp/smelt-models)
#     --backend B  cpu or cuda (default cuda when nvidia-smi sees a GPU, else cpu)
#     --qwen FILE  the real Qwen2.5-Coder 0.5B Q4_K_M (default models/qwen2.5-coder-0.5b-
#                  instruct-awq-q4_k_m.gguf; absent: the identity checks are skipped)
#     --quick      identity checks only (no timings)
#     --costs      also the verify-step costs of the random Llama-3-8B Q4_K_M and its
#                  Llama-3.2-1B Q4_K_M draft (--verify-rows 1,2,3,5,9 at -B 1,2,4,8,16, and
#                  the engine with the draft at -B 1,4,16): the inputs of the speedup
#                  projection and of the break-even batch (GPU; ~10 min on the H200)
#     --costs-only the costs alone (no identity checks, no logic tests): with a run without
#                  --costs, splits the work into two commands of under 10 minutes each
#   env: PYTHON (default python3) makes the truncated drafts; it needs the gguf package
#        (without it those checks are skipped, saying so)
#
# 1. identity: greedy `smelt run` on the real Qwen2.5-Coder 0.5B (models/) with n-gram drafts
#    on repeat-and-edit prompts (tests/data/spec/edit-1k.txt: a 956-token C file to print
#    again with a rename), the model as its own draft, and its first 20 and 12 layers
#    as drafts (made with scripts/make-truncated-draft.py), and a two-turn chat (-i) whose
#    second turn must reuse the cache as without drafts: the text must be the plain run's.
#    On the CPU a difference is a failure; on CUDA, whose rows are not bitwise
#    batch-invariant (docs/cuda-backend.md), a difference is reported with the first byte
#    that differs (a near-tie argmax flipping), and the logic tests below decide.
# 2. acceptance and wall-clock tok/s of the same runs, with and without speculation.
# 3. the engine and sampler logic: test_spec and test_engine.
# Exit status: 0 when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=build out=spec-check-out models=/tmp/smelt-models backend="" quick=0 costs=0 only_costs=0
qwen=models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf
while [ $# -gt 0 ]; do
    case "$1" in
    -b) bin=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -m) models=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --costs) costs=1; shift ;;
    --costs-only) costs=1; only_costs=1; shift ;;
    --qwen) qwen=$2; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "spec-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$backend" ]; then
    backend=cpu
    command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1 && backend=cuda
fi
mkdir -p "$out" "$models"
out=$(cd "$out" && pwd)
bin=$(cd "$bin" && pwd)
smelt=$bin/smelt
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
fail=0
say "spec-check: backend $backend, tree $(git rev-parse --short=8 HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%dT%H:%MZ)"
PYTHON=${PYTHON:-python3}
[ -x "$smelt" ] || { echo "spec-check: no smelt at $smelt (-b)" >&2; exit 2; }

edit='Rewrite this function so that it skips negative numbers; keep everything else as it is.

int sum(const int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        s += a[i];
    }
    return s;
}'
code='Write a C function that parses a decimal integer from a string, with overflow checks.'

# one run: prints "tok/s proposed accepted" and leaves the text in $out/$name.txt
one() {
    local name=$1; shift
    "$smelt" run "$qwen" --backend "$backend" --temp 0 "$@" > "$out/$name.txt" 2> "$out/$name.err"
    local rc=$?
    local ts p a
    ts=$(sed -n 's/.*generation: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' "$out/$name.err")
    p=$(sed -n 's/.*: \([0-9]*\) proposed, \([0-9]*\) accepted.*/\1/p' "$out/$name.err")
    a=$(sed -n 's/.*: \([0-9]*\) proposed, \([0-9]*\) accepted.*/\2/p' "$out/$name.err")
    echo "${rc} ${ts:-0} ${p:-0} ${a:-0}"
}

check() { # name prompt n spec-args...
    local name=$1 prompt=$2 n=$3; shift 3
    read -r rc0 ts0 _ _ <<< "$(one "$name-plain" "$prompt" -n "$n")"
    read -r rc1 ts1 p a <<< "$(one "$name" "$prompt" -n "$n" "$@")"
    local verdict=SAME
    if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
        verdict="ERROR (see $out/$name.err)"
        fail=1
    elif ! cmp -s "$out/$name-plain.txt" "$out/$name.txt"; then
        verdict="DIFF at $(cmp "$out/$name-plain.txt" "$out/$name.txt" | sed 's/.*byte \([0-9]*\).*/byte \1/')"
        [ "$backend" = cpu ] && fail=1
    fi
    local pct=0
    [ "$p" -gt 0 ] && pct=$(awk "BEGIN{printf \"%.1f\", 100*$a/$p}")
    say "$(printf '%-28s %-6s accepted %5s / %-5s (%5s%%)  tok/s %7s -> %7s' "$name" "$verdict" "$a" "$p" "$pct" "$ts0" "$ts1")"
}

if [ "$only_costs" = 1 ]; then
    :
elif [ -f "$qwen" ]; then
    drafts=1
    for l in 20 12; do
        [ -f "$models/qwen-coder-$l.gguf" ] && continue
        if ! "$PYTHON" scripts/make-truncated-draft.py "$qwen" "$models/qwen-coder-$l.gguf.part" --layers "$l" \
            > "$out/truncate-$l.log" 2>&1; then
            drafts=0
        else
            mv -f "$models/qwen-coder-$l.gguf.part" "$models/qwen-coder-$l.gguf"
        fi
    done
    n=200
    [ "$quick" = 1 ] && n=60
    say "identity and acceptance, greedy, $n tokens (tok/s: without -> with speculation):"
    check ngram-edit "$edit" $n --spec ngram
    check ngram-edit-k8 "$edit" $n --spec ngram --spec-k 8
    check ngram-code "$code" $n --spec ngram
    # the floor's case: repeat-and-edit of a ~1,000-token file (the whole file on a GPU)
    nf=$([ "$backend" = cuda ] && echo 1100 || echo 300)
    [ "$quick" = 1 ] && nf=60
    check ngram-file "$(cat tests/data/spec/edit-1k.txt)" "$nf" --spec ngram --spec-k 8 -c 4096
    check self-draft "$code" 60 --draft "$qwen" --spec-fixed
    if [ "$drafts" = 1 ]; then
        check draft20-code "$code" $n --draft "$models/qwen-coder-20.gguf" --spec-fixed
        check draft20-edit "$edit" $n --draft "$models/qwen-coder-20.gguf" --spec-fixed
        check draft12-code "$code" $n --draft "$models/qwen-coder-12.gguf" --spec-fixed
    else
        say "truncated drafts: SKIP (scripts/make-truncated-draft.py failed: $(tail -1 "$out"/truncate-*.log | tail -1);"
        say "  $PYTHON needs the gguf package: pip install gguf, or PYTHONPATH=<llama.cpp>/gguf-py)"
    fi
    # a chat whose second turn continues the first's (rolled-back) cache: the same text and
    # the same reuse as without speculation
    turns() { grep -o 'turn [0-9]*: prompt [0-9]* tokens ([0-9]* reused from the cache)' "$1"; }
    for v in plain ngram; do
        extra=()
        [ $v = ngram ] && extra=(--spec ngram)
        echo "Now say it again, twice." | "$smelt" run "$qwen" --backend "$backend" --temp 0 -n 60 \
            -i "Repeat after me: the quick brown fox jumps over the lazy dog." "${extra[@]}" \
            > "$out/chat-$v.txt" 2> "$out/chat-$v.err"
    done
    if cmp -s "$out/chat-plain.txt" "$out/chat-ngram.txt" &&
        [ "$(turns "$out/chat-plain.err")" = "$(turns "$out/chat-ngram.err")" ]; then
        say "chat-turns (ngram): SAME text and cache reuse ($(turns "$out/chat-ngram.err" | tail -1))"
    else
        say "chat-turns (ngram): DIFF (see $out/chat-*.txt, chat-*.err)"
        [ "$backend" = cpu ] && fail=1
    fi
else
    say "identity: SKIP ($qwen absent: scripts/fetch-test-models.sh)"
fi

# the MTP head on the qwen35moe fixture (random head: identity under rollbacks; the CPU only:
# the CUDA backend refuses the fixture's 16-wide expert rows)
if [ "$backend" = cpu ] && [ "$only_costs" = 0 ]; then
    mtp_fix=tests/data/ref-hybrid/qwen35moe-f16.gguf
    "$smelt" run "$mtp_fix" "Hello there, the quick brown fox" -n 100 --temp 0 > "$out/mtp-plain.txt" 2> /dev/null
    "$smelt" run "$mtp_fix" "Hello there, the quick brown fox" -n 100 --temp 0 --spec mtp --spec-fixed \
        > "$out/mtp.txt" 2> "$out/mtp.err"
    if cmp -s "$out/mtp-plain.txt" "$out/mtp.txt"; then say "mtp (fixture): SAME, $(grep -o '[0-9]* proposed.*' "$out/mtp.err")"
    else say "mtp (fixture): DIFF or ERROR (see $out/mtp.err)"; fail=1; fi
fi

for t in test_spec test_engine; do
    [ "$only_costs" = 1 ] && break
    if [ ! -x "$bin/$t" ]; then say "$t: FAILED (not built in $bin)"; fail=1; continue; fi
    if "$bin/$t" > "$out/$t.log" 2>&1; then say "$t: $(tail -1 "$out/$t.log")"
    else say "$t: FAILED (see $out/$t.log)"; fail=1; fi
done

if [ "$costs" = 1 ]; then
    # the names scripts/gpu-check.sh uses: one -m folder serves both
    L8=$models/llama3-8b-q4_k_m.gguf L1=$models/llama3-1b-q4_k_m.gguf
    for p in llama3-8b llama3-1b; do
        f=$models/$p-q4_k_m.gguf
        [ -s "$f" ] || { "$smelt" quantize --random "$p" "$f.part" Q4_K_M > "$out/quantize-$p.log" 2>&1 &&
            mv -f "$f.part" "$f"; } || { say "quantize --random $p: FAILED (see $out/quantize-$p.log)"; fail=1; }
    done
    bench() { # title args...
        local title=$1; shift
        say "$title"
        if ! "$smelt" bench --backend "$backend" -p 0 -n 128 -r 3 "$@" 2> "$out/bench.err" | tee -a "$summary"; then
            say "  FAILED: $(tail -1 "$out/bench.err")"
            fail=1
        fi
    }
    bench "verify-step costs, random Llama-3-8B Q4_K_M (t/s = rows per step x sequences / step time):" \
        -m "$L8" --verify-rows 1,2,3,5,9 -B 1,2,4,8,16
    bench "the draft alone, random Llama-3.2-1B Q4_K_M:" -m "$L1" -B 1,4,16
    bench "the engine with the draft (random weights: nothing is accepted, so this is the cost side):" \
        -m "$L8" -B 1,4,16 --draft "$L1" --spec-k 4 --spec-fixed
fi
say "spec-check: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail

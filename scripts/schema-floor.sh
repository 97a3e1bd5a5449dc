#!/usr/bin/env bash
# Issue #20's serving floor in one command: `smelt serve`, 64 clients, every request under a
# JSON schema, against the same load without one (floor: >= 90%), and the same two loads
# against llama-server on the same file (llama.cpp's GBNF from the same schema), with a
# one-screen summary of tok/s and the ratios.
#
#   usage: scripts/schema-floor.sh [-b BIN_DIR] [-o OUT_DIR] [-m MODEL_DIR] [--llama LLAMA_BIN]
#                                  [--model FILE]... [-C CLIENTS] [-R REQS] [-P WORDS] [-N TOKENS]
#                                  [--schema FILE] [--free]
#     -b BIN_DIR    where smelt is (default build)
#     -o OUT_DIR    logs and summary.txt (default schema-floor-out)
#     -m DIR        where the random-weight model is made or found (default /tmp/smelt-models)
#     --llama DIR   a llama.cpp build's bin/ holding llama-server: the same loads against it
#                   (-ngl 99 -fa on -c 131072 --parallel 64 --no-webui, as docs/LLAMACPP.md)
#     --model FILE  the models to serve, one run each (repeatable). Default: the floor's file,
#                   random Qwen2.5-0.5B Q8_0 ($MODEL_DIR/qwen2.5-0.5b-q8_0.gguf, made with
#                   `smelt quantize --random` if absent; a synthetic vocabulary of the real
#                   size, mostly byte tokens under a schema). The real Qwen2.5-Coder 0.5B
#                   Q4_K_M (models/) has the real 151k-token vocabulary (real masks, real
#                   JSON): --model models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf
#     -C -R -P -N   the load (default 64 clients x 2 requests, ~72-word unique prompts, at most
#                   128 tokens), as scripts/schema-load.py takes it
#     --schema FILE a JSON Schema (default: schema-load.py's tool call)
#     --free        the plain pass is not matched to the schema pass's lengths (schema-load.py)
#   env: SMELT_PORT (default 18530), LLAMA_PORT (default 18531), PYTHON (default python3,
#        needs aiohttp), SERVE_ARGS (extra flags for smelt serve), LLAMA_ARGS (for llama-server),
#        LOAD_TIMEOUT (seconds per schema-load.py run, default 240: llama.cpp's grammar
#        sampling is serial host work, ~10 ms a token published, and may not finish)
#
# Each pass runs the schema load first, then the plain one with every request generating
# exactly the tokens its schema twin generated (ignore_eos): the two passes do the same
# work but for the grammar. Exit status: 0 when smelt's schema/plain ratio is >= 0.90 on
# every model, 1 otherwise (or when a server did not start).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=build out=schema-floor-out models=/tmp/smelt-models llama="" C=64 R=2 P=72 N=128
schema_args=() free=() files=()
while [ $# -gt 0 ]; do
    case "$1" in
    -b) bin=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -m) models=$2; shift 2 ;;
    --llama) llama=$2; shift 2 ;;
    --model) files+=("$2"); shift 2 ;;
    -C) C=$2; shift 2 ;;
    -R) R=$2; shift 2 ;;
    -P) P=$2; shift 2 ;;
    -N) N=$2; shift 2 ;;
    --schema) schema_args=(--schema "$(realpath "$2")"); shift 2 ;;
    --free) free=(--free); shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "schema-floor: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
PYTHON=${PYTHON:-python3}
SMELT_PORT=${SMELT_PORT:-18530}
LLAMA_PORT=${LLAMA_PORT:-18531}
mkdir -p "$out" "$models"
out=$(cd "$out" && pwd)
bin=$(cd "$bin" && pwd)
smelt=$bin/smelt
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
[ -x "$smelt" ] || { echo "schema-floor: no smelt at $smelt (-b)" >&2; exit 2; }
if [ -n "$llama" ] && [ ! -x "$llama/llama-server" ]; then
    echo "schema-floor: no llama-server in $llama" >&2
    exit 2
fi
"$PYTHON" -c "import aiohttp" 2> /dev/null || { echo "schema-floor: $PYTHON has no aiohttp" >&2; exit 2; }

if [ ${#files[@]} = 0 ]; then
    q8=$models/qwen2.5-0.5b-q8_0.gguf
    if [ ! -f "$q8" ]; then
        echo "schema-floor: making $q8"
        if ! "$smelt" quantize --random qwen2.5-0.5b "$q8.part" Q8_0 > "$out/quantize.log" 2>&1; then
            echo "schema-floor: quantize failed (see $out/quantize.log)" >&2
            exit 1
        fi
        mv -f "$q8.part" "$q8"
    fi
    files=("$q8")
fi

srv_pid=""
stop() {
    if [ -n "$srv_pid" ]; then
        kill "$srv_pid" 2> /dev/null
        wait "$srv_pid" 2> /dev/null
        srv_pid=""
    fi
}
trap stop EXIT
up() { # url: /health answers 200
    "$PYTHON" -c 'import sys, urllib.request
try: sys.exit(urllib.request.urlopen(sys.argv[1] + "/health", timeout=5).status != 200)
except Exception: sys.exit(1)' "$1"
}
wait_up() { # url log: the server answers /health with 200 within 600 s
    local _
    for _ in $(seq 1 1200); do
        if ! kill -0 "$srv_pid" 2> /dev/null; then
            echo "schema-floor: the server exited (see $2):" >&2
            tail -5 "$2" >&2
            return 1
        fi
        up "$1" && return 0
        sleep 0.5
    done
    echo "schema-floor: $1 not up after 600 s (see $2)" >&2
    return 1
}
field() { # json-line key
    "$PYTHON" -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("-" if v is None else v)' "$1" "$2"
}

fail=0
say "schema-floor: tree $(git rev-parse --short=8 HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%dT%H:%MZ), load ${C} clients x ${R} requests, ~${P}-word prompts, <= ${N} tokens$([ ${#free[@]} = 0 ] && echo ', plain matched to the schema lengths')"
command -v nvidia-smi > /dev/null && say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    for eng in smelt llama; do
        [ $eng = llama ] && [ -z "$llama" ] && continue
        log=$out/$eng-$name.serve.log
        if [ $eng = smelt ]; then
            port=$SMELT_PORT
            # shellcheck disable=SC2086  # SERVE_ARGS is a flag list
            "$smelt" serve "$f" --host 127.0.0.1 --port "$port" --quiet ${SERVE_ARGS:-} > "$log" 2>&1 &
        else
            port=$LLAMA_PORT
            # shellcheck disable=SC2086
            "$llama/llama-server" -m "$f" -ngl 99 -fa on -c 131072 --parallel 64 --no-webui \
                --host 127.0.0.1 --port "$port" ${LLAMA_ARGS:-} > "$log" 2>&1 &
        fi
        srv_pid=$!
        url=http://127.0.0.1:$port
        if ! wait_up "$url" "$log"; then
            say "$(printf '%-10s %-44s did not start (see %s)' $eng "$name" "$log")"
            fail=1
            stop
            continue
        fi
        res=$out/$eng-$name.jsonl
        timeout "${LOAD_TIMEOUT:-240}" "$PYTHON" scripts/schema-load.py "$url" "$name" "$C" "$R" "$P" "$N" \
            "${schema_args[@]}" "${free[@]}" > "$res" 2> "$out/$eng-$name.load.err"
        rc=$?
        stop
        if [ $rc != 0 ] || [ "$(wc -l < "$res")" -lt 3 ]; then
            why=FAILED
            [ $rc = 124 ] && why="TIMED OUT after ${LOAD_TIMEOUT:-240} s"
            say "$(printf '%-6s %-44s load %s (see %s): %s' $eng "$name" "$why" "$out/$eng-$name.load.err" \
                "$(head -c 300 "$res" | tr '\n' ' ')")"
            tail -3 "$out/$eng-$name.load.err" >&2
            fail=1
            continue
        fi
        sc=$(sed -n 1p "$res") pl=$(sed -n 2p "$res") ra=$(sed -n 3p "$res")
        ratio=$(field "$ra" schema_over_plain)
        say "$(printf '%-6s %-44s schema %8s tok/s (%s tokens)  plain %8s tok/s  ratio %s  itl p50 %s' \
            $eng "$name" "$(field "$sc" tok_s)" "$(field "$sc" tokens)" "$(field "$pl" tok_s)" "$ratio" \
            "$(field "$ra" itl_p50_schema_over_plain)")"
        if [ $eng = smelt ] && ! awk "BEGIN{exit !($ratio >= 0.90)}"; then fail=1; fi
        printf '%s %s\n' "$eng" "$(field "$sc" tok_s)" >> "$out/schema-$name.tsv"
    done
    if [ -f "$out/schema-$name.tsv" ] && [ "$(wc -l < "$out/schema-$name.tsv")" = 2 ]; then
        s=$(awk '$1=="smelt"{print $2}' "$out/schema-$name.tsv")
        l=$(awk '$1=="llama"{print $2}' "$out/schema-$name.tsv")
        say "$(printf '%-6s %-44s under the schema: smelt / llama-server = %s' '' "$name" \
            "$(awk "BEGIN{printf \"%.2f\", $s/$l}")")"
    fi
    rm -f "$out/schema-$name.tsv"
done
say "schema-floor: $([ $fail = 0 ] && echo 'floor met (smelt schema/plain >= 0.90)' || echo 'FAILED or below the floor')"
exit $fail

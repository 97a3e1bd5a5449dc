#!/usr/bin/env bash
# Installs what smelt needs to build and test on Debian 12, skipping what is present.
#   Debian: cmake, a C compiler, clang + libFuzzer runtime, pkg-config, and the -dev
#           packages of the libraries smelt links (jansson, libmicrohttpd, PCRE2, libcurl).
#   Python: the test references listed in tests/requirements.txt.
# The CUDA toolkit is optional: when nvcc is on PATH the CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libjansson-dev libmicrohttpd-dev libpcre2-dev libcurl4-openssl-dev)
missing=()
for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
stamp=build/.pydeps-stamp
if [ ! -f "$stamp" ] || [ tests/requirements.txt -nt "$stamp" ]; then
    echo "install-deps: installing Python test packages (tests/requirements.txt)"
    $PY -m pip install -q --disable-pip-version-check -r tests/requirements.txt
    mkdir -p build && touch "$stamp"
fi

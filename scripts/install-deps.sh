#!/usr/bin/env bash
# Installs what smelt needs to build and test on Debian 12, skipping what is present.
#   Debian: cmake, a C compiler, clang + libFuzzer runtime, pkg-config, the -dev packages
#           of the libraries smelt links (jansson, libmicrohttpd, PCRE2, libcurl, libyaml), the
#           scripts the web chat embeds at build time (marked, highlight.js, DOMPurify), and
#           Chromium with its WebDriver for the web chat's browser tests.
#   Python: the test references listed in tests/requirements.txt, installed into the
#           virtual environment .venv (made here with python3 -m venv; Debian's own
#           python3 refuses pip installs outside one, PEP 668). PYTHON=/path/to/python
#           installs into that interpreter instead (the Makefile passes its PYTHON).
# The CUDA toolkit is optional: when nvcc is on PATH the CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(build-essential cmake pkg-config clang libclang-rt-14-dev python3-venv
      libjansson-dev libmicrohttpd-dev libpcre2-dev libcurl4-openssl-dev libyaml-dev
      libjs-marked libjs-highlight.js node-dompurify)
# Chromium's recommends (printing, notifications, power, more fonts) serve no headless test:
# without them it adds ~145 packages (185 MB to download) to a fresh Debian 12, with them ~260.
browser=(chromium chromium-driver)
missing() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
    done
}
mapfile -t need < <(missing "${debs[@]}")
mapfile -t need_browser < <(missing "${browser[@]}")
if [ ${#need[@]} -gt 0 ] || [ ${#need_browser[@]} -gt 0 ]; then
    echo "install-deps: installing Debian packages: ${need[*]} ${need_browser[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    [ ${#need[@]} -eq 0 ] ||
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
    [ ${#need_browser[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends "${need_browser[@]}" >/dev/null
fi

PY=${PYTHON:-.venv/bin/python}
stamp=build/.pydeps-stamp
# A PYTHON inside a virtual environment (or one still to be made) gets its packages there.
case "$PY" in
*/bin/python | */bin/python3)
    venv=${PY%/bin/python*}
    # (re)made when absent or broken (an interrupted creation leaves one without pip)
    if [ ! -e "$PY" ] || ! "$PY" -m pip --version > /dev/null 2>&1; then
        echo "install-deps: making the Python virtual environment $venv"
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    [ -f "$venv/pyvenv.cfg" ] && stamp=$venv/.smelt-requirements-stamp ;;
esac
if [ ! -f "$stamp" ] || [ tests/requirements.txt -nt "$stamp" ]; then
    echo "install-deps: installing Python test packages (tests/requirements.txt) for $PY"
    "$PY" -m pip install -q --disable-pip-version-check -r tests/requirements.txt
    mkdir -p "$(dirname "$stamp")" && touch "$stamp"
fi

#!/usr/bin/env bash
# llama.cpp beside smelt on the GPU machine, for the side-by-side runs every speed floor is
# measured against (../shared/bench/LLAMACPP.md). Its source is the .lcpp folder that
# scripts/gpu-bundle.sh exports (carried with the run).
#   scripts/gpu-llamacpp.sh start   copy .lcpp to /tmp/lcpp and build llama-bench,
#                                   llama-batched-bench and llama-server there, detached
#                                   (about 7 minutes with 11 jobs; the run's tree is laid
#                                   anew for each command, so nothing builds inside it)
#   scripts/gpu-llamacpp.sh wait    block until that build ends; print its bin folder, or
#                                   its log's tail and fail
# JOBS (default 11) sets the build's jobs. The machine keeps /tmp only while it is held:
# start and wait belong to back-to-back calls.
set -uo pipefail
cd "$(dirname "$0")/.."
src=/tmp/lcpp
case "${1:-}" in
start)
    [ -d .lcpp ] || { echo "gpu-llamacpp: no .lcpp here (scripts/gpu-bundle.sh LLAMA_GIT_DIR, and carry .lcpp)" >&2; exit 2; }
    if [ -f $src/.started ]; then echo "gpu-llamacpp: already started"; exit 0; fi
    rm -rf $src && cp -r .lcpp $src && touch $src/.started
    cd $src && setsid nohup sh -c "cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF \
        > build.log 2>&1 && cmake --build build -j ${JOBS:-11} --target llama-bench llama-server llama-batched-bench \
        >> build.log 2>&1; echo \$? > .rc" < /dev/null > /dev/null 2>&1 &
    echo "gpu-llamacpp: building in $src (log $src/build.log)"
    ;;
wait)
    [ -f $src/.started ] || { echo "gpu-llamacpp: not started on this machine" >&2; exit 2; }
    while [ ! -f $src/.rc ]; do sleep 5; done
    if [ "$(cat $src/.rc)" = 0 ]; then echo "$src/build/bin"; else tail -20 $src/build.log >&2; exit 1; fi
    ;;
*)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

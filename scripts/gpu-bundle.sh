#!/usr/bin/env bash
# Prepares, on the development machine, what a GPU machine without our Debian packages and
# without a network needs to build smelt (and llama.cpp beside it), into git-ignored folders
# of the checkout that a remote run carries:
#   .device/debs  the -dev packages of the libraries smelt links (jansson, libmicrohttpd,
#                 PCRE2, libcurl, libyaml) and their runtime libraries, as .deb files;
#                 `. scripts/gpu-env.sh` unpacks them there (about 3 MB)
#   .lcpp         with LLAMA_GIT_DIR (a fetched llama.cpp repository, e.g. a mirror of
#                 github:unslothai/llama.cpp): the part of its source a CUDA build of
#                 llama-bench, llama-batched-bench and llama-server needs (about 33 MB);
#                 `scripts/gpu-llamacpp.sh` builds it there
#
#   usage: scripts/gpu-bundle.sh [LLAMA_GIT_DIR]
# Then carry [".device", ".lcpp"] with the run (../shared/bench/LLAMACPP.md has the runs).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=(libjansson-dev libjansson4 libmicrohttpd-dev libmicrohttpd12 libpcre2-dev libpcre2-8-0
      libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libcurl4-openssl-dev libyaml-dev libyaml-0-2)
mkdir -p .device/debs
(cd .device/debs && apt-get download "${debs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
echo "gpu-bundle: .device/debs: $(ls .device/debs/*.deb | wc -l) packages, $(du -sh .device/debs | cut -f1)"
if [ $# -ge 1 ]; then
    g=$1
    rm -rf .lcpp && mkdir -p .lcpp
    git -C "$g" archive --format=tar HEAD CMakeLists.txt cmake common ggml include src tools vendor licenses \
        scripts/ui-assets.cmake scripts/build-info.sh | tar -x -C .lcpp
    # the backends a CUDA build does not compile
    (cd .lcpp/ggml/src && rm -rf ggml-blas ggml-cann ggml-et ggml-hexagon ggml-hip ggml-metal ggml-musa ggml-opencl \
        ggml-openvino ggml-rpc ggml-sycl ggml-virtgpu ggml-vulkan ggml-webgpu ggml-zdnn ggml-zendnn)
    echo "gpu-bundle: .lcpp: llama.cpp $(git -C "$g" rev-parse --short HEAD), $(du -sh .lcpp | cut -f1)"
fi

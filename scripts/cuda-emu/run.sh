#!/usr/bin/env bash
# The CUDA kernels' tests on the CPU, for sessions and machines without a GPU: builds the CUDA
# sources as C++ against a fiber-based emulator (emu.h, emu.cpp; patch.py rewrites launches and
# inline PTX) and runs test_cuda_mmv, test_cuda_mmq at small sizes (drivers/mmq.c), the one-token kernel variants, test_cuda_attn's kernel
# tests, test_cuda_topk at smaller sizes (drivers/topk.c), test_cuda_ssm (the recurrent-state
# ops), test_cuda_encoder (bert's ops), test_cuda_forward on the fixtures and the embedding
# models (drivers/forward.c embed), test_cuda_multi's single-thread parts (two
# backends interleaved) and the hybrid fixtures (drivers/hybrid.c: qwen35 through the
# transformers scenarios and against the CPU). It checks logic, not speed, the memory
# model, PDL or races (see emu.h), and is no substitute for the GPU run:
# docs/cuda-backend.md.
#
#   usage: scripts/cuda-emu/run.sh [--quick] [MODEL.gguf...]
#     --quick      test_cuda_mmv, test_cuda_mmb, mmq, the attention tests, test_cuda_ssm and
#                  test_cuda_encoder only (about
#                  10 minutes on 2 cores)
#     MODEL.gguf   also the logits check (drivers/logits.c) on each file: slow, minutes to
#                  hours by size (Qwen2.5-0.5B: ~1 h)
#   needs: the normal build in build/ (libsmelt_core.a), g++, python3, the CUDA headers
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
here=$root/scripts/cuda-emu
out=${CUDA_EMU_OUT:-$root/build/cuda-emu}
quick=0 models=()
for a in "$@"; do
    case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) models+=("$a") ;;
    esac
done
[ -f build/libsmelt_core.a ] || { echo "cuda-emu: build/libsmelt_core.a missing: run make first" >&2; exit 2; }
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
mkdir -p "$out"
python3 "$here/patch.py" src "$out"

cxx=(g++ -O2 -fno-strict-aliasing -std=c++17 -x c++ -include "$here/emu.h" -DSMELT_HAVE_CUDA=1 -D_GNU_SOURCE -I"$here" -I"$out/src"
     -I"$root/include" -I"$cuda_inc" -Wno-attributes)
cc=(gcc -O2 -fno-strict-aliasing -std=gnu17 -include "$here/emu_api.h" -DSMELT_HAVE_CUDA=1 -D_GNU_SOURCE "-DSMELT_SOURCE_DIR=\"$root\""
    "-DSMELT_SHARED_DIR=\"$root/../shared\"" "-DSMELT_BUILD_DIR=\"$root/build\"" -I"$here" -I"$root/tests"
    -I"$root/tests/unit" -I"$out/src" -I"$root/include" -I"$cuda_inc")
echo "cuda-emu: compiling the CUDA sources for the CPU"
objs=()
throttle() { while [ "$(jobs -rp | wc -l)" -ge "${CUDA_EMU_JOBS:-6}" ]; do wait -n; done; }
for f in "$out"/src/backend/cuda/*.cu; do
    o=$out/$(basename "$f" .cu).o
    throttle
    "${cxx[@]}" -c "$f" -o "$o" &
    objs+=("$o")
done
g++ -O2 -std=c++17 -I"$cuda_inc" -c "$here/emu.cpp" -o "$out/emu.o" &
wait
# the backend's C files (mm_tune.c, plain C, is in build/libsmelt_core.a already)
for f in "$out"/src/backend/cuda/*.c; do
    [ "$(basename "$f")" = mm_tune.c ] && continue
    o=$out/$(basename "$f" .c).o
    throttle
    "${cc[@]}" -c "$f" -o "$o" &
    objs+=("$o")
done
wait
libs=("${objs[@]}" "$out/emu.o" build/libsmelt_core.a -L"${CUDA_HOME:-/usr/local/cuda}/lib64"
      -lcudart -lcublas -lcublasLt -lm -lpthread $(pkg-config --libs jansson libpcre2-8 libmicrohttpd libcurl))
link() { # name source
    "${cc[@]}" -c "$2" -o "$out/$1.o"
    g++ -no-pie -o "$out/$1" "$out/$1.o" "${libs[@]}" 2> >(grep -v "warning" >&2)
}
link test_cuda_mmv tests/unit/test_cuda_mmv.c
link test_cuda_moe tests/unit/test_cuda_moe.c
link test_cuda_mmb tests/unit/test_cuda_mmb.c
link mmq "$here/drivers/mmq.c"
link attn "$here/drivers/attn.c"
link test_cuda_ssm tests/unit/test_cuda_ssm.c
link test_cuda_encoder tests/unit/test_cuda_encoder.c
[ $quick = 1 ] || {
    link topk "$here/drivers/topk.c"
    link mmv_variants "$here/drivers/mmv_variants.c"
    link forward "$here/drivers/forward.c"
    link multi "$here/drivers/multi.c"
    link hybrid "$here/drivers/hybrid.c"
}
[ ${#models[@]} = 0 ] || link logits "$here/drivers/logits.c"

fail=0
run() { # label command...
    local t0=$SECONDS
    if "$@" > "$out/$1.log" 2>&1; then echo "cuda-emu: $(basename "$1") passed ($((SECONDS - t0)) s)"
    else echo "cuda-emu: $(basename "$1") FAILED ($((SECONDS - t0)) s): $out/$(basename "$1").log"; fail=1; fi
}
cd "$out"
run ./test_cuda_mmv
run ./test_cuda_moe
SMELT_TEST_SMALL=1 run ./test_cuda_mmb # Q4_K at every row count 1..64 on the ragged shapes, the other types at 8
run ./mmq # every mmq type at small shapes, MXFP4's partial slices (drivers/mmq.c)
run ./attn
run ./test_cuda_ssm
run ./test_cuda_encoder
if [ $quick = 0 ]; then
    run ./topk
    run ./mmv_variants
    run ./forward
    run ./forward embed
    run ./multi
    run ./hybrid
fi
for m in "${models[@]}"; do
    ./logits "$m" 2> /dev/null | tee -a "$out/logits.log" || fail=1
done
exit $fail

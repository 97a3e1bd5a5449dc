#!/usr/bin/env bash
# Where an mmq tile's time goes, on the GPU machine (docs/cuda-backend.md, "Tensor-core
# matmul"): for each tile, the SASS of its Q4_K kernel (instruction counts: HGMMA / HMMA,
# warpgroup arrives and waits, barriers, shared loads, cp.async, spills) and ~70 lines around
# the first HGMMA; the time of one product alone; and ncu's speed-of-light, warp-state,
# scheduler, memory-workload and occupancy sections for it.
#
#   usage: scripts/gpu-mmq-profile.sh -b BUILD_DIR [-o OUT_DIR] [-n TOKENS] [-s] [TILE...]
#     -b  a build folder with test_cuda_mmq (and CMake's object of cuda_mmq.cu)
#     -n  token rows of the product (default 512); the shape is Q4_K 4096 x 4096
#         (SMELT_BENCH_ROWS / SMELT_BENCH_K change it)
#     -s  also ncu's source counters of the first tile, as a SASS-level CSV (gzipped)
#     TILE  tile numbers (cuda_mmq_tile_name; default 7 4: the 128 x 128 wgmma tile and the
#           256 x 64 mma.sync one)
set -uo pipefail
bin="" out=gpu-mmq-profile-out n=512 src=0 tiles=()
while [ $# -gt 0 ]; do
    case "$1" in
    -b) bin=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -s) src=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) tiles+=("$1"); shift ;;
    esac
done
[ -n "$bin" ] && [ -x "$bin/test_cuda_mmq" ] || { echo "gpu-mmq-profile: -b BUILD_DIR with test_cuda_mmq" >&2; exit 2; }
[ ${#tiles[@]} -gt 0 ] || tiles=(7 4)
mkdir -p "$out"
obj=$(find "$bin" -name 'cuda_mmq.cu.o' | head -1)
for t in "${tiles[@]}"; do
    f=_Z10mmq_kernelILj12ELi${t}EEv8mmq_args # mmq_kernel<QT_Q4_K, t>
    if [ -n "$obj" ] && cuobjdump -sass -fun "$f" "$obj" > "$out/tile$t.sass" 2> /dev/null; then
        s=$out/tile$t.sass
        echo "tile $t SASS: $(grep -c HGMMA "$s") HGMMA, $(grep -c 'HMMA' "$s") HMMA, $(grep -c 'WARPGROUP.ARRIVE' "$s") WARPGROUP.ARRIVE, $(grep -c 'WARPGROUP.DEPBAR' "$s") WARPGROUP.DEPBAR, $(grep -c 'BAR.SYNC' "$s") BAR.SYNC, $(grep -c ' LDS' "$s") LDS, $(grep -c LDSM "$s") LDSM, $(grep -c LDGSTS "$s") LDGSTS, $(grep -c STL "$s") STL"
        l=$(grep -n -m1 HGMMA "$s" | cut -d: -f1)
        [ -n "$l" ] && sed -n "$((l > 30 ? l - 30 : 1)),$((l + 40))p" "$s" | sed 's/ *\/\*[0-9a-f]*\*\/ *//g' > "$out/tile$t.hgmma.txt"
        gzip -f "$s"
    else
        echo "tile $t: no SASS (cuobjdump or the object missing)"
    fi
    SMELT_BENCH=one SMELT_BENCH_N=$n SMELT_MMQ_BENCH_TILE=$t "$bin/test_cuda_mmq" 2>&1 | grep "bench one"
    if command -v ncu > /dev/null; then
        SMELT_BENCH=one SMELT_BENCH_N=$n SMELT_MMQ_BENCH_TILE=$t ncu --section SpeedOfLight --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy -k regex:mmq_kernel \
            --launch-skip 2 --launch-count 1 "$bin/test_cuda_mmq" > "$out/ncu$t.txt" 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Mem Pipes Busy" "$out/ncu$t.txt" | sed "s/^/tile $t: /"
    fi
done
if [ $src = 1 ] && command -v ncu > /dev/null; then
    t=${tiles[0]}
    SMELT_BENCH=one SMELT_BENCH_N=$n SMELT_MMQ_BENCH_TILE=$t ncu --section WarpStateStats --section SourceCounters \
        --import-source yes -k regex:mmq_kernel --launch-skip 2 --launch-count 1 -o "$out/src$t" -f "$bin/test_cuda_mmq" > /dev/null 2>&1
    ncu -i "$out/src$t.ncu-rep" --page source --csv --print-source sass 2> /dev/null | gzip > "$out/src$t.csv.gz"
fi
echo "gpu-mmq-profile: $out"

/* The gemv kernels' software prefetch of their weights, shared by the AVX2 and AVX-512 levels
 * (cpu_gemv_avx2.c, cpu_gemv_avx512.c; docs/cpu-backend.md, "Software prefetch in the AVX2
 * gemv kernels"). Included by those files only; _mm_prefetch is SSE, so every x86-64 level
 * compiles it. */
#ifndef SMELT_CPU_GEMV_PF_H
#define SMELT_CPU_GEMV_PF_H
#include <immintrin.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "quant/blocks.h"
#include "quant/quant.h"

/* Bytes of one block of a gemv type, a compile-time constant where t is (qtype_get's
 * type_size is not): the tile size then folds into the prefetch loops, which otherwise
 * compiled to a guarded, branchy unroll per chunk. */
static inline __attribute__((always_inline)) size_t blk_bytes(uint32_t t) {
    switch (t) {
    case QT_Q8_0: return sizeof(struct block_q8_0);
    case QT_Q4_0: return sizeof(struct block_q4_0);
    case QT_Q4_1: return sizeof(struct block_q4_1);
    case QT_Q5_0: return sizeof(struct block_q5_0);
    case QT_Q5_1: return sizeof(struct block_q5_1);
    case QT_IQ4_NL: return sizeof(struct block_iq4_nl);
    case QT_MXFP4: return sizeof(struct block_mxfp4);
    case QT_Q2_K: return sizeof(struct block_q2_K);
    case QT_Q3_K: return sizeof(struct block_q3_K);
    case QT_Q4_K: return sizeof(struct block_q4_K);
    case QT_Q5_K: return sizeof(struct block_q5_K);
    case QT_Q6_K: return sizeof(struct block_q6_K);
    default: return sizeof(struct block_iq4_xs);
    }
}

/* Software prefetch of every cache line of the tile PF_BYTES (at least two tiles) ahead. Without it
 * a K-quant super-block's loads jump across its 1-2 KiB tile (one quad position of every
 * chunk per pass), and out of DRAM the AVX2 kernels ran at ~9 GB/s against ~15 GB/s from
 * L3; the prefetches (1 per 64 bytes, ~2% of the instructions) let loads and arithmetic
 * overlap. */
/* Part `part` of nparts of those lines, so that a tile's prefetches can spread over its
 * work: a burst of one prefetch per line of a Q6_K tile (27 lines) is more than the core's
 * L1 miss buffers (Zen 3: 24), and the prefetch instructions then stalled the kernel; out
 * of DRAM, Q6_K ran at ~7 GB/s against Q4_K's ~18 (18 lines a tile). Spread over a
 * super-block's 8 chunks, Q6_K streams ~19 GB/s (docs/cpu-backend.md, "Q6_K prefetch
 * bursts"). */
/* Two levels: each line is asked for twice, first into L2 PF_FAR_BYTES ahead of the tile
 * (prefetcht2), then into L1 `ahead` bytes ahead (two tiles, prefetcht0). On the Xeon dev VM of
 * 2026-12-05 (thirteenth session) the far request alone gained nothing and the near one
 * alone left one core at ~12 GB/s out of DRAM where a plain read loop streams ~17; both
 * together took the AVX-512 Q4_K and Q6_K kernels on a 1.2 GB matrix from 101 / 152 to
 * 88 / 129 ms, the AVX2 Q6_K from 187 to 133 (docs/cpu-backend.md, "Two-level prefetch"). */
#ifndef PF_FAR_BYTES
#define PF_FAR_BYTES 8192
#endif
/* near = 0: the far request alone (most in-order tiles on AMD Zen 4: gemv_pf_mode in
 * cpu_gemv_avx512.c and cpu_gemv_avx2.c). */
static inline __attribute__((always_inline)) void gemv_prefetch_lines(const char *tile, size_t tile_bytes, size_t ahead, int part,
                               int nparts, int near) {
    const int nl = (int)((tile_bytes + 63) / 64), per = (nl + nparts - 1) / nparts;
    _Pragma("GCC unroll 16")
    for (int j = per * part; j < per * part + per; j++)
        if (j < nl) {
            _mm_prefetch(tile + PF_FAR_BYTES + 64 * (size_t)j, _MM_HINT_T2);
            if (near) _mm_prefetch(tile + ahead + 64 * (size_t)j, _MM_HINT_T0);
        }
}
static inline __attribute__((always_inline)) void gemv_prefetch_part(const char *tile, size_t tile_bytes, size_t ahead, int part,
                               int nparts) {
    gemv_prefetch_lines(tile, tile_bytes, ahead, part, nparts, 1);
}
/* All of them at once (the legacy and IQ4_XS tiles). */
static inline __attribute__((always_inline)) void gemv_prefetch(const char *tile, size_t tile_bytes, size_t ahead) {
    gemv_prefetch_part(tile, tile_bytes, ahead, 0, 1);
}
/* The software prefetch of a kernel's weights: none, the far request alone (prefetcht2
 * PF_FAR_BYTES ahead), or both levels. Each level's gemv_pf_mode picks one per type. */
enum gemv_pf { PF_NONE, PF_FAR, PF_TWO };
/* gemv_NAME (both levels, as before), gemv_NAME_far and gemv_NAME_npf from fn(arg, pf, ..): pf
 * is a constant in each, so the prefetch folds away where it is off. */
#define PF_GEMV(name, fn, arg)                                                                     \
    static void gemv_##name(int64_t k, const void *grp, const void *x, size_t xs, float *y,        \
                            size_t ys, int nr, int nc) {                                           \
        fn(arg, PF_TWO, k, grp, x, xs, y, ys, nr, nc);                                             \
    }                                                                                              \
    static void gemv_##name##_far(int64_t k, const void *grp, const void *x, size_t xs, float *y,  \
                                  size_t ys, int nr, int nc) {                                     \
        fn(arg, PF_FAR, k, grp, x, xs, y, ys, nr, nc);                                             \
    }                                                                                              \
    static void gemv_##name##_npf(int64_t k, const void *grp, const void *x, size_t xs, float *y,  \
                                  size_t ys, int nr, int nc) {                                     \
        fn(arg, PF_NONE, k, grp, x, xs, y, ys, nr, nc);                                            \
    }
/* The mode of a type given its AMD default `amd`: SMELT_CPU_GEMV_PF=0|1|2 (none, far, both)
 * sets every kernel, for measuring; else `amd` on AMD cores with AVX-512 (Zen 4 and later: the
 * only AMD cores measured with these modes), both levels elsewhere (the Intel VM's reasons
 * for them, "Two-level prefetch", were not re-measured since; Zen 3's AVX2 prefetch was tuned
 * with them). */
static inline enum gemv_pf gemv_pf_pick(enum gemv_pf amd) {
    const char *env = getenv("SMELT_CPU_GEMV_PF");
    if (env && env[0] >= '0' && env[0] <= '2' && !env[1]) return (enum gemv_pf)(env[0] - '0');
    const struct cpu_features *f = cpu_features_get();
    return strcmp(f->vendor, "AuthenticAMD") == 0 && f->avx512f ? amd : PF_TWO;
}
/* The kernel of a type's mode, fn being a PF_GEMV instance. */
#define GEMV_PF(mode, fn) ((mode) == PF_TWO ? fn : (mode) == PF_FAR ? fn##_far : fn##_npf)

#ifndef PF_BYTES
#define PF_BYTES 2048 /* distance ahead, at least two tiles */
#endif
static inline __attribute__((always_inline)) size_t pf_ahead(size_t tile_bytes) {
    size_t n = (PF_BYTES + tile_bytes - 1) / tile_bytes;
    return (n < 2 ? 2 : n) * tile_bytes;
}

#endif

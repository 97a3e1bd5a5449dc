/* 8 × 8 dword transpose of AVX2 registers (r[i] dword j <-> r[j] dword i): the AVX2
 * repack/unrepack (cpu_gemv_avx2.c) and the chunk-lane reorder of the K-quant prefill
 * (cpu_matmul_avx2.c). Include only from files compiled with -mavx2. */
#ifndef SMELT_BACKEND_CPU_TR8_AVX2_H
#define SMELT_BACKEND_CPU_TR8_AVX2_H
#include <immintrin.h>


static inline __attribute__((always_inline)) void cpu_tr8(__m256i r[8]) {
    __m256i t[8], u[8];
    _Pragma("GCC unroll 8")
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 8")
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
}

#endif

/* 16 x 16 dword transpose of AVX-512 registers (r[i] dword j <-> r[j] dword i): the AVX-512
 * repack/unrepack (cpu_gemv_avx512.c) and the packed legacy rows made straight from a
 * repacked group (cpu_matmul_avx512.c). Include only from files compiled with -mavx512f. */
#ifndef SMELT_BACKEND_CPU_TR16_AVX512_H
#define SMELT_BACKEND_CPU_TR16_AVX512_H
#include <immintrin.h>

static inline __attribute__((always_inline)) void cpu_tr16(__m512i r[16]) {
    __m512i t[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + c], 128-bit block b: rows 4i..4i+3 of column 4b + c; swap blocks */
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 4; c++) {
        __m512i t0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
        __m512i t1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
        __m512i t2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
        __m512i t3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
        t[c] = _mm512_shuffle_i32x4(t0, t2, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(t1, t3, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

#endif

/* Internal contract between the matmul driver (cpu_matmul.c) and its per-ISA kernels
 * (cpu_matmul_scalar.c, cpu_matmul_avx2.c, cpu_matmul_avx512.c) and activation quantizers
 * (cpu_q8.c and the SIMD files).
 *
 * Activation quantization (all integer formats): one scale per X row,
 *   D = amax / 16256,  v[i] = round_half_even(x[i] * 16256 / amax),  |v| <= 16256 = 127·128,
 * so x[i] ≈ D·v[i] to 15 bits of the row's largest magnitude. (Blocks of 8-bit values with
 * a scale per 32 or 256, llama.cpp's Q8_0/Q8_K, flipped ~1.5% of the real models' top-1
 * tokens against float32; one 15-bit row scale changes ~0.1%: docs/forward.md.) v is
 * split into two int8 planes, v = 128·hi + lo with hi = floor((v + 64) / 128) in
 * [-127, 127] and lo in [-64, 63], so 8-bit integer dot products still do the work.
 *
 * Formats. X rows are quantized per call into one of:
 *   CPU_ACT_F32   X as given (f32 rows); used by F32/F16/BF16 weights.
 *   CPU_ACT_Q8_32 partner of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL,
 *   CPU_ACT_Q8_K  partner of the K-quants and IQ4_XS: each X row becomes TWO rows
 *                 ("planes", hi then lo, at q and q + cpu_act_row_bytes) in the classic
 *                 block layout below, with every block scale equal to 128·D (hi) or D (lo).
 *                 A kernel written for 8-bit blocks computes each plane as an ordinary
 *                 activation row; the driver adds the two results.
 * A plane row of k elements is laid out structure-of-arrays, 64-byte aligned:
 *   int8_t  qs[k]                  hi or lo values
 *   float   d[k/GD]                scale per GD elements (128·D or D; 0 for an all-zero row)
 *   int16_t s[k/GS]                sum of qs over each GS elements (for offset/min terms)
 * with (GD, GS) = (32, 32) for Q8_32 and (256, 16) for Q8_K.
 *   CPU_ACT_X2_32 the same values for fused two-plane kernels of the legacy types (one row,
 *                 sections 64-byte aligned, kp = k rounded up to 64):
 *                   int8_t hi[k] @0 | int8_t lo[k] @kp | int32_t neg[k/4] @2kp (minus the
 *                   sum of v over each 4 elements: the VNNI kernels' +128 weight offset) |
 *                   float sv[k/32] @3kp (sum of v per block, for Q4_1/Q5_1 mins) | float D
 *   CPU_ACT_X16   the values as int16 for kernels that multiply 16-bit weights (AVX-512
 *                 K-quant prefill; AVX2 legacy types and K-quant prefill), one row:
 *                 int16_t v[k] @0 | float sv[k/16] @2k (sum of v per 16) | float D
 * Every quantizer (scalar, SIMD) computes the same f32 products and rounding, so all paths
 * dot the same integers.
 *
 * A kernel computes a tile: for r < nr (1..4) and c < nc (>= 1)
 *   y[c*ystride + r] = dot(W row r at w + r*wstride, X row c at x + c*xstride)
 * over k elements (a multiple of the weight block size). Strides are in bytes except
 * ystride (floats). Kernels choose their own register tiling inside that contract.
 */
#ifndef SMELT_BACKEND_CPU_KERNELS_H
#define SMELT_BACKEND_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"
#include "quant/quant.h"

enum cpu_act {
    CPU_ACT_NONE = 0,
    CPU_ACT_F32,
    CPU_ACT_Q8_32,
    CPU_ACT_Q8_K,
    CPU_ACT_X2_32,
    CPU_ACT_X16,
    CPU_ACT_COUNT
};

#define CPU_MR 4 /* max weight rows per kernel call */

typedef void (*cpu_gemm_fn)(int64_t k, const void *w, size_t wstride, const void *x, size_t xstride,
                            float *y, size_t ystride, int nr, int nc);
typedef void (*cpu_quant_fn)(const float *x, void *q, int64_t k);

/* Optional prefill path: pack() unpacks nr weight rows once into a kernel-friendly layout
 * (row r at dst + r*packed_row_bytes(k)), and gemm_packed() is a tile kernel (same contract
 * as gemm) that reads that layout. The driver uses it when X has enough rows to amortize
 * the unpack (CPU_PACK_MIN_N); the unpack then costs once per chunk instead of once per
 * register tile of X rows. */
typedef void (*cpu_pack_fn)(int64_t k, const void *w, size_t wstride, int nr, void *dst);
typedef size_t (*cpu_packed_size_fn)(int64_t k);
#define CPU_PACK_MIN_N 8

struct cpu_kernel {
    enum cpu_act act;
    cpu_gemm_fn gemm;
    cpu_pack_fn pack; /* NULL: no packed path */
    cpu_packed_size_fn packed_row_bytes;
    cpu_gemm_fn gemm_packed;
    enum cpu_act act_packed; /* activation format of gemm_packed (NONE: act) */
};

/* Each ISA file fills the entries it implements (index: enum qtype) and leaves the rest. */
void cpu_kernels_scalar(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_avx2(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_avx512(struct cpu_kernel tab[QT_COUNT]);

/* 16256 = 127·128: the largest |v| of the 15-bit activation values (see above). */
#define CPU_ACT_VMAX 16256

/* Row quantizers, one per activation format and ISA (k a multiple of 256 or 32). The
 * Q8_32/Q8_K ones write both planes: hi at q, lo at q + cpu_act_row_bytes(act, k). */
void cpu_quantize_q8_32_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_q8_K_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_q8_32_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_q8_K_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_q8_32_avx512(const float *x, void *q, int64_t k);
void cpu_quantize_q8_K_avx512(const float *x, void *q, int64_t k);
void cpu_quantize_x2_32_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x16_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x2_32_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_x16_avx2(const float *x, void *q, int64_t k);

/* Rows (planes) per X row of a format. */
static inline int cpu_act_planes(enum cpu_act act) {
    return act == CPU_ACT_Q8_32 || act == CPU_ACT_Q8_K ? 2 : 1;
}

/* Bytes of one quantized activation row (one plane; 64-byte multiple). */
static inline size_t cpu_act_row_bytes(enum cpu_act act, int64_t k) {
    size_t n = (size_t)k;
    switch (act) {
    case CPU_ACT_Q8_32:
        n = n + 4 * (n / 32) + 2 * (n / 32);
        break;
    case CPU_ACT_Q8_K:
        n = n + 4 * (n / 256) + 2 * (n / 16);
        break;
    case CPU_ACT_X2_32:
        n = 3 * ((n + 63) & ~(size_t)63) + n / 8 + 4;
        break;
    case CPU_ACT_X16:
        n = 2 * n + n / 4 + 4;
        break;
    case CPU_ACT_F32:
        n = 4 * n;
        break;
    default:
        return 0;
    }
    return (n + 63) & ~(size_t)63;
}

/* Accessors of a quantized activation row. */
static inline const float *cpu_act_d(const void *x, int64_t k) {
    return (const float *)((const int8_t *)x + k);
}
static inline const int16_t *cpu_act_s32(const void *x, int64_t k) {
    return (const int16_t *)(cpu_act_d(x, k) + k / 32);
}
static inline const int16_t *cpu_act_sK(const void *x, int64_t k) {
    return (const int16_t *)(cpu_act_d(x, k) + k / 256);
}

/* Sections of an X2_32 row. */
static inline size_t cpu_x2_kp(int64_t k) {
    return ((size_t)k + 63) & ~(size_t)63;
}
static inline const int8_t *cpu_x2_hi(const void *x) {
    return (const int8_t *)x;
}
static inline const int8_t *cpu_x2_lo(const void *x, int64_t k) {
    return (const int8_t *)x + cpu_x2_kp(k);
}
static inline const int32_t *cpu_x2_neg(const void *x, int64_t k) {
    return (const int32_t *)((const char *)x + 2 * cpu_x2_kp(k));
}
static inline const float *cpu_x2_sv(const void *x, int64_t k) {
    return (const float *)((const char *)x + 3 * cpu_x2_kp(k));
}
static inline float cpu_x2_D(const void *x, int64_t k) {
    return cpu_x2_sv(x, k)[k / 32];
}
/* Sections of an X16 row. */
static inline const float *cpu_x16_sv(const void *x, int64_t k) {
    return (const float *)((const int16_t *)x + k);
}
static inline float cpu_x16_D(const void *x, int64_t k) {
    return cpu_x16_sv(x, k)[k / 16];
}

/* The non-linear 4-bit codebook of IQ4_NL / IQ4_XS (a format constant). */
static const int8_t cpu_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

/* Q4_K / Q5_K 6-bit scales and mins of sub-block j (< 8), from the 12 packed bytes. */
static inline void cpu_q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q3_K signed 6-bit scales (16 of them, -32..31) from the 12 packed bytes. */
static inline void cpu_q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

#endif

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
 *   CPU_ACT_Q8_32 partner of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/MXFP4,
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
 *   CPU_ACT_X16_32 / CPU_ACT_X16_64   the values as int16 for kernels that multiply 16-bit
 *                 weights (AVX2 legacy and K-quant prefill / AVX-512 legacy and K-quant
 *                 prefill; X16_64's last chunk is 32 elements, in X16_32's order, when
 *                 k % 64 == 32):
 *                 int16_t v[k] @0 | float sv[k/16] @2k (sum of v per 16, natural groups) |
 *                 float D, the values of each chunk of W = 32 / 64 elements reordered so
 *                 that position (W/2)·h + 2λ + e holds element 4λ + 2h + e (h, e < 2): a
 *                 vpmaddwd / vpdpwssd lane λ over the chunk's two vectors sums the 4
 *                 consecutive elements 4λ..4λ+3, the lane structure of the repacked decode
 *                 kernels (cpu_gemv_*.c), which reproduce these kernels' arithmetic.
 *   CPU_ACT_XK    partner of the AVX-512 repacked K-quant decode kernels, one row:
 *                 int8_t hi[k] @0 | int8_t lo[k] @kp | int16_t p2[k/2] @2kp (sum of v over
 *                 each pair of elements, for the -32/-4 offsets of Q6_K/Q3_K) |
 *                 float sv[k/16] @2kp+k (sum of v per 16) | float D (kp as X2_32) |
 *                 int16_t c32[k/4] @2kp+k+k/4+64: per group g of 16 elements, 32 × the sum
 *                 of hi over its "slot" s (the elements 16g + 4m + 2s + e, m < 4, e < 2)
 *                 for s = 0, 1, then the same for lo (the AVX2 Q6_K decode's −32 applied to
 *                 its 16-bit sums: cpu_gemv_avx2.c). Written by the scalar and AVX2
 *                 quantizers only; the AVX-512 kernels do not read it.
 *   CPU_ACT_X16_K partner of the AVX2 K-quant prefill (cpu_matmul_avx2.c): as X16_32 (v as
 *                 int16, sv per 16, D), but each super-block of 256 elements in chunk-lane
 *                 order: position 16j + 2λ + e holds element 32λ + 2j + e (j < 16, λ < 8,
 *                 e < 2), so that a vpmaddwd lane λ summed over the super-block's 16 vectors
 *                 is the dot of chunk λ (elements 32λ..32λ+31); and its sv[16] in the order
 *                 of the groups 0, 2, .., 14, 1, 3, .., 15 (a chunk's two groups are lanes λ
 *                 of the two halves).
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/quant.h"

enum cpu_act {
    CPU_ACT_NONE = 0,
    CPU_ACT_F32,
    CPU_ACT_Q8_32,
    CPU_ACT_Q8_K,
    CPU_ACT_X2_32,
    CPU_ACT_X16_32,
    CPU_ACT_X16_64,
    CPU_ACT_XK,
    CPU_ACT_X16_K,
    CPU_ACT_COUNT
};

#define CPU_MR 4 /* max weight rows per kernel call */

typedef void (*cpu_gemm_fn)(int64_t k, const void *w, size_t wstride, const void *x, size_t xstride,
                            float *y, size_t ystride, int nr, int nc);
typedef void (*cpu_quant_fn)(const float *x, void *q, int64_t k);

/* Optional prefill path: pack() unpacks blocks b0..b1-1 of nr weight rows once into a
 * kernel-friendly layout (row r at dst + r*packed_row_bytes(k), each block at its place in
 * the row; a whole row is b0 = 0, b1 = k / block, and b0 is even), and gemm_packed() is a
 * tile kernel (same contract
 * as gemm) that reads that layout. The driver uses it when X has enough rows to amortize
 * the unpack (CPU_PACK_MIN_N); the unpack then costs once per chunk instead of once per
 * register tile of X rows. */
typedef void (*cpu_pack_fn)(int64_t k, const void *w, size_t wstride, int nr, int64_t b0,
                            int64_t b1, void *dst);
typedef size_t (*cpu_packed_size_fn)(int64_t k);
#define CPU_PACK_MIN_N 8

/* Repacked decode path (cpu_matmul_repack): the weights of a group of G rows, interleaved
 * as described under "Repacked weights" below, dotted against nc X rows (format act_gemv)
 * at once: y[c*ystride + r] for r < nr (the group's valid rows), c < nc. */
typedef void (*cpu_gemv_fn)(int64_t k, const void *grp, const void *x, size_t xstride, float *y,
                            size_t ystride, int nr, int nc);
/* Repacks nr (<= G) rows of the file layout (row r at w + r*ws) into one group at dst, rows
 * nr..G-1 zero; unrepack does the inverse (row r to dst + r*ds) for blocks b0..b1-1 (each
 * block at its place in the rows). */
typedef void (*cpu_rp_fn)(uint32_t type, int64_t k, const void *w, size_t ws, int nr, void *dst);
typedef void (*cpu_unrp_fn)(uint32_t type, const void *grp, int nr, int64_t b0, int64_t b1,
                            void *dst, size_t ds);
/* The packed prefill rows of blocks b0..b1-1 (b0 even) of a group's nr rows, straight from
 * the group: the bytes that unrepack and then pack would write (row r at dst + r * the
 * type's packed row bytes). */
typedef void (*cpu_grp_pack_fn)(int64_t k, const void *grp, int nr, int64_t b0, int64_t b1, void *dst);

struct cpu_kernel {
    enum cpu_act act;
    cpu_gemm_fn gemm; /* NULL with a packed path: the packed path runs at every n */
    cpu_pack_fn pack; /* NULL: no packed path */
    cpu_packed_size_fn packed_row_bytes;
    cpu_gemm_fn gemm_packed;
    enum cpu_act act_packed; /* activation format of gemm_packed (NONE: act) */
    /* repacked decode (gemv NULL: the type is not repacked at this level) */
    int G;
    enum cpu_act act_gemv;
    cpu_gemv_fn gemv;
    int gemv_max_n; /* the most X rows the gemv kernel takes on repacked weights (0: 3) */
    cpu_rp_fn repack;
    cpu_unrp_fn unrepack;
    cpu_grp_pack_fn pack_grp; /* NULL: a prefill on repacked weights unrepacks, then packs */
};

/* Each ISA file fills the entries it implements (index: enum qtype) and leaves the rest. */
void cpu_kernels_scalar(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_avx2(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_avx512(struct cpu_kernel tab[QT_COUNT]);
/* The i-quant, ternary, NVFP4 and Q1_0 kernels (cpu_matmul_iq_*.c), called by the above. */
void cpu_kernels_iq_scalar(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_iq_avx2(struct cpu_kernel tab[QT_COUNT]);
void cpu_kernels_iq_avx512(struct cpu_kernel tab[QT_COUNT]);
/* The kernel table entry of (wtype, isa lowered to the machine's), for tests; NULL for an
 * id out of range. */
#include "backend/cpu/cpu_features.h"
const struct cpu_kernel *cpu_matmul_kernel(uint32_t wtype, enum cpu_isa isa);
/* Adds the repacked decode kernels of the level (gemv, repack, unrepack) to its entries. */
void cpu_gemv_avx2(struct cpu_kernel tab[QT_COUNT]);
void cpu_gemv_avx512(struct cpu_kernel tab[QT_COUNT]);

/* 16256 = 127·128: the largest |v| of the 15-bit activation values (see above). */
#define CPU_ACT_VMAX 16256

/* Row quantizers, one per activation format and ISA (k a multiple of 256 or 32). The
 * Q8_32/Q8_K ones write both planes: hi at q, lo at q + cpu_act_row_bytes(act, k). */
void cpu_quantize_q8_32_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_q8_K_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_q8_32_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_q8_K_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_x2_32_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x16_32_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x2_32_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_x16_32_avx2(const float *x, void *q, int64_t k);

void cpu_quantize_x16_64_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_xk_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x16_64_avx512(const float *x, void *q, int64_t k);
void cpu_quantize_xk_avx2(const float *x, void *q, int64_t k);
void cpu_quantize_xk_avx512(const float *x, void *q, int64_t k);
void cpu_quantize_x16_k_scalar(const float *x, void *q, int64_t k);
void cpu_quantize_x16_k_avx2(const float *x, void *q, int64_t k);

/* ---- Repacked weights (cpu_repack.c) ----
 * A matrix is cut into groups of G rows (the last one padded with zero rows). A group holds
 * its blocks in order; block b is a tile of G·bb bytes (bb = the type's bytes per block):
 * the block's bytes are split into sections of 2- or 4-byte units (1 for MXFP4's
 * exponent), and unit j of row r sits at section start + (j·G + r)·unit, the section
 * starting at G × (the section's offset in the block) (4-byte units: slot cpu_rp_slot(j)
 * in place of j). So the G rows' f16 scales are
 * 2G contiguous bytes, and one 64-byte load in a 4-byte section gives the same 4
 * consecutive bytes of 16 rows: with G = 16 a vpdpbusd lane is a row. The bytes are the
 * file's own; only their order changes, so repacking is exact and reversible. */
struct cpu_rp_sec {
    uint16_t off, len, unit; /* bytes in the block; unit 1, 2 or 4 */
};
#define CPU_RP_MAXSEC 3
struct cpu_rp_layout {
    int n;
    struct cpu_rp_sec sec[CPU_RP_MAXSEC];
};
/* The sections of a type's block; false for types that are not repacked. */
bool cpu_rp_layout(uint32_t type, struct cpu_rp_layout *out);
/* Where unit j of a type's 4-byte section sits among that section's units in a tile of G
 * rows: slot j (the file's order) except in the 16-row tiles of Q4_K, Q5_K and Q6_K, where a
 * unit is one 64-byte line and the AVX-512 kernels' passes over a super-block would
 * otherwise jump across the tile (Q6_K: four lines 512-1,024 bytes apart per pass, each
 * line visited out of order). There the units go in the order the kernel reads them, so a
 * tile is read front to back and the hardware prefetcher streams it from DRAM without
 * software prefetch (docs/cpu-backend.md, "The AVX-512 gemv from DRAM on Zen 4,
 * continued"). Only the order of whole lines changes; the bytes are the file's.
 *   Q4_K (35 units: 3 scales, then qs u = 8p + μ): the scales, then for μ = 0..7 the qs
 *     units 8p + μ, p = 0..3.
 *   Q5_K (43 units: 3 scales, 8 qh, 32 qs as Q4_K): the scales, then for μ = 0..7 qh unit
 *     μ and the qs units 8p + μ.
 *   Q6_K (52 units: 32 ql u = 16h + 8a + μ, 16 qh 8h + μ, 4 scales): the scales, then for
 *     μ = 0..7 ql 0 + μ, qh 0 + μ, ql 16 + μ, qh 8 + μ, ql 8 + μ, ql 24 + μ (lanes μ and
 *     8 + μ, which share their qh units). */
static inline int cpu_rp_slot(uint32_t type, int G, int j) {
    if (G != 16) return j;
    switch (type) {
    case QT_Q4_K:
        return j < 3 ? j : 3 + 4 * ((j - 3) % 8) + (j - 3) / 8;
    case QT_Q5_K:
        if (j < 3) return j;
        if (j < 11) return 3 + 5 * (j - 3);
        return 4 + 5 * ((j - 11) % 8) + (j - 11) / 8;
    case QT_Q6_K:
        if (j >= 48) return j - 48;                                          /* the scales */
        if (j >= 32) return 4 + 6 * ((j - 32) % 8) + 1 + 2 * ((j - 32) / 8); /* qh 8h + μ */
        /* ql 16h + 8a + μ: a = 0 at 2h, a = 1 at 4 + h */
        return 4 + 6 * (j % 8) + ((j / 8) % 2 ? 4 + j / 16 : 2 * (j / 16));
    default:
        return j;
    }
}
/* Generic (any G) repack / unrepack of one group, as cpu_rp_fn / cpu_unrp_fn with G. */
void cpu_rp_pack_any(int G, uint32_t type, int64_t k, const void *w, size_t ws, int nr, void *dst);
void cpu_rp_unpack_any(int G, uint32_t type, int64_t k, const void *grp, int nr, void *dst,
                       size_t ds);
/* One section of 1- or 2-byte units (f16 scales, MXFP4's exponent) of one block between
 * nr rows (section start of row r at row0 + r*ws) and its place in the tile (base), for
 * the SIMD copies, which transpose the 4-byte sections themselves: to_group (rows
 * nr..G-1 zeroed), or back. Inline with a constant unit: plain moves per row. */
static inline void cpu_rp_small(int G, int unit, int len, char *base, char *row0, size_t ws,
                                int nr, bool to_group) {
    for (int j = 0; j < len / unit; j++)
        for (int r = 0; r < G; r++) {
            char *u = base + ((size_t)j * G + r) * unit, *f = row0 + r * ws + j * unit;
            if (!to_group) {
                if (r < nr) memcpy(f, u, unit == 2 ? 2 : 1);
            } else if (r < nr) {
                memcpy(u, f, unit == 2 ? 2 : 1);
            } else {
                memset(u, 0, unit == 2 ? 2 : 1);
            }
        }
}

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
    case CPU_ACT_X16_32:
    case CPU_ACT_X16_64:
    case CPU_ACT_X16_K:
        n = 2 * n + n / 4 + 4;
        break;
    case CPU_ACT_XK:
        n = 2 * ((n + 63) & ~(size_t)63) + n + n / 4 + 64 + n / 2;
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
/* Sections of an XK row (hi and lo as X2_32). */
static inline const int16_t *cpu_xk_p2(const void *x, int64_t k) {
    return (const int16_t *)((const char *)x + 2 * cpu_x2_kp(k));
}
static inline const float *cpu_xk_sv(const void *x, int64_t k) {
    return (const float *)((const char *)x + 2 * cpu_x2_kp(k) + (size_t)k);
}
static inline float cpu_xk_D(const void *x, int64_t k) {
    return cpu_xk_sv(x, k)[k / 16];
}
/* XK's plane slot sums ×32 (AVX2 Q6_K decode), 4 int16 per group of 16 at 2kp + k + k/4 + 64. */
static inline const int16_t *cpu_xk_c32(const void *x, int64_t k) {
    return (const int16_t *)((const char *)x + 2 * cpu_x2_kp(k) + (size_t)k + (size_t)k / 4 + 64);
}
/* Sections of an X16 row. */
static inline const float *cpu_x16_sv(const void *x, int64_t k) {
    return (const float *)((const int16_t *)x + k);
}
static inline float cpu_x16_D(const void *x, int64_t k) {
    return cpu_x16_sv(x, k)[k / 16];
}
/* A 32-element chunk in X16_32's order (position 16h + 2λ + e takes element 4λ + 2h + e):
 * X16_64's odd last chunk, written by its quantizers and by the AVX-512 legacy packing. */
static inline void cpu_x16_order32(const int32_t v[32], int16_t *dst) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 8; l++)
            for (int e = 0; e < 2; e++)
                dst[16 * h + 2 * l + e] = (int16_t)v[4 * l + 2 * h + e];
}

/* The non-linear 4-bit codebook of IQ4_NL / IQ4_XS (a format constant). */
static const int8_t cpu_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

/* MXFP4's E2M1 values doubled (a format constant), and its block scale: E8M0 exponent e
 * to 2^(e-128), bitwise as the reference (quant_lowbit.c): e = 0, 1 are f32 denormals. */
static const int8_t cpu_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static inline float cpu_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* NVFP4's sub-block scale: unsigned E4M3 (bias 7) halved to match the doubled kvalues;
 * bytes 0x00 and 0x7f are 0 and bit 7 is otherwise ignored, as the reference
 * (quant_lowbit.c). Built bitwise: m·2^-10 for e = 0, else (1 + m/8)·2^(e-8). */
static inline float cpu_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    int e = (x >> 3) & 15, m = x & 7;
    if (e == 0) return (float)m * (1.0f / 1024.0f);
    uint32_t bits = (uint32_t)(e + 119) << 23 | (uint32_t)m << 20;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

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

/* The scalar kernels' tile (cpu_matmul_scalar.c, cpu_matmul_iq_scalar.c): gemm_NAME runs
 * dot_NAME(k, weight row, activation row) for each of nr rows and nc activation rows. */
#define CPU_SCALAR_TILE(name)                                                                      \
    static void gemm_##name(int64_t k, const void *w, size_t wstride, const void *x,               \
                            size_t xstride, float *y, size_t ystride, int nr, int nc) {            \
        for (int c = 0; c < nc; c++)                                                               \
            for (int r = 0; r < nr; r++)                                                           \
                y[(size_t)c * ystride + r] =                                                       \
                    dot_##name(k, (const char *)w + r * wstride, (const char *)x + c * xstride);   \
    }

#endif

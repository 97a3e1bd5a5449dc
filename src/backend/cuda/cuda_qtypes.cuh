/* Device layouts of the GGUF types whose mmv kernels live in cuda_mmv_tq.cu (Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, Q5_K), and their dequantization from those layouts
 * (the >8-row GEMM path's F16 tiles, embedding rows). Included by cuda_mmv_tq.cu,
 * cuda_getrows.cu and cuda_convert.cu; everything here is inline or a template, so an
 * including file pays only for what it calls.
 *
 * Split layouts (struct cuda_qweight's q, s, d; every array 16-byte aligned, blocks in row
 * order, "block" = the GGUF block). Bytes per 256 weights on the device vs GGUF:
 *   Q4_0   q: 16 B nibbles per block as in GGUF (byte j: element j low, j+16 high)
 *          s: half d per block                                        144 = 144
 *   Q4_1   q: as Q4_0; s: half2 {d, m} per block                      160 = 160
 *   Q5_0   q: as Q4_0; s: half d; d: u32 qh (bit j = bit 4 of element j)   176 = 176
 *   Q5_1   q: as Q4_0; s: half2 {d, m}; d: u32 qh                     192 = 192
 *   IQ4_NL q: 16 B per block in element order: nibble m of 32-bit word w is the code of
 *          element 8w + m (one word = two __byte_perm selectors of 4 codes)
 *          s: half d per block                                        144 = 144
 *   IQ4_XS q: 16 B per 32-element sub-block, element order as IQ4_NL
 *          s: the 8-byte GGUF header per super-block {d, scales_h, scales_l[4]}  136 = 136
 *   MXFP4  q: as IQ4_NL (codes index kvalues_mxfp4: E2M1 values doubled, -12..12)
 *          s: the E8M0 exponent byte e per block (scale 2^(e-128) undoes the doubling),
 *          each row's bytes padded to a multiple of 4 (tq_mx_s: cuda_mmq copies them in
 *          4-byte words)                                             ~136 = 136
 *   Q5_K   q: 160 B per super-block: the 128 B of nibbles as GGUF/Q4_K, then 8 u32 words,
 *          word c for unit c (= 16 B of nibbles c, pair g = c/2, half hf = c%2): bit i = bit 4
 *          of element 64g + 16hf + i, bit 16 + i = bit 4 of element 64g + 32 + 16hf + i
 *          s: 4 u32 per super-block, word g = {sc_2g, m_2g, sc_2g+1, m_2g+1} (6 bits each)
 *          d: half2 {d, dmin} per super-block                         180 vs 176
 *   Q2_K   q: the 64 B of 2-bit quants as GGUF; unit c4 (0..3) = 16 B at 16*c4: h = c4/2,
 *          c = c4%2, shift s gives elements 128h + 32s + 16c + [0,16) (sub-block 8h + 2s + c)
 *          s: u32 per unit, byte s = GGUF scale byte of sub-block 8h + 2s + c (sc | m << 4)
 *          d: half2 {d, dmin} per super-block                          84 = 84
 *   Q3_K   q: 96 B per super-block: the 64 B of low bits as GGUF (units as Q2_K), then per
 *          unit 8 B of high bits: bit 16s + i = hmask bit of element 128h + 32s + 16c + i
 *          s: u32 per unit, byte s = the signed scale (-32..31) of sub-block 8h + 2s + c
 *          d: half d per super-block                                  114 vs 110
 */
#ifndef SMELT_CUDA_QTYPES_CUH
#define SMELT_CUDA_QTYPES_CUH

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "quant/quant.h"
}

#define TQ_QK 256

/* The types this file lays out. */
static __host__ __device__ __forceinline__ bool tq_type(uint32_t t) {
    return t == QT_Q4_0 || t == QT_Q4_1 || t == QT_Q5_0 || t == QT_Q5_1 || t == QT_IQ4_NL || t == QT_IQ4_XS ||
           t == QT_MXFP4 || t == QT_Q2_K || t == QT_Q3_K || t == QT_Q5_K;
}

/* Bits 0..3 of x moved to bit 0 of bytes 0..3 (the four shifted copies do not overlap). */
static __device__ __forceinline__ uint32_t tq_spread4(uint32_t x) { return ((x & 0xfu) * 0x00204081u) & 0x01010101u; }

static __host__ __device__ constexpr uint32_t tq_pack4(int a, int b, int c, int e) {
    return (uint32_t)(uint8_t)a | (uint32_t)(uint8_t)b << 8 | (uint32_t)(uint8_t)c << 16 | (uint32_t)(uint8_t)e << 24;
}

/* IQ4 codes -> int8 values (kvalues_iq4nl, quant/iq_tables.c): the 4 codes in the low 16 bits of
 * sel (nibble i = code of byte i) become 4 int8 bytes. Entries 0..7 come from one __byte_perm,
 * 8..15 from another; a third picks per byte by the code's top bit. The selectors' bit 3
 * (prmt's sign-replicate mode) is masked off. */
static __device__ __forceinline__ uint32_t tq_iq4(uint32_t sel) {
    constexpr uint32_t t0 = tq_pack4(-127, -104, -83, -65), t1 = tq_pack4(-49, -35, -22, -10);
    constexpr uint32_t t2 = tq_pack4(1, 13, 25, 38), t3 = tq_pack4(53, 69, 89, 113);
    const uint32_t s = sel & 0x7777u;
    const uint32_t lo = __byte_perm(t0, t1, s), hi = __byte_perm(t2, t3, s);
    return __byte_perm(lo, hi, 0x3210u | ((sel >> 1) & 0x4444u));
}

/* MXFP4 codes -> int8 values (kvalues_mxfp4: 0, 1, 2, 3, 4, 6, 8, 12, then the same negated),
 * as tq_iq4 does for IQ4's table. */
static __device__ __forceinline__ uint32_t tq_mx4(uint32_t sel) {
    constexpr uint32_t t0 = tq_pack4(0, 1, 2, 3), t1 = tq_pack4(4, 6, 8, 12);
    constexpr uint32_t t2 = tq_pack4(0, -1, -2, -3), t3 = tq_pack4(-4, -6, -8, -12);
    const uint32_t s = sel & 0x7777u;
    const uint32_t lo = __byte_perm(t0, t1, s), hi = __byte_perm(t2, t3, s);
    return __byte_perm(lo, hi, 0x3210u | ((sel >> 1) & 0x4444u));
}

/* Index of block u of row `row` (upr blocks a row) in MXFP4's padded scale bytes. */
static __host__ __device__ __forceinline__ int64_t tq_mx_s(int64_t row, int64_t upr, int64_t u) {
    return row * ((upr + 3) & ~(int64_t)3) + u;
}

/* MXFP4's E8M0 byte e -> 2^(e-128), to the bit as quant_from_mxfp4 (e = 0, 1: f32 denormals). */
static __device__ __forceinline__ float tq_e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* 32 weights of group j32 (elements 32*j32 ..) of row `row` of a k-wide matrix of type T in
 * the layouts above, as f32. */
template <uint32_t T>
static __device__ __forceinline__ void tq_deq32(const void *q, const void *s, const void *d, int64_t row, int k,
                                                int j32, float *o) {
    const int64_t gi = row * (k / 32) + j32; /* group index over the whole matrix */
    if (T == QT_Q4_0 || T == QT_Q4_1 || T == QT_Q5_0 || T == QT_Q5_1) {
        const uint8_t *qb = (const uint8_t *)q + gi * 16;
        float2 dm;
        if (T == QT_Q4_0 || T == QT_Q5_0) dm = make_float2(__half2float(((const __half *)s)[gi]), 0.0f);
        else dm = __half22float2(((const __half2 *)s)[gi]);
        const uint32_t qh = (T == QT_Q5_0 || T == QT_Q5_1) ? ((const uint32_t *)d)[gi] : 0u;
        const int off = T == QT_Q4_0 ? 8 : T == QT_Q5_0 ? 16 : 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int a = (qb[i] & 15) | (int)((qh >> i) & 1) << 4, b = (qb[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            o[i] = dm.x * (float)(a - off) + dm.y;
            o[i + 16] = dm.x * (float)(b - off) + dm.y;
        }
    } else if (T == QT_IQ4_NL || T == QT_IQ4_XS || T == QT_MXFP4) {
        const uint4 w = ((const uint4 *)q)[gi];
        float dl;
        if (T == QT_IQ4_NL) {
            dl = __half2float(((const __half *)s)[gi]);
        } else if (T == QT_MXFP4) {
            dl = tq_e8m0_half(((const uint8_t *)s)[tq_mx_s(row, k / 32, j32)]);
        } else {
            const uint2 h = ((const uint2 *)s)[gi >> 3];
            const int sub = (int)(gi & 7);
            const int ls = (int)((h.y >> (4 * sub)) & 15) | (int)((h.x >> (16 + 2 * sub)) & 3) << 4;
            dl = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff))) * (float)(ls - 32);
        }
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t sel = ws[j >> 1] >> (16 * (j & 1));
            const uint32_t v = T == QT_MXFP4 ? tq_mx4(sel) : tq_iq4(sel);
#pragma unroll
            for (int b = 0; b < 4; b++) o[4 * j + b] = dl * (float)(int8_t)(v >> (8 * b));
        }
    } else if (T == QT_Q5_K) {
        const int64_t sb = gi >> 3;
        const int j = (int)(gi & 7), g = j >> 1, t = j & 1;
        const uint8_t *qb = (const uint8_t *)q + sb * 160;
        const uint32_t *qh = (const uint32_t *)(qb + 128);
        const uint32_t pk = ((const uint32_t *)s)[sb * 4 + g];
        const float2 dm = __half22float2(((const __half2 *)d)[sb]);
        const float a = dm.x * (float)((pk >> (12 * t)) & 63), b = dm.y * (float)((pk >> (6 + 12 * t)) & 63);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int hb = (int)(qh[2 * g + (l >> 4)] >> (16 * t + (l & 15))) & 1;
            const int v = ((qb[32 * g + l] >> (4 * t)) & 15) | hb << 4;
            o[l] = a * (float)v - b;
        }
    } else if (T == QT_Q2_K || T == QT_Q3_K) {
        const int64_t sb = gi >> 3;
        const int j = (int)(gi & 7), h = j >> 2, sh = j & 3;
        const uint8_t *qb = (const uint8_t *)q + sb * (T == QT_Q2_K ? 64 : 96);
        const uint32_t *sc = (const uint32_t *)s + sb * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int c4 = 2 * h + (l >> 4);
            const int lo = (qb[32 * h + l] >> (2 * sh)) & 3;
            const uint32_t sbyte = (sc[c4] >> (8 * sh)) & 0xff;
            if (T == QT_Q2_K) {
                const float2 dm = __half22float2(((const __half2 *)d)[sb]);
                o[l] = dm.x * (float)(sbyte & 15) * (float)lo - dm.y * (float)(sbyte >> 4);
            } else {
                const uint2 hm = ((const uint2 *)(qb + 64))[c4];
                const int hb = (int)(((sh < 2 ? hm.x : hm.y) >> (16 * (sh & 1) + (l & 15))) & 1);
                const float dd = __half2float(((const __half *)d)[sb]);
                o[l] = dd * (float)(int8_t)sbyte * (float)((lo | hb << 2) - 4);
            }
        }
    }
}

/* tq_deq32 for a type known at run time (tq_type(type) must hold). */
static __device__ __forceinline__ void tq_deq32_rt(uint32_t type, const void *q, const void *s, const void *d,
                                                   int64_t row, int k, int j32, float *o) {
    switch (type) {
    case QT_Q4_0: tq_deq32<QT_Q4_0>(q, s, d, row, k, j32, o); break;
    case QT_Q4_1: tq_deq32<QT_Q4_1>(q, s, d, row, k, j32, o); break;
    case QT_Q5_0: tq_deq32<QT_Q5_0>(q, s, d, row, k, j32, o); break;
    case QT_Q5_1: tq_deq32<QT_Q5_1>(q, s, d, row, k, j32, o); break;
    case QT_IQ4_NL: tq_deq32<QT_IQ4_NL>(q, s, d, row, k, j32, o); break;
    case QT_IQ4_XS: tq_deq32<QT_IQ4_XS>(q, s, d, row, k, j32, o); break;
    case QT_MXFP4: tq_deq32<QT_MXFP4>(q, s, d, row, k, j32, o); break;
    case QT_Q2_K: tq_deq32<QT_Q2_K>(q, s, d, row, k, j32, o); break;
    case QT_Q3_K: tq_deq32<QT_Q3_K>(q, s, d, row, k, j32, o); break;
    case QT_Q5_K: tq_deq32<QT_Q5_K>(q, s, d, row, k, j32, o); break;
    }
}

#endif

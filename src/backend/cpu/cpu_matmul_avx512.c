/* AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels for the file layout (compiled with -mavx512*;
 * called only when cpu_features reports them OS-enabled): the packed prefill path of every
 * integer type, and F32/F16/BF16 (16 lanes, FMA). Decode of the integer types runs on
 * repacked weights (cpu_gemv_avx512.c), whose kernels reproduce these ones' arithmetic
 * per row; a call on the file layout takes the packed path at any n, so a row gets the
 * same bits whichever path computed it.
 *
 *  - legacy 32-blocks (X16_64): the packed row holds v as int16 in X16_64's chunk order,
 *    a block pair per 64-element chunk; per lane of 4 elements two vpdpwssd give the exact
 *    Σ v·x (block b in lanes 0..7, b + 1 in 8..15), then one FMA with the blocks' scales;
 *    mins on lanes 0 and 8 only; an odd last block (a 32-element chunk) in a tail rounded
 *    explicitly. The repacked decode kernels get the same lane integers from X2_32.
 *  - K-quants / IQ4_XS (X16_64): the packed super-block holds the 16-bit products sc·v
 *    in quad-pair order (cpu_kernels.h), one vpdpwssd per 32 elements, one cvt + FMA with
 *    d per super-block, one FMA of dmin·m against the sums of v for the mins.
 *  - every lane reduction goes through hsum16 (a fixed tree).
 *
 * Tiles: R = 4 weight rows × C = 4 activation rows (16 accumulators); tails use R = 1 and
 * C = 1..3. Measured on the 2-core dev VM (Sapphire Rapids flags), GFLOP per CPU-second at
 * n=128: 105-135 for every integer type (packed path), ~80-90 for F16; see
 * docs/cpu-backend.md.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_tr16_avx512.h"

#define INLINE static inline __attribute__((always_inline))
/* Tile loops have constant trip counts (R, C, sub-blocks): unroll them so the accumulators
 * live in registers (GCC -O2 would otherwise keep them on the stack). */
#define UNROLL _Pragma("GCC unroll 8")
#define MAXC 4

INLINE float f16(uint16_t h) {
    return _cvtsh_ss(h);
}

/* Sum of the 16 lanes in a fixed order ((l + l+8) + (l+4 + l+12), then lanes 0+2 and 1+3,
 * then 0+1), independent of the compiler's _mm512_reduce_add_ps: the repacked decode
 * kernels (cpu_gemv_avx512.c) do the same tree vertically to get the same bits. */
INLINE float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}


/* Walks an nr × nc request in R×C tiles: R in {4, 1}, C = 4 then the 1..3 tail. */
#define TILE_DRIVER(name, TILE)                                                                    \
    static void gemm_##name(int64_t k, const void *w, size_t ws, const void *x, size_t xs,         \
                            float *y, size_t ys, int nr, int nc) {                                 \
        const char *wp = w, *xp = x;                                                               \
        for (int r = 0; r < nr; r += (nr == 4 ? 4 : 1)) {                                          \
            int c = 0;                                                                             \
            for (; c + 4 <= nc; c += 4) {                                                          \
                if (nr == 4)                                                                       \
                    TILE(4, 4, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                        \
                else                                                                               \
                    TILE(1, 4, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
            }                                                                                      \
            switch (nc - c) {                                                                      \
            case 3:                                                                                \
                if (nr == 4)                                                                       \
                    TILE(4, 3, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                        \
                else                                                                               \
                    TILE(1, 3, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
                break;                                                                             \
            case 2:                                                                                \
                if (nr == 4)                                                                       \
                    TILE(4, 2, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                        \
                else                                                                               \
                    TILE(1, 2, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
                break;                                                                             \
            case 1:                                                                                \
                if (nr == 4)                                                                       \
                    TILE(4, 1, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                        \
                else                                                                               \
                    TILE(1, 1, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
                break;                                                                             \
            default:                                                                               \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }

/* ---- plain types ---- */

enum plain { P_F32, P_F16, P_BF16 };

INLINE __m512 load16(enum plain t, const void *p, int64_t i) {
    switch (t) {
    case P_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    case P_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))),
            16));
    default:
        return _mm512_loadu_ps((const float *)p + i);
    }
}

INLINE __m512 load16_mask(enum plain t, const void *p, int64_t i, __mmask16 m) {
    switch (t) {
    case P_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case P_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    }
}

INLINE void plain_tile(enum plain t, int R, int C, int64_t k, const char *w, size_t ws,
                       const char *x, size_t xs, float *y, size_t ys) {
    __m512 acc[4][MAXC];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        acc[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 wv[4];
        UNROLL
        for (int r = 0; r < R; r++)
            wv[r] = load16(t, w + r * ws, i);
        UNROLL
        for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_loadu_ps((const float *)(x + c * xs) + i);
            UNROLL
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m512 wv[4];
        UNROLL
        for (int r = 0; r < R; r++)
            wv[r] = load16_mask(t, w + r * ws, i, m);
        UNROLL
        for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, (const float *)(x + c * xs) + i);
            UNROLL
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        y[c * ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#define F32_TILE(R, C, ...) plain_tile(P_F32, R, C, __VA_ARGS__)
#define F16_TILE(R, C, ...) plain_tile(P_F16, R, C, __VA_ARGS__)
#define BF16_TILE(R, C, ...) plain_tile(P_BF16, R, C, __VA_ARGS__)
TILE_DRIVER(f32, F32_TILE)
TILE_DRIVER(f16, F16_TILE)
TILE_DRIVER(bf16, BF16_TILE)

/* ---- legacy 32-blocks × Q8_32, two blocks per zmm ---- */

INLINE int legacy_has_min(uint32_t t) {
    return t == QT_Q4_1 || t == QT_Q5_1;
}
INLINE size_t legacy_size(uint32_t t) {
    switch (t) {
    case QT_Q4_0:
        return sizeof(struct block_q4_0);
    case QT_Q4_1:
        return sizeof(struct block_q4_1);
    case QT_Q5_0:
        return sizeof(struct block_q5_0);
    case QT_Q5_1:
        return sizeof(struct block_q5_1);
    case QT_IQ4_NL:
        return sizeof(struct block_iq4_nl);
    case QT_MXFP4:
        return sizeof(struct block_mxfp4);
    default:
        return sizeof(struct block_q8_0);
    }
}

/* 16 packed nibble bytes of two blocks → 64 bytes [b0 lo, b0 hi, b1 lo, b1 hi]. */
INLINE __m512i nibbles_2x(const uint8_t *qs0, const uint8_t *qs1) {
    __m256i t = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)qs1),
                                 _mm_loadu_si128((const __m128i *)qs0));
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), z);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

/* The quants of blocks i and i+1 as bytes (unsigned q, or v + 128 for the signed types
 * Q8_0, IQ4_NL and MXFP4). */
INLINE __m512i legacy_unpack2(uint32_t t, const char *row, int64_t i) {
    const size_t bs = legacy_size(t);
    const char *p0 = row + i * bs, *p1 = p0 + bs;
    switch (t) {
    case QT_Q4_0:
        return nibbles_2x((const uint8_t *)p0 + 2, (const uint8_t *)p1 + 2);
    case QT_IQ4_NL:
    case QT_MXFP4: { /* codebook + 128 as unsigned bytes */
        const int o = t == QT_MXFP4 ? 1 : 2;
        const __m512i tab = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(
                (const __m128i *)(t == QT_MXFP4 ? cpu_kvalues_mxfp4 : cpu_kvalues_iq4nl))),
            _mm512_set1_epi8((char)0x80));
        return _mm512_shuffle_epi8(tab, nibbles_2x((const uint8_t *)p0 + o, (const uint8_t *)p1 + o));
    }
    case QT_Q4_1:
        return nibbles_2x((const uint8_t *)p0 + 4, (const uint8_t *)p1 + 4);
    case QT_Q5_0:
    case QT_Q5_1: {
        const int o = t == QT_Q5_0 ? 2 : 4;
        uint32_t qh0, qh1;
        memcpy(&qh0, p0 + o, 4);
        memcpy(&qh1, p1 + o, 4);
        __m512i q = nibbles_2x((const uint8_t *)p0 + o + 4, (const uint8_t *)p1 + o + 4);
        __mmask64 hb = (__mmask64)qh0 | (__mmask64)qh1 << 32;
        return _mm512_or_si512(q, _mm512_maskz_mov_epi8(hb, _mm512_set1_epi8(0x10)));
    }
    default: { /* Q8_0: w + 128 */
        __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))),
            _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1);
        return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
    }
    }
}

/* One block (the odd tail): the same with 256-bit vectors. */
INLINE __m256i legacy_unpack1(uint32_t t, const char *row, int64_t i) {
    const char *p0 = row + i * legacy_size(t);
    if (t == QT_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p0 + 2)),
                                _mm256_set1_epi8((char)0x80));
    const int o = t == QT_MXFP4 ? 1 : t == QT_Q4_1 || t == QT_Q5_1 ? 4 : 2;
    int qso = (t == QT_Q5_0 || t == QT_Q5_1) ? o + 4 : o;
    __m128i tq = _mm_loadu_si128((const __m128i *)(p0 + qso));
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(tq, 4), tq), _mm256_set1_epi8(15));
    if (t == QT_IQ4_NL || t == QT_MXFP4) {
        const __m256i tab = _mm256_xor_si256(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(
                (const __m128i *)(t == QT_MXFP4 ? cpu_kvalues_mxfp4 : cpu_kvalues_iq4nl))),
            _mm256_set1_epi8((char)0x80));
        q = _mm256_shuffle_epi8(tab, q);
    }
    if (t == QT_Q5_0 || t == QT_Q5_1) {
        uint32_t qh;
        memcpy(&qh, p0 + o, 4);
        q = _mm256_or_si256(q, _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10)));
    }
    return q;
}

/* ---- legacy types, packed prefill path: 16-bit weights × X16_64 ----
 * A packed row holds each block's signed values v (q - 8 for Q4_0, q - 16 for Q5_0, w for
 * Q8_0, the codebook value for IQ4_NL / MXFP4, q for Q4_1 / Q5_1) as int16 in X16_64's
 * chunk order (cpu_kernels.h: a block pair is a 64-element chunk; an odd last block is a
 * 32-element chunk in X16_32's order, as the quantizer writes it), then d per block as f32,
 * then (Q4_1/Q5_1) m per block:
 *   int16 v[k] | float d[k/32] | float m[k/32]          (64-byte multiple)
 * so the tile loop has no unpacking left: two loads per row and block pair. */

INLINE size_t packed_legacy_bytes(uint32_t t, int64_t k) {
    size_t n = 2 * (size_t)k + 4 * (size_t)(k / 32) * (legacy_has_min(t) ? 2 : 1);
    return (n + 63) & ~(size_t)63;
}

/* What to subtract from legacy_unpack's bytes to get v. */
INLINE short legacy_offset(uint32_t t) {
    switch (t) {
    case QT_Q4_0:
        return 8;
    case QT_Q5_0:
        return 16;
    case QT_Q4_1:
    case QT_Q5_1:
        return 0;
    default:
        return 128; /* Q8_0, IQ4_NL, MXFP4: v + 128 */
    }
}

INLINE void pack_legacy(uint32_t t, int64_t k, const void *w, size_t ws, int nr, int64_t b0,
                        int64_t b1, void *dst) {
    const size_t prow = packed_legacy_bytes(t, k), bs = legacy_size(t);
    const int64_t nb = k / 32;
    const __m512i off = _mm512_set1_epi16(legacy_offset(t));
    /* X16_64's order: position 2s + e (s = 2λ..) of output h takes element 4λ + 2h + e */
    const __m512i i0 = _mm512_set_epi16(61, 60, 57, 56, 53, 52, 49, 48, 45, 44, 41, 40, 37, 36, 33,
                                        32, 29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(2));
    for (int r = 0; r < nr; r++) {
        const char *row = (const char *)w + r * ws;
        int16_t *q = (int16_t *)((char *)dst + r * prow);
        float *d = (float *)(q + k), *m = d + nb;
        int64_t i = b0;
        for (; i + 2 <= b1; i += 2) {
            const __m512i u = legacy_unpack2(t, row, i);
            const __m512i a = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(u)), off),
                          b = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(u, 1)), off);
            _mm512_store_si512((void *)(q + 32 * i), _mm512_permutex2var_epi16(a, i0, b));
            _mm512_store_si512((void *)(q + 32 * i + 32), _mm512_permutex2var_epi16(a, i1, b));
        }
        if (i < b1) { /* the odd last block: a chunk of 32 in X16_32's order */
            uint8_t u[32];
            int32_t v[32];
            _mm256_storeu_si256((__m256i *)u, legacy_unpack1(t, row, i));
            for (int e = 0; e < 32; e++)
                v[e] = u[e] - legacy_offset(t);
            cpu_x16_order32(v, q + 32 * i);
        }
        for (int64_t b = b0; b < b1; b++) {
            uint16_t h;
            memcpy(&h, row + b * bs, 2);
            d[b] = t == QT_MXFP4 ? cpu_e8m0_half((uint8_t)row[b * bs]) : f16(h);
            if (legacy_has_min(t)) {
                memcpy(&h, row + b * bs + 2, 2);
                m[b] = f16(h);
            }
        }
    }
}

/* Q8_0's packed rows straight from a repacked group (cpu_gemv_avx512.c's layout, 16 rows:
 * per block the rows' f16 d, 32 bytes, then quant unit u (4 bytes) of row r at 32 + 64 u + 4 r):
 * a block pair's 16 units of the 16 rows, transposed, give each row its 64 quant bytes, which
 * go to X16_64's order as pack_legacy puts them; an odd last block as pack_legacy's tail. The
 * same bytes as unrepack and pack_legacy, without the file-layout round trip (a prefill on
 * repacked Q8_0 weights spent ~2.3% of its time in the unrepack, 2026-12-06). */
static void pack_grp_q8_0(int64_t k, const void *grp, int nr, int64_t b0, int64_t b1, void *dst) {
    const size_t prow = packed_legacy_bytes(QT_Q8_0, k), tile = 16 * sizeof(struct block_q8_0);
    const char *g = grp;
    const __m512i i0 = _mm512_set_epi16(61, 60, 57, 56, 53, 52, 49, 48, 45, 44, 41, 40, 37, 36, 33,
                                        32, 29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(2));
    int64_t i = b0;
    for (; i + 2 <= b1; i += 2) {
        __m512i v[16];
        UNROLL
        for (int u = 0; u < 8; u++) {
            v[u] = _mm512_loadu_si512((const void *)(g + i * tile + 32 + 64 * u));
            v[8 + u] = _mm512_loadu_si512((const void *)(g + (i + 1) * tile + 32 + 64 * u));
        }
        cpu_tr16(v); /* v[r]: row r's quants of block i, then of block i + 1 */
        UNROLL
        for (int r = 0; r < 16; r++) {
            if (r >= nr) break;
            int16_t *q = (int16_t *)((char *)dst + r * prow);
            const __m512i a = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(v[r])),
                          b = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(v[r], 1));
            _mm512_store_si512((void *)(q + 32 * i), _mm512_permutex2var_epi16(a, i0, b));
            _mm512_store_si512((void *)(q + 32 * i + 32), _mm512_permutex2var_epi16(a, i1, b));
        }
    }
    if (i < b1) /* the odd last block: a chunk of 32 in X16_32's order */
        for (int r = 0; r < nr; r++) {
            int8_t u[32];
            int32_t v[32];
            for (int w = 0; w < 8; w++)
                memcpy(u + 4 * w, g + i * tile + 32 + 64 * w + 4 * r, 4);
            for (int e = 0; e < 32; e++)
                v[e] = u[e];
            cpu_x16_order32(v, (int16_t *)((char *)dst + r * prow) + 32 * i);
        }
    for (int64_t b = b0; b < b1; b++) {
        _Alignas(64) float d[16];
        _mm512_store_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + b * tile))));
        for (int r = 0; r < nr; r++)
            ((float *)((int16_t *)((char *)dst + r * prow) + k))[b] = d[r];
    }
}

/* Legacy types against X16_64 (cpu_kernels.h), packed rows of int16 v: per block pair, two
 * vpdpwssd leave in lane λ the exact dot of elements 4λ..4λ+3 (block b in lanes 0..7, b + 1
 * in 8..15; |lane| <= 4·128·16256 < 2^24, so the cvt is exact too). Then one FMA with the
 * block scales [d_b ×8, d_b+1 ×8] per two blocks, the row scale D at the end:
 *     y = D · (sum over blocks of d_b · dot_b [+ m_b · sum_b x16]).
 * The lanes' integers, and so every bit, are those of the two-plane VNNI tile this replaced
 * (2026-12-06: 5 vector operations a block pair and (row, column), the +128 weight offset's
 * seed load, a shift; now 4) and of the repacked decode kernels (cpu_gemv_avx512.c). */
INLINE void x16_legacy_tile(int has_min, int R, int C, int64_t k, const char *w, size_t ws,
                            const char *x, size_t xs, float *y, size_t ys) {
    __m512 acc[4][MAXC];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        acc[r][c] = _mm512_setzero_ps();
    const int16_t *xv[MAXC];
    const float *xsv[MAXC];
    UNROLL
    for (int c = 0; c < C; c++) {
        xv[c] = (const int16_t *)(x + c * xs);
        xsv[c] = cpu_x16_sv(x + c * xs, k);
    }
    const int64_t nb = k / 32;
    const float *wd[4], *wm[4];
    UNROLL
    for (int r = 0; r < R; r++) {
        wd[r] = (const float *)(w + r * ws + 2 * k);
        wm[r] = wd[r] + nb;
    }
    const __m512i idx_d = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512 sv2[MAXC];
        if (has_min) /* the blocks' sums of v (exact: integers < 2^24) on lanes 0 and 8 */
            UNROLL
        for (int c = 0; c < C; c++) {
            const __m128 s4 = _mm_loadu_ps(xsv[c] + 2 * i);
            const __m128 s2 = _mm_add_ps(s4, _mm_movehdup_ps(s4)); /* lanes 0, 2 */
            sv2[c] = _mm512_maskz_expand_ps(0x0101, _mm512_castps128_ps512(_mm_shuffle_ps(s2, s2, 0x08)));
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            const int16_t *wq = (const int16_t *)(w + r * ws) + 32 * i;
            const __m512i wa = _mm512_load_si512((const void *)wq), wb = _mm512_load_si512((const void *)(wq + 32));
            __m512 m2 = _mm512_setzero_ps();
            __m512 d2 = _mm512_permutexvar_ps(
                idx_d, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(wd[r] + i)))));
            if (has_min)
                m2 = _mm512_permutexvar_ps(
                    idx_d,
                    _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(wm[r] + i)))));
            UNROLL
            for (int c = 0; c < C; c++) {
                __m512i p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wa,
                                                _mm512_load_si512((const void *)(xv[c] + 32 * i)));
                p = _mm512_dpwssd_epi32(p, wb, _mm512_load_si512((const void *)(xv[c] + 32 * i + 32)));
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d2, acc[r][c]);
                /* mins on the two blocks' first lanes only (the decode kernels do the same) */
                if (has_min) acc[r][c] = _mm512_mask3_fmadd_ps(m2, sv2[c], acc[r][c], 0x0101);
            }
        }
    }
    float tail[4][MAXC] = {{0}};
    if (i < nb) { /* the odd last block, a 32-element chunk: lane λ of the 8 sums 4λ..4λ+3 */
        UNROLL
        for (int r = 0; r < R; r++) {
            const float d = wd[r][i], m = has_min ? wm[r][i] : 0.0f;
            const int16_t *wq = (const int16_t *)(w + r * ws) + 32 * i;
            const __m256i wa = _mm256_load_si256((const __m256i *)wq), wb = _mm256_load_si256((const __m256i *)(wq + 16));
            UNROLL
            for (int c = 0; c < C; c++) {
                __m256i p = _mm256_dpwssd_epi32(_mm256_setzero_si256(), wa,
                                                _mm256_load_si256((const __m256i *)(xv[c] + 32 * i)));
                p = _mm256_dpwssd_epi32(p, wb, _mm256_load_si256((const __m256i *)(xv[c] + 32 * i + 16)));
                __m128i s4 =
                    _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                /* d·isum (+ m·sv), rounded as the decode kernels round it */
                __m128 tv = _mm_mul_ss(_mm_set_ss(d), _mm_cvtepi32_ps(s4));
                if (has_min) tv = _mm_fmadd_ss(_mm_set_ss(m), _mm_set_ss(xsv[c][2 * i] + xsv[c][2 * i + 1]), tv);
                tail[r][c] = _mm_cvtss_f32(tv);
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        y[c * ys + r] = cpu_x16_D(x + c * xs, k) * (hsum16(acc[r][c]) + tail[r][c]);
}
/* The packed layout is the same int16 v for every type: one kernel (with or without mins). */
#define PACKED_TILE(R, C, ...) x16_legacy_tile(0, R, C, __VA_ARGS__)
#define PACKED_MIN_TILE(R, C, ...) x16_legacy_tile(1, R, C, __VA_ARGS__)
TILE_DRIVER(packed, PACKED_TILE)
TILE_DRIVER(packed_min, PACKED_MIN_TILE)

#define PACK_FNS(name, T)                                                                          \
    static void pack_##name(int64_t k, const void *w, size_t ws, int nr, int64_t b0, int64_t b1,  \
                            void *dst) {                                                           \
        pack_legacy(T, k, w, ws, nr, b0, b1, dst);                                                 \
    }                                                                                              \
    static size_t packed_bytes_##name(int64_t k) {                                                 \
        return packed_legacy_bytes(T, k);                                                          \
    }
PACK_FNS(q8_0, QT_Q8_0)
PACK_FNS(q4_0, QT_Q4_0)
PACK_FNS(q4_1, QT_Q4_1)
PACK_FNS(q5_0, QT_Q5_0)
PACK_FNS(q5_1, QT_Q5_1)
PACK_FNS(iq4_nl, QT_IQ4_NL)
PACK_FNS(mxfp4, QT_MXFP4)

/* ---- K-quants and IQ4_XS × Q8_K: a super-block is 4 zmm of 64 elements ---- */

struct ksb {
    __m512i q[4];     /* unsigned quants (IQ4_XS: |v|) of elements 64z .. 64z+63 */
    __m256i scc;      /* the same, compact: 8 (sub-blocks of 32) or 16 (of 16) i16 scales */
    __mmask64 neg[4]; /* IQ4_XS: lanes whose value is negative */
    __m128i mins;     /* Q4_K/Q5_K: 8 mins as i16 (dot with bsums of 32) */
    __m256i mins16;   /* Q2_K: 16 mins as i16 (dot with bsums of 16) */
    __m256i corr16;   /* Q3_K/Q6_K: 16 scales as i16 (times -4 / -32 and bsums) */
    float d, dmin;
};

INLINE void q4k_scales_mins(const uint8_t *s12, __m128i *sc, __m128i *mn) {
    uint32_t a[3];
    memcpy(a, s12, 12);
    uint32_t sc_lo = a[0] & 0x3f3f3f3f, m_lo = a[1] & 0x3f3f3f3f;
    uint32_t sc_hi = (a[2] & 0x0f0f0f0f) | ((a[0] >> 2) & 0x30303030);
    uint32_t m_hi = ((a[2] >> 4) & 0x0f0f0f0f) | ((a[1] >> 2) & 0x30303030);
    *sc = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo));
    *mn = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo));
}

/* Q3_K's 16 signed 6-bit scales (cpu_q3k_scales) as i16, vectorized. */
INLINE __m256i q3k_scales16(const uint8_t *s12) {
    uint64_t lo8;
    uint32_t hi4;
    memcpy(&lo8, s12, 8);
    memcpy(&hi4, s12 + 8, 4);
    __m128i v = _mm_cvtsi64_si128((long long)lo8);
    __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(v, _mm_set1_epi8(15)),
                                    _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    __m128i hi = _mm_srlv_epi32(_mm_set1_epi32((int)hi4), _mm_setr_epi32(0, 2, 4, 6));
    hi = _mm_slli_epi16(_mm_and_si128(hi, _mm_set1_epi8(3)), 4);
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32)));
}

INLINE void kq_unpack(uint32_t t, const char *row, int64_t i, struct ksb *u) {
    const __m512i m4 = _mm512_set1_epi8(15);
    /* fields a type does not use (dead stores once inlined into a tile) */
    u->dmin = 0.0f;
    u->mins = _mm_setzero_si128();
    u->mins16 = u->corr16 = _mm256_setzero_si256();
    for (int z = 0; z < 4; z++)
        u->neg[z] = 0;
    switch (t) {
    case QT_Q4_K:
    case QT_Q5_K: {
        const uint8_t *qs, *scales, *qh = NULL;
        uint16_t hd, hm;
        if (t == QT_Q4_K) {
            const struct block_q4_K *b = (const struct block_q4_K *)row + i;
            qs = b->qs;
            scales = b->scales;
            hd = b->d;
            hm = b->dmin;
        } else {
            const struct block_q5_K *b = (const struct block_q5_K *)row + i;
            qs = b->qs;
            scales = b->scales;
            qh = b->qh;
            hd = b->d;
            hm = b->dmin;
        }
        u->d = f16(hd);
        u->dmin = f16(hm);
        __m128i sc8;
        q4k_scales_mins(scales, &sc8, &u->mins);
        u->scc = _mm256_zextsi128_si256(sc8);
        __m512i qhz = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh))
                         : _mm512_setzero_si512();
        UNROLL
        for (int h = 0; h < 2; h++) {
            /* raw bytes 64h..64h+63: low nibbles = sub-blocks 4h, 4h+2; high = 4h+1, 4h+3 */
            __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * h));
            __m512i lo = _mm512_and_si512(raw, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
            u->q[2 * h] =
                _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), hi);
            u->q[2 * h + 1] =
                _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15), hi);
        }
        UNROLL
        for (int z = 0; z < 4; z++) {
            if (qh) {
                __m512i bit = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (2 * z)))),
                    _mm256_set1_epi8((char)(1 << (2 * z + 1))), 1);
                __mmask64 m = _mm512_test_epi8_mask(qhz, bit);
                u->q[z] =
                    _mm512_or_si512(u->q[z], _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10)));
            }
        }
        break;
    }
    case QT_Q6_K: {
        const struct block_q6_K *b = (const struct block_q6_K *)row + i;
        u->d = f16(b->d);
        u->corr16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        u->scc = u->corr16;
        const __m512i m30 = _mm512_set1_epi8(0x30);
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
            __m512i qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
            /* elements 128h + 0..63: low nibbles, high bits (qh >> 0 | qh >> 2) */
            __m512i h01 =
                _mm512_and_si512(_mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(4),
                                                                          _mm256_set1_epi16(2), 1)),
                                 m30);
            __m512i h23 =
                _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(0),
                                                                          _mm256_set1_epi16(2), 1)),
                                 m30);
            u->q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), h01);
            u->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h23);
        }
        break;
    }
    case QT_Q2_K:
    case QT_Q3_K: {
        const uint8_t *qs, *hm = NULL;
        __m256i sc16;
        if (t == QT_Q2_K) {
            const struct block_q2_K *b = (const struct block_q2_K *)row + i;
            __m128i raw = _mm_loadu_si128((const __m128i *)b->scales);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(15)));
            u->mins16 =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
            qs = b->qs;
            u->d = f16(b->d);
            u->dmin = f16(b->dmin);
        } else {
            const struct block_q3_K *b = (const struct block_q3_K *)row + i;
            sc16 = q3k_scales16(b->scales);
            u->corr16 = sc16;
            qs = b->qs;
            hm = b->hmask;
            u->d = f16(b->d);
        }
        u->scc = sc16;
        const __m512i m3 = _mm512_set1_epi8(3);
        __m512i hmz = hm ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)hm))
                         : _mm512_setzero_si512();
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i raw =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
            UNROLL
            for (int sp = 0; sp < 2; sp++) { /* s = 2sp, 2sp+1 */
                int z = 2 * h + sp, s = 2 * sp;
                __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * s)),
                                                _mm256_set1_epi16((short)(2 * s + 2)), 1);
                __m512i q = _mm512_and_si512(_mm512_srlv_epi16(raw, sh), m3);
                if (hm) {
                    __m512i bit = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (4 * h + s)))),
                        _mm256_set1_epi8((char)(1 << (4 * h + s + 1))), 1);
                    q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(hmz, bit),
                                                                 _mm512_set1_epi8(4)));
                }
                u->q[z] = q;
            }
        }
        break;
    }
    default: { /* IQ4_XS */
        const struct block_iq4_xs *b = (const struct block_iq4_xs *)row + i;
        u->d = f16(b->d);
        /* ls[j] = nibble j of scales_l | 2 bits j of scales_h << 4, minus 32, as i16 */
        uint32_t sl;
        memcpy(&sl, b->scales_l, 4);
        __m128i slv = _mm_cvtsi32_si128((int)sl);
        __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(slv, _mm_set1_epi8(15)),
                                        _mm_and_si128(_mm_srli_epi16(slv, 4), _mm_set1_epi8(15)));
        __m128i hi = _mm_srlv_epi16(_mm_set1_epi16((short)b->scales_h),
                                    _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14));
        hi = _mm_slli_epi16(_mm_and_si128(hi, _mm_set1_epi16(3)), 4);
        __m128i ls = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(nib), hi), _mm_set1_epi16(32));
        u->scc = _mm256_zextsi128_si256(ls);
        const __m512i tab =
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl));
        UNROLL
        for (int z = 0; z < 4; z++) {
            __m256i tq = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * z));
            __m512i nz =
                _mm512_inserti64x4(_mm512_castsi256_si512(tq), _mm256_srli_epi16(tq, 4), 1);
            nz = _mm512_and_si512(
                _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), nz), m4);
            __m512i v = _mm512_shuffle_epi8(tab, nz);
            u->neg[z] = _mm512_movepi8_mask(v);
            u->q[z] = _mm512_abs_epi8(v);
        }
        break;
    }
    }
}

/* ---- K-quants and IQ4_XS, packed prefill path: 16-bit weights × X16 ----
 * Packing rewrites a super-block as its signed values times their sub-block scales,
 * w16[n] = sc[g]·v[n] (Q4_K/Q5_K/Q2_K: v = q; Q6_K: q - 32; Q3_K: q - 4; IQ4_XS: the
 * codebook value; |w16| <= 128·32 = 4096), so that
 *     sum w·x = D·(d · sum_n w16[n]·x16[n] - sum_g mf[g]·sv[g]),  mf[g] = dmin·m[g]
 * and one vpdpwssd per 32 elements does the whole dot product (per i32 lane 16 products
 * of <= 4096·16256: < 2^30, no overflow). Layout of a packed super-block (K16_PACKED):
 *   int16 w16[256] @0 | float mf[16] @512 (zero for types without mins) | float d @576 */
#define K16_PACKED 640

INLINE void k16_pack_block(uint32_t t, const char *row, int64_t i, char *p) {
    struct ksb u;
    kq_unpack(t, row, i, &u);
    const __m512i scw = _mm512_castsi256_si512(u.scc);
    const int sub16 = t == QT_Q6_K || t == QT_Q2_K || t == QT_Q3_K;
    /* X16Q order (cpu_kernels.h): of each 64-element chunk, zmm h holds the pairs
     * 4λ + 2h, 4λ + 2h + 1 (λ < 16) of the chunk's natural w16 a ‖ b */
    const __m512i perm0 = _mm512_set_epi16(61, 60, 57, 56, 53, 52, 49, 48, 45, 44, 41, 40, 37, 36,
                                           33, 32, 29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5,
                                           4, 1, 0);
    const __m512i perm1 = _mm512_add_epi16(perm0, _mm512_set1_epi16(2));
    UNROLL
    for (int z = 0; z < 4; z++) {
        __m512i nat[2];
        UNROLL
        for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_cvtepu8_epi16(h ? _mm512_extracti64x4_epi64(u.q[z], 1)
                                           : _mm512_castsi512_si256(u.q[z]));
        if (t == QT_Q6_K) q = _mm512_sub_epi16(q, _mm512_set1_epi16(32));
        if (t == QT_Q3_K) q = _mm512_sub_epi16(q, _mm512_set1_epi16(4));
        if (t == QT_IQ4_XS)
            q = _mm512_mask_sub_epi16(q, (__mmask32)(u.neg[z] >> (32 * h)), _mm512_setzero_si512(), q);
        /* scale index of each of the 32 elements */
        __m512i idx = sub16 ? _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * z + 2 * h)),
                                                 _mm256_set1_epi16((short)(4 * z + 2 * h + 1)), 1)
                            : _mm512_set1_epi16((short)(2 * z + h));
            nat[h] = _mm512_mullo_epi16(q, _mm512_permutexvar_epi16(idx, scw));
        }
        _mm512_store_si512((void *)(p + 128 * z), _mm512_permutex2var_epi16(nat[0], perm0, nat[1]));
        _mm512_store_si512((void *)(p + 128 * z + 64),
                           _mm512_permutex2var_epi16(nat[0], perm1, nat[1]));
    }
    /* mf[g] = dmin · m[g] (g / 2 for the 8 mins of sub-blocks of 32): the same single
     * products as a scalar loop, which took about half of the pack's time (2026-12-06) */
    __m256i m16 = _mm256_setzero_si256();
    if (t == QT_Q4_K || t == QT_Q5_K)
        m16 = _mm256_permutexvar_epi16(
            _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
            _mm256_castsi128_si256(u.mins));
    else if (t == QT_Q2_K)
        m16 = u.mins16;
    _mm512_store_ps((void *)(p + 512),
                    _mm512_mul_ps(_mm512_set1_ps(u.dmin), _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(m16))));
    memcpy(p + 576, &u.d, 4);
}

INLINE size_t k16_packed_bytes(int64_t k) {
    return (size_t)(k / 256) * K16_PACKED;
}

INLINE void k16_pack(uint32_t t, int64_t k, const void *w, size_t ws, int nr, int64_t b0,
                     int64_t b1, void *dst) {
    const size_t prow = k16_packed_bytes(k);
    for (int r = 0; r < nr; r++)
        for (int64_t i = b0; i < b1; i++)
            k16_pack_block(t, (const char *)w + r * ws, i, (char *)dst + r * prow + i * K16_PACKED);
}

/* R weight rows x C X rows over super-blocks [i0, i1), the f32 accumulators passed in and
 * out through accp[c][r] (the driver's slices). Per super-block the columns go in groups of
 * G (2 or 3): for each chunk z a group's X vectors are loaded once for the R rows and each
 * weight vector once for the group (pairs: 0.75 loads per vpdpwssd, the second pair finding
 * the super-block's weights in L1; threes: 0.58, 12 int32 chains beside a 4 x 3 tile's 12
 * f32 accumulators; the row-outer loop before 2026-12-05 reloaded X for every row, 1.25,
 * and ran ~5% slower at 128 columns). Integer sums are exact in any order, so the order of
 * the vpdpwssd changes no bit, and a (row, column)'s FMAs still run in super-block order
 * (an f32 accumulator stored and loaded between slices keeps every bit). */
INLINE void k16_tile(int has_min, int R, int C, int G, int64_t k, int64_t i0, int64_t i1, const char *w,
                     size_t ws, const char *x, size_t xs, __m512 (*accp)[4], float *y, size_t ys) {
    __m512 acc[4][MAXC];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        acc[r][c] = i0 == 0 ? _mm512_setzero_ps() : accp[c][r];
    const float *xsv[MAXC];
    UNROLL
    for (int c = 0; c < C; c++)
        xsv[c] = cpu_x16_sv(x + c * xs, k);
    for (int64_t i = i0; i < i1; i++) {
        UNROLL
        for (int c0 = 0; c0 < C; c0 += G) {
            const int nc = C - c0 < G ? C - c0 : G;
            __m512i isum[4][3];
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
            for (int c = 0; c < nc; c++)
                isum[r][c] = _mm512_setzero_si512();
            UNROLL
            for (int z = 0; z < 8; z++) {
                __m512i xv[3];
                UNROLL
                for (int c = 0; c < nc; c++)
                    xv[c] = _mm512_load_si512((const void *)(x + (c0 + c) * xs + 512 * i + 64 * z));
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m512i wv =
                        _mm512_load_si512((const void *)(w + r * ws + i * K16_PACKED + 64 * z));
                    UNROLL
                    for (int c = 0; c < nc; c++)
                        isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], wv, xv[c]);
                }
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                const char *p = w + r * ws + i * K16_PACKED;
                float d;
                memcpy(&d, p + 576, 4);
                const __m512 vd = _mm512_set1_ps(d);
                const __m512 mf = has_min ? _mm512_load_ps((const void *)(p + 512)) : _mm512_setzero_ps();
                UNROLL
                for (int c = 0; c < nc; c++) {
                    acc[r][c0 + c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), vd, acc[r][c0 + c]);
                    if (has_min)
                        acc[r][c0 + c] =
                            _mm512_fnmadd_ps(mf, _mm512_loadu_ps(xsv[c0 + c] + 16 * i), acc[r][c0 + c]);
                }
            }
        }
    }
    if (i1 == k / 256) { /* the last slice: the outputs */
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
        for (int c = 0; c < C; c++)
            y[c * ys + r] = cpu_x16_D(x + c * xs, k) * hsum16(acc[r][c]);
        return;
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        accp[c][r] = acc[r][c];
}
/* k16_tile over columns [0, C) for 4 weight rows or 1 (the drivers' two row counts). */
INLINE void k16_cols(int has_min, int nr, int C, int G, int64_t k, int64_t i0, int64_t i1, const char *w,
                     size_t ws, const char *x, size_t xs, __m512 (*accp)[4], float *y, size_t ys) {
    if (nr == 4) k16_tile(has_min, 4, C, G, k, i0, i1, w, ws, x, xs, accp, y, ys);
    else k16_tile(has_min, 1, C, G, k, i0, i1, w, ws, x, xs, accp, y, ys);
}

/* The K-quant driver: a strip of 4 rows (or 1) at a time, its columns in blocks of K16_NC,
 * k in slices of K16_SB super-blocks (4 rows: 20 KiB of packed weights, which stay in L1
 * while the block's columns sweep them; three columns' X slices 12 KiB), the columns in
 * threes (one group of 3: each weight vector loaded once for the three columns, 12 int32
 * chains, 0.58 loads per vpdpwssd against the pairs' 0.75), what is left as a pair or a
 * single. Without the slices the weights of 4 rows overflowed L1 above k = 3072 and the
 * tile fell off (bench_matmul Q4_K 2048 x k, 128 columns: ~194 GFLOP/s at k <= 3072, 170 at
 * 4096, 147 at 8192; with them 2048 x 8192 161-165). The first slice starts from zero
 * registers and the last writes y from its registers: an earlier try that zeroed the
 * accumulator array first (gcc makes it a `rep stos`) and wrote y from it after the
 * slices (bunched stores 4 * rows bytes apart) lost ~15% at k = 2048 and hid the gain.
 * A row's arithmetic is the same in every shape (integer sums, then the FMAs in
 * super-block order), so no bit changes. */
#define K16_SB 8
#define K16_NC 24
INLINE void k16_gemm(int has_min, int64_t k, const void *w, size_t ws, const void *x, size_t xs, float *y,
                     size_t ys, int nr, int nc) {
    const int64_t nsb = k / 256;
    _Alignas(64) __m512 acc[K16_NC][4];
    for (int r = 0; r < nr; r += (nr == 4 ? 4 : 1)) {
        const char *wr = (const char *)w + (nr == 4 ? 0 : r * ws);
        for (int c0 = 0; c0 < nc; c0 += K16_NC) {
            const int n = nc - c0 < K16_NC ? nc - c0 : K16_NC;
            const char *xc = (const char *)x + c0 * xs;
            for (int64_t i0 = 0; i0 < nsb; i0 += K16_SB) {
                const int64_t i1 = i0 + K16_SB < nsb ? i0 + K16_SB : nsb;
                float *yc = y + c0 * ys + r;
                int c = 0;
                for (; c + 3 <= n; c += 3)
                    k16_cols(has_min, nr, 3, 3, k, i0, i1, wr, ws, xc + c * xs, xs, acc + c, yc + c * ys, ys);
                if (n - c == 2) k16_cols(has_min, nr, 2, 2, k, i0, i1, wr, ws, xc + c * xs, xs, acc + c, yc + c * ys, ys);
                else if (n - c == 1)
                    k16_cols(has_min, nr, 1, 2, k, i0, i1, wr, ws, xc + c * xs, xs, acc + c, yc + c * ys, ys);
            }
        }
    }
}
static void gemm_packed_k16(int64_t k, const void *w, size_t ws, const void *x, size_t xs, float *y, size_t ys,
                            int nr, int nc) {
    k16_gemm(0, k, w, ws, x, xs, y, ys, nr, nc);
}
static void gemm_packed_k16_min(int64_t k, const void *w, size_t ws, const void *x, size_t xs, float *y,
                                size_t ys, int nr, int nc) {
    k16_gemm(1, k, w, ws, x, xs, y, ys, nr, nc);
}

#define KQ_FNS(name, T)                                                                            \
    static void pack_##name(int64_t k, const void *w, size_t ws, int nr, int64_t b0, int64_t b1,  \
                            void *dst) {                                                           \
        k16_pack(T, k, w, ws, nr, b0, b1, dst);                                                    \
    }
KQ_FNS(q2_K, QT_Q2_K)
KQ_FNS(q3_K, QT_Q3_K)
KQ_FNS(q4_K, QT_Q4_K)
KQ_FNS(q5_K, QT_Q5_K)
KQ_FNS(q6_K, QT_Q6_K)
KQ_FNS(iq4_xs, QT_IQ4_XS)
static size_t packed_bytes_k16(int64_t k) {
    return k16_packed_bytes(k);
}
void cpu_kernels_avx512(struct cpu_kernel tab[QT_COUNT]) {
    tab[QT_F32] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f32};
    tab[QT_F16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f16};
    tab[QT_BF16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_bf16};
#define LEGACY(T, name, ptile)                                                                     \
    tab[T] = (struct cpu_kernel){.act = CPU_ACT_X16_64,                                            \
                                 .pack = pack_##name,                                              \
                                 .packed_row_bytes = packed_bytes_##name,                          \
                                 .gemm_packed = ptile}
    LEGACY(QT_Q8_0, q8_0, gemm_packed);
    LEGACY(QT_Q4_0, q4_0, gemm_packed);
    LEGACY(QT_Q4_1, q4_1, gemm_packed_min);
    LEGACY(QT_Q5_0, q5_0, gemm_packed);
    LEGACY(QT_Q5_1, q5_1, gemm_packed_min);
    LEGACY(QT_IQ4_NL, iq4_nl, gemm_packed);
    LEGACY(QT_MXFP4, mxfp4, gemm_packed);
#undef LEGACY
    tab[QT_Q8_0].pack_grp = pack_grp_q8_0;
#define KQUANT(T, name, ptile)                                                                     \
    tab[T] = (struct cpu_kernel){.act = CPU_ACT_X16_64,                                              \
                                 .pack = pack_##name,                                              \
                                 .packed_row_bytes = packed_bytes_k16,                             \
                                 .gemm_packed = ptile}
    KQUANT(QT_Q2_K, q2_K, gemm_packed_k16_min);
    KQUANT(QT_Q3_K, q3_K, gemm_packed_k16);
    KQUANT(QT_Q4_K, q4_K, gemm_packed_k16_min);
    KQUANT(QT_Q5_K, q5_K, gemm_packed_k16_min);
    KQUANT(QT_Q6_K, q6_K, gemm_packed_k16);
    KQUANT(QT_IQ4_XS, iq4_xs, gemm_packed_k16);
#undef KQUANT
    cpu_kernels_iq_avx512(tab);
}
#endif

/* AVX2 matmul kernels of the codebook i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S) and the ternary types (TQ1_0, TQ2_0) against Q8_K activations, and of
 * NVFP4 and Q1_0 against Q8_32 ones (compiled with -mavx2 -mfma -mf16c -mbmi2). The same
 * source compiled with the AVX-512 flags is cpu_matmul_iq_avx512.c (IQ_AVX512 defined): there
 * vpdpwssd fuses the scale multiply with the accumulation.
 *
 * Each vector of 32 weights is decoded once per tile, in registers, as magnitudes (u8) and
 * signs (an int8 whose sign is the weight's; never 0 where the magnitude is not), plus a
 * 16-bit integer scale per element pair, with the fractions of the format folded into
 * integers exactly as the scalar twin (cpu_matmul_iq_scalar.c):
 *   IQ2_*, IQ3_*: grid row bytes | sign bits expanded to bytes | 2s+1 per 16 or 32
 *   IQ1_*:        8g ± 1 (the ±1/8 delta times 8) in {-9, -7, -1, 1, 7, 9} | 2s+1
 *   TQ*:          t - 1 in {-1, 0, 1} | 1
 * Then per activation row (plane) and vector: vpmaddubsw(|w|, sign(x, w)) (|w| <= 62 and
 * |x| <= 127: no int16 saturation), vpmaddwd with the scales, int32 sums per super-block
 * (exact), one f32 FMA with d·x_d per super-block. The tile is nr (<= 4) weight rows × up
 * to IQ_C = 4 activation rows, so at decode (one X row, two planes) each weight is decoded
 * once. Each output's arithmetic is the same whatever the tile: batch-invariant bits.
 * NVFP4 (E4M3 scale per 16) and Q1_0 (±d) use the same decode-and-dot with one f32 FMA per
 * 32 (the activation scale is per 32). Figures: docs/cpu-backend.md.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "quant/iq_tables.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
/* Activation rows (planes) per tile: a weight vector is decoded once for IQ_C of them.
 * 8 was measured no faster at n = 16 and slower at decode (register pressure). */
#define IQ_C 4

INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

INLINE uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

INLINE float f16(uint16_t h) {
    return _cvtsh_ss(h);
}

/* Σ pairs of |w|·(x signed as w), times the 16-bit scales, added to acc (8 int32 lanes). */
INLINE __m256i dot32_acc(__m256i acc, __m256i mag, __m256i sgn, __m256i sc, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(x, sgn));
#if defined(IQ_AVX512)
    return _mm256_dpwssd_epi32(acc, p, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}

/* Bytes of ±1 from 4 sign bytes (byte g covers elements 8g..8g+7, bit j element j). */
INLINE __m256i signs32(uint32_t s4) {
    const __m256i shuf =
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s4), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_or_si256(v, _mm256_set1_epi8(1));
}

/* Scale pairs: 2·lo+1 on the first 16 elements, 2·hi+1 on the second 16. */
INLINE __m256i sc16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(2 * hi + 1)),
                            _mm_set1_epi16((short)(2 * lo + 1)));
}

INLINE __m256i grid8x4(const uint64_t *g, int i0, int i1, int i2, int i3) {
    return _mm256_set_epi64x((long long)g[i3], (long long)g[i2], (long long)g[i1],
                             (long long)g[i0]);
}

/* The ksigns_iq2xs sign bytes (7 bits i, an 8th making the count of negatives even:
 * i | parity(i) << 7) expanded to 8 bytes of ±1, a format constant built at compile time
 * (the tests hold it to the reference dequantizer, which reads quant_ksigns_iq2xs). */
#define KS_PAR(i) (((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1)
#define KS_BYTE(i, j) (((((i) | KS_PAR(i) << 7) >> (j)) & 1 ? 0xffULL : 0x01ULL) << (8 * (j)))
#define KS_ROW(i)                                                                                  \
    (KS_BYTE(i, 0) | KS_BYTE(i, 1) | KS_BYTE(i, 2) | KS_BYTE(i, 3) | KS_BYTE(i, 4) |               \
     KS_BYTE(i, 5) | KS_BYTE(i, 6) | KS_BYTE(i, 7))
#define KS_4(i) KS_ROW(i), KS_ROW(i + 1), KS_ROW(i + 2), KS_ROW(i + 3)
#define KS_16(i) KS_4(i), KS_4(i + 4), KS_4(i + 8), KS_4(i + 12)
static const uint64_t ksign_bytes[128] = {KS_16(0),  KS_16(16), KS_16(32), KS_16(48),
                                          KS_16(64), KS_16(80), KS_16(96), KS_16(112)};

/* ±1 bytes of 4 groups of 8 from 4 7-bit ksigns indices. */
INLINE __m256i ksigns32(int i0, int i1, int i2, int i3) {
    return _mm256_set_epi64x((long long)ksign_bytes[i3], (long long)ksign_bytes[i2],
                             (long long)ksign_bytes[i1], (long long)ksign_bytes[i0]);
}

/* ---- decoders: vector v (< 8, elements 32v..32v+31) of a super-block (quant/blocks.h
 * layouts) as magnitudes, signs and pair scales; dscale_* is the block's float factor ---- */

INLINE float dscale_iq2_xxs(const void *blk) {
    return f16(((const struct block_iq2_xxs *)blk)->d) * 0.125f;
}
INLINE void dec_iq2_xxs(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const uint8_t *qs = (const uint8_t *)((const struct block_iq2_xxs *)blk)->qs;
    uint32_t a = rd32(qs + 8 * v), sg = rd32(qs + 8 * v + 4);
    *mag = grid8x4(quant_iq2xxs_grid, a & 255, (a >> 8) & 255, (a >> 16) & 255, a >> 24);
    *sgn = ksigns32(sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127);
    *sc = _mm256_set1_epi16((short)(2 * (sg >> 28) + 1));
}

INLINE float dscale_iq2_xs(const void *blk) {
    return f16(((const struct block_iq2_xs *)blk)->d) * 0.125f;
}
INLINE void dec_iq2_xs(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_iq2_xs *b = blk;
    const uint8_t *qb = (const uint8_t *)b->qs + 8 * v; /* 4 little-endian u16 */
    int q0 = rd16(qb), q1 = rd16(qb + 2), q2 = rd16(qb + 4), q3 = rd16(qb + 6);
    *mag = grid8x4(quant_iq2xs_grid, q0 & 511, q1 & 511, q2 & 511, q3 & 511);
    *sgn = ksigns32(q0 >> 9, q1 >> 9, q2 >> 9, q3 >> 9);
    *sc = sc16(b->scales[v] & 15, b->scales[v] >> 4);
}

INLINE float dscale_iq2_s(const void *blk) {
    return f16(((const struct block_iq2_s *)blk)->d) * 0.125f;
}
INLINE void dec_iq2_s(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_iq2_s *b = blk;
    const uint8_t *q = b->qs + 4 * v;
    int h = b->qh[v];
    *mag = grid8x4(quant_iq2s_grid, q[0] | (h & 3) << 8, q[1] | (h & 12) << 6, q[2] | (h & 48) << 4,
                   q[3] | (h & 192) << 2);
    *sgn = signs32(rd32(b->qs + 32 + 4 * v));
    *sc = sc16(b->scales[v] & 15, b->scales[v] >> 4);
}

INLINE float dscale_iq3_xxs(const void *blk) {
    return f16(((const struct block_iq3_xxs *)blk)->d) * 0.25f;
}
INLINE void dec_iq3_xxs(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const uint8_t *qs = ((const struct block_iq3_xxs *)blk)->qs, *q = qs + 8 * v;
    const uint32_t *g = quant_iq3xxs_grid;
    uint32_t sg = rd32(qs + 64 + 4 * v);
    *mag = _mm256_set_epi32((int)g[q[7]], (int)g[q[6]], (int)g[q[5]], (int)g[q[4]], (int)g[q[3]],
                            (int)g[q[2]], (int)g[q[1]], (int)g[q[0]]);
    *sgn = ksigns32(sg & 127, (sg >> 7) & 127, (sg >> 14) & 127, (sg >> 21) & 127);
    *sc = _mm256_set1_epi16((short)(2 * (sg >> 28) + 1));
}

INLINE float dscale_iq3_s(const void *blk) {
    return f16(((const struct block_iq3_s *)blk)->d);
}
INLINE void dec_iq3_s(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_iq3_s *b = blk;
    const uint32_t *g = quant_iq3s_grid;
    const uint8_t *q = b->qs + 8 * v;
    int h = b->qh[v];
    /* 9-bit indices: byte j of qs, bit j of qh moved to bit 8; one gather of the 8 rows
     * (measured ~20% faster here than 8 loads and inserts; on IQ3_XXS, 8-bit indices, the
     * gather was slower) */
    __m256i hb = _mm256_sllv_epi32(_mm256_set1_epi32(h), _mm256_set_epi32(1, 2, 3, 4, 5, 6, 7, 8));
    __m256i idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)),
                                  _mm256_and_si256(hb, _mm256_set1_epi32(256)));
    *mag = _mm256_i32gather_epi32((const int *)g, idx, 4);
    *sgn = signs32(rd32(b->signs + 4 * v));
    *sc = _mm256_set1_epi16((short)(2 * ((b->scales[v / 2] >> (4 * (v % 2))) & 15) + 1));
}

/* 8g + delta for IQ1 grid bytes g in {-1, 0, 1} and delta bytes ±1: odd, never 0. */
INLINE void iq1_weights(__m256i g, __m256i delta, __m256i *mag, __m256i *sgn) {
    __m256i w = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta);
    *mag = _mm256_abs_epi8(w);
    *sgn = w;
}

INLINE float dscale_iq1_s(const void *blk) {
    return f16(((const struct block_iq1_s *)blk)->d) * 0.125f;
}
INLINE void dec_iq1_s(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_iq1_s *b = blk;
    const uint8_t *q = b->qs + 4 * v;
    int h = b->qh[v];
    __m256i g = grid8x4(quant_iq1s_grid, q[0] | (h & 7) << 8, q[1] | (h & 56) << 5,
                        q[2] | (h & 448) << 2, q[3] | (h & 3584) >> 1);
    iq1_weights(g, _mm256_set1_epi8(h & 0x8000 ? -1 : 1), mag, sgn);
    *sc = _mm256_set1_epi16((short)(2 * ((h >> 12) & 7) + 1));
}

INLINE float dscale_iq1_m(const void *blk) {
    uint16_t sc[4];
    memcpy(sc, ((const struct block_iq1_m *)blk)->scales, 8);
    return f16((uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                          (sc[3] & 0xf000))) *
           0.125f;
}
INLINE void dec_iq1_m(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_iq1_m *b = blk;
    const long long neg = -1LL, pos = 0x0101010101010101LL;
    const uint8_t *q = b->qs + 4 * v;
    int h0 = b->qh[2 * v], h1 = b->qh[2 * v + 1]; /* groups 4v, 4v+1 | 4v+2, 4v+3 */
    __m256i g = grid8x4(quant_iq1s_grid, q[0] | (h0 & 7) << 8, q[1] | (h0 & 0x70) << 4,
                        q[2] | (h1 & 7) << 8, q[3] | (h1 & 0x70) << 4);
    __m256i delta = _mm256_set_epi64x(h1 & 0x80 ? neg : pos, h1 & 8 ? neg : pos,
                                      h0 & 0x80 ? neg : pos, h0 & 8 ? neg : pos);
    iq1_weights(g, delta, mag, sgn);
    int w = rd16(b->scales + 2 * (v / 2)), sh = 6 * (v % 2); /* 3-bit scales 2v, 2v + 1 */
    *sc = sc16((w >> sh) & 7, (w >> (sh + 3)) & 7);
}

/* t - 1 from ternary digits t in {0, 1, 2}. */
INLINE void tq_weights(__m256i t, __m256i *mag, __m256i *sgn, __m256i *sc) {
    __m256i w = _mm256_sub_epi8(t, _mm256_set1_epi8(1));
    *mag = _mm256_abs_epi8(w);
    *sgn = w;
    *sc = _mm256_set1_epi16(1);
}

/* TQ1_0's base-3 digit of each byte q: ((q·p mod 256)·3) >> 8, p the power of 3 of that
 * byte's digit given per 16-bit lane (the same for both bytes of a lane). */
INLINE __m256i trits(__m256i q, __m256i p) {
    const __m256i lo8 = _mm256_set1_epi16(0x00ff), hi8 = _mm256_set1_epi16((short)0xff00);
    __m256i m =
        _mm256_or_si256(_mm256_and_si256(_mm256_mullo_epi16(q, p), lo8),
                        _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(q, hi8), p), hi8));
    __m256i te = _mm256_mulhi_epu16(_mm256_and_si256(m, lo8), _mm256_set1_epi16(768));
    __m256i to = _mm256_mulhi_epu16(_mm256_and_si256(m, hi8), _mm256_set1_epi16(3));
    return _mm256_or_si256(te, _mm256_slli_epi16(to, 8));
}

INLINE float dscale_tq1_0(const void *blk) {
    return f16(((const struct block_tq1_0 *)blk)->d);
}
INLINE void dec_tq1_0(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_tq1_0 *b = blk;
    static const short pw[5] = {1, 3, 9, 27, 81};
    __m256i t;
    if (v < 5) { /* elements 32v + m: digit v of qs[m] */
        t = trits(_mm256_loadu_si256((const __m256i *)b->qs), _mm256_set1_epi16(pw[v]));
    } else {
        /* 160 + 16t + m: digit t of qs[32 + m]; 240 + 4t + m: digit t of qh[m] */
        __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b->qs + 32)));
        __m256i p;
        if (v == 5)
            p = _mm256_set_m128i(_mm_set1_epi16(3), _mm_set1_epi16(1));
        else if (v == 6)
            p = _mm256_set_m128i(_mm_set1_epi16(27), _mm_set1_epi16(9));
        else {
            q = _mm256_inserti128_si256(q, _mm_set1_epi32((int)rd32(b->qh)), 1);
            p = _mm256_set_epi16(27, 27, 9, 9, 3, 3, 1, 1, 81, 81, 81, 81, 81, 81, 81, 81);
        }
        t = trits(q, p);
    }
    tq_weights(t, mag, sgn, sc);
}

INLINE float dscale_tq2_0(const void *blk) {
    return f16(((const struct block_tq2_0 *)blk)->d);
}
INLINE void dec_tq2_0(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc) {
    const struct block_tq2_0 *b = blk; /* 128h + 32s + l: bits 2s of qs[32h + l] */
    __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (v / 4)));
    tq_weights(_mm256_and_si256(_mm256_srli_epi16(q, 2 * (v % 4)), _mm256_set1_epi8(3)), mag, sgn,
               sc);
}

/* ---- the tile over Q8_K activations ---- */

typedef void (*dec_k_fn)(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256i *sc);

/* nr weight rows × C activation rows (planes) at x + c·xstride: each vector of weights is
 * decoded once and dotted against the C rows while in registers. */
INLINE void tile_k(int64_t k, const char *w, size_t wstride, const char *x, size_t xstride,
                   float *y, size_t ystride, int nr, const int C, size_t bsize,
                   float (*dscale)(const void *), dec_k_fn dec) {
    const float *xd[IQ_C];
    for (int c = 0; c < C; c++)
        xd[c] = cpu_act_d(x + c * xstride, k);
    for (int r = 0; r < nr; r++) {
        const char *row = w + r * wstride;
        __m256 acc[IQ_C];
        for (int c = 0; c < C; c++)
            acc[c] = _mm256_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *blk = row + i * bsize;
            __m256i s[IQ_C];
            for (int c = 0; c < C; c++)
                s[c] = _mm256_setzero_si256();
            UNROLL
            for (int v = 0; v < 8; v++) {
                __m256i mag, sgn, sc;
                dec(blk, v, &mag, &sgn, &sc);
                for (int c = 0; c < C; c++)
                    s[c] = dot32_acc(
                        s[c], mag, sgn, sc,
                        _mm256_loadu_si256((const __m256i *)(x + c * xstride + 256 * i) + v));
            }
            float d = dscale(blk);
            for (int c = 0; c < C; c++)
                acc[c] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[c]), _mm256_set1_ps(d * xd[c][i]), acc[c]);
        }
        for (int c = 0; c < C; c++)
            y[c * ystride + r] = hsum_ps(acc[c]);
    }
}

/* ---- NVFP4 (64-blocks) and Q1_0 (128-blocks) over Q8_32 activations ---- */

/* Vector v of a block as magnitudes and signs, and the f32 scale of each int32 lane (the
 * lane sums 4 consecutive elements). */
typedef void (*dec_32_fn)(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256 *scale);

INLINE void dec_nvfp4(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256 *scale) {
    const struct block_nvfp4 *b = blk; /* vector v: sub-blocks 2v, 2v + 1 */
    const __m256i kv =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_kvalues_mxfp4));
    __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * v));
    __m128i lo = _mm_and_si128(q, _mm_set1_epi8(15)),
            hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
    __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
    __m256i wv = _mm256_shuffle_epi8(kv, idx);
    *mag = _mm256_abs_epi8(wv);
    *sgn = wv;
    *scale = _mm256_set_m128(_mm_set1_ps(cpu_ue4m3_half(b->d[2 * v + 1])),
                             _mm_set1_ps(cpu_ue4m3_half(b->d[2 * v])));
}

INLINE void dec_q1_0(const void *blk, int v, __m256i *mag, __m256i *sgn, __m256 *scale) {
    const struct block_q1_0 *b = blk; /* bit set: +d, clear: -d */
    *mag = _mm256_set1_epi8(1);
    *sgn = signs32(~rd32(b->qs + 4 * v));
    *scale = _mm256_set1_ps(f16(b->d));
}

/* As tile_k for blocks of V vectors with f32 scales per lane; x's scale per 32. */
INLINE void tile_32(int64_t k, const char *w, size_t wstride, const char *x, size_t xstride,
                    float *y, size_t ystride, int nr, const int C, size_t bsize, const int V,
                    dec_32_fn dec) {
    const float *xd[IQ_C];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < C; c++)
        xd[c] = cpu_act_d(x + c * xstride, k);
    for (int r = 0; r < nr; r++) {
        const char *row = w + r * wstride;
        __m256 acc[IQ_C];
        for (int c = 0; c < C; c++)
            acc[c] = _mm256_setzero_ps();
        for (int64_t i = 0; i < k / (32 * V); i++) {
            UNROLL
            for (int v = 0; v < V; v++) {
                __m256i mag, sgn;
                __m256 scale;
                dec(row + i * bsize, v, &mag, &sgn, &scale);
                for (int c = 0; c < C; c++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x + c * xstride) + i * V + v);
                    __m256i p = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xv, sgn)), ones);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                             _mm256_mul_ps(scale, _mm256_set1_ps(xd[c][i * V + v])),
                                             acc[c]);
                }
            }
        }
        for (int c = 0; c < C; c++)
            y[c * ystride + r] = hsum_ps(acc[c]);
    }
}

/* The tile function of a type: columns in tiles of IQ_C = 4, the tail specialized. Every
 * column's arithmetic is the same in all of them. (A greedy 4/2/1 split instead of the
 * switch was measured 20% slower on IQ3_S decode, 2026-12-04: code placement.) */
#define TILE_CASE(n, TILE, ...)                                                                    \
    case n:                                                                                        \
        TILE(k, w, wstride, xc, xstride, yc, ystride, nr, n, __VA_ARGS__);                         \
        break;
#define GEMM_TILES(name, TILE, ...)                                                                \
    static void gemm_##name(int64_t k, const void *w, size_t wstride, const void *x,               \
                            size_t xstride, float *y, size_t ystride, int nr, int nc) {            \
        for (int c0 = 0; c0 < nc; c0 += IQ_C) {                                                    \
            const char *xc = (const char *)x + c0 * xstride;                                       \
            float *yc = y + c0 * ystride;                                                          \
            switch (nc - c0 < IQ_C ? nc - c0 : IQ_C) {                                             \
                TILE_CASE(1, TILE, __VA_ARGS__)                                                    \
                TILE_CASE(2, TILE, __VA_ARGS__)                                                    \
                TILE_CASE(3, TILE, __VA_ARGS__)                                                    \
                TILE_CASE(4, TILE, __VA_ARGS__)                                                    \
            }                                                                                      \
        }                                                                                          \
    }
_Static_assert(IQ_C == 4, "GEMM_TILES has a case per tile width up to IQ_C");
#define GEMM_K(name)                                                                               \
    GEMM_TILES(name, tile_k, sizeof(struct block_##name), dscale_##name, dec_##name)
GEMM_K(iq2_xxs)
GEMM_K(iq2_xs)
GEMM_K(iq2_s)
GEMM_K(iq3_xxs)
GEMM_K(iq3_s)
GEMM_K(iq1_s)
GEMM_K(iq1_m)
GEMM_K(tq1_0)
GEMM_K(tq2_0)
GEMM_TILES(nvfp4, tile_32, sizeof(struct block_nvfp4), 2, dec_nvfp4)
GEMM_TILES(q1_0, tile_32, sizeof(struct block_q1_0), 4, dec_q1_0)

#if defined(IQ_AVX512)
#define IQ_REGISTER cpu_kernels_iq_avx512
#else
#define IQ_REGISTER cpu_kernels_iq_avx2
#endif

void IQ_REGISTER(struct cpu_kernel tab[QT_COUNT]) {
    tab[QT_IQ2_XXS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_xxs};
    tab[QT_IQ2_XS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_xs};
    tab[QT_IQ2_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_s};
    tab[QT_IQ3_XXS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq3_xxs};
    tab[QT_IQ3_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq3_s};
    tab[QT_IQ1_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq1_s};
    tab[QT_IQ1_M] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq1_m};
    tab[QT_TQ1_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_tq1_0};
    tab[QT_TQ2_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_tq2_0};
    tab[QT_NVFP4] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_nvfp4};
    tab[QT_Q1_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q1_0};
}
#endif

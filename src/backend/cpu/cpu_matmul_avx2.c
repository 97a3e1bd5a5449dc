/* AVX2/FMA/F16C matmul kernels for the file layout, and activation quantizers (compiled
 * with -mavx2 -mfma -mf16c -mbmi2; called only when cpu_features says the CPU and OS
 * support them): the packed prefill path of the legacy types, MXFP4, Q2_K..Q6_K and
 * IQ4_XS, and F32/F16/BF16. Decode of the packed-path types runs on repacked weights
 * (cpu_gemv_avx2.c), whose kernels reproduce these ones' arithmetic per row; a call on
 * the file layout takes the packed path at any n.
 *
 * Packed rows (X16_32 activations, quad-pair order): the legacy types as their int16
 * values v with d (and m) per block, two vpmaddwd per block give each lane the exact dot
 * of a quad; Q2_K..Q6_K and IQ4_XS run over the 16-bit products sc·v (kp_* builds the
 * K-quants' through a common d·sc·u − dm·mn form): the K-quants in chunk lanes (X16_K,
 * k16_tile with G = 1: a lane is a 32-element chunk, one f32 FMA per super-block), IQ4_XS in quad
 * lanes (X16_32, k16_tile with G = 2: one FMA per half super-block). One f32 FMA per block (legacy)
 * and tile element; lane reductions through hsum_ps (a fixed tree).
 *
 * Tiles: R weight rows × C activation rows, R = 4 (1 for a ragged tail), C = 2 (1 for an
 * odd tail). Measured on the 2-core dev VM (Sapphire Rapids flags), 1 thread, 896×4864,
 * GFLOP per CPU-second n=128: Q4_K 80, Q6_K 79, Q8_0 62, Q5_0 72, F16 68.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_tr8_avx2.h"

#define INLINE static inline __attribute__((always_inline))
/* Tile loops have constant trip counts (R, C, sub-blocks): unroll them so the accumulators
 * live in registers (GCC -O2 would otherwise keep them on the stack). */
#define UNROLL _Pragma("GCC unroll 8")

INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float f16(uint16_t h) {
    return _cvtsh_ss(h);
}

/* ---- activation quantizers (bit-identical to cpu_q8.c) ---- */

INLINE float row_amax(const float *x, int64_t k) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
    return hmax_ps(m);
}

/* v of 8 elements (as cpu_q8.c's act_v: f32 product, clamp, round half to even). */
INLINE __m256i act_v8(const float *x, __m256 vid) {
    const __m256 lim = _mm256_set1_ps((float)CPU_ACT_VMAX);
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x), vid);
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
    return _mm256_cvtps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* 32 i32 (4 vectors, element order) -> 32 int8 at out. */
INLINE void store_i8x32(int8_t *out, __m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
}

/* Both planes (hi at q, lo at q + row bytes), block scales 128·D / D per gd, sums per gs
 * (16 or 32). */
INLINE void quantize_planes(const float *x, void *q, int64_t k, enum cpu_act act, int gd, int gs) {
    int8_t *hq = q, *lq = (int8_t *)q + cpu_act_row_bytes(act, k);
    float *hd = (float *)(hq + k), *ld = (float *)(lq + k);
    int16_t *hs = (int16_t *)(hd + k / gd), *ls = (int16_t *)(ld + k / gd);
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f, dd = amax / (float)CPU_ACT_VMAX;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i c64 = _mm256_set1_epi32(64);
    for (int64_t i = 0; i < k; i += 32) {
        __m256i h[4], l[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
            __m256i v = act_v8(x + i + 8 * j, vid);
            h[j] = _mm256_srai_epi32(_mm256_add_epi32(v, c64), 7);
            l[j] = _mm256_sub_epi32(v, _mm256_slli_epi32(h[j], 7));
        }
        store_i8x32(hq + i, h[0], h[1], h[2], h[3]);
        store_i8x32(lq + i, l[0], l[1], l[2], l[3]);
        if (gs == 32) {
            hs[i / 32] = (int16_t)hsum_epi32(
                _mm256_add_epi32(_mm256_add_epi32(h[0], h[1]), _mm256_add_epi32(h[2], h[3])));
            ls[i / 32] = (int16_t)hsum_epi32(
                _mm256_add_epi32(_mm256_add_epi32(l[0], l[1]), _mm256_add_epi32(l[2], l[3])));
        } else {
            hs[i / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(h[0], h[1]));
            hs[i / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(h[2], h[3]));
            ls[i / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(l[0], l[1]));
            ls[i / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(l[2], l[3]));
        }
    }
    for (int64_t b = 0; b < k / gd; b++) {
        hd[b] = 128.0f * dd;
        ld[b] = dd;
    }
}

void cpu_quantize_q8_32_avx2(const float *x, void *q, int64_t k) {
    quantize_planes(x, q, k, CPU_ACT_Q8_32, 32, 32);
}

void cpu_quantize_q8_K_avx2(const float *x, void *q, int64_t k) {
    quantize_planes(x, q, k, CPU_ACT_Q8_K, 256, 16);
}

void cpu_quantize_x2_32_avx2(const float *x, void *q, int64_t k) {
    const size_t kp = cpu_x2_kp(k);
    int8_t *hq = q, *lq = (int8_t *)q + kp;
    int32_t *neg = (int32_t *)((char *)q + 2 * kp);
    float *sv = (float *)((char *)q + 3 * kp);
    float amax = row_amax(x, k);
    const __m256 vid = _mm256_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    const __m256i c64 = _mm256_set1_epi32(64);
    for (int64_t i = 0; i < k; i += 32) {
        __m256i h[4], l[4], v[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
            v[j] = act_v8(x + i + 8 * j, vid);
            h[j] = _mm256_srai_epi32(_mm256_add_epi32(v[j], c64), 7);
            l[j] = _mm256_sub_epi32(v[j], _mm256_slli_epi32(h[j], 7));
        }
        store_i8x32(hq + i, h[0], h[1], h[2], h[3]);
        store_i8x32(lq + i, l[0], l[1], l[2], l[3]);
        /* sums of 4: pairwise adds within 128-bit lanes, then put the 8 sums in order */
        __m256i s01 = _mm256_hadd_epi32(v[0], v[1]), s23 = _mm256_hadd_epi32(v[2], v[3]);
        __m256i s4 = _mm256_hadd_epi32(s01, s23); /* 4-sums G0 G2 G4 G6 | G1 G3 G5 G7 */
        s4 = _mm256_permutevar8x32_epi32(s4, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(neg + i / 4), _mm256_sub_epi32(_mm256_setzero_si256(), s4));
        sv[i / 32] = (float)hsum_epi32(s4);
    }
    sv[k / 32] = amax / (float)CPU_ACT_VMAX;
}

/* Quad-pair order of a 32-element chunk (X16_32) from its natural int16 halves a, b:
 * *o0 = the pairs 4λ, 4λ+1 (λ < 8), *o1 = 4λ+2, 4λ+3, i.e. the even / odd dwords. */
INLINE void quadpairs(__m256i a, __m256i b, __m256i *o0, __m256i *o1) {
    __m256 e = _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0x88);
    __m256 o = _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0xdd);
    *o0 = _mm256_permute4x64_epi64(_mm256_castps_si256(e), 0xd8);
    *o1 = _mm256_permute4x64_epi64(_mm256_castps_si256(o), 0xd8);
}

void cpu_quantize_x16_32_avx2(const float *x, void *q, int64_t k) {
    int16_t *v16 = q;
    float *sv = (float *)(v16 + k);
    float amax = row_amax(x, k);
    const __m256 vid = _mm256_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    for (int64_t i = 0; i < k; i += 32) {
        __m256i v[4], h[2];
        UNROLL
        for (int j = 0; j < 4; j++)
            v[j] = act_v8(x + i + 8 * j, vid);
        UNROLL
        for (int j = 0; j < 2; j++) {
            h[j] = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2 * j], v[2 * j + 1]), 0xd8);
            sv[i / 16 + j] = (float)hsum_epi32(_mm256_add_epi32(v[2 * j], v[2 * j + 1]));
        }
        __m256i o0, o1;
        quadpairs(h[0], h[1], &o0, &o1);
        _mm256_storeu_si256((__m256i *)(v16 + i), o0);
        _mm256_storeu_si256((__m256i *)(v16 + i + 16), o1);
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

/* i32 × 8 → int8 × 8 (values fit) */
INLINE __m128i i32_to_i8(__m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packs_epi16(w, w);
}

/* XK (repacked K-quant decode): both planes, pair sums of v, sums per 16 (cpu_kernels.h). */
void cpu_quantize_xk_avx2(const float *x, void *q, int64_t k) {
    const size_t kp = cpu_x2_kp(k);
    int8_t *hq = q, *lq = (int8_t *)q + kp;
    int16_t *p2 = (int16_t *)((char *)q + 2 * kp);
    float *sv = (float *)((char *)q + 2 * kp + (size_t)k);
    float amax = row_amax(x, k);
    const __m256 vid = _mm256_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    const __m256i c64 = _mm256_set1_epi32(64);
    for (int64_t i = 0; i < k; i += 16) {
        __m256i v0 = act_v8(x + i, vid), v1 = act_v8(x + i + 8, vid);
        __m256i h0 = _mm256_srai_epi32(_mm256_add_epi32(v0, c64), 7);
        __m256i h1 = _mm256_srai_epi32(_mm256_add_epi32(v1, c64), 7);
        __m256i l0 = _mm256_sub_epi32(v0, _mm256_slli_epi32(h0, 7));
        __m256i l1 = _mm256_sub_epi32(v1, _mm256_slli_epi32(h1, 7));
        _mm_storel_epi64((__m128i *)(hq + i), i32_to_i8(h0));
        _mm_storel_epi64((__m128i *)(hq + i + 8), i32_to_i8(h1));
        _mm_storel_epi64((__m128i *)(lq + i), i32_to_i8(l0));
        _mm_storel_epi64((__m128i *)(lq + i + 8), i32_to_i8(l1));
        /* pair sums v[2j] + v[2j+1] of the 16 values, in order */
        __m256i pr = _mm256_hadd_epi32(v0, v1); /* p0 p1 p4 p5 | p2 p3 p6 p7 ... */
        pr = _mm256_permute4x64_epi64(pr, 0xd8);
        __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(pr), _mm256_extracti128_si256(pr, 1));
        _mm_storeu_si128((__m128i *)(p2 + i / 2), p16);
        sv[i / 16] = (float)hsum_epi32(_mm256_add_epi32(v0, v1));
        /* c32: 32 × the slot sums of each plane (slot s: elements 4m + 2s + e) */
        const __m256i slot = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
        __m256i hs = _mm256_add_epi32(h0, h1), ls = _mm256_add_epi32(l0, l1);
        int16_t *c32 = (int16_t *)cpu_xk_c32(q, k) + i / 4;
        for (int pl = 0; pl < 2; pl++) {
            __m256i v = pl ? ls : hs;
            __m256i s1 = _mm256_and_si256(v, _mm256_cmpeq_epi32(slot, _mm256_set1_epi32(1)));
            int t1 = hsum_epi32(s1), t0 = hsum_epi32(v) - t1;
            c32[2 * pl] = (int16_t)(32 * t0);
            c32[2 * pl + 1] = (int16_t)(32 * t1);
        }
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

/* Chunk-lane order of a super-block (X16_K, cpu_kernels.h) from its 256 int16 in element
 * order: out vector j, dword λ = the pair j of chunk λ (two 8 × 8 dword transposes). */
INLINE void chunk_lanes(const int16_t *nat, int16_t *out) {
    for (int h = 0; h < 2; h++) {
        __m256i r[8];
        UNROLL
        for (int l = 0; l < 8; l++)
            r[l] = _mm256_load_si256((const __m256i *)(nat + 32 * l + 16 * h));
        cpu_tr8(r);
        UNROLL
        for (int j = 0; j < 8; j++)
            _mm256_storeu_si256((__m256i *)(out + 16 * (8 * h + j)), r[j]);
    }
}

void cpu_quantize_x16_k_avx2(const float *x, void *q, int64_t k) {
    int16_t *v16 = q;
    float *sv = (float *)(v16 + k);
    float amax = row_amax(x, k);
    const __m256 vid = _mm256_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    _Alignas(32) int16_t nat[256];
    for (int64_t b = 0; b < k; b += 256) {
        for (int l = 0; l < 8; l++) {
            __m256i v[4];
            UNROLL
            for (int j = 0; j < 4; j++)
                v[j] = act_v8(x + b + 32 * l + 8 * j, vid);
            UNROLL
            for (int j = 0; j < 2; j++) {
                _mm256_store_si256((__m256i *)(nat + 32 * l + 16 * j),
                                   _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2 * j], v[2 * j + 1]), 0xd8));
                sv[b / 16 + 8 * j + l] = (float)hsum_epi32(_mm256_add_epi32(v[2 * j], v[2 * j + 1]));
            }
        }
        chunk_lanes(nat, v16 + b);
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

/* ---- plain types: f32 FMA against f32 activations ---- */

enum plain { P_F32, P_F16, P_BF16 };

INLINE __m256 load8(enum plain t, const void *p, int64_t i) {
    switch (t) {
    case P_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case P_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))),
            16));
    default:
        return _mm256_loadu_ps((const float *)p + i);
    }
}

INLINE float load1(enum plain t, const void *p, int64_t i) {
    switch (t) {
    case P_F16:
        return f16(((const uint16_t *)p)[i]);
    case P_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default:
        return ((const float *)p)[i];
    }
}

INLINE void plain_tile(enum plain t, int R, int C, int64_t k, const char *w, size_t ws,
                       const char *x, size_t xs, float *y, size_t ys) {
    __m256 acc[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        acc[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv[2];
        UNROLL
        for (int c = 0; c < C; c++)
            xv[c] = _mm256_loadu_ps((const float *)(x + c * xs) + i);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 wv = load8(t, w + r * ws, i);
            UNROLL
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++) {
        float s = hsum_ps(acc[r][c]);
        for (int64_t j = i; j < k; j++)
            s += load1(t, w + r * ws, j) * ((const float *)(x + c * xs))[j];
        y[c * ys + r] = s;
    }
}

/* Walks a kernel over an nr × nc request in R×C tiles (R in {4,1}, C in {2,1}). */
#define TILE_DRIVER(name, TILE)                                                                    \
    static void gemm_##name(int64_t k, const void *w, size_t ws, const void *x, size_t xs,         \
                            float *y, size_t ys, int nr, int nc) {                                 \
        const char *wp = w, *xp = x;                                                               \
        int c = 0;                                                                                 \
        for (; c + 2 <= nc; c += 2) {                                                              \
            if (nr == 4)                                                                           \
                TILE(4, 2, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                            \
            else                                                                                   \
                for (int r = 0; r < nr; r++)                                                       \
                    TILE(1, 2, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
        }                                                                                          \
        if (c < nc) {                                                                              \
            if (nr == 4)                                                                           \
                TILE(4, 1, k, wp, ws, xp + c * xs, xs, y + c * ys, ys);                            \
            else                                                                                   \
                for (int r = 0; r < nr; r++)                                                       \
                    TILE(1, 1, k, wp + r * ws, ws, xp + c * xs, xs, y + c * ys + r, ys);           \
        }                                                                                          \
    }

#define F32_TILE(R, C, ...) plain_tile(P_F32, R, C, __VA_ARGS__)
#define F16_TILE(R, C, ...) plain_tile(P_F16, R, C, __VA_ARGS__)
#define BF16_TILE(R, C, ...) plain_tile(P_BF16, R, C, __VA_ARGS__)
TILE_DRIVER(f32, F32_TILE)
TILE_DRIVER(f16, F16_TILE)
TILE_DRIVER(bf16, BF16_TILE)

/* ---- legacy 32-blocks × Q8_32 ---- */


/* 32 bits → 32 bytes of 0x10 where the bit is set (byte j ← bit j). */
INLINE __m256i bits_to_0x10(uint32_t bits) {
    const __m256i shuf =
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

INLINE __m256i nibbles_32(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* Unpacks block i of a legacy-type row: unsigned quants (or, for the signed types Q8_0 and
 * IQ4_NL, signed values), scale d and min m (Q4_1/Q5_1). */
INLINE __m256i legacy_unpack(uint32_t t, const char *row, int64_t i, float *d, float *m) {
    switch (t) {
    case QT_Q4_0: {
        const struct block_q4_0 *b = (const struct block_q4_0 *)row + i;
        *d = f16(b->d);
        return nibbles_32(b->qs);
    }
    case QT_Q4_1: {
        const struct block_q4_1 *b = (const struct block_q4_1 *)row + i;
        *d = f16(b->d);
        *m = f16(b->m);
        return nibbles_32(b->qs);
    }
    case QT_Q5_0: {
        const struct block_q5_0 *b = (const struct block_q5_0 *)row + i;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        *d = f16(b->d);
        return _mm256_or_si256(nibbles_32(b->qs), bits_to_0x10(qh));
    }
    case QT_Q5_1: {
        const struct block_q5_1 *b = (const struct block_q5_1 *)row + i;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        *d = f16(b->d);
        *m = f16(b->m);
        return _mm256_or_si256(nibbles_32(b->qs), bits_to_0x10(qh));
    }
    case QT_IQ4_NL: {
        const struct block_iq4_nl *b = (const struct block_iq4_nl *)row + i;
        *d = f16(b->d);
        const __m256i tab =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl));
        return _mm256_shuffle_epi8(tab, nibbles_32(b->qs));
    }
    case QT_MXFP4: {
        const struct block_mxfp4 *b = (const struct block_mxfp4 *)row + i;
        *d = cpu_e8m0_half(b->e);
        const __m256i tab =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_kvalues_mxfp4));
        return _mm256_shuffle_epi8(tab, nibbles_32(b->qs));
    }
    default: { /* Q8_0 */
        const struct block_q8_0 *b = (const struct block_q8_0 *)row + i;
        *d = f16(b->d);
        return _mm256_loadu_si256((const __m256i *)b->qs);
    }
    }
}

INLINE int legacy_offset(uint32_t t) {
    return t == QT_Q4_0 ? 8 : t == QT_Q5_0 ? 16 : 0;
}
INLINE int legacy_signed(uint32_t t) {
    return t == QT_Q8_0 || t == QT_IQ4_NL || t == QT_MXFP4;
}
INLINE int legacy_has_min(uint32_t t) {
    return t == QT_Q4_1 || t == QT_Q5_1;
}

/* Legacy types against X16 (cpu_kernels.h): the block's 32 signed values v as int16 (from
 * legacy_unpack on the fly, or from the packed row), two vpmaddwd against the 16-bit
 * activations give per lane the exact dot of 4 elements (<= 4·128·16256 < 2^24, exact in
 * f32), then one FMA with d per block; the row scale D at the end:
 *     y = D · (sum over blocks of d_b · sum v·x16 [+ m_b · sum_b x16]).
 * Packed prefill layout: int16 v[k] | float d[k/32] | float m[k/32] (Q4_1/Q5_1), 64-byte
 * multiple, so the tile loop only loads. */
INLINE size_t packed_legacy_bytes(uint32_t t, int64_t k) {
    size_t n = 2 * (size_t)k + 4 * (size_t)(k / 32) * (legacy_has_min(t) ? 2 : 1);
    return (n + 63) & ~(size_t)63;
}

/* The 32 values of block i as two vectors of 16 int16 (v = q - offset, or the signed value)
 * in X16_32's quad-pair order. */
INLINE void legacy_v16(uint32_t t, const char *row, int64_t i, __m256i *v0, __m256i *v1, float *d,
                       float *m) {
    __m256i q = legacy_unpack(t, row, i, d, m);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256i a, b;
    if (legacy_signed(t)) {
        a = _mm256_cvtepi8_epi16(lo);
        b = _mm256_cvtepi8_epi16(hi);
    } else {
        const __m256i off = _mm256_set1_epi16((short)legacy_offset(t));
        a = _mm256_sub_epi16(_mm256_cvtepu8_epi16(lo), off);
        b = _mm256_sub_epi16(_mm256_cvtepu8_epi16(hi), off);
    }
    quadpairs(a, b, v0, v1);
}

INLINE void pack_legacy(uint32_t t, int64_t k, const void *w, size_t ws, int nr, int64_t b0,
                        int64_t b1, void *dst) {
    const size_t prow = packed_legacy_bytes(t, k);
    const int64_t nb = k / 32;
    for (int r = 0; r < nr; r++) {
        int16_t *v = (int16_t *)((char *)dst + r * prow);
        float *d = (float *)(v + k), *m = d + nb;
        for (int64_t i = b0; i < b1; i++) {
            __m256i v0, v1;
            float mm = 0.0f;
            legacy_v16(t, (const char *)w + r * ws, i, &v0, &v1, &d[i], &mm);
            _mm256_store_si256((__m256i *)(v + 32 * i), v0);
            _mm256_store_si256((__m256i *)(v + 32 * i + 16), v1);
            if (legacy_has_min(t)) m[i] = mm;
        }
    }
}

INLINE void legacy_tile(int has_min, int R, int C, int64_t k, const char *w, size_t ws,
                        const char *x, size_t xs, float *y, size_t ys) {
    __m256 acc[4][2];
    float macc[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++) {
        acc[r][c] = _mm256_setzero_ps();
        macc[r][c] = 0.0f;
    }
    const float *xsv[2];
    UNROLL
    for (int c = 0; c < C; c++)
        xsv[c] = cpu_x16_sv(x + c * xs, k);
    for (int64_t i = 0; i < k / 32; i++) {
        UNROLL
        for (int r = 0; r < R; r++) {
            const int16_t *pv = (const int16_t *)(w + r * ws);
            const float *pd = (const float *)(pv + k);
            const __m256i v0 = _mm256_load_si256((const __m256i *)(pv + 32 * i));
            const __m256i v1 = _mm256_load_si256((const __m256i *)(pv + 32 * i + 16));
            const float d = pd[i], m = has_min ? pd[k / 32 + i] : 0.0f;
            UNROLL
            for (int c = 0; c < C; c++) {
                const int16_t *xv = (const int16_t *)(x + c * xs) + 32 * i;
                __m256i p =
                    _mm256_add_epi32(_mm256_madd_epi16(v0, _mm256_load_si256((const __m256i *)xv)),
                                     _mm256_madd_epi16(v1, _mm256_load_si256((const __m256i *)(xv + 16))));
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d), acc[r][c]);
                if (has_min) /* one rounding, as the decode kernels do it */
                    macc[r][c] = _mm_cvtss_f32(_mm_fmadd_ss(
                        _mm_set_ss(m), _mm_set_ss(xsv[c][2 * i] + xsv[c][2 * i + 1]),
                        _mm_set_ss(macc[r][c])));
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        y[c * ys + r] = cpu_x16_D(x + c * xs, k) * (hsum_ps(acc[r][c]) + macc[r][c]);
}
/* Packed rows hold int16 values for every legacy type: one kernel with and one without mins. */
#define PACKED_TILE(R, C, ...) legacy_tile(0, R, C, __VA_ARGS__)
#define PACKED_MIN_TILE(R, C, ...) legacy_tile(1, R, C, __VA_ARGS__)
TILE_DRIVER(packed_legacy, PACKED_TILE)
TILE_DRIVER(packed_legacy_min, PACKED_MIN_TILE)
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
/* ---- K-quant scales ---- */

/* Unpacks the 8 6-bit scales and mins of a Q4_K/Q5_K block into two 8 × i16 vectors. */
INLINE void q4k_scales_mins(const uint8_t *s12, __m128i *sc, __m128i *mn) {
    uint32_t a[3];
    memcpy(a, s12, 12);
    /* a[0]: sc0-3 (low 6) | hi2 of sc4-7; a[1]: m0-3 | hi2 of m4-7; a[2]: lo4 sc4-7 | lo4 m4-7 */
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
    __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
    return _mm256_cvtepi8_epi16(sc);
}

/* ---- K-quants, packed prefill path (one kernel for Q2_K..Q6_K) ----
 * Every K-quant super-block is rewritten as unsigned quants u in element order, a scale
 * sc and a "min" mn per group of 16, and two f32 factors, such that
 *     x[n] = d · sc[g] · u[n] - dm · mn[g],   g = n / 16
 * (Q4_K/Q5_K: sc, mn = the sub-block's 6-bit scale and min, dm = dmin; Q2_K likewise;
 *  Q6_K: u = q + 32 ... stored as q (0..63), mn = 32·sc, dm = d; Q3_K: u = q + 4, mn = 4·sc).
 * kp_unpack_block writes u[256] to o and returns sc and mn (16 × i16), d and dm. */
INLINE void kp_unpack_block(uint32_t t, const char *row, int64_t i, uint8_t *o, __m256i *sc_out,
                            __m256i *mn_out, float *d_out, float *dm_out) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256i sc16, mn16;
    float d, dm;
    switch (t) {
    case QT_Q4_K:
    case QT_Q5_K: {
        const uint8_t *qs, *scales, *qh = NULL;
        uint16_t hd, hm;
        if (t == QT_Q4_K) {
            const struct block_q4_K *b = (const struct block_q4_K *)row + i;
            qs = b->qs, scales = b->scales, hd = b->d, hm = b->dmin;
        } else {
            const struct block_q5_K *b = (const struct block_q5_K *)row + i;
            qs = b->qs, scales = b->scales, qh = b->qh, hd = b->d, hm = b->dmin;
        }
        __m128i sc, mn;
        q4k_scales_mins(scales, &sc, &mn);
        /* 8 values (i16) -> 16, each twice */
        sc16 = _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc));
        mn16 = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
        __m256i qhv = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            __m256i lo = _mm256_and_si256(raw, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (qh) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qhv, one), 4));
                qhv = _mm256_srli_epi16(qhv, 1);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(qhv, one), 4));
                qhv = _mm256_srli_epi16(qhv, 1);
            }
            _mm256_store_si256((__m256i *)(o + 64 * p), lo);
            _mm256_store_si256((__m256i *)(o + 64 * p + 32), hi);
        }
        d = f16(hd);
        dm = f16(hm);
        break;
    }
    case QT_Q6_K: {
        const struct block_q6_K *b = (const struct block_q6_K *)row + i;
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            uint8_t *oh = o + 128 * h;
            _mm256_store_si256((__m256i *)oh,
                               _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)));
            _mm256_store_si256((__m256i *)(oh + 32),
                               _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)));
            _mm256_store_si256((__m256i *)(oh + 64),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                               _mm256_and_si256(qh, m30)));
            _mm256_store_si256((__m256i *)(oh + 96),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)));
        }
        sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        mn16 = _mm256_slli_epi16(sc16, 5);
        d = dm = f16(b->d);
        break;
    }
    default: { /* Q2_K, Q3_K */
        const uint8_t *qs, *hm = NULL;
        if (t == QT_Q2_K) {
            const struct block_q2_K *b = (const struct block_q2_K *)row + i;
            __m128i raw = _mm_loadu_si128((const __m128i *)b->scales);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(15)));
            mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
            qs = b->qs;
            d = f16(b->d);
            dm = f16(b->dmin);
        } else {
            const struct block_q3_K *b = (const struct block_q3_K *)row + i;
            sc16 = q3k_scales16(b->scales);
            mn16 = _mm256_slli_epi16(sc16, 2);
            qs = b->qs;
            hm = b->hmask;
            d = dm = f16(b->d);
        }
        __m256i hv = hm ? _mm256_loadu_si256((const __m256i *)hm) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                __m256i q = _mm256_and_si256(raw, m3);
                raw = _mm256_srli_epi16(raw, 2);
                if (hm) {
                    __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
                    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hv, bit), bit);
                    q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(4)));
                }
                _mm256_store_si256((__m256i *)(o + 128 * h + 32 * s), q);
            }
        }
        break;
    }
    }
    *sc_out = sc16;
    *mn_out = mn16;
    *d_out = d;
    *dm_out = dm;
}


/* K-quant and IQ4_XS prefill against X16: the super-block as 16-bit sc·v (kp_unpack_block's u
 * and sc, offsets folded: Q6_K v = u - 32, Q3_K v = u - 4, the others v = u with their mins
 * kept as dmin·m per 16), so vpmaddwd does the dot with the 16-bit activations. The same
 * layout as the AVX-512 packing (K16_PACKED bytes): int16 w16[256] | float mf[16] | float d;
 * w16 in X16_K's chunk-lane order with mf even groups first (Q2_K..Q6_K, k16_tile with
 * G = 1), or in X16_32's quad-pair order per chunk (IQ4_XS, k16_tile with G = 2: two i32
 * accumulators per super-block, 16 products of <= 4064·16256 < 2^30 per lane each). */
#define K16_PACKED 640

/* IQ4_XS: w16 = (ls - 32) · codebook value, per sub-block of 32 (one chunk); no mins. */
INLINE void iq4_xs_k16_block(const char *row, int64_t i, char *p) {
    const struct block_iq4_xs *b = (const struct block_iq4_xs *)row + i;
    const __m256i tab =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl));
    for (int j = 0; j < 8; j++) {
        const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) | ((b->scales_h >> (2 * j)) & 3) << 4;
        const __m256i v = _mm256_shuffle_epi8(tab, nibbles_32(b->qs + 16 * j));
        const __m256i sc = _mm256_set1_epi16((short)(ls - 32));
        __m256i e0, e1;
        quadpairs(_mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), sc),
                  _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)), sc), &e0, &e1);
        _mm256_store_si256((__m256i *)(p + 64 * j), e0);
        _mm256_store_si256((__m256i *)(p + 64 * j + 32), e1);
    }
    const float d = f16(b->d);
    memset(p + 512, 0, 64);
    memcpy(p + 576, &d, 4);
}

/* The types whose prefill runs in chunk lanes (k16_tile with G = 1, X16_K); IQ4_XS keeps quad
 * lanes (G = 2, X16_32). Their decode kernels (cpu_gemv_avx2.c) follow. */
INLINE int k16_chunk_lanes(uint32_t t) {
    return t != QT_IQ4_XS;
}

INLINE void k16_pack_block(uint32_t t, const char *row, int64_t i, char *p) {
    if (t == QT_IQ4_XS) {
        iq4_xs_k16_block(row, i, p);
        return;
    }
    _Alignas(32) uint8_t u[256];
    _Alignas(32) int16_t sc[16];
    __m256i sc16, mn16;
    float d, dm;
    kp_unpack_block(t, row, i, u, &sc16, &mn16, &d, &dm);
    _mm256_store_si256((__m256i *)sc, sc16);
    const __m256i off = _mm256_set1_epi16((short)(t == QT_Q6_K ? 32 : t == QT_Q3_K ? 4 : 0));
    /* group g = 2l + h (elements 16g..16g+15) is row l of half h; the 8 × 8 dword
     * transpose of a half puts pair j of every group of the half into vector j: X16_K's
     * chunk-lane order (chunk_lanes) */
    for (int h = 0; h < 2; h++) {
        __m256i r[8];
        UNROLL
        for (int l = 0; l < 8; l++)
            r[l] = _mm256_mullo_epi16(
                _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_load_si128((const __m128i *)(u + 32 * l + 16 * h))), off),
                _mm256_set1_epi16(sc[2 * l + h]));
        cpu_tr8(r);
        UNROLL
        for (int j = 0; j < 8; j++)
            _mm256_store_si256((__m256i *)(p + 32 * (8 * h + j)), r[j]);
    }
    /* the groups' min factors dm·m[g] as X16_K's sums: even groups first (the same single
     * products as a scalar loop, which took about half of the AVX-512 pack's time) */
    if (t == QT_Q4_K || t == QT_Q5_K || t == QT_Q2_K) {
        const __m256i eo = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(mn16, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                       0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)),
            0xd8); /* m[0, 2, .., 14] | m[1, 3, .., 15] */
        const __m256 vd = _mm256_set1_ps(dm);
        _mm256_store_ps((float *)(p + 512),
                        _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(eo)))));
        _mm256_store_ps((float *)(p + 544),
                        _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(eo, 1)))));
    } else {
        memset(p + 512, 0, 64);
    }
    memcpy(p + 576, &d, 4);
}

INLINE size_t k16_bytes(int64_t k) {
    return (size_t)(k / 256) * K16_PACKED;
}

INLINE void k16_pack(uint32_t t, int64_t k, const void *w, size_t ws, int nr, int64_t b0,
                     int64_t b1, void *dst) {
    for (int r = 0; r < nr; r++)
        for (int64_t i = b0; i < b1; i++)
            k16_pack_block(t, (const char *)w + r * ws, i, (char *)dst + r * k16_bytes(k) + i * K16_PACKED);
}

/* The packed K-quant/IQ4_XS product: G int32 sums per (row, column) and super-block, each
 * followed by one FMA with d, then the mins, then D times hsum_ps:
 *   G = 1, chunk lanes (X16_K, the K16_PACKED bytes in the same order: Q2_K..Q6_K): lane λ
 *          sums chunk λ of the super-block exactly in int32 (32 products of |sc·v| <= 4096
 *          and |x| <= 16256: < 2^31), one FMA with d, then the mins of the chunk's two
 *          groups (even, odd). The decode kernel reproduces it per row (cpu_gemv_avx2.c
 *          gemv_kc).
 *   G = 2, quad lanes (X16_32: IQ4_XS): lane λ of half h sums quad λ of each chunk of the
 *          half (8 vectors); two FMAs per super-block and lane.
 * A tile is R <= 4 rows × C <= 2 columns over super-blocks [i0, i1). In a super-block each X
 * vector is loaded once for the R rows (gcc folds the weight vector into each vpmaddwd as a
 * memory operand: no slower than a register here), and the R·C int32 sums are registers (a row-outer loop, before 2026-12-04, loaded X again for
 * every row: 12 loads per 8 vpmaddwd instead of 6, and ran ~20% slower). The f32
 * accumulators pass through acc[c][r] between slices of K16_SB super-blocks, so that an
 * R-row slice of the packed weights (R · K16_SB · 640 bytes) stays in L1 while the columns
 * sweep it; the first slice starts from zero registers and the last writes y from its
 * registers (zeroing the array first and writing y from it after the slices cost ~3% at
 * 1B-shape prefill, 2026-12-06). Integer sums are exact in any order, and each output gets
 * the same FMAs in the same order however the loops are cut: the bits do not depend on the
 * tiling. */
#define K16_SB 8  /* up to this many super-blocks (4 rows: 20 KiB), one slice; more: slices of half */
#define K16_NC 32 /* columns per block (their accumulators: 4 KiB) */
INLINE void k16_tile(int has_min, int G, int R, int C, int64_t k, int64_t i0, int64_t i1,
                     const char *w, size_t ws, const char *x, size_t xs, float (*accp)[4][8], float *y,
                     size_t ys) {
    __m256 acc[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        acc[r][c] = i0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(accp[c][r]);
    for (int64_t i = i0; i < i1; i++) {
        const char *wi = w + i * K16_PACKED, *xi = x + 512 * i;
        /* a base pointer per row and column, so that every load below is base + constant
         * (gcc otherwise keeps xi + xs + 32j per j on the stack: a GPR load per vector) */
        const char *wr[4], *xc[2];
        UNROLL
        for (int r = 0; r < R; r++)
            wr[r] = wi + r * ws;
        UNROLL
        for (int c = 0; c < C; c++) {
            xc[c] = xi + c * xs;
            __asm__("" : "+r"(xc[c]));
        }
        UNROLL
        for (int h = 0; h < G; h++) {
            __m256i a[4][2];
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
            for (int c = 0; c < C; c++)
                a[r][c] = _mm256_setzero_si256();
            _Pragma("GCC unroll 16")
            for (int j = 16 / G * h; j < 16 / G * (h + 1); j++) {
                __m256i xv[2];
                UNROLL
                for (int c = 0; c < C; c++)
                    xv[c] = _mm256_load_si256((const __m256i *)(xc[c] + 32 * j));
                UNROLL
                for (int r = 0; r < R; r++) {
                    const __m256i wv = _mm256_load_si256((const __m256i *)(wr[r] + 32 * j));
                    UNROLL
                    for (int c = 0; c < C; c++) {
                        a[r][c] = _mm256_add_epi32(a[r][c], _mm256_madd_epi16(wv, xv[c]));
                        /* the empty asm keeps each sum a chain (gcc otherwise reassociates
                         * the integer adds into trees and spills them) */
                        __asm__("" : "+x"(a[r][c]));
                    }
                }
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                float d;
                memcpy(&d, wi + r * ws + 576, 4);
                const __m256 vd = _mm256_set1_ps(d);
                UNROLL
                for (int c = 0; c < C; c++)
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][c]), vd, acc[r][c]);
            }
        }
        if (has_min) {
            UNROLL
            for (int r = 0; r < R; r++) {
                const char *p = wi + r * ws;
                UNROLL
                for (int c = 0; c < C; c++) {
                    const float *sv = cpu_x16_sv(x + c * xs, k) + 16 * i;
                    acc[r][c] = _mm256_fnmadd_ps(_mm256_load_ps((const float *)(p + 512)),
                                                 _mm256_loadu_ps(sv), acc[r][c]);
                    acc[r][c] = _mm256_fnmadd_ps(_mm256_load_ps((const float *)(p + 544)),
                                                 _mm256_loadu_ps(sv + 8), acc[r][c]);
                }
            }
        }
    }
    if (i1 == k / 256) { /* the last slice: the outputs */
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
        for (int c = 0; c < C; c++)
            y[c * ys + r] = cpu_x16_D(x + c * xs, k) * hsum_ps(acc[r][c]);
        return;
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
    for (int c = 0; c < C; c++)
        _mm256_store_ps(accp[c][r], acc[r][c]);
}

/* Walks k16_tile over an nr × nc request: column blocks of K16_NC, slices of K16_SB
 * super-blocks, 4×2 tiles (1×1 for fewer than 4 rows). */
INLINE void k16_gemm(int has_min, int G, int64_t k, const char *w, size_t ws, const char *x,
                     size_t xs, float *y, size_t ys, int nr, int nc) {
    _Alignas(32) float acc[K16_NC][4][8];
    const int64_t nsb = k / 256, sb = nsb <= K16_SB ? nsb : K16_SB / 2;
    for (int c0 = 0; c0 < nc; c0 += K16_NC) {
        const int n = nc - c0 < K16_NC ? nc - c0 : K16_NC;
        const char *xc = x + c0 * xs;
        float *yc = y + c0 * ys;
        for (int64_t i0 = 0; i0 < nsb; i0 += sb) {
            const int64_t i1 = i0 + sb < nsb ? i0 + sb : nsb;
            if (nr == 4) {
                int c = 0;
                for (; c + 2 <= n; c += 2)
                    k16_tile(has_min, G, 4, 2, k, i0, i1, w, ws, xc + c * xs, xs, acc + c, yc + c * ys, ys);
                if (c < n) k16_tile(has_min, G, 4, 1, k, i0, i1, w, ws, xc + c * xs, xs, acc + c, yc + c * ys, ys);
            } else {
                for (int r = 0; r < nr; r++)
                    for (int c = 0; c < n; c++)
                        k16_tile(has_min, G, 1, 1, k, i0, i1, w + r * ws, ws, xc + c * xs, xs,
                                 (float (*)[4][8])acc[c][r], yc + c * ys + r, ys);
            }
        }
    }
}
#define K16_GEMM(name, has_min, G)                                                                 \
    static void gemm_packed_##name(int64_t k, const void *w, size_t ws, const void *x, size_t xs, \
                                   float *y, size_t ys, int nr, int nc) {                         \
        k16_gemm(has_min, G, k, w, ws, x, xs, y, ys, nr, nc);                                      \
    }
K16_GEMM(k16c, 0, 1)
K16_GEMM(k16c_min, 1, 1)
K16_GEMM(k16, 0, 2)
#define KP_FNS(name, T)                                                                            \
    static void pack_##name(int64_t k, const void *w, size_t ws, int nr, int64_t b0, int64_t b1,  \
                            void *dst) {                                                           \
        k16_pack(T, k, w, ws, nr, b0, b1, dst);                                                    \
    }
KP_FNS(q2_K, QT_Q2_K)
KP_FNS(q3_K, QT_Q3_K)
KP_FNS(q4_K, QT_Q4_K)
KP_FNS(q5_K, QT_Q5_K)
KP_FNS(q6_K, QT_Q6_K)
KP_FNS(iq4_xs, QT_IQ4_XS)
static size_t packed_bytes_k16(int64_t k) {
    return k16_bytes(k);
}

void cpu_kernels_avx2(struct cpu_kernel tab[QT_COUNT]) {
    tab[QT_F32] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f32};
    tab[QT_F16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f16};
    tab[QT_BF16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_bf16};
#define LEGACY(T, name, ptile)                                                                     \
    tab[T] = (struct cpu_kernel){.act = CPU_ACT_X16_32,                                            \
                                 .pack = pack_##name,                                              \
                                 .packed_row_bytes = packed_bytes_##name,                          \
                                 .gemm_packed = ptile}
    LEGACY(QT_Q8_0, q8_0, gemm_packed_legacy);
    LEGACY(QT_Q4_0, q4_0, gemm_packed_legacy);
    LEGACY(QT_Q4_1, q4_1, gemm_packed_legacy_min);
    LEGACY(QT_Q5_0, q5_0, gemm_packed_legacy);
    LEGACY(QT_Q5_1, q5_1, gemm_packed_legacy_min);
    LEGACY(QT_IQ4_NL, iq4_nl, gemm_packed_legacy);
    LEGACY(QT_MXFP4, mxfp4, gemm_packed_legacy);
#undef LEGACY
#define KQUANT(T, name, ptile)                                                                     \
    tab[T] = (struct cpu_kernel){.act = k16_chunk_lanes(T) ? CPU_ACT_X16_K : CPU_ACT_X16_32,      \
                                 .pack = pack_##name,                                              \
                                 .packed_row_bytes = packed_bytes_k16,                             \
                                 .gemm_packed = ptile}
    KQUANT(QT_Q2_K, q2_K, gemm_packed_k16c_min);
    KQUANT(QT_Q3_K, q3_K, gemm_packed_k16c);
    KQUANT(QT_Q4_K, q4_K, gemm_packed_k16c_min);
    KQUANT(QT_Q5_K, q5_K, gemm_packed_k16c_min);
    KQUANT(QT_Q6_K, q6_K, gemm_packed_k16c);
    KQUANT(QT_IQ4_XS, iq4_xs, gemm_packed_k16);
#undef KQUANT
    cpu_kernels_iq_avx2(tab);
}
#endif

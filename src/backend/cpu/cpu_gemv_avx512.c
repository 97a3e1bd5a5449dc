/* AVX-512 decode kernels on repacked weights (G = 16 rows per group, cpu_kernels.h
 * "Repacked weights"), the fast repack/unrepack transposes, and the activation quantizers
 * that go with them.
 *
 * Lane = row. In a 4-byte section one zmm load gives 4 consecutive bytes of each of the
 * 16 rows, so a vpdpbusd / vpmaddubsw against 4 activation bytes broadcast to every lane
 * computes 16 rows' partial dots at once, the rows' f16 scales convert with one vcvtph2ps,
 * and there is no horizontal reduction per block.
 *
 * Bitwise batch invariance. Each kernel reproduces, per row, the arithmetic of the packed
 * prefill kernel of cpu_matmul_avx512.c for the same type: the prefill keeps 16 f32 lane
 * accumulators per (row, X row), each fed per block by an exact integer sum over a fixed
 * set of elements (lane λ: the 4 consecutive elements 4λ..4λ+3 of each 64-element chunk
 * for the K-quants, through X16Q; of each 32-element block for the legacy types), then
 * reduces the 16 lanes in a fixed tree (cpu_hsum16 order). Here acc[λ] is a zmm whose lane
 * r is row r's accumulator λ: the same exact integers (computed another way: two 8-bit
 * planes and vpmaddubsw/vpdpwssd instead of 16-bit products), the same f32 FMAs in the same
 * order, the same tree done vertically. So a row's result does not depend on whether it
 * ran alone (decode) or in a batch (prefill), nor on the ISA's choice of path.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gemv_pf.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_tr16_avx512.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define GR 16 /* rows per group */

/* ---- 16 × 16 dword transposes: repack and unrepack ---- */


/* Copies blocks b0..b1-1 of nr rows between the file layout (row r at w + r*ws) and one
 * group, to_group or back; 4-byte sections by 16 x 16 dword transposes (unit j of the 16
 * rows to the line at its cpu_rp_slot), the f16/byte units by cpu_rp_small. Rows
 * nr..15 of the group are zeroed on the way in. */
INLINE void rp_copy16(uint32_t type, int64_t b0, int64_t b1, char *w, size_t ws, char *grp,
                      int nr, int to_group) {
    struct cpu_rp_layout lay;
    const struct qtype_info *qi = qtype_get(type);
    if (!qi || !cpu_rp_layout(type, &lay)) return;
    const size_t bb = qi->type_size, tile = GR * bb;
    for (int64_t b = b0; b < b1; b++) {
        for (int s = 0; s < lay.n; s++) {
            const struct cpu_rp_sec *sc = &lay.sec[s];
            char *base = grp + (size_t)b * tile + (size_t)GR * sc->off;
            char *row0 = w + b * bb + sc->off;
            if (sc->unit == 2) {
                cpu_rp_small(GR, 2, sc->len, base, row0, ws, nr, to_group);
                continue;
            }
            if (sc->unit == 1) {
                cpu_rp_small(GR, 1, sc->len, base, row0, ws, nr, to_group);
                continue;
            }
            const int n4 = sc->len / 4;
            for (int j0 = 0; j0 < n4; j0 += 16) {
                const int m = n4 - j0 < 16 ? n4 - j0 : 16;
                const __mmask16 mk = (__mmask16)((1u << m) - 1);
                /* unrolled with the bounds as conditions, so v stays in registers */
                __m512i v[16];
                UNROLL
                for (int i = 0; i < 16; i++) {
                    if (to_group) /* v[r] = row r */
                        v[i] = i < nr ? _mm512_maskz_loadu_epi32(mk, row0 + i * ws + 4 * j0)
                                      : _mm512_setzero_si512();
                    else /* v[j] = unit j of the 16 rows */
                        v[i] = _mm512_maskz_loadu_epi32(
                            i < m ? 0xffff : 0, base + (size_t)cpu_rp_slot(type, GR, j0 + i) * 64);
                }
                cpu_tr16(v);
                UNROLL
                for (int i = 0; i < 16; i++) {
                    if (to_group) {
                        if (i < m)
                            _mm512_storeu_si512(
                                (void *)(base + (size_t)cpu_rp_slot(type, GR, j0 + i) * 64), v[i]);
                    } else if (i < nr) {
                        _mm512_mask_storeu_epi32(row0 + i * ws + 4 * j0, mk, v[i]);
                    }
                }
            }
        }
    }
}

static void rp_pack16(uint32_t type, int64_t k, const void *w, size_t ws, int nr, void *dst) {
    rp_copy16(type, 0, k / qtype_get(type)->blck_size, (char *)w, ws, dst, nr, 1);
}

static void rp_unpack16(uint32_t type, const void *grp, int nr, int64_t b0, int64_t b1, void *dst,
                        size_t ds) {
    rp_copy16(type, b0, b1, dst, ds, (char *)grp, nr, 0);
}

/* ---- activation quantizers (same bytes as cpu_q8.c) ---- */

INLINE float row_amax(const float *x, int64_t k) {
    __m512 m = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    if (i < k)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps((__mmask16)((1u << (k - i)) - 1), x + i)));
    return _mm512_reduce_max_ps(m);
}

/* v of 16 elements (cpu_q8.c's act_v: f32 product, clamp, round half to even). */
INLINE __m512i act_v16(const float *x, __m512 vid) {
    const __m512 lim = _mm512_set1_ps((float)CPU_ACT_VMAX);
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x), vid);
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
    return _mm512_cvtps_epi32(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

INLINE float hsum_epi32_f(__m512i v) {
    return (float)_mm512_reduce_add_epi32(v);
}

void cpu_quantize_x16_64_avx512(const float *x, void *q, int64_t k) {
    int16_t *v16 = q;
    float *sv = (float *)(v16 + k);
    float amax = row_amax(x, k);
    const __m512 vid = _mm512_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    /* position 2s + e (s = 2λ..) of output h takes element 4λ + 2h + e of the chunk */
    const __m512i i0 = _mm512_set_epi16(61, 60, 57, 56, 53, 52, 49, 48, 45, 44, 41, 40, 37, 36, 33,
                                        32, 29, 28, 25, 24, 21, 20, 17, 16, 13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(2));
    int64_t c = 0;
    for (; c + 64 <= k; c += 64) {
        __m512i v[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
            v[j] = act_v16(x + c + 16 * j, vid);
            sv[c / 16 + j] = hsum_epi32_f(v[j]);
        }
        __m512i a = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(v[0])),
                                       _mm512_cvtepi32_epi16(v[1]), 1);
        __m512i b = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(v[2])),
                                       _mm512_cvtepi32_epi16(v[3]), 1);
        _mm512_storeu_si512((void *)(v16 + c), _mm512_permutex2var_epi16(a, i0, b));
        _mm512_storeu_si512((void *)(v16 + c + 32), _mm512_permutex2var_epi16(a, i1, b));
    }
    if (c < k) { /* a last chunk of 32 (the legacy types' odd block): X16_32's order */
        __m512i v[2];
        int32_t t[32];
        for (int j = 0; j < 2; j++) {
            v[j] = act_v16(x + c + 16 * j, vid);
            sv[c / 16 + j] = hsum_epi32_f(v[j]);
            _mm512_storeu_si512((void *)(t + 16 * j), v[j]);
        }
        cpu_x16_order32(t, v16 + c);
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

void cpu_quantize_xk_avx512(const float *x, void *q, int64_t k) {
    const size_t kp = cpu_x2_kp(k);
    int8_t *hq = q, *lq = (int8_t *)q + kp;
    int16_t *p2 = (int16_t *)((char *)q + 2 * kp);
    float *sv = (float *)((char *)q + 2 * kp + (size_t)k);
    float amax = row_amax(x, k);
    const __m512 vid = _mm512_set1_ps(amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f);
    const __m512i c64 = _mm512_set1_epi32(64);
    for (int64_t i = 0; i < k; i += 16) {
        __m512i v = act_v16(x + i, vid);
        __m512i h = _mm512_srai_epi32(_mm512_add_epi32(v, c64), 7);
        __m512i l = _mm512_sub_epi32(v, _mm512_slli_epi32(h, 7));
        _mm_storeu_si128((__m128i *)(hq + i), _mm512_cvtepi32_epi8(h));
        _mm_storeu_si128((__m128i *)(lq + i), _mm512_cvtepi32_epi8(l));
        /* pair sums: v[2j] + v[2j+1] */
        __m512i pr = _mm512_add_epi32(v, _mm512_srli_epi64(v, 32));
        _mm_storeu_si128((__m128i *)(p2 + i / 2), _mm512_cvtepi64_epi16(pr));
        sv[i / 16] = hsum_epi32_f(v);
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

/* ---- shared pieces of the kernels ---- */

/* Vertical cpu_hsum16 tree: lane r of the result is row r's reduction of acc[0..15]. */
INLINE __m512 tree16(const __m512 a[16]) {
    __m512 s[8], t[4];
    UNROLL
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(a[i + 8], a[i]);
    UNROLL
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_ps(s[i + 4], s[i]);
    __m512 u0 = _mm512_add_ps(t[0], t[2]), u1 = _mm512_add_ps(t[1], t[3]);
    return _mm512_add_ps(u0, u1);
}

INLINE void store_rows(float *y, __m512 v, int nr) {
    if (nr >= 16)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), v);
}

INLINE __m512i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* ---- Q4_K ----
 * Tile (2304 bytes): d[16] f16 @0 | dmin[16] @32 | dwords j of 16 rows @64 + 64 slot(j)
 * (cpu_rp_slot: the order the passes read them): j = 0..2 the 12 scale bytes, j = 3 + u
 * the qs bytes 4u..4u+3 (u = 8p + μ: elements 64p + 4μ.. in the low nibbles, 64p + 32 +
 * 4μ.. in the high nibbles).
 * Lane λ = μ (low) / μ + 8 (high) of the prefill sums quad λ of each 64-chunk p, with the
 * sub-block scale of Z = 2p (low) / 2p + 1 (high). */
INLINE void q4k_scales(const char *tile, __m512i S[8], __m512 mf[8], __m512 *d16) {
    *d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
    const __m512i s0 = _mm512_loadu_si512((const void *)(tile + 64));
    const __m512i s1 = _mm512_loadu_si512((const void *)(tile + 128));
    const __m512i s2 = _mm512_loadu_si512((const void *)(tile + 192));
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m48 = _mm512_set1_epi32(48);
    UNROLL
    for (int z = 0; z < 4; z++) {
        __m512i sc = _mm512_and_si512(_mm512_srli_epi32(s0, 8 * z), m63);
        __m512i mn = _mm512_and_si512(_mm512_srli_epi32(s1, 8 * z), m63);
        __m512i sc4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 8 * z), m15),
                                      _mm512_and_si512(_mm512_srli_epi32(s0, 8 * z + 2), m48));
        __m512i mn4 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 8 * z + 4), m15),
                                      _mm512_and_si512(_mm512_srli_epi32(s1, 8 * z + 2), m48));
        S[z] = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
        S[z + 4] = _mm512_or_si512(sc4, _mm512_slli_epi32(sc4, 16));
        mf[z] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn));
        mf[z + 4] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn4));
    }
}

/* Line of unit j of a 16-row tile's 4-byte section (at byte sec of the tile). */
INLINE const void *unit16(uint32_t t, const char *tile, int sec, int j) {
    return tile + sec + 64 * cpu_rp_slot(t, GR, j);
}

/* Q5_K is Q4_K plus the fifth bit. Tile (2816 bytes): d @0 | dmin @32 | dwords @64 + 64
 * slot(j): j = 0..2 scales, 3..10 qh (qh[4u'..]), 11 + u qs as Q4_K. Element 64p + 32t + 4μ
 * + e has its fifth bit in qh[4μ + e], bit 2p + t.
 * pf: the software prefetch of the tiles ahead (enum gemv_pf in cpu_gemv_pf.h; gemv_pf_mode). */
INLINE void gemv_q45(int q5, int pf, int64_t k, const void *grp, const void *x, size_t xs, float *y,
                     size_t ys, int nr, int nc) {
    const uint32_t t = q5 ? QT_Q5_K : QT_Q4_K;
    const size_t tile_bytes = GR * (q5 ? sizeof(struct block_q5_K) : sizeof(struct block_q4_K));
    const size_t ahead = pf_ahead(tile_bytes);
    const __m512i m4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16);
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const float *sv = cpu_xk_sv(xc, k);
        __m512 acc[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *tile = (const char *)grp + i * tile_bytes;
            _Alignas(64) __m512i S[8];
            _Alignas(64) __m512 mf[8];
            __m512 d16;
            q4k_scales(tile, S, mf, &d16);
            const int8_t *hb = hi + 256 * i, *lb = lo + 256 * i;
            UNROLL
            for (int mu = 0; mu < 8; mu++) {
                if (pf) gemv_prefetch_lines(tile, tile_bytes, ahead, mu, 8, pf == PF_TWO);
                const __m512i hv =
                    q5 ? _mm512_loadu_si512(unit16(t, tile, 64, 3 + mu)) : _mm512_setzero_si512();
                __m512i ah0 = _mm512_setzero_si512(), al0 = ah0, ah1 = ah0, al1 = ah0;
                UNROLL
                for (int p = 0; p < 4; p++) {
                    __m512i raw =
                        _mm512_loadu_si512(unit16(t, tile, 64, (q5 ? 11 : 3) + 8 * p + mu));
                    __m512i w0 = _mm512_and_si512(raw, m4);
                    __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                    if (q5) {
                        w0 = _mm512_mask_add_epi8(
                            w0, _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(1 << (2 * p)))), w0, b4);
                        w1 = _mm512_mask_add_epi8(
                            w1, _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(2 << (2 * p)))), w1, b4);
                    }
                    const int e0 = 64 * p + 4 * mu, e1 = e0 + 32;
                    ah0 = _mm512_dpwssd_epi32(ah0, _mm512_maddubs_epi16(w0, bcast4(hb + e0)), S[2 * p]);
                    al0 = _mm512_dpwssd_epi32(al0, _mm512_maddubs_epi16(w0, bcast4(lb + e0)), S[2 * p]);
                    ah1 = _mm512_dpwssd_epi32(ah1, _mm512_maddubs_epi16(w1, bcast4(hb + e1)),
                                              S[2 * p + 1]);
                    al1 = _mm512_dpwssd_epi32(al1, _mm512_maddubs_epi16(w1, bcast4(lb + e1)),
                                              S[2 * p + 1]);
                }
                __m512i i0 = _mm512_add_epi32(_mm512_slli_epi32(ah0, 7), al0);
                __m512i i1 = _mm512_add_epi32(_mm512_slli_epi32(ah1, 7), al1);
                acc[mu] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), d16, acc[mu]);
                acc[mu] = _mm512_fnmadd_ps(mf[mu / 2], _mm512_set1_ps(sv[16 * i + mu]), acc[mu]);
                acc[mu + 8] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), d16, acc[mu + 8]);
                acc[mu + 8] =
                    _mm512_fnmadd_ps(mf[(mu + 8) / 2], _mm512_set1_ps(sv[16 * i + mu + 8]), acc[mu + 8]);
            }
        }
        store_rows(y + c * ys, _mm512_mul_ps(_mm512_set1_ps(cpu_xk_D(xc, k)), tree16(acc)), nr);
    }
}

PF_GEMV(q4_K, gemv_q45, 0)
PF_GEMV(q5_K, gemv_q45, 1)

/* ---- Q6_K ----
 * Tile (3360 bytes): dwords @64 slot(j): j = 0..31 ql (ql[4u..], u = 16h + 8a + μ), 32..47
 * qh (qh[4u'..], u' = 8h + μ), 48..51 the 16 int8 scales; d[16] f16 @3328.
 * Lane λ = 8a + μ, chunk t = 2h + b: the quad's low 4 bits are nibble b of ql unit
 * 16h + 8a + μ, its high 2 bits bits 2s (s = a + 2b) of qh unit 8h + μ, its scale group
 * g = 8h + 2s + μ/4; v = q - 32 (the -32 through the pair sums of X).
 * The lanes run μ-major (λ = μ, then 8 + μ, which read the same two qh units), so that with
 * cpu_rp_slot's order the passes read the tile's lines front to back. Each lane's f32
 * accumulator still takes one FMA a super-block, in super-block order: the order of the
 * lanes within a super-block does not change a bit. */
INLINE void gemv_q6(uint32_t ty, int pf, int64_t k, const void *grp, const void *x, size_t xs,
                    float *y, size_t ys, int nr, int nc) {
    const size_t tile_bytes = GR * sizeof(struct block_q6_K);
    const size_t ahead = pf_ahead(tile_bytes);
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const int16_t *p2 = cpu_xk_p2(xc, k);
        __m512 acc[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *tile = (const char *)grp + i * tile_bytes;
            _Alignas(64) __m512i S[16];
            UNROLL
            for (int q = 0; q < 4; q++) {
                __m512i sd = _mm512_loadu_si512(unit16(ty, tile, 0, 48 + q));
                UNROLL
                for (int b = 0; b < 4; b++) {
                    __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(sd, 24 - 8 * b), 24);
                    S[4 * q + b] = _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xffff)),
                                                   _mm512_slli_epi32(sc, 16));
                }
            }
            const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 3328)));
            const int8_t *hb = hi + 256 * i, *lb = lo + 256 * i;
            const int16_t *pb = p2 + 128 * i;
            UNROLL
            for (int mu = 0; mu < 8; mu++)
                UNROLL
            for (int a = 0; a < 2; a++) {
                const int lam = 8 * a + mu;
                if (pf) gemv_prefetch_lines(tile, tile_bytes, ahead, 2 * mu + a, 16, pf == PF_TWO);
                __m512i ah = _mm512_setzero_si512(), al = ah, cr = ah;
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m512i ql = _mm512_loadu_si512(unit16(ty, tile, 0, 16 * h + 8 * a + mu));
                    const __m512i qh = _mm512_loadu_si512(unit16(ty, tile, 0, 32 + 8 * h + mu));
                    UNROLL
                    for (int b = 0; b < 2; b++) {
                        const int s = a + 2 * b, t = 2 * h + b, g = 8 * h + 2 * s + mu / 4;
                        __m512i lo4 = b ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4)
                                        : _mm512_and_si512(ql, m4);
                        __m512i hi2 = 2 * s >= 4 ? _mm512_srli_epi16(qh, 2 * s - 4)
                                                 : _mm512_slli_epi16(qh, 4 - 2 * s);
                        __m512i q = _mm512_or_si512(lo4, _mm512_and_si512(hi2, m30));
                        const int e = 64 * t + 4 * lam;
                        ah = _mm512_dpwssd_epi32(ah, _mm512_maddubs_epi16(q, bcast4(hb + e)), S[g]);
                        al = _mm512_dpwssd_epi32(al, _mm512_maddubs_epi16(q, bcast4(lb + e)), S[g]);
                        cr = _mm512_dpwssd_epi32(cr, bcast4(pb + e / 2), S[g]);
                    }
                }
                __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ah, 7), al),
                                                _mm512_slli_epi32(cr, 5));
                acc[lam] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d16, acc[lam]);
            }
        }
        store_rows(y + c * ys, _mm512_mul_ps(_mm512_set1_ps(cpu_xk_D(xc, k)), tree16(acc)), nr);
    }
}
PF_GEMV(q6_K, gemv_q6, QT_Q6_K)

/* ---- IQ4_XS ----
 * Tile (2176 bytes): d[16] @0 | scales_h[16] @32 | dwords @64 + 64j: j = 0 scales_l, 1 + u
 * qs[4u..4u+3] (u = 4Z + m: elements 32Z + 4m.. low nibbles, 32Z + 16 + 4m.. high).
 * Lane λ, chunk t: sub-block Z = 2t + λ/8, nibble (λ%8)/4 of unit 4Z + λ%4. Values are the
 * signed codebook: |v| · (x negated where v < 0), as vpmaddubsw wants an unsigned side. */
static void gemv_iq4_xs(int64_t k, const void *grp, const void *x, size_t xs, float *y, size_t ys,
                        int nr, int nc) {
    const size_t tile_bytes = GR * sizeof(struct block_iq4_xs);
    const size_t ahead = pf_ahead(tile_bytes);
    const __m512i m4 = _mm512_set1_epi8(15), b8 = _mm512_set1_epi8(8);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_abs_epi8(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl)));
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        __m512 acc[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *tile = (const char *)grp + i * tile_bytes;
            gemv_prefetch(tile, tile_bytes, ahead);
            _Alignas(64) __m512i S[8];
            const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(tile + 32)));
            const __m512i sl = _mm512_loadu_si512((const void *)(tile + 64));
            UNROLL
            for (int z = 0; z < 8; z++) {
                __m512i ls = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32(sl, 4 * z), _mm512_set1_epi32(15)),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * z), _mm512_set1_epi32(3)), 4));
                ls = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                S[z] = _mm512_or_si512(_mm512_and_si512(ls, _mm512_set1_epi32(0xffff)),
                                       _mm512_slli_epi32(ls, 16));
            }
            const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
            const char *qs = tile + 128;
            const int8_t *hb = hi + 256 * i, *lb = lo + 256 * i;
            UNROLL
            for (int lam = 0; lam < 16; lam++) {
                __m512i ah = _mm512_setzero_si512(), al = ah;
                UNROLL
                for (int t = 0; t < 4; t++) {
                    const int z = 2 * t + lam / 8, nib = (lam % 8) / 4;
                    __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * (4 * z + lam % 4)));
                    __m512i idx = nib ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4)
                                      : _mm512_and_si512(raw, m4);
                    __m512i av = _mm512_shuffle_epi8(tab, idx);
                    __mmask64 neg = _mm512_testn_epi8_mask(idx, b8);
                    const int e = 64 * t + 4 * lam;
                    __m512i xh = bcast4(hb + e), xl = bcast4(lb + e);
                    xh = _mm512_mask_sub_epi8(xh, neg, _mm512_setzero_si512(), xh);
                    xl = _mm512_mask_sub_epi8(xl, neg, _mm512_setzero_si512(), xl);
                    ah = _mm512_dpwssd_epi32(ah, _mm512_maddubs_epi16(av, xh), S[z]);
                    al = _mm512_dpwssd_epi32(al, _mm512_maddubs_epi16(av, xl), S[z]);
                }
                __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(ah, 7), al);
                acc[lam] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d16, acc[lam]);
            }
        }
        store_rows(y + c * ys, _mm512_mul_ps(_mm512_set1_ps(cpu_xk_D(xc, k)), tree16(acc)), nr);
    }
}

/* ---- Q2_K and Q3_K: 2-bit quants, 16 groups of 16 ----
 * Element n = 128h + 32s + e: bits 2s of qs[32h + e] (qs unit 8h + μ for e = 4μ..), group
 * g = 8h + 2s + μ/4; lane λ = 8a + μ, chunk t = 2h + b with s = a + 2b.
 * Q2_K tile (1344 bytes): dwords @64j: j = 0..3 scales (low nibble scale, high nibble min
 * of group g in byte g), 4..19 qs; d[16] @1280, dmin[16] @1312.
 * Q3_K tile (1760 bytes): dwords @64j: j = 0..7 hmask (bit 4h + s of hmask[e] is the
 * third bit), 8..23 qs, 24..26 scales (cpu_q3k_scales packing); d[16] @1728; v = q - 4
 * (the -4 through the pair sums of X). */
INLINE __m512i pair16(__m512i sc) {
    return _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(sc, 16));
}

INLINE __m512i byte_of(__m512i d, int b) {
    return _mm512_and_si512(_mm512_srli_epi32(d, 8 * b), _mm512_set1_epi32(255));
}

INLINE void gemv_q23(uint32_t t, int64_t k, const void *grp, const void *x, size_t xs, float *y,
                     size_t ys, int nr, int nc) {
    const int q3 = t == QT_Q3_K;
    const size_t tile_bytes = GR * (size_t)(q3 ? sizeof(struct block_q3_K) : sizeof(struct block_q2_K));
    const size_t ahead = pf_ahead(tile_bytes);
    const int qs_j = q3 ? 8 : 4;
    const __m512i m3 = _mm512_set1_epi8(3), b4 = _mm512_set1_epi8(4);
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const int16_t *p2 = cpu_xk_p2(xc, k);
        const float *sv = cpu_xk_sv(xc, k);
        __m512 acc[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *tile = (const char *)grp + i * tile_bytes;
            gemv_prefetch(tile, tile_bytes, ahead);
            _Alignas(64) __m512i S[16];
            _Alignas(64) __m512 mf[16];
            __m512 d16;
            if (q3) {
                const __m512i s0 = _mm512_loadu_si512((const void *)(tile + 64 * 24));
                const __m512i s1 = _mm512_loadu_si512((const void *)(tile + 64 * 25));
                const __m512i s2 = _mm512_loadu_si512((const void *)(tile + 64 * 26));
                UNROLL
                for (int g = 0; g < 16; g++) {
                    __m512i lb = byte_of(g % 8 < 4 ? s0 : s1, g % 4);
                    __m512i low = g < 8 ? _mm512_and_si512(lb, _mm512_set1_epi32(15))
                                        : _mm512_srli_epi32(lb, 4);
                    __m512i high = _mm512_and_si512(_mm512_srli_epi32(byte_of(s2, g % 4), 2 * (g / 4)),
                                                    _mm512_set1_epi32(3));
                    S[g] = pair16(_mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)),
                                                   _mm512_set1_epi32(32)));
                }
                d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 1728)));
            } else {
                const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 1312)));
                UNROLL
                for (int q = 0; q < 4; q++) {
                    const __m512i sd = _mm512_loadu_si512((const void *)(tile + 64 * q));
                    UNROLL
                    for (int b = 0; b < 4; b++) {
                        __m512i by = byte_of(sd, b);
                        S[4 * q + b] = pair16(_mm512_and_si512(by, _mm512_set1_epi32(15)));
                        mf[4 * q + b] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(by, 4)));
                    }
                }
                d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 1280)));
            }
            const int8_t *hb = hi + 256 * i, *lb = lo + 256 * i;
            const int16_t *pb = p2 + 128 * i;
            UNROLL
            for (int a = 0; a < 2; a++)
                UNROLL
            for (int mu = 0; mu < 8; mu++) {
                const int lam = 8 * a + mu;
                __m512i ah = _mm512_setzero_si512(), al = ah, cr = ah;
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m512i raw = _mm512_loadu_si512((const void *)(tile + 64 * (qs_j + 8 * h + mu)));
                    const __m512i hm = q3 ? _mm512_loadu_si512((const void *)(tile + 64 * mu))
                                          : _mm512_setzero_si512();
                    UNROLL
                    for (int b = 0; b < 2; b++) {
                        const int s = a + 2 * b, tt = 2 * h + b, g = 8 * h + 2 * s + mu / 4;
                        __m512i q = _mm512_and_si512(_mm512_srli_epi16(raw, 2 * s), m3);
                        if (q3)
                            q = _mm512_mask_add_epi8(
                                q, _mm512_test_epi8_mask(hm, _mm512_set1_epi8((char)(1 << (4 * h + s)))),
                                q, b4);
                        const int e = 64 * tt + 4 * lam;
                        ah = _mm512_dpwssd_epi32(ah, _mm512_maddubs_epi16(q, bcast4(hb + e)), S[g]);
                        al = _mm512_dpwssd_epi32(al, _mm512_maddubs_epi16(q, bcast4(lb + e)), S[g]);
                        if (q3) cr = _mm512_dpwssd_epi32(cr, bcast4(pb + e / 2), S[g]);
                    }
                }
                __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(ah, 7), al);
                if (q3) isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(cr, 2));
                acc[lam] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d16, acc[lam]);
                if (!q3)
                    acc[lam] = _mm512_fnmadd_ps(mf[lam], _mm512_set1_ps(sv[16 * i + lam]), acc[lam]);
            }
        }
        store_rows(y + c * ys, _mm512_mul_ps(_mm512_set1_ps(cpu_xk_D(xc, k)), tree16(acc)), nr);
    }
}
static void gemv_q2_K(int64_t k, const void *grp, const void *x, size_t xs, float *y, size_t ys,
                      int nr, int nc) {
    gemv_q23(QT_Q2_K, k, grp, x, xs, y, ys, nr, nc);
}
static void gemv_q3_K(int64_t k, const void *grp, const void *x, size_t xs, float *y, size_t ys,
                      int nr, int nc) {
    gemv_q23(QT_Q3_K, k, grp, x, xs, y, ys, nr, nc);
}

/* ---- legacy 32-blocks against X2_32 ----
 * The packed prefill (x2_tile) keeps lanes 0..7 for the quads of even blocks and 8..15 for
 * odd ones, with u = v + 128 and, per quad, 128·(neg + Σu·hi) + Σu·lo = Σ v·x; an odd last
 * block goes to a scalar tail. Tiles: d[16] @0 (and m[16] @32 for Q4_1/Q5_1; MXFP4: the
 * 16 exponent bytes @0), then dwords @64j from the end of those: Q8_0 the 8 qs units;
 * Q4_0/IQ4_NL/Q4_1/MXFP4 the 4 qs units (low nibbles quads 0..3, high 4..7); Q5_0/Q5_1
 * qh then 4 qs units. */
INLINE int lg_min(uint32_t t) {
    return t == QT_Q4_1 || t == QT_Q5_1;
}

/* The 16 rows' block scales: f16 d, or MXFP4's E8M0 exponent as cpu_e8m0_half. */
INLINE __m512 lg_d16(uint32_t t, const char *tile) {
    if (t != QT_MXFP4) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)tile));
    __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 lt2 = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(lt2, big, tiny));
}

/* u = v + 128 of quad l (< 8) of the block's tile, 16 rows. */
INLINE __m512i lg_quad(uint32_t t, const char *tile, int l) {
    const char *q = tile + (t == QT_MXFP4 ? 16 : lg_min(t) ? 64 : 32);
    if (t == QT_Q8_0)
        return _mm512_xor_si512(_mm512_loadu_si512((const void *)(q + 64 * l)),
                                _mm512_set1_epi8((char)0x80));
    const int h5 = t == QT_Q5_0 || t == QT_Q5_1;
    __m512i raw = _mm512_loadu_si512((const void *)(q + 64 * (h5 + l % 4)));
    __m512i v = l < 4 ? _mm512_and_si512(raw, _mm512_set1_epi8(15))
                      : _mm512_and_si512(_mm512_srli_epi16(raw, 4), _mm512_set1_epi8(15));
    if (t == QT_IQ4_NL || t == QT_MXFP4)
        return _mm512_shuffle_epi8(
            _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(
                                 t == QT_MXFP4 ? cpu_kvalues_mxfp4 : cpu_kvalues_iq4nl))),
                             _mm512_set1_epi8((char)0x80)),
            v);
    if (h5) { /* bits 4l..4l+3 of each row's qh dword: byte l/2, nibble l%2 */
        const __m512i qh = _mm512_loadu_si512((const void *)q);
        const char b = (char)(l / 2);
        __m512i bc = _mm512_shuffle_epi8(
            qh, _mm512_set_epi8(12 + b, 12 + b, 12 + b, 12 + b, 8 + b, 8 + b, 8 + b, 8 + b, 4 + b,
                                4 + b, 4 + b, 4 + b, b, b, b, b, 12 + b, 12 + b, 12 + b, 12 + b,
                                8 + b, 8 + b, 8 + b, 8 + b, 4 + b, 4 + b, 4 + b, 4 + b, b, b, b, b,
                                12 + b, 12 + b, 12 + b, 12 + b, 8 + b, 8 + b, 8 + b, 8 + b, 4 + b,
                                4 + b, 4 + b, 4 + b, b, b, b, b, 12 + b, 12 + b, 12 + b, 12 + b,
                                8 + b, 8 + b, 8 + b, 8 + b, 4 + b, 4 + b, 4 + b, 4 + b, b, b, b, b));
        const int sh = 4 * (l % 2);
        __m512i bits = _mm512_set1_epi32((int)((1u << sh) | (2u << (sh + 8)) | (4u << (sh + 16)) |
                                               (8u << (sh + 24))));
        v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(bc, bits), v, _mm512_set1_epi8(16));
    }
    /* + 128 - offset: Q4_0 q - 8, Q5_0 q - 16, Q4_1/Q5_1 q */
    const char bias = t == QT_Q4_0 ? 120 : t == QT_Q5_0 ? 112 : (char)128;
    return _mm512_add_epi8(v, _mm512_set1_epi8(bias));
}

INLINE __m512i lg_dot(__m512i u, const int32_t *neg, const int8_t *hi, const int8_t *lo) {
    __m512i p = _mm512_dpbusd_epi32(_mm512_set1_epi32(*neg), u, bcast4(hi));
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(p, 7), u, bcast4(lo));
}

INLINE void gemv_legacy(uint32_t t, int pf, int64_t k, const void *grp, const void *x, size_t xs,
                        float *y, size_t ys, int nr, int nc) {
    const size_t tile_bytes = GR * blk_bytes(t);
    const size_t ahead = pf_ahead(tile_bytes);
    const int64_t nb = k / 32;
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const int32_t *neg = cpu_x2_neg(xc, k);
        const float *sv = cpu_x2_sv(xc, k);
        __m512 acc[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            UNROLL
            for (int e = 0; e < 2; e++) {
                const char *tile = (const char *)grp + (b + e) * tile_bytes;
                if (pf) gemv_prefetch_lines(tile, tile_bytes, ahead, 0, 1, pf == PF_TWO);
                const __m512 d16 = lg_d16(t, tile);
                UNROLL
                for (int l = 0; l < 8; l++) {
                    const int64_t q = 8 * (b + e) + l;
                    __m512i p = lg_dot(lg_quad(t, tile, l), neg + q, hi + 4 * q, lo + 4 * q);
                    acc[8 * e + l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d16, acc[8 * e + l]);
                }
                if (lg_min(t)) {
                    const __m512 m16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
                    acc[8 * e] = _mm512_fmadd_ps(m16, _mm512_set1_ps(sv[b + e]), acc[8 * e]);
                }
            }
        }
        __m512 tail = _mm512_setzero_ps();
        if (b < nb) {
            const char *tile = (const char *)grp + b * tile_bytes;
            __m512i is = _mm512_setzero_si512();
            UNROLL
            for (int l = 0; l < 8; l++) {
                const int64_t q = 8 * b + l;
                is = _mm512_add_epi32(is, lg_dot(lg_quad(t, tile, l), neg + q, hi + 4 * q, lo + 4 * q));
            }
            tail = _mm512_mul_ps(lg_d16(t, tile), _mm512_cvtepi32_ps(is));
            if (lg_min(t))
                tail = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32))),
                                       _mm512_set1_ps(sv[b]), tail);
        }
        __m512 r = _mm512_add_ps(tree16(acc), tail);
        store_rows(y + c * ys, _mm512_mul_ps(_mm512_set1_ps(cpu_x2_D(xc, k)), r), nr);
    }
}
#define LEGACY_GEMV(name, T) PF_GEMV(name, gemv_legacy, T)
LEGACY_GEMV(q8_0, QT_Q8_0)
LEGACY_GEMV(q4_0, QT_Q4_0)
LEGACY_GEMV(q4_1, QT_Q4_1)
LEGACY_GEMV(q5_0, QT_Q5_0)
LEGACY_GEMV(q5_1, QT_Q5_1)
LEGACY_GEMV(iq4_nl, QT_IQ4_NL)
LEGACY_GEMV(mxfp4, QT_MXFP4)

/* gemv_max_n: the gemv kernel runs up to 8 X rows (6 for Q5_0, IQ4_NL and Q2_K; 4 for Q6_K and
 * IQ4_XS; Q3_K and MXFP4 the default 3) instead of unpacking and packing the weights for the
 * tile, as on AVX2 (cpu_gemv_avx2.c). Measured (`bench_matmul -t 1` and `-t 4 -r 9 -n
 * 3,4,6,8`, 4096x4096 and 512x2048, two alternated runs of each build, the smaller median;
 * 16-core Intel Xeon with AVX-512 VNNI, the H100 host, 2026-12-05; gemv / packed time):
 * Q4_K 0.46 / 0.59 / 0.77 at 4 / 6 / 8 rows (4096x4096, one thread), Q5_K 0.50 / 0.65 / 0.70,
 * Q8_0 0.44 / 0.60 / 0.67, Q4_0 0.51 / 0.65 / 0.82, Q4_1 and Q5_1 alike; Q5_0, IQ4_NL, Q2_K
 * 0.63-0.82 at 4, 0.83-0.98 at 6, 0.86-1.06 at 8; Q6_K 0.92 at 4, 1.08-1.20 at 6; IQ4_XS
 * 0.74-0.88 at 4, 0.82-1.11 at 6; Q3_K 0.99-1.08 at 4; MXFP4 1.33-1.71 at 4 (docs/cpu-backend.md,
 * "Small batches on the gemv kernels"). The bits are the same either way. */
/* The software prefetch of the kernels whose tiles are read front to back (Q4_K, Q5_K, Q6_K
 * and the legacy types; the same bits whichever). On the Intel Xeon dev VM of 2026-12-05
 * both levels took the K-quants from ~12 to ~14-16 GB/s out of DRAM ("Two-level
 * prefetch"). On AMD Zen 4 (2026-12-07, bench_matmul 65536 x 4096, one thread, GB/s; none /
 * far alone / both) the near request never helped and for the two types with the most bytes
 * a weight any request cost a quarter to a half of the stream: Q6_K 23 / 16 / 13, Q8_0 29.5
 * / 22 / 22, Q5_K 23 / 22.5 / 14, Q4_K 22.5 / 24 / 19, Q4_0 18.5 / 27 / 27, Q5_0 17 / 24 /
 * 25.5 (Q4_1, Q5_1, IQ4_NL, MXFP4 as Q4_0). There the hardware prefetcher streams an
 * in-order tile on its own at those rates, and software requests for the same lines only
 * take miss buffers from it ("The AVX-512 gemv from DRAM on Zen 4, continued"). So AMD:
 * none for Q6_K and Q8_0, the far request for the rest; elsewhere both levels, as before
 * (not re-measured on Intel since the in-order tiles). SMELT_CPU_GEMV_PF=0|1|2 (none, far,
 * both) sets every kernel, for measuring (gemv_pf_pick, cpu_gemv_pf.h). Read once, when the
 * kernel table is built. */
static enum gemv_pf gemv_pf_mode(uint32_t t) {
    return gemv_pf_pick(t == QT_Q6_K || t == QT_Q8_0 ? PF_NONE : PF_FAR);
}

void cpu_gemv_avx512(struct cpu_kernel tab[QT_COUNT]) {
#define GEMV(T, fn, a, mx)                                                                         \
    do {                                                                                           \
        tab[T].G = GR;                                                                             \
        tab[T].act_gemv = a;                                                                       \
        tab[T].gemv = fn;                                                                          \
        tab[T].gemv_max_n = mx;                                                                    \
        tab[T].repack = rp_pack16;                                                                 \
        tab[T].unrepack = rp_unpack16;                                                             \
    } while (0)
#define PF(T, fn) GEMV_PF(gemv_pf_mode(T), fn)
    GEMV(QT_Q4_K, PF(QT_Q4_K, gemv_q4_K), CPU_ACT_XK, 8);
    GEMV(QT_Q5_K, PF(QT_Q5_K, gemv_q5_K), CPU_ACT_XK, 8);
    GEMV(QT_Q6_K, PF(QT_Q6_K, gemv_q6_K), CPU_ACT_XK, 4);
    GEMV(QT_IQ4_XS, gemv_iq4_xs, CPU_ACT_XK, 4);
    GEMV(QT_Q2_K, gemv_q2_K, CPU_ACT_XK, 6);
    GEMV(QT_Q3_K, gemv_q3_K, CPU_ACT_XK, 3);
    GEMV(QT_Q8_0, PF(QT_Q8_0, gemv_q8_0), CPU_ACT_X2_32, 8);
    GEMV(QT_Q4_0, PF(QT_Q4_0, gemv_q4_0), CPU_ACT_X2_32, 8);
    GEMV(QT_Q4_1, PF(QT_Q4_1, gemv_q4_1), CPU_ACT_X2_32, 8);
    GEMV(QT_Q5_0, PF(QT_Q5_0, gemv_q5_0), CPU_ACT_X2_32, 6);
    GEMV(QT_Q5_1, PF(QT_Q5_1, gemv_q5_1), CPU_ACT_X2_32, 8);
    GEMV(QT_IQ4_NL, PF(QT_IQ4_NL, gemv_iq4_nl), CPU_ACT_X2_32, 6);
    GEMV(QT_MXFP4, PF(QT_MXFP4, gemv_mxfp4), CPU_ACT_X2_32, 3);
#undef PF
#undef GEMV
}
#endif

/* AVX2 decode kernels on repacked weights (G = 8 rows per group, cpu_kernels.h "Repacked
 * weights") and the repack/unrepack transposes (the XK quantizer is in cpu_matmul_avx2.c
 * with the level's other quantizers).
 *
 * Lane = row, as on AVX-512 (cpu_gemv_avx512.c, whose notes apply): a ymm load in a
 * 4-byte section gives 4 consecutive bytes of 8 rows. Without VNNI, a quad's exact 15-bit
 * dot is vpmaddubsw on each activation plane (hi, lo) then vpmaddwd with 128 / 1 (legacy)
 * or with the quad's sub-block scale as an i16 pair (IQ4_XS); the K-quants sum the
 * vpmaddubsw pairs of a scale group's quads in i16 first and scale them once (gemv_kc).
 * Signed weights (Q8_0, IQ4_NL, MXFP4) go through |w| and the activations' sign
 * (vpsignb), so no sum saturates.
 *
 * Bitwise batch invariance: each kernel reproduces, per row, the packed prefill kernel of
 * cpu_matmul_avx2.c for its type (8 f32 lanes per row, the same FMAs, hsum_ps's tree done
 * vertically); lane λ is fed by the exact sums of the quads 4λ..4λ+3 of each 32-element
 * chunk through X16_32 (legacy types, IQ4_XS) or, for Q2_K..Q6_K, by chunk λ of each
 * super-block through X16_K (docs/cpu-backend.md, "AVX2 K-quant chunk lanes").
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_gemv_pf.h"
#include "backend/cpu/cpu_tr8_avx2.h"

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")
#define GR 8 /* rows per group */

INLINE __m256i mask8(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Copies blocks b0..b1-1 of nr rows between the file layout (row r at w + r*ws) and one
 * group, to_group or back; 4-byte sections by 8 x 8 dword transposes, the f16/byte units by cpu_rp_small. Rows
 * nr..7 of the group are zeroed on the way in. rp_copy8 calls it with nr = 8 as a constant
 * for full groups: the per-row bounds then fold away, and whole 8 × 8 transposes use plain
 * loads and stores (vpmaskmovd stores are microcoded on AMD cores; the masked, branchy
 * form was 4-7% of a prefill, in the unrepack before packing), as do the partial
 * transposes that end a section (Q4_K's 35 dwords, Q6_K's 52) in every block but the last. */
INLINE void rp_copy8_n(uint32_t type, int64_t b0, int64_t b1, char *w, size_t ws, char *grp,
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
            for (int j0 = 0; j0 < n4; j0 += 8) {
                const int m = n4 - j0 < 8 ? n4 - j0 : 8;
                __m256i v[8];
                if (m == 8 && nr == GR) {
                    UNROLL
                    for (int i = 0; i < 8; i++)
                        v[i] = to_group ? _mm256_loadu_si256((const __m256i *)(row0 + i * ws + 4 * j0))
                                        : _mm256_loadu_si256((const __m256i *)(base + (size_t)(j0 + i) * 32));
                    cpu_tr8(v);
                    UNROLL
                    for (int i = 0; i < 8; i++)
                        _mm256_storeu_si256(to_group ? (__m256i *)(base + (size_t)(j0 + i) * 32)
                                                     : (__m256i *)(row0 + i * ws + 4 * j0),
                                            v[i]);
                    continue;
                }
                if (!to_group && nr == GR && b + 1 < b1) {
                    /* a section's last dwords back to full rows: plain loads of the m group
                     * vectors, and whole 32-byte row stores whose 8 - m extra dwords land in
                     * the next section or block of the row, which is written after this one
                     * (so only the call's last block needs the masked stores) */
                    UNROLL
                    for (int i = 0; i < 8; i++)
                        v[i] = i < m ? _mm256_loadu_si256((const __m256i *)(base + (size_t)(j0 + i) * 32))
                                     : _mm256_setzero_si256();
                    cpu_tr8(v);
                    UNROLL
                    for (int i = 0; i < 8; i++)
                        _mm256_storeu_si256((__m256i *)(row0 + i * ws + 4 * j0), v[i]);
                    continue;
                }
                const __m256i mk = mask8(m);
                /* unrolled with the bounds as conditions, so v stays in registers */
                UNROLL
                for (int i = 0; i < 8; i++) {
                    if (to_group)
                        v[i] = i < nr ? _mm256_maskload_epi32((const int *)(row0 + i * ws + 4 * j0), mk)
                                      : _mm256_setzero_si256();
                    else
                        v[i] = _mm256_maskload_epi32((const int *)(base + (size_t)(j0 + i) * 32),
                                                     _mm256_set1_epi32(i < m ? -1 : 0));
                }
                cpu_tr8(v);
                UNROLL
                for (int i = 0; i < 8; i++) {
                    if (to_group) {
                        if (i < m) _mm256_storeu_si256((__m256i *)(base + (size_t)(j0 + i) * 32), v[i]);
                    } else if (i < nr) {
                        _mm256_maskstore_epi32((int *)(row0 + i * ws + 4 * j0), mk, v[i]);
                    }
                }
            }
        }
    }
}

INLINE void rp_copy8(uint32_t type, int64_t b0, int64_t b1, char *w, size_t ws, char *grp, int nr,
                     int to_group) {
    if (nr == GR)
        rp_copy8_n(type, b0, b1, w, ws, grp, GR, to_group);
    else
        rp_copy8_n(type, b0, b1, w, ws, grp, nr, to_group);
}

static void rp_pack8(uint32_t type, int64_t k, const void *w, size_t ws, int nr, void *dst) {
    rp_copy8(type, 0, k / qtype_get(type)->blck_size, (char *)w, ws, dst, nr, 1);
}

static void rp_unpack8(uint32_t type, const void *grp, int nr, int64_t b0, int64_t b1, void *dst,
                        size_t ds) {
    rp_copy8(type, b0, b1, dst, ds, (char *)grp, nr, 0);
}

/* ---- shared pieces ---- */


/* Vertical hsum_ps tree (cpu_matmul_avx2.c): ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). */
INLINE __m256 tree8(const __m256 a[8]) {
    __m256 s0 = _mm256_add_ps(a[0], a[4]), s1 = _mm256_add_ps(a[1], a[5]);
    __m256 s2 = _mm256_add_ps(a[2], a[6]), s3 = _mm256_add_ps(a[3], a[7]);
    return _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
}

INLINE void store_rows(float *y, __m256 v, int nr) {
    if (nr >= 8)
        _mm256_storeu_ps(y, v);
    else
        _mm256_maskstore_ps(y, mask8(nr), v);
}

INLINE __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Exact sum over a quad of u·(128·hi + lo) per row: u unsigned (<= 63), or |w| with the
 * sign moved onto the activations (sg: the signed weights, NULL for unsigned u). */
INLINE __m256i quad_dot(__m256i u, const __m256i *sg, const int8_t *hi, const int8_t *lo,
                        __m256i s_hi, __m256i s_lo) {
    __m256i xh = bcast4(hi), xl = bcast4(lo);
    if (sg) {
        xh = _mm256_sign_epi8(xh, *sg);
        xl = _mm256_sign_epi8(xl, *sg);
    }
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, xh), s_hi),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, xl), s_lo));
}

/* ---- legacy 32-blocks against X2_32 ----
 * The packed prefill (legacy_tile, X16_32) keeps 8 lanes per row, lane λ the exact dot of
 * quad λ of each block, FMA'd with d per block; Q4_1/Q5_1's m·Σv goes to one scalar per row
 * (one FMA per block). Tiles (G = 8): d[8] @0 (m[8] @16 for Q4_1/Q5_1; MXFP4 the 8
 * exponent bytes @0), then dwords @32j: Q8_0 the 8 qs units; Q4_0/IQ4_NL/Q4_1/MXFP4 the 4
 * qs units (low nibbles quads 0..3, high 4..7); Q5_0/Q5_1 qh then 4 qs units. */
INLINE int lg_min(uint32_t t) {
    return t == QT_Q4_1 || t == QT_Q5_1;
}

INLINE __m256 lg_d8(uint32_t t, const char *tile) {
    if (t != QT_MXFP4) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tile));
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)tile));
    __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i lt2 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, tiny, lt2));
}

/* Quad l (< 8) of a block's tile: unsigned q (Q4_0/Q4_1/Q5_0/Q5_1, *sg untouched) or the
 * signed values in *sg with |v| returned (Q8_0, IQ4_NL, MXFP4). */
INLINE __m256i lg_quad(uint32_t t, const char *tile, int l, __m256i *sg) {
    const char *q = tile + (t == QT_MXFP4 ? 8 : lg_min(t) ? 32 : 16);
    if (t == QT_Q8_0) {
        *sg = _mm256_loadu_si256((const __m256i *)(q + 32 * l));
        return _mm256_abs_epi8(*sg);
    }
    const int h5 = t == QT_Q5_0 || t == QT_Q5_1;
    __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * (h5 + l % 4)));
    __m256i v = l < 4 ? _mm256_and_si256(raw, _mm256_set1_epi8(15))
                      : _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
    if (t == QT_IQ4_NL || t == QT_MXFP4) {
        *sg = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(
                                      t == QT_MXFP4 ? cpu_kvalues_mxfp4 : cpu_kvalues_iq4nl))),
                                  v);
        return _mm256_abs_epi8(*sg);
    }
    if (h5) { /* bits 4l..4l+3 of each row's qh dword: byte l/2, nibble l%2 */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)q);
        const char b = (char)(l / 2);
        __m256i bc = _mm256_shuffle_epi8(
            qh, _mm256_setr_epi8(b, b, b, b, 4 + b, 4 + b, 4 + b, 4 + b, 8 + b, 8 + b, 8 + b, 8 + b,
                                 12 + b, 12 + b, 12 + b, 12 + b, b, b, b, b, 4 + b, 4 + b, 4 + b,
                                 4 + b, 8 + b, 8 + b, 8 + b, 8 + b, 12 + b, 12 + b, 12 + b, 12 + b));
        const int sh = 4 * (l % 2);
        const __m256i bits = _mm256_set1_epi32((int)((1u << sh) | (2u << (sh + 8)) |
                                                     (4u << (sh + 16)) | (8u << (sh + 24))));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bc, bits), bits);
        v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return v;
}

/* pf: the software prefetch of the tiles ahead (enum gemv_pf in cpu_gemv_pf.h; gemv_pf_mode at
 * the end of the file). */
INLINE void gemv_legacy(uint32_t t, int pf, int64_t k, const void *grp, const void *x, size_t xs,
                        float *y, size_t ys, int nr, int nc) {
    const size_t tile_bytes = GR * blk_bytes(t);
    const int signed_w = t == QT_Q8_0 || t == QT_IQ4_NL || t == QT_MXFP4;
    const int off = t == QT_Q4_0 ? 8 : t == QT_Q5_0 ? 16 : 0;
    const __m256i s128 = _mm256_set1_epi16(128), s1 = _mm256_set1_epi16(1);
    const size_t ahead = pf_ahead(tile_bytes);
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const int32_t *neg = cpu_x2_neg(xc, k);
        const float *sv = cpu_x2_sv(xc, k);
        __m256 acc[8], macc = _mm256_setzero_ps();
        UNROLL
        for (int l = 0; l < 8; l++)
            acc[l] = _mm256_setzero_ps();
        for (int64_t b = 0; b < k / 32; b++) {
            const char *tile = (const char *)grp + b * tile_bytes;
            if (pf) gemv_prefetch_lines(tile, tile_bytes, ahead, 0, 1, pf == PF_TWO);
            const __m256 d8 = lg_d8(t, tile);
            UNROLL
            for (int l = 0; l < 8; l++) {
                const int64_t q = 8 * b + l;
                __m256i sg;
                __m256i u = lg_quad(t, tile, l, &sg);
                __m256i p = quad_dot(u, signed_w ? &sg : NULL, hi + 4 * q, lo + 4 * q, s128, s1);
                if (off) /* Σ(q - off)·v = Σq·v + off·neg */
                    p = _mm256_add_epi32(p, _mm256_set1_epi32(off * neg[q]));
                acc[l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d8, acc[l]);
            }
            if (lg_min(t))
                macc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16))),
                                       _mm256_set1_ps(sv[b]), macc);
        }
        __m256 r = _mm256_add_ps(tree8(acc), macc);
        store_rows(y + c * ys, _mm256_mul_ps(_mm256_set1_ps(cpu_x2_D(xc, k)), r), nr);
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

/* ---- K-quants against XK ----
 * The packed prefill (k16_tile with G = 1, X16_K) keeps 8 lanes per row; per super-block, lane λ
 * gets the exact Σ sc·v·x over chunk λ (elements 32λ..32λ+31) and one FMA with d; then
 * (Q4_K, Q5_K, Q2_K) the chunk's two min terms mf[2λ]·sv[2λ] and mf[2λ+1]·sv[2λ+1].
 * Element n = 32c + 4l + e of chunk c is byte e of quad l: its tile unit and scale group
 * are the type's (below); Q6_K's -32 and Q3_K's -4 go through XK's c32.
 * Tiles (G = 8): Q4_K/Q5_K d[8] @0, dmin[8] @16, dwords @32 + 32j (scales j 0..2, Q5_K qh
 * j 3..10, then qs); Q6_K dwords @32j (ql 0..31, qh 32..47, scales 48..51), d @1664; Q2_K
 * dwords @32j (scales 0..3, qs 4..19), d @640, dmin @656; Q3_K dwords @32j (hmask 0..7,
 * qs 8..23, scales 24..26), d @864. */
INLINE __m256i pair16(__m256i sc) {
    return _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(sc, 16));
}

INLINE __m256i byte_of(__m256i d, int b) {
    return _mm256_and_si256(_mm256_srli_epi32(d, 8 * b), _mm256_set1_epi32(255));
}

/* The scale pairs S[g] (16 groups of 16; Q4_K/Q5_K's 8 scales twice) and min factors mf[g]
 * (dmin·m as the prefill rounds it; 0 without mins) of a super-block's tile, and d. */
INLINE void k_scales(uint32_t t, const char *tile, __m256i S[16], __m256 mf[16], __m256 *d8) {
    switch (t) {
    case QT_Q4_K:
    case QT_Q5_K: {
        *d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tile));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16)));
        const __m256i s0 = _mm256_loadu_si256((const __m256i *)(tile + 32));
        const __m256i s1 = _mm256_loadu_si256((const __m256i *)(tile + 64));
        const __m256i s2 = _mm256_loadu_si256((const __m256i *)(tile + 96));
        const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15),
                      m48 = _mm256_set1_epi32(48);
        UNROLL
        for (int z = 0; z < 4; z++) {
            __m256i sc = _mm256_and_si256(_mm256_srli_epi32(s0, 8 * z), m63);
            __m256i mn = _mm256_and_si256(_mm256_srli_epi32(s1, 8 * z), m63);
            __m256i sc4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 8 * z), m15),
                                          _mm256_and_si256(_mm256_srli_epi32(s0, 8 * z + 2), m48));
            __m256i mn4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 8 * z + 4), m15),
                                          _mm256_and_si256(_mm256_srli_epi32(s1, 8 * z + 2), m48));
            S[2 * z] = S[2 * z + 1] = pair16(sc);
            S[2 * z + 8] = S[2 * z + 9] = pair16(sc4);
            mf[2 * z] = mf[2 * z + 1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn));
            mf[2 * z + 8] = mf[2 * z + 9] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn4));
        }
        break;
    }
    case QT_Q6_K:
        *d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 1664)));
        UNROLL
        for (int q = 0; q < 4; q++) {
            __m256i sd = _mm256_loadu_si256((const __m256i *)(tile + 32 * (48 + q)));
            UNROLL
            for (int b = 0; b < 4; b++)
                S[4 * q + b] = pair16(_mm256_srai_epi32(_mm256_slli_epi32(sd, 24 - 8 * b), 24));
        }
        break;
    case QT_Q2_K: {
        *d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 640)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 656)));
        UNROLL
        for (int q = 0; q < 4; q++) {
            __m256i sd = _mm256_loadu_si256((const __m256i *)(tile + 32 * q));
            UNROLL
            for (int b = 0; b < 4; b++) {
                __m256i by = byte_of(sd, b);
                S[4 * q + b] = pair16(_mm256_and_si256(by, _mm256_set1_epi32(15)));
                mf[4 * q + b] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(by, 4)));
            }
        }
        break;
    }
    default: { /* Q3_K */
        *d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 864)));
        const __m256i s0 = _mm256_loadu_si256((const __m256i *)(tile + 32 * 24));
        const __m256i s1 = _mm256_loadu_si256((const __m256i *)(tile + 32 * 25));
        const __m256i s2 = _mm256_loadu_si256((const __m256i *)(tile + 32 * 26));
        UNROLL
        for (int g = 0; g < 16; g++) {
            __m256i lb = byte_of(g % 8 < 4 ? s0 : s1, g % 4);
            __m256i low = g < 8 ? _mm256_and_si256(lb, _mm256_set1_epi32(15)) : _mm256_srli_epi32(lb, 4);
            __m256i high = _mm256_and_si256(_mm256_srli_epi32(byte_of(s2, g % 4), 2 * (g / 4)),
                                            _mm256_set1_epi32(3));
            S[g] = pair16(_mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)),
                                           _mm256_set1_epi32(32)));
        }
        break;
    }
    }
}

/* Unsigned quants of quad λ of chunk c (elements 32c + 4λ..), 8 rows. */
INLINE __m256i k_quad(uint32_t t, const char *tile, int c, int l) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
#define DW(j) _mm256_loadu_si256((const __m256i *)(tile + 32 * (j)))
    switch (t) {
    case QT_Q4_K:
    case QT_Q5_K: { /* qs unit 8(c/2) + λ, nibble c%2; Q5_K: bit c of qh unit λ */
        const int q0 = t == QT_Q4_K ? 4 : 12;
        __m256i raw = DW(q0 + 8 * (c / 2) + l);
        __m256i q = c % 2 ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4) : _mm256_and_si256(raw, m4);
        if (t == QT_Q5_K) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << c));
            __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(DW(4 + l), bit), bit);
            q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        }
        return q;
    }
    case QT_Q6_K: { /* h = c/4, s = c%4: ql unit 16h + 8(s&1) + λ nibble s>>1, qh unit 32 + 8h + λ bits 2s */
        const int h = c / 4, s = c % 4;
        __m256i ql = DW(16 * h + 8 * (s & 1) + l), qh = DW(32 + 8 * h + l);
        __m256i lo4 = s >> 1 ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) : _mm256_and_si256(ql, m4);
        __m256i hi2 = 2 * s >= 4 ? _mm256_srli_epi16(qh, 2 * s - 4) : _mm256_slli_epi16(qh, 4 - 2 * s);
        return _mm256_or_si256(lo4, _mm256_and_si256(hi2, _mm256_set1_epi8(0x30)));
    }
    case QT_Q2_K: { /* qs unit 4 + 8h + λ, bits 2s */
        const int h = c / 4, s = c % 4;
        return _mm256_and_si256(_mm256_srli_epi16(DW(4 + 8 * h + l), 2 * s), m3);
    }
    default: { /* Q3_K: qs unit 8 + 8h + λ bits 2s, third bit: hmask unit λ bit 4h + s */
        const int h = c / 4, s = c % 4;
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(DW(8 + 8 * h + l), 2 * s), m3);
        const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(DW(l), bit), bit);
        return _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(4)));
    }
    }
#undef DW
}

/* Chunk-lane decode (Q2_K..Q6_K): the arithmetic of k16_tile with G = 1 (cpu_matmul_avx2.c) per
 * row. acc[λ] is lane λ = chunk λ (elements 32λ..32λ+31) of every super-block; its exact
 * int32 per row comes from i16 sums of the vpmaddubsw pairs over the quads of a scale group,
 * scaled once by vpmaddwd (multiply uops per quad of 8 rows: Q4_K 2.25, Q5_K 2.375, Q6_K,
 * Q3_K and Q2_K 2.5, against 4, 4, 5, 5 and 4 with a vpmaddwd per quad):
 *   Q4_K: one scale per chunk; |pair| <= 2·15·127 (hi) or 2·15·64 (lo): 8 quads fit i16.
 *   Q5_K: one scale per chunk; hi pairs <= 2·31·127, summed over 4 quads; lo over 8.
 *   Q6_K, Q3_K, Q2_K: a scale per group of 16 (4 quads). Q6_K's −32 and Q3_K's −4: per i16
 *         slot, Σ (q − o)·x = Σ q·x (wrapping mod 2^16) − o·Σx, with 32·Σx from XK's c32
 *         (Q3_K: c32 >> 3); the true slot sums are <= 8·32·127 (Q6_K hi), inside int16,
 *         so the wrapped result is exact. */
/* An empty asm on a running sum: gcc otherwise reassociates a chunk's 16 adds into a tree
 * over all the products at once and spills them. */
#define CHAIN(v) __asm__("" : "+x"(v))

/* Super-block tile `tile` of a group (8 rows) against one X row: hb, lb, cb and svb point at
 * the super-block's hi and lo bytes, c32 and sums per 16 in XK; adds to acc[8] (lane λ =
 * chunk λ). */
INLINE void kc_tile(uint32_t t, int pf, const char *tile, size_t ahead, const int8_t *hb,
                    const int8_t *lb, const int16_t *cb, const float *svb, __m256 acc[8]) {
    const size_t tile_bytes = GR * blk_bytes(t);
    const int has_min = t == QT_Q4_K || t == QT_Q5_K || t == QT_Q2_K;
    _Alignas(32) __m256i S[16];
    _Alignas(32) __m256 mf[16];
    __m256 d8;
    k_scales(t, tile, S, mf, &d8);
    if (t == QT_Q4_K) { /* chunks 2m and 2m + 1 share qs units 4 + 8m + λ: load each once */
        const __m256i m4 = _mm256_set1_epi8(15);
        UNROLL
        for (int m = 0; m < 4; m++) {
            if (pf) {
                gemv_prefetch_lines(tile, tile_bytes, ahead, 2 * m, 8, pf == PF_TWO);
                gemv_prefetch_lines(tile, tile_bytes, ahead, 2 * m + 1, 8, pf == PF_TWO);
            }
            __m256i ah0 = _mm256_setzero_si256(), al0 = ah0, ah1 = ah0, al1 = ah0;
            UNROLL
            for (int l = 0; l < 8; l++) {
                const int e = 64 * m + 4 * l;
                __m256i raw = _mm256_loadu_si256((const __m256i *)(tile + 32 * (4 + 8 * m + l)));
                CHAIN(raw); /* one load for both nibbles (gcc would load it twice) */
                const __m256i q0 = _mm256_and_si256(raw, m4);
                const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                ah0 = _mm256_add_epi16(ah0, _mm256_maddubs_epi16(q0, bcast4(hb + e)));
                al0 = _mm256_add_epi16(al0, _mm256_maddubs_epi16(q0, bcast4(lb + e)));
                ah1 = _mm256_add_epi16(ah1, _mm256_maddubs_epi16(q1, bcast4(hb + e + 32)));
                al1 = _mm256_add_epi16(al1, _mm256_maddubs_epi16(q1, bcast4(lb + e + 32)));
                CHAIN(ah0);
                CHAIN(al0);
                CHAIN(ah1);
                CHAIN(al1);
            }
            UNROLL
            for (int cc = 0; cc < 2; cc++) {
                const int ch = 2 * m + cc;
                const __m256i ah = cc ? ah1 : ah0, al = cc ? al1 : al0;
                __m256i is = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(ah, S[2 * ch]), 7),
                                              _mm256_madd_epi16(al, S[2 * ch]));
                acc[ch] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), d8, acc[ch]);
                acc[ch] = _mm256_fnmadd_ps(mf[2 * ch], _mm256_set1_ps(svb[2 * ch]), acc[ch]);
                acc[ch] = _mm256_fnmadd_ps(mf[2 * ch + 1], _mm256_set1_ps(svb[2 * ch + 1]), acc[ch]);
            }
        }
        return;
    }
    UNROLL
    for (int ch = 0; ch < 8; ch++) {
        if (pf) gemv_prefetch_lines(tile, tile_bytes, ahead, ch, 8, pf == PF_TWO);
        __m256i is;
        if (t == QT_Q5_K) { /* (Q4_K took the chunk pairs above) */
            /* hi in i16 over quads 0..3 and 4..7; lo over 8 */
            __m256i ah[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, al = ah[0];
            UNROLL
            for (int l = 0; l < 8; l++) {
                const int e = 32 * ch + 4 * l, hh = l / 4;
                __m256i q = k_quad(t, tile, ch, l);
                ah[hh] = _mm256_add_epi16(ah[hh], _mm256_maddubs_epi16(q, bcast4(hb + e)));
                al = _mm256_add_epi16(al, _mm256_maddubs_epi16(q, bcast4(lb + e)));
                CHAIN(ah[hh]);
                CHAIN(al);
            }
            const __m256i h32 = _mm256_add_epi32(_mm256_madd_epi16(ah[0], S[2 * ch]),
                                                 _mm256_madd_epi16(ah[1], S[2 * ch]));
            is = _mm256_add_epi32(_mm256_slli_epi32(h32, 7), _mm256_madd_epi16(al, S[2 * ch]));
        } else {
            is = _mm256_setzero_si256();
            UNROLL
            for (int gg = 0; gg < 2; gg++) {
                const int g = 2 * ch + gg;
                __m256i ah = _mm256_setzero_si256(), al = ah;
                UNROLL
                for (int l = 4 * gg; l < 4 * gg + 4; l++) {
                    const int e = 32 * ch + 4 * l;
                    __m256i q = k_quad(t, tile, ch, l);
                    ah = _mm256_add_epi16(ah, _mm256_maddubs_epi16(q, bcast4(hb + e)));
                    al = _mm256_add_epi16(al, _mm256_maddubs_epi16(q, bcast4(lb + e)));
                    CHAIN(ah);
                    CHAIN(al);
                }
                if (t != QT_Q2_K) {
                    __m256i ch_ = bcast4(cb + 4 * g), cl_ = bcast4(cb + 4 * g + 2);
                    if (t == QT_Q3_K) {
                        ch_ = _mm256_srai_epi16(ch_, 3);
                        cl_ = _mm256_srai_epi16(cl_, 3);
                    }
                    ah = _mm256_sub_epi16(ah, ch_);
                    al = _mm256_sub_epi16(al, cl_);
                }
                is = _mm256_add_epi32(is, _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(ah, S[g]), 7),
                                                           _mm256_madd_epi16(al, S[g])));
            }
        }
        acc[ch] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), d8, acc[ch]);
        if (has_min) {
            acc[ch] = _mm256_fnmadd_ps(mf[2 * ch], _mm256_set1_ps(svb[2 * ch]), acc[ch]);
            acc[ch] = _mm256_fnmadd_ps(mf[2 * ch + 1], _mm256_set1_ps(svb[2 * ch + 1]), acc[ch]);
        }
    }
}

INLINE void gemv_kc(uint32_t t, int pf, int64_t k, const void *grp, const void *x, size_t xs,
                    float *y, size_t ys, int nr, int nc) {
    const size_t tile_bytes = GR * blk_bytes(t);
    const size_t ahead = pf_ahead(tile_bytes);
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        const int16_t *c32 = cpu_xk_c32(xc, k);
        const float *sv = cpu_xk_sv(xc, k);
        __m256 acc[8];
        UNROLL
        for (int l = 0; l < 8; l++)
            acc[l] = _mm256_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++)
            kc_tile(t, pf, (const char *)grp + i * tile_bytes, ahead, hi + 256 * i, lo + 256 * i,
                    c32 + 64 * i, sv + 16 * i, acc);
        store_rows(y + c * ys, _mm256_mul_ps(_mm256_set1_ps(cpu_xk_D(xc, k)), tree8(acc)), nr);
    }
}

/* Q2_K and Q3_K keep both levels whatever the mode (not measured otherwise). */
#define KC_GEMV(name, T)                                                                           \
    static void gemv_##name(int64_t k, const void *grp, const void *x, size_t xs, float *y,        \
                            size_t ys, int nr, int nc) {                                           \
        gemv_kc(T, PF_TWO, k, grp, x, xs, y, ys, nr, nc);                                          \
    }
KC_GEMV(q2_K, QT_Q2_K)
KC_GEMV(q3_K, QT_Q3_K)
PF_GEMV(q4_K, gemv_kc, QT_Q4_K)
PF_GEMV(q5_K, gemv_kc, QT_Q5_K)
PF_GEMV(q6_K, gemv_kc, QT_Q6_K)

/* ---- IQ4_XS against XK ----
 * The packed prefill (k16_tile on iq4_xs_k16_block's w16 = (ls - 32)·v) as for the
 * K-quants, without mins: per half h, lane λ gets the exact Σ over quad λ of chunks
 * 4h..4h+3, one FMA with d. Chunk c is sub-block c: element 32c + 4λ + e is the low nibble
 * (λ < 4) or high nibble (λ >= 4) of qs[16c + 4(λ % 4) + e]. Tile (1088 bytes): d[8] @0,
 * scales_h[8] @16, dwords @32 + 32j: j = 0 scales_l, 1 + u qs[4u..4u+3]. The codebook
 * values are signed: |v| with the sign moved onto the activations. */
static void gemv_iq4_xs(int64_t k, const void *grp, const void *x, size_t xs, float *y, size_t ys,
                        int nr, int nc) {
    const size_t tile_bytes = GR * sizeof(struct block_iq4_xs);
    const size_t ahead = pf_ahead(tile_bytes);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)cpu_kvalues_iq4nl));
    for (int c = 0; c < nc; c++) {
        const char *xc = (const char *)x + c * xs;
        const int8_t *hi = cpu_x2_hi(xc), *lo = cpu_x2_lo(xc, k);
        __m256 acc[8];
        UNROLL
        for (int l = 0; l < 8; l++)
            acc[l] = _mm256_setzero_ps();
        for (int64_t i = 0; i < k / 256; i++) {
            const char *tile = (const char *)grp + i * tile_bytes;
            gemv_prefetch(tile, tile_bytes, ahead);
            _Alignas(32) __m256i S[8];
            const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(tile + 16)));
            const __m256i sl = _mm256_loadu_si256((const __m256i *)(tile + 32));
            UNROLL
            for (int z = 0; z < 8; z++) {
                __m256i ls = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32(sl, 4 * z), _mm256_set1_epi32(15)),
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * z), _mm256_set1_epi32(3)), 4));
                S[z] = pair16(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
            }
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tile));
            const char *qs = tile + 64;
            const int8_t *hb = hi + 256 * i, *lb = lo + 256 * i;
            for (int l = 0; l < 8; l++) {
                UNROLL
                for (int h = 0; h < 2; h++) {
                    __m256i ah = _mm256_setzero_si256(), al = ah;
                    UNROLL
                    for (int cc = 0; cc < 4; cc++) {
                        const int z = 4 * h + cc, e = 32 * z + 4 * l;
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (4 * z + l % 4)));
                        __m256i idx = l < 4 ? _mm256_and_si256(raw, m4)
                                            : _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                        __m256i sv = _mm256_shuffle_epi8(tab, idx), av = _mm256_abs_epi8(sv);
                        __m256i xh = _mm256_sign_epi8(bcast4(hb + e), sv), xl = _mm256_sign_epi8(bcast4(lb + e), sv);
                        ah = _mm256_add_epi32(ah, _mm256_madd_epi16(_mm256_maddubs_epi16(av, xh), S[z]));
                        al = _mm256_add_epi32(al, _mm256_madd_epi16(_mm256_maddubs_epi16(av, xl), S[z]));
                    }
                    __m256i is = _mm256_add_epi32(_mm256_slli_epi32(ah, 7), al);
                    acc[l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), d8, acc[l]);
                }
            }
        }
        store_rows(y + c * ys, _mm256_mul_ps(_mm256_set1_ps(cpu_xk_D(xc, k)), tree8(acc)), nr);
    }
}

/* gemv_max_n: the gemv kernel runs up to 6 X rows (4 for Q3_K and IQ4_XS) instead of unpacking
 * and packing the weights for the tile: each X row costs the gemv a pass over the group's
 * tiles in L1, the packed path a pass over the weights to pack them first. Measured
 * (`SMELT_CPU_ISA=avx2 bench_matmul -t 1` and `-t 2`, repacked weights, AMD EPYC Zen 3,
 * 2026-12-05; ms, packed -> gemv): Q4_K 4096x4096 at 4 rows 4.72 -> 2.11, at 6 5.29 ->
 * 3.00, at 8 5.88 -> 4.22, at 16 about even; 512x2048 at 4 0.35 -> 0.20, at 6 even, at 8
 * worse; Q8_0, Q4_0, Q4_1, Q5_0, IQ4_NL, MXFP4, Q2_K, Q6_K ahead or even at 4 and 6 (MXFP4
 * 2880x2880 at 4 3.25 -> 1.60); Q3_K 512x2048 and IQ4_XS behind at 6. The bits are the
 * same either way (the gemv kernels do the packed path's arithmetic). */
/* The software prefetch of the kernels instantiated by PF_GEMV (the K-quants but Q2_K and Q3_K,
 * the legacy types; the same bits whichever). On AMD Zen 4 (2026-12-07, `SMELT_CPU_GEMV_PF=0|1|2
 * SMELT_CPU_ISA=avx2 bench_matmul -t 1 -r 8 -n 1`, 65536 x 4096, median of three rounds, GB/s;
 * none / far alone / both) the far request alone is as fast as both levels or faster for every
 * type: Q6_K 5.0 / 19.8 / 15.2, Q5_K 14.0 / 17.1 / 15.3, Q4_K 19.3 / 21.3 / 21.0, Q8_0 20.4 /
 * 26.8 / 26.5, Q4_0 13.0 / 16.3 / 16.2, Q5_0 10.2 / 13.9 / 13.8. The near request presumably
 * takes miss buffers from the hardware prefetcher, as at AVX-512. Unlike there, every type is
 * slower with no software prefetch at all: Q6_K's 8-row tile is not read front to back (a chunk
 * reads its ql and qh units from two places of it), and why the small in-order legacy tiles want
 * the far request at this level was not looked into. So AMD: the far request alone for all of
 * them (AMD cores with AVX-512: Zen 3 keeps the both levels it was tuned with); elsewhere both
 * levels, as before (gemv_pf_pick, cpu_gemv_pf.h; docs/cpu-backend.md, "The AVX2 gemv's
 * prefetch on Zen 4"). Read once, when the kernel table is built. */
static enum gemv_pf gemv_pf_mode(void) {
    return gemv_pf_pick(PF_FAR);
}

void cpu_gemv_avx2(struct cpu_kernel tab[QT_COUNT]) {
#define GEMV(T, fn, a, mx)                                                                         \
    do {                                                                                           \
        tab[T].G = GR;                                                                             \
        tab[T].act_gemv = a;                                                                       \
        tab[T].gemv = fn;                                                                          \
        tab[T].gemv_max_n = mx;                                                                    \
        tab[T].repack = rp_pack8;                                                                  \
        tab[T].unrepack = rp_unpack8;                                                              \
    } while (0)
    const enum gemv_pf pf = gemv_pf_mode();
#define PF(fn) GEMV_PF(pf, fn)
    GEMV(QT_Q8_0, PF(gemv_q8_0), CPU_ACT_X2_32, 6);
    GEMV(QT_Q4_0, PF(gemv_q4_0), CPU_ACT_X2_32, 6);
    GEMV(QT_Q4_1, PF(gemv_q4_1), CPU_ACT_X2_32, 6);
    GEMV(QT_Q5_0, PF(gemv_q5_0), CPU_ACT_X2_32, 6);
    GEMV(QT_Q5_1, PF(gemv_q5_1), CPU_ACT_X2_32, 6);
    GEMV(QT_IQ4_NL, PF(gemv_iq4_nl), CPU_ACT_X2_32, 6);
    GEMV(QT_MXFP4, PF(gemv_mxfp4), CPU_ACT_X2_32, 6);
    GEMV(QT_Q2_K, gemv_q2_K, CPU_ACT_XK, 6);
    GEMV(QT_Q3_K, gemv_q3_K, CPU_ACT_XK, 4);
    GEMV(QT_Q4_K, PF(gemv_q4_K), CPU_ACT_XK, 6);
    GEMV(QT_Q5_K, PF(gemv_q5_K), CPU_ACT_XK, 6);
    GEMV(QT_Q6_K, PF(gemv_q6_K), CPU_ACT_XK, 6);
    GEMV(QT_IQ4_XS, gemv_iq4_xs, CPU_ACT_XK, 4);
#undef PF
#undef GEMV
}
#endif

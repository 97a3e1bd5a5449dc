/* IQ types: codebook ("grid") formats and the non-linear 4-bit ones.
 *
 * Dequantize mirrors gguf-py (db = d * (0.5 + s) * 0.25 etc., then db * grid * sign in
 * that order) and is bit-exact against it. The codebooks come from gguf-py too, through
 * the generated quant/iq_tables.c (scripts/gen-iq-tables.py).
 *
 * Quantize exists for IQ4_NL and IQ4_XS only: ggml's quantize_row_iq4_nl_impl as
 * llama-quantize calls it without an importance matrix (weights x^2, 15 candidate
 * scales, then a second-level 6-bit scale for IQ4_XS). The grid types need an importance
 * matrix and a neighbour search over the codebook; they are not implemented here.
 */
#include <math.h>

#include "quant/iq_tables.h"
#include "quant/quant_impl.h"

static inline float grid8(uint64_t row, int j) { return (float)(uint8_t)(row >> (8 * j)); }
static inline float grid4(uint32_t row, int j) { return (float)(uint8_t)(row >> (8 * j)); }
/* +-1.0 for sign bit j. The value is hidden from the optimizer so that x * sgn stays a
 * real multiply: GCC otherwise turns it into a sign flip, which differs from numpy's
 * multiply when x is NaN (x86 keeps the NaN operand's sign; a flip does not). */
static inline float sgn(uint8_t signs, int j) {
    uint32_t bits = (signs >> j) & 1 ? 0xbf800000u : 0x3f800000u;
    __asm__("" : "+r"(bits));
    return f32_from_bits(bits);
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void quant_from_iq2_xxs(const void *src, float *dst, int64_t n) {
    const struct block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        const uint8_t *qs = (const uint8_t *)b[i].qs;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a = rd32(qs + 8 * ib), w = rd32(qs + 8 * ib + 4);
            const float db = d * (0.5f + (float)(w >> 28)) * 0.25f;
            for (int g = 0; g < 4; g++) {
                const uint64_t row = quant_iq2xxs_grid[(a >> (8 * g)) & 255];
                const uint8_t s = quant_ksigns_iq2xs[(w >> (7 * g)) & 127];
                for (int j = 0; j < 8; j++) dst[32 * ib + 8 * g + j] = db * grid8(row, j) * sgn(s, j);
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq2_xs(const void *src, float *dst, int64_t n) {
    const struct block_iq2_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int k = 0; k < 16; k++) {
            const int nib = (b[i].scales[k / 2] >> (4 * (k % 2))) & 15;
            const float db = d * (0.5f + (float)nib) * 0.25f;
            for (int g = 2 * k; g < 2 * k + 2; g++) {
                const uint16_t q = b[i].qs[g];
                const uint64_t row = quant_iq2xs_grid[q & 511];
                const uint8_t s = quant_ksigns_iq2xs[q >> 9];
                for (int j = 0; j < 8; j++) dst[8 * g + j] = db * grid8(row, j) * sgn(s, j);
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq2_s(const void *src, float *dst, int64_t n) {
    const struct block_iq2_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        const uint8_t *signs = b[i].qs + QK_K / 8;
        for (int k = 0; k < 16; k++) {
            const int nib = (b[i].scales[k / 2] >> (4 * (k % 2))) & 15;
            const float db = d * (0.5f + (float)nib) * 0.25f;
            for (int g = 2 * k; g < 2 * k + 2; g++) {
                const int idx = b[i].qs[g] | ((b[i].qh[g / 4] >> (2 * (g % 4))) & 3) << 8;
                const uint64_t row = quant_iq2s_grid[idx];
                for (int j = 0; j < 8; j++) dst[8 * g + j] = db * grid8(row, j) * sgn(signs[g], j);
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq3_xxs(const void *src, float *dst, int64_t n) {
    const struct block_iq3_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        const uint8_t *qs = b[i].qs;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t w = rd32(qs + QK_K / 4 + 4 * ib);
            const float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
            for (int g = 0; g < 4; g++) {
                const uint8_t s = quant_ksigns_iq2xs[(w >> (7 * g)) & 127];
                const uint32_t r0 = quant_iq3xxs_grid[qs[8 * ib + 2 * g]];
                const uint32_t r1 = quant_iq3xxs_grid[qs[8 * ib + 2 * g + 1]];
                float *y = dst + 32 * ib + 8 * g;
                for (int j = 0; j < 4; j++) y[j] = db * grid4(r0, j) * sgn(s, j);
                for (int j = 0; j < 4; j++) y[4 + j] = db * grid4(r1, j) * sgn(s, 4 + j);
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq3_s(const void *src, float *dst, int64_t n) {
    const struct block_iq3_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int k = 0; k < 8; k++) {
            const int nib = (b[i].scales[k / 2] >> (4 * (k % 2))) & 15;
            const float db = d * (float)(1 + 2 * nib);
            for (int gi = 8 * k; gi < 8 * k + 8; gi++) { /* 4-value grid rows */
                const int idx = b[i].qs[gi] | ((b[i].qh[gi / 8] >> (gi % 8)) & 1) << 8;
                const uint32_t row = quant_iq3s_grid[idx];
                for (int j = 0; j < 4; j++) {
                    const int e = 4 * gi + j;
                    dst[e] = db * grid4(row, j) * sgn(b[i].signs[e / 8], e % 8);
                }
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq1_s(const void *src, float *dst, int64_t n) {
    const struct block_iq1_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = b[i].qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = (qh & 0x8000) ? -0.125f : 0.125f;
            for (int k = 0; k < 4; k++) {
                const uint64_t row = quant_iq1s_grid[b[i].qs[4 * ib + k] | ((qh >> (3 * k)) & 7) << 8];
                for (int j = 0; j < 8; j++)
                    dst[32 * ib + 8 * k + j] = dl * ((float)(int8_t)(row >> (8 * j)) + delta);
            }
        }
        dst += QK_K;
    }
}

void quant_from_iq1_m(const void *src, float *dst, int64_t n) {
    const struct block_iq1_m *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint16_t sc[4];
        for (int k = 0; k < 4; k++) sc[k] = (uint16_t)(b[i].scales[2 * k] | b[i].scales[2 * k + 1] << 8);
        const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                          ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = quant_h(dbits);
        for (int g = 0; g < 32; g++) {
            const int s = (sc[g / 8] >> (3 * ((g / 2) % 4))) & 7;
            const float dl = d * (float)(2 * s + 1);
            const int h = (b[i].qh[g / 2] >> (4 * (g % 2))) & 15;
            const float delta = (h & 8) ? -0.125f : 0.125f;
            const uint64_t row = quant_iq1s_grid[b[i].qs[g] | (h & 7) << 8];
            for (int j = 0; j < 8; j++) dst[8 * g + j] = dl * ((float)(int8_t)(row >> (8 * j)) + delta);
        }
        dst += QK_K;
    }
}

/* ---- IQ4_NL / IQ4_XS ---- */

void quant_from_iq4_nl(const void *src, float *dst, int64_t n) {
    const struct block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, dst += QK4_NL) {
        const float d = quant_h(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)quant_kvalues_iq4nl[b[i].qs[j] & 15];
            dst[j + 16] = d * (float)quant_kvalues_iq4nl[b[i].qs[j] >> 4];
        }
    }
}

void quant_from_iq4_xs(const void *src, float *dst, int64_t n) {
    const struct block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int k = 0; k < 8; k++) {
            const int ls = ((b[i].scales_l[k / 2] >> (4 * (k % 2))) & 15) |
                           ((b[i].scales_h >> (2 * k)) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            const uint8_t *qs = b[i].qs + 16 * k;
            for (int j = 0; j < 16; j++) {
                dst[32 * k + j] = dl * (float)quant_kvalues_iq4nl[qs[j] & 15];
                dst[32 * k + 16 + j] = dl * (float)quant_kvalues_iq4nl[qs[j] >> 4];
            }
        }
        dst += QK_K;
    }
}

/* Index of the level nearest to x in the sorted table val[16]; a value exactly between
 * two levels takes the upper one. Compared as 2x against val[j-1] + val[j], both exact. */
static int best_index_iq4(const int8_t *val, float x) {
    const float x2 = x + x;
    int idx = 0;
    for (int step = 8; step > 0; step >>= 1) {
        const int j = idx + step;
        if (x2 >= (float)(val[j - 1] + val[j])) idx = j;
    }
    return idx;
}

/* One IQ4 super-block of sbs elements in sub-blocks of 32 (sbs = 32 for IQ4_NL, 256
 * for IQ4_XS). Writes *dh, q4[sbs/2] and, when sbs > 32, the 6-bit sub-block scales. */
static void iq4_block(int sbs, const float *x, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                      uint8_t *scales_l) {
    const int8_t *values = quant_kvalues_iq4nl;
    const int ntry = 7;
    float scales[QK_K / 32], weight[32];
    uint8_t L[QK_K];
    memset(q4, 0, (size_t)sbs / 2);
    *dh = f32_to_f16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < sbs / 32; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        if (amax < 1e-15f) {
            scales[ib] = 0;
            memset(Lb, 0, 32);
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = best_index_iq4(values, id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const int l = best_index_iq4(values, id * xb[j]);
                const float q = values[l], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    if (sbs > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = f32_to_f16(d);
        const float id = d != 0 ? 1 / d : 0.f;
        for (int ib = 0; ib < sbs / 32; ib++) {
            int l = quant_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl != 0 ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)best_index_iq4(values, idl * x[32 * ib + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << (2 * (ib % 8)));
        }
    } else {
        *dh = f32_to_f16(scales[0]);
        const float id = scales[0] != 0 ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)best_index_iq4(values, id * x[j]);
    }
    for (int i = 0; i < sbs / 32; i++)
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | L[32 * i + 16 + j] << 4);
}

void quant_to_iq4_nl(const float *src, void *dst, int64_t n) {
    struct block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / QK4_NL; i++) {
        uint16_t dh;
        iq4_block(QK4_NL, src + QK4_NL * i, &dh, b[i].qs, NULL, NULL);
        b[i].d = dh;
    }
}

void quant_to_iq4_xs(const float *src, void *dst, int64_t n) {
    struct block_iq4_xs *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint16_t dh, sh;
        iq4_block(QK_K, src + QK_K * i, &dh, b[i].qs, &sh, b[i].scales_l);
        b[i].d = dh;
        b[i].scales_h = sh;
    }
}

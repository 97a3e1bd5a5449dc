/* The f16 weights the tensor-core kernels (cuda_mmq, cuda_mmb) compute, decoded here from
 * the GGUF bytes independently of the kernels' layouts, and random test weights: shared by
 * test_cuda_mmq.c and test_cuda_mmb.c. Include after t.h, quant/quant.h and util/half.h. */
#ifndef SMELT_TEST_QREF16_H
#define SMELT_TEST_QREF16_H

#include "quant/iq_tables.h" /* quant_kvalues_mxfp4 */

/* v rounded once to the nearest f16 (ties to even), as a float (exact). v is exact in
 * double here (a product of f16 values plus an f16). */
static float rne16(double v) {
    if (v != v) return (float)v;
    const double a = fabs(v);
    if (a == 0) return (float)v;
    int e;
    frexp(a, &e);
    int ex = e - 1;
    if (ex < -14) ex = -14; /* subnormal quantum 2^-24 */
    const double q = ldexp(1.0, ex - 10);
    double r = nearbyint(a / q) * q;
    if (r > 65504.0) r = INFINITY;
    return (float)(v < 0 ? -r : r);
}

static float f16v(float f) {
    return f16_to_f32(f32_to_f16(f));
}

static double h16(const uint8_t *p) {
    return f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* x as the kernel sees it: clamped to the f16 range, rounded to f16. */
static float x16(float v) {
    if (fabsf(v) > 65504.0f) v = copysignf(65504.0f, v);
    return f16v(v);
}

/* The f16 weights of one row as the kernel computes them, from the GGUF bytes (the block
 * formats as documented in ggml: Q4_K 6-bit scales/mins packed in 12 bytes, Q6_K ql/qh; Q5_K
 * as Q4_K with a fifth bit, Q4_0 and Q8_0 one f16 scale per 32). */
static void ref_row_f16(uint32_t type, const uint8_t *row, int64_t k, float *w) {
    if (type == QT_Q8_0) {
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *p = row + 34 * b;
            const double d = h16(p);
            for (int i = 0; i < 32; i++)
                w[32 * b + i] = rne16((double)(int8_t)p[2 + i] * d);
        }
    } else if (type == QT_Q4_K) {
        for (int64_t b = 0; b < k / 256; b++) {
            const uint8_t *p = row + 144 * b, *sc = p + 4, *qs = p + 16;
            const float d = (float)h16(p), dmin = (float)h16(p + 2);
            for (int j = 0; j < 8; j++) {
                int s, m;
                if (j < 4) {
                    s = sc[j] & 63;
                    m = sc[j + 4] & 63;
                } else {
                    s = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
                    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                const double s16 = f16v(d * (float)s), m16 = f16v(dmin * (float)m);
                for (int i = 0; i < 32; i++) {
                    const int q = (j & 1) ? qs[32 * (j / 2) + i] >> 4 : qs[32 * (j / 2) + i] & 0xf;
                    w[256 * b + 32 * j + i] = rne16(q * s16 - m16);
                }
            }
        }
    } else if (type == QT_MXFP4) { /* e, qs[16] as Q4_0's, codes into kvalues_mxfp4 (x2) */
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *p = row + 17 * b;
            /* the scale 2^(e-128) as an f16: 0 below 2^-24, the largest finite above */
            const double d = p[0] < 104 ? 0.0 : p[0] >= 144 ? 65504.0 : ldexp(1.0, p[0] - 128);
            for (int j = 0; j < 16; j++) {
                w[32 * b + j] = rne16(quant_kvalues_mxfp4[p[1 + j] & 0xf] * d);
                w[32 * b + j + 16] = rne16(quant_kvalues_mxfp4[p[1 + j] >> 4] * d);
            }
        }
    } else if (type == QT_Q4_0) { /* d, qs[16]: byte j = element j (low nibble), j + 16 (high) */
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *p = row + 18 * b;
            const double d = h16(p);
            for (int j = 0; j < 16; j++) {
                w[32 * b + j] = rne16(((p[2 + j] & 0xf) - 8) * d);
                w[32 * b + j + 16] = rne16(((p[2 + j] >> 4) - 8) * d);
            }
        }
    } else if (type == QT_Q5_K) { /* d, dmin, scales[12] (as Q4_K), qh[32], qs[128]: as Q4_K */
        for (int64_t b = 0; b < k / 256; b++) { /* with bit 4 of element 32j + l in qh[l] bit j */
            const uint8_t *p = row + 176 * b, *sc = p + 4, *qh = p + 16, *qs = p + 48;
            const float d = (float)h16(p), dmin = (float)h16(p + 2);
            for (int j = 0; j < 8; j++) {
                int s, m;
                if (j < 4) {
                    s = sc[j] & 63;
                    m = sc[j + 4] & 63;
                } else {
                    s = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
                    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                const double s16 = f16v(d * (float)s), m16 = f16v(dmin * (float)m);
                for (int i = 0; i < 32; i++) {
                    const int lo = (j & 1) ? qs[32 * (j / 2) + i] >> 4 : qs[32 * (j / 2) + i] & 0xf;
                    const int q = lo | ((qh[i] >> j) & 1) << 4;
                    w[256 * b + 32 * j + i] = rne16(q * s16 - m16);
                }
            }
        }
    } else { /* Q6_K */
        for (int64_t b = 0; b < k / 256; b++) {
            const uint8_t *p = row + 210 * b;
            const int8_t *sc = (const int8_t *)(p + 192);
            const float d = (float)h16(p + 208);
            int q[256];
            for (int hh = 0; hh < 2; hh++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t *L = p + 64 * hh, *H = p + 128 + 32 * hh;
                    q[128 * hh + l] = (L[l] & 0xf) | ((H[l] & 3) << 4);
                    q[128 * hh + l + 32] = (L[l + 32] & 0xf) | (((H[l] >> 2) & 3) << 4);
                    q[128 * hh + l + 64] = (L[l] >> 4) | (((H[l] >> 4) & 3) << 4);
                    q[128 * hh + l + 96] = (L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4);
                }
            for (int i = 0; i < 256; i++)
                w[256 * b + i] = rne16((q[i] - 32) * (double)f16v(d * (float)sc[i / 16]));
        }
    }
}

/* GGUF bytes of rows x k Gaussian weights; w16: the kernel's f16 weights, deq: the
 * library's dequantization. */
static void *make_weights(uint32_t type, int64_t rows, int64_t k, float *w16, float *deq,
                          unsigned long long *seed) {
    const struct qtype_info *qi = qtype_get(type);
    uint64_t rb = qtype_row_size(type, k);
    uint8_t *w = malloc(rb * (uint64_t)rows);
    float *row = malloc(sizeof(float) * (size_t)k);
    if (!w || !row) abort();
    for (int64_t r = 0; r < rows; r++) {
        float scale = 0.02f * (1.0f + (float)(r % 7)); /* rows of different magnitude */
        for (int64_t i = 0; i < k; i++)
            row[i] = scale * t_randn(seed);
        qi->quantize(row, w + rb * r, k);
        qi->dequantize(w + rb * r, deq + k * r, k);
        ref_row_f16(type, w + rb * r, k, w16 + k * r);
    }
    free(row);
    return w;
}

#endif

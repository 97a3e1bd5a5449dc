/* Ternary (TQ1_0, TQ2_0), 1-bit (Q1_0) and FP4 microscaling (MXFP4, NVFP4) formats.
 *
 * Dequantize mirrors gguf-py (Q1_0: ggml, gguf-py has no Q1_0 code). Quantize is ggml's
 * reference (quantize_row_*_ref), bit-exact against gguf-py for TQ1_0, TQ2_0 and MXFP4.
 */
#include <math.h>

#include "quant/iq_tables.h"
#include "quant/quant_impl.h"

static float absmax_ggml(const float *x, int n) {
    float amax = 0.f;
    for (int j = 0; j < n; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    return amax;
}

/* lroundf(v) + 1 for v in [-1, 1] (a ternary digit 0..2), clamped so that non-finite
 * input stays defined. */
static uint8_t trit(float v) {
    if (!(v == v)) return 1;
    long r = lroundf(fminf(fmaxf(v, -1.f), 1.f));
    return (uint8_t)(r + 1);
}

/* ---- TQ1_0 ---- */

void quant_from_tq1_0(const void *src, float *dst, int64_t n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const struct block_tq1_0 *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_h(b[i].d);
        float *y = dst;
        for (int t = 0; t < 5; t++)
            for (int m = 0; m < 32; m++) {
                const uint8_t q = (uint8_t)(b[i].qs[m] * pow3[t]);
                y[32 * t + m] = d * (float)(((q * 3) >> 8) - 1);
            }
        y += 160;
        for (int t = 0; t < 5; t++)
            for (int m = 0; m < 16; m++) {
                const uint8_t q = (uint8_t)(b[i].qs[32 + m] * pow3[t]);
                y[16 * t + m] = d * (float)(((q * 3) >> 8) - 1);
            }
        y += 80;
        for (int t = 0; t < 4; t++)
            for (int m = 0; m < 4; m++) {
                const uint8_t q = (uint8_t)(b[i].qh[m] * pow3[t]);
                y[4 * t + m] = d * (float)(((q * 3) >> 8) - 1);
            }
    }
}

/* ceil(q * 256 / 243): the stored form of 5 base-3 digits q (0..242). */
static uint8_t tq_store(unsigned q) { return (uint8_t)((q * 256 + (243 - 1)) / 243); }

void quant_to_tq1_0(const float *x, void *dst, int64_t n) {
    struct block_tq1_0 *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = absmax_ggml(x, QK_K);
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        for (int m = 0; m < 32; m++) {
            unsigned q = 0;
            for (int t = 0; t < 5; t++) q = q * 3 + trit(x[m + 32 * t] * id);
            y[i].qs[m] = tq_store(q);
        }
        x += 160;
        for (int m = 0; m < 16; m++) {
            unsigned q = 0;
            for (int t = 0; t < 5; t++) q = q * 3 + trit(x[m + 16 * t] * id);
            y[i].qs[32 + m] = tq_store(q);
        }
        x += 80;
        for (int m = 0; m < 4; m++) {
            unsigned q = 0;
            for (int t = 0; t < 4; t++) q = q * 3 + trit(x[m + 4 * t] * id);
            y[i].qh[m] = tq_store(q * 3);
        }
        x += 16;
    }
}

/* ---- TQ2_0 ---- */

void quant_from_tq2_0(const void *src, float *dst, int64_t n) {
    const struct block_tq2_0 *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_h(b[i].d);
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++)
                    dst[128 * h + 32 * s + l] = d * (float)(((b[i].qs[32 * h + l] >> (2 * s)) & 3) - 1);
    }
}

void quant_to_tq2_0(const float *x, void *dst, int64_t n) {
    struct block_tq2_0 *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float d = absmax_ggml(x, QK_K);
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                unsigned q = 0;
                for (int s = 0; s < 4; s++) q |= (unsigned)trit(x[128 * h + 32 * s + l] * id) << (2 * s);
                y[i].qs[32 * h + l] = (uint8_t)q;
            }
    }
}

/* ---- MXFP4 ---- */

/* E8M0 exponent e to 2^(e-128), bitwise (gguf-py e8m0_to_fp32_half, ggml
 * GGML_E8M0_TO_FP32_HALF): e = 0, 1 are f32 denormals. */
static float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return f32_from_bits(bits);
}

/* First index of the table entry nearest to x (ggml best_index_mxfp4). */
static int best_index_fp4(float x, float e) {
    int best = 0;
    float best_err = fabsf(quant_kvalues_mxfp4[0] * e - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(quant_kvalues_mxfp4[i] * e - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void quant_from_mxfp4(const void *src, float *dst, int64_t n) {
    const struct block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, dst += QK_MXFP4) {
        const float d = e8m0_half(b[i].e);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)quant_kvalues_mxfp4[b[i].qs[j] & 15];
            dst[j + 16] = d * (float)quant_kvalues_mxfp4[b[i].qs[j] >> 4];
        }
    }
}

void quant_to_mxfp4(const float *x, void *dst, int64_t n) {
    struct block_mxfp4 *y = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0.f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* floor(log2(amax)) - 2 + 127 as ggml; converted through int (wrapping like
         * gguf-py's astype) so that tiny or huge blocks are defined behaviour. */
        uint8_t e = 0;
        if (amax > 0.0f) {
            const float v = floorf(log2f(amax)) - 2 + 127;
            e = (uint8_t)(int)fmaxf(fminf(v, 1e6f), -1e6f);
        }
        const float d = e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(best_index_fp4(x[j], d) | best_index_fp4(x[j + 16], d) << 4);
    }
}

/* ---- NVFP4 ---- */

/* Unsigned E4M3 (bias 7) scale, halved to match the doubled kvalues; 0x00 and 0x7f are 0.
 * Bit 7 is ignored. All values are exact in f32. */
static float ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int e = (x >> 3) & 0xF, m = x & 7;
    const float raw = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return raw * 0.5f;
}

/* f32 -> UE4M3 with round-half-up on the dropped mantissa, saturating at 0x7e (ggml
 * ggml_fp32_to_ue4m3; gguf-py fp32_to_ue4m3 is the same). */
static uint8_t to_ue4m3(float x) {
    if (!(x > 0.0f)) return 0;
    if (x > 448.0f) x = 448.0f;
    const uint32_t bits = f32_bits(x);
    const int fexp = (int)((bits >> 23) & 0xFF) - 127, fman = (int)((bits >> 20) & 7);
    int exp = fexp + 7;
    if (exp <= 0) {
        int man = (int)(x * 512.0f + 0.5f);
        if (man > 7) man = 7;
        return man < 1 ? 0 : (uint8_t)man;
    }
    if (exp >= 15) return 0x7E;
    int man = fman + (int)((bits >> 19) & 1);
    if (man > 7) {
        man = 0;
        if (++exp >= 15) return 0x7E;
    }
    return (uint8_t)(exp << 3 | man);
}

void quant_from_nvfp4(const void *src, float *dst, int64_t n) {
    const struct block_nvfp4 *b = src;
    for (int64_t i = 0; i < n / QK_NVFP4; i++, dst += QK_NVFP4) {
        for (int s = 0; s < 4; s++) {
            const float d = ue4m3_half(b[i].d[s]);
            for (int j = 0; j < 8; j++) {
                const uint8_t q = b[i].qs[8 * s + j];
                dst[16 * s + j] = d * (float)quant_kvalues_mxfp4[q & 15];
                dst[16 * s + 8 + j] = d * (float)quant_kvalues_mxfp4[q >> 4];
            }
        }
    }
}

void quant_to_nvfp4(const float *x, void *dst, int64_t n) {
    struct block_nvfp4 *y = dst;
    for (int64_t i = 0; i < n / QK_NVFP4; i++) {
        for (int s = 0; s < 4; s++, x += 16) {
            float amax = 0.f;
            for (int j = 0; j < 16; j++)
                if (amax < fabsf(x[j])) amax = fabsf(x[j]);
            const uint8_t ue = to_ue4m3(amax / 6.0f);
            y[i].d[s] = ue;
            const float d = ue4m3_half(ue);
            for (int j = 0; j < 8; j++)
                y[i].qs[8 * s + j] = (uint8_t)(best_index_fp4(x[j], d) | best_index_fp4(x[j + 8], d) << 4);
        }
    }
}

/* ---- Q1_0 ---- */

void quant_from_q1_0(const void *src, float *dst, int64_t n) {
    const struct block_q1_0 *b = src;
    for (int64_t i = 0; i < n / QK1_0; i++, dst += QK1_0) {
        const float d = quant_h(b[i].d), neg = -d;
        for (int j = 0; j < QK1_0; j++) dst[j] = (b[i].qs[j / 8] >> (j % 8)) & 1 ? d : neg;
    }
}

void quant_to_q1_0(const float *x, void *dst, int64_t n) {
    struct block_q1_0 *y = dst;
    for (int64_t i = 0; i < n / QK1_0; i++, x += QK1_0) {
        float sum_abs = 0.0f;
        for (int j = 0; j < QK1_0; j++) sum_abs += fabsf(x[j]);
        y[i].d = f32_to_f16(sum_abs / QK1_0);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < QK1_0; j++)
            if (x[j] >= 0.0f) y[i].qs[j / 8] |= (uint8_t)(1u << (j % 8));
    }
}

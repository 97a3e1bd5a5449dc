/* Plain float types and the legacy 32-element block types (Q4_0 .. Q8_1).
 *
 * Quantizers are ggml's reference ones (quantize_row_*_ref): a block scale from the
 * absolute max (or the min/max for the _1 types), quants by truncation of x/d + offset
 * (Q4/Q5) or round-half-away (Q8). gguf-py implements the same arithmetic, so these are
 * bit-exact against it; tests/py/test_quant_ref.py checks that.
 */
#include <float.h>
#include <math.h>

#include "quant/quant_impl.h"

/* ---- F32, F16, BF16 ---- */

void quant_from_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
void quant_to_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

void quant_from_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = f16_to_f32(h);
    }
}

void quant_to_f16(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = f32_to_f16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

void quant_from_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
    }
}

void quant_to_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = f32_to_bf16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

/* ---- shared block helpers ---- */

/* The signed value of largest magnitude (the first one on ties), as ggml picks it. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

/* (int)v truncated toward zero, then clamped into [0, hi]; the float -> int conversion
 * is done on a clamped value so that NaN or huge inputs are not undefined behaviour
 * (ggml's (int8_t) cast is; gguf-py's astype(uint8) wraps). For every finite block
 * the result equals ggml's. */
static uint8_t trunc_clamp(float v, int hi) {
    if (!(v > 0.f)) return 0;
    if (v >= (float)hi) return (uint8_t)hi;
    return (uint8_t)(int)v;
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* ---- Q4_0 ---- */

void quant_from_q4_0(const void *src, float *dst, int64_t n) {
    const struct block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_h(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = d * (float)((b[i].qs[j] & 15) - 8);
            dst[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

void quant_to_q4_0(const float *src, void *dst, int64_t n) {
    struct block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
        const float d = signed_absmax(src, QK4_0) / -8;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            uint8_t lo = trunc_clamp(src[j] * id + 8.5f, 15);
            uint8_t hi = trunc_clamp(src[j + 16] * id + 8.5f, 15);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* ---- Q4_1 ---- */

void quant_from_q4_1(const void *src, float *dst, int64_t n) {
    const struct block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        const float d = quant_h(b[i].d), m = quant_h(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = d * (float)(b[i].qs[j] & 15) + m;
            dst[j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}

void quant_to_q4_1(const float *src, void *dst, int64_t n) {
    struct block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
        float mn, mx;
        min_max(src, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            uint8_t lo = trunc_clamp((src[j] - mn) * id + 0.5f, 15);
            uint8_t hi = trunc_clamp((src[j + 16] - mn) * id + 0.5f, 15);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* ---- Q5_0 / Q5_1 ---- */

static void unpack_q5(const uint8_t *qh4, const uint8_t *qs, int q[32]) {
    const uint32_t qh = load_u32(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

static void pack_q5(const uint8_t q[32], uint8_t *qh4, uint8_t *qs) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        qh |= (uint32_t)(q[j] >> 4 & 1) << j;
        qh |= (uint32_t)(q[j + 16] >> 4 & 1) << (j + 16);
    }
    store_u32(qh4, qh);
}

void quant_from_q5_0(const void *src, float *dst, int64_t n) {
    const struct block_q5_0 *b = src;
    int q[32];
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        const float d = quant_h(b[i].d);
        unpack_q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < QK5_0; j++) dst[j] = d * (float)(q[j] - 16);
    }
}

void quant_to_q5_0(const float *src, void *dst, int64_t n) {
    struct block_q5_0 *b = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
        const float d = signed_absmax(src, QK5_0) / -16;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK5_0; j++) q[j] = trunc_clamp(src[j] * id + 16.5f, 31);
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

void quant_from_q5_1(const void *src, float *dst, int64_t n) {
    const struct block_q5_1 *b = src;
    int q[32];
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        const float d = quant_h(b[i].d), m = quant_h(b[i].m);
        unpack_q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < QK5_1; j++) dst[j] = d * (float)q[j] + m;
    }
}

void quant_to_q5_1(const float *src, void *dst, int64_t n) {
    struct block_q5_1 *b = dst;
    uint8_t q[32];
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
        float mn, mx;
        min_max(src, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(mn);
        for (int j = 0; j < QK5_1; j++) q[j] = trunc_clamp((src[j] - mn) * id + 0.5f, 31);
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

/* ---- Q8_0 / Q8_1 ---- */

/* roundf of a value known to be within [-127.5, 127.5] for finite blocks; clamped so
 * that NaN/Inf blocks stay defined. */
static int8_t round_q8(float v) {
    if (!(v == v)) return 0;
    float r = roundf(v);
    if (r > 127.f) r = 127.f;
    if (r < -128.f) r = -128.f;
    return (int8_t)r;
}

/* max |x| with ggml's MAX(a, b) = a > b ? a : b, so NaN handling matches ggml (a NaN
 * element is forgotten unless it is the last one); finite blocks are unaffected. */
static float absmax(const float *x, int n) {
    float amax = 0.f;
    for (int j = 0; j < n; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    return amax;
}

void quant_from_q8_0(const void *src, float *dst, int64_t n) {
    const struct block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        const float d = quant_h(b[i].d);
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

void quant_to_q8_0(const float *src, void *dst, int64_t n) {
    struct block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        const float d = absmax(src, QK8_0) / 127;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = round_q8(src[j] * id);
    }
}

void quant_from_q8_1(const void *src, float *dst, int64_t n) {
    const struct block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8_1; i++, dst += QK8_1) {
        const float d = quant_h(b[i].d);
        for (int j = 0; j < QK8_1; j++) dst[j] = (float)b[i].qs[j] * d;
    }
}

void quant_to_q8_1(const float *src, void *dst, int64_t n) {
    struct block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8_1; i++, src += QK8_1) {
        const float d = absmax(src, QK8_1) / 127;
        const float id = d != 0.f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            b[i].qs[j] = round_q8(src[j] * id);
            sum += b[i].qs[j];
        }
        b[i].s = f32_to_f16((float)sum * d);
    }
}

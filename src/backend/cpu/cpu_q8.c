/* Activation quantization, scalar reference (format in cpu_kernels.h).
 *
 * One scale per row: D = amax/16256, v = round_half_even(x * (16256/amax)), split into
 * the planes hi = floor((v + 64)/128) and lo = v - 128 hi. The SIMD quantizers in
 * cpu_matmul_avx2.c compute the same f32 products and round the same way, so all paths
 * produce identical bytes (the tests check it).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

static float row_amax(const float *x, int64_t k) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* v of one element; out-of-range products (only from NaN/inf input) are clamped, as the
 * SIMD max/min do. */
static inline int32_t act_v(float x, float id) {
    float t = x * id;
    if (!(t >= -(float)CPU_ACT_VMAX)) t = -(float)CPU_ACT_VMAX;
    if (!(t <= (float)CPU_ACT_VMAX)) t = (float)CPU_ACT_VMAX;
    return (int32_t)nearbyintf(t);
}

/* Both planes of a row in the classic block layout: hi at q, lo at q + row bytes; scales
 * 128·D and D in every block of gd; sums over every gs elements. */
static void quantize_planes(const float *x, void *q, int64_t k, enum cpu_act act, int gd, int gs) {
    int8_t *hi = q, *lo = (int8_t *)q + cpu_act_row_bytes(act, k);
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f, dd = amax / (float)CPU_ACT_VMAX;
    for (int64_t i = 0; i < k; i++) {
        int32_t v = act_v(x[i], id);
        int32_t h = (v + 64 + 128 * 128) / 128 - 128; /* floor((v + 64) / 128) */
        hi[i] = (int8_t)h;
        lo[i] = (int8_t)(v - 128 * h);
    }
    for (int p = 0; p < 2; p++) {
        int8_t *qs = p ? lo : hi;
        float *d = (float *)(qs + k);
        int16_t *s = (int16_t *)(d + k / gd);
        for (int64_t b = 0; b < k / gd; b++)
            d[b] = p ? dd : 128.0f * dd;
        for (int64_t g = 0; g < k / gs; g++) {
            int sum = 0;
            for (int i = 0; i < gs; i++)
                sum += qs[gs * g + i];
            s[g] = (int16_t)sum;
        }
    }
}

void cpu_quantize_q8_32_scalar(const float *x, void *q, int64_t k) {
    quantize_planes(x, q, k, CPU_ACT_Q8_32, 32, 32);
}

void cpu_quantize_q8_K_scalar(const float *x, void *q, int64_t k) {
    quantize_planes(x, q, k, CPU_ACT_Q8_K, 256, 16);
}

/* X2_32 (fused two-plane kernels of the legacy types). */
void cpu_quantize_x2_32_scalar(const float *x, void *q, int64_t k) {
    int8_t *hi = q, *lo = (int8_t *)q + cpu_x2_kp(k);
    int32_t *neg = (int32_t *)((char *)q + 2 * cpu_x2_kp(k));
    float *sv = (float *)((char *)q + 3 * cpu_x2_kp(k));
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        int32_t bsum = 0;
        for (int l = 0; l < 8; l++) {
            int32_t lsum = 0;
            for (int e = 0; e < 4; e++) {
                int64_t i = 32 * b + 4 * l + e;
                int32_t v = act_v(x[i], id);
                int32_t h = (v + 64 + 128 * 128) / 128 - 128;
                hi[i] = (int8_t)h;
                lo[i] = (int8_t)(v - 128 * h);
                lsum += v;
            }
            neg[8 * b + l] = -lsum;
            bsum += lsum;
        }
        sv[b] = (float)bsum;
    }
    sv[k / 32] = amax / (float)CPU_ACT_VMAX;
}

/* X16_32 / X16_64: v as int16 with sums per 16, each chunk of W elements in quad-pair order
 * (cpu_kernels.h): position (W/2)·h + 2λ + e holds element 4λ + 2h + e. */
static void quantize_x16(const float *x, void *q, int64_t k, int W) {
    int16_t *v16 = q;
    float *sv = (float *)(v16 + k);
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f;
    for (int64_t c = 0; c < k; c += W) {
        const int w = k - c < W ? (int)(k - c) : W; /* X16_64's last chunk may be 32 */
        int16_t t[64];
        for (int i = 0; i < w; i++)
            t[i] = (int16_t)act_v(x[c + i], id);
        for (int g = 0; g < w / 16; g++) {
            int32_t sum = 0;
            for (int i = 0; i < 16; i++)
                sum += t[16 * g + i];
            sv[c / 16 + g] = (float)sum;
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < w / 4; l++)
                for (int e = 0; e < 2; e++)
                    v16[c + w / 2 * h + 2 * l + e] = t[4 * l + 2 * h + e];
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

void cpu_quantize_x16_32_scalar(const float *x, void *q, int64_t k) {
    quantize_x16(x, q, k, 32);
}

void cpu_quantize_x16_64_scalar(const float *x, void *q, int64_t k) {
    quantize_x16(x, q, k, 64);
}

/* XK (repacked K-quant decode): both planes, pair sums of v, sums of v per 16, D. */
void cpu_quantize_xk_scalar(const float *x, void *q, int64_t k) {
    const size_t kp = cpu_x2_kp(k);
    int8_t *hi = q, *lo = (int8_t *)q + kp;
    int16_t *p2 = (int16_t *)((char *)q + 2 * kp);
    float *sv = (float *)((char *)q + 2 * kp + (size_t)k);
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f;
    for (int64_t g = 0; g < k / 16; g++) {
        int32_t sum = 0;
        for (int i = 16 * g; i < 16 * g + 16; i += 2) {
            int32_t v0 = act_v(x[i], id), v1 = act_v(x[i + 1], id);
            for (int e = 0; e < 2; e++) {
                int32_t v = e ? v1 : v0;
                int32_t h = (v + 64 + 128 * 128) / 128 - 128;
                hi[i + e] = (int8_t)h;
                lo[i + e] = (int8_t)(v - 128 * h);
            }
            p2[i / 2] = (int16_t)(v0 + v1);
            sum += v0 + v1;
        }
        sv[g] = (float)sum;
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
    int16_t *c32 = (int16_t *)cpu_xk_c32(q, k);
    for (int64_t g = 0; g < k / 16; g++)
        for (int p = 0; p < 2; p++)
            for (int s = 0; s < 2; s++) {
                const int8_t *pl = p ? lo : hi;
                int32_t sum = 0;
                for (int m = 0; m < 4; m++)
                    sum += pl[16 * g + 4 * m + 2 * s] + pl[16 * g + 4 * m + 2 * s + 1];
                c32[4 * g + 2 * p + s] = (int16_t)(32 * sum);
            }
}

/* X16_K (AVX2 K-quant prefill): v as int16 in chunk-lane order per super-block, sums per 16
 * in the order of the groups 0, 2, .., 14, 1, 3, .., 15 (cpu_kernels.h). */
void cpu_quantize_x16_k_scalar(const float *x, void *q, int64_t k) {
    int16_t *v16 = q;
    float *sv = (float *)(v16 + k);
    float amax = row_amax(x, k);
    float id = amax > 0.0f ? (float)CPU_ACT_VMAX / amax : 0.0f;
    for (int64_t b = 0; b < k; b += 256) {
        for (int g = 0; g < 16; g++) {
            int32_t sum = 0;
            for (int n = 16 * g; n < 16 * g + 16; n++) {
                const int l = n / 32, j = (n % 32) / 2, e = n % 2, v = act_v(x[b + n], id);
                v16[b + 16 * j + 2 * l + e] = (int16_t)v;
                sum += v;
            }
            sv[b / 16 + (g % 2) * 8 + g / 2] = (float)sum;
        }
    }
    sv[k / 16] = amax / (float)CPU_ACT_VMAX;
}

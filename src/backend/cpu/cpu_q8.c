/* Activation quantization, scalar reference (layouts in cpu_kernels.h).
 *
 * Symmetric: d = amax/127, q = round_half_even(x * (127/amax)). The SIMD quantizers in
 * cpu_matmul_avx2.c / _avx512.c compute the same products in f32 and round the same way,
 * so all paths produce identical bytes (the tests check it).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

/* Quantizes one group of gd elements; writes qs and returns d. */
static float quant_group(const float *x, int8_t *qs, int gd) {
    float amax = 0.0f;
    for (int i = 0; i < gd; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0f) {
        memset(qs, 0, (size_t)gd);
        return 0.0f;
    }
    float id = 127.0f / amax;
    for (int i = 0; i < gd; i++)
        qs[i] = (int8_t)nearbyintf(x[i] * id);
    return amax / 127.0f;
}

void cpu_quantize_q8_32_scalar(const float *x, void *q, int64_t k) {
    int8_t *qs = q;
    float *d = (float *)(qs + k);
    int16_t *s = (int16_t *)(d + k / 32);
    for (int64_t b = 0; b < k / 32; b++) {
        d[b] = quant_group(x + 32 * b, qs + 32 * b, 32);
        int sum = 0;
        for (int i = 0; i < 32; i++)
            sum += qs[32 * b + i];
        s[b] = (int16_t)sum;
    }
}

void cpu_quantize_q8_K_scalar(const float *x, void *q, int64_t k) {
    int8_t *qs = q;
    float *d = (float *)(qs + k);
    int16_t *s = (int16_t *)(d + k / 256);
    for (int64_t b = 0; b < k / 256; b++)
        d[b] = quant_group(x + 256 * b, qs + 256 * b, 256);
    for (int64_t g = 0; g < k / 16; g++) {
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += qs[16 * g + i];
        s[g] = (int16_t)sum;
    }
}

/* Scalar vector kernels and the per-ISA tables (see cpu_ops_vec.h). */
#include "backend/cpu/cpu_ops_vec.h"

#include <math.h>
#include <pthread.h>

#include "util/half.h"

static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static float dot_f16(const float *a, const uint16_t *b, int64_t n) {
    float s[4] = {0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += a[i + j] * f16_to_f32(b[i + j]);
    float r = (s[0] + s[2]) + (s[1] + s[3]);
    for (; i < n; i++) r += a[i] * f16_to_f32(b[i]);
    return r;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

static float exp_sum(float *x, int64_t n, float max) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] = expf(x[i] - max);
    return s;
}

/* The reference definitions (tanhf, expf of libm). */
static void gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        y[i] = 0.5f * x * (1.0f + tanhf(CPU_GELU_K * (x + CPU_GELU_C * x * x * x))) * u[i];
    }
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static void from_f16(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(x[i]);
}

static void gemm_nt(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m,
                    int64_t n, int64_t k, int acc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float d = dot_f32(a + i * lda, b + j * ldb, k);
            c[i * ldc + j] = acc ? c[i * ldc + j] + d : d;
        }
}

static struct cpu_vec tables[CPU_ISA_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    struct cpu_vec scalar = {dot_f32,  dot_f16,  axpy_f32, axpy_f16, exp_sum,
                             gelu_mul, silu_mul, to_f16,   from_f16, gemm_nt};
    for (int i = 0; i < CPU_ISA_COUNT; i++) tables[i] = scalar;
#if defined(__x86_64__)
    /* the fill functions are compiled with their level's flags: only where the CPU has it */
    if (cpu_isa_supported() < CPU_ISA_AVX2) return;
    cpu_vec_fill_avx2(&tables[CPU_ISA_AVX2]);
    tables[CPU_ISA_AVX512] = tables[CPU_ISA_AVX2];
    if (cpu_isa_supported() < CPU_ISA_AVX512) return;
    cpu_vec_fill_avx512(&tables[CPU_ISA_AVX512]);
#endif
}

const struct cpu_vec *cpu_vec_for(enum cpu_isa isa) {
    pthread_once(&once, init);
    enum cpu_isa have = cpu_isa_supported();
    if (isa > have) isa = have;
    return &tables[isa];
}

const struct cpu_vec *cpu_vec_get(void) { return cpu_vec_for(cpu_isa_best()); }

/* Small vector kernels for the CPU ops that are not matmuls (attention, KV store, F16
 * rows): one table per ISA level, chosen once from cpu_isa_best() (cpu_features.h).
 * Every entry has a scalar twin in cpu_ops_vec.c; test_cpu_ops compares them at ragged
 * lengths. Results differ between ISAs only in summation order. */
#ifndef SMELT_CPU_OPS_VEC_H
#define SMELT_CPU_OPS_VEC_H

#include <stdint.h>

#include "backend/cpu/cpu_features.h"

struct cpu_vec {
    /* sum a[i] * b[i] */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* sum a[i] * f16(b[i]) */
    float (*dot_f16)(const float *a, const uint16_t *b, int64_t n);
    /* y[i] += a * x[i] */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    /* x[i] = exp(x[i] - max); returns the sum (relative error of each term < 3e-7) */
    float (*exp_sum)(float *x, int64_t n, float max);
    /* y[i] = gelu(g[i]) * u[i], GELU with the tanh approximation (PyTorch
     * approximate="tanh"); SIMD versions evaluate it as g / (1 + exp(-2 t)), t the tanh
     * argument (the same function: 0.5 (1 + tanh t) = 1 / (1 + exp(-2 t))) */
    void (*gelu_mul)(float *y, const float *g, const float *u, int64_t n);
    /* y[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u */
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
    /* conversions, round to nearest even */
    void (*to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*from_f16)(const uint16_t *x, float *y, int64_t n);
    /* c[i·ldc + j] = (acc ? c[i·ldc + j] : 0) + sum_l a[i·lda + l] · b[j·ldb + l] for
     * i < m, j < n, l < k: a times b transposed, the summed index contiguous in both (the
     * small f32 products of the gated delta rule's chunks) */
    void (*gemm_nt)(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb,
                    int64_t m, int64_t n, int64_t k, int acc);
};

/* GELU tanh approximation: 0.5 x (1 + tanh(K (x + C x^3))). */
#define CPU_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define CPU_GELU_C 0.044715f

/* The table for isa (lowered to what exists). */
const struct cpu_vec *cpu_vec_for(enum cpu_isa isa);
/* The table for cpu_isa_best(). */
const struct cpu_vec *cpu_vec_get(void);

/* Implemented in cpu_ops_vec_avx2.c / cpu_ops_vec_avx512.c. */
void cpu_vec_fill_avx2(struct cpu_vec *v);
void cpu_vec_fill_avx512(struct cpu_vec *v);

#endif

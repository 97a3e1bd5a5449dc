/* Shared by test_moe.c and test_cuda_moe.c: the router's double-precision pieces. */
#ifndef SMELT_TEST_MOE_REF_H
#define SMELT_TEST_MOE_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

/* x / sqrt(mean(x^2) + eps) * w in double (w NULL: no weight). */
static inline void norm_ref(const float *x, const float *w, int64_t n, float eps, double *out) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double inv = 1 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

/* A router case: n rows of n_embd routed to k of n_expert experts. */
struct route_case {
    int64_t n_embd, n_expert, k, n;
    enum moe_gating gating;
    bool bias, pre;
};

#endif

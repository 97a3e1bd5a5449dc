/* Argmax dispatch and the scalar reference: see cpu_argmax.h. */
#include "backend/cpu/cpu_argmax.h"

#include <math.h>
#include <stdatomic.h>

int32_t cpu_argmax_scalar(const float *x, int32_t n, int32_t *n_finite) {
    int32_t best = -1, cnt = 0;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        cnt += x[i] > -INFINITY;
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    }
    if (n_finite) *n_finite = cnt;
    return best;
}

typedef int32_t (*argmax_fn)(const float *, int32_t, int32_t *);

static argmax_fn pick(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return cpu_argmax_avx512;
    if (__builtin_cpu_supports("avx2")) return cpu_argmax_avx2;
    return cpu_argmax_scalar;
}

int32_t cpu_argmax(const float *x, int32_t n, int32_t *n_finite) {
    static _Atomic(argmax_fn) fn;
    argmax_fn f = atomic_load_explicit(&fn, memory_order_relaxed);
    if (!f) {
        f = pick();
        atomic_store_explicit(&fn, f, memory_order_relaxed);
    }
    return f(x, n, n_finite);
}

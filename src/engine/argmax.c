/* Argmax dispatch and the scalar reference: see argmax.h. */
#include "engine/argmax.h"

#include <math.h>
#include <stdatomic.h>

int32_t engine_argmax_scalar(const float *x, int32_t n) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    return best;
}

typedef int32_t (*argmax_fn)(const float *, int32_t);

static argmax_fn pick(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return engine_argmax_avx512;
    if (__builtin_cpu_supports("avx2")) return engine_argmax_avx2;
    return engine_argmax_scalar;
}

int32_t engine_argmax(const float *x, int32_t n) {
    static _Atomic(argmax_fn) fn;
    argmax_fn f = atomic_load_explicit(&fn, memory_order_relaxed);
    if (!f) {
        f = pick();
        atomic_store_explicit(&fn, f, memory_order_relaxed);
    }
    return f(x, n);
}

/* AVX-512 vector kernels for attention (compiled with the AVX-512 flags; used only when
 * the CPU and OS support them). Entries not defined here keep the AVX2 version. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "backend/cpu/cpu_ops_vec.h"
#include "util/half.h"

static float dot_f32(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        i += 16;
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static float dot_f16(const float *a, const uint16_t *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + i))), s0);
    float r = _mm512_reduce_add_ps(s0);
    for (; i < n; i++) r += a[i] * f16_to_f32(b[i]);
    return r;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                                _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

void cpu_vec_fill_avx512(struct cpu_vec *v) {
    v->dot_f32 = dot_f32;
    v->dot_f16 = dot_f16;
    v->axpy_f32 = axpy_f32;
    v->axpy_f16 = axpy_f16;
}
#endif

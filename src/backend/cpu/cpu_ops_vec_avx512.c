/* AVX-512 vector kernels for attention and the GLU activations (compiled with the AVX-512
 * flags; used only when the CPU and OS support them). Entries not defined here keep the
 * AVX2 version. */
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

/* exp over the whole float range, as exp_any in cpu_ops_vec_avx2.c (clamped argument,
 * degree-6 polynomial on |r| <= ln2/2), 2^k applied with vscalefps. */
static inline __attribute__((always_inline)) __m512 exp_any(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

static inline __attribute__((always_inline)) __m512 gelu16(__m512 x) {
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 t = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(-2.0f * CPU_GELU_K)),
                             _mm512_fmadd_ps(x2, _mm512_set1_ps(CPU_GELU_C), _mm512_set1_ps(1.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_any(t)));
}

static inline __attribute__((always_inline)) __m512 silu16(__m512 x) {
    __m512 e = exp_any(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static void gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(gelu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(gelu16(_mm512_maskz_loadu_ps(m, g + i)),
                                                      _mm512_maskz_loadu_ps(m, u + i)));
    }
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(m, g + i)),
                                                      _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void cpu_vec_fill_avx512(struct cpu_vec *v) {
    v->gelu_mul = gelu_mul;
    v->silu_mul = silu_mul;
    v->dot_f32 = dot_f32;
    v->dot_f16 = dot_f16;
    v->axpy_f32 = axpy_f32;
    v->axpy_f16 = axpy_f16;
}
#endif

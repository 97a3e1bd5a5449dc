/* AVX2/FMA/F16C vector kernels for attention and the KV cache (compiled with -mavx2 -mfma
 * -mf16c; called only when cpu_features says the CPU and OS support them). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_ops_vec.h"
#include "util/half.h"

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE __m256 ld16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static float dot_f16(const float *a, const uint16_t *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), ld16(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), ld16(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), ld16(b + i), s0);
    float r = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) r += a[i] * f16_to_f32(b[i]);
    return r;
}

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, ld16(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

/* exp(x) for x in [-87.3, 88.3]: x = k ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial
 * (truncation < 1.3e-7 relative), times 2^k built in the exponent bits. */
INLINE __m256 exp_core(__m256 x) {
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* exp(x) for x <= 0; 0 below -87.3. */
INLINE __m256 exp_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), exp_core(_mm256_max_ps(x, lo)));
}

/* exp(x) over the whole float range: the argument is clamped to [-87.3, 88.3] (results
 * from 1.2e-38 to 2.4e38; callers only need 1/(1+exp) to saturate correctly). Relative
 * error < 3e-7. */
INLINE __m256 exp_any(__m256 x) {
    return exp_core(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f)));
}

/* gelu(x) = x / (1 + exp(-2 K (x + C x^3))) */
INLINE __m256 gelu8(__m256 x) {
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(-2.0f * CPU_GELU_K)),
                             _mm256_fmadd_ps(x2, _mm256_set1_ps(CPU_GELU_C), _mm256_set1_ps(1.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_any(t)));
}

INLINE __m256 silu8(__m256 x) {
    __m256 e = exp_any(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static void gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(gelu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0}, yt[8];
        for (int64_t j = i; j < n; j++) gt[j - i] = g[j], ut[j - i] = u[j];
        _mm256_storeu_ps(yt, _mm256_mul_ps(gelu8(_mm256_loadu_ps(gt)), _mm256_loadu_ps(ut)));
        for (int64_t j = i; j < n; j++) y[j] = yt[j - i];
    }
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0}, yt[8];
        for (int64_t j = i; j < n; j++) gt[j - i] = g[j], ut[j - i] = u[j];
        _mm256_storeu_ps(yt, _mm256_mul_ps(silu8(_mm256_loadu_ps(gt)), _mm256_loadu_ps(ut)));
        for (int64_t j = i; j < n; j++) y[j] = yt[j - i];
    }
}

static float exp_sum(float *x, int64_t n, float max) {
    __m256 vm = _mm256_set1_ps(max), s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, v);
        s = _mm256_add_ps(s, v);
    }
    float r = hsum(s);
    for (; i < n; i++) r += x[i] = expf(x[i] - max);
    return r;
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static void from_f16(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ld16(x + i));
    for (; i < n; i++) y[i] = f16_to_f32(x[i]);
}

void cpu_vec_fill_avx2(struct cpu_vec *v) {
    v->dot_f32 = dot_f32;
    v->dot_f16 = dot_f16;
    v->axpy_f32 = axpy_f32;
    v->axpy_f16 = axpy_f16;
    v->exp_sum = exp_sum;
    v->gelu_mul = gelu_mul;
    v->silu_mul = silu_mul;
    v->to_f16 = to_f16;
    v->from_f16 = from_f16;
}
#endif

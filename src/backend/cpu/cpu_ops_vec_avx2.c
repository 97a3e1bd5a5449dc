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

/* The four sums of a, b, c, d in one vector. */
INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Blocks of 2 rows of a × 4 rows of b: 8 running sums, 6 loads per 8 FMAs; the block's
 * tail of k (k % 8) in scalar; the rows and columns left over by dot_f32. */
static void gemm_nt(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m,
                    int64_t n, int64_t k, int acc) {
    const int64_t k8 = k & ~(int64_t)7;
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
        const float *a0 = a + i * lda, *a1 = a0 + lda;
        float *c0 = c + i * ldc, *c1 = c0 + ldc;
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *b0 = b + j * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
            __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00,
                   s13 = s00;
            for (int64_t l = 0; l < k8; l += 8) {
                const __m256 x0 = _mm256_loadu_ps(a0 + l), x1 = _mm256_loadu_ps(a1 + l);
                __m256 y = _mm256_loadu_ps(b0 + l);
                s00 = _mm256_fmadd_ps(x0, y, s00);
                s10 = _mm256_fmadd_ps(x1, y, s10);
                y = _mm256_loadu_ps(b1 + l);
                s01 = _mm256_fmadd_ps(x0, y, s01);
                s11 = _mm256_fmadd_ps(x1, y, s11);
                y = _mm256_loadu_ps(b2 + l);
                s02 = _mm256_fmadd_ps(x0, y, s02);
                s12 = _mm256_fmadd_ps(x1, y, s12);
                y = _mm256_loadu_ps(b3 + l);
                s03 = _mm256_fmadd_ps(x0, y, s03);
                s13 = _mm256_fmadd_ps(x1, y, s13);
            }
            float r0[4], r1[4];
            _mm_storeu_ps(r0, hsum4(s00, s01, s02, s03));
            _mm_storeu_ps(r1, hsum4(s10, s11, s12, s13));
            const float *bq[4] = {b0, b1, b2, b3};
            for (int q = 0; q < 4; q++) {
                for (int64_t l = k8; l < k; l++) {
                    r0[q] += a0[l] * bq[q][l];
                    r1[q] += a1[l] * bq[q][l];
                }
                c0[j + q] = acc ? c0[j + q] + r0[q] : r0[q];
                c1[j + q] = acc ? c1[j + q] + r1[q] : r1[q];
            }
        }
        for (; j < n; j++) {
            const float d0 = dot_f32(a0, b + j * ldb, k), d1 = dot_f32(a1, b + j * ldb, k);
            c0[j] = acc ? c0[j] + d0 : d0;
            c1[j] = acc ? c1[j] + d1 : d1;
        }
    }
    for (; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float d = dot_f32(a + i * lda, b + j * ldb, k);
            c[i * ldc + j] = acc ? c[i * ldc + j] + d : d;
        }
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
    v->gemm_nt = gemm_nt;
}
#endif

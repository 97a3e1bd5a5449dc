/* AVX2 argmax (see cpu_argmax.h): pass 1 finds the maximum with 4 accumulators (NaN is
 * skipped: vmaxps returns its second operand when either is NaN, and the accumulator is
 * always second) and counts the finite values; pass 2 finds the maximum's first index,
 * usually early. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_argmax.h"

int32_t cpu_argmax_avx2(const float *x, int32_t n, int32_t *n_finite) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = m0, m2 = m0, m3 = m0;
    __m256i c = _mm256_setzero_si256();
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        __m256 d = _mm256_loadu_ps(x + i + 16), e = _mm256_loadu_ps(x + i + 24);
        m0 = _mm256_max_ps(a, m0);
        m1 = _mm256_max_ps(b, m1);
        m2 = _mm256_max_ps(d, m2);
        m3 = _mm256_max_ps(e, m3);
        /* a compare mask is -1 per true lane: subtracting it counts */
        __m256i f = _mm256_add_epi32(_mm256_castps_si256(_mm256_cmp_ps(a, ninf, _CMP_GT_OQ)),
                                     _mm256_castps_si256(_mm256_cmp_ps(b, ninf, _CMP_GT_OQ)));
        __m256i g = _mm256_add_epi32(_mm256_castps_si256(_mm256_cmp_ps(d, ninf, _CMP_GT_OQ)),
                                     _mm256_castps_si256(_mm256_cmp_ps(e, ninf, _CMP_GT_OQ)));
        c = _mm256_sub_epi32(c, _mm256_add_epi32(f, g));
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float lanes[8];
    int32_t cl[8];
    _mm256_storeu_ps(lanes, m0);
    _mm256_storeu_si256((__m256i *)cl, c);
    float mx = -INFINITY;
    int32_t cnt = 0;
    for (int k = 0; k < 8; k++) {
        if (lanes[k] > mx) mx = lanes[k];
        cnt += cl[k];
    }
    for (; i < n; i++) {
        cnt += x[i] > -INFINITY;
        if (x[i] > mx) mx = x[i];
    }
    if (n_finite) *n_finite = cnt;
    if (mx == -INFINITY) return cpu_argmax_scalar(x, n, NULL); /* -1, or an -inf-only row */
    __m256 v = _mm256_set1_ps(mx);
    i = 0;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), v, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == mx) return i;
    return -1;
}

/* AVX2 argmax (see argmax.h): pass 1 finds the maximum with 4 accumulators (NaN is
 * skipped: vmaxps returns its second operand when either is NaN, and the accumulator is
 * always second); pass 2 finds its first index. Both passes stream the row once. */
#include <immintrin.h>
#include <math.h>

#include "engine/argmax.h"

int32_t engine_argmax_avx2(const float *x, int32_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float lanes[8];
    _mm256_storeu_ps(lanes, m0);
    float mx = -INFINITY;
    for (int k = 0; k < 8; k++)
        if (lanes[k] > mx) mx = lanes[k];
    for (; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (mx == -INFINITY) return engine_argmax_scalar(x, n); /* -1, or an -inf-only row */
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

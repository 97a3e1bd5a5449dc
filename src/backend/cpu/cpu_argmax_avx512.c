/* AVX-512 argmax (see cpu_argmax.h): one pass. Each lane keeps the largest value it has
 * seen and the index where it first saw it (strictly-greater updates keep the earliest
 * index; NaN compares false, so it never wins); the lanes are reduced at the end, ties
 * going to the smallest index; finite values are counted on the way. One read of the
 * row: the row is usually not in cache (a logits row is 0.5-1 MB), so the pass count is
 * what costs. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_argmax.h"

int32_t cpu_argmax_avx512(const float *x, int32_t n, int32_t *n_finite) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 v0 = ninf, v1 = v0;
    int32_t cnt = 0;
    __m512i i0 = _mm512_set1_epi32(-1), i1 = i0;
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16), step2 = _mm512_set1_epi32(32);
    __m512i idx1 = _mm512_add_epi32(idx, step);
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        cnt += __builtin_popcount((unsigned)_mm512_cmp_ps_mask(a, ninf, _CMP_GT_OQ)) +
               __builtin_popcount((unsigned)_mm512_cmp_ps_mask(b, ninf, _CMP_GT_OQ));
        __mmask16 ga = _mm512_cmp_ps_mask(a, v0, _CMP_GT_OQ);
        __mmask16 gb = _mm512_cmp_ps_mask(b, v1, _CMP_GT_OQ);
        v0 = _mm512_mask_mov_ps(v0, ga, a);
        i0 = _mm512_mask_mov_epi32(i0, ga, idx);
        v1 = _mm512_mask_mov_ps(v1, gb, b);
        i1 = _mm512_mask_mov_epi32(i1, gb, idx1);
        idx = _mm512_add_epi32(idx, step2);
        idx1 = _mm512_add_epi32(idx1, step2);
    }
    float vals[32];
    int32_t ids[32];
    _mm512_storeu_ps(vals, v0);
    _mm512_storeu_ps(vals + 16, v1);
    _mm512_storeu_si512(ids, i0);
    _mm512_storeu_si512(ids + 16, i1);
    float bv = -INFINITY;
    int32_t best = -1;
    for (int k = 0; k < 32; k++) {
        if (ids[k] < 0) continue;
        if (vals[k] > bv || (vals[k] == bv && ids[k] < best)) {
            bv = vals[k];
            best = ids[k];
        }
    }
    for (; i < n; i++) {
        cnt += x[i] > -INFINITY;
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    }
    if (n_finite) *n_finite = cnt;
    return best;
}

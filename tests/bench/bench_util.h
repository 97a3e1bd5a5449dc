/* What the CPU workbenches (bench_matmul.c, bench_moe.c) share: the CPU clock (wall-clock
 * time is util/clock.h's clock_now), a median's sort order, a fast generator and random
 * weight bytes. Header-only: each bench is one file. */
#ifndef SMELT_BENCH_UTIL_H
#define SMELT_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "quant/quant.h"
#include "util/clock.h"
#include "util/half.h"

/* CPU seconds of the process, all threads. */
static inline double bench_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* qsort order of doubles (for medians). */
static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* xorshift64 */
static unsigned long long bench_rng = 88172645463325252ULL;
static inline unsigned long long bench_next(void) {
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return bench_rng;
}

/* nbytes of random weights of type t: random bytes, except that every 2-byte-aligned f16
 * that would decode to Inf/NaN or a huge scale is replaced by a small value, so results
 * stay finite (the layout does not matter for speed). NULL when out of memory. */
static inline void *bench_weights(uint32_t t, size_t nbytes) {
    uint16_t *w = malloc(nbytes + 8);
    if (!w) return NULL;
    for (size_t i = 0; i < (nbytes + 1) / 2; i++) {
        uint16_t h = (uint16_t)(bench_next() >> 48);
        if (t == QT_F16 || (h & 0x7c00) == 0x7c00 || (h & 0x7c00) > 0x5000)
            h = f32_to_f16(0.01f * (float)((int)(h % 200) - 100) / 100.0f);
        w[i] = h;
    }
    return w;
}

#endif

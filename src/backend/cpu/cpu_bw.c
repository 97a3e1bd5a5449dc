/* STREAM-like read bandwidth (cpu_read_bandwidth, backend.h): the ceiling a memory-bound
 * decode step can reach on this machine, measured the way decode reads, with the same
 * threads, over a buffer as large as the bytes a step reads (so a model that sits in a
 * large last-level cache is measured against that cache, not against DRAM).
 *
 * Each thread sums its contiguous slice as 64-bit words with eight independent
 * accumulators (no vector code needed: 16 bytes per cycle of loads is more than any core's
 * share of DRAM or L3 bandwidth) and stores the sum where the caller can see it, so the
 * loads are not optimized away.
 * One untimed pass touches the pages, then the best of `passes` timed passes counts, as
 * STREAM reports its best. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_pool.h"

struct bw_job {
    const uint64_t *buf;
    size_t words;
    uint64_t sums[256];
};

static void read_task(void *arg, int ith, int nth) {
    struct bw_job *j = arg;
    size_t per = (j->words / (size_t)nth) & ~(size_t)7;
    const uint64_t *p = j->buf + per * (size_t)ith;
    uint64_t s[8] = {0};
    for (size_t i = 0; i < per; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += p[i + k];
    j->sums[ith % 256] += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

smelt_status cpu_read_bandwidth(int n_threads, uint64_t bytes, int passes, double *gbs,
                                struct err *e) {
    *gbs = 0;
    if (passes < 1) passes = 1;
    if (bytes < ((uint64_t)1 << 20)) bytes = (uint64_t)1 << 20;
    struct cpu_pool *pool = NULL;
    smelt_status st = cpu_pool_new(&pool, n_threads, e);
    if (st != SMELT_OK) return st;
    int nth = cpu_pool_size(pool);
    size_t words = (size_t)(bytes / 8) & ~(size_t)(8 * nth - 1);
    uint64_t *buf = aligned_alloc(64, words * 8);
    struct bw_job *j = calloc(1, sizeof *j);
    if (!buf || !j) {
        free(buf);
        free(j);
        cpu_pool_free(pool);
        return err_set(e, SMELT_ERR_NOMEM, "read bandwidth: out of memory for %llu bytes",
                       (unsigned long long)bytes);
    }
    /* huge pages where the kernel gives them, as the repacked weights get (cpu_matmul.c) */
    const uintptr_t huge = (uintptr_t)2 << 20, at = (uintptr_t)buf;
    const uintptr_t h0 = (at + huge - 1) & ~(huge - 1), h1 = (at + words * 8) & ~(huge - 1);
    if (h1 > h0) madvise((void *)h0, h1 - h0, MADV_HUGEPAGE);
    memset(buf, 1, words * 8);
    j->buf = buf;
    j->words = words;
    cpu_pool_run(pool, read_task, j); /* warm-up: caches, TLB */
    double best = 0;
    for (int i = 0; i < passes; i++) {
        double t0 = now_s();
        cpu_pool_run(pool, read_task, j);
        double dt = now_s() - t0;
        if (dt > 0 && (double)(words * 8) / dt > best) best = (double)(words * 8) / dt;
    }
    *gbs = best / 1e9;
    free(buf);
    free(j);
    cpu_pool_free(pool);
    return SMELT_OK;
}

/* STREAM-like read bandwidth (cpu_read_bandwidth, backend.h): the ceiling a memory-bound
 * decode step can reach on this machine, measured the way decode reads, with the same
 * threads, over a buffer as large as the bytes a step reads (so a model that sits in a
 * large last-level cache is measured against that cache, not against DRAM).
 *
 * Each thread sums its contiguous slice as 64-bit words and stores the sum where the
 * caller can see it, so the loads are not optimized away. How many cache lines a core
 * keeps in flight decides what it streams, and two things raise it: 32-byte loads where
 * the CPU has AVX2 (two loads a line instead of four: the load queue then covers twice the
 * lines) and several streams (the thread reads READ_STREAMS parts of its slice in turn).
 * On the 2-core AMD EPYC dev VM (2026-12-04) one core read 16-18 GB/s with 8- or 16-byte
 * loads from one stream, 21-23 with 32-byte loads, 31-32 with 32-byte loads from 4-8
 * streams; the first of these, this loop until then, was below what the Q8_0 decode kernel
 * itself read (21 GB/s), so it was no ceiling. Passes alternate between one stream and
 * READ_STREAMS, and the best counts.
 * One untimed pass of each kind touches the pages, then the best of `passes` timed passes
 * counts, as STREAM reports its best. */
#define READ_STREAMS 4
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

struct bw_job {
    const uint64_t *buf;
    size_t words;
    int streams; /* 1 or READ_STREAMS */
    bool avx2;
    uint64_t sums[256];
};

/* Sums ns parts of `part` words (a multiple of 8) from p, line by line in turn. */
static uint64_t read_words(const uint64_t *p, size_t part, int ns) {
    uint64_t s[8] = {0};
    for (size_t i = 0; i < part; i += 8)
        for (int q = 0; q < ns; q++)
            for (int k = 0; k < 8; k++)
                s[k] += p[(size_t)q * part + i + k];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_words_avx2(const uint64_t *p, size_t part,
                                                                 int ns) {
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t i = 0; i < part; i += 8)
        for (int q = 0; q < ns; q++) {
            const uint64_t *l = p + (size_t)q * part + i; /* 64-byte aligned */
            a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)l));
            b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(l + 4)));
        }
    a = _mm256_add_epi64(a, b);
    return (uint64_t)_mm256_extract_epi64(a, 0) + (uint64_t)_mm256_extract_epi64(a, 1) +
           (uint64_t)_mm256_extract_epi64(a, 2) + (uint64_t)_mm256_extract_epi64(a, 3);
}
#endif

static void read_task(void *arg, int ith, int nth) {
    struct bw_job *j = arg;
    const int ns = j->streams;
    /* the thread's slice, cut into ns parts of whole 64-byte lines */
    const size_t part = (j->words / (size_t)nth / (size_t)ns) & ~(size_t)7;
    const uint64_t *p = j->buf + part * (size_t)ns * (size_t)ith;
#if defined(__x86_64__)
    if (j->avx2) {
        j->sums[ith % 256] += read_words_avx2(p, part, ns);
        return;
    }
#endif
    j->sums[ith % 256] += read_words(p, part, ns);
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
    size_t words = (size_t)(bytes / 8) & ~(size_t)(8 * READ_STREAMS * nth - 1);
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
    j->avx2 = cpu_isa_supported() >= CPU_ISA_AVX2;
    j->streams = 1; /* warm-up, one pass of each kind: caches, TLB */
    cpu_pool_run(pool, read_task, j);
    j->streams = READ_STREAMS;
    cpu_pool_run(pool, read_task, j);
    double best = 0;
    for (int i = 0; i < passes; i++) {
        j->streams = i % 2 ? READ_STREAMS : 1;
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

/* Minimal unit-test harness. Each test file is one executable registered with ctest.
 *
 *   static void test_foo(void) { T_CHECK(x == 1); T_EQ_INT(a, b); }
 *   int main(void) { T_RUN(test_foo); return t_done(); }
 *
 * t_done() prints "N passed, N failed" and returns the exit code. A test that cannot run
 * (no GPU, missing model or shared data) calls t_skip("reason"): it prints the reason and
 * the file exits 77, which ctest reports as skipped, never as passed. A test that needs
 * one of the project's test models (models/, `make models`) calls t_skip_model instead:
 * under SMELT_REQUIRE_MODELS=1 (`make test`, what CI runs) a missing model is a failure.
 */
#ifndef SMELT_TEST_T_H
#define SMELT_TEST_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/file.h"

static int t_pass_, t_fail_, t_skip_, t_cur_fail_, t_cur_skip_;
static const char *t_cur_ = "";

#define T_CHECK(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s (%s:%d): %s\n", t_cur_, __FILE__, __LINE__, #cond);       \
            t_cur_fail_++;                                                                     \
        }                                                                                      \
    } while (0)

#define T_CHECKF(cond, ...)                                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s (%s:%d): %s: ", t_cur_, __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            t_cur_fail_++;                                                                     \
        }                                                                                      \
    } while (0)

#define T_EQ_INT(a, b)                                                                         \
    do {                                                                                       \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                \
        T_CHECKF(t_a_ == t_b_, "%lld != %lld", t_a_, t_b_);                                    \
    } while (0)

#define T_EQ_STR(a, b)                                                                         \
    do {                                                                                       \
        const char *t_a_ = (a), *t_b_ = (b);                                                   \
        T_CHECKF(t_a_ && t_b_ && strcmp(t_a_, t_b_) == 0, "\"%s\" != \"%s\"",                  \
                 t_a_ ? t_a_ : "(null)", t_b_ ? t_b_ : "(null)");                              \
    } while (0)

#define T_NEAR(a, b, tol)                                                                      \
    do {                                                                                       \
        double t_a_ = (double)(a), t_b_ = (double)(b);                                         \
        T_CHECKF(fabs(t_a_ - t_b_) <= (tol), "%.9g vs %.9g (tol %g)", t_a_, t_b_, (double)(tol)); \
    } while (0)

/* T_ONLY (comma-separated test function names) runs only those; the rest are skipped. */
static inline int t_selected_(const char *fn) {
    const char *only = getenv("T_ONLY");
    if (!only || !*only) return 1;
    const size_t n = strlen(fn);
    for (const char *p = only; (p = strstr(p, fn)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return 1;
    return 0;
}

#define T_RUN(fn)                                                                              \
    do {                                                                                       \
        t_cur_ = #fn;                                                                          \
        t_cur_fail_ = 0;                                                                       \
        t_cur_skip_ = 0;                                                                       \
        if (t_selected_(#fn)) fn();                                                            \
        else t_skip("not named in T_ONLY");                                                    \
        if (t_cur_skip_ && !t_cur_fail_) {                                                     \
            t_skip_++;                                                                         \
        } else if (t_cur_fail_) {                                                                     \
            t_fail_++;                                                                         \
            fprintf(stderr, "not ok %s\n", #fn);                                               \
        } else {                                                                               \
            t_pass_++;                                                                         \
        }                                                                                      \
    } while (0)

/* Marks the current test skipped with a reason. Call then return from the test fn. */
#define t_skip(reason)                                                                         \
    do {                                                                                       \
        printf("SKIP %s: %s\n", t_cur_, reason);                                               \
        t_cur_skip_ = 1;                                                                       \
    } while (0)

/* True when the test models must be present (SMELT_REQUIRE_MODELS=1). */
static inline int t_require_models(void) {
    const char *s = getenv("SMELT_REQUIRE_MODELS");
    return s && strcmp(s, "1") == 0;
}

/* t_skip for a missing test model: a failure under SMELT_REQUIRE_MODELS=1. */
static inline void t_skip_model(const char *reason) {
    if (!t_require_models()) {
        t_skip(reason);
        return;
    }
    fprintf(stderr, "FAIL %s: %s (SMELT_REQUIRE_MODELS=1: the test models must be present)\n",
            t_cur_, reason);
    t_cur_fail_++;
}

static inline int t_done(void) {
    if (t_skip_) printf("%d passed, %d failed, %d skipped\n", t_pass_, t_fail_, t_skip_);
    else printf("%d passed, %d failed\n", t_pass_, t_fail_);
    if (t_fail_) return 1;
    if (t_pass_ == 0 && t_skip_ > 0) return 77; /* everything skipped: ctest shows SKIPPED */
    return 0;
}

/* Path helpers: SMELT_SOURCE_DIR / SMELT_SHARED_DIR come from CMake. */
static inline const char *t_shared_dir(void) {
    const char *s = getenv("SMELT_SHARED_DIR");
    return s ? s : SMELT_SHARED_DIR;
}

/* The source tree (tests/data, models/): SMELT_SOURCE_DIR in the environment wins over the
 * configure-time path, so a test binary can run from a copy of the tree elsewhere. */
static inline const char *t_source_dir(void) {
    const char *s = getenv("SMELT_SOURCE_DIR");
    return s ? s : SMELT_SOURCE_DIR;
}

/* The whole file at path (util/file.h: NUL-terminated, "-" is stdin), or NULL when it
 * cannot be read; *len (may be NULL) gets its size. The caller frees it. */
static inline char *t_read_file(const char *path, size_t *len) {
    char *p;
    size_t n;
    struct err e;
    if (file_read_all(path, &p, &n, &e) != SMELT_OK) return NULL;
    if (len) *len = n;
    return p;
}

/* Deterministic PRNG for tests (xorshift64*), seeded per test. */
static inline unsigned long long t_rand_u64(unsigned long long *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
/* Uniform in [-1, 1). */
static inline float t_rand_f(unsigned long long *s) {
    return (float)((t_rand_u64(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}
/* The largest |a - b| over the largest |b| (b the reference; n elements). */
static inline double t_rel_err(const float *a, const float *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}
/* Standard normal (Box-Muller). */
static inline float t_randn(unsigned long long *s) {
    double u1 = ((t_rand_u64(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (t_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif

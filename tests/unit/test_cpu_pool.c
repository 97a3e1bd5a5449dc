/* Thread pool: every index runs exactly once per call, across many rapid calls, across
 * sleeps (the futex path), and writes made inside the job are visible to the caller; an
 * idle pool uses no CPU. */
#include <stdatomic.h>
#include <time.h>

#include "backend/cpu/cpu_pool.h"
#include "t.h"

#define MAXT 16

struct hits {
    atomic_int count[MAXT];
    atomic_int bad_nth;
    int nth_expected;
    long stamp[MAXT]; /* plain writes, checked by the caller after the run */
    long gen;
};

static void mark(void *ctx, int ith, int nth) {
    struct hits *h = ctx;
    if (nth != h->nth_expected || ith < 0 || ith >= MAXT) {
        atomic_fetch_add(&h->bad_nth, 1);
        return;
    }
    atomic_fetch_add(&h->count[ith], 1);
    h->stamp[ith] = h->gen;
}

static void run_checks(int n_threads, int calls, int sleep_every) {
    struct cpu_pool *p = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&p, n_threads, &e), SMELT_OK);
    if (!p) return;
    int nth = cpu_pool_size(p);
    T_EQ_INT(nth, n_threads);
    struct hits h;
    memset(&h, 0, sizeof h);
    h.nth_expected = nth;
    int errors = 0;
    for (int call = 1; call <= calls; call++) {
        h.gen = call;
        cpu_pool_run(p, mark, &h);
        for (int i = 0; i < nth; i++) {
            if (atomic_load(&h.count[i]) != call || h.stamp[i] != call) errors++;
        }
        for (int i = nth; i < MAXT; i++)
            if (atomic_load(&h.count[i]) != 0) errors++;
        if (sleep_every && call % sleep_every == 0) {
            struct timespec ts = {0, 3 * 1000 * 1000}; /* 3 ms: workers go to the futex */
            nanosleep(&ts, NULL);
        }
    }
    T_CHECKF(errors == 0, "%d threads: %d index/visibility errors over %d calls", n_threads, errors,
             calls);
    T_EQ_INT(atomic_load(&h.bad_nth), 0);
    cpu_pool_free(p);
}

static void test_pool_exactly_once(void) {
    run_checks(1, 1000, 0);
    run_checks(2, 20000, 0);
    run_checks(3, 5000, 0);
    run_checks(5, 2000, 0); /* more threads than cores: must still be correct */
}

static void test_pool_sleep_wake(void) {
    run_checks(2, 60, 1);
    run_checks(4, 60, 3);
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* An idle pool uses no CPU: after a burst of jobs and the spin window, the process's CPU
 * time over 300 ms of waiting stays under 15 ms (a spinning worker would take up to 300 ms). A server waiting for requests depends on this. */
static void test_pool_idle_no_cpu(void) {
    /* no more threads than CPUs: an oversubscribed pool spins only briefly anyway */
    int n = cpu_count_online() < 4 ? cpu_count_online() : 4;
    if (n < 2) n = 2;
    struct cpu_pool *p = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&p, n, &e), SMELT_OK);
    if (!p) return;
    struct hits h;
    memset(&h, 0, sizeof h);
    h.nth_expected = n;
    for (int i = 0; i < 200; i++)
        cpu_pool_run(p, mark, &h);
    struct timespec settle = {0, 100 * 1000 * 1000}, idle = {0, 300 * 1000 * 1000};
    nanosleep(&settle, NULL);
    double c0 = cpu_seconds();
    nanosleep(&idle, NULL);
    double used = cpu_seconds() - c0;
    T_CHECKF(used < 0.015, "idle pool of %d threads used %.1f ms of CPU in 300 ms", n, used * 1e3);
    cpu_pool_free(p);
}

static void test_pool_default_size(void) {
    struct cpu_pool *p = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&p, 0, &e), SMELT_OK);
    T_EQ_INT(cpu_pool_size(p), cpu_count_online());
    T_CHECK(cpu_count_online() >= 1);
    cpu_pool_free(p);
    cpu_pool_free(NULL);
    T_EQ_INT(cpu_pool_size(NULL), 1);
    /* NULL pool: runs on the caller once */
    struct hits h;
    memset(&h, 0, sizeof h);
    h.nth_expected = 1;
    h.gen = 7;
    cpu_pool_run(NULL, mark, &h);
    T_EQ_INT(atomic_load(&h.count[0]), 1);
    T_EQ_INT(h.stamp[0], 7);
}

static void test_pool_create_destroy(void) {
    /* Rapid create/free, including freeing a pool that never ran a job. */
    for (int i = 0; i < 50; i++) {
        struct cpu_pool *p = NULL;
        struct err e = {0};
        T_EQ_INT(cpu_pool_new(&p, 3, &e), SMELT_OK);
        if (i % 2) {
            struct hits h;
            memset(&h, 0, sizeof h);
            h.nth_expected = 3;
            cpu_pool_run(p, mark, &h);
            T_EQ_INT(atomic_load(&h.count[2]), 1);
        }
        cpu_pool_free(p);
    }
    struct cpu_pool *p = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&p, 100000, &e), SMELT_ERR_INVALID);
    T_CHECK(p == NULL);
}

int main(void) {
    T_RUN(test_pool_exactly_once);
    T_RUN(test_pool_sleep_wake);
    T_RUN(test_pool_idle_no_cpu);
    T_RUN(test_pool_default_size);
    T_RUN(test_pool_create_destroy);
    return t_done();
}

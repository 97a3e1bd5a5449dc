/* Fork-join thread pool: spin-then-futex on a generation counter. See cpu_pool.h.
 *
 * Protocol (all cross-thread flags seq_cst so the sleep/wake handshakes are Dekker-safe):
 *   caller: write fn/ctx, pending = nth-1, gen++ ; if sleepers > 0: futex_wake(gen)
 *           run fn(ctx, 0, nth); wait until pending == 0 (spin, then futex on pending)
 *   worker: wait until gen != seen (spin, then sleepers++, futex_wait(gen, seen));
 *           run fn(ctx, ith, nth); if --pending == 0 and the caller sleeps: futex_wake.
 * The fields the workers poll sit on their own cache lines so the spinning readers do not
 * fight with writes to unrelated fields.
 */
#include "backend/cpu/cpu_pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations (each a pause, ~10-140 cycles depending on the core) before sleeping.
 * ~50-200 us: long enough to bridge the gap between two ops of a forward pass, short
 * enough that an idle pool stops burning a shared machine's CPU quickly. */
#define SPIN_ITERS 20000

struct worker {
    struct cpu_pool *pool;
    pthread_t th;
    int ith;
};

struct cpu_pool {
    int n;
    int spin;               /* spin iterations before sleeping (fewer when oversubscribed) */
    struct worker *workers; /* n - 1 */
    cpu_pool_fn fn;
    void *ctx;
    _Alignas(64) atomic_uint gen;     /* futex word: bumped once per job (and at stop) */
    _Alignas(64) atomic_int pending;  /* futex word: workers not yet done with this job */
    _Alignas(64) atomic_int sleepers; /* workers blocked (or about to block) on gen */
    atomic_int caller_sleeping;
    atomic_bool stop;
};

/* One spin step: a pause, and every 256 steps a yield, so that a thread waiting for a
 * descheduled one (more threads than free cores, e.g. a loaded machine) gives it the core. */
static inline void backoff(int i) {
    if ((i & 255) == 255)
        sched_yield();
    else
        cpu_relax();
}

static long futex_wait(void *addr, unsigned val) {
    return syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static long futex_wake(void *addr, int n) {
    return syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

int cpu_count_online(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct cpu_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < p->spin; i++) {
            backoff(i);
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping))
            futex_wake(&p->pending, 1);
    }
    return NULL;
}

smelt_status cpu_pool_new(struct cpu_pool **out, int n_threads, struct err *e) {
    *out = NULL;
    if (n_threads <= 0) n_threads = cpu_count_online();
    if (n_threads > 1024)
        return err_set(e, SMELT_ERR_INVALID, "thread pool: %d threads is too many (max 1024)",
                       n_threads);
    struct cpu_pool *p = aligned_alloc(64, (sizeof *p + 63) & ~(size_t)63);
    if (!p) return err_set(e, SMELT_ERR_NOMEM, "thread pool: out of memory");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    p->spin = n_threads > cpu_count_online() ? 512 : SPIN_ITERS;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, false);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            free(p);
            return err_set(e, SMELT_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            struct worker *w = &p->workers[i];
            w->pool = p;
            w->ith = i + 1;
            int rc = pthread_create(&w->th, NULL, worker_main, w);
            if (rc != 0) {
                p->n = i + 1; /* join the ones started */
                cpu_pool_free(p);
                return err_set(e, SMELT_ERR_INTERNAL, "thread pool: pthread_create #%d: %s", i + 1,
                               strerror(rc));
            }
        }
    }
    *out = p;
    return SMELT_OK;
}

void cpu_pool_free(struct cpu_pool *p) {
    if (!p) return;
    if (p->n > 1) {
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->gen, 1);
        futex_wake(&p->gen, INT_MAX);
        for (int i = 0; i < p->n - 1; i++)
            pthread_join(p->workers[i].th, NULL);
    }
    free(p->workers);
    free(p);
}

int cpu_pool_size(const struct cpu_pool *p) {
    return p ? p->n : 1;
}

void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx/pending */
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->gen, INT_MAX);
    fn(ctx, 0, p->n);
    int left = atomic_load_explicit(&p->pending, memory_order_acquire);
    for (int i = 0; left != 0 && i < p->spin; i++) {
        backoff(i);
        left = atomic_load_explicit(&p->pending, memory_order_acquire);
    }
    if (left != 0) {
        atomic_store(&p->caller_sleeping, 1);
        while ((left = atomic_load(&p->pending)) != 0)
            futex_wait(&p->pending, (unsigned)left);
        atomic_store(&p->caller_sleeping, 0);
    }
}

/* Thread pool for the CPU backend: fork-join over a fixed set of threads.
 *
 * cpu_pool_run(p, fn, ctx) runs fn(ctx, ith, nth) once for every ith in [0, nth) — the
 * calling thread is ith 0, the pool's nth-1 workers the rest — and returns when all have
 * returned. It is made for ~200 short jobs per generated token (one per op): workers spin
 * briefly on a generation counter after each job, so back-to-back jobs start in well under
 * a microsecond, and then sleep on a futex so an idle pool costs no CPU. The caller waits
 * the same way for the last worker.
 *
 * One caller at a time: cpu_pool_run is not reentrant and must not be called concurrently
 * on the same pool, nor from inside fn. Work inside fn may use its own atomics for dynamic
 * scheduling (cpu_matmul does).
 */
#ifndef SMELT_BACKEND_CPU_POOL_H
#define SMELT_BACKEND_CPU_POOL_H

#include "util/err.h"

struct cpu_pool;

typedef void (*cpu_pool_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads threads counting the caller (n_threads - 1 are spawned).
 * n_threads <= 0 means the number of CPUs this process may run on. */
smelt_status cpu_pool_new(struct cpu_pool **out, int n_threads, struct err *e);
/* Stops and joins the workers; NULL is a no-op. */
void cpu_pool_free(struct cpu_pool *p);
/* Number of threads, the caller included (>= 1). */
int cpu_pool_size(const struct cpu_pool *p);
/* Runs fn(ctx, ith, nth) on every thread and returns when all are done. A NULL pool runs
 * fn(ctx, 0, 1) on the caller. Memory written by any thread inside fn is visible to the
 * caller after return (and the caller's writes before the call are visible inside fn). */
void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *ctx);
/* Number of CPUs available to this process (sched_getaffinity; at least 1). */
int cpu_count_online(void);

#endif

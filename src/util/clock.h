/* Clocks: elapsed time for measurements and timeouts, and deadlines for
 * pthread_cond_timedwait. */
#ifndef SMELT_UTIL_CLOCK_H
#define SMELT_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds on the monotonic clock (CLOCK_MONOTONIC: never steps back, unaffected by a
 * change of the wall clock). Only differences mean anything: t1 - t0 is the time between
 * two calls, with nanosecond resolution for spans of weeks. */
double clock_now(void);

/* The wall-clock (CLOCK_REALTIME) instant ms milliseconds from now, normalized
 * (0 <= tv_nsec < 1e9): the absolute deadline pthread_cond_timedwait takes for a
 * condition variable of default attributes. ms < 0 counts as 0. */
struct timespec clock_after_ms(int64_t ms);

#endif

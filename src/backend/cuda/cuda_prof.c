/* SMELT_PROFILE=1: per-kernel GPU time of eager steps (the section comment below), printed
 * as a table when the backend is freed. */
#include "backend/cuda/cuda_backend_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- profile (SMELT_PROFILE=1) ----
 * Kernels run eagerly on one stream; an event recorded after each kernel (or small group
 * of kernels) of name `name` closes its interval, which starts at the previous event. At
 * each sync the intervals are summed per name; cu_free prints the table (time share, time
 * per call and, where the caller gave the bytes a kernel reads, GB/s). So that intervals
 * measure the GPU and not the host's enqueueing, each step starts with a gate kernel that
 * holds the stream until the host has enqueued the whole step (sync opens it; it also
 * opens by itself after 2 s, so a queue that fills up cannot deadlock). The events between
 * kernels stop programmatic launch overlap: the figures are per-kernel times in sequence. */
void cu_prof_mark(struct cuda_backend *cb, uint64_t bytes, const char *fmt, ...) {
    if (!cb->prof || !cu_ok(cb)) return;
    if (cb->n_pev == cb->cap_pev) {
        int nc = cb->cap_pev ? cb->cap_pev * 2 : 1024;
        struct prof_ev *a = realloc(cb->pev, (size_t)nc * sizeof *a);
        if (!a) return;
        for (int i = cb->cap_pev; i < nc; i++)
            if (cudaEventCreate(&a[i].ev) != cudaSuccess) {
                cudaGetLastError();
                cb->pev = a;
                cb->cap_pev = i;
                return;
            }
        cb->pev = a;
        cb->cap_pev = nc;
    }
    struct prof_ev *p = &cb->pev[cb->n_pev++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->bytes = bytes;
    cudaEventRecord(p->ev, cb->ctx.stream);
}

/* After cudaStreamSynchronize: folds this step's intervals into the table. */
void cu_prof_collect(struct cuda_backend *cb) {
    cudaEvent_t prev = cb->prof_start;
    for (int i = 0; i < cb->n_pev; i++) {
        struct prof_ev *p = &cb->pev[i];
        float ms = 0;
        if (cudaEventElapsedTime(&ms, prev, p->ev) != cudaSuccess) {
            cudaGetLastError();
            ms = 0;
        }
        prev = p->ev;
        int j = 0;
        while (j < cb->n_prow && strcmp(cb->prow[j].name, p->name) != 0) j++;
        if (j == cb->n_prow) {
            if (cb->n_prow == cb->cap_prow) {
                int nc = cb->cap_prow ? cb->cap_prow * 2 : 64;
                struct prof_row *a = realloc(cb->prow, (size_t)nc * sizeof *a);
                if (!a) continue;
                cb->prow = a;
                cb->cap_prow = nc;
            }
            memset(&cb->prow[j], 0, sizeof cb->prow[j]);
            memcpy(cb->prow[j].name, p->name, sizeof p->name);
            cb->n_prow++;
        }
        cb->prow[j].calls++;
        cb->prow[j].bytes += p->bytes;
        cb->prow[j].ms += ms;
    }
    cb->n_pev = 0;
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const struct prof_row *)a)->ms, y = ((const struct prof_row *)b)->ms;
    return (x < y) - (x > y);
}

void cu_prof_print(struct cuda_backend *cb) {
    if (!cb->prof || !cb->n_prow) return;
    qsort(cb->prow, (size_t)cb->n_prow, sizeof *cb->prow, prof_cmp);
    double total = 0;
    for (int i = 0; i < cb->n_prow; i++) total += cb->prow[i].ms;
    fprintf(stderr, "SMELT_PROFILE: %.3f ms of GPU time over all steps (events after each kernel)\n", total);
    fprintf(stderr, "%-48s %9s %10s %7s %9s %8s\n", "kernel", "calls", "ms", "share", "us/call", "GB/s");
    for (int i = 0; i < cb->n_prow; i++) {
        const struct prof_row *r = &cb->prow[i];
        fprintf(stderr, "%-48s %9llu %10.3f %6.1f%% %9.2f", r->name, (unsigned long long)r->calls, r->ms,
                total > 0 ? 100.0 * r->ms / total : 0.0, r->calls ? 1e3 * r->ms / (double)r->calls : 0.0);
        if (r->bytes && r->ms > 0) fprintf(stderr, " %8.0f", (double)r->bytes / (r->ms * 1e6));
        fputc('\n', stderr);
    }
}

/* The profile's stream gate (SMELT_PROFILE=1, cuda_prof.c). */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
}

/* ---------------------------------------------------------------- kernels ---- */

/* Spins until *flag (host-mapped memory) is non-zero or timeout_ns pass: holds the stream
 * while the host enqueues a whole step (SMELT_PROFILE). */
static __global__ void gate_kernel(const volatile int *flag, unsigned long long timeout_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        if (*flag) return;
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < timeout_ns);
}
/* --------------------------------------------------------------- launchers ---- */

extern "C" void cuda_gate(struct cuda_ctx *ctx, const int *flag, unsigned long long timeout_ns) {
    gate_kernel<<<1, 1, 0, ctx->stream>>>(flag, timeout_ns);
}

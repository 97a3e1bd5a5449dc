/* The CUDA backend's constructor and device queries (implementation: cuda_backend.c).
 * Only built when nvcc was found (SMELT_HAVE_CUDA). */
#ifndef SMELT_CUDA_BACKEND_H
#define SMELT_CUDA_BACKEND_H

#include <stdint.h>

#include "backend/backend.h"

/* Number of visible CUDA devices (0 when none, or no driver). */
int cuda_device_count(void);
/* The backend on device `device` (an index among the visible devices). */
smelt_status cuda_backend_new(struct backend **out, int device, struct err *e);
/* Device bytes held by bound weights. */
uint64_t cuda_backend_weight_bytes(const struct backend *b);
/* The matmul path recorded for weights (type, rows, k) at n token rows, for tests and
 * benches (struct mmtune_ent, backend/cuda/mm_tune.h: the choice, its time, every candidate's
 * time), or NULL when nothing is recorded for that key (not seen yet, seen only during
 * capture, n < 2, 2..8 rows where mmb is no candidate, the type has no tensor-core kernel,
 * or measuring is off). Valid until
 * the backend records another key or is freed. */
struct mmtune_ent;
const struct mmtune_ent *cuda_backend_mm_entry(const struct backend *b, uint32_t type, int64_t rows, int64_t k,
                                               int64_t n);
/* The backend's launch context (cuda_ctx.h: its device, stream and the kernels' counters),
 * for tests that check the counters after an op. Owned by the backend. */
struct cuda_ctx;
struct cuda_ctx *cuda_backend_ctx(struct backend *b);
/* The device's read bandwidth in GB/s (*gbs): a sum over two device buffers of bytes / 2
 * each (halved while they do not fit, down to 32 MiB each), read in turn, best of `passes`
 * timed passes after one untimed one (cuda_membw.cu). What a memory-bound decode step can
 * reach (smelt bench's bound). Errors: INVALID (bytes < 2 MiB, passes < 1), DEVICE. */
smelt_status cuda_read_bandwidth(int device, uint64_t bytes, int passes, double *gbs, struct err *e);
/* Free and total device memory. */
smelt_status cuda_mem_info(int device, uint64_t *free_b, uint64_t *total_b, struct err *e);

#endif

/* The launch context of smelt's CUDA kernels: one device, one stream, and every piece of
 * state a launch keeps between calls. Every launcher (cuda_kernels.h, cuda_mmv.h,
 * cuda_mmq.h) takes one as its first argument and enqueues on its stream.
 *
 * Nothing of it is process-wide (issue 17): a backend owns one context (tests make their
 * own), so two backends on two GPUs, or two on one GPU, each on its own stream, run side by
 * side from one thread or several. A context is used by one thread at a time. What it
 * holds, and where that state lived before:
 *   - programmatic dependent launch: on or off for the device, and the fence set after a
 *     copy (the globals cuda_pdl_on and cuda_pdl_fence);
 *   - device facts: SM count (the attention and top-k plans' static caches), the mmq tiles'
 *     occupancy (cuda_mmq.cu's g_dev);
 *   - kernels whose dynamic shared-memory limit is raised on the device (the attention
 *     launchers' static once-flags, which a second GPU never got);
 *   - device counters that split kernels count their blocks in, zero between calls: the
 *     decode attention's and the top-k merge's (two __device__ arrays, which two streams
 *     of one GPU shared), and the small-batch matmul's;
 *   - the tests' one-token mmv variant (cuda_mmv_variant). */
#ifndef SMELT_CUDA_CTX_H
#define SMELT_CUDA_CTX_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_CTX_FUNCS 512         /* kernels a context remembers per attribute */
#define CUDA_ATTN_COUNTERS 4096    /* the decode attention's split counters (cuda_attn.cu) */
#define CUDA_TOPK_COUNTERS 1024    /* top-k's per-row merge counters (cuda_sample.cu) */
#define CUDA_MMB_COUNTERS 65536    /* the small-batch matmul's row-tile counters (cuda_mmb.cu) */
#define CUDA_MMQ_TYPES 4           /* Q4_K, Q6_K, Q8_0, MXFP4 (cuda_mmq.cu) */
#define CUDA_MMQ_TILES 11          /* cuda_mmq_tile_count() */

struct cuda_ctx {
    int device;           /* the CUDA device (an index among the visible ones) */
    cudaStream_t stream;  /* where every launch goes */
    int n_sm;             /* multiprocessors; 0 in a context made without a device
                           * (cuda_attn_plan's tests): the plans then assume an H200's 132 */
    int smem_optin;       /* shared memory a block may opt in to, bytes (0 in a context
                           * made without a device) */
    int wgmma;            /* the device code runs wgmma (an sm_90a image on an sm_90 device:
                           * cuda_probe_wgmma) and SMELT_NO_WGMMA is unset; 0 in a context
                           * made without a device */
    int pdl_on;           /* sm_90+ and SMELT_NO_PDL unset: kernels launched with
                           * programmatic stream serialization (cuda_common.cuh) */
    int pdl_fence;        /* set after a copy on the stream: the next kernel is launched
                           * fully ordered (griddepcontrol.wait covers kernels only) */
    int mmv_variant;      /* tests: the one-token mmv kernels' shape (0 = the default) */
    int mmv_id_variant[2]; /* benchmarks (SMELT_MMV_ID_VARIANT=G,D): the one-token expert
                            * launches' shape, [0] gate/up, [1] down (0 = the default) */
    /* mmq: the tiles' resident blocks per SM on this device, queried at first use */
    int mmq_ready;
    int mmq_occ[CUDA_MMQ_TYPES][CUDA_MMQ_TILES];
    /* kernels whose dynamic shared-memory limit this context has raised */
    const void *smem_raised[CUDA_CTX_FUNCS];
    int n_smem_raised;
    unsigned *attn_cnt;   /* device: CUDA_ATTN_COUNTERS zeroed counters */
    unsigned *topk_cnt;   /* device: CUDA_TOPK_COUNTERS zeroed counters */
    int *mmb_cnt;         /* device: CUDA_MMB_COUNTERS zeroed counters */
};

/* A context for `device`, launching on `stream` (0: the legacy default stream): makes the
 * device current on the calling thread, reads its facts, SMELT_NO_PDL and SMELT_NO_WGMMA, allocates and
 * zeroes the counters (synchronously). On error nothing is left to free. */
smelt_status cuda_ctx_init(struct cuda_ctx *c, int device, cudaStream_t stream, struct err *e);
/* *ok = 1 when the device code the driver loads for the current device was built with
 * wgmma (cuda_probe.cu): runs a one-thread kernel, synchronously. */
cudaError_t cuda_probe_wgmma(int *ok);
/* Frees the counters (the device must be current; the stream is the owner's). */
void cuda_ctx_free(struct cuda_ctx *c);

#ifdef __cplusplus
}
#endif
#endif

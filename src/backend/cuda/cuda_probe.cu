/* What the device code this build runs on the current device can do (cuda_ctx_init). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"

extern "C" {
#include "backend/cuda/cuda_ctx.h"
}

/* SMELT_WGMMA as the device code the driver picked for this device was compiled: 1 only
 * from an sm_90a image (cuda_mma.cuh), not from PTX compiled for another architecture and
 * JIT-compiled here. */
static __global__ void probe_wgmma_kernel(int *out) {
    *out = SMELT_WGMMA;
}

extern "C" cudaError_t cuda_probe_wgmma(int *ok) {
    *ok = 0;
    int *d = NULL, h = 0;
    cudaError_t ce = cudaMalloc((void **)&d, sizeof *d);
    if (ce != cudaSuccess) return ce;
    probe_wgmma_kernel<<<1, 1>>>(d);
    ce = cudaGetLastError();
    if (ce == cudaSuccess) ce = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (ce == cudaSuccess) *ok = h == 1;
    return ce;
}

/* The launch context (cuda_ctx.h): creation and teardown. */
#include "backend/cuda/cuda_ctx.h"

#include <stdlib.h>
#include <string.h>

smelt_status cuda_ctx_init(struct cuda_ctx *c, int device, cudaStream_t stream, struct err *e) {
    memset(c, 0, sizeof *c);
    c->device = device;
    c->stream = stream;
    int major = 0;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device);
    if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return err_set(e, SMELT_ERR_DEVICE, "CUDA device %d: %s", device, cudaGetErrorString(rc));
    }
    const char *np = getenv("SMELT_NO_PDL");
    c->pdl_on = major >= 9 && !(np && *np && strcmp(np, "0") != 0);
    const size_t a = sizeof(unsigned) * CUDA_ATTN_COUNTERS, t = sizeof(unsigned) * CUDA_TOPK_COUNTERS,
                 m = sizeof(int) * CUDA_MMB_COUNTERS;
    rc = cudaMalloc((void **)&c->attn_cnt, a);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&c->topk_cnt, t);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&c->mmb_cnt, m);
    if (rc == cudaSuccess) rc = cudaMemset(c->attn_cnt, 0, a);
    if (rc == cudaSuccess) rc = cudaMemset(c->topk_cnt, 0, t);
    if (rc == cudaSuccess) rc = cudaMemset(c->mmb_cnt, 0, m);
    if (rc == cudaSuccess) rc = cudaDeviceSynchronize(); /* zero before any kernel on any stream */
    if (rc == cudaSuccess) rc = cuda_probe_wgmma(&c->wgmma);
    const char *nw = getenv("SMELT_NO_WGMMA");
    if (nw && *nw && strcmp(nw, "0") != 0) c->wgmma = 0;
    if (rc != cudaSuccess) {
        cudaGetLastError();
        cuda_ctx_free(c);
        return err_set(e, SMELT_ERR_DEVICE, "CUDA device %d: the kernels' counters (%zu bytes) or the wgmma probe: %s", device, a + t + m,
                       cudaGetErrorString(rc));
    }
    return SMELT_OK;
}

void cuda_ctx_free(struct cuda_ctx *c) {
    cudaFree(c->attn_cnt);
    cudaFree(c->topk_cnt);
    cudaFree(c->mmb_cnt);
    c->attn_cnt = c->topk_cnt = NULL;
    c->mmb_cnt = NULL;
}

/* The device's read bandwidth (cuda_read_bandwidth, cuda_backend.h): the ceiling a
 * memory-bound decode step can reach, measured as TARGETS.md's H200 figure was (4.38 TB/s:
 * a sum over two buffers read in turn, each far larger than L2). smelt bench takes the
 * bound of its bw % column from it, so the percentages hold on any GPU. No CPU twin: it
 * computes nothing but a checksum that keeps the loads. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "util/err.h"
}

#define BW_THREADS 256
#define BW_UNROLL 4 /* independent 16-byte loads in flight per thread */

/* Every 16-byte word of p once, BW_UNROLL words a thread at a time, XOR-folded; the fold
 * reaches memory only if it equals an unlikely key, which the compiler cannot rule out, so
 * no load is dropped and almost nothing is written. */
static __global__ void __launch_bounds__(BW_THREADS) read_fold_kernel(const uint4 *p, size_t n, unsigned key,
                                                                     unsigned *out) {
    const size_t stride = (size_t)gridDim.x * BW_THREADS;
    unsigned s = 0;
    size_t i = (size_t)blockIdx.x * BW_THREADS + threadIdx.x;
    for (; i + (BW_UNROLL - 1) * stride < n; i += BW_UNROLL * stride) {
        uint4 v[BW_UNROLL];
#pragma unroll
        for (int u = 0; u < BW_UNROLL; u++) v[u] = p[i + u * stride];
#pragma unroll
        for (int u = 0; u < BW_UNROLL; u++) s ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = p[i];
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == key) *out = s;
}

extern "C" smelt_status cuda_read_bandwidth(int device, uint64_t bytes, int passes, double *gbs, struct err *e) {
    if (passes < 1 || bytes < ((uint64_t)2 << 20))
        return err_set(e, SMELT_ERR_INVALID, "cuda read bandwidth: %llu bytes, %d passes",
                       (unsigned long long)bytes, passes);
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t rc = cudaSetDevice(device);
    struct cudaDeviceProp prop;
    if (rc == cudaSuccess) rc = cudaGetDeviceProperties(&prop, device);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        cudaSetDevice(prev);
        return err_set(e, SMELT_ERR_DEVICE, "cuda read bandwidth: device %d: %s", device, cudaGetErrorString(rc));
    }
    /* two buffers of half the bytes each; halved while the device cannot hold them, down to
     * 32 MiB each (L2-sized reads would measure the cache, not the memory) */
    uint64_t half = (bytes / 2) & ~(uint64_t)15;
    void *buf[2] = {NULL, NULL};
    unsigned *out = NULL;
    while (half >= ((uint64_t)32 << 20)) {
        if (cudaMalloc(&buf[0], half) == cudaSuccess && cudaMalloc(&buf[1], half) == cudaSuccess) break;
        cudaGetLastError();
        cudaFree(buf[0]);
        cudaFree(buf[1]);
        buf[0] = buf[1] = NULL;
        half /= 2;
    }
    cudaStream_t st = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    rc = buf[0] ? cudaSuccess : cudaErrorMemoryAllocation;
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&out, sizeof(unsigned));
    if (rc == cudaSuccess) rc = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (rc == cudaSuccess) rc = cudaEventCreate(&ev[0]);
    if (rc == cudaSuccess) rc = cudaEventCreate(&ev[1]);
    if (rc == cudaSuccess) rc = cudaMemsetAsync(buf[0], 1, half, st);
    if (rc == cudaSuccess) rc = cudaMemsetAsync(buf[1], 2, half, st);
    const size_t words = half / 16;
    const unsigned grid = (unsigned)prop.multiProcessorCount * 8;
    double best = 0;
    for (int pass = 0; pass <= passes && rc == cudaSuccess; pass++) { /* pass 0: untimed */
        cudaEventRecord(ev[0], st);
        for (int b = 0; b < 2; b++)
            read_fold_kernel<<<grid, BW_THREADS, 0, st>>>((const uint4 *)buf[b], words, 0x5eed1234u, out);
        cudaEventRecord(ev[1], st);
        rc = cudaEventSynchronize(ev[1]);
        float ms = 0;
        if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (rc == cudaSuccess && pass > 0 && ms > 0) {
            const double v = 2.0 * (double)half / ((double)ms * 1e6);
            if (v > best) best = v;
        }
    }
    if (rc == cudaSuccess) rc = cudaGetLastError();
    else cudaGetLastError();
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    if (st) cudaStreamDestroy(st);
    cudaFree(out);
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    cudaSetDevice(prev);
    if (rc != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda read bandwidth: %s", cudaGetErrorString(rc));
    *gbs = best;
    return SMELT_OK;
}

/* Shared helpers for smelt's CUDA kernels: status-returning error checks, warp
 * reductions, and the byte helpers the quantized kernels use. */
#ifndef SMELT_CUDA_COMMON_CUH
#define SMELT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "util/err.h"
}

/* Returns a smelt status from the enclosing function when a runtime call fails. */
#define CUDA_TRY(call, e)                                                                       \
    do {                                                                                        \
        cudaError_t cuda_rc_ = (call);                                                          \
        if (cuda_rc_ != cudaSuccess)                                                            \
            return err_set((e), SMELT_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,   \
                           cudaGetErrorString(cuda_rc_));                                       \
    } while (0)

/* After a launch: the launch's own error (bad config), not the kernel's completion. */
#define CUDA_TRY_LAUNCH(e) CUDA_TRY(cudaGetLastError(), e)

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

#endif

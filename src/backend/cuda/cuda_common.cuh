/* Shared helpers for smelt's CUDA kernels: status-returning error checks, warp
 * reductions, and the byte helpers the quantized kernels use. */
#ifndef SMELT_CUDA_COMMON_CUH
#define SMELT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_ctx.h"
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

/* Blocks of tb threads that cover n elements. */
static inline unsigned nblocks(int64_t n, int tb) { return (unsigned)((n + tb - 1) / tb); }

/* ---- programmatic dependent launch (Hopper+) ----
 * Kernels launched with klaunch() may start while the kernel before them in the stream is
 * still running (cudaLaunchAttributeProgrammaticStreamSerialization; kept by graph capture
 * as a programmatic edge). Contract for every such kernel:
 *   - before pdl_wait() it reads only data no earlier kernel of the step writes (weights),
 *     and writes nothing;
 *   - pdl_wait() returns once the previous kernel has completed and its writes are
 *     visible (and, transitively, every kernel before it);
 *   - pdl_trigger() lets the next kernel launch early (its blocks then run their own
 *     pre-wait part). Triggering at the start is safe: the next grid only launches once
 *     every block of this one is running or done.
 *   - data an earlier kernel of the step wrote (activations, the step's inputs) is never
 *     read through the read-only path (no `const T *__restrict__` on it, no __ldg): such a
 *     kernel's blocks can be resident while that data is still being written, and the
 *     non-coherent cache may hand them lines of an earlier layer's buffer at the same
 *     scratch address (seen on the H200 as wrong logits under graph replay).
 * On devices before sm_90, and with SMELT_NO_PDL=1 (cuda_ctx.pdl_on = 0), klaunch()
 * launches normally and both calls compile to nothing. */
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* Asks L2 for the 128-byte lines of [p, p + bytes), one line a thread of the block's x
 * dimension: weights that a kernel reads only after its PDL wait and a dependent step (a
 * norm's weights after the sum of squares, an epilogue's after the counts), fetched while
 * the previous kernel or the block's own work runs. A hint: nothing waits on it. */
static __device__ __forceinline__ void l2_prefetch(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (size_t o = (size_t)threadIdx.x * 128; o < bytes; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
}

/* Asks L2 for [p, p + bytes) in one instruction (the bulk copy engine's prefetch; sm_90 and
 * newer, nothing before): p 16-byte aligned, bytes a multiple of 16. A hint, like l2_prefetch. */
static __device__ __forceinline__ void bulk_prefetch_l2(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p;
    (void)bytes;
#endif
}

/* *p += v at GPU scope with acquire-release semantics; returns the old value. The counter of
 * a split result: the block's threads write their parts, meet at a barrier, and one thread
 * counts; the release makes every part the barrier ordered before it visible to whichever
 * block's acquire reads the count after it, and that block's barrier hands them on to its
 * threads. One fence a block, where __threadfence() in every thread is a fence a thread. */
static __device__ __forceinline__ int atomic_add_acq_rel(int *p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(p), "r"(v)
                 : "memory");
    return old;
}

/* cuda_ctx.pdl_fence is set by the context's owner after a host<->device copy on the
 * stream: griddepcontrol.wait covers only the previous *kernel*, so the first kernel after a
 * copy (the step's inputs) is launched without the attribute, fully ordered after the copy.
 * Measured on the H200: without this, the first kernel of a step read the token ids before
 * they had arrived. */

/* A kernel's dynamic shared-memory limit raised to `bytes` (above 48 KB it needs the
 * opt-in), once per context: recorded only when it worked, so a failure stays pending for
 * the launch that follows to report. */
static inline void smem_optin_once(struct cuda_ctx *c, const void *fn, size_t bytes) {
    for (int i = 0; i < c->n_smem_raised; i++)
        if (c->smem_raised[i] == fn) return;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess &&
        c->n_smem_raised < CUDA_CTX_FUNCS)
        c->smem_raised[c->n_smem_raised++] = fn;
}

/* Launches kernel on c's stream, with programmatic dependent launch when c has it on and
 * no copy came since the last kernel. */
template <typename... P, typename... A>
static inline cudaError_t klaunch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, struct cuda_ctx *c,
                                  A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c->pdl_on && !c->pdl_fence ? 1 : 0;
    c->pdl_fence = 0;
    return cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

/* Conversions between f32 and the cache/activation element types. */
template <typename T>
static __device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

/* Tests: synchronizes the device and counts the non-zero entries of one of a context's
 * counter arrays (n <= CUDA_ATTN_COUNTERS: the split and merge counters, zero between
 * calls); -1 on a CUDA error. */
static inline int device_counters_busy(const unsigned *cnt, int n) {
    unsigned h[CUDA_ATTN_COUNTERS];
    if (n > CUDA_ATTN_COUNTERS || cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, cnt, sizeof(unsigned) * (size_t)n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    int busy = 0;
    for (int i = 0; i < n; i++) busy += h[i] != 0;
    return busy;
}

#endif

/* Row normalizations of the CUDA backend: RMSNorm, the gated RMSNorm (norm_gate), LayerNorm
 * and softmax (one block per row, block reductions). CPU twins: src/backend/cpu/. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_glu.cuh"
#include "backend/cuda/cuda_mmq.cuh" /* the f16 activations of the mmq products */
#include "backend/cuda/cuda_mmv.cuh" /* quant16: the int8 form of a decode norm_gate's output */
#include "backend/cuda/cuda_norm.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
}

/* ---------------------------------------------------------------- kernels ---- */

/* One block per row (rms_inv). H16: the values stored as the mmq products' f16 activations
 * (dst is their scratch: cuda_mmq.cuh's mmq_pos, mmq_f16; the counters zeroed) instead of f32
 * rows ds apart: the bits of the f32 form then cuda_mmq_quantize, in one pass. */
template <bool H16>
static __global__ void rms_norm_kernel(void *dst, const float *x, const float *__restrict__ w, int64_t n, int64_t xs,
                                       int64_t ds, float eps) {
    if (w) l2_prefetch(w, (size_t)n * sizeof(float)); /* read after the sum of squares */
    pdl_wait();
    pdl_trigger();
    if (H16) mmq_zero_cnt(mmq_cnt(dst));
    const float *xr = x + blockIdx.x * xs;
    const float inv = rms_inv(xr, n, eps, blockDim.x);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] * inv * (w ? w[i] : 1.0f);
        if (H16) mmq_xh(dst)[blockIdx.x * n + mmq_pos(i)] = mmq_f16(v);
        else ((float *)dst)[blockIdx.x * ds + i] = v;
    }
}

/* dst = act(gate) * (x / sqrt(mean(x^2) + eps) * w) over groups of n contiguous elements, a
 * block per group of cuda_rms_norm's size with rms_norm_kernel's sums,
 * so each value is the bits of rms_norm_kernel then glu_kernel. xq not NULL: the output's
 * int8 form too (quant16, cuda_mmv_quantize's layout and bits); then n % 32 == 0, so every
 * warp's trips are whole and its 16-lane halves hold aligned groups. In place on gate ok. */
static __global__ void norm_gate_kernel(float *dst, const float *x, const float *__restrict__ w, const float *gate,
                                        int act, int64_t n, float eps, int8_t *__restrict__ xq,
                                        float2 *__restrict__ xd) {
    pdl_wait();
    pdl_trigger();
    norm_gate_group(dst, x, w, gate, act, (int64_t)blockIdx.x * n, n, eps, xq, xd, blockDim.x);
}

static __device__ float block_reduce(float v, bool is_max, float *sh) {
    v = is_max ? warp_max(v) : warp_sum(v);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float u = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : (is_max ? -INFINITY : 0.0f);
        u = is_max ? warp_max(u) : warp_sum(u);
        if (threadIdx.x == 0) sh[0] = u;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

static __global__ void softmax_kernel(float *x, int64_t n) {
    pdl_wait();
    pdl_trigger();
    __shared__ float sh[32];
    float *r = x + blockIdx.x * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, r[i]);
    mx = block_reduce(mx, true, sh);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(r[i] - mx);
        r[i] = e;
        s += e;
    }
    s = block_reduce(s, false, sh);
    const float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}
/* LayerNorm (encoders: bert), one block per row: the mean, then the biased variance around
 * it (two passes, as the CPU's cpu_op_layer_norm, which sums in double: here f32 partial
 * sums, a tree reduction), y = (x - mean) / sqrt(var + eps) * w + b (w, b may be NULL). */
static __global__ void layer_norm_kernel(float *dst, const float *x, const float *__restrict__ w,
                                         const float *__restrict__ b, int64_t n, int64_t xs, int64_t ds,
                                         float eps) {
    pdl_wait();
    pdl_trigger();
    __shared__ float sh[32];
    const float *xr = x + blockIdx.x * xs;
    float *dr = dst + blockIdx.x * ds;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_reduce(s, false, sh) / (float)n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = xr[i] - mean;
        ss += d * d;
    }
    const float inv = rsqrtf(block_reduce(ss, false, sh) / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (xr[i] - mean) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        dr[i] = v;
    }
}

/* --------------------------------------------------------------- launchers ---- */


extern "C" void cuda_rms_norm(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, int64_t n, int64_t rows,
                              int64_t x_stride, int64_t dst_stride, float eps) {
    const int tb = rms_threads(n);
    klaunch(rms_norm_kernel<false>, dim3((unsigned)rows), dim3(tb), 0, ctx, (void *)dst, x, w, n, x_stride,
            dst_stride, eps);
}

extern "C" void cuda_rms_norm_h16(struct cuda_ctx *ctx, void *scratch, const float *x, const float *w, int64_t n,
                                  int64_t rows, int64_t x_stride, float eps) {
    const int tb = rms_threads(n);
    klaunch(rms_norm_kernel<true>, dim3((unsigned)rows), dim3(tb), 0, ctx, scratch, x, w, n, x_stride, (int64_t)0,
            eps);
}

extern "C" void cuda_norm_gate(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, const float *gate,
                               int act, int64_t n, int64_t groups, float eps, int8_t *xq, void *xd) {
    const int tb = rms_threads(n);
    klaunch(norm_gate_kernel, dim3((unsigned)groups), dim3(tb), 0, ctx, dst, x, w, gate, act, n, eps, xq,
            (float2 *)xd);
}

extern "C" void cuda_softmax(struct cuda_ctx *ctx, float *x, int64_t n, int64_t rows) {
    klaunch(softmax_kernel, dim3((unsigned)rows), dim3(256), 0, ctx, x, n);
}

extern "C" void cuda_layer_norm(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                                int64_t n, int64_t rows, int64_t x_stride, int64_t dst_stride, float eps) {
    int tb = n >= 1024 ? 512 : n >= 256 ? 256 : 64;
    klaunch(layer_norm_kernel, dim3((unsigned)rows), dim3(tb), 0, ctx, dst, x, w, b, n, x_stride, dst_stride, eps);
}

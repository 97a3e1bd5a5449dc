/* The RMSNorm arithmetic shared by cuda_norm.cu's kernels and the fused decode DeltaNet's
 * epilogue (cuda_ssm.cu), so that a value is the same bits whichever launch computes it.
 * Include after cuda_common.cuh, cuda_glu.cuh and cuda_mmv.cuh (warp_sum, glu_val, quant16). */
#ifndef SMELT_CUDA_NORM_CUH
#define SMELT_CUDA_NORM_CUH

/* The threads that reduce a row of n (rms_inv's nt): one size for every caller, so their
 * sums agree. */
static inline __host__ __device__ int rms_threads(int64_t n) { return n >= 1024 ? 512 : n >= 256 ? 256 : 64; }

/* x[i], from L2 when CG (other blocks' stores of the same launch). */
template <bool CG> static __device__ __forceinline__ float norm_ld(const float *x, int64_t i) {
    if (CG) return __ldcg(x + i);
    return x[i];
}

/* 1 / sqrt(mean(xr[0, n)^2) + eps) by threads [0, nt) of the block (nt a multiple of 32,
 * at most blockDim.x; every thread of the block calls it, the others add nothing): f32
 * partial sums a thread, a warp tree, then one over the nt / 32 warps. */
template <bool CG = false>
static __device__ __forceinline__ float rms_inv(const float *xr, int64_t n, float eps, int nt) {
    float ss = 0.0f;
    if ((int)threadIdx.x < nt)
        for (int64_t i = threadIdx.x; i < n; i += nt) {
            const float v = norm_ld<CG>(xr, i);
            ss += v * v;
        }
    __shared__ float part[32];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0 && (int)threadIdx.x < nt) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = (int)threadIdx.x < (nt >> 5) ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    return rsqrtf(part[0] / (float)n + eps);
}

/* The gated RMSNorm of one group of n at element o0 by threads [0, nt) (nt = rms_threads(n);
 * every thread of the block calls it; CG: x from L2): dst = act(gate) * (x / sqrt(mean(x^2) + eps) * w),
 * and when xq is not NULL its int8 form (quant16; then n % 32 == 0, so every warp's trips
 * are whole and its 16-lane halves hold aligned groups). In place on gate ok. */
template <bool CG = false>
static __device__ __forceinline__ void norm_gate_group(float *dst, const float *x, const float *__restrict__ w,
                                                       const float *gate, int act, int64_t o0, int64_t n,
                                                       float eps, int8_t *__restrict__ xq,
                                                       float2 *__restrict__ xd, int nt) {
    const float *xr = x + o0;
    const float inv = rms_inv<CG>(xr, n, eps, nt);
    if ((int)threadIdx.x >= nt) return;
    for (int64_t i = threadIdx.x; i < n; i += nt) {
        const float v = glu_val(act, gate[o0 + i], norm_ld<CG>(xr, i) * inv * w[i]);
        dst[o0 + i] = v;
        if (xq) quant16(v, xq, xd, o0 + i, true);
    }
}

#endif

/* RoPE (with the optional per-head Q/K RMSNorm that precedes it) and the paged KV-cache
 * store. CPU twins: src/backend/cpu/cpu_ops_rope.c, cpu_ops_attn.c (kv_store).
 *
 * RoPE angles follow the CPU's formula (see cpu_ops_rope.c): inv_freq_i =
 * base^(-2i/n_rot) / freq_factors[i], YaRN ramp between corr_lo and corr_hi. The CPU
 * computes them in double; here pow/sin/cos run in float with the angle reduced in
 * double (positions reach 10^5 and more, where a float angle loses digits). */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "quant/quant.h"
}

/* Optional RMSNorm of one head's row xr (head_dim values, in place), then its rotation at
 * position p; blockDim threads of one block. */
static __device__ void rope_row(float *xr, double p, int head_dim, const struct cuda_rope &r,
                                const float *__restrict__ norm_w, float eps) {
    if (norm_w) {
        __shared__ float part[32];
        float ss = 0.0f;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += xr[i] * xr[i];
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) tot += part[w];
        const float inv = rsqrtf(tot / (float)head_dim + eps);
        __syncthreads();
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) xr[i] = xr[i] * inv * norm_w[i];
        __syncthreads();
    }
    const int half = r.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq = pow((double)r.freq_base, -2.0 * i / r.n_rot);
        if (r.freq_factors) inv_freq /= (double)r.freq_factors[i];
        const double theta_ext = p * inv_freq;
        double theta = (double)r.freq_scale * theta_ext;
        if (r.ext_factor != 0.0f) {
            const double y = (i - (double)r.corr_lo) / fmax(0.001, (double)r.corr_hi - r.corr_lo);
            const double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            const double mix = ramp * r.ext_factor;
            theta = theta * (1 - mix) + theta_ext * mix;
        }
        double sd, cd;
        sincos(theta, &sd, &cd);
        const float c = (float)(cd * r.mscale), s = (float)(sd * r.mscale);
        const int i0 = r.mode == 2 ? i : 2 * i, i1 = r.mode == 2 ? i + half : 2 * i + 1;
        const float x0 = xr[i0], x1 = xr[i1];
        xr[i0] = x0 * c - x1 * s;
        xr[i1] = x0 * s + x1 * c;
    }
}

/* One block per (head, token): optional RMSNorm of the head, then rotation. */
static __global__ void rope_kernel(float *x, const int32_t *pos, int head_dim,
                                   int n_head, struct cuda_rope r, const float *__restrict__ norm_w,
                                   float eps) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    rope_row(x + (t * n_head + h) * (int64_t)head_dim, (double)pos[t], head_dim, r, norm_w, eps);
}

/* Decode/prefill attention prologue in one launch, one block per (head, token):
 * blocks h < n_head norm and rotate Q head h in place; blocks n_head + j norm and rotate K
 * head j in place, then store K head j and V head j into the caches at slot[t]. */
template <typename T>
static __global__ void rope_kv_kernel(float *q, float *k, const float *v,
                                      T *kc, T *vc, const int32_t *pos,
                                      const int32_t *slot, int dk, int dv, int n_head, int n_kv,
                                      int block_size, struct cuda_rope r, const float *__restrict__ q_norm,
                                      const float *__restrict__ k_norm, float eps) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    const double p = (double)pos[t];
    if (h < n_head) {
        rope_row(q + (t * n_head + h) * (int64_t)dk, p, dk, r, q_norm, eps);
        return;
    }
    const int j = h - n_head;
    float *kr = k + (t * n_kv + j) * (int64_t)dk;
    rope_row(kr, p, dk, r, k_norm, eps);
    __syncthreads();
    const int64_t s = slot[t], blk = s / block_size, off = s % block_size;
    T *kd = kc + ((blk * n_kv + j) * block_size + off) * dk;
    T *vd = vc + ((blk * n_kv + j) * block_size + off) * dv;
    const float *vs = v + (t * n_kv + j) * (int64_t)dv;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) kd[i] = from_f32<T>(kr[i]);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) vd[i] = from_f32<T>(vs[i]);
}

/* One block per (kv head, token): copies that head's K and V rows into the slot. */
template <typename T>
static __global__ void kv_store_kernel(T *kc, T *vc, const float *k,
                                       const float *v, const int32_t *slot, int dk,
                                       int dv, int n_kv, int block_size) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    const int64_t s = slot[t], blk = s / block_size, off = s % block_size;
    T *kd = kc + ((blk * n_kv + h) * block_size + off) * dk;
    T *vd = vc + ((blk * n_kv + h) * block_size + off) * dv;
    const float *ks = k + (t * n_kv + h) * dk, *vs = v + (t * n_kv + h) * dv;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) kd[i] = from_f32<T>(ks[i]);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) vd[i] = from_f32<T>(vs[i]);
}

extern "C" void cuda_rope_inplace(float *x, const int32_t *pos, int head_dim, int n_head, int64_t n_tokens,
                                  const struct cuda_rope *r, const float *norm_w, float eps, void *stream) {
    dim3 grid((unsigned)n_head, (unsigned)n_tokens);
    int tb = head_dim >= 256 ? 128 : 64;
    klaunch(rope_kernel, grid, dim3(tb), 0, (cudaStream_t)stream, x, pos, head_dim, n_head, *r, norm_w, eps);
}

extern "C" void cuda_kv_store(void *kc, void *vc, uint32_t cache_type, const float *k, const float *v,
                              const int32_t *slot, int dk, int dv, int n_kv, int block_size, int64_t n_tokens,
                              void *stream) {
    dim3 grid((unsigned)n_kv, (unsigned)n_tokens);
    cudaStream_t st = (cudaStream_t)stream;
    if (cache_type == QT_F16)
        klaunch(kv_store_kernel<__half>, grid, dim3(128), 0, st, (__half *)kc, (__half *)vc, k, v, slot, dk, dv, n_kv,
                block_size);
    else if (cache_type == QT_BF16)
        klaunch(kv_store_kernel<__nv_bfloat16>, grid, dim3(128), 0, st, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, k,
                v, slot, dk, dv, n_kv, block_size);
    else
        klaunch(kv_store_kernel<float>, grid, dim3(128), 0, st, (float *)kc, (float *)vc, k, v, slot, dk, dv, n_kv,
                block_size);
}

extern "C" void cuda_rope_kv_store(float *q, float *k, const float *v, void *kc, void *vc, uint32_t cache_type,
                                   const int32_t *pos, const int32_t *slot, int dk, int dv, int n_head, int n_kv,
                                   int block_size, int64_t n_tokens, const struct cuda_rope *r,
                                   const float *q_norm, const float *k_norm, float eps, void *stream) {
    dim3 grid((unsigned)(n_head + n_kv), (unsigned)n_tokens);
    dim3 tb(dk >= 256 ? 128 : 64);
    cudaStream_t st = (cudaStream_t)stream;
    if (cache_type == QT_F16)
        klaunch(rope_kv_kernel<__half>, grid, tb, 0, st, q, k, v, (__half *)kc, (__half *)vc, pos, slot, dk, dv,
                n_head, n_kv, block_size, *r, q_norm, k_norm, eps);
    else if (cache_type == QT_BF16)
        klaunch(rope_kv_kernel<__nv_bfloat16>, grid, tb, 0, st, q, k, v, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc,
                pos, slot, dk, dv, n_head, n_kv, block_size, *r, q_norm, k_norm, eps);
    else
        klaunch(rope_kv_kernel<float>, grid, tb, 0, st, q, k, v, (float *)kc, (float *)vc, pos, slot, dk, dv, n_head,
                n_kv, block_size, *r, q_norm, k_norm, eps);
}

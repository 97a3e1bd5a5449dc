/* RoPE (with the optional per-head Q/K RMSNorm that precedes it) and the paged KV-cache
 * store. CPU twins: src/backend/cpu/cpu_ops_rope.c, cpu_ops_attn.c (kv_store).
 *
 * RoPE angles follow the CPU's formula (see cpu_ops_rope.c): inv_freq_i =
 * base^(-2i/n_rot) / freq_factors[i], YaRN ramp between corr_lo and corr_hi, folded into
 * a per-pair table made once per parameter set (cuda_rope_freq_fill); see cuda_rope.cuh
 * for the angle's precision. */
#include "backend/cuda/cuda_rope.cuh"

extern "C" {
#include "quant/quant.h"
}

/* freq[i] = base^(-2i/n_rot) / freq_factors[i] * (freq_scale (1 - mix_i) + mix_i): the
 * linear scaling and YaRN's ramp between interpolation (freq_scale) and extrapolation (1)
 * folded into one speed, so that angle = pos * freq[i] is what cpu_rope_cache computes as
 * theta_interp (1 - mix) + theta_extrap mix. One thread per pair, in double. */
static __global__ void rope_freq_kernel(double *freq, struct cuda_rope r) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= r.n_rot / 2) return;
    double inv = pow((double)r.freq_base, -2.0 * i / r.n_rot);
    if (r.freq_factors) inv /= (double)r.freq_factors[i];
    double mul = (double)r.freq_scale;
    if (r.ext_factor != 0.0f) {
        const double y = (i - (double)r.corr_lo) / fmax(0.001, (double)r.corr_hi - r.corr_lo);
        const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * r.ext_factor;
        mul = mul * (1 - mix) + mix;
    }
    freq[i] = inv * mul;
}

extern "C" void cuda_rope_freq_fill(struct cuda_ctx *ctx, double *freq, const struct cuda_rope *r) {
    const int half = r->n_rot / 2;
    if (half < 1) return;
    rope_freq_kernel<<<(half + 127) / 128, 128, 0, ctx->stream>>>(freq, *r);
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
        const float2 cs = rope_cs(r, p, i);
        const int2 e = rope_pair(r.mode, half, i);
        const float x0 = xr[e.x], x1 = xr[e.y];
        xr[e.x] = x0 * cs.x - x1 * cs.y;
        xr[e.y] = x0 * cs.y + x1 * cs.x;
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

extern "C" void cuda_rope_inplace(struct cuda_ctx *ctx, float *x, const int32_t *pos, int head_dim,
                                  int n_head, int64_t n_tokens, const struct cuda_rope *r,
                                  const float *norm_w, float eps) {
    dim3 grid((unsigned)n_head, (unsigned)n_tokens);
    int tb = head_dim >= 256 ? 128 : 64;
    klaunch(rope_kernel, grid, dim3(tb), 0, ctx, x, pos, head_dim, n_head, *r, norm_w, eps);
}

extern "C" void cuda_kv_store(struct cuda_ctx *ctx, void *kc, void *vc, uint32_t cache_type,
                              const float *k, const float *v, const int32_t *slot, int dk, int dv,
                              int n_kv, int block_size, int64_t n_tokens) {
    dim3 grid((unsigned)n_kv, (unsigned)n_tokens);
    if (cache_type == QT_F16)
        klaunch(kv_store_kernel<__half>, grid, dim3(128), 0, ctx, (__half *)kc, (__half *)vc, k, v, slot, dk, dv, n_kv,
                block_size);
    else if (cache_type == QT_BF16)
        klaunch(kv_store_kernel<__nv_bfloat16>, grid, dim3(128), 0, ctx, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, k,
                v, slot, dk, dv, n_kv, block_size);
    else
        klaunch(kv_store_kernel<float>, grid, dim3(128), 0, ctx, (float *)kc, (float *)vc, k, v, slot, dk, dv, n_kv,
                block_size);
}

extern "C" void cuda_rope_kv_store(struct cuda_ctx *ctx, float *q, float *k, const float *v,
                                   void *kc, void *vc, uint32_t cache_type, const int32_t *pos,
                                   const int32_t *slot, int dk, int dv, int n_head, int n_kv,
                                   int block_size, int64_t n_tokens, const struct cuda_rope *r,
                                   const float *q_norm, const float *k_norm, float eps) {
    dim3 grid((unsigned)(n_head + n_kv), (unsigned)n_tokens);
    dim3 tb(dk >= 256 ? 128 : 64);
    if (cache_type == QT_F16)
        klaunch(rope_kv_kernel<__half>, grid, tb, 0, ctx, q, k, v, (__half *)kc, (__half *)vc, pos, slot, dk, dv,
                n_head, n_kv, block_size, *r, q_norm, k_norm, eps);
    else if (cache_type == QT_BF16)
        klaunch(rope_kv_kernel<__nv_bfloat16>, grid, tb, 0, ctx, q, k, v, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc,
                pos, slot, dk, dv, n_head, n_kv, block_size, *r, q_norm, k_norm, eps);
    else
        klaunch(rope_kv_kernel<float>, grid, tb, 0, ctx, q, k, v, (float *)kc, (float *)vc, pos, slot, dk, dv, n_head,
                n_kv, block_size, *r, q_norm, k_norm, eps);
}

/* Attention over the paged KV cache (decode and prefill rows alike), split across the
 * key range (flash-decoding) when there are few (row, head) pairs to fill the GPU.
 * CPU twin: src/backend/cpu/cpu_ops_attn.c.
 *
 * Grid (n_head, n_tokens, n_split); 4 warps per block. A block takes one query head of
 * one row and one contiguous slice of that row's visible keys [j0, pos]; its warps take
 * keys round-robin. Each lane holds head_dim/32 elements of q and of the output
 * accumulator; a key costs one coalesced row read of K and V and one warp reduction.
 * Softmax is online (running max and sum per warp), merged across warps in shared memory,
 * and across splits by a second small kernel. Keys past pos are never read, so a recycled
 * block's old contents are unreachable; the sliding window moves j0.
 *
 * This is the correctness-first kernel: prefill rows repeat the K/V reads per query head
 * (no tiling, no tensor cores). The FlashAttention-style tiled prefill kernel is next. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "quant/quant.h"
}

#define ATT_WARPS 4
#define ATT_MAX_D 256
#define ATT_PER_LANE (ATT_MAX_D / 32)

template <typename T>
static __device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
static __global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_kernel(const struct cuda_attn_args a, const T *__restrict__ kc, const T *__restrict__ vc, int n_split) {
    const int h = blockIdx.x, split = blockIdx.z;
    const int64_t t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = h / (a.n_head / a.n_kv);
    const int pos = a.pos[t];
    const int j0 = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    const int n_keys = pos - j0 + 1;
    const int chunk = (n_keys + n_split - 1) / n_split;
    const int k_begin = j0 + split * chunk;
    const int k_end = min(k_begin + chunk, pos + 1);
    const int32_t *table = a.blocks + (int64_t)a.seq[t] * a.max_blocks;

    float q[ATT_PER_LANE], o[ATT_PER_LANE];
    const float *qr = a.q + (t * a.n_head + h) * (int64_t)a.dk;
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        const int i = lane + 32 * c;
        q[c] = i < a.dk ? qr[i] * a.scale : 0.0f;
        o[c] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = k_begin + warp; j < k_end; j += ATT_WARPS) {
        const int64_t blk = table[j / a.block_size], off = j % a.block_size;
        const int64_t base = (blk * a.n_kv + g) * a.block_size + off;
        const T *kr = kc + base * a.dk;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            const int i = lane + 32 * c;
            if (i < a.dk) s += q[c] * to_f32<T>(kr[i]);
        }
        s = warp_sum(s);
        if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        const T *vr = vc + base * a.dv;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            const int i = lane + 32 * c;
            o[c] = o[c] * corr + (i < a.dv ? p * to_f32<T>(vr[i]) : 0.0f);
        }
        m = m_new;
    }
    /* merge the warps */
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][ATT_MAX_D];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        const int i = lane + 32 * c;
        if (i < a.dv) so[warp][i] = o[c];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f, f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    if (n_split == 1) {
        float *dr = a.dst + (t * a.n_head + h) * (int64_t)a.dv;
        for (int i = threadIdx.x; i < a.dv; i += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) acc += so[w][i] * f[w];
            dr[i] = acc / L;
        }
    } else {
        float *pr = a.partial + ((t * a.n_head + h) * n_split + split) * (int64_t)(a.dv + 2);
        if (threadIdx.x == 0) {
            pr[0] = M;
            pr[1] = L;
        }
        for (int i = threadIdx.x; i < a.dv; i += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) acc += so[w][i] * f[w];
            pr[2 + i] = acc;
        }
    }
}

static __global__ void attn_combine_kernel(float *__restrict__ dst, const float *__restrict__ partial, int n_head,
                                           int dv, int n_split) {
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    const float *pr = partial + (t * n_head + h) * n_split * (int64_t)(dv + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pr[s * (dv + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float ms = pr[s * (dv + 2)];
        if (ms != -INFINITY) L += pr[s * (dv + 2) + 1] * expf(ms - M);
    }
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float ms = pr[s * (dv + 2)];
            if (ms != -INFINITY) acc += pr[s * (dv + 2) + 2 + i] * expf(ms - M);
        }
        dst[(t * n_head + h) * (int64_t)dv + i] = acc / L;
    }
}

/* Splits so that (rows x heads x splits) fills the GPU twice over, with at least 128 keys
 * per split. */
static int choose_split(int64_t n_tokens, int n_head, int max_keys) {
    const int64_t pairs = n_tokens * n_head;
    int s = 1;
    while (s < 64 && pairs * s < 264 && max_keys / (s * 2) >= 128) s *= 2;
    return s;
}

extern "C" uint64_t cuda_attn_scratch_bytes(int64_t n_tokens, int n_head, int dv, int max_keys) {
    int s = choose_split(n_tokens, n_head, max_keys);
    if (s == 1) return 0;
    return (uint64_t)n_tokens * n_head * s * (uint64_t)(dv + 2) * sizeof(float);
}

extern "C" void cuda_attention(const struct cuda_attn_args *a, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int s = choose_split(a->n_tokens, a->n_head, a->max_keys);
    dim3 grid((unsigned)a->n_head, (unsigned)a->n_tokens, (unsigned)s);
    if (a->cache_type == QT_F16)
        attn_kernel<__half><<<grid, ATT_WARPS * 32, 0, st>>>(*a, (const __half *)a->kc, (const __half *)a->vc, s);
    else if (a->cache_type == QT_BF16)
        attn_kernel<__nv_bfloat16><<<grid, ATT_WARPS * 32, 0, st>>>(*a, (const __nv_bfloat16 *)a->kc,
                                                                     (const __nv_bfloat16 *)a->vc, s);
    else
        attn_kernel<float><<<grid, ATT_WARPS * 32, 0, st>>>(*a, (const float *)a->kc, (const float *)a->vc, s);
    if (s > 1) attn_combine_kernel<<<dim3((unsigned)a->n_head, (unsigned)a->n_tokens), 128, 0, st>>>(
        a->dst, a->partial, a->n_head, a->dv, s);
}

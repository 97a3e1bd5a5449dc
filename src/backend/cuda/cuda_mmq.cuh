/* The mmq kernels' f16 activations (cuda_mmq.cu), for kernels that write them in place of
 * cuda_mmq_quantize: in the scratch, after the split-tile counters (which the writer zeroes,
 * as cuda_mmq_quantize does), row r's k values at xh + r k, each 16-group stored as its 8
 * even positions then its 8 odd ones (cuda_mmq.cu's file comment says why), values clamped
 * to +-65504 (NaN stays NaN). The MoE prefill's gather and GLU (cuda_moe.cu, cuda_elem.cu), the
 * RMSNorm before a product group (cuda_norm.cu) and the dense GLU launch (cuda_mmq.cu's h16)
 * write them: the f32 rows they replace were only read by the conversion. */
#ifndef SMELT_CUDA_MMQ_CUH
#define SMELT_CUDA_MMQ_CUH

#include <cuda_fp16.h>

#define MMQ_MAX_BLOCKS 2048 /* grid cap: counters in the scratch, partial slots */
#define MMQ_CNT_BYTES (MMQ_MAX_BLOCKS * 4)

static __host__ __device__ __forceinline__ int *mmq_cnt(void *scratch) {
    return (int *)scratch;
}
static __host__ __device__ __forceinline__ __half *mmq_xh(void *scratch) {
    return (__half *)((unsigned char *)scratch + MMQ_CNT_BYTES);
}

/* v as mmq stores it: f16, clamped to the f16 range. */
static __device__ __forceinline__ __half mmq_f16(float v) {
    return __float2half_rn(fabsf(v) > 65504.0f ? copysignf(65504.0f, v) : v);
}

/* Where element j of a row lands in it (16-groups: even positions, then odd). */
static __device__ __forceinline__ int64_t mmq_pos(int64_t j) {
    const int e = (int)(j & 15);
    return (j & ~(int64_t)15) + ((e & 1) ? 8 + (e >> 1) : e >> 1);
}

/* The counters' reset, by block 0 of the writing kernel (after its PDL wait). */
static __device__ __forceinline__ void mmq_zero_cnt(int *cnt) {
    if (blockIdx.x == 0 && blockIdx.y == 0)
        for (int c = threadIdx.x; c < MMQ_MAX_BLOCKS; c += blockDim.x)
            cnt[c] = 0;
}

#endif

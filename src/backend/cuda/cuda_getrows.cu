/* Row gathers of the CUDA backend (embeddings, output rows): plain F32/F16/BF16 rows, and
 * rows of repacked weights (every cuda_mmv layout) as F32. CPU twin: src/backend/cpu/. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qtypes.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"
}

#define QK_K 256

/* ---------------------------------------------------------------- kernels ---- */

static __global__ void get_rows_plain_kernel(float *dst, const uint8_t *src, uint32_t type, int64_t stride,
                                             const int32_t *ids, int64_t n) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.y;
    const uint8_t *row = src + (int64_t)ids[t] * stride;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v;
        if (type == QT_F32) v = ((const float *)row)[i];
        else if (type == QT_F16) v = __half2float(((const __half *)row)[i]);
        else v = __bfloat162float(((const __nv_bfloat16 *)row)[i]);
        dst[t * n + i] = v;
    }
}

/* Element i of row r of a repacked weight (see cuda_mmv.cu for the layouts). */
static __device__ __forceinline__ float deq_elem(uint32_t type, const void *q, const void *s,
                                                 const void *d, int64_t r, int64_t k, int64_t i) {
    switch (type) {
    case QT_F32: return ((const float *)q)[r * k + i];
    case QT_F16: return __half2float(((const __half *)q)[r * k + i]);
    case QT_BF16: return __bfloat162float(((const __nv_bfloat16 *)q)[r * k + i]);
    case QT_Q8_0: {
        const int64_t e = r * k + i;
        return (float)((const int8_t *)q)[e] * __half2float(((const __half *)s)[e >> 5]);
    }
    case QT_Q4_K: {
        const int64_t blk = (r * k + i) / QK_K;
        const int e = (int)(i % QK_K), j = e / 32, g = j / 2, within = e % 32;
        const uint8_t byte = ((const uint8_t *)q)[blk * 128 + g * 32 + within];
        const int nib = (j & 1) ? byte >> 4 : byte & 15;
        const uint32_t *sw = (const uint32_t *)s + blk * 4;
        const uint32_t pk = g == 0 ? sw[1] : g == 1 ? sw[2] : g == 2 ? sw[3]
                          : (sw[1] >> 24) | ((sw[2] >> 24) << 8) | ((sw[3] >> 24) << 16);
        const int sc = (j & 1) ? (pk >> 12) & 63 : pk & 63;
        const int m = (j & 1) ? (pk >> 18) & 63 : (pk >> 6) & 63;
        const float2 dm = __half22float2(*(const __half2 *)&sw[0]);
        return dm.x * (float)sc * (float)nib - dm.y * (float)m;
    }
    case QT_Q6_K: {
        const int64_t blk = (r * k + i) / QK_K;
        const int e = (int)(i % QK_K), h = e / 128, rem = e % 128, j = rem / 32, l = rem % 32;
        const uint8_t *qb = (const uint8_t *)q + blk * 192;
        const uint8_t qlb = qb[h * 64 + (j & 1) * 32 + l];
        const int lo = j < 2 ? qlb & 15 : qlb >> 4;
        const int hi = (qb[128 + h * 32 + l] >> (2 * j)) & 3;
        const float sc = (float)((const int8_t *)s)[blk * 16 + e / 16];
        return __half2float(((const __half *)d)[blk]) * sc * (float)((lo | (hi << 4)) - 32);
    }
    }
    return 0.0f;
}

static __global__ void get_rows_q_kernel(float *dst, uint32_t type, const void *q, const void *s,
                                         const void *d, int64_t k, const int32_t *ids) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.y;
    const int64_t r = ids[t];
    if (tq_type(type)) { /* cuda_qtypes.cuh's layouts: 32 weights at a time */
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (int)(k / 32); j += gridDim.x * blockDim.x) {
            float o[32];
            tq_deq32_rt(type, q, s, d, r, (int)k, j, o);
#pragma unroll
            for (int i = 0; i < 32; i++) dst[t * k + (int64_t)j * 32 + i] = o[i];
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k; i += (int64_t)gridDim.x * blockDim.x)
        dst[t * k + i] = deq_elem(type, q, s, d, r, k, i);
}

/* --------------------------------------------------------------- launchers ---- */

extern "C" void cuda_get_rows_plain(struct cuda_ctx *ctx, float *dst, const void *src,
                                    uint32_t type, int64_t src_stride, const int32_t *ids,
                                    int64_t n, int64_t n_ids) {
    dim3 grid(nblocks(n, 256) < 64 ? nblocks(n, 256) : 64, (unsigned)n_ids);
    klaunch(get_rows_plain_kernel, dim3(grid), dim3(256), 0, ctx, dst, (const uint8_t *)src, type, src_stride,
                                                                    ids, n);
}

extern "C" void cuda_get_rows_q(struct cuda_ctx *ctx, float *dst, const struct cuda_qweight *w,
                                const int32_t *ids, int64_t n_ids) {
    dim3 grid(nblocks(w->k, 256) < 64 ? nblocks(w->k, 256) : 64, (unsigned)n_ids);
    klaunch(get_rows_q_kernel, dim3(grid), dim3(256), 0, ctx, dst, w->type, w->q, w->s, w->d, w->k, ids);
}

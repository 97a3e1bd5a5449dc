/* Conversions to F16 for the large-batch GEMM path (cuBLAS): repacked weights dequantized
 * (every cuda_mmv layout), F32 activations rounded. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_qtypes.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"
}

#define QK_K 256

/* ---------------------------------------------------------------- kernels ---- */

/* One thread per 32 consecutive weights of a row (a Q8_0 block, a K-quant sub-block):
 * 32-bit index math once per group, 64 bytes of F16 written as four 16-byte stores. */
template <uint32_t T>
static __global__ void dequant_f16_kernel(__half *__restrict__ dst, const void *__restrict__ q,
                                          const void *__restrict__ s, const void *__restrict__ d, int k,
                                          int64_t r0, int groups) {
    pdl_wait();
    pdl_trigger();
    const int gi = blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= groups) return;
    const int gpr = k / 32, rl = gi / gpr, j32 = gi % gpr;
    const int64_t row = r0 + rl;
    __align__(16) __half out[32];
    if (T == QT_Q8_0) {
        const int8_t *qb = (const int8_t *)q + (row * k + (int64_t)j32 * 32);
        const float sc = __half2float(((const __half *)s)[(row * k) / 32 + j32]);
#pragma unroll
        for (int i = 0; i < 32; i++) out[i] = __float2half((float)qb[i] * sc);
    } else if (T == QT_Q4_K) {
        const int64_t blk = row * (k / QK_K) + j32 / 8;
        const int j = j32 % 8, g = j / 2;
        const uint8_t *qb = (const uint8_t *)q + blk * 128 + g * 32;
        const uint32_t *sw = (const uint32_t *)s + blk * 4;
        const uint32_t pk = g == 0 ? sw[1] : g == 1 ? sw[2] : g == 2 ? sw[3]
                          : (sw[1] >> 24) | ((sw[2] >> 24) << 8) | ((sw[3] >> 24) << 16);
        const int sc = (j & 1) ? (pk >> 12) & 63 : pk & 63;
        const int m = (j & 1) ? (pk >> 18) & 63 : (pk >> 6) & 63;
        const float2 dm = __half22float2(*(const __half2 *)&sw[0]);
        const float a = dm.x * (float)sc, b = dm.y * (float)m;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int nib = (j & 1) ? qb[i] >> 4 : qb[i] & 15;
            out[i] = __float2half(a * (float)nib - b);
        }
    } else if (T == QT_Q6_K) {
        const int64_t blk = row * (k / QK_K) + j32 / 8;
        const int e0 = (j32 % 8) * 32, h = e0 / 128, jj = (e0 % 128) / 32;
        const uint8_t *qb = (const uint8_t *)q + blk * 192;
        const float dd = __half2float(((const __half *)d)[blk]);
        const float sc0 = dd * (float)((const int8_t *)s)[blk * 16 + e0 / 16];
        const float sc1 = dd * (float)((const int8_t *)s)[blk * 16 + e0 / 16 + 1];
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const uint8_t qlb = qb[h * 64 + (jj & 1) * 32 + l];
            const int lo = jj < 2 ? qlb & 15 : qlb >> 4;
            const int hi = (qb[128 + h * 32 + l] >> (2 * jj)) & 3;
            out[l] = __float2half((l < 16 ? sc0 : sc1) * (float)((lo | (hi << 4)) - 32));
        }
    } else if (tq_type(T)) { /* cuda_qtypes.cuh */
        float f[32];
        tq_deq32<T>(q, s, d, row, k, j32, f);
#pragma unroll
        for (int i = 0; i < 32; i++) out[i] = __float2half(f[i]);
    } else { /* F16 / BF16 / F32 */
        const int64_t base = row * k + (int64_t)j32 * 32;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float v = T == QT_F16 ? __half2float(((const __half *)q)[base + i])
                    : T == QT_BF16 ? __bfloat162float(((const __nv_bfloat16 *)q)[base + i])
                                   : ((const float *)q)[base + i];
            out[i] = __float2half(v);
        }
    }
    uint4 *o = (uint4 *)(dst + (int64_t)rl * k + (int64_t)j32 * 32);
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = ((const uint4 *)out)[i];
}

static __global__ void f32_to_f16_kernel(__half *dst, const float *src, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2half(src[i]);
}

/* --------------------------------------------------------------- launchers ---- */

extern "C" void cuda_dequant_f16(struct cuda_ctx *ctx, void *dst, const struct cuda_qweight *w,
                                 int64_t r0, int64_t nr) {
    const int k = (int)w->k, groups = (int)(nr * (k / 32));
    const unsigned grid = nblocks(groups, 128);
    __half *o = (__half *)dst;
    switch (w->type) {
    case QT_Q8_0: klaunch(dequant_f16_kernel<QT_Q8_0>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q4_K: klaunch(dequant_f16_kernel<QT_Q4_K>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q6_K: klaunch(dequant_f16_kernel<QT_Q6_K>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_F16: klaunch(dequant_f16_kernel<QT_F16>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q4_0: klaunch(dequant_f16_kernel<QT_Q4_0>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q4_1: klaunch(dequant_f16_kernel<QT_Q4_1>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q5_0: klaunch(dequant_f16_kernel<QT_Q5_0>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q5_1: klaunch(dequant_f16_kernel<QT_Q5_1>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_IQ4_NL: klaunch(dequant_f16_kernel<QT_IQ4_NL>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_IQ4_XS: klaunch(dequant_f16_kernel<QT_IQ4_XS>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_MXFP4: klaunch(dequant_f16_kernel<QT_MXFP4>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q2_K: klaunch(dequant_f16_kernel<QT_Q2_K>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q3_K: klaunch(dequant_f16_kernel<QT_Q3_K>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_Q5_K: klaunch(dequant_f16_kernel<QT_Q5_K>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    case QT_BF16: klaunch(dequant_f16_kernel<QT_BF16>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    default: klaunch(dequant_f16_kernel<QT_F32>, dim3(grid), dim3(128), 0, ctx, o, w->q, w->s, w->d, k, r0, groups); break;
    }
}

extern "C" void cuda_f32_to_f16(struct cuda_ctx *ctx, void *dst, const float *src, int64_t n) {
    klaunch(f32_to_f16_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, (__half *)dst, src, n);
}

/* Quantized matrix x many token rows on the int8 tensor cores ("mmq"): batched decode
 * (9..64 rows) and prefill chunks.
 *
 *   y[t][r] = sum_k W[r][k] * x[t][k]      t < n, r < w->rows
 *
 * The weights are read in the "split" layout cuda_mmv uploads (cuda_mmv.h), never
 * dequantized to memory: each block of the kernel stages 32 or 64 weight rows and 16..128
 * token rows of a 256-wide K slice in shared memory (cp.async, double-buffered), unpacks
 * the weights to int8 in registers and multiplies with mma.sync m16n8k32 (m16n8k16 for
 * Q6_K's 16-value scale groups); the int32 result of each 32-wide block is scaled in f32
 * by the weight block's and the activation block's scales. The activations are quantized
 * once per product to int8 with one f32 scale per 32 values, as cuda_mmv does (same
 * rounding), plus the scaled sum each K-quant minimum needs.
 *
 * Types: Q4_K, Q6_K (k % 256 == 0) and Q8_0 (k % 64 == 0); others keep the mmv / cuBLAS
 * paths. Needs sm_80 or newer (mma.sync on int8, cp.async). Design note, bytes and ops per
 * call and measurements: docs/cuda-backend.md, "Tensor-core matmul".
 */
#ifndef SMELT_CUDA_MMQ_H
#define SMELT_CUDA_MMQ_H

#include <stdint.h>

#include "backend/cuda/cuda_mmv.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile choice for cuda_mmq_pre: by shape (the default), or one of cuda_mmq_tile_count()
 * fixed tiles (for benchmarks and tests). */
#define CUDA_MMQ_TILE_AUTO (-1)

/* True when the kernels handle this weight type with row length k. */
int cuda_mmq_supported(uint32_t type, int64_t k);

/* Device scratch bytes for n rows of k activations in their quantized form. */
uint64_t cuda_mmq_scratch_bytes(int64_t k, int64_t n);

/* x[n][k] (f32, device) -> scratch: int8 values, then {scale, scale * sum} per 32 values.
 * k % 32 == 0. Asynchronous on stream (a cudaStream_t, 0 = default). */
smelt_status cuda_mmq_quantize(const float *x, int64_t k, int64_t n, void *scratch, void *stream,
                               struct err *e);

/* y[n][w->rows] = (or += with accumulate != 0) W x, x read from scratch as
 * cuda_mmq_quantize(x, w->k, n) left it. tile: CUDA_MMQ_TILE_AUTO or 0..count-1 (a tile
 * that does not fit the device's shared memory is refused with SMELT_ERR_UNSUPPORTED).
 * Asynchronous; errors are argument and launch errors only. */
smelt_status cuda_mmq_pre(const struct cuda_qweight *w, int64_t n, float *y, const void *scratch,
                          int accumulate, int tile, void *stream, struct err *e);

/* cuda_mmq_quantize then cuda_mmq_pre with the automatic tile. */
smelt_status cuda_mmq(const struct cuda_qweight *w, const float *x, int64_t n, float *y,
                      void *scratch, int accumulate, void *stream, struct err *e);

/* The fixed tiles: weight rows x token rows per thread block. */
int cuda_mmq_tile_count(void);
void cuda_mmq_tile_shape(int tile, int *rows, int *tokens);
/* The tile CUDA_MMQ_TILE_AUTO picks for this product on the current device (-1 on a
 * device query error). */
int cuda_mmq_tile_auto(const struct cuda_qweight *w, int64_t n);

#ifdef __cplusplus
}
#endif
#endif

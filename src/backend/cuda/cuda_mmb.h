/* Quantized matrix x a small batch of token rows (2..64) on the tensor cores ("mmb"):
 * batched decode, where the per-weight work of mmv (1..8 rows) and the tile machinery of
 * mmq (9..512 rows) cost more than reading the weights.
 *
 *   y[t][r] = sum_k W[r][k] * x[t][k]      t < n <= CUDA_MMB_MAX_ROWS, r < w->rows
 *
 * The weights are read from the "split" layout cuda_mmv uploads (cuda_mmv.h, cuda_qtypes.cuh)
 * straight into registers, exactly once per call whatever n is: each lane of a warp loads
 * its 16-byte pieces (and scale words) of its two weight rows per 256-wide K slice and
 * dequantizes them into the f16 A fragments of mma.sync.m16n8k16, with the same f16 values
 * cuda_mmq makes where it has the type (Q4_K: f16(q * f16(d*sc) - f16(dmin*m)); Q6_K:
 * f16((q - 32) * f16(d*sc)); Q8_0: f16(q * d)) and the like for the others (Q5_K as Q4_K,
 * Q4_0: f16((q - 8) * d)). The activations are converted to f16 in the order the type's
 * fragments want them: up to 8 rows by each block for its own K range, straight into shared
 * memory; above, once per call by a conversion launch, and each block stages its K range in
 * shared memory (cp.async, double-buffered); f32 accumulators over the whole range. The K range is
 * split over blocks by (rows, k, SM count) only, never by n, and the splits are summed in a
 * fixed order: a token row's result is the same bits whatever n is and whatever the other
 * rows hold (batch-invariant within this kernel).
 *
 * Types: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, each with k % 256 == 0. Needs sm_80 or newer. Design
 * note, bytes and instructions per weight, ceilings and measurements: docs/cuda-backend.md,
 * "Small-batch tensor-core matmul". */
#ifndef SMELT_CUDA_MMB_H
#define SMELT_CUDA_MMB_H

#include <stdint.h>

#include "backend/cuda/cuda_mmv.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_MMB_MAX_ROWS 64 /* token rows one call takes */
#define CUDA_MMB_MATS 3      /* matrices one launch takes (cuda_mmb_multi) */

/* True when the kernel handles this weight type with row length k. */
int cuda_mmb_supported(uint32_t type, int64_t k);

/* Blocks the K range of a rows x k product is split into on ctx's device (1: no split;
 * the same for every n). */
int cuda_mmb_splits(const struct cuda_ctx *ctx, int64_t rows, int64_t k);

/* Device scratch bytes cuda_mmb needs for this product: the f16 activations (more than 8
 * rows) and the partial sums of the K splits (0 when there are neither). */
smelt_status cuda_mmb_scratch_bytes(const struct cuda_ctx *ctx, int64_t rows, int64_t k, int64_t n,
                                    uint64_t *bytes, struct err *e);

/* y[n][w->rows] = (or += with accumulate != 0) W x for x[n][w->k] (f32, device, 16-byte
 * aligned), 1 <= n <= CUDA_MMB_MAX_ROWS; scratch of scratch_bytes (>= cuda_mmb_scratch_bytes).
 * One launch on ctx's stream up to 8 rows, two above (the conversion, the product);
 * asynchronous and graph-capturable; errors are argument and launch errors only. */
smelt_status cuda_mmb(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int64_t n,
                      float *y, void *scratch, uint64_t scratch_bytes, int accumulate, struct err *e);

/* cuda_mmb of count (1..CUDA_MMB_MATS) matrices of one type and row length on the same x, in
 * one conversion and one product launch (a layer's Q, K and V, or gate and up):
 * y[i][n][w[i]->rows] (+)= W_i x. The K split is chosen for all the matrices' rows together,
 * so a matrix's result is not the bits of its own cuda_mmb, but it is the same bits at every
 * n for the same set of matrices. Scratch: cuda_mmb_multi_scratch_bytes. */
smelt_status cuda_mmb_multi(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count, const float *x,
                            int64_t n, float *const *y, void *scratch, uint64_t scratch_bytes, int accumulate,
                            struct err *e);
smelt_status cuda_mmb_multi_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_qweight *const *w,
                                          int count, int64_t n, uint64_t *bytes, struct err *e);

/* dst[n][rows] = act(W_gate x) * (W_up x) for a GLU's gate and up (one type, row length and
 * row count), act enum glu_act's 0..3 (cuda_glu.cuh's glu_val), in one launch at up to 8
 * rows (two above): a block holds 32 rows of each matrix, and the block that completes them
 * applies the activation. The K split is the two-matrix cuda_mmb_multi's whenever the rows
 * are a multiple of 64, so dst is then the bits of that launch followed by cuda_glu. Scratch:
 * cuda_mmb_glu_scratch_bytes. */
smelt_status cuda_mmb_glu(struct cuda_ctx *ctx, const struct cuda_qweight *gate, const struct cuda_qweight *up,
                          int act, const float *x, int64_t n, float *dst, void *scratch, uint64_t scratch_bytes,
                          struct err *e);
smelt_status cuda_mmb_glu_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                        const struct cuda_qweight *up, int64_t n, uint64_t *bytes, struct err *e);

#ifdef __cplusplus
}
#endif
#endif

/* Quantized matrix x many token rows on the tensor cores ("mmq"): batched decode (9..64
 * rows) and prefill chunks (up to a few hundred rows).
 *
 *   y[t][r] = sum_k W[r][k] * x[t][k]      t < n, r < w->rows
 *
 * The weights are read in the "split" layout cuda_mmv uploads (cuda_mmv.h), never
 * dequantized to memory: each 256-wide K slice of a tile of 128 or 256 weight rows is
 * copied raw to shared memory (cp.async, 2-4 stages in flight) and dequantized in
 * registers straight into the f16 A fragments of mma.sync.m16n8k16 (f32 accumulation),
 * the block scales applied there, once per weight. The activations are converted once per
 * product to f16 (cuda_mmq_quantize); there is no per-block int32 -> f32 fold. The work
 * (tiles x K slices) is split evenly over one wave of blocks ("stream-K"), so a 4096-row
 * matrix fills every SM; tiles split between blocks are summed deterministically (fixed
 * order) by the last block to finish its part.
 *
 * Types: Q4_K, Q6_K (k % 256 == 0) and Q8_0 (k % 64 == 0); others keep the mmv / cuBLAS
 * paths. Needs sm_80 or newer. Design note, bytes and ops per call and measurements:
 * docs/cuda-backend.md, "Tensor-core matmul".
 */
#ifndef SMELT_CUDA_MMQ_H
#define SMELT_CUDA_MMQ_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_mmv.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile choice for cuda_mmq_pre: by shape (the default), or one of cuda_mmq_tile_count()
 * fixed tiles (for benchmarks and tests). */
#define CUDA_MMQ_TILE_AUTO (-1)

/* The scratch begins with the split-tile counters; the f16 activations follow them. */
#define CUDA_MMQ_XH_OFFSET 8192

/* True when the kernels handle this weight type with row length k. */
int cuda_mmq_supported(uint32_t type, int64_t k);

/* Device scratch bytes for cuda_mmq_quantize(k, n) followed by cuda_mmq_pre on weights of
 * up to `rows` rows (any tile) on ctx's device: the f16 activations, the split-tile
 * counters and the partial sums of split tiles. The device's tile facts are queried into
 * ctx at the first call that needs them (here, cuda_mmq_pre, the tile queries). */
smelt_status cuda_mmq_scratch_bytes(struct cuda_ctx *ctx, int64_t rows, int64_t k, int64_t n,
                                    uint64_t *bytes, struct err *e);

/* x[n][k] (f32, device) -> scratch: f16 activations (clamped to +-65504), and the split-tile
 * counters zeroed. k % 64 == 0. Asynchronous on ctx's stream. One call can serve several
 * cuda_mmq_pre calls (weights sharing x) on the same stream. */
smelt_status cuda_mmq_quantize(struct cuda_ctx *ctx, const float *x, int64_t k, int64_t n,
                               void *scratch, struct err *e);

/* y[n][w->rows] = (or += with accumulate != 0) W x, x read from scratch as
 * cuda_mmq_quantize(x, w->k, n) left it; scratch_bytes: the scratch's size (checked against
 * what this product needs). tile: CUDA_MMQ_TILE_AUTO or 0..count-1 (a tile that does not
 * fit the device's shared memory is refused with SMELT_ERR_UNSUPPORTED). Asynchronous and
 * graph-capturable (no host sync; the launch shape depends only on (type, rows, k, n,
 * tile) and the device); errors are argument and launch errors only. */
smelt_status cuda_mmq_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n, float *y,
                          void *scratch, uint64_t scratch_bytes, int accumulate, int tile,
                          struct err *e);

/* The gated product of a GLU FFN: y[n][gate->rows] = act(G x) * (U x), act as cuda_glu.cuh's
 * glu_val (0 SiLU, 1 tanh-GELU, 2 sigmoid, 3 gpt-oss's clamped SwiGLU), x from scratch as
 * cuda_mmq_quantize(x, k, n) left it, scratch sized by cuda_mmq_scratch_bytes for 2 x rows.
 * One launch over 2 x rows weight rows, gate and up interleaved in eights, so each thread
 * holds both sums of an output and the activation is applied in the store: no f32 gate and up
 * products in memory and no GLU launch. Gate and up: the same type and shape, rows a multiple
 * of 8. Otherwise as cuda_mmq_pre (tile: that of the gate's plain product, or AUTO).
 * With h16 (not NULL; y is then unused) the output goes to h16 instead, another scratch (sized
 * by cuda_mmq_scratch_bytes for k = gate->rows, n), as cuda_mmq_quantize(y, gate->rows, n, h16)
 * would leave it, bit for bit: a down product over n_ff then runs cuda_mmq_pre on h16, with no
 * f32 y in memory and no conversion launch. gate->rows must then be a multiple of 16. */
smelt_status cuda_mmq_glu_pre(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                              const struct cuda_qweight *up, int act, int64_t n, float *y, void *h16,
                              void *scratch, uint64_t scratch_bytes, int tile, struct err *e);

/* Stacked products on one input: y[i][n][w[i]->rows] = W_i x for count (1..CUDA_MMQ_STACK)
 * matrices of one type and row length (a layer's Q, K and V), x from scratch as
 * cuda_mmq_quantize(x, k, n) left it, scratch sized by cuda_mmq_scratch_bytes for the sum of
 * their rows. One launch over the matrices' rows one after another (a tile may hold rows of
 * two of them), so three small products fill the device as one: no second and third launch,
 * and no third of the SMs idle on a 1,024-row product. A matrix's outputs are not the bits
 * of its own cuda_mmq_pre (the K split follows the whole launch's rows) but depend only on
 * (the matrices' shapes, n, tile), as cuda_mmq_pre's do. Otherwise as cuda_mmq_pre, without
 * accumulation; tile: that of the stacked shape (AUTO: picked for the sum of the rows). */
#define CUDA_MMQ_STACK 3
smelt_status cuda_mmq_stack_pre(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count,
                                int64_t n, float *const *y, void *scratch, uint64_t scratch_bytes,
                                int tile, struct err *e);

/* Expert products on the tensor cores ("mmq by id", the grouped mixture-of-experts FFN): w
 * stacks n_exp experts' matrices of rows_e rows each (w->rows = n_exp x rows_e); the n token
 * rows (from scratch, as cuda_mmq_quantize(x, w->k, n) left it) are n_tiles tiles of the
 * tile's token width (n = n_tiles x width), tile t multiplied by expert tile_eid[t] (device
 * memory, cuda_moe_group's chunk table with chunks of the tile's width): the tiles with an
 * id >= 0 must be a prefix (the grouping's order); the rest are not computed and their rows
 * of y are not written. y (n, rows_e) = W[tile_eid[t]] x. Each block computes whole tiles
 * over all of K in a fixed order, so a row's result depends on its own x and expert alone
 * (batch invariance), not on the other rows' experts. tile: cuda_mmq_id_tile's. Graph-
 * capturable: the launch shape depends on (type, rows_e, k, n, tile) only. */
smelt_status cuda_mmq_id_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t rows_e,
                             int n_exp, const int32_t *tile_eid, int64_t n_tiles, int64_t n,
                             float *y, void *scratch, uint64_t scratch_bytes, int tile,
                             struct err *e);
/* The tile for cuda_mmq_id_pre with token width `tokens` (16, 32 or 64) on experts of rows_e
 * x k, for about n_pairs grouped rows; -1 when none fits (or the type has no kernel). */
int cuda_mmq_id_tile(struct cuda_ctx *ctx, uint32_t type, int64_t rows_e, int64_t k,
                     int64_t n_pairs, int tokens);

/* cuda_mmq_quantize then cuda_mmq_pre with the automatic tile. */
smelt_status cuda_mmq(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int64_t n,
                      float *y, void *scratch, uint64_t scratch_bytes, int accumulate,
                      struct err *e);

/* The fixed tiles: weight rows x token rows per thread block; a tile's name for logs
 * ("256x64", "128x128 wgmma"). */
int cuda_mmq_tile_count(void);
void cuda_mmq_tile_shape(int tile, int *rows, int *tokens);
void cuda_mmq_tile_name(int tile, char *buf, size_t size);
/* The tile CUDA_MMQ_TILE_AUTO picks for this product on ctx's device (-1 on a device query
 * error). */
int cuda_mmq_tile_auto(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n);
/* 1 when tile fits ctx's device for weights of this type (resident blocks per SM > 0), 0
 * when not (or the type has no kernel), -1 on a device query error. */
int cuda_mmq_tile_fits(struct cuda_ctx *ctx, uint32_t type, int tile);
/* Thread blocks cuda_mmq_pre launches for this product and tile (-1 on error): one wave. */
int cuda_mmq_grid(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n, int tile);

#ifdef __cplusplus
}
#endif
#endif

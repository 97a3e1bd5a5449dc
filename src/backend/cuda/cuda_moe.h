/* Mixture-of-experts kernels on the GPU (cuda_moe.cu): the router, the grouping of a step's
 * (row, slot) pairs by expert, the experts' input rows, and the weighted sum of their outputs.
 * The expert products themselves are the mmv kernels' expert mode (cuda_mmv.h: cuda_mmv_id,
 * cuda_mmv_glu_id). CPU twins: src/backend/cpu/cpu_ops_moe.c (bk_moe_route, bk_moe_ffn).
 *
 * Everything stays on the device: the ids the router writes are read by the grouping and the
 * products on the device, never by the host, so an MoE layer has no host sync and a decode
 * step is captured in a graph like a dense one. Launch shapes depend on the step's shape
 * (rows, k, n_expert) only. All pointers are device memory; everything is enqueued on the
 * context's stream. */
#ifndef SMELT_CUDA_MOE_H
#define SMELT_CUDA_MOE_H

#include <stdint.h>

#include "backend/cuda/cuda_ctx.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_MOE_MAX_EXPERTS 4096 /* the grouping counts experts in shared memory */

/* The router, for each row r of x (n_embd, n) (two launches: the logits over n_exp / 8 blocks a
 * row, then a block a row picks; lg_scratch holds cuda_moe_route_scratch_bytes):
 *   x' = x_r, or rms_norm(x_r) * pre_w when has_pre (pre_w may be NULL: no weight);
 *   logits[e] = router[e] . x' (+ bias[e]),  router F32 (n_embd, n_exp), bias (n_exp) or NULL;
 *   ids[., r] = the k largest logits' experts, largest first, ties to the lower id, a NaN
 *   losing to any number; weights[., r] by gating (backend.h's enum moe_gating: 0 = softmax
 *   over all n_exp, 1 = softmax over the k), in double.
 * A row's results depend on that row alone (batch invariance). ids I32 (k, n), weights F32
 * (k, n). k <= 32 (one warp weighs the picks); n_embd % 4 == 0 (16-byte loads). */
smelt_status cuda_moe_route(struct cuda_ctx *ctx, const float *x, int64_t n_embd, int64_t n,
                            const float *router, const float *bias, int n_exp, int k, int gating,
                            int has_pre, const float *pre_w, float eps, int32_t *ids,
                            float *weights, float *lg_scratch, struct err *e);
/* Bytes of cuda_moe_route's logits scratch for n rows of n_exp experts. */
size_t cuda_moe_route_scratch_bytes(int64_t n, int n_exp);

/* cuda_moe_route for a decode step (n <= CUDA_MOE_FUSED_ROUTE_ROWS) in one launch, which also
 * writes the experts' input rows as cuda_moe_gather(src NULL, n rows) would: x' int8 at
 * xq_scratch (cuda_mmv_quantize's layout for n rows) and f32 at xf (n_embd, n; NULL: not
 * written). Bitwise the results of those two calls. cnt: n counters, zero before and after
 * (the last block of a row picks). n_embd % 32 == 0. sh_w (F32, n_embd; NULL: none): also
 * sh_logit[r] = sh_w . x'_r (a shared expert's gate logit), one more row of the logits. */
#define CUDA_MOE_FUSED_ROUTE_ROWS 8
smelt_status cuda_moe_route_fused(struct cuda_ctx *ctx, const float *x, int64_t n_embd, int64_t n,
                                  const float *router, const float *bias, int n_exp, int k, int gating,
                                  int has_pre, const float *pre_w, float eps, int32_t *ids, float *weights,
                                  float *lg_scratch, unsigned *cnt, void *xq_scratch, float *xf,
                                  const float *sh_w, float *sh_logit, struct err *e);

/* Chunks of a grouped expert launch for n_pairs (row, slot) pairs over n_exp experts in chunks
 * of ch rows: each expert's pairs take whole chunks, so at most
 * (n_pairs + min(n_exp, n_pairs) * (ch - 1)) / ch of them (a bound of the shape alone). */
int64_t cuda_moe_chunks(int64_t n_pairs, int n_exp, int ch);

/* Groups the pairs of ids (k, n) by expert: chunk c of ch rows belongs to expert
 * chunk_eid[c] (-1: unused), pos[p] is pair p's row in the grouped order (-1 for an id
 * outside [0, n_exp)), src[i] the step row of grouped row i (-1: padding), for n_chunks =
 * cuda_moe_chunks(n * k, n_exp, ch) chunks. One block; n_exp <= CUDA_MOE_MAX_EXPERTS. The
 * order of pairs within an expert is not fixed (atomics): every grouped row is computed
 * alone, so results do not depend on it. */
smelt_status cuda_moe_group(struct cuda_ctx *ctx, const int32_t *ids, int64_t n, int k, int n_exp,
                            int ch, int64_t n_chunks, int32_t *chunk_eid, int32_t *pos,
                            int32_t *src, struct err *e);

/* The experts' input rows: row i of the output is x' (as cuda_moe_route's) of step row
 * src[i] (src NULL: row i; -1: zeros), n_rows rows, written in each form whose destination
 * is not NULL: its int8 form in cuda_mmv_quantize's layout for n_rows rows at xq_scratch,
 * the f32 row at xf (float weights read it), the f16 form at mmq_scratch as
 * cuda_mmq_quantize(x', n_embd, n_rows) leaves it (the mmq products by id read it).
 * n_embd % 32 == 0. */
smelt_status cuda_moe_gather(struct cuda_ctx *ctx, const float *x, int64_t n_embd,
                             const int32_t *src, int64_t n_rows, int has_pre, const float *pre_w,
                             float eps, void *xq_scratch, float *xf, void *mmq_scratch,
                             struct err *e);

/* The weighted sum, with the residual add: for each row r < n,
 *   s = sum over the row's slots j, in increasing expert id, of weights[j, r] * (y[p] +
 *       down_b[ids[j, r]]), p = pos[r * k + j] (pos NULL: p = r * k + j; p < 0 or an id
 *       outside [0, n_exp): no term);
 *   dst[r] = s, or dst[r] += s when acc.
 * y F32 (n_embd, rows); down_b F32 (n_embd, n_exp) or NULL. post (NULL = none; n_embd % 32
 * == 0): also the next norm's input, as the decode matmul epilogue prepares it (cu_matmul_acc):
 * the int8 form of w * dst at xq/xd (cuda_mmv_quantize's layout for n rows of n_embd) and
 * per group of 32 the sum of squares of dst at ss[r * n_embd / 32 + group]. */
/* sh (NULL = none; pos NULL): a shared expert ran as slot k of each row (cuda_mmv_ids.sh_k),
 * its rows at p = r (k + 1) + k and the experts' at r (k + 1) + j; it joins s after them,
 * weight sigmoid(logit[r]) (1 when logit is NULL), as the fused down launch sums. */
struct cuda_moe_shared {
    const float *logit;
};
struct cuda_moe_post {
    const float *w; /* may be NULL: no weight */
    int8_t *xq;
    void *xd;
    float *ss; /* may be NULL */
};
smelt_status cuda_moe_combine(struct cuda_ctx *ctx, float *dst, const float *y, const int32_t *pos,
                              const int32_t *ids, const float *weights, const float *down_b,
                              int64_t n_embd, int64_t n, int k, int n_exp, int acc,
                              const struct cuda_moe_post *post, const struct cuda_moe_shared *sh,
                              struct err *e);

#ifdef __cplusplus
}
#endif
#endif

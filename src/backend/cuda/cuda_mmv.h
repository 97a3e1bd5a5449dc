/* Quantized matrix x small-batch product on the GPU (decode: 1..8 token rows).
 *
 *   y[t][r] = sum_k W[r][k] * x[t][k]      t < n (<= CUDA_MMV_MAX_N), r < rows
 *
 * Weights live on the device in their quantized form, repacked at upload into a "split"
 * layout: the quant bits of every block in one array and the block scales in another,
 * each 16-byte aligned, so a warp reads both with coalesced 16-byte loads (the GGUF blocks
 * of Q8_0 (34 B) and Q6_K (210 B) are not 16-byte multiples). Activations are quantized
 * once per product to 8 bits (int8 with one f32 scale and one f32 scaled sum per 16 values)
 * and dotted with __dp4a; F16 weights use f32 activations directly.
 *
 * Design note and measurements: docs/cuda-backend.md.
 */
#ifndef SMELT_CUDA_MMV_H
#define SMELT_CUDA_MMV_H

#include <stdint.h>

#include "backend/cuda/cuda_ctx.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_MMV_MAX_N 8
/* The expert launches' shapes (SMELT_MMV_ID_VARIANT, cuda_ctx.mmv_id_variant) are 1..10 as
 * cuda_mmv.cuh's mmv_with_shape numbers them, and these: Q4_K / Q6_K rows over lane groups
 * (cuda_mmv.cu's mmv_kq_lanes: 8 rows a warp, 4 lanes a row, 3 units in flight), and the
 * epilogues in one block a group of 32 rows (MMV_LANES_SUM): the down product's weighted
 * sum over every slot (mmv_sum_body: Q4_K / Q6_K as mmv_kq_lanes, MXFP4 as variant 3;
 * without a combining epilogue it is MMV_LANES), and gate/up's int8 h (mmv_glu_q_body: Q4_K
 * and MXFP4 as variant 1). */
#define MMV_LANES 11
#define MMV_LANES_SUM 12

struct cuda_qweight {
    uint32_t type;  /* enum qtype of the source tensor */
    int64_t rows;   /* output features */
    int64_t k;      /* input features (row length) */
    void *q;        /* device: quant bits, block after block, row after row */
    void *s;        /* device: per-block scales (layout depends on type) */
    void *d;        /* device: per-block super scale where the type needs one more array */
    uint64_t bytes; /* device bytes held (q + s + d) */
};

/* True when the kernels handle this type with row length k. */
int cuda_mmv_supported(uint32_t type, int64_t k);

/* Uploads `rows` rows of k elements of GGUF type `type` from host memory and repacks them
 * on ctx's stream, and waits for it. */
smelt_status cuda_qweight_upload(struct cuda_ctx *ctx, struct cuda_qweight *w, uint32_t type,
                                 const void *host, int64_t rows, int64_t k, struct err *e);
void cuda_qweight_free(struct cuda_qweight *w);

/* Device scratch bytes cuda_mmv needs for n rows of k activations. */
uint64_t cuda_mmv_scratch_bytes(int64_t k, int n);

/* y[n][w->rows] = x[n][w->k] . W^T; x, y, scratch are device pointers. Asynchronous on
 * ctx's stream; errors are launch errors only. ctx->mmv_variant > 0 (tests, benchmarks)
 * replaces the one-token Q4_K, Q6_K and Q8_0 kernels' shape (test_cuda_mmv's
 * SMELT_BENCH_VARIANTS). */
smelt_status cuda_mmv(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int n,
                      float *y, void *scratch, struct err *e);

/* The two halves of cuda_mmv, so one quantized input serves several weights (Q, K, V):
 * cuda_mmv_quantize writes x's int8 form into scratch (only for types where
 * cuda_mmv_needs_quant); cuda_mmv_pre reads it (and x itself for float weights). With
 * accumulate != 0, y += W x instead of y = W x. */
int cuda_mmv_needs_quant(uint32_t type);
smelt_status cuda_mmv_quantize(struct cuda_ctx *ctx, const float *x, int64_t k, int n,
                               void *scratch, struct err *e);
smelt_status cuda_mmv_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x,
                          int n, float *y, const void *scratch, int accumulate, struct err *e);
/* Optional prologue/epilogue of a product, for decode chains without separate norm and
 * quantize launches (all device pointers; zero fields = off):
 *   - pre_ss: the int8 input is the quantized form of w * x for a raw residual x, and
 *     pre_ss (n, k/32) holds the sums of squares of x per 32 values: the product is scaled
 *     per token row by rsqrt(mean(x^2) + pre_eps), i.e. it is W rms_norm(x) * w.
 *   - post_cnt (rows/32 zeroed counters, left zeroed): after y (+)= W x, prepare y for the
 *     next product: post_xq/post_xd get the int8 form of post_w * y (of y when
 *     post_w is NULL) in cuda_mmv_quantize's layout, and post_ss (when not NULL) the sums of
 *     squares of y per 32 in pre_ss's layout (n, rows/32), for a next product through an
 *     RMSNorm of weight post_w. One output matrix with rows % 32 == 0, or the GLU's output
 *     (the backend asks for it only on small GLUs: see cu_ffn_glu). */
struct cuda_mmv_epi {
    const float *pre_ss;
    float pre_eps;
    const float *post_w;
    int8_t *post_xq;
    void *post_xd; /* float2 {d, d * sum} per 16 values */
    float *post_ss;
    unsigned *post_cnt;
};

/* Where the parts of a scratch of cuda_mmv_scratch_bytes(k, n) lie (int8 values; float2
 * {scale, scale * sum} per 16 values), to point an epilogue's post_* at one. */
void cuda_mmv_scratch_parts(void *scratch, int64_t k, int n, int8_t **xq, void **xd);

/* Whether w[0..count) can go to one cuda_mmv_multi launch: one row length, and one type or
 * Q4_K matrices followed by one Q6_K (Q4_K_M's V) starting at a multiple of 8 rows. */
int cuda_mmv_stackable(const struct cuda_qweight *const *w, int count);
/* Several matrices of one row length in one launch (e.g. Q, K and V; see
 * cuda_mmv_stackable): y[i] (+)= W[i] x (+ b[i] when b and b[i] are not NULL), count <= 3,
 * after cuda_mmv_quantize when the type needs it. epi may be NULL. */
smelt_status cuda_mmv_multi(struct cuda_ctx *ctx, const struct cuda_qweight *const *w,
                            float *const *y, const float *const *b, int count, const float *x,
                            int n, const void *scratch, int accumulate,
                            const struct cuda_mmv_epi *epi, struct err *e);
/* RMSNorm of n rows of k (row stride x_stride floats; w may be NULL) and the quantization of
 * cuda_mmv_quantize in one launch; xn (may be NULL) also gets the normalized f32 rows. */
smelt_status cuda_mmv_norm_quantize(struct cuda_ctx *ctx, const float *x, int64_t x_stride,
                                    const float *w, float eps, int64_t k, int n, void *scratch,
                                    float *xn, struct err *e);
/* y = act(W_gate x) * (W_up x) in one pass (act 0 = SiLU, 1 = tanh-GELU, 2 = gpt-oss's
 * clamped SwiGLU, backend.h's GLU_SWIGLU_OAI), after
 * cuda_mmv_quantize when the type needs it; gate and up must share type and shape. */
smelt_status cuda_mmv_glu(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                          const struct cuda_qweight *up, int act, const float *x, int n, float *y,
                          const void *scratch, const struct cuda_mmv_epi *epi, struct err *e);

/* Expert products ("mmv by id", the mixture-of-experts FFN): w stacks n_exp experts' matrices
 * (w->rows = n_exp x rows per expert, as a 3-D GGUF tensor binds), and a launch runs n_chunks
 * chunks of n (1..8) token rows, chunk c against expert eid[c] (device memory, written by an
 * earlier kernel: the ids are never read on the host). Chunk c reads token rows
 * (c / x_div) * n .. + n of x (or of its int8 form in scratch, which holds x_rows rows:
 * cuda_mmv_quantize(x, k, x_rows) made it) and writes rows c * n .. + n of y, each
 * rows-per-expert wide. A chunk whose id is outside [0, n_exp) writes nothing (an unused
 * chunk of a grouped launch, or a bad id: never an out-of-bounds read). Decode: chunk = one
 * (token, slot) pair, n = 1, x_div = k slots; grouped rows (prefill): chunk = n rows of one
 * expert, x_div = 1. */
struct cuda_mmv_ids {
    const int32_t *eid;         /* (n_chunks) */
    int n_chunks;               /* 1..65535 */
    int x_div;                  /* >= 1 */
    int n_exp;
    int64_t x_rows;             /* >= ((n_chunks - 1) / x_div + 1) * n */
    const float *gate_b, *up_b; /* GLU: the experts' biases, (rows per expert, n_exp), or NULL */
    /* ids_early: the ids were written before the kernel just ahead of this launch, and that
     * kernel signals its PDL dependents only after its own wait (the element-wise and
     * quantize kernels do; an mmv launch with signal_late does): the launch then reads its
     * ids and starts loading its weights before its own wait, while that kernel runs.
     * signal_late: this launch signals its dependents only after its wait (a launch after it
     * may then take ids early). Measured (H200, 2026-12-04): worth it at one token row (the
     * down product's weights stream during gate/up: Qwen3-30B-A3B tg128 +1%), not at 8
     * (-2%: the early signal lets the down launch start sooner). 0 = off. */
    int ids_early, signal_late;
    /* Optional fused epilogues (zero = off; all device memory):
     *  - GLU (cuda_mmv_glu_id), quantized type, rows per expert % 32 == 0: post_cnt
     *    (n_chunks x rows / 32 counters, zeroed, left zeroed) and post_xq/post_xd (the parts of
     *    a cuda_mmv_scratch_bytes(rows per expert, n_chunks * n) scratch): y's int8 form, as
     *    cuda_mmv_quantize(y, rows, n_chunks * n) would write it, without its launch.
     *  - cuda_mmv_id with n = 1, x_div = 1 and chunks (token, slot) in slot order (decode),
     *    rows per expert % 32 == 0: cmb_dst (n_chunks / cmb_k token rows) gets
     *    cuda_moe_combine(cmb_dst, y, NULL, cmb_ids, cmb_w, cmb_b, ...) in the same launch;
     *    cmb_cnt: (n_chunks / cmb_k) x rows-per-expert / 32 counters, zeroed, left zeroed.
     *    y is written where the sum reads it back from L2 (the counting epilogue) and left
     *    alone where the slots meet in one block (Q4_K, Q6_K and MXFP4 at their default
     *    shapes: cuda_mmv.cuh's mmv_sum_body, which needs no cmb_cnt but takes it). With
     *    cmb_post_xq, also the next norm's input of cmb_dst as cuda_moe_combine's post_*
     *    writes it. */
    unsigned *post_cnt;
    int8_t *post_xq;
    void *post_xd;
    float *cmb_dst;
    const int32_t *cmb_ids;
    const float *cmb_w, *cmb_b;
    unsigned *cmb_cnt;
    int cmb_k, cmb_acc;
    const float *cmb_post_w;
    int8_t *cmb_post_xq;
    void *cmb_post_xd;
    float *cmb_post_ss;
    /* A shared expert as one more slot of every token (one token row a chunk): sh_k = k (0 =
     * none) makes chunk c slot c % (k + 1) of token c / (k + 1); slot k runs the shared
     * expert, sh_w[0] (a GLU: gate sh_w[0], up sh_w[1]), 2-D weights of the experts' type,
     * rows and row length, no biases; slot j < k runs expert eid[token k + j]. The GLU launch
     * then takes x_div = k + 1. With cmb_dst (cmb_k = k), the shared slot joins the weighted
     * sum after the experts, weight sigmoid(cmb_sh_logit[token]), or 1 when NULL. */
    int sh_k;
    const struct cuda_qweight *sh_w[2];
    const float *cmb_sh_logit;
};
/* y (chunk c's rows) = W[eid[c]] x (chunk c / x_div's rows). */
smelt_status cuda_mmv_id(struct cuda_ctx *ctx, const struct cuda_qweight *w, const struct cuda_mmv_ids *id,
                         int n, const float *x, float *y, const void *scratch, struct err *e);
/* y = act(W_gate[e] x + gate_b[e]) * (W_up[e] x + up_b[e]) per chunk (act as cuda_mmv_glu). */
smelt_status cuda_mmv_glu_id(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                             const struct cuda_qweight *up, int act, const struct cuda_mmv_ids *id, int n,
                             const float *x, float *y, const void *scratch, struct err *e);

#ifdef __cplusplus
}
#endif
#endif

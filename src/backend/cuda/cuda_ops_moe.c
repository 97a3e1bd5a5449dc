/* The CUDA backend's mixture-of-experts ops (bk_moe_route, bk_moe_ffn; CPU twin:
 * cpu_ops_moe.c). Kernels: cuda_moe.cu (router, grouping, input rows, weighted sum) and the
 * mmv kernels' expert mode (cuda_mmv.h: "mmv by id"); nothing is read back to the host.
 *
 * moe_ffn, for x (n_embd, n) with k slots a row:
 *   decode (n <= CUDA_MMV_MAX_N): every (row, slot) pair is a chunk of one row:
 *     x' int8 (and f32 for float experts)           cuda_moe_gather, n rows; none when the
 *       op before was the fused decode router on the same x (cuda_moe_route_fused wrote
 *       them into cb->moe_xin with the ids: router, pick and gather in one launch)
 *     h[p] = act(gate[e] x' + b) * (up[e] x' + b)    cuda_mmv_glu_id, n k chunks (x_div = k)
 *       and h's int8 form in its epilogue (quantized types, n_ff % 32 == 0; else a
 *       cuda_mmv_quantize launch of n k rows)
 *     y[p] = down[e] h[p]                            cuda_mmv_id, n k chunks
 *       and in its epilogue dst (+)= sum_j w_j (y[p_j] + down_b[e_j]) (the residual add; in
 *       increasing expert id, as cuda_moe_combine, which runs instead when n_embd % 32 != 0;
 *       Q4_K, Q6_K and MXFP4 downs sum a group's slots in one block, mmv_sum_body)
 *   so a token reads its k experts' rows only, in 3 launches after the router (6 before
 *   2026-12-03; the sum's epilogue at one row, MOE_FUSED_MAX_ROWS, h's at every decode row
 *   count; SMELT_MOE_FUSED=0 keeps the separate launches).
 *   more rows (and decode of 2..CUDA_MMV_MAX_N rows where moe_group_rows says so: MXFP4
 *   experts, chunks of 2): the pairs are grouped by expert on the device (cuda_moe_group)
 *   into chunks of CUDA_MMV_MAX_N rows of one expert; the input rows are gathered in that order
 *   (cuda_moe_gather), the products run over the chunks (each chunk's rows read the expert's
 *   weights once), and the combine reads each pair's output from its grouped row.
 *   more rows on the tensor cores ("mmq by id", the default for more than CUDA_MMV_MAX_N rows
 *   where mmq takes the experts' types; SMELT_MOE_PATH=mmv or
 *   mmq forces a path): the same grouping in chunks of the mmq tile's token width ch (16, 32
 *   or 64, by the mean rows per expert), then
 *     x' f16, n_chunks ch rows                       cuda_moe_gather (into mmq's scratch)
 *     g = gate[e] x', u = up[e] x'                   cuda_mmq_id_pre (a token tile = a chunk)
 *     h = act(g + gate_b[e]) * (u + up_b[e]), f16    cuda_glu_expert_mmq (into mmq's scratch)
 *     y = down[e] h                                  cuda_mmq_id_pre
 *   (the f32 x' and h and their conversions, 2 launches and ~80 MB of traffic a layer at
 *   pp512 on Qwen3-30B-A3B, went on 2026-12-06; the same f16 values)
 *     dst (+)= ...                                   cuda_moe_combine, as above
 *   so each expert's weight tile is read once per chunk of ch of its rows; chunk tables and
 *   every launch shape are bounds of (n, k, n_expert), the used chunks are counted on the
 *   device.
 * A shared expert (moe_experts.sh_*): in decode, where its matrices have one expert's shape
 * and the experts' types, slot k of every row in the gate/up and down launches above (k + 1
 * chunks a row, x_div = k + 1; cuda_mmv_ids.sh_k), added last in the weighted sum with weight
 * sigmoid(sh_logit) (the down epilogue and cuda_moe_combine alike); else its own launches,
 * as the CPU runs it (bk_moe_shared_hidden before the experts, bk_moe_shared_down after).
 * Scratch depends on (n, k, n_expert) only, never on the routing (graphs replay). */
#include "backend/cuda/cuda_backend_int.h"

/* Decode's weighted sum in the down launch pays at one row only: H200, 2026-12-04,
 * Qwen3-30B-A3B Q4_K_M at depth 128, both epilogues fused against separate: 1 sequence
 * 264.5 / 258.2 tok/s, 8 sequences 654.7 / 790.0, 16 sequences 1,218 / 1,220; again after the
 * one-count sum and the combine spread over column blocks (H100, 2026-12-06, 8 sequences):
 * 835.9 fused at 8 rows against 1,020.7; and with the weighted sum in one block a group
 * (cuda_mmv.cuh's mmv_sum_body; H100, 2026-12-06, 8 sequences, summed in the down launch
 * against the separate combine): Qwen3-30B-A3B 1,084-1,096 / 1,080-1,087 (noise), gpt-oss-20b
 * 928 / 947 tok/s. h's int8 form in the gate/up launch pays at every decode row count (H100,
 * 2026-12-06, Qwen3-30B-A3B, against its quantize launch: test_cuda_mmv SMELT_BENCH_ID=1
 * SMELT_BENCH_ROWS=8, gate/up and h 53.9 -> 48.1 us a layer; `smelt bench -p 0 -n 32 -d 128
 * -B 4,8`, two alternations: 4 sequences 765 / 761 -> 773 / 773, 8 sequences 1,087 / 1,083
 * -> 1,093 / 1,097 tok/s). */
#define MOE_FUSED_MAX_ROWS 1

/* enum moe_gating as cuda_moe_route numbers it */
_Static_assert(MOE_SOFTMAX == 0 && MOE_SOFTMAX_TOPK == 1, "cuda_moe_route's gating");

void cu_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights,
                  const struct tensor *x, const struct tensor *router, const struct tensor *bias,
                  enum moe_gating gating, const struct prenorm *pre, const struct tensor *sh_gate_inp,
                  struct tensor *sh_logit) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    const struct cuda_qweight *qr = cu_qw_of(cb, router); /* F32: plain rows */
    const struct cuda_qweight *qs = sh_gate_inp ? cu_qw_of(cb, sh_gate_inp) : NULL;
    if (!qr || (sh_gate_inp && !qs)) return;
    struct err e;
    const size_t mark = cu_scratch_mark(b);
    const int64_t n_embd = x->ne[0], n = x->ne[1];
    float *lg = cu_scratch(cb, cuda_moe_route_scratch_bytes(n, (int)router->ne[1]));
    if (!lg) return;
    const float *pre_w = pre && pre->w ? pre->w->data : NULL;
    /* a decode step: one launch, which also writes the experts' input rows (moe_xin) */
    const bool fused = cb->moe_xin.buf && n <= CUDA_MOE_FUSED_ROUTE_ROWS && n <= CUDA_MMV_MAX_N &&
                       n_embd % 32 == 0 && n_embd <= PREP_MAX_K;
    smelt_status st;
    if (fused) /* the shared expert's gate logit as one more row of the router */
        st = cuda_moe_route_fused(&cb->ctx, x->data, n_embd, n, qr->q, bias ? bias->data : NULL,
                                  (int)router->ne[1], (int)ids->ne[0], gating, pre != NULL, pre_w,
                                  pre ? pre->eps : 0, ids->data, weights->data, lg,
                                  cb->moe_cnt + MOE_CNT_MAX, cb->moe_xin.buf, cb->moe_xin.xf,
                                  qs ? qs->q : NULL, sh_logit ? sh_logit->data : NULL, &e);
    else
        st = cuda_moe_route(&cb->ctx, x->data, n_embd, n, qr->q, bias ? bias->data : NULL,
                            (int)router->ne[1], (int)ids->ne[0], gating, pre != NULL, pre_w,
                            pre ? pre->eps : 0, ids->data, weights->data, lg, &e);
    if (st != SMELT_OK) bk_fail(b, e.code, "%s", e.msg);
    cu_scratch_release(b, mark);
    cu_check_launch(cb, "moe route");
    if (sh_gate_inp && !fused) { /* more rows: the logits as a one-row product */
        bk_matmul_group(b, 1, &sh_logit, &sh_gate_inp, NULL, x, pre);
        if (!cu_ok(cb)) return;
    }
    if (fused && st == SMELT_OK)
        cb->moe_xin = (typeof(cb->moe_xin)){cb->moe_xin.buf, cb->moe_xin.xf, x->data, pre_w, n, n_embd,
                                            pre ? pre->eps : 0, pre != NULL, cb->op_seq};
}

/* moe_xin's rows, when the op just before this one was the decode router on the same x. */
static bool xin_matches(const struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre) {
    return cb->moe_xin.buf && cb->moe_xin.seq + 1 == cb->op_seq && cb->moe_xin.x == x->data &&
           cb->moe_xin.n == x->ne[1] && cb->moe_xin.k == x->ne[0] && cb->moe_xin.has_pre == (pre != NULL) &&
           (!pre || (cb->moe_xin.pre_w == (pre->w ? pre->w->data : NULL) && cb->moe_xin.eps == pre->eps));
}

/* The (n_rows, k) int8 form of f32 rows for an expert product of qw (NULL when the type reads
 * f32 directly), from the scratch. */
static void *quantized_rows(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x,
                            int64_t k, int64_t n_rows) {
    if (!cuda_mmv_needs_quant(qw->type)) return NULL;
    void *sc = cu_scratch(cb, cuda_mmv_scratch_bytes(k, (int)n_rows));
    struct err e;
    if (sc && cuda_mmv_quantize(&cb->ctx, x, k, (int)n_rows, sc, &e) != SMELT_OK)
        bk_fail(&cb->base, e.code, "%s", e.msg);
    cu_check_launch(cb, "moe quantize");
    return sc;
}

/* The token width of the mmq-by-id chunks: the narrowest of 16, 32, 64 that holds the mean
 * rows per expert (padding each expert's rows to a whole chunk costs less than re-reading its
 * weights for a second chunk). */
static int mmq_width(int64_t n_pairs, int n_exp) {
    const int64_t mean = (n_pairs + n_exp - 1) / n_exp;
    return mean <= 16 ? 16 : mean <= 32 ? 32 : 64;
}

/* The grouped FFN on the tensor cores (see the file comment). Returns false (nothing done)
 * where the path does not apply, true where it ran or failed the backend. */
static bool moe_ffn_mmq(struct cuda_backend *cb, struct tensor *dst, const struct tensor *x,
                        const struct moe_experts *w, const struct tensor *ids,
                        const struct tensor *weights, const struct prenorm *pre, bool acc,
                        const struct cuda_qweight *qg, const struct cuda_qweight *qu,
                        const struct cuda_qweight *qd, const char *name) {
    struct backend *b = &cb->base;
    const int64_t n_embd = x->ne[0], n = x->ne[1], n_ff = w->gate->ne[1];
    const int k = (int)ids->ne[0], n_exp = (int)w->gate->ne[2];
    if (cb->moe_path == 1 || n <= CUDA_MMV_MAX_N || !cuda_mmq_supported(qg->type, n_embd) || !cuda_mmq_supported(qd->type, n_ff) ||
        qg->rows != n_ff * n_exp || qd->rows != n_embd * n_exp)
        return false;
    const int ch = mmq_width(n * k, n_exp);
    const int tg = cuda_mmq_id_tile(&cb->ctx, qg->type, n_ff, n_embd, n * k, ch);
    const int td = cuda_mmq_id_tile(&cb->ctx, qd->type, n_embd, n_ff, n * k, ch);
    if (tg < 0 || td < 0) return false;
    const int64_t n_chunks = cuda_moe_chunks(n * k, n_exp, ch), rows = n_chunks * ch;
    if (rows > (1 << 24)) return false;
    struct err e;
    uint64_t sb_gu = 0, sb_d = 0;
    if (cuda_mmq_scratch_bytes(&cb->ctx, n_ff, n_embd, rows, &sb_gu, &e) != SMELT_OK ||
        cuda_mmq_scratch_bytes(&cb->ctx, n_embd, n_ff, rows, &sb_d, &e) != SMELT_OK) {
        bk_fail(b, e.code, "%s: %s", name, e.msg);
        return true;
    }
    const uint64_t sb = sb_gu > sb_d ? sb_gu : sb_d;
    const size_t mark = cu_scratch_mark(b);
    int32_t *chunk_eid = cu_scratch(cb, (size_t)n_chunks * sizeof(int32_t));
    int32_t *pos = cu_scratch(cb, (size_t)(n * k) * sizeof(int32_t));
    int32_t *src = cu_scratch(cb, (size_t)rows * sizeof(int32_t));
    void *msc = cu_scratch(cb, (size_t)sb);
    float *g = cu_scratch(cb, (size_t)(rows * n_ff) * sizeof(float));
    float *u = cu_scratch(cb, (size_t)(rows * n_ff) * sizeof(float));
    float *y = cu_scratch(cb, (size_t)(rows * n_embd) * sizeof(float));
    if (!chunk_eid || !pos || !src || !msc || !g || !u || !y) return true;
    smelt_status st =
        cuda_moe_group(&cb->ctx, ids->data, n, k, n_exp, ch, n_chunks, chunk_eid, pos, src, &e);
    if (st == SMELT_OK)
        st = cuda_moe_gather(&cb->ctx, x->data, n_embd, src, rows, pre != NULL,
                             pre && pre->w ? pre->w->data : NULL, pre ? pre->eps : 0, NULL, NULL, msc, &e);
    if (st == SMELT_OK)
        st = cuda_mmq_id_pre(&cb->ctx, qg, n_ff, n_exp, chunk_eid, n_chunks, rows, g, msc, sb, tg,
                             &e);
    if (st == SMELT_OK)
        st = cuda_mmq_id_pre(&cb->ctx, qu, n_ff, n_exp, chunk_eid, n_chunks, rows, u, msc, sb, tg,
                             &e);
    cu_check_launch(cb, "moe gate/up (mmq)");
    if (st == SMELT_OK) {
        /* rows of unused chunks hold stale values: skipped here, never read by the down
         * product's used tiles nor by the combine */
        /* (enum glu_act's own number, as cuda_glu: cu_glu_code is the mmv kernels') */
        cuda_glu_expert_mmq(&cb->ctx, msc, g, u, (int)w->act, w->gate_b ? w->gate_b->data : NULL,
                            w->up_b ? w->up_b->data : NULL, chunk_eid, ch, n_ff, rows);
    }
    if (st == SMELT_OK)
        st = cuda_mmq_id_pre(&cb->ctx, qd, n_embd, n_exp, chunk_eid, n_chunks, rows, y, msc, sb,
                             td, &e);
    cu_check_launch(cb, "moe down (mmq)");
    if (st == SMELT_OK)
        st = cuda_moe_combine(&cb->ctx, dst->data, y, pos, ids->data, weights->data,
                              w->down_b ? w->down_b->data : NULL, n_embd, n, k, n_exp, acc, NULL, NULL,
                              &e);
    cu_check_launch(cb, "moe combine");
    if (st != SMELT_OK) {
        bk_fail(b, e.code, "%s: %s", name, e.msg);
        return true;
    }
    cu_scratch_release(b, mark);
    return true;
}

/* Decode of 2..CUDA_MMV_MAX_N rows: the rows of a chunk when the (row, slot) pairs are
 * grouped by expert (each expert's weights read once a step, at the cost of the grouping
 * and gather launches and of the several-row kernels), 0 for a chunk per pair. By type, as
 * measured (H100, 2026-12-06, `smelt bench -p 0 -n 32 -d 128 -B 2,4,8`, SMELT_MOE_GROUP_CH
 * in one binary, tok/s): gpt-oss-20b's MXFP4 at 8 sequences 950 -> 1,012 in chunks of 2;
 * Qwen3-30B-A3B's Q4_K / Q6_K lost at every width (8 sequences 1,081 -> 699 / 505 / 275
 * for 2 / 4 / 8, 2 sequences 538 -> 357), their several-row kernels being the slow part
 * (docs/cuda-backend.md, "Session of 2026-12-06, seventeenth"). */
static int moe_group_rows(const struct cuda_backend *cb, uint32_t type) {
    if (cb->moe_group_ch >= 0) return cb->moe_group_ch;
    return type == QT_MXFP4 ? 2 : 0;
}

/* The experts (and the shared expert as a slot when sq, its gate, up and down, is given):
 * the rest of cu_moe_ffn. */
static void moe_ffn_experts(struct cuda_backend *cb, struct tensor *dst, const struct tensor *x,
                            const struct moe_experts *w, const struct tensor *ids,
                            const struct tensor *weights, const struct prenorm *pre, bool acc,
                            const struct prenorm *next, bool have_xin,
                            const struct cuda_qweight *const *sq, const struct cuda_qweight *qg,
                            const struct cuda_qweight *qu, const struct cuda_qweight *qd,
                            const char *name) {
    struct backend *b = &cb->base;
    const bool slot = sq != NULL; /* the shared expert's gate, up, down as a slot */
    const int64_t n_embd = x->ne[0], n = x->ne[1], n_ff = w->gate->ne[1];
    const int k = (int)ids->ne[0], n_exp = (int)w->gate->ne[2];
    if (moe_ffn_mmq(cb, dst, x, w, ids, weights, pre, acc, qg, qu, qd, name)) return;
    const int ks = slot ? k + 1 : k; /* slots a token in decode */
    const size_t mark = cu_scratch_mark(b);
    struct err e;
    smelt_status st = SMELT_OK;
    const bool decode = n <= CUDA_MMV_MAX_N;
    /* decode of 2..CUDA_MMV_MAX_N rows without a shared slot: grouped by expert where
     * moe_group_rows says so, else (and at one row) a chunk per (row, slot) pair */
    const int gch = decode && n > 1 && !slot ? moe_group_rows(cb, qg->type) : 0;
    const bool pairs = decode && !gch;
    const int ch = pairs ? 1 : gch ? gch : CUDA_MMV_MAX_N;
    /* chunks and grouped rows: pairs, one chunk each; else whole chunks per expert */
    const int64_t n_chunks = pairs ? n * ks : cuda_moe_chunks(n * k, n_exp, ch),
                  rows = n_chunks * ch;
    int32_t *chunk_eid = pairs ? ids->data : cu_scratch(cb, (size_t)n_chunks * sizeof(int32_t));
    int32_t *pos = pairs ? NULL : cu_scratch(cb, (size_t)(n * k) * sizeof(int32_t));
    int32_t *src = pairs ? NULL : cu_scratch(cb, (size_t)rows * sizeof(int32_t));
    const int64_t x_rows = pairs ? n : rows;
    /* decode after the fused router: its rows (f32 and int8, n of them) */
    const bool use_xin = pairs && have_xin;
    void *xq = use_xin ? cb->moe_xin.buf : cu_scratch(cb, cuda_mmv_scratch_bytes(n_embd, (int)x_rows));
    float *xf = cuda_mmv_needs_quant(qg->type) ? NULL
                : use_xin                      ? cb->moe_xin.xf
                                               : cu_scratch(cb, (size_t)(x_rows * n_embd) * sizeof(float));
    float *h = cu_scratch(cb, (size_t)(rows * n_ff) * sizeof(float));
    float *y = cu_scratch(cb, (size_t)(rows * n_embd) * sizeof(float));
    if (!chunk_eid || (!pairs && (!pos || !src)) || !xq ||
        (!cuda_mmv_needs_quant(qg->type) && !xf) || !h || !y)
        return;
    if (n_chunks > 65535) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED,
                "%s: %lld rows x %d experts in one step (at most 65535 chunks)", name, (long long)n,
                k);
        return;
    }
    if (!pairs)
        st =
            cuda_moe_group(&cb->ctx, ids->data, n, k, n_exp, ch, n_chunks, chunk_eid, pos, src, &e);
    if (st == SMELT_OK && !use_xin) {
        st = cuda_moe_gather(&cb->ctx, x->data, n_embd, src, x_rows, pre != NULL,
                             pre && pre->w ? pre->w->data : NULL, pre ? pre->eps : 0, xq, xf, NULL, &e);
        cu_check_launch(cb, "moe gather");
    }
    struct cuda_mmv_ids id = {.eid = chunk_eid,
                              .n_chunks = (int)n_chunks,
                              .x_div = pairs ? ks : 1,
                              .n_exp = n_exp,
                              .x_rows = x_rows,
                              .gate_b = w->gate_b ? w->gate_b->data : NULL,
                              .up_b = w->up_b ? w->up_b->data : NULL,
                              .signal_late = n == 1, /* the down launch takes its ids early */
                              .sh_k = slot ? k : 0,
                              .sh_w = {slot ? sq[0] : NULL, slot ? sq[1] : NULL}};
    /* decode's fused epilogues (cuda_mmv_ids): h's int8 form written by the gate/up launch
     * (every decode row count of pairs), and the weighted sum by the down launch (at one
     * row); counters in cb->moe_cnt, [0, n_q) for the quantize, then n * n_embd / 32 for the
     * sum */
    const int64_t n_q = n_chunks * (n_ff / 32);
    const bool fuse = pairs && n <= MOE_FUSED_MAX_ROWS && cb->moe_cnt;
    const bool fuse_q = pairs && cb->moe_cnt && cuda_mmv_needs_quant(qg->type) &&
                        cuda_mmv_needs_quant(qd->type) && n_ff % 32 == 0 && n_q <= MOE_CNT_MAX;
    /* decode with the next norm known: the weighted sum also prepares dst for it (cb->prep,
     * as cu_matmul_acc's epilogue), at every decode row count, so that a row's next
     * product sees the same input whatever the step's rows */
    const bool prep = decode && next && next->w && cb->prep.buf && n_embd % 32 == 0 &&
                      n_embd <= PREP_MAX_K;
    const bool fuse_c = fuse && n_embd % 32 == 0 &&
                        (fuse_q ? n_q : 0) + n * n_embd / 32 <= MOE_CNT_MAX;
    struct cuda_moe_post post = {0};
    if (prep) {
        post.w = next->w->data;
        post.ss = cb->prep.ss;
        cuda_mmv_scratch_parts(cb->prep.buf, n_embd, (int)n, &post.xq, &post.xd);
    }
    void *hq = NULL;
    if (fuse_q) {
        hq = cu_scratch(cb, cuda_mmv_scratch_bytes(n_ff, (int)rows));
        if (!hq) return;
        cuda_mmv_scratch_parts(hq, n_ff, (int)rows, &id.post_xq, &id.post_xd);
        id.post_cnt = cb->moe_cnt;
    }
    if (st == SMELT_OK)
        st = cuda_mmv_glu_id(&cb->ctx, qg, qu, cu_glu_code(w->act), &id, ch, xf, h, xq, &e);
    cu_check_launch(cb, "moe gate/up");
    if (st != SMELT_OK) {
        bk_fail(b, e.code, "%s: %s", name, e.msg);
        return;
    }
    if (!fuse_q) hq = quantized_rows(cb, qd, h, n_ff, rows);
    if (!cu_ok(cb) || (cuda_mmv_needs_quant(qd->type) && !hq)) return;
    /* one token: the ids' writer (the router) ran before gate/up, which signals this launch
     * only after its own wait (signal_late; or the quantize after it does): the down
     * weights start streaming while gate/up runs */
    id = (struct cuda_mmv_ids){.eid = chunk_eid,
                               .n_chunks = (int)n_chunks,
                               .x_div = 1,
                               .n_exp = n_exp,
                               .x_rows = rows,
                               .ids_early = n == 1,
                               .sh_k = slot ? k : 0,
                               .sh_w = {slot ? sq[2] : NULL},
                               .cmb_sh_logit = slot && w->sh_logit ? w->sh_logit->data : NULL};
    if (fuse_c) {
        id.cmb_dst = dst->data;
        id.cmb_ids = ids->data;
        id.cmb_w = weights->data;
        id.cmb_b = w->down_b ? w->down_b->data : NULL;
        id.cmb_cnt = cb->moe_cnt + (fuse_q ? n_q : 0);
        id.cmb_k = k;
        id.cmb_acc = acc;
        if (prep) {
            id.cmb_post_w = post.w;
            id.cmb_post_xq = post.xq;
            id.cmb_post_xd = post.xd;
            id.cmb_post_ss = post.ss;
        }
    }
    const struct cuda_moe_shared shd = {w->sh_logit ? w->sh_logit->data : NULL};
    st = cuda_mmv_id(&cb->ctx, qd, &id, ch, h, y, hq, &e);
    cu_check_launch(cb, "moe down");
    if (st == SMELT_OK && !fuse_c)
        st = cuda_moe_combine(&cb->ctx, dst->data, y, pos, ids->data, weights->data,
                              w->down_b ? w->down_b->data : NULL, n_embd, n, k, n_exp, acc,
                              prep ? &post : NULL, slot ? &shd : NULL, &e);
    cu_check_launch(cb, "moe combine");
    if (st != SMELT_OK) {
        bk_fail(b, e.code, "%s: %s", name, e.msg);
        return;
    }
    cu_scratch_release(b, mark);
    if (prep) /* after cu_check_launch, which clears it */
        cb->prep = (typeof(cb->prep)){cb->prep.buf, cb->prep.ss, cb->prep.cnt, dst->data, next->w->data,
                                      n, n_embd, next->eps, true};
}

/* Whether the shared expert runs as one more slot of each row in the experts' decode launches
 * (n <= CUDA_MMV_MAX_N: gate/up, down, and the weighted sum or its epilogue): its weights of
 * one expert's shape and the experts' types, no biases. At one row it spares its own launches
 * (norm and quantize, gate/up, the gate's sigmoid, quantize, down: ~28 us a layer on the H200,
 * cold, for Qwen3.5-35B-A3B) for one more chunk in each; every decode row count takes it, so
 * that a row gets the same bits alone and in a decode batch. */
static bool shared_as_slot(struct cuda_backend *cb, const struct tensor *x, const struct moe_experts *w,
                           const struct cuda_qweight *qg, const struct cuda_qweight *qu,
                           const struct cuda_qweight *qd, const struct cuda_qweight *sq[3]) {
    const int64_t n_embd = x->ne[0], n = x->ne[1], n_ff = w->gate->ne[1];
    if (!w->sh_gate || n > CUDA_MMV_MAX_N || w->gate_b || w->up_b || w->down_b)
        return false;
    const struct cuda_qweight *sg = cu_qw_of(cb, w->sh_gate), *su = cu_qw_of(cb, w->sh_up),
                              *sd = cu_qw_of(cb, w->sh_down);
    sq[0] = sg, sq[1] = su, sq[2] = sd;
    return sg && su && sd && sg->type == qg->type && su->type == qu->type && sd->type == qd->type &&
           sg->rows == n_ff && su->rows == n_ff && sg->k == n_embd && su->k == n_embd &&
           sd->rows == n_embd && sd->k == n_ff;
}

void cu_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x,
                const struct moe_experts *w, const struct tensor *ids, const struct tensor *weights,
                const struct prenorm *pre, bool acc, const struct prenorm *next) {
    struct cuda_backend *cb = cu_enter(b);
    const bool have_xin = xin_matches(cb, x, pre); /* before anything else runs */
    if (!cu_ok(cb)) return;
    const struct cuda_qweight *qg = cu_qw_of(cb, w->gate), *qu = cu_qw_of(cb, w->up),
                              *qd = cu_qw_of(cb, w->down);
    if (!qg || !qu || !qd) return;
    const char *name = w->gate->name ? w->gate->name : "moe_ffn";
    const int n_exp = (int)w->gate->ne[2];
    if (qg->type != qu->type) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED, "%s: gate (%s) and up (%s) experts differ in type", name,
                qtype_name(qg->type), qtype_name(qu->type));
        return;
    }
    if (n_exp > CUDA_MOE_MAX_EXPERTS) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED, "%s: %d experts (the GPU groups at most %d)", name, n_exp,
                CUDA_MOE_MAX_EXPERTS);
        return;
    }
    /* the shared expert: one more slot of the experts' launches where it fits them, else
     * its own launches (bk_moe_shared_hidden, bk_moe_shared_down, as the CPU runs it) */
    const struct cuda_qweight *sq[3];
    const bool slot = shared_as_slot(cb, x, w, qg, qu, qd, sq);
    struct tensor *sh = slot ? NULL : bk_moe_shared_hidden(b, x, w, pre);
    moe_ffn_experts(cb, dst, x, w, ids, weights, pre, acc, sh ? NULL : next, have_xin, slot ? sq : NULL,
                    qg, qu, qd, name);
    bk_moe_shared_down(b, dst, w, sh, next);
}

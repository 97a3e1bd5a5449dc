/* The CUDA backend's recurrent-state op shims (bk_ssm_conv, bk_gated_delta_net, bk_copy):
 * the kernels are cuda_ssm.cu's and cuda_elem.cu's copy. The state slots are device
 * buffers (bk_buffer_alloc, sized by the memory plan: engine/memplan.h); a step reads and
 * writes them, and its snapshots, in place, and model_state_copy's restores are bk_copy
 * launches on the stream: a step never moves state through the host. bk_deltanet at
 * decode is cuda_deltanet_decode (the conv, the delta rule and the gated norm in two
 * launches). */
#include "backend/cuda/cuda_backend_int.h"
#include "backend/cuda/cuda_mmv.h"

void cu_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                 struct tensor *cs, const struct tensor *seqs, bool silu) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_ssm_conv(&cb->ctx, dst->data, x->data, w->data, cs->data, seqs->data, x->ne[0], (int)w->ne[0], x->ne[1],
                  (int)seqs->ne[1], silu);
    cu_check_launch(cb, "ssm_conv");
}

void cu_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv, const struct tensor *a,
                        const struct tensor *bl, const struct tensor *ssm_a, const struct tensor *dt_bias,
                        struct tensor *ss, const struct tensor *seqs, const struct gdn_params *p) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    if (!cuda_gdn_supported(p->head_k)) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED,
                "cuda gated delta net: key head size (ssm.state_size) %d is not a multiple of 4 up to %d",
                p->head_k, CUDA_GDN_MAX_HEAD_K);
        return;
    }
    size_t mark = cu_scratch_mark(b);
    const int64_t n = qkv->ne[1];
    /* the chunkwise form for steps of at least gdn_chunk_min rows (SMELT_GDN_CHUNK_MIN) */
    const int chunked = cb->gdn_chunk_min > 0 && n >= cb->gdn_chunk_min;
    void *sc = cu_scratch(cb, cuda_gdn_scratch_bytes(n, p->n_k_head, p->head_k, p->n_v_head, p->head_v, chunked));
    if (!sc) return;
    struct cuda_gdn_args g = {.dst = dst->data, .qkv = qkv->data, .a = a->data, .bl = bl->data,
                              .ssm_a = ssm_a->data, .dt_bias = dt_bias->data, .ss = ss->data,
                              .seqs = seqs->data, .n_tokens = n, .n_seqs = (int)seqs->ne[1],
                              .n_k_head = p->n_k_head, .head_k = p->head_k, .n_v_head = p->n_v_head,
                              .head_v = p->head_v, .grouped = p->grouped, .eps = p->eps,
                              .chunked = chunked, .scratch = sc};
    cuda_gated_delta_net(&cb->ctx, &g);
    cu_check_launch(cb, "gated_delta_net");
    cu_scratch_release(b, mark);
}

void cu_copy(struct backend *b, struct tensor *dst, const struct tensor *src) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    const int64_t ds[3] = {(int64_t)(dst->nb[1] / 4), (int64_t)(dst->nb[2] / 4), (int64_t)(dst->nb[3] / 4)};
    const int64_t ss[3] = {(int64_t)(src->nb[1] / 4), (int64_t)(src->nb[2] / 4), (int64_t)(src->nb[3] / 4)};
    cuda_copy(&cb->ctx, dst->data, src->data, src->ne, ds, ss);
    cu_check_launch(cb, "copy");
}

/* bk_deltanet at a decode step: two launches (cuda_deltanet_decode) where the kernels take
 * the sizes and the counters exist, up to cb->deltanet_fused_rows rows; z's int8 form goes to
 * att_q for ssm_out's product. Above that the three ops run: on an H100 (Qwen3.5-35B-A3B
 * Q4_K_M, depth 128, 2026-12-06) the two launches gave 1 / 2 sequences 372.6 -> 394.3 /
 * 522 -> 536 tok/s, 4 even (888 / 884), 8 / 16 1,295 -> 1,274 / 1,412 -> 1,388: with more
 * rows the gated norm in the scan's last tile blocks is a tail that its own launch spreads. */
bool cu_deltanet(struct backend *b, struct tensor *z, const struct tensor *qkv, const struct tensor *a,
                 const struct tensor *bl, const struct deltanet_w *w, struct tensor *cs, struct tensor *ss,
                 const struct tensor *seqs, const struct gdn_params *p) {
    const int64_t n = qkv->ne[1], vdim = (int64_t)p->n_v_head * p->head_v;
    const int d = (int)w->conv->ne[0], n_seqs = (int)seqs->ne[1];
    if (!cu_of(b)->moe_cnt || n > cu_of(b)->deltanet_fused_rows || (int64_t)n_seqs * p->n_v_head > MOE_CNT_MAX ||
        !cuda_deltanet_decode_ok(p->head_k, p->head_v, d))
        return false;
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return true;
    size_t mark = cu_scratch_mark(b);
    float *o = cu_scratch(cb, (size_t)(vdim * n) * sizeof(float));
    void *sc = cu_scratch(cb, cuda_deltanet_scratch_bytes(n, p->n_k_head, p->head_k, p->n_v_head, p->head_v));
    if (!o || !sc) return true; /* cu_scratch failed the backend */
    const bool q = cu_att_q_fits(cb, z, vdim, n);
    int8_t *xq = NULL;
    void *xd = NULL;
    if (q) cuda_mmv_scratch_parts(cb->att_q.buf, vdim, (int)n, &xq, &xd);
    struct cuda_deltanet_args da = {
        .g = {.dst = o, .qkv = qkv->data, .a = a->data, .bl = bl->data, .ssm_a = w->ssm_a->data,
              .dt_bias = w->dt_bias->data, .ss = ss->data, .seqs = seqs->data, .n_tokens = n, .n_seqs = n_seqs,
              .n_k_head = p->n_k_head, .head_k = p->head_k, .n_v_head = p->n_v_head, .head_v = p->head_v,
              .grouped = p->grouped, .eps = p->eps, .chunked = 0, .scratch = sc},
        .conv_w = w->conv->data, .cs = cs->data, .d_conv = d, .z = z->data, .norm_w = w->norm->data,
        .norm_eps = w->norm_eps, .xq = xq, .xd = xd, .cnt = cb->moe_cnt};
    cuda_deltanet_decode(&cb->ctx, &da);
    cu_check_launch(cb, q ? "deltanet+quant" : "deltanet");
    if (q) cu_att_q_set(cb, z->data, vdim, n);
    cu_scratch_release(b, mark);
    return true;
}

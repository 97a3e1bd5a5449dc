/* The CUDA backend's op shims: each op of backend.h enqueued on the backend's stream
 * through the kernels' launchers (cuda_kernels.h, cuda_mmv.h; products through
 * cuda_matmul.c). The decode fusions keep their bookkeeping here: the residual stream a
 * product's epilogue prepared for the next norm (cb->prep) and the int8 form of the
 * attention's, a small GLU's or a gated norm's output (cb->att_q), each valid only until
 * the next op. */
#include "backend/cuda/cuda_backend_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- ops ---- */

void cu_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src, const struct tensor *ids) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    if (src->extra) cuda_get_rows_q(&cb->ctx, dst->data, src->extra, ids->data, ids->ne[0]);
    else
        cuda_get_rows_plain(&cb->ctx, dst->data, src->data, src->type, (int64_t)src->nb[1],
                            ids->data, src->ne[0], ids->ne[0]);
    cu_check_launch(cb, "get_rows");
}

void cu_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                        float eps) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_rms_norm(&cb->ctx, dst->data, x->data, w ? w->data : NULL, x->ne[0], tensor_nrows(x), (int64_t)(x->nb[1] / 4),
                  (int64_t)(dst->nb[1] / 4), eps);
    cu_check_launch(cb, "rms_norm");
}

void cu_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                   const struct tensor *bias, float eps) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_layer_norm(&cb->ctx, dst->data, x->data, w ? w->data : NULL, bias ? bias->data : NULL, x->ne[0],
                    tensor_nrows(x), (int64_t)(x->nb[1] / 4), (int64_t)(dst->nb[1] / 4), eps);
    cu_check_launch(cb, "layer_norm");
}

void cu_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    if (act != GLU_SILU && act != GLU_GELU_TANH && act != GLU_GELU_ERF) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED, "cuda act: activation %d", (int)act);
        return;
    }
    cuda_act(&cb->ctx, dst->data, x->data, (int)act, tensor_nelem(x));
    cu_check_launch(cb, "act");
}

static bool rope_args(struct cuda_backend *cb, const struct rope_params *p, struct cuda_rope *r) {
    memset(r, 0, sizeof *r);
    r->mode = p->mode;
    r->n_rot = p->n_rot;
    r->freq_base = p->freq_base;
    r->freq_scale = p->freq_scale;
    r->ext_factor = p->ext_factor;
    r->attn_factor = p->attn_factor;
    r->mscale = p->attn_factor;
    r->freq_factors = p->freq_factors ? p->freq_factors->data : NULL;
    if (p->ext_factor != 0) {
        /* the dimension index at which a frequency makes n turns over n_ctx_orig */
        double base = p->freq_base, nr = p->n_rot, n0 = p->n_ctx_orig;
        double lo = nr * log(n0 / (p->beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi = nr * log(n0 / (p->beta_slow * 2 * M_PI)) / (2 * log(base));
        if (!p->yarn_unrounded) { /* HF's default truncate = True, llama.cpp; gpt-oss keeps them */
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > nr - 1) hi = nr - 1;
        r->corr_lo = (float)lo;
        r->corr_hi = (float)hi;
        r->mscale = (float)(p->attn_factor * (1.0 + 0.1 * log(1.0 / p->freq_scale)));
    }
    /* the speed table of this parameter set: made at its first use (an eager step; were it
     * captured, the fill would replay with the graph, harmlessly) */
    for (int i = 0; i < cb->n_rope_tab; i++) {
        const struct cuda_rope *k = &cb->rope_tab[i].key;
        if (k->n_rot == r->n_rot && k->freq_base == r->freq_base && k->freq_scale == r->freq_scale &&
            k->ext_factor == r->ext_factor && k->corr_lo == r->corr_lo && k->corr_hi == r->corr_hi &&
            k->freq_factors == r->freq_factors) {
            r->freq = cb->rope_tab[i].freq;
            return true;
        }
    }
    if (cb->n_rope_tab == cb->cap_rope_tab) {
        int cap = cb->cap_rope_tab ? 2 * cb->cap_rope_tab : 4;
        struct rope_tab *t = realloc(cb->rope_tab, sizeof *t * (size_t)cap);
        if (!t) {
            bk_fail(&cb->base, SMELT_ERR_NOMEM, "out of memory (RoPE tables)");
            return false;
        }
        cb->rope_tab = t;
        cb->cap_rope_tab = cap;
    }
    double *f = NULL;
    cudaError_t ce = cudaMalloc((void **)&f, (size_t)(p->n_rot / 2 + 1) * sizeof(double));
    if (ce != cudaSuccess) {
        bk_fail(&cb->base, SMELT_ERR_DEVICE, "cuda rope table: %s", cudaGetErrorString(ce));
        return false;
    }
    cuda_rope_freq_fill(&cb->ctx, f, r);
    cu_check_launch(cb, "rope table");
    cb->ctx.pdl_fence = 1; /* the fused decode attention reads the table before its PDL wait */
    cb->rope_tab[cb->n_rope_tab].key = *r;
    cb->rope_tab[cb->n_rope_tab++].freq = f;
    r->freq = f;
    return cu_ok(cb);
}

void cu_rope(struct backend *b, struct tensor *x, const struct tensor *pos, const struct rope_params *p) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    struct cuda_rope r;
    if (!rope_args(cb, p, &r)) return;
    cuda_rope_inplace(&cb->ctx, x->data, pos->data, (int)x->ne[0], (int)x->ne[1], x->ne[2], &r, NULL, 0);
    cu_check_launch(cb, "rope");
}

void cu_matmul(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *x) {
    struct cuda_backend *cb = cu_enter(b);
    cb->prep.valid = false;
    const struct cuda_qweight *qw = cu_qw_of(cb, w);
    if (qw) cu_mm(cb, qw, x->data, x->ne[1], dst->data, false, NULL);
}

static const void *quantized(struct cuda_backend *cb, const float *x, int64_t k, int64_t n, uint32_t type);

/* The prepared form of x for a norm of weight pre->w, if the last op made it. */
static bool prep_matches(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre) {
    return cb->prep.valid && pre && pre->w && cb->prep.x == x->data && cb->prep.w == pre->w->data &&
           cb->prep.n == x->ne[1] && cb->prep.k == x->ne[0] && cb->prep.eps == pre->eps;
}

/* att_q.buf when the op just before this one wrote x and its int8 form, and that fits qw. */
static const void *att_q_for(struct cuda_backend *cb, const struct tensor *x, const struct cuda_qweight *qw) {
    return cb->att_q.x && cb->att_q.seq + 1 == cb->op_seq && qw && cb->att_q.x == x->data &&
                   cb->att_q.n == x->ne[1] && cb->att_q.k == x->ne[0] && qw->k == x->ne[0] &&
                   cuda_mmv_needs_quant(qw->type)
               ? cb->att_q.buf
               : NULL;
}

/* cuda_backend_int.h */
bool cu_att_q_fits(const struct cuda_backend *cb, const struct tensor *dst, int64_t width, int64_t rows) {
    return cb->att_q.buf && rows <= CUDA_MMV_MAX_N && width % 32 == 0 && width <= ATT_Q_MAX_K &&
           tensor_is_contiguous(dst);
}

void cu_att_q_set(struct cuda_backend *cb, const void *dst, int64_t width, int64_t rows) {
    if (cu_ok(cb)) cb->att_q = (typeof(cb->att_q)){cb->att_q.buf, dst, rows, width, cb->op_seq};
}

/* dst += W x (+ bias). In decode the residual add (and the bias, into the product first)
 * is the mmv launch's epilogue, and with `next` given the same launch also prepares dst for
 * the norm the caller applies next (cb->prep), sparing the next product its norm+quantize
 * launch. */
void cu_matmul_acc(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *bias,
                   const struct tensor *x, const struct prenorm *next) {
    struct cuda_backend *cb = cu_enter(b);
    const struct cuda_qweight *qw = cu_qw_of(cb, w);
    const void *att_xq = att_q_for(cb, x, qw); /* x's int8 form, if the attention made it */
    cb->prep.valid = false;
    if (!qw || !cu_ok(cb)) return;
    const int64_t n = x->ne[1];
    const bool mmv = n <= CUDA_MMV_MAX_N && !cu_mm_small_batch(cb, qw, x->data, n);
    const bool prep = mmv && next && next->w && cb->prep.buf && cuda_mmv_needs_quant(qw->type) &&
                      qw->rows % 32 == 0 && qw->rows <= PREP_MAX_K &&
                      dst->nb[1] == (size_t)qw->rows * sizeof(float);
    size_t mark = cu_scratch_mark(b);
    if (!mmv || (!prep && !bias)) {
        if (!bias) {
            cu_mm(cb, qw, x->data, n, dst->data, true, att_xq);
        } else { /* t = W x + bias, then dst += t */
            float *t = cu_scratch(cb, (size_t)qw->rows * (size_t)n * sizeof(float));
            if (!t) return;
            cu_mm(cb, qw, x->data, n, t, false, att_xq);
            if (cu_ok(cb)) cuda_add(&cb->ctx, t, t, bias->data, qw->rows, n, 1);
            if (cu_ok(cb)) cuda_add(&cb->ctx, dst->data, dst->data, t, qw->rows, n, n);
            cu_check_launch(cb, "bias, residual add");
        }
        cu_scratch_release(b, mark);
        return;
    }
    const void *xq = att_xq ? att_xq : quantized(cb, x->data, qw->k, n, qw->type);
    if (cuda_mmv_needs_quant(qw->type) && !xq) return;
    struct cuda_mmv_epi epi = {0};
    if (prep) {
        epi.post_w = next->w->data;
        cuda_mmv_scratch_parts(cb->prep.buf, qw->rows, (int)n, &epi.post_xq, &epi.post_xd);
        epi.post_ss = cb->prep.ss;
        epi.post_cnt = cb->prep.cnt;
    }
    float *y = dst->data;
    const float *bb = bias ? bias->data : NULL;
    struct err e;
    if (cuda_mmv_multi(&cb->ctx, &qw, &y, &bb, 1, x->data, (int)n, xq, 1, prep ? &epi : NULL, &e) != SMELT_OK) {
        bk_fail(b, e.code, "%s", e.msg);
        return;
    }
    cu_prof_mark(cb, qw->bytes, "mmv%s%s %s %lldx%lld n=%d", bias ? "+bias" : "", prep ? "+prep" : "",
                 qtype_name(qw->type), (long long)qw->rows, (long long)qw->k, (int)n);
    if (prep)
        cb->prep = (typeof(cb->prep)){cb->prep.buf, cb->prep.ss, cb->prep.cnt, dst->data, next->w->data, n, qw->rows,
                                      next->eps, true};
    cu_scratch_release(b, mark);
}


void cu_add(struct backend *b, struct tensor *dst, const struct tensor *a, const struct tensor *c) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_add(&cb->ctx, dst->data, a->data, c->data, a->ne[0], tensor_nrows(a), tensor_nrows(c));
    cu_check_launch(cb, "add");
}

void cu_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_scale(&cb->ctx, dst->data, x->data, s, tensor_nelem(x));
    cu_check_launch(cb, "scale");
}

void cu_glu(struct backend *b, struct tensor *dst, const struct tensor *gate, const struct tensor *up,
                   enum glu_act act) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    /* the kernels' act codes are enum glu_act's (SiLU, tanh-GELU, sigmoid, clamped SwiGLU) */
    const bool row_gate = gate->ne[0] == 1 && up->ne[0] > 1; /* one gate per row (a shared expert's) */
    /* decode (qwen35's output gate before W_o, a shared expert's gate before its W_down):
     * the output's int8 form too, for the product */
    const int64_t width = dst->ne[0], rows = tensor_nrows(dst);
    if (cu_att_q_fits(cb, dst, width, rows)) {
        int8_t *xq;
        void *xd;
        cuda_mmv_scratch_parts(cb->att_q.buf, width, (int)rows, &xq, &xd);
        cuda_glu_q(&cb->ctx, dst->data, gate->data, up->data, (int)act, width * rows, row_gate ? width : 0, xq, xd);
        cu_check_launch(cb, "glu+quant");
        cu_att_q_set(cb, dst->data, width, rows);
        return;
    }
    if (row_gate)
        cuda_glu_row_gate(&cb->ctx, dst->data, gate->data, up->data, (int)act, up->ne[0], tensor_nrows(up));
    else
        cuda_glu(&cb->ctx, dst->data, gate->data, up->data, (int)act, tensor_nelem(gate));
    cu_check_launch(cb, "glu");
}

/* One launch: rms_norm per group of w->ne0, times act(gate); at decode (whole 32-groups) the
 * output's int8 form too (att_q), for ssm_out's product right after it. */
void cu_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                  const struct tensor *gate, float eps, enum glu_act act) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    const int64_t gn = w->ne[0], width = dst->ne[0], rows = tensor_nrows(dst);
    const bool q = gn % 32 == 0 && cu_att_q_fits(cb, dst, width, rows);
    int8_t *xq = NULL;
    void *xd = NULL;
    if (q) cuda_mmv_scratch_parts(cb->att_q.buf, width, (int)rows, &xq, &xd);
    cuda_norm_gate(&cb->ctx, dst->data, x->data, w->data, gate->data, (int)act, gn, tensor_nelem(x) / gn, eps, xq,
                   xd);
    cu_check_launch(cb, q ? "norm_gate+quant" : "norm_gate");
    if (q) cu_att_q_set(cb, dst->data, width, rows);
}

void cu_softcap(struct backend *b, struct tensor *x, float cap) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_softcap(&cb->ctx, x->data, cap, tensor_nelem(x));
    cu_check_launch(cb, "softcap");
}

void cu_softmax(struct backend *b, struct tensor *x) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_softmax(&cb->ctx, x->data, x->ne[0], tensor_nrows(x));
    cu_check_launch(cb, "softmax");
}

void cu_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                        const struct tensor *v, const struct attn_meta *m) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    cuda_kv_store(&cb->ctx, kc->data, vc->data, kc->type, k->data, v->data, m->slot->data, (int)k->ne[0], (int)v->ne[0],
                  (int)k->ne[1], m->block_size, k->ne[2]);
    cu_check_launch(cb, "kv_store");
}

/* The attention call's arguments for the step's shape (no RoPE fused). */
static bool attn_args(struct cuda_backend *cb, struct cuda_attn_args *out, struct tensor *dst, const struct tensor *q,
                      const struct tensor *kc, const struct tensor *vc, const struct attn_meta *m,
                      const struct attn_params *p) {
    if (kc->ne[0] > 256 || vc->ne[0] > 256) {
        bk_fail(&cb->base, SMELT_ERR_UNSUPPORTED, "cuda attention: head_dim %lld > 256", (long long)kc->ne[0]);
        return false;
    }
    struct cuda_attn_args a = {
        .dst = dst->data, .q = q->data, .kc = kc->data, .vc = vc->data, .cache_type = kc->type,
        .pos = m->pos->data, .seq = m->seq->data, .blocks = m->blocks->data,
        .max_blocks = (int)m->blocks->ne[0], .block_size = m->block_size, .n_seqs = (int)m->blocks->ne[1],
        .dk = (int)kc->ne[0], .dv = (int)vc->ne[0], .n_head = (int)q->ne[1], .n_kv = (int)kc->ne[2],
        .n_tokens = q->ne[2], .scale = p->scale, .softcap = p->softcap, .window = p->window,
        .sinks = p->sinks ? p->sinks->data : NULL, .kernel = CUDA_ATTN_AUTO};
    a.max_keys = (int)(m->blocks->ne[0] * m->block_size);
    if (p->window > 0 && a.max_keys > p->window) a.max_keys = p->window;
    if (p->non_causal) { /* every row sees its sequence's keys 0..n_keys - 1: that bound
                          * stands in for the row's position (scratch of the caller's layer) */
        int32_t *kpos = cu_scratch(cb, (size_t)q->ne[2] * sizeof(int32_t));
        if (!kpos) return false;
        cuda_key_bound(&cb->ctx, kpos, m->seq->data, m->n_keys->data, q->ne[2]);
        cu_check_launch(cb, "key bound");
        a.pos = kpos;
    }
    *out = a;
    return true;
}

/* Enqueues attention a (its dst, q_out and scratch filled in here). */
static void attention_run(struct cuda_backend *cb, struct cuda_attn_args a) {
    struct backend *b = &cb->base;
    /* decode: the output's int8 form too, for W_o's product (att_q) */
    const int64_t width = (int64_t)a.dv * a.n_head;
    const bool want_q = cb->att_q.buf && a.n_tokens <= CUDA_MMV_MAX_N && width % 32 == 0 && width <= ATT_Q_MAX_K;
    if (want_q) a.q_out = cb->att_q.buf;
    size_t mark = cu_scratch_mark(b);
    /* the kernel and its scratch follow from the step's shape only (graph replay) */
    uint64_t need = cuda_attn_scratch_bytes(&cb->ctx, &a);
    if (need) {
        a.scratch = cu_scratch(cb, need);
        if (!a.scratch) return;
    }
    cuda_attention(&cb->ctx, &a);
    cu_check_launch(cb, a.rope.freq ? "rope+attention" : "attention");
    if (want_q) cu_att_q_set(cb, a.dst, width, a.n_tokens);
    cu_scratch_release(b, mark);
}

void cu_attention(struct backend *b, struct tensor *dst, const struct tensor *q, const struct tensor *kc,
                         const struct tensor *vc, const struct attn_meta *m, const struct attn_params *p) {
    struct cuda_backend *cb = cu_enter(b);
    struct cuda_attn_args a;
    if (cu_ok(cb) && attn_args(cb, &a, dst, q, kc, vc, m, p)) attention_run(cb, a);
}

/* ---- sampling summaries (cuda_sample.cu) ---- */

void cu_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                    const struct tensor *rows, const struct tensor *adj, const struct tensor *mask) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    int n_rows = (int)logits->ne[1], nv = (int)logits->ne[0];
    size_t mark = cu_scratch_mark(b);
    void *sc = cu_scratch(cb, cuda_topk_scratch_bytes(&cb->ctx, n_rows, nv));
    if (!sc) return;
    struct cuda_topk_args a = {.logits = logits->data, .ld = (int64_t)(logits->nb[1] / sizeof(float)),
                               .n_vocab = nv, .n_rows = n_rows, .rows = rows->data, .adj = adj->data,
                               .adj_cap = (int)adj->ne[1], .mask = mask ? mask->data : NULL,
                               .mask_ld = mask ? (int64_t)(mask->nb[1] / sizeof(uint32_t)) : 0,
                               .out = dst->data, .scratch = sc};
    cuda_logits_topk(&cb->ctx, &a);
    cu_check_launch(cb, "logits_topk");
    cu_scratch_release(b, mark);
}

/* ---- fused ops ---- */

/* x' = rms_norm(x) * pre->w in scratch (or x itself when pre is NULL). */
static const float *prenormed(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre) {
    if (!pre) return x->data;
    float *xn = cu_scratch(cb, (size_t)tensor_nelem(x) * sizeof(float));
    if (!xn) return NULL;
    cuda_rms_norm(&cb->ctx, xn, x->data, pre->w ? pre->w->data : NULL, x->ne[0], x->ne[1],
                  (int64_t)(x->nb[1] / 4), x->ne[0], pre->eps);
    cu_check_launch(cb, "rms_norm");
    return xn;
}

/* x's rows as an mmq product's input, normed by pre on the way (struct mm_src); mm_src_ok:
 * the rows' layout allows it (contiguous rows of f32; strided only when normed). */
static bool mm_src_ok(const struct tensor *x, const struct prenorm *pre) {
    return x->type == QT_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 &&
           (pre ? x->nb[1] % sizeof(float) == 0 : x->nb[1] == (size_t)x->ne[0] * sizeof(float));
}
static struct mm_src mm_src_of(const struct tensor *x, const struct prenorm *pre) {
    return (struct mm_src){x->data, (int64_t)(x->nb[1] / sizeof(float)), pre != NULL, pre && pre->w ? pre->w->data : NULL,
                           pre ? pre->eps : 0.0f};
}

/* The quantized form of x for n <= 8 rows, shared by several weights of the same width. */
static const void *quantized(struct cuda_backend *cb, const float *x, int64_t k, int64_t n, uint32_t type) {
    if (n > CUDA_MMV_MAX_N || !cuda_mmv_needs_quant(type)) return NULL;
    void *sc = cu_scratch(cb, cuda_mmv_scratch_bytes(k, (int)n));
    struct err e;
    if (sc && cuda_mmv_quantize(&cb->ctx, x, k, (int)n, sc, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return NULL;
    }
    cu_prof_mark(cb, 0, "quantize act");
    return sc;
}

/* The normalized input of a decode matmul group in its int8 form (scratch), and in f32 (xn)
 * when float-typed weights need it: one RMSNorm+quantize launch. */
static const void *norm_quantized(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre,
                                  float **xn) {
    const int64_t k = x->ne[0];
    const int n = (int)x->ne[1];
    void *sc = cu_scratch(cb, cuda_mmv_scratch_bytes(k, n));
    if (!sc) return NULL;
    if (xn) {
        *xn = cu_scratch(cb, (size_t)(k * n) * sizeof(float));
        if (!*xn) return NULL;
    }
    struct err e;
    if (cuda_mmv_norm_quantize(&cb->ctx, x->data, (int64_t)(x->nb[1] / 4),
                               pre->w ? pre->w->data : NULL, pre->eps, k, n, sc, xn ? *xn : NULL,
                               &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return NULL;
    }
    cu_prof_mark(cb, 0, "rms_norm+quantize");
    return sc;
}

/* Products of one decode matmul group (qwen35's Gated DeltaNet has four: qkv, z, b, a). */
#define GROUP_MMV_MAX 4

/* Decode (<= 8 rows): one RMSNorm+quantize launch, then one mmv launch per run of weights
 * that stack (Q, K and V of one type, or Q4_K_M's Q4_K Q and K with a Q6_K V; at most
 * MMV_MATS a launch), biases added in the same launch. */
static void matmul_group_mmv(struct cuda_backend *cb, int n, struct tensor *const *dst, const struct tensor *const *w,
                             const struct tensor *const *bias, const struct tensor *x, const struct prenorm *pre) {
    const struct cuda_qweight *qw[GROUP_MMV_MAX];
    bool any_float = false, any_quant = false;
    for (int i = 0; i < n; i++) {
        if (!(qw[i] = cu_qw_of(cb, w[i]))) return;
        if (cuda_mmv_needs_quant(qw[i]->type)) any_quant = true;
        else any_float = true;
    }
    const float *xf = x->data;
    const void *xq = NULL;
    struct cuda_mmv_epi epi = {0};
    if (any_quant && prep_matches(cb, x, pre)) {
        /* the previous product left x's int8 form: only float weights need a norm launch */
        xq = cb->prep.buf;
        epi.pre_ss = cb->prep.ss;
        epi.pre_eps = pre->eps;
        if (any_float && !(xf = prenormed(cb, x, pre))) return;
    } else if (pre && any_quant) {
        float *xn = NULL;
        xq = norm_quantized(cb, x, pre, any_float ? &xn : NULL);
        if (!xq) return;
        if (any_float) xf = xn;
    } else {
        if (!(xf = prenormed(cb, x, pre))) return;
        uint32_t qt = qw[0]->type;
        for (int i = 0; i < n; i++)
            if (cuda_mmv_needs_quant(qw[i]->type)) qt = qw[i]->type;
        if (any_quant && !(xq = quantized(cb, xf, x->ne[0], x->ne[1], qt))) return;
    }
    for (int i = 0; i < n && cu_ok(cb);) {
        int j = i + 1;
        while (j < n && cuda_mmv_stackable(&qw[i], j + 1 - i)) j++;
        float *y[GROUP_MMV_MAX];
        const float *b[GROUP_MMV_MAX];
        for (int t = i; t < j; t++) {
            y[t - i] = dst[t]->data;
            b[t - i] = bias && bias[t] ? bias[t]->data : NULL;
        }
        struct err e;
        bool q = cuda_mmv_needs_quant(qw[i]->type);
        if (cuda_mmv_multi(&cb->ctx, &qw[i], y, b, j - i, xf, (int)x->ne[1], q ? xq : NULL, 0,
                           q && epi.pre_ss ? &epi : NULL, &e) != SMELT_OK) {
            bk_fail(&cb->base, e.code, "%s", e.msg);
            return;
        }
        uint64_t bytes = 0;
        for (int t = i; t < j; t++) bytes += qw[t]->bytes;
        cu_prof_mark(cb, bytes, "mmv %s%s%s x%d %lldx%lld n=%d", qtype_name(qw[i]->type),
                  qw[j - 1]->type != qw[i]->type ? "+" : "",
                  qw[j - 1]->type != qw[i]->type ? qtype_name(qw[j - 1]->type) : "", j - i,
                  (long long)(qw[i]->rows), (long long)qw[i]->k, (int)x->ne[1]);
        i = j;
    }
}

static void add_biases(struct cuda_backend *cb, int n, struct tensor *const *dst, const struct tensor *const *bias) {
    for (int i = 0; i < n && cu_ok(cb); i++) {
        if (bias && bias[i]) {
            cuda_add(&cb->ctx, dst[i]->data, dst[i]->data, bias[i]->data, dst[i]->ne[0], tensor_nrows(dst[i]), 1);
            cu_check_launch(cb, "bias");
        }
    }
}

void cu_matmul_group(struct backend *b, int n, struct tensor *const *dst, const struct tensor *const *w,
                            const struct tensor *const *bias, const struct tensor *x, const struct prenorm *pre) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    size_t mark = cu_scratch_mark(b);
    bool mmb = false; /* 2..8 rows where the small-batch kernel won: unfused, through cu_mm */
    for (int i = 0; i < n && x->ne[1] <= CUDA_MMV_MAX_N && !mmb; i++)
        mmb = w[i]->extra && cu_mm_small_batch(cb, w[i]->extra, x->data, x->ne[1]);
    if (x->ne[1] <= CUDA_MMV_MAX_N && n <= GROUP_MMV_MAX && !mmb) {
        matmul_group_mmv(cb, n, dst, w, bias, x, pre);
        cu_scratch_release(b, mark);
        return;
    }
    const struct cuda_qweight *qa[8];
    float *ya[8];
    bool whole = n <= 8 && x->ne[1] > CUDA_MMV_MAX_N && mm_src_ok(x, pre);
    for (int i = 0; i < n && whole; i++) {
        whole = (qa[i] = cu_qw_of(cb, w[i])) != NULL;
        ya[i] = dst[i]->data;
    }
    const struct mm_src src = mm_src_of(x, pre);
    if (whole && cu_mm_group_mmq(cb, n, qa, &src, x->ne[1], ya)) { /* one f16 input for all */
        add_biases(cb, n, dst, bias);
        cu_scratch_release(b, mark);
        return;
    }
    const float *xn = prenormed(cb, x, pre);
    if (!xn) return;
    for (int i0 = 0; i0 < n; i0 += CUDA_MMB_MATS) { /* neighbours of one type may share a launch */
        const int c = n - i0 < CUDA_MMB_MATS ? n - i0 : CUDA_MMB_MATS;
        const struct cuda_qweight *qw[CUDA_MMB_MATS];
        float *y[CUDA_MMB_MATS];
        for (int i = 0; i < c; i++) {
            if (!(qw[i] = cu_qw_of(cb, w[i0 + i]))) return;
            y[i] = dst[i0 + i]->data;
        }
        cu_mm_group(cb, c, qw, xn, x->ne[1], y);
    }
    add_biases(cb, n, dst, bias);
    cu_scratch_release(b, mark);
}

void cu_ffn_glu(struct backend *b, struct tensor *dst, const struct tensor *w_gate, const struct tensor *w_up,
                       const struct tensor *x, enum glu_act act, const struct prenorm *pre) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    const struct cuda_qweight *qg = cu_qw_of(cb, w_gate), *qu = cu_qw_of(cb, w_up);
    if (!qg || !qu) return;
    size_t mark = cu_scratch_mark(b);
    int64_t n = x->ne[1];
    if (n <= CUDA_MMV_MAX_N && qg->type == qu->type && qg->rows == qu->rows &&
        !cu_mm_small_batch(cb, qg, x->data, n)) {
        /* decode: gate, up and the activation in one kernel (one read of x's int8 form) */
        struct err e;
        const float *xn = x->data;
        const void *sc = NULL;
        struct cuda_mmv_epi epi = {0};
        if (cuda_mmv_needs_quant(qg->type) && prep_matches(cb, x, pre)) {
            sc = cb->prep.buf;
            epi.pre_ss = cb->prep.ss;
            epi.pre_eps = pre->eps;
        } else if (cuda_mmv_needs_quant(qg->type)) {
            if (pre) sc = norm_quantized(cb, x, pre, NULL);
            else sc = quantized(cb, xn, x->ne[0], n, qg->type);
            if (!sc) return;
        } else if (pre) {
            xn = prenormed(cb, x, pre);
            if (!xn) return;
        }
        /* The output's int8 form for the down product (att_q), made by the block that
         * completes each 32-row group instead of a quantize launch, for one token row of a
         * small GLU only (H200): Qwen2.5-0.5B Q8_0 (4864x896) tg128 +2.3%, but x8 batched
         * 4,446 -> 3,883 tok/s (the group's last block quantizes 8 rows alone); Llama-3-8B
         * Q4_K_M (14336x4096, 3,584 blocks) tg128 394 -> 358, there the launch is cheaper. */
        const bool qout = sc && n == 1 && cb->att_q.buf && qg->rows % 32 == 0 && qg->rows <= ATT_Q_MAX_K &&
                          qg->rows * qg->k <= ((int64_t)16 << 20) && dst->nb[1] == (size_t)qg->rows * sizeof(float);
        if (qout) {
            epi.post_cnt = cb->prep.cnt;
            cuda_mmv_scratch_parts(cb->att_q.buf, qg->rows, (int)n, &epi.post_xq, &epi.post_xd);
        }
        if (cuda_mmv_glu(&cb->ctx, qg, qu, cu_glu_code(act), xn, (int)n, dst->data, sc,
                         epi.pre_ss || qout ? &epi : NULL, &e) != SMELT_OK)
            bk_fail(b, e.code, "%s", e.msg);
        cu_prof_mark(cb, qg->bytes + qu->bytes, "mmv glu%s %s 2x%lldx%lld n=%d", qout ? "+quant" : "",
                  qtype_name(qg->type), (long long)qg->rows, (long long)qg->k, (int)n);
        if (qout) cu_att_q_set(cb, dst->data, qg->rows, n);
        cu_scratch_release(b, mark);
        return;
    }
    const float *xn = prenormed(cb, x, pre);
    float *g = cu_scratch(cb, (size_t)tensor_nelem(dst) * sizeof(float));
    if (!xn || !g) return;
    const void *xq = cu_mm_small_batch(cb, qg, xn, n) ? NULL : quantized(cb, xn, x->ne[0], x->ne[1], qg->type);
    if (xq) { /* mmv at <= 8 rows: both products on one int8 form of x */
        cu_mm(cb, qg, xn, x->ne[1], g, false, xq);
        cu_mm(cb, qu, xn, x->ne[1], dst->data, false,
              cuda_mmv_needs_quant(qu->type) && qu->type == qg->type ? xq : NULL);
    } else if (cu_mm_glu(cb, qg, qu, (int)act, xn, x->ne[1], dst->data)) { /* the activation in its store */
        cu_scratch_release(b, mark);
        return;
    } else { /* one small-batch launch for both where their paths are mmb */
        const struct cuda_qweight *gu[2] = {qg, qu};
        float *gy[2] = {g, dst->data};
        cu_mm_group(cb, 2, gu, xn, x->ne[1], gy);
    }
    cuda_glu(&cb->ctx, dst->data, g, dst->data, (int)act, tensor_nelem(dst));
    cu_check_launch(cb, "glu");
    cu_scratch_release(b, mark);
}

/* The dense FFN as one op where its products run on the tensor cores (cu_mm_ffn: h never
 * exists as f32, the down product reads the GLU launch's f16 output); false elsewhere (decode
 * rows, products whose path is not an mmq tile or not yet measured), and the composed ops run. */
bool cu_ffn(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w_gate,
            const struct tensor *w_up, const struct tensor *w_down, enum glu_act act, const struct prenorm *pre,
            bool acc) {
    struct cuda_backend *cb = cu_enter(b);
    const struct cuda_qweight *qg = cu_qw_of(cb, w_gate), *qu = cu_qw_of(cb, w_up), *qd = cu_qw_of(cb, w_down);
    int choice[2];
    const int64_t n = x->ne[1];
    if (!qg || !qu || !qd || dst->nb[1] != (size_t)qd->rows * sizeof(float) || !mm_src_ok(x, pre) ||
        !cu_mm_ffn_plan(cb, qg, qu, qd, n, choice))
        return false;
    cb->prep.valid = false;
    const struct mm_src src = mm_src_of(x, pre);
    cu_mm_ffn(cb, qg, qu, qd, cu_glu_code(act), &src, n, dst->data, acc, choice);
    return true;
}

void cu_rope_kv_store(struct backend *b, struct tensor *q, struct tensor *k, const struct tensor *v,
                             struct tensor *kc, struct tensor *vc, const struct attn_meta *m,
                             const struct qk_prep *p) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    struct cuda_rope r;
    if (!rope_args(cb, p->rope, &r)) return;
    cuda_rope_kv_store(&cb->ctx, q->data, k->data, v->data, kc->data, vc->data, kc->type, m->pos->data, m->slot->data,
                       (int)k->ne[0], (int)v->ne[0], (int)q->ne[1], (int)k->ne[1], m->block_size, k->ne[2], &r,
                       p->q_norm ? p->q_norm->data : NULL, p->k_norm ? p->k_norm->data : NULL, p->eps);
    cu_check_launch(cb, "rope+kv_store");
}

/* A decode step (every sequence one row) whose attention runs the decode kernel: RoPE and
 * the KV store happen inside it (cuda_attn_args.rope); q and k stay raw. Else the two
 * launches. */
void cu_rope_attention(struct backend *b, struct tensor *dst, struct tensor *q, struct tensor *k,
                              const struct tensor *v, struct tensor *kc, struct tensor *vc, const struct attn_meta *m,
                              const struct qk_prep *qp, const struct attn_params *ap) {
    struct cuda_backend *cb = cu_enter(b);
    struct cuda_attn_args a;
    if (!cu_ok(cb) || !attn_args(cb, &a, dst, q, kc, vc, m, ap)) return;
    struct cuda_attn_plan plan;
    cuda_attn_plan(&cb->ctx, &a, &plan);
    if (!m->one_per_seq || plan.kernel != CUDA_ATTN_DECODE || a.dk != a.dv || ap->non_causal) {
        cu_rope_kv_store(b, q, k, v, kc, vc, m, qp);
        if (cu_ok(cb)) attention_run(cb, a);
        return;
    }
    if (!rope_args(cb, qp->rope, &a.rope)) return;
    a.k_new = k->data;
    a.v_new = v->data;
    a.slot = m->slot->data;
    a.q_norm = qp->q_norm ? qp->q_norm->data : NULL;
    a.k_norm = qp->k_norm ? qp->k_norm->data : NULL;
    a.norm_eps = qp->eps;
    attention_run(cb, a);
}

/* bert: the encoder of the BERT-family embedding models (all-MiniLM, bge, e5, gte, ...).
 *
 *   x = LayerNorm(tok_embd[t] + type_embd[0] + pos_embd[p])          (token_embd_norm)
 *   per layer, post-norm:
 *     x = LayerNorm(x + W_o attention(W_q x + b_q, W_k x + b_k, W_v x + b_v) + b_o)
 *                                                                      (attn_output_norm)
 *     x = LayerNorm(x + W_down gelu(W_up x + b_up) + b_down)         (layer_output_norm)
 * Attention is bidirectional (attn_params.non_causal: every row sees its whole sequence,
 * which is all in the step); positions are absolute (learned position_embd rows, no RoPE);
 * GELU is the exact erf form (HF's "gelu"); every token is of type 0 (one sentence, as
 * sentence-transformers and llama.cpp embed). No output norm and no head: the last
 * LayerNorm's rows are the model's output, pooled by the engine (model_step_hidden).
 * Tensor names are llama.cpp's converter's (BertModel); the biases of the attention output
 * and the FFN are optional as there. A file with a fused attn_qkv (old conversions) is
 * refused: its attn_q.weight is missing.
 */
#include "model/model.h"

struct bert_layer {
    struct attn_weights attn;     /* q, k, v (+ biases), o */
    const struct tensor *bo;      /* (n_embd) attn_output.bias or NULL */
    const struct tensor *attn_ln, *attn_ln_b; /* (n_embd) attn_output_norm */
    const struct tensor *up, *up_b;           /* (n_embd, n_ff), (n_ff) or NULL */
    const struct tensor *down, *down_b;       /* (n_ff, n_embd), (n_embd) or NULL */
    const struct tensor *out_ln, *out_ln_b;   /* (n_embd) layer_output_norm */
};

struct bert {
    const struct tensor *pos_embd;        /* (n_embd, n_ctx_train) */
    struct tensor type0;                  /* (n_embd): row 0 of token_types; data NULL: none */
    const struct tensor *embd_ln, *embd_ln_b; /* (n_embd) token_embd_norm */
    struct bert_layer *layer;             /* (n_layer) */
};

static smelt_status load(struct model *m, const struct gguf_file *f, struct err *e) {
    struct loader l = {m, f, e, SMELT_OK};
    const struct model_hparams *hp = &m->hp;
    const int64_t d = hp->n_embd;
    struct bert *B = ld_alloc(&l, sizeof *B);
    if (!B) return l.st;
    B->layer = ld_alloc(&l, (size_t)hp->n_layer * sizeof *B->layer);
    if (!B->layer) return l.st;
    m->arch_layers = B;
    B->pos_embd = ld_matrix(&l, false, d, hp->n_ctx_train, "position_embd.weight");
    m->n_pos = hp->n_ctx_train;
    /* token types: every token is type 0, so only row 0 is read (llama.cpp's
     * tokenizer.ggml.token_type_count only sizes the tensor) */
    const struct gguf_tensor *tt = gguf_find_tensor(f, "token_types.weight");
    if (tt) {
        const struct tensor *types = ld_matrix_f32(&l, false, d, tt->ne[1], "token_types.weight");
        if (!types) return l.st;
        B->type0 = *types;
        B->type0.ne[1] = 1;
        B->type0.nb[2] = B->type0.nb[3] = B->type0.nb[1];
    }
    B->embd_ln = ld_vector(&l, false, d, "token_embd_norm.weight");
    B->embd_ln_b = ld_vector(&l, false, d, "token_embd_norm.bias");
    for (int il = 0; il < hp->n_layer; il++) {
        struct bert_layer *y = &B->layer[il];
        ld_attn_weights(&l, il, &y->attn);
        y->bo = ld_vector(&l, true, d, "blk.%d.attn_output.bias", il);
        y->attn_ln = ld_vector(&l, false, d, "blk.%d.attn_output_norm.weight", il);
        y->attn_ln_b = ld_vector(&l, false, d, "blk.%d.attn_output_norm.bias", il);
        y->up = ld_matrix(&l, false, d, hp->n_ff, "blk.%d.ffn_up.weight", il);
        y->up_b = ld_vector(&l, true, hp->n_ff, "blk.%d.ffn_up.bias", il);
        y->down = ld_matrix(&l, false, hp->n_ff, d, "blk.%d.ffn_down.weight", il);
        y->down_b = ld_vector(&l, true, d, "blk.%d.ffn_down.bias", il);
        y->out_ln = ld_vector(&l, false, d, "blk.%d.layer_output_norm.weight", il);
        y->out_ln_b = ld_vector(&l, false, d, "blk.%d.layer_output_norm.bias", il);
        if (l.st != SMELT_OK) return l.st;
        if (y->attn.q_norm || y->attn.k_norm)
            return err_set(e, SMELT_ERR_UNSUPPORTED, "bert: tensor blk.%d.attn_%c_norm.weight: "
                           "Q/K norms (jina-bert-v2) are not supported", il,
                           y->attn.q_norm ? 'q' : 'k');
    }
    return l.st;
}

static struct tensor *forward(struct model *m, struct step *s) {
    const struct bert *B = m->arch_layers;
    struct backend *bk = s->bk;
    const float eps = m->hp.norm_eps;
    const int64_t n = s->n_tokens, d = m->hp.n_embd;
    struct tensor *x = fwd_embed(m, s); /* (n_embd, n_tokens), the residual stream */
    struct tensor *pe = bk_new(bk, QT_F32, d, n, 1);
    bk_get_rows(bk, pe, B->pos_embd, s->meta.pos); /* (checked: every position < n_pos) */
    bk_add(bk, x, x, pe);
    if (B->type0.data) bk_add(bk, x, x, &B->type0);
    bk_layer_norm(bk, x, x, B->embd_ln, B->embd_ln_b, eps);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct bert_layer *y = &B->layer[il];
        const struct layer_attn *a = &m->layer[il];
        bool last = il == m->hp.n_layer - 1;
        size_t mark = bk_scratch_mark(bk); /* this layer's temporaries end at release */
        struct tensor *q = bk_new(bk, QT_F32, (int64_t)a->n_head * a->head_dim_k, n, 1);
        struct tensor *k = bk_new(bk, QT_F32, (int64_t)a->n_head_kv * a->head_dim_k, n, 1);
        struct tensor *v = bk_new(bk, QT_F32, (int64_t)a->n_head_kv * a->head_dim_v, n, 1);
        struct tensor *qkv[3] = {q, k, v};
        const struct tensor *w[3] = {y->attn.wq, y->attn.wk, y->attn.wv};
        const struct tensor *bias[3] = {y->attn.bq, y->attn.bk, y->attn.bv};
        bk_matmul_group(bk, 3, qkv, w, bias, x, NULL);
        q = bk_reshape(bk, q, a->head_dim_k, a->n_head, n);
        k = bk_reshape(bk, k, a->head_dim_k, a->n_head_kv, n);
        v = bk_reshape(bk, v, a->head_dim_v, a->n_head_kv, n);
        bk_kv_store(bk, &s->kv->k[il], &s->kv->v[il], k, v, &s->meta);
        struct tensor *att = bk_new(bk, QT_F32, a->head_dim_v, a->n_head, n);
        bk_attention(bk, att, q, &s->kv->k[il], &s->kv->v[il], &s->meta, &a->attn);
        att = bk_reshape(bk, att, (int64_t)a->head_dim_v * a->n_head, n, 1);
        if (last) fwd_keep_out_rows(m, s, &x, &att); /* the rest runs on the output rows */
        /* x = LayerNorm(x + W_o att + b_o) */
        bk_matmul_acc(bk, x, y->attn.wo, y->bo, att, NULL);
        bk_layer_norm(bk, x, x, y->attn_ln, y->attn_ln_b, eps);
        /* x = LayerNorm(x + W_down gelu(W_up x + b_up) + b_down) */
        struct tensor *u = bk_new(bk, QT_F32, m->hp.n_ff, x->ne[1], 1); /* (n_ff, rows) */
        bk_matmul_group(bk, 1, &u, &y->up, &y->up_b, x, NULL);
        bk_act(bk, u, u, GLU_GELU_ERF);
        bk_matmul_acc(bk, x, y->down, y->down_b, u, NULL);
        bk_layer_norm(bk, x, x, y->out_ln, y->out_ln_b, eps);
        if (!last) bk_scratch_release(bk, mark);
    }
    return x;
}

const struct arch_def arch_bert = {"bert", load, forward, FFN_DENSE,
                                   BK_FEAT_LAYER_NORM | BK_FEAT_ACT | BK_FEAT_NON_CAUSAL, true, NULL,
                                   false};

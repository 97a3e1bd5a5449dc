/* Gemma 3 (text): sandwich-normed blocks, sliding-window layers interleaved with global
 * ones, two RoPE bases, Q/K norm, GeGLU, scaled and tied embeddings.
 *
 *   x = embed(tokens) * sqrt(n_embd)
 *   per layer:
 *     x += post_attention_norm(attention(attn_norm(x)))
 *     x += post_ffw_norm(down(gelu_tanh(gate h) * up h)),  h = ffn_norm(x)
 *
 * Facts checked against transformers' Gemma3 and llama.cpp's GGUF conventions:
 * - Layer i is local (sliding window) unless (i + 1) % pattern == 0, pattern 6 (so
 *   i % 6 < 5 is local); {arch}.attention.sliding_window_pattern overrides the 6. A key
 *   is hidden when pos_q - pos_k >= {arch}.attention.sliding_window.
 * - Local layers use rope.freq_base_swa (default 10000) with no scaling; global layers
 *   use rope.freq_base with the file's scaling.
 * - Query scale is query_pre_attn_scalar^-0.5. GGUF has no key for it: it equals
 *   head_dim on every size but 27B, where it is n_embd / n_head (as llama.cpp infers);
 *   {arch}.attention.scale wins when present.
 * - The norm weights already include Gemma's "+1" (the converter folded it in).
 */
#include "model/model.h"

#include <math.h>

struct gemma3_layer {
    const struct tensor *attn_norm;      /* (n_embd) */
    struct attn_weights attn;            /* q, k, v, o, q_norm, k_norm (head_dim) */
    const struct tensor *post_attn_norm; /* (n_embd) */
    struct ffn_weights ffn;              /* ffn_norm, gate, up, down */
    const struct tensor *post_ffn_norm;  /* (n_embd) */
};

static smelt_status load(struct model *m, const struct gguf_file *f, struct err *e) {
    struct loader l = {m, f, e, SMELT_OK};
    struct model_hparams *hp = &m->hp;
    uint32_t window = 0, pattern = 6;
    float base_swa = 10000.0f, scale = 0;
    ld_u32(&l, "attention.sliding_window", false, &window);
    ld_u32(&l, "attention.sliding_window_pattern", true, &pattern);
    ld_f32(&l, "rope.freq_base_swa", true, &base_swa);
    ld_f32(&l, "attention.scale", true, &scale);
    if (l.st != SMELT_OK) return l.st;
    if (window == 0 || window > (1u << 30) || pattern == 0 || base_swa <= 0)
        return err_set(e, SMELT_ERR_FORMAT,
                       "gemma3: sliding_window %u, sliding_window_pattern %u or "
                       "rope.freq_base_swa %g out of range", window, pattern, (double)base_swa);
    if (scale <= 0) {
        bool is_27b = hp->n_layer == 62 && hp->n_embd == 5376;
        scale = 1.0f / sqrtf(is_27b ? (float)hp->n_embd / (float)hp->n_head : (float)hp->head_dim_k);
    }
    hp->embd_scale = sqrtf((float)hp->n_embd);

    struct gemma3_layer *L = ld_alloc(&l, (size_t)hp->n_layer * sizeof *L);
    if (!L) return l.st;
    m->arch_layers = L;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_attn *a = &m->layer[il];
        a->rope.mode = ROPE_NEOX;
        a->attn.scale = scale;
        if ((uint32_t)(il + 1) % pattern != 0) { /* local: sliding window, its own RoPE */
            a->attn.window = (int32_t)window;
            a->rope.freq_base = base_swa;
            a->rope.freq_scale = 1.0f;
            a->rope.ext_factor = 0.0f;
            a->rope.attn_factor = 1.0f;
            a->rope.freq_factors = NULL;
        }
        struct gemma3_layer *y = &L[il];
        y->attn_norm = ld_vector(&l, false, hp->n_embd, "blk.%d.attn_norm.weight", il);
        ld_attn_weights(&l, il, &y->attn);
        y->post_attn_norm = ld_vector(&l, false, hp->n_embd, "blk.%d.post_attention_norm.weight", il);
        ld_ffn_weights(&l, il, "ffn_norm", &y->ffn);
        y->post_ffn_norm = ld_vector(&l, false, hp->n_embd, "blk.%d.post_ffw_norm.weight", il);
        if (l.st != SMELT_OK) return l.st;
        if (!y->attn.q_norm || !y->attn.k_norm)
            return err_set(e, SMELT_ERR_NOT_FOUND,
                           "gemma3: tensor blk.%d.attn_%c_norm.weight is missing", il,
                           !y->attn.q_norm ? 'q' : 'k');
    }
    return SMELT_OK;
}

static struct tensor *forward(struct model *m, struct step *s) {
    const struct gemma3_layer *L = m->arch_layers;
    struct backend *bk = s->bk;
    struct tensor *x = fwd_embed(m, s); /* (n_embd, n_tokens), scaled by sqrt(n_embd) */
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct gemma3_layer *y = &L[il];
        bool last = il == m->hp.n_layer - 1;
        size_t mark = bk_scratch_mark(bk);
        /* x += post_attention_norm(W_o attention(attn_norm(x))) */
        struct tensor *att = fwd_attention(m, s, il, &y->attn, x, y->attn_norm);
        if (last) fwd_keep_out_rows(m, s, &x, &att); /* the rest runs on the output rows */
        struct tensor *t = bk_new(bk, QT_F32, m->hp.n_embd, x->ne[1], 1);
        bk_matmul(bk, t, y->attn.wo, att);
        bk_rms_norm(bk, t, t, y->post_attn_norm, m->hp.norm_eps);
        bk_add(bk, x, x, t);
        /* x += post_ffw_norm(W_down (gelu_tanh(W_gate h) * W_up h)),  h = ffn_norm(x) */
        fwd_ffn(m, s, &y->ffn, GLU_GELU_TANH, x, t, false, NULL);
        bk_rms_norm(bk, t, t, y->post_ffn_norm, m->hp.norm_eps);
        bk_add(bk, x, x, t);
        if (!last) bk_scratch_release(bk, mark);
    }
    return x;
}

const struct arch_def arch_gemma3 = {"gemma3", load, forward, FFN_DENSE, 0, false, NULL, false};

/* gpt-oss (OpenAI's gpt-oss-20b and gpt-oss-120b; llama.cpp's "gpt-oss"):
 *
 *   per layer:
 *     x += W_o attention(rms_norm(x) * attn_norm) + b_o
 *     x += MoE(rms_norm(x) * post_attention_norm)
 *
 * Attention: Q/K/V biases (optional, as llama.cpp binds them) and the output bias, NeoX
 * RoPE with YaRN, and a learned per-head sink logit in every softmax; the layers alternate
 * between a sliding window and full attention. MoE: a router with a bias, the k largest
 * logits softmaxed among themselves (MOE_SOFTMAX_TOPK), experts with biases on gate, up
 * and down and gpt-oss's clamped SwiGLU, g sigmoid(1.702 g) (u + 1) with g = min(gate, 7)
 * and u = clamp(up, -7, 7) (GLU_SWIGLU_OAI).
 *
 * Facts checked against transformers' GptOss* modeling code (the fixture's reference) and
 * llama.cpp's GGUF conventions (openai-moe.cpp, the converter):
 * - Layer il uses the window when il % pattern < pattern - 1 (the even layers:
 *   attention.sliding_window_pattern, default 2); a key is hidden when pos_q - pos_k >=
 *   attention.sliding_window (128 in the real models). Those layers use
 *   rope.freq_base_swa when the file has it, else rope.freq_base, with the same scaling.
 * - YaRN's correction range is kept fractional (gpt-oss's HF config says truncate = False,
 *   as OpenAI's reference computes it); llama.cpp rounds it, which moves pairs 8..18 of
 *   gpt-oss-20b's 32 a little.
 * - Query scale 1/sqrt(head_dim). Sinks: blk.N.attn_sinks.weight (n_head), F32.
 * - The FFN's pre-norm is blk.N.post_attention_norm (HF's post_attention_layernorm).
 * - The SwiGLU's alpha and limit have no GGUF key; llama.cpp fixes them at HF's defaults
 *   too (GLU_OAI_ALPHA, GLU_OAI_LIMIT).
 * - output.weight is required (the embeddings are never tied).
 */
#include "model/model.h"

struct gpt_oss_layer {
    const struct tensor *attn_norm;  /* (n_embd) */
    struct attn_weights attn;        /* q, k, v (+ biases), o */
    const struct tensor *attn_out_b; /* (n_embd) */
    const struct tensor *sinks;      /* (n_head) */
    struct ffn_weights ffn;          /* post_attention_norm, router + bias, experts + biases */
};

static smelt_status load(struct model *m, const struct gguf_file *f, struct err *e) {
    struct loader l = {m, f, e, SMELT_OK};
    struct model_hparams *hp = &m->hp;
    uint32_t window = 0, pattern = 2;
    float base_swa = m->layer[0].rope.freq_base;
    ld_u32(&l, "attention.sliding_window", false, &window);
    ld_u32(&l, "attention.sliding_window_pattern", true, &pattern);
    ld_f32(&l, "rope.freq_base_swa", true, &base_swa);
    if (l.st != SMELT_OK) return l.st;
    if (window == 0 || window > (1u << 30) || pattern == 0 || base_swa <= 0)
        return err_set(e, SMELT_ERR_FORMAT,
                       "gpt-oss: sliding_window %u, sliding_window_pattern %u or "
                       "rope.freq_base_swa %g out of range",
                       window, pattern, (double)base_swa);
    if (hp->tied_output)
        return err_set(e, SMELT_ERR_NOT_FOUND, "gpt-oss: tensor output.weight is missing");
    hp->gating = MOE_SOFTMAX_TOPK;

    struct gpt_oss_layer *L = ld_alloc(&l, (size_t)hp->n_layer * sizeof *L);
    if (!L) return l.st;
    m->arch_layers = L;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_attn *a = &m->layer[il];
        a->rope.mode = ROPE_NEOX;
        a->rope.yarn_unrounded = true;
        if ((uint32_t)il % pattern < pattern - 1) {
            a->attn.window = (int32_t)window;
            a->rope.freq_base = base_swa;
        }
        struct gpt_oss_layer *y = &L[il];
        y->attn_norm = ld_vector(&l, false, hp->n_embd, "blk.%d.attn_norm.weight", il);
        ld_attn_weights(&l, il, &y->attn);
        y->attn_out_b = ld_vector(&l, false, hp->n_embd, "blk.%d.attn_output.bias", il);
        y->sinks = ld_vector(&l, false, a->n_head, "blk.%d.attn_sinks.weight", il);
        a->attn.sinks = y->sinks;
        ld_ffn_weights(&l, il, "post_attention_norm", &y->ffn);
        if (l.st != SMELT_OK) return l.st;
        if (!y->ffn.router_b || !y->ffn.gate_b)
            return err_set(e, SMELT_ERR_NOT_FOUND, "gpt-oss: tensor blk.%d.%s.bias is missing", il,
                           !y->ffn.router_b ? "ffn_gate_inp" : "ffn_gate_exps");
    }
    return SMELT_OK;
}

static struct tensor *forward(struct model *m, struct step *s) {
    const struct gpt_oss_layer *L = m->arch_layers;
    struct backend *bk = s->bk;
    struct tensor *x = fwd_embed(m, s); /* (n_embd, n_tokens), the residual stream */
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct gpt_oss_layer *y = &L[il];
        bool last = il == m->hp.n_layer - 1;
        size_t mark = bk_scratch_mark(bk);
        /* x += (W_o attention(rms_norm(x) * attn_norm) + b_o), in transformers' order */
        struct tensor *att = fwd_attention(m, s, il, &y->attn, x, y->attn_norm);
        if (last) fwd_keep_out_rows(m, s, &x, &att); /* the rest runs on the output rows */
        bk_matmul_acc(bk, x, y->attn.wo, y->attn_out_b, att, NULL);
        /* x += MoE(rms_norm(x) * post_attention_norm); the next norm is the hint for a
         * backend that prepares x for it in the same pass (bk_matmul_acc's) */
        const struct prenorm next_pre = {last ? m->output_norm : L[il + 1].attn_norm, m->hp.norm_eps};
        fwd_ffn(m, s, &y->ffn, GLU_SWIGLU_OAI, x, x, true, &next_pre);
        if (!last) bk_scratch_release(bk, mark);
    }
    return x;
}

const struct arch_def arch_gpt_oss = {"gpt-oss", load, forward, FFN_MOE,
                                      BK_FEAT_ATTN_SINKS | BK_FEAT_SWIGLU_OAI | BK_FEAT_MOE_BIAS |
                                          BK_FEAT_YARN_UNROUNDED, false, NULL, false};

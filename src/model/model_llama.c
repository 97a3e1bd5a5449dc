/* The llama family: llama (Llama 2/3.x, Mistral, SmolLM), qwen2, qwen3, qwen3moe.
 *
 * One pre-norm block for all four:
 *   h = rms_norm(x) * attn_norm;  x += attention(h)
 *   h = rms_norm(x) * ffn_norm;   x += FFN(h)
 * They differ only in the attention block's details and the kind of FFN:
 *   llama     RoPE on adjacent pairs (the converter permuted Q/K for it), optional
 *             Llama-3 frequency factors (rope_freqs), no bias;
 *   qwen2     NeoX RoPE, Q/K/V biases;
 *   qwen3     NeoX RoPE, RMSNorm per head on Q and K before RoPE, no bias;
 *   qwen3moe  qwen3's attention; the FFN is a mixture of experts (Qwen3-30B-A3B: 128
 *             experts, 8 per token, no shared expert): softmax over the router logits,
 *             the top k, renormalized to sum 1 (always; the GGUF has no key for it), i.e.
 *             MOE_SOFTMAX_TOPK. transformers' decoder_sparse_step / mlp_only_layers are
 *             not in the GGUF: every layer is MoE, as llama.cpp assumes.
 * The FFN is down(silu(gate h) * up h), dense or per expert (fwd_ffn).
 * Optional tensors are bound when present whatever the variant (llama.cpp does the
 * same), so a llama file with biases or a qwen2 file without them still loads. */
#include "model/model.h"

#include <stdlib.h>

struct llama_layer {
    const struct tensor *attn_norm; /* (n_embd) */
    struct attn_weights attn;       /* q, k, v, o (+ qwen2 biases, qwen3 Q/K norms) */
    struct ffn_weights ffn;         /* ffn_norm; dense gate/up/down or router + experts */
};

enum variant { LLAMA, QWEN2, QWEN3, QWEN3MOE };

static smelt_status load(struct model *m, const struct gguf_file *f, struct err *e,
                         enum variant var) {
    struct loader l = {m, f, e, SMELT_OK};
    const struct model_hparams *hp = &m->hp;
    struct llama_layer *L = ld_alloc(&l, (size_t)hp->n_layer * sizeof *L);
    if (!L) return l.st;
    m->arch_layers = L;
    if (var == QWEN3MOE) m->hp.gating = MOE_SOFTMAX_TOPK; /* softmax, top-k, renormalized */
    for (int il = 0; il < hp->n_layer; il++) {
        m->layer[il].rope.mode = var == LLAMA ? ROPE_NORM : ROPE_NEOX;
        struct llama_layer *y = &L[il];
        y->attn_norm = ld_vector(&l, false, hp->n_embd, "blk.%d.attn_norm.weight", il);
        ld_attn_weights(&l, il, &y->attn);
        ld_ffn_weights(&l, il, "ffn_norm", &y->ffn);
        if (l.st != SMELT_OK) return l.st;
        if (var == QWEN2 && (!y->attn.bq || !y->attn.bk || !y->attn.bv))
            return err_set(e, SMELT_ERR_NOT_FOUND, "qwen2: tensor blk.%d.attn_%c.bias is missing",
                           il, !y->attn.bq ? 'q' : !y->attn.bk ? 'k' : 'v');
        if ((var == QWEN3 || var == QWEN3MOE) && (!y->attn.q_norm || !y->attn.k_norm))
            return err_set(e, SMELT_ERR_NOT_FOUND, "%s: tensor blk.%d.attn_%c_norm.weight is missing",
                           hp->arch, il, !y->attn.q_norm ? 'q' : 'k');
    }
    return SMELT_OK;
}

static struct tensor *forward(struct model *m, struct step *s) {
    const struct llama_layer *L = m->arch_layers;
    struct backend *bk = s->bk;
    struct tensor *x = fwd_embed(m, s); /* (n_embd, n_tokens), the residual stream */
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct llama_layer *y = &L[il];
        bool last = il == m->hp.n_layer - 1;
        size_t mark = bk_scratch_mark(bk); /* this layer's temporaries end at release */
        /* x += W_o attention(rms_norm(x) * attn_norm) */
        struct tensor *att = fwd_attention(m, s, il, &y->attn, x, y->attn_norm);
        if (last) fwd_keep_out_rows(m, s, &x, &att); /* the rest runs on the output rows */
        const float eps = m->hp.norm_eps;
        const struct prenorm ffn_pre = {y->ffn.norm, eps};
        const struct prenorm next_pre = {last ? m->output_norm : L[il + 1].attn_norm, eps};
        bk_matmul_acc(bk, x, y->attn.wo, NULL, att, &ffn_pre);
        /* x += FFN(rms_norm(x) * ffn_norm), SwiGLU, dense or mixture of experts */
        fwd_ffn(m, s, &y->ffn, GLU_SILU, x, x, true, &next_pre);
        if (!last) bk_scratch_release(bk, mark);
    }
    return x;
}

static smelt_status load_llama(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, LLAMA);
}
static smelt_status load_qwen2(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN2);
}
static smelt_status load_qwen3(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN3);
}
static smelt_status load_qwen3moe(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN3MOE);
}

const struct arch_def arch_llama = {"llama", load_llama, forward, FFN_DENSE, 0, false, NULL, false};
const struct arch_def arch_qwen2 = {"qwen2", load_qwen2, forward, FFN_DENSE, 0, false, NULL, false};
const struct arch_def arch_qwen3 = {"qwen3", load_qwen3, forward, FFN_DENSE, 0, false, NULL, false};
const struct arch_def arch_qwen3moe = {"qwen3moe", load_qwen3moe, forward, FFN_MOE,
                                       0, false, NULL, false};

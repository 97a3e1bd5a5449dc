/* Qwen3.5 and Qwen3-Next: a hybrid of Gated DeltaNet (linear attention with a recurrent
 * state) and gated full attention, three to one. Three variants of one block:
 *   qwen35     Qwen3.5 dense: the FFN is a dense SwiGLU;
 *   qwen35moe  Qwen3.5 / Qwen3.6 MoE (35B-A3B, 122B-A10B, 397B-A17B): the FFN is a mixture
 *              of experts (softmax, top-k, renormalized: MOE_SOFTMAX_TOPK) plus a shared
 *              expert scaled by sigmoid(ffn_gate_inp_shexp . h) (fwd_ffn);
 *   qwen3next  Qwen3-Next (80B-A3B): qwen35moe's FFN; its DeltaNet projections are packed
 *              and its value heads grouped (below); plain NeoX RoPE (no sections).
 *
 *   per layer, pre-norm:
 *     h = rms_norm(x) * attn_norm
 *     x += recurrent ? ssm_out(gated_deltanet(h)) : W_o(attention(h) * sigmoid(gate))
 *     h = rms_norm(x) * post_attention_norm
 *     x += FFN(h)   (qwen35: down(silu(gate h) * up h); MoE variants: experts + shared)
 *   gated_deltanet(h):
 *     qkv = conv1d_silu(W_qkv h)  (causal, kernel d_conv, with its state)
 *     q, k = l2norm(...), v;  g = ssm_a * softplus(W_a h + dt_bias);  beta = sigmoid(W_b h)
 *     o = delta rule (bk_gated_delta_net, state per head: head_v x head_k F32)
 *     return rms_norm(o) * ssm_norm * silu(W_z h)   (per value head)
 *   attention(h): W_q gives [q | gate] per head; q and k RMS-normed per head, NeoX RoPE on
 *     the first rope.dimension_count dims (partial rotary, 1/4 of head_dim), paged KV.
 *
 * Facts, checked against transformers' qwen3_5 modeling and llama.cpp's qwen35.cpp and
 * converter (conversion/qwen.py):
 * - Layer i is recurrent unless (i + 1) % full_attention_interval == 0 (default 4);
 *   {arch}.attention.recurrent_layers (one flag per layer) overrides the interval.
 * - {arch}.block_count counts the MTP layers ({arch}.nextn_predict_layers, stored as
 *   blk.{n_layer}...): the trunk's forward never runs them; the first one is the model's
 *   multi-token-prediction head (model_mtp_new, --spec mtp), checked against vLLM's
 *   qwen3_next_mtp.py: x = eh_proj [rms_norm(embed(t)) * enorm ; rms_norm(h) * hnorm], h
 *   the trunk's final hidden state (after output_norm) one position earlier, then one
 *   full-attention block with its own K/V, then the shared (or its own) norm and head.
 * - Hyper-parameters: ssm.conv_kernel (d_conv), ssm.state_size (head_k),
 *   ssm.group_count (key heads), ssm.time_step_rank (value heads), ssm.inner_size
 *   (value heads * head_v).
 * - The converter stores ssm_a = -exp(A_log), names dt_bias ssm_dt.bias, squeezes the
 *   conv kernel to (d_conv, channels), adds 1 to every RMSNorm weight except ssm_norm
 *   (Qwen3.5's norms compute x * (1 + w); the gated norm computes x * w), and reorders
 *   value heads from HF's grouped order to tiled: value head h reads key head
 *   h % n_k_head (bk_gated_delta_net).
 * - The multimodal RoPE sections ({arch}.rope.dimension_sections) split the rotated
 *   pairs between the text, height and width positions; for text all three are the
 *   token's position, so the rotation is NeoX RoPE over the rotated dims.
 * - transformers' l2norm is x * rsqrt(sum x^2 + 1e-6), with that epsilon fixed.
 * - qwen35moe / qwen3next (transformers' Qwen3_5MoeSparseMoeBlock = Qwen3NextSparseMoeBlock,
 *   llama.cpp's qwen35moe.cpp / qwen3next.cpp): every layer's FFN (the MTP layer's too) is
 *   MoE with a shared expert ffn_{gate,up,down}_shexp of expert_shared_feed_forward_length
 *   and its gate ffn_gate_inp_shexp (n_embd): both required. The routing is renormalized
 *   always (Qwen3-Next's config has norm_topk_prob, true in the released model; the GGUF
 *   has no key and llama.cpp normalizes). transformers' mlp_only_layers /
 *   decoder_sparse_step (dense layers in Qwen3-Next) are not in the GGUF: llama.cpp
 *   requires the router in every layer, and so does smelt. Qwen3.5's MoE files have no
 *   feed_forward_length (n_ff 0).
 * - qwen3next's DeltaNet: the converter keeps HF's grouped value-head order (value head h
 *   reads key head h / (n_v / n_k); gdn_params.grouped), splits in_proj_qkvz into
 *   attn_qkv = [q heads | k heads | v heads] and attn_gate (z), or, in files from before
 *   that split, keeps it as ssm_in: per key head [q | k | v (n_v/n_k heads) | z (as v)];
 *   in_proj_ba is ssm_ba: per key head [b (n_v/n_k) | a (n_v/n_k)]. Both are
 *   deinterleaved here with strided copies. Its norms are qwen35's (x (1 + w), stored
 *   w + 1; the gated norm x w). */
#include "model/model.h"

#include <string.h>

struct q35_layer {
    bool recurrent;
    const struct tensor *attn_norm;      /* (n_embd) */
    /* full attention */
    const struct tensor *wq;  /* (n_embd, n_head * 2 * head_dim): per head [q | gate] */
    struct attn_weights attn; /* wk, wv, wo, q_norm, k_norm (wq unused) */
    /* gated deltanet */
    const struct tensor *wqkv;     /* (n_embd, 2 * n_k_head * head_k + n_v_head * head_v) */
    const struct tensor *wz;       /* attn_gate (n_embd, n_v_head * head_v) */
    const struct tensor *win;      /* qwen3next ssm_in (n_embd, conv channels + n_v_head *
                                    * head_v): packed per key head; NULL: wqkv and wz */
    const struct tensor *wb;       /* ssm_beta (n_embd, n_v_head) */
    const struct tensor *wa;       /* ssm_alpha (n_embd, n_v_head) */
    const struct tensor *wba;      /* qwen3next ssm_ba (n_embd, 2 * n_v_head): packed per
                                    * key head; NULL: wb and wa */
    const struct tensor *conv;     /* ssm_conv1d F32 (d_conv, conv channels) */
    const struct tensor *dt_bias;  /* ssm_dt.bias (n_v_head) */
    const struct tensor *ssm_a;    /* (n_v_head): -exp(A_log) */
    const struct tensor *ssm_norm; /* (head_v) */
    const struct tensor *ssm_out;  /* (n_v_head * head_v, n_embd) */
    struct ffn_weights ffn; /* its norm is post_attention_norm; dense, or experts + shared */
};

/* The multi-token-prediction head (model_mtp_new). */
struct q35_mtp {
    struct q35_layer block;             /* a full-attention layer */
    const struct tensor *eh_proj;       /* (2 * n_embd, n_embd) */
    const struct tensor *enorm, *hnorm; /* (n_embd) */
    const struct tensor *head_norm;     /* (n_embd) or NULL: output_norm */
    const struct tensor *head;          /* (n_embd, n_vocab) or NULL: output */
    const struct tensor *embed;         /* (n_embd, n_vocab) or NULL: token_embd */
};

struct q35 {
    struct gdn_params gdn;
    int32_t d_conv, conv_ch;
    int32_t sections[4];
    int32_t n_mtp;
    struct q35_layer *L; /* (n_layer) */
    struct q35_mtp mtp;  /* when n_mtp > 0 */
};

static const char *tname(char *buf, size_t n, int il, const char *suffix) {
    snprintf(buf, n, "blk.%d.%s", il, suffix);
    return buf;
}

static bool is_int(uint32_t t) {
    return t <= GGUF_T_INT32 || t == GGUF_T_UINT64 || t == GGUF_T_INT64;
}

/* The layer pattern: one flag per layer (trunk and MTP) from attention.recurrent_layers,
 * else from full_attention_interval. */
static void load_pattern(struct loader *l, int n_all, int n_layer, struct q35_layer *L) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", l->m->hp.arch);
    if (gguf_get(l->f, key)) {
        const struct gguf_value *arr;
        if ((l->st = gguf_get_arr(l->f, key, GGUF_T_COUNT, &arr, l->e)) != SMELT_OK) return;
        uint32_t et = arr->v.arr.type;
        if (!is_int(et) && et != GGUF_T_BOOL) {
            l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s: an array of %s, not of flags", key,
                            gguf_vtype_name((enum gguf_vtype)et));
            return;
        }
        if (arr->v.arr.n != (uint64_t)n_all) {
            l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s has %llu entries, the model %d layers", key,
                            (unsigned long long)arr->v.arr.n, n_all);
            return;
        }
        for (int il = 0; il < n_layer; il++)
            L[il].recurrent = gguf_arr_i64(arr, (uint64_t)il) != 0;
        return;
    }
    uint32_t interval = 4;
    ld_u32(l, "full_attention_interval", true, &interval);
    if (l->st == SMELT_OK && (interval == 0 || interval > (uint32_t)n_all)) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.full_attention_interval: %u is out of range "
                        "(1..%d)",
                        l->m->hp.arch, interval, n_all);
        return;
    }
    for (int il = 0; il < n_layer; il++)
        L[il].recurrent = (uint32_t)(il + 1) % interval != 0;
}

/* Binds a full-attention layer's weights (trunk layer or the MTP block). */
static void load_attn(struct loader *l, int il, struct q35_layer *y) {
    const struct model *m = l->m;
    const struct layer_attn *a = &m->layer[0];
    int64_t e = m->hp.n_embd, hd = a->head_dim_k;
    y->wq = ld_matrix(l, false, e, 2 * hd * a->n_head, "blk.%d.attn_q.weight", il);
    y->attn.wk = ld_matrix(l, false, e, hd * a->n_head_kv, "blk.%d.attn_k.weight", il);
    y->attn.wv =
        ld_matrix(l, false, e, (int64_t)a->head_dim_v * a->n_head_kv, "blk.%d.attn_v.weight", il);
    y->attn.wo =
        ld_matrix(l, false, (int64_t)a->head_dim_v * a->n_head, e, "blk.%d.attn_output.weight", il);
    y->attn.q_norm = ld_vector(l, false, hd, "blk.%d.attn_q_norm.weight", il);
    y->attn.k_norm = ld_vector(l, false, hd, "blk.%d.attn_k_norm.weight", il);
}

enum variant { QWEN35, QWEN35MOE, QWEN3NEXT };

static void load_common_block(struct loader *l, int il, struct q35_layer *y) {
    y->attn_norm = ld_vector(l, false, l->m->hp.n_embd, "blk.%d.attn_norm.weight", il);
    ld_ffn_weights(l, il, "post_attention_norm", &y->ffn);
    /* the MoE variants' shared expert is part of the block, not an option */
    if (l->st == SMELT_OK && y->ffn.router && (!y->ffn.sh_up || !y->ffn.sh_gate_inp))
        l->st = err_set(l->e, SMELT_ERR_NOT_FOUND, "%s: tensor blk.%d.%s.weight is missing",
                        l->m->hp.arch, il, y->ffn.sh_up ? "ffn_gate_inp_shexp" : "ffn_up_shexp");
}

static smelt_status load(struct model *m, const struct gguf_file *f, struct err *e,
                         enum variant var) {
    struct loader l = {m, f, e, SMELT_OK};
    struct model_hparams *hp = &m->hp;
    if (!bk_has_recurrent(m->bk))
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s: the %s backend has no kernels for recurrent (Gated DeltaNet) layers "
                       "yet; run this model with --backend cpu",
                       hp->arch, m->bk->ops->name);
    struct q35 *Q = ld_alloc(&l, sizeof *Q);
    if (!Q) return l.st;
    m->arch_layers = Q;
    int32_t n_all = hp->n_layer, d_inner = 0, hk = 0, nv = 0, nk = 0;
    uint32_t n_mtp = 0;
    ld_u32(&l, "nextn_predict_layers", true, &n_mtp);
    ld_dim(&l, "ssm.conv_kernel", false, &Q->d_conv, 64);
    ld_dim(&l, "ssm.inner_size", false, &d_inner, 1u << 20);
    ld_dim(&l, "ssm.state_size", false, &hk, 4096);
    ld_dim(&l, "ssm.time_step_rank", false, &nv, 4096);
    ld_dim(&l, "ssm.group_count", false, &nk, 4096);
    if (l.st != SMELT_OK) return l.st;
    if (n_mtp >= (uint32_t)n_all)
        return err_set(e, SMELT_ERR_FORMAT,
                       "%s.nextn_predict_layers (%u) leaves no layer of %s.block_count (%d)",
                       hp->arch, n_mtp, hp->arch, n_all);
    if (Q->d_conv < 2 || nv % nk || d_inner % nv)
        return err_set(e, SMELT_ERR_FORMAT,
                       "%s.ssm: conv_kernel %d must be >= 2, group_count %d must divide "
                       "time_step_rank %d, which must divide inner_size %d",
                       hp->arch, Q->d_conv, nk, nv, d_inner);
    Q->n_mtp = (int32_t)n_mtp;
    hp->n_layer = n_all - Q->n_mtp; /* the trunk; the MTP layers follow it */
    Q->gdn = (struct gdn_params){nk, hk, nv, d_inner / nv, 1e-6f, var == QWEN3NEXT};
    if (var != QWEN35) hp->gating = MOE_SOFTMAX_TOPK; /* softmax, top-k, renormalized */
    Q->conv_ch = 2 * nk * hk + d_inner;
    if (hp->head_dim_k != hp->head_dim_v)
        return err_set(e, SMELT_ERR_FORMAT, "%s: key_length %d differs from value_length %d",
                       hp->arch, hp->head_dim_k, hp->head_dim_v);

    /* RoPE sections: validated, then unused (text positions are equal in every section) */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", hp->arch);
    if (gguf_get(f, key)) {
        const struct gguf_value *arr;
        if ((l.st = gguf_get_arr(f, key, GGUF_T_COUNT, &arr, e)) != SMELT_OK) return l.st;
        int64_t sum = 0;
        for (uint64_t i = 0; i < arr->v.arr.n && i < 4; i++) {
            int64_t v = is_int(arr->v.arr.type) ? gguf_arr_i64(arr, i) : -1;
            if (v < 0 || v > 4096)
                return err_set(e, SMELT_ERR_FORMAT, "%s: entry %llu is not a count", key,
                               (unsigned long long)i);
            Q->sections[i] = (int32_t)v;
            sum += v;
        }
        if (arr->v.arr.n > 4 || 2 * sum > m->layer[0].rope.n_rot)
            return err_set(e, SMELT_ERR_FORMAT,
                           "%s: %llu sections of %lld pairs, but "
                           "rope.dimension_count is %d",
                           key, (unsigned long long)arr->v.arr.n, (long long)sum,
                           m->layer[0].rope.n_rot);
    }

    Q->L = ld_alloc(&l, (size_t)hp->n_layer * sizeof *Q->L);
    if (!Q->L) return l.st;
    load_pattern(&l, n_all, hp->n_layer, Q->L);
    if (l.st != SMELT_OK) return l.st;
    const int64_t E = hp->n_embd, vdim = (int64_t)nv * Q->gdn.head_v;
    char nb[128];
    for (int il = 0; il < hp->n_layer; il++) {
        struct q35_layer *y = &Q->L[il];
        m->layer[il].rope.mode = ROPE_NEOX;
        load_common_block(&l, il, y);
        /* the other kind's tensors must be absent: a pattern that disagrees with the file */
        const char *stray = y->recurrent ? "attn_k.weight" : "ssm_a";
        if (l.st == SMELT_OK && gguf_find_tensor(f, tname(nb, sizeof nb, il, stray)))
            return err_set(e, SMELT_ERR_FORMAT,
                           "%s: layer %d is %s by the layer pattern, but tensor %s is present",
                           hp->arch, il, y->recurrent ? "recurrent" : "full attention", nb);
        if (!y->recurrent) {
            load_attn(&l, il, y);
            continue;
        }
        m->mem[il] = (struct layer_mem){MEM_STATE, (int64_t)(Q->d_conv - 1) * Q->conv_ch,
                                        (int64_t)nv * Q->gdn.head_v * hk};
        if (var == QWEN3NEXT && gguf_find_tensor(f, tname(nb, sizeof nb, il, "ssm_in.weight"))) {
            y->win = ld_matrix(&l, false, E, Q->conv_ch + vdim, "blk.%d.ssm_in.weight", il);
        } else {
            y->wqkv = ld_matrix(&l, false, E, Q->conv_ch, "blk.%d.attn_qkv.weight", il);
            y->wz = ld_matrix(&l, false, E, vdim, "blk.%d.attn_gate.weight", il);
        }
        if (var == QWEN3NEXT) {
            y->wba = ld_matrix(&l, false, E, 2 * (int64_t)nv, "blk.%d.ssm_ba.weight", il);
        } else {
            y->wb = ld_matrix(&l, false, E, nv, "blk.%d.ssm_beta.weight", il);
            y->wa = ld_matrix(&l, false, E, nv, "blk.%d.ssm_alpha.weight", il);
        }
        y->conv = ld_matrix_f32(&l, false, Q->d_conv, Q->conv_ch, "blk.%d.ssm_conv1d.weight", il);
        y->dt_bias = ld_vector(&l, false, nv, "blk.%d.ssm_dt.bias", il);
        y->ssm_a = ld_vector(&l, false, nv, "blk.%d.ssm_a", il);
        y->ssm_norm = ld_vector(&l, false, Q->gdn.head_v, "blk.%d.ssm_norm.weight", il);
        y->ssm_out = ld_matrix(&l, false, vdim, E, "blk.%d.ssm_out.weight", il);
    }
    if (l.st != SMELT_OK) return l.st;
    if (Q->n_mtp > 0) { /* the first MTP layer (the only one llama.cpp runs either) */
        int il = hp->n_layer;
        struct q35_mtp *t = &Q->mtp;
        m->layer[il].rope.mode = ROPE_NEOX;
        load_common_block(&l, il, &t->block);
        load_attn(&l, il, &t->block);
        t->eh_proj = ld_matrix(&l, false, 2 * E, E, "blk.%d.nextn.eh_proj.weight", il);
        t->enorm = ld_vector(&l, false, E, "blk.%d.nextn.enorm.weight", il);
        t->hnorm = ld_vector(&l, false, E, "blk.%d.nextn.hnorm.weight", il);
        t->head_norm = ld_vector(&l, true, E, "blk.%d.nextn.shared_head_norm.weight", il);
        t->head = ld_matrix(&l, true, E, hp->n_vocab, "blk.%d.nextn.shared_head_head.weight", il);
        t->embed = ld_matrix(&l, true, E, hp->n_vocab, "blk.%d.nextn.embed_tokens.weight", il);
    }
    return l.st;
}

/* dst's view (w, nh, rows) at element offset doff (runs of w floats, one per head, rows
 * dst->nb[1] apart) = runs of w floats at element offset off of src's rows, step floats
 * apart: gathers one part per head out of a projection that packs several per head. */
static void gather_heads(struct backend *bk, struct tensor *dst, int64_t doff,
                         const struct tensor *src, int64_t off, int64_t w, int64_t nh,
                         int64_t step) {
    const size_t f = sizeof(float);
    const int64_t n = src->ne[1];
    bk_copy(bk, bk_view_3d(bk, dst, w, nh, n, (size_t)w * f, dst->nb[1], (size_t)doff * f),
            bk_view_3d(bk, src, w, nh, n, (size_t)step * f, src->nb[1], (size_t)off * f));
}

/* The gated deltanet of layer il on rms_norm(x) * norm: returns the input of ssm_out,
 * (n_v_head * head_v, n_tokens). */
static struct tensor *deltanet(struct model *m, struct step *s, int il, const struct q35 *Q,
                               const struct q35_layer *y, const struct tensor *x) {
    struct backend *bk = s->bk;
    const struct gdn_params *p = &Q->gdn;
    const int64_t n = s->n_tokens, nk = p->n_k_head, hk = p->head_k, nv = p->n_v_head,
                  vdim = nv * p->head_v, r = nv / nk;
    struct tensor *qkv = bk_new(bk, QT_F32, Q->conv_ch, n, 1);
    struct tensor *z = bk_new(bk, QT_F32, vdim, n, 1);
    struct tensor *bl = bk_new(bk, QT_F32, nv, n, 1);
    struct tensor *a = bk_new(bk, QT_F32, nv, n, 1);
    /* the projections: qkv, z, b, a, or qwen3next's packed ones, then unpacked */
    struct tensor *qkvz = y->win ? bk_new(bk, QT_F32, Q->conv_ch + vdim, n, 1) : NULL;
    struct tensor *ba = y->wba ? bk_new(bk, QT_F32, 2 * nv, n, 1) : NULL;
    struct tensor *outs[4];
    const struct tensor *ws[4];
    int no = 0;
    if (qkvz) outs[no] = qkvz, ws[no++] = y->win;
    else outs[no] = qkv, ws[no++] = y->wqkv, outs[no] = z, ws[no++] = y->wz;
    if (ba) outs[no] = ba, ws[no++] = y->wba;
    else outs[no] = bl, ws[no++] = y->wb, outs[no] = a, ws[no++] = y->wa;
    const struct prenorm pre = {y->attn_norm, m->hp.norm_eps};
    bk_matmul_group(bk, no, outs, ws, NULL, x, &pre);
    if (qkvz) { /* per key head [q | k | v (r heads) | z (r heads)] */
        const int64_t P = 2 * hk + 2 * r * p->head_v;
        gather_heads(bk, qkv, 0, qkvz, 0, hk, nk, P);
        gather_heads(bk, qkv, nk * hk, qkvz, hk, hk, nk, P);
        gather_heads(bk, qkv, 2 * nk * hk, qkvz, 2 * hk, r * p->head_v, nk, P);
        gather_heads(bk, z, 0, qkvz, 2 * hk + r * p->head_v, r * p->head_v, nk, P);
    }
    if (ba) { /* per key head [b (r heads) | a (r heads)] */
        gather_heads(bk, bl, 0, ba, 0, r, nk, 2 * r);
        gather_heads(bk, a, 0, ba, r, r, nk, 2 * r);
    }
    /* conv, delta rule, then rms_norm(o) * ssm_norm per value head times silu(z): one op */
    const struct deltanet_w dw = {y->conv, y->ssm_a, y->dt_bias, y->ssm_norm, m->hp.norm_eps};
    bk_deltanet(bk, z, qkv, a, bl, &dw, &s->kv->conv[il], &s->kv->ssm[il], s->state_seqs, p,
                s->meta.one_per_seq);
    return z;
}

/* The gated attention of layer il on rms_norm(x) * norm: returns the input of W_o,
 * (n_head * head_dim, n_tokens). */
static struct tensor *attention(struct model *m, struct step *s, int il, const struct q35_layer *y,
                                const struct tensor *x) {
    struct backend *bk = s->bk;
    const struct layer_attn *a = &m->layer[il];
    int64_t n = s->n_tokens, hd = a->head_dim_k, nh = a->n_head, nkv = a->n_head_kv;
    struct tensor *qg = bk_new(bk, QT_F32, 2 * hd * nh, n, 1);
    struct tensor *k = bk_new(bk, QT_F32, hd * nkv, n, 1);
    struct tensor *v = bk_new(bk, QT_F32, (int64_t)a->head_dim_v * nkv, n, 1);
    struct tensor *outs[3] = {qg, k, v};
    const struct tensor *ws[3] = {y->wq, y->attn.wk, y->attn.wv};
    const struct prenorm pre = {y->attn_norm, m->hp.norm_eps};
    bk_matmul_group(bk, 3, outs, ws, NULL, x, &pre);
    /* deinterleave [q | gate] per head */
    struct tensor *q = bk_new(bk, QT_F32, hd * nh, n, 1);
    struct tensor *gate = bk_new(bk, QT_F32, hd * nh, n, 1);
    gather_heads(bk, q, 0, qg, 0, hd, nh, 2 * hd);
    gather_heads(bk, gate, 0, qg, hd, hd, nh, 2 * hd);
    q = bk_reshape(bk, q, hd, nh, n);
    k = bk_reshape(bk, k, hd, nkv, n);
    v = bk_reshape(bk, v, a->head_dim_v, nkv, n);
    struct qk_prep prep = {y->attn.q_norm, y->attn.k_norm, m->hp.norm_eps, &a->rope};
    struct tensor *att = bk_new(bk, QT_F32, a->head_dim_v, nh, n);
    bk_rope_attention(bk, att, q, k, v, &s->kv->k[il], &s->kv->v[il], &s->meta, &prep, &a->attn);
    att = bk_reshape(bk, att, (int64_t)a->head_dim_v * nh, n, 1);
    bk_glu(bk, att, gate, att, GLU_SIGMOID); /* att * sigmoid(gate) */
    return att;
}

static struct tensor *forward(struct model *m, struct step *s) {
    const struct q35 *Q = m->arch_layers;
    struct backend *bk = s->bk;
    struct tensor *x = fwd_embed(m, s); /* (n_embd, n_tokens), the residual stream */
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct q35_layer *y = &Q->L[il];
        bool last = il == m->hp.n_layer - 1;
        size_t mark = bk_scratch_mark(bk);
        struct tensor *t = y->recurrent ? deltanet(m, s, il, Q, y, x) : attention(m, s, il, y, x);
        if (last) fwd_keep_out_rows(m, s, &x, &t); /* every row's state and K/V are stored */
        const float eps = m->hp.norm_eps;
        const struct prenorm ffn_pre = {y->ffn.norm, eps};
        const struct prenorm next_pre = {last ? m->output_norm : Q->L[il + 1].attn_norm, eps};
        bk_matmul_acc(bk, x, y->recurrent ? y->ssm_out : y->attn.wo, NULL, t, &ffn_pre);
        /* x += FFN(rms_norm(x) * post_attention_norm), SwiGLU */
        fwd_ffn(m, s, &y->ffn, GLU_SILU, x, x, true, &next_pre);
        if (!last) bk_scratch_release(bk, mark);
    }
    return x;
}

/* The MTP head's forward (hidden_in: the trunk's final hidden states, one row earlier). */
static struct tensor *mtp_forward(struct model *m, struct step *s) {
    const struct q35_mtp *t = m->arch_layers;
    const struct q35_layer *y = &t->block;
    struct backend *bk = s->bk;
    const int64_t E = m->hp.n_embd, n = s->n_tokens;
    const float eps = m->hp.norm_eps;
    /* x = eh_proj [rms_norm(embed(t)) * enorm ; rms_norm(h) * hnorm], (2 n_embd, n) in */
    struct tensor *emb = fwd_embed(m, s);
    bk_rms_norm(bk, emb, emb, t->enorm, eps);
    struct tensor *hn = bk_new(bk, QT_F32, E, n, 1);
    bk_rms_norm(bk, hn, s->hidden, t->hnorm, eps);
    struct tensor *cat = bk_new(bk, QT_F32, 2 * E, n, 1);
    bk_copy(bk, bk_view_2d(bk, cat, E, n, cat->nb[1], 0), emb);
    bk_copy(bk, bk_view_2d(bk, cat, E, n, cat->nb[1], (size_t)E * sizeof(float)), hn);
    struct tensor *x = bk_new(bk, QT_F32, E, n, 1);
    bk_matmul_group(bk, 1, &x, &t->eh_proj, NULL, cat, NULL);
    /* one full-attention block (its K/V: layer 0 of the head's store) */
    struct tensor *a = attention(m, s, 0, y, x);
    fwd_keep_out_rows(m, s, &x, &a);
    const struct prenorm ffn_pre = {y->ffn.norm, eps}, next_pre = {m->output_norm, eps};
    bk_matmul_acc(bk, x, y->attn.wo, NULL, a, &ffn_pre);
    fwd_ffn(m, s, &y->ffn, GLU_SILU, x, x, true, &next_pre);
    return x;
}

static const struct arch_def arch_mtp = {"qwen35-mtp", NULL, mtp_forward, FFN_MOE,
                                         0, false, NULL, true};

static smelt_status mtp_new(const struct model *m, struct model *h, struct err *e) {
    const struct q35 *Q = m->arch_layers;
    if (Q->n_mtp == 0)
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s: this file has no multi-token-prediction layer (%s.nextn_predict_layers "
                       "is 0 or absent: a converter or quantizer may have dropped it)",
                       m->hp.arch, m->hp.arch);
    struct loader l = {h, NULL, e, SMELT_OK};
    h->arch = &arch_mtp;
    h->hp.n_layer = 1;
    h->layer = ld_alloc(&l, sizeof *h->layer);
    h->mem = ld_alloc(&l, sizeof *h->mem);
    if (l.st != SMELT_OK) return l.st;
    h->layer[0] = m->layer[m->hp.n_layer];
    h->mem[0] = (struct layer_mem){MEM_KV, 0, 0};
    h->arch_layers = (void *)&Q->mtp;
    h->tok_embd = Q->mtp.embed ? Q->mtp.embed : m->tok_embd;
    h->output_norm = Q->mtp.head_norm ? Q->mtp.head_norm : m->output_norm;
    h->output = Q->mtp.head ? Q->mtp.head : m->output;
    h->rope_freqs = m->rope_freqs;
    return SMELT_OK;
}

static smelt_status load_qwen35(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN35);
}
static smelt_status load_qwen35moe(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN35MOE);
}
static smelt_status load_qwen3next(struct model *m, const struct gguf_file *f, struct err *e) {
    return load(m, f, e, QWEN3NEXT);
}

const struct arch_def arch_qwen35 = {"qwen35", load_qwen35, forward, FFN_DENSE,
                                     0, false, mtp_new, false};
const struct arch_def arch_qwen35moe = {"qwen35moe", load_qwen35moe, forward, FFN_MOE,
                                        BK_FEAT_GLU_ROW_GATE, false, mtp_new, false};
const struct arch_def arch_qwen3next = {"qwen3next", load_qwen3next, forward, FFN_MOE,
                                        BK_FEAT_GLU_ROW_GATE, false, mtp_new, false};

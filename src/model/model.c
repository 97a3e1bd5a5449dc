/* What every architecture shares: loading hyper-parameters and binding weights with
 * shape checks (errors name the key or tensor and both shapes), the KV store, and the
 * step: validating a batch, uploading its inputs, embedding, the attention and FFN
 * blocks (a dense FFN or a mixture of experts, one helper for both), and the logits of the
 * rows that asked for them.
 *
 * The step's data flow (per architecture file for the blocks in between):
 *   token ids --get_rows--> x (n_embd, n_tokens) --blocks--> x --get_rows(out rows)-->
 *   (n_embd, n_out) --rms_norm--> --matmul(output)--> logits (n_vocab, n_out)
 * Only the rows that want logits reach the vocabulary projection: a prefill chunk of
 * 512 tokens pays for one row of it, not 512. */
#include "model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/ckd.h"
#include "util/half.h"
#include "util/mix.h"

static const struct arch_def *const archs[] = {
    &arch_llama,  &arch_qwen2,  &arch_qwen3,     &arch_qwen3moe,  &arch_gemma3,
    &arch_qwen35, &arch_qwen35moe, &arch_qwen3next, &arch_gpt_oss, &arch_bert};

/* ---- loader ---- */

void *ld_alloc(struct loader *l, size_t nbytes) {
    if (l->st != SMELT_OK) return NULL;
    struct model *m = l->m;
    if (!array_grow((void **)&m->owned, &m->cap_owned, (size_t)m->n_owned + 1,
                    sizeof *m->owned)) {
        l->st = err_set(l->e, SMELT_ERR_NOMEM, "out of memory loading the model");
        return NULL;
    }
    void *p = calloc(1, nbytes ? nbytes : 1);
    if (!p) {
        l->st = err_set(l->e, SMELT_ERR_NOMEM, "out of memory loading the model (%zu bytes)",
                        nbytes);
        return NULL;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

/* Host dequantize of a whole tensor to F32 (small tensors only: norms, biases). */
static bool to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
    if (type == QT_F16 || type == QT_BF16) {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = type == QT_F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
        return true;
    }
    const struct qtype_info *qi = qtype_get(type);
    if (!qi || !qi->dequantize) return false;
    qi->dequantize(src, dst, n);
    return true;
}

static const char *shape_str(const int64_t *ne, int nd, char *buf, size_t n) {
    struct tensor t = {.ne = {1, 1, 1, 1}};
    for (int i = 0; i < nd; i++) t.ne[i] = ne[i];
    return tensor_shape_str(&t, buf, n);
}

/* Binds tensor name, which must have the shape (ne0, ne1, ne2), as (ne0, use1, ne2): its
 * first use1 <= ne1 rows (rows are contiguous in the file, whatever the type; only for
 * ne2 = 1), or all of them. */
static const struct tensor *bind(struct loader *l, bool optional, bool want_f32, int64_t ne0,
                                 int64_t ne1, int64_t ne2, int64_t use1, const char *name) {
    if (l->st != SMELT_OK) return NULL;
    struct model *m = l->m;
    const struct gguf_tensor *gt = gguf_find_tensor(l->f, name);
    if (!gt) {
        if (!optional)
            l->st = err_set(l->e, SMELT_ERR_NOT_FOUND, "tensor %s is missing", name);
        return NULL;
    }
    int64_t want[4] = {ne0, ne1, ne2, 1};
    if (memcmp(gt->ne, want, sizeof want) != 0) {
        char a[96], b[96];
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "tensor %s: shape %s, but the hyper-parameters say %s", name,
                        shape_str(gt->ne, GGUF_MAX_DIMS, a, sizeof a),
                        shape_str(want, 3, b, sizeof b));
        return NULL;
    }
    if (m->n_tensors == m->cap_tensors) {
        l->st = err_set(l->e, SMELT_ERR_INTERNAL, "tensor %s: bound twice?", name);
        return NULL;
    }
    struct tensor *t = &m->tensors[m->n_tensors];
    if (use1 < 1 || use1 > ne1 || (ne2 > 1 && use1 != ne1) ||
        !tensor_init(t, gt->type, ne0, ne1, ne2, 1) || tensor_nbytes(t) != gt->nbytes ||
        !tensor_init(t, gt->type, ne0, use1, ne2, 1)) {
        l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED, "tensor %s: type %s with row length %lld",
                        name, qtype_name(gt->type), (long long)ne0);
        return NULL;
    }
    char *nm = ld_alloc(l, strlen(name) + 1);
    if (!nm) return NULL;
    strcpy(nm, name);
    t->name = nm;
    t->data = (void *)gt->data;
    if (want_f32 && gt->type != QT_F32) {
        float *buf = ld_alloc(l, (size_t)(ne0 * use1 * ne2) * sizeof(float));
        if (!buf) return NULL;
        if (!to_f32(gt->type, gt->data, buf, ne0 * use1 * ne2)) {
            l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED, "tensor %s: type %s cannot be read",
                            name, qtype_name(gt->type));
            return NULL;
        }
        tensor_init(t, QT_F32, ne0, use1, ne2, 1);
        t->name = nm;
        t->data = buf;
    }
    struct backend *to = m->host_bk && model_expert_on_host(name, m->n_cpu_moe) ? m->host_bk : m->bk;
    l->st = bk_weight_bind(to, t, l->e);
    if (l->st != SMELT_OK) return NULL;
    m->n_tensors++;
    return t;
}

/* bind() with a printf-formatted name. */
__attribute__((format(printf, 7, 0))) static const struct tensor *
bindv(struct loader *l, bool optional, bool want_f32, int64_t ne0, int64_t ne1, int64_t ne2,
      const char *fmt, va_list ap) {
    char name[128];
    vsnprintf(name, sizeof name, fmt, ap);
    return bind(l, optional, want_f32, ne0, ne1, ne2, ne1, name);
}

const struct tensor *ld_matrix(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                               const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const struct tensor *t = bindv(l, optional, false, ne0, ne1, 1, fmt, ap);
    va_end(ap);
    return t;
}

const struct tensor *ld_matrices(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                                 int64_t ne2, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const struct tensor *t = bindv(l, optional, false, ne0, ne1, ne2, fmt, ap);
    va_end(ap);
    return t;
}

const struct tensor *ld_vector(struct loader *l, bool optional, int64_t ne0, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const struct tensor *t = bindv(l, optional, true, ne0, 1, 1, fmt, ap);
    va_end(ap);
    return t;
}

const struct tensor *ld_matrix_f32(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                                   const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const struct tensor *t = bindv(l, optional, true, ne0, ne1, 1, fmt, ap);
    va_end(ap);
    return t;
}

static void arch_key(const struct loader *l, const char *suffix, char *key, size_t n) {
    snprintf(key, n, "%s.%s", l->m->hp.arch, suffix);
}

smelt_status ld_u32(struct loader *l, const char *suffix, bool optional, uint32_t *out) {
    if (l->st != SMELT_OK) return l->st;
    char key[128];
    arch_key(l, suffix, key, sizeof key);
    if (!gguf_get(l->f, key)) {
        if (optional) return SMELT_OK;
        return l->st = err_set(l->e, SMELT_ERR_NOT_FOUND, "metadata key %s is missing", key);
    }
    return l->st = gguf_get_u32(l->f, key, out, l->e);
}

smelt_status ld_f32(struct loader *l, const char *suffix, bool optional, float *out) {
    if (l->st != SMELT_OK) return l->st;
    char key[128];
    arch_key(l, suffix, key, sizeof key);
    if (!gguf_get(l->f, key)) {
        if (optional) return SMELT_OK;
        return l->st = err_set(l->e, SMELT_ERR_NOT_FOUND, "metadata key %s is missing", key);
    }
    l->st = gguf_get_f32(l->f, key, out, l->e);
    if (l->st == SMELT_OK && !isfinite(*out))
        l->st = err_set(l->e, SMELT_ERR_FORMAT, "metadata key %s: not a finite number", key);
    return l->st;
}

void ld_dim(struct loader *l, const char *suffix, bool optional, int32_t *out,
                   uint32_t max) {
    char key[128];
    arch_key(l, suffix, key, sizeof key);
    if (optional && !gguf_get(l->f, key)) return; /* absent: *out stays as it is */
    uint32_t v = (uint32_t)*out;
    if (ld_u32(l, suffix, optional, &v) != SMELT_OK) return;
    if (v == 0 || v > max) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT, "metadata key %s: %u is out of range (1..%u)",
                        key, v, max);
        return;
    }
    *out = (int32_t)v;
}

void ld_attn_weights(struct loader *l, int il, struct attn_weights *w) {
    const struct model *m = l->m;
    const struct layer_attn *a = &m->layer[il];
    int64_t n_embd = m->hp.n_embd, nq = (int64_t)a->n_head * a->head_dim_k,
            nk = (int64_t)a->n_head_kv * a->head_dim_k, nv = (int64_t)a->n_head_kv * a->head_dim_v;
    w->wq = ld_matrix(l, false, n_embd, nq, "blk.%d.attn_q.weight", il);
    w->wk = ld_matrix(l, false, n_embd, nk, "blk.%d.attn_k.weight", il);
    w->wv = ld_matrix(l, false, n_embd, nv, "blk.%d.attn_v.weight", il);
    w->wo = ld_matrix(l, false, (int64_t)a->n_head * a->head_dim_v, n_embd,
                      "blk.%d.attn_output.weight", il);
    w->bq = ld_vector(l, true, nq, "blk.%d.attn_q.bias", il);
    w->bk = ld_vector(l, true, nk, "blk.%d.attn_k.bias", il);
    w->bv = ld_vector(l, true, nv, "blk.%d.attn_v.bias", il);
    w->q_norm = ld_vector(l, true, a->head_dim_k, "blk.%d.attn_q_norm.weight", il);
    w->k_norm = ld_vector(l, true, a->head_dim_k, "blk.%d.attn_k_norm.weight", il);
}

void ld_ffn_weights(struct loader *l, int il, const char *norm, struct ffn_weights *w) {
    const struct model_hparams *hp = &l->m->hp;
    const int64_t d = hp->n_embd;
    memset(w, 0, sizeof *w);
    w->norm = ld_vector(l, false, d, "blk.%d.%s.weight", il, norm);
    if (l->m->arch->ffn == FFN_DENSE) {
        w->gate = ld_matrix(l, false, d, hp->n_ff, "blk.%d.ffn_gate.weight", il);
        w->up = ld_matrix(l, false, d, hp->n_ff, "blk.%d.ffn_up.weight", il);
        w->down = ld_matrix(l, false, hp->n_ff, d, "blk.%d.ffn_down.weight", il);
        return;
    }
    /* the router stays F32 whatever the file stores (routing decides on small margins) */
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", il);
    w->router = bind(l, false, true, d, hp->n_expert, 1, hp->n_expert, name);
    const int64_t f = hp->n_ff_exp, ne = hp->n_expert;
    /* llama.cpp's converter fuses gate and up into one (n_embd, 2 n_ff_exp, n_expert)
     * tensor when asked (--fuse-gate-up-exps; off by default), and llama.cpp reads either */
    snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", il);
    if (l->st == SMELT_OK && gguf_find_tensor(l->f, name)) {
        l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED,
                        "tensor %s: fused expert gate and up projections (llama.cpp's "
                        "convert_hf_to_gguf.py --fuse-gate-up-exps) are not supported yet; "
                        "convert without that option", name);
        return;
    }
    w->gate = ld_matrices(l, false, d, f, ne, "blk.%d.ffn_gate_exps.weight", il);
    w->up = ld_matrices(l, false, d, f, ne, "blk.%d.ffn_up_exps.weight", il);
    w->down = ld_matrices(l, false, f, d, ne, "blk.%d.ffn_down_exps.weight", il);
    w->router_b = ld_vector(l, true, ne, "blk.%d.ffn_gate_inp.bias", il);
    /* the experts' biases: one row per expert, F32 */
    static const char *const exps[3] = {"gate", "up", "down"};
    const struct tensor **eb[3] = {&w->gate_b, &w->up_b, &w->down_b};
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.bias", il, exps[j]);
        *eb[j] = bind(l, true, true, j < 2 ? f : d, ne, 1, ne, name);
    }
    if (l->st == SMELT_OK && (w->gate_b || w->up_b || w->down_b) &&
        !(w->gate_b && w->up_b && w->down_b)) {
        const int miss = !w->gate_b ? 0 : !w->up_b ? 1 : 2;
        l->st = err_set(l->e, SMELT_ERR_NOT_FOUND,
                        "tensor blk.%d.ffn_%s_exps.bias is missing (the file has other expert "
                        "biases of the layer)", il, exps[miss]);
    }
    /* a shared expert: all three projections when the file has any of them */
    bool any = false;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s_shexp.weight", il, exps[i]);
        any = any || gguf_find_tensor(l->f, name) != NULL;
    }
    if (!any || l->st != SMELT_OK) return;
    const int64_t fs = hp->n_ff_shexp;
    if (fs == 0) {
        char key[128];
        arch_key(l, "expert_shared_feed_forward_length", key, sizeof key);
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "tensor %s: a shared expert, but %s is absent and %s.feed_forward_length "
                        "is 0", name, key, hp->arch);
        return;
    }
    w->sh_gate = ld_matrix(l, false, d, fs, "blk.%d.ffn_gate_shexp.weight", il);
    w->sh_up = ld_matrix(l, false, d, fs, "blk.%d.ffn_up_shexp.weight", il);
    w->sh_down = ld_matrix(l, false, fs, d, "blk.%d.ffn_down_shexp.weight", il);
    w->sh_gate_inp = ld_vector(l, true, d, "blk.%d.ffn_gate_inp_shexp.weight", il);
}

/* The expert keys of an FFN_MOE architecture; a dense one with experts is refused. */
static void ld_experts(struct loader *l) {
    struct model *m = l->m;
    struct model_hparams *hp = &m->hp;
    char key[128];
    if (m->arch->ffn == FFN_DENSE) {
        uint32_t n = 0;
        ld_u32(l, "expert_count", true, &n);
        if (l->st == SMELT_OK && n > 0) {
            char list[128] = "";
            for (size_t i = 0, o = 0; i < sizeof archs / sizeof archs[0] && o < sizeof list; i++)
                if (archs[i]->ffn == FFN_MOE)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "",
                                          archs[i]->name);
            arch_key(l, "expert_count", key, sizeof key);
            l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED,
                            "%s is %u: mixture-of-experts %s files are not supported (MoE "
                            "architectures: %s)", key, n, hp->arch, list);
        }
        return;
    }
    ld_dim(l, "expert_count", false, &hp->n_expert, 1u << 16);
    ld_dim(l, "expert_used_count", false, &hp->n_expert_used, 1u << 16);
    if (l->st != SMELT_OK) return;
    if (hp->n_expert_used > hp->n_expert) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.expert_used_count (%d) exceeds %s.expert_count (%d)", hp->arch,
                        hp->n_expert_used, hp->arch, hp->n_expert);
        return;
    }
    /* llama.cpp's default when the key is absent */
    hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    arch_key(l, "expert_feed_forward_length", key, sizeof key);
    if (!gguf_get(l->f, key) && hp->n_ff_exp == 0) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s is absent and %s.feed_forward_length (%d) / %s.expert_used_count "
                        "(%d) is 0", key, hp->arch, hp->n_ff, hp->arch, hp->n_expert_used);
        return;
    }
    ld_dim(l, "expert_feed_forward_length", true, &hp->n_ff_exp, 1u << 22);
    hp->n_ff_shexp = hp->n_ff; /* llama.cpp's default */
    ld_dim(l, "expert_shared_feed_forward_length", true, &hp->n_ff_shexp, 1u << 22);
}

/* RoPE from {arch}.rope.*: frequency base, rotated dims, scaling (linear, YaRN), and the
 * Llama-3 frequency factors tensor. Scaling keys as llama.cpp's converter writes them from
 * HF rope parameters: rope.scaling.type ("linear" / "yarn"; older files: rope.scale_linear),
 * .factor, and for YaRN .original_context_length, with .yarn_beta_fast / .yarn_beta_slow
 * (HF beta_fast / beta_slow, defaults 32 / 1), .yarn_attn_factor (HF attention_factor,
 * default 1 + 0.1 ln(factor)) and .yarn_ext_factor present only when the HF config set
 * them. rope.scaling.attn_factor multiplies the YaRN magnitude (llama.cpp's meaning).
 * Checked against transformers by the llama-linear, qwen2-yarn and qwen3-yarn fixtures. */
static void ld_rope(struct loader *l, struct rope_params *r) {
    struct model *m = l->m;
    r->freq_base = 10000.0f;
    r->freq_scale = 1.0f;
    r->attn_factor = 1.0f;
    r->ext_factor = 0.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = m->hp.n_ctx_train;
    r->n_rot = m->hp.head_dim_k;
    ld_f32(l, "rope.freq_base", true, &r->freq_base);
    ld_dim(l, "rope.dimension_count", true, &r->n_rot, (uint32_t)m->hp.head_dim_k);
    if (l->st != SMELT_OK) return;
    if (r->n_rot % 2 || r->freq_base <= 0) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.rope.dimension_count (%d) must be even and %s.rope.freq_base (%g) "
                        "positive", m->hp.arch, r->n_rot, m->hp.arch, (double)r->freq_base);
        return;
    }

    char key[128], type[32] = "none";
    float factor = 0;
    arch_key(l, "rope.scaling.type", key, sizeof key);
    if (gguf_get(l->f, key)) {
        struct gguf_str s;
        if ((l->st = gguf_get_str(l->f, key, &s, l->e)) != SMELT_OK) return;
        gguf_str_copy(s, type, sizeof type);
    } else {
        ld_f32(l, "rope.scale_linear", true, &factor); /* older files */
        if (factor != 0) strcpy(type, "linear");
    }
    if (!strcmp(type, "none")) return;
    if (strcmp(type, "linear") && strcmp(type, "yarn")) {
        l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED, "%s: rope scaling '%s' is not supported",
                        key, type);
        return;
    }
    ld_f32(l, "rope.scaling.factor", factor != 0, &factor);
    if (l->st != SMELT_OK) return;
    if (factor < 1.0f) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s.rope.scaling.factor: %g is below 1",
                        m->hp.arch, (double)factor);
        return;
    }
    r->freq_scale = 1.0f / factor;
    if (!strcmp(type, "yarn")) {
        uint32_t orig = (uint32_t)r->n_ctx_orig;
        r->ext_factor = 1.0f;
        ld_f32(l, "rope.scaling.yarn_ext_factor", true, &r->ext_factor);
        ld_f32(l, "rope.scaling.attn_factor", true, &r->attn_factor);
        ld_f32(l, "rope.scaling.yarn_beta_fast", true, &r->beta_fast);
        ld_f32(l, "rope.scaling.yarn_beta_slow", true, &r->beta_slow);
        ld_u32(l, "rope.scaling.original_context_length", true, &orig);
        if (l->st == SMELT_OK && (orig == 0 || orig > (1u << 30) || r->beta_fast <= 0 ||
                                  r->beta_slow <= 0)) {
            l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s.rope.scaling: YaRN parameters out of range",
                            m->hp.arch);
            return;
        }
        r->n_ctx_orig = (int32_t)orig;

        /* HF's attention_factor (the converter writes it as yarn_attn_factor) is the whole
         * cos/sin magnitude: it replaces YaRN's 1 + 0.1 ln(factor), which the backends
         * multiply in whenever ext_factor != 0, so that term is divided out here (with
         * the backends' own float freq_scale, so the two cancel to rounding). */
        arch_key(l, "rope.scaling.yarn_attn_factor", key, sizeof key);
        if (gguf_get(l->f, key)) {
            float ya = 0;
            if (ld_f32(l, "rope.scaling.yarn_attn_factor", false, &ya) != SMELT_OK) return;
            if (ya <= 0 || ya > 1e3f) {
                l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s: %g is out of range", key, (double)ya);
                return;
            }
            double yarn_mag =
                r->ext_factor != 0 ? 1.0 + 0.1 * log(1.0 / (double)r->freq_scale) : 1.0;
            r->attn_factor = (float)(r->attn_factor * ya / yarn_mag);
        }
    }
}

/* What an embedding model declares: {arch}.pooling_type (GGUF's values: 0 none, 1 mean,
 * 2 cls, 3 last, 4 rank) and {arch}.attention.causal. An encoder is bidirectional, and pools
 * by the mean when the file names no pooling (sentence-transformers' default); a decoder
 * is causal (a bidirectional decoder, e.g. a diffusion LM, is refused), and a generative
 * model when it names none. Rerankers (rank) are refused: no route serves them. */
static void ld_embedding(struct loader *l) {
    struct model *m = l->m;
    struct model_hparams *hp = &m->hp;
    const bool enc = m->arch->encoder;
    uint32_t pool = enc ? POOL_MEAN : POOL_NONE;
    char key[128];
    if (ld_u32(l, "pooling_type", true, &pool) != SMELT_OK) return;
    arch_key(l, "pooling_type", key, sizeof key);
    if (pool == 4) {
        l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED, "%s is 4 (rank): rerankers are not "
                        "supported", key);
        return;
    }
    if (pool > POOL_LAST || (enc && pool == POOL_NONE)) {
        l->st = err_set(l->e, pool > 4 ? SMELT_ERR_FORMAT : SMELT_ERR_UNSUPPORTED,
                        "%s is %u: %s", key, pool, pool > 4 ? "not a pooling type (0..4)"
                        : "an encoder's per-token hidden states are not served (mean, cls or "
                          "last pooling is)");
        return;
    }
    hp->pooling = (enum model_pooling)pool;
    hp->causal = !enc;
    arch_key(l, "attention.causal", key, sizeof key);
    if (!gguf_get(l->f, key)) return;
    bool causal = true;
    if ((l->st = gguf_get_bool(l->f, key, &causal, l->e)) != SMELT_OK) return;
    if (causal != hp->causal)
        l->st = err_set(l->e, SMELT_ERR_UNSUPPORTED, "%s is %s: %s", key, causal ? "true" : "false",
                        enc ? "an encoder's attention is bidirectional"
                            : "bidirectional attention is supported for encoders (bert) only");
}

static void load_common(struct loader *l) {
    struct model *m = l->m;
    struct model_hparams *hp = &m->hp;
    ld_dim(l, "embedding_length", false, &hp->n_embd, 1u << 18);
    ld_dim(l, "block_count", false, &hp->n_layer, 1u << 12);
    /* an MoE file may have no dense FFN width (Qwen3.5's MoE models) */
    ld_dim(l, "feed_forward_length", m->arch->ffn == FFN_MOE, &hp->n_ff, 1u << 22);
    ld_dim(l, "context_length", false, &hp->n_ctx_train, 1u << 30);
    ld_dim(l, "attention.head_count", false, &hp->n_head, 1u << 12);
    hp->n_head_kv = hp->n_head;
    ld_dim(l, "attention.head_count_kv", true, &hp->n_head_kv, 1u << 12);
    ld_f32(l, m->arch->encoder ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon",
           false, &hp->norm_eps);
    ld_embedding(l);
    if (l->st != SMELT_OK) return;
    if (hp->n_head % hp->n_head_kv) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.attention.head_count_kv (%d) does not divide %s.attention.head_count "
                        "(%d)", hp->arch, hp->n_head_kv, hp->arch, hp->n_head);
        return;
    }
    char key[128];
    arch_key(l, "attention.key_length", key, sizeof key);
    if (!gguf_get(l->f, key) && hp->n_embd % hp->n_head) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.attention.head_count (%d) does not divide %s.embedding_length (%d) "
                        "and %s is absent", hp->arch, hp->n_head, hp->arch, hp->n_embd, key);
        return;
    }
    hp->head_dim_k = hp->n_embd / hp->n_head;
    ld_dim(l, "attention.key_length", true, &hp->head_dim_k, 1u << 14);
    hp->head_dim_v = hp->head_dim_k;
    ld_dim(l, "attention.value_length", true, &hp->head_dim_v, 1u << 14);
    if (l->st == SMELT_OK && (hp->norm_eps <= 0 || hp->norm_eps > 1)) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT, "%s.attention.layer_norm%s_epsilon: %g is out of "
                        "range", hp->arch, m->arch->encoder ? "" : "_rms", (double)hp->norm_eps);
        return;
    }
    hp->embd_scale = 1.0f;
    ld_f32(l, "final_logit_softcapping", true, &hp->final_softcap);
    ld_experts(l);
    if (l->st != SMELT_OK) return;

    /* Token embeddings set the vocabulary size. */
    const struct gguf_tensor *te = gguf_find_tensor(l->f, "token_embd.weight");
    if (!te) {
        l->st = err_set(l->e, SMELT_ERR_NOT_FOUND, "tensor token_embd.weight is missing");
        return;
    }
    if (te->ne[1] <= 0 || te->ne[1] > (1 << 24)) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT, "tensor token_embd.weight: %lld rows",
                        (long long)te->ne[1]);
        return;
    }
    const int32_t rows = (int32_t)te->ne[1];
    hp->n_vocab = rows;
    uint32_t vs = (uint32_t)rows;
    ld_u32(l, "vocab_size", true, &vs);
    if (l->st == SMELT_OK && vs != (uint32_t)rows) {
        l->st = err_set(l->e, SMELT_ERR_FORMAT,
                        "%s.vocab_size (%u) differs from token_embd.weight's %d rows", hp->arch, vs,
                        rows);
        return;
    }
    /* The tokenizer's ids index these rows. A token past them has no embedding and no
     * logit: refused. Rows past the tokens (a vocabulary padded to a round size) belong to
     * no token: the model's vocabulary is then the tokens, so input ids and logit rows
     * stop there, and no sampler (CPU or device) can pick an id without a token. */
    const struct gguf_value *toks = NULL;
    if (gguf_get(l->f, "tokenizer.ggml.tokens")) {
        l->st = gguf_get_arr(l->f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks, l->e);
        if (l->st != SMELT_OK) return;
        uint64_t nt = toks->v.arr.n;
        if (nt == 0 || nt > (uint64_t)rows) {
            l->st = err_set(l->e, SMELT_ERR_FORMAT,
                            "tokenizer.ggml.tokens has %llu tokens but token_embd.weight has %d "
                            "rows: %s",
                            (unsigned long long)nt, rows,
                            nt ? "token ids past the rows would have no embedding and no logit"
                               : "no tokens");
            return;
        }
        hp->n_vocab = (int32_t)nt;
    }
    m->tok_embd = bind(l, false, false, hp->n_embd, rows, 1, hp->n_vocab, "token_embd.weight");
    if (!m->arch->encoder) { /* an encoder's last LayerNorm is its output; it has no head */
        m->output_norm = ld_vector(l, false, hp->n_embd, "output_norm.weight");
        m->output = bind(l, true, false, hp->n_embd, rows, 1, hp->n_vocab, "output.weight");
        hp->tied_output = m->output == NULL;
        if (!m->output) m->output = m->tok_embd;
    }

    /* Every layer starts with the model-wide attention shape and a KV cache; architectures
     * adjust. */
    m->layer = ld_alloc(l, (size_t)hp->n_layer * sizeof *m->layer);
    m->mem = ld_alloc(l, (size_t)hp->n_layer * sizeof *m->mem);
    if (!m->layer || !m->mem) return;
    for (int il = 0; il < hp->n_layer; il++) m->mem[il].kind = MEM_KV;
    struct rope_params rope = {0};
    ld_rope(l, &rope);
    m->rope_freqs = ld_vector(l, true, rope.n_rot / 2, "rope_freqs.weight");
    rope.freq_factors = m->rope_freqs;
    float attn_softcap = 0;
    ld_f32(l, "attn_logit_softcapping", true, &attn_softcap);
    if (l->st != SMELT_OK) return;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_attn *a = &m->layer[il];
        a->n_head = hp->n_head;
        a->n_head_kv = hp->n_head_kv;
        a->head_dim_k = hp->head_dim_k;
        a->head_dim_v = hp->head_dim_v;
        a->rope = rope;
        a->attn.scale = 1.0f / sqrtf((float)hp->head_dim_k);
        a->attn.softcap = attn_softcap;
        a->attn.window = 0;
        a->attn.non_causal = !hp->causal;
    }
}

bool model_expert_on_host(const char *name, int32_t n_cpu_moe) {
    int layer = -1, end = 0;
    if (n_cpu_moe <= 0 || sscanf(name, "blk.%d.ffn_%n", &layer, &end) != 1 || end == 0)
        return false;
    const char *dot = strchr(name + end, '.');
    return layer >= 0 && layer < n_cpu_moe && dot && dot - (name + end) >= 5 &&
           !strncmp(dot - 5, "_exps", 5);
}

bool model_tensor_widened(const char *name) {
    static const char *const sfx[] = {".ssm_conv1d.weight", "token_types.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t k = strlen(sfx[i]);
        if (n >= k && !strcmp(name + n - k, sfx[i])) return true;
    }
    return false;
}

smelt_status model_load(struct model **out, const struct gguf_file *f, struct backend *bk,
                        struct err *e) {
    return model_load_placed(out, f, bk, NULL, e);
}

/* The architecture of f, checked against what bk can run. */
static smelt_status find_arch(const struct gguf_file *f, struct backend *bk,
                              const struct arch_def **out, struct err *e) {
    struct gguf_str an;
    smelt_status st = gguf_get_str(f, "general.architecture", &an, e);
    if (st != SMELT_OK) return err_prefix(e, "model");
    const struct arch_def *arch = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (gguf_str_eq(an, archs[i]->name)) arch = archs[i];
    if (!arch) {
        char name[64], list[256] = "";
        for (size_t i = 0, o = 0; i < sizeof archs / sizeof archs[0] && o < sizeof list; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", archs[i]->name);
        return err_set(e, SMELT_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)",
                       gguf_str_copy(an, name, sizeof name), list);
    }
    if (arch->ffn == FFN_MOE && !bk_has_moe(bk))
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s is a mixture-of-experts architecture and the %s backend has no "
                       "mixture-of-experts ops yet (run it with --backend cpu)", arch->name,
                       bk->ops->name);
    if (bk_missing_features(bk, arch->needs)) {
        char names[160];
        bk_feature_names(bk_missing_features(bk, arch->needs), names, sizeof names);
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s needs %s, which the %s backend does not implement yet (run it with "
                       "--backend cpu)", arch->name, names, bk->ops->name);
    }
    *out = arch;
    return SMELT_OK;
}

smelt_status model_load_placed(struct model **out, const struct gguf_file *f, struct backend *bk,
                               const struct model_place *place, struct err *e) {
    *out = NULL;
    struct backend *host_bk = place ? place->host_bk : NULL;
    const int32_t n_cpu_moe = place && host_bk ? place->n_cpu_moe : 0;
    const struct arch_def *arch = NULL;
    smelt_status st = find_arch(f, bk, &arch, e);
    if (st == SMELT_OK && host_bk && arch->ffn == FFN_MOE && n_cpu_moe > 0 && !bk_has_moe(host_bk))
        st = err_set(e, SMELT_ERR_UNSUPPORTED, "--n-cpu-moe: the %s backend has no "
                     "mixture-of-experts ops", host_bk->ops->name);
    if (st != SMELT_OK) {
        bk_free(host_bk);
        return st;
    }
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        bk_free(host_bk);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    m->arch = arch;
    m->bk = bk;
    if (arch->ffn == FFN_MOE && n_cpu_moe > 0) {
        m->host_bk = host_bk;
        m->n_cpu_moe = n_cpu_moe;
    } else {
        bk_free(host_bk); /* nothing would run there */
    }
    arena_init(&m->host);
    snprintf(m->hp.arch, sizeof m->hp.arch, "%s", arch->name);
    m->cap_tensors = gguf_n_tensors(f);
    m->tensors = calloc((size_t)m->cap_tensors + 1, sizeof *m->tensors);
    if (!m->tensors) {
        model_free(m);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    struct loader l = {m, f, e, SMELT_OK};
    load_common(&l);
    if (l.st == SMELT_OK) l.st = arch->load(m, f, e);
    if (l.st != SMELT_OK) {
        model_free(m);
        return l.st;
    }
    *out = m;
    return SMELT_OK;
}

void model_free(struct model *m) {
    if (!m) return;
    if (m->host_bk) bk_free(m->host_bk);
    for (int64_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->tensors);
    free(m->host_rows);
    arena_free(&m->host);
    free(m);
}

smelt_status model_mtp_new(const struct model *m, struct model **out, struct err *e) {
    *out = NULL;
    if (!m->arch->mtp)
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s has no multi-token-prediction head (smelt runs Qwen3.5's and "
                       "Qwen3-Next's)", m->hp.arch);
    struct model *h = calloc(1, sizeof *h);
    if (!h) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    h->bk = m->bk;
    h->hp = m->hp;
    arena_init(&h->host);
    smelt_status st = m->arch->mtp(m, h, e);
    if (st != SMELT_OK) {
        model_free(h);
        return st;
    }
    snprintf(h->hp.arch, sizeof h->hp.arch, "%s", h->arch->name);
    *out = h;
    return SMELT_OK;
}

/* ---- KV store ---- */

static bool kv_type_ok(uint32_t type) {
    return type == QT_F32 || type == QT_F16 || type == QT_BF16;
}

uint64_t model_kv_block_bytes(const struct model *m, uint32_t type, int32_t block_size) {
    const struct qtype_info *qi = qtype_get(type);
    if (!qi) return 0;
    uint64_t total = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->mem[il].kind != MEM_KV) continue;
        const struct layer_attn *a = &m->layer[il];
        uint64_t row = qtype_row_size(type, a->head_dim_k) + qtype_row_size(type, a->head_dim_v);
        total += row * (uint64_t)block_size * (uint64_t)a->n_head_kv;
    }
    return total;
}

uint64_t model_state_slot_bytes(const struct model *m) {
    uint64_t total = 0;
    for (int il = 0; il < m->hp.n_layer; il++)
        if (m->mem[il].kind == MEM_STATE)
            total += (uint64_t)(m->mem[il].conv_len + m->mem[il].ssm_len) * sizeof(float);
    return total;
}

bool model_is_recurrent(const struct model *m) { return model_state_slot_bytes(m) > 0; }

bool model_is_causal(const struct model *m) { return m->hp.causal; }

/* Allocates t as (ne0, n) of type, named; nothing when ne0 is 0. */
static smelt_status kv_tensor(struct model *m, struct tensor *t, uint32_t type, int64_t ne0,
                              int64_t ne1, int64_t ne2, int64_t ne3, const char *name,
                              struct err *e) {
    if (ne0 == 0) return SMELT_OK;
    tensor_init(t, type, ne0, ne1, ne2, ne3);
    t->name = name;
    return bk_buffer_alloc(m->bk, t, e);
}

smelt_status model_kv_new(struct model *m, uint32_t type, int32_t block_size, int32_t n_blocks,
                          int32_t n_slots, struct kv_store **out, struct err *e) {
    *out = NULL;
    if (!kv_type_ok(type))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "KV cache type %s is not supported (F32, F16, BF16)",
                       qtype_name(type));
    if (block_size < 1 || block_size > 4096 || n_blocks < 1 || n_blocks > (1 << 24))
        return err_set(e, SMELT_ERR_INVALID, "KV cache: block_size %d, n_blocks %d out of range",
                       block_size, n_blocks);
    bool rec = model_is_recurrent(m);
    if (n_slots < 0 || n_slots > (1 << 20) || (rec && n_slots < 1))
        return err_set(e, SMELT_ERR_INVALID, "recurrent state: %d slots (a model with recurrent "
                       "layers needs at least one)", n_slots);
    if (!rec) n_slots = 0;
    uint64_t bytes = 0, sbytes = 0;
    if (ckd_mul_u64(&bytes, model_kv_block_bytes(m, type, block_size), (uint64_t)n_blocks) ||
        bytes > ((uint64_t)1 << 46))
        return err_set(e, SMELT_ERR_RANGE, "KV cache: %d blocks of %d tokens is too large",
                       n_blocks, block_size);
    if (ckd_mul_u64(&sbytes, model_state_slot_bytes(m), (uint64_t)n_slots) ||
        sbytes > ((uint64_t)1 << 46))
        return err_set(e, SMELT_ERR_RANGE, "recurrent state: %d slots is too large", n_slots);
    struct kv_store *kv = calloc(1, sizeof *kv);
    size_t nl = (size_t)m->hp.n_layer;
    if (kv) {
        kv->k = calloc(nl, sizeof *kv->k);
        kv->v = calloc(nl, sizeof *kv->v);
        kv->conv = calloc(nl, sizeof *kv->conv);
        kv->ssm = calloc(nl, sizeof *kv->ssm);
        kv->slot_pos = malloc(((size_t)n_slots + 1) * sizeof *kv->slot_pos);
    }
    if (!kv || !kv->k || !kv->v || !kv->conv || !kv->ssm || !kv->slot_pos) {
        if (kv) free(kv->k), free(kv->v), free(kv->conv), free(kv->ssm), free(kv->slot_pos);
        free(kv);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    static uint64_t next_id;
    kv->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    kv->type = type;
    kv->n_layer = m->hp.n_layer;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_slots = n_slots;
    for (int32_t i = 0; i < n_slots; i++) kv->slot_pos[i] = -1;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct layer_attn *a = &m->layer[il];
        const struct layer_mem *lm = &m->mem[il];
        smelt_status st = SMELT_OK;
        if (lm->kind == MEM_KV) {
            st = kv_tensor(m, &kv->k[il], type, a->head_dim_k, block_size, a->n_head_kv, n_blocks,
                           "kv.k", e);
            if (st == SMELT_OK)
                st = kv_tensor(m, &kv->v[il], type, a->head_dim_v, block_size, a->n_head_kv,
                               n_blocks, "kv.v", e);
        } else if (lm->kind == MEM_STATE) {
            st = kv_tensor(m, &kv->conv[il], QT_F32, lm->conv_len, n_slots, 1, 1, "state.conv", e);
            if (st == SMELT_OK)
                st = kv_tensor(m, &kv->ssm[il], QT_F32, lm->ssm_len, n_slots, 1, 1, "state.ssm", e);
        }
        if (st != SMELT_OK) {
            model_kv_free(m, kv);
            return err_prefix(e, "KV cache layer %d", il);
        }
    }
    *out = kv;
    return SMELT_OK;
}

void model_kv_free(struct model *m, struct kv_store *kv) {
    if (!kv) return;
    for (int il = 0; il < kv->n_layer; il++) {
        bk_buffer_free(m->bk, &kv->k[il]);
        bk_buffer_free(m->bk, &kv->v[il]);
        bk_buffer_free(m->bk, &kv->conv[il]);
        bk_buffer_free(m->bk, &kv->ssm[il]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->conv);
    free(kv->ssm);
    free(kv->slot_pos);
    free(kv);
}

smelt_status model_state_copy(struct model *m, struct kv_store *kv, int32_t dst, int32_t src,
                              struct err *e) {
    if (dst < 0 || dst >= kv->n_slots || src < 0 || src >= kv->n_slots)
        return err_set(e, SMELT_ERR_RANGE, "state copy: slots %d <- %d of %d", dst, src,
                       kv->n_slots);
    m->last_logits = NULL;
    m->last_n_out = 0;
    if (dst == src) return SMELT_OK;
    struct backend *bk = m->bk;
    bk_step_begin(bk);
    for (int il = 0; il < kv->n_layer; il++) {
        struct tensor *ts[2] = {&kv->conv[il], &kv->ssm[il]};
        for (int i = 0; i < 2; i++) {
            struct tensor *t = ts[i];
            if (!t->data) continue;
            bk_copy(bk, bk_view_2d(bk, t, t->ne[0], 1, t->nb[1], (size_t)dst * t->nb[1]),
                    bk_view_2d(bk, t, t->ne[0], 1, t->nb[1], (size_t)src * t->nb[1]));
        }
    }
    smelt_status st = bk_sync(bk, e);
    kv->slot_pos[dst] = st == SMELT_OK ? kv->slot_pos[src] : -1;
    return st != SMELT_OK ? err_prefix(e, "state copy") : SMELT_OK;
}

/* ---- forward building blocks ---- */

struct tensor *fwd_embed(struct model *m, struct step *s) {
    struct tensor *x = bk_new(s->bk, QT_F32, m->hp.n_embd, s->n_tokens, 1);
    bk_get_rows(s->bk, x, m->tok_embd, s->token);
    if (m->hp.embd_scale != 1.0f) bk_scale(s->bk, x, x, m->hp.embd_scale);
    return x;
}

struct tensor *fwd_attention(struct model *m, struct step *s, int il, const struct attn_weights *w,
                             const struct tensor *x, const struct tensor *norm) {
    struct backend *bk = s->bk;
    const struct layer_attn *a = &m->layer[il];
    int64_t n = s->n_tokens;
    struct tensor *q = bk_new(bk, QT_F32, (int64_t)a->n_head * a->head_dim_k, n, 1);
    struct tensor *k = bk_new(bk, QT_F32, (int64_t)a->n_head_kv * a->head_dim_k, n, 1);
    struct tensor *v = bk_new(bk, QT_F32, (int64_t)a->n_head_kv * a->head_dim_v, n, 1);
    struct tensor *qkv[3] = {q, k, v};
    const struct tensor *wqkv[3] = {w->wq, w->wk, w->wv}, *bqkv[3] = {w->bq, w->bk, w->bv};
    struct prenorm pre = {norm, m->hp.norm_eps};
    bk_matmul_group(bk, 3, qkv, wqkv, bqkv, x, &pre); /* q, k, v = W rms_norm(x) (+ b) */

    q = bk_reshape(bk, q, a->head_dim_k, a->n_head, n);    /* (head_dim_k, n_head, n) */
    k = bk_reshape(bk, k, a->head_dim_k, a->n_head_kv, n); /* (head_dim_k, n_head_kv, n) */
    v = bk_reshape(bk, v, a->head_dim_v, a->n_head_kv, n); /* (head_dim_v, n_head_kv, n) */
    struct qk_prep prep = {w->q_norm, w->k_norm, m->hp.norm_eps, &a->rope};
    struct tensor *att = bk_new(bk, QT_F32, a->head_dim_v, a->n_head, n);
    bk_rope_attention(bk, att, q, k, v, &s->kv->k[il], &s->kv->v[il], &s->meta, &prep, &a->attn);
    return bk_reshape(bk, att, (int64_t)a->head_dim_v * a->n_head, n, 1);
}

void fwd_ffn(struct model *m, struct step *s, const struct ffn_weights *w, enum glu_act act,
             const struct tensor *x, struct tensor *dst, bool acc, const struct prenorm *next) {
    struct backend *bk = s->bk;
    const struct prenorm pre = {w->norm, m->hp.norm_eps};
    const int64_t n = x->ne[1];
    if (!w->router) {
        bk_ffn(bk, dst, x, w->gate, w->up, w->down, act, &pre, acc, next);
        return;
    }
    const int64_t k = m->hp.n_expert_used;
    struct tensor *ids = bk_new(bk, QT_I32, k, n, 1);     /* (k, n) each row's experts */
    struct tensor *weights = bk_new(bk, QT_F32, k, n, 1); /* (k, n) and their weights */
    /* the shared expert's gate: sigmoid(g . x') scales it; the router computes g . x' */
    struct tensor *sh_logit = w->sh_gate_inp ? bk_new(bk, QT_F32, 1, n, 1) : NULL;
    const struct moe_experts ex = {w->gate,   w->up,      w->down,    act,     w->gate_b,
                                   w->up_b,   w->down_b,  w->sh_gate, w->sh_up, w->sh_down,
                                   sh_logit};
    /* the router right before the experts: a backend may hand the experts' input rows from
     * one to the other (the CUDA decode router writes them) */
    bk_moe_route(bk, ids, weights, x, w->router, w->router_b, m->hp.gating, &pre, w->sh_gate_inp,
                 sh_logit);
    bk_moe_ffn(bk, dst, x, &ex, ids, weights, &pre, acc, acc ? next : NULL);
}

void fwd_keep_out_rows(struct model *m, struct step *s, struct tensor **x, struct tensor **att) {
    if (s->n_out == 0 || s->n_out == s->n_tokens || s->out_gathered || s->keep_all) return;
    struct tensor *xo = bk_new(s->bk, QT_F32, (*x)->ne[0], s->n_out, 1);
    struct tensor *ao = bk_new(s->bk, QT_F32, (*att)->ne[0], s->n_out, 1);
    bk_get_rows(s->bk, xo, *x, s->out_rows);
    bk_get_rows(s->bk, ao, *att, s->out_rows);
    *x = xo;
    *att = ao;
    s->out_gathered = true;
}

/* ---- the step ---- */

static smelt_status check_batch(const struct model *m, const struct kv_store *kv,
                                const struct batch *b, struct err *e) {
    if (kv->n_layer != m->hp.n_layer)
        return err_set(e, SMELT_ERR_INVALID, "KV store has %d layers, the model %d",
                       kv->n_layer, m->hp.n_layer);
    if (b->n_tokens < 1 || b->n_tokens > (1 << 20))
        return err_set(e, SMELT_ERR_INVALID, "batch: %d tokens", b->n_tokens);
    if (b->n_seqs < 1 || b->n_seqs > (1 << 20) || !b->seqs || !b->token || !b->pos || !b->seq)
        return err_set(e, SMELT_ERR_INVALID, "batch: %d sequences, or an array is missing",
                       b->n_seqs);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const struct batch_seq *q = &b->seqs[s];
        if (q->n_blocks < 0 || q->n_blocks > (1 << 24) || (q->n_blocks > 0 && !q->blocks))
            return err_set(e, SMELT_ERR_INVALID, "batch: sequence %d has %d blocks", s,
                           q->n_blocks);
        for (int32_t i = 0; i < q->n_blocks; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= kv->n_blocks)
                return err_set(e, SMELT_ERR_RANGE,
                               "batch: sequence %d, block table entry %d: block %d is not in "
                               "the cache (%d blocks)", s, i, q->blocks[i], kv->n_blocks);
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->token[i] < 0 || b->token[i] >= m->hp.n_vocab)
            return err_set(e, SMELT_ERR_RANGE, "batch row %d: token %d is outside the vocabulary "
                           "(%d)", i, b->token[i], m->hp.n_vocab);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return err_set(e, SMELT_ERR_RANGE, "batch row %d: sequence %d of %d", i, b->seq[i],
                           b->n_seqs);
        if (m->n_pos > 0 && b->pos[i] >= m->n_pos)
            return err_set(e, SMELT_ERR_RANGE, "batch row %d: position %d is past %s's %d "
                           "position embeddings", i, b->pos[i], m->hp.arch, m->n_pos);
        int64_t cap = (int64_t)b->seqs[b->seq[i]].n_blocks * kv->block_size;
        if (b->pos[i] < 0 || b->pos[i] >= cap)
            return err_set(e, SMELT_ERR_RANGE,
                           "batch row %d: position %d is not covered by sequence %d's %d "
                           "blocks of %d", i, b->pos[i], b->seq[i], b->seqs[b->seq[i]].n_blocks,
                           kv->block_size);
    }
    return SMELT_OK;
}

/* The recurrent layers' part of the batch contract (batch.h): each sequence's rows are
 * contiguous with consecutive positions, its first row starts at 0 or continues its slot's
 * state, its slot and snapshot slot are in range and used once in the batch, and its
 * snapshot position lies within its rows. Fills words (STATE_SEQ_WORDS per sequence) for
 * the ops. */
static smelt_status check_state(struct model *m, const struct kv_store *kv, const struct batch *b,
                                int32_t *words, struct err *e) {
    int32_t ns = b->n_seqs;
    uint8_t *used = arena_calloc(&m->host, (size_t)kv->n_slots);
    if (!used) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    for (int32_t s = 0; s < ns; s++) words[s * STATE_SEQ_WORDS + STATE_NROWS] = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t *w = words + b->seq[i] * STATE_SEQ_WORDS;
        if (w[STATE_NROWS] == 0) {
            w[STATE_ROW0] = i;
        } else if (w[STATE_ROW0] + w[STATE_NROWS] != i ||
                   b->pos[i] != b->pos[w[STATE_ROW0]] + w[STATE_NROWS]) {
            return err_set(e, SMELT_ERR_INVALID,
                           "batch row %d: sequence %d's rows are not contiguous with consecutive "
                           "positions (a model with recurrent layers needs them so)", i, b->seq[i]);
        }
        w[STATE_NROWS]++;
    }
    for (int32_t s = 0; s < ns; s++) {
        int32_t *w = words + s * STATE_SEQ_WORDS;
        const struct batch_seq *q = &b->seqs[s];
        w[STATE_SNAP_SLOT] = 0;
        w[STATE_SNAP_AT] = -1;
        w[STATE_SLOT] = q->slot;
        w[STATE_FRESH] = 0;
        if (w[STATE_NROWS] == 0) continue;
        int32_t r0 = w[STATE_ROW0], p0 = b->pos[r0], p1 = p0 + w[STATE_NROWS];
        if (q->slot < 0 || q->slot >= kv->n_slots || used[q->slot]++)
            return err_set(e, SMELT_ERR_RANGE, "batch: sequence %d's state slot %d is out of range "
                           "(%d slots) or used twice", s, q->slot, kv->n_slots);
        if (p0 != 0 && kv->slot_pos[q->slot] != p0)
            return err_set(e, SMELT_ERR_INVALID,
                           "batch row %d: position %d does not continue state slot %d (it covers "
                           "positions [0, %d))", r0, p0, q->slot, kv->slot_pos[q->slot]);
        w[STATE_FRESH] = p0 == 0;
        if (q->snap_pos > 0) {
            if (q->snap_pos < p0 || q->snap_pos > p1)
                return err_set(e, SMELT_ERR_RANGE, "batch: sequence %d's snapshot at position %d "
                               "is outside its rows [%d, %d]", s, q->snap_pos, p0, p1);
            if (q->snap_slot < 0 || q->snap_slot >= kv->n_slots || used[q->snap_slot]++)
                return err_set(e, SMELT_ERR_RANGE, "batch: sequence %d's snapshot slot %d is out "
                               "of range (%d slots) or used twice", s, q->snap_slot, kv->n_slots);
            w[STATE_SNAP_SLOT] = q->snap_slot;
            w[STATE_SNAP_AT] = q->snap_pos - p0;
        }
    }
    return SMELT_OK;
}

/* A scratch I32 tensor holding n host values. */
static struct tensor *upload_i32(struct backend *bk, const int32_t *v, int64_t n) {
    struct tensor *t = bk_new(bk, QT_I32, n, 1, 1);
    bk_upload(bk, t, v, (size_t)n * sizeof(int32_t));
    return t;
}

#define ADJ_PER_ROW 512
#define ADJ_MIN 4096

int32_t model_adj_cap(int32_t n_rows) {
    int64_t c = (int64_t)n_rows * ADJ_PER_ROW;
    return c < ADJ_MIN ? ADJ_MIN : c > (1 << 24) ? (1 << 24) : (int32_t)c;
}

/* The sampling request is well-formed: counts, every row's range inside the list, each
 * range sorted by token. */
static smelt_status check_sample(const struct model *m, const struct model_sample *q,
                                 int32_t n_out, struct err *e) {
    if (q->n_rows != n_out)
        return err_set(e, SMELT_ERR_INVALID, "sampling: %d row requests for %d output rows",
                       q->n_rows, n_out);
    if (q->n_adj < 0 || q->n_adj > model_adj_cap(n_out) || (q->n_adj > 0 && !q->adj))
        return err_set(e, SMELT_ERR_INVALID, "sampling: %d adjustments (at most %d)", q->n_adj,
                       model_adj_cap(n_out));
    if (n_out > 0 && (!q->rows || !q->sum || !q->cand))
        return err_set(e, SMELT_ERR_INVALID, "sampling: an array is missing");
    for (int32_t r = 0; r < n_out; r++) {
        const struct topk_row *w = &q->rows[r];
        if (w->k < 0 || w->k > TOPK_MAX || (w->k > 0 && !(w->inv_t > 0.0f && isfinite(w->inv_t))))
            return err_set(e, SMELT_ERR_INVALID, "sampling row %d: k %d, inv_t %g", r, w->k,
                           (double)w->inv_t);
        if (w->k > 0 && (w->flags & TOPK_MASK) && !q->mask)
            return err_set(e, SMELT_ERR_INVALID,
                           "sampling row %d: a token mask is asked for "
                           "and none is given",
                           r);
        if (w->adj_off < 0 || w->adj_n < 0 || w->adj_off > q->n_adj || w->adj_n > q->n_adj - w->adj_off)
            return err_set(e, SMELT_ERR_RANGE, "sampling row %d: adjustments [%d, +%d) outside "
                           "the list of %d", r, w->adj_off, w->adj_n, q->n_adj);
        for (int32_t i = 0; i < w->adj_n; i++) {
            const struct logit_adj *a = &q->adj[w->adj_off + i];
            if (a->token < 0 || a->token >= m->hp.n_vocab)
                return err_set(e, SMELT_ERR_RANGE, "sampling row %d: adjustment of token %d "
                               "outside the vocabulary", r, a->token);
            if (i > 0 && a->token < a[-1].token)
                return err_set(e, SMELT_ERR_INVALID, "sampling row %d: adjustments not sorted "
                               "by token", r);
        }
    }
    return SMELT_OK;
}

/* Bidirectional attention's part of the contract: each sequence of the batch is whole, its
 * rows at positions 0, 1, ... in order (every key a row attends to is computed in this
 * step). Fills n_keys (n_seqs): each sequence's length. */
static smelt_status check_whole(const struct model *m, const struct batch *b, int32_t *n_keys,
                                struct err *e) {
    memset(n_keys, 0, (size_t)b->n_seqs * sizeof *n_keys);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t s = b->seq[i];
        if (b->pos[i] != n_keys[s])
            return err_set(e, SMELT_ERR_INVALID, "batch row %d: position %d of sequence %d, "
                           "expected %d: %s's attention is bidirectional, so a sequence's rows "
                           "must be all of it, in order from position 0", i, b->pos[i], s,
                           n_keys[s], m->hp.arch);
        n_keys[s]++;
    }
    return SMELT_OK;
}

smelt_status model_forward(struct model *m, struct kv_store *kv, const struct batch *b,
                           float *logits_out, int32_t *n_out_p, struct err *e) {
    return model_step(m, kv, b, logits_out, NULL, n_out_p, e);
}

static smelt_status run_step(struct model *m, struct kv_store *kv, const struct batch *b,
                             float *logits_out, struct model_sample *smp, float *hidden,
                             int32_t *n_out_p, const float *hidden_in, float *hidden_out,
                             struct err *e);

smelt_status model_step(struct model *m, struct kv_store *kv, const struct batch *b,
                        float *logits_out, struct model_sample *smp, int32_t *n_out_p,
                        struct err *e) {
    return run_step(m, kv, b, logits_out, smp, NULL, n_out_p, NULL, NULL, e);
}

smelt_status model_step_hidden(struct model *m, struct kv_store *kv, const struct batch *b,
                               float *hidden, int32_t *n_out_p, struct err *e) {
    if (!hidden) return err_set(e, SMELT_ERR_INVALID, "model_step_hidden: no output buffer");
    return run_step(m, kv, b, NULL, NULL, hidden, n_out_p, NULL, NULL, e);
}

smelt_status model_step_mtp(struct model *m, struct kv_store *kv, const struct batch *b,
                            float *logits_out, struct model_sample *smp, int32_t *n_out_p,
                            const float *hidden_in, float *hidden_out, struct err *e) {
    return run_step(m, kv, b, logits_out, smp, NULL, n_out_p, hidden_in, hidden_out, e);
}

/* The step: logits (model_step) or, with hidden, the output rows' final hidden states
 * (model_step_hidden); hidden_in / hidden_out: model_step_mtp's. */
static smelt_status run_step(struct model *m, struct kv_store *kv, const struct batch *b,
                             float *logits_out, struct model_sample *smp, float *hidden,
                             int32_t *n_out_p, const float *hidden_in, float *hidden_out,
                             struct err *e) {
    if (n_out_p) *n_out_p = 0;
    if (m->arch->reads_hidden && !hidden_in)
        return err_set(e, SMELT_ERR_INVALID, "%s: a step needs the trunk's hidden states",
                       m->hp.arch);
    m->last_logits = NULL;
    m->last_n_out = 0;
    smelt_status st = check_batch(m, kv, b, e);
    if (st != SMELT_OK) return st;
    struct backend *bk = m->bk;
    int32_t n = b->n_tokens;
    /* Host staging: KV slots, output rows, the block tables padded to a rectangle, the
     * recurrent layers' rows and slots per sequence. */
    arena_reset(&m->host);
    int32_t *swords = NULL;
    if (kv->n_slots > 0) {
        swords = arena_alloc(&m->host, (size_t)b->n_seqs * STATE_SEQ_WORDS * sizeof(int32_t));
        if (!swords) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        st = check_state(m, kv, b, swords, e);
        if (st != SMELT_OK) return st;
    }
    int32_t max_blocks = 1;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].n_blocks > max_blocks) max_blocks = b->seqs[s].n_blocks;
    /* The table's width is part of the step's shape (its graph key): round it up so a
     * growing context keeps one shape for 16 blocks at a time. */
    max_blocks = (max_blocks + 15) / 16 * 16;
    int32_t *n_keys = NULL;
    if (!m->hp.causal) {
        n_keys = arena_alloc(&m->host, (size_t)b->n_seqs * sizeof(int32_t));
        if (!n_keys) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        if ((st = check_whole(m, b, n_keys, e)) != SMELT_OK) return st;
    }
    int32_t *slot = arena_alloc(&m->host, (size_t)n * sizeof(int32_t));
    int32_t *rows = arena_alloc(&m->host, (size_t)n * sizeof(int32_t));
    int32_t *tables = arena_calloc(&m->host, (size_t)max_blocks * (size_t)b->n_seqs * sizeof(int32_t));
    if (!slot || !rows || !tables) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    /* a decode step: every sequence has exactly one row */
    bool one_per_seq = n == b->n_seqs && !hidden_in && !hidden_out;
    if (one_per_seq) {
        uint8_t *seen = arena_calloc(&m->host, (size_t)n);
        if (!seen) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        for (int32_t i = 0; i < n && one_per_seq; i++) one_per_seq = !seen[b->seq[i]]++;
    }
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct batch_seq *q = &b->seqs[b->seq[i]];
        int32_t p = b->pos[i];
        slot[i] = q->blocks[p / kv->block_size] * kv->block_size + p % kv->block_size;
        if (b->logits ? b->logits[i] != 0 : i == n - 1) rows[n_out++] = i;
    }
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].n_blocks)
            memcpy(tables + (size_t)s * max_blocks, b->seqs[s].blocks,
                   (size_t)b->seqs[s].n_blocks * sizeof(int32_t));
    if (!hidden && n_out > 0 && !m->output)
        return err_set(e, SMELT_ERR_INVALID, "batch row %d asks for logits, but %s has no output "
                       "head: it is an embedding model (its output is hidden states)", rows[0],
                       m->hp.arch);
    if (hidden) smp = NULL;
    /* masked rows: [mask_r0, mask_r1) holds every row with a token mask */
    int32_t mask_r0 = 0, mask_r1 = 0;
    if (smp) {
        st = check_sample(m, smp, n_out, e);
        if (st != SMELT_OK) return st;
        if (n_out == 0) smp = NULL;
        for (int32_t r = 0; smp && r < n_out; r++)
            if (smp->rows[r].k > 0 && (smp->rows[r].flags & TOPK_MASK)) {
                if (mask_r1 == 0) mask_r0 = r;
                mask_r1 = r + 1;
            }
    }
    bool masked = mask_r1 > 0;
    /* Summaries on the device, or (a backend without the op) of rows brought here. */
    bool dev_topk = smp && bk_has_logits_topk(bk);
    size_t row_bytes = (size_t)m->hp.n_vocab * sizeof(float);
    if (smp && !dev_topk && !logits_out) {
        size_t need = row_bytes * (size_t)n_out;
        if (!array_grow((void **)&m->host_rows, &m->host_rows_cap, need, 1))
            return err_set(e, SMELT_ERR_NOMEM, "out of memory (%d logit rows)", n_out);
    }

    bk_step_begin(bk);
    struct step s = {.bk = bk, .kv = kv, .n_tokens = n, .n_out = n_out, .keep_all = hidden_out};
    size_t hid_bytes = (size_t)m->hp.n_embd * (size_t)n * sizeof(float);
    if (hidden_in) {
        s.hidden = bk_new(bk, QT_F32, m->hp.n_embd, n, 1);
        bk_upload(bk, s.hidden, hidden_in, hid_bytes);
    }
    s.token = upload_i32(bk, b->token, n);
    s.meta.pos = upload_i32(bk, b->pos, n);
    s.meta.seq = upload_i32(bk, b->seq, n);
    s.meta.slot = upload_i32(bk, slot, n);
    struct tensor *tb = bk_new(bk, QT_I32, max_blocks, b->n_seqs, 1);
    bk_upload(bk, tb, tables, (size_t)max_blocks * (size_t)b->n_seqs * sizeof(int32_t));
    s.meta.blocks = tb;
    s.meta.block_size = kv->block_size;
    s.meta.one_per_seq = one_per_seq;
    if (n_keys) s.meta.n_keys = upload_i32(bk, n_keys, b->n_seqs);
    if (n_out) s.out_rows = upload_i32(bk, rows, n_out);
    if (swords) {
        s.state_seqs = bk_new(bk, QT_I32, STATE_SEQ_WORDS, b->n_seqs, 1);
        bk_upload(bk, s.state_seqs, swords, (size_t)b->n_seqs * STATE_SEQ_WORDS * sizeof(int32_t));
    }
    /* The sampling inputs and the summaries: fixed sizes for the step's shape, allocated
     * before the ops so a replayed graph finds them at the same addresses. */
    int32_t adj_cap = dev_topk ? model_adj_cap(n_out) : 0;
    const int64_t mask_words = topk_mask_words(m->hp.n_vocab);
    struct tensor *topk_rows = NULL, *topk_adj = NULL, *topk_out = NULL, *topk_mask = NULL;
    if (dev_topk) {
        topk_rows = bk_new(bk, QT_I32, TOPK_ROW_WORDS, n_out, 1);
        topk_adj = bk_new(bk, QT_I32, TOPK_ADJ_WORDS, adj_cap, 1);
        topk_out = bk_new(bk, QT_I32, topk_out_words(n_out, adj_cap), 1, 1);
        if (masked) topk_mask = bk_new(bk, QT_I32, mask_words, n_out, 1);
        bk_upload(bk, topk_rows, smp->rows, (size_t)n_out * sizeof(struct topk_row));
        if (smp->n_adj)
            bk_upload(bk, topk_adj, smp->adj, (size_t)smp->n_adj * sizeof(struct logit_adj));
    }

    /* The ops below depend only on this key (see bk_graph_replay): a backend with graphs
     * replays them, and the logits land where the recording left them. Only decode steps
     * (one row per sequence) go through graphs: their shape repeats for 16 blocks of
     * context at a time, while a step with a prefill chunk almost never meets its shape
     * again (its row count and table width move with every prompt), so recording it would
     * cost a capture for nothing. The KV store's id stands for the model and its caches:
     * not its address, which a store allocated after this one is freed can get (a graph
     * recorded with a freed model's weights replayed for the next model; seen in
     * test_cuda_forward, which loads the fixtures one by one).
     * A step with token masks keeps the summaries out of its graph: the masks are written
     * while the device runs the forward (fill_masks), then uploaded, then summarized. */
    const bool topk_in_graph = dev_topk && !masked;
    const uint64_t shape[] = {
        (uint64_t)n,          (uint64_t)n_out, (uint64_t)b->n_seqs,
        (uint64_t)max_blocks, kv->id,          (uint64_t)dev_topk + 2 * (uint64_t)masked,
        (uint64_t)one_per_seq};
    uint64_t key = 0;
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) key = mix64((key + 0x9e3779b97f4a7c15ull) ^ shape[i]);
    struct step_graph *sg = NULL;
    /* (embedding steps are prefills: never replayed; experts on the host wait for the
     * device mid-step, which a graph cannot) */
    bool graph = one_per_seq && !hidden && !m->host_bk;
    for (int i = 0; i < MODEL_GRAPHS && graph; i++)
        if (m->graphs[i].used && m->graphs[i].key == key) sg = &m->graphs[i];
    void *logits_data = NULL;
    if (hidden) {
        struct tensor *x = m->arch->forward(m, &s); /* (n_embd, n_tokens) */
        if (n_out) {
            struct tensor *xo = x; /* (n_embd, n_out) */
            if (!s.out_gathered) {
                xo = bk_new(bk, QT_F32, m->hp.n_embd, n_out, 1);
                bk_get_rows(bk, xo, x, s.out_rows);
            }
            if (m->output_norm) bk_rms_norm(bk, xo, xo, m->output_norm, m->hp.norm_eps);
            bk_download(bk, hidden, xo, (size_t)n_out * (size_t)m->hp.n_embd * sizeof(float));
        }
    } else if (sg && bk_graph_replay(bk, key)) {
        logits_data = sg->logits;
    } else {
        if (graph) bk_graph_begin(bk, key);
        struct tensor *x = m->arch->forward(m, &s); /* (n_embd, n_tokens) */
        if (hidden_out) {
            struct tensor *h = bk_new(bk, QT_F32, m->hp.n_embd, n, 1);
            bk_rms_norm(bk, h, x, m->output_norm, m->hp.norm_eps);
            bk_download(bk, hidden_out, h, hid_bytes);
        }
        if (n_out) {
            struct tensor *xo = x; /* (n_embd, n_out) when the last layer kept only them */
            if (!s.out_gathered) {
                xo = bk_new(bk, QT_F32, m->hp.n_embd, n_out, 1);
                bk_get_rows(bk, xo, x, s.out_rows);
            }
            /* logits = W_out rms_norm(x) * output_norm (a backend may have the normed input
             * prepared by the last layer's product: bk_matmul_acc's hint) */
            const struct prenorm pre = {m->output_norm, m->hp.norm_eps};
            struct tensor *lg = bk_new(bk, QT_F32, m->hp.n_vocab, n_out, 1); /* (n_vocab, n_out) */
            bk_matmul_group(bk, 1, &lg, &m->output, NULL, xo, &pre);
            if (m->hp.final_softcap > 0) bk_softcap(bk, lg, m->hp.final_softcap);
            if (topk_in_graph) bk_logits_topk(bk, topk_out, lg, topk_rows, topk_adj, NULL);
            logits_data = lg->data;
        }
        if (graph) {
            bk_graph_end(bk);
            if (!sg) { /* remember where this shape's logits are (round-robin over the slots) */
                sg = &m->graphs[m->next_graph++ % MODEL_GRAPHS];
                sg->used = true;
                sg->key = key;
            }
            sg->logits = logits_data;
        }
    }
    struct tensor lt;
    if (n_out && !hidden) {
        tensor_init(&lt, QT_F32, m->hp.n_vocab, n_out, 1, 1);
        lt.data = logits_data;
        lt.backend = bk;
    }
    /* the masks: written now, while an asynchronous device runs the forward */
    if (masked && smp->fill_masks) smp->fill_masks(smp->fill_ctx);
    if (dev_topk && masked) {
        struct tensor *mv = bk_view_2d(bk, topk_mask, mask_words, mask_r1 - mask_r0,
                                       (size_t)mask_words * 4, (size_t)mask_r0 * mask_words * 4);
        bk_upload(bk, mv, smp->mask + (size_t)mask_r0 * mask_words,
                  (size_t)(mask_r1 - mask_r0) * mask_words * 4);
        bk_logits_topk(bk, topk_out, &lt, topk_rows, topk_adj, topk_mask);
    }
    float *rows_here = logits_out ? logits_out : smp && !dev_topk ? m->host_rows : NULL;
    if (n_out && rows_here && !hidden) bk_download(bk, rows_here, &lt, (size_t)n_out * row_bytes);
    if (dev_topk) {
        /* the summaries; the candidates only when a row has more than one; the raw
         * logits of the adjusted tokens only when there are some */
        bool any_cand = false;
        for (int32_t r = 0; r < n_out; r++) any_cand |= smp->rows[r].k > 1;
        struct tensor *o = topk_out;
        bk_download(bk, smp->sum, o, (size_t)n_out * sizeof(struct topk_summary));
        if (any_cand) {
            int64_t words = (int64_t)n_out * TOPK_MAX * 2;
            struct tensor *c = bk_view_2d(bk, o, words, 1, (size_t)words * 4,
                                          (size_t)topk_cand_word(n_out) * 4);
            bk_download(bk, smp->cand, c, (size_t)words * 4);
        }
        if (smp->n_adj && smp->adj_raw) {
            struct tensor *r = bk_view_2d(bk, o, smp->n_adj, 1, (size_t)smp->n_adj * 4,
                                          (size_t)topk_raw_word(n_out) * 4);
            bk_download(bk, smp->adj_raw, r, (size_t)smp->n_adj * sizeof(float));
        }
    }
    st = bk_sync(bk, e);
    /* what each state slot covers now (unknown after a failed step) */
    for (int32_t q = 0; swords && q < b->n_seqs; q++) {
        const int32_t *w = swords + q * STATE_SEQ_WORDS;
        if (w[STATE_NROWS] == 0) continue;
        int32_t p1 = b->pos[w[STATE_ROW0]] + w[STATE_NROWS];
        kv->slot_pos[w[STATE_SLOT]] = st == SMELT_OK ? p1 : -1;
        if (w[STATE_SNAP_AT] >= 0)
            kv->slot_pos[w[STATE_SNAP_SLOT]] =
                st == SMELT_OK ? b->pos[w[STATE_ROW0]] + w[STATE_SNAP_AT] : -1;
    }
    if (st != SMELT_OK) return err_prefix(e, "forward");
    if (smp && !dev_topk) {
        for (int32_t r = 0; r < n_out; r++) {
            const struct topk_row *q = &smp->rows[r];
            topk_summarize_row(rows_here + (size_t)r * m->hp.n_vocab, m->hp.n_vocab, q,
                               smp->adj ? smp->adj + q->adj_off : NULL,
                               smp->mask ? smp->mask + (size_t)r * mask_words : NULL, &smp->sum[r],
                               smp->cand + (size_t)r * TOPK_MAX,
                               smp->adj_raw ? smp->adj_raw + q->adj_off : NULL);
        }
    }
    m->last_logits = logits_data;
    m->last_n_out = n_out;
    if (n_out_p) *n_out_p = n_out;
    return SMELT_OK;
}

smelt_status model_fetch_rows(struct model *m, int32_t first, int32_t count, float *dst,
                              struct err *e) {
    if (!m->last_logits || first < 0 || count < 0 || count > m->last_n_out - first)
        return err_set(e, SMELT_ERR_INVALID, "logit rows [%d, +%d): the last step has %d", first,
                       count, m->last_n_out);
    if (count == 0) return SMELT_OK;
    size_t row_bytes = (size_t)m->hp.n_vocab * sizeof(float);
    struct tensor lt;
    tensor_init(&lt, QT_F32, m->hp.n_vocab, count, 1, 1);
    lt.data = (char *)m->last_logits + (size_t)first * row_bytes;
    lt.backend = m->bk;
    bk_download(m->bk, dst, &lt, (size_t)count * row_bytes);
    smelt_status st = bk_sync(m->bk, e);
    return st != SMELT_OK ? err_prefix(e, "fetching logit rows") : SMELT_OK;
}

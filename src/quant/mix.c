/* Quantization mixes (see mix.h). The per-tensor rules follow llama.cpp's
 * llama_tensor_get_type_impl for the file types listed in `mixes` below, for a model
 * quantized without an importance matrix (so the IQ1/IQ2/IQ3 file types, which require
 * one, are not offered). Rules that depend on the model:
 *   - output.weight (or token_embd.weight when the embedding is tied): Q6_K unless the
 *     mix is Q8_0 / MXFP4_MOE (Q8_0), or its row does not fit the base type's block (Q8_0);
 *   - attn_v (and attn_qkv, attn_kv_b) and ffn_down: more bits on some layers, where
 *     use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2;
 *   - attn_output for Q2_K and Q3_K_*; 8-expert MoE and 70B-llama special cases;
 *   - a row length that is not a multiple of the chosen type's block falls back:
 *     IQ4_XS -> IQ4_NL, Q2_K/Q3_K/TQ1_0/TQ2_0 -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
 *     Q6_K -> Q8_0, and to F16 when even that does not fit.
 */
#include "quant/mix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct quant_mix mixes[] = {
    {"F32", QF_ALL_F32, QT_F32, false},      {"F16", QF_F16, QT_F16, false},
    {"BF16", QF_BF16, QT_BF16, false},       {"Q4_0", QF_Q4_0, QT_Q4_0, false},
    {"Q4_1", QF_Q4_1, QT_Q4_1, false},       {"Q5_0", QF_Q5_0, QT_Q5_0, false},
    {"Q5_1", QF_Q5_1, QT_Q5_1, false},       {"Q8_0", QF_Q8_0, QT_Q8_0, false},
    {"Q2_K", QF_Q2_K, QT_Q2_K, false},       {"Q3_K_S", QF_Q3_K_S, QT_Q3_K, false},
    {"Q3_K_M", QF_Q3_K_M, QT_Q3_K, false},   {"Q3_K_L", QF_Q3_K_L, QT_Q3_K, false},
    {"Q4_K_S", QF_Q4_K_S, QT_Q4_K, false},   {"Q4_K_M", QF_Q4_K_M, QT_Q4_K, false},
    {"Q5_K_S", QF_Q5_K_S, QT_Q5_K, false},   {"Q5_K_M", QF_Q5_K_M, QT_Q5_K, false},
    {"Q6_K", QF_Q6_K, QT_Q6_K, false},       {"IQ4_NL", QF_IQ4_NL, QT_IQ4_NL, false},
    {"IQ4_XS", QF_IQ4_XS, QT_IQ4_XS, false}, {"TQ1_0", QF_TQ1_0, QT_TQ1_0, false},
    {"TQ2_0", QF_TQ2_0, QT_TQ2_0, false},    {"MXFP4_MOE", QF_MXFP4_MOE, QT_MXFP4, false},
    {"NVFP4", QF_NVFP4, QT_NVFP4, false},    {"Q1_0", QF_Q1_0, QT_Q1_0, false},
};

static const struct {
    const char *alias, *name;
} aliases[] = {{"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}, {"MXFP4", "MXFP4_MOE"}};

const char *quant_mix_names(void) {
    return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M (Q3_K), Q3_K_L, "
           "Q4_K_S, Q4_K_M (Q4_K), Q5_K_S, Q5_K_M (Q5_K), Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, "
           "MXFP4_MOE (MXFP4), NVFP4, Q1_0";
}

smelt_status quant_mix_find(const char *name, struct quant_mix *out, struct err *e) {
    if (!name) return err_set(e, SMELT_ERR_INVALID, "no type given");
    const char *canon = name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcasecmp(name, aliases[i].alias)) canon = aliases[i].name;
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        if (!strcasecmp(canon, mixes[i].name)) {
            *out = mixes[i];
            return SMELT_OK;
        }
    }
    enum qtype t;
    if (qtype_from_name(name, &t)) {
        if (t == QT_Q8_1 || t == QT_Q8_K)
            return err_set(e, SMELT_ERR_UNSUPPORTED,
                           "%s is an activation format (used inside matmuls), not a weight type",
                           qtype_name(t));
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "%s cannot be a target: its quantizer needs an importance matrix and is not "
                       "implemented (accepted: %s)",
                       qtype_name(t), quant_mix_names());
    }
    return err_set(e, SMELT_ERR_INVALID, "unknown type '%s' (accepted: %s)", name,
                   quant_mix_names());
}

/* ---- tensor categories (llama.cpp tensor_get_category) ---- */

enum cat { C_TOKEN_EMBD, C_ATTN_Q, C_ATTN_V, C_ATTN_K, C_ATTN_QKV, C_ATTN_KV_B, C_ATTN_OUTPUT,
           C_FFN_UP, C_FFN_GATE, C_FFN_DOWN, C_OUTPUT, C_OTHER };

static enum cat category(const char *n) {
    if (!strcmp(n, "output.weight")) return C_OUTPUT;
    if (!strcmp(n, "token_embd.weight") || !strcmp(n, "per_layer_token_embd.weight"))
        return C_TOKEN_EMBD;
    if (strstr(n, "attn_qkv.weight")) return C_ATTN_QKV;
    if (strstr(n, "attn_kv_b.weight")) return C_ATTN_KV_B;
    if (strstr(n, "attn_v.weight")) return C_ATTN_V;
    if (strstr(n, "attn_k.weight")) return C_ATTN_K;
    if (strstr(n, "attn_q.weight")) return C_ATTN_Q;
    if (strstr(n, "attn_output.weight")) return C_ATTN_OUTPUT;
    if (strstr(n, "ffn_up")) return C_FFN_UP;
    if (strstr(n, "ffn_gate")) return C_FFN_GATE;
    if (strstr(n, "ffn_down")) return C_FFN_DOWN;
    return C_OTHER;
}

static bool is_attn_v(enum cat c) { return c == C_ATTN_V || c == C_ATTN_QKV || c == C_ATTN_KV_B; }

void quant_mix_model_count(struct quant_mix_model *m, const char *name) {
    enum cat c = category(name);
    if (is_attn_v(c)) m->n_attn_v++;
    if (c == C_OUTPUT) m->has_output = true;
}

void quant_mix_begin(struct quant_mix_state *s, const struct quant_mix *mix,
                     const struct quant_mix_model *model) {
    memset(s, 0, sizeof *s);
    s->mix = *mix;
    s->model = *model;
}

bool quant_mix_allows(const char *name, uint32_t n_dims) {
    if (n_dims < 2) return false;
    size_t len = strlen(name);
    if (len < 6 || strcmp(name + len - 6, "weight")) return false;
    static const char *const never[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
        "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
        "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
        "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
        ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
        ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    };
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (strstr(name, never[i])) return false;
    if (!strcmp(name, "position_embd.weight") || !strcmp(name, "token_types.weight")) return false;
    return true;
}

static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int layer_of(const char *name) {
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) return -1;
    return l;
}

int quant_mix_order_cmp(const char *a, const char *b) {
    int la = layer_of(a), lb = layer_of(b);
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a, b);
}

static bool is_quantized(enum qtype t) { return qtype_get(t) && qtype_get(t)->blck_size > 1; }

/* llama_tensor_get_type_impl for the supported file types; see the file comment. */
static enum qtype rules(struct quant_mix_state *s, const char *name, const int64_t *ne,
                        uint32_t n_dims, enum qtype t, const char **why) {
    const enum quant_ftype f = s->mix.ftype;
    const struct quant_mix_model *m = &s->model;
    const int gqa = m->n_head > 0 && m->n_head_kv > 0 ? m->n_head / m->n_head_kv : 1;
    const enum cat c = category(name);
    const enum qtype t0 = t;
    if (c == C_OUTPUT || (!m->has_output && c == C_TOKEN_EMBD)) {
        if (f == QF_MXFP4_MOE || m->falcon || ne[0] % qtype_get(t)->blck_size) t = QT_Q8_0;
        else if (t != QT_Q8_0) t = QT_Q6_K;
        if (t != t0) *why = "output";
    } else if (f == QF_MXFP4_MOE) {
        t = n_dims > 2 && ne[2] > 1 ? QT_MXFP4 : QT_Q8_0;
        if (t != t0) *why = "MXFP4_MOE: dense tensor";
    } else if (c == C_TOKEN_EMBD) {
        if (f == QF_TQ1_0 || f == QF_TQ2_0) t = QT_Q4_K;
        if (t != t0) *why = "token_embd";
    } else if (is_attn_v(c)) {
        const int i = s->i_attn_v, n = m->n_attn_v;
        if (f == QF_Q2_K) t = gqa >= 4 ? QT_Q4_K : QT_Q3_K;
        else if (f == QF_Q3_K_M) t = i < 2 ? QT_Q5_K : QT_Q4_K;
        else if (f == QF_Q3_K_L) t = QT_Q5_K;
        else if ((f == QF_IQ4_NL || f == QF_IQ4_XS) && gqa >= 4) t = QT_Q5_K;
        else if ((f == QF_Q4_K_M || f == QF_Q5_K_M) && more_bits(i, n)) t = QT_Q6_K;
        else if (f == QF_Q4_K_S && i < 4) t = QT_Q5_K;
        if (m->is_70b && (t == QT_Q3_K || t == QT_Q4_K)) t = QT_Q5_K;
        if (m->n_expert == 8) t = QT_Q8_0;
        s->i_attn_v++;
        if (t != t0) *why = "attn_v: more bits";
    } else if (c == C_ATTN_K) {
        if (m->n_expert == 8) t = QT_Q8_0;
        if (t != t0) *why = "attn_k: 8 experts";
    } else if (c == C_FFN_DOWN) {
        int i = s->i_ffn_down;
        const int n = m->n_layer;
        if (m->n_expert > 1) i = layer_of(name);
        if (f == QF_Q2_K) t = QT_Q3_K;
        else if (f == QF_Q3_K_M)
            t = i < n / 16 ? QT_Q5_K : (!m->falcon || more_bits(i, n)) ? QT_Q4_K : QT_Q3_K;
        else if (f == QF_Q3_K_L) t = m->falcon ? QT_Q4_K : QT_Q5_K;
        else if (f == QF_Q4_K_M) {
            if (m->falcon) t = i < n / 16 ? QT_Q6_K : more_bits(i, n) ? QT_Q5_K : QT_Q4_K;
            else if (more_bits(i, n)) t = QT_Q6_K;
        } else if (i < n / 8 && (f == QF_IQ4_NL || f == QF_IQ4_XS)) t = QT_Q5_K;
        else if (f == QF_Q5_K_M && more_bits(i, n)) t = QT_Q6_K;
        else if (f == QF_Q4_K_S && !m->falcon && i < n / 8) t = QT_Q5_K;
        s->i_ffn_down++;
        if (t != t0) *why = "ffn_down: more bits";
    } else if (c == C_ATTN_OUTPUT) {
        if (!m->falcon) {
            if (m->n_expert == 8) {
                if (f == QF_Q2_K || f == QF_Q3_K_S || f == QF_Q3_K_M || f == QF_IQ4_NL ||
                    f == QF_Q4_K_S || f == QF_Q4_K_M || f == QF_IQ4_XS)
                    t = QT_Q5_K;
            } else if (f == QF_Q2_K) t = QT_Q3_K;
            else if (f == QF_Q3_K_M) t = QT_Q4_K;
            else if (f == QF_Q3_K_L) t = QT_Q5_K;
        } else if (f == QF_Q3_K_L) t = QT_Q4_K;
        if (t != t0) *why = "attn_output";
    } else if (c == C_FFN_GATE) {
        s->i_ffn_gate++;
    } else if (c == C_FFN_UP) {
        s->i_ffn_up++;
    }
    return t;
}

smelt_status quant_mix_next(struct quant_mix_state *s, const char *name, uint32_t n_dims,
                            const int64_t *ne, uint32_t cur_type, uint32_t *out_type,
                            const char **why, struct err *e) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    /* dimensions as ggml counts them (ggml_n_dims): trailing 1s do not count, so a (n, 1)
     * tensor (a shared expert's gate, ffn_gate_inp_shexp) is a vector and stays as is */
    while (n_dims > 1 && ne[n_dims - 1] == 1) n_dims--;
    if (!quant_mix_allows(name, n_dims)) {
        *out_type = cur_type;
        return SMELT_OK;
    }
    enum qtype t = s->mix.base;
    if (!is_quantized(t)) {
        *out_type = t;
        return SMELT_OK;
    }
    if (!s->mix.pure) t = rules(s, name, ne, n_dims, t, why);
    if (ne[0] % qtype_get(t)->blck_size) {
        enum qtype fb;
        switch (t) {
        case QT_IQ4_XS: fb = QT_IQ4_NL; break;
        case QT_Q2_K:
        case QT_Q3_K:
        case QT_TQ1_0:
        case QT_TQ2_0: fb = QT_Q4_0; break;
        case QT_Q4_K: fb = QT_Q5_0; break;
        case QT_Q5_K: fb = QT_Q5_1; break;
        case QT_Q6_K: fb = QT_Q8_0; break;
        default:
            return err_set(e, SMELT_ERR_UNSUPPORTED,
                           "tensor %s: row length %lld is not a multiple of %s's block (%u) and "
                           "there is no fallback type for %s",
                           name, (long long)ne[0], qtype_name(t), qtype_get(t)->blck_size,
                           qtype_name(t));
        }
        if (ne[0] % qtype_get(fb)->blck_size) fb = QT_F16;
        s->n_fallback++;
        *why = "row not a multiple of the block: fallback";
        t = fb;
    }
    *out_type = t;
    return SMELT_OK;
}

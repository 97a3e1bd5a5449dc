/* Random-weight model presets and generator (see random_model.h).
 *
 * Shapes: llama3-8b/1b, qwen2.5-0.5b/7b, qwen3-8b and tiny are mkmodel.py's PRESETS.
 * Gemma 3 (public configs google/gemma-3-270m and -1b, and the layout of a real
 * llama.cpp gemma3 GGUF): 270m: n_embd 640, 18 layers, 4 heads, 1 KV head, head_dim 256,
 * n_ff 2048; 1b: 1152, 26 layers, 4 heads, 1 KV head, head_dim 256, n_ff 6912; both
 * vocab 262144, sliding window 512, rope base 1e6, tied embeddings, Q/K norms and the
 * post-attention / post-FFN norms.
 * Qwen3-30B-A3B (public config Qwen/Qwen3-30B-A3B, and llama.cpp's qwen3moe GGUF layout):
 * n_embd 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128 (so key_length is written:
 * 32 * 128 != 2048), feed_forward_length 6144, 128 experts of 768 with 8 per token, no
 * shared expert, Q/K norms, rope base 1e6, untied output, vocab 151936. Experts are 3-D
 * tensors ffn_{gate,up}_exps (2048, 768, 128) and ffn_down_exps (768, 2048, 128) and the
 * router ffn_gate_inp (2048, 128) is F32; `smelt quantize` then gives them llama.cpp's
 * Q4_K_M types (experts' gate/up Q4_K, down Q6_K on the more-bits layers else Q4_K).
 * tiny-moe: tiny's attention with qwen3moe's Q/K norms and 16 experts of 256, 4 per token.
 * gpt-oss-20b / -120b (public configs openai/gpt-oss-20b and -120b, llama.cpp's gpt-oss GGUF
 * layout): n_embd 2880, 24 / 36 layers, 64 heads of 64 (key_length written), 8 KV heads,
 * 32 / 128 experts of 2880 with 4 per token, rope base 150000 with YaRN factor 32 over
 * 4096, window 128 on the even layers, vocab 201088, untied output; Q/K/V/O biases,
 * attn_sinks (F32), post_attention_norm as the FFN's norm, a router with a bias and expert
 * biases {2880, n_expert} (F32: biases are never quantized). `smelt quantize ... MXFP4_MOE`
 * gives the layout of the MXFP4 files llama.cpp's converter writes (ggml-org's
 * gpt-oss-20b-mxfp4.gguf): experts MXFP4, every other matrix Q8_0, router and vectors F32.
 * tiny-gpt-oss: gpt-oss's block at tiny's size, 16 experts of 256, 4 per token.
 */
#include "cli/random_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/mix.h"

/* Qwen3.5-9B (the official model card and a llama.cpp GGUF's metadata): 32 layers of
 * 4096, 8 x (3 Gated DeltaNet + 1 gated attention); DeltaNet 16 QK heads and 32 V heads of
 * 128, conv kernel 4; attention 16 / 4 heads of 256, 64 rotary dims (mrope sections
 * 11, 11, 10), rope base 1e7; FFN 12288; vocab 248320; untied output; one MTP layer. */
static const struct rm_hybrid qwen35_9b = {4, 16, 32, 128, 128, 4, 64, {11, 11, 10, 0}, 1, 0};
/* Qwen3.5-35B-A3B and Qwen3.6-35B-A3B (the same shape; their config.json and a llama.cpp
 * qwen35moe GGUF's metadata): 40 layers of 2048, 10 x (3 Gated DeltaNet + 1 gated
 * attention); DeltaNet 16 QK heads and 32 V heads of 128, conv kernel 4; attention 16 / 2
 * heads of 256, 64 rotary dims (sections 11, 11, 10), rope base 1e7; every FFN 256
 * experts of 512, 8 per token, plus a shared expert of 512 with its gate; no dense FFN
 * width (no feed_forward_length key); vocab 248320; untied output; one MTP layer (MoE
 * too). tiny-qwen35moe: the same at 256 wide, 4 layers, 16 experts of 256, 4 per token. */
static const struct rm_hybrid qwen35_35b = {4, 16, 32, 128, 128, 4, 64, {11, 11, 10, 0}, 1, 512};
static const struct rm_hybrid qwen35_tiny = {4, 2, 4, 64, 64, 4, 16, {3, 3, 2, 0}, 1, 256};

static const struct rm_preset presets[] = {
    /* name, arch, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, vocab, rope, tied,
     * qkv_bias, qk_norm, gemma, swa, n_expert, n_expert_used, n_ff_exp, hybrid, oai */
    {"llama3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 500000.f, false, false, false, false, 0, 0, 0, 0, NULL, false},
    {"llama3-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 500000.f, true, false, false, false, 0, 0, 0, 0, NULL, false},
    {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 1000000.f, true, true, false, false, 0, 0, 0, 0, NULL, false},
    {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 1000000.f, false, true, false, false, 0, 0, 0, 0, NULL, false},
    {"qwen3-8b", "qwen3", 4096, 36, 32, 8, 128, 12288, 151936, 1000000.f, false, false, true, false, 0, 0, 0, 0, NULL, false},
    {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 128, 6144, 151936, 1000000.f, false, false, true, false, 0,
     128, 8, 768, NULL, false},
    {"gemma3-270m", "gemma3", 640, 18, 4, 1, 256, 2048, 262144, 1000000.f, true, false, true, true, 512, 0, 0, 0, NULL, false},
    {"gemma3-1b", "gemma3", 1152, 26, 4, 1, 256, 6912, 262144, 1000000.f, true, false, true, true, 512, 0, 0, 0, NULL, false},
    {"qwen3.5-9b", "qwen35", 4096, 32, 16, 4, 256, 12288, 248320, 10000000.f, false, false, true,
     false, 0, 0, 0, 0, &qwen35_9b, false},
    {"qwen3.5-35b-a3b", "qwen35moe", 2048, 40, 16, 2, 256, 0, 248320, 10000000.f, false, false,
     true, false, 0, 256, 8, 512, &qwen35_35b, false},
    {"tiny", "llama", 256, 2, 4, 2, 64, 512, 1000, 10000.f, false, false, false, false, 0, 0, 0, 0, NULL, false},
    {"tiny-moe", "qwen3moe", 256, 2, 4, 2, 64, 512, 1000, 10000.f, false, false, true, false, 0, 16, 4, 256, NULL, false},
    {"tiny-qwen35moe", "qwen35moe", 256, 4, 4, 2, 64, 0, 1000, 10000.f, false, false, true, false,
     0, 16, 4, 256, &qwen35_tiny, false},
    {"gpt-oss-20b", "gpt-oss", 2880, 24, 64, 8, 64, 2880, 201088, 150000.f, false, true, false, false, 128, 32, 4,
     2880, NULL, true},
    {"gpt-oss-120b", "gpt-oss", 2880, 36, 64, 8, 64, 2880, 201088, 150000.f, false, true, false, false, 128, 128,
     4, 2880, NULL, true},
    {"tiny-gpt-oss", "gpt-oss", 256, 2, 4, 2, 64, 256, 1000, 150000.f, false, true, false, false, 128, 16, 4, 256, NULL,
     true},
};

const struct rm_preset *rm_preset_find(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

const char *rm_preset_names(void) {
    return "llama3-8b, llama3-1b, qwen2.5-0.5b, qwen2.5-7b, qwen3-8b, qwen3-30b-a3b, qwen3.5-9b, "
           "qwen3.5-35b-a3b, gpt-oss-20b, gpt-oss-120b, gemma3-270m, gemma3-1b, tiny, tiny-moe, "
           "tiny-qwen35moe, tiny-gpt-oss";
}

struct tlist {
    struct rm_tensor *v;
    int64_t n;
    size_t cap;
    bool oom;
};

static void add3(struct tlist *l, const char *name, enum rm_kind kind, int64_t ne0, int64_t ne1,
                 int64_t ne2) {
    if (l->oom) return;
    if (!array_grow((void **)&l->v, &l->cap, (size_t)l->n + 1, sizeof *l->v)) {
        l->oom = true;
        return;
    }
    struct rm_tensor *t = &l->v[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 || kind == RM_MATRIX || kind == RM_ROUTER ? 2 : 1;
    if (t->n_dims == 1) t->ne[1] = 1;
}

static void add(struct tlist *l, const char *name, enum rm_kind kind, int64_t ne0, int64_t ne1) {
    add3(l, name, kind, ne0, ne1, 1);
}

/* Layer i's MoE FFN: the router, then n_expert stacked matrices per projection (gpt-oss:
 * with the router's and the experts' biases), then the shared expert and its gate
 * (n_embd, 1) where the model has one. */
static void add_moe(struct tlist *l, const struct rm_preset *p, int i) {
    const int64_t d = p->n_embd, fe = p->n_ff_exp, ne = p->n_expert;
    const int64_t fs = p->hybrid ? p->hybrid->n_ff_shexp : 0;
    static const char *const proj[3] = {"gate", "up", "down"};
    char nm[64];
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", i);
    add(l, nm, RM_ROUTER, d, ne);
    if (p->oai) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.bias", i);
        add(l, nm, RM_BIAS, ne, 1);
    }
    for (int j = 0; j < 3; j++) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_%s_exps.weight", i, proj[j]);
        add3(l, nm, RM_MATRIX, j < 2 ? d : fe, j < 2 ? fe : d, ne);
        if (!p->oai) continue;
        snprintf(nm, sizeof nm, "blk.%d.ffn_%s_exps.bias", i, proj[j]);
        add(l, nm, RM_BIAS, j < 2 ? fe : d, ne);
    }
    if (!fs) return;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp_shexp.weight", i);
    add(l, nm, RM_ROUTER, d, 1);
    for (int j = 0; j < 3; j++) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_%s_shexp.weight", i, proj[j]);
        add(l, nm, RM_MATRIX, j < 2 ? d : fs, j < 2 ? fs : d);
    }
}

smelt_status rm_tensors(const struct rm_preset *p, struct rm_tensor **out, int64_t *n,
                        struct err *e) {
    struct tlist l = {0};
    const int64_t d = p->n_embd, q = (int64_t)p->n_head * p->head_dim,
                  kv = (int64_t)p->n_head_kv * p->head_dim, f = p->n_ff;
    char nm[64];
    const struct rm_hybrid *hy = p->hybrid;
    add(&l, "token_embd.weight", RM_MATRIX, d, p->n_vocab);
    for (int i = 0; i < p->n_layer + (hy ? hy->n_mtp : 0); i++) {
#define T(suffix, kind, a, b)                                                                  \
    do {                                                                                       \
        snprintf(nm, sizeof nm, "blk.%d." suffix, i);                                          \
        add(&l, nm, kind, a, b);                                                               \
    } while (0)
        T("attn_norm.weight", RM_NORM, d, 1);
        if (hy) { /* qwen35: DeltaNet or gated attention, then the FFN */
            if (i < p->n_layer && (i + 1) % hy->interval) {
                int64_t kd = (int64_t)hy->k_heads * hy->head_k;
                int64_t vd = (int64_t)hy->v_heads * hy->head_v;
                T("attn_qkv.weight", RM_MATRIX, d, 2 * kd + vd);
                T("attn_gate.weight", RM_MATRIX, d, vd);
                T("ssm_conv1d.weight", RM_CONV, hy->conv, 2 * kd + vd);
                T("ssm_dt.bias", RM_BIAS, hy->v_heads, 1);
                T("ssm_a", RM_DECAY, hy->v_heads, 1);
                T("ssm_beta.weight", RM_MATRIX, d, hy->v_heads);
                T("ssm_alpha.weight", RM_MATRIX, d, hy->v_heads);
                T("ssm_norm.weight", RM_NORM, hy->head_v, 1);
                T("ssm_out.weight", RM_MATRIX, vd, d);
            } else {
                T("attn_q.weight", RM_MATRIX, d, 2 * q);
                T("attn_k.weight", RM_MATRIX, d, kv);
                T("attn_v.weight", RM_MATRIX, d, kv);
                T("attn_output.weight", RM_MATRIX, q, d);
                T("attn_q_norm.weight", RM_NORM, p->head_dim, 1);
                T("attn_k_norm.weight", RM_NORM, p->head_dim, 1);
            }
            if (i >= p->n_layer) {
                T("nextn.eh_proj.weight", RM_MATRIX, 2 * d, d);
                T("nextn.enorm.weight", RM_NORM, d, 1);
                T("nextn.hnorm.weight", RM_NORM, d, 1);
                /* the checkpoints' mtp.norm, as the converter writes it */
                T("nextn.shared_head_norm.weight", RM_NORM, d, 1);
            }
            T("post_attention_norm.weight", RM_NORM, d, 1);
            if (p->n_expert) {
                add_moe(&l, p, i);
                continue;
            }
            T("ffn_gate.weight", RM_MATRIX, d, f);
            T("ffn_up.weight", RM_MATRIX, d, f);
            T("ffn_down.weight", RM_MATRIX, f, d);
            continue;
        }
        T("attn_q.weight", RM_MATRIX, d, q);
        T("attn_k.weight", RM_MATRIX, d, kv);
        T("attn_v.weight", RM_MATRIX, d, kv);
        T("attn_output.weight", RM_MATRIX, q, d);
        if (p->oai) {
            T("attn_output.bias", RM_BIAS, d, 1);
            T("attn_sinks.weight", RM_BIAS, p->n_head, 1);
        }
        if (p->qkv_bias) {
            T("attn_q.bias", RM_BIAS, q, 1);
            T("attn_k.bias", RM_BIAS, kv, 1);
            T("attn_v.bias", RM_BIAS, kv, 1);
        }
        if (p->qk_norm) {
            T("attn_q_norm.weight", RM_NORM, p->head_dim, 1);
            T("attn_k_norm.weight", RM_NORM, p->head_dim, 1);
        }
        if (p->gemma || p->oai) T("post_attention_norm.weight", RM_NORM, d, 1);
        if (!p->oai) T("ffn_norm.weight", RM_NORM, d, 1);
        if (p->n_expert) {
            add_moe(&l, p, i);
        } else {
            T("ffn_gate.weight", RM_MATRIX, d, f);
            T("ffn_up.weight", RM_MATRIX, d, f);
            T("ffn_down.weight", RM_MATRIX, f, d);
        }
        if (p->gemma) T("post_ffw_norm.weight", RM_NORM, d, 1);
#undef T
    }
    add(&l, "output_norm.weight", RM_NORM, d, 1);
    if (!p->tied) add(&l, "output.weight", RM_MATRIX, d, p->n_vocab);
    if (l.oom) {
        free(l.v);
        return err_set(e, SMELT_ERR_NOMEM, "no memory for the tensor list");
    }
    *out = l.v;
    *n = l.n;
    return SMELT_OK;
}

/* "<arch>.<suffix>" in buf. */
static const char *akey(const struct rm_preset *p, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", p->arch, suffix);
    return buf;
}

smelt_status rm_write_metadata(struct gguf_writer *w, const struct rm_preset *p,
                               uint32_t file_type, struct err *e) {
    char k[128], name[64];
    snprintf(name, sizeof name, "random-%s", p->name);
    gguf_set_str(w, "general.architecture", p->arch);
    gguf_set_str(w, "general.name", name);
#define U32(suffix, v) gguf_set_u32(w, akey(p, suffix, k, sizeof k), (uint32_t)(v))
#define F32(suffix, v) gguf_set_f32(w, akey(p, suffix, k, sizeof k), (float)(v))
    U32("context_length", p->oai ? 131072 : 32768);
    U32("embedding_length", p->n_embd);
    U32("block_count", p->n_layer + (p->hybrid ? p->hybrid->n_mtp : 0));
    if (p->n_ff) U32("feed_forward_length", p->n_ff); /* Qwen3.5's MoE models have none */
    U32("attention.head_count", p->n_head);
    U32("attention.head_count_kv", p->n_head_kv);
    if (p->hybrid) {
        const struct rm_hybrid *hy = p->hybrid;
        U32("attention.key_length", p->head_dim);
        U32("attention.value_length", p->head_dim);
        U32("rope.dimension_count", hy->n_rot);
        gguf_set_arr(w, akey(p, "rope.dimension_sections", k, sizeof k), GGUF_T_INT32,
                     hy->sections, 4);
        U32("full_attention_interval", hy->interval);
        U32("nextn_predict_layers", hy->n_mtp);
        U32("ssm.conv_kernel", hy->conv);
        U32("ssm.state_size", hy->head_k);
        U32("ssm.group_count", hy->k_heads);
        U32("ssm.time_step_rank", hy->v_heads);
        U32("ssm.inner_size", hy->v_heads * hy->head_v);
    } else if (p->gemma) {
        U32("attention.key_length", p->head_dim);
        U32("attention.value_length", p->head_dim);
        U32("attention.sliding_window", p->sliding_window);
    } else {
        U32("rope.dimension_count", p->head_dim);
        if (p->head_dim * p->n_head != p->n_embd) { /* not implied by the head count */
            U32("attention.key_length", p->head_dim);
            U32("attention.value_length", p->head_dim);
        }
    }
    if (p->n_expert) {
        U32("expert_count", p->n_expert);
        U32("expert_used_count", p->n_expert_used);
        U32("expert_feed_forward_length", p->n_ff_exp);
        if (p->hybrid && p->hybrid->n_ff_shexp)
            U32("expert_shared_feed_forward_length", p->hybrid->n_ff_shexp);
    }
    if (p->oai) { /* as llama.cpp's converter writes gpt-oss's config */
        U32("attention.sliding_window", p->sliding_window);
        gguf_set_str(w, akey(p, "rope.scaling.type", k, sizeof k), "yarn");
        F32("rope.scaling.factor", 32);
        U32("rope.scaling.original_context_length", 4096);
        F32("rope.scaling.yarn_beta_fast", 32);
        F32("rope.scaling.yarn_beta_slow", 1);
    }
    F32("rope.freq_base", p->rope_base);
    F32("attention.layer_norm_rms_epsilon", p->oai ? 1e-5 : 1e-6);
    gguf_set_u32(w, "general.file_type", file_type);
    U32("vocab_size", p->n_vocab);
#undef U32
#undef F32

    /* Synthetic SentencePiece vocab of the real size: specials, 256 byte tokens, then
     * "\u2581t<i>" with descending scores (mkmodel.py; Gemma's special ids for gemma3). */
    const int V = p->n_vocab;
    const char *const llama_sp[] = {"<unk>", "<s>", "</s>"};
    const char *const gemma_sp[] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    const int n_sp = p->gemma ? 4 : 3;
    const char *const *sp = p->gemma ? gemma_sp : llama_sp;
    char **toks = calloc((size_t)V, sizeof *toks);
    float *scores = calloc((size_t)V, sizeof *scores);
    int32_t *types = calloc((size_t)V, sizeof *types);
    char *text = malloc((size_t)V * 16);
    if (!toks || !scores || !types || !text) {
        free(toks);
        free(scores);
        free(types);
        free(text);
        return err_set(e, SMELT_ERR_NOMEM, "no memory for a vocab of %d tokens", V);
    }
    for (int i = 0; i < V; i++) {
        char *s = text + (size_t)i * 16;
        if (i < n_sp) {
            snprintf(s, 16, "%s", sp[i]);
            types[i] = (p->gemma ? i == 3 : i == 0) ? 2 : 3; /* unknown : control */
        } else if (i < n_sp + 256) {
            snprintf(s, 16, "<0x%02X>", i - n_sp);
            types[i] = 6;
        } else {
            snprintf(s, 16, "\xe2\x96\x81t%d", i - n_sp - 256);
            types[i] = 1;
            scores[i] = -(float)(i - n_sp - 256);
        }
        toks[i] = s;
    }
    gguf_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)V);
    gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, (uint64_t)V);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)V);
    free(toks);
    free(scores);
    free(types);
    free(text);
    if (p->gemma) {
        gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 2);
        gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
        gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 3);
        gguf_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
        gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    } else {
        gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    }
    /* Failures are remembered by the writer and reported by gguf_writer_write. */
    return SMELT_OK;
}

void rm_fill_rows(const struct rm_tensor *t, uint64_t seed, int64_t ti, int64_t row0,
                  int64_t nrows, float *out) {
    /* Irwin-Hall(4) of 16-bit uniforms: mean 4*32767.5, sd sqrt(4*(65536^2-1)/12). */
    const float mean = 131070.f, inv_sd = 1.0f / 37837.23f;
    const float scale = t->kind == RM_NORM ? 0.05f : t->kind == RM_DECAY ? -0.05f : 0.02f;
    const float base = t->kind == RM_NORM ? 1.f : t->kind == RM_DECAY ? -1.f : 0.f;
    const uint64_t key = mix64(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)ti + 1);
    const uint64_t e0 = (uint64_t)(row0 * t->ne[0]);
    const int64_t n = nrows * t->ne[0];
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = mix64(key + (e0 + (uint64_t)i) * 0x9e3779b97f4a7c15ULL);
        const uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)(r >> 16 & 0xffff) +
                           (uint32_t)(r >> 32 & 0xffff) + (uint32_t)(r >> 48);
        out[i] = base + scale * (((float)s - mean) * inv_sd);
    }
}

/* Forward-pass properties on tiny random models written here with the GGUF writer
 * (llama, qwen2, qwen3, gemma3, qwen3moe and gpt-oss shapes):
 * - a sequence's logits do not depend on which other sequences share its batch;
 * - prefill followed by decode lands where token-at-a-time decode does;
 * - a recycled block carries no history from its last owner;
 * - the same with quantized weights (the integer kernels real models run): bitwise at
 *   every kernel level (the repacked decode kernels do the packed prefill's arithmetic);
 * - an F16 KV cache stays close to the F32 one;
 * - a mixture-of-experts model (qwen3moe: 16 experts, 4 per token, so rows of a batch go
 *   to different experts) keeps every property above: a row's experts do not depend on
 *   the rows beside it (bitwise with Q8_0 experts, whose kernels are row-count invariant);
 * - loading fails with a message naming the bad key or tensor (for MoE files: expert
 *   tensors that disagree with expert_count / expert_used_count, a router of the wrong
 *   shape, a backend without the MoE ops; gpt-oss files without its sinks or biases, a
 *   backend without the features gpt-oss's ops need);
 * - a tokenizer with fewer tokens than token_embd has rows (padded vocabulary) limits the
 *   ids and logits to the tokens; one with more is refused.
 * Numerical agreement with transformers is test_forward_ref.c's job. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "format/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "t.h"

#define N_VOCAB 64
#define N_EMBD 32
#define N_FF 48
#define N_LAYER 3

static struct backend *bk;

/* ---- a tiny model ---- */

struct tiny {
    const char *arch;
    int n_head, n_head_kv, head_dim; /* head_dim 0: n_embd / n_head, no key_length key */
    bool bias, qk_norm, gemma, tied;
    bool oai;          /* gpt-oss: output bias, sinks, post_attention_norm as the FFN's norm,
                        * router and expert biases, sliding window on even layers */
    uint32_t wtype;    /* type of the 2-D weights (0: F32) */
    uint32_t etype;    /* type of the expert weights (0: wtype) */
    int n_embd, n_ff; /* 0: N_EMBD, N_FF */
    /* mixture of experts (qwen3moe): n_expert experts of n_ff_exp, n_used per token */
    int n_expert, n_used, n_ff_exp;
    /* sabotage for the load-error tests */
    const char *skip_key;
    const char *bad_tensor;
    int bad_dim; /* the dimension of bad_tensor that gets one too many (0: ne1) */
    const char *skip_tensor; /* not written */
    /* tokenizer.ggml.tokens with this many tokens (0: none); boost_from > 0: output rows
     * boost_from.. (the embedding's, when tied) are +-20 times rows 0.., so that, were they
     * scored, they would win */
    int n_tokens, boost_from;
    /* rope.scaling.type "yarn", factor 4, with this rope.scaling.yarn_attn_factor (0: none) */
    float yarn_attn;
};

struct wbuf {
    float *bufs[256];
    int n;
};

static float *rnd(struct wbuf *wb, int64_t n, float scale, float offset, unsigned long long *s) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = offset + scale * t_randn(s);
    wb->bufs[wb->n++] = p;
    return p;
}

static int embd_of(const struct tiny *t) { return t->n_embd ? t->n_embd : N_EMBD; }
static int ff_of(const struct tiny *t) { return t->n_ff ? t->n_ff : N_FF; }

/* Adds tensor (ne0, ne1, ne2) (ne2 > 1: a stack of expert matrices). */
static void add3(struct gguf_writer *w, struct wbuf *wb, const struct tiny *t, const char *name,
                 int64_t ne0, int64_t ne1, int64_t ne2, const float *data) {
    int64_t ne[3] = {ne0, ne1, ne2};
    if (t->skip_tensor && !strcmp(name, t->skip_tensor)) return;
    if (t->bad_tensor && !strcmp(name, t->bad_tensor)) { /* one row (or expert) too many */
        ne[t->bad_dim ? t->bad_dim : 1] += 1;
        float *big = calloc((size_t)(ne[0] * ne[1] * ne[2]), sizeof(float));
        memcpy(big, data, (size_t)(ne0 * ne1 * ne2) * sizeof(float));
        wb->bufs[wb->n++] = big;
        data = big;
    }
    const uint32_t nd = ne[2] > 1 ? 3 : ne[1] > 1 ? 2 : 1;
    /* matrices quantized with the reference quantizer; the router and biases stay F32 (as
     * in real files: llama.cpp never quantizes them) */
    const uint32_t type = nd == 3 && t->etype ? t->etype : t->wtype;
    if (type && nd > 1 && !strstr(name, "ffn_gate_inp") && !strstr(name, ".bias")) {
        const struct qtype_info *qi = qtype_get(type);
        size_t bytes = qtype_row_size(type, ne[0]) * (size_t)(ne[1] * ne[2]);
        void *q = malloc(bytes);
        qi->quantize(data, q, ne[0] * ne[1] * ne[2]);
        wb->bufs[wb->n++] = q;
        gguf_add_tensor(w, name, type, nd, ne, q);
        return;
    }
    gguf_add_tensor(w, name, QT_F32, nd, ne, data);
}

static void add(struct gguf_writer *w, struct wbuf *wb, const struct tiny *t, const char *name,
                int64_t ne0, int64_t ne1, const float *data) {
    add3(w, wb, t, name, ne0, ne1, 1, data);
}

static void key_u32(struct gguf_writer *w, const struct tiny *t, const char *suffix, uint32_t v) {
    if (t->skip_key && !strcmp(suffix, t->skip_key)) return;
    char key[128];
    snprintf(key, sizeof key, "%s.%s", t->arch, suffix);
    gguf_set_u32(w, key, v);
}

static void key_f32(struct gguf_writer *w, const struct tiny *t, const char *suffix, float v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", t->arch, suffix);
    gguf_set_f32(w, key, v);
}

static void write_tiny(const struct tiny *t, const char *path) {
    unsigned long long s = 0x7e57f00dULL;
    struct wbuf wb = {.n = 0};
    struct gguf_writer *w;
    struct err e;
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    const int E = embd_of(t), F = ff_of(t);
    int hd = t->head_dim ? t->head_dim : E / t->n_head;
    gguf_set_str(w, "general.architecture", t->arch);
    key_u32(w, t, "embedding_length", (uint32_t)E);
    key_u32(w, t, "block_count", N_LAYER);
    key_u32(w, t, "feed_forward_length", (uint32_t)F);
    key_u32(w, t, "context_length", 256);
    key_u32(w, t, "attention.head_count", (uint32_t)t->n_head);
    key_u32(w, t, "attention.head_count_kv", (uint32_t)t->n_head_kv);
    if (t->head_dim) {
        key_u32(w, t, "attention.key_length", (uint32_t)hd);
        key_u32(w, t, "attention.value_length", (uint32_t)hd);
    }
    key_f32(w, t, "attention.layer_norm_rms_epsilon", 1e-6f);
    key_f32(w, t, "rope.freq_base", 10000.0f);
    if (t->yarn_attn != 0) {
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.type", t->arch);
        gguf_set_str(w, key, "yarn");
        key_f32(w, t, "rope.scaling.factor", 4.0f);
        key_u32(w, t, "rope.scaling.original_context_length", 64);
        key_f32(w, t, "rope.scaling.yarn_attn_factor", t->yarn_attn);
    }
    if (t->gemma || t->oai) key_u32(w, t, "attention.sliding_window", 5);
    if (t->gemma) key_f32(w, t, "rope.freq_base_swa", 100.0f);
    if (t->n_expert) {
        key_u32(w, t, "expert_count", (uint32_t)t->n_expert);
        key_u32(w, t, "expert_used_count", (uint32_t)t->n_used);
        key_u32(w, t, "expert_feed_forward_length", (uint32_t)t->n_ff_exp);
    }
    if (t->n_tokens) {
        static char names[256][8];
        const char *tok[256];
        for (int i = 0; i < t->n_tokens && i < 256; i++) {
            snprintf(names[i], sizeof names[i], "t%d", i);
            tok[i] = names[i];
        }
        gguf_set_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)t->n_tokens);
    }
    float emb_scale = t->gemma ? 0.2f : 1.0f;
    /* matrix scales shrink with the row length so that wider models keep the same
     * activation magnitudes (the factors are 1 at the default shape) */
    const float se = sqrtf((float)N_EMBD / (float)E), sf = sqrtf((float)N_FF / (float)F);
    float *emb = rnd(&wb, (int64_t)E * N_VOCAB, emb_scale, 0, &s);
    float *onorm = rnd(&wb, E, 0.1f, 1, &s);
    float *out = t->tied ? emb : rnd(&wb, (int64_t)E * N_VOCAB, 0.3f * se, 0, &s);
    for (int r = t->boost_from; t->boost_from > 0 && r < N_VOCAB; r++)
        for (int i = 0; i < E; i++)
            out[r * E + i] = (r % 2 ? -20.0f : 20.0f) * out[(r - t->boost_from) * E + i];
    add(w, &wb, t, "token_embd.weight", E, N_VOCAB, emb);
    add(w, &wb, t, "output_norm.weight", E, 1, onorm);
    if (!t->tied) add(w, &wb, t, "output.weight", E, N_VOCAB, out);
    int nq = t->n_head * hd, nk = t->n_head_kv * hd;
    const float sq = t->n_embd ? sqrtf((float)N_EMBD / (float)nq) : 1.0f;
    for (int il = 0; il < N_LAYER; il++) {
        char n[64];
#define T(fmt, ne0, ne1, scale, off)                                                           \
    snprintf(n, sizeof n, fmt, il);                                                            \
    add(w, &wb, t, n, ne0, ne1, rnd(&wb, (int64_t)(ne0) * (ne1), scale, off, &s))
        T("blk.%d.attn_norm.weight", E, 1, 0.1f, 1);
        T("blk.%d.attn_q.weight", E, nq, 0.25f * se, 0);
        T("blk.%d.attn_k.weight", E, nk, 0.25f * se, 0);
        T("blk.%d.attn_v.weight", E, nk, 0.25f * se, 0);
        T("blk.%d.attn_output.weight", nq, E, 0.25f * sq, 0);
        if (t->bias) {
            T("blk.%d.attn_q.bias", nq, 1, 0.1f, 0);
            T("blk.%d.attn_k.bias", nk, 1, 0.1f, 0);
            T("blk.%d.attn_v.bias", nk, 1, 0.1f, 0);
        }
        if (t->qk_norm) {
            T("blk.%d.attn_q_norm.weight", hd, 1, 0.1f, 1);
            T("blk.%d.attn_k_norm.weight", hd, 1, 0.1f, 1);
        }
        if (t->gemma) {
            T("blk.%d.post_attention_norm.weight", E, 1, 0.1f, 1);
            T("blk.%d.post_ffw_norm.weight", E, 1, 0.1f, 1);
        }
        if (t->oai) {
            T("blk.%d.attn_output.bias", E, 1, 0.1f, 0);
            T("blk.%d.attn_sinks.weight", t->n_head, 1, 1.0f, 0);
            T("blk.%d.post_attention_norm.weight", E, 1, 0.1f, 1);
        } else {
            T("blk.%d.ffn_norm.weight", E, 1, 0.1f, 1);
        }
        if (t->n_expert) {
            const int X = t->n_expert, FE = t->n_ff_exp;
            const float sx = sqrtf((float)N_FF / (float)FE);
            T("blk.%d.ffn_gate_inp.weight", E, X, 0.25f * se, 0);
            if (t->oai) {
                T("blk.%d.ffn_gate_inp.bias", X, 1, 0.3f, 0);
                T("blk.%d.ffn_gate_exps.bias", FE, X, 0.3f, 0);
                T("blk.%d.ffn_up_exps.bias", FE, X, 0.3f, 0);
                T("blk.%d.ffn_down_exps.bias", E, X, 0.1f, 0);
            }
#define T3(fmt, ne0, ne1, scale)                                                               \
    snprintf(n, sizeof n, fmt, il);                                                            \
    add3(w, &wb, t, n, ne0, ne1, X, rnd(&wb, (int64_t)(ne0) * (ne1) * X, scale, 0, &s))
            T3("blk.%d.ffn_gate_exps.weight", E, FE, 0.25f * se);
            T3("blk.%d.ffn_up_exps.weight", E, FE, 0.25f * se);
            T3("blk.%d.ffn_down_exps.weight", FE, E, 0.25f * sx);
#undef T3
            continue;
        }
        T("blk.%d.ffn_gate.weight", E, F, 0.25f * se, 0);
        T("blk.%d.ffn_up.weight", E, F, 0.25f * se, 0);
        T("blk.%d.ffn_down.weight", F, E, 0.25f * sf, 0);
#undef T
    }
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    gguf_writer_free(w);
    for (int i = 0; i < wb.n; i++) free(wb.bufs[i]);
}

static const struct tiny archs[] = {
    {.arch = "llama", .n_head = 4, .n_head_kv = 2},
    {.arch = "qwen2", .n_head = 4, .n_head_kv = 1, .bias = true, .tied = true},
    {.arch = "qwen3", .n_head = 4, .n_head_kv = 2, .head_dim = 16, .qk_norm = true},
    {.arch = "gemma3", .n_head = 2, .n_head_kv = 1, .head_dim = 24, .qk_norm = true,
     .gemma = true, .tied = true},
    {.arch = "qwen3moe", .n_head = 4, .n_head_kv = 2, .head_dim = 16, .qk_norm = true,
     .n_expert = 16, .n_used = 4, .n_ff_exp = 24},
    {.arch = "gpt-oss", .n_head = 4, .n_head_kv = 2, .head_dim = 16, .bias = true, .oai = true,
     .n_expert = 16, .n_used = 4, .n_ff_exp = 24},
};

/* The same architectures with quantized weights, at shapes the block sizes allow (every
 * row length a multiple of 256): one type per activation path of the CPU kernels (K-quant
 * two-plane and 16-bit; legacy fused two-plane and 16-bit; Q8_0; Q6_K). */
static const struct tiny qarchs[] = {
    {.arch = "llama", .n_head = 4, .n_head_kv = 2, .head_dim = 64, .wtype = QT_Q4_K, .n_embd = 256, .n_ff = 512},
    {.arch = "qwen2", .n_head = 4, .n_head_kv = 1, .head_dim = 64, .bias = true, .tied = true, .wtype = QT_Q5_0,
     .n_embd = 256, .n_ff = 512},
    {.arch = "qwen3", .n_head = 4, .n_head_kv = 2, .head_dim = 64, .qk_norm = true, .wtype = QT_Q6_K, .n_embd = 256,
     .n_ff = 512},
    {.arch = "gemma3", .n_head = 4, .n_head_kv = 1, .head_dim = 64, .qk_norm = true, .gemma = true, .tied = true,
     .wtype = QT_Q8_0, .n_embd = 256, .n_ff = 512},
    /* experts as real MoE files hold them: Q8_0 (row-count invariant kernels: batching
     * must change nothing, bit for bit) and Q4_K (Qwen3-30B-A3B Q4_K_M's gate/up) */
    {.arch = "qwen3moe", .n_head = 4, .n_head_kv = 2, .head_dim = 32, .qk_norm = true, .wtype = QT_Q8_0,
     .n_embd = 64, .n_ff = 128, .n_expert = 16, .n_used = 4, .n_ff_exp = 32},
    {.arch = "qwen3moe", .n_head = 4, .n_head_kv = 2, .head_dim = 64, .qk_norm = true, .wtype = QT_Q4_K,
     .n_embd = 256, .n_ff = 512, .n_expert = 8, .n_used = 2, .n_ff_exp = 256},
    /* gpt-oss as its real files hold it: MXFP4 experts, Q8_0 elsewhere */
    {.arch = "gpt-oss", .n_head = 4, .n_head_kv = 2, .head_dim = 32, .bias = true, .oai = true,
     .wtype = QT_Q8_0, .etype = QT_MXFP4, .n_embd = 64, .n_ff = 128, .n_expert = 16, .n_used = 4,
     .n_ff_exp = 64},
};

/* Batched-vs-solo tolerance. The integer kernels give every row the same arithmetic
 * whatever the number of rows at every level (exact: 0): the repacked decode kernels
 * reproduce the packed prefill kernels bit for bit (cpu_gemv_*.c; until 2026-12-02 the
 * K-quants on AVX2/AVX-512 differed by up to 4.8e-4). F32 weights: f32 rounding (tile
 * shapes differ), 1e-5. */
static double batch_tol(const struct tiny *t) {
    return t->wtype ? 0 : 1e-5;
}

struct loaded {
    char path[256];
    struct gguf_file *f;
    struct model *m;
};

static bool load_tiny(const struct tiny *t, struct loaded *L, struct err *e) {
    snprintf(L->path, sizeof L->path, "%s/smelt_tiny_%s_%d.gguf", P_tmpdir, t->arch, (int)getpid());
    write_tiny(t, L->path);
    L->f = NULL;
    L->m = NULL;
    if (gguf_open(&L->f, L->path, e) != SMELT_OK) return false;
    return model_load(&L->m, L->f, bk, e) == SMELT_OK;
}

static void unload(struct loaded *L) {
    model_free(L->m);
    gguf_close(L->f);
    unlink(L->path);
}

/* ---- driving sequences ---- */

#define BS 4
#define N_BLOCKS 64

struct seqrun {
    const int32_t *tok;
    int32_t n_done; /* positions already in the cache */
    struct kv_seq kv;
};

/* One step over several sequences: sequence i contributes take[i] tokens (0: none).
 * Every row asks for logits; out gets (n_vocab) floats per row, in row order. */
static bool step(struct model *m, struct kv_store *kv, struct kv_pool *pool, struct seqrun *sr,
                 int n_seq, const int *take, float *out) {
    int32_t tok[256], pos[256], seq[256];
    uint8_t want[256];
    struct batch_seq views[8];
    int n = 0;
    struct err e;
    for (int i = 0; i < n_seq; i++) {
        if (kv_seq_reserve(pool, &sr[i].kv, sr[i].n_done + take[i], &e) != SMELT_OK) return false;
        views[i] = kv_seq_view(&sr[i].kv);
        for (int j = 0; j < take[i]; j++, n++) {
            tok[n] = sr[i].tok[sr[i].n_done + j];
            pos[n] = sr[i].n_done + j;
            seq[n] = i;
            want[n] = 1;
        }
    }
    struct batch b = {n, tok, pos, seq, want, n_seq, views};
    int32_t n_out = 0;
    smelt_status st = model_forward(m, kv, &b, out, &n_out, &e);
    if (st != SMELT_OK) {
        fprintf(stderr, "forward: %s\n", e.msg);
        return false;
    }
    for (int i = 0; i < n_seq; i++) sr[i].n_done += take[i];
    return n_out == n;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double m = 0, mb = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m) m = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return m / mb;
}

static const int32_t toks[3][24] = {
    {5, 17, 33, 2, 60, 41, 7, 7, 19, 23, 48, 12, 3, 9, 50, 61, 1, 0, 44, 38, 27, 15, 8, 30},
    {11, 4, 63, 29, 35, 18, 56, 21, 6, 40, 47, 13, 25, 52, 31, 22, 58, 10, 36, 45, 3, 1, 2, 9},
    {42, 42, 42, 16, 37, 28, 59, 14, 20, 53, 26, 46, 34, 55, 24, 32, 39, 49, 57, 51, 43, 62, 5, 6},
};

/* Logits of every position of sequence `which`, decoded one token per step alone in a
 * fresh cache. */
static void solo_decode(struct model *m, uint32_t kv_type, int which, int n, float *out) {
    struct kv_store *kv;
    struct kv_pool pool;
    struct err e;
    T_CHECK(model_kv_new(m, kv_type, BS, N_BLOCKS, 0, &kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&pool, N_BLOCKS, BS, &e) == SMELT_OK);
    struct seqrun sr = {toks[which], 0, {0}};
    int one = 1;
    for (int i = 0; i < n; i++) T_CHECK(step(m, kv, &pool, &sr, 1, &one, out + (size_t)i * N_VOCAB));
    kv_seq_release(&pool, &sr.kv);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
}

/* Mixed batches: seq 0 prefills in chunks beside decode tokens of seqs 1 and 2 (which
 * start with their own prefill); every position's logits must match solo decoding. */
static void check_batching(const struct tiny *t) {
    struct loaded L;
    struct err e;
    if (!load_tiny(t, &L, &e)) {
        T_CHECKF(0, "%s: %s", t->arch, e.msg);
        unload(&L);
        return;
    }
    enum { N = 20 };
    float *solo = malloc(sizeof(float) * 3 * N * N_VOCAB);
    for (int s = 0; s < 3; s++) solo_decode(L.m, QT_F32, s, N, solo + (size_t)s * N * N_VOCAB);

    struct kv_store *kv;
    struct kv_pool pool;
    T_CHECK(model_kv_new(L.m, QT_F32, BS, N_BLOCKS, 0, &kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&pool, N_BLOCKS, BS, &e) == SMELT_OK);
    struct seqrun sr[3] = {{toks[0], 0, {0}}, {toks[1], 0, {0}}, {toks[2], 0, {0}}};
    /* (seq0, seq1, seq2) tokens per step; totals N each */
    const int plan[][3] = {{7, 5, 0}, {6, 1, 9}, {0, 1, 1}, {5, 1, 1}, {1, 6, 1}, {1, 6, 8}};
    float *out = malloc(sizeof(float) * 64 * N_VOCAB);
    double worst = 0;
    for (size_t k = 0; k < sizeof plan / sizeof plan[0]; k++) {
        int before[3] = {sr[0].n_done, sr[1].n_done, sr[2].n_done};
        T_CHECK(step(L.m, kv, &pool, sr, 3, plan[k], out));
        int row = 0;
        for (int s = 0; s < 3; s++)
            for (int j = 0; j < plan[k][s]; j++, row++) {
                double r = rel_err(out + (size_t)row * N_VOCAB,
                                   solo + ((size_t)s * N + before[s] + j) * N_VOCAB, N_VOCAB);
                if (r > worst) worst = r;
            }
    }
    for (int s = 0; s < 3; s++) T_EQ_INT(sr[s].n_done, N);
    const double tol = batch_tol(t);
    if (t->wtype)
        printf("  %s %s (%s kernels): batched vs solo decode, worst rel err %.3g (bound %g)\n", t->arch,
               qtype_get(t->wtype)->name, cpu_isa_name(cpu_isa_best()), worst, tol);
    T_CHECKF(worst <= tol, "%s: batched vs solo decode: rel err %g", t->arch, worst);

    /* Recycled blocks: release seq 1, then run seq 2's tokens as a new sequence that
     * takes seq 1's old blocks; it must match a fresh solo run. */
    kv_seq_release(&pool, &sr[1].kv);
    struct seqrun fresh = {toks[2], 0, {0}};
    int take = N;
    T_CHECK(step(L.m, kv, &pool, &fresh, 1, &take, out));
    double rr = rel_err(out, solo + (size_t)2 * N * N_VOCAB, (int64_t)N * N_VOCAB);
    T_CHECKF(rr <= tol, "%s: recycled blocks changed the logits (rel err %g)", t->arch, rr);

    kv_seq_release(&pool, &fresh.kv);
    for (int s = 0; s < 3; s++) kv_seq_release(&pool, &sr[s].kv);
    T_EQ_INT(pool.n_free, N_BLOCKS);
    kv_pool_free(&pool);
    model_kv_free(L.m, kv);

    /* F16 cache: close to F32 */
    float *h = malloc(sizeof(float) * N * N_VOCAB);
    solo_decode(L.m, QT_F16, 0, N, h);
    double r = rel_err(h, solo, (int64_t)N * N_VOCAB);
    T_CHECKF(r < 1e-2 && r > 0, "%s: F16 KV vs F32: rel err %g", t->arch, r);
    free(h);
    free(out);
    free(solo);
    unload(&L);
}

/* Only some rows want logits (the last layer then runs on those rows only): they equal
 * the same rows of solo decoding, in row order. */
static void check_sparse_logits(const struct tiny *t) {
    struct loaded L;
    struct err e;
    if (!load_tiny(t, &L, &e)) {
        T_CHECKF(0, "%s: %s", t->arch, e.msg);
        unload(&L);
        return;
    }
    enum { N = 12 };
    float *solo = malloc(sizeof(float) * 2 * N * N_VOCAB), *out = malloc(sizeof(float) * 4 * N_VOCAB);
    solo_decode(L.m, QT_F32, 0, N, solo);
    solo_decode(L.m, QT_F32, 1, N, solo + (size_t)N * N_VOCAB);
    struct kv_store *kv;
    struct kv_pool pool;
    T_CHECK(model_kv_new(L.m, QT_F32, BS, N_BLOCKS, 0, &kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&pool, N_BLOCKS, BS, &e) == SMELT_OK);
    struct kv_seq q0, q1;
    kv_seq_init(&q0);
    kv_seq_init(&q1);
    T_CHECK(kv_seq_reserve(&pool, &q0, N, &e) == SMELT_OK);
    T_CHECK(kv_seq_reserve(&pool, &q1, N, &e) == SMELT_OK);
    struct batch_seq views[2] = {kv_seq_view(&q0), kv_seq_view(&q1)};
    /* step 1: seq 0 rows 0..9 (logits of 3 and 9) beside seq 1 rows 0..4 (logits of 4) */
    int32_t tok[15], pos[15], seq[15];
    uint8_t want[15] = {0};
    for (int i = 0; i < 15; i++) {
        int s0 = i < 10;
        seq[i] = s0 ? 0 : 1;
        pos[i] = s0 ? i : i - 10;
        tok[i] = toks[seq[i]][pos[i]];
    }
    want[3] = want[9] = want[14] = 1;
    struct batch b = {15, tok, pos, seq, want, 2, views};
    int32_t n_out = 0;
    T_CHECK(model_forward(L.m, kv, &b, out, &n_out, &e) == SMELT_OK);
    T_EQ_INT(n_out, 3);
    double r = fmax(rel_err(out, solo + 3 * N_VOCAB, N_VOCAB), rel_err(out + N_VOCAB, solo + 9 * N_VOCAB, N_VOCAB));
    r = fmax(r, rel_err(out + 2 * N_VOCAB, solo + (size_t)(N + 4) * N_VOCAB, N_VOCAB));
    /* step 2: no logits at all, then step 3: one decode row of each */
    int32_t t2[2] = {toks[0][10], toks[1][5]}, p2[2] = {10, 5}, s2[2] = {0, 1};
    uint8_t none[2] = {0, 0}, both[2] = {1, 1};
    struct batch b2 = {2, t2, p2, s2, none, 2, views};
    T_CHECK(model_forward(L.m, kv, &b2, out, &n_out, &e) == SMELT_OK);
    T_EQ_INT(n_out, 0);
    int32_t t3[2] = {toks[0][11], toks[1][6]}, p3[2] = {11, 6};
    struct batch b3 = {2, t3, p3, s2, both, 2, views};
    T_CHECK(model_forward(L.m, kv, &b3, out, &n_out, &e) == SMELT_OK);
    r = fmax(r, rel_err(out, solo + 11 * N_VOCAB, N_VOCAB));
    r = fmax(r, rel_err(out + N_VOCAB, solo + (size_t)(N + 6) * N_VOCAB, N_VOCAB));
    T_CHECKF(r < 1e-5, "%s: sparse logits vs solo: rel err %g", t->arch, r);
    kv_seq_release(&pool, &q0);
    kv_seq_release(&pool, &q1);
    kv_pool_free(&pool);
    model_kv_free(L.m, kv);
    free(solo);
    free(out);
    unload(&L);
}

static void test_sparse_logits(void) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) check_sparse_logits(&archs[i]);
}

static void test_llama(void) { check_batching(&archs[0]); }
static void test_qwen2(void) { check_batching(&archs[1]); }
static void test_qwen3(void) { check_batching(&archs[2]); }
static void test_gemma3(void) { check_batching(&archs[3]); }
static void test_qwen3moe(void) { check_batching(&archs[4]); }
static void test_gpt_oss(void) { check_batching(&archs[5]); }
static void test_quantized(void) {
    for (size_t i = 0; i < sizeof qarchs / sizeof qarchs[0]; i++) check_batching(&qarchs[i]);
}

/* The recycled-block property with blocks actually reused: fill the whole pool with one
 * sequence, release it, and run another that must reuse those blocks. */
static void test_recycle(void) {
    struct loaded L;
    struct err e;
    if (!load_tiny(&archs[0], &L, &e)) {
        T_CHECKF(0, "%s", e.msg);
        unload(&L);
        return;
    }
    enum { N = 12 };
    float *solo = malloc(sizeof(float) * N * N_VOCAB), *out = malloc(sizeof(float) * 24 * N_VOCAB);
    solo_decode(L.m, QT_F32, 1, N, solo);
    struct kv_store *kv;
    struct kv_pool pool;
    T_CHECK(model_kv_new(L.m, QT_F32, BS, 6, 0, &kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&pool, 6, BS, &e) == SMELT_OK);
    struct seqrun a = {toks[0], 0, {0}};
    int take = 24;
    T_CHECK(step(L.m, kv, &pool, &a, 1, &take, out)); /* all 6 blocks */
    T_EQ_INT(pool.n_free, 0);
    kv_seq_release(&pool, &a.kv);
    struct seqrun b = {toks[1], 0, {0}};
    take = 5;
    T_CHECK(step(L.m, kv, &pool, &b, 1, &take, out));
    int one = 1;
    for (int i = 5; i < N; i++) T_CHECK(step(L.m, kv, &pool, &b, 1, &one, out + (size_t)i * N_VOCAB));
    T_CHECK(rel_err(out, solo, (int64_t)5 * N_VOCAB) < 1e-5);
    T_CHECK(rel_err(out + 5 * N_VOCAB, solo + 5 * N_VOCAB, (int64_t)(N - 5) * N_VOCAB) < 1e-5);
    /* the pool is full again when it must be */
    struct seqrun c = {toks[2], 0, {0}};
    take = 24;
    T_CHECK(kv_seq_reserve(&pool, &c.kv, 24, &e) == SMELT_ERR_RANGE);
    kv_seq_release(&pool, &b.kv);
    kv_seq_release(&pool, &c.kv);
    kv_pool_free(&pool);
    model_kv_free(L.m, kv);
    free(solo);
    free(out);
    unload(&L);
}

/* Bad batches are rejected with the row named, before anything runs. */
static void test_bad_batch(void) {
    struct loaded L;
    struct err e;
    if (!load_tiny(&archs[0], &L, &e)) {
        T_CHECKF(0, "%s", e.msg);
        unload(&L);
        return;
    }
    struct kv_store *kv;
    T_CHECK(model_kv_new(L.m, QT_F32, BS, 4, 0, &kv, &e) == SMELT_OK);
    int32_t blocks[2] = {1, 3}, tok[2] = {1, 2}, pos[2] = {0, 1}, seq[2] = {0, 0};
    struct batch_seq bs = {.blocks = blocks, .n_blocks = 2};
    struct batch b = {2, tok, pos, seq, NULL, 1, &bs};
    T_CHECK(model_forward(L.m, kv, &b, NULL, NULL, &e) == SMELT_OK);
    tok[1] = N_VOCAB;
    T_CHECK(model_forward(L.m, kv, &b, NULL, NULL, &e) == SMELT_ERR_RANGE);
    T_CHECK(strstr(e.msg, "row 1") != NULL);
    tok[1] = 2;
    pos[1] = 8; /* two blocks of 4 cover 0..7 */
    T_CHECK(model_forward(L.m, kv, &b, NULL, NULL, &e) == SMELT_ERR_RANGE);
    pos[1] = 1;
    blocks[1] = 4; /* not in the cache */
    T_CHECK(model_forward(L.m, kv, &b, NULL, NULL, &e) == SMELT_ERR_RANGE);
    blocks[1] = 3;
    seq[0] = 1;
    T_CHECK(model_forward(L.m, kv, &b, NULL, NULL, &e) == SMELT_ERR_RANGE);
    model_kv_free(L.m, kv);
    unload(&L);
}

static void expect_load_error(struct tiny t, const char *want1, const char *want2) {
    struct loaded L;
    struct err e;
    err_clear(&e);
    T_CHECKF(!load_tiny(&t, &L, &e), "%s loaded", t.arch);
    T_CHECKF(strstr(e.msg, want1) != NULL, "message \"%s\" lacks \"%s\"", e.msg, want1);
    if (want2) T_CHECKF(strstr(e.msg, want2) != NULL, "message \"%s\" lacks \"%s\"", e.msg, want2);
    unload(&L);
}

static void test_load_errors(void) {
    struct tiny t = archs[0];
    t.skip_key = "feed_forward_length";
    expect_load_error(t, "llama.feed_forward_length", "missing");
    t = archs[0];
    t.bad_tensor = "blk.1.attn_k.weight";
    expect_load_error(t, "blk.1.attn_k.weight", "(32, 17)");
    t = archs[0];
    t.n_head = 5; /* 32 % 5 != 0 and no key_length */
    t.n_head_kv = 5;
    expect_load_error(t, "llama.attention.head_count (5) does not divide", "embedding_length");
    t = archs[0];
    t.n_head_kv = 3;
    expect_load_error(t, "head_count_kv (3)", NULL);
    t = archs[1];
    t.bias = false;
    expect_load_error(t, "blk.0.attn_q.bias", NULL);
    t = archs[3];
    t.arch = "gemma3";
    t.gemma = false; /* no sliding_window key, no post norms */
    expect_load_error(t, "gemma3.attention.sliding_window", NULL);
    t = archs[0];
    t.arch = "mamba";
    expect_load_error(t, "mamba", "not supported");
    t = archs[1];
    t.yarn_attn = -1.0f;
    expect_load_error(t, "qwen2.rope.scaling.yarn_attn_factor", "out of range");
}

/* MoE files: expert tensors that disagree with expert_count, or with expert_used_count
 * (through expert_feed_forward_length's default n_ff / expert_used_count), a router of
 * the wrong shape, inconsistent expert keys; a dense architecture with experts; a backend
 * without the MoE ops. Each message names the tensor or key and both values. */
static void test_moe_load_errors(void) {
    struct tiny t = archs[4]; /* 16 experts of 24, 4 used; n_embd 32, n_ff 48 */
    t.bad_tensor = "blk.1.ffn_up_exps.weight";
    t.bad_dim = 2;
    expect_load_error(t, "tensor blk.1.ffn_up_exps.weight: shape (32, 24, 17)", "say (32, 24, 16)");
    t = archs[4];
    t.bad_tensor = "blk.2.ffn_down_exps.weight"; /* (24, 33, 16) */
    expect_load_error(t, "blk.2.ffn_down_exps.weight: shape (24, 33, 16)", "(24, 32, 16)");
    t = archs[4];
    t.bad_tensor = "blk.0.ffn_gate_inp.weight";
    expect_load_error(t, "tensor blk.0.ffn_gate_inp.weight: shape (32, 17)", "say (32, 16)");
    t = archs[4];
    t.skip_key = "expert_feed_forward_length"; /* then n_ff / n_used = 48 / 4 = 12, not 24 */
    expect_load_error(t, "blk.0.ffn_gate_exps.weight: shape (32, 24, 16)", "say (32, 12, 16)");
    t = archs[4];
    t.n_used = 17;
    expect_load_error(t, "qwen3moe.expert_used_count (17) exceeds qwen3moe.expert_count (16)", NULL);
    t = archs[4];
    t.skip_key = "expert_count";
    expect_load_error(t, "qwen3moe.expert_count", "missing");
    t = archs[4];
    t.arch = "qwen3"; /* a dense architecture with experts */
    expect_load_error(t, "qwen3.expert_count is 16", "not supported");
    /* a backend without the MoE ops (the CUDA backend today): refused, never run */
    const struct backend_ops *ops = bk->ops;
    struct backend_ops no_moe = *ops;
    no_moe.name = "test";
    no_moe.moe_ffn = NULL;
    bk->ops = &no_moe;
    expect_load_error(archs[4], "qwen3moe is a mixture-of-experts architecture", "test backend");
    bk->ops = ops;
}

/* gpt-oss files without the tensors it needs, and a backend without the ops it needs. */
static void test_gpt_oss_load_errors(void) {
    const struct tiny g = archs[5];
    struct tiny t = g;
    t.bad_tensor = "blk.2.attn_sinks.weight";
    expect_load_error(t, "tensor blk.2.attn_sinks.weight: shape (4, 2)", "say (4)");
    t = g;
    t.bad_tensor = "blk.1.ffn_down_exps.bias"; /* (32, 17): one expert too many */
    expect_load_error(t, "tensor blk.1.ffn_down_exps.bias: shape (32, 17)", "say (32, 16)");
    t = g;
    t.skip_key = "attention.sliding_window";
    expect_load_error(t, "gpt-oss.attention.sliding_window", "missing");
    static const char *const need[][2] = {
        {"blk.1.attn_sinks.weight", "tensor blk.1.attn_sinks.weight is missing"},
        {"blk.0.attn_output.bias", "tensor blk.0.attn_output.bias is missing"},
        {"blk.2.post_attention_norm.weight", "tensor blk.2.post_attention_norm.weight is missing"},
        {"blk.0.ffn_gate_inp.bias", "gpt-oss: tensor blk.0.ffn_gate_inp.bias is missing"},
        {"blk.1.ffn_gate_exps.bias", "tensor blk.1.ffn_gate_exps.bias is missing"},
        {"blk.1.ffn_up_exps.bias", "tensor blk.1.ffn_up_exps.bias is missing (the file has other"},
        {"output.weight", "gpt-oss: tensor output.weight is missing"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        t = g;
        t.skip_tensor = need[i][0];
        expect_load_error(t, need[i][1], NULL);
    }
    /* a backend with the MoE ops but without sinks, the clamped SwiGLU, expert biases or
     * unrounded YaRN: refused, naming what it lacks */
    const struct backend_ops *ops = bk->ops;
    struct backend_ops no_oai = *ops;
    no_oai.name = "test";
    no_oai.features = BK_FEAT_MOE_BIAS;
    bk->ops = &no_oai;
    expect_load_error(g, "gpt-oss needs attention sinks, gpt-oss's clamped SwiGLU, unrounded YaRN",
                      "test backend does not implement");
    bk->ops = ops;
}

/* YaRN's yarn_attn_factor (HF attention_factor) is the whole cos/sin magnitude: the loader
 * divides out the 1 + 0.1 ln(factor) the backends multiply in (fixture qwen3-yarn checks
 * the logits against transformers). */
static void test_yarn_attn_factor(void) {
    struct tiny t = archs[1];
    t.yarn_attn = 1.25f;
    struct loaded L;
    struct err e;
    if (!load_tiny(&t, &L, &e)) {
        T_CHECKF(0, "%s", e.msg);
        unload(&L);
        return;
    }
    const struct rope_params *r = &L.m->layer[0].rope;
    T_CHECK(r->ext_factor == 1.0f && r->n_ctx_orig == 64 && fabsf(r->freq_scale - 0.25f) < 1e-7f);
    double mag = r->attn_factor * (1.0 + 0.1 * log(1.0 / r->freq_scale));
    T_CHECKF(fabs(mag - 1.25) < 1e-6, "magnitude %g", mag);
    unload(&L);
}

/* ---- vocabulary vs tokenizer ---- */

/* Logits (m->hp.n_vocab per position) of the n ids as one prefill. */
static bool prefill_logits(struct model *m, const int32_t *ids, int n, float *out) {
    struct kv_store *kv;
    struct kv_pool pool;
    struct err e;
    if (model_kv_new(m, QT_F32, BS, N_BLOCKS, 0, &kv, &e) != SMELT_OK) return false;
    bool ok = kv_pool_init(&pool, N_BLOCKS, BS, &e) == SMELT_OK;
    struct seqrun sr = {ids, 0, {0}};
    ok = ok && step(m, kv, &pool, &sr, 1, &n, out);
    kv_seq_release(&pool, &sr.kv);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
    return ok;
}

/* Greedy and random picks through the serving path (sampler_request -> model_step's
 * summaries -> sampler_finish) for the last position of ids. */
static void check_picks(struct model *m, const int32_t *ids, int n, int32_t n_tokens) {
    struct err e;
    struct kv_store *kv;
    struct kv_pool pool;
    T_CHECK(model_kv_new(m, QT_F32, BS, N_BLOCKS, 0, &kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&pool, N_BLOCKS, BS, &e) == SMELT_OK);
    struct kv_seq sq;
    kv_seq_init(&sq);
    T_CHECK(kv_seq_reserve(&pool, &sq, n, &e) == SMELT_OK);
    int32_t pos[64], seq[64] = {0};
    for (int i = 0; i < n; i++)
        pos[i] = i;
    struct batch_seq view = kv_seq_view(&sq);
    struct batch b = {n, ids, pos, seq, NULL, 1, &view};
    for (int trial = 0; trial < 40; trial++) {
        struct sample_params sp;
        sample_params_default(&sp);
        sp.temperature = trial == 0 ? 0.0f : 3.0f; /* greedy, then flat draws */
        sp.seed = (uint64_t)trial;
        struct sampler *smp;
        T_CHECK(sampler_new(&smp, &sp, m->hp.n_vocab, &e) == SMELT_OK);
        struct topk_row row;
        struct logit_adj adj[8];
        T_CHECK(sampler_request(smp, &row, adj, 0, 8) >= 0);
        struct topk_summary sum;
        static struct topk_cand cand[TOPK_MAX];
        float raw[8];
        struct model_sample ms = {.n_rows = 1,
                                  .rows = &row,
                                  .adj = adj,
                                  .n_adj = row.adj_n,
                                  .sum = &sum,
                                  .cand = cand,
                                  .adj_raw = raw};
        T_CHECK(model_step(m, kv, &b, NULL, &ms, NULL, &e) == SMELT_OK);
        struct sample_result r;
        T_CHECK(sampler_finish(smp, &sum, cand, raw, NULL, &r, &e) == SMELT_OK);
        if (r.token == SAMPLE_NEED_ROW) {
            float *full = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
            T_CHECK(model_fetch_rows(m, 0, 1, full, &e) == SMELT_OK);
            T_CHECK(sampler_finish(smp, &sum, cand, raw, full, &r, &e) == SMELT_OK);
            free(full);
        }
        T_CHECKF(r.token >= 0 && r.token < n_tokens, "picked %d, tokens 0..%d", r.token,
                 n_tokens - 1);
        sampler_free(smp);
    }
    kv_seq_release(&pool, &sq);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
}

/* token_embd (and output) with 64 rows, a tokenizer of 60 tokens: the model's vocabulary
 * is the 60 tokens, and their logits are those of the whole model; the 4 padding rows,
 * built to win, are never scored. Untied (llama) and tied (qwen2). */
static void test_padded_vocab(void) {
    enum { NT = 60, N = 9 };
    const int32_t ids[N] = {5, 17, 33, 2, 59, 41, 7, 0, 19};
    for (int a = 0; a < 2; a++) {
        struct tiny t = archs[a];
        t.boost_from = NT;
        struct loaded all, pad;
        struct err e;
        t.n_tokens = 0; /* the same weights scored over all 64 rows */
        T_CHECKF(load_tiny(&t, &all, &e), "%s", e.msg);
        t.n_tokens = NT;
        T_CHECKF(load_tiny(&t, &pad, &e), "%s: %s", t.arch, e.msg);
        if (!all.m || !pad.m) {
            unload(&all);
            unload(&pad);
            continue;
        }
        T_EQ_INT(all.m->hp.n_vocab, N_VOCAB);
        T_EQ_INT(pad.m->hp.n_vocab, NT);
        float *la = malloc(sizeof(float) * N * N_VOCAB), *lp = malloc(sizeof(float) * N * NT);
        T_CHECK(prefill_logits(all.m, ids, N, la));
        T_CHECK(prefill_logits(pad.m, ids, N, lp));
        int padded_wins = 0;
        double d = 0;
        for (int i = 0; i < N; i++) {
            int best = 0;
            for (int v = 1; v < N_VOCAB; v++)
                if (la[i * N_VOCAB + v] > la[i * N_VOCAB + best]) best = v;
            padded_wins += best >= NT;
            for (int v = 0; v < NT; v++)
                d = fmax(d, fabs((double)lp[i * NT + v] - la[i * N_VOCAB + v]));
        }
        T_CHECKF(padded_wins == N, "%s: a padding row wins at %d of %d positions", t.arch,
                 padded_wins, N);
        T_CHECKF(d < 1e-5, "%s: token logits differ by %g", t.arch, d);
        check_picks(pad.m, ids, N, NT);
        /* an id past the tokens is not an input */
        int32_t bad = NT, p0 = 0, s0 = 0;
        struct kv_store *kv;
        T_CHECK(model_kv_new(pad.m, QT_F32, BS, N_BLOCKS, 0, &kv, &e) == SMELT_OK);
        int32_t blk = 0;
        struct batch_seq v = {.blocks = &blk, .n_blocks = 1};
        struct batch b = {1, &bad, &p0, &s0, NULL, 1, &v};
        T_CHECK(model_forward(pad.m, kv, &b, lp, NULL, &e) == SMELT_ERR_RANGE);
        model_kv_free(pad.m, kv);
        free(la);
        free(lp);
        unload(&all);
        unload(&pad);
    }
}

/* More tokens than embedding rows: refused, naming both and both counts. Output rows that
 * differ from the embedding's: refused. */
static void test_vocab_errors(void) {
    struct tiny t = archs[0];
    t.n_tokens = N_VOCAB + 6;
    expect_load_error(t, "tokenizer.ggml.tokens has 70 tokens", "token_embd.weight has 64 rows");
    t = archs[1]; /* tied */
    t.n_tokens = N_VOCAB + 1;
    expect_load_error(t, "tokenizer.ggml.tokens has 65 tokens", "token_embd.weight has 64 rows");
    t = archs[0];
    t.n_tokens = N_VOCAB - 4;
    t.bad_tensor = "output.weight"; /* 65 rows */
    expect_load_error(t, "output.weight", "(32, 65)");
}

int main(void) {
    struct err e;
    if (cpu_backend_new(&bk, 0, &e) != SMELT_OK) return 1;
    T_RUN(test_llama);
    T_RUN(test_qwen2);
    T_RUN(test_qwen3);
    T_RUN(test_gemma3);
    T_RUN(test_qwen3moe);
    T_RUN(test_gpt_oss);
    T_RUN(test_quantized);
    T_RUN(test_sparse_logits);
    T_RUN(test_recycle);
    T_RUN(test_bad_batch);
    T_RUN(test_load_errors);
    T_RUN(test_moe_load_errors);
    T_RUN(test_gpt_oss_load_errors);
    T_RUN(test_yarn_attn_factor);
    T_RUN(test_padded_vocab);
    T_RUN(test_vocab_errors);
    bk_free(bk);
    return t_done();
}

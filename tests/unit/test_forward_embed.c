/* Embedding models against sentence-transformers and transformers on the tiny fixtures of
 * tests/data/ref-embed (scripts/make-embed-fixtures.py): bert with mean and CLS pooling
 * (its reference includes HF's WordPiece tokenizer: our ids must be HF's), and a Qwen3
 * decoder with last-token pooling. Everything runs through the engine as the server runs
 * it: all inputs of a model submitted at once (batched in one step), pooled, then
 * L2-normalized here as the server does. Each embedding's cosine with the reference must
 * be >= 0.9999 (the bound); the exact path (reference matmuls) must also be within
 * 1e-5 of it element by element. Then the engine's embedding rules: a bidirectional
 * model's input runs whole in one step and never reaches the prefix cache, a causal model
 * with last pooling chunks its prefill and takes prefix hits, and requests of the wrong kind
 * or too long are refused; and model_step_hidden's contract. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "model/model.h"
#include "t.h"
#include "tokenizer/tok.h"

#define DIR SMELT_SOURCE_DIR "/tests/data/ref-embed"

static struct backend *bk;
static json_t *manifest;

struct fixture {
    struct gguf_file *f;
    struct model *m;
    struct tok *tok;
    struct kv_store *kv;
    struct engine *en;
    int32_t max_rows; /* the most rows a step of the engine had (observer) */
    bool split;       /* a bidirectional sequence ran in more than one step (observer) */
};

static void observe(void *ctx, const struct engine_step_info *info) {
    struct fixture *fx = ctx;
    if (info->n_rows > fx->max_rows) fx->max_rows = info->n_rows;
    for (int32_t i = 0; i < info->n_running; i++) {
        const struct engine_step_seq *q = &info->running[i];
        if (q->rows > 0 && (q->n_done != 0 || q->rows != q->n_tok)) fx->split = true;
    }
}

static bool open_fixture(struct fixture *fx, const char *file, int32_t batch_tokens,
                         bool no_prefix) {
    memset(fx, 0, sizeof *fx);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", DIR, file);
    struct err e;
    if (gguf_open(&fx->f, path, &e) != SMELT_OK || model_load(&fx->m, fx->f, bk, &e) != SMELT_OK ||
        tok_new_from_gguf(&fx->tok, fx->f, NULL, &e) != SMELT_OK ||
        model_kv_new(fx->m, QT_F32, 16, 64, 0, &fx->kv, &e) != SMELT_OK) {
        fprintf(stderr, "%s: %s\n", file, e.msg);
        return false;
    }
    struct engine_config c = {.max_seqs = 16, .max_batch_tokens = batch_tokens, .n_blocks = 64,
                              .no_prefix_cache = no_prefix, .on_step = observe, .on_step_ctx = fx};
    if (engine_new(&fx->en, &c, fx->m, fx->kv, fx->tok, &e) != SMELT_OK) {
        fprintf(stderr, "%s: engine: %s\n", file, e.msg);
        return false;
    }
    return true;
}

static void close_fixture(struct fixture *fx) {
    engine_free(fx->en);
    model_kv_free(fx->m, fx->kv);
    tok_free(fx->tok);
    model_free(fx->m);
    gguf_close(fx->f);
}

/* The ids of a manifest input. */
static int32_t input_ids(const json_t *in, int32_t *ids, int32_t cap) {
    const json_t *a = json_object_get(in, "ids");
    int32_t n = (int32_t)json_array_size(a);
    for (int32_t i = 0; i < n && i < cap; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return n;
}

/* Submits n embedding requests at once; waits for each; writes its normalized vector into
 * out (n_embd each) and its cached count into cached. Returns false on a failure. */
static bool embed_all(struct fixture *fx, int n, int32_t *const *ids, const int32_t *len,
                      float *out, int32_t *cached) {
    enum { MAXN = 16 };
    struct engine_req *r[MAXN] = {0};
    struct err e;
    struct engine_params p;
    engine_params_default(&p);
    p.embed = true;
    bool ok = n <= MAXN;
    for (int i = 0; ok && i < n; i++) {
        ok = engine_req_new(&r[i], &p, ids[i], len[i], &e) == SMELT_OK &&
             engine_submit(fx->en, r[i], &e) == SMELT_OK;
        if (!ok) fprintf(stderr, "submit %d: %s\n", i, e.msg);
    }
    const int32_t d = engine_embd_size(fx->en);
    for (int i = 0; ok && i < n; i++) {
        struct engine_out o = {0};
        bool got = false;
        while (!got && engine_req_wait(r[i], &o, 10000)) {
            for (size_t k = 0; k < o.n_ev; k++) {
                const struct engine_event *ev = &o.ev[k];
                if (!ev->finish) continue;
                ok = ev->finish == ENGINE_STOP && ev->n_embd == d;
                if (!ok) fprintf(stderr, "input %d: finish %d (%s), %d floats\n", i, ev->finish,
                                 o.error, ev->n_embd);
                double ss = 0;
                for (int32_t j = 0; ok && j < d; j++) ss += (double)o.embd[ev->embd + j] * o.embd[ev->embd + j];
                for (int32_t j = 0; ok && j < d; j++)
                    out[(size_t)i * d + j] = (float)(o.embd[ev->embd + j] / sqrt(ss));
                if (cached) cached[i] = ev->n_cached;
                got = true;
            }
            if (o.done) break;
        }
        ok = ok && got;
        engine_out_free(&o);
    }
    for (int i = 0; i < n; i++) engine_req_unref(r[i]);
    return ok;
}

/* Every input of model `name` through fx's engine at once, against the reference. */
static void check_model(const json_t *mod, const char *file, bool exact) {
    struct fixture fx;
    cpu_backend_set_exact(bk, exact);
    if (!open_fixture(&fx, file, 512, false)) {
        T_CHECKF(false, "%s: cannot open", file);
        return;
    }
    const json_t *inputs = json_object_get(mod, "inputs");
    int n = (int)json_array_size(inputs);
    int32_t d = engine_embd_size(fx.en), len[16] = {0}, *ids[16] = {0};
    T_EQ_INT(d, json_integer_value(json_object_get(mod, "n_embd")));
    float *got = calloc((size_t)n * (size_t)d, sizeof *got);
    for (int i = 0; i < n; i++) {
        ids[i] = malloc(256 * sizeof(int32_t));
        len[i] = input_ids(json_array_get(inputs, (size_t)i), ids[i], 256);
        /* a text input: our WordPiece / BPE ids must be HF's */
        const json_t *text = json_object_get(json_array_get(inputs, (size_t)i), "text");
        if (text) {
            struct tok_ids t = {0};
            struct err e;
            T_CHECK(tok_encode(fx.tok, json_string_value(text), json_string_length(text),
                               TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &t, &e) == SMELT_OK);
            bool same = (int32_t)t.n == len[i] && !memcmp(t.v, ids[i], t.n * sizeof *t.v);
            T_CHECKF(same, "%s input %d: our %zu ids differ from HF's %d", file, i, t.n, len[i]);
            tok_ids_free(&t);
        }
    }
    T_CHECK(embed_all(&fx, n, ids, len, got, NULL));
    double worst_cos = 1, worst_abs = 0;
    for (int i = 0; i < n; i++) {
        const json_t *ref = json_object_get(json_array_get(inputs, (size_t)i), "embedding");
        double dot = 0, nr = 0;
        for (int32_t j = 0; j < d; j++) {
            double r = json_real_value(json_array_get(ref, (size_t)j)), g = got[(size_t)i * d + j];
            dot += r * g;
            nr += r * r;
            if (fabs(r - g) > worst_abs) worst_abs = fabs(r - g);
        }
        double cs = dot / sqrt(nr);
        if (cs < worst_cos) worst_cos = cs;
    }
    printf("%s (%s path): %d inputs in one step of %d rows, min cosine %.8f, max |d| %.2g\n", file,
           exact ? "exact" : "fast", n, fx.max_rows, worst_cos, worst_abs);
    T_CHECKF(worst_cos >= 0.9999, "%s: cosine %.6f", file, worst_cos);
    if (exact) T_CHECKF(worst_abs < 1e-5, "%s exact: max |d| %g", file, worst_abs);
    T_CHECK(!fx.split);
    for (int i = 0; i < n; i++) free(ids[i]);
    free(got);
    close_fixture(&fx);
    cpu_backend_set_exact(bk, false);
}

static const json_t *model_entry(const char *name) {
    const json_t *ms = json_object_get(manifest, "models");
    for (size_t i = 0; i < json_array_size(ms); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(ms, i), "name")), name))
            return json_array_get(ms, i);
    return NULL;
}

static void test_references(void) {
    const json_t *ms = json_object_get(manifest, "models");
    for (size_t i = 0; i < json_array_size(ms); i++) {
        const json_t *mod = json_array_get(ms, i), *files = json_object_get(mod, "files");
        for (size_t k = 0; k < json_array_size(files); k++) {
            const char *file = json_string_value(json_array_get(files, k));
            check_model(mod, file, true);
            check_model(mod, file, false);
        }
    }
}

/* bert runs a sequence whole in one step: with a budget of 16 tokens the 13-token input
 * runs (alone in its step: the others wait), the 47-token one is refused at submit; the
 * prefix cache never serves it (the same input twice computes twice). */
static void test_bidirectional_whole(void) {
    const json_t *in = json_object_get(model_entry("bert"), "inputs");
    struct fixture fx;
    T_CHECK(open_fixture(&fx, "bert-f32.gguf", 16, false));
    T_EQ_INT(engine_embd_max_tokens(fx.en), 16);
    int32_t a[256], b[256], c[256];
    int32_t la = input_ids(json_array_get(in, 0), a, 256), lb = input_ids(json_array_get(in, 1), b, 256),
            lc = input_ids(json_array_get(in, 9), c, 256);
    T_CHECK(la + lb > 16 && la <= 16 && lb <= 16 && lc > 16);
    int32_t *ids[3] = {a, b, a}, len[3] = {la, lb, la}, cached[3];
    float out[3 * 32];
    T_CHECK(embed_all(&fx, 3, ids, len, out, cached));
    T_CHECK(!fx.split && fx.max_rows <= 16);
    T_EQ_INT(cached[2], 0);
    for (int j = 0; j < 32; j++) T_CHECK(out[j] == out[64 + j]); /* the same input, the same vector */
    struct engine_req *r;
    struct err e;
    struct engine_params p;
    engine_params_default(&p);
    p.embed = true;
    T_CHECK(engine_req_new(&r, &p, c, lc, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(fx.en, r, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "one step") != NULL, "%s", e.msg);
    engine_req_unref(r);
    /* a generation request on an embedding model */
    p.embed = false;
    T_CHECK(engine_req_new(&r, &p, a, la, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(fx.en, r, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "embedding model") != NULL, "%s", e.msg);
    engine_req_unref(r);
    close_fixture(&fx);
}

/* qwen3 (causal, last pooling): a 16-token budget (the least with 16 sequences) splits the 41-token input into chunks and
 * gives the same vector (to rounding) as one step; the same input again takes its full
 * blocks from the prefix cache and still gives the same vector. */
static void test_causal_chunked(void) {
    const json_t *mod = model_entry("qwen3emb"), *in = json_object_get(mod, "inputs");
    int32_t a[256], la = input_ids(json_array_get(in, 3), a, 256);
    float whole[64], chunked[2 * 64];
    struct fixture fx;
    T_CHECK(open_fixture(&fx, "qwen3emb-f32.gguf", 512, true));
    int32_t *ids[2] = {a, a}, len[2] = {la, la}, cached[2];
    T_CHECK(embed_all(&fx, 1, ids, len, whole, NULL));
    close_fixture(&fx);
    T_CHECK(open_fixture(&fx, "qwen3emb-f32.gguf", 16, false));
    T_CHECK(embed_all(&fx, 1, ids, len, chunked, cached));
    T_CHECK(embed_all(&fx, 1, ids + 1, len + 1, chunked + 64, cached + 1));
    T_CHECK(fx.max_rows <= 16);
    T_EQ_INT(cached[0], 0);
    T_EQ_INT(cached[1], (la - 1) / 16 * 16);
    double worst = 0;
    for (int j = 0; j < 64; j++) {
        worst = fmax(worst, fabs(chunked[j] - whole[j]));
        worst = fmax(worst, fabs(chunked[64 + j] - whole[j]));
    }
    T_CHECKF(worst < 1e-5, "chunked vs whole: %g", worst);
    close_fixture(&fx);
}

/* model_step_hidden's contract, and an encoder's refusals. */
static void test_contract(void) {
    struct fixture fx;
    T_CHECK(open_fixture(&fx, "bert-f32.gguf", 64, false));
    int32_t blocks[1] = {0}, tok[3] = {2, 10, 3}, pos[3] = {1, 2, 3}, seq[3] = {0, 0, 0};
    uint8_t want[3] = {1, 1, 1};
    struct batch_seq bs = {blocks, 1, 0, 0, 0};
    struct batch b = {3, tok, pos, seq, want, 1, &bs};
    float h[3 * 32];
    struct err e;
    /* a sequence that does not start at position 0 (its earlier keys are not in the step) */
    T_EQ_INT(model_step_hidden(fx.m, fx.kv, &b, h, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "bidirectional") != NULL, "%s", e.msg);
    pos[0] = 0, pos[1] = 1, pos[2] = 2;
    int32_t n_out = 0;
    T_EQ_INT(model_step_hidden(fx.m, fx.kv, &b, h, &n_out, &e), SMELT_OK);
    T_EQ_INT(n_out, 3);
    /* logits from an encoder */
    float lg[3 * 200];
    T_EQ_INT(model_forward(fx.m, fx.kv, &b, lg, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "no output head") != NULL, "%s", e.msg);
    /* a position past the position embeddings (64) */
    int32_t many[4] = {0, 1, 2, 3};
    struct batch_seq b5 = {many, 4, 0, 0, 0};
    int32_t t65[65], p65[65], s65[65];
    for (int i = 0; i < 65; i++) t65[i] = 5, p65[i] = i, s65[i] = 0;
    struct batch big = {65, t65, p65, s65, NULL, 1, &b5};
    T_EQ_INT(model_step_hidden(fx.m, fx.kv, &big, h, NULL, &e), SMELT_ERR_RANGE);
    T_CHECKF(strstr(e.msg, "position embeddings") != NULL, "%s", e.msg);
    close_fixture(&fx);
    /* an embedding request on a generative model */
    T_CHECK(open_fixture(&fx, "../ref/qwen3-f32.gguf", 64, false));
    T_EQ_INT(engine_embd_size(fx.en), 0);
    struct engine_req *r;
    struct engine_params p;
    engine_params_default(&p);
    p.embed = true;
    T_CHECK(engine_req_new(&r, &p, tok, 3, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(fx.en, r, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "not an embedding model") != NULL, "%s", e.msg);
    engine_req_unref(r);
    close_fixture(&fx);
}

int main(void) {
    struct err e;
    json_error_t je;
    manifest = json_load_file(DIR "/manifest.json", 0, &je);
    if (!manifest) {
        fprintf(stderr, "%s/manifest.json: %s\n", DIR, je.text);
        return 1;
    }
    if (cpu_backend_new(&bk, 2, &e) != SMELT_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    T_RUN(test_references);
    T_RUN(test_bidirectional_whole);
    T_RUN(test_causal_chunked);
    T_RUN(test_contract);
    bk_free(bk);
    json_decref(manifest);
    return t_done();
}

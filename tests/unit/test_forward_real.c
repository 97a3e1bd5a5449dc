/* The quantized CPU forward pass on the real test models (models/NAME.gguf, fetched by
 * scripts/fetch-test-models.sh) against transformers running the same GGUF dequantized to
 * float32 (tests/data/ref-real/NAME.json: top-20 logits per position of a few prompts, and
 * a greedy continuation).
 *
 * 1. Exact path (reference matmuls: weights dequantized, F32 activations; F32 KV) on the
 *    prompts of up to 32 tokens: the reference top-20 logits to 1e-3 relative (measured
 *    6e-5 gemma3, 4e-6 qwen2). This checks the forward pass itself on real quantized
 *    weights.
 * 2. Fast path (cpu_matmul: activations rounded to 15 bits with one scale per row and
 *    dotted in integers against the packed weights, cpu_kernels.h; F16 KV) on every prompt.
 *    Its logits differ from float32 by the activation rounding (mean |d logit| over the
 *    reference top-20: ~0.005 gemma3, ~0.003 qwen2; llama.cpp-style 8-bit blocks gave 0.22
 *    and 0.06 and flipped ~1.5% of the top-1 tokens). Demanded: top-1 agreement >= 99% of
 *    positions (the figure; measured 100% on both), mean |d logit| < MAX_NOISE,
 *    every flip at a position whose reference top-2 margin is < NOISE_MARGIN, top-10 sets
 *    overlapping (mean >= 9 of 10, never below 7), and our error on the reference top-2
 *    margins small enough that Gaussian noise of its rms predicts under a quarter of the
 *    flips that 1% allows (so 99% does not hold by luck: measured 0.09 of 6.3 gemma3,
 *    0.00 of 2.5 qwen2; the 8-bit blocks predicted 7.5 and 2.7).
 * 3. Greedy continuation through the cache equal to transformers' until a step whose
 *    reference margin is < NOISE_MARGIN; the agreed text equals the reference text.
 * Our tokenizer must produce the reference prompt ids (a cross-check of tok/).
 * Skips, saying why, when a model or its reference file is absent.
 *
 * Under a sanitizer (about 30x slower here) only the prompts of up to 32 tokens and 4
 * greedy steps run, and the agreement percentage is not demanded (one noise flip among
 * 23 positions is 4%); the flip-margin, overlap, exact and greedy checks remain. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "t.h"
#include "tokenizer/tok.h"

#define REF_DIR SMELT_SOURCE_DIR "/tests/data/ref-real"
#define MODEL_DIR SMELT_SOURCE_DIR "/models"
#define NOISE_MARGIN 0.2
#define MAX_NOISE 0.02
#define MAX_MARGINS 4096

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifdef SANITIZED
#define MAX_PROMPT 32
#define MAX_GREEDY 4
#else
#define MAX_PROMPT 1000000
#define MAX_GREEDY 1000000
#endif

static struct backend *bk, *bk_exact;

struct ctx {
    struct gguf_file *f;
    struct model *m;
    struct tok *tok;
    struct kv_store *kv;
    struct kv_pool pool;
    struct kv_seq seq;
    int32_t n_cached;
};

/* Appends ids at the end of the cached sequence; logits of every new row to out (may
 * be NULL: only the last row's, into last). */
static bool feed(struct ctx *c, const int32_t *ids, int n, float *out, float *last) {
    struct err e;
    if (kv_seq_reserve(&c->pool, &c->seq, c->n_cached + n, &e) != SMELT_OK) return false;
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++) pos[i] = c->n_cached + i, want[i] = out != NULL || i == n - 1;
    struct batch_seq view = kv_seq_view(&c->seq);
    struct batch b = {n, ids, pos, seq, want, 1, &view};
    bool ok = model_forward(c->m, c->kv, &b, out ? out : last, NULL, &e) == SMELT_OK;
    if (!ok) fprintf(stderr, "forward: %s\n", e.msg);
    free(pos);
    free(seq);
    free(want);
    c->n_cached += n;
    return ok;
}

static void reset(struct ctx *c) {
    kv_seq_release(&c->pool, &c->seq);
    c->n_cached = 0;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Our top-k ids of v (k <= 32), by descending logit. */
static void topk(const float *v, int n, int k, int *out) {
    for (int j = 0; j < k; j++) out[j] = -1;
    for (int i = 0; i < n; i++) {
        int j = k;
        while (j > 0 && (out[j - 1] < 0 || v[i] > v[out[j - 1]])) j--;
        if (j < k) {
            memmove(out + j + 1, out + j, (size_t)(k - j - 1) * sizeof(int));
            out[j] = i;
        }
    }
}

static int32_t *json_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = malloc((size_t)(*n > 0 ? *n : 1) * 4);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* Exact matmuls, F32 KV, prompts of up to 32 tokens: top-20 logits within 1e-3 of the
 * reference's largest logit. */
static void check_exact(const struct gguf_file *f, json_t *ref, const char *model_file) {
    struct ctx c = {0};
    struct err e;
    if (model_load(&c.m, f, bk_exact, &e) != SMELT_OK ||
        model_kv_new(c.m, QT_F32, 16, 4, 0, &c.kv, &e) != SMELT_OK ||
        kv_pool_init(&c.pool, 4, 16, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", model_file, e.msg);
        model_free(c.m);
        return;
    }
    int n_vocab = c.m->hp.n_vocab, checked = 0;
    double worst = 0;
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(ref, "prompts"), ip, jp) {
        int n;
        int32_t *ids = json_ids(json_object_get(jp, "ids"), &n);
        if (n <= 32) {
            float *out = malloc((size_t)n * n_vocab * sizeof(float));
            reset(&c);
            T_CHECK(feed(&c, ids, n, out, NULL));
            json_t *jk = json_object_get(jp, "topk_ids"), *jl = json_object_get(jp, "topk_logits");
            for (int t = 0; t < n; t++) {
                json_t *row = json_array_get(jk, (size_t)t), *lrow = json_array_get(jl, (size_t)t);
                double top = fabs(json_real_value(json_array_get(lrow, 0)));
                for (size_t k = 0; k < json_array_size(row); k++) {
                    double d = fabs(out[(size_t)t * n_vocab + json_integer_value(json_array_get(row, k))] -
                                    json_real_value(json_array_get(lrow, k)));
                    if (d / (top > 1 ? top : 1) > worst) worst = d / (top > 1 ? top : 1);
                }
            }
            checked += n;
            free(out);
        }
        free(ids);
    }
    printf("%s: exact matmuls, F32 KV: max rel err %.2e over the top-20 of %d positions\n",
           model_file, worst, checked);
    T_CHECK(checked > 0);
    T_CHECKF(worst < 1e-3, "%s: exact forward differs from the reference by %g", model_file, worst);
    kv_seq_release(&c.pool, &c.seq);
    kv_pool_free(&c.pool);
    model_kv_free(c.m, c.kv);
    model_free(c.m);
}

static void check_file(const char *ref_name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, ref_name);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    if (!ref) {
        char why[600];
        snprintf(why, sizeof why, "%s absent", path);
        t_skip(why);
        return;
    }
    const char *model_file = json_string_value(json_object_get(ref, "model_file"));
    snprintf(path, sizeof path, "%s/%s", MODEL_DIR, model_file ? model_file : "?");
    struct ctx c = {0};
    struct err e;
    if (gguf_open(&c.f, path, &e) != SMELT_OK) {
        char why[1200];
        snprintf(why, sizeof why, "%s: %s (run scripts/fetch-test-models.sh)", path, e.msg);
        t_skip_model(why);
        json_decref(ref);
        return;
    }
    T_CHECK(model_load(&c.m, c.f, bk, &e) == SMELT_OK);
    T_CHECK(tok_new_from_gguf(&c.tok, c.f, NULL, &e) == SMELT_OK);
    if (!c.m || !c.tok || model_kv_new(c.m, QT_F16, 16, 64, 0, &c.kv, &e) != SMELT_OK ||
        kv_pool_init(&c.pool, 64, 16, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", model_file, e.msg);
        goto out;
    }
    int n_vocab = c.m->hp.n_vocab;
    check_exact(c.f, ref, model_file);

    int positions = 0, top1 = 0, min_overlap = 10, n_margins = 0;
    static double margins[MAX_MARGINS];
    double merr2 = 0;
    double overlap_sum = 0, noise_sum = 0, noise_max = 0, worst_flip = 0;
    int64_t noise_n = 0;
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(ref, "prompts"), ip, jp) {
        int n;
        int32_t *ids = json_ids(json_object_get(jp, "ids"), &n);
        const char *text = json_string_value(json_object_get(jp, "text"));
        if (n > MAX_PROMPT) {
            free(ids);
            continue;
        }
        struct tok_ids mine = {0};
        T_CHECK(tok_encode(c.tok, text, strlen(text), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &mine,
                           &e) == SMELT_OK);
        T_CHECKF(mine.n == (size_t)n && !memcmp(mine.v, ids, (size_t)n * 4),
                 "%s prompt %zu: our tokenizer gives %zu ids, the reference %d", model_file, ip,
                 mine.n, n);
        tok_ids_free(&mine);
        float *out = malloc((size_t)n * n_vocab * sizeof(float));
        reset(&c);
        T_CHECK(feed(&c, ids, n, out, NULL));
        json_t *jk = json_object_get(jp, "topk_ids"), *jl = json_object_get(jp, "topk_logits");
        for (int t = 0; t < n; t++) {
            json_t *row = json_array_get(jk, (size_t)t), *lrow = json_array_get(jl, (size_t)t);
            const float *lg = out + (size_t)t * n_vocab;
            int ours[10];
            topk(lg, n_vocab, 10, ours);
            /* logit noise against the reference over its top 20 */
            for (size_t k = 0; k < json_array_size(row); k++) {
                double d = fabs(lg[json_integer_value(json_array_get(row, k))] -
                                json_real_value(json_array_get(lrow, k)));
                noise_sum += d;
                noise_n++;
                if (d > noise_max) noise_max = d;
            }
            double margin = json_real_value(json_array_get(lrow, 0)) -
                            json_real_value(json_array_get(lrow, 1));
            /* our error on the reference's top-2 margin: its rms over the positions, with
             * the margins, gives the number of flips to expect from noise of that size */
            double dm = lg[json_integer_value(json_array_get(row, 0))] -
                        lg[json_integer_value(json_array_get(row, 1))] - margin;
            merr2 += dm * dm;
            if (n_margins < MAX_MARGINS) margins[n_margins++] = margin;
            if (ours[0] == json_integer_value(json_array_get(row, 0))) top1++;
            else {
                printf("  %s prompt %zu pos %d: top-1 %d vs %lld, reference margin %.3f\n",
                       model_file, ip, t, ours[0], json_integer_value(json_array_get(row, 0)), margin);
                if (margin > worst_flip) worst_flip = margin;
            }
            int ov = 0;
            for (int a = 0; a < 10; a++)
                for (int b = 0; b < 10; b++)
                    if (ours[a] == json_integer_value(json_array_get(row, (size_t)b))) ov++;
            overlap_sum += ov;
            if (ov < min_overlap) min_overlap = ov;
            positions++;
        }
        free(out);
        free(ids);
    }
    double agree = positions ? (double)top1 / positions : 0;
    printf("%s: top-1 agrees on %d/%d positions (%.2f%%), top-10 overlap mean %.2f min %d\n",
           model_file, top1, positions, 100 * agree, positions ? overlap_sum / positions : 0,
           min_overlap);
    printf("%s: |logit - reference| over the reference top-20: mean %.3f, max %.3f; largest "
           "reference margin at a flip %.3f\n", model_file, noise_n ? noise_sum / noise_n : 0,
           noise_max, worst_flip);
    if (n_margins) { /* expected flips for Gaussian noise of that rms on each margin */
        double sig = sqrt(merr2 / n_margins), expect = 0;
        for (int i = 0; i < n_margins; i++)
            expect += sig > 0 ? 0.5 * erfc(margins[i] / (sig * sqrt(2.0))) : 0.0;
        printf("%s: error of the reference top-2 margin: rms %.4f; flips that noise predicts: "
               "%.2f of %d positions (1%% = %.2f)\n",
               model_file, sig, expect, n_margins, n_margins / 100.0);
#ifndef SANITIZED
        /* 99% is met by margin, not by luck: noise of this size predicts < 1/4 of the 1%
         * budget of flips (8-bit blocks predicted 7.5 of 6.3 and 2.7 of 2.5) */
        T_CHECKF(expect < n_margins / 400.0, "%s: the noise predicts %.2f flips", model_file,
                 expect);
#endif
    }
#ifndef SANITIZED
    T_CHECKF(agree >= 0.99, "%s: top-1 agreement %.4f", model_file, agree);
#endif
    T_CHECKF(noise_n && noise_sum / noise_n < MAX_NOISE, "%s: mean |logit - reference| %.4f",
             model_file, noise_n ? noise_sum / noise_n : 0.0);
    /* a flip is rounding noise only where the reference itself hesitates */
    T_CHECKF(worst_flip < NOISE_MARGIN, "%s: a top-1 flip where the reference margin is %.3f",
             model_file, worst_flip);
    T_CHECK(positions && overlap_sum / positions >= 9.0 && min_overlap >= 7);

    /* Greedy continuation, one token per step through the cache. */
    json_t *g = json_object_get(ref, "greedy");
    int np, ng;
    int32_t *pids = json_ids(json_object_get(g, "prompt_ids"), &np);
    int32_t *gids = json_ids(json_object_get(g, "ids"), &ng);
    if (ng > MAX_GREEDY) ng = MAX_GREEDY;
    float *last = malloc((size_t)n_vocab * sizeof(float));
    reset(&c);
    T_CHECK(feed(&c, pids, np, NULL, last));
    int agreed = 0;
    for (; agreed < ng; agreed++) {
        int32_t t = argmax(last, n_vocab);
        if (t != gids[agreed]) {
            double margin = json_real_value(json_array_get(json_object_get(g, "margins"), (size_t)agreed));
            T_CHECKF(margin < NOISE_MARGIN, "%s greedy step %d: %d vs %d with margin %g", model_file,
                     agreed, t, gids[agreed], margin);
            break;
        }
        if (!feed(&c, &t, 1, NULL, last)) break;
    }
    struct tok_buf txt = {0};
    T_CHECK(tok_decode(c.tok, gids, (size_t)agreed, 0, &txt, &e) == SMELT_OK);
    const char *want = json_string_value(json_object_get(g, "text"));
    T_CHECKF(txt.p && want && !strncmp(txt.p, want, txt.n), "greedy text \"%s\" vs \"%s\"",
             txt.p ? txt.p : "", want ? want : "");
    printf("%s: greedy: %d/%d tokens agree: \"%s\"\n", model_file, agreed, ng, txt.p ? txt.p : "");
    tok_buf_free(&txt);
    free(pids);
    free(gids);
    free(last);
out:
    kv_seq_release(&c.pool, &c.seq);
    kv_pool_free(&c.pool);
    if (c.m) model_kv_free(c.m, c.kv);
    model_free(c.m);
    tok_free(c.tok);
    gguf_close(c.f);
    json_decref(ref);
}

static void test_gemma3_270m(void) { check_file("gemma3-270m-q4_k_m.json"); }
static void test_qwen25_coder_05b(void) { check_file("qwen2.5-coder-0.5b-instruct-awq-q4_k_m.json"); }

int main(void) {
    struct err e;
    if (cpu_backend_new(&bk, 0, &e) != SMELT_OK || cpu_backend_new(&bk_exact, 0, &e) != SMELT_OK)
        return 1;
    cpu_backend_set_exact(bk_exact, true);
    T_RUN(test_gemma3_270m);
    T_RUN(test_qwen25_coder_05b);
    bk_free(bk);
    bk_free(bk_exact);
    return t_done();
}

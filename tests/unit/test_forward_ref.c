/* The CPU forward pass against transformers' logits on the tiny random-weight fixtures of
 * tests/data/ref (llama, llama3 scaling, qwen2, qwen3, gemma3, linear and YaRN scaling,
 * qwen3moe, gpt-oss; F32 and F16 GGUF files holding the same numbers, and the MoE models'
 * quantized-experts files holding them too: qwen3moe's Q8_0, gpt-oss's MXFP4). Every
 * position of every prompt must have the same argmax and a max relative error (max |d
 * logit| / max |logit|) under 1e-4 (quantized experts on the fast path: 1e-3).
 *
 * Each prompt runs as one prefill, and as a prefill of the first part then one decode
 * step per remaining token (the cache path); then all prompts run together as sequences
 * of one batch (prefill chunks side by side, then decoding together). Prints the worst
 * error per fixture (docs/forward.md quotes them). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "ref_util.h"
#include "t.h"

#define REF_DIR SMELT_SOURCE_DIR "/tests/data/ref"
#define TOL 1e-4
#define TOL_Q 1e-3

static struct backend *bk;


/* Runs n_seq prompts as sequences of one fresh cache: the first step takes the first
 * n_first[q] tokens of every sequence (a prefill chunk each, all in one batch), then each
 * step one token of every sequence not done yet (the sequences decoding together).
 * out[q] gets (n_vocab) logits per position of prompt q. */
static bool run(struct model *m, int n_seq, int32_t *const *ids, const int *n, const int *n_first,
                float *const *out) {
    enum { MAXQ = 4, MAXT = 256 };
    struct err e;
    struct kv_store *kv;
    struct kv_pool pool;
    if (n_seq > MAXQ || model_kv_new(m, QT_F32, 16, 16, 0, &kv, &e) != SMELT_OK ||
        kv_pool_init(&pool, 16, 16, &e)) {
        fprintf(stderr, "kv: %s\n", e.msg);
        return false;
    }
    struct kv_seq sq[MAXQ];
    struct batch_seq views[MAXQ];
    int done[MAXQ] = {0};
    bool ok = true;
    for (int q = 0; q < n_seq; q++) {
        kv_seq_init(&sq[q]);
        ok = ok && kv_seq_reserve(&pool, &sq[q], n[q], &e) == SMELT_OK;
        views[q] = kv_seq_view(&sq[q]);
    }
    int32_t tok[MAXT], pos[MAXT], seq[MAXT];
    uint8_t want[MAXT];
    float *lg = malloc(sizeof(float) * MAXT * (size_t)m->hp.n_vocab);
    for (bool first = true; ok; first = false) {
        int rows = 0;
        for (int q = 0; q < n_seq; q++) {
            int take = first ? n_first[q] : done[q] < n[q];
            for (int j = 0; j < take && rows < MAXT; j++, rows++) {
                tok[rows] = ids[q][done[q] + j];
                pos[rows] = done[q] + j;
                seq[rows] = q;
                want[rows] = 1;
            }
        }
        if (rows == 0) break;
        struct batch b = {rows, tok, pos, seq, want, n_seq, views};
        int32_t n_out;
        ok = model_forward(m, kv, &b, lg, &n_out, &e) == SMELT_OK && n_out == rows;
        if (!ok) fprintf(stderr, "forward: %s\n", e.msg);
        for (int r = 0; ok && r < rows; r++) {
            memcpy(out[seq[r]] + (size_t)pos[r] * m->hp.n_vocab, lg + (size_t)r * m->hp.n_vocab,
                   sizeof(float) * (size_t)m->hp.n_vocab);
            done[seq[r]]++;
        }
    }
    free(lg);
    for (int q = 0; q < n_seq; q++) kv_seq_release(&pool, &sq[q]);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
    return ok;
}

/* One file of a fixture: every prompt run alone as one prefill, alone as a prefill of
 * its first half then one decode step per token, and all prompts together as sequences
 * of one batch (their first halves in one step, then decoding together). tol bounds the
 * max relative error; exact: reference matmuls (cpu_backend_set_exact). */
static void check_model(json_t *jm, const char *variant, bool exact, double tol) {
    enum { MAXQ = 4 };
    const char *name = json_string_value(json_object_get(jm, "name"));
    json_t *jf = json_object_get(json_object_get(jm, "files"), variant);
    if (!jf) return; /* only the MoE fixtures have a quantized-experts file */
    const char *file = json_string_value(json_object_get(jf, "file"));
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    struct err e;
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    if (gguf_open(&f, path, &e) != SMELT_OK || model_load(&m, f, bk, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", file, e.msg);
        gguf_close(f);
        return;
    }
    cpu_backend_set_exact(bk, exact);
    const int n_vocab = m->hp.n_vocab;
    int nq = 0, n[MAXQ], half[MAXQ];
    int32_t *ids[MAXQ];
    float *ref[MAXQ], *out[MAXQ];
    double max_ref[MAXQ];
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(jm, "prompts"), ip, jp) {
        if (nq == MAXQ) break;
        json_t *jids = json_object_get(jp, "ids");
        n[nq] = (int)json_array_size(jids);
        half[nq] = n[nq] / 2 > 0 ? n[nq] / 2 : 1;
        ids[nq] = malloc((size_t)n[nq] * 4);
        for (int i = 0; i < n[nq]; i++)
            ids[nq][i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        ref[nq] = ref_read_f32(REF_DIR, json_string_value(json_object_get(jp, "logits")),
                               (size_t)n[nq] * n_vocab);
        out[nq] = malloc((size_t)n[nq] * n_vocab * sizeof(float));
        T_CHECKF(ref[nq] != NULL, "%s: logits file missing", name);
        max_ref[nq] = 0;
        for (size_t i = 0; ref[nq] && i < (size_t)n[nq] * n_vocab; i++)
            if (fabs(ref[nq][i]) > max_ref[nq]) max_ref[nq] = fabs(ref[nq][i]);
        nq++;
    }
    double worst[3] = {0, 0, 0};
    int flips = 0, positions = 0;
    for (int mode = 0; mode < 3; mode++) {
        if (mode < 2) /* each prompt alone: one prefill; half a prefill then decode */
            for (int q = 0; q < nq; q++) T_CHECK(run(m, 1, &ids[q], &n[q], mode ? &half[q] : &n[q], &out[q]));
        else /* all together: a batch of several sequences */
            T_CHECK(run(m, nq, ids, n, half, out));
        for (int q = 0; q < nq && ref[q]; q++)
            for (int t = 0; t < n[q]; t++) {
                const float *a = out[q] + (size_t)t * n_vocab, *r = ref[q] + (size_t)t * n_vocab;
                double d = 0;
                for (int i = 0; i < n_vocab; i++)
                    if (fabs((double)a[i] - r[i]) > d) d = fabs((double)a[i] - r[i]);
                if (d / max_ref[q] > worst[mode]) worst[mode] = d / max_ref[q];
                if (ref_argmax(a, n_vocab) != ref_argmax(r, n_vocab)) flips++;
                positions++;
            }
    }
    const double w = fmax(worst[0], fmax(worst[1], worst[2]));
    printf("%-12s %-5s %-5s max rel err %.2e (prefill %.2e, decode %.2e, batch of %d %.2e) over "
           "%d positions, %d argmax flips\n", name, variant, exact ? "exact" : "fast", w, worst[0],
           worst[1], nq, worst[2], positions, flips);
    T_CHECKF(w < tol, "%s %s: max rel err %g (tol %g)", name, variant, w, tol);
    T_EQ_INT(flips, 0);
    for (int q = 0; q < nq; q++) {
        free(ids[q]);
        free(ref[q]);
        free(out[q]);
    }
    cpu_backend_set_exact(bk, false);
    model_free(m);
    gguf_close(f);
}

static json_t *manifest;

static void check_all(const char *variant, bool exact, double tol) {
    size_t i;
    json_t *jm;
    json_array_foreach(json_object_get(manifest, "models"), i, jm) check_model(jm, variant, exact, tol);
}

static void test_f32(void) { check_all("f32", false, TOL); }
static void test_f16(void) { check_all("f16", false, TOL); }
/* The MoE fixtures' quantized experts (qwen3moe Q8_0, gpt-oss MXFP4): exact, the same
 * bound; the fast path rounds the experts' inputs to 15 bits (docs/forward.md), a looser
 * one. */
static void test_quantized_experts(void) {
    check_all("q8_0", true, TOL);
    check_all("q8_0", false, TOL_Q);
    check_all("mxfp4", true, TOL);
    check_all("mxfp4", false, TOL_Q);
}

/* --n-cpu-moe's path (bk_moe_ffn with the experts bound to another backend: backend.c's
 * moe_ffn_elsewhere), here with a second CPU backend holding the experts of the first
 * layer (or all): every prompt's logits, run as one batch of sequences, equal the plain
 * model's bit for bit (the same kernels; the norm and the residual add moved out of the
 * expert op are the same arithmetic). */
static void check_elsewhere(const char *file, int32_t n_cpu_moe) {
    enum { NQ = 3, NT = 12 };
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    struct err e;
    struct gguf_file *f = NULL;
    struct model *m = NULL, *mp = NULL;
    struct backend *hb = NULL;
    T_CHECKF(gguf_open(&f, path, &e) == SMELT_OK, "%s: %s", file, e.msg);
    if (!f) return;
    T_CHECK(model_load(&m, f, bk, &e) == SMELT_OK);
    T_CHECK(cpu_backend_new(&hb, 2, &e) == SMELT_OK);
    struct model_place place = {hb, n_cpu_moe};
    T_CHECKF(model_load_placed(&mp, f, bk, &place, &e) == SMELT_OK, "%s", e.msg);
    if (m && mp) {
        T_CHECK(mp->host_bk == hb && mp->n_cpu_moe == n_cpu_moe);
        int n_host = 0;
        for (int64_t i = 0; i < mp->n_tensors; i++)
            n_host += mp->tensors[i].backend == hb;
        T_CHECKF(n_host == 3 * (n_cpu_moe < m->hp.n_layer ? n_cpu_moe : m->hp.n_layer) ||
                     n_host == 6 * (n_cpu_moe < m->hp.n_layer ? n_cpu_moe : m->hp.n_layer),
                 "%d tensors on the host backend", n_host); /* gate, up, down (+ biases) */
        int32_t buf[NQ][NT], *ids[NQ];
        int n[NQ], n_first[NQ];
        float *a[NQ], *b[NQ];
        for (int q = 0; q < NQ; q++) {
            n[q] = NT - 3 * q;
            n_first[q] = n[q] / 2;
            for (int t = 0; t < n[q]; t++) buf[q][t] = (int32_t)((q * 37 + t * 11 + 1) % m->hp.n_vocab);
            ids[q] = buf[q];
            a[q] = calloc((size_t)NT * (size_t)m->hp.n_vocab, sizeof(float));
            b[q] = calloc((size_t)NT * (size_t)m->hp.n_vocab, sizeof(float));
        }
        T_CHECK(run(m, NQ, ids, n, n_first, a));
        T_CHECK(run(mp, NQ, ids, n, n_first, b));
        for (int q = 0; q < NQ; q++) {
            T_CHECKF(memcmp(a[q], b[q], sizeof(float) * (size_t)n[q] * (size_t)m->hp.n_vocab) == 0,
                     "%s, --n-cpu-moe %d: prompt %d differs", file, n_cpu_moe, q);
            free(a[q]);
            free(b[q]);
        }
    }
    model_free(mp); /* and hb with it (model_load_placed frees hb itself when it fails) */
    model_free(m);
    gguf_close(f);
}

static void test_experts_elsewhere(void) {
    cpu_backend_set_exact(bk, false);
    check_elsewhere("qwen3moe-q8_0.gguf", 1);
    check_elsewhere("qwen3moe-f32.gguf", 99);
    check_elsewhere("gpt-oss-mxfp4.gguf", 1); /* expert biases too */
}

int main(void) {
    json_error_t je;
    manifest = json_load_file(REF_DIR "/manifest.json", 0, &je);
    struct err e;
    if (cpu_backend_new(&bk, 0, &e) != SMELT_OK) return 1;
    if (!manifest) {
        printf("SKIP: %s/manifest.json absent\n", REF_DIR);
        bk_free(bk);
        return 77;
    }
    T_RUN(test_f32);
    T_RUN(test_f16);
    T_RUN(test_quantized_experts);
    T_RUN(test_experts_elsewhere);
    json_decref(manifest);
    bk_free(bk);
    return t_done();
}

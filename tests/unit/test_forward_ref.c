/* The CPU forward pass against transformers' logits on the tiny random-weight fixtures of
 * tests/data/ref (llama, llama3 scaling, qwen2, qwen3, gemma3, linear and YaRN scaling; F32
 * and F16 GGUF files holding the same numbers). Every position of every prompt must have
 * the same argmax and a max relative error (max |d logit| / max |logit|) under 1e-4.
 *
 * Each prompt runs twice: as one prefill, and as a prefill of the first part then one
 * decode step per remaining token (the cache path). Prints the worst error per fixture
 * (docs/forward.md quotes them). */
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

#define REF_DIR SMELT_SOURCE_DIR "/tests/data/ref"
#define TOL 1e-4

static struct backend *bk;

static float *read_f32(const char *name, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, name);
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    float *v = malloc(n * sizeof(float));
    size_t got = v ? fread(v, sizeof(float), n, fp) : 0;
    fclose(fp);
    if (got != n) {
        free(v);
        return NULL;
    }
    return v;
}

/* Runs ids through a fresh cache: the first n_prefill tokens in one step, then one token
 * per step. out gets (n_vocab) logits per position. */
static bool run(struct model *m, uint32_t kv_type, const int32_t *ids, int n, int n_prefill,
                float *out) {
    struct err e;
    struct kv_store *kv;
    struct kv_pool pool;
    if (model_kv_new(m, kv_type, 16, 8, &kv, &e) != SMELT_OK || kv_pool_init(&pool, 8, 16, &e)) {
        fprintf(stderr, "kv: %s\n", e.msg);
        return false;
    }
    struct kv_seq sq;
    kv_seq_init(&sq);
    bool ok = kv_seq_reserve(&pool, &sq, n, &e) == SMELT_OK;
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = 1;
    struct batch_seq view = kv_seq_view(&sq);
    for (int done = 0; ok && done < n;) {
        int take = done == 0 ? n_prefill : 1;
        struct batch b = {take, ids + done, pos + done, seq, want, 1, &view};
        int32_t n_out;
        ok = model_forward(m, kv, &b, out + (size_t)done * m->hp.n_vocab, &n_out, &e) == SMELT_OK &&
             n_out == take;
        if (!ok) fprintf(stderr, "forward: %s\n", e.msg);
        done += take;
    }
    free(pos);
    free(seq);
    free(want);
    kv_seq_release(&pool, &sq);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
    return ok;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void check_model(json_t *jm, const char *variant) {
    const char *name = json_string_value(json_object_get(jm, "name"));
    const char *file = json_string_value(
        json_object_get(json_object_get(json_object_get(jm, "files"), variant), "file"));
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
    int n_vocab = m->hp.n_vocab;
    double worst = 0;
    int flips = 0, positions = 0;
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(jm, "prompts"), ip, jp) {
        json_t *jids = json_object_get(jp, "ids");
        int n = (int)json_array_size(jids);
        int32_t *ids = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        float *ref = read_f32(json_string_value(json_object_get(jp, "logits")), (size_t)n * n_vocab);
        float *out = malloc((size_t)n * n_vocab * sizeof(float));
        T_CHECKF(ref != NULL, "%s: logits file missing", name);
        double max_ref = 0;
        for (size_t i = 0; ref && i < (size_t)n * n_vocab; i++)
            if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
        /* one prefill; then prefill of half + decode */
        int splits[2] = {n, n / 2 > 0 ? n / 2 : 1};
        for (int sp = 0; ref && sp < 2; sp++) {
            T_CHECK(run(m, QT_F32, ids, n, splits[sp], out));
            for (int t = 0; t < n; t++) {
                const float *a = out + (size_t)t * n_vocab, *r = ref + (size_t)t * n_vocab;
                double d = 0;
                for (int i = 0; i < n_vocab; i++)
                    if (fabs((double)a[i] - r[i]) > d) d = fabs((double)a[i] - r[i]);
                if (d / max_ref > worst) worst = d / max_ref;
                if (argmax(a, n_vocab) != argmax(r, n_vocab)) flips++;
                positions++;
            }
        }
        free(ids);
        free(ref);
        free(out);
    }
    printf("%-8s %-4s max rel err %.2e over %d positions, %d argmax flips\n", name, variant,
           worst, positions, flips);
    T_CHECKF(worst < TOL, "%s %s: max rel err %g", name, variant, worst);
    T_EQ_INT(flips, 0);
    model_free(m);
    gguf_close(f);
}

static json_t *manifest;

static void check_all(const char *variant) {
    size_t i;
    json_t *jm;
    json_array_foreach(json_object_get(manifest, "models"), i, jm) check_model(jm, variant);
}

static void test_f32(void) { check_all("f32"); }
static void test_f16(void) { check_all("f16"); }

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
    json_decref(manifest);
    bk_free(bk);
    return t_done();
}

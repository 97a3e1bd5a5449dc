/* The hybrid fixtures' scenarios (tests/data/ref-hybrid: qwen35, qwen35moe, qwen3next
 * against transformers' logits), run on any backend: test_forward_hybrid runs them on the
 * CPU, test_cuda_forward on the GPU, each with its own bounds (struct hy_opts). The
 * scenarios drive the memory bookkeeping (engine/kv.h: blocks, state slots, snapshots,
 * prefix cache) as the engine and `smelt run` do:
 *   - a long prefill: the 150-token prompt in one step (three 64-token chunks);
 *   - prefill then decode: 75 tokens, then one per step;
 *   - a batch of the three prompts (1, 7, 150 tokens) as three sequences in one step, each
 *     row against the same prompt run alone in one step;
 *   - a prefix-cache hit: a second sequence takes the first's cached blocks up to its
 *     last snapshot, restores the snapshot and computes only the rest;
 *   - preemption: a sequence decoding token by token is released at 130 and resumed
 *     from the cache (its trailing snapshot at 128);
 *   - a rollback: 10 wrong tokens at 120..129 are rolled back to 120 (the state comes
 *     from the snapshot at 112, positions 112..119 are fed again), then the right ones.
 * Every logits row must have the same argmax as transformers' and a max relative error
 * (max |d logit| / max |logit|) under the backend's bound. */
#ifndef SMELT_TEST_HYBRID_CHECK_H
#define SMELT_TEST_HYBRID_CHECK_H

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

#define REF_DIR SMELT_SOURCE_DIR "/tests/data/ref-hybrid"
#define BS 16
#define NB 64
#define SLOTS 12

/* What a backend is held to. */
struct hy_opts {
    struct backend *bk;
    json_t *manifest;
    uint32_t kv_type; /* the KV cache's element type */
    double tol[2];    /* max rel err against transformers: F32 files, F16 files */
    double batch[2];  /* a row in a batch against it alone, max |d logit| / max |logit|: F32
                       * files, F16 files; 0: bit for bit */
    bool near_ties;   /* an argmax flip where transformers scores the backend's pick within
                       * the file's bound of its own best (relative to the largest |logit|)
                       * is a near tie, counted apart; false: every flip fails */
};

struct prompt {
    int32_t *ids;
    int n;
    float *ref; /* (n, n_vocab) */
};

struct fx {
    struct gguf_file *f;
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    int nv;
    struct prompt p[3];
    float *solo[3]; /* each prompt's logits alone in one step */
    double worst, batch_diff, tol;
    int flips, ties;
    bool near_ties;
    const char *name, *label;
};

/* Rows got[0..count) against prompt pi's reference rows from position p0. */
static void compare(struct fx *x, int pi, int p0, int count, const float *got) {
    const struct prompt *pr = &x->p[pi];
    double max_ref = 0;
    for (size_t i = 0; i < (size_t)pr->n * x->nv; i++)
        if (fabs(pr->ref[i]) > max_ref) max_ref = fabs(pr->ref[i]);
    for (int t = 0; t < count; t++) {
        const float *a = got + (size_t)t * x->nv, *r = pr->ref + (size_t)(p0 + t) * x->nv;
        double d = 0;
        for (int i = 0; i < x->nv; i++)
            if (fabs((double)a[i] - r[i]) > d) d = fabs((double)a[i] - r[i]);
        if (d / max_ref > x->worst) x->worst = d / max_ref;
        T_CHECKF(d / max_ref < x->tol, "%s %s: prompt %d position %d: rel err %g", x->name, x->label,
                 pi, p0 + t, d / max_ref);
        const int ia = ref_argmax(a, x->nv), ir = ref_argmax(r, x->nv);
        if (ia != ir && x->near_ties && r[ir] - r[ia] <= x->tol * max_ref) x->ties++;
        else if (ia != ir) x->flips++;
    }
}

/* Feeds prompt pi's positions [p0, p1) of sequence q in one step (snapshotting the last
 * block boundary as kv_seq_step decides; `ids` overrides the tokens when not NULL), and
 * compares the logits with the reference unless ids is given; keep (may be NULL) gets
 * them. */
static bool feed_keep(struct fx *x, struct kv_seq *q, int pi, int p0, int p1,
                      const int32_t *ids, float *keep) {
    struct err e;
    if (kv_seq_reserve(&x->pool, q, p1, &e) != SMELT_OK) {
        T_CHECKF(0, "reserve: %s", e.msg);
        return false;
    }
    if (q->restore >= 0) {
        T_CHECK(model_state_copy(x->m, x->kv, q->slot, q->restore, &e) == SMELT_OK);
        q->restore = -1;
    }
    int n = p1 - p0;
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    uint8_t *want = malloc((size_t)n);
    float *out = malloc((size_t)n * x->nv * sizeof(float));
    for (int i = 0; i < n; i++)
        pos[i] = p0 + i, want[i] = 1;
    struct batch_seq view = kv_seq_step(&x->pool, q, p0, p1, false);
    struct batch b = {n, ids ? ids : x->p[pi].ids + p0, pos, seq, want, 1, &view};
    int32_t n_out = 0;
    bool ok = model_forward(x->m, x->kv, &b, out, &n_out, &e) == SMELT_OK && n_out == n;
    T_CHECKF(ok, "%s %s: forward [%d, %d): %s", x->name, x->label, p0, p1, e.msg);
    if (ok && !ids) compare(x, pi, p0, n, out);
    if (ok && keep) memcpy(keep, out, (size_t)n * x->nv * sizeof(float));
    free(pos);
    free(seq);
    free(want);
    free(out);
    return ok;
}

static bool feed(struct fx *x, struct kv_seq *q, int pi, int p0, int p1, const int32_t *ids) {
    return feed_keep(x, q, pi, p0, p1, ids, NULL);
}

/* Registers q's full blocks of prompt pi in the prefix cache (as the engine does). */
static void register_blocks(struct fx *x, struct kv_seq *q, int pi, int n_done) {
    uint64_t parent = 0;
    for (int b = 0; b < n_done / BS && b < q->n_blocks; b++) {
        const int32_t *t = x->p[pi].ids + b * BS;
        uint64_t h = kv_block_hash(&x->pool, parent, t);
        kv_prefix_register(&x->pool, q->blocks[b], h, parent, t);
        parent = h;
    }
}

static void scenarios(struct fx *x) {
    struct kv_seq q, r;
    int n2 = x->p[2].n;
    /* each prompt alone in one step (the long one: a long prefill), then prefill +
     * decode */
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&q);
        feed_keep(x, &q, i, 0, x->p[i].n, NULL, x->solo[i]);
        kv_seq_release(&x->pool, &q);
    }
    kv_seq_init(&q);
    feed(x, &q, 2, 0, n2 / 2, NULL);
    for (int p = n2 / 2; p < n2; p++)
        feed(x, &q, 2, p, p + 1, NULL);
    kv_seq_release(&x->pool, &q);

    /* a batch of the three prompts */
    {
        struct kv_seq s3[3];
        struct batch_seq views[3];
        int total = 0;
        for (int i = 0; i < 3; i++)
            total += x->p[i].n;
        int32_t *tok = malloc((size_t)total * 4), *pos = malloc((size_t)total * 4),
                *seq = malloc((size_t)total * 4);
        uint8_t *want = malloc((size_t)total);
        float *out = malloc((size_t)total * x->nv * sizeof(float));
        struct err e;
        int r0 = 0;
        for (int i = 0; i < 3; i++) {
            kv_seq_init(&s3[i]);
            T_CHECK(kv_seq_reserve(&x->pool, &s3[i], x->p[i].n, &e) == SMELT_OK);
            views[i] = kv_seq_step(&x->pool, &s3[i], 0, x->p[i].n, true);
            for (int t = 0; t < x->p[i].n; t++, r0++) {
                tok[r0] = x->p[i].ids[t];
                pos[r0] = t;
                seq[r0] = i;
                want[r0] = 1;
            }
        }
        struct batch b = {total, tok, pos, seq, want, 3, views};
        int32_t n_out = 0;
        bool ok = model_forward(x->m, x->kv, &b, out, &n_out, &e) == SMELT_OK && n_out == total;
        T_CHECKF(ok, "%s: batch: %s", x->label, e.msg);
        for (int i = 0, o = 0; ok && i < 3; o += x->p[i].n, i++) {
            const float *got = out + (size_t)o * x->nv;
            compare(x, i, 0, x->p[i].n, got);
            double d = 0, mx = 1e-30;
            for (size_t j = 0; j < (size_t)x->p[i].n * x->nv; j++) {
                d = fmax(d, fabs((double)got[j] - x->solo[i][j]));
                mx = fmax(mx, fabs((double)x->solo[i][j]));
            }
            if (d / mx > x->batch_diff) x->batch_diff = d / mx;
        }
        for (int i = 0; i < 3; i++)
            kv_seq_release(&x->pool, &s3[i]);
        free(tok);
        free(pos);
        free(seq);
        free(want);
        free(out);
    }

    /* a prefix-cache hit: q computes [0, 100) and [100, 150) (snapshots at 96, then 144);
     * r takes the chain up to 144 and computes only [144, 150) */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 100, NULL);
    feed(x, &q, 2, 100, n2, NULL);
    register_blocks(x, &q, 2, n2);
    kv_seq_release(&x->pool, &q);
    kv_seq_init(&r);
    uint64_t h[16];
    int got = kv_prefix_acquire(&x->pool, &r, x->p[2].ids, (n2 - 1) / BS, h);
    T_EQ_INT(got, 144 / BS);
    T_CHECK(r.restore >= 0);
    feed(x, &r, 2, got * BS, n2, NULL);
    kv_seq_release(&x->pool, &r);

    /* preemption: decode one token at a time to 130, release (blocks cached), resume from
     * the cache: trailing snapshot at 128 */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 40, NULL);
    for (int p = 40; p < 130; p++)
        feed(x, &q, 2, p, p + 1, NULL);
    register_blocks(x, &q, 2, 130);
    kv_seq_release(&x->pool, &q);
    kv_seq_init(&q);
    got = kv_prefix_acquire(&x->pool, &q, x->p[2].ids, 130 / BS, h);
    T_EQ_INT(got, 128 / BS);
    feed(x, &q, 2, got * BS, n2, NULL);
    kv_seq_release(&x->pool, &q);

    /* rollback: 10 wrong tokens at 120..129, back to 120 (from the snapshot at 112) */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 120, NULL);
    int32_t wrong[10];
    for (int i = 0; i < 10; i++)
        wrong[i] = (x->p[2].ids[120 + i] + 1 + i) % x->nv;
    feed(x, &q, 2, 120, 130, wrong);
    int32_t from = -1;
    kv_seq_rollback(&x->pool, &q, 120, &from);
    T_EQ_INT(from, 112);
    T_CHECK(q.restore >= 0);
    feed(x, &q, 2, from, 120, NULL);
    feed(x, &q, 2, 120, 121, NULL);
    feed(x, &q, 2, 121, n2, NULL);
    kv_seq_release(&x->pool, &q);

    struct kv_stats st;
    kv_pool_stats(&x->pool, &st);
    T_EQ_INT(st.live_slots, 0);
    T_CHECK(st.snapshots <= st.n_slots);
}

/* Model `name`'s file `variant` of the manifest through every scenario on o->bk. */
static void hy_check_file(const struct hy_opts *o, const char *name, const char *variant) {
    json_t *jm = NULL, *j;
    size_t im;
    const bool f16 = strstr(variant, "f16") != NULL;
    json_array_foreach(json_object_get(o->manifest, "models"), im, j)
        if (!strcmp(json_string_value(json_object_get(j, "name")), name)) jm = j;
    const char *file = json_string_value(
        json_object_get(json_object_get(json_object_get(jm, "files"), variant), "file"));
    if (!file) {
        T_CHECKF(0, "%s %s: not in the manifest", name, variant);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    struct fx x = {.name = name, .label = variant, .tol = o->tol[f16], .near_ties = o->near_ties};
    struct err e;
    if (gguf_open(&x.f, path, &e) != SMELT_OK || model_load(&x.m, x.f, o->bk, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", file, e.msg);
        gguf_close(x.f);
        return;
    }
    x.nv = x.m->hp.n_vocab;
    T_CHECK(model_is_recurrent(x.m));
    T_EQ_INT(x.m->hp.n_layer, 6);
    T_CHECK(x.m->mem[2].kind == MEM_KV && x.m->mem[5].kind == MEM_KV);
    T_CHECK(x.m->mem[0].kind == MEM_STATE && x.m->mem[4].kind == MEM_STATE);
    T_EQ_INT(model_kv_block_bytes(x.m, QT_F32, 1), 2 * 2 * 2 * 32 * 4);
    if (strcmp(name, "qwen35")) { /* 16 experts of 16, 4 per token, a shared one of 24 */
        T_EQ_INT(x.m->hp.n_expert, 16);
        T_EQ_INT(x.m->hp.n_expert_used, 4);
        T_EQ_INT(x.m->hp.n_ff_exp, 16);
        T_EQ_INT(x.m->hp.n_ff_shexp, 24);
    }
    T_CHECK(model_kv_new(x.m, o->kv_type, BS, NB, SLOTS, &x.kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&x.pool, NB, BS, &e) == SMELT_OK);
    T_CHECK(kv_prefix_enable(&x.pool, &e) == SMELT_OK);
    T_CHECK(kv_slots_enable(&x.pool, SLOTS, 3, &e) == SMELT_OK);
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(jm, "prompts"), ip, jp) {
        json_t *jids = json_object_get(jp, "ids");
        struct prompt *pr = &x.p[ip];
        pr->n = (int)json_array_size(jids);
        pr->ids = malloc((size_t)pr->n * 4);
        for (int i = 0; i < pr->n; i++)
            pr->ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        pr->ref = ref_read_f32(REF_DIR, json_string_value(json_object_get(jp, "logits")),
                               (size_t)pr->n * x.nv);
        x.solo[ip] = calloc((size_t)pr->n * x.nv, sizeof(float));
        T_CHECK(pr->ref != NULL);
    }
    if (x.p[0].ref && x.p[1].ref && x.p[2].ref) scenarios(&x);
    printf("%-9s %-10s on %s: max rel err %.2e, %d argmax flips (%d near ties); batch vs alone: max rel "
           "diff %.2g\n",
           name, variant, o->bk->ops->name, x.worst, x.flips, x.ties, x.batch_diff);
    T_EQ_INT(x.flips, 0);
    /* the CPU: bit for bit (the F32/F16 matmul kernels are row-count invariant, the
     * recurrent ops run each sequence's rows on their own, and a row's experts depend on it
     * alone); a GPU's products change their paths with the row count */
    T_CHECKF(x.batch_diff <= o->batch[f16], "%s %s: a row in a batch differs from it alone by %g", name,
             variant, x.batch_diff);
    for (int i = 0; i < 3; i++)
        free(x.p[i].ids), free(x.p[i].ref), free(x.solo[i]);
    kv_pool_free(&x.pool);
    model_kv_free(x.m, x.kv);
    model_free(x.m);
    gguf_close(x.f);
}

#endif

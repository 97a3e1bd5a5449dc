/* The logits_topk op on the CPU (topk_summarize_row, the CPU backend's op) against a naive
 * reference (every adjustment applied in list order, a full sort of the finite values,
 * sums in double): candidates exactly, ties by token id, counts exactly, sums within
 * 1e-5. Then model_step's summaries against its full rows, on a backend with the op and
 * on one without (the host path), model_fetch_rows, and bad requests. */
#include "t.h"

#include "backend/backend.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "topk_ref.h"

#define TOL 1e-5

static void check_rows(int nv, int n_rows_per_kind, unsigned long long *rs, int *n_bad) {
    float *x = malloc(sizeof *x * (size_t)nv), *a = malloc(sizeof *a * (size_t)nv);
    uint64_t *keys = malloc(sizeof *keys * (size_t)nv);
    uint32_t *mask = malloc(sizeof *mask * (size_t)topk_mask_words(nv));
    static struct topk_cand gc[TOPK_MAX], wc[TOPK_MAX];
    struct logit_adj adj[64];
    float graw[64], wraw[64];
    const int ks[] = {1, 2, 17, 64, 256};
    const float inv_ts[] = {1.0f, 1.0f / 0.7f, 1.0f / 1.7f};
    for (int kind = 0; kind < ROW_KINDS; kind++)
        for (int it = 0; it < n_rows_per_kind; it++) {
            topk_make_row(x, nv, kind, rs);
            struct topk_row q = {0};
            q.k = ks[t_rand_u64(rs) % 5];
            q.flags = (int32_t)(t_rand_u64(rs) % 4);
            q.inv_t = inv_ts[t_rand_u64(rs) % 3];
            int na = (int)(t_rand_u64(rs) % 3);
            q.adj_n = na == 0 ? 0 : topk_make_adj(adj, na == 1 ? 3 : 60, nv, rs);
            if (it == 0) { /* the argmax-only path */
                q.k = 1;
                q.flags = 0;
                q.adj_n = 0;
            }
            /* every other row masked (greedy ones too: they leave the argmax path) */
            int mkind = (int)(t_rand_u64(rs) % MASK_KINDS);
            topk_make_mask(mask, nv, mkind, rs);
            if (it % 2) q.flags |= TOPK_MASK;
            struct topk_summary gs, ws;
            topk_summarize_row(x, nv, &q, adj, mask, &gs, gc, graw);
            topk_ref_row(x, nv, &q, adj, mask, &ws, wc, wraw, a, keys);
            char what[64];
            snprintf(what, sizeof what, "nv %d kind %d row %d mask %d", nv, kind, it,
                     q.flags & TOPK_MASK ? mkind : -1);
            if (!topk_same(what, &q, &gs, gc, graw, &ws, wc, wraw, TOL)) (*n_bad)++;
        }
    free(mask);
    free(x);
    free(a);
    free(keys);
}

static void test_rows(void) {
    unsigned long long rs = 5;
    int bad = 0;
    const int nvs[] = {1, 7, 31, 32, 33, 255, 256, 257, 1000, 5003};
    for (size_t i = 0; i < sizeof nvs / sizeof nvs[0]; i++) check_rows(nvs[i], 6, &rs, &bad);
    check_rows(151936, 2, &rs, &bad);
    T_CHECKF(bad == 0, "%d rows differ from the reference", bad);
}

/* The op over a batch of rows: each row as topk_summarize_row alone gives it, at the
 * layout's offsets; a k = 0 row is not written. */
static void test_op(void) {
    struct backend *bk;
    struct err e;
    T_EQ_INT(cpu_backend_new(&bk, 2, &e), SMELT_OK);
    const int nv = 3001, rows = 9, cap = 200;
    unsigned long long rs = 9;
    bk_step_begin(bk);
    struct tensor *lg = bk_new(bk, QT_F32, nv, rows, 1);
    struct tensor *rq = bk_new(bk, QT_I32, TOPK_ROW_WORDS, rows, 1);
    struct tensor *ad = bk_new(bk, QT_I32, TOPK_ADJ_WORDS, cap, 1);
    struct tensor *out = bk_new(bk, QT_I32, topk_out_words(rows, cap), 1, 1);
    const int64_t words = topk_mask_words(nv);
    struct tensor *mk = bk_new(bk, QT_I32, words, rows, 1);
    uint32_t *mask = mk->data;
    float *x = lg->data;
    struct topk_row *q = rq->data;
    struct logit_adj *adj = ad->data;
    int32_t *o = out->data;
    memset(o, 0x5a, tensor_nbytes(out));
    int off = 0;
    for (int r = 0; r < rows; r++) {
        topk_make_row(x + (size_t)r * nv, nv, r, &rs);
        int n = r % 3 ? 20 : 0;
        topk_make_adj(adj + off, n, nv, &rs);
        topk_make_mask(mask + r * words, nv, r, &rs);
        int32_t flags = r % 4 | (r % 3 == 1 ? TOPK_MASK : 0);
        q[r] = (struct topk_row){r == 4 ? 0 : 1 + (r * 37) % TOPK_MAX, flags, 1.25f, off, n, 0};
        off += n;
    }
    bk_logits_topk(bk, out, lg, rq, ad, mk);
    T_EQ_INT(bk_sync(bk, &e), SMELT_OK);
    const struct topk_summary *sums = (const void *)o;
    const struct topk_cand *cands = (const void *)(o + topk_cand_word(rows));
    const float *raws = (const float *)(o + topk_raw_word(rows));
    for (int r = 0; r < rows; r++) {
        struct topk_summary ws;
        static struct topk_cand wc[TOPK_MAX];
        float wraw[32];
        if (q[r].k == 0) {
            uint32_t poison;
            memcpy(&poison, &sums[r], 4);
            T_EQ_INT(poison, 0x5a5a5a5au);
            continue;
        }
        topk_summarize_row(x + (size_t)r * nv, nv, &q[r], adj + q[r].adj_off, mask + r * words, &ws,
                           wc, wraw);
        T_CHECK(topk_same("op row", &q[r], &sums[r], cands + (size_t)r * TOPK_MAX,
                          raws + q[r].adj_off, &ws, wc, wraw, 0));
    }
    bk_free(bk);
}

/* ---- model_step ---- */

#define FIXTURE SMELT_SOURCE_DIR "/tests/data/ref/llama-f32.gguf"

struct rig {
    struct gguf_file *f;
    struct backend *bk;
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
};

static bool rig_open(struct rig *g, struct err *e) {
    memset(g, 0, sizeof *g);
    return gguf_open(&g->f, FIXTURE, e) == SMELT_OK && cpu_backend_new(&g->bk, 2, e) == SMELT_OK &&
           model_load(&g->m, g->f, g->bk, e) == SMELT_OK &&
           model_kv_new(g->m, QT_F32, 16, 8, 0, &g->kv, e) == SMELT_OK &&
           kv_pool_init(&g->pool, 8, 16, e) == SMELT_OK;
}

static void rig_close(struct rig *g) {
    kv_pool_free(&g->pool);
    if (g->m) model_kv_free(g->m, g->kv);
    model_free(g->m);
    bk_free(g->bk);
    gguf_close(g->f);
}

/* model_step's fill_masks: row 0 allows every third token but `refuse`, row 1 the tokens
 * below nv / 2; row 2's mask is garbage (the row does not ask for one). */
struct mask_fill {
    uint32_t *mask;
    int64_t words;
    int nv, refuse, calls;
};

static void fill_masks(void *ctx) {
    struct mask_fill *f = ctx;
    f->calls++;
    memset(f->mask, 0, sizeof *f->mask * (size_t)(2 * f->words));
    memset(f->mask + 2 * f->words, 0xa5, sizeof *f->mask * (size_t)f->words);
    for (int i = 0; i < f->nv; i++) {
        if (i % 3 == 0 && i != f->refuse) f->mask[i / 32] |= 1u << (i % 32);
        if (i < f->nv / 2) f->mask[f->words + i / 32] |= 1u << (i % 32);
    }
}

/* Runs 12 tokens with logits wanted on rows 3, 7, 11 and checks the summaries against
 * the full rows, with token masks too, then model_fetch_rows. */
static void step_and_check(struct rig *g, struct err *e) {
    int nv = g->m->hp.n_vocab;
    struct kv_seq sq;
    kv_seq_init(&sq);
    T_EQ_INT(kv_seq_reserve(&g->pool, &sq, 12, e), SMELT_OK);
    int32_t ids[12], pos[12], seq[12] = {0};
    uint8_t want[12] = {0};
    for (int i = 0; i < 12; i++) ids[i] = (i * 7 + 3) % nv, pos[i] = i;
    want[3] = want[7] = want[11] = 1;
    struct batch_seq view = kv_seq_view(&sq);
    struct batch b = {12, ids, pos, seq, want, 1, &view};
    struct topk_row rows[3] = {{1, 0, 1.0f, 0, 0, 0}, {5, TOPK_SUM | TOPK_RAW, 1.5f, 0, 2, 0},
                               {0, 0, 1.0f, 2, 0, 0}};
    struct logit_adj adj[2] = {{1, 1.0f, 0.0f, 3.0f}, {9, 2.0f, 0.5f, 0.0f}};
    struct topk_summary sum[3];
    static struct topk_cand cand[3 * TOPK_MAX];
    float raw[2];
    float *full = malloc(sizeof *full * 3 * (size_t)nv), *fetched = malloc(sizeof *full * 2 * (size_t)nv);
    struct model_sample ms = {.n_rows = 3,
                              .rows = rows,
                              .adj = adj,
                              .n_adj = 2,
                              .sum = sum,
                              .cand = cand,
                              .adj_raw = raw};
    int32_t n_out = 0;
    T_EQ_INT(model_step(g->m, g->kv, &b, full, &ms, &n_out, e), SMELT_OK);
    T_EQ_INT(n_out, 3);
    for (int r = 0; r < 2; r++) {
        struct topk_summary ws;
        static struct topk_cand wc[TOPK_MAX];
        float wraw[2];
        topk_summarize_row(full + (size_t)r * nv, nv, &rows[r], adj + rows[r].adj_off, NULL, &ws,
                           wc, wraw);
        T_CHECK(topk_same("model_step", &rows[r], &sum[r], cand + (size_t)r * TOPK_MAX,
                          rows[r].adj_n ? raw : NULL, &ws, wc, wraw, 0));
    }
    /* token masks, written by the step's fill_masks callback: rows 0 and 1 masked (row 0's
     * mask refuses its argmax), row 2 skipped */
    struct mask_fill mf = {.words = topk_mask_words(nv), .nv = nv, .refuse = sum[0].top_token};
    mf.mask = calloc((size_t)(3 * mf.words), sizeof *mf.mask);
    rows[0].flags |= TOPK_MASK;
    rows[1].flags |= TOPK_MASK;
    ms.mask = mf.mask;
    ms.fill_masks = fill_masks;
    ms.fill_ctx = &mf;
    T_EQ_INT(model_step(g->m, g->kv, &b, full, &ms, &n_out, e), SMELT_OK);
    T_EQ_INT(mf.calls, 1);
    for (int r = 0; r < 2; r++) {
        struct topk_summary ws;
        static struct topk_cand wc[TOPK_MAX];
        float wraw[2];
        topk_summarize_row(full + (size_t)r * nv, nv, &rows[r], adj + rows[r].adj_off,
                           mf.mask + r * mf.words, &ws, wc, wraw);
        T_CHECK(topk_same("model_step masked", &rows[r], &sum[r], cand + (size_t)r * TOPK_MAX,
                          rows[r].adj_n ? raw : NULL, &ws, wc, wraw, 0));
    }
    T_CHECK(sum[0].top_token != mf.refuse && sum[0].top_token % 3 == 0);
    ms.mask = NULL; /* a masked row needs the masks */
    T_EQ_INT(model_step(g->m, g->kv, &b, NULL, &ms, NULL, e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e->msg, "mask") != NULL);
    free(mf.mask);
    rows[0].flags &= ~TOPK_MASK;
    rows[1].flags &= ~TOPK_MASK;
    ms.fill_masks = NULL;
    T_EQ_INT(model_step(g->m, g->kv, &b, full, &ms, &n_out, e), SMELT_OK);
    T_EQ_INT(model_fetch_rows(g->m, 1, 2, fetched, e), SMELT_OK);
    T_CHECK(memcmp(fetched, full + nv, sizeof *full * 2 * (size_t)nv) == 0);
    T_EQ_INT(model_fetch_rows(g->m, 2, 2, fetched, e), SMELT_ERR_INVALID);
    /* bad requests */
    ms.n_rows = 2;
    T_EQ_INT(model_step(g->m, g->kv, &b, NULL, &ms, NULL, e), SMELT_ERR_INVALID);
    ms.n_rows = 3;
    adj[0].token = 20; /* 20 > 9: not sorted */
    T_EQ_INT(model_step(g->m, g->kv, &b, NULL, &ms, NULL, e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e->msg, "sorted") != NULL);
    adj[0].token = nv;
    adj[1].token = nv + 1;
    T_EQ_INT(model_step(g->m, g->kv, &b, NULL, &ms, NULL, e), SMELT_ERR_RANGE);
    T_EQ_INT(model_fetch_rows(g->m, 0, 1, fetched, e), SMELT_ERR_INVALID); /* the step failed */
    free(full);
    free(fetched);
    kv_seq_release(&g->pool, &sq);
}

static void test_model_step(void) {
    struct rig g;
    struct err e;
    if (!rig_open(&g, &e)) {
        T_CHECKF(0, "%s: %s", FIXTURE, e.msg);
        rig_close(&g);
        return;
    }
    step_and_check(&g, &e);
    /* a backend without the op: model_step summarizes the rows on the host */
    struct backend_ops ops = *g.bk->ops;
    const struct backend_ops *saved = g.bk->ops;
    ops.logits_topk = NULL;
    g.bk->ops = &ops;
    T_CHECK(!bk_has_logits_topk(g.bk));
    step_and_check(&g, &e);
    g.bk->ops = saved;
    rig_close(&g);
}

int main(void) {
    T_RUN(test_rows);
    T_RUN(test_op);
    T_RUN(test_model_step);
    return t_done();
}

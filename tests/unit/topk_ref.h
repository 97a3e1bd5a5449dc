/* Test helpers for the logits_topk op: random rows and adjustment lists of every awkward
 * shape, a naive reference (adjust each entry in list order, full sort of the finite
 * values, sums in double) and a comparison that prints the first difference. Shared by
 * test_topk.c (the CPU twin) and test_cuda_topk.c (the CUDA kernels). Include after t.h. */
#ifndef SMELT_TEST_TOPK_REF_H
#define SMELT_TEST_TOPK_REF_H

#include "backend/backend.h"

/* Row kinds: peaked, flat, many exact ties, sprinkled -inf, sprinkled NaN, all equal,
 * nothing finite but a few, increasing (every token beats the last: worst case for a
 * running threshold), decreasing. */
#define ROW_KINDS 9

static inline void topk_make_row(float *x, int nv, int kind, unsigned long long *rs) {
    for (int i = 0; i < nv; i++) {
        float g = t_randn(rs);
        switch (kind % ROW_KINDS) {
        case 0: x[i] = 4.0f * g; break;
        case 1: x[i] = 0.3f * g; break;
        case 2: x[i] = (float)(int)(3.0f * g) * 0.5f; break;
        case 3: x[i] = t_rand_u64(rs) % 3 ? 2.0f * g : -INFINITY; break;
        case 4: x[i] = t_rand_u64(rs) % 20 ? 2.0f * g : NAN; break;
        case 5: x[i] = 1.25f; break;
        case 6: x[i] = t_rand_u64(rs) % 1000 ? -INFINITY : g; break;
        case 7: x[i] = -30.0f + 60.0f * (float)i / (float)nv; break;
        default: x[i] = 30.0f - 60.0f * (float)i / (float)nv; break;
        }
    }
    if (kind % ROW_KINDS == 0) x[0] = x[nv - 1] = 25.0f; /* the ends of the row, tied */
}

static inline int topk_adj_cmp(const void *pa, const void *pb) {
    const struct logit_adj *a = pa, *b = pb;
    if (a->token != b->token) return a->token < b->token ? -1 : 1;
    return 0;
}

/* n random entries (sorted by token, stable: insertion sort keeps the list order of a
 * token's entries): penalties, boosts, bans, a token twice, the row's first and last. */
static inline int topk_make_adj(struct logit_adj *adj, int n, int nv, unsigned long long *rs) {
    for (int i = 0; i < n; i++) {
        int32_t t = (int32_t)(t_rand_u64(rs) % (uint64_t)nv);
        if (i == 0) t = 0;
        if (i == 1) t = nv - 1;
        if (i == 2 && n > 3) t = adj[0].token; /* twice */
        float rep = t_rand_u64(rs) % 2 ? 1.3f : 1.0f;
        float sub = t_rand_u64(rs) % 2 ? 0.75f : 0.0f;
        uint64_t r = t_rand_u64(rs) % 6;
        float add = r == 0 ? -INFINITY : r == 1 ? 40.0f : r == 2 ? 2.5f : 0.0f;
        adj[i] = (struct logit_adj){t, rep, sub, add};
    }
    for (int i = 1; i < n; i++) /* stable insertion sort */
        for (int j = i; j > 0 && topk_adj_cmp(&adj[j - 1], &adj[j]) > 0; j--) {
            struct logit_adj tmp = adj[j];
            adj[j] = adj[j - 1];
            adj[j - 1] = tmp;
        }
    return n;
}

static inline int topk_key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* Token mask kinds: random dense (90% allowed), sparse (~0.5%), one run of 40 tokens,
 * nothing allowed, everything allowed, only the last token, every other word empty. */
#define MASK_KINDS 7

/* A token mask of kind `kind` over nv tokens (topk_mask_words(nv) words); the bits past nv
 * in the last word are random: they must be ignored. */
static inline void topk_make_mask(uint32_t *m, int nv, int kind, unsigned long long *rs) {
    int64_t words = topk_mask_words(nv);
    int lo = (int)(t_rand_u64(rs) % (uint64_t)nv);
    for (int64_t w = 0; w < words; w++) {
        uint32_t bits = 0;
        for (int b = 0; b < 32; b++) {
            int i = (int)(w * 32 + b);
            bool on;
            switch (kind % MASK_KINDS) {
            case 0:
                on = t_rand_u64(rs) % 10 != 0;
                break;
            case 1:
                on = t_rand_u64(rs) % 200 == 0;
                break;
            case 2:
                on = i >= lo && i < lo + 40;
                break;
            case 3:
                on = false;
                break;
            case 4:
                on = true;
                break;
            case 5:
                on = i == nv - 1;
                break;
            default:
                on = w % 2 == 0 && t_rand_u64(rs) % 2;
                break;
            }
            if (i >= nv) on = t_rand_u64(rs) % 2;
            bits |= (uint32_t)on << b;
        }
        m[w] = bits;
    }
}

/* The naive reference of one row: mask (applied with TOPK_MASK) as -inf raw logits first,
 * then the adjustments. keys: scratch of nv entries. */
static inline void topk_ref_row(const float *x, int nv, const struct topk_row *q,
                                const struct logit_adj *adj, const uint32_t *mask,
                                struct topk_summary *sum, struct topk_cand *cand, float *adj_raw,
                                float *a, uint64_t *keys) {
    const uint32_t *mk = q->flags & TOPK_MASK ? mask : NULL;
    for (int i = 0; i < nv; i++)
        a[i] = mk && !((mk[i / 32] >> (i % 32)) & 1) ? -INFINITY : x[i];
    for (int e = 0; e < q->adj_n; e++) { /* list order, straight from the contract */
        int32_t t = adj[e].token;
        adj_raw[e] = mk && !((mk[t / 32] >> (t % 32)) & 1) ? -INFINITY : x[t];
        float l = a[t];
        if (adj[e].rep != 1.0f) l = l > 0.0f ? l / adj[e].rep : l * adj[e].rep;
        l = l - adj[e].sub;
        a[t] = adj[e].add == -INFINITY ? -INFINITY : l + adj[e].add;
    }
    int nf = 0;
    double mr = -INFINITY;
    for (int i = 0; i < nv; i++) {
        if (a[i] > -INFINITY) keys[nf++] = topk_key(a[i], i);
        if ((!mk || ((mk[i / 32] >> (i % 32)) & 1)) && x[i] > mr) mr = x[i];
    }
    qsort(keys, (size_t)nf, sizeof *keys, topk_key_desc);
    int k = q->k < nf ? q->k : nf;
    for (int j = 0; j < k; j++) cand[j] = (struct topk_cand){topk_key_token(keys[j]), topk_key_logit(keys[j])};
    memset(sum, 0, sizeof *sum);
    sum->n_cand = k;
    sum->n_finite = nf;
    sum->max_adj = k ? cand[0].logit : -INFINITY;
    sum->top_token = k ? cand[0].token : -1;
    sum->top_logit = sum->max_adj;
    double sa = 0, sr = 0;
    for (int i = 0; i < nv; i++) {
        if (a[i] > -INFINITY) sa += exp(((double)a[i] - sum->max_adj) * q->inv_t);
        if (x[i] > -INFINITY && (!mk || ((mk[i / 32] >> (i % 32)) & 1)))
            sr += exp((double)x[i] - mr);
    }
    sum->sum_adj = (float)sa;
    sum->max_raw = (float)mr;
    sum->lse_raw = mr > -INFINITY ? (float)(mr + log(sr)) : -INFINITY;
}

static inline bool topk_rel_ok(double got, double want, double tol) {
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* Compares one row's output with the reference: candidates exactly (ids, order, values),
 * counts exactly, sums within tol relative (lse_raw: absolute, it is a log). Fields are
 * compared only when the request asked for them. Returns false (after one message) on
 * the first difference. */
static inline bool topk_same(const char *what, const struct topk_row *q, const struct topk_summary *gs,
                      const struct topk_cand *gc, const float *graw, const struct topk_summary *ws,
                      const struct topk_cand *wc, const float *wraw, double tol) {
    char why[160] = "";
    if (gs->n_cand != ws->n_cand || gs->n_finite != ws->n_finite)
        snprintf(why, sizeof why, "n_cand %d/%d n_finite %d/%d", gs->n_cand, ws->n_cand,
                 gs->n_finite, ws->n_finite);
    else if (gs->top_token != ws->top_token || !(gs->top_logit == ws->top_logit || (isinf(ws->top_logit) && gs->top_logit == ws->top_logit)))
        snprintf(why, sizeof why, "top %d (%g) vs %d (%g)", gs->top_token, gs->top_logit,
                 ws->top_token, ws->top_logit);
    else if (ws->n_cand > 0 && gs->max_adj != ws->max_adj)
        snprintf(why, sizeof why, "max_adj %.9g vs %.9g", gs->max_adj, ws->max_adj);
    else if ((q->flags & TOPK_SUM) && !topk_rel_ok(gs->sum_adj, ws->sum_adj, tol))
        snprintf(why, sizeof why, "sum_adj %.9g vs %.9g", gs->sum_adj, ws->sum_adj);
    else if ((q->flags & TOPK_RAW) && (gs->max_raw != ws->max_raw && !(isnan(gs->max_raw) && isnan(ws->max_raw))))
        snprintf(why, sizeof why, "max_raw %.9g vs %.9g", gs->max_raw, ws->max_raw);
    else if ((q->flags & TOPK_RAW) && !(isinf(ws->lse_raw) ? gs->lse_raw == ws->lse_raw
                                                         : fabs(gs->lse_raw - ws->lse_raw) <= tol * fmax(1.0, fabs(ws->lse_raw))))
        snprintf(why, sizeof why, "lse_raw %.9g vs %.9g", gs->lse_raw, ws->lse_raw);
    for (int j = 0; !why[0] && q->k > 1 && j < ws->n_cand; j++)
        if (gc[j].token != wc[j].token || gc[j].logit != wc[j].logit)
            snprintf(why, sizeof why, "candidate %d: %d (%.9g) vs %d (%.9g)", j, gc[j].token,
                     gc[j].logit, wc[j].token, wc[j].logit);
    for (int e = 0; !why[0] && graw && e < q->adj_n; e++)
        if (!(graw[e] == wraw[e] || (isnan(graw[e]) && isnan(wraw[e]))))
            snprintf(why, sizeof why, "raw logit of entry %d: %.9g vs %.9g", e, graw[e], wraw[e]);
    if (why[0]) fprintf(stderr, "  %s (k %d, flags %d, %d adjustments): %s\n", what, q->k, q->flags,
                        q->adj_n, why);
    return !why[0];
}

#endif

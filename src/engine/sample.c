/* Sampling from row summaries: see sample.h for the contract and docs/sampling.md for
 * the design and when the full row is needed.
 *
 * From a summary the work is O(k) (k <= TOPK_MAX candidates). With the full row (after
 * SAMPLE_NEED_ROW, or sampler_sample on a host row when the summary is not enough) the
 * passes over the n_vocab logits are:
 *   top-k beyond the candidates           1 (a heap of top_k), then work on those
 *   top-p nucleus beyond the candidates   histogram of mass by bucket of z = (l - max)/T,
 *                                         collect the bucket where the cut falls (only it
 *                                         is sorted), a sum pass, a draw pass
 *   min-p cut beyond the candidates       a sum pass and a draw pass
 *   temperature draw beyond them          1 (the draw continues in token order)
 *   top logprobs not certain from them    1 (a heap of n_logprobs on the raw logits)
 * Adjusted logits are recomputed on the fly from the raw row: the row's adjustments are
 * sorted by token, so one pointer walks them beside it. This file is built for baseline
 * x86-64 (no FMA), so topk_adj_apply rounds like the device. */
#include "engine/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/array.h"
#include "util/mix.h"

#define ZCUT 30.0f /* a top-p nucleus never takes tokens with z = (l - max)/T below -ZCUT */
#define NBUCKET 1024

struct penalty_slot {
    int32_t token; /* -1 = empty */
    int32_t n_all; /* occurrences in the window */
    int32_t n_gen; /* of which generated */
};

struct hist_entry {
    int32_t token;
    bool generated;
};

/* What a sampler_finish that asked for the row had already decided. */
enum pend_mode {
    PEND_NONE = 0,
    PEND_DRAW,     /* a temperature draw past the candidates: pend_u, pend_c */
    PEND_LOGPROBS, /* the token is pend_tok; its logprobs need the row */
};

struct sampler {
    struct sample_params p;
    struct logit_bias *bias; /* owned copy */
    int32_t n_vocab;
    uint64_t rng[4]; /* xoshiro256** */

    /* Penalty window: a ring of the last tokens (cap grows when unbounded). Windowed, the
     * ring holds SAMPLE_MAX_UNDO tokens more than the window, already outside it (their
     * counts removed), so sampler_unaccept can bring them back into it. */
    struct hist_entry *ring;
    int64_t ring_cap, ring_len, ring_head; /* head = index of the oldest entry */
    bool windowed;
    int64_t window; /* windowed: the tokens counted, the newest ones */
    /* token -> counts, open addressing; slots with zero counts are cleared on rebuild */
    struct penalty_slot *slots;
    int32_t slot_cap, slot_used;

    /* the logit bias as adjustment entries, sorted by token (stable), made once */
    struct logit_adj *bias_adj;
    int32_t n_bias_adj;

    /* the row being sampled */
    bool requested;          /* a request is open (no result returned since) */
    bool req_nomem;          /* the last request failed for memory */
    bool host_only;          /* the request asked for nothing: the full row is needed */
    struct topk_row req;     /* the summary this row needs (k > 0; adj_off 0) */
    struct logit_adj *adj;   /* its adjustments, sorted by token (req.adj_n) */
    float *raw_host;         /* their raw logits when the summary is made here */
    int32_t cap_adj;
    struct topk_summary hsum; /* a summary made on the host (sampler_sample, host_only) */
    struct topk_cand hcand[TOPK_MAX];
    enum pend_mode pend;
    double pend_u, pend_c;
    int32_t pend_tok;

    /* the token mask of the rows (structured output; not owned), and a row with it applied */
    const uint32_t *mask;
    float *mrow;

    /* scratch for full-row passes */
    uint64_t *keys;
    size_t keys_cap;
    struct topk_cand *list;
    size_t list_cap;
};

void sample_params_default(struct sample_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->n_logprobs = -1;
}

smelt_status sample_params_check(const struct sample_params *p, int32_t n_vocab, struct err *e) {
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature) || p->temperature > 100.0f)
        return err_set(e, SMELT_ERR_INVALID, "temperature must be in [0, 100], got %g",
                       p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(e, SMELT_ERR_INVALID, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(e, SMELT_ERR_INVALID, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return err_set(e, SMELT_ERR_INVALID, "repetition_penalty must be > 0, got %g",
                       p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return err_set(e, SMELT_ERR_INVALID, "presence_penalty must be in [-2, 2], got %g",
                       p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return err_set(e, SMELT_ERR_INVALID, "frequency_penalty must be in [-2, 2], got %g",
                       p->frequency_penalty);
    if (p->n_logprobs > SAMPLE_MAX_LOGPROBS)
        return err_set(e, SMELT_ERR_INVALID, "top_logprobs must be at most %d, got %d",
                       SAMPLE_MAX_LOGPROBS, p->n_logprobs);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return err_set(e, SMELT_ERR_INVALID, "logit_bias: bad count %d", p->n_bias);
    for (int32_t i = 0; i < p->n_bias; i++) {
        if (p->bias[i].token < 0 || p->bias[i].token >= n_vocab)
            return err_set(e, SMELT_ERR_INVALID, "logit_bias: token %d out of range [0, %d)",
                           p->bias[i].token, n_vocab);
        if (!isfinite(p->bias[i].bias))
            return err_set(e, SMELT_ERR_INVALID, "logit_bias: token %d has a non-finite bias",
                           p->bias[i].token);
    }
    return SMELT_OK;
}

/* ---- RNG: splitmix64 seeding, xoshiro256** ---- */

static uint64_t splitmix64(uint64_t *x) { return mix64(*x += 0x9e3779b97f4a7c15ULL); }

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform double in [0, 1). */
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* ---- penalty window ---- */

static uint32_t hash_token(int32_t t) { return (uint32_t)t * 2654435761u; }

static struct penalty_slot *slot_find(struct sampler *s, int32_t token, bool insert) {
    uint32_t mask = (uint32_t)s->slot_cap - 1;
    for (uint32_t i = hash_token(token) & mask;; i = (i + 1) & mask) {
        struct penalty_slot *sl = &s->slots[i];
        if (sl->token == token) return sl;
        if (sl->token < 0) {
            if (!insert) return NULL;
            sl->token = token;
            sl->n_all = sl->n_gen = 0;
            s->slot_used++;
            return sl;
        }
    }
}

/* Rehashes into a table of new_cap slots, dropping zero-count entries. */
static bool slots_rebuild(struct sampler *s, int32_t new_cap) {
    struct penalty_slot *old = s->slots;
    int32_t old_cap = s->slot_cap;
    struct penalty_slot *ns = malloc(sizeof *ns * (size_t)new_cap);
    if (!ns) return false;
    for (int32_t i = 0; i < new_cap; i++) ns[i].token = -1;
    s->slots = ns;
    s->slot_cap = new_cap;
    s->slot_used = 0;
    for (int32_t i = 0; i < old_cap; i++) {
        if (old[i].token < 0 || old[i].n_all == 0) continue;
        struct penalty_slot *sl = slot_find(s, old[i].token, true);
        sl->n_all = old[i].n_all;
        sl->n_gen = old[i].n_gen;
    }
    free(old);
    return true;
}

static void count_add(struct sampler *s, struct hist_entry h, int delta) {
    if (delta > 0 && (s->slot_used + 1) * 2 > s->slot_cap) {
        /* Grow only if live entries need it; otherwise a same-size rebuild sweeps zeros. */
        int32_t live = 0;
        for (int32_t i = 0; i < s->slot_cap; i++)
            live += s->slots[i].token >= 0 && s->slots[i].n_all > 0;
        int32_t cap = s->slot_cap;
        while ((live + 1) * 2 > cap) cap *= 2;
        if (!slots_rebuild(s, cap)) return; /* out of memory: the penalty skips this token */
    }
    struct penalty_slot *sl = slot_find(s, h.token, delta > 0);
    if (!sl) return;
    sl->n_all += delta;
    if (h.generated) sl->n_gen += delta;
}

void sampler_accept(struct sampler *s, int32_t token, bool generated) {
    if (token < 0 || token >= s->n_vocab) return;
    struct hist_entry h = {token, generated};
    if (s->ring_len == s->ring_cap) {
        if (s->windowed) { /* drop the oldest: it left the window SAMPLE_MAX_UNDO tokens ago */
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
            s->ring_len--;
        } else {
            int64_t cap = s->ring_cap * 2;
            struct hist_entry *nr = realloc(s->ring, sizeof *nr * (size_t)cap);
            if (!nr) return;
            s->ring = nr;
            s->ring_cap = cap;
        }
    }
    s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = h;
    s->ring_len++;
    count_add(s, h, +1);
    if (s->windowed && s->ring_len > s->window) /* the token that leaves the window */
        count_add(s, s->ring[(s->ring_head + s->ring_len - 1 - s->window) % s->ring_cap], -1);
}

void sampler_unaccept(struct sampler *s, int32_t n) {
    for (int32_t i = 0; i < n && s->ring_len > 0; i++) {
        count_add(s, s->ring[(s->ring_head + s->ring_len - 1) % s->ring_cap], -1);
        s->ring_len--;
        if (s->windowed && s->ring_len >= s->window) /* the token that comes back into it */
            count_add(s, s->ring[(s->ring_head + s->ring_len - s->window) % s->ring_cap], +1);
    }
}

void sampler_reset_history(struct sampler *s) {
    s->ring_len = 0;
    s->ring_head = 0;
    for (int32_t i = 0; i < s->slot_cap; i++) s->slots[i].token = -1;
    s->slot_used = 0;
}

static int bias_cmp(const void *pa, const void *pb) {
    const struct logit_adj *a = pa, *b = pb; /* stable: ties keep the list order (index in rep) */
    if (a->token != b->token) return a->token < b->token ? -1 : 1;
    return a->rep < b->rep ? -1 : a->rep > b->rep;
}

smelt_status sampler_new(struct sampler **out, const struct sample_params *p, int32_t n_vocab,
                         struct err *e) {
    *out = NULL;
    if (n_vocab <= 0) return err_set(e, SMELT_ERR_INVALID, "sampler: vocabulary size %d", n_vocab);
    smelt_status st = sample_params_check(p, n_vocab, e);
    if (st) return st;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s) return err_set(e, SMELT_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t seed = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
    s->windowed = p->penalty_last_n > 0;
    s->window = s->windowed ? p->penalty_last_n : 0;
    s->ring_cap = s->windowed ? (int64_t)p->penalty_last_n + SAMPLE_MAX_UNDO : 256;
    s->ring = malloc(sizeof *s->ring * (size_t)s->ring_cap);
    s->slot_cap = 64;
    s->slots = malloc(sizeof *s->slots * (size_t)s->slot_cap);
    bool ok = s->ring && s->slots;
    if (ok && p->n_bias > 0) {
        s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias);
        s->bias_adj = malloc(sizeof *s->bias_adj * (size_t)p->n_bias);
        ok = s->bias && s->bias_adj;
        if (ok) {
            memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
            /* sorted by token; rep carries the list index for a stable sort, then 1 */
            for (int32_t i = 0; i < p->n_bias; i++)
                s->bias_adj[i] = (struct logit_adj){p->bias[i].token, (float)i, 0.0f,
                                                    p->bias[i].bias <= -100.0f ? -INFINITY
                                                                               : p->bias[i].bias};
            qsort(s->bias_adj, (size_t)p->n_bias, sizeof *s->bias_adj, bias_cmp);
            for (int32_t i = 0; i < p->n_bias; i++) s->bias_adj[i].rep = 1.0f;
            s->n_bias_adj = p->n_bias;
        }
        s->p.bias = s->bias;
    }
    if (!ok) {
        sampler_free(s);
        return err_set(e, SMELT_ERR_NOMEM, "sampler: out of memory");
    }
    for (int32_t i = 0; i < s->slot_cap; i++) s->slots[i].token = -1;
    *out = s;
    return SMELT_OK;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->ring);
    free(s->slots);
    free(s->bias);
    free(s->bias_adj);
    free(s->adj);
    free(s->raw_host);
    free(s->keys);
    free(s->list);
    free(s->mrow);
    free(s);
}

void sampler_set_mask(struct sampler *s, const uint32_t *mask) {
    s->mask = mask;
}

const struct sample_params *sampler_params(const struct sampler *s) { return &s->p; }

/* ---- the request: adjustments and what the summary must hold ---- */

static bool reserve_adj(struct sampler *s, int32_t n) {
    if (n <= s->cap_adj && s->adj) return true;
    int32_t c = s->cap_adj ? s->cap_adj : 64;
    while (c < n) c *= 2;
    struct logit_adj *a = realloc(s->adj, sizeof *a * (size_t)c);
    if (a) s->adj = a;
    float *r = realloc(s->raw_host, sizeof *r * (size_t)c);
    if (r) s->raw_host = r;
    if (!a || !r) return false;
    s->cap_adj = c;
    return true;
}

static int adj_token_cmp(const void *pa, const void *pb) {
    const struct logit_adj *a = pa, *b = pb;
    return (a->token > b->token) - (a->token < b->token);
}

/* s->adj = the window's penalty entries merged with the bias entries by token; a token's
 * penalty entry comes before its bias entries (penalties first, then the bias in list
 * order, as the full-vocabulary sampler always did). */
static bool build_adj(struct sampler *s) {
    const struct sample_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f;
    bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    int32_t nb = s->n_bias_adj, np = 0;
    int32_t max_pen = rep || pf ? s->slot_used : 0;
    if (!reserve_adj(s, nb + max_pen)) return false;
    struct logit_adj *pen = s->adj + nb; /* merged forward into s->adj below */
    for (int32_t i = 0; i < s->slot_cap && np < max_pen; i++) {
        const struct penalty_slot *sl = &s->slots[i];
        if (sl->token < 0 || sl->n_all == 0) continue;
        float r = rep ? p->repetition_penalty : 1.0f;
        float sub = sl->n_gen > 0 ? p->presence_penalty + p->frequency_penalty * (float)sl->n_gen
                                  : 0.0f;
        if (r == 1.0f && sub == 0.0f) continue;
        pen[np++] = (struct logit_adj){sl->token, r, sub, 0.0f};
    }
    qsort(pen, (size_t)np, sizeof *pen, adj_token_cmp);
    /* output index o = i + j <= nb + i: never past the next unread penalty entry */
    int32_t i = 0, j = 0, o = 0;
    while (i < np || j < nb) {
        if (j == nb || (i < np && pen[i].token <= s->bias_adj[j].token)) s->adj[o++] = pen[i++];
        else s->adj[o++] = s->bias_adj[j++];
    }
    s->req.adj_n = o;
    return true;
}

/* First entry of token t in s->adj, or -1. */
static int32_t adj_find(const struct sampler *s, int32_t t) {
    int32_t lo = 0, hi = s->req.adj_n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (s->adj[mid].token < t) lo = mid + 1;
        else hi = mid;
    }
    return lo < s->req.adj_n && s->adj[lo].token == t ? lo : -1;
}

static int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
static int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }

/* The summary the row needs (s->req): k candidates and which sums. */
static void make_req(struct sampler *s) {
    const struct sample_params *p = &s->p;
    int32_t nv = s->n_vocab, n_adj = s->req.adj_n;
    int32_t n_lp = p->n_logprobs;
    /* the raw top-n_lp can need n_lp candidates besides every adjusted token */
    int32_t lp_k = n_lp > 0 ? imin(TOPK_MAX, n_lp + n_adj) : 1;
    int32_t k, flags = (n_lp >= 0 ? TOPK_RAW : 0) | (s->mask ? TOPK_MASK : 0);
    if (p->temperature == 0.0f) {
        k = lp_k;
    } else {
        bool tk = p->top_k > 0 && p->top_k < nv;
        k = tk && p->top_k <= TOPK_MAX ? p->top_k : TOPK_MAX;
        k = imax(k, lp_k);
        if (!tk) flags |= TOPK_SUM;
    }
    s->req.k = imax(1, imin(k, nv));
    s->req.flags = flags;
    s->req.inv_t = p->temperature > 0.0f ? 1.0f / p->temperature : 1.0f;
    s->req.adj_off = 0;
    s->req.pad = 0;
}

static bool prepare(struct sampler *s) {
    s->requested = false;
    s->host_only = false;
    s->pend = PEND_NONE;
    s->req_nomem = !build_adj(s);
    if (s->req_nomem) return false;
    make_req(s);
    s->requested = true;
    return true;
}

int32_t sampler_request(struct sampler *s, struct topk_row *row, struct logit_adj *adj,
                        int32_t off, int32_t cap) {
    if (!prepare(s)) {
        memset(row, 0, sizeof *row);
        row->adj_off = off;
        return -1;
    }
    *row = s->req;
    row->adj_off = off;
    int32_t n = s->req.adj_n;
    if (n > cap || (n > 0 && !adj)) {
        row->k = 0;
        row->adj_n = 0;
        s->host_only = true;
        return 0;
    }
    if (n) memcpy(adj, s->adj, sizeof *adj * (size_t)n);
    return n;
}

/* ---- finishing from a summary ---- */

/* The row as finishing sees it. */
struct view {
    const struct topk_summary *sum;
    const struct topk_cand *cand; /* n, in rank order */
    int32_t n;
    bool complete;                /* the candidates are every finite token */
    const float *adj_raw;         /* raw logits of s->adj, or NULL */
    const float *row;             /* the raw row, or NULL */
    float mx, inv_t;
};

static inline double weight(float l, float mx, float inv_t) {
    return (double)expf((l - mx) * inv_t);
}

static int cand_token_cmp(const void *pa, const void *pb) {
    const struct topk_cand *a = pa, *b = pb;
    return (a->token > b->token) - (a->token < b->token);
}

/* Draws from the tokens c[0..m) with weights exp((l - mx) / T), walking them in token
 * order: a small change of the logits then changes the result only for draws near a
 * boundary that moved (in rank order, two near-tied tokens swapping places would move
 * whole intervals). Total and walk add in the same order. */
static int32_t draw_set(struct sampler *s, const struct topk_cand *c, int64_t m, float mx,
                        float inv_t) {
    if (m > 1 && array_grow((void **)&s->list, &s->list_cap, m, sizeof *s->list)) {
        if (c != s->list) memcpy(s->list, c, sizeof *c * (size_t)m);
        qsort(s->list, (size_t)m, sizeof *s->list, cand_token_cmp);
        c = s->list;
    } /* out of memory: rank order, still a valid draw */
    double tot = 0.0;
    for (int64_t i = 0; i < m; i++) tot += weight(c[i].logit, mx, inv_t);
    double u = rng_uniform(s->rng) * tot, run = 0.0;
    for (int64_t i = 0; i < m; i++) {
        run += weight(c[i].logit, mx, inv_t);
        if (u < run) return c[i].token;
    }
    return c[m - 1].token;
}

/* First rank i >= 1 whose z is below zmin (min-p cuts there), or -1. */
static int64_t minp_cut(const struct topk_cand *c, int64_t m, float mx, float inv_t, float zmin) {
    for (int64_t i = 1; i < m; i++)
        if ((c[i].logit - mx) * inv_t < zmin) return i;
    return -1;
}

/* The top-k set is c[0..m) (m = min(top_k, tokens)): top-p over its mass, then min-p,
 * then a draw. */
static int32_t finish_top_k(struct sampler *s, const struct topk_cand *c, int64_t m, float mx,
                            float inv_t, float zmin) {
    const struct sample_params *p = &s->p;
    double mass = 0.0;
    for (int64_t i = 0; i < m; i++) mass += weight(c[i].logit, mx, inv_t);
    double need = p->top_p < 1.0f ? p->top_p * mass : INFINITY;
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < m) {
        float z = (c[keep].logit - mx) * inv_t;
        if (keep > 0 && z < zmin) break;
        acc += weight(c[keep].logit, mx, inv_t);
        keep++;
        if (acc >= need) break;
    }
    return draw_set(s, c, keep, mx, inv_t);
}

/* ---- full-row passes ---- */

/* Walks a row's adjusted logits in token order. */
struct adj_walk {
    const struct logit_adj *p, *end;
};

static inline float adj_value(struct adj_walk *w, const float *row, int32_t i) {
    float a = row[i];
    while (w->p < w->end && w->p->token < i) w->p++;
    while (w->p < w->end && w->p->token == i) a = topk_adj_apply(a, w->p++);
    return a;
}

static struct adj_walk walk_of(const struct sampler *s) {
    return (struct adj_walk){s->adj, s->adj + s->req.adj_n};
}

/* Min-heap of the k largest keys. */
static inline void key_offer(uint64_t *h, int64_t *n, int64_t k, uint64_t key) {
    if (*n < k) {
        h[*n] = key;
        topk_heap_up(h, (*n)++);
    } else if (key > h[0]) {
        h[0] = key;
        topk_heap_down(h, *n, 0);
    }
}

static int key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* The top_k tokens of the whole row (more than the candidates), then finish_top_k. */
static smelt_status top_k_full(struct sampler *s, const struct view *v, float zmin, int32_t *tok) {
    int64_t k = s->p.top_k;
    if (!array_grow((void **)&s->keys, &s->keys_cap, k, sizeof *s->keys) ||
        !array_grow((void **)&s->list, &s->list_cap, k, sizeof *s->list))
        return SMELT_ERR_NOMEM;
    int64_t n = 0;
    struct adj_walk w = walk_of(s);
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float a = adj_value(&w, v->row, i);
        if (a > -INFINITY) key_offer(s->keys, &n, k, topk_key(a, i));
    }
    qsort(s->keys, (size_t)n, sizeof *s->keys, key_desc);
    for (int64_t i = 0; i < n; i++)
        s->list[i] = (struct topk_cand){topk_key_token(s->keys[i]), topk_key_logit(s->keys[i])};
    *tok = finish_top_k(s, s->list, n, v->mx, v->inv_t, zmin);
    return SMELT_OK;
}

static inline int bucket_of(float z) {
    int b = (int)(-z * (NBUCKET / ZCUT));
    return b < NBUCKET ? b : NBUCKET - 1;
}

/* Whether adjusted logit a of token i ranks after the last candidate `last`. */
static inline bool is_tail(float a, int32_t i, const struct topk_cand *last) {
    return a < last->logit || (a == last->logit && topk_key(a, i) < topk_key(last->logit, last->token));
}

/* Where a nucleus (need: top_p x total; INFINITY for none) and a min-p cut (zmin) that both
 * fall past the candidates (which are all kept) cut the rest of the row. */
struct ncut {
    int bcut;         /* buckets below it are kept whole; NBUCKET: no nucleus cut */
    uint64_t cut_key; /* in the cut bucket, keys >= it are kept */
    float zlo;        /* tokens with z below it are never kept */
    double kept;      /* mass of everything kept: candidates and tail */
};

/* One pass histograms the mass of the other tokens by bucket of z (only z >= max(zmin,
 * -ZCUT): the kept set is the shorter of the two ranked prefixes, so tokens below the min-p
 * cut never matter); the nucleus ends in one bucket, whose tokens alone are collected and
 * sorted. */
static smelt_status nucleus_cut(struct sampler *s, const struct view *v, double need, float zmin,
                                struct ncut *nc) {
    const float mx = v->mx, inv_t = v->inv_t;
    const struct topk_cand *last = &v->cand[v->n - 1];
    const float zlo = zmin > -ZCUT ? zmin : -ZCUT;
    double cmass = 0.0;
    for (int32_t i = 0; i < v->n; i++) cmass += weight(v->cand[i].logit, mx, inv_t);
    double mass[NBUCKET] = {0};
    int64_t count[NBUCKET] = {0};
    struct adj_walk w = walk_of(s);
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float a = adj_value(&w, v->row, i);
        float z = (a - mx) * inv_t;
        if (!(z >= zlo) || !is_tail(a, i, last)) continue;
        int b = bucket_of(z);
        mass[b] += weight(a, mx, inv_t);
        count[b]++;
    }
    int bcut = NBUCKET;
    double before = cmass;
    for (int b = 0; b < NBUCKET; b++) {
        if (before + mass[b] >= need) {
            bcut = b;
            break;
        }
        before += mass[b];
    }
    int64_t n_cut = 0; /* the cut bucket's kept tokens: s->keys[0 .. n_cut), rank order */
    double kept = before; /* candidates + kept tail */
    if (bcut < NBUCKET) {
        if (!array_grow((void **)&s->keys, &s->keys_cap, (size_t)count[bcut] + 1, sizeof *s->keys))
            return SMELT_ERR_NOMEM;
        int64_t n = 0;
        w = walk_of(s);
        for (int32_t i = 0; i < s->n_vocab && n < count[bcut]; i++) {
            float a = adj_value(&w, v->row, i);
            float z = (a - mx) * inv_t;
            if (z >= zlo && bucket_of(z) == bcut && is_tail(a, i, last)) s->keys[n++] = topk_key(a, i);
        }
        qsort(s->keys, (size_t)n, sizeof *s->keys, key_desc);
        while (n_cut < n) {
            kept += weight(topk_key_logit(s->keys[n_cut]), mx, inv_t);
            n_cut++;
            if (kept >= need) break;
        }
    }
    *nc = (struct ncut){bcut, n_cut > 0 ? s->keys[n_cut - 1] : UINT64_MAX, zlo, kept};
    return SMELT_OK;
}

/* Whether a token past the candidates (adjusted logit a) is kept by the cut. */
static bool ncut_keeps(const struct view *v, const struct ncut *nc, float a, int32_t i) {
    if (!(a > -INFINITY)) return false;
    float z = (a - v->mx) * v->inv_t;
    if (!(z >= nc->zlo)) return false;
    int b = bucket_of(z);
    return b < nc->bcut || (b == nc->bcut && topk_key(a, i) >= nc->cut_key);
}

/* The nucleus and min-p cut past the candidates (nucleus_cut), then a draw that walks every
 * kept token (candidates and tail) in token order. */
static smelt_status nucleus_full(struct sampler *s, const struct view *v, double need, float zmin,
                                 int32_t *tok) {
    struct ncut nc;
    if (nucleus_cut(s, v, need, zmin, &nc) != SMELT_OK) return SMELT_ERR_NOMEM;
    const float mx = v->mx, inv_t = v->inv_t;
    const struct topk_cand *last = &v->cand[v->n - 1];
    double u = rng_uniform(s->rng) * nc.kept, run = 0.0;
    *tok = last->token;
    struct adj_walk w = walk_of(s);
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float a = adj_value(&w, v->row, i);
        if (!(a > -INFINITY)) continue;
        if (is_tail(a, i, last) && !ncut_keeps(v, &nc, a, i)) continue;
        *tok = i;
        run += weight(a, mx, inv_t);
        if (u < run) break;
    }
    return SMELT_OK;
}

/* A temperature draw with no truncation went past the candidates (u, and their mass c):
 * it continues over the other finite tokens in token order. */
static int32_t tail_draw(struct sampler *s, const struct view *v, double u, double c) {
    const struct topk_cand *last = &v->cand[v->n - 1];
    double target = u * (double)v->sum->sum_adj - c, run = 0.0;
    int32_t tok = last->token;
    struct adj_walk w = walk_of(s);
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float a = adj_value(&w, v->row, i);
        if (!(a > -INFINITY) || !is_tail(a, i, last)) continue;
        tok = i;
        run += weight(a, v->mx, v->inv_t);
        if (target < run) break;
    }
    return tok;
}

/* Picks the token (temperature > 0). *need: the full row is needed (v->row is NULL). */
static smelt_status choose(struct sampler *s, const struct view *v, int32_t *tok, bool *need) {
    const struct sample_params *p = &s->p;
    const float mx = v->mx, inv_t = v->inv_t;
    const float zmin = p->min_p > 0.0f ? logf(p->min_p) : -INFINITY;
    *need = false;
    if (s->pend == PEND_DRAW) {
        if (!v->row) {
            *need = true;
            return SMELT_OK;
        }
        *tok = tail_draw(s, v, s->pend_u, s->pend_c);
        return SMELT_OK;
    }
    if (p->top_k > 0 && p->top_k < s->n_vocab) {
        if (p->top_k <= v->n || v->complete) {
            *tok = finish_top_k(s, v->cand, imin(p->top_k, v->n), mx, inv_t, zmin);
            return SMELT_OK;
        }
        if (!v->row) {
            *need = true;
            return SMELT_OK;
        }
        return top_k_full(s, v, zmin, tok);
    }
    int64_t cut = minp_cut(v->cand, v->n, mx, inv_t, zmin);
    if (p->top_p < 1.0f) {
        double total = 0.0;
        if (v->complete)
            for (int32_t i = 0; i < v->n; i++) total += weight(v->cand[i].logit, mx, inv_t);
        else total = (double)v->sum->sum_adj;
        double want = p->top_p * total, acc = 0.0;
        int64_t end = -1;
        for (int32_t i = 0; i < v->n && end < 0; i++) {
            acc += weight(v->cand[i].logit, mx, inv_t);
            if (acc >= want) end = i + 1;
        }
        if (end < 0 && v->complete) end = v->n;
        if (end > 0 || cut > 0) {
            int64_t keep = end > 0 && (cut < 0 || end < cut) ? end : cut;
            *tok = draw_set(s, v->cand, keep, mx, inv_t);
            return SMELT_OK;
        }
        if (!v->row) {
            *need = true;
            return SMELT_OK;
        }
        return nucleus_full(s, v, want, zmin, tok);
    }
    if (p->min_p > 0.0f) {
        if (cut > 0 || v->complete) {
            *tok = draw_set(s, v->cand, cut > 0 ? cut : v->n, mx, inv_t);
            return SMELT_OK;
        }
        if (!v->row) {
            *need = true;
            return SMELT_OK;
        }
        return nucleus_full(s, v, INFINITY, zmin, tok);
    }
    /* no truncation: every finite token can be drawn */
    if (v->complete) {
        *tok = draw_set(s, v->cand, v->n, mx, inv_t);
        return SMELT_OK;
    }
    /* the candidates in token order, then the other tokens in token order */
    const struct topk_cand *c = v->cand;
    if (array_grow((void **)&s->list, &s->list_cap, v->n, sizeof *s->list)) {
        memcpy(s->list, v->cand, sizeof *c * (size_t)v->n);
        qsort(s->list, (size_t)v->n, sizeof *s->list, cand_token_cmp);
        c = s->list;
    }
    double u = rng_uniform(s->rng), target = u * (double)v->sum->sum_adj, run = 0.0;
    for (int32_t i = 0; i < v->n; i++) {
        run += weight(c[i].logit, mx, inv_t);
        if (target < run) {
            *tok = c[i].token;
            return SMELT_OK;
        }
    }
    s->pend_u = u;
    s->pend_c = run;
    if (!v->row) {
        s->pend = PEND_DRAW;
        *need = true;
        return SMELT_OK;
    }
    *tok = tail_draw(s, v, u, run);
    return SMELT_OK;
}

/* The raw logit of tok; false when it needs the row. */
static bool raw_of(const struct sampler *s, const struct view *v, int32_t tok, float *raw) {
    if (v->row) {
        *raw = v->row[tok];
        return true;
    }
    int32_t ai = adj_find(s, tok);
    if (ai >= 0) {
        if (!v->adj_raw) return false;
        *raw = v->adj_raw[ai];
        return true;
    }
    for (int32_t i = 0; i < v->n; i++)
        if (v->cand[i].token == tok) {
            *raw = v->cand[i].logit; /* not adjusted: the raw logit */
            return true;
        }
    return false;
}

/* The n_logprobs most likely tokens of the raw distribution from the summary: top[0..*m);
 * false when the summary does not settle them. */
static bool top_from_summary(struct sampler *s, const struct view *v, uint64_t *top, int32_t *m) {
    const int32_t want = s->p.n_logprobs;
    *m = 0;
    if (s->req.adj_n == 0) {
        if (v->n < want && !v->complete) return false;
        for (; *m < want && *m < v->n; (*m)++) top[*m] = topk_key(v->cand[*m].logit, v->cand[*m].token);
        return true;
    }
    /* Merge the candidates that are not adjusted (their raw logit is the adjusted one)
     * with the adjusted tokens' raw logits. An adjusted token ranking after the last
     * candidate is certain only when the candidates are every finite token. */
    if (!v->adj_raw || !array_grow((void **)&s->keys, &s->keys_cap, s->req.adj_n, sizeof *s->keys))
        return false;
    int32_t nr = 0;
    for (int32_t i = 0; i < s->req.adj_n; i++) {
        if (i > 0 && s->adj[i].token == s->adj[i - 1].token) continue;
        if (v->adj_raw[i] > -INFINITY) s->keys[nr++] = topk_key(v->adj_raw[i], s->adj[i].token);
    }
    qsort(s->keys, (size_t)nr, sizeof *s->keys, key_desc);
    const uint64_t last = topk_key(v->cand[v->n - 1].logit, v->cand[v->n - 1].token);
    int32_t i = 0, j = 0;
    while (*m < want) {
        while (i < v->n && adj_find(s, v->cand[i].token) >= 0) i++;
        uint64_t kc = i < v->n ? topk_key(v->cand[i].logit, v->cand[i].token) : 0;
        uint64_t kr = j < nr ? s->keys[j] : 0;
        if (kc == 0 && kr == 0) return v->complete; /* else unseen tokens come next */
        if (kc > kr) {
            top[(*m)++] = kc;
            i++;
        } else {
            if (kr < last && !v->complete) return false;
            top[(*m)++] = kr;
            j++;
        }
    }
    return true;
}

/* The n_logprobs most likely tokens of the raw distribution into out->top; false when
 * they need the row. */
static bool top_logprobs(struct sampler *s, const struct view *v, struct sample_result *out) {
    const int32_t want = s->p.n_logprobs;
    uint64_t top[SAMPLE_MAX_LOGPROBS];
    int32_t m = 0;
    if (!top_from_summary(s, v, top, &m)) {
        if (!v->row) return false;
        int64_t n = 0;
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (v->row[i] > -INFINITY) key_offer(top, &n, want, topk_key(v->row[i], i));
        qsort(top, (size_t)n, sizeof top[0], key_desc);
        m = (int32_t)n;
    }
    for (int32_t i = 0; i < m; i++)
        out->top[i] = (struct sample_token_logprob){topk_key_token(top[i]),
                                                    topk_key_logit(top[i]) - v->sum->lse_raw};
    out->n_top = m;
    return true;
}

static smelt_status finish(struct sampler *s, const struct view *v, struct sample_result *out,
                           struct err *e) {
    const struct sample_params *p = &s->p;
    if (v->n <= 0) return err_set(e, SMELT_ERR_INVALID, "sampler: every token is banned or NaN");
    bool want_lp = p->n_logprobs >= 0;
    if (want_lp && !(v->sum->lse_raw > -INFINITY))
        return err_set(e, SMELT_ERR_INVALID, "sampler: every logit is -inf or NaN");
    int32_t tok = -1;
    if (s->pend == PEND_LOGPROBS) {
        tok = s->pend_tok;
    } else if (p->temperature == 0.0f) {
        tok = v->cand[0].token;
    } else {
        bool need = false;
        smelt_status st = choose(s, v, &tok, &need);
        if (st != SMELT_OK) return err_set(e, st, "sampler: out of memory");
        if (need) {
            out->token = SAMPLE_NEED_ROW;
            return SMELT_OK;
        }
    }
    if (want_lp) {
        float raw = 0.0f;
        bool ok = raw_of(s, v, tok, &raw);
        if (ok && p->n_logprobs > 0) ok = top_logprobs(s, v, out);
        if (!ok) {
            s->pend = PEND_LOGPROBS;
            s->pend_tok = tok;
            out->n_top = 0;
            out->token = SAMPLE_NEED_ROW;
            return SMELT_OK;
        }
        out->logprob = raw - v->sum->lse_raw;
    }
    out->token = tok;
    return SMELT_OK;
}

/* The view of the open request's row: from the summary, or (a request that asked for
 * nothing) from a summary made here of the row. False when that needs the row. */
static bool make_view(struct sampler *s, const struct topk_summary *sum,
                      const struct topk_cand *cand, const float *adj_raw, const float *row,
                      struct view *v, struct topk_cand *one) {
    if (s->host_only) {
        if (!row) return false;
        topk_summarize_row(row, s->n_vocab, &s->req, s->adj, NULL, &s->hsum, s->hcand, s->raw_host);
        sum = &s->hsum;
        cand = s->hcand;
        adj_raw = s->raw_host;
    }
    *one = (struct topk_cand){sum->top_token, sum->top_logit};
    *v = (struct view){.sum = sum, .adj_raw = adj_raw, .row = row, .inv_t = s->req.inv_t};
    v->n = imax(0, imin(sum->n_cand, s->req.k));
    v->cand = s->req.k == 1 ? one : cand;
    v->complete = v->n == sum->n_finite;
    v->mx = v->n > 0 ? v->cand[0].logit : -INFINITY;
    return true;
}

/* Checks that a request is open; with a token mask, *row (when given) becomes the row with
 * the mask applied, which the full-row passes then see. */
static smelt_status check_open(struct sampler *s, const float **row, struct sample_result *out,
                               struct err *e) {
    memset(out, 0, sizeof *out);
    out->token = -1;
    if (!s->requested)
        return s->req_nomem ? err_set(e, SMELT_ERR_NOMEM, "sampler: out of memory")
                            : err_set(e, SMELT_ERR_INTERNAL, "sampler: no open request");
    if (*row && s->mask) {
        if (!s->mrow && !(s->mrow = malloc(sizeof *s->mrow * (size_t)s->n_vocab)))
            return err_set(e, SMELT_ERR_NOMEM, "sampler: out of memory");
        for (int32_t i = 0; i < s->n_vocab; i++)
            s->mrow[i] = topk_allowed(s->mask, i) ? (*row)[i] : -INFINITY;
        *row = s->mrow;
    }
    return SMELT_OK;
}

smelt_status sampler_finish(struct sampler *s, const struct topk_summary *sum,
                            const struct topk_cand *cand, const float *adj_raw,
                            const float *row, struct sample_result *out, struct err *e) {
    smelt_status st = check_open(s, &row, out, e);
    if (st != SMELT_OK) return st;
    struct view v;
    struct topk_cand one;
    if (!make_view(s, sum, cand, adj_raw, row, &v, &one)) {
        out->token = SAMPLE_NEED_ROW;
        return SMELT_OK;
    }
    st = finish(s, &v, out, e);
    if (st != SMELT_OK || out->token != SAMPLE_NEED_ROW) {
        s->requested = false;
        s->pend = PEND_NONE;
    }
    return st;
}

void sampler_reopen(struct sampler *s, const struct topk_row *row) {
    if (prepare(s) && row->k == 0) s->host_only = true;
}

/* ---- speculative verification ----
 *
 * The row's sampling distribution p (temperature > 0) as the draws above define it: a set of
 * kept tokens, each with probability weight(a) / mass. Three shapes:
 *   KEPT_RANK     a ranked prefix: tokens whose key is >= min_key (top-k; a top-p nucleus or
 *                 min-p cut that ends inside the candidates; all the candidates when they are
 *                 every finite token);
 *   KEPT_ALL      every finite token (no truncation, more tokens than the candidates);
 *   KEPT_NUCLEUS  the candidates and the tail tokens a struct ncut keeps (a nucleus or
 *                 min-p cut past the candidates). */
enum kept_kind { KEPT_RANK, KEPT_ALL, KEPT_NUCLEUS };

struct kept {
    enum kept_kind kind;
    uint64_t min_key; /* KEPT_RANK */
    bool in_cands;    /* KEPT_RANK: every kept token is a candidate */
    double mass;
    struct ncut nc; /* KEPT_NUCLEUS */
};

/* The mass of the ranked prefix c[0..m) (rank order). */
static double prefix_mass(const struct topk_cand *c, int64_t m, float mx, float inv_t) {
    double t = 0.0;
    for (int64_t i = 0; i < m; i++) t += weight(c[i].logit, mx, inv_t);
    return t;
}

/* How finish_top_k cuts c[0..m): the kept prefix length. */
static int64_t top_k_keep(const struct sampler *s, const struct topk_cand *c, int64_t m, float mx,
                          float inv_t, float zmin) {
    double need = s->p.top_p < 1.0f ? s->p.top_p * prefix_mass(c, m, mx, inv_t) : INFINITY;
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < m) {
        float z = (c[keep].logit - mx) * inv_t;
        if (keep > 0 && z < zmin) break;
        acc += weight(c[keep].logit, mx, inv_t);
        keep++;
        if (acc >= need) break;
    }
    return keep;
}

static void kept_rank(struct kept *k, const struct topk_cand *c, int64_t keep, float mx, float inv_t,
                      bool in_cands) {
    k->kind = KEPT_RANK;
    k->min_key = topk_key(c[keep - 1].logit, c[keep - 1].token);
    k->in_cands = in_cands;
    k->mass = prefix_mass(c, keep, mx, inv_t);
}

/* The kept set of the row as choose() draws from it. *need: the row is needed (v->row is
 * NULL). */
/* k = the nucleus of v's full row up to mass want (INFINITY: min-p alone); without the row,
 * *need asks the caller for it. */
static smelt_status kept_nucleus(struct sampler *s, const struct view *v, double want, float zmin,
                                 struct kept *k, bool *need) {
    if (!v->row) {
        *need = true;
        return SMELT_OK;
    }
    k->kind = KEPT_NUCLEUS;
    if (nucleus_cut(s, v, want, zmin, &k->nc) != SMELT_OK) return SMELT_ERR_NOMEM;
    k->mass = k->nc.kept;
    return SMELT_OK;
}

static smelt_status kept_of(struct sampler *s, const struct view *v, struct kept *k, bool *need) {
    const struct sample_params *p = &s->p;
    const float mx = v->mx, inv_t = v->inv_t;
    const float zmin = p->min_p > 0.0f ? logf(p->min_p) : -INFINITY;
    *need = false;
    memset(k, 0, sizeof *k);
    if (p->top_k > 0 && p->top_k < s->n_vocab) {
        if (p->top_k <= v->n || v->complete) {
            int64_t m = imin(p->top_k, v->n);
            kept_rank(k, v->cand, top_k_keep(s, v->cand, m, mx, inv_t, zmin), mx, inv_t, true);
            return SMELT_OK;
        }
        if (!v->row) {
            *need = true;
            return SMELT_OK;
        }
        /* the top_k tokens of the whole row, ranked (as top_k_full) */
        int64_t kk = p->top_k, n = 0;
        if (!array_grow((void **)&s->keys, &s->keys_cap, kk, sizeof *s->keys) ||
            !array_grow((void **)&s->list, &s->list_cap, kk, sizeof *s->list))
            return SMELT_ERR_NOMEM;
        struct adj_walk w = walk_of(s);
        for (int32_t i = 0; i < s->n_vocab; i++) {
            float a = adj_value(&w, v->row, i);
            if (a > -INFINITY) key_offer(s->keys, &n, kk, topk_key(a, i));
        }
        qsort(s->keys, (size_t)n, sizeof *s->keys, key_desc);
        for (int64_t i = 0; i < n; i++)
            s->list[i] = (struct topk_cand){topk_key_token(s->keys[i]), topk_key_logit(s->keys[i])};
        kept_rank(k, s->list, top_k_keep(s, s->list, n, mx, inv_t, zmin), mx, inv_t, false);
        return SMELT_OK;
    }
    int64_t cut = minp_cut(v->cand, v->n, mx, inv_t, zmin);
    if (p->top_p < 1.0f) {
        double total = v->complete ? prefix_mass(v->cand, v->n, mx, inv_t) : (double)v->sum->sum_adj;
        double want = p->top_p * total, acc = 0.0;
        int64_t end = -1;
        for (int32_t i = 0; i < v->n && end < 0; i++) {
            acc += weight(v->cand[i].logit, mx, inv_t);
            if (acc >= want) end = i + 1;
        }
        if (end < 0 && v->complete) end = v->n;
        if (end > 0 || cut > 0) {
            int64_t keep = end > 0 && (cut < 0 || end < cut) ? end : cut;
            kept_rank(k, v->cand, keep, mx, inv_t, true);
            return SMELT_OK;
        }
        return kept_nucleus(s, v, want, zmin, k, need);
    }
    if (p->min_p > 0.0f) {
        if (cut > 0 || v->complete) {
            kept_rank(k, v->cand, cut > 0 ? cut : v->n, mx, inv_t, true);
            return SMELT_OK;
        }
        return kept_nucleus(s, v, INFINITY, zmin, k, need);
    }
    if (v->complete) {
        kept_rank(k, v->cand, v->n, mx, inv_t, true);
        return SMELT_OK;
    }
    k->kind = KEPT_ALL;
    k->mass = (double)v->sum->sum_adj;
    return SMELT_OK;
}

/* The adjusted logit of token t: from the row, the candidates, or the raw logit of an
 * adjusted token. False when only the row has it. */
static bool adjusted_of(const struct sampler *s, const struct view *v, int32_t t, float *a) {
    int32_t ai = adj_find(s, t);
    float raw;
    if (v->row) {
        raw = v->row[t];
    } else {
        for (int32_t i = 0; i < v->n; i++)
            if (v->cand[i].token == t) {
                *a = v->cand[i].logit;
                return true;
            }
        if (ai < 0 || !v->adj_raw) return false;
        raw = v->adj_raw[ai];
    }
    float x = raw;
    for (int32_t j = ai; j >= 0 && j < s->req.adj_n && s->adj[j].token == t; j++)
        x = topk_adj_apply(x, &s->adj[j]);
    *a = x;
    return true;
}

/* p(t) under the kept set k. False when it needs the row. */
static bool kept_prob(const struct sampler *s, const struct view *v, const struct kept *k,
                      int32_t t, double *pr) {
    *pr = 0.0;
    if (t < 0 || t >= s->n_vocab) return true;
    float a;
    if (!adjusted_of(s, v, t, &a)) {
        /* not a candidate, so it ranks after all of them */
        return k->kind == KEPT_RANK && k->in_cands;
    }
    if (!(a > -INFINITY)) return true;
    bool keep = true;
    if (k->kind == KEPT_RANK) {
        keep = topk_key(a, t) >= k->min_key;
    } else if (k->kind == KEPT_NUCLEUS) {
        const struct topk_cand *last = &v->cand[v->n - 1];
        keep = !is_tail(a, t, last) || ncut_keeps(v, &k->nc, a, t);
    }
    if (keep) *pr = weight(a, v->mx, v->inv_t) / k->mass;
    return true;
}

static double q_of(const struct sample_q *q, int32_t t) {
    int32_t lo = 0, hi = q->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (q->token[mid] < t) lo = mid + 1;
        else hi = mid;
    }
    return lo < q->n && q->token[lo] == t ? (double)q->prob[lo] : 0.0;
}

/* A draw from norm(max(0, p - q)) over the whole row, in token order (two passes). */
static int32_t residual_walk(struct sampler *s, const struct view *v, const struct kept *k,
                             const struct sample_q *q) {
    double total = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        double u = pass ? rng_uniform(s->rng) * total : 0.0, run = 0.0;
        int32_t last = -1;
        for (int32_t t = 0; t < s->n_vocab; t++) {
            double pt;
            kept_prob(s, v, k, t, &pt); /* with the row: always known */
            double r = pt - q_of(q, t);
            if (!(r > 0.0)) continue;
            last = t;
            run += r;
            if (pass && u < run) return t;
        }
        if (!pass) total = run;
        if (!pass && !(total > 0.0)) return v->cand[0].token; /* p = q: a rejection had odds 0 */
        if (pass) return last;
    }
    return v->cand[0].token;
}

/* Accepts the draft with probability min(1, p(draft) / q(draft)), else draws from
 * norm(max(0, p - q)): by rejection from p (draw y from p, keep it with probability
 * max(0, p(y) - q(y)) / p(y)) up to 64 times, then exactly over the row. *need: the row
 * is needed (v->row NULL). */
static smelt_status verify_sampled(struct sampler *s, const struct view *v, int32_t draft,
                                   const struct sample_q *q, int32_t *tok, bool *accepted,
                                   bool *need) {
    struct kept k;
    *accepted = false;
    smelt_status st = kept_of(s, v, &k, need);
    if (st != SMELT_OK || *need) return st;
    double pd, qd = q_of(q, draft);
    if (!kept_prob(s, v, &k, draft, &pd)) {
        *need = true;
        return SMELT_OK;
    }
    double u = rng_uniform(s->rng);
    if (qd > 0.0 && u * qd <= pd) {
        *tok = draft;
        *accepted = true;
        return SMELT_OK;
    }
    for (int it = 0; it < 64; it++) {
        int32_t y = -1;
        st = choose(s, v, &y, need);
        if (st != SMELT_OK || *need) return st;
        double py, qy = q_of(q, y);
        if (!kept_prob(s, v, &k, y, &py)) {
            *need = true;
            return SMELT_OK;
        }
        double u2 = rng_uniform(s->rng);
        if (qy <= 0.0 || u2 * py < py - qy) {
            *tok = y;
            return SMELT_OK;
        }
    }
    if (!v->row) {
        *need = true;
        return SMELT_OK;
    }
    *tok = residual_walk(s, v, &k, q);
    return SMELT_OK;
}

smelt_status sampler_verify(struct sampler *s, const struct topk_summary *sum,
                            const struct topk_cand *cand, const float *adj_raw, const float *row,
                            int32_t draft, const struct sample_q *q, struct sample_result *out,
                            bool *accepted, struct err *e) {
    *accepted = false;
    if (draft < 0 || !q || q->n <= 0 || s->p.temperature == 0.0f) {
        smelt_status st = sampler_finish(s, sum, cand, adj_raw, row, out, e);
        *accepted = st == SMELT_OK && draft >= 0 && out->token == draft;
        return st;
    }
    smelt_status st = check_open(s, &row, out, e);
    if (st != SMELT_OK) return st;
    struct view v;
    struct topk_cand one;
    if (!make_view(s, sum, cand, adj_raw, row, &v, &one)) {
        out->token = SAMPLE_NEED_ROW;
        return SMELT_OK;
    }
    if (v.n <= 0) {
        s->requested = false;
        return err_set(e, SMELT_ERR_INVALID, "sampler: every token is banned or NaN");
    }
    /* a call that needs the row gives back its draws: the call with the row makes them again */
    uint64_t rng0[4];
    memcpy(rng0, s->rng, sizeof rng0);
    s->pend = PEND_NONE;
    int32_t tok = -1;
    bool need = false;
    st = verify_sampled(s, &v, draft, q, &tok, accepted, &need);
    if (st != SMELT_OK) {
        s->requested = false;
        return err_set(e, st, "sampler: out of memory");
    }
    if (!need && s->p.n_logprobs >= 0) {
        float raw = 0.0f;
        if (!(v.sum->lse_raw > -INFINITY)) {
            s->requested = false;
            return err_set(e, SMELT_ERR_INVALID, "sampler: every logit is -inf or NaN");
        }
        need = !raw_of(s, &v, tok, &raw) || (s->p.n_logprobs > 0 && !top_logprobs(s, &v, out));
        out->logprob = raw - v.sum->lse_raw;
    }
    s->pend = PEND_NONE;
    if (need) {
        memcpy(s->rng, rng0, sizeof rng0);
        *accepted = false;
        out->n_top = 0;
        out->token = SAMPLE_NEED_ROW;
        return SMELT_OK;
    }
    out->token = tok;
    s->requested = false;
    return SMELT_OK;
}

smelt_status sampler_sample(struct sampler *s, const float *logits, struct sample_result *out,
                            struct err *e) {
    if (!prepare(s)) {
        memset(out, 0, sizeof *out);
        out->token = -1;
        return err_set(e, SMELT_ERR_NOMEM, "sampler: out of memory");
    }
    topk_summarize_row(logits, s->n_vocab, &s->req, s->adj, s->mask, &s->hsum, s->hcand,
                       s->raw_host);
    return sampler_finish(s, &s->hsum, s->hcand, s->raw_host, logits, out, e);
}

/* Sampling: see sample.h for the contract and the cost per token. */
#include "engine/sample.h"

#include "engine/argmax.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ZCUT 30.0f  /* tokens with logit < max - ZCUT*T are never sampled (see sample.h) */
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

struct cand {
    int32_t token;
    float logit;
};

struct saved_logit {
    int32_t token;
    float logit;
};

struct sampler {
    struct sample_params p;
    struct logit_bias *bias; /* owned copy */
    int32_t n_vocab;
    uint64_t rng[4]; /* xoshiro256** */

    /* Penalty window: a ring of the last `cap` tokens (cap grows when unbounded). */
    struct hist_entry *ring;
    int64_t ring_cap, ring_len, ring_head; /* head = index of the oldest entry */
    bool windowed;
    /* token -> counts, open addressing; slots with zero counts are cleared on rebuild */
    struct penalty_slot *slots;
    int32_t slot_cap, slot_used;

    /* scratch */
    struct cand *cand;
    int64_t cand_cap;
    struct saved_logit *saved;
    int64_t saved_cap, n_saved;
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

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

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
        if (s->windowed) { /* evict the oldest */
            count_add(s, s->ring[s->ring_head], -1);
            s->ring[s->ring_head] = h;
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
            count_add(s, h, +1);
            return;
        }
        int64_t cap = s->ring_cap * 2;
        struct hist_entry *nr = realloc(s->ring, sizeof *nr * (size_t)cap);
        if (!nr) return;
        s->ring = nr;
        s->ring_cap = cap;
    }
    s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = h;
    s->ring_len++;
    count_add(s, h, +1);
}

void sampler_reset_history(struct sampler *s) {
    s->ring_len = 0;
    s->ring_head = 0;
    for (int32_t i = 0; i < s->slot_cap; i++) s->slots[i].token = -1;
    s->slot_used = 0;
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
    s->ring_cap = s->windowed ? p->penalty_last_n : 256;
    s->ring = malloc(sizeof *s->ring * (size_t)s->ring_cap);
    s->slot_cap = 64;
    s->slots = malloc(sizeof *s->slots * (size_t)s->slot_cap);
    if (p->n_bias > 0) {
        s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias);
        if (s->bias) memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
        s->p.bias = s->bias;
    }
    if (!s->ring || !s->slots || (p->n_bias > 0 && !s->bias)) {
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
    free(s->cand);
    free(s->saved);
    free(s);
}

/* ---- helpers over the vocabulary ---- */

static bool reserve_cand(struct sampler *s, int64_t n) {
    if (n <= s->cand_cap) return true;
    struct cand *c = realloc(s->cand, sizeof *c * (size_t)n);
    if (!c) return false;
    s->cand = c;
    s->cand_cap = n;
    return true;
}

/* a ranks before b: larger logit, then smaller token id (deterministic ties). */
static inline bool cand_before(struct cand a, struct cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

static int cand_cmp(const void *pa, const void *pb) {
    struct cand a = *(const struct cand *)pa, b = *(const struct cand *)pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Min-heap (by rank) of the best k seen: heap[0] is the worst kept. */
static void heap_sift_down(struct cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_before(h[m], h[l])) m = l;
        if (r < n && cand_before(h[m], h[r])) m = r;
        if (m == i) return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_sift_up(struct cand *h, int64_t i) {
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!cand_before(h[p], h[i])) return;
        struct cand t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* Pushes c into a heap of at most k entries. */
static inline void heap_offer(struct cand *h, int64_t *n, int64_t k, struct cand c) {
    if (*n < k) {
        h[*n] = c;
        heap_sift_up(h, (*n)++);
    } else if (cand_before(c, h[0])) {
        h[0] = c;
        heap_sift_down(h, *n, 0);
    }
}

/* One pass over raw logits: log-sum-exp (online) and the top n alternatives. */
static float raw_pass(const float *logits, int32_t nv, struct cand *top, int64_t *n_top, int64_t k) {
    float mx = -INFINITY;
    double sum = 0.0;
    *n_top = 0;
    for (int32_t i = 0; i < nv; i++) {
        float l = logits[i];
        if (!(l > -INFINITY)) continue; /* -inf and NaN carry no mass */
        if (l > mx) {
            sum = sum * (double)expf(mx - l) + 1.0;
            mx = l;
        } else {
            sum += (double)expf(l - mx);
        }
        if (k > 0) heap_offer(top, n_top, k, (struct cand){i, l});
    }
    return mx == -INFINITY ? -INFINITY : (float)(mx + log(sum));
}

static void save_logit(struct sampler *s, int32_t tok, float v) {
    if (s->n_saved == s->saved_cap) {
        int64_t cap = s->saved_cap ? s->saved_cap * 2 : 64;
        struct saved_logit *ns = realloc(s->saved, sizeof *ns * (size_t)cap);
        if (!ns) return;
        s->saved = ns;
        s->saved_cap = cap;
    }
    s->saved[s->n_saved++] = (struct saved_logit){tok, v};
}

/* Applies penalties and bias in place; with `save`, remembers the raw values first. */
static void apply_penalties(struct sampler *s, float *logits, bool save) {
    const struct sample_params *p = &s->p;
    bool rep = p->repetition_penalty != 1.0f;
    bool pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (rep || pf) {
        for (int32_t i = 0; i < s->slot_cap; i++) {
            struct penalty_slot *sl = &s->slots[i];
            if (sl->token < 0 || sl->n_all == 0) continue;
            float l = logits[sl->token];
            if (save) save_logit(s, sl->token, l);
            if (rep) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
            if (sl->n_gen > 0)
                l -= p->presence_penalty + p->frequency_penalty * (float)sl->n_gen;
            logits[sl->token] = l;
        }
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t t = p->bias[i].token;
        if (save) save_logit(s, t, logits[t]);
        logits[t] = p->bias[i].bias <= -100.0f ? -INFINITY : logits[t] + p->bias[i].bias;
    }
}

static float raw_logit(const struct sampler *s, const float *logits, int32_t tok) {
    /* The first saved value of a token is its raw one (bias may save it a second time). */
    for (int64_t i = 0; i < s->n_saved; i++)
        if (s->saved[i].token == tok) return s->saved[i].logit;
    return logits[tok];
}

/* Draws from s->cand[0..n) with weights exp((logit - mx) / T); deterministic for a seed. */
static int32_t draw(struct sampler *s, int64_t n, float mx, float inv_t) {
    double tot = 0.0;
    for (int64_t i = 0; i < n; i++) tot += (double)expf((s->cand[i].logit - mx) * inv_t);
    double u = rng_uniform(s->rng) * tot, run = 0.0;
    for (int64_t i = 0; i < n; i++) {
        run += (double)expf((s->cand[i].logit - mx) * inv_t);
        if (u < run) return s->cand[i].token;
    }
    return s->cand[n - 1].token;
}

/* Top-k path: a heap of k, sorted; then exact top-p and min-p on those k; then a draw. */
static int32_t sample_top_k(struct sampler *s, const float *logits, smelt_status *st) {
    const struct sample_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    if (!reserve_cand(s, p->top_k)) {
        *st = SMELT_ERR_NOMEM;
        return -1;
    }
    int64_t n = 0;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (logits[i] > -INFINITY) heap_offer(s->cand, &n, p->top_k, (struct cand){i, logits[i]});
    if (n == 0) return -1;
    qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
    float mx = s->cand[0].logit;
    double mass = 0.0;
    for (int64_t i = 0; i < n; i++) mass += (double)expf((s->cand[i].logit - mx) * inv_t);
    double need = p->top_p < 1.0f ? p->top_p * mass : INFINITY;
    float zmin = p->min_p > 0.0f ? logf(p->min_p) : -INFINITY;
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n) {
        float z = (s->cand[keep].logit - mx) * inv_t;
        if (keep > 0 && z < zmin) break;
        acc += (double)expf(z);
        keep++;
        if (acc >= need) break;
    }
    return draw(s, keep, mx, inv_t);
}

/* Full-vocabulary path. Pass 1: max. Pass 2: histogram of probability mass by bucket of
 * z = (l - max)/T in [-ZCUT, 0]. With no top-p/min-p the draw is one more pass in token
 * order. Otherwise the top-p cut falls inside one bucket: tokens in better buckets are kept
 * unsorted, only the cut bucket's few tokens are sorted. min-p is an exact z threshold. */
static int32_t sample_full(struct sampler *s, const float *logits, smelt_status *st) {
    const struct sample_params *p = &s->p;
    int32_t nv = s->n_vocab;
    float inv_t = 1.0f / p->temperature;
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        if (logits[i] > mx) mx = logits[i];
    if (mx == -INFINITY) return -1;
    const float scale = NBUCKET / ZCUT;
    float zmin = p->min_p > 0.0f ? logf(p->min_p) : -ZCUT;
    if (zmin < -ZCUT) zmin = -ZCUT;
    if (p->top_p >= 1.0f) {
        /* No nucleus: draw over every token with z >= zmin, in token order. */
        double tot = 0.0;
        for (int32_t i = 0; i < nv; i++) {
            float z = (logits[i] - mx) * inv_t;
            if (z >= zmin) tot += (double)expf(z);
        }
        double u = rng_uniform(s->rng) * tot, run = 0.0;
        int32_t last = -1;
        for (int32_t i = 0; i < nv; i++) {
            float z = (logits[i] - mx) * inv_t;
            if (!(z >= zmin)) continue;
            last = i;
            run += (double)expf(z);
            if (u < run) return i;
        }
        return last;
    }
    double mass[NBUCKET];
    int64_t count[NBUCKET];
    memset(mass, 0, sizeof mass);
    memset(count, 0, sizeof count);
    double total = 0.0;
    for (int32_t i = 0; i < nv; i++) {
        float z = (logits[i] - mx) * inv_t;
        if (!(z >= -ZCUT)) continue;
        int b = (int)(-z * scale);
        if (b >= NBUCKET) b = NBUCKET - 1;
        double w = (double)expf(z);
        mass[b] += w;
        count[b]++;
        total += w;
    }
    double need = p->top_p * total, before = 0.0;
    int bcut = NBUCKET - 1;
    for (int b = 0; b < NBUCKET; b++) {
        if (before + mass[b] >= need) {
            bcut = b;
            break;
        }
        before += mass[b];
    }
    int64_t n_in = 0;
    for (int b = 0; b < bcut; b++) n_in += count[b];
    int64_t n = n_in + count[bcut];
    if (!reserve_cand(s, n)) {
        *st = SMELT_ERR_NOMEM;
        return -1;
    }
    int64_t k_in = 0, k_cut = n_in;
    for (int32_t i = 0; i < nv; i++) {
        float z = (logits[i] - mx) * inv_t;
        if (!(z >= -ZCUT)) continue;
        int b = (int)(-z * scale);
        if (b >= NBUCKET) b = NBUCKET - 1;
        if (b < bcut) s->cand[k_in++] = (struct cand){i, logits[i]};
        else if (b == bcut) s->cand[k_cut++] = (struct cand){i, logits[i]};
    }
    /* Sort only the cut bucket and take its best tokens until the nucleus mass is reached. */
    qsort(s->cand + n_in, (size_t)(k_cut - n_in), sizeof *s->cand, cand_cmp);
    int64_t keep = n_in;
    double acc = before;
    while (keep < k_cut) {
        acc += (double)expf((s->cand[keep].logit - mx) * inv_t);
        keep++;
        if (acc >= need) break;
    }
    if (keep == 0) keep = 1;
    /* min-p: drop kept tokens below the threshold (the best token always stays). */
    if (p->min_p > 0.0f) {
        int64_t w = 0;
        for (int64_t i = 0; i < keep; i++)
            if ((s->cand[i].logit - mx) * inv_t >= zmin || s->cand[i].logit == mx)
                s->cand[w++] = s->cand[i];
        keep = w;
    }
    return draw(s, keep, mx, inv_t);
}

smelt_status sampler_sample(struct sampler *s, float *logits, struct sample_result *out,
                            struct err *e) {
    const struct sample_params *p = &s->p;
    int32_t nv = s->n_vocab;
    memset(out, 0, sizeof *out);
    out->token = -1;
    s->n_saved = 0;

    bool want_lp = p->n_logprobs >= 0;
    bool modifies = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                    p->frequency_penalty != 0.0f || p->n_bias > 0;
    float lse = 0.0f;
    int32_t raw_best = -1;
    if (want_lp) {
        struct cand top[SAMPLE_MAX_LOGPROBS + 1];
        int64_t n_top = 0;
        int64_t k = p->n_logprobs > 0 ? p->n_logprobs : 1; /* top-1 doubles as the argmax */
        lse = raw_pass(logits, nv, top, &n_top, k);
        if (lse == -INFINITY) return err_set(e, SMELT_ERR_INVALID, "sampler: every logit is -inf or NaN");
        qsort(top, (size_t)n_top, sizeof top[0], cand_cmp);
        raw_best = n_top > 0 ? top[0].token : -1;
        out->n_top = p->n_logprobs > 0 ? (int32_t)n_top : 0;
        for (int32_t i = 0; i < out->n_top; i++)
            out->top[i] = (struct sample_token_logprob){top[i].token, top[i].logit - lse};
    }
    if (modifies) apply_penalties(s, logits, want_lp);

    int32_t tok;
    if (p->temperature == 0.0f) {
        tok = (want_lp && !modifies) ? raw_best : engine_argmax(logits, nv);
        if (tok < 0) return err_set(e, SMELT_ERR_INVALID, "sampler: every token is banned or NaN");
    } else {
        smelt_status st = SMELT_OK;
        tok = (p->top_k > 0 && p->top_k < nv) ? sample_top_k(s, logits, &st)
                                              : sample_full(s, logits, &st);
        if (st) return err_set(e, st, "sampler: out of memory");
        if (tok < 0) return err_set(e, SMELT_ERR_INVALID, "sampler: every token is banned or NaN");
    }
    out->token = tok;
    if (want_lp) out->logprob = raw_logit(s, logits, tok) - lse;
    return SMELT_OK;
}

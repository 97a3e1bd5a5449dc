/* The per-sequence matcher (gram.h): the configuration set after the tokens taken so far,
 * the next token's mask, acceptance, and rollback.
 *
 * Mask: for each configuration, its state's precomputed masks (gram_mask.c) give the
 * accepted tokens; the state's uncertain tokens are then walked with the real stack, in
 * piece order, each walk resuming from the longest prefix it shares with the previous one
 * (xgrammar's prefix-sorted check). The last mask is kept with its configuration set: inside
 * a string the set repeats token after token, and the mask is a copy.
 *
 * History: a ring of the last max_rollback configuration sets. Stacks are shared nodes of one
 * pool; when the pool grows past twice what was live at the last collection, the nodes that
 * no kept set reaches are dropped and the ids compacted (parents keep smaller ids).
 */
#include <string.h>

#include "grammar/gram_int.h"

#define GC_MIN (1u << 15)

struct snap {
    struct gcfg *v;
    uint32_t n;
    size_t cap;
    bool done, ended;
};

struct gram_matcher {
    struct gram *g;
    const struct gauto *a;
    const struct gram_vocab *v;
    struct gstk stk;
    struct gsim sim;
    struct gcfg *cur;
    uint32_t n_cur;
    size_t cap_cur;
    bool done;  /* the root rule can end here */
    bool ended; /* an end-of-generation token was taken */
    struct snap *ring;
    uint32_t ring_cap, ring_head, ring_len;
    uint32_t *memo; /* the last mask and the set it was made for */
    struct gcfg *memo_cfg;
    uint32_t memo_n;
    size_t memo_cap;
    bool memo_ok, memo_done;
    uint32_t *stamp; /* per DFA state: the fill that applied its masks */
    uint32_t stamp_gen;
    uint32_t gc_next;
};

static bool set_cur(struct gram_matcher *m, const struct gcfg *c, uint32_t n) {
    if (!gram_grow(&m->cur, &m->cap_cur, n ? n : 1, sizeof *m->cur, GRAM_MAX_CFGS + 1))
        return false;
    if (n) memcpy(m->cur, c, n * sizeof *c);
    m->n_cur = n;
    return true;
}

static smelt_status start(struct gram_matcher *m, struct err *e) {
    gram_stk_clear(&m->stk);
    m->ring_head = m->ring_len = 0;
    m->memo_ok = false;
    m->ended = false;
    m->gc_next = GC_MIN;
    if (!gram_sim_start_closed(&m->sim, m->a->rules[m->a->root].start, 0) ||
        !set_cur(m, m->sim.cfg, gram_sim_count(&m->sim)))
        return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    m->done = m->sim.lf[0] & LV_DONE;
    return SMELT_OK;
}

smelt_status gram_matcher_new(struct gram_matcher **out, struct gram *g, int32_t max_rollback,
                              struct err *e) {
    *out = NULL;
    if (max_rollback < 0 || max_rollback > 4096)
        return err_set(e, SMELT_ERR_INVALID, "grammar matcher: max_rollback %d (0..4096)",
                       max_rollback);
    struct gram_matcher *m = calloc(1, sizeof *m);
    if (!m) return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = gram_ref(g);
    m->a = &g->a;
    m->v = g->v;
    gram_stk_init(&m->stk);
    gram_sim_init(&m->sim, m->a, &m->stk, false);
    m->ring_cap = (uint32_t)max_rollback;
    m->ring = calloc(m->ring_cap + 1, sizeof *m->ring);
    m->memo = malloc(m->v->words * sizeof *m->memo);
    m->stamp = calloc(m->a->n_st, sizeof *m->stamp);
    smelt_status st = SMELT_OK;
    if (!m->ring || !m->memo || !m->stamp)
        st = err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    else
        st = start(m, e);
    if (st != SMELT_OK) {
        gram_matcher_free(m);
        return st;
    }
    *out = m;
    return SMELT_OK;
}

void gram_matcher_free(struct gram_matcher *m) {
    if (!m) return;
    gram_sim_free(&m->sim);
    gram_stk_free(&m->stk);
    free(m->cur);
    if (m->ring)
        for (uint32_t k = 0; k <= m->ring_cap; k++)
            free(m->ring[k].v);
    free(m->ring);
    free(m->memo);
    free(m->memo_cfg);
    free(m->stamp);
    gram_unref(m->g);
    free(m);
}

void gram_matcher_reset(struct gram_matcher *m) {
    struct err e;
    if (start(m, &e) != SMELT_OK) m->n_cur = 0, m->done = false; /* nothing allowed */
}

bool gram_matcher_can_end(const struct gram_matcher *m) {
    return !m->ended && m->done;
}

bool gram_matcher_ended(const struct gram_matcher *m) {
    return m->ended || (m->done && m->n_cur == 0);
}

int32_t gram_matcher_history(const struct gram_matcher *m) {
    return (int32_t)m->ring_len;
}

/* ---- stack collection ---------------------------------------------------------------------- */

static void mark(const struct gstk *p, uint8_t *live, const struct gcfg *c, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t x = c[i].stk; x && !live[x]; x = p->v[x].parent)
            live[x] = 1;
}

static void remap(const uint32_t *map, struct gcfg *c, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        c[i].stk = map[c[i].stk];
}

static void collect(struct gram_matcher *m) {
    struct gstk *p = &m->stk;
    uint8_t *live = calloc(p->n, 1);
    uint32_t *map = malloc((size_t)p->n * sizeof *map);
    if (!live || !map) goto done;
    mark(p, live, m->cur, m->n_cur);
    for (uint32_t k = 0; k < m->ring_len; k++) {
        const struct snap *s = &m->ring[(m->ring_head + k) % m->ring_cap];
        mark(p, live, s->v, s->n);
    }
    m->memo_ok = false;
    uint32_t w = 1;
    map[0] = 0;
    for (uint32_t x = 1; x < p->n; x++) {
        if (!live[x]) continue;
        map[x] = w;
        p->v[w] = (struct gstk_node){p->v[x].ret, map[p->v[x].parent], p->v[x].depth};
        w++;
    }
    p->n = w;
    gram_stk_rehash(p);
    remap(map, m->cur, m->n_cur);
    for (uint32_t k = 0; k < m->ring_len; k++) {
        struct snap *s = &m->ring[(m->ring_head + k) % m->ring_cap];
        remap(map, s->v, s->n);
    }
    m->gc_next = 2 * w > GC_MIN ? 2 * w : GC_MIN;
done:
    free(live);
    free(map);
}

/* ---- history ------------------------------------------------------------------------------- */

static bool push_history(struct gram_matcher *m) {
    if (!m->ring_cap) return true;
    uint32_t slot;
    if (m->ring_len < m->ring_cap) {
        slot = (m->ring_head + m->ring_len++) % m->ring_cap;
    } else {
        slot = m->ring_head;
        m->ring_head = (m->ring_head + 1) % m->ring_cap;
    }
    struct snap *s = &m->ring[slot];
    if (!gram_grow(&s->v, &s->cap, m->n_cur ? m->n_cur : 1, sizeof *s->v, GRAM_MAX_CFGS + 1))
        return false;
    if (m->n_cur) memcpy(s->v, m->cur, m->n_cur * sizeof *m->cur);
    s->n = m->n_cur;
    s->done = m->done;
    s->ended = m->ended;
    return true;
}

smelt_status gram_matcher_rollback(struct gram_matcher *m, int32_t k, struct err *e) {
    if (k < 0 || (uint32_t)k > m->ring_len)
        return err_set(e, SMELT_ERR_RANGE, "grammar matcher: rollback of %d steps (%u kept)", k,
                       m->ring_len);
    if (k == 0) return SMELT_OK;
    const struct snap *s = &m->ring[(m->ring_head + m->ring_len - (uint32_t)k) % m->ring_cap];
    if (!set_cur(m, s->v, s->n))
        return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    m->done = s->done;
    m->ended = s->ended;
    m->ring_len -= (uint32_t)k;
    return SMELT_OK;
}

/* ---- accepting ----------------------------------------------------------------------------- */

/* Advances by p[0..n). SMELT_ERR_INVALID when refused (nothing changed). */
static smelt_status advance(struct gram_matcher *m, const uint8_t *p, size_t n, struct err *e) {
    struct gsim *s = &m->sim;
    if (!gram_sim_start(s, m->cur, m->n_cur, m->done ? LV_DONE : 0) ||
        !gram_sim_reserve(s, (uint32_t)n + 1))
        return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!gram_sim_step_any(s, p[i])) {
            if (s->oom) return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
            if (s->lf[s->depth] & LV_OVER)
                return err_set(e, SMELT_ERR_RANGE,
                               "grammar matcher: past a bound (%u "
                               "configurations, stack depth %u)",
                               GRAM_MAX_CFGS, GRAM_MAX_DEPTH);
            return err_set(e, SMELT_ERR_INVALID, "grammar: byte %zu of %zu refused", i, n);
        }
    }
    if (!push_history(m)) return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    if (!set_cur(m, s->cfg + s->lv[s->depth], gram_sim_count(s)))
        return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    m->done = s->lf[s->depth] & LV_DONE;
    if (m->stk.n > m->gc_next) collect(m);
    return SMELT_OK;
}

smelt_status gram_matcher_accept(struct gram_matcher *m, int32_t token, struct err *e) {
    if (token < 0 || token >= m->v->n)
        return err_set(e, SMELT_ERR_RANGE, "grammar matcher: token %d out of range (%d)", token,
                       m->v->n);
    if (m->ended)
        return err_set(e, SMELT_ERR_INVALID, "grammar: token %d after the end of generation",
                       token);
    switch (m->v->kind[token]) {
    case GV_EOG:
        if (!m->done)
            return err_set(e, SMELT_ERR_INVALID,
                           "grammar: end of generation (token %d) before "
                           "the grammar is complete",
                           token);
        if (!push_history(m)) return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
        m->ended = true;
        return SMELT_OK;
    case GV_TEXT:
        return advance(m, m->v->bytes + m->v->off[token], m->v->len[token], e);
    default:
        return err_set(e, SMELT_ERR_INVALID,
                       "grammar: token %d is never allowed (control, "
                       "unused or empty)",
                       token);
    }
}

int32_t gram_matcher_accept_tokens(struct gram_matcher *m, const int32_t *tokens, int32_t n,
                                   struct err *e) {
    for (int32_t i = 0; i < n; i++) {
        smelt_status st = gram_matcher_accept(m, tokens[i], e);
        if (st == SMELT_ERR_INVALID) return i;
        if (st != SMELT_OK) return -1;
    }
    return n;
}

smelt_status gram_matcher_accept_bytes(struct gram_matcher *m, const char *s, size_t n,
                                       struct err *e) {
    if (m->ended) return err_set(e, SMELT_ERR_INVALID, "grammar: text after the end of generation");
    return advance(m, (const uint8_t *)s, n, e);
}

/* ---- masks ---------------------------------------------------------------------------------- */

static bool bit_get(const uint32_t *mask, int32_t t) {
    return (mask[(uint32_t)t >> 5] >> (t & 31)) & 1;
}
static void bit_set(uint32_t *mask, int32_t t) {
    mask[(uint32_t)t >> 5] |= 1u << (t & 31);
}

/* Walks c's uncertain tokens (sorted by piece) with the real stack; sets those accepted. */
static bool check_uncertain(struct gram_matcher *m, struct gcfg c, const struct gci *ci,
                            uint32_t *mask) {
    struct gsim *s = &m->sim;
    const struct gram_vocab *v = m->v;
    if (!gram_sim_start(s, &c, 1, 0)) return false;
    const uint8_t *prev = NULL; /* the bytes the levels were built for */
    if (!gram_sim_reserve(s, v->max_len + 1)) return false;
    for (uint32_t j = 0; j < ci->n_unc; j++) {
        int32_t t = ci->unc[j];
        if (bit_get(mask, t)) continue;
        const uint8_t *p = v->bytes + v->off[t];
        uint32_t n = v->len[t], l = 0, d = s->depth;
        while (l < d && l < n && p[l] == prev[l])
            l++;
        gram_sim_pop_to(s, l);
        bool alive = l == 0 || s->lv[l + 1] > s->lv[l] || (s->lf[l] & LV_DONE);
        for (uint32_t i = l; i < n && alive; i++)
            alive = gram_sim_step_any(s, p[i]);
        if (s->oom) return false;
        prev = p;
        if (alive && s->depth == n && (gram_sim_count(s) || (s->lf[n] & LV_DONE))) bit_set(mask, t);
    }
    return true;
}

smelt_status gram_matcher_fill_mask(struct gram_matcher *m, uint32_t *mask, struct err *e) {
    const struct gram_vocab *v = m->v;
    size_t bytes = v->words * sizeof *mask;
    if (m->ended) {
        memset(mask, 0, bytes);
        return SMELT_OK;
    }
    if (m->memo_ok && m->memo_n == m->n_cur && m->memo_done == m->done &&
        memcmp(m->memo_cfg, m->cur, m->n_cur * sizeof *m->cur) == 0) {
        memcpy(mask, m->memo, bytes);
        return SMELT_OK;
    }
    memset(mask, 0, bytes);
    if (++m->stamp_gen == 0) {
        memset(m->stamp, 0, m->a->n_st * sizeof *m->stamp);
        m->stamp_gen = 1;
    }
    for (uint32_t i = 0; i < m->n_cur; i++) {
        struct gcfg c = m->cur[i];
        struct gci *tmp = NULL;
        const struct gci *ci = gram_mask_get(m->g, c.st, &tmp);
        if (!ci) return err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory computing a mask");
        if (m->stamp[c.st] != m->stamp_gen) {
            m->stamp[c.st] = m->stamp_gen;
            const uint32_t *base = ci->base == CI_BASE_BITS    ? ci->bits
                                   : ci->base == CI_BASE_SLICE ? v->cum + (size_t)ci->k * v->words
                                                               : NULL;
            if (base)
                for (uint32_t w = 0; w < v->words; w++)
                    mask[w] |= base[w];
            for (uint32_t k = 0; k < ci->n_acc; k++)
                bit_set(mask, ci->acc[k]);
        }
        bool ok = !ci->n_unc || check_uncertain(m, c, ci, mask);
        gram_ci_free(tmp);
        if (!ok) return err_set(e, SMELT_ERR_NOMEM, "grammar matcher: out of memory");
    }
    if (m->done)
        for (int32_t k = 0; k < v->n_eog; k++)
            bit_set(mask, v->eog[k]);
    if (gram_grow(&m->memo_cfg, &m->memo_cap, m->n_cur ? m->n_cur : 1, sizeof *m->memo_cfg,
                  GRAM_MAX_CFGS + 1)) {
        memcpy(m->memo, mask, bytes);
        if (m->n_cur) memcpy(m->memo_cfg, m->cur, m->n_cur * sizeof *m->cur);
        m->memo_n = m->n_cur;
        m->memo_done = m->done;
        m->memo_ok = true;
    }
    return SMELT_OK;
}

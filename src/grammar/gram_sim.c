/* Configuration sets of the grammar's pushdown automaton, one level per byte.
 *
 * A configuration is (DFA state, stack); the stack is a hash-consed list of return states,
 * so equal stacks are equal ids and a set of configurations is deduplicated by pairs. A
 * level holds only configurations resting on states with byte edges: after each byte the
 * closure follows calls (push the return state, enter the rule) and rule ends (pop, or at
 * the bottom: LV_DONE when the stack is real, LV_POPPED when it is unknown, as in the
 * per-state walks of gram_mask.c). Left recursion is refused at compile time, so a closure
 * takes finitely many pushes; GRAM_MAX_CFGS and GRAM_MAX_DEPTH bound it anyway (LV_OVER).
 *
 * The common step (one configuration, its target has no call and cannot end) takes the fast
 * path: no hashing, no closure.
 */
#include <string.h>

#include "grammar/gram_int.h"
#include "util/mix.h"

#define STK_MAX (1u << 24) /* nodes of one pool */

void gram_stk_init(struct gstk *p) {
    memset(p, 0, sizeof *p);
}

void gram_stk_free(struct gstk *p) {
    free(p->v);
    free(p->ht);
    memset(p, 0, sizeof *p);
}

void gram_stk_clear(struct gstk *p) {
    if (p->n > 1) p->n = 1;
    if (p->ht) memset(p->ht, 0, p->ht_cap * sizeof *p->ht);
}

static uint32_t stk_hash(uint32_t ret, uint32_t parent) {
    return (uint32_t)mix64((uint64_t)ret << 32 | parent);
}

static void stk_insert(struct gstk *p, uint32_t id) {
    uint32_t j = stk_hash(p->v[id].ret, p->v[id].parent) & (p->ht_cap - 1);
    while (p->ht[j])
        j = (j + 1) & (p->ht_cap - 1);
    p->ht[j] = id;
}

bool gram_stk_rehash(struct gstk *p) {
    uint32_t want = 64;
    while (want < 4 * (p->n + 1))
        want *= 2;
    if (want != p->ht_cap) {
        uint32_t *h = calloc(want, sizeof *h);
        if (!h) return p->oom = true, false;
        free(p->ht);
        p->ht = h;
        p->ht_cap = want;
    } else {
        memset(p->ht, 0, p->ht_cap * sizeof *p->ht);
    }
    for (uint32_t i = 1; i < p->n; i++)
        stk_insert(p, i);
    return true;
}

uint32_t gram_stk_push(struct gstk *p, uint32_t ret, uint32_t parent) {
    if (p->n == 0) {
        if (!gram_grow(&p->v, &p->cap, 16, sizeof *p->v, STK_MAX)) return p->oom = true, GRAM_NONE;
        p->v[0] = (struct gstk_node){0, 0, 0};
        p->n = 1;
    }
    uint32_t depth = p->v[parent].depth + 1;
    if (depth > GRAM_MAX_DEPTH) return GRAM_NONE;
    if (2 * (p->n + 1) > p->ht_cap && !gram_stk_rehash(p)) return GRAM_NONE;
    uint32_t j = stk_hash(ret, parent) & (p->ht_cap - 1);
    for (uint32_t id; (id = p->ht[j]) != 0; j = (j + 1) & (p->ht_cap - 1))
        if (p->v[id].ret == ret && p->v[id].parent == parent) return id;
    if (!gram_grow(&p->v, &p->cap, (size_t)p->n + 1, sizeof *p->v, STK_MAX))
        return p->oom = true, GRAM_NONE;
    uint32_t id = p->n++;
    p->v[id] = (struct gstk_node){ret, parent, depth};
    p->ht[j] = id;
    return id;
}

/* ---- simulation --------------------------------------------------------------------------- */

void gram_sim_init(struct gsim *s, const struct gauto *a, struct gstk *stk, bool local) {
    memset(s, 0, sizeof *s);
    s->a = a;
    s->stk = stk;
    s->local = local;
}

void gram_sim_free(struct gsim *s) {
    free(s->cfg);
    free(s->lv);
    free(s->lf);
    free(s->work);
    free(s->seen_key);
    free(s->seen_gen);
    memset(s, 0, sizeof *s);
}

static bool ensure_levels(struct gsim *s, uint32_t d) {
    if (d + 3 <= s->cap_lv) return true;
    uint32_t c = s->cap_lv ? s->cap_lv : 64;
    while (c < d + 3)
        c *= 2;
    uint32_t *lv = realloc(s->lv, c * sizeof *lv);
    if (!lv) return s->oom = true, false;
    s->lv = lv;
    uint8_t *lf = realloc(s->lf, c);
    if (!lf) return s->oom = true, false;
    s->lf = lf;
    s->cap_lv = c;
    return true;
}

bool gram_sim_reserve(struct gsim *s, uint32_t d) {
    return ensure_levels(s, d);
}

static void new_generation(struct gsim *s) {
    s->seen_n = 0;
    if (++s->gen == 0) {
        if (s->seen_gen) memset(s->seen_gen, 0, s->seen_cap * sizeof *s->seen_gen);
        s->gen = 1;
    }
}

/* Adds (st, stk) to the level's seen set; false when it was there (or out of memory). */
static bool seen_insert(struct gsim *s, uint32_t st, uint32_t stk) {
    if (2 * (s->seen_n + 1) > s->seen_cap) {
        uint32_t nc = s->seen_cap ? s->seen_cap * 2 : 64;
        uint64_t *nk = malloc(nc * sizeof *nk);
        uint32_t *ng = calloc(nc, sizeof *ng);
        if (!nk || !ng) {
            free(nk);
            free(ng);
            s->oom = true;
            return false;
        }
        for (uint32_t k = 0; k < s->seen_cap; k++) {
            if (s->seen_gen[k] != s->gen) continue;
            uint32_t j = (uint32_t)mix64(s->seen_key[k]) & (nc - 1);
            while (ng[j] == s->gen)
                j = (j + 1) & (nc - 1);
            nk[j] = s->seen_key[k];
            ng[j] = s->gen;
        }
        free(s->seen_key);
        free(s->seen_gen);
        s->seen_key = nk;
        s->seen_gen = ng;
        s->seen_cap = nc;
    }
    uint64_t key = (uint64_t)st << 32 | stk;
    uint32_t j = (uint32_t)mix64(key) & (s->seen_cap - 1);
    while (s->seen_gen[j] == s->gen) {
        if (s->seen_key[j] == key) return false;
        j = (j + 1) & (s->seen_cap - 1);
    }
    s->seen_key[j] = key;
    s->seen_gen[j] = s->gen;
    s->seen_n++;
    return true;
}

static bool push_work(struct gsim *s, uint32_t *nw, uint32_t st, uint32_t stk) {
    if (!gram_grow(&s->work, &s->cap_work, (size_t)*nw + 1, sizeof *s->work, 1u << 24))
        return s->oom = true, false;
    s->work[(*nw)++] = (struct gcfg){st, stk};
    return true;
}

/* Adds the closure of (st, stk) to the level being built (which starts at cfg[start]). */
static void closure_add(struct gsim *s, uint32_t st, uint32_t stk, uint32_t start, uint8_t *flags) {
    const struct gauto *a = s->a;
    uint32_t nw = 0;
    if (!push_work(s, &nw, st, stk)) return;
    while (nw) {
        struct gcfg c = s->work[--nw];
        if (!seen_insert(s, c.st, c.stk)) continue;
        const struct gstate *g = &a->st[c.st];
        if (g->flags & GS_BYTES) {
            if (s->n_cfg - start >= GRAM_MAX_CFGS) {
                *flags |= LV_OVER;
            } else if (!gram_grow(&s->cfg, &s->cap_cfg, (size_t)s->n_cfg + 1, sizeof *s->cfg,
                                  1u << 26)) {
                s->oom = true;
                return;
            } else {
                s->cfg[s->n_cfg++] = c;
            }
        }
        for (uint32_t k = 0; k < g->n_calls; k++) {
            const struct gcall *call = &a->calls[g->calls + k];
            uint32_t ns = gram_stk_push(s->stk, call->ret, c.stk);
            if (ns == GRAM_NONE) {
                if (s->stk->oom) return (void)(s->oom = true);
                *flags |= LV_OVER;
                continue;
            }
            if (!push_work(s, &nw, a->rules[call->rule].start, ns)) return;
        }
        if (g->flags & GS_FINAL) {
            if (c.stk == 0) {
                *flags |= s->local ? LV_POPPED : LV_DONE;
            } else {
                const struct gstk_node *nd = &s->stk->v[c.stk];
                if (!push_work(s, &nw, nd->ret, nd->parent)) return;
            }
        }
    }
}

bool gram_sim_start(struct gsim *s, const struct gcfg *cfg, uint32_t n, uint8_t flags) {
    if (!ensure_levels(s, 0)) return false;
    if (!gram_grow(&s->cfg, &s->cap_cfg, n ? n : 1, sizeof *s->cfg, 1u << 26))
        return s->oom = true, false;
    if (n) memcpy(s->cfg, cfg, n * sizeof *cfg);
    s->depth = 0;
    s->lv[0] = 0;
    s->lv[1] = s->n_cfg = n;
    s->lf[0] = flags;
    return true;
}

bool gram_sim_start_closed(struct gsim *s, uint32_t st, uint32_t stk) {
    if (!ensure_levels(s, 0)) return false;
    s->depth = 0;
    s->n_cfg = 0;
    s->lv[0] = 0;
    uint8_t flags = 0;
    new_generation(s);
    closure_add(s, st, stk, 0, &flags);
    s->lv[1] = s->n_cfg;
    s->lf[0] = flags;
    return !s->oom;
}

bool gram_sim_step(struct gsim *s, uint8_t b) {
    uint32_t d = s->depth;
    if (!ensure_levels(s, d + 1)) return false;
    uint32_t lo = s->lv[d], hi = s->lv[d + 1];
    uint8_t pf = s->lf[d], flags = 0;
    if (s->local && ((pf & LV_OUT) || ((pf & LV_POPPED) && gram_bit(s->follow, b))))
        flags |= LV_OUT;
    s->n_cfg = hi;
    if (hi - lo == 1) {
        struct gcfg c = s->cfg[lo];
        uint32_t t = gram_delta(s->a, c.st, b);
        if (!t) goto done;
        if (s->a->st[t].flags & GS_SIMPLE) {
            if (!gram_grow(&s->cfg, &s->cap_cfg, (size_t)hi + 1, sizeof *s->cfg, 1u << 26)) {
                s->oom = true;
                goto done;
            }
            s->cfg[s->n_cfg++] = (struct gcfg){t, c.stk};
            goto done;
        }
    }
    new_generation(s);
    for (uint32_t i = lo; i < hi && !s->oom; i++) {
        struct gcfg c = s->cfg[i];
        uint32_t t = gram_delta(s->a, c.st, b);
        if (t) closure_add(s, t, c.stk, hi, &flags);
    }
done:
    /* a walk's local simulation that dropped a configuration cannot decide: the run-time
     * check with the real stack will */
    if (s->local && (flags & LV_OVER)) flags |= LV_OUT;
    s->depth = d + 1;
    s->lv[d + 2] = s->n_cfg;
    s->lf[d + 1] = flags;
    return s->n_cfg > hi || (flags & ~LV_OVER);
}

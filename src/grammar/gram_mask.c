/* Per-state token masks (xgrammar's adaptive token mask, computed by llguidance's trie walk).
 *
 * For a DFA state s, walk the token trie from the single configuration (s, unknown stack):
 * a token is accepted when some path takes all its bytes without leaving s's rule below
 * where it started (or leaves it exactly at its last byte); uncertain when a path left the
 * rule with bytes to go and those bytes start with one that may follow the rule somewhere
 * (LV_OUT); refused otherwise. Refused subtrees are skipped whole. Accepted and refused
 * tokens hold whatever the stack is; uncertain ones are checked at run time (gram_match.c).
 *
 * The slice (gram_vocab.c): when every character of the JSON-string slice leads s to one
 * state, and so on (a chain, or a loop), the slice's tokens need no walk: with a loop all of
 * them are accepted, with a chain of k closed states exactly those of at most k characters,
 * and with a closed state that refuses every slice character none. Only the trie of the
 * other tokens is walked then. Dynamic slices do the same for a set of ASCII bytes (the most
 * common target of a state's ASCII bytes), made on first use and kept in the vocabulary.
 *
 * The walk (walk_range) keeps one DFA state per depth while the path's states are simple;
 * trie nodes with many children are entered through their child tables when the state takes
 * few bytes. Masks are computed lazily under the grammar's lock, and published with release stores
 * so that readers need no lock; gram_mask_warm fills the reachable states at compile time
 * within a budget. docs/structured-output.md has the measurements.
 */
#include <string.h>

#include "grammar/gram_int.h"

#define SL_UNK (UINT32_MAX - 2)
#define SL_VISITING (UINT32_MAX - 3)
#define ACC_BITS_MIN 4096 /* accepted tokens past which a state stores a bitset */

/* ---- slice facts --------------------------------------------------------------------------- */

/* UTF-8 continuation states after a lead byte: the range of the next byte and what follows. */
enum { U_DONE = 0, U_A1, U_A2, U_A3, U_E0, U_ED, U_F0, U_F4, U_N };
static const uint8_t u_lo[U_N] = {0, 0x80, 0x80, 0x80, 0xA0, 0x80, 0x90, 0x80};
static const uint8_t u_hi[U_N] = {0, 0xBF, 0xBF, 0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
static const uint8_t u_next[U_N] = {0, U_DONE, U_A1, U_A2, U_A1, U_A1, U_A2, U_A2};

static uint8_t lead_state(unsigned b) {
    if (b >= 0xC2 && b <= 0xDF) return U_A1;
    if (b == 0xE0) return U_E0;
    if (b == 0xED) return U_ED;
    if (b >= 0xE1 && b <= 0xEF) return U_A2;
    if (b == 0xF0) return U_F0;
    if (b >= 0xF1 && b <= 0xF3) return U_A3;
    if (b == 0xF4) return U_F4;
    return U_N;
}

struct nc {
    uint32_t t;  /* the common target so far, GRAM_NONE: none yet */
    bool fail;   /* some character is refused */
    bool mixed;  /* characters lead to different states, or some refused and some not */
    bool closed; /* every state inside a multi-byte character is closed */
};

static void nc_merge(struct nc *r, uint32_t t) {
    if (!t) {
        r->fail = true;
        if (r->t != GRAM_NONE && r->t != 0) r->mixed = true;
        r->t = 0;
        return;
    }
    if (r->t == GRAM_NONE)
        r->t = t;
    else if (r->t != t)
        r->mixed = true;
}

/* Continues the characters of the slice from q in UTF-8 state u (a depth-first walk over
 * byte classes; a character has at most 3 bytes after its lead). */
static void nc_walk(const struct gauto *a, uint32_t q, uint8_t u, struct nc *r) {
    if (r->mixed) return;
    if (u == U_DONE) {
        nc_merge(r, q);
        return;
    }
    if (!(a->st[q].flags & GS_CLOSED)) r->closed = false;
    const struct grule *g = &a->rules[a->st[q].rule];
    uint64_t done[4] = {0};
    for (unsigned b = u_lo[u]; b <= u_hi[u] && !r->mixed; b++) {
        unsigned c = g->cmap[b];
        if (gram_bit(done, c)) continue;
        gram_bit_set(done, c);
        uint32_t t = gram_delta(a, q, (uint8_t)b);
        if (!t)
            nc_merge(r, 0);
        else
            nc_walk(a, t, u_next[u], r);
    }
}

/* Where every slice character leads s: a state, 0 when all are refused, GRAM_NONE when mixed.
 * *closed: s and the states inside multi-byte characters are closed (no call, cannot end). */
static uint32_t next_char_state(const struct gauto *a, uint32_t s, bool *closed) {
    struct nc r = {GRAM_NONE, false, false, true};
    const struct grule *g = &a->rules[a->st[s].rule];
    uint64_t done[32] = {0}; /* (class, continuation shape) pairs seen */
    for (unsigned b = 0x20; b < 0x80 && !r.mixed; b++) {
        if (b == '"' || b == '\\') continue;
        nc_merge(&r, gram_delta(a, s, (uint8_t)b));
    }
    for (unsigned b = 0xC2; b <= 0xF4 && !r.mixed; b++) {
        uint8_t u = lead_state(b);
        /* leads of one class and one continuation shape behave alike */
        unsigned key = g->cmap[b] * 8u + u;
        if (gram_bit(done, key)) continue;
        gram_bit_set(done, key);
        uint32_t t = gram_delta(a, s, (uint8_t)b);
        if (!t)
            nc_merge(&r, 0);
        else
            nc_walk(a, t, u, &r);
    }
    *closed = r.closed && (a->st[s].flags & GS_CLOSED);
    if (r.mixed) return GRAM_NONE;
    return r.fail ? 0 : r.t;
}

/* The slice depth of s (SL_NO, SL_INF or k), following the chain of states the slice's
 * characters lead to, memoized in g->sl (SL_VISITING marks the chain being followed). */
static uint32_t slice_depth(struct gram *g, uint32_t s) {
    if (g->sl[s] != SL_UNK) return g->sl[s];
    const struct gauto *a = &g->a;
    uint32_t *path = NULL, np = 0, res, x = s;
    size_t cap = 0, capp = 0;
    uint8_t *pure = NULL;
    while (true) {
        if (g->sl[x] == SL_VISITING) { /* a loop: any number of characters */
            res = SL_INF;
            break;
        }
        if (g->sl[x] != SL_UNK) {
            res = g->sl[x];
            break;
        }
        bool closed;
        uint32_t t = next_char_state(a, x, &closed);
        if (t == GRAM_NONE || t == 0) {
            res = g->sl[x] = t == 0 && closed ? 0 : SL_NO;
            break;
        }
        if (!gram_grow(&path, &cap, (size_t)np + 1, sizeof *path, GRAM_MAX_DFA) ||
            !gram_grow(&pure, &capp, (size_t)np + 1, 1, GRAM_MAX_DFA)) {
            res = SL_NO; /* out of memory: no slice; the walk alone is still right */
            break;
        }
        path[np] = x;
        pure[np++] = closed;
        g->sl[x] = SL_VISITING;
        x = t;
    }
    /* back along the chain: one more character per closed step; a chain deeper than any
     * token takes them all */
    while (np) {
        uint32_t y = path[--np];
        if (res != SL_NO && res != SL_INF)
            res = !pure[np] ? SL_NO : res + 1 > 255 ? SL_INF : res + 1;
        g->sl[y] = res;
    }
    free(path);
    free(pure);
    return g->sl[s];
}

smelt_status gram_mask_slices(struct gram *g, struct err *e) {
    g->sl = malloc((size_t)g->a.n_st * sizeof *g->sl);
    g->dsl = malloc((size_t)g->a.n_st * sizeof *g->dsl);
    g->dsl_k = malloc((size_t)g->a.n_st * sizeof *g->dsl_k);
    g->bytes = calloc(g->a.n_st, sizeof *g->bytes);
    g->nbytes = calloc(g->a.n_st, sizeof *g->nbytes);
    if (!g->sl || !g->dsl || !g->dsl_k || !g->bytes || !g->nbytes)
        return err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
    for (uint32_t s = 0; s < g->a.n_st; s++) {
        g->sl[s] = g->dsl[s] = SL_UNK;
        if (s == 0) continue;
        const struct gstate *st = &g->a.st[s];
        const uint32_t *row = g->a.trans + st->trans;
        const uint8_t *cmap = g->a.rules[st->rule].cmap;
        for (unsigned b = 0; b < 256; b++)
            if (row[cmap[b]]) gram_bit_set(g->bytes[s], b), g->nbytes[s]++;
    }
    return SMELT_OK;
}

/* ---- dynamic slices (ASCII classes) -------------------------------------------------------- */

#define DS_MIN_BYTES 8 /* a class smaller than this is not worth a slice */

static bool in_cls(const uint64_t *cls, unsigned b) {
    return b < 128 && gram_bit(cls, b);
}

/* Where every byte of class A leads s: a state, 0 when all are refused, GRAM_NONE when mixed. */
static uint32_t next_class_state(const struct gauto *a, uint32_t s, const uint64_t *cls) {
    uint32_t t = GRAM_NONE;
    bool fail = false;
    for (unsigned b = 0; b < 128; b++) {
        if (!gram_bit(cls, b)) continue;
        uint32_t x = gram_delta(a, s, (uint8_t)b);
        if (!x)
            fail = true;
        else if (t == GRAM_NONE)
            t = x;
        else if (t != x)
            return GRAM_NONE;
        if (fail && t != GRAM_NONE) return GRAM_NONE;
    }
    return fail ? 0 : t;
}

/* How many bytes of class A every path from s takes (SL_INF: any number, SL_NO: not a pure
 * chain). Chains are short in practice; this one is bounded by GRAM_MAX_DFA steps. */
/* How many bytes of class A every path from s takes (SL_INF: any number, SL_NO: not a pure
 * chain), recorded for every state on the chain as a use of slice d (any class with a pure chain
 * is a right slice for a state, so a chain is searched once). */
static uint32_t class_depth(struct gram *g, uint32_t s, const uint64_t *cls, uint32_t d) {
    const struct gauto *a = &g->a;
    uint8_t *onpath = g->ds_onpath;
    uint32_t *path = g->ds_path, np = 0, x = s, res;
    while (true) {
        if (onpath[x]) {
            res = SL_INF;
            break;
        }
        if (g->dsl[x] == d) { /* a chain met before */
            res = g->dsl_k[x];
            break;
        }
        uint32_t t = next_class_state(a, x, cls);
        bool closed = a->st[x].flags & GS_CLOSED;
        if (t == GRAM_NONE) {
            res = SL_NO;
            break;
        }
        if (t == 0) {
            res = closed ? 0 : SL_NO;
            break;
        }
        onpath[x] = 1;
        path[np++] = x;
        x = t;
    }
    for (uint32_t k = 0; k < np; k++)
        onpath[path[k]] = 0;
    for (uint32_t k = np; k-- > 0;) {
        uint32_t y = path[k];
        if (res != SL_INF && res != SL_NO)
            res = !(a->st[y].flags & GS_CLOSED) ? SL_NO : res + 1 > 255 ? SL_INF : res + 1;
        if (res != SL_NO && g->dsl[y] == SL_UNK) g->dsl[y] = d, g->dsl_k[y] = res;
    }
    return res;
}

/* Builds the slice of class A into d. */
static bool dslice_build(const struct gram_vocab *v, const uint64_t *cls, struct gdslice *d) {
    const struct gtrie *t = &v->all;
    *d = (struct gdslice){{cls[0], cls[1]}, 0, NULL, NULL};
    uint32_t *psum = malloc(((size_t)t->nn + 1) * sizeof *psum);
    uint8_t *bad = malloc((size_t)v->max_len + 2);
    d->mixed = calloc(((size_t)t->nn + 63) / 64, sizeof *d->mixed);
    if (!psum || !bad || !d->mixed) goto oom;
    /* psum[i]: tokens before node i (DFS order) whose path leaves the class */
    psum[0] = psum[1] = 0;
    bad[0] = 0;
    for (uint32_t i = 1; i < t->nn; i++) {
        const struct gtnode *n = &t->n[i];
        bad[n->depth] = bad[n->depth - 1] || !in_cls(cls, n->byte);
        psum[i + 1] = psum[i] + (n->tok >= 0 && bad[n->depth]);
        if (n->tok >= 0 && !bad[n->depth] && n->depth > d->maxlen) d->maxlen = n->depth;
    }
    for (uint32_t i = 1; i < t->nn; i++)
        if (psum[t->n[i].next] != psum[i]) d->mixed[i >> 6] |= 1ull << (i & 63);
    d->cum = calloc(((size_t)d->maxlen + 1) * v->words, sizeof *d->cum);
    if (!d->cum) goto oom;
    for (uint32_t i = 1; i < t->nn; i++) {
        const struct gtnode *n = &t->n[i];
        bad[n->depth] = bad[n->depth - 1] || !in_cls(cls, n->byte);
        if (bad[n->depth]) continue;
        for (int32_t tok = n->tok; tok >= 0; tok = v->dup[tok])
            d->cum[(size_t)n->depth * v->words + ((uint32_t)tok >> 5)] |= 1u << (tok & 31);
    }
    for (uint32_t k = 1; k <= d->maxlen; k++)
        for (uint32_t w = 0; w < v->words; w++)
            d->cum[(size_t)k * v->words + w] |= d->cum[(size_t)(k - 1) * v->words + w];
    free(psum);
    free(bad);
    return true;
oom:
    free(psum);
    free(bad);
    free(d->mixed);
    free(d->cum);
    return false;
}

/* The vocabulary's slice of class A, made if new; NULL when out of memory or room. */
static const struct gdslice *dslice(const struct gram_vocab *cv, const uint64_t *cls) {
    struct gram_vocab *v = (struct gram_vocab *)cv; /* the slice cache, under ds_mu */
    const struct gdslice *r = NULL;
    pthread_mutex_lock(&v->ds_mu);
    for (uint32_t k = 0; k < v->n_ds && !r; k++)
        if (!memcmp(v->ds[k].cls, cls, sizeof v->ds[k].cls)) r = &v->ds[k];
    if (!r && v->n_ds < GRAM_DS_MAX && dslice_build(v, cls, &v->ds[v->n_ds])) r = &v->ds[v->n_ds++];
    pthread_mutex_unlock(&v->ds_mu);
    return r;
}

/* The dynamic slice for s, if one applies: the largest set of ASCII bytes leading s to one
 * state, when it is a pure chain or loop over them. Sets g->dsl[s], g->dsl_k[s]. */
static void dslice_of(struct gram *g, uint32_t s) {
    const struct gauto *a = &g->a;
    /* the most common target of the ASCII bytes */
    uint32_t tg[128], cnt[128], nt = 0, best = 0, best_n = 0;
    for (unsigned b = 0; b < 128; b++) {
        uint32_t t = gram_delta(a, s, (uint8_t)b), k = 0;
        if (!t) continue;
        while (k < nt && tg[k] != t)
            k++;
        if (k == nt) tg[nt] = t, cnt[nt++] = 0;
        if (++cnt[k] > best_n) best_n = cnt[k], best = t;
    }
    g->dsl[s] = GRAM_NONE;
    if (best_n < DS_MIN_BYTES) return;
    uint64_t cls[2] = {0, 0};
    for (unsigned b = 0; b < 128; b++)
        if (gram_delta(a, s, (uint8_t)b) == best) gram_bit_set(cls, b);
    if (!g->ds_onpath) g->ds_onpath = calloc(a->n_st, 1);
    if (!g->ds_path) g->ds_path = malloc((size_t)a->n_st * sizeof *g->ds_path);
    const struct gdslice *d = g->ds_onpath && g->ds_path ? dslice(g->v, cls) : NULL;
    if (!d) return;
    g->dsl[s] = SL_UNK;
    if (class_depth(g, s, cls, (uint32_t)(d - g->v->ds)) == SL_NO) g->dsl[s] = GRAM_NONE;
}

/* ---- the walk ---------------------------------------------------------------------------- */

struct ids {
    int32_t *v;
    uint32_t n;
    size_t cap;
};

static bool add_tok(const struct gram_vocab *v, struct ids *l, int32_t tok) {
    for (int32_t t = tok; t >= 0; t = v->dup[t]) {
        if (l->n == l->cap &&
            !gram_grow(&l->v, &l->cap, (size_t)l->n + 1, sizeof *l->v, (size_t)v->n))
            return false;
        l->v[l->n++] = t;
    }
    return true;
}

/* A walk of the trie from one state (gram_mask_compute). While every state on the path is
 * simple (no call, cannot end) the stack stays empty and one state per depth is the whole
 * configuration: q[d]. A subtree entered through another state goes to the general simulation,
 * started from its parent's state. At a node with a child table, only the children the state
 * takes are visited. */
struct walk {
    struct gram *g;
    const struct gram_vocab *v;
    const struct gtrie *t;
    const struct gauto *a;
    struct gsim *sim;
    const uint64_t *skip; /* dynamic slice: subtrees it decides */
    struct ids *acc, *unc;
    uint64_t visited;
    const uint64_t (*bytes)[4]; /* per state: the bytes it takes (g->bytes) */
    const uint16_t *nbytes;
    uint32_t q[GRAM_MAX_PIECE + 2];
};

/* The subtree [i, end) of t with the general simulation, from state p at depth d. */
static bool walk_general(struct walk *w, uint32_t p, uint32_t d, uint32_t i, uint32_t end) {
    const struct gtrie *t = w->t;
    struct gsim *sim = w->sim;
    struct gcfg c0 = {p, 0};
    if (!gram_sim_start(sim, &c0, 1, 0)) return false;
    while (i < end) {
        const struct gtnode *m = &t->n[i];
        if (w->skip && !gram_bit(w->skip, i)) {
            i = m->next;
            continue;
        }
        w->visited++;
        gram_sim_pop_to(sim, m->depth - 1u - d);
        if (!gram_sim_step(sim, m->byte)) {
            if (sim->oom) return false;
            i = m->next;
            continue;
        }
        if (m->tok >= 0) {
            uint8_t f = sim->lf[sim->depth];
            if (gram_sim_count(sim) || (f & LV_POPPED)) {
                if (!add_tok(w->v, w->acc, m->tok)) return false;
            } else if ((f & LV_OUT) && !add_tok(w->v, w->unc, m->tok)) {
                return false;
            }
        }
        i++;
    }
    return true;
}

/* The nodes [i, end) of the trie (a run of siblings' subtrees), their parents' states in q. */
static bool walk_range(struct walk *w, uint32_t i, uint32_t end) {
    const struct gtnode *n = w->t->n;
    const struct gstate *st = w->a->st;
    const struct grule *rules = w->a->rules;
    const uint32_t *trans = w->a->trans;
    while (i < end) {
        const struct gtnode *nd = &n[i];
        if (w->skip && !gram_bit(w->skip, i)) { /* only class tokens below: the slice decides */
            i = nd->next;
            continue;
        }
        w->visited++;
        uint32_t d = nd->depth - 1u, p = w->q[d];
        uint32_t x = trans[st[p].trans + rules[st[p].rule].cmap[nd->byte]];
        if (!x) {
            i = nd->next;
            continue;
        }
        if (!(st[x].flags & GS_SIMPLE)) {
            if (!walk_general(w, p, d, i, nd->next)) return false;
            i = nd->next;
            continue;
        }
        w->q[d + 1] = x;
        if (nd->tok >= 0 && !add_tok(w->v, w->acc, nd->tok)) return false;
        uint32_t wi = w->t->wide[i];
        const uint32_t *tab = wi ? w->t->tab + (size_t)(wi - 1) * 257 : NULL;
        if (!tab || w->nbytes[x] >= tab[256]) {
            i++;
            continue;
        }
        /* a wide node and a state that takes few bytes: those children, by table */
        for (unsigned k = 0; k < 4; k++)
            for (uint64_t m = w->bytes[x][k]; m; m &= m - 1) {
                uint32_t c = tab[k * 64 + (unsigned)__builtin_ctzll(m)];
                if (c && !walk_range(w, c, n[c].next)) return false;
            }
        i = nd->next;
    }
    return true;
}

struct gci *gram_mask_compute(struct gram *g, struct gsim *sim, uint32_t s) {
    const struct gram_vocab *v = g->v;
    const struct gauto *a = &g->a;
    uint32_t sl = slice_depth(g, s);
    const struct gtrie *t = sl == SL_NO ? &v->all : &v->rest;
    uint8_t base = CI_BASE_NONE;
    uint32_t k = 0;
    const uint64_t *skip = NULL; /* dynamic slice: subtrees it decides */
    const uint32_t *cum = v->cum;
    if (sl == SL_INF || (sl != SL_NO && sl > 0)) {
        base = CI_BASE_SLICE;
        k = sl == SL_INF || sl > v->s1max ? v->s1max : sl;
        if (k == 0) base = CI_BASE_NONE;
    } else if (sl == SL_NO) {
        if (g->dsl[s] == SL_UNK) dslice_of(g, s);
        if (g->dsl[s] != GRAM_NONE) {
            const struct gdslice *d = &v->ds[g->dsl[s]];
            skip = d->mixed;
            cum = d->cum;
            k = g->dsl_k[s] == SL_INF || g->dsl_k[s] > d->maxlen ? d->maxlen : g->dsl_k[s];
            base = k ? CI_BASE_BITS : CI_BASE_NONE;
        }
    }
    struct ids acc = {0}, unc = {0};
    struct gci *c = NULL;
    gram_stk_clear(sim->stk);
    sim->local = true;
    memcpy(sim->follow, a->rules[a->st[s].rule].follow, sizeof sim->follow);
    if (!gram_sim_reserve(sim, v->max_len + 1)) goto done;
    struct walk w = {g, v, t, a, sim, skip, &acc, &unc, 0, g->bytes, g->nbytes, {0}};
    w.q[0] = s;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t i = t->root[b];
        if (i && gram_delta(a, s, (uint8_t)b) && !walk_range(&w, i, t->n[i].next)) goto done;
    }
    uint64_t visited = w.visited;
    g->walk_nodes += visited;
    if (acc.n > ACC_BITS_MIN || (skip && base == CI_BASE_BITS)) {
        /* own bitset: the slice part (if any) copied in, the accepted tokens set */
        size_t bytes = sizeof *c + (size_t)unc.n * sizeof(int32_t) + v->words * sizeof(uint32_t);
        c = calloc(1, bytes);
        if (!c) goto done;
        c->bytes = bytes;
        c->bits = (uint32_t *)(c + 1);
        c->unc = (int32_t *)(c->bits + v->words);
        if (base == CI_BASE_SLICE || skip)
            memcpy(c->bits, cum + (size_t)k * v->words, v->words * sizeof(uint32_t));
        for (uint32_t j = 0; j < acc.n; j++)
            c->bits[(uint32_t)acc.v[j] >> 5] |= 1u << (acc.v[j] & 31);
        c->base = CI_BASE_BITS;
    } else {
        size_t bytes = sizeof *c + ((size_t)acc.n + unc.n) * sizeof(int32_t);
        c = calloc(1, bytes);
        if (!c) goto done;
        c->bytes = bytes;
        c->acc = (int32_t *)(c + 1);
        c->unc = c->acc + acc.n;
        if (acc.n) memcpy(c->acc, acc.v, acc.n * sizeof(int32_t));
        c->n_acc = acc.n;
        c->base = base;
        c->k = k;
    }
    if (unc.n) memcpy(c->unc, unc.v, unc.n * sizeof(int32_t));
    c->n_unc = unc.n;
done:
    free(acc.v);
    free(unc.v);
    return c;
}

void gram_ci_free(struct gci *c) {
    free(c);
}

const struct gci *gram_mask_get(struct gram *g, uint32_t s, struct gci **tmp) {
    struct gci *c = atomic_load_explicit(&g->ci[s], memory_order_acquire);
    if (c) return c;
    pthread_mutex_lock(&g->mu);
    c = atomic_load_explicit(&g->ci[s], memory_order_relaxed);
    if (!c) {
        c = gram_mask_compute(g, &g->lsim, s);
        if (c && g->ci_bytes + c->bytes <= GRAM_MASK_BUDGET) {
            g->ci_bytes += c->bytes;
            atomic_store_explicit(&g->ci[s], c, memory_order_release);
        } else if (c) {
            *tmp = c;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return c;
}

void gram_mask_warm(struct gram *g, uint64_t budget) {
    const struct gauto *a = &g->a;
    uint32_t *queue = malloc((size_t)a->n_st * sizeof *queue);
    uint8_t *seen = calloc(a->n_st, 1);
    if (!queue || !seen) goto done;
    uint32_t qh = 0, qt = 0, s0 = a->rules[a->root].start;
    queue[qt++] = s0;
    seen[s0] = 1;
    uint64_t start = g->walk_nodes;
    while (qh < qt && g->walk_nodes - start < budget) {
        uint32_t s = queue[qh++];
        const struct gstate *st = &a->st[s];
        if (st->flags & GS_BYTES) {
            struct gci *tmp = NULL;
            if (!gram_mask_get(g, s, &tmp)) break;
            if (tmp) {
                gram_ci_free(tmp);
                break;
            }
        }
        const struct grule *r = &a->rules[st->rule];
        for (uint32_t c = 0; c < r->n_cls; c++) {
            uint32_t t = a->trans[st->trans + c];
            if (t && !seen[t]) seen[t] = 1, queue[qt++] = t;
        }
        for (uint32_t k = 0; k < st->n_calls; k++) {
            const struct gcall *cl = &a->calls[st->calls + k];
            uint32_t t1 = a->rules[cl->rule].start, t2 = cl->ret;
            if (!seen[t1]) seen[t1] = 1, queue[qt++] = t1;
            if (!seen[t2]) seen[t2] = 1, queue[qt++] = t2;
        }
    }
done:
    free(queue);
    free(seen);
}

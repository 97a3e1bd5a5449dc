/* Expression trees -> the grammar's automaton: one byte-level DFA per kept rule, whose edges
 * are byte classes and calls of other rules.
 *
 * 1. Rules that cannot reach themselves are inlined where they are referenced (unless large
 *    and referenced often), so a grammar without recursion becomes one DFA; recursive rules
 *    (and the root) are kept as rules and referenced by call edges.
 * 2. Each kept rule's body becomes a Thompson NFA over bytes (code point sets become their
 *    UTF-8 byte-range sequences), with call edges; subset construction over its byte classes
 *    and call symbols makes the rule's DFA.
 * 3. Analyses: which rules can be empty, which can end at all (calls of rules that cannot
 *    are removed, then states that cannot end), left recursion (refused: closure would not
 *    terminate), and for each rule the bytes that may follow it (pruning in gram_mask.c).
 * Every stage is bounded (GRAM_MAX_NFA, GRAM_MAX_DFA), so hostile grammars fail fast.
 */
#include <stdio.h>
#include <string.h>

#include "grammar/gram_int.h"

enum { NE_EPS = 0, NE_BYTE = 1, NE_CALL = 2 };

struct ned {
    uint32_t next, to, arg; /* arg: rule of a call */
    uint8_t kind, lo, hi;
};

struct ab {
    const struct gast *ast;
    struct gauto *au;
    struct err *e;
    bool failed;
    uint32_t *kept;   /* ast rule -> automaton rule, GRAM_NONE when inlined */
    uint32_t *est;    /* ast rule -> estimated NFA states of its body */
    uint32_t *nfirst; /* NFA state -> first edge (GRAM_NONE) */
    uint32_t nn;
    size_t capn;
    struct ned *ed;
    uint32_t ne;
    size_t cape;
    uint64_t nfa_total;
    int depth;
};

#define INLINE_TINY 128u     /* NFA states of a rule inlined however often it is used */
#define INLINE_MAX 4096u     /* NFA states a rule may have and still be inlined */
#define INLINE_SHARED 16384u /* ... all its copies together, when referenced more than once */

static bool fail_nomem(struct ab *b) {
    if (!b->failed) err_set(b->e, SMELT_ERR_NOMEM, "grammar: out of memory");
    b->failed = true;
    return false;
}

static bool fail_big(struct ab *b, const char *what, uint64_t limit) {
    if (!b->failed)
        err_set(b->e, SMELT_ERR_RANGE, "grammar too large: more than %llu %s",
                (unsigned long long)limit, what);
    b->failed = true;
    return false;
}

/* ---- rule graph: references, recursion, sizes ---------------------------------------------- */

struct refs {
    uint32_t *v;
    uint32_t n;
    size_t cap;
};

static uint32_t sat_add(uint32_t a, uint32_t c) {
    return a + c < a ? UINT32_MAX : a + c;
}
static uint32_t sat_mul(uint32_t a, uint32_t c) {
    uint64_t r = (uint64_t)a * c;
    return r > UINT32_MAX ? UINT32_MAX : (uint32_t)r;
}

/* The rules node references, each with how many copies the repetitions around it make. */
static bool collect_refs(struct ab *b, uint32_t node, uint32_t copies, struct refs *out,
                         int depth) {
    if (depth > 4 * GRAM_MAX_NEST + 64) {
        err_set(b->e, SMELT_ERR_RANGE, "grammar: expressions nest too deeply");
        b->failed = true;
        return false;
    }
    const struct gx *x = &b->ast->x[node];
    switch (x->kind) {
    case GX_REF:
        if (!gram_grow(&out->v, &out->cap, (size_t)out->n + 2, sizeof *out->v, UINT32_MAX / 4))
            return fail_nomem(b);
        out->v[out->n++] = x->off;
        out->v[out->n++] = copies;
        return true;
    case GX_SEQ:
    case GX_ALT:
        for (uint32_t k = 0; k < x->n; k++)
            if (!collect_refs(b, b->ast->kid[x->off + k], copies, out, depth + 1)) return false;
        return true;
    case GX_REP:
        return collect_refs(b, x->off, sat_mul(copies, x->max == GRAM_INF ? x->min + 1 : x->max),
                            out, depth + 1);
    default:
        return true;
    }
}

/* Estimated NFA states of node, with inlined references expanded. */
static uint32_t est_node(const struct ab *b, uint32_t node) {
    const struct gx *x = &b->ast->x[node];
    uint32_t s = 0;
    switch (x->kind) {
    case GX_EMPTY:
        return 1;
    case GX_CHARS: /* an ASCII range is one edge; others take a few states per byte length */
        for (uint32_t k = 0; k < x->n; k++)
            s = sat_add(s, b->ast->rng[x->off + 2 * k + 1] < 0x80 ? 0 : 6);
        return s + 1;
    case GX_LIT:
        return x->n + 1;
    case GX_REF:
        return b->kept[x->off] != GRAM_NONE ? 2 : b->est[x->off];
    case GX_SEQ:
    case GX_ALT:
        for (uint32_t k = 0; k < x->n; k++)
            s = sat_add(s, est_node(b, b->ast->kid[x->off + k]));
        return sat_add(s, 2);
    case GX_REP: {
        uint32_t c = x->max == GRAM_INF ? x->min + 1 : x->max;
        return sat_add(sat_mul(est_node(b, x->off), c ? c : 1), 3);
    }
    }
    return 1;
}

/* Decides which rules are kept (root, recursive, large and shared) and numbers them. */
static bool plan_rules(struct ab *b, uint32_t root) {
    const struct gast *a = b->ast;
    uint32_t n = a->nrule;
    struct refs *out = calloc(n, sizeof *out);
    uint32_t *nref = calloc(n, sizeof *nref), *order = malloc(n * sizeof *order);
    uint32_t *index = malloc(n * sizeof *index), *low = malloc(n * sizeof *low);
    uint32_t *stack = malloc(n * sizeof *stack), *cs = malloc(n * sizeof *cs);
    uint32_t *ci = malloc(n * sizeof *ci), *comp = malloc(n * sizeof *comp);
    uint8_t *onst = calloc(n, 1), *rec = calloc(n, 1), *reach = calloc(n, 1);
    bool ok = false;
    if (!out || !nref || !order || !index || !low || !stack || !cs || !ci || !comp || !onst ||
        !rec || !reach) {
        fail_nomem(b);
        goto done;
    }
    for (uint32_t r = 0; r < n; r++)
        if (!collect_refs(b, a->rule[r].body, 1, &out[r], 0)) goto done;
    /* reachable rules */
    uint32_t ns = 0;
    stack[ns++] = root;
    reach[root] = 1;
    while (ns) {
        uint32_t r = stack[--ns];
        for (uint32_t k = 0; k < out[r].n; k += 2) {
            uint32_t t = out[r].v[k];
            nref[t] = sat_add(nref[t], out[r].v[k + 1]);
            if (!reach[t]) {
                reach[t] = 1;
                stack[ns++] = t;
            }
        }
    }
    /* Tarjan's SCCs (iterative); components come out callees first: `order` is a
     * post-order of the reference graph. */
    uint32_t idx = 0, no = 0, nst = 0, ncs = 0, ncomp = 0;
    for (uint32_t r = 0; r < n; r++)
        index[r] = GRAM_NONE;
    for (uint32_t r0 = 0; r0 < n; r0++) {
        if (!reach[r0] || index[r0] != GRAM_NONE) continue;
        cs[ncs] = r0;
        ci[ncs++] = 0;
        index[r0] = low[r0] = idx++;
        stack[nst++] = r0;
        onst[r0] = 1;
        while (ncs) {
            uint32_t r = cs[ncs - 1];
            if (ci[ncs - 1] < out[r].n) {
                uint32_t t = out[r].v[ci[ncs - 1]];
                ci[ncs - 1] += 2;
                if (index[t] == GRAM_NONE) {
                    index[t] = low[t] = idx++;
                    stack[nst++] = t;
                    onst[t] = 1;
                    cs[ncs] = t;
                    ci[ncs++] = 0;
                } else if (onst[t] && index[t] < low[r]) {
                    low[r] = index[t];
                }
                continue;
            }
            ncs--;
            if (ncs && low[r] < low[cs[ncs - 1]]) low[cs[ncs - 1]] = low[r];
            if (low[r] != index[r]) continue;
            uint32_t size = 0, t;
            do {
                t = stack[--nst];
                onst[t] = 0;
                comp[t] = ncomp;
                order[no++] = t;
                size++;
            } while (t != r);
            ncomp++;
            if (size > 1) {
                for (uint32_t k = no - size; k < no; k++)
                    rec[order[k]] = 1;
            } else {
                for (uint32_t k = 0; k < out[r].n; k += 2)
                    if (out[r].v[k] == r) rec[r] = 1;
            }
        }
    }
    /* sizes and the keep decision, callees first */
    for (uint32_t k = 0; k < no; k++) {
        uint32_t r = order[k];
        b->kept[r] = GRAM_NONE;
        if (rec[r] || r == root) {
            b->kept[r] = 0; /* numbered below */
            continue;
        }
        b->est[r] = est_node(b, a->rule[r].body);
        /* tiny rules are always inlined: a call of a rule that ends after a character or two
         * would make nearly every token depend on the stack */
        if (b->est[r] > INLINE_TINY &&
            (b->est[r] > INLINE_MAX ||
             (nref[r] > 1 && sat_mul(b->est[r], nref[r]) > INLINE_SHARED)))
            b->kept[r] = 0;
    }
    /* number the kept rules: root first */
    uint32_t nk = 0;
    b->kept[root] = nk++;
    for (uint32_t k = 0; k < no; k++)
        if (order[k] != root && b->kept[order[k]] != GRAM_NONE) b->kept[order[k]] = nk++;
    if (!gram_grow(&b->au->rules, &b->au->cap_rules, nk, sizeof *b->au->rules, GRAM_MAX_DFA)) {
        fail_nomem(b);
        goto done;
    }
    memset(b->au->rules, 0, nk * sizeof *b->au->rules);
    b->au->n_rules = nk;
    for (uint32_t r = 0; r < n; r++) {
        if (!reach[r] || b->kept[r] == GRAM_NONE) continue;
        struct grule *g = &b->au->rules[b->kept[r]];
        snprintf(g->name, sizeof g->name, "%s", a->names + a->rule[r].name);
    }
    ok = true;
done:
    if (out)
        for (uint32_t r = 0; r < n; r++)
            free(out[r].v);
    free(out);
    free(nref);
    free(order);
    free(index);
    free(low);
    free(stack);
    free(cs);
    free(ci);
    free(comp);
    free(onst);
    free(rec);
    free(reach);
    return ok;
}

/* ---- Thompson NFA ---------------------------------------------------------------------------- */

static uint32_t nfa_new(struct ab *b) {
    if (b->failed) return GRAM_NONE;
    if (++b->nfa_total > GRAM_MAX_NFA) return fail_big(b, "NFA states", GRAM_MAX_NFA), GRAM_NONE;
    if (!gram_grow(&b->nfirst, &b->capn, (size_t)b->nn + 1, sizeof *b->nfirst, GRAM_MAX_NFA))
        return fail_nomem(b), GRAM_NONE;
    b->nfirst[b->nn] = GRAM_NONE;
    return b->nn++;
}

static bool nfa_edge(struct ab *b, uint32_t from, uint32_t to, uint8_t kind, uint8_t lo, uint8_t hi,
                     uint32_t arg) {
    if (b->failed || from == GRAM_NONE || to == GRAM_NONE) return false;
    if (!gram_grow(&b->ed, &b->cape, (size_t)b->ne + 1, sizeof *b->ed, 4 * (size_t)GRAM_MAX_NFA))
        return fail_nomem(b);
    b->ed[b->ne] = (struct ned){b->nfirst[from], to, arg, kind, lo, hi};
    b->nfirst[from] = b->ne++;
    return true;
}

/* UTF-8 byte-range sequences of the code points lo..hi (no surrogates), each added as a path
 * from `in` to `out` (the classic range split: by encoded length, then so that every byte
 * after the first spans whole continuation ranges). */
static bool utf8_paths(struct ab *b, uint32_t lo, uint32_t hi, uint32_t in, uint32_t out) {
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k])
            return utf8_paths(b, lo, lim[k], in, out) && utf8_paths(b, lim[k] + 1, hi, in, out);
    if (hi <= 0x7F) return nfa_edge(b, in, out, NE_BYTE, (uint8_t)lo, (uint8_t)hi, 0);
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_paths(b, lo, lo | m, in, out) &&
                       utf8_paths(b, (lo | m) + 1, hi, in, out);
            if ((hi & m) != m)
                return utf8_paths(b, lo, (hi & ~m) - 1, in, out) &&
                       utf8_paths(b, hi & ~m, hi, in, out);
        }
    }
    uint8_t x[4], y[4];
    int n;
    if (hi <= 0x7FF) {
        x[0] = (uint8_t)(0xC0 | lo >> 6), y[0] = (uint8_t)(0xC0 | hi >> 6);
        n = 2;
    } else if (hi <= 0xFFFF) {
        x[0] = (uint8_t)(0xE0 | lo >> 12), y[0] = (uint8_t)(0xE0 | hi >> 12);
        n = 3;
    } else {
        x[0] = (uint8_t)(0xF0 | lo >> 18), y[0] = (uint8_t)(0xF0 | hi >> 18);
        n = 4;
    }
    for (int k = 1; k < n; k++) {
        x[k] = (uint8_t)(0x80 | ((lo >> (6 * (n - 1 - k))) & 0x3F));
        y[k] = (uint8_t)(0x80 | ((hi >> (6 * (n - 1 - k))) & 0x3F));
    }
    uint32_t cur = in;
    for (int k = 0; k < n; k++) {
        uint32_t nx = k == n - 1 ? out : nfa_new(b);
        if (!nfa_edge(b, cur, nx, NE_BYTE, x[k], y[k], 0)) return false;
        cur = nx;
    }
    return true;
}

/* Adds node's NFA starting at state `in`; returns its exit state. ALT and REP make fresh
 * entry and exit states so that no loop can return into a state another part leaves from. */
static uint32_t nfa_build(struct ab *b, uint32_t node, uint32_t in) {
    if (b->failed) return GRAM_NONE;
    if (++b->depth > 4 * GRAM_MAX_NEST + 64) {
        err_set(b->e, SMELT_ERR_RANGE, "grammar: rules nest too deeply when inlined");
        b->failed = true;
        return GRAM_NONE;
    }
    const struct gx *x = &b->ast->x[node];
    uint32_t out = in;
    switch (x->kind) {
    case GX_EMPTY:
        break;
    case GX_LIT:
        for (uint32_t k = 0; k < x->n && out != GRAM_NONE; k++) {
            uint32_t nx = nfa_new(b);
            uint8_t c = b->ast->byt[x->off + k];
            if (!nfa_edge(b, out, nx, NE_BYTE, c, c, 0)) nx = GRAM_NONE;
            out = nx;
        }
        break;
    case GX_CHARS:
        out = nfa_new(b);
        for (uint32_t k = 0; k < x->n && out != GRAM_NONE; k++)
            if (!utf8_paths(b, b->ast->rng[x->off + 2 * k], b->ast->rng[x->off + 2 * k + 1], in,
                            out))
                out = GRAM_NONE;
        break;
    case GX_REF: {
        uint32_t r = x->off;
        if (b->kept[r] != GRAM_NONE) {
            out = nfa_new(b);
            if (!nfa_edge(b, in, out, NE_CALL, 0, 0, b->kept[r])) out = GRAM_NONE;
        } else {
            out = nfa_build(b, b->ast->rule[r].body, in);
        }
        break;
    }
    case GX_SEQ:
        for (uint32_t k = 0; k < x->n && out != GRAM_NONE; k++)
            out = nfa_build(b, b->ast->kid[x->off + k], out);
        break;
    case GX_ALT:
        out = nfa_new(b);
        for (uint32_t k = 0; k < x->n && out != GRAM_NONE; k++) {
            uint32_t a = nfa_new(b);
            nfa_edge(b, in, a, NE_EPS, 0, 0, 0);
            uint32_t z = nfa_build(b, b->ast->kid[x->off + k], a);
            if (!nfa_edge(b, z, out, NE_EPS, 0, 0, 0)) out = GRAM_NONE;
        }
        break;
    case GX_REP: {
        uint32_t cur = in;
        for (uint32_t k = 0; k < x->min && cur != GRAM_NONE; k++) {
            uint32_t a = nfa_new(b);
            nfa_edge(b, cur, a, NE_EPS, 0, 0, 0);
            cur = nfa_build(b, x->off, a);
        }
        out = nfa_new(b);
        if (x->max == GRAM_INF) {
            uint32_t head = nfa_new(b), a = nfa_new(b);
            nfa_edge(b, cur, head, NE_EPS, 0, 0, 0);
            nfa_edge(b, head, a, NE_EPS, 0, 0, 0);
            uint32_t z = nfa_build(b, x->off, a);
            nfa_edge(b, z, head, NE_EPS, 0, 0, 0);
            if (!nfa_edge(b, head, out, NE_EPS, 0, 0, 0)) out = GRAM_NONE;
        } else {
            for (uint32_t k = x->min; k < x->max && cur != GRAM_NONE; k++) {
                uint32_t a = nfa_new(b);
                nfa_edge(b, cur, out, NE_EPS, 0, 0, 0);
                nfa_edge(b, cur, a, NE_EPS, 0, 0, 0);
                cur = nfa_build(b, x->off, a);
            }
            if (!nfa_edge(b, cur, out, NE_EPS, 0, 0, 0)) out = GRAM_NONE;
        }
        break;
    }
    }
    b->depth--;
    return b->failed ? GRAM_NONE : out;
}

/* ---- subset construction --------------------------------------------------------------------- */

struct dset {
    uint32_t *pool; /* the NFA sets of the DFA states, back to back */
    uint32_t npool;
    size_t cappool;
    uint32_t *off, *len; /* per DFA state of this rule */
    size_t cap_st, cap_len;
    uint32_t *ht; /* DFA state index (within the rule) + 1, 0 = empty */
    uint32_t ht_cap, count;
    uint32_t *mark; /* NFA state -> generation */
    uint32_t capmark, gen;
    uint32_t *stack;
    size_t capstack;
    uint32_t *tmp, ntmp;
    size_t captmp;
};

static uint64_t hash_set(const uint32_t *v, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t k = 0; k < n; k++)
        h = (h ^ v[k]) * 0x100000001B3ull, h ^= h >> 29;
    return h;
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, c = *(const uint32_t *)y;
    return (a > c) - (a < c);
}

/* Epsilon closure of d->tmp[0..ntmp), kept to the states that matter (non-epsilon edges or
 * the final state), sorted, in d->tmp. */
static bool closure(struct ab *b, struct dset *d, uint32_t final) {
    d->gen++;
    uint32_t nst = 0, nout = 0;
    if (!gram_grow(&d->stack, &d->capstack, d->ntmp, sizeof *d->stack, GRAM_MAX_NFA))
        return fail_nomem(b);
    for (uint32_t k = 0; k < d->ntmp; k++) {
        uint32_t q = d->tmp[k];
        if (d->mark[q] == d->gen) continue;
        d->mark[q] = d->gen;
        d->stack[nst++] = q;
    }
    d->ntmp = 0;
    while (nst) {
        uint32_t q = d->stack[--nst];
        bool keep = q == final;
        for (uint32_t e = b->nfirst[q]; e != GRAM_NONE; e = b->ed[e].next) {
            if (b->ed[e].kind != NE_EPS) {
                keep = true;
                continue;
            }
            uint32_t t = b->ed[e].to;
            if (d->mark[t] == d->gen) continue;
            d->mark[t] = d->gen;
            if (!gram_grow(&d->stack, &d->capstack, (size_t)nst + 1, sizeof *d->stack,
                           GRAM_MAX_NFA))
                return fail_nomem(b);
            d->stack[nst++] = t;
        }
        if (keep) {
            if (!gram_grow(&d->tmp, &d->captmp, (size_t)nout + 1, sizeof *d->tmp, GRAM_MAX_NFA))
                return fail_nomem(b);
            d->tmp[nout++] = q;
        }
    }
    if (nout > 16) {
        qsort(d->tmp, nout, sizeof *d->tmp, cmp_u32);
    } else { /* the common tiny set: insertion sort, no call */
        for (uint32_t i = 1; i < nout; i++) {
            uint32_t x = d->tmp[i], j = i;
            for (; j > 0 && d->tmp[j - 1] > x; j--)
                d->tmp[j] = d->tmp[j - 1];
            d->tmp[j] = x;
        }
    }
    d->ntmp = nout;
    return true;
}

/* The DFA state (global id) of the set d->tmp, made if new; 0 for the empty set. */
static uint32_t intern(struct ab *b, struct dset *d, uint32_t first_state) {
    if (d->ntmp == 0) return 0;
    if (d->count * 2 >= d->ht_cap) {
        uint32_t nc = d->ht_cap ? d->ht_cap * 2 : 256;
        uint32_t *nh = calloc(nc, sizeof *nh);
        if (!nh) return fail_nomem(b), GRAM_NONE;
        for (uint32_t k = 0; k < d->ht_cap; k++) {
            if (!d->ht[k]) continue;
            uint32_t i = d->ht[k] - 1;
            uint64_t h = hash_set(d->pool + d->off[i], d->len[i]);
            uint32_t j = (uint32_t)h & (nc - 1);
            while (nh[j])
                j = (j + 1) & (nc - 1);
            nh[j] = d->ht[k];
        }
        free(d->ht);
        d->ht = nh;
        d->ht_cap = nc;
    }
    uint64_t h = hash_set(d->tmp, d->ntmp);
    uint32_t j = (uint32_t)h & (d->ht_cap - 1);
    while (d->ht[j]) {
        uint32_t i = d->ht[j] - 1;
        if (d->len[i] == d->ntmp && memcmp(d->pool + d->off[i], d->tmp, d->ntmp * 4) == 0)
            return first_state + i;
        j = (j + 1) & (d->ht_cap - 1);
    }
    struct gauto *au = b->au;
    if (au->n_st >= GRAM_MAX_DFA) return fail_big(b, "automaton states", GRAM_MAX_DFA), GRAM_NONE;
    uint32_t i = d->count;
    if (!gram_grow(&d->off, &d->cap_st, (size_t)i + 1, sizeof *d->off, GRAM_MAX_DFA) ||
        !gram_grow(&d->pool, &d->cappool, (size_t)d->npool + d->ntmp, sizeof *d->pool, 1u << 28) ||
        !gram_grow(&au->st, &au->cap_st, (size_t)au->n_st + 1, sizeof *au->st, GRAM_MAX_DFA))
        return fail_nomem(b), GRAM_NONE;
    if (d->cap_len < d->cap_st) {
        uint32_t *nl = realloc(d->len, d->cap_st * sizeof *d->len);
        if (!nl) return fail_nomem(b), GRAM_NONE;
        d->len = nl;
        d->cap_len = d->cap_st;
    }
    d->off[i] = d->npool;
    d->len[i] = d->ntmp;
    memcpy(d->pool + d->npool, d->tmp, d->ntmp * 4);
    d->npool += d->ntmp;
    d->ht[j] = i + 1;
    d->count++;
    memset(&au->st[au->n_st], 0, sizeof *au->st);
    au->n_st++;
    return first_state + i;
}

static void dset_free(struct dset *d) {
    free(d->pool);
    free(d->off);
    free(d->len);
    free(d->ht);
    free(d->mark);
    free(d->stack);
    free(d->tmp);
}

/* Builds rule r's DFA from the NFA (start state 0, final state `final`). */
static bool determinize(struct ab *b, uint32_t r, uint32_t final) {
    struct gauto *au = b->au;
    struct grule *g = &au->rules[r];
    /* byte classes: boundaries at each edge's lo and hi + 1 */
    uint8_t cut[257] = {0};
    for (uint32_t e = 0; e < b->ne; e++) {
        if (b->ed[e].kind != NE_BYTE) continue;
        cut[b->ed[e].lo] = 1;
        cut[b->ed[e].hi + 1] = 1;
    }
    uint32_t ncls = 0;
    for (int c = 0; c < 256; c++) {
        if (c == 0 || cut[c]) ncls++;
        g->cmap[c] = (uint8_t)(ncls - 1);
    }
    g->n_cls = ncls;
    struct dset d = {0};
    bool ok = false;
    uint32_t bcount[257], bfill[256], *bucket = NULL;
    size_t capbucket = 0;
    d.mark = calloc(b->nn, sizeof *d.mark);
    d.capmark = b->nn;
    if (!d.mark) {
        fail_nomem(b);
        goto done;
    }
    uint32_t first = au->n_st;
    if (!gram_grow(&d.tmp, &d.captmp, 1, sizeof *d.tmp, GRAM_MAX_NFA)) {
        fail_nomem(b);
        goto done;
    }
    d.tmp[0] = 0;
    d.ntmp = 1;
    if (!closure(b, &d, final)) goto done;
    g->start = intern(b, &d, first);
    if (g->start == GRAM_NONE || g->start == 0) goto done;
    for (uint32_t i = 0; i < d.count; i++) {
        uint32_t s = first + i;
        /* transitions, one per class */
        if (!gram_grow(&au->trans, &au->cap_trans, (size_t)au->n_trans + ncls, sizeof *au->trans,
                       (size_t)GRAM_MAX_DFA * 64)) {
            fail_big(b, "automaton transitions", (uint64_t)GRAM_MAX_DFA * 64);
            goto done;
        }
        uint32_t toff = au->n_trans;
        au->n_trans += ncls;
        au->st[s].rule = r;
        au->st[s].trans = toff;
        /* the targets of the set's byte edges, bucketed by class in one pass */
        memset(bcount, 0, (ncls + 1) * sizeof *bcount);
        uint32_t nb = 0;
        for (uint32_t k = 0; k < d.len[i]; k++)
            for (uint32_t e = b->nfirst[d.pool[d.off[i] + k]]; e != GRAM_NONE; e = b->ed[e].next)
                if (b->ed[e].kind == NE_BYTE) {
                    uint32_t span = (uint32_t)g->cmap[b->ed[e].hi] - g->cmap[b->ed[e].lo] + 1;
                    for (uint32_t c = g->cmap[b->ed[e].lo]; c <= g->cmap[b->ed[e].hi]; c++)
                        bcount[c + 1]++;
                    nb += span;
                }
        if (!gram_grow(&bucket, &capbucket, nb ? nb : 1, sizeof *bucket, 1u << 28)) {
            fail_nomem(b);
            goto done;
        }
        for (uint32_t c = 0; c < ncls; c++)
            bcount[c + 1] += bcount[c];
        memcpy(bfill, bcount, ncls * sizeof *bfill);
        for (uint32_t k = 0; k < d.len[i]; k++)
            for (uint32_t e = b->nfirst[d.pool[d.off[i] + k]]; e != GRAM_NONE; e = b->ed[e].next)
                if (b->ed[e].kind == NE_BYTE)
                    for (uint32_t c = g->cmap[b->ed[e].lo]; c <= g->cmap[b->ed[e].hi]; c++)
                        bucket[bfill[c]++] = b->ed[e].to;
        for (uint32_t c = 0; c < ncls; c++) {
            uint32_t nt = bcount[c + 1] - bcount[c];
            if (!gram_grow(&d.tmp, &d.captmp, nt ? nt : 1, sizeof *d.tmp, GRAM_MAX_NFA)) {
                fail_nomem(b);
                goto done;
            }
            memcpy(d.tmp, bucket + bcount[c], nt * sizeof *d.tmp);
            d.ntmp = nt;
            if (!closure(b, &d, final)) goto done;
            uint32_t t = intern(b, &d, first);
            if (t == GRAM_NONE) goto done;
            au->trans[toff + c] = t;
        }
        /* calls, grouped by rule */
        uint32_t coff = au->n_calls, ncalls = 0;
        for (uint32_t k = 0; k < d.len[i]; k++) {
            uint32_t q = d.pool[d.off[i] + k];
            for (uint32_t e = b->nfirst[q]; e != GRAM_NONE; e = b->ed[e].next) {
                const struct ned *x = &b->ed[e];
                if (x->kind != NE_CALL) continue;
                bool seen = false;
                for (uint32_t j = coff; j < coff + ncalls; j++)
                    seen |= au->calls[j].rule == x->arg;
                if (seen) continue;
                /* every call of this rule from the set */
                d.ntmp = 0;
                for (uint32_t k2 = 0; k2 < d.len[i]; k2++) {
                    uint32_t q2 = d.pool[d.off[i] + k2];
                    for (uint32_t e2 = b->nfirst[q2]; e2 != GRAM_NONE; e2 = b->ed[e2].next) {
                        if (b->ed[e2].kind != NE_CALL || b->ed[e2].arg != x->arg) continue;
                        if (!gram_grow(&d.tmp, &d.captmp, (size_t)d.ntmp + 1, sizeof *d.tmp,
                                       GRAM_MAX_NFA)) {
                            fail_nomem(b);
                            goto done;
                        }
                        d.tmp[d.ntmp++] = b->ed[e2].to;
                    }
                }
                if (!closure(b, &d, final)) goto done;
                uint32_t t = intern(b, &d, first);
                if (t == GRAM_NONE) goto done;
                if (ncalls >= 0xFFFF ||
                    !gram_grow(&au->calls, &au->cap_calls, (size_t)coff + ncalls + 1,
                               sizeof *au->calls, (size_t)GRAM_MAX_DFA * 16)) {
                    fail_big(b, "calls", (uint64_t)GRAM_MAX_DFA * 16);
                    goto done;
                }
                au->calls[coff + ncalls++] = (struct gcall){x->arg, t};
            }
        }
        au->n_calls = coff + ncalls;
        au->st[s].calls = coff;
        au->st[s].n_calls = (uint16_t)ncalls;
        bool fin = false;
        for (uint32_t k = 0; k < d.len[i]; k++)
            fin |= d.pool[d.off[i] + k] == final;
        au->st[s].flags = fin ? GS_FINAL : 0;
    }
    ok = true;
done:
    dset_free(&d);
    free(bucket);
    return ok;
}

/* ---- analyses ---------------------------------------------------------------------------------
 */

/* Marks the rules that can end (productive) or end without bytes (nullable): a fixpoint over
 * searches from each rule's start. */
static bool rule_fixpoint(struct ab *b, bool bytes, uint8_t *out) {
    struct gauto *au = b->au;
    uint32_t *stack = malloc(au->n_st * sizeof *stack);
    uint8_t *seen = malloc(au->n_st);
    if (!stack || !seen) {
        free(stack);
        free(seen);
        return fail_nomem(b);
    }
    memset(out, 0, au->n_rules);
    bool changed = true;
    while (changed) {
        changed = false;
        for (uint32_t r = 0; r < au->n_rules; r++) {
            if (out[r]) continue;
            memset(seen, 0, au->n_st);
            uint32_t ns = 0;
            stack[ns++] = au->rules[r].start;
            seen[au->rules[r].start] = 1;
            while (ns && !out[r]) {
                uint32_t s = stack[--ns];
                const struct gstate *g = &au->st[s];
                if (g->flags & GS_FINAL) {
                    out[r] = 1;
                    changed = true;
                    break;
                }
                for (uint32_t k = 0; k < g->n_calls; k++) {
                    const struct gcall *c = &au->calls[g->calls + k];
                    if (c->rule == GRAM_NONE || !out[c->rule] || seen[c->ret]) continue;
                    seen[c->ret] = 1;
                    stack[ns++] = c->ret;
                }
                if (!bytes) continue;
                for (uint32_t c = 0; c < au->rules[g->rule].n_cls; c++) {
                    uint32_t t = au->trans[g->trans + c];
                    if (t && !seen[t]) {
                        seen[t] = 1;
                        stack[ns++] = t;
                    }
                }
            }
        }
    }
    free(stack);
    free(seen);
    return true;
}

/* Removes calls of rules that can never end, then edges into states that cannot reach their
 * rule's end; sets the state flags. */
static bool prune(struct ab *b, const uint8_t *productive) {
    struct gauto *au = b->au;
    uint32_t n = au->n_st;
    /* reverse edges, as (target, source) pairs sorted by target */
    uint32_t ne = 0;
    for (uint32_t s = 1; s < n; s++) {
        const struct gstate *g = &au->st[s];
        ne += au->rules[g->rule].n_cls + g->n_calls;
    }
    uint32_t *cnt = calloc((size_t)n + 1, sizeof *cnt),
             *src = malloc(((size_t)ne + 1) * sizeof *src);
    uint8_t *live = calloc(n, 1);
    uint32_t *stack = malloc((size_t)n * sizeof *stack);
    if (!cnt || !src || !live || !stack) {
        free(cnt);
        free(src);
        free(live);
        free(stack);
        return fail_nomem(b);
    }
    for (uint32_t s = 1; s < n; s++) {
        struct gstate *g = &au->st[s];
        for (uint32_t k = 0; k < g->n_calls; k++) {
            struct gcall *c = &au->calls[g->calls + k];
            if (!productive[c->rule]) c->ret = 0;
        }
        for (uint32_t c = 0; c < au->rules[g->rule].n_cls; c++)
            cnt[au->trans[g->trans + c]]++;
        for (uint32_t k = 0; k < g->n_calls; k++)
            cnt[au->calls[g->calls + k].ret]++;
    }
    for (uint32_t s = 1; s <= n; s++)
        cnt[s] += cnt[s - 1];
    for (uint32_t s = 1; s < n; s++) {
        const struct gstate *g = &au->st[s];
        for (uint32_t c = 0; c < au->rules[g->rule].n_cls; c++)
            src[--cnt[au->trans[g->trans + c]]] = s;
        for (uint32_t k = 0; k < g->n_calls; k++)
            src[--cnt[au->calls[g->calls + k].ret]] = s;
    }
    uint32_t ns = 0;
    for (uint32_t s = 1; s < n; s++)
        if (au->st[s].flags & GS_FINAL) live[s] = 1, stack[ns++] = s;
    while (ns) {
        uint32_t t = stack[--ns];
        for (uint32_t k = cnt[t]; k < cnt[t + 1]; k++)
            if (!live[src[k]]) live[src[k]] = 1, stack[ns++] = src[k];
    }
    for (uint32_t s = 1; s < n; s++) {
        struct gstate *g = &au->st[s];
        bool any = false;
        for (uint32_t c = 0; c < au->rules[g->rule].n_cls; c++) {
            uint32_t *t = &au->trans[g->trans + c];
            if (!live[*t]) *t = 0;
            any |= *t != 0;
        }
        uint32_t w = 0;
        for (uint32_t k = 0; k < g->n_calls; k++) {
            struct gcall c = au->calls[g->calls + k];
            if (c.ret && live[c.ret]) au->calls[g->calls + w++] = c;
        }
        g->n_calls = (uint16_t)w;
        uint8_t f = g->flags & GS_FINAL;
        if (any) f |= GS_BYTES;
        if (!(f & GS_FINAL) && !w) f |= GS_CLOSED;
        if ((f & GS_BYTES) && (f & GS_CLOSED)) f |= GS_SIMPLE;
        g->flags = f;
    }
    free(cnt);
    free(src);
    free(live);
    free(stack);
    return true;
}

/* Left recursion: a rule that can call itself before taking a byte would make closure
 * endless. Refused, naming the cycle. */
static bool check_left_recursion(struct ab *b, const uint8_t *nullable) {
    struct gauto *au = b->au;
    uint32_t nr = au->n_rules;
    if (nr > 4096) /* the matrix below: refuse rather than allocate n^2 */
        return fail_big(b, "rules kept apart (recursive or large)", 4096);
    uint8_t *adj = calloc((size_t)nr * nr, 1);
    uint32_t *stack = malloc(au->n_st * sizeof *stack);
    uint8_t *seen = malloc(au->n_st);
    bool ok = false;
    if (!adj || !stack || !seen) {
        fail_nomem(b);
        goto done;
    }
    for (uint32_t r = 0; r < nr; r++) {
        memset(seen, 0, au->n_st);
        uint32_t ns = 0;
        stack[ns++] = au->rules[r].start;
        seen[au->rules[r].start] = 1;
        while (ns) {
            const struct gstate *g = &au->st[stack[--ns]];
            for (uint32_t k = 0; k < g->n_calls; k++) {
                const struct gcall *c = &au->calls[g->calls + k];
                adj[(size_t)r * nr + c->rule] = 1;
                if (nullable[c->rule] && !seen[c->ret]) {
                    seen[c->ret] = 1;
                    stack[ns++] = c->ret;
                }
            }
        }
    }
    /* transitive closure is O(n^3): fine for the few hundred recursive rules a real grammar
     * has, bounded above */
    uint8_t *color = calloc(nr, 1);
    uint32_t *it = calloc(nr, sizeof *it), *path = malloc(nr * sizeof *path);
    if (!color || !it || !path) {
        free(color);
        free(it);
        free(path);
        fail_nomem(b);
        goto done;
    }
    for (uint32_t r0 = 0; r0 < nr && !b->failed; r0++) {
        if (color[r0]) continue;
        uint32_t np = 0;
        path[np++] = r0;
        color[r0] = 1;
        it[r0] = 0;
        while (np && !b->failed) {
            uint32_t r = path[np - 1];
            if (it[r] < nr) {
                uint32_t t = it[r]++;
                if (!adj[(size_t)r * nr + t]) continue;
                if (color[t] == 1) {
                    char cyc[256];
                    size_t w = 0;
                    uint32_t k0 = 0;
                    while (path[k0] != t)
                        k0++;
                    for (uint32_t k = k0; k < np && w < sizeof cyc - 60; k++)
                        w += (size_t)snprintf(cyc + w, sizeof cyc - w, "%s -> ",
                                              au->rules[path[k]].name);
                    snprintf(cyc + w, sizeof cyc - w, "%s", au->rules[t].name);
                    err_set(b->e, SMELT_ERR_INVALID,
                            "grammar: left recursion (a rule reaches itself before any "
                            "character): %s",
                            cyc);
                    b->failed = true;
                    break;
                }
                if (color[t] == 0) {
                    color[t] = 1;
                    it[t] = 0;
                    path[np++] = t;
                }
                continue;
            }
            color[r] = 2;
            np--;
        }
    }
    free(color);
    free(it);
    free(path);
    ok = !b->failed;
done:
    free(adj);
    free(stack);
    free(seen);
    return ok;
}

/* follow[r]: bytes that can come right after rule r ends, over every call site (an
 * over-approximation is safe: it only leaves more tokens to check at run time). first[s]:
 * bytes that can come next from state s. A fixpoint, bounded; past the bound every follow
 * set is "any byte". */
static bool follow_sets(struct ab *b, const uint8_t *nullable) {
    struct gauto *au = b->au;
    uint64_t(*first)[4] = calloc(au->n_st, sizeof *first);
    if (!first) return fail_nomem(b);
    for (uint32_t r = 0; r < au->n_rules; r++)
        memset(au->rules[r].follow, 0, 32);
    bool changed = true;
    int round = 0;
    for (; changed && round < 64; round++) {
        changed = false;
        for (uint32_t s = au->n_st; s-- > 1;) {
            const struct gstate *g = &au->st[s];
            const struct grule *gr = &au->rules[g->rule];
            uint64_t f[4];
            memcpy(f, first[s], sizeof f);
            if (round == 0)
                for (int c = 0; c < 256; c++)
                    if (au->trans[g->trans + gr->cmap[c]]) gram_bit_set(f, (unsigned)c);
            for (uint32_t k = 0; k < g->n_calls; k++) {
                const struct gcall *c = &au->calls[g->calls + k];
                for (int w = 0; w < 4; w++) {
                    f[w] |= first[au->rules[c->rule].start][w];
                    if (nullable[c->rule]) f[w] |= first[c->ret][w];
                    uint64_t nf = au->rules[c->rule].follow[w] | first[c->ret][w];
                    if (nf != au->rules[c->rule].follow[w]) {
                        au->rules[c->rule].follow[w] = nf;
                        changed = true;
                    }
                }
            }
            if (g->flags & GS_FINAL)
                for (int w = 0; w < 4; w++)
                    f[w] |= gr->follow[w];
            if (memcmp(f, first[s], sizeof f)) {
                memcpy(first[s], f, sizeof f);
                changed = true;
            }
        }
    }
    if (changed)
        for (uint32_t r = 0; r < au->n_rules; r++)
            memset(au->rules[r].follow, 0xFF, 32);
    free(first);
    return true;
}

/* ---- entry --------------------------------------------------------------------------------------
 */

smelt_status gram_auto_build(struct gauto *out, const struct gast *ast, uint32_t root,
                             struct err *e) {
    memset(out, 0, sizeof *out);
    struct ab b = {.ast = ast, .au = out, .e = e};
    uint8_t *nullable = NULL, *productive = NULL;
    b.kept = malloc((ast->nrule + 1) * sizeof *b.kept);
    b.est = calloc(ast->nrule + 1, sizeof *b.est);
    if (!b.kept || !b.est) {
        fail_nomem(&b);
        goto done;
    }
    for (uint32_t r = 0; r < ast->nrule; r++)
        b.kept[r] = GRAM_NONE;
    if (!plan_rules(&b, root)) goto done;
    out->root = b.kept[root];
    /* state 0: dead (its transitions all lead to 0) */
    if (!gram_grow(&out->st, &out->cap_st, 1, sizeof *out->st, GRAM_MAX_DFA) ||
        !gram_grow(&out->trans, &out->cap_trans, 1, sizeof *out->trans, GRAM_MAX_DFA)) {
        fail_nomem(&b);
        goto done;
    }
    memset(&out->st[0], 0, sizeof out->st[0]);
    out->n_st = 1;
    out->trans[0] = 0;
    out->n_trans = 1;
    for (uint32_t r = 0; r < ast->nrule && !b.failed; r++) {
        if (b.kept[r] == GRAM_NONE) continue;
        b.nn = b.ne = 0;
        uint32_t s0 = nfa_new(&b);
        uint32_t fin = nfa_build(&b, ast->rule[r].body, s0);
        if (fin == GRAM_NONE || b.failed) break;
        if (!determinize(&b, b.kept[r], fin)) break;
    }
    if (b.failed) goto done;
    nullable = calloc(out->n_rules, 1);
    productive = calloc(out->n_rules, 1);
    if (!nullable || !productive) {
        fail_nomem(&b);
        goto done;
    }
    if (!rule_fixpoint(&b, true, productive)) goto done;
    if (!productive[out->root]) {
        err_set(e, SMELT_ERR_INVALID,
                "grammar: the root rule can never end (no finite text "
                "matches it)");
        b.failed = true;
        goto done;
    }
    if (!prune(&b, productive) || !rule_fixpoint(&b, false, nullable)) goto done;
    if (!check_left_recursion(&b, nullable) || !follow_sets(&b, nullable)) goto done;
done:
    free(b.kept);
    free(b.est);
    free(b.nfirst);
    free(b.ed);
    free(nullable);
    free(productive);
    if (b.failed) {
        gram_auto_free(out);
        return e ? e->code : SMELT_ERR_INVALID;
    }
    return SMELT_OK;
}

void gram_auto_free(struct gauto *au) {
    free(au->st);
    free(au->trans);
    free(au->calls);
    free(au->rules);
    memset(au, 0, sizeof *au);
}

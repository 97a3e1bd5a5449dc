/* Byte-level BPE on one pre-token.
 *
 * A pre-token's bytes start as one symbol each (the vocab's token for that byte); then,
 * as long as some adjacent pair has a merge, the pair with the lowest rank is merged,
 * the leftmost one among equal ranks. This is exactly Hugging Face's order (its BPE
 * model pops merges from a heap ordered by (rank, position)).
 *
 * Two implementations of that one rule:
 *  - short words (<= SHORT symbols, nearly all of them): arrays of ids and pair ranks;
 *    each step scans for the minimum and updates the two pairs next to the merge.
 *    O(n^2) but n is tiny and the data is one cache line.
 *  - long words: a doubly linked list of symbols and a binary min-heap of candidate
 *    pairs; stale entries are skipped when popped (their symbols changed). O(n log n),
 *    so a megabyte without spaces costs no more than a megabyte of words.
 * A per-call cache maps a pre-token's bytes to its ids: natural text repeats its words,
 * and a cache hit skips the merge loop. It lives in struct tok_ctx (one call), so the
 * struct tok stays immutable and threads never share it.
 */
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"

#define SHORT 32
#define DEAD (-1)

struct tok_sym {
    int32_t id;
    int32_t prev, next;
};

struct tok_heap_item {
    int32_t rank;
    int32_t left; /* symbol index: also the position for ties */
    int32_t a, b; /* the pair's ids when pushed (stale check) */
    int32_t merged;
};

/* ---- word cache ---- */

#define CACHE_MAX_WORD 64        /* longer pre-tokens are not cached */
#define CACHE_MAX_IDS (1u << 20) /* stop adding once this many ids are stored */

struct tok_wcache {
    uint32_t *slot; /* entry index + 1; 0 = empty */
    uint32_t mask, n;
    struct centry {
        uint64_t hash;
        uint32_t key_off, key_len;
        uint32_t ids_off, ids_len;
    } * e;
    uint32_t e_cap;
    uint8_t *keys;
    size_t keys_n, keys_cap;
    int32_t *ids;
    size_t ids_n, ids_cap;
    bool full; /* an allocation failed or the limit was reached: lookups only */
};

static void cache_free(struct tok_wcache *w) {
    if (!w) return;
    free(w->slot);
    free(w->e);
    free(w->keys);
    free(w->ids);
    free(w);
}

static const struct centry *cache_get(const struct tok_wcache *w, uint64_t h, const uint8_t *s,
                                      size_t n) {
    uint32_t i = (uint32_t)h & w->mask;
    for (;;) {
        uint32_t k = w->slot[i];
        if (!k) return NULL;
        const struct centry *e = &w->e[k - 1];
        if (e->hash == h && e->key_len == n && memcmp(w->keys + e->key_off, s, n) == 0) return e;
        i = (i + 1) & w->mask;
    }
}

/* Adds (s -> ids); on any failure the cache just stops growing. */
static void cache_put(struct tok_wcache *w, uint64_t h, const uint8_t *s, size_t n,
                      const int32_t *ids, size_t m) {
    if (w->full) return;
    if (w->ids_n + m > CACHE_MAX_IDS) {
        w->full = true;
        return;
    }
    if ((w->n + 1) * 2 > w->mask + 1) {
        uint32_t size = (w->mask + 1) * 2;
        uint32_t *slot = calloc(size, sizeof *slot);
        if (!slot) {
            w->full = true;
            return;
        }
        for (uint32_t k = 0; k < w->n; k++) {
            uint32_t i = (uint32_t)w->e[k].hash & (size - 1);
            while (slot[i])
                i = (i + 1) & (size - 1);
            slot[i] = k + 1;
        }
        free(w->slot);
        w->slot = slot;
        w->mask = size - 1;
    }
    size_t ecap = w->e_cap;
    if (!array_grow((void **)&w->e, &ecap, w->n + 1, sizeof *w->e) ||
        !array_grow((void **)&w->keys, &w->keys_cap, w->keys_n + n, 1) ||
        !array_grow((void **)&w->ids, &w->ids_cap, w->ids_n + m, sizeof *w->ids)) {
        w->full = true;
        return;
    }
    w->e_cap = (uint32_t)ecap;
    struct centry *e = &w->e[w->n];
    e->hash = h;
    e->key_off = (uint32_t)w->keys_n;
    e->key_len = (uint32_t)n;
    e->ids_off = (uint32_t)w->ids_n;
    e->ids_len = (uint32_t)m;
    memcpy(w->keys + w->keys_n, s, n);
    w->keys_n += n;
    memcpy(w->ids + w->ids_n, ids, m * sizeof *ids);
    w->ids_n += m;
    uint32_t i = (uint32_t)h & w->mask;
    while (w->slot[i])
        i = (i + 1) & w->mask;
    w->slot[i] = ++w->n;
}

static struct tok_wcache *cache_new(void) {
    struct tok_wcache *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->slot = calloc(1024, sizeof *w->slot);
    if (!w->slot) {
        free(w);
        return NULL;
    }
    w->mask = 1023;
    return w;
}

void tok_bpe_ctx_free(struct tok_ctx *c) {
    free(c->sym);
    free(c->heap);
    cache_free(c->cache);
    c->sym = NULL;
    c->heap = NULL;
    c->cache = NULL;
}

/* ---- merge loops ---- */

/* Merges ids[0..n) in place; returns the new count. */
static size_t merge_short(const struct tok *t, int32_t *ids, size_t n) {
    int32_t rank[SHORT], res[SHORT];
    /* The first lookups are independent: start all their cache misses at once (the merge
     * table of a 150k-merge vocab is 8 MiB). */
    for (size_t i = 0; i + 1 < n; i++)
        __builtin_prefetch(&t->merges[tok_merge_slot(t, ids[i], ids[i + 1])]);
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_merge *m = tok_merge_find(t, ids[i], ids[i + 1]);
        rank[i] = m ? m->rank : INT32_MAX;
        res[i] = m ? m->id : -1;
    }
    while (n > 1) {
        size_t best = 0;
        int32_t br = rank[0];
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < br) br = rank[i], best = i;
        if (br == INT32_MAX) break;
        ids[best] = res[best];
        /* remove symbol best+1 and pair best+1 */
        for (size_t i = best + 1; i + 1 < n; i++)
            ids[i] = ids[i + 1];
        for (size_t i = best + 1; i + 2 < n; i++)
            rank[i] = rank[i + 1], res[i] = res[i + 1];
        n--;
        if (best > 0) {
            const struct tok_merge *m = tok_merge_find(t, ids[best - 1], ids[best]);
            rank[best - 1] = m ? m->rank : INT32_MAX;
            res[best - 1] = m ? m->id : -1;
        }
        if (best + 1 < n) {
            const struct tok_merge *m = tok_merge_find(t, ids[best], ids[best + 1]);
            rank[best] = m ? m->rank : INT32_MAX;
            res[best] = m ? m->id : -1;
        }
    }
    return n;
}

static bool heap_less(const struct tok_heap_item *x, const struct tok_heap_item *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void heap_push(struct tok_heap_item *h, size_t *n, struct tok_heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct tok_heap_item heap_pop(struct tok_heap_item *h, size_t *n) {
    struct tok_heap_item top = h[0], last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t r = l + 1, k = (r < m && heap_less(&h[r], &h[l])) ? r : l;
        if (!heap_less(&h[k], &last)) break;
        h[i] = h[k];
        i = k;
    }
    if (m) h[i] = last;
    return top;
}

/* Heap merge over c->sym[0..n) (linked list); returns the ids, in order, in ids. */
static size_t merge_long(struct tok_ctx *c, size_t n, int32_t *ids) {
    const struct tok *t = c->t;
    struct tok_sym *s = c->sym;
    struct tok_heap_item *h = c->heap;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_merge *m = tok_merge_find(t, s[i].id, s[i + 1].id);
        if (m)
            heap_push(h, &hn,
                      (struct tok_heap_item){m->rank, (int32_t)i, s[i].id, s[i + 1].id, m->id});
    }
    while (hn) {
        struct tok_heap_item it = heap_pop(h, &hn);
        int32_t l = it.left, r = s[l].next;
        if (s[l].id != it.a || r < 0 || s[r].id != it.b) continue; /* stale */
        s[l].id = it.merged;
        s[r].id = DEAD;
        s[l].next = s[r].next;
        if (s[r].next >= 0) s[s[r].next].prev = l;
        /* Each merge removes a symbol and adds at most two pairs, so the heap never
         * holds more than 3n entries (sized so). */
        int32_t p = s[l].prev, q = s[l].next;
        if (p >= 0) {
            const struct tok_merge *m = tok_merge_find(t, s[p].id, s[l].id);
            if (m) heap_push(h, &hn, (struct tok_heap_item){m->rank, p, s[p].id, s[l].id, m->id});
        }
        if (q >= 0) {
            const struct tok_merge *m = tok_merge_find(t, s[l].id, s[q].id);
            if (m) heap_push(h, &hn, (struct tok_heap_item){m->rank, l, s[l].id, s[q].id, m->id});
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = s[i].next)
        ids[k++] = s[i].id;
    return k;
}

/* Merges the byte ids of w[0..n) into out (room for n); returns the count. Exposed to
 * tests through tok_bpe_word's two paths (force_long). */
static size_t bpe_ids(struct tok_ctx *c, const uint8_t *w, size_t n, int32_t *out,
                      bool force_long) {
    const struct tok *t = c->t;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) out[m++] = id; /* a byte with no token is dropped, as HF does */
    }
    if (m <= 1) return m;
    if (m <= SHORT && !force_long) return merge_short(t, out, m);
    struct tok_sym *s = c->sym;
    for (size_t i = 0; i < m; i++)
        s[i] = (struct tok_sym){out[i], (int32_t)i - 1, i + 1 < m ? (int32_t)i + 1 : -1};
    return merge_long(c, m, out);
}

smelt_status tok_bpe_word(struct tok_ctx *c, const uint8_t *w, size_t n) {
    const struct tok *t = c->t;
    struct tok_ids *out = c->out;
    if (n == 0) return SMELT_OK;
    if (t->pre.ignore_merges) {
        /* HF's ignore_merges: a pre-token that is itself a vocab token is that token. */
        int32_t id = tok_map_find(t, w, n);
        if (id >= 0 && t->type[id] != TOK_T_CONTROL && t->type[id] != TOK_T_UNKNOWN)
            return tok_ids_push(out, id);
    }
    if (n == 1) return t->byte_id[w[0]] >= 0 ? tok_ids_push(out, t->byte_id[w[0]]) : SMELT_OK;
    uint64_t h = 0;
    bool cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        if (!c->cache && !(c->cache = cache_new())) cacheable = false;
    }
    if (cacheable) {
        h = tok_hash(w, n);
        const struct centry *e = cache_get(c->cache, h, w, n);
        if (e) {
            if (out->n + e->ids_len > out->cap) {
                size_t cap = out->cap;
                if (!array_grow((void **)&out->v, &cap, out->n + e->ids_len, sizeof *out->v))
                    return SMELT_ERR_NOMEM;
                out->cap = cap;
            }
            memcpy(out->v + out->n, c->cache->ids + e->ids_off, e->ids_len * sizeof *out->v);
            out->n += e->ids_len;
            return SMELT_OK;
        }
    }
    /* Room for n ids at the end of out; merged in place there. */
    size_t cap = out->cap;
    if (!array_grow((void **)&out->v, &cap, out->n + n, sizeof *out->v)) return SMELT_ERR_NOMEM;
    out->cap = cap;
    if (n > SHORT) {
        if (!array_grow((void **)&c->sym, &c->sym_cap, n, sizeof *c->sym) ||
            !array_grow((void **)&c->heap, &c->heap_cap, 3 * n, sizeof *c->heap))
            return SMELT_ERR_NOMEM;
    }
    size_t m = bpe_ids(c, w, n, out->v + out->n, false);
    if (cacheable) cache_put(c->cache, h, w, n, out->v + out->n, m);
    out->n += m;
    return SMELT_OK;
}

/* Test hook: the ids of w by the heap path regardless of length (checks that both merge
 * loops agree). Not thread-safe with respect to c. */
smelt_status tok_bpe_word_long(struct tok_ctx *c, const uint8_t *w, size_t n);
smelt_status tok_bpe_word_long(struct tok_ctx *c, const uint8_t *w, size_t n) {
    struct tok_ids *out = c->out;
    size_t cap = out->cap;
    if (!array_grow((void **)&out->v, &cap, out->n + n, sizeof *out->v) ||
        !array_grow((void **)&c->sym, &c->sym_cap, n, sizeof *c->sym) ||
        !array_grow((void **)&c->heap, &c->heap_cap, 3 * n, sizeof *c->heap))
        return SMELT_ERR_NOMEM;
    out->cap = cap;
    out->n += bpe_ids(c, w, n, out->v + out->n, true);
    return SMELT_OK;
}

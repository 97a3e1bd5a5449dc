/* The vocabulary as the grammar engine sees it (gram.h): each token's bytes, a trie over
 * them in DFS order (children by byte, so a walk skips a refused subtree in one step), the
 * JSON-string slice and its trie of the remaining tokens.
 *
 * The slice is llguidance's "slicer" idea: inside a JSON string nearly every token is made of
 * plain string characters (on Qwen2.5's 151,643 text tokens: 146,706; docs/structured-output.md),
 * so a state that takes any number of them adds the slice as a precomputed bitset and walks
 * only the trie of the other ~5,000 tokens. States that take at most k such characters (a
 * maxLength) add the slice's tokens of at most k characters (cum).
 */
#include <string.h>

#include "grammar/gram_int.h"
#include "util/utf8.h"

struct sorter {
    const uint8_t *bytes;
    const uint32_t *off;
    const uint16_t *len;
};

static _Thread_local const struct sorter *g_sort; /* qsort has no context argument */

static int cmp_piece(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    const struct sorter *s = g_sort;
    uint32_t la = s->len[a], lb = s->len[b];
    int c = memcmp(s->bytes + s->off[a], s->bytes + s->off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Builds a trie of the tokens ids[0..n) (sorted by piece). */
static bool build_trie(struct gtrie *t, struct gram_vocab *v, const int32_t *ids, uint32_t n) {
    memset(t, 0, sizeof *t);
    size_t total = 1;
    for (uint32_t k = 0; k < n; k++)
        total += v->len[ids[k]];
    t->n = malloc(total * sizeof *t->n);
    uint32_t *path = malloc((v->max_len + 2) * sizeof *path);
    if (!t->n || !path) {
        free(path);
        return false;
    }
    t->n[0] = (struct gtnode){0, -1, 0, 0};
    uint32_t nn = 1, cur = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    path[0] = 0;
    for (uint32_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        const uint8_t *p = v->bytes + v->off[id];
        uint32_t len = v->len[id], l = 0;
        while (prev && l < len && l < prev_len && p[l] == prev[l])
            l++;
        for (uint32_t d = cur; d > l; d--)
            t->n[path[d]].next = nn;
        for (uint32_t d = l + 1; d <= len; d++) {
            t->n[nn] = (struct gtnode){0, -1, (uint16_t)d, p[d - 1]};
            path[d] = nn++;
        }
        struct gtnode *last = &t->n[path[len]];
        if (last->tok < 0) {
            last->tok = id;
        } else {
            int32_t x = last->tok;
            while (v->dup[x] >= 0)
                x = v->dup[x];
            v->dup[x] = id;
        }
        cur = len;
        prev = p;
        prev_len = len;
    }
    for (uint32_t d = cur; d > 0; d--)
        t->n[path[d]].next = nn;
    t->n[0].next = nn;
    t->nn = nn;
    for (uint32_t i = 1; i < nn; i++)
        if (t->n[i].depth == 1) t->root[t->n[i].byte] = i;
    free(path);
    /* child tables of the wide nodes */
    uint32_t nw = 0;
    t->wide = calloc(nn, sizeof *t->wide);
    if (!t->wide) return false;
    for (uint32_t i = 1; i < nn; i++) {
        uint32_t k = 0;
        for (uint32_t c = i + 1; c < t->n[i].next; c = t->n[c].next)
            k++;
        if (k >= GRAM_WIDE) t->wide[i] = ++nw;
    }
    t->tab = calloc((size_t)nw * 257 + 1, sizeof *t->tab);
    if (!t->tab) return false;
    for (uint32_t i = 1; i < nn; i++) {
        if (!t->wide[i]) continue;
        uint32_t *tab = t->tab + (size_t)(t->wide[i] - 1) * 257;
        for (uint32_t c = i + 1; c < t->n[i].next; c = t->n[c].next)
            tab[t->n[c].byte] = c, tab[256]++;
    }
    return true;
}

/* Characters of a token made of JSON string characters (a last one may be incomplete), or 0
 * when it has another byte (or more than 255 characters). */
static uint8_t slice_chars(const uint8_t *p, uint32_t n) {
    uint32_t i = 0, c = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = utf8_decode(p + i, n - i, &cp);
        if (k == 0) /* a last character may be incomplete: it counts as one */
            return n - i > 0 && utf8_incomplete_len(p + i, n - i) == n - i && c < 255
                       ? (uint8_t)(c + 1)
                       : 0;
        if (cp == '"' || cp == '\\' || cp < 0x20) return 0;
        i += (uint32_t)k;
        if (++c > 255) return 0;
    }
    return (uint8_t)c;
}

static smelt_status build(struct gram_vocab *v, struct err *e) {
    int32_t *ids = malloc((size_t)v->n * sizeof *ids);
    v->dup = malloc((size_t)v->n * sizeof *v->dup);
    v->s1n = calloc((size_t)v->n, 1);
    v->words = (uint32_t)gram_mask_words(v->n);
    if (!ids || !v->dup || !v->s1n) goto oom;
    uint32_t nt = 0;
    for (int32_t i = 0; i < v->n; i++) {
        v->dup[i] = -1;
        if (v->kind[i] == GV_TEXT) {
            ids[nt++] = i;
            if (v->len[i] > v->max_len) v->max_len = v->len[i];
        }
    }
    struct sorter s = {v->bytes, v->off, v->len};
    g_sort = &s;
    qsort(ids, nt, sizeof *ids, cmp_piece);
    g_sort = NULL;
    if (!build_trie(&v->all, v, ids, nt)) goto oom;
    uint32_t nr = 0;
    for (uint32_t k = 0; k < nt; k++) {
        int32_t id = ids[k];
        v->s1n[id] = slice_chars(v->bytes + v->off[id], v->len[id]);
        if (v->s1n[id] > v->s1max) v->s1max = v->s1n[id];
        if (!v->s1n[id]) ids[nr++] = id; /* stays sorted */
    }
    /* the rest trie shares dup chains with the full one: tokens of one piece are all in the
     * slice or all outside, so the chains agree; reset the rest's own marks first */
    for (uint32_t k = 0; k < nr; k++)
        v->dup[ids[k]] = -1;
    if (!build_trie(&v->rest, v, ids, nr)) goto oom;
    v->cum = calloc(((size_t)v->s1max + 1) * v->words, sizeof *v->cum);
    if (!v->cum) goto oom;
    for (int32_t i = 0; i < v->n; i++)
        if (v->s1n[i]) v->cum[(size_t)v->s1n[i] * v->words + ((uint32_t)i >> 5)] |= 1u << (i & 31);
    for (uint32_t k = 1; k <= v->s1max; k++)
        for (uint32_t w = 0; w < v->words; w++)
            v->cum[(size_t)k * v->words + w] |= v->cum[(size_t)(k - 1) * v->words + w];
    free(ids);
    return SMELT_OK;
oom:
    free(ids);
    return err_set(e, SMELT_ERR_NOMEM, "grammar vocabulary: out of memory (%d tokens)", v->n);
}

static struct gram_vocab *alloc_vocab(int32_t n, size_t bytes) {
    struct gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    pthread_mutex_init(&v->ds_mu, NULL);
    v->ds = calloc(GRAM_DS_MAX, sizeof *v->ds);
    v->n = n;
    v->kind = calloc((size_t)n + 1, 1);
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    v->len = calloc((size_t)n + 1, sizeof *v->len);
    v->bytes = malloc(bytes + 1);
    if (!v->kind || !v->off || !v->len || !v->bytes || !v->ds) {
        gram_vocab_free(v);
        return NULL;
    }
    return v;
}

smelt_status gram_vocab_new_raw(struct gram_vocab **out, int32_t n, const char *const *pieces,
                                const size_t *lens, const int32_t *eog, int32_t n_eog,
                                struct err *e) {
    *out = NULL;
    if (n <= 0) return err_set(e, SMELT_ERR_INVALID, "grammar vocabulary: %d tokens", n);
    size_t bytes = 0;
    for (int32_t i = 0; i < n; i++)
        if (pieces[i] && lens[i] <= GRAM_MAX_PIECE) bytes += lens[i];
    struct gram_vocab *v = alloc_vocab(n, bytes);
    if (!v) return err_set(e, SMELT_ERR_NOMEM, "grammar vocabulary: out of memory");
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)at;
        if (!pieces[i] || lens[i] == 0 || lens[i] > GRAM_MAX_PIECE) continue;
        memcpy(v->bytes + at, pieces[i], lens[i]);
        v->len[i] = (uint16_t)lens[i];
        v->kind[i] = GV_TEXT;
        at += lens[i];
    }
    v->eog = malloc(((size_t)n_eog + 1) * sizeof *v->eog);
    if (!v->eog) {
        gram_vocab_free(v);
        return err_set(e, SMELT_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    for (int32_t k = 0; k < n_eog; k++) {
        if (eog[k] < 0 || eog[k] >= n) continue;
        v->kind[eog[k]] = GV_EOG;
        v->eog[v->n_eog++] = eog[k];
    }
    smelt_status st = build(v, e);
    if (st != SMELT_OK) {
        gram_vocab_free(v);
        return st;
    }
    *out = v;
    return SMELT_OK;
}

smelt_status gram_vocab_new(struct gram_vocab **out, const struct tok *t, unsigned flags,
                            struct err *e) {
    *out = NULL;
    int32_t n = tok_n_vocab(t);
    if (n <= 0) return err_set(e, SMELT_ERR_INVALID, "grammar vocabulary: %d tokens", n);
    size_t bytes = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        tok_piece(t, i, &len);
        if (len <= GRAM_MAX_PIECE) bytes += len;
    }
    struct gram_vocab *v = alloc_vocab(n, bytes);
    if (v) v->eog = malloc(((size_t)n + 1) * sizeof *v->eog);
    if (!v || !v->eog) {
        gram_vocab_free(v);
        return err_set(e, SMELT_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = (uint32_t)at;
        if (tok_is_eog(t, i)) {
            v->kind[i] = GV_EOG;
            v->eog[v->n_eog++] = i;
            continue;
        }
        enum tok_type ty = tok_token_type(t, i);
        if ((ty == TOK_T_CONTROL && !(flags & GRAM_VOCAB_CONTROL)) || ty == TOK_T_UNKNOWN ||
            ty == TOK_T_UNUSED)
            continue;
        size_t len;
        const char *p = tok_piece(t, i, &len);
        if (len == 0 || len > GRAM_MAX_PIECE) continue;
        memcpy(v->bytes + at, p, len);
        v->len[i] = (uint16_t)len;
        v->kind[i] = GV_TEXT;
        at += len;
    }
    smelt_status st = build(v, e);
    if (st != SMELT_OK) {
        gram_vocab_free(v);
        return st;
    }
    *out = v;
    return SMELT_OK;
}

void gram_vocab_free(struct gram_vocab *v) {
    if (!v) return;
    free(v->kind);
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->dup);
    free(v->eog);
    free(v->all.n);
    free(v->rest.n);
    free(v->all.wide);
    free(v->all.tab);
    free(v->rest.wide);
    free(v->rest.tab);
    free(v->s1n);
    free(v->cum);
    for (uint32_t k = 0; k < v->n_ds; k++) {
        free(v->ds[k].cum);
        free(v->ds[k].mixed);
    }
    free(v->ds);
    pthread_mutex_destroy(&v->ds_mu);
    free(v);
}

int32_t gram_vocab_n(const struct gram_vocab *v) {
    return v->n;
}

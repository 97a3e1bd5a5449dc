/* Compiling grammars (each input kind -> GBNF -> expression trees -> automaton), their
 * reference counts, and the cache of compiled grammars (gram.h). */
#include <string.h>

#include "grammar/gram_int.h"
#include "util/mix.h"

/* Trie nodes the compile-time warm-up may walk (computing the masks of the states reachable
 * from the start); the rest are computed on first use. */
#define WARM_NODES (128u << 10)

/* Any JSON value, and the root an object (response_format json_object). Whitespace is
 * bounded as in llama.cpp's schema grammars, so that a model cannot pad forever. */
static const char JSON_OBJECT_GBNF[] =
    "root ::= object\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value ( \",\" ws string \":\" ws value )* )? \"}\" ws\n"
    "array ::= \"[\" ws ( value ( \",\" ws value )* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} "
    ") )* "
    "\"\\\"\" ws\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
    "[0-9]{1,16} )? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

smelt_status gram_to_gbnf(enum gram_kind kind, const char *text, size_t len, struct tok_buf *out,
                          struct err *e) {
    switch (kind) {
    case GRAM_GBNF:
        if (!gram_buf_put(out, text, len))
            return err_set(e, SMELT_ERR_RANGE, "grammar: %zu bytes (at most %u)", len,
                           GRAM_MAX_TEXT);
        return SMELT_OK;
    case GRAM_JSON_OBJECT:
        return gram_buf_puts(out, JSON_OBJECT_GBNF) ? SMELT_OK
                                                    : err_set(e, SMELT_ERR_NOMEM, "out of memory");
    case GRAM_REGEX: {
        if (!gram_buf_puts(out, "root ::= ")) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        smelt_status st = gram_regex_gbnf(text, len, GRAM_RE_TEXT, out, e);
        if (st == SMELT_OK && !gram_buf_puts(out, "\n"))
            st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        return st;
    }
    case GRAM_JSON_SCHEMA: {
        if (len > GRAM_MAX_TEXT)
            return err_set(e, SMELT_ERR_RANGE, "schema: %zu bytes (at most %u)", len,
                           GRAM_MAX_TEXT);
        json_error_t je;
        json_t *j = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!j)
            return err_set(e, SMELT_ERR_INVALID, "schema: not JSON (line %d column %d: %s)",
                           je.line, je.column, je.text);
        smelt_status st = gram_schema_to_gbnf(j, out, e);
        json_decref(j);
        return st;
    }
    }
    return err_set(e, SMELT_ERR_INVALID, "grammar: unknown kind %d", (int)kind);
}

smelt_status gram_compile(struct gram **out, const struct gram_vocab *v, enum gram_kind kind,
                          const char *text, size_t len, struct err *e) {
    *out = NULL;
    struct tok_buf gbnf = {0};
    struct gast ast;
    gram_ast_init(&ast);
    struct gram *g = NULL;
    smelt_status st = gram_to_gbnf(kind, text ? text : "", text ? len : 0, &gbnf, e);
    uint32_t root = 0;
    if (st == SMELT_OK) st = gram_gbnf_parse(&ast, gbnf.p ? gbnf.p : "", gbnf.n, &root, e);
    if (st != SMELT_OK) goto done;
    g = calloc(1, sizeof *g);
    if (!g) {
        st = err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
        goto done;
    }
    atomic_init(&g->refs, 1);
    g->v = v;
    pthread_mutex_init(&g->mu, NULL);
    gram_stk_init(&g->lstk);
    st = gram_auto_build(&g->a, &ast, root, e);
    if (st != SMELT_OK) goto done;
    gram_sim_init(&g->lsim, &g->a, &g->lstk, true);
    g->ci = calloc(g->a.n_st, sizeof *g->ci);
    if (!g->ci) {
        st = err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
        goto done;
    }
    st = gram_mask_slices(g, e);
    if (st != SMELT_OK) goto done;
    gram_mask_warm(g, WARM_NODES);
done:
    gram_ast_free(&ast);
    tok_buf_free(&gbnf);
    if (st != SMELT_OK) {
        gram_unref(g);
        return st;
    }
    *out = g;
    return SMELT_OK;
}

struct gram *gram_ref(struct gram *g) {
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    return g;
}

void gram_unref(struct gram *g) {
    if (!g || atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1) return;
    if (g->ci)
        for (uint32_t s = 0; s < g->a.n_st; s++)
            gram_ci_free(atomic_load(&g->ci[s]));
    free(g->ci);
    free(g->sl);
    free(g->dsl);
    free(g->dsl_k);
    free(g->ds_onpath);
    free(g->bytes);
    free(g->nbytes);
    free(g->ds_path);
    gram_sim_free(&g->lsim);
    gram_stk_free(&g->lstk);
    gram_auto_free(&g->a);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

size_t gram_n_states(const struct gram *g) {
    return g->a.n_st;
}

const struct gram_vocab *gram_vocab_of(const struct gram *g) {
    return g->v;
}

size_t gram_memory(const struct gram *g) {
    struct gram *m = (struct gram *)g; /* the lock guards ci_bytes */
    pthread_mutex_lock(&m->mu);
    size_t n = sizeof *g + g->ci_bytes + (size_t)g->a.n_st * (sizeof *g->a.st + sizeof *g->ci + 4) +
               (size_t)g->a.n_trans * 4 + (size_t)g->a.n_calls * sizeof *g->a.calls +
               (size_t)g->a.n_rules * sizeof *g->a.rules;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* ---- the cache ----------------------------------------------------------------------------- */

struct centry {
    uint64_t h, used;
    enum gram_kind kind;
    char *text;
    size_t len;
    struct gram *g;
};

struct gram_cache {
    pthread_mutex_t mu;
    const struct gram_vocab *v;
    struct centry *e;
    int32_t n, max;
    size_t max_bytes;
    uint64_t clock;
};

static uint64_t text_hash(enum gram_kind kind, const char *s, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001B3ull;
    return mix64(h ^ n);
}

smelt_status gram_cache_new(struct gram_cache **out, const struct gram_vocab *v,
                            int32_t max_entries, size_t max_bytes, struct err *e) {
    *out = NULL;
    if (max_entries < 1 || max_entries > 1 << 20)
        return err_set(e, SMELT_ERR_INVALID, "grammar cache: %d entries (1..%d)", max_entries,
                       1 << 20);
    struct gram_cache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)max_entries, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return err_set(e, SMELT_ERR_NOMEM, "grammar cache: out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->v = v;
    c->max = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return SMELT_OK;
}

void gram_cache_free(struct gram_cache *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->n; i++) {
        free(c->e[i].text);
        gram_unref(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static struct centry *find(struct gram_cache *c, uint64_t h, enum gram_kind kind, const char *text,
                           size_t len) {
    for (int32_t i = 0; i < c->n; i++) {
        struct centry *x = &c->e[i];
        if (x->h == h && x->kind == kind && x->len == len && memcmp(x->text, text, len) == 0)
            return x;
    }
    return NULL;
}

smelt_status gram_cache_get(struct gram_cache *c, enum gram_kind kind, const char *text, size_t len,
                            struct gram **out, bool *hit, struct err *e) {
    *out = NULL;
    if (hit) *hit = false;
    if (!text) text = "", len = 0;
    uint64_t h = text_hash(kind, text, len);
    pthread_mutex_lock(&c->mu);
    struct centry *x = find(c, h, kind, text, len);
    if (x) {
        x->used = ++c->clock;
        *out = gram_ref(x->g);
        pthread_mutex_unlock(&c->mu);
        if (hit) *hit = true;
        return SMELT_OK;
    }
    pthread_mutex_unlock(&c->mu);
    /* compile unlocked: other requests keep using the cache meanwhile */
    struct gram *g;
    smelt_status st = gram_compile(&g, c->v, kind, text, len, e);
    if (st != SMELT_OK) return st;
    char *copy = malloc(len + 1);
    if (!copy) {
        *out = g; /* usable, just not cached */
        return SMELT_OK;
    }
    memcpy(copy, text, len);
    pthread_mutex_lock(&c->mu);
    x = find(c, h, kind, text, len);
    if (x) { /* another thread compiled it meanwhile: share theirs */
        free(copy);
        gram_unref(g);
        x->used = ++c->clock;
        *out = gram_ref(x->g);
        pthread_mutex_unlock(&c->mu);
        return SMELT_OK;
    }
    /* room: fewer than max entries, and their memory with the new one within max_bytes */
    size_t bytes = gram_memory(g);
    for (int32_t i = 0; i < c->n; i++)
        bytes += gram_memory(c->e[i].g);
    while (c->n && (c->n == c->max || bytes > c->max_bytes)) {
        int32_t old = 0;
        for (int32_t i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[old].used) old = i;
        bytes -= gram_memory(c->e[old].g);
        free(c->e[old].text);
        gram_unref(c->e[old].g);
        c->e[old] = c->e[--c->n];
    }
    c->e[c->n++] = (struct centry){h, ++c->clock, kind, copy, len, gram_ref(g)};
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return SMELT_OK;
}

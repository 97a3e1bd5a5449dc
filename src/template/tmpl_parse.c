/* Chat-template parser: tokens -> AST, following jinja2 3.1's Parser rule for rule
 * (operator precedence, tuple rules, test-argument shorthand, adjacent string
 * concatenation), so that anything jinja2 accepts parses the same way here.
 *
 * Precedence, loosest first: `x if c else y`, or, and, not, comparisons (chained,
 * in, not in), + -, ~, * / // %, **, unary - +, then postfix (.attr [sub] (call)),
 * then filters `|f` and tests `is t` (binding tighter than any binary operator).
 *
 * The AST lives in a bump pool owned by the template; names are interned there so that
 * scope lookups compare pointers. Recursion depth is capped (TMPL_MAX_NEST) so a
 * hostile template cannot overflow the stack while parsing.
 */
#include "template/tmpl_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- pool */

struct pool_chunk {
    struct pool_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

struct tmpl_pool {
    struct pool_chunk *head;
};

void *pool_alloc(struct tmpl_pool *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct pool_chunk *c = p->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = p->head;
        p->head = c;
    }
    void *r = c->data + c->used;
    c->used += n;
    memset(r, 0, n);
    return r;
}

static void pool_free(struct tmpl_pool *p) {
    if (!p) return;
    struct pool_chunk *c = p->head;
    while (c) {
        struct pool_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    free(p);
}

/* ---------------------------------------------------------------- parser state */

struct ps {
    struct tokens *tk;
    size_t i;
    struct tmpl *t;
    struct err *e;
    int depth;
    int loops; /* enclosing for loops (break/continue allowed) */
    struct tstr **names; /* intern table (open addressing) */
    size_t ncap, nn;
    bool failed;
};

static const struct token *cur(struct ps *p) { return &p->tk->v[p->i]; }
static const struct token *peek(struct ps *p, size_t k) {
    size_t j = p->i + k;
    return &p->tk->v[j < p->tk->n ? j : p->tk->n - 1];
}
static void adv(struct ps *p) {
    if (p->i + 1 < p->tk->n) p->i++;
}

static void *fail_at(struct ps *p, const struct token *tk, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void *fail_at(struct ps *p, const struct token *tk, const char *fmt, ...) {
    if (p->failed) return NULL;
    p->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(p->e, SMELT_ERR_FORMAT, "line %u col %u: %s", tk->line, tk->col, msg);
    return NULL;
}

static void *nomem(struct ps *p) {
    if (!p->failed) {
        p->failed = true;
        err_set(p->e, SMELT_ERR_NOMEM, "out of memory parsing the template");
    }
    return NULL;
}

/* A description of a token for messages: 'foo', end of statement block, ... */
static const char *describe(const struct token *tk, char *buf, size_t n) {
    if (tk->kind == T_NAME || tk->kind == T_INT || tk->kind == T_FLOAT)
        snprintf(buf, n, "'%.*s'", (int)(tk->len < 40 ? tk->len : 40), tk->p);
    else if (tk->kind == T_STRING) snprintf(buf, n, "string");
    else if (tk->kind >= T_ADD) snprintf(buf, n, "'%s'", tmpl_tok_name(tk->kind));
    else snprintf(buf, n, "%s", tmpl_tok_name(tk->kind));
    return buf;
}

static bool is_name(const struct token *tk, const char *name) {
    size_t n = strlen(name);
    return tk->kind == T_NAME && tk->len == n && !memcmp(tk->p, name, n);
}

static bool expect(struct ps *p, int kind) {
    if (cur(p)->kind == kind) {
        adv(p);
        return true;
    }
    char d[64];
    if (cur(p)->kind == T_EOF) fail_at(p, cur(p), "unexpected end of template, expected '%s'", tmpl_tok_name(kind));
    else fail_at(p, cur(p), "expected '%s', got %s", tmpl_tok_name(kind), describe(cur(p), d, sizeof d));
    return false;
}

static bool expect_name(struct ps *p, const char *name) {
    if (is_name(cur(p), name)) {
        adv(p);
        return true;
    }
    char d[64];
    fail_at(p, cur(p), "expected '%s', got %s", name, describe(cur(p), d, sizeof d));
    return false;
}

static struct tstr *pool_str(struct ps *p, const char *s, size_t len) {
    struct tstr *t = pool_alloc(p->t->pool, sizeof(struct tstr) + len + 1);
    if (!t) return nomem(p);
    t->h.rc = RC_FROZEN;
    t->h.kind = TV_STR;
    t->len = len;
    memcpy(t->s, s, len);
    t->s[len] = 0;
    t->ncp = utf8_count(s, len);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    t->hash = h ? h : 1; /* as tmpl_value.c's str_hash */
    return t;
}

static struct tstr *intern(struct ps *p, const char *s, size_t len) {
    if (p->nn * 2 >= p->ncap) {
        size_t nc = p->ncap ? p->ncap * 2 : 256;
        struct tstr **nv = calloc(nc, sizeof *nv);
        if (!nv) return nomem(p);
        for (size_t i = 0; i < p->ncap; i++) {
            if (!p->names[i]) continue;
            size_t j = p->names[i]->hash & (nc - 1);
            while (nv[j]) j = (j + 1) & (nc - 1);
            nv[j] = p->names[i];
        }
        free(p->names);
        p->names = nv;
        p->ncap = nc;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    size_t j = h & (p->ncap - 1);
    while (p->names[j]) {
        struct tstr *t = p->names[j];
        if (t->len == len && !memcmp(t->s, s, len)) return t;
        j = (j + 1) & (p->ncap - 1);
    }
    struct tstr *t = pool_str(p, s, len);
    if (!t) return NULL;
    p->names[j] = t;
    p->nn++;
    return t;
}

static struct node *nd(struct ps *p, int kind, const struct token *tk) {
    struct node *n = pool_alloc(p->t->pool, sizeof *n);
    if (!n) return nomem(p);
    n->kind = (uint8_t)kind;
    n->line = tk->line;
    n->col = tk->col;
    return n;
}

/* A growable node list in the pool (old arrays are left behind: the AST is small). */
struct nvec {
    struct node **v;
    uint32_t n, cap;
};

static bool nv_push(struct ps *p, struct nvec *v, struct node *x) {
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        if (nc > (1u << 24)) return fail_at(p, cur(p), "too many items"), false;
        struct node **nv = pool_alloc(p->t->pool, nc * sizeof *nv);
        if (!nv) return nomem(p), false;
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return true;
}

static bool enter(struct ps *p) {
    if (++p->depth > TMPL_MAX_NEST) {
        fail_at(p, cur(p), "template nested too deeply (limit %d)", TMPL_MAX_NEST);
        return false;
    }
    return true;
}
static void leave(struct ps *p) { p->depth--; }

/* ---------------------------------------------------------------- expressions */

static struct node *parse_expression(struct ps *p, bool with_condexpr);
static struct node *parse_tuple(struct ps *p, bool simplified, bool with_condexpr,
                                const char *const *extra_end, bool explicit_paren,
                                bool with_namespace);
static struct node *parse_unary(struct ps *p, bool with_filter);
static struct node *parse_primary(struct ps *p, bool with_namespace);
static struct node *parse_postfix(struct ps *p, struct node *n);
static struct node *parse_filter(struct ps *p, struct node *n, bool start_inline);
static struct node *parse_filter_expr(struct ps *p, struct node *n);

static struct node *binop(struct ps *p, int kind, int op, const struct token *tk,
                          struct node *a, struct node *b) {
    struct node *n = nd(p, kind, tk);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static struct node *parse_condexpr(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *e1 = parse_expression(p, false);
    if (!e1) return NULL;
    while (is_name(cur(p), "if")) {
        adv(p);
        struct node *e2 = parse_expression(p, false);
        if (!e2) return NULL;
        struct node *e3 = NULL;
        if (is_name(cur(p), "else")) {
            adv(p);
            if (!enter(p)) return NULL;
            e3 = parse_condexpr(p);
            leave(p);
            if (!e3) return NULL;
        }
        struct node *n = nd(p, N_CONDEXPR, tk);
        if (!n) return NULL;
        n->a = e2; /* condition */
        n->b = e1; /* then */
        n->c = e3; /* else (NULL: undefined) */
        e1 = n;
        tk = cur(p);
    }
    return e1;
}

static struct node *parse_compare(struct ps *p);

static struct node *parse_not(struct ps *p) {
    if (is_name(cur(p), "not")) {
        const struct token *tk = cur(p);
        adv(p);
        if (!enter(p)) return NULL;
        struct node *x = parse_not(p);
        leave(p);
        if (!x) return NULL;
        struct node *n = nd(p, N_NOT, tk);
        if (!n) return NULL;
        n->a = x;
        return n;
    }
    return parse_compare(p);
}

static struct node *parse_and(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *l = parse_not(p);
    while (l && is_name(cur(p), "and")) {
        adv(p);
        struct node *r = parse_not(p);
        if (!r) return NULL;
        l = binop(p, N_AND, 0, tk, l, r);
        tk = cur(p);
    }
    return l;
}

static struct node *parse_or(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *l = parse_and(p);
    while (l && is_name(cur(p), "or")) {
        adv(p);
        struct node *r = parse_and(p);
        if (!r) return NULL;
        l = binop(p, N_OR, 0, tk, l, r);
        tk = cur(p);
    }
    return l;
}

static struct node *parse_expression(struct ps *p, bool with_condexpr) {
    if (!enter(p)) return NULL;
    struct node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return n;
}

static struct node *parse_pow(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *l = parse_unary(p, true);
    while (l && cur(p)->kind == T_POW) {
        adv(p);
        struct node *r = parse_unary(p, true);
        if (!r) return NULL;
        l = binop(p, N_BINOP, T_POW, tk, l, r);
        tk = cur(p);
    }
    return l;
}

static struct node *parse_math2(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *l = parse_pow(p);
    while (l) {
        int k = cur(p)->kind;
        if (k != T_MUL && k != T_DIV && k != T_FLOORDIV && k != T_MOD) break;
        adv(p);
        struct node *r = parse_pow(p);
        if (!r) return NULL;
        l = binop(p, N_BINOP, k, tk, l, r);
        tk = cur(p);
    }
    return l;
}

static struct node *parse_concat(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *first = parse_math2(p);
    if (!first || cur(p)->kind != T_TILDE) return first;
    struct nvec v = {0};
    if (!nv_push(p, &v, first)) return NULL;
    while (cur(p)->kind == T_TILDE) {
        adv(p);
        struct node *x = parse_math2(p);
        if (!x || !nv_push(p, &v, x)) return NULL;
    }
    struct node *n = nd(p, N_CONCAT, tk);
    if (!n) return NULL;
    n->args = v.v;
    n->n_args = v.n;
    return n;
}

static struct node *parse_math1(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *l = parse_concat(p);
    while (l) {
        int k = cur(p)->kind;
        if (k != T_ADD && k != T_SUB) break;
        adv(p);
        struct node *r = parse_concat(p);
        if (!r) return NULL;
        l = binop(p, N_BINOP, k, tk, l, r);
        tk = cur(p);
    }
    return l;
}

static struct node *parse_compare(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *e = parse_math1(p);
    if (!e) return NULL;
    struct nvec v = {0};
    uint8_t opsbuf[64];
    uint8_t *ops = opsbuf;
    uint32_t nops = 0;
    for (;;) {
        int k = cur(p)->kind, op;
        if (k == T_EQ || k == T_NE || k == T_LT || k == T_LTEQ || k == T_GT || k == T_GTEQ) {
            op = k;
            adv(p);
        } else if (is_name(cur(p), "in")) {
            op = CMP_IN;
            adv(p);
        } else if (is_name(cur(p), "not") && is_name(peek(p, 1), "in")) {
            op = CMP_NOTIN;
            adv(p);
            adv(p);
        } else {
            break;
        }
        if (nops >= sizeof opsbuf) return fail_at(p, cur(p), "comparison chain too long");
        struct node *r = parse_math1(p);
        if (!r || !nv_push(p, &v, r)) return NULL;
        ops[nops++] = (uint8_t)op;
    }
    if (!nops) return e;
    struct node *n = nd(p, N_COMPARE, tk);
    if (!n) return NULL;
    n->a = e;
    n->args = v.v;
    n->n_args = v.n;
    n->ops = pool_alloc(p->t->pool, nops);
    if (!n->ops) return nomem(p);
    memcpy(n->ops, ops, nops);
    return n;
}

static struct node *parse_unary(struct ps *p, bool with_filter) {
    if (!enter(p)) return NULL;
    const struct token *tk = cur(p);
    struct node *n;
    if (tk->kind == T_SUB || tk->kind == T_ADD) {
        adv(p);
        struct node *x = parse_unary(p, false);
        if (!x) return leave(p), NULL;
        n = nd(p, tk->kind == T_SUB ? N_NEG : N_POS, tk);
        if (n) n->a = x;
    } else {
        n = parse_primary(p, false);
    }
    if (n) n = parse_postfix(p, n);
    if (n && with_filter) n = parse_filter_expr(p, n);
    leave(p);
    return n;
}

static struct node *parse_list(struct ps *p) {
    struct node *n = nd(p, N_LIST, cur(p));
    if (!n || !expect(p, T_LBRACKET)) return NULL;
    struct nvec v = {0};
    while (cur(p)->kind != T_RBRACKET) {
        if (v.n && !expect(p, T_COMMA)) return NULL;
        if (cur(p)->kind == T_RBRACKET) break;
        struct node *x = parse_expression(p, true);
        if (!x || !nv_push(p, &v, x)) return NULL;
    }
    if (!expect(p, T_RBRACKET)) return NULL;
    n->args = v.v;
    n->n_args = v.n;
    return n;
}

static struct node *parse_dict(struct ps *p) {
    struct node *n = nd(p, N_DICT, cur(p));
    if (!n || !expect(p, T_LBRACE)) return NULL;
    struct nvec k = {0}, v = {0};
    while (cur(p)->kind != T_RBRACE) {
        if (k.n && !expect(p, T_COMMA)) return NULL;
        if (cur(p)->kind == T_RBRACE) break;
        struct node *kx = parse_expression(p, true);
        if (!kx || !expect(p, T_COLON)) return NULL;
        struct node *vx = parse_expression(p, true);
        if (!vx || !nv_push(p, &k, kx) || !nv_push(p, &v, vx)) return NULL;
    }
    if (!expect(p, T_RBRACE)) return NULL;
    n->args = k.v;
    n->args2 = v.v;
    n->n_args = k.n;
    return n;
}

static struct node *parse_primary(struct ps *p, bool with_namespace) {
    const struct token *tk = cur(p);
    struct node *n;
    char d[64];
    switch (tk->kind) {
    case T_NAME:
        adv(p);
        if (is_name(tk, "true") || is_name(tk, "True") || is_name(tk, "false") || is_name(tk, "False")) {
            n = nd(p, N_CONST, tk);
            if (n) n->v = tv_bool(tk->p[0] == 't' || tk->p[0] == 'T');
            return n;
        }
        if (is_name(tk, "none") || is_name(tk, "None")) {
            n = nd(p, N_CONST, tk);
            if (n) n->v = tv_none();
            return n;
        }
        if (with_namespace && cur(p)->kind == T_DOT) {
            adv(p);
            const struct token *at = cur(p);
            if (!expect(p, T_NAME)) return NULL;
            n = nd(p, N_NSREF, tk);
            if (!n) return NULL;
            n->s = intern(p, tk->p, tk->len);
            n->s2 = intern(p, at->p, at->len);
            return n->s && n->s2 ? n : NULL;
        }
        n = nd(p, N_NAME, tk);
        if (!n) return NULL;
        n->s = intern(p, tk->p, tk->len);
        return n->s ? n : NULL;
    case T_STRING: {
        adv(p);
        size_t total = tk->len;
        size_t j = p->i;
        while (p->tk->v[j].kind == T_STRING) total += p->tk->v[j++].len;
        char *buf = malloc(total + 1);
        if (!buf) return nomem(p);
        memcpy(buf, tk->p, tk->len);
        size_t o = tk->len;
        while (cur(p)->kind == T_STRING) {
            memcpy(buf + o, cur(p)->p, cur(p)->len);
            o += cur(p)->len;
            adv(p);
        }
        n = nd(p, N_CONST, tk);
        struct tstr *s = n ? pool_str(p, buf, o) : NULL;
        free(buf);
        if (!s) return NULL;
        n->v = (struct tv){.kind = TV_STR, .u.s = s};
        return n;
    }
    case T_INT:
    case T_FLOAT:
        adv(p);
        n = nd(p, N_CONST, tk);
        if (n) n->v = tk->kind == T_INT ? tv_int(tk->i) : tv_float(tk->f);
        return n;
    case T_LPAREN:
        adv(p);
        n = parse_tuple(p, false, true, NULL, true, false);
        if (!n || !expect(p, T_RPAREN)) return NULL;
        return n;
    case T_LBRACKET: return parse_list(p);
    case T_LBRACE: return parse_dict(p);
    case T_EOF: return fail_at(p, tk, "unexpected end of template");
    default: return fail_at(p, tk, "unexpected %s", describe(tk, d, sizeof d));
    }
}

static bool tuple_end(struct ps *p, const char *const *extra_end) {
    int k = cur(p)->kind;
    if (k == T_VAR_END || k == T_BLOCK_END || k == T_RPAREN) return true;
    if (extra_end)
        for (; *extra_end; extra_end++)
            if (is_name(cur(p), *extra_end)) return true;
    return false;
}

static struct node *parse_tuple(struct ps *p, bool simplified, bool with_condexpr,
                                const char *const *extra_end, bool explicit_paren,
                                bool with_namespace) {
    const struct token *tk = cur(p);
    struct nvec v = {0};
    bool is_tuple = false;
    if (!enter(p)) return NULL;
    for (;;) {
        if (v.n && !expect(p, T_COMMA)) return leave(p), NULL;
        if (tuple_end(p, extra_end)) break;
        struct node *x = simplified ? parse_primary(p, with_namespace) : parse_expression(p, with_condexpr);
        if (!x || !nv_push(p, &v, x)) return leave(p), NULL;
        if (cur(p)->kind == T_COMMA) is_tuple = true;
        else break;
    }
    leave(p);
    if (!is_tuple) {
        if (v.n) return v.v[0];
        if (!explicit_paren) {
            char d[64];
            return fail_at(p, cur(p), "expected an expression, got %s", describe(cur(p), d, sizeof d));
        }
    }
    struct node *n = nd(p, N_TUPLE, tk);
    if (!n) return NULL;
    n->args = v.v;
    n->n_args = v.n;
    return n;
}

static struct node *parse_subscribed(struct ps *p) {
    const struct token *tk = cur(p);
    struct node *args[3] = {NULL, NULL, NULL};
    if (cur(p)->kind == T_COLON) {
        adv(p);
    } else {
        struct node *x = parse_expression(p, true);
        if (!x) return NULL;
        if (cur(p)->kind != T_COLON) return x;
        adv(p);
        args[0] = x;
    }
    if (cur(p)->kind != T_COLON && cur(p)->kind != T_RBRACKET && cur(p)->kind != T_COMMA) {
        if (!(args[1] = parse_expression(p, true))) return NULL;
    }
    if (cur(p)->kind == T_COLON) {
        adv(p);
        if (cur(p)->kind != T_RBRACKET && cur(p)->kind != T_COMMA)
            if (!(args[2] = parse_expression(p, true))) return NULL;
    }
    struct node *n = nd(p, N_SLICE, tk);
    if (!n) return NULL;
    n->a = args[0];
    n->b = args[1];
    n->c = args[2];
    return n;
}

static struct node *parse_subscript(struct ps *p, struct node *obj) {
    const struct token *tk = cur(p);
    adv(p);
    if (tk->kind == T_DOT) {
        const struct token *at = cur(p);
        adv(p);
        if (at->kind == T_NAME) {
            struct node *n = nd(p, N_GETATTR, tk);
            if (!n) return NULL;
            n->a = obj;
            n->s = intern(p, at->p, at->len);
            return n->s ? n : NULL;
        }
        if (at->kind != T_INT) return fail_at(p, at, "expected name or number after '.'");
        struct node *k = nd(p, N_CONST, at), *n = nd(p, N_GETITEM, tk);
        if (!k || !n) return NULL;
        k->v = tv_int(at->i);
        n->a = obj;
        n->b = k;
        return n;
    }
    /* '[' */
    struct nvec v = {0};
    while (cur(p)->kind != T_RBRACKET) {
        if (v.n && !expect(p, T_COMMA)) return NULL;
        struct node *x = parse_subscribed(p);
        if (!x || !nv_push(p, &v, x)) return NULL;
        if (cur(p)->kind == T_EOF) break;
    }
    if (!expect(p, T_RBRACKET)) return NULL;
    if (!v.n) return fail_at(p, tk, "expected a subscript expression");
    struct node *n = nd(p, N_GETITEM, tk);
    if (!n) return NULL;
    n->a = obj;
    if (v.n == 1) {
        n->b = v.v[0];
    } else {
        struct node *t = nd(p, N_TUPLE, tk);
        if (!t) return NULL;
        t->args = v.v;
        t->n_args = v.n;
        n->b = t;
    }
    return n;
}

/* Parses (args, k=v, *a, **kw) into n. */
static bool parse_call_args(struct ps *p, struct node *n) {
    const struct token *tk = cur(p);
    if (!expect(p, T_LPAREN)) return false;
    struct nvec args = {0}, kwv = {0};
    struct tstr *kwn[64];
    uint32_t nkw = 0;
    bool require_comma = false;
    while (cur(p)->kind != T_RPAREN) {
        if (require_comma) {
            if (!expect(p, T_COMMA)) return false;
            if (cur(p)->kind == T_RPAREN) break;
        }
        if (cur(p)->kind == T_MUL) {
            if (n->b || n->c) return fail_at(p, tk, "invalid syntax for function call expression"), false;
            adv(p);
            if (!(n->b = parse_expression(p, true))) return false;
        } else if (cur(p)->kind == T_POW) {
            if (n->c) return fail_at(p, tk, "invalid syntax for function call expression"), false;
            adv(p);
            if (!(n->c = parse_expression(p, true))) return false;
        } else if (cur(p)->kind == T_NAME && peek(p, 1)->kind == T_ASSIGN) {
            if (n->c) return fail_at(p, tk, "invalid syntax for function call expression"), false;
            if (nkw >= 64) return fail_at(p, tk, "too many keyword arguments"), false;
            struct tstr *k = intern(p, cur(p)->p, cur(p)->len);
            if (!k) return false;
            adv(p);
            adv(p);
            struct node *x = parse_expression(p, true);
            if (!x || !nv_push(p, &kwv, x)) return false;
            kwn[nkw++] = k;
        } else {
            if (n->b || n->c || nkw) return fail_at(p, tk, "invalid syntax for function call expression"), false;
            struct node *x = parse_expression(p, true);
            if (!x || !nv_push(p, &args, x)) return false;
        }
        require_comma = true;
        if (cur(p)->kind == T_EOF) break;
    }
    if (!expect(p, T_RPAREN)) return false;
    n->args = args.v;
    n->n_args = args.n;
    n->kwvals = kwv.v;
    n->n_kw = nkw;
    if (nkw) {
        n->kwnames = pool_alloc(p->t->pool, nkw * sizeof *n->kwnames);
        if (!n->kwnames) return nomem(p), false;
        memcpy(n->kwnames, kwn, nkw * sizeof *kwn);
    }
    return true;
}

static struct node *parse_call(struct ps *p, struct node *callee) {
    struct node *n = nd(p, N_CALL, cur(p));
    if (!n) return NULL;
    /* errors of a call point at the callee's start: "line 3 col 6: raise_exception: ..." */
    n->line = callee->line;
    n->col = callee->col;
    n->a = callee;
    return parse_call_args(p, n) ? n : NULL;
}

static struct node *parse_postfix(struct ps *p, struct node *n) {
    while (n) {
        int k = cur(p)->kind;
        if (k == T_DOT || k == T_LBRACKET) n = parse_subscript(p, n);
        else if (k == T_LPAREN) n = parse_call(p, n);
        else break;
    }
    return n;
}

/* A dotted name after | or is. */
static bool dotted_name(struct ps *p, char *buf, size_t cap, size_t *len) {
    const struct token *tk = cur(p);
    if (!expect(p, T_NAME)) return false;
    size_t n = tk->len < cap - 1 ? tk->len : cap - 1;
    memcpy(buf, tk->p, n);
    while (cur(p)->kind == T_DOT) {
        adv(p);
        const struct token *x = cur(p);
        if (!expect(p, T_NAME)) return false;
        if (n + 1 + x->len < cap - 1) {
            buf[n++] = '.';
            memcpy(buf + n, x->p, x->len);
            n += x->len;
        }
    }
    buf[n] = 0;
    *len = n;
    return true;
}

static struct node *parse_filter(struct ps *p, struct node *n, bool start_inline) {
    while (cur(p)->kind == T_PIPE || start_inline) {
        if (!start_inline) adv(p);
        start_inline = false;
        const struct token *tk = cur(p);
        char name[128];
        size_t len;
        if (!dotted_name(p, name, sizeof name, &len)) return NULL;
        int fid = tmpl_filter_id(name, len); /* unknown: checked by validate() */
        struct node *f = nd(p, N_FILTER, tk);
        if (!f) return NULL;
        f->a = n;
        f->fid = fid < 0 ? FID_UNKNOWN : (uint16_t)fid;
        f->s = intern(p, name, len);
        if (!f->s) return NULL;
        if (cur(p)->kind == T_LPAREN && !parse_call_args(p, f)) return NULL;
        n = f;
    }
    return n;
}

static struct node *parse_test(struct ps *p, struct node *n) {
    const struct token *tk = cur(p);
    adv(p); /* 'is' */
    bool negated = false;
    if (is_name(cur(p), "not")) {
        adv(p);
        negated = true;
    }
    const struct token *nt = cur(p);
    char name[128];
    size_t len;
    if (!dotted_name(p, name, sizeof name, &len)) return NULL;
    int fid = tmpl_test_id(name, len); /* unknown: checked by validate() */
    struct node *t = nd(p, N_TEST, tk);
    if (!t) return NULL;
    t->line = nt->line; /* errors point at the test's name */
    t->col = nt->col;
    t->a = n;
    t->fid = fid < 0 ? FID_UNKNOWN : (uint16_t)fid;
    t->s = intern(p, name, len);
    if (!t->s) return NULL;
    int k = cur(p)->kind;
    if (k == T_LPAREN) {
        if (!parse_call_args(p, t)) return NULL;
    } else if ((k == T_NAME || k == T_STRING || k == T_INT || k == T_FLOAT || k == T_LBRACKET ||
                k == T_LBRACE) &&
               !is_name(cur(p), "else") && !is_name(cur(p), "or") && !is_name(cur(p), "and")) {
        if (is_name(cur(p), "is")) return fail_at(p, cur(p), "you cannot chain multiple tests with is");
        struct node *arg = parse_primary(p, false);
        if (arg) arg = parse_postfix(p, arg);
        if (!arg) return NULL;
        t->args = pool_alloc(p->t->pool, sizeof *t->args);
        if (!t->args) return nomem(p);
        t->args[0] = arg;
        t->n_args = 1;
    }
    if (negated) {
        struct node *x = nd(p, N_NOT, tk);
        if (!x) return NULL;
        x->a = t;
        return x;
    }
    return t;
}

static struct node *parse_filter_expr(struct ps *p, struct node *n) {
    while (n) {
        int k = cur(p)->kind;
        if (k == T_PIPE) n = parse_filter(p, n, false);
        else if (is_name(cur(p), "is")) n = parse_test(p, n);
        else if (k == T_LPAREN) n = parse_call(p, n);
        else break;
    }
    return n;
}

/* ---------------------------------------------------------------- statements */

static bool subparse(struct ps *p, const char *const *end_names, struct nvec *body);

static bool can_assign(struct node *n, bool allow_ns) {
    if (n->kind == N_NAME) return true;
    if (n->kind == N_NSREF) return allow_ns;
    if (n->kind == N_TUPLE) {
        for (uint32_t i = 0; i < n->n_args; i++)
            if (!can_assign(n->args[i], allow_ns)) return false;
        return true;
    }
    return false;
}

static const char *assign_kind_name(struct node *n) {
    switch (n->kind) {
    case N_CONST: return "const";
    case N_CALL: return "call";
    case N_GETATTR: return "getattr";
    case N_GETITEM: return "getitem";
    case N_LIST: return "list";
    case N_DICT: return "dict";
    default: return "expression";
    }
}

static struct node *parse_assign_target(struct ps *p, const char *const *extra_end, bool with_namespace) {
    const struct token *tk = cur(p);
    struct node *t = parse_tuple(p, true, true, extra_end, false, with_namespace);
    if (!t) return NULL;
    if (!can_assign(t, with_namespace)) return fail_at(p, tk, "can't assign to '%s'", assign_kind_name(t));
    return t;
}

/* Parses statements until one of end_names; leaves the current token at that name. */
static bool parse_body(struct ps *p, const char *const *end_names, struct node ***out, uint32_t *n) {
    if (cur(p)->kind == T_COLON) adv(p);
    if (!expect(p, T_BLOCK_END)) return false;
    struct nvec v = {0};
    if (!subparse(p, end_names, &v)) return false;
    if (cur(p)->kind == T_EOF) {
        char want[160] = "";
        for (const char *const *e = end_names; *e; e++) {
            if (*want) strncat(want, " or ", sizeof want - strlen(want) - 1);
            strncat(want, "'", sizeof want - strlen(want) - 1);
            strncat(want, *e, sizeof want - strlen(want) - 1);
            strncat(want, "'", sizeof want - strlen(want) - 1);
        }
        fail_at(p, cur(p), "unexpected end of template: jinja was looking for %s", want);
        return false;
    }
    *out = v.v;
    *n = v.n;
    return true;
}

static bool parse_signature(struct ps *p, struct node *n) {
    if (!expect(p, T_LPAREN)) return false;
    struct nvec params = {0}, defs = {0};
    bool have_default = false;
    while (cur(p)->kind != T_RPAREN) {
        if (params.n && !expect(p, T_COMMA)) return false;
        const struct token *tk = cur(p);
        if (!expect(p, T_NAME)) return false;
        struct node *pn = nd(p, N_NAME, tk);
        if (!pn || !(pn->s = intern(p, tk->p, tk->len))) return false;
        struct node *d = NULL;
        if (cur(p)->kind == T_ASSIGN) {
            adv(p);
            if (!(d = parse_expression(p, true))) return false;
            have_default = true;
        } else if (have_default) {
            fail_at(p, tk, "non-default argument follows default argument");
            return false;
        }
        if (!nv_push(p, &params, pn) || !nv_push(p, &defs, d)) return false;
        if (cur(p)->kind == T_EOF) break;
    }
    if (!expect(p, T_RPAREN)) return false;
    n->args = params.v;
    n->args2 = defs.v;
    n->n_args = params.n;
    return true;
}

/* Which of varargs/kwargs/caller a macro body refers to (jinja2 only passes them then). */
static uint8_t scan_uses(const struct tmpl *t, const struct node *n, int depth) {
    if (!n || depth > 4 * TMPL_MAX_NEST) return 0;
    uint8_t u = 0;
    if (n->kind == N_NAME) {
        if (n->s == t->s_varargs) u |= USES_VARARGS;
        if (n->s == t->s_kwargs) u |= USES_KWARGS;
        if (n->s == t->s_caller) u |= USES_CALLER;
    }
    u |= scan_uses(t, n->a, depth + 1) | scan_uses(t, n->b, depth + 1) | scan_uses(t, n->c, depth + 1);
    for (uint32_t i = 0; i < n->n_args; i++) {
        u |= scan_uses(t, n->args[i], depth + 1);
        if (n->args2) u |= scan_uses(t, n->args2[i], depth + 1);
    }
    for (uint32_t i = 0; i < n->n_kw; i++) u |= scan_uses(t, n->kwvals[i], depth + 1);
    for (uint32_t i = 0; i < n->n_body; i++) u |= scan_uses(t, n->body[i], depth + 1);
    for (uint32_t i = 0; i < n->n_body2; i++) u |= scan_uses(t, n->body2[i], depth + 1);
    return u;
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_BLOCK[] = {"endblock", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const IN_END[] = {"in", NULL};
static const char *const REC_END[] = {"recursive", NULL};

static struct node *parse_for(struct ps *p) {
    struct node *n = nd(p, N_FOR, cur(p));
    if (!n) return NULL;
    adv(p);
    if (!(n->a = parse_assign_target(p, IN_END, false))) return NULL;
    if (!expect_name(p, "in")) return NULL;
    if (!(n->b = parse_tuple(p, false, false, REC_END, false, false))) return NULL;
    if (is_name(cur(p), "if")) {
        adv(p);
        if (!(n->c = parse_expression(p, true))) return NULL;
    }
    if (is_name(cur(p), "recursive")) {
        adv(p);
        n->flag = 1;
    }
    p->loops++;
    bool ok = parse_body(p, END_FOR, &n->body, &n->n_body);
    p->loops--;
    if (!ok) return NULL;
    if (is_name(cur(p), "else")) {
        adv(p);
        int saved = p->loops;
        p->loops = 0; /* jinja2: the else block is not inside the loop */
        ok = parse_body(p, END_FOR2, &n->body2, &n->n_body2);
        p->loops = saved;
        if (!ok) return NULL;
    }
    adv(p); /* endfor */
    return n;
}

static struct node *parse_if(struct ps *p) {
    struct node *root = nd(p, N_IF, cur(p));
    if (!root) return NULL;
    adv(p);
    struct node *n = root;
    for (;;) {
        if (!(n->a = parse_tuple(p, false, false, NULL, false, false))) return NULL;
        if (!parse_body(p, END_IF, &n->body, &n->n_body)) return NULL;
        if (is_name(cur(p), "elif")) {
            struct node *e = nd(p, N_IF, cur(p));
            if (!e) return NULL;
            adv(p);
            n->body2 = pool_alloc(p->t->pool, sizeof *n->body2);
            if (!n->body2) return nomem(p);
            n->body2[0] = e;
            n->n_body2 = 1;
            n = e;
            continue;
        }
        if (is_name(cur(p), "else")) {
            adv(p);
            if (!parse_body(p, END_IF2, &n->body2, &n->n_body2)) return NULL;
        }
        adv(p); /* endif */
        return root;
    }
}

static struct node *parse_set(struct ps *p) {
    const struct token *tk = cur(p);
    adv(p);
    struct node *target = parse_assign_target(p, NULL, true);
    if (!target) return NULL;
    if (cur(p)->kind == T_ASSIGN) {
        adv(p);
        struct node *n = nd(p, N_SET, tk);
        if (!n) return NULL;
        n->a = target;
        if (!(n->b = parse_tuple(p, false, true, NULL, false, false))) return NULL;
        return n;
    }
    struct node *n = nd(p, N_SETBLOCK, tk);
    if (!n) return NULL;
    n->a = target;
    if (cur(p)->kind == T_PIPE) {
        if (!(n->c = parse_filter(p, NULL, false))) return NULL;
    }
    if (!parse_body(p, END_SET, &n->body, &n->n_body)) return NULL;
    adv(p);
    return n;
}

static struct node *parse_macro(struct ps *p) {
    struct node *n = nd(p, N_MACRO, cur(p));
    if (!n) return NULL;
    adv(p);
    const struct token *tk = cur(p);
    if (!expect(p, T_NAME)) return NULL;
    if (!(n->s = intern(p, tk->p, tk->len))) return NULL;
    if (!parse_signature(p, n)) return NULL;
    int saved = p->loops;
    p->loops = 0;
    bool ok = parse_body(p, END_MACRO, &n->body, &n->n_body);
    p->loops = saved;
    if (!ok) return NULL;
    adv(p);
    n->uses = scan_uses(p->t, n, 0);
    return n;
}

static struct node *parse_call_block(struct ps *p) {
    struct node *n = nd(p, N_CALLBLOCK, cur(p));
    if (!n) return NULL;
    adv(p);
    if (cur(p)->kind == T_LPAREN && !parse_signature(p, n)) return NULL;
    const struct token *tk = cur(p);
    struct node *call = parse_expression(p, true);
    if (!call) return NULL;
    if (call->kind != N_CALL) return fail_at(p, tk, "expected a call after 'call'");
    n->a = call;
    int saved = p->loops;
    p->loops = 0;
    bool ok = parse_body(p, END_CALL, &n->body, &n->n_body);
    p->loops = saved;
    if (!ok) return NULL;
    adv(p);
    n->uses = scan_uses(p->t, n, 0);
    return n;
}

static struct node *parse_filter_block(struct ps *p) {
    struct node *n = nd(p, N_FILTERBLOCK, cur(p));
    if (!n) return NULL;
    adv(p);
    if (!(n->c = parse_filter(p, NULL, true))) return NULL;
    if (!parse_body(p, END_FILTER, &n->body, &n->n_body)) return NULL;
    adv(p);
    return n;
}

static struct node *parse_with(struct ps *p) {
    struct node *n = nd(p, N_WITH, cur(p));
    if (!n) return NULL;
    adv(p);
    struct nvec t = {0}, v = {0};
    while (cur(p)->kind != T_BLOCK_END) {
        if (t.n && !expect(p, T_COMMA)) return NULL;
        struct node *target = parse_assign_target(p, NULL, false);
        if (!target || !expect(p, T_ASSIGN)) return NULL;
        struct node *val = parse_expression(p, true);
        if (!val || !nv_push(p, &t, target) || !nv_push(p, &v, val)) return NULL;
        if (cur(p)->kind == T_EOF) break;
    }
    n->args = t.v;
    n->args2 = v.v;
    n->n_args = t.n;
    if (!parse_body(p, END_WITH, &n->body, &n->n_body)) return NULL;
    adv(p);
    return n;
}

static struct node *parse_statement(struct ps *p) {
    const struct token *tk = cur(p);
    char d[64];
    if (tk->kind != T_NAME) return fail_at(p, tk, "tag name expected, got %s", describe(tk, d, sizeof d));
    if (!enter(p)) return NULL;
    struct node *n = NULL;
    if (is_name(tk, "for")) n = parse_for(p);
    else if (is_name(tk, "if")) n = parse_if(p);
    else if (is_name(tk, "set")) n = parse_set(p);
    else if (is_name(tk, "macro")) n = parse_macro(p);
    else if (is_name(tk, "call")) n = parse_call_block(p);
    else if (is_name(tk, "filter")) n = parse_filter_block(p);
    else if (is_name(tk, "with")) n = parse_with(p);
    else if (is_name(tk, "break") || is_name(tk, "continue")) {
        if (!p->loops) {
            n = fail_at(p, tk, "'%.*s' outside of a for loop", (int)tk->len, tk->p);
        } else {
            n = nd(p, tk->p[0] == 'b' ? N_BREAK : N_CONTINUE, tk);
            adv(p);
        }
    } else if (is_name(tk, "print")) {
        n = nd(p, N_OUTPUT, tk);
        adv(p);
        struct nvec v = {0};
        while (n && cur(p)->kind != T_BLOCK_END) {
            if (v.n && !expect(p, T_COMMA)) return leave(p), NULL;
            struct node *x = parse_expression(p, true);
            if (!x || !nv_push(p, &v, x)) return leave(p), NULL;
            if (cur(p)->kind == T_EOF) break;
        }
        if (n) {
            n->args = v.v;
            n->n_args = v.n;
        }
    } else if (is_name(tk, "generation")) {
        /* transformers' AssistantTracker extension: renders its body unchanged */
        n = nd(p, N_SCOPE, tk);
        adv(p);
        if (n && parse_body(p, END_GEN, &n->body, &n->n_body)) adv(p);
        else n = NULL;
        if (n) n->flag = 0;
    } else if (is_name(tk, "block")) {
        n = nd(p, N_SCOPE, tk);
        adv(p);
        const struct token *bn = cur(p);
        if (n && expect(p, T_NAME)) {
            while (is_name(cur(p), "scoped") || is_name(cur(p), "required")) adv(p);
            if (parse_body(p, END_BLOCK, &n->body, &n->n_body)) {
                adv(p);
                if (cur(p)->kind == T_NAME && cur(p)->len == bn->len && !memcmp(cur(p)->p, bn->p, bn->len)) adv(p);
                n->flag = 1;
            } else {
                n = NULL;
            }
        } else {
            n = NULL;
        }
    } else if (is_name(tk, "extends") || is_name(tk, "include") || is_name(tk, "import") ||
               is_name(tk, "from") || is_name(tk, "autoescape") || is_name(tk, "do")) {
        if (!p->failed) {
            p->failed = true;
            err_set(p->e, SMELT_ERR_UNSUPPORTED, "line %u col %u: unsupported tag '%.*s' (chat templates have no loader)",
                    tk->line, tk->col, (int)tk->len, tk->p);
        }
    } else if (tk->len > 3 && !memcmp(tk->p, "end", 3)) {
        n = fail_at(p, tk, "unexpected '%.*s'", (int)tk->len, tk->p);
    } else if (is_name(tk, "elif") || is_name(tk, "else")) {
        n = fail_at(p, tk, "unexpected '%.*s' outside of an if or for block", (int)tk->len, tk->p);
    } else {
        n = fail_at(p, tk, "unknown tag '%.*s'", (int)tk->len, tk->p);
    }
    leave(p);
    return n;
}

static bool subparse(struct ps *p, const char *const *end_names, struct nvec *body) {
    for (;;) {
        const struct token *tk = cur(p);
        switch (tk->kind) {
        case T_EOF: return true;
        case T_DATA: {
            struct node *n = nd(p, N_DATA, tk);
            if (!n || !(n->s = pool_str(p, tk->p, tk->len)) || !nv_push(p, body, n)) return false;
            adv(p);
            break;
        }
        case T_VAR_BEGIN: {
            adv(p);
            struct node *n = nd(p, N_OUTPUT, tk), *x = parse_tuple(p, false, true, NULL, false, false);
            if (!n || !x) return false;
            if (!expect(p, T_VAR_END)) return false;
            n->args = pool_alloc(p->t->pool, sizeof *n->args);
            if (!n->args) return nomem(p), false;
            n->args[0] = x;
            n->n_args = 1;
            if (!nv_push(p, body, n)) return false;
            break;
        }
        case T_BLOCK_BEGIN: {
            adv(p);
            if (end_names)
                for (const char *const *e = end_names; *e; e++)
                    if (is_name(cur(p), *e)) return true;
            struct node *n = parse_statement(p);
            if (!n || !nv_push(p, body, n)) return false;
            if (!expect(p, T_BLOCK_END)) return false;
            break;
        }
        default: {
            char d[64];
            fail_at(p, tk, "unexpected %s", describe(tk, d, sizeof d));
            return false;
        }
        }
    }
}

/* ---------------------------------------------------------------- validation */

/* jinja2 rejects an unknown filter or test at compile time, except inside an if
 * statement (test and branches) or a conditional expression ("soft" frames), where it
 * only fails if it runs. Frames a for body, macro, call block, filter/set block or
 * {% with %} opens are not soft again. */
static bool validate(struct ps *p, const struct node *n, bool soft, int depth);

static bool validate_list(struct ps *p, struct node *const *v, uint32_t n, bool soft, int depth) {
    for (uint32_t i = 0; i < n; i++)
        if (v && v[i] && !validate(p, v[i], soft, depth + 1)) return false;
    return true;
}

static bool validate(struct ps *p, const struct node *n, bool soft, int depth) {
    if (!n) return true;
    if (depth > 4 * TMPL_MAX_NEST) return true; /* the evaluator's own bounds apply */
    if ((n->kind == N_FILTER || n->kind == N_TEST) && n->fid == FID_UNKNOWN && !soft) {
        struct token tk = {.line = n->line, .col = n->col};
        fail_at(p, &tk, "no %s named '%s'", n->kind == N_FILTER ? "filter" : "test", n->s->s);
        return false;
    }
    bool inner = false; /* frames that reset softness */
    switch (n->kind) {
    case N_IF:
    case N_CONDEXPR: soft = true; break;
    case N_FOR:
        if (!validate(p, n->a, soft, depth + 1) || !validate(p, n->b, soft, depth + 1)) return false;
        if (!validate(p, n->c, false, depth + 1) || !validate_list(p, n->body, n->n_body, false, depth)) return false;
        return validate_list(p, n->body2, n->n_body2, soft, depth);
    case N_MACRO:
    case N_CALLBLOCK:
    case N_FILTERBLOCK:
    case N_SETBLOCK:
    case N_SCOPE:
    case N_WITH: inner = true; break;
    default: break;
    }
    if (inner) {
        if (n->kind == N_CALLBLOCK && !validate(p, n->a, soft, depth + 1)) return false;
        if (n->kind == N_WITH && !validate_list(p, n->args2, n->n_args, soft, depth)) return false;
        if (n->kind != N_WITH && !validate_list(p, n->args2, n->n_args, false, depth)) return false;
        return validate(p, n->c, false, depth + 1) && validate_list(p, n->body, n->n_body, false, depth);
    }
    return validate(p, n->a, soft, depth + 1) && validate(p, n->b, soft, depth + 1) &&
           validate(p, n->c, soft, depth + 1) && validate_list(p, n->args, n->n_args, soft, depth) &&
           validate_list(p, n->args2, n->n_args, soft, depth) && validate_list(p, n->kwvals, n->n_kw, soft, depth) &&
           validate_list(p, n->body, n->n_body, soft, depth) && validate_list(p, n->body2, n->n_body2, soft, depth);
}

/* ---------------------------------------------------------------- compile */

smelt_status tmpl_compile(const char *src, size_t len, struct tmpl **out, struct err *e) {
    *out = NULL;
    if (!src && len) return err_set(e, SMELT_ERR_INVALID, "tmpl_compile: NULL source");
    struct tmpl *t = calloc(1, sizeof *t);
    if (!t) return err_set(e, SMELT_ERR_NOMEM, "out of memory compiling the template");
    t->pool = calloc(1, sizeof *t->pool);
    if (!t->pool) {
        free(t);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory compiling the template");
    }
    struct tokens tk;
    smelt_status st = tmpl_lex(src ? src : "", len, &tk, e);
    if (st) {
        tmpl_free(t);
        return st;
    }
    struct ps p = {.tk = &tk, .t = t, .e = e};
    t->s_loop = intern(&p, "loop", 4);
    t->s_caller = intern(&p, "caller", 6);
    t->s_varargs = intern(&p, "varargs", 7);
    t->s_kwargs = intern(&p, "kwargs", 6);
    struct nvec body = {0};
    bool ok = !p.failed && subparse(&p, NULL, &body);
    if (ok && cur(&p)->kind != T_EOF) ok = fail_at(&p, cur(&p), "unexpected token") != NULL;
    if (ok) ok = validate_list(&p, body.v, body.n, false, 0);
    free(p.names);
    tmpl_tokens_free(&tk);
    if (!ok || p.failed) {
        tmpl_free(t);
        return e ? (e->code ? e->code : SMELT_ERR_FORMAT) : SMELT_ERR_FORMAT;
    }
    t->body = body.v;
    t->n_body = body.n;
    *out = t;
    return SMELT_OK;
}

void tmpl_free(struct tmpl *t) {
    if (!t) return;
    pool_free(t->pool);
    free(t->src);
    free(t);
}

/* ---------------------------------------------------------------- default */

/* ChatML, for models that ship no template. Content may be a string or a list of
 * content parts (only the text parts are kept). */
static const char default_src[] =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
    "{%- if message['content'] is string -%}\n"
    "{{- message['content'] -}}\n"
    "{%- elif message['content'] is iterable -%}\n"
    "{%- for part in message['content'] -%}\n"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

const char *tmpl_default_source(void) { return default_src; }

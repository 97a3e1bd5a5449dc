/* Expression trees (what the GBNF parser builds and the automaton compiles), code point
 * sets, and the text-buffer helpers of the grammar writers. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/gram_int.h"

void gram_ast_init(struct gast *a) {
    memset(a, 0, sizeof *a);
}

void gram_ast_free(struct gast *a) {
    free(a->x);
    free(a->kid);
    free(a->rng);
    free(a->byt);
    free(a->rule);
    free(a->names);
    memset(a, 0, sizeof *a);
}

static uint32_t new_node(struct gast *a, uint8_t kind, uint32_t off, uint32_t n, uint32_t min,
                         uint32_t max) {
    if (a->oom || a->toobig) return GRAM_NONE;
    if (a->nx >= GRAM_MAX_NODES) {
        a->toobig = true;
        return GRAM_NONE;
    }
    if (!gram_grow(&a->x, &a->capx, a->nx + 1, sizeof *a->x, GRAM_MAX_NODES)) {
        a->oom = true;
        return GRAM_NONE;
    }
    a->x[a->nx] = (struct gx){kind, off, n, min, max};
    return a->nx++;
}

uint32_t gram_ast_empty(struct gast *a) {
    return new_node(a, GX_EMPTY, 0, 0, 0, 0);
}

uint32_t gram_ast_chars(struct gast *a, const uint32_t *ranges, uint32_t n_pairs) {
    if (a->oom || a->toobig) return GRAM_NONE;
    if (!gram_grow(&a->rng, &a->caprng, (size_t)a->nrng + 2 * (size_t)n_pairs, sizeof *a->rng,
                   UINT32_MAX / 2)) {
        a->oom = true;
        return GRAM_NONE;
    }
    uint32_t off = a->nrng;
    if (n_pairs) memcpy(a->rng + off, ranges, 2 * (size_t)n_pairs * sizeof *ranges);
    a->nrng += 2 * n_pairs;
    return new_node(a, GX_CHARS, off, n_pairs, 0, 0);
}

uint32_t gram_ast_lit(struct gast *a, const void *bytes, uint32_t n) {
    if (a->oom || a->toobig) return GRAM_NONE;
    if (n == 0) return gram_ast_empty(a);
    if (!gram_grow(&a->byt, &a->capbyt, (size_t)a->nbyt + n, 1, UINT32_MAX / 2)) {
        a->oom = true;
        return GRAM_NONE;
    }
    uint32_t off = a->nbyt;
    memcpy(a->byt + off, bytes, n);
    a->nbyt += n;
    return new_node(a, GX_LIT, off, n, 0, 0);
}

uint32_t gram_ast_ref(struct gast *a, uint32_t rule) {
    if (rule == GRAM_NONE) return GRAM_NONE;
    return new_node(a, GX_REF, rule, 0, 0, 0);
}

uint32_t gram_ast_list(struct gast *a, enum gx_kind kind, const uint32_t *kids, uint32_t n) {
    if (a->oom || a->toobig) return GRAM_NONE;
    for (uint32_t i = 0; i < n; i++)
        if (kids[i] == GRAM_NONE) return GRAM_NONE;
    if (n == 0) return gram_ast_empty(a);
    if (n == 1) return kids[0];
    if (!gram_grow(&a->kid, &a->capkid, (size_t)a->nkid + n, sizeof *a->kid, UINT32_MAX / 2)) {
        a->oom = true;
        return GRAM_NONE;
    }
    uint32_t off = a->nkid;
    memcpy(a->kid + off, kids, (size_t)n * sizeof *kids);
    a->nkid += n;
    return new_node(a, (uint8_t)kind, off, n, 0, 0);
}

uint32_t gram_ast_rep(struct gast *a, uint32_t node, uint32_t min, uint32_t max) {
    if (node == GRAM_NONE) return GRAM_NONE;
    if (min == 1 && max == 1) return node;
    return new_node(a, GX_REP, node, 0, min, max);
}

uint32_t gram_ast_rule(struct gast *a, const char *name, uint32_t len) {
    for (uint32_t i = 0; i < a->nrule; i++)
        if (a->rule[i].name_len == len && memcmp(a->names + a->rule[i].name, name, len) == 0)
            return i;
    if (a->oom || a->toobig) return GRAM_NONE;
    if (a->nrule >= GRAM_MAX_NODES) {
        a->toobig = true;
        return GRAM_NONE;
    }
    if (!gram_grow(&a->rule, &a->caprule, a->nrule + 1, sizeof *a->rule, GRAM_MAX_NODES) ||
        !gram_grow(&a->names, &a->capnames, (size_t)a->nnames + len + 1, 1, UINT32_MAX / 2)) {
        a->oom = true;
        return GRAM_NONE;
    }
    memcpy(a->names + a->nnames, name, len);
    a->names[a->nnames + len] = 0;
    a->rule[a->nrule] = (struct gast_rule){a->nnames, len, GRAM_NONE, 0};
    a->nnames += len + 1;
    return a->nrule++;
}

/* ---- code point sets --------------------------------------------------------------------- */

bool gram_cset_add(struct gram_cset *s, uint32_t lo, uint32_t hi) {
    if (!gram_grow(&s->r, &s->cap, (size_t)s->n + 2, sizeof *s->r, UINT32_MAX / 2)) return false;
    s->r[s->n++] = lo;
    s->r[s->n++] = hi;
    return true;
}

static int cmp_range(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : (a[1] < b[1] ? -1 : a[1] > b[1]);
}

void gram_cset_norm(struct gram_cset *s) {
    if (s->n < 4) return;
    qsort(s->r, s->n / 2, 2 * sizeof *s->r, cmp_range);
    uint32_t w = 0; /* code points are <= 0x10FFFF: hi + 1 cannot overflow */
    for (uint32_t i = 0; i < s->n; i += 2) {
        uint32_t lo = s->r[i], hi = s->r[i + 1];
        if (w && lo <= s->r[w - 1] + 1) {
            if (hi > s->r[w - 1]) s->r[w - 1] = hi;
        } else {
            s->r[w++] = lo;
            s->r[w++] = hi;
        }
    }
    s->n = w;
}

bool gram_cset_negate(struct gram_cset *s) {
    struct gram_cset t = {0};
    uint32_t next = 0;
    for (uint32_t i = 0; i < s->n; i += 2) {
        if (s->r[i] > next && !gram_cset_add(&t, next, s->r[i] - 1)) goto oom;
        next = s->r[i + 1] + 1;
        if (s->r[i + 1] >= 0x10FFFF) {
            next = 0x110000;
            break;
        }
    }
    if (next <= 0x10FFFF && !gram_cset_add(&t, next, 0x10FFFF)) goto oom;
    free(s->r);
    *s = t;
    return gram_cset_drop_surrogates(s);
oom:
    gram_cset_free(&t);
    return false;
}

bool gram_cset_drop_surrogates(struct gram_cset *s) {
    struct gram_cset t = {0};
    for (uint32_t i = 0; i < s->n; i += 2) {
        uint32_t lo = s->r[i], hi = s->r[i + 1];
        if (hi < 0xD800 || lo > 0xDFFF) {
            if (!gram_cset_add(&t, lo, hi)) goto oom;
            continue;
        }
        if (lo < 0xD800 && !gram_cset_add(&t, lo, 0xD7FF)) goto oom;
        if (hi > 0xDFFF && !gram_cset_add(&t, 0xE000, hi)) goto oom;
    }
    free(s->r);
    *s = t;
    return true;
oom:
    gram_cset_free(&t);
    return false;
}

void gram_cset_free(struct gram_cset *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* ---- text buffers ------------------------------------------------------------------------ */

bool gram_buf_put(struct tok_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > GRAM_MAX_TEXT) return false;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1)
            c *= 2;
        char *p = realloc(b->p, c);
        if (!p) return false;
        b->p = p;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool gram_buf_puts(struct tok_buf *b, const char *s) {
    return gram_buf_put(b, s, strlen(s));
}

bool gram_buf_printf(struct tok_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) return false;
    return gram_buf_put(b, tmp, (size_t)n);
}

bool gram_buf_gbnf_char(struct tok_buf *b, uint32_t cp) {
    char t[16];
    switch (cp) {
    case '"':
        return gram_buf_puts(b, "\\\"");
    case '\\':
        return gram_buf_puts(b, "\\\\");
    case '[':
        return gram_buf_puts(b, "\\[");
    case ']':
        return gram_buf_puts(b, "\\]");
    case '-':
        return gram_buf_puts(b, "\\-");
    case '\n':
        return gram_buf_puts(b, "\\n");
    case '\r':
        return gram_buf_puts(b, "\\r");
    case '\t':
        return gram_buf_puts(b, "\\t");
    default:
        break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
        t[0] = (char)cp;
        return gram_buf_put(b, t, 1);
    }
    if (cp < 0x100)
        snprintf(t, sizeof t, "\\x%02X", cp);
    else if (cp < 0x10000)
        snprintf(t, sizeof t, "\\u%04X", cp);
    else
        snprintf(t, sizeof t, "\\U%08X", cp);
    return gram_buf_puts(b, t);
}

/* JSON's escape of a character it must escape, as a GBNF literal: the short forms where JSON
 * has one, else \u00xx. */
static bool put_json_escape(struct tok_buf *b, uint32_t cp) {
    switch (cp) {
    case '"':
        return gram_buf_puts(b, "\"\\\\\\\"\"");
    case '\\':
        return gram_buf_puts(b, "\"\\\\\\\\\"");
    case '\b':
        return gram_buf_puts(b, "\"\\\\b\"");
    case '\f':
        return gram_buf_puts(b, "\"\\\\f\"");
    case '\n':
        return gram_buf_puts(b, "\"\\\\n\"");
    case '\r':
        return gram_buf_puts(b, "\"\\\\r\"");
    case '\t':
        return gram_buf_puts(b, "\"\\\\t\"");
    default:
        return gram_buf_printf(b, "\"\\\\u%04x\"", cp);
    }
}

static bool json_special(uint32_t cp) {
    return cp < 0x20 || cp == '"' || cp == '\\';
}

bool gram_buf_chars(struct tok_buf *b, const struct gram_cset *cs, bool json) {
    uint32_t special[40];
    int ns = 0;
    struct gram_cset plain = {0};
    bool ok = true;
    for (uint32_t k = 0; ok && k < cs->n; k += 2) {
        uint32_t lo = cs->r[k], hi = cs->r[k + 1];
        if (!json) {
            ok = gram_cset_add(&plain, lo, hi);
            continue;
        }
        for (uint32_t c = lo; c <= hi && c <= '\\'; c++)
            if (json_special(c)) special[ns++] = c;
        /* the range minus the specials */
        for (uint32_t a = lo; ok && a <= hi;) {
            while (a <= hi && json_special(a))
                a++;
            if (a > hi) break;
            uint32_t z = a;
            while (z < hi && !json_special(z + 1))
                z++;
            ok = gram_cset_add(&plain, a, z);
            a = z + 1;
        }
    }
    bool alt = ns > 0 || plain.n == 0;
    if (ok && alt) ok = gram_buf_puts(b, "(");
    if (ok && (plain.n || !ns)) {
        ok = gram_buf_puts(b, "[");
        for (uint32_t k = 0; ok && k < plain.n; k += 2) {
            ok = gram_buf_gbnf_char(b, plain.r[k]);
            if (ok && plain.r[k + 1] != plain.r[k])
                ok = gram_buf_puts(b, "-") && gram_buf_gbnf_char(b, plain.r[k + 1]);
        }
        ok = ok && gram_buf_puts(b, "]");
    }
    for (int k = 0; ok && k < ns; k++) {
        if ((k > 0 || plain.n) && !gram_buf_puts(b, " | ")) ok = false;
        if (ok) ok = put_json_escape(b, special[k]);
    }
    if (ok && alt) ok = gram_buf_puts(b, ")");
    gram_cset_free(&plain);
    return ok;
}

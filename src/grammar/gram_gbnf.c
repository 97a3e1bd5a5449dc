/* GBNF parser: llama.cpp's grammar format (grammars/README.md there) into expression trees.
 *
 *   rule      name ::= alternates        (ends at a newline outside parentheses; a newline
 *                                         right after '|' continues the rule)
 *   items     "literal"  [class]  [^class]  .  name  ( alternates )
 *   postfix   *  +  ?  {m}  {m,}  {m,n}   (on the item before, a whole literal included)
 *   escapes   \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \] \-
 *   comments  # to the end of the line
 * Names are [A-Za-z0-9_-]+ (llama.cpp takes no '_'; accepting it costs nothing). Terminals
 * are Unicode code points; the automaton matches their UTF-8 bytes. llama.cpp's token items
 * (<...>, !<...>) are refused. Errors give the line and column (1-based, columns in bytes).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/gram_int.h"
#include "util/utf8.h"

struct gp {
    const char *s;
    size_t n, i;
    struct gast *a;
    struct err *e;
    bool failed;
    int nest;
    uint32_t *tmp; /* items of the sequences and alternatives being built (a stack) */
    uint32_t ntmp;
    size_t captmp;
};

static void where(const char *s, size_t at, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at; k++) {
        if (s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

__attribute__((format(printf, 3, 4))) static uint32_t fail(struct gp *p, size_t at, const char *fmt,
                                                           ...) {
    if (p->failed) return GRAM_NONE;
    p->failed = true;
    va_list ap;
    va_start(ap, fmt);
    err_vset(p->e, SMELT_ERR_INVALID, fmt, ap);
    va_end(ap);
    size_t line, col;
    where(p->s, at, &line, &col);
    err_prefix(p->e, "grammar line %zu column %zu", line, col);
    return GRAM_NONE;
}

static uint32_t check_ast(struct gp *p, uint32_t node) {
    if (node != GRAM_NONE || p->failed) return node;
    p->failed = true;
    if (p->a->toobig)
        err_set(p->e, SMELT_ERR_RANGE, "grammar: more than %u expression nodes", GRAM_MAX_NODES);
    else
        err_set(p->e, SMELT_ERR_NOMEM, "grammar: out of memory");
    return GRAM_NONE;
}

static int peek(const struct gp *p) {
    return p->i < p->n ? (unsigned char)p->s[p->i] : -1;
}

static void skip_space(struct gp *p, bool newline_ok) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\r' && p->s[p->i] != '\n')
                p->i++;
        } else {
            break;
        }
    }
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static bool push_tmp(struct gp *p, uint32_t node) {
    if (!gram_grow(&p->tmp, &p->captmp, (size_t)p->ntmp + 1, sizeof *p->tmp, GRAM_MAX_NODES)) {
        check_ast(p, GRAM_NONE);
        return false;
    }
    p->tmp[p->ntmp++] = node;
    return true;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static bool parse_char(struct gp *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->n) return fail(p, at, "unexpected end of grammar"), false;
    if (p->s[p->i] != '\\') {
        size_t k = utf8_decode((const uint8_t *)p->s + p->i, p->n - p->i, cp);
        if (k == 0) return fail(p, at, "invalid UTF-8"), false;
        p->i += k;
        return true;
    }
    if (p->i + 1 >= p->n) return fail(p, at, "unexpected end of grammar after '\\'"), false;
    char c = p->s[p->i + 1];
    p->i += 2;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = p->i < p->n ? hexval((unsigned char)p->s[p->i]) : -1;
            if (h < 0) return fail(p, at, "expected %d hex digits after \\%c", digits, c), false;
            v = v << 4 | (uint32_t)h;
            p->i++;
        }
        if (v > 0x10FFFF) return fail(p, at, "code point 0x%X is above U+10FFFF", v), false;
        *cp = v;
        return true;
    }
    switch (c) {
    case 't':
        *cp = '\t';
        return true;
    case 'r':
        *cp = '\r';
        return true;
    case 'n':
        *cp = '\n';
        return true;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
        *cp = (unsigned char)c;
        return true;
    default:
        return fail(p, at, "unknown escape '\\%c'", c), false;
    }
}

static uint32_t parse_alternates(struct gp *p, bool nested);

static uint32_t parse_literal(struct gp *p) {
    size_t at = p->i++;
    uint8_t buf[256];
    struct tok_buf out = {0};
    uint32_t n = 0;
    while (true) {
        if (p->i >= p->n) {
            tok_buf_free(&out);
            return fail(p, at, "unterminated string literal");
        }
        if (p->s[p->i] == '"') break;
        size_t cat = p->i;
        uint32_t cp;
        if (!parse_char(p, &cp)) {
            tok_buf_free(&out);
            return GRAM_NONE;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            tok_buf_free(&out);
            return fail(p, cat, "surrogate code point U+%04X in a literal", cp);
        }
        n += (uint32_t)utf8_encode(cp, buf + n);
        if (n > sizeof buf - 4) {
            if (!gram_buf_put(&out, buf, n)) {
                tok_buf_free(&out);
                return check_ast(p, GRAM_NONE);
            }
            n = 0;
        }
    }
    p->i++;
    uint32_t node;
    if (out.n) {
        if (!gram_buf_put(&out, buf, n)) {
            tok_buf_free(&out);
            return check_ast(p, GRAM_NONE);
        }
        node = gram_ast_lit(p->a, out.p, (uint32_t)out.n);
    } else {
        node = gram_ast_lit(p->a, buf, n);
    }
    tok_buf_free(&out);
    return check_ast(p, node);
}

static uint32_t parse_class(struct gp *p) {
    size_t at = p->i++;
    bool neg = peek(p) == '^';
    if (neg) p->i++;
    struct gram_cset cs = {0};
    while (true) {
        if (p->i >= p->n) {
            gram_cset_free(&cs);
            return fail(p, at, "unterminated character class");
        }
        if (p->s[p->i] == ']') break;
        size_t cat = p->i;
        uint32_t lo, hi;
        if (!parse_char(p, &lo)) goto bad;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (!parse_char(p, &hi)) goto bad;
            if (hi < lo) {
                fail(p, cat, "character range is reversed (U+%04X-U+%04X)", lo, hi);
                goto bad;
            }
        }
        if (!gram_cset_add(&cs, lo, hi)) {
            check_ast(p, GRAM_NONE);
            goto bad;
        }
    }
    p->i++;
    gram_cset_norm(&cs);
    if (!(neg ? gram_cset_negate(&cs) : gram_cset_drop_surrogates(&cs))) {
        check_ast(p, GRAM_NONE);
        goto bad;
    }
    uint32_t node = check_ast(p, gram_ast_chars(p->a, cs.r, cs.n / 2));
    gram_cset_free(&cs);
    return node;
bad:
    gram_cset_free(&cs);
    return GRAM_NONE;
}

static bool parse_uint(struct gp *p, uint32_t *v) {
    size_t at = p->i;
    if (peek(p) < '0' || peek(p) > '9') return fail(p, at, "expected a number"), false;
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i] - '0');
        if (x > GRAM_MAX_REPEAT)
            return fail(p, at, "repetition count above the limit %u", GRAM_MAX_REPEAT), false;
        p->i++;
    }
    *v = (uint32_t)x;
    return true;
}

/* Postfix operators after an item. */
static uint32_t parse_postfix(struct gp *p, uint32_t node, bool nested) {
    while (node != GRAM_NONE && p->i < p->n) {
        char c = p->s[p->i];
        uint32_t min, max;
        if (c == '*' || c == '+' || c == '?') {
            p->i++;
            min = c == '+';
            max = c == '?' ? 1 : GRAM_INF;
        } else if (c == '{') {
            size_t at = p->i++;
            skip_space(p, nested);
            if (!parse_uint(p, &min)) return GRAM_NONE;
            skip_space(p, nested);
            max = min;
            if (peek(p) == ',') {
                p->i++;
                skip_space(p, nested);
                max = GRAM_INF;
                if (peek(p) >= '0' && peek(p) <= '9') {
                    if (!parse_uint(p, &max)) return GRAM_NONE;
                    skip_space(p, nested);
                }
            }
            if (peek(p) != '}') return fail(p, p->i, "expected '}' to close the repetition");
            p->i++;
            if (max < min)
                return fail(p, at, "repetition {%u,%u}: the maximum is below the minimum", min,
                            max);
        } else {
            break;
        }
        node = check_ast(p, gram_ast_rep(p->a, node, min, max));
        skip_space(p, nested);
    }
    return node;
}

static uint32_t parse_sequence(struct gp *p, bool nested) {
    uint32_t mark = p->ntmp;
    while (!p->failed && p->i < p->n) {
        char c = p->s[p->i];
        size_t at = p->i;
        uint32_t node;
        if (c == '"') {
            node = parse_literal(p);
        } else if (c == '[') {
            node = parse_class(p);
        } else if (c == '.') {
            p->i++;
            uint32_t any[2] = {0, 0x10FFFF};
            struct gram_cset cs = {0};
            if (!gram_cset_add(&cs, any[0], any[1]) || !gram_cset_drop_surrogates(&cs)) {
                gram_cset_free(&cs);
                node = check_ast(p, GRAM_NONE);
            } else {
                node = check_ast(p, gram_ast_chars(p->a, cs.r, cs.n / 2));
                gram_cset_free(&cs);
            }
        } else if (c == '(') {
            if (++p->nest > GRAM_MAX_NEST)
                return fail(p, at, "parentheses nest deeper than %d", GRAM_MAX_NEST);
            p->i++;
            skip_space(p, true);
            node = parse_alternates(p, true);
            if (node == GRAM_NONE) return GRAM_NONE;
            if (peek(p) != ')') return fail(p, p->i, "expected ')' (the group opened at %zu)", at);
            p->i++;
            p->nest--;
        } else if (c == '<' || c == '!') {
            return fail(p, at, "token items (<...>) are not supported");
        } else if (is_name_char((unsigned char)c)) {
            size_t b = p->i;
            while (p->i < p->n && is_name_char((unsigned char)p->s[p->i]))
                p->i++;
            uint32_t r = gram_ast_rule(p->a, p->s + b, (uint32_t)(p->i - b));
            if (r != GRAM_NONE && p->a->rule[r].body == GRAM_NONE && p->a->rule[r].ref_at == 0)
                p->a->rule[r].ref_at = (uint32_t)b + 1;
            node = check_ast(p, gram_ast_ref(p->a, r));
        } else {
            break;
        }
        if (node == GRAM_NONE) return GRAM_NONE;
        skip_space(p, nested);
        node = parse_postfix(p, node, nested);
        if (node == GRAM_NONE || !push_tmp(p, node)) return GRAM_NONE;
    }
    if (p->failed) return GRAM_NONE;
    /* an empty sequence may come before any item was pushed: no pointer arithmetic on NULL */
    uint32_t node =
        check_ast(p, gram_ast_list(p->a, GX_SEQ, p->tmp ? p->tmp + mark : NULL, p->ntmp - mark));
    p->ntmp = mark;
    return node;
}

static uint32_t parse_alternates(struct gp *p, bool nested) {
    uint32_t mark = p->ntmp;
    while (true) {
        uint32_t seq = parse_sequence(p, nested);
        if (seq == GRAM_NONE || !push_tmp(p, seq)) return GRAM_NONE;
        if (peek(p) != '|') break;
        p->i++;
        skip_space(p, true);
    }
    uint32_t node = check_ast(p, gram_ast_list(p->a, GX_ALT, p->tmp + mark, p->ntmp - mark));
    p->ntmp = mark;
    return node;
}

static bool parse_rule(struct gp *p) {
    size_t at = p->i;
    while (p->i < p->n && is_name_char((unsigned char)p->s[p->i]))
        p->i++;
    if (p->i == at) {
        fail(p, at, "expected a rule name");
        return false;
    }
    uint32_t r = check_ast(p, gram_ast_rule(p->a, p->s + at, (uint32_t)(p->i - at)));
    if (r == GRAM_NONE) return false;
    if (p->a->rule[r].body != GRAM_NONE) {
        fail(p, at, "rule '%.*s' is defined twice", (int)(p->i - at), p->s + at);
        return false;
    }
    skip_space(p, false);
    if (p->n - p->i < 3 || memcmp(p->s + p->i, "::=", 3) != 0) {
        fail(p, p->i, "expected '::=' after the rule name");
        return false;
    }
    p->i += 3;
    skip_space(p, true);
    uint32_t body = parse_alternates(p, false);
    if (body == GRAM_NONE) return false;
    p->a->rule[r].body = body;
    if (p->i < p->n && p->s[p->i] != '\n' && p->s[p->i] != '\r') {
        fail(p, p->i, "unexpected '%c' (expected the end of the rule)", p->s[p->i]);
        return false;
    }
    skip_space(p, true);
    return true;
}

smelt_status gram_gbnf_parse(struct gast *a, const char *text, size_t len, uint32_t *root,
                             struct err *e) {
    if (len > GRAM_MAX_TEXT)
        return err_set(e, SMELT_ERR_RANGE, "grammar: %zu bytes (at most %u)", len, GRAM_MAX_TEXT);
    struct gp p = {.s = text, .n = len, .a = a, .e = e};
    skip_space(&p, true);
    while (p.i < p.n && !p.failed)
        parse_rule(&p);
    free(p.tmp);
    if (p.failed) return e ? e->code : SMELT_ERR_INVALID;
    for (uint32_t r = 0; r < a->nrule; r++) {
        if (a->rule[r].body != GRAM_NONE) continue;
        p.failed = false;
        fail(&p, a->rule[r].ref_at ? a->rule[r].ref_at - 1 : 0, "rule '%s' is not defined",
             a->names + a->rule[r].name);
        return SMELT_ERR_INVALID;
    }
    uint32_t r = GRAM_NONE;
    for (uint32_t k = 0; k < a->nrule; k++)
        if (strcmp(a->names + a->rule[k].name, "root") == 0) r = k;
    if (r == GRAM_NONE) return err_set(e, SMELT_ERR_INVALID, "grammar: no rule named 'root'");
    *root = r;
    return SMELT_OK;
}

/* ---- renaming (gram_gbnf_prefix) ------------------------------------------------------------ */

static bool put_bytes(struct tok_buf *out, const char *s, size_t n) {
    if (!array_grow((void **)&out->p, &out->cap, out->n + n + 1, 1)) return false;
    memcpy(out->p + out->n, s, n);
    out->n += n;
    out->p[out->n] = 0;
    return true;
}

smelt_status gram_gbnf_prefix(const char *text, size_t len, const char *prefix, struct tok_buf *out,
                              struct err *e) {
    size_t pl = strlen(prefix);
    for (size_t k = 0; k < pl; k++)
        if (!is_name_char((unsigned char)prefix[k]))
            return err_set(e, SMELT_ERR_INVALID, "grammar: rule prefix '%s' is not a name", prefix);
    struct gp p = {.s = text, .n = len, .e = e};
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        size_t j = i + 1;
        if (c == '"' || c == '[') { /* a literal or a class, escapes and raw newlines included
                                     * (the parser takes a raw newline inside them too) */
            char close = c == '"' ? '"' : ']';
            while (j < len && text[j] != close)
                j += text[j] == '\\' && j + 1 < len ? 2 : 1;
            if (j >= len || text[j] != close) {
                fail(&p, i, "unterminated %s", c == '"' ? "literal" : "class");
                return p.e ? p.e->code : SMELT_ERR_INVALID;
            }
            j++;
        } else if (c == '#') { /* a comment */
            while (j < len && text[j] != '\n')
                j++;
        } else if (c == '{') { /* a repetition count */
            while (j < len && text[j] != '}' && text[j] != '\n')
                j++;
            if (j < len && text[j] == '}') j++;
        } else if (is_name_char((unsigned char)c)) {
            while (j < len && is_name_char((unsigned char)text[j]))
                j++;
            if (!put_bytes(out, prefix, pl))
                return err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
        }
        if (!put_bytes(out, text + i, j - i))
            return err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
        i = j;
    }
    return SMELT_OK;
}

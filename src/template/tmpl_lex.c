/* Chat-template lexer: jinja2's Lexer with trim_blocks and lstrip_blocks on.
 *
 * It reproduces jinja2 3.1's regex rules by hand, because whitespace handling is where
 * renders differ byte for byte:
 *   - the source's newlines (\r\n, \r, \n) become \n, and one trailing newline is dropped
 *     (keep_trailing_newline=False);
 *   - `{%-`/`{{-`/`{#-` strip all whitespace before the tag; `-%}`/`-}}`/`-#}` all after;
 *   - trim_blocks: one newline right after `%}` or `#}` is dropped (not after `}}`, not
 *     after `+%}`, not after `{% raw %}`);
 *   - lstrip_blocks: spaces/tabs between a line start and `{%`/`{#` are dropped, unless the
 *     tag is written `{%+`; "line start" includes the start of the template and the point
 *     right after a tag whose match ended with a newline;
 *   - inside a tag, `%}`/`}}` only end it when (), [] and {} are balanced;
 *   - string literals are decoded like Python's unicode-escape codec.
 */
#include "template/tmpl_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/ckd.h"

struct lx {
    struct tokens *t;
    const char *s;
    size_t n, pos;
    uint32_t line;
    size_t line_start; /* byte offset of the current line's start */
    struct err *e;
    char bal[TMPL_MAX_NEST];
    int nbal;
};

static const char *const tok_names[] = {
    [T_EOF] = "end of template", [T_DATA] = "template data", [T_VAR_BEGIN] = "begin of print statement",
    [T_VAR_END] = "end of print statement", [T_BLOCK_BEGIN] = "begin of statement block",
    [T_BLOCK_END] = "end of statement block", [T_NAME] = "name", [T_STRING] = "string",
    [T_INT] = "integer", [T_FLOAT] = "float", [T_ADD] = "+", [T_SUB] = "-", [T_DIV] = "/",
    [T_FLOORDIV] = "//", [T_MUL] = "*", [T_MOD] = "%", [T_POW] = "**", [T_TILDE] = "~",
    [T_LBRACKET] = "[", [T_RBRACKET] = "]", [T_LPAREN] = "(", [T_RPAREN] = ")",
    [T_LBRACE] = "{", [T_RBRACE] = "}", [T_EQ] = "==", [T_NE] = "!=", [T_GT] = ">",
    [T_GTEQ] = ">=", [T_LT] = "<", [T_LTEQ] = "<=", [T_ASSIGN] = "=", [T_DOT] = ".",
    [T_COLON] = ":", [T_PIPE] = "|", [T_COMMA] = ",", [T_SEMICOLON] = ";",
};

const char *tmpl_tok_name(int kind) {
    if (kind < 0 || kind >= (int)(sizeof tok_names / sizeof *tok_names) || !tok_names[kind])
        return "?";
    return tok_names[kind];
}

static uint32_t col_at(const struct lx *l, size_t pos) { return (uint32_t)(pos - l->line_start + 1); }

/* Advances line counting over s[from, to). */
static void count_lines(struct lx *l, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (l->s[i] == '\n') {
            l->line++;
            l->line_start = i + 1;
        }
}

static smelt_status lex_fail(struct lx *l, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static smelt_status lex_fail(struct lx *l, size_t pos, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* pos may be past the lines counted so far */
    uint32_t line = l->line;
    size_t ls = l->line_start;
    for (size_t i = l->pos; i < pos && i < l->n; i++)
        if (l->s[i] == '\n') line++, ls = i + 1;
    return err_set(l->e, SMELT_ERR_FORMAT, "line %u col %zu: %s", line, pos - ls + 1, msg);
}

static bool push_tok(struct lx *l, struct token tk) {
    if (!array_grow((void **)&l->t->v, &l->t->cap, l->t->n + 1, sizeof *l->t->v)) return false;
    l->t->v[l->t->n++] = tk;
    return true;
}

#define PUSH(tk)                                                                               \
    do {                                                                                       \
        if (!push_tok(l, tk)) return err_set(l->e, SMELT_ERR_NOMEM, "out of memory lexing");   \
    } while (0)

/* Python whitespace at s[i] (UTF-8): its byte length, or 0. */
static size_t ws_at(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return py_isspace(c) ? 1 : 0;
    size_t j = i;
    uint32_t cp = utf8_next(s, n, &j);
    return py_isspace(cp) ? j - i : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && (k = ws_at(s, n, i))) i += k;
    return i;
}

/* Length of text after removing trailing Python whitespace. */
static size_t rstrip_len(const char *s, size_t len) {
    size_t end = len, i = 0, last_non = 0;
    (void)end;
    while (i < len) {
        size_t k = ws_at(s, len, i);
        if (k) {
            i += k;
        } else {
            if ((unsigned char)s[i] < 0x80) i++;
            else utf8_next(s, len, &i);
            last_non = i;
        }
    }
    return last_non;
}

/* lstrip_blocks: the length to keep of text before a block/comment tag. */
static size_t lstrip_len(const char *s, size_t len, bool line_starting) {
    size_t lpos = 0;
    for (size_t i = len; i > 0; i--)
        if (s[i - 1] == '\n') {
            lpos = i;
            break;
        }
    if (!(lpos > 0 || line_starting) || lpos == len) return len;
    if (skip_ws(s, len, lpos) == len) return lpos;
    return len;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_id_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }
static bool is_id_char(unsigned char c) { return is_id_start(c) || is_digit((char)c); }

/* (\d+_)*\d+ at i: returns the end, or i when none. */
static size_t digits_us(const char *s, size_t n, size_t i) {
    if (i >= n || !is_digit(s[i])) return i;
    size_t j = i;
    for (;;) {
        while (j < n && is_digit(s[j])) j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
            j++;
            continue;
        }
        return j;
    }
}

/* jinja2's float_re at i (the caller checked the lookbehind): end or i. */
static size_t match_float(const char *s, size_t n, size_t i) {
    size_t j = digits_us(s, n, i);
    if (j == i) return i;
    /* alternative 1: (\.digits)? e[+-]?digits */
    size_t k = j;
    if (k < n && s[k] == '.') {
        size_t f = digits_us(s, n, k + 1);
        if (f > k + 1) k = f;
    }
    if (k < n && (s[k] | 32) == 'e') {
        size_t m = k + 1;
        if (m < n && (s[m] == '+' || s[m] == '-')) m++;
        size_t x = digits_us(s, n, m);
        if (x > m) return x;
    }
    /* jinja's regex backtracks: without the fraction, try e at j */
    if (k != j && j < n && (s[j] | 32) == 'e') {
        size_t m = j + 1;
        if (m < n && (s[m] == '+' || s[m] == '-')) m++;
        size_t x = digits_us(s, n, m);
        if (x > m) return x;
    }
    /* alternative 2: \.digits */
    if (j < n && s[j] == '.') {
        size_t f = digits_us(s, n, j + 1);
        if (f > j + 1) return f;
    }
    return i;
}

static bool is_radix_digit(char c, int radix) {
    if (radix == 2) return c == '0' || c == '1';
    if (radix == 8) return c >= '0' && c <= '7';
    if (radix == 16) return is_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f');
    return is_digit(c);
}

/* jinja2's integer_re at i: end or i; value in *v (false on overflow). */
static size_t match_int(const char *s, size_t n, size_t i, int64_t *v, bool *overflow) {
    *overflow = false;
    int radix = 10;
    size_t j = i;
    if (i + 1 < n && s[i] == '0' && ((s[i + 1] | 32) == 'b' || (s[i + 1] | 32) == 'o' || (s[i + 1] | 32) == 'x')) {
        radix = (s[i + 1] | 32) == 'b' ? 2 : (s[i + 1] | 32) == 'o' ? 8 : 16;
        j = i + 2;
        size_t st = j;
        while (j < n) {
            if (s[j] == '_' && j + 1 < n && is_radix_digit(s[j + 1], radix)) j += 2;
            else if (is_radix_digit(s[j], radix)) j++;
            else break;
        }
        if (j == st) radix = 10, j = i; /* not a prefixed literal: fall through */
        else goto value;
    }
    if (i < n && s[i] >= '1' && s[i] <= '9') {
        j = i + 1;
        while (j < n) {
            if (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])) j += 2;
            else if (is_digit(s[j])) j++;
            else break;
        }
    } else if (i < n && s[i] == '0') {
        j = i + 1;
        while (j < n) {
            if (s[j] == '_' && j + 1 < n && s[j + 1] == '0') j += 2;
            else if (s[j] == '0') j++;
            else break;
        }
    } else {
        return i;
    }
value:;
    uint64_t acc = 0;
    for (size_t k = (radix == 10 ? i : i + 2); k < j; k++) {
        if (s[k] == '_') continue;
        int d = is_digit(s[k]) ? s[k] - '0' : (s[k] | 32) - 'a' + 10;
        if (ckd_mul_u64(&acc, acc, (uint64_t)radix) || ckd_add_u64(&acc, acc, (uint64_t)d) ||
            acc > (uint64_t)INT64_MAX)
            *overflow = true;
    }
    *v = (int64_t)acc;
    return j;
}

static int hexval(char c) {
    if (is_digit(c)) return c - '0';
    c |= 32;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Decodes a string literal body like Python's unicode-escape. */
static smelt_status decode_string(struct lx *l, size_t at, const char *s, size_t n, char **out,
                                  size_t *out_len) {
    char *o = malloc(n * 4 + 1); /* an escape never grows more than 4x (\é -> \xe9) */
    if (!o) return err_set(l->e, SMELT_ERR_NOMEM, "out of memory lexing");
    size_t k = 0, i = 0;
    while (i < n) {
        if (s[i] != '\\') {
            o[k++] = s[i++];
            continue;
        }
        if (i + 1 >= n) { /* cannot happen: the lexer ensured a closing quote */
            o[k++] = '\\';
            i++;
            continue;
        }
        char c = s[i + 1];
        i += 2;
        uint32_t cp;
        int want = 0;
        switch (c) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = 7; continue;
        case 'b': o[k++] = 8; continue;
        case 'f': o[k++] = 12; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = 11; continue;
        case 'x': want = 2; break;
        case 'u': want = 4; break;
        case 'U': want = 8; break;
        case 'N':
            free(o);
            return lex_fail(l, at, "%s", "\\N{...} escapes are not supported in string literals");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += utf8_put(o + k, cp);
                continue;
            }
            if ((unsigned char)c >= 0x80) {
                /* backslashreplace turned the char into an escape that is then kept literally */
                size_t st = i - 1;
                uint32_t ch = utf8_next(s, n, &st);
                i = st;
                o[k++] = '\\';
                if (ch <= 0xff) k += (size_t)sprintf(o + k, "x%02x", ch);
                else if (ch <= 0xffff) k += (size_t)sprintf(o + k, "u%04x", ch);
                else k += (size_t)sprintf(o + k, "U%08x", ch);
                continue;
            }
            o[k++] = '\\';
            o[k++] = c;
            continue;
        }
        cp = 0;
        for (int d = 0; d < want; d++) {
            int h = i < n ? hexval(s[i]) : -1;
            if (h < 0) {
                free(o);
                return lex_fail(l, at, "%s", want == 2 ? "truncated \\xXX escape"
                                        : want == 4 ? "truncated \\uXXXX escape"
                                                    : "truncated \\UXXXXXXXX escape");
            }
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10ffff) {
            free(o);
            return lex_fail(l, at, "%s", "illegal Unicode character");
        }
        k += utf8_put(o + k, cp);
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return SMELT_OK;
}

static bool keep_string(struct tokens *t, char *s) {
    if (!array_grow((void **)&t->strings, &t->cap_strings, t->n_strings + 1, sizeof *t->strings))
        return false;
    t->strings[t->n_strings++] = s;
    return true;
}

struct op {
    const char *s;
    uint8_t kind;
};
static const struct op ops2[] = {{"//", T_FLOORDIV}, {"**", T_POW}, {"==", T_EQ},
                                 {"!=", T_NE},       {">=", T_GTEQ}, {"<=", T_LTEQ}};
static const struct op ops1[] = {
    {"+", T_ADD},      {"-", T_SUB},      {"/", T_DIV},    {"*", T_MUL},     {"%", T_MOD},
    {"~", T_TILDE},    {"[", T_LBRACKET}, {"]", T_RBRACKET}, {"(", T_LPAREN}, {")", T_RPAREN},
    {"{", T_LBRACE},   {"}", T_RBRACE},   {">", T_GT},     {"<", T_LT},      {"=", T_ASSIGN},
    {".", T_DOT},      {":", T_COLON},    {"|", T_PIPE},   {",", T_COMMA},   {";", T_SEMICOLON},
};

/* Lexes the inside of a {{ }} or {% %} tag starting at l->pos. Sets *line_starting from
 * the end match. Returns at the end tag (or end of input). */
static smelt_status lex_tag(struct lx *l, bool block, bool *line_starting) {
    const char *s = l->s;
    size_t n = l->n;
    l->nbal = 0;
    while (l->pos < n) {
        size_t p = l->pos;
        if (l->nbal == 0) {
            size_t end = 0;
            bool trim_after = false, strip_after = false;
            if (block) {
                if (p + 2 < n && s[p] == '+' && s[p + 1] == '%' && s[p + 2] == '}') end = p + 3;
                else if (p + 2 < n && s[p] == '-' && s[p + 1] == '%' && s[p + 2] == '}') end = p + 3, strip_after = true;
                else if (p + 1 < n && s[p] == '%' && s[p + 1] == '}') end = p + 2, trim_after = true;
            } else {
                if (p + 2 < n && s[p] == '-' && s[p + 1] == '}' && s[p + 2] == '}') end = p + 3, strip_after = true;
                else if (p + 1 < n && s[p] == '}' && s[p + 1] == '}') end = p + 2;
            }
            if (end) {
                PUSH(((struct token){.kind = block ? T_BLOCK_END : T_VAR_END, .line = l->line,
                                     .col = col_at(l, p)}));
                if (strip_after) end = skip_ws(s, n, end);
                else if (trim_after && end < n && s[end] == '\n') end++;
                *line_starting = end > p && s[end - 1] == '\n';
                count_lines(l, p, end);
                l->pos = end;
                return SMELT_OK;
            }
        }
        size_t w = skip_ws(s, n, p);
        if (w > p) {
            count_lines(l, p, w);
            l->pos = w;
            continue;
        }
        struct token tk = {.line = l->line, .col = col_at(l, p)};
        unsigned char c = (unsigned char)s[p];
        if (is_digit((char)c)) {
            size_t e = (p > 0 && s[p - 1] == '.') ? p : match_float(s, n, p);
            if (e > p) {
                char buf[128];
                size_t k = 0;
                for (size_t i = p; i < e && k < sizeof buf - 1; i++)
                    if (s[i] != '_') buf[k++] = s[i];
                buf[k] = 0;
                tk.kind = T_FLOAT;
                tk.f = strtod(buf, NULL);
                tk.p = s + p;
                tk.len = e - p;
                PUSH(tk);
                l->pos = e;
                continue;
            }
            bool ovf;
            e = match_int(s, n, p, &tk.i, &ovf);
            if (e > p) {
                if (ovf) return lex_fail(l, p, "%s", "integer literal too large (limit: 64-bit)");
                tk.kind = T_INT;
                tk.p = s + p;
                tk.len = e - p;
                PUSH(tk);
                l->pos = e;
                continue;
            }
        }
        if (is_id_start(c)) {
            size_t e = p + 1;
            while (e < n && is_id_char((unsigned char)s[e])) e++;
            tk.kind = T_NAME;
            tk.p = s + p;
            tk.len = e - p;
            PUSH(tk);
            l->pos = e;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t e = p + 1;
            while (e < n && s[e] != (char)c) e += (s[e] == '\\' && e + 1 < n) ? 2 : 1;
            if (e >= n) return lex_fail(l, p, "%s", "unterminated string literal");
            char *dec = NULL;
            size_t dlen = 0;
            smelt_status st = decode_string(l, p, s + p + 1, e - p - 1, &dec, &dlen);
            if (st) return st;
            if (!keep_string(l->t, dec)) {
                free(dec);
                return err_set(l->e, SMELT_ERR_NOMEM, "out of memory lexing");
            }
            tk.kind = T_STRING;
            tk.p = dec;
            tk.len = dlen;
            PUSH(tk);
            count_lines(l, p, e + 1);
            l->pos = e + 1;
            continue;
        }
        const struct op *op = NULL;
        for (size_t i = 0; i < sizeof ops2 / sizeof *ops2 && !op; i++)
            if (p + 1 < n && s[p] == ops2[i].s[0] && s[p + 1] == ops2[i].s[1]) op = &ops2[i];
        for (size_t i = 0; i < sizeof ops1 / sizeof *ops1 && !op; i++)
            if (s[p] == ops1[i].s[0]) op = &ops1[i];
        if (!op) {
            char ch[8] = {0};
            size_t j = p;
            utf8_next(s, n, &j);
            memcpy(ch, s + p, j - p < 4 ? j - p : 4);
            return lex_fail(l, p, "unexpected char '%s'", ch);
        }
        if (op->kind == T_LBRACE || op->kind == T_LPAREN || op->kind == T_LBRACKET) {
            if (l->nbal >= TMPL_MAX_NEST) return lex_fail(l, p, "%s", "brackets nested too deep");
            l->bal[l->nbal++] = op->kind == T_LBRACE ? '}' : op->kind == T_LPAREN ? ')' : ']';
        } else if (op->kind == T_RBRACE || op->kind == T_RPAREN || op->kind == T_RBRACKET) {
            if (!l->nbal) return lex_fail(l, p, "unexpected '%s'", op->s);
            char want = l->bal[--l->nbal];
            if (want != op->s[0]) {
                char m[64];
                snprintf(m, sizeof m, "unexpected '%s', expected '%c'", op->s, want);
                return lex_fail(l, p, "%s", m);
            }
        }
        tk.kind = op->kind;
        tk.p = s + p;
        tk.len = strlen(op->s);
        PUSH(tk);
        l->pos = p + tk.len;
    }
    return SMELT_OK; /* end of input inside a tag: the parser reports it */
}

static smelt_status emit_data(struct lx *l, size_t from, size_t len) {
    if (len) PUSH(((struct token){.kind = T_DATA, .line = l->line, .col = col_at(l, from), .p = l->s + from, .len = len}));
    return SMELT_OK;
}

/* `{%[-+]?\s*raw\s*(-%}\s*|%})` at p: end of the match, or 0. */
static size_t match_raw_begin(const char *s, size_t n, size_t p, char *sign) {
    size_t i = p + 2;
    *sign = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) *sign = s[i++];
    i = skip_ws(s, n, i);
    if (i + 3 > n || memcmp(s + i, "raw", 3)) return 0;
    i = skip_ws(s, n, i + 3);
    if (i + 2 < n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') return skip_ws(s, n, i + 3);
    if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') return i + 2;
    return 0;
}

/* Raw body until `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)`. */
static smelt_status lex_raw(struct lx *l, bool *line_starting) {
    const char *s = l->s;
    size_t n = l->n;
    for (size_t q = l->pos; q + 1 < n; q++) {
        if (s[q] != '{' || s[q + 1] != '%') continue;
        size_t i = q + 2;
        char sign = 0;
        if (i < n && (s[i] == '-' || s[i] == '+')) sign = s[i++];
        i = skip_ws(s, n, i);
        if (i + 6 > n || memcmp(s + i, "endraw", 6)) continue;
        i = skip_ws(s, n, i + 6);
        size_t end = 0;
        if (i + 2 < n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') end = i + 3;
        else if (i + 2 < n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') end = skip_ws(s, n, i + 3);
        else if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') {
            end = i + 2;
            if (end < n && s[end] == '\n') end++;
        }
        if (!end) continue;
        size_t len = q - l->pos;
        if (sign == '-') len = rstrip_len(s + l->pos, len);
        else if (sign != '+') len = lstrip_len(s + l->pos, len, *line_starting);
        smelt_status st = emit_data(l, l->pos, len);
        if (st) return st;
        *line_starting = s[end - 1] == '\n';
        count_lines(l, l->pos, end);
        l->pos = end;
        return SMELT_OK;
    }
    return lex_fail(l, l->pos, "%s", "missing end of raw directive ({% endraw %})");
}

smelt_status tmpl_lex(const char *src, size_t len, struct tokens *out, struct err *e) {
    memset(out, 0, sizeof *out);
    /* Normalize newlines; drop one trailing newline. */
    char *s = malloc(len + 1);
    if (!s) return err_set(e, SMELT_ERR_NOMEM, "out of memory lexing");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    out->src = s;

    struct lx lx = {.t = out, .s = s, .n = n, .line = 1, .e = e};
    struct lx *l = &lx;
    bool line_starting = true;
    smelt_status st;
    while (l->pos < n) {
        /* earliest {{, {% or {# */
        size_t q = l->pos;
        int kind = 0; /* 1 var, 2 block, 3 comment, 4 raw */
        size_t raw_end = 0;
        char sign = 0;
        for (; q + 1 < n; q++) {
            if (s[q] != '{') continue;
            char c = s[q + 1];
            if (c == '{') kind = 1;
            else if (c == '#') kind = 3;
            else if (c == '%') {
                raw_end = match_raw_begin(s, n, q, &sign);
                kind = raw_end ? 4 : 2;
            } else continue;
            break;
        }
        if (!kind) { /* the rest is data */
            if ((st = emit_data(l, l->pos, n - l->pos))) goto fail;
            count_lines(l, l->pos, n);
            l->pos = n;
            break;
        }
        if (kind != 4) sign = (q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+')) ? s[q + 2] : 0;
        size_t tlen = q - l->pos;
        if (sign == '-') tlen = rstrip_len(s + l->pos, tlen);
        else if (sign != '+' && kind != 1) tlen = lstrip_len(s + l->pos, tlen, line_starting);
        if ((st = emit_data(l, l->pos, tlen))) goto fail;
        count_lines(l, l->pos, q);
        l->pos = q;
        size_t after = q + 2 + (sign ? 1 : 0);
        if (kind == 4) {
            line_starting = s[raw_end - 1] == '\n';
            count_lines(l, q, raw_end);
            l->pos = raw_end;
            if ((st = lex_raw(l, &line_starting))) goto fail;
            continue;
        }
        if (kind == 3) {
            size_t end = 0;
            for (size_t c = after; c + 1 < n && !end; c++) {
                if (s[c] == '+' && c + 2 < n && s[c + 1] == '#' && s[c + 2] == '}') end = c + 3;
                else if (s[c] == '-' && c + 2 < n && s[c + 1] == '#' && s[c + 2] == '}') end = skip_ws(s, n, c + 3);
                else if (s[c] == '#' && s[c + 1] == '}') {
                    end = c + 2;
                    if (end < n && s[end] == '\n') end++;
                }
            }
            if (!end) {
                st = lex_fail(l, q, "%s", "missing end of comment tag");
                goto fail;
            }
            line_starting = s[end - 1] == '\n';
            count_lines(l, q, end);
            l->pos = end;
            continue;
        }
        if (!push_tok(l, (struct token){.kind = kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN,
                                        .line = l->line, .col = col_at(l, q)})) {
            st = err_set(e, SMELT_ERR_NOMEM, "out of memory lexing");
            goto fail;
        }
        line_starting = false;
        l->pos = after;
        if ((st = lex_tag(l, kind == 2, &line_starting))) goto fail;
    }
    if (!push_tok(l, (struct token){.kind = T_EOF, .line = l->line, .col = col_at(l, l->pos)})) {
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory lexing");
        goto fail;
    }
    return SMELT_OK;
fail:
    tmpl_tokens_free(out);
    return st;
}

void tmpl_tokens_free(struct tokens *t) {
    for (size_t i = 0; i < t->n_strings; i++) free(t->strings[i]);
    free(t->strings);
    free(t->v);
    free(t->src);
    memset(t, 0, sizeof *t);
}

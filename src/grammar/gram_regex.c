/* Regular expressions (the ECMAScript syntax of JSON Schema's "pattern") -> GBNF expressions.
 *
 * Supported: literals; . ; classes [...] [^...] with ranges and escapes; \d \D \w \W \s \S;
 * \t \n \r \v \f \0 \xHH \uHHHH \u{H..} \cX and identity escapes; groups ( ) (?: ) (?<name> );
 * alternation; quantifiers * + ? {n} {n,} {n,m} (lazy forms too: same language); ^ at the start
 * and $ at the end of the pattern or of a top-level alternative. Refused, naming the construct:
 * backreferences, lookaround, \b \B, \p{..}, anchors elsewhere, flags.
 *
 * Two modes (enum gram_re_mode):
 *   GRAM_RE_TEXT         the expression matches the whole text (anchors optional)
 *   GRAM_RE_JSON_STRING  the expression generates the inside of a JSON string whose decoded
 *                        value matches: characters JSON escapes (", \, U+0000..U+001F) are
 *                        written escaped, every other character raw (one encoding per
 *                        character, so decoded lengths and exclusions stay exact); a pattern
 *                        not anchored at an end may have any characters there (JSON Schema
 *                        patterns search, they are not implicitly anchored).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/gram_int.h"
#include "util/utf8.h"

struct rp {
    const char *s;
    size_t n, i;
    enum gram_re_mode mode;
    struct tok_buf *out;
    struct err *e;
    bool failed;
    int nest;
};

__attribute__((format(printf, 3, 4))) static bool fail(struct rp *p, smelt_status code,
                                                       const char *fmt, ...) {
    if (p->failed) return false;
    p->failed = true;
    va_list ap;
    va_start(ap, fmt);
    err_vset(p->e, code, fmt, ap);
    va_end(ap);
    err_prefix(p->e, "regex column %zu", p->i + 1);
    return false;
}

static bool put(struct rp *p, const char *s) {
    if (!gram_buf_puts(p->out, s)) return fail(p, SMELT_ERR_RANGE, "the grammar grew too large");
    return true;
}

static int peek(const struct rp *p) {
    return p->i < p->n ? (unsigned char)p->s[p->i] : -1;
}

/* ---- emitting characters ----------------------------------------------------------------- */

/* Emits a code point set (normalized) as one GBNF item. */
static bool put_set(struct rp *p, const struct gram_cset *cs) {
    if (cs->n == 0) return fail(p, SMELT_ERR_UNSUPPORTED, "a class that matches nothing");
    if (!gram_buf_chars(p->out, cs, p->mode == GRAM_RE_JSON_STRING))
        return fail(p, SMELT_ERR_RANGE, "the grammar grew too large");
    return true;
}

static bool put_char(struct rp *p, uint32_t cp) {
    struct gram_cset cs = {0};
    if (!gram_cset_add(&cs, cp, cp)) return fail(p, SMELT_ERR_NOMEM, "out of memory");
    bool ok = put_set(p, &cs);
    gram_cset_free(&cs);
    return ok;
}

/* ---- classes ------------------------------------------------------------------------------- */

static bool add(struct rp *p, struct gram_cset *cs, uint32_t lo, uint32_t hi) {
    if (!gram_cset_add(cs, lo, hi)) return fail(p, SMELT_ERR_NOMEM, "out of memory");
    return true;
}

/* \d \w \s (neg: \D \W \S) into cs. */
static bool add_shorthand(struct rp *p, struct gram_cset *cs, char c) {
    struct gram_cset t = {0};
    bool ok = true;
    switch (c | 0x20) {
    case 'd':
        ok = add(p, &t, '0', '9');
        break;
    case 'w':
        ok = add(p, &t, '0', '9') && add(p, &t, 'A', 'Z') && add(p, &t, 'a', 'z') &&
             add(p, &t, '_', '_');
        break;
    case 's': {
        static const uint32_t ws[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680,
                                      0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x202F,
                                      0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
        for (size_t k = 0; ok && k < sizeof ws / sizeof *ws; k += 2)
            ok = add(p, &t, ws[k], ws[k + 1]);
        break;
    }
    }
    gram_cset_norm(&t);
    if (ok && c >= 'A' && c <= 'Z' && !gram_cset_negate(&t))
        ok = fail(p, SMELT_ERR_NOMEM, "out of memory");
    for (uint32_t k = 0; ok && k < t.n; k += 2)
        ok = add(p, cs, t.r[k], t.r[k + 1]);
    gram_cset_free(&t);
    return ok;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex(struct rp *p, int digits, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < digits; k++) {
        int h = hexval(peek(p));
        if (h < 0) return fail(p, SMELT_ERR_INVALID, "expected %d hex digits", digits);
        *v = *v << 4 | (uint32_t)h;
        p->i++;
    }
    return true;
}

/* An escape after '\' (at p->i); either a character (*cp, returns 1) or a shorthand class
 * added to cs (returns 2); 0 on error. in_class: inside [...] (\b is backspace there). */
static int parse_escape(struct rp *p, struct gram_cset *cs, uint32_t *cp, bool in_class) {
    if (p->i >= p->n) return fail(p, SMELT_ERR_INVALID, "'\\' at the end of the pattern"), 0;
    size_t at = p->i - 1; /* the backslash: where errors point */
    char c = p->s[p->i++];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        return add_shorthand(p, cs, c) ? 2 : 0;
    case 't':
        *cp = '\t';
        return 1;
    case 'n':
        *cp = '\n';
        return 1;
    case 'r':
        *cp = '\r';
        return 1;
    case 'v':
        *cp = '\v';
        return 1;
    case 'f':
        *cp = '\f';
        return 1;
    case '0':
        if (peek(p) >= '0' && peek(p) <= '9')
            return p->i = at, fail(p, SMELT_ERR_UNSUPPORTED, "octal escapes are not supported"), 0;
        *cp = 0;
        return 1;
    case 'x':
        return hex(p, 2, cp) ? 1 : 0;
    case 'u':
        if (peek(p) == '{') {
            p->i++;
            uint32_t v = 0;
            int nd = 0;
            while (hexval(peek(p)) >= 0 && nd < 7)
                v = v << 4 | (uint32_t)hexval(p->s[p->i++]), nd++;
            if (peek(p) != '}' || nd == 0 || v > 0x10FFFF)
                return fail(p, SMELT_ERR_INVALID, "bad \\u{...} escape"), 0;
            p->i++;
            *cp = v;
        } else if (!hex(p, 4, cp)) {
            return 0;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return fail(p, SMELT_ERR_UNSUPPORTED, "surrogate escapes are not supported"), 0;
        return 1;
    case 'c': {
        int l = peek(p);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
            return fail(p, SMELT_ERR_INVALID, "bad \\c escape"), 0;
        p->i++;
        *cp = (uint32_t)(l & 31);
        return 1;
    }
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 1;
        }
        return p->i = at, fail(p, SMELT_ERR_UNSUPPORTED, "word boundaries (\\b) are not supported"),
               0;
    case 'B':
        return p->i = at, fail(p, SMELT_ERR_UNSUPPORTED, "\\B is not supported"), 0;
    case 'p':
    case 'P':
        return p->i = at,
               fail(p, SMELT_ERR_UNSUPPORTED,
                    "Unicode property classes (\\p{...}) are not supported"),
               0;
    case 'k':
        return p->i = at, fail(p, SMELT_ERR_UNSUPPORTED, "named backreferences are not supported"),
               0;
    default:
        if (c >= '1' && c <= '9')
            return p->i = at, fail(p, SMELT_ERR_UNSUPPORTED, "backreferences are not supported"), 0;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return fail(p, SMELT_ERR_INVALID, "unknown escape '\\%c'", c), 0;
        /* identity escape: the character itself (UTF-8 decoded) */
        p->i--;
        {
            size_t k = utf8_decode((const uint8_t *)p->s + p->i, p->n - p->i, cp);
            if (!k) return fail(p, SMELT_ERR_INVALID, "invalid UTF-8"), 0;
            p->i += k;
        }
        return 1;
    }
}

static bool read_char(struct rp *p, uint32_t *cp) {
    size_t k = utf8_decode((const uint8_t *)p->s + p->i, p->n - p->i, cp);
    if (!k) return fail(p, SMELT_ERR_INVALID, "invalid UTF-8");
    p->i += k;
    return true;
}

static bool parse_class(struct rp *p) {
    p->i++; /* [ */
    bool neg = peek(p) == '^';
    if (neg) p->i++;
    struct gram_cset cs = {0};
    bool ok = true, first = true;
    while (ok) {
        if (p->i >= p->n) {
            ok = fail(p, SMELT_ERR_INVALID, "unterminated character class");
            break;
        }
        if (p->s[p->i] == ']' && !first) break;
        if (p->s[p->i] == ']' && first) { /* ECMAScript: [] matches nothing, [^] anything */
            break;
        }
        first = false;
        uint32_t lo, hi;
        int kind = 1;
        if (p->s[p->i] == '\\') {
            p->i++;
            kind = parse_escape(p, &cs, &lo, true);
            if (!kind) break;
        } else if (!read_char(p, &lo)) {
            break;
        }
        if (kind == 2) continue;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                struct gram_cset junk = {0};
                int k2 = parse_escape(p, &junk, &hi, true);
                gram_cset_free(&junk);
                if (k2 != 1) {
                    if (k2 == 2) fail(p, SMELT_ERR_INVALID, "a class shorthand cannot end a range");
                    break;
                }
            } else if (!read_char(p, &hi)) {
                break;
            }
            if (hi < lo) {
                ok = fail(p, SMELT_ERR_INVALID, "character range out of order");
                break;
            }
        }
        ok = add(p, &cs, lo, hi);
    }
    if (p->failed) {
        gram_cset_free(&cs);
        return false;
    }
    p->i++; /* ] */
    gram_cset_norm(&cs);
    if (!(neg ? gram_cset_negate(&cs) : gram_cset_drop_surrogates(&cs))) {
        gram_cset_free(&cs);
        return fail(p, SMELT_ERR_NOMEM, "out of memory");
    }
    ok = put_set(p, &cs);
    gram_cset_free(&cs);
    return ok;
}

/* ---- structure ------------------------------------------------------------------------------ */

static bool parse_alt(struct rp *p, bool top);

static bool parse_uint(struct rp *p, uint32_t *v) {
    uint64_t x = 0;
    if (peek(p) < '0' || peek(p) > '9') return false;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (x > GRAM_MAX_REPEAT)
            return fail(p, SMELT_ERR_RANGE, "repetition count above the limit %u", GRAM_MAX_REPEAT);
    }
    *v = (uint32_t)x;
    return true;
}

/* A quantifier after an atom, if any (appended to the output); false on error. */
static bool parse_quant(struct rp *p) {
    int c = peek(p);
    char t[48];
    if (c == '*' || c == '+' || c == '?') {
        p->i++;
        t[0] = (char)c;
        t[1] = 0;
    } else if (c == '{') {
        size_t at = p->i++;
        uint32_t min, max;
        if (!parse_uint(p, &min)) {
            if (p->failed) return false;
            p->i = at; /* not a quantifier: a literal '{' (Annex B) handled by the caller */
            return true;
        }
        max = min;
        if (peek(p) == ',') {
            p->i++;
            max = GRAM_INF;
            if (peek(p) >= '0' && peek(p) <= '9' && !parse_uint(p, &max)) return false;
        }
        if (peek(p) != '}') {
            if (p->failed) return false;
            p->i = at;
            return true;
        }
        p->i++;
        if (max < min)
            return fail(p, SMELT_ERR_INVALID, "quantifier {%u,%u} out of order", min, max);
        if (max == GRAM_INF)
            snprintf(t, sizeof t, "{%u,}", min);
        else
            snprintf(t, sizeof t, "{%u,%u}", min, max);
    } else {
        return true;
    }
    if (peek(p) == '?') p->i++; /* lazy: same language */
    if (!put(p, t)) return false;
    c = peek(p);
    if (c == '*' || c == '+' || c == '?' ||
        (c == '{' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9'))
        return fail(p, SMELT_ERR_INVALID, "nothing to repeat");
    return true;
}

/* One alternative: atoms with quantifiers until | or ) or the end. */
static bool parse_seq(struct rp *p, bool top) {
    bool any = false;
    if (!put(p, "(")) return false;
    while (p->i < p->n && !p->failed) {
        char c = p->s[p->i];
        if (c == '|' || c == ')') break;
        size_t at = p->i;
        if (c == '^') {
            if (!(top && at == 0) && !(top && p->s[at - 1] == '|'))
                return fail(p, SMELT_ERR_UNSUPPORTED, "'^' is supported only at the start");
            p->i++;
            continue;
        }
        if (c == '$') {
            if (!top || (at + 1 < p->n && p->s[at + 1] != '|'))
                return fail(p, SMELT_ERR_UNSUPPORTED, "'$' is supported only at the end");
            p->i++;
            continue;
        }
        if (any && !put(p, " ")) return false;
        any = true;
        if (c == '(') {
            p->i++;
            if (peek(p) == '?') {
                p->i++;
                int k = peek(p);
                if (k == ':') {
                    p->i++;
                } else if (k == '<' && p->i + 1 < p->n && p->s[p->i + 1] != '=' &&
                           p->s[p->i + 1] != '!') {
                    while (p->i < p->n && p->s[p->i] != '>')
                        p->i++;
                    if (p->i >= p->n) return fail(p, SMELT_ERR_INVALID, "unterminated group name");
                    p->i++;
                } else if (k == '=' || k == '!' || k == '<') {
                    return fail(p, SMELT_ERR_UNSUPPORTED, "lookaround is not supported");
                } else {
                    return fail(p, SMELT_ERR_UNSUPPORTED, "group flags are not supported");
                }
            }
            if (++p->nest > GRAM_MAX_NEST)
                return fail(p, SMELT_ERR_RANGE, "groups nest deeper than %d", GRAM_MAX_NEST);
            if (!parse_alt(p, false)) return false;
            if (peek(p) != ')') return fail(p, SMELT_ERR_INVALID, "missing ')'");
            p->i++;
            p->nest--;
        } else if (c == '[') {
            if (!parse_class(p)) return false;
        } else if (c == '.') {
            p->i++;
            struct gram_cset cs = {0};
            bool ok =
                add(p, &cs, '\n', '\n') && add(p, &cs, '\r', '\r') && add(p, &cs, 0x2028, 0x2029);
            gram_cset_norm(&cs);
            if (ok && !gram_cset_negate(&cs)) ok = fail(p, SMELT_ERR_NOMEM, "out of memory");
            ok = ok && put_set(p, &cs);
            gram_cset_free(&cs);
            if (!ok) return false;
        } else if (c == '\\') {
            p->i++;
            struct gram_cset cs = {0};
            uint32_t cp;
            int k = parse_escape(p, &cs, &cp, false);
            bool ok = k == 1   ? put_char(p, cp)
                      : k == 2 ? (gram_cset_norm(&cs), put_set(p, &cs))
                               : false;
            gram_cset_free(&cs);
            if (!ok) return false;
        } else if (c == '*' || c == '+' || c == '?') {
            return fail(p, SMELT_ERR_INVALID, "nothing to repeat");
        } else {
            uint32_t cp;
            if (!read_char(p, &cp) || !put_char(p, cp)) return false;
        }
        if (!parse_quant(p)) return false;
    }
    if (!any && !put(p, "\"\"")) return false;
    return put(p, ")");
}

static bool parse_alt(struct rp *p, bool top) {
    if (!put(p, "(")) return false;
    while (true) {
        if (!parse_seq(p, top)) return false;
        if (peek(p) != '|') break;
        p->i++;
        if (!put(p, " | ")) return false;
    }
    return put(p, ")");
}

/* Top level in JSON-string mode: each alternative gets free characters where it is not
 * anchored. */
static bool json_top(struct rp *p) {
    static const char any[] =
        "([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))*";
    if (!put(p, "(")) return false;
    while (true) {
        size_t b = p->i, end = b;
        int depth = 0;
        bool in_class = false;
        /* find where this top-level alternative ends */
        while (end < p->n) {
            char c = p->s[end];
            if (c == '\\') {
                end += 2;
                continue;
            }
            if (in_class) {
                if (c == ']') in_class = false;
            } else if (c == '[') {
                in_class = true;
            } else if (c == '(') {
                depth++;
            } else if (c == ')') {
                depth--;
            } else if (c == '|' && depth == 0) {
                break;
            }
            end++;
        }
        if (end > p->n) end = p->n;
        bool start = p->i < p->n && p->s[p->i] == '^';
        bool stop = end > b && p->s[end - 1] == '$' && (end < 2 || p->s[end - 2] != '\\');
        if (!start && !put(p, any)) return false;
        if (!put(p, " ") || !parse_seq(p, true)) return false;
        if (!stop && (!put(p, " ") || !put(p, any))) return false;
        if (peek(p) != '|') break;
        p->i++;
        if (!put(p, " | ")) return false;
    }
    return put(p, ")");
}

smelt_status gram_regex_gbnf(const char *re, size_t len, enum gram_re_mode mode,
                             struct tok_buf *out, struct err *e) {
    if (len > 65536) return err_set(e, SMELT_ERR_RANGE, "regex: %zu bytes (at most 65536)", len);
    struct rp p = {.s = re, .n = len, .mode = mode, .out = out, .e = e};
    bool ok = mode == GRAM_RE_JSON_STRING ? json_top(&p) : parse_alt(&p, true);
    if (ok && p.i < p.n) ok = fail(&p, SMELT_ERR_INVALID, "unmatched ')'");
    return ok ? SMELT_OK : (e ? e->code : SMELT_ERR_INVALID);
}

smelt_status gram_regex_to_gbnf(const char *re, size_t len, struct tok_buf *out, struct err *e) {
    return gram_regex_gbnf(re, len, GRAM_RE_TEXT, out, e);
}

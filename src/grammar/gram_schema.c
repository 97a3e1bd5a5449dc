/* JSON Schema -> GBNF (gram.h): each subschema becomes a rule or an expression; the automaton
 * inlines what does not recurse.
 *
 * The generated language is a subset of the schema's instances, never a superset: every
 * output validates. Where JSON Schema allows more than the grammar produces (the choices are
 * listed in docs/structured-output.md) the grammar takes the narrower road: no properties
 * beyond "properties" unless additionalProperties says so, properties in the schema's
 * order, no extra items after prefixItems unless asked, strings with one encoding per
 * character where lengths or patterns count characters, whitespace bounded as llama.cpp does.
 * A keyword that cannot be enforced is refused with its JSON path; annotations and unknown
 * keywords are ignored, as validators ignore them.
 *
 * Bounds: nesting (GRAM_MAX_NEST), repetition counts (GRAM_MAX_REPEAT), merged subschemas
 * (MAX_MERGES), the grammar text (GRAM_MAX_TEXT); the automaton stage bounds the rest.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar/gram_int.h"
#include "util/utf8.h"

#define MAX_MERGES 4096
#define INT_MAXD 16 /* integer parts of at most 16 digits, as llama.cpp */

struct memo {
    const json_t *s;
    uint32_t id;
};

struct sc {
    const json_t *root;
    struct tok_buf *out; /* the rules */
    struct err *e;
    bool failed;
    uint32_t n_rules;
    struct memo *memo;
    uint32_t n_memo;
    size_t cap_memo;
    json_t *owned; /* merged schemas, freed at the end */
    int depth, merges, deref_depth;
    char path[512];
    size_t plen;
    bool need_value, need_string, need_number, need_jchar, need_lchar;
};

__attribute__((format(printf, 3, 4))) static bool fail(struct sc *c, smelt_status code,
                                                       const char *fmt, ...) {
    if (c->failed) return false;
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    err_vset(c->e, code, fmt, ap);
    va_end(ap);
    /* a deep path keeps its end, where the problem is */
    const char *path = c->plen ? c->path : "(root)";
    if (c->plen > 160) path = c->path + c->plen - 160;
    err_prefix(c->e, "schema %s%s", c->plen > 160 ? "..." : "", path);
    return false;
}

static bool nomem(struct sc *c) {
    return fail(c, SMELT_ERR_NOMEM, "out of memory");
}

static bool put(struct sc *c, struct tok_buf *b, const char *s) {
    if (!gram_buf_puts(b, s))
        return fail(c, SMELT_ERR_RANGE, "the grammar grew past %u bytes", GRAM_MAX_TEXT);
    return true;
}

__attribute__((format(printf, 3, 4))) static bool putf(struct sc *c, struct tok_buf *b,
                                                       const char *fmt, ...) {
    char t[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof t) return fail(c, SMELT_ERR_INTERNAL, "format overflow");
    return put(c, b, t);
}

/* ---- paths ----------------------------------------------------------------------------------- */

/* Appends "/seg" (JSON-pointer escaped) to the path; returns the old length for path_pop. */
static size_t path_push(struct sc *c, const char *seg) {
    size_t old = c->plen;
    size_t w = c->plen;
    if (w + 2 < sizeof c->path) c->path[w++] = '/';
    for (const char *s = seg; *s && w + 3 < sizeof c->path; s++) {
        if (*s == '~' || *s == '/') {
            c->path[w++] = '~';
            c->path[w++] = *s == '~' ? '0' : '1';
        } else {
            c->path[w++] = *s;
        }
    }
    c->path[w] = 0;
    c->plen = w;
    return old;
}

static size_t path_push_i(struct sc *c, const char *seg, size_t i) {
    size_t old = path_push(c, seg);
    char t[24];
    snprintf(t, sizeof t, "%zu", i);
    path_push(c, t);
    return old;
}

static void path_pop(struct sc *c, size_t old) {
    c->plen = old;
    c->path[old] = 0;
}

/* ---- literals ------------------------------------------------------------------------------- */

/* A GBNF literal of the given bytes (UTF-8). */
static bool put_lit(struct sc *c, struct tok_buf *b, const char *s, size_t n) {
    if (!put(c, b, "\"")) return false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!k) return fail(c, SMELT_ERR_INVALID, "invalid UTF-8 in a string");
        if (!gram_buf_gbnf_char(b, cp))
            return fail(c, SMELT_ERR_RANGE, "the grammar grew too large");
        i += k;
    }
    return put(c, b, "\"");
}

/* The canonical JSON text of a string: '"', '\\' and controls escaped (short forms, else
 * \u00xx), everything else raw. */
static bool json_string_text(struct sc *c, struct tok_buf *t, const char *s, size_t n) {
    bool ok = gram_buf_put(t, "\"", 1);
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"':
            ok = gram_buf_puts(t, "\\\"");
            break;
        case '\\':
            ok = gram_buf_puts(t, "\\\\");
            break;
        case '\b':
            ok = gram_buf_puts(t, "\\b");
            break;
        case '\f':
            ok = gram_buf_puts(t, "\\f");
            break;
        case '\n':
            ok = gram_buf_puts(t, "\\n");
            break;
        case '\r':
            ok = gram_buf_puts(t, "\\r");
            break;
        case '\t':
            ok = gram_buf_puts(t, "\\t");
            break;
        default:
            ok = ch < 0x20 ? gram_buf_printf(t, "\\u%04x", ch) : gram_buf_put(t, s + i, 1);
        }
    }
    ok = ok && gram_buf_put(t, "\"", 1);
    return ok || nomem(c);
}

/* A GBNF literal matching the JSON text of value v (compact). */
static bool put_json_value(struct sc *c, struct tok_buf *b, const json_t *v) {
    struct tok_buf t = {0};
    bool ok;
    if (json_is_string(v)) {
        ok = json_string_text(c, &t, json_string_value(v), json_string_length(v));
    } else {
        char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        ok = d && gram_buf_puts(&t, d);
        free(d);
        if (!ok) nomem(c);
    }
    ok = ok && put_lit(c, b, t.p, t.n);
    tok_buf_free(&t);
    return ok;
}

/* ---- rules ------------------------------------------------------------------------------------
 */

/* Appends "name ::= body\n" to the rules. */
static bool emit_rule(struct sc *c, const char *name, const struct tok_buf *body) {
    return put(c, c->out, name) && put(c, c->out, " ::= ") &&
           put(c, c->out, body->p ? body->p : "\"\"") && put(c, c->out, "\n");
}

/* ---- keywords ---------------------------------------------------------------------------------
 */

static const char *const ANNOTATIONS[] = {"title",
                                          "description",
                                          "default",
                                          "examples",
                                          "example",
                                          "$schema",
                                          "$id",
                                          "id",
                                          "$comment",
                                          "deprecated",
                                          "readOnly",
                                          "writeOnly",
                                          "contentMediaType",
                                          "contentEncoding",
                                          "contentSchema",
                                          "$anchor",
                                          "$vocabulary",
                                          "discriminator",
                                          "xml",
                                          "externalDocs",
                                          "nullable",
                                          "$defs",
                                          "definitions",
                                          "$dynamicAnchor",
                                          "$recursiveAnchor",
                                          NULL};

static const char *const SUPPORTED[] = {"type",
                                        "enum",
                                        "const",
                                        "properties",
                                        "required",
                                        "additionalProperties",
                                        "items",
                                        "prefixItems",
                                        "additionalItems",
                                        "minItems",
                                        "maxItems",
                                        "minLength",
                                        "maxLength",
                                        "pattern",
                                        "format",
                                        "minimum",
                                        "maximum",
                                        "exclusiveMinimum",
                                        "exclusiveMaximum",
                                        "anyOf",
                                        "oneOf",
                                        "allOf",
                                        "$ref",
                                        "minProperties",
                                        "maxProperties",
                                        "uniqueItems",
                                        "multipleOf",
                                        NULL};

static const char *const REFUSED[] = {"patternProperties",
                                      "propertyNames",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "dependencies",
                                      "if",
                                      "then",
                                      "else",
                                      "not",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "unevaluatedProperties",
                                      "unevaluatedItems",
                                      "$dynamicRef",
                                      "$recursiveRef",
                                      NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (strcmp(*l, k) == 0) return true;
    return false;
}

/* Refuses the keywords that cannot be enforced, naming them. */
static bool check_keywords(struct sc *c, const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(REFUSED, k)) return fail(c, SMELT_ERR_UNSUPPORTED, "'%s' is not supported", k);
    }
    return true;
}

/* Whether s has a keyword that constrains values (not an annotation, not unknown). */
static bool has_validation(const json_t *s, const char *except) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (except && strcmp(k, except) == 0) continue;
        if (in_list(SUPPORTED, k) || in_list(REFUSED, k)) return true;
    }
    return false;
}

/* ---- $ref ----------------------------------------------------------------------------------- */

static int hexd(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The schema a local reference ("#", "#/a/b" with ~0 ~1 and %XX escapes) points to. */
static const json_t *resolve(struct sc *c, const char *ref) {
    if (ref[0] != '#')
        return fail(c, SMELT_ERR_UNSUPPORTED,
                    "$ref '%.100s': only local references (#/...) are supported", ref),
               NULL;
    const json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/')
        return fail(c, SMELT_ERR_UNSUPPORTED, "$ref '%.100s': anchors are not supported", ref),
               NULL;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t w = 0;
        while (*p && *p != '/') {
            int ch = (unsigned char)*p++;
            if (ch == '%' && hexd(p[0]) >= 0 && hexd(p[1]) >= 0) {
                ch = hexd(p[0]) * 16 + hexd(p[1]);
                p += 2;
            } else if (ch == '~' && (*p == '0' || *p == '1')) {
                ch = *p++ == '0' ? '~' : '/';
            }
            if (w + 1 >= sizeof seg)
                return fail(c, SMELT_ERR_INVALID, "$ref '%.100s': segment too long", ref), NULL;
            seg[w++] = (char)ch;
        }
        seg[w] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            cur = *end || !w ? NULL : json_array_get(cur, i);
        } else {
            cur = NULL;
        }
        if (!cur) return fail(c, SMELT_ERR_INVALID, "$ref '%.100s' does not resolve", ref), NULL;
    }
    return cur;
}

/* ---- merging (allOf, anyOf branches, $ref siblings) ---------------------------------------- */

static bool json_same(const json_t *a, const json_t *b) {
    return json_equal((json_t *)a, (json_t *)b);
}

static json_t *own(struct sc *c, json_t *v) {
    if (!v) return nomem(c), NULL;
    if (json_array_append_new(c->owned, v)) return nomem(c), NULL;
    return v;
}

static const json_t *deref(struct sc *c, const json_t *s);

/* A schema accepting what both a and b accept, for the keywords this compiler knows; refuses
 * combinations it cannot express. Boolean schemas: true is neutral, false absorbs. */
static const json_t *merge(struct sc *c, const json_t *a, const json_t *b) {
    if (++c->merges > MAX_MERGES)
        return fail(c, SMELT_ERR_RANGE, "more than %d merged subschemas", MAX_MERGES), NULL;
    if (json_is_true(a) || (json_is_object(a) && json_object_size(a) == 0)) return b;
    if (json_is_true(b) || (json_is_object(b) && json_object_size(b) == 0)) return a;
    if (json_is_false(a) || json_is_false(b)) return json_false();
    if (!json_is_object(a) || !json_is_object(b))
        return fail(c, SMELT_ERR_INVALID, "a schema must be an object or a boolean"), NULL;
    a = deref(c, a);
    b = deref(c, b);
    if (!a || !b) return NULL;
    json_t *m = own(c, json_deep_copy(a));
    if (!m) return NULL;
    const char *k;
    json_t *bv;
    json_object_foreach((json_t *)b, k, bv) {
        json_t *av = json_object_get(m, k);
        if (!av) {
            json_object_set(m, k, bv);
            continue;
        }
        if (json_same(av, bv) || in_list(ANNOTATIONS, k) || !in_list(SUPPORTED, k)) continue;
        if (!strcmp(k, "type")) {
            /* intersect; integer is inside number */
            json_t *t = json_array();
            static const char *const names[] = {"null",   "boolean", "object", "array",
                                                "string", "number",  "integer"};
            for (int i = 0; i < 7; i++) {
                bool ia = false, ib = false;
                for (int side = 0; side < 2; side++) {
                    const json_t *x = side ? bv : av;
                    bool *hit = side ? &ib : &ia;
                    size_t j;
                    json_t *e;
                    if (json_is_string(x)) {
                        *hit = !strcmp(json_string_value(x), names[i]) ||
                               (i == 6 && !strcmp(json_string_value(x), "number"));
                    } else {
                        json_array_foreach(
                            (json_t *)x, j,
                            e) if (json_is_string(e) &&
                                   (!strcmp(json_string_value(e), names[i]) ||
                                    (i == 6 && !strcmp(json_string_value(e), "number")))) *hit =
                            true;
                    }
                }
                if (ia && ib) json_array_append_new(t, json_string(names[i]));
            }
            if (json_array_size(t) == 0) {
                json_decref(t);
                return fail(c, SMELT_ERR_UNSUPPORTED, "allOf: the types do not intersect"), NULL;
            }
            json_object_set_new(m, k, t);
        } else if (!strcmp(k, "properties")) {
            json_t *props = own(c, json_deep_copy(av));
            if (!props) return NULL;
            const char *pk;
            json_t *pv;
            json_object_foreach(bv, pk, pv) {
                json_t *old = json_object_get(props, pk);
                const json_t *mm = old ? merge(c, old, pv) : pv;
                if (!mm) return NULL;
                json_object_set(props, pk, (json_t *)mm);
            }
            json_object_set(m, k, props);
        } else if (!strcmp(k, "required")) {
            json_t *r = json_deep_copy(av);
            size_t j;
            json_t *e;
            json_array_foreach(bv, j, e) {
                bool have = false;
                size_t i2;
                json_t *e2;
                json_array_foreach(r, i2, e2) have |= json_same(e, e2);
                if (!have) json_array_append(r, e);
            }
            json_object_set_new(m, k, r);
        } else if (!strcmp(k, "minLength") || !strcmp(k, "minItems") || !strcmp(k, "minimum") ||
                   !strcmp(k, "minProperties")) {
            if (json_number_value(bv) > json_number_value(av)) json_object_set(m, k, bv);
        } else if (!strcmp(k, "maxLength") || !strcmp(k, "maxItems") || !strcmp(k, "maximum") ||
                   !strcmp(k, "maxProperties")) {
            if (json_number_value(bv) < json_number_value(av)) json_object_set(m, k, bv);
        } else if (!strcmp(k, "items") || !strcmp(k, "additionalProperties")) {
            const json_t *mm = merge(c, av, bv);
            if (!mm) return NULL;
            json_object_set(m, k, (json_t *)mm);
        } else if (!strcmp(k, "enum") || !strcmp(k, "const")) {
            json_t *ea = !strcmp(k, "const") ? json_pack("[O]", av) : json_incref(av);
            json_t *r = json_array();
            size_t j;
            json_t *e;
            json_array_foreach(ea, j, e) {
                bool in_b = json_same(e, bv);
                size_t i2;
                json_t *e2;
                if (json_is_array(bv) && !strcmp(k, "enum"))
                    json_array_foreach(bv, i2, e2) in_b |= json_same(e, e2);
                if (in_b) json_array_append(r, e);
            }
            json_decref(ea);
            json_object_del(m, "const");
            json_object_set_new(m, "enum", r);
        } else {
            return fail(c, SMELT_ERR_UNSUPPORTED, "allOf: '%s' differs between the subschemas", k),
                   NULL;
        }
    }
    /* additionalProperties false on one side: the other side's extra properties are gone */
    for (int side = 0; side < 2; side++) {
        const json_t *x = side ? b : a, *y = side ? a : b;
        if (!json_is_false(json_object_get(x, "additionalProperties"))) continue;
        json_t *xp = json_object_get(x, "properties"), *yp = json_object_get(y, "properties");
        json_t *mp = json_object_get(m, "properties");
        const char *pk;
        json_t *pv;
        void *tmp;
        if (mp)
            json_object_foreach_safe(mp, tmp, pk,
                                     pv) if (!json_object_get(xp, pk) && json_object_get(yp, pk))
                json_object_del(mp, pk);
    }
    return m;
}

/* s without its $ref: the target merged with the siblings (bounded by the merge count). */
static const json_t *deref(struct sc *c, const json_t *s) {
    const json_t *r = json_object_get(s, "$ref");
    if (!r) return s;
    if (c->deref_depth > 32)
        return fail(c, SMELT_ERR_UNSUPPORTED,
                    "$ref with sibling keywords that recurses is not supported"),
               NULL;
    if (!json_is_string(r)) return fail(c, SMELT_ERR_INVALID, "$ref must be a string"), NULL;
    const json_t *t = resolve(c, json_string_value(r));
    if (!t) return NULL;
    json_t *rest = own(c, json_deep_copy(s));
    if (!rest) return NULL;
    json_object_del(rest, "$ref");
    c->deref_depth++;
    const json_t *m = merge(c, t, rest);
    c->deref_depth--;
    return m;
}

/* ---- numbers -------------------------------------------------------------------------------- */

static void digits(uint64_t v, char *out, int n) {
    for (int k = n - 1; k >= 0; k--, v /= 10)
        out[k] = (char)('0' + v % 10);
    out[n] = 0;
}

static int ndigits(uint64_t v) {
    int n = 1;
    while (v >= 10)
        v /= 10, n++;
    return n;
}

static bool all_digit(const char *s, int n, char d) {
    for (int k = 0; k < n; k++)
        if (s[k] != d) return false;
    return true;
}

/* Numbers of n digits from lo to hi (digit strings of length n, not terminated) as GBNF
 * alternatives. */
static bool same_len(struct sc *c, struct tok_buf *b, const char *lo, const char *hi, int n) {
    if (n == 0) return put(c, b, "\"\"");
    if (!strncmp(lo, hi, (size_t)n)) return put_lit(c, b, lo, (size_t)n);
    if (n == 1) return putf(c, b, "[%c-%c]", lo[0], hi[0]);
    if (lo[0] == hi[0])
        return putf(c, b, "\"%c\" (", lo[0]) && same_len(c, b, lo + 1, hi + 1, n - 1) &&
               put(c, b, ")");
    bool lo_zero = all_digit(lo + 1, n - 1, '0'), hi_nine = all_digit(hi + 1, n - 1, '9');
    char a = lo_zero ? lo[0] : (char)(lo[0] + 1), z = hi_nine ? hi[0] : (char)(hi[0] - 1);
    bool first = true, ok = put(c, b, "(");
    char nines[INT_MAXD + 1], zeros[INT_MAXD + 1];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    if (ok && !lo_zero) {
        ok =
            putf(c, b, "\"%c\" (", lo[0]) && same_len(c, b, lo + 1, nines, n - 1) && put(c, b, ")");
        first = false;
    }
    if (ok && a <= z) {
        ok = (first || put(c, b, " | ")) && putf(c, b, "[%c-%c] [0-9]{%d}", a, z, n - 1);
        first = false;
    }
    if (ok && !hi_nine)
        ok = (first || put(c, b, " | ")) && putf(c, b, "\"%c\" (", hi[0]) &&
             same_len(c, b, zeros, hi + 1, n - 1) && put(c, b, ")");
    return ok && put(c, b, ")");
}

/* Natural numbers lo..hi (hi < 10^16), no leading zeros, as one GBNF item. */
static bool nat_range(struct sc *c, struct tok_buf *b, uint64_t lo, uint64_t hi) {
    bool ok = put(c, b, "("), first = true;
    if (lo == 0) {
        ok = ok && put(c, b, "\"0\"");
        first = false;
        lo = 1;
    }
    for (int n = ndigits(lo); ok && lo <= hi && n <= ndigits(hi); n++) {
        uint64_t p10 = 1;
        for (int k = 1; k < n; k++)
            p10 *= 10;
        uint64_t a = lo > p10 ? lo : p10, z = hi < p10 * 10 - 1 ? hi : p10 * 10 - 1;
        if (a > z) continue;
        char la[INT_MAXD + 2], lz[INT_MAXD + 2];
        digits(a, la, n);
        digits(z, lz, n);
        ok = (first || put(c, b, " | ")) && same_len(c, b, la, lz, n);
        first = false;
    }
    return ok && put(c, b, ")");
}

#define NAT_MAX 9999999999999999ull /* 16 digits */

/* Integers in [lo, hi] (has_lo/has_hi: bounded), as one GBNF item. */
static bool int_range(struct sc *c, struct tok_buf *b, bool has_lo, int64_t lo, bool has_hi,
                      int64_t hi) {
    if (has_lo && has_hi && lo > hi)
        return fail(c, SMELT_ERR_INVALID, "no integer lies between the bounds");
    bool ok = put(c, b, "("), first = true;
    if (!has_lo || lo < 0) { /* negatives: -(1..) */
        uint64_t mlo = has_hi && hi < 0 ? (uint64_t)(-hi) : 1,
                 mhi = has_lo ? (uint64_t)(-lo) : NAT_MAX;
        ok = ok && put(c, b, "\"-\" ") && nat_range(c, b, mlo, mhi);
        first = false;
    }
    if (!has_hi || hi >= 0) {
        uint64_t a = has_lo && lo > 0 ? (uint64_t)lo : 0, z = has_hi ? (uint64_t)hi : NAT_MAX;
        ok = ok && (first || put(c, b, " | ")) && nat_range(c, b, a, z);
    }
    return ok && put(c, b, ")");
}

/* Reads a numeric bound; false (with an error) when it is not a number. */
static bool bound(struct sc *c, const json_t *s, const char *k, bool *has, double *v) {
    const json_t *x = json_object_get(s, k);
    *has = false;
    if (!x || json_is_boolean(x)) return true;
    if (!json_is_number(x)) return fail(c, SMELT_ERR_INVALID, "'%s' must be a number", k);
    *has = true;
    *v = json_number_value(x);
    if (!isfinite(*v)) return fail(c, SMELT_ERR_INVALID, "'%s' is not finite", k);
    return true;
}

/* The bounds of s: [lo, hi] with each end exclusive or not (draft 4 boolean exclusives too). */
static bool bounds(struct sc *c, const json_t *s, bool *hl, double *lo, bool *xl, bool *hh,
                   double *hi, bool *xh) {
    bool hm, hxm, hM, hxM;
    double m, xm, M, xM;
    if (!bound(c, s, "minimum", &hm, &m) || !bound(c, s, "exclusiveMinimum", &hxm, &xm) ||
        !bound(c, s, "maximum", &hM, &M) || !bound(c, s, "exclusiveMaximum", &hxM, &xM))
        return false;
    *hl = hm || hxm;
    *hh = hM || hxM;
    *xl = *xh = false;
    if (hm) *lo = m;
    if (hxm && (!hm || xm >= m)) *lo = xm, *xl = true;
    if (hm && json_is_true(json_object_get(s, "exclusiveMinimum"))) *xl = true;
    if (hM) *hi = M;
    if (hxM && (!hM || xM <= M)) *hi = xM, *xh = true;
    if (hM && json_is_true(json_object_get(s, "exclusiveMaximum"))) *xh = true;
    return true;
}

static bool gen_integer(struct sc *c, const json_t *s, struct tok_buf *b) {
    bool hl, xl, hh, xh;
    double lo = 0, hi = 0;
    if (!bounds(c, s, &hl, &lo, &xl, &hh, &hi, &xh)) return false;
    const json_t *mo = json_object_get(s, "multipleOf");
    if (mo && !(json_is_number(mo) && json_number_value(mo) == 1))
        return fail(c, SMELT_ERR_UNSUPPORTED,
                    "'multipleOf' is not supported (except 1 on integers)");
    if (!hl && !hh) {
        c->need_number = true;
        return put(c, b, "integer");
    }
    const double lim = (double)NAT_MAX;
    int64_t l = 0, h = 0;
    if (hl) {
        double x = xl ? floor(lo) + 1 : ceil(lo);
        if (x > lim) return fail(c, SMELT_ERR_UNSUPPORTED, "minimum beyond 16 digits");
        l = x < -lim ? -(int64_t)NAT_MAX : (int64_t)x;
    }
    if (hh) {
        double x = xh ? ceil(hi) - 1 : floor(hi);
        if (x < -lim) return fail(c, SMELT_ERR_UNSUPPORTED, "maximum beyond 16 digits");
        h = x > lim ? (int64_t)NAT_MAX : (int64_t)x;
    }
    return int_range(c, b, hl, l, hh, h);
}

/* Fractions: any digits, all zeros, or not all zeros. */
#define FRAC_ANY "(\".\" [0-9]{1,16})"
#define FRAC_ZERO "(\".\" \"0\"{1,16})"
#define FRAC_NONZERO                                                                               \
    "(\".\" \"0\"{0,15} [1-9] [0-9]{0,15})" /* the first nonzero digit: unambiguous */

/* Magnitudes m = I.F with A <(=) m <(=) B (A >= 0 integer, B integer or unbounded). */
static bool magnitude(struct sc *c, struct tok_buf *b, uint64_t A, bool xa, bool hb, uint64_t B,
                      bool xb) {
    bool ok = put(c, b, "("), first = true;
    /* I strictly between A and B: any fraction */
    uint64_t ilo = A + 1, ihi = hb ? (B ? B - 1 : 0) : NAT_MAX;
    if (ok && (!hb || (B > 0 && ilo <= ihi))) {
        ok = nat_range(c, b, ilo, ihi) && put(c, b, " " FRAC_ANY "?");
        first = false;
    }
    /* I == A */
    if (ok && !(hb && A == B)) {
        char d[INT_MAXD + 2];
        digits(A, d, ndigits(A));
        ok = (first || put(c, b, " | ")) && put_lit(c, b, d, strlen(d)) &&
             put(c, b, xa ? " " FRAC_NONZERO : " " FRAC_ANY "?");
        first = false;
    }
    /* I == B: zeros only */
    if (ok && hb && !xb && !(A == B && xa)) {
        char d[INT_MAXD + 2];
        digits(B, d, ndigits(B));
        ok = (first || put(c, b, " | ")) && put_lit(c, b, d, strlen(d)) &&
             put(c, b, " " FRAC_ZERO "?");
        first = false;
    }
    if (ok && first) return fail(c, SMELT_ERR_INVALID, "no number lies between the bounds");
    return ok && put(c, b, ")");
}

static bool gen_number(struct sc *c, const json_t *s, struct tok_buf *b) {
    bool hl, xl, hh, xh;
    double lo = 0, hi = 0;
    if (!bounds(c, s, &hl, &lo, &xl, &hh, &hi, &xh)) return false;
    if (json_object_get(s, "multipleOf"))
        return fail(c, SMELT_ERR_UNSUPPORTED, "'multipleOf' is not supported on numbers");
    if (!hl && !hh) {
        c->need_number = true;
        return put(c, b, "number");
    }
    if ((hl && (lo != floor(lo) || fabs(lo) > 1e15)) ||
        (hh && (hi != floor(hi) || fabs(hi) > 1e15)))
        return fail(c, SMELT_ERR_UNSUPPORTED,
                    "number bounds are supported at integer values up to 1e15");
    if (hl && hh && (lo > hi || (lo == hi && (xl || xh))))
        return fail(c, SMELT_ERR_INVALID, "no number lies between the bounds");
    bool ok = put(c, b, "("), first = true;
    /* non-negative side: [max(lo, 0), hi] */
    if (!hh || hi > 0 || (hi == 0 && !xh)) {
        uint64_t A = hl && lo > 0 ? (uint64_t)lo : 0;
        bool xa = hl && lo >= 0 && xl;
        ok = ok && magnitude(c, b, A, xa, hh, hh ? (uint64_t)hi : 0, xh);
        first = false;
    }
    /* negative side: -m with m in (max(-hi, 0), -lo] */
    if (!hl || lo < 0) {
        uint64_t A = hh && hi < 0 ? (uint64_t)-hi : 0;
        bool xa = hh && hi < 0 ? xh : true; /* magnitude 0 belongs to the other side */
        ok = ok && (first || put(c, b, " | ")) && put(c, b, "\"-\" ") &&
             magnitude(c, b, A, xa, hl, hl ? (uint64_t)-lo : 0, xl);
    }
    return ok && put(c, b, ")");
}

/* ---- strings -------------------------------------------------------------------------------- */

/* Anchored regexes of the formats; each checked by Python's jsonschema FormatChecker in the
 * tests. */
static const char *format_regex(const char *f) {
#define YEAR "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define LEAP "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
#define DATE                                                                                       \
    "(" YEAR "-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-("  \
    "0[1-9]|1[0-9]|2[0-8]))|" LEAP "-02-29)"
#define TIME                                                                                       \
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]" \
    ")"
#define OCTET "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    if (!strcmp(f, "date")) return "^" DATE "$";
    if (!strcmp(f, "time")) return "^" TIME "$";
    if (!strcmp(f, "date-time")) return "^" DATE "T" TIME "$";
    if (!strcmp(f, "uuid"))
        return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    if (!strcmp(f, "email"))
        return "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,3}$";
    if (!strcmp(f, "ipv4")) return "^" OCTET "(\\." OCTET "){3}$";
    return NULL;
}

/* One character of a string whose length counts: raw, a short escape, or \uXXXX outside the
 * surrogates (a surrogate pair would decode to one character from two escapes). */
#define LCHAR_RULE                                                                                 \
    "lchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] "      \
    "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )\n"

static bool gen_string(struct sc *c, const json_t *s, struct tok_buf *b) {
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return fail(c, SMELT_ERR_INVALID, "minLength and maxLength must be integers");
    json_int_t lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < 0))
        return fail(c, SMELT_ERR_INVALID, "negative minLength or maxLength");
    if (mx && hi < lo) return fail(c, SMELT_ERR_INVALID, "maxLength is below minLength");
    bool lengths = lo > 0 || mx;
    const char *re = NULL;
    if (fmt && !json_is_string(fmt)) return fail(c, SMELT_ERR_INVALID, "'format' must be a string");
    if (fmt) {
        re = format_regex(json_string_value(fmt));
        if (!re)
            return fail(c, SMELT_ERR_UNSUPPORTED,
                        "format '%.60s' is not supported (supported: date, time, date-time, uuid, "
                        "email, ipv4)",
                        json_string_value(fmt));
    }
    if (pat && !json_is_string(pat))
        return fail(c, SMELT_ERR_INVALID, "'pattern' must be a string");
    if (pat && re)
        return fail(c, SMELT_ERR_UNSUPPORTED, "'pattern' together with 'format' is not supported");
    if ((pat || re) && lengths)
        return fail(c, SMELT_ERR_UNSUPPORTED,
                    "'%s' together with minLength/maxLength is not supported",
                    pat ? "pattern" : "format");
    if (pat) re = json_string_value(pat);
    if (re) {
        if (!put(c, b, "\"\\\"\" ")) return false;
        struct err e2 = {0};
        size_t old = pat ? path_push(c, "pattern") : c->plen;
        smelt_status st = gram_regex_gbnf(re, pat ? json_string_length(pat) : strlen(re),
                                          GRAM_RE_JSON_STRING, b, &e2);
        if (st != SMELT_OK) {
            fail(c, st, "%s", e2.msg);
            return false;
        }
        path_pop(c, old);
        return put(c, b, " \"\\\"\"");
    }
    if (!lengths) {
        c->need_string = true;
        return put(c, b, "string");
    }
    if (lo > GRAM_MAX_REPEAT || hi > GRAM_MAX_REPEAT)
        return fail(c, SMELT_ERR_RANGE, "minLength/maxLength above %u", GRAM_MAX_REPEAT);
    c->need_lchar = true;
    if (hi < 0) return putf(c, b, "\"\\\"\" lchar{%lld,} \"\\\"\"", (long long)lo);
    return putf(c, b, "\"\\\"\" lchar{%lld,%lld} \"\\\"\"", (long long)lo, (long long)hi);
}

/* ---- the generator ---------------------------------------------------------------------- */

static bool gen(struct sc *c, const json_t *s, struct tok_buf *b);

/* A rule for schema s (memoized by identity: recursion through $ref ends here). */
static bool gen_rule(struct sc *c, const json_t *s, struct tok_buf *b) {
    for (uint32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].s == s) return putf(c, b, "ref-r%u", c->memo[i].id);
    if (!gram_grow(&c->memo, &c->cap_memo, (size_t)c->n_memo + 1, sizeof *c->memo, 1u << 20))
        return nomem(c);
    uint32_t id = ++c->n_rules;
    c->memo[c->n_memo++] = (struct memo){s, id};
    struct tok_buf body = {0};
    char name[32];
    snprintf(name, sizeof name, "ref-r%u", id);
    bool ok = gen(c, s, &body) && emit_rule(c, name, &body) && put(c, b, name);
    tok_buf_free(&body);
    return ok;
}

static bool gen_enum(struct sc *c, const json_t *list, struct tok_buf *b) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(c, SMELT_ERR_INVALID, "'enum' must be a non-empty array");
    bool ok = put(c, b, "(");
    size_t i;
    json_t *v;
    json_array_foreach((json_t *)list, i, v) {
        ok = ok && (i == 0 || put(c, b, " | ")) && put_json_value(c, b, v);
    }
    return ok && put(c, b, ")");
}

/* The "string" that is not one of the declared keys (canonical encodings): a trie walk where
 * each node leaves with a character no key continues with. */
struct ktrie {
    uint32_t cp, child, next; /* first child, next sibling (index + 1; 0 none) */
    bool end;
};

static bool key_excluding(struct sc *c, const char **keys, const size_t *lens, size_t n,
                          struct tok_buf *b) {
    struct ktrie *t = calloc(1, sizeof *t);
    uint32_t nt = 1;
    size_t cap = 1;
    bool ok = t != NULL;
    for (size_t k = 0; ok && k < n; k++) {
        uint32_t node = 0;
        for (size_t i = 0; ok && i < lens[k];) {
            uint32_t cp;
            size_t l = utf8_decode((const uint8_t *)keys[k] + i, lens[k] - i, &cp);
            if (!l) {
                ok = fail(c, SMELT_ERR_INVALID, "invalid UTF-8 in a property name");
                break;
            }
            i += l;
            uint32_t ch = t[node].child;
            while (ch && t[ch - 1].cp != cp)
                ch = t[ch - 1].next;
            if (!ch) {
                if (!gram_grow(&t, &cap, (size_t)nt + 1, sizeof *t, 1u << 22)) {
                    ok = nomem(c);
                    break;
                }
                t[nt] = (struct ktrie){cp, 0, t[node].child, false};
                t[node].child = ++nt;
                ch = nt;
            }
            node = ch - 1;
        }
        if (ok) t[node].end = true;
    }
    if (!ok) {
        free(t);
        return ok || nomem(c);
    }
    uint32_t base = c->n_rules;
    c->n_rules += nt;
    c->need_lchar = true;
    for (uint32_t i = 0; ok && i < nt; i++) {
        struct tok_buf r = {0};
        struct gram_cset cs = {0};
        ok = put(c, &r, "(");
        bool first = true;
        if (!t[i].end) {
            ok = ok && put(c, &r, "\"\\\"\"");
            first = false;
        }
        for (uint32_t ch = t[i].child; ok && ch; ch = t[ch - 1].next) {
            ok = gram_cset_add(&cs, t[ch - 1].cp, t[ch - 1].cp) || nomem(c);
            if (!ok) break;
            ok = (first || put(c, &r, " | ")) &&
                 gram_buf_chars(&r,
                                &(struct gram_cset){(uint32_t[]){t[ch - 1].cp, t[ch - 1].cp}, 2, 2},
                                true) &&
                 putf(c, &r, " key-r%u", base + ch);
            first = false;
        }
        gram_cset_norm(&cs);
        if (ok && !gram_cset_negate(&cs)) ok = nomem(c);
        ok = ok && (first || put(c, &r, " | ")) &&
             (gram_buf_chars(&r, &cs, true) || fail(c, SMELT_ERR_RANGE, "grammar too large")) &&
             put(c, &r, " lchar* \"\\\"\")");
        char name[32];
        snprintf(name, sizeof name, "key-r%u", base + i + 1);
        ok = ok && emit_rule(c, name, &r);
        tok_buf_free(&r);
        gram_cset_free(&cs);
    }
    free(t);
    return ok && putf(c, b, "\"\\\"\" key-r%u", base + 1);
}

/* Appends a new rule with the given body and writes its name into b. */
static bool rule_of(struct sc *c, const char *kind, const struct tok_buf *body, struct tok_buf *b) {
    char name[48];
    snprintf(name, sizeof name, "%s-r%u", kind, ++c->n_rules);
    return emit_rule(c, name, body) && put(c, b, name);
}

/* An object: "{" then the properties in the schema's order, each required one present, each
 * optional one present or not, commas between those present, then (when additionalProperties
 * allows them) other properties, then "}". With a required property the optional ones before
 * it end with a comma and those after it start with one: linear. With none, the first present
 * property is any one of them: tail rules T_j (the properties from j on, after a comma) are
 * shared, and the automaton inlines them while small. */
static bool gen_object(struct sc *c, const json_t *s, struct tok_buf *b) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, SMELT_ERR_INVALID, "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail(c, SMELT_ERR_INVALID, "'required' must be an array");
    if (ap && !json_is_object(ap) && !json_is_boolean(ap))
        return fail(c, SMELT_ERR_INVALID, "'additionalProperties' must be a schema");
    size_t cap = json_object_size(props) + json_array_size(req) + 1;
    const char **keys = calloc(cap, sizeof *keys);
    size_t *klen = calloc(cap, sizeof *klen);
    const json_t **sub = calloc(cap, sizeof *sub);
    bool *reqd = calloc(cap, sizeof *reqd);
    struct tok_buf *kv = calloc(cap, sizeof *kv);
    size_t np = 0;
    bool ok = keys && klen && sub && reqd && kv;
    if (!ok) nomem(c);
    const char *k;
    json_t *v;
    if (ok && props) {
        json_object_foreach((json_t *)props, k, v) {
            keys[np] = k;
            klen[np] = strlen(k);
            sub[np++] = v;
        }
    }
    size_t i;
    json_t *r;
    if (ok && req) {
        json_array_foreach((json_t *)req, i, r) {
            if (!json_is_string(r)) {
                ok = fail(c, SMELT_ERR_INVALID, "'required' must list strings");
                break;
            }
            size_t j = 0;
            while (j < np && strcmp(keys[j], json_string_value(r)))
                j++;
            if (j == np) { /* required but not among properties: additionalProperties decides */
                if (json_is_false(ap)) {
                    ok = fail(
                        c, SMELT_ERR_INVALID,
                        "required property '%.60s' is not allowed (additionalProperties is false)",
                        json_string_value(r));
                    break;
                }
                keys[np] = json_string_value(r);
                klen[np] = json_string_length(r);
                sub[np++] = ap && json_is_object(ap) ? ap : json_true();
            }
            reqd[j] = true;
        }
    }
    bool extras = ap && (json_is_true(ap) || json_is_object(ap));
    size_t nreq = 0, nall = 0;
    for (size_t j = 0; j < np; j++)
        nreq += reqd[j], nall += !json_is_false(sub[j]);
    const json_t *mnp = json_object_get(s, "minProperties"),
                 *mxp = json_object_get(s, "maxProperties");
    if (ok && mnp && (!json_is_integer(mnp) || json_integer_value(mnp) > (json_int_t)nreq))
        ok = fail(c, SMELT_ERR_UNSUPPORTED,
                  "'minProperties' above the number of required properties is not supported");
    if (ok && mxp &&
        (!json_is_integer(mxp) || extras || json_integer_value(mxp) < (json_int_t)nall))
        ok = fail(c, SMELT_ERR_UNSUPPORTED,
                  "'maxProperties' below the number of possible properties is not supported");
    /* each "key": value (trailing ws included) as a rule */
    size_t first_req = np;
    for (size_t j = 0; ok && j < np; j++) {
        if (json_is_false(sub[j])) {
            if (reqd[j])
                ok = fail(c, SMELT_ERR_INVALID, "required property '%.60s' has the schema false",
                          keys[j]);
            continue;
        }
        if (reqd[j] && first_req == np) first_req = j;
        struct tok_buf body = {0}, key = {0};
        size_t old = path_push(c, "properties");
        path_push(c, keys[j]);
        ok = json_string_text(c, &key, keys[j], klen[j]) && put_lit(c, &body, key.p, key.n) &&
             put(c, &body, " ws \":\" ws ") && gen(c, sub[j], &body) && put(c, &body, " ws") &&
             rule_of(c, "kv", &body, &kv[j]);
        path_pop(c, old);
        tok_buf_free(&body);
        tok_buf_free(&key);
    }
    /* the other properties: a key none of the above, a value of additionalProperties */
    struct tok_buf ekv = {0}, tail = {0}, body = {0};
    if (ok && extras) {
        struct tok_buf e = {0};
        size_t old = path_push(c, "additionalProperties");
        ok = key_excluding(c, keys, klen, np, &e) && put(c, &e, " ws \":\" ws ") &&
             gen(c, json_is_object(ap) ? ap : json_true(), &e) && put(c, &e, " ws") &&
             rule_of(c, "extra", &e, &ekv);
        path_pop(c, old);
        tok_buf_free(&e);
    }
    /* tail: what follows the last declared property */
    if (ok && extras)
        ok = put(c, &tail, "( \",\" ws ") && put(c, &tail, ekv.p) && put(c, &tail, " )*");
    ok = ok && put(c, &body, "\"{\" ws");
    if (ok && first_req < np) {
        for (size_t j = 0; ok && j < np; j++) {
            if (json_is_false(sub[j])) continue;
            if (j < first_req)
                ok =
                    put(c, &body, " ( ") && put(c, &body, kv[j].p) && put(c, &body, " \",\" ws )?");
            else if (j == first_req)
                ok = put(c, &body, " ") && put(c, &body, kv[j].p);
            else if (reqd[j])
                ok = put(c, &body, " \",\" ws ") && put(c, &body, kv[j].p);
            else
                ok =
                    put(c, &body, " ( \",\" ws ") && put(c, &body, kv[j].p) && put(c, &body, " )?");
        }
        if (ok && extras) ok = put(c, &body, " ") && put(c, &body, tail.p);
    } else if (ok) {
        /* T_j: the declared properties from j on, each after a comma, then the tail */
        struct tok_buf any = {0}, next = {0};
        ok = extras ? put(c, &next, tail.p) : put(c, &next, "\"\"");
        ok = ok && put(c, &any, "(");
        bool first = true;
        if (ok && extras) {
            ok = put(c, &any, ekv.p) && put(c, &any, " ") && put(c, &any, tail.p);
            first = false;
        }
        for (size_t j = np; ok && j-- > 0;) {
            if (json_is_false(sub[j])) continue;
            /* any: kv_j followed by T_{j+1} */
            ok = (first || put(c, &any, " | ")) && put(c, &any, kv[j].p) && put(c, &any, " ") &&
                 put(c, &any, next.p);
            first = false;
            struct tok_buf t = {0}, name = {0};
            ok = ok && put(c, &t, "( \",\" ws ") && put(c, &t, kv[j].p) && put(c, &t, " )? ") &&
                 put(c, &t, next.p) && rule_of(c, "tail", &t, &name);
            tok_buf_free(&next);
            next = name;
            tok_buf_free(&t);
        }
        ok = ok && put(c, &any, ")");
        if (ok && !first) ok = put(c, &body, " ") && put(c, &body, any.p) && put(c, &body, "?");
        tok_buf_free(&any);
        tok_buf_free(&next);
    }
    ok = ok && put(c, &body, " \"}\"") && rule_of(c, "object", &body, b);
    for (size_t j = 0; kv && j < cap; j++)
        tok_buf_free(&kv[j]);
    tok_buf_free(&ekv);
    tok_buf_free(&tail);
    tok_buf_free(&body);
    free(keys);
    free(klen);
    free(sub);
    free(reqd);
    free(kv);
    return ok;
}

static bool gen_array(struct sc *c, const json_t *s, struct tok_buf *b);

/* The types s allows (bit i: names[i]); 0 when "type" is absent. */
static const char *const TYPES[] = {"null",   "boolean", "object", "array",
                                    "string", "number",  "integer"};

static bool types_of(struct sc *c, const json_t *s, unsigned *out) {
    const json_t *t = json_object_get(s, "type");
    *out = 0;
    if (!t) return true;
    json_t *one = NULL;
    if (json_is_string(t)) t = one = json_pack("[O]", t);
    if (!json_is_array(t) || json_array_size(t) == 0) {
        json_decref(one);
        return fail(c, SMELT_ERR_INVALID, "'type' must be a string or a non-empty array");
    }
    size_t i;
    json_t *x;
    json_array_foreach((json_t *)t, i, x) {
        int k = 0;
        while (k < 7 && !(json_is_string(x) && !strcmp(json_string_value(x), TYPES[k])))
            k++;
        if (k == 7) {
            json_decref(one);
            return fail(c, SMELT_ERR_INVALID, "unknown type");
        }
        *out |= 1u << k;
    }
    json_decref(one);
    if ((*out & (1u << 5)) && (*out & (1u << 6))) *out &= ~(1u << 6); /* number covers integer */
    return true;
}

/* Whether JSON value v has one of the types. */
static bool value_has_type(const json_t *v, unsigned types) {
    if (!types) return true;
    switch (json_typeof(v)) {
    case JSON_NULL:
        return types & 1;
    case JSON_TRUE:
    case JSON_FALSE:
        return types & 2;
    case JSON_OBJECT:
        return types & 4;
    case JSON_ARRAY:
        return types & 8;
    case JSON_STRING:
        return types & 16;
    case JSON_INTEGER:
        return types & (32 | 64);
    case JSON_REAL:
        return (types & 32) || ((types & 64) && json_real_value(v) == floor(json_real_value(v)));
    }
    return false;
}

static bool gen_types(struct sc *c, const json_t *s, unsigned types, struct tok_buf *b) {
    int n = __builtin_popcount(types);
    bool ok = n == 1 || put(c, b, "("), first = true;
    for (int k = 0; ok && k < 7; k++) {
        if (!(types & (1u << k))) continue;
        ok = first || put(c, b, " | ");
        first = false;
        switch (k) {
        case 0:
            ok = ok && put(c, b, "\"null\"");
            break;
        case 1:
            ok = ok && put(c, b, "(\"true\" | \"false\")");
            break;
        case 2:
            ok = ok && gen_object(c, s, b);
            break;
        case 3:
            ok = ok && gen_array(c, s, b);
            break;
        case 4:
            ok = ok && gen_string(c, s, b);
            break;
        case 5:
            ok = ok && gen_number(c, s, b);
            break;
        case 6:
            ok = ok && gen_integer(c, s, b);
            break;
        }
    }
    return ok && (n == 1 || put(c, b, ")"));
}

/* const/enum with another validation keyword (besides type): the values would need checking
 * against it; refused. */
static bool extra_with_values(struct sc *c, const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!strcmp(k, "const") || !strcmp(k, "enum") || !strcmp(k, "type")) continue;
        if (in_list(SUPPORTED, k))
            return fail(c, SMELT_ERR_UNSUPPORTED, "'%s' together with '%s' is not supported", k,
                        json_object_get(s, "const") ? "const" : "enum"),
                   true;
    }
    return false;
}

/* ---- oneOf: branches must be provably exclusive ------------------------------------------ */

/* The JSON types an instance of s can have (TYPES bits; integer and number overlap). */
static unsigned possible_types(struct sc *c, const json_t *s, int depth) {
    if (!json_is_object(s) || depth > 16) return json_is_false(s) ? 0 : 0x7F;
    s = deref(c, s);
    if (!s || !json_is_object(s)) return 0x7F;
    const json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
    unsigned t = 0;
    if (cv || json_is_array(ev)) {
        size_t i;
        json_t *v;
        if (cv) ev = NULL;
        for (i = 0; cv ? i < 1 : i < json_array_size(ev); i++) {
            v = cv ? (json_t *)cv : json_array_get(ev, i);
            for (unsigned k = 0; k < 7; k++)
                if (value_has_type(v, 1u << k)) t |= 1u << k;
        }
        return t;
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    if (json_is_array(any)) {
        size_t i;
        json_t *x;
        json_array_foreach((json_t *)any, i, x) t |= possible_types(c, x, depth + 1);
    } else {
        t = 0x7F;
    }
    unsigned own = 0;
    struct err quiet;
    struct err *save = c->e;
    c->e = &quiet;
    bool was = c->failed;
    if (!types_of(c, s, &own)) own = 0x7F;
    c->failed = was;
    c->e = save;
    if (own) t &= own | ((own & 32) ? 64 : 0);
    return t;
}

/* The const/enum values of s as an array (a new reference), or NULL when unrestricted. */
static json_t *values_of(const json_t *s) {
    if (!json_is_object(s)) return NULL;
    const json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
    if (cv) return json_pack("[O]", cv);
    return json_is_array(ev) ? json_incref((json_t *)ev) : NULL;
}

static bool values_disjoint(const json_t *a, const json_t *b) {
    size_t i, j;
    json_t *x, *y;
    json_array_foreach((json_t *)a, i, x)
        json_array_foreach((json_t *)b, j, y) if (json_same(x, y)) return false;
    return true;
}

/* Whether no instance can match both a and b: different types, disjoint const/enum values,
 * a property one requires and the other forbids, or a property both require whose values
 * cannot match both (a discriminator). */
static bool disjoint(struct sc *c, const json_t *a, const json_t *b) {
    unsigned ta = possible_types(c, a, 0), tb = possible_types(c, b, 0);
    unsigned na = ta | ((ta & 32) ? 64 : 0) | ((ta & 64) ? 32 : 0);
    if (!(na & tb)) return true;
    a = json_is_object(a) ? deref(c, a) : a;
    b = json_is_object(b) ? deref(c, b) : b;
    if (!a || !b) return false;
    json_t *va = values_of(a), *vb = values_of(b);
    bool d = va && vb && values_disjoint(va, vb);
    json_decref(va);
    json_decref(vb);
    if (d || !json_is_object(a) || !json_is_object(b)) return d;
    const json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    size_t i, j;
    json_t *x, *y;
    /* one requires a property the other forbids */
    for (int side = 0; side < 2; side++) {
        const json_t *r = side ? rb : ra, *other = side ? a : b, *op = side ? pa : pb;
        if (!json_is_false(json_object_get(other, "additionalProperties"))) continue;
        json_array_foreach((json_t *)r, i,
                           x) if (json_is_string(x) &&
                                  !json_object_get(op, json_string_value(x))) return true;
    }
    json_array_foreach((json_t *)ra, i, x) json_array_foreach((json_t *)rb, j, y) {
        if (!json_is_string(x) || !json_same(x, y)) continue;
        const json_t *sa = json_object_get(pa, json_string_value(x)),
                     *sb = json_object_get(pb, json_string_value(x));
        if (sa && sb && disjoint(c, sa, sb)) return true;
    }
    return false;
}

static bool gen(struct sc *c, const json_t *s, struct tok_buf *b) {
    if (json_is_true(s) || (json_is_object(s) && !has_validation(s, NULL))) {
        c->need_value = true;
        return put(c, b, "value");
    }
    if (json_is_false(s)) return fail(c, SMELT_ERR_UNSUPPORTED, "the schema false has no instance");
    if (!json_is_object(s))
        return fail(c, SMELT_ERR_INVALID, "a schema must be an object or a boolean");
    if (++c->depth > GRAM_MAX_NEST)
        return fail(c, SMELT_ERR_RANGE, "schemas nest deeper than %d", GRAM_MAX_NEST);
    bool ok = check_keywords(c, s);
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *all = json_object_get(s, "allOf"), *any = json_object_get(s, "anyOf"),
                 *one = json_object_get(s, "oneOf");
    if (!ok) {
    } else if (ref) {
        if (!json_is_string(ref)) {
            ok = fail(c, SMELT_ERR_INVALID, "$ref must be a string");
        } else if (!has_validation(s, "$ref")) {
            const json_t *t = resolve(c, json_string_value(ref));
            ok = t && gen_rule(c, t, b);
        } else {
            const json_t *m = deref(c, s);
            ok = m && gen(c, m, b);
        }
    } else if (all) {
        if (!json_is_array(all) || !json_array_size(all)) {
            ok = fail(c, SMELT_ERR_INVALID, "'allOf' must be a non-empty array");
        } else {
            json_t *rest = own(c, json_deep_copy(s));
            const json_t *m = rest;
            if (rest) json_object_del(rest, "allOf");
            size_t i;
            json_t *x;
            json_array_foreach((json_t *)all, i, x) {
                size_t old = path_push_i(c, "allOf", i);
                m = m ? merge(c, m, x) : NULL;
                path_pop(c, old);
            }
            ok = m && gen(c, m, b);
        }
    } else if (any || one) {
        const json_t *list = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        if (any && one) {
            ok = fail(c, SMELT_ERR_UNSUPPORTED, "anyOf together with oneOf is not supported");
        } else if (!json_is_array(list) || !json_array_size(list)) {
            ok = fail(c, SMELT_ERR_INVALID, "'%s' must be a non-empty array", kw);
        } else {
            json_t *rest = own(c, json_deep_copy(s));
            if (rest) json_object_del(rest, kw);
            bool refine = rest && has_validation(rest, NULL);
            size_t n = json_array_size(list);
            const json_t **br = calloc(n, sizeof *br);
            ok = rest && br;
            if (!ok) nomem(c);
            size_t i;
            json_t *x;
            json_array_foreach((json_t *)list, i, x) {
                if (!ok) break;
                size_t old = path_push_i(c, kw, i);
                br[i] = refine ? merge(c, rest, x) : x;
                ok = br[i] != NULL;
                path_pop(c, old);
            }
            for (i = 0; ok && one && i < n; i++)
                for (size_t j = i + 1; ok && j < n; j++)
                    if (!disjoint(c, br[i], br[j]))
                        ok = fail(
                            c, SMELT_ERR_UNSUPPORTED,
                            "oneOf branches %zu and %zu may both match "
                            "(oneOf needs different types, consts or a required discriminator)",
                            i, j);
            ok = ok && put(c, b, "(");
            bool first = true;
            for (i = 0; ok && i < n; i++) {
                if (json_is_false(br[i])) continue;
                size_t old = path_push_i(c, kw, i);
                ok = (first || put(c, b, " | ")) && gen(c, br[i], b);
                first = false;
                path_pop(c, old);
            }
            if (ok && first)
                ok = fail(c, SMELT_ERR_UNSUPPORTED, "every branch of '%s' is false", kw);
            ok = ok && put(c, b, ")");
            free(br);
        }
    } else if ((json_object_get(s, "const") || json_object_get(s, "enum")) &&
               extra_with_values(c, s)) {
        ok = false;
    } else if (json_object_get(s, "const")) {
        unsigned types;
        const json_t *v = json_object_get(s, "const");
        ok = types_of(c, s, &types);
        if (ok && !value_has_type(v, types))
            ok = fail(c, SMELT_ERR_INVALID, "'const' does not have the schema's type");
        ok = ok && put_json_value(c, b, v);
    } else if (json_object_get(s, "enum")) {
        unsigned types;
        const json_t *list = json_object_get(s, "enum");
        ok = types_of(c, s, &types);
        if (ok && json_is_array(list) && types) { /* keep the values of the allowed types */
            json_t *kept = own(c, json_array());
            size_t i;
            json_t *v;
            json_array_foreach((json_t *)list, i, v) if (kept && value_has_type(v, types))
                json_array_append(kept, v);
            list = kept;
            if (list && !json_array_size(list))
                ok = fail(c, SMELT_ERR_INVALID, "no 'enum' value has the schema's type");
        }
        ok = ok && list && gen_enum(c, list, b);
    } else {
        unsigned types;
        ok = types_of(c, s, &types);
        if (ok && !types) { /* no "type": what the keywords describe, else any value */
            static const char *const obj[] = {"properties",           "required",
                                              "additionalProperties", "minProperties",
                                              "maxProperties",        NULL};
            static const char *const arr[] = {"items",    "prefixItems", "additionalItems",
                                              "minItems", "maxItems",    "uniqueItems",
                                              NULL};
            static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
            static const char *const num[] = {"minimum",          "maximum",    "exclusiveMinimum",
                                              "exclusiveMaximum", "multipleOf", NULL};
            const char *const *groups[] = {obj, arr, str, num};
            const unsigned bits[] = {4, 8, 16, 32};
            for (int g = 0; g < 4; g++)
                for (const char *const *kk = groups[g]; *kk; kk++)
                    if (json_object_get(s, *kk)) types |= bits[g];
            if (!types) types = 0x7F & ~(1u << 6);
        }
        ok = ok && gen_types(c, s, types, b);
    }
    c->depth--;
    return ok;
}

/* An array: the prefix items (all of them, or maxItems of them), then items of the rest
 * schema within minItems..maxItems. */
static bool gen_array(struct sc *c, const json_t *s, struct tok_buf *b) {
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    const json_t *rest = items;
    const char *rest_kw = "items";
    if (prefix && !json_is_array(prefix))
        return fail(c, SMELT_ERR_INVALID, "'prefixItems' must be an array");
    if (!prefix && json_is_array(items)) { /* drafts 4-2019: items as a tuple */
        prefix = items;
        rest = json_object_get(s, "additionalItems");
        rest_kw = "additionalItems";
    }
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return fail(c, SMELT_ERR_INVALID, "minItems and maxItems must be integers");
    json_int_t lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < lo))
        return fail(c, SMELT_ERR_INVALID, "minItems/maxItems out of order");
    if (lo > GRAM_MAX_REPEAT || hi > GRAM_MAX_REPEAT)
        return fail(c, SMELT_ERR_RANGE, "minItems/maxItems above %u", GRAM_MAX_REPEAT);
    const json_t *uq = json_object_get(s, "uniqueItems");
    if (json_is_true(uq) && !(mx && hi <= 1))
        return fail(c, SMELT_ERR_UNSUPPORTED, "'uniqueItems' is not supported");
    size_t k = json_array_size(prefix);
    size_t m = mx && (size_t)hi < k ? (size_t)hi : k;
    bool rest_ok = rest ? !json_is_false(rest) : k == 0;
    json_int_t rlo = lo > (json_int_t)m ? lo - (json_int_t)m : 0;
    json_int_t rhi = !rest_ok ? 0 : mx ? hi - (json_int_t)m : -1;
    if (rlo > 0 && !rest_ok)
        return fail(c, SMELT_ERR_INVALID, "minItems needs more items than prefixItems allows");
    struct tok_buf body = {0}, item = {0};
    bool ok = put(c, &body, "\"[\" ws");
    for (size_t i = 0; ok && i < m; i++) {
        size_t old = path_push_i(c, prefix == items ? "items" : "prefixItems", i);
        const json_t *x = json_array_get(prefix, i);
        if (json_is_false(x))
            ok = fail(c, SMELT_ERR_UNSUPPORTED, "a prefix item with the schema false");
        ok =
            ok && put(c, &body, i ? " \",\" ws " : " ") && gen(c, x, &body) && put(c, &body, " ws");
        path_pop(c, old);
    }
    if (ok && rhi != 0) {
        struct tok_buf r = {0};
        size_t old = path_push(c, rest_kw);
        ok = gen(c, rest ? rest : json_true(), &r) && rule_of(c, "item", &r, &item);
        path_pop(c, old);
        tok_buf_free(&r);
    }
    if (ok && rhi != 0) {
        char q[48];
        if (m > 0) {
            if (rhi < 0)
                snprintf(q, sizeof q, "{%lld,}", (long long)rlo);
            else
                snprintf(q, sizeof q, "{%lld,%lld}", (long long)rlo, (long long)rhi);
            ok = put(c, &body, " ( \",\" ws ") && put(c, &body, item.p) && put(c, &body, " ws )") &&
                 put(c, &body, q);
        } else {
            json_int_t a = rlo ? rlo - 1 : 0, z = rhi < 0 ? -1 : rhi - 1;
            if (z < 0)
                snprintf(q, sizeof q, "{%lld,}", (long long)a);
            else
                snprintf(q, sizeof q, "{%lld,%lld}", (long long)a, (long long)z);
            ok = put(c, &body, rlo ? " " : " ( ") && put(c, &body, item.p) &&
                 put(c, &body, " ws ( \",\" ws ") && put(c, &body, item.p) &&
                 put(c, &body, " ws )") && put(c, &body, q) && put(c, &body, rlo ? "" : " )?");
        }
    }
    ok = ok && put(c, &body, " \"]\"") && rule_of(c, "array", &body, b);
    tok_buf_free(&body);
    tok_buf_free(&item);
    return ok;
}

smelt_status gram_schema_to_gbnf(const json_t *schema, struct tok_buf *out, struct err *e) {
    struct sc c = {.root = schema, .out = out, .e = e};
    c.owned = json_array();
    if (!c.owned) return err_set(e, SMELT_ERR_NOMEM, "schema: out of memory");
    struct tok_buf root = {0};
    bool ok = gen(&c, schema, &root);
    ok = ok && put(&c, out, "root ::= ") && put(&c, out, root.p) && put(&c, out, "\n");
    if (ok && c.need_value) {
        c.need_string = c.need_number = true;
        ok = put(&c, out,
                 "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
                 "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws "
                 "value ws )* )? \"}\"\n"
                 "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n");
    }
    if (ok && c.need_string)
        ok = put(&c, out,
                 "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                 "[0-9a-fA-F]{4} ) )* \"\\\"\"\n");
    if (ok && c.need_number)
        ok = put(&c, out,
                 "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
                 "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n");
    if (ok && c.need_lchar) ok = put(&c, out, LCHAR_RULE);
    ok = ok && put(&c, out, "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
    tok_buf_free(&root);
    free(c.memo);
    json_decref(c.owned);
    return ok ? SMELT_OK : (e ? e->code : SMELT_ERR_INVALID);
}

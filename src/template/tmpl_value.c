/* Chat-template values: reference-counted strings, lists, dicts and namespaces with
 * Python semantics (truthiness, ==, <, hash, str(), repr(), json.dumps), UTF-8 and
 * Unicode helpers, and the public context-building API of tmpl.h.
 *
 * Every allocation made during a render goes through rt_alloc, which charges the
 * render's cumulative allocation budget: that bounds both its memory and the time it
 * can spend copying. Outside a render (rt == NULL) nothing is charged.
 */
#include "template/tmpl_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/ckd.h"

/* ---------------------------------------------------------------- allocation */

void *rt_alloc(struct rt *rt, size_t n) {
    if (rt) {
        size_t tot;
        if (ckd_add_size(&tot, rt->alloc_total, n) || tot > rt->lim.max_alloc) {
            rt_fail(rt, SMELT_ERR_RANGE, "template exceeded its memory budget (%zu bytes)",
                    rt->lim.max_alloc);
            return NULL;
        }
        rt->alloc_total = tot;
    }
    void *p = malloc(n ? n : 1);
    if (!p && rt) rt_fail(rt, SMELT_ERR_NOMEM, "out of memory (%zu bytes)", n);
    return p;
}

void *rt_realloc_acct(struct rt *rt, void *p, size_t old, size_t n) {
    if (rt && n > old) {
        size_t tot;
        if (ckd_add_size(&tot, rt->alloc_total, n - old) || tot > rt->lim.max_alloc) {
            rt_fail(rt, SMELT_ERR_RANGE, "template exceeded its memory budget (%zu bytes)",
                    rt->lim.max_alloc);
            return NULL;
        }
        rt->alloc_total = tot;
    }
    void *q = realloc(p, n ? n : 1);
    if (!q && rt) rt_fail(rt, SMELT_ERR_NOMEM, "out of memory (%zu bytes)", n);
    return q;
}

/* ---------------------------------------------------------------- UTF-8 */

uint32_t utf8_next(const char *s, size_t len, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    unsigned c = u[k];
    if (c < 0x80) {
        *i = k + 1;
        return c;
    }
    int n;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) n = 1, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) n = 2, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) n = 3, cp = c & 0x07, min = 0x10000;
    else goto bad;
    if (k + (size_t)n >= len) goto bad;
    for (int j = 1; j <= n; j++) {
        if ((u[k + j] & 0xc0) != 0x80) goto bad;
        cp = (cp << 6) | (u[k + j] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) goto bad;
    *i = k + (size_t)n + 1;
    return cp;
bad:
    /* An invalid byte stands for itself as a lone surrogate (Python's surrogateescape),
     * so it is never merged with its neighbours and round-trips. */
    *i = k + 1;
    return 0xdc00 + c;
}

size_t utf8_put(char *out, uint32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp >= 0xdc80 && cp <= 0xdcff) { /* an escaped invalid byte */
        o[0] = (unsigned char)(cp - 0xdc00);
        return 1;
    }
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t utf8_count(const char *s, size_t len) {
    size_t n = 0, i = 0;
    while (i < len) {
        if (i + 8 <= len) { /* ASCII fast path, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                n += 8;
                continue;
            }
        }
        if ((unsigned char)s[i] < 0x80) i++;
        else utf8_next(s, len, &i);
        n++;
    }
    return n;
}

size_t tstr_offset(const struct tstr *s, size_t cp) {
    if (s->ncp == s->len) return cp;
    size_t i = 0;
    for (size_t k = 0; k < cp && i < s->len; k++) utf8_next(s->s, s->len, &i);
    return i;
}

/* ---------------------------------------------------------------- Unicode */

static bool in_ranges(const struct tmpl_cp_range *r, size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid].lo) hi = mid;
        else if (c > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

/* An invalid input byte (decoded as U+DC80..U+DCFF) has no properties. */
bool py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20);
    return in_ranges(tmpl_prop_space, tmpl_prop_space_n, c);
}
bool py_isprintable(uint32_t c) {
    if (c < 0x80) return c >= 0x20 && c < 0x7f;
    return in_ranges(tmpl_prop_printable, tmpl_prop_printable_n, c);
}
bool py_isalpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return in_ranges(tmpl_prop_alpha, tmpl_prop_alpha_n, c);
}
bool py_isdecimal(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return in_ranges(tmpl_prop_decimal, tmpl_prop_decimal_n, c);
}
bool py_isdigit(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return in_ranges(tmpl_prop_digit, tmpl_prop_digit_n, c);
}
bool py_isnumeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return in_ranges(tmpl_prop_numeric, tmpl_prop_numeric_n, c);
}
bool py_islower(uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z';
    return in_ranges(tmpl_prop_lower, tmpl_prop_lower_n, c);
}
bool py_isupper(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z';
    return in_ranges(tmpl_prop_upper, tmpl_prop_upper_n, c);
}
bool py_iscased(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return in_ranges(tmpl_prop_cased, tmpl_prop_cased_n, c);
}
bool py_iscaseignorable(uint32_t c) { return in_ranges(tmpl_prop_case_ignorable, tmpl_prop_case_ignorable_n, c); }

/* The mapping of c in a run table; false when no run covers c. */
static bool case_find(const struct tmpl_case_run *r, size_t n, uint32_t c, uint32_t *out) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* last run with r.lo <= c */
        size_t mid = (lo + hi) / 2;
        if (r[mid].lo <= c) lo = mid + 1;
        else hi = mid;
    }
    if (!lo) return false;
    const struct tmpl_case_run *x = &r[lo - 1];
    if (c > x->hi || (c - x->lo) % x->stride) return false;
    *out = (uint32_t)((int64_t)c + x->delta);
    return true;
}

static uint32_t case_map(const struct tmpl_case_run *r, size_t n, uint32_t c) {
    uint32_t m;
    return case_find(r, n, c, &m) ? m : c;
}

uint32_t py_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return case_map(tmpl_case_lower, tmpl_case_lower_n, c);
}

uint32_t py_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    return case_map(tmpl_case_upper, tmpl_case_upper_n, c);
}

size_t py_case_full(int kind, uint32_t c, uint32_t out[3]) {
    if (c >= 0x80) {
        for (size_t i = 0; i < tmpl_case_special_n; i++) /* ~150 entries, all >= U+00DF */
            if (tmpl_case_special[i].cp == c && tmpl_case_special[i].kind == kind) {
                for (size_t k = 0; k < tmpl_case_special[i].n; k++) out[k] = tmpl_case_special[i].m[k];
                return tmpl_case_special[i].n;
            }
    }
    if (kind == 0) out[0] = py_lower(c);
    else if (kind == 1) out[0] = py_upper(c);
    else if (c < 0x80 || !case_find(tmpl_case_title, tmpl_case_title_n, c, &out[0]))
        out[0] = py_upper(c); /* title case is upper case except where the table says */
    return 1;
}

/* ---------------------------------------------------------------- objects */

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

struct tstr *tstr_new(struct rt *rt, const char *s, size_t len) {
    size_t sz;
    if (ckd_add_size(&sz, sizeof(struct tstr) + 1, len)) {
        if (rt) rt_fail(rt, SMELT_ERR_RANGE, "string too long");
        return NULL;
    }
    if (rt && len > rt->lim.max_output) {
        rt_fail(rt, SMELT_ERR_RANGE, "string of %zu bytes exceeds the output limit (%zu)", len,
                rt->lim.max_output);
        return NULL;
    }
    struct tstr *t = rt_alloc(rt, sz);
    if (!t) return NULL;
    t->h.rc = 1;
    t->h.kind = TV_STR;
    t->h.bytes = sz;
    t->len = len;
    if (len) memcpy(t->s, s, len);
    t->s[len] = 0;
    t->ncp = utf8_count(t->s, len);
    t->hash = 0; /* computed when first needed (tv_hash); frozen strings get it in tv_freeze */
    return t;
}

bool tv_new_str(struct rt *rt, const char *s, size_t len, struct tv *out) {
    struct tstr *t = tstr_new(rt, s, len);
    if (!t) return false;
    *out = (struct tv){.kind = TV_STR, .u.s = t};
    return true;
}

bool tv_new_strz(struct rt *rt, const char *s, struct tv *out) {
    return tv_new_str(rt, s, strlen(s), out);
}

bool tv_new_list(struct rt *rt, size_t cap, struct tv *out) {
    struct tlist *l = rt_alloc(rt, sizeof *l);
    if (!l) return false;
    memset(l, 0, sizeof *l);
    l->h.rc = 1;
    l->h.kind = TV_LIST;
    l->h.bytes = sizeof *l;
    if (cap) {
        size_t sz;
        if (ckd_mul_size(&sz, cap, sizeof(struct tv))) {
            free(l);
            return rt_fail(rt, SMELT_ERR_RANGE, "list too long");
        }
        l->v = rt_alloc(rt, sz);
        if (!l->v) {
            free(l);
            return false;
        }
        l->cap = cap;
    }
    *out = (struct tv){.kind = TV_LIST, .u.l = l};
    return true;
}

static bool dict_alloc(struct rt *rt, uint8_t kind, struct tv *out) {
    struct tdict *d = rt_alloc(rt, sizeof *d);
    if (!d) return false;
    memset(d, 0, sizeof *d);
    d->h.rc = 1;
    d->h.kind = kind;
    d->h.bytes = sizeof *d;
    *out = (struct tv){.kind = kind, .u.d = d};
    return true;
}

bool tv_new_dict(struct rt *rt, struct tv *out) { return dict_alloc(rt, TV_DICT, out); }

bool tv_new_ns(struct rt *rt, struct tv *out) {
    if (!dict_alloc(rt, TV_NS, out)) return false;
    if (rt && !rt_track_ns(rt, out->u.d)) {
        tv_release(rt, *out);
        return false;
    }
    return true;
}

bool tv_new_func(struct rt *rt, uint16_t fid, struct tv self, struct tv *out) {
    struct tfunc *f = rt_alloc(rt, sizeof *f);
    if (!f) return false;
    memset(f, 0, sizeof *f);
    f->h.rc = 1;
    f->h.kind = TV_FUNC;
    f->h.bytes = sizeof *f;
    f->fid = fid;
    f->self = tv_retain(self);
    *out = (struct tv){.kind = TV_FUNC, .u.fn = f};
    return true;
}

/* Frees o and every object only it kept alive. Iterative (a worklist threaded through the
 * dead objects' `bytes` field), so a deeply nested value cannot overflow the stack. */
static void drop(struct tobj **work, struct tv v) {
    if (tv_is_obj(v) && v.u.o->rc != RC_FROZEN && --v.u.o->rc == 0) {
        v.u.o->bytes = (size_t)(uintptr_t)*work;
        *work = v.u.o;
    }
}

void tv_free_obj(struct rt *rt, struct tobj *o) {
    (void)rt;
    o->bytes = 0;
    struct tobj *work = o;
    while (work) {
        o = work;
        work = (struct tobj *)(uintptr_t)o->bytes;
        switch (o->kind) {
        case TV_LIST:
        case TV_TUPLE: {
            struct tlist *l = (struct tlist *)o;
            for (size_t i = 0; i < l->n; i++) drop(&work, l->v[i]);
            free(l->v);
            break;
        }
        case TV_DICT:
        case TV_NS: {
            struct tdict *d = (struct tdict *)o;
            for (size_t i = 0; i < d->n; i++) {
                drop(&work, d->k[i]);
                drop(&work, d->v[i]);
            }
            free(d->k);
            free(d->v);
            free(d->idx);
            break;
        }
        case TV_FUNC: drop(&work, ((struct tfunc *)o)->self); break;
        case TV_LOOP: {
            struct tloop *lp = (struct tloop *)o;
            if (lp->items) drop(&work, (struct tv){.kind = TV_LIST, .u.l = lp->items});
            drop(&work, lp->changed_last);
            break;
        }
        default: break; /* strings; macros (closure scopes belong to the render) */
        }
        free(o);
    }
}

static uint64_t str_hash(struct tstr *s);

static void walk_frozen(struct tv v, bool destroy) {
    if (!tv_is_obj(v)) return;
    struct tobj *o = v.u.o;
    switch (o->kind) {
    case TV_STR:
        if (!destroy) str_hash((struct tstr *)o);
        break;
    case TV_LIST:
    case TV_TUPLE: {
        struct tlist *l = (struct tlist *)o;
        for (size_t i = 0; i < l->n; i++) walk_frozen(l->v[i], destroy);
        if (destroy) free(l->v);
        break;
    }
    case TV_DICT:
    case TV_NS: {
        struct tdict *d = (struct tdict *)o;
        for (size_t i = 0; i < d->n; i++) {
            walk_frozen(d->k[i], destroy);
            walk_frozen(d->v[i], destroy);
        }
        if (destroy) {
            free(d->k);
            free(d->v);
            free(d->idx);
        }
        break;
    }
    default: break;
    }
    if (destroy) free(o);
    else o->rc = RC_FROZEN;
}

void tv_destroy_frozen(struct tv v) { walk_frozen(v, true); }
void tv_freeze(struct tv v) { walk_frozen(v, false); }

bool tlist_push(struct rt *rt, struct tlist *l, struct tv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4, sz;
        if (ckd_mul_size(&sz, nc, sizeof(struct tv))) {
            tv_release(rt, v);
            return rt_fail(rt, SMELT_ERR_RANGE, "list too long");
        }
        struct tv *nv = rt_realloc_acct(rt, l->v, l->cap * sizeof(struct tv), sz);
        if (!nv) {
            tv_release(rt, v);
            return false;
        }
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return true;
}

/* ---------------------------------------------------------------- dicts */

#define VALUE_MAX_DEPTH 512 /* recursion bound of ==, <, hash, repr on nested values */

static uint64_t str_hash(struct tstr *s) {
    if (s->hash) return s->hash;
    uint64_t h = fnv1a(s->s, s->len);
    if (!h) h = 1;
    if (s->h.rc != RC_FROZEN) s->hash = h; /* frozen strings are shared: never written */
    return h;
}

static uint64_t hash_rec(struct tv v, int depth) {
    switch (v.kind) {
    case TV_STR: return str_hash(v.u.s);
    case TV_BOOL: return (uint64_t)v.u.b * 0x9e3779b97f4a7c15ull;
    case TV_INT: return (uint64_t)v.u.i * 0x9e3779b97f4a7c15ull;
    case TV_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9.2e18)
            return (uint64_t)(int64_t)v.u.f * 0x9e3779b97f4a7c15ull;
        {
            uint64_t b;
            memcpy(&b, &v.u.f, 8);
            return b * 0xff51afd7ed558ccdull;
        }
    case TV_NONE: return 0x1234567;
    case TV_TUPLE: {
        uint64_t h = 0xabcdef;
        if (depth < VALUE_MAX_DEPTH)
            for (size_t i = 0; i < v.u.l->n; i++) h = (h ^ hash_rec(v.u.l->v[i], depth + 1)) * 1099511628211ull;
        return h;
    }
    default: return (uint64_t)(uintptr_t)v.u.o * 0x9e3779b97f4a7c15ull;
    }
}

uint64_t tv_hash(struct tv v) { return hash_rec(v, 0); }

static bool hashable_rec(struct tv v, int depth) {
    if (v.kind == TV_LIST || v.kind == TV_DICT || v.kind == TV_NS) return false;
    if (v.kind == TV_TUPLE) {
        if (depth > VALUE_MAX_DEPTH) return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!hashable_rec(v.u.l->v[i], depth + 1)) return false;
    }
    return true;
}
static bool hashable(struct tv v) { return hashable_rec(v, 0); }

static void dict_reindex(struct tdict *d) {
    memset(d->idx, 0, d->icap * sizeof *d->idx);
    for (size_t i = 0; i < d->n; i++) {
        size_t m = d->icap - 1, s = tv_hash(d->k[i]) & m;
        while (d->idx[s]) s = (s + 1) & m;
        d->idx[s] = (uint32_t)(i + 1);
    }
}

static ptrdiff_t dict_find(const struct tdict *d, struct tv k) {
    if (d->idx) {
        size_t m = d->icap - 1, s = tv_hash(k) & m;
        while (d->idx[s]) {
            size_t i = d->idx[s] - 1;
            if (tv_eq(d->k[i], k)) return (ptrdiff_t)i;
            s = (s + 1) & m;
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(d->k[i], k)) return (ptrdiff_t)i;
    return -1;
}

struct tv *tdict_get(const struct tdict *d, struct tv k) {
    ptrdiff_t i = dict_find(d, k);
    return i < 0 ? NULL : &d->v[i];
}

struct tv *tdict_get_str(const struct tdict *d, const char *k, size_t klen) {
    if (d->idx) {
        uint64_t h = fnv1a(k, klen);
        if (!h) h = 1;
        size_t m = d->icap - 1, s = h & m;
        while (d->idx[s]) {
            size_t i = d->idx[s] - 1;
            struct tv kk = d->k[i];
            if (kk.kind == TV_STR && kk.u.s->len == klen && !memcmp(kk.u.s->s, k, klen))
                return &d->v[i];
            s = (s + 1) & m;
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++) {
        struct tv kk = d->k[i];
        if (kk.kind == TV_STR && kk.u.s->len == klen && !memcmp(kk.u.s->s, k, klen))
            return &d->v[i];
    }
    return NULL;
}

bool tdict_set(struct rt *rt, struct tdict *d, struct tv k, struct tv v) {
    if (!hashable(k)) return rt_fail(rt, SMELT_ERR_INVALID, "unhashable type: '%s'", tv_type_name(k));
    ptrdiff_t i = dict_find(d, k);
    if (i >= 0) {
        struct tv old = d->v[i];
        d->v[i] = tv_retain(v);
        tv_release(rt, old);
        return true;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4, sz;
        if (nc > UINT32_MAX / 4 || ckd_mul_size(&sz, nc, sizeof(struct tv)))
            return rt_fail(rt, SMELT_ERR_RANGE, "dict too large");
        struct tv *nk = rt_realloc_acct(rt, d->k, d->cap * sizeof(struct tv), sz);
        if (!nk) return false;
        d->k = nk;
        struct tv *nv = rt_realloc_acct(rt, d->v, d->cap * sizeof(struct tv), sz);
        if (!nv) return false;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = tv_retain(k);
    d->v[d->n] = tv_retain(v);
    d->n++;
    if (d->n > 8 && d->n * 2 > d->icap) {
        size_t ic = 32;
        while (ic < d->n * 4) ic *= 2;
        uint32_t *ni = rt_realloc_acct(rt, d->idx, d->icap * sizeof *ni, ic * sizeof *ni);
        if (!ni) {
            /* keep the dict consistent: drop the index, lookups go linear */
            free(d->idx);
            d->idx = NULL;
            d->icap = 0;
            return false;
        }
        d->idx = ni;
        d->icap = ic;
        dict_reindex(d);
    } else if (d->idx) {
        size_t m = d->icap - 1, s = tv_hash(k) & m;
        while (d->idx[s]) s = (s + 1) & m;
        d->idx[s] = (uint32_t)d->n;
    }
    return true;
}

/* ---------------------------------------------------------------- semantics */

bool tv_truthy(struct tv v) {
    switch (v.kind) {
    case TV_UNDEF:
    case TV_NONE: return false;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0;
    case TV_STR: return v.u.s->len != 0;
    case TV_LIST:
    case TV_TUPLE: return v.aux == SV_GEN || v.aux == SV_REVITER || v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static double num_f(struct tv v) {
    return v.kind == TV_FLOAT ? v.u.f : v.kind == TV_INT ? (double)v.u.i : (double)v.u.b;
}

/* Values nested deeper than VALUE_MAX_DEPTH compare unequal (Python would recurse). */
static bool eq_rec(struct tv a, struct tv b, int depth);
bool tv_eq(struct tv a, struct tv b) { return eq_rec(a, b, 0); }

static bool eq_rec(struct tv a, struct tv b, int depth) {
    if (depth > VALUE_MAX_DEPTH) return false;
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) {
            int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num_f(a) == num_f(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case TV_UNDEF:
    case TV_NONE: return true;
    case TV_STR:
        return a.u.s == b.u.s ||
               (a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len));
    case TV_LIST:
    case TV_TUPLE:
        if (a.aux != b.aux) return false;
        if (a.aux == SV_GEN || a.aux == SV_REVITER) return a.u.l == b.u.l;
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_rec(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct tv *o = tdict_get(b.u.d, a.u.d->k[i]);
            if (!o || !eq_rec(a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case TV_FUNC:
        return a.u.fn == b.u.fn ||
               (a.u.fn->fid == b.u.fn->fid && eq_rec(a.u.fn->self, b.u.fn->self, depth + 1));
    default: return a.u.o == b.u.o;
    }
}

const char *tv_type_name(struct tv v) {
    switch (v.kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST:
        switch (v.aux) {
        case SV_GEN: return "generator";
        case SV_REVITER: return "list_reverseiterator";
        case SV_ITEMS: return "dict_items";
        case SV_KEYS: return "dict_keys";
        case SV_VALUES: return "dict_values";
        default: return "list";
        }
    case TV_TUPLE: return "tuple";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC: return "builtin_function_or_method";
    case TV_MACRO: return "Macro";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

static bool cmp_rec(struct rt *rt, struct tv a, struct tv b, int *cmp, int depth);
bool tv_cmp(struct rt *rt, struct tv a, struct tv b, int *cmp) { return cmp_rec(rt, a, b, cmp, 0); }

static bool cmp_rec(struct rt *rt, struct tv a, struct tv b, int *cmp, int depth) {
    if (depth > VALUE_MAX_DEPTH) return rt_fail(rt, SMELT_ERR_RANGE, "values nested too deeply to compare");
    if (a.kind == TV_UNDEF) return rt_undef_error(rt, a);
    if (b.kind == TV_UNDEF) return rt_undef_error(rt, b);
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) {
            int64_t x = a.kind == TV_INT ? a.u.i : a.u.b, y = b.kind == TV_INT ? b.u.i : b.u.b;
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0; /* NaN compares "equal" (never <, never >) */
        }
        return true;
    }
    if (a.kind == TV_STR && b.kind == TV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        *cmp = c < 0 ? -1 : c > 0 ? 1 : a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
        return true;
    }
    if (a.kind == b.kind && tv_is_seq(a)) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return cmp_rec(rt, a.u.l->v[i], b.u.l->v[i], cmp, depth + 1);
        }
        *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return true;
    }
    return rt_fail(rt, SMELT_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'",
                   tv_type_name(a), tv_type_name(b));
}

/* ---------------------------------------------------------------- buffers */

static bool sb_grow(struct sbuf *b, size_t add) {
    size_t need;
    if (ckd_add_size(&need, b->n, add + 1)) return rt_fail(b->rt, SMELT_ERR_RANGE, "string too long");
    if (b->limit && need > b->limit + 1) {
        if (b->rt)
            return rt_fail(b->rt, SMELT_ERR_RANGE, "template output exceeds %zu bytes", b->limit);
        return false;
    }
    if (need <= b->cap) return true;
    size_t nc = b->cap ? b->cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) {
            nc = need;
            break;
        }
        nc *= 2;
    }
    char *p = rt_realloc_acct(b->rt, b->p, b->cap, nc);
    if (!p) return false;
    b->p = p;
    b->cap = nc;
    return true;
}

bool sb_put(struct sbuf *b, const char *s, size_t n) {
    if (!n) return true;
    if (b->n + n + 1 > b->cap && !sb_grow(b, n)) return false;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool sb_putc(struct sbuf *b, char c) { return sb_put(b, &c, 1); }
bool sb_puts(struct sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

bool sb_printf(struct sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof tmp) return sb_put(b, tmp, (size_t)n);
    if (!sb_grow(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return true;
}

void sb_free(struct sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool sb_to_tv(struct sbuf *b, struct tv *out) {
    bool ok = tv_new_str(b->rt, b->p ? b->p : "", b->n, out);
    sb_free(b);
    return ok;
}

/* ---------------------------------------------------------------- str / repr */

void py_float_repr(double f, char *buf, size_t n) {
    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, n, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    /* Shortest digits that round-trip, as Python's repr. */
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < 20) digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1; /* digits d1 d2... represent 0.d1d2... * 10^decpt */
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i < decpt; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        int x = decpt - 1;
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
    snprintf(buf, n, "%s", out);
}

static bool repr_str(struct sbuf *b, const char *s, size_t len) {
    bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (!sb_putc(b, q)) return false;
    size_t i = 0;
    while (i < len) {
        size_t st = i;
        uint32_t c = utf8_next(s, len, &i);
        bool ok;
        if (c == (uint32_t)q || c == '\\') {
            char t[2] = {'\\', (char)c};
            ok = sb_put(b, t, 2);
        } else if (c == '\n') ok = sb_put(b, "\\n", 2);
        else if (c == '\r') ok = sb_put(b, "\\r", 2);
        else if (c == '\t') ok = sb_put(b, "\\t", 2);
        else if (c >= 0xdc80 && c <= 0xdcff) ok = sb_printf(b, "\\udc%02x", c & 0xff);
        else if (py_isprintable(c)) ok = sb_put(b, s + st, i - st);
        else if (c <= 0xff) ok = sb_printf(b, "\\x%02x", c);
        else if (c <= 0xffff) ok = sb_printf(b, "\\u%04x", c);
        else ok = sb_printf(b, "\\U%08x", c);
        if (!ok) return false;
    }
    return sb_putc(b, q);
}

static bool repr_inner(struct rt *rt, struct sbuf *b, struct tv v, bool top, int depth);

static bool repr_seq(struct rt *rt, struct sbuf *b, struct tv v, int depth) {
    if (v.kind == TV_LIST && v.aux) {
        if (v.aux == SV_GEN || v.aux == SV_REVITER) return sb_printf(b, "<%s object>", tv_type_name(v));
        struct tv plain = v;
        plain.aux = SV_LIST;
        return sb_puts(b, tv_type_name(v)) && sb_putc(b, '(') && repr_seq(rt, b, plain, depth) && sb_putc(b, ')');
    }
    const char *open = v.kind == TV_TUPLE ? "(" : "[", *close = v.kind == TV_TUPLE ? ")" : "]";
    if (!sb_puts(b, open)) return false;
    for (size_t i = 0; i < v.u.l->n; i++) {
        if (i && !sb_put(b, ", ", 2)) return false;
        if (!repr_inner(rt, b, v.u.l->v[i], false, depth + 1)) return false;
    }
    if (v.kind == TV_TUPLE && v.u.l->n == 1 && !sb_putc(b, ',')) return false;
    return sb_puts(b, close);
}

static bool repr_dict(struct rt *rt, struct sbuf *b, struct tdict *d, int depth) {
    if (!sb_putc(b, '{')) return false;
    for (size_t i = 0; i < d->n; i++) {
        if (i && !sb_put(b, ", ", 2)) return false;
        if (!repr_inner(rt, b, d->k[i], false, depth + 1) || !sb_put(b, ": ", 2) ||
            !repr_inner(rt, b, d->v[i], false, depth + 1))
            return false;
    }
    return sb_putc(b, '}');
}

static bool repr_inner(struct rt *rt, struct sbuf *b, struct tv v, bool top, int depth) {
    if (rt && !rt_step(rt, 1)) return false;
    if (depth > VALUE_MAX_DEPTH) /* deep nesting, or a namespace that contains itself */
        return rt_fail(rt, SMELT_ERR_RANGE, "value nested too deeply to print");
    char tmp[64];
    switch (v.kind) {
    case TV_UNDEF: return top ? true : sb_puts(b, "Undefined");
    case TV_NONE: return sb_puts(b, "None");
    case TV_BOOL: return sb_puts(b, v.u.b ? "True" : "False");
    case TV_INT: return sb_printf(b, "%" PRId64, v.u.i);
    case TV_FLOAT: py_float_repr(v.u.f, tmp, sizeof tmp); return sb_puts(b, tmp);
    case TV_STR:
        if (top) return sb_put(b, v.u.s->s, v.u.s->len);
        if (v.safe) {
            return sb_puts(b, "Markup(") && repr_str(b, v.u.s->s, v.u.s->len) && sb_putc(b, ')');
        }
        return repr_str(b, v.u.s->s, v.u.s->len);
    case TV_LIST:
    case TV_TUPLE: return repr_seq(rt, b, v, depth);
    case TV_DICT: return repr_dict(rt, b, v.u.d, depth);
    case TV_NS: return sb_puts(b, "<Namespace ") && repr_dict(rt, b, v.u.d, depth) && sb_putc(b, '>');
    case TV_FUNC: return sb_puts(b, "<built-in function>");
    case TV_MACRO: return sb_puts(b, "<Macro>");
    case TV_LOOP:
        return sb_printf(b, "<LoopContext %zu/%zu>", v.u.lp->i + 1, v.u.lp->items->n);
    }
    return true;
}

bool tv_str(struct rt *rt, struct sbuf *b, struct tv v) { return repr_inner(rt, b, v, true, 0); }
bool tv_repr(struct rt *rt, struct sbuf *b, struct tv v) { return repr_inner(rt, b, v, false, 0); }

bool tv_to_str(struct rt *rt, struct tv v, struct tv *out) {
    if (v.kind == TV_STR) {
        *out = tv_retain(v);
        return true;
    }
    char tmp[64];
    switch (v.kind) {
    case TV_UNDEF: return tv_new_str(rt, "", 0, out);
    case TV_NONE: return tv_new_str(rt, "None", 4, out);
    case TV_BOOL: return v.u.b ? tv_new_str(rt, "True", 4, out) : tv_new_str(rt, "False", 5, out);
    case TV_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i); return tv_new_strz(rt, tmp, out);
    case TV_FLOAT: py_float_repr(v.u.f, tmp, sizeof tmp); return tv_new_strz(rt, tmp, out);
    default: break;
    }
    struct sbuf b = {.rt = rt, .limit = rt ? rt->lim.max_output : 0};
    if (!tv_str(rt, &b, v)) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

/* ---------------------------------------------------------------- JSON */

static bool json_str(struct sbuf *b, const char *s, size_t len, bool ensure_ascii) {
    if (!sb_putc(b, '"')) return false;
    size_t i = 0, run = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80 && ensure_ascii) {
            size_t st = i;
            uint32_t cp = utf8_next(s, len, &i);
            if (!sb_put(b, s + run, st - run)) return false;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                if (!sb_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff)))
                    return false;
            } else if (!sb_printf(b, "\\u%04x", cp)) {
                return false;
            }
            run = i;
            continue;
        }
        if (esc) {
            if (!sb_put(b, s + run, i - run) || !sb_puts(b, esc)) return false;
            run = i + 1;
        }
        i++;
    }
    return sb_put(b, s + run, len - run) && sb_putc(b, '"');
}

static bool json_newline(struct sbuf *b, const struct json_opts *o, int level) {
    if (!sb_putc(b, '\n')) return false;
    for (int i = 0; i < level; i++)
        if (!sb_put(b, o->indent, o->indent_len)) return false;
    return true;
}

/* A dict key as json.dumps converts it; false with the error set for other types. */
static bool json_key(struct rt *rt, struct sbuf *b, struct tv k, const struct json_opts *o) {
    char tmp[64];
    switch (k.kind) {
    case TV_STR: return json_str(b, k.u.s->s, k.u.s->len, o->ensure_ascii);
    case TV_INT: snprintf(tmp, sizeof tmp, "\"%" PRId64 "\"", k.u.i); return sb_puts(b, tmp);
    case TV_FLOAT: {
        char f[40];
        if (isnan(k.u.f)) snprintf(f, sizeof f, "NaN");
        else if (isinf(k.u.f)) snprintf(f, sizeof f, k.u.f < 0 ? "-Infinity" : "Infinity");
        else py_float_repr(k.u.f, f, sizeof f);
        return sb_printf(b, "\"%s\"", f);
    }
    case TV_BOOL: return sb_puts(b, k.u.b ? "\"true\"" : "\"false\"");
    case TV_NONE: return sb_puts(b, "\"null\"");
    default:
        return rt_fail(rt, SMELT_ERR_INVALID, "keys must be str, int, float, bool or None, not %s",
                       tv_type_name(k));
    }
}

static int key_order_cmp(struct rt *rt, struct tv a, struct tv b, bool *ok) {
    int c = 0;
    if (!tv_cmp(rt, a, b, &c)) *ok = false;
    return c;
}

bool tv_json(struct rt *rt, struct sbuf *b, struct tv v, const struct json_opts *o, int level) {
    if (rt && !rt_step(rt, 1)) return false;
    if (level > VALUE_MAX_DEPTH) return rt_fail(rt, SMELT_ERR_RANGE, "tojson: value nested too deeply");
    char tmp[64];
    switch (v.kind) {
    case TV_NONE: return sb_puts(b, "null");
    case TV_BOOL: return sb_puts(b, v.u.b ? "true" : "false");
    case TV_INT: return sb_printf(b, "%" PRId64, v.u.i);
    case TV_FLOAT:
        if (isnan(v.u.f)) return sb_puts(b, "NaN");
        if (isinf(v.u.f)) return sb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        py_float_repr(v.u.f, tmp, sizeof tmp);
        return sb_puts(b, tmp);
    case TV_STR: return json_str(b, v.u.s->s, v.u.s->len, o->ensure_ascii);
    case TV_LIST:
    case TV_TUPLE: {
        struct tlist *l = v.u.l;
        if (v.aux)
            return rt_fail(rt, SMELT_ERR_INVALID, "Object of type %s is not JSON serializable",
                           tv_type_name(v));
        if (!l->n) return sb_put(b, "[]", 2);
        if (!sb_putc(b, '[')) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i && !sb_put(b, o->item_sep, o->item_sep_len)) return false;
            if (o->indent && !json_newline(b, o, level + 1)) return false;
            if (!tv_json(rt, b, l->v[i], o, level + 1)) return false;
        }
        if (o->indent && !json_newline(b, o, level)) return false;
        return sb_putc(b, ']');
    }
    case TV_DICT: {
        struct tdict *d = v.u.d;
        if (!d->n) return sb_put(b, "{}", 2);
        size_t *ord = NULL;
        if (o->sort_keys && d->n > 1) {
            ord = rt_alloc(rt, d->n * sizeof *ord);
            if (!ord) return false;
            for (size_t i = 0; i < d->n; i++) ord[i] = i;
            bool ok = true;
            for (size_t i = 1; i < d->n && ok; i++) { /* insertion sort: stable, small */
                size_t x = ord[i], j = i;
                while (j > 0 && ok && key_order_cmp(rt, d->k[ord[j - 1]], d->k[x], &ok) > 0) {
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
            if (!ok) {
                free(ord);
                return false;
            }
        }
        bool ok = sb_putc(b, '{');
        for (size_t ii = 0; ii < d->n && ok; ii++) {
            size_t i = ord ? ord[ii] : ii;
            if (ii && !sb_put(b, o->item_sep, o->item_sep_len)) ok = false;
            else if (o->indent && !json_newline(b, o, level + 1)) ok = false;
            else if (!json_key(rt, b, d->k[i], o)) ok = false;
            else if (!sb_put(b, o->key_sep, o->key_sep_len)) ok = false;
            else if (!tv_json(rt, b, d->v[i], o, level + 1)) ok = false;
        }
        free(ord);
        if (!ok) return false;
        if (o->indent && !json_newline(b, o, level)) return false;
        return sb_putc(b, '}');
    }
    default:
        return rt_fail(rt, SMELT_ERR_INVALID, "Object of type %s is not JSON serializable",
                       tv_type_name(v));
    }
}

/* ---------------------------------------------------------------- public values */

struct tmpl_value {
    struct tv v;
};

static struct tmpl_value *box(struct tv v) {
    struct tmpl_value *b = malloc(sizeof *b);
    if (!b) {
        tv_destroy_frozen(v);
        return NULL;
    }
    tv_freeze(v);
    b->v = v;
    return b;
}

static bool from_json(const json_t *j, struct tv *out, int depth, struct err *e) {
    if (depth > VALUE_MAX_DEPTH) return err_set(e, SMELT_ERR_RANGE, "JSON nested deeper than %d levels for a template context", VALUE_MAX_DEPTH), false;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        if (!tv_new_dict(NULL, out)) goto nomem;
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)j, k, val) {
            struct tv kv, vv;
            if (!tv_new_str(NULL, k, strlen(k), &kv)) goto nomem_free;
            if (!from_json(val, &vv, depth + 1, e)) {
                tv_destroy_frozen(kv);
                tv_destroy_frozen(*out);
                return false;
            }
            /* reference counts do not matter here: box() freezes the whole tree */
            if (!tdict_set(NULL, out->u.d, kv, vv)) {
                tv_destroy_frozen(kv);
                tv_destroy_frozen(vv);
                goto nomem_free;
            }
        }
        return true;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (!tv_new_list(NULL, n, out)) goto nomem;
        for (size_t i = 0; i < n; i++) {
            struct tv vv;
            if (!from_json(json_array_get(j, i), &vv, depth + 1, e)) {
                tv_destroy_frozen(*out);
                return false;
            }
            out->u.l->v[out->u.l->n++] = vv;
        }
        return true;
    }
    case JSON_STRING:
        if (!tv_new_str(NULL, json_string_value(j), json_string_length(j), out)) goto nomem;
        return true;
    case JSON_INTEGER: *out = tv_int(json_integer_value(j)); return true;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return true;
    case JSON_TRUE: *out = tv_bool(true); return true;
    case JSON_FALSE: *out = tv_bool(false); return true;
    case JSON_NULL: *out = tv_none(); return true;
    }
    *out = tv_none();
    return true;
nomem_free:
    tv_destroy_frozen(*out);
nomem:
    err_set(e, SMELT_ERR_NOMEM, "out of memory building the template context");
    return false;
}

struct tmpl_value *tmpl_value_from_json(const json_t *j, struct err *e) {
    struct tv v;
    if (!j) {
        err_set(e, SMELT_ERR_INVALID, "tmpl_value_from_json: NULL");
        return NULL;
    }
    if (!from_json(j, &v, 0, e)) return NULL;
    struct tmpl_value *b = box(v);
    if (!b) err_set(e, SMELT_ERR_NOMEM, "out of memory building the template context");
    return b;
}

struct tmpl_value *tmpl_value_new_dict(void) {
    struct tv v;
    return tv_new_dict(NULL, &v) ? box(v) : NULL;
}
struct tmpl_value *tmpl_value_new_list(void) {
    struct tv v;
    return tv_new_list(NULL, 0, &v) ? box(v) : NULL;
}
struct tmpl_value *tmpl_value_new_str(const char *s, size_t len) {
    struct tv v;
    return tv_new_str(NULL, s, len, &v) ? box(v) : NULL;
}
struct tmpl_value *tmpl_value_new_int(int64_t i) { return box(tv_int(i)); }
struct tmpl_value *tmpl_value_new_float(double f) { return box(tv_float(f)); }
struct tmpl_value *tmpl_value_new_bool(bool b) { return box(tv_bool(b)); }
struct tmpl_value *tmpl_value_new_none(void) { return box(tv_none()); }

void tmpl_value_free(struct tmpl_value *v) {
    if (!v) return;
    tv_destroy_frozen(v->v);
    free(v);
}

const struct tv *tmpl_value_tv(const struct tmpl_value *v) { return v ? &v->v : NULL; }

smelt_status tmpl_dict_set(struct tmpl_value *dict, const char *key, struct tmpl_value *v,
                           struct err *e) {
    if (!v) return e && e->code ? e->code : err_set(e, SMELT_ERR_NOMEM, "tmpl_dict_set: no value");
    if (!dict || dict->v.kind != TV_DICT) {
        tmpl_value_free(v);
        return err_set(e, SMELT_ERR_INVALID, "tmpl_dict_set: not a dict");
    }
    struct tdict *d = dict->v.u.d;
    struct tv *old = tdict_get_str(d, key, strlen(key));
    if (old) {
        tv_destroy_frozen(*old);
        *old = v->v;
        free(v);
        return SMELT_OK;
    }
    struct tv k;
    if (!tv_new_str(NULL, key, strlen(key), &k)) {
        tmpl_value_free(v);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    if (!tdict_set(NULL, d, k, v->v)) { /* frozen v: retain/release are no-ops */
        tv_destroy_frozen(k);
        tmpl_value_free(v);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    k.u.o->rc = RC_FROZEN;
    free(v);
    return SMELT_OK;
}

smelt_status tmpl_list_push(struct tmpl_value *list, struct tmpl_value *v, struct err *e) {
    if (!v) return e && e->code ? e->code : err_set(e, SMELT_ERR_NOMEM, "tmpl_list_push: no value");
    if (!list || list->v.kind != TV_LIST) {
        tmpl_value_free(v);
        return err_set(e, SMELT_ERR_INVALID, "tmpl_list_push: not a list");
    }
    if (!tlist_push(NULL, list->v.u.l, v->v)) {
        tmpl_value_free(v);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    free(v);
    return SMELT_OK;
}

smelt_status tmpl_chat_ctx(const json_t *messages, const json_t *tools,
                           bool add_generation_prompt, const char *bos_token,
                           const char *eos_token, const json_t *extra,
                           struct tmpl_value **out, struct err *e) {
    *out = NULL;
    struct tmpl_value *c = tmpl_value_new_dict();
    if (!c) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    smelt_status st;
#define SET(k, val)                                                                            \
    do {                                                                                       \
        st = tmpl_dict_set(c, k, val, e);                                                      \
        if (st) goto fail;                                                                     \
    } while (0)
    if (messages) SET("messages", tmpl_value_from_json(messages, e));
    else SET("messages", tmpl_value_new_list());
    SET("tools", tools && !json_is_null(tools) ? tmpl_value_from_json(tools, e) : tmpl_value_new_none());
    SET("documents", tmpl_value_new_none());
    SET("add_generation_prompt", tmpl_value_new_bool(add_generation_prompt));
    SET("bos_token", bos_token ? tmpl_value_new_str(bos_token, strlen(bos_token)) : tmpl_value_new_none());
    SET("eos_token", eos_token ? tmpl_value_new_str(eos_token, strlen(eos_token)) : tmpl_value_new_none());
    if (extra && json_is_object(extra)) {
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)extra, k, val) SET(k, tmpl_value_from_json(val, e));
    }
#undef SET
    *out = c;
    return SMELT_OK;
fail:
    tmpl_value_free(c);
    return st;
}

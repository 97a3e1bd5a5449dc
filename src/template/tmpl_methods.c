/* Chat-template methods and globals: Python str / dict / list methods as templates call
 * them (`s.split(',')`, `d.get('k', 0)`, `d.items()`), jinja2's loop.cycle/changed, the
 * globals range/namespace/dict/raise_exception/strftime_now, and Python's `%` and
 * str.format formatting.
 *
 * Strings are indexed by code point, as in Python. Mutating methods (list.append,
 * dict.update, ...) are refused exactly like jinja2's ImmutableSandboxedEnvironment,
 * which HF uses: the attribute is an undefined value, so calling it fails with
 * "access to attribute 'append' of 'list' object is unsafe".
 */
#include "template/tmpl_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/ckd.h"


enum {
    /* str */
    M_CAPITALIZE = 1, M_CASEFOLD, M_CENTER, M_COUNT, M_ENDSWITH, M_FIND, M_FORMAT, M_INDEX,
    M_ISALNUM, M_ISALPHA, M_ISASCII, M_ISDECIMAL, M_ISDIGIT, M_ISLOWER, M_ISNUMERIC, M_ISSPACE,
    M_ISTITLE, M_ISUPPER, M_JOIN, M_LJUST, M_LOWER, M_LSTRIP, M_PARTITION, M_REMOVEPREFIX,
    M_REMOVESUFFIX, M_REPLACE, M_RFIND, M_RINDEX, M_RJUST, M_RPARTITION, M_RSPLIT, M_RSTRIP,
    M_SPLIT, M_SPLITLINES, M_STARTSWITH, M_STRIP, M_SWAPCASE, M_TITLE, M_UPPER, M_ZFILL,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DCOPY,
    /* list / tuple */
    M_LCOUNT, M_LINDEX, M_LCOPY,
    /* loop */
    M_CYCLE, M_CHANGED,
    /* globals */
    G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME, G_UNSUPPORTED_CYCLER, G_UNSUPPORTED_JOINER,
    G_UNSUPPORTED_LIPSUM,
    M_UNSAFE, /* marker: sandbox-refused */
};

struct mdef {
    const char *name;
    uint16_t fid;
};

static const struct mdef str_methods[] = {
    {"capitalize", M_CAPITALIZE}, {"casefold", M_CASEFOLD}, {"center", M_CENTER},
    {"count", M_COUNT}, {"endswith", M_ENDSWITH}, {"find", M_FIND}, {"format", M_FORMAT},
    {"index", M_INDEX}, {"isalnum", M_ISALNUM}, {"isalpha", M_ISALPHA}, {"isascii", M_ISASCII},
    {"isdecimal", M_ISDECIMAL}, {"isdigit", M_ISDIGIT}, {"islower", M_ISLOWER},
    {"isnumeric", M_ISNUMERIC}, {"isspace", M_ISSPACE}, {"istitle", M_ISTITLE},
    {"isupper", M_ISUPPER}, {"join", M_JOIN}, {"ljust", M_LJUST}, {"lower", M_LOWER},
    {"lstrip", M_LSTRIP}, {"partition", M_PARTITION}, {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"replace", M_REPLACE}, {"rfind", M_RFIND},
    {"rindex", M_RINDEX}, {"rjust", M_RJUST}, {"rpartition", M_RPARTITION}, {"rsplit", M_RSPLIT},
    {"rstrip", M_RSTRIP}, {"split", M_SPLIT}, {"splitlines", M_SPLITLINES},
    {"startswith", M_STARTSWITH}, {"strip", M_STRIP}, {"swapcase", M_SWAPCASE},
    {"title", M_TITLE}, {"upper", M_UPPER}, {"zfill", M_ZFILL}, {NULL, 0},
};
static const struct mdef dict_methods[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"copy", M_DCOPY},
    {"pop", M_UNSAFE}, {"popitem", M_UNSAFE}, {"setdefault", M_UNSAFE}, {"update", M_UNSAFE},
    {"clear", M_UNSAFE}, {"fromkeys", M_UNSAFE}, {NULL, 0},
};
static const struct mdef list_methods[] = {
    {"count", M_LCOUNT}, {"index", M_LINDEX}, {"copy", M_LCOPY}, {"append", M_UNSAFE},
    {"extend", M_UNSAFE}, {"insert", M_UNSAFE}, {"pop", M_UNSAFE}, {"remove", M_UNSAFE},
    {"reverse", M_UNSAFE}, {"sort", M_UNSAFE}, {"clear", M_UNSAFE}, {NULL, 0},
};
static const struct mdef tuple_methods[] = {{"count", M_LCOUNT}, {"index", M_LINDEX}, {NULL, 0}};
static const struct mdef loop_methods[] = {{"cycle", M_CYCLE}, {"changed", M_CHANGED}, {NULL, 0}};
static const struct mdef globals[] = {
    {"range", G_RANGE}, {"dict", G_DICT}, {"namespace", G_NAMESPACE},
    {"raise_exception", G_RAISE}, {"strftime_now", G_STRFTIME},
    {"cycler", G_UNSUPPORTED_CYCLER}, {"joiner", G_UNSUPPORTED_JOINER},
    {"lipsum", G_UNSUPPORTED_LIPSUM}, {NULL, 0},
};

static const struct mdef *find_m(const struct mdef *t, const char *name, size_t len) {
    for (; t->name; t++)
        if (strlen(t->name) == len && !memcmp(t->name, name, len)) return t;
    return NULL;
}

int tmpl_method_lookup(struct rt *rt, struct tv obj, const char *name, size_t len, struct tv *out) {
    const struct mdef *t = NULL;
    switch (obj.kind) {
    case TV_STR: t = str_methods; break;
    case TV_DICT: t = dict_methods; break;
    case TV_LIST: t = obj.aux == SV_LIST ? list_methods : NULL; break;
    case TV_TUPLE: t = tuple_methods; break;
    case TV_LOOP: t = loop_methods; break;
    default: return 0;
    }
    const struct mdef *m = t ? find_m(t, name, len) : NULL;
    if (!m) return 0;
    if (m->fid == M_UNSAFE) {
        struct tv nm;
        if (!tv_new_str(rt, name, len, &nm)) return -1;
        *out = (struct tv){.kind = TV_UNDEF, .why = UND_UNSAFE, .aux = obj.kind, .u.s = nm.u.s};
        return 1;
    }
    return tv_new_func(rt, m->fid, obj, out) ? 1 : -1;
}

int tmpl_global_lookup(struct rt *rt, const char *name, size_t len, struct tv *out) {
    const struct mdef *m = find_m(globals, name, len);
    if (!m) return 0;
    return tv_new_func(rt, m->fid, tv_none(), out) ? 1 : -1;
}

/* ---------------------------------------------------------------- arguments */

static bool bindm(struct rt *rt, const char *what, struct targs *a, const char *const *names,
                  int nmax, int nreq, struct tv *vals, bool *given) {
    for (int i = 0; i < nmax; i++) {
        vals[i] = tv_undef();
        given[i] = false;
    }
    if ((int)a->n_pos > nmax)
        return rt_fail(rt, SMELT_ERR_INVALID, "%s() takes at most %d argument(s) (%zu given)", what,
                       nmax, a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) {
        vals[i] = a->pos[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        int j = 0;
        for (; j < nmax; j++)
            if (names && names[j] && !strcmp(names[j], a->kwn[k]->s)) break;
        if (j == nmax)
            return rt_fail(rt, SMELT_ERR_INVALID, "%s() got an unexpected keyword argument '%s'",
                           what, a->kwn[k]->s);
        if (given[j])
            return rt_fail(rt, SMELT_ERR_INVALID, "%s() got multiple values for argument '%s'", what,
                           names[j]);
        vals[j] = a->kwv[k];
        given[j] = true;
    }
    for (int i = 0; i < nreq; i++)
        if (!given[i])
            return rt_fail(rt, SMELT_ERR_INVALID, "%s() missing required argument", what);
    return true;
}

static bool want_str(struct rt *rt, const char *what, struct tv v) {
    if (v.kind == TV_STR) return true;
    if (v.kind == TV_UNDEF) return rt_undef_error(rt, v);
    return rt_fail(rt, SMELT_ERR_INVALID, "%s: must be str, not %s", what, tv_type_name(v));
}

static bool want_int(struct rt *rt, const char *what, struct tv v, int64_t *out) {
    if (v.kind == TV_INT) *out = v.u.i;
    else if (v.kind == TV_BOOL) *out = v.u.b;
    else if (v.kind == TV_UNDEF) return rt_undef_error(rt, v);
    else
        return rt_fail(rt, SMELT_ERR_INVALID, "%s: '%s' object cannot be interpreted as an integer",
                       what, tv_type_name(v));
    return true;
}

/* ---------------------------------------------------------------- string helpers */

static bool new_str(struct rt *rt, const char *s, size_t n, struct tv *out) {
    return tv_new_str(rt, s, n, out);
}

/* Case mappings over a string as CPython does them: mode 0 lower, 1 upper, 2 swapcase,
 * 3 title (str.title), 4 capitalize. Full mappings (ß -> SS, İ -> i̇) and the final-sigma
 * rule included. */
static uint32_t final_sigma(const uint32_t *cp, size_t n, size_t i) {
    size_t j = i;
    while (j > 0 && py_iscaseignorable(cp[j - 1])) j--;
    bool fin = j > 0 && py_iscased(cp[j - 1]);
    if (fin) {
        j = i + 1;
        while (j < n && py_iscaseignorable(cp[j])) j++;
        fin = j == n || !py_iscased(cp[j]);
    }
    return fin ? 0x3c2 : 0x3c3;
}

static bool put_cps(struct sbuf *b, const uint32_t *m, size_t n) {
    char enc[4];
    for (size_t k = 0; k < n; k++)
        if (!sb_put(b, enc, utf8_put(enc, m[k]))) return false;
    return true;
}

/* Appends the case-mapped s[0..len) to b. */
static bool case_into(struct rt *rt, struct sbuf *b, const char *s, size_t len, int mode) {
    size_t ncp = utf8_count(s, len), i = 0, k = 0;
    uint32_t *cp = rt_alloc(rt, (ncp ? ncp : 1) * sizeof *cp);
    if (!cp) return false;
    while (i < len) cp[k++] = utf8_next(s, len, &i);
    bool prev_cased = false, ok = true;
    for (size_t j = 0; ok && j < ncp; j++) {
        uint32_t c = cp[j], m[3];
        size_t nm;
        int kind; /* 0 lower, 1 upper, 2 title, -1 unchanged */
        switch (mode) {
        case 0: kind = 0; break;
        case 1: kind = 1; break;
        case 2: kind = py_isupper(c) ? 0 : py_islower(c) ? 1 : -1; break;
        case 3: kind = prev_cased ? 0 : 2; break;
        default: kind = j == 0 ? 2 : 0; break;
        }
        if (kind < 0) {
            m[0] = c;
            nm = 1;
        } else if (kind == 0 && c == 0x3a3) {
            m[0] = final_sigma(cp, ncp, j);
            nm = 1;
        } else {
            nm = py_case_full(kind, c, m);
        }
        prev_cased = py_iscased(c);
        ok = put_cps(b, m, nm);
    }
    free(cp);
    return ok;
}

static bool map_case(struct rt *rt, struct tstr *s, int mode, struct tv *out) {
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    if (!case_into(rt, &b, s->s, s->len, mode)) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

bool tmpl_case_into(struct rt *rt, struct sbuf *b, const char *s, size_t len, int mode) {
    return case_into(rt, b, s, len, mode);
}

bool tmpl_str_lower(struct rt *rt, struct tv s, struct tv *out) { return map_case(rt, s.u.s, 0, out); }

/* Byte range of s[start:end] (code point slice semantics, None = absent). */
static void cp_range(struct tstr *s, bool hs, int64_t start, bool he, int64_t end, size_t *b0, size_t *b1, bool *empty) {
    int64_t n = (int64_t)s->ncp;
    if (!hs) start = 0;
    if (!he) end = n;
    if (start < 0) start = start + n < 0 ? 0 : start + n;
    if (end < 0) end = end + n < 0 ? 0 : end + n;
    if (start > n) start = n;
    if (end > n) end = n;
    *empty = start > end;
    if (start > end) end = start;
    *b0 = tstr_offset(s, (size_t)start);
    *b1 = tstr_offset(s, (size_t)end);
}

static size_t cp_index_of(struct tstr *s, size_t byte) {
    return s->ncp == s->len ? byte : utf8_count(s->s, byte);
}

static bool slice_args(struct rt *rt, const char *what, struct tv *v, bool *g, int at, bool *hs,
                       int64_t *st, bool *he, int64_t *en) {
    *hs = g[at] && v[at].kind != TV_NONE;
    *he = g[at + 1] && v[at + 1].kind != TV_NONE;
    if (*hs && !want_int(rt, what, v[at], st)) return false;
    if (*he && !want_int(rt, what, v[at + 1], en)) return false;
    return true;
}

static const char *memrmem(const char *h, size_t hl, const char *n, size_t nl) {
    if (nl > hl) return NULL;
    for (size_t i = hl - nl + 1; i > 0; i--)
        if (!memcmp(h + i - 1, n, nl)) return h + i - 1;
    return NULL;
}

/* Is code point c in the set of chars (a string)? */
static bool in_chars(uint32_t c, struct tstr *chars) {
    size_t i = 0;
    while (i < chars->len)
        if (utf8_next(chars->s, chars->len, &i) == c) return true;
    return false;
}

static bool do_strip(struct rt *rt, struct tstr *s, struct tv chars, bool left, bool right, struct tv *out) {
    if (chars.kind != TV_NONE && chars.kind != TV_UNDEF && !want_str(rt, "strip arg", chars)) return false;
    struct tstr *cs = chars.kind == TV_STR ? chars.u.s : NULL;
    size_t b = 0, e = s->len;
    if (left) {
        while (b < e) {
            size_t j = b;
            uint32_t c = utf8_next(s->s, s->len, &j);
            if (cs ? !in_chars(c, cs) : !py_isspace(c)) break;
            b = j;
        }
    }
    if (right) {
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s->s[st] & 0xc0) == 0x80 && e - st < 4) st--;
            size_t j = st;
            uint32_t c = utf8_next(s->s, s->len, &j);
            if (j != e) {
                st = e - 1;
                c = 0xdc00 + (unsigned char)s->s[st];
            }
            if (cs ? !in_chars(c, cs) : !py_isspace(c)) break;
            e = st;
        }
    }
    return new_str(rt, s->s + b, e - b, out);
}

static bool push_str(struct rt *rt, struct tlist *l, const char *s, size_t n) {
    struct tv x;
    return new_str(rt, s, n, &x) && tlist_push(rt, l, x);
}

static bool do_split(struct rt *rt, struct tstr *s, struct tv sep, int64_t maxsplit, bool right, struct tv *out) {
    if (!tv_new_list(rt, 0, out)) return false;
    struct tlist *l = out->u.l;
    const char *p = s->s;
    size_t len = s->len;
    bool ok = true;
    if (sep.kind == TV_NONE || sep.kind == TV_UNDEF) {
        /* whitespace runs; ends ignored */
        if (!right) {
            size_t i = 0;
            while (ok) {
                while (i < len) { /* skip whitespace */
                    size_t j = i;
                    if (!py_isspace(utf8_next(p, len, &j))) break;
                    i = j;
                }
                if (i >= len) break;
                if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                    /* the remainder keeps its trailing whitespace */
                    ok = push_str(rt, l, p + i, len - i);
                    break;
                }
                size_t st = i;
                while (i < len) {
                    size_t j = i;
                    if (py_isspace(utf8_next(p, len, &j))) break;
                    i = j;
                }
                ok = push_str(rt, l, p + st, i - st);
            }
        } else {
            /* collect from the right, then reverse */
            size_t e = len;
            while (ok) {
                while (e > 0) {
                    size_t st = e - 1;
                    while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80 && e - st < 4) st--;
                    size_t j = st;
                    uint32_t c = utf8_next(p, len, &j);
                    if (j != e) st = e - 1, c = (unsigned char)p[st];
                    if (!py_isspace(c)) break;
                    e = st;
                }
                if (e == 0) break;
                if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                    ok = push_str(rt, l, p, e);
                    break;
                }
                size_t b = e;
                while (b > 0) {
                    size_t st = b - 1;
                    while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80 && b - st < 4) st--;
                    size_t j = st;
                    uint32_t c = utf8_next(p, len, &j);
                    if (j != b) st = b - 1, c = (unsigned char)p[st];
                    if (py_isspace(c)) break;
                    b = st;
                }
                ok = push_str(rt, l, p + b, e - b);
                e = b;
            }
            for (size_t i = 0; ok && i < l->n / 2; i++) {
                struct tv t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
    } else {
        if (!want_str(rt, "split separator", sep)) goto fail;
        struct tstr *sp = sep.u.s;
        if (!sp->len) {
            rt_fail(rt, SMELT_ERR_INVALID, "empty separator");
            goto fail;
        }
        if (!right) {
            size_t i = 0;
            while (ok) {
                const char *f = (maxsplit >= 0 && (int64_t)l->n >= maxsplit) ? NULL : memmem(p + i, len - i, sp->s, sp->len);
                if (!f) {
                    ok = push_str(rt, l, p + i, len - i);
                    break;
                }
                ok = push_str(rt, l, p + i, (size_t)(f - p) - i);
                i = (size_t)(f - p) + sp->len;
                if (!rt_step(rt, 1)) ok = false;
            }
        } else {
            size_t e = len;
            while (ok) {
                const char *f = (maxsplit >= 0 && (int64_t)l->n >= maxsplit) ? NULL : memrmem(p, e, sp->s, sp->len);
                if (!f) {
                    ok = push_str(rt, l, p, e);
                    break;
                }
                size_t at = (size_t)(f - p);
                ok = push_str(rt, l, p + at + sp->len, e - at - sp->len);
                e = at;
                if (!rt_step(rt, 1)) ok = false;
            }
            for (size_t i = 0; ok && i < l->n / 2; i++) {
                struct tv t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
    }
    if (!ok) goto fail;
    return true;
fail:
    tv_release(rt, *out);
    return false;
}

static bool do_replace(struct rt *rt, struct tstr *s, struct tstr *old, struct tstr *new_, int64_t count, struct tv *out) {
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    bool ok = true;
    int64_t done = 0;
    if (!old->len) {
        /* insert new before every code point and at the end, up to count times */
        size_t i = 0;
        while (ok && i <= s->len) {
            if (count < 0 || done < count) {
                ok = sb_put(&b, new_->s, new_->len);
                done++;
            }
            if (i == s->len) break;
            size_t st = i;
            utf8_next(s->s, s->len, &i);
            if (ok) ok = sb_put(&b, s->s + st, i - st);
        }
    } else {
        size_t i = 0;
        while (ok) {
            const char *f = (count >= 0 && done >= count) ? NULL : memmem(s->s + i, s->len - i, old->s, old->len);
            if (!f) {
                ok = sb_put(&b, s->s + i, s->len - i);
                break;
            }
            ok = sb_put(&b, s->s + i, (size_t)(f - s->s) - i) && sb_put(&b, new_->s, new_->len);
            i = (size_t)(f - s->s) + old->len;
            done++;
        }
    }
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool pad_to(struct sbuf *b, const char *s, size_t len, size_t ncp, int64_t width, char align,
                   uint32_t fill) {
    char enc[4];
    size_t fl = utf8_put(enc, fill);
    int64_t pad = width - (int64_t)ncp;
    if (pad <= 0) return sb_put(b, s, len);
    int64_t left = align == '<' ? 0 : align == '>' ? pad : pad / 2, right = pad - left;
    for (int64_t i = 0; i < left; i++)
        if (!sb_put(b, enc, fl)) return false;
    if (!sb_put(b, s, len)) return false;
    for (int64_t i = 0; i < right; i++)
        if (!sb_put(b, enc, fl)) return false;
    return true;
}

static bool justify(struct rt *rt, struct tstr *s, struct tv *v, bool *g, char align, struct tv *out,
                    const char *what) {
    int64_t width;
    if (!want_int(rt, what, v[0], &width)) return false;
    if (width > (int64_t)rt->lim.max_output) return rt_fail(rt, SMELT_ERR_RANGE, "%s: width too large", what);
    uint32_t fill = ' ';
    if (g[1]) {
        if (!want_str(rt, what, v[1])) return false;
        if (v[1].u.s->ncp != 1) return rt_fail(rt, SMELT_ERR_INVALID, "The fill character must be exactly one character long");
        size_t i = 0;
        fill = utf8_next(v[1].u.s->s, v[1].u.s->len, &i);
    }
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    bool ok;
    if (align == '^') {
        /* Python's center: left = marg/2 + (marg & width & 1) */
        int64_t marg = width - (int64_t)s->ncp;
        if (marg <= 0) return new_str(rt, s->s, s->len, out);
        int64_t left = marg / 2 + (marg & width & 1);
        char enc[4];
        size_t fl = utf8_put(enc, fill);
        ok = true;
        for (int64_t i = 0; ok && i < left; i++) ok = sb_put(&b, enc, fl);
        if (ok) ok = sb_put(&b, s->s, s->len);
        for (int64_t i = 0; ok && i < marg - left; i++) ok = sb_put(&b, enc, fl);
    } else {
        ok = pad_to(&b, s->s, s->len, s->ncp, width, align, fill);
    }
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

/* startswith / endswith with a str or a tuple of strs. */
static bool affix(struct rt *rt, struct tstr *s, struct tv *v, bool *g, bool end, bool *res) {
    bool hs, he;
    int64_t st = 0, en = 0;
    if (!slice_args(rt, end ? "endswith" : "startswith", v, g, 1, &hs, &st, &he, &en)) return false;
    size_t b0, b1;
    bool empty;
    cp_range(s, hs, st, he, en, &b0, &b1, &empty);
    *res = false;
    if (empty) return true;
    struct tv pre = v[0];
    size_t n = 1;
    const struct tv *cands = &pre;
    if (tv_is_seq(pre)) {
        n = pre.u.l->n;
        cands = pre.u.l->v;
    }
    for (size_t i = 0; i < n; i++) {
        if (cands[i].kind != TV_STR) {
            if (cands[i].kind == TV_UNDEF) return rt_undef_error(rt, cands[i]);
            return rt_fail(rt, SMELT_ERR_INVALID, "%s first arg must be str or a tuple of str, not %s",
                           end ? "endswith" : "startswith", tv_type_name(cands[i]));
        }
        struct tstr *x = cands[i].u.s;
        if (x->len > b1 - b0) continue;
        if (!memcmp(end ? s->s + b1 - x->len : s->s + b0, x->s, x->len)) {
            *res = true;
            return true;
        }
    }
    return true;
}


static bool str_call(struct rt *rt, uint16_t fid, struct tv self, struct targs *a, struct tv *out) {
    struct tstr *s = self.u.s;
    struct tv v[4];
    bool g[4];
    static const char *const n_strip[] = {"chars"};
    static const char *const n_split[] = {"sep", "maxsplit"};
    static const char *const n_sub[] = {"sub", "start", "end"};
    static const char *const n_just[] = {"width", "fillchar"};
    static const char *const n_repl[] = {"old", "new", "count"};
    static const char *const n_keep[] = {"keepends"};
    switch (fid) {
    case M_LOWER:
    case M_CASEFOLD:
        if (!bindm(rt, "lower", a, NULL, 0, 0, v, g)) return false;
        return map_case(rt, s, 0, out);
    case M_UPPER:
        if (!bindm(rt, "upper", a, NULL, 0, 0, v, g)) return false;
        return map_case(rt, s, 1, out);
    case M_SWAPCASE:
        if (!bindm(rt, "swapcase", a, NULL, 0, 0, v, g)) return false;
        return map_case(rt, s, 2, out);
    case M_TITLE:
        if (!bindm(rt, "title", a, NULL, 0, 0, v, g)) return false;
        return map_case(rt, s, 3, out);
    case M_CAPITALIZE:
        if (!bindm(rt, "capitalize", a, NULL, 0, 0, v, g)) return false;
        return map_case(rt, s, 4, out);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (!bindm(rt, "strip", a, n_strip, 1, 0, v, g)) return false;
        return do_strip(rt, s, v[0], fid != M_RSTRIP, fid != M_LSTRIP, out);
    case M_SPLIT:
    case M_RSPLIT: {
        if (!bindm(rt, "split", a, n_split, 2, 0, v, g)) return false;
        int64_t maxsplit = -1;
        if (g[1] && !want_int(rt, "split", v[1], &maxsplit)) return false;
        return do_split(rt, s, v[0], maxsplit, fid == M_RSPLIT, out);
    }
    case M_SPLITLINES:
        if (!bindm(rt, "splitlines", a, n_keep, 1, 0, v, g)) return false;
        return tmpl_splitlines(rt, s->s, s->len, g[0] && tv_truthy(v[0]), out);
    case M_REPLACE: {
        if (!bindm(rt, "replace", a, n_repl, 3, 2, v, g)) return false;
        if (!want_str(rt, "replace", v[0]) || !want_str(rt, "replace", v[1])) return false;
        int64_t count = -1;
        if (g[2] && !want_int(rt, "replace", v[2], &count)) return false;
        return do_replace(rt, s, v[0].u.s, v[1].u.s, count, out);
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (!bindm(rt, fid == M_STARTSWITH ? "startswith" : "endswith", a, NULL, 3, 1, v, g)) return false;
        bool r;
        if (!affix(rt, s, v, g, fid == M_ENDSWITH, &r)) return false;
        *out = tv_bool(r);
        return true;
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX:
    case M_COUNT: {
        if (!bindm(rt, "find", a, n_sub, 3, 1, v, g)) return false;
        if (!want_str(rt, "find", v[0])) return false;
        bool hs, he, empty;
        int64_t st = 0, en = 0;
        if (!slice_args(rt, "find", v, g, 1, &hs, &st, &he, &en)) return false;
        size_t b0, b1;
        cp_range(s, hs, st, he, en, &b0, &b1, &empty);
        struct tstr *sub = v[0].u.s;
        if (fid == M_COUNT) {
            int64_t c = 0;
            if (empty) c = 0;
            else if (!sub->len) c = (int64_t)utf8_count(s->s + b0, b1 - b0) + 1;
            else
                for (size_t i = b0; i + sub->len <= b1;) {
                    const char *f = memmem(s->s + i, b1 - i, sub->s, sub->len);
                    if (!f) break;
                    c++;
                    i = (size_t)(f - s->s) + sub->len;
                }
            *out = tv_int(c);
            return true;
        }
        const char *f = NULL;
        if (!empty) f = (fid == M_FIND || fid == M_INDEX) ? memmem(s->s + b0, b1 - b0, sub->s, sub->len)
                                                         : memrmem(s->s + b0, b1 - b0, sub->s, sub->len);
        if (!empty && !sub->len) f = (fid == M_FIND || fid == M_INDEX) ? s->s + b0 : s->s + b1;
        if (!f) {
            if (fid == M_INDEX || fid == M_RINDEX) return rt_fail(rt, SMELT_ERR_INVALID, "substring not found");
            *out = tv_int(-1);
            return true;
        }
        *out = tv_int((int64_t)cp_index_of(s, (size_t)(f - s->s)));
        return true;
    }
    case M_CENTER:
    case M_LJUST:
    case M_RJUST:
        if (!bindm(rt, "center", a, n_just, 2, 1, v, g)) return false;
        return justify(rt, s, v, g, fid == M_CENTER ? '^' : fid == M_LJUST ? '<' : '>', out, "center");
    case M_ZFILL: {
        if (!bindm(rt, "zfill", a, NULL, 1, 1, v, g)) return false;
        int64_t width;
        if (!want_int(rt, "zfill", v[0], &width)) return false;
        if (width > (int64_t)rt->lim.max_output) return rt_fail(rt, SMELT_ERR_RANGE, "zfill: width too large");
        struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
        int64_t pad = width - (int64_t)s->ncp;
        size_t sign = s->len && (s->s[0] == '+' || s->s[0] == '-') ? 1 : 0;
        bool ok = sb_put(&b, s->s, sign);
        for (int64_t i = 0; ok && i < pad; i++) ok = sb_putc(&b, '0');
        if (ok) ok = sb_put(&b, s->s + sign, s->len - sign);
        if (!ok) {
            sb_free(&b);
            return false;
        }
        return sb_to_tv(&b, out);
    }
    case M_JOIN: {
        if (!bindm(rt, "join", a, NULL, 1, 1, v, g)) return false;
        struct tlist *l;
        if (!tmpl_iter_list(rt, v[0], &l)) return false;
        struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
        bool ok = true;
        for (size_t i = 0; ok && i < l->n; i++) {
            if (l->v[i].kind != TV_STR) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "sequence item %zu: expected str instance, %s found", i,
                             tv_type_name(l->v[i]));
                break;
            }
            if (i) ok = sb_put(&b, s->s, s->len);
            if (ok) ok = sb_put(&b, l->v[i].u.s->s, l->v[i].u.s->len);
        }
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
        if (!ok) {
            sb_free(&b);
            return false;
        }
        return sb_to_tv(&b, out);
    }
    case M_PARTITION:
    case M_RPARTITION: {
        if (!bindm(rt, "partition", a, NULL, 1, 1, v, g)) return false;
        if (!want_str(rt, "partition", v[0])) return false;
        struct tstr *sep = v[0].u.s;
        if (!sep->len) return rt_fail(rt, SMELT_ERR_INVALID, "empty separator");
        const char *f = fid == M_PARTITION ? memmem(s->s, s->len, sep->s, sep->len) : memrmem(s->s, s->len, sep->s, sep->len);
        if (!tv_new_list(rt, 3, out)) return false;
        out->kind = TV_TUPLE;
        struct tlist *l = out->u.l;
        bool ok;
        if (!f) {
            if (fid == M_PARTITION)
                ok = push_str(rt, l, s->s, s->len) && push_str(rt, l, "", 0) && push_str(rt, l, "", 0);
            else
                ok = push_str(rt, l, "", 0) && push_str(rt, l, "", 0) && push_str(rt, l, s->s, s->len);
        } else {
            size_t at = (size_t)(f - s->s);
            ok = push_str(rt, l, s->s, at) && push_str(rt, l, sep->s, sep->len) &&
                 push_str(rt, l, s->s + at + sep->len, s->len - at - sep->len);
        }
        if (!ok) tv_release(rt, *out);
        return ok;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        if (!bindm(rt, "removeprefix", a, NULL, 1, 1, v, g)) return false;
        if (!want_str(rt, "removeprefix", v[0])) return false;
        struct tstr *x = v[0].u.s;
        if (x->len <= s->len) {
            if (fid == M_REMOVEPREFIX && !memcmp(s->s, x->s, x->len)) return new_str(rt, s->s + x->len, s->len - x->len, out);
            if (fid == M_REMOVESUFFIX && x->len && !memcmp(s->s + s->len - x->len, x->s, x->len))
                return new_str(rt, s->s, s->len - x->len, out);
        }
        *out = tv_retain(self);
        out->safe = 0;
        return true;
    }
    case M_FORMAT: return tmpl_str_format(rt, s, a, out);
    default: break;
    }
    /* is* predicates */
    if (!bindm(rt, "is", a, NULL, 0, 0, v, g)) return false;
    *out = tv_bool(tmpl_str_is(fid == M_ISLOWER ? 'l' : fid == M_ISUPPER ? 'u' : fid == M_ISTITLE ? 't'
                               : fid == M_ISASCII ? 'A' : fid == M_ISALNUM ? 'n' : fid == M_ISALPHA ? 'a'
                               : fid == M_ISDECIMAL ? 'd' : fid == M_ISDIGIT ? 'D' : fid == M_ISNUMERIC ? 'N' : 's',
                               s->s, s->len));
    return true;
}

/* Python's str.is*() on s: l lower, u upper, t title, A ascii, n alnum, a alpha,
 * d decimal, D digit, N numeric, s space. */
bool tmpl_str_is(char what, const char *s, size_t len) {
    size_t i = 0;
    bool any = false, cased = false, prev_cased = false;
    while (i < len) {
        uint32_t c = utf8_next(s, len, &i);
        any = true;
        bool lo = py_islower(c), up = py_isupper(c), ti = py_iscased(c) && !lo && !up;
        switch (what) {
        case 'l':
            if (up || ti) return false;
            if (lo) cased = true;
            break;
        case 'u':
            if (lo || ti) return false;
            if (up) cased = true;
            break;
        case 't':
            if (up || ti) {
                if (prev_cased) return false;
                prev_cased = cased = true;
            } else if (lo) {
                if (!prev_cased) return false;
                prev_cased = cased = true;
            } else {
                prev_cased = false;
            }
            break;
        case 'A':
            if (c >= 0x80) return false;
            break;
        case 'n':
            if (!(py_isalpha(c) || py_isdecimal(c) || py_isdigit(c) || py_isnumeric(c))) return false;
            break;
        case 'a':
            if (!py_isalpha(c)) return false;
            break;
        case 'd':
            if (!py_isdecimal(c)) return false;
            break;
        case 'D':
            if (!py_isdigit(c)) return false;
            break;
        case 'N':
            if (!py_isnumeric(c)) return false;
            break;
        default:
            if (!py_isspace(c)) return false;
        }
    }
    if (what == 'l' || what == 'u' || what == 't') return cased;
    if (what == 'A') return true;
    return any;
}

bool tmpl_str_method(struct rt *rt, const char *name, struct tv self, struct targs *a, struct tv *out) {
    const struct mdef *m = find_m(str_methods, name, strlen(name));
    if (!m) return rt_fail(rt, SMELT_ERR_INTERNAL, "no str method %s", name);
    return str_call(rt, m->fid, self, a, out);
}

/* ---------------------------------------------------------------- globals */

static bool dict_from_args(struct rt *rt, const char *what, struct targs *a, struct tv *out) {
    if (a->n_pos > 1) return rt_fail(rt, SMELT_ERR_INVALID, "%s expected at most 1 argument, got %zu", what, a->n_pos);
    if (a->n_pos == 1) {
        struct tv src = a->pos[0];
        if (src.kind == TV_DICT || src.kind == TV_NS) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (!tdict_set(rt, out->u.d, src.u.d->k[i], src.u.d->v[i])) return false;
        } else {
            struct tlist *l;
            if (!tmpl_iter_list(rt, src, &l)) return false;
            bool ok = true;
            for (size_t i = 0; ok && i < l->n; i++) {
                struct tv p = l->v[i];
                if (!tv_is_seq(p) || p.u.l->n != 2) {
                    ok = rt_fail(rt, SMELT_ERR_INVALID, "%s: sequence element #%zu is not a pair", what, i);
                    break;
                }
                ok = tdict_set(rt, out->u.d, p.u.l->v[0], p.u.l->v[1]);
            }
            tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
            if (!ok) return false;
        }
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if (!tdict_set(rt, out->u.d, (struct tv){.kind = TV_STR, .u.s = a->kwn[k]}, a->kwv[k])) return false;
    return true;
}

static bool g_range(struct rt *rt, struct targs *a, struct tv *out) {
    if (a->n_kw) return rt_fail(rt, SMELT_ERR_INVALID, "range() takes no keyword arguments");
    if (a->n_pos < 1 || a->n_pos > 3)
        return rt_fail(rt, SMELT_ERR_INVALID, "range expected 1 to 3 arguments, got %zu", a->n_pos);
    int64_t x[3];
    for (size_t i = 0; i < a->n_pos; i++)
        if (!want_int(rt, "range", a->pos[i], &x[i])) return false;
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) stop = x[0];
    else {
        start = x[0];
        stop = x[1];
        if (a->n_pos == 3) step = x[2];
    }
    if (step == 0) return rt_fail(rt, SMELT_ERR_INVALID, "range() arg 3 must not be zero");
    /* the sandbox's MAX_RANGE */
    double n = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                        : ceil(((double)start - (double)stop) / (double)-step);
    if (n < 0) n = 0;
    if (n > 100000)
        return rt_fail(rt, SMELT_ERR_RANGE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    if (!tv_new_list(rt, (size_t)n, out)) return false;
    for (size_t i = 0; i < (size_t)n; i++) out->u.l->v[out->u.l->n++] = tv_int(start + (int64_t)i * step);
    return true;
}

static bool g_strftime(struct rt *rt, struct targs *a, struct tv *out) {
    if (a->n_kw || a->n_pos != 1 || a->pos[0].kind != TV_STR)
        return rt_fail(rt, SMELT_ERR_INVALID, "strftime_now() takes one format string");
    time_t now = rt->has_now ? (time_t)rt->now : time(NULL);
    struct tm tm;
    if (rt->has_now) gmtime_r(&now, &tm);
    else localtime_r(&now, &tm);
    const char *fmt = a->pos[0].u.s->s;
    if (a->pos[0].u.s->len > 512) return rt_fail(rt, SMELT_ERR_RANGE, "strftime_now: format too long");
    if (!a->pos[0].u.s->len) return tv_new_str(rt, "", 0, out);
    char buf[4096];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(buf, sizeof buf, fmt, &tm); /* the template's own format */
#pragma GCC diagnostic pop
    if (!n) return rt_fail(rt, SMELT_ERR_INVALID, "strftime_now: cannot format '%s'", fmt);
    return tv_new_str(rt, buf, n, out);
}

static bool call_global(struct rt *rt, uint16_t fid, struct targs *a, struct tv *out) {
    switch (fid) {
    case G_RANGE: return g_range(rt, a, out);
    case G_DICT:
        if (!tv_new_dict(rt, out)) return false;
        if (!dict_from_args(rt, "dict", a, out)) {
            tv_release(rt, *out);
            return false;
        }
        return true;
    case G_NAMESPACE:
        if (!tv_new_ns(rt, out)) return false;
        if (!dict_from_args(rt, "namespace", a, out)) {
            tv_release(rt, *out);
            return false;
        }
        return true;
    case G_RAISE: {
        struct sbuf b = {.rt = rt, .limit = 4096};
        if (a->n_pos >= 1) tv_str(rt, &b, a->pos[0]);
        rt_fail(rt, SMELT_ERR_INVALID, "raise_exception: %s", b.p ? b.p : "");
        sb_free(&b);
        return false;
    }
    case G_STRFTIME: return g_strftime(rt, a, out);
    case G_UNSUPPORTED_CYCLER: return rt_fail(rt, SMELT_ERR_UNSUPPORTED, "unsupported global 'cycler'");
    case G_UNSUPPORTED_JOINER: return rt_fail(rt, SMELT_ERR_UNSUPPORTED, "unsupported global 'joiner'");
    case G_UNSUPPORTED_LIPSUM: return rt_fail(rt, SMELT_ERR_UNSUPPORTED, "unsupported global 'lipsum'");
    }
    return rt_fail(rt, SMELT_ERR_INTERNAL, "unknown global");
}

/* ---------------------------------------------------------------- dispatch */

bool tmpl_call_builtin(struct rt *rt, struct tfunc *f, struct targs *a, struct tv *out) {
    if (!rt_step(rt, 1)) return false;
    struct tv self = f->self, v[3];
    bool g[3];
    static const char *const n_get[] = {"key", "default"};
    if (f->fid >= G_RANGE && f->fid < M_UNSAFE) return call_global(rt, f->fid, a, out);
    if (self.kind == TV_STR) return str_call(rt, f->fid, self, a, out);
    switch (f->fid) {
    case M_GET: {
        if (!bindm(rt, "get", a, n_get, 2, 1, v, g)) return false;
        struct tv *x = tdict_get(self.u.d, v[0]);
        *out = x ? tv_retain(*x) : g[1] ? tv_retain(v[1]) : tv_none();
        return true;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES:
        if (!bindm(rt, "items", a, NULL, 0, 0, v, g)) return false;
        if (f->fid == M_ITEMS) {
            if (!tmpl_dict_items(rt, self.u.d, out)) return false;
            out->aux = SV_ITEMS;
            return true;
        }
        if (!tv_new_list(rt, self.u.d->n, out)) return false;
        for (size_t i = 0; i < self.u.d->n; i++)
            out->u.l->v[out->u.l->n++] = tv_retain(f->fid == M_KEYS ? self.u.d->k[i] : self.u.d->v[i]);
        out->aux = f->fid == M_KEYS ? SV_KEYS : SV_VALUES;
        return true;
    case M_DCOPY:
        if (!bindm(rt, "copy", a, NULL, 0, 0, v, g) || !tv_new_dict(rt, out)) return false;
        for (size_t i = 0; i < self.u.d->n; i++)
            if (!tdict_set(rt, out->u.d, self.u.d->k[i], self.u.d->v[i])) {
                tv_release(rt, *out);
                return false;
            }
        return true;
    case M_LCOPY:
        if (!bindm(rt, "copy", a, NULL, 0, 0, v, g) || !tv_new_list(rt, self.u.l->n, out)) return false;
        for (size_t i = 0; i < self.u.l->n; i++) out->u.l->v[out->u.l->n++] = tv_retain(self.u.l->v[i]);
        return true;
    case M_LCOUNT: {
        if (!bindm(rt, "count", a, NULL, 1, 1, v, g)) return false;
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++) c += tv_eq(self.u.l->v[i], v[0]);
        *out = tv_int(c);
        return true;
    }
    case M_LINDEX: {
        if (!bindm(rt, "index", a, NULL, 3, 1, v, g)) return false;
        int64_t n = (int64_t)self.u.l->n, st = 0, en = n;
        if (g[1] && !want_int(rt, "index", v[1], &st)) return false;
        if (g[2] && !want_int(rt, "index", v[2], &en)) return false;
        if (st < 0) st = st + n < 0 ? 0 : st + n;
        if (en < 0) en = en + n < 0 ? 0 : en + n;
        if (en > n) en = n;
        for (int64_t i = st; i < en; i++)
            if (tv_eq(self.u.l->v[i], v[0])) {
                *out = tv_int(i);
                return true;
            }
        return rt_fail(rt, SMELT_ERR_INVALID, "value is not in list");
    }
    case M_CYCLE: {
        struct tloop *lp = self.u.lp;
        if (!a->n_pos) return rt_fail(rt, SMELT_ERR_INVALID, "no items for cycling given");
        *out = tv_retain(a->pos[lp->i % a->n_pos]);
        return true;
    }
    case M_CHANGED: {
        struct tloop *lp = self.u.lp;
        struct tv t;
        if (!tv_new_list(rt, a->n_pos, &t)) return false;
        t.kind = TV_TUPLE;
        for (size_t i = 0; i < a->n_pos; i++) t.u.l->v[t.u.l->n++] = tv_retain(a->pos[i]);
        bool changed = !lp->has_changed || !tv_eq(lp->changed_last, t);
        if (changed) {
            tv_release(rt, lp->changed_last);
            lp->changed_last = t;
            lp->has_changed = true;
        } else {
            tv_release(rt, t);
        }
        *out = tv_bool(changed);
        return true;
    }
    }
    return rt_fail(rt, SMELT_ERR_INTERNAL, "unknown builtin method");
}

/* ---------------------------------------------------------------- formatting */

struct spec {
    uint32_t fill;
    char align; /* 0 default, < > ^ = */
    char sign;  /* 0, + - ' ' */
    bool alt, zero, has_prec;
    int64_t width, prec;
    char grouping; /* 0 , _ */
    char type;     /* 0 or the type char */
};

static bool parse_spec(struct rt *rt, const char *s, size_t n, struct spec *sp) {
    memset(sp, 0, sizeof *sp);
    sp->fill = ' ';
    sp->prec = -1;
    size_t i = 0;
    /* [[fill]align] */
    if (n) {
        size_t j = 0;
        uint32_t c = utf8_next(s, n, &j);
        if (j < n && (s[j] == '<' || s[j] == '>' || s[j] == '^' || s[j] == '=')) {
            sp->fill = c;
            sp->align = s[j];
            i = j + 1;
        } else if (s[0] == '<' || s[0] == '>' || s[0] == '^' || s[0] == '=') {
            sp->align = s[0];
            i = 1;
        }
    }
    if (i < n && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp->sign = s[i++];
    if (i < n && s[i] == '#') sp->alt = true, i++;
    if (i < n && s[i] == '0') sp->zero = true, i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        sp->width = sp->width * 10 + (s[i++] - '0');
        if (sp->width > 1 << 24) return rt_fail(rt, SMELT_ERR_RANGE, "format width too large");
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) sp->grouping = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        sp->has_prec = true;
        sp->prec = 0;
        if (i >= n || s[i] < '0' || s[i] > '9') return rt_fail(rt, SMELT_ERR_INVALID, "Format specifier missing precision");
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            sp->prec = sp->prec * 10 + (s[i++] - '0');
            if (sp->prec > 1000) return rt_fail(rt, SMELT_ERR_RANGE, "format precision too large");
        }
    }
    if (i < n) sp->type = s[i++];
    if (i < n) return rt_fail(rt, SMELT_ERR_INVALID, "Invalid format specifier '%.*s'", (int)n, s);
    return true;
}

/* Appends body (with an optional sign/prefix) padded per spec; numbers align right. */
static bool emit_padded(struct sbuf *b, const struct spec *sp, const char *prefix, const char *body,
                        size_t blen, bool numeric) {
    size_t plen = strlen(prefix), ncp = utf8_count(body, blen) + plen;
    char align = sp->align ? sp->align : numeric ? '>' : '<';
    uint32_t fill = sp->fill;
    if (sp->zero && !sp->align && numeric) {
        align = '=';
        fill = '0';
    }
    int64_t pad = sp->width - (int64_t)ncp;
    if (pad <= 0) return sb_puts(b, prefix) && sb_put(b, body, blen);
    char enc[4];
    size_t fl = utf8_put(enc, fill);
    int64_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad, right = pad - left;
    if (align == '=') {
        if (!sb_puts(b, prefix)) return false;
        for (int64_t i = 0; i < pad; i++)
            if (!sb_put(b, enc, fl)) return false;
        return sb_put(b, body, blen);
    }
    for (int64_t i = 0; i < left; i++)
        if (!sb_put(b, enc, fl)) return false;
    if (!sb_puts(b, prefix) || !sb_put(b, body, blen)) return false;
    for (int64_t i = 0; i < right; i++)
        if (!sb_put(b, enc, fl)) return false;
    return true;
}

static void group_digits(const char *in, char sep, char *out, size_t cap) {
    /* in: digits (possibly followed by .fraction / exponent) */
    size_t nd = 0;
    while (in[nd] >= '0' && in[nd] <= '9') nd++;
    size_t o = 0;
    for (size_t i = 0; i < nd && o + 2 < cap; i++) {
        out[o++] = in[i];
        size_t rem = nd - i - 1;
        if (rem && rem % 3 == 0) out[o++] = sep;
    }
    snprintf(out + o, cap - o, "%s", in + nd);
}

static bool format_number(struct rt *rt, struct sbuf *b, struct tv v, const struct spec *sp) {
    char body[1200], tmp[1200];
    const char *sign = "";
    bool neg;
    char type = sp->type;
    if (v.kind != TV_FLOAT && (type == 0 || type == 'd' || type == 'n' || type == 'x' || type == 'X' ||
                               type == 'o' || type == 'b' || type == 'c')) {
        int64_t x = v.kind == TV_INT ? v.u.i : v.u.b;
        if (sp->has_prec) return rt_fail(rt, SMELT_ERR_INVALID, "Precision not allowed in integer format specifier");
        if (type == 'c') {
            if (x < 0 || x > 0x10ffff) return rt_fail(rt, SMELT_ERR_INVALID, "%%c arg not in range(0x110000)");
            char enc[4];
            size_t n = utf8_put(enc, (uint32_t)x);
            return emit_padded(b, sp, "", enc, n, false);
        }
        neg = x < 0;
        uint64_t u = neg ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        const char *pre = "";
        if (type == 'x' || type == 'X' || type == 'o' || type == 'b') {
            int base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
            char digs[80];
            int k = 0;
            do {
                int d = (int)(u % (uint64_t)base);
                digs[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
                u /= (uint64_t)base;
            } while (u);
            for (int i = 0; i < k; i++) body[i] = digs[k - 1 - i];
            body[k] = 0;
            if (sp->alt) pre = type == 'x' ? "0x" : type == 'X' ? "0X" : type == 'o' ? "0o" : "0b";
        } else {
            snprintf(tmp, sizeof tmp, "%" PRIu64, u);
            if (sp->grouping) group_digits(tmp, sp->grouping, body, sizeof body);
            else snprintf(body, sizeof body, "%s", tmp);
        }
        sign = neg ? "-" : sp->sign == '+' ? "+" : sp->sign == ' ' ? " " : "";
        char prefix[8];
        snprintf(prefix, sizeof prefix, "%s%s", sign, pre);
        return emit_padded(b, sp, prefix, body, strlen(body), true);
    }
    double x = v.kind == TV_FLOAT ? v.u.f : (double)(v.kind == TV_INT ? v.u.i : v.u.b);
    neg = signbit(x) && !isnan(x);
    double ax = fabs(x);
    int prec = sp->has_prec ? (int)sp->prec : 6;
    if (isinf(ax) || isnan(ax)) {
        bool up = type == 'F' || type == 'E' || type == 'G';
        snprintf(body, sizeof body, "%s", isnan(ax) ? (up ? "NAN" : "nan") : (up ? "INF" : "inf"));
    } else if (type == 'f' || type == 'F') snprintf(tmp, sizeof tmp, sp->alt ? "%#.*f" : "%.*f", prec, ax);
    else if (type == 'e' || type == 'E') snprintf(tmp, sizeof tmp, sp->alt ? "%#.*e" : "%.*e", prec, ax);
    else if (type == 'g' || type == 'G') snprintf(tmp, sizeof tmp, sp->alt ? "%#.*g" : "%.*g", prec ? prec : 1, ax);
    else if (type == '%') snprintf(tmp, sizeof tmp, "%.*f%%", prec, ax * 100);
    else if (type == 0 || type == 'n') {
        if (!sp->has_prec) py_float_repr(ax, tmp, sizeof tmp);
        else {
            snprintf(tmp, sizeof tmp, "%.*g", prec ? prec : 1, ax);
            if (!strpbrk(tmp, ".e") ) strncat(tmp, ".0", sizeof tmp - strlen(tmp) - 1);
        }
    } else {
        return rt_fail(rt, SMELT_ERR_INVALID, "Unknown format code '%c' for object of type '%s'", type, tv_type_name(v));
    }
    if (!(isinf(ax) || isnan(ax))) {
        if (type == 'E' || type == 'G' || type == 'F')
            for (char *p = tmp; *p; p++)
                if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 32);
        if (sp->grouping) group_digits(tmp, sp->grouping, body, sizeof body);
        else snprintf(body, sizeof body, "%s", tmp);
    }
    sign = neg ? "-" : sp->sign == '+' ? "+" : sp->sign == ' ' ? " " : "";
    return emit_padded(b, sp, sign, body, strlen(body), true);
}

/* format(v, spec) as Python's __format__. */
static bool format_value(struct rt *rt, struct sbuf *b, struct tv v, const char *spec, size_t slen) {
    struct spec sp;
    if (!parse_spec(rt, spec, slen, &sp)) return false;
    if (v.kind == TV_UNDEF && !slen) return true;
    if (v.kind == TV_INT || v.kind == TV_FLOAT || (v.kind == TV_BOOL && sp.type)) return format_number(rt, b, v, &sp);
    if (v.kind == TV_STR || !slen || (sp.type == 0 || sp.type == 's')) {
        if (v.kind != TV_STR && slen) {
            if (v.kind != TV_BOOL)
                return rt_fail(rt, SMELT_ERR_INVALID, "unsupported format string passed to %s.__format__", tv_type_name(v));
        }
        if (sp.type && sp.type != 's')
            return rt_fail(rt, SMELT_ERR_INVALID, "Unknown format code '%c' for object of type 'str'", sp.type);
        struct tv s;
        if (!tv_to_str(rt, v, &s)) return false;
        size_t len = s.u.s->len;
        if (sp.has_prec && (size_t)sp.prec < s.u.s->ncp) len = tstr_offset(s.u.s, (size_t)sp.prec);
        bool ok = emit_padded(b, &sp, "", s.u.s->s, len, false);
        tv_release(rt, s);
        return ok;
    }
    return rt_fail(rt, SMELT_ERR_INVALID, "unsupported format string passed to %s.__format__", tv_type_name(v));
}

bool tmpl_str_format(struct rt *rt, struct tstr *fmt, struct targs *a, struct tv *out) {
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    const char *s = fmt->s;
    size_t n = fmt->len, i = 0, auto_idx = 0;
    bool ok = true, manual = false, automatic = false;
    while (ok && i < n) {
        char c = s[i];
        if (c == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                ok = sb_putc(&b, '}');
                i += 2;
                continue;
            }
            ok = rt_fail(rt, SMELT_ERR_INVALID, "Single '}' encountered in format string");
            break;
        }
        if (c != '{') {
            ok = sb_putc(&b, c);
            i++;
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            ok = sb_putc(&b, '{');
            i += 2;
            continue;
        }
        /* field: {name[.attr|[key]]...[!conv][:spec]} */
        size_t j = i + 1, depth = 1;
        while (j < n && depth) {
            if (s[j] == '{') depth++;
            else if (s[j] == '}') depth--;
            if (depth) j++;
        }
        if (j >= n) {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "expected '}' before end of string");
            break;
        }
        const char *f = s + i + 1;
        size_t flen = j - i - 1, nl = 0;
        while (nl < flen && f[nl] != '.' && f[nl] != '[' && f[nl] != '!' && f[nl] != ':') nl++;
        struct tv val;
        if (nl == 0) {
            if (manual) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "cannot switch from manual field specification to automatic field numbering");
                break;
            }
            automatic = true;
            if (auto_idx >= a->n_pos) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "Replacement index %zu out of range for positional args tuple", auto_idx);
                break;
            }
            val = tv_retain(a->pos[auto_idx++]);
        } else if (f[0] >= '0' && f[0] <= '9') {
            if (automatic) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "cannot switch from automatic field numbering to manual field specification");
                break;
            }
            manual = true;
            size_t idx = 0;
            for (size_t k = 0; k < nl && idx < 1u << 20; k++) idx = idx * 10 + (size_t)(f[k] - '0');
            if (idx >= a->n_pos) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "Replacement index %zu out of range for positional args tuple", idx);
                break;
            }
            val = tv_retain(a->pos[idx]);
        } else {
            size_t k = 0;
            for (; k < a->n_kw; k++)
                if (a->kwn[k]->len == nl && !memcmp(a->kwn[k]->s, f, nl)) break;
            if (k == a->n_kw) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "KeyError: '%.*s'", (int)nl, f);
                break;
            }
            val = tv_retain(a->kwv[k]);
        }
        size_t p = nl;
        while (ok && p < flen && (f[p] == '.' || f[p] == '[')) {
            struct tv key, nv;
            bool have_key; /* released whether the lookup succeeds or not */
            if (f[p] == '.') {
                size_t q = p + 1;
                while (q < flen && f[q] != '.' && f[q] != '[' && f[q] != '!' && f[q] != ':') q++;
                ok = have_key = tv_new_str(rt, f + p + 1, q - p - 1, &key);
                if (ok) ok = tmpl_getattr(rt, val, key.u.s, &nv);
                p = q;
            } else {
                size_t q = p + 1;
                while (q < flen && f[q] != ']') q++;
                bool digits = q > p + 1;
                for (size_t r = p + 1; r < q; r++)
                    if (f[r] < '0' || f[r] > '9') digits = false;
                if (digits) {
                    int64_t x = 0;
                    for (size_t r = p + 1; r < q && x < 1 << 30; r++) x = x * 10 + (f[r] - '0');
                    key = tv_int(x);
                    have_key = true;
                } else {
                    ok = have_key = tv_new_str(rt, f + p + 1, q - p - 1, &key);
                }
                if (ok) ok = tmpl_getitem(rt, val, key, &nv);
                p = q + 1;
            }
            if (have_key) tv_release(rt, key);
            if (ok) {
                tv_release(rt, val);
                val = nv;
            }
        }
        char conv = 0;
        if (ok && p < flen && f[p] == '!') {
            conv = p + 1 < flen ? f[p + 1] : 0;
            p += 2;
        }
        const char *spec = "";
        size_t speclen = 0;
        if (ok && p < flen && f[p] == ':') {
            spec = f + p + 1;
            speclen = flen - p - 1;
        }
        if (ok) {
            if (conv == 'r' || conv == 'a' || conv == 's') {
                struct sbuf tb = {.rt = rt, .limit = rt->lim.max_output};
                struct tv sv;
                ok = (conv == 's' ? tv_str(rt, &tb, val) : tv_repr(rt, &tb, val)) && sb_to_tv(&tb, &sv);
                if (!ok) sb_free(&tb);
                else {
                    tv_release(rt, val);
                    val = sv;
                }
            } else if (conv) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "Unknown conversion specifier %c", conv);
            }
        }
        if (ok) ok = format_value(rt, &b, val, spec, speclen);
        tv_release(rt, val);
        i = j + 1;
    }
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

/* Python printf-style formatting: fmt % args. */
bool tmpl_percent_format(struct rt *rt, struct tv fmt, struct tv args, struct tv *out) {
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    const char *s = fmt.u.s->s;
    size_t n = fmt.u.s->len, i = 0, argi = 0;
    const struct tv *av = &args;
    size_t an = 1;
    /* Python treats any non-tuple, non-str object with __getitem__ as a mapping here:
     * unused, it raises no "not all arguments converted" */
    bool is_tuple = args.kind == TV_TUPLE, ok = true;
    bool is_map = args.kind == TV_DICT, mapping_like = is_map || args.kind == TV_UNDEF || (args.kind == TV_LIST && !args.aux);
    if (is_tuple) {
        av = args.u.l->v;
        an = args.u.l->n;
    }
    while (ok && i < n) {
        if (s[i] != '%') {
            const char *pc = memchr(s + i, '%', n - i);
            size_t e = pc ? (size_t)(pc - s) : n;
            ok = sb_put(&b, s + i, e - i);
            i = e;
            continue;
        }
        i++;
        if (i >= n) {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "incomplete format");
            break;
        }
        struct tv val = tv_undef();
        bool have_val = false;
        if (s[i] == '(') {
            size_t q = i + 1, depth = 1;
            while (q < n && depth) {
                if (s[q] == '(') depth++;
                else if (s[q] == ')') depth--;
                if (depth) q++;
            }
            if (q >= n) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "incomplete format key");
                break;
            }
            if (!is_map) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "format requires a mapping");
                break;
            }
            struct tv *x = tdict_get_str(args.u.d, s + i + 1, q - i - 1);
            if (!x) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "KeyError: '%.*s'", (int)(q - i - 1), s + i + 1);
                break;
            }
            val = *x;
            have_val = true;
            i = q + 1;
        }
        struct spec sp;
        memset(&sp, 0, sizeof sp);
        sp.fill = ' ';
        bool left = false;
        while (i < n && strchr("-+ #0", s[i])) {
            if (s[i] == '-') left = true;
            else if (s[i] == '+') sp.sign = '+';
            else if (s[i] == ' ' && sp.sign != '+') sp.sign = ' ';
            else if (s[i] == '#') sp.alt = true;
            else if (s[i] == '0') sp.zero = true;
            i++;
        }
        if (i < n && s[i] == '*') {
            i++;
            if (argi >= an || !is_tuple) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "* wants int");
                break;
            }
            int64_t w;
            if (!(ok = want_int(rt, "%*", av[argi++], &w))) break;
            if (w < 0) left = true, w = -w;
            sp.width = w;
        } else {
            while (i < n && s[i] >= '0' && s[i] <= '9' && sp.width < 1 << 24) sp.width = sp.width * 10 + (s[i++] - '0');
        }
        if (i < n && s[i] == '.') {
            i++;
            sp.has_prec = true;
            sp.prec = 0;
            if (i < n && s[i] == '*') {
                i++;
                if (argi >= an || !is_tuple) {
                    ok = rt_fail(rt, SMELT_ERR_INVALID, "* wants int");
                    break;
                }
                if (!(ok = want_int(rt, "%.*", av[argi++], &sp.prec))) break;
            } else {
                while (i < n && s[i] >= '0' && s[i] <= '9' && sp.prec < 1000) sp.prec = sp.prec * 10 + (s[i++] - '0');
            }
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "incomplete format");
            break;
        }
        char t = s[i++];
        if (t == '%') {
            ok = sb_putc(&b, '%');
            continue;
        }
        if (!have_val) {
            if (argi >= an) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "not enough arguments for format string");
                break;
            }
            val = av[argi++];
        }
        sp.align = left ? '<' : '>';
        if (sp.zero && !left) sp.align = 0;
        switch (t) {
        case 's':
        case 'r':
        case 'a': {
            struct sbuf tb = {.rt = rt, .limit = rt->lim.max_output};
            ok = t == 's' ? tv_str(rt, &tb, val) : tv_repr(rt, &tb, val);
            if (ok) {
                size_t len = tb.n;
                if (sp.has_prec) {
                    size_t k = 0, c = 0;
                    while (k < tb.n && c < (size_t)sp.prec) {
                        utf8_next(tb.p, tb.n, &k);
                        c++;
                    }
                    len = k;
                }
                struct spec ss = sp;
                ss.zero = false;
                ss.align = left ? '<' : '>';
                ok = emit_padded(&b, &ss, "", tb.p ? tb.p : "", len, false);
            }
            sb_free(&tb);
            break;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o':
        case 'c': {
            struct tv iv = val;
            if (val.kind == TV_FLOAT && t != 'c') {
                if (!isfinite(val.u.f) || fabs(val.u.f) >= 9.2e18) {
                    ok = rt_fail(rt, SMELT_ERR_RANGE, "cannot convert float to integer");
                    break;
                }
                iv = tv_int((int64_t)val.u.f);
            }
            if (!(iv.kind == TV_INT || iv.kind == TV_BOOL) && !(t == 'c' && iv.kind == TV_STR)) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "%%%c format: a real number is required, not %s", t, tv_type_name(val));
                break;
            }
            if (t == 'c' && iv.kind == TV_STR) {
                ok = emit_padded(&b, &sp, "", iv.u.s->s, iv.u.s->len, false);
                break;
            }
            sp.type = (t == 'i' || t == 'u') ? 'd' : t;
            if (sp.has_prec) { /* %.3d zero-pads the digits */
                int64_t x = iv.kind == TV_INT ? iv.u.i : iv.u.b;
                char digits[64];
                snprintf(digits, sizeof digits, "%0*" PRIu64, (int)(sp.prec > 60 ? 60 : sp.prec),
                         x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x);
                sp.has_prec = false;
                const char *sign = x < 0 ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
                if (t == 'd' || t == 'i' || t == 'u') ok = emit_padded(&b, &sp, sign, digits, strlen(digits), true);
                else ok = format_number(rt, &b, iv, &sp);
                break;
            }
            ok = format_number(rt, &b, iv, &sp);
            break;
        }
        case 'e':
        case 'E':
        case 'f':
        case 'F':
        case 'g':
        case 'G': {
            if (!tv_is_num(val)) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "must be real number, not %s", tv_type_name(val));
                break;
            }
            struct tv fv = tv_float(val.kind == TV_FLOAT ? val.u.f : (double)(val.kind == TV_INT ? val.u.i : val.u.b));
            sp.type = t;
            if (!sp.has_prec) {
                sp.has_prec = true;
                sp.prec = 6;
            }
            ok = format_number(rt, &b, fv, &sp);
            break;
        }
        default:
            ok = rt_fail(rt, SMELT_ERR_INVALID, "unsupported format character '%c'", t);
        }
    }
    if (ok && !mapping_like && argi < an)
        ok = rt_fail(rt, SMELT_ERR_INVALID, "not all arguments converted during string formatting");
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

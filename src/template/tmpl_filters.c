/* Chat-template filters and tests: jinja2 3.1's builtins, with HF's tojson.
 *
 * Each filter binds its arguments like the Python function it mirrors (positional, then
 * keywords by name), so `join(', ')`, `join(d=', ')` and `join(attribute='x')` all work
 * and unknown keywords fail as in jinja2. Filters that return generators or iterators in
 * jinja2 (map, select*, reject*, items, unique, batch, slice, reverse) return lists
 * tagged with that view, so truthiness, len() and tojson fail or succeed as they do there.
 *
 * A few jinja2 builtins are known here but not implemented (pprint, random, urlize,
 * urlencode, xmlattr, filesizeformat, wordwrap): a template that merely contains them
 * compiles, and fails with "unsupported filter" only when one actually runs.
 */
#include "template/tmpl_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/ckd.h"

/* ---------------------------------------------------------------- argument binding */

static bool bind(struct rt *rt, const char *what, struct targs *a, const char *const *names,
                 int n, struct tv *vals, bool *given) {
    for (int i = 0; i < n; i++) {
        vals[i] = tv_undef();
        given[i] = false;
    }
    if ((int)a->n_pos > n)
        return rt_fail(rt, SMELT_ERR_INVALID, "%s takes at most %d argument(s) (%zu given)", what, n,
                       a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++) {
        vals[i] = a->pos[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        int j = 0;
        for (; j < n; j++)
            if (!strcmp(names[j], a->kwn[k]->s)) break;
        if (j == n)
            return rt_fail(rt, SMELT_ERR_INVALID, "%s got an unexpected keyword argument '%s'", what,
                           a->kwn[k]->s);
        if (given[j])
            return rt_fail(rt, SMELT_ERR_INVALID, "%s got multiple values for argument '%s'", what,
                           names[j]);
        vals[j] = a->kwv[k];
        given[j] = true;
    }
    return true;
}

static bool no_args(struct rt *rt, const char *what, struct targs *a) {
    if (a->n_pos || a->n_kw) return rt_fail(rt, SMELT_ERR_INVALID, "%s takes no arguments", what);
    return true;
}

static bool arg_int(struct rt *rt, const char *what, struct tv v, int64_t *out) {
    if (v.kind == TV_INT) *out = v.u.i;
    else if (v.kind == TV_BOOL) *out = v.u.b;
    else if (v.kind == TV_UNDEF) return rt_undef_error(rt, v);
    else
        return rt_fail(rt, SMELT_ERR_INVALID, "%s: '%s' object cannot be interpreted as an integer",
                       what, tv_type_name(v));
    return true;
}


/* ---------------------------------------------------------------- attribute getters */

/* jinja2's make_attrgetter: "a.b.0" -> getitem chain (digits become ints). */
static bool attr_get(struct rt *rt, struct tv item, struct tv attribute, struct tv dflt,
                     struct tv *out) {
    struct tv cur = tv_retain(item);
    if (attribute.kind == TV_NONE || attribute.kind == TV_UNDEF) {
        *out = cur;
        return true;
    }
    if (attribute.kind != TV_STR) {
        struct tv r;
        bool ok = tmpl_getitem(rt, cur, attribute, &r);
        tv_release(rt, cur);
        if (!ok) return false;
        if (dflt.kind != TV_NONE && dflt.kind != TV_UNDEF && r.kind == TV_UNDEF) {
            tv_release(rt, r);
            r = tv_retain(dflt);
        }
        *out = r;
        return true;
    }
    const char *s = attribute.u.s->s;
    size_t len = attribute.u.s->len, i = 0;
    for (;;) {
        size_t j = i;
        while (j < len && s[j] != '.') j++;
        struct tv key;
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (s[k] < '0' || s[k] > '9') digits = false;
        if (digits && j - i < 18) {
            int64_t x = 0;
            for (size_t k = i; k < j; k++) x = x * 10 + (s[k] - '0');
            key = tv_int(x);
        } else if (!tv_new_str(rt, s + i, j - i, &key)) {
            tv_release(rt, cur);
            return false;
        }
        struct tv r;
        bool ok = tmpl_getitem(rt, cur, key, &r);
        tv_release(rt, key);
        tv_release(rt, cur);
        if (!ok) return false;
        if (dflt.kind != TV_NONE && dflt.kind != TV_UNDEF && r.kind == TV_UNDEF) {
            tv_release(rt, r);
            r = tv_retain(dflt);
        }
        cur = r;
        if (j >= len) break;
        i = j + 1;
    }
    *out = cur;
    return true;
}

/* ignore_case: lower-cases strings, other values pass. */
static bool fold_case(struct rt *rt, struct tv v, bool case_sensitive, struct tv *out) {
    if (case_sensitive || v.kind != TV_STR) {
        *out = tv_retain(v);
        return true;
    }
    return tmpl_str_lower(rt, v, out);
}

/* ---------------------------------------------------------------- sorting */

static bool sort_cmp(struct rt *rt, struct tv a, struct tv b, int *c) {
    if (tv_eq(a, b)) {
        *c = 0;
        return true;
    }
    return tv_cmp(rt, a, b, c);
}

/* Stable merge sort of idx[0..n) by keys[idx]; reverse keeps stability like Python. */
static bool msort(struct rt *rt, const struct tv *keys, size_t *idx, size_t *tmp, size_t n,
                  bool reverse) {
    if (n < 2) return true;
    size_t h = n / 2;
    if (!msort(rt, keys, idx, tmp, h, reverse) || !msort(rt, keys, idx + h, tmp, n - h, reverse))
        return false;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        if (!sort_cmp(rt, keys[idx[j]], keys[idx[i]], &c)) return false;
        bool take_right = reverse ? c > 0 : c < 0;
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return true;
}

/* Sorts items by keys (both n long); out is a new list of items in order. */
static bool sort_by_keys(struct rt *rt, struct tv *items, struct tv *keys, size_t n, bool reverse,
                         struct tv *out) {
    size_t *idx = rt_alloc(rt, (n ? n : 1) * sizeof *idx), *tmp = rt_alloc(rt, (n ? n : 1) * sizeof *tmp);
    bool ok = idx && tmp;
    if (ok) {
        for (size_t i = 0; i < n; i++) idx[i] = i;
        ok = msort(rt, keys, idx, tmp, n, reverse);
    }
    if (ok && (ok = tv_new_list(rt, n, out)))
        for (size_t i = 0; i < n; i++) out->u.l->v[out->u.l->n++] = tv_retain(items[idx[i]]);
    free(idx);
    free(tmp);
    return ok;
}

static void free_tvs(struct rt *rt, struct tv *v, size_t n) {
    if (!v) return;
    for (size_t i = 0; i < n; i++) tv_release(rt, v[i]);
    free(v);
}

/* ---------------------------------------------------------------- filters */

typedef bool (*filter_fn)(struct rt *rt, struct tv in, struct targs *a, struct tv *out);

static bool to_str(struct rt *rt, struct tv v, struct tv *out) { return tv_to_str(rt, v, out); }

static bool f_string(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'string'", a)) return false;
    if (!to_str(rt, in, out)) return false;
    if (in.kind == TV_STR) out->safe = in.safe;
    return true;
}

/* Filters that are a str method applied to str(value). */
static bool str_method_filter(struct rt *rt, const char *method, struct tv in, struct targs *a,
                              struct tv *out) {
    struct tv s;
    if (!to_str(rt, in, &s)) return false;
    bool ok = tmpl_str_method(rt, method, s, a, out);
    tv_release(rt, s);
    return ok;
}

static bool f_trim(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"chars"};
    struct tv v[1];
    bool g[1];
    if (!bind(rt, "filter 'trim'", a, names, 1, v, g)) return false;
    struct targs sa = {.pos = v, .n_pos = g[0] ? 1 : 0};
    return str_method_filter(rt, "strip", in, &sa, out);
}

static bool f_upper(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    return no_args(rt, "filter 'upper'", a) && str_method_filter(rt, "upper", in, a, out);
}
static bool f_lower(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    return no_args(rt, "filter 'lower'", a) && str_method_filter(rt, "lower", in, a, out);
}
static bool f_capitalize(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    return no_args(rt, "filter 'capitalize'", a) && str_method_filter(rt, "capitalize", in, a, out);
}

static bool f_title(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'title'", a)) return false;
    /* jinja2: split on ([-\s({\[<]+); each item becomes item[0].upper() + item[1:].lower() */
    struct tv s;
    if (!to_str(rt, in, &s)) return false;
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    const char *p = s.u.s->s;
    size_t len = s.u.s->len, i = 0;
    bool ok = true;
    while (i < len && ok) {
        size_t st = i;
        uint32_t c = utf8_next(p, len, &i);
        bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
        size_t e = i;
        while (e < len) { /* extend the run of separators / of word characters */
            size_t k = e;
            uint32_t d = utf8_next(p, len, &k);
            bool dsep = d == '-' || d == '(' || d == '{' || d == '[' || d == '<' || py_isspace(d);
            if (dsep != sep) break;
            e = k;
        }
        if (sep) {
            ok = sb_put(&b, p + st, e - st);
        } else { /* item[0].upper() + item[1:].lower(): separate strings, separate contexts */
            size_t k = st;
            utf8_next(p, len, &k);
            ok = tmpl_case_into(rt, &b, p + st, k - st, 1) && tmpl_case_into(rt, &b, p + k, e - k, 0);
        }
        i = e;
    }
    tv_release(rt, s);
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool f_replace(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"old", "new", "count"};
    struct tv v[3];
    bool g[3];
    if (!bind(rt, "filter 'replace'", a, names, 3, v, g)) return false;
    if (!g[0] || !g[1]) return rt_fail(rt, SMELT_ERR_INVALID, "filter 'replace' needs old and new");
    struct tv olds, news;
    if (!to_str(rt, v[0], &olds)) return false;
    if (!to_str(rt, v[1], &news)) {
        tv_release(rt, olds);
        return false;
    }
    struct tv args[3] = {olds, news, g[2] && v[2].kind != TV_NONE ? v[2] : tv_int(-1)};
    struct targs sa = {.pos = args, .n_pos = 3};
    bool ok = str_method_filter(rt, "replace", in, &sa, out);
    tv_release(rt, olds);
    tv_release(rt, news);
    return ok;
}

static bool f_default(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"default_value", "boolean"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'default'", a, names, 2, v, g)) return false;
    if (in.kind == TV_UNDEF || (g[1] && tv_truthy(v[1]) && !tv_truthy(in))) {
        if (g[0]) *out = tv_retain(v[0]);
        else return tv_new_str(rt, "", 0, out);
        return true;
    }
    *out = tv_retain(in);
    return true;
}

static bool f_length(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'length'", a)) return false;
    switch (in.kind) {
    case TV_UNDEF: *out = tv_int(0); return true;
    case TV_STR: *out = tv_int((int64_t)in.u.s->ncp); return true;
    case TV_LIST:
    case TV_TUPLE:
        if (in.aux == SV_GEN || in.aux == SV_REVITER) break;
        *out = tv_int((int64_t)in.u.l->n);
        return true;
    case TV_DICT: *out = tv_int((int64_t)in.u.d->n); return true;
    case TV_LOOP: *out = tv_int((int64_t)in.u.lp->items->n); return true;
    default: break;
    }
    return rt_fail(rt, SMELT_ERR_INVALID, "object of type '%s' has no len()", tv_type_name(in));
}

static bool f_list(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'list'", a)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    if (in.kind == TV_LIST && in.aux == SV_LIST) { /* list(x) is a copy */
        bool ok = tv_new_list(rt, l->n, out);
        if (ok)
            for (size_t i = 0; i < l->n; i++) out->u.l->v[out->u.l->n++] = tv_retain(l->v[i]);
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
        return ok;
    }
    *out = (struct tv){.kind = TV_LIST, .u.l = l};
    return true;
}

static bool f_first(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'first'", a)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    *out = l->n ? tv_retain(l->v[0]) : tv_undef();
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return true;
}

static bool f_last(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'last'", a)) return false;
    if ((in.kind == TV_LIST && (in.aux == SV_GEN || in.aux == SV_REVITER || in.aux == SV_ITEMS ||
                                in.aux == SV_KEYS || in.aux == SV_VALUES)) ||
        !(tv_is_seq(in) || in.kind == TV_STR || in.kind == TV_DICT || in.kind == TV_UNDEF))
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object is not reversible", tv_type_name(in));
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    *out = l->n ? tv_retain(l->v[l->n - 1]) : tv_undef();
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return true;
}

static bool f_join(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"d", "attribute"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'join'", a, names, 2, v, g)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    struct tv sep = tv_undef();
    bool ok = g[0] ? to_str(rt, v[0], &sep) : tv_new_str(rt, "", 0, &sep);
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    for (size_t i = 0; ok && i < l->n; i++) {
        if (i) ok = sb_put(&b, sep.u.s->s, sep.u.s->len);
        if (!ok) break;
        if (g[1] && v[1].kind != TV_NONE) {
            struct tv x;
            if (!(ok = attr_get(rt, l->v[i], v[1], tv_none(), &x))) break;
            ok = tv_str(rt, &b, x);
            tv_release(rt, x);
        } else {
            ok = tv_str(rt, &b, l->v[i]);
        }
    }
    tv_release(rt, sep);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool items_of_dict(struct rt *rt, struct tdict *d, struct tv *out) {
    if (!tv_new_list(rt, d->n, out)) return false;
    for (size_t i = 0; i < d->n; i++) {
        struct tv t;
        if (!tv_new_list(rt, 2, &t)) {
            tv_release(rt, *out);
            return false;
        }
        t.kind = TV_TUPLE;
        t.u.l->v[0] = tv_retain(d->k[i]);
        t.u.l->v[1] = tv_retain(d->v[i]);
        t.u.l->n = 2;
        out->u.l->v[out->u.l->n++] = t;
    }
    return true;
}

bool tmpl_dict_items(struct rt *rt, struct tdict *d, struct tv *out) { return items_of_dict(rt, d, out); }

static bool f_items(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'items'", a)) return false;
    if (in.kind == TV_UNDEF) {
        if (!tv_new_list(rt, 0, out)) return false;
        out->aux = SV_GEN;
        return true;
    }
    if (in.kind != TV_DICT) return rt_fail(rt, SMELT_ERR_INVALID, "Can only get item pairs from a mapping.");
    if (!items_of_dict(rt, in.u.d, out)) return false;
    out->aux = SV_GEN;
    return true;
}

static bool f_dictsort(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    struct tv v[3];
    bool g[3];
    if (!bind(rt, "filter 'dictsort'", a, names, 3, v, g)) return false;
    if (in.kind != TV_DICT)
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object has no attribute 'items'", tv_type_name(in));
    int pos = 0;
    if (g[1]) {
        if (v[1].kind == TV_STR && !strcmp(v[1].u.s->s, "value")) pos = 1;
        else if (!(v[1].kind == TV_STR && !strcmp(v[1].u.s->s, "key")))
            return rt_fail(rt, SMELT_ERR_INVALID, "You can only sort by either \"key\" or \"value\"");
    }
    bool cs = g[0] && tv_truthy(v[0]), rev = g[2] && tv_truthy(v[2]);
    struct tv items;
    if (!items_of_dict(rt, in.u.d, &items)) return false;
    size_t n = items.u.l->n;
    struct tv *keys = rt_alloc(rt, (n ? n : 1) * sizeof *keys);
    bool ok = keys != NULL;
    size_t nk = 0;
    for (; ok && nk < n; nk++) ok = fold_case(rt, items.u.l->v[nk].u.l->v[pos], cs, &keys[nk]);
    if (!ok && nk) nk--;
    if (ok) ok = sort_by_keys(rt, items.u.l->v, keys, n, rev, out);
    free_tvs(rt, keys, nk);
    tv_release(rt, items);
    return ok;
}

/* Key list for sort/unique/min/max: make_multi_attrgetter / make_attrgetter + ignore_case. */
static bool make_keys(struct rt *rt, struct tlist *l, struct tv attribute, bool multi, bool cs,
                      struct tv **keys_out) {
    size_t n = l->n;
    struct tv *keys = rt_alloc(rt, (n ? n : 1) * sizeof *keys);
    if (!keys) return false;
    for (size_t i = 0; i < n; i++) {
        bool ok;
        struct tv k;
        if (multi && attribute.kind == TV_STR && memchr(attribute.u.s->s, ',', attribute.u.s->len)) {
            /* "a,b": a list of keys */
            struct tv lst;
            ok = tv_new_list(rt, 0, &lst);
            const char *s = attribute.u.s->s;
            size_t len = attribute.u.s->len, st = 0;
            while (ok) {
                size_t e = st;
                while (e < len && s[e] != ',') e++;
                struct tv part, x, fx;
                ok = tv_new_str(rt, s + st, e - st, &part);
                if (ok) {
                    ok = attr_get(rt, l->v[i], part, tv_none(), &x);
                    tv_release(rt, part);
                }
                if (ok) {
                    ok = fold_case(rt, x, cs, &fx);
                    tv_release(rt, x);
                }
                if (ok) ok = tlist_push(rt, lst.u.l, fx);
                if (e >= len) break;
                st = e + 1;
            }
            if (!ok) {
                tv_release(rt, lst);
                free_tvs(rt, keys, i);
                return false;
            }
            keys[i] = lst;
            continue;
        }
        struct tv x;
        ok = attr_get(rt, l->v[i], attribute, tv_none(), &x);
        if (ok) {
            ok = fold_case(rt, x, cs, &k);
            tv_release(rt, x);
        }
        if (!ok) {
            free_tvs(rt, keys, i);
            return false;
        }
        keys[i] = k;
    }
    *keys_out = keys;
    return true;
}

static bool f_sort(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
    struct tv v[3];
    bool g[3];
    if (!bind(rt, "filter 'sort'", a, names, 3, v, g)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    struct tv *keys;
    bool ok = make_keys(rt, l, g[2] ? v[2] : tv_none(), true, g[1] && tv_truthy(v[1]), &keys);
    if (ok) {
        ok = sort_by_keys(rt, l->v, keys, l->n, g[0] && tv_truthy(v[0]), out);
        free_tvs(rt, keys, l->n);
    }
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}

static bool f_unique(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'unique'", a, names, 2, v, g)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    struct tv *keys = NULL, seen;
    bool ok = make_keys(rt, l, g[1] ? v[1] : tv_none(), false, g[0] && tv_truthy(v[0]), &keys);
    if (ok) ok = tv_new_dict(rt, &seen);
    if (ok) {
        ok = tv_new_list(rt, 0, out);
        for (size_t i = 0; ok && i < l->n; i++) {
            if (tdict_get(seen.u.d, keys[i])) continue;
            ok = tdict_set(rt, seen.u.d, keys[i], tv_none()) && tlist_push(rt, out->u.l, tv_retain(l->v[i]));
        }
        if (ok) out->aux = SV_GEN;
        else tv_release(rt, *out);
        tv_release(rt, seen);
    }
    if (keys) free_tvs(rt, keys, l->n);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}

static bool f_minmax(struct rt *rt, struct tv in, struct targs *a, struct tv *out, bool want_max) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, want_max ? "filter 'max'" : "filter 'min'", a, names, 2, v, g)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    if (!l->n) {
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
        *out = tv_undef();
        return true;
    }
    struct tv *keys;
    bool ok = make_keys(rt, l, g[1] ? v[1] : tv_none(), false, g[0] && tv_truthy(v[0]), &keys);
    if (ok) {
        size_t best = 0;
        for (size_t i = 1; ok && i < l->n; i++) {
            int c;
            ok = tv_cmp(rt, keys[i], keys[best], &c);
            if (ok && (want_max ? c > 0 : c < 0)) best = i;
        }
        if (ok) *out = tv_retain(l->v[best]);
        free_tvs(rt, keys, l->n);
    }
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}
static bool f_max(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return f_minmax(rt, in, a, out, true); }
static bool f_min(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return f_minmax(rt, in, a, out, false); }

static bool f_reverse(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'reverse'", a)) return false;
    if (in.kind == TV_STR) {
        struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
        const char *s = in.u.s->s;
        size_t len = in.u.s->len, i = len;
        bool ok = true;
        while (i > 0 && ok) {
            size_t st = i - 1;
            while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80 && i - st < 4) st--;
            size_t k = st;
            utf8_next(s, len, &k);
            if (k != i) st = i - 1; /* invalid sequence: one byte at a time */
            ok = sb_put(&b, s + st, i - st);
            i = st;
        }
        if (!ok) {
            sb_free(&b);
            return false;
        }
        return sb_to_tv(&b, out);
    }
    if (in.kind == TV_LIST && (in.aux == SV_GEN || in.aux == SV_REVITER))
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object is not reversible", tv_type_name(in));
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    bool ok = tv_new_list(rt, l->n, out);
    if (ok) {
        for (size_t i = l->n; i > 0; i--) out->u.l->v[out->u.l->n++] = tv_retain(l->v[i - 1]);
        out->aux = SV_REVITER;
    }
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}


static bool f_map(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    struct tlist *l;
    if (!tv_truthy(in)) { /* jinja2: `if value:` */
        if (!tv_new_list(rt, 0, out)) return false;
        out->aux = SV_GEN;
        return true;
    }
    if (!tmpl_iter_list(rt, in, &l)) return false;
    bool ok = tv_new_list(rt, l->n, out);
    if (!ok) goto done;
    out->aux = SV_GEN;
    if (!a->n_pos) {
        struct tv attr = tv_undef(), dflt = tv_none();
        bool have_attr = false;
        for (size_t k = 0; k < a->n_kw; k++) {
            if (!strcmp(a->kwn[k]->s, "attribute")) attr = a->kwv[k], have_attr = true;
            else if (!strcmp(a->kwn[k]->s, "default")) dflt = a->kwv[k];
            else {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "Unexpected keyword argument '%s'", a->kwn[k]->s);
                goto done;
            }
        }
        if (!have_attr) {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "map requires a filter argument");
            goto done;
        }
        for (size_t i = 0; ok && i < l->n; i++) {
            struct tv x;
            ok = attr_get(rt, l->v[i], attr, dflt, &x) && tlist_push(rt, out->u.l, x);
        }
    } else {
        struct targs sub = {.pos = a->pos + 1, .n_pos = a->n_pos - 1, .kwn = a->kwn, .kwv = a->kwv, .n_kw = a->n_kw};
        for (size_t i = 0; ok && i < l->n; i++) {
            struct tv x;
            ok = tmpl_apply_filter_named(rt, a->pos[0], l->v[i], &sub, &x) && tlist_push(rt, out->u.l, x);
        }
    }
done:
    if (!ok && out->kind == TV_LIST) tv_release(rt, *out);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}

static bool select_reject(struct rt *rt, struct tv in, struct targs *a, struct tv *out, bool keep_true,
                          bool lookup_attr) {
    if (!tv_new_list(rt, 0, out)) return false;
    out->aux = SV_GEN;
    if (!tv_truthy(in)) return true;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) {
        tv_release(rt, *out);
        return false;
    }
    bool ok = true;
    size_t off = 0;
    struct tv attr = tv_none();
    if (lookup_attr) {
        if (!a->n_pos) {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "Missing parameter for attribute name");
            goto done;
        }
        attr = a->pos[0];
        off = 1;
    }
    bool have_test = a->n_pos > off;
    struct targs sub = {.pos = a->pos + off + 1, .n_pos = have_test ? a->n_pos - off - 1 : 0,
                        .kwn = a->kwn, .kwv = a->kwv, .n_kw = a->n_kw};
    for (size_t i = 0; ok && i < l->n; i++) {
        struct tv x;
        if (!(ok = lookup_attr ? attr_get(rt, l->v[i], attr, tv_none(), &x) : (x = tv_retain(l->v[i]), true)))
            break;
        bool r;
        if (have_test) ok = tmpl_apply_test_named(rt, a->pos[off], x, &sub, &r);
        else r = tv_truthy(x);
        tv_release(rt, x);
        if (ok && r == keep_true) ok = tlist_push(rt, out->u.l, tv_retain(l->v[i]));
    }
done:
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    if (!ok) tv_release(rt, *out);
    return ok;
}
static bool f_select(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return select_reject(rt, in, a, out, true, false); }
static bool f_reject(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return select_reject(rt, in, a, out, false, false); }
static bool f_selectattr(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return select_reject(rt, in, a, out, true, true); }
static bool f_rejectattr(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return select_reject(rt, in, a, out, false, true); }

/* Python int(str, base) for the int filter: whitespace, sign, underscores, prefixes. */
static bool parse_py_int(const char *s, size_t len, int base, int64_t *out) {
    size_t i = 0;
    while (i < len && py_isspace((unsigned char)s[i])) i++;
    while (len > i && py_isspace((unsigned char)s[len - 1])) len--;
    bool neg = false;
    if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (i + 1 < len && s[i] == '0') {
            char p = (char)(s[i + 1] | 32);
            int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
            if (pb && (base == 0 || base == pb)) {
                base = pb;
                i += 2;
                if (i < len && s[i] == '_') i++;
            }
        }
        if (base == 0) base = 10;
    }
    if (base < 2 || base > 36 || i >= len) return false;
    uint64_t acc = 0;
    bool prev_us = true;
    for (; i < len; i++) {
        if (s[i] == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int c = (unsigned char)s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'z') d = (c | 32) - 'a' + 10;
        else return false;
        if (d >= base) return false;
        if (ckd_mul_u64(&acc, acc, (uint64_t)base) || ckd_add_u64(&acc, acc, (uint64_t)d) ||
            acc > (uint64_t)INT64_MAX + neg)
            return false;
        prev_us = false;
    }
    if (prev_us) return false;
    *out = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return true;
}

static bool parse_py_float(const char *s, size_t len, double *out) {
    char buf[128];
    size_t i = 0, k = 0;
    while (i < len && py_isspace((unsigned char)s[i])) i++;
    while (len > i && py_isspace((unsigned char)s[len - 1])) len--;
    if (i >= len || len - i >= sizeof buf) return false;
    for (; i < len; i++) {
        if (s[i] == '_') {
            if (!k || i + 1 >= len || !(s[i - 1] >= '0' && s[i - 1] <= '9') || !(s[i + 1] >= '0' && s[i + 1] <= '9'))
                return false;
            continue;
        }
        buf[k++] = s[i];
    }
    buf[k] = 0;
    /* Python accepts inf/nan/infinity words; strtod does too, but also hex floats: refuse those */
    for (size_t j = 0; j < k; j++)
        if ((buf[j] | 32) == 'x') return false;
    char *end;
    double d = strtod(buf, &end);
    if (*end) return false;
    *out = d;
    return true;
}

static bool f_int(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"default", "base"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'int'", a, names, 2, v, g)) return false;
    int64_t base = 10;
    if (g[1] && !arg_int(rt, "filter 'int'", v[1], &base)) return false;
    int64_t r;
    double d;
    switch (in.kind) {
    case TV_UNDEF: return rt_undef_error(rt, in); /* int(Undefined) raises */
    case TV_INT: *out = in; return true;
    case TV_BOOL: *out = tv_int(in.u.b); return true;
    case TV_FLOAT:
        if (isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) {
            *out = tv_int((int64_t)in.u.f);
            return true;
        }
        break;
    case TV_STR:
        if (parse_py_int(in.u.s->s, in.u.s->len, (int)base, &r)) {
            *out = tv_int(r);
            return true;
        }
        if (parse_py_float(in.u.s->s, in.u.s->len, &d) && isfinite(d) && fabs(d) < 9.2e18) {
            *out = tv_int((int64_t)d);
            return true;
        }
        break;
    default: break;
    }
    *out = g[0] ? tv_retain(v[0]) : tv_int(0);
    return true;
}

static bool f_float(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"default"};
    struct tv v[1];
    bool g[1];
    if (!bind(rt, "filter 'float'", a, names, 1, v, g)) return false;
    double d;
    switch (in.kind) {
    case TV_UNDEF: return rt_undef_error(rt, in); /* float(Undefined) raises */
    case TV_INT: *out = tv_float((double)in.u.i); return true;
    case TV_BOOL: *out = tv_float(in.u.b); return true;
    case TV_FLOAT: *out = in; return true;
    case TV_STR:
        if (parse_py_float(in.u.s->s, in.u.s->len, &d)) {
            *out = tv_float(d);
            return true;
        }
        break;
    default: break;
    }
    *out = g[0] ? tv_retain(v[0]) : tv_float(0.0);
    return true;
}

static bool f_abs(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'abs'", a)) return false;
    if (in.kind == TV_INT) {
        if (in.u.i == INT64_MIN) return rt_fail(rt, SMELT_ERR_RANGE, "integer overflow");
        *out = tv_int(in.u.i < 0 ? -in.u.i : in.u.i);
    } else if (in.kind == TV_BOOL) *out = tv_int(in.u.b);
    else if (in.kind == TV_FLOAT) *out = tv_float(fabs(in.u.f));
    else if (in.kind == TV_UNDEF) return rt_undef_error(rt, in);
    else return rt_fail(rt, SMELT_ERR_INVALID, "bad operand type for abs(): '%s'", tv_type_name(in));
    return true;
}

static bool f_round(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"precision", "method"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'round'", a, names, 2, v, g)) return false;
    int64_t prec = 0;
    if (g[0] && !arg_int(rt, "filter 'round'", v[0], &prec)) return false;
    const char *method = "common";
    if (g[1]) {
        if (v[1].kind != TV_STR) return rt_fail(rt, SMELT_ERR_INVALID, "method must be common, ceil or floor");
        method = v[1].u.s->s;
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            return rt_fail(rt, SMELT_ERR_INVALID, "method must be common, ceil or floor");
    }
    if (in.kind == TV_UNDEF) return rt_undef_error(rt, in);
    if (!tv_is_num(in)) return rt_fail(rt, SMELT_ERR_INVALID, "type %s doesn't define __round__ method", tv_type_name(in));
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    if (!strcmp(method, "common")) {
        if (in.kind != TV_FLOAT) { /* round(int, n) stays an int */
            int64_t x = in.kind == TV_INT ? in.u.i : in.u.b;
            if (prec >= 0) {
                *out = tv_int(x);
                return true;
            }
            int64_t p10 = 1;
            for (int64_t i = 0; i < -prec && p10 <= INT64_MAX / 10; i++) p10 *= 10;
            int64_t q = x / p10, r = x % p10;
            if (r < 0) {
                r += p10;
                q--;
            }
            if (2 * r > p10 || (2 * r == p10 && (q & 1))) q++;
            *out = tv_int(q * p10);
            return true;
        }
        double x = in.u.f;
        if (!isfinite(x) || prec > 22) {
            *out = tv_float(x);
            return true;
        }
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x); /* correctly rounded, half-even */
            *out = tv_float(strtod(buf, NULL));
        } else {
            double p = pow(10, (double)-prec), y = x / p, r = nearbyint(y);
            *out = tv_float(r * p);
        }
        return true;
    }
    double x = in.kind == TV_FLOAT ? in.u.f : (double)(in.kind == TV_INT ? in.u.i : in.u.b);
    double p = pow(10, (double)prec);
    double r = !strcmp(method, "ceil") ? ceil(x * p) : floor(x * p);
    *out = tv_float(r / p);
    return true;
}

static bool f_safe(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'safe'", a)) return false;
    if (!to_str(rt, in, out)) return false;
    out->safe = 1;
    return true;
}

static bool f_escape(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    return no_args(rt, "filter 'escape'", a) && tmpl_html_escape(rt, in, out);
}

static bool f_forceescape(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'forceescape'", a)) return false;
    struct tv s;
    if (!to_str(rt, in, &s)) return false;
    s.safe = 0;
    bool ok = tmpl_html_escape(rt, s, out);
    tv_release(rt, s);
    return ok;
}

static bool f_tojson(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    /* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
     * sort_keys=False); the result is a plain str */
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct tv v[4];
    bool g[4];
    if (!bind(rt, "filter 'tojson'", a, names, 4, v, g)) return false;
    struct json_opts o = {.ensure_ascii = g[0] && tv_truthy(v[0]), .sort_keys = g[3] && tv_truthy(v[3])};
    char spaces[256];
    if (g[1] && v[1].kind != TV_NONE) {
        if (v[1].kind == TV_STR) {
            o.indent = v[1].u.s->s;
            o.indent_len = v[1].u.s->len;
        } else if (v[1].kind == TV_INT || v[1].kind == TV_BOOL) {
            int64_t n = v[1].kind == TV_INT ? v[1].u.i : v[1].u.b;
            if (n < 0) n = 0;
            if (n > 255) return rt_fail(rt, SMELT_ERR_RANGE, "tojson: indent %" PRId64 " too large", n);
            memset(spaces, ' ', (size_t)n);
            o.indent = spaces;
            o.indent_len = (size_t)n;
        } else {
            return rt_fail(rt, SMELT_ERR_INVALID, "tojson: indent must be an int or a string");
        }
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (g[2] && v[2].kind != TV_NONE) {
        if (!tv_is_seq(v[2]) || v[2].u.l->n != 2 || v[2].u.l->v[0].kind != TV_STR || v[2].u.l->v[1].kind != TV_STR)
            return rt_fail(rt, SMELT_ERR_INVALID, "tojson: separators must be a pair of strings");
        o.item_sep = v[2].u.l->v[0].u.s->s;
        o.key_sep = v[2].u.l->v[1].u.s->s;
        o.item_sep_len = v[2].u.l->v[0].u.s->len;
        o.key_sep_len = v[2].u.l->v[1].u.s->len;
    } else {
        o.item_sep_len = strlen(o.item_sep);
        o.key_sep_len = strlen(o.key_sep);
    }
    if (in.kind == TV_UNDEF) return rt_fail(rt, SMELT_ERR_INVALID, "Object of type Undefined is not JSON serializable");
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    if (!tv_json(rt, &b, in, &o, 0)) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

/* Python str.splitlines() boundaries. */
static size_t line_break_len(const char *s, size_t len, size_t i, uint32_t *cp) {
    size_t j = i;
    uint32_t c = utf8_next(s, len, &j);
    *cp = c;
    if (c == '\r' && j < len && s[j] == '\n') return j + 1 - i;
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
        c == 0x2028 || c == 0x2029)
        return j - i;
    return 0;
}

/* Splits s into lines like str.splitlines(); returns a list of strings. */
bool tmpl_splitlines(struct rt *rt, const char *s, size_t len, bool keepends, struct tv *out) {
    if (!tv_new_list(rt, 0, out)) return false;
    size_t i = 0, st = 0;
    while (i < len) {
        uint32_t c;
        size_t bl = line_break_len(s, len, i, &c);
        if (!bl) {
            utf8_next(s, len, &i);
            continue;
        }
        struct tv line;
        if (!tv_new_str(rt, s + st, (keepends ? i + bl : i) - st, &line) || !tlist_push(rt, out->u.l, line)) {
            tv_release(rt, *out);
            return false;
        }
        i += bl;
        st = i;
    }
    if (st < len) {
        struct tv line;
        if (!tv_new_str(rt, s + st, len - st, &line) || !tlist_push(rt, out->u.l, line)) {
            tv_release(rt, *out);
            return false;
        }
    }
    return true;
}

static bool f_indent(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"width", "first", "blank"};
    struct tv v[3];
    bool g[3];
    if (!bind(rt, "filter 'indent'", a, names, 3, v, g)) return false;
    struct tv ind = tv_undef();
    if (g[0] && v[0].kind == TV_STR) ind = tv_retain(v[0]);
    else {
        int64_t w = 4;
        if (g[0] && !arg_int(rt, "filter 'indent'", v[0], &w)) return false;
        if (w < 0) w = 0;
        if ((uint64_t)w > rt->lim.max_output) return rt_fail(rt, SMELT_ERR_RANGE, "indent width too large");
        char *sp = rt_alloc(rt, (size_t)w + 1);
        if (!sp) return false;
        memset(sp, ' ', (size_t)w);
        bool ok = tv_new_str(rt, sp, (size_t)w, &ind);
        free(sp);
        if (!ok) return false;
    }
    /* jinja2 does `s += "\n"` without converting s: only strings work */
    if (in.kind != TV_STR) {
        tv_release(rt, ind);
        if (in.kind == TV_UNDEF) return rt_undef_error(rt, in);
        return rt_fail(rt, SMELT_ERR_INVALID, "unsupported operand type(s) for +=: '%s' and 'str'", tv_type_name(in));
    }
    struct tv s = tv_retain(in);
    /* s += "\n"; lines = s.splitlines() */
    struct sbuf tmp = {.rt = rt, .limit = rt->lim.max_output};
    struct tv lines = tv_undef();
    bool ok = sb_put(&tmp, s.u.s->s, s.u.s->len) && sb_putc(&tmp, '\n') &&
              tmpl_splitlines(rt, tmp.p, tmp.n, false, &lines);
    sb_free(&tmp);
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    bool blank = g[2] && tv_truthy(v[2]);
    if (ok) {
        struct tlist *l = lines.u.l;
        if (g[1] && tv_truthy(v[1])) ok = sb_put(&b, ind.u.s->s, ind.u.s->len);
        for (size_t i = 0; ok && i < l->n; i++) {
            struct tstr *ln = l->v[i].u.s;
            if (i) ok = sb_putc(&b, '\n');
            if (ok && i && (blank || ln->len)) ok = sb_put(&b, ind.u.s->s, ind.u.s->len);
            if (ok) ok = sb_put(&b, ln->s, ln->len);
        }
    }
    tv_release(rt, lines);
    tv_release(rt, s);
    tv_release(rt, ind);
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool f_center(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"width"};
    struct tv v[1];
    bool g[1];
    if (!bind(rt, "filter 'center'", a, names, 1, v, g)) return false;
    struct tv args[1] = {g[0] ? v[0] : tv_int(80)};
    struct targs sa = {.pos = args, .n_pos = 1};
    return str_method_filter(rt, "center", in, &sa, out);
}

static bool f_truncate(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"length", "killwords", "end", "leeway"};
    struct tv v[4];
    bool g[4];
    if (!bind(rt, "filter 'truncate'", a, names, 4, v, g)) return false;
    int64_t length = 255, leeway = 5;
    if (g[0] && !arg_int(rt, "filter 'truncate'", v[0], &length)) return false;
    if (g[3] && v[3].kind != TV_NONE && !arg_int(rt, "filter 'truncate'", v[3], &leeway)) return false;
    int64_t endlen0 = 3;
    if (g[2] && v[2].kind == TV_STR) endlen0 = (int64_t)v[2].u.s->ncp;
    else if (g[2]) endlen0 = -1;
    if ((endlen0 >= 0 && length < endlen0) || leeway < 0)
        return rt_fail(rt, SMELT_ERR_INVALID, "truncate: expected length >= %" PRId64 ", got %" PRId64, endlen0, length);
    if (in.kind != TV_STR) {
        /* jinja2 uses len(s) and s[:n].rsplit(...) on the value as given */
        if (in.kind == TV_UNDEF || ((tv_is_seq(in) && !in.aux) || in.kind == TV_DICT)) {
            size_t len = in.kind == TV_UNDEF ? 0 : in.kind == TV_DICT ? in.u.d->n : in.u.l->n;
            if ((int64_t)len <= length + leeway) {
                *out = tv_retain(in);
                return true;
            }
            return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object has no attribute 'rsplit'", tv_type_name(in));
        }
        return rt_fail(rt, SMELT_ERR_INVALID, "object of type '%s' has no len()", tv_type_name(in));
    }
    struct tv end = tv_undef(), s = tv_retain(in);
    bool ok = g[2] ? to_str(rt, v[2], &end) : tv_new_str(rt, "...", 3, &end);
    if (!ok) {
        tv_release(rt, s);
        return false;
    }
    int64_t endlen = (int64_t)end.u.s->ncp;
    if (length < endlen || leeway < 0) {
        tv_release(rt, s);
        tv_release(rt, end);
        return rt_fail(rt, SMELT_ERR_INVALID, "truncate: expected length >= %" PRId64 ", got %" PRId64, endlen, length);
    }
    if ((int64_t)s.u.s->ncp <= length + leeway) {
        *out = s;
        tv_release(rt, end);
        return true;
    }
    size_t cut = tstr_offset(s.u.s, (size_t)(length - endlen));
    size_t keep = cut;
    if (!(g[1] && tv_truthy(v[1]))) {
        /* s[:n].rsplit(" ", 1)[0] */
        for (size_t i = cut; i > 0; i--)
            if (s.u.s->s[i - 1] == ' ') {
                keep = i - 1;
                break;
            }
    }
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    ok = sb_put(&b, s.u.s->s, keep) && sb_put(&b, end.u.s->s, end.u.s->len);
    tv_release(rt, s);
    tv_release(rt, end);
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool f_wordcount(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'wordcount'", a)) return false;
    struct tv s;
    if (!to_str(rt, in, &s)) return false;
    int64_t n = 0;
    bool inword = false;
    size_t i = 0;
    while (i < s.u.s->len) {
        uint32_t c = utf8_next(s.u.s->s, s.u.s->len, &i);
        bool w = c == '_' || py_isalpha(c) || py_isdecimal(c) || py_isdigit(c) || py_isnumeric(c); /* \w */
        if (w && !inword) n++;
        inword = w;
    }
    tv_release(rt, s);
    *out = tv_int(n);
    return true;
}

static bool f_format(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (a->n_pos && a->n_kw)
        return rt_fail(rt, SMELT_ERR_INVALID, "can't handle positional and keyword arguments at the same time");
    struct tv s, args;
    if (!to_str(rt, in, &s)) return false;
    bool ok;
    if (a->n_kw) {
        ok = tv_new_dict(rt, &args);
        for (size_t k = 0; ok && k < a->n_kw; k++)
            ok = tdict_set(rt, args.u.d, (struct tv){.kind = TV_STR, .u.s = a->kwn[k]}, a->kwv[k]);
    } else {
        ok = tv_new_list(rt, a->n_pos, &args);
        if (ok) {
            args.kind = TV_TUPLE;
            for (size_t i = 0; i < a->n_pos; i++) args.u.l->v[args.u.l->n++] = tv_retain(a->pos[i]);
        }
    }
    if (ok) {
        ok = tmpl_percent_format(rt, s, args, out);
        tv_release(rt, args);
    }
    tv_release(rt, s);
    return ok;
}

static bool f_batch_slice(struct rt *rt, struct tv in, struct targs *a, struct tv *out, bool is_slice) {
    static const char *const names[] = {"linecount", "fill_with"};
    static const char *const names2[] = {"slices", "fill_with"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, is_slice ? "filter 'slice'" : "filter 'batch'", a, is_slice ? names2 : names, 2, v, g))
        return false;
    int64_t n;
    if (!g[0]) return rt_fail(rt, SMELT_ERR_INVALID, "filter '%s' needs a count", is_slice ? "slice" : "batch");
    if (!arg_int(rt, "filter", v[0], &n)) return false;
    if (n <= 0 && is_slice) return rt_fail(rt, SMELT_ERR_INVALID, "integer division or modulo by zero");
    if (n > (1 << 20)) return rt_fail(rt, SMELT_ERR_RANGE, "filter count too large");
    bool fill = g[1] && v[1].kind != TV_NONE;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    bool ok = tv_new_list(rt, 0, out);
    if (ok) out->aux = SV_GEN;
    if (!is_slice) {
        /* jinja2: for item: if len(tmp) == linecount: yield tmp; tmp = []. tmp.append(item) */
        struct tv tmp = tv_undef();
        ok = ok && tv_new_list(rt, 0, &tmp);
        for (size_t i = 0; ok && i < l->n; i++) {
            if ((int64_t)tmp.u.l->n == n) {
                ok = tlist_push(rt, out->u.l, tmp);
                tmp = tv_undef();
                if (!ok || !(ok = tv_new_list(rt, 0, &tmp))) break;
            }
            ok = tlist_push(rt, tmp.u.l, tv_retain(l->v[i]));
        }
        if (ok && tmp.u.l->n) {
            while (ok && fill && (int64_t)tmp.u.l->n < n) ok = tlist_push(rt, tmp.u.l, tv_retain(v[1]));
            if (ok) {
                ok = tlist_push(rt, out->u.l, tmp);
                tmp = tv_undef();
            }
        }
        tv_release(rt, tmp);
    } else {
        size_t len = l->n, per = len / (size_t)n, extra = len % (size_t)n, offset = 0;
        for (size_t sn = 0; ok && sn < (size_t)n; sn++) {
            size_t start = offset + sn * per;
            if (sn < extra) offset++;
            size_t end = offset + (sn + 1) * per;
            struct tv chunk;
            if (!(ok = tv_new_list(rt, end - start + 1, &chunk))) break;
            for (size_t j = start; j < end; j++) chunk.u.l->v[chunk.u.l->n++] = tv_retain(l->v[j]);
            if (fill && sn >= extra) chunk.u.l->v[chunk.u.l->n++] = tv_retain(v[1]);
            ok = tlist_push(rt, out->u.l, chunk);
        }
    }
    if (!ok && out->kind == TV_LIST) tv_release(rt, *out);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}
static bool f_batch(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return f_batch_slice(rt, in, a, out, false); }
static bool f_slice(struct rt *rt, struct tv in, struct targs *a, struct tv *out) { return f_batch_slice(rt, in, a, out, true); }

static bool f_attr(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"name"};
    struct tv v[1];
    bool g[1];
    if (!bind(rt, "filter 'attr'", a, names, 1, v, g)) return false;
    if (!g[0] || v[0].kind != TV_STR) return rt_fail(rt, SMELT_ERR_INVALID, "filter 'attr' needs a name");
    if (in.kind == TV_UNDEF) return rt_undef_error(rt, in);
    /* real attributes only: dict keys are not attributes */
    if (in.kind == TV_NS || in.kind == TV_LOOP) return tmpl_getattr(rt, in, v[0].u.s, out);
    int r = tmpl_method_lookup(rt, in, v[0].u.s->s, v[0].u.s->len, out);
    if (r < 0) return false;
    if (r == 0) *out = (struct tv){.kind = TV_UNDEF, .why = UND_ATTR, .aux = in.kind, .u.s = tv_retain(v[0]).u.s};
    return true;
}

static bool f_sum(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"attribute", "start"};
    struct tv v[2];
    bool g[2];
    if (!bind(rt, "filter 'sum'", a, names, 2, v, g)) return false;
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    struct tv acc = g[1] ? tv_retain(v[1]) : tv_int(0);
    bool ok = true;
    for (size_t i = 0; ok && i < l->n; i++) {
        struct tv x, r;
        if (!(ok = attr_get(rt, l->v[i], g[0] ? v[0] : tv_none(), tv_none(), &x))) break;
        if (acc.kind == TV_STR || x.kind == TV_STR)
            ok = rt_fail(rt, SMELT_ERR_INVALID, "sum() can't sum strings");
        else ok = tmpl_add(rt, acc, x, &r);
        tv_release(rt, x);
        if (ok) {
            tv_release(rt, acc);
            acc = r;
        }
    }
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    if (!ok) {
        tv_release(rt, acc);
        return false;
    }
    *out = acc;
    return true;
}

static bool f_striptags(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    if (!no_args(rt, "filter 'striptags'", a)) return false;
    struct tv s;
    if (!to_str(rt, in, &s)) return false;
    const char *p = s.u.s->s;
    size_t len = s.u.s->len;
    struct sbuf t = {.rt = rt, .limit = rt->lim.max_output};
    bool ok = true;
    for (size_t i = 0; i < len && ok;) {
        if (p[i] == '<' && i + 3 < len && !memcmp(p + i, "<!--", 4)) {
            const char *e = memmem(p + i + 4, len - i - 4, "-->", 3);
            if (e) {
                i = (size_t)(e - p) + 3;
                continue;
            }
        }
        if (p[i] == '<') {
            const char *e = memchr(p + i + 1, '>', len - i - 1);
            if (e) {
                i = (size_t)(e - p) + 1;
                continue;
            }
        }
        ok = sb_putc(&t, p[i++]);
    }
    /* " ".join(s.split()) then unescape the basic entities */
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    size_t i = 0;
    bool need_space = false;
    while (ok && i < t.n) {
        size_t st = i;
        uint32_t c = utf8_next(t.p, t.n, &i);
        if (py_isspace(c)) {
            need_space = b.n > 0;
            continue;
        }
        if (need_space) ok = sb_putc(&b, ' ');
        need_space = false;
        if (ok && c == '&') {
            static const struct {
                const char *e;
                char c;
            } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&#39;", '\''}, {"&#34;", '"'}};
            bool done = false;
            for (size_t k = 0; k < sizeof ents / sizeof *ents && !done; k++) {
                size_t el = strlen(ents[k].e);
                if (st + el <= t.n && !memcmp(t.p + st, ents[k].e, el)) {
                    ok = sb_putc(&b, ents[k].c);
                    i = st + el;
                    done = true;
                }
            }
            if (done) continue;
        }
        if (ok) ok = sb_put(&b, t.p + st, i - st);
    }
    sb_free(&t);
    tv_release(rt, s);
    if (!ok) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static bool f_groupby(struct rt *rt, struct tv in, struct targs *a, struct tv *out) {
    static const char *const names[] = {"attribute", "default", "case_sensitive"};
    struct tv v[3];
    bool g[3];
    if (!bind(rt, "filter 'groupby'", a, names, 3, v, g)) return false;
    if (!g[0]) return rt_fail(rt, SMELT_ERR_INVALID, "filter 'groupby' needs an attribute");
    bool cs = g[2] && tv_truthy(v[2]);
    struct tlist *l;
    if (!tmpl_iter_list(rt, in, &l)) return false;
    size_t n = l->n;
    struct tv *keys = rt_alloc(rt, (n ? n : 1) * sizeof *keys);
    size_t nk = 0;
    bool ok = keys != NULL;
    for (; ok && nk < n; nk++) {
        struct tv x;
        ok = attr_get(rt, l->v[nk], v[0], g[1] ? v[1] : tv_none(), &x);
        if (ok) {
            ok = fold_case(rt, x, cs, &keys[nk]);
            tv_release(rt, x);
        }
    }
    if (!ok && nk) nk--;
    size_t *idx = ok ? rt_alloc(rt, (n ? n : 1) * sizeof *idx) : NULL, *tmp = idx ? rt_alloc(rt, (n ? n : 1) * sizeof *tmp) : NULL;
    ok = ok && idx && tmp;
    if (ok) {
        for (size_t i = 0; i < n; i++) idx[i] = i;
        ok = msort(rt, keys, idx, tmp, n, false);
    }
    if (ok) ok = tv_new_list(rt, 0, out);
    for (size_t i = 0; ok && i < n;) {
        size_t j = i;
        struct tv grp, tup, realkey;
        if (!(ok = tv_new_list(rt, 0, &grp))) break;
        while (ok && j < n && tv_eq(keys[idx[j]], keys[idx[i]])) ok = tlist_push(rt, grp.u.l, tv_retain(l->v[idx[j++]]));
        if (ok) ok = cs ? (realkey = tv_retain(keys[idx[i]]), true) : attr_get(rt, l->v[idx[i]], v[0], g[1] ? v[1] : tv_none(), &realkey);
        if (ok && (ok = tv_new_list(rt, 2, &tup))) {
            tup.kind = TV_TUPLE;
            tup.u.l->v[0] = realkey;
            tup.u.l->v[1] = grp;
            tup.u.l->n = 2;
            ok = tlist_push(rt, out->u.l, tup);
        } else {
            tv_release(rt, grp);
        }
        i = j;
    }
    free(idx);
    free(tmp);
    free_tvs(rt, keys, nk);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = l});
    return ok;
}

/* ---------------------------------------------------------------- filter table */

struct fdef {
    const char *name;
    filter_fn fn; /* NULL: a jinja2 builtin this engine does not implement */
};

static const struct fdef filters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
    {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
    {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
    {"e", f_escape},          {"escape", f_escape},     {"filesizeformat", NULL},
    {"first", f_first},       {"float", f_float},       {"forceescape", f_forceescape},
    {"format", f_format},     {"groupby", f_groupby},   {"indent", f_indent},
    {"int", f_int},           {"items", f_items},       {"join", f_join},
    {"last", f_last},         {"length", f_length},     {"list", f_list},
    {"lower", f_lower},       {"map", f_map},           {"max", f_max},
    {"min", f_min},           {"pprint", NULL},         {"random", NULL},
    {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},
    {"select", f_select},     {"selectattr", f_selectattr}, {"slice", f_slice},
    {"sort", f_sort},         {"string", f_string},     {"striptags", f_striptags},
    {"sum", f_sum},           {"title", f_title},       {"tojson", f_tojson},
    {"trim", f_trim},         {"truncate", f_truncate}, {"unique", f_unique},
    {"upper", f_upper},       {"urlencode", NULL},      {"urlize", NULL},
    {"wordcount", f_wordcount}, {"wordwrap", NULL},     {"xmlattr", NULL},
};
#define N_FILTERS (int)(sizeof filters / sizeof *filters)

int tmpl_filter_id(const char *name, size_t len) {
    for (int i = 0; i < N_FILTERS; i++)
        if (strlen(filters[i].name) == len && !memcmp(filters[i].name, name, len)) return i;
    return -1;
}


bool tmpl_apply_filter(struct rt *rt, int fid, struct tv in, struct targs *a, struct tv *out) {
    if (fid == FID_UNKNOWN) return rt_fail(rt, SMELT_ERR_INVALID, "no filter named '%s'", rt->node ? rt->node->s->s : "?");
    if (fid < 0 || fid >= N_FILTERS) return rt_fail(rt, SMELT_ERR_INTERNAL, "bad filter id");
    *out = tv_undef();
    if (!filters[fid].fn)
        return rt_fail(rt, SMELT_ERR_UNSUPPORTED, "unsupported filter '%s'", filters[fid].name);
    if (!rt_step(rt, 1)) return false;
    bool ok = filters[fid].fn(rt, in, a, out);
    if (!ok) *out = tv_undef(); /* contract: on failure the caller holds nothing */
    return ok;
}

bool tmpl_apply_filter_named(struct rt *rt, struct tv name, struct tv in, struct targs *a, struct tv *out) {
    if (name.kind != TV_STR) {
        if (name.kind == TV_UNDEF) return rt_fail(rt, SMELT_ERR_INVALID, "No filter named Undefined (did you forget to quote the callable name?)");
        return rt_fail(rt, SMELT_ERR_INVALID, "No filter named %s.", tv_type_name(name));
    }
    int fid = tmpl_filter_id(name.u.s->s, name.u.s->len);
    if (fid < 0) return rt_fail(rt, SMELT_ERR_INVALID, "No filter named '%s'.", name.u.s->s);
    return tmpl_apply_filter(rt, fid, in, a, out);
}

/* ---------------------------------------------------------------- tests */

typedef bool (*test_fn)(struct rt *rt, struct tv in, struct targs *a, bool *out);

static bool one_arg(struct rt *rt, const char *name, struct targs *a, struct tv *arg) {
    if (a->n_kw || a->n_pos != 1)
        return rt_fail(rt, SMELT_ERR_INVALID, "test '%s' takes exactly one argument", name);
    *arg = a->pos[0];
    return true;
}

#define SIMPLE_TEST(fname, expr)                                                               \
    static bool fname(struct rt *rt, struct tv v, struct targs *a, bool *out) {                \
        if (!no_args(rt, "test", a)) return false;                                             \
        *out = (expr);                                                                         \
        return true;                                                                           \
    }

SIMPLE_TEST(t_defined, v.kind != TV_UNDEF)
SIMPLE_TEST(t_undefined, v.kind == TV_UNDEF)
SIMPLE_TEST(t_none, v.kind == TV_NONE)
SIMPLE_TEST(t_boolean, v.kind == TV_BOOL)
SIMPLE_TEST(t_false, v.kind == TV_BOOL && !v.u.b)
SIMPLE_TEST(t_true, v.kind == TV_BOOL && v.u.b)
SIMPLE_TEST(t_integer, v.kind == TV_INT)
SIMPLE_TEST(t_float, v.kind == TV_FLOAT)
SIMPLE_TEST(t_number, v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL)
SIMPLE_TEST(t_string, v.kind == TV_STR)
SIMPLE_TEST(t_mapping, v.kind == TV_DICT)
SIMPLE_TEST(t_escaped, v.kind == TV_STR && v.safe)
SIMPLE_TEST(t_callable, v.kind == TV_FUNC || v.kind == TV_MACRO || v.kind == TV_LOOP || v.kind == TV_UNDEF)
SIMPLE_TEST(t_iterable, v.kind == TV_UNDEF || v.kind == TV_STR || tv_is_seq(v) || v.kind == TV_DICT || v.kind == TV_LOOP)
SIMPLE_TEST(t_sequence, v.kind == TV_UNDEF || v.kind == TV_STR || v.kind == TV_DICT ||
                            (tv_is_seq(v) && v.aux == SV_LIST))

static bool parity(struct rt *rt, struct tv v, int64_t div, int64_t want, bool *out) {
    if (v.kind == TV_UNDEF) return rt_undef_error(rt, v);
    if (v.kind == TV_INT || v.kind == TV_BOOL) {
        int64_t x = v.kind == TV_INT ? v.u.i : v.u.b, m = x % div;
        if (m && ((m < 0) != (div < 0))) m += div;
        *out = m == want;
        return true;
    }
    if (v.kind == TV_FLOAT) {
        double m = fmod(v.u.f, (double)div);
        if (m && ((m < 0) != (div < 0))) m += (double)div;
        *out = m == (double)want;
        return true;
    }
    if (v.kind == TV_STR) return rt_fail(rt, SMELT_ERR_INVALID, "not all arguments converted during string formatting");
    return rt_fail(rt, SMELT_ERR_INVALID, "unsupported operand type(s) for %%: '%s' and 'int'", tv_type_name(v));
}

static bool t_odd(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    return no_args(rt, "test 'odd'", a) && parity(rt, v, 2, 1, out);
}
static bool t_even(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    return no_args(rt, "test 'even'", a) && parity(rt, v, 2, 0, out);
}
static bool t_divisibleby(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    struct tv n = tv_undef();
    if (!one_arg(rt, "divisibleby", a, &n)) return false;
    int64_t d;
    if (n.kind == TV_FLOAT) {
        if (n.u.f == 0) return rt_fail(rt, SMELT_ERR_INVALID, "float modulo");
        if (!tv_is_num(v)) return rt_fail(rt, SMELT_ERR_INVALID, "unsupported operand type for %%");
        double x = v.kind == TV_FLOAT ? v.u.f : (double)(v.kind == TV_INT ? v.u.i : v.u.b);
        *out = fmod(x, n.u.f) == 0;
        return true;
    }
    if (!arg_int(rt, "test 'divisibleby'", n, &d)) return false;
    if (d == 0) return rt_fail(rt, SMELT_ERR_INVALID, "integer division or modulo by zero");
    return parity(rt, v, d, 0, out);
}

static bool case_test(struct rt *rt, struct tv v, bool lower, bool *out) {
    struct tv s;
    if (!to_str(rt, v, &s)) return false;
    *out = tmpl_str_is(lower ? 'l' : 'u', s.u.s->s, s.u.s->len);
    tv_release(rt, s);
    return true;
}
static bool t_lower(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    return no_args(rt, "test 'lower'", a) && case_test(rt, v, true, out);
}
static bool t_upper(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    return no_args(rt, "test 'upper'", a) && case_test(rt, v, false, out);
}

static bool t_sameas(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    struct tv o = tv_undef();
    if (!one_arg(rt, "sameas", a, &o)) return false;
    if (v.kind != o.kind) *out = false;
    else if (v.kind == TV_NONE || v.kind == TV_UNDEF) *out = v.kind == TV_NONE || v.u.o == o.u.o;
    else if (v.kind == TV_BOOL) *out = v.u.b == o.u.b;
    else if (v.kind == TV_INT) *out = v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256; /* CPython small ints */
    else if (v.kind == TV_FLOAT) *out = false;
    else *out = v.u.o == o.u.o;
    return true;
}

static bool t_filter(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    if (!no_args(rt, "test 'filter'", a)) return false;
    *out = v.kind == TV_STR && tmpl_filter_id(v.u.s->s, v.u.s->len) >= 0;
    return true;
}
static bool t_test(struct rt *rt, struct tv v, struct targs *a, bool *out) {
    if (!no_args(rt, "test 'test'", a)) return false;
    *out = v.kind == TV_STR && tmpl_test_id(v.u.s->s, v.u.s->len) >= 0;
    return true;
}

static bool cmp_test(struct rt *rt, const char *name, int op, struct tv v, struct targs *a, bool *out) {
    struct tv o = tv_undef();
    if (!one_arg(rt, name, a, &o)) return false;
    return tmpl_compare_op(rt, op, v, o, out);
}
static bool t_in(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "in", CMP_IN, v, a, out); }
static bool t_eq(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "eq", T_EQ, v, a, out); }
static bool t_ne(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "ne", T_NE, v, a, out); }
static bool t_lt(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "lt", T_LT, v, a, out); }
static bool t_le(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "le", T_LTEQ, v, a, out); }
static bool t_gt(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "gt", T_GT, v, a, out); }
static bool t_ge(struct rt *rt, struct tv v, struct targs *a, bool *out) { return cmp_test(rt, "ge", T_GTEQ, v, a, out); }

struct tdef {
    const char *name;
    test_fn fn;
};

static const struct tdef tests[] = {
    {"odd", t_odd},         {"even", t_even},       {"divisibleby", t_divisibleby},
    {"defined", t_defined}, {"undefined", t_undefined}, {"filter", t_filter},
    {"test", t_test},       {"none", t_none},       {"boolean", t_boolean},
    {"false", t_false},     {"true", t_true},       {"integer", t_integer},
    {"float", t_float},     {"lower", t_lower},     {"upper", t_upper},
    {"string", t_string},   {"mapping", t_mapping}, {"number", t_number},
    {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
    {"sameas", t_sameas},   {"escaped", t_escaped}, {"in", t_in},
    {"==", t_eq},           {"eq", t_eq},           {"equalto", t_eq},
    {"!=", t_ne},           {"ne", t_ne},           {">", t_gt},
    {"gt", t_gt},           {"greaterthan", t_gt},  {"ge", t_ge},
    {">=", t_ge},           {"<", t_lt},            {"lt", t_lt},
    {"lessthan", t_lt},     {"<=", t_le},           {"le", t_le},
};
#define N_TESTS (int)(sizeof tests / sizeof *tests)

int tmpl_test_id(const char *name, size_t len) {
    for (int i = 0; i < N_TESTS; i++)
        if (strlen(tests[i].name) == len && !memcmp(tests[i].name, name, len)) return i;
    return -1;
}


bool tmpl_apply_test(struct rt *rt, int fid, struct tv in, struct targs *a, bool *out) {
    if (fid == FID_UNKNOWN) return rt_fail(rt, SMELT_ERR_INVALID, "no test named '%s'", rt->node ? rt->node->s->s : "?");
    if (fid < 0 || fid >= N_TESTS) return rt_fail(rt, SMELT_ERR_INTERNAL, "bad test id");
    return tests[fid].fn(rt, in, a, out);
}

bool tmpl_apply_test_named(struct rt *rt, struct tv name, struct tv in, struct targs *a, bool *out) {
    if (name.kind != TV_STR) return rt_fail(rt, SMELT_ERR_INVALID, "No test named %s.", tv_type_name(name));
    int fid = tmpl_test_id(name.u.s->s, name.u.s->len);
    if (fid < 0) return rt_fail(rt, SMELT_ERR_INVALID, "No test named '%s'.", name.u.s->s);
    return tmpl_apply_test(rt, fid, in, a, out);
}

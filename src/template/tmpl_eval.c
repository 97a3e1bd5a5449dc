/* Chat-template evaluator: walks the AST with jinja2's runtime semantics.
 *
 * Scopes: a chain of small frames. The template has a top frame; each for-loop
 * iteration, macro call, {% with %}, set-block and filter-block body gets a fresh frame
 * whose parent is the enclosing one, so a `set` inside a loop is local to that
 * iteration (the reason templates use namespace()). Name lookup walks the frames, then
 * the render context, then the globals. Names are interned at compile time, so frames
 * compare pointers. A macro keeps its defining frame (lookups are dynamic, as jinja2's
 * are: a macro sees the latest value of a variable of its defining frame); frames
 * captured that way are freed at the end of the render.
 *
 * Budgets: every evaluated node and loop iteration costs a step; C recursion (nested
 * expressions, statements and macro calls) is bounded by rt->cdepth; allocations are
 * charged in tmpl_value.c. Exceeding any of them ends the render with SMELT_ERR_RANGE.
 */
#include "template/tmpl_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/ckd.h"

#define MAX_CDEPTH 100000 /* a backstop: the stack-bytes budget normally stops first */

struct scope {
    struct scope *parent;
    struct tstr **names;
    struct tv *vals;
    uint32_t n, cap;
    bool kept;
    struct scope *next_kept;
    struct tstr *inl_names[4];
    struct tv inl_vals[4];
};

enum { X_OK = 0, X_ERR = -1, X_BREAK = 1, X_CONTINUE = 2 };

/* ---------------------------------------------------------------- errors */

bool rt_failv(struct rt *rt, smelt_status code, const char *fmt, va_list ap) {
    if (!rt || rt->failed) return false;
    rt->failed = true;
    char msg[ERR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (rt->node) err_set(rt->e, code, "line %u col %u: %s", rt->node->line, rt->node->col, msg);
    else err_set(rt->e, code, "%s", msg);
    return false;
}

bool rt_fail(struct rt *rt, smelt_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    rt_failv(rt, code, fmt, ap);
    va_end(ap);
    return false;
}

static const char *obj_type_repr(int kind) {
    switch (kind) {
    case TV_NONE: return "None";
    case TV_BOOL: return "bool object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_STR: return "str object";
    case TV_LIST: return "list object";
    case TV_TUPLE: return "tuple object";
    case TV_DICT: return "dict object";
    case TV_NS: return "jinja2.utils.Namespace object";
    case TV_LOOP: return "jinja2.runtime.LoopContext object";
    case TV_MACRO: return "jinja2.runtime.Macro object";
    default: return "object";
    }
}

bool rt_undef_error(struct rt *rt, struct tv u) {
    const char *name = u.u.s ? u.u.s->s : "?";
    switch (u.why) {
    case UND_NAME:
        if (!u.u.s) return rt_fail(rt, SMELT_ERR_INVALID, "undefined value used");
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' is undefined", name);
    case UND_ATTR:
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' has no attribute '%s'", obj_type_repr(u.aux), name);
    case UND_ITEM:
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' has no element %s", obj_type_repr(u.aux), name);
    case UND_PARAM:
        return rt_fail(rt, SMELT_ERR_INVALID, "parameter '%s' was not provided", name);
    case UND_CONDEXPR:
        return rt_fail(rt, SMELT_ERR_INVALID,
                       "the inline if-expression on line %u evaluated to false and no else "
                       "section was defined", u.line);
    case UND_UNSAFE:
        return rt_fail(rt, SMELT_ERR_INVALID, "access to attribute '%s' of '%s' object is unsafe",
                       name, obj_type_repr(u.aux));
    }
    return rt_fail(rt, SMELT_ERR_INVALID, "undefined value used");
}

bool rt_step(struct rt *rt, uint64_t n) {
    rt->steps += n;
    if (rt->steps > rt->lim.max_steps)
        return rt_fail(rt, SMELT_ERR_RANGE, "template exceeded its step budget (%" PRIu64 " steps): an endless or huge loop?",
                       rt->lim.max_steps);
    return true;
}

bool rt_track_ns(struct rt *rt, struct tdict *d) {
    if (rt->n_nss == rt->cap_nss) {
        size_t nc = rt->cap_nss ? rt->cap_nss * 2 : 8;
        struct tdict **v = rt_realloc_acct(rt, rt->nss, rt->cap_nss * sizeof *v, nc * sizeof *v);
        if (!v) return false;
        rt->nss = v;
        rt->cap_nss = nc;
    }
    d->h.rc++;
    rt->nss[rt->n_nss++] = d;
    return true;
}

/* ---------------------------------------------------------------- scopes */

static struct scope *scope_new(struct rt *rt, struct scope *parent) {
    struct scope *s = rt_alloc(rt, sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    s->names = s->inl_names;
    s->vals = s->inl_vals;
    s->cap = 4;
    return s;
}

static void scope_clear(struct rt *rt, struct scope *s) {
    for (uint32_t i = 0; i < s->n; i++) tv_release(rt, s->vals[i]);
    s->n = 0;
}

static void scope_destroy(struct rt *rt, struct scope *s) {
    scope_clear(rt, s);
    if (s->names != s->inl_names) {
        free(s->names);
        free(s->vals);
    }
    free(s);
}

/* Ends a scope's life: freed now unless a macro captured it. */
static void scope_pop(struct rt *rt, struct scope *s) {
    if (!s) return;
    if (s->kept) {
        s->next_kept = rt->kept;
        rt->kept = s;
        return;
    }
    scope_destroy(rt, s);
}

static void scope_keep(struct scope *s) {
    for (; s && !s->kept; s = s->parent) s->kept = true;
}

/* Binds name (interned) to v in s, taking ownership of v. */
static bool scope_set(struct rt *rt, struct scope *s, struct tstr *name, struct tv v) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->names[i] == name) {
            tv_release(rt, s->vals[i]);
            s->vals[i] = v;
            return true;
        }
    if (s->n == s->cap) {
        uint32_t nc = s->cap * 2;
        struct tstr **nn = rt_alloc(rt, nc * sizeof *nn);
        struct tv *nv = nn ? rt_alloc(rt, nc * sizeof *nv) : NULL;
        if (!nv) {
            free(nn);
            tv_release(rt, v);
            return false;
        }
        memcpy(nn, s->names, s->n * sizeof *nn);
        memcpy(nv, s->vals, s->n * sizeof *nv);
        if (s->names != s->inl_names) {
            free(s->names);
            free(s->vals);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
    return true;
}

/* Borrowed value for name, or NULL. */
static struct tv *scope_find(struct scope *s, struct tstr *name) {
    for (; s; s = s->parent)
        for (uint32_t i = 0; i < s->n; i++)
            if (s->names[i] == name) return &s->vals[i];
    return NULL;
}

static bool lookup_name(struct rt *rt, struct scope *s, struct tstr *name, struct tv *out) {
    struct tv *v = scope_find(s, name);
    if (v) {
        *out = tv_retain(*v);
        return true;
    }
    if (rt->ctx && (v = tdict_get_str(rt->ctx, name->s, name->len))) {
        *out = tv_retain(*v);
        return true;
    }
    int g = tmpl_global_lookup(rt, name->s, name->len, out);
    if (g < 0) return false;
    if (g > 0) return true;
    *out = (struct tv){.kind = TV_UNDEF, .why = UND_NAME, .u.s = name};
    return true;
}

/* ---------------------------------------------------------------- forward decls */

static bool eval(struct rt *rt, struct scope *sc, const struct node *n, struct tv *out);
static int exec_body(struct rt *rt, struct scope *sc, struct node *const *body, uint32_t n,
                     struct sbuf *out);
static bool call_macro(struct rt *rt, struct tmacro *m, struct targs *a, struct tv *out);
static bool run_loop(struct rt *rt, struct scope *sc, const struct node *fn, struct tlist *items,
                     uint32_t depth0, struct sbuf *out);

/* Entering a nested expression or statement: bounded by the bytes of stack actually
 * used (frame sizes differ between builds: sanitizers make them several times larger). */
static bool enter(struct rt *rt) {
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    size_t used = rt->stack_base > here ? rt->stack_base - here : 0;
    if (++rt->cdepth > MAX_CDEPTH || used > rt->lim.max_stack) {
        rt->cdepth--;
        return rt_fail(rt, SMELT_ERR_RANGE, "template nested too deeply (%zu bytes of stack in use, limit %zu)",
                       used, rt->lim.max_stack);
    }
    return true;
}

/* ---------------------------------------------------------------- helpers */

static void targs_free(struct rt *rt, struct targs *a) {
    for (size_t i = 0; i < a->n_pos; i++) tv_release(rt, a->pos[i]);
    for (size_t i = 0; i < a->n_kw; i++) tv_release(rt, a->kwv[i]);
    free(a->pos);
    free(a->kwv);
    free(a->kwn);
    memset(a, 0, sizeof *a);
}

/* Evaluates the arguments of a call / filter / test node (positional, keywords, *a, **kw). */
static bool eval_args(struct rt *rt, struct scope *sc, const struct node *n, struct targs *a,
                      size_t extra_kw) {
    memset(a, 0, sizeof *a);
    struct tv star = tv_undef(), dstar = tv_undef();
    if (n->b && !eval(rt, sc, n->b, &star)) return false;
    if (n->c && !eval(rt, sc, n->c, &dstar)) {
        tv_release(rt, star);
        return false;
    }
    struct tlist *sl = NULL;
    if (n->b) {
        if (!tmpl_iter_list(rt, star, &sl)) goto fail;
    }
    if (n->c && dstar.kind != TV_DICT) {
        rt->node = n;
        rt_fail(rt, SMELT_ERR_INVALID, "argument after ** must be a mapping, not %s", tv_type_name(dstar));
        goto fail;
    }
    size_t npos = n->n_args + (sl ? sl->n : 0);
    size_t nkw = n->n_kw + (n->c ? dstar.u.d->n : 0) + extra_kw;
    a->pos = rt_alloc(rt, (npos ? npos : 1) * sizeof *a->pos);
    a->kwv = rt_alloc(rt, (nkw ? nkw : 1) * sizeof *a->kwv);
    a->kwn = rt_alloc(rt, (nkw ? nkw : 1) * sizeof *a->kwn);
    if (!a->pos || !a->kwv || !a->kwn) goto fail;
    for (uint32_t i = 0; i < n->n_args; i++) {
        if (!eval(rt, sc, n->args[i], &a->pos[a->n_pos])) goto fail;
        a->n_pos++;
    }
    if (sl)
        for (size_t i = 0; i < sl->n; i++) a->pos[a->n_pos++] = tv_retain(sl->v[i]);
    for (uint32_t i = 0; i < n->n_kw; i++) {
        if (!eval(rt, sc, n->kwvals[i], &a->kwv[a->n_kw])) goto fail;
        a->kwn[a->n_kw++] = n->kwnames[i];
    }
    if (n->c) {
        for (size_t i = 0; i < dstar.u.d->n; i++) {
            struct tv k = dstar.u.d->k[i];
            if (k.kind != TV_STR) {
                rt->node = n;
                rt_fail(rt, SMELT_ERR_INVALID, "keywords must be strings");
                goto fail;
            }
            a->kwn[a->n_kw] = k.u.s;
            a->kwv[a->n_kw++] = tv_retain(dstar.u.d->v[i]);
        }
    }
    if (sl) tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = sl});
    tv_release(rt, star);
    tv_release(rt, dstar);
    return true;
fail:
    if (sl) tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = sl});
    tv_release(rt, star);
    tv_release(rt, dstar);
    targs_free(rt, a);
    return false;
}

bool tmpl_iter_list(struct rt *rt, struct tv v, struct tlist **out) {
    struct tv l;
    switch (v.kind) {
    case TV_LIST:
    case TV_TUPLE:
        v.u.l->h.rc != RC_FROZEN ? v.u.l->h.rc++ : 0;
        *out = v.u.l;
        return true;
    case TV_UNDEF:
    case TV_DICT:
    case TV_STR: {
        size_t n = v.kind == TV_UNDEF ? 0 : v.kind == TV_DICT ? v.u.d->n : v.u.s->ncp;
        if (!tv_new_list(rt, n, &l)) return false;
        if (v.kind == TV_DICT) {
            for (size_t i = 0; i < v.u.d->n; i++) l.u.l->v[l.u.l->n++] = tv_retain(v.u.d->k[i]);
        } else if (v.kind == TV_STR) {
            size_t i = 0, len = v.u.s->len;
            const char *s = v.u.s->s;
            while (i < len) {
                size_t st = i;
                if ((unsigned char)s[i] < 0x80) i++;
                else utf8_next(s, len, &i);
                struct tv c;
                if (!tv_new_str(rt, s + st, i - st, &c)) {
                    tv_release(rt, l);
                    return false;
                }
                l.u.l->v[l.u.l->n++] = c;
            }
        }
        *out = l.u.l;
        return true;
    }
    default:
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object is not iterable", tv_type_name(v));
    }
}

/* Python's slice index adjustment; returns the slice length. */
static size_t slice_indices(int64_t len, bool has_start, int64_t start, bool has_stop,
                            int64_t stop, int64_t step, int64_t *ostart) {
    if (!has_start) start = step < 0 ? len - 1 : 0;
    else if (start < 0) {
        start += len;
        if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= len) start = step < 0 ? len - 1 : len;
    if (!has_stop) stop = step < 0 ? -1 : len;
    else if (stop < 0) {
        stop += len;
        if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= len) stop = step < 0 ? len - 1 : len;
    *ostart = start;
    if (step < 0) return stop < start ? (size_t)((start - stop - 1) / (-step) + 1) : 0;
    return start < stop ? (size_t)((stop - start - 1) / step + 1) : 0;
}

static bool slice_bound(struct tv v, bool *has, int64_t *x) {
    if (v.kind == TV_NONE) {
        *has = false;
        return true;
    }
    if (v.kind == TV_INT) *x = v.u.i;
    else if (v.kind == TV_BOOL) *x = v.u.b;
    else return false;
    *has = true;
    return true;
}

/* obj[a:b:c]: jinja2 compiles slices to a plain Python subscript (not environment.getitem),
 * so anything but str / list / tuple raises. */
static bool do_slice(struct rt *rt, struct scope *sc, struct tv obj, const struct node *sl,
                     struct tv *out) {
    struct tv b[3] = {tv_none(), tv_none(), tv_none()};
    const struct node *bn[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++)
        if (bn[i] && !eval(rt, sc, bn[i], &b[i])) {
            for (int j = 0; j < i; j++) tv_release(rt, b[j]);
            return false;
        }
    rt->node = sl;
    bool hs = false, he = false, hp = false;
    int64_t s = 0, e = 0, p = 1;
    bool ok_idx = slice_bound(b[0], &hs, &s) && slice_bound(b[1], &he, &e) && slice_bound(b[2], &hp, &p);
    for (int i = 0; i < 3; i++) tv_release(rt, b[i]);
    if (obj.kind == TV_UNDEF) return rt_undef_error(rt, obj);
    if (obj.kind == TV_DICT) return rt_fail(rt, SMELT_ERR_INVALID, "unhashable type: 'slice'");
    if (!(obj.kind == TV_STR || (tv_is_seq(obj) && !obj.aux)))
        return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object is not subscriptable", tv_type_name(obj));
    if (!ok_idx)
        return rt_fail(rt, SMELT_ERR_INVALID, "slice indices must be integers or None or have an __index__ method");
    if (!hp) p = 1;
    if (p == 0) return rt_fail(rt, SMELT_ERR_INVALID, "slice step cannot be zero");
    if (p == INT64_MIN) p = -INT64_MAX;
    int64_t start;
    if (obj.kind == TV_STR) {
        struct tstr *str = obj.u.s;
        size_t n = slice_indices((int64_t)str->ncp, hs, s, he, e, p, &start);
        if (str->ncp == str->len) {
            if (p == 1) return tv_new_str(rt, str->s + start, n, out);
            char *buf = rt_alloc(rt, n + 1);
            if (!buf) return false;
            for (size_t i = 0; i < n; i++) buf[i] = str->s[start + (int64_t)i * p];
            bool ok = tv_new_str(rt, buf, n, out);
            free(buf);
            return ok;
        }
        /* non-ASCII: index code points */
        size_t *offs = rt_alloc(rt, (str->ncp + 1) * sizeof *offs);
        if (!offs) return false;
        size_t i = 0, k = 0;
        while (i < str->len) {
            offs[k++] = i;
            utf8_next(str->s, str->len, &i);
        }
        offs[k] = str->len;
        struct sbuf sb = {.rt = rt, .limit = rt->lim.max_output};
        bool ok = true;
        for (size_t j = 0; j < n && ok; j++) {
            size_t c = (size_t)(start + (int64_t)j * p);
            ok = sb_put(&sb, str->s + offs[c], offs[c + 1] - offs[c]);
        }
        free(offs);
        if (!ok) {
            sb_free(&sb);
            return false;
        }
        return sb_to_tv(&sb, out);
    }
    struct tlist *l = obj.u.l;
    size_t n = slice_indices((int64_t)l->n, hs, s, he, e, p, &start);
    if (!tv_new_list(rt, n, out)) return false;
    out->kind = obj.kind;
    for (size_t j = 0; j < n; j++) out->u.l->v[out->u.l->n++] = tv_retain(l->v[start + (int64_t)j * p]);
    return true;
}

/* ---------------------------------------------------------------- attribute / item */

static bool loop_attr(struct rt *rt, struct tloop *lp, struct tv self, const char *a,
                      struct tv *out, bool *found) {
    size_t len = lp->items->n, i = lp->i;
    *found = true;
    if (!strcmp(a, "index")) *out = tv_int((int64_t)i + 1);
    else if (!strcmp(a, "index0")) *out = tv_int((int64_t)i);
    else if (!strcmp(a, "revindex")) *out = tv_int((int64_t)(len - i));
    else if (!strcmp(a, "revindex0")) *out = tv_int((int64_t)(len - i - 1));
    else if (!strcmp(a, "first")) *out = tv_bool(i == 0);
    else if (!strcmp(a, "last")) *out = tv_bool(i + 1 == len);
    else if (!strcmp(a, "length")) *out = tv_int((int64_t)len);
    else if (!strcmp(a, "depth")) *out = tv_int((int64_t)lp->depth0 + 1);
    else if (!strcmp(a, "depth0")) *out = tv_int((int64_t)lp->depth0);
    else if (!strcmp(a, "previtem")) {
        if (i > 0) *out = tv_retain(lp->items->v[i - 1]);
        else *out = (struct tv){.kind = TV_UNDEF, .why = UND_NAME};
    } else if (!strcmp(a, "nextitem")) {
        if (i + 1 < len) *out = tv_retain(lp->items->v[i + 1]);
        else *out = (struct tv){.kind = TV_UNDEF, .why = UND_NAME};
    } else {
        int r = tmpl_method_lookup(rt, self, a, strlen(a), out); /* cycle, changed */
        if (r < 0) return false;
        *found = r > 0;
    }
    return true;
}

static bool getattr_(struct rt *rt, struct tv obj, struct tstr *name, struct tv *out);

bool tmpl_getattr(struct rt *rt, struct tv obj, struct tstr *name, struct tv *out) {
    *out = tv_undef();
    bool ok = getattr_(rt, obj, name, out);
    if (!ok) *out = tv_undef();
    return ok;
}

static bool getattr_(struct rt *rt, struct tv obj, struct tstr *name, struct tv *out) {
    struct tv *v;
    switch (obj.kind) {
    case TV_UNDEF: return rt_undef_error(rt, obj);
    case TV_NS:
        if ((v = tdict_get_str(obj.u.d, name->s, name->len))) {
            *out = tv_retain(*v);
            return true;
        }
        break;
    case TV_DICT: {
        int r = tmpl_method_lookup(rt, obj, name->s, name->len, out);
        if (r) return r > 0;
        if ((v = tdict_get_str(obj.u.d, name->s, name->len))) {
            *out = tv_retain(*v);
            return true;
        }
        break;
    }
    case TV_LOOP: {
        bool found;
        if (!loop_attr(rt, obj.u.lp, obj, name->s, out, &found)) return false;
        if (found) return true;
        break;
    }
    default: {
        int r = tmpl_method_lookup(rt, obj, name->s, name->len, out);
        if (r < 0) return false;
        if (r > 0) return true;
        break;
    }
    }
    *out = (struct tv){.kind = TV_UNDEF, .why = UND_ATTR, .aux = obj.kind, .u.s = tv_retain((struct tv){.kind = TV_STR, .u.s = name}).u.s};
    return true;
}

static bool getitem_(struct rt *rt, struct tv obj, struct tv key, struct tv *out);

bool tmpl_getitem(struct rt *rt, struct tv obj, struct tv key, struct tv *out) {
    *out = tv_undef();
    bool ok = getitem_(rt, obj, key, out);
    if (!ok) *out = tv_undef();
    return ok;
}

static bool getitem_(struct rt *rt, struct tv obj, struct tv key, struct tv *out) {
    if (obj.kind == TV_UNDEF) return rt_undef_error(rt, obj);
    struct tv *v;
    if (obj.kind == TV_DICT) {
        if ((v = tdict_get(obj.u.d, key))) {
            *out = tv_retain(*v);
            return true;
        }
    } else if (((tv_is_seq(obj) && !obj.aux) || obj.kind == TV_STR) && (key.kind == TV_INT || key.kind == TV_BOOL)) {
        int64_t i = key.kind == TV_INT ? key.u.i : key.u.b;
        size_t n = obj.kind == TV_STR ? obj.u.s->ncp : obj.u.l->n;
        if (i < 0) i += (int64_t)n;
        if (i >= 0 && (uint64_t)i < n) {
            if (obj.kind != TV_STR) {
                *out = tv_retain(obj.u.l->v[i]);
                return true;
            }
            size_t off = tstr_offset(obj.u.s, (size_t)i), end = off;
            utf8_next(obj.u.s->s, obj.u.s->len, &end);
            return tv_new_str(rt, obj.u.s->s + off, end - off, out);
        }
    }
    if (key.kind == TV_STR && obj.kind != TV_DICT) return tmpl_getattr(rt, obj, key.u.s, out);
    if (key.kind == TV_STR && obj.kind == TV_DICT) {
        int r = tmpl_method_lookup(rt, obj, key.u.s->s, key.u.s->len, out);
        if (r) return r > 0;
        *out = (struct tv){.kind = TV_UNDEF, .why = UND_ATTR, .aux = obj.kind, .u.s = tv_retain(key).u.s};
        return true;
    }
    /* an undefined that remembers the key's repr, for the error message */
    struct sbuf b = {.rt = rt, .limit = 1 << 16};
    struct tv ks = tv_undef();
    if (!tv_repr(rt, &b, key) || !sb_to_tv(&b, &ks)) {
        sb_free(&b);
        return false;
    }
    *out = (struct tv){.kind = TV_UNDEF, .why = UND_ITEM, .aux = obj.kind, .u.s = ks.u.s};
    return true;
}

/* ---------------------------------------------------------------- operators */

static bool is_intlike(struct tv v) { return v.kind == TV_INT || v.kind == TV_BOOL; }
static int64_t as_int(struct tv v) { return v.kind == TV_INT ? v.u.i : v.u.b; }
static double as_f(struct tv v) { return v.kind == TV_FLOAT ? v.u.f : (double)as_int(v); }

static bool op_type_error(struct rt *rt, const char *op, struct tv a, struct tv b) {
    return rt_fail(rt, SMELT_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   tv_type_name(a), tv_type_name(b));
}

static bool int_overflow(struct rt *rt) {
    return rt_fail(rt, SMELT_ERR_RANGE, "integer overflow (this engine's integers are 64-bit)");
}

static bool html_escape_to(struct sbuf *b, const char *s, size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *r = NULL;
        switch (s[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        default: continue;
        }
        if (!sb_put(b, s + run, i - run) || !sb_puts(b, r)) return false;
        run = i + 1;
    }
    return sb_put(b, s + run, n - run);
}

bool tmpl_html_escape(struct rt *rt, struct tv v, struct tv *out) {
    if (v.kind == TV_STR && v.safe) {
        *out = tv_retain(v);
        return true;
    }
    struct tv s;
    if (!tv_to_str(rt, v, &s)) return false;
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    bool ok = html_escape_to(&b, s.u.s->s, s.u.s->len);
    tv_release(rt, s);
    if (!ok || !sb_to_tv(&b, out)) {
        sb_free(&b);
        return false;
    }
    out->safe = 1;
    return true;
}

static bool str_concat(struct rt *rt, struct tv a, struct tv b, struct tv *out) {
    /* Markup + str escapes the str side (markupsafe), the result stays Markup */
    bool safe = a.safe || b.safe;
    struct tv ea = tv_undef(), eb = tv_undef();
    if (safe && !a.safe && !tmpl_html_escape(rt, a, &ea)) return false;
    if (safe && !b.safe && !tmpl_html_escape(rt, b, &eb)) {
        tv_release(rt, ea);
        return false;
    }
    struct tstr *x = ea.kind == TV_STR ? ea.u.s : a.u.s, *y = eb.kind == TV_STR ? eb.u.s : b.u.s;
    size_t n;
    bool ok = false;
    if (ckd_add_size(&n, x->len, y->len)) {
        rt_fail(rt, SMELT_ERR_RANGE, "string too long");
    } else {
        struct sbuf sb = {.rt = rt, .limit = rt->lim.max_output};
        ok = sb_put(&sb, x->s, x->len) && sb_put(&sb, y->s, y->len) && sb_to_tv(&sb, out);
        if (!ok) sb_free(&sb);
        else out->safe = safe;
    }
    tv_release(rt, ea);
    tv_release(rt, eb);
    return ok;
}

static bool seq_concat(struct rt *rt, struct tv a, struct tv b, struct tv *out) {
    size_t n;
    if (ckd_add_size(&n, a.u.l->n, b.u.l->n)) return rt_fail(rt, SMELT_ERR_RANGE, "list too long");
    if (!tv_new_list(rt, n, out)) return false;
    out->kind = a.kind;
    for (size_t i = 0; i < a.u.l->n; i++) out->u.l->v[out->u.l->n++] = tv_retain(a.u.l->v[i]);
    for (size_t i = 0; i < b.u.l->n; i++) out->u.l->v[out->u.l->n++] = tv_retain(b.u.l->v[i]);
    return true;
}

static bool repeat(struct rt *rt, struct tv seq, int64_t times, struct tv *out) {
    if (times < 0) times = 0;
    if (seq.kind == TV_STR) {
        size_t n;
        if (ckd_mul_size(&n, seq.u.s->len, (size_t)times) || n > rt->lim.max_output)
            return rt_fail(rt, SMELT_ERR_RANGE, "string repetition result exceeds the output limit (%zu bytes)",
                           rt->lim.max_output);
        struct sbuf sb = {.rt = rt, .limit = rt->lim.max_output};
        for (int64_t i = 0; i < times; i++)
            if (!sb_put(&sb, seq.u.s->s, seq.u.s->len)) {
                sb_free(&sb);
                return false;
            }
        if (!sb_to_tv(&sb, out)) return false;
        out->safe = seq.safe;
        return true;
    }
    size_t n;
    if (ckd_mul_size(&n, seq.u.l->n, (size_t)times) || n > (1u << 24))
        return rt_fail(rt, SMELT_ERR_RANGE, "list repetition result too long");
    if (!tv_new_list(rt, n, out)) return false;
    out->kind = seq.kind;
    for (int64_t t = 0; t < times; t++)
        for (size_t i = 0; i < seq.u.l->n; i++) out->u.l->v[out->u.l->n++] = tv_retain(seq.u.l->v[i]);
    return true;
}

/* Python float // and %. */
static void float_divmod(double vx, double wx, double *fdiv, double *fmod_) {
    double mod = fmod(vx, wx), div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, wx);
    }
    double fl;
    if (div) {
        fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
    } else {
        fl = copysign(0.0, vx / wx);
    }
    *fdiv = fl;
    *fmod_ = mod;
}

static bool binop(struct rt *rt, int op, struct tv a, struct tv b, struct tv *out) {
    if (a.kind == TV_UNDEF) return rt_undef_error(rt, a);
    if (op == T_MOD && a.kind == TV_STR) return tmpl_percent_format(rt, a, b, out); /* str % Undefined works */
    if (b.kind == TV_UNDEF) return rt_undef_error(rt, b);
    bool num = tv_is_num(a) && tv_is_num(b), ints = is_intlike(a) && is_intlike(b);
    switch (op) {
    case T_ADD:
        if (ints) {
            int64_t r;
            if (ckd_add_i64(&r, as_int(a), as_int(b))) return int_overflow(rt);
            *out = tv_int(r);
            return true;
        }
        if (num) {
            *out = tv_float(as_f(a) + as_f(b));
            return true;
        }
        if (a.kind == TV_STR && b.kind == TV_STR) return str_concat(rt, a, b, out);
        if (tv_is_seq(a) && a.kind == b.kind && !a.aux && !b.aux) return seq_concat(rt, a, b, out);
        if (a.kind == TV_STR || a.kind == TV_LIST || a.kind == TV_TUPLE)
            return rt_fail(rt, SMELT_ERR_INVALID, "can only concatenate %s (not \"%s\") to %s",
                           tv_type_name(a), tv_type_name(b), tv_type_name(a));
        return op_type_error(rt, "+", a, b);
    case T_SUB:
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) return int_overflow(rt);
            *out = tv_int(r);
            return true;
        }
        if (num) {
            *out = tv_float(as_f(a) - as_f(b));
            return true;
        }
        return op_type_error(rt, "-", a, b);
    case T_MUL:
        if (ints) {
            int64_t r;
            if (ckd_mul_i64(&r, as_int(a), as_int(b))) return int_overflow(rt);
            *out = tv_int(r);
            return true;
        }
        if (num) {
            *out = tv_float(as_f(a) * as_f(b));
            return true;
        }
        if ((a.kind == TV_STR || (tv_is_seq(a) && !a.aux)) && is_intlike(b)) return repeat(rt, a, as_int(b), out);
        if ((b.kind == TV_STR || (tv_is_seq(b) && !b.aux)) && is_intlike(a)) return repeat(rt, b, as_int(a), out);
        if (a.kind == TV_STR || b.kind == TV_STR || tv_is_seq(a) || tv_is_seq(b))
            return rt_fail(rt, SMELT_ERR_INVALID, "can't multiply sequence by non-int of type '%s'",
                           tv_type_name(tv_is_num(a) ? a : b));
        return op_type_error(rt, "*", a, b);
    case T_DIV:
        if (!num) return op_type_error(rt, "/", a, b);
        if (as_f(b) == 0) return rt_fail(rt, SMELT_ERR_INVALID, "division by zero");
        *out = tv_float(as_f(a) / as_f(b));
        return true;
    case T_FLOORDIV:
    case T_MOD:
        if (op == T_MOD && a.kind == TV_STR) return tmpl_percent_format(rt, a, b, out);
        if (!num) return op_type_error(rt, op == T_MOD ? "%" : "//", a, b);
        if (ints) {
            int64_t x = as_int(a), y = as_int(b);
            if (y == 0) return rt_fail(rt, SMELT_ERR_INVALID, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == T_MOD) *out = tv_int(0);
                else return int_overflow(rt);
                return true;
            }
            int64_t q = x / y, r = x % y;
            if (r && ((r < 0) != (y < 0))) {
                q--;
                r += y;
            }
            *out = tv_int(op == T_MOD ? r : q);
            return true;
        }
        if (as_f(b) == 0) return rt_fail(rt, SMELT_ERR_INVALID, op == T_MOD ? "float modulo" : "float floor division by zero");
        {
            double d, m;
            float_divmod(as_f(a), as_f(b), &d, &m);
            *out = tv_float(op == T_MOD ? m : d);
        }
        return true;
    case T_POW:
        if (!num) return op_type_error(rt, "** or pow()", a, b);
        if (ints && as_int(b) >= 0) {
            int64_t base = as_int(a), e = as_int(b), r = 1;
            while (e > 0) {
                if (e & 1) {
                    if (ckd_mul_i64(&r, r, base)) return int_overflow(rt);
                }
                e >>= 1;
                if (e && ckd_mul_i64(&base, base, base)) return int_overflow(rt);
            }
            *out = tv_int(r);
            return true;
        }
        if (as_f(a) == 0 && as_f(b) < 0)
            return rt_fail(rt, SMELT_ERR_INVALID, "0.0 cannot be raised to a negative power");
        *out = tv_float(pow(as_f(a), as_f(b)));
        return true;
    }
    return rt_fail(rt, SMELT_ERR_INTERNAL, "unknown operator");
}

bool tmpl_add(struct rt *rt, struct tv a, struct tv b, struct tv *out) { return binop(rt, T_ADD, a, b, out); }

static bool contains(struct rt *rt, struct tv item, struct tv seq, bool *out) {
    switch (seq.kind) {
    case TV_UNDEF: *out = false; return true;
    case TV_STR:
        if (item.kind == TV_UNDEF) return rt_undef_error(rt, item);
        if (item.kind != TV_STR)
            return rt_fail(rt, SMELT_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                           tv_type_name(item));
        *out = item.u.s->len == 0 || memmem(seq.u.s->s, seq.u.s->len, item.u.s->s, item.u.s->len) != NULL;
        return true;
    case TV_LIST:
    case TV_TUPLE:
        *out = false;
        for (size_t i = 0; i < seq.u.l->n && !*out; i++) *out = tv_eq(seq.u.l->v[i], item);
        return true;
    case TV_DICT:
        if (item.kind == TV_LIST || item.kind == TV_DICT || item.kind == TV_NS)
            return rt_fail(rt, SMELT_ERR_INVALID, "unhashable type: '%s'", tv_type_name(item));
        *out = tdict_get(seq.u.d, item) != NULL;
        return true;
    default:
        return rt_fail(rt, SMELT_ERR_INVALID, "argument of type '%s' is not iterable", tv_type_name(seq));
    }
}

static bool compare(struct rt *rt, int op, struct tv a, struct tv b, bool *out) {
    int c;
    switch (op) {
    case T_EQ: *out = tv_eq(a, b); return true;
    case T_NE: *out = !tv_eq(a, b); return true;
    case CMP_IN: return contains(rt, a, b, out);
    case CMP_NOTIN:
        if (!contains(rt, a, b, out)) return false;
        *out = !*out;
        return true;
    default:
        if (!tv_cmp(rt, a, b, &c)) return false;
        /* NaN: every ordering comparison is false */
        if ((a.kind == TV_FLOAT && isnan(a.u.f)) || (b.kind == TV_FLOAT && isnan(b.u.f))) {
            *out = false;
            return true;
        }
        *out = op == T_LT ? c < 0 : op == T_LTEQ ? c <= 0 : op == T_GT ? c > 0 : c >= 0;
        return true;
    }
}

bool tmpl_compare_op(struct rt *rt, int op, struct tv a, struct tv b, bool *out) {
    return compare(rt, op, a, b, out);
}

/* ---------------------------------------------------------------- expressions */

static __attribute__((noinline)) bool eval_call(struct rt *rt, struct scope *sc, const struct node *n,
                                                struct tv extra_caller, struct tv *out) {
    struct tv callee;
    if (!eval(rt, sc, n->a, &callee)) return false;
    struct targs a;
    if (!eval_args(rt, sc, n, &a, extra_caller.kind != TV_UNDEF)) {
        tv_release(rt, callee);
        return false;
    }
    if (extra_caller.kind != TV_UNDEF) {
        a.kwn[a.n_kw] = rt->t->s_caller;
        a.kwv[a.n_kw++] = tv_retain(extra_caller);
    }
    rt->node = n;
    bool ok = tmpl_call_value(rt, callee, &a, out);
    targs_free(rt, &a);
    tv_release(rt, callee);
    return ok;
}

/* Applies filter node f to `in` (borrowed). */
static __attribute__((noinline)) bool apply_filter_node(struct rt *rt, struct scope *sc,
                                                        const struct node *f, struct tv in,
                                                        struct tv *out) {
    struct targs a;
    if (!eval_args(rt, sc, f, &a, 0)) return false;
    rt->node = f;
    bool ok = tmpl_apply_filter(rt, f->fid, in, &a, out);
    targs_free(rt, &a);
    return ok;
}

/* A filter chain whose innermost input (a == NULL) is `in`. */
static bool filter_chain(struct rt *rt, struct scope *sc, const struct node *f, struct tv in,
                         struct tv *out) {
    struct tv base;
    if (f->a) {
        if (!filter_chain(rt, sc, f->a, in, &base)) return false;
    } else {
        base = tv_retain(in);
    }
    bool ok = apply_filter_node(rt, sc, f, base, out);
    tv_release(rt, base);
    return ok;
}

static __attribute__((noinline)) bool eval_test(struct rt *rt, struct scope *sc, const struct node *n,
                                                struct tv *out) {
    struct tv x;
    if (!eval(rt, sc, n->a, &x)) return false;
    struct targs a;
    if (!eval_args(rt, sc, n, &a, 0)) {
        tv_release(rt, x);
        return false;
    }
    rt->node = n;
    bool r = false, ok = tmpl_apply_test(rt, n->fid, x, &a, &r);
    targs_free(rt, &a);
    tv_release(rt, x);
    if (ok) *out = tv_bool(r);
    return ok;
}

static __attribute__((noinline)) bool eval_collection(struct rt *rt, struct scope *sc,
                                                      const struct node *n, struct tv *out) {
    if (n->kind == N_DICT) {
        if (!tv_new_dict(rt, out)) return false;
        for (uint32_t i = 0; i < n->n_args; i++) {
            struct tv k, v;
            if (!eval(rt, sc, n->args[i], &k)) goto fail;
            if (!eval(rt, sc, n->args2[i], &v)) {
                tv_release(rt, k);
                goto fail;
            }
            rt->node = n;
            bool ok = tdict_set(rt, out->u.d, k, v);
            tv_release(rt, k);
            tv_release(rt, v);
            if (!ok) goto fail;
        }
        return true;
    }
    if (!tv_new_list(rt, n->n_args, out)) return false;
    out->kind = n->kind == N_TUPLE ? TV_TUPLE : TV_LIST;
    for (uint32_t i = 0; i < n->n_args; i++) {
        if (!eval(rt, sc, n->args[i], &out->u.l->v[out->u.l->n])) goto fail;
        out->u.l->n++;
    }
    return true;
fail:
    tv_release(rt, *out);
    return false;
}

static __attribute__((noinline)) bool eval_concat(struct rt *rt, struct scope *sc, const struct node *n,
                                                  struct tv *out) {
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    for (uint32_t i = 0; i < n->n_args; i++) {
        struct tv v;
        if (!eval(rt, sc, n->args[i], &v)) goto fail;
        bool ok = tv_str(rt, &b, v);
        tv_release(rt, v);
        if (!ok) goto fail;
    }
    return sb_to_tv(&b, out);
fail:
    sb_free(&b);
    return false;
}

static __attribute__((noinline)) bool eval_compare(struct rt *rt, struct scope *sc, const struct node *n,
                                                   struct tv *out) {
    struct tv left;
    if (!eval(rt, sc, n->a, &left)) return false;
    bool r = true;
    for (uint32_t i = 0; i < n->n_args && r; i++) {
        struct tv right;
        if (!eval(rt, sc, n->args[i], &right)) {
            tv_release(rt, left);
            return false;
        }
        rt->node = n;
        bool ok = compare(rt, n->ops[i], left, right, &r);
        tv_release(rt, left);
        left = right;
        if (!ok) {
            tv_release(rt, left);
            return false;
        }
    }
    tv_release(rt, left);
    *out = tv_bool(r);
    return true;
}

static bool eval(struct rt *rt, struct scope *sc, const struct node *n, struct tv *out) {
    if (!enter(rt)) return false;
    rt->node = n;
    bool ok = rt_step(rt, 1);
    struct tv a = tv_undef(), b = tv_undef();
    if (!ok) goto done;
    switch (n->kind) {
    case N_CONST: *out = tv_retain(n->v); break;
    case N_NAME: ok = lookup_name(rt, sc, n->s, out); break;
    case N_LIST:
    case N_TUPLE:
    case N_DICT: ok = eval_collection(rt, sc, n, out); break;
    case N_GETATTR:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        rt->node = n;
        ok = tmpl_getattr(rt, a, n->s, out);
        break;
    case N_GETITEM:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        if (n->b->kind == N_SLICE) {
            ok = do_slice(rt, sc, a, n->b, out);
            break;
        }
        if (!(ok = eval(rt, sc, n->b, &b))) break;
        rt->node = n;
        ok = tmpl_getitem(rt, a, b, out);
        break;
    case N_CALL: ok = eval_call(rt, sc, n, tv_undef(), out); break;
    case N_FILTER:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        ok = apply_filter_node(rt, sc, n, a, out);
        break;
    case N_TEST: ok = eval_test(rt, sc, n, out); break;
    case N_NOT:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        *out = tv_bool(!tv_truthy(a));
        break;
    case N_NEG:
    case N_POS:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        rt->node = n;
        if (a.kind == TV_UNDEF) ok = rt_undef_error(rt, a);
        else if (a.kind == TV_FLOAT) *out = tv_float(n->kind == N_NEG ? -a.u.f : a.u.f);
        else if (is_intlike(a)) {
            if (n->kind == N_NEG && as_int(a) == INT64_MIN) ok = int_overflow(rt);
            else *out = tv_int(n->kind == N_NEG ? -as_int(a) : as_int(a));
        } else {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "bad operand type for unary %c: '%s'",
                         n->kind == N_NEG ? '-' : '+', tv_type_name(a));
        }
        break;
    case N_BINOP:
        if (!(ok = eval(rt, sc, n->a, &a)) || !(ok = eval(rt, sc, n->b, &b))) break;
        rt->node = n;
        ok = binop(rt, n->op, a, b, out);
        break;
    case N_AND:
    case N_OR:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        if (tv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            a = tv_undef();
        } else {
            ok = eval(rt, sc, n->b, out);
        }
        break;
    case N_CONCAT: ok = eval_concat(rt, sc, n, out); break;
    case N_COMPARE: ok = eval_compare(rt, sc, n, out); break;
    case N_CONDEXPR:
        if (!(ok = eval(rt, sc, n->a, &a))) break;
        if (tv_truthy(a)) ok = eval(rt, sc, n->b, out);
        else if (n->c) ok = eval(rt, sc, n->c, out);
        else *out = (struct tv){.kind = TV_UNDEF, .why = UND_CONDEXPR, .line = n->line};
        break;
    case N_NSREF:
        ok = rt_fail(rt, SMELT_ERR_INVALID, "namespace reference used as a value");
        break;
    case N_SLICE: ok = rt_fail(rt, SMELT_ERR_INVALID, "slice used outside a subscript"); break;
    default: ok = rt_fail(rt, SMELT_ERR_INTERNAL, "unexpected node kind %d in an expression", n->kind);
    }
done:
    tv_release(rt, a);
    tv_release(rt, b);
    rt->cdepth--;
    if (!ok) *out = tv_undef(); /* contract: on failure the caller holds nothing */
    return ok;
}

/* ---------------------------------------------------------------- calls */

static bool call_value(struct rt *rt, struct tv callee, struct targs *a, struct tv *out);

bool tmpl_call_value(struct rt *rt, struct tv callee, struct targs *a, struct tv *out) {
    *out = tv_undef();
    bool ok = call_value(rt, callee, a, out);
    if (!ok) *out = tv_undef();
    return ok;
}

static bool call_value(struct rt *rt, struct tv callee, struct targs *a, struct tv *out) {
    switch (callee.kind) {
    case TV_FUNC: return tmpl_call_builtin(rt, callee.u.fn, a, out);
    case TV_MACRO: return call_macro(rt, callee.u.m, a, out);
    case TV_LOOP: {
        struct tloop *lp = callee.u.lp;
        if (!lp->fornode || !lp->fornode->flag)
            return rt_fail(rt, SMELT_ERR_INVALID, "the loop must be marked recursive to be called recursively");
        if (a->n_pos != 1 || a->n_kw)
            return rt_fail(rt, SMELT_ERR_INVALID, "loop() takes exactly one argument");
        if (rt->depth >= rt->lim.max_depth)
            return rt_fail(rt, SMELT_ERR_RANGE, "recursive loop nested too deeply (limit %u)", rt->lim.max_depth);
        struct tlist *items;
        if (!tmpl_iter_list(rt, a->pos[0], &items)) return false;
        struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
        rt->depth++;
        bool ok = run_loop(rt, lp->outer, lp->fornode, items, lp->depth0 + 1, &b);
        rt->depth--;
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
        if (!ok) {
            sb_free(&b);
            return false;
        }
        return sb_to_tv(&b, out);
    }
    case TV_UNDEF: return rt_undef_error(rt, callee);
    default: return rt_fail(rt, SMELT_ERR_INVALID, "'%s' object is not callable", tv_type_name(callee));
    }
}

static bool call_macro(struct rt *rt, struct tmacro *m, struct targs *a, struct tv *out) {
    const struct node *d = m->def;
    const char *mname = d->kind == N_MACRO ? d->s->s : "caller";
    if (rt->depth >= rt->lim.max_depth)
        return rt_fail(rt, SMELT_ERR_RANGE, "macro '%s': calls nested too deeply (limit %u)", mname, rt->lim.max_depth);
    uint32_t np = d->n_args;
    if (a->n_pos > np && !(d->uses & USES_VARARGS))
        return rt_fail(rt, SMELT_ERR_INVALID, "macro '%s' takes not more than %u argument(s)", mname, np);
    struct scope *s = scope_new(rt, m->closure);
    if (!s) return false;
    struct tv kwd = tv_undef(), caller = tv_undef();
    bool ok = true;
    bool *bound = NULL;
    if (np) {
        bound = calloc(np, sizeof *bound);
        if (!bound) {
            ok = rt_fail(rt, SMELT_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    for (uint32_t i = 0; i < np && i < a->n_pos; i++) {
        if (!(ok = scope_set(rt, s, d->args[i]->s, tv_retain(a->pos[i])))) goto done;
        bound[i] = true;
    }
    if (d->uses & USES_KWARGS && !(ok = tv_new_dict(rt, &kwd))) goto done;
    for (size_t k = 0; k < a->n_kw; k++) {
        struct tstr *kn = a->kwn[k];
        uint32_t j = 0;
        for (; j < np; j++)
            if (d->args[j]->s == kn || (d->args[j]->s->len == kn->len && !memcmp(d->args[j]->s->s, kn->s, kn->len)))
                break;
        if (j < np) {
            if (bound[j]) {
                ok = rt_fail(rt, SMELT_ERR_INVALID, "macro '%s' got multiple values for argument '%s'", mname, kn->s);
                goto done;
            }
            if (!(ok = scope_set(rt, s, d->args[j]->s, tv_retain(a->kwv[k])))) goto done;
            bound[j] = true;
        } else if (kn->len == 6 && !memcmp(kn->s, "caller", 6) && (d->uses & USES_CALLER)) {
            tv_release(rt, caller);
            caller = tv_retain(a->kwv[k]);
        } else if (d->uses & USES_KWARGS) {
            if (!(ok = tdict_set(rt, kwd.u.d, (struct tv){.kind = TV_STR, .u.s = kn}, a->kwv[k]))) goto done;
        } else {
            ok = rt_fail(rt, SMELT_ERR_INVALID, "macro '%s' takes no keyword argument '%s'", mname, kn->s);
            goto done;
        }
    }
    for (uint32_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        struct tv v;
        if (d->args2 && d->args2[i]) {
            if (!(ok = eval(rt, s, d->args2[i], &v))) goto done;
        } else {
            v = (struct tv){.kind = TV_UNDEF, .why = UND_PARAM, .u.s = d->args[i]->s};
        }
        if (!(ok = scope_set(rt, s, d->args[i]->s, v))) goto done;
    }
    if (d->uses & USES_VARARGS) {
        struct tv va;
        size_t extra = a->n_pos > np ? a->n_pos - np : 0;
        if (!(ok = tv_new_list(rt, extra, &va))) goto done;
        va.kind = TV_TUPLE;
        for (size_t i = np; i < a->n_pos; i++) va.u.l->v[va.u.l->n++] = tv_retain(a->pos[i]);
        if (!(ok = scope_set(rt, s, rt->t->s_varargs, va))) goto done;
    }
    if (d->uses & USES_KWARGS) {
        ok = scope_set(rt, s, rt->t->s_kwargs, kwd);
        kwd = tv_undef();
        if (!ok) goto done;
    }
    if (d->uses & USES_CALLER) {
        if (caller.kind == TV_UNDEF) caller = (struct tv){.kind = TV_UNDEF, .why = UND_NAME, .u.s = rt->t->s_caller};
        ok = scope_set(rt, s, rt->t->s_caller, caller);
        caller = tv_undef();
        if (!ok) goto done;
    }
    {
        struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
        rt->depth++;
        int r = exec_body(rt, s, d->body, d->n_body, &b);
        rt->depth--;
        if (r == X_ERR) {
            sb_free(&b);
            ok = false;
        } else {
            ok = sb_to_tv(&b, out);
        }
    }
done:
    free(bound);
    tv_release(rt, kwd);
    tv_release(rt, caller);
    scope_pop(rt, s);
    return ok;
}

/* ---------------------------------------------------------------- statements */

/* Binds target (N_NAME / N_TUPLE / N_NSREF) to v (taking ownership). */
static bool assign(struct rt *rt, struct scope *sc, const struct node *t, struct tv v) {
    if (t->kind == N_NAME) return scope_set(rt, sc, t->s, v);
    if (t->kind == N_NSREF) {
        struct tv *ns = scope_find(sc, t->s);
        if (!ns && rt->ctx) ns = tdict_get_str(rt->ctx, t->s->s, t->s->len);
        rt->node = t;
        if (!ns || ns->kind != TV_NS) {
            tv_release(rt, v);
            return rt_fail(rt, SMELT_ERR_INVALID, "cannot assign attribute on non-namespace object ('%s')", t->s->s);
        }
        bool ok = tdict_set(rt, ns->u.d, (struct tv){.kind = TV_STR, .u.s = t->s2}, v);
        tv_release(rt, v);
        return ok;
    }
    /* tuple unpacking */
    struct tlist *items;
    rt->node = t;
    if (!tmpl_iter_list(rt, v, &items)) {
        tv_release(rt, v);
        return false;
    }
    tv_release(rt, v);
    bool ok = true;
    if (items->n != t->n_args) {
        if (items->n > t->n_args)
            ok = rt_fail(rt, SMELT_ERR_INVALID, "too many values to unpack (expected %u)", t->n_args);
        else
            ok = rt_fail(rt, SMELT_ERR_INVALID, "not enough values to unpack (expected %u, got %zu)", t->n_args, items->n);
    }
    for (uint32_t i = 0; ok && i < t->n_args; i++) ok = assign(rt, sc, t->args[i], tv_retain(items->v[i]));
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
    return ok;
}

static bool output_value(struct rt *rt, struct sbuf *out, struct tv v) {
    if (v.kind == TV_STR) return sb_put(out, v.u.s->s, v.u.s->len);
    return tv_str(rt, out, v);
}

/* Runs a for loop's body over items (already filtered by the caller). */
static bool run_loop(struct rt *rt, struct scope *sc, const struct node *fn, struct tlist *items,
                     uint32_t depth0, struct sbuf *out) {
    struct tloop *lp = rt_alloc(rt, sizeof *lp);
    if (!lp) return false;
    memset(lp, 0, sizeof *lp);
    lp->h.rc = 1;
    lp->h.kind = TV_LOOP;
    lp->items = items;
    if (items->h.rc != RC_FROZEN) items->h.rc++;
    lp->depth0 = depth0;
    lp->fornode = fn;
    lp->outer = sc;
    struct tv loopv = {.kind = TV_LOOP, .u.lp = lp};
    bool ok = true;
    /* Each iteration gets a fresh scope; the frame is reused (cleared) unless a macro
     * defined in the body captured it. */
    struct scope *it = NULL;
    for (size_t i = 0; i < items->n && ok; i++) {
        if (!(ok = rt_step(rt, 1))) break;
        lp->i = i;
        if (it && it->kept) {
            scope_pop(rt, it);
            it = NULL;
        }
        if (it) scope_clear(rt, it);
        else if (!(it = scope_new(rt, sc))) {
            ok = false;
            break;
        }
        if (!(ok = assign(rt, it, fn->a, tv_retain(items->v[i])))) break;
        if (!(ok = scope_set(rt, it, rt->t->s_loop, tv_retain(loopv)))) break;
        int r = exec_body(rt, it, fn->body, fn->n_body, out);
        if (r == X_ERR) ok = false;
        else if (r == X_BREAK) break;
    }
    scope_pop(rt, it);
    lp->fornode = NULL; /* a loop object kept past its loop can no longer recurse */
    lp->outer = NULL;
    tv_release(rt, loopv);
    return ok;
}

static __attribute__((noinline)) int exec_for(struct rt *rt, struct scope *sc, const struct node *n,
                                              struct sbuf *out) {
    struct tv it;
    if (!eval(rt, sc, n->b, &it)) return X_ERR;
    rt->node = n;
    struct tlist *items;
    bool ok = tmpl_iter_list(rt, it, &items);
    tv_release(rt, it);
    if (!ok) return X_ERR;
    if (n->c) { /* inline filter: `for x in xs if cond` */
        struct tv kept;
        if (!tv_new_list(rt, items->n, &kept)) goto fail_items;
        for (size_t i = 0; i < items->n; i++) {
            struct scope *fs = scope_new(rt, sc);
            struct tv c = tv_undef();
            bool good = fs && assign(rt, fs, n->a, tv_retain(items->v[i])) && eval(rt, fs, n->c, &c);
            bool keep = good && tv_truthy(c);
            tv_release(rt, c);
            scope_pop(rt, fs);
            if (!good) {
                tv_release(rt, kept);
                goto fail_items;
            }
            if (keep) kept.u.l->v[kept.u.l->n++] = tv_retain(items->v[i]);
        }
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
        items = kept.u.l;
    }
    if (items->n == 0) {
        tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
        if (!n->n_body2) return X_OK;
        struct scope *es = scope_new(rt, sc);
        if (!es) return X_ERR;
        int r = exec_body(rt, es, n->body2, n->n_body2, out);
        scope_pop(rt, es);
        return r == X_ERR ? X_ERR : X_OK;
    }
    ok = run_loop(rt, sc, n, items, 0, out);
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
    return ok ? X_OK : X_ERR;
fail_items:
    tv_release(rt, (struct tv){.kind = TV_LIST, .u.l = items});
    return X_ERR;
}

static struct tmacro *macro_new(struct rt *rt, const struct node *def, struct scope *closure) {
    struct tmacro *m = rt_alloc(rt, sizeof *m);
    if (!m) return NULL;
    memset(m, 0, sizeof *m);
    m->h.rc = 1;
    m->h.kind = TV_MACRO;
    m->def = def;
    m->closure = closure;
    scope_keep(closure);
    return m;
}

/* Renders body in a new scope into a string value. */
static bool capture(struct rt *rt, struct scope *sc, struct node *const *body, uint32_t nb,
                    struct tv *out) {
    struct scope *s = scope_new(rt, sc);
    if (!s) return false;
    struct sbuf b = {.rt = rt, .limit = rt->lim.max_output};
    int r = exec_body(rt, s, body, nb, &b);
    scope_pop(rt, s);
    if (r == X_ERR) {
        sb_free(&b);
        return false;
    }
    return sb_to_tv(&b, out);
}

static __attribute__((noinline)) int exec_misc(struct rt *rt, struct scope *sc, const struct node *n,
                                               struct sbuf *out) {
    struct tv v = tv_undef(), r = tv_undef();
    bool ok = true;
    switch (n->kind) {
    case N_SETBLOCK:
        if (!(ok = capture(rt, sc, n->body, n->n_body, &v))) break;
        if (n->c) {
            ok = filter_chain(rt, sc, n->c, v, &r);
            tv_release(rt, v);
            v = tv_undef();
            if (!ok) break;
            ok = assign(rt, sc, n->a, r);
        } else {
            ok = assign(rt, sc, n->a, v);
            v = tv_undef();
        }
        r = tv_undef();
        break;
    case N_FILTERBLOCK:
        if (!(ok = capture(rt, sc, n->body, n->n_body, &v))) break;
        if (!(ok = filter_chain(rt, sc, n->c, v, &r))) break;
        ok = output_value(rt, out, r);
        break;
    case N_MACRO: {
        struct tmacro *m = macro_new(rt, n, sc);
        if (!m) return X_ERR;
        ok = scope_set(rt, sc, n->s, (struct tv){.kind = TV_MACRO, .u.m = m});
        break;
    }
    case N_CALLBLOCK: {
        struct tmacro *m = macro_new(rt, n, sc);
        if (!m) return X_ERR;
        struct tv caller = {.kind = TV_MACRO, .u.m = m};
        ok = eval_call(rt, sc, n->a, caller, &r);
        tv_release(rt, caller);
        if (ok) ok = output_value(rt, out, r);
        break;
    }
    case N_WITH: {
        struct scope *s = scope_new(rt, sc);
        if (!s) return X_ERR;
        struct tv *vals = calloc(n->n_args ? n->n_args : 1, sizeof *vals);
        if (!vals) {
            scope_pop(rt, s);
            return rt_fail(rt, SMELT_ERR_NOMEM, "out of memory"), X_ERR;
        }
        uint32_t got = 0;
        for (; got < n->n_args && ok; got++) ok = eval(rt, sc, n->args2[got], &vals[got]);
        if (!ok) got--;
        for (uint32_t i = 0; i < got; i++) {
            if (ok) ok = assign(rt, s, n->args[i], vals[i]);
            else tv_release(rt, vals[i]);
        }
        free(vals);
        int x = ok ? exec_body(rt, s, n->body, n->n_body, out) : X_ERR;
        scope_pop(rt, s);
        return x;
    }
    case N_SCOPE: {
        struct scope *s = scope_new(rt, sc);
        if (!s) return X_ERR;
        int x = exec_body(rt, s, n->body, n->n_body, out);
        scope_pop(rt, s);
        return x;
    }
    default: ok = rt_fail(rt, SMELT_ERR_INTERNAL, "unexpected statement kind %d", n->kind);
    }
    tv_release(rt, v);
    tv_release(rt, r);
    return ok ? X_OK : X_ERR;
}

static int exec_stmt(struct rt *rt, struct scope *sc, const struct node *n, struct sbuf *out) {
    if (!enter(rt)) return X_ERR;
    rt->node = n;
    int r = X_OK;
    struct tv v = tv_undef();
    if (!rt_step(rt, 1)) {
        r = X_ERR;
        goto done;
    }
    switch (n->kind) {
    case N_DATA:
        if (!sb_put(out, n->s->s, n->s->len)) r = X_ERR;
        break;
    case N_OUTPUT:
        for (uint32_t i = 0; i < n->n_args && r == X_OK; i++) {
            if (!eval(rt, sc, n->args[i], &v)) {
                r = X_ERR;
                break;
            }
            if (!output_value(rt, out, v)) r = X_ERR;
            tv_release(rt, v);
            v = tv_undef();
        }
        break;
    case N_IF:
        if (!eval(rt, sc, n->a, &v)) {
            r = X_ERR;
            break;
        }
        if (tv_truthy(v)) r = exec_body(rt, sc, n->body, n->n_body, out);
        else r = exec_body(rt, sc, n->body2, n->n_body2, out);
        break;
    case N_FOR: r = exec_for(rt, sc, n, out); break;
    case N_SET:
        if (!eval(rt, sc, n->b, &v)) {
            r = X_ERR;
            break;
        }
        if (!assign(rt, sc, n->a, v)) r = X_ERR;
        v = tv_undef();
        break;
    case N_BREAK: r = X_BREAK; break;
    case N_CONTINUE: r = X_CONTINUE; break;
    default: r = exec_misc(rt, sc, n, out);
    }
done:
    tv_release(rt, v);
    rt->cdepth--;
    return r;
}

static int exec_body(struct rt *rt, struct scope *sc, struct node *const *body, uint32_t n,
                     struct sbuf *out) {
    for (uint32_t i = 0; i < n; i++) {
        int r = exec_stmt(rt, sc, body[i], out);
        if (r != X_OK) return r;
    }
    return X_OK;
}

/* ---------------------------------------------------------------- render */

smelt_status tmpl_render(const struct tmpl *t, const struct tmpl_value *ctx,
                         const struct tmpl_opts *opts, char **out, size_t *out_len,
                         struct err *e) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return err_set(e, SMELT_ERR_INVALID, "tmpl_render: no template");
    const struct tv *cv = tmpl_value_tv(ctx);
    if (cv && cv->kind != TV_DICT) return err_set(e, SMELT_ERR_INVALID, "tmpl_render: the context must be a dict");
    struct rt rt = {.t = t, .e = e, .ctx = cv ? cv->u.d : NULL};
    if (opts) {
        rt.lim = opts->limits;
        rt.has_now = opts->has_now;
        rt.now = opts->now;
    }
    if (!rt.lim.max_output) rt.lim.max_output = 16u << 20;
    if (!rt.lim.max_alloc) rt.lim.max_alloc = 256u << 20;
    if (!rt.lim.max_steps) rt.lim.max_steps = 50000000;
    if (!rt.lim.max_depth) rt.lim.max_depth = 256;
    if (!rt.lim.max_stack) rt.lim.max_stack = 1u << 20;
    rt.stack_base = (uintptr_t)__builtin_frame_address(0);
    struct sbuf b = {.rt = &rt, .limit = rt.lim.max_output};
    smelt_status st = SMELT_OK;
    rt.top = scope_new(&rt, NULL);
    int r = rt.top ? exec_body(&rt, rt.top, t->body, t->n_body, &b) : X_ERR;
    if (r == X_ERR) st = e && e->code ? e->code : SMELT_ERR_INTERNAL;
    /* teardown: scopes, captured scopes, then namespaces (breaking cycles) */
    rt.failed = true; /* no more error messages from teardown */
    if (rt.top) scope_pop(&rt, rt.top);
    while (rt.kept) {
        struct scope *s = rt.kept;
        rt.kept = s->next_kept;
        scope_clear(&rt, s);
        if (s->names != s->inl_names) {
            free(s->names);
            free(s->vals);
        }
        free(s);
    }
    for (size_t i = 0; i < rt.n_nss; i++) {
        struct tdict *d = rt.nss[i];
        size_t n = d->n;
        d->n = 0;
        for (size_t k = 0; k < n; k++) {
            tv_release(&rt, d->k[k]);
            tv_release(&rt, d->v[k]);
        }
        tv_release(&rt, (struct tv){.kind = TV_NS, .u.d = d});
    }
    free(rt.nss);
    if (st) {
        sb_free(&b);
        return st;
    }
    if (!b.p) {
        b.p = malloc(1);
        if (!b.p) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        b.p[0] = 0;
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return SMELT_OK;
}

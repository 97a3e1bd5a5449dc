/* GGUF writer (v3, little-endian).
 *
 * Metadata and tensor infos are collected in memory (values deep-copied into a bump
 * pool owned by the writer); gguf_writer_write then streams header, KVs, tensor infos,
 * padding, and each tensor's bytes in the order added, each aligned to the file's
 * alignment. The file is written to "PATH.tmp" and renamed over PATH only when complete,
 * so a failed or interrupted write never leaves a truncated model behind.
 *
 * The set/add functions take no struct err (they are called in long runs); the first
 * failure is remembered with its message and returned by gguf_writer_write.
 */
#include "format/gguf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "util/array.h"
#include "util/ckd.h"

struct wchunk {
    struct wchunk *next;
    _Alignas(16) unsigned char data[];
};

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data;
    uint64_t nbytes, offset;
};

struct gguf_writer {
    struct gguf_kv *kv;
    int64_t n_kv;
    size_t cap_kv;
    struct wtensor *t;
    int64_t n_t;
    size_t cap_t;
    struct wchunk *mem; /* every copied key, string and array: freed together */
    struct err err;     /* first deferred failure */
};

static void *wmem(struct gguf_writer *w, size_t n) {
    if (n > SIZE_MAX - sizeof(struct wchunk)) return NULL;
    struct wchunk *c = malloc(sizeof *c + (n ? n : 1));
    if (!c) return NULL;
    c->next = w->mem;
    w->mem = c;
    return c->data;
}

static smelt_status fail(struct gguf_writer *w, smelt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static smelt_status fail(struct gguf_writer *w, smelt_status code, const char *fmt, ...) {
    if (w->err.code != SMELT_OK) return code; /* keep the first */
    w->err.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err.msg, sizeof w->err.msg, fmt, ap);
    va_end(ap);
    return code;
}

smelt_status gguf_writer_new(struct gguf_writer **out, struct err *e) {
    *out = calloc(1, sizeof **out);
    if (!*out) return err_set(e, SMELT_ERR_NOMEM, "no memory for the GGUF writer");
    return SMELT_OK;
}

void gguf_writer_free(struct gguf_writer *w) {
    if (!w) return;
    for (struct wchunk *c = w->mem; c;) {
        struct wchunk *n = c->next;
        free(c);
        c = n;
    }
    free(w->kv);
    free(w->t);
    free(w);
}

static const uint8_t wsize[GGUF_T_COUNT] = {
    [GGUF_T_UINT8] = 1,  [GGUF_T_INT8] = 1,  [GGUF_T_UINT16] = 2,  [GGUF_T_INT16] = 2,
    [GGUF_T_UINT32] = 4, [GGUF_T_INT32] = 4, [GGUF_T_FLOAT32] = 4, [GGUF_T_BOOL] = 1,
    [GGUF_T_UINT64] = 8, [GGUF_T_INT64] = 8, [GGUF_T_FLOAT64] = 8,
};

static bool copy_str(struct gguf_writer *w, struct gguf_str *dst, const char *p, uint64_t n) {
    if (n > SIZE_MAX - 1) return false;
    char *c = wmem(w, (size_t)n + 1);
    if (!c) return false;
    if (n) memcpy(c, p, (size_t)n);
    c[n] = 0;
    dst->ptr = c;
    dst->len = n;
    return true;
}

/* Deep-copies v into dst (writer memory). Returns a status; messages via fail(). */
static smelt_status copy_value(struct gguf_writer *w, const char *key, struct gguf_value *dst,
                               const struct gguf_value *v, int depth) {
    if ((unsigned)v->type >= GGUF_T_COUNT)
        return fail(w, SMELT_ERR_INVALID, "key '%s': bad value type", key);
    *dst = *v;
    if (v->type == GGUF_T_STRING) {
        if (!copy_str(w, &dst->v.s, v->v.s.ptr, v->v.s.len)) goto nomem;
        return SMELT_OK;
    }
    if (v->type != GGUF_T_ARRAY) return SMELT_OK;
    if (depth + 1 > GGUF_MAX_ARRAY_DEPTH)
        return fail(w, SMELT_ERR_INVALID, "key '%s': arrays nested too deep", key);
    enum gguf_vtype et = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    if ((unsigned)et >= GGUF_T_COUNT)
        return fail(w, SMELT_ERR_INVALID, "key '%s': bad array element type", key);
    dst->v.arr.raw = NULL;
    dst->v.arr.items = NULL;
    if (et != GGUF_T_STRING && et != GGUF_T_ARRAY) {
        uint64_t nb;
        if (ckd_mul_u64(&nb, n, wsize[et]) || nb > SIZE_MAX) goto nomem;
        void *raw = wmem(w, (size_t)nb);
        if (!raw) goto nomem;
        if (nb) memcpy(raw, v->v.arr.raw, (size_t)nb);
        dst->v.arr.raw = raw;
        return SMELT_OK;
    }
    if (n == 0) return SMELT_OK;
    if (!v->v.arr.items) return fail(w, SMELT_ERR_INVALID, "key '%s': array has no items", key);
    uint64_t nb;
    if (ckd_mul_u64(&nb, n, sizeof(struct gguf_value)) || nb > SIZE_MAX) goto nomem;
    struct gguf_value *items = wmem(w, (size_t)nb);
    if (!items) goto nomem;
    dst->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        if (v->v.arr.items[i].type != et)
            return fail(w, SMELT_ERR_INVALID, "key '%s': array item of the wrong type", key);
        smelt_status st = copy_value(w, key, &items[i], &v->v.arr.items[i], depth + 1);
        if (st) return st;
    }
    return SMELT_OK;
nomem:
    return fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
}

/* Finds key's slot, appending an empty one when absent. */
static struct gguf_kv *kv_slot(struct gguf_writer *w, const char *key) {
    if (!key || !*key) {
        fail(w, SMELT_ERR_INVALID, "empty metadata key");
        return NULL;
    }
    size_t kl = strlen(key);
    for (int64_t i = 0; i < w->n_kv; i++)
        if (w->kv[i].key.len == kl && !memcmp(w->kv[i].key.ptr, key, kl)) return &w->kv[i];
    if (!array_grow((void **)&w->kv, &w->cap_kv, (size_t)w->n_kv + 1, sizeof *w->kv)) {
        fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
        return NULL;
    }
    struct gguf_kv *s = &w->kv[w->n_kv];
    if (!copy_str(w, &s->key, key, kl)) {
        fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
        return NULL;
    }
    s->val.type = GGUF_T_UINT8;
    s->val.v.u = 0;
    w->n_kv++;
    return s;
}

smelt_status gguf_set_value(struct gguf_writer *w, const char *key, const struct gguf_value *v) {
    struct gguf_kv *s = kv_slot(w, key);
    if (!s) return w->err.code;
    struct gguf_value tmp;
    smelt_status st = copy_value(w, key, &tmp, v, 0);
    if (st) return st;
    s->val = tmp;
    return SMELT_OK;
}

static smelt_status set_scalar(struct gguf_writer *w, const char *key, struct gguf_value v) {
    return gguf_set_value(w, key, &v);
}

smelt_status gguf_set_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_UINT32, .v.u = v});
}
smelt_status gguf_set_i32(struct gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_INT32, .v.i = v});
}
smelt_status gguf_set_u64(struct gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_UINT64, .v.u = v});
}
smelt_status gguf_set_i64(struct gguf_writer *w, const char *key, int64_t v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_INT64, .v.i = v});
}
smelt_status gguf_set_f32(struct gguf_writer *w, const char *key, float v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_FLOAT32, .v.f = v});
}
smelt_status gguf_set_f64(struct gguf_writer *w, const char *key, double v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_FLOAT64, .v.f = v});
}
smelt_status gguf_set_bool(struct gguf_writer *w, const char *key, bool v) {
    return set_scalar(w, key, (struct gguf_value){.type = GGUF_T_BOOL, .v.b = v});
}
smelt_status gguf_set_str(struct gguf_writer *w, const char *key, const char *v) {
    if (!v) return fail(w, SMELT_ERR_INVALID, "key '%s': NULL string", key ? key : "");
    struct gguf_value x = {.type = GGUF_T_STRING};
    x.v.s.ptr = v;
    x.v.s.len = strlen(v);
    return gguf_set_value(w, key, &x);
}

smelt_status gguf_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype t,
                          const void *data, uint64_t n) {
    if ((unsigned)t >= GGUF_T_COUNT || t == GGUF_T_STRING || t == GGUF_T_ARRAY)
        return fail(w, SMELT_ERR_INVALID, "key '%s': gguf_set_arr needs a scalar type",
                    key ? key : "");
    if (n && !data) return fail(w, SMELT_ERR_INVALID, "key '%s': NULL data", key ? key : "");
    struct gguf_value x = {.type = GGUF_T_ARRAY};
    x.v.arr.type = t;
    x.v.arr.n = n;
    x.v.arr.raw = data;
    return gguf_set_value(w, key, &x);
}

smelt_status gguf_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                              uint64_t n) {
    struct gguf_kv *s = kv_slot(w, key);
    if (!s) return w->err.code;
    uint64_t nb;
    if (ckd_mul_u64(&nb, n, sizeof(struct gguf_value)) || nb > SIZE_MAX)
        return fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
    struct gguf_value *items = n ? wmem(w, (size_t)nb) : NULL;
    if (n && !items) return fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = GGUF_T_STRING;
        if (!v[i]) return fail(w, SMELT_ERR_INVALID, "key '%s': NULL string in array", key);
        if (!copy_str(w, &items[i].v.s, v[i], strlen(v[i])))
            return fail(w, SMELT_ERR_NOMEM, "key '%s': out of memory", key);
    }
    s->val.type = GGUF_T_ARRAY;
    s->val.v.arr.type = GGUF_T_STRING;
    s->val.v.arr.n = n;
    s->val.v.arr.raw = NULL;
    s->val.v.arr.items = items;
    return SMELT_OK;
}

smelt_status gguf_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                             uint32_t n_dims, const int64_t *ne, const void *data) {
    if (!name || !*name) return fail(w, SMELT_ERR_INVALID, "empty tensor name");
    const struct qtype_info *q = qtype_get(type);
    if (!q) return fail(w, SMELT_ERR_INVALID, "tensor '%s': unknown type id %u", name, type);
    if (n_dims > GGUF_MAX_DIMS || (n_dims && !ne))
        return fail(w, SMELT_ERR_INVALID, "tensor '%s': %u dimensions (max %d)", name, n_dims,
                    GGUF_MAX_DIMS);
    size_t nl = strlen(name);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return fail(w, SMELT_ERR_INVALID, "duplicate tensor name '%s'", name);
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || ckd_mul_u64(&nel, nel, (uint64_t)ne[d]) || nel > INT64_MAX)
            return fail(w, SMELT_ERR_INVALID,
                        "tensor '%s': dimension %u is %lld (must be > 0; "
                        "product must fit int64)",
                        name, d, (long long)ne[d]);
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % q->blck_size)
        return fail(w, SMELT_ERR_INVALID,
                    "tensor '%s': row length %lld is not a multiple of the %s "
                    "block size %u",
                    name, (long long)t.ne[0], q->name, q->blck_size);
    uint64_t nb = (uint64_t)t.ne[0] / q->blck_size * q->type_size;
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        if (ckd_mul_u64(&nb, nb, (uint64_t)t.ne[d]))
            return fail(w, SMELT_ERR_INVALID, "tensor '%s': size overflows", name);
    t.nbytes = nb;
    t.name = wmem(w, nl + 1);
    if (!t.name) return fail(w, SMELT_ERR_NOMEM, "tensor '%s': out of memory", name);
    memcpy(t.name, name, nl + 1);
    if (!array_grow((void **)&w->t, &w->cap_t, (size_t)w->n_t + 1, sizeof *w->t))
        return fail(w, SMELT_ERR_NOMEM, "tensor '%s': out of memory", name);
    w->t[w->n_t++] = t;
    return SMELT_OK;
}

/* ---- streaming ---- */

struct out {
    FILE *fp;
    uint64_t pos;
    bool bad;
};

static void put(struct out *o, const void *p, size_t n) {
    if (o->bad || !n) return;
    if (fwrite(p, 1, n, o->fp) != n) o->bad = true;
    o->pos += n;
}
static void put_u32(struct out *o, uint32_t v) {
    put(o, &v, 4);
}
static void put_u64(struct out *o, uint64_t v) {
    put(o, &v, 8);
}
static void put_str(struct out *o, struct gguf_str s) {
    put_u64(o, s.len);
    put(o, s.ptr, (size_t)s.len);
}
static void put_pad(struct out *o, uint32_t align) {
    static const uint8_t zeros[64];
    uint64_t pad = (align - o->pos % align) % align;
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        put(o, zeros, k);
        pad -= k;
    }
}

/* Writes v's payload (the type tag is the caller's): a scalar, a string, or an array's
 * element type, count and elements (nested arrays recurse; depth was capped when set). */
static void put_value(struct out *o, const struct gguf_value *v) {
    if (v->type == GGUF_T_STRING) {
        put_str(o, v->v.s);
        return;
    }
    if (v->type == GGUF_T_ARRAY) {
        enum gguf_vtype et = v->v.arr.type;
        put_u32(o, (uint32_t)et);
        put_u64(o, v->v.arr.n);
        if (et == GGUF_T_STRING || et == GGUF_T_ARRAY) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                put_value(o, &v->v.arr.items[i]);
        } else {
            put(o, v->v.arr.raw, (size_t)(v->v.arr.n * wsize[et]));
        }
        return;
    }
    uint8_t b[8] = {0};
    switch (v->type) {
    case GGUF_T_UINT8:
        b[0] = (uint8_t)v->v.u;
        break;
    case GGUF_T_INT8:
        b[0] = (uint8_t)(int8_t)v->v.i;
        break;
    case GGUF_T_BOOL:
        b[0] = v->v.b ? 1 : 0;
        break;
    case GGUF_T_UINT16: {
        uint16_t x = (uint16_t)v->v.u;
        memcpy(b, &x, 2);
        break;
    }
    case GGUF_T_INT16: {
        int16_t x = (int16_t)v->v.i;
        memcpy(b, &x, 2);
        break;
    }
    case GGUF_T_UINT32: {
        uint32_t x = (uint32_t)v->v.u;
        memcpy(b, &x, 4);
        break;
    }
    case GGUF_T_INT32: {
        int32_t x = (int32_t)v->v.i;
        memcpy(b, &x, 4);
        break;
    }
    case GGUF_T_FLOAT32: {
        float x = (float)v->v.f;
        memcpy(b, &x, 4);
        break;
    }
    case GGUF_T_UINT64:
        memcpy(b, &v->v.u, 8);
        break;
    case GGUF_T_INT64:
        memcpy(b, &v->v.i, 8);
        break;
    case GGUF_T_FLOAT64:
        memcpy(b, &v->v.f, 8);
        break;
    default:
        break;
    }
    put(o, b, wsize[v->type]);
}

/* The alignment the file will use: general.alignment when set, else the default. */
static smelt_status writer_alignment(const struct gguf_writer *w, uint32_t *align, struct err *e) {
    *align = GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (!gguf_str_eq(w->kv[i].key, "general.alignment")) continue;
        const struct gguf_value *v = &w->kv[i].val;
        if (v->type != GGUF_T_UINT32)
            return err_set(e, SMELT_ERR_INVALID, "key 'general.alignment': must be UINT32");
        if (v->v.u == 0 || (v->v.u & (v->v.u - 1)) || v->v.u > (UINT32_C(1) << 30))
            return err_set(e, SMELT_ERR_INVALID,
                           "key 'general.alignment': %llu is not a power of two in [1, 2^30]",
                           (unsigned long long)v->v.u);
        *align = (uint32_t)v->v.u;
    }
    return SMELT_OK;
}

smelt_status gguf_writer_write(struct gguf_writer *w, const char *path, gguf_fill_fn fill,
                               void *ctx, struct err *e) {
    if (w->err.code != SMELT_OK) {
        if (e) *e = w->err;
        return w->err.code;
    }
    uint32_t align;
    smelt_status st = writer_alignment(w, &align, e);
    if (st) return st;
    /* Offsets of the data section, each tensor aligned. */
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t end;
        if (ckd_add_u64(&end, off, w->t[i].nbytes) || ckd_add_u64(&off, end, align - 1))
            return err_set(e, SMELT_ERR_RANGE, "tensor '%s': data offset overflows", w->t[i].name);
        off -= off % align;
        if (!w->t[i].data && !fill)
            return err_set(e, SMELT_ERR_INVALID, "tensor '%s': no data given and no fill callback",
                           w->t[i].name);
    }

    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return err_set(e, SMELT_ERR_NOMEM, "no memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    struct out o = {.fp = fopen(tmp, "wb")};
    if (!o.fp) {
        int en = errno;
        st = err_set(e, SMELT_ERR_IO, "cannot create '%s': %s", tmp, strerror(en));
        free(tmp);
        return st;
    }
    put(&o, "GGUF", 4);
    put_u32(&o, 3);
    put_u64(&o, (uint64_t)w->n_t);
    put_u64(&o, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        put_str(&o, w->kv[i].key);
        put_u32(&o, (uint32_t)w->kv[i].val.type);
        put_value(&o, &w->kv[i].val);
    }
    for (int64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        put_str(&o, (struct gguf_str){t->name, strlen(t->name)});
        put_u32(&o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(&o, (uint64_t)t->ne[d]);
        put_u32(&o, t->type);
        put_u64(&o, t->offset);
    }
    put_pad(&o, align);
    uint64_t data_start = o.pos;
    void *buf = NULL;
    uint64_t buf_cap = 0;
    for (int64_t i = 0; i < w->n_t && !o.bad && !st; i++) {
        const struct wtensor *t = &w->t[i];
        if (o.pos - data_start != t->offset) {
            st = err_set(e, SMELT_ERR_INTERNAL, "tensor '%s': layout mismatch", t->name);
            break;
        }
        const void *src = t->data;
        if (!src) {
            if (t->nbytes > buf_cap) {
                free(buf);
                buf = t->nbytes <= SIZE_MAX ? malloc((size_t)t->nbytes) : NULL;
                buf_cap = buf ? t->nbytes : 0;
                if (!buf) {
                    st = err_set(e, SMELT_ERR_NOMEM, "tensor '%s': no memory for %llu bytes",
                                 t->name, (unsigned long long)t->nbytes);
                    break;
                }
            }
            if ((st = fill(ctx, i, buf, t->nbytes, e))) {
                err_prefix(e, "tensor '%s'", t->name);
                break;
            }
            src = buf;
        }
        put(&o, src, (size_t)t->nbytes);
        put_pad(&o, align);
    }
    free(buf);
    int en = 0;
    if (o.bad) en = errno ? errno : EIO;
    if (fclose(o.fp) != 0 && !en) en = errno ? errno : EIO;
    if (!st && en) st = err_set(e, SMELT_ERR_IO, "writing '%s': %s", tmp, strerror(en));
    if (!st && rename(tmp, path) != 0) {
        en = errno;
        st = err_set(e, SMELT_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(en));
    }
    if (st) remove(tmp);
    free(tmp);
    return st;
}

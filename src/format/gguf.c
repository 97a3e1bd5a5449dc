/* GGUF reader: mmap, parse everything up front, validate everything, hand out views.
 *
 * Layout of a GGUF file (v2/v3, little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x { str key, u32 vtype, value }        str = u64 len + bytes (no NUL)
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to general.alignment (default 32), then the data section; each tensor's
 *   offset is relative to the data section and a multiple of the alignment.
 *
 * The file is untrusted. Every read goes through a cursor that checks the bytes left;
 * every count is bounded by the bytes left before anything is allocated for it (a KV
 * takes >= 13 bytes, a string >= 8, an array >= 12, a tensor info >= 24), and tables grow
 * by doubling as entries actually parse, so a header claiming 2^63 entries fails at the
 * first missing one without allocating. Arrays of arrays nest at most
 * GGUF_MAX_ARRAY_DEPTH deep, so recursion is bounded. Arithmetic on sizes and offsets is
 * overflow-checked. Parsed values live in one bump pool freed with the handle; scalar
 * arrays (token scores, types) stay in the mapping (zero-copy).
 *
 * Keys and tensor names are indexed by open-addressing hash tables (FNV-1a), which also
 * catch duplicates while parsing.
 *
 * Measured (2-core dev box, -O2): opening ggml-vocab-deepseek-llm.gguf (100k tokens +
 * 100k merges) takes about 2 ms; see docs/gguf.md.
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "util/array.h"
#include "util/ckd.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define MIN_KV_BYTES 13     /* u64 key len + u32 type + 1-byte value */
#define MIN_STR_BYTES 8     /* u64 len */
#define MIN_ARR_BYTES 12    /* u32 elem type + u64 n */
#define MIN_TENSOR_BYTES 24 /* u64 name len + u32 n_dims + u32 type + u64 offset */
#define MAX_SPLITS 99999    /* the file names carry 5 digits */

/* ---- bump pool for parsed values ---- */

struct pool_chunk {
    struct pool_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

struct pool {
    struct pool_chunk *head; /* small allocations bump here */
    struct pool_chunk *big;  /* allocations larger than a chunk, one each */
};

#define POOL_CHUNK (256u << 10)

static void *pool_alloc(struct pool *p, size_t n) {
    if (n == 0) n = 1;
    if (n > SIZE_MAX - 15 - sizeof(struct pool_chunk)) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n > POOL_CHUNK / 4) {
        struct pool_chunk *c = malloc(sizeof *c + n);
        if (!c) return NULL;
        c->cap = c->used = n;
        c->next = p->big;
        p->big = c;
        return c->data;
    }
    if (!p->head || p->head->cap - p->head->used < n) {
        struct pool_chunk *c = malloc(sizeof *c + POOL_CHUNK);
        if (!c) return NULL;
        c->cap = POOL_CHUNK;
        c->used = 0;
        c->next = p->head;
        p->head = c;
    }
    void *r = p->head->data + p->head->used;
    p->head->used += n;
    return r;
}

static void pool_free(struct pool *p) {
    struct pool_chunk *lists[2] = {p->head, p->big};
    for (int k = 0; k < 2; k++) {
        for (struct pool_chunk *c = lists[k]; c;) {
            struct pool_chunk *n = c->next;
            free(c);
            c = n;
        }
    }
    p->head = p->big = NULL;
}

/* ---- hash index: name -> entry index ---- */

struct index {
    uint32_t *slots; /* entry index + 1; 0 = empty */
    uint64_t mask;   /* capacity - 1 (capacity a power of two) */
    uint64_t n;
};

static uint64_t hash_bytes(const char *s, uint64_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool str_eq_n(struct gguf_str a, const char *b, uint64_t blen) {
    return a.len == blen && (blen == 0 || memcmp(a.ptr, b, blen) == 0);
}

/* Grows to hold at least `want` entries at load <= 1/2. */
static bool index_reserve(struct index *ix, uint64_t want,
                          const struct gguf_str *(*name_of)(const void *, uint32_t),
                          const void *ctx) {
    uint64_t cap = 16;
    while (cap < want * 2) {
        if (cap > (UINT64_C(1) << 40)) return false;
        cap <<= 1;
    }
    if (ix->slots && cap <= ix->mask + 1) return true;
    uint32_t *s = calloc(cap, sizeof *s);
    if (!s) return false;
    if (ix->slots) {
        for (uint64_t i = 0; i <= ix->mask; i++) {
            uint32_t v = ix->slots[i];
            if (!v) continue;
            const struct gguf_str *nm = name_of(ctx, v - 1);
            uint64_t h = hash_bytes(nm->ptr, nm->len) & (cap - 1);
            while (s[h])
                h = (h + 1) & (cap - 1);
            s[h] = v;
        }
        free(ix->slots);
    }
    ix->slots = s;
    ix->mask = cap - 1;
    return true;
}

/* Finds name; returns the entry index or -1. */
static int64_t index_find(const struct index *ix, const char *name, uint64_t len,
                          const struct gguf_str *(*name_of)(const void *, uint32_t),
                          const void *ctx) {
    if (!ix->slots) return -1;
    uint64_t h = hash_bytes(name, len) & ix->mask;
    for (;;) {
        uint32_t v = ix->slots[h];
        if (!v) return -1;
        if (str_eq_n(*name_of(ctx, v - 1), name, len)) return v - 1;
        h = (h + 1) & ix->mask;
    }
}

/* Inserts entry i (whose name is not present: the caller checked with index_find). */
static void index_put(struct index *ix, uint32_t i, const struct gguf_str *name) {
    uint64_t h = hash_bytes(name->ptr, name->len) & ix->mask;
    while (ix->slots[h])
        h = (h + 1) & ix->mask;
    ix->slots[h] = i + 1;
    ix->n++;
}

/* ---- the handle ---- */

struct shard {
    char *path;          /* heap copy, or NULL for memory images */
    const uint8_t *base; /* the mapping (or caller's memory) */
    uint64_t size;
    void *map;            /* non-NULL when we mmap'd it */
    uint64_t data_offset; /* start of the data section */
    uint32_t version, alignment;
};

/* KVs of one shard (the first shard's are the model's metadata). */
struct kvset {
    struct gguf_kv *kv;
    int64_t n;
    size_t cap;
    struct index ix;
};

struct gguf_file {
    struct shard *shards;
    uint32_t n_shards;
    struct kvset meta;
    struct gguf_tensor *tensors;
    int64_t n_tensors;
    size_t cap_tensors;
    struct index tix;
    uint64_t total_size;
    struct pool pool;
};

static const struct gguf_str *kv_name(const void *ctx, uint32_t i) {
    return &((const struct kvset *)ctx)->kv[i].key;
}

static const struct gguf_str *tensor_name(const void *ctx, uint32_t i) {
    return &((const struct gguf_file *)ctx)->tensors[i].name;
}

/* ---- cursor over one shard ---- */

struct rd {
    const uint8_t *p;
    uint64_t size, pos;
    struct pool *pool;
    const char *path; /* for messages */
    struct err *e;
};

static bool rd_has(const struct rd *r, uint64_t n) {
    return n <= r->size - r->pos;
}

static bool rd_u32(struct rd *r, uint32_t *v) {
    if (!rd_has(r, 4)) return false;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool rd_u64(struct rd *r, uint64_t *v) {
    if (!rd_has(r, 8)) return false;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return true;
}

/* A printable, bounded copy of a name for error messages. */
static const char *shown(struct gguf_str s, char *buf, size_t n) {
    size_t k = 0;
    for (uint64_t i = 0; i < s.len && k + 4 < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (s.len > n - 4 && n >= 4) {
        buf[k++] = '.';
        buf[k++] = '.';
        buf[k++] = '.';
    }
    buf[k] = 0;
    return buf;
}

static const uint8_t vsize[GGUF_T_COUNT] = {
    [GGUF_T_UINT8] = 1,   [GGUF_T_INT8] = 1,  [GGUF_T_UINT16] = 2,  [GGUF_T_INT16] = 2,
    [GGUF_T_UINT32] = 4,  [GGUF_T_INT32] = 4, [GGUF_T_FLOAT32] = 4, [GGUF_T_BOOL] = 1,
    [GGUF_T_STRING] = 0,  [GGUF_T_ARRAY] = 0, [GGUF_T_UINT64] = 8,  [GGUF_T_INT64] = 8,
    [GGUF_T_FLOAT64] = 8,
};

static bool is_uint(enum gguf_vtype t) {
    return t == GGUF_T_UINT8 || t == GGUF_T_UINT16 || t == GGUF_T_UINT32 || t == GGUF_T_UINT64;
}
static bool is_sint(enum gguf_vtype t) {
    return t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
}

/* Decodes one packed little-endian scalar of type t at p into v. */
static void scalar_from(enum gguf_vtype t, const uint8_t *p, struct gguf_value *v) {
    v->type = t;
    switch (t) {
    case GGUF_T_UINT8:
        v->v.u = p[0];
        break;
    case GGUF_T_INT8:
        v->v.i = (int8_t)p[0];
        break;
    case GGUF_T_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        v->v.u = x;
        break;
    }
    case GGUF_T_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        v->v.i = x;
        break;
    }
    case GGUF_T_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        v->v.u = x;
        break;
    }
    case GGUF_T_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        v->v.i = x;
        break;
    }
    case GGUF_T_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        v->v.f = x;
        break;
    }
    case GGUF_T_BOOL:
        v->v.b = p[0] != 0;
        break;
    case GGUF_T_UINT64:
        memcpy(&v->v.u, p, 8);
        break;
    case GGUF_T_INT64:
        memcpy(&v->v.i, p, 8);
        break;
    case GGUF_T_FLOAT64:
        memcpy(&v->v.f, p, 8);
        break;
    default:
        break;
    }
}

static smelt_status truncated(struct rd *r, const char *what) {
    return err_set(r->e, SMELT_ERR_FORMAT, "%s: %s: truncated at offset %llu (file size %llu)",
                   r->path, what, (unsigned long long)r->pos, (unsigned long long)r->size);
}

/* Reads a string (u64 length + bytes). `what` names it in errors. */
static smelt_status read_str(struct rd *r, struct gguf_str *out, const char *what) {
    uint64_t len;
    if (!rd_u64(r, &len)) return truncated(r, what);
    if (!rd_has(r, len))
        return err_set(r->e, SMELT_ERR_FORMAT,
                       "%s: %s: string length %llu past end of file (at offset %llu, file "
                       "size %llu)",
                       r->path, what, (unsigned long long)len, (unsigned long long)r->pos,
                       (unsigned long long)r->size);
    out->ptr = (const char *)r->p + r->pos;
    out->len = len;
    r->pos += len;
    return SMELT_OK;
}

/* Parses a value of type t (already read) into out. `what` is "key 'x'" for messages.
 * depth = how many arrays enclose this value. */
static smelt_status read_value(struct rd *r, uint32_t t, int depth, struct gguf_value *out,
                               const char *what) {
    if (t >= GGUF_T_COUNT)
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: %s: unknown value type %u", r->path, what, t);
    out->type = (enum gguf_vtype)t;
    if (t == GGUF_T_STRING) return read_str(r, &out->v.s, what);
    if (t != GGUF_T_ARRAY) {
        if (!rd_has(r, vsize[t])) return truncated(r, what);
        scalar_from((enum gguf_vtype)t, r->p + r->pos, out);
        r->pos += vsize[t];
        return SMELT_OK;
    }
    if (depth + 1 > GGUF_MAX_ARRAY_DEPTH)
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: %s: arrays nested deeper than %d", r->path,
                       what, GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    if (!rd_u32(r, &et) || !rd_u64(r, &n)) return truncated(r, what);
    if (et >= GGUF_T_COUNT)
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: %s: unknown array element type %u", r->path,
                       what, et);
    out->v.arr.type = (enum gguf_vtype)et;
    out->v.arr.n = n;
    out->v.arr.raw = NULL;
    out->v.arr.items = NULL;
    uint64_t min_each = et == GGUF_T_STRING  ? MIN_STR_BYTES
                        : et == GGUF_T_ARRAY ? MIN_ARR_BYTES
                                             : vsize[et];
    uint64_t need;
    if (ckd_mul_u64(&need, n, min_each) || !rd_has(r, need))
        return err_set(r->e, SMELT_ERR_FORMAT,
                       "%s: %s: array of %llu %s elements past end of file (at offset %llu, "
                       "file size %llu)",
                       r->path, what, (unsigned long long)n, gguf_vtype_name(et),
                       (unsigned long long)r->pos, (unsigned long long)r->size);
    if (et != GGUF_T_STRING && et != GGUF_T_ARRAY) {
        out->v.arr.raw = r->p + r->pos;
        r->pos += need;
        return SMELT_OK;
    }
    if (n == 0) return SMELT_OK;
    /* n * sizeof(value) cannot overflow: n <= file size / 8. */
    struct gguf_value *items = pool_alloc(r->pool, (size_t)n * sizeof *items);
    if (!items)
        return err_set(r->e, SMELT_ERR_NOMEM, "%s: %s: no memory for %llu array elements", r->path,
                       what, (unsigned long long)n);
    out->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        smelt_status st = read_value(r, et, depth + 1, &items[i], what);
        if (st) return st;
    }
    return SMELT_OK;
}

/* ---- header / KV / tensor-info parsing of one shard ---- */

static smelt_status parse_header(struct rd *r, uint32_t *version, uint64_t *n_tensors,
                                 uint64_t *n_kv) {
    if (r->size == 0)
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: empty file (not a GGUF file)", r->path);
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0) {
        if (r->size >= 4 && memcmp(r->p, "FUGG", 4) == 0)
            return err_set(r->e, SMELT_ERR_UNSUPPORTED,
                           "%s: big-endian GGUF is not supported (byte-swapped magic)", r->path);
        if (r->size >= 4 && (memcmp(r->p, "ggml", 4) == 0 || memcmp(r->p, "lmgg", 4) == 0 ||
                             memcmp(r->p, "tjgg", 4) == 0 || memcmp(r->p, "fmgg", 4) == 0 ||
                             memcmp(r->p, "ggjt", 4) == 0))
            return err_set(r->e, SMELT_ERR_UNSUPPORTED,
                           "%s: pre-GGUF GGML file: not supported (convert it to GGUF)", r->path);
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: not a GGUF file (bad magic)", r->path);
    }
    r->pos = 4;
    if (!rd_u32(r, version)) return truncated(r, "header");
    if ((*version & 0xffffu) == 0 && *version != 0) {
        uint32_t sw = __builtin_bswap32(*version);
        return err_set(r->e, SMELT_ERR_UNSUPPORTED,
                       "%s: big-endian GGUF (version %u byte-swapped) is not supported", r->path,
                       sw);
    }
    if (*version == 1)
        return err_set(r->e, SMELT_ERR_UNSUPPORTED,
                       "%s: GGUF version 1 is not supported (v1 used 32-bit counts; "
                       "re-convert the model with a current converter)",
                       r->path);
    if (*version != 2 && *version != 3)
        return err_set(r->e, SMELT_ERR_UNSUPPORTED,
                       "%s: GGUF version %u is not supported (only 2 and 3)", r->path, *version);
    if (!rd_u64(r, n_tensors) || !rd_u64(r, n_kv)) return truncated(r, "header");
    /* Bound the counts by the bytes left before anything is allocated. */
    uint64_t left = r->size - r->pos, a, b, s;
    if (ckd_mul_u64(&a, *n_kv, MIN_KV_BYTES) || ckd_mul_u64(&b, *n_tensors, MIN_TENSOR_BYTES) ||
        ckd_add_u64(&s, a, b) || s > left)
        return err_set(r->e, SMELT_ERR_FORMAT,
                       "%s: header claims %llu metadata entries and %llu tensors, more than "
                       "the file's %llu bytes can hold",
                       r->path, (unsigned long long)*n_kv, (unsigned long long)*n_tensors,
                       (unsigned long long)r->size);
    if (*n_kv >= UINT32_MAX || *n_tensors >= UINT32_MAX)
        return err_set(r->e, SMELT_ERR_FORMAT, "%s: too many entries", r->path);
    return SMELT_OK;
}

static smelt_status kvset_grow(struct kvset *ks, struct err *e) {
    if ((size_t)ks->n < ks->cap) return SMELT_OK;
    if (!array_grow((void **)&ks->kv, &ks->cap, (size_t)ks->n + 1, sizeof *ks->kv))
        return err_set(e, SMELT_ERR_NOMEM, "no memory for metadata");
    if (!index_reserve(&ks->ix, (uint64_t)ks->cap, kv_name, ks))
        return err_set(e, SMELT_ERR_NOMEM, "no memory for metadata index");
    return SMELT_OK;
}

static smelt_status parse_kvs(struct rd *r, uint64_t n_kv, struct kvset *ks) {
    char what[160], nm[96];
    for (uint64_t i = 0; i < n_kv; i++) {
        smelt_status st = kvset_grow(ks, r->e);
        if (st) return st;
        struct gguf_kv *kv = &ks->kv[ks->n];
        snprintf(what, sizeof what, "metadata entry #%llu: key", (unsigned long long)i);
        if ((st = read_str(r, &kv->key, what))) return st;
        if (kv->key.len == 0)
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: metadata entry #%llu: empty key", r->path,
                           (unsigned long long)i);
        if (memchr(kv->key.ptr, 0, kv->key.len))
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: key '%s': contains a NUL byte", r->path,
                           shown(kv->key, nm, sizeof nm));
        snprintf(what, sizeof what, "key '%s'", shown(kv->key, nm, sizeof nm));
        int64_t dup = index_find(&ks->ix, kv->key.ptr, kv->key.len, kv_name, ks);
        if (dup >= 0)
            return err_set(r->e, SMELT_ERR_FORMAT,
                           "%s: duplicate key '%s' (metadata entries #%lld and #%llu)", r->path, nm,
                           (long long)dup, (unsigned long long)i);
        uint32_t t;
        if (!rd_u32(r, &t)) return truncated(r, what);
        if ((st = read_value(r, t, 0, &kv->val, what))) return st;
        index_put(&ks->ix, (uint32_t)ks->n, &kv->key);
        ks->n++;
    }
    return SMELT_OK;
}

static const struct gguf_value *kvset_get(const struct kvset *ks, const char *key) {
    int64_t i = index_find(&ks->ix, key, strlen(key), kv_name, ks);
    return i < 0 ? NULL : &ks->kv[i].val;
}

/* An integer value as u64 when it is a non-negative integer; false otherwise. */
static bool value_as_u64(const struct gguf_value *v, uint64_t *out) {
    if (is_uint(v->type)) {
        *out = v->v.u;
        return true;
    }
    if (is_sint(v->type) && v->v.i >= 0) {
        *out = (uint64_t)v->v.i;
        return true;
    }
    return false;
}

static smelt_status read_alignment(struct rd *r, const struct kvset *ks, uint32_t dflt,
                                   uint32_t *align) {
    const struct gguf_value *v = kvset_get(ks, "general.alignment");
    *align = dflt;
    if (!v) return SMELT_OK;
    uint64_t a;
    if (!value_as_u64(v, &a))
        return err_set(r->e, SMELT_ERR_FORMAT,
                       "%s: key 'general.alignment': must be an unsigned integer, not %s", r->path,
                       gguf_vtype_name(v->type));
    if (a == 0 || (a & (a - 1)) || a > (UINT32_C(1) << 30))
        return err_set(r->e, SMELT_ERR_FORMAT,
                       "%s: key 'general.alignment': %llu is not a power of two in [1, 2^30]",
                       r->path, (unsigned long long)a);
    *align = (uint32_t)a;
    return SMELT_OK;
}

static smelt_status tensors_grow(struct gguf_file *f, struct err *e) {
    if ((size_t)f->n_tensors < f->cap_tensors) return SMELT_OK;
    if (!array_grow((void **)&f->tensors, &f->cap_tensors, (size_t)f->n_tensors + 1,
                    sizeof *f->tensors))
        return err_set(e, SMELT_ERR_NOMEM, "no memory for tensor infos");
    if (!index_reserve(&f->tix, (uint64_t)f->cap_tensors, tensor_name, f))
        return err_set(e, SMELT_ERR_NOMEM, "no memory for tensor index");
    return SMELT_OK;
}

static void fmt_shape(const struct gguf_tensor *t, uint32_t n_dims, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (uint32_t d = 0; d < n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
}

struct span {
    uint64_t start, end;
    int64_t idx;
};

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Parses n tensor infos of shard `split` and appends them to f->tensors. */
static smelt_status parse_tensor_infos(struct rd *r, uint64_t n, uint32_t split, uint32_t align,
                                       struct gguf_file *f) {
    char what[160], nm[96], shape[128];
    for (uint64_t i = 0; i < n; i++) {
        smelt_status st = tensors_grow(f, r->e);
        if (st) return st;
        struct gguf_tensor *t = &f->tensors[f->n_tensors];
        memset(t, 0, sizeof *t);
        snprintf(what, sizeof what, "tensor info #%llu: name", (unsigned long long)i);
        if ((st = read_str(r, &t->name, what))) return st;
        shown(t->name, nm, sizeof nm);
        if (t->name.len == 0)
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: tensor info #%llu: empty name", r->path,
                           (unsigned long long)i);
        if (memchr(t->name.ptr, 0, t->name.len))
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: tensor '%s': name contains a NUL byte",
                           r->path, nm);
        snprintf(what, sizeof what, "tensor '%s'", nm);
        int64_t dup = index_find(&f->tix, t->name.ptr, t->name.len, tensor_name, f);
        if (dup >= 0) {
            if (f->tensors[dup].split != split)
                return err_set(r->e, SMELT_ERR_FORMAT,
                               "%s: duplicate tensor name '%s' (also in split %u)", r->path, nm,
                               f->tensors[dup].split + 1);
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: duplicate tensor name '%s'", r->path, nm);
        }
        if (!rd_u32(r, &t->n_dims)) return truncated(r, what);
        if (t->n_dims > GGUF_MAX_DIMS)
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: tensor '%s': %u dimensions (max %d)",
                           r->path, nm, t->n_dims, GGUF_MAX_DIMS);
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        uint64_t nel = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if (!rd_u64(r, &ne)) return truncated(r, what);
            if (ne == 0 || ne > INT64_MAX)
                return err_set(r->e, SMELT_ERR_FORMAT,
                               "%s: tensor '%s': dimension %u is %lld (must be > 0)", r->path, nm,
                               d, (long long)ne);
            t->ne[d] = (int64_t)ne;
            if (ckd_mul_u64(&nel, nel, ne) || nel > INT64_MAX) {
                fmt_shape(t, d + 1, shape, sizeof shape);
                return err_set(r->e, SMELT_ERR_FORMAT,
                               "%s: tensor '%s': element count of shape [%s] overflows", r->path,
                               nm, shape);
            }
        }
        if (!rd_u32(r, &t->type) || !rd_u64(r, &t->offset)) return truncated(r, what);
        const struct qtype_info *q = qtype_get(t->type);
        if (!q)
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: tensor '%s': unknown type id %u", r->path,
                           nm, t->type);
        if (t->ne[0] % q->blck_size)
            return err_set(r->e, SMELT_ERR_FORMAT,
                           "%s: tensor '%s': row length %lld is not a multiple of the %s block "
                           "size %u",
                           r->path, nm, (long long)t->ne[0], q->name, q->blck_size);
        /* nbytes = ne0/blck * type_size * ne1 * ne2 * ne3; nel fits int64 already. */
        uint64_t nb = (uint64_t)t->ne[0] / q->blck_size;
        if (ckd_mul_u64(&nb, nb, q->type_size) || ckd_mul_u64(&nb, nb, (uint64_t)t->ne[1]) ||
            ckd_mul_u64(&nb, nb, (uint64_t)t->ne[2]) || ckd_mul_u64(&nb, nb, (uint64_t)t->ne[3]))
            return err_set(r->e, SMELT_ERR_FORMAT, "%s: tensor '%s': byte size overflows", r->path,
                           nm);
        t->nbytes = nb;
        if (t->offset % align)
            return err_set(r->e, SMELT_ERR_FORMAT,
                           "%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                           r->path, nm, (unsigned long long)t->offset, align);
        t->split = split;
        index_put(&f->tix, (uint32_t)f->n_tensors, &t->name);
        f->n_tensors++;
    }
    return SMELT_OK;
}

/* Bounds and overlap of the tensors [first, f->n_tensors) of one shard. */
static smelt_status check_data(struct rd *r, struct gguf_file *f, int64_t first,
                               uint64_t data_off) {
    int64_t n = f->n_tensors - first;
    if (n == 0) return SMELT_OK;
    char nm[96], nm2[96];
    struct span *sp = malloc((size_t)n * sizeof *sp);
    if (!sp) return err_set(r->e, SMELT_ERR_NOMEM, "no memory for tensor check");
    smelt_status st = SMELT_OK;
    for (int64_t i = 0; i < n; i++) {
        struct gguf_tensor *t = &f->tensors[first + i];
        uint64_t start, end;
        if (ckd_add_u64(&start, data_off, t->offset) || ckd_add_u64(&end, start, t->nbytes) ||
            end > r->size) {
            st = err_set(r->e, SMELT_ERR_FORMAT,
                         "%s: tensor '%s': data [%llu, %llu) past end of file (size %llu)", r->path,
                         shown(t->name, nm, sizeof nm), (unsigned long long)(data_off + t->offset),
                         (unsigned long long)(data_off + t->offset + t->nbytes),
                         (unsigned long long)r->size);
            goto out;
        }
        t->data = r->p + start;
        sp[i] = (struct span){start, end, first + i};
    }
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    for (int64_t i = 1; i < n; i++) {
        if (sp[i].start < sp[i - 1].end) {
            st = err_set(r->e, SMELT_ERR_FORMAT,
                         "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", r->path,
                         shown(f->tensors[sp[i - 1].idx].name, nm, sizeof nm),
                         (unsigned long long)sp[i - 1].start, (unsigned long long)sp[i - 1].end,
                         shown(f->tensors[sp[i].idx].name, nm2, sizeof nm2),
                         (unsigned long long)sp[i].start, (unsigned long long)sp[i].end);
            goto out;
        }
    }
out:
    free(sp);
    return st;
}

/* Parses shard s (index split) into f: its KVs into ks, its tensors appended. */
static smelt_status parse_shard(struct gguf_file *f, struct shard *s, uint32_t split,
                                struct kvset *ks, uint32_t default_align, struct err *e) {
    struct rd r = {.p = s->base,
                   .size = s->size,
                   .pool = &f->pool,
                   .e = e,
                   .path = s->path ? s->path : "<memory>"};
    uint64_t n_tensors = 0, n_kv = 0;
    smelt_status st = parse_header(&r, &s->version, &n_tensors, &n_kv);
    if (st) return st;
    if ((st = parse_kvs(&r, n_kv, ks))) return st;
    if ((st = read_alignment(&r, ks, default_align, &s->alignment))) return st;
    int64_t first = f->n_tensors;
    if ((st = parse_tensor_infos(&r, n_tensors, split, s->alignment, f))) return st;
    uint64_t pad = (s->alignment - r.pos % s->alignment) % s->alignment;
    if (ckd_add_u64(&s->data_offset, r.pos, pad))
        return err_set(e, SMELT_ERR_FORMAT, "%s: data offset overflows", r.path);
    return check_data(&r, f, first, s->data_offset);
}

/* ---- open / close ---- */

static void kvset_free(struct kvset *ks) {
    free(ks->kv);
    free(ks->ix.slots);
    memset(ks, 0, sizeof *ks);
}

void gguf_close(struct gguf_file *f) {
    if (!f) return;
    for (uint32_t i = 0; i < f->n_shards; i++) {
        if (f->shards[i].map) munmap(f->shards[i].map, (size_t)f->shards[i].size);
        free(f->shards[i].path);
    }
    free(f->shards);
    kvset_free(&f->meta);
    free(f->tensors);
    free(f->tix.slots);
    pool_free(&f->pool);
    free(f);
}

static smelt_status map_file(struct shard *s, const char *path, struct err *e) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return err_set(e, SMELT_ERR_NOMEM, "no memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int en = errno;
        return err_set(e, en == ENOENT ? SMELT_ERR_NOT_FOUND : SMELT_ERR_IO, "cannot open '%s': %s",
                       path, strerror(en));
    }
    struct stat stt;
    if (fstat(fd, &stt) != 0) {
        int en = errno;
        close(fd);
        return err_set(e, SMELT_ERR_IO, "cannot stat '%s': %s", path, strerror(en));
    }
    if (!S_ISREG(stt.st_mode)) {
        close(fd);
        return err_set(e, SMELT_ERR_IO, "'%s' is not a regular file", path);
    }
    if (stt.st_size == 0) {
        close(fd);
        return err_set(e, SMELT_ERR_FORMAT, "%s: empty file (not a GGUF file)", path);
    }
    s->size = (uint64_t)stt.st_size;
    void *m = mmap(NULL, (size_t)s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int en = errno;
    close(fd);
    if (m == MAP_FAILED)
        return err_set(e, SMELT_ERR_IO, "cannot mmap '%s': %s", path, strerror(en));
    s->map = m;
    s->base = m;
    return SMELT_OK;
}

static smelt_status new_file(struct gguf_file **out, uint32_t n_shards, struct err *e) {
    struct gguf_file *f = calloc(1, sizeof *f);
    if (f) f->shards = calloc(n_shards, sizeof *f->shards);
    if (!f || !f->shards) {
        free(f);
        return err_set(e, SMELT_ERR_NOMEM, "no memory");
    }
    *out = f;
    return SMELT_OK;
}

smelt_status gguf_open_memory(struct gguf_file **out, const void *data, uint64_t size,
                              struct err *e) {
    *out = NULL;
    err_clear(e);
    if (!data && size) return err_set(e, SMELT_ERR_INVALID, "gguf_open_memory: NULL data");
    struct gguf_file *f;
    smelt_status st = new_file(&f, 1, e);
    if (st) return st;
    f->n_shards = 1;
    f->shards[0].base = data;
    f->shards[0].size = size;
    f->total_size = size;
    st = parse_shard(f, &f->shards[0], 0, &f->meta, GGUF_DEFAULT_ALIGNMENT, e);
    if (st) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return SMELT_OK;
}

/* An integer key of a split shard, or `dflt` when absent. */
static smelt_status split_key(const struct kvset *ks, const char *path, const char *key,
                              bool required, uint64_t *out, struct err *e) {
    const struct gguf_value *v = kvset_get(ks, key);
    if (!v) {
        if (required) return err_set(e, SMELT_ERR_FORMAT, "%s: key '%s' missing", path, key);
        return SMELT_ERR_NOT_FOUND;
    }
    if (!value_as_u64(v, out))
        return err_set(e, SMELT_ERR_FORMAT, "%s: key '%s': must be a non-negative integer, not %s",
                       path, key, gguf_vtype_name(v->type));
    return SMELT_OK;
}

/* Finds the "-NNNNN-of-MMMMM.gguf" suffix; returns the prefix length or -1. */
static long split_prefix_len(const char *path, uint32_t count) {
    size_t n = strlen(path);
    const size_t suf = strlen("-00001-of-00001.gguf");
    if (n < suf) return -1;
    const char *s = path + n - suf;
    unsigned a, b;
    char tail[8];
    if (sscanf(s, "-%5u-of-%5u%7s", &a, &b, tail) != 3 || strcmp(tail, ".gguf") != 0) return -1;
    if (b != count) return -1;
    return (long)(n - suf);
}

smelt_status gguf_open(struct gguf_file **out, const char *path, struct err *e) {
    *out = NULL;
    err_clear(e);
    struct gguf_file *f;
    smelt_status st = new_file(&f, 1, e);
    if (st) return st;
    f->n_shards = 1;
    if ((st = map_file(&f->shards[0], path, e))) goto fail;
    f->total_size = f->shards[0].size;
    if ((st = parse_shard(f, &f->shards[0], 0, &f->meta, GGUF_DEFAULT_ALIGNMENT, e))) goto fail;

    uint64_t count, no, ntens;
    st = split_key(&f->meta, path, "split.count", false, &count, e);
    if (st == SMELT_ERR_NOT_FOUND) {
        err_clear(e);
        *out = f;
        return SMELT_OK;
    }
    if (st) goto fail;
    if (count == 0 || count > MAX_SPLITS) {
        st = err_set(e, SMELT_ERR_FORMAT, "%s: key 'split.count': %llu out of range [1, %d]", path,
                     (unsigned long long)count, MAX_SPLITS);
        goto fail;
    }
    st = split_key(&f->meta, path, "split.no", count > 1, &no, e);
    if (st == SMELT_ERR_NOT_FOUND)
        no = 0;
    else if (st)
        goto fail;
    if (no != 0) {
        st = err_set(e, SMELT_ERR_INVALID,
                     "%s: this is split %llu of %llu: open the first file "
                     "(NAME-00001-of-%05llu.gguf)",
                     path, (unsigned long long)no + 1, (unsigned long long)count,
                     (unsigned long long)count);
        goto fail;
    }
    if (count > 1) {
        long plen = split_prefix_len(path, (uint32_t)count);
        if (plen < 0) {
            st = err_set(e, SMELT_ERR_FORMAT,
                         "%s: split.count is %llu but the file name is not "
                         "NAME-00001-of-%05llu.gguf, so the other splits cannot be found",
                         path, (unsigned long long)count, (unsigned long long)count);
            goto fail;
        }
        struct shard *sh = realloc(f->shards, (size_t)count * sizeof *sh);
        if (!sh) {
            st = err_set(e, SMELT_ERR_NOMEM, "no memory");
            goto fail;
        }
        f->shards = sh;
        size_t plen_z = (size_t)plen, pn = plen_z + 32;
        char *p = malloc(pn);
        if (!p) {
            st = err_set(e, SMELT_ERR_NOMEM, "no memory");
            goto fail;
        }
        for (uint32_t i = 1; i < count && !st; i++) {
            snprintf(p, pn, "%.*s-%05u-of-%05u.gguf", (int)plen, path, i + 1, (uint32_t)count);
            f->n_shards = i + 1;
            struct kvset ks = {0};
            if ((st = map_file(&f->shards[i], p, e))) {
                err_prefix(e, "split %u of %llu missing or unreadable", i + 1,
                           (unsigned long long)count);
            } else {
                f->total_size += f->shards[i].size;
                st = parse_shard(f, &f->shards[i], i, &ks, f->shards[0].alignment, e);
            }
            uint64_t c2, n2;
            if (!st && !(st = split_key(&ks, p, "split.count", true, &c2, e)) &&
                !(st = split_key(&ks, p, "split.no", true, &n2, e)) && (c2 != count || n2 != i))
                st = err_set(e, SMELT_ERR_FORMAT,
                             "%s: split.no=%llu, split.count=%llu, expected %u and %llu", p,
                             (unsigned long long)n2, (unsigned long long)c2, i,
                             (unsigned long long)count);
            kvset_free(&ks);
        }
        free(p);
        if (st) goto fail;
    }
    st = split_key(&f->meta, path, "split.tensors.count", false, &ntens, e);
    if (st == SMELT_OK && ntens != (uint64_t)f->n_tensors) {
        st = err_set(e, SMELT_ERR_FORMAT,
                     "%s: split.tensors.count is %llu but the %llu splits hold %lld tensors", path,
                     (unsigned long long)ntens, (unsigned long long)count, (long long)f->n_tensors);
        goto fail;
    }
    if (st != SMELT_OK && st != SMELT_ERR_NOT_FOUND) goto fail;
    err_clear(e);
    *out = f;
    return SMELT_OK;
fail:
    gguf_close(f);
    return st;
}

/* ---- accessors ---- */

uint32_t gguf_version(const struct gguf_file *f) {
    return f->shards[0].version;
}
uint32_t gguf_alignment(const struct gguf_file *f) {
    return f->shards[0].alignment;
}
uint32_t gguf_n_splits(const struct gguf_file *f) {
    return f->n_shards;
}
uint64_t gguf_file_size(const struct gguf_file *f) {
    return f->total_size;
}

const char *gguf_split_path(const struct gguf_file *f, uint32_t split) {
    if (split >= f->n_shards) return NULL;
    return f->shards[split].path ? f->shards[split].path : "<memory>";
}

uint64_t gguf_data_offset(const struct gguf_file *f, uint32_t split) {
    return split < f->n_shards ? f->shards[split].data_offset : 0;
}

int64_t gguf_n_kv(const struct gguf_file *f) {
    return f->meta.n;
}

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i) {
    return i >= 0 && i < f->meta.n ? &f->meta.kv[i] : NULL;
}

int64_t gguf_find_kv(const struct gguf_file *f, const char *key) {
    return index_find(&f->meta.ix, key, strlen(key), kv_name, &f->meta);
}

const struct gguf_value *gguf_get(const struct gguf_file *f, const char *key) {
    return kvset_get(&f->meta, key);
}

static smelt_status lookup(const struct gguf_file *f, const char *key, const struct gguf_value **v,
                           struct err *e) {
    *v = gguf_get(f, key);
    if (!*v) return err_set(e, SMELT_ERR_NOT_FOUND, "key '%s' not found", key);
    return SMELT_OK;
}

static smelt_status wrong_type(const char *key, const struct gguf_value *v, const char *want,
                               struct err *e) {
    return err_set(e, SMELT_ERR_FORMAT, "key '%s': expected %s, found %s", key, want,
                   gguf_vtype_name(v->type));
}

smelt_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out,
                          struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (!is_uint(v->type) && !is_sint(v->type)) return wrong_type(key, v, "an integer", e);
    if (!value_as_u64(v, out))
        return err_set(e, SMELT_ERR_FORMAT, "key '%s': %lld is negative", key, (long long)v->v.i);
    return SMELT_OK;
}

smelt_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out,
                          struct err *e) {
    uint64_t u;
    smelt_status st = gguf_get_u64(f, key, &u, e);
    if (st) return st;
    if (u > UINT32_MAX)
        return err_set(e, SMELT_ERR_FORMAT, "key '%s': %llu does not fit 32 bits", key,
                       (unsigned long long)u);
    *out = (uint32_t)u;
    return SMELT_OK;
}

smelt_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out, struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (is_sint(v->type)) {
        *out = v->v.i;
        return SMELT_OK;
    }
    if (!is_uint(v->type)) return wrong_type(key, v, "an integer", e);
    if (v->v.u > INT64_MAX)
        return err_set(e, SMELT_ERR_FORMAT, "key '%s': %llu does not fit int64", key,
                       (unsigned long long)v->v.u);
    *out = (int64_t)v->v.u;
    return SMELT_OK;
}

smelt_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (v->type == GGUF_T_FLOAT32 || v->type == GGUF_T_FLOAT64)
        *out = (float)v->v.f;
    else if (is_uint(v->type))
        *out = (float)v->v.u;
    else if (is_sint(v->type))
        *out = (float)v->v.i;
    else
        return wrong_type(key, v, "a number", e);
    return SMELT_OK;
}

smelt_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (v->type != GGUF_T_BOOL) return wrong_type(key, v, "BOOL", e);
    *out = v->v.b;
    return SMELT_OK;
}

smelt_status gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out,
                          struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (v->type != GGUF_T_STRING) return wrong_type(key, v, "STRING", e);
    *out = v->v.s;
    return SMELT_OK;
}

smelt_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype want,
                          const struct gguf_value **out, struct err *e) {
    const struct gguf_value *v;
    smelt_status st = lookup(f, key, &v, e);
    if (st) return st;
    if (v->type != GGUF_T_ARRAY) return wrong_type(key, v, "ARRAY", e);
    if (want != GGUF_T_COUNT && v->v.arr.type != want)
        return err_set(e, SMELT_ERR_FORMAT, "key '%s': expected an array of %s, found %s", key,
                       gguf_vtype_name(want), gguf_vtype_name(v->v.arr.type));
    *out = v;
    return SMELT_OK;
}

int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i) {
    enum gguf_vtype t = arr->v.arr.type;
    if (t == GGUF_T_STRING || t == GGUF_T_ARRAY || t >= GGUF_T_COUNT) return 0;
    struct gguf_value v;
    scalar_from(t, (const uint8_t *)arr->v.arr.raw + i * vsize[t], &v);
    if (t == GGUF_T_BOOL) return v.v.b;
    if (t == GGUF_T_FLOAT32 || t == GGUF_T_FLOAT64) return (int64_t)v.v.f;
    return is_sint(t) ? v.v.i : (int64_t)v.v.u;
}

double gguf_arr_f64(const struct gguf_value *arr, uint64_t i) {
    enum gguf_vtype t = arr->v.arr.type;
    if (t == GGUF_T_STRING || t == GGUF_T_ARRAY || t >= GGUF_T_COUNT) return 0;
    struct gguf_value v;
    scalar_from(t, (const uint8_t *)arr->v.arr.raw + i * vsize[t], &v);
    if (t == GGUF_T_FLOAT32 || t == GGUF_T_FLOAT64) return v.v.f;
    if (t == GGUF_T_BOOL) return v.v.b;
    return is_sint(t) ? (double)v.v.i : (double)v.v.u;
}

struct gguf_str gguf_arr_str(const struct gguf_value *arr, uint64_t i) {
    if (arr->v.arr.type != GGUF_T_STRING || !arr->v.arr.items) return (struct gguf_str){"", 0};
    return arr->v.arr.items[i].v.s;
}

int64_t gguf_n_tensors(const struct gguf_file *f) {
    return f->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i) {
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    int64_t i = index_find(&f->tix, name, strlen(name), tensor_name, f);
    return i < 0 ? NULL : &f->tensors[i];
}

const char *gguf_vtype_name(enum gguf_vtype t) {
    static const char *names[GGUF_T_COUNT] = {
        "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",   "FLOAT32",
        "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64",
    };
    return (unsigned)t < GGUF_T_COUNT ? names[t] : "?";
}

bool gguf_str_eq(struct gguf_str s, const char *z) {
    return str_eq_n(s, z, strlen(z));
}

char *gguf_str_copy(struct gguf_str s, char *buf, size_t bufsize) {
    if (!bufsize) return buf;
    size_t n = s.len < bufsize - 1 ? (size_t)s.len : bufsize - 1;
    if (n) memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return buf;
}

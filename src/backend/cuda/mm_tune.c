/* The matmul path table (mm_tune.h): buckets, candidates, the write-once table, its text.
 *
 * Buckets. A step presents 9..64 token rows in batched decode (one per sequence: any
 * count, changing as sequences come and go) and up to the step budget (512 by default)
 * in prefill chunks, usually the full budget or a remainder. The buckets follow the
 * tensor-core kernel's token widths (16, 32, 64, 128): within 9-16, 17-32 and 49-64 every
 * n pads to the same tile widths, so one measurement holds for the bucket; 33-48 is split
 * from 49-64 because there a 64-wide tile is 25-50% padding and two 32-wide token tiles
 * may win. Above 64 the product turns compute-bound and its cost grows smoothly with n, so
 * powers of two suffice (65-128, 129-256, 257-512) and > 512 is one bucket (rare: only
 * with a larger step budget). Eight buckets x ~8 distinct weight shapes per model bounds
 * the table and the tuning time (docs/cuda-backend.md gives the estimate). */
#include "backend/cuda/mm_tune.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

static const int64_t bucket_hi[MMTUNE_BUCKETS] = {16, 32, 48, 64, 128, 256, 512, INT64_MAX};

int mmtune_bucket(int64_t n) {
    if (n <= 8) return -1;
    for (int b = 0; b < MMTUNE_BUCKETS; b++)
        if (n <= bucket_hi[b]) return b;
    return MMTUNE_BUCKETS - 1;
}

int mmtune_bucket_small(int64_t n) {
    return n >= 2 && n <= 8 ? MMTUNE_BUCKET_SMALL + (int)n - 2 : -1;
}

void mmtune_bucket_range(int b, int64_t *lo, int64_t *hi) {
    if (b >= MMTUNE_BUCKET_SMALL && b < MMTUNE_BUCKET_SMALL + MMTUNE_SMALL_BUCKETS) {
        *lo = *hi = b - MMTUNE_BUCKET_SMALL + 2;
        return;
    }
    if (b < 0 || b >= MMTUNE_BUCKETS) {
        *lo = 1;
        *hi = 8;
        return;
    }
    *lo = b == 0 ? 9 : bucket_hi[b - 1] + 1;
    *hi = bucket_hi[b];
}

int mmtune_candidates(int64_t n, const struct mmtune_space *s, int *out, int max) {
    int c = 0;
    if (s->mmb && n >= 2 && n <= 64 && max > 0) out[c++] = MMTUNE_MMB;
    if (n <= 8) {
        if (c && c < max) out[c++] = MMTUNE_MMV;
        return c > 1 ? c : 0;
    }
    if (s->mmq && n <= s->mmq_max_rows)
        for (int t = 0; t < s->n_tiles && c < max; t++) {
            const int64_t bn = s->tile_bn[t];
            if (!s->tile_fits[t]) continue;
            if (bn > 2 * n && bn > 16) continue; /* mostly padding */
            if (n > 16 * bn) continue;           /* each weight dequantized > 16 times */
            out[c++] = t;
        }
    if (s->gemm && c < max) out[c++] = MMTUNE_GEMM;
    if (s->mmv && n <= MMTUNE_MMV_MAX_ROWS && c < max) out[c++] = MMTUNE_MMV;
    return c > 1 ? c : 0;
}

int mmtune_fastest(const float *us, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (us[i] > 0 && (best < 0 || us[i] < us[best])) best = i; /* NaN > 0 is false */
    return best;
}

float mmtune_median(float *v, int n) {
    if (n < 1) return 0;
    for (int i = 1; i < n; i++) /* insertion sort: n is 3 */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            float t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

void mmtune_init(struct mmtune *t) {
    memset(t, 0, sizeof *t);
}

void mmtune_free(struct mmtune *t) {
    free(t->e);
    mmtune_init(t);
}

static bool key_eq(const struct mmtune_key *a, const struct mmtune_key *b) {
    return a->type == b->type && a->rows == b->rows && a->k == b->k && a->bucket == b->bucket;
}

/* Linear: a model has a few dozen keys, and the lookup runs only in eager steps (graph
 * replays skip the host code entirely). */
const struct mmtune_ent *mmtune_find(const struct mmtune *t, const struct mmtune_key *key) {
    for (int i = 0; i < t->n; i++)
        if (key_eq(&t->e[i].key, key)) return &t->e[i];
    return NULL;
}

smelt_status mmtune_put(struct mmtune *t, const struct mmtune_ent *ent,
                        const struct mmtune_ent **out, struct err *e) {
    const struct mmtune_ent *old = mmtune_find(t, &ent->key);
    if (old) { /* write-once: the first choice stays */
        if (out) *out = old;
        return SMELT_OK;
    }
    if (t->n == t->cap) {
        if (t->cap >= MMTUNE_MAX_ENTRIES)
            return err_set(e, SMELT_ERR_NOMEM, "matmul path table full (%d shapes)", t->cap);
        int nc = t->cap ? t->cap * 2 : 64;
        if (nc > MMTUNE_MAX_ENTRIES) nc = MMTUNE_MAX_ENTRIES;
        struct mmtune_ent *a = realloc(t->e, (size_t)nc * sizeof *a);
        if (!a)
            return err_set(e, SMELT_ERR_NOMEM, "matmul path table: out of memory (%d shapes)", nc);
        t->e = a;
        t->cap = nc;
    }
    t->e[t->n] = *ent;
    if (ent->us > 0) t->n_tuned++;
    if (out) *out = &t->e[t->n];
    t->n++;
    return SMELT_OK;
}

/* "1", "yes", any non-empty value but "0" is on. */
static bool env_on(const char *s) {
    return s && *s && strcmp(s, "0") != 0;
}

void mmtune_env_parse(const char *no_tune, const char *tile, int n_tiles, struct mmtune_env *env,
                      bool *bad) {
    env->tune = !env_on(no_tune);
    env->tile = MMTUNE_MMQ_AUTO;
    *bad = false;
    if (tile && *tile) {
        char *end = NULL;
        long v = strtol(tile, &end, 10);
        if (*tile >= '0' && *tile <= '9' && end && *end == '\0' && v < n_tiles) {
            env->tile = (int)v;
            env->tune = false; /* a forced tile is for tests and debugging: no measuring */
        } else {
            *bad = true;
        }
    }
}

const char *mmtune_choice_name(int choice, mmtune_tile_name_fn *tile_name, char *buf,
                               size_t size) {
    if (choice == MMTUNE_GEMM)
        snprintf(buf, size, "cuBLAS");
    else if (choice == MMTUNE_MMV)
        snprintf(buf, size, "mmv x8");
    else if (choice == MMTUNE_MMB)
        snprintf(buf, size, "mmb");
    else if (choice == MMTUNE_MMQ_AUTO)
        snprintf(buf, size, "mmq auto");
    else if (choice >= 0 && tile_name) {
        char tn[32];
        tile_name(choice, tn, sizeof tn);
        snprintf(buf, size, "mmq %s", tn);
    } else
        snprintf(buf, size, "choice %d", choice);
    return buf;
}

/* Appends to buf at *at (bounded; *at stops at size - 1). */
static void put(char *buf, size_t size, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t size, size_t *at, const char *fmt, ...) {
    if (*at + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    *at += (size_t)w < size - *at ? (size_t)w : size - *at - 1;
}

static int ent_cmp(const void *pa, const void *pb) {
    const struct mmtune_ent *a = pa, *b = pb;
    if (a->key.type != b->key.type) return a->key.type < b->key.type ? -1 : 1;
    if (a->key.rows != b->key.rows) return a->key.rows < b->key.rows ? -1 : 1;
    if (a->key.k != b->key.k) return a->key.k < b->key.k ? -1 : 1;
    return (a->key.bucket > b->key.bucket) - (a->key.bucket < b->key.bucket);
}

size_t mmtune_format(const struct mmtune *t, mmtune_tile_name_fn *tile_name, char *buf,
                     size_t size) {
    size_t at = 0;
    if (!size) return 0;
    buf[0] = '\0';
    if (!t->n) return 0;
    struct mmtune_ent *s = malloc((size_t)t->n * sizeof *s);
    if (!s) {
        put(buf, size, &at, "(%d shapes; no memory to sort them)", t->n);
        return at;
    }
    memcpy(s, t->e, (size_t)t->n * sizeof *s);
    qsort(s, (size_t)t->n, sizeof *s, ent_cmp);
    for (int i = 0; i < t->n; i++) {
        const bool first = i == 0 || s[i - 1].key.type != s[i].key.type ||
                           s[i - 1].key.rows != s[i].key.rows || s[i - 1].key.k != s[i].key.k;
        if (first)
            put(buf, size, &at, "%s%s %lldx%lld:", i ? "\n" : "", qtype_name(s[i].key.type),
                (long long)s[i].key.rows, (long long)s[i].key.k);
        int64_t lo, hi;
        mmtune_bucket_range(s[i].key.bucket, &lo, &hi);
        char name[32];
        mmtune_choice_name(s[i].choice, tile_name, name, sizeof name);
        if (hi == INT64_MAX)
            put(buf, size, &at, "%s >%lld %s", first ? "" : ",", (long long)lo - 1, name);
        else
            put(buf, size, &at, "%s %lld-%lld %s", first ? "" : ",", (long long)lo, (long long)hi,
                name);
        if (s[i].us > 0)
            put(buf, size, &at, " (%.1f us at n=%lld)", s[i].us, (long long)s[i].n);
        else
            put(buf, size, &at, " (static)");
    }
    free(s);
    return at;
}

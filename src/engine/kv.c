/* Paged KV bookkeeping: a free stack of block ids with reference counts, and block
 * tables per sequence. See kv.h. */
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util/array.h"
#include "util/mix.h"

/* The prefix-cache index. Hash table: open addressing over block ids keyed by hash[id]
 * (linear probing, backward-shift deletion, load <= 1/2). LRU: a doubly linked list of
 * idle cached blocks, most recently parked at the head; eviction takes the tail. */
struct kv_prefix {
    uint64_t key0, key1;
    uint64_t *hash;   /* (n_blocks) 0 = not registered */
    uint64_t *parent; /* (n_blocks) parent hash of a registered block */
    int32_t *tokens;  /* (n_blocks * block_size) contents of registered blocks */
    int32_t *table;   /* (mask + 1) block ids, -1 = empty */
    uint32_t mask;
    int32_t *prev, *next; /* (n_blocks) LRU links, -1 = none */
    int32_t head, tail, n_idle, n_registered;
    uint64_t hits, queries, evictions;
};

/* Recurrent state slots: a free stack, each snapshot's block (and each block's snapshot),
 * and an LRU list of idle snapshots (on unreferenced cached blocks), evicted from the
 * tail. */
struct kv_slots {
    int32_t n, max_live, n_live, n_snap;
    int32_t *free_ids, n_free;
    int32_t *snap_of;     /* (n_blocks) snapshot slot of each block, -1 */
    int32_t *blk_of;      /* (n) the block a snapshot slot belongs to, -1: free or live */
    int32_t *prev, *next; /* (n) idle-snapshot LRU links, -1 = none */
    int32_t head, tail, n_idle;
};

smelt_status kv_pool_init(struct kv_pool *p, int32_t n_blocks, int32_t block_size,
                          struct err *e) {
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || block_size < 1 || n_blocks > (1 << 24) || block_size > 4096)
        return err_set(e, SMELT_ERR_INVALID, "KV pool: %d blocks of %d tokens", n_blocks,
                       block_size);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    if (!p->free_ids || !p->ref) {
        kv_pool_free(p);
        return err_set(e, SMELT_ERR_NOMEM, "KV pool: out of memory");
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* Block 0 on top of the stack: a fresh pool hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return SMELT_OK;
}

static void prefix_free(struct kv_prefix *c) {
    if (!c) return;
    free(c->hash);
    free(c->parent);
    free(c->tokens);
    free(c->table);
    free(c->prev);
    free(c->next);
    free(c);
}

static void slots_free(struct kv_slots *sl) {
    if (!sl) return;
    free(sl->free_ids);
    free(sl->snap_of);
    free(sl->blk_of);
    free(sl->prev);
    free(sl->next);
    free(sl);
}

void kv_pool_free(struct kv_pool *p) {
    free(p->free_ids);
    free(p->ref);
    prefix_free(p->prefix);
    slots_free(p->slots);
    memset(p, 0, sizeof *p);
}

int32_t kv_pool_available(const struct kv_pool *p) {
    return p->n_free + (p->prefix ? p->prefix->n_idle : 0);
}

/* ---- state slot internals ---- */

static void idle_unlink(struct kv_slots *sl, int32_t x) {
    int32_t pv = sl->prev[x], nx = sl->next[x];
    if (pv >= 0) sl->next[pv] = nx;
    else sl->head = nx;
    if (nx >= 0) sl->prev[nx] = pv;
    else sl->tail = pv;
    sl->prev[x] = sl->next[x] = -1;
    sl->n_idle--;
}

static void idle_push(struct kv_slots *sl, int32_t x) {
    sl->prev[x] = -1;
    sl->next[x] = sl->head;
    if (sl->head >= 0) sl->prev[sl->head] = x;
    else sl->tail = x;
    sl->head = x;
    sl->n_idle++;
}

/* Detaches block id's snapshot (if any) and frees its slot. */
static void snap_drop(struct kv_pool *p, int32_t id) {
    struct kv_slots *sl = p->slots;
    if (!sl || sl->snap_of[id] < 0) return;
    int32_t x = sl->snap_of[id];
    if (p->ref[id] == 0) idle_unlink(sl, x); /* a snapshot is idle while its block is */
    sl->snap_of[id] = -1;
    sl->blk_of[x] = -1;
    sl->n_snap--;
    sl->free_ids[sl->n_free++] = x;
}

/* A slot: a free one, else the least recently idled snapshot's. -1 when none. */
static int32_t slot_take(struct kv_pool *p) {
    struct kv_slots *sl = p->slots;
    if (sl->n_free == 0 && sl->n_idle > 0) snap_drop(p, sl->blk_of[sl->tail]);
    return sl->n_free > 0 ? sl->free_ids[--sl->n_free] : -1;
}

/* ---- prefix cache internals ---- */


uint64_t kv_block_hash(const struct kv_pool *p, uint64_t parent, const int32_t *tokens) {
    const struct kv_prefix *c = p->prefix;
    uint64_t k0 = c ? c->key0 : 0x9e3779b97f4a7c15ull, k1 = c ? c->key1 : 0x2545f4914f6cdd1dull;
    uint64_t a = mix64(parent ^ k0), b = k1;
    for (int32_t i = 0; i < p->block_size; i++) {
        a = mix64(a ^ (uint32_t)tokens[i]) + b;
        b = (b << 23 | b >> 41) ^ a;
    }
    uint64_t h = mix64(a ^ mix64(b));
    return h ? h : 1;
}

static void lru_unlink(struct kv_prefix *c, int32_t id) {
    int32_t pv = c->prev[id], nx = c->next[id];
    if (pv >= 0) c->next[pv] = nx;
    else c->head = nx;
    if (nx >= 0) c->prev[nx] = pv;
    else c->tail = pv;
    c->prev[id] = c->next[id] = -1;
    c->n_idle--;
}

static void lru_push_head(struct kv_prefix *c, int32_t id) {
    c->prev[id] = -1;
    c->next[id] = c->head;
    if (c->head >= 0) c->prev[c->head] = id;
    else c->tail = id;
    c->head = id;
    c->n_idle++;
}

/* Slot of hash h in the table, or the empty slot where it would go. */
static uint32_t table_find(const struct kv_prefix *c, uint64_t h) {
    uint32_t i = (uint32_t)h & c->mask;
    while (c->table[i] >= 0 && c->hash[c->table[i]] != h) i = (i + 1) & c->mask;
    return i;
}

/* Removes block id (registered) from the table: backward-shift deletion keeps every
 * probe chain unbroken without tombstones. */
static void table_remove(struct kv_prefix *c, int32_t id) {
    uint32_t i = table_find(c, c->hash[id]);
    c->table[i] = -1;
    for (uint32_t j = (i + 1) & c->mask; c->table[j] >= 0; j = (j + 1) & c->mask) {
        int32_t b = c->table[j];
        uint32_t home = (uint32_t)c->hash[b] & c->mask;
        /* b may move to i when i lies cyclically in [home, j) */
        if (((j - home) & c->mask) >= ((j - i) & c->mask)) {
            c->table[i] = b;
            c->table[j] = -1;
            i = j;
        }
    }
    c->hash[id] = 0;
    c->n_registered--;
}

smelt_status kv_prefix_enable(struct kv_pool *p, struct err *e) {
    if (p->prefix) return SMELT_OK;
    struct kv_prefix *c = calloc(1, sizeof *c);
    size_t nb = (size_t)p->n_blocks;
    uint32_t cap = 2;
    while (cap < 2 * nb) cap *= 2;
    if (c) {
        c->hash = calloc(nb, sizeof *c->hash);
        c->parent = calloc(nb, sizeof *c->parent);
        c->tokens = malloc(nb * (size_t)p->block_size * sizeof *c->tokens);
        c->table = malloc(cap * sizeof *c->table);
        c->prev = malloc(nb * sizeof *c->prev);
        c->next = malloc(nb * sizeof *c->next);
    }
    if (!c || !c->hash || !c->parent || !c->tokens || !c->table || !c->prev || !c->next) {
        prefix_free(c);
        return err_set(e, SMELT_ERR_NOMEM, "KV prefix cache: out of memory");
    }
    c->mask = cap - 1;
    memset(c->table, 0xff, cap * sizeof *c->table);
    memset(c->prev, 0xff, nb * sizeof *c->prev);
    memset(c->next, 0xff, nb * sizeof *c->next);
    c->head = c->tail = -1;
    uint64_t key[2];
    if (getrandom(key, sizeof key, GRND_NONBLOCK) != (ssize_t)sizeof key) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        key[0] = mix64((uint64_t)t.tv_nsec ^ (uint64_t)(uintptr_t)c);
        key[1] = mix64(key[0] ^ (uint64_t)t.tv_sec);
    }
    c->key0 = key[0];
    c->key1 = key[1];
    p->prefix = c;
    return SMELT_OK;
}

int32_t kv_prefix_acquire(struct kv_pool *p, struct kv_seq *s, const int32_t *tokens,
                          int32_t max_blocks, uint64_t *hashes) {
    struct kv_prefix *c = p->prefix;
    if (!c || max_blocks <= 0 || s->n_blocks != 0) return 0;
    c->queries += (uint64_t)max_blocks;
    uint64_t parent = 0;
    int32_t bs = p->block_size, n = 0;
    for (; n < max_blocks; n++) {
        const int32_t *t = tokens + (size_t)n * (size_t)bs;
        uint64_t h = kv_block_hash(p, parent, t);
        int32_t id = c->table[table_find(c, h)];
        if (id < 0 || c->parent[id] != parent || p->ref[id] == UINT16_MAX ||
            memcmp(c->tokens + (size_t)id * (size_t)bs, t, (size_t)bs * sizeof *t) != 0)
            break;
        if (!array_grow((void **)&s->blocks, &s->cap, (size_t)n + 1, sizeof *s->blocks)) {
            kv_seq_release(p, s);
            return 0;
        }
        if (p->ref[id] == 0) {
            lru_unlink(c, id);
            if (p->slots && p->slots->snap_of[id] >= 0)
                idle_unlink(p->slots, p->slots->snap_of[id]);
        }
        p->ref[id]++;
        s->blocks[s->n_blocks++] = id;
        hashes[n] = h;
        parent = h;
    }
    if (p->slots) { /* a recurrent state resumes only where a snapshot is */
        while (n > 0 && p->slots->snap_of[s->blocks[n - 1]] < 0) kv_seq_truncate(p, s, --n * bs);
        s->restore = n > 0 ? p->slots->snap_of[s->blocks[n - 1]] : -1;
    }
    c->hits += (uint64_t)n;
    return n;
}

void kv_prefix_register(struct kv_pool *p, int32_t id, uint64_t h, uint64_t parent,
                        const int32_t *tokens) {
    struct kv_prefix *c = p->prefix;
    if (!c || id < 0 || id >= p->n_blocks || c->hash[id] != 0 || h == 0) return;
    uint32_t i = table_find(c, h);
    if (c->table[i] >= 0) {
        /* the same content is cached: a snapshot only this copy has moves to the cached
         * block (the state after the same tokens is the same state) */
        struct kv_slots *sl = p->slots;
        int32_t to = c->table[i];
        if (sl && sl->snap_of[id] >= 0 && sl->snap_of[to] < 0 && c->parent[to] == parent &&
            !memcmp(c->tokens + (size_t)to * (size_t)p->block_size, tokens,
                    (size_t)p->block_size * sizeof *tokens)) {
            int32_t x = sl->snap_of[id];
            sl->snap_of[id] = -1;
            sl->snap_of[to] = x;
            sl->blk_of[x] = to;
            if (p->ref[to] == 0) idle_push(sl, x);
        }
        return;
    }
    c->table[i] = id;
    c->hash[id] = h;
    c->parent[id] = parent;
    memcpy(c->tokens + (size_t)id * (size_t)p->block_size, tokens,
           (size_t)p->block_size * sizeof *tokens);
    c->n_registered++;
}

void kv_pool_stats(const struct kv_pool *p, struct kv_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_blocks = p->n_blocks;
    out->block_size = p->block_size;
    out->free = p->n_free;
    if (p->prefix) {
        out->cached = p->prefix->n_registered;
        out->idle = p->prefix->n_idle;
        out->hit_blocks = p->prefix->hits;
        out->query_blocks = p->prefix->queries;
        out->evictions = p->prefix->evictions;
    }
    out->used = p->n_blocks - out->free - out->idle;
    if (p->slots) {
        out->n_slots = p->slots->n;
        out->live_slots = p->slots->n_live;
        out->snapshots = p->slots->n_snap;
        out->idle_snapshots = p->slots->n_idle;
    }
}

int32_t kv_blocks_for(const struct kv_pool *p, int32_t n_tokens) {
    if (n_tokens <= 0) return 0;
    return (int32_t)(((int64_t)n_tokens + p->block_size - 1) / p->block_size);
}

/* Drops one reference; the last one parks a cached block on the LRU list, else frees it. */
static void unref(struct kv_pool *p, int32_t id) {
    if (p->ref[id] > 0 && --p->ref[id] == 0) {
        if (p->prefix && p->prefix->hash[id] != 0) {
            lru_push_head(p->prefix, id);
            if (p->slots && p->slots->snap_of[id] >= 0) idle_push(p->slots, p->slots->snap_of[id]);
        } else {
            p->ref[id] = 1; /* snap_drop reads an unreferenced block's snapshot as idle */
            snap_drop(p, id);
            p->ref[id] = 0;
            p->free_ids[p->n_free++] = id;
        }
    }
}

/* A block for a reservation: the free stack first, else the least recently parked idle
 * cached block (unregistered). Caller checked kv_pool_available. */
static int32_t take_block(struct kv_pool *p) {
    if (p->n_free > 0) return p->free_ids[--p->n_free];
    struct kv_prefix *c = p->prefix;
    int32_t id = c->tail;
    snap_drop(p, id);
    lru_unlink(c, id);
    table_remove(c, id);
    c->evictions++;
    return id;
}

void kv_seq_init(struct kv_seq *s) {
    memset(s, 0, sizeof *s);
    s->slot = s->restore = s->snap_keep = s->snap_last[0] = s->snap_last[1] = -1;
}

smelt_status kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens, struct err *e) {
    int32_t need = kv_blocks_for(p, n_tokens);
    bool want_slot = p->slots && s->slot < 0;
    if (want_slot && kv_slots_available(p) < 1)
        return err_set(e, SMELT_ERR_RANGE, "no free recurrent state slot (%d slots)", p->slots->n);
    int32_t more = need - s->n_blocks;
    if (more > kv_pool_available(p))
        return err_set(e, SMELT_ERR_RANGE, "KV cache full: %d more blocks needed, %d free", more,
                       kv_pool_available(p));
    if (more <= 0) more = 0;
    if (!array_grow((void **)&s->blocks, &s->cap, (size_t)need, sizeof *s->blocks))
        return err_set(e, SMELT_ERR_NOMEM, "KV block table: out of memory");
    while (s->n_blocks < need) {
        int32_t id = take_block(p);
        p->ref[id] = 1;
        s->blocks[s->n_blocks++] = id;
    }
    if (want_slot) { /* after the blocks: evicting one may have freed a snapshot's slot */
        s->slot = slot_take(p);
        p->slots->n_live++;
    }
    return SMELT_OK;
}

void kv_seq_truncate(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens) {
    int32_t keep = kv_blocks_for(p, n_tokens);
    while (s->n_blocks > keep) unref(p, s->blocks[--s->n_blocks]);
    int32_t valid = 0; /* blocks that end by n_tokens */
    if (keep > 0) {
        valid = n_tokens / p->block_size;
        if (valid < keep) { /* the partly kept block changes */
            int32_t id = s->blocks[keep - 1];
            snap_drop(p, id);
            if (p->prefix && p->prefix->hash[id] && p->ref[id] == 1) table_remove(p->prefix, id);
        }
    }
    if (s->snap_keep >= valid) s->snap_keep = -1;
    if (s->snap_last[1] >= valid) s->snap_last[1] = -1;
    if (s->snap_last[0] >= valid) s->snap_last[0] = s->snap_last[1], s->snap_last[1] = -1;
}

void kv_seq_release(struct kv_pool *p, struct kv_seq *s) {
    kv_seq_truncate(p, s, 0);
    if (p->slots && s->slot >= 0) {
        p->slots->free_ids[p->slots->n_free++] = s->slot;
        p->slots->n_live--;
    }
    free(s->blocks);
    kv_seq_init(s);
}

/* ---- recurrent state slots ---- */

smelt_status kv_slots_enable(struct kv_pool *p, int32_t n_slots, int32_t max_live, struct err *e) {
    if (p->slots) return SMELT_OK;
    if (max_live < 1 || n_slots < max_live || n_slots > (1 << 20))
        return err_set(e, SMELT_ERR_INVALID, "state slots: %d slots for %d live states", n_slots,
                       max_live);
    struct kv_slots *sl = calloc(1, sizeof *sl);
    size_t n = (size_t)n_slots, nb = (size_t)p->n_blocks;
    if (sl) {
        sl->free_ids = malloc(n * sizeof *sl->free_ids);
        sl->snap_of = malloc(nb * sizeof *sl->snap_of);
        sl->blk_of = malloc(n * sizeof *sl->blk_of);
        sl->prev = malloc(n * sizeof *sl->prev);
        sl->next = malloc(n * sizeof *sl->next);
    }
    if (!sl || !sl->free_ids || !sl->snap_of || !sl->blk_of || !sl->prev || !sl->next) {
        slots_free(sl);
        return err_set(e, SMELT_ERR_NOMEM, "state slots: out of memory");
    }
    sl->n = n_slots;
    sl->max_live = max_live;
    for (int32_t i = 0; i < n_slots; i++) sl->free_ids[i] = n_slots - 1 - i; /* 0 first */
    sl->n_free = n_slots;
    memset(sl->snap_of, 0xff, nb * sizeof *sl->snap_of);
    memset(sl->blk_of, 0xff, n * sizeof *sl->blk_of);
    memset(sl->prev, 0xff, n * sizeof *sl->prev);
    memset(sl->next, 0xff, n * sizeof *sl->next);
    sl->head = sl->tail = -1;
    p->slots = sl;
    return SMELT_OK;
}

int32_t kv_slots_available(const struct kv_pool *p) {
    return p->slots ? p->slots->n_free + p->slots->n_idle : 0;
}

/* Drops the snapshot on s's block index j (-1: none), unless another of s's holds it. */
static void drop_own(struct kv_pool *p, struct kv_seq *s, int32_t j, int32_t o1, int32_t o2) {
    if (j >= 0 && j != o1 && j != o2 && j < s->n_blocks) snap_drop(p, s->blocks[j]);
}

struct batch_seq kv_seq_step(struct kv_pool *p, struct kv_seq *s, int32_t p0, int32_t p1,
                             bool keep) {
    struct batch_seq b = kv_seq_view(s);
    struct kv_slots *sl = p->slots;
    int32_t bs = p->block_size, j = p1 / bs - 1; /* the block ending at the last boundary */
    if (!sl || s->slot < 0 || j < 0 || (j + 1) * bs <= p0 || j >= s->n_blocks ||
        sl->snap_of[s->blocks[j]] >= 0)
        return b;
    /* never take a slot a live state may still need */
    if (sl->n_free + sl->n_idle <= sl->max_live - sl->n_live) return b;
    int32_t x = slot_take(p);
    if (x < 0) return b;
    int32_t id = s->blocks[j];
    sl->snap_of[id] = x;
    sl->blk_of[x] = id;
    sl->n_snap++;
    if (keep) {
        drop_own(p, s, s->snap_keep, s->snap_last[0], s->snap_last[1]);
        s->snap_keep = j;
    } else if (s->snap_last[1] < 0) {
        s->snap_last[1] = j;
    } else {
        drop_own(p, s, s->snap_last[0], s->snap_keep, s->snap_last[1]);
        s->snap_last[0] = s->snap_last[1];
        s->snap_last[1] = j;
    }
    b.snap_slot = x;
    b.snap_pos = (j + 1) * bs;
    return b;
}

void kv_seq_rollback(struct kv_pool *p, struct kv_seq *s, int32_t n_keep, int32_t *from) {
    kv_seq_truncate(p, s, n_keep);
    *from = n_keep;
    if (!p->slots) return;
    *from = 0;
    s->restore = -1;
    for (int32_t j = n_keep / p->block_size - 1; j >= 0; j--) {
        int32_t x = p->slots->snap_of[s->blocks[j]];
        if (x >= 0) {
            s->restore = x;
            *from = (j + 1) * p->block_size;
            return;
        }
    }
}

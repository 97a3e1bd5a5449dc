#include "util/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"

#define MARK_SHIFT 48 /* a mark is (chunk index << 48) | offset in that chunk */

static void *host_alloc(void *ctx, size_t align, size_t n) {
    (void)ctx;
    return aligned_alloc(align, (n + align - 1) & ~(align - 1));
}

static void host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

void arena_init_mem(struct arena *a, size_t align, size_t min_chunk, const struct arena_mem *mem) {
    memset(a, 0, sizeof *a);
    a->align = align;
    a->min_chunk = min_chunk;
    a->mem = mem ? *mem : (struct arena_mem){host_alloc, host_free, NULL};
}

void arena_init(struct arena *a) { arena_init_mem(a, 64, (size_t)1 << 20, NULL); }

static size_t total_cap(const struct arena *a) {
    size_t total = 0;
    for (size_t i = 0; i < a->n; i++) total += a->chunks[i].cap;
    return total;
}

static void free_chunks(struct arena *a) {
    for (size_t i = 0; i < a->n; i++) a->mem.free(a->mem.ctx, a->chunks[i].base);
    a->n = a->cur = 0;
}

void arena_free(struct arena *a) {
    free_chunks(a);
    free(a->chunks);
    struct arena_mem mem = a->mem;
    arena_init_mem(a, a->align, a->min_chunk, &mem);
}

static void note_peak(struct arena *a) {
    size_t at = a->chunks[a->cur].used;
    for (size_t i = 0; i < a->cur; i++) at += a->chunks[i].cap;
    if (at > a->peak) a->peak = at;
}

/* Makes room for one more chunk in the list. */
static bool room_for_chunk(struct arena *a) {
    return array_grow((void **)&a->chunks, &a->cap, a->n + 1, sizeof *a->chunks);
}

void *arena_alloc(struct arena *a, size_t n) {
    if (n == 0) n = 1;
    size_t need = (n + a->align - 1) & ~(a->align - 1);
    if (need < n || need >= ((size_t)1 << MARK_SHIFT)) return NULL;
    while (a->cur < a->n) {
        struct arena_chunk *c = &a->chunks[a->cur];
        if (c->cap - c->used >= need) {
            void *p = c->base + c->used;
            c->used += need;
            note_peak(a);
            return p;
        }
        if (a->cur + 1 >= a->n) break;
        a->cur++;
        a->chunks[a->cur].used = 0;
    }
    /* A new chunk after the current one: at least double what exists. */
    size_t total = total_cap(a);
    size_t cap = need > total ? need : total;
    if (cap < a->min_chunk) cap = a->min_chunk;
    if (!room_for_chunk(a)) return NULL;
    unsigned char *base = a->mem.alloc(a->mem.ctx, a->align, cap);
    if (!base) return NULL;
    size_t at = a->n ? a->cur + 1 : 0;
    memmove(&a->chunks[at + 1], &a->chunks[at], (size_t)(a->n - at) * sizeof a->chunks[0]);
    a->chunks[at] = (struct arena_chunk){base, cap, need};
    a->n++;
    a->cur = at;
    note_peak(a);
    return base;
}

void *arena_calloc(struct arena *a, size_t n) {
    void *p = arena_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

size_t arena_mark(const struct arena *a) {
    if (!a->n) return 0;
    return ((size_t)a->cur << MARK_SHIFT) | a->chunks[a->cur].used;
}

void arena_release(struct arena *a, size_t mark) {
    if (!a->n) return;
    size_t cur = mark >> MARK_SHIFT;
    size_t used = mark & (((size_t)1 << MARK_SHIFT) - 1);
    if (cur > a->cur || (cur == a->cur && used > a->chunks[cur].used)) return; /* stale */
    a->cur = cur;
    a->chunks[cur].used = used;
}

bool arena_will_merge(const struct arena *a) { return a->n > 1; }

/* Replaces every chunk by one empty chunk of cap bytes (the old ones freed first, so the
 * memory is never held twice); false, and no chunk, when the allocation fails. */
static bool one_chunk(struct arena *a, size_t cap) {
    free_chunks(a);
    if (!room_for_chunk(a)) return false;
    unsigned char *base = a->mem.alloc(a->mem.ctx, a->align, cap);
    if (!base) return false;
    a->chunks[0] = (struct arena_chunk){base, cap, 0};
    a->n = 1;
    return true;
}

void arena_reset(struct arena *a) {
    if (a->n > 1) one_chunk(a, total_cap(a));
    a->cur = 0;
    if (a->n) a->chunks[0].used = 0;
}

bool arena_reserve(struct arena *a, size_t n) {
    size_t total = total_cap(a);
    if (a->n == 1 && total >= n) {
        a->cur = 0;
        a->chunks[0].used = 0;
        return true;
    }
    size_t cap = total > n ? total : n;
    cap = (cap + a->align - 1) & ~(a->align - 1);
    return one_chunk(a, cap ? cap : a->align);
}

size_t arena_peak(const struct arena *a) { return a->peak; }

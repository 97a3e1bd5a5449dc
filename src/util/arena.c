#include "util/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 64

struct arena_chunk {
    struct arena_chunk *next;
    size_t size;
};

void arena_init(struct arena *a) { memset(a, 0, sizeof *a); }

static void free_spill(struct arena *a) {
    struct arena_chunk *c = a->spill;
    while (c) {
        struct arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->spill = NULL;
}

void arena_free(struct arena *a) {
    free_spill(a);
    free(a->base);
    memset(a, 0, sizeof *a);
}

void *arena_alloc(struct arena *a, size_t n) {
    size_t need = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need < n) return NULL;
    if (a->base && a->used + need <= a->cap && a->used + need >= a->used) {
        void *p = a->base + a->used;
        a->used += need;
        if (a->used > a->peak) a->peak = a->used;
        return p;
    }
    /* Spill: a separate chunk, freed at reset; the next reset grows the main block. */
    size_t hdr = (sizeof(struct arena_chunk) + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need > SIZE_MAX - hdr) return NULL;
    struct arena_chunk *c = aligned_alloc(ARENA_ALIGN, hdr + need);
    if (!c) return NULL;
    c->next = a->spill;
    c->size = need;
    a->spill = c;
    size_t total = a->used + need;
    if (total > a->peak) a->peak = total;
    return (unsigned char *)c + hdr;
}

void *arena_calloc(struct arena *a, size_t n) {
    void *p = arena_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void arena_reset(struct arena *a) {
    int spilled = a->spill != NULL;
    free_spill(a);
    if (spilled || !a->base) {
        size_t cap = a->peak ? a->peak : 1 << 20;
        cap = (cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
        void *nb = aligned_alloc(ARENA_ALIGN, cap);
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = cap;
        }
    }
    a->used = 0;
}

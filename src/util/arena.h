/* Bump allocator for per-step scratch: one block grown on demand, reset each step.
 * Allocations are 64-byte aligned (cache line, AVX-512 loads). */
#ifndef SMELT_UTIL_ARENA_H
#define SMELT_UTIL_ARENA_H

#include <stddef.h>

struct arena {
    unsigned char *base; /* current block */
    size_t cap, used;
    size_t peak; /* largest `used` seen since init: sizes the next reset's block */
    struct arena_chunk *spill; /* blocks that did not fit, freed on reset */
};

void arena_init(struct arena *a);
void arena_free(struct arena *a);
/* Returns 64-byte-aligned memory of n bytes, or NULL when out of memory. */
void *arena_alloc(struct arena *a, size_t n);
/* Same, zero-filled. */
void *arena_calloc(struct arena *a, size_t n);
/* Releases everything allocated since init/reset; keeps one block of the peak size. */
void arena_reset(struct arena *a);

#endif

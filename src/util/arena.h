/* Scratch memory as a stack: per-step temporaries (tensors, a step's host inputs,
 * quantized activations) without a malloc per allocation or per step.
 *
 * The stack is a list of chunks. An allocation bumps the current chunk, or moves on to
 * the next one kept from earlier use, or adds a chunk after the current one that at
 * least doubles the total; memory already handed out never moves, so every pointer
 * stays valid until a release below it or a reset. A mark (arena_mark) taken before a
 * layer's temporaries and released after them (arena_release) rewinds the stack, so the
 * next layer reuses the same memory. A reset empties the stack and, when it holds more
 * than one chunk, merges them into one of their total size: a steady workload runs in
 * one block. The peak (arena_peak) is the highest end of use, counted as if the chunks
 * were one block: what a later arena_reserve needs to run the same work with no growth.
 *
 * Chunks are host memory (aligned_alloc) unless arena_init_mem names another allocator
 * (a device's): the arena then only does the bookkeeping and never touches the memory.
 * Not thread-safe: one owner at a time. */
#ifndef SMELT_UTIL_ARENA_H
#define SMELT_UTIL_ARENA_H

#include <stdbool.h>
#include <stddef.h>

/* Where chunks come from: alloc returns n bytes aligned to align (a power of two, a
 * multiple of sizeof(void *)), or NULL; free releases what alloc returned. */
struct arena_mem {
    void *(*alloc)(void *ctx, size_t align, size_t n);
    void (*free)(void *ctx, void *p);
    void *ctx;
};

struct arena_chunk {
    unsigned char *base;
    size_t cap, used;
};

struct arena {
    struct arena_chunk *chunks; /* in stack order; [cur] is being filled, later ones wait */
    size_t n, cap, cur;
    size_t peak;      /* highest end of use since init, as if the chunks were one block */
    size_t align;     /* of every allocation */
    size_t min_chunk; /* smallest chunk added */
    struct arena_mem mem;
};

/* An empty arena of host memory: 64-byte-aligned allocations (cache lines, AVX-512
 * loads), chunks of at least 1 MiB. Allocates nothing until the first arena_alloc. */
void arena_init(struct arena *a);
/* An empty arena whose chunks come from mem (copied; NULL: host memory), allocations
 * aligned to align (a power of two), chunks of at least min_chunk bytes. */
void arena_init_mem(struct arena *a, size_t align, size_t min_chunk, const struct arena_mem *mem);
/* Frees every chunk; a is then empty (initialized again, same allocator). */
void arena_free(struct arena *a);

/* n bytes (0 counts as 1) aligned to a->align, or NULL when the allocator fails or n is
 * absurd (2^48 bytes or more). */
void *arena_alloc(struct arena *a, size_t n);
/* Same, zero-filled: host memory only. */
void *arena_calloc(struct arena *a, size_t n);

/* The top of the stack now. */
size_t arena_mark(const struct arena *a);
/* Rewinds to mark: what was allocated since arena_mark returned it is free again. A mark
 * above the top (from before a release or a reset) is ignored. */
void arena_release(struct arena *a, size_t mark);

/* True when the next arena_reset frees chunks (it merges several): an owner whose
 * memory may still be in use (a device's queued work) must wait for it first. */
bool arena_will_merge(const struct arena *a);
/* Empties the stack; merges several chunks into one of their total size (if that
 * allocation fails, the arena is left empty and grows again on demand). */
void arena_reset(struct arena *a);
/* Empties the stack into one chunk of at least n bytes; false (and the arena empty) when
 * the allocator fails. */
bool arena_reserve(struct arena *a, size_t n);
/* The peak: see above. */
size_t arena_peak(const struct arena *a);

#endif

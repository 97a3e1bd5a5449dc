/* Paged KV cache bookkeeping: which blocks are free, and each sequence's block table.
 *
 * The storage itself (one K and one V tensor per layer, indexed by block id) belongs to
 * the model and backend (struct kv_store in model/model.h); this module deals in block
 * ids only, so it is the same for every device and KV element type.
 *
 * - A pool hands out block ids from a free stack (the most recently freed block is
 *   reused first) and counts references per block, so prefix caching can later share
 *   full blocks between sequences.
 * - A sequence's table maps position p to block blocks[p / block_size]. Reserving grows
 *   the table to cover a number of positions; truncating (a rollback of rejected draft
 *   tokens, or trimming) and releasing return whole blocks.
 * - Nothing is cleared when a block is recycled: attention never reads a position past
 *   the query's own, and every position up to it was written by the new owner first.
 */
#ifndef SMELT_ENGINE_KV_H
#define SMELT_ENGINE_KV_H

#include <stdint.h>

#include "model/batch.h"
#include "util/err.h"

struct kv_pool {
    int32_t n_blocks, block_size;
    int32_t *free_ids; /* stack of free block ids: free_ids[0 .. n_free) */
    int32_t n_free;
    uint16_t *ref;     /* (n_blocks) references held on each block; 0 = free */
};

smelt_status kv_pool_init(struct kv_pool *p, int32_t n_blocks, int32_t block_size,
                          struct err *e);
void kv_pool_free(struct kv_pool *p);
/* Blocks needed to hold n_tokens positions. */
int32_t kv_blocks_for(const struct kv_pool *p, int32_t n_tokens);

/* One sequence's block table. */
struct kv_seq {
    int32_t *blocks; /* (n_blocks) */
    int32_t n_blocks, cap;
};

void kv_seq_init(struct kv_seq *s);
/* Grows s's table to cover positions [0, n_tokens). Takes nothing and returns
 * SMELT_ERR_RANGE when the pool has too few free blocks; SMELT_ERR_NOMEM. */
smelt_status kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens, struct err *e);
/* Keeps positions [0, n_tokens) and returns the blocks no longer needed. */
void kv_seq_truncate(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens);
/* Returns every block and frees the table. */
void kv_seq_release(struct kv_pool *p, struct kv_seq *s);
/* The batch's view of s's table (valid until s changes). */
static inline struct batch_seq kv_seq_view(const struct kv_seq *s) {
    struct batch_seq b = {s->blocks, s->n_blocks};
    return b;
}

#endif

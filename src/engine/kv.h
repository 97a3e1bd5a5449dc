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
 * - Prefix caching (optional, kv_prefix_enable): a full block whose K/V are computed can
 *   be registered under a content hash h = H(parent's h, the block's tokens). When its
 *   last reference goes, a registered block is not freed but parked on an LRU list; a
 *   later sequence whose tokens hash to the same chain takes it back (kv_prefix_acquire)
 *   and skips recomputing it. Blocks are handed out from the free stack first, then by
 *   evicting the least recently parked cached block. A lookup checks the stored tokens
 *   and parent hash too, so a hash collision can never hand out the wrong K/V. Cached
 *   blocks are full and never written again: a sequence only writes positions past the
 *   ones it took from the cache.
 * - Recurrent state slots (optional, kv_slots_enable; a model with recurrent layers):
 *   a running sequence holds one *live* slot (its state after the positions it has done).
 *   A *snapshot* slot holds the state at the end of one block (after its last position)
 *   and belongs to that block: it is cached, shared, parked and evicted with the block.
 *   A prefix-cache hit takes the longest chain of cached blocks whose last block has a
 *   snapshot, and the caller copies the snapshot into the live slot (model_state_copy).
 *   A sequence keeps at most three snapshots while it runs: a *kept* one (the engine: at
 *   the end of the prompt's last full block) and two *trailing* ones (the latest block
 *   boundaries it passed in its steps; a new one replaces the older), so a rollback of up
 *   to block_size positions always finds a snapshot fewer than 2 * block_size positions
 *   back. An idle snapshot
 *   (its block unreferenced) is evicted first when a slot is needed; snapshots never
 *   take the last slots that live states may still need (max_live).
 */
#ifndef SMELT_ENGINE_KV_H
#define SMELT_ENGINE_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "model/batch.h"
#include "util/err.h"

struct kv_pool {
    int32_t n_blocks, block_size;
    int32_t *free_ids; /* stack of free block ids: free_ids[0 .. n_free) */
    int32_t n_free;
    uint16_t *ref;     /* (n_blocks) references held on each block; 0 = free */
    struct kv_prefix *prefix; /* prefix-cache index, NULL when off (kv.c) */
    struct kv_slots *slots;   /* recurrent state slots, NULL when the model has none (kv.c) */
};

smelt_status kv_pool_init(struct kv_pool *p, int32_t n_blocks, int32_t block_size,
                          struct err *e);
void kv_pool_free(struct kv_pool *p);
/* Blocks needed to hold n_tokens positions. */
int32_t kv_blocks_for(const struct kv_pool *p, int32_t n_tokens);

/* Blocks a reservation can take now: free ones plus idle cached ones (evictable). */
int32_t kv_pool_available(const struct kv_pool *p);

/* One sequence's block table, and its state slots. */
struct kv_seq {
    int32_t *blocks; /* (n_blocks) */
    int32_t n_blocks;
    size_t cap;        /* of blocks */
    int32_t slot;      /* live state slot, -1: none (yet) */
    int32_t restore;   /* a snapshot slot to copy into `slot` before the next step (a
                        * prefix-cache hit, a rollback), -1: none */
    int32_t snap_keep; /* index in blocks of the block carrying its kept snapshot, -1 */
    int32_t snap_last[2]; /* ... of its two trailing snapshots, older first, -1 */
};

void kv_seq_init(struct kv_seq *s);
/* Grows s's table to cover positions [0, n_tokens), and takes s's live state slot when
 * the pool has slots and s has none. Takes nothing and returns SMELT_ERR_RANGE when the
 * pool has too few free blocks or slots; SMELT_ERR_NOMEM. */
smelt_status kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens, struct err *e);
/* Keeps positions [0, n_tokens) and returns the blocks no longer needed (with their
 * snapshots). A partly kept block is written again from n_tokens on: its snapshot goes,
 * and it leaves the prefix cache when s is its only holder. */
void kv_seq_truncate(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens);
/* Returns every block and the live slot, and frees the table. */
void kv_seq_release(struct kv_pool *p, struct kv_seq *s);
/* The batch's view of s's table and live slot, no snapshot (valid until s changes). */
static inline struct batch_seq kv_seq_view(const struct kv_seq *s) {
    struct batch_seq b = {.blocks = s->blocks, .n_blocks = s->n_blocks, .slot = s->slot};
    return b;
}
/* The view for a step that runs s's positions [p0, p1): with recurrent slots, the state at
 * the last block boundary in (p0, p1] is snapshotted (when a slot can be had) as s's
 * trailing snapshot, or as its kept one when keep. */
struct batch_seq kv_seq_step(struct kv_pool *p, struct kv_seq *s, int32_t p0, int32_t p1,
                             bool keep);
/* Rolls s back to its first n_keep positions. KV layers only truncate. With recurrent
 * slots, the state must come from the newest snapshot at or before n_keep: *from gets its
 * position (0 when there is none: the state restarts from zero) and s->restore the slot
 * to copy into the live one; the caller feeds positions [from, n_keep) again. Without
 * slots *from = n_keep. Costs and the choice against keeping the last states:
 * docs/forward.md, "Rollback". */
void kv_seq_rollback(struct kv_pool *p, struct kv_seq *s, int32_t n_keep, int32_t *from);

/* ---- prefix caching ---- */

/* Turns prefix caching on for p (once, before use). SMELT_ERR_NOMEM. */
smelt_status kv_prefix_enable(struct kv_pool *p, struct err *e);
/* The hash of a full block: parent is the previous block's hash (0 for the first block),
 * tokens its block_size token ids. Never 0. Keyed per pool (random at enable), so a client
 * cannot craft collisions. */
uint64_t kv_block_hash(const struct kv_pool *p, uint64_t parent, const int32_t *tokens);
/* Takes the cached blocks holding tokens[0 .. max_blocks * block_size) from the start, one
 * full block at a time until the first miss, and appends them (referenced) to s, which
 * must hold no blocks. hashes (room for max_blocks) gets each taken block's hash. Returns
 * the number of blocks taken; 0 when prefix caching is off. SMELT_ERR_NOMEM leaves s
 * empty (returns 0). With recurrent slots, only the chain up to its last block that has a
 * snapshot is taken, and s->restore is set to that snapshot. */
int32_t kv_prefix_acquire(struct kv_pool *p, struct kv_seq *s, const int32_t *tokens,
                          int32_t max_blocks, uint64_t *hashes);
/* Registers block id (full, K/V computed, holding tokens[0 .. block_size)) under hash h
 * with parent hash `parent`. A no-op when caching is off, the block is registered already,
 * or another block holds h (the same content computed twice: this copy stays private and
 * is freed normally; its snapshot, when the cached copy has none, moves to the cached
 * copy). */
void kv_prefix_register(struct kv_pool *p, int32_t id, uint64_t h, uint64_t parent,
                        const int32_t *tokens);

/* ---- recurrent state slots ---- */

/* Gives p n_slots state slots, of which snapshots leave max_live for live states (once,
 * before use). SMELT_ERR_INVALID when n_slots < max_live; SMELT_ERR_NOMEM. */
smelt_status kv_slots_enable(struct kv_pool *p, int32_t n_slots, int32_t max_live, struct err *e);
/* Slots a live state can take now: free ones plus idle snapshots (0 without slots). */
int32_t kv_slots_available(const struct kv_pool *p);

struct kv_stats {
    int32_t n_blocks, block_size;
    int32_t n_slots, live_slots, snapshots, idle_snapshots; /* recurrent state slots */
    int32_t used;    /* referenced by a sequence */
    int32_t cached;  /* registered in the prefix cache (in use or idle) */
    int32_t idle;    /* cached and unreferenced: evictable */
    int32_t free;    /* on the free stack */
    uint64_t hit_blocks, query_blocks; /* acquire: blocks found / blocks looked up */
    uint64_t evictions;
};
void kv_pool_stats(const struct kv_pool *p, struct kv_stats *out);

#endif

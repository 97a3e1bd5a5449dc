/* Paged KV bookkeeping: a free stack of block ids with reference counts, and block
 * tables per sequence. See kv.h. */
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>

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

void kv_pool_free(struct kv_pool *p) {
    free(p->free_ids);
    free(p->ref);
    memset(p, 0, sizeof *p);
}

int32_t kv_blocks_for(const struct kv_pool *p, int32_t n_tokens) {
    if (n_tokens <= 0) return 0;
    return (int32_t)(((int64_t)n_tokens + p->block_size - 1) / p->block_size);
}

static void unref(struct kv_pool *p, int32_t id) {
    if (p->ref[id] > 0 && --p->ref[id] == 0) p->free_ids[p->n_free++] = id;
}

void kv_seq_init(struct kv_seq *s) { memset(s, 0, sizeof *s); }

smelt_status kv_seq_reserve(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens, struct err *e) {
    int32_t need = kv_blocks_for(p, n_tokens);
    if (need <= s->n_blocks) return SMELT_OK;
    int32_t more = need - s->n_blocks;
    if (more > p->n_free)
        return err_set(e, SMELT_ERR_RANGE, "KV cache full: %d more blocks needed, %d free", more,
                       p->n_free);
    if (need > s->cap) {
        int32_t cap = s->cap ? s->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *b = realloc(s->blocks, (size_t)cap * sizeof *b);
        if (!b) return err_set(e, SMELT_ERR_NOMEM, "KV block table: out of memory");
        s->blocks = b;
        s->cap = cap;
    }
    while (s->n_blocks < need) {
        int32_t id = p->free_ids[--p->n_free];
        p->ref[id] = 1;
        s->blocks[s->n_blocks++] = id;
    }
    return SMELT_OK;
}

void kv_seq_truncate(struct kv_pool *p, struct kv_seq *s, int32_t n_tokens) {
    int32_t keep = kv_blocks_for(p, n_tokens);
    while (s->n_blocks > keep) unref(p, s->blocks[--s->n_blocks]);
}

void kv_seq_release(struct kv_pool *p, struct kv_seq *s) {
    kv_seq_truncate(p, s, 0);
    free(s->blocks);
    kv_seq_init(s);
}

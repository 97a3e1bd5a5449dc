/* The batch: the unit of work of one forward step (DESIGN.md, "The step").
 *
 * n_tokens rows drawn from any number of sequences: a prefill chunk of one sequence can
 * sit beside single decode tokens of others. Row i is token[i] of sequence seq[i] at
 * position pos[i]; its K/V go to the slot of that position in the sequence's block
 * table, and it attends to positions 0..pos[i] of the same sequence (those before this
 * step must already be in the cache; those in this step are written first). logits[i]
 * asks for that row's logits; the forward returns them in row order.
 *
 * Contract (checked by model_forward, an error names the row): positions of a sequence
 * are contiguous from 0 across steps; a sequence's block table covers every position it
 * uses (blocks[p / block_size] holds position p); rows of one sequence within a batch are
 * in increasing position order. Rolling back (rejected draft tokens) is just reusing a
 * position: the next write overwrites the slot.
 *
 * Lives in model/ because the model layer consumes it and the engine (above) builds it:
 * dependencies point down. The struct only points at the caller's arrays. */
#ifndef SMELT_MODEL_BATCH_H
#define SMELT_MODEL_BATCH_H

#include <stdint.h>

/* One sequence of a batch: its KV block table. */
struct batch_seq {
    const int32_t *blocks; /* (n_blocks) block ids in the KV cache */
    int32_t n_blocks;
};

struct batch {
    int32_t n_tokens;
    const int32_t *token;  /* (n_tokens) token ids */
    const int32_t *pos;    /* (n_tokens) position in its sequence */
    const int32_t *seq;    /* (n_tokens) index into seqs */
    const uint8_t *logits; /* (n_tokens) nonzero: return this row's logits; NULL: last row only */
    int32_t n_seqs;
    const struct batch_seq *seqs; /* (n_seqs) */
};

#endif

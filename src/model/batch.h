/* The batch: the unit of work of one forward step (docs/forward.md, "The step" and "The
 * batch").
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
 * in increasing position order. With recurrent layers also: a sequence's rows are
 * contiguous, its first row continues its slot's state (the position after the last one
 * the slot has seen) or is position 0, and the batch's live and snapshot slots are
 * distinct. Rolling back (rejected draft tokens) reuses positions: the next write
 * overwrites a KV slot; a recurrent state is first restored from a snapshot at or before
 * the position (engine/kv.h, kv_seq_rollback) and the tokens after it are fed again.
 *
 * Lives in model/ because the model layer consumes it and the engine (above) builds it:
 * dependencies point down. The struct only points at the caller's arrays. */
#ifndef SMELT_MODEL_BATCH_H
#define SMELT_MODEL_BATCH_H

#include <stdint.h>

/* One sequence of a batch: its KV block table, and for a model with recurrent layers its
 * state slot (docs/forward.md, "Memory kinds"). A zero-initialized entry has slot 0 and
 * no snapshot, which is all a model without recurrent layers reads. */
struct batch_seq {
    const int32_t *blocks; /* (n_blocks) block ids in the KV cache */
    int32_t n_blocks;
    int32_t slot;      /* recurrent state slot: read at the sequence's first row (unless
                        * that row is position 0: a zero state), written after its last */
    int32_t snap_slot; /* with snap_pos > 0: the state covering positions [0, snap_pos) is */
    int32_t snap_pos;  /* also written to snap_slot (a snapshot); snap_pos lies in
                        * [first row's position, last row's position + 1] */
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

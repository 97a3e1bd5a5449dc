/* The device memory plan: do the weights fit, how much scratch does a step take, and how
 * many KV tokens does what is left hold.
 *
 * On a device backend (CUDA) a command that runs a model does, in order:
 *   1. memplan_weights_fit: before the upload, the bytes bk_weight_bind will allocate
 *      (bk_weight_bytes over the file's tensors, plus the largest tensor once for the
 *      upload's repacking buffer) against the device's free memory; a model that does not
 *      fit fails here with the numbers, not halfway through the upload.
 *   2. memplan_measure: after the upload, warm-up steps of the largest shapes the caller
 *      will run (token rows, sequences, logit rows, block-table width) against a small
 *      temporary KV cache, then the backend's scratch is reserved at the measured peak
 *      (bk_scratch_reserve), so serving never grows it (a growth drops every recorded step
 *      graph and allocates mid-step).
 *   3. memplan_kv: the KV pool from the free memory left, minus (1 - utilization) of the
 *      total and a fixed margin (MEMPLAN_MARGIN: the CUDA context's later allocations,
 *      fragmentation, step shapes whose scratch exceeds the measured ones), or the size
 *      the user or the command asks for; too small a pool fails with the numbers.
 * memplan_kv is plain arithmetic (unit-tested without a device).
 */
#ifndef SMELT_ENGINE_MEMPLAN_H
#define SMELT_ENGINE_MEMPLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "util/err.h"

struct model;
struct backend;
struct gguf_file;

#define MEMPLAN_MIB ((uint64_t)1 << 20)
/* Kept back beyond (1 - utilization) * total. */
#define MEMPLAN_MARGIN (256 * MEMPLAN_MIB)
/* The smallest KV pool worth running. */
#define MEMPLAN_MIN_TOKENS 256

/* ---- 1. weights ---- */

/* What loading f's tensors onto bk takes on its device. */
struct memplan_weights {
    uint64_t weights;      /* bytes that stay */
    uint64_t transient;    /* the largest single tensor, held once more during its upload */
    uint64_t expert_layer; /* the most bytes one layer's experts take (what --n-cpu-moe moves
                            * per layer); 0: no experts on the device */
    int32_t n_cpu_moe;     /* the layers whose experts stay on the host (model_expert_on_host) */
};
/* Fills *w for f on bk, the experts of the first n_cpu_moe layers kept on the host. All 0
 * on the CPU (weights stay in the mapping). */
void memplan_weight_bytes(struct backend *bk, const struct gguf_file *f, int32_t n_cpu_moe,
                          struct memplan_weights *w);
smelt_status memplan_weights_fit(const char *model, const struct memplan_weights *w,
                                 uint64_t free_b, uint64_t total_b, struct err *e);

/* ---- 2. activations ---- */

/* The largest steps the caller will run. */
struct memplan_shape {
    int32_t max_tokens; /* token rows in one step (prefill chunk + decodes) */
    int32_t max_seqs;   /* sequences in one step */
    int32_t max_out;    /* rows whose logits a step computes */
    int32_t n_ctx;      /* positions per sequence: sets the block-table width */
    int32_t block_size; /* KV block size */
    uint32_t kv_type;   /* KV element type (F16, F32) */
};

/* Runs warm-up steps of the shape's extremes (every row of a full step spread over all
 * sequences; one sequence's full prefill chunk; one decode row per sequence), each with
 * the full-context block table and its logits rows summarized as in serving, against a
 * temporary KV cache of max_tokens positions; then reserves the scratch at the peak. The
 * model's own KV caches are untouched. *peak gets the scratch bytes reserved. */
smelt_status memplan_measure(struct model *m, const struct memplan_shape *sh, uint64_t *peak,
                             struct err *e);

/* ---- recurrent state slots ----
 * A model with recurrent layers (model_is_recurrent) also needs state slots, each
 * model_state_slot_bytes: one live slot per running sequence, and snapshots for the
 * prefix cache and rollback (engine/kv.h). They are taken from the free memory before
 * the KV pool is sized. */

/* Slots for max_seqs sequences: a live one each, and about one snapshot each (a sequence
 * keeps up to three while it runs; with fewer free, snapshots are skipped, which costs
 * recomputation, never correctness). */
static inline int32_t memplan_state_slots(int32_t max_seqs) { return 2 * max_seqs + 2; }

/* ---- 3. the KV pool ---- */

struct memplan_in {
    uint64_t free_b, total_b; /* device memory now: after the weights and the scratch */
    uint64_t weights_b;       /* for the messages: what the weights took */
    uint64_t act_b;           /* for the messages: the reserved scratch */
    uint64_t per_token_b;     /* KV bytes of one token, all layers, K and V (> 0) */
    double util;              /* fraction of the total smelt may use, (0, 1] */
    uint64_t margin_b;        /* kept back besides (MEMPLAN_MARGIN) */
    int64_t kv_size;          /* > 0: the pool size asked for (--kv-size), in tokens */
    int64_t need;             /* > 0: the command's own size (run, bench); 0: fill (serve) */
    int64_t min_tokens;       /* the pool must hold at least this many (a full context) */
    int64_t max_tokens;       /* cap on a filled pool (0: none) */
    uint64_t others_b;        /* device bytes other models of this process hold (several
                               * models in one server): each model's utilization is its own
                               * share of the device, so theirs is not charged to this one */
};

struct memplan_out {
    int64_t tokens;   /* KV pool size */
    uint64_t bytes;   /* tokens * per_token_b */
    uint64_t budget;  /* bytes the KV pool may take */
};

/* The KV pool size: kv_size, else need, else budget / per_token capped at max_tokens,
 * where budget = free + others - (1 - util) * total - margin (0 when negative), never
 * more than free - margin. An explicit size
 * (kv_size or need) is checked against the free memory less the margin only: it was asked
 * for, the utilization is for sizing. Fails with SMELT_ERR_NOMEM and the numbers (free,
 * total, weights, activations, the utilization, what to try) when the pool would not fit,
 * would hold fewer than min_tokens (one full context), or, filled, fewer than
 * MEMPLAN_MIN_TOKENS. */
smelt_status memplan_kv(const struct memplan_in *in, struct memplan_out *out, struct err *e);

#endif

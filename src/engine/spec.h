/* Speculative decoding: proposers, the adaptive draft length, and the verification of one
 * sequence's rows (docs/speculative.md has the design and the measurements).
 *
 * A step of a speculating sequence feeds its last token and k proposed tokens d_1..d_k as
 * k + 1 rows of the batch, each asking for its logits. Row j (the target's distribution
 * after d_1..d_j) verifies d_{j+1} (sampler_verify: greedy, the coupled draw of a point
 * mass, or rejection sampling against a sampled draft's q); the first rejected row emits
 * the token it drew instead, and when every draft is accepted the last row gives one more.
 * So a step emits 1..k+1 tokens, each distributed exactly as the non-speculative sampler's
 * (with deterministic proposals: the very tokens it would emit for the same seed). The
 * K/V of the rejected rows are rolled back by the caller (kv_seq_rollback; recurrent
 * layers restore a snapshot and feed the accepted tokens again).
 *
 * Proposers (struct spec_config.kind):
 *   SPEC_NGRAM  prompt lookup: the longest recent suffix (ngram_max..ngram_min tokens) of
 *               the sequence that occurred before, continued as it was continued then
 *               (the most recent such occurrence); host work only, q a point mass;
 *   SPEC_DRAFT  a second, small model with the same vocabulary on its own backend. It
 *               writes its K/V into the *target's* block ids (its own store of the same
 *               block count and size), so a sequence's block table, preemption and prefix
 *               caching serve both models; per block a tag says whether the draft's K/V in
 *               it hold the chain the block's prefix hash names. Its proposals are its argmax
 *               (greedy targets, or when asked for point masses) or draws from q, its
 *               distribution over its SPEC_Q_MAX best tokens at the target's temperature;
 *   SPEC_MTP    the target's own multi-token-prediction head (model_mtp_new): a head row
 *               at position p reads token t_{p+1} and the trunk's final hidden state h_p
 *               and predicts t_{p+2}. Its K/V (its own store, the target's block ids and
 *               tags, as for the draft) are computed from the trunk's hidden states after
 *               each target step (spec_observe: the step's kept rows, whose next tokens are
 *               known by then), which also gives d_1; spec_propose chains k - 1 more rows,
 *               each reading the head's own hidden state of the row before.
 *
 * Adaptive k (spec_want): per sequence, a decayed estimate of the per-token acceptance
 * probability a picks the k in [0, k_max] that maximizes the expected tokens per unit of
 * step cost, (1 - a^(k+1)) / (1 - a) / (1 + (row_cost + draft_cost) k); a sequence whose
 * best k is 0 stops proposing and probes k = 1 again every SPEC_PROBE steps. A step with
 * more than max_batch decoding sequences does not speculate at all.
 *
 * Threads: everything runs on the caller's (the engine's) thread. */
#ifndef SMELT_ENGINE_SPEC_H
#define SMELT_ENGINE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/sample.h"
#include "model/batch.h"
#include "util/err.h"

struct model;
struct kv_store;

#define SPEC_K_MAX 16  /* draft tokens per step at most */
#define SPEC_Q_MAX 32  /* tokens of a sampled draft's q */
#define SPEC_PROBE 16  /* steps a sequence that stopped proposing waits before it tries k = 1 */

enum spec_kind { SPEC_OFF = 0, SPEC_NGRAM = 1, SPEC_DRAFT = 2, SPEC_MTP = 3 };

struct spec_config {
    enum spec_kind kind;
    int32_t k_max;     /* draft tokens per step at most, 1..SPEC_K_MAX (default 4) */
    int32_t ngram_min; /* n-gram: shortest suffix matched (default 2) */
    int32_t ngram_max; /* longest suffix matched, tried first (default 4) */
    int32_t max_batch; /* no speculation in a step with more decoding sequences (default 8) */
    float row_cost;    /* cost of one more verified row, relative to a one-row step
                        * (default 0.1; docs/speculative.md) */
    float draft_cost;  /* cost of one draft token, relative to a target step (SPEC_DRAFT;
                        * < 0: the draft's weight bytes over the target's) */
    bool fixed;        /* propose k_max tokens every step: no adaptive k (measurements) */
    struct model *draft;       /* SPEC_DRAFT: the draft model (attention layers only);
                                * SPEC_MTP: the target's head (model_mtp_new) */
    struct kv_store *draft_kv; /* its store: the target's block size and count */
};

/* Fills what is <= 0 (k_max, ngram sizes, max_batch, row_cost) with the defaults. */
void spec_config_defaults(struct spec_config *c);
/* "off", "ngram", "draft", "mtp". */
const char *spec_kind_name(enum spec_kind k);
/* Parses a kind's name; SMELT_ERR_INVALID names the choices. */
smelt_status spec_kind_parse(const char *s, enum spec_kind *out, struct err *e);

/* One sequence's speculation state (the engine keeps one per sequence, smelt run one). */
struct spec_seq {
    bool off;        /* never speculate (the request opted out) */
    bool point_mass; /* sampled drafts are proposed as point masses (their argmax): the
                      * output is then the non-speculative one for the seed */
    /* this step, after spec_propose */
    int32_t n_draft;
    int32_t draft[SPEC_K_MAX];
    struct sample_q q[SPEC_K_MAX]; /* sampled drafts; q[j].n == 0: a point mass */
    /* the adaptive policy */
    float acc_a, acc_r; /* decayed counts of accepted tokens and of rejections */
    int32_t idle;       /* steps since it last proposed with k = 0 chosen */
    /* a proposer with K/V (draft): positions [0, kv_done) of its K/V hold this sequence */
    int32_t kv_done;
    uint64_t rng[4];
    uint64_t n_proposed, n_accepted; /* totals */
    /* SPEC_MTP: draft[0] and q[0] (set by spec_observe) hold d_1 for a sequence of
     * mtp_for tokens, and mtp_h (n_embd) the head's hidden state of the row that gave it */
    int32_t mtp_for;
    float *mtp_h;
    int32_t *q_tok;  /* (SPEC_K_MAX * SPEC_Q_MAX) storage of q, on first use */
    float *q_prob;
};

void spec_seq_init(struct spec_seq *ss, uint64_t seed);
void spec_seq_free(struct spec_seq *ss);

struct spec;

/* Creates the speculation state of an engine (or smelt run) whose target (NULL with a fake
 * forward) has n_vocab tokens and a KV pool of n_blocks blocks of block_size; steps have at
 * most max_rows rows over at most max_seqs sequences. SPEC_DRAFT checks the draft: no
 * recurrent layers, a store of at least the block count and of the same block size (errors
 * name both values); its vocabulary is the caller's to check (cli/clispec.h): a draft id
 * past the target's n_vocab is never proposed, and a sequence holding a token past the
 * draft's stops speculating. SPEC_MTP checks the head's store as SPEC_DRAFT does. */
smelt_status spec_new(struct spec **out, const struct spec_config *cfg, const struct model *target,
                      int32_t n_vocab, int32_t n_blocks, int32_t block_size, int32_t max_rows,
                      int32_t max_seqs, struct err *e);
void spec_free(struct spec *sp);
const struct spec_config *spec_get_config(const struct spec *sp);
/* The proposer keeps K/V per position (call spec_admit, spec_register and spec_commit). */
bool spec_has_kv(const struct spec *sp);

/* Draft tokens ss should propose in a step with n_decoding decoding sequences: 0 (none)
 * when it opted out, the step is too large, or its acceptance does not pay. */
int32_t spec_want(const struct spec *sp, struct spec_seq *ss, int32_t n_decoding);

/* One sequence's proposal request. */
struct spec_job {
    struct spec_seq *ss;
    const int32_t *tok;    /* (n_tok) the sequence's tokens; the last is not in the target's
                            * K/V yet (the step feeds it) */
    int32_t n_tok;
    int32_t k;             /* tokens to propose at most (1..SPEC_K_MAX) */
    struct batch_seq view; /* the target's block table: reserved through n_tok + k
                            * positions (a draft writes its K/V into the same blocks) */
    float temperature;     /* the target's: 0 proposes argmaxes */
};

/* Proposes for each job: sets ss->n_draft (0..k, possibly 0: nothing found), ss->draft and
 * ss->q. A draft model first catches up on the positions it has not computed (in steps of
 * at most max_rows rows), then runs k - 1 one-row steps. */
smelt_status spec_propose(struct spec *sp, struct spec_job *jobs, int32_t n, struct err *e);

/* After the verification: n_accepted of ss->n_draft drafts were accepted and the target's
 * K/V keep positions [0, n_keep). Updates the policy and the totals. */
void spec_commit(struct spec *sp, struct spec_seq *ss, int32_t n_accepted, int32_t n_keep);
/* A sequence admitted with n_cached full blocks from the prefix cache (blocks[i] with
 * prefix hash hashes[i]): its K/V-keeping proposer resumes after the leading ones whose tag
 * matches. Without prefix hits, or after preemption, it starts at 0. */
void spec_admit(struct spec *sp, struct spec_seq *ss, const int32_t *blocks,
                const uint64_t *hashes, int32_t n_cached);
/* The sequence's full blocks [0, n_full) are final (registered under hashes): the ones
 * its proposer has computed get their tags. */
void spec_register(struct spec *sp, struct spec_seq *ss, const int32_t *blocks,
                   const uint64_t *hashes, int32_t n_full);

/* A source of one speculating sequence's verified rows (row j: the target after d_1..d_j). */
struct spec_rows {
    /* row j's request and what the step returned for it; sum NULL: the summary is made
     * here from the full row (a fake forward) */
    void (*get)(void *ctx, int32_t j, const struct topk_row **req,
                const struct topk_summary **sum, const struct topk_cand **cand,
                const float **adj_raw);
    /* row j's full logits (n_vocab), or NULL with e set */
    const float *(*full)(void *ctx, int32_t j, struct err *e);
    void *ctx;
};

/* Verifies ss's drafts row by row with smp (whose history holds the sequence up to the last
 * token: history says whether it is kept): out[0..*n_out) gets the accepted drafts and then
 * the token the first rejected row (or the last row) emits; at most ss->n_draft + 1. The
 * sampler's history is as before on return (the caller accepts what it keeps). *n_full:
 * rows whose full logits were needed. */
smelt_status spec_verify(struct sampler *smp, bool history, const struct spec_seq *ss,
                         const struct spec_rows *src, struct sample_result *out,
                         int32_t *n_out, int32_t *n_full, struct err *e);

/* SPEC_MTP: the target's last step, as one sequence saw it. */
struct spec_obs {
    struct spec_seq *ss;
    int32_t pos0, n;       /* positions [pos0, pos0 + n) of the step, kept (not rolled back) */
    const float *hidden;   /* (n_embd, n) their final hidden states (model_step_mtp) */
    const int32_t *next;   /* (n) the token after each position (all known) */
    struct batch_seq view; /* the target's block table (through pos0 + n positions) */
    float temperature;     /* the target's: 0 proposes argmaxes */
};
/* True when the proposer reads the target's hidden states (SPEC_MTP): the caller steps the
 * target with model_step_mtp and calls spec_observe after each step. */
bool spec_wants_hidden(const struct spec *sp);
/* SPEC_MTP, after a target step, its sampling and its rollbacks: the head computes its K/V
 * at the observed positions it has not computed (a gap before them, a prefix-cache hit's
 * blocks it has no K/V for, is skipped: those positions stay stale, which costs acceptance,
 * never correctness); the last row of each gives that sequence's d_1. Runs on the target's
 * backend: the target's last logits are gone afterwards. No-op for other proposers. */
smelt_status spec_observe(struct spec *sp, struct spec_obs *obs, int32_t n, struct err *e);

/* Totals since spec_new. */
struct spec_stats {
    uint64_t draft_steps;   /* forward steps of the draft model */
    uint64_t draft_rows;    /* rows in them */
    double draft_seconds;   /* time in them */
};
void spec_get_stats(const struct spec *sp, struct spec_stats *out);

#endif

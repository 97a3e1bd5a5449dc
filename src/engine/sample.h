/* Token sampling for one sequence: penalties, logit bias, greedy / temperature with
 * top-k, top-p and min-p, seeded randomness, and logprobs.
 *
 * A sampler finishes from a row *summary* (backend/topk.h): the row's best candidates by
 * adjusted logit, its maxima and sums, computed where the logits are (on the GPU by
 * the logits_topk op) so that a decode step brings back a few KB per row instead of
 * n_vocab floats. The flow per token (docs/sampling.md):
 *   1. sampler_request, before the forward: the summary this row needs (k candidates,
 *      which sums) and the row's sparse adjustments (penalties over the token window,
 *      logit bias), for the op to apply on the device;
 *   2. sampler_finish with the summary: exact whenever the result lies among the
 *      candidates, which the summary's sums prove (greedy; top-k <= k; a top-p nucleus
 *      or min-p cut inside the candidates; a temperature draw that lands inside them).
 *      Otherwise it answers SAMPLE_NEED_ROW, keeping any random draw already made, and
 *      a second call with the full row finishes exactly on the host.
 * The distribution is the one of the full-vocabulary sampler: tokens are ranked by
 * adjusted logit (ties: lower id first); the nucleus of top-p is the shortest ranked
 * prefix whose mass reaches top_p of the total; min-p keeps ranks whose probability is
 * at least min_p times the best one's; a draw walks the kept tokens, the candidates in
 * rank order first and the rest in token order. sampler_sample does all of it on a
 * full row in host memory (the summary computed by topk_summarize_row).
 *
 * Cost per token on the host: O(k) from a summary; a full row only when a draw falls
 * outside the candidates (1-4 passes, see sample.c). Penalties and bias touch only the
 * tokens they name (O(window + bias)). A top-p nucleus never includes tokens below
 * e^-30 of the most likely one (a mass below 262144 * 9.4e-14 = 2.5e-8 of the total).
 *
 * Logprobs are those of the model's raw distribution (log-softmax of the logits before
 * penalties, bias, temperature and truncation), as vLLM reports by default.
 *
 * A token mask (sampler_set_mask: structured output) takes the refused tokens out of the
 * row before everything else, as if the model had given them a logit of -inf: the draw,
 * and the logprobs too, are those of the masked row (vLLM applies a grammar's bitmask to
 * the logits before its sampler, so its "raw" logprobs are the masked ones as well).
 */
#ifndef SMELT_ENGINE_SAMPLE_H
#define SMELT_ENGINE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/topk.h"
#include "util/err.h"

#define SAMPLE_MAX_LOGPROBS 20
/* Tokens sampler_unaccept can take back (speculative decoding's drafts). */
#define SAMPLE_MAX_UNDO 32

struct logit_bias {
    int32_t token;
    float bias; /* added to the logit; -100 or less bans the token */
};

struct sample_params {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* 1: off; (0, 1] */
    float min_p;              /* 0: off; [0, 1] */
    float repetition_penalty; /* 1: off; > 0. Over prompt + generated tokens in the window */
    float presence_penalty;   /* 0: off; [-2, 2]. Over generated tokens in the window */
    float frequency_penalty;  /* 0: off; [-2, 2]. Over generated tokens in the window */
    int32_t penalty_last_n;   /* window of most recent tokens; <= 0: the whole history */
    uint64_t seed;
    const struct logit_bias *bias; /* not owned; must outlive the sampler */
    int32_t n_bias;
    int32_t n_logprobs; /* alternatives to report: 0..SAMPLE_MAX_LOGPROBS; < 0: no logprobs */
};

/* Defaults: greedy off (temperature 1), no truncation, no penalties, no logprobs. */
void sample_params_default(struct sample_params *p);

/* Checks ranges; returns SMELT_ERR_INVALID with a message naming the field. */
smelt_status sample_params_check(const struct sample_params *p, int32_t n_vocab, struct err *e);

struct sample_token_logprob {
    int32_t token;
    float logprob;
};

struct sample_result {
    int32_t token;
    float logprob; /* of token; valid when n_logprobs >= 0 */
    int32_t n_top; /* entries in top, descending */
    struct sample_token_logprob top[SAMPLE_MAX_LOGPROBS];
};

struct sampler; /* opaque: per-sequence state (RNG, penalty window, scratch) */

smelt_status sampler_new(struct sampler **out, const struct sample_params *p, int32_t n_vocab,
                         struct err *e);
void sampler_free(struct sampler *s);

/* Records a token of the sequence's history (prompt tokens with generated=false, then
 * each sampled token with generated=true) for the penalties. */
void sampler_accept(struct sampler *s, int32_t token, bool generated);

/* Takes back the last n tokens sampler_accept recorded (n <= SAMPLE_MAX_UNDO): the history,
 * and with it the penalties, is as before they were accepted. */
void sampler_unaccept(struct sampler *s, int32_t n);

/* Forgets the history (e.g. a new request on a reused sampler); the RNG keeps going. */
void sampler_reset_history(struct sampler *s);

/* The token mask of the sequence's next rows, or NULL for none: topk_mask_words(n_vocab)
 * words, bit (i % 32) of word i / 32 set = token i allowed (backend/topk.h). Not copied: the
 * caller keeps it and may write it after sampler_request (whose row then asks for
 * TOPK_MASK) as long as it holds the row's mask when sampler_finish or sampler_sample
 * runs. */
void sampler_set_mask(struct sampler *s, const uint32_t *mask);

/* out->token of sampler_finish when the full row is needed. */
#define SAMPLE_NEED_ROW (-2)

/* The summary request for the sequence's next row. Call after the sampler_accept of
 * every token before that row, before the forward that computes it. Fills *row
 * (adj_off = off) and copies the row's adjustments, sorted by token, to adj[0..n) when
 * n <= cap; returns n. When they do not fit, the row asks for nothing (k = 0), returns
 * 0, and sampler_finish will want the full row. Returns -1 when out of memory. */
int32_t sampler_request(struct sampler *s, struct topk_row *row, struct logit_adj *adj,
                        int32_t off, int32_t cap);

/* Finishes the requested row from its summary: sum and cand as the op wrote them
 * (cand may be stale when the request had k = 1: only the summary is read then),
 * adj_raw the raw logits of the request's adjustments (row->adj_n of them; may be NULL
 * when the request had none), row the full raw logits (n_vocab) or NULL. Returns
 * SMELT_OK with out->token = SAMPLE_NEED_ROW when row is NULL and the result needs it:
 * call again with the row and the same summary; a random draw already made is kept, so
 * the result is what one call with the row would give. Does not accept the token. */
smelt_status sampler_finish(struct sampler *s, const struct topk_summary *sum,
                            const struct topk_cand *cand, const float *adj_raw,
                            const float *row, struct sample_result *out, struct err *e);

/* Opens again the request of a row made earlier by sampler_request (which filled *row),
 * with the same history as then: the adjustments are rebuilt, so sampler_finish or
 * sampler_verify can then finish that row (speculative decoding requests several rows of
 * one sequence before the step, then finishes them one by one). row->k == 0 (the request
 * asked for nothing) makes the row's summary on the host from the full row. */
void sampler_reopen(struct sampler *s, const struct topk_row *row);

/* A sampled draft's proposal distribution: q(token[i]) = prob[i] over n tokens, token
 * ascending; q is 0 elsewhere. */
struct sample_q {
    int32_t n;
    const int32_t *token;
    const float *prob;
};

/* Verifies a draft token against the open request's row (speculative decoding), with the
 * same inputs as sampler_finish. Sets out->token to the token the row emits and *accepted
 * when that is the draft:
 *   - greedy, or q NULL (a deterministic proposal: q is a point mass on the draft): the
 *     token sampler_finish picks, with the same random draw; accepted when it equals the
 *     draft. This is rejection sampling with a point mass (accepted with probability
 *     p(draft), else a draw from p without the draft, which is norm(max(0, p - q))), and a
 *     run verified this way emits exactly the tokens sampler_finish would have;
 *   - q given (a sampled draft): accepted when u <= p(draft) / q(draft), else a draw from
 *     norm(max(0, p - q)).
 * p is the row's distribution after the adjustments, temperature and truncation, exactly
 * as sampler_finish draws from it. draft < 0: sampler_finish. SAMPLE_NEED_ROW as for
 * sampler_finish (the draws are made again by the call with the row); logprobs of the
 * emitted token when asked. Does not accept the token. */
smelt_status sampler_verify(struct sampler *s, const struct topk_summary *sum,
                            const struct topk_cand *cand, const float *adj_raw, const float *row,
                            int32_t draft, const struct sample_q *q, struct sample_result *out,
                            bool *accepted, struct err *e);

/* Picks the next token from the raw logits[n_vocab] in host memory (request + summary on
 * the host + finish). logits are not modified. Does not accept the token. */
smelt_status sampler_sample(struct sampler *s, const float *logits, struct sample_result *out,
                            struct err *e);

/* The parameters the sampler was made with. */
const struct sample_params *sampler_params(const struct sampler *s);

#endif

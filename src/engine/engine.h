/* The serving engine: a request queue, one engine thread that owns the model and the
 * backend, and a continuous-batching scheduler over the paged KV pool.
 *
 * Threads. Any thread may create requests and submit them (engine_submit never blocks on
 * the engine thread: it takes a short queue lock). The engine thread runs steps; each
 * step gathers every sequence in flight into one forward (model_forward over a struct
 * batch), samples the rows that produced logits, detokenizes, applies stop conditions and
 * pushes the result into each request's channel. A consumer (an HTTP thread) drains its
 * channel with engine_req_poll; when the channel is empty it can arm a notification and
 * go away (the engine calls notify(ctx) on the next push), or block in engine_req_wait.
 *
 * Scheduling (one step):
 *   1. New requests join the waiting queue (FIFO); cancelled requests leave (their blocks
 *      return to the pool).
 *   2. Decodes first: every running sequence whose prompt is done gets its one row. Its
 *      next KV slot is reserved; when the pool is out of blocks, the newest running
 *      sequence is preempted (its blocks released, recomputed later from its tokens,
 *      prompt and generated so far) and the reservation retried. Nothing is failed.
 *   3. Prefill: sequences still in their prompt get chunks from what is left of the
 *      per-step token budget (max_batch_tokens), oldest first, so one long prompt cannot
 *      freeze the decodes of the others. With itl_target_s and decodes in the step, the
 *      budget is also cut to the rows a step is predicted to run in that time (a line
 *      t = a + b x rows fitted to the recent steps' times), but never below
 *      ENGINE_MIN_CHUNK prefill rows: decoders see bounded inter-token latency, and
 *      prompts still progress every step. A step without decodes takes the whole budget.
 *   4. Admission: waiting sequences join (FIFO) while fewer than max_seqs run, budget is
 *      left, and the blocks for their whole prompt can be reserved now (admission
 *      control). Full blocks found in the prefix cache are taken, not recomputed.
 * A sequence that finishes leaves at the end of its step; its full blocks stay in the
 * prefix cache (LRU) for later requests.
 * Recurrent layers (engine/kv.h): a sequence also holds a state slot while it runs; its
 * steps snapshot the state at block boundaries (the prompt's last full block is kept),
 * and a prefix-cache hit or a preempted sequence's return resumes at the last cached
 * block that has a snapshot.
 *
 * Speculation (engine_config.spec, engine/spec.h): in a step with at most spec.max_batch
 * decoding sequences, each decoding sequence whose adaptive k is > 0 proposes up to k
 * tokens (its KV reserved for them without preempting anyone: no room, no drafts); its
 * last token and the drafts are rows of the step, each with logits. After the forward the
 * rows are verified in order (spec_verify), 1..k+1 tokens are emitted, and the K/V of the
 * rejected rows are rolled back (kv_seq_rollback; recurrent layers restore a snapshot at
 * the end of the step and feed the accepted tokens again in the next). The prefix cache
 * only ever registers accepted positions.
 *
 * Sampling. A step's rows are independent (one sampler per sequence), so when a step
 * samples many large rows (rows x vocabulary >= 2^20 logits: e.g. 8 rows of a 128k
 * vocabulary) a small pool of threads samples them in parallel; the results are then
 * handled in batch order on the engine thread. Greedy over a 152k vocabulary costs ~0.2 ms
 * a row on one core, so 64 rows would otherwise add ~10 ms to every step.
 *
 * Stops. A sequence ends on an end-of-generation token (unless ignore_eos), a stop token
 * id, a stop string, max_tokens, or the context limit. Stop strings are matched on the
 * detokenized text across token boundaries: text that could be the start of a stop
 * string is held back until it is known not to be one, so a partial stop never reaches
 * the client; the stop string itself is not emitted.
 *
 * Grammars (structured output, docs/structured-output.md). A request may carry a compiled
 * grammar (engine_grammar: the engine's cache, over a vocabulary made once on first use);
 * each choice gets its own matcher. Per step, the masks of the rows under a grammar are
 * written while the device runs the forward (model_sample.fill_masks), applied before the
 * summaries, and each sampled token is accepted by its matcher. End-of-generation tokens
 * are allowed only where the grammar is complete, and a choice whose grammar can take
 * nothing more ends there ("stop"). max_tokens cuts a choice anywhere ("length"): its text
 * is then a prefix of a sentence of the grammar. A lazy grammar (a trigger) applies from
 * the first occurrence of its trigger in the output on (a tool call in a free reply).
 *
 * Embeddings. An embedding model's requests (engine_params.embed) are sequences that are
 * prefilled and end: the rows their pooling needs (every row for mean pooling, the first
 * for cls, the last for last) come back as final hidden states (model_step_hidden), are
 * summed on the host as the chunks run, and the choice ends with the pooled vector. A
 * bidirectional model's sequence runs whole in one step (admitted only when it fits the
 * step's budget), and its blocks never enter the prefix cache: their K/V depend on later
 * tokens. With causal attention, only last-token pooling takes prefix-cache hits (the other
 * poolings need rows a hit would skip).
 *
 * n > 1: a request's choices are separate sequences (seeds seed, seed+1, ...). With the
 * prefix cache on, choice 0 prefills the prompt first and the others join when it is
 * done, taking its full blocks from the cache instead of recomputing them.
 *
 * Memory. Each request is reference-counted (the submitter and the engine each hold one);
 * everything a request owns is freed when the last reference goes, cancelled or not.
 */
#ifndef SMELT_ENGINE_H
#define SMELT_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv.h"
#include "engine/sample.h"
#include "grammar/gram.h"
#include "engine/spec.h"
#include "model/batch.h"
#include "util/err.h"

struct model;
struct kv_store;
struct tok;

/* A fake forward step (tests, the server benchmark): writes the full logits of the rows
 * that ask for them (row order) to logits ((n_vocab) floats each); the rows are sampled
 * on the host. Without one, the engine runs model_step and samples from the row
 * summaries it returns (engine/sample.h). The buffer is the same every step. */
typedef smelt_status (*engine_forward_fn)(void *ctx, const struct batch *b, float *logits,
                                          struct err *e);
/* A fake forward's state copy (a recurrent fake: tests): slot src into slot dst. */
typedef smelt_status (*engine_state_copy_fn)(void *ctx, int32_t dst, int32_t src, struct err *e);

/* What one step scheduled, for a step observer (tests, tracing). */
struct engine_step_seq {
    uint64_t arrival; /* submit order (each choice its own): larger is newer */
    int32_t n_done;   /* positions in the KV cache before the step */
    int32_t n_tok;    /* prompt + generated tokens: n_tok - n_done == 1 is a decode */
    int32_t rows;     /* rows this step, positions [n_done, n_done + rows); may be 0 */
};
struct engine_step_info {
    int32_t n_rows;                        /* rows of the step's batch */
    int32_t budget;                        /* rows the step could have had (max_batch_tokens,
                                            * or less under itl_target_s) */
    int32_t n_running, n_waiting;          /* sequences, after scheduling */
    const struct engine_step_seq *running; /* (n_running) oldest first */
    const uint64_t *preempted;             /* (n_preempted) arrivals, in preemption order */
    int32_t n_preempted;
};
/* Called on the engine thread once a step is scheduled, before its forward. It must be
 * quick and must not call into the engine; info is valid during the call only. */
typedef void (*engine_step_fn)(void *ctx, const struct engine_step_info *info);

struct engine_config {
    int32_t max_seqs;         /* sequences running at once (default 64) */
    int32_t max_batch_tokens; /* rows per step: decodes + prefill chunks (default 512) */
    double itl_target_s;      /* > 0: steps with decodes aim at this duration by cutting
                               * their prefill rows (scheduling step 3); 0: off */
    int32_t max_waiting;      /* sequences (choices) queued before submit refuses with
                               * SMELT_ERR_RANGE (default 1024) */
    int32_t n_ctx;            /* positions per sequence (default: the model's, capped by KV) */
    int32_t block_size;       /* KV block size in tokens (default 16) */
    int32_t n_blocks;         /* KV pool size in blocks (required) */
    bool no_prefix_cache;     /* turn prefix caching off */
    int32_t n_vocab;          /* with a fake forward and no model: logit row length */
    int32_t sample_threads;   /* threads sampling a step's rows (0: auto, 1: the engine's) */
    engine_forward_fn forward; /* NULL: model_forward(model, kv, ...) */
    void *forward_ctx;
    int32_t n_slots;          /* recurrent state slots (>= max_seqs): with a fake forward;
                               * with a model that has recurrent layers, the KV store's */
    engine_state_copy_fn state_copy; /* with a fake forward and n_slots (ctx: forward_ctx) */
    engine_step_fn on_step; /* NULL: none */
    void *on_step_ctx;
    struct spec_config spec; /* speculative decoding (engine/spec.h); kind SPEC_OFF: none */
};

/* Fills the fields engine_new defaults (max_seqs, max_batch_tokens, max_waiting,
 * block_size) where they are <= 0: what the engine will run with, for sizing memory. */
void engine_config_defaults(struct engine_config *c);
/* The most rows a step of this configuration asks logits for (one per sequence, plus the
 * prompt-logprob rows of ENGINE_PLP_ROWS, plus the draft rows of speculating sequences). */
int32_t engine_max_out_rows(const struct engine_config *c);

/* Why a choice ended. */
enum engine_finish {
    ENGINE_RUNNING = 0,
    ENGINE_STOP = 1,      /* end-of-generation token, stop token or stop string */
    ENGINE_LENGTH = 2,    /* max_tokens or the context limit */
    ENGINE_CANCELLED = 3, /* engine_req_cancel, or the engine shut down */
    ENGINE_ERROR = 4,     /* the step failed (the output's message says why) */
};
const char *engine_finish_str(enum engine_finish f); /* "stop", "length", ... */

/* Logits rows, beyond one per sequence, that prompt-logprob prefill chunks may use in a
 * step (each of their rows needs its logits). */
#define ENGINE_PLP_ROWS 64
/* Prefill rows a step with decodes always gets (when prompts wait), whatever itl_target_s
 * predicts, so that prompts progress even where one decode step is longer than the target. */
#define ENGINE_MIN_CHUNK 64

#define ENGINE_MAX_STOPS 16
#define ENGINE_MAX_STOP_LEN 1024
#define ENGINE_MAX_N 128

/* The grammar a request's output must follow (each choice's). */
struct engine_grammar {
    struct gram *g;     /* from engine_grammar (the request takes its own reference); NULL:
                         * none */
    const char *prefix; /* bytes the output is taken to begin with, which the grammar
                         * takes first: the forced opening the prompt ends with (a tool
                         * call's prefill); may be NULL */
    size_t prefix_len;
    const char *trigger; /* lazy: the grammar applies from the first occurrence of these
                          * bytes in the output (the grammar's sentences begin with them);
                          * NULL: from the first token */
    size_t trigger_len;
};

/* Tokens a grammar's matcher can roll back (speculative decoding checks a draft with
 * gram_matcher_accept_tokens and rolls back what the target model refused). */
#define ENGINE_GRAMMAR_ROLLBACK 16

/* What a request asks for. Strings and arrays are copied by engine_req_new. */
struct engine_params {
    struct sample_params sp;  /* bias is copied; seed: choice i uses seed + i */
    int32_t max_tokens;       /* generated tokens per choice; < 0: up to the context */
    int32_t n;                /* choices, 1..ENGINE_MAX_N */
    bool ignore_eos;          /* do not stop on end-of-generation tokens */
    bool decode_special;      /* render control tokens as text */
    const char *const *stop;  /* (n_stop) stop strings, each 1..ENGINE_MAX_STOP_LEN bytes */
    int32_t n_stop;
    const int32_t *stop_ids;  /* (n_stop_ids) extra token ids that end a choice */
    int32_t n_stop_ids;
    int32_t prompt_logprobs;  /* < 0: none; else report the logprob of every prompt token
                               * after the first, with this many alternatives (choice 0 only;
                               * the prompt is computed in full: no prefix-cache hits) */
    struct engine_grammar grammar; /* g NULL: unconstrained */
    bool embed;               /* an embedding (n 1; an embedding model's requests all are):
                               * the prompt is run and the choice ends with its pooled vector
                               * (engine_event.embd); nothing is sampled or generated */
    bool no_spec;             /* do not speculate for this request (engine_config.spec) */
    bool spec_point_mass;     /* a draft model proposes its argmax, not draws from its q:
                               * the output is the non-speculative one for the seed, whatever
                               * the load (docs/speculative.md) */
};
void engine_params_default(struct engine_params *p);

/* One event of a request's output stream. A choice yields one event per sampled token
 * (token >= 0) and ends with an event whose finish is set (that event may carry a last
 * token, or token -1 with the held-back text released at the end). */
struct engine_event {
    int32_t choice;
    int32_t token;       /* sampled token, or -1 */
    float logprob;       /* of token, when the request asked for logprobs */
    int32_t n_top;       /* alternatives at out->top[top .. top + n_top) */
    uint32_t top;
    uint32_t text;       /* text released with this event: out->text[text .. text + len) */
    uint32_t text_len;
    uint8_t finish;      /* enum engine_finish; nonzero: the choice's last event */
    uint8_t prompt;      /* a prompt token's logprob (prompt_logprobs), in prompt order */
    uint8_t stop;        /* with finish ENGINE_STOP: 1 + the index (in engine_params.stop) of
                          * the stop string that ended the choice; 0: an end-of-generation
                          * token or a stop id did */
    /* with finish: the choice's totals */
    int32_t n_prompt, n_cached, n_gen;
    /* with finish ENGINE_STOP, an embedding's vector: out->embd[embd .. embd + n_embd),
     * pooled as the model declares (the mean, the first or the last row's final hidden
     * state), not normalized; n_embd 0 otherwise */
    uint32_t embd;
    int32_t n_embd;
    int32_t n_proposed, n_accepted; /* speculative draft tokens proposed, and accepted */
};

/* A batch of events taken from a channel by engine_req_poll. Zero-initialize; the poll
 * reuses the buffers; engine_out_free releases them. */
struct engine_out {
    struct engine_event *ev;
    size_t n_ev, cap_ev;
    char *text;
    size_t n_text, cap_text;
    struct sample_token_logprob *top;
    size_t n_top, cap_top;
    float *embd;         /* embeddings' vectors (engine_event.embd) */
    size_t n_embd, cap_embd;
    bool done;           /* every choice has finished: nothing more will come */
    char error[ERR_MSG_MAX]; /* with a finish of ENGINE_ERROR */
};
void engine_out_free(struct engine_out *o);

struct engine;
struct engine_req;

/* Creates a request for the prompt ids (copied). p is copied (strings, bias, stop ids).
 * SMELT_ERR_INVALID names a bad field (n, stops, sampling ranges). */
smelt_status engine_req_new(struct engine_req **out, const struct engine_params *p,
                            const int32_t *prompt, int32_t n_prompt, struct err *e);
/* Drops the caller's reference (after submit, the engine keeps its own). */
void engine_req_unref(struct engine_req *r);
/* Asks the engine to end the request at its next step (idempotent, any thread). The
 * remaining choices finish with ENGINE_CANCELLED. */
void engine_req_cancel(struct engine_req *r);

/* How the consumer is told that output is ready. notify(ctx) is called from the engine
 * thread, with the channel's lock held, once per engine_req_poll that armed it; it must be
 * quick and must not call back into this request. each_token: notify on every event (a
 * stream); else only when the request is done. Set before submit. */
void engine_req_set_notify(struct engine_req *r, void (*notify)(void *ctx), void *ctx,
                           bool each_token);
/* Stops all notifications (the consumer is going away); after it returns, notify is never
 * called again. Also cancels the request. */
void engine_req_detach(struct engine_req *r);

/* Moves everything produced since the last poll into out (its previous contents are
 * dropped). Returns true when out holds events or the request is done; false when
 * nothing is ready, and then, when arm is set, the next event calls notify. */
bool engine_req_poll(struct engine_req *r, struct engine_out *out, bool arm);
/* Blocks until events are ready or timeout_ms passes (< 0: no timeout), then polls.
 * For consumers without a notification (tests, the C API). */
bool engine_req_wait(struct engine_req *r, struct engine_out *out, int timeout_ms);

/* Times of a request (seconds, monotonic clock): submitted, first token, last event. */
void engine_req_times(const struct engine_req *r, double *t_submit, double *t_first,
                      double *t_end);

/* ---- the engine ---- */

/* Creates the engine over a loaded model (may be NULL with a fake forward), its KV store
 * (kv->n_blocks >= cfg->n_blocks) and tokenizer, and starts the engine thread. The
 * model, kv and tok must outlive the engine. */
smelt_status engine_new(struct engine **out, const struct engine_config *cfg, struct model *m,
                        struct kv_store *kv, const struct tok *tok, struct err *e);
/* Cancels everything in flight, stops the thread, frees the engine. */
void engine_free(struct engine *en);

/* The grammar of kind and text[0..len) compiled for the engine's vocabulary, from its cache
 * of compiled grammars (made with the vocabulary on the first call: ~0.2 s for 150k tokens).
 * control: the vocabulary that has control tokens as text (GRAM_VOCAB_CONTROL), for requests
 * whose output renders them (engine_params.decode_special must equal it: submit checks).
 * *out is the caller's reference (gram_unref), for engine_params.grammar. Errors are
 * gram_compile's (they name the line and column, or the schema feature and its JSON path);
 * SMELT_ERR_UNSUPPORTED when the tokenizer has more tokens than the model's logit rows. Any
 * thread. */
smelt_status engine_grammar(struct engine *en, enum gram_kind kind, const char *text, size_t len,
                            bool control, struct gram **out, struct err *e);

/* Queues r (the engine takes its own reference). Errors: SMELT_ERR_INVALID when the prompt
 * does not fit the context (n_ctx, itself capped by the KV pool; the message gives both
 * counts; an embedding's input may fill it, see engine_embd_max_tokens), the request is an
 * embedding and the model is not an embedding model or the other way round, a prompt
 * token is not in the vocabulary, a sampling parameter is out of range,
 * r has more choices than the waiting queue holds (it could never be queued), or r was
 * submitted before; SMELT_ERR_RANGE ("busy") when the waiting queue is full;
 * SMELT_ERR_CANCELLED after engine_drain; SMELT_ERR_NOMEM. */
smelt_status engine_submit(struct engine *en, struct engine_req *r, struct err *e);

/* Stops accepting requests (submit fails with SMELT_ERR_CANCELLED); in-flight ones go on. */
void engine_drain(struct engine *en);
/* Cancels every request in flight (they finish with ENGINE_CANCELLED). */
void engine_cancel_all(struct engine *en);
/* Requests queued or running. */
int32_t engine_in_flight(struct engine *en);

/* An embedding model's vector size (the model's n_embd) when the model declares a pooling
 * type: then every request must be an embedding (engine_params.embed) and none may be;
 * 0 for a generative model, whose requests may not be embeddings. */
int32_t engine_embd_size(const struct engine *en);
/* The longest input an embedding request may have, in tokens: the context, and with
 * bidirectional attention (an encoder: a sequence runs whole, in one step) the step's token
 * budget too. 0 for a generative model. */
int32_t engine_embd_max_tokens(const struct engine *en);

/* The effective configuration (defaults filled in). */
const struct engine_config *engine_config(const struct engine *en);

/* Histogram buckets (upper bounds, seconds) of the latency histograms. */
#define ENGINE_HIST_N 14
extern const double engine_hist_bounds[ENGINE_HIST_N];
struct engine_hist {
    uint64_t bucket[ENGINE_HIST_N + 1]; /* counts per bucket, last = +Inf (not cumulative) */
    uint64_t count;
    double sum;
};

/* Counters since start, and the current state (for /metrics). */
struct engine_stats {
    uint64_t requests_finished[5]; /* by enum engine_finish (choices) */
    uint64_t prompt_tokens;        /* prompt tokens of admitted requests */
    uint64_t cached_tokens;        /* of which taken from the prefix cache */
    uint64_t generated_tokens;
    uint64_t steps, step_rows, preemptions;
    uint64_t parallel_sample_steps; /* steps whose rows were sampled by several threads */
    uint64_t sample_full_rows;      /* sampled rows that needed their full logits, not just
                                     * the row summary (docs/sampling.md) */
    double step_seconds;           /* time in forward + sampling */
    uint64_t grammar_rows;         /* rows sampled under a grammar's mask */
    double grammar_seconds;        /* host time writing their masks and accepting their
                                    * tokens (the masks overlap an asynchronous forward) */
    uint64_t spec_steps;           /* sequence-steps that verified drafts */
    uint64_t spec_proposed, spec_accepted; /* draft tokens */
    uint64_t spec_draft_steps;     /* forward steps of a draft model */
    double spec_draft_seconds;     /* time in them (inside step_seconds) */
    int32_t running, waiting;      /* sequences */
    struct kv_stats kv;
    struct engine_hist ttft, itl;  /* time to first token; inter-token latency */
};
void engine_stats(struct engine *en, struct engine_stats *out);

#endif

/* The serving engine: request channels, the engine thread and the continuous-batching
 * scheduler. See engine.h for the contract and the scheduling policy.
 *
 * Ownership. A struct engine_req is shared by its submitter and the engine (atomic
 * reference count). Its sequences (struct seq, one per choice) belong to the engine
 * thread from submit on: they are created by engine_submit on the caller's thread (so
 * the sampler allocations do not cost the engine thread), handed over through the
 * incoming queue, and freed by the engine thread when they finish. The channel
 * (req->pend and the notify fields) is guarded by req->mu.
 *
 * Per-token host work on the engine thread: one sampler call, one detokenizer push,
 * a stop-string scan over the held-back text (at most the longest stop + one token), and
 * one channel append under the request's lock (plus the notify call when the consumer
 * armed it). Everything else (JSON, SSE, HTTP) happens on the consumer's thread.
 */
#include "engine/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/model.h"
#include "tokenizer/tok.h"
#include "util/array.h"
#include "util/ckd.h"
#include "util/clock.h"
#include "util/log.h"

#define DEFAULT_MAX_SEQS 64
#define DEFAULT_BATCH_TOKENS 512
#define DEFAULT_MAX_WAITING 1024
#define DEFAULT_BLOCK 16
/* Compiled grammars kept by an engine: at most this many, holding at most this many bytes
 * (their automata and the masks they computed; gram_cache_new). */
#define ENGINE_GRAMMAR_CACHE 64
#define ENGINE_GRAMMAR_CACHE_BYTES ((size_t)256 << 20)

const double engine_hist_bounds[ENGINE_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

const char *engine_finish_str(enum engine_finish f) {
    switch (f) {
    case ENGINE_STOP: return "stop";
    case ENGINE_LENGTH: return "length";
    case ENGINE_CANCELLED: return "cancelled";
    case ENGINE_ERROR: return "error";
    default: return "running";
    }
}

void engine_params_default(struct engine_params *p) {
    memset(p, 0, sizeof *p);
    sample_params_default(&p->sp);
    p->max_tokens = -1;
    p->n = 1;
    p->prompt_logprobs = -1;
}

/* ---- requests and channels ---- */

struct engine_req {
    atomic_int refs;
    atomic_bool cancelled;
    struct engine_params p; /* pointers below are owned copies */
    char **stop;
    size_t *stop_len;
    size_t max_stop_len;
    int32_t *stop_ids;
    struct logit_bias *bias;
    int32_t *prompt;
    int32_t n_prompt;
    char *g_prefix, *g_trigger; /* owned copies of p.grammar's */
    bool submitted;
    struct engine_req *next_in; /* incoming queue link */
    struct seq **seqs;          /* (p.n) handed to the engine at submit */

    /* engine thread only */
    bool prompt_ready; /* choice 0's prompt is in the cache (siblings may join) */
    int32_t n_live;    /* choices not finished */

    pthread_mutex_t mu; /* guards the channel below */
    pthread_cond_t cv;
    struct engine_out pend;
    bool armed, detached, notify_each;
    void (*notify)(void *ctx);
    void *notify_ctx;
    bool done;
    double t_submit, t_first, t_end;
};

struct seq {
    struct engine_req *req;
    int32_t choice;
    uint64_t arrival;   /* submit order (preemption picks the newest) */
    int32_t *tok;       /* prompt, then generated tokens */
    int32_t n_tok, n_prompt;
    size_t cap_tok;
    int32_t n_done;     /* positions whose K/V are in the cache */
    int32_t n_gen, n_cached;
    bool admitted_once;
    struct kv_seq kv;
    uint64_t *bhash;    /* hashes of the full blocks known so far (cached or registered) */
    int32_t n_bhash;
    size_t cap_bhash;
    struct sampler *smp;
    bool history;       /* penalties need the token history (sampler_accept) */
    /* the request's grammar: its matcher once it applies (NULL: no grammar, or a lazy one
     * whose trigger has not come yet) */
    struct gram_matcher *gm;
    bool g_wait;           /* a lazy grammar waiting for its trigger in the output */
    struct tok_buf g_tail; /* the output's last bytes, for a trigger across tokens */
    struct err *g_err;     /* this step's mask failed (why); the choice ends with an error */
    struct tok_detok dt;
    struct tok_buf held; /* detokenized text not yet released (stop-string lookahead) */
    double t_last;
    /* this step */
    int32_t rows;       /* rows scheduled */
    int32_t out_row;    /* index of its logits row, or -1 */
    int32_t out_first;  /* index of its first logits row (prompt logprobs) */
    int32_t pos0;       /* its first position this step */
    int32_t b_row0;     /* its first row in the step's batch */
    struct spec_seq sp; /* speculation: its proposals this step (sp.n_draft rows after the
                         * last token, each with logits, from out_row on) and its policy */
    bool plp;           /* reports prompt logprobs (choice 0 of such a request) */
    int32_t plp_done;   /* prompt positions whose logprobs went out (a recompute skips them) */
    uint8_t finish;     /* set when it ends this step */
    /* an embedding (req->p.embed) */
    double *pool;       /* (n_embd) sum of the rows its pooling takes so far */
    int32_t n_rows_out; /* its output rows this step */
};

void engine_out_free(struct engine_out *o) {
    free(o->ev);
    free(o->text);
    free(o->top);
    free(o->embd);
    memset(o, 0, sizeof *o);
}

static void out_clear(struct engine_out *o) {
    o->n_ev = o->n_text = o->n_top = o->n_embd = 0;
    o->done = false;
    o->error[0] = 0;
}

static void seq_free(struct seq *s) {
    if (!s) return;
    gram_matcher_free(s->gm);
    tok_buf_free(&s->g_tail);
    free(s->g_err);
    free(s->tok);
    free(s->bhash);
    free(s->pool);
    sampler_free(s->smp);
    spec_seq_free(&s->sp);
    tok_buf_free(&s->held);
    free(s);
}

static void req_free(struct engine_req *r) {
    for (int32_t i = 0; r->stop && i < r->p.n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_len);
    free(r->stop_ids);
    free(r->bias);
    free(r->prompt);
    gram_unref(r->p.grammar.g);
    free(r->g_prefix);
    free(r->g_trigger);
    if (r->seqs)
        for (int32_t i = 0; i < r->p.n; i++) seq_free(r->seqs[i]);
    free(r->seqs);
    engine_out_free(&r->pend);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void engine_req_unref(struct engine_req *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

smelt_status engine_req_new(struct engine_req **out, const struct engine_params *p,
                            const int32_t *prompt, int32_t n_prompt, struct err *e) {
    *out = NULL;
    if (p->n < 1 || p->n > ENGINE_MAX_N)
        return err_set(e, SMELT_ERR_INVALID, "n must be in [1, %d], got %d", ENGINE_MAX_N, p->n);
    if (p->embed && p->n != 1)
        return err_set(e, SMELT_ERR_INVALID, "an embedding has one choice, got n %d", p->n);
    if (p->n_stop < 0 || p->n_stop > ENGINE_MAX_STOPS)
        return err_set(e, SMELT_ERR_INVALID, "stop: at most %d stop strings, got %d",
                       ENGINE_MAX_STOPS, p->n_stop);
    if (p->prompt_logprobs > SAMPLE_MAX_LOGPROBS)
        return err_set(e, SMELT_ERR_INVALID, "prompt logprobs: at most %d alternatives",
                       SAMPLE_MAX_LOGPROBS);
    if (p->n_stop_ids < 0 || p->n_stop_ids > 1024)
        return err_set(e, SMELT_ERR_INVALID, "stop_token_ids: at most 1024 ids");
    if (n_prompt < 1) return err_set(e, SMELT_ERR_INVALID, "the prompt is empty");
    if (p->sp.n_bias < 0 || p->sp.n_bias > 1 << 20)
        return err_set(e, SMELT_ERR_INVALID, "logit_bias: too many entries");
    for (int32_t i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n == 0 || n > ENGINE_MAX_STOP_LEN)
            return err_set(e, SMELT_ERR_INVALID,
                           "stop: each stop string must be 1 to %d bytes long", ENGINE_MAX_STOP_LEN);
    }
    struct engine_req *r = calloc(1, sizeof *r);
    if (!r) return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, false);
    r->p = *p;
    r->p.stop = NULL;
    r->p.stop_ids = NULL;
    r->p.sp.bias = NULL;
    r->p.grammar = (struct engine_grammar){0};
    bool ok = true;
    if (p->grammar.g) { /* the grammar, its forced beginning and its trigger */
        const struct engine_grammar *g = &p->grammar;
        r->p.grammar.g = gram_ref(g->g);
        r->g_prefix = malloc(g->prefix_len + 1);
        r->g_trigger = malloc(g->trigger_len + 1);
        ok = r->g_prefix && r->g_trigger;
        if (ok) {
            if (g->prefix_len) memcpy(r->g_prefix, g->prefix, g->prefix_len);
            if (g->trigger_len) memcpy(r->g_trigger, g->trigger, g->trigger_len);
            r->p.grammar.prefix = r->g_prefix;
            r->p.grammar.prefix_len = g->prefix_len;
            r->p.grammar.trigger = g->trigger_len ? r->g_trigger : NULL;
            r->p.grammar.trigger_len = g->trigger_len;
        }
    }
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    if (r->prompt) memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    else ok = false;
    r->n_prompt = n_prompt;
    if (ok && p->n_stop > 0) {
        r->stop = calloc((size_t)p->n_stop, sizeof *r->stop);
        r->stop_len = calloc((size_t)p->n_stop, sizeof *r->stop_len);
        ok = r->stop && r->stop_len;
        for (int32_t i = 0; ok && i < p->n_stop; i++) {
            r->stop_len[i] = strlen(p->stop[i]);
            r->stop[i] = malloc(r->stop_len[i] + 1);
            if (!r->stop[i]) ok = false;
            else memcpy(r->stop[i], p->stop[i], r->stop_len[i] + 1);
            if (r->stop_len[i] > r->max_stop_len) r->max_stop_len = r->stop_len[i];
        }
    }
    if (ok && p->n_stop_ids > 0) {
        r->stop_ids = malloc((size_t)p->n_stop_ids * sizeof *r->stop_ids);
        if (r->stop_ids) memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *p->stop_ids);
        else ok = false;
    }
    if (ok && p->sp.n_bias > 0) {
        r->bias = malloc((size_t)p->sp.n_bias * sizeof *r->bias);
        if (r->bias) memcpy(r->bias, p->sp.bias, (size_t)p->sp.n_bias * sizeof *r->bias);
        else ok = false;
        r->p.sp.bias = r->bias;
    }
    r->p.n_stop = ok ? p->n_stop : 0;
    if (!ok) {
        req_free(r);
        return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
    }
    *out = r;
    return SMELT_OK;
}

void engine_req_cancel(struct engine_req *r) { atomic_store(&r->cancelled, true); }

void engine_req_set_notify(struct engine_req *r, void (*notify)(void *ctx), void *ctx,
                           bool each_token) {
    pthread_mutex_lock(&r->mu);
    r->notify = notify;
    r->notify_ctx = ctx;
    r->notify_each = each_token;
    pthread_mutex_unlock(&r->mu);
}

void engine_req_detach(struct engine_req *r) {
    pthread_mutex_lock(&r->mu);
    r->detached = true;
    r->notify = NULL;
    r->armed = false;
    pthread_mutex_unlock(&r->mu);
    engine_req_cancel(r);
}

static void swap_out(struct engine_out *a, struct engine_out *b) {
    struct engine_out t = *a;
    *a = *b;
    *b = t;
}

/* Under r->mu. */
static bool poll_locked(struct engine_req *r, struct engine_out *out) {
    if (r->pend.n_ev == 0 && !r->done) return false;
    out_clear(out);
    swap_out(out, &r->pend);
    out->done = r->done;
    if (r->pend.error[0] && !out->error[0]) memcpy(out->error, r->pend.error, sizeof out->error);
    r->pend.error[0] = 0;
    r->pend.done = false;
    return true;
}

bool engine_req_poll(struct engine_req *r, struct engine_out *out, bool arm) {
    pthread_mutex_lock(&r->mu);
    bool got = poll_locked(r, out);
    if (!got && arm) r->armed = true;
    pthread_mutex_unlock(&r->mu);
    return got;
}

bool engine_req_wait(struct engine_req *r, struct engine_out *out, int timeout_ms) {
    pthread_mutex_lock(&r->mu);
    struct timespec dl = clock_after_ms(timeout_ms);
    while (r->pend.n_ev == 0 && !r->done) {
        if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) != 0) break;
    }
    bool got = poll_locked(r, out);
    pthread_mutex_unlock(&r->mu);
    return got;
}

void engine_req_times(const struct engine_req *r, double *t_submit, double *t_first,
                      double *t_end) {
    struct engine_req *m = (struct engine_req *)r;
    pthread_mutex_lock(&m->mu);
    if (t_submit) *t_submit = r->t_submit;
    if (t_first) *t_first = r->t_first;
    if (t_end) *t_end = r->t_end;
    pthread_mutex_unlock(&m->mu);
}

/* ---- the engine ---- */

/* Threads that sample a step's rows in parallel (see engine.h). A job is published by
 * bumping `gen`; workers and the engine thread take rows from `next` until none are left. */
struct sample_pool {
    int n_threads; /* workers, besides the engine thread */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int busy; /* workers still on the current job */
    bool quit, inited;
    atomic_int next;
};

/* One row to sample this step. */
struct sample_job {
    struct seq *s;
    bool full;          /* finish from the full row (en->logits row s->out_row) */
    bool spec;          /* verifies the sequence's drafts (after the other rows) */
    struct sample_result r;
    smelt_status st;
    char msg[ERR_MSG_MAX];
};

/* A step's duration against its rows, t = a + b x rows, fitted by least squares over the
 * recent steps (each older step weighs FIT_DECAY times less), for itl_target_s. Attention
 * at depth and sampling make the real cost more than a line; the weights let the line
 * follow them as the load changes. */
#define FIT_DECAY 0.95
struct step_fit {
    double w, sx, sy, sxx, sxy;
};

static void fit_add(struct step_fit *f, double rows, double sec) {
    f->w = f->w * FIT_DECAY + 1;
    f->sx = f->sx * FIT_DECAY + rows;
    f->sy = f->sy * FIT_DECAY + sec;
    f->sxx = f->sxx * FIT_DECAY + rows * rows;
    f->sxy = f->sxy * FIT_DECAY + rows * sec;
}

/* The most rows a step is predicted to run in sec seconds: INT32_MAX while the steps seen
 * do not define a line (their sizes spread less than FIT_MIN_SD rows, where noise would set
 * the slope, or time does not grow with rows). */
#define FIT_MIN_SD 16.0
static int32_t fit_rows(const struct step_fit *f, double sec) {
    double den = f->w * f->sxx - f->sx * f->sx; /* w^2 x the rows' variance */
    if (den < FIT_MIN_SD * FIT_MIN_SD * f->w * f->w) return INT32_MAX;
    double b = (f->w * f->sxy - f->sx * f->sy) / den;
    if (!(b > 0)) return INT32_MAX;
    double a = (f->sy - b * f->sx) / f->w, r = (sec - a) / b;
    return r <= 0 ? 0 : r >= 1e9 ? INT32_MAX : (int32_t)r;
}

struct engine {
    struct engine_config cfg;
    struct model *m;
    struct kv_store *kvs;
    const struct tok *tok;
    int32_t n_vocab;
    struct kv_pool pool;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t qmu; /* guards incoming, stop, closed, n_queued */
    pthread_cond_t qcv;
    struct engine_req *in_head, *in_tail;
    bool stop, closed;
    atomic_bool cancel_all;
    atomic_int in_flight; /* requests submitted and not done */
    int32_t n_queued;     /* waiting sequences + incoming (for max_waiting) */
    uint64_t next_arrival;

    /* engine thread only */
    struct seq **running; /* (max_seqs) oldest first */
    int32_t n_running;
    struct seq **waiting; /* arrival order */
    int32_t n_waiting;
    size_t cap_waiting;
    struct seq **sched;   /* this step's sequences, batch order */
    int32_t n_sched;
    int32_t *b_tok, *b_pos, *b_seq;
    uint8_t *b_logits;
    struct batch_seq *b_seqs;
    int32_t max_out;  /* output rows a step can have: max_seqs + ENGINE_PLP_ROWS */
    /* an embedding model (its pooling is not POOL_NONE): every sequence is an embedding */
    enum model_pooling pooling;
    bool bidir;       /* its attention is bidirectional: a sequence runs whole in one step */
    int32_t n_embd;
    float *hidden;    /* (max_batch_tokens, n_embd) the step's output rows */
    float *logits;    /* (max_out, n_vocab) full rows: from the start with a fake forward
                       * (which writes every row), else on the first prompt-logprobs row or
                       * full-row sampling fallback */
    /* summaries (model path): per output row, the request and the result */
    struct topk_row *q_rows;   /* (max_out) */
    struct logit_adj *q_adj;   /* (model_adj_cap(max_out)) */
    float *q_raw;              /* (model_adj_cap(max_out)) */
    struct topk_summary *q_sum; /* (max_out) */
    struct topk_cand *q_cand;  /* (max_out, TOPK_MAX) */
    /* grammars: the vocabularies and their caches of compiled grammars, made on first use
     * (gmu guards making them; a cache locks itself), [1] with control tokens as text (for
     * requests that render them, decode_special); the step's token masks, row r's at
     * q_mask + r * mask_words, allocated on the first step with a grammar */
    pthread_mutex_t gmu;
    struct gram_vocab *gvocab[2];
    struct gram_cache *gcache[2];
    uint32_t *q_mask;   /* (max_out, mask_words) */
    int64_t mask_words; /* topk_mask_words(n_vocab) */
    double stats_gsec;  /* engine thread only; published with the stats */
    uint64_t stats_grows;
    struct tok_buf emit; /* scratch for released text */
    float *emit_embd;    /* (n_embd) an embedding being pushed */
    struct sample_job *jobs; /* (max_seqs) this step's rows to sample */
    int32_t n_jobs;
    int32_t *pick;           /* (max_seqs) the jobs sample_jobs works on */
    int32_t n_pick;
    struct sample_pool pool_s;
    bool pool_started;
    /* the step observer's view (cfg.on_step only) */
    struct engine_step_seq *obs_seqs; /* (max_seqs) */
    uint64_t *obs_preempted;          /* (max_seqs) */
    int32_t n_obs_preempted;
    int32_t obs_budget;
    struct step_fit fit; /* step seconds against rows (itl_target_s) */
    uint64_t stats_parallel; /* engine thread only; published with the stats */
    uint64_t stats_full_rows;
    /* speculation (NULL: off) */
    struct spec *spec;
    struct spec_job *spec_jobs;      /* (max_seqs) */
    struct spec_obs *spec_obs;       /* (max_seqs) SPEC_MTP: the step's kept rows per sequence */
    float *mtp_hid;                  /* SPEC_MTP (max_batch_tokens, n_embd): the trunk's final
                                      * hidden state of every row of the step */
    struct sample_result *spec_out;  /* (SPEC_K_MAX + 1) one sequence's verified tokens */

    pthread_mutex_t smu; /* guards stats */
    struct engine_stats stats;
};

const struct engine_config *engine_config(const struct engine *en) { return &en->cfg; }

int32_t engine_embd_size(const struct engine *en) { return en->pooling != POOL_NONE ? en->n_embd : 0; }

int32_t engine_embd_max_tokens(const struct engine *en) {
    if (en->pooling == POOL_NONE) return 0;
    int32_t n = en->cfg.n_ctx;
    if (en->bidir && en->cfg.max_batch_tokens < n) n = en->cfg.max_batch_tokens;
    return n;
}

int32_t engine_in_flight(struct engine *en) { return atomic_load(&en->in_flight); }

static void hist_add(struct engine_hist *h, double v) {
    int i = 0;
    while (i < ENGINE_HIST_N && v > engine_hist_bounds[i]) i++;
    h->bucket[i]++;
    h->count++;
    h->sum += v;
}

void engine_stats(struct engine *en, struct engine_stats *out) {
    pthread_mutex_lock(&en->smu);
    *out = en->stats;
    pthread_mutex_unlock(&en->smu);
}

/* Appends an event to r's channel; text/top are copied. Called by the engine thread. */
static void push_event(struct engine *en, struct engine_req *r, const struct engine_event *ev0,
                       const char *text, size_t text_len, const struct sample_result *sr,
                       const char *errmsg) {
    pthread_mutex_lock(&r->mu);
    struct engine_out *o = &r->pend;
    struct engine_event ev = *ev0;
    int32_t n_top = sr ? sr->n_top : 0;
    bool ok =
        array_grow((void **)&o->ev, &o->cap_ev, o->n_ev + 1, sizeof *o->ev) &&
        array_grow((void **)&o->text, &o->cap_text, o->n_text + text_len + 1, 1) &&
        array_grow((void **)&o->top, &o->cap_top, o->n_top + (size_t)n_top + 1, sizeof *o->top);
    if (ev.n_embd > 0) { /* an embedding's vector: from en->emit_embd */
        ok = ok && array_grow((void **)&o->embd, &o->cap_embd, o->n_embd + (size_t)ev.n_embd,
                              sizeof *o->embd);
        if (ok) {
            memcpy(o->embd + o->n_embd, en->emit_embd, (size_t)ev.n_embd * sizeof *o->embd);
            ev.embd = (uint32_t)o->n_embd;
            o->n_embd += (size_t)ev.n_embd;
        } else {
            ev.n_embd = 0;
            ev.finish = ENGINE_ERROR;
            errmsg = "out of memory for an embedding";
        }
    }
    if (ok) {
        ev.text = (uint32_t)o->n_text;
        ev.text_len = (uint32_t)text_len;
        if (text_len) memcpy(o->text + o->n_text, text, text_len);
        o->n_text += text_len;
        o->text[o->n_text] = 0;
        ev.top = (uint32_t)o->n_top;
        ev.n_top = n_top;
        if (n_top) memcpy(o->top + o->n_top, sr->top, (size_t)n_top * sizeof *o->top);
        o->n_top += (size_t)n_top;
        o->ev[o->n_ev++] = ev;
    } else if (array_grow((void **)&o->ev, &o->cap_ev, o->n_ev + 1, sizeof *o->ev)) {
        /* out of memory for the text: the event goes without it */
        ev.text_len = 0;
        ev.n_top = 0;
        o->ev[o->n_ev++] = ev;
    }
    if (errmsg && !o->error[0]) snprintf(o->error, sizeof o->error, "%s", errmsg);
    double t = clock_now();
    if (ev.token >= 0 && r->t_first == 0) r->t_first = t;
    r->t_end = t;
    if (ev.finish && --r->n_live == 0) {
        r->done = true;
        atomic_fetch_sub(&en->in_flight, 1);
    }
    if (r->armed && r->notify && (r->notify_each || r->done)) {
        r->armed = false;
        r->notify(r->notify_ctx);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The longest k < min(len(stop), n) such that held ends with stop[0..k). */
static size_t partial_stop(const char *held, size_t n, const char *stop, size_t len) {
    size_t k = len - 1 < n ? len - 1 : n;
    for (; k > 0; k--)
        if (memcmp(held + n - k, stop, k) == 0) return k;
    return 0;
}

/* Releases what the stop strings allow from s->held into en->emit. Returns 1 + the index of
 * the stop string found first in the text (held is then dropped: the stop and what follows
 * never show), 0 when none was. */
static int release_text(struct engine *en, struct seq *s, bool final) {
    struct engine_req *r = s->req;
    size_t n = s->held.n, cut = n;
    int hit = 0;
    for (int32_t i = 0; i < r->p.n_stop; i++) {
        const char *f = memmem(s->held.p ? s->held.p : "", n, r->stop[i], r->stop_len[i]);
        if (f && (size_t)(f - s->held.p) < cut) {
            cut = (size_t)(f - s->held.p);
            hit = i + 1;
        }
    }
    if (!hit && !final) {
        size_t keep = 0;
        for (int32_t i = 0; i < r->p.n_stop; i++) {
            size_t k = partial_stop(s->held.p, n, r->stop[i], r->stop_len[i]);
            if (k > keep) keep = k;
        }
        cut = n - keep;
    }
    en->emit.n = 0;
    if (cut > 0 && array_grow((void **)&en->emit.p, &en->emit.cap, cut + 1, 1)) {
        memcpy(en->emit.p, s->held.p, cut);
        en->emit.n = cut;
        en->emit.p[cut] = 0;
    }
    if (hit || final) {
        s->held.n = 0;
    } else if (cut > 0) {
        memmove(s->held.p, s->held.p + cut, n - cut);
        s->held.n = n - cut;
    }
    return hit;
}

/* Ends s with `why`: releases the held text (unless a stop string cut it), pushes the
 * final event (carrying token tok >= 0 when the last sampled token goes with it). stop: 1 +
 * the index of the stop string that ended it, 0 if none did (when the text is not ready,
 * the final release may still find one). */
static void finish_seq(struct engine *en, struct seq *s, enum engine_finish why, int32_t tok,
                       const struct sample_result *sr, bool text_ready, int stop,
                       const char *errmsg) {
    if (!text_ready) {
        if (why != ENGINE_ERROR && why != ENGINE_CANCELLED) {
            struct err e;
            tok_detok_flush(&s->dt, &s->held, &e);
            stop = release_text(en, s, true);
        } else {
            en->emit.n = 0;
        }
    }
    struct engine_event ev = {.choice = s->choice, .token = tok, .finish = (uint8_t)why};
    if (why == ENGINE_STOP) ev.stop = (uint8_t)stop;
    ev.logprob = sr ? sr->logprob : 0;
    ev.n_prompt = s->n_prompt;
    ev.n_cached = s->n_cached;
    ev.n_gen = s->n_gen;
    ev.n_proposed = (int32_t)s->sp.n_proposed;
    ev.n_accepted = (int32_t)s->sp.n_accepted;
    push_event(en, s->req, &ev, en->emit.p, en->emit.n, sr, errmsg);
    s->finish = (uint8_t)why;
    pthread_mutex_lock(&en->smu);
    en->stats.requests_finished[why]++;
    pthread_mutex_unlock(&en->smu);
}

static bool is_stop_id(const struct engine_req *r, int32_t t) {
    for (int32_t i = 0; i < r->p.n_stop_ids; i++)
        if (r->stop_ids[i] == t) return true;
    return false;
}

/* Registers s's newly completed full blocks in the prefix cache. */
static void register_blocks(struct engine *en, struct seq *s) {
    if (!en->pool.prefix) return;
    int32_t bs = en->pool.block_size, full = s->n_done / bs;
    if (full > s->kv.n_blocks) full = s->kv.n_blocks;
    if (!array_grow((void **)&s->bhash, &s->cap_bhash, (size_t)full, sizeof *s->bhash)) return;
    for (int32_t b = s->n_bhash; b < full; b++) {
        uint64_t parent = b ? s->bhash[b - 1] : 0;
        const int32_t *t = s->tok + (size_t)b * (size_t)bs;
        s->bhash[b] = kv_block_hash(&en->pool, parent, t);
        kv_prefix_register(&en->pool, s->kv.blocks[b], s->bhash[b], parent, t);
    }
    if (full > s->n_bhash) s->n_bhash = full;
    spec_register(en->spec, &s->sp, s->kv.blocks, s->bhash, s->n_bhash);
}

static void release_kv(struct engine *en, struct seq *s) {
    register_blocks(en, s);
    kv_seq_release(&en->pool, &s->kv);
    s->n_done = 0;
    s->n_bhash = 0;
}

/* Inserts s into the waiting list in arrival order. */
static bool waiting_insert(struct engine *en, struct seq *s) {
    if (!array_grow((void **)&en->waiting, &en->cap_waiting, (size_t)en->n_waiting + 1,
                    sizeof *en->waiting))
        return false;
    int32_t i = en->n_waiting;
    while (i > 0 && en->waiting[i - 1]->arrival > s->arrival) i--;
    memmove(en->waiting + i + 1, en->waiting + i, (size_t)(en->n_waiting - i) * sizeof *en->waiting);
    en->waiting[i] = s;
    en->n_waiting++;
    return true;
}

static void running_insert(struct engine *en, struct seq *s) {
    int32_t i = en->n_running;
    while (i > 0 && en->running[i - 1]->arrival > s->arrival) i--;
    memmove(en->running + i + 1, en->running + i, (size_t)(en->n_running - i) * sizeof *en->running);
    en->running[i] = s;
    en->n_running++;
}

/* The engine drops its reference on a sequence's request once the sequence is gone. */
static void seq_retire(struct engine *en, struct seq *s) {
    struct engine_req *r = s->req;
    kv_seq_release(&en->pool, &s->kv);
    r->seqs[s->choice] = NULL;
    seq_free(s);
    engine_req_unref(r);
}

/* Preempts s (running): its K/V go (full blocks stay cached), it waits to be recomputed. */
static void preempt(struct engine *en, struct seq *s) {
    release_kv(en, s);
    for (int32_t i = 0; i < en->n_running; i++)
        if (en->running[i] == s) {
            memmove(en->running + i, en->running + i + 1,
                    (size_t)(en->n_running - i - 1) * sizeof *en->running);
            en->n_running--;
            break;
        }
    s->rows = 0;
    if (en->obs_preempted && en->n_obs_preempted < en->cfg.max_seqs)
        en->obs_preempted[en->n_obs_preempted++] = s->arrival;
    if (!waiting_insert(en, s)) {
        finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, "out of memory while preempting");
        seq_retire(en, s);
        return;
    }
    pthread_mutex_lock(&en->qmu);
    en->n_queued++;
    pthread_mutex_unlock(&en->qmu);
    pthread_mutex_lock(&en->smu);
    en->stats.preemptions++;
    pthread_mutex_unlock(&en->smu);
}

/* Takes the incoming queue into the waiting list. */
static void intake(struct engine *en, struct engine_req *list) {
    while (list) {
        struct engine_req *r = list;
        list = r->next_in;
        r->next_in = NULL;
        r->n_live = r->p.n;
        r->prompt_ready = r->p.n == 1 || !en->pool.prefix;
        for (int32_t i = 0; i < r->p.n; i++) {
            struct seq *s = r->seqs[i];
            if (!waiting_insert(en, s)) {
                finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, "out of memory");
                seq_retire(en, s);
                pthread_mutex_lock(&en->qmu);
                en->n_queued--;
                pthread_mutex_unlock(&en->qmu);
            }
        }
    }
}

/* Removes cancelled sequences (running and waiting). */
static void reap_cancelled(struct engine *en) {
    bool all = atomic_load(&en->cancel_all);
    if (all) atomic_store(&en->cancel_all, false);
    for (int32_t i = 0; i < en->n_running;) {
        struct seq *s = en->running[i];
        if (all || atomic_load(&s->req->cancelled)) {
            memmove(en->running + i, en->running + i + 1,
                    (size_t)(en->n_running - i - 1) * sizeof *en->running);
            en->n_running--;
            register_blocks(en, s);
            finish_seq(en, s, ENGINE_CANCELLED, -1, NULL, false, 0, NULL);
            seq_retire(en, s);
        } else {
            i++;
        }
    }
    int32_t w = 0, gone = 0;
    for (int32_t i = 0; i < en->n_waiting; i++) {
        struct seq *s = en->waiting[i];
        if (all || atomic_load(&s->req->cancelled)) {
            finish_seq(en, s, ENGINE_CANCELLED, -1, NULL, false, 0, NULL);
            seq_retire(en, s);
            gone++;
        } else {
            en->waiting[w++] = s;
        }
    }
    en->n_waiting = w;
    if (gone) {
        pthread_mutex_lock(&en->qmu);
        en->n_queued -= gone;
        pthread_mutex_unlock(&en->qmu);
    }
}

/* Tries to admit waiting sequence s: takes its cached prefix and reserves the blocks of
 * the rest of its tokens. Returns false (s unchanged) when they do not fit now. */
static bool admit(struct engine *en, struct seq *s) {
    struct kv_pool *p = &en->pool;
    int32_t bs = p->block_size;
    int32_t max_cached = (s->n_tok - 1) / bs; /* at least one row must run for the logits */
    /* prompt logprobs need the logits of every prompt row not yet reported */
    if (s->plp && s->plp_done < s->n_prompt - 1 && max_cached > s->plp_done / bs)
        max_cached = s->plp_done / bs;
    /* mean and cls pooling need rows a cached prefix would skip */
    if (s->pool && en->pooling != POOL_LAST) max_cached = 0;
    int32_t got = 0;
    if (p->prefix && max_cached > 0) {
        if (!array_grow((void **)&s->bhash, &s->cap_bhash, (size_t)max_cached, sizeof *s->bhash))
            return false;
        got = kv_prefix_acquire(p, &s->kv, s->tok, max_cached, s->bhash);
    }
    int32_t need = kv_blocks_for(p, s->n_tok) - got;
    int32_t avail = kv_pool_available(p);
    /* keep a little headroom for the decodes of those already running */
    int32_t watermark = en->n_running > 0 ? (p->n_blocks + 99) / 100 : 0;
    struct err e;
    if (need > avail - watermark || kv_seq_reserve(p, &s->kv, s->n_tok, &e) != SMELT_OK) {
        kv_seq_release(p, &s->kv);
        return false;
    }
    if (s->kv.restore >= 0) { /* resume the recurrent state at the snapshot */
        int32_t dst = s->kv.slot, src = s->kv.restore;
        smelt_status st = en->cfg.forward
                              ? en->cfg.state_copy(en->cfg.forward_ctx, dst, src, &e)
                              : model_state_copy(en->m, en->kvs, dst, src, &e);
        s->kv.restore = -1;
        if (st != SMELT_OK) {
            log_error("engine: restoring a state snapshot failed: %s", e.msg);
            kv_seq_release(p, &s->kv);
            return false;
        }
    }
    s->n_done = got * bs;
    s->n_bhash = got;
    if (s->pool) memset(s->pool, 0, (size_t)en->n_embd * sizeof *s->pool);
    spec_admit(en->spec, &s->sp, s->kv.blocks, s->bhash, got);
    if (!s->admitted_once) {
        s->admitted_once = true;
        s->n_cached = s->n_done;
        pthread_mutex_lock(&en->smu);
        en->stats.prompt_tokens += (uint64_t)s->n_prompt;
        en->stats.cached_tokens += (uint64_t)s->n_cached;
        pthread_mutex_unlock(&en->smu);
    }
    return true;
}

/* How many of s's drafts (s->sp.draft[0..n_draft)) its grammar lets it verify. Under its
 * matcher: the longest run the grammar takes (the matcher is left as it was: fill_masks walks
 * the drafts again for the masks of the rows after them). A lazy grammar waiting for its
 * trigger: the drafts before the one that completes the trigger (the rows after it would be
 * under the grammar without a mask; the row that samples it is free). */
static int32_t grammar_cut(struct engine *en, struct seq *s) {
    const int32_t *d = s->sp.draft;
    int32_t n = s->sp.n_draft;
    struct err e;
    if (s->gm) {
        /* the run the grammar takes, short of a draft that completes it: the row after that
         * draft would have nothing left to draw (its mask empty: "every token is banned"),
         * so the row before it draws it, and the choice ends there */
        int32_t took = 0, back = 0;
        while (took < n && gram_matcher_accept(s->gm, d[took], &e) == SMELT_OK) {
            back++;
            if (gram_matcher_ended(s->gm)) break;
            took++;
        }
        if (back > 0 && gram_matcher_rollback(s->gm, back, &e) != SMELT_OK) {
            /* cannot happen (back <= ENGINE_GRAMMAR_ROLLBACK); the choice ends */
            if (!s->g_err && (s->g_err = malloc(sizeof *s->g_err))) *s->g_err = e;
            return 0;
        }
        return took;
    }
    const struct engine_grammar *g = &s->req->p.grammar;
    struct tok_buf b = {0};
    int32_t keep = 0;
    if (array_grow((void **)&b.p, &b.cap, s->g_tail.n + 1, 1)) {
        memcpy(b.p, s->g_tail.p, s->g_tail.n);
        b.n = s->g_tail.n;
        for (; keep < n; keep++) {
            size_t len;
            const char *piece = tok_piece(en->tok, d[keep], &len);
            if (!array_grow((void **)&b.p, &b.cap, b.n + len + 1, 1)) break;
            memcpy(b.p + b.n, piece, len);
            b.n += len;
            if (memmem(b.p, b.n, g->trigger, g->trigger_len)) break;
        }
    }
    tok_buf_free(&b);
    return keep;
}

/* The decoding sequences (one row each so far) propose drafts within the step's budget:
 * their KV is reserved for them first, without preempting anyone. Returns the budget left. */
static int32_t schedule_spec(struct engine *en, int32_t budget) {
    int32_t n_dec = 0, n_jobs = 0;
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        s->sp.n_draft = 0;
        n_dec += s->rows == 1 && s->n_tok - s->n_done == 1;
    }
    for (int32_t i = 0; i < en->n_running && budget > 0; i++) {
        struct seq *s = en->running[i];
        if (s->rows != 1 || s->n_tok - s->n_done != 1 || s->pool) continue; /* (an embedding) */
        int32_t k = spec_want(en->spec, &s->sp, n_dec);
        const struct engine_req *r = s->req;
        if (r->p.max_tokens >= 0 && k > r->p.max_tokens - s->n_gen - 1)
            k = r->p.max_tokens - s->n_gen - 1; /* the step emits at most k + 1 tokens */
        if (k > en->cfg.n_ctx - s->n_tok) k = en->cfg.n_ctx - s->n_tok;
        if (k > budget) k = budget;
        /* under a grammar the drafts are checked and rolled back in its matcher */
        if ((s->gm || s->g_wait) && k > ENGINE_GRAMMAR_ROLLBACK) k = ENGINE_GRAMMAR_ROLLBACK;
        struct err e;
        if (k <= 0 || kv_seq_reserve(&en->pool, &s->kv, s->n_done + 1 + k, &e) != SMELT_OK) continue;
        en->spec_jobs[n_jobs++] = (struct spec_job){&s->sp, s->tok, s->n_tok, k, kv_seq_view(&s->kv),
                                                    r->p.sp.temperature};
        budget -= k;
    }
    struct err e;
    err_clear(&e);
    if (spec_propose(en->spec, en->spec_jobs, n_jobs, &e) != SMELT_OK)
        log_warn("engine: proposing drafts failed (the step goes on without them): %s", e.msg);
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        if (s->sp.n_draft > 0 && (s->gm || s->g_wait)) s->sp.n_draft = grammar_cut(en, s);
    }
    for (int32_t j = 0; j < n_jobs; j++) {
        const struct spec_job *job = &en->spec_jobs[j];
        budget += job->k - job->ss->n_draft;
    }
    for (int32_t i = 0; i < en->n_running; i++) en->running[i]->rows += en->running[i]->sp.n_draft;
    return budget;
}

/* Decides this step's rows. Returns the number of rows. */
static int32_t schedule(struct engine *en) {
    struct kv_pool *p = &en->pool;
    int32_t budget = en->cfg.max_batch_tokens;
    en->n_sched = 0;
    en->n_obs_preempted = 0;
    /* decodes first, oldest first; preempt the newest when the pool runs dry */
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        s->rows = 0;
        s->out_row = -1;
        if (s->n_tok - s->n_done != 1) continue;
        struct err e;
        bool ok = false;
        while (!ok) {
            if (kv_seq_reserve(p, &s->kv, s->n_done + 1, &e) == SMELT_OK) {
                ok = true;
                break;
            }
            struct seq *victim = en->running[en->n_running - 1];
            bool self = victim == s;
            preempt(en, victim);
            if (self) break;
        }
        if (ok) {
            s->rows = 1;
            budget--;
        } else {
            break; /* s itself was the newest: everything after it is gone too */
        }
    }
    if (en->spec) budget = schedule_spec(en, budget);
    int32_t used = en->cfg.max_batch_tokens - budget; /* decode and draft rows */
    if (en->cfg.itl_target_s > 0 && used > 0) {
        int32_t cap = fit_rows(&en->fit, en->cfg.itl_target_s);
        int32_t allow = cap == INT32_MAX ? budget : cap - used;
        if (allow < ENGINE_MIN_CHUNK) allow = ENGINE_MIN_CHUNK;
        if (allow < budget) budget = allow;
    }
    en->obs_budget = used + budget;
    /* prefill chunks of the admitted, oldest first; a prompt-logprobs chunk needs the logits
     * of every row, and those rows are capped per step */
    int32_t plp_left = ENGINE_PLP_ROWS;
    for (int32_t i = 0; i < en->n_running && budget > 0; i++) {
        struct seq *s = en->running[i];
        int32_t pend = s->n_tok - s->n_done;
        if (pend <= 1) continue;
        s->rows = pend < budget ? pend : budget;
        /* admission reserved a prompt's blocks; a sequence feeding tokens again after a
         * recurrent state's rollback (to the snapshot before its accepted tokens) also
         * reaches its pending token's position, which may need a block more. Without one
         * (the pool dry), it runs what its blocks cover and waits for the rest. */
        struct err re;
        if (kv_seq_reserve(p, &s->kv, s->n_done + s->rows, &re) != SMELT_OK) {
            int32_t covered = s->kv.n_blocks * p->block_size - s->n_done;
            s->rows = covered < s->rows ? (covered > 0 ? covered : 0) : s->rows;
            if (s->rows == 0) continue;
        }
        if (s->plp && s->n_done < s->n_prompt) {
            if (s->rows > plp_left) s->rows = plp_left;
            plp_left -= s->rows;
        }
        budget -= s->rows;
    }
    /* admissions */
    for (int32_t i = 0; i < en->n_waiting && budget > 0 && en->n_running < en->cfg.max_seqs;) {
        struct seq *s = en->waiting[i];
        if (s->choice > 0 && !s->req->prompt_ready) {
            i++; /* a sibling waits for choice 0's prompt to reach the cache */
            continue;
        }
        if (en->bidir && s->n_tok > budget) break; /* it runs whole: next step */
        if (!admit(en, s)) break;
        memmove(en->waiting + i, en->waiting + i + 1,
                (size_t)(en->n_waiting - i - 1) * sizeof *en->waiting);
        en->n_waiting--;
        pthread_mutex_lock(&en->qmu);
        en->n_queued--;
        pthread_mutex_unlock(&en->qmu);
        int32_t pend = s->n_tok - s->n_done;
        s->rows = pend < budget ? pend : budget;
        if (s->plp && s->n_done < s->n_prompt) {
            if (s->rows > plp_left) s->rows = plp_left;
            plp_left -= s->rows;
        }
        s->out_row = -1;
        budget -= s->rows;
        running_insert(en, s);
    }
    /* batch order: running order */
    int32_t n = 0, n_out = 0;
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        if (s->rows <= 0) continue;
        int32_t si = en->n_sched;
        en->sched[en->n_sched++] = s;
        /* with recurrent layers: a snapshot at the last block boundary of the step, kept
         * when it ends the prompt's last full block (siblings and retries resume there) */
        int32_t bs = en->pool.block_size, p1 = s->n_done + s->rows, pb = s->n_prompt / bs * bs;
        bool keep = pb > s->n_done && p1 / bs * bs == pb;
        en->b_seqs[si] = kv_seq_step(&en->pool, &s->kv, s->n_done, p1, keep);
        s->pos0 = s->n_done;
        s->b_row0 = n;
        s->out_first = n_out;
        s->n_rows_out = 0;
        s->out_row = -1;
        for (int32_t k = 0; k < s->rows; k++, n++) {
            int32_t pos = s->n_done + k;
            /* past the tokens: the drafts, every row with its logits */
            en->b_tok[n] = pos < s->n_tok ? s->tok[pos] : s->sp.draft[pos - s->n_tok];
            en->b_pos[n] = pos;
            en->b_seq[n] = si;
            if (s->pool) /* the rows its pooling takes */
                en->b_logits[n] = en->pooling == POOL_MEAN || pos == (en->pooling == POOL_CLS
                                                                      ? 0 : s->n_tok - 1);
            else /* past the tokens: the drafts, every row with its logits */
                en->b_logits[n] = pos >= s->n_tok - 1 || (s->plp && pos < s->n_prompt - 1);
            if (!s->pool && pos == s->n_tok - 1) s->out_row = n_out;
            if (en->b_logits[n]) n_out++, s->n_rows_out++;
        }
    }
    return n;
}

/* ---- grammars ---- */

/* s's grammar takes token t: its matcher, or (a lazy grammar) the search for the trigger,
 * which starts the matcher on the output from the trigger on. */
static smelt_status grammar_take(struct engine *en, struct seq *s, int32_t t, struct err *e) {
    if (s->gm) {
        smelt_status st = gram_matcher_accept(s->gm, t, e);
        return st == SMELT_OK ? st : err_prefix(e, "grammar");
    }
    const struct engine_grammar *g = &s->req->p.grammar;
    size_t n;
    const char *p = tok_piece(en->tok, t, &n);
    struct tok_buf *b = &s->g_tail;
    if (!array_grow((void **)&b->p, &b->cap, b->n + n + 1, 1))
        return err_set(e, SMELT_ERR_NOMEM, "grammar: out of memory");
    memcpy(b->p + b->n, p, n);
    b->n += n;
    const char *hit = memmem(b->p, b->n, g->trigger, g->trigger_len);
    if (!hit) { /* keep what could be the start of the trigger */
        size_t keep = g->trigger_len - 1 < b->n ? g->trigger_len - 1 : b->n;
        memmove(b->p, b->p + b->n - keep, keep);
        b->n = keep;
        return SMELT_OK;
    }
    smelt_status st = gram_matcher_new(&s->gm, g->g, ENGINE_GRAMMAR_ROLLBACK, e);
    if (st == SMELT_OK) st = gram_matcher_accept_bytes(s->gm, hit, b->n - (size_t)(hit - b->p), e);
    s->g_wait = false;
    b->n = 0;
    if (st != SMELT_OK)
        return err_prefix(e, "grammar: the output from its trigger \"%.*s\" on",
                          (int)g->trigger_len, g->trigger);
    return SMELT_OK;
}

/* model_step's fill_masks (and the fake forward's, before its rows are sampled): the token
 * mask of every row whose sequence is under a grammar. A failure is kept with the sequence,
 * which ends with an error after the step. */
static void fill_masks(void *ctx) {
    struct engine *en = ctx;
    double t0 = clock_now();
    for (int32_t i = 0; i < en->n_sched; i++) {
        struct seq *s = en->sched[i];
        if (!s->gm || s->out_row < 0) continue;
        size_t gw = gram_mask_words(gram_vocab_n(gram_vocab_of(s->req->p.grammar.g)));
        /* a speculating sequence's row j follows drafts 1..j: the matcher takes them (they
         * were checked by grammar_cut), then gives them back */
        int32_t nd = s->sp.n_draft, took = 0;
        struct err e;
        smelt_status st = SMELT_OK;
        for (int32_t j = 0; j <= nd; j++) {
            uint32_t *row = en->q_mask + (size_t)(s->out_row + j) * (size_t)en->mask_words;
            if (st == SMELT_OK) st = gram_matcher_fill_mask(s->gm, row, &e);
            memset(row + gw, 0, ((size_t)en->mask_words - gw) * sizeof *row);
            if (st == SMELT_OK && j < nd && (st = gram_matcher_accept(s->gm, s->sp.draft[j], &e)) == SMELT_OK)
                took++;
            en->stats_grows++;
        }
        if (took > 0) {
            struct err re;
            smelt_status rst = gram_matcher_rollback(s->gm, took, &re);
            if (st == SMELT_OK && rst != SMELT_OK) st = rst, e = re;
        }
        if (st != SMELT_OK && !s->g_err && (s->g_err = malloc(sizeof *s->g_err))) *s->g_err = e;
    }
    en->stats_gsec += clock_now() - t0;
}

/* Points each sampled row's sampler at its token mask (or at none). false: no row has a
 * grammar, or no memory for the masks (the grammar rows then end with an error). */
static bool bind_masks(struct engine *en) {
    bool any = false;
    for (int32_t i = 0; i < en->n_sched && !any; i++)
        any = en->sched[i]->gm && en->sched[i]->out_row >= 0;
    if (any && !en->q_mask)
        en->q_mask = malloc((size_t)en->max_out * (size_t)en->mask_words * sizeof *en->q_mask);
    for (int32_t i = 0; i < en->n_sched; i++) {
        struct seq *s = en->sched[i];
        if (s->out_row < 0) continue;
        bool on = s->gm && en->q_mask;
        sampler_set_mask(s->smp,
                         on ? en->q_mask + (size_t)s->out_row * (size_t)en->mask_words : NULL);
        if (s->gm && !on && !s->g_err && (s->g_err = malloc(sizeof *s->g_err)))
            err_set(s->g_err, SMELT_ERR_NOMEM, "grammar: out of memory for the token masks");
    }
    return any && en->q_mask;
}

smelt_status engine_grammar(struct engine *en, enum gram_kind kind, const char *text, size_t len,
                            bool control, struct gram **out, struct err *e) {
    *out = NULL;
    smelt_status st = SMELT_OK;
    pthread_mutex_lock(&en->gmu);
    if (!en->gcache[control]) {
        struct gram_vocab *v = NULL;
        st = gram_vocab_new(&v, en->tok, control ? GRAM_VOCAB_CONTROL : 0, e);
        if (st == SMELT_OK && gram_vocab_n(v) > en->n_vocab)
            st = err_set(e, SMELT_ERR_UNSUPPORTED,
                         "grammar: the tokenizer has %d tokens, more than "
                         "the model's %d logits",
                         gram_vocab_n(v), en->n_vocab);
        if (st == SMELT_OK)
            st = gram_cache_new(&en->gcache[control], v, ENGINE_GRAMMAR_CACHE,
                                ENGINE_GRAMMAR_CACHE_BYTES, e);
        if (st == SMELT_OK)
            en->gvocab[control] = v;
        else
            gram_vocab_free(v);
    }
    struct gram_cache *c = en->gcache[control];
    pthread_mutex_unlock(&en->gmu);
    return st == SMELT_OK ? gram_cache_get(c, kind, text, len, out, NULL, e) : st;
}

/* Handles a freshly sampled token of s. */
static void on_token(struct engine *en, struct seq *s, const struct sample_result *sr) {
    struct engine_req *r = s->req;
    int32_t t = sr->token;
    double now = clock_now();
    pthread_mutex_lock(&en->smu);
    if (s->n_gen == 0) hist_add(&en->stats.ttft, now - r->t_submit);
    else hist_add(&en->stats.itl, now - s->t_last);
    en->stats.generated_tokens++;
    pthread_mutex_unlock(&en->smu);
    s->t_last = now;
    s->n_gen++;
    struct err e;
    if (s->gm || s->g_wait) {
        smelt_status gst = grammar_take(en, s, t, &e);
        en->stats_gsec += clock_now() - now;
        if (gst != SMELT_OK) {
            finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, e.msg);
            return;
        }
    }
    /* under a grammar, end-of-generation was allowed only where it is complete: it ends */
    if ((tok_is_eog(en->tok, t) && (!r->p.ignore_eos || s->gm)) || is_stop_id(r, t)) {
        finish_seq(en, s, ENGINE_STOP, -1, NULL, false, 0, NULL);
        return;
    }
    if (!array_grow((void **)&s->tok, &s->cap_tok, (size_t)s->n_tok + 1, sizeof *s->tok)) {
        finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, "out of memory");
        return;
    }
    s->tok[s->n_tok++] = t;
    if (s->history) sampler_accept(s->smp, t, true);
    if (tok_detok_push(&s->dt, t, &s->held, &e) != SMELT_OK) {
        finish_seq(en, s, ENGINE_ERROR, t, sr, false, 0, e.msg);
        return;
    }
    int hit = release_text(en, s, false);
    if (hit) {
        finish_seq(en, s, ENGINE_STOP, t, sr, true, hit, NULL);
        return;
    }
    bool at_max = r->p.max_tokens >= 0 && s->n_gen >= r->p.max_tokens;
    bool ended = s->gm && gram_matcher_ended(s->gm); /* complete, and nothing can follow */
    if (at_max || ended || s->n_tok >= en->cfg.n_ctx) {
        /* flush the held text together with what this token released */
        size_t n0 = en->emit.n;
        tok_detok_flush(&s->dt, &s->held, &e);
        if (s->held.n && array_grow((void **)&en->emit.p, &en->emit.cap, n0 + s->held.n + 1, 1)) {
            memcpy(en->emit.p + n0, s->held.p, s->held.n);
            en->emit.n = n0 + s->held.n;
        }
        s->held.n = 0;
        finish_seq(en, s, ended ? ENGINE_STOP : ENGINE_LENGTH, t, sr, true, 0, NULL);
        return;
    }
    struct engine_event ev = {.choice = s->choice, .token = t, .logprob = sr->logprob};
    push_event(en, r, &ev, en->emit.p, en->emit.n, sr, NULL);
}

/* The log-probability of token `target` in row (log-softmax of the raw logits) and the
 * k most likely tokens (descending). */
static float row_logprob(const float *row, int32_t nv, int32_t target, int32_t k,
                         struct sample_token_logprob *top) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        if (row[i] > mx) mx = row[i];
    double sum = 0;
    int32_t n_top = 0;
    for (int32_t i = 0; i < nv; i++) {
        float v = row[i];
        sum += exp((double)(v - mx));
        if (k <= 0 || !(v > -INFINITY)) continue;
        /* insertion into the small sorted top list (k <= 20) */
        if (n_top == k && !(v > top[k - 1].logprob)) continue;
        int32_t j = n_top < k ? n_top++ : k - 1;
        while (j > 0 && top[j - 1].logprob < v) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (struct sample_token_logprob){i, v};
    }
    float lse = mx + (float)log(sum);
    for (int32_t j = 0; j < n_top; j++) top[j].logprob -= lse;
    for (int32_t j = n_top; j < k; j++) top[j] = (struct sample_token_logprob){-1, -INFINITY};
    return row[target] - lse;
}

/* Pushes the prompt-logprob events of s's rows this step. */
static void prompt_logprobs(struct engine *en, struct seq *s) {
    int32_t k = s->req->p.prompt_logprobs;
    if (k > SAMPLE_MAX_LOGPROBS) k = SAMPLE_MAX_LOGPROBS;
    int32_t out = s->out_first;
    for (int32_t r = 0; r < s->rows; r++) {
        int32_t pos = s->pos0 + r;
        if (pos >= s->n_prompt - 1) break;
        const float *row = en->logits + (size_t)(out++) * (size_t)en->n_vocab;
        if (pos < s->plp_done) continue; /* reported before a preemption */
        s->plp_done = pos + 1;
        struct sample_result sr = {0};
        sr.token = s->tok[pos + 1];
        sr.logprob = row_logprob(row, en->n_vocab, sr.token, k, sr.top);
        sr.n_top = k;
        struct engine_event ev = {.choice = s->choice, .token = sr.token, .logprob = sr.logprob,
                                  .prompt = 1};
        push_event(en, s->req, &ev, NULL, 0, &sr, NULL);
    }
}

/* Samples one row: from its summary (model path), from its full row (a fallback the
 * summary asked for, or a fake forward's rows). */
static void sample_one(struct engine *en, struct sample_job *j) {
    struct seq *s = j->s;
    int32_t r = s->out_row;
    const float *row = j->full ? en->logits + (size_t)r * (size_t)en->n_vocab : NULL;
    struct err e;
    if (en->cfg.forward)
        j->st = sampler_sample(s->smp, row, &j->r, &e);
    else
        j->st = sampler_finish(s->smp, &en->q_sum[r], en->q_cand + (size_t)r * TOPK_MAX,
                               en->q_raw + en->q_rows[r].adj_off, row, &j->r, &e);
    if (j->st != SMELT_OK) snprintf(j->msg, sizeof j->msg, "%s", e.msg);
}

/* Samples the picked jobs from the shared counter until none are left. */
static void sample_some(struct engine *en) {
    for (;;) {
        int i = atomic_fetch_add(&en->pool_s.next, 1);
        if (i >= en->n_pick) return;
        sample_one(en, &en->jobs[en->pick[i]]);
    }
}

static void *sample_worker(void *arg) {
    struct engine *en = arg;
    struct sample_pool *p = &en->pool_s;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        sample_some(en);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Samples the jobs en->pick[0 .. n_pick): in parallel when they work on full rows and
 * those are many and large (from summaries, a row is O(TOPK_MAX) work). */
static void sample_jobs(struct engine *en, bool full) {
    struct sample_pool *p = &en->pool_s;
    atomic_store(&p->next, 0);
    bool par = full && en->pool_started && en->n_pick > 1 &&
               (int64_t)en->n_pick * en->n_vocab >= ((int64_t)1 << 20);
    if (!par) {
        sample_some(en);
        return;
    }
    en->stats_parallel++;
    pthread_mutex_lock(&p->mu);
    p->gen++;
    p->busy = p->n_threads;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    sample_some(en);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void pool_start(struct engine *en) {
    struct sample_pool *p = &en->pool_s;
    int n = en->cfg.sample_threads;
    if (n <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n = nc > 2 ? (int)(nc / 2) : 1;
        if (n > 8) n = 8;
    }
    p->n_threads = n - 1; /* the engine thread samples too */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    p->inited = true;
    if (p->n_threads <= 0) return;
    p->th = calloc((size_t)p->n_threads, sizeof *p->th);
    if (!p->th) return;
    int started = 0;
    for (; started < p->n_threads; started++)
        if (pthread_create(&p->th[started], NULL, sample_worker, en) != 0) break;
    p->n_threads = started;
    en->pool_started = started > 0;
}

static void pool_stop(struct engine *en) {
    struct sample_pool *p = &en->pool_s;
    if (p->th) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_threads; i++) pthread_join(p->th[i], NULL);
        free(p->th);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
}

/* en->logits, allocated on first need (a model forward brings full rows only for prompt
 * logprobs and sampling fallbacks). */
static bool have_logits(struct engine *en) {
    if (!en->logits) en->logits = malloc((size_t)en->max_out * (size_t)en->n_vocab * sizeof(float));
    return en->logits != NULL;
}

/* Brings output rows [first, first + count) of the step into en->logits. */
static smelt_status fetch_rows(struct engine *en, int32_t first, int32_t count, struct err *e) {
    if (en->cfg.forward) return SMELT_OK; /* a fake forward wrote every row */
    if (!have_logits(en)) return err_set(e, SMELT_ERR_NOMEM, "engine: out of memory for logit rows");
    return model_fetch_rows(en->m, first, count, en->logits + (size_t)first * (size_t)en->n_vocab, e);
}

/* Runs the step's forward: a fake one writes full rows; the model returns a summary per
 * output row (engine/sample.h), with the samplers' requests and adjustments uploaded
 * beside the batch. */
static smelt_status run_forward(struct engine *en, const struct batch *b, struct err *e) {
    bool masks = bind_masks(en);
    if (en->cfg.forward) {
        smelt_status st = en->cfg.forward(en->cfg.forward_ctx, b, en->logits, e);
        if (st == SMELT_OK && masks) fill_masks(en);
        return st;
    }
    if (en->pooling != POOL_NONE) /* (an embedding model's requests carry no grammar) */
        return model_step_hidden(en->m, en->kvs, b, en->hidden, NULL, e);
    int32_t n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) n_out += b->logits[i] != 0;
    memset(en->q_rows, 0, (size_t)n_out * sizeof *en->q_rows); /* k = 0: no summary */
    int32_t cap = model_adj_cap(n_out), n_adj = 0;
    for (int32_t i = 0; i < en->n_sched; i++) {
        struct seq *s = en->sched[i];
        if (s->out_row < 0) continue;
        /* a speculating sequence's row j is the request after drafts 1..j: the same unless
         * penalties read the history */
        int32_t nd = s->sp.n_draft;
        for (int32_t j = 0; j <= nd; j++) {
            struct topk_row *row = &en->q_rows[s->out_row + j];
            if (j > 0 && !s->history) {
                *row = en->q_rows[s->out_row];
                continue;
            }
            int32_t got = sampler_request(s->smp, row, en->q_adj + n_adj, n_adj, cap - n_adj);
            if (got > 0) n_adj += got; /* < 0 (out of memory): sampler_finish reports it */
            if (j < nd) sampler_accept(s->smp, s->sp.draft[j], true);
        }
        if (nd > 0 && s->history) sampler_unaccept(s->smp, nd);
    }
    struct model_sample ms = {.n_rows = n_out,
                              .rows = en->q_rows,
                              .adj = en->q_adj,
                              .n_adj = n_adj,
                              .sum = en->q_sum,
                              .cand = en->q_cand,
                              .adj_raw = en->q_raw,
                              .mask = masks ? en->q_mask : NULL,
                              .fill_masks = fill_masks,
                              .fill_ctx = en};
    if (en->mtp_hid) /* the MTP head reads every row's final hidden state (observe_mtp) */
        return model_step_mtp(en->m, en->kvs, b, NULL, &ms, NULL, NULL, en->mtp_hid, e);
    return model_step(en->m, en->kvs, b, NULL, &ms, NULL, e);
}

/* SPEC_MTP, after a step's tokens are settled (sampled, verified, rolled back) and before
 * its snapshots are restored: each sequence's kept rows of the step, positions [pos0,
 * n_done), whose next tokens are all known now (the prompt's, or the ones just sampled and
 * accepted), go to the MTP head with their hidden states: it computes its K/V there and
 * predicts each sequence's next draft (spec_observe). A row rolled back (a rejected draft, a
 * recurrent state's rows after its snapshot) is observed when it is computed again. */
static void observe_mtp(struct engine *en) {
    int32_t n = 0;
    const size_t E = (size_t)en->m->hp.n_embd;
    for (int32_t i = 0; i < en->n_sched; i++) {
        struct seq *s = en->sched[i];
        if (s->finish || s->pool || s->n_done <= s->pos0 || s->n_done >= s->n_tok) continue;
        en->spec_obs[n++] = (struct spec_obs){&s->sp, s->pos0, s->n_done - s->pos0,
                                              en->mtp_hid + (size_t)s->b_row0 * E, s->tok + s->pos0 + 1,
                                              kv_seq_view(&s->kv), s->req->p.sp.temperature};
    }
    struct err e;
    err_clear(&e);
    if (n > 0 && spec_observe(en->spec, en->spec_obs, n, &e) != SMELT_OK)
        log_warn("engine: the MTP head's step failed (the sequences go on without drafts): %s", e.msg);
}

/* Adds s's output rows of the step (en->hidden, from its first output row) to its sums. */
static void pool_rows(struct engine *en, struct seq *s) {
    const int32_t d = en->n_embd;
    for (int32_t r = 0; r < s->n_rows_out; r++) {
        const float *h = en->hidden + (size_t)(s->out_first + r) * (size_t)d;
        for (int32_t i = 0; i < d; i++) s->pool[i] += h[i];
    }
}

/* s's input is done: it ends with its pooled vector (the mean of its rows, or the one row
 * cls / last pooling took). */
static void finish_embedding(struct engine *en, struct seq *s) {
    const double inv = en->pooling == POOL_MEAN ? 1.0 / s->n_tok : 1.0;
    for (int32_t i = 0; i < en->n_embd; i++) en->emit_embd[i] = (float)(s->pool[i] * inv);
    struct engine_event ev = {.choice = s->choice, .token = -1, .finish = ENGINE_STOP,
                              .n_prompt = s->n_prompt, .n_cached = s->n_cached,
                              .n_embd = en->n_embd};
    s->finish = ENGINE_STOP;
    push_event(en, s->req, &ev, NULL, 0, NULL, NULL);
    pthread_mutex_lock(&en->smu);
    en->stats.requests_finished[ENGINE_STOP]++;
    pthread_mutex_unlock(&en->smu);
}

/* Shows the step just scheduled (n rows) to the observer. */
static void observe(struct engine *en, int32_t n) {
    for (int32_t i = 0; i < en->n_running; i++) {
        const struct seq *s = en->running[i];
        en->obs_seqs[i] = (struct engine_step_seq){s->arrival, s->n_done, s->n_tok, s->rows};
    }
    struct engine_step_info info = {n,           en->obs_budget,    en->n_running,
                                    en->n_waiting, en->obs_seqs, en->obs_preempted,
                                    en->n_obs_preempted};
    en->cfg.on_step(en->cfg.on_step_ctx, &info);
}

/* Row j of a speculating sequence for spec_verify. */
struct spec_src {
    struct engine *en;
    struct seq *s;
};

static void spec_get(void *ctx, int32_t j, const struct topk_row **req,
                     const struct topk_summary **sum, const struct topk_cand **cand,
                     const float **adj_raw) {
    struct spec_src *c = ctx;
    struct engine *en = c->en;
    int32_t r = c->s->out_row + j;
    *sum = NULL;
    *cand = NULL;
    *adj_raw = NULL;
    *req = NULL;
    if (c->s->gm && en->q_mask) /* (as bind_masks set row 0's) */
        sampler_set_mask(c->s->smp, en->q_mask + (size_t)r * (size_t)en->mask_words);
    if (en->cfg.forward) return; /* full rows: the summary is made from them */
    *req = &en->q_rows[r];
    *sum = &en->q_sum[r];
    *cand = en->q_cand + (size_t)r * TOPK_MAX;
    *adj_raw = en->q_raw + en->q_rows[r].adj_off;
}

static const float *spec_full(void *ctx, int32_t j, struct err *e) {
    struct spec_src *c = ctx;
    int32_t r = c->s->out_row + j;
    if (fetch_rows(c->en, r, 1, e) != SMELT_OK) return NULL;
    if (!c->en->cfg.forward) c->en->stats_full_rows++;
    return c->en->logits + (size_t)r * (size_t)c->en->n_vocab;
}

/* Verifies s's drafts, emits the tokens, and keeps the K/V of the accepted positions. */
static void verify_spec(struct engine *en, struct seq *s) {
    struct spec_src c = {en, s};
    struct spec_rows src = {spec_get, spec_full, &c};
    int32_t nd = s->sp.n_draft, n = 0, n_full = 0;
    struct err e;
    err_clear(&e);
    smelt_status st = spec_verify(s->smp, s->history, &s->sp, &src, en->spec_out, &n, &n_full, &e);
    if (st != SMELT_OK || n < 1) {
        spec_commit(en->spec, &s->sp, 0, s->n_done);
        finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0,
                   e.msg[0] ? e.msg : "speculation: no token");
        return;
    }
    int32_t acc = n - 1, n_keep = s->n_done + 1 + acc; /* the last token and the accepted */
    pthread_mutex_lock(&en->smu);
    en->stats.spec_steps++;
    en->stats.spec_proposed += (uint64_t)nd;
    en->stats.spec_accepted += (uint64_t)acc;
    pthread_mutex_unlock(&en->smu);
    spec_commit(en->spec, &s->sp, acc, n_keep);
    for (int32_t i = 0; i < n && !s->finish; i++) on_token(en, s, &en->spec_out[i]);
    if (n_keep > s->n_tok) n_keep = s->n_tok; /* it finished before the last ones */
    if (!s->finish && acc < nd) {
        int32_t from = n_keep;
        kv_seq_rollback(&en->pool, &s->kv, n_keep, &from);
        n_keep = from;
    }
    s->n_done = n_keep;
    register_blocks(en, s);
}

/* Copies the snapshots that rollbacks asked for into the live state slots (after every
 * fetch of the step's logits: a copy is a step of its own on the backend). */
static void restore_states(struct engine *en) {
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        if (s->kv.restore < 0) continue;
        struct err e;
        int32_t dst = s->kv.slot, src = s->kv.restore;
        s->kv.restore = -1;
        smelt_status st = en->cfg.forward ? en->cfg.state_copy(en->cfg.forward_ctx, dst, src, &e)
                                          : model_state_copy(en->m, en->kvs, dst, src, &e);
        if (st != SMELT_OK) finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, e.msg);
    }
}

/* One step. Returns the number of rows it ran. */
static int32_t step(struct engine *en) {
    reap_cancelled(en);
    int32_t n = schedule(en);
    if (en->cfg.on_step && (n > 0 || en->n_obs_preempted > 0)) observe(en, n);
    if (n == 0) return 0;
    double t0 = clock_now();
    struct batch b = {n, en->b_tok, en->b_pos, en->b_seq, en->b_logits, en->n_sched, en->b_seqs};
    struct err e;
    err_clear(&e);
    smelt_status st = run_forward(en, &b, &e);
    if (st != SMELT_OK) log_error("engine: step of %d rows failed: %s", n, e.msg);
    en->n_jobs = 0;
    for (int32_t i = 0; i < en->n_sched; i++) {
        struct seq *s = en->sched[i];
        if (st != SMELT_OK) {
            finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, e.msg);
            continue;
        }
        if (s->sp.n_draft > 0 && s->g_err) {
            spec_commit(en->spec, &s->sp, 0, s->n_done);
            finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, s->g_err->msg);
            continue;
        }
        if (s->sp.n_draft > 0) { /* its positions are settled by the verification */
            struct sample_job *j = &en->jobs[en->n_jobs++];
            j->s = s;
            j->full = en->cfg.forward != NULL;
            j->spec = true;
            continue;
        }
        if (s->plp && s->pos0 < s->n_prompt - 1) {
            int32_t nr = s->n_prompt - 1 - s->pos0;
            if (nr > s->rows) nr = s->rows;
            struct err fe;
            if (fetch_rows(en, s->out_first, nr, &fe) != SMELT_OK) {
                finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, fe.msg);
                continue;
            }
            prompt_logprobs(en, s);
        }
        if (s->pool) pool_rows(en, s);
        s->n_done += s->rows;
        register_blocks(en, s);
        if (s->choice == 0 && s->n_done >= s->n_prompt) s->req->prompt_ready = true;
        if (s->out_row >= 0 && s->g_err) {
            finish_seq(en, s, ENGINE_ERROR, -1, NULL, false, 0, s->g_err->msg);
            continue;
        }
        if (s->pool && s->n_done == s->n_tok) finish_embedding(en, s);
        if (s->out_row >= 0) {
            struct sample_job *j = &en->jobs[en->n_jobs++];
            j->s = s;
            j->full = en->cfg.forward != NULL;
            j->spec = false;
        }
    }
    /* Pass 1 samples every row: from its summary (cheap, on this thread), or from the
     * full rows of a fake forward. Rows whose summary was not enough get their full row
     * and pass 2 finishes them. */
    en->n_pick = 0;
    for (int32_t i = 0; i < en->n_jobs; i++)
        if (!en->jobs[i].spec) en->pick[en->n_pick++] = i;
    sample_jobs(en, en->cfg.forward != NULL);
    en->n_pick = 0;
    for (int32_t i = 0; i < en->n_jobs; i++) {
        struct sample_job *j = &en->jobs[i];
        if (j->spec || j->st != SMELT_OK || j->r.token != SAMPLE_NEED_ROW) continue;
        j->full = true;
        struct err fe;
        smelt_status fst = fetch_rows(en, j->s->out_row, 1, &fe);
        if (fst != SMELT_OK) {
            j->st = fst;
            snprintf(j->msg, sizeof j->msg, "%s", fe.msg);
            continue;
        }
        en->pick[en->n_pick++] = i;
    }
    if (en->n_pick) {
        en->stats_full_rows += (uint64_t)en->n_pick;
        sample_jobs(en, true);
    }
    for (int32_t i = 0; i < en->n_jobs; i++) {
        struct sample_job *j = &en->jobs[i];
        if (j->spec) verify_spec(en, j->s);
        else if (j->st != SMELT_OK) finish_seq(en, j->s, ENGINE_ERROR, -1, NULL, false, 0, j->msg);
        else if (j->r.token < 0)
            finish_seq(en, j->s, ENGINE_ERROR, -1, NULL, false, 0, "sampler: no token");
        else on_token(en, j->s, &j->r);
    }
    if (en->mtp_hid && st == SMELT_OK) observe_mtp(en);
    restore_states(en);
    /* finished sequences leave */
    int32_t w = 0;
    for (int32_t i = 0; i < en->n_running; i++) {
        struct seq *s = en->running[i];
        if (s->finish) {
            if (s->choice == 0) s->req->prompt_ready = true;
            register_blocks(en, s);
            seq_retire(en, s);
        } else {
            en->running[w++] = s;
        }
    }
    en->n_running = w;
    double dt = clock_now() - t0;
    fit_add(&en->fit, n, dt);
    struct spec_stats ss;
    spec_get_stats(en->spec, &ss);
    pthread_mutex_lock(&en->smu);
    en->stats.spec_draft_steps = ss.draft_steps;
    en->stats.spec_draft_seconds = ss.draft_seconds;
    en->stats.steps++;
    en->stats.parallel_sample_steps = en->stats_parallel;
    en->stats.sample_full_rows = en->stats_full_rows;
    en->stats.grammar_rows = en->stats_grows;
    en->stats.grammar_seconds = en->stats_gsec;
    en->stats.step_rows += (uint64_t)n;
    en->stats.step_seconds += dt;
    pthread_mutex_unlock(&en->smu);
    return n;
}

static void publish_state(struct engine *en) {
    struct kv_stats ks;
    kv_pool_stats(&en->pool, &ks);
    pthread_mutex_lock(&en->smu);
    en->stats.running = en->n_running;
    en->stats.waiting = en->n_waiting;
    en->stats.kv = ks;
    pthread_mutex_unlock(&en->smu);
}

static void *engine_main(void *arg) {
    struct engine *en = arg;
    for (;;) {
        pthread_mutex_lock(&en->qmu);
        while (!en->stop && !en->in_head && en->n_running == 0 && en->n_waiting == 0)
            pthread_cond_wait(&en->qcv, &en->qmu);
        struct engine_req *list = en->in_head;
        en->in_head = en->in_tail = NULL;
        bool stop = en->stop;
        pthread_mutex_unlock(&en->qmu);
        intake(en, list);
        if (stop) break;
        int32_t rows = step(en);
        publish_state(en);
        if (rows == 0 && (en->n_running > 0 || en->n_waiting > 0)) {
            /* nothing could run (should not happen): do not spin */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    /* shutdown: everything still in flight ends as cancelled */
    atomic_store(&en->cancel_all, true);
    reap_cancelled(en);
    publish_state(en);
    return NULL;
}

void engine_config_defaults(struct engine_config *c) {
    if (c->max_seqs <= 0) c->max_seqs = DEFAULT_MAX_SEQS;
    if (c->max_batch_tokens <= 0) c->max_batch_tokens = DEFAULT_BATCH_TOKENS;
    if (c->max_batch_tokens < c->max_seqs) c->max_batch_tokens = c->max_seqs;
    if (c->max_waiting <= 0) c->max_waiting = DEFAULT_MAX_WAITING;
    if (c->block_size <= 0) c->block_size = DEFAULT_BLOCK;
    if (c->spec.kind != SPEC_OFF) spec_config_defaults(&c->spec);
}

int32_t engine_max_out_rows(const struct engine_config *c) {
    int32_t spec = 0;
    if (c->spec.kind != SPEC_OFF) {
        struct spec_config sc = c->spec;
        spec_config_defaults(&sc);
        spec = (sc.max_batch < c->max_seqs ? sc.max_batch : c->max_seqs) * sc.k_max;
    }
    return c->max_seqs + ENGINE_PLP_ROWS + spec;
}

smelt_status engine_new(struct engine **out, const struct engine_config *cfg0, struct model *m,
                        struct kv_store *kv, const struct tok *tok, struct err *e) {
    *out = NULL;
    struct engine_config cfg = *cfg0;
    if (cfg.block_size <= 0 && kv) cfg.block_size = kv->block_size;
    engine_config_defaults(&cfg);
    if (cfg.max_seqs > 1 << 16 || cfg.max_batch_tokens > 1 << 20)
        return err_set(e, SMELT_ERR_INVALID, "engine: max_seqs %d or max_batch_tokens %d too large",
                       cfg.max_seqs, cfg.max_batch_tokens);
    if (!tok) return err_set(e, SMELT_ERR_INVALID, "engine: no tokenizer");
    if (!m && !cfg.forward) return err_set(e, SMELT_ERR_INVALID, "engine: no model");
    if (kv && (kv->n_blocks < cfg.n_blocks || kv->block_size != cfg.block_size))
        return err_set(e, SMELT_ERR_INVALID, "engine: KV store has %d blocks of %d, need %d of %d",
                       kv->n_blocks, kv->block_size, cfg.n_blocks, cfg.block_size);
    int32_t n_vocab = m ? m->hp.n_vocab : cfg.n_vocab;
    if (n_vocab <= 0) return err_set(e, SMELT_ERR_INVALID, "engine: vocabulary size unknown");
    int64_t pool_tokens = (int64_t)cfg.n_blocks * cfg.block_size;
    int32_t n_ctx_model = m ? m->hp.n_ctx_train : 0;
    if (cfg.n_ctx <= 0) cfg.n_ctx = n_ctx_model > 0 ? n_ctx_model : (int32_t)pool_tokens;
    if (cfg.n_ctx > pool_tokens) cfg.n_ctx = (int32_t)pool_tokens;
    cfg.n_vocab = n_vocab;

    struct engine *en = calloc(1, sizeof *en);
    if (!en) return err_set(e, SMELT_ERR_NOMEM, "engine: out of memory");
    en->cfg = cfg;
    en->m = m;
    en->kvs = kv;
    en->tok = tok;
    en->n_vocab = n_vocab;
    pthread_mutex_init(&en->qmu, NULL);
    pthread_cond_init(&en->qcv, NULL);
    pthread_mutex_init(&en->smu, NULL);
    pthread_mutex_init(&en->gmu, NULL);
    en->mask_words = topk_mask_words(n_vocab);
    atomic_init(&en->cancel_all, false);
    atomic_init(&en->in_flight, 0);
    if (m && !cfg.forward && m->hp.pooling != POOL_NONE) {
        en->pooling = m->hp.pooling;
        en->bidir = !model_is_causal(m);
        en->n_embd = m->hp.n_embd;
        /* a bidirectional model's K/V depend on the tokens after them: no block is reusable */
        if (en->bidir) en->cfg.no_prefix_cache = cfg.no_prefix_cache = true;
    }
    smelt_status st = kv_pool_init(&en->pool, cfg.n_blocks, cfg.block_size, e);
    if (st == SMELT_OK && !cfg.no_prefix_cache) st = kv_prefix_enable(&en->pool, e);
    if (m && !cfg.forward) /* a model's slots are its KV store's */
        en->cfg.n_slots = cfg.n_slots = kv && model_is_recurrent(m) ? kv->n_slots : 0;
    if (st == SMELT_OK && cfg.n_slots > 0) {
        if (cfg.n_slots < cfg.max_seqs || (cfg.forward && !cfg.state_copy))
            st = err_set(e, SMELT_ERR_INVALID, "engine: %d recurrent state slots for %d sequences "
                         "(or no state copy)", cfg.n_slots, cfg.max_seqs);
        else
            st = kv_slots_enable(&en->pool, cfg.n_slots, cfg.max_seqs, e);
    }
    size_t nb = (size_t)cfg.max_batch_tokens, ns = (size_t)cfg.max_seqs;
    en->max_out = engine_max_out_rows(&cfg);
    size_t nlog, n_adj = m || !cfg.forward ? (size_t)model_adj_cap(en->max_out) : 0;
    if (st == SMELT_OK && ckd_mul_size(&nlog, (size_t)en->max_out, (size_t)n_vocab * sizeof(float)))
        st = err_set(e, SMELT_ERR_NOMEM, "engine: logits buffer too large");
    if (st == SMELT_OK) {
        en->running = calloc(ns, sizeof *en->running);
        en->sched = calloc(ns, sizeof *en->sched);
        en->b_seqs = calloc(ns, sizeof *en->b_seqs);
        en->b_tok = malloc(nb * sizeof *en->b_tok);
        en->b_pos = malloc(nb * sizeof *en->b_pos);
        en->b_seq = malloc(nb * sizeof *en->b_seq);
        en->b_logits = malloc(nb);
        en->jobs = calloc(ns, sizeof *en->jobs);
        en->pick = calloc(ns, sizeof *en->pick);
        bool ok = en->jobs && en->pick && en->running && en->sched && en->b_seqs && en->b_tok &&
                  en->b_pos && en->b_seq && en->b_logits;
        if (cfg.on_step) {
            en->obs_seqs = calloc(ns, sizeof *en->obs_seqs);
            en->obs_preempted = calloc(ns, sizeof *en->obs_preempted);
            ok = ok && en->obs_seqs && en->obs_preempted;
        }
        if (cfg.forward) { /* a fake forward writes full rows (and keeps state in them) */
            en->logits = malloc(nlog);
            ok = ok && en->logits;
        } else if (en->pooling != POOL_NONE) { /* hidden rows, not logits */
            en->hidden = malloc(nb * (size_t)en->n_embd * sizeof *en->hidden);
            en->emit_embd = malloc((size_t)en->n_embd * sizeof *en->emit_embd);
            ok = ok && en->hidden && en->emit_embd;
        } else {
            en->q_rows = calloc((size_t)en->max_out, sizeof *en->q_rows);
            en->q_sum = calloc((size_t)en->max_out, sizeof *en->q_sum);
            en->q_cand = calloc((size_t)en->max_out * TOPK_MAX, sizeof *en->q_cand);
            en->q_adj = calloc(n_adj, sizeof *en->q_adj);
            en->q_raw = calloc(n_adj, sizeof *en->q_raw);
            ok = ok && en->q_rows && en->q_sum && en->q_cand && en->q_adj && en->q_raw;
        }
        if (!ok)
            st = err_set(e, SMELT_ERR_NOMEM, "engine: out of memory (%d sequences, %d tokens)",
                         cfg.max_seqs, cfg.max_batch_tokens);
    }
    if (st == SMELT_OK && cfg.spec.kind == SPEC_MTP) {
        if (!m)
            st = err_set(e, SMELT_ERR_INVALID, "--spec mtp needs a model (not a fake forward)");
        else {
            en->mtp_hid = malloc((size_t)cfg.max_batch_tokens * (size_t)m->hp.n_embd * sizeof(float));
            en->spec_obs = calloc(ns, sizeof *en->spec_obs);
            if (!en->mtp_hid || !en->spec_obs) st = err_set(e, SMELT_ERR_NOMEM, "engine: out of memory");
        }
    }
    if (st == SMELT_OK && cfg.spec.kind != SPEC_OFF) {
        st = spec_new(&en->spec, &cfg.spec, m, n_vocab, cfg.n_blocks, cfg.block_size,
                      cfg.max_batch_tokens, cfg.max_seqs, e);
        en->spec_jobs = calloc(ns, sizeof *en->spec_jobs);
        en->spec_out = calloc(SPEC_K_MAX + 1, sizeof *en->spec_out);
        if (st == SMELT_OK && (!en->spec_jobs || !en->spec_out))
            st = err_set(e, SMELT_ERR_NOMEM, "engine: out of memory");
    }
    if (st == SMELT_OK) {
        pool_start(en);
        publish_state(en); /* /metrics shows the pool before the first request (published
                            * here, not in the thread: a scrape may come before it runs) */
        if (pthread_create(&en->thread, NULL, engine_main, en) != 0)
            st = err_set(e, SMELT_ERR_INTERNAL, "engine: cannot start the engine thread");
        else en->thread_started = true;
    }
    if (st != SMELT_OK) {
        engine_free(en);
        return st;
    }
    *out = en;
    return SMELT_OK;
}

void engine_free(struct engine *en) {
    if (!en) return;
    if (en->thread_started) {
        pthread_mutex_lock(&en->qmu);
        en->stop = true;
        en->closed = true;
        pthread_cond_signal(&en->qcv);
        pthread_mutex_unlock(&en->qmu);
        pthread_join(en->thread, NULL);
    }
    if (en->pool_s.inited) pool_stop(en);
    kv_pool_free(&en->pool);
    spec_free(en->spec);
    free(en->spec_jobs);
    free(en->spec_out);
    free(en->jobs);
    free(en->running);
    free(en->waiting);
    free(en->sched);
    free(en->b_seqs);
    free(en->b_tok);
    free(en->b_pos);
    free(en->b_seq);
    free(en->b_logits);
    free(en->logits);
    free(en->pick);
    free(en->obs_seqs);
    free(en->obs_preempted);
    free(en->q_rows);
    free(en->q_sum);
    free(en->q_cand);
    free(en->q_adj);
    free(en->q_raw);
    free(en->q_mask);
    for (int i = 0; i < 2; i++) {
        gram_cache_free(en->gcache[i]);
        gram_vocab_free(en->gvocab[i]);
    }
    pthread_mutex_destroy(&en->gmu);
    free(en->hidden);
    free(en->mtp_hid);
    free(en->spec_obs);
    free(en->emit_embd);
    tok_buf_free(&en->emit);
    pthread_mutex_destroy(&en->qmu);
    pthread_cond_destroy(&en->qcv);
    pthread_mutex_destroy(&en->smu);
    free(en);
}

void engine_drain(struct engine *en) {
    pthread_mutex_lock(&en->qmu);
    en->closed = true;
    pthread_mutex_unlock(&en->qmu);
}

void engine_cancel_all(struct engine *en) {
    atomic_store(&en->cancel_all, true);
    pthread_mutex_lock(&en->qmu);
    pthread_cond_signal(&en->qcv);
    pthread_mutex_unlock(&en->qmu);
}

/* Builds the sequences of r (on the caller's thread). */
static smelt_status make_seqs(struct engine *en, struct engine_req *r, struct err *e) {
    r->seqs = calloc((size_t)r->p.n, sizeof *r->seqs);
    if (!r->seqs) return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
    int32_t room = en->cfg.n_ctx;
    if (r->p.max_tokens >= 0 && (int64_t)r->n_prompt + r->p.max_tokens < room)
        room = r->n_prompt + r->p.max_tokens;
    int32_t cap = r->n_prompt + 16 < room ? r->n_prompt + 16 : room;
    for (int32_t i = 0; i < r->p.n; i++) {
        struct seq *s = calloc(1, sizeof *s);
        if (!s) return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
        r->seqs[i] = s;
        s->req = r;
        s->choice = i;
        s->cap_tok = (size_t)cap;
        s->tok = malloc((size_t)cap * sizeof *s->tok);
        if (!s->tok) return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
        memcpy(s->tok, r->prompt, (size_t)r->n_prompt * sizeof *s->tok);
        s->n_tok = s->n_prompt = r->n_prompt;
        s->out_row = -1;
        s->plp = i == 0 && r->p.prompt_logprobs >= 0;
        kv_seq_init(&s->kv);
        if (r->p.embed) { /* nothing to sample: the sums of its pooled rows instead */
            s->pool = calloc((size_t)en->n_embd, sizeof *s->pool);
            if (!s->pool) return err_set(e, SMELT_ERR_NOMEM, "request: out of memory");
            tok_detok_init(&s->dt, en->tok, 0);
            continue;
        }
        struct sample_params sp = r->p.sp;
        sp.seed = r->p.sp.seed + (uint64_t)i;
        spec_seq_init(&s->sp, sp.seed);
        s->sp.off = r->p.no_spec;
        s->sp.point_mass = r->p.spec_point_mass;
        smelt_status st = sampler_new(&s->smp, &sp, en->n_vocab, e);
        if (st != SMELT_OK) return st;
        s->history = sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f ||
                     sp.frequency_penalty != 0.0f;
        if (s->history)
            for (int32_t k = 0; k < r->n_prompt; k++) sampler_accept(s->smp, r->prompt[k], false);
        tok_detok_init(&s->dt, en->tok, r->p.decode_special ? TOK_DECODE_SPECIAL : 0);
        const struct engine_grammar *g = &r->p.grammar;
        if (g->g && g->trigger_len) {
            s->g_wait = true;
        } else if (g->g) {
            st = gram_matcher_new(&s->gm, g->g, ENGINE_GRAMMAR_ROLLBACK, e);
            if (st == SMELT_OK && g->prefix_len)
                st = gram_matcher_accept_bytes(s->gm, g->prefix, g->prefix_len, e);
            if (st != SMELT_OK)
                return err_prefix(e, "grammar: the output's forced beginning (%zu bytes)",
                                  g->prefix_len);
        }
    }
    return SMELT_OK;
}

smelt_status engine_submit(struct engine *en, struct engine_req *r, struct err *e) {
    if (r->submitted) return err_set(e, SMELT_ERR_INVALID, "request submitted twice");
    int32_t n_ctx = en->cfg.n_ctx;
    if (r->p.embed != (en->pooling != POOL_NONE))
        return err_set(e, SMELT_ERR_INVALID, r->p.embed
                       ? "this model is not an embedding model (it declares no pooling type)"
                       : "this model is an embedding model: it makes embeddings, not text");
    if (r->p.embed && r->n_prompt > engine_embd_max_tokens(en))
        return err_set(e, SMELT_ERR_INVALID, "the input is %d tokens long, but this model embeds "
                       "at most %d tokens (%s)", r->n_prompt, engine_embd_max_tokens(en),
                       en->bidir && en->cfg.max_batch_tokens < n_ctx
                           ? "a bidirectional model's input runs in one step of the batch "
                             "token budget"
                           : "its context");
    if (r->n_prompt >= n_ctx && !r->p.embed)
        return err_set(e, SMELT_ERR_INVALID,
                       "the prompt is %d tokens long, but this model's context holds %d tokens "
                       "(prompt and completion together)",
                       r->n_prompt, n_ctx);
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= en->n_vocab)
            return err_set(e, SMELT_ERR_INVALID, "prompt token %d (at %d) is not in the vocabulary "
                           "(0..%d)", r->prompt[i], i, en->n_vocab - 1);
    if (r->p.n > en->cfg.max_waiting) /* never fits the queue: not "busy" */
        return err_set(e, SMELT_ERR_INVALID, "n %d is more than the waiting queue holds (%d)",
                       r->p.n, en->cfg.max_waiting);
    smelt_status st = sample_params_check(&r->p.sp, en->n_vocab, e);
    if (st != SMELT_OK) return st;
    pthread_mutex_lock(&en->gmu);
    bool g_ok = !r->p.grammar.g || gram_vocab_of(r->p.grammar.g) == en->gvocab[r->p.decode_special];
    pthread_mutex_unlock(&en->gmu);
    if (!g_ok)
        return err_set(e, SMELT_ERR_INVALID,
                       "the grammar was not compiled for this engine's "
                       "vocabulary (engine_grammar, with control tokens as text exactly when "
                       "the request renders them: decode_special)");
    st = make_seqs(en, r, e);
    if (st != SMELT_OK) {
        for (int32_t i = 0; r->seqs && i < r->p.n; i++) seq_free(r->seqs[i]);
        free(r->seqs);
        r->seqs = NULL;
        return st;
    }
    pthread_mutex_lock(&en->qmu);
    if (en->closed) {
        st = err_set(e, SMELT_ERR_CANCELLED, "the server is shutting down");
    } else if (en->n_queued + r->p.n > en->cfg.max_waiting) {
        st = err_set(e, SMELT_ERR_RANGE, "the server is busy: %d requests are waiting",
                     en->n_queued);
    } else {
        r->submitted = true;
        r->t_submit = clock_now();
        for (int32_t i = 0; i < r->p.n; i++) r->seqs[i]->arrival = en->next_arrival++;
        en->n_queued += r->p.n;
        /* one engine reference per choice: each sequence drops its own when it retires */
        atomic_fetch_add(&r->refs, r->p.n);
        atomic_fetch_add(&en->in_flight, 1);
        if (en->in_tail) en->in_tail->next_in = r;
        else en->in_head = r;
        en->in_tail = r;
        pthread_cond_signal(&en->qcv);
    }
    pthread_mutex_unlock(&en->qmu);
    if (st != SMELT_OK) {
        for (int32_t i = 0; i < r->p.n; i++) seq_free(r->seqs[i]);
        free(r->seqs);
        r->seqs = NULL;
    }
    return st;
}

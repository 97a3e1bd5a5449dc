/* Speculative decoding: the proposers, the adaptive k and the verification loop. See
 * spec.h for the contract and docs/speculative.md for the design.
 *
 * A proposer is a struct spec_proposer: how it proposes for a list of sequences, and
 * whether it keeps K/V per position (then the engine reports admissions, registrations and
 * rollbacks so it knows which of a sequence's positions it holds). An MTP proposer is one
 * more entry: its propose runs the target's MTP head (model side: a forward of the head's
 * layer over the trunk's last hidden states, its K/V as one more layer of the target's
 * store), and it keeps K/V like the draft model. */
#include "engine/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mix.h"

struct spec_proposer {
    const char *name;
    smelt_status (*propose)(struct spec *sp, struct spec_job *jobs, int32_t n, struct err *e);
    bool has_kv;
};

struct spec {
    struct spec_config cfg;
    const struct spec_proposer *prop;
    int32_t n_vocab, n_blocks, block_size, max_rows, max_seqs;
    /* SPEC_DRAFT */
    uint64_t *tag; /* (n_blocks) prefix hash of the chain whose draft K/V the block holds; 0 */
    int32_t *b_tok, *b_pos, *b_seq;   /* (max_rows) */
    uint8_t *b_logits;                /* (max_rows) */
    struct batch_seq *b_seqs;         /* (max_seqs) */
    int32_t *b_job;                   /* (max_seqs) the job of each batch sequence */
    struct topk_row *q_rows;          /* (max_seqs) */
    struct topk_summary *q_sum;       /* (max_seqs) */
    struct topk_cand *q_cand;         /* (max_seqs, TOPK_MAX) */
    float *b_hin, *b_hout;            /* SPEC_MTP (max_rows, n_embd): the head's hidden in/out */
    int32_t *b_out;                   /* SPEC_MTP (max_rows): a row's output index, or -1 */
    struct spec_stats stats;
};

void spec_config_defaults(struct spec_config *c) {
    if (c->k_max <= 0) c->k_max = 4;
    if (c->k_max > SPEC_K_MAX) c->k_max = SPEC_K_MAX;
    if (c->ngram_min <= 0) c->ngram_min = 2;
    if (c->ngram_max <= 0) c->ngram_max = 4;
    if (c->ngram_max < c->ngram_min) c->ngram_max = c->ngram_min;
    if (c->max_batch <= 0) c->max_batch = 8;
    if (!(c->row_cost > 0.0f)) c->row_cost = 0.1f;
}

const char *spec_kind_name(enum spec_kind k) {
    switch (k) {
    case SPEC_NGRAM: return "ngram";
    case SPEC_DRAFT: return "draft";
    case SPEC_MTP: return "mtp";
    default: return "off";
    }
}

smelt_status spec_kind_parse(const char *s, enum spec_kind *out, struct err *e) {
    static const enum spec_kind kinds[] = {SPEC_OFF, SPEC_NGRAM, SPEC_DRAFT, SPEC_MTP};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (s && !strcmp(s, spec_kind_name(kinds[i]))) {
            *out = kinds[i];
            return SMELT_OK;
        }
    return err_set(e, SMELT_ERR_INVALID, "speculation '%s': the choices are off, ngram, draft, mtp",
                   s ? s : "");
}

void spec_seq_init(struct spec_seq *ss, uint64_t seed) {
    memset(ss, 0, sizeof *ss);
    ss->acc_a = ss->acc_r = 1.0f; /* prior: one of each (a = 0.5) */
    uint64_t x = seed ^ 0x5bd1e9955bd1e995ull;
    for (int i = 0; i < 4; i++) ss->rng[i] = mix64(x += 0x9e3779b97f4a7c15ull);
}

void spec_seq_free(struct spec_seq *ss) {
    free(ss->q_tok);
    free(ss->q_prob);
    free(ss->mtp_h);
    ss->q_tok = NULL;
    ss->q_prob = NULL;
    ss->mtp_h = NULL;
    ss->mtp_for = 0;
}

/* ---- the adaptive k ---- */

#define SPEC_DECAY 0.8f /* per step: the estimate follows the last few steps */

/* Expected tokens a step emits with k drafts each accepted with probability a. */
static double expected_tokens(double a, int32_t k) {
    if (a >= 1.0) return k + 1;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

int32_t spec_want(const struct spec *sp, struct spec_seq *ss, int32_t n_decoding) {
    if (!sp || ss->off || n_decoding > sp->cfg.max_batch) return 0;
    if (sp->cfg.fixed) return sp->cfg.k_max;
    double a = ss->acc_a / (ss->acc_a + ss->acc_r);
    double c = sp->cfg.row_cost + (sp->cfg.draft_cost > 0 ? sp->cfg.draft_cost : 0.0f);
    int32_t best = 0;
    double gain = 1.0;
    for (int32_t k = 1; k <= sp->cfg.k_max; k++) {
        double g = expected_tokens(a, k) / (1.0 + c * k);
        if (g > gain * 1.02) { /* a longer draft must pay by a margin */
            gain = g;
            best = k;
        }
    }
    if (best == 0) {
        if (++ss->idle < SPEC_PROBE) return 0;
        ss->idle = 0;
        return 1; /* probe: the acceptance may have changed */
    }
    ss->idle = 0;
    return best;
}

void spec_commit(struct spec *sp, struct spec_seq *ss, int32_t n_accepted, int32_t n_keep) {
    if (ss->n_draft > 0) {
        ss->acc_a = ss->acc_a * SPEC_DECAY + (float)n_accepted;
        ss->acc_r = ss->acc_r * SPEC_DECAY + (n_accepted < ss->n_draft ? 1.0f : 0.0f);
        /* keep the estimate movable: neither count may vanish */
        if (ss->acc_r < 0.05f) ss->acc_r = 0.05f;
        if (ss->acc_a < 0.05f) ss->acc_a = 0.05f;
        ss->n_proposed += (uint64_t)ss->n_draft;
        ss->n_accepted += (uint64_t)n_accepted;
    }
    if (sp && sp->prop->has_kv && ss->kv_done > n_keep) ss->kv_done = n_keep;
    ss->n_draft = 0;
}

/* ---- n-gram lookup ---- */

/* The continuation (at most k tokens, into out) of the most recent earlier occurrence of
 * the longest suffix of t[0..n) of nmax..nmin tokens; 0 when none occurs. */
static int32_t ngram_lookup(const int32_t *t, int32_t n, int32_t nmin, int32_t nmax, int32_t k,
                            int32_t *out) {
    for (int32_t len = nmax < n - 1 ? nmax : n - 1; len >= nmin; len--) {
        const int32_t *suf = t + n - len;
        /* an occurrence at j: t[j .. j + len) == suf, continued by t[j + len] (j + len < n) */
        for (int32_t j = n - len - 1; j >= 0; j--) {
            if (t[j + len - 1] != suf[len - 1] || memcmp(t + j, suf, (size_t)len * sizeof *t))
                continue;
            int32_t m = 0;
            for (int32_t i = j + len; i < n && m < k; i++) out[m++] = t[i];
            return m;
        }
    }
    return 0;
}

static smelt_status ngram_propose(struct spec *sp, struct spec_job *jobs, int32_t n, struct err *e) {
    (void)e;
    for (int32_t i = 0; i < n; i++) {
        struct spec_seq *ss = jobs[i].ss;
        ss->n_draft = ngram_lookup(jobs[i].tok, jobs[i].n_tok, sp->cfg.ngram_min, sp->cfg.ngram_max,
                                   jobs[i].k, ss->draft);
        for (int32_t j = 0; j < ss->n_draft; j++) ss->q[j].n = 0;
    }
    return SMELT_OK;
}

/* ---- the draft model ---- */

static double uniform(uint64_t *s) {
    /* xoshiro256** */
    uint64_t r = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s[3] << 45 | s[3] >> 19;
    return (double)(r >> 11) * 0x1.0p-53;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Draft j of job's sequence from its output row r: the argmax, or a draw from q (the
 * draft's SPEC_Q_MAX best tokens at temperature t), stored sorted by token. */
static bool take_draft(struct spec *sp, struct spec_job *job, int32_t r, int32_t j) {
    struct spec_seq *ss = job->ss;
    const struct topk_summary *sum = &sp->q_sum[r];
    ss->q[j].n = 0;
    if (sum->top_token < 0 || sum->top_token >= sp->n_vocab) return false; /* not the target's */
    if (job->temperature <= 0.0f || ss->point_mass) {
        ss->draft[j] = sum->top_token;
        return true;
    }
    if (!ss->q_tok) {
        ss->q_tok = malloc(SPEC_K_MAX * SPEC_Q_MAX * sizeof *ss->q_tok);
        ss->q_prob = malloc(SPEC_K_MAX * SPEC_Q_MAX * sizeof *ss->q_prob);
        if (!ss->q_tok || !ss->q_prob) {
            spec_seq_free(ss);
            ss->draft[j] = sum->top_token; /* out of memory: a point mass is still exact */
            return sum->top_token >= 0;
        }
    }
    const struct topk_cand *c = sp->q_cand + (size_t)r * TOPK_MAX;
    int32_t n = sum->n_cand < SPEC_Q_MAX ? sum->n_cand : SPEC_Q_MAX;
    while (n > 0 && c[n - 1].token >= sp->n_vocab) n--; /* ids only the draft has */
    for (int32_t i = 0; i < n; i++)
        if (c[i].token >= sp->n_vocab) return false;
    if (n <= 0) return false;
    int32_t *tok = ss->q_tok + j * SPEC_Q_MAX;
    float *prob = ss->q_prob + j * SPEC_Q_MAX;
    double w[SPEC_Q_MAX], tot = 0.0, inv_t = 1.0 / job->temperature;
    for (int32_t i = 0; i < n; i++) tot += w[i] = exp(((double)c[i].logit - c[0].logit) * inv_t);
    double u = uniform(ss->rng) * tot, run = 0.0;
    int32_t pick = c[n - 1].token;
    for (int32_t i = 0; i < n; i++) {
        run += w[i];
        if (u < run) {
            pick = c[i].token;
            break;
        }
    }
    /* q sorted by token */
    for (int32_t i = 0; i < n; i++) tok[i] = c[i].token;
    qsort(tok, (size_t)n, sizeof *tok, cmp_i32);
    for (int32_t i = 0; i < n; i++)
        for (int32_t m = 0; m < n; m++)
            if (c[m].token == tok[i]) {
                prob[i] = (float)(w[m] / tot);
                break;
            }
    ss->draft[j] = pick;
    ss->q[j] = (struct sample_q){n, tok, prob};
    return true;
}

/* One draft step over the rows staged in sp->b_* (n rows, ns sequences, n_out output rows
 * whose requests are in sp->q_rows). */
static smelt_status draft_step(struct spec *sp, int32_t n, int32_t ns, int32_t n_out, struct err *e) {
    double t0 = clock_now();
    struct batch b = {n, sp->b_tok, sp->b_pos, sp->b_seq, sp->b_logits, ns, sp->b_seqs};
    struct model_sample ms = {.n_rows = n_out, .rows = sp->q_rows, .sum = sp->q_sum, .cand = sp->q_cand};
    bool mtp = sp->cfg.kind == SPEC_MTP;
    smelt_status st = model_step_mtp(sp->cfg.draft, sp->cfg.draft_kv, &b, NULL,
                                     n_out ? &ms : NULL, NULL, mtp ? sp->b_hin : NULL,
                                     mtp ? sp->b_hout : NULL, e);
    sp->stats.draft_steps++;
    sp->stats.draft_rows += (uint64_t)n;
    sp->stats.draft_seconds += clock_now() - t0;
    return st == SMELT_OK ? SMELT_OK : err_prefix(e, mtp ? "MTP head" : "draft model");
}

/* The request of a draft output row. */
static struct topk_row draft_req(const struct spec_job *job) {
    bool sampled = job->temperature > 0.0f && !job->ss->point_mass;
    return (struct topk_row){.k = sampled ? SPEC_Q_MAX : 1,
                             .inv_t = sampled ? 1.0f / job->temperature : 1.0f};
}

/* Stages row (token, pos) of job ji in batch sequence si; the draft writes there: the
 * block's tag no longer holds. */
static void stage(struct spec *sp, int32_t *n, int32_t si, int32_t token, int32_t pos, bool out) {
    const struct batch_seq *v = &sp->b_seqs[si];
    sp->tag[v->blocks[pos / sp->block_size]] = 0;
    sp->b_tok[*n] = token;
    sp->b_pos[*n] = pos;
    sp->b_seq[*n] = si;
    sp->b_logits[*n] = out;
    (*n)++;
}

/* Draft j of ss and the head's hidden state after it, from output row r of the last head
 * step (its batch row hr). False: no draft (a token the target lacks, out of memory). */
static bool mtp_take(struct spec *sp, struct spec_seq *ss, float temperature, int32_t r,
                     int32_t hr, int32_t j) {
    size_t E = (size_t)sp->cfg.draft->hp.n_embd;
    struct spec_job job = {.ss = ss, .temperature = temperature};
    if (!ss->mtp_h) ss->mtp_h = malloc(E * sizeof *ss->mtp_h);
    if (!ss->mtp_h || !take_draft(sp, &job, r, j)) return false;
    memcpy(ss->mtp_h, sp->b_hout + (size_t)hr * E, E * sizeof *ss->mtp_h);
    return true;
}

/* The one-row steps after d_1: d_j of each job still proposing (n_draft == j < k) at
 * position n_tok - 1 + j (the MTP head: n_tok - 2 + j, reading its own hidden state of the
 * row before) gives d_{j+1}. A draft's rows extend its K/V; the head's are provisional. */
static smelt_status chain(struct spec *sp, struct spec_job *jobs, int32_t n_jobs, bool mtp,
                          struct err *e) {
    const size_t E = mtp ? (size_t)sp->cfg.draft->hp.n_embd : 0;
    for (int32_t j = 1; j < SPEC_K_MAX; j++) {
        int32_t n = 0, n_out = 0;
        for (int32_t i = 0; i < n_jobs && n < sp->max_rows; i++) {
            struct spec_job *job = &jobs[i];
            if (job->ss->n_draft != j || j >= job->k || job->ss->off) continue;
            sp->b_seqs[n] = job->view;
            sp->b_seqs[n].snap_pos = 0;
            sp->b_job[n] = i;
            if (mtp) memcpy(sp->b_hin + (size_t)n * E, job->ss->mtp_h, E * sizeof(float));
            int32_t si = n;
            stage(sp, &n, si, job->ss->draft[j - 1], job->n_tok - (mtp ? 2 : 1) + j, true);
            sp->q_rows[n_out++] = draft_req(job);
        }
        if (n == 0) break;
        smelt_status st = draft_step(sp, n, n, n_out, e);
        if (st != SMELT_OK) return st;
        for (int32_t r = 0; r < n; r++) {
            struct spec_job *job = &jobs[sp->b_job[r]];
            if (!mtp) job->ss->kv_done++;
            bool ok = mtp ? mtp_take(sp, job->ss, job->temperature, r, r, j)
                          : take_draft(sp, job, r, j);
            if (ok) job->ss->n_draft = j + 1;
        }
    }
    return SMELT_OK;
}

static smelt_status draft_propose(struct spec *sp, struct spec_job *jobs, int32_t n_jobs,
                                  struct err *e) {
    int32_t nd = sp->cfg.draft->hp.n_vocab;
    for (int32_t i = 0; i < n_jobs; i++) {
        struct spec_seq *ss = jobs[i].ss;
        ss->n_draft = 0;
        if (ss->kv_done > jobs[i].n_tok - 1) ss->kv_done = jobs[i].n_tok - 1;
        /* a token the draft does not have (a padded vocabulary's last ids): it cannot
         * follow this sequence any more (off: skipped below, never asked again) */
        for (int32_t p = ss->kv_done; p < jobs[i].n_tok && !ss->off; p++)
            ss->off = jobs[i].tok[p] >= nd;
    }
    /* catch up: positions [kv_done, n_tok) of every job, the last one's logits giving d_1 */
    for (int32_t first = 0; first < n_jobs;) {
        int32_t n = 0, ns = 0, n_out = 0, next = first;
        for (int32_t i = first; i < n_jobs && n < sp->max_rows && ns < sp->max_seqs; i++) {
            struct spec_job *job = &jobs[i];
            struct spec_seq *ss = job->ss;
            if (ss->off) {
                next = i + 1;
                continue;
            }
            int32_t pend = job->n_tok - ss->kv_done, take = pend;
            if (take > sp->max_rows - n) take = sp->max_rows - n; /* >= 1 */
            int32_t si = ns++;
            sp->b_seqs[si] = job->view;
            sp->b_seqs[si].snap_pos = 0;
            sp->b_job[si] = i;
            bool done = take == pend;
            for (int32_t p = ss->kv_done; p < ss->kv_done + take; p++)
                stage(sp, &n, si, job->tok[p], p, done && p == job->n_tok - 1);
            if (done) sp->q_rows[n_out++] = draft_req(job);
            next = done ? i + 1 : i;
            if (!done) break;
        }
        if (n == 0) { /* the rest were off */
            first = next;
            continue;
        }
        smelt_status st = draft_step(sp, n, ns, n_out, e);
        if (st != SMELT_OK) return st;
        int32_t r = 0;
        for (int32_t si = 0; si < ns; si++) {
            struct spec_job *job = &jobs[sp->b_job[si]];
            int32_t rows = 0;
            for (int32_t i = 0; i < n; i++) rows += sp->b_seq[i] == si;
            job->ss->kv_done += rows;
            if (job->ss->kv_done == job->n_tok && take_draft(sp, job, r++, 0)) job->ss->n_draft = 1;
        }
        first = next;
    }
    return chain(sp, jobs, n_jobs, false, e);
}

/* ---- the MTP head ---- */

smelt_status spec_observe(struct spec *sp, struct spec_obs *obs, int32_t n_obs, struct err *e) {
    if (!spec_wants_hidden(sp)) return SMELT_OK;
    const size_t E = (size_t)sp->cfg.draft->hp.n_embd;
    for (int32_t first = 0; first < n_obs;) {
        int32_t n = 0, ns = 0, n_out = 0, i = first;
        for (; i < n_obs && ns < sp->max_seqs; i++) {
            struct spec_obs *o = &obs[i];
            struct spec_seq *ss = o->ss;
            int32_t end = o->pos0 + o->n;
            ss->mtp_for = 0;
            if (ss->off || end <= ss->kv_done) continue; /* already computed (a re-feed) */
            if (ss->kv_done < o->pos0) ss->kv_done = o->pos0; /* a gap: stale positions */
            int32_t from = ss->kv_done;
            if (end - from > sp->max_rows) {
                return err_set(e, SMELT_ERR_INVALID, "MTP head: %d rows observed, steps take %d",
                               end - from, sp->max_rows);
            }
            if (n + end - from > sp->max_rows) break; /* the next head step */
            int32_t si = ns++;
            sp->b_seqs[si] = o->view;
            sp->b_seqs[si].snap_pos = 0;
            sp->b_job[si] = i;
            for (int32_t p = from; p < end; p++) {
                memcpy(sp->b_hin + (size_t)n * E, o->hidden + (size_t)(p - o->pos0) * E,
                       E * sizeof(float));
                sp->b_out[n] = p == end - 1 ? n_out : -1;
                stage(sp, &n, si, o->next[p - o->pos0], p, p == end - 1);
            }
            const struct spec_job oj = {.ss = ss, .temperature = o->temperature};
            sp->q_rows[n_out++] = draft_req(&oj);
        }
        if (n > 0) {
            smelt_status st = draft_step(sp, n, ns, n_out, e);
            if (st != SMELT_OK) return st;
            for (int32_t r = 0; r < n; r++) {
                if (sp->b_out[r] < 0) continue;
                struct spec_obs *o = &obs[sp->b_job[sp->b_seq[r]]];
                o->ss->kv_done = o->pos0 + o->n;
                /* row p predicts the token after next[p]: d_1 of a sequence of p + 2 tokens */
                if (mtp_take(sp, o->ss, o->temperature, sp->b_out[r], r, 0))
                    o->ss->mtp_for = sp->b_pos[r] + 2;
            }
        }
        first = i;
    }
    return SMELT_OK;
}

/* d_1 from spec_observe, then one head row per job and step: d_j at position
 * n_tok - 2 + j, reading the head's hidden state of the row before, gives d_{j+1}. */
static smelt_status mtp_propose(struct spec *sp, struct spec_job *jobs, int32_t n_jobs,
                                struct err *e) {
    for (int32_t i = 0; i < n_jobs; i++) {
        struct spec_seq *ss = jobs[i].ss;
        ss->n_draft = !ss->off && ss->mtp_for == jobs[i].n_tok && ss->mtp_for > 0;
    }
    return chain(sp, jobs, n_jobs, true, e);
}

static const struct spec_proposer prop_ngram = {"ngram", ngram_propose, false};
static const struct spec_proposer prop_draft = {"draft", draft_propose, true};
static const struct spec_proposer prop_mtp = {"mtp", mtp_propose, true};

bool spec_wants_hidden(const struct spec *sp) { return sp && sp->prop == &prop_mtp; }

/* ---- the state ---- */

static uint64_t weight_bytes(const struct model *m) {
    uint64_t b = 0;
    for (int64_t i = 0; m && i < m->n_tensors; i++) b += tensor_nbytes(&m->tensors[i]);
    return b;
}

smelt_status spec_new(struct spec **out, const struct spec_config *cfg0, const struct model *target,
                      int32_t n_vocab, int32_t n_blocks, int32_t block_size, int32_t max_rows,
                      int32_t max_seqs, struct err *e) {
    *out = NULL;
    struct spec_config cfg = *cfg0;
    spec_config_defaults(&cfg);
    const struct spec_proposer *prop = NULL;
    switch (cfg.kind) {
    case SPEC_NGRAM: prop = &prop_ngram; break;
    case SPEC_DRAFT: prop = &prop_draft; break;
    case SPEC_MTP: prop = &prop_mtp; break;
    default: return err_set(e, SMELT_ERR_INVALID, "speculation: no proposer");
    }
    if (cfg.kind == SPEC_DRAFT || cfg.kind == SPEC_MTP) {
        const struct model *d = cfg.draft;
        const struct kv_store *kv = cfg.draft_kv;
        if (!d || !kv)
            return err_set(e, SMELT_ERR_INVALID, "%s",
                           cfg.kind == SPEC_MTP ? "--spec mtp needs the target's MTP head"
                                                : "--spec draft needs a draft model (--draft)");
        if (model_is_recurrent(d))
            return err_set(e, SMELT_ERR_UNSUPPORTED, "draft model %s: recurrent layers cannot roll "
                           "back a rejected draft cheaply; use an attention-only draft", d->hp.arch);
        if (kv->n_blocks < n_blocks || kv->block_size != block_size)
            return err_set(e, SMELT_ERR_INVALID, "draft KV store: %d blocks of %d, the target's %d "
                           "of %d", kv->n_blocks, kv->block_size, n_blocks, block_size);
        if (cfg.draft_cost < 0.0f && cfg.kind == SPEC_MTP) {
            /* the head shares the target's weights: one layer (and the head) of the trunk's */
            cfg.draft_cost = target ? 1.0f / (float)(target->hp.n_layer + 1) : 0.1f;
        } else if (cfg.draft_cost < 0.0f) {
            uint64_t tb = weight_bytes(target), db = weight_bytes(d);
            cfg.draft_cost = tb ? (float)((double)db / (double)tb) : 0.5f;
        }
    } else {
        cfg.draft_cost = 0.0f;
    }
    struct spec *sp = calloc(1, sizeof *sp);
    if (!sp) return err_set(e, SMELT_ERR_NOMEM, "speculation: out of memory");
    sp->cfg = cfg;
    sp->prop = prop;
    sp->n_vocab = n_vocab;
    sp->n_blocks = n_blocks;
    sp->block_size = block_size;
    sp->max_rows = max_rows;
    sp->max_seqs = max_seqs;
    if (cfg.kind == SPEC_DRAFT || cfg.kind == SPEC_MTP) {
        size_t r = (size_t)max_rows, s = (size_t)max_seqs;
        if (cfg.kind == SPEC_MTP) {
            size_t E = (size_t)cfg.draft->hp.n_embd;
            sp->b_hin = malloc(r * E * sizeof *sp->b_hin);
            sp->b_hout = malloc(r * E * sizeof *sp->b_hout);
            sp->b_out = malloc(r * sizeof *sp->b_out);
            if (!sp->b_hin || !sp->b_hout || !sp->b_out) {
                spec_free(sp);
                return err_set(e, SMELT_ERR_NOMEM, "speculation: out of memory (%d rows)", max_rows);
            }
        }
        sp->tag = calloc((size_t)n_blocks, sizeof *sp->tag);
        sp->b_tok = malloc(r * sizeof *sp->b_tok);
        sp->b_pos = malloc(r * sizeof *sp->b_pos);
        sp->b_seq = malloc(r * sizeof *sp->b_seq);
        sp->b_logits = malloc(r);
        sp->b_seqs = calloc(s, sizeof *sp->b_seqs);
        sp->b_job = calloc(s, sizeof *sp->b_job);
        sp->q_rows = calloc(s, sizeof *sp->q_rows);
        sp->q_sum = calloc(s, sizeof *sp->q_sum);
        sp->q_cand = calloc(s * TOPK_MAX, sizeof *sp->q_cand);
        if (!sp->tag || !sp->b_tok || !sp->b_pos || !sp->b_seq || !sp->b_logits || !sp->b_seqs ||
            !sp->b_job || !sp->q_rows || !sp->q_sum || !sp->q_cand) {
            spec_free(sp);
            return err_set(e, SMELT_ERR_NOMEM, "speculation: out of memory (%d rows)", max_rows);
        }
    }
    *out = sp;
    return SMELT_OK;
}

void spec_free(struct spec *sp) {
    if (!sp) return;
    free(sp->tag);
    free(sp->b_tok);
    free(sp->b_pos);
    free(sp->b_seq);
    free(sp->b_logits);
    free(sp->b_seqs);
    free(sp->b_job);
    free(sp->q_rows);
    free(sp->q_sum);
    free(sp->q_cand);
    free(sp->b_hin);
    free(sp->b_hout);
    free(sp->b_out);
    free(sp);
}

const struct spec_config *spec_get_config(const struct spec *sp) { return &sp->cfg; }

bool spec_has_kv(const struct spec *sp) { return sp && sp->prop->has_kv; }

smelt_status spec_propose(struct spec *sp, struct spec_job *jobs, int32_t n, struct err *e) {
    for (int32_t i = 0; i < n; i++) {
        jobs[i].ss->n_draft = 0;
        if (jobs[i].k > SPEC_K_MAX) jobs[i].k = SPEC_K_MAX;
    }
    if (n == 0) return SMELT_OK;
    smelt_status st = sp->prop->propose(sp, jobs, n, e);
    if (st != SMELT_OK)
        for (int32_t i = 0; i < n; i++) jobs[i].ss->n_draft = 0;
    return st;
}

void spec_admit(struct spec *sp, struct spec_seq *ss, const int32_t *blocks,
                const uint64_t *hashes, int32_t n_cached) {
    ss->kv_done = 0;
    ss->n_draft = 0;
    if (!spec_has_kv(sp)) return;
    int32_t b = 0;
    while (b < n_cached && sp->tag[blocks[b]] != 0 && sp->tag[blocks[b]] == hashes[b]) b++;
    ss->kv_done = b * sp->block_size;
}

void spec_register(struct spec *sp, struct spec_seq *ss, const int32_t *blocks,
                   const uint64_t *hashes, int32_t n_full) {
    if (!spec_has_kv(sp)) return;
    int32_t done = ss->kv_done / sp->block_size;
    for (int32_t b = 0; b < n_full && b < done; b++) sp->tag[blocks[b]] = hashes[b];
}

void spec_get_stats(const struct spec *sp, struct spec_stats *out) {
    if (sp) *out = sp->stats;
    else memset(out, 0, sizeof *out);
}

/* ---- verification ---- */

smelt_status spec_verify(struct sampler *smp, bool history, const struct spec_seq *ss,
                         const struct spec_rows *src, struct sample_result *out,
                         int32_t *n_out, int32_t *n_full, struct err *e) {
    *n_out = 0;
    *n_full = 0;
    smelt_status st = SMELT_OK;
    int32_t pushed = 0;
    for (int32_t j = 0; j <= ss->n_draft; j++) {
        const struct topk_row *req;
        const struct topk_summary *sum;
        const struct topk_cand *cand;
        const float *adj_raw;
        src->get(src->ctx, j, &req, &sum, &cand, &adj_raw);
        const struct topk_row host = {0};
        sampler_reopen(smp, sum ? req : &host);
        int32_t d = j < ss->n_draft ? ss->draft[j] : -1;
        const struct sample_q *q = j < ss->n_draft && ss->q[j].n > 0 ? &ss->q[j] : NULL;
        struct sample_result *r = &out[j];
        bool acc = false;
        const float *row = sum ? NULL : src->full(src->ctx, j, e);
        if (!sum && !row) {
            st = SMELT_ERR_INTERNAL;
            break;
        }
        st = sampler_verify(smp, sum, cand, adj_raw, row, d, q, r, &acc, e);
        if (st == SMELT_OK && r->token == SAMPLE_NEED_ROW) {
            (*n_full)++;
            row = src->full(src->ctx, j, e);
            if (!row) {
                st = SMELT_ERR_INTERNAL;
                break;
            }
            st = sampler_verify(smp, sum, cand, adj_raw, row, d, q, r, &acc, e);
        }
        if (st != SMELT_OK) break;
        if (r->token < 0) {
            st = err_set(e, SMELT_ERR_INTERNAL, "sampler: no token");
            break;
        }
        (*n_out)++;
        if (!acc) break;
        if (history) {
            sampler_accept(smp, d, true);
            pushed++;
        }
    }
    if (history) sampler_unaccept(smp, pushed);
    return st;
}

/* smelt run MODEL [PROMPT] [options]: generate text from a prompt, or chat with -i.
 *
 * One sequence on the chosen backend (CPU, or CUDA when present), driven directly through
 * model_step: the prompt is prefilled in chunks, then tokens are sampled one at a time
 * from the last row's summary (engine/sample.h: only a few KB per token come back from
 * the device, the full row only when the sampler asks for it) and streamed through the
 * incremental detokenizer. With -i the conversation's KV cache is kept between turns:
 * each turn renders the whole conversation, keeps the cached tokens it shares with the
 * new rendering, and prefills only the rest.
 *
 * The prompt goes through the model's chat template (tokenizer.chat_template) unless
 * --raw. A file without a template is taken for a base model (Gemma 3 270M base ships
 * none and answers a chat format with noise): its prompt is used as is, with a note.
 * A harmony template (gpt-oss) makes replies a sequence of channel messages: the reply is
 * parsed as the server parses it (server/outp.h), its analysis (reasoning) goes to stderr
 * and its final channel to stdout, and only that is the turn's answer in the conversation.
 *
 * Sampling defaults come from the GGUF (general.sampling.temp, top_k, top_p, min_p,
 * penalty_repeat, penalty_last_n) where it has them; flags override; -v prints the
 * settings in effect. Prompt and generation speeds go to stderr at the end; with -i, each
 * turn also prints "turn N: prompt P tokens (R reused from the cache), generation G
 * tokens" (P: the tokens it prefilled).
 *
 * Speculative decoding (--spec, --draft: cli/clispec.h, engine/spec.h): after each sampled
 * token the proposer drafts up to k more; the token and the drafts are fed as one step with
 * every row's summary, spec_verify keeps the agreeing prefix (or what rejection sampling
 * accepts) and the token the first rejected row draws, and the rejected positions are rolled
 * back. Greedy output is the non-speculative output; so is sampled output with n-gram
 * drafts, for the same seed. The end line adds "speculation: P proposed, A accepted".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/climem.h"
#include "cli/clibackend.h"
#include "cli/clispec.h"
#include "cli/modelref.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "engine/spec.h"
#include "format/gguf.h"
#include "grammar/gram.h"
#include "model/model.h"
#include "server/outp.h"
#include "template/tmpl.h"
#include "tokenizer/tok.h"
#include "util/array.h"
#include "util/clock.h"
#include "util/file.h"

#define BLOCK 16
#define PREFILL_CHUNK 256

struct opts {
    const char *model, *prompt, *system, *backend;
    const char *schema_file, *grammar_file; /* --json-schema, --grammar */
    int n_predict, n_ctx, threads, device, n_cpu_moe;
    bool raw, interactive, ignore_eos, f32_kv, verbose, allow_unknown_pre;
    struct sample_params sp;
    bool set_temp, set_top_k, set_top_p, set_min_p, set_rep, set_last_n;
    int64_t last_n; /* penalty window as llama.cpp means it: N > 0 the last N tokens,
                     * -1 the whole context, 0 no penalty; valid when have_last_n */
    bool have_last_n;
    char from_file[128]; /* the general.sampling.* keys that set something, for -v */
    struct cli_spec spec;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: smelt run MODEL [PROMPT] [options]\n"
            "  MODEL              a GGUF file, a directory, or org/repo[:quant] (Hugging Face\n"
            "                     cache; pulled when absent)\n"
            "  PROMPT             the user message (default: read stdin); with -i, the first one\n"
            "  -i                 chat interactively (the KV cache is kept between turns)\n"
            "  --raw              no chat template: the prompt is the model's input as is\n"
            "  --system TEXT      a system message\n"
            "  -n N               tokens to generate per answer (default 256)\n"
            "  -c N               context size in tokens (default 4096)\n"
            "  -t, --threads N    CPU threads (default: all)\n"
            "  --backend B        auto (CUDA when present), cpu or cuda; --device N\n"
            "  --n-cpu-moe N      keep the experts of the first N layers in host memory and\n"
            "                     run them on the CPU (a mixture of experts larger than the GPU)\n"
            "  --temp X           temperature (0: greedy)\n"
            "  --top-k N, --top-p X, --min-p X, --repeat-penalty X, --seed N\n"
            "  --repeat-last-n N  penalize the last N tokens (-1: all, 0: no penalty;\n"
            "                     default: all)\n"
            "  -v, --verbose      print the sampling settings in effect\n"
            "  --ignore-eos       keep generating past end-of-generation tokens\n"
            "  --json-schema FILE every answer is JSON valid against the JSON Schema in FILE\n"
            "  --grammar FILE     every answer is a sentence of the GBNF grammar in FILE\n"
            "                     (docs/structured-output.md says what each supports)\n"
            "  --f32-kv           F32 KV cache (default F16)\n"
            "  --allow-unknown-pretokenizer  load a tokenizer.ggml.pre smelt does not implement\n"
            "                     with GPT-2's split (token ids may differ from the model's)\n"
            "%s", cli_spec_usage);
}

static bool arg_num(int argc, char **argv, int *i, double *out) {
    if (*i + 1 >= argc) return false;
    char *end;
    *out = strtod(argv[++*i], &end);
    return *end == 0;
}

static int parse(int argc, char **argv, struct opts *o) {
    sample_params_default(&o->sp);
    o->n_predict = 256;
    o->n_ctx = 4096;
    o->device = -1; /* not given */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double v = 0;
        int rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-i")) {
            o->interactive = true;
        } else if (!strcmp(a, "--raw")) {
            o->raw = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = true;
        } else if (!strcmp(a, "--f32-kv")) {
            o->f32_kv = true;
        } else if (!strcmp(a, "--allow-unknown-pretokenizer")) {
            o->allow_unknown_pre = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose = true;
        } else if (!strcmp(a, "--system") && i + 1 < argc) {
            o->system = argv[++i];
        } else if (!strcmp(a, "--backend") && i + 1 < argc) {
            o->backend = argv[++i];
        } else if (!strcmp(a, "--json-schema") && i + 1 < argc) {
            o->schema_file = argv[++i];
        } else if (!strcmp(a, "--grammar") && i + 1 < argc) {
            o->grammar_file = argv[++i];
        } else if ((rc = cli_spec_arg(&o->spec, "run", argc, argv, &i)) != 0) {
            if (rc == 2) return 2;
        } else if (a[0] == '-' && a[1] != 0) {
            if (!arg_num(argc, argv, &i, &v)) {
                fprintf(stderr, "smelt run: %s needs a number\n", a);
                return 2;
            }
            if (!strcmp(a, "-n")) o->n_predict = (int)v;
            else if (!strcmp(a, "-c")) o->n_ctx = (int)v;
            else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o->threads = (int)v;
            else if (!strcmp(a, "--n-cpu-moe") && v >= 0 && v <= 65536) o->n_cpu_moe = (int)v;
            else if (!strcmp(a, "--n-cpu-moe")) {
                fprintf(stderr, "smelt run: --n-cpu-moe takes a layer count (0, 1, ...)\n");
                return 2;
            }
            else if (!strcmp(a, "--device") && v >= 0 && v <= 1024) o->device = (int)v;
            else if (!strcmp(a, "--device")) {
                fprintf(stderr, "smelt run: --device takes a CUDA device index (0, 1, ...)\n");
                return 2;
            }
            else if (!strcmp(a, "--temp")) o->sp.temperature = (float)v, o->set_temp = true;
            else if (!strcmp(a, "--top-k")) o->sp.top_k = (int32_t)v, o->set_top_k = true;
            else if (!strcmp(a, "--top-p")) o->sp.top_p = (float)v, o->set_top_p = true;
            else if (!strcmp(a, "--min-p")) o->sp.min_p = (float)v, o->set_min_p = true;
            else if (!strcmp(a, "--repeat-penalty")) o->sp.repetition_penalty = (float)v, o->set_rep = true;
            else if (!strcmp(a, "--seed")) o->sp.seed = (uint64_t)v;
            else if (!strcmp(a, "--repeat-last-n") && v >= -1 && v <= INT32_MAX)
                o->last_n = (int64_t)v, o->have_last_n = o->set_last_n = true;
            else if (!strcmp(a, "--repeat-last-n")) {
                fprintf(stderr, "smelt run: --repeat-last-n takes -1, 0 or a token count\n");
                return 2;
            } else {
                fprintf(stderr, "smelt run: unknown option %s\n", a);
                usage(stderr);
                return 2;
            }
        } else if (!o->model) {
            o->model = a;
        } else if (!o->prompt) {
            o->prompt = a;
        } else {
            fprintf(stderr, "smelt run: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (!o->model) {
        usage(stderr);
        return 2;
    }
    if (o->n_predict < 0 || o->n_ctx < 16 || o->n_ctx > (1 << 24) || o->threads < 0) {
        fprintf(stderr, "smelt run: -n, -c or --threads out of range\n");
        return 2;
    }
    return -1;
}

static void note_key(struct opts *o, const char *name) {
    size_t n = strlen(o->from_file);
    snprintf(o->from_file + n, sizeof o->from_file - n, "%s%s", n ? ", " : "", name);
}

/* GGUF sampling defaults (general.sampling.*, as llama.cpp writes and reads them) for what
 * the flags did not set; keys of the wrong type or out of range are ignored, and
 * sample_params_check judges the rest. Then the penalty window: penalty_last_n counts
 * like llama.cpp's (0 turns off a repetition penalty that did not come from a flag). */
static void gguf_sampling(const struct gguf_file *f, struct opts *o) {
    float x;
    uint32_t k;
    int64_t n;
    if (!o->set_temp && gguf_get_f32(f, "general.sampling.temp", &x, NULL) == SMELT_OK)
        o->sp.temperature = x, note_key(o, "temp");
    if (!o->set_top_k && gguf_get_u32(f, "general.sampling.top_k", &k, NULL) == SMELT_OK &&
        k <= INT32_MAX)
        o->sp.top_k = (int32_t)k, note_key(o, "top_k");
    if (!o->set_top_p && gguf_get_f32(f, "general.sampling.top_p", &x, NULL) == SMELT_OK)
        o->sp.top_p = x, note_key(o, "top_p");
    if (!o->set_min_p && gguf_get_f32(f, "general.sampling.min_p", &x, NULL) == SMELT_OK)
        o->sp.min_p = x, note_key(o, "min_p");
    if (!o->set_rep && gguf_get_f32(f, "general.sampling.penalty_repeat", &x, NULL) == SMELT_OK)
        o->sp.repetition_penalty = x, note_key(o, "penalty_repeat");
    if (!o->set_last_n &&
        gguf_get_i64(f, "general.sampling.penalty_last_n", &n, NULL) == SMELT_OK && n >= -1 &&
        n <= INT32_MAX)
        o->last_n = n, o->have_last_n = true, note_key(o, "penalty_last_n");
    if (!o->have_last_n || o->last_n < 0) {
        o->sp.penalty_last_n = 0; /* the whole history */
    } else if (o->last_n == 0) {
        o->sp.penalty_last_n = 0;
        if (o->set_last_n || !o->set_rep) o->sp.repetition_penalty = 1.0f;
    } else {
        /* a window as long as the context is the whole history (and needs no ring of
         * that size) */
        o->sp.penalty_last_n = o->last_n >= o->n_ctx ? 0 : (int32_t)o->last_n;
    }
}

/* -v: the sampling settings in effect, once. */
static void print_sampling(const struct opts *o) {
    const struct sample_params *p = &o->sp;
    fprintf(stderr, "smelt run: sampling: temperature %g, top_k %d, top_p %g, min_p %g, ",
            (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p);
    if (p->repetition_penalty == 1.0f)
        fprintf(stderr, "repeat_penalty off");
    else if (p->penalty_last_n > 0)
        fprintf(stderr, "repeat_penalty %g over the last %d tokens", (double)p->repetition_penalty,
                p->penalty_last_n);
    else
        fprintf(stderr, "repeat_penalty %g over all tokens", (double)p->repetition_penalty);
    fprintf(stderr, ", seed %llu (from the file: %s)\n", (unsigned long long)p->seed,
            o->from_file[0] ? o->from_file : "nothing");
}

/* Recurrent state slots of a model with recurrent layers: the live state, the kept and
 * two trailing snapshots (engine/kv.h). */
#define RUN_SLOTS 4

/* Everything one chat needs. */
struct session {
    struct opts *o;
    struct gguf_file *f;
    struct backend *bk;
    struct model *m;
    struct tok *tok;
    struct kv_store *kv;
    struct kv_pool pool;
    struct kv_seq seq;
    struct sampler *smp;
    struct tmpl *tmpl;     /* NULL with --raw */
    bool harmony;          /* the template writes gpt-oss's harmony format */
    json_t *messages;      /* the conversation so far */
    struct tok_ids cached; /* tokens whose K/V are in the cache, positions 0.. */
    /* the last position's summary for the sampler, and its full row on demand */
    struct topk_row req;
    struct logit_adj *adj;   /* (model_adj_cap(1)) */
    float *adj_raw;          /* (model_adj_cap(1)) */
    struct topk_summary sum;
    struct topk_cand cand[TOPK_MAX];
    float *logits;           /* (n_vocab) */
    /* --json-schema / --grammar: the answer's matcher (reset each turn) and the next
     * token's mask (topk_mask_words(n_vocab) words), which the sampler applies */
    struct gram_vocab *gv;
    struct gram *gram;
    struct gram_matcher *gm;
    uint32_t *mask;
    uint32_t *vmask; /* with speculation: verify row j's mask at vmask + j * words (the
                      * matcher after the pending token and drafts 1..j) */
    double t_prompt, t_gen;
    int64_t n_prompt, n_gen;
    int n_turns;
    /* speculative decoding (sp NULL: off): a verify step's rows, summaries and tokens */
    struct spec *sp;
    struct spec_seq ss;
    struct topk_row vreq[SPEC_K_MAX + 1];
    struct topk_summary vsum[SPEC_K_MAX + 1];
    struct topk_cand *vcand;   /* ((SPEC_K_MAX + 1) * TOPK_MAX) */
    struct logit_adj *vadj;    /* (model_adj_cap(SPEC_K_MAX + 1)) */
    float *vraw;               /* (model_adj_cap(SPEC_K_MAX + 1)) */
    struct sample_result vout[SPEC_K_MAX + 1];
    int64_t n_spec_steps;
    /* --spec mtp: a step's final hidden states (PREFILL_CHUNK, n_embd), and the last row's
     * (n_embd) at position hold_pos (-1: none) until the token after it is known */
    float *hid, *hold;
    int32_t hold_pos;
};

static smelt_status append(struct tok_buf *b, const char *p, size_t n, struct err *e) {
    if (!array_grow((void **)&b->p, &b->cap, b->n + n + 1, 1))
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return SMELT_OK;
}

/* --spec mtp: the MTP head sees rows [p0, p0 + n) of the last step (their hidden states,
 * the tokens after them: next) and computes its K/V there (engine/spec.h). */
static smelt_status observe(struct session *s, int32_t p0, int32_t n, const float *hidden,
                            const int32_t *next, struct err *e) {
    struct spec_obs o = {&s->ss, p0, n, hidden, next, kv_seq_view(&s->seq), s->o->sp.temperature};
    return spec_observe(s->sp, &o, 1, e);
}

/* The held row (the last one fed, whose next token was unknown) with its next token t, at
 * the position after it. */
static smelt_status observe_held(struct session *s, int32_t t, struct err *e) {
    if (!spec_wants_hidden(s->sp)) return SMELT_OK;
    int32_t at = s->hold_pos;
    s->hold_pos = -1;
    if (at < 0 || (size_t)at + 1 != s->cached.n) return SMELT_OK; /* rolled back since */
    return observe(s, at, 1, s->hold, &t, e);
}

/* Feeds ids (appended after the cached tokens) through the model; with summary, leaves the
 * last position's summary, as the sampler requested it, in s->sum / s->cand / s->adj_raw. */
static smelt_status feed(struct session *s, const int32_t *ids, size_t n, bool summary,
                         struct err *e) {
    bool mtp = spec_wants_hidden(s->sp);
    if (mtp && n > 0) {
        smelt_status st = observe_held(s, ids[0], e);
        if (st != SMELT_OK) return st;
    }
    int32_t *pos = malloc(PREFILL_CHUNK * sizeof *pos), *seq = calloc(PREFILL_CHUNK, sizeof *seq);
    if (!pos || !seq) {
        free(pos);
        free(seq);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    smelt_status st = SMELT_OK;
    for (size_t done = 0; done < n && st == SMELT_OK;) {
        size_t take = n - done < PREFILL_CHUNK ? n - done : PREFILL_CHUNK;
        int32_t p0 = (int32_t)s->cached.n;
        if (p0 + (int64_t)take > s->o->n_ctx) {
            st = err_set(e, SMELT_ERR_RANGE, "the conversation is longer than the context (%d "
                         "tokens; see -c)", s->o->n_ctx);
            break;
        }
        st = kv_seq_reserve(&s->pool, &s->seq, p0 + (int32_t)take, e);
        if (st == SMELT_OK && s->seq.restore >= 0) { /* a rollback's snapshot */
            st = model_state_copy(s->m, s->kv, s->seq.slot, s->seq.restore, e);
            s->seq.restore = -1;
        }
        if (st != SMELT_OK) break;
        for (size_t i = 0; i < take; i++) pos[i] = p0 + (int32_t)i;
        /* with recurrent layers, the state at the last block boundary is kept (a later
         * turn that rewrites the end of the conversation rolls back to it) */
        struct batch_seq view = kv_seq_step(&s->pool, &s->seq, p0, p0 + (int32_t)take, false);
        struct batch b = {(int32_t)take, ids + done, pos, seq, NULL, 1, &view};
        float *hid = mtp ? s->hid : NULL;
        if (done + take < n || !summary) { /* its last row's logits are not used */
            st = model_step_mtp(s->m, s->kv, &b, NULL, NULL, NULL, NULL, hid, e);
        } else {
            int32_t n_adj = sampler_request(s->smp, &s->req, s->adj, 0, model_adj_cap(1));
            if (n_adj < 0) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
            /* the next token's mask: the matcher has taken every token before it */
            if (st == SMELT_OK && s->gm) st = gram_matcher_fill_mask(s->gm, s->mask, e);
            struct model_sample ms = {.n_rows = 1,
                                      .rows = &s->req,
                                      .adj = s->adj,
                                      .n_adj = n_adj > 0 ? n_adj : 0,
                                      .sum = &s->sum,
                                      .cand = s->cand,
                                      .adj_raw = s->adj_raw,
                                      .mask = s->mask};
            if (st == SMELT_OK)
                st = model_step_mtp(s->m, s->kv, &b, NULL, &ms, NULL, NULL, hid, e);
                                    }
                                    for (size_t i = 0; i < take && st == SMELT_OK; i++)
            st = tok_ids_push(&s->cached, ids[done + i]);
        if (st == SMELT_OK && mtp) { /* the rows whose next token is known; the last is held */
            int32_t known = (int32_t)take - (done + take == n);
            if (known > 0) st = observe(s, p0, known, s->hid, ids + done + 1, e);
            if (known < (int32_t)take) {
                size_t E = (size_t)s->m->hp.n_embd;
                memcpy(s->hold, s->hid + (size_t)known * E, E * sizeof *s->hold);
                s->hold_pos = p0 + known;
            }
        }
        done += take;
    }
    free(pos);
    free(seq);
    return st;
}

/* Generates up to n_predict tokens after the fed prompt, streaming them to stdout and
 * appending them to answer. */
/* Writes a reply's text: as is, or (harmony) parsed, its reasoning to stderr and its
 * content to stdout and the answer. */
static smelt_status emit(struct session *s, struct outp *op, const char *p, size_t n, bool end,
                         struct tok_buf *answer, struct err *e) {
    if (!s->harmony) {
        if (!n) return SMELT_OK;
        fwrite(p, 1, n, stdout);
        fflush(stdout);
        return append(answer, p, n, e);
    }
    struct outp_delta d = {0};
    if (n) outp_push(op, p, n, &d);
    if (end) outp_finish(op, &d);
    if (d.reasoning.n) fwrite(d.reasoning.p, 1, d.reasoning.n, stderr);
    if (d.content.n) fwrite(d.content.p, 1, d.content.n, stdout);
    fflush(stdout);
    smelt_status st = d.content.n ? append(answer, d.content.p, d.content.n, e) : SMELT_OK;
    if (st == SMELT_OK && (op->bad || d.content.oom || d.reasoning.oom))
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
    outp_delta_free(&d);
    return st;
}

/* The K/V hold n_kv positions (the first cached.n are the cached tokens); keeps the first
 * n <= cached.n: K/V truncate; a recurrent state restarts from a snapshot and the tokens
 * after it are fed again. */
static smelt_status cache_keep(struct session *s, size_t n_kv, size_t n, struct err *e) {
    if (n >= n_kv) return SMELT_OK;
    int32_t from = (int32_t)n;
    kv_seq_rollback(&s->pool, &s->seq, (int32_t)n, &from);
    size_t again = n - (size_t)from;
    s->cached.n = (size_t)from;
    if (!again && s->seq.restore >= 0) { /* kept exactly to a snapshot: restore it now (a
                                          * verify step, unlike feed, does not) */
        smelt_status st = model_state_copy(s->m, s->kv, s->seq.slot, s->seq.restore, e);
        s->seq.restore = -1;
        return st;
    }
    if (!again) return SMELT_OK;
    int32_t *ids = malloc(again * sizeof *ids);
    if (!ids) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    memcpy(ids, s->cached.v + from, again * sizeof *ids);
    smelt_status st = feed(s, ids, again, false, e);
    free(ids);
    return st;
}

/* The next token from the last fed row's summary (its full row when the sampler asks). */
static smelt_status sample_last(struct session *s, struct sample_result *r, struct err *e) {
    smelt_status st = sampler_finish(s->smp, &s->sum, s->cand, s->adj_raw, NULL, r, e);
    if (st == SMELT_OK && r->token == SAMPLE_NEED_ROW) {
        st = model_fetch_rows(s->m, 0, 1, s->logits, e);
        if (st == SMELT_OK) st = sampler_finish(s->smp, &s->sum, s->cand, s->adj_raw, s->logits, r, e);
    }
    return st;
}

/* Row j of the last verify step, for spec_verify. */
static void verify_get(void *ctx, int32_t j, const struct topk_row **req,
                       const struct topk_summary **sum, const struct topk_cand **cand,
                       const float **adj_raw) {
    struct session *s = ctx;
    if (s->vmask) /* row j's draw and its full row see row j's mask */
        sampler_set_mask(s->smp, s->vmask + (size_t)j * topk_mask_words(s->m->hp.n_vocab));
    *req = &s->vreq[j];
    *sum = &s->vsum[j];
    *cand = s->vcand + (size_t)j * TOPK_MAX;
    *adj_raw = s->vraw + s->vreq[j].adj_off;
}

static const float *verify_full(void *ctx, int32_t j, struct err *e) {
    struct session *s = ctx;
    return model_fetch_rows(s->m, j, 1, s->logits, e) == SMELT_OK ? s->logits : NULL;
}

/* Drafts after the pending token t (not fed yet): s->ss.n_draft of them (0: none), at most
 * left - 1 (the step emits up to one more). */
static smelt_status propose(struct session *s, int32_t t, int left, struct err *e) {
    s->ss.n_draft = 0;
    int32_t k = s->sp ? spec_want(s->sp, &s->ss, 1) : 0;
    int32_t room = s->o->n_ctx - (int32_t)s->cached.n - 1;
    if (k > left - 1) k = left - 1;
    if (k > room) k = room;
    if (k <= 0) return SMELT_OK;
    struct err e2;
    if (kv_seq_reserve(&s->pool, &s->seq, (int32_t)s->cached.n + 1 + k, &e2) != SMELT_OK)
        return SMELT_OK; /* no room for drafts: a plain step */
    smelt_status st = tok_ids_push(&s->cached, t); /* the proposer reads t after the cache */
    if (st != SMELT_OK) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    struct spec_job job = {&s->ss, s->cached.v, (int32_t)s->cached.n, k, kv_seq_view(&s->seq),
                           s->o->sp.temperature};
    st = spec_propose(s->sp, &job, 1, e);
    s->cached.n--;
    if (st == SMELT_OK && s->gm && s->ss.n_draft > 0) {
        /* the grammar's cut: the matcher (after t) takes the run of drafts it allows, and
         * gives them back; a refused draft and those after it are never verified, nor is
         * a draft that completes the answer (the row after it would have nothing to draw:
         * the row before it draws it, and the answer ends there) */
        int32_t took = 0;
        while (took < s->ss.n_draft &&
               gram_matcher_accept(s->gm, s->ss.draft[took], e) == SMELT_OK) {
            took++;
            if (gram_matcher_ended(s->gm)) {
                took--;
                st = gram_matcher_rollback(s->gm, 1, e);
                break;
            }
        }
        if (st == SMELT_OK && took > 0) st = gram_matcher_rollback(s->gm, took, e);
        s->ss.n_draft = took;
    }
    return st;
}

/* Feeds the pending token t and the drafts as one step and verifies them: s->vout[0..*n)
 * gets the accepted drafts and then the token the step emits after them. The cache then
 * holds t and the accepted drafts. */
static smelt_status feed_verify(struct session *s, int32_t t, int32_t *n, struct err *e) {
    int32_t nd = s->ss.n_draft, rows = nd + 1, p0 = (int32_t)s->cached.n;
    int32_t tok[SPEC_K_MAX + 1], pos[SPEC_K_MAX + 1], seq[SPEC_K_MAX + 1];
    uint8_t want[SPEC_K_MAX + 1];
    int32_t cap = model_adj_cap(rows), off = 0;
    for (int32_t j = 0; j < rows; j++) {
        tok[j] = j ? s->ss.draft[j - 1] : t;
        pos[j] = p0 + j;
        seq[j] = 0;
        want[j] = 1;
        /* row j's request: the history after drafts 1..j */
        int32_t got = sampler_request(s->smp, &s->vreq[j], s->vadj + off, off, cap - off);
        if (got > 0) off += got;
        if (j < nd) sampler_accept(s->smp, s->ss.draft[j], true);
    }
    sampler_unaccept(s->smp, nd);
    smelt_status st = SMELT_OK;
    if (s->gm) { /* row j's mask: the matcher after t and drafts 1..j (propose checked them) */
        size_t words = topk_mask_words(s->m->hp.n_vocab);
        int32_t took = 0;
        for (int32_t j = 0; j < rows && st == SMELT_OK; j++) {
            st = gram_matcher_fill_mask(s->gm, s->vmask + (size_t)j * words, e);
            if (st == SMELT_OK && j < nd &&
                (st = gram_matcher_accept(s->gm, tok[j + 1], e)) == SMELT_OK)
                took++;
        }
        if (took > 0) {
            smelt_status st2 = gram_matcher_rollback(s->gm, took, e);
            if (st == SMELT_OK) st = st2;
        }
        if (st != SMELT_OK) return st;
    }
    struct batch_seq view = kv_seq_step(&s->pool, &s->seq, p0, p0 + rows, false);
    struct batch b = {rows, tok, pos, seq, want, 1, &view};
    struct model_sample ms = {.n_rows = rows,
                              .rows = s->vreq,
                              .adj = s->vadj,
                              .n_adj = off,
                              .sum = s->vsum,
                              .cand = s->vcand,
                              .adj_raw = s->vraw,
                              .mask = s->vmask};
    bool mtp = spec_wants_hidden(s->sp);
    st = model_step_mtp(s->m, s->kv, &b, NULL, &ms, NULL, NULL, mtp ? s->hid : NULL, e);
    struct spec_rows src = {verify_get, verify_full, s};
    int32_t n_full = 0;
    *n = 0;
    if (st == SMELT_OK) st = spec_verify(s->smp, true, &s->ss, &src, s->vout, n, &n_full, e);
    if (s->vmask) sampler_set_mask(s->smp, s->mask); /* the one-row steps' mask again */
    if (st != SMELT_OK) return st;
    int32_t acc = *n - 1;
    spec_commit(s->sp, &s->ss, acc, p0 + 1 + acc);
    if (mtp) { /* the kept rows: t and the accepted drafts, each followed by the next */
        int32_t next[SPEC_K_MAX + 1];
        for (int32_t j = 0; j <= acc; j++) next[j] = j < acc ? tok[j + 1] : s->vout[acc].token;
        st = observe(s, p0, acc + 1, s->hid, next, e);
        if (st != SMELT_OK) return st;
    }
    s->n_spec_steps++;
    for (int32_t j = 0; j <= acc && st == SMELT_OK; j++) st = tok_ids_push(&s->cached, tok[j]);
    if (st == SMELT_OK && acc < nd) /* the rejected rows' K/V go */
        st = cache_keep(s, (size_t)(p0 + rows), (size_t)(p0 + 1 + acc), e);
    return st;
}

/* Generates up to n_predict tokens after the fed prompt, streaming them to stdout and
 * appending them to answer. A sampled token is fed with the next step; the last one only
 * when a next turn continues after it. */
static smelt_status generate(struct session *s, struct tok_buf *answer, struct err *e) {
    struct tok_detok d;
    struct tok_buf out = {0};
    struct outp op;
    /* harmony's headers are special tokens: the parser needs them */
    tok_detok_init(&d, s->tok, s->harmony ? TOK_DECODE_SPECIAL : 0);
    outp_init(&op, OUTP_HARMONY, true, false);
    op.no_calls = true;
    double t0 = clock_now();
    int n = 0;
    struct sample_result r;
    smelt_status st = sample_last(s, &r, e);
    if (st == SMELT_OK && r.token >= 0) st = observe_held(s, r.token, e);
    /* r.token is pending: sampled, not fed. A verify step emits accepted drafts (fed, in
     * the cache) and then a new pending token. */
    int32_t emit_q[SPEC_K_MAX + 1], n_q = 0, q_at = 0;
    size_t fed_at = 0; /* cache position of emit_q[0] */
    while (st == SMELT_OK) {
        int32_t t = q_at < n_q ? emit_q[q_at] : r.token;
        bool fed = q_at < n_q; /* an accepted draft: already in the cache */
        bool eog = !s->o->ignore_eos && tok_is_eog(s->tok, t);
        if (s->gm && (st = gram_matcher_accept(s->gm, t, e)) != SMELT_OK) break;
        if (s->gm && gram_matcher_ended(s->gm)) /* the answer is complete: nothing can follow */
            eog = eog || tok_is_eog(s->tok, t);
        if (!eog) {
            sampler_accept(s->smp, t, true);
            out.n = 0;
            st = tok_detok_push(&d, t, &out, e);
            if (st == SMELT_OK && out.n) st = emit(s, &op, out.p, out.n, false, answer, e);
            if (st != SMELT_OK) break;
            n++;
        }
        if (eog || n >= s->o->n_predict || (s->gm && gram_matcher_ended(s->gm))) {
            /* the conversation goes on after this token (the end-of-turn token too: the next
             * turn's rendering has it): the cache must end with it */
            if (s->o->interactive)
                st = fed ? cache_keep(s, s->cached.n, fed_at + (size_t)q_at + 1, e)
                         : feed(s, &t, 1, true, e);
            break;
        }
        if (fed) {
            q_at++;
            continue;
        }
        st = propose(s, t, s->o->n_predict - n, e);
        if (st != SMELT_OK) break;
        if (s->ss.n_draft > 0) {
            int32_t m = 0;
            fed_at = s->cached.n + 1;
            st = feed_verify(s, t, &m, e);
            if (st != SMELT_OK) break;
            for (int32_t i = 0; i + 1 < m; i++) emit_q[i] = s->vout[i].token;
            n_q = m - 1;
            q_at = 0;
            r = s->vout[m - 1];
        } else {
            st = feed(s, &t, 1, true, e);
            if (st == SMELT_OK) st = sample_last(s, &r, e);
            if (st == SMELT_OK && r.token >= 0) st = observe_held(s, r.token, e);
        }
    }
    out.n = 0;
    if (st == SMELT_OK) st = tok_detok_flush(&d, &out, e);
    if (st == SMELT_OK) st = emit(s, &op, out.p, out.n, true, answer, e);
    fputc('\n', stdout);
    fflush(stdout);
    tok_buf_free(&out);
    outp_free(&op);
    s->t_gen += clock_now() - t0;
    s->n_gen += n;
    return st;
}

static smelt_status add_message(struct session *s, const char *role, const char *content,
                                struct err *e) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(s->messages, m))
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    return SMELT_OK;
}

/* The text of a special token as a C string in buf (the vocab's text is not
 * NUL-terminated), or NULL when the vocab has none. */
static const char *token_text(const struct tok *t, int32_t id, char *buf, size_t size) {
    size_t n = 0;
    const char *p = id >= 0 ? tok_token_text(t, id, &n) : NULL;
    if (!p || n >= size) return NULL;
    memcpy(buf, p, n);
    buf[n] = 0;
    return buf;
}

/* The tokens of this turn's prompt: the raw text (continuing after what is cached), or
 * the whole conversation rendered by the chat template. */
static smelt_status render(struct session *s, const char *user, struct tok_ids *ids, struct err *e) {
    if (!s->tmpl) {
        unsigned flags = TOK_PARSE_SPECIAL | (s->cached.n == 0 ? TOK_ADD_SPECIAL : 0);
        return tok_encode(s->tok, user, strlen(user), flags, ids, e);
    }
    smelt_status st = add_message(s, "user", user, e);
    struct tmpl_value *ctx = NULL;
    const struct tok_special *sp = tok_specials(s->tok);
    char bos[128], eos[128];
    if (st == SMELT_OK)
        st = tmpl_chat_ctx(s->messages, NULL, true, token_text(s->tok, sp->bos, bos, sizeof bos),
                           token_text(s->tok, sp->eos, eos, sizeof eos), NULL, &ctx, e);
    char *text = NULL;
    size_t len = 0;
    if (st == SMELT_OK) st = tmpl_render(s->tmpl, ctx, NULL, &text, &len, e);
    tmpl_value_free(ctx);
    /* the template writes the special tokens (BOS included) itself */
    if (st == SMELT_OK) st = tok_encode(s->tok, text, len, TOK_PARSE_SPECIAL, ids, e);
    free(text);
    if (st != SMELT_OK) err_prefix(e, "chat template");
    return st;
}

/* One turn: keep the cached tokens the new prompt starts with, feed the rest, generate.
 * With -i, a line on stderr says what the turn prefilled and what it reused. */
static smelt_status turn(struct session *s, const char *user, struct err *e) {
    struct tok_ids ids = {0};
    smelt_status st = render(s, user, &ids, e);
    if (st != SMELT_OK) return st;
    const int32_t *feed_ids = ids.v;
    size_t n_feed = ids.n, reused = s->cached.n; /* raw: the new text continues the cache */
    if (s->tmpl) {
        /* the rendering holds the whole conversation: reuse the common prefix's cache
         * (at least one token must be fed, for its logits) */
        size_t common = 0;
        while (common < ids.n && common < s->cached.n && ids.v[common] == s->cached.v[common])
            common++;
        if (common == ids.n && common > 0) common--;
        if (common < s->cached.n) {
            /* KV layers truncate; a recurrent state restarts from the newest snapshot at or
             * before common, and the tokens after it are fed again */
            int32_t from = 0;
            kv_seq_rollback(&s->pool, &s->seq, (int32_t)common, &from);
            common = (size_t)from;
        }
        s->cached.n = common;
        sampler_reset_history(s->smp);
        for (size_t i = 0; i < common; i++) sampler_accept(s->smp, ids.v[i], false);
        feed_ids += common;
        n_feed -= common;
        reused = common;
    }
    double t0 = clock_now();
    for (size_t i = 0; i < n_feed; i++) sampler_accept(s->smp, feed_ids[i], false);
    if (s->gm) gram_matcher_reset(s->gm); /* each answer is a sentence of the grammar */
    if (ids.n == 0) st = err_set(e, SMELT_ERR_INVALID, "the prompt is empty");
    if (st == SMELT_OK) st = feed(s, feed_ids, n_feed, true, e);
    s->t_prompt += clock_now() - t0;
    s->n_prompt += (int64_t)n_feed;
    tok_ids_free(&ids);
    struct tok_buf answer = {0};
    int64_t gen0 = s->n_gen;
    if (st == SMELT_OK) st = generate(s, &answer, e);
    if (st == SMELT_OK && s->o->interactive)
        fprintf(stderr,
                "turn %d: prompt %zu tokens (%zu reused from the cache), generation %lld "
                "tokens\n",
                ++s->n_turns, n_feed, reused, (long long)(s->n_gen - gen0));
    if (st == SMELT_OK && s->tmpl) st = add_message(s, "assistant", answer.p ? answer.p : "", e);
    tok_buf_free(&answer);
    return st;
}

/* Compiles the file's chat template; none: raw prompts. */
static smelt_status load_template(struct session *s, struct err *e) {
    struct gguf_str src = {0};
    if (!gguf_get(s->f, "tokenizer.chat_template")) {
        fprintf(stderr, "smelt run: the model has no chat template (a base model?): the prompt "
                        "is used as is\n");
        return SMELT_OK;
    }
    smelt_status st = gguf_get_str(s->f, "tokenizer.chat_template", &src, e);
    if (st != SMELT_OK) return st;
    st = tmpl_compile(src.ptr, (size_t)src.len, &s->tmpl, e);
    if (st != SMELT_OK) return err_prefix(e, "tokenizer.chat_template");
    char *z = strndup(src.ptr, (size_t)src.len);
    if (!z) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    s->harmony = outp_template_harmony(z);
    free(z);
    s->messages = json_array();
    if (!s->messages) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    if (s->o->system) return add_message(s, "system", s->o->system, e);
    return SMELT_OK;
}

/* --json-schema FILE / --grammar FILE: the grammar every answer follows (its tokens masked
 * before sampling, as the server's response_format and grammar fields do). */
static smelt_status load_grammar(struct session *s, struct err *e) {
    const struct opts *o = s->o;
    if (o->schema_file && o->grammar_file)
        return err_set(e, SMELT_ERR_INVALID, "--json-schema and --grammar: give one of them");
    const char *path = o->schema_file ? o->schema_file : o->grammar_file;
    char *text = NULL;
    size_t len = 0;
    smelt_status st = file_read_all(path, &text, &len, e);
    if (st != SMELT_OK) {
        free(text);
        return err_prefix(e, "%s", path);
    }
    st = gram_vocab_new(&s->gv, s->tok, 0, e);
    if (st == SMELT_OK) {
        st = gram_compile(&s->gram, s->gv, o->schema_file ? GRAM_JSON_SCHEMA : GRAM_GBNF, text, len, e);
        if (st != SMELT_OK) err_prefix(e, "%s", path);
    }
    free(text);
    /* with speculation the matcher checks a run of drafts and gives it back */
    if (st == SMELT_OK) st = gram_matcher_new(&s->gm, s->gram, s->sp ? SPEC_K_MAX : 0, e);
    if (st != SMELT_OK) return st;
    size_t words = topk_mask_words(s->m->hp.n_vocab);
    s->mask = calloc(words, sizeof *s->mask);
    if (!s->mask) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    if (s->sp && !(s->vmask = calloc(words * (SPEC_K_MAX + 1), sizeof *s->vmask)))
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    sampler_set_mask(s->smp, s->mask);
    return SMELT_OK;
}

static void session_free(struct session *s) {
    sampler_free(s->smp);
    gram_matcher_free(s->gm);
    gram_unref(s->gram);
    gram_vocab_free(s->gv);
    free(s->mask);
    free(s->vmask);
    spec_free(s->sp);
    spec_seq_free(&s->ss);
    free(s->hid);
    free(s->hold);
    free(s->vcand);
    free(s->vadj);
    free(s->vraw);
    cli_spec_free(&s->o->spec);
    kv_seq_release(&s->pool, &s->seq);
    kv_pool_free(&s->pool);
    if (s->m) model_kv_free(s->m, s->kv);
    model_free(s->m);
    tok_free(s->tok);
    bk_free(s->bk);
    gguf_close(s->f);
    tok_ids_free(&s->cached);
    free(s->logits);
    free(s->adj);
    free(s->adj_raw);
    tmpl_free(s->tmpl);
    json_decref(s->messages);
}

int cmd_run(int argc, char **argv) {
    struct opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    struct err e;
    err_clear(&e);
    struct session s = {.o = &o};
    char path[4096];
    smelt_status st = cli_resolve_model(o.model, true, path, sizeof path, &e);
    if (st == SMELT_OK) st = gguf_open(&s.f, path, &e);
    if (st == SMELT_OK)
        st = tok_new_from_gguf(&s.tok, s.f, &(struct tok_opts){.allow_unknown_pre = o.allow_unknown_pre},
                               &e);
    if (st == SMELT_OK) st = cli_backend_new(o.backend, o.device, o.threads, &s.bk, &e);
    if (st == SMELT_OK) st = cli_model_load(path, s.f, s.bk, o.n_cpu_moe, o.threads, &s.m, &e);
    uint32_t kv_type = o.f32_kv ? QT_F32 : QT_F16;
    struct spec_config scfg = {0};
    if (st == SMELT_OK) st = cli_spec_config(&o.spec, &scfg, &e);
    if (st == SMELT_OK && scfg.kind != SPEC_OFF) spec_config_defaults(&scfg);
    int32_t max_out = scfg.kind != SPEC_OFF ? scfg.k_max + 1 : 1;
    if (st == SMELT_OK) { /* a draft (its steps: the prompt's chunks, then one row) */
        struct memplan_shape dsh = {.max_tokens = PREFILL_CHUNK, .max_seqs = 1, .max_out = 1,
                                    .n_ctx = o.n_ctx, .block_size = BLOCK, .kv_type = kv_type};
        st = cli_spec_load(&o.spec, o.backend, o.device, o.threads, s.tok, s.m, &dsh, &e);
    }
    if (st == SMELT_OK) {
        /* the memory plan: one sequence, prefill chunks of PREFILL_CHUNK, one logits row (a
         * verify step's k + 1) */
        struct cli_mem_req r = {
            .cmd = "run", .f = s.f, .need = o.n_ctx, .min_tokens = o.n_ctx,
            .n_slots = model_is_recurrent(s.m) ? RUN_SLOTS : 0,
            .extra_per_token = cli_spec_kv_bytes(&o.spec, kv_type),
            .shape = {.max_tokens = PREFILL_CHUNK, .max_seqs = 1, .max_out = max_out,
                      .n_ctx = o.n_ctx, .block_size = BLOCK, .kv_type = kv_type}};
        int64_t t = 0;
        st = cli_mem_plan(s.m, &r, &t, &e);
    }
    if (st == SMELT_OK) {
        int32_t n_blocks = (o.n_ctx + BLOCK - 1) / BLOCK;
        int32_t n_slots = model_is_recurrent(s.m) ? RUN_SLOTS : 0;
        st = model_kv_new(s.m, kv_type, BLOCK, n_blocks, n_slots, &s.kv, &e);
        if (st == SMELT_OK) st = kv_pool_init(&s.pool, n_blocks, BLOCK, &e);
        if (st == SMELT_OK && scfg.kind != SPEC_OFF) {
            st = cli_spec_kv(&o.spec, kv_type, BLOCK, n_blocks, &scfg, &e);
            if (st == SMELT_OK)
                st = spec_new(&s.sp, &scfg, s.m, s.m->hp.n_vocab, n_blocks, BLOCK, PREFILL_CHUNK, 1, &e);
            spec_seq_init(&s.ss, o.sp.seed);
            s.vcand = malloc((SPEC_K_MAX + 1) * TOPK_MAX * sizeof *s.vcand);
            s.vadj = malloc((size_t)model_adj_cap(SPEC_K_MAX + 1) * sizeof *s.vadj);
            s.vraw = malloc((size_t)model_adj_cap(SPEC_K_MAX + 1) * sizeof *s.vraw);
            size_t E = (size_t)s.m->hp.n_embd;
            s.hold_pos = -1;
            if (st == SMELT_OK && spec_wants_hidden(s.sp)) {
                s.hid = malloc((size_t)PREFILL_CHUNK * E * sizeof *s.hid);
                s.hold = malloc(E * sizeof *s.hold);
            }
            if (st == SMELT_OK && (!s.vcand || !s.vadj || !s.vraw ||
                                   (spec_wants_hidden(s.sp) && (!s.hid || !s.hold))))
                st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
        }
        if (st == SMELT_OK && n_slots) st = kv_slots_enable(&s.pool, n_slots, 1, &e);
        gguf_sampling(s.f, &o);
        if (o.verbose) print_sampling(&o);
        if (st == SMELT_OK) st = sample_params_check(&o.sp, s.m->hp.n_vocab, &e);
        if (st == SMELT_OK) st = sampler_new(&s.smp, &o.sp, s.m->hp.n_vocab, &e);
        if (st == SMELT_OK && (o.schema_file || o.grammar_file)) st = load_grammar(&s, &e);
        s.logits = malloc((size_t)s.m->hp.n_vocab * sizeof(float));
        s.adj = malloc((size_t)model_adj_cap(1) * sizeof *s.adj);
        s.adj_raw = malloc((size_t)model_adj_cap(1) * sizeof *s.adj_raw);
        if (st == SMELT_OK && (!s.logits || !s.adj || !s.adj_raw))
            st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
        if (st == SMELT_OK && !o.raw) st = load_template(&s, &e);
        if (st == SMELT_OK && s.harmony && s.gm)
            st = err_set(&e, SMELT_ERR_UNSUPPORTED, "%s with the harmony format (gpt-oss): smelt serve "
                         "constrains its final channel; smelt run does not yet",
                         o.schema_file ? "--json-schema" : "--grammar");
    }
    kv_seq_init(&s.seq);
    if (st != SMELT_OK) {
        session_free(&s);
        return cli_fail("run", &e);
    }

    char *text = NULL;
    if (!o.interactive) {
        size_t text_len;
        if (!o.prompt && (st = file_read_all("-", &text, &text_len, &e)) == SMELT_OK)
            o.prompt = text;
        if (st == SMELT_OK) st = turn(&s, o.prompt, &e);
    } else {
        if (o.prompt) st = turn(&s, o.prompt, &e);
        char line[8192];
        while (st == SMELT_OK) {
            fprintf(stderr, "> ");
            fflush(stderr);
            if (!fgets(line, sizeof line, stdin)) break;
            line[strcspn(line, "\n")] = 0;
            if (!line[0]) continue;
            st = turn(&s, line, &e);
        }
    }
    free(text);
    if (st == SMELT_OK)
        fprintf(stderr, "prompt: %lld tokens, %.1f tok/s; generation: %lld tokens, %.1f tok/s\n",
                (long long)s.n_prompt, s.t_prompt > 0 ? (double)s.n_prompt / s.t_prompt : 0.0,
                (long long)s.n_gen, s.t_gen > 0 ? (double)s.n_gen / s.t_gen : 0.0);
    if (st == SMELT_OK && s.sp)
        fprintf(stderr, "speculation (%s): %llu proposed, %llu accepted (%.1f%%), %lld verify "
                        "steps\n",
                spec_kind_name(spec_get_config(s.sp)->kind), (unsigned long long)s.ss.n_proposed,
                (unsigned long long)s.ss.n_accepted,
                s.ss.n_proposed ? 100.0 * (double)s.ss.n_accepted / (double)s.ss.n_proposed : 0.0,
                (long long)s.n_spec_steps);
    rc = st == SMELT_OK ? 0 : cli_fail("run", &e);
    session_free(&s);
    return rc;
}

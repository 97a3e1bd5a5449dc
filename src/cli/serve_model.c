/* Loading one model of `smelt serve` (serve_model.h). */
#include "cli/serve_model.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/climem.h"
#include "cli/clibackend.h"
#include "cli/clispec.h"
#include "cli/modelref.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "model/model.h"
#include "template/tmpl.h"
#include "template/tmpl_source.h"
#include "tokenizer/tok.h"
#include "util/log.h"

#define CPU_KV_TOKENS_DEFAULT 32768

/* ---- the fake forward: fixed logits, no compute ---- */

/* Each logits row is zeroed once; after that a step only moves its one hot entry, so the
 * fake costs next to nothing and what is measured is the engine's and the server's own
 * work (the argmax over the whole row included). */
struct fake {
    int32_t n_vocab, lo, span; /* next token drawn from [lo, lo + span) */
    double step_ms;
    int32_t fail_at;           /* > 0: a step with a row at this position or later fails */
    int32_t *hot;              /* (rows_ready) the hot index of each row */
    int32_t rows_ready;
    /* --fake-reply: the reply's tokens, then eos. A sequence is known by its first KV block;
     * start[block] is the position of its last prompt token (where the reply begins). */
    int32_t *script, n_script, eos;
    int32_t *start, n_start;
};

/* The next token of a --fake-reply sequence whose row is token tok at pos: the reply
 * continues when tok is the reply's token at pos - 1, else a new reply begins here. */
static int32_t fake_script_next(struct fake *f, int32_t block, int32_t tok, int32_t pos) {
    if (block < 0 || block >= f->n_start) return f->eos;
    int32_t s = f->start[block];
    int32_t k = pos - s;
    if (s < 0 || k < 1 || k > f->n_script || f->script[k - 1] != tok) {
        f->start[block] = pos;
        k = 0;
    }
    return k < f->n_script ? f->script[k] : f->eos;
}

static smelt_status fake_forward(void *ctx, const struct batch *b, float *logits, struct err *e) {
    struct fake *f = ctx;
    int32_t k = 0;
    for (int32_t i = 0; f->fail_at > 0 && i < b->n_tokens; i++)
        if (b->pos[i] >= f->fail_at)
            return err_set(e, SMELT_ERR_INTERNAL, "fake forward: position %d (--fake-fail-at %d)",
                           b->pos[i], f->fail_at);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (!b->logits[i]) continue;
        float *row = logits + (size_t)k * (size_t)f->n_vocab;
        if (k >= f->rows_ready) {
            int32_t *h = realloc(f->hot, (size_t)(k + 1) * sizeof *h);
            if (!h) return err_set(e, SMELT_ERR_NOMEM, "fake forward: out of memory");
            f->hot = h;
            memset(row, 0, (size_t)f->n_vocab * sizeof *row);
            f->rows_ready = k + 1;
        } else {
            row[f->hot[k]] = 0.0f;
        }
        if (f->script) {
            const struct batch_seq *sq = &b->seqs[b->seq[i]];
            f->hot[k] = fake_script_next(f, sq->n_blocks > 0 ? sq->blocks[0] : -1, b->token[i],
                                         b->pos[i]);
        } else {
            uint32_t hh = (uint32_t)b->token[i] * 2654435761u ^ (uint32_t)b->pos[i] * 40503u;
            f->hot[k] = f->lo + (int32_t)(hh % (uint32_t)f->span);
        }
        row[f->hot[k]] = 30.0f;
        k++;
    }
    if (f->step_ms > 0) {
        struct timespec ts = {(time_t)(f->step_ms / 1000), (long)(fmod(f->step_ms, 1000) * 1e6)};
        nanosleep(&ts, NULL);
    }
    return SMELT_OK;
}

/* The fake of model ci: fixed logits, or its --fake-reply script. */
static smelt_status fake_init(struct fake *fk, const struct cfg *c, int ci, const struct tok *tok,
                              int32_t n_blocks, struct err *e) {
    fk->n_vocab = tok_n_vocab(tok);
    fk->lo = fk->n_vocab > 512 ? 300 : 0;
    fk->span = fk->n_vocab - fk->lo > 200 ? 200 : fk->n_vocab - fk->lo;
    fk->step_ms = cfg_num(c, ci, CFG_FAKE_STEP_MS);
    fk->fail_at = (int32_t)cfg_int(c, ci, CFG_FAKE_FAIL_AT);
    if (fk->span <= 0) return err_set(e, SMELT_ERR_INVALID, "--fake-forward: vocabulary too small");
    const char *reply = cfg_str(c, ci, CFG_FAKE_REPLY);
    if (!reply) return SMELT_OK;
    struct tok_ids r = {0};
    fk->eos = tok_specials(tok)->eos;
    fk->n_start = n_blocks;
    fk->start = malloc((size_t)fk->n_start * sizeof *fk->start);
    smelt_status st = tok_encode(tok, reply, strlen(reply), TOK_PARSE_SPECIAL, &r, e);
    if (st == SMELT_OK && (!fk->start || fk->eos < 0))
        st = err_set(e, fk->start ? SMELT_ERR_INVALID : SMELT_ERR_NOMEM, "--fake-reply: %s",
                     fk->start ? "the vocabulary has no eos" : "out of memory");
    if (st == SMELT_OK) {
        for (int32_t i = 0; i < fk->n_start; i++) fk->start[i] = -1;
        fk->script = r.v;
        fk->n_script = (int32_t)r.n;
        r.v = NULL;
    }
    tok_ids_free(&r);
    return st;
}

static void fake_free(struct fake *fk) {
    free(fk->hot);
    free(fk->script);
    free(fk->start);
}

/* ---- a loaded model ---- */

struct serve_inst {
    char path[4096];
    struct gguf_file *f;
    struct tok *tok;
    struct backend *bk;
    struct model *m;
    struct kv_store *kv;
    struct engine *en;
    struct tmpl *tm, *tm_tools;
    struct tmpl_sources ct;
    char *bos, *eos;
    struct cli_spec spec; /* speculative decoding: the draft model (its own backend and KV) */
    struct fake fk;
    bool fake, cuda;
    uint64_t used_b; /* device bytes it holds */
};

static char *token_text(const struct tok *t, int32_t id) {
    if (id < 0) return NULL;
    size_t n;
    const char *s = tok_token_text(t, id, &n);
    return s ? strndup(s, n) : NULL;
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* A KV pool on the CPU: CPU_KV_TOKENS_DEFAULT tokens, or what a quarter of the available
 * memory holds when that is less (at least 1024). */
static int64_t cpu_kv_tokens(uint64_t per_token) {
    int64_t t = CPU_KV_TOKENS_DEFAULT;
    uint64_t avail = mem_available() / 4;
    if (per_token && avail && (uint64_t)t * per_token > avail) t = (int64_t)(avail / per_token);
    if (t < 1024) t = 1024;
    return t;
}

/* The sampling defaults of model ci: the file's general.sampling.* (as smelt run reads
 * them), then its settings. The file's values are checked (a file with an out-of-range
 * value would fail every request): a bad one is dropped with a warning. The penalty
 * window counts like llama.cpp's penalty_last_n: -1 all, 0 none (a repetition penalty
 * that no setting gave is then off), N the last N tokens. Prints one line saying what is in
 * effect and where each value came from. */
static void sampling_defaults(const struct cfg *c, int ci, const struct gguf_file *f,
                              const char *name, int32_t n_ctx, int32_t n_vocab,
                              struct server_model *sm) {
    struct sample_params *p = &sm->defaults, d;
    sample_params_default(p);
    d = *p;
    float x;
    uint32_t k;
    int64_t n, last_n = -1;
    bool have_last = false;
    /* where each came from: 0 the default, 1 the file, 2 a setting */
    enum { TEMP, TOP_K, TOP_P, MIN_P, REP, LAST_N, NSRC };
    int src[NSRC] = {0};
    if (gguf_get_f32(f, "general.sampling.temp", &x, NULL) == SMELT_OK) p->temperature = x, src[TEMP] = 1;
    if (gguf_get_u32(f, "general.sampling.top_k", &k, NULL) == SMELT_OK && k <= INT32_MAX)
        p->top_k = (int32_t)k, src[TOP_K] = 1;
    if (gguf_get_f32(f, "general.sampling.top_p", &x, NULL) == SMELT_OK) p->top_p = x, src[TOP_P] = 1;
    if (gguf_get_f32(f, "general.sampling.min_p", &x, NULL) == SMELT_OK) p->min_p = x, src[MIN_P] = 1;
    if (gguf_get_f32(f, "general.sampling.penalty_repeat", &x, NULL) == SMELT_OK)
        p->repetition_penalty = x, src[REP] = 1;
    if (gguf_get_i64(f, "general.sampling.penalty_last_n", &n, NULL) == SMELT_OK && n >= -1 &&
        n <= INT32_MAX)
        last_n = n, have_last = true, src[LAST_N] = 1;
    struct err e;
    struct sample_params t = *p;
    if (t.top_p == 0.0f) t.top_p = 1.0f; /* (greedy: the request path reads it so) */
    if (sample_params_check(&t, n_vocab, &e) != SMELT_OK) {
        log_warn("%s: the file's general.sampling.* defaults are not used: %s", name, e.msg);
        *p = d;
        last_n = -1;
        have_last = false;
        memset(src, 0, sizeof src);
    }
    static const enum cfg_key keys[NSRC] = {CFG_TEMP, CFG_TOP_K, CFG_TOP_P, CFG_MIN_P,
                                            CFG_REPEAT_PENALTY, CFG_REPEAT_LAST_N};
    for (int i = 0; i < NSRC; i++)
        if (cfg_has(c, ci, keys[i])) src[i] = 2;
    if (src[TEMP] == 2) p->temperature = (float)cfg_num(c, ci, CFG_TEMP);
    if (src[TOP_K] == 2) p->top_k = (int32_t)cfg_int(c, ci, CFG_TOP_K);
    if (src[TOP_P] == 2) p->top_p = (float)cfg_num(c, ci, CFG_TOP_P);
    if (src[MIN_P] == 2) p->min_p = (float)cfg_num(c, ci, CFG_MIN_P);
    if (src[REP] == 2) p->repetition_penalty = (float)cfg_num(c, ci, CFG_REPEAT_PENALTY);
    if (src[LAST_N] == 2) last_n = cfg_int(c, ci, CFG_REPEAT_LAST_N), have_last = true;
    if (!have_last || last_n < 0) {
        p->penalty_last_n = 0; /* the whole history */
    } else if (last_n == 0) {
        p->penalty_last_n = 0;
        if (src[LAST_N] == 2 || src[REP] != 2) p->repetition_penalty = 1.0f;
    } else {
        p->penalty_last_n = last_n >= n_ctx ? 0 : (int32_t)last_n;
    }
    sm->seed_set = cfg_has(c, ci, CFG_SEED);
    p->seed = (uint64_t)cfg_int(c, ci, CFG_SEED);
    char w[NSRC][96];
    for (int i = 0; i < NSRC; i++) {
        if (src[i] == 2) cfg_src_text(c, keys[i], cfg_get(c, ci, keys[i]), w[i], sizeof w[i]);
        else snprintf(w[i], sizeof w[i], "%s", src[i] ? "the file" : "default");
    }
    char seed[48] = "random", win[48] = "all tokens";
    if (sm->seed_set) snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    if (p->penalty_last_n > 0) snprintf(win, sizeof win, "the last %d tokens", p->penalty_last_n);
    if (engine_embd_size(sm->en) > 0) return; /* (nothing is sampled) */
    fprintf(stderr, "smelt serve: %s: sampling defaults: temperature %g (%s), top_k %d (%s), "
                    "top_p %g (%s), min_p %g (%s), repeat_penalty %g (%s) over %s (%s), seed %s\n",
            name, (double)p->temperature, w[TEMP], p->top_k, w[TOP_K], (double)p->top_p, w[TOP_P],
            (double)p->min_p, w[MIN_P], (double)p->repetition_penalty, w[REP], win, w[LAST_N], seed);
}

void serve_inst_free(struct serve_inst *in) {
    if (!in) return;
    engine_free(in->en);
    cli_spec_free(&in->spec);
    if (in->m && in->kv) model_kv_free(in->m, in->kv);
    model_free(in->m);
    bk_free(in->bk);
    tmpl_free(in->tm);
    tmpl_free(in->tm_tools);
    tmpl_sources_free(&in->ct);
    tok_free(in->tok);
    gguf_close(in->f);
    free(in->bos);
    free(in->eos);
    fake_free(&in->fk);
    free(in);
}

const char *serve_inst_path(const struct serve_inst *in) { return in->path; }
uint64_t serve_inst_device_bytes(const struct serve_inst *in) { return in->used_b; }

const char *serve_inst_describe(const struct serve_inst *in, char *buf, size_t n) {
    const struct engine_config *c = engine_config(in->en);
    snprintf(buf, n, "on %s: %d sequences, %d tokens per step, KV %d blocks of %d (%lld tokens), "
             "context %d, prefix cache %s, speculation %s",
             in->fake ? "a fake forward" : in->cuda ? "cuda" : "cpu", c->max_seqs,
             c->max_batch_tokens, c->n_blocks, c->block_size, (long long)c->n_blocks * c->block_size,
             c->n_ctx, c->no_prefix_cache ? "off" : "on", spec_kind_name(c->spec.kind));
    return buf;
}

smelt_status serve_inst_load(const struct cfg *c, int ci, const char *ref, const char *name,
                             uint64_t others_b, struct serve_inst **out, struct server_model *sm,
                             struct err *e) {
    *out = NULL;
    struct serve_inst *in = calloc(1, sizeof *in);
    if (!in) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    double delay_ms = cfg_num(c, ci, CFG_FAKE_LOAD_MS);
    if (delay_ms > 0) {
        struct timespec ts = {(time_t)(delay_ms / 1000), (long)(fmod(delay_ms, 1000) * 1e6)};
        nanosleep(&ts, NULL);
    }
    in->fake = cfg_bool(c, ci, CFG_FAKE_FORWARD);
    const char *backend = cfg_str(c, ci, CFG_BACKEND);
    const char *chat_template = cfg_str(c, ci, CFG_CHAT_TEMPLATE);
    int device = cfg_has(c, ci, CFG_DEVICE) ? (int)cfg_int(c, ci, CFG_DEVICE) : -1;
    int threads = (int)cfg_int(c, ci, CFG_THREADS);
    int64_t ctx_size = cfg_int(c, ci, CFG_CTX_SIZE), kv_size = cfg_int(c, ci, CFG_KV_SIZE);
    smelt_status st = cli_resolve_model(ref, true, in->path, sizeof in->path, e);
    if (st == SMELT_OK) st = gguf_open(&in->f, in->path, e);
    if (st == SMELT_OK)
        st = tok_new_from_gguf(&in->tok, in->f,
                               &(struct tok_opts){.allow_unknown_pre =
                                                      cfg_bool(c, ci, CFG_ALLOW_UNKNOWN_PRETOKENIZER)},
                               e);
    if (st == SMELT_OK && !in->fake) {
        in->cuda = cli_backend_is_cuda(backend);
        st = cli_backend_new(backend, device, threads, &in->bk, e);
        if (st == SMELT_OK) st = cli_model_load(in->path, in->f, in->bk, (int32_t)cfg_int(c, ci, CFG_N_CPU_MOE),
                                                threads, &in->m, e);
    }
    /* the chat templates: --chat-template, the model's (and its tool_use one), or the
     * ChatML default (template/tmpl_source.h) */
    if (st == SMELT_OK) st = tmpl_sources_load(&in->ct, in->f, chat_template, e);
    if (st == SMELT_OK) {
        st = tmpl_compile(in->ct.src, in->ct.len, &in->tm, e);
        if (st != SMELT_OK) err_prefix(e, "%s", chat_template ? chat_template : "chat template");
        if (st == SMELT_OK && in->ct.tool_use) {
            st = tmpl_compile(in->ct.tool_use, in->ct.tool_use_len, &in->tm_tools, e);
            if (st != SMELT_OK) err_prefix(e, "tokenizer.chat_template.tool_use");
        }
        const struct tok_special *sp = tok_specials(in->tok);
        in->bos = token_text(in->tok, sp->bos);
        in->eos = token_text(in->tok, sp->eos);
    }
    /* the KV pool */
    struct engine_config ec = {0};
    ec.max_seqs = (int32_t)cfg_int(c, ci, CFG_MAX_SEQS);
    ec.max_batch_tokens = (int32_t)cfg_int(c, ci, CFG_MAX_BATCH_TOKENS);
    /* the default step: 2048 tokens on a GPU, where a prompt's prefill rows ride with the
     * decodes in a quarter of the steps (H100, 2026-12-06, Qwen3-30B-A3B, 64 clients of
     * 555-token prompts: 1,856 tok/s at 512, 2,107 at 1024, 2,307 at 2048; inter-token p90
     * 43 -> 60 ms, time to first token p90 2.5 -> 1.5 s); the engine's 512 on the CPU, whose
     * steps of 2048 rows would hold every decoding sequence for seconds */
    if (ec.max_batch_tokens <= 0 && in->cuda) ec.max_batch_tokens = 2048;
    ec.itl_target_s = cfg_num(c, ci, CFG_ITL_TARGET_MS) / 1e3;
    ec.max_waiting = (int32_t)cfg_int(c, ci, CFG_MAX_WAITING);
    ec.block_size = cfg_int(c, ci, CFG_BLOCK_SIZE) > 0 ? (int32_t)cfg_int(c, ci, CFG_BLOCK_SIZE) : 16;
    ec.no_prefix_cache = cfg_bool(c, ci, CFG_NO_PREFIX_CACHE);
    uint32_t kv_type = cfg_bool(c, ci, CFG_F32_KV) ? QT_F32 : QT_F16;
    int32_t n_ctx_model = in->m ? in->m->hp.n_ctx_train : 0;
    int32_t n_slots = 0; /* recurrent state slots (engine/memplan.h) */
    if (st == SMELT_OK && in->m && model_is_recurrent(in->m)) {
        struct engine_config d = ec;
        engine_config_defaults(&d);
        n_slots = memplan_state_slots(d.max_seqs);
    }
    /* speculative decoding: the draft is loaded (and its scratch measured) before the
     * target's pool is sized; its KV has the pool's blocks, so its bytes per token are added
     * to the target's, and what it holds on the device to the model's share */
    in->spec = (struct cli_spec){.kind = cfg_str(c, ci, CFG_SPEC), .draft = cfg_str(c, ci, CFG_DRAFT),
                                 .k = (int)cfg_int(c, ci, CFG_SPEC_K),
                                 .max_batch = (int)cfg_int(c, ci, CFG_SPEC_MAX_BATCH),
                                 .fixed = cfg_bool(c, ci, CFG_SPEC_FIXED)};
    if (st == SMELT_OK) st = cli_spec_config(&in->spec, &ec.spec, e);
    /* a draft (or the MTP head) runs the engine's steps' rows */
    if (st == SMELT_OK && (in->spec.draft || ec.spec.kind == SPEC_MTP)) {
        struct engine_config d = ec;
        engine_config_defaults(&d);
        struct memplan_shape dsh = {.max_tokens = d.max_batch_tokens, .max_seqs = d.max_seqs,
                                    .max_out = d.max_seqs,
                                    .n_ctx = ctx_size > 0 ? (int32_t)ctx_size : 4096,
                                    .block_size = ec.block_size, .kv_type = kv_type};
        st = cli_spec_load(&in->spec, backend, device, threads, in->tok, in->m, &dsh, e);
    }
    uint64_t spec_per_token = cli_spec_kv_bytes(&in->spec, kv_type);
    if (st == SMELT_OK) {
        int64_t t = kv_size > 0 ? kv_size : 1 << 20; /* --fake-forward: no model */
        if (in->m) {
            /* the memory plan: the engine's largest steps, at the context it will serve */
            struct engine_config d = ec;
            engine_config_defaults(&d);
            int64_t max_t = (int64_t)(1 << 24) * ec.block_size;
            int64_t cpu_t = cpu_kv_tokens(model_kv_block_bytes(in->m, kv_type, 1) + spec_per_token);
            if (!model_is_causal(in->m)) {
                /* an encoder: an input runs whole in one step and nothing is cached after
                 * it, so the pool holds one step (each sequence rounded up to its blocks) */
                max_t = (int64_t)d.max_batch_tokens + (int64_t)d.max_seqs * ec.block_size;
                if (cpu_t > max_t) cpu_t = max_t;
            }
            struct cli_mem_req r = {
                .cmd = "serve", .f = in->f, .gpu_util = cfg_num(c, ci, CFG_GPU_MEMORY_UTILIZATION),
                .kv_size = kv_size, .min_tokens = ctx_size, .max_tokens = max_t,
                .cpu_tokens = cpu_t,
                .n_slots = n_slots, .others_b = others_b, .used_b = &in->used_b,
                .extra_per_token = spec_per_token,
                .shape = {.max_tokens = d.max_batch_tokens, .max_seqs = d.max_seqs,
                          .max_out = engine_max_out_rows(&d),
                          .n_ctx = ctx_size > 0 ? (int32_t)ctx_size
                                   : n_ctx_model > 0 ? n_ctx_model : d.max_batch_tokens,
                          .block_size = ec.block_size, .kv_type = kv_type}};
            st = cli_mem_plan(in->m, &r, &t, e);
            in->used_b += in->spec.device_b;
        }
        int64_t nb = (t + ec.block_size - 1) / ec.block_size;
        if (nb > (1 << 24)) nb = 1 << 24;
        ec.n_blocks = (int32_t)nb;
    }
    if (st == SMELT_OK) {
        int64_t pool = (int64_t)ec.n_blocks * ec.block_size;
        int64_t n = ctx_size > 0 ? ctx_size : (n_ctx_model > 0 ? n_ctx_model : pool);
        if (n > pool) n = pool;
        if (ctx_size > 0 && ctx_size > pool)
            log_warn("--ctx-size %lld is more than the KV pool holds; using %lld",
                     (long long)ctx_size, (long long)pool);
        ec.n_ctx = (int32_t)n;
    }
    if (st == SMELT_OK && in->m)
        st = model_kv_new(in->m, kv_type, ec.block_size, ec.n_blocks, n_slots, &in->kv, e);
    if (st == SMELT_OK) st = cli_spec_kv(&in->spec, kv_type, ec.block_size, ec.n_blocks, &ec.spec, e);
    if (st == SMELT_OK && in->fake) {
        st = fake_init(&in->fk, c, ci, in->tok, ec.n_blocks, e);
        ec.forward = fake_forward;
        ec.forward_ctx = &in->fk;
        ec.n_vocab = in->fk.n_vocab;
    }
    if (st == SMELT_OK) st = engine_new(&in->en, &ec, in->m, in->kv, in->tok, e);
    if (st != SMELT_OK) {
        serve_inst_free(in);
        return st;
    }
    if (in->ct.fallback && engine_embd_size(in->en) == 0) /* (an embedding model has no chat) */
        fprintf(stderr, "smelt serve: %s: the model has no chat template "
                        "(tokenizer.chat_template): chat requests use the ChatML default\n", name);
    if (in->ct.tool_use)
        fprintf(stderr, "smelt serve: %s: requests with tools use the model's "
                        "tokenizer.chat_template.tool_use\n", name);
    sm->en = in->en;
    sm->tok = in->tok;
    sm->tmpl = in->tm;
    sm->tmpl_src = in->ct.src;
    sm->tmpl_fallback = in->ct.fallback;
    sm->tmpl_tools = in->tm_tools;
    sm->tmpl_tools_src = in->ct.tool_use;
    sm->bos_text = in->bos;
    sm->eos_text = in->eos;
    sm->n_ctx = engine_config(in->en)->n_ctx;
    sm->created = (int64_t)time(NULL);
    char line[512];
    fprintf(stderr, "smelt serve: %s %s\n", name, serve_inst_describe(in, line, sizeof line));
    if (engine_embd_size(in->en) > 0)
        fprintf(stderr, "smelt serve: %s: an embedding model (%s pooling, %d dimensions, inputs "
                "of up to %d tokens): /v1/embeddings only\n", name,
                (const char *[]){"", "mean", "cls", "last"}[in->m->hp.pooling],
                engine_embd_size(in->en), engine_embd_max_tokens(in->en));
    sampling_defaults(c, ci, in->f, name, sm->n_ctx, tok_n_vocab(in->tok), sm);
    *out = in;
    return SMELT_OK;
}

/* ---- the models a server offers ---- */

void serve_list_free(struct serve_list *l) {
    for (int i = 0; l->v && i < l->n; i++) {
        struct serve_entry *m = &l->v[i];
        free(m->ref);
        free(m->name);
        free(m->hidden);
        for (int k = 0; k < m->n_aliases; k++) free(m->aliases[k]);
        free(m->aliases);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The file name of path without its folder and .gguf (the default name of a model). */
static char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path + n;
    while (b > path && b[-1] != '/') b--;
    size_t m = (size_t)(path + n - b);
    if (m > 5 && !strncmp(b + m - 5, ".gguf", 5)) m -= 5;
    return strndup(b, m);
}

/* Adds the model ref (settings ci) to l: resolves it (pulling a reference only when it loads
 * at start), names it. names: the served names for it (NULL: from the file). */
static smelt_status add_model(struct serve_list *l, const struct cfg *c, int ci, const char *ref,
                              const char *name, const char *const *aliases, int n_aliases,
                              const char *from, bool pull, struct err *e) {
    struct serve_entry *m = &l->v[l->n];
    memset(m, 0, sizeof *m);
    m->ci = ci;
    snprintf(m->from, sizeof m->from, "%s", from);
    m->pinned = ci >= 0 && cfg_bool(c, ci, CFG_PINNED);
    m->preload = (l->n == 0 && strcmp(from, "--models-dir")) || m->pinned;
    const char *backend = cfg_str(c, ci, CFG_BACKEND);
    m->device = cli_backend_is_cuda(backend)
                    ? (cfg_has(c, ci, CFG_DEVICE) ? (int)cfg_int(c, ci, CFG_DEVICE) : 0) : -1;
    char path[4096];
    smelt_status st = SMELT_OK;
    if ((m->preload && pull) || cli_model_is_local(ref)) {
        st = cli_resolve_model(ref, m->preload && pull, path, sizeof path, e);
    } else if (cli_resolve_model(ref, false, path, sizeof path, NULL) != SMELT_OK) {
        snprintf(path, sizeof path, "%s", ref); /* not cached: pulled when it loads */
    }
    if (st != SMELT_OK) return err_prefix(e, "%s", from);
    bool cached = strcmp(path, ref) != 0 || cli_model_is_local(ref);
    m->ref = strdup(path);
    m->name = name ? strdup(name) : cached ? base_name(path) : strdup(ref);
    m->aliases = calloc((size_t)n_aliases + 1, sizeof *m->aliases);
    bool oom = !m->ref || !m->name || !m->aliases;
    for (int k = 0; !oom && k < n_aliases; k++) {
        oom = !(m->aliases[k] = strdup(aliases[k]));
        m->n_aliases += !oom;
    }
    if (!oom && !name && strcmp(ref, m->name)) oom = !(m->hidden = strdup(ref));
    l->n++;
    return oom ? err_set(e, SMELT_ERR_NOMEM, "out of memory") : SMELT_OK;
}

/* Whether a model file name is a split part other than the first (-0000N-of-0000M.gguf). */
static bool later_split_part(const char *name) {
    size_t n = strlen(name);
    if (n < 20 || strcmp(name + n - 5, ".gguf")) return false;
    const char *p = name + n - 20; /* "-00002-of-00003.gguf" */
    return p[0] == '-' && !strncmp(p + 6, "-of-", 4) && strncmp(p + 1, "00001", 5) != 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of dir that are models: *.gguf files (first split parts) and folders holding
 * one (hub_find_in_dir), sorted; malloc'd names in *out. */
static smelt_status scan_dir(const char *dir, char ***out, int *n, struct err *e) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return err_set(e, SMELT_ERR_IO, "--models-dir %s: %s", dir, strerror(errno));
    char **v = NULL;
    int cap = 0;
    smelt_status st = SMELT_OK;
    struct dirent *de;
    while (st == SMELT_OK && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[4096], found[4096];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0) continue;
        size_t ln = strlen(de->d_name);
        bool file = S_ISREG(sb.st_mode) && ln > 5 && !strcmp(de->d_name + ln - 5, ".gguf") &&
                    !later_split_part(de->d_name);
        bool folder = S_ISDIR(sb.st_mode) && hub_find_in_dir(p, "", found, sizeof found, NULL) == SMELT_OK;
        if (!file && !folder) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
            else v = nv;
        }
        if (st == SMELT_OK && !(v[*n] = strdup(de->d_name))) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        if (st == SMELT_OK) (*n)++;
    }
    closedir(d);
    if (st == SMELT_OK && *n > 1) qsort(v, (size_t)*n, sizeof *v, cmp_str);
    *out = v;
    return st;
}

smelt_status serve_list_build(const struct cfg *c, bool pull, struct serve_list *out,
                              struct err *e) {
    memset(out, 0, sizeof *out);
    const struct cfg_val *ml = cfg_get(c, -1, CFG_MODEL), *served = cfg_get(c, -1, CFG_SERVED_MODEL_NAME);
    const char *dir = cfg_str(c, -1, CFG_MODELS_DIR);
    char **files = NULL;
    int n_files = 0;
    smelt_status st = dir ? scan_dir(dir, &files, &n_files, e) : SMELT_OK;
    int n = (ml->set ? ml->n_list : 0) + c->n_models + n_files;
    if (st == SMELT_OK && n == 0)
        st = err_set(e, SMELT_ERR_INVALID, dir ? "--models-dir %s holds no GGUF file" : "no model to "
                     "serve: give MODEL, a config file's models: list or --models-dir (see --help)",
                     dir);
    bool named = served->set && served->n_list > 0;
    if (st == SMELT_OK && named && n > 1)
        st = err_set(e, SMELT_ERR_INVALID, "--served-model-name names one model; with several, "
                     "name them in the config file's models: list");
    if (st == SMELT_OK && !(out->v = calloc((size_t)n, sizeof *out->v)))
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
    for (int i = 0; st == SMELT_OK && ml->set && i < ml->n_list; i++)
        st = add_model(out, c, -1, ml->list[i], named ? served->list[0] : NULL,
                       named ? (const char *const *)served->list + 1 : NULL,
                       named ? served->n_list - 1 : 0, "--model", pull, e);
    for (int i = 0; st == SMELT_OK && i < c->n_models; i++) {
        char from[64];
        const struct cfg_val *al = &c->models[i].v[CFG_ALIASES];
        snprintf(from, sizeof from, "%s:%u: models[%d]", c->file ? c->file : "config",
                 c->models[i].line, i);
        st = add_model(out, c, i, c->models[i].v[CFG_MODEL].list[0], cfg_str(c, i, CFG_NAME),
                       al->set ? (const char *const *)al->list : NULL, al->set ? al->n_list : 0,
                       from, pull, e);
    }
    for (int i = 0; st == SMELT_OK && i < n_files; i++) { /* named after the file or folder */
        char p[4096], *name = base_name(files[i]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        st = name ? add_model(out, c, -1, p, name, NULL, 0, "--models-dir", pull, e)
                  : err_set(e, SMELT_ERR_NOMEM, "out of memory");
        free(name);
    }
    for (int i = 0; i < n_files; i++) free(files[i]);
    free(files);
    /* every name once */
    for (int i = 0; st == SMELT_OK && i < out->n; i++) {
        const struct serve_entry *a = &out->v[i];
        for (int j = 0; st == SMELT_OK && j <= i; j++) {
            const struct serve_entry *b = &out->v[j];
            for (int x = -1; st == SMELT_OK && x < a->n_aliases; x++) {
                const char *an = x < 0 ? a->name : a->aliases[x];
                for (int y = -1; st == SMELT_OK && y < b->n_aliases; y++) {
                    const char *bn = y < 0 ? b->name : b->aliases[y];
                    if ((i != j || x > y) && !strcmp(an, bn))
                        st = err_set(e, SMELT_ERR_INVALID, "the model name '%s' is given twice "
                                     "(%s and %s): name one of them (a models: entry's name)",
                                     an, b->from, a->from);
                }
            }
        }
    }
    if (st != SMELT_OK) serve_list_free(out);
    return st;
}

void serve_list_print(FILE *f, const struct serve_list *l) {
    fprintf(f, "# the models served (the first is the default):\n");
    for (int i = 0; i < l->n; i++) {
        const struct serve_entry *m = &l->v[i];
        fprintf(f, "#   %s: %s%s%s (%s; %s)", m->name, m->ref, m->pinned ? ", pinned" : "",
                m->preload ? ", loaded at start" : ", loaded on demand", m->from,
                m->device >= 0 ? "cuda" : "cpu");
        for (int k = 0; k < m->n_aliases; k++) fprintf(f, "%s%s", k ? ", " : "; aliases: ", m->aliases[k]);
        fputc('\n', f);
    }
}

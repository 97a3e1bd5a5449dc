/* Loading one model of `smelt serve` (serve_model.h). */
#include "cli/serve_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/climem.h"
#include "cli/clibackend.h"
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
    struct fake fk;
    bool fake, cuda;
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
 * that no setting gave is then off), N the last N tokens. */
static void sampling_defaults(const struct cfg *c, int ci, const struct gguf_file *f,
                              const char *path, int32_t n_ctx, int32_t n_vocab,
                              struct server_model *sm) {
    struct sample_params *p = &sm->defaults, d;
    sample_params_default(p);
    d = *p;
    float x;
    uint32_t k;
    int64_t n, last_n = -1;
    bool have_last = false;
    if (gguf_get_f32(f, "general.sampling.temp", &x, NULL) == SMELT_OK) p->temperature = x;
    if (gguf_get_u32(f, "general.sampling.top_k", &k, NULL) == SMELT_OK && k <= INT32_MAX)
        p->top_k = (int32_t)k;
    if (gguf_get_f32(f, "general.sampling.top_p", &x, NULL) == SMELT_OK) p->top_p = x;
    if (gguf_get_f32(f, "general.sampling.min_p", &x, NULL) == SMELT_OK) p->min_p = x;
    if (gguf_get_f32(f, "general.sampling.penalty_repeat", &x, NULL) == SMELT_OK)
        p->repetition_penalty = x;
    if (gguf_get_i64(f, "general.sampling.penalty_last_n", &n, NULL) == SMELT_OK && n >= -1 &&
        n <= INT32_MAX)
        last_n = n, have_last = true;
    struct err e;
    struct sample_params t = *p;
    if (t.top_p == 0.0f) t.top_p = 1.0f; /* (greedy: the request path reads it so) */
    if (sample_params_check(&t, n_vocab, &e) != SMELT_OK) {
        log_warn("%s: the file's general.sampling.* defaults are not used: %s", path, e.msg);
        *p = d;
        last_n = -1;
        have_last = false;
    }
    bool set_rep = cfg_has(c, ci, CFG_REPEAT_PENALTY), set_last = cfg_has(c, ci, CFG_REPEAT_LAST_N);
    if (cfg_has(c, ci, CFG_TEMP)) p->temperature = (float)cfg_num(c, ci, CFG_TEMP);
    if (cfg_has(c, ci, CFG_TOP_K)) p->top_k = (int32_t)cfg_int(c, ci, CFG_TOP_K);
    if (cfg_has(c, ci, CFG_TOP_P)) p->top_p = (float)cfg_num(c, ci, CFG_TOP_P);
    if (cfg_has(c, ci, CFG_MIN_P)) p->min_p = (float)cfg_num(c, ci, CFG_MIN_P);
    if (set_rep) p->repetition_penalty = (float)cfg_num(c, ci, CFG_REPEAT_PENALTY);
    if (set_last) last_n = cfg_int(c, ci, CFG_REPEAT_LAST_N), have_last = true;
    if (!have_last || last_n < 0) {
        p->penalty_last_n = 0; /* the whole history */
    } else if (last_n == 0) {
        p->penalty_last_n = 0;
        if (set_last || !set_rep) p->repetition_penalty = 1.0f;
    } else {
        p->penalty_last_n = last_n >= n_ctx ? 0 : (int32_t)last_n;
    }
    sm->seed_set = cfg_has(c, ci, CFG_SEED);
    p->seed = (uint64_t)cfg_int(c, ci, CFG_SEED);
}

void serve_inst_free(struct serve_inst *in) {
    if (!in) return;
    engine_free(in->en);
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

const char *serve_inst_describe(const struct serve_inst *in, char *buf, size_t n) {
    const struct engine_config *c = engine_config(in->en);
    snprintf(buf, n, "on %s: %d sequences, %d tokens per step, KV %d blocks of %d (%lld tokens), "
             "context %d, prefix cache %s", in->fake ? "a fake forward" : in->cuda ? "cuda" : "cpu",
             c->max_seqs, c->max_batch_tokens, c->n_blocks, c->block_size,
             (long long)c->n_blocks * c->block_size, c->n_ctx, c->no_prefix_cache ? "off" : "on");
    return buf;
}

smelt_status serve_inst_load(const struct cfg *c, int ci, const char *ref, struct serve_inst **out,
                             struct server_model *sm, struct err *e) {
    *out = NULL;
    struct serve_inst *in = calloc(1, sizeof *in);
    if (!in) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
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
        if (st == SMELT_OK) st = cli_model_load(in->path, in->f, in->bk, &in->m, e);
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
    if (st == SMELT_OK) {
        int64_t t = kv_size > 0 ? kv_size : 1 << 20; /* --fake-forward: no model */
        if (in->m) {
            /* the memory plan: the engine's largest steps, at the context it will serve */
            struct engine_config d = ec;
            engine_config_defaults(&d);
            int64_t max_t = (int64_t)(1 << 24) * ec.block_size;
            struct cli_mem_req r = {
                .cmd = "serve", .f = in->f, .gpu_util = cfg_num(c, ci, CFG_GPU_MEMORY_UTILIZATION),
                .kv_size = kv_size, .min_tokens = ctx_size, .max_tokens = max_t,
                .cpu_tokens = cpu_kv_tokens(model_kv_block_bytes(in->m, kv_type, 1)),
                .n_slots = n_slots,
                .shape = {.max_tokens = d.max_batch_tokens, .max_seqs = d.max_seqs,
                          .max_out = engine_max_out_rows(&d),
                          .n_ctx = ctx_size > 0 ? (int32_t)ctx_size
                                   : n_ctx_model > 0 ? n_ctx_model : d.max_batch_tokens,
                          .block_size = ec.block_size, .kv_type = kv_type}};
            st = cli_mem_plan(in->m, &r, &t, e);
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
    if (in->ct.fallback)
        fprintf(stderr, "smelt serve: the model has no chat template "
                        "(tokenizer.chat_template): chat requests use the ChatML default\n");
    if (in->ct.tool_use)
        fprintf(stderr, "smelt serve: requests with tools use the model's "
                        "tokenizer.chat_template.tool_use\n");
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
    sampling_defaults(c, ci, in->f, in->path, sm->n_ctx, tok_n_vocab(in->tok), sm);
    *out = in;
    return SMELT_OK;
}

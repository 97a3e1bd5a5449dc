/* smelt serve MODEL [options]: an OpenAI-compatible HTTP server over one model.
 *
 * Loads the model (a path, or an org/repo[:quant] reference pulled on demand), its
 * tokenizer and chat template, sizes the KV pool from memory, starts the engine thread and
 * the HTTP server, and waits for SIGINT/SIGTERM. On a signal it stops accepting requests,
 * lets in-flight ones finish for a grace period (--grace), cancels the rest and exits; a
 * second signal during the grace period cancels them at once.
 *
 * --fake-forward replaces the model's forward pass with a stub that returns fixed logits
 * (the tokenizer still comes from MODEL): it measures the server and the engine's host
 * work alone, with no model compute (docs/server.md). With --fake-reply TEXT every reply
 * is TEXT, token by token, then end of generation: tests drive the server's output paths
 * (tool calls in each syntax, streaming shapes) with exactly the text they need; MODEL
 * then only has to hold a vocabulary. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/climem.h"
#include "cli/cli.h"
#include "cli/modelref.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "model/model.h"
#include "server/server.h"
#include "template/tmpl.h"
#include "template/tmpl_source.h"
#include "tokenizer/tok.h"
#include "util/log.h"

#if __has_include("cli/clibackend.h")
#include "cli/clibackend.h"
#define HAVE_CLI_BACKEND 1
#endif

#define CPU_KV_TOKENS_DEFAULT 32768

struct opts {
    const char *model, *host, *api_key, *api_key_file, *served, *backend, *chat_template;
    const char *log_format, *fake_reply, *admin_host, *cors_origins;
    const char *aliases[8];
    int n_aliases;
    int port, device, threads, http_threads, timeout_s, max_seqs, max_batch, max_waiting;
    int block_size, kv_size, ctx_size, fake_fail_at;
    int header_timeout_s, max_connections, max_per_client, admin_port;
    double gpu_util, grace_s, fake_step_ms;
    long long max_body, body_budget, response_store; /* response_store: -1 not given */
    bool no_prefix_cache, f32_kv, fake, quiet, allow_unknown_pre;
    char key_buf[256]; /* the key read from --api-key-file */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: smelt serve MODEL [options]\n"
            "  MODEL                      a GGUF file, a directory, or org/repo[:quant] (pulled if absent)\n"
            "server:\n"
            "  --host ADDR                listen address (default 127.0.0.1; 0.0.0.0 for all)\n"
            "  --port N                   port (default 8080; 0 picks a free one)\n"
            "  --api-key KEY              require the key (Authorization: Bearer or x-api-key); in ps:\n"
            "                             prefer --api-key-file FILE (its first line) or the\n"
            "                             environment variable SMELT_API_KEY\n"
            "  --served-model-name NAME   the model's name in the API (repeat for aliases;\n"
            "                             default: the file name without .gguf)\n"
            "  --chat-template FILE       a Jinja chat template instead of the model's own\n"
            "  --allow-unknown-pretokenizer  load a tokenizer.ggml.pre smelt does not implement\n"
            "                             with GPT-2's split (token ids may differ from the model's)\n"
            "  --http-threads N           HTTP threads (default 2; a quarter of the cores, up to 8, on 16+)\n"
            "  --timeout S                a request (headers and body) must arrive within S\n"
            "                             seconds (default 120)\n"
            "  --header-timeout S         a request's headers must arrive within S seconds;\n"
            "                             idle connections close after S (default 10)\n"
            "  --max-body BYTES           request body limit (default 33554432)\n"
            "  --body-budget BYTES        request bodies buffered at once, all connections\n"
            "                             together (default 8 x --max-body); 503 past it\n"
            "  --max-connections N        open connections (default: from the open-file limit,\n"
            "                             at most 8192)\n"
            "  --max-connections-per-client N  from one client address (default a quarter of\n"
            "                             --max-connections; 0: no cap, e.g. behind a proxy)\n"
            "  --admin-port N             also serve /health and /metrics on port N, with its\n"
            "                             own connections (reachable when the main port is full)\n"
            "  --admin-host ADDR          the admin port's address (default: --host)\n"
            "  --cors-origins LIST        answer CORS preflights and allow browsers from these\n"
            "                             origins: a comma list, or * (default: none)\n"
            "  --response-store BYTES     finished /v1/responses kept in memory for\n"
            "                             previous_response_id (default 67108864; 0: none)\n"
            "  --log-format text|json     request log lines (default text); --quiet: none\n"
            "  --grace S                  on SIGTERM, let requests finish for S seconds (default 30);\n"
            "                             a second SIGTERM or SIGINT cancels them at once\n"
            "engine:\n"
            "  --backend auto|cpu|cuda    (default auto: cuda when available)\n"
            "  --device N                 CUDA device (default 0)\n"
            "  -t, --threads N            CPU threads (default: all cores)\n"
            "  --max-seqs N               sequences in flight (default 64)\n"
            "  --max-batch-tokens N       tokens per step: decodes + prefill chunks (default 512)\n"
            "  --max-waiting N            queued requests before 429 (default 1024)\n"
            "  -c, --ctx-size N           context per sequence (default: the model's, capped by the KV pool)\n"
            "  --kv-size N                KV pool size in tokens (default: from --gpu-memory-utilization\n"
            "                             on CUDA; %d tokens or 25%% of free memory on CPU)\n"
            "  --gpu-memory-utilization F fraction of device memory smelt may use (default 0.9)\n"
            "  --block-size N             KV block size in tokens (default 16)\n"
            "  --no-prefix-cache          do not reuse the KV of shared prompt prefixes\n"
            "  --f32-kv                   F32 KV cache (default F16)\n"
            "  --fake-forward             no model compute: fixed logits (server benchmarks)\n"
            "  --fake-step-ms X           with --fake-forward: sleep X ms per step\n"
            "  --fake-reply TEXT          with --fake-forward: every reply is TEXT (tests; one\n"
            "                             reply at a time per prompt prefix)\n"
            "  --fake-fail-at N           with --fake-forward: a step with a row at position >= N\n"
            "                             fails (tests: engine errors)\n",
            CPU_KV_TOKENS_DEFAULT);
}

static bool num(const char *s, double *out) {
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return *s && !*end && !errno && isfinite(*out);
}

/* The API key: --api-key, --api-key-file (its first line, without the line end) or
 * $SMELT_API_KEY, at most one of the two flags (an empty flag or variable: no key, an
 * empty file: an error). A key must be printable ASCII without spaces: it travels in a
 * header. Returns -1 (go on) or an exit code. */
static int api_key(struct opts *o) {
    if (o->api_key && o->api_key_file) {
        fprintf(stderr, "smelt serve: give --api-key or --api-key-file, not both\n");
        return 2;
    }
    const char *src = o->api_key ? "--api-key" : "SMELT_API_KEY";
    if (o->api_key_file) {
        src = o->api_key_file;
        FILE *f = fopen(o->api_key_file, "r");
        if (!f) {
            fprintf(stderr, "smelt serve: --api-key-file %s: %s\n", o->api_key_file, strerror(errno));
            return 1;
        }
        char *line = fgets(o->key_buf, sizeof o->key_buf, f);
        bool long_line = line && !strchr(o->key_buf, '\n') && !feof(f);
        fclose(f);
        if (!line || long_line) {
            fprintf(stderr, "smelt serve: --api-key-file %s: %s\n", o->api_key_file,
                    line ? "the first line is too long (255 bytes at most)" : "empty file");
            return 2;
        }
        size_t n = strlen(o->key_buf);
        while (n && (o->key_buf[n - 1] == '\n' || o->key_buf[n - 1] == '\r')) o->key_buf[--n] = 0;
        o->api_key = o->key_buf;
        if (!*o->api_key) {
            fprintf(stderr, "smelt serve: --api-key-file %s: the key is empty\n", src);
            return 2;
        }
    } else if (!o->api_key) {
        o->api_key = getenv("SMELT_API_KEY");
    }
    for (const char *p = o->api_key ? o->api_key : ""; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch <= ' ' || ch >= 0x7F) {
            fprintf(stderr, "smelt serve: the API key from %s must be printable ASCII without "
                            "spaces (it is sent in a header)\n", src);
            return 2;
        }
    }
    return -1;
}

static int parse(int argc, char **argv, struct opts *o) {
    o->port = 8080;
    o->gpu_util = 0.9;
    o->grace_s = 30;
    o->backend = "auto";
    o->log_format = "text";
    o->device = -1; /* not given */
    o->admin_port = -1;
    o->max_per_client = -2; /* not given */
    o->response_store = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
#define FLAG(name, field)                                                                      \
    if (!strcmp(a, name)) {                                                                    \
        o->field = true;                                                                       \
        continue;                                                                              \
    }
        FLAG("--no-prefix-cache", no_prefix_cache)
        FLAG("--f32-kv", f32_kv)
        FLAG("--fake-forward", fake)
        FLAG("--quiet", quiet)
        FLAG("--allow-unknown-pretokenizer", allow_unknown_pre)
#undef FLAG
        if (a[0] == '-' && a[1]) {
            if (!v) {
                fprintf(stderr, "smelt serve: %s needs a value\n", a);
                return 2;
            }
            i++;
            if (!strcmp(a, "--host")) o->host = v;
            else if (!strcmp(a, "--api-key")) o->api_key = v;
            else if (!strcmp(a, "--api-key-file")) o->api_key_file = v;
            else if (!strcmp(a, "--admin-host")) o->admin_host = v;
            else if (!strcmp(a, "--cors-origins")) o->cors_origins = v;
            else if (!strcmp(a, "--backend")) o->backend = v;
            else if (!strcmp(a, "--chat-template")) o->chat_template = v;
            else if (!strcmp(a, "--log-format")) o->log_format = v;
            else if (!strcmp(a, "--fake-reply")) o->fake_reply = v;
            else if (!strcmp(a, "--model")) o->model = v;
            else if (!strcmp(a, "--served-model-name")) {
                if (!o->served) o->served = v;
                else if (o->n_aliases < 8) o->aliases[o->n_aliases++] = v;
            } else if (!num(v, &x)) {
                fprintf(stderr, "smelt serve: %s needs a number, got '%s'\n", a, v);
                return 2;
            } else if (!strcmp(a, "--port")) o->port = (int)x;
            else if (!strcmp(a, "--device") && x >= 0 && x <= 1024) o->device = (int)x;
            else if (!strcmp(a, "--device")) {
                fprintf(stderr, "smelt serve: --device takes a CUDA device index (0, 1, ...)\n");
                return 2;
            }
            else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o->threads = (int)x;
            else if (!strcmp(a, "--http-threads")) o->http_threads = (int)x;
            else if (!strcmp(a, "--timeout")) o->timeout_s = (int)x;
            else if (!strcmp(a, "--header-timeout")) o->header_timeout_s = (int)x;
            else if (!strcmp(a, "--max-connections") && x >= 1 && x <= 1 << 20)
                o->max_connections = (int)x;
            else if (!strcmp(a, "--max-connections-per-client") && x >= 0 && x <= 1 << 20)
                o->max_per_client = (int)x;
            else if (!strcmp(a, "--admin-port") && x >= 0 && x <= 65535) o->admin_port = (int)x;
            else if (!strcmp(a, "--body-budget") && x >= 1) o->body_budget = (long long)x;
            else if (!strcmp(a, "--response-store") && x >= 0) o->response_store = (long long)x;
            else if (!strcmp(a, "--max-connections") || !strcmp(a, "--admin-port") ||
                     !strcmp(a, "--max-connections-per-client") || !strcmp(a, "--body-budget") ||
                     !strcmp(a, "--response-store")) {
                fprintf(stderr, "smelt serve: %s %s is out of range (see --help)\n", a, v);
                return 2;
            }
            else if (!strcmp(a, "--max-seqs")) o->max_seqs = (int)x;
            else if (!strcmp(a, "--max-batch-tokens")) o->max_batch = (int)x;
            else if (!strcmp(a, "--max-waiting")) o->max_waiting = (int)x;
            else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) o->ctx_size = (int)x;
            else if (!strcmp(a, "--kv-size")) o->kv_size = (int)x;
            else if (!strcmp(a, "--gpu-memory-utilization")) o->gpu_util = x;
            else if (!strcmp(a, "--block-size")) o->block_size = (int)x;
            else if (!strcmp(a, "--max-body")) o->max_body = (long long)x;
            else if (!strcmp(a, "--grace")) o->grace_s = x;
            else if (!strcmp(a, "--fake-step-ms")) o->fake_step_ms = x;
            else if (!strcmp(a, "--fake-fail-at")) o->fake_fail_at = (int)x;
            else {
                fprintf(stderr, "smelt serve: unknown option %s\n", a);
                usage(stderr);
                return 2;
            }
        } else if (!o->model) {
            o->model = a;
        } else {
            fprintf(stderr, "smelt serve: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (!o->model) {
        usage(stderr);
        return 2;
    }
    if (o->port < 0 || o->port > 65535 || o->max_seqs < 0 || o->max_batch < 0 ||
        o->max_waiting < 0 || o->kv_size < 0 || o->ctx_size < 0 || o->block_size < 0 ||
        o->block_size > 1024 || !(o->gpu_util > 0 && o->gpu_util <= 1) || o->max_body < 0 ||
        o->threads < 0 || o->http_threads < 0 || o->http_threads > 256 || o->grace_s < 0 ||
        o->timeout_s < 0 || o->header_timeout_s < 0) {
        fprintf(stderr, "smelt serve: an option is out of range (see --help)\n");
        return 2;
    }
    if (strcmp(o->log_format, "text") && strcmp(o->log_format, "json")) {
        fprintf(stderr, "smelt serve: --log-format is text or json\n");
        return 2;
    }
    return api_key(o);
}

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

/* ---- signals ---- */

/* The second SIGTERM / SIGINT: waited for on a thread while the main one drains. */
struct second_signal {
    const sigset_t *sigs;
    struct server *srv;
    pthread_t th;
    atomic_bool done; /* the drain ended: the signal that wakes us is ours, not the user's */
};

static void *wait_second_signal(void *arg) {
    struct second_signal *ss = arg;
    int sig = 0;
    sigwait(ss->sigs, &sig);
    if (!atomic_load(&ss->done)) {
        fprintf(stderr, "smelt serve: %s again: cancelling requests now\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        server_hurry(ss->srv);
    }
    return NULL;
}

/* ---- helpers ---- */

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

int cmd_serve(int argc, char **argv) {
    struct opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    struct err e;
    err_clear(&e);

    /* signals: handled by sigwait in this thread; every thread created below inherits the
     * blocked mask. SIGPIPE is ignored (a client closing its socket is not fatal). */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    char path[4096];
    struct gguf_file *f = NULL;
    struct tok *tok = NULL;
    struct backend *bk = NULL;
    struct model *m = NULL;
    struct kv_store *kv = NULL;
    struct engine *en = NULL;
    struct server *srv = NULL;
    struct tmpl *tm = NULL, *tm_tools = NULL;
    struct tmpl_sources ct = {0};
    char *bos = NULL, *eos = NULL, *name = NULL;
    struct fake fk = {0};
    bool cuda = false;
    smelt_status st = cli_resolve_model(o.model, true, path, sizeof path, &e);
    if (st == SMELT_OK) st = gguf_open(&f, path, &e);
    if (st == SMELT_OK)
        st = tok_new_from_gguf(&tok, f, &(struct tok_opts){.allow_unknown_pre = o.allow_unknown_pre},
                               &e);
    if (st == SMELT_OK && !o.fake) {
#ifdef HAVE_CLI_BACKEND
        cuda = cli_backend_is_cuda(o.backend);
        st = cli_backend_new(o.backend, o.device, o.threads, &bk, &e);
#else
        if (!strcmp(o.backend, "cuda"))
            st = err_set(&e, SMELT_ERR_UNSUPPORTED, "this build has no CUDA backend");
        else if (strcmp(o.backend, "auto") && strcmp(o.backend, "cpu"))
            st = err_set(&e, SMELT_ERR_INVALID, "unknown backend '%s' (auto, cpu, cuda)", o.backend);
        else st = cpu_backend_new(&bk, o.threads, &e);
#endif
        if (st == SMELT_OK) st = cli_model_load(path, f, bk, &m, &e);
    }
    /* the chat templates: --chat-template, the model's (and its tool_use one), or the
     * ChatML default (template/tmpl_source.h) */
    if (st == SMELT_OK) st = tmpl_sources_load(&ct, f, o.chat_template, &e);
    if (st == SMELT_OK) {
        st = tmpl_compile(ct.src, ct.len, &tm, &e);
        if (st != SMELT_OK) err_prefix(&e, "%s", o.chat_template ? o.chat_template : "chat template");
        if (st == SMELT_OK && ct.tool_use) {
            st = tmpl_compile(ct.tool_use, ct.tool_use_len, &tm_tools, &e);
            if (st != SMELT_OK) err_prefix(&e, "tokenizer.chat_template.tool_use");
        }
        if (st == SMELT_OK && ct.fallback)
            fprintf(stderr, "smelt serve: the model has no chat template "
                            "(tokenizer.chat_template): chat requests use the ChatML default\n");
        if (st == SMELT_OK && ct.tool_use)
            fprintf(stderr, "smelt serve: requests with tools use the model's "
                            "tokenizer.chat_template.tool_use\n");
        const struct tok_special *sp = tok_specials(tok);
        bos = token_text(tok, sp->bos);
        eos = token_text(tok, sp->eos);
    }
    /* the KV pool */
    struct engine_config ec = {0};
    ec.max_seqs = o.max_seqs;
    ec.max_batch_tokens = o.max_batch;
    ec.max_waiting = o.max_waiting;
    ec.block_size = o.block_size > 0 ? o.block_size : 16;
    ec.no_prefix_cache = o.no_prefix_cache;
    uint32_t kv_type = o.f32_kv ? QT_F32 : QT_F16;
    int32_t n_ctx_model = m ? m->hp.n_ctx_train : 0;
    int32_t n_slots = 0; /* recurrent state slots (engine/memplan.h) */
    if (st == SMELT_OK && m && model_is_recurrent(m)) {
        struct engine_config d = ec;
        engine_config_defaults(&d);
        n_slots = memplan_state_slots(d.max_seqs);
    }
    if (st == SMELT_OK) {
        int64_t t = o.kv_size > 0 ? o.kv_size : 1 << 20; /* --fake-forward: no model */
        if (m) {
            /* the memory plan: the engine's largest steps, at the context it will serve */
            struct engine_config d = ec;
            engine_config_defaults(&d);
            int64_t max_t = (int64_t)(1 << 24) * ec.block_size;
            struct cli_mem_req r = {
                .cmd = "serve", .f = f, .gpu_util = o.gpu_util, .kv_size = o.kv_size,
                .min_tokens = o.ctx_size, .max_tokens = max_t,
                .cpu_tokens = cpu_kv_tokens(model_kv_block_bytes(m, kv_type, 1)),
                .n_slots = n_slots,
                .shape = {.max_tokens = d.max_batch_tokens, .max_seqs = d.max_seqs,
                          .max_out = engine_max_out_rows(&d),
                          .n_ctx = o.ctx_size > 0 ? o.ctx_size
                                   : n_ctx_model > 0 ? n_ctx_model : d.max_batch_tokens,
                          .block_size = ec.block_size, .kv_type = kv_type}};
            st = cli_mem_plan(m, &r, &t, &e);
        }
        int64_t nb = (t + ec.block_size - 1) / ec.block_size;
        if (nb > (1 << 24)) nb = 1 << 24;
        ec.n_blocks = (int32_t)nb;
    }
    if (st == SMELT_OK) {
        int64_t pool = (int64_t)ec.n_blocks * ec.block_size;
        int64_t c = o.ctx_size > 0 ? o.ctx_size : (n_ctx_model > 0 ? n_ctx_model : pool);
        if (c > pool) c = pool;
        if (o.ctx_size > 0 && o.ctx_size > pool)
            log_warn("--ctx-size %d is more than the KV pool holds; using %lld", o.ctx_size,
                     (long long)pool);
        ec.n_ctx = (int32_t)c;
    }
    if (st == SMELT_OK && m)
        st = model_kv_new(m, kv_type, ec.block_size, ec.n_blocks, n_slots, &kv, &e);
    if (st == SMELT_OK && o.fake) {
        fk.n_vocab = tok_n_vocab(tok);
        fk.lo = fk.n_vocab > 512 ? 300 : 0;
        fk.span = fk.n_vocab - fk.lo > 200 ? 200 : fk.n_vocab - fk.lo;
        fk.step_ms = o.fake_step_ms;
        fk.fail_at = o.fake_fail_at;
        ec.forward = fake_forward;
        ec.forward_ctx = &fk;
        ec.n_vocab = fk.n_vocab;
        if (fk.span <= 0) st = err_set(&e, SMELT_ERR_INVALID, "--fake-forward: vocabulary too small");
        if (st == SMELT_OK && o.fake_reply) {
            struct tok_ids r = {0};
            fk.eos = tok_specials(tok)->eos;
            fk.n_start = ec.n_blocks;
            fk.start = malloc((size_t)fk.n_start * sizeof *fk.start);
            st = tok_encode(tok, o.fake_reply, strlen(o.fake_reply), TOK_PARSE_SPECIAL, &r, &e);
            if (st == SMELT_OK && (!fk.start || fk.eos < 0))
                st = err_set(&e, fk.start ? SMELT_ERR_INVALID : SMELT_ERR_NOMEM,
                             "--fake-reply: %s", fk.start ? "the vocabulary has no eos" : "out of memory");
            if (st == SMELT_OK) {
                for (int32_t i = 0; i < fk.n_start; i++) fk.start[i] = -1;
                fk.script = r.v;
                fk.n_script = (int32_t)r.n;
                r.v = NULL;
            }
            tok_ids_free(&r);
        }
    }
    if (st == SMELT_OK) st = engine_new(&en, &ec, m, kv, tok, &e);
    if (st == SMELT_OK) {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        name = o.served ? strdup(o.served) : strdup(base);
        if (name && !o.served) {
            size_t n = strlen(name);
            if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = 0;
        }
        struct server_config sc = {0};
        sc.host = o.host;
        sc.port = o.port;
        sc.api_key = o.api_key;
        sc.max_body = (size_t)o.max_body;
        sc.timeout_s = o.timeout_s;
        sc.header_timeout_s = o.header_timeout_s;
        sc.body_budget = (size_t)o.body_budget;
        sc.max_connections = o.max_connections;
        sc.max_per_client = o.max_per_client == -2 ? 0 : o.max_per_client == 0 ? -1 : o.max_per_client;
        sc.admin = o.admin_port >= 0;
        sc.admin_port = o.admin_port;
        sc.admin_host = o.admin_host;
        sc.threads = o.http_threads;
        sc.log_json = !strcmp(o.log_format, "json");
        sc.quiet = o.quiet;
        sc.cors_origins = o.cors_origins;
        sc.response_store = o.response_store > 0 ? (size_t)o.response_store : 0;
        sc.no_response_store = o.response_store == 0;
        struct server_model sm = {0};
        /* the requested model name may also be the reference given on the command line */
        const char *aliases[8];
        int na = 0;
        for (int i = 0; i < o.n_aliases; i++) aliases[na++] = o.aliases[i];
        if (!o.served && strcmp(o.model, name ? name : "")) sm.hidden_alias = o.model;
        sm.id = name ? name : "model";
        sm.aliases = aliases;
        sm.n_aliases = na;
        sm.en = en;
        sm.tok = tok;
        sm.tmpl = tm;
        sm.tmpl_src = ct.src;
        sm.tmpl_fallback = ct.fallback;
        sm.tmpl_tools = tm_tools;
        sm.tmpl_tools_src = ct.tool_use;
        sm.bos_text = bos;
        sm.eos_text = eos;
        sm.n_ctx = engine_config(en)->n_ctx;
        sm.created = (int64_t)time(NULL);
        sample_params_default(&sm.defaults);
        float x;
        uint32_t k;
        if (gguf_get_f32(f, "general.sampling.temp", &x, NULL) == SMELT_OK) sm.defaults.temperature = x;
        if (gguf_get_u32(f, "general.sampling.top_k", &k, NULL) == SMELT_OK) sm.defaults.top_k = (int32_t)k;
        if (gguf_get_f32(f, "general.sampling.top_p", &x, NULL) == SMELT_OK) sm.defaults.top_p = x;
        if (gguf_get_f32(f, "general.sampling.min_p", &x, NULL) == SMELT_OK) sm.defaults.min_p = x;
        if (gguf_get_f32(f, "general.sampling.penalty_repeat", &x, NULL) == SMELT_OK)
            sm.defaults.repetition_penalty = x;
        st = server_new(&srv, &sc, &sm, &e);
        if (st == SMELT_OK) {
            const struct engine_config *c = engine_config(en);
            fprintf(stderr,
                    "smelt serve: %s on %s: %d sequences, %d tokens per step, KV %d blocks of "
                    "%d (%lld tokens), context %d, prefix cache %s\n",
                    sm.id, o.fake ? "a fake forward" : (cuda ? "cuda" : "cpu"), c->max_seqs,
                    c->max_batch_tokens, c->n_blocks, c->block_size,
                    (long long)c->n_blocks * c->block_size, c->n_ctx,
                    c->no_prefix_cache ? "off" : "on");
            if (server_admin_port(srv) >= 0)
                fprintf(stderr, "smelt serve: admin (/health, /metrics) on http://%s:%d\n",
                        o.admin_host ? o.admin_host : o.host ? o.host : "127.0.0.1",
                        server_admin_port(srv));
            fprintf(stderr, "smelt serve: listening on http://%s:%d\n", o.host ? o.host : "127.0.0.1",
                    server_port(srv));
            fflush(stderr);
            int sig = 0;
            sigwait(&sigs, &sig);
            fprintf(stderr, "smelt serve: %s: shutting down (grace %.0f s; a second signal "
                            "cancels requests now)\n",
                    sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_s);
            fflush(stderr);
            struct second_signal ss = {.sigs = &sigs, .srv = srv};
            bool waiting = pthread_create(&ss.th, NULL, wait_second_signal, &ss) == 0;
            server_shutdown(srv, o.grace_s);
            if (waiting) { /* wake the waiter if no second signal came */
                atomic_store(&ss.done, true);
                pthread_kill(ss.th, SIGTERM);
                pthread_join(ss.th, NULL);
            }
        }
    }
    rc = st == SMELT_OK ? 0 : cli_fail("serve", &e);
    server_free(srv);
    engine_free(en);
    if (m && kv) model_kv_free(m, kv);
    model_free(m);
    bk_free(bk);
    tmpl_free(tm);
    tmpl_free(tm_tools);
    tmpl_sources_free(&ct);
    tok_free(tok);
    gguf_close(f);
    free(bos);
    free(eos);
    free(name);
    free(fk.hot);
    free(fk.script);
    free(fk.start);
    if (rc == 0) fprintf(stderr, "smelt serve: stopped\n");
    return rc;
}

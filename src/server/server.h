/* The OpenAI-compatible HTTP server (libmicrohttpd + jansson) over one model's engine, or
 * several models' (server/models.h: loaded on demand, routed by the request's "model").
 *
 * Routes (each also without the /v1 prefix):
 *   POST /v1/chat/completions, POST /v1/completions   generation (streaming or not)
 *   POST /v1/messages, /v1/messages/count_tokens      Anthropic Messages (anthropic.c)
 *   POST /v1/responses, GET /v1/responses/{id}        OpenAI Responses (responses.c)
 *   OPTIONS                                           CORS preflights (cors_origins)
 *   GET  /v1/models, GET /v1/models/{id}
 *   GET  /health                                      200 {"status":"ok"}; no auth
 *   GET  /metrics                                     Prometheus text format
 *   POST /tokenize, POST /detokenize
 *   GET  /, GET /webui/{name}                         the web chat's files (webui.c); no auth
 *
 * Threads: libmicrohttpd's internal epoll threads (a small pool) run every connection.
 * Parsing, templating and tokenizing happen there; the engine thread only schedules and
 * samples. A connection waiting for the engine is suspended (MHD_suspend_connection), not
 * parked on a thread: the engine's notification resumes it. So an idle stream or a
 * queued request costs a socket and a few hundred bytes, not a thread.
 *
 * Shutdown (server_shutdown): stop accepting connections, refuse new requests with 503,
 * let in-flight requests finish for a grace period, cancel the rest, close.
 *
 * Hardening (docs/server.md, "Limits and hardening"): a request is judged on its headers
 * alone (framing, route, method, API key, declared length, the body budget) and refused
 * before any of its body is read; every resource a client can hold (connections, per
 * address, header and request time, body bytes one and all) has a bound.
 */
#ifndef SMELT_SERVER_H
#define SMELT_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sample.h"
#include "util/err.h"

struct tok;
struct tmpl;

struct server_config {
    const char *host;     /* listen address (default 127.0.0.1) */
    int port;             /* 0: any free port (see server_port) */
    const char *api_key;  /* NULL: no auth */
    size_t max_body;      /* request body limit in bytes (default 32 MiB) */
    size_t body_budget;   /* request body bytes buffered at once over all connections
                           * (default 8 * max_body); a request that would pass it gets 503 */
    int timeout_s;        /* a request must arrive (headers and body) within this, and an
                           * idle connection closes after it (default 120) */
    int header_timeout_s; /* a request's headers must arrive within this of the moment the
                           * connection could send them (accept, or the end of its previous
                           * request): idle and trickling connections close (default 10) */
    int threads;          /* HTTP threads (default 2) */
    int max_connections;  /* open connections (default: the open-file limit less a
                           * headroom of max(64, 1/8) for everything else, at most 8192) */
    int max_per_client;   /* open connections from one client address (0: a quarter of
                           * max_connections; < 0: no cap) */
    bool admin;           /* a second listener for /health and /metrics only, with its own
                           * connections: reachable when the main one is full */
    const char *admin_host; /* its address (default: host) */
    int admin_port;       /* its port (0: any free port, see server_admin_port) */
    const char *cors_origins; /* origins allowed by CORS: a comma list, or "*" (NULL or "":
                               * none; preflights are then refused like any OPTIONS) */
    size_t response_store;    /* bytes of finished /v1/responses kept for previous_response_id
                               * (0: the default, 64 MiB) */
    bool no_response_store;   /* keep none */
    bool no_webui;        /* do not serve the web chat (/ and /webui/...: 404) */
    bool log_json;        /* request log lines as JSON */
    bool quiet;           /* no request log lines */
};

/* What the server serves. Everything must outlive the server. */
struct server_model {
    const char *id;                 /* the served model name (/v1/models, responses) */
    const char *const *aliases;     /* other names a request's "model" may use (listed) */
    int n_aliases;
    const char *hidden_alias;       /* one more accepted name, not listed (the CLI's MODEL) */
    struct engine *en;
    const struct tok *tok;
    const struct tmpl *tmpl;        /* chat template; NULL: chat is refused */
    const char *tmpl_src;           /* its source (picks the tool-call syntax); may be NULL */
    bool tmpl_fallback;             /* tmpl is the ChatML default (the model has none): it
                                     * writes no BOS, so prompts get the vocab's */
    const struct tmpl *tmpl_tools;  /* tokenizer.chat_template.tool_use: used instead of tmpl
                                     * when a request passes tools; may be NULL */
    const char *tmpl_tools_src;
    const char *bos_text, *eos_text; /* template variables bos_token / eos_token; may be NULL */
    int32_t n_ctx;                  /* positions per sequence */
    int64_t created;                /* Unix time for /v1/models */
    struct sample_params defaults;  /* sampling defaults of fields a request does not set (the
                                     * GGUF's general.sampling.* < the server's settings) */
    bool seed_set;                  /* defaults.seed is the seed of requests without one (else
                                     * each draws a random one) */
    int32_t max_piece;              /* (set by the server) the longest token piece in bytes */
};

struct server;
struct server_loader;
struct server_model_def;

/* Starts listening and serving one model, loaded by the caller. */
smelt_status server_new(struct server **out, const struct server_config *cfg,
                        const struct server_model *m, struct err *e);
/* Starts serving n models (server/models.h: defs[0] is the default one), loaded and unloaded
 * by ld; at most max_loaded at once (0: no bound). The models to load at start (preload,
 * pinned) are loaded before it listens; the first failure fails. */
smelt_status server_new_models(struct server **out, const struct server_config *cfg,
                               const struct server_model_def *defs, int n,
                               const struct server_loader *ld, int max_loaded, struct err *e);
/* The port it listens on. */
int server_port(const struct server *s);
/* Whether it serves the web chat at / (built with it, and not turned off by no_webui). */
bool server_has_webui(const struct server *s);
/* The admin listener's port (-1 without one). */
int server_admin_port(const struct server *s);
/* Stops accepting, waits up to grace_s for in-flight requests, cancels the rest, closes
 * every connection. */
void server_shutdown(struct server *s, double grace_s);
/* Makes a server_shutdown running in another thread end its grace period now: requests
 * still running are cancelled at once (a second SIGTERM). Safe from any thread. */
void server_hurry(struct server *s);
void server_free(struct server *s);

#endif

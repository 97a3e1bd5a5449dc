/* Server internals shared by server.c (HTTP, routing, lifecycle), gen.c (generation
 * requests) and metrics.c. */
#ifndef SMELT_SERVER_INT_H
#define SMELT_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "server/jw.h"
#include "server/models.h"
#include "server/oai.h"
#include "server/outp.h"
#include "server/resp_store.h"
#include "server/server.h"
#include "tokenizer/tok.h"
#include "util/sha256.h"

/* HTTP status counters for /metrics. */
#define SRV_N_STATUS 15
/* 200, 204 (a CORS preflight), 304 (the web chat's files, unchanged), 400, 401, 403 (a CORS preflight from an origin not allowed), 404, 405, 408 (the request did not arrive in time), 413, 429, 499 (the
 * client went away first), 500, 501, 503 */
extern const int srv_status_codes[SRV_N_STATUS];

/* A client socket from accept to close (MHD's connection notifications), for the request
 * deadlines: a request's headers must arrive within --header-timeout, and its headers and
 * body within --timeout, of the moment the connection could start sending it (accept, or
 * the end of its previous request). MHD's own timeout only ends idle connections: it
 * restarts on every byte received. */
struct sock {
    struct sock *prev, *next; /* server->socks, under server->smu */
    int fd;
    atomic_bool receiving;    /* a request is (or may be) arriving: the deadline runs */
    atomic_bool headers_done; /* its headers are in: --timeout runs, not --header-timeout */
    atomic_llong since_ms;    /* when it could start (monotonic ms) */
    atomic_bool timed_out;    /* closed for the deadline */
};

/* One libmicrohttpd daemon's context (the cls of every callback). */
struct listener {
    struct server *s;
    bool admin;               /* the admin listener: /health and /metrics only */
};

struct conn;
struct gen;

/* A reply's block, in the order the model wrote it, for the APIs whose replies are lists of
 * typed blocks (Anthropic Messages, OpenAI Responses): gen_api.c cuts the output parser's
 * pieces into them. */
enum gen_block_kind { GEN_TEXT = 0, GEN_REASONING = 1, GEN_CALL = 2 };
struct gen_block {
    uint8_t kind;
    bool closed;
    struct jw text;     /* the text, the reasoning, or the call's arguments (as written) */
    char *name;         /* GEN_CALL: the function's name (malloc'd) */
    char id[48];        /* made by the API's open hook (a tool_use id, an item id) */
    char call_id[48];   /* GEN_CALL: a second id where the API has one (Responses' call_id) */
};

/* An API served over the chat machinery: its request becomes a chat request (messages,
 * tools, sampling) that gen.c renders, runs and parses as it does OpenAI chat; the API
 * formats the reply. Replies have one choice. The stream hooks append SSE events to g->sse;
 * each runs once per event, in order: begin, then open / piece... / close per block, then
 * end. */
struct gen_api {
    const char *id_prefix; /* of the response id: "msg_", "resp_" */
    const char *prompt_param, *max_param; /* the API's names of chat's "messages" and
                                           * "max_tokens", for errors that name them */
    const char *format_param;             /* its name of chat's response_format */
    const char *schema_param;             /* its name of a tool's function.parameters */
    bool max_is_cap;                      /* max_tokens past the context is not refused: the
                                           * reply stops at the context's end (GEN_END_CONTEXT) */
    const char *block_prefix[3];          /* of a block's id, by gen_block_kind (NULL: none) */
    const char *call_id_prefix;           /* of a call block's call_id (NULL: none) */
    /* Parses the request body (a JSON object, taken: kept as g->api_req, the body as sent,
     * for the response) into g->rq (a chat request; n 1) for the request's model g->m (its
     * vocabulary, its sampling defaults); a refusal is a 400 naming the API's own field. */
    bool (*parse)(struct gen *g, json_t *body, struct oai_err *e);
    void (*begin)(struct gen *g);                           /* the stream's first events */
    void (*open)(struct gen *g, int32_t bi);                /* block bi begins */
    void (*piece)(struct gen *g, int32_t bi, const char *s, size_t n); /* bi grew by s */
    void (*close)(struct gen *g, int32_t bi);               /* bi is complete */
    void (*end)(struct gen *g, const struct oai_err *e);    /* the stream's last events; e:
                                                             * the reply failed (cut short) */
    /* The whole (non-streamed) response's body (malloc'd); NULL: out of memory. */
    char *(*whole)(struct gen *g);
};

/* A route's handler: runs once the whole request is in; queues the answer. */
typedef enum MHD_Result (*srv_route_fn)(struct conn *c);
/* A route (server.c's table: one entry per route, the early checks read its flags). */
struct srv_route {
    const char *path;         /* after the optional /v1 prefix; a final '*' matches a
                               * non-empty rest (conn->arg) */
    unsigned methods;         /* SRV_GET (GET and HEAD) and/or SRV_POST */
    unsigned flags;           /* SRV_OPEN, SRV_ADMIN, SRV_BODY */
    const char *name;         /* for the log */
    srv_route_fn fn;
    /* the error body in the route's API shape (NULL: OpenAI's, oai_err_json); also for the
     * refusals made on the headers (401, 405, 413...) */
    char *(*err_json)(const struct oai_err *e);
};
#define SRV_GET 1u
#define SRV_POST 2u
#define SRV_OPEN 1u  /* no API key needed */
#define SRV_ADMIN 2u /* also served on the admin listener, and while draining */
#define SRV_BODY 4u  /* takes a request body (up to --max-body); others take none */
#define SRV_WEBUI 8u /* the web chat's files: absent with --no-webui */

struct server {
    struct server_config cfg;
    struct srv_models *models; /* what it serves (server/models.h) */
    int64_t created;           /* when it started (Unix time: /v1/models of unloaded models) */
    struct MHD_Daemon *d;
    int quiesced_fd;   /* the listen socket server_shutdown took from d (-1: none): closed after
                        * MHD_stop_daemon, as MHD's worker threads drop it from their epoll sets
                        * later (closing it at once made one abort "Failed to remove listen FD
                        * from epoll set") */
    int port;
    bool auth;         /* an API key is set */
    uint8_t key_digest[SHA256_DIGEST_LEN]; /* of the API key */
    atomic_bool draining;
    atomic_bool hurry;              /* server_hurry: end the grace period now */
    atomic_int n_conns, n_parked, n_streams;
    atomic_size_t body_used;        /* request body bytes buffered now (cfg.body_budget) */
    struct listener main_l, admin_l;
    struct MHD_Daemon *admin_d;     /* NULL: no admin listener */
    int admin_port;
    atomic_uint_fast64_t next_id;
    uint64_t id_key;
    char fingerprint[32];
    atomic_uint_fast64_t status_count[SRV_N_STATUS + 1]; /* last: other */
    pthread_mutex_t log_mu;

    /* The disconnect watcher: parked (suspended) connections are not polled by MHD, so a
     * client that goes away while its request waits for the engine would go unnoticed
     * until the first write. A thread polls their sockets a few times a second and
     * cancels the requests of those whose client hung up. */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    struct gen *watch; /* parked gens (doubly linked through wprev / wnext) */
    struct conn *mwaits; /* requests parked until their model is loaded (mprev / mnext) */
    pthread_t wth;
    bool wstarted, wstop;
    /* the request deadline: every open socket; the watcher also closes those whose request
     * is late (see struct sock) */
    pthread_mutex_t smu;
    struct sock *socks;
    struct resp_store *store;       /* finished /v1/responses (NULL: --response-store 0) */
};

/* One choice's accumulated output (non-streaming), and its stream state. */
struct choice {
    struct jw text;              /* all text (non-stream) */
    int32_t *tok;                /* generated tokens with logprobs (when asked) */
    float *lp;
    struct sample_token_logprob *top; /* (n_tok * top_n) */
    int32_t n_tok, cap_tok;
    uint8_t finish;              /* enum engine_finish */
    int32_t n_gen;
    bool role_sent;              /* chat stream: the first delta carried the role */
    struct outp op;              /* chat: reasoning / tool-call parser */
    bool prefilled;              /* chat: the forced call's opening was fed to op */
    int32_t n_calls;             /* tool calls begun so far */
    int64_t text_offset;         /* completions logprobs text_offset */
    /* chat: counting reasoning tokens (think_feed in gen.c) */
    uint8_t th_state;            /* THINK_OFF / _START / _IN / _DONE */
    uint8_t th_k;                /* bytes of the marker being matched so far */
    bool th_last;                /* the last token is counted (or pending) already */
    int32_t th_pend;             /* tokens holding a partial "<think>" not yet decided */
    int64_t n_reason;            /* tokens counted as reasoning */
};

/* A generation request in flight on a connection. */
struct gen {
    struct server *srv;
    struct conn *conn;
    const struct server_model *m; /* its model (the connection holds the reference) */
    json_t *body;                /* the parsed body, until oai_parse_json takes it */
    struct oai_request rq;
    char id[48];
    int64_t created;
    int32_t n_reqs;              /* engine requests (one per prompt) */
    struct engine_req **reqs;
    bool *req_done;
    int32_t *req_prompt_tokens, *req_cached;
    int32_t n_choices;           /* n_reqs * n */
    struct choice *ch;
    struct engine_out out;
    struct outp_delta delta;
    int32_t n_done_reqs;
    char error[ERR_MSG_MAX];     /* an engine failure */
    bool cancelled;              /* the engine cancelled a request (shutdown) */
    /* echo (completions): the prompt text of each prompt; with logprobs, the logprobs of
     * its tokens (pch[ri]: positions 1.., ptok0[ri]: the first token) */
    char **echo_text;
    size_t *echo_len;
    struct choice *pch;
    int32_t *ptok0;
    /* another API (NULL: OpenAI chat / completions): its reply as blocks */
    const struct gen_api *api;
    json_t *api_req;             /* the request as sent (owned) */
    struct gen_block *blk;       /* (n_blk) */
    int32_t n_blk, cap_blk;
    int32_t n_user_stops;        /* the request's own stop strings: rq.stop[0 .. n) */
    uint8_t stop;                /* the final event's engine_event.stop */
    bool api_done;               /* the final event came: the last block is the reply's last */
    struct jw held_ws;           /* a reasoning block's trailing whitespace, held back */
    int64_t seq;                 /* the API's stream event counter (Responses' sequence_number) */
    /* chat */
    enum outp_syntax syntax;
    bool reasoning, in_reasoning;
    char *prefill; /* the forced call's opening (the prompt ends with it) */
    size_t prefill_len;
    struct engine_grammar grammar; /* structured output: the reply's grammar (g NULL here: it
                                    * is the engine requests'), its forced beginning or trigger */

    /* waking: the engine's notify sets pending, or resumes the parked connection */
    pthread_mutex_t mu;
    bool parked, pending;
    /* the disconnect watcher (server->wmu) */
    struct gen *wprev, *wnext;
    bool watched;
    int fd;                      /* the connection's socket */
    atomic_bool client_gone;     /* the watcher saw the client hang up */

    /* streaming */
    struct jw sse;
    size_t sse_off;
    bool stream_end;             /* [DONE] formatted: end after sse is sent */
    int64_t usage_prompt, usage_completion, usage_cached;
    int64_t usage_proposed, usage_accepted; /* speculative draft tokens (the request log) */
    int64_t usage_reasoning;     /* summed from the choices' n_reason at the end */
    /* embeddings: each input's pooled vector, as the engine gave it */
    float *embd;                 /* (n_reqs, n_embd) */
    int32_t n_embd;              /* the model's vector size (engine_embd_size) */
};

/* The body of an embeddings response (malloc'd; NULL: out of memory): each input's vector
 * (g->embd) L2-normalized, cut to rq.dimensions first when set, as floats or base64 (embed.c). */
char *embed_body(const struct gen *g);

/* A request, from its request line (MHD's URI callback) to its completion. */
struct conn {
    struct server *srv;
    struct MHD_Connection *mc;
    atomic_int refs;             /* MHD's con_cls + a streaming response */
    bool admin;                  /* arrived on the admin listener */
    const char *uri;             /* the raw request target (in MHD's buffer; http_check) */
    size_t uri_len;
    bool uri_bad;                /* it holds a control byte */
    bool started;                /* the handler saw its headers (else MHD refused it) */
    bool handled;                /* the route ran */
    bool close;                  /* answer with Connection: close (the framing is suspect) */
    const char *allow;           /* a 405's Allow header */
    const struct srv_route *rt;  /* NULL: not a known route (the log shows the path) */
    const char *arg;             /* the '*' part of rt's path */
    /* the body: buffered up to body_limit bytes; body_charged bytes of the server's body
     * budget are held for it (its buffer's size) until srv_body_free */
    struct jw body;
    bool chunked;
    size_t body_limit, body_charged;
    int status;                  /* for the log */
    bool counted;                /* the status is counted in /metrics */
    struct sock *sock;           /* MHD's socket context (NULL: no deadline) */
    char method[16];
    char path[256];              /* for the log: the decoded path, cut on a character boundary */
    char id[48];                 /* the response id, once a generation request has one */
    double t0;
    struct gen *gen;
    /* the request's model (srv_model_for): held from its acquire to the end of the request */
    struct srv_model *model;
    const struct server_model *m;
    struct srv_model_wait mw;    /* parked until the model is loaded */
    bool mwaiting;               /* parked for it: the route runs again when resumed */
    uint8_t mwait_end;           /* why the watcher ended the wait: MWAIT_LATE, MWAIT_GONE */
    double mwait_t0;             /* since when (the wait is bounded by --timeout) */
    int fd;                      /* its socket (for the watcher) */
    struct conn *mprev, *mnext;  /* server->mwaits, under wmu */
};
#define MWAIT_LATE 1
#define MWAIT_GONE 2

/* ---- server.c ---- */
/* Adds the headers every response to c carries (CORS, when the request's Origin is allowed). */
void srv_add_headers(struct conn *c, struct MHD_Response *r);
/* What srv_model_for decided. */
enum srv_want { SRV_HAVE, SRV_PARKED, SRV_REFUSED, SRV_CLOSE };
/* The model a request names (name NULL: the default one), loaded: SRV_HAVE with *m (held
 * until the request ends; asking again returns the same); SRV_PARKED: the connection is
 * suspended until the model is loaded (return MHD_YES; the route runs again then, and
 * asks again); SRV_REFUSED: *e holds the answer (404 model_not_found, 503 while shutting
 * down or when the load outlasts --timeout, 500 model_load_failed with the load's error);
 * SRV_CLOSE: the client went away while it waited (return MHD_NO). Every route that needs
 * a model goes through it. */
enum srv_want srv_model_for(struct conn *c, const char *name, const struct server_model **m,
                            struct oai_err *e);
/* Sets the request's status (for the log); with count, also counts it for /metrics, once
 * per request (a stream is counted when its end is known: an engine error after the
 * headers makes it a 500). */
void srv_status(struct conn *c, int status, bool count);
void srv_conn_unref(struct conn *c);
/* Frees the request body and gives its share of the body budget back. */
void srv_body_free(struct conn *c);
/* Queues a response (takes ownership of body, malloc'd; ctype NULL: JSON), with the headers
 * its status and the request call for (Retry-After, WWW-Authenticate, Allow, and
 * Connection: close when the request's framing or unread body forbid another request). */
enum MHD_Result srv_respond(struct conn *c, int status, char *body, const char *ctype);
enum MHD_Result srv_error(struct conn *c, const struct oai_err *e);
void srv_new_id(struct server *s, const char *prefix, char *out, size_t n);
/* Whether name is the served model or one of its aliases. */
/* The answer of a route whose model srv_model_for did not give (w: SRV_PARKED, SRV_CLOSE,
 * or SRV_REFUSED with e). */
enum MHD_Result srv_not_yet(struct conn *c, enum srv_want w, const struct oai_err *e);

void srv_watch(struct server *s, struct gen *g);   /* under g->mu */
void srv_unwatch(struct server *s, struct gen *g); /* under g->mu, or when g is freed */

/* ---- http.c ---- */
/* What a request's headers say about its body. */
struct http_framing {
    bool has_body;   /* a body follows */
    bool chunked;    /* Transfer-Encoding: chunked (its length is unknown) */
    uint64_t length; /* Content-Length (0 when chunked or absent) */
};
/* Checks a request's line and headers (mc, at the first handler call) as RFC 9112 asks,
 * beyond what libmicrohttpd checks: every header (duplicates too) with no control byte in
 * a value (NUL, CR, LF...), token names, CR LF line ends, no folded lines; exactly one Host
 * on HTTP/1.1; one Authorization, one x-api-key; Content-Length headers that agree;
 * Transfer-Encoding (HTTP/1.1 only, never with Content-Length) whose one and last coding is
 * chunked. uri / uri_len: the raw target as MHD's URI callback saw it; uri_bad: it held a
 * control byte.
 * Fills f, or returns false with e: a 400, or a 501 for a transfer coding smelt does not
 * decode. The caller answers and closes the connection. */
bool http_check(struct MHD_Connection *mc, const char *uri, size_t uri_len, bool uri_bad,
                const char *method, const char *version, struct http_framing *f,
                struct oai_err *e);

/* ---- gen.c ---- */
/* Starts a generation request from c's body: parses (OpenAI chat or completions, or, with
 * api, that API's parser: a chat request), builds prompts, submits. Queues the response
 * (errors, a stream) or suspends the connection until it is done. */
enum MHD_Result gen_start(struct conn *c, enum oai_kind kind, const struct gen_api *api);
/* Called again for a suspended non-stream request after it was resumed. */
enum MHD_Result gen_resume(struct conn *c);
/* When the engine produced the request's first token (clock_now's clock, util/clock.h), 0 if none yet. */
double gen_first_token_time(const struct gen *g);
/* The connection is gone: detaches from the engine and frees. */
void gen_free(struct gen *g);
/* Tokenizes text for /tokenize and prompts (flags: TOK_*). A text too long for the context
 * by its length alone is refused first, untokenized: a 400 naming param ("prompt",
 * "messages", "content"). */
bool gen_tokenize(const struct server_model *m, const char *text, size_t len, unsigned flags,
                  const char *param, struct tok_ids *out, struct oai_err *e);

/* ---- chat.c ---- */
/* A chat request's prompt. */
struct chat_prompt {
    char *text;              /* the rendered prompt, the prefill at its end (malloc'd) */
    size_t len;
    const char *tmpl_src;    /* the template used (the model's strings) */
    enum outp_syntax syntax; /* the tool-call syntax to parse (OUTP_TOOLS_NONE: no tools) */
    bool reasoning;          /* the template uses <think> */
    bool in_reasoning;       /* the prompt opened <think> (before the prefill) */
    char *prefill;           /* a forced call's opening (malloc'd), or NULL */
    size_t prefill_len;
};
/* Picks the template, checks tools / tool_choice against it, renders the messages and
 * appends the prefill of a forced call. Errors are 400s that name the field. */
bool gen_chat_prompt(const struct server_model *m, const struct oai_request *rq,
                     struct chat_prompt *cp, struct oai_err *e);
void gen_chat_prompt_free(struct chat_prompt *cp);
/* Appends the prompt's tokens to ids (BOS first for the ChatML fallback). */
bool gen_chat_tokenize(const struct server_model *m, const struct chat_prompt *cp,
                       struct tok_ids *ids, struct oai_err *e);

/* ---- gen_api.c ---- */
/* One engine event of an API reply (g->api): the output parser's pieces cut into blocks
 * (g->blk), and, streaming, the API's open / piece / close hooks called as they form. */
void gen_api_event(struct gen *g, const struct engine_event *ev);
void gen_api_free(struct gen *g);
/* Why the reply ended, in the terms every block API shares. */
enum gen_end {
    GEN_END_TURN,     /* the model ended its turn */
    GEN_END_LENGTH,   /* max_tokens */
    GEN_END_CONTEXT,  /* the context's end, before max_tokens */
    GEN_END_STOP_SEQ, /* a stop string of the request */
    GEN_END_CALLS,    /* the reply calls tools */
    GEN_END_FAILED,   /* cut short: shutdown or an engine failure */
};
/* The reply's end; *stop_seq: the request's stop string that ended it (GEN_END_STOP_SEQ). */
enum gen_end gen_api_end(const struct gen *g, const char **stop_seq);

/* ---- anthropic.c ---- */
enum MHD_Result anth_route_messages(struct conn *c);      /* POST /v1/messages */
enum MHD_Result anth_route_count_tokens(struct conn *c);  /* POST /v1/messages/count_tokens */

/* ---- responses.c ---- */
enum MHD_Result resp_route_create(struct conn *c);        /* POST /v1/responses */
enum MHD_Result resp_route_get(struct conn *c);           /* GET /v1/responses/{id} */

/* ---- sgram.c ---- */
/* The grammar a request's reply must follow (structured output), before compiling. */
struct sgram {
    enum gram_kind kind; /* 0: none */
    struct jw text;      /* its text: the request's own (kind as given), or composed GBNF */
    bool composed;       /* text is GBNF built around the request's grammar / the calls */
    bool prefill;        /* it begins with the chat prompt's prefill (a forced call) */
    const char *trigger; /* lazy: it applies from this marker in the reply on (static) */
    const char *param;   /* the request field its errors name (static) */
};
/* The grammar of request rq (chat: cp its rendered prompt, for the tool-call syntax and the
 * reasoning; completions: NULL), or kind 0 when the reply is free. Errors are 400s naming
 * the field (a tool's schema that cannot be enforced in the template's syntax, a syntax smelt
 * cannot constrain). */
bool sgram_build(const struct oai_request *rq, const struct chat_prompt *cp, struct sgram *g,
                 struct oai_err *e);
void sgram_free(struct sgram *g);

/* ---- webui.c ---- */
enum MHD_Result webui_route(struct conn *c); /* GET / and /webui/NAME: the web chat's files */

/* ---- metrics.c ---- */
char *metrics_text(struct server *s);

#endif

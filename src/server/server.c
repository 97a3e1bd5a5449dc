/* HTTP side of the server: the libmicrohttpd daemons, connections, routing, auth, CORS, the
 * small routes (/health, /v1/models, /metrics, /tokenize, /detokenize), request logging
 * and shutdown. Generation routes are in gen.c (OpenAI, and /v1/embeddings, whose inputs
 * run as prompts that end in a vector: embed.c), anthropic.c and responses.c, the web
 * chat's files in webui.c, the strict header checks in http.c. See server.h.
 *
 * A request's life: MHD's URI callback (on_uri) allocates a struct conn when the request
 * line is in. MHD calls on_request once when the headers are in (first_call: every
 * decision that needs no body is taken there, and a refusal is answered before a byte of
 * the body is read, so an unauthenticated client costs no body memory and an
 * `Expect: 100-continue` client is never told to go on), once per body chunk (buffered up
 * to the route's limit, within the server's body budget), and once more at the end, where
 * the route runs. A generation request either answers at once (errors, a stream response
 * whose body comes from a callback) or suspends the connection until the engine says it
 * is done. on_completed (MHD's "request completed" notification, which also fires on a
 * client disconnect) detaches the request from the engine: a dropped stream is
 * cancelled at the engine's next step. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "server/apis.h"
#include "server/server_int.h"
#include "tokenizer/tok.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mix.h"
#include "util/utf8.h"

#define DEFAULT_MAX_BODY ((size_t)32 << 20)
#define DEFAULT_HEADER_TIMEOUT_S 10
#define ADMIN_CONNECTIONS 32 /* the admin listener's own connection limit */
#define DEFAULT_RESPONSE_STORE ((size_t)64 << 20)
#define RESP_STORE_COUNT 16384 /* responses kept at most (docs/server.md) */

const int srv_status_codes[SRV_N_STATUS] = {200, 204, 304, 400, 401, 403, 404, 405,
                                            408, 413, 429, 499, 500, 501, 503};

void srv_status(struct conn *c, int status, bool count) {
    c->status = status;
    if (!count || c->counted) return;
    c->counted = true;
    int i = 0;
    while (i < SRV_N_STATUS && srv_status_codes[i] != status) i++;
    atomic_fetch_add(&c->srv->status_count[i], 1);
}

/* "prefix-" + 24 base62 characters, unique per server (a keyed hash of a counter). */
void srv_new_id(struct server *s, const char *prefix, char *out, size_t n) {
    static const char b62[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint64_t c = atomic_fetch_add(&s->next_id, 1);
    uint64_t a = mix64(c ^ s->id_key), b = mix64(a + s->id_key + 0x9e3779b97f4a7c15ull);
    char id[25];
    for (int i = 0; i < 12; i++) {
        id[i] = b62[a % 62];
        a /= 62;
        id[12 + i] = b62[b % 62];
        b /= 62;
    }
    id[24] = 0;
    snprintf(out, n, "%s%s", prefix, id);
}

static bool mwait_cancel(struct conn *c);

/* ---- the body budget ---- */

/* Takes n bytes of the server's body budget; false (nothing taken) when that would pass it. */
static bool budget_take(struct server *s, size_t n) {
    size_t used = atomic_load(&s->body_used);
    do {
        if (used > s->cfg.body_budget || n > s->cfg.body_budget - used) return false;
    } while (!atomic_compare_exchange_weak(&s->body_used, &used, used + n));
    return true;
}

void srv_body_free(struct conn *c) {
    jw_free(&c->body);
    if (c->body_charged) atomic_fetch_sub(&c->srv->body_used, c->body_charged);
    c->body_charged = 0;
}

void srv_conn_unref(struct conn *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    gen_free(c->gen);
    mwait_cancel(c);
    if (c->model) srv_model_release(c->srv->models, c->model);
    srv_body_free(c);
    atomic_fetch_sub(&c->srv->n_conns, 1);
    free(c);
}

/* ---- CORS ---- */

/* The request's Origin when --cors-origins allows it (a comma list of origins, compared
 * without case, or "*"); NULL when there is none or it is not allowed. */
static const char *cors_origin(struct conn *c) {
    const char *list = c->srv->cfg.cors_origins;
    if (!list || !*list) return NULL;
    const char *o = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    if (!o || !*o) return NULL;
    size_t on = strlen(o);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *q = p;
        while (*q && *q != ',') q++;
        const char *end = q;
        while (end > p && end[-1] == ' ') end--;
        size_t n = (size_t)(end - p);
        if ((n == 1 && *p == '*') || (n == on && !strncasecmp(p, o, n))) return o;
        p = q;
    }
    return NULL;
}

void srv_add_headers(struct conn *c, struct MHD_Response *r) {
    const char *o = cors_origin(c);
    if (!o) return;
    bool any = !strcmp(c->srv->cfg.cors_origins, "*");
    MHD_add_response_header(r, "Access-Control-Allow-Origin", any ? "*" : o);
    if (!any) MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result srv_respond(struct conn *c, int status, char *body, const char *ctype) {
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, body ? body : (char *)"", MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype ? ctype : "application/json");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405 && c->allow) MHD_add_response_header(r, "Allow", c->allow);
    if (c->close) MHD_add_response_header(r, "Connection", "close");
    srv_add_headers(c, r);
    srv_status(c, status, true);
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* e as a body in the shape of the request's API. */
static char *err_json(const struct conn *c, const struct oai_err *e) {
    return c->rt && c->rt->err_json ? c->rt->err_json(e) : oai_err_json(e);
}

enum MHD_Result srv_error(struct conn *c, const struct oai_err *e) {
    if (e->status >= 500 && e->status != 501 && e->status != 503)
        log_error("request %s %s: %d %s", c->method, c->path, e->status, e->message);
    return srv_respond(c, e->status, err_json(c, e), NULL);
}

/* Answers e while MHD is reading the body, where it cannot queue a response: the answer is
 * written to the socket directly (MHD has nothing of its own to send there: at most a
 * 100 Continue, already sent), then MHD_NO makes MHD close the connection. For a body
 * that turns out too large, or would pass the budget, once it is being read (chunked). */
static enum MHD_Result refuse_now(struct conn *c, const struct oai_err *e) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    char *body = err_json(c, e);
    char head[256];
    const char *reason = MHD_get_reason_phrase_for((unsigned)e->status);
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "%sConnection: close\r\n\r\n",
                      e->status, reason ? reason : "", strlen(body),
                      e->status == 503 ? "Retry-After: 1\r\n" : "");
    if (ci && hn > 0 && (size_t)hn < sizeof head) { /* best effort: the socket may be full */
        struct iovec v[2] = {{head, (size_t)hn}, {body, strlen(body)}};
        struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
        ssize_t k = sendmsg(ci->connect_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)k;
    }
    free(body);
    srv_status(c, e->status, true);
    return MHD_NO;
}

static enum MHD_Result respond_json(struct conn *c, int status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        struct oai_err e;
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_error(c, &e);
    }
    return srv_respond(c, status, s, NULL);
}

/* ---- auth ---- */

/* The key check. Both sides are hashed (SHA-256) and the digests compared in constant
 * time, so the time taken depends on neither the key's bytes nor its length (a byte-wise
 * compare would stop at the first difference, and one over the longer string leaks the
 * length). The key's digest is made once, in server_new. */
static bool key_matches(struct server *s, const char *key) {
    uint8_t d[SHA256_DIGEST_LEN];
    sha256(key, strlen(key), d);
    unsigned char x = 0;
    for (int i = 0; i < SHA256_DIGEST_LEN; i++)
        x |= (unsigned char)(d[i] ^ s->key_digest[i]);
    return x == 0;
}

/* The key comes as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
 * (Anthropic's); either one that matches will do. */
static bool authorized(struct conn *c) {
    struct server *s = c->srv;
    if (!s->auth) return true;
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (key_matches(s, h)) return true;
    }
    h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key");
    return h && key_matches(s, h);
}

enum MHD_Result srv_not_yet(struct conn *c, enum srv_want w, const struct oai_err *e) {
    return w == SRV_PARKED ? MHD_YES : w == SRV_CLOSE ? MHD_NO : srv_error(c, e);
}

/* ---- small routes ---- */

/* ---- the request's model ---- */

/* park / wake of a request waiting for its model (server/models.h): both run under the
 * registry's lock, so a wake never comes before its park. */
static void mwait_park(void *ctx) {
    struct conn *c = ctx;
    struct server *s = c->srv;
    c->mwaiting = true;
    c->mwait_end = 0;
    c->mwait_t0 = clock_now();
    atomic_fetch_add(&s->n_parked, 1);
    MHD_suspend_connection(c->mc);
    pthread_mutex_lock(&s->wmu);
    c->mprev = NULL;
    c->mnext = s->mwaits;
    if (s->mwaits) s->mwaits->mprev = c;
    s->mwaits = c;
    pthread_mutex_unlock(&s->wmu);
}

/* Takes c off the watcher's list (it is there while it waits). */
static void mwait_unlist(struct server *s, struct conn *c) {
    pthread_mutex_lock(&s->wmu);
    if (c->mprev) c->mprev->mnext = c->mnext;
    else if (s->mwaits == c) s->mwaits = c->mnext;
    if (c->mnext) c->mnext->mprev = c->mprev;
    c->mprev = c->mnext = NULL;
    pthread_mutex_unlock(&s->wmu);
}

/* Ends c's wait for its model before the load does; true when it was still waiting (the
 * caller then resumes it, if it should run again). */
static bool mwait_cancel(struct conn *c) {
    if (!c->mw.on || !srv_model_unwait(c->srv->models, &c->mw)) return false;
    mwait_unlist(c->srv, c);
    atomic_fetch_sub(&c->srv->n_parked, 1);
    return true;
}

static void mwait_wake(void *ctx) {
    struct conn *c = ctx;
    mwait_unlist(c->srv, c);
    atomic_fetch_sub(&c->srv->n_parked, 1);
    MHD_resume_connection(c->mc);
}

/* "'a'", "'a', 'b' and 'c'" or "'a', 'b' and N more": the names a 404 lists. */
static void served_names(struct server *s, char *buf, size_t n) {
    int k = srv_models_count(s->models);
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < k && i < 3 && w < n; i++) {
        const char *id = srv_model_def(srv_models_at(s->models, i))->id;
        const char *sep = i == 0 ? "" : (i == k - 1 || i == 2) && k <= 3 ? " and " : ", ";
        w += (size_t)snprintf(buf + w, n - w, "%s'%.*s'", sep, oai_clip(id, 64), id);
    }
    if (k > 3 && w < n) snprintf(buf + w, n - w, " and %d more", k - 3);
}

enum srv_want srv_model_for(struct conn *c, const char *name, const struct server_model **m,
                            struct oai_err *e) {
    struct server *s = c->srv;
    if (c->m) {
        *m = c->m;
        return SRV_HAVE;
    }
    struct srv_model *sm = srv_models_find(s->models, name);
    if (c->mwait_end == MWAIT_GONE) return SRV_CLOSE;
    if (atomic_load(&s->draining)) {
        oai_fail(e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        return SRV_REFUSED;
    }
    if (!sm) {
        char names[256];
        served_names(s, names, sizeof names);
        oai_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                 "The model '%.*s' does not exist (this server serves %s)", oai_clip(name, 200),
                 name, names);
        return SRV_REFUSED;
    }
    if (c->mwait_end == MWAIT_LATE) {
        oai_fail(e, 503, "server_error", "model", "model_loading",
                 "The model '%s' is still loading after %d s (--timeout); retry later",
                 srv_model_def(sm)->id, s->cfg.timeout_s);
        return SRV_REFUSED;
    }
    char err[ERR_MSG_MAX];
    c->mw.park = mwait_park;
    c->mw.wake = mwait_wake;
    c->mw.ctx = c;
    switch (srv_model_acquire(s->models, sm, &c->mw, m, err, sizeof err)) {
    case SRV_READY:
        c->model = sm;
        c->m = *m;
        return SRV_HAVE;
    case SRV_WAIT: return SRV_PARKED;
    case SRV_FAILED: break;
    }
    oai_fail(e, 500, "server_error", "model", "model_load_failed", "The model '%s' could not be "
             "loaded: %s", srv_model_def(sm)->id, err);
    return SRV_REFUSED;
}

/* ---- small routes ---- */

/* A /v1/models entry: id (one of the model's names), its state as llama.cpp's router shows
 * it ("status": {"value": "loaded" | "loading" | "unloaded" | "unloading"}, with the last
 * failed load's message), max_model_len when known. */
static json_t *model_obj(struct server *s, struct srv_model *sm, const char *id) {
    struct srv_model_info in;
    srv_model_info(s->models, sm, &in);
    json_t *st = json_pack("{s:s}", "value", srv_model_state_str(in.state));
    if (st && in.error[0]) {
        json_object_set_new(st, "failed", json_true());
        json_object_set_new(st, "error", json_string(in.error));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", id, "object", "model", "created",
                          (json_int_t)(in.created ? in.created : s->created), "owned_by",
                          "smelt", "status", st);
    if (o && in.n_ctx > 0) json_object_set_new(o, "max_model_len", json_integer(in.n_ctx));
    return o;
}

static enum MHD_Result route_model(struct conn *c) {
    struct server *s = c->srv;
    const char *id = c->arg;
    struct srv_model *sm = srv_models_find(s->models, id);
    if (!sm) {
        struct oai_err e;
        oai_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                 "The model '%.*s' does not exist", oai_clip(id, 200), id);
        return srv_error(c, &e);
    }
    return respond_json(c, 200, model_obj(s, sm, id));
}

/* Every model, each under each of its listed names. */
static enum MHD_Result route_models(struct conn *c) {
    struct server *s = c->srv;
    json_t *list = json_array();
    for (int i = 0; i < srv_models_count(s->models); i++) {
        struct srv_model *sm = srv_models_at(s->models, i);
        const struct server_model_def *d = srv_model_def(sm);
        json_array_append_new(list, model_obj(s, sm, d->id));
        for (int k = 0; k < d->n_aliases; k++) json_array_append_new(list, model_obj(s, sm, d->aliases[k]));
    }
    return respond_json(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", list));
}

/* The body of /tokenize or /detokenize as an object, and its model (srv_model_for). */
static enum srv_want body_and_model(struct conn *c, json_t **j, const struct server_model **m,
                                    struct oai_err *e) {
    json_error_t je;
    *j = json_loadb(c->body.p ? c->body.p : "", c->body.n, JSON_REJECT_DUPLICATES, &je);
    if (!*j || !json_is_object(*j)) {
        oai_bad(e, NULL, "The body must be a JSON object%s%s", *j ? "" : ": ", *j ? "" : je.text);
        json_decref(*j);
        *j = NULL;
        return SRV_REFUSED;
    }
    json_t *name = json_object_get(*j, "model");
    if (name && !json_is_string(name) && !json_is_null(name)) {
        oai_bad(e, "model", "'model' must be a string");
        json_decref(*j);
        *j = NULL;
        return SRV_REFUSED;
    }
    enum srv_want w = srv_model_for(c, json_string_value(name), m, e);
    if (w != SRV_HAVE) {
        json_decref(*j);
        *j = NULL;
    }
    return w;
}


static enum MHD_Result route_tokenize(struct conn *c) {
    struct oai_err e;
    json_t *j;
    const struct server_model *m;
    enum srv_want w = body_and_model(c, &j, &m, &e);
    if (w != SRV_HAVE) return srv_not_yet(c, w, &e);
    json_t *text = json_object_get(j, "content");
    if (!text) text = json_object_get(j, "prompt");
    json_t *msgs = json_object_get(j, "messages");
    json_t *add = json_object_get(j, "add_special");
    if (!add) add = json_object_get(j, "add_special_tokens");
    json_t *pieces = json_object_get(j, "with_pieces");
    bool ok = true;
    const char *src = NULL;
    size_t slen = 0;
    unsigned flags = TOK_PARSE_SPECIAL;
    struct tok_ids ids = {0};
    if (msgs) {
        /* a chat: the prompt /v1/chat/completions would build (template choice, BOS of the
         * ChatML fallback and the prefill of a forced tool call included) */
        struct oai_request rq = {0};
        /* keep only the chat fields that shape the prompt */
        json_t *cj = json_pack("{s:O}", "messages", msgs);
        static const char *const pass[] = {"tools", "tool_choice", "chat_template_kwargs",
                                            "reasoning_effort", "add_generation_prompt",
                                            "continue_final_message", NULL};
        for (int k = 0; cj && pass[k]; k++) {
            json_t *v = json_object_get(j, pass[k]);
            if (v) json_object_set(cj, pass[k], v);
        }
        ok = cj ? oai_parse_json(cj, OAI_CHAT, tok_n_vocab(m->tok), NULL, &rq, &e)
                : oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        struct chat_prompt cp = {0};
        if (ok) ok = gen_chat_prompt(m, &rq, &cp, &e);
        if (ok) ok = gen_chat_tokenize(m, &cp, &ids, &e);
        gen_chat_prompt_free(&cp);
        oai_request_free(&rq);
    } else if (json_is_string(text)) {
        src = json_string_value(text);
        slen = json_string_length(text);
        if (!add || json_is_true(add)) flags |= TOK_ADD_SPECIAL;
    } else {
        ok = oai_bad(&e, "content", "'content' (a string) or 'messages' is required");
    }
    if (ok && add && !json_is_boolean(add)) ok = oai_bad(&e, "add_special", "must be a boolean");
    if (ok && !msgs) ok = gen_tokenize(m, src, slen, flags, "content", &ids, &e);
    if (!ok) {
        json_decref(j);
        tok_ids_free(&ids);
        return srv_error(c, &e);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < ids.n; i++) {
        if (json_is_true(pieces)) {
            /* a piece that is not valid UTF-8 on its own (a byte-fallback token, part of an
             * emoji) is its byte values, as llama.cpp gives it: the pieces always rejoin */
            size_t pl;
            const char *p = tok_piece(m->tok, ids.v[i], &pl);
            json_t *pj = utf8_validate((const uint8_t *)p, pl) == pl ? json_stringn(p, pl) : NULL;
            if (!pj) {
                pj = json_array();
                for (size_t b = 0; pj && b < pl; b++)
                    json_array_append_new(pj, json_integer((uint8_t)p[b]));
            }
            json_array_append_new(arr, json_pack("{s:i, s:o}", "id", ids.v[i], "piece", pj));
        } else {
            json_array_append_new(arr, json_integer(ids.v[i]));
        }
    }
    json_t *out = json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", (int)ids.n,
                            "max_model_len", (int)m->n_ctx);
    tok_ids_free(&ids);
    json_decref(j);
    return respond_json(c, 200, out);
}

static enum MHD_Result route_detokenize(struct conn *c) {
    struct oai_err e;
    json_t *j;
    const struct server_model *m;
    enum srv_want w = body_and_model(c, &j, &m, &e);
    if (w != SRV_HAVE) return srv_not_yet(c, w, &e);
    json_t *toks = json_object_get(j, "tokens");
    if (!json_is_array(toks)) {
        json_decref(j);
        oai_bad(&e, "tokens", "'tokens' (a list of token ids) is required");
        return srv_error(c, &e);
    }
    size_t n = json_array_size(toks), i;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    json_t *x;
    bool ok = ids != NULL;
    int32_t nv = tok_n_vocab(m->tok);
    json_array_foreach(toks, i, x) {
        if (!ok) break;
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= nv) {
            ok = oai_bad(&e, "tokens", "tokens[%zu] is not a token id (0..%d)", i, nv - 1);
            break;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    if (!ids) oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
    json_decref(j);
    struct tok_buf out = {0};
    struct err te;
    if (ok && tok_decode(m->tok, ids, n, TOK_DECODE_SPECIAL | TOK_DECODE_STRIP, &out, &te) != SMELT_OK)
        ok = oai_bad(&e, "tokens", "%s", te.msg);
    free(ids);
    if (!ok) {
        tok_buf_free(&out);
        return srv_error(c, &e);
    }
    json_t *txt = json_stringn_nocheck(out.p ? out.p : "", out.n);
    tok_buf_free(&out);
    return respond_json(c, 200, json_pack("{s:O, s:o}", "content", txt, "prompt", txt));
}

/* The body of /models/load or /models/unload: {"model": NAME}, NAME a served model. */
static struct srv_model *managed_model(struct conn *c, struct oai_err *e) {
    json_error_t je;
    json_t *j = json_loadb(c->body.p ? c->body.p : "", c->body.n, JSON_REJECT_DUPLICATES, &je);
    const char *name = json_string_value(json_object_get(j, "model"));
    struct srv_model *sm = name ? srv_models_find(c->srv->models, name) : NULL;
    if (!json_is_object(j))
        oai_bad(e, NULL, "The body must be a JSON object%s%s", j ? "" : ": ", j ? "" : je.text);
    else if (!name)
        oai_bad(e, "model", "'model' (a string: the model's name) is required");
    else if (!sm)
        oai_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                 "The model '%.*s' does not exist", oai_clip(name, 200), name);
    json_decref(j);
    return sm;
}

/* POST /models/load {"model"}: loads the model (unloading others as a request would) and
 * answers once it is loaded, as llama.cpp's router: {"success": true}. */
static enum MHD_Result route_model_load(struct conn *c) {
    struct oai_err e;
    const struct server_model *m;
    struct srv_model *sm = managed_model(c, &e); /* (again when it waited for the load) */
    if (!sm) return srv_error(c, &e);
    enum srv_want w = srv_model_for(c, srv_model_def(sm)->id, &m, &e);
    if (w != SRV_HAVE) return srv_not_yet(c, w, &e);
    return respond_json(c, 200, json_pack("{s:b}", "success", 1));
}

/* POST /models/unload {"model"}: unloads the model as soon as no request holds it (200
 * {"success": true}, also when it is not loaded); a pinned model, or one loading for
 * requests that wait, is refused (400). */
static enum MHD_Result route_model_unload(struct conn *c) {
    struct oai_err e;
    struct srv_model *sm = managed_model(c, &e);
    if (!sm) return srv_error(c, &e);
    const char *id = srv_model_def(sm)->id;
    switch (srv_model_unload(c->srv->models, sm)) {
    case SRV_UNLOAD_QUEUED:
    case SRV_UNLOAD_NOT_LOADED: return respond_json(c, 200, json_pack("{s:b}", "success", 1));
    case SRV_UNLOAD_PINNED:
        oai_fail(&e, 400, "invalid_request_error", "model", "model_pinned",
                 "The model '%s' is pinned: it is never unloaded", id);
        break;
    case SRV_UNLOAD_LOADING:
        oai_fail(&e, 400, "invalid_request_error", "model", "model_loading",
                 "The model '%s' is loading for requests that wait for it; unload it once "
                 "it is loaded", id);
        break;
    }
    return srv_error(c, &e);
}

static enum MHD_Result route_health(struct conn *c) {
    if (atomic_load(&c->srv->draining)) {
        struct oai_err e;
        oai_fail(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        return srv_error(c, &e);
    }
    return srv_respond(c, 200, strdup("{\"status\":\"ok\"}"), NULL);
}

static enum MHD_Result route_metrics(struct conn *c) {
    char *m = metrics_text(c->srv);
    if (!m) return MHD_NO;
    return srv_respond(c, 200, m, "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result route_chat(struct conn *c) { return gen_start(c, OAI_CHAT, NULL); }
static enum MHD_Result route_completions(struct conn *c) {
    return gen_start(c, OAI_COMPLETION, NULL);
}
static enum MHD_Result route_embeddings(struct conn *c) { return gen_start(c, OAI_EMBEDDING, NULL); }

/* ---- the access handler ---- */

/* Every route: a new one is one entry. The checks of first_call read the flags. */
static const struct srv_route routes[] = {
    {"/health", SRV_GET, SRV_OPEN | SRV_ADMIN, "health", route_health, NULL},
    {"/metrics", SRV_GET, SRV_ADMIN, "metrics", route_metrics, NULL},
    {"/models", SRV_GET, 0, "models", route_models, NULL},
    {"/models/load", SRV_POST, SRV_BODY, "model_load", route_model_load, NULL},
    {"/models/unload", SRV_POST, SRV_BODY, "model_unload", route_model_unload, NULL},
    {"/models/*", SRV_GET, 0, "models", route_model, NULL},
    {"/chat/completions", SRV_POST, SRV_BODY, "chat", route_chat, NULL},
    {"/completions", SRV_POST, SRV_BODY, "completions", route_completions, NULL},
    {"/embeddings", SRV_POST, SRV_BODY, "embeddings", route_embeddings, NULL},
    {"/tokenize", SRV_POST, SRV_BODY, "tokenize", route_tokenize, NULL},
    {"/detokenize", SRV_POST, SRV_BODY, "detokenize", route_detokenize, NULL},
    {"/messages", SRV_POST, SRV_BODY, "messages", anth_route_messages, anth_err_json},
    {"/messages/count_tokens", SRV_POST, SRV_BODY, "count_tokens", anth_route_count_tokens,
     anth_err_json},
    {"/responses", SRV_POST, SRV_BODY, "responses", resp_route_create, NULL},
    {"/responses/*", SRV_GET, 0, "responses", resp_route_get, NULL},
    {"/", SRV_GET, SRV_OPEN | SRV_WEBUI, "webui", webui_route, NULL},
    {"/webui/*", SRV_GET, SRV_OPEN | SRV_WEBUI, "webui", webui_route, NULL},
};

/* The route of url (also without its /v1 prefix); *arg: the part a '*' matched. */
static const struct srv_route *find_route(const char *url, const char **arg) {
    if (!strncmp(url, "/v1/", 4)) url += 3;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const char *p = routes[i].path;
        size_t n = strlen(p);
        if (p[n - 1] == '*') {
            if (!strncmp(url, p, n - 1) && url[n - 1]) {
                *arg = url + n - 1;
                return &routes[i];
            }
        } else if (!strcmp(url, p)) {
            return &routes[i];
        }
    }
    return NULL;
}

static long long now_ms(void) { return (long long)(clock_now() * 1e3); }

/* The request deadline passed (see struct sock): marks the socket. Before the headers are
 * in, the header timeout applies; after, the request timeout. */
static bool late(struct server *s, struct sock *k) {
    if (!k || !atomic_load(&k->receiving)) return false;
    long long limit = atomic_load(&k->headers_done) ? s->cfg.timeout_s : s->cfg.header_timeout_s;
    if (now_ms() - atomic_load(&k->since_ms) <= limit * 1000) return false;
    atomic_store(&k->timed_out, true);
    return true;
}

/* Copies src into dst (cap bytes) for the log, cut on a character boundary. */
static void clip_copy(char *dst, size_t cap, const char *src) {
    size_t n = strnlen(src, cap - 1);
    if (n == cap - 1) n -= utf8_tail_len((const uint8_t *)src, n);
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* MHD's URI callback: the request line is in. Its return value is the request's con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc) {
    struct listener *l = cls;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) return NULL; /* on_request closes the connection */
    c->srv = l->s;
    c->mc = mc;
    c->admin = l->admin;
    atomic_init(&c->refs, 1);
    c->t0 = clock_now();
    c->uri = uri;
    c->uri_len = strlen(uri);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    clip_copy(c->path, sizeof c->path, uri); /* the raw target, until first_call decodes it */
    for (size_t i = 0; i < c->uri_len && !c->uri_bad; i++)
        c->uri_bad = (unsigned char)uri[i] <= 0x20 || uri[i] == 0x7F;
    atomic_fetch_add(&l->s->n_conns, 1);
    return c;
}

/* A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method; --cors-origins
 * set): answered before the API key is checked, as browsers send it without credentials.
 * An allowed origin gets 204 with the route's methods and the headers it asked for (or
 * the ones smelt reads); any other, 403. */
static enum MHD_Result preflight(struct conn *c, const struct srv_route *rt,
                                 const struct http_framing *f) {
    struct oai_err e;
    if (!rt) {
        oai_fail(&e, 404, "invalid_request_error", NULL, "not_found", "Unknown route OPTIONS %.*s",
                 oai_clip(c->path, 200), c->path);
        return srv_error(c, &e);
    }
    if (!cors_origin(c)) {
        oai_fail(&e, 403, "permission_error", NULL, "origin_not_allowed",
                 "This origin is not allowed (--cors-origins)");
        return srv_error(c, &e);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    const char *hdrs = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                                   "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            rt->methods & SRV_POST ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            hdrs && *hdrs ? hdrs : "Authorization, Content-Type, x-api-key");
    MHD_add_response_header(r, "Access-Control-Max-Age", "7200");
    if (f->has_body) MHD_add_response_header(r, "Connection", "close");
    srv_add_headers(c, r);
    srv_status(c, 204, true);
    enum MHD_Result ret = MHD_queue_response(c->mc, 204, r);
    MHD_destroy_response(r);
    return ret;
}

/* The first handler call: the headers are in, nothing of the body is read. Every check
 * that needs no body happens here, in this order (each refusal is answered at once; a
 * request with a body pending is then closed, so its body is never read): the header
 * deadline, HTTP framing (http_check: 400, 501), the route's draining state (503), the
 * API key (401), the route (404), the method (405), the declared body size (413), the
 * body budget (503). Only a request that passes them all is told to go on (MHD sends
 * 100 Continue to a client that asked for it). */
static enum MHD_Result first_call(struct conn *c, const char *url, const char *method,
                                  const char *version) {
    struct server *s = c->srv;
    struct MHD_Connection *mc = c->mc;
    c->started = true;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct sock *k = ci ? ci->socket_context : NULL;
    if (late(s, k)) return MHD_NO; /* the headers came too late: close */
    if (k) atomic_store(&k->headers_done, true);
    c->sock = k;
    clip_copy(c->method, sizeof c->method, method);
    clip_copy(c->path, sizeof c->path, url);
    struct oai_err e;
    struct http_framing f;
    if (!http_check(mc, c->uri, c->uri_len, c->uri_bad, method, version, &f, &e)) {
        c->close = true; /* the framing cannot be trusted: nothing after it either */
        return srv_error(c, &e);
    }
    c->chunked = f.chunked;
    c->close = f.has_body; /* a refusal leaves the body unread: close after the answer */
    const struct srv_route *rt = find_route(url, &c->arg);
    if (rt && c->admin && !(rt->flags & SRV_ADMIN)) rt = NULL; /* the admin port has two */
    if (rt && (rt->flags & SRV_WEBUI) && s->cfg.no_webui) rt = NULL;
    c->rt = rt; /* (for the log, whatever the answer) */
    if (atomic_load(&s->draining) && !(rt && (rt->flags & SRV_ADMIN))) {
        oai_fail(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        return srv_error(c, &e);
    }
    if (!strcmp(method, "OPTIONS") && s->cfg.cors_origins && *s->cfg.cors_origins &&
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin") &&
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Access-Control-Request-Method"))
        return preflight(c, rt, &f);
    if (!(rt && (rt->flags & SRV_OPEN)) && !authorized(c)) {
        oai_fail(&e, 401, "authentication_error", NULL, "invalid_api_key",
                 "Incorrect or missing API key: send it as 'Authorization: Bearer KEY' or "
                 "'x-api-key: KEY'");
        return srv_error(c, &e);
    }
    if (!rt) {
        oai_fail(&e, 404, "invalid_request_error", NULL, "not_found", "Unknown route %s %.*s",
                 c->method, oai_clip(c->path, 200), c->path);
        return srv_error(c, &e);
    }
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!((rt->methods & SRV_GET) && get) && !((rt->methods & SRV_POST) && post)) {
        c->allow = rt->methods & SRV_POST ? "POST" : "GET, HEAD";
        oai_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                 "%s %.*s: method not allowed (use %s)", c->method, oai_clip(c->path, 200),
                 c->path, c->allow);
        return srv_error(c, &e);
    }
    c->body_limit = rt->flags & SRV_BODY ? s->cfg.max_body : 0;
    if (f.has_body && (f.chunked ? c->body_limit == 0 : f.length > c->body_limit)) {
        if (c->body_limit == 0)
            oai_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                     "%s %.*s takes no request body", c->method, oai_clip(c->path, 200), c->path);
        else
            oai_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                     "The request body (%llu bytes) is larger than the limit of %zu bytes "
                     "(--max-body)", (unsigned long long)f.length, c->body_limit);
        return srv_error(c, &e);
    }
    if (!f.chunked && f.length > 0) { /* the whole body's buffer, held from now */
        if (!budget_take(s, (size_t)f.length + 1)) {
            oai_fail(&e, 503, "server_error", NULL, "server_busy",
                     "The server is receiving too many request bodies at once (--body-budget "
                     "%zu bytes); retry later", s->cfg.body_budget);
            return srv_error(c, &e);
        }
        c->body_charged = (size_t)f.length + 1;
        c->body_limit = (size_t)f.length;
    }
    c->close = false;
    return MHD_YES;
}

/* A piece of the body: buffered, within the route's limit and the server's budget. The
 * buffer of a Content-Length body is its declared size (held since first_call); a chunked
 * one grows by doubling, each growth taken from the budget first. */
static enum MHD_Result body_chunk(struct conn *c, const char *data, size_t n) {
    struct server *s = c->srv;
    struct oai_err e;
    if (late(s, c->sock)) return MHD_NO; /* the body is too slow: close (logged 408) */
    if (n > c->body_limit - c->body.n) {
        oai_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                 "The request body is larger than the limit of %zu bytes (--max-body)",
                 s->cfg.max_body);
        return refuse_now(c, &e);
    }
    size_t need = c->body.n + n + 1;
    if (need > c->body.cap) {
        size_t cap = need;
        if (c->chunked) {
            cap = c->body.cap * 2 > need ? c->body.cap * 2 : need;
            if (cap < 4096) cap = 4096;
            if (cap > c->body_limit + 1) cap = c->body_limit + 1;
        }
        if (cap > c->body_charged) {
            if (!budget_take(s, cap - c->body_charged)) {
                oai_fail(&e, 503, "server_error", NULL, "server_busy",
                         "The server is receiving too many request bodies at once "
                         "(--body-budget %zu bytes); retry later", s->cfg.body_budget);
                return refuse_now(c, &e);
            }
            c->body_charged = cap;
        }
        char *p = realloc(c->body.p, cap);
        if (!p) return MHD_NO;
        c->body.p = p;
        c->body.cap = cap;
    }
    memcpy(c->body.p + c->body.n, data, n);
    c->body.n += n;
    c->body.p[c->body.n] = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)cls;
    (void)mc;
    struct conn *c = *con_cls;
    if (!c) return MHD_NO; /* on_uri ran out of memory */
    if (!c->started) return first_call(c, url, method, version);
    if (c->mwaiting) { /* its model is loaded (or the wait ended): the route runs again */
        c->mwaiting = false;
        return c->rt->fn(c);
    }
    if (c->gen) return gen_resume(c); /* a suspended request was resumed */
    if (*upload_size) {
        enum MHD_Result r = body_chunk(c, upload_data, *upload_size);
        *upload_size = 0;
        return r;
    }
    if (c->handled) return MHD_YES;
    c->handled = true;
    if (c->sock) atomic_store(&c->sock->receiving, false); /* all here: no deadline now */
    return c->rt->fn(c);
}

/* One line per request: text, or JSON with --log-format json. Every request that reached
 * the handler has one, whatever its status (408: its body did not arrive in time; 499: the
 * client went away before the answer was complete), and so does one that libmicrohttpd
 * refused itself (a malformed Content-Length, headers too large: route "-"). The text
 * line's fields are escaped (log_escape): the method and path are the client's. */
static void log_request(struct server *s, struct conn *c) {
    if (s->cfg.quiet) return;
    double total = clock_now() - c->t0;
    struct gen *g = c->gen;
    double tf = g ? gen_first_token_time(g) : 0; /* the engine's clock: clock_now too */
    double ttft = tf > 0 ? tf - c->t0 : -1;
    long long pt = g ? g->usage_prompt : 0, ct = g ? g->usage_completion : 0,
              cached = g ? g->usage_cached : 0;
    long long sprop = g ? g->usage_proposed : 0, sacc = g ? g->usage_accepted : 0;
    /* the fields only on a model that speculates */
    bool spec = g && g->m && g->m->en && engine_config(g->m->en)->spec.kind != SPEC_OFF;
    const char *id = c->id[0] ? c->id : "-";
    pthread_mutex_lock(&s->log_mu);
    if (s->cfg.log_json) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        const char *rt = c->rt ? c->rt->name : c->started ? c->path : "-";
        struct jw w = {0};
        jw_printf(&w, "{\"ts\":%lld.%03ld", (long long)now.tv_sec, now.tv_nsec / 1000000);
        jw_str(&w, ",\"level\":\"info\",\"msg\":\"request\",\"id\":");
        jw_json_str(&w, id, strlen(id));
        jw_str(&w, ",\"method\":");
        jw_json_str(&w, c->method, strlen(c->method));
        jw_str(&w, ",\"path\":");
        jw_json_str(&w, c->path, strlen(c->path));
        jw_str(&w, ",\"route\":");
        jw_json_str(&w, rt, strlen(rt));
        jw_printf(&w, ",\"status\":%d,\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
                      "\"completion_tokens\":%lld,", c->status, pt, cached, ct);
        if (spec) jw_printf(&w, "\"spec_proposed\":%lld,\"spec_accepted\":%lld,", sprop, sacc);
        jw_str(&w, "\"ttft_s\":");
        if (ttft >= 0) jw_float(&w, ttft);
        else jw_str(&w, "null");
        jw_str(&w, ",\"total_s\":");
        jw_float(&w, total);
        jw_str(&w, "}\n");
        if (w.p) fputs(w.p, stderr);
        jw_free(&w);
    } else {
        char tt[32] = "-", method[4 * sizeof c->method], path[4 * sizeof c->path];
        if (ttft >= 0) snprintf(tt, sizeof tt, "%.3fs", ttft);
        log_escape(method, sizeof method, c->method, strlen(c->method));
        log_escape(path, sizeof path, c->path, strlen(c->path));
        char spec_f[64] = "";
        if (spec) snprintf(spec_f, sizeof spec_f, " proposed=%lld accepted=%lld", sprop, sacc);
        fprintf(stderr, "smelt: request %s %s %s %d prompt=%lld cached=%lld completion=%lld%s "
                        "ttft=%s total=%.3fs\n",
                id, method, path, c->status, pt, cached, ct, spec_f, tt, total);
    }
    pthread_mutex_unlock(&s->log_mu);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct listener *l = cls;
    struct server *s = l->s;
    struct conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    bool log = true;
    if (!c->started) { /* MHD answered it itself, or the client left during its headers */
        const union MHD_ConnectionInfo *hi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_HTTP_STATUS);
        c->status = hi ? (int)hi->http_status : 0;
        log = c->status != 0;
        snprintf(c->method, sizeof c->method, "-");
    } else if (c->status == 0) { /* no answer was queued */
        c->status = c->sock && atomic_load(&c->sock->timed_out) ? 408 : 499;
    } else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && c->gen && !c->counted) {
        c->status = 499; /* the client went away mid-response (nginx's convention) */
    }
    if (log) {
        srv_status(c, c->status, true);
        log_request(s, c);
    }
    if (c->gen) {
        for (int32_t i = 0; i < c->gen->n_reqs; i++)
            if (c->gen->reqs[i]) engine_req_detach(c->gen->reqs[i]);
    }
    if (c->sock) { /* the next request on this connection may start now */
        atomic_store(&c->sock->since_ms, now_ms());
        atomic_store(&c->sock->headers_done, false);
        atomic_store(&c->sock->receiving, true);
    }
    srv_conn_unref(c);
}

/* MHD's connection notifications: a struct sock per socket, listed for the watcher. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct server *s = ((struct listener *)cls)->s;
    struct sock *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        k = ci ? calloc(1, sizeof *k) : NULL;
        if (!k) return; /* no deadline for this one */
        k->fd = ci->connect_fd;
        atomic_init(&k->receiving, true);
        atomic_init(&k->headers_done, false);
        atomic_init(&k->since_ms, now_ms());
        atomic_init(&k->timed_out, false);
        pthread_mutex_lock(&s->smu);
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->smu);
        *socket_context = k;
    } else if (k) { /* closed: MHD closes the fd after this returns */
        pthread_mutex_lock(&s->smu);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->smu);
        free(k);
        *socket_context = NULL;
    }
}

__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    log_debug("http: %s", buf);
}

/* ---- the disconnect watcher ---- */

void srv_watch(struct server *s, struct gen *g) {
    if (!s->wstarted || g->watched || g->fd < 0) return;
    pthread_mutex_lock(&s->wmu);
    g->wprev = NULL;
    g->wnext = s->watch;
    if (s->watch) s->watch->wprev = g;
    s->watch = g;
    g->watched = true;
    pthread_mutex_unlock(&s->wmu);
}

void srv_unwatch(struct server *s, struct gen *g) {
    if (!g->watched) return;
    pthread_mutex_lock(&s->wmu);
    if (g->wprev) g->wprev->wnext = g->wnext;
    else s->watch = g->wnext;
    if (g->wnext) g->wnext->wprev = g->wprev;
    g->wprev = g->wnext = NULL;
    g->watched = false;
    pthread_mutex_unlock(&s->wmu);
}

/* Ends the sockets whose request is past its deadline: shutdown() wakes MHD's poll on the
 * socket, which then reads EOF and closes the connection itself (a header trickle has no
 * handler call to refuse it). The fd is open while its sock is listed (smu, held here):
 * MHD closes it only after the CLOSED notification has unlisted it. */
static void end_late_requests(struct server *s) {
    pthread_mutex_lock(&s->smu);
    for (struct sock *k = s->socks; k; k = k->next) {
        if (atomic_load(&k->timed_out) || !late(s, k)) continue;
        shutdown(k->fd, SHUT_RDWR);
        log_debug("http: a request's %s did not arrive within %d s: closing its connection",
                  atomic_load(&k->headers_done) ? "body" : "headers",
                  atomic_load(&k->headers_done) ? s->cfg.timeout_s : s->cfg.header_timeout_s);
    }
    pthread_mutex_unlock(&s->smu);
}

/* Ends the waits for a model load that passed --timeout, or whose client hung up: each
 * such request is resumed (its route answers 503 model_loading, or closes). Called with wmu
 * held; drops it while it ends them (srv_model_unwait takes the registry's lock, which is
 * taken before wmu elsewhere). A collected conn is kept alive by a reference. */
static void end_model_waits(struct server *s) {
    enum { MAX = 64 };
    struct conn *late[MAX];
    uint8_t why[MAX];
    int n = 0;
    double now = clock_now();
    for (struct conn *c = s->mwaits; c && n < MAX; c = c->mnext) {
        uint8_t w = now - c->mwait_t0 > s->cfg.timeout_s ? MWAIT_LATE : 0;
        struct pollfd p = {c->fd, POLLRDHUP, 0};
        if (!w && c->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            w = MWAIT_GONE;
        if (!w) continue;
        atomic_fetch_add(&c->refs, 1);
        late[n] = c;
        why[n++] = w;
    }
    if (n == 0) return;
    pthread_mutex_unlock(&s->wmu);
    for (int i = 0; i < n; i++) {
        if (mwait_cancel(late[i])) {
            late[i]->mwait_end = why[i];
            MHD_resume_connection(late[i]->mc);
        }
        srv_conn_unref(late[i]);
    }
    pthread_mutex_lock(&s->wmu);
}

/* Every 200 ms: the request deadline (end_late_requests), then one poll() over the parked
 * sockets; a hang-up (the peer closed: POLLRDHUP, POLLHUP or POLLERR) cancels that
 * connection's requests. A gen stays valid while it is on the list (it is parked, so MHD
 * cannot close its connection) and leaves the list under wmu, which the scan holds. */
static void *watcher(void *arg) {
    struct server *s = arg;
    struct pollfd *fds = NULL;
    struct gen **gs = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&s->wmu);
    while (!s->wstop) {
        struct timespec dl = clock_after_ms(200);
        pthread_cond_timedwait(&s->wcv, &s->wmu, &dl);
        if (s->wstop) break;
        end_late_requests(s);
        end_model_waits(s);
        size_t n = 0;
        for (struct gen *g = s->watch; g; g = g->wnext) n++;
        if (n > cap) {
            struct pollfd *f = realloc(fds, n * sizeof *f);
            struct gen **q = f ? realloc(gs, n * sizeof *q) : NULL;
            if (f) fds = f;
            if (q) gs = q;
            if (!f || !q) continue;
            cap = n;
        }
        n = 0;
        for (struct gen *g = s->watch; g; g = g->wnext, n++) {
            fds[n] = (struct pollfd){g->fd, POLLRDHUP, 0};
            gs[n] = g;
        }
        if (n == 0 || poll(fds, (nfds_t)n, 0) <= 0) continue;
        for (size_t i = 0; i < n; i++) {
            if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            if (atomic_exchange(&gs[i]->client_gone, true)) continue;
            for (int32_t r = 0; r < gs[i]->n_reqs; r++)
                if (gs[i]->reqs[r]) engine_req_cancel(gs[i]->reqs[r]);
        }
    }
    pthread_mutex_unlock(&s->wmu);
    free(fds);
    free(gs);
    return NULL;
}

/* Stops the watcher thread (when it runs; once). wstarted stays as it is: MHD's workers may
 * still read it. */
static void watcher_stop(struct server *s) {
    if (!s->wstarted || s->wstop) return; /* (wstop is only written here, on this thread) */
    pthread_mutex_lock(&s->wmu);
    s->wstop = true;
    pthread_cond_signal(&s->wcv);
    pthread_mutex_unlock(&s->wmu);
    pthread_join(s->wth, NULL);
}

/* ---- lifecycle ---- */

/* The default connection limit for a process allowed nofile open files: what is left
 * after a headroom for everything else (model files, the engine, listeners), at most
 * 8192. */
static int default_max_connections(long nofile) {
    long n = nofile - (nofile / 8 > 64 ? nofile / 8 : 64);
    if (n > 8192) n = 8192;
    if (n < 16) n = 16;
    return (int)n;
}

/* Fills an IPv4 or IPv6 address for host:port; *v6 says which. */
static smelt_status sock_addr(const char *host, int port, struct sockaddr_storage *ss, bool *v6,
                              const char *flag, struct err *e) {
    memset(ss, 0, sizeof *ss);
    *v6 = strchr(host, ':') != NULL;
    if (*v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return err_set(e, SMELT_ERR_INVALID, "%s %s: not an IPv6 address", flag, host);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        const char *h = !strcmp(host, "localhost") ? "127.0.0.1" : host;
        if (inet_pton(AF_INET, h, &a->sin_addr) != 1)
            return err_set(e, SMELT_ERR_INVALID, "%s %s: not an IPv4 address", flag, host);
    }
    return SMELT_OK;
}

/* Starts one libmicrohttpd daemon on ss with the server's callbacks (cls: l). */
static struct MHD_Daemon *start_daemon(struct server *s, struct listener *l,
                                       struct sockaddr_storage *ss, bool v6, int port,
                                       unsigned threads, unsigned limit, unsigned per_ip) {
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_TURBO | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    return MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, l,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)ss,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, l,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, l,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.timeout_s,
                            MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                            MHD_OPTION_END);
}

static int daemon_port(struct MHD_Daemon *d, int asked) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : asked;
}

static void server_destroy(struct server *s) {
    watcher_stop(s);
    resp_store_free(s->store);
    srv_models_free(s->models);
    pthread_mutex_destroy(&s->log_mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->wcv);
    pthread_mutex_destroy(&s->smu);
    free(s);
}

/* Starts the server over its models (s->models, taken: freed with s on failure). */
static smelt_status server_start(struct server **out, struct server *s, const struct server_config *cfg,
                                 struct err *e) {
    s->cfg = *cfg;
    s->quiesced_fd = -1;
    s->created = (int64_t)time(NULL);
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.admin_host) s->cfg.admin_host = s->cfg.host;
    if (!s->cfg.max_body) s->cfg.max_body = DEFAULT_MAX_BODY;
    if (!s->cfg.body_budget)
        s->cfg.body_budget = s->cfg.max_body > SIZE_MAX / 8 ? SIZE_MAX : s->cfg.max_body * 8;
    if (s->cfg.timeout_s <= 0) s->cfg.timeout_s = 120;
    if (s->cfg.header_timeout_s <= 0) s->cfg.header_timeout_s = DEFAULT_HEADER_TIMEOUT_S;
    if (s->cfg.header_timeout_s > s->cfg.timeout_s) s->cfg.header_timeout_s = s->cfg.timeout_s;
    if (s->cfg.threads <= 0) { /* measured: 2 saturate a 2-core box; more cores, more threads */
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        s->cfg.threads = nc >= 16 ? (int)(nc / 4 > 8 ? 8 : nc / 4) : 2;
    }
    if (s->cfg.max_connections <= 0) {
        struct rlimit rl;
        long nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                          ? (long)rl.rlim_cur : 1024;
        s->cfg.max_connections = default_max_connections(nofile);
    }
    if (s->cfg.max_per_client == 0)
        s->cfg.max_per_client = s->cfg.max_connections / 4 > 0 ? s->cfg.max_connections / 4 : 1;
    if (s->cfg.body_budget < s->cfg.max_body) {
        smelt_status st = err_set(e, SMELT_ERR_INVALID, "--body-budget %zu is less than "
                                  "--max-body %zu: a body of the largest size could never be "
                                  "read", s->cfg.body_budget, s->cfg.max_body);
        srv_models_free(s->models);
        free(s);
        return st;
    }
    if (!s->cfg.response_store) s->cfg.response_store = DEFAULT_RESPONSE_STORE;
    if (!s->cfg.no_response_store &&
        !(s->store = resp_store_new(s->cfg.response_store, RESP_STORE_COUNT))) {
        free(s);
        return err_set(e, SMELT_ERR_NOMEM, "server: out of memory");
    }
    pthread_mutex_init(&s->log_mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    pthread_mutex_init(&s->smu, NULL);
    uint64_t key[2] = {0, 0};
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) key[0] = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    s->id_key = key[0];
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_smelt%08llx", (unsigned long long)(key[1] & 0xffffffffu));
    s->auth = s->cfg.api_key && *s->cfg.api_key;
    if (s->auth) sha256(s->cfg.api_key, strlen(s->cfg.api_key), s->key_digest);
    s->main_l = (struct listener){s, false};
    s->admin_l = (struct listener){s, true};
    s->admin_port = -1;

    struct sockaddr_storage ss, as;
    bool v6 = false, av6 = false;
    smelt_status st = sock_addr(s->cfg.host, s->cfg.port, &ss, &v6, "--host", e);
    if (st == SMELT_OK && s->cfg.admin)
        st = sock_addr(s->cfg.admin_host, s->cfg.admin_port, &as, &av6, "--admin-host", e);
    if (st != SMELT_OK) {
        server_destroy(s);
        return st;
    }
    /* the watcher first: MHD's workers read wstarted (srv_watch) as soon as the daemon runs */
    s->wstarted = pthread_create(&s->wth, NULL, watcher, s) == 0;
    s->d = start_daemon(s, &s->main_l, &ss, v6, s->cfg.port, (unsigned)s->cfg.threads,
                        (unsigned)s->cfg.max_connections,
                        s->cfg.max_per_client > 0 ? (unsigned)s->cfg.max_per_client : 0u);
    if (!s->d) {
        server_destroy(s);
        return err_set(e, SMELT_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)",
                       cfg->host ? cfg->host : "127.0.0.1", cfg->port);
    }
    s->port = daemon_port(s->d, s->cfg.port);
    if (s->cfg.admin) {
        s->admin_d = start_daemon(s, &s->admin_l, &as, av6, s->cfg.admin_port, 1,
                                  ADMIN_CONNECTIONS, 0);
        if (!s->admin_d) {
            MHD_stop_daemon(s->d);
            server_destroy(s);
            return err_set(e, SMELT_ERR_IO, "cannot listen on %s:%d (--admin-port: in use, or "
                           "not allowed)", s->cfg.admin_host, s->cfg.admin_port);
        }
        s->admin_port = daemon_port(s->admin_d, s->cfg.admin_port);
    }
    *out = s;
    return SMELT_OK;
}

smelt_status server_new(struct server **out, const struct server_config *cfg,
                        const struct server_model *m, struct err *e) {
    *out = NULL;
    struct server *s = calloc(1, sizeof *s);
    if (!s) return err_set(e, SMELT_ERR_NOMEM, "server: out of memory");
    struct server_model_def d = {.id = m->id, .aliases = m->aliases, .n_aliases = m->n_aliases,
                                 .hidden_alias = m->hidden_alias, .pinned = true, .device = -1};
    smelt_status st = srv_models_new(&s->models, &d, 1, NULL, 0, e);
    if (st != SMELT_OK) {
        free(s);
        return st;
    }
    srv_models_put(s->models, 0, m);
    return server_start(out, s, cfg, e);
}

smelt_status server_new_models(struct server **out, const struct server_config *cfg,
                               const struct server_model_def *defs, int n,
                               const struct server_loader *ld, int max_loaded, struct err *e) {
    *out = NULL;
    struct server *s = calloc(1, sizeof *s);
    if (!s) return err_set(e, SMELT_ERR_NOMEM, "server: out of memory");
    smelt_status st = srv_models_new(&s->models, defs, n, ld, max_loaded, e);
    if (st == SMELT_OK) st = srv_models_preload(s->models, e);
    if (st != SMELT_OK) {
        srv_models_free(s->models);
        free(s);
        return st;
    }
    return server_start(out, s, cfg, e);
}

int server_port(const struct server *s) { return s->port; }

int server_admin_port(const struct server *s) { return s->admin_port; }

void server_hurry(struct server *s) {
    if (s) atomic_store(&s->hurry, true);
}

void server_shutdown(struct server *s, double grace_s) {
    if (!s || !s->d) return;
    atomic_store(&s->draining, true);
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) s->quiesced_fd = ls; /* closed in server_free, after the stop */
    srv_models_drain(s->models);
    srv_models_wake_all(s->models); /* requests waiting for a load: 503 */
    double t0 = clock_now();
    int32_t n;
    while ((n = srv_models_in_flight(s->models)) > 0 && clock_now() - t0 < grace_s &&
           !atomic_load(&s->hurry))
        usleep(20000);
    if ((n = srv_models_in_flight(s->models)) > 0) {
        if (atomic_load(&s->hurry))
            log_warn("shutdown: a second signal: cancelling %d requests now", n);
        else
            log_warn("shutdown: cancelling %d requests still running after %.0f s", n, grace_s);
        srv_models_cancel_all(s->models);
    }
    /* every suspended connection is resumed by its request's end; wait for them, and
     * give the last bytes (a stream's error event) a moment to go out */
    t0 = clock_now();
    while ((atomic_load(&s->n_parked) > 0 || atomic_load(&s->n_streams) > 0) &&
           clock_now() - t0 < (atomic_load(&s->hurry) ? 1.0 : 5.0))
        usleep(10000);
}

void server_free(struct server *s) {
    if (!s) return;
    watcher_stop(s);
    if (s->admin_d) MHD_stop_daemon(s->admin_d);
    if (s->d && atomic_load(&s->n_parked) == 0) {
        MHD_stop_daemon(s->d);
        if (s->quiesced_fd >= 0) close(s->quiesced_fd);
    } else if (s->d) log_warn("shutdown: %d connections still wait for the engine; not closing them",
                            atomic_load(&s->n_parked));
    server_destroy(s);
}

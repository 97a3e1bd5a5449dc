/* Generation requests (/v1/chat/completions, /v1/completions): from a parsed request to
 * engine requests, and from engine events to OpenAI responses, streamed (SSE) or whole.
 *
 * Waking. Each engine request notifies this gen (on_ready, on the engine thread) when it
 * has output and the HTTP side asked to be told (engine_req_poll with arm). on_ready
 * resumes the connection when it is parked (suspended), or records `pending` when the
 * HTTP thread is still busy with it, so no wake-up is ever lost: the HTTP thread checks
 * `pending` under the same lock before it parks. MHD_suspend_connection and
 * MHD_resume_connection are both called under g->mu, so a resume never precedes its
 * suspend.
 *
 * Streaming cost per token on the HTTP side: one chunk formatted by appending bytes to a
 * buffer (jw), with the chunk's constant prefix ("data: {"id":...,"choices":[") made once
 * per request. When the engine runs ahead of the socket, one read drains every event
 * queued so far. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server/server_int.h"
#include "tokenizer/tok.h"
#include "util/log.h"

#define SSE_BLOCK (64 * 1024)

/* ---- prompts ---- */

bool gen_tokenize(const struct server_model *m, const char *text, size_t len, unsigned flags,
                  const char *param, struct tok_ids *out, struct oai_err *e) {
    /* a text of L bytes is at least L / max_piece tokens: refuse hopeless prompts before
     * spending time on them (the count is then a lower bound, and the message says so;
     * check_length gives the exact count of prompts that were tokenized) */
    int32_t mp = m->max_piece > 0 ? m->max_piece : 1;
    int64_t min_tokens = (int64_t)(len / (size_t)mp);
    if (min_tokens >= m->n_ctx)
        return oai_fail(e, 400, "invalid_request_error", param, "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, your %s "
                        "is at least %lld tokens long: an estimate, not an exact count (it is "
                        "%zu bytes and no token of this model is longer than %d bytes, so it "
                        "was not tokenized).",
                        m->n_ctx, param, (long long)min_tokens, len, mp);
    struct err te;
    if (tok_encode(m->tok, text, len, flags, out, &te) != SMELT_OK)
        return oai_fail(e, te.code == SMELT_ERR_NOMEM ? 500 : 400,
                        te.code == SMELT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                        NULL, NULL, "tokenizer: %s", te.msg);
    return true;
}

/* The request field that holds the prompt, for errors. */
static const char *prompt_param(enum oai_kind kind) {
    return kind == OAI_CHAT ? "messages" : kind == OAI_EMBEDDING ? "input" : "prompt";
}

static bool check_length(const struct server_model *m, const struct oai_request *rq, int32_t ri,
                         int32_t n_prompt, bool explicit_max, struct oai_err *e) {
    const char *param = prompt_param(rq->kind);
    if (rq->kind == OAI_EMBEDDING) { /* (the input may fill the context: nothing follows) */
        int32_t max = engine_embd_max_tokens(m->en);
        if (n_prompt > max)
            return oai_fail(e, 400, "invalid_request_error", param, "context_length_exceeded",
                            "This model's maximum input length is %d tokens. However, input %d "
                            "resulted in %d tokens (counted exactly). Please reduce its length.",
                            max, ri, n_prompt);
        return true;
    }
    if (n_prompt >= m->n_ctx)
        return oai_fail(e, 400, "invalid_request_error", param, "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, your %s "
                        "resulted in %d tokens (counted exactly). Please reduce its length.",
                        m->n_ctx, param, n_prompt);
    if (explicit_max && rq->max_tokens > 0 && (int64_t)n_prompt + rq->max_tokens > m->n_ctx)
        return oai_fail(e, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, you "
                        "requested %lld tokens (%d in the %s, %d for the completion).",
                        m->n_ctx, (long long)n_prompt + rq->max_tokens, n_prompt, param,
                        rq->max_tokens);
    return true;
}

/* ---- waking ---- */

static void on_ready(void *ctx) {
    struct gen *g = ctx;
    pthread_mutex_lock(&g->mu);
    if (g->parked) {
        g->parked = false;
        srv_unwatch(g->srv, g);
        atomic_fetch_sub(&g->srv->n_parked, 1);
        MHD_resume_connection(g->conn->mc);
    } else {
        g->pending = true;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Suspends the connection unless a wake-up came in meanwhile; returns false then (the
 * caller collects again). */
static bool try_park(struct gen *g) {
    pthread_mutex_lock(&g->mu);
    if (g->pending) {
        g->pending = false;
        pthread_mutex_unlock(&g->mu);
        return false;
    }
    g->parked = true;
    atomic_fetch_add(&g->srv->n_parked, 1);
    MHD_suspend_connection(g->conn->mc);
    srv_watch(g->srv, g);
    pthread_mutex_unlock(&g->mu);
    return true;
}

/* ---- formatting helpers ---- */

static void token_str(struct gen *g, struct jw *w, int32_t tok) {
    size_t n;
    const char *p = tok_piece(g->m->tok, tok, &n);
    jw_json_str(w, p, n);
}

/* A chat logprobs "content" entry. */
static void chat_lp_entry(struct gen *g, struct jw *w, int32_t tok, float lp,
                          const struct sample_token_logprob *top, int32_t n_top) {
    size_t n;
    const char *p = tok_piece(g->m->tok, tok, &n);
    jw_str(w, "{\"token\":");
    jw_json_str(w, p, n);
    jw_str(w, ",\"logprob\":");
    jw_float(w, lp);
    jw_str(w, ",\"bytes\":");
    jw_bytes_array(w, p, n);
    jw_str(w, ",\"top_logprobs\":[");
    for (int32_t i = 0; i < n_top && i < g->rq.top_logprobs; i++) {
        p = tok_piece(g->m->tok, top[i].token, &n);
        if (i) jw_raw(w, ",", 1);
        jw_str(w, "{\"token\":");
        jw_json_str(w, p, n);
        jw_str(w, ",\"logprob\":");
        jw_float(w, top[i].logprob);
        jw_str(w, ",\"bytes\":");
        jw_bytes_array(w, p, n);
        jw_raw(w, "}", 1);
    }
    jw_str(w, "]}");
}

/* Completions legacy logprobs for tokens [0, n): {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"}. offset0: the text offset of the first token. */
static void legacy_lp(struct gen *g, struct jw *w, const int32_t *tok, const float *lp,
                      const struct sample_token_logprob *top, int32_t n, int64_t *offset) {
    int32_t k = g->rq.top_logprobs;
    jw_str(w, "{\"tokens\":[");
    for (int32_t i = 0; i < n; i++) {
        if (i) jw_raw(w, ",", 1);
        token_str(g, w, tok[i]);
    }
    jw_str(w, "],\"token_logprobs\":[");
    for (int32_t i = 0; i < n; i++) {
        if (i) jw_raw(w, ",", 1);
        jw_float(w, lp[i]);
    }
    jw_str(w, "],\"top_logprobs\":[");
    for (int32_t i = 0; i < n; i++) {
        if (i) jw_raw(w, ",", 1);
        if (isnan(lp[i])) { /* the first prompt token has no logprob */
            jw_str(w, "null");
            continue;
        }
        jw_raw(w, "{", 1);
        bool first = true;
        for (int32_t j = 0; j < k; j++) {
            const struct sample_token_logprob *t = &top[(size_t)i * (size_t)k + (size_t)j];
            if (t->token < 0) continue;
            if (!first) jw_raw(w, ",", 1);
            first = false;
            token_str(g, w, t->token);
            jw_raw(w, ":", 1);
            jw_float(w, t->logprob);
        }
        jw_raw(w, "}", 1);
    }
    jw_str(w, "],\"text_offset\":[");
    for (int32_t i = 0; i < n; i++) {
        if (i) jw_raw(w, ",", 1);
        jw_int(w, *offset);
        size_t pn;
        tok_piece(g->m->tok, tok[i], &pn);
        if (!tok_is_control(g->m->tok, tok[i])) *offset += (int64_t)pn; /* as decoded */
    }
    jw_str(w, "]}");
}

/* ---- choices ---- */

static bool choice_add_token(struct choice *c, int32_t tok, float lp,
                             const struct sample_token_logprob *top, int32_t n_top, int32_t k) {
    if (c->n_tok == c->cap_tok) {
        int32_t cap = c->cap_tok ? c->cap_tok * 2 : 64;
        int32_t *t = realloc(c->tok, (size_t)cap * sizeof *t);
        if (t) c->tok = t;
        float *l = realloc(c->lp, (size_t)cap * sizeof *l);
        if (l) c->lp = l;
        struct sample_token_logprob *tp =
            k > 0 ? realloc(c->top, (size_t)cap * (size_t)k * sizeof *tp) : c->top;
        if (tp) c->top = tp;
        if (!t || !l || (k > 0 && !tp)) return false;
        c->cap_tok = cap;
    }
    c->tok[c->n_tok] = tok;
    c->lp[c->n_tok] = lp;
    for (int32_t j = 0; j < k; j++) {
        struct sample_token_logprob x = {-1, -INFINITY};
        if (j < n_top) x = top[j];
        c->top[(size_t)c->n_tok * (size_t)k + (size_t)j] = x;
    }
    c->n_tok++;
    return true;
}

/* A choice cut short says so: "abort" (cancelled: the server is shutting down; vLLM's
 * name) or "error" (the engine failed), never "stop", which would make a truncated
 * answer look complete. */
static const char *finish_reason(const struct gen *g, const struct choice *c) {
    if (c->finish == ENGINE_CANCELLED) return "abort";
    if (c->finish == ENGINE_ERROR) return "error";
    if (c->finish == ENGINE_LENGTH) return "length";
    if (c->n_calls > 0) return "tool_calls";
    return "stop";
}

/* ---- reasoning tokens ---- */

/* usage.completion_tokens_details.reasoning_tokens counts tokens, so it is decided per
 * engine event from the raw generated text, with the same rules as outp (leading
 * whitespace, then "<think>" opens the block unless the prompt already opened it; the
 * first "</think>" closes it; harmony: a reply that opens with the analysis channel's
 * "<|channel|>analysis<|message|>" up to its "<|end|>"): a generated token is a reasoning token when any byte of
 * the text released with it lies in the block, markers included. So the token that
 * straddles the end (its text holds the end of "</think>" and the first content bytes)
 * counts as reasoning, and so do tokens that held a partial "<think>" once it completes.
 * Text released without a token (held back until the end) belongs to the last token. */
enum { THINK_OFF, THINK_START, THINK_IN, THINK_DONE };

static void think_init(struct gen *g, struct choice *c) {
    /* a forced call's prefill closed any reasoning the prompt opened */
    c->th_state = !g->reasoning || g->prefill ? THINK_OFF
                  : g->in_reasoning           ? THINK_IN
                                              : THINK_START;
}

static void think_feed(struct gen *g, struct choice *c, int32_t token, const char *s, size_t n) {
    bool h = g->syntax == OUTP_HARMONY;
    /* (neither close marker repeats its first byte, which the matching below relies on) */
    const char *open = h ? "<|channel|>analysis<|message|>" : "<think>";
    const char *close = h ? "<|end|>" : "</think>";
    size_t lo = strlen(open), lc = strlen(close);
    if (c->th_state == THINK_OFF || c->th_state == THINK_DONE) return;
    if (token >= 0) c->th_last = false;
    bool hit = c->th_state == THINK_IN, partial = false;
    for (size_t i = 0; i < n && c->th_state != THINK_DONE; i++) {
        char b = s[i];
        if (c->th_state == THINK_START) {
            if (c->th_k == 0 && (b == ' ' || b == '\t' || b == '\n' || b == '\r')) continue;
            if (b != open[c->th_k]) {
                c->th_state = THINK_DONE; /* no reasoning block: the pending tokens are content */
                c->th_pend = 0;
                break;
            }
            partial = true;
            if (++c->th_k == lo) {
                c->th_state = THINK_IN;
                c->th_k = 0;
                c->n_reason += c->th_pend;
                c->th_pend = 0;
                hit = true;
            }
            continue;
        }
        /* THINK_IN: "</think>" has no border but "<", so a mismatch restarts at b */
        if (b == close[c->th_k]) c->th_k++;
        else c->th_k = b == '<';
        if (c->th_k == lc) c->th_state = THINK_DONE;
    }
    if (hit) {
        if (!c->th_last) c->n_reason++;
        c->th_last = true;
    } else if (partial && c->th_state == THINK_START && !c->th_last) {
        c->th_pend++;
        c->th_last = true;
    }
}

/* ---- streaming ---- */

static void chunk_begin(struct gen *g, struct jw *w) {
    jw_str(w, "data: {\"id\":\"");
    jw_str(w, g->id);
    jw_str(w, g->rq.kind == OAI_CHAT ? "\",\"object\":\"chat.completion.chunk\",\"created\":"
                                     : "\",\"object\":\"text_completion\",\"created\":");
    jw_int(w, g->created);
    jw_str(w, ",\"model\":");
    jw_json_str(w, g->m->id, strlen(g->m->id));
    jw_str(w, ",\"system_fingerprint\":\"");
    jw_str(w, g->srv->fingerprint);
    jw_str(w, "\",\"choices\":[");
}

static void chunk_end(struct gen *g, struct jw *w) {
    jw_str(w, g->rq.include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
}

static void chat_delta_chunk(struct gen *g, int32_t ci, const char *key, const char *s,
                             size_t n) {
    struct jw *w = &g->sse;
    chunk_begin(g, w);
    jw_printf(w, "{\"index\":%d,\"delta\":{\"%s\":", ci, key);
    jw_json_str(w, s, n);
    jw_str(w, "},\"logprobs\":null,\"finish_reason\":null}");
    chunk_end(g, w);
}

static void new_call_id(struct gen *g, char *out, size_t n) { srv_new_id(g->srv, "call_", out, n); }

/* Tool-call pieces as OpenAI streams them, one chunk each: a call's first delta carries
 * its index, id, type, name and "" arguments; the next ones its index and the next part
 * of the arguments. */
static void chat_calls_chunk(struct gen *g, int32_t ci, struct choice *c,
                             const struct outp_delta *d) {
    struct jw *w = &g->sse;
    for (int i = 0; i < d->n_calls; i++) {
        const struct outp_call *k = &d->calls[i];
        chunk_begin(g, w);
        jw_printf(w, "{\"index\":%d,\"delta\":{\"tool_calls\":[", ci);
        if (k->name) {
            char id[48];
            new_call_id(g, id, sizeof id);
            jw_printf(w, "{\"index\":%d,\"id\":\"%s\",\"type\":\"function\",\"function\":"
                         "{\"name\":", k->index, id);
            jw_json_str(w, k->name, strlen(k->name));
            jw_str(w, ",\"arguments\":\"\"}}");
            c->n_calls++;
        } else {
            jw_printf(w, "{\"index\":%d,\"function\":{\"arguments\":", k->index);
            jw_json_str(w, k->args.p ? k->args.p : "", k->args.n);
            jw_str(w, "}}");
        }
        jw_str(w, "]},\"logprobs\":null,\"finish_reason\":null}");
        chunk_end(g, w);
    }
}

static void chat_stream_delta(struct gen *g, int32_t ci, struct choice *c) {
    struct outp_delta *d = &g->delta;
    if (d->reasoning.n) chat_delta_chunk(g, ci, "reasoning_content", d->reasoning.p, d->reasoning.n);
    if (d->content.n) chat_delta_chunk(g, ci, "content", d->content.p, d->content.n);
    if (d->n_calls) chat_calls_chunk(g, ci, c, d);
}

/* One engine event of choice ci, streamed. */
static void stream_event(struct gen *g, int32_t ci, const struct engine_event *ev) {
    struct choice *c = &g->ch[ci];
    struct jw *w = &g->sse;
    const char *text = g->out.text + ev->text;
    bool lp = g->rq.logprobs && ev->token >= 0;
    const struct sample_token_logprob *top = g->out.top + ev->top;
    if (g->rq.kind == OAI_CHAT) {
        if (!c->role_sent) {
            c->role_sent = true;
            chunk_begin(g, w);
            jw_printf(w, "{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                         "\"logprobs\":null,\"finish_reason\":null}", ci);
            chunk_end(g, w);
        }
        outp_delta_clear(&g->delta);
        if (g->prefill && !c->prefilled) {
            c->prefilled = true;
            outp_prefill(&c->op, g->prefill, g->prefill_len, &g->delta);
        }
        if (ev->text_len) outp_push(&c->op, text, ev->text_len, &g->delta);
        if (ev->finish) outp_finish(&c->op, &g->delta);
        if (lp) {
            /* logprobs ride with the token's content (or alone when its text is held) */
            chunk_begin(g, w);
            jw_printf(w, "{\"index\":%d,\"delta\":{", ci);
            if (g->delta.content.n) {
                jw_str(w, "\"content\":");
                jw_json_str(w, g->delta.content.p, g->delta.content.n);
                g->delta.content.n = 0;
            }
            jw_str(w, "},\"logprobs\":{\"content\":[");
            chat_lp_entry(g, w, ev->token, ev->logprob, top, ev->n_top);
            jw_str(w, "],\"refusal\":null},\"finish_reason\":null}");
            chunk_end(g, w);
        }
        chat_stream_delta(g, ci, c);
        if (ev->finish) {
            c->finish = ev->finish;
            chunk_begin(g, w);
            jw_printf(w, "{\"index\":%d,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"%s\"}",
                      ci, finish_reason(g, c));
            chunk_end(g, w);
        }
        return;
    }
    /* completions. The first chunk of a choice with echo carries the prompt (and, with
     * logprobs, the prompt's tokens: the first with a null logprob) before its first token,
     * as OpenAI's legacy completions stream it. With max_tokens 0 (echo only) the one
     * token generated is not part of the answer. */
    bool first = !c->role_sent;
    c->role_sent = true;
    int32_t pi = ci / g->rq.n;
    bool drop = g->rq.max_tokens == 0;
    size_t tl = drop ? 0 : ev->text_len;
    if (drop) lp = false;
    size_t echo_n = first && g->rq.echo ? g->echo_len[pi] : 0;
    bool echo_lp = first && g->rq.echo && g->rq.logprobs;
    if (!tl && !ev->finish && !lp && !echo_n && !echo_lp) return;
    chunk_begin(g, w);
    jw_printf(w, "{\"index\":%d,\"text\":", ci);
    if (echo_n) {
        /* the prompt goes first: one string with the token's text */
        struct jw t = {0};
        jw_raw(&t, g->echo_text[pi], echo_n);
        jw_raw(&t, text, tl);
        jw_json_str(w, t.p ? t.p : "", t.n);
        jw_free(&t);
    } else {
        jw_json_str(w, text, tl);
    }
    jw_str(w, ",\"logprobs\":");
    int32_t k = g->rq.top_logprobs;
    struct sample_token_logprob tops[SAMPLE_MAX_LOGPROBS];
    for (int32_t j = 0; lp && j < k; j++)
        tops[j] = j < ev->n_top ? top[j] : (struct sample_token_logprob){-1, 0};
    if (echo_lp) {
        /* the prompt's tokens, then this token: offsets count from the prompt's start */
        struct choice all = {0};
        const struct choice *pc = &g->pch[pi];
        bool ok = choice_add_token(&all, g->ptok0[pi], NAN, NULL, 0, k);
        for (int32_t i = 0; ok && i < pc->n_tok; i++)
            ok = choice_add_token(&all, pc->tok[i], pc->lp[i], pc->top + (size_t)i * (size_t)k, k, k);
        if (ok && lp) ok = choice_add_token(&all, ev->token, ev->logprob, tops, k, k);
        c->text_offset = 0;
        if (ok) legacy_lp(g, w, all.tok, all.lp, all.top, all.n_tok, &c->text_offset);
        else jw_str(w, "null");
        if (!ok) snprintf(g->error, sizeof g->error, "out of memory");
        free(all.tok);
        free(all.lp);
        free(all.top);
    } else if (lp) {
        float l = ev->logprob;
        int32_t t = ev->token;
        c->text_offset += (int64_t)echo_n;
        legacy_lp(g, w, &t, &l, tops, 1, &c->text_offset);
    } else {
        jw_str(w, "null");
    }
    if (ev->finish) {
        c->finish = ev->finish;
        jw_printf(w, ",\"finish_reason\":\"%s\"}", finish_reason(g, c));
    } else {
        jw_str(w, ",\"finish_reason\":null}");
    }
    chunk_end(g, w);
}

/* Sums the choices' reasoning tokens into usage_reasoning (never above the completion
 * tokens: the engine's count is the reference). */
static void usage_reasoning(struct gen *g) {
    int64_t r = 0;
    for (int32_t i = 0; i < g->n_choices; i++) r += g->ch[i].n_reason;
    g->usage_reasoning = r < g->usage_completion ? r : g->usage_completion;
}

static void openai_tail(struct gen *g, const struct oai_err *err);

/* The stream's end: an error event if it failed, the usage chunk, [DONE] (or the API's last
 * events). Its status is known here (the 200 on the wire becomes the error event's 500 or
 * 503 in the log and /metrics), and is counted before the last bytes go out. */
static void stream_tail(struct gen *g) {
    int status = 200;
    bool failed = g->error[0] || g->cancelled;
    struct oai_err e;
    if (failed) {
        if (g->error[0]) oai_fail(&e, 500, "server_error", NULL, NULL, "%s", g->error);
        else oai_fail(&e, 503, "server_error", NULL, "shutting_down", "the request was cancelled "
                      "(the server is shutting down)");
        status = e.status;
        if (g->error[0] && !atomic_load(&g->client_gone))
            log_error("request %s %s: the engine failed after the stream began: %s", g->id,
                      g->conn->path, g->error);
    }
    usage_reasoning(g);
    if (g->api)
        g->api->end(g, failed ? &e : NULL);
    else
        openai_tail(g, failed ? &e : NULL);
    g->stream_end = true;
    if (atomic_load(&g->client_gone)) srv_status(g->conn, 499, false); /* (counted on close) */
    else srv_status(g->conn, status, true);
}

/* OpenAI's stream end: the error event, the usage chunk, [DONE]. */
static void openai_tail(struct gen *g, const struct oai_err *err) {
    struct jw *w = &g->sse;
    if (err) {
        char *s = oai_err_json(err);
        jw_str(w, "data: ");
        jw_str(w, s);
        jw_str(w, "\n\n");
        free(s);
    }
    if (g->rq.include_usage) {
        chunk_begin(g, w);
        jw_printf(w, "],\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
                     "\"total_tokens\":%lld,\"prompt_tokens_details\":{\"cached_tokens\":%lld,"
                     "\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":%lld,"
                     "\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0,"
                     "\"audio_tokens\":0}}}\n\n",
                  (long long)g->usage_prompt, (long long)g->usage_completion,
                  (long long)(g->usage_prompt + g->usage_completion), (long long)g->usage_cached,
                  (long long)g->usage_reasoning);
    }
    jw_str(w, "data: [DONE]\n\n");
}

/* ---- collecting events ---- */

static void account(struct gen *g, int32_t ri, const struct engine_event *ev) {
    if (ev->choice == 0) {
        g->req_prompt_tokens[ri] = ev->n_prompt;
        g->req_cached[ri] = ev->n_cached;
        g->usage_prompt += ev->n_prompt;
        g->usage_cached += ev->n_cached;
    }
    if (g->rq.max_tokens != 0) g->usage_completion += ev->n_gen; /* 0: echo only */
    g->usage_proposed += ev->n_proposed;
    g->usage_accepted += ev->n_accepted;
    if (ev->finish == ENGINE_CANCELLED) g->cancelled = true;
}

static void whole_event(struct gen *g, int32_t ci, const struct engine_event *ev) {
    struct choice *c = &g->ch[ci];
    jw_raw(&c->text, g->out.text + ev->text, ev->text_len);
    if (g->rq.logprobs && ev->token >= 0) {
        int32_t k = g->rq.top_logprobs;
        if (!choice_add_token(c, ev->token, ev->logprob, g->out.top + ev->top, ev->n_top, k))
            snprintf(g->error, sizeof g->error, "out of memory");
    }
    if (ev->finish) c->finish = ev->finish;
}

/* Drains every engine request (leaving each armed). Returns true when anything changed. */
static bool collect(struct gen *g) {
    bool any = false;
    bool stream = g->rq.stream;
    for (int32_t ri = 0; ri < g->n_reqs; ri++) {
        if (g->req_done[ri]) continue;
        while (engine_req_poll(g->reqs[ri], &g->out, true)) {
            any = true;
            for (size_t i = 0; i < g->out.n_ev; i++) {
                const struct engine_event *ev = &g->out.ev[i];
                int32_t ci = ri * g->rq.n + ev->choice;
                if (ev->prompt) {
                    if (g->pch && !choice_add_token(&g->pch[ri], ev->token, ev->logprob,
                                                    g->out.top + ev->top, ev->n_top,
                                                    g->rq.top_logprobs))
                        snprintf(g->error, sizeof g->error, "out of memory");
                    continue;
                }
                if (ev->n_embd > 0 && ev->n_embd == g->n_embd && g->embd)
                    memcpy(g->embd + (size_t)ri * (size_t)g->n_embd, g->out.embd + ev->embd,
                           (size_t)g->n_embd * sizeof *g->embd);
                else if (g->embd && ev->finish == ENGINE_STOP && !g->error[0])
                    snprintf(g->error, sizeof g->error, "input %d: no embedding came back", ri);
                think_feed(g, &g->ch[ci], ev->token, g->out.text + ev->text, ev->text_len);
                if (ev->finish) {
                    account(g, ri, ev);
                    if (ev->finish == ENGINE_ERROR && !g->error[0])
                        snprintf(g->error, sizeof g->error, "%s",
                                 g->out.error[0] ? g->out.error : "the engine failed");
                }
                if (g->api) {
                    if (ev->finish) g->ch[ci].finish = ev->finish;
                    gen_api_event(g, ev);
                } else if (stream) {
                    stream_event(g, ci, ev);
                } else {
                    whole_event(g, ci, ev);
                }
            }
            if (g->out.done) {
                g->req_done[ri] = true;
                g->n_done_reqs++;
                break;
            }
        }
    }
    if (stream && g->n_done_reqs == g->n_reqs && !g->stream_end) {
        stream_tail(g);
        any = true;
    }
    return any;
}

/* MHD's content reader for a stream. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct conn *c = cls;
    struct gen *g = c->gen;
    (void)pos;
    for (;;) {
        if (g->sse_off < g->sse.n) {
            size_t k = g->sse.n - g->sse_off;
            if (k > max) k = max;
            memcpy(buf, g->sse.p + g->sse_off, k);
            g->sse_off += k;
            return (ssize_t)k;
        }
        g->sse.n = g->sse_off = 0;
        if (g->sse.cap > 4 * SSE_BLOCK) jw_free(&g->sse); /* do not keep a burst's buffer */
        if (g->stream_end) return MHD_CONTENT_READER_END_OF_STREAM;
        if (collect(g)) {
            if (g->sse.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (try_park(g)) return 0;
    }
}

static void stream_free(void *cls) {
    struct conn *c = cls;
    atomic_fetch_sub(&c->srv->n_streams, 1);
    srv_conn_unref(c);
}

/* ---- whole responses ---- */

/* OpenAI's CompletionUsage, details included (the same object for both endpoints) */
static json_t *usage_json(struct gen *g) {
    usage_reasoning(g);
    return json_pack("{s:I, s:I, s:I, s:{s:I, s:i}, s:{s:I, s:i, s:i, s:i}}", "prompt_tokens",
                     (json_int_t)g->usage_prompt, "completion_tokens",
                     (json_int_t)g->usage_completion, "total_tokens",
                     (json_int_t)(g->usage_prompt + g->usage_completion), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)g->usage_cached, "audio_tokens", 0,
                     "completion_tokens_details", "reasoning_tokens",
                     (json_int_t)g->usage_reasoning, "accepted_prediction_tokens", 0,
                     "rejected_prediction_tokens", 0, "audio_tokens", 0);
}

static json_t *raw_json(struct jw *w) {
    json_t *j = w->p ? json_loadb(w->p, w->n, 0, NULL) : NULL;
    w->n = 0;
    return j ? j : json_null();
}

static json_t *chat_choice_json(struct gen *g, int32_t ci) {
    struct choice *c = &g->ch[ci];
    struct outp_delta *d = &g->delta;
    outp_delta_clear(d);
    if (g->prefill) outp_prefill(&c->op, g->prefill, g->prefill_len, d);
    outp_push(&c->op, c->text.p ? c->text.p : "", c->text.n, d);
    outp_finish(&c->op, d);
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    /* the calls: each begins with its name piece, the next pieces are its arguments */
    json_t *calls = json_array();
    struct jw args = {0};
    for (int i = 0; i <= d->n_calls; i++) {
        const struct outp_call *k = i < d->n_calls ? &d->calls[i] : NULL;
        if ((!k || k->name) && json_array_size(calls) > 0) {
            json_t *fn = json_object_get(json_array_get(calls, json_array_size(calls) - 1),
                                         "function");
            json_object_set_new(fn, "arguments", json_stringn_nocheck(args.p ? args.p : "", args.n));
            args.n = 0;
        }
        if (!k) break;
        if (k->name) {
            char id[48];
            new_call_id(g, id, sizeof id);
            /* (nocheck: a name read raw from the model's text is not known to be UTF-8;
             * the writer repairs it) */
            json_t *fn = json_pack("{s:o, s:s}", "name", json_stringn_nocheck(k->name, strlen(k->name)),
                                   "arguments", "");
            json_t *call = fn ? json_pack("{s:s, s:s, s:o}", "id", id, "type", "function",
                                          "function", fn) : NULL;
            if (!call || json_array_append_new(calls, call) != 0)
                snprintf(g->error, sizeof g->error, "out of memory");
        } else {
            jw_raw(&args, k->args.p ? k->args.p : "", k->args.n);
        }
    }
    jw_free(&args);
    bool has_calls = json_array_size(calls) > 0;
    json_object_set_new(msg, "content", (d->content.n || !has_calls)
                                            ? json_stringn_nocheck(d->content.p ? d->content.p : "",
                                                                   d->content.n)
                                            : json_null());
    json_object_set_new(msg, "refusal", json_null());
    if (d->reasoning.n)
        json_object_set_new(msg, "reasoning_content",
                            json_stringn_nocheck(d->reasoning.p, d->reasoning.n));
    if (has_calls) {
        c->n_calls = (int32_t)json_array_size(calls);
        json_object_set_new(msg, "tool_calls", calls);
    } else {
        json_decref(calls);
    }
    json_t *lp = json_null();
    if (g->rq.logprobs) {
        struct jw w = {0};
        jw_str(&w, "{\"content\":[");
        int32_t k = g->rq.top_logprobs;
        for (int32_t i = 0; i < c->n_tok; i++) {
            if (i) jw_raw(&w, ",", 1);
            chat_lp_entry(g, &w, c->tok[i], c->lp[i], c->top + (size_t)i * (size_t)k, k);
        }
        jw_str(&w, "],\"refusal\":null}");
        lp = raw_json(&w);
        jw_free(&w);
    }
    return json_pack("{s:i, s:o, s:o, s:s}", "index", ci, "message", msg, "logprobs", lp,
                     "finish_reason", finish_reason(g, c));
}

static json_t *completion_choice_json(struct gen *g, int32_t ci) {
    struct choice *c = &g->ch[ci];
    struct jw text = {0};
    int32_t pi = ci / g->rq.n;
    if (g->rq.echo) jw_raw(&text, g->echo_text[pi], g->echo_len[pi]);
    jw_raw(&text, c->text.p ? c->text.p : "", c->text.n);
    json_t *t = json_stringn_nocheck(text.p ? text.p : "", text.n);
    jw_free(&text);
    json_t *lp = json_null();
    if (g->rq.logprobs && g->rq.echo) {
        /* the prompt's tokens first (the first one without a logprob), then the reply's */
        struct choice all = {0};
        const struct choice *pc = &g->pch[pi];
        int32_t k = g->rq.top_logprobs;
        bool ok = choice_add_token(&all, g->ptok0[pi], NAN, NULL, 0, k);
        for (int32_t i = 0; ok && i < pc->n_tok; i++)
            ok = choice_add_token(&all, pc->tok[i], pc->lp[i], pc->top + (size_t)i * (size_t)k, k, k);
        for (int32_t i = 0; ok && i < c->n_tok; i++)
            ok = choice_add_token(&all, c->tok[i], c->lp[i], c->top + (size_t)i * (size_t)k, k, k);
        struct jw w = {0};
        int64_t off = 0;
        if (ok) legacy_lp(g, &w, all.tok, all.lp, all.top, all.n_tok, &off);
        lp = ok ? raw_json(&w) : json_null();
        jw_free(&w);
        free(all.tok);
        free(all.lp);
        free(all.top);
    } else if (g->rq.logprobs) {
        struct jw w = {0};
        int64_t off = g->rq.echo ? (int64_t)g->echo_len[pi] : 0;
        legacy_lp(g, &w, c->tok, c->lp, c->top, c->n_tok, &off);
        lp = raw_json(&w);
        jw_free(&w);
    }
    return json_pack("{s:i, s:o, s:o, s:s}", "index", ci, "text", t, "logprobs", lp,
                     "finish_reason", finish_reason(g, c));
}

static enum MHD_Result respond_whole(struct conn *c) {
    struct gen *g = c->gen;
    if (atomic_load(&g->client_gone)) {
        c->status = 499; /* nobody to answer: close */
        return MHD_NO;
    }
    if (g->error[0]) {
        struct oai_err e;
        oai_fail(&e, 500, "server_error", NULL, NULL, "%s", g->error);
        return srv_error(c, &e);
    }
    if (g->cancelled) {
        struct oai_err e;
        oai_fail(&e, 503, "server_error", NULL, "shutting_down",
                 "the request was cancelled (the server is shutting down)");
        return srv_error(c, &e);
    }
    if (g->rq.kind == OAI_EMBEDDING || g->api) {
        usage_reasoning(g);
        char *body = g->api ? g->api->whole(g) : embed_body(g);
        if (!body) {
            struct oai_err e;
            oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            return srv_error(c, &e);
        }
        return srv_respond(c, 200, body, NULL);
    }
    json_t *choices = json_array();
    for (int32_t i = 0; i < g->n_choices; i++)
        json_array_append_new(choices, g->rq.kind == OAI_CHAT ? chat_choice_json(g, i)
                                                              : completion_choice_json(g, i));
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", g->id, "object",
                             g->rq.kind == OAI_CHAT ? "chat.completion" : "text_completion",
                             "created", (json_int_t)g->created, "model", g->m->id,
                             "system_fingerprint", g->srv->fingerprint, "choices", choices,
                             "usage", usage_json(g));
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) {
        struct oai_err e;
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_error(c, &e);
    }
    return srv_respond(c, 200, s, NULL);
}

/* ---- the request ---- */

double gen_first_token_time(const struct gen *g) {
    double first = 0;
    for (int32_t i = 0; i < g->n_reqs; i++) {
        double t = 0;
        if (g->reqs[i]) engine_req_times(g->reqs[i], NULL, &t, NULL);
        if (t > 0 && (first == 0 || t < first)) first = t;
    }
    return first;
}

void gen_free(struct gen *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    srv_unwatch(g->srv, g);
    pthread_mutex_unlock(&g->mu);
    for (int32_t i = 0; g->reqs && i < g->n_reqs; i++) {
        if (!g->reqs[i]) continue;
        engine_req_detach(g->reqs[i]);
        engine_req_unref(g->reqs[i]);
    }
    free(g->reqs);
    free(g->req_done);
    free(g->req_prompt_tokens);
    free(g->req_cached);
    for (int32_t i = 0; g->ch && i < g->n_choices; i++) {
        struct choice *c = &g->ch[i];
        jw_free(&c->text);
        free(c->tok);
        free(c->lp);
        free(c->top);
        outp_free(&c->op);
    }
    free(g->ch);
    for (int32_t i = 0; g->echo_text && i < g->rq.n_prompts; i++) free(g->echo_text[i]);
    free(g->echo_text);
    free(g->echo_len);
    for (int32_t i = 0; g->pch && i < g->n_reqs; i++) {
        free(g->pch[i].tok);
        free(g->pch[i].lp);
        free(g->pch[i].top);
    }
    free(g->pch);
    free(g->ptok0);
    free(g->prefill);
    free(g->embd);
    gen_api_free(g);
    json_decref(g->api_req);
    engine_out_free(&g->out);
    outp_delta_free(&g->delta);
    jw_free(&g->sse);
    oai_request_free(&g->rq);
    json_decref(g->body);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static uint64_t random_seed(void) {
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        x = (uint64_t)t.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)t.tv_sec;
    }
    return x;
}

/* Builds the prompt of request ri into ids (chat: cp, rendered). */
static bool build_prompt(struct gen *g, int32_t ri, const struct chat_prompt *cp,
                         struct tok_ids *ids, struct oai_err *e) {
    if (g->rq.kind == OAI_CHAT) return gen_chat_tokenize(g->m, cp, ids, e);
    const struct oai_prompt *p = &g->rq.prompts[ri];
    if (p->ids) {
        for (int32_t i = 0; i < p->n_ids; i++)
            if (tok_ids_push(ids, p->ids[i]) != SMELT_OK)
                return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    } else if (!gen_tokenize(g->m, p->text, p->len, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL,
                             prompt_param(g->rq.kind), ids, e)) {
        return false;
    }
    if (g->rq.echo) {
        if (p->ids) {
            struct tok_buf b = {0};
            struct err te;
            if (tok_decode(g->m->tok, p->ids, (size_t)p->n_ids, TOK_DECODE_STRIP, &b, &te) != SMELT_OK) {
                tok_buf_free(&b);
                return oai_bad(e, "prompt", "%s", te.msg);
            }
            g->echo_text[ri] = b.p ? b.p : strdup("");
            g->echo_len[ri] = b.n;
        } else {
            g->echo_text[ri] = strndup(p->text, p->len);
            g->echo_len[ri] = p->len;
        }
        if (!g->echo_text[ri]) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return true;
}

/* The compiled grammar of g's reply (NULL: free), and what the engine needs beside it
 * (g->grammar: the prefill as its forced beginning, or its trigger). Errors are 400s that
 * name the field (the grammar's line and column, the schema's feature and JSON path). */
static bool reply_grammar(struct gen *g, const struct chat_prompt *cp, struct gram **out,
                          struct oai_err *e) {
    const struct oai_request *rq = &g->rq;
    struct sgram sg;
    *out = NULL;
    if (!sgram_build(rq, rq->kind == OAI_CHAT ? cp : NULL, &sg, e)) return false;
    if (!sg.kind) return true;
    struct err te;
    err_clear(&te);
    bool control = rq->ep.decode_special;
    smelt_status st = SMELT_OK;
    const char *param = sg.param;
    /* a grammar composed around the request's GBNF: that one alone first, so that its errors
     * give its own lines and columns */
    if (sg.composed && rq->gkind == GRAM_GBNF) {
        st = engine_grammar(g->m->en, rq->gkind, rq->gtext, rq->glen, control, out, &te);
        gram_unref(*out);
        *out = NULL;
        param = rq->gparam;
    }
    if (st == SMELT_OK) {
        param = sg.param;
        st = engine_grammar(g->m->en, sg.kind, sg.text.p ? sg.text.p : "", sg.text.n, control, out,
                            &te);
    }
    bool prefill = sg.prefill;
    const char *trigger = sg.trigger;
    sgram_free(&sg);
    if (st == SMELT_ERR_NOMEM) return oai_fail(e, 500, "server_error", NULL, NULL, "%s", te.msg);
    if (st != SMELT_OK) return oai_bad(e, param, "%s: %s", param, te.msg);
    g->grammar = (struct engine_grammar){.g = NULL};
    if (prefill) {
        g->grammar.prefix = g->prefill;
        g->grammar.prefix_len = g->prefill_len;
    }
    if (trigger) {
        g->grammar.trigger = trigger;
        g->grammar.trigger_len = strlen(trigger);
    }
    return true;
}

/* e's param, and the message that begins with it, with the chat name `from` (the param's
 * prefix, or a part of it that starts with '.') spelled `to`, the API's own name. */
static void api_name(struct oai_err *e, const char *from, const char *to) {
    size_t fl = strlen(from), pl = strlen(e->param);
    char *at = from[0] == '.' ? strstr(e->param, from) : strncmp(e->param, from, fl) ? NULL : e->param;
    if (!to || !at) return;
    struct jw p = {0}, m = {0}; /* the param spelled the API's way; the message */
    jw_raw(&p, e->param, (size_t)(at - e->param));
    jw_str(&p, from[0] == '.' ? "." : "");
    jw_str(&p, to);
    jw_str(&p, at + fl);
    bool lead = !strncmp(e->message, e->param, pl); /* "param: ..." */
    jw_raw(&m, p.p, p.n);
    jw_str(&m, e->message + (lead ? pl : 0));
    if (!p.oom && !m.oom) {
        snprintf(e->param, sizeof e->param, "%.*s", oai_clip(p.p, (int)sizeof e->param - 1), p.p);
        if (lead)
            snprintf(e->message, sizeof e->message, "%.*s",
                     oai_clip(m.p, (int)sizeof e->message - 1), m.p);
    }
    jw_free(&p);
    jw_free(&m);
}

static enum MHD_Result fail(struct conn *c, const struct oai_err *e) {
    struct gen *g = c->gen;
    struct oai_err ae = *e;
    if (g->api) { /* the chat request's field names, as the API calls them */
        if (!strcmp(ae.param, "messages")) snprintf(ae.param, sizeof ae.param, "%s", g->api->prompt_param);
        if (!strcmp(ae.param, "max_tokens")) snprintf(ae.param, sizeof ae.param, "%s", g->api->max_param);
        api_name(&ae, "response_format.json_schema", g->api->format_param);
        api_name(&ae, "response_format", g->api->format_param);
        api_name(&ae, ".function.parameters", g->api->schema_param);
    }
    c->gen = NULL;
    gen_free(g);
    return srv_error(c, &ae);
}

enum MHD_Result gen_start(struct conn *c, enum oai_kind kind, const struct gen_api *api) {
    struct server *s = c->srv;
    struct oai_err e;
    struct gen *g = c->gen;
    if (!g) { /* (a request that waited for its model to load comes here again, with its gen) */
        if (!(g = calloc(1, sizeof *g))) return MHD_NO;
        pthread_mutex_init(&g->mu, NULL);
        g->srv = s;
        g->conn = c;
        g->fd = -1;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) g->fd = ci->connect_fd;
        c->gen = g;
        g->created = (int64_t)time(NULL);
        g->api = api;
        srv_new_id(s, api                    ? api->id_prefix
                      : kind == OAI_CHAT      ? "chatcmpl-"
                      : kind == OAI_EMBEDDING ? "embd-"
                                              : "cmpl-",
                   g->id, sizeof g->id);
        memcpy(c->id, g->id, sizeof c->id);
        if (atomic_load(&s->draining)) {
            oai_fail(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
            return fail(c, &e);
        }
        if (!(g->body = oai_load_object(c->body.p ? c->body.p : "", c->body.n, &e)))
            return fail(c, &e);
        srv_body_free(c);
    }
    /* the model ("model" when it is a string: a wrong type is the parser's 400) */
    switch (srv_model_for(c, json_string_value(json_object_get(g->body, "model")), &g->m, &e)) {
    case SRV_PARKED: return MHD_YES;
    case SRV_CLOSE: return MHD_NO;
    case SRV_REFUSED: return fail(c, &e);
    case SRV_HAVE: break;
    }
    json_t *body = g->body;
    g->body = NULL;
    if (api ? !api->parse(g, body, &e)
            : !oai_parse_json(body, kind, tok_n_vocab(g->m->tok), &g->m->defaults, &g->rq, &e))
        return fail(c, &e);
    struct oai_request *rq = &g->rq;
    kind = rq->kind;
    g->n_user_stops = rq->ep.n_stop;
    /* an embedding model makes vectors, a generative one text: the other routes refuse */
    g->n_embd = engine_embd_size(g->m->en);
    if ((kind == OAI_EMBEDDING) != (g->n_embd > 0)) {
        if (kind == OAI_EMBEDDING)
            oai_fail(&e, 400, "invalid_request_error", "model", "model_not_supported",
                     "The model '%s' is not an embedding model (its GGUF declares no pooling "
                     "type): it generates text on /v1/chat/completions and /v1/completions, "
                     "and has no /v1/embeddings", g->m->id);
        else
            oai_fail(&e, 400, "invalid_request_error", "model", "model_not_supported",
                     "The model '%s' is an embedding model: it serves /v1/embeddings only, and "
                     "generates no text", g->m->id);
        return fail(c, &e);
    }
    if (kind == OAI_EMBEDDING && rq->dimensions > g->n_embd) {
        oai_bad(&e, "dimensions", "'dimensions' is %d, but the model's embeddings have %d",
                rq->dimensions, g->n_embd);
        return fail(c, &e);
    }
    /* (an API whose max_tokens is only a cap runs to the context's end instead) */
    bool explicit_max = rq->max_tokens >= 0 && !(api && api->max_is_cap) && (kind == OAI_CHAT ||
                                                 json_object_get(rq->root, "max_tokens") != NULL);
    g->n_reqs = kind == OAI_CHAT ? 1 : rq->n_prompts;
    g->n_choices = g->n_reqs * rq->n;
    /* all of a request's sequences are queued at once: more than the queue holds could never
     * be, whatever the load (a 400, not a 429 to retry) */
    int32_t max_waiting = engine_config(g->m->en)->max_waiting;
    if (g->n_choices > max_waiting) {
        oai_fail(&e, 400, "invalid_request_error", rq->n > 1 ? "n" : "prompt", "too_many_sequences",
                 "This request asks for %d sequences (%d prompt%s x n %d), more than the server "
                 "can queue at once (%d, --max-waiting): it could never be scheduled",
                 g->n_choices, g->n_reqs, g->n_reqs == 1 ? "" : "s", rq->n, max_waiting);
        return fail(c, &e);
    }
    g->reqs = calloc((size_t)g->n_reqs, sizeof *g->reqs);
    g->req_done = calloc((size_t)g->n_reqs, sizeof *g->req_done);
    g->req_prompt_tokens = calloc((size_t)g->n_reqs, sizeof *g->req_prompt_tokens);
    g->req_cached = calloc((size_t)g->n_reqs, sizeof *g->req_cached);
    g->ch = calloc((size_t)g->n_choices, sizeof *g->ch);
    if (kind == OAI_EMBEDDING) {
        g->embd = calloc((size_t)g->n_reqs * (size_t)g->n_embd, sizeof *g->embd);
        if (!g->embd) {
            oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            return fail(c, &e);
        }
    }
    if (rq->echo) {
        g->echo_text = calloc((size_t)g->n_reqs, sizeof *g->echo_text);
        g->echo_len = calloc((size_t)g->n_reqs, sizeof *g->echo_len);
        if (rq->logprobs) {
            g->pch = calloc((size_t)g->n_reqs, sizeof *g->pch);
            g->ptok0 = calloc((size_t)g->n_reqs, sizeof *g->ptok0);
            if (!g->pch || !g->ptok0) {
                oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
                return fail(c, &e);
            }
            rq->ep.prompt_logprobs = rq->top_logprobs;
        }
    }
    if (!g->reqs || !g->req_done || !g->req_prompt_tokens || !g->req_cached || !g->ch ||
        (rq->echo && (!g->echo_text || !g->echo_len))) {
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return fail(c, &e);
    }
    struct chat_prompt cp = {0};
    if (kind == OAI_CHAT) {
        if (!gen_chat_prompt(g->m, rq, &cp, &e)) return fail(c, &e);
        g->syntax = cp.syntax;
        g->reasoning = cp.reasoning;
        g->in_reasoning = cp.in_reasoning;
        g->prefill = cp.prefill;
        g->prefill_len = cp.prefill_len;
        cp.prefill = NULL; /* g owns it */
        /* Mistral's and Llama's call markers, and harmony's headers, are control tokens:
         * render them */
        if (g->syntax == OUTP_MISTRAL || g->syntax == OUTP_LLAMA3 || g->syntax == OUTP_HARMONY)
            rq->ep.decode_special = true;
        /* parallel_tool_calls false: Hermes (and Qwen XML) calls end with </tool_call>, so
         * generation can stop there (the parser drops anything after the first call in every
         * syntax) */
        if ((g->syntax == OUTP_HERMES || g->syntax == OUTP_QWEN_XML) && !rq->parallel_tool_calls &&
            rq->ep.n_stop < ENGINE_MAX_STOPS) {
            rq->stop[rq->ep.n_stop++] = "</tool_call>";
            rq->ep.stop = rq->stop;
        }
    }
    /* structured output: the reply's grammar, compiled (cached) for the engine's vocabulary */
    struct gram *gram = NULL;
    if (!reply_grammar(g, &cp, &gram, &e)) {
        gen_chat_prompt_free(&cp);
        return fail(c, &e);
    }
    uint64_t seed = rq->has_seed || g->m->seed_set ? rq->ep.sp.seed : random_seed();
    struct tok_ids ids = {0};
    for (int32_t ri = 0; ri < g->n_reqs; ri++) {
        ids.n = 0;
        if (!build_prompt(g, ri, &cp, &ids, &e) ||
            !check_length(g->m, rq, ri, (int32_t)ids.n, explicit_max, &e)) {
            tok_ids_free(&ids);
            gen_chat_prompt_free(&cp);
            return fail(c, &e);
        }
        if (ids.n == 0) {
            tok_ids_free(&ids);
            gen_chat_prompt_free(&cp);
            if (kind == OAI_EMBEDDING)
                oai_bad(&e, "input", "input %d is empty (it has no tokens)", ri);
            else
                oai_bad(&e, prompt_param(kind), "the prompt is empty");
            return fail(c, &e);
        }
        if (g->ptok0) g->ptok0[ri] = ids.v[0];
        g->req_prompt_tokens[ri] = (int32_t)ids.n; /* (the engine's count, once it is done) */
        struct engine_params ep = rq->ep;
        ep.n = rq->n;
        ep.max_tokens = rq->max_tokens;
        ep.grammar = g->grammar;
        ep.grammar.g = gram;
        /* completions with echo and max_tokens 0: the prompt only (one token is generated
         * and dropped) */
        if (ep.max_tokens == 0) ep.max_tokens = 1;
        ep.sp.seed = seed + (uint64_t)ri * (uint64_t)rq->n;
        /* a seeded request gets point-mass drafts: its output is the non-speculative one for
         * the seed whatever the load (docs/speculative.md) */
        ep.spec_point_mass = rq->has_seed;
        struct err te;
        smelt_status st = engine_req_new(&g->reqs[ri], &ep, ids.v, (int32_t)ids.n, &te);
        if (st == SMELT_OK) {
            engine_req_set_notify(g->reqs[ri], on_ready, g, rq->stream);
            st = engine_submit(g->m->en, g->reqs[ri], &te);
        }
        if (st != SMELT_OK) {
            tok_ids_free(&ids);
            gen_chat_prompt_free(&cp);
            gram_unref(gram);
            if (st == SMELT_ERR_RANGE)
                oai_fail(&e, 429, "rate_limit_error", NULL, "queue_full",
                         "The server is busy (%s); retry later", te.msg);
            else if (st == SMELT_ERR_CANCELLED)
                oai_fail(&e, 503, "server_error", NULL, "shutting_down", "%s", te.msg);
            else if (st == SMELT_ERR_INVALID)
                oai_bad(&e, prompt_param(kind), "%s", te.msg);
            else
                oai_fail(&e, 500, "server_error", NULL, NULL, "%s", te.msg);
            return fail(c, &e); /* gen_free detaches what was submitted */
        }
    }
    tok_ids_free(&ids);
    gen_chat_prompt_free(&cp);
    gram_unref(gram); /* the engine requests hold their own references */
    for (int32_t i = 0; i < g->n_choices; i++) {
        outp_init(&g->ch[i].op, g->syntax, g->reasoning, g->in_reasoning);
        think_init(g, &g->ch[i]);
        g->ch[i].op.max_calls = rq->parallel_tool_calls ? 0 : 1;
        g->ch[i].op.tools = rq->tools; /* (qwen_xml: the parameters' types) */
        g->ch[i].op.no_calls = !rq->tools || rq->tool_choice == OAI_TOOLS_NONE; /* (harmony) */
    }
    if (g->rq.max_tokens == 0) {
        /* echo only: drop the generated token */
        for (int32_t i = 0; i < g->n_choices; i++) g->ch[i].text.n = 0;
    }
    if (rq->stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, stream_read, c, stream_free);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        srv_add_headers(c, r);
        if (api) api->begin(g);
        atomic_fetch_add(&c->refs, 1);
        atomic_fetch_add(&s->n_streams, 1);
        srv_status(c, 200, false); /* counted at its end (stream_tail, on_completed) */
        enum MHD_Result ret = MHD_queue_response(c->mc, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    return gen_resume(c);
}

enum MHD_Result gen_resume(struct conn *c) {
    struct gen *g = c->gen;
    for (;;) {
        collect(g);
        if (g->n_done_reqs == g->n_reqs) {
            if (g->rq.max_tokens == 0) {
                for (int32_t i = 0; i < g->n_choices; i++) {
                    g->ch[i].text.n = 0;
                    g->ch[i].n_tok = 0;
                }
                g->usage_completion = 0;
            }
            return respond_whole(c);
        }
        if (try_park(g)) return MHD_YES;
    }
}

/* The reply of a block API (Anthropic Messages, OpenAI Responses) as a list of blocks.
 *
 * gen.c runs these APIs' requests as chat requests; each engine event's text goes through
 * the chat output parser (outp, the same as OpenAI chat's) and the pieces it decides are
 * cut here into blocks, in the order the model wrote them: reasoning, text, one block per
 * tool call. A block of one kind grows until a piece of another kind arrives (then it is
 * closed and the next one opens), or the reply ends. A text or reasoning block never opens
 * on whitespace (the model's blank lines before an answer or between blocks are dropped:
 * the APIs refuse blank text blocks when a client sends them back), and a reasoning block
 * does not end on it either.
 *
 * The same code runs for a stream and a whole response, event by event, so both end with
 * the same blocks; a stream also calls the API's open / piece / close hooks as the blocks
 * form. Block ids are made here, from the API's prefixes, when a block opens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

void gen_api_free(struct gen *g) {
    for (int32_t i = 0; i < g->n_blk; i++) {
        jw_free(&g->blk[i].text);
        free(g->blk[i].name);
    }
    free(g->blk);
    jw_free(&g->held_ws);
    g->blk = NULL;
    g->n_blk = g->cap_blk = 0;
}

static bool streaming(const struct gen *g) {
    return g->rq.stream;
}

static void close_last(struct gen *g) {
    g->held_ws.n = 0;
    if (g->n_blk == 0 || g->blk[g->n_blk - 1].closed) return;
    g->blk[g->n_blk - 1].closed = true;
    if (streaming(g)) g->api->close(g, g->n_blk - 1);
}

/* Opens a block of kind (closing the last one); name: a call's (copied). NULL on OOM (the
 * gen's error is set). */
static struct gen_block *open_block(struct gen *g, enum gen_block_kind kind, const char *name) {
    close_last(g);
    if (g->n_blk == g->cap_blk) {
        int32_t cap = g->cap_blk ? g->cap_blk * 2 : 4;
        struct gen_block *b = realloc(g->blk, (size_t)cap * sizeof *b);
        if (!b) {
            snprintf(g->error, sizeof g->error, "out of memory");
            return NULL;
        }
        g->blk = b;
        g->cap_blk = cap;
    }
    struct gen_block *b = &g->blk[g->n_blk];
    memset(b, 0, sizeof *b);
    b->kind = (uint8_t)kind;
    if (name && !(b->name = strdup(name))) {
        snprintf(g->error, sizeof g->error, "out of memory");
        return NULL;
    }
    const char *prefix = g->api->block_prefix[kind];
    if (prefix) srv_new_id(g->srv, prefix, b->id, sizeof b->id);
    if (kind == GEN_CALL && g->api->call_id_prefix)
        srv_new_id(g->srv, g->api->call_id_prefix, b->call_id, sizeof b->call_id);
    g->n_blk++;
    if (streaming(g)) g->api->open(g, g->n_blk - 1);
    return b;
}

static void grow(struct gen *g, struct gen_block *b, const char *s, size_t n) {
    if (!n) return;
    jw_raw(&b->text, s, n);
    if (b->text.oom) snprintf(g->error, sizeof g->error, "out of memory");
    if (streaming(g)) g->api->piece(g, (int32_t)(b - g->blk), s, n);
}

static bool is_ws(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Text or reasoning: appended to the open block of that kind, or opens one at the first
 * byte that is not whitespace. A reasoning block's trailing whitespace (the newline a
 * template writes before </think>) is held until more reasoning follows it, so it never
 * ends the block. */
static void take_text(struct gen *g, enum gen_block_kind kind, const char *s, size_t n) {
    struct gen_block *last = g->n_blk ? &g->blk[g->n_blk - 1] : NULL;
    if (!last || last->closed || last->kind != kind) {
        while (n && is_ws(*s))
            s++, n--;
        if (!n) return;
        last = open_block(g, kind, NULL);
        if (!last) return;
    }
    if (kind != GEN_REASONING) {
        grow(g, last, s, n);
        return;
    }
    size_t body = n;
    while (body && is_ws(s[body - 1]))
        body--;
    if (body) {
        if (g->held_ws.n) grow(g, last, g->held_ws.p, g->held_ws.n);
        g->held_ws.n = 0;
        grow(g, last, s, body);
    }
    jw_raw(&g->held_ws, s + body, n - body);
}

void gen_api_event(struct gen *g, const struct engine_event *ev) {
    struct choice *c = &g->ch[0];
    struct outp_delta *d = &g->delta;
    outp_delta_clear(d);
    if (g->prefill && !c->prefilled) {
        c->prefilled = true;
        outp_prefill(&c->op, g->prefill, g->prefill_len, d);
    }
    if (ev->text_len) outp_push(&c->op, g->out.text + ev->text, ev->text_len, d);
    if (ev->finish) outp_finish(&c->op, d);
    if (d->reasoning.n) take_text(g, GEN_REASONING, d->reasoning.p, d->reasoning.n);
    if (d->content.n) take_text(g, GEN_TEXT, d->content.p, d->content.n);
    for (int i = 0; i < d->n_calls; i++) {
        const struct outp_call *k = &d->calls[i];
        if (k->name) {
            if (open_block(g, GEN_CALL, k->name)) c->n_calls++;
            continue;
        }
        /* the pieces of a call come in order, after its name: they belong to the last block */
        struct gen_block *last = g->n_blk ? &g->blk[g->n_blk - 1] : NULL;
        if (last && last->kind == GEN_CALL && !last->closed)
            grow(g, last, k->args.p ? k->args.p : "", k->args.n);
    }
    if (ev->finish) {
        g->stop = ev->stop;
        g->api_done = true;
        close_last(g);
    }
}

enum gen_end gen_api_end(const struct gen *g, const char **stop_seq) {
    const struct choice *c = &g->ch[0];
    *stop_seq = NULL;
    if (g->error[0] || g->cancelled || c->finish == ENGINE_ERROR || c->finish == ENGINE_CANCELLED)
        return GEN_END_FAILED;
    if (c->finish == ENGINE_LENGTH)
        return g->rq.max_tokens < 0 || g->usage_completion < g->rq.max_tokens ? GEN_END_CONTEXT
                                                                               : GEN_END_LENGTH;
    if (c->n_calls > 0) return GEN_END_CALLS;
    if (c->finish == ENGINE_STOP && g->stop > 0 && g->stop <= g->n_user_stops) {
        *stop_seq = g->rq.stop[g->stop - 1];
        return GEN_END_STOP_SEQ;
    }
    return GEN_END_TURN;
}

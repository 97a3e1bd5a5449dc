/* libFuzzer target for the server's JSON paths:
 *  - OpenAI request bodies (oai_parse, both endpoints), then the error body of a refusal;
 *    every body also as an embeddings request (a parsed one has inputs of text or of ids
 *    in the vocab, none empty), and its bytes through jw_base64 (the length RFC 4648 says);
 *  - the chat output parser (reasoning and tool calls in every syntax, whose calls are
 *    JSON parsed from model text), fed whole and in small chunks: both must decide the
 *    same content and the same calls (pieces summed by index), pieces in order.
 * The first input byte picks the endpoint, the syntax (bits 1-2; 0 with bit 0 set is
 * qwen_xml, whose parameters are typed by a fixed tools schema; 0 with bit 0 clear and bit 3
 * set is harmony, without calls when bit 4 is set), the chunk size and whether a forced
 * call's prefill comes first; the rest is the body / text.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/json_request, dict: json_request.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/oai.h"
#include "server/outp.h"

static volatile uint64_t sink;

/* What a parse decided: content, then each call as "name\0arguments\0" (pieces summed by
 * index, as an OpenAI client sums stream deltas). */
struct decided {
    struct jw content, calls;
    struct jw args[8];
    int n_calls;
};

static void take(struct decided *r, struct outp_delta *d) {
    jw_raw(&r->content, d->content.p ? d->content.p : "", d->content.n);
    for (int k = 0; k < d->n_calls; k++) {
        const struct outp_call *c = &d->calls[k];
        /* pieces come in order: a call's name first (with "" arguments), then its arguments */
        if (c->name ? c->index != r->n_calls || c->args.n : c->index != r->n_calls - 1) abort();
        if (c->name) {
            r->n_calls++;
            jw_raw(&r->calls, c->name, strlen(c->name) + 1);
        } else if (c->index < 8) {
            jw_raw(&r->args[c->index], c->args.p, c->args.n);
        }
    }
    outp_delta_clear(d);
}

/* The tools of qwen_xml text: f(s: string, i: integer, o: object, b: boolean, u: no type). */
static json_t *xml_tools(void) {
    static json_t *t;
    if (!t)
        t = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                       "{\"properties\": {\"s\": {\"type\": \"string\"}, \"i\": {\"type\": "
                       "\"integer\"}, \"o\": {\"type\": \"object\"}, \"b\": {\"type\": "
                       "[\"boolean\", \"null\"]}, \"u\": {}}}}}]",
                       0, NULL);
    return t;
}

static void parse_text(enum outp_syntax syn, bool reasoning, bool in_r, const char *prefill,
                       int max_calls, const uint8_t *s, size_t n, size_t step, struct decided *r) {
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, syn, reasoning, in_r);
    p.max_calls = max_calls;
    p.no_calls = syn == OUTP_HARMONY && in_r;
    if (syn == OUTP_QWEN_XML) p.tools = xml_tools();
    if (prefill) {
        outp_prefill(&p, prefill, strlen(prefill), &d);
        take(r, &d);
    }
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step) {
        outp_push(&p, (const char *)s + i, i + step <= n ? step : n - i, &d);
        take(r, &d);
    }
    outp_finish(&p, &d);
    take(r, &d);
    if (max_calls && r->n_calls > max_calls) abort();
    for (int k = 0; k < 8 && k < r->n_calls; k++) {
        jw_raw(&r->calls, r->args[k].p ? r->args[k].p : "", r->args[k].n);
        jw_raw(&r->calls, "", 1);
    }
    sink += (uint64_t)r->n_calls;
    outp_delta_free(&d);
    outp_free(&p);
}

static bool same(const struct jw *a, const struct jw *b) {
    return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n));
}

static void decided_free(struct decided *r) {
    jw_free(&r->content);
    jw_free(&r->calls);
    for (int k = 0; k < 8; k++) jw_free(&r->args[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const uint8_t *body = data + 1;
    size_t n = size - 1;

    struct oai_request r;
    struct oai_err e;
    enum oai_kind kind = (sel & 1) ? OAI_CHAT : OAI_COMPLETION;
    if (oai_parse((const char *)body, n, kind, 1000, NULL, &r, &e)) {
        sink += (uint64_t)r.n + (uint64_t)r.max_tokens + (uint64_t)r.ep.n_stop;
        for (int32_t i = 0; i < r.ep.n_stop; i++) sink += strlen(r.stop[i]);
        for (int32_t i = 0; i < r.n_prompts; i++) sink += r.prompts[i].len + (uint64_t)r.prompts[i].n_ids;
    } else {
        char *j = oai_err_json(&e);
        sink += strlen(j);
        free(j);
    }
    oai_request_free(&r);

    if (oai_parse((const char *)body, n, OAI_EMBEDDING, 1000, NULL, &r, &e)) {
        if (r.n_prompts < 1 || !r.ep.embed || r.dimensions < 0) abort();
        for (int32_t i = 0; i < r.n_prompts; i++) {
            const struct oai_prompt *p = &r.prompts[i];
            if (!p->text && (!p->ids || p->n_ids < 1)) abort();
            for (int32_t k = 0; p->ids && k < p->n_ids; k++)
                if (p->ids[k] < 0 || p->ids[k] >= 1000) abort();
        }
    } else {
        char *j = oai_err_json(&e);
        sink += strlen(j);
        free(j);
    }
    oai_request_free(&r);
    struct jw b64 = {0};
    jw_base64(&b64, body, n);
    if (b64.n != (n + 2) / 3 * 4 + 2 || b64.p[0] != '"' || b64.p[b64.n - 1] != '"') abort();
    jw_free(&b64);

    /* the same bytes as model output; bit 7: a forced call's prefill and max_calls 1 */
    enum outp_syntax syn = (enum outp_syntax)((sel >> 1) & 3);
    bool reasoning = (sel >> 3) & 1, in_r = (sel >> 4) & 1, forced = (sel >> 7) & 1;
    if (syn == OUTP_TOOLS_NONE && (sel & 1)) syn = OUTP_QWEN_XML;
    else if (syn == OUTP_TOOLS_NONE && reasoning) syn = OUTP_HARMONY;
    char *prefill = forced ? outp_force_prefix(syn, "<tool_call>", n & 1 ? "f" : NULL) : NULL;
    struct decided whole = {0}, chunked = {0};
    parse_text(syn, reasoning, in_r, prefill, forced, body, n, 0, &whole);
    parse_text(syn, reasoning, in_r, prefill, forced, body, n, 1 + ((sel >> 5) & 3), &chunked);
    /* a stream decides what the whole text decides */
    if (!same(&whole.content, &chunked.content) || !same(&whole.calls, &chunked.calls)) abort();
    /* qwen_xml writes the arguments itself: each call's is one JSON object, even cut off
     * (unless the text has a Hermes JSON call, whose arguments are passed on as written:
     * one needs a literal "name" key) */
    bool json_call = n >= 6 && memmem(body, n, "\"name\"", 6);
    for (int k = 0; syn == OUTP_QWEN_XML && !json_call && k < whole.n_calls && k < 8; k++) {
        const struct jw *a = &whole.args[k];
        json_t *j = json_loadb(a->p ? a->p : "", a->n, JSON_ALLOW_NUL, NULL);
        if (!json_is_object(j)) abort();
        json_decref(j);
    }
    free(prefill);
    decided_free(&whole);
    decided_free(&chunked);
    return 0;
}

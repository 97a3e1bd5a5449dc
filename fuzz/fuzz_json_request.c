/* libFuzzer target for the server's JSON paths:
 *  - OpenAI request bodies (oai_parse, both endpoints), then the error body of a refusal;
 *  - the chat output parser (reasoning and tool calls in every syntax, whose calls are
 *    JSON parsed from model text), fed whole and in small chunks: both must decide the
 *    same thing.
 * The first input byte picks the endpoint and the syntax; the rest is the body / text.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/json_request, dict: json_request.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/oai.h"
#include "server/outp.h"

static volatile uint64_t sink;

static void parse_text(enum outp_syntax syn, bool reasoning, bool in_r, const uint8_t *s,
                       size_t n, size_t step, struct jw *content, int *calls) {
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, syn, reasoning, in_r);
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step) {
        outp_push(&p, (const char *)s + i, i + step <= n ? step : n - i, &d);
        jw_raw(content, d.content.p ? d.content.p : "", d.content.n);
        *calls += d.n_calls;
        for (int k = 0; k < d.n_calls; k++) sink += strlen(d.calls[k].name) + strlen(d.calls[k].arguments);
        outp_delta_clear(&d);
    }
    outp_finish(&p, &d);
    jw_raw(content, d.content.p ? d.content.p : "", d.content.n);
    *calls += d.n_calls;
    outp_delta_free(&d);
    outp_free(&p);
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

    /* the same bytes as model output */
    enum outp_syntax syn = (enum outp_syntax)((sel >> 1) & 3);
    bool reasoning = (sel >> 3) & 1, in_r = (sel >> 4) & 1;
    struct jw whole = {0}, chunked = {0};
    int c1 = 0, c2 = 0;
    parse_text(syn, reasoning, in_r, body, n, 0, &whole, &c1);
    parse_text(syn, reasoning, in_r, body, n, 1 + (sel >> 5), &chunked, &c2);
    /* a stream decides what the whole text decides */
    if (c1 != c2 || whole.n != chunked.n || (whole.n && memcmp(whole.p, chunked.p, whole.n)))
        abort();
    jw_free(&whole);
    jw_free(&chunked);
    return 0;
}

/* libFuzzer target for the request parsers of the APIs served over the chat machinery
 * (server/apis.h): Anthropic Messages bodies (as /v1/messages and /v1/messages/count_tokens
 * read them) and OpenAI Responses bodies (without and with a stored conversation before the
 * input). The first input byte picks the API (bit 0) and the variant (bit 1); the rest is the
 * body. Checked beyond "no crash, no leak": a parsed request is a chat request of one choice
 * with messages; a refusal's body is valid JSON in both error shapes; Claude Code's billing
 * line never reaches the prompt's system message.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/api_request, dict: api_request.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/apis.h"

static volatile uint64_t sink;

/* A conversation as the store gives it: a user turn and an assistant turn with a call. */
static json_t *history(void) {
    static json_t *h;
    if (!h)
        h = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                       "\"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
                       "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]",
                       0, NULL);
    return h;
}

static void check_error_json(char *s) {
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    if (!json_is_object(j)) abort();
    json_decref(j);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    bool anthropic = sel & 1, variant = (sel >> 1) & 1;
    struct oai_err e;
    struct oai_request rq;
    memset(&rq, 0, sizeof rq);
    json_t *req = oai_load_object(body, n, &e);
    bool ok = req != NULL;
    if (ok && anthropic)
        ok = anth_parse(req, variant, 1000, NULL, &rq, &e);
    else if (ok)
        ok = resp_parse(req, variant ? history() : NULL, 1000, NULL, &rq, &e);
    if (ok) {
        if (rq.kind != OAI_CHAT || rq.n != 1 || !json_is_array(rq.messages) ||
            json_array_size(rq.messages) == 0)
            abort();
        json_t *first = json_array_get(rq.messages, 0);
        const char *role = json_string_value(json_object_get(first, "role"));
        const char *text = json_string_value(json_object_get(first, "content"));
        if (anthropic && role && !strcmp(role, "system") && text) {
            /* the billing line is dropped wherever it starts a line */
            const char *b = "x-anthropic-billing-header:";
            for (const char *p = strstr(text, b); p; p = strstr(p + 1, b))
                if (p == text || p[-1] == '\n') abort();
        }
        sink += json_array_size(rq.messages) + (uint64_t)rq.ep.n_stop + (uint64_t)rq.max_tokens;
    } else {
        check_error_json(anth_err_json(&e));
        check_error_json(oai_err_json(&e));
    }
    oai_request_free(&rq);
    json_decref(req);
    return 0;
}

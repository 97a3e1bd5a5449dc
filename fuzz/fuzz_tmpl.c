/* libFuzzer target for the chat-template engine: lex, parse, then render the input
 * against a chat context, with budgets small enough that every input finishes fast.
 *
 * Input: a template; if it contains a NUL byte, what follows is JSON that replaces the
 * default context (so the fuzzer explores values too). Any crash, ASan/UBSan report,
 * leak, or a render that ignores its budget (libFuzzer's -timeout / -rss_limit_mb) is a
 * finding. The whole output (out_len bytes and the terminating NUL) and the error
 * message are read, so ASan checks their bounds.
 *
 *   make fuzz FUZZ_SECONDS=120      (seeds: fuzz/corpus/tmpl, dictionary: fuzz/tmpl.dict)
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template/tmpl.h"

static const char default_ctx[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"sys\"},"
    "{\"role\": \"user\", \"content\": \"hi <b> & 'q'\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"think\", \"tool_calls\": [{\"id\": \"a1b2c3d4e\","
    " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5, null, true]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"a1b2c3d4e\", \"name\": \"f\", \"content\": \"{\\\"ok\\\": 1}\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"array\"}}, \"required\": [\"x\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"enable_thinking\": false, \"n\": 3, \"f\": 0.5, \"s\": \"h\\u00e9llo w\\u00f6rld\"}";

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    size_t slen = size;
    const uint8_t *nul = memchr(data, 0, size);
    json_t *cj = NULL;
    if (nul) {
        slen = (size_t)(nul - data);
        cj = json_loadb((const char *)nul + 1, size - slen - 1, JSON_DECODE_ANY, NULL);
    }
    if (!cj || !json_is_object(cj)) {
        json_decref(cj);
        cj = json_loads(default_ctx, 0, NULL);
    }
    struct err e;
    err_clear(&e);
    struct tmpl *t = NULL;
    if (tmpl_compile(src, slen, &t, &e) == SMELT_OK) {
        struct tmpl_value *ctx = tmpl_value_from_json(cj, &e);
        struct tmpl_opts o = {
            .limits = {.max_output = 1 << 20, .max_alloc = 32 << 20, .max_steps = 200000, .max_depth = 64,
                       .max_stack = 256 << 10},
            .has_now = true,
            .now = 1764460800,
        };
        char *out = NULL;
        size_t n = 0;
        if (ctx && tmpl_render(t, ctx, &o, &out, &n, &e) == SMELT_OK) {
            uint64_t h = n;
            for (size_t i = 0; i < n; i++) h = h * 31 + (unsigned char)out[i];
            sink += h + (unsigned char)out[n]; /* out[n] is the terminating NUL */
        } else {
            sink += strlen(e.msg); /* the message is always terminated */
        }
        free(out);
        tmpl_value_free(ctx);
        tmpl_free(t);
    } else {
        sink += strlen(e.msg);
    }
    json_decref(cj);
    return 0;
}

/* OpenAI API shapes: request bodies (JSON, parsed with jansson) -> struct oai_request, and
 * errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}.
 *
 * Validation is strict: a field of the wrong type or out of range, and a field smelt does
 * not know or does not support yet (response_format json_schema, audio, ...), is a 400
 * that names the field, never silently ignored. Harmless fields (user, metadata, store,
 * service_tier, ...) are accepted. null means "not set" for every optional field.
 *
 * Extensions accepted (as vLLM and llama.cpp do): top_k, min_p, repetition_penalty,
 * ignore_eos, stop_token_ids, skip_special_tokens, chat_template_kwargs,
 * add_generation_prompt, continue_final_message.
 *
 * Chat's reasoning_effort is checked (none, minimal, low, medium, high) and given to the
 * chat template (see chat.c).
 *
 * Structured output (docs/structured-output.md): response_format json_object / json_schema,
 * llama.cpp's grammar (GBNF) and json_schema fields (at most one of the three), and
 * tools[].function.strict are parsed here into the request's grammar source; sgram.c turns
 * them (with the chat template's tool-call syntax) into the grammar the engine enforces.
 */
#ifndef SMELT_SERVER_OAI_H
#define SMELT_SERVER_OAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "grammar/gram.h"
#include "util/err.h"

struct oai_err {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", ... */
    char param[64];   /* "" = null */
    char code[48];    /* "" = null */
    char message[ERR_MSG_MAX];
};

/* Fills e and returns false (for `return oai_fail(...)`). The message, param and code are
 * kept valid UTF-8 whatever the arguments hold: cut on a character boundary, ill-formed
 * bytes replaced by U+FFFD. */
bool oai_fail(struct oai_err *e, int status, const char *type, const char *param,
              const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Shorthand for a 400 invalid_request_error naming param. */
bool oai_bad(struct oai_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The length of s's longest prefix of at most max bytes that does not split a UTF-8
 * character: quote client text as "%.*s", oai_clip(s, 64), s. */
int oai_clip(const char *s, int max);
/* The error as a JSON body (malloc'd, NUL-terminated). */
char *oai_err_json(const struct oai_err *e);

enum oai_kind { OAI_CHAT = 0, OAI_COMPLETION = 1, OAI_EMBEDDING = 2 };

enum oai_tool_choice {
    OAI_TOOLS_AUTO = 0,
    OAI_TOOLS_NONE = 1,
    OAI_TOOLS_REQUIRED = 2,
    OAI_TOOLS_NAMED = 3,
};

/* One completions prompt: text, or token ids. */
struct oai_prompt {
    const char *text; /* points into the request's JSON */
    size_t len;
    int32_t *ids;     /* owned; NULL for text */
    int32_t n_ids;
};

struct oai_request {
    enum oai_kind kind;
    json_t *root;        /* the parsed body (owned) */
    const char *model;   /* NULL when absent */
    bool stream, include_usage;
    int32_t max_tokens;  /* -1: not set */
    int32_t n;
    bool has_seed;
    struct engine_params ep; /* ready for engine_req_new, except n, max_tokens, seed */
    const char *stop[ENGINE_MAX_STOPS];
    int32_t *stop_ids;   /* owned */
    struct logit_bias *bias; /* owned */
    bool logprobs;       /* chat: logprobs; completions: logprobs != null */
    int32_t top_logprobs;
    bool ignore_eos;

    /* completions; embeddings: the inputs */
    struct oai_prompt *prompts; /* (n_prompts) owned */
    int32_t n_prompts;
    bool echo;

    /* embeddings (ep.embed set, max_tokens 0) */
    bool base64;         /* encoding_format "base64": little-endian float32s, base64 */
    int32_t dimensions;  /* > 0: cut each vector to this many and normalize again */

    /* chat */
    json_t *messages;    /* borrowed from root; normalized for templates (see oai_parse) */
    json_t *tools;       /* borrowed, NULL when absent or empty */
    enum oai_tool_choice tool_choice;
    const char *tool_name; /* OAI_TOOLS_NAMED */
    bool parallel_tool_calls;
    json_t *template_kwargs; /* borrowed, NULL when absent */
    const char *reasoning_effort; /* "none" .. "high" (static), NULL when absent */
    bool add_generation_prompt, continue_final_message;
    bool tools_strict; /* some tool has function.strict true */

    /* structured output: the grammar the reply must follow (besides strict tools) */
    enum gram_kind gkind; /* 0: none; GRAM_JSON_OBJECT, GRAM_JSON_SCHEMA, GRAM_GBNF */
    const char *gtext;    /* its text (the schema's JSON, the GBNF); into root or gtext_own */
    size_t glen;
    char *gtext_own;
    const char *gparam; /* the field it came from ("response_format", "grammar", ...) */
};

/* A 500 "out of memory" (false). */
bool oai_nomem(struct oai_err *e);
/* Refuses (a 400 naming param and the key) a key of obj that is not in allowed
 * (NULL-terminated). */
bool oai_only_keys(json_t *obj, const char *param, const char *const *allowed, struct oai_err *e);
/* Typed field getters for request parsers: each leaves *out as it is for null, and returns
 * false with a 400 naming `name` for a wrong type or a value outside [lo, hi]. An integer
 * may be written as a float with no fraction (5.0). */
bool oai_get_bool(json_t *v, const char *name, bool *out, struct oai_err *e);
bool oai_get_num(json_t *v, const char *name, double lo, double hi, double *out,
                 struct oai_err *e);
bool oai_get_int(json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                 struct oai_err *e);
bool oai_get_str(json_t *v, const char *name, const char **out, struct oai_err *e);

/* Parses and validates a request body. n_vocab bounds token ids (logit_bias, prompts,
 * stop_token_ids). defaults (may be NULL) are the sampling parameters of fields the
 * request does not set (the model's own defaults). Chat messages are normalized in place for templates: a content list of
 * text parts becomes one string (parts joined by "\n"), "developer" becomes "system", a
 * tool call's arguments string is parsed into an object when it is valid JSON. */
bool oai_parse(const char *body, size_t len, enum oai_kind kind, int32_t n_vocab,
               const struct sample_params *defaults, struct oai_request *out, struct oai_err *e);
/* A request body parsed as a JSON object (duplicate keys refused), or NULL with a 400. */
json_t *oai_load_object(const char *body, size_t len, struct oai_err *e);
/* The same as oai_parse for a body already parsed (root: taken, freed with the request, also on
 * failure): the other APIs' routes build a chat request's body and parse it here. */
bool oai_parse_json(json_t *root, enum oai_kind kind, int32_t n_vocab,
                    const struct sample_params *defaults, struct oai_request *out,
                    struct oai_err *e);
void oai_request_free(struct oai_request *r);

#endif

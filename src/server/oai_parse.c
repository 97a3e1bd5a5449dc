/* OpenAI request bodies -> struct oai_request. See oai.h.
 *
 * Every field is looked up in one table per endpoint; a key not in the table is refused
 * ("Unrecognized request argument supplied: X", as OpenAI says). jansson parses with
 * JSON_REJECT_DUPLICATES (a key given twice is ambiguous: refused), validates UTF-8,
 * refuses NUL in strings and nests at most 2048 deep. */
#include "server/oai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

#define MAX_PROMPTS 1024
#define MAX_INPUTS 2048 /* an embeddings request's inputs (OpenAI's limit) */
#define MAX_TOP_LOGPROBS 20

/* Formats into dst (cap bytes) as valid UTF-8, whatever the arguments hold: a cut (the
 * buffer's end) falls on a character boundary, and each ill-formed byte (a client's text,
 * a '%.Ns' that split a character) becomes U+FFFD. jansson refuses invalid UTF-8, so an
 * error built from such text would otherwise have no JSON body at all. */
__attribute__((format(printf, 3, 0))) static void put_text(char *dst, size_t cap, const char *fmt,
                                                          va_list ap) {
    char tmp[ERR_MSG_MAX];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    size_t n = k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1;
    if (k >= (int)sizeof tmp) n -= utf8_tail_len((const uint8_t *)tmp, n);
    const uint8_t *u = (const uint8_t *)tmp;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t m = utf8_decode(u + i, n - i, &cp);
        const char *src = m ? tmp + i : UTF8_REPLACEMENT_STR;
        size_t len = m ? m : 3;
        if (o + len + 1 > cap) break;
        memcpy(dst + o, src, len);
        o += len;
        i += m ? m : 1;
    }
    dst[o] = 0;
}

__attribute__((format(printf, 3, 4))) static void put(char *dst, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_text(dst, cap, fmt, ap);
    va_end(ap);
}

int oai_clip(const char *s, int max) {
    size_t n = strnlen(s, max > 0 ? (size_t)max : 0);
    if ((int)n == max) n -= utf8_tail_len((const uint8_t *)s, n);
    return (int)n;
}

bool oai_fail(struct oai_err *e, int status, const char *type, const char *param,
              const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    put(e->param, sizeof e->param, "%s", param ? param : "");
    put(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    put_text(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

bool oai_bad(struct oai_err *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    e->type = "invalid_request_error";
    put(e->param, sizeof e->param, "%s", param ? param : "");
    e->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    put_text(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

char *oai_err_json(const struct oai_err *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message, "type",
                            e->type ? e->type : "invalid_request_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code[0] ? json_string(e->code) : json_null());
    json_t *root = err ? json_pack("{s:o}", "error", err) : NULL;
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) s = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                       "\"param\":null,\"code\":null}}");
    return s;
}

void oai_request_free(struct oai_request *r) {
    if (!r) return;
    for (int32_t i = 0; r->prompts && i < r->n_prompts; i++) free(r->prompts[i].ids);
    free(r->prompts);
    free(r->stop_ids);
    free(r->bias);
    free(r->gtext_own);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

bool oai_nomem(struct oai_err *e) {
    return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

bool oai_only_keys(json_t *obj, const char *param, const char *const *allowed, struct oai_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        int i = 0;
        while (allowed[i] && strcmp(allowed[i], k)) i++;
        if (!allowed[i])
            return oai_bad(e, param, "%s: unknown field '%.*s'", param, oai_clip(k, 64), k);
    }
    return true;
}

/* ---- typed getters (oai.h) ---- */

bool oai_get_bool(json_t *v, const char *name, bool *out, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_boolean(v)) return oai_bad(e, name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return true;
}

bool oai_get_num(json_t *v, const char *name, double lo, double hi, double *out,
                    struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_number(v)) return oai_bad(e, name, "'%s' must be a number", name);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return oai_bad(e, name, "'%s' must be between %g and %g, got %g", name, lo, hi, x);
    *out = x;
    return true;
}

bool oai_get_int(json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                    struct oai_err *e) {
    if (json_is_null(v)) return true;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v); /* 5.0 is an integer to Python clients too */
    } else {
        return oai_bad(e, name, "'%s' must be an integer", name);
    }
    if (x < lo || x > hi)
        return oai_bad(e, name, "'%s' must be between %lld and %lld, got %lld", name,
                       (long long)lo, (long long)hi, (long long)x);
    *out = x;
    return true;
}

bool oai_get_str(json_t *v, const char *name, const char **out, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_string(v)) return oai_bad(e, name, "'%s' must be a string", name);
    *out = json_string_value(v);
    return true;
}

/* ---- fields shared by both endpoints ---- */

static bool parse_stop(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (json_is_null(v)) return true;
    int32_t n = 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > 0) r->stop[n++] = json_string_value(v);
    } else if (json_is_array(v)) {
        if (json_array_size(v) > ENGINE_MAX_STOPS)
            return oai_bad(e, "stop", "'stop' holds at most %d sequences, got %zu",
                           ENGINE_MAX_STOPS, json_array_size(v));
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s))
                return oai_bad(e, "stop", "'stop' must be a string or a list of strings");
            if (json_string_length(s) > 0) r->stop[n++] = json_string_value(s);
        }
    } else {
        return oai_bad(e, "stop", "'stop' must be a string or a list of strings");
    }
    for (int32_t i = 0; i < n; i++)
        if (strlen(r->stop[i]) > ENGINE_MAX_STOP_LEN)
            return oai_bad(e, "stop", "each stop sequence is at most %d bytes",
                           ENGINE_MAX_STOP_LEN);
    r->ep.stop = r->stop;
    r->ep.n_stop = n;
    return true;
}

static bool parse_token_id(const char *s, int32_t n_vocab, int32_t *out) {
    if (!*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < 0 || v >= n_vocab) return false;
    *out = (int32_t)v;
    return true;
}

static bool parse_logit_bias(json_t *v, int32_t n_vocab, struct oai_request *r,
                             struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_object(v))
        return oai_bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(v);
    if (n > 1024) return oai_bad(e, "logit_bias", "'logit_bias' holds at most 1024 entries");
    if (n == 0) return true;
    r->bias = calloc(n, sizeof *r->bias);
    if (!r->bias) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const char *k;
    json_t *b;
    int32_t i = 0;
    json_object_foreach(v, k, b) {
        int32_t id;
        if (!parse_token_id(k, n_vocab, &id))
            return oai_bad(e, "logit_bias", "logit_bias: '%.*s' is not a token id (0..%d)",
                           oai_clip(k, 40), k,
                           n_vocab - 1);
        if (!json_is_number(b) || !isfinite(json_number_value(b)) ||
            fabs(json_number_value(b)) > 100)
            return oai_bad(e, "logit_bias",
                           "logit_bias: the bias of token %d must be a number in [-100, 100]", id);
        r->bias[i].token = id;
        r->bias[i].bias = (float)json_number_value(b);
        i++;
    }
    r->ep.sp.bias = r->bias;
    r->ep.sp.n_bias = i;
    return true;
}

static bool parse_stop_ids(json_t *v, int32_t n_vocab, struct oai_request *r,
                           struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_array(v) || json_array_size(v) > 1024)
        return oai_bad(e, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
    size_t n = json_array_size(v), i;
    if (n == 0) return true;
    r->stop_ids = calloc(n, sizeof *r->stop_ids);
    if (!r->stop_ids) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= n_vocab)
            return oai_bad(e, "stop_token_ids", "stop_token_ids[%zu] is not a token id", i);
        r->stop_ids[i] = (int32_t)json_integer_value(x);
    }
    r->ep.stop_ids = r->stop_ids;
    r->ep.n_stop_ids = (int32_t)n;
    return true;
}

static bool parse_stream_options(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_object(v)) return oai_bad(e, "stream_options", "'stream_options' must be an object");
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!strcmp(k, "include_usage")) {
            if (!oai_get_bool(x, "stream_options.include_usage", &r->include_usage, e)) return false;
        } else if (!strcmp(k, "continuous_usage_stats") || !strcmp(k, "include_obfuscation")) {
            bool b = false;
            if (!oai_get_bool(x, k, &b, e)) return false;
            if (b && !strcmp(k, "continuous_usage_stats"))
                return oai_bad(e, "stream_options.continuous_usage_stats", "not supported");
        } else {
            return oai_bad(e, "stream_options", "Unrecognized stream option: %.*s",
                           oai_clip(k, 64), k);
        }
    }
    return true;
}

/* The output's grammar comes from one field only. */
static bool set_grammar(struct oai_request *r, enum gram_kind kind, const json_t *schema,
                        const char *text, size_t len, const char *param, struct oai_err *e) {
    if (r->gkind)
        return oai_bad(e, param, "'%s' and '%s' both constrain the output: send one of them",
                       r->gparam, param);
    r->gkind = kind;
    r->gparam = param;
    if (schema) { /* the schema's text, for the grammar cache's key and the compiler */
        r->gtext_own = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!r->gtext_own) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        text = r->gtext_own;
        len = strlen(text);
    }
    r->gtext = text ? text : "";
    r->glen = text ? len : 0;
    return true;
}

/* A JSON Schema value: an object, or true (anything) / false (nothing). */
static bool schema_ok(const json_t *s) {
    return json_is_object(s) || json_is_boolean(s);
}

/* response_format: text; json_object (llama.cpp: with an optional "schema"); json_schema
 * with OpenAI's {"json_schema": {"name", "schema", "strict", "description"}} (or llama.cpp's
 * "schema" beside "type"). */
static bool parse_response_format(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (json_is_null(v)) return true;
    json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (!json_is_string(t))
        return oai_bad(e, "response_format", "'response_format' must be an object with a 'type'");
    const char *type = json_string_value(t);
    json_t *schema = json_object_get(v, "schema");
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        bool known = !strcmp(k, "type") || (strcmp(type, "text") && !strcmp(k, "schema")) ||
                     (!strcmp(type, "json_schema") && !strcmp(k, "json_schema"));
        if (!known)
            return oai_bad(e, "response_format",
                           "response_format: unknown field '%.*s' for "
                           "type '%.*s'",
                           oai_clip(k, 40), k, oai_clip(type, 32), type);
    }
    if (schema && !schema_ok(schema))
        return oai_bad(e, "response_format.schema",
                       "response_format.schema must be a JSON "
                       "Schema object");
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object"))
        return set_grammar(r, schema ? GRAM_JSON_SCHEMA : GRAM_JSON_OBJECT, schema, NULL, 0,
                           "response_format", e);
    if (strcmp(type, "json_schema") != 0)
        return oai_bad(e, "response_format",
                       "response_format type '%.*s' is not supported: "
                       "'text', 'json_object' and 'json_schema' are",
                       oai_clip(type, 32), type);
    json_t *js = json_object_get(v, "json_schema");
    if (js) {
        if (!json_is_object(js))
            return oai_bad(e, "response_format.json_schema",
                           "response_format.json_schema must be an object");
        json_object_foreach(js, k, x) {
            if (!strcmp(k, "schema")) {
                if (schema)
                    return oai_bad(
                        e, "response_format.json_schema.schema",
                        "response_format has two schemas (schema and json_schema.schema)");
                if (!schema_ok(x))
                    return oai_bad(e, "response_format.json_schema.schema",
                                   "response_format.json_schema.schema must be a JSON Schema "
                                   "object");
                schema = x;
            } else if (!strcmp(k, "name") || !strcmp(k, "description")) {
                if (!json_is_string(x))
                    return oai_bad(e, "response_format.json_schema",
                                   "response_format.json_schema."
                                   "%s must be a string",
                                   k);
            } else if (!strcmp(k, "strict")) {
                /* strict or not, the schema is enforced (its grammar admits only valid
                 * documents) */
                if (!json_is_boolean(x) && !json_is_null(x))
                    return oai_bad(e, "response_format.json_schema.strict",
                                   "response_format.json_schema.strict must be a boolean");
            } else {
                return oai_bad(e, "response_format.json_schema",
                               "response_format.json_schema: "
                               "unknown field '%.*s'",
                               oai_clip(k, 40), k);
            }
        }
    }
    /* no schema: any JSON object */
    return set_grammar(r, schema ? GRAM_JSON_SCHEMA : GRAM_JSON_OBJECT, schema, NULL, 0,
                       schema && js ? "response_format.json_schema.schema" : "response_format", e);
}

/* ---- chat ---- */

/* Joins a content list of text parts into one string value. */
static bool flatten_content(json_t *msg, size_t mi, struct oai_err *e) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c) || json_is_string(c)) return true;
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", mi);
    if (!json_is_array(c))
        return oai_bad(e, param, "%s must be a string or a list of content parts", param);
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_string(type))
            return oai_bad(e, param, "%s[%zu] must be an object with a 'type'", param, i);
        const char *ts = json_string_value(type);
        if (strcmp(ts, "text") != 0 && strcmp(ts, "input_text") != 0)
            return oai_bad(e, param, "%s[%zu]: content parts of type '%.*s' are not supported "
                           "(text only)", param, i, oai_clip(ts, 32), ts);
        if (!json_is_string(text))
            return oai_bad(e, param, "%s[%zu].text must be a string", param, i);
        total += json_string_length(text) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t n = 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        if (i) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(text), json_string_length(text));
        n += json_string_length(text);
    }
    json_t *s = json_stringn_nocheck(buf, n);
    free(buf);
    if (!s || json_object_set_new(msg, "content", s) != 0)
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

static bool check_tool_calls(json_t *tc, size_t mi, struct oai_err *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].tool_calls", mi);
    if (json_is_null(tc)) return true;
    if (!json_is_array(tc)) return oai_bad(e, param, "%s must be a list", param);
    size_t i;
    json_t *call;
    json_array_foreach(tc, i, call) {
        json_t *fn = json_is_object(call) ? json_object_get(call, "function") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        if (!json_is_string(name))
            return oai_bad(e, param, "%s[%zu].function.name must be a string", param, i);
        if (args && json_is_string(args)) {
            /* templates expect the arguments as a mapping (HF convention) */
            json_t *obj = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, NULL);
            if (obj && json_is_object(obj)) json_object_set_new(fn, "arguments", obj);
            else json_decref(obj);
        } else if (args && !json_is_object(args) && !json_is_null(args)) {
            return oai_bad(e, param, "%s[%zu].function.arguments must be a string", param, i);
        }
    }
    return true;
}

static bool parse_messages(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (!json_is_array(v) || json_array_size(v) == 0)
        return oai_bad(e, "messages", "'messages' must be a non-empty list");
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return oai_bad(e, param, "%s must be an object", param);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return oai_bad(e, param, "%s.role must be a string", param);
        const char *rs = json_string_value(role);
        bool assistant = !strcmp(rs, "assistant");
        if (!strcmp(rs, "developer")) {
            json_object_set_new(m, "role", json_string("system")); /* frees the old string */
            rs = "system";
        } else if (strcmp(rs, "system") && strcmp(rs, "user") && !assistant && strcmp(rs, "tool")) {
            return oai_bad(e, param, "%s.role '%.*s' is not one of system, developer, user, "
                           "assistant, tool", param, oai_clip(rs, 32), rs);
        }
        json_t *content = json_object_get(m, "content");
        if (!content && !assistant)
            return oai_bad(e, param, "%s.content is required", param);
        if (content && json_is_null(content) && !assistant)
            return oai_bad(e, param, "%s.content must not be null", param);
        if (!flatten_content(m, i, e)) return false;
        const char *k;
        json_t *x;
        json_object_foreach(m, k, x) {
            if (!strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "name")) continue;
            if (assistant && !strcmp(k, "tool_calls")) {
                if (!check_tool_calls(x, i, e)) return false;
                continue;
            }
            if (assistant && (!strcmp(k, "reasoning_content") || !strcmp(k, "refusal") ||
                              !strcmp(k, "reasoning") || !strcmp(k, "annotations") ||
                              !strcmp(k, "audio")))
                continue;
            if (!strcmp(rs, "tool") && !strcmp(k, "tool_call_id")) continue;
            return oai_bad(e, param, "%s: unknown field '%.*s' for role %s", param,
                           oai_clip(k, 40), k, rs);
        }
        json_t *name = json_object_get(m, "name");
        if (name && !json_is_string(name) && !json_is_null(name))
            return oai_bad(e, param, "%s.name must be a string", param);
    }
    r->messages = v;
    return true;
}

static bool parse_tools(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_array(v)) return oai_bad(e, "tools", "'tools' must be a list");
    if (json_array_size(v) > 512) return oai_bad(e, "tools", "'tools' holds at most 512 tools");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return oai_bad(e, "tools", "tools[%zu].type must be \"function\"", i);
        if (!json_is_string(name) || json_string_length(name) == 0 ||
            json_string_length(name) > 64)
            return oai_bad(e, "tools", "tools[%zu].function.name must be a string of 1 to 64 "
                           "characters", i);
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_object(params) && !json_is_null(params))
            return oai_bad(e, "tools", "tools[%zu].function.parameters must be an object", i);
        /* strict: the arguments must follow the schema exactly (constrained decoding: the
         * call is written under a grammar, docs/structured-output.md) */
        json_t *strict = json_object_get(fn, "strict");
        if (!strict || json_is_null(strict)) continue;
        if (!json_is_boolean(strict)) {
            char param[64];
            snprintf(param, sizeof param, "tools[%zu].function.strict", i);
            return oai_bad(e, param, "%s must be a boolean", param);
        }
        if (json_is_true(strict)) r->tools_strict = true;
    }
    if (json_array_size(v) > 0) r->tools = v;
    return true;
}

static bool tool_exists(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return true;
    }
    return false;
}

static bool parse_tool_choice(json_t *v, struct oai_request *r, struct oai_err *e) {
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto")) r->tool_choice = OAI_TOOLS_AUTO;
        else if (!strcmp(s, "none")) r->tool_choice = OAI_TOOLS_NONE;
        else if (!strcmp(s, "required")) r->tool_choice = OAI_TOOLS_REQUIRED;
        else return oai_bad(e, "tool_choice", "'tool_choice' must be none, auto, required or a "
                            "named function");
    } else {
        json_t *fn = json_is_object(v) ? json_object_get(v, "function") : NULL;
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return oai_bad(e, "tool_choice", "'tool_choice' must be none, auto, required or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        r->tool_choice = OAI_TOOLS_NAMED;
        r->tool_name = json_string_value(name);
    }
    if ((r->tool_choice == OAI_TOOLS_REQUIRED || r->tool_choice == OAI_TOOLS_NAMED) && !r->tools)
        return oai_bad(e, "tool_choice", "tool_choice '%s' needs 'tools'",
                       r->tool_choice == OAI_TOOLS_NAMED ? r->tool_name : "required");
    if (r->tool_choice == OAI_TOOLS_NAMED && !tool_exists(r->tools, r->tool_name))
        return oai_bad(e, "tool_choice", "tool_choice names '%.*s', which is not in 'tools'",
                       oai_clip(r->tool_name, 64), r->tool_name);
    return true;
}

/* ---- completions prompt ---- */

/* param: "prompt" (completions) or "input" (embeddings), for the messages. */
static bool ids_from_array(json_t *a, const char *param, int32_t n_vocab, struct oai_prompt *p,
                           size_t pi, struct oai_err *e) {
    size_t n = json_array_size(a), i;
    if (n == 0) return oai_bad(e, param, "%s %zu is empty", param, pi);
    if (n > (1u << 24)) return oai_bad(e, param, "%s %zu is too long", param, pi);
    p->ids = malloc(n * sizeof *p->ids);
    if (!p->ids) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->n_ids = (int32_t)n;
    json_t *x;
    json_array_foreach(a, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= n_vocab)
            return oai_bad(e, param, "%s %zu: token %zu is not a token id (0..%d)", param, pi,
                           i, n_vocab - 1);
        p->ids[i] = (int32_t)json_integer_value(x);
    }
    return true;
}

/* The completions prompt or the embeddings input (param): a string, a list of strings, a
 * list of token ids or a list of lists of token ids; at most max of them. */
static bool parse_prompt(json_t *v, const char *param, size_t max, int32_t n_vocab,
                         struct oai_request *r, struct oai_err *e) {
    if (!v || json_is_null(v)) return oai_bad(e, param, "'%s' is required", param);
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n == 0) return oai_bad(e, param, "'%s' must not be an empty list", param);
        /* a list of integers is one prompt of token ids */
        if (json_is_integer(json_array_get(v, 0))) n = 1;
    } else if (!json_is_string(v)) {
        return oai_bad(e, param, "'%s' must be a string, a list of strings, a list of token ids "
                       "or a list of lists of token ids", param);
    }
    if (n > max) return oai_bad(e, param, "'%s': at most %zu items, got %zu", param, max, n);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    r->n_prompts = (int32_t)n;
    if (json_is_string(v)) {
        r->prompts[0].text = json_string_value(v);
        r->prompts[0].len = json_string_length(v);
        return true;
    }
    if (json_is_integer(json_array_get(v, 0)))
        return ids_from_array(v, param, n_vocab, &r->prompts[0], 0, e);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (json_is_string(x)) {
            r->prompts[i].text = json_string_value(x);
            r->prompts[i].len = json_string_length(x);
        } else if (json_is_array(x)) {
            if (!ids_from_array(x, param, n_vocab, &r->prompts[i], i, e)) return false;
        } else {
            return oai_bad(e, param, "%s %zu must be a string or a list of token ids", param, i);
        }
    }
    return true;
}

/* ---- embeddings ---- */

/* /v1/embeddings: input, model, encoding_format ("float" or "base64"), dimensions (1 or
 * more: the vector is cut to that many and normalized again; the route checks the model's
 * size), user. Anything else is a 400 naming it (sampling fields mean nothing here). */
static bool parse_embedding(struct oai_request *r, int32_t n_vocab, struct oai_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(r->root, k, v) {
        if (!strcmp(k, "model")) {
            if (!oai_get_str(v, k, &r->model, e)) return false;
        } else if (!strcmp(k, "encoding_format")) {
            const char *f = "float";
            if (!oai_get_str(v, k, &f, e)) return false;
            if (strcmp(f, "float") && strcmp(f, "base64"))
                return oai_bad(e, k, "'encoding_format' must be \"float\" or \"base64\", got "
                               "\"%.*s\"", oai_clip(f, 64), f);
            r->base64 = !strcmp(f, "base64");
        } else if (!strcmp(k, "dimensions")) {
            int64_t d = 0;
            if (!oai_get_int(v, k, 1, INT32_MAX, &d, e)) return false;
            r->dimensions = (int32_t)d;
        } else if (strcmp(k, "input") && strcmp(k, "user")) {
            return oai_bad(e, k, "Unrecognized request argument supplied: %.*s (an embeddings "
                           "request takes input, model, encoding_format, dimensions and user)",
                           oai_clip(k, 64), k);
        }
    }
    if (!parse_prompt(json_object_get(r->root, "input"), "input", MAX_INPUTS, n_vocab, r, e))
        return false;
    r->ep.embed = true;
    r->max_tokens = 0;
    return true;
}

/* ---- the request ---- */

/* Fields accepted and ignored: they change nothing about generation. */
static bool harmless(const char *k) {
    static const char *const names[] = {"user", "metadata", "store", "service_tier",
                                        "spaces_between_special_tokens",
                                        "safety_identifier", "prompt_cache_key", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(k, names[i])) return true;
    return false;
}

/* Fields OpenAI has that smelt refuses (named in the error). */
static bool unsupported(const char *k) {
    static const char *const names[] = {
        "audio",       "prediction",   "functions",     "function_call",  "web_search_options",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
        NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(k, names[i])) return true;
    return false;
}

static bool parse_field(const char *k, json_t *v, enum oai_kind kind, int32_t n_vocab,
                        struct oai_request *r, struct oai_err *e) {
    struct sample_params *sp = &r->ep.sp;
    double d;
    int64_t i;
    bool chat = kind == OAI_CHAT;
    if (!strcmp(k, "model")) return oai_get_str(v, k, &r->model, e);
    if (chat && !strcmp(k, "messages")) return parse_messages(v, r, e);
    if (!chat && !strcmp(k, "prompt")) return true; /* parsed after the loop */
    if (!strcmp(k, "stream")) return oai_get_bool(v, k, &r->stream, e);
    if (!strcmp(k, "stream_options")) return parse_stream_options(v, r, e);
    if (!strcmp(k, "temperature")) {
        d = sp->temperature;
        if (!oai_get_num(v, k, 0, 2, &d, e)) return false;
        sp->temperature = (float)d;
        return true;
    }
    if (!strcmp(k, "top_p")) {
        d = sp->top_p;
        if (!oai_get_num(v, k, 0, 1, &d, e)) return false;
        sp->top_p = (float)d;
        return true;
    }
    if (!strcmp(k, "top_k")) {
        i = sp->top_k;
        if (!oai_get_int(v, k, -1, 1 << 30, &i, e)) return false;
        sp->top_k = (int32_t)i;
        return true;
    }
    if (!strcmp(k, "min_p")) {
        d = sp->min_p;
        if (!oai_get_num(v, k, 0, 1, &d, e)) return false;
        sp->min_p = (float)d;
        return true;
    }
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty")) {
        d = 0;
        if (!oai_get_num(v, k, -2, 2, &d, e)) return false;
        if (k[0] == 'p') sp->presence_penalty = (float)d;
        else sp->frequency_penalty = (float)d;
        return true;
    }
    if (!strcmp(k, "repetition_penalty")) {
        d = sp->repetition_penalty;
        if (!oai_get_num(v, k, 0.01, 10, &d, e)) return false;
        sp->repetition_penalty = (float)d;
        return true;
    }
    if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
        i = r->max_tokens;
        int64_t lo = !chat ? 0 : 1;
        if (!oai_get_int(v, k, lo, 1 << 30, &i, e)) return false;
        if (!json_is_null(v)) r->max_tokens = (int32_t)i;
        return true;
    }
    if (!strcmp(k, "n")) {
        i = r->n;
        if (!oai_get_int(v, k, 1, ENGINE_MAX_N, &i, e)) return false;
        r->n = (int32_t)i;
        return true;
    }
    if (!strcmp(k, "seed")) {
        i = 0;
        if (!oai_get_int(v, k, INT64_MIN, INT64_MAX, &i, e)) return false;
        if (!json_is_null(v)) {
            r->has_seed = true;
            sp->seed = (uint64_t)i;
        }
        return true;
    }
    if (!strcmp(k, "stop")) return parse_stop(v, r, e);
    if (!strcmp(k, "stop_token_ids")) return parse_stop_ids(v, n_vocab, r, e);
    if (!strcmp(k, "logit_bias")) return parse_logit_bias(v, n_vocab, r, e);
    if (!strcmp(k, "ignore_eos")) return oai_get_bool(v, k, &r->ignore_eos, e);
    if (!strcmp(k, "speculative")) { /* smelt's: false opts out of speculative decoding */
        bool b = true;
        if (!oai_get_bool(v, k, &b, e)) return false;
        r->ep.no_spec = !b;
        return true;
    }
    if (!strcmp(k, "skip_special_tokens")) {
        bool skip = true;
        if (!oai_get_bool(v, k, &skip, e)) return false;
        r->ep.decode_special = !skip;
        return true;
    }
    if (!strcmp(k, "response_format")) return parse_response_format(v, r, e);
    /* llama.cpp's fields: a GBNF grammar, a JSON Schema */
    if (!strcmp(k, "grammar")) {
        if (json_is_null(v)) return true;
        if (!json_is_string(v)) return oai_bad(e, k, "'grammar' must be a string (GBNF)");
        if (json_string_length(v) == 0) return true; /* llama.cpp: empty is none */
        return set_grammar(r, GRAM_GBNF, NULL, json_string_value(v), json_string_length(v),
                           "grammar", e);
    }
    if (!strcmp(k, "json_schema")) {
        if (json_is_null(v)) return true;
        if (!schema_ok(v)) return oai_bad(e, k, "'json_schema' must be a JSON Schema object");
        return set_grammar(r, GRAM_JSON_SCHEMA, v, NULL, 0, "json_schema", e);
    }
    if (!strcmp(k, "min_tokens")) {
        i = 0;
        if (!oai_get_int(v, k, 0, 1 << 30, &i, e)) return false;
        if (i > 0) return oai_bad(e, k, "'min_tokens' is not supported yet");
        return true;
    }
    if (!strcmp(k, "include_stop_str_in_output")) {
        bool b = false;
        if (!oai_get_bool(v, k, &b, e)) return false;
        if (b) return oai_bad(e, k, "'include_stop_str_in_output' is not supported yet");
        return true;
    }
    if (!strcmp(k, "modalities")) {
        if (json_is_null(v)) return true;
        size_t j;
        json_t *x;
        if (!json_is_array(v)) return oai_bad(e, k, "'modalities' must be a list");
        json_array_foreach(v, j, x) if (!json_is_string(x) || strcmp(json_string_value(x), "text"))
            return oai_bad(e, k, "only the 'text' modality is supported");
        return true;
    }
    if (chat) {
        if (!strcmp(k, "logprobs")) return oai_get_bool(v, k, &r->logprobs, e);
        if (!strcmp(k, "top_logprobs")) {
            i = 0;
            if (!oai_get_int(v, k, 0, MAX_TOP_LOGPROBS, &i, e)) return false;
            r->top_logprobs = (int32_t)i;
            return true;
        }
        if (!strcmp(k, "tools")) return parse_tools(v, r, e);
        if (!strcmp(k, "tool_choice")) return true; /* after tools, below */
        if (!strcmp(k, "parallel_tool_calls")) return oai_get_bool(v, k, &r->parallel_tool_calls, e);
        if (!strcmp(k, "chat_template_kwargs")) {
            if (json_is_null(v)) return true;
            if (!json_is_object(v)) return oai_bad(e, k, "'chat_template_kwargs' must be an object");
            r->template_kwargs = v;
            return true;
        }
        if (!strcmp(k, "reasoning_effort")) {
            static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", NULL};
            if (json_is_null(v)) return true;
            for (int j = 0; json_is_string(v) && efforts[j]; j++)
                if (!strcmp(json_string_value(v), efforts[j])) {
                    r->reasoning_effort = efforts[j];
                    return true;
                }
            return oai_bad(e, k, "'reasoning_effort' must be one of none, minimal, low, medium, "
                           "high");
        }
        if (!strcmp(k, "add_generation_prompt")) return oai_get_bool(v, k, &r->add_generation_prompt, e);
        if (!strcmp(k, "continue_final_message"))
            return oai_get_bool(v, k, &r->continue_final_message, e);
    } else {
        if (!strcmp(k, "logprobs")) {
            i = -1;
            if (!oai_get_int(v, k, 0, MAX_TOP_LOGPROBS, &i, e)) return false;
            if (i >= 0) {
                r->logprobs = true;
                r->top_logprobs = (int32_t)i;
            }
            return true;
        }
        if (!strcmp(k, "echo")) return oai_get_bool(v, k, &r->echo, e);
        if (!strcmp(k, "suffix")) {
            if (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) return true;
            return oai_bad(e, k, "'suffix' is not supported");
        }
        if (!strcmp(k, "best_of")) {
            i = 1;
            if (!oai_get_int(v, k, 1, ENGINE_MAX_N, &i, e)) return false;
            int64_t n = 1;
            json_t *nv = json_object_get(r->root, "n");
            if (nv && json_is_integer(nv)) n = json_integer_value(nv);
            if (i != 1 && i != n) return oai_bad(e, k, "'best_of' other than n is not supported");
            return true;
        }
    }
    if (harmless(k)) return true;
    if (unsupported(k)) return oai_bad(e, k, "'%s' is not supported", k);
    return oai_bad(e, k, "Unrecognized request argument supplied: %.*s",
                   oai_clip(k, 64), k);
}

json_t *oai_load_object(const char *body, size_t len, struct oai_err *e) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        oai_bad(e, NULL, "We could not parse the JSON body of your request: %s (line %d, "
                "column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        oai_bad(e, NULL, "The request body must be a JSON object");
        return NULL;
    }
    return root;
}

bool oai_parse(const char *body, size_t len, enum oai_kind kind, int32_t n_vocab,
               const struct sample_params *defaults, struct oai_request *r, struct oai_err *e) {
    json_t *root = oai_load_object(body, len, e);
    if (!root) {
        memset(r, 0, sizeof *r);
        return false;
    }
    return oai_parse_json(root, kind, n_vocab, defaults, r, e);
}

bool oai_parse_json(json_t *root, enum oai_kind kind, int32_t n_vocab,
                    const struct sample_params *defaults, struct oai_request *r,
                    struct oai_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->n = 1;
    r->parallel_tool_calls = true;
    r->add_generation_prompt = true;
    engine_params_default(&r->ep);
    if (defaults) {
        r->ep.sp = *defaults;
        r->ep.sp.bias = NULL;
        r->ep.sp.n_bias = 0;
        r->ep.sp.n_logprobs = -1;
    }
    r->root = root;
    if (!json_is_object(r->root))
        return oai_bad(e, NULL, "The request body must be a JSON object");
    if (kind == OAI_EMBEDDING) return parse_embedding(r, n_vocab, e);
    const char *k;
    json_t *v;
    json_object_foreach(r->root, k, v) {
        if (!parse_field(k, v, kind, n_vocab, r, e)) return false;
    }
    if (kind == OAI_CHAT) {
        if (!r->messages) return oai_bad(e, "messages", "'messages' is required");
        if (!parse_tool_choice(json_object_get(r->root, "tool_choice"), r, e)) return false;
        if (r->top_logprobs > 0 && !r->logprobs)
            return oai_bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (r->add_generation_prompt && r->continue_final_message)
            return oai_bad(e, "continue_final_message", "'continue_final_message' and "
                           "'add_generation_prompt' cannot both be true");
    } else {
        if (!parse_prompt(json_object_get(r->root, "prompt"), "prompt", MAX_PROMPTS, n_vocab, r, e))
            return false;
        if (r->max_tokens == 0 && !r->echo)
            return oai_bad(e, "max_tokens", "'max_tokens' must be at least 1");
        if (r->max_tokens < 0) r->max_tokens = 16; /* OpenAI's default for completions */
    }
    if (r->include_usage && !r->stream)
        return oai_bad(e, "stream_options", "The 'stream_options' parameter is only allowed when "
                       "'stream' is enabled.");
    if (r->ep.sp.top_p == 0.0f) { /* nothing but the most likely token */
        r->ep.sp.top_p = 1.0f;
        r->ep.sp.temperature = 0.0f;
    }
    r->ep.sp.n_logprobs = r->logprobs ? r->top_logprobs : -1;
    r->ep.ignore_eos = r->ignore_eos;
    return true;
}

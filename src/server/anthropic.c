/* The Anthropic Messages API: POST /v1/messages (streaming or not) and
 * /v1/messages/count_tokens, over the chat machinery (gen.c, gen_api.c).
 *
 * Request -> chat request. system (a string or text blocks, joined by "\n") becomes the
 * first message; a user message's text blocks become a user message and each tool_result
 * block a tool message (in the order given); an assistant message's text, thinking and
 * tool_use blocks become one assistant message (content, reasoning_content, tool_calls with
 * the input as arguments). tools (name, description, input_schema) become function tools;
 * tool_choice auto / any / tool / none become auto / required / the named function / none,
 * disable_parallel_tool_use parallel_tool_calls false. thinking enabled or adaptive sets the
 * template's enable_thinking, disabled clears it (absent: the template's default);
 * output_config.effort becomes reasoning_effort. A final assistant message is a prefill:
 * the reply continues it (continue_final_message). cache_control anywhere, metadata,
 * service_tier and the like change nothing and are accepted.
 *
 * Claude Code's volatile system text. Claude Code begins the system prompt of every request
 * with a line "x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;" whose
 * cch value (and part of the version) changes on each request. Left in, it sits at the start
 * of the prompt, so the prefix cache never matches past it and every turn of an agent loop
 * prefills the whole conversation again. The line is dropped, wherever it starts a line of
 * the system text: it is billing metadata for Anthropic's own service and says nothing to the
 * model, so dropping it is simpler and cheaper than moving it behind the stable prefix (where
 * it would still cost tokens and a changing suffix every turn).
 *
 * Reply -> Anthropic. Blocks (gen_api.c) become content blocks: reasoning a thinking block
 * (signature ""), text a text block, a call a tool_use block ("toolu_" id; input: the
 * arguments parsed, {} when they are not a JSON object, e.g. cut off by max_tokens).
 * stop_reason: max_tokens, tool_use, stop_sequence (with the matched string),
 * model_context_window_exceeded (max_tokens is a cap, not checked against the context: a
 * reply may run to the context's end; Claude Code asks 32,000 whatever the model), else
 * end_turn.
 * usage: input_tokens are the prompt tokens not taken from the prefix cache,
 * cache_read_input_tokens the ones that were (Anthropic's split), cache_creation 0. A stream
 * is message_start (input_tokens: the whole prompt, not yet split), ping, per block
 * content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) /
 * content_block_stop, then message_delta (stop_reason, the final usage) and message_stop;
 * a reply cut short ends with an error event instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apis.h"
#include "server/server_int.h"

#define BILLING "x-anthropic-billing-header:"

/* ---- errors ---- */

char *anth_err_json(const struct oai_err *e) {
    const char *t;
    switch (e->status) {
    case 401:
        t = "authentication_error";
        break;
    case 403:
        t = "permission_error";
        break;
    case 404:
        t = "not_found_error";
        break;
    case 413:
        t = "request_too_large";
        break;
    case 429:
        t = "rate_limit_error";
        break;
    case 503:
        t = "overloaded_error";
        break;
    default:
        t = e->status >= 500 ? "api_error" : "invalid_request_error";
        break;
    }
    json_t *root = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message",
                             e->message);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s)
        s = strdup("{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":"
                   "\"out of memory\"}}");
    return s;
}

/* ---- the request ---- */

/* Appends s[0..n) without its lines that begin with Claude Code's billing header (each such
 * line goes with its newline). */
static void put_stable(struct jw *out, const char *s, size_t n) {
    size_t bl = strlen(BILLING);
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - s) + 1 : n;
        if (end - i < bl || memcmp(s + i, BILLING, bl) != 0) jw_raw(out, s + i, end - i);
        i = end;
    }
}

/* The text of v (a string or a list of text blocks, joined by "\n") into out. system: drop
 * the billing header lines (and blocks left empty by that). */
static bool text_of(json_t *v, const char *param, bool system, struct jw *out, struct oai_err *e) {
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (system)
            put_stable(out, json_string_value(v), json_string_length(v));
        else
            jw_raw(out, json_string_value(v), json_string_length(v));
        return true;
    }
    if (!json_is_array(v))
        return oai_bad(e, param, "%s must be a string or a list of text blocks", param);
    size_t i;
    json_t *b;
    bool first = true;
    json_array_foreach(v, i, b) {
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
        json_t *text = json_is_object(b) ? json_object_get(b, "text") : NULL;
        if (!json_is_string(type)) return oai_bad(e, p, "%s must be a block with a 'type'", p);
        if (strcmp(json_string_value(type), "text") != 0)
            return oai_bad(e, p, "%s: blocks of type '%.*s' are not supported here (text only)", p,
                           oai_clip(json_string_value(type), 32), json_string_value(type));
        if (!json_is_string(text)) return oai_bad(e, p, "%s.text must be a string", p);
        if (!oai_only_keys(b, p, keys, e)) return false;
        struct jw t = {0};
        if (system)
            put_stable(&t, json_string_value(text), json_string_length(text));
        else
            jw_raw(&t, json_string_value(text), json_string_length(text));
        if (t.n || !system) {
            if (!first) jw_raw(out, "\n", 1);
            jw_raw(out, t.p ? t.p : "", t.n);
            first = false;
        }
        jw_free(&t);
    }
    return true;
}

static json_t *jw_string(struct jw *w) {
    return json_stringn(w->p ? w->p : "", w->n);
}

/* Appends {"role": role, "content": text} to out. */
static bool push_msg(json_t *out, const char *role, struct jw *text, struct oai_err *e) {
    json_t *m = json_pack("{s:s, s:o}", "role", role, "content", jw_string(text));
    if (!m || text->oom || json_array_append_new(out, m) != 0) return oai_nomem(e);
    return true;
}

/* A text block b (param p) of a message: its text appended to out ("\n" between blocks). */
static bool text_block(json_t *b, const char *p, struct jw *out, bool *any, struct oai_err *e) {
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    json_t *t = json_object_get(b, "text");
    if (!json_is_string(t)) return oai_bad(e, p, "%s.text must be a string", p);
    if (!oai_only_keys(b, p, keys, e)) return false;
    if (*any) jw_raw(out, "\n", 1);
    jw_raw(out, json_string_value(t), json_string_length(t));
    *any = true;
    return true;
}

/* A user message's blocks: text blocks gather into user messages, each tool_result block is
 * a tool message, in order. */
static bool user_blocks(json_t *content, const char *param, json_t *out, struct oai_err *e) {
    static const char *const result_keys[] = {"type",     "tool_use_id",   "content",
                                              "is_error", "cache_control", NULL};
    struct jw text = {0};
    bool any_text = false, any = false, ok = true;
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        json_t *type = json_is_object(b) ? json_object_get(b, "type") : NULL;
        const char *ts = json_string_value(type);
        if (!ts) {
            ok = oai_bad(e, p, "%s must be a content block with a 'type'", p);
            break;
        }
        if (!strcmp(ts, "text")) {
            if (!(ok = text_block(b, p, &text, &any_text, e))) break;
            any = true;
        } else if (!strcmp(ts, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id");
            json_t *is_err = json_object_get(b, "is_error");
            char cp[112];
            snprintf(cp, sizeof cp, "%s.content", p);
            if (!json_is_string(id) || json_string_length(id) == 0) {
                ok = oai_bad(e, p, "%s.tool_use_id must be a non-empty string", p);
                break;
            }
            if (is_err && !json_is_boolean(is_err) && !json_is_null(is_err)) {
                ok = oai_bad(e, p, "%s.is_error must be a boolean", p);
                break;
            }
            if (!(ok = oai_only_keys(b, p, result_keys, e))) break;
            if (any_text && !(ok = push_msg(out, "user", &text, e))) break;
            text.n = 0;
            any_text = false;
            struct jw r = {0};
            if (!(ok = text_of(json_object_get(b, "content"), cp, false, &r, e))) {
                jw_free(&r);
                break;
            }
            json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
                                  jw_string(&r));
            if (!m || r.oom || json_array_append_new(out, m) != 0) ok = oai_nomem(e);
            jw_free(&r);
            any = true;
            if (!ok) break;
        } else if (!strcmp(ts, "image") || !strcmp(ts, "document") ||
                   !strcmp(ts, "search_result") || !strcmp(ts, "container_upload")) {
            ok = oai_bad(e, p,
                         "%s: content blocks of type '%s' are not supported (text and "
                         "tool_result only)",
                         p, ts);
            break;
        } else {
            ok = oai_bad(e, p, "%s: unknown content block type '%.*s'", p, oai_clip(ts, 32), ts);
            break;
        }
    }
    if (ok && (any_text || !any)) ok = push_msg(out, "user", &text, e);
    jw_free(&text);
    return ok;
}

/* An assistant message's blocks: one assistant message. *has_text / *has_calls: what it
 * holds (a final assistant message must be text, to be continued). */
static bool assistant_blocks(json_t *content, const char *param, json_t *out, bool *has_text,
                             bool *has_calls, struct oai_err *e) {
    static const char *const use_keys[] = {"type",          "id",     "name", "input",
                                           "cache_control", "caller", NULL};
    static const char *const think_keys[] = {"type", "thinking", "signature", "cache_control",
                                             NULL};
    static const char *const redacted_keys[] = {"type", "data", "cache_control", NULL};
    struct jw text = {0}, reason = {0};
    json_t *calls = json_array();
    bool ok = calls != NULL, any_text = false;
    if (!ok) return oai_nomem(e);
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        const char *ts = json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
        if (!ts) {
            ok = oai_bad(e, p, "%s must be a content block with a 'type'", p);
            break;
        }
        if (!strcmp(ts, "text")) {
            if (!(ok = text_block(b, p, &text, &any_text, e))) break;
        } else if (!strcmp(ts, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || json_string_length(name) == 0) {
                ok = oai_bad(e, p, "%s needs an 'id' and a 'name' (strings)", p);
                break;
            }
            if (!json_is_object(input)) {
                ok = oai_bad(e, p, "%s.input must be an object", p);
                break;
            }
            if (!(ok = oai_only_keys(b, p, use_keys, e))) break;
            /* (arguments as an object: templates read them as a mapping) */
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                     "function", "name", name, "arguments", input);
            if (!call || json_array_append_new(calls, call) != 0) {
                ok = oai_nomem(e);
                break;
            }
        } else if (!strcmp(ts, "thinking")) {
            json_t *t = json_object_get(b, "thinking");
            if (!json_is_string(t)) {
                ok = oai_bad(e, p, "%s.thinking must be a string", p);
                break;
            }
            if (!(ok = oai_only_keys(b, p, think_keys, e))) break;
            jw_raw(&reason, json_string_value(t), json_string_length(t));
        } else if (!strcmp(ts, "redacted_thinking")) {
            if (!(ok = oai_only_keys(b, p, redacted_keys, e)))
                break; /* nothing readable: dropped */
        } else if (!strcmp(ts, "image") || !strcmp(ts, "document") ||
                   !strcmp(ts, "server_tool_use") || !strcmp(ts, "web_search_tool_result") ||
                   !strcmp(ts, "web_fetch_tool_result") ||
                   !strcmp(ts, "code_execution_tool_result") || !strcmp(ts, "container_upload") ||
                   !strcmp(ts, "mcp_tool_use") || !strcmp(ts, "mcp_tool_result")) {
            ok = oai_bad(e, p,
                         "%s: content blocks of type '%s' are not supported (text, "
                         "tool_use and thinking only)",
                         p, ts);
            break;
        } else {
            ok = oai_bad(e, p, "%s: unknown content block type '%.*s'", p, oai_clip(ts, 32), ts);
            break;
        }
    }
    if (ok) {
        json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                              any_text ? jw_string(&text) : json_null());
        if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        if (m && reason.n) json_object_set_new(m, "reasoning_content", jw_string(&reason));
        if (!m || text.oom || reason.oom || json_array_append_new(out, m) != 0) ok = oai_nomem(e);
    }
    *has_text = any_text;
    *has_calls = json_array_size(calls) > 0;
    json_decref(calls);
    jw_free(&text);
    jw_free(&reason);
    return ok;
}

static bool convert_messages(json_t *msgs, json_t *out, bool *prefill, struct oai_err *e) {
    static const char *const keys[] = {"role", "content", NULL};
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return oai_bad(e, "messages", "'messages' must be a non-empty list");
    size_t i, n = json_array_size(msgs);
    json_t *m;
    *prefill = false;
    json_array_foreach(msgs, i, m) {
        char p[48];
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m)) return oai_bad(e, p, "%s must be an object", p);
        const char *role = json_string_value(json_object_get(m, "role"));
        bool user = role && !strcmp(role, "user"), assistant = role && !strcmp(role, "assistant");
        if (!user && !assistant)
            return oai_bad(e, p, "%s.role must be \"user\" or \"assistant\"", p);
        if (!oai_only_keys(m, p, keys, e)) return false;
        json_t *content = json_object_get(m, "content");
        char cp[64];
        snprintf(cp, sizeof cp, "%s.content", p);
        bool has_text = false, has_calls = false;
        if (json_is_string(content)) {
            json_t *x = json_pack("{s:s, s:O}", "role", role, "content", content);
            if (!x || json_array_append_new(out, x) != 0) return oai_nomem(e);
            has_text = true;
        } else if (!json_is_array(content)) {
            return oai_bad(e, cp, "%s must be a string or a list of content blocks", cp);
        } else if (user) {
            if (!user_blocks(content, cp, out, e)) return false;
        } else if (!assistant_blocks(content, cp, out, &has_text, &has_calls, e)) {
            return false;
        }
        if (assistant && i == n - 1) {
            /* a prefill: the reply continues this message */
            if (has_calls || !has_text)
                return oai_bad(e, p,
                               "%s: a final assistant message is continued by the reply, "
                               "so it must hold text and no tool_use",
                               p);
            *prefill = true;
        }
    }
    return true;
}

static bool convert_tools(json_t *tools, json_t *out, struct oai_err *e) {
    static const char *const keys[] = {
        "name",          "description", "input_schema",          "type",
        "cache_control", "strict",      "eager_input_streaming", NULL};
    if (!json_is_array(tools)) return oai_bad(e, "tools", "'tools' must be a list");
    if (json_array_size(tools) > 512) return oai_bad(e, "tools", "'tools' holds at most 512 tools");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char p[48];
        snprintf(p, sizeof p, "tools[%zu]", i);
        if (!json_is_object(t)) return oai_bad(e, p, "%s must be an object", p);
        json_t *type = json_object_get(t, "type");
        if (type && !json_is_null(type) &&
            (!json_is_string(type) || strcmp(json_string_value(type), "custom") != 0))
            return oai_bad(e, p,
                           "%s: tools of type '%.*s' (Anthropic's server tools) are not "
                           "supported; client tools (name, description, input_schema) are",
                           p, json_is_string(type) ? oai_clip(json_string_value(type), 48) : 1,
                           json_is_string(type) ? json_string_value(type) : "?");
        json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
        json_t *schema = json_object_get(t, "input_schema"), *strict = json_object_get(t, "strict");
        if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
            return oai_bad(e, p, "%s.name must be a string of 1 to 64 characters", p);
        if (desc && !json_is_string(desc) && !json_is_null(desc))
            return oai_bad(e, p, "%s.description must be a string", p);
        if (!json_is_object(schema)) return oai_bad(e, p, "%s.input_schema must be an object", p);
        if (strict && !json_is_boolean(strict) && !json_is_null(strict))
            return oai_bad(e, p, "%s.strict must be a boolean", p);
        if (!oai_only_keys(t, p, keys, e)) return false;
        /* (in OpenAI's order: templates write the tools as JSON, keys as they come) */
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", desc);
        if (fn) json_object_set(fn, "parameters", schema);
        if (fn && json_is_true(strict)) json_object_set(fn, "strict", strict); /* (a grammar) */
        json_t *x = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!x || json_array_append_new(out, x) != 0) return oai_nomem(e);
    }
    return true;
}

/* tool_choice -> chat's tool_choice (and parallel_tool_calls). */
static bool convert_tool_choice(json_t *v, json_t *chat, struct oai_err *e) {
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    if (json_is_null(v)) return true;
    const char *t = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
    if (!t) return oai_bad(e, "tool_choice", "'tool_choice' must be an object with a 'type'");
    if (!oai_only_keys(v, "tool_choice", keys, e)) return false;
    json_t *dp = json_object_get(v, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp) && !json_is_null(dp))
        return oai_bad(e, "tool_choice", "tool_choice.disable_parallel_tool_use must be a boolean");
    json_t *name = json_object_get(v, "name"), *x;
    if (!strcmp(t, "auto"))
        x = json_string("auto");
    else if (!strcmp(t, "any"))
        x = json_string("required");
    else if (!strcmp(t, "none"))
        x = json_string("none");
    else if (!strcmp(t, "tool")) {
        if (!json_is_string(name))
            return oai_bad(e, "tool_choice", "tool_choice of type 'tool' needs a 'name'");
        x = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return oai_bad(e, "tool_choice", "tool_choice.type must be auto, any, tool or none");
    }
    if (!x || json_object_set_new(chat, "tool_choice", x) != 0) return oai_nomem(e);
    if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    return true;
}

/* thinking -> the template's enable_thinking (kw). */
static bool convert_thinking(json_t *v, int64_t max_tokens, json_t *kw, struct oai_err *e) {
    static const char *const keys[] = {"type", "budget_tokens", "display", NULL};
    if (json_is_null(v)) return true;
    const char *t = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
    if (!t) return oai_bad(e, "thinking", "'thinking' must be an object with a 'type'");
    if (!oai_only_keys(v, "thinking", keys, e)) return false;
    json_t *display = json_object_get(v, "display");
    if (display && !json_is_null(display) &&
        (!json_is_string(display) || (strcmp(json_string_value(display), "summarized") &&
                                      strcmp(json_string_value(display), "omitted"))))
        return oai_bad(e, "thinking", "thinking.display must be summarized or omitted");
    bool on;
    if (!strcmp(t, "enabled")) {
        int64_t b = 0;
        json_t *bv = json_object_get(v, "budget_tokens");
        if (!bv || json_is_null(bv))
            return oai_bad(e, "thinking.budget_tokens",
                           "thinking of type 'enabled' needs "
                           "'budget_tokens'");
        if (!oai_get_int(bv, "thinking.budget_tokens", 1024, 1 << 30, &b, e)) return false;
        if (max_tokens > 0 && b >= max_tokens)
            return oai_bad(e, "thinking.budget_tokens",
                           "thinking.budget_tokens (%lld) must be "
                           "less than max_tokens (%lld)",
                           (long long)b, (long long)max_tokens);
        on = true;
    } else if (!strcmp(t, "adaptive")) {
        on = true;
    } else if (!strcmp(t, "disabled")) {
        on = false;
    } else {
        return oai_bad(e, "thinking", "thinking.type must be enabled, adaptive or disabled");
    }
    return json_object_set_new(kw, "enable_thinking", json_boolean(on)) == 0 || oai_nomem(e);
}

static bool convert_output_config(json_t *v, json_t *chat, struct oai_err *e) {
    static const char *const keys[] = {"effort", "format", NULL};
    if (json_is_null(v)) return true;
    if (!json_is_object(v)) return oai_bad(e, "output_config", "'output_config' must be an object");
    if (!oai_only_keys(v, "output_config", keys, e)) return false;
    json_t *f = json_object_get(v, "format");
    if (f && !json_is_null(f)) { /* structured outputs: {"type": "json_schema", "schema": ...} */
        static const char *const fkeys[] = {"type", "schema", NULL};
        const char *ft = json_is_object(f) ? json_string_value(json_object_get(f, "type")) : NULL;
        json_t *schema = json_object_get(f, "schema");
        if (!ft || strcmp(ft, "json_schema") != 0)
            return oai_bad(e, "output_config.format", "output_config.format must be "
                           "{\"type\": \"json_schema\", \"schema\": ...}");
        if (!oai_only_keys(f, "output_config.format", fkeys, e)) return false;
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return oai_bad(e, "output_config.format.schema", "output_config.format.schema must "
                           "be a JSON Schema");
        json_t *rf = json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
                               "name", "output", "schema", schema);
        if (!rf || json_object_set_new(chat, "response_format", rf) != 0) return oai_nomem(e);
    }
    json_t *eff = json_object_get(v, "effort");
    if (!eff || json_is_null(eff)) return true;
    static const char *const from[] = {"low", "medium", "high", "xhigh", "max", NULL};
    static const char *const to[] = {"low", "medium", "high", "high", "high"};
    for (int i = 0; json_is_string(eff) && from[i]; i++)
        if (!strcmp(json_string_value(eff), from[i]))
            return json_object_set_new(chat, "reasoning_effort", json_string(to[i])) == 0 ||
                   oai_nomem(e);
    return oai_bad(e, "output_config.effort",
                   "output_config.effort must be low, medium, high, "
                   "xhigh or max");
}

static bool convert_stops(json_t *v, json_t *chat, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_array(v))
        return oai_bad(e, "stop_sequences", "'stop_sequences' must be a list of strings");
    if (json_array_size(v) > ENGINE_MAX_STOPS)
        return oai_bad(e, "stop_sequences",
                       "'stop_sequences' holds at most %d sequences here, "
                       "got %zu",
                       ENGINE_MAX_STOPS, json_array_size(v));
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return oai_bad(e, "stop_sequences", "stop_sequences[%zu] must be a string", i);
        if (json_string_length(s) > ENGINE_MAX_STOP_LEN)
            return oai_bad(e, "stop_sequences", "each stop sequence is at most %d bytes",
                           ENGINE_MAX_STOP_LEN);
    }
    return json_object_set(chat, "stop", v) == 0 || oai_nomem(e);
}

static bool convert(json_t *req, bool count, json_t *chat, struct oai_err *e) {
    /* context_management asks the server to clear old tool results or thinking as the
     * context fills; smelt does not, but Claude Code sends it in every request and cannot be
     * told not to, so it is accepted (a session runs to the context's end instead) */
    static const char *const harmless[] = {
        "metadata", "service_tier", "cache_control",      "inference_geo",
        "speed",    "diagnostics",  "context_management", NULL};
    static const char *const unsupported[] = {"container", "mcp_servers", NULL};
    json_t *kw = json_object();
    json_t *msgs = json_array();
    if (!kw || !msgs || json_object_set_new(chat, "messages", msgs) != 0) {
        json_decref(kw);
        return oai_nomem(e);
    }
    int64_t max_tokens = -1;
    bool ok = true;
    const char *k;
    json_t *v;
    json_object_foreach(req, k, v) {
        if (!strcmp(k, "model")) {
            const char *m = NULL;
            if (!(ok = oai_get_str(v, k, &m, e))) break;
            if (m) json_object_set(chat, "model", v);
        } else if (!strcmp(k, "max_tokens")) {
            if (!(ok = oai_get_int(v, k, 1, 1 << 30, &max_tokens, e))) break;
        } else if (!strcmp(k, "stream")) {
            bool st = false;
            if (!(ok = oai_get_bool(v, k, &st, e))) break;
            if (!count) json_object_set_new(chat, "stream", json_boolean(st));
        } else if (!strcmp(k, "temperature") || !strcmp(k, "top_p")) {
            double d = 0;
            if (!(ok = oai_get_num(v, k, 0, 1, &d, e))) break;
            if (!json_is_null(v)) json_object_set(chat, k, v);
        } else if (!strcmp(k, "top_k")) {
            int64_t x = 0;
            if (!(ok = oai_get_int(v, k, 0, 1 << 30, &x, e))) break;
            if (!json_is_null(v)) json_object_set_new(chat, k, json_integer(x));
        } else if (!strcmp(k, "stop_sequences")) {
            if (!(ok = convert_stops(v, chat, e))) break;
        } else if (!strcmp(k, "metadata")) {
            if (!json_is_null(v) && !json_is_object(v)) {
                ok = oai_bad(e, k, "'metadata' must be an object");
                break;
            }
            json_t *u = json_is_object(v) ? json_object_get(v, "user_id") : NULL;
            static const char *const mkeys[] = {"user_id", NULL};
            if (json_is_object(v) && !(ok = oai_only_keys(v, k, mkeys, e))) break;
            if (u && !json_is_string(u) && !json_is_null(u)) {
                ok = oai_bad(e, "metadata.user_id", "metadata.user_id must be a string");
                break;
            }
        } else if (!strcmp(k, "messages") || !strcmp(k, "system") || !strcmp(k, "tools") ||
                   !strcmp(k, "tool_choice") || !strcmp(k, "thinking") ||
                   !strcmp(k, "output_config")) {
            /* below, in order */
        } else if (!strcmp(k, "context_management") && !json_is_object(v) && !json_is_null(v)) {
            ok = oai_bad(e, k, "'context_management' must be an object");
            break;
        } else {
            int i = 0;
            while (harmless[i] && strcmp(harmless[i], k))
                i++;
            if (harmless[i]) continue;
            i = 0;
            while (unsupported[i] && strcmp(unsupported[i], k))
                i++;
            ok = unsupported[i]
                     ? oai_bad(e, k, "'%s' is not supported", k)
                     : oai_bad(e, k, "%.*s: Extra inputs are not permitted", oai_clip(k, 64), k);
            break;
        }
    }
    if (ok && !count && max_tokens < 0) ok = oai_bad(e, "max_tokens", "'max_tokens' is required");
    if (ok && max_tokens > 0 && !count)
        json_object_set_new(chat, "max_tokens", json_integer(max_tokens));
    /* system first */
    json_t *sys = json_object_get(req, "system");
    if (ok && sys && !json_is_null(sys)) {
        struct jw t = {0};
        ok = text_of(sys, "system", true, &t, e);
        if (ok && t.n) ok = push_msg(msgs, "system", &t, e);
        jw_free(&t);
    }
    bool prefill = false;
    if (ok) {
        json_t *m = json_object_get(req, "messages");
        ok = m ? convert_messages(m, msgs, &prefill, e)
               : oai_bad(e, "messages", "'messages' is required");
    }
    if (ok && prefill) {
        json_object_set_new(chat, "add_generation_prompt", json_false());
        json_object_set_new(chat, "continue_final_message", json_true());
    }
    json_t *tools = json_object_get(req, "tools");
    if (ok && tools && !json_is_null(tools)) {
        json_t *out = json_array();
        ok = out && json_object_set_new(chat, "tools", out) == 0 ? convert_tools(tools, out, e)
                                                                 : oai_nomem(e);
    }
    if (ok && json_object_get(req, "tool_choice"))
        ok = convert_tool_choice(json_object_get(req, "tool_choice"), chat, e);
    if (ok && json_object_get(req, "thinking"))
        ok = convert_thinking(json_object_get(req, "thinking"), count ? -1 : max_tokens, kw, e);
    if (ok && json_object_get(req, "output_config"))
        ok = convert_output_config(json_object_get(req, "output_config"), chat, e);
    if (ok && json_object_size(kw))
        ok = json_object_set(chat, "chat_template_kwargs", kw) == 0 || oai_nomem(e);
    json_decref(kw);
    return ok;
}

bool anth_parse(json_t *req, bool count, int32_t n_vocab, const struct sample_params *defaults,
                struct oai_request *rq, struct oai_err *e) {
    memset(rq, 0, sizeof *rq);
    json_t *chat = json_object();
    if (!chat) return oai_nomem(e);
    if (!convert(req, count, chat, e)) {
        json_decref(chat);
        return false;
    }
    if (oai_parse_json(chat, OAI_CHAT, n_vocab, defaults, rq, e)) return true;
    /* (each field was checked above: what is left names chat's fields) */
    if (!strcmp(e->param, "stop")) snprintf(e->param, sizeof e->param, "stop_sequences");
    if (!strcmp(e->param, "continue_final_message"))
        snprintf(e->param, sizeof e->param, "messages");
    return false;
}

/* ---- the reply ---- */

static void ev_begin(struct jw *w, const char *name) {
    jw_str(w, "event: ");
    jw_str(w, name);
    jw_str(w, "\ndata: ");
}

static const char *stop_reason(enum gen_end end) {
    switch (end) {
    case GEN_END_LENGTH:
        return "max_tokens";
    case GEN_END_CONTEXT:
        return "model_context_window_exceeded";
    case GEN_END_CALLS:
        return "tool_use";
    case GEN_END_STOP_SEQ:
        return "stop_sequence";
    default:
        return "end_turn";
    }
}

static void usage_members(struct gen *g, struct jw *w) {
    jw_printf(w,
              "\"input_tokens\":%lld,\"cache_creation_input_tokens\":0,"
              "\"cache_read_input_tokens\":%lld,\"output_tokens\":%lld",
              (long long)(g->usage_prompt - g->usage_cached), (long long)g->usage_cached,
              (long long)g->usage_completion);
}

static void a_begin(struct gen *g) {
    struct jw *w = &g->sse;
    ev_begin(w, "message_start");
    jw_str(w, "{\"type\":\"message_start\",\"message\":{\"id\":\"");
    jw_str(w, g->id);
    jw_str(w, "\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
    jw_json_str(w, g->m->id, strlen(g->m->id));
    jw_printf(w,
              ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,"
              "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,"
              "\"output_tokens\":0}}}\n\n",
              g->req_prompt_tokens[0]);
    ev_begin(w, "ping");
    jw_str(w, "{\"type\":\"ping\"}\n\n");
}

static void a_open(struct gen *g, int32_t bi) {
    struct jw *w = &g->sse;
    const struct gen_block *b = &g->blk[bi];
    ev_begin(w, "content_block_start");
    jw_printf(w, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", bi);
    if (b->kind == GEN_TEXT) {
        jw_str(w, "{\"type\":\"text\",\"text\":\"\"}}\n\n");
    } else if (b->kind == GEN_REASONING) {
        jw_str(w, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n");
    } else {
        jw_str(w, "{\"type\":\"tool_use\",\"id\":\"");
        jw_str(w, b->id);
        jw_str(w, "\",\"name\":");
        jw_json_str(w, b->name, strlen(b->name));
        jw_str(w, ",\"input\":{}}}\n\n");
    }
}

static void a_piece(struct gen *g, int32_t bi, const char *s, size_t n) {
    static const char *const delta[] = {
        "{\"type\":\"text_delta\",\"text\":", "{\"type\":\"thinking_delta\",\"thinking\":",
        "{\"type\":\"input_json_delta\",\"partial_json\":"};
    struct jw *w = &g->sse;
    ev_begin(w, "content_block_delta");
    jw_printf(w, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":", bi);
    jw_str(w, delta[g->blk[bi].kind]);
    jw_json_str(w, s, n);
    jw_str(w, "}}\n\n");
}

static void a_close(struct gen *g, int32_t bi) {
    struct jw *w = &g->sse;
    ev_begin(w, "content_block_stop");
    jw_printf(w, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", bi);
}

static void a_end(struct gen *g, const struct oai_err *err) {
    struct jw *w = &g->sse;
    if (err) {
        char *s = anth_err_json(err);
        ev_begin(w, "error");
        jw_str(w, s);
        jw_str(w, "\n\n");
        free(s);
        return;
    }
    const char *seq;
    enum gen_end end = gen_api_end(g, &seq);
    ev_begin(w, "message_delta");
    jw_str(w, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"");
    jw_str(w, stop_reason(end));
    jw_str(w, "\",\"stop_sequence\":");
    if (seq)
        jw_json_str(w, seq, strlen(seq));
    else
        jw_str(w, "null");
    jw_str(w, "},\"usage\":{");
    usage_members(g, w);
    jw_str(w, "}}\n\n");
    ev_begin(w, "message_stop");
    jw_str(w, "{\"type\":\"message_stop\"}\n\n");
}

static char *a_whole(struct gen *g) {
    const char *seq;
    enum gen_end end = gen_api_end(g, &seq);
    json_t *content = json_array();
    for (int32_t i = 0; content && i < g->n_blk; i++) {
        const struct gen_block *b = &g->blk[i];
        json_t *text = json_stringn_nocheck(b->text.p ? b->text.p : "", b->text.n), *x;
        if (b->kind == GEN_TEXT) {
            x = json_pack("{s:s, s:o}", "type", "text", "text", text);
        } else if (b->kind == GEN_REASONING) {
            x = json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", text, "signature", "");
        } else {
            json_decref(text);
            json_t *in =
                json_loadb(b->text.p ? b->text.p : "", b->text.n, JSON_REJECT_DUPLICATES, NULL);
            if (!json_is_object(in)) {
                json_decref(in);
                in = json_object();
            }
            x = json_pack("{s:s, s:s, s:o, s:o}", "type", "tool_use", "id", b->id, "name",
                          json_stringn_nocheck(b->name, strlen(b->name)), "input", in);
        }
        if (!x || json_array_append_new(content, x) != 0) {
            json_decref(content);
            content = NULL;
        }
    }
    json_t *usage = json_pack(
        "{s:I, s:i, s:I, s:I}", "input_tokens", (json_int_t)(g->usage_prompt - g->usage_cached),
        "cache_creation_input_tokens", 0, "cache_read_input_tokens", (json_int_t)g->usage_cached,
        "output_tokens", (json_int_t)g->usage_completion);
    json_t *root = content && usage
                       ? json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", g->id, "type",
                                   "message", "role", "assistant", "model", g->m->id, "content",
                                   content, "stop_reason", stop_reason(end), "stop_sequence",
                                   seq ? json_string(seq) : json_null(), "usage", usage)
                       : NULL;
    if (!root) {
        json_decref(content);
        json_decref(usage);
    }
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

static bool a_parse(struct gen *g, json_t *body, struct oai_err *e) {
    g->api_req = body;
    return anth_parse(g->api_req, false, tok_n_vocab(g->m->tok), &g->m->defaults, &g->rq, e);
}

static const struct gen_api anth_api = {
    .id_prefix = "msg_",
    .prompt_param = "messages",
    .max_param = "max_tokens",
    .format_param = "output_config.format",
    .schema_param = "input_schema",
    .max_is_cap = true, /* (Claude Code asks 32,000 tokens whatever the context) */
    .block_prefix = {NULL, NULL, "toolu_"},
    .parse = a_parse,
    .begin = a_begin,
    .open = a_open,
    .piece = a_piece,
    .close = a_close,
    .end = a_end,
    .whole = a_whole,
};

/* ---- the routes ---- */

enum MHD_Result anth_route_messages(struct conn *c) {
    return gen_start(c, OAI_CHAT, &anth_api);
}

enum MHD_Result anth_route_count_tokens(struct conn *c) {
    struct oai_err e;
    struct oai_request rq = {0};
    struct chat_prompt cp = {0};
    struct tok_ids ids = {0};
    const struct server_model *m;
    json_t *req = oai_load_object(c->body.p ? c->body.p : "", c->body.n, &e);
    if (!req) return srv_error(c, &e);
    enum srv_want w = srv_model_for(c, json_string_value(json_object_get(req, "model")), &m, &e);
    if (w != SRV_HAVE) { /* (the body stays for the route's next run) */
        json_decref(req);
        return srv_not_yet(c, w, &e);
    }
    srv_body_free(c);
    bool ok = anth_parse(req, true, tok_n_vocab(m->tok), NULL, &rq, &e);
    if (ok) ok = gen_chat_prompt(m, &rq, &cp, &e);
    if (ok) ok = gen_chat_tokenize(m, &cp, &ids, &e);
    gen_chat_prompt_free(&cp);
    oai_request_free(&rq);
    json_decref(req);
    if (!ok) {
        tok_ids_free(&ids);
        return srv_error(c, &e);
    }
    char *body = NULL;
    if (asprintf(&body, "{\"input_tokens\":%zu}", ids.n) < 0) body = NULL;
    tok_ids_free(&ids);
    if (!body) return MHD_NO;
    return srv_respond(c, 200, body, NULL);
}

/* The OpenAI Responses API: POST /v1/responses (streaming or not) and GET
 * /v1/responses/{id}, over the chat machinery (gen.c, gen_api.c), with a bounded store of
 * finished responses for previous_response_id.
 *
 * Request -> chat request. instructions become a system message; then the conversation of
 * previous_response_id (from the store); then input: a string is a user message; items are
 * messages (roles user, system, developer, assistant; content a string or input_text /
 * output_text parts), function_call items (tool calls of an assistant message: consecutive
 * ones and the assistant message before them make one), function_call_output items (tool
 * messages) and reasoning items (the next assistant message's reasoning_content). Function
 * tools and tool_choice map to chat's; max_output_tokens is max_tokens, reasoning.effort is
 * reasoning_effort (xhigh: high).
 *
 * Reply -> Responses. Blocks (gen_api.c) become output items: reasoning a reasoning item (its
 * text as a reasoning_text content part), text a message item with one output_text part, a
 * call a function_call item ("fc_" id, "call_" call_id). status: completed, or incomplete
 * (incomplete_details.reason max_output_tokens) when cut off. A stream is response.created,
 * response.in_progress, then per item response.output_item.added, content_part.added,
 * output_text.delta / reasoning_text.delta / function_call_arguments.delta, the matching
 * .done events and response.output_item.done, then response.completed (or
 * response.incomplete); a reply cut short ends with an error event and response.failed.
 * Every event carries sequence_number; the items' ids are the same in every event and in the
 * final response.
 *
 * The store. A response (store not false) is kept as two texts: the response object (for
 * GET) and its conversation as chat messages (everything before it but the instructions,
 * then its own reply as an assistant message), which the next request's
 * previous_response_id puts before its input. As OpenAI does, instructions are not carried
 * over (resp_store.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/apis.h"
#include "server/resp_store.h"
#include "server/server_int.h"

/* ---- the request ---- */

/* The text of content (a string, or parts of the given types joined by "\n") into out. */
static bool parts_text(json_t *content, const char *param, const char *const *types, struct jw *out,
                       struct oai_err *e) {
    static const char *const keys[] = {"type", "text", "annotations", "logprobs", NULL};
    if (json_is_string(content)) {
        jw_raw(out, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content))
        return oai_bad(e, param, "%s must be a string or a list of content parts", param);
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", param, i);
        const char *t = json_is_object(p) ? json_string_value(json_object_get(p, "type")) : NULL;
        if (!t) return oai_bad(e, pp, "%s must be a content part with a 'type'", pp);
        int k = 0;
        while (types[k] && strcmp(types[k], t))
            k++;
        if (!types[k]) {
            bool media =
                !strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio");
            return oai_bad(e, pp, "%s: content parts of type '%.*s' are %s", pp, oai_clip(t, 32), t,
                           media ? "not supported (text only)" : "not allowed here");
        }
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) return oai_bad(e, pp, "%s.text must be a string", pp);
        if (!oai_only_keys(p, pp, keys, e)) return false;
        if (i) jw_raw(out, "\n", 1);
        jw_raw(out, json_string_value(text), json_string_length(text));
    }
    return true;
}

static json_t *jw_string(struct jw *w) {
    return json_stringn(w->p ? w->p : "", w->n);
}

/* The last message of msgs when it is an assistant message (function calls join it). */
static json_t *last_assistant(json_t *msgs) {
    json_t *m = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, "assistant") ? m : NULL;
}

/* A new assistant message (content: text or null), with the pending reasoning. */
static json_t *new_assistant(json_t *msgs, json_t *content, struct jw *reason) {
    json_t *m = content ? json_pack("{s:s, s:o}", "role", "assistant", "content", content) : NULL;
    if (m && reason->n) json_object_set_new(m, "reasoning_content", jw_string(reason));
    reason->n = 0;
    if (!m || reason->oom || json_array_append_new(msgs, m) != 0) return NULL;
    return m;
}

static bool message_item(json_t *it, const char *p, json_t *msgs, struct jw *reason,
                         struct oai_err *e) {
    static const char *const keys[] = {"type", "role", "content", "id", "status", NULL};
    static const char *const in_types[] = {"input_text", "text", NULL};
    static const char *const out_types[] = {"output_text", "text", NULL};
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                  strcmp(role, "assistant")))
        return oai_bad(e, p, "%s.role must be user, system, developer or assistant", p);
    if (!oai_only_keys(it, p, keys, e)) return false;
    bool assistant = !strcmp(role, "assistant");
    char cp[112];
    snprintf(cp, sizeof cp, "%s.content", p);
    struct jw t = {0};
    bool ok =
        parts_text(json_object_get(it, "content"), cp, assistant ? out_types : in_types, &t, e);
    if (ok && assistant) {
        ok = new_assistant(msgs, jw_string(&t), reason) || oai_nomem(e);
    } else if (ok) {
        json_t *m = json_pack("{s:s, s:o}", "role", role, "content", jw_string(&t));
        ok = (m && !t.oom && json_array_append_new(msgs, m) == 0) || oai_nomem(e);
    }
    jw_free(&t);
    return ok;
}

static bool function_call_item(json_t *it, const char *p, json_t *msgs, struct jw *reason,
                               struct oai_err *e) {
    static const char *const keys[] = {"type",      "id",     "call_id", "name",
                                       "arguments", "status", NULL};
    json_t *call_id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    json_t *args = json_object_get(it, "arguments");
    if (!json_is_string(call_id) || json_string_length(call_id) == 0)
        return oai_bad(e, p, "%s.call_id must be a non-empty string", p);
    if (!json_is_string(name) || json_string_length(name) == 0)
        return oai_bad(e, p, "%s.name must be a non-empty string", p);
    if (!json_is_string(args)) return oai_bad(e, p, "%s.arguments must be a string", p);
    if (!oai_only_keys(it, p, keys, e)) return false;
    json_t *m = reason->n ? NULL : last_assistant(msgs);
    if (!m && !(m = new_assistant(msgs, json_null(), reason))) return oai_nomem(e);
    json_t *calls = json_object_get(m, "tool_calls");
    if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(m, "tool_calls", calls) != 0) return oai_nomem(e);
    }
    json_t *c = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function", "function",
                          "name", name, "arguments", args);
    return (c && json_array_append_new(calls, c) == 0) || oai_nomem(e);
}

static bool function_output_item(json_t *it, const char *p, json_t *msgs, struct oai_err *e) {
    static const char *const keys[] = {"type", "id", "call_id", "output", "status", NULL};
    static const char *const types[] = {"input_text", "text", NULL};
    json_t *call_id = json_object_get(it, "call_id");
    if (!json_is_string(call_id) || json_string_length(call_id) == 0)
        return oai_bad(e, p, "%s.call_id must be a non-empty string", p);
    if (!oai_only_keys(it, p, keys, e)) return false;
    char op[112];
    snprintf(op, sizeof op, "%s.output", p);
    struct jw t = {0};
    bool ok = parts_text(json_object_get(it, "output"), op, types, &t, e);
    if (ok) {
        json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id, "content",
                              jw_string(&t));
        ok = (m && !t.oom && json_array_append_new(msgs, m) == 0) || oai_nomem(e);
    }
    jw_free(&t);
    return ok;
}

/* A reasoning item: its text (content's reasoning_text parts, else summary's summary_text
 * parts) becomes the next assistant message's reasoning_content. */
static bool reasoning_item(json_t *it, const char *p, struct jw *reason, struct oai_err *e) {
    static const char *const keys[] = {"type",   "id", "summary", "content", "encrypted_content",
                                       "status", NULL};
    static const char *const rtypes[] = {"reasoning_text", NULL};
    static const char *const stypes[] = {"summary_text", NULL};
    if (!oai_only_keys(it, p, keys, e)) return false;
    json_t *content = json_object_get(it, "content"), *summary = json_object_get(it, "summary");
    char cp[112];
    bool use_content = json_is_array(content) && json_array_size(content) > 0;
    snprintf(cp, sizeof cp, "%s.%s", p, use_content ? "content" : "summary");
    json_t *v = use_content ? content : summary;
    if (!v || json_is_null(v)) return true;
    if (reason->n) jw_raw(reason, "\n", 1);
    return parts_text(v, cp, use_content ? rtypes : stypes, reason, e);
}

static bool convert_input(json_t *in, json_t *msgs, struct oai_err *e) {
    if (json_is_string(in)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "user", "content", in);
        return (m && json_array_append_new(msgs, m) == 0) || oai_nomem(e);
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return oai_bad(e, "input", "'input' must be a string or a non-empty list of items");
    struct jw reason = {0};
    bool ok = true;
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        char p[48];
        snprintf(p, sizeof p, "input[%zu]", i);
        if (!json_is_object(it)) {
            ok = oai_bad(e, p, "%s must be an object", p);
            break;
        }
        json_t *tv = json_object_get(it, "type");
        const char *t = json_string_value(tv);
        if (tv && !t) {
            ok = oai_bad(e, p, "%s.type must be a string", p);
            break;
        }
        if (!t || !strcmp(t, "message"))
            ok = message_item(it, p, msgs, &reason, e);
        else if (!strcmp(t, "function_call"))
            ok = function_call_item(it, p, msgs, &reason, e);
        else if (!strcmp(t, "function_call_output"))
            ok = function_output_item(it, p, msgs, e);
        else if (!strcmp(t, "reasoning"))
            ok = reasoning_item(it, p, &reason, e);
        else
            ok = oai_bad(e, p,
                         "%s: items of type '%.*s' are not supported (message, "
                         "function_call, function_call_output and reasoning are)",
                         p, oai_clip(t, 48), t);
        if (!ok) break;
    }
    jw_free(&reason); /* (reasoning with no assistant message after it is dropped) */
    return ok;
}

/* text.format json_object / json_schema (name, schema, strict, description) -> chat's
 * response_format (the reply under a grammar: docs/structured-output.md). */
static bool text_format(json_t *f, const char *type, json_t *chat, struct oai_err *e) {
    static const char *const obj_keys[] = {"type", NULL};
    static const char *const js_keys[] = {"type", "name", "schema", "strict", "description", NULL};
    json_t *rf = NULL;
    if (!strcmp(type, "json_object")) {
        if (!oai_only_keys(f, "text.format", obj_keys, e)) return false;
        rf = json_pack("{s:s}", "type", "json_object");
    } else if (!strcmp(type, "json_schema")) {
        if (!oai_only_keys(f, "text.format", js_keys, e)) return false;
        json_t *schema = json_object_get(f, "schema"), *name = json_object_get(f, "name");
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return oai_bad(e, "text.format.schema", "text.format.schema must be a JSON Schema");
        if (name && !json_is_string(name))
            return oai_bad(e, "text.format.name", "text.format.name must be a string");
        json_t *js = json_pack("{s:O}", "schema", schema);
        if (js && json_is_string(name)) json_object_set(js, "name", name);
        rf = js ? json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js) : NULL;
    } else {
        return oai_bad(e, "text.format", "text.format type '%.*s' is not supported (text, "
                       "json_object and json_schema are)", oai_clip(type, 32), type);
    }
    return (rf && json_object_set_new(chat, "response_format", rf) == 0) || oai_nomem(e);
}

static bool convert_tools(json_t *tools, json_t *out, struct oai_err *e) {
    static const char *const keys[] = {"type", "name", "description", "parameters", "strict", NULL};
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return oai_bad(e, "tools", "'tools' must be a list");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char p[48];
        snprintf(p, sizeof p, "tools[%zu]", i);
        const char *type = json_is_object(t) ? json_string_value(json_object_get(t, "type")) : NULL;
        if (!type) return oai_bad(e, p, "%s must be an object with a 'type'", p);
        if (strcmp(type, "function") != 0)
            return oai_bad(e, p,
                           "%s: tools of type '%.*s' are not supported (function tools "
                           "only)",
                           p, oai_clip(type, 48), type);
        json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
        json_t *params = json_object_get(t, "parameters"), *strict = json_object_get(t, "strict");
        if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
            return oai_bad(e, p, "%s.name must be a string of 1 to 64 characters", p);
        if (desc && !json_is_string(desc) && !json_is_null(desc))
            return oai_bad(e, p, "%s.description must be a string", p);
        if (params && !json_is_object(params) && !json_is_null(params))
            return oai_bad(e, p, "%s.parameters must be an object", p);
        if (strict && !json_is_boolean(strict) && !json_is_null(strict))
            return oai_bad(e, p, "%s.strict must be a boolean", p);
        if (!oai_only_keys(t, p, keys, e)) return false;
        /* (in chat's order: templates write the tools as JSON, keys as they come) */
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", desc);
        if (fn && json_is_object(params)) json_object_set(fn, "parameters", params);
        if (fn && json_is_true(strict)) json_object_set(fn, "strict", strict); /* (a grammar) */
        json_t *x = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
        if (!x || json_array_append_new(out, x) != 0) return oai_nomem(e);
    }
    return true;
}

static bool convert_tool_choice(json_t *v, json_t *chat, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
            return oai_bad(e, "tool_choice",
                           "'tool_choice' must be auto, none, required or "
                           "{\"type\": \"function\", \"name\": ...}");
        return json_object_set(chat, "tool_choice", v) == 0 || oai_nomem(e);
    }
    const char *t = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
    json_t *name = json_is_object(v) ? json_object_get(v, "name") : NULL;
    if (!t || strcmp(t, "function") != 0 || !json_is_string(name) || json_object_size(v) != 2)
        return oai_bad(e, "tool_choice",
                       "'tool_choice' must be auto, none, required or "
                       "{\"type\": \"function\", \"name\": ...} (other kinds are not supported)");
    json_t *x = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    return (x && json_object_set_new(chat, "tool_choice", x) == 0) || oai_nomem(e);
}

static bool check_obj(json_t *v, const char *k, const char *const *keys, struct oai_err *e) {
    if (json_is_null(v)) return true;
    if (!json_is_object(v)) return oai_bad(e, k, "'%s' must be an object", k);
    return oai_only_keys(v, k, keys, e);
}

/* One top-level field (the ones needing the others come after the loop). */
static bool field(const char *k, json_t *v, json_t *chat, struct oai_err *e) {
    static const char *const harmless[] = {
        "user",         "safety_identifier",      "prompt_cache_key",
        "service_tier", "prompt_cache_retention", NULL};
    static const char *const unsupported[] = {"conversation", "prompt", "max_tool_calls",
                                              "context_management", NULL};
    static const char *const reasoning_keys[] = {"effort", "summary", "generate_summary", NULL};
    static const char *const text_keys[] = {"format", "verbosity", NULL};
    static const char *const so_keys[] = {"include_obfuscation", NULL};
    double d = 0;
    int64_t i = 0;
    bool b = false;
    const char *s = NULL;
    if (!strcmp(k, "input") || !strcmp(k, "instructions") || !strcmp(k, "tools") ||
        !strcmp(k, "tool_choice"))
        return true;
    if (!strcmp(k, "model")) {
        if (!oai_get_str(v, k, &s, e)) return false;
        return !s || json_object_set(chat, k, v) == 0 || oai_nomem(e);
    }
    if (!strcmp(k, "stream") || !strcmp(k, "parallel_tool_calls")) {
        if (!oai_get_bool(v, k, &b, e)) return false;
        return json_is_null(v) || json_object_set(chat, k, v) == 0 || oai_nomem(e);
    }
    if (!strcmp(k, "store")) return oai_get_bool(v, k, &b, e);
    if (!strcmp(k, "previous_response_id")) return oai_get_str(v, k, &s, e);
    if (!strcmp(k, "temperature") || !strcmp(k, "top_p")) {
        if (!oai_get_num(v, k, 0, k[0] == 't' && k[1] == 'e' ? 2 : 1, &d, e)) return false;
        return json_is_null(v) || json_object_set(chat, k, v) == 0 || oai_nomem(e);
    }
    if (!strcmp(k, "max_output_tokens")) {
        if (!oai_get_int(v, k, 1, 1 << 30, &i, e)) return false;
        return json_is_null(v) || json_object_set_new(chat, "max_tokens", json_integer(i)) == 0 ||
               oai_nomem(e);
    }
    if (!strcmp(k, "reasoning")) {
        if (!check_obj(v, k, reasoning_keys, e)) return false;
        json_t *eff = json_object_get(v, "effort"), *sum = json_object_get(v, "summary");
        if (sum && !json_is_null(sum) && !json_is_string(sum))
            return oai_bad(e, "reasoning.summary", "reasoning.summary must be a string");
        if (!eff || json_is_null(eff)) return true;
        static const char *const from[] = {"none", "minimal", "low", "medium",
                                           "high", "xhigh",   NULL};
        for (int j = 0; json_is_string(eff) && from[j]; j++)
            if (!strcmp(json_string_value(eff), from[j]))
                return json_object_set_new(chat, "reasoning_effort",
                                           json_string(j == 5 ? "high" : from[j])) == 0 ||
                       oai_nomem(e);
        return oai_bad(e, "reasoning.effort",
                       "reasoning.effort must be none, minimal, low, "
                       "medium, high or xhigh");
    }
    if (!strcmp(k, "text")) {
        if (!check_obj(v, k, text_keys, e)) return false;
        json_t *f = json_object_get(v, "format"), *vb = json_object_get(v, "verbosity");
        const char *ft = json_is_object(f) ? json_string_value(json_object_get(f, "type")) : NULL;
        if (f && !json_is_null(f) && !ft)
            return oai_bad(e, "text.format", "text.format must be an object with a 'type'");
        if (ft && strcmp(ft, "text") != 0 && !text_format(f, ft, chat, e)) return false;
        if (vb && !json_is_null(vb) &&
            (!json_is_string(vb) ||
             (strcmp(json_string_value(vb), "low") && strcmp(json_string_value(vb), "medium") &&
              strcmp(json_string_value(vb), "high"))))
            return oai_bad(e, "text.verbosity", "text.verbosity must be low, medium or high");
        return true;
    }
    if (!strcmp(k, "stream_options")) {
        if (json_is_null(v)) return true;
        if (!check_obj(v, k, so_keys, e)) return false;
        return oai_get_bool(json_object_get(v, "include_obfuscation"),
                            "stream_options.include_obfuscation", &b, e);
    }
    if (!strcmp(k, "metadata")) {
        if (json_is_null(v)) return true;
        if (!json_is_object(v) || json_object_size(v) > 16)
            return oai_bad(e, k, "'metadata' must be an object of at most 16 strings");
        const char *mk;
        json_t *mv;
        json_object_foreach(v, mk, mv) if (!json_is_string(mv) || strlen(mk) > 64 ||
                                           json_string_length(mv) >
                                               512) return oai_bad(e, k,
                                                                   "metadata: keys of at most 64 "
                                                                   "characters, string values of "
                                                                   "at most 512");
        return true;
    }
    if (!strcmp(k, "truncation")) {
        if (!oai_get_str(v, k, &s, e)) return false;
        if (s && strcmp(s, "disabled") != 0)
            return oai_bad(e, k,
                           "truncation '%.*s' is not supported (only 'disabled': a "
                           "conversation longer than the context is refused)",
                           oai_clip(s, 32), s);
        return true;
    }
    if (!strcmp(k, "include")) {
        if (json_is_null(v)) return true;
        if (!json_is_array(v)) return oai_bad(e, k, "'include' must be a list");
        size_t j;
        json_t *x;
        json_array_foreach(v, j, x) {
            /* encrypted reasoning is for stateless clients that send reasoning back: smelt's
             * reasoning items carry their text, which is sent back the same way */
            if (!json_is_string(x) || strcmp(json_string_value(x), "reasoning.encrypted_content"))
                return oai_bad(e, k,
                               "include[%zu]: only 'reasoning.encrypted_content' is "
                               "supported",
                               j);
        }
        return true;
    }
    if (!strcmp(k, "top_logprobs")) {
        if (!oai_get_int(v, k, 0, 20, &i, e)) return false;
        return i == 0 || oai_bad(e, k, "'top_logprobs' is not supported on /v1/responses");
    }
    if (!strcmp(k, "background")) {
        if (!oai_get_bool(v, k, &b, e)) return false;
        return !b || oai_bad(e, k, "background responses are not supported");
    }
    for (int j = 0; harmless[j]; j++)
        if (!strcmp(k, harmless[j])) return true;
    for (int j = 0; unsupported[j]; j++)
        if (!strcmp(k, unsupported[j]))
            return json_is_null(v) || oai_bad(e, k, "'%s' is not supported", k);
    return oai_bad(e, k, "Unrecognized request argument supplied: %.*s", oai_clip(k, 64), k);
}

bool resp_parse(json_t *req, const json_t *history, int32_t n_vocab,
                const struct sample_params *defaults, struct oai_request *rq, struct oai_err *e) {
    memset(rq, 0, sizeof *rq);
    json_t *chat = json_object(), *msgs = json_array(), *tools = json_array();
    bool ok = chat && msgs && tools;
    if (ok) ok = json_object_set(chat, "messages", msgs) == 0;
    if (!ok) oai_nomem(e);
    const char *k;
    json_t *v;
    if (ok) json_object_foreach(req, k, v) if (!(ok = field(k, v, chat, e))) break;
    json_t *instr = json_object_get(req, "instructions");
    if (ok && instr && !json_is_null(instr) && !json_is_string(instr))
        ok = oai_bad(e, "instructions", "'instructions' must be a string");
    if (ok && json_is_string(instr) && json_string_length(instr)) {
        json_t *m = json_pack("{s:s, s:O}", "role", "system", "content", instr);
        ok = (m && json_array_append_new(msgs, m) == 0) || oai_nomem(e);
    }
    if (ok && history) {
        /* (copied: parsing normalizes messages in place) */
        json_t *h = json_deep_copy(history);
        ok = (h && json_array_extend(msgs, h) == 0) || oai_nomem(e);
        json_decref(h);
    }
    json_t *in = json_object_get(req, "input");
    if (ok) ok = in ? convert_input(in, msgs, e) : oai_bad(e, "input", "'input' is required");
    if (ok) ok = convert_tools(json_object_get(req, "tools"), tools, e);
    if (ok && json_array_size(tools))
        ok = json_object_set(chat, "tools", tools) == 0 || oai_nomem(e);
    if (ok && json_object_get(req, "tool_choice"))
        ok = convert_tool_choice(json_object_get(req, "tool_choice"), chat, e);
    json_decref(msgs);
    json_decref(tools);
    if (!ok) {
        json_decref(chat);
        return false;
    }
    if (oai_parse_json(chat, OAI_CHAT, n_vocab, defaults, rq, e)) return true;
    /* (each field was checked above: what is left names chat's fields) */
    if (!strcmp(e->param, "messages") || !strncmp(e->param, "messages[", 9))
        snprintf(e->param, sizeof e->param, "input");
    if (!strcmp(e->param, "max_tokens")) snprintf(e->param, sizeof e->param, "max_output_tokens");
    return false;
}

/* ---- the reply ---- */

/* The reply's item of block bi (status: the block's; with its text when full). */
static const char *item_status(const struct gen *g, int32_t bi) {
    if (!g->blk[bi].closed) return "in_progress";
    return g->api_done && bi == g->n_blk - 1 && g->ch[0].finish == ENGINE_LENGTH ? "incomplete"
                                                                                 : "completed";
}

static json_t *text_part(const struct gen_block *b, bool full) {
    json_t *t = json_stringn_nocheck(full && b->text.p ? b->text.p : "", full ? b->text.n : 0);
    if (b->kind == GEN_REASONING)
        return json_pack("{s:s, s:o}", "type", "reasoning_text", "text", t);
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", t, "annotations",
                     "logprobs");
}

static json_t *item_json(const struct gen *g, int32_t bi, bool full) {
    const struct gen_block *b = &g->blk[bi];
    const char *st = item_status(g, bi);
    if (b->kind == GEN_CALL)
        return json_pack(
            "{s:s, s:s, s:s, s:s, s:o, s:o}", "id", b->id, "type", "function_call", "status", st,
            "call_id", b->call_id, "name", json_stringn_nocheck(b->name, strlen(b->name)),
            "arguments",
            json_stringn_nocheck(full && b->text.p ? b->text.p : "", full ? b->text.n : 0));
    json_t *parts = full ? json_pack("[o]", text_part(b, true)) : json_array();
    if (b->kind == GEN_REASONING)
        return json_pack("{s:s, s:s, s:s, s:[], s:o, s:n}", "id", b->id, "type", "reasoning",
                         "status", st, "summary", "content", parts, "encrypted_content");
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", b->id, "type", "message", "status", st,
                     "role", "assistant", "content", parts);
}

/* The response object: status "in_progress" (no output yet), "completed", "incomplete" or
 * "failed" (err). The request's settings are echoed as OpenAI does. */
static json_t *response_json(struct gen *g, const char *status, const struct oai_err *err) {
    json_t *req = g->api_req;
    json_t *out = json_array();
    bool done = strcmp(status, "in_progress") != 0;
    for (int32_t i = 0; done && out && i < g->n_blk; i++)
        if (json_array_append_new(out, item_json(g, i, true)) != 0) {
            json_decref(out);
            out = NULL;
        }
    json_t *r = out ? json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", g->id, "object", "response",
                                "created_at", (json_int_t)g->created, "status", status, "model",
                                g->m->id, "output", out)
                    : NULL;
    if (!r) return NULL;
#define ECHO(key, dflt)                                                                            \
    do {                                                                                           \
        json_t *x_ = json_object_get(req, key);                                                    \
        json_object_set_new(r, key, x_ && !json_is_null(x_) ? json_incref(x_) : (dflt));           \
    } while (0)
    ECHO("instructions", json_null());
    ECHO("max_output_tokens", json_null());
    ECHO("metadata", json_object());
    ECHO("parallel_tool_calls", json_true());
    ECHO("previous_response_id", json_null());
    ECHO("store", json_true());
    ECHO("temperature", json_real(g->rq.ep.sp.temperature));
    ECHO("top_p", json_real(g->rq.ep.sp.top_p));
    ECHO("tool_choice", json_string("auto"));
    ECHO("tools", json_array());
    ECHO("truncation", json_string("disabled"));
    ECHO("user", json_null());
#undef ECHO
    json_t *re = json_object_get(req, "reasoning");
    json_object_set_new(r, "reasoning",
                        json_pack("{s:O?, s:O?}", "effort", json_object_get(re, "effort"),
                                  "summary", json_object_get(re, "summary")));
    json_object_set_new(r, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(r, "background", json_false());
    json_object_set_new(
        r, "error",
        err ? json_pack("{s:s, s:s}", "code", "server_error", "message", err->message)
            : json_null());
    bool length = done && !err && g->ch[0].finish == ENGINE_LENGTH;
    json_object_set_new(r, "incomplete_details",
                        length ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(
        r, "usage",
        done ? json_pack("{s:I, s:{s:I, s:i}, s:I, s:{s:I}, s:I}", "input_tokens",
                         (json_int_t)g->usage_prompt, "input_tokens_details", "cached_tokens",
                         (json_int_t)g->usage_cached, "cache_write_tokens", 0, "output_tokens",
                         (json_int_t)g->usage_completion, "output_tokens_details",
                         "reasoning_tokens", (json_int_t)g->usage_reasoning, "total_tokens",
                         (json_int_t)(g->usage_prompt + g->usage_completion))
             : json_null());
    return r;
}

/* The reply as the assistant message of the stored conversation. */
static json_t *reply_message(const struct gen *g) {
    struct jw text = {0}, reason = {0};
    json_t *calls = json_array();
    for (int32_t i = 0; calls && i < g->n_blk; i++) {
        const struct gen_block *b = &g->blk[i];
        if (b->kind == GEN_CALL) {
            json_t *c =
                json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", b->call_id, "type", "function",
                          "function", "name", json_stringn_nocheck(b->name, strlen(b->name)),
                          "arguments", json_stringn_nocheck(b->text.p ? b->text.p : "", b->text.n));
            if (!c || json_array_append_new(calls, c) != 0) {
                json_decref(calls);
                calls = NULL;
            }
            continue;
        }
        struct jw *w = b->kind == GEN_TEXT ? &text : &reason;
        if (w->n) jw_raw(w, "\n", 1);
        jw_raw(w, b->text.p ? b->text.p : "", b->text.n);
    }
    json_t *m = calls ? json_pack("{s:s, s:o}", "role", "assistant", "content",
                                  text.n ? json_stringn_nocheck(text.p, text.n) : json_null())
                      : NULL;
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (m && reason.n)
        json_object_set_new(m, "reasoning_content", json_stringn_nocheck(reason.p, reason.n));
    if (text.oom || reason.oom) {
        json_decref(m);
        m = NULL;
    }
    json_decref(calls);
    jw_free(&text);
    jw_free(&reason);
    return m;
}

/* Stores the finished response (unless store is false, or the store is off). */
static void keep(struct gen *g, json_t *resp) {
    struct resp_store *st = g->srv->store;
    if (!st || json_is_false(json_object_get(g->api_req, "store")) || !resp) return;
    json_t *instr = json_object_get(g->api_req, "instructions");
    size_t skip = json_is_string(instr) && json_string_length(instr) ? 1 : 0;
    json_t *conv = json_array(), *reply = reply_message(g);
    for (size_t i = skip; conv && i < json_array_size(g->rq.messages); i++)
        json_array_append(conv, json_array_get(g->rq.messages, i));
    if (conv && reply && json_array_append_new(conv, reply) == 0) reply = NULL;
    char *ct = conv ? json_dumps(conv, JSON_COMPACT) : NULL;
    char *rt = json_dumps(resp, JSON_COMPACT);
    json_decref(conv);
    json_decref(reply);
    if (ct && rt)
        resp_store_put(st, g->id, ct, rt);
    else
        free(ct), free(rt);
}

/* ---- streaming ---- */

/* Writes event obj (taken; its type and sequence_number are set here). */
static void event(struct gen *g, const char *type, json_t *obj) {
    struct jw *w = &g->sse;
    if (!obj) {
        w->oom = true;
        return;
    }
    json_object_set_new(obj, "type", json_string(type));
    json_object_set_new(obj, "sequence_number", json_integer(g->seq++));
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) {
        w->oom = true;
        return;
    }
    jw_str(w, "event: ");
    jw_str(w, type);
    jw_str(w, "\ndata: ");
    jw_str(w, s);
    jw_str(w, "\n\n");
    free(s);
}

static void r_begin(struct gen *g) {
    event(g, "response.created",
          json_pack("{s:o}", "response", response_json(g, "in_progress", NULL)));
    event(g, "response.in_progress",
          json_pack("{s:o}", "response", response_json(g, "in_progress", NULL)));
}

static void r_open(struct gen *g, int32_t bi) {
    const struct gen_block *b = &g->blk[bi];
    event(g, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", bi, "item", item_json(g, bi, false)));
    if (b->kind != GEN_CALL)
        event(g, "response.content_part.added",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->id, "output_index", bi,
                        "content_index", 0, "part", text_part(b, false)));
}

/* The delta events are the hot path (one per token): written directly. */
static void r_piece(struct gen *g, int32_t bi, const char *s, size_t n) {
    static const char *const type[] = {"response.output_text.delta",
                                       "response.reasoning_text.delta",
                                       "response.function_call_arguments.delta"};
    const struct gen_block *b = &g->blk[bi];
    struct jw *w = &g->sse;
    jw_str(w, "event: ");
    jw_str(w, type[b->kind]);
    jw_str(w, "\ndata: {\"type\":\"");
    jw_str(w, type[b->kind]);
    jw_printf(w, "\",\"sequence_number\":%lld,\"item_id\":\"%s\",\"output_index\":%d,",
              (long long)g->seq++, b->id, bi);
    if (b->kind != GEN_CALL) jw_str(w, "\"content_index\":0,");
    if (b->kind == GEN_TEXT) jw_str(w, "\"logprobs\":[],");
    jw_str(w, "\"delta\":");
    jw_json_str(w, s, n);
    jw_str(w, "}\n\n");
}

static void r_close(struct gen *g, int32_t bi) {
    const struct gen_block *b = &g->blk[bi];
    json_t *text = json_stringn_nocheck(b->text.p ? b->text.p : "", b->text.n);
    if (b->kind == GEN_CALL) {
        event(g, "response.function_call_arguments.done",
              json_pack("{s:s, s:i, s:s, s:o}", "item_id", b->id, "output_index", bi, "name",
                        b->name, "arguments", text));
    } else {
        event(g, b->kind == GEN_TEXT ? "response.output_text.done" : "response.reasoning_text.done",
              b->kind == GEN_TEXT
                  ? json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", b->id, "output_index", bi,
                              "content_index", 0, "text", text, "logprobs")
                  : json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->id, "output_index", bi,
                              "content_index", 0, "text", text));
        event(g, "response.content_part.done",
              json_pack("{s:s, s:i, s:i, s:o}", "item_id", b->id, "output_index", bi,
                        "content_index", 0, "part", text_part(b, true)));
    }
    event(g, "response.output_item.done",
          json_pack("{s:i, s:o}", "output_index", bi, "item", item_json(g, bi, true)));
}

static void r_end(struct gen *g, const struct oai_err *err) {
    if (err) {
        event(g, "error",
              json_pack("{s:s, s:s, s:n}", "code", err->code[0] ? err->code : "server_error",
                        "message", err->message, "param"));
        event(g, "response.failed",
              json_pack("{s:o}", "response", response_json(g, "failed", err)));
        return;
    }
    const char *seq;
    enum gen_end end = gen_api_end(g, &seq);
    bool length = end == GEN_END_LENGTH || end == GEN_END_CONTEXT;
    json_t *resp = response_json(g, length ? "incomplete" : "completed", NULL);
    keep(g, resp);
    event(g, length ? "response.incomplete" : "response.completed",
          resp ? json_pack("{s:o}", "response", resp) : NULL);
}

static char *r_whole(struct gen *g) {
    const char *seq;
    enum gen_end end = gen_api_end(g, &seq);
    bool length = end == GEN_END_LENGTH || end == GEN_END_CONTEXT;
    json_t *resp = response_json(g, length ? "incomplete" : "completed", NULL);
    keep(g, resp);
    char *s = resp ? json_dumps(resp, JSON_COMPACT) : NULL;
    json_decref(resp);
    return s;
}

static bool r_parse(struct gen *g, json_t *body, struct oai_err *e) {
    g->api_req = body;
    json_t *prev = json_object_get(g->api_req, "previous_response_id"), *hist = NULL;
    if (json_is_string(prev)) {
        const char *id = json_string_value(prev);
        char *conv = resp_store_get(g->srv->store, id, true);
        hist = conv ? json_loads(conv, 0, NULL) : NULL;
        free(conv);
        if (!hist)
            return oai_fail(e, 400, "invalid_request_error", "previous_response_id",
                            "previous_response_not_found",
                            "Previous response with id '%.*s' not found%s", oai_clip(id, 64), id,
                            g->srv->store ? " (the server keeps a bounded number of responses, "
                                            "in memory)"
                                          : " (this server does not store responses: "
                                            "--response-store 0)");
    }
    bool ok =
        resp_parse(g->api_req, hist, tok_n_vocab(g->m->tok), &g->m->defaults, &g->rq, e);
    json_decref(hist);
    return ok;
}

static const struct gen_api resp_api = {
    .id_prefix = "resp_",
    .prompt_param = "input",
    .max_param = "max_output_tokens",
    .format_param = "text.format",
    .schema_param = "parameters",
    .block_prefix = {"msg_", "rs_", "fc_"},
    .call_id_prefix = "call_",
    .parse = r_parse,
    .begin = r_begin,
    .open = r_open,
    .piece = r_piece,
    .close = r_close,
    .end = r_end,
    .whole = r_whole,
};

/* ---- the routes ---- */

enum MHD_Result resp_route_create(struct conn *c) {
    return gen_start(c, OAI_CHAT, &resp_api);
}

enum MHD_Result resp_route_get(struct conn *c) {
    char *r = resp_store_get(c->srv->store, c->arg, false);
    if (!r) {
        struct oai_err e;
        oai_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                 "Response with id '%.*s' not found", oai_clip(c->arg, 64), c->arg);
        return srv_error(c, &e);
    }
    return srv_respond(c, 200, r, NULL);
}

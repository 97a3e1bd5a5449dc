/* Structured output in the server: the grammar a reply must follow, from the request's
 * response_format, llama.cpp's grammar and json_schema fields, strict tools and forced tool
 * choices (docs/structured-output.md, "Server").
 *
 * Everything becomes one GBNF grammar, composed from pieces whose rules are renamed apart
 * (gram_gbnf_prefix): the response's grammar (j-), each tool's arguments (a<i>-), any JSON
 * object (o-), and the tool-call syntax of the chat template around them (t-):
 *
 *   hermes    <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, "\n" between
 *   qwen_xml  <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
 *             </function>\n</tool_call>: a string parameter's VALUE is raw text (no
 *             "</parameter>" in it), any other the JSON its schema gives
 *   llama3    {"name": "NAME", "parameters": ARGS}, "; " between
 *   mistral   [TOOL_CALLS][{"name": "NAME", "arguments": ARGS}, ...], or with [ARGS] in the
 *             template [TOOL_CALLS]NAME[ARGS]ARGS repeated
 *   harmony   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS (one
 *             call; <|call|> ends it)
 * with optional single spaces at the JSON punctuation of the call wrappers. A strict tool's
 * ARGS follow its parameters' schema; another tool's any JSON object.
 *
 * Which grammar:
 *   - tool_choice required / named: the calls (all tools, or the named one); the prompt ends
 *     with the call's opening (chat.c's prefill), which the engine feeds the grammar first;
 *   - tools with tool_choice auto and a response format: the response or the calls;
 *   - tools with tool_choice auto and a strict tool: the calls, lazily: from the first time
 *     the syntax's call marker appears in the reply (the engine's trigger), free text before;
 *   - a response format alone: the response.
 * A reasoning template's reply may think first: <think>...</think> (or the rest of a think
 * block the prompt opened) before the response; a harmony reply may write analysis messages
 * before its final message (or before a call). */
#include <string.h>

#include "server/server_int.h"

#define REASON_CLOSE "</think>"
#define XML_PCLOSE "</parameter>"

/* ---- GBNF text ---- */

/* A GBNF literal of s[0..n): quotes, backslashes and control bytes escaped; UTF-8 as it is. */
static void lit_n(struct jw *w, const char *s, size_t n) {
    jw_raw(w, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char b[2] = {'\\', (char)c};
            jw_raw(w, b, 2);
        } else if (c < 0x20 || c == 0x7f) {
            jw_printf(w, "\\x%02X", c);
        } else {
            jw_raw(w, (const char *)&c, 1);
        }
    }
    jw_raw(w, "\"", 1);
}

static void lit(struct jw *w, const char *s) {
    lit_n(w, s, strlen(s));
}

/* One character of a GBNF class. */
static void class_char(struct jw *w, unsigned char c) {
    if (c == ']' || c == '[' || c == '\\' || c == '-' || c == '^') {
        char b[2] = {'\\', (char)c};
        jw_raw(w, b, 2);
    } else if (c < 0x20) {
        jw_printf(w, "\\x%02X", c);
    } else {
        jw_raw(w, (const char *)&c, 1);
    }
}

/* Rule `name`: any text without the ASCII marker m, then m (the text up to and including
 * its first m). The marker's first character must not recur in it (true of the markers
 * used here), so the text is [^m0]* (m0 Y)* m, each Y a text without m0 that does not start
 * with m[1..]: regular, so the rule needs no recursion (no stack). */
static void until_rule(struct jw *w, const char *name, const char *m) {
    size_t n = strlen(m);
    unsigned char c0 = (unsigned char)m[0];
    jw_printf(w, "%s ::= [^", name);
    class_char(w, c0);
    jw_str(w, "]* ( ");
    lit_n(w, m, 1);
    /* Y_j = "" | [^m0 mj] [^m0]* | mj Y_j+1 ; the last without its third branch */
    for (size_t j = 1; j < n; j++) {
        jw_str(w, " ( \"\" | [^");
        class_char(w, c0);
        class_char(w, (unsigned char)m[j]);
        jw_str(w, "] [^");
        class_char(w, c0);
        jw_str(w, "]*");
        if (j + 1 < n) {
            jw_str(w, " | ");
            lit_n(w, m + j, 1);
        }
    }
    for (size_t j = 1; j < n; j++)
        jw_str(w, " )");
    jw_str(w, " )* ");
    lit(w, m);
    jw_str(w, "\n");
}

/* Appends a grammar (kind, text) with its rules prefixed: its root is prefix"root". */
static bool add_piece(struct jw *w, enum gram_kind kind, const char *text, size_t len,
                      const char *prefix, struct err *e) {
    struct tok_buf g = {0}, r = {0};
    smelt_status st = gram_to_gbnf(kind, text, len, &g, e);
    if (st == SMELT_OK) st = gram_gbnf_prefix(g.p ? g.p : "", g.n, prefix, &r, e);
    if (st == SMELT_OK) {
        jw_raw(w, r.p ? r.p : "", r.n);
        jw_str(w, "\n");
    }
    tok_buf_free(&g);
    tok_buf_free(&r);
    return st == SMELT_OK;
}

/* A schema's grammar with its rules prefixed (the schema given as a jansson value). */
static bool add_schema(struct jw *w, const json_t *schema, const char *prefix, struct err *e) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return err_set(e, SMELT_ERR_NOMEM, "out of memory"), false;
    bool ok = add_piece(w, GRAM_JSON_SCHEMA, text, strlen(text), prefix, e);
    free(text);
    return ok;
}

/* ---- tools ---- */

struct tb {
    struct jw *w;
    const struct oai_request *rq;
    enum outp_syntax syntax;
    bool mistral_args; /* [TOOL_CALLS]NAME[ARGS]{...} */
    bool any_object;   /* o-root is needed */
    bool xml_free;     /* x-free (a non-strict qwen_xml call's parameters) is needed */
    bool xml_until;    /* x-until is needed */
    struct oai_err *e;
};

/* tools[i]'s name, parameters (NULL: none) and strict flag. */
static const char *tool_of(const json_t *t, const json_t **params, bool *strict) {
    const json_t *fn = json_object_get(t, "function");
    const json_t *p = json_object_get(fn, "parameters");
    *params = json_is_object(p) ? p : NULL;
    *strict = json_is_true(json_object_get(fn, "strict"));
    return json_string_value(json_object_get(fn, "name"));
}

static bool tool_fail(struct tb *b, size_t i, const char *what, const struct err *e) {
    char param[64];
    snprintf(param, sizeof param, "tools[%zu].function.%s", i, what);
    if (e->code == SMELT_ERR_NOMEM)
        return oai_fail(b->e, 500, "server_error", NULL, NULL, "%s", e->msg);
    return oai_bad(b->e, param, "%s: %s", param, e->msg);
}

/* The arguments rule of tools[i] (its name written to rule): the schema's (a<i>-root) when
 * strict, else any JSON object. A strict tool without parameters takes {}. */
static bool args_rule(struct tb *b, size_t i, const json_t *params, bool strict, char *rule,
                      size_t n) {
    if (!strict) {
        b->any_object = true;
        snprintf(rule, n, "o-root");
        return true;
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "a%zu-", i);
    snprintf(rule, n, "a%zu-root", i);
    json_t *empty = params ? NULL : json_pack("{s:s, s:{}}", "type", "object", "properties");
    struct err e;
    err_clear(&e);
    bool ok = params || empty ? add_schema(b->w, params ? params : empty, prefix, &e)
                              : (err_set(&e, SMELT_ERR_NOMEM, "out of memory"), false);
    json_decref(empty);
    return ok || tool_fail(b, i, "parameters", &e);
}

/* Keys a string parameter's schema may hold and still be written as raw text (annotations). */
static bool annotation(const char *k) {
    static const char *const names[] = {"type",      "description", "title",      "default",
                                        "examples",  "$comment",    "deprecated", "readOnly",
                                        "writeOnly", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(k, names[i])) return true;
    return false;
}

/* Whether the qwen_xml parser reads a parameter of schema s as a string (outp.c's
 * param_is_string): type "string", a type list holding it, or no type. */
static bool xml_is_string(const json_t *s) {
    const json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) return !strcmp(json_string_value(type), "string");
    if (!json_is_array(type)) return true;
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) if (json_is_string(t) &&
                                       !strcmp(json_string_value(t), "string")) return true;
    return false;
}

/* One qwen_xml parameter of a strict tool: "<parameter=KEY>\n" VALUE, appended to the
 * expression being written (expr). Raw-text values take the until rule; others their
 * schema's JSON (p<i>-<k>-root, compiled with the tool's $defs / definitions). */
static bool xml_param(struct tb *b, size_t i, size_t k, const char *key, const json_t *ps,
                      const json_t *params, struct jw *expr) {
    char lbl[96];
    snprintf(lbl, sizeof lbl, "parameters.properties.%.40s", key);
    struct err e;
    err_clear(&e);
    struct jw open = {0};
    jw_str(&open, "<parameter=");
    jw_str(&open, key);
    jw_str(&open, ">\n");
    lit_n(expr, open.p, open.n);
    jw_free(&open);
    if (!json_is_object(ps) && !json_is_boolean(ps)) {
        err_set(&e, SMELT_ERR_INVALID, "not a schema");
        return tool_fail(b, i, lbl, &e);
    }
    if (json_is_boolean(ps) || xml_is_string(ps)) {
        const char *kk;
        const json_t *x;
        const json_t *vals = json_is_object(ps) ? json_object_get(ps, "enum") : NULL;
        const json_t *cst = json_is_object(ps) ? json_object_get(ps, "const") : NULL;
        if (json_is_object(ps)) json_object_foreach((json_t *)ps, kk, x) {
                if (annotation(kk) || !strcmp(kk, "enum") || !strcmp(kk, "const")) continue;
                err_set(&e, SMELT_ERR_UNSUPPORTED,
                        "'%s' cannot be enforced on a string "
                        "parameter in this model's tool-call format (Qwen3-Coder XML writes "
                        "strings as raw text)",
                        kk);
                return tool_fail(b, i, lbl, &e);
            }
        const json_t *type = json_is_object(ps) ? json_object_get(ps, "type") : NULL;
        if (json_is_array(type) && json_array_size(type) != 1) {
            err_set(&e, SMELT_ERR_UNSUPPORTED,
                    "a type list cannot be enforced in this model's "
                    "tool-call format (Qwen3-Coder XML)");
            return tool_fail(b, i, lbl, &e);
        }
        if (vals || cst) { /* raw alternatives, each a string */
            jw_str(expr, " (");
            size_t n = cst ? 1 : json_array_size(vals);
            for (size_t v = 0; v < n; v++) {
                const json_t *s = cst ? cst : json_array_get(vals, v);
                if (!json_is_string(s) || strstr(json_string_value(s), XML_PCLOSE)) {
                    err_set(&e, SMELT_ERR_UNSUPPORTED,
                            "enum and const values of a string "
                            "parameter must be strings without '</parameter>'");
                    return tool_fail(b, i, lbl, &e);
                }
                jw_str(expr, v ? " | " : " ");
                lit_n(expr, json_string_value(s), json_string_length(s));
            }
            jw_str(expr, " ) \"\\n</parameter>\\n\"");
            return true;
        }
        b->xml_until = true;
        jw_str(expr, " x-until \"\\n\"");
        return true;
    }
    /* JSON: the property's schema beside the tool's definitions */
    json_t *doc = json_deep_copy(ps);
    const char *defs[] = {"$defs", "definitions"};
    for (int d = 0; doc && d < 2; d++) {
        json_t *x = json_object_get(params, defs[d]);
        if (x && !json_object_get(doc, defs[d])) json_object_set(doc, defs[d], x);
    }
    char prefix[48];
    snprintf(prefix, sizeof prefix, "p%zu-%zu-", i, k);
    bool ok = doc ? add_schema(b->w, doc, prefix, &e)
                  : (err_set(&e, SMELT_ERR_NOMEM, "out of memory"), false);
    json_decref(doc);
    if (!ok) return tool_fail(b, i, lbl, &e);
    jw_printf(expr, " %sroot \"\\n</parameter>\\n\"", prefix);
    return true;
}

/* The qwen_xml parameters of tools[i] into expr: each property in the schema's order,
 * optional unless required; a tool that is not strict takes any parameters as raw text. */
static bool xml_params(struct tb *b, size_t i, const json_t *params, bool strict, struct jw *expr) {
    if (!strict) {
        b->xml_free = b->xml_until = true;
        jw_str(expr, " x-free");
        return true;
    }
    const json_t *props = params ? json_object_get(params, "properties") : NULL;
    const json_t *req = params ? json_object_get(params, "required") : NULL;
    if (params && props && !json_is_object(props)) {
        struct err e;
        err_set(&e, SMELT_ERR_INVALID, "'properties' must be an object");
        return tool_fail(b, i, "parameters", &e);
    }
    const char *key;
    const json_t *ps;
    size_t k = 0;
    json_object_foreach((json_t *)props, key, ps) {
        bool need = false;
        size_t r;
        const json_t *x;
        json_array_foreach(req, r, x) if (json_is_string(x) && !strcmp(json_string_value(x), key))
            need = true;
        if (strpbrk(key, ">\n") || !*key) {
            struct err e;
            err_set(&e, SMELT_ERR_UNSUPPORTED,
                    "the parameter name '%.40s' cannot be written in "
                    "this model's tool-call format (Qwen3-Coder XML)",
                    key);
            return tool_fail(b, i, "parameters", &e);
        }
        jw_str(expr, " (");
        if (!xml_param(b, i, k++, key, ps, params, expr)) return false;
        jw_str(expr, need ? " )" : " )?");
    }
    return true;
}

/* Optional space at a call wrapper's JSON punctuation. */
#define SP " t-s "

/* t-fn: one alternative per tool the reply may call (the named one, or all). */
static bool tool_fns(struct tb *b, struct jw *fn) {
    const struct oai_request *rq = b->rq;
    size_t i;
    const json_t *t;
    int n = 0;
    jw_str(fn, "t-fn ::=");
    json_array_foreach(rq->tools, i, t) {
        const json_t *params;
        bool strict;
        const char *name = tool_of(t, &params, &strict);
        if (!name || (rq->tool_choice == OAI_TOOLS_NAMED && strcmp(name, rq->tool_name))) continue;
        char args[48];
        if (b->syntax != OUTP_QWEN_XML && !args_rule(b, i, params, strict, args, sizeof args))
            return false;
        jw_str(fn, n++ ? " |\n    " : " ");
        struct jw q = {0}; /* the name as a JSON string */
        jw_json_str(&q, name, strlen(name));
        switch (b->syntax) {
        case OUTP_QWEN_XML: {
            if (strpbrk(name, " <>\n")) {
                struct err e;
                err_set(&e, SMELT_ERR_UNSUPPORTED,
                        "the name '%.64s' cannot be written in this "
                        "model's tool-call format (Qwen3-Coder XML)",
                        name);
                jw_free(&q);
                return tool_fail(b, i, "name", &e);
            }
            struct jw head = {0};
            jw_str(&head, name);
            jw_str(&head, ">\n");
            lit_n(fn, head.p, head.n);
            jw_free(&head);
            if (!xml_params(b, i, params, strict, fn)) {
                jw_free(&q);
                return false;
            }
            break;
        }
        case OUTP_MISTRAL:
            if (b->mistral_args) {
                struct jw head = {0};
                jw_str(&head, name);
                jw_str(&head, "[ARGS]");
                lit_n(fn, head.p, head.n);
                jw_free(&head);
                jw_printf(fn, " %s", args);
                break;
            }
            __attribute__((fallthrough)); /* [{"name": ..., "arguments": ...}] */
        case OUTP_HERMES:
        case OUTP_LLAMA3:
            lit_n(fn, q.p, q.n);
            jw_str(fn, SP "\",\"" SP);
            lit(fn, b->syntax == OUTP_LLAMA3 ? "\"parameters\"" : "\"arguments\"");
            jw_printf(fn, SP "\":\"" SP "%s", args);
            break;
        case OUTP_HARMONY:
            lit(fn, name);
            jw_printf(fn, " \" <|constrain|>json<|message|>\" %s", args);
            break;
        default:
            break;
        }
        jw_free(&q);
    }
    jw_str(fn, "\n");
    if (!n) /* tool_choice named a function parse_tool_choice found: unreachable */
        return oai_bad(b->e, "tool_choice", "no tool to call");
    return true;
}

/* The calls grammar (t-root) in the template's syntax. */
static bool tool_calls(struct tb *b) {
    const struct oai_request *rq = b->rq;
    struct jw fn = {0};
    if (!tool_fns(b, &fn)) {
        jw_free(&fn);
        return false;
    }
    struct jw *w = b->w;
    jw_raw(w, fn.p, fn.n);
    jw_free(&fn);
    bool many = rq->parallel_tool_calls && rq->tool_choice != OAI_TOOLS_NAMED;
    jw_str(w, "t-s ::= \" \"?\n");
    switch (b->syntax) {
    case OUTP_HERMES:
        jw_str(w, "t-call ::= \"<tool_call>\" \"\\n\"? \"{\"" SP "\"\\\"name\\\"\"" SP "\":\"" SP
                  "t-fn" SP "\"}\" \"\\n\"? \"</tool_call>\"\n");
        jw_str(w, many ? "t-root ::= t-call ( \"\\n\"{0,2} t-call )*\n" : "t-root ::= t-call\n");
        break;
    case OUTP_QWEN_XML:
        jw_str(w, "t-call ::= \"<tool_call>\\n<function=\" t-fn \"</function>\\n</tool_call>\"\n");
        jw_str(w, many ? "t-root ::= t-call ( \"\\n\"{0,2} t-call )*\n" : "t-root ::= t-call\n");
        break;
    case OUTP_LLAMA3:
        jw_str(w, "t-call ::= \"{\"" SP "\"\\\"name\\\"\"" SP "\":\"" SP "t-fn" SP "\"}\"\n");
        jw_str(w, many ? "t-root ::= t-call (" SP "\";\"" SP "t-call )*\n" : "t-root ::= t-call\n");
        break;
    case OUTP_MISTRAL:
        if (b->mistral_args) {
            jw_str(w, "t-call ::= \"[TOOL_CALLS]\" t-fn\n");
            jw_str(w, many ? "t-root ::= t-call+\n" : "t-root ::= t-call\n");
        } else {
            jw_str(w, "t-call ::= \"{\"" SP "\"\\\"name\\\"\"" SP "\":\"" SP "t-fn" SP "\"}\"\n");
            jw_str(w, many ? "t-root ::= \"[TOOL_CALLS]\" \"[\"" SP "t-call (" SP "\",\"" SP
                             "t-call )*" SP "\"]\"\n"
                           : "t-root ::= \"[TOOL_CALLS]\" \"[\"" SP "t-call" SP "\"]\"\n");
        }
        break;
    case OUTP_HARMONY: /* one call: <|call|> (end of generation) ends the reply */
        jw_str(w, "t-root ::= \"<|channel|>commentary to=functions.\" t-fn\n");
        break;
    default:
        return oai_bad(b->e, "tools", "this model's tool-call syntax cannot be constrained");
    }
    return true;
}

/* The marker a lazy calls grammar starts at (its trigger), in each syntax. */
static const char *call_marker(enum outp_syntax s) {
    switch (s) {
    case OUTP_HERMES:
    case OUTP_QWEN_XML:
        return "<tool_call>";
    case OUTP_LLAMA3:
        return "{";
    case OUTP_MISTRAL:
        return "[TOOL_CALLS]";
    case OUTP_HARMONY:
        return "<|channel|>commentary to=functions.";
    default:
        return NULL;
    }
}

/* ---- the request's grammar ---- */

void sgram_free(struct sgram *g) {
    jw_free(&g->text);
    memset(g, 0, sizeof *g);
}

bool sgram_build(const struct oai_request *rq, const struct chat_prompt *cp, struct sgram *g,
                 struct oai_err *e) {
    memset(g, 0, sizeof *g);
    enum outp_syntax syn = cp ? cp->syntax : OUTP_TOOLS_NONE;
    bool tools = cp && rq->tools && rq->tool_choice != OAI_TOOLS_NONE;
    bool forced =
        tools && (rq->tool_choice == OAI_TOOLS_REQUIRED || rq->tool_choice == OAI_TOOLS_NAMED);
    bool calls = forced || (tools && (rq->gkind || rq->tools_strict));
    bool think = cp && cp->reasoning && syn != OUTP_HARMONY;
    bool harmony = cp && syn == OUTP_HARMONY;
    if (!calls && !rq->gkind) return true;
    g->param = calls ? "tools" : rq->gparam;
    if (calls && !outp_syntax_known(cp->tmpl_src))
        return oai_fail(e, 400, "invalid_request_error", "tools", "tool_choice_unsupported",
                        "tool calls cannot be constrained for this model (strict tools, a "
                        "response format beside tools, or a forced tool_choice): its chat "
                        "template's tool-call syntax is not one smelt knows (Hermes/Qwen "
                        "<tool_call>, Qwen3-Coder <function=...>, Mistral [TOOL_CALLS], Llama 3 "
                        "JSON, gpt-oss harmony)");
    if (!calls && !think && !harmony) { /* the request's own grammar, as it is */
        g->kind = rq->gkind;
        jw_raw(&g->text, rq->gtext, rq->glen);
        if (g->text.oom) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return true;
    }
    g->kind = GRAM_GBNF;
    g->composed = true;
    struct jw *w = &g->text;
    struct err ge;
    err_clear(&ge);
    if (rq->gkind && !forced && !add_piece(w, rq->gkind, rq->gtext, rq->glen, "j-", &ge)) {
        if (ge.code == SMELT_ERR_NOMEM)
            return oai_fail(e, 500, "server_error", NULL, NULL, "%s", ge.msg);
        return oai_bad(e, rq->gparam, "%s: %s", rq->gparam, ge.msg);
    }
    struct tb b = {.w = w, .rq = rq, .syntax = syn, .e = e};
    b.mistral_args = syn == OUTP_MISTRAL && cp->tmpl_src && strstr(cp->tmpl_src, "[ARGS]");
    if (calls && !tool_calls(&b)) return false;
    if (b.any_object && !add_piece(w, GRAM_JSON_OBJECT, NULL, 0, "o-", &ge))
        return oai_fail(e, 500, "server_error", NULL, NULL, "%s", ge.msg);
    if (b.xml_until) until_rule(w, "x-until", XML_PCLOSE);
    if (b.xml_free)
        jw_str(w, "x-free ::= ( \"<parameter=\" [^>\\n]{1,256} \">\\n\" x-until \"\\n\" )*\n");
    /* the reply: calls (forced, or lazy), or the response and maybe calls */
    const char *body = !calls ? "j-root" : forced || !rq->gkind ? "t-root" : "( j-root | t-root )";
    if (calls && !forced && !rq->gkind) { /* lazy: from the call marker on, nothing before */
        g->trigger = call_marker(syn);
        jw_str(w, "root ::= t-root\n");
    } else if (forced) { /* after the prefill (which closed a think block the prompt opened) */
        g->prefill = true;
        jw_str(w, cp->in_reasoning ? "root ::= \"</think>\\n\\n\" t-root\n" : "root ::= t-root\n");
    } else if (harmony) { /* analysis messages, then the final message (or a call) */
        until_rule(w, "h-until", "<|end|>");
        jw_str(
            w,
            "h-analysis ::= \"<|channel|>analysis<|message|>\" h-until \"<|start|>assistant\"\n");
        jw_printf(w, "root ::= h-analysis* ( \"<|channel|>final<|message|>\" j-root%s )\n",
                  calls ? " | t-root" : "");
    } else if (think) { /* reasoning first: the rest of the prompt's think block, or one */
        until_rule(w, "r-until", REASON_CLOSE);
        jw_printf(w, "root ::= %s[ \\n]{0,4} %s\n",
                  cp->in_reasoning ? "r-until " : "( \"<think>\" r-until )? ", body);
    } else {
        jw_printf(w, "root ::= %s\n", body);
    }
    if (w->oom) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

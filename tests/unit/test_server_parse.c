/* Server parsing: chat output parsing (reasoning, tool calls in the hermes, mistral and
 * llama3 syntaxes) fed whole and byte by byte (a stream must decide exactly what the
 * whole text decides), OpenAI request validation (each bad field is named), and the JSON
 * string writer against jansson's parser. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/jw.h"
#include "server/oai.h"
#include "server/outp.h"
#include "t.h"

struct parsed {
    struct jw content, reasoning;
    char names[8][64];
    char args[8][256];
    int n_calls;
};

static void take(struct parsed *r, struct outp_delta *d) {
    jw_raw(&r->content, d->content.p ? d->content.p : "", d->content.n);
    jw_raw(&r->reasoning, d->reasoning.p ? d->reasoning.p : "", d->reasoning.n);
    for (int i = 0; i < d->n_calls && r->n_calls < 8; i++, r->n_calls++) {
        snprintf(r->names[r->n_calls], 64, "%s", d->calls[i].name);
        snprintf(r->args[r->n_calls], 256, "%s", d->calls[i].arguments);
    }
    outp_delta_clear(d);
}

/* Parses text with chunks of `step` bytes (0: all at once). */
static void run(enum outp_syntax syn, bool reasoning, bool in_reasoning, const char *text,
                size_t step, struct parsed *r) {
    memset(r, 0, sizeof *r);
    jw_raw(&r->content, "", 0);
    jw_raw(&r->reasoning, "", 0);
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, syn, reasoning, in_reasoning);
    size_t n = strlen(text);
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step) {
        outp_push(&p, text + i, i + step <= n ? step : n - i, &d);
        take(r, &d);
    }
    outp_finish(&p, &d);
    take(r, &d);
    T_CHECK(!p.bad);
    outp_free(&p);
    outp_delta_free(&d);
}

static void parsed_free(struct parsed *r) {
    jw_free(&r->content);
    jw_free(&r->reasoning);
}

struct ocase {
    enum outp_syntax syn;
    bool reasoning, in_reasoning;
    const char *text;
    const char *content, *reasoning_out;
    int n_calls;
    const char *name0, *args0, *name1;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const struct ocase ocases[] = {
    {OUTP_TOOLS_NONE, false, false, "plain <tool_call> text", "plain <tool_call> text", "", 0},
    {OUTP_HERMES, false, false, "no call here", "no call here", "", 0},
    {OUTP_HERMES, false, false,
     "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>",
     "Let me look.", "", 1, "get_weather", "{\"city\": \"Paris\"}"},
    {OUTP_HERMES, false, false,
     "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", "
     "\"arguments\": {\"x\": 1}}</tool_call>",
     "", "", 2, "a", "{}", "b"},
    /* a bare JSON call (small models drop the tags) */
    {OUTP_HERMES, false, false, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
     "", "", 1, "get_weather", "{\"city\": \"Paris\"}"},
    /* JSON that is not a call stays content */
    {OUTP_HERMES, false, false, "{\"answer\": 42}", "{\"answer\": 42}", "", 0},
    /* a broken call is given back as text */
    {OUTP_HERMES, false, false, "<tool_call>{broken</tool_call> after",
     "<tool_call>{broken</tool_call>after", "", 0},
    /* unfinished at the end: parsed if it is complete JSON */
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}", "",
     "", 1, "f", "{\"q\": \"x\"}"},
    {OUTP_MISTRAL, false, false,
     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": "
     "{}}]",
     "", "", 2, "f", "{\"a\": 1}", "g"},
    {OUTP_MISTRAL, false, false, "Sure.[TOOL_CALLS]lookup[ARGS]{\"id\": 7}", "Sure.", "", 1,
     "lookup", "{\"id\": 7}"},
    {OUTP_LLAMA3, false, false, "{\"name\": \"f\", \"parameters\": {\"x\": \"y\"}}", "", "", 1, "f",
     "{\"x\": \"y\"}"},
    {OUTP_LLAMA3, false, false, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": "
     "\"g\", \"parameters\": {}}", "", "", 2, "f", "{}", "g"},
    {OUTP_LLAMA3, false, false, "The answer is 4.", "The answer is 4.", "", 0},
    /* reasoning */
    {OUTP_TOOLS_NONE, true, false, "<think>hmm, 2+2</think>\n\nIt is 4.", "It is 4.",
     "hmm, 2+2", 0},
    {OUTP_TOOLS_NONE, true, true, "still thinking</think>Done.", "Done.", "still thinking", 0},
    {OUTP_TOOLS_NONE, true, false, "No thoughts. <think> is a tag.", "No thoughts. <think> is a tag.",
     "", 0},
    {OUTP_TOOLS_NONE, true, true, "cut off mid-thought", "", "cut off mid-thought", 0},
    {OUTP_HERMES, true, false,
     "<think>need weather</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>",
     "", "need weather", 1, "w", "{}"},
};
#pragma GCC diagnostic pop

static void test_outp(void) {
    for (size_t i = 0; i < sizeof ocases / sizeof ocases[0]; i++) {
        const struct ocase *c = &ocases[i];
        for (size_t step = 0; step <= 3; step++) {
            struct parsed r;
            run(c->syn, c->reasoning, c->in_reasoning, c->text, step, &r);
            T_CHECKF(!strcmp(r.content.p, c->content), "case %zu step %zu: content '%s' want '%s'",
                     i, step, r.content.p, c->content);
            T_CHECKF(!strcmp(r.reasoning.p, c->reasoning_out),
                     "case %zu step %zu: reasoning '%s' want '%s'", i, step, r.reasoning.p,
                     c->reasoning_out);
            T_CHECKF(r.n_calls == c->n_calls, "case %zu step %zu: %d calls, want %d", i, step,
                     r.n_calls, c->n_calls);
            if (c->n_calls > 0 && r.n_calls > 0) {
                T_EQ_STR(r.names[0], c->name0);
                /* compare arguments as JSON values */
                json_t *a = json_loads(r.args[0], 0, NULL), *b = json_loads(c->args0, 0, NULL);
                T_CHECKF(a && b && json_equal(a, b), "case %zu: args %s want %s", i, r.args[0],
                         c->args0);
                json_decref(a);
                json_decref(b);
            }
            if (c->n_calls > 1 && r.n_calls > 1) T_EQ_STR(r.names[1], c->name1);
            parsed_free(&r);
        }
    }
}

static void test_syntax_detect(void) {
    T_EQ_INT(outp_syntax_of("{% if tools %}<tool_call>{% endif %}"), OUTP_HERMES);
    T_EQ_INT(outp_syntax_of("[AVAILABLE_TOOLS] [TOOL_CALLS]"), OUTP_MISTRAL);
    T_EQ_INT(outp_syntax_of("<|start_header_id|>ipython ... tools <|python_tag|>"), OUTP_LLAMA3);
    T_EQ_INT(outp_syntax_of(NULL), OUTP_HERMES);
    T_CHECK(outp_template_reasons("{{ '<think>\\n' }}"));
    T_CHECK(!outp_template_reasons("plain"));
}

/* ---- request validation ---- */

struct rcase {
    enum oai_kind kind;
    const char *body;
    int status;
    const char *param; /* NULL: no param check */
};

static const struct rcase rcases[] = {
    {OAI_COMPLETION, "{\"prompt\": \"hi\"}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": [1, 2, 3], \"max_tokens\": 5}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": [[1, 2], \"text\"], \"n\": 2}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 3, \"echo\": true}", 0, NULL},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"user\": \"u1\", "
               "\"metadata\": {\"a\": \"b\"}, \"store\": false}", 0, NULL},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", "
               "\"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}]}", 0, NULL},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
               "{\"type\": \"text\"}}", 0, NULL},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": null, "
               "\"seed\": null, \"max_tokens\": null}", 0, NULL},
    /* errors */
    {OAI_COMPLETION, "{\"prompt\": \"hi\"", 400, ""},
    {OAI_COMPLETION, "[1, 2]", 400, ""},
    {OAI_COMPLETION, "{}", 400, "prompt"},
    {OAI_COMPLETION, "{\"prompt\": []}", 400, "prompt"},
    {OAI_COMPLETION, "{\"prompt\": [5000000]}", 400, "prompt"},
    {OAI_COMPLETION, "{\"prompt\": \"a\", \"prompt\": \"b\"}", 400, ""},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "temperature"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"temperature\": 3}", 400, "temperature"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"top_p\": 1.5}", 400, "top_p"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"n\": 0}", 400, "n"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"n\": 1.5}", 400, "n"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"max_tokens\": -1}", 400, "max_tokens"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"presence_penalty\": 5}", 400, "presence_penalty"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": 200}}", 400, "logit_bias"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"stop\": 5}", 400, "stop"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"frobnicate\": 1}", 400, "frobnicate"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"suffix\": \"x\"}", 400, "suffix"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": true}}", 400,
     "stream_options"},
    {OAI_CHAT, "{\"messages\": []}", 400, "messages"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400, "messages[0]"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0]"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
               "\"image_url\": {\"url\": \"x\"}}]}]}", 400, "messages[0].content"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
               "{\"type\": \"json_schema\", \"json_schema\": {}}}", 400, "response_format"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
               "\"required\"}", 400, "tool_choice"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
               "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
               "\"function\", \"function\": {\"name\": \"g\"}}}", 400, "tool_choice"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}",
     400, "top_logprobs"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"audio\": {}}", 400,
     "audio"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"y\"}", 400,
     "prompt"},
};

static void test_requests(void) {
    for (size_t i = 0; i < sizeof rcases / sizeof rcases[0]; i++) {
        const struct rcase *c = &rcases[i];
        struct oai_request r;
        struct oai_err e = {0};
        bool ok = oai_parse(c->body, strlen(c->body), c->kind, 1000, NULL, &r, &e);
        if (c->status == 0) {
            T_CHECKF(ok, "case %zu: %s", i, e.message);
        } else {
            T_CHECKF(!ok && e.status == c->status, "case %zu: ok=%d status %d", i, ok, e.status);
            if (c->param) T_CHECKF(!strcmp(e.param, c->param), "case %zu: param '%s' want '%s' (%s)",
                                   i, e.param, c->param, e.message);
            char *j = oai_err_json(&e);
            json_t *root = json_loads(j, 0, NULL);
            json_t *err = json_object_get(root, "error");
            T_CHECK(json_is_string(json_object_get(err, "message")));
            T_CHECK(json_is_string(json_object_get(err, "type")));
            T_CHECK(json_object_get(err, "param") && json_object_get(err, "code"));
            json_decref(root);
            free(j);
        }
        oai_request_free(&r);
    }
    /* normalization for templates */
    const char *b = "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", "
                    "\"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": "
                    "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": "
                    "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": "
                    "1}\"}}]}], \"seed\": 7, \"n\": 3, \"stop\": [\"a\", \"\", \"b\"]}";
    struct oai_request r;
    struct oai_err e;
    T_CHECK(oai_parse(b, strlen(b), OAI_CHAT, 1000, NULL, &r, &e));
    json_t *m0 = json_array_get(r.messages, 0);
    T_EQ_STR(json_string_value(json_object_get(m0, "role")), "system");
    T_EQ_STR(json_string_value(json_object_get(m0, "content")), "a\nb");
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(
                                                       json_array_get(r.messages, 1), "tool_calls"),
                                                                   0),
                                                   "function"),
                                   "arguments");
    T_CHECK(json_is_object(args));
    T_CHECK(r.has_seed && r.ep.sp.seed == 7);
    T_EQ_INT(r.n, 3);
    T_EQ_INT(r.ep.n_stop, 2); /* the empty stop string is dropped */
    oai_request_free(&r);
}

/* ---- the JSON string writer: jansson must read back exactly the (repaired) text ---- */

static void test_jw(void) {
    const char *cases[] = {"plain", "quote \" backslash \\ slash /", "ctl \x01\x1f\n\r\t\b\f",
                           "utf8 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", ""};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct jw w = {0};
        jw_json_str(&w, cases[i], strlen(cases[i]));
        json_t *j = json_loadb(w.p, w.n, JSON_DECODE_ANY, NULL);
        T_CHECK(json_is_string(j) && !strcmp(json_string_value(j), cases[i]));
        json_decref(j);
        jw_free(&w);
    }
    /* invalid UTF-8 becomes U+FFFD; NUL is escaped */
    struct jw w = {0};
    jw_json_str(&w, "a\xff" "b\0c", 5);
    json_t *j = json_loadb(w.p, w.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    T_CHECK(json_is_string(j) && json_string_length(j) == 7 &&
            !memcmp(json_string_value(j), "a\xef\xbf\xbd" "b\0c", 7));
    json_decref(j);
    jw_free(&w);
    jw_float(&w, -INFINITY);
    jw_raw(&w, " ", 1);
    jw_float(&w, 2.0);
    T_EQ_STR(w.p, "-9999.0 2.0");
    jw_free(&w);
}

int main(void) {
    T_RUN(test_outp);
    T_RUN(test_syntax_detect);
    T_RUN(test_requests);
    T_RUN(test_jw);
    return t_done();
}

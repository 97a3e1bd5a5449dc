/* Server parsing: chat output parsing (reasoning, tool calls in the hermes, mistral, llama3
 * qwen_xml and harmony syntaxes) fed whole and byte by byte (a stream must decide exactly what the
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
#include "util/utf8.h"

struct parsed {
    struct jw content, reasoning;
    char names[8][64];
    struct jw args[8];
    int n_calls;
    int n_pieces;     /* call pieces seen */
    bool shape_ok;    /* each call's first piece has its name and "" arguments, in order */
};

/* Collects a delta's call pieces the way an OpenAI client sums stream deltas by index. */
static void take(struct parsed *r, struct outp_delta *d) {
    jw_raw(&r->content, d->content.p ? d->content.p : "", d->content.n);
    jw_raw(&r->reasoning, d->reasoning.p ? d->reasoning.p : "", d->reasoning.n);
    for (int i = 0; i < d->n_calls; i++) {
        const struct outp_call *k = &d->calls[i];
        r->n_pieces++;
        if (k->name) {
            if (k->index != r->n_calls || k->args.n != 0 || r->n_calls >= 8) {
                r->shape_ok = false;
                continue;
            }
            snprintf(r->names[r->n_calls], 64, "%s", k->name);
            jw_raw(&r->args[r->n_calls], "", 0);
            r->n_calls++;
        } else {
            if (k->index != r->n_calls - 1 || k->index < 0) {
                r->shape_ok = false;
                continue;
            }
            jw_raw(&r->args[k->index], k->args.p, k->args.n);
        }
    }
    outp_delta_clear(d);
}

/* Parses text with chunks of `step` bytes (0: all at once), after prefill (may be NULL),
 * with the request's tools (may be NULL). */
static void run_tools(enum outp_syntax syn, bool reasoning, bool in_reasoning, int max_calls,
                      const char *prefill, const json_t *tools, const char *text, size_t step,
                      struct parsed *r) {
    memset(r, 0, sizeof *r);
    r->shape_ok = true;
    jw_raw(&r->content, "", 0);
    jw_raw(&r->reasoning, "", 0);
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, syn, reasoning, in_reasoning);
    p.max_calls = max_calls;
    p.tools = tools;
    if (prefill) outp_prefill(&p, prefill, strlen(prefill), &d);
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

static void run_pre(enum outp_syntax syn, bool reasoning, bool in_reasoning, int max_calls,
                    const char *prefill, const char *text, size_t step, struct parsed *r) {
    run_tools(syn, reasoning, in_reasoning, max_calls, prefill, NULL, text, step, r);
}

static void parsed_free(struct parsed *r) {
    jw_free(&r->content);
    jw_free(&r->reasoning);
    for (int i = 0; i < 8; i++) jw_free(&r->args[i]);
}

static const char *arg(const struct parsed *r, int i) {
    return r->args[i].p ? r->args[i].p : "";
}

/* The checks of every case table: content, reasoning, and the calls (names and arguments
 * exactly as expected, however the text was cut; pieces in order). */
static void expect(const struct parsed *r, size_t i, size_t step, const char *content,
                   const char *reasoning, int n_calls, const char *name0, const char *args0,
                   const char *name1, const char *args1) {
    T_CHECKF(!strcmp(r->content.p, content), "case %zu step %zu: content '%s' want '%s'", i,
             step, r->content.p, content);
    T_CHECKF(!strcmp(r->reasoning.p, reasoning), "case %zu step %zu: reasoning '%s' want '%s'",
             i, step, r->reasoning.p, reasoning);
    T_CHECKF(r->n_calls == n_calls, "case %zu step %zu: %d calls, want %d", i, step, r->n_calls,
             n_calls);
    T_CHECKF(r->shape_ok, "case %zu step %zu: pieces out of order", i, step);
    if (n_calls > 0 && r->n_calls > 0) {
        T_EQ_STR(r->names[0], name0);
        T_CHECKF(!strcmp(arg(r, 0), args0), "case %zu step %zu: args '%s' want '%s'", i, step,
                 arg(r, 0), args0);
    }
    if (n_calls > 1 && r->n_calls > 1) {
        T_EQ_STR(r->names[1], name1);
        T_CHECKF(!strcmp(arg(r, 1), args1), "case %zu step %zu: args1 '%s' want '%s'", i, step,
                 arg(r, 1), args1);
    }
}

struct ocase {
    enum outp_syntax syn;
    bool reasoning, in_reasoning;
    const char *text;
    const char *content, *reasoning_out;
    int n_calls;
    const char *name0, *args0, *name1, *args1;
    const char *prefill;
    int max_calls;
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
     "", "", 2, "a", "{}", "b", "{\"x\": 1}"},
    /* a bare JSON call (small models drop the tags) */
    {OUTP_HERMES, false, false, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
     "", "", 1, "get_weather", "{\"city\": \"Paris\"}"},
    /* JSON that is not a call stays content */
    {OUTP_HERMES, false, false, "{\"answer\": 42}", "{\"answer\": 42}", "", 0},
    {OUTP_HERMES, false, false, "{\"name\": \"x\"} and more", "{\"name\": \"x\"} and more", "", 0},
    /* a broken call is given back as text, verbatim */
    {OUTP_HERMES, false, false, "<tool_call>{broken</tool_call> after",
     "<tool_call>{broken</tool_call> after", "", 0},
    /* the whitespace before a marker that opens no call is content too */
    {OUTP_HERMES, false, false, "Use the <tool_call> tag.\n\n<tool_call> x",
     "Use the <tool_call> tag.\n\n<tool_call> x", "", 0},
    {OUTP_HERMES, false, false, "<tool_call>{\"nom\": \"f\"}</tool_call>",
     "<tool_call>{\"nom\": \"f\"}</tool_call>", "", 0},
    /* unfinished at the end: the call keeps what it got */
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}", "",
     "", 1, "f", "{\"q\": \"x\"}"},
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"x", "",
     "", 1, "f", "{\"q\": \"x"},
    /* unfinished before the name: content */
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f", "<tool_call>{\"name\": \"f", "", 0},
    /* members in any order, other members skipped, string and null arguments */
    {OUTP_HERMES, false, false,
     "<tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"id\": \"x\", \"name\": \"f\"}"
     "</tool_call>",
     "", "", 1, "f", "{\"a\": [1, {\"b\": \"}\"}]}"},
    {OUTP_HERMES, false, false,
     "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"\\\\u00e9\\\"}\"}</tool_call>",
     "", "", 1, "f", "{\"a\": \"\\u00e9\"}"},
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\", \"arguments\": null}</tool_call>", "",
     "", 1, "f", "{}"},
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\"}</tool_call>Done.", "Done.", "", 1,
     "f", "{}"},
    /* an extra brace, a list inside one tag, text after the call */
    {OUTP_HERMES, false, false,
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}}\n</tool_call>\nok", "ok", "", 1,
     "f", "{\"x\": 1}"},
    {OUTP_HERMES, false, false,
     "<tool_call>[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": "
     "{\"y\": \"\\u00e9\xc3\xa9\"}}]</tool_call>",
     "", "", 2, "f", "{}", "g", "{\"y\": \"\\u00e9\xc3\xa9\"}"},
    /* the close tag inside a committed call ends it */
    {OUTP_HERMES, false, false, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1</tool_call>t",
     "t", "", 1, "f", "{\"x\": 1"},
    /* a second <tool_call> without the first's close tag */
    {OUTP_HERMES, false, false,
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}\n<tool_call>{\"name\": \"g\", \"arguments\": "
     "{}}</tool_call>",
     "", "", 2, "f", "{}", "g", "{}"},
    {OUTP_MISTRAL, false, false,
     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": "
     "{}}]",
     "", "", 2, "f", "{\"a\": 1}", "g", "{}"},
    {OUTP_MISTRAL, false, false, "Sure.[TOOL_CALLS]lookup[ARGS]{\"id\": 7}", "Sure.", "", 1,
     "lookup", "{\"id\": 7}"},
    {OUTP_MISTRAL, false, false,
     "[TOOL_CALLS]a[ARGS]{\"x\": \"]\"}[TOOL_CALLS]b[CALL_ID]abc123[ARGS]{}", "", "", 2, "a",
     "{\"x\": \"]\"}", "b", "{}"},
    {OUTP_MISTRAL, false, false, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", "", 0},
    /* "[TOOL_CALLS]" right after the marker is no list (found by fuzz_json_request: cut
     * after "[" it used to open one) */
    {OUTP_MISTRAL, false, false, "[TOOL_CALLS][TOOL_CALLS]f[ARGS]{\"x\": 2}", "[TOOL_CALLS]", "",
     1, "f", "{\"x\": 2}"},
    {OUTP_LLAMA3, false, false, "{\"name\": \"f\", \"parameters\": {\"x\": \"y\"}}", "", "", 1, "f",
     "{\"x\": \"y\"}"},
    {OUTP_LLAMA3, false, false, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": "
     "\"g\", \"parameters\": {}}", "", "", 2, "f", "{}", "g", "{}"},
    {OUTP_LLAMA3, false, false, "The answer is 4.", "The answer is 4.", "", 0},
    {OUTP_LLAMA3, false, false, "{\"answer\": 4}", "{\"answer\": 4}", "", 0},
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
    /* forced calls: the prefill opens the call; the model writes the rest */
    {OUTP_HERMES, false, false, "get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", "", 1, "get_weather", "{\"city\": \"Paris\"}", NULL, NULL,
     "<tool_call>\n{\"name\": \""},
    {OUTP_HERMES, false, false, "{\"city\": \"Paris\"}}\n</tool_call>", "", "", 1, "get_weather",
     "{\"city\": \"Paris\"}", NULL, NULL, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "},
    /* a forced call that never gets a name: only the model's text is content */
    {OUTP_HERMES, false, false, "I cannot", "I cannot", "", 0, NULL, NULL, NULL, NULL,
     "<tool_call>\n{\"name\": \""},
    {OUTP_HERMES, true, true, "{}}</tool_call>", "", "", 1, "f", "{}", NULL, NULL,
     "\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": "},
    {OUTP_MISTRAL, false, false, "{\"q\": 1}}]", "", "", 1, "f", "{\"q\": 1}", NULL, NULL,
     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": "},
    {OUTP_MISTRAL, false, false, "{\"q\": 1}", "", "", 1, "f", "{\"q\": 1}", NULL, NULL,
     "[TOOL_CALLS]f[ARGS]"},
    {OUTP_LLAMA3, false, false, "f\", \"parameters\": {\"q\": 1}}", "", "", 1, "f", "{\"q\": 1}",
     NULL, NULL, "{\"name\": \""},
    /* parallel_tool_calls false: one call, the rest dropped */
    {OUTP_HERMES, false, false,
     "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", "
     "\"arguments\": {}}</tool_call> text",
     "", "", 1, "a", "{}", NULL, NULL, NULL, 1},
    {OUTP_MISTRAL, false, false,
     "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": "
     "{}}]",
     "", "", 1, "f", "{\"a\": 1}", NULL, NULL, NULL, 1},
};
#pragma GCC diagnostic pop

static void test_outp(void) {
    for (size_t i = 0; i < sizeof ocases / sizeof ocases[0]; i++) {
        const struct ocase *c = &ocases[i];
        for (size_t step = 0; step <= 5; step++) {
            struct parsed r;
            run_pre(c->syn, c->reasoning, c->in_reasoning, c->max_calls, c->prefill, c->text,
                    step, &r);
            expect(&r, i, step, c->content, c->reasoning_out, c->n_calls, c->name0, c->args0,
                   c->name1, c->args1);
            parsed_free(&r);
        }
    }
}

/* Calls stream: fed byte by byte, a call's name comes out before its arguments are
 * complete, and its arguments arrive in several pieces, none splitting a UTF-8
 * character. */
static void test_outp_incremental(void) {
    const char *text = "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"S\xc3\xa3o "
                       "Paulo \xe6\x9d\xb1\"}}\n</tool_call>";
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, OUTP_HERMES, false, false);
    size_t n = strlen(text), named_at = 0, pieces = 0;
    struct jw args = {0};
    jw_raw(&args, "", 0);
    for (size_t i = 0; i < n; i++) {
        outp_push(&p, text + i, 1, &d);
        for (int k = 0; k < d.n_calls; k++) {
            if (d.calls[k].name) {
                T_EQ_STR(d.calls[k].name, "w");
                named_at = i;
            } else {
                pieces++;
                const uint8_t *a = (const uint8_t *)d.calls[k].args.p;
                size_t an = d.calls[k].args.n;
                T_CHECKF(utf8_validate(a, an) == an, "piece at byte %zu splits a character", i);
                jw_raw(&args, d.calls[k].args.p, an);
            }
        }
        T_CHECK(d.content.n == 0);
        outp_delta_clear(&d);
    }
    outp_finish(&p, &d);
    T_CHECK(d.n_calls == 0 && d.content.n == 0);
    T_CHECK(named_at > 0 && named_at < (size_t)(strstr(text, "arguments") - text));
    T_CHECKF(pieces > 10, "%zu pieces", pieces);
    T_EQ_STR(args.p, "{\"city\": \"S\xc3\xa3o Paulo \xe6\x9d\xb1\"}");
    jw_free(&args);
    outp_delta_free(&d);
    outp_free(&p);
}

/* ---- qwen_xml (Qwen3-Coder's <function=...> tags) ---- */

/* The request's tools of the qwen_xml cases: get_weather(city: string, days: integer),
 * set(obj: object, list: array, flag: boolean, none: null, x: number, code: string,
 * maybe: [string, null], n: [integer, null], any: (no type)), get_time(tz: string). */
static const char XTOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"set\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"obj\": {\"type\": \"object\"}, \"list\": {\"type\": "
    "\"array\"}, \"flag\": {\"type\": \"boolean\"}, \"none\": {\"type\": \"null\"}, \"x\": "
    "{\"type\": \"number\"}, \"code\": {\"type\": \"string\"}, \"maybe\": {\"type\": "
    "[\"string\", \"null\"]}, \"n\": {\"type\": [\"integer\", \"null\"]}, \"any\": "
    "{\"description\": \"no type\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"tz\": {\"type\": \"string\"}}}}}]";

#define XW                                                                                         \
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"                 \
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
#define XT                                                                                         \
    "<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n"                        \
    "</function>\n</tool_call>"
#define HUGE64 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HUGE320 HUGE64 HUGE64 HUGE64 HUGE64 HUGE64

struct xcase {
    bool tools, reasoning;
    const char *text;
    const char *content, *reasoning_out;
    int n_calls;
    const char *name0, *args0, *name1, *args1;
    const char *prefill;
    int max_calls;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const struct xcase xcases[] = {
    /* one call after content; the schema types the parameters */
    {true, false, "Let me check.\n" XW, "Let me check.", "", 1, "get_weather",
     "{\"city\": \"Paris\", \"days\": 3}"},
    /* no tools (no schema): every value is a string */
    {false, false, XW, "", "", 1, "get_weather", "{\"city\": \"Paris\", \"days\": \"3\"}"},
    /* two calls after <think>, text after them */
    {true, true, "<think>two calls</think>\n\n" XW "\n" XT "\nDone.", "Done.", "two calls", 2,
     "get_weather", "{\"city\": \"Paris\", \"days\": 3}", "get_time", "{\"tz\": \"CET\"}"},
    /* two calls in one tag (a second <function=) */
    {true, false,
     "<tool_call>\n<function=get_time>\n</function>\n<function=get_time>\n<parameter=tz>\nUTC"
     "\n</parameter>\n</function>\n</tool_call>",
     "", "", 2, "get_time", "{}", "get_time", "{\"tz\": \"UTC\"}"},
    /* typed values: JSON as written, Python's True / None, not-JSON as a string; string
     * types (and no type) keep their text, one newline stripped on each side */
    {true, false,
     "<tool_call>\n<function=set>\n<parameter=obj>\n{\"a\": [1, \"</x>\"]}\n</parameter>\n"
     "<parameter=list>\n [1, 2] \n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n"
     "<parameter=none>\nNone\n</parameter>\n<parameter=x>\n-1.5e3\n</parameter>\n"
     "<parameter=n>\nthree\n</parameter>\n<parameter=maybe>\n42\n</parameter>\n"
     "<parameter=any>\n{\"k\": 1}\n</parameter>\n</function>\n</tool_call>",
     "", "", 1, "set",
     "{\"obj\": {\"a\": [1, \"</x>\"]}, \"list\": [1, 2], \"flag\": true, \"none\": null, "
     "\"x\": -1.5e3, \"n\": \"three\", \"maybe\": \"42\", \"any\": \"{\\\"k\\\": 1}\"}"},
    /* a string value: escaped; '<', tags that are not </parameter>, inner newlines kept */
    {true, false,
     "<tool_call>\n<function=set>\n<parameter=code>\n\nif a<b:\n\tprint(\"S\xc3\xa3o \\\\ "
     "\xe6\x9d\xb1\")</function></tool_call>\n\n</parameter>\n</function>\n</tool_call>",
     "", "", 1, "set",
     "{\"code\": \"\\nif a<b:\\n\\tprint(\\\"S\xc3\xa3o \\\\\\\\ \xe6\x9d\xb1\\\")</function>"
     "</tool_call>\\n\"}"},
    /* invalid UTF-8 in a value becomes U+FFFD; an empty value */
    {true, false,
     "<tool_call>\n<function=set>\n<parameter=code>\nx\xff\n</parameter>\n<parameter=x>\n\n"
     "</parameter>\n</function>\n</tool_call>",
     "", "", 1, "set", "{\"code\": \"x\xef\xbf\xbd\", \"x\": \"\"}"},
    /* a Hermes JSON call in the tag is read as hermes reads it */
    {true, false,
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n"
     "</tool_call>",
     "", "", 1, "get_time", "{\"tz\": \"CET\"}"},
    /* missing </function>; a missing </tool_call> before the next call */
    {true, false,
     "<tool_call>\n<function=get_time>\n<parameter=tz>\nA\n</parameter>\n</tool_call>"
     "<tool_call>\n<function=get_time>\n<parameter=tz>\nB\n</parameter>\n</function>\n" XT,
     "", "", 3, "get_time", "{\"tz\": \"A\"}", "get_time", "{\"tz\": \"B\"}"},
    /* cut off: a committed call keeps what it got, closed */
    {true, false, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "", "", 1,
     "get_weather", "{\"city\": \"Par\"}"},
    {true, false, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</para", "", "", 1,
     "get_weather", "{\"days\": 3}"},
    {true, false, "<tool_call>\n<function=get_weather>\n<parameter=da", "", "", 1, "get_weather",
     "{}"},
    {true, false, "<tool_call>\n<function=get_time>\n</function>\n</tool_", "", "", 1,
     "get_time", "{}"},
    /* not a call (before the name is out): given back as content, verbatim */
    {true, false, "<tool_call>\n<function=get_wea", "<tool_call>\n<function=get_wea", "", 0},
    {true, false, "<tool_call>\n<function=get weather\n<parameter=a>\n1\n</parameter>",
     "<tool_call>\n<function=get weather\n<parameter=a>\n1\n</parameter>", "", 0},
    {true, false, "<tool_call><function=not a name> ok", "<tool_call><function=not a name> ok", "",
     0},
    {true, false, "<tool_call>\n<function=>x</function></tool_call> ok",
     "<tool_call>\n<function=>x</function></tool_call> ok", "", 0},
    {true, false, "See <tool_call>", "See <tool_call>", "", 0},
    {true, false, "<tool_call>\n<funky>\n</tool_call>", "<tool_call>\n<funky>\n</tool_call>", "",
     0},
    {true, false, "<tool_call>\n<function=" HUGE320 ">\n</function>\n</tool_call>",
     "<tool_call>\n<function=" HUGE320 ">\n</function>\n</tool_call>", "", 0},
    /* a bad parameter key (too long, a newline, empty) drops that parameter only */
    {true, false,
     "<tool_call>\n<function=get_weather>\n<parameter=" HUGE320 ">\nx\n</parameter>\n"
     "<parameter=ci\nty>\ny\n</parameter>\n<parameter=>\nz\n</parameter>\n"
     "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
     "", "", 1, "get_weather", "{\"city\": \"Rome\"}"},
    /* stray text inside a call is dropped */
    {true, false,
     "<tool_call>\n<function=get_time> junk <b>\n<parameter=tz>\nX\n</parameter>"
     "</function></tool_call>",
     "", "", 1, "get_time", "{\"tz\": \"X\"}"},
    /* forced calls: named (the call is out before the model writes), required */
    {true, false, "<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>", "", "", 1,
     "get_time", "{\"tz\": \"CET\"}", NULL, NULL, "<tool_call>\n<function=get_time>\n", 1},
    {true, false, "get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>", "", "",
     1, "get_time", "{\"tz\": \"CET\"}", NULL, NULL, "<tool_call>\n<function=", 1},
    {true, false, "I cannot", "I cannot", "", 0, NULL, NULL, NULL, NULL,
     "<tool_call>\n<function=", 1},
    /* parallel_tool_calls false: the first call only */
    {true, false, XW "\n" XT " text", "", "", 1, "get_weather",
     "{\"city\": \"Paris\", \"days\": 3}", NULL, NULL, NULL, 1},
};
#pragma GCC diagnostic pop

static void test_outp_xml(void) {
    json_t *tools = json_loads(XTOOLS, 0, NULL);
    T_CHECK(json_is_array(tools));
    for (size_t i = 0; i < sizeof xcases / sizeof xcases[0]; i++) {
        const struct xcase *c = &xcases[i];
        for (size_t step = 0; step <= 5; step++) {
            struct parsed r;
            run_tools(OUTP_QWEN_XML, c->reasoning, false, c->max_calls, c->prefill,
                      c->tools ? tools : NULL, c->text, step, &r);
            expect(&r, i, step, c->content, c->reasoning_out, c->n_calls, c->name0, c->args0,
                   c->name1, c->args1);
            /* the arguments smelt writes are always one JSON object, even cut off */
            for (int k = 0; k < r.n_calls; k++) {
                json_t *j = json_loads(arg(&r, k), 0, NULL);
                T_CHECKF(json_is_object(j), "case %zu step %zu call %d: '%s' is not an object", i,
                         step, k, arg(&r, k));
                json_decref(j);
            }
            parsed_free(&r);
        }
    }
    json_decref(tools);
}

/* A string value streams as it arrives (not only at </parameter>), in pieces that never
 * split a UTF-8 character; a typed one comes whole at its end. */
static void test_outp_xml_incremental(void) {
    json_t *tools = json_loads(XTOOLS, 0, NULL);
    const char *text = "<tool_call>\n<function=set>\n<parameter=code>\nS\xc3\xa3o Paulo "
                       "\xe6\x9d\xb1\n\n</parameter>\n<parameter=x>\n12345\n</parameter>\n"
                       "</function>\n</tool_call>";
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, OUTP_QWEN_XML, false, false);
    p.tools = tools;
    size_t n = strlen(text), named_at = 0, pieces = 0, num_at = 0;
    struct jw args = {0};
    jw_raw(&args, "", 0);
    for (size_t i = 0; i < n; i++) {
        outp_push(&p, text + i, 1, &d);
        for (int k = 0; k < d.n_calls; k++) {
            if (d.calls[k].name) {
                T_EQ_STR(d.calls[k].name, "set");
                named_at = i;
            } else {
                pieces++;
                const uint8_t *a = (const uint8_t *)d.calls[k].args.p;
                size_t an = d.calls[k].args.n;
                T_CHECKF(utf8_validate(a, an) == an, "piece at byte %zu splits a character", i);
                jw_raw(&args, d.calls[k].args.p, an);
                if (memmem(a, an, "12345", 5)) num_at = i;
            }
        }
        T_CHECK(d.content.n == 0);
        outp_delta_clear(&d);
    }
    outp_finish(&p, &d);
    T_CHECK(d.n_calls == 0 && d.content.n == 0);
    T_CHECK(named_at == (size_t)(strstr(text, "set>") - text) + 3);
    T_CHECKF(pieces > 10, "%zu pieces", pieces);
    T_CHECK(num_at == (size_t)(strstr(text, "12345\n</parameter>") - text) + 17);
    T_EQ_STR(args.p, "{\"code\": \"S\xc3\xa3o Paulo \xe6\x9d\xb1\\n\", \"x\": 12345}");
    jw_free(&args);
    outp_delta_free(&d);
    outp_free(&p);
    json_decref(tools);
}

/* Long unterminated input costs linear work and bounded state: a value that never ends, a
 * name that never ends, a call that never closes. */
static void test_outp_xml_unterminated(void) {
    const char *heads[3] = {"<tool_call>\n<function=f>\n<parameter=p>\n",
                            "<tool_call>\n<function=", "<tool_call>\n<function=f>\n"};
    for (int h = 0; h < 3; h++) {
        struct outp p;
        struct outp_delta d = {0};
        outp_init(&p, OUTP_QWEN_XML, false, false);
        outp_push(&p, heads[h], strlen(heads[h]), &d);
        size_t out = d.content.n;
        outp_delta_clear(&d);
        char chunk[64];
        memset(chunk, h == 1 ? 'n' : 'v', sizeof chunk);
        chunk[10] = '<'; /* a '<' that opens no tag */
        for (int i = 0; i < 20000; i++) {
            outp_push(&p, chunk, sizeof chunk, &d);
            for (int k = 0; k < d.n_calls; k++)
                out += d.calls[k].args.n;
            out += d.content.n;
            outp_delta_clear(&d);
            T_CHECK(p.pend.n <= 64 && p.hold.n <= 64 && p.name.n <= 256 && p.key.n <= 256);
        }
        outp_finish(&p, &d);
        for (int k = 0; k < d.n_calls; k++)
            out += d.calls[k].args.n;
        out += d.content.n;
        T_CHECK(!p.bad);
        /* the value streamed out; the name-less region came back as content */
        if (h == 0) T_CHECK(out >= 20000 * sizeof chunk);
        if (h == 1) T_CHECK(out == strlen(heads[h]) + 20000 * sizeof chunk);
        outp_delta_free(&d);
        outp_free(&p);
    }
}

static void test_force_prefix(void) {
    char *s = outp_force_prefix(OUTP_HERMES, "<tool_call>", NULL);
    T_EQ_STR(s, "<tool_call>\n{\"name\": \"");
    free(s);
    s = outp_force_prefix(OUTP_HERMES, "<tool_call>", "get_\"x");
    T_EQ_STR(s, "<tool_call>\n{\"name\": \"get_\\\"x\", \"arguments\": ");
    free(s);
    s = outp_force_prefix(OUTP_MISTRAL, "[TOOL_CALLS]", "f");
    T_EQ_STR(s, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": ");
    free(s);
    s = outp_force_prefix(OUTP_MISTRAL, "[TOOL_CALLS] ... [ARGS]", "f");
    T_EQ_STR(s, "[TOOL_CALLS]f[ARGS]");
    free(s);
    s = outp_force_prefix(OUTP_MISTRAL, "[TOOL_CALLS] ... [ARGS]", NULL);
    T_EQ_STR(s, "[TOOL_CALLS]");
    free(s);
    s = outp_force_prefix(OUTP_LLAMA3, "<|python_tag|>", "f");
    T_EQ_STR(s, "{\"name\": \"f\", \"parameters\": ");
    free(s);
    s = outp_force_prefix(OUTP_QWEN_XML, "<tool_call>\n<function=", "f");
    T_EQ_STR(s, "<tool_call>\n<function=f>\n");
    free(s);
    s = outp_force_prefix(OUTP_HARMONY, "<|channel|>", "f");
    T_EQ_STR(s, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>");
    free(s);
    s = outp_force_prefix(OUTP_HARMONY, "<|channel|>", NULL);
    T_EQ_STR(s, "<|channel|>commentary to=functions.");
    free(s);
    T_CHECK(!outp_force_ok(OUTP_HARMONY, "a b") && outp_force_ok(OUTP_HARMONY, "get_time"));
    s = outp_force_prefix(OUTP_QWEN_XML, "<tool_call>\n<function=", NULL);
    T_EQ_STR(s, "<tool_call>\n<function=");
    free(s);
    T_CHECK(outp_force_prefix(OUTP_TOOLS_NONE, "", "f") == NULL);
    T_CHECK(outp_force_ok(OUTP_QWEN_XML, "get_time") && outp_force_ok(OUTP_QWEN_XML, NULL));
    T_CHECK(!outp_force_ok(OUTP_QWEN_XML, "a>b") && !outp_force_ok(OUTP_QWEN_XML, "a b"));
    T_CHECK(!outp_force_ok(OUTP_QWEN_XML, "") && outp_force_ok(OUTP_HERMES, "a b"));
    /* each prefix, fed as a prefill, leaves the parser inside a well-formed call */
    enum outp_syntax syn[4] = {OUTP_HERMES, OUTP_MISTRAL, OUTP_LLAMA3, OUTP_QWEN_XML};
    const char *rest[4] = {"{\"a\": 1}}</tool_call>", "{\"a\": 1}}]", "{\"a\": 1}}",
                           "<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"};
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"tool\", "
                               "\"parameters\": {\"properties\": {\"a\": {\"type\": "
                               "\"integer\"}}}}}]",
                               0, NULL);
    for (int i = 0; i < 4; i++) {
        char *pre = outp_force_prefix(syn[i], "<tool_call>", "tool");
        struct parsed r;
        run_tools(syn[i], false, false, 0, pre, tools, rest[i], 1, &r);
        T_CHECKF(r.n_calls == 1 && !strcmp(r.names[0], "tool") && !strcmp(arg(&r, 0), "{\"a\": 1}"),
                 "syntax %d: %d calls, args '%s'", syn[i], r.n_calls, arg(&r, 0));
        T_EQ_STR(r.content.p, "");
        parsed_free(&r);
        free(pre);
    }
    json_decref(tools);
}

static void test_syntax_detect(void) {
    T_CHECK(outp_syntax_known("{% if tools %}<tool_call>{% endif %}"));
    T_CHECK(outp_syntax_known("[AVAILABLE_TOOLS] [TOOL_CALLS]"));
    T_CHECK(outp_syntax_known("<tool_call>\n<function={{ name }}>"));
    T_EQ_INT(outp_syntax_of("<tool_call>\n<function={{ name }}>"), OUTP_QWEN_XML);
    /* the same tags in another wrapper (ByteDance Seed) are not qwen_xml */
    T_CHECK(!outp_syntax_known("<seed:tool_call>\n<function={{ name }}>"));
    T_CHECK(outp_syntax_of("<seed:tool_call>\n<function={{ name }}>") != OUTP_QWEN_XML);
    T_CHECK(!outp_syntax_known("{{ '<|im_start|>' }}") && !outp_syntax_known(NULL));
    T_CHECK(outp_template_has_tools("{% if tools %}") && !outp_template_has_tools("plain"));
    T_EQ_INT(outp_syntax_of("{% if tools %}<tool_call>{% endif %}"), OUTP_HERMES);
    T_EQ_INT(outp_syntax_of("[AVAILABLE_TOOLS] [TOOL_CALLS]"), OUTP_MISTRAL);
    T_EQ_INT(outp_syntax_of("<|start_header_id|>ipython ... tools <|python_tag|>"), OUTP_LLAMA3);
    T_EQ_INT(outp_syntax_of(NULL), OUTP_HERMES);
    T_CHECK(outp_template_reasons("{{ '<think>\\n' }}"));
    const char *harmony = "<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>";
    T_EQ_INT(outp_syntax_of(harmony), OUTP_HARMONY);
    T_CHECK(outp_syntax_known(harmony) && outp_template_reasons(harmony) &&
            outp_template_harmony(harmony) && !outp_template_harmony("<|channel|>"));
    T_CHECK(!outp_template_reasons("plain"));
    /* the real templates, where the shared data is here */
    static const struct {
        const char *file;
        int syntax;
        bool known;
    } real[] = {{"Qwen3-Coder.jinja", OUTP_QWEN_XML, true},
                {"Qwen3.5-4B.jinja", OUTP_QWEN_XML, true},
                {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", OUTP_QWEN_XML, true},
                {"ByteDance-Seed-OSS.jinja", -1, false},
                {"Qwen-Qwen3-0.6B.jinja", OUTP_HERMES, true},
                {"openai-gpt-oss-120b.jinja", OUTP_HARMONY, true}};
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/data/chat-templates/%s", SMELT_SHARED_DIR, real[i].file);
        char *src = t_read_file(path, NULL);
        if (!src) continue;
        T_CHECKF(outp_syntax_known(src) == real[i].known, "%s", real[i].file);
        if (real[i].syntax >= 0)
            T_CHECKF((int)outp_syntax_of(src) == real[i].syntax, "%s: %d", real[i].file,
                     outp_syntax_of(src));
        free(src);
    }
}

/* ---- harmony (gpt-oss) ---- */

#define HA "<|channel|>analysis<|message|>"
#define HS "<|end|><|start|>assistant"
#define HF "<|channel|>final<|message|>"

struct hcase {
    const char *text, *content, *reasoning;
    int n_calls;
    const char *name0, *args0, *name1, *args1;
    const char *prefill;
    int max_calls;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
/* Replies as gpt-oss writes them after the prompt's "<|start|>assistant" (the final
 * <|return|> / <|call|> is an end-of-generation token, so the text usually stops before). */
static const struct hcase hcases[] = {
    {HA "The user asks 2+2. Answer 4." HS HF "2 + 2 = 4.", "2 + 2 = 4.",
     "The user asks 2+2. Answer 4."},
    {HA "Simple." HS HF "4<|return|>", "4", "Simple."},
    /* a call: the recipient after the channel, then before it */
    {HA "Need the weather." HS
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     "{\"city\":\"Paris\",\"days\":3}",
     "", "Need the weather.", 1, "get_weather", "{\"city\":\"Paris\",\"days\":3}"},
    {HA "Time." HS " to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": "
     "\"CET\"}<|call|>",
     "", "Time.", 1, "get_time", "{\"tz\": \"CET\"}"},
    /* a preamble (commentary to no one) is content */
    {"<|channel|>commentary<|message|>Let me check." HS
     " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{}",
     "Let me check.", "", 1, "get_time", "{}"},
    /* no body: "{}" */
    {HA "x" HS " to=functions.get_time<|channel|>commentary json<|message|><|call|>", "", "x", 1,
     "get_time", "{}"},
    /* a built-in tool's recipient is its name */
    {" to=browser.search<|channel|>analysis <|constrain|>json<|message|>{\"query\": \"sine\"}",
     "", "", 1, "browser.search", "{\"query\": \"sine\"}"},
    /* plain text, no header: content */
    {"Hello there.", "Hello there.", ""},
    {"  <b>bold</b> and <|x", "  <b>bold</b> and <|x", ""},
    /* markup-like text inside bodies stays */
    {HA "a <|en b" HS HF "c <| d <|end", "c <| d <|end", "a <|en b"},
    /* cut off inside the next header: nothing of it is text */
    {HA "hm" HS "<|channel|>fi", "", "hm"},
    {HA "hm" HS, "", "hm"},
    /* <|start|> without <|end|> ends the message too */
    {HA "think<|start|>assistant" HF "done", "done", "think"},
    /* two analysis messages and a final, with a preamble */
    {HA "one" HS HA " two" HS "<|channel|>commentary<|message|>Pre." HS HF " Final.",
     "Pre. Final.", "one two"},
    /* UTF-8 in every part */
    {HA "S\xc3\xa3o Paulo \xe2\x82\xac" HS
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     "{\"city\": \"S\xc3\xa3o Paulo\"}",
     "", "S\xc3\xa3o Paulo \xe2\x82\xac", 1, "get_weather", "{\"city\": \"S\xc3\xa3o Paulo\"}"},
    /* parallel_tool_calls false: the first call only */
    {" to=functions.a<|channel|>commentary json<|message|>{}<|call|><|start|>assistant"
     " to=functions.b<|channel|>commentary json<|message|>{}",
     "", "", 1, "a", "{}", NULL, NULL, NULL, 1},
    {" to=functions.a<|channel|>commentary json<|message|>{\"x\":1}<|end|><|start|>assistant"
     " to=functions.b<|channel|>commentary json<|message|>{}",
     "", "", 2, "a", "{\"x\":1}", "b", "{}"},
    /* forced: a named call's header, then "required"'s open recipient */
    {"{\"tz\": \"UTC\"}", "", "", 1, "get_time", "{\"tz\": \"UTC\"}",
     NULL, NULL, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"},
    {"get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}", "", "", 1, "get_weather",
     "{\"city\": \"Oslo\"}", NULL, NULL, "<|channel|>commentary to=functions."},
};
#pragma GCC diagnostic pop

static void test_outp_harmony(void) {
    for (size_t i = 0; i < sizeof hcases / sizeof hcases[0]; i++) {
        const struct hcase *c = &hcases[i];
        for (size_t step = 0; step <= 7; step++) {
            struct parsed r;
            run_tools(OUTP_HARMONY, true, false, c->max_calls, c->prefill, NULL, c->text, step,
                      &r);
            expect(&r, i, step, c->content, c->reasoning, c->n_calls, c->name0, c->args0,
                   c->name1, c->args1);
            T_CHECK(utf8_validate((const uint8_t *)r.content.p, r.content.n) == r.content.n);
            T_CHECK(utf8_validate((const uint8_t *)r.reasoning.p, r.reasoning.n) == r.reasoning.n);
            parsed_free(&r);
        }
    }
}

/* Harmony streams: the reasoning and the arguments come out as they arrive (held back only
 * while they might be a marker), never splitting a UTF-8 character; without tools in the
 * request a message to a recipient is content. */
static void test_outp_harmony_incremental(void) {
    const char *text = HA "r\xc3\xa9" "ason" HS
                       "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
                       "{\"k\": \"v\xe2\x82\xac\"}";
    struct outp p;
    struct outp_delta d = {0};
    outp_init(&p, OUTP_HARMONY, true, false);
    size_t n = strlen(text), reason_pieces = 0, arg_pieces = 0, at_name = 0;
    for (size_t i = 0; i < n; i++) {
        outp_push(&p, text + i, 1, &d);
        if (d.reasoning.n) {
            reason_pieces++;
            T_CHECK(utf8_validate((const uint8_t *)d.reasoning.p, d.reasoning.n) == d.reasoning.n);
        }
        for (int k = 0; k < d.n_calls; k++) {
            if (d.calls[k].name) at_name = i;
            else arg_pieces++;
            T_CHECK(utf8_validate((const uint8_t *)d.calls[k].args.p, d.calls[k].args.n) ==
                    d.calls[k].args.n);
        }
        outp_delta_clear(&d);
    }
    outp_finish(&p, &d);
    /* the name is out when its header's <|message|> is */
    T_CHECK(at_name == (size_t)(strstr(text, "<|message|>{") - text) + strlen("<|message|>") - 1);
    T_CHECK(reason_pieces >= 5 && arg_pieces >= 8);
    outp_delta_free(&d);
    outp_free(&p);

    struct parsed r;
    memset(&r, 0, sizeof r);
    r.shape_ok = true;
    jw_raw(&r.content, "", 0);
    jw_raw(&r.reasoning, "", 0);
    outp_init(&p, OUTP_HARMONY, true, false);
    p.no_calls = true;
    outp_push(&p, text, n, &d);
    outp_finish(&p, &d);
    take(&r, &d);
    T_EQ_INT(r.n_calls, 0);
    T_EQ_STR(r.content.p, "{\"k\": \"v\xe2\x82\xac\"}");
    T_EQ_STR(r.reasoning.p, "r\xc3\xa9" "ason");
    parsed_free(&r);
    outp_delta_free(&d);
    outp_free(&p);
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
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"user\": \"u1\", "
     "\"metadata\": {\"a\": \"b\"}, \"store\": false}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", "
     "\"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}]}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"text\"}}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": null, "
     "\"seed\": null, \"max_tokens\": null}",
     0, NULL},
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
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
     "\"image_url\": {\"url\": \"x\"}}]}]}",
     400, "messages[0].content"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"xml\"}}",
     400, "response_format"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
     "\"required\"}",
     400, "tool_choice"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
     "\"function\", \"function\": {\"name\": \"g\"}}}",
     400, "tool_choice"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}",
     400, "top_logprobs"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"audio\": {}}", 400,
     "audio"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"y\"}", 400,
     "prompt"},
    /* strict tools: a boolean (the grammar is made by sgram.c) */
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\", \"strict\": false}}, {\"type\": "
     "\"function\", \"function\": {\"name\": \"g\", \"strict\": true}}]}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\", \"strict\": \"yes\"}}]}",
     400, "tools[0].function.strict"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\", \"strict\": false}}, {\"type\": "
     "\"function\", \"function\": {\"name\": \"g\", \"strict\": null}}]}",
     0, NULL},
    /* reasoning_effort: checked (chat only) */
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": "
     "\"minimal\"}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": "
     "null}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": "
     "\"max\"}",
     400, "reasoning_effort"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": "
     "1}",
     400, "reasoning_effort"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"reasoning_effort\": \"low\"}", 400,
     "reasoning_effort"},
    /* structured output: response_format, llama.cpp's grammar and json_schema, one of them */
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"response_format\": {\"type\": \"json_object\"}}", 0,
     NULL},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"grammar\": \"root ::= \\\"a\\\"\"}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"grammar\": \"\"}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"json_schema\": {\"type\": \"integer\"}}", 0, NULL},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"grammar\": 5}", 400, "grammar"},
    {OAI_COMPLETION, "{\"prompt\": \"hi\", \"json_schema\": \"x\"}", 400, "json_schema"},
    {OAI_COMPLETION,
     "{\"prompt\": \"hi\", \"json_schema\": {}, \"grammar\": \"root ::= \\\"a\\\"\"}", 400,
     "grammar"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"strict\": true, "
     "\"schema\": {\"type\": \"object\"}}}}",
     0, NULL},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": 5}}}",
     400, "response_format.json_schema.schema"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"format\": 5}}}",
     400, "response_format.json_schema"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_object\", \"strict\": true}}",
     400, "response_format"},
    {OAI_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_object\"}, \"json_schema\": {}}",
     400, "json_schema"},
};

/* What the structured-output fields become: the grammar's kind, text and field. */
static void test_grammar_fields(void) {
    struct {
        enum oai_kind kind;
        const char *body;
        enum gram_kind gkind;
        const char *text, *param;
    } cases[] = {
        {OAI_COMPLETION, "{\"prompt\": \"hi\"}", 0, "", ""},
        {OAI_COMPLETION, "{\"prompt\": \"hi\", \"grammar\": \"root ::= [a-z]+\"}", GRAM_GBNF,
         "root ::= [a-z]+", "grammar"},
        {OAI_COMPLETION,
         "{\"prompt\": \"hi\", \"json_schema\": {\"type\": \"array\", \"items\": "
         "{\"type\": \"string\"}}}",
         GRAM_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}", "json_schema"},
        {OAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_object\"}}",
         GRAM_JSON_OBJECT, "", "response_format"},
        {OAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_object\", \"schema\": {\"const\": 1}}}",
         GRAM_JSON_SCHEMA, "{\"const\":1}", "response_format"},
        {OAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": "
         "{\"type\": \"object\", \"properties\": {\"b\": {}, \"a\": {}}}}}}",
         GRAM_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"b\":{},\"a\":{}}}",
         "response_format.json_schema.schema"},
        {OAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\"}}}",
         GRAM_JSON_OBJECT, "", "response_format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct oai_request r;
        struct oai_err e = {0};
        T_CHECKF(oai_parse(cases[i].body, strlen(cases[i].body), cases[i].kind, 1000, NULL, &r, &e),
                 "case %zu: %s", i, e.message);
        T_EQ_INT(r.gkind, cases[i].gkind);
        T_EQ_STR(r.gkind ? r.gparam : "", cases[i].param);
        if (cases[i].gkind && cases[i].gkind != GRAM_JSON_OBJECT) {
            T_EQ_INT((int)r.glen, (int)strlen(cases[i].text));
            T_CHECKF(r.gtext && !memcmp(r.gtext, cases[i].text, r.glen), "case %zu: %.*s", i,
                     (int)r.glen, r.gtext);
        }
        oai_request_free(&r);
    }
    /* strict tools are marked */
    const char *b =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
        "\"function\", \"function\": {\"name\": \"f\", \"strict\": true}}]}";
    struct oai_request r;
    struct oai_err e;
    T_CHECK(oai_parse(b, strlen(b), OAI_CHAT, 1000, NULL, &r, &e));
    T_CHECK(r.tools_strict);
    oai_request_free(&r);
}

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

/* Error messages are valid UTF-8 whatever they quote: a client's invalid bytes become
 * U+FFFD, a "%.*s" clipped with oai_clip and the buffer's own end never split a character,
 * and the JSON body is the error itself (jansson refuses invalid UTF-8: it used to fall back
 * to "out of memory"). */
static void test_error_text(void) {
    T_EQ_INT(oai_clip("abc", 2), 2);
    T_EQ_INT(oai_clip("ab", 5), 2);
    T_EQ_INT(oai_clip("a\xc3\xa9", 2), 1);          /* é would be split */
    T_EQ_INT(oai_clip("a\xc3\xa9", 3), 3);
    T_EQ_INT(oai_clip("\xe2\x82\xac\xe2\x82\xac", 5), 3); /* € € */
    T_EQ_INT(oai_clip("a\xff\xfe", 2), 2);          /* invalid bytes are not a character to keep */
    struct oai_err e;
    oai_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
             "The model '%s' does not exist", "x\xff\xc3y");
    T_EQ_STR(e.message, "The model 'x\xef\xbf\xbd\xef\xbf\xbdy' does not exist");
    char *j = oai_err_json(&e);
    json_t *p = json_loads(j, 0, NULL);
    T_CHECK(p && !strcmp(json_string_value(json_object_get(json_object_get(p, "error"), "message")),
                         e.message));
    T_CHECK(!strstr(j, "out of memory"));
    json_decref(p);
    free(j);
    /* a message longer than the buffer: cut before a 2-byte character, never inside it */
    char big[ERR_MSG_MAX * 2];
    for (size_t i = 0; i + 2 < sizeof big; i += 2) memcpy(big + i, "\xc3\xa9", 2);
    big[sizeof big - 2] = 0;
    for (int lead = 0; lead < 2; lead++) {
        oai_bad(&e, "p\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9",
                "%s%s", lead ? "x" : "", big);
        size_t n = strlen(e.message);
        T_CHECK(n > ERR_MSG_MAX - 8 && n < ERR_MSG_MAX);
        T_EQ_INT(utf8_validate((const uint8_t *)e.message, n), n);
        T_CHECK(!strstr(e.message, "\xef\xbf\xbd")); /* cut, not repaired */
        T_EQ_INT(utf8_validate((const uint8_t *)e.param, strlen(e.param)), strlen(e.param));
        T_CHECK(strlen(e.param) > 50);
    }
}

int main(void) {
    T_RUN(test_error_text);
    T_RUN(test_outp);
    T_RUN(test_outp_incremental);
    T_RUN(test_outp_xml);
    T_RUN(test_outp_xml_incremental);
    T_RUN(test_outp_xml_unterminated);
    T_RUN(test_outp_harmony);
    T_RUN(test_outp_harmony_incremental);
    T_RUN(test_force_prefix);
    T_RUN(test_syntax_detect);
    T_RUN(test_requests);
    T_RUN(test_grammar_fields);
    T_RUN(test_jw);
    return t_done();
}

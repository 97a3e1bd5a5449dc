/* The server's structured-output grammars (sgram.c) checked against the automaton with no
 * model: for each tool-call syntax, the grammar composed from a request (forced, lazy, or
 * beside a response format) takes exactly the calls the template's syntax writes (after the
 * prompt's prefill for a forced call, from the marker on for a lazy one), with arguments that
 * follow a strict tool's schema; a reasoning template's grammar takes a think block first; a
 * harmony one analysis messages, then the final message. Refusals name the field. */
#include "gram_test_util.h"
#include "server/outp.h"
#include "server/server_int.h"
#include "t.h"

static struct gram_vocab *V;

/* Tools: get_weather strict (city: a string, required; unit: "c" or "f"; days: an integer in
 * [1, 7]), get_time not strict (any object). */
static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"strict\": true, "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
    "\"description\": \"a city\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, "
    "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 7}}, \"required\": [\"city\"], "
    "\"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": {\"name\": "
    "\"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"tz\": {\"type\": "
    "\"string\"}}}}}]";

struct syn {
    const char *name, *src; /* a template source that picks the syntax */
    const char *calls[3];   /* whole replies of calls; [0] calls get_weather first */
    const char *bad[3];     /* replies that are not calls the request allows */
};

static const struct syn syns[] = {
    {"hermes",
     "{{ tools }} <tool_call>",
     {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"c\"}}\n"
      "</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"x\": "
      "[1]}}\n</tool_call>",
      "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\",\"days\":3}}</"
      "tool_call>"},
     {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 9}}\n"
      "</tool_call>",
      "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"}},
    {"qwen_xml",
     "{{ tools }} <tool_call><function=",
     {"<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
      "<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nA <b>c</b>\n\n</parameter>\n"
      "<parameter=days>\n7\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
      "<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n<parameter=x>\n[1]\n</parameter>\n"
      "</function>\n</tool_call>",
      NULL},
     {"<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n"
      "</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nP</parameter>x\n</parameter>\n"
      "</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=unit>\n"
      "k\n</parameter>\n</function>\n</tool_call>"}},
    {"llama3",
     "<|start_header_id|>{{ tools }}",
     {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": "
      "\"get_time\", "
      "\"parameters\": {}}",
      NULL},
     {"{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": 5}}", NULL}},
    {"mistral",
     "{{ tools }}[TOOL_CALLS]",
     {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
      "\"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]",
      NULL},
     {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"k\": 1}}]",
      "[TOOL_CALLS]{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", NULL}},
    {"mistral_args",
     "{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]",
     {"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
      "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}", NULL},
     {"[TOOL_CALLS]get_weather[ARGS]{}", "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}", NULL}},
    {"harmony",
     "{{ tools }}<|start|>assistant<|channel|>final<|message|>",
     {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": "
      "\"Paris\"}",
      NULL, NULL},
     {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\": "
      "\"P\"}",
      "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"P\"}"
      "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}",
      NULL}},
};

/* The request (a chat body around the tools and extra fields) and its rendered prompt's
 * view; builds the grammar and compiles it over the synthetic vocabulary. */
struct built {
    struct oai_request rq;
    struct chat_prompt cp;
    struct sgram sg;
    struct gram *g;
    char *prefill;
    struct oai_err e;
    bool ok;
};

static void build(struct built *b, const char *src, const char *extra, bool reasoning,
                  bool in_reasoning) {
    memset(b, 0, sizeof *b);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
             "\"tools\": %s%s}",
             TOOLS, extra);
    T_CHECKF(oai_parse(body, strlen(body), OAI_CHAT, 1000, NULL, &b->rq, &b->e), "%s",
             b->e.message);
    b->cp.tmpl_src = src;
    b->cp.syntax = outp_syntax_of(src);
    b->cp.reasoning = reasoning;
    b->cp.in_reasoning = in_reasoning;
    b->ok = sgram_build(&b->rq, &b->cp, &b->sg, &b->e);
    if (!b->ok || !b->sg.kind) return;
    if (b->sg.prefill) { /* chat.c's prefill */
        const char *name = b->rq.tool_choice == OAI_TOOLS_NAMED ? b->rq.tool_name : NULL;
        char *open = outp_force_prefix(b->cp.syntax, src, name);
        size_t n = strlen(open);
        b->prefill = malloc(n + 16);
        snprintf(b->prefill, n + 16, "%s%s", in_reasoning ? "</think>\n\n" : "", open);
        free(open);
    }
    struct err e;
    T_CHECKF(gram_compile(&b->g, V, b->sg.kind, b->sg.text.p, b->sg.text.n, &e) == SMELT_OK,
             "%s: %s\n%s", src, e.msg, b->sg.text.p);
}

static void unbuild(struct built *b) {
    gram_unref(b->g);
    sgram_free(&b->sg);
    oai_request_free(&b->rq);
    free(b->prefill);
}

/* Whether the built grammar takes reply whole: after the prefill when there is one (the
 * reply must then start with it), from the trigger on when lazy. */
static bool takes(const struct built *b, const char *reply) {
    if (!b->g) return false;
    const char *r = reply;
    if (b->prefill) {
        size_t n = strlen(b->prefill);
        if (strncmp(reply, b->prefill, n)) return false;
    }
    if (b->sg.trigger) {
        r = strstr(reply, b->sg.trigger);
        if (!r) return false;
    }
    return gt_accepts(b->g, r, strlen(r));
}

static void test_syntaxes(void) {
    for (size_t i = 0; i < sizeof syns / sizeof syns[0]; i++) {
        const struct syn *s = &syns[i];
        struct built b;
        /* required: any call of the tools (several when parallel) */
        build(&b, s->src, ", \"tool_choice\": \"required\"", false, false);
        T_CHECKF(b.ok && b.sg.prefill && !b.sg.trigger, "%s: %s", s->name, b.e.message);
        for (int k = 0; k < 3 && s->calls[k]; k++) /* those in the prefill's spacing */
            T_CHECKF(strncmp(s->calls[k], b.prefill, strlen(b.prefill)) || takes(&b, s->calls[k]),
                     "%s required: %s\n%s", s->name, s->calls[k], b.sg.text.p);
        for (int k = 0; k < 3 && s->bad[k]; k++)
            T_CHECKF(!takes(&b, s->bad[k]), "%s required took %s", s->name, s->bad[k]);
        T_CHECKF(!takes(&b, "Hello."), "%s", s->name);
        unbuild(&b);
        /* named: that one function, once */
        build(&b, s->src,
              ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
              "\"get_weather\"}}",
              false, false);
        T_CHECKF(b.ok, "%s: %s", s->name, b.e.message);
        T_CHECKF(takes(&b, s->calls[0]), "%s named: %s", s->name, s->calls[0]);
        T_CHECKF(!s->calls[1] || !takes(&b, s->calls[1]), "%s named took two calls", s->name);
        unbuild(&b);
        /* auto with a strict tool: lazy, from the call marker on */
        build(&b, s->src, "", false, false);
        T_CHECKF(b.ok && b.sg.trigger && !b.sg.prefill, "%s: %s", s->name, b.e.message);
        for (int k = 0; k < 3 && s->calls[k]; k++) {
            char reply[2048];
            snprintf(reply, sizeof reply, "Let me see. %s", s->calls[k]);
            T_CHECKF(takes(&b, reply), "%s auto: %s", s->name, reply);
        }
        for (int k = 0; k < 3 && s->bad[k]; k++)
            T_CHECKF(!takes(&b, s->bad[k]) || !strstr(s->bad[k], b.sg.trigger), "%s auto took %s",
                     s->name, s->bad[k]);
        unbuild(&b);
        /* auto with a response format: the response or calls, from the start */
        build(&b, s->src, ", \"response_format\": {\"type\": \"json_object\"}", false, false);
        T_CHECKF(b.ok && !b.sg.trigger && !b.sg.prefill, "%s: %s", s->name, b.e.message);
        if (strcmp(s->name, "harmony")) {
            T_CHECKF(takes(&b, "{\"answer\": 42}"), "%s", s->name);
            T_CHECKF(takes(&b, s->calls[0]), "%s response or call: %s", s->name, s->calls[0]);
            T_CHECKF(!takes(&b, "Let me see."), "%s", s->name);
        }
        unbuild(&b);
        /* tool_choice none: the tools are not constrained (nothing at all here) */
        build(&b, s->src, ", \"tool_choice\": \"none\"", false, false);
        T_CHECK(b.ok && !b.sg.kind);
        unbuild(&b);
    }
}

/* A reasoning template: a think block (optional, or the rest of the prompt's) before the
 * response; a forced call after the prefill that closed the prompt's think block. */
static void test_reasoning(void) {
    const char *src = "{{ tools }} <think> <tool_call>";
    const char *schema =
        ", \"tool_choice\": \"none\", \"response_format\": {\"type\": "
        "\"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": {\"type\": "
        "\"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": "
        "[\"n\"]}}}";
    struct built b;
    build(&b, src, schema, true, false);
    T_CHECK(b.ok);
    T_CHECK(takes(&b, "{\"n\": 1}"));
    T_CHECK(takes(&b, "<think>\nLet me count: 1 < 2.\n</think>\n\n{\"n\": 2}"));
    T_CHECK(takes(&b, "<think></think>{\"n\": 2}"));
    T_CHECK(!takes(&b, "<think>a</think>b</think>{\"n\": 2}"));
    T_CHECK(!takes(&b, "<think>a</think>\n\n{\"m\": 2}"));
    T_CHECK(!takes(&b, "Sure: {\"n\": 2}"));
    unbuild(&b);
    build(&b, src, schema, true, true); /* the prompt opened <think> */
    T_CHECK(takes(&b, "Counting... </ think> </thin </think>\n{\"n\": 3}"));
    T_CHECK(!takes(&b, "{\"n\": 3}"));
    unbuild(&b);
    build(&b, src, ", \"tool_choice\": \"required\"", true, true);
    T_CHECK(b.ok && b.prefill && !strncmp(b.prefill, "</think>\n\n<tool_call>", 21));
    T_CHECK(takes(
        &b, "</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
    unbuild(&b);
}

/* Harmony: analysis messages, then the final message's response. */
static void test_harmony_final(void) {
    struct built b;
    build(&b, syns[5].src,
          ", \"tool_choice\": \"none\", \"response_format\": {\"type\": \"json_object\"}", true,
          false);
    T_CHECK(b.ok);
    T_CHECK(takes(&b, "<|channel|>final<|message|>{\"a\": [1, 2]}"));
    T_CHECK(takes(&b, "<|channel|>analysis<|message|>Think <|end of it.<|end|><|start|>assistant"
                      "<|channel|>final<|message|>{}"));
    T_CHECK(!takes(&b, "<|channel|>final<|message|>[1]"));
    T_CHECK(!takes(&b, "{}"));
    unbuild(&b);
}

/* What cannot be enforced is refused, naming the field. */
static void test_refusals(void) {
    /* a string parameter with a pattern: qwen_xml writes strings as raw text */
    const char *tools_pat =
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, "
        "\"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"code\": {\"type\": \"string\", \"pattern\": "
        "\"^[A-Z]{3}$\"}}}}}]";
    struct oai_request rq;
    struct oai_err e;
    char body[1024];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
             "\"tools\": %s}",
             tools_pat);
    T_CHECK(oai_parse(body, strlen(body), OAI_CHAT, 1000, NULL, &rq, &e));
    struct chat_prompt cp = {.tmpl_src = syns[1].src, .syntax = OUTP_QWEN_XML};
    struct sgram sg;
    T_CHECK(!sgram_build(&rq, &cp, &sg, &e));
    T_EQ_INT(e.status, 400);
    T_EQ_STR(e.param, "tools[0].function.parameters.properties.code");
    T_CHECKF(strstr(e.message, "pattern") != NULL, "%s", e.message);
    sgram_free(&sg);
    /* the same in JSON (hermes): enforced */
    cp = (struct chat_prompt){.tmpl_src = syns[0].src, .syntax = OUTP_HERMES};
    T_CHECK(sgram_build(&rq, &cp, &sg, &e));
    sgram_free(&sg);
    oai_request_free(&rq);
    /* a schema feature the compiler refuses: its JSON path */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
             "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", "
             "\"function\": {\"name\": \"g\", \"strict\": true, \"parameters\": {\"type\": "
             "\"object\", \"properties\": {\"a\": {\"not\": {}}}}}}]}");
    T_CHECK(oai_parse(body, strlen(body), OAI_CHAT, 1000, NULL, &rq, &e));
    T_CHECK(!sgram_build(&rq, &cp, &sg, &e));
    T_EQ_STR(e.param, "tools[1].function.parameters");
    T_CHECKF(strstr(e.message, "/properties/a") && strstr(e.message, "'not'"), "%s", e.message);
    sgram_free(&sg);
    /* a template whose tool-call syntax smelt does not know */
    cp = (struct chat_prompt){.tmpl_src = "{{ tools }} plain", .syntax = OUTP_HERMES};
    T_CHECK(!sgram_build(&rq, &cp, &sg, &e));
    T_EQ_STR(e.param, "tools");
    sgram_free(&sg);
    oai_request_free(&rq);
}

int main(void) {
    V = gt_vocab();
    if (!V) return 1;
    T_RUN(test_syntaxes);
    T_RUN(test_reasoning);
    T_RUN(test_harmony_final);
    T_RUN(test_refusals);
    gram_vocab_free(V);
    return t_done();
}

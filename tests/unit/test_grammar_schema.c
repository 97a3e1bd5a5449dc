/* JSON Schema, json_object and regex inputs of the grammar engine, against the automaton with
 * no model: each feature with documents it must take and documents it must refuse (every
 * refused one is invalid for the schema; the taken ones are checked by Python's jsonschema
 * over the corpus in tests/py/test_grammar_schemas.py), what is refused at compile time with
 * the feature and its JSON path, and hostile inputs compiled or refused in bounded time. */
#include "gram_test_util.h"
#include "grammar/gram_int.h"
#include "util/clock.h"
#include "t.h"

static struct gram_vocab *V;

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void check(enum gram_kind kind, const char *text, const char *const *yes,
                  const char *const *no) {
    struct err e = {0};
    struct gram *g = gt_compile(V, kind, text, &e);
    T_CHECKF(g != NULL, "%s: %s", text, e.msg);
    if (!g) return;
    for (; yes && *yes; yes++)
        T_CHECKF(gt_accepts(g, *yes, strlen(*yes)), "%s should take %s", text, *yes);
    for (; no && *no; no++)
        T_CHECKF(!gt_accepts(g, *no, strlen(*no)), "%s should refuse %s", text, *no);
    gram_unref(g);
}

#define S(text, yes, no) check(GRAM_JSON_SCHEMA, text, yes, no)

static void test_types(void) {
    S("{\"type\": \"string\"}", L("\"abc\"", "\"\"", "\"a\\\"b\\\\\"", "\"\\u00e9\\n\"", "\"é😀\""),
      L("abc", "1", "\"a", "\"a\nb\"", "\"\\x\""));
    S("{\"type\": \"integer\"}", L("0", "-12", "1234567890123456"),
      L("01", "1.5", "-", "\"1\"", "+1", "--1"));
    S("{\"type\": \"number\"}", L("1.5", "-0.25e+10", "3", "1E5", "0.0"),
      L(".5", "1.", "+1", "1e", "00"));
    S("{\"type\": \"boolean\"}", L("true", "false"), L("True", "1", "null"));
    S("{\"type\": \"null\"}", L("null"), L("nul", "\"null\""));
    S("{\"type\": [\"string\", \"null\"]}", L("\"x\"", "null"), L("1", "true"));
    S("true", L("1", "\"s\"", "{\"a\": [null, {}]}", "[]"), L("", "{", "[1,]"));
    S("{}", L("false", "-1.5e3"), L("nope"));
    S("{\"description\": \"annotations only\", \"x-vendor\": 1}", L("[1, 2]"), L("[1 2]"));
}

static void test_objects(void) {
    const char *req =
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": "
        "{\"type\": \"string\"}}, \"required\": [\"a\"]}";
    S(req,
      L("{\"a\":1}", "{\"a\": 1, \"b\": \"x\"}", "{ \"a\" : 1 }",
        "{\n  \"a\": 1,\n  \"b\": \"\"\n}"),
      L("{}", "{\"b\":\"x\"}", "{\"a\":1,\"c\":2}", "{\"b\":\"x\",\"a\":1}", "{\"a\":\"1\"}",
        "{\"a\":1,}"));
    const char *opt =
        "{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\"}, "
        "\"c\": {\"type\": \"boolean\"}}}";
    S(opt,
      L("{}", "{\"a\":1}", "{\"b\":\"x\"}", "{\"c\":true}", "{\"a\":1,\"c\":false}",
        "{\"a\":1,\"b\":\"x\",\"c\":true}"),
      L("{,}", "{\"a\":1,}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1 \"b\":\"x\"}", "{\"d\":1}"));
    /* optional before and after a required one */
    S("{\"properties\": {\"a\": {\"const\": 1}, \"b\": {\"const\": 2}, \"c\": {\"const\": 3}}, "
      "\"required\": [\"b\"]}",
      L("{\"b\":2}", "{\"a\":1,\"b\":2}", "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"),
      L("{\"a\":1}", "{\"a\":1,\"c\":3}", "{\"b\":2,}", "{,\"b\":2}"));
    /* additionalProperties: a schema for the other keys, never a declared one */
    S("{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"additionalProperties\": {\"type\": "
      "\"string\"}}",
      L("{}", "{\"a\":1,\"x\":\"y\"}", "{\"x\":\"y\",\"ab\":\"z\"}", "{\"\":\"e\"}"),
      L("{\"x\":1}", "{\"a\":\"s\"}", "{\"a\":1,\"a\":\"s\"}"));
    S("{\"additionalProperties\": true}", L("{\"k\": [1, {\"z\": null}]}", "{}"),
      L("{\"k\"}", "[]"));
    S("{\"additionalProperties\": false, \"properties\": {\"x\": {\"type\": \"null\"}}}",
      L("{\"x\":null}", "{}"), L("{\"y\":null}"));
    /* required names outside properties take additionalProperties' schema */
    S("{\"type\": \"object\", \"required\": [\"id\"], \"additionalProperties\": {\"type\": "
      "\"integer\"}}",
      L("{\"id\":5}", "{\"id\":5,\"n\":6}"), L("{}", "{\"id\":\"5\"}"));
    /* property names with characters JSON escapes */
    S("{\"properties\": {\"a\\\"b\": {\"type\": \"integer\"}, \"é\": {\"type\": \"integer\"}}, "
      "\"required\": [\"a\\\"b\", \"é\"]}",
      L("{\"a\\\"b\": 1, \"é\": 2}"), L("{\"a\"b\": 1, \"é\": 2}", "{\"a\\\"b\": 1}"));
}

static void test_arrays(void) {
    S("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}", L("[]", "[1, 2,3]", "[ 1 ]"),
      L("[1,\"a\"]", "[,]", "[1,]", "[1 2]"));
    S("{\"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 3}",
      L("[1,2]", "[1,2,3]"), L("[1]", "[1,2,3,4]", "[]"));
    S("{\"type\": \"array\", \"maxItems\": 1}", L("[]", "[{\"a\":1}]"), L("[1,2]"));
    S("{\"prefixItems\": [{\"type\": \"number\"}, {\"type\": \"string\"}], \"items\": false}",
      L("[1,\"a\"]", "[1.5, \"\"]"), L("[\"a\",1]", "[1,\"a\",2]"));
    S("{\"prefixItems\": [{\"const\": \"x\"}], \"items\": {\"type\": \"integer\"}, \"minItems\": "
      "3}",
      L("[\"x\",1,2]", "[\"x\",1,2,3]"), L("[\"x\",1]", "[\"x\",\"y\",1]"));
    S("{\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"items\": [{\"type\": "
      "\"integer\"}], "
      "\"additionalItems\": {\"type\": \"boolean\"}}",
      L("[1]", "[1,true,false]"), L("[true]", "[1,2]"));
    S("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"uniqueItems\": false}",
      L("[1,1]"), L("[1,]"));
}

static void test_enum_const(void) {
    S("{\"enum\": [\"red\", \"green\", 3, null, {\"a\": [1]}]}",
      L("\"red\"", "3", "null", "{\"a\":[1]}"), L("\"blue\"", "\"Red\"", "4", "{\"a\": [1]}"));
    S("{\"type\": \"string\", \"enum\": [\"a\", 1]}", L("\"a\""), L("1"));
    S("{\"const\": {\"a\": [1, 2]}}", L("{\"a\":[1,2]}"), L("{\"a\":[1]}", "{\"a\": [1, 2]}"));
    S("{\"const\": \"q\\\"uote\\u0001\"}", L("\"q\\\"uote\\u0001\""), L("\"q\\\"uote\\u0002\""));
}

static void test_composition(void) {
    S("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 2}]}",
      L("1", "\"ab\""), L("\"abc\"", "true"));
    S("{\"oneOf\": [{\"type\": \"boolean\"}, {\"type\": \"null\"}]}", L("true", "null"), L("1"));
    S("{\"oneOf\": [{\"properties\": {\"kind\": {\"const\": \"a\"}, \"x\": {\"type\": "
      "\"integer\"}}, \"required\": [\"kind\", \"x\"]},"
      " {\"properties\": {\"kind\": {\"const\": \"b\"}, \"y\": {\"type\": \"string\"}}, "
      "\"required\": [\"kind\", \"y\"]}]}",
      L("{\"kind\":\"a\",\"x\":1}", "{\"kind\":\"b\",\"y\":\"s\"}"),
      L("{\"kind\":\"a\",\"y\":\"s\"}", "{\"kind\":\"c\",\"x\":1}"));
    S("{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}, "
      "{\"properties\": {\"b\": {\"type\": \"string\"}}, \"required\": [\"b\"]}]}",
      L("{\"a\":1,\"b\":\"x\"}"), L("{\"a\":1}", "{\"b\":\"x\"}"));
    /* an anyOf refining its parent */
    S("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": "
      "\"integer\"}},"
      " \"anyOf\": [{\"required\": [\"a\"]}, {\"required\": [\"b\"]}]}",
      L("{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"), L("{}", "{\"a\":\"x\"}"));
}

static void test_refs(void) {
    S("{\"$defs\": {\"pos\": {\"type\": \"integer\", \"minimum\": 0}}, \"type\": \"array\", "
      "\"items\": {\"$ref\": \"#/$defs/pos\"}}",
      L("[0,5]", "[]"), L("[-1]", "[1.5]"));
    S("{\"definitions\": {\"a/b\": {\"const\": 1}, \"c~d\": {\"const\": 2}}, \"anyOf\": "
      "[{\"$ref\": \"#/definitions/a~1b\"}, "
      "{\"$ref\": \"#/definitions/c~0d\"}]}",
      L("1", "2"), L("3"));
    const char *tree = "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": "
                       "{\"type\": \"integer\"}, "
                       "\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, "
                       "\"required\": [\"v\"], "
                       "\"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}";
    S(tree,
      L("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}"),
      L("{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"kids\":[{\"v\":2}]", "{\"kids\":[]}"));
    /* a $ref with siblings: both apply */
    S("{\"$defs\": {\"s\": {\"type\": \"string\"}}, \"properties\": {\"x\": {\"$ref\": "
      "\"#/$defs/s\", \"maxLength\": 1}}, "
      "\"required\": [\"x\"]}",
      L("{\"x\":\"a\"}"), L("{\"x\":\"ab\"}", "{\"x\":1}"));
}

static void test_strings(void) {
    S("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}",
      L("\"ab\"", "\"é€😀\"", "\"a\\\"b\"", "\"\\u00e9x\""),
      L("\"a\"", "\"abcd\"", "\"\"", "\"\\ud83d\\ude00\""));
    S("{\"type\": \"string\", \"pattern\": \"^[a-z]{2}-[0-9]+$\"}", L("\"ab-12\""),
      L("\"ab-\"", "\"Ab-1\"", "\"xab-1\"", "\"ab-1x\""));
    S("{\"type\": \"string\", \"pattern\": \"[0-9]\"}", L("\"a1b\"", "\"7\"", "\"\\n9\""),
      L("\"abc\"", "\"\""));
    S("{\"type\": \"string\", \"pattern\": \"^a|b$\"}", L("\"axx\"", "\"xxb\""), L("\"xax\""));
    S("{\"type\": \"string\", \"pattern\": \"^\\\\d{3}\\\\.\\\\w+\\\\s?\\\\\\\"$\"}",
      L("\"123.a_b \\\"\"", "\"000.Z\\\"\""), L("\"12.ab\\\"\"", "\"123.ab\""));
    S("{\"type\": \"string\", \"pattern\": \"^(?:[^\\\\s]+)(x|y){1,2}$\"}", L("\"abxy\"", "\"éy\""),
      L("\"a bx\"", "\"x\""));
    S("{\"type\": \"string\", \"pattern\": \"^[^a-z\\\"]$\"}", L("\"A\"", "\"\\\\\"", "\"\\n\""),
      L("\"a\"", "\"\\\"\""));
}

static void test_formats(void) {
    S("{\"type\": \"string\", \"format\": \"date\"}",
      L("\"2024-02-29\"", "\"1999-12-31\"", "\"2000-02-29\""),
      L("\"2023-02-29\"", "\"1900-02-29\"", "\"2024-13-01\"", "\"2024-04-31\"", "\"0000-01-01\"",
        "\"24-01-01\""));
    S("{\"type\": \"string\", \"format\": \"date-time\"}",
      L("\"2024-01-01T00:00:00Z\"", "\"2024-06-30T23:59:59.123+05:30\""),
      L("\"2024-01-01 00:00:00Z\"", "\"2024-01-01T24:00:00Z\"", "\"2024-01-01T00:00:00\""));
    S("{\"type\": \"string\", \"format\": \"time\"}", L("\"12:00:00Z\"", "\"00:00:00-01:00\""),
      L("\"12:00\"", "\"12:60:00Z\""));
    S("{\"type\": \"string\", \"format\": \"uuid\"}", L("\"123e4567-e89b-12d3-a456-426614174000\""),
      L("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""));
    S("{\"type\": \"string\", \"format\": \"email\"}", L("\"a.b+c@example.co.uk\""),
      L("\"ab.example.com\"", "\"a@b\""));
    S("{\"type\": \"string\", \"format\": \"ipv4\"}",
      L("\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\""),
      L("\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\""));
}

static void test_numbers(void) {
    S("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 105}",
      L("-5", "0", "99", "105", "-1", "7"), L("-6", "106", "1000", "-10", "5.0"));
    S("{\"type\": \"integer\", \"exclusiveMinimum\": 0}", L("1", "123456"), L("0", "-1"));
    S("{\"type\": \"integer\", \"minimum\": 123, \"maximum\": 98765}",
      L("123", "999", "1000", "98765", "5000"), L("122", "98766", "99999", "12"));
    S("{\"type\": \"integer\", \"maximum\": -3}", L("-3", "-4", "-100"), L("-2", "0", "3"));
    S("{\"type\": \"integer\", \"minimum\": 1.5, \"exclusiveMaximum\": 4}", L("2", "3"),
      L("1", "4"));
    S("{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", L("0", "0.5", "1", "1.0", "0.999"),
      L("1.5", "-0.1", "2", "1.01", "1e0"));
    S("{\"type\": \"number\", \"exclusiveMinimum\": -10, \"exclusiveMaximum\": 10}",
      L("9.99", "-9.5", "0", "-9.9999"), L("10", "10.0", "-10", "-10.0", "11", "-10.0001"));
    S("{\"type\": \"number\", \"exclusiveMinimum\": 0}", L("0.001", "5"), L("0", "0.0", "-1"));
    S("{\"type\": \"integer\", \"multipleOf\": 1}", L("7"), L("7.5"));
}

static void test_json_object_mode(void) {
    check(GRAM_JSON_OBJECT, "", L("{}", "{\"a\": [1, 2.5, \"x\", {\"b\": null}], \"c\": true}"),
          L("[]", "1", "\"s\"", "{\"a\"}", "{} {}"));
}

static void test_regex_kind(void) {
    check(GRAM_REGEX, "[a-c]+x?", L("a", "abcx"), L("", "x", "abcd"));
    check(GRAM_REGEX, "^(\\d{3})-(\\d{4})$", L("555-1234"), L("5551234", "55-1234"));
    check(GRAM_REGEX, "a|", L("a", ""), L("b"));
    check(GRAM_REGEX, "[^]x{2,}?.\\u00e9\\x41\\t[\\b]", L("zxx!éA\t\b"), L("zx!éA\t\b"));
}

/* compile refusals: the error names the feature and the path */
static void refused(enum gram_kind kind, const char *text, const char *needle) {
    struct err e = {0};
    struct gram *g = gt_compile(V, kind, text, &e);
    T_CHECKF(g == NULL, "%s should be refused", text);
    gram_unref(g);
    T_CHECKF(strstr(e.msg, needle) != NULL, "error \"%s\" lacks \"%s\"", e.msg, needle);
}

static void test_refusals(void) {
#define R(text, needle) refused(GRAM_JSON_SCHEMA, text, needle)
    R("{\"properties\": {\"a\": {\"type\": \"object\", \"patternProperties\": {\"x\": {}}}}}",
      "schema /properties/a: 'patternProperties' is not supported");
    R("{\"properties\": {\"tags\": {\"type\": \"array\", \"uniqueItems\": true}}}",
      "schema /properties/tags: 'uniqueItems'");
    R("{\"type\": \"string\", \"format\": \"uri\"}", "format 'uri' is not supported");
    R("{\"not\": {\"type\": \"null\"}}", "schema (root): 'not' is not supported");
    R("{\"if\": {}, \"then\": {}}", "'if' is not supported");
    R("{\"items\": {\"contains\": {}}}", "schema /items: 'contains'");
    R("{\"properties\": {\"p\": {\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}}}",
      "schema /properties/p/pattern: regex column 4: backreferences");
    R("{\"type\": \"string\", \"pattern\": \"(?=a)\"}", "lookaround");
    R("{\"type\": \"string\", \"pattern\": \"a\\\\bc\"}", "word boundaries");
    R("{\"type\": \"string\", \"pattern\": \"[\"}", "unterminated character class");
    R("{\"type\": \"number\", \"multipleOf\": 0.5}", "'multipleOf' is not supported");
    R("{\"type\": \"number\", \"minimum\": 0.5}", "number bounds are supported at integer values");
    R("{\"$ref\": \"http://example.com/s.json\"}", "only local references");
    R("{\"$ref\": \"#/$defs/missing\"}", "does not resolve");
    R("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"string\", \"maxLength\": 3}]}",
      "oneOf branches 0 and 1 may both match");
    R("{\"type\": \"string\", \"pattern\": \"^a+$\", \"maxLength\": 3}",
      "'pattern' together with minLength/maxLength");
    R("{\"enum\": [\"a\", \"bb\"], \"maxLength\": 1}", "'maxLength' together with 'enum'");
    R("{\"type\": \"object\", \"minProperties\": 1}", "'minProperties'");
    R("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}",
      "no integer lies between the bounds");
    R("false", "the schema false has no instance");
    R("{\"type\": \"object\", \"properties\": {\"a\": false}, \"required\": [\"a\"]}",
      "required property 'a' has the schema false");
    R("{\"type\": \"strin\"}", "unknown type");
    R("[1, 2]", "a schema must be an object or a boolean");
    R("{\"type\": \"string\"", "schema: not JSON");
    R("{\"allOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}",
      "the types do not intersect");
    R("{\"type\": \"string\", \"maxLength\": 100000}", "above 10000");
    R("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": "
      "\"#/$defs/a\"}",
      "never end");
    R("{\"$ref\": \"#\", \"type\": \"array\", \"maxItems\": 2}", "sibling keywords");
#undef R
    refused(GRAM_REGEX, "a{3,2}", "out of order");
    refused(GRAM_REGEX, "(a", "missing ')'");
    refused(GRAM_REGEX, "a)", "unmatched ')'");
    refused(GRAM_REGEX, "*a", "nothing to repeat");
    refused(GRAM_REGEX, "\\p{L}", "Unicode property classes");
    refused(GRAM_REGEX, "a^b", "'^' is supported only at the start");
}

/* Hostile inputs: each compiles or is refused, quickly (the bound here is loose: a shared,
 * loaded CI box; each takes milliseconds on a quiet one). */
static void hostile(enum gram_kind kind, const char *text, size_t len) {
    struct err e = {0};
    struct gram *g = NULL;
    double t0 = clock_now();
    smelt_status st = gram_compile(&g, V, kind, text, len, &e);
    double dt = clock_now() - t0;
    if (getenv("GRAM_TEST_VERBOSE"))
        fprintf(stderr, "%.50s: %.3f s, %s\n", text, dt, st ? e.msg : "compiled");
    T_CHECKF(dt < 10.0, "%.60s...: %.1f s", text, dt);
    T_CHECKF(st == SMELT_OK || st == SMELT_ERR_RANGE || st == SMELT_ERR_UNSUPPORTED ||
                 st == SMELT_ERR_INVALID,
             "%.60s: status %d (%s)", text, st, e.msg);
    if (g) {
        /* usable: a mask and a few bytes */
        struct gram_matcher *m;
        uint32_t *mask = calloc(gram_mask_words(gram_vocab_n(V)), 4);
        T_CHECK(gram_matcher_new(&m, g, 0, &e) == SMELT_OK);
        T_CHECK(gram_matcher_fill_mask(m, mask, &e) == SMELT_OK);
        free(mask);
        gram_matcher_free(m);
    }
    gram_unref(g);
}

static void test_hostile(void) {
    struct tok_buf b = {0};
    /* nesting 1000 deep */
    for (int i = 0; i < 1000; i++)
        gram_buf_puts(&b, "{\"items\": ");
    gram_buf_puts(&b, "{}");
    for (int i = 0; i < 1000; i++)
        gram_buf_puts(&b, "}");
    hostile(GRAM_JSON_SCHEMA, b.p, b.n);
    b.n = 0;
    /* a huge enum */
    gram_buf_puts(&b, "{\"enum\": [");
    for (int i = 0; i < 50000; i++)
        gram_buf_printf(&b, "%s\"value-%d\"", i ? "," : "", i * 7919);
    gram_buf_puts(&b, "]}");
    hostile(GRAM_JSON_SCHEMA, b.p, b.n);
    b.n = 0;
    /* exponential alternations: anyOf of anyOf ... 30 deep, two branches each */
    for (int i = 0; i < 30; i++)
        gram_buf_puts(&b, "{\"anyOf\": [{\"type\": \"integer\"}, ");
    gram_buf_puts(&b, "{\"type\": \"string\"}");
    for (int i = 0; i < 30; i++)
        gram_buf_puts(&b, "]}");
    hostile(GRAM_JSON_SCHEMA, b.p, b.n);
    b.n = 0;
    /* the same subschema duplicated 2^20 times through allOf */
    gram_buf_puts(&b, "{\"$defs\": {\"d0\": {\"type\": \"string\"}");
    for (int i = 1; i < 21; i++)
        gram_buf_printf(&b,
                        ", \"d%d\": {\"anyOf\": [{\"$ref\": \"#/$defs/d%d\"}, {\"$ref\": "
                        "\"#/$defs/d%d\", \"maxLength\": 2}]}",
                        i, i - 1, i - 1);
    gram_buf_puts(&b, "}, \"$ref\": \"#/$defs/d20\"}");
    hostile(GRAM_JSON_SCHEMA, b.p, b.n);
    tok_buf_free(&b);
    /* pathological regexes */
    hostile(GRAM_JSON_SCHEMA, "{\"type\": \"string\", \"pattern\": \"^(a|aa)*(a|b)*a(a|b){30}$\"}",
            strlen("{\"type\": \"string\", \"pattern\": \"^(a|aa)*(a|b)*a(a|b){30}$\"}"));
    hostile(GRAM_JSON_SCHEMA,
            "{\"type\": \"string\", \"pattern\": \"((((a{100}){100}){100}){100})\"}",
            strlen("{\"type\": \"string\", \"pattern\": \"((((a{100}){100}){100}){100})\"}"));
    hostile(GRAM_REGEX, "(x+x+)+y", strlen("(x+x+)+y"));
    hostile(GRAM_REGEX, ".{10000}", strlen(".{10000}"));
    hostile(GRAM_GBNF, "root ::= (((\"a\"{100}){100}){100})",
            strlen("root ::= (((\"a\"{100}){100}){100})"));
    hostile(
        GRAM_JSON_SCHEMA,
        "{\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
        "\"maxLength\": 10000}, \"maxItems\": 10000}, \"maxItems\": 10000}",
        strlen("{\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": "
               "\"string\", \"maxLength\": 10000}, \"maxItems\": 10000}, \"maxItems\": 10000}"));
}

int main(void) {
    V = gt_vocab();
    if (!V) return 1;
    T_RUN(test_types);
    T_RUN(test_objects);
    T_RUN(test_arrays);
    T_RUN(test_enum_const);
    T_RUN(test_composition);
    T_RUN(test_refs);
    T_RUN(test_strings);
    T_RUN(test_formats);
    T_RUN(test_numbers);
    T_RUN(test_json_object_mode);
    T_RUN(test_regex_kind);
    T_RUN(test_refusals);
    T_RUN(test_hostile);
    gram_vocab_free(V);
    return t_done();
}

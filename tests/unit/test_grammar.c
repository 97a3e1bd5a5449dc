/* The grammar engine against itself, with no model: each GBNF feature with a text it must
 * take and one it must refuse, the parser's errors (line and column), and the masks checked
 * token by token against acceptance (a brute force over the vocabulary) along random walks,
 * rollback included. JSON Schema and regex features: test_grammar_schema.c; the real Qwen2.5
 * vocabulary: test_grammar_vocab.c. */
#include <pthread.h>

#include "gram_test_util.h"
#include "grammar/gram_int.h"
#include "t.h"

static struct gram_vocab *V;

/* Grammar g takes each of yes[] whole and none of no[]. */
static void check_lang(const char *gbnf, const char *const *yes, const char *const *no) {
    struct err e = {0};
    struct gram *g = gt_compile(V, GRAM_GBNF, gbnf, &e);
    T_CHECKF(g != NULL, "%s: %s", gbnf, e.msg);
    if (!g) return;
    for (; yes && *yes; yes++)
        T_CHECKF(gt_accepts(g, *yes, strlen(*yes)), "%s should take \"%s\"", gbnf, *yes);
    for (; no && *no; no++)
        T_CHECKF(!gt_accepts(g, *no, strlen(*no)), "%s should refuse \"%s\"", gbnf, *no);
    gram_unref(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_literals(void) {
    check_lang("root ::= \"abc\"", L("abc"), L("ab", "abcd", "", "abd"));
    check_lang("root ::= \"a\" \"b\"  \"c\"", L("abc"), L("ab", "acb"));
    check_lang("root ::= \"\"", L(""), L("a"));
    check_lang("root ::= \"é€😀\"", L("é€😀"), L("é€", "e€😀"));
}

static void test_escapes(void) {
    check_lang("root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\r\\\\\\\"\\[\\]\\-\"",
               L("Aé😀\n\t\r\\\"[]-"), L("Aé😀"));
    check_lang("root ::= [\\x00-\\x1F]", L("\x01", "\x1f"), L(" ", "a"));
    check_lang("root ::= [\\[\\]\\-]+", L("[", "]", "-", "[-]"), L("a", ""));
}

static void test_alternation_and_groups(void) {
    check_lang("root ::= \"a\" | \"bc\" | \"\"", L("a", "bc", ""), L("b", "abc"));
    check_lang("root ::= \"x\" (\"a\" | \"b\") \"y\"", L("xay", "xby"), L("xy", "xaby"));
    check_lang("root ::= ((\"a\" | \"b\") (\"c\" | \"d\"))", L("ac", "bd"), L("ab", "cd"));
    /* a newline after '|' continues the rule, newlines inside parentheses are spaces */
    check_lang("root ::= \"a\" |\n  \"b\"\nother ::= \"c\"", L("a", "b"), L("c"));
    check_lang("root ::= (\n \"a\"\n \"b\"\n)", L("ab"), L("a"));
}

static void test_repetition(void) {
    check_lang("root ::= \"a\"*", L("", "a", "aaaa"), L("b", "ab"));
    check_lang("root ::= \"a\"+", L("a", "aaa"), L("", "b"));
    check_lang("root ::= \"a\"?  \"b\"", L("b", "ab"), L("aab", "a"));
    check_lang("root ::= \"ab\"{2}", L("abab"), L("ab", "ababab"));
    check_lang("root ::= \"a\"{2,}", L("aa", "aaaaa"), L("a", ""));
    check_lang("root ::= \"a\"{1,3}", L("a", "aa", "aaa"), L("", "aaaa"));
    check_lang("root ::= \"a\"{0,2} \"b\"", L("b", "ab", "aab"), L("aaab"));
    check_lang("root ::= (\"a\" | \"bc\"){ 2 , 3 }", L("aa", "abc", "bcbca"), L("a", "aaaa"));
    check_lang("root ::= (\"a\"*)*  \"b\"", L("b", "aaab"), L("a"));
    check_lang("root ::= \"x\"*?", L("", "xx"), L("y"));
}

static void test_classes(void) {
    check_lang("root ::= [a-c0-2_]+", L("abc", "0_2", "c"), L("d", "3", ""));
    check_lang("root ::= [^a-c\\n]", L("d", "é", "😀", " "), L("a", "\n", "dd"));
    check_lang("root ::= [à-ÿ€]", L("à", "ÿ", "€"), L("a", "Ā"));
    check_lang("root ::= [^\"\\\\]*", L("", "abc é", "😀x"), L("\"", "a\\"));
    check_lang("root ::= .", L("a", "é", "😀", "\n"), L("", "ab"));
}

static void test_rules_and_recursion(void) {
    check_lang("root ::= greet \" \" name\ngreet ::= \"hi\" | \"hello\"\nname ::= [a-z]+",
               L("hi bob", "hello x"), L("hi", "hey bob", "hi Bob"));
    check_lang("root ::= p\np ::= \"(\" p \")\" | \"\"", L("", "()", "((()))"),
               L("(", "())", ")("));
    check_lang("root ::= e\ne ::= t (\"+\" t)*\nt ::= [0-9]+ | \"(\" e \")\"",
               L("1", "1+2", "(1+2)+3", "((4))"), L("1+", "(1", "+1"));
    check_lang("root ::= a\na ::= \"x\" a | \"y\"", L("y", "xxy"), L("x", "xx"));
    /* comments and hyphenated names */
    check_lang("# a comment\nroot ::= my-rule # trailing\nmy-rule ::= \"z\" # more\n", L("z"),
               L("y"));
}

static void test_unproductive_pruned(void) {
    /* loop never ends: its branch is removed, the rest of the grammar stays */
    check_lang("root ::= \"a\" | loop\nloop ::= \"b\" loop", L("a"), L("b", "bb"));
}

static void check_error(const char *gbnf, smelt_status want, const char *needle) {
    struct err e = {0};
    struct gram *g = gt_compile(V, GRAM_GBNF, gbnf, &e);
    T_CHECKF(g == NULL, "%s should fail", gbnf);
    gram_unref(g);
    T_EQ_INT(e.code, want);
    T_CHECKF(strstr(e.msg, needle) != NULL, "error \"%s\" lacks \"%s\"", e.msg, needle);
}

static void test_errors(void) {
    check_error("root ::= undefined-rule", SMELT_ERR_INVALID,
                "line 1 column 10: rule 'undefined-rule' is not defined");
    check_error("other ::= \"a\"", SMELT_ERR_INVALID, "no rule named 'root'");
    check_error("root ::= \"a\"\nroot ::= \"b\"", SMELT_ERR_INVALID,
                "line 2 column 1: rule 'root' is defined twice");
    check_error("root ::= \"abc", SMELT_ERR_INVALID,
                "line 1 column 10: unterminated string literal");
    check_error("root ::= [abc", SMELT_ERR_INVALID, "unterminated character class");
    check_error("root ::= \"\\q\"", SMELT_ERR_INVALID, "unknown escape '\\q'");
    check_error("root ::= \"\\x4\"", SMELT_ERR_INVALID, "expected 2 hex digits");
    check_error("root ::= [z-a]", SMELT_ERR_INVALID, "reversed");
    check_error("root ::= \"a\"\n  x ::= \"b\"\nbad", SMELT_ERR_INVALID,
                "line 3 column 4: expected '::='");
    check_error("root ::= \"a\" )", SMELT_ERR_INVALID, "line 1 column 14: unexpected ')'");
    check_error("root ::= (\"a\"", SMELT_ERR_INVALID, "expected ')'");
    check_error("root ::= \"a\"{3,2}", SMELT_ERR_INVALID, "the maximum is below the minimum");
    check_error("root ::= \"a\"{20000}", SMELT_ERR_INVALID, "above the limit 10000");
    check_error("root ::= <[12]>", SMELT_ERR_INVALID, "token items");
    check_error("root ::= \"\\uD800\"", SMELT_ERR_INVALID, "surrogate");
    check_error("root ::= \"\\U00110000\"", SMELT_ERR_INVALID, "above U+10FFFF");
    check_error("root ::= x\nx ::= x \"a\" | \"b\"", SMELT_ERR_INVALID, "left recursion");
    check_error("root ::= x\nx ::= y \"a\"\ny ::= \"\" | x", SMELT_ERR_INVALID, "left recursion");
    check_error("root ::= root", SMELT_ERR_INVALID, "never end");
    check_error("root ::= []", SMELT_ERR_INVALID, "never end");
    check_error("root ::= \"\xff\"", SMELT_ERR_INVALID, "invalid UTF-8");
    char deep[600];
    memset(deep, '(', 300);
    strcpy(deep + 300, "\"a\"");
    memset(deep + 303, ')', 297);
    deep[599] = 0;
    char g[700];
    snprintf(g, sizeof g, "root ::= %s", deep);
    check_error(g, SMELT_ERR_INVALID, "parentheses nest deeper than 128");
    /* a grammar whose DFA would blow up: (a|b)* a (a|b){n} needs 2^n states */
    check_error("root ::= [ab]* \"a\" [ab]{40}", SMELT_ERR_RANGE, "grammar too large");
}

/* Random walks: at each step the mask must equal acceptance token by token; then take a
 * random allowed token (EOG when it is the only one, or by chance). */
static void walk(const char *gbnf, enum gram_kind kind, int steps, unsigned long long seed) {
    struct err e = {0};
    struct gram *g = gt_compile(V, kind, gbnf, &e);
    T_CHECKF(g != NULL, "%s: %s", gbnf, e.msg);
    if (!g) return;
    struct gram_matcher *m;
    T_CHECK(gram_matcher_new(&m, g, 8, &e) == SMELT_OK);
    int32_t n = gram_vocab_n(V);
    uint32_t *mask = calloc(gram_mask_words(n), sizeof *mask);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    char ctx[128];
    for (int st = 0; st < steps; st++) {
        snprintf(ctx, sizeof ctx, "%.40s step %d", gbnf, st);
        int bad = gt_check_mask(m, V, ctx);
        T_EQ_INT(bad, 0);
        if (bad) break;
        gram_matcher_fill_mask(m, mask, &e);
        int32_t na = 0;
        for (int32_t t = 0; t < n; t++)
            if (gt_mask_bit(mask, t)) allowed[na++] = t;
        if (na == 0) {
            T_CHECKF(gram_matcher_ended(m), "%s: no token allowed but not ended", ctx);
            break;
        }
        int32_t pick = allowed[t_rand_u64(&seed) % (uint64_t)na];
        if (gram_matcher_can_end(m) && t_rand_u64(&seed) % 8 == 0) pick = GT_EOG;
        T_CHECK(gram_matcher_accept(m, pick, &e) == SMELT_OK);
        if (pick == GT_EOG) {
            T_CHECK(gram_matcher_ended(m));
            break;
        }
        /* now and then: undo and redo the step (the mask must come back the same) */
        if (t_rand_u64(&seed) % 4 == 0) {
            T_CHECK(gram_matcher_rollback(m, 1, &e) == SMELT_OK);
            T_CHECK(gram_matcher_accept(m, pick, &e) == SMELT_OK);
        }
    }
    free(mask);
    free(allowed);
    gram_matcher_free(m);
    gram_unref(g);
}

static void test_masks_random_walks(void) {
    static const char *const gs[] = {
        "root ::= \"abc\" | \"ab\" [a-z]* | \"x\" root",
        "root ::= [^\"\\\\]* \"\\\"\" [0-9]{1,3}",
        ("root ::= v\nv ::= \"[\" ( v (\",\" v)* )? \"]\" | \"null\" | s\n"
         "s ::= \"\\\"\" [^\"]* \"\\\"\""),
        "root ::= ( [a-c] | \"é\" | \"😀\" )* \"!\"",
        "root ::= \"{\\\"\" [a-z]{0,4} \"\\\":\" ( \"true\" | \"123\" ) \"}\"",
        "root ::= p\np ::= \"(\" p \")\" p | \"\"",
        "root ::= .{0,5} \"x\"",
    };
    for (size_t i = 0; i < sizeof gs / sizeof *gs; i++)
        for (unsigned long long seed = 1; seed <= 4; seed++)
            walk(gs[i], GRAM_GBNF, 24, seed * 7919 + i);
    walk("", GRAM_JSON_OBJECT, 40, 11);
    walk("", GRAM_JSON_OBJECT, 40, 12);
}

/* The mask at every byte of texts the grammar takes (reached by single-byte tokens): this
 * visits the states inside recursive rules whose tokens the stack decides. */
static void masks_along(enum gram_kind kind, const char *gbnf, const char *text) {
    struct err e = {0};
    struct gram *g = gt_compile(V, kind, gbnf, &e);
    T_CHECKF(g != NULL, "%s: %s", gbnf, e.msg);
    if (!g) return;
    struct gram_matcher *m;
    T_CHECK(gram_matcher_new(&m, g, 2, &e) == SMELT_OK);
    char ctx[128];
    for (size_t i = 0; text[i]; i++) {
        snprintf(ctx, sizeof ctx, "%.30s at %zu of %.40s", gbnf, i, text);
        int bad = gt_check_mask(m, V, ctx);
        T_EQ_INT(bad, 0);
        if (bad || gram_matcher_accept(m, 1 + (uint8_t)text[i], &e) != SMELT_OK) {
            T_CHECKF(bad, "%s: byte refused", ctx);
            break;
        }
    }
    T_CHECK(gram_matcher_can_end(m));
    T_EQ_INT(gt_check_mask(m, V, "end"), 0);
    gram_matcher_free(m);
    gram_unref(g);
}

static void test_masks_along_texts(void) {
    masks_along(GRAM_JSON_OBJECT, "", "{\"a\": [\"x\", {\"b\": null}], \"c\": \"d\"}");
    masks_along(GRAM_JSON_OBJECT, "", "{\"k\":[[\"\\n\"],[],{}],\"é\":-1.5e+3,\"t\":true}");
    masks_along(
        GRAM_GBNF,
        "root ::= v\nv ::= \"[\" ( v (\",\" v)* )? \"]\" | \"null\" | \"\\\"\" [^\"]* \"\\\"\"",
        "[[\"ab\",null],[\"\"],\"x\"]");
    masks_along(GRAM_GBNF, "root ::= p\np ::= \"(\" p \")\" p | \"\"", "(()(()))()");
}

static void test_speculative_rollback(void) {
    struct err e = {0};
    struct gram *g = gt_compile(V, GRAM_GBNF, "root ::= \"ab\" \"c\"+", &e);
    T_CHECK(g != NULL);
    struct gram_matcher *m;
    T_CHECK(gram_matcher_new(&m, g, 4, &e) == SMELT_OK);
    int32_t a = 1 + 'a', b = 1 + 'b', c = 1 + 'c', x = 1 + 'x';
    int32_t draft[] = {a, b, c, x, c};
    T_EQ_INT(gram_matcher_accept_tokens(m, draft, 5, &e), 3); /* x is refused */
    T_EQ_INT(gram_matcher_history(m), 3);
    T_CHECK(gram_matcher_can_end(m));
    T_CHECK(gram_matcher_rollback(m, 2, &e) == SMELT_OK); /* back to "a" */
    T_CHECK(!gram_matcher_can_end(m));
    T_CHECK(gram_matcher_rollback(m, 2, &e) != SMELT_OK); /* only 1 step kept now */
    T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_ERR_INVALID);
    T_CHECK(gram_matcher_accept(m, b, &e) == SMELT_OK);
    T_CHECK(gram_matcher_accept(m, GT_EOG, &e) == SMELT_ERR_INVALID); /* "ab" is not complete */
    T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_OK);
    T_CHECK(gram_matcher_accept(m, GT_EOG, &e) == SMELT_OK);
    T_CHECK(gram_matcher_ended(m));
    T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_ERR_INVALID);
    T_CHECK(gram_matcher_rollback(m, 1, &e) == SMELT_OK); /* undo the end */
    T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_OK);
    /* the ring keeps only the last 4 steps */
    for (int i = 0; i < 10; i++)
        T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_OK);
    T_EQ_INT(gram_matcher_history(m), 4);
    gram_matcher_reset(m);
    T_EQ_INT(gram_matcher_history(m), 0);
    T_CHECK(gram_matcher_accept(m, c, &e) == SMELT_ERR_INVALID);
    gram_matcher_free(m);
    gram_unref(g);
}

static void test_eog_and_ended(void) {
    struct err e = {0};
    struct gram *g = gt_compile(V, GRAM_GBNF, "root ::= \"a\" \"b\"?", &e);
    struct gram_matcher *m;
    T_CHECK(gram_matcher_new(&m, g, 0, &e) == SMELT_OK);
    int32_t nw = (int32_t)gram_mask_words(gram_vocab_n(V));
    uint32_t *mask = calloc((size_t)nw, sizeof *mask);
    gram_matcher_fill_mask(m, mask, &e);
    T_CHECK(!gt_mask_bit(mask, GT_EOG));
    T_CHECK(gram_matcher_accept(m, 1 + 'a', &e) == SMELT_OK);
    gram_matcher_fill_mask(m, mask, &e);
    T_CHECK(gt_mask_bit(mask, GT_EOG) && gt_mask_bit(mask, 1 + 'b') && !gram_matcher_ended(m));
    T_CHECK(gram_matcher_accept(m, 1 + 'b', &e) == SMELT_OK);
    T_CHECK(gram_matcher_ended(m)); /* only EOG can follow */
    gram_matcher_fill_mask(m, mask, &e);
    int on = 0;
    for (int32_t w = 0; w < nw; w++)
        on += __builtin_popcount(mask[w]);
    T_EQ_INT(on, 1);
    T_CHECK(gram_matcher_accept(m, GT_EOG, &e) == SMELT_OK);
    gram_matcher_fill_mask(m, mask, &e);
    on = 0;
    for (int32_t w = 0; w < nw; w++)
        on += __builtin_popcount(mask[w]);
    T_EQ_INT(on, 0);
    free(mask);
    gram_matcher_free(m);
    gram_unref(g);
}

/* Threads sharing one grammar whose masks are all computed on first use (the compile-time
 * warm-up's are dropped): each walks with its own matcher and checks every mask against
 * acceptance, while the others fill the shared masks. Run under ThreadSanitizer by
 * `make tsan`. */
struct thr {
    struct gram *g;
    unsigned long long seed;
    int bad;
};

static void *thread_walk(void *arg) {
    struct thr *t = arg;
    struct err e;
    struct gram_matcher *m;
    if (gram_matcher_new(&m, t->g, 1, &e) != SMELT_OK) {
        t->bad++;
        return NULL;
    }
    int32_t n = gram_vocab_n(V);
    uint32_t *mask = calloc(gram_mask_words(n), sizeof *mask);
    for (int step = 0; step < 40 && !gram_matcher_ended(m); step++) {
        t->bad += gt_check_mask(m, V, "thread");
        gram_matcher_fill_mask(m, mask, &e);
        int32_t pick = -1, seen = 0, want = (int32_t)(t_rand_u64(&t->seed) % 64);
        for (int32_t k = 0; k < n; k++)
            if (gt_mask_bit(mask, k) && k != GT_EOG && seen++ <= want) pick = k;
        if (pick < 0 || gram_matcher_accept(m, pick, &e) != SMELT_OK) break;
    }
    free(mask);
    gram_matcher_free(m);
    return NULL;
}

static void test_threads_share_a_grammar(void) {
    struct err e = {0};
    struct gram *g = gt_compile(V, GRAM_GBNF, "root ::= [a-z ]{0,3000} \"!\" | [0-9]{1,3000}", &e);
    T_CHECKF(g != NULL, "%s", e.msg);
    if (!g) return;
    for (uint32_t k = 0; k < g->a.n_st; k++)
        gram_ci_free(atomic_exchange(&g->ci[k], NULL));
    g->ci_bytes = 0;
    pthread_t th[4];
    struct thr a[4];
    for (int k = 0; k < 4; k++) {
        a[k] = (struct thr){g, 1000u + (unsigned)k, 0};
        T_CHECK(pthread_create(&th[k], NULL, thread_walk, &a[k]) == 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        T_EQ_INT(a[k].bad, 0);
    }
    gram_unref(g);
}

static void test_cache(void) {
    struct err e = {0};
    struct gram_cache *c;
    T_CHECK(gram_cache_new(&c, V, 2, SIZE_MAX, &e) == SMELT_OK);
    struct gram *g1, *g2, *g3;
    bool hit;
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"a\"", 12, &g1, &hit, &e) == SMELT_OK && !hit);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"a\"", 12, &g2, &hit, &e) == SMELT_OK && hit);
    T_CHECK(g1 == g2);
    T_CHECK(gram_cache_get(c, GRAM_REGEX, "root ::= \"a\"", 12, &g3, &hit, &e) != SMELT_OK || !hit);
    gram_unref(g3);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"b\"", 12, &g3, &hit, &e) == SMELT_OK && !hit);
    gram_unref(g3);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"c\"", 12, &g3, &hit, &e) == SMELT_OK && !hit);
    gram_unref(g3);
    /* "a" was least recently used and is gone from the cache, but g1 stays usable */
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"a\"", 12, &g3, &hit, &e) == SMELT_OK && !hit);
    T_CHECK(g3 != g1 && gt_accepts(g1, "a", 1));
    gram_unref(g3);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= ", 9, &g3, &hit, &e) == SMELT_OK);
    gram_unref(g3);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= x", 10, &g3, &hit, &e) == SMELT_ERR_INVALID);
    gram_cache_free(c);
    gram_unref(g1);
    gram_unref(g2);
    /* a byte bound: each new grammar evicts the last one */
    T_CHECK(gram_cache_new(&c, V, 8, 1, &e) == SMELT_OK);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"a\"", 12, &g1, &hit, &e) == SMELT_OK && !hit);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"b\"", 12, &g2, &hit, &e) == SMELT_OK && !hit);
    gram_unref(g2);
    T_CHECK(gram_cache_get(c, GRAM_GBNF, "root ::= \"a\"", 12, &g2, &hit, &e) == SMELT_OK && !hit);
    T_CHECK(g2 != g1 && gt_accepts(g1, "a", 1) && gt_accepts(g2, "a", 1));
    gram_unref(g2);
    gram_unref(g1);
    gram_cache_free(c);
}

/* gram_gbnf_prefix: every rule name gets the prefix (definitions, references, the root),
 * nothing else does (literals with names and escapes in them, classes, counts, comments);
 * two prefixed grammars compose into one whose language is their union. */
static bool buf_add(struct tok_buf *b, const char *s) {
    size_t n = strlen(s);
    char *p = realloc(b->p, b->n + n + 1);
    if (!p) return false;
    memcpy(p + b->n, s, n + 1);
    b->p = p;
    b->n += n;
    b->cap = b->n + 1;
    return true;
}

static void test_prefix_rules(void) {
    const char *a = "root ::= x (\"root\\\" x\" | [a-z\\]]{2,3})  # root x\nx ::= \"[x]\" | x-y\n"
                    "x-y ::= \"y\"+";
    const char *b = "root ::= \"b\" root | \"c\"";
    struct tok_buf t = {0};
    struct err e;
    T_CHECK(buf_add(&t, "root ::= p-root | q_root\n"));
    T_EQ_INT(gram_gbnf_prefix(a, strlen(a), "p-", &t, &e), SMELT_OK);
    T_CHECK(buf_add(&t, "\n"));
    T_EQ_INT(gram_gbnf_prefix(b, strlen(b), "q_", &t, &e), SMELT_OK);
    T_CHECKF(strstr(t.p, "p-root ::= p-x (\"root\\\" x\" | [a-z\\]]{2,3})  # root x") != NULL, "%s",
             t.p);
    T_CHECK(strstr(t.p, "p-x-y ::= \"y\"+") != NULL);
    check_lang(t.p, L("[x]root\" x", "yyab", "[x]zz]", "bbc", "c"),
               L("[x]", "root\" x", "bb", "y"));
    t.n = 0;
    T_EQ_INT(gram_gbnf_prefix("root ::= \"a", 12, "p", &t, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "line 1 column 10") != NULL, "%s", e.msg);
    T_EQ_INT(gram_gbnf_prefix(b, strlen(b), "p q", &t, &e), SMELT_ERR_INVALID);
    tok_buf_free(&t);
}

int main(void) {
    V = gt_vocab();
    if (!V) return 1;
    T_RUN(test_literals);
    T_RUN(test_escapes);
    T_RUN(test_alternation_and_groups);
    T_RUN(test_repetition);
    T_RUN(test_classes);
    T_RUN(test_rules_and_recursion);
    T_RUN(test_unproductive_pruned);
    T_RUN(test_errors);
    T_RUN(test_masks_random_walks);
    T_RUN(test_masks_along_texts);
    T_RUN(test_speculative_rollback);
    T_RUN(test_eog_and_ended);
    T_RUN(test_threads_share_a_grammar);
    T_RUN(test_cache);
    T_RUN(test_prefix_rules);
    gram_vocab_free(V);
    return t_done();
}

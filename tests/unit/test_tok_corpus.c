/* The larger corpus against Hugging Face: tests/data/tok/corpus.inp (multilingual prose,
 * CJK, emoji sequences, code, whitespace runs, digits, mixed scripts, random Unicode)
 * and tests/data/tok/expected.json, made by scripts/make-tok-corpus.py with HF's
 * `tokenizers` loading the same vocab: per case and per string, the id count and the
 * FNV-1a-64 of the ids. A mismatch prints our ids; `scripts/make-tok-corpus.py --show
 * CASE N` prints HF's. (The 1 MB random corpus is checked by tests/py/test_tok_hf.py.)
 * The same file holds, for every pre-tokenizer smelt implements, the byte lengths of HF's
 * pre-tokens of each string (count and FNV-1a-64): test_splits checks tok_pretokenize
 * against them, so each pre-tokenizer is checked exactly, apart from any vocab. */
#include <jansson.h>

#include "t.h"
#include "tok_test_util.h"

#define MAX_STR 1024

static uint64_t fnv64(const int32_t *ids, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xFF;
            h *= 0x100000001B3ull;
        }
    return h;
}

/* Whether v[0..n) matches an expected row [count, "fnv64 hex"]; prints v when not. */
static bool row_matches(const json_t *row, const int32_t *v, size_t n, const char *what, int i) {
    char h[17];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv64(v, n));
    size_t want_n = (size_t)json_integer_value(json_array_get(row, 0));
    const char *want_h = json_string_value(json_array_get(row, 1));
    bool same = n == want_n && want_h && !strcmp(h, want_h);
    if (!same) {
        fprintf(stderr, "%s[%d]: %zu values (HF %zu):", what, i, n, want_n);
        for (size_t k = 0; k < n && k < 40; k++)
            fprintf(stderr, " %d", v[k]);
        fprintf(stderr, "\n");
    }
    T_CHECKF(same, "%s, string %d: differs from HF", what, i);
    return same;
}

/* Path of a case's vocab ("shared:NAME", "pre:VALUE", "arch:VALUE"), or false. */
static bool vocab_path(const char *src, char *out, size_t cap) {
    if (!strncmp(src, "shared:", 7)) {
        snprintf(out, cap, "%s/data/vocab/ggml-vocab-%s.gguf", t_shared_dir(), src + 7);
        FILE *f = fopen(out, "rb");
        if (f) fclose(f);
        return f != NULL;
    }
    if (!strncmp(src, "pre:", 4))
        return tu_find_test_model("tokenizer.ggml.pre", src + 4, out, cap);
    if (!strncmp(src, "arch:", 5))
        return tu_find_test_model("general.architecture", src + 5, out, cap);
    return false;
}

static void test_corpus(void) {
    size_t len;
    char *corpus = t_read_file(SMELT_SOURCE_DIR "/tests/data/tok/corpus.inp", &len);
    json_error_t je;
    json_t *root = json_load_file(SMELT_SOURCE_DIR "/tests/data/tok/expected.json", 0, &je);
    T_CHECK(corpus && root);
    if (!corpus || !root) {
        free(corpus);
        json_decref(root);
        return;
    }
    static char *strs[MAX_STR];
    static size_t lens[MAX_STR];
    int n = tu_split_inp(corpus, len, strs, lens, MAX_STR);
    json_t *cases = json_object_get(root, "cases");
    const char *name;
    json_t *c;
    int ran = 0;
    json_object_foreach(cases, name, c) {
        const char *src = json_string_value(json_object_get(c, "vocab"));
        const char *pre = json_string_value(json_object_get(c, "pre")); /* NULL: the file's */
        json_t *rows = json_object_get(c, "corpus");
        char path[1024];
        if (!src || !vocab_path(src, path, sizeof path)) {
            printf("SKIP case %s: vocab %s absent\n", name, src ? src : "?");
            continue;
        }
        T_EQ_INT(json_array_size(rows), n);
        struct gguf_file *g = NULL;
        struct tok *t = NULL;
        struct err e = {0};
        if (gguf_open(&g, path, &e) != SMELT_OK ||
            tok_new_from_gguf(&t, g, &(struct tok_opts){.pre = pre}, &e) != SMELT_OK) {
            T_CHECKF(0, "%s: %s", name, e.msg);
            gguf_close(g);
            continue;
        }
        gguf_close(g);
        int ok = 0;
        struct tok_ids ids = {0};
        for (int i = 0; i < n && i < (int)json_array_size(rows); i++) {
            ids.n = 0;
            T_CHECK(tok_encode(t, strs[i], lens[i], TOK_PARSE_SPECIAL, &ids, &e) == SMELT_OK);
            ok += row_matches(json_array_get(rows, (size_t)i), ids.v, ids.n, name, i);
        }
        printf("%s: %d/%d corpus strings match HF\n", name, ok, n);
        tok_ids_free(&ids);
        tok_free(t);
        ran++;
    }
    if (!ran) t_skip("no vocab of any case present (../shared/data, models/)");
    json_decref(root);
    free(corpus);
}

/* Every pre-tokenizer's split of every corpus string (GPT-2's vocab carries them; the
 * split does not depend on the vocab). */
static void test_splits(void) {
    char path[1024];
    if (!vocab_path("shared:gpt-2", path, sizeof path)) {
        t_skip("../shared/data/vocab/ggml-vocab-gpt-2.gguf absent");
        return;
    }
    size_t len;
    char *corpus = t_read_file(SMELT_SOURCE_DIR "/tests/data/tok/corpus.inp", &len);
    json_error_t je;
    json_t *root = json_load_file(SMELT_SOURCE_DIR "/tests/data/tok/expected.json", 0, &je);
    json_t *splits = json_object_get(root, "splits");
    T_CHECK(corpus && json_object_size(splits) > 0);
    static char *strs[MAX_STR];
    static size_t lens[MAX_STR];
    int n = corpus ? tu_split_inp(corpus, len, strs, lens, MAX_STR) : 0;
    struct gguf_file *g = NULL;
    struct err e = {0};
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    const char *pre;
    json_t *rows;
    json_object_foreach(splits, pre, rows) {
        struct tok *t = NULL;
        if (!g || tok_new_from_gguf(&t, g, &(struct tok_opts){.pre = pre}, &e) != SMELT_OK) {
            T_CHECKF(0, "pre-tokenizer %s: %s", pre, e.msg);
            continue;
        }
        T_EQ_INT(json_array_size(rows), n);
        struct tok_ids p = {0};
        int ok = 0;
        for (int i = 0; i < n && i < (int)json_array_size(rows); i++) {
            p.n = 0;
            T_CHECK(tok_pretokenize(t, strs[i], lens[i], &p, &e) == SMELT_OK);
            char what[96];
            snprintf(what, sizeof what, "split %s", pre);
            ok += row_matches(json_array_get(rows, (size_t)i), p.v, p.n, what, i);
        }
        printf("split %s: %d/%d corpus strings match HF\n", pre, ok, n);
        tok_ids_free(&p);
        tok_free(t);
    }
    gguf_close(g);
    json_decref(root);
    free(corpus);
}

int main(void) {
    T_RUN(test_corpus);
    T_RUN(test_splits);
    return t_done();
}

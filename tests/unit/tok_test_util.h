/* Helpers shared by the tokenizer tests: reading files, loading a tokenizer from a GGUF
 * path, finding a model under models/ by its tokenizer.ggml.pre, and the vocab test
 * format (strings separated by "\n__ggml_vocab_test__\n"; one line of ids per string). */
#ifndef SMELT_TEST_TOK_UTIL_H
#define SMELT_TEST_TOK_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "t.h"
#include "tokenizer/tok.h"

static inline struct tok *tu_load(const char *path) {
    struct gguf_file *g = NULL;
    struct tok *t = NULL;
    struct err e = {0};
    if (gguf_open(&g, path, &e) != SMELT_OK || tok_new_from_gguf(&t, g, NULL, &e) != SMELT_OK)
        fprintf(stderr, "load %s: %s\n", path, e.msg);
    gguf_close(g);
    return t;
}

static inline const char *tu_models_dir(void) {
    const char *d = getenv("SMELT_MODELS_DIR");
    return d ? d : "models";
}

/* Finds a GGUF under models/ whose tokenizer.ggml.pre (or, with pre == NULL, whose
 * general.architecture) equals want; writes its path into out. */
static inline bool tu_model_has(const char *path, const char *key, const char *want) {
    struct gguf_file *g = NULL;
    struct err e;
    if (gguf_open(&g, path, &e) != SMELT_OK) return false;
    struct gguf_str s;
    bool ok = gguf_get_str(g, key, &s, &e) == SMELT_OK && gguf_str_eq(s, want);
    gguf_close(g);
    return ok;
}

static inline bool tu_find_model(const char *key, const char *want, char *out, size_t cap) {
    /* The project's test models first (scripts/fetch-test-models.sh): the recorded
     * expectations are for their vocabs. */
    static const char *const preferred[] = {"qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
                                            "gemma3-270m-q4_k_m.gguf"};
    for (size_t i = 0; i < sizeof preferred / sizeof *preferred; i++) {
        snprintf(out, cap, "%s/%s", tu_models_dir(), preferred[i]);
        if (tu_model_has(out, key, want)) return true;
    }
    DIR *d = opendir(tu_models_dir());
    if (!d) return false;
    struct dirent *de;
    bool found = false;
    while (!found && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".gguf") || de->d_name[0] == '.') continue;
        snprintf(out, cap, "%s/%s", tu_models_dir(), de->d_name);
        found = tu_model_has(out, key, want);
    }
    closedir(d);
    return found;
}

/* tu_find_model for a vocab one of the project's test models has (make models): when it
 * is absent under SMELT_REQUIRE_MODELS=1, the current test fails. */
static inline bool tu_find_test_model(const char *key, const char *want, char *out, size_t cap) {
    if (tu_find_model(key, want, out, cap)) return true;
    if (t_require_models()) {
        fprintf(stderr,
                "FAIL %s: no GGUF with %s = %s under %s/ (SMELT_REQUIRE_MODELS=1: make models)\n",
                t_cur_, key, want, tu_models_dir());
        t_cur_fail_++;
    }
    return false;
}

/* Splits the .inp text in place into strings; returns their count (<= max). Lengths in
 * lens (strings may hold NULs? no: the format is text). */
static inline int tu_split_inp(char *s, size_t len, char **strs, size_t *lens, int max) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    int k = 0;
    char *p = s, *end = s + len;
    while (p < end && k < max) {
        char *q = memmem(p, (size_t)(end - p), sep, sl);
        if (!q) break;
        strs[k] = p;
        lens[k] = (size_t)(q - p);
        k++;
        p = q + sl;
    }
    return k;
}

/* Parses the i-th line of ids; returns the count. */
static inline size_t tu_parse_ids(const char *line, int32_t *ids, size_t max) {
    size_t k = 0;
    const char *p = line;
    while (*p && *p != '\n' && k < max) {
        while (*p == ' ')
            p++;
        if (!*p || *p == '\n') break;
        char *q;
        long v = strtol(p, &q, 10);
        if (q == p) break;
        ids[k++] = (int32_t)v;
        p = q;
    }
    return k;
}

#endif

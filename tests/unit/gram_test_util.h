/* Helpers shared by the grammar tests and fuzz targets: a synthetic vocabulary (every byte,
 * JSON-ish multi-byte pieces, partial UTF-8, an end-of-generation token), whole-text
 * acceptance, and the brute-force mask check (each token's bit against accepting it). */
#ifndef SMELT_TEST_GRAM_UTIL_H
#define SMELT_TEST_GRAM_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram.h"

static const char *const gt_pieces[] = {
    "{\"",      "\":",      "\", \"", "\"}",    " \"",  "\",",  "\"",       "true", "false", "null",
    "123",      "0.5",      "-1",     "e+",     "abc",  "ab",   "a",        "b",    "c",     "\n",
    "  ",       "\n  ",     "\t",     "é",      "\xC3", "\xA9", "\xE2\x82", "\xAC", "€",     "😀",
    "\xF0\x9F", "\x98\x80", "}",      "]",      "[",    "{",    ",",        ":",    "\\n",   "\\\"",
    "\\u00e9",  "\\",       "hello",  " world", "x\"y", "\"\n", "ab\"",     "[\"",  "\"]",   "2024",
    "-01",      "-15",      "T",      "Z",      ":00",  "12",   "@",        ".",    "com",   "user",
    "--",       "xyz",      "AB",     "a1",     "1a",   "  \"", "}}",       "]]",   "\"},",  "\"],",
    "0",        "1",        "9",      "00",     "+",    "E",    "..",
};

#define GT_EOG 0 /* token 0: end of generation; tokens 1..256: the bytes; then gt_pieces */

static inline int32_t gt_n_vocab(void) {
    return 1 + 256 + (int32_t)(sizeof gt_pieces / sizeof *gt_pieces);
}

/* The synthetic vocabulary; *dup_tok is a second token with the same piece as "ab". */
static inline struct gram_vocab *gt_vocab(void) {
    int32_t n = gt_n_vocab() + 1;
    const char **p = calloc((size_t)n, sizeof *p);
    size_t *l = calloc((size_t)n, sizeof *l);
    static char bytes[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        p[1 + i] = &bytes[i];
        l[1 + i] = 1;
    }
    for (size_t k = 0; k < sizeof gt_pieces / sizeof *gt_pieces; k++) {
        p[257 + k] = gt_pieces[k];
        l[257 + k] = strlen(gt_pieces[k]);
    }
    p[n - 1] = "ab"; /* a duplicate piece */
    l[n - 1] = 2;
    int32_t eog = GT_EOG;
    struct gram_vocab *v = NULL;
    struct err e = {0};
    if (gram_vocab_new_raw(&v, n, p, l, &eog, 1, &e) != SMELT_OK)
        fprintf(stderr, "vocab: %s\n", e.msg);
    free(p);
    free(l);
    return v;
}

static inline struct gram *gt_compile(struct gram_vocab *v, enum gram_kind kind, const char *text,
                                      struct err *e) {
    struct gram *g = NULL;
    if (gram_compile(&g, v, kind, text, strlen(text), e) != SMELT_OK) return NULL;
    return g;
}

/* Whether the grammar takes text whole (and may end there). */
static inline bool gt_accepts(struct gram *g, const char *text, size_t n) {
    struct gram_matcher *m;
    struct err e;
    if (gram_matcher_new(&m, g, 0, &e) != SMELT_OK) return false;
    bool ok = gram_matcher_accept_bytes(m, text, n, &e) == SMELT_OK && gram_matcher_can_end(m);
    gram_matcher_free(m);
    return ok;
}

static inline bool gt_mask_bit(const uint32_t *mask, int32_t t) {
    return (mask[t >> 5] >> (t & 31)) & 1;
}

/* Checks m's mask against accepting each token (and rolling back); m needs max_rollback >= 1.
 * Returns the number of disagreements (printing the first few). */
static inline int gt_check_mask(struct gram_matcher *m, const struct gram_vocab *v,
                                const char *ctx) {
    int32_t n = gram_vocab_n(v);
    uint32_t *mask = calloc(gram_mask_words(n), sizeof *mask);
    struct err e;
    int bad = 0;
    if (gram_matcher_fill_mask(m, mask, &e) != SMELT_OK) {
        fprintf(stderr, "%s: fill_mask: %s\n", ctx, e.msg);
        free(mask);
        return 1;
    }
    for (int32_t t = 0; t < n; t++) {
        bool ok = gram_matcher_accept(m, t, &e) == SMELT_OK;
        if (ok) gram_matcher_rollback(m, 1, &e);
        if (ok != gt_mask_bit(mask, t)) {
            if (bad++ < 5)
                fprintf(stderr, "%s: token %d: mask says %d, accept says %d\n", ctx, t,
                        gt_mask_bit(mask, t), ok);
        }
    }
    free(mask);
    return bad;
}

#endif

/* libFuzzer target for the JSON Schema compiler (and json_object): schema -> GBNF -> the
 * automaton -> the matcher.
 *
 * Input: a schema as JSON text; the bytes after a NUL drive a walk over a small vocabulary,
 * each token accepted exactly when the mask allows it (fuzz_gbnf.c's walk). Byte 0 & 0x80 on a
 * one-byte input selects json_object mode. Any crash, ASan/UBSan report, leak, hang past
 * -timeout, an error with no message, or a mask that disagrees with acceptance is a finding.
 *
 *   make fuzz FUZZ_SECONDS=120      (seeds: fuzz/corpus/schema, dictionary: fuzz/schema.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/unit/gram_test_util.h"

static struct gram_vocab *V;

static void walk(struct gram *g, const uint8_t *drive, size_t n) {
    struct gram_matcher *m;
    struct err e;
    if (gram_matcher_new(&m, g, 2, &e) != SMELT_OK) return;
    int32_t nv = gram_vocab_n(V);
    uint32_t *mask = calloc(gram_mask_words(nv), sizeof *mask);
    for (size_t i = 0; mask && i < n && i < 256; i++) {
        if (gram_matcher_fill_mask(m, mask, &e) != SMELT_OK) break;
        int32_t pick = -1, seen = 0;
        for (int32_t t = 0; t < nv; t++)
            if (gt_mask_bit(mask, t) && seen++ == drive[i] % 32) pick = t;
        int32_t tok = pick >= 0 ? pick : (int32_t)(drive[i] % (uint32_t)nv);
        smelt_status st = gram_matcher_accept(m, tok, &e);
        if ((st == SMELT_OK) != gt_mask_bit(mask, tok) && st != SMELT_ERR_RANGE &&
            st != SMELT_ERR_NOMEM)
            abort();
        if (gram_matcher_ended(m)) break;
    }
    free(mask);
    gram_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!V) V = gt_vocab();
    if (!V) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    enum gram_kind kind = size == 1 && data[0] & 0x80 ? GRAM_JSON_OBJECT : GRAM_JSON_SCHEMA;
    struct gram *g = NULL;
    struct err e;
    err_clear(&e);
    if (gram_compile(&g, V, kind, (const char *)data, len, &e) == SMELT_OK) {
        if (nul) walk(g, nul + 1, size - len - 1);
        gram_unref(g);
    } else if (!e.msg[0] || e.code == SMELT_OK) {
        abort();
    }
    return 0;
}

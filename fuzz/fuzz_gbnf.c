/* libFuzzer target for the grammar engine's text inputs: the GBNF parser and the regex
 * compiler, the automaton built from what they accept, and the matcher walking it.
 *
 * Input: byte 0 picks the kind (even: GBNF, odd: regex); the rest up to a NUL is the grammar,
 * the bytes after the NUL drive a walk over a small vocabulary (every byte, JSON-ish pieces,
 * partial UTF-8, an end-of-generation token): each byte picks a token, which must be accepted
 * exactly when the mask allows it; some bytes roll back instead. A GBNF grammar that compiles
 * also compiles with its rules renamed (gram_gbnf_prefix). Any crash, ASan/UBSan report,
 * leak, hang past libFuzzer's -timeout, or a mask that disagrees with acceptance is a finding.
 *
 *   make fuzz FUZZ_SECONDS=120      (seeds: fuzz/corpus/gbnf, dictionary: fuzz/gbnf.dict)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/unit/gram_test_util.h"

static struct gram_vocab *V;

/* Walks the grammar with the bytes of drive: mask and acceptance must agree. */
static void walk(struct gram *g, const struct gram_vocab *v, const uint8_t *drive, size_t n) {
    struct gram_matcher *m;
    struct err e;
    if (gram_matcher_new(&m, g, 4, &e) != SMELT_OK) return;
    int32_t nv = gram_vocab_n(v);
    uint32_t *mask = calloc(gram_mask_words(nv), sizeof *mask);
    for (size_t i = 0; mask && i + 1 < n && i < 512; i += 2) {
        if (gram_matcher_fill_mask(m, mask, &e) != SMELT_OK) break;
        if (drive[i] == 0xFF) {
            gram_matcher_rollback(m, drive[i + 1] % 3, &e);
            continue;
        }
        /* a token: among the allowed ones when there are any (most walks), else any */
        int32_t want = (int32_t)((drive[i] << 8 | drive[i + 1]) % (uint32_t)nv), pick = -1,
                seen = 0;
        for (int32_t t = 0; t < nv; t++)
            if (gt_mask_bit(mask, t) && seen++ == want % 64) pick = t;
        int32_t tok = pick >= 0 && drive[i] % 4 ? pick : want;
        smelt_status st = gram_matcher_accept(m, tok, &e);
        if ((st == SMELT_OK) != gt_mask_bit(mask, tok) && st != SMELT_ERR_RANGE &&
            st != SMELT_ERR_NOMEM)
            abort(); /* the mask and acceptance disagree */
        if (gram_matcher_ended(m) && drive[i + 1] & 1) gram_matcher_reset(m);
    }
    free(mask);
    gram_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!V) V = gt_vocab();
    if (!V || size < 1) return 0;
    enum gram_kind kind = data[0] & 1 ? GRAM_REGEX : GRAM_GBNF;
    const uint8_t *text = data + 1, *nul = memchr(text, 0, size - 1);
    size_t len = nul ? (size_t)(nul - text) : size - 1;
    struct gram *g = NULL;
    struct err e;
    err_clear(&e);
    if (gram_compile(&g, V, kind, (const char *)text, len, &e) == SMELT_OK) {
        if (nul) walk(g, V, nul + 1, size - 1 - len - 1);
        gram_unref(g);
        /* its rules renamed (gram_gbnf_prefix) under a new root: the same grammar */
        struct tok_buf r = {0};
        static const char head[] = "root ::= p-root\n";
        r.p = malloc(sizeof head);
        if (kind == GRAM_GBNF && r.p) {
            memcpy(r.p, head, sizeof head);
            r.n = r.cap = sizeof head - 1;
            if (gram_gbnf_prefix((const char *)text, len, "p-", &r, &e) == SMELT_OK) {
                smelt_status st = gram_compile(&g, V, GRAM_GBNF, r.p, r.n, &e);
                if (st != SMELT_OK && st != SMELT_ERR_RANGE && st != SMELT_ERR_NOMEM) abort();
                gram_unref(g);
            } else if (e.code != SMELT_ERR_NOMEM) {
                abort(); /* a grammar that compiles lexes */
            }
        }
        tok_buf_free(&r);
    } else if (!e.msg[0] || e.code == SMELT_OK) {
        abort(); /* an error must say what went wrong */
    }
    struct tok_buf b = {0};
    if (kind == GRAM_REGEX) gram_regex_to_gbnf((const char *)text, len, &b, &e);
    tok_buf_free(&b);
    return 0;
}
